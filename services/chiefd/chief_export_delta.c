/* An export's deltas (chief_export.h): the table rows that changed between two checkpoints of a job,
 * written beside what a whole export of the newer one holds but its tables; psfleet export --apply
 * (cli_export_delta.c) makes the newer one's export from them, the same bytes (docs/serving.md). */
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
#include "util.h"


/* ---- writing a delta ---- */

/* Table e's delta: b's rows new or changed since a's (both sorted by id), and a's ids gone in b. */
static int delta_rows(const struct export_tables *b, uint32_t e, const uint64_t *ak, const float *av, size_t an,
                      uint32_t dim, uint64_t **ids_ret, float **rows_ret, size_t *n_ret, uint64_t **gone_ret,
                      size_t *n_gone_ret)
{
        const uint64_t *bk = b->keys[e];
        const float *bv = b->vals[e];
        size_t bn = b->n[e], n = 0, n_gone = 0, i = 0, j = 0;
        uint64_t *ids = malloc(bn * sizeof(uint64_t) + 1), *gone = malloc(an * sizeof(uint64_t) + 1);
        float *rows = malloc(bn * dim * sizeof(float) + 1);
        if (!ids || !gone || !rows) {
                free(ids);
                free(gone);
                free(rows);
                return -ENOMEM;
        }
        size_t row_bytes = dim * sizeof(float);
        while (i < an || j < bn) {
                if (j == bn || (i < an && ak[i] < bk[j])) {
                        gone[n_gone++] = ak[i++];
                        continue;
                }
                bool same = i < an && ak[i] == bk[j] && memcmp(av + i * dim, bv + j * dim, row_bytes) == 0;
                if (i < an && ak[i] == bk[j])
                        i++;
                if (!same) {
                        ids[n] = bk[j];
                        memcpy(rows + n * dim, bv + j * dim, row_bytes);
                        n++;
                }
                j++;
        }
        *ids_ret = ids, *rows_ret = rows, *n_ret = n, *gone_ret = gone, *n_gone_ret = n_gone;
        return 0;
}

int export_delta_tables(const struct job_config *cfg, const struct export_tables *b, const struct ps_sparse_rows *a,
                        uint64_t from, uint64_t to, const char *dir, json_t **tables_ret,
                        struct export_msgs *msg)
{
        char *ddir = strdup_printf("%s/delta", dir), err[512], from_s[24], to_s[24];
        if (!ddir || (mkdir(ddir, 0755) < 0 && errno != EEXIST)) {
                export_say(msg, "export: cannot make %s/delta: %m", dir);
                free(ddir);
                return EXPORT_EX_IOERR;
        }
        snprintf(from_s, sizeof(from_s), "%" PRIu64, from);
        snprintf(to_s, sizeof(to_s), "%" PRIu64, to);
        json_t *list = json_array();
        int ret = list ? 0 : 1;
        for (uint32_t e = 0; ret == 0 && e < cfg->model.n_embeddings; e++) {
                const struct embedding_spec *es = &cfg->model.emb[e];
                uint64_t *ak = NULL, *ids = NULL, *gone = NULL;
                float *av = NULL, *rows = NULL;
                size_t n = 0, n_gone = 0;
                char *path = strdup_printf("%s/%s.safetensors", ddir, es->name), vocab[24], dim[16];
                if ((ret = export_rows_sorted(es, &a[e], "the checkpoint of --since", &ak, &av, msg)) == 0 &&
                    delta_rows(b, e, ak, av, a[e].n, es->dim, &ids, &rows, &n, &gone, &n_gone) < 0) {
                        export_say(msg, "export: out of memory for the changes of table %s", es->name);
                        ret = 1;
                }
                snprintf(vocab, sizeof(vocab), "%" PRIu64, es->vocab);
                snprintf(dim, sizeof(dim), "%u", es->dim);
                struct ckpt_written w;
                const struct ckpt_tensor ts[] = {
                        { .name = "ids", .rows = (uint32_t)n, .cols = 1, .data = ids, .dtype = CKPT_U64, .ndims = 1 },
                        { .name = "rows", .rows = (uint32_t)n, .cols = es->dim, .data = rows },
                        { .name = "tombstones", .rows = (uint32_t)n_gone, .cols = 1, .data = gone, .dtype = CKPT_U64,
                          .ndims = 1 },
                };
                const struct ckpt_kv meta[] = { { "table", es->name }, { "from_step", from_s }, { "global_step", to_s },
                                                { "dim", dim }, { "vocab", vocab },
                                                { "pooling", es->pooling == POOL_MEAN ? "mean" : "sum" } };
                if (ret == 0 && (!path || ckpt_write(path, ts, 3, meta, 6, &w, err, sizeof(err)) < 0)) {
                        export_say(msg, "export: cannot write %s: %s", path ? path : ddir, path ? err : "out of memory");
                        ret = EXPORT_EX_IOERR;
                }
                char *file = strdup_printf("delta/%s.safetensors", es->name);
                json_t *t = ret == 0 && file ? json_pack("{s:s, s:s, s:I, s:I, s:I, s:I}", "name", es->name, "file",
                                                         file, "changed", (json_int_t)n, "tombstones",
                                                         (json_int_t)n_gone, "rows", (json_int_t)b->n[e], "bytes",
                                                         (json_int_t)w.bytes)
                                             : NULL;
                free(file);
                if (ret == 0 && (!t || json_array_append_new(list, t) < 0))
                        ret = 1;
                free(path);
                free(ak);
                free(av);
                free(ids);
                free(rows);
                free(gone);
        }
        free(ddir);
        if (ret) {
                json_decref(list);
                return ret;
        }
        *tables_ret = list;
        return 0;
}

int export_delta_commit(const char *dir, const char *job, uint64_t from, uint64_t to, json_t *tables,
                        const char *data_file, struct export_msgs *msg)
{
        json_t *m = json_pack("{s:s, s:s, s:I, s:I, s:O, s:[ss]}", "format", DELTA_FORMAT, "job", job, "from_step",
                              (json_int_t)from, "to_step", (json_int_t)to, "tables", tables, "files", "model.onnx",
                              "tables.json");
        if (m && data_file)
                json_array_append_new(json_object_get(m, "files"), json_string(data_file));
        char *text = m ? json_dumps(m, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        char *path = strdup_printf("%s/delta.json", dir);
        int r = text && path ? write_file_atomic(path, text, strlen(text)) : -ENOMEM;
        if (r < 0)
                export_say(msg, "export: cannot write %s/delta.json: %s", dir, strerror(-r));
        free(path);
        free(text);
        json_decref(m);
        return r < 0 ? EXPORT_EX_IOERR : 0;
}
