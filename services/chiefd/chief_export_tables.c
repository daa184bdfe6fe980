/* An export's embedding tables: see chief_export.h. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "chief_export.h"
#include "graph.h"
#include "onnx_load.h"
#include "sparse_opts.h"
#include "sparse_table.h"
#include "util.h"

/* protobuf's limit on one message, less room for the rest of the model */
#define ONNX_INLINE_BYTES ((UINT64_C(1) << 31) - (UINT64_C(1) << 26))

/* The name of the input model.onnx looks table e's rows up by: the Gather on its initializer, in the
 * file as loaded (the job's graph has that lookup cut out). */
static int graph_ids_input(const struct model_spec *spec, uint32_t e, char *out, size_t len,
                           struct export_msgs *msg)
{
        struct graph *g = NULL;
        char err[512];
        if (onnx_load_file(spec->onnx_path, &g, err, sizeof(err)) < 0) {
                export_say(msg, "export: %s: %s", spec->onnx_path, err);
                return CONFIG_EX_CONFIG;
        }
        int32_t init = graph_find(g, spec->emb[e].initializer);
        int ret = CONFIG_EX_CONFIG;
        for (uint32_t i = 0; init >= 0 && i < g->n_nodes && ret; i++) {
                const struct graph_node *n = &g->nodes[i];
                if (n->op == GOP_GATHER && n->in[0] == init && n->in[1] >= 0) {
                        snprintf(out, len, "%s", g->tensors[n->in[1]].name);
                        ret = 0;
                }
        }
        if (ret)
                export_say(msg, "export: %s: no Gather looks rows up in \"%s\" (table %s)", spec->onnx_path,
                          spec->emb[e].initializer, spec->emb[e].name);
        graph_free(g);
        return ret;
}

int export_tables_read(const struct job_config *cfg, const struct ckpt *ck, const char *path,
                       struct ps_sparse_rows *tables, struct export_msgs *msg)
{
        for (uint32_t e = 0; e < cfg->model.n_embeddings; e++) {
                const struct embedding_spec *es = &cfg->model.emb[e];
                enum ckpt_dtype dt[2];
                unsigned nd[2];
                uint64_t sh[2][CKPT_MAX_DIMS];
                char name[2][80];
                snprintf(name[0], sizeof(name[0]), "emb/%s/ids", es->name);
                snprintf(name[1], sizeof(name[1]), "emb/%s", es->name);
                for (int k = 0; k < 2; k++)
                        if (ckpt_shape(ck, name[k], &dt[k], &nd[k], sh[k]) < 0) {
                                export_say(msg, "export: checkpoint %s has no tensor \"%s\": the model has embedding table "
                                          "\"%s\"", path, name[k], es->name);
                                return EXPORT_EX_DATAERR;
                        }
                uint64_t n = sh[0][0];
                if (dt[0] != CKPT_U64 || nd[0] != 1 || dt[1] != CKPT_F32 || nd[1] != 2 || sh[1][0] != n ||
                    sh[1][1] != es->dim) {
                        export_say(msg, "export: checkpoint %s: tensors \"%s\" and \"%s\" are not U64 [n] and F32 [n, %u] "
                                  "(table \"%s\"'s ids and rows)", path, name[0], name[1], es->dim, es->name);
                        return EXPORT_EX_DATAERR;
                }
                struct ps_sparse_rows *t = &tables[e];
                *t = (struct ps_sparse_rows){ .n = n, .dim = es->dim };
                t->ids = malloc(n * sizeof(uint64_t) + 1);
                t->values = malloc(n * es->dim * sizeof(float) + 1);
                if (!t->ids || !t->values) {
                        export_say(msg, "export: out of memory for table %s (%" PRIu64 " rows)", es->name, n);
                        return 1;
                }
                if (ckpt_read_rows(ck, name[0], 0, n, t->ids) < 0 || ckpt_read_rows(ck, name[1], 0, n, t->values) < 0) {
                        export_say(msg, "export: cannot read table %s from checkpoint %s", es->name, path);
                        return 1;
                }
        }
        return 0;
}

struct id_at {
        uint64_t id;
        size_t at;
};

static int id_at_cmp(const void *a, const void *b)
{
        const struct id_at *x = a, *y = b;
        return x->id < y->id ? -1 : x->id > y->id;
}

int export_rows_sorted(const struct embedding_spec *es, const struct ps_sparse_rows *t, const char *path,
                       uint64_t **keys_ret, float **vals_ret, struct export_msgs *msg)
{
        size_t n = t->n;
        if (n > UINT32_MAX) { /* a safetensors tensor of ours counts its rows in 32 bits */
                export_say(msg, "export: %s: table \"%s\" has %zu rows, more than this export writes", path, es->name, n);
                return CONFIG_EX_CONFIG;
        }
        struct id_at *order = malloc(n * sizeof(*order) + 1);
        uint64_t *keys = malloc(n * sizeof(uint64_t) + 1);
        float *vals = malloc(n * es->dim * sizeof(float) + 1);
        int ret = order && keys && vals ? 0 : 1;
        if (ret)
                export_say(msg, "export: out of memory for table %s (%zu rows)", es->name, n);
        for (size_t i = 0; ret == 0 && i < n; i++)
                order[i] = (struct id_at){ t->ids[i], i };
        if (ret == 0)
                qsort(order, n, sizeof(*order), id_at_cmp);
        for (size_t i = 0; ret == 0 && i < n; i++) {
                keys[i] = order[i].id;
                memcpy(vals + i * es->dim, t->values + order[i].at * es->dim, es->dim * sizeof(float));
                if (es->vocab && keys[i] >= es->vocab) {
                        export_say(msg, "export: %s: table \"%s\" holds id %" PRIu64 ", not below its vocab %" PRIu64, path,
                                  es->name, keys[i], es->vocab);
                        ret = EXPORT_EX_DATAERR;
                }
        }
        free(order);
        if (ret) {
                free(keys);
                free(vals);
                return ret;
        }
        *keys_ret = keys;
        *vals_ret = vals;
        return 0;
}

/* The inline table: a hashed table's vocab rows (each one psfleet would look up: trained, or its initial
 * value), or a raw-id table's trained rows and one row of zeros for every id never trained. */
static int inline_rows(const struct job_config *cfg, uint32_t e, struct export_tables *x)
{
        const struct embedding_spec *es = &cfg->model.emb[e];
        uint64_t n_rows = es->vocab ? es->vocab : x->n[e] + 1;
        float *rows = calloc(n_rows, es->dim * sizeof(float));
        if (!rows)
                return -ENOMEM;
        if (es->vocab) {
                struct sparse_table_opts o;
                struct sparse_table *st = NULL;
                sparse_table_opts_from_config(cfg, e, &o);
                if (sparse_table_new(&o, &st) < 0) {
                        free(rows);
                        return -ENOMEM;
                }
                for (uint64_t id = 0; id < es->vocab; id++)
                        sparse_table_init_row(st, id, rows + id * es->dim);
                sparse_table_free(st);
                for (uint64_t i = 0; i < x->n[e]; i++)
                        memcpy(rows + x->keys[e][i] * es->dim, x->vals[e] + i * es->dim, es->dim * sizeof(float));
        } else {
                memcpy(rows, x->vals[e], x->n[e] * es->dim * sizeof(float));
        }
        x->rows[e] = rows;
        x->t[e].rows = rows;
        x->t[e].n_rows = n_rows;
        x->t[e].keys = es->vocab ? NULL : x->keys[e];
        return 0;
}

int export_tables_load(const struct job_config *cfg, const struct graph *g, const struct ps_sparse_rows *rows,
                       const char *path, uint64_t max_inline_rows, bool all_outside, struct export_tables *x,
                       struct export_msgs *msg)
{
        const struct model_spec *spec = &cfg->model;
        memset(x, 0, sizeof(*x));
        x->front.n_tables = spec->n_embeddings;
        x->front.tables = x->t;
        if (!spec->graph) {
                x->front.concat = "input";
                x->front.dense = "dense";
                x->front.n_dense = spec->input[0] * spec->input[1] * spec->input[2];
        }
        uint32_t width = 0;
        for (uint32_t e = 0; e < spec->n_embeddings; e++)
                for (uint32_t j = 0; j < spec->emb[e].n_fields; j++)
                        width = spec->emb[e].fields[j] + 1 > width ? spec->emb[e].fields[j] + 1 : width;
        uint64_t bytes = 0;
        for (uint32_t e = 0; e < spec->n_embeddings; e++) {
                const struct embedding_spec *es = &spec->emb[e];
                struct onnx_table *t = &x->t[e];
                int r = export_rows_sorted(es, &rows[e], path, &x->keys[e], &x->vals[e], msg);
                if (r)
                        return r;
                x->n[e] = rows[e].n;
                /* Criteo's fields hold one id each; LIBSVM's and TFRecord's sparse features any number */
                *t = (struct onnx_table){ .name = es->name, .n_fields = es->n_fields, .fields = x->fields[e],
                                          .dim = es->dim, .vocab = es->vocab, .mean = es->pooling == POOL_MEAN,
                                          .multi = cfg->data.format != DATA_CRITEO };
                if (spec->graph) { /* the graph's own ids input, its columns the table's fields */
                        if ((r = graph_ids_input(spec, e, x->ids[e], sizeof(x->ids[e]), msg)))
                                return r;
                        snprintf(x->weights[e], sizeof(x->weights[e]), "%s_weights", x->ids[e]);
                        t->ids_width = es->n_fields;
                        for (uint32_t j = 0; j < es->n_fields; j++)
                                x->fields[e][j] = j;
                        for (uint32_t k = 0; k < spec->n_feeds; k++)
                                if (spec->feeds[k].kind == FEED_TABLE && spec->feeds[k].table == e)
                                        t->into = g->tensors[spec->feeds[k].tensor].name;
                } else {
                        snprintf(x->ids[e], sizeof(x->ids[e]), "ids");
                        snprintf(x->weights[e], sizeof(x->weights[e]), "weights");
                        t->ids_width = width;
                        memcpy(x->fields[e], es->fields, es->n_fields * sizeof(uint32_t));
                }
                t->ids = x->ids[e];
                t->weights = x->weights[e];
                uint64_t n_rows = es->vocab ? es->vocab : x->n[e] + 1;
                if (all_outside || (max_inline_rows && n_rows > max_inline_rows)) {
                        x->n_external++;
                        continue;
                }
                /* the rows can go to external data; a raw-id table's map cannot: LabelEncoder's two lists
                 * of int64, with their tags, about 22 bytes an id */
                bytes += es->vocab ? 0 : x->n[e] * 22;
                if (bytes > ONNX_INLINE_BYTES) {
                        export_say(msg, "export: table \"%s\"'s %" PRIu64 " ids do not fit in one ONNX file with the model "
                                  "(2 GiB): serve the tables from outside (--max-inline-rows N)", es->name, x->n[e]);
                        return CONFIG_EX_CONFIG;
                }
                if (inline_rows(cfg, e, x) < 0) {
                        export_say(msg, "export: out of memory for table %s (%" PRIu64 " rows of %u)", es->name, n_rows,
                                  es->dim);
                        return 1;
                }
        }
        return 0;
}

void export_tables_clear(struct export_tables *x)
{
        for (uint32_t e = 0; e < MODEL_MAX_EMBEDDINGS; e++) {
                free(x->keys[e]);
                free(x->vals[e]);
                free(x->rows[e]);
        }
        memset(x, 0, sizeof(*x));
}

/* The manifest's entry of table e. */
static json_t *manifest_table(const struct job_config *cfg, const struct export_tables *x, uint32_t e)
{
        const struct embedding_spec *es = &cfg->model.emb[e];
        const struct onnx_table *t = &x->t[e];
        char file[96], pooled[96];
        snprintf(file, sizeof(file), "tables/%s.safetensors", es->name);
        snprintf(pooled, sizeof(pooled), "%s/pooled", es->name);
        json_t *fields = json_array();
        for (uint32_t j = 0; fields && j < es->n_fields; j++)
                json_array_append_new(fields, json_integer(t->fields[j]));
        return json_pack("{s:s, s:s, s:I, s:i, s:I, s:s, s:o, s:s, s:s, s:b, s:s}", "name", es->name, "file", file,
                         "rows", (json_int_t)x->n[e], "dim", (int)es->dim, "vocab", (json_int_t)es->vocab, "pooling",
                         es->pooling == POOL_MEAN ? "mean" : "sum", "fields", fields, "ids_input", t->ids,
                         "weights_input", t->weights, "ids_per_field", t->multi, "pooled_input",
                         t->into ? t->into : pooled);
}

int export_table_file(const char *path, const struct export_table_meta *m, const uint64_t *ids, const float *rows,
                      uint64_t n, char *err, size_t errlen)
{
        uint64_t dim;
        if (n > UINT32_MAX || parse_u64(m->dim, 1, UINT32_MAX, &dim) < 0) {
                snprintf(err, errlen, "%" PRIu64 " rows of dim \"%s\": not a table this export writes", n, m->dim);
                return -EINVAL;
        }
        struct ckpt_written w;
        const struct ckpt_tensor ts[] = {
                { .name = "ids", .rows = (uint32_t)n, .cols = 1, .data = ids, .dtype = CKPT_U64, .ndims = 1 },
                { .name = "rows", .rows = (uint32_t)n, .cols = (uint32_t)dim, .data = rows },
        };
        const struct ckpt_kv meta[] = { { "table", m->table }, { "global_step", m->global_step }, { "dim", m->dim },
                                        { "vocab", m->vocab }, { "pooling", m->pooling } };
        return ckpt_write(path, ts, 2, meta, 5, &w, err, errlen);
}

int export_tables_write(const struct job_config *cfg, const struct export_tables *x, const char *dir,
                        const char *global_step, bool files, struct export_msgs *msg)
{
        if (x->n_external == 0)
                return 0;
        char *tdir = strdup_printf("%s/tables", dir), err[512];
        if (!tdir || (files && mkdir(tdir, 0755) < 0 && errno != EEXIST)) {
                export_say(msg, "export: cannot make %s/tables: %m", dir);
                free(tdir);
                return EXPORT_EX_IOERR;
        }
        uint64_t gs = 0;
        json_t *m = json_pack("{s:s, s:o, s:[]}", "job", cfg->name, "global_step",
                              parse_u64(global_step, 0, UINT64_MAX, &gs) == 0 ? json_integer((json_int_t)gs)
                                                                              : json_null(),
                              "tables");
        int ret = m ? 0 : 1;
        for (uint32_t e = 0; ret == 0 && e < cfg->model.n_embeddings; e++) {
                const struct embedding_spec *es = &cfg->model.emb[e];
                if (x->t[e].rows)
                        continue;
                char *path = strdup_printf("%s/%s.safetensors", tdir, es->name), vocab[24], dim[16];
                snprintf(vocab, sizeof(vocab), "%" PRIu64, es->vocab);
                snprintf(dim, sizeof(dim), "%u", es->dim);
                const struct export_table_meta tm = { es->name, global_step, dim, vocab,
                                                      es->pooling == POOL_MEAN ? "mean" : "sum" };
                if (!path || (files && export_table_file(path, &tm, x->keys[e], x->vals[e], x->n[e], err,
                                                         sizeof(err)) < 0)) {
                        export_say(msg, "export: cannot write %s: %s", path ? path : tdir, path ? err : "out of memory");
                        ret = EXPORT_EX_IOERR;
                }
                free(path);
                if (ret == 0 && json_array_append_new(json_object_get(m, "tables"), manifest_table(cfg, x, e)) < 0)
                        ret = 1;
        }
        char *mpath = strdup_printf("%s/tables.json", dir);
        char *text = ret == 0 ? json_dumps(m, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        int w = ret == 0 ? (!text || !mpath ? -ENOMEM : write_file_atomic(mpath, text, strlen(text))) : 0;
        if (w < 0) {
                export_say(msg, "export: cannot write %s/tables.json: %s", dir, strerror(-w));
                ret = EXPORT_EX_IOERR;
        }
        free(text);
        free(mpath);
        json_decref(m);
        free(tdir);
        return ret;
}

static void remove_stale(const char *path, struct export_msgs *msg)
{
        if (path && unlink(path) < 0 && errno != ENOENT)
                export_say(msg, "export: note: cannot remove %s, left by an earlier export: %m", path);
}

void export_tables_tidy(const struct job_config *cfg, const struct export_tables *x, const char *dir,
                        const char *data_file, bool delta, struct export_msgs *msg)
{
        if (data_file) {
                char *p = strdup_printf("%s/%s", dir, data_file);
                remove_stale(p, msg);
                free(p);
        }
        /* a delta's directory holds no table whole; a whole export's, no delta */
        for (uint32_t e = 0; e < cfg->model.n_embeddings; e++) {
                char *p = x->t[e].rows || delta ? strdup_printf("%s/tables/%s.safetensors", dir, cfg->model.emb[e].name)
                                                : NULL;
                char *d = delta ? NULL : strdup_printf("%s/delta/%s.safetensors", dir, cfg->model.emb[e].name);
                remove_stale(p, msg);
                remove_stale(d, msg);
                free(p);
                free(d);
        }
        char *empty = strdup_printf("%s/%s", dir, delta ? "tables" : "delta");
        if (empty)
                rmdir(empty);   /* if empty: a directory with files of another kind of export stays */
        free(empty);
        char *m = x->n_external == 0 ? strdup_printf("%s/tables.json", dir) : NULL;
        char *dm = delta ? NULL : strdup_printf("%s/delta.json", dir);
        remove_stale(m, msg);
        remove_stale(dm, msg);
        free(m);
        free(dm);
}
