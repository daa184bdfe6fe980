/* A job's trained model exported for serving (docs/serving.md): model.onnx (onnx_save.h) from one of
 * the chief's checkpoints, its embedding tables inline or beside it, or a delta between two
 * checkpoints. Shared by `psfleet export` (offline, from the records in a state directory) and chiefd's
 * Supervisor.Export (from the running chief's own records): neither prints; what goes wrong is said in
 * a struct export_msgs and the functions return an exit status (sysexits.h: 0 written, 65 no such
 * checkpoint or one that does not verify, 74 the output cannot be written, 78 a model that cannot be
 * exported, 1 out of memory). Not thread-safe: the callers serialize exports into one directory. */
#pragma once
#include <stdbool.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "onnx_save.h"
#include "ps_client.h"

struct chief_ckpt;
struct chief_db;
struct ckpt;
struct graph;

#define EXPORT_EX_DATAERR 65
#define EXPORT_EX_IOERR 74
#define DELTA_FORMAT "psfleet-delta/1"

/* What an export has to say: lines ("export: ...", each ending in '\n') appended to buf (len bytes,
 * NUL-terminated, cut when full): the errors that end it, and notes (a checkpoint skipped, a file that
 * could not be removed) that do not. */
struct export_msgs {
        char *buf;
        size_t len;
};
void export_say(struct export_msgs *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One export. */
struct export_request {
        const struct job_config *cfg;
        /* the checkpoints: one file (a job's safetensors), or the records of db (its directory `where`,
         * named in messages); with store, a chain of increments is read through it (the running chief's
         * own), else through a store opened on db for the export */
        const char *file;
        struct chief_db *db;
        const char *where;
        struct chief_ckpt *store;
        uint64_t step;                  /* 0: the newest that verifies */
        uint64_t since;                 /* 0: a whole export; else a delta from this step's checkpoint */
        uint64_t max_inline_rows;       /* 0: every table inline */
        bool external;                  /* large initializers in model.onnx.data */
        const char *out;                /* the directory written (made if missing) */
};

struct export_result {
        uint64_t step;                  /* the global_step exported */
        char global_step[24];           /* as the checkpoint says it ("?" without) */
        char *ck_path;                  /* the checkpoint read (malloc'd) */
        char *written;                  /* DIR/model.onnx (malloc'd) */
        size_t bytes;                   /* model.onnx's */
        uint64_t changed, gone;         /* a delta's rows changed and ids gone, over its tables */
};
void export_result_clear(struct export_result *res);

/* Writes q's export into q->out: a whole one (model.onnx renamed last) or a delta (delta.json written
 * last). The exit status; *res filled on 0. */
int chief_export(const struct export_request *q, struct export_result *res, struct export_msgs *msg);

/* ---- the embedding tables (chief_export_tables.c) ---- */

/* A model's tables read from a checkpoint and put in front of its graph (onnx_save.h's struct
 * onnx_front), inline as initializers or, over --max-inline-rows, written beside the model as one
 * safetensors file per table with a manifest. */
struct export_tables {
        struct onnx_front front;
        struct onnx_table t[MODEL_MAX_EMBEDDINGS];
        uint32_t fields[MODEL_MAX_EMBEDDINGS][MODEL_MAX_FIELDS];
        char ids[MODEL_MAX_EMBEDDINGS][256], weights[MODEL_MAX_EMBEDDINGS][264];
        uint64_t n[MODEL_MAX_EMBEDDINGS];      /* the rows the checkpoint holds */
        uint64_t *keys[MODEL_MAX_EMBEDDINGS];  /* (n) the checkpoint's ids */
        float *vals[MODEL_MAX_EMBEDDINGS];     /* (n, dim) their rows */
        float *rows[MODEL_MAX_EMBEDDINGS];     /* inline: what onnx_table.rows points at */
        uint32_t n_external;
};

/* The rows of cfg's tables in one whole checkpoint ck (read from path) into tables[0..n_embeddings)
 * (values only, malloc'd: the caller clears each with ps_sparse_rows_clear). 0, or the exit status
 * after saying why (65 a checkpoint without the table, 1 out of memory). */
int export_tables_read(const struct job_config *cfg, const struct ckpt *ck, const char *path,
                       struct ps_sparse_rows *tables, struct export_msgs *msg);

/* Table es's rows t (read from path, named in errors) copied in the order of their ids, as every export
 * writes them, so that two exports of the same rows are the same bytes: *keys_ret (n) and *vals_ret
 * (n, dim), malloc'd. 0, or the exit status after saying why (65 an id not below the table's vocab, 78
 * more rows than 2^32, 1 out of memory). */
int export_rows_sorted(const struct embedding_spec *es, const struct ps_sparse_rows *t, const char *path,
                       uint64_t **keys_ret, float **vals_ret, struct export_msgs *msg);

/* The tables of cfg's model (g: the graph the front goes before: graph_from_layers' for a layer list,
 * the model's own for model.onnx) from rows[0..n_embeddings) (the checkpoint's, read from path), each
 * inline unless its rows would number more than max_inline_rows (0: no bound) or all_outside. Fills *x.
 * 0, or the exit status after saying why (65 a bad id, 78 a table that cannot be inlined, 1 out of
 * memory). */
int export_tables_load(const struct job_config *cfg, const struct graph *g, const struct ps_sparse_rows *rows,
                       const char *path, uint64_t max_inline_rows, bool all_outside, struct export_tables *x,
                       struct export_msgs *msg);
void export_tables_clear(struct export_tables *x);

/* The metadata of a table's file (all strings, as the file holds them). */
struct export_table_meta {
        const char *table, *global_step, *dim, *vocab, *pooling;
};
/* One table served from outside as the safetensors file path: ids U64 [n], rows F32 [n, dim] and m as
 * its metadata, written whole under a temporary name (ckpt_write). 0, or -errno with err. */
int export_table_file(const char *path, const struct export_table_meta *m, const uint64_t *ids, const float *rows,
                      uint64_t n, char *err, size_t errlen);

/* The tables served from outside, as DIR/tables/<name>.safetensors (export_table_file; only with files)
 * and DIR/tables.json (the manifest), each written whole under a temporary name. 0, or 74 after saying
 * why. */
int export_tables_write(const struct job_config *cfg, const struct export_tables *x, const char *dir,
                        const char *global_step, bool files, struct export_msgs *msg);

/* Once the new model.onnx is in place: removes what an earlier export into DIR left that this one does
 * not write (DIR/tables.json, DIR/tables/<name>.safetensors of a table now inline, DIR/<data_file> when
 * data_file is not NULL: external data this export has none of; for a delta every table's whole file,
 * for a whole export a delta's delta.json and delta/<name>.safetensors), so that no file in DIR
 * describes another model. Missing files are no error; a file that cannot be removed is a note. */
void export_tables_tidy(const struct job_config *cfg, const struct export_tables *x, const char *dir,
                        const char *data_file, bool delta, struct export_msgs *msg);

/* ---- deltas for a serving copy that follows a job (chief_export_delta.c, docs/serving.md) ---- */

/* Writes DIR/delta/<name>.safetensors for each table of b (the export of global_step `to`, tables
 * sorted by id): "ids" U64 [c] and "rows" F32 [c, dim], the rows of `to` that are new or whose bytes
 * differ from those in a (the tables' rows at global_step `from`), and "tombstones" U64 [t], the ids of
 * `from` that `to` has no more; metadata as a whole export's table file (global_step `to`) plus
 * from_step. *tables_ret gets delta.json's "tables" (new reference). 0, or the exit status after
 * saying why. */
int export_delta_tables(const struct job_config *cfg, const struct export_tables *b, const struct ps_sparse_rows *a,
                        uint64_t from, uint64_t to, const char *dir, json_t **tables_ret, struct export_msgs *msg);
/* Writes DIR/delta.json, the manifest that says the delta is whole (written last): job, from_step,
 * to_step, tables, and the whole files to copy (model.onnx, tables.json and data_file when not NULL).
 * 0, or 74 after saying why. */
int export_delta_commit(const char *dir, const char *job, uint64_t from, uint64_t to, json_t *tables,
                        const char *data_file, struct export_msgs *msg);
