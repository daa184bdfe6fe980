/* psfleet export --apply (cli_export.h): a delta (chief_export_delta.c) applied to a whole export of its
 * older step to make the newer one's, the same bytes (docs/serving.md). */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chief_export.h"
#include "ckpt.h"
#include "cli_export.h"
#include "cli_util.h"
#include "util.h"

#define EX_DATAERR 65
#define EX_IOERR 74

/* ---- applying one ---- */

/* A U64 [n] or F32 [n, dim] tensor of a file read (unaligned in it) copied out, malloc'd. */
static int take_tensor(const struct ckpt *ck, const char *path, const char *name, enum ckpt_dtype want, uint64_t dim,
                       void **ret, uint64_t *n_ret)
{
        enum ckpt_dtype dt;
        unsigned nd;
        uint64_t sh[CKPT_MAX_DIMS];
        if (ckpt_shape(ck, name, &dt, &nd, sh) < 0 || dt != want || nd != (want == CKPT_U64 ? 1u : 2u) ||
            (want == CKPT_F32 && sh[1] != dim)) {
                cli_error("export: %s has no tensor \"%s\" of %s", path, name,
                          want == CKPT_U64 ? "U64 [n]" : "F32 [n, dim] (the table's dim)");
                return EX_DATAERR;
        }
        size_t bytes = sh[0] * (want == CKPT_U64 ? sizeof(uint64_t) : dim * sizeof(float));
        if (!(*ret = malloc(bytes + 1)))
                return 1;
        if (ckpt_read_rows(ck, name, 0, sh[0], *ret) < 0) {
                cli_error("export: %s: cannot read tensor \"%s\"", path, name);
                free(*ret);
                *ret = NULL;
                return EX_IOERR;
        }
        *n_ret = sh[0];
        return 0;
}

/* 0 when ids[0..n) rise strictly (as every export writes them). */
static int ascending(const uint64_t *ids, uint64_t n, const char *path, const char *name)
{
        for (uint64_t i = 1; i < n; i++)
                if (ids[i] <= ids[i - 1]) {
                        cli_error("export: %s: \"%s\" is not in the order of the ids (id %" PRIu64 " after %" PRIu64
                                  "): an export older than deltas? export it again", path, name, ids[i], ids[i - 1]);
                        return EX_DATAERR;
                }
        return 0;
}

/* One table of the apply: the rows of the whole export, the delta's, and what they make. */
struct apply_table {
        const char *name;
        char *full_path, *tmp_path, *delta_path;
        struct ckpt *full, *delta;
        uint64_t *ids, *d_ids, *gone, *out_ids;
        float *rows, *d_rows, *out_rows;
        uint64_t n, d_n, n_gone, out_n;
};

static void apply_table_clear(struct apply_table *t)
{
        free(t->full_path);
        free(t->tmp_path);
        free(t->delta_path);
        ckpt_free(t->full);
        ckpt_free(t->delta);
        free(t->ids);
        free(t->d_ids);
        free(t->gone);
        free(t->out_ids);
        free(t->rows);
        free(t->d_rows);
        free(t->out_rows);
}

/* The whole export's rows less the tombstones, the delta's rows in (all sorted by id: a merge). */
static int apply_merge(struct apply_table *t, uint64_t dim)
{
        uint64_t cap = t->n + t->d_n, i = 0, j = 0, k = 0, n = 0;
        t->out_ids = malloc(cap * sizeof(uint64_t) + 1);
        t->out_rows = malloc(cap * dim * sizeof(float) + 1);
        if (!t->out_ids || !t->out_rows)
                return 1;
        while (i < t->n || j < t->d_n) {
                bool from_delta = i == t->n || (j < t->d_n && t->d_ids[j] <= t->ids[i]);
                uint64_t id = from_delta ? t->d_ids[j] : t->ids[i];
                const float *row = from_delta ? t->d_rows + j * dim : t->rows + i * dim;
                if (from_delta) {
                        if (i < t->n && t->ids[i] == id)
                                i++;
                        j++;
                } else {
                        i++;
                        while (k < t->n_gone && t->gone[k] < id)
                                k++;
                        if (k < t->n_gone && t->gone[k] == id)
                                continue;
                }
                t->out_ids[n] = id;
                memcpy(t->out_rows + n * dim, row, dim * sizeof(float));
                n++;
        }
        t->out_n = n;
        return 0;
}

/* The JSON object of a file, or NULL after saying why. */
static json_t *load_json(const char *path)
{
        json_error_t je;
        json_t *j = json_load_file(path, 0, &je);
        if (!j || !json_is_object(j)) {
                cli_error("export: %s: %s", path, j ? "not a JSON object" : je.text);
                json_decref(j);
                return NULL;
        }
        return j;
}

/* Entry `name` of a manifest's "tables", or NULL. */
static json_t *manifest_entry(json_t *m, const char *name)
{
        json_t *list = json_object_get(m, "tables");
        for (size_t i = 0; i < json_array_size(list); i++) {
                const char *n = json_string_value(json_object_get(json_array_get(list, i), "name"));
                if (n && strcmp(n, name) == 0)
                        return json_array_get(list, i);
        }
        return NULL;
}

/* Reads and checks table entry dt of the delta against FULL, and merges: 0 or the exit status. */
static int apply_read(const char *delta, const char *full, json_t *dt, json_t *full_m, json_t *new_m, uint64_t from,
                      struct apply_table *t)
{
        char e[512];
        const char *file = json_string_value(json_object_get(dt, "file"));
        json_t *ft = manifest_entry(full_m, t->name), *nt = manifest_entry(new_m, t->name);
        const char *ffile = json_string_value(json_object_get(ft, "file"));
        if (!file || strchr(t->name, '/') || !nt || !json_is_integer(json_object_get(nt, "rows"))) {
                cli_error("export: %s/delta.json: table \"%s\" is not described whole (file, and in tables.json its "
                          "rows)", delta, t->name);
                return EX_DATAERR;
        }
        if (!ffile || strstr(ffile, "..")) {
                cli_error("export: %s/tables.json has no table \"%s\" served from outside: a delta applies to an export "
                          "with every table outside (psfleet export --max-inline-rows 1)", full, t->name);
                return EX_DATAERR;
        }
        t->full_path = strdup_printf("%s/%s", full, ffile);
        t->tmp_path = strdup_printf("%s/tables/.%s.safetensors.apply", full, t->name);
        t->delta_path = strdup_printf("%s/%s", delta, file);
        if (!t->full_path || !t->tmp_path || !t->delta_path)
                return 1;
        for (int k = 0; k < 2; k++) {
                const char *p = k ? t->delta_path : t->full_path;
                int r = ckpt_read(p, UINT64_MAX, k ? &t->delta : &t->full, e, sizeof(e));
                if (r < 0) {
                        cli_error("export: %s: %s", p, e);
                        return r == -ENOENT || r == -EBADMSG ? EX_DATAERR : EX_IOERR;
                }
        }
        const char *fgs = ckpt_meta(t->full, "global_step"), *dfrom = ckpt_meta(t->delta, "from_step");
        const char *fdim = ckpt_meta(t->full, "dim"), *ddim = ckpt_meta(t->delta, "dim");
        uint64_t g = 0, f = 0, dim = 0;
        if (!fgs || parse_u64(fgs, 0, UINT64_MAX, &g) < 0 || g != from || !dfrom ||
            parse_u64(dfrom, 0, UINT64_MAX, &f) < 0 || f != from) {
                cli_error("export: %s is of global_step %s and %s goes from %s: the delta goes from %" PRIu64, t->full_path,
                          fgs ? fgs : "(none)", t->delta_path, dfrom ? dfrom : "(none)", from);
                return EX_DATAERR;
        }
        if (!fdim || !ddim || strcmp(fdim, ddim) != 0 || parse_u64(fdim, 1, UINT32_MAX, &dim) < 0) {
                cli_error("export: %s (dim %s) and %s (dim %s) are not the same table", t->full_path,
                          fdim ? fdim : "(none)", t->delta_path, ddim ? ddim : "(none)");
                return EX_DATAERR;
        }
        uint64_t n_rows = 0, d_rows = 0;
        int r;
        if ((r = take_tensor(t->full, t->full_path, "ids", CKPT_U64, 0, (void **)&t->ids, &t->n)) ||
            (r = take_tensor(t->full, t->full_path, "rows", CKPT_F32, dim, (void **)&t->rows, &n_rows)) ||
            (r = take_tensor(t->delta, t->delta_path, "ids", CKPT_U64, 0, (void **)&t->d_ids, &t->d_n)) ||
            (r = take_tensor(t->delta, t->delta_path, "rows", CKPT_F32, dim, (void **)&t->d_rows, &d_rows)) ||
            (r = take_tensor(t->delta, t->delta_path, "tombstones", CKPT_U64, 0, (void **)&t->gone, &t->n_gone)))
                return r;
        if (n_rows != t->n || d_rows != t->d_n) {
                cli_error("export: %s or %s: as many ids as rows are needed", t->full_path, t->delta_path);
                return EX_DATAERR;
        }
        if ((r = ascending(t->ids, t->n, t->full_path, "ids")) || (r = ascending(t->d_ids, t->d_n, t->delta_path, "ids")) ||
            (r = ascending(t->gone, t->n_gone, t->delta_path, "tombstones")))
                return r;
        if (apply_merge(t, dim))
                return 1;
        uint64_t want = (uint64_t)json_integer_value(json_object_get(nt, "rows"));
        if (t->out_n != want) {
                cli_error("export: table \"%s\": %s with the delta makes %" PRIu64 " rows, the delta's tables.json "
                          "says %" PRIu64 ": the export is not the one the delta was made against", t->name, full,
                          t->out_n, want);
                return EX_DATAERR;
        }
        return 0;
}

int export_delta_apply(const char *delta, const char *full)
{
        char *dpath = strdup_printf("%s/delta.json", delta), *fpath = strdup_printf("%s/tables.json", full);
        char *npath = strdup_printf("%s/tables.json", delta), e[512];
        json_t *dm = NULL, *fm = NULL, *nm = NULL;
        struct apply_table t[MODEL_MAX_EMBEDDINGS] = { 0 };
        size_t nt = 0, nf = 0;
        char *src[4] = { 0 }, *tmp[4] = { 0 }, *dst[4] = { 0 };
        int ret = dpath && fpath && npath ? 0 : 1;
        if (ret == 0 && (!(dm = load_json(dpath)) || !(fm = load_json(fpath)) || !(nm = load_json(npath))))
                ret = EX_DATAERR;
        json_t *tables = json_object_get(dm, "tables"), *files = json_object_get(dm, "files");
        const char *fmt = json_string_value(json_object_get(dm, "format"));
        const char *job = json_string_value(json_object_get(dm, "job")), *fjob = json_string_value(json_object_get(fm, "job"));
        uint64_t from = (uint64_t)json_integer_value(json_object_get(dm, "from_step"));
        uint64_t to = (uint64_t)json_integer_value(json_object_get(dm, "to_step"));
        json_t *fgs = json_object_get(fm, "global_step");
        if (ret == 0 && (!fmt || strcmp(fmt, DELTA_FORMAT) != 0 || !job || !json_is_array(tables) ||
                         !json_is_array(files) || json_array_size(tables) > MODEL_MAX_EMBEDDINGS ||
                         json_array_size(files) > 3 || from >= to)) {
                cli_error("export: %s is not a delta of this psfleet (format \"%s\")", dpath, fmt ? fmt : "(none)");
                ret = EX_DATAERR;
        }
        if (ret == 0 && (!fjob || strcmp(fjob, job) != 0 || !json_is_integer(fgs) ||
                         (uint64_t)json_integer_value(fgs) != from)) {
                cli_error("export: %s is the export of job %s at global_step %" PRIu64 "; the delta %s goes from job %s's "
                          "global_step %" PRIu64 " to %" PRIu64, full, fjob ? fjob : "(none)",
                          json_is_integer(fgs) ? (uint64_t)json_integer_value(fgs) : 0, delta, job, from, to);
                ret = EX_DATAERR;
        }
        for (size_t i = 0; ret == 0 && i < json_array_size(tables); i++) {
                json_t *dt = json_array_get(tables, i);
                t[nt].name = json_string_value(json_object_get(dt, "name"));
                if (!t[nt].name) {
                        cli_error("export: %s: a table without a name", dpath);
                        ret = EX_DATAERR;
                        break;
                }
                ret = apply_read(delta, full, dt, fm, nm, from, &t[nt++]);
        }
        bool with_data = false;
        for (size_t i = 0; ret == 0 && i < json_array_size(files); i++) {
                const char *name = json_string_value(json_array_get(files, i));
                if (!name || strchr(name, '/') || name[0] == '.') {
                        cli_error("export: %s: \"files\" names a file outside the directory", dpath);
                        ret = EX_DATAERR;
                        break;
                }
                with_data |= strcmp(name, "model.onnx.data") == 0;
                src[nf] = strdup_printf("%s/%s", delta, name);
                tmp[nf] = strdup_printf("%s/.%s.apply", full, name);
                dst[nf] = strdup_printf("%s/%s", full, name);
                if (!src[nf++] || !tmp[nf - 1] || !dst[nf - 1])
                        ret = 1;
        }
        /* everything read and checked: now the new files under temporary names, then renamed, model.onnx
         * (files[0]) last: a server that reads model.onnx sees the tables already in place */
        for (size_t k = 0; ret == 0 && k < nt; k++) {
                const struct export_table_meta m = {
                        ckpt_meta(t[k].delta, "table"), ckpt_meta(t[k].delta, "global_step"), ckpt_meta(t[k].delta, "dim"),
                        ckpt_meta(t[k].delta, "vocab"), ckpt_meta(t[k].delta, "pooling") };
                if (!m.table || !m.global_step || !m.vocab || !m.pooling) {
                        cli_error("export: %s lacks the metadata of a table's file", t[k].delta_path);
                        ret = EX_DATAERR;
                } else if (export_table_file(t[k].tmp_path, &m, t[k].out_ids, t[k].out_rows, t[k].out_n, e, sizeof(e)) <
                           0) {
                        cli_error("export: cannot write %s: %s", t[k].tmp_path, e);
                        ret = EX_IOERR;
                }
        }
        for (size_t k = 0; ret == 0 && k < nf; k++) {
                char *data = NULL;
                size_t len = 0;
                int r = read_file(src[k], SIZE_MAX, &data, &len);
                if (r < 0) {
                        cli_error("export: cannot read %s: %s", src[k], strerror(-r));
                        ret = r == -ENOENT ? EX_DATAERR : EX_IOERR;
                } else if ((r = write_file_atomic(tmp[k], data, len)) < 0) {
                        cli_error("export: cannot write %s: %s", tmp[k], strerror(-r));
                        ret = EX_IOERR;
                }
                free(data);
        }
        for (size_t k = 0; ret == 0 && k < nt; k++)
                if (rename(t[k].tmp_path, t[k].full_path) < 0) {
                        cli_error("export: cannot rename %s to %s: %m", t[k].tmp_path, t[k].full_path);
                        ret = EX_IOERR;
                }
        for (size_t k = nf; ret == 0 && k-- > 0;)
                if (rename(tmp[k], dst[k]) < 0) {
                        cli_error("export: cannot rename %s to %s: %m", tmp[k], dst[k]);
                        ret = EX_IOERR;
                }
        if (ret == 0 && !with_data) { /* external data the new model has none of */
                char *data = strdup_printf("%s/model.onnx.data", full);
                if (data && unlink(data) < 0 && errno != ENOENT)
                        cli_error("export: note: cannot remove %s, which the new model.onnx does not use: %m", data);
                free(data);
        }
        if (ret == 0) {
                uint64_t changed = 0, gone = 0;
                for (size_t k = 0; k < nt; k++)
                        changed += t[k].d_n, gone += t[k].n_gone;
                printf("applied %s to %s: job %s from global_step %" PRIu64 " to %" PRIu64 " (%" PRIu64
                       " rows changed, %" PRIu64 " gone)\n", delta, full, job, from, to, changed, gone);
        }
        for (size_t k = 0; k < nt; k++) {
                if (ret && t[k].tmp_path)
                        unlink(t[k].tmp_path);
                apply_table_clear(&t[k]);
        }
        for (size_t k = 0; k < nf; k++) {
                if (ret && tmp[k])
                        unlink(tmp[k]);
                free(src[k]);
                free(tmp[k]);
                free(dst[k]);
        }
        json_decref(dm);
        json_decref(fm);
        json_decref(nm);
        free(dpath);
        free(fpath);
        free(npath);
        return ret;
}
