/* chiefd's Export calls (chief_exporter.h): queued by the handler, written one at a time by this
 * module's thread into <state>/<job>/exports/NAME (a temporary directory renamed whole), answered late.
 * NAME says what the export holds, so that one already there is answered as it is:
 * step-N or delta-A-N, then -rows-R (max_inline_rows) and -ext (external data) when asked. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chief_db.h"
#include "chief_export.h"
#include "chief_exporter.h"
#include "log.h"
#include "rpc.h"
#include "util.h"
#include "psfleet/v1/supervisor.pb-c.h"

#define EXPORT_MAX_FILES 64 /* model.onnx, its data, tables.json, delta.json and two files a table (8 at most) */
#define TMP_NAME ".export.tmp"

struct export_job {
        struct rpc_call *call;
        struct chief_export_ask ask;
        struct export_job *next;
};

struct chief_exporter {
        const struct job_config *cfg;
        struct chief_db *db;
        struct chief_ckpt *store;
        char *job_dir, *dir;              /* dir: job_dir/exports */
        pthread_mutex_t mu;               /* protects the fields below */
        pthread_cond_t more;
        struct export_job *head, *tail;
        unsigned n;
        bool closed;
        pthread_t thread;
        bool started;
};

/* The directory's name for an export of step (and ask's options). */
static void export_name(const struct chief_export_ask *ask, uint64_t step, char *buf, size_t len) {
        int o = ask->since ? snprintf(buf, len, "delta-%" PRIu64 "-%" PRIu64, ask->since, step)
                           : snprintf(buf, len, "step-%" PRIu64, step);
        if (ask->max_inline_rows && o > 0 && (size_t)o < len)
                o += snprintf(buf + o, len - (size_t)o, "-rows-%" PRIu64, ask->max_inline_rows);
        if (ask->external && o > 0 && (size_t)o < len)
                snprintf(buf + o, len - (size_t)o, "-ext");
}

/* Removes path and what it holds (an export: two levels at most). Missing is no error. */
static void remove_tree(const char *path, int depth) {
        DIR *d = depth > 0 ? opendir(path) : NULL;
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                char *p = strdup_printf("%s/%s", path, de->d_name);
                if (p && unlink(p) < 0 && errno == EISDIR)
                        remove_tree(p, depth - 1);
                free(p);
        }
        if (d)
                closedir(d);
        if (rmdir(path) < 0 && errno == ENOTDIR)
                unlink(path);
}

static void sync_dir(const char *path) {
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd >= 0) {
                (void)fsync(fd);
                close(fd);
        }
}

struct listed {
        char path[2 * 256 + 2]; /* DIR/NAME */
        uint64_t bytes;
};

static int listed_cmp(const void *a, const void *b) {
        return strcmp(((const struct listed *)a)->path, ((const struct listed *)b)->path);
}

/* The files under dir (and its subdirectories, one level), relative paths, appended to f[*n..max). */
static void list_files(const char *dir, const char *rel, struct listed *f, size_t *n, size_t max) {
        DIR *d = opendir(dir);
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL && *n < max) {
                if (de->d_name[0] == '.')
                        continue;
                char *p = strdup_printf("%s/%s", dir, de->d_name);
                struct stat sb;
                bool ok = p && stat(p, &sb) == 0;
                if (ok && S_ISDIR(sb.st_mode) && !*rel) {
                        list_files(p, de->d_name, f, n, max);
                } else if (ok && S_ISREG(sb.st_mode)) {
                        snprintf(f[*n].path, sizeof(f[*n].path), "%s%s%s", rel, *rel ? "/" : "", de->d_name);
                        f[(*n)++].bytes = (uint64_t)sb.st_size;
                }
                free(p);
        }
        if (d)
                closedir(d);
}

/* A delta's counts, from its delta.json. */
static void delta_counts(const char *dir, uint64_t *changed, uint64_t *gone) {
        char *p = strdup_printf("%s/delta.json", dir);
        json_t *m = p ? json_load_file(p, 0, NULL) : NULL;
        json_t *tables = json_object_get(m, "tables");
        *changed = *gone = 0;
        for (size_t i = 0; i < json_array_size(tables); i++) {
                json_t *t = json_array_get(tables, i);
                *changed += (uint64_t)json_integer_value(json_object_get(t, "changed"));
                *gone += (uint64_t)json_integer_value(json_object_get(t, "tombstones"));
        }
        json_decref(m);
        free(p);
}

static void reply(struct rpc_call *call, const char *dir, uint64_t step, const struct chief_export_ask *ask,
                  bool existing) {
        struct listed *f = calloc(EXPORT_MAX_FILES, sizeof(*f));
        Psfleet__V1__ExportFile *fm = calloc(EXPORT_MAX_FILES, sizeof(*fm));
        Psfleet__V1__ExportFile **fp = calloc(EXPORT_MAX_FILES, sizeof(*fp));
        if (!f || !fm || !fp) {
                rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
                goto out;
        }
        size_t n = 0;
        list_files(dir, "", f, &n, EXPORT_MAX_FILES);
        qsort(f, n, sizeof(*f), listed_cmp);
        Psfleet__V1__ExportReply rep = PSFLEET__V1__EXPORT_REPLY__INIT;
        for (size_t i = 0; i < n; i++) {
                psfleet__v1__export_file__init(&fm[i]);
                fm[i].path = f[i].path;
                fm[i].bytes = f[i].bytes;
                fp[i] = &fm[i];
        }
        rep.dir = (char *)dir;
        rep.global_step = step;
        rep.n_files = n;
        rep.files = fp;
        rep.existing = existing;
        rep.since = ask->since;
        if (ask->since)
                delta_counts(dir, &rep.changed, &rep.tombstones);
        rpc_call_reply_msg(call, &rep.base);
out:
        free(f);
        free(fm);
        free(fp);
}

/* An export's exit status (chief_export.h) as the call's status. */
static grpc_status_code export_status(int r) {
        return r == 1                  ? GRPC_STATUS_RESOURCE_EXHAUSTED
               : r == EXPORT_EX_IOERR  ? GRPC_STATUS_INTERNAL
               : r == CONFIG_EX_CONFIG ? GRPC_STATUS_INVALID_ARGUMENT /* the model: as offline, 78 */
                                       : GRPC_STATUS_FAILED_PRECONDITION;
}

/* The lines of an export's messages as one: "a; b". */
static void one_line(char *text) {
        size_t l = strlen(text);
        if (l && text[l - 1] == '\n')
                text[--l] = '\0';
        for (char *nl; (nl = strchr(text, '\n'));)
                *nl = ';';
}

/* The newest checkpoint's step, the likely export of step 0 (0 when none is recorded). */
static uint64_t newest_step(struct chief_db *db) {
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0;
        uint64_t step = chief_db_list_checkpoints(db, &rows, &n) == 0 && n ? rows[0].global_step : 0;
        free(rows);
        return step;
}

static void serve(struct chief_exporter *x, const struct export_job *j) {
        char name[128], text[16384] = "";
        uint64_t step = j->ask.step ? j->ask.step : newest_step(x->db);
        char *final = NULL, *tmp = strdup_printf("%s/" TMP_NAME, x->dir);
        struct export_result res = { 0 };
        int r = tmp ? mkdir_p(x->dir, 0750) : -ENOMEM;
        if (r < 0) {
                rpc_call_fail_errno(j->call, r, "cannot make \"%s\": %s", x->dir, strerror(-r));
                goto out;
        }
        export_name(&j->ask, step, name, sizeof(name));
        struct stat sb;
        if (step && (final = strdup_printf("%s/%s", x->dir, name)) && stat(final, &sb) == 0) {
                reply(j->call, final, step, &j->ask, true);
                goto out;
        }
        remove_tree(tmp, 2); /* what an export cut short (chiefd killed) left */
        struct export_msgs msg = { text, sizeof(text) };
        const struct export_request q = { .cfg = x->cfg, .db = x->db, .where = x->job_dir, .store = x->store,
                                          .step = j->ask.step, .since = j->ask.since,
                                          .max_inline_rows = j->ask.max_inline_rows, .external = j->ask.external,
                                          .out = tmp };
        uint64_t t0 = mono_us();
        r = chief_export(&q, &res, &msg);
        one_line(text);
        if (r != 0) {
                remove_tree(tmp, 2);
                log_warning("Export of global_step %" PRIu64 " failed: %s", j->ask.step, text);
                rpc_call_fail(j->call, export_status(r), "%s", text);
                goto out;
        }
        if (*text)
                log_notice("%s", text);
        export_name(&j->ask, res.step, name, sizeof(name));
        free(final);
        if (!(final = strdup_printf("%s/%s", x->dir, name))) {
                remove_tree(tmp, 2);
                rpc_call_fail(j->call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        } else if (stat(final, &sb) == 0) { /* the newest checkpoint did not verify: an older one's, there */
                remove_tree(tmp, 2);
                reply(j->call, final, res.step, &j->ask, true);
        } else if (rename(tmp, final) < 0) {
                r = -errno;
                remove_tree(tmp, 2);
                rpc_call_fail_errno(j->call, r, "cannot rename \"%s\" to \"%s\": %s", tmp, final, strerror(-r));
        } else {
                sync_dir(x->dir);
                log_info("Exported global_step %" PRIu64 " to \"%s\" in %.1f s", res.step, final,
                         (double)(mono_us() - t0) / 1e6);
                reply(j->call, final, res.step, &j->ask, false);
        }
out:
        export_result_clear(&res);
        free(final);
        free(tmp);
}

static void *exporter_main(void *ud) {
        struct chief_exporter *x = ud;
        pthread_mutex_lock(&x->mu);
        for (;;) {
                while (!x->head && !x->closed)
                        pthread_cond_wait(&x->more, &x->mu);
                struct export_job *j = x->head;
                if (!j)
                        break;
                x->head = j->next;
                if (!x->head)
                        x->tail = NULL;
                x->n--;
                pthread_mutex_unlock(&x->mu);
                serve(x, j);
                free(j);
                pthread_mutex_lock(&x->mu);
        }
        pthread_mutex_unlock(&x->mu);
        return NULL;
}

int chief_exporter_add(struct chief_exporter *x, struct rpc_call *call, const struct chief_export_ask *ask) {
        struct export_job *j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->call = call;
        j->ask = *ask;
        pthread_mutex_lock(&x->mu);
        int r = x->closed ? -ESHUTDOWN : x->n >= CHIEF_EXPORTS_MAX ? -EBUSY : 0;
        if (r == 0) {
                if (x->tail)
                        x->tail->next = j;
                else
                        x->head = j;
                x->tail = j;
                x->n++;
                pthread_cond_signal(&x->more);
        }
        pthread_mutex_unlock(&x->mu);
        if (r < 0)
                free(j);
        return r;
}

int chief_exporter_new(const struct job_config *cfg, struct chief_db *db, struct chief_ckpt *store,
                       const char *job_dir, struct chief_exporter **ret) {
        struct chief_exporter *x = calloc(1, sizeof(*x));
        if (!x)
                return -ENOMEM;
        x->cfg = cfg, x->db = db, x->store = store;
        pthread_mutex_init(&x->mu, NULL);
        pthread_cond_init(&x->more, NULL);
        x->job_dir = strdup(job_dir);
        x->dir = strdup_printf("%s/exports", job_dir);
        int r = x->job_dir && x->dir ? -pthread_create(&x->thread, NULL, exporter_main, x) : -ENOMEM;
        if (r < 0) {
                chief_exporter_free(x);
                return r;
        }
        x->started = true;
        *ret = x;
        return 0;
}

void chief_exporter_stop(struct chief_exporter *x) {
        if (!x)
                return;
        pthread_mutex_lock(&x->mu);
        x->closed = true;
        struct export_job *queued = x->head;
        x->head = x->tail = NULL;
        x->n = 0;
        pthread_cond_signal(&x->more);
        pthread_mutex_unlock(&x->mu);
        while (queued) {
                struct export_job *next = queued->next;
                rpc_call_fail(queued->call, GRPC_STATUS_UNAVAILABLE, "chiefd is stopping");
                free(queued);
                queued = next;
        }
        if (x->started) {
                pthread_join(x->thread, NULL);
                x->started = false;
        }
}

struct chief_exporter *chief_exporter_free(struct chief_exporter *x) {
        if (!x)
                return NULL;
        chief_exporter_stop(x);
        pthread_cond_destroy(&x->more);
        pthread_mutex_destroy(&x->mu);
        free(x->job_dir);
        free(x->dir);
        free(x);
        return NULL;
}
