/* A job's model exported for serving (chief_export.h): from one of the chief's checkpoints (the newest
 * that verifies, or one step's) or from one checkpoint file. Every file is written under a temporary
 * name and renamed when whole: an export that fails leaves nothing that looks finished. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chief_ckpt.h"
#include "chief_db.h"
#include "chief_export.h"
#include "ckpt.h"
#include "graph.h"
#include "graph_spec.h"
#include "job.h"
#include "onnx_save.h"
#include "util.h"

#define ONNX_MAX_BYTES ((size_t)INT32_MAX) /* protobuf's limit on one message, so on model.onnx */

void export_say(struct export_msgs *m, const char *fmt, ...) {
        int saved = errno; /* for %m */
        size_t used = m->buf ? strlen(m->buf) : 0;
        if (!m->buf || used + 1 >= m->len)
                return;
        va_list ap;
        va_start(ap, fmt);
        errno = saved;
        int n = vsnprintf(m->buf + used, m->len - used, fmt, ap);
        va_end(ap);
        if (n >= 0 && used + (size_t)n + 1 < m->len)
                strcpy(m->buf + used + n, "\n");
        errno = saved;
}

void export_result_clear(struct export_result *res) {
        free(res->ck_path);
        free(res->written);
        memset(res, 0, sizeof(*res));
}

/* The chief's records of a job: its checkpoints, newest first. */
struct records {
        struct chief_db *db;
        const char *where;                      /* the directory of chief.db */
        struct chief_ckpt *store;               /* NULL: one opened for the chains */
        struct chief_db_checkpoint *rows;       /* newest first */
        size_t n;
};

static int records_list(const struct export_request *q, struct records *rec, struct export_msgs *msg) {
        *rec = (struct records){ .db = q->db, .where = q->where, .store = q->store };
        int r = chief_db_list_checkpoints(rec->db, &rec->rows, &rec->n);
        if (r < 0) {
                export_say(msg, "export: cannot read the checkpoints recorded in %s/chief.db: %s", rec->where,
                           strerror(-r));
                return EXPORT_EX_DATAERR;
        }
        if (rec->n == 0) {
                export_say(msg, "export: job %s has no checkpoint (%s/chief.db records none)", q->cfg->name,
                           rec->where);
                return EXPORT_EX_DATAERR;
        }
        return 0;
}

/* The checkpoint file and its step: --checkpoint, else the records' newest that reads (or --step's).
 * Returns 0 with *ck read, *path_ret malloc'd and *step_ret, or the exit status after printing why. */
static int find_checkpoint(const char *file, const struct records *rec, const struct job_config *cfg, uint64_t step,
                           struct ckpt **ck, char **path_ret, uint64_t *step_ret, struct export_msgs *msg) {
        char e[512];
        if (file) {
                int r = ckpt_read(file, UINT64_MAX, ck, e, sizeof(e));
                if (r < 0) {
                        export_say(msg, "export: checkpoint %s: %s", file, e);
                        return r == -EBADMSG ? EXPORT_EX_DATAERR : EXPORT_EX_IOERR;
                }
                const char *gs = ckpt_meta(*ck, "global_step");
                if (!gs || parse_u64(gs, 0, UINT64_MAX, step_ret) < 0)
                        *step_ret = 0;
                *path_ret = strdup(file);
                return 0;
        }
        int ret = EXPORT_EX_DATAERR, r = 0;
        for (size_t i = 0; i < rec->n && ret != 0; i++) {
                const struct chief_db_checkpoint *c = &rec->rows[i];
                if (step && c->global_step != step)
                        continue;
                char sum[32];
                if ((r = ckpt_read(c->path, UINT64_MAX, ck, e, sizeof(e))) == 0 &&
                    strcmp(ckpt_format_checksum(ckpt_crc32c(*ck), sum, sizeof(sum)), c->checksum) != 0) {
                        snprintf(e, sizeof(e), "checksum %s, %s was recorded", sum, c->checksum);
                        *ck = ckpt_free(*ck);
                        r = -EBADMSG;
                }
                if (r == 0) {
                        *path_ret = strdup(c->path);
                        *step_ret = c->global_step;
                        ret = 0;
                } else {
                        export_say(msg, "export: checkpoint of global_step %" PRIu64 " (%s) does not verify: %s%s",
                                  c->global_step, c->path, e, step ? "" : "; trying an older one");
                        r = 0;
                        if (step)
                                break;
                }
        }
        if (ret != 0 && r == 0)
                export_say(msg, step ? "export: job %s has no checkpoint of global_step %" PRIu64 " that verifies (psfleet "
                                 "checkpoints list)"
                               : "export: job %s has no checkpoint that verifies%.0" PRIu64,
                          cfg->name, step);
        return ret;
}

/* The tables' rows at the recorded step, its chain of increments resolved as a restore resolves it
 * (chief_ckpt_read_step), into tables[0..n_embeddings) (the caller clears them); ck: the checkpoint
 * exported, whose fingerprint its links share. 0, or the exit status after saying why. */
static int chain_tables(const struct records *rec, const struct job_config *cfg, const struct ckpt *ck, uint64_t step,
                        struct ps_sparse_rows *tables, struct export_msgs *msg) {
        struct job_layout *L = NULL;
        struct chief_ckpt *s = NULL;
        float *params = NULL;
        char err[1200];
        int r = job_layout_new(cfg, &L);
        if (r < 0) {
                export_say(msg, "export: job %s's model: %s", cfg->name, strerror(-r));
                return r == -ENOMEM ? 1 : CONFIG_EX_CONFIG;
        }
        struct chief_ckpt_config cc = { .dir = rec->where, .L = L, .model = &cfg->model,
                                        .sparse_optimizer = cfg->training.sparse_optimizer, .job = cfg->name,
                                        .fingerprint = config_fingerprint(cfg), .keep = 1 };
        /* read_params has noted a checkpoint of another fingerprint: the links of its job need no more word */
        const char *fp = ckpt_meta(ck, "fingerprint");
        uint64_t theirs;
        if (fp && sscanf(fp, "%16" SCNx64, &theirs) == 1)
                cc.fingerprint = theirs;
        struct chief_db_checkpoint row;
        if (rec->store)
                s = rec->store;
        else
                r = chief_ckpt_new(rec->db, &cc, &s, err, sizeof(err));
        if (r == 0) {
                params = calloc(L->n_params + 1, sizeof(float));
                r = params ? chief_ckpt_read_step(s, step, params, tables, &row, err, sizeof(err))
                           : errf(err, sizeof(err), -ENOMEM, "out of memory");
        }
        if (r < 0)
                export_say(msg, "export: job %s's checkpoint of global_step %" PRIu64 ": %s", cfg->name, step, err);
        free(params);
        if (s != rec->store)
                chief_ckpt_free(s);
        job_layout_free(L);
        return r == -ENOMEM ? 1 : r < 0 ? EXPORT_EX_DATAERR : 0;
}

/* The parameter block from the checkpoint, variable by variable (each checked for its shape). */
static int read_params(const struct job_config *cfg, const struct ckpt *ck, const char *path, float **params_ret,
                       struct export_msgs *msg) {
        char e[512];
        const char *fp = ckpt_meta(ck, "fingerprint");
        char want[32];
        snprintf(want, sizeof(want), "%016" PRIx64, config_fingerprint(cfg));
        /* the fingerprint covers the whole job (its cluster too: a local job's copy has other ports), so
         * a difference is worth a word, not a refusal: every variable is checked by name and shape */
        if (fp && strcmp(fp, want) != 0)
                export_say(msg, "export: note: checkpoint %s was written by a job of fingerprint %s, this job file's is %s; "
                          "its variables are taken by name and shape", path, fp, want);
        struct model_spec_var *vars = calloc(MODEL_MAX_VARS, sizeof(*vars));
        size_t n_params = 0;
        int nv = vars ? model_spec_vars(&cfg->model, vars, &n_params) : -ENOMEM;
        float *p = nv >= 0 ? calloc(n_params ? n_params : 1, sizeof(float)) : NULL;
        int ret = p ? 0 : 1;
        for (int v = 0; p && v < nv && ret == 0; v++)
                if (ckpt_get(ck, vars[v].name, vars[v].rows, vars[v].cols, p + vars[v].offset, e, sizeof(e)) < 0) {
                        export_say(msg, "export: checkpoint %s: %s", path, e);
                        ret = EXPORT_EX_DATAERR;
                }
        free(vars);
        if (ret != 0)
                free(p);
        else
                *params_ret = p;
        return ret;
}

static int make_dir(const char *dir, struct export_msgs *msg) {
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
                export_say(msg, "export: cannot make %s: %m", dir);
                return EXPORT_EX_IOERR;
        }
        return 0;
}

/* The external data as DIR/model.onnx.data: its pieces at their offsets, zeros between, written
 * whole under a temporary name. */
static int write_data(const char *dir, const struct onnx_external *x, struct export_msgs *msg) {
        static const char zeros[4096];
        char *path = strdup_printf("%s/%s", dir, x->location), *tmp = strdup_printf("%s/.%s.tmp", dir, x->location);
        struct atomic_file *af = NULL;
        int r = path && tmp ? atomic_file_open(path, tmp, 0644, &af) : -ENOMEM;
        uint64_t at = 0;
        for (size_t i = 0; r == 0 && i < x->n; i++) {
                while (r == 0 && at < x->pieces[i].offset) {
                        size_t k = x->pieces[i].offset - at > sizeof(zeros) ? sizeof(zeros) : x->pieces[i].offset - at;
                        r = atomic_file_write(af, zeros, k);
                        at += k;
                }
                if (r == 0)
                        r = atomic_file_write(af, x->pieces[i].data, x->pieces[i].len);
                at += x->pieces[i].len;
        }
        if (r == 0)
                r = atomic_file_commit(af, NULL);
        else
                atomic_file_abort(af);
        if (r < 0)
                export_say(msg, "export: cannot write %s: %s", path ? path : dir, strerror(-r));
        free(path);
        free(tmp);
        return r < 0 ? EXPORT_EX_IOERR : 0;
}

/* Writes buf as DIR/model.onnx: DIR/.model.onnx.tmp, synced, then renamed. */
static int write_out(const char *dir, const void *buf, size_t len, char **path_ret, struct export_msgs *msg) {
        char *tmp = strdup_printf("%s/.model.onnx.tmp", dir), *path = strdup_printf("%s/model.onnx", dir);
        int fd = tmp ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
        bool ok = fd >= 0 && path;
        for (size_t at = 0; ok && at < len;) {
                ssize_t w = write(fd, (const char *)buf + at, len - at);
                ok = w > 0 || (w < 0 && errno == EINTR);
                at += w > 0 ? (size_t)w : 0;
        }
        ok = ok && fsync(fd) == 0;
        if (fd >= 0 && close(fd) < 0)
                ok = false;
        ok = ok && rename(tmp, path) == 0;
        if (!ok) {
                export_say(msg, "export: cannot write %s: %m", path ? path : dir);
                if (tmp)
                        unlink(tmp);
        }
        free(tmp);
        if (ok)
                *path_ret = path;
        else
                free(path);
        return ok ? 0 : EXPORT_EX_IOERR;
}

int chief_export(const struct export_request *q, struct export_result *res, struct export_msgs *msg) {
        memset(res, 0, sizeof(*res));
        struct graph *own = NULL;
        struct ckpt *ck = NULL;
        struct records rec = { 0 };
        const struct job_config *cfg = q->cfg;
        const char *file = q->file, *out = q->out;
        uint64_t step = q->step, since = q->since;
        bool external = q->external;
        struct export_tables tables = { 0 };
        struct onnx_external ext = { .location = "model.onnx.data", .min_bytes = 1u << 20 };
        int r = 0;
        struct ps_sparse_rows rows_b[MODEL_MAX_EMBEDDINGS] = { 0 }, rows_a[MODEL_MAX_EMBEDDINGS] = { 0 };
        json_t *delta = NULL;
        char *ck_path = NULL, *written = NULL, err[512] = "";
        float *params = NULL;
        void *buf = NULL;
        size_t len = 0;
        uint64_t gstep = 0;
        const char *gs = NULL;
        const struct model_spec *spec = &cfg->model;
        const struct graph *g = spec->graph;
        if (since && !spec->n_embeddings) {
                export_say(msg, "export: job %s's model has no embedding table: a delta holds tables' rows (export the "
                          "whole model instead)", cfg->name);
                r = CONFIG_EX_CONFIG;
                goto out;
        }
        if (!g && graph_from_spec(spec, &own, err, sizeof(err)) < 0) {
                export_say(msg, "export: job %s's model: %s", cfg->name, err);
                r = CONFIG_EX_CONFIG;
                goto out;
        }
        g = g ? g : own;
        if ((!file && (r = records_list(q, &rec, msg)) != 0) ||
            (r = find_checkpoint(file, &rec, cfg, step, &ck, &ck_path, &gstep, msg)) != 0 ||
            (r = read_params(cfg, ck, ck_path, &params, msg)) != 0)
                goto out;
        if (since && since >= gstep) {
                export_say(msg, "export: --since %" PRIu64 " is not before the checkpoint exported (global_step %" PRIu64 "): "
                          "a delta goes from an older checkpoint to a newer one", since, gstep);
                r = EXPORT_EX_DATAERR;
                goto out;
        }
        const char *kind = ckpt_meta(ck, "checkpoint"), *parent = ckpt_meta(ck, "parent_step");
        if (spec->n_embeddings && file && kind && strcmp(kind, "incremental") == 0) {
                /* its tables hold only the rows changed since its parent, which only the records find */
                export_say(msg, "export: checkpoint %s is incremental (the embedding rows changed since global_step %s): "
                          "its tables are not whole; export it from the chief's records (--job with --state-dir and "
                          "--step %" PRIu64 "), which resolve its chain", ck_path, parent ? parent : "?", gstep);
                r = EXPORT_EX_DATAERR;
                goto out;
        }
        if (spec->n_embeddings &&
            ((r = file ? export_tables_read(cfg, ck, ck_path, rows_b, msg)
                   : chain_tables(&rec, cfg, ck, gstep, rows_b, msg)) != 0 ||
             (since && (r = chain_tables(&rec, cfg, ck, since, rows_a, msg)) != 0) ||
             (r = export_tables_load(cfg, g, rows_b, ck_path, q->max_inline_rows, since != 0, &tables, msg)) !=
                      0))
                goto out;
        gs = ckpt_meta(ck, "global_step");
        char doc[512];
        snprintf(doc, sizeof(doc), "job %s, global_step %s, exported by psfleet %s from %s", cfg->name, gs ? gs : "?",
                 PSFLEET_VERSION, ck_path);
        /* over protobuf's 2 GiB (or asked), the large initializers go to model.onnx.data: known ahead from
         * the values alone, or found from the file's size */
        const struct onnx_front *front = spec->n_embeddings ? &tables.front : NULL;
        uint64_t values = (uint64_t)g->n_params * sizeof(float);
        for (uint32_t e = 0; e < spec->n_embeddings; e++)
                values += tables.t[e].rows ? tables.t[e].n_rows * tables.t[e].dim * sizeof(float) : 0;
        external |= values >= ONNX_MAX_BYTES;
        r = onnx_save_front_buf(g, params, spec->head, front, external ? &ext : NULL, doc, &buf, &len, err,
                                sizeof(err));
        if (r == 0 && !external && len > ONNX_MAX_BYTES) {
                free(buf);
                buf = NULL;
                external = true;
                r = onnx_save_front_buf(g, params, spec->head, front, &ext, doc, &buf, &len, err, sizeof(err));
        }
        if (r == 0 && len > ONNX_MAX_BYTES) {
                snprintf(err, sizeof(err), "%zu bytes even with the tables' rows in external data (the raw ids' map "
                         "is in the file): serve the tables from outside (--max-inline-rows N)", len);
                r = -EINVAL;
        }
        if (r < 0) {
                export_say(msg, "export: job %s's model cannot be written as ONNX: %s", cfg->name, err);
                r = r == -ENOMEM ? 1 : CONFIG_EX_CONFIG;
                goto out;
        }
        if (since) {
                /* the changed rows first, then what a whole export of global_step would hold but its tables
                 * (their manifest, model.onnx), and delta.json last: it says the delta is whole */
                if ((r = make_dir(out, msg)) == 0 &&
                    (r = export_delta_tables(cfg, &tables, rows_a, since, gstep, out, &delta, msg)) == 0 &&
                    (r = export_tables_write(cfg, &tables, out, gs ? gs : "?", false, msg)) == 0 &&
                    (ext.n == 0 || (r = write_data(out, &ext, msg)) == 0) && (r = write_out(out, buf, len, &written, msg)) == 0 &&
                    (r = export_delta_commit(out, cfg->name, since, gstep, delta, ext.n ? ext.location : NULL, msg)) == 0) {
                        export_tables_tidy(cfg, &tables, out, ext.n ? NULL : ext.location, true, msg);
                        for (size_t t = 0; t < json_array_size(delta); t++) {
                                json_t *dt = json_array_get(delta, t);
                                res->changed += (uint64_t)json_integer_value(json_object_get(dt, "changed"));
                                res->gone += (uint64_t)json_integer_value(json_object_get(dt, "tombstones"));
                        }
                }
                goto out;
        }
        /* the tables served from outside first: model.onnx, renamed last, says the export is whole */
        if ((r = make_dir(out, msg)) == 0 && (r = export_tables_write(cfg, &tables, out, gs ? gs : "?", true, msg)) == 0 &&
            (ext.n == 0 || (r = write_data(out, &ext, msg)) == 0) && (r = write_out(out, buf, len, &written, msg)) == 0) {
                export_tables_tidy(cfg, &tables, out, ext.n ? NULL : ext.location, false, msg);
        }
out:
        if (r == 0) {
                res->step = gstep;
                snprintf(res->global_step, sizeof(res->global_step), "%s", gs ? gs : "?");
                res->ck_path = ck_path, ck_path = NULL;
                res->written = written, written = NULL;
                res->bytes = len;
        }
        json_decref(delta);
        for (uint32_t e = 0; e < MODEL_MAX_EMBEDDINGS; e++) {
                ps_sparse_rows_clear(&rows_a[e]);
                ps_sparse_rows_clear(&rows_b[e]);
        }
        free(ext.pieces);
        export_tables_clear(&tables);
        free(buf);
        free(written);
        free(params);
        free(ck_path);
        ckpt_free(ck);
        free(rec.rows);
        graph_free(own);
        return r;
}
