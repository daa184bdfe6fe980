/* placement: determinism, balance, splitting, coverage, one shard. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "placement.h"

/* The MLP 784-256-128-64-10 in float32. */
static const struct placement_var mlp[] = {
        {"dense0/kernel", 784, 256 * 4}, {"dense0/bias", 1, 256 * 4},
        {"dense1/kernel", 256, 128 * 4}, {"dense1/bias", 1, 128 * 4},
        {"dense2/kernel", 128, 64 * 4},  {"dense2/bias", 1, 64 * 4},
        {"dense3/kernel", 64, 10 * 4},   {"dense3/bias", 1, 10 * 4},
};
#define N_MLP 8

static void check_coverage(const struct placement *p, const struct placement_var *vars, uint32_t n_vars)
{
        uint64_t sum[16] = {0};
        for (uint32_t v = 0; v < n_vars; v++) {
                uint32_t first = 0, k = placement_var_parts(p, v, &first);
                assert_true(k >= 1);
                uint32_t row = 0;
                for (uint32_t i = first; i < first + k; i++) {
                        const struct placement_part *pt = &p->parts[i];
                        assert_int_equal(pt->var, v);
                        assert_int_equal(pt->row_begin, row); /* contiguous, in order, no overlap */
                        assert_true(pt->row_end > pt->row_begin);
                        assert_int_equal(pt->bytes, (uint64_t)(pt->row_end - pt->row_begin) * vars[v].row_bytes);
                        assert_true(pt->shard < p->n_shards);
                        sum[pt->shard] += pt->bytes;
                        row = pt->row_end;
                }
                assert_int_equal(row, vars[v].rows);
        }
        for (uint32_t s = 0; s < p->n_shards; s++)
                assert_int_equal(sum[s], p->shard_bytes[s]);
}

static void test_one_shard(void **state)
{
        struct placement *p;
        assert_int_equal(placement_compute(mlp, N_MLP, 1, 0, &p), 0);
        assert_int_equal(p->n_parts, N_MLP);
        check_coverage(p, mlp, N_MLP);
        assert_int_equal(p->shard_bytes[0], 242762 * 4);
        for (uint32_t i = 0; i < p->n_parts; i++)
                assert_int_equal(p->parts[i].shard, 0);
        placement_free(p);
}

static void test_greedy_no_split(void **state)
{
        struct placement *p;
        assert_int_equal(placement_compute(mlp, N_MLP, 2, 0, &p), 0);
        check_coverage(p, mlp, N_MLP);
        /* dense0/kernel alone on shard 0; everything else on shard 1 */
        assert_int_equal(p->parts[0].shard, 0);
        for (uint32_t i = 1; i < p->n_parts; i++)
                assert_int_equal(p->parts[i].shard, 1);
        assert_int_equal(p->shard_bytes[0], 784 * 256 * 4);
        placement_free(p);
}

static void test_split_balances(void **state)
{
        struct placement *p;
        /* 256 KiB parts: dense0/kernel (784 KiB) -> 4 parts of 196 rows */
        assert_int_equal(placement_compute(mlp, N_MLP, 3, 256 * 1024, &p), 0);
        check_coverage(p, mlp, N_MLP);
        uint32_t first, k = placement_var_parts(p, 0, &first);
        assert_int_equal(k, 4);
        for (uint32_t i = first; i < first + k; i++)
                assert_int_equal(p->parts[i].row_end - p->parts[i].row_begin, 196);
        uint64_t lo = UINT64_MAX, hi = 0;
        for (uint32_t s = 0; s < 3; s++) {
                lo = p->shard_bytes[s] < lo ? p->shard_bytes[s] : lo;
                hi = p->shard_bytes[s] > hi ? p->shard_bytes[s] : hi;
        }
        /* greedy is within the largest part of optimal */
        assert_true(hi - lo <= 196 * 256 * 4);
        placement_free(p);
}

static void test_split_limits(void **state)
{
        /* never more parts than rows; at least one row per part */
        const struct placement_var v[] = {{"wide", 3, 1000}, {"tiny", 1, 4}};
        struct placement *p;
        assert_int_equal(placement_compute(v, 2, 4, 10, &p), 0);
        assert_int_equal(placement_var_parts(p, 0, NULL), 3);
        assert_int_equal(placement_var_parts(p, 1, NULL), 1);
        check_coverage(p, v, 2);
        placement_free(p);
        /* uneven split: 10 rows of 100 bytes into ceil(1000/300) = 4 parts: 2,3,2,3 */
        const struct placement_var u[] = {{"u", 10, 100}};
        assert_int_equal(placement_compute(u, 1, 2, 300, &p), 0);
        assert_int_equal(p->n_parts, 4);
        check_coverage(p, u, 1);
        assert_int_equal(p->shard_bytes[0], 500);
        assert_int_equal(p->shard_bytes[1], 500);
        placement_free(p);
}

static void test_ties(void **state)
{
        /* equal sizes: by name, then row; shards by lowest index */
        const struct placement_var v[] = {{"b", 2, 8}, {"a", 2, 8}, {"c", 1, 16}};
        struct placement *p;
        assert_int_equal(placement_compute(v, 3, 2, 0, &p), 0);
        /* order: a (16), b (16), c (16) -> a:0, b:1, c:0 */
        assert_int_equal(p->parts[0].shard, 1); /* b */
        assert_int_equal(p->parts[1].shard, 0); /* a */
        assert_int_equal(p->parts[2].shard, 0); /* c */
        placement_free(p);
}

static void test_deterministic(void **state)
{
        struct placement *a, *b;
        assert_int_equal(placement_compute(mlp, N_MLP, 3, 100000, &a), 0);
        assert_int_equal(placement_compute(mlp, N_MLP, 3, 100000, &b), 0);
        assert_int_equal(a->n_parts, b->n_parts);
        assert_memory_equal(a->parts, b->parts, sizeof(*a->parts) * a->n_parts);
        assert_memory_equal(a->shard_bytes, b->shard_bytes, sizeof(uint64_t) * 3);
        check_coverage(a, mlp, N_MLP);
        placement_free(a);
        placement_free(b);
}

static void test_errors_and_print(void **state)
{
        struct placement *p = NULL;
        assert_int_equal(placement_compute(mlp, N_MLP, 0, 0, &p), -EINVAL);
        const struct placement_var z[] = {{"z", 0, 4}};
        assert_int_equal(placement_compute(z, 1, 1, 0, &p), -EINVAL);
        assert_null(p);
        assert_null(placement_free(NULL));

        assert_int_equal(placement_compute(mlp, N_MLP, 2, 0, &p), 0);
        char buf[4096] = {0};
        FILE *f = fmemopen(buf, sizeof(buf) - 1, "w");
        placement_print(f, p, mlp);
        fclose(f);
        assert_non_null(strstr(buf, "dense0/kernel"));
        assert_non_null(strstr(buf, "0-784 of 784"));
        assert_non_null(strstr(buf, "802816"));
        placement_free(p);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_one_shard),    cmocka_unit_test(test_greedy_no_split),
        cmocka_unit_test(test_split_balances), cmocka_unit_test(test_split_limits),
        cmocka_unit_test(test_ties),         cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_errors_and_print))
