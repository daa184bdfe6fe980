/* chiefd's record of a job in SQLite (WAL): the job's state (sticky: with its reason and since when),
 * per-worker progress reports, evaluations, checkpoints and the shards' losses. The one place where
 * SQLite result codes become -errno. Paths under the database's directory (the job's state directory)
 * are stored relative to it, so that a copied state directory refers to its own files; the calls take
 * and return absolute paths. Thread-safe: every call takes the database's own lock. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "psfleet/v1/supervisor.pb-c.h"

struct chief_db;

/* The job's row: one per database. Plain data. */
struct chief_db_job {
        uint64_t fingerprint;
        int state;              /* Psfleet__V1__JobState */
        uint64_t global_step, max_steps;
        uint64_t started_us;    /* wall clock µs when the job was first started */
        uint64_t updated_us;
        float test_accuracy;    /* -1 until evaluated */
        float test_loss;
        float test_auc;         /* model.head logistic, else -1 */
        float test_rmse;        /* model.head mse, else -1 */
        float wall_s;
        uint64_t state_since_us; /* wall clock µs when the job entered state */
        char reason[512];       /* why it is in state; "" when nothing to say */
};

/* A shard restored from a checkpoint behind the job's global_step. Plain data. */
struct chief_db_loss {
        uint64_t time_us;
        uint32_t shard;
        uint64_t restored_step, job_step, steps_lost;
};

/* One Report of one worker. Plain data; state points at the caller's string. */
struct chief_db_progress {
        uint64_t time_us;
        uint32_t worker;
        uint64_t local_step, global_step;
        float loss, examples_per_s;
        uint64_t examples;
        const char *state;
};

/* Opens (creating when missing) the database at path, in WAL mode, with the schema in place.
 * Returns 0 and a new handle in *ret, or -errno (-EIO, -EACCES, -ENOSPC, -EBUSY, -ENOMEM, ...). */
int chief_db_open(const char *path, struct chief_db **ret);
/* Opens an existing database read-only, as it is (no schema, no migration): for reading the records of
 * a chief that is down. Returns 0 and a new handle in *ret, or -errno (-ENOENT, -EACCES, -EIO, ...). */
int chief_db_open_readonly(const char *path, struct chief_db **ret);
struct chief_db *chief_db_close(struct chief_db *db); /* NULL-safe; returns NULL */

/* The directory that relative paths are stored against (the database's, resolved). */
const char *chief_db_dir(const struct chief_db *db);

/* The job row: 0 and *ret filled, -ENOENT when the job was never recorded, or -errno. */
int chief_db_load_job(struct chief_db *db, struct chief_db_job *ret);
/* Inserts or replaces the job row, durably (synchronous=FULL): a state survives a power cut. */
int chief_db_save_job(struct chief_db *db, const struct chief_db_job *j);

/* Appends one loss, durably. */
int chief_db_add_loss(struct chief_db *db, const struct chief_db_loss *l);
/* Every loss, oldest first: *ret malloc'd (NULL when none), *n_ret. Returns 0 or -errno. */
int chief_db_list_losses(struct chief_db *db, struct chief_db_loss **ret, size_t *n_ret);

/* Appends one progress row. */
int chief_db_add_progress(struct chief_db *db, const struct chief_db_progress *p);
/* The latest row of worker w: 0 and *ret filled (ret->state points into state_buf), -ENOENT, or -errno. */
int chief_db_last_progress(struct chief_db *db, uint32_t worker, struct chief_db_progress *ret, char *state_buf,
                           size_t state_len);

/* Appends one evaluation on the test split. */
int chief_db_add_evaluation(struct chief_db *db, uint64_t time_us, uint64_t global_step, uint32_t examples,
                            float loss, float accuracy);

/* The latest evaluation: 0 and the outputs, -ENOENT when there is none, or -errno. */
int chief_db_last_evaluation(struct chief_db *db, uint64_t *step_ret, float *loss_ret, float *accuracy_ret);

/* One checkpoint's row. Plain data. */
struct chief_db_checkpoint {
        uint64_t global_step;   /* the key: one checkpoint per step */
        uint64_t time_us;       /* wall clock when recorded */
        uint64_t bytes;
        char path[1024];
        char checksum[32];      /* "crc32c:1a2b3c4d" */
        float loss;             /* NAN: unknown */
        uint64_t eval_step;     /* 0: no evaluation yet */
        float eval_accuracy, eval_loss;   /* -1: none */
        char trigger[16];       /* "steps", "secs", "request", "end" */
        bool incremental;       /* holds the changes since parent_step's checkpoint (docs/checkpoints.md) */
        uint64_t parent_step;   /* incremental only */
};

/* In one durable transaction (synchronous=FULL): records ck, replacing a row of the same global_step,
 * and deletes every row beyond the `keep` newest (by time, then step), but for the checkpoints that a
 * kept incremental one is chained to (its parent, down to the full one), which stay. The deleted rows (and a
 * replaced row whose path differs) come back in *removed_ret (malloc'd, *n_removed_ret of them; the
 * caller frees) so that their files can be removed after the commit. Returns 0 or -errno (nothing
 * changed). */
int chief_db_add_checkpoint(struct chief_db *db, const struct chief_db_checkpoint *ck, uint32_t keep,
                            struct chief_db_checkpoint **removed_ret, size_t *n_removed_ret);
/* Every checkpoint row, newest first (by time, then step): *ret malloc'd (NULL when none), *n_ret. */
int chief_db_list_checkpoints(struct chief_db *db, struct chief_db_checkpoint **ret, size_t *n_ret);
/* Deletes the row of global_step (durably): 0 and the row in *ret (may be NULL), -ENOENT, or -errno. */
int chief_db_delete_checkpoint(struct chief_db *db, uint64_t global_step, struct chief_db_checkpoint *ret);

/* A Checkpoint message pointing into row (which must outlive the packing): the chief's replies, and
 * psfleet's offline listing of a state directory. */
void chief_checkpoint_msg(const struct chief_db_checkpoint *row, Psfleet__V1__Checkpoint *m);
