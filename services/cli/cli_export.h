/* psfleet export's embedding tables (cli_export_tables.c): a model's tables read from a checkpoint and
 * put in front of its graph (onnx_save.h's struct onnx_front), inline as initializers or, over
 * --max-inline-rows, written beside the model as one safetensors file per table with a manifest. */
#pragma once
#include <stdint.h>

#include "config.h"
#include "onnx_save.h"

struct ckpt;
struct graph;

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

/* The tables of cfg's model (g: the graph the front goes before: graph_from_layers' for a layer list,
 * the model's own for model.onnx) from checkpoint ck (read from path), each inline unless its rows
 * would number more than max_inline_rows (0: no bound). Fills *x. 0, or the exit status after saying
 * why (65 a checkpoint without the table, 78 a table that cannot be inlined, 1 out of memory). */
int export_tables_load(const struct job_config *cfg, const struct graph *g, const struct ckpt *ck, const char *path,
                       uint64_t max_inline_rows, struct export_tables *x);
void export_tables_clear(struct export_tables *x);

/* The tables served from outside, as DIR/tables/<name>.safetensors (ids U64 [n], rows F32 [n, dim]) and
 * DIR/tables.json (the manifest), each written whole under a temporary name. 0, or 74 after saying why. */
int export_tables_write(const struct job_config *cfg, const struct export_tables *x, const char *dir,
                        const char *global_step);

/* Once the new model.onnx is in place: removes what an earlier export into DIR left that this one does
 * not write (DIR/tables.json, DIR/tables/<name>.safetensors of a table now inline, and DIR/<data_file>
 * when data_file is not NULL: external data this export has none of), so that no file in DIR describes
 * another model. Missing files are no error; a file that cannot be removed is said. */
void export_tables_tidy(const struct job_config *cfg, const struct export_tables *x, const char *dir,
                        const char *data_file);
