/* sparse_table: rows start as a function of (seed, id) alone; pull and push with each optimizer against
 * the dense kernels and hand-computed values; export/import round trips; eviction, clear, growth,
 * threads without lost updates; the shard of an id; the bytes held. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "optim.h"
#include "rng.h"
#include "sparse_table.h"

static struct sparse_table *table(enum sparse_optimizer opt, uint32_t dim, double stddev, uint64_t seed)
{
        struct sparse_table_opts o = {.dim = dim, .optimizer = opt, .init_stddev = stddev, .seed = seed,
                                      .initial_accumulator = 0.1, .ftrl_lr_power = -0.5};
        struct sparse_table *t = NULL;
        assert_int_equal(sparse_table_new(&o, &t), 0);
        return t;
}

static void test_names(void **state)
{
        assert_string_equal(sparse_optimizer_name(SPARSE_SGD), "sgd");
        assert_string_equal(sparse_optimizer_name(SPARSE_ADAGRAD), "adagrad");
        assert_string_equal(sparse_optimizer_name(SPARSE_FTRL), "ftrl");
        assert_int_equal(sparse_optimizer_n_slots(SPARSE_SGD), 0);
        assert_int_equal(sparse_optimizer_n_slots(SPARSE_ADAGRAD), 1);
        assert_int_equal(sparse_optimizer_n_slots(SPARSE_FTRL), 2);
        assert_null(sparse_optimizer_slot_name(SPARSE_SGD, 0));
        assert_string_equal(sparse_optimizer_slot_name(SPARSE_ADAGRAD, 0), "accumulator");
        assert_null(sparse_optimizer_slot_name(SPARSE_ADAGRAD, 1));
        assert_string_equal(sparse_optimizer_slot_name(SPARSE_FTRL, 0), "accum");
        assert_string_equal(sparse_optimizer_slot_name(SPARSE_FTRL, 1), "linear");
        assert_null(sparse_optimizer_slot_name(SPARSE_FTRL, 2));
}

static void test_new_invalid(void **state)
{
        struct sparse_table *t = NULL;
        struct sparse_table_opts ok = {.dim = 4, .optimizer = SPARSE_FTRL, .ftrl_lr_power = -0.5};
        struct sparse_table_opts o = ok;
        o.dim = 0;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        o.dim = 1025;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        o = ok, o.optimizer = (enum sparse_optimizer)7;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        o = ok, o.init_stddev = -1;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        o = ok, o.init_stddev = NAN;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        o = ok, o.initial_accumulator = -0.1;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        o = ok, o.optimizer = SPARSE_ADAGRAD;   /* an accumulator starting at 0 needs an epsilon */
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        o.epsilon = 1e-7;
        assert_int_equal(sparse_table_new(&o, &t), 0);
        t = sparse_table_free(t);
        o = ok, o.ftrl_lr_power = 0.5;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        o = ok, o.ftrl_l1 = -1;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        assert_null(t);
        o = ok, o.dim = 1024;
        assert_int_equal(sparse_table_new(&o, &t), 0);
        assert_int_equal(sparse_table_dim(t), 1024);
        assert_int_equal(sparse_table_options(t)->optimizer, SPARSE_FTRL);
        assert_null(sparse_table_free(t));
        assert_null(sparse_table_free(NULL));
}

/* Two tables filled in opposite orders hold the same rows; a third seed gives other rows; the values are
 * a truncated normal of the given stddev. */
static void test_init(void **state)
{
        enum { N = 3000, D = 8 };
        struct sparse_table *a = table(SPARSE_SGD, D, 0.5, 42), *b = table(SPARSE_SGD, D, 0.5, 42);
        struct sparse_table *c = table(SPARSE_SGD, D, 0.5, 43);
        static uint64_t ids[N], rev[N];
        static float ra[N * D], rb[N * D], rc[N * D], one[D];
        for (int i = 0; i < N; i++)
                ids[i] = (uint64_t)i * 0x9e3779b97f4a7c15ULL, rev[N - 1 - i] = ids[i];
        assert_int_equal(sparse_table_pull(a, ids, N, ra, true, 1), 0);
        assert_int_equal(sparse_table_pull(b, rev, N, rb, true, 1), 0);
        assert_int_equal(sparse_table_pull(b, ids, N, rb, false, 2), 0);
        assert_memory_equal(ra, rb, sizeof(ra));
        assert_int_equal(sparse_table_pull(c, ids, N, rc, true, 1), 0);
        size_t same = 0;
        double sum = 0, sq = 0;
        for (int i = 0; i < N * D; i++) {
                same += ra[i] == rc[i];
                assert_true(fabsf(ra[i]) <= 1.0f);   /* 2 sigma */
                sum += ra[i], sq += (double)ra[i] * ra[i];
        }
        assert_true(same < 10);
        /* a normal truncated at 2 sigma has a stddev of 0.8796 sigma */
        double mean = sum / (N * D), sd = sqrt(sq / (N * D) - mean * mean);
        assert_true(fabs(mean) < 0.01);
        assert_float_equal(sd, 0.8796 * 0.5, 0.01);
        sparse_table_init_row(a, ids[17], one);
        assert_memory_equal(one, ra + 17 * D, sizeof(one));
        sparse_table_free(a);
        sparse_table_free(b);
        sparse_table_free(c);

        struct sparse_table *z = table(SPARSE_ADAGRAD, D, 0, 42);
        sparse_table_init_row(z, 5, one);
        for (int j = 0; j < D; j++)
                assert_float_equal(one[j], 0.0, 0);
        sparse_table_free(z);
}

static void test_pull_create(void **state)
{
        struct sparse_table *t = table(SPARSE_SGD, 4, 0.1, 7);
        uint64_t ids[3] = {10, 20, 10};
        float rows[12], init[4];
        assert_int_equal(sparse_table_pull(t, ids, 3, rows, false, 1), 0);
        assert_int_equal(sparse_table_rows(t), 0);
        sparse_table_init_row(t, 10, init);
        assert_memory_equal(rows, init, sizeof(init));
        assert_memory_equal(rows + 8, init, sizeof(init));
        assert_int_equal(sparse_table_pull(t, ids, 3, rows, true, 1), 0);
        assert_int_equal(sparse_table_rows(t), 2);
        assert_memory_equal(rows, init, sizeof(init));
        /* a pushed row is what a pull, creating or not, gives */
        float g[4] = {1, 2, 3, 4};
        assert_int_equal(sparse_table_push(t, ids, 1, g, 0.5f, 2), 0);
        assert_int_equal(sparse_table_pull(t, ids, 1, rows, false, 3), 0);
        for (int j = 0; j < 4; j++)
                assert_float_equal(rows[j], init[j] - 0.5f * g[j], 0);
        assert_int_equal(sparse_table_pull(t, ids, 0, rows, true, 3), 0);
        sparse_table_free(t);
}

static void test_push_sgd(void **state)
{
        struct sparse_table *t = table(SPARSE_SGD, 3, 0.2, 1);
        uint64_t ids[3] = {5, 9, 5};   /* 5 twice: applied twice */
        float g[9] = {1, 2, 3, -1, 0, 1, 0.5f, 0.5f, 0.5f}, w[6], i5[3], i9[3];
        sparse_table_init_row(t, 5, i5);
        sparse_table_init_row(t, 9, i9);
        assert_int_equal(sparse_table_push(t, ids, 3, g, 0.1f, 1), 0);
        assert_int_equal(sparse_table_rows(t), 2);
        assert_int_equal(sparse_table_pull(t, ids, 2, w, false, 1), 0);
        for (int j = 0; j < 3; j++) {
                assert_float_equal(w[j], (i5[j] - 0.1f * g[j]) - 0.1f * g[6 + j], 0);
                assert_float_equal(w[3 + j], i9[j] - 0.1f * g[3 + j], 0);
        }
        sparse_table_free(t);
}

/* The sparse row's numbers are the dense path's: optim_adagrad on the same numbers, bit for bit. */
static void test_push_adagrad(void **state)
{
        enum { D = 19 };
        for (int e = 0; e < 2; e++) {
                struct sparse_table_opts o = {.dim = D, .optimizer = SPARSE_ADAGRAD, .init_stddev = 0.3,
                                              .seed = 9, .initial_accumulator = 0.1, .epsilon = e ? 1e-7 : 0};
                struct sparse_table *t = NULL;
                assert_int_equal(sparse_table_new(&o, &t), 0);
                float w[D], acc[D], g[D], got[D], gacc[D];
                uint64_t id = 123456789;
                sparse_table_init_row(t, id, w);
                for (int j = 0; j < D; j++)
                        acc[j] = 0.1f;
                for (int step = 0; step < 3; step++) {
                        for (int j = 0; j < D; j++)
                                g[j] = (float)((j * 7 + step * 3) % 11 - 5) * 0.1f;
                        assert_int_equal(sparse_table_push(t, &id, 1, g, 0.05f, (uint64_t)step), 0);
                        optim_adagrad(w, g, acc, D, 0.05f, (float)o.epsilon);
                }
                uint64_t cur = 0, got_id;
                assert_int_equal(sparse_table_export(t, &cur, 1, &got_id, got, gacc), 1);
                assert_int_equal(got_id, id);
                assert_memory_equal(got, w, sizeof(w));
                assert_memory_equal(gacc, acc, sizeof(acc));
                sparse_table_free(t);
        }
        struct sparse_table *h = table(SPARSE_ADAGRAD, 1, 0, 0);
        uint64_t id = 1;
        float g = 0.3f, w;
        assert_int_equal(sparse_table_push(h, &id, 1, &g, 0.1f, 0), 0);
        assert_int_equal(sparse_table_pull(h, &id, 1, &w, false, 0), 0);
        /* acc = 0.1 + 0.09 = 0.19; w = 0 - 0.1 * 0.3 / sqrt(0.19) = -0.0688247 */
        assert_float_equal(w, -0.0688247, 1e-6);
        sparse_table_free(h);
}

/* TF's FtrlOptimizer from w 0, n 0.1, z 0: lr 0.1, l1 0.01, l2 0.02, g 0.3 then -0.2 (test_optim's
 * hand computation: w -0.0659256, then -0.0245677), and the row against optim_ftrl itself. */
static void test_push_ftrl(void **state)
{
        struct sparse_table_opts o = {.dim = 2, .optimizer = SPARSE_FTRL, .initial_accumulator = 0.1,
                                      .ftrl_l1 = 0.01, .ftrl_l2 = 0.02, .ftrl_lr_power = -0.5};
        struct sparse_table *t = NULL;
        assert_int_equal(sparse_table_new(&o, &t), 0);
        uint64_t id = 77;
        float g1[2] = {0.3f, 0.3f}, g2[2] = {-0.2f, -0.2f}, w[2];
        assert_int_equal(sparse_table_push(t, &id, 1, g1, 0.1f, 1), 0);
        assert_int_equal(sparse_table_pull(t, &id, 1, w, false, 1), 0);
        assert_float_equal(w[0], -0.0659256, 1e-6);
        assert_int_equal(sparse_table_push(t, &id, 1, g2, 0.1f, 2), 0);
        uint64_t cur = 0, got_id;
        float slots[4];
        assert_int_equal(sparse_table_export(t, &cur, 1, &got_id, w, slots), 1);
        for (int j = 0; j < 2; j++) {
                assert_float_equal(w[j], -0.0245677, 1e-6);
                assert_float_equal(slots[j], 0.23, 1e-6);        /* accum */
                assert_float_equal(slots[2 + j], 0.1288050, 1e-6); /* linear */
        }
        sparse_table_free(t);

        /* random rows, beta and the general power: the same bits as the kernel */
        o = (struct sparse_table_opts){.dim = 5, .optimizer = SPARSE_FTRL, .init_stddev = 0.1, .seed = 3,
                                       .initial_accumulator = 0.05, .ftrl_l1 = 0.001, .ftrl_l2 = 0.01,
                                       .ftrl_beta = 0.5, .ftrl_lr_power = -0.7};
        assert_int_equal(sparse_table_new(&o, &t), 0);
        float rw[5], rn[5], rz[5] = {0}, g[5], got[5], gs[10];
        sparse_table_init_row(t, id, rw);
        for (int j = 0; j < 5; j++)
                rn[j] = 0.05f;
        for (int s = 0; s < 4; s++) {
                for (int j = 0; j < 5; j++)
                        g[j] = (float)(j - 2 + s) * 0.07f;
                assert_int_equal(sparse_table_push(t, &id, 1, g, 0.2f, 1), 0);
                optim_ftrl(rw, g, rn, rz, 5, 0.2f, 0.001f, 0.01f, 0.5f, -0.7f);
        }
        cur = 0;
        assert_int_equal(sparse_table_export(t, &cur, 1, &got_id, got, gs), 1);
        assert_memory_equal(got, rw, sizeof(rw));
        assert_memory_equal(gs, rn, sizeof(rn));
        assert_memory_equal(gs + 5, rz, sizeof(rz));
        sparse_table_free(t);
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

/* Every row, sorted by id: ids (n), values (n x dim), slots (2 x n x dim). Returns n. */
static size_t dump(struct sparse_table *t, size_t page, uint64_t *ids, float *vals, float *slots, size_t cap)
{
        enum { D = 3 };
        uint64_t cur = 0;
        size_t n = 0, got;
        uint64_t *pid = malloc(page * sizeof(*pid));
        float *pv = malloc(page * D * sizeof(float)), *ps = malloc(2 * page * D * sizeof(float));
        while ((got = sparse_table_export(t, &cur, page, pid, pv, ps)) > 0) {
                assert_true(got <= page);
                for (size_t i = 0; i < got; i++, n++) {
                        assert_true(n < cap);
                        ids[n] = pid[i];
                }
        }
        /* values and slots, looked up again by id in sorted order */
        qsort(ids, n, sizeof(*ids), cmp_u64);
        for (size_t i = 1; i < n; i++)
                assert_true(ids[i - 1] < ids[i]);   /* none given twice */
        cur = 0;
        while ((got = sparse_table_export(t, &cur, page, pid, pv, ps)) > 0)
                for (size_t i = 0; i < got; i++) {
                        uint64_t *at = bsearch(&pid[i], ids, n, sizeof(*ids), cmp_u64);
                        assert_non_null(at);
                        size_t k = (size_t)(at - ids);
                        memcpy(vals + k * D, pv + i * D, D * sizeof(float));
                        for (int s = 0; s < 2; s++)
                                memcpy(slots + (s * cap + k) * D, ps + (s * page + i) * D, D * sizeof(float));
                }
        free(pid);
        free(pv);
        free(ps);
        return n;
}

static void test_export_import(void **state)
{
        enum { N = 1000, D = 3, CAP = 1200 };
        struct sparse_table *a = table(SPARSE_FTRL, D, 0.1, 5), *b = table(SPARSE_FTRL, D, 0.1, 5);
        static uint64_t ids[N], ia[CAP], ib[CAP];
        static float g[N * D], va[CAP * D], vb[CAP * D], sa[2 * CAP * D], sb[2 * CAP * D];
        for (int i = 0; i < N; i++) {
                ids[i] = (uint64_t)i * 7919 + 3;
                for (int j = 0; j < D; j++)
                        g[i * D + j] = (float)((i + j) % 9 - 4) * 0.05f;
        }
        assert_int_equal(sparse_table_push(a, ids, N, g, 0.1f, 4), 0);
        assert_int_equal(sparse_table_push(a, ids, N / 2, g + D, 0.1f, 5), 0);
        size_t na = dump(a, 7, ia, va, sa, CAP);
        assert_int_equal(na, N);
        assert_int_equal(sparse_table_rows(a), N);
        /* imported whole: slot-major as export writes them with max == n */
        static float packed[2 * N * D];
        memcpy(packed, sa, na * D * sizeof(float));
        memcpy(packed + na * D, sa + CAP * D, na * D * sizeof(float));
        assert_int_equal(sparse_table_import(b, ia, na, va, packed, 9), 0);
        assert_int_equal(sparse_table_rows(b), N);
        size_t nb = dump(b, 64, ib, vb, sb, CAP);
        assert_int_equal(nb, na);
        assert_memory_equal(ia, ib, na * sizeof(*ia));
        assert_memory_equal(va, vb, na * D * sizeof(float));
        assert_memory_equal(sa, sb, na * D * sizeof(float));
        assert_memory_equal(sa + CAP * D, sb + CAP * D, na * D * sizeof(float));
        /* the two go on alike */
        float ra[D], rb[D];
        assert_int_equal(sparse_table_push(a, ids + 9, 1, g, 0.1f, 10), 0);
        assert_int_equal(sparse_table_push(b, ids + 9, 1, g, 0.1f, 10), 0);
        assert_int_equal(sparse_table_pull(a, ids + 9, 1, ra, false, 10), 0);
        assert_int_equal(sparse_table_pull(b, ids + 9, 1, rb, false, 10), 0);
        assert_memory_equal(ra, rb, sizeof(ra));
        /* an import replaces a row; NULL slots are the optimizer's start (accum 0.1, linear 0) */
        float v[D] = {1, 2, 3}, e[D];
        assert_int_equal(sparse_table_import(b, ids + 9, 1, v, NULL, 11), 1);   /* one stored already */
        assert_int_equal(sparse_table_rows(b), N);
        assert_int_equal(sparse_table_pull(b, ids + 9, 1, e, false, 11), 0);
        assert_memory_equal(e, v, sizeof(v));
        nb = dump(b, 1000, ib, vb, sb, CAP);
        uint64_t *at = bsearch(&ids[9], ib, nb, sizeof(*ib), cmp_u64);
        size_t k = (size_t)(at - ib);
        for (int j = 0; j < D; j++) {
                assert_float_equal(sb[k * D + j], 0.1, 1e-7);
                assert_float_equal(sb[(CAP + k) * D + j], 0.0, 0);
        }
        /* an empty table exports nothing, and the cursor stays at the end */
        uint64_t cur = 0;
        sparse_table_clear(b);
        assert_int_equal(sparse_table_export(b, &cur, 10, ib, vb, NULL), 0);
        assert_int_equal(sparse_table_export(b, &cur, 10, ib, vb, NULL), 0);
        /* a restore's evicted ids: the stored ones go (an id not stored is no error), not noted as evicted */
        uint64_t drop[2] = {ids[9], UINT64_MAX - 5};
        assert_int_equal(sparse_table_delete(a, drop, 2), 1);
        assert_int_equal(sparse_table_rows(a), N - 1);
        assert_int_equal(sparse_table_delete(a, drop, 2), 0);
        assert_int_equal(sparse_table_import(a, ids + 9, 1, v, NULL, 12), 0);   /* made again: new */
        assert_int_equal(sparse_table_rows(a), N);
        sparse_table_free(a);
        sparse_table_free(b);
}

static void test_evict(void **state)
{
        enum { N = 5000, D = 4 };
        struct sparse_table *t = table(SPARSE_SGD, D, 0.1, 11);
        static uint64_t ids[N];
        static float g[N * D], w[N * D];
        for (int i = 0; i < N; i++) {
                ids[i] = (uint64_t)i;
                for (int j = 0; j < D; j++)
                        g[i * D + j] = 1.0f;
        }
        /* even ids touched last at step 10, odd at step 20 */
        assert_int_equal(sparse_table_push(t, ids, N, g, 1.0f, 10), 0);
        for (int i = 1; i < N; i += 2)
                assert_int_equal(sparse_table_pull(t, &ids[i], 1, w, false, 20), 0);
        size_t bytes = sparse_table_bytes(t);
        assert_int_equal(sparse_table_evict(t, 25, 0), 0);
        assert_int_equal(sparse_table_evict(t, 5, 10), 0);
        assert_int_equal(sparse_table_evict(t, 20, 10), 0);   /* before 10: none */
        assert_int_equal(sparse_table_evict(t, 25, 10), N / 2);
        assert_int_equal(sparse_table_rows(t), N / 2);
        assert_int_equal(sparse_table_pull(t, ids, N, w, false, 26), 0);
        for (int i = 0; i < N; i++) {
                float init[D];
                sparse_table_init_row(t, ids[i], init);
                for (int j = 0; j < D; j++)
                        assert_float_equal(w[i * D + j], (init[j] - (i % 2 ? 1.0f : 0.0f)), 0);
        }
        assert_int_equal(sparse_table_rows(t), N / 2);
        /* freed rows are reused: the evicted half comes back without more memory */
        assert_int_equal(sparse_table_push(t, ids, N, g, 1.0f, 30), 0);
        assert_int_equal(sparse_table_rows(t), N);
        assert_int_equal(sparse_table_bytes(t), bytes);
        assert_int_equal(sparse_table_evict(t, 100, 1), N);
        assert_int_equal(sparse_table_rows(t), 0);
        uint64_t cur = 0;
        assert_int_equal(sparse_table_export(t, &cur, N, ids, w, NULL), 0);
        /* steps are kept in 32 bits: the last one below saturation still ages, a saturated one never */
        uint64_t late[2] = {1, 2};
        assert_int_equal(sparse_table_push(t, late, 1, g, 1.0f, UINT32_MAX - 3), 0);
        assert_int_equal(sparse_table_push(t, late + 1, 1, g, 1.0f, (uint64_t)1 << 40), 0);
        assert_int_equal(sparse_table_evict(t, (uint64_t)1 << 41, 1), 1);
        assert_int_equal(sparse_table_rows(t), 1);
        assert_int_equal(sparse_table_export(t, &(uint64_t){0}, 2, ids, w, NULL), 1);
        assert_int_equal(ids[0], 2);
        assert_int_equal(sparse_table_evict(t, 100, 1), 0);
        sparse_table_free(t);
}

static void test_clear(void **state)
{
        struct sparse_table *t = table(SPARSE_ADAGRAD, 8, 0.1, 2);
        size_t empty = sparse_table_bytes(t);
        uint64_t ids[100];
        static float g[100 * 8];
        for (int i = 0; i < 100; i++)
                ids[i] = (uint64_t)i * 1000003;
        assert_int_equal(sparse_table_push(t, ids, 100, g, 0.1f, 1), 0);
        assert_true(sparse_table_bytes(t) > empty);
        sparse_table_clear(t);
        assert_int_equal(sparse_table_rows(t), 0);
        assert_int_equal(sparse_table_bytes(t), empty);
        uint64_t cur = 0;
        assert_int_equal(sparse_table_export(t, &cur, 100, ids, g, NULL), 0);
        assert_int_equal(sparse_table_push(t, ids, 100, g, 0.1f, 2), 0);
        assert_int_equal(sparse_table_rows(t), 100);
        sparse_table_free(t);
}

/* 300,000 rows: each stripe's index rehashes about ten times, and chunks of every size are made; then
 * every third row evicted (deletions in full clusters) and the rest still found. */
static void test_growth(void **state)
{
        enum { N = 300000, D = 2 };
        struct sparse_table *t = table(SPARSE_SGD, D, 0, 0);
        uint64_t *ids = malloc(N * sizeof(*ids));
        float *g = malloc(N * D * sizeof(float)), *w = malloc(N * D * sizeof(float));
        for (size_t i = 0; i < N; i++) {
                ids[i] = i * 0x100000001ULL;   /* ids with structure in the high and low words */
                g[i * D] = -(float)(i % 1000);
                g[i * D + 1] = 1;
        }
        for (size_t at = 0; at < N; at += 4096) {
                size_t k = N - at < 4096 ? N - at : 4096;
                assert_int_equal(sparse_table_push(t, ids + at, k, g + at * D, 1.0f, at % 3 == 0 ? 1 : 5), 0);
        }
        assert_int_equal(sparse_table_rows(t), N);
        assert_int_equal(sparse_table_pull(t, ids, N, w, false, 0), 0);
        for (size_t i = 0; i < N; i++) {
                assert_float_equal(w[i * D], (float)(i % 1000), 0);
                assert_float_equal(w[i * D + 1], -1.0f, 0);
        }
        assert_int_equal(sparse_table_rows(t), N);
        /* pulls at step 0 made every row's last touch 0; touch two thirds again at 9 */
        for (size_t i = 0; i < N; i++)
                if (i % 3)
                        assert_int_equal(sparse_table_pull(t, &ids[i], 1, w, true, 9), 0);
        assert_int_equal(sparse_table_evict(t, 9, 1), (N + 2) / 3);
        assert_int_equal(sparse_table_pull(t, ids, N, w, false, 9), 0);
        for (size_t i = 0; i < N; i++)
                assert_float_equal(w[i * D + 1], (i % 3 ? -1.0f : 0.0f), 0);
        assert_int_equal(sparse_table_rows(t), N - (N + 2) / 3);
        free(ids);
        free(g);
        free(w);
        sparse_table_free(t);
}

enum { TH = 4, TH_IDS = 2000, TH_ROUNDS = 50, TH_D = 4 };

struct worker {
        struct sparse_table *t;
        int k;
};

/* Thread k pushes gradient k + 1 to ids [k * 500, k * 500 + 2000): every id is shared with others. */
static void *hammer(void *arg)
{
        struct worker *w = arg;
        static __thread uint64_t ids[256];
        static __thread float g[256 * TH_D], rows[256 * TH_D];
        for (int i = 0; i < 256 * TH_D; i++)
                g[i] = (float)(w->k + 1);
        for (int r = 0; r < TH_ROUNDS; r++)
                for (int at = 0; at < TH_IDS; at += 250) {
                        for (int i = 0; i < 250; i++)
                                ids[i] = (uint64_t)(w->k * 500 + at + (i * 7 + r) % 250);
                        if (sparse_table_push(w->t, ids, 250, g, 1.0f, (uint64_t)r) != 0 ||
                            sparse_table_pull(w->t, ids, 250, rows, true, (uint64_t)r) != 0)
                                return (void *)1;
                }
        return NULL;
}

static void test_threads(void **state)
{
        struct sparse_table *t = table(SPARSE_SGD, TH_D, 0, 0);
        pthread_t th[TH];
        struct worker w[TH];
        for (int k = 0; k < TH; k++) {
                w[k] = (struct worker){t, k};
                assert_int_equal(pthread_create(&th[k], NULL, hammer, &w[k]), 0);
        }
        for (int k = 0; k < TH; k++) {
                void *rc;
                pthread_join(th[k], &rc);
                assert_null(rc);
        }
        size_t n = (TH - 1) * 500 + TH_IDS;
        assert_int_equal(sparse_table_rows(t), n);
        for (size_t id = 0; id < n; id++) {
                float row[TH_D], want = 0;
                for (int k = 0; k < TH; k++)
                        if (id >= (size_t)k * 500 && id < (size_t)k * 500 + TH_IDS)
                                want -= (float)((k + 1) * TH_ROUNDS);
                uint64_t i = id;
                assert_int_equal(sparse_table_pull(t, &i, 1, row, false, 0), 0);
                for (int j = 0; j < TH_D; j++)
                        assert_float_equal(row[j], want, 0);
        }
        sparse_table_free(t);
}

static void test_shard_of(void **state)
{
        enum { N = 1000000 };
        for (uint32_t shards = 2; shards <= 4; shards++) {
                /* sequential ids and ids that differ only in high bits */
                for (int kind = 0; kind < 2; kind++) {
                        size_t count[4] = {0};
                        for (uint64_t i = 0; i < N; i++) {
                                uint32_t s = sparse_shard_of(kind ? i << 40 : i, shards);
                                assert_true(s < shards);
                                count[s]++;
                        }
                        double want = (double)N / shards;
                        for (uint32_t s = 0; s < shards; s++)
                                assert_true(fabs((double)count[s] - want) < 0.02 * want);
                }
        }
        assert_int_equal(sparse_shard_of(12345, 1), 0);
        assert_int_equal(sparse_shard_of(12345, 3), sparse_shard_of(12345, 3));
        assert_true(sparse_shard_of(UINT64_MAX, 1000) < 1000);
}

/* The bytes held cover the raw rows and their slots, within the layout's overhead, and come back to the
 * empty table's on clear. */
static void test_bytes(void **state)
{
        enum { D = 16, N = 200000 };
        struct sparse_table *t = table(SPARSE_ADAGRAD, D, 0.01, 1);
        size_t empty = sparse_table_bytes(t);
        assert_true(empty > 0 && empty < 64 * 1024);
        uint64_t *ids = malloc(4096 * sizeof(*ids));
        float *g = calloc(4096 * D, sizeof(float));
        size_t prev = empty;
        for (size_t at = 0; at < N; at += 4096) {
                for (size_t i = 0; i < 4096; i++)
                        ids[i] = at + i;
                assert_int_equal(sparse_table_push(t, ids, 4096, g, 0.1f, 1), 0);
                size_t b = sparse_table_bytes(t);
                assert_true(b >= prev);
                prev = b;
        }
        size_t rows = sparse_table_rows(t);
        double raw = (double)rows * D * 4 * 2;
        /* keys 8 B + touch 4 B + index at >= 3/8 load per row; chunks of each stripe at most 2x used */
        assert_true((double)prev > raw + rows * 12.0);
        assert_true((double)prev < 2.0 * raw + rows * 12.0 + 64 * 1024 * 1024 / 8);
        sparse_table_clear(t);
        assert_int_equal(sparse_table_bytes(t), empty);
        free(ids);
        free(g);
        sparse_table_free(t);
}

static struct sparse_table *bounded(enum sparse_evict_policy pol, uint64_t max_rows, uint32_t admit_after)
{
        struct sparse_table_opts o = {.dim = 4, .optimizer = SPARSE_ADAGRAD, .init_stddev = 0.1, .seed = 3,
                                      .initial_accumulator = 0.1, .max_rows = max_rows, .evict_policy = pol,
                                      .admit_after = admit_after};
        struct sparse_table *t = NULL;
        assert_int_equal(sparse_table_new(&o, &t), 0);
        return t;
}

static void test_bounded_invalid(void **state)
{
        struct sparse_table_opts o = {.dim = 4, .optimizer = SPARSE_SGD, .max_rows = SPARSE_MIN_MAX_ROWS - 1};
        struct sparse_table *t = NULL;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        o.max_rows = 0, o.evict_policy = (enum sparse_evict_policy)9;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        o.evict_policy = SPARSE_EVICT_LFU, o.admit_after = 256;
        assert_int_equal(sparse_table_new(&o, &t), -EINVAL);
        assert_null(t);
}

/* At max_rows, each new row first evicts a batch: rows never exceed the bound, and lru keeps the rows
 * touched lately. */
static void test_max_rows_lru(void **state)
{
        enum { CAP = 6400, N = 20000, D = 4 };
        for (int pol = SPARSE_EVICT_AGE; pol <= SPARSE_EVICT_LRU; pol++) {
                struct sparse_table *t = bounded((enum sparse_evict_policy)pol, CAP, 0);
                static float w[D];
                uint64_t hot[100];
                for (int i = 0; i < 100; i++)
                        hot[i] = 1000000 + (uint64_t)i;
                static float hw[100 * D];
                for (uint64_t i = 0; i < N; i++) {
                        assert_int_equal(sparse_table_pull(t, &i, 1, w, true, 10 + i), 0);
                        assert_true(sparse_table_rows(t) <= CAP);
                        if (i % 50 == 0)   /* the hot ids are touched all along */
                                assert_int_equal(sparse_table_pull(t, hot, 100, hw, true, 10 + i), 0);
                }
                struct sparse_table_stats st;
                sparse_table_get_stats(t, &st);
                assert_true(st.rows <= CAP && st.rows > CAP * 9 / 10);
                assert_true(st.evicted_limit >= N + 100 - CAP);
                assert_int_equal(st.evicted_age, 0);
                /* every hot id still has its row: a pull without create finds it touched since */
                uint64_t cur = 0, n, *ids = malloc(CAP * sizeof(*ids));
                float *vals = malloc((size_t)CAP * D * sizeof(float));
                n = sparse_table_export(t, &cur, CAP, ids, vals, NULL);
                assert_int_equal(n, st.rows);
                unsigned hot_kept = 0, old_kept = 0;
                for (uint64_t i = 0; i < n; i++) {
                        hot_kept += ids[i] >= 1000000;
                        old_kept += ids[i] < N / 2;
                }
                assert_int_equal(hot_kept, 100);
                assert_int_equal(old_kept, 0);
                free(ids);
                free(vals);
                assert_true(sparse_table_bytes(t) <= sparse_table_bytes_for(sparse_table_options(t), CAP));
                sparse_table_free(t);
        }
}

/* lfu keeps the rows used most, whatever their last touch. */
static void test_max_rows_lfu(void **state)
{
        enum { CAP = 6400, D = 4 };
        struct sparse_table *t = bounded(SPARSE_EVICT_LFU, CAP, 0);
        static uint64_t fav[500];
        static float w[500 * D];
        for (int i = 0; i < 500; i++)
                fav[i] = 5000000 + (uint64_t)i;
        for (int r = 0; r < 20; r++)   /* used 20 times early, never again */
                assert_int_equal(sparse_table_pull(t, fav, 500, w, true, 1), 0);
        for (uint64_t i = 0; i < 3 * CAP; i++) {   /* a stream of ids used once, later */
                assert_int_equal(sparse_table_pull(t, &i, 1, w, true, 100 + i), 0);
                assert_true(sparse_table_rows(t) <= CAP);
        }
        uint64_t *ids = malloc(CAP * sizeof(*ids)), cur = 0;
        float *vals = malloc((size_t)CAP * D * sizeof(float));
        size_t n = sparse_table_export(t, &cur, CAP, ids, vals, NULL);
        unsigned kept = 0;
        for (size_t i = 0; i < n; i++)
                kept += ids[i] >= 5000000;
        assert_true(kept >= 450);
        free(ids);
        free(vals);
        sparse_table_free(t);
}

/* admit_after 3: the first two pulls of an id give its initial row and store nothing, its gradients
 * are dropped; the third pull makes the row. */
static void test_admission(void **state)
{
        enum { D = 4 };
        struct sparse_table *t = bounded(SPARSE_EVICT_AGE, 0, 3);
        uint64_t id = 77;
        float w[D], init[D], g[D] = {1, 1, 1, 1};
        sparse_table_init_row(t, id, init);
        for (int k = 0; k < 2; k++) {
                assert_int_equal(sparse_table_pull(t, &id, 1, w, true, 1), 0);
                assert_memory_equal(w, init, sizeof(w));
                assert_int_equal(sparse_table_rows(t), 0);
                assert_int_equal(sparse_table_push(t, &id, 1, g, 0.1f, 1), 0);
                assert_int_equal(sparse_table_rows(t), 0);
        }
        /* a pull without create (evaluation) does not count */
        assert_int_equal(sparse_table_pull(t, &id, 1, w, false, 1), 0);
        assert_int_equal(sparse_table_rows(t), 0);
        assert_int_equal(sparse_table_pull(t, &id, 1, w, true, 1), 0);
        assert_memory_equal(w, init, sizeof(w));
        assert_int_equal(sparse_table_rows(t), 1);
        assert_int_equal(sparse_table_push(t, &id, 1, g, 0.1f, 2), 0);
        assert_int_equal(sparse_table_pull(t, &id, 1, w, false, 2), 0);
        assert_true(w[0] < init[0]);
        struct sparse_table_stats st;
        sparse_table_get_stats(t, &st);
        assert_int_equal(st.admitted, 1);
        assert_int_equal(st.admit_pending, 2);
        assert_int_equal(st.grads_dropped, 2);
        /* an import (a checkpoint's rows) is never held back */
        uint64_t other = 99;
        assert_int_equal(sparse_table_import(t, &other, 1, init, NULL, 3), 0);
        assert_int_equal(sparse_table_rows(t), 2);
        /* the sketch is counted in the bytes */
        assert_true(sparse_table_bytes(t) >= (size_t)SPARSE_SKETCH_DEPTH << SPARSE_SKETCH_WIDTH_LOG2);
        sparse_table_free(t);
}

struct bounded_arg {
        struct sparse_table *t;
        unsigned seed;
};

static void *bounded_hammer(void *p)
{
        struct bounded_arg *a = p;
        struct rng r;
        rng_init(&r, a->seed, 1);
        uint64_t ids[64];
        float w[64 * 4], g[64 * 4];
        for (int i = 0; i < 64 * 4; i++)
                g[i] = 0.01f;
        for (int round = 0; round < 2000; round++) {
                for (int i = 0; i < 64; i++)   /* distinct ids in a batch, as the ps client sends them */
                        ids[i] = (uint64_t)i * 100000 + rng_below(&r, 1000 + (uint32_t)round * 10);
                assert_int_equal(sparse_table_pull(a->t, ids, 64, w, true, (uint64_t)round), 0);
                assert_int_equal(sparse_table_push(a->t, ids, 64, g, 0.1f, (uint64_t)round), 0);
        }
        return NULL;
}

/* Threads pulling and pushing through a bounded lfu table with admission: the bound holds at every
 * moment a reader looks, and the counters add up. */
static void test_bounded_threads(void **state)
{
        enum { CAP = 6400, T = 4 };
        struct sparse_table *t = bounded(SPARSE_EVICT_LFU, CAP, 2);
        pthread_t th[T];
        struct bounded_arg a[T];
        for (int i = 0; i < T; i++) {
                a[i] = (struct bounded_arg){t, 17u + (unsigned)i};
                assert_int_equal(pthread_create(&th[i], NULL, bounded_hammer, &a[i]), 0);
        }
        for (int k = 0; k < 200; k++)
                assert_true(sparse_table_rows(t) <= CAP);
        for (int i = 0; i < T; i++)
                pthread_join(th[i], NULL);
        struct sparse_table_stats st;
        sparse_table_get_stats(t, &st);
        assert_true(st.rows <= CAP && st.rows > 0);
        assert_int_equal(st.admitted, st.rows + st.evicted_limit);
        assert_true(st.admit_pending > 0 && st.grads_dropped > 0 && st.evicted_limit > 0);
        sparse_table_free(t);
}

/* A checkpoint's walk through a table at its bound while rows come and go: no id twice (an import
 * refuses that), since rows already walked are not evicted while the walk is in their stripe. */
static void test_bounded_walk(void **state)
{
        enum { CAP = 6400, D = 4, PAGE = 10, N = 2 * CAP };
        struct sparse_table *t = bounded(SPARSE_EVICT_LRU, CAP, 0);
        static float w[PAGE * D], rows[N * D];
        static uint64_t got[4 * N], ids[N];
        for (uint64_t i = 0; i < N; i++)
                ids[i] = i;
        assert_int_equal(sparse_table_pull(t, ids, CAP, rows, true, 1), 0);
        uint64_t cur = 0, step = 2, next;
        size_t n = 0, k;
        struct rng r;
        rng_init(&r, 5, 0);
        while ((k = sparse_table_export(t, &cur, PAGE, got + n, w, NULL)) > 0) {
                n += k;
                assert_true(n + PAGE <= 4 * N);
                /* between pages, ids old and new come back, each pull at a later step */
                for (int j = 0; j < 400; j++, step++) {
                        next = rng_below(&r, N);
                        assert_int_equal(sparse_table_pull(t, &ids[next], 1, w, true, step), 0);
                }
        }
        struct sparse_table_stats st;
        sparse_table_get_stats(t, &st);
        assert_true(st.evicted_limit > 0);
        qsort(got, n, sizeof(got[0]), cmp_u64);
        for (size_t i = 1; i < n; i++)
                assert_true(got[i] != got[i - 1]);
        sparse_table_free(t);
}

/* bytes_for is what a full table holds, and rows_within its inverse. */
static void test_bytes_for(void **state)
{
        enum { CAP = 100000, D = 16 };
        struct sparse_table_opts o = {.dim = D, .optimizer = SPARSE_ADAGRAD, .init_stddev = 0.1, .seed = 3,
                                      .initial_accumulator = 0.1, .max_rows = CAP};
        struct sparse_table *t = NULL;
        assert_int_equal(sparse_table_new(&o, &t), 0);
        uint64_t *ids = malloc(4096 * sizeof(*ids));
        float *w = malloc(4096 * D * sizeof(float));
        for (uint64_t at = 0; at < 2 * CAP; at += 4096) {
                for (int i = 0; i < 4096; i++)
                        ids[i] = at + (uint64_t)i;
                assert_int_equal(sparse_table_pull(t, ids, 4096, w, true, at), 0);
        }
        uint64_t want = sparse_table_bytes_for(&o, CAP);
        assert_true(sparse_table_bytes(t) <= want);
        assert_true(sparse_table_bytes(t) >= want * 95 / 100);
        uint64_t r = sparse_table_rows_within(&o, want);
        assert_true(r >= CAP && sparse_table_bytes_for(&o, r) <= want && sparse_table_bytes_for(&o, r + 1) > want);
        assert_int_equal(sparse_table_rows_within(&o, 100), 0);
        /* lfu's count costs 4 bytes a row */
        struct sparse_table_opts l = o;
        l.evict_policy = SPARSE_EVICT_LFU;
        assert_true(sparse_table_bytes_for(&l, CAP) > want + CAP * 3);
        /* at 10^7 rows of dim 16 with Adagrad, the table holds < 1.3x the raw rows and slots, lfu too */
        double raw = 1e7 * D * 4 * 2;
        print_message("bytes_for(1e7) / raw: age %.3f, lfu %.3f\n", (double)sparse_table_bytes_for(&o, 10000000) / raw,
                      (double)sparse_table_bytes_for(&l, 10000000) / raw);
        assert_true((double)sparse_table_bytes_for(&o, 10000000) < 1.3 * raw);
        assert_true((double)sparse_table_bytes_for(&l, 10000000) < 1.3 * raw);
        sparse_table_free(t);
        free(ids);
        free(w);
}

/* Change tracking: made, pushed and imported rows are dirty, pulled ones not; a cleaning export
 * unmarks; evicted ids are noted once, and taken once. */
static void test_track_changes(void **state)
{
        (void)state;
        struct sparse_table *t = table(SPARSE_ADAGRAD, 4, 0.1, 7);
        sparse_table_track(t, true);
        uint64_t ids[100], got[200];
        static float g[100 * 4], rows[100 * 4], vals[200 * 4], slots[200 * 4];
        for (int i = 0; i < 100; i++)
                ids[i] = 1000 + (uint64_t)i;
        for (int i = 0; i < 100 * 4; i++)
                g[i] = 0.01f * (float)(i % 7);
        assert_int_equal(sparse_table_push(t, ids, 100, g, 0.1f, 1), 0);
        uint64_t cur = 0;
        /* every row made is changed; a clean walk takes them all, a second finds none */
        assert_int_equal(sparse_table_export_changes(t, &cur, 200, got, vals, slots, true, true), 100);
        cur = 0;
        assert_int_equal(sparse_table_export_changes(t, &cur, 200, got, vals, slots, true, true), 0);
        /* pulls of stored rows change nothing; a push of 3 ids and a new id pulled (made) do */
        assert_int_equal(sparse_table_pull(t, ids, 50, rows, true, 2), 0);
        assert_int_equal(sparse_table_push(t, ids + 10, 3, g, 0.1f, 2), 0);
        uint64_t fresh = 5;
        assert_int_equal(sparse_table_pull(t, &fresh, 1, rows, true, 2), 0);
        cur = 0;
        assert_int_equal(sparse_table_export_changes(t, &cur, 200, got, vals, slots, true, false), 4);
        /* not cleaned: the same 4 again; then a full export (not dirty_only) that cleans */
        cur = 0;
        assert_int_equal(sparse_table_export_changes(t, &cur, 200, got, vals, slots, true, false), 4);
        cur = 0;
        assert_int_equal(sparse_table_export_changes(t, &cur, 200, got, vals, slots, false, true), 101);
        cur = 0;
        assert_int_equal(sparse_table_export_changes(t, &cur, 200, got, vals, slots, true, true), 0);
        /* an import marks */
        assert_int_equal(sparse_table_import(t, ids + 20, 2, g, NULL, 3), 2);
        cur = 0;
        assert_int_equal(sparse_table_export_changes(t, &cur, 200, got, vals, slots, true, true), 2);
        /* eviction: rows untouched since before step 60 go (all but ids[0]); their ids are noted once */
        assert_int_equal(sparse_table_push(t, ids, 1, g, 0.1f, 100), 0);
        assert_int_equal(sparse_table_evict(t, 110, 50), 100);
        uint64_t *gone = NULL;
        size_t n_gone = 0;
        assert_int_equal(sparse_table_take_evicted(t, &gone, &n_gone), 0);
        assert_int_equal(n_gone, 100);
        free(gone);
        gone = NULL;
        assert_int_equal(sparse_table_take_evicted(t, &gone, &n_gone), 0);
        assert_int_equal(n_gone, 0);
        assert_null(gone);
        /* the survivor (pushed at 100) is the only changed row */
        cur = 0;
        assert_int_equal(sparse_table_export_changes(t, &cur, 200, got, vals, slots, true, true), 1);
        assert_int_equal(got[0], ids[0]);
        sparse_table_free(t);
}

/* A table both bounded and tracked: every id evicted at max_rows is noted for the next incremental
 * checkpoint, once, and never among the rows it gives as changed. */
static void test_bounded_tracked(void **state)
{
        (void)state;
        enum { CAP = 640, N = 3000, D = 4 };
        struct sparse_table *t = bounded(SPARSE_EVICT_LRU, CAP, 0);
        sparse_table_track(t, true);
        static float w[D];
        for (uint64_t i = 0; i < N; i++)
                assert_int_equal(sparse_table_pull(t, &i, 1, w, true, 10 + i), 0);
        struct sparse_table_stats st;
        sparse_table_get_stats(t, &st);
        uint64_t *gone = NULL;
        size_t n_gone = 0;
        assert_int_equal(sparse_table_take_evicted(t, &gone, &n_gone), 0);
        assert_int_equal(n_gone, st.evicted_limit);
        assert_int_equal(n_gone + st.rows, N);
        /* the rows left and the ids gone make up every id, each once */
        static uint64_t ids[CAP];
        static float vals[CAP * D];
        uint64_t cur = 0;
        size_t n = sparse_table_export_changes(t, &cur, CAP, ids, vals, NULL, true, false);
        assert_int_equal(n, st.rows);
        static unsigned char seen[N];
        for (size_t i = 0; i < n; i++)
                seen[ids[i]]++;
        for (size_t i = 0; i < n_gone; i++)
                seen[gone[i]]++;
        for (unsigned i = 0; i < N; i++)
                assert_int_equal(seen[i], 1);
        free(gone);
        sparse_table_free(t);
}

/* Every row of t (dim 4, two slots at most) sorted by id: ids, then each row's values and slots. */
static size_t rows_sorted(struct sparse_table *t, uint64_t *ids, float *vals, size_t cap)
{
        enum { D = 4, PAGE = 4096 };
        uint64_t cur = 0, *pid = malloc(PAGE * sizeof(*pid));
        float *pv = malloc(PAGE * D * sizeof(float)), *ps = malloc(2 * PAGE * D * sizeof(float));
        uint64_t *raw = malloc(cap * sizeof(*raw));
        float *rv = malloc(cap * 3 * D * sizeof(float));
        size_t n = 0, got;
        while ((got = sparse_table_export(t, &cur, PAGE, pid, pv, ps)) > 0)
                for (size_t i = 0; i < got; i++, n++) {
                        assert_true(n < cap);
                        raw[n] = pid[i];
                        memcpy(rv + n * 3 * D, pv + i * D, D * sizeof(float));
                        memcpy(rv + n * 3 * D + D, ps + i * D, D * sizeof(float));
                        memcpy(rv + n * 3 * D + 2 * D, ps + (PAGE + i) * D, D * sizeof(float));
                }
        memcpy(ids, raw, n * sizeof(*ids));
        qsort(ids, n, sizeof(*ids), cmp_u64);
        for (size_t i = 0; i < n; i++) {   /* each row to its id's place */
                uint64_t *at = bsearch(&raw[i], ids, n, sizeof(*ids), cmp_u64);
                memcpy(vals + (size_t)(at - ids) * 3 * D, rv + i * 3 * D, 3 * D * sizeof(float));
        }
        free(pid);
        free(pv);
        free(ps);
        free(raw);
        free(rv);
        return n;
}

/* The primary's journaled writes replayed: made and dropped rows, then the push on existing rows. */
static void replay_into(struct sparse_table *p, struct sparse_table *r, const uint64_t *ids, size_t n,
                        const float *g, uint64_t step)
{
        struct sparse_event *ev;
        size_t ne;
        assert_int_equal(sparse_table_journal_take(p, &ev, &ne), 0);
        assert_int_equal(sparse_table_replay(r, ev, ne, step), 0);
        free(ev);
        if (g)
                assert_int_equal(sparse_table_push_existing(r, ids, n, g, 0.1f, step), 0);
}

/* ps.replicas 2 of a bounded table: a replica that replays the primary's journal (rows made, rows
 * dropped at the bound or by age) and its pushes on existing rows only holds the same rows, values and
 * slots bit for bit, whatever the policy and with admission, though its own touch clocks, use counts
 * and sketch are not the primary's. */
static void test_journal_replay(void **state)
{
        enum { D = 4, IDS = 3000, BATCH = 64, CAP = 4096 };
        const enum sparse_evict_policy pols[] = {SPARSE_EVICT_LRU, SPARSE_EVICT_LFU, SPARSE_EVICT_AGE};
        uint64_t *ia = malloc(CAP * sizeof(*ia)), *ib = malloc(CAP * sizeof(*ib));
        float *va = malloc(CAP * 3 * D * sizeof(float)), *vb = malloc(CAP * 3 * D * sizeof(float));
        for (size_t pi = 0; pi < 3; pi++)
                for (uint32_t admit = 0; admit <= 3; admit += 3) {
                        struct sparse_table *p = bounded(pols[pi], 640, admit), *r = bounded(pols[pi], 640, admit);
                        sparse_table_journal(p, true);
                        struct rng g;
                        rng_init(&g, 7 + pi, admit);
                        uint64_t ids[BATCH];
                        float rows[BATCH * D], grads[BATCH * D];
                        size_t dropped = 0;
                        for (uint64_t step = 1; step <= 400; step++) {
                                /* a batch of distinct ids, hot ones (below 200) half the time */
                                size_t n = 0;
                                while (n < BATCH) {
                                        uint64_t id = rng_next(&g) % (rng_next(&g) % 2 ? 200 : IDS);
                                        bool seen = false;
                                        for (size_t k = 0; k < n && !seen; k++)
                                                seen = ids[k] == id;
                                        if (!seen)
                                                ids[n++] = id;
                                }
                                assert_int_equal(sparse_table_pull(p, ids, n, rows, true, step), 0);
                                replay_into(p, r, NULL, 0, NULL, step);
                                for (size_t k = 0; k < n * D; k++)
                                        grads[k] = (float)(rng_next(&g) % 2001) / 1000.0f - 1.0f;
                                assert_int_equal(sparse_table_push(p, ids, n, grads, 0.1f, step), 0);
                                replay_into(p, r, ids, n, grads, step);
                                if (pols[pi] == SPARSE_EVICT_AGE && step % 50 == 0) {
                                        dropped += sparse_table_evict(p, step, 40);
                                        replay_into(p, r, NULL, 0, NULL, step);
                                }
                        }
                        struct sparse_table_stats st;
                        sparse_table_get_stats(p, &st);
                        assert_true(st.evicted_limit > 0);   /* the bound was reached: rows were dropped */
                        assert_true(admit == 0 || st.admit_pending > 0);
                        assert_true(pols[pi] != SPARSE_EVICT_AGE || dropped > 0);
                        size_t na = rows_sorted(p, ia, va, CAP), nb = rows_sorted(r, ib, vb, CAP);
                        assert_int_equal(na, nb);
                        assert_memory_equal(ia, ib, na * sizeof(*ia));
                        assert_memory_equal(va, vb, na * 3 * D * sizeof(float));
                        sparse_table_free(p);
                        sparse_table_free(r);
                }
        free(ia);
        free(ib);
        free(va);
        free(vb);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_names),         cmocka_unit_test(test_new_invalid),
        cmocka_unit_test(test_init),          cmocka_unit_test(test_pull_create),
        cmocka_unit_test(test_push_sgd),      cmocka_unit_test(test_push_adagrad),
        cmocka_unit_test(test_push_ftrl),     cmocka_unit_test(test_export_import),
        cmocka_unit_test(test_evict),         cmocka_unit_test(test_clear),
        cmocka_unit_test(test_growth),        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_shard_of),      cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_bounded_invalid), cmocka_unit_test(test_max_rows_lru),
        cmocka_unit_test(test_max_rows_lfu),  cmocka_unit_test(test_admission),
        cmocka_unit_test(test_bytes_for),     cmocka_unit_test(test_bounded_threads),
        cmocka_unit_test(test_bounded_walk), cmocka_unit_test(test_track_changes),
        cmocka_unit_test(test_bounded_tracked), cmocka_unit_test(test_journal_replay))
