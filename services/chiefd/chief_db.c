/* chiefd's SQLite record: schema, statements, and SQLite result codes translated to -errno. */
#include "chief_db.h"

#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* 3: the job's reason and state_since_us, the losses table, paths relative to the directory. */
#define CHIEF_DB_SCHEMA_VERSION 5

struct chief_db {
        sqlite3 *h;
        pthread_mutex_t lock;
        char *dir;              /* absolute: relative paths are stored against it */
        size_t dir_len;
};

/* Appends an element of `size` bytes to a growing array *a of *n. */
static int array_push(void *a, size_t *n, const void *elem, size_t size) {
        char *b = realloc(*(void **)a, (*n + 1) * size);
        if (!b)
                return -ENOMEM;
        memcpy(b + *n * size, elem, size);
        (*n)++;
        *(void **)a = b;
        return 0;
}

/* The one place where SQLite's result codes become errno values. */
static int db_errno(sqlite3 *h, int rc) {
        switch (rc & 0xff) {
        case SQLITE_OK:
        case SQLITE_ROW:
        case SQLITE_DONE:
                return 0;
        case SQLITE_NOMEM:
                return -ENOMEM;
        case SQLITE_BUSY:
        case SQLITE_LOCKED:
                return -EBUSY;
        case SQLITE_READONLY:
                return -EROFS;
        case SQLITE_PERM:
        case SQLITE_AUTH:
                return -EACCES;
        case SQLITE_CANTOPEN: {
                int e = h ? sqlite3_system_errno(h) : 0;
                return e > 0 ? -e : -ENOENT;
        }
        case SQLITE_FULL:
                return -ENOSPC;
        case SQLITE_CORRUPT:
        case SQLITE_NOTADB:
        case SQLITE_FORMAT:
                return -EBADMSG;
        case SQLITE_CONSTRAINT:
        case SQLITE_MISMATCH:
        case SQLITE_RANGE:
        case SQLITE_MISUSE:
                return -EINVAL;
        case SQLITE_TOOBIG:
                return -E2BIG;
        case SQLITE_INTERRUPT:
                return -EINTR;
        case SQLITE_ABORT:
                return -ECANCELED;
        case SQLITE_IOERR: {
                int e = h ? sqlite3_system_errno(h) : 0;
                return e > 0 ? -e : -EIO;
        }
        default:
                return -EIO;
        }
}

static const char schema[] =
        "CREATE TABLE IF NOT EXISTS job ("
        "  id INTEGER PRIMARY KEY CHECK (id = 1),"
        "  fingerprint TEXT NOT NULL,"          /* hex: uint64 does not fit SQLite's signed INTEGER */
        "  state INTEGER NOT NULL,"
        "  global_step INTEGER NOT NULL,"
        "  max_steps INTEGER NOT NULL,"
        "  started_us INTEGER NOT NULL,"
        "  updated_us INTEGER NOT NULL,"
        "  test_accuracy REAL NOT NULL,"
        "  test_loss REAL NOT NULL,"
        "  wall_s REAL NOT NULL,"
        "  reason TEXT NOT NULL DEFAULT '',"
        "  state_since_us INTEGER NOT NULL DEFAULT 0,"
        /* Version 4. The final evaluation's AUC (model.head logistic) and RMSE (mse); -1: none. */
        "  test_auc REAL NOT NULL DEFAULT -1,"
        "  test_rmse REAL NOT NULL DEFAULT -1);"
        /* Version 3. One row per shard restored from a checkpoint behind the job's step. */
        "CREATE TABLE IF NOT EXISTS losses ("
        "  id INTEGER PRIMARY KEY,"
        "  time_us INTEGER NOT NULL,"
        "  shard INTEGER NOT NULL,"
        "  restored_step INTEGER NOT NULL,"
        "  job_step INTEGER NOT NULL,"
        "  steps_lost INTEGER NOT NULL);"
        "CREATE TABLE IF NOT EXISTS progress ("
        "  id INTEGER PRIMARY KEY,"
        "  time_us INTEGER NOT NULL,"
        "  worker INTEGER NOT NULL,"
        "  local_step INTEGER NOT NULL,"
        "  global_step INTEGER NOT NULL,"
        "  loss REAL NOT NULL,"
        "  examples_per_s REAL NOT NULL,"
        "  examples INTEGER NOT NULL,"
        "  state TEXT NOT NULL);"
        "CREATE INDEX IF NOT EXISTS progress_worker ON progress (worker, id);"
        "CREATE TABLE IF NOT EXISTS evaluations ("
        "  id INTEGER PRIMARY KEY,"
        "  time_us INTEGER NOT NULL,"
        "  global_step INTEGER NOT NULL,"
        "  examples INTEGER NOT NULL,"
        "  loss REAL NOT NULL,"
        "  accuracy REAL NOT NULL);"
        /* Version 2. A row exists only for a file that was complete and durable before the row was
         * committed; chiefd removes files without a row at start. */
        "CREATE TABLE IF NOT EXISTS checkpoints ("
        "  global_step INTEGER PRIMARY KEY,"
        "  time_us INTEGER NOT NULL,"
        "  path TEXT NOT NULL,"
        "  bytes INTEGER NOT NULL,"
        "  checksum TEXT NOT NULL,"              /* crc32c:%08x of the whole file */
        "  loss REAL,"                           /* NULL: unknown */
        "  eval_step INTEGER NOT NULL,"
        "  eval_accuracy REAL NOT NULL,"
        "  eval_loss REAL NOT NULL,"
        "  trigger TEXT NOT NULL,"
        /* Version 5. An incremental checkpoint's parent (the checkpoint it holds the changes since);
         * NULL: a full one. */
        "  parent_step INTEGER);"
        "CREATE INDEX IF NOT EXISTS checkpoints_time ON checkpoints (time_us, global_step);";

static int exec_sql(struct chief_db *db, const char *sql) {
        return db_errno(db->h, sqlite3_exec(db->h, sql, NULL, NULL, NULL));
}

static int read_user_version(struct chief_db *db, int *v) {
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(db->h, "PRAGMA user_version", -1, &st, NULL);
        if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW)
                *v = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
        return rc == SQLITE_ROW ? 0 : db_errno(db->h, rc);
}

/* Adds a column to the job's row; one that exists already (an interrupted migration) is no error. */
static int add_job_column(struct chief_db *db, const char *column) {
        char q[200];
        snprintf(q, sizeof(q), "ALTER TABLE job ADD COLUMN %s;", column);
        int r = exec_sql(db, q);
        return r == -EINVAL ? 0 : r;
}

/* Before version 3, the job's row had no reason and paths were absolute: those under the directory
 * become relative to it. Before version 4, the row had no AUC or RMSE. Before version 5, every
 * checkpoint was full: no parent_step. */
static int migrate(struct chief_db *db, int from) {
        if (from > 0 && from < 5) {
                int a = exec_sql(db, "ALTER TABLE checkpoints ADD COLUMN parent_step INTEGER;");
                if (a < 0 && a != -EINVAL)   /* -EINVAL: it exists (an interrupted migration) */
                        return a;
        }
        static const char *const added[][2] = {
                {"reason TEXT NOT NULL DEFAULT ''", "3"}, {"state_since_us INTEGER NOT NULL DEFAULT 0", "3"},
                {"test_auc REAL NOT NULL DEFAULT -1", "4"}, {"test_rmse REAL NOT NULL DEFAULT -1", "4"},
        };
        int r = 0;
        for (size_t i = 0; i < sizeof(added) / sizeof(added[0]) && r >= 0; i++)
                if (from > 0 && from < atoi(added[i][1]))
                        r = add_job_column(db, added[i][0]);
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(db->h, "UPDATE checkpoints SET path = substr(path, ?1) WHERE substr(path, 1, ?2) = ?3",
                                    -1, &st, NULL);
        if (r >= 0 && rc == SQLITE_OK) {
                char *prefix = malloc(db->dir_len + 2);
                if (!prefix) {
                        sqlite3_finalize(st);
                        return -ENOMEM;
                }
                snprintf(prefix, db->dir_len + 2, "%s/", db->dir);
                sqlite3_bind_int64(st, 1, (sqlite3_int64)db->dir_len + 2);
                sqlite3_bind_int64(st, 2, (sqlite3_int64)db->dir_len + 1);
                sqlite3_bind_text(st, 3, prefix, -1, SQLITE_TRANSIENT);
                rc = sqlite3_step(st);
                free(prefix);
        }
        sqlite3_finalize(st);
        return r < 0 ? r : db_errno(db->h, rc);
}

/* A handle with its directory resolved and nothing opened yet: 0 or -errno (*ret freed on failure). */
static int db_new(const char *path, struct chief_db **ret) {
        struct chief_db *db = calloc(1, sizeof(*db));
        char *copy = strdup(path);
        if (!db || !copy) {
                free(db);
                free(copy);
                return -ENOMEM;
        }
        pthread_mutex_init(&db->lock, NULL);
        db->dir = realpath(dirname(copy), NULL);
        free(copy);
        if (!db->dir) {
                int r = -errno;
                chief_db_close(db);
                return r;
        }
        db->dir_len = strlen(db->dir);
        *ret = db;
        return 0;
}

int chief_db_open_readonly(const char *path, struct chief_db **ret) {
        struct chief_db *db;
        int r = db_new(path, &db);
        if (r < 0)
                return r;
        /* A WAL database opened read-only needs its -shm file, or a directory where it may make one;
         * a reader that may do neither (the chief is down, its files another user's) reads the file
         * as it is, which is what a stopped chief left. */
        char *uri[2] = {strdup_printf("file:%s?mode=ro", path), strdup_printf("file:%s?immutable=1", path)};
        r = -ENOMEM;
        for (int i = 0; i < 2 && uri[0] && uri[1]; i++) {
                sqlite3_close(db->h);
                db->h = NULL;
                int rc = sqlite3_open_v2(uri[i], &db->h, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX,
                                         NULL);
                if ((r = db_errno(db->h, rc)) >= 0)
                        r = exec_sql(db, "SELECT count(*) FROM checkpoints;");
                if (r >= 0)
                        break;
        }
        free(uri[0]);
        free(uri[1]);
        if (r < 0) {
                chief_db_close(db);
                return r;
        }
        sqlite3_busy_timeout(db->h, 5000);
        *ret = db;
        return 0;
}

int chief_db_open(const char *path, struct chief_db **ret) {
        struct chief_db *db;
        int r = db_new(path, &db);
        if (r < 0)
                return r;
        int rc = sqlite3_open_v2(path, &db->h, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
        r = db_errno(db->h, rc);
        if (r < 0)
                goto fail;
        sqlite3_busy_timeout(db->h, 5000);
        /* WAL: readers (psfleet, tests) never block the chief. synchronous=NORMAL: a commit is durable
         * at the next checkpoint; progress rows are cheap to lose in a power cut, not worth an fsync. */
        int version = 0;
        r = exec_sql(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;");
        if (r >= 0)
                r = read_user_version(db, &version);
        if (r >= 0)
                r = exec_sql(db, schema);
        if (r >= 0)
                r = migrate(db, version);
        if (r >= 0) {
                char q[64];
                snprintf(q, sizeof(q), "PRAGMA user_version=%d;", CHIEF_DB_SCHEMA_VERSION);
                r = exec_sql(db, q);
        }
        if (r < 0)
                goto fail;
        *ret = db;
        return 0;
fail:
        chief_db_close(db);
        return r;
}

const char *chief_db_dir(const struct chief_db *db) {
        return db->dir;
}

/* A path as stored: relative when under the directory. */
static void path_to_row(const struct chief_db *db, const char *abs, char *buf, size_t len) {
        if (strncmp(abs, db->dir, db->dir_len) == 0 && abs[db->dir_len] == '/' && abs[db->dir_len + 1])
                snprintf(buf, len, "%s", abs + db->dir_len + 1);
        else
                snprintf(buf, len, "%s", abs);
}

/* A stored path made absolute again, in place. */
static void path_from_row(const struct chief_db *db, char *path, size_t len) {
        size_t n = strlen(path);
        if (!path[0] || path[0] == '/' || db->dir_len + 1 + n >= len)
                return;   /* a path that would not fit is left as stored: reconcile forgets it */
        memmove(path + db->dir_len + 1, path, n + 1);
        memcpy(path, db->dir, db->dir_len);
        path[db->dir_len] = '/';
}

struct chief_db *chief_db_close(struct chief_db *db) {
        if (!db)
                return NULL;
        sqlite3_close(db->h);   /* NULL-safe */
        pthread_mutex_destroy(&db->lock);
        free(db->dir);
        free(db);
        return NULL;
}

typedef void bind_fn(sqlite3_stmt *st, const void *ud);
typedef void read_fn(sqlite3_stmt *st, void *ud);

/* Prepares sql, lets bind() fill its parameters (bind may be NULL), steps it once (db->lock held).
 * With read, a query of one row: read() gets the row, and no row is -ENOENT. Returns 0 or -errno. */
static int exec_one_locked(struct chief_db *db, const char *sql, bind_fn *bind, const void *bind_ud, read_fn *read,
                           void *read_ud) {
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);
        if (rc == SQLITE_OK) {
                if (bind)
                        bind(st, bind_ud);
                rc = sqlite3_step(st);
        }
        int r = read && rc == SQLITE_DONE ? -ENOENT : db_errno(db->h, rc);
        if (read && rc == SQLITE_ROW)
                read(st, read_ud);
        sqlite3_finalize(st);
        return r;
}

/* The same, taking db->lock. */
static int exec_one(struct chief_db *db, const char *sql, bind_fn *bind, const void *bind_ud, read_fn *read,
                    void *read_ud) {
        pthread_mutex_lock(&db->lock);
        int r = exec_one_locked(db, sql, bind, bind_ud, read, read_ud);
        pthread_mutex_unlock(&db->lock);
        return r;
}

static void bind_u64(sqlite3_stmt *st, const void *ud) {
        sqlite3_bind_int64(st, 1, (sqlite3_int64)*(const uint64_t *)ud);
}

static void bind_job(sqlite3_stmt *st, const void *ud) {
        const struct chief_db_job *j = ud;
        char fp[17];
        snprintf(fp, sizeof(fp), "%016" PRIx64, j->fingerprint);
        sqlite3_bind_text(st, 1, fp, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(st, 2, j->state);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)j->global_step);
        sqlite3_bind_int64(st, 4, (sqlite3_int64)j->max_steps);
        sqlite3_bind_int64(st, 5, (sqlite3_int64)j->started_us);
        sqlite3_bind_int64(st, 6, (sqlite3_int64)j->updated_us);
        sqlite3_bind_double(st, 7, j->test_accuracy);
        sqlite3_bind_double(st, 8, j->test_loss);
        sqlite3_bind_double(st, 9, j->wall_s);
        sqlite3_bind_text(st, 10, j->reason, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 11, (sqlite3_int64)j->state_since_us);
        sqlite3_bind_double(st, 12, j->test_auc);
        sqlite3_bind_double(st, 13, j->test_rmse);
}

static int durable_begin(struct chief_db *db);
static int durable_end(struct chief_db *db, int r, bool begun);

/* One statement in its own durable transaction. */
static int exec_durable(struct chief_db *db, const char *sql, bind_fn *bind, const void *ud) {
        int r = durable_begin(db);
        bool begun = r >= 0;
        if (r >= 0)
                r = exec_one_locked(db, sql, bind, ud, NULL, NULL);
        return durable_end(db, r, begun);
}

int chief_db_save_job(struct chief_db *db, const struct chief_db_job *j) {
        return exec_durable(db,
                            "INSERT OR REPLACE INTO job (id, fingerprint, state, global_step, max_steps, started_us,"
                            " updated_us, test_accuracy, test_loss, wall_s, reason, state_since_us, test_auc, test_rmse)"
                            " VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            bind_job, j);
}

static void bind_loss(sqlite3_stmt *st, const void *ud) {
        const struct chief_db_loss *l = ud;
        sqlite3_bind_int64(st, 1, (sqlite3_int64)l->time_us);
        sqlite3_bind_int64(st, 2, l->shard);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)l->restored_step);
        sqlite3_bind_int64(st, 4, (sqlite3_int64)l->job_step);
        sqlite3_bind_int64(st, 5, (sqlite3_int64)l->steps_lost);
}

int chief_db_add_loss(struct chief_db *db, const struct chief_db_loss *l) {
        return exec_durable(db,
                            "INSERT INTO losses (time_us, shard, restored_step, job_step, steps_lost) VALUES (?, ?, ?, ?, ?)",
                            bind_loss, l);
}

int chief_db_list_losses(struct chief_db *db, struct chief_db_loss **ret, size_t *n_ret) {
        struct chief_db_loss *a = NULL;
        size_t n = 0;
        sqlite3_stmt *st = NULL;
        int r = 0;
        pthread_mutex_lock(&db->lock);
        int rc = sqlite3_prepare_v2(db->h, "SELECT time_us, shard, restored_step, job_step, steps_lost FROM losses"
                                    " ORDER BY id", -1, &st, NULL);
        while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                struct chief_db_loss l = {
                        .time_us = (uint64_t)sqlite3_column_int64(st, 0),
                        .shard = (uint32_t)sqlite3_column_int64(st, 1),
                        .restored_step = (uint64_t)sqlite3_column_int64(st, 2),
                        .job_step = (uint64_t)sqlite3_column_int64(st, 3),
                        .steps_lost = (uint64_t)sqlite3_column_int64(st, 4),
                };
                if ((r = array_push(&a, &n, &l, sizeof(l))) < 0)
                        break;
                rc = SQLITE_OK;
        }
        if (r >= 0 && rc != SQLITE_DONE)
                r = rc == SQLITE_OK ? -EIO : db_errno(db->h, rc);
        sqlite3_finalize(st);
        pthread_mutex_unlock(&db->lock);
        if (r < 0) {
                free(a);
                return r;
        }
        *ret = a;
        *n_ret = n;
        return 0;
}

static void read_job(sqlite3_stmt *st, void *ud) {
        const char *fp = (const char *)sqlite3_column_text(st, 0);
        *(struct chief_db_job *)ud = (struct chief_db_job){
                .fingerprint = fp ? strtoull(fp, NULL, 16) : 0,
                .state = sqlite3_column_int(st, 1),
                .global_step = (uint64_t)sqlite3_column_int64(st, 2),
                .max_steps = (uint64_t)sqlite3_column_int64(st, 3),
                .started_us = (uint64_t)sqlite3_column_int64(st, 4),
                .updated_us = (uint64_t)sqlite3_column_int64(st, 5),
                .test_accuracy = (float)sqlite3_column_double(st, 6),
                .test_loss = (float)sqlite3_column_double(st, 7),
                .wall_s = (float)sqlite3_column_double(st, 8),
                .state_since_us = (uint64_t)sqlite3_column_int64(st, 10),
                .test_auc = (float)sqlite3_column_double(st, 11),
                .test_rmse = (float)sqlite3_column_double(st, 12),
        };
        const char *reason = (const char *)sqlite3_column_text(st, 9);
        snprintf(((struct chief_db_job *)ud)->reason, sizeof(((struct chief_db_job *)ud)->reason), "%s",
                 reason ? reason : "");
}

int chief_db_load_job(struct chief_db *db, struct chief_db_job *ret) {
        return exec_one(db,
                        "SELECT fingerprint, state, global_step, max_steps, started_us, updated_us,"
                        " test_accuracy, test_loss, wall_s, reason, state_since_us, test_auc, test_rmse FROM job WHERE id = 1",
                        NULL, NULL, read_job, ret);
}

/* A loss that is not finite is recorded as what it is: SQLite stores NaN as NULL (refused by the NOT
 * NULL column), so a non-finite one is stored as its text ("nan", "inf"), which REAL affinity keeps
 * as text, and read back by column_loss. */
static void bind_loss_value(sqlite3_stmt *st, int i, float loss) {
        if (isfinite(loss))
                sqlite3_bind_double(st, i, loss);
        else
                sqlite3_bind_text(st, i, isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf", -1, SQLITE_STATIC);
}

static float column_loss(sqlite3_stmt *st, int i) {
        if (sqlite3_column_type(st, i) == SQLITE_TEXT)
                return strtof((const char *)sqlite3_column_text(st, i), NULL);
        return (float)sqlite3_column_double(st, i);
}

static void bind_progress(sqlite3_stmt *st, const void *ud) {
        const struct chief_db_progress *p = ud;
        sqlite3_bind_int64(st, 1, (sqlite3_int64)p->time_us);
        sqlite3_bind_int64(st, 2, p->worker);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)p->local_step);
        sqlite3_bind_int64(st, 4, (sqlite3_int64)p->global_step);
        bind_loss_value(st, 5, p->loss);
        sqlite3_bind_double(st, 6, p->examples_per_s);
        sqlite3_bind_int64(st, 7, (sqlite3_int64)p->examples);
        sqlite3_bind_text(st, 8, p->state ? p->state : "", -1, SQLITE_TRANSIENT);
}

int chief_db_add_progress(struct chief_db *db, const struct chief_db_progress *p) {
        return exec_one(db,
                        "INSERT INTO progress (time_us, worker, local_step, global_step, loss, examples_per_s,"
                        " examples, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        bind_progress, p, NULL, NULL);
}

struct progress_out {
        struct chief_db_progress *p;
        uint32_t worker;
        char *state_buf;
        size_t state_len;
};

static void read_progress(sqlite3_stmt *st, void *ud) {
        struct progress_out *o = ud;
        const char *s = (const char *)sqlite3_column_text(st, 6);
        snprintf(o->state_buf, o->state_len, "%s", s ? s : "");
        *o->p = (struct chief_db_progress){
                .time_us = (uint64_t)sqlite3_column_int64(st, 0),
                .worker = o->worker,
                .local_step = (uint64_t)sqlite3_column_int64(st, 1),
                .global_step = (uint64_t)sqlite3_column_int64(st, 2),
                .loss = column_loss(st, 3),
                .examples_per_s = (float)sqlite3_column_double(st, 4),
                .examples = (uint64_t)sqlite3_column_int64(st, 5),
                .state = o->state_buf,
        };
}

int chief_db_last_progress(struct chief_db *db, uint32_t worker, struct chief_db_progress *ret, char *state_buf,
                           size_t state_len) {
        struct progress_out o = {ret, worker, state_buf, state_len};
        uint64_t w = worker;
        return exec_one(db,
                        "SELECT time_us, local_step, global_step, loss, examples_per_s, examples, state"
                        " FROM progress WHERE worker = ? ORDER BY id DESC LIMIT 1",
                        bind_u64, &w, read_progress, &o);
}

struct eval_row {
        uint64_t time_us, global_step;
        uint32_t examples;
        float loss, accuracy;
};

static void bind_eval(sqlite3_stmt *st, const void *ud) {
        const struct eval_row *e = ud;
        sqlite3_bind_int64(st, 1, (sqlite3_int64)e->time_us);
        sqlite3_bind_int64(st, 2, (sqlite3_int64)e->global_step);
        sqlite3_bind_int64(st, 3, e->examples);
        sqlite3_bind_double(st, 4, e->loss);
        sqlite3_bind_double(st, 5, e->accuracy);
}

int chief_db_add_evaluation(struct chief_db *db, uint64_t time_us, uint64_t global_step, uint32_t examples,
                            float loss, float accuracy) {
        struct eval_row e = {time_us, global_step, examples, loss, accuracy};
        return exec_one(db,
                        "INSERT INTO evaluations (time_us, global_step, examples, loss, accuracy)"
                        " VALUES (?, ?, ?, ?, ?)",
                        bind_eval, &e, NULL, NULL);
}

struct eval_out {
        uint64_t *step;
        float *loss, *accuracy;
};

static void read_eval(sqlite3_stmt *st, void *ud) {
        const struct eval_out *o = ud;
        *o->step = (uint64_t)sqlite3_column_int64(st, 0);
        *o->loss = (float)sqlite3_column_double(st, 1);
        *o->accuracy = (float)sqlite3_column_double(st, 2);
}

int chief_db_last_evaluation(struct chief_db *db, uint64_t *step_ret, float *loss_ret, float *accuracy_ret) {
        struct eval_out o = {step_ret, loss_ret, accuracy_ret};
        return exec_one(db, "SELECT global_step, loss, accuracy FROM evaluations ORDER BY id DESC LIMIT 1", NULL, NULL,
                        read_eval, &o);
}

/* ---- checkpoints ---- */

#define CKPT_COLUMNS \
        "global_step, time_us, path, bytes, checksum, loss, eval_step, eval_accuracy, eval_loss, trigger, parent_step"

static const char *text_or_empty(sqlite3_stmt *st, int col) {
        const char *t = (const char *)sqlite3_column_text(st, col);
        return t ? t : "";
}

static void read_ckpt(sqlite3_stmt *st, struct chief_db_checkpoint *c) {
        memset(c, 0, sizeof(*c));
        c->global_step = (uint64_t)sqlite3_column_int64(st, 0);
        c->time_us = (uint64_t)sqlite3_column_int64(st, 1);
        snprintf(c->path, sizeof(c->path), "%s", text_or_empty(st, 2));
        c->bytes = (uint64_t)sqlite3_column_int64(st, 3);
        snprintf(c->checksum, sizeof(c->checksum), "%s", text_or_empty(st, 4));
        c->loss = sqlite3_column_type(st, 5) == SQLITE_NULL ? NAN : (float)sqlite3_column_double(st, 5);
        c->eval_step = (uint64_t)sqlite3_column_int64(st, 6);
        c->eval_accuracy = (float)sqlite3_column_double(st, 7);
        c->eval_loss = (float)sqlite3_column_double(st, 8);
        snprintf(c->trigger, sizeof(c->trigger), "%s", text_or_empty(st, 9));
        c->incremental = sqlite3_column_type(st, 10) != SQLITE_NULL;
        c->parent_step = c->incremental ? (uint64_t)sqlite3_column_int64(st, 10) : 0;
}

static int push_ckpt(struct chief_db_checkpoint **a, size_t *n, const struct chief_db_checkpoint *c) {
        return array_push(a, n, c, sizeof(*c));
}

/* Runs a query and collects its checkpoint rows (lock held). bind_step >= 0 binds parameter 1. */
static int select_ckpts(struct chief_db *db, const char *sql, int64_t bind_param, struct chief_db_checkpoint **ret,
                        size_t *n_ret) {
        sqlite3_stmt *st = NULL;
        struct chief_db_checkpoint *a = NULL;
        size_t n = 0;
        int rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL), r = 0;
        if (rc == SQLITE_OK && bind_param >= 0)
                sqlite3_bind_int64(st, 1, bind_param);
        while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
                struct chief_db_checkpoint c;
                read_ckpt(st, &c);
                path_from_row(db, c.path, sizeof(c.path));
                if ((r = push_ckpt(&a, &n, &c)) < 0)
                        break;
                rc = SQLITE_OK;
        }
        if (r >= 0 && rc != SQLITE_DONE)
                r = rc == SQLITE_OK ? -EIO : db_errno(db->h, rc);
        sqlite3_finalize(st);
        if (r < 0) {
                free(a);
                return r;
        }
        *ret = a;
        *n_ret = n;
        return 0;
}

/* A change to the checkpoint records: it must survive a power cut once we report it, so it commits
 * with synchronous=FULL. Takes db->lock; durable_end() commits (r >= 0) or rolls back, and returns r. */
static int durable_begin(struct chief_db *db) {
        pthread_mutex_lock(&db->lock);
        int r = exec_sql(db, "PRAGMA synchronous=FULL");
        return r >= 0 ? exec_sql(db, "BEGIN IMMEDIATE") : r;
}

static int durable_end(struct chief_db *db, int r, bool begun) {
        if (begun && r >= 0)
                r = exec_sql(db, "COMMIT");
        if (begun && r < 0)
                exec_sql(db, "ROLLBACK");
        exec_sql(db, "PRAGMA synchronous=NORMAL");
        pthread_mutex_unlock(&db->lock);
        return r;
}

static int delete_ckpt_row(struct chief_db *db, uint64_t global_step) {
        return exec_one_locked(db, "DELETE FROM checkpoints WHERE global_step = ?", bind_u64, &global_step, NULL, NULL);
}

/* Marks in kept[] the `keep` newest of rows (newest first) and every checkpoint a kept incremental
 * one needs: its parent, the parent's parent, down to the full one. */
static void keep_chains(const struct chief_db_checkpoint *rows, size_t n, uint32_t keep, bool *kept) {
        for (size_t i = 0; i < n && i < keep; i++)
                kept[i] = true;
        /* parents are older, so usually later in the list; loop until nothing changes to be sure */
        for (bool changed = true; changed;) {
                changed = false;
                for (size_t i = 0; i < n; i++) {
                        if (!kept[i] || !rows[i].incremental)
                                continue;
                        for (size_t j = 0; j < n; j++)
                                if (!kept[j] && rows[j].global_step == rows[i].parent_step) {
                                        kept[j] = changed = true;
                                        break;
                                }
                }
        }
}

int chief_db_add_checkpoint(struct chief_db *db, const struct chief_db_checkpoint *ck, uint32_t keep,
                            struct chief_db_checkpoint **removed_ret, size_t *n_removed_ret) {
        struct chief_db_checkpoint *old = NULL, *gone = NULL;
        size_t n_old = 0, n_gone = 0;
        sqlite3_stmt *st = NULL;
        int r = durable_begin(db);
        bool begun = r >= 0;
        if (r >= 0)
                r = select_ckpts(db, "SELECT " CKPT_COLUMNS " FROM checkpoints WHERE global_step = ?",
                                 (int64_t)ck->global_step, &old, &n_old);
        if (r >= 0 && n_old == 1 && strcmp(old[0].path, ck->path) != 0)
                r = push_ckpt(&gone, &n_gone, &old[0]);
        if (r >= 0) {
                int rc = sqlite3_prepare_v2(db->h, "INSERT OR REPLACE INTO checkpoints (" CKPT_COLUMNS ")"
                                            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", -1, &st, NULL);
                if (rc == SQLITE_OK) {
                        sqlite3_bind_int64(st, 1, (sqlite3_int64)ck->global_step);
                        sqlite3_bind_int64(st, 2, (sqlite3_int64)ck->time_us);
                        char stored[sizeof(ck->path)];
                        path_to_row(db, ck->path, stored, sizeof(stored));
                        sqlite3_bind_text(st, 3, stored, -1, SQLITE_TRANSIENT);
                        sqlite3_bind_int64(st, 4, (sqlite3_int64)ck->bytes);
                        sqlite3_bind_text(st, 5, ck->checksum, -1, SQLITE_TRANSIENT);
                        if (isfinite(ck->loss))
                                sqlite3_bind_double(st, 6, ck->loss);
                        else
                                sqlite3_bind_null(st, 6);
                        sqlite3_bind_int64(st, 7, (sqlite3_int64)ck->eval_step);
                        sqlite3_bind_double(st, 8, ck->eval_accuracy);
                        sqlite3_bind_double(st, 9, ck->eval_loss);
                        sqlite3_bind_text(st, 10, ck->trigger, -1, SQLITE_TRANSIENT);
                        if (ck->incremental)
                                sqlite3_bind_int64(st, 11, (sqlite3_int64)ck->parent_step);
                        else
                                sqlite3_bind_null(st, 11);
                        rc = sqlite3_step(st);
                }
                r = db_errno(db->h, rc);
                sqlite3_finalize(st);
        }
        struct chief_db_checkpoint *all = NULL;
        size_t n_all = 0;
        bool *kept = NULL;
        if (r >= 0)
                r = select_ckpts(db, "SELECT " CKPT_COLUMNS " FROM checkpoints ORDER BY time_us DESC, global_step DESC",
                                 -1, &all, &n_all);
        if (r >= 0 && n_all > keep && !(kept = calloc(n_all, sizeof(*kept))))
                r = -ENOMEM;
        if (r >= 0 && kept)
                keep_chains(all, n_all, keep, kept);
        for (size_t i = 0; r >= 0 && kept && i < n_all; i++) {
                if (kept[i])
                        continue;
                r = delete_ckpt_row(db, all[i].global_step);
                if (r >= 0)
                        r = push_ckpt(&gone, &n_gone, &all[i]);
        }
        free(kept);
        free(all);
        r = durable_end(db, r, begun);
        free(old);
        if (r < 0) {
                free(gone);
                return r;
        }
        *removed_ret = gone;
        *n_removed_ret = n_gone;
        return 0;
}

int chief_db_list_checkpoints(struct chief_db *db, struct chief_db_checkpoint **ret, size_t *n_ret) {
        pthread_mutex_lock(&db->lock);
        int r = select_ckpts(db, "SELECT " CKPT_COLUMNS " FROM checkpoints ORDER BY time_us DESC, global_step DESC", -1,
                             ret, n_ret);
        pthread_mutex_unlock(&db->lock);
        return r;
}

int chief_db_delete_checkpoint(struct chief_db *db, uint64_t global_step, struct chief_db_checkpoint *ret) {
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0;
        int r = durable_begin(db);
        bool begun = r >= 0;
        if (r >= 0)
                r = select_ckpts(db, "SELECT " CKPT_COLUMNS " FROM checkpoints WHERE global_step = ?",
                                 (int64_t)global_step, &rows, &n);
        if (r >= 0 && n == 0)
                r = -ENOENT;
        if (r >= 0)
                r = delete_ckpt_row(db, global_step);
        r = durable_end(db, r, begun);
        if (r >= 0 && ret)
                *ret = rows[0];
        free(rows);
        return r;
}

void chief_checkpoint_msg(const struct chief_db_checkpoint *row, Psfleet__V1__Checkpoint *m) {
        psfleet__v1__checkpoint__init(m);
        m->global_step = row->global_step;
        m->time_us = row->time_us;
        m->path = (char *)row->path;
        m->bytes = row->bytes;
        m->checksum = (char *)row->checksum;
        m->loss = row->loss;
        m->eval_step = row->eval_step;
        m->eval_accuracy = row->eval_accuracy;
        m->eval_loss = row->eval_loss;
        m->trigger = (char *)row->trigger;
        m->incremental = row->incremental;
        m->parent_step = row->parent_step;
}
