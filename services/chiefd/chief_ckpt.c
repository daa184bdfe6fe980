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
#include "chief_ckpt-internal.h"
#include "ckpt.h"
#include "log.h"
#include "optim.h"
#include "sparse_table.h"
#include "util.h"


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

int chief_ckpt_prune_corrupt_locked(struct chief_ckpt *s) {
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
                repairs += chief_ckpt_prune_corrupt_locked(s);
        pthread_mutex_unlock(&s->mu);
        free(rows);
        return r < 0 ? r : repairs;
}
