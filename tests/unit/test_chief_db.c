/* chiefd's SQLite record: the job's sticky state with its reason and time, the shards' losses, and
 * checkpoint paths stored relative to the state directory (with the migration of a version-2 database
 * whose rows are absolute), so that a copied state directory refers to its own files. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include "scratch_dir.h"

#include "chief_db.h"
#include "util.h"

struct fx {
        char path[sizeof(scratch_dir) + 32];
};

static int setup(void **state) {
        struct fx *f = calloc(1, sizeof(*f));
        assert_int_equal(scratch_dir_make("chief-db"), 0);
        snprintf(f->path, sizeof(f->path), "%s/chief.db", scratch_dir);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        struct fx *f = *state;
        assert_int_equal(scratch_dir_remove(state), 0);
        free(f);
        return 0;
}

static struct chief_db_checkpoint ckpt(uint64_t step, const char *path) {
        struct chief_db_checkpoint c = {.global_step = step, .time_us = 1000 + step, .bytes = 10, .loss = NAN,
                                        .eval_accuracy = -1, .eval_loss = -1};
        snprintf(c.path, sizeof(c.path), "%s", path);
        snprintf(c.checksum, sizeof(c.checksum), "crc32c:00000000");
        snprintf(c.trigger, sizeof(c.trigger), "init");
        return c;
}

/* The stored text of a checkpoint's path, read with SQLite directly. */
static void stored_path(const char *db, uint64_t step, char *buf, size_t len) {
        sqlite3 *h;
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(h, "SELECT path FROM checkpoints WHERE global_step = ?", -1, &st, NULL),
                         SQLITE_OK);
        sqlite3_bind_int64(st, 1, (sqlite3_int64)step);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        snprintf(buf, len, "%s", (const char *)sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
        sqlite3_close(h);
}

static void test_state_sticky(void **state) {
        struct fx *f = *state;
        struct chief_db *db;
        struct chief_db_job j = {.fingerprint = 0xfeedfacecafebeefULL, .state = 7, .global_step = 1234, .max_steps = 5000,
                                 .started_us = 11, .updated_us = 22, .test_accuracy = -1, .test_loss = 0.25f,
                                 .test_auc = 0.75f, .test_rmse = -1, .state_since_us = 33};
        snprintf(j.reason, sizeof(j.reason), "ps:0 not reachable for 600 s: UNAVAILABLE");
        assert_int_equal(chief_db_open(f->path, &db), 0);
        assert_int_equal(chief_db_load_job(db, &(struct chief_db_job){0}), -ENOENT);
        assert_int_equal(chief_db_save_job(db, &j), 0);
        chief_db_close(db);
        /* a new chief reads what the last one recorded */
        struct chief_db_job got;
        assert_int_equal(chief_db_open(f->path, &db), 0);
        assert_int_equal(chief_db_load_job(db, &got), 0);
        assert_int_equal(got.fingerprint, j.fingerprint);
        assert_int_equal(got.state, 7);
        assert_int_equal(got.global_step, 1234);
        assert_int_equal(got.state_since_us, 33);
        assert_string_equal(got.reason, j.reason);
        assert_true(got.test_loss == 0.25f && got.test_auc == 0.75f && got.test_rmse == -1);
        /* replaced, not appended */
        j.state = 8;
        j.reason[0] = 0;
        assert_int_equal(chief_db_save_job(db, &j), 0);
        assert_int_equal(chief_db_load_job(db, &got), 0);
        assert_int_equal(got.state, 8);
        assert_string_equal(got.reason, "");
        chief_db_close(db);
}

static void test_losses(void **state) {
        struct fx *f = *state;
        struct chief_db *db;
        struct chief_db_loss *l = (void *)1;
        size_t n = 7;
        assert_int_equal(chief_db_open(f->path, &db), 0);
        assert_int_equal(chief_db_list_losses(db, &l, &n), 0);
        assert_null(l);
        assert_int_equal(n, 0);
        assert_int_equal(chief_db_add_loss(db, &(struct chief_db_loss){5, 1, 0, 300, 300}), 0);
        assert_int_equal(chief_db_add_loss(db, &(struct chief_db_loss){6, 0, 200, 250, 50}), 0);
        chief_db_close(db);
        assert_int_equal(chief_db_open(f->path, &db), 0);
        assert_int_equal(chief_db_list_losses(db, &l, &n), 0);
        assert_int_equal(n, 2);
        assert_int_equal(l[0].shard, 1);
        assert_int_equal(l[0].steps_lost, 300);
        assert_int_equal(l[1].shard, 0);
        assert_int_equal(l[1].restored_step, 200);
        assert_int_equal(l[1].job_step, 250);
        assert_int_equal(l[1].steps_lost, 50);
        assert_int_equal(l[1].time_us, 6);
        free(l);
        chief_db_close(db);
}

/* A worker's loss is recorded as it was, a non-finite one too (never as 0 or a refused row). */
static void test_progress_loss(void **state) {
        struct fx *f = *state;
        struct chief_db *db;
        const float losses[] = {0.25f, NAN, INFINITY, -INFINITY};
        assert_int_equal(chief_db_open(f->path, &db), 0);
        for (uint32_t w = 0; w < 4; w++) {
                struct chief_db_progress p = {.time_us = 10 + w, .worker = w, .local_step = 50, .global_step = 100,
                                              .loss = losses[w], .examples_per_s = 1000, .examples = 3200,
                                              .state = w ? "diverged: a non-finite loss" : "training"};
                assert_int_equal(chief_db_add_progress(db, &p), 0);
        }
        chief_db_close(db);
        assert_int_equal(chief_db_open(f->path, &db), 0);
        for (uint32_t w = 0; w < 4; w++) {
                struct chief_db_progress p;
                char st[64];
                assert_int_equal(chief_db_last_progress(db, w, &p, st, sizeof(st)), 0);
                assert_int_equal(p.global_step, 100);
                if (isnan(losses[w]))
                        assert_true(isnan(p.loss));
                else
                        assert_true(p.loss == losses[w]);
        }
        chief_db_close(db);
}

static void test_relative_paths(void **state) {
        struct fx *f = *state;
        struct chief_db *db;
        char inside[sizeof(scratch_dir) + 64], stored[sizeof(inside)];
        snprintf(inside, sizeof(inside), "%s/checkpoints/ckpt-0000000010.safetensors", scratch_dir);
        assert_int_equal(chief_db_open(f->path, &db), 0);
        assert_string_equal(chief_db_dir(db), scratch_dir);
        struct chief_db_checkpoint *gone = NULL, *rows = NULL;
        size_t n_gone = 0, n = 0;
        struct chief_db_checkpoint a = ckpt(10, inside), b = ckpt(20, "/elsewhere/ckpt-0000000020.safetensors");
        assert_int_equal(chief_db_add_checkpoint(db, &a, 5, &gone, &n_gone), 0);
        free(gone);
        assert_int_equal(chief_db_add_checkpoint(db, &b, 5, &gone, &n_gone), 0);
        free(gone);
        /* under the directory: relative; elsewhere: as given */
        stored_path(f->path, 10, stored, sizeof(stored));
        assert_string_equal(stored, "checkpoints/ckpt-0000000010.safetensors");
        stored_path(f->path, 20, stored, sizeof(stored));
        assert_string_equal(stored, "/elsewhere/ckpt-0000000020.safetensors");
        /* read back absolute */
        assert_int_equal(chief_db_list_checkpoints(db, &rows, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(rows[1].path, inside);
        assert_string_equal(rows[0].path, "/elsewhere/ckpt-0000000020.safetensors");
        free(rows);
        struct chief_db_checkpoint del;
        assert_int_equal(chief_db_delete_checkpoint(db, 10, &del), 0);
        assert_string_equal(del.path, inside);
        chief_db_close(db);
}

/* Read-only, for psfleet with the chief down: the rows with their paths made absolute, both while a
 * writer holds the database (WAL) and after it closed in a directory we may not write; no writes;
 * no file created where none is. */
static void test_readonly(void **state) {
        struct fx *f = *state;
        struct chief_db *db, *ro;
        char inside[sizeof(scratch_dir) + 64], missing[sizeof(f->path) + 8];
        snprintf(inside, sizeof(inside), "%s/checkpoints/ckpt-0000000010.safetensors", scratch_dir);
        snprintf(missing, sizeof(missing), "%s/none.db", scratch_dir);
        assert_true(chief_db_open_readonly(missing, &ro) < 0);
        assert_int_equal(access(missing, F_OK), -1);
        assert_int_equal(chief_db_open(f->path, &db), 0);
        struct chief_db_checkpoint *gone = NULL, *rows = NULL, a = ckpt(10, inside);
        size_t n_gone = 0, n = 0;
        assert_int_equal(chief_db_add_checkpoint(db, &a, 5, &gone, &n_gone), 0);
        free(gone);
        for (int pass = 0; pass < 2; pass++) {
                if (pass == 1) {
                        db = chief_db_close(db);
                        assert_int_equal(chmod(scratch_dir, 0500), 0);
                }
                assert_int_equal(chief_db_open_readonly(f->path, &ro), 0);
                assert_int_equal(chief_db_list_checkpoints(ro, &rows, &n), 0);
                assert_int_equal(n, 1);
                assert_string_equal(rows[0].path, inside);
                free(rows);
                struct chief_db_checkpoint b = ckpt(20, inside);
                assert_true(chief_db_add_checkpoint(ro, &b, 5, &gone, &n_gone) < 0);
                chief_db_close(ro);
        }
        assert_int_equal(chmod(scratch_dir, 0700), 0);
}

/* A version-2 database (absolute paths, no reason): opened, its rows under the directory become
 * relative, the job row gains an empty reason and no AUC or RMSE (-1). */
static void test_migration(void **state) {
        struct fx *f = *state;
        sqlite3 *h;
        char sql[2048], stored[256];
        snprintf(sql, sizeof(sql),
                 "CREATE TABLE job (id INTEGER PRIMARY KEY CHECK (id = 1), fingerprint TEXT NOT NULL, state INTEGER NOT NULL,"
                 " global_step INTEGER NOT NULL, max_steps INTEGER NOT NULL, started_us INTEGER NOT NULL,"
                 " updated_us INTEGER NOT NULL, test_accuracy REAL NOT NULL, test_loss REAL NOT NULL, wall_s REAL NOT NULL);"
                 "INSERT INTO job VALUES (1, '0000000000000001', 6, 100, 100, 1, 2, 0.5, 0.4, 3.0);"
                 "CREATE TABLE checkpoints (global_step INTEGER PRIMARY KEY, time_us INTEGER NOT NULL, path TEXT NOT NULL,"
                 " bytes INTEGER NOT NULL, checksum TEXT NOT NULL, loss REAL, eval_step INTEGER NOT NULL,"
                 " eval_accuracy REAL NOT NULL, eval_loss REAL NOT NULL, trigger TEXT NOT NULL);"
                 "INSERT INTO checkpoints VALUES (5, 1, '%s/checkpoints/ckpt-0000000005.safetensors', 1, 'c', NULL, 0, -1, -1, 'steps');"
                 "INSERT INTO checkpoints VALUES (6, 2, '%s-other/ckpt-0000000006.safetensors', 1, 'c', NULL, 0, -1, -1, 'steps');"
                 "PRAGMA user_version=2;",
                 scratch_dir, scratch_dir);
        assert_int_equal(sqlite3_open(f->path, &h), SQLITE_OK);
        assert_int_equal(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(h);

        struct chief_db *db;
        struct chief_db_job j;
        assert_int_equal(chief_db_open(f->path, &db), 0);
        assert_int_equal(chief_db_load_job(db, &j), 0);
        assert_int_equal(j.state, 6);
        assert_string_equal(j.reason, "");
        assert_true(j.test_accuracy == 0.5f && j.test_auc == -1 && j.test_rmse == -1);   /* version 4's columns */
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0;
        assert_int_equal(chief_db_list_checkpoints(db, &rows, &n), 0);   /* version 5's parent_step */
        assert_int_equal(n, 2);
        assert_false(rows[0].incremental || rows[1].incremental);
        free(rows);
        chief_db_close(db);
        stored_path(f->path, 5, stored, sizeof(stored));
        assert_string_equal(stored, "checkpoints/ckpt-0000000005.safetensors");
        /* a sibling directory that merely shares the prefix stays absolute */
        stored_path(f->path, 6, stored, sizeof(stored));
        char want[sizeof(scratch_dir) + 64];
        snprintf(want, sizeof(want), "%s-other/ckpt-0000000006.safetensors", scratch_dir);
        assert_string_equal(stored, want);
        /* opening again changes nothing */
        assert_int_equal(chief_db_open(f->path, &db), 0);
        chief_db_close(db);
        stored_path(f->path, 5, stored, sizeof(stored));
        assert_string_equal(stored, "checkpoints/ckpt-0000000005.safetensors");
}

/* Pruning keeps what a kept incremental checkpoint is chained to: 10 full, 20 and 30 increments of
 * it, 40 full; keep 2 (30 and 40) keeps 20 and 10 too; the parent survives a reopen. */
static void test_prune_keeps_chains(void **state) {
        struct fx *f = *state;
        struct chief_db *db;
        struct chief_db_checkpoint *gone = NULL, *rows = NULL;
        size_t n_gone = 0, n = 0;
        assert_int_equal(chief_db_open(f->path, &db), 0);
        struct chief_db_checkpoint c[5] = {ckpt(5, "/x/5"), ckpt(10, "/x/10"), ckpt(20, "/x/20"), ckpt(30, "/x/30"),
                                           ckpt(40, "/x/40")};
        c[2].incremental = c[3].incremental = true;
        c[2].parent_step = 10;
        c[3].parent_step = 20;
        for (int i = 0; i < 4; i++) {
                assert_int_equal(chief_db_add_checkpoint(db, &c[i], 2, &gone, &n_gone), 0);
                free(gone);
        }
        /* keep 2 at step 30: 30 and 20 by age, 10 for the chain; 5 goes */
        assert_int_equal(chief_db_list_checkpoints(db, &rows, &n), 0);
        assert_int_equal(n, 3);
        assert_int_equal(rows[0].global_step, 30);
        assert_true(rows[0].incremental);
        assert_int_equal(rows[0].parent_step, 20);
        assert_false(rows[2].incremental);
        free(rows);
        assert_int_equal(chief_db_add_checkpoint(db, &c[4], 2, &gone, &n_gone), 0);
        assert_int_equal(n_gone, 0);   /* 40 and 30 kept, and 30's chain */
        free(gone);
        /* keep 1 at a later full one: the chain goes */
        struct chief_db_checkpoint c50 = ckpt(50, "/x/50");
        assert_int_equal(chief_db_add_checkpoint(db, &c50, 1, &gone, &n_gone), 0);
        assert_int_equal(n_gone, 4);
        free(gone);
        chief_db_close(db);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test_setup_teardown(test_state_sticky, setup, teardown),
        cmocka_unit_test_setup_teardown(test_losses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_progress_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relative_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_readonly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune_keeps_chains, setup, teardown))
