/* A job's checkpoints: safetensors files in one directory (ckpt-<global_step>.safetensors, written by
 * ckpt.c) and their rows in SQLite (chief_db.c). The rows are the record: a file becomes a checkpoint
 * when its row is committed, which happens only after the file is complete, fsync'd and renamed into
 * place, so no partial file is ever listed. At start, chief_ckpt_reconcile() makes files and rows agree
 * again after a crash.
 *
 * Tensors are the job's variables (names as the model gives them, shape [rows, cols]) and, under
 * "<var>/<slot>", the optimizer's slots; "__metadata__" holds format, job, global_step, fingerprint,
 * optimizer, slots, time_us. Each embedding table of the model is "emb/<name>/ids" (U64 [n]), "emb/<name>"
 * (F32 [n, dim]) and "emb/<name>/<slot>" per slot of training.sparse_optimizer (docs/checkpoints.md).
 *
 * The store between the two others: ckpt.c is the file format it writes and reads; chief_save.c
 * fills it from the shards and restores them from it, and keeps the status in step.
 *
 * Part of chiefd: logs the repairs it makes (the daemon's own log). Thread-safe: one lock serializes
 * saves, loads, deletions and repairs; listing reads SQLite only. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chief_db.h"
#include "config.h"
#include "job.h"
#include "ps_client.h"
#include "psfleet/v1/supervisor.pb-c.h"

struct chief_ckpt;

struct chief_ckpt_config {
        const char *dir;                /* created when missing */
        const struct job_layout *L;     /* variables (block layout), optimizer; must outlive the store */
        const struct model_spec *model; /* its embedding tables (NULL: none); must outlive the store */
        enum sparse_optimizer sparse_optimizer;   /* the tables' slots */
        const char *job;
        uint64_t fingerprint;
        uint32_t keep;                  /* supervisor.keep_checkpoints */
        uint32_t keep_corrupt;          /* supervisor.keep_corrupt: .corrupt files kept, the newest */
};

/* Returns 0 and *ret, or -errno with err saying why (the directory cannot be created). */
int chief_ckpt_new(struct chief_db *db, const struct chief_ckpt_config *cfg, struct chief_ckpt **ret, char *err,
                   size_t errlen);
struct chief_ckpt *chief_ckpt_free(struct chief_ckpt *s);   /* NULL-safe; returns NULL */
/* The directory, absolute. */
const char *chief_ckpt_dir(const struct chief_ckpt *s);
/* "<dir>/ckpt-<global_step, 10 digits>.safetensors"; malloc'd. */
char *chief_ckpt_path(const struct chief_ckpt *s, uint64_t global_step);

/* After a crash: removes temp files of interrupted writes and checkpoint files without a row, forgets
 * rows whose file is gone (a row whose file was moved along with the directory follows it), and keeps
 * only the newest keep_corrupt ".corrupt" files. Each repair is logged. Returns the number of repairs,
 * or -errno. */
int chief_ckpt_reconcile(struct chief_ckpt *s);

/* Writes params (and slots, n_slots blocks, or NULL) in the model's block layout as the checkpoint of
 * global_step, then records it with stats' loss, eval_* and trigger in one transaction that also drops
 * rows beyond the newest `keep`; then removes the dropped files. *ret gets the row. Returns 0, or -errno
 * with err (nothing recorded, no file left behind). */
int chief_ckpt_save(struct chief_ckpt *s, const float *params, float *const *slots, uint64_t global_step,
                    const struct chief_db_checkpoint *stats, struct chief_db_checkpoint *ret, char *err,
                    size_t errlen);

/* As chief_ckpt_save, with the embedding tables: tables[e] the rows of model->emb[e] (NULL: the model's
 * tables are not written; the file then cannot restore a model that has some). */
int chief_ckpt_save_tables(struct chief_ckpt *s, const float *params, float *const *slots,
                           const struct ps_sparse_rows *tables, uint64_t global_step,
                           const struct chief_db_checkpoint *stats, struct chief_db_checkpoint *ret, char *err,
                           size_t errlen);

/* A checkpoint written as the shards' rows come (docs/checkpoints.md, "Streaming"): begin, the pages of
 * each table in any order (put_rows, and for an incremental one put_evicted), then commit, which
 * writes the file and records it as chief_ckpt_save_tables does, or abort. The chief holds no table:
 * each page is spooled to disk as it is put. params and slots are read at commit: keep them unchanged
 * until then. parent: NULL for a full checkpoint; else the row of the checkpoint this one holds the
 * changes since (rows made, pushed or imported, ids evicted). Not thread-safe per writing. */
struct chief_ckpt_writing;
int chief_ckpt_begin(struct chief_ckpt *s, const float *params, float *const *slots, bool with_tables,
                     uint64_t global_step, const struct chief_db_checkpoint *parent, struct chief_ckpt_writing **ret,
                     char *err, size_t errlen);
int chief_ckpt_put_rows(struct chief_ckpt_writing *w, uint32_t e, const struct ps_sparse_rows *page, char *err,
                        size_t errlen);
int chief_ckpt_put_evicted(struct chief_ckpt_writing *w, uint32_t e, const uint64_t *ids, size_t n, char *err,
                           size_t errlen);
/* Writes and records; w is freed either way. 0 and *ret, or -errno with err (nothing recorded). */
int chief_ckpt_commit(struct chief_ckpt_writing *w, const struct chief_db_checkpoint *stats,
                      struct chief_db_checkpoint *ret, char *err, size_t errlen);
void chief_ckpt_abort(struct chief_ckpt_writing *w);   /* NULL-safe: drops what was spooled */

/* Reads and verifies one checkpoint into params (and slots when the file's optimizer is the job's;
 * *slots_loaded says whether they were). Checks: the file exists, its size and CRC-32C match the row,
 * it parses, its global_step matches, and it holds exactly the model's variables with their shapes
 * (and the optimizer's slots), and every embedding table of the model with its ids, dim and the sparse
 * optimizer's slots (a table refused names the tensor: -EINVAL). Returns 0; -ENOENT (file missing), -EBADMSG (corrupt: size, checksum or
 * format), -EINVAL (a valid file of a different model), or another -errno; err says why. A refused
 * file leaves params, slots and *slots_loaded as they were. */
int chief_ckpt_load(struct chief_ckpt *s, const struct chief_db_checkpoint *row, float *params, float *const *slots,
                    bool *slots_loaded, char *err, size_t errlen);

/* The newest checkpoint that loads: tries rows newest first; a missing or corrupt one is logged by name,
 * its file moved aside to "<path>.corrupt" (if present; only the newest keep_corrupt of those are kept)
 * and its row deleted, and the previous one is tried. Returns 1 with *ret and the values loaded; 0 when none is usable; -EINVAL when the newest
 * intact one holds a different model (err says how: the job must not silently start afresh); or
 * another -errno. */
int chief_ckpt_load_latest(struct chief_ckpt *s, float *params, float *const *slots, bool *slots_loaded,
                           struct chief_db_checkpoint *ret, char *err, size_t errlen);
/* Where a restore streams the embedding tables (chief_save.c: to the shards). begin (may be NULL) is
 * called once the checkpoint to restore is chosen and verified (row: the newest link of its chain that
 * loads); part then gets each page of table e in order: rows to store (maybe none) and the options of
 * ps_client_sparse_import_part (the table emptied first, evicted ids dropped first, the counts). part
 * returns 0, or -errno with err. */
struct chief_table_sink {
        void (*begin)(void *ud, const struct chief_db_checkpoint *row);
        int (*part)(void *ud, uint32_t e, const struct ps_sparse_rows *rows, const struct ps_sparse_import_opts *o,
                    char *err, size_t errlen);
        void *ud;
};
/* As chief_ckpt_load_latest (which is this without a sink), and with sink the embedding tables of the
 * checkpoint restored are streamed to it, read from the files a page (65,536 rows) at a time: the full
 * checkpoint's rows, then each increment's evicted ids and own ids to drop, and its rows; the chief
 * holds no table (docs/checkpoints.md, "A restore streams too"). A file whose ids the sink's shards
 * found stored already names an id twice: it is corrupt (a full checkpoint set aside and the previous
 * one tried; an increment set aside with the links after it, and the chain restored to the link before
 * it; each try starting with emptied tables). A failure of the sink or of reading a file is returned as
 * -errno (never -EINVAL: that is kept for another model's checkpoint), err saying why. The store's
 * lock is held throughout, streaming included: a DeleteCheckpoint or an export waits for the restore. */
int chief_ckpt_restore_latest(struct chief_ckpt *s, float *params, float *const *slots, bool *slots_loaded,
                              const struct chief_table_sink *sink, struct chief_db_checkpoint *ret, char *err,
                              size_t errlen);

/* The values of the checkpoint of global_step as a restore would make them, its chain resolved (the full
 * checkpoint under it, then each increment in order), without repairing anything: for a reader such as
 * psfleet export. params (the layout's n_params; undefined after a failure) and
 * tables[0..model->n_embeddings) (malloc'd: the caller clears each with ps_sparse_rows_clear; written
 * only on success); *ret gets the row.
 * Returns 0; -ENOENT (no such step recorded, or a link's parent not recorded), -EBADMSG (a link
 * corrupt, or a chain without a full checkpoint), -EINVAL (another model's file), or another -errno;
 * err names the file and step at fault. */
int chief_ckpt_read_step(struct chief_ckpt *s, uint64_t global_step, float *params, struct ps_sparse_rows *tables,
                         struct chief_db_checkpoint *ret, char *err, size_t errlen);

/* The values of rows[i] (rows: n records, as chief_db_list_checkpoints or ListCheckpoints give them) for
 * a reader that must change nothing, the evaluator: its chain (the full checkpoint, then each increment
 * in order; one file for a full one), each file checked against its row as chief_ckpt_load checks it,
 * into params (undefined after a failure) and, when tables is not NULL, the embedding tables' rows
 * into tables[0..n_embeddings) (malloc'd: the caller clears each; written only on success). Nothing is
 * forgotten or moved aside: a link missing (-ENOENT), corrupt (-EBADMSG) or not recorded (-ENOENT) is
 * an error naming it in err. */
int chief_ckpt_read_chain(struct chief_ckpt *s, const struct chief_db_checkpoint *rows, size_t n, size_t i,
                          float *params, struct ps_sparse_rows *tables, char *err, size_t errlen);

/* Deletes the checkpoint of global_step: its row (durably), then its file. 0 and *ret (may be NULL),
 * -ENOENT, or -errno. */
int chief_ckpt_delete(struct chief_ckpt *s, uint64_t global_step, struct chief_db_checkpoint *ret, char *err,
                      size_t errlen);

/* The newest row and the number of rows: 0, -ENOENT when there is none, or -errno. */
int chief_ckpt_newest(struct chief_ckpt *s, struct chief_db_checkpoint *ret, uint32_t *count_ret);

