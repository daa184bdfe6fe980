/* A job's checkpoints, files and rows: see chief_ckpt.h. */
#include "chief_ckpt.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chief_chain.h"
#include "ckpt.h"
#include "log.h"
#include "optim.h"
#include "sparse_table.h"
#include "util.h"

#define FORMAT "psfleet.checkpoint.v1"

struct chief_ckpt {
        struct chief_db *db;
        char *dir, *job;
        const struct job_layout *L;
        const struct model_spec *model;
        enum sparse_optimizer sparse_optimizer;
        uint64_t fingerprint;
        uint32_t keep, keep_corrupt;
        pthread_mutex_t mu;
};

int chief_ckpt_new(struct chief_db *db, const struct chief_ckpt_config *cfg, struct chief_ckpt **ret, char *err,
                   size_t errlen) {
        int r = mkdir_p(cfg->dir, 0750);
        if (r < 0)
                return errf(err, errlen, r, "cannot create the checkpoint directory \"%s\": %s", cfg->dir, strerror(-r));
        char *abs = realpath(cfg->dir, NULL);
        if (!abs)
                return errf(err, errlen, -errno, "cannot resolve \"%s\": %s", cfg->dir, strerror(errno));
        struct chief_ckpt *s = calloc(1, sizeof(*s));
        char *job = strdup(cfg->job ? cfg->job : "");
        if (!s || !job) {
                free(s);
                free(job);
                free(abs);
                return errf(err, errlen, -ENOMEM, "out of memory");
        }
        *s = (struct chief_ckpt){.db = db, .dir = abs, .job = job, .L = cfg->L, .model = cfg->model,
                                 .sparse_optimizer = cfg->sparse_optimizer, .fingerprint = cfg->fingerprint,
                                 .keep = cfg->keep ? cfg->keep : 1, .keep_corrupt = cfg->keep_corrupt};
        pthread_mutex_init(&s->mu, NULL);
        *ret = s;
        return 0;
}

struct chief_ckpt *chief_ckpt_free(struct chief_ckpt *s) {
        if (!s)
                return NULL;
        pthread_mutex_destroy(&s->mu);
        free(s->dir);
        free(s->job);
        free(s);
        return NULL;
}

const char *chief_ckpt_dir(const struct chief_ckpt *s) {
        return s->dir;
}

char *chief_ckpt_path(const struct chief_ckpt *s, uint64_t global_step) {
        return strdup_printf("%s/ckpt-%010" PRIu64 ".safetensors", s->dir, global_step);
}

/* "ckpt-<digits>.safetensors" -> its step; false for any other name. */
static bool parse_name(const char *name, uint64_t *step) {
        if (strncmp(name, "ckpt-", 5) != 0)
                return false;   /* before reading past the prefix: a shorter name ends inside it */
        const char *p = name + 5;
        size_t n = strspn(p, "0123456789");
        char digits[24];
        if (n == 0 || n >= sizeof(digits) || strcmp(p + n, ".safetensors") != 0)
                return false;
        memcpy(digits, p, n);
        digits[n] = 0;
        return parse_u64(digits, 0, UINT64_MAX, step) == 0;
}

static const char *base_name(const char *path) {
        const char *slash = strrchr(path, '/');
        return slash ? slash + 1 : path;
}

static bool exists(const char *path) {
        struct stat st;
        return stat(path, &st) == 0;
}

struct corrupt_file {
        char *path;
        struct timespec mtime;
};

static int newest_first(const void *a, const void *b) {
        const struct corrupt_file *x = a, *y = b;
        if (x->mtime.tv_sec != y->mtime.tv_sec)
                return x->mtime.tv_sec < y->mtime.tv_sec ? 1 : -1;
        if (x->mtime.tv_nsec != y->mtime.tv_nsec)
                return x->mtime.tv_nsec < y->mtime.tv_nsec ? 1 : -1;
        return strcmp(y->path, x->path);
}

/* Removes the ".corrupt" files beyond the newest keep_corrupt (s->mu held): they are kept for a
 * post-mortem, not forever. Returns how many were removed. */
static int prune_corrupt_locked(struct chief_ckpt *s) {
        DIR *d = opendir(s->dir);
        struct corrupt_file *f = NULL;
        size_t n = 0, cap = 0;
        int removed = 0;
        for (struct dirent *e; d && (e = readdir(d));) {
                size_t len = strlen(e->d_name);
                struct stat st;
                if (len <= 8 || strcmp(e->d_name + len - 8, ".corrupt") != 0)
                        continue;
                char *path = strdup_printf("%s/%s", s->dir, e->d_name);
                if (!path || stat(path, &st) < 0 || grow_array((void **)&f, &cap, n + 1, sizeof(*f), 8) < 0) {
                        free(path);
                        continue;
                }
                f[n++] = (struct corrupt_file){path, st.st_mtim};
        }
        if (d)
                closedir(d);
        if (n)
                qsort(f, n, sizeof(*f), newest_first);
        for (size_t i = 0; i < n; i++) {
                if (i >= s->keep_corrupt) {
                        if (unlink(f[i].path) == 0) {
                                log_info("Removed \"%s\": keeping the newest %u corrupt checkpoint file(s) "
                                         "(supervisor.keep_corrupt)", f[i].path, s->keep_corrupt);
                                removed++;
                        } else if (errno != ENOENT) {
                                log_warning_errno(errno, "Cannot remove \"%s\"", f[i].path);
                        }
                }
                free(f[i].path);
        }
        free(f);
        return removed;
}

/* ---- saving ---- */

int chief_ckpt_save(struct chief_ckpt *s, const float *params, float *const *slots, uint64_t global_step,
                    const struct chief_db_checkpoint *stats, struct chief_db_checkpoint *ret, char *err,
                    size_t errlen) {
        return chief_ckpt_save_tables(s, params, slots, NULL, global_step, stats, ret, err, errlen);
}

/* A checkpoint being written: the dense values whole (the caller's, read at commit), each table
 * streamed page by page into the writer's spools. */
struct chief_ckpt_writing {
        struct chief_ckpt *s;
        struct ckpt_writer *w;
        char *path;
        uint64_t global_step, parent_step;
        bool incremental, dense_slots;
        uint32_t n_tables;
        size_t ix[MODEL_MAX_EMBEDDINGS][2 + SPARSE_MAX_SLOTS];   /* ids, values, slots */
        size_t ix_evicted[MODEL_MAX_EMBEDDINGS];                  /* incremental only */
};

void chief_ckpt_abort(struct chief_ckpt_writing *w) {
        if (!w)
                return;
        ckpt_writer_free(w->w);
        free(w->path);
        free(w);
}

/* Adds the writer's tensor name (copied) of dtype; streamed when idx is non-NULL, else whole. */
static int add_named(struct chief_ckpt_writing *w, const struct ckpt_tensor *whole, size_t *idx, enum ckpt_dtype dt,
                     unsigned ndims, uint32_t cols, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int add_named(struct chief_ckpt_writing *w, const struct ckpt_tensor *whole, size_t *idx, enum ckpt_dtype dt,
                     unsigned ndims, uint32_t cols, const char *fmt, ...) {
        char name[320];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(name, sizeof(name), fmt, ap);
        va_end(ap);
        if (!idx) {
                struct ckpt_tensor t = *whole;
                t.name = name;
                return ckpt_writer_add(w->w, &t);
        }
        return ckpt_writer_stream(w->w, name, dt, ndims, cols, idx);
}

int chief_ckpt_begin(struct chief_ckpt *s, const float *params, float *const *slots, bool with_tables,
                     uint64_t global_step, const struct chief_db_checkpoint *parent, struct chief_ckpt_writing **ret,
                     char *err, size_t errlen) {
        const struct job_layout *L = s->L;
        unsigned ns = slots ? L->n_slots : 0;
        struct chief_ckpt_writing *w = calloc(1, sizeof(*w));
        int r = w ? 0 : -ENOMEM;
        if (w) {
                *w = (struct chief_ckpt_writing){.s = s, .global_step = global_step, .incremental = parent != NULL,
                                                 .parent_step = parent ? parent->global_step : 0, .dense_slots = ns > 0,
                                                 .n_tables = with_tables && s->model ? s->model->n_embeddings : 0};
                w->path = chief_ckpt_path(s, global_step);
                r = w->path ? ckpt_writer_new(w->path, &w->w) : -ENOMEM;
        }
        for (uint32_t v = 0; r >= 0 && v < L->n_vars; v++)
                for (unsigned sl = 0; r >= 0 && sl <= ns; sl++) {
                        const struct job_var *jv = &L->vars[v];
                        const struct ckpt_tensor t = {NULL, jv->rows, jv->cols, (sl ? slots[sl - 1] : params) + jv->offset,
                                                      CKPT_F32, 2};
                        r = sl ? add_named(w, &t, NULL, 0, 0, 0, "%s/%s", jv->name, optim_slot_name(L->optimizer, sl - 1))
                               : add_named(w, &t, NULL, 0, 0, 0, "%s", jv->name);
                }
        unsigned nss = sparse_optimizer_n_slots(s->sparse_optimizer);
        for (uint32_t e = 0; r >= 0 && w && e < w->n_tables; e++) {
                const char *tn = s->model->emb[e].name;
                uint32_t dim = s->model->emb[e].dim;
                r = add_named(w, NULL, &w->ix[e][0], CKPT_U64, 1, 1, "emb/%s/ids", tn);
                if (r >= 0)
                        r = add_named(w, NULL, &w->ix[e][1], CKPT_F32, 2, dim, "emb/%s", tn);
                for (unsigned sl = 0; r >= 0 && sl < nss; sl++)
                        r = add_named(w, NULL, &w->ix[e][2 + sl], CKPT_F32, 2, dim, "emb/%s/%s", tn,
                                      sparse_optimizer_slot_name(s->sparse_optimizer, sl));
                if (r >= 0 && w->incremental)
                        r = add_named(w, NULL, &w->ix_evicted[e], CKPT_U64, 1, 1, "emb/%s/evicted", tn);
        }
        if (r < 0) {
                chief_ckpt_abort(w);
                return errf(err, errlen, r, "cannot start the checkpoint of global_step %" PRIu64 " in \"%s\": %s",
                            global_step, s->dir, strerror(-r));
        }
        *ret = w;
        return 0;
}

int chief_ckpt_put_rows(struct chief_ckpt_writing *w, uint32_t e, const struct ps_sparse_rows *page, char *err,
                        size_t errlen) {
        assert(e < w->n_tables);
        unsigned ns = sparse_optimizer_n_slots(w->s->sparse_optimizer);
        int r = ckpt_writer_append(w->w, w->ix[e][0], page->ids, page->n);
        if (r >= 0)
                r = ckpt_writer_append(w->w, w->ix[e][1], page->values, page->n);
        for (unsigned sl = 0; r >= 0 && sl < ns; sl++)
                r = ckpt_writer_append(w->w, w->ix[e][2 + sl], page->slots[sl], page->n);
        if (r < 0)
                return errf(err, errlen, r, "cannot spool table %s of \"%s\": %s", w->s->model->emb[e].name, w->path,
                            strerror(-r));
        return 0;
}

int chief_ckpt_put_evicted(struct chief_ckpt_writing *w, uint32_t e, const uint64_t *ids, size_t n, char *err,
                           size_t errlen) {
        assert(e < w->n_tables && w->incremental);
        int r = ckpt_writer_append(w->w, w->ix_evicted[e], ids, n);
        if (r < 0)
                return errf(err, errlen, r, "cannot spool the evicted ids of table %s of \"%s\": %s",
                            w->s->model->emb[e].name, w->path, strerror(-r));
        return 0;
}

int chief_ckpt_commit(struct chief_ckpt_writing *w, const struct chief_db_checkpoint *stats,
                      struct chief_db_checkpoint *ret, char *err, size_t errlen) {
        struct chief_ckpt *s = w->s;
        const struct job_layout *L = s->L;
        uint64_t global_step = w->global_step;
        const char *path = w->path;
        struct chief_db_checkpoint *removed = NULL;
        size_t n_removed = 0;
        char step[24], fp[24], tus[24], parent[24], slot_list[64] = "", sparse_slots[64] = "";
        uint64_t time_us = now_us();
        snprintf(step, sizeof(step), "%" PRIu64, global_step);
        snprintf(fp, sizeof(fp), "%016" PRIx64, s->fingerprint);
        snprintf(tus, sizeof(tus), "%" PRIu64, time_us);
        snprintf(parent, sizeof(parent), "%" PRIu64, w->parent_step);
        for (unsigned sl = 0; w->dense_slots && sl < L->n_slots; sl++)
                snprintf(slot_list + strlen(slot_list), sizeof(slot_list) - strlen(slot_list), "%s%s", sl ? "," : "",
                         optim_slot_name(L->optimizer, sl));
        for (unsigned sl = 0; sl < sparse_optimizer_n_slots(s->sparse_optimizer); sl++)
                snprintf(sparse_slots + strlen(sparse_slots), sizeof(sparse_slots) - strlen(sparse_slots), "%s%s",
                         sl ? "," : "", sparse_optimizer_slot_name(s->sparse_optimizer, sl));
        struct ckpt_kv meta[16] = {
                {"format", FORMAT},     {"job", s->job},
                {"global_step", step},  {"fingerprint", fp},
                {"optimizer", optim_name(L->optimizer)}, {"slots", slot_list},
                {"time_us", tus},       {"writer", "psfleet chiefd " PSFLEET_VERSION},
                {"checkpoint", w->incremental ? "incremental" : "full"},
        };
        size_t n_meta = 9;
        if (w->incremental)
                meta[n_meta++] = (struct ckpt_kv){"parent_step", parent};
        if (w->n_tables) {   /* with embedding tables only */
                meta[n_meta++] = (struct ckpt_kv){"sparse_optimizer", sparse_optimizer_name(s->sparse_optimizer)};
                meta[n_meta++] = (struct ckpt_kv){"sparse_slots", sparse_slots};
        }

        pthread_mutex_lock(&s->mu);
        /* A row must always describe the file at its path: forget an older checkpoint of this step
         * before its file is replaced. */
        int r = chief_db_delete_checkpoint(s->db, global_step, NULL);
        if (r < 0 && r != -ENOENT) {
                errf(err, errlen, r, "cannot update the record of global_step %" PRIu64 ": %s", global_step,
                     strerror(-r));
                goto unlock;
        }
        struct ckpt_written wr;
        r = ckpt_writer_finish(w->w, meta, n_meta, &wr, err, errlen);
        if (r < 0)
                goto unlock;
        ckpt_test_delay();   /* test hook: the file is in place, its row not yet */
        struct chief_db_checkpoint row = *stats;
        row.global_step = global_step;
        row.time_us = time_us;
        row.bytes = wr.bytes;
        row.incremental = w->incremental;
        row.parent_step = w->parent_step;
        snprintf(row.path, sizeof(row.path), "%s", path);
        ckpt_format_checksum(wr.crc32c, row.checksum, sizeof(row.checksum));
        r = chief_db_add_checkpoint(s->db, &row, s->keep, &removed, &n_removed);
        if (r < 0) {
                unlink(path);
                errf(err, errlen, r, "cannot record \"%s\" in the database: %s", path, strerror(-r));
                goto unlock;
        }
        for (size_t i = 0; i < n_removed; i++) {
                if (strcmp(removed[i].path, path) == 0)
                        continue;
                if (unlink(removed[i].path) < 0 && errno != ENOENT)
                        log_warning_errno(errno, "Cannot remove the old checkpoint \"%s\" (no longer recorded)",
                                          removed[i].path);
                else
                        log_info("Removed the checkpoint of global_step %" PRIu64 " (\"%s\"): keeping the last %u",
                                 removed[i].global_step, removed[i].path, s->keep);
        }
        if (ret)
                *ret = row;
unlock:
        pthread_mutex_unlock(&s->mu);
        free(removed);
        chief_ckpt_abort(w);
        return r;
}

int chief_ckpt_save_tables(struct chief_ckpt *s, const float *params, float *const *slots,
                           const struct ps_sparse_rows *tables, uint64_t global_step,
                           const struct chief_db_checkpoint *stats, struct chief_db_checkpoint *ret, char *err,
                           size_t errlen) {
        struct chief_ckpt_writing *w;
        int r = chief_ckpt_begin(s, params, slots, tables != NULL, global_step, NULL, &w, err, errlen);
        if (r < 0)
                return r;
        for (uint32_t e = 0; e < w->n_tables && r >= 0; e++)
                r = chief_ckpt_put_rows(w, e, &tables[e], err, errlen);
        if (r < 0) {
                chief_ckpt_abort(w);
                return r;
        }
        return chief_ckpt_commit(w, stats, ret, err, errlen);
}

/* ---- loading ---- */

/* Whether name is a tensor of one of the model's tables: "emb/<table>", "emb/<table>/ids" or
 * "emb/<table>/<slot>" of training.sparse_optimizer. */
static bool table_tensor(const struct chief_ckpt *s, const char *name) {
        if (!s->model || strncmp(name, "emb/", 4) != 0)
                return false;
        for (uint32_t e = 0; e < s->model->n_embeddings; e++) {
                const char *tn = s->model->emb[e].name, *rest = name + 4;
                size_t len = strlen(tn);
                if (strncmp(rest, tn, len) != 0)
                        continue;
                rest += len;
                if (!*rest || !strcmp(rest, "/ids") || !strcmp(rest, "/evicted"))
                        return true;
                for (unsigned sl = 0; *rest == '/' && sl < sparse_optimizer_n_slots(s->sparse_optimizer); sl++)
                        if (!strcmp(rest + 1, sparse_optimizer_slot_name(s->sparse_optimizer, sl)))
                                return true;
        }
        return false;
}

/* Checks table e's tensors in ck (ids U64 [n], each once; values and each slot F32 [n, dim]) and, with
 * out, copies them there (malloc'd). -EINVAL naming the tensor (another model), -EBADMSG (an id twice),
 * or -ENOMEM. */
static int load_table(const struct chief_ckpt *s, const struct ckpt *ck, uint32_t e, struct ps_sparse_rows *out,
                      char *err, size_t errlen) {
        const struct embedding_spec *es = &s->model->emb[e];
        unsigned ns = sparse_optimizer_n_slots(s->sparse_optimizer);
        enum ckpt_dtype dt;
        unsigned nd;
        uint64_t shape[CKPT_MAX_DIMS];
        const void *data[1 + 1 + SPARSE_MAX_SLOTS];
        char name[80];
        snprintf(name, sizeof(name), "emb/%s/ids", es->name);
        if (ckpt_view(ck, name, &dt, &nd, shape, &data[0]) < 0)
                return errf(err, errlen, -EINVAL, "no tensor \"%s\": the model has embedding table \"%s\"", name,
                            es->name);
        if (dt != CKPT_U64 || nd != 1)
                return errf(err, errlen, -EINVAL, "tensor \"%s\" is not U64 of one dimension", name);
        uint64_t n = shape[0];
        for (unsigned k = 1; k <= 1 + ns; k++) {
                if (k == 1)
                        snprintf(name, sizeof(name), "emb/%s", es->name);
                else
                        snprintf(name, sizeof(name), "emb/%s/%s", es->name,
                                 sparse_optimizer_slot_name(s->sparse_optimizer, k - 2));
                if (ckpt_view(ck, name, &dt, &nd, shape, &data[k]) < 0)
                        return errf(err, errlen, -EINVAL, "no tensor \"%s\"%s", name,
                                    k == 1 ? "" : ": training.sparse_optimizer keeps that slot");
                if (dt != CKPT_F32 || nd != 2 || shape[0] != n || shape[1] != es->dim)
                        return errf(err, errlen, -EINVAL, "tensor \"%s\" is not F32 [%" PRIu64 ", %u] (its table's "
                                    "ids and dim)", name, n, es->dim);
        }
        /* each id once: psfleet never writes one twice, so the file is corrupt (the previous checkpoint is
         * tried), and psd would refuse to import it */
        uint64_t dup;
        int r = u64_find_repeat(data[0], n, &dup);
        if (r < 0)
                return errf(err, errlen, r, "out of memory for table %s (%" PRIu64 " rows)", es->name, n);
        if (r)
                return errf(err, errlen, -EBADMSG, "tensor \"emb/%s/ids\" holds id %" PRIu64 " twice", es->name, dup);
        if (!out)
                return 0;
        *out = (struct ps_sparse_rows){.n = n, .dim = es->dim, .n_slots = ns};
        out->ids = malloc(n * sizeof(uint64_t) + 1);
        out->values = malloc(n * es->dim * sizeof(float) + 1);
        for (unsigned sl = 0; sl < ns; sl++)
                out->slots[sl] = malloc(n * es->dim * sizeof(float) + 1);
        bool ok = out->ids && out->values;
        for (unsigned sl = 0; sl < ns; sl++)
                ok = ok && out->slots[sl];
        if (!ok) {
                ps_sparse_rows_clear(out);
                return errf(err, errlen, -ENOMEM, "out of memory for table %s (%" PRIu64 " rows)", es->name, n);
        }
        memcpy(out->ids, data[0], n * sizeof(uint64_t));
        for (unsigned k = 1; k <= 1 + ns; k++)
                memcpy(k == 1 ? out->values : out->slots[k - 2], data[k], n * es->dim * sizeof(float));
        return 0;
}

/* An incremental checkpoint's "emb/<name>/evicted" of table e (U64 [m]) into out->ids, out->n. */
static int load_evicted(const struct chief_ckpt *s, const struct ckpt *ck, uint32_t e, struct ps_sparse_rows *out,
                        char *err, size_t errlen) {
        enum ckpt_dtype dt;
        unsigned nd;
        uint64_t shape[CKPT_MAX_DIMS];
        const void *data;
        char name[80];
        snprintf(name, sizeof(name), "emb/%s/evicted", s->model->emb[e].name);
        if (ckpt_view(ck, name, &dt, &nd, shape, &data) < 0 || dt != CKPT_U64 || nd != 1)
                return errf(err, errlen, -EBADMSG, "an incremental checkpoint without a U64 tensor \"%s\"", name);
        if (!out)
                return 0;
        out->ids = malloc(shape[0] * sizeof(uint64_t) + 1);
        if (!out->ids)
                return errf(err, errlen, -ENOMEM, "out of memory");
        memcpy(out->ids, data, shape[0] * sizeof(uint64_t));
        out->n = shape[0];
        return 0;
}

/* Reads and checks one checkpoint file against its row. With evicted (an incremental row), each
 * table's evicted ids go to evicted[e].ids. */
static int load_locked(struct chief_ckpt *s, const struct chief_db_checkpoint *row, float *params, float *const *slots,
                       bool *slots_loaded, struct ps_sparse_rows *tables, struct ps_sparse_rows *evicted, char *err,
                       size_t errlen) {
        const struct job_layout *L = s->L;
        uint64_t max = (uint64_t)L->n_params * sizeof(float) * (1 + OPTIM_MAX_SLOTS) + (16u << 20);
        if (s->model && s->model->n_embeddings)
                max += 1ull << 36;   /* the tables' rows: as many as the job touched */
        struct ckpt *ck = NULL;
        struct ps_sparse_rows tmp_tables[MODEL_MAX_EMBEDDINGS] = {0};   /* the caller's only once all is read */
        struct ps_sparse_rows tmp_evicted[MODEL_MAX_EMBEDDINGS] = {0};
        char e[512], sum[32];
        /* read into a scratch block first: a file refused half-way must leave the caller's values as
         * they were (the previous checkpoint's, or the initializers') */
        float *tmp = malloc(L->n_params * (1 + L->n_slots) * sizeof(float) + sizeof(float)), *tmp_slots[OPTIM_MAX_SLOTS];
        if (!tmp)
                return errf(err, errlen, -ENOMEM, "out of memory");
        for (unsigned sl = 0; sl < L->n_slots; sl++)
                tmp_slots[sl] = tmp + (1 + sl) * L->n_params;
        int r = ckpt_read(row->path, max, &ck, e, sizeof(e));
        if (r == -ENOENT)
                r = errf(err, errlen, r, "the file is missing");
        else if (r == -EBADMSG || r == -EFBIG)
                r = errf(err, errlen, -EBADMSG, "%s", e);
        else if (r < 0)
                r = errf(err, errlen, r, "%s", e);
        if (r < 0)
                goto out;
        if (ckpt_bytes(ck) != row->bytes) {
                r = errf(err, errlen, -EBADMSG, "the file is %" PRIu64 " bytes, %" PRIu64 " were recorded", ckpt_bytes(ck),
                         row->bytes);
                goto out;
        }
        ckpt_format_checksum(ckpt_crc32c(ck), sum, sizeof(sum));
        if (strcmp(sum, row->checksum) != 0) {
                r = errf(err, errlen, -EBADMSG, "checksum %s, %s was recorded", sum, row->checksum);
                goto out;
        }
        const char *gs = ckpt_meta(ck, "global_step");
        uint64_t step;
        if (!gs || parse_u64(gs, 0, UINT64_MAX, &step) < 0 || step != row->global_step) {
                r = errf(err, errlen, -EBADMSG, "its metadata says global_step \"%s\", %" PRIu64 " was recorded",
                         gs ? gs : "(none)", row->global_step);
                goto out;
        }
        /* an incremental one must be the link its row says (files older than incremental checkpoints
         * have no "checkpoint": full) */
        const char *kind = ckpt_meta(ck, "checkpoint"), *ps = ckpt_meta(ck, "parent_step");
        bool inc = kind && strcmp(kind, "incremental") == 0;
        uint64_t parent = 0;
        if (inc != row->incremental || (inc && (!ps || parse_u64(ps, 0, UINT64_MAX, &parent) < 0 ||
                                                 parent != row->parent_step))) {
                r = errf(err, errlen, -EBADMSG, "its metadata says checkpoint \"%s\", parent_step \"%s\"; a%s checkpoint%s "
                         "was recorded", kind ? kind : "full", ps ? ps : "(none)",
                         row->incremental ? "n incremental" : " full", row->incremental ? " on another step" : "");
                goto out;
        }
        /* Every tensor must belong to the model: "<var>" or "<var>/<slot>". */
        for (size_t i = 0; i < ckpt_n_tensors(ck); i++) {
                char name[300];
                snprintf(name, sizeof(name), "%s", ckpt_tensor_name(ck, i));
                char *sl = strrchr(name, '/');
                if (job_layout_find(L, name) >= 0 || table_tensor(s, name))
                        continue;
                if (sl) {
                        *sl = 0;
                        if (job_layout_find(L, name) >= 0)
                                continue;
                }
                r = errf(err, errlen, -EINVAL, "tensor \"%s\" is not a variable of this job's model",
                         ckpt_tensor_name(ck, i));
                goto out;
        }
        for (uint32_t v = 0; v < L->n_vars; v++) {
                const struct job_var *jv = &L->vars[v];
                r = ckpt_get(ck, jv->name, jv->rows, jv->cols, tmp + jv->offset, e, sizeof(e));
                if (r < 0) {
                        r = errf(err, errlen, -EINVAL, "%s", e);
                        goto out;
                }
        }
        uint32_t n_tables = s->model ? s->model->n_embeddings : 0;
        for (uint32_t t = 0; t < n_tables; t++)
                if ((r = load_table(s, ck, t, tables ? &tmp_tables[t] : NULL, e, sizeof(e))) < 0 ||
                    (inc && (r = load_evicted(s, ck, t, tables && evicted ? &tmp_evicted[t] : NULL, e, sizeof(e))) < 0)) {
                        errf(err, errlen, r, "%s", e);
                        goto out;
                }
        const char *opt = ckpt_meta(ck, "optimizer");
        bool same = opt && strcmp(opt, optim_name(L->optimizer)) == 0, with_slots = false;
        if (same && slots && L->n_slots) {
                for (uint32_t v = 0; v < L->n_vars; v++)
                        for (unsigned sl = 0; sl < L->n_slots; sl++) {
                                const struct job_var *jv = &L->vars[v];
                                char name[300];
                                snprintf(name, sizeof(name), "%s/%s", jv->name, optim_slot_name(L->optimizer, sl));
                                r = ckpt_get(ck, name, jv->rows, jv->cols, tmp_slots[sl] + jv->offset, e, sizeof(e));
                                if (r < 0) {
                                        r = errf(err, errlen, -EINVAL, "optimizer %s: %s", opt, e);
                                        goto out;
                                }
                        }
                with_slots = true;
        } else if (!same && L->n_slots) {
                log_notice("Checkpoint \"%s\" was written with optimizer %s, the job uses %s: its variables are "
                           "restored, the optimizer's slots start afresh", row->path, opt ? opt : "(unknown)",
                           optim_name(L->optimizer));
        }
        const char *fp = ckpt_meta(ck, "fingerprint");
        char ours[24];
        snprintf(ours, sizeof(ours), "%016" PRIx64, s->fingerprint);
        if (fp && strcmp(fp, ours) != 0)
                log_info("Checkpoint \"%s\" was written by a job with fingerprint %s (this one: %s): the cluster or "
                         "training settings changed; its variables fit the model, so it is used",
                         row->path, fp, ours);
        memcpy(params, tmp, L->n_params * sizeof(float));
        for (unsigned sl = 0; with_slots && sl < L->n_slots; sl++)
                memcpy(slots[sl], tmp_slots[sl], L->n_params * sizeof(float));
        *slots_loaded = with_slots;
        for (uint32_t t = 0; tables && t < n_tables; t++) {
                tables[t] = tmp_tables[t];
                tmp_tables[t] = (struct ps_sparse_rows){0};
                if (evicted) {
                        evicted[t] = tmp_evicted[t];
                        tmp_evicted[t] = (struct ps_sparse_rows){0};
                }
        }
        r = 0;
out:
        for (uint32_t t = 0; t < MODEL_MAX_EMBEDDINGS; t++) {
                ps_sparse_rows_clear(&tmp_tables[t]);
                ps_sparse_rows_clear(&tmp_evicted[t]);
        }
        free(tmp);
        ckpt_free(ck);
        return r;
}

int chief_ckpt_load(struct chief_ckpt *s, const struct chief_db_checkpoint *row, float *params, float *const *slots,
                    bool *slots_loaded, char *err, size_t errlen) {
        pthread_mutex_lock(&s->mu);
        int r = load_locked(s, row, params, slots, slots_loaded, NULL, NULL, err, errlen);
        pthread_mutex_unlock(&s->mu);
        return r;
}

int chief_ckpt_load_latest(struct chief_ckpt *s, float *params, float *const *slots, bool *slots_loaded,
                           struct chief_db_checkpoint *ret, char *err, size_t errlen) {
        return chief_ckpt_load_latest_tables(s, params, slots, slots_loaded, NULL, ret, err, errlen);
}

/* ---- chains of incremental checkpoints (what a chain is: chief_chain.c) ---- */

/* Forgets row (its record, durably), moving its file aside to "<path>.corrupt" when aside, else
 * removing it; logs why. */
static void forget_locked(struct chief_ckpt *s, const struct chief_db_checkpoint *row, bool aside, const char *what,
                          const char *why, const char *next) {
        char *moved = NULL;
        if (aside && (moved = strdup_printf("%s.corrupt", row->path)) && rename(row->path, moved) < 0) {
                free(moved);
                moved = NULL;
        }
        if (!aside)
                unlink(row->path);
        int d = chief_db_delete_checkpoint(s->db, row->global_step, NULL);
        log_warning("Checkpoint \"%s\" (global_step %" PRIu64 ") is %s: %s; %s%s%s; %s", row->path, row->global_step,
                    what, why, d < 0 ? "could not forget it" : "forgot it", moved ? ", moved the file aside to " : "",
                    moved ? moved : (aside ? "" : ", removed the file"), next);
        free(moved);
        if (aside)
                prune_corrupt_locked(s);
}


/* Loads row i's chain into params, slots and tables: its full checkpoint, then each increment in order.
 * With repair (a restore), a link missing or corrupt stops there: the values are those of the link
 * before it (*used, which is then not i), the bad link is set aside and forgotten and so are the links
 * after it. Without (a reader such as psfleet export), any bad link is the error, named in err, and
 * nothing is changed. Returns 0; or the full checkpoint's error (nothing loaded). */
static int load_chain_locked(struct chief_ckpt *s, const struct chief_db_checkpoint *rows, bool *gone,
                             const size_t *chain, size_t k, bool repair, float *params, float *const *slots,
                             bool *slots_loaded, struct ps_sparse_rows *tables, size_t *used, char *err,
                             size_t errlen) {
        const struct job_layout *L = s->L;
        uint32_t n_tables = s->model ? s->model->n_embeddings : 0;
        int r = load_locked(s, &rows[chain[0]], params, slots, slots_loaded, tables, NULL, err, errlen);
        if (r < 0 && !repair) {
                char e[600];
                snprintf(e, sizeof(e), "%s", err);
                errf(err, errlen, r, "checkpoint \"%s\" (global_step %" PRIu64 "%s): %s", rows[chain[0]].path,
                     rows[chain[0]].global_step, k > 1 ? ", the full one under the chain" : "", e);
        }
        if (r < 0 || k == 1) {
                *used = chain[0];
                return r;
        }
        float *p2 = malloc(L->n_params * (1 + L->n_slots) * sizeof(float) + sizeof(float)), *s2[OPTIM_MAX_SLOTS];
        if (!p2)
                return errf(err, errlen, -ENOMEM, "out of memory");
        for (unsigned sl = 0; sl < L->n_slots; sl++)
                s2[sl] = p2 + (1 + sl) * L->n_params;
        size_t good = 0;
        for (size_t j = 1; j < k; j++) {
                const struct chief_db_checkpoint *row = &rows[chain[j]];
                struct ps_sparse_rows inc[MODEL_MAX_EMBEDDINGS] = {0}, ev[MODEL_MAX_EMBEDDINGS] = {0};
                bool sl2 = false;
                char e[600];
                int l = load_locked(s, row, p2, slots ? s2 : NULL, &sl2, tables ? inc : NULL, tables ? ev : NULL, e,
                                    sizeof(e));
                for (uint32_t t = 0; l >= 0 && tables && t < n_tables; t++)
                        if ((l = chief_chain_apply(&tables[t], &inc[t], &ev[t])) < 0)
                                errf(e, sizeof(e), l, "applying it to table %s: %s", s->model->emb[t].name, strerror(-l));
                for (uint32_t t = 0; t < MODEL_MAX_EMBEDDINGS; t++) {
                        ps_sparse_rows_clear(&inc[t]);
                        ps_sparse_rows_clear(&ev[t]);
                }
                if (l == -EINVAL || (l < 0 && !repair)) {
                        free(p2);
                        if (l == -EINVAL)
                                return errf(err, errlen, l, "%s", e);
                        return errf(err, errlen, l, "checkpoint \"%s\" (global_step %" PRIu64 ", a link of the chain "
                                    "on global_step %" PRIu64 "): %s", row->path, row->global_step,
                                    rows[chain[0]].global_step, e);
                }
                if (l < 0) {
                        /* a broken link: the chain restores to the link before it */
                        char next[200];
                        snprintf(next, sizeof(next), "the chain restores to global_step %" PRIu64,
                                 rows[chain[good]].global_step);
                        bool corrupt = l == -ENOENT || l == -EBADMSG;
                        if (corrupt) {
                                forget_locked(s, row, l == -EBADMSG, l == -ENOENT ? "missing" : "corrupt", e, next);
                                gone[chain[j]] = true;
                        } else {
                                log_warning("Cannot read checkpoint \"%s\" (global_step %" PRIu64 "): %s; %s", row->path,
                                            row->global_step, e, next);
                        }
                        for (size_t q = j + 1; corrupt && q < k; q++) {
                                char why[160];
                                snprintf(why, sizeof(why), "it is chained to global_step %" PRIu64 ", which is lost",
                                         row->global_step);
                                forget_locked(s, &rows[chain[q]], false, "unusable", why, next);
                                gone[chain[q]] = true;
                        }
                        break;
                }
                memcpy(params, p2, L->n_params * sizeof(float));
                for (unsigned sl = 0; slots && sl < L->n_slots; sl++)
                        memcpy(slots[sl], s2[sl], L->n_params * sizeof(float));
                *slots_loaded = *slots_loaded && sl2;
                good = j;
        }
        free(p2);
        *used = chain[good];
        return 0;
}

int chief_ckpt_load_latest_tables(struct chief_ckpt *s, float *params, float *const *slots, bool *slots_loaded,
                                  struct ps_sparse_rows *tables, struct chief_db_checkpoint *ret, char *err,
                                  size_t errlen) {
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0;
        int r = chief_db_list_checkpoints(s->db, &rows, &n);
        if (r < 0)
                return errf(err, errlen, r, "cannot list the checkpoints: %s", strerror(-r));
        bool *gone = calloc(n + 1, sizeof(*gone));
        size_t *chain = calloc(n + 1, sizeof(*chain));
        if (!gone || !chain) {
                free(rows);
                free(gone);
                free(chain);
                return errf(err, errlen, -ENOMEM, "out of memory");
        }
        /* the chain's values are built in scratch tables: the caller's only once one loads */
        struct ps_sparse_rows scratch[MODEL_MAX_EMBEDDINGS] = {0};
        pthread_mutex_lock(&s->mu);
        r = 0;
        for (size_t i = 0; i < n; i++) {
                if (gone[i])
                        continue;
                const char *next = i + 1 < n ? "trying the previous one" : "no older checkpoint is left";
                size_t k = 0, broken = i, used = i;
                char e[600];
                int c = chief_chain_of(rows, n, gone, i, chain, &k, &broken);
                if (c < 0) {
                        char why[200];
                        snprintf(why, sizeof(why), c == -ENOENT ? "it is incremental on global_step %" PRIu64 ", which is "
                                 "not recorded (the chain points nowhere)" : "its chain never reaches a full checkpoint",
                                 rows[broken].parent_step);
                        forget_locked(s, &rows[i], false, "unusable", why, next);
                        gone[i] = true;
                        continue;
                }
                int l = load_chain_locked(s, rows, gone, chain, k, true, params, slots, slots_loaded,
                                          tables ? scratch : NULL, &used, e, sizeof(e));
                if (l == 0) {
                        *ret = rows[used];
                        r = 1;
                        for (uint32_t t = 0; tables && t < MODEL_MAX_EMBEDDINGS; t++) {
                                tables[t] = scratch[t];
                                scratch[t] = (struct ps_sparse_rows){0};
                        }
                        break;
                }
                const struct chief_db_checkpoint *row = &rows[chain[0]];
                if (l == -EINVAL) {
                        r = errf(err, errlen, l,
                                 "checkpoint \"%s\" (global_step %" PRIu64 ") holds a different model: %s; to start "
                                 "this job afresh, remove its state (chief.db and the checkpoints)",
                                 row->path, row->global_step, e);
                        break;
                }
                if (l == -ENOENT || l == -EBADMSG) {
                        /* the full checkpoint under the chain: every increment on it is lost with it */
                        forget_locked(s, row, l == -EBADMSG, l == -ENOENT ? "missing" : "corrupt", e, next);
                        gone[chain[0]] = true;
                } else {
                        /* Not the file's fault (permissions, I/O, memory): leave it recorded. */
                        log_warning("Cannot read checkpoint \"%s\" (global_step %" PRIu64 "): %s; %s", row->path,
                                    row->global_step, e, next);
                        for (size_t q = 0; q < k; q++)
                                gone[chain[q]] = true;   /* not tried again in this pass */
                }
        }
        pthread_mutex_unlock(&s->mu);
        for (uint32_t t = 0; t < MODEL_MAX_EMBEDDINGS; t++)
                ps_sparse_rows_clear(&scratch[t]);
        free(rows);
        free(gone);
        free(chain);
        return r;
}

/* Resolves rows[i]'s chain and reads it, repairing nothing (chief_ckpt_read_chain). */
static int read_chain(struct chief_ckpt *s, const struct chief_db_checkpoint *rows, size_t n, size_t i,
                      float *params, struct ps_sparse_rows *tables, char *err, size_t errlen) {
        bool *gone = calloc(n + 1, sizeof(*gone));
        size_t *chain = calloc(n + 1, sizeof(*chain));
        struct ps_sparse_rows scratch[MODEL_MAX_EMBEDDINGS] = {0};
        size_t k = 0, broken = i, used = 0;   /* chief_chain_of names the broken link only on -ENOENT */
        bool slots_loaded = false;
        int r = 0;
        if (!gone || !chain)
                r = errf(err, errlen, -ENOMEM, "out of memory");
        else if ((r = chief_chain_of(rows, n, gone, i, chain, &k, &broken)) < 0)
                r = errf(err, errlen, r == -ENOENT ? -ENOENT : -EBADMSG,
                         r == -ENOENT ? "checkpoint \"%s\" (global_step %" PRIu64 ") is incremental on global_step "
                                        "%" PRIu64 ", which is not recorded (the chain points nowhere)"
                                      : "checkpoint \"%s\" (global_step %" PRIu64 "): its chain never reaches a "
                                        "full checkpoint%.0" PRIu64,
                         rows[broken].path, rows[broken].global_step, rows[broken].parent_step);
        if (r >= 0) {
                pthread_mutex_lock(&s->mu);
                r = load_chain_locked(s, rows, gone, chain, k, false, params, NULL, &slots_loaded,
                                      tables ? scratch : NULL, &used, err, errlen);
                pthread_mutex_unlock(&s->mu);
        }
        for (uint32_t t = 0; r >= 0 && tables && t < MODEL_MAX_EMBEDDINGS; t++) {
                tables[t] = scratch[t];
                scratch[t] = (struct ps_sparse_rows){0};
        }
        for (uint32_t t = 0; t < MODEL_MAX_EMBEDDINGS; t++)
                ps_sparse_rows_clear(&scratch[t]);
        free(gone);
        free(chain);
        return r < 0 ? r : 0;
}

int chief_ckpt_read_chain(struct chief_ckpt *s, const struct chief_db_checkpoint *rows, size_t n, size_t i,
                          float *params, struct ps_sparse_rows *tables, char *err, size_t errlen) {
        assert(i < n);
        return read_chain(s, rows, n, i, params, tables, err, errlen);
}

int chief_ckpt_read_step(struct chief_ckpt *s, uint64_t global_step, float *params, struct ps_sparse_rows *tables,
                         struct chief_db_checkpoint *ret, char *err, size_t errlen) {
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0, i = 0;
        int r = chief_db_list_checkpoints(s->db, &rows, &n);
        if (r < 0)
                return errf(err, errlen, r, "cannot list the checkpoints: %s", strerror(-r));
        while (i < n && rows[i].global_step != global_step)
                i++;
        if (i == n)
                r = errf(err, errlen, -ENOENT, "no checkpoint of global_step %" PRIu64 " is recorded", global_step);
        else if ((r = read_chain(s, rows, n, i, params, tables, err, errlen)) >= 0)
                *ret = rows[i];
        free(rows);
        return r;
}

/* ---- deleting, listing, repairing ---- */

int chief_ckpt_delete(struct chief_ckpt *s, uint64_t global_step, struct chief_db_checkpoint *ret, char *err,
                      size_t errlen) {
        struct chief_db_checkpoint row;
        pthread_mutex_lock(&s->mu);
        int r = chief_db_delete_checkpoint(s->db, global_step, &row);
        if (r == -ENOENT)
                errf(err, errlen, r, "there is no checkpoint of global_step %" PRIu64, global_step);
        else if (r < 0)
                errf(err, errlen, r, "cannot delete the record of global_step %" PRIu64 ": %s", global_step, strerror(-r));
        else if (unlink(row.path) < 0 && errno != ENOENT)
                /* The row is gone, so the file is no checkpoint any more; reconcile removes it later. */
                log_warning_errno(errno, "Cannot remove \"%s\" (no longer recorded)", row.path);
        pthread_mutex_unlock(&s->mu);
        if (r >= 0 && ret)
                *ret = row;
        return r;
}

int chief_ckpt_newest(struct chief_ckpt *s, struct chief_db_checkpoint *ret, uint32_t *count_ret) {
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0;
        int r = chief_db_list_checkpoints(s->db, &rows, &n);
        if (r >= 0 && n == 0)
                r = -ENOENT;
        if (r >= 0)
                *ret = rows[0];
        if (count_ret)
                *count_ret = r >= 0 || r == -ENOENT ? (uint32_t)n : 0;
        free(rows);
        return r;
}

int chief_ckpt_reconcile(struct chief_ckpt *s) {
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0;
        int repairs = 0;
        pthread_mutex_lock(&s->mu);
        int r = chief_db_list_checkpoints(s->db, &rows, &n);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                struct chief_db_checkpoint *row = &rows[i];
                if (exists(row->path))
                        continue;
                char *here = strdup_printf("%s/%s", s->dir, base_name(row->path));
                struct chief_db_checkpoint *gone = NULL;
                size_t n_gone = 0;
                if (here && strcmp(here, row->path) != 0 && exists(here)) {
                        log_notice("Checkpoint of global_step %" PRIu64 ": recorded as \"%s\", found as \"%s\"; following it",
                                   row->global_step, row->path, here);
                        snprintf(row->path, sizeof(row->path), "%s", here);
                        r = chief_db_add_checkpoint(s->db, row, UINT32_MAX, &gone, &n_gone);
                        free(gone);
                } else {
                        log_warning("Checkpoint of global_step %" PRIu64 " is recorded but its file \"%s\" is missing; "
                                    "forgetting it", row->global_step, row->path);
                        r = chief_db_delete_checkpoint(s->db, row->global_step, NULL);
                        row->path[0] = 0;
                }
                free(here);
                repairs++;
        }
        DIR *d = r >= 0 ? opendir(s->dir) : NULL;
        if (r >= 0 && !d)
                r = -errno;
        for (struct dirent *e; d && (e = readdir(d));) {
                char *path = strdup_printf("%s/%s", s->dir, e->d_name);
                uint64_t step;
                size_t len = strlen(e->d_name);
                if (!path)
                        break;
                if (strncmp(e->d_name, ".ckpt-", 6) == 0 && len > 4 && strcmp(e->d_name + len - 4, ".tmp") == 0) {
                        if (unlink(path) == 0) {
                                log_warning("Removed \"%s\": the write of a checkpoint was interrupted", path);
                                repairs++;
                        }
                } else if (parse_name(e->d_name, &step)) {
                        bool recorded = false;
                        for (size_t i = 0; i < n && !recorded; i++)
                                recorded = rows[i].global_step == step && strcmp(rows[i].path, path) == 0;
                        if (!recorded && unlink(path) == 0) {
                                log_warning("Removed \"%s\": a checkpoint file that was never recorded (chiefd stopped "
                                            "between writing it and recording it)", path);
                                repairs++;
                        }
                }
                free(path);
        }
        if (d)
                closedir(d);
        if (r >= 0)
                repairs += prune_corrupt_locked(s);
        pthread_mutex_unlock(&s->mu);
        free(rows);
        return r < 0 ? r : repairs;
}
