/* chiefd's snapshots of the shards' values (main thread): pulling them into the model's block, saving
 * them as a checkpoint, restoring shards from the newest one, filling the embedding tables. The three
 * checkpoint files differ so: ckpt.c is the file format alone (safetensors, CRC, atomic write);
 * chief_ckpt.c is the store (names, retention, corrupt files set aside, the SQLite rows); this file
 * moves values between the shards and that store, and keeps the status in step. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chief_db.h"
#include "optim.h"

struct chief_ckpt;
struct chief_eval;
struct chief_status;
struct job_config;
struct model;
struct ps_client;
struct ps_sparse_rows;

struct chief_save {
        const struct job_config *cfg;
        struct chief_status *st;          /* global_step, the newest checkpoint, the last error, restores */
        struct chief_ckpt *ckpts;
        struct ps_client *pc;
        struct model *model;              /* its block holds the pulled values */
        float *slots[OPTIM_MAX_SLOTS];    /* owned, (n_params) each: a pull's optimizer slots */
        unsigned n_slots;
        struct chief_eval *ev;            /* session lines; a restore starts its evaluations over */
        uint64_t last_save_step, last_save_mono;
        /* incremental checkpoints (supervisor.full_checkpoint_every > 1): the newest checkpoint this
         * chiefd wrote while the shards tracked their changes since it; false at start, after a restore
         * and after a failed save, so that the next one is full */
        bool chain_ok;
        struct chief_db_checkpoint chain_last;
        uint32_t since_full;              /* incremental ones written since the last full one */
};

/* Reads every shard into the model's block (and the slots when with_slots); *gs_ret from shard 0. */
int chief_pull(struct chief_save *v, bool with_slots, uint64_t *gs_ret, char *err, size_t errlen);
/* Writes and records the pulled values (with the slots when pulled) as the checkpoint of gs. A
 * request at the step of the newest checkpoint returns that one (*existing). A failure is kept as the
 * status's last_checkpoint_error until the next save succeeds. */
int chief_save(struct chief_save *v, uint64_t gs, bool with_slots, const char *trigger, struct chief_db_checkpoint *ret,
               bool *existing, char *err, size_t errlen);
/* Restores the shards in which[] from the newest usable checkpoint. Returns 1 (restored), 0 (no
 * usable checkpoint: nothing done), -EINVAL (the checkpoints hold a different model: fatal) or
 * another -errno (assigning failed: retry); why says what happened. */
int chief_restore_shards(struct chief_save *v, const bool *which, char *why, size_t len);
/* As chief_restore_shards, for supervisor.recovery shard: only the values and slots come from the
 * checkpoint; global_step (shard 0) and the update counters are set to global_step, the job's step,
 * so that nothing the workers saw goes back. */
int chief_restore_shards_at(struct chief_save *v, const bool *which, uint64_t global_step, char *why, size_t len);
/* The shards in which[] (NULL: all) get every embedding table as tables[e] holds it (each shard its own
 * ids), or empty when tables is NULL (a fresh start); before the Assign that makes a shard initialized.
 * 0, or -errno with why in err. */
int chief_import_tables(struct chief_save *v, const bool *which, const struct ps_sparse_rows *tables, uint64_t gs,
                        char *err, size_t errlen);
