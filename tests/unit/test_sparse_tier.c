/* The disk tier of sparse_table (sparse_tier.c): rows past max_rows move to disk and back bit for bit;
 * a tiered table trains exactly as an unbounded one; walks give the rows on disk once each, the
 * changed ones for an increment; clear empties the disk; eviction by age reaches the disk; writes
 * failing (injected) refuse new rows and corrupt none; a tier directory that cannot be made is refused. */
#include <errno.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "unit.h"

#include "rng.h"
#include "sparse_table.h"
#include "sparse_tier.h"

enum { D = 8, CAP = 64 * 8, IDS = 4000 };

static char dir[64];

static int setup(void **state)
{
        (void)state;
        snprintf(dir, sizeof(dir), "/tmp/psfleet-tier-XXXXXX");
        return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
        (void)state;
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        return system(cmd) == 0 ? 0 : -1;
}

static struct sparse_table *table(uint64_t max_rows, const char *tier, enum sparse_evict_policy pol)
{
        struct sparse_table_opts o = {.dim = D, .optimizer = SPARSE_ADAGRAD, .init_stddev = 0.1, .seed = 3,
                                      .initial_accumulator = 0.1, .max_rows = max_rows, .evict_policy = pol,
                                      .tier_dir = tier, .tier_ops = &sparse_tier_rocksdb};
        struct sparse_table *t = NULL;
        assert_int_equal(sparse_table_new(&o, &t), 0);
        return t;
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

/* The same pulls and pushes of random ids (some steps with an id twice) on both tables. */
static void train(struct sparse_table *a, struct sparse_table *b, uint64_t seed, int steps, uint64_t n_ids)
{
        enum { B = 64 };
        uint64_t ids[B];
        static float rows_a[B * D], rows_b[B * D], g[B * D];
        struct rng r;
        rng_init(&r, seed, 0);
        for (int s = 1; s <= steps; s++) {
                for (int i = 0; i < B; i++)
                        ids[i] = rng_below(&r, n_ids) * 7919;   /* sparse ids, not 0..n */
                assert_int_equal(sparse_table_pull(a, ids, B, rows_a, true, (uint64_t)s), 0);
                if (b)
                        assert_int_equal(sparse_table_pull(b, ids, B, rows_b, true, (uint64_t)s), 0);
                if (b)
                        assert_memory_equal(rows_a, rows_b, sizeof(rows_a));
                for (int i = 0; i < B * D; i++)
                        g[i] = (float)(rng_normal(&r) * 0.1);
                assert_int_equal(sparse_table_push(a, ids, B, g, 0.05f, (uint64_t)s), 0);
                if (b)
                        assert_int_equal(sparse_table_push(b, ids, B, g, 0.05f, (uint64_t)s), 0);
        }
}

/* Every row of t: ids sorted, values and slots by id into vals (n x 2D). Returns n. */
static size_t dump(struct sparse_table *t, uint64_t *ids, float *vals, size_t cap)
{
        enum { PAGE = 100 };
        static uint64_t pid[PAGE];
        static float pv[PAGE * D], ps[PAGE * D];
        uint64_t cur = 0;
        size_t n = 0, k;
        while ((k = sparse_table_export(t, &cur, PAGE, pid, pv, ps)) > 0) {
                for (size_t i = 0; i < k; i++) {
                        assert_true(n < cap);
                        ids[n] = pid[i];
                        memcpy(vals + n * 2 * D, pv + i * D, D * sizeof(float));
                        memcpy(vals + n * 2 * D + D, ps + i * D, D * sizeof(float));
                        n++;
                }
        }
        /* sort the (id, row) pairs by id through an index */
        size_t *ord = malloc(n * sizeof(*ord));
        uint64_t *key = malloc(n * 2 * sizeof(*key));
        float *v2 = malloc(n * 2 * D * sizeof(float));
        for (size_t i = 0; i < n; i++)
                key[2 * i] = ids[i], key[2 * i + 1] = i;
        qsort(key, n, 2 * sizeof(*key), cmp_u64);
        for (size_t i = 0; i < n; i++) {
                ord[i] = (size_t)key[2 * i + 1];
                ids[i] = key[2 * i];
                memcpy(v2 + i * 2 * D, vals + ord[i] * 2 * D, 2 * D * sizeof(float));
        }
        memcpy(vals, v2, n * 2 * D * sizeof(float));
        free(ord);
        free(key);
        free(v2);
        return n;
}

/* A table bounded to CAP rows in DRAM with a tier trains bit for bit as an unbounded one, and its
 * export holds every row, those on disk too. */
static void test_same_as_unbounded(void **state)
{
        (void)state;
        struct sparse_table *tiered = table(CAP, dir, SPARSE_EVICT_LRU), *flat = table(0, NULL, SPARSE_EVICT_AGE);
        train(tiered, flat, 1, 300, IDS);
        struct sparse_table_stats st;
        sparse_table_get_stats(tiered, &st);
        assert_true(st.rows <= CAP);
        assert_true(st.tier_spills > 0);
        assert_true(st.tier_reads > 0);
        assert_true(st.tier_rows > 0);
        assert_int_equal(st.rows + st.tier_rows, sparse_table_rows(flat));
        assert_int_equal(st.evicted_limit, 0);
        assert_int_equal(st.tier_errors, 0);
        assert_true(st.tier_bytes > 0);

        static uint64_t ia[IDS + 1], ib[IDS + 1];
        static float va[(IDS + 1) * 2 * D], vb[(IDS + 1) * 2 * D];
        size_t na = dump(tiered, ia, va, IDS + 1), nb = dump(flat, ib, vb, IDS + 1);
        assert_int_equal(na, nb);
        assert_memory_equal(ia, ib, na * sizeof(ia[0]));
        assert_memory_equal(va, vb, na * 2 * D * sizeof(va[0]));
        sparse_table_free(tiered);
        sparse_table_free(flat);
}

/* Pages of a walk with rows moving between DRAM and disk between them: no id twice, every row that
 * was there before the walk given. */
static void test_walk_moving(void **state)
{
        (void)state;
        enum { PAGE = 10 };
        struct sparse_table *t = table(CAP, dir, SPARSE_EVICT_LRU);
        train(t, NULL, 2, 200, IDS);
        size_t before = sparse_table_rows(t);
        struct sparse_table_stats st;
        sparse_table_get_stats(t, &st);
        before += st.tier_rows;
        static uint64_t got[4 * IDS];
        static float w[PAGE * D];
        uint64_t cur = 0, reads0 = st.tier_reads;
        size_t n = 0, k;
        struct rng r;
        rng_init(&r, 9, 0);
        uint64_t step = 1000;
        while ((k = sparse_table_export(t, &cur, PAGE, got + n, w, NULL)) > 0) {
                n += k;
                assert_true(n + PAGE <= 4 * IDS);
                for (int j = 0; j < 20; j++, step++) {
                        uint64_t id = rng_below(&r, IDS) * 7919;   /* only ids made before: none new */
                        assert_int_equal(sparse_table_pull(t, &id, 1, w, false, step), 0);
                        assert_int_equal(sparse_table_push(t, &id, 1, w, 0.0f, step), 0);
                }
        }
        sparse_table_get_stats(t, &st);
        assert_true(st.tier_reads > reads0);   /* rows did move during the walk */
        qsort(got, n, sizeof(got[0]), cmp_u64);
        for (size_t i = 1; i < n; i++)
                assert_true(got[i] != got[i - 1]);
        assert_true(n >= before);
        sparse_table_free(t);
}

/* An increment holds exactly the rows changed since the last cleaning walk, those that went to disk
 * while changed too; a second increment right after is empty. */
static void test_incremental(void **state)
{
        (void)state;
        enum { PAGE = 64 };
        struct sparse_table_opts o = {.dim = D, .optimizer = SPARSE_SGD, .init_stddev = 0.1, .seed = 3,
                                      .max_rows = CAP, .evict_policy = SPARSE_EVICT_LRU, .tier_dir = dir,
                                      .tier_ops = &sparse_tier_rocksdb};
        struct sparse_table *t = NULL;
        assert_int_equal(sparse_table_new(&o, &t), 0);
        sparse_table_track(t, true);
        static uint64_t ids[IDS], got[2 * IDS];
        static float rows[IDS * D], w[PAGE * D];
        for (uint64_t i = 0; i < IDS; i++)
                ids[i] = i;
        assert_int_equal(sparse_table_pull(t, ids, IDS, rows, true, 1), 0);
        uint64_t cur = 0;
        size_t n = 0, k;
        while ((k = sparse_table_export_changes(t, &cur, PAGE, got + n, w, NULL, false, true)) > 0)
                n += k;
        assert_int_equal(n, IDS);
        /* change 100 ids, then push them out of DRAM by touching 2 * CAP others after */
        uint64_t changed[100];
        for (int i = 0; i < 100; i++)
                changed[i] = (uint64_t)i * 37;
        memset(rows, 0, sizeof(rows));
        rows[0] = 1;
        assert_int_equal(sparse_table_push(t, changed, 100, rows, 0.1f, 2), 0);
        assert_int_equal(sparse_table_pull(t, ids + 2000, 2 * CAP, rows, true, 3), 0);
        struct sparse_table_stats st;
        sparse_table_get_stats(t, &st);
        assert_true(st.tier_rows > IDS - CAP - 1);
        cur = 0, n = 0;
        while ((k = sparse_table_export_changes(t, &cur, PAGE, got + n, w, NULL, true, true)) > 0)
                n += k;
        assert_int_equal(n, 100);
        qsort(got, n, sizeof(got[0]), cmp_u64);
        for (int i = 0; i < 100; i++)
                assert_int_equal(got[i], changed[i]);
        cur = 0, n = 0;
        while ((k = sparse_table_export_changes(t, &cur, PAGE, got + n, w, NULL, true, true)) > 0)
                n += k;
        assert_int_equal(n, 0);
        uint64_t *gone = NULL;
        size_t n_gone = 9;
        assert_int_equal(sparse_table_take_evicted(t, &gone, &n_gone), 0);
        assert_int_equal(n_gone, 0);   /* moving to disk is no eviction */
        free(gone);
        sparse_table_free(t);
}

/* clear empties DRAM and disk: every id starts again at its initial row. */
static void test_clear(void **state)
{
        (void)state;
        struct sparse_table *t = table(CAP, dir, SPARSE_EVICT_AGE);
        train(t, NULL, 3, 100, IDS);
        struct sparse_table_stats st;
        sparse_table_get_stats(t, &st);
        assert_true(st.tier_rows > 0);
        sparse_table_clear(t);
        sparse_table_get_stats(t, &st);
        assert_int_equal(st.tier_rows, 0);
        assert_int_equal(st.rows, 0);
        uint64_t cur = 0, id;
        float row[D], init[D];
        assert_int_equal(sparse_table_export(t, &cur, 1, &id, row, NULL), 0);
        for (uint64_t i = 0; i < IDS; i += 97) {
                id = i * 7919;
                assert_int_equal(sparse_table_pull(t, &id, 1, row, false, 1), 0);
                sparse_table_init_row(t, id, init);
                assert_memory_equal(row, init, sizeof(row));
        }
        assert_int_equal(st.tier_errors, 0);
        sparse_table_free(t);
}

/* evict_after_steps removes rows on disk for good: counted, noted as gone. */
static void test_evict_age(void **state)
{
        (void)state;
        struct sparse_table *t = table(CAP, dir, SPARSE_EVICT_AGE);
        sparse_table_track(t, true);
        static uint64_t ids[IDS];
        static float rows[IDS * D];
        for (uint64_t i = 0; i < IDS; i++)
                ids[i] = i;
        assert_int_equal(sparse_table_pull(t, ids, 2000, rows, true, 1), 0);        /* old: most on disk */
        assert_int_equal(sparse_table_pull(t, ids + 2000, 100, rows, true, 50), 0); /* recent */
        assert_int_equal(sparse_table_evict(t, 60, 20), 2000);
        struct sparse_table_stats st;
        sparse_table_get_stats(t, &st);
        assert_int_equal(st.tier_rows + st.rows, 100);
        uint64_t *gone = NULL;
        size_t n_gone = 0;
        assert_int_equal(sparse_table_take_evicted(t, &gone, &n_gone), 0);
        assert_int_equal(n_gone, 2000);
        free(gone);
        sparse_table_free(t);
}

/* The disk failing (writes refused, as when full): new rows are refused with their initial row and
 * their gradients dropped, rows on disk give their stored values and stay there, rows in DRAM go on
 * training; nothing already stored changes but by a push applied in DRAM; once the disk works again
 * the table goes on as before. */
static void test_disk_fails(void **state)
{
        (void)state;
        enum { N = 2000, NEW = 100 };
        struct sparse_table *t = table(CAP, dir, SPARSE_EVICT_LRU), *ref = table(0, NULL, SPARSE_EVICT_AGE);
        static uint64_t ids[N + NEW], ia[N + NEW];
        static float rows[(N + NEW) * D], ref_rows[(N + NEW) * D], g[(N + NEW) * D];
        static float va[(N + NEW) * 2 * D];
        for (uint64_t i = 0; i < N + NEW; i++)
                ids[i] = i;
        for (size_t i = 0; i < (N + NEW) * D; i++)
                g[i] = 0.01f * (float)(i % 7);
        assert_int_equal(sparse_table_pull(t, ids, N, rows, true, 1), 0);
        assert_int_equal(sparse_table_pull(ref, ids, N, ref_rows, true, 1), 0);
        struct sparse_table_stats st0, st;
        sparse_table_get_stats(t, &st0);
        assert_true(st0.tier_rows > 0);

        sparse_tier_fail_writes(sparse_table_tier(t), -ENOSPC);
        /* every id again, old and new: old ones give their rows whether in DRAM or on disk */
        assert_int_equal(sparse_table_pull(t, ids, N + NEW, rows, true, 2), 0);
        assert_memory_equal(rows, ref_rows, N * D * sizeof(float));
        for (uint64_t i = N; i < N + NEW; i++) {
                float init[D];
                sparse_table_init_row(t, i, init);
                assert_memory_equal(rows + i * D, init, sizeof(init));
        }
        sparse_table_get_stats(t, &st);
        assert_true(st.tier_errors > st0.tier_errors);
        assert_true(st.tier_refused >= NEW);
        assert_int_equal(st.tier_rows + st.rows, N);   /* nothing made, nothing lost */
        char why[128];
        sparse_table_tier_error(t, why, sizeof(why));
        assert_non_null(strstr(why, "injected"));
        /* pushes: applied to rows in DRAM, dropped (counted) for rows on disk and new ids */
        uint64_t dropped0 = st.grads_dropped;
        assert_int_equal(sparse_table_push(t, ids, N + NEW, g, 0.1f, 3), 0);
        sparse_table_get_stats(t, &st);
        assert_int_equal(st.grads_dropped - dropped0, st.tier_rows + NEW);
        /* each row is the reference's before the push (dropped) or after it (applied), values and slot */
        static float vr0[N * 2 * D], vr1[N * 2 * D];
        static uint64_t ir[N];
        assert_int_equal(dump(ref, ir, vr0, N), N);
        assert_int_equal(sparse_table_push(ref, ids, N, g, 0.1f, 3), 0);
        assert_int_equal(dump(ref, ir, vr1, N), N);

        sparse_tier_fail_writes(sparse_table_tier(t), 0);
        assert_int_equal(sparse_table_pull(t, ids + N, NEW, rows, true, 4), 0);
        sparse_table_get_stats(t, &st);
        assert_int_equal(st.tier_rows + st.rows, N + NEW);
        size_t na = dump(t, ia, va, N + NEW), kept = 0;
        assert_int_equal(na, N + NEW);
        for (size_t i = 0; i < N; i++) {
                assert_int_equal(ia[i], ir[i]);
                bool before = memcmp(va + i * 2 * D, vr0 + i * 2 * D, 2 * D * sizeof(float)) == 0;
                bool after = memcmp(va + i * 2 * D, vr1 + i * 2 * D, 2 * D * sizeof(float)) == 0;
                assert_true(before || after);
                kept += before;
        }
        assert_int_equal(kept + NEW, st.grads_dropped - dropped0);
        sparse_table_free(t);
        sparse_table_free(ref);
}

/* A tier directory that cannot be made (under a regular file: fails as root too) is refused. */
static void test_unwritable(void **state)
{
        (void)state;
        char file[96], sub[128];
        snprintf(file, sizeof(file), "%s/plain", dir);
        FILE *f = fopen(file, "w");
        assert_non_null(f);
        fclose(f);
        snprintf(sub, sizeof(sub), "%s/tier", file);
        struct sparse_table_opts o = {.dim = D, .optimizer = SPARSE_SGD, .max_rows = CAP, .tier_dir = sub,
                                      .tier_ops = &sparse_tier_rocksdb};
        struct sparse_table *t = NULL;
        assert_int_equal(sparse_table_new(&o, &t), -ENOTDIR);
        assert_null(t);
        o.tier_ops = NULL;   /* a tier needs its store's functions */
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        struct sparse_tier *tier = NULL;
        assert_int_equal(sparse_tier_open(file, &tier), -ENOTDIR);
}

UNIT_TEST_MAIN(setup, teardown, cmocka_unit_test(test_same_as_unbounded), cmocka_unit_test(test_walk_moving),
               cmocka_unit_test(test_incremental), cmocka_unit_test(test_clear), cmocka_unit_test(test_evict_age),
               cmocka_unit_test(test_disk_fails), cmocka_unit_test(test_unwritable))
