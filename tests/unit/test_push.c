/* push plan: how a worker's parts group into pushes (a row block of a large variable alone, the other
 * variables of a shard together), which parts a model callback covers, and which (var, block) of
 * backward completes which group, step after step. Pure: no model, no network. */
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
#include "push.h"

/* A large first layer (800 bytes, split in two row blocks of 400 at split_bytes 400) and small rest. */
static const struct placement_var model[] = {
        {"dense0/kernel", 8, 100}, {"dense0/bias", 1, 100},
        {"dense1/kernel", 4, 40},  {"dense1/bias", 1, 40},
};
#define N_VARS 4

/* Backward's order of callbacks: layers last to first, in a layer the bias first, then the kernel's
 * blocks in order. */
static const uint32_t backward_order[][2] = {{3, 0}, {2, 0}, {1, 0}, {0, 0}, {0, 1}};

static struct placement *plan_of(uint32_t n_shards, uint64_t split_bytes, struct job_layout *L) {
        struct placement *p;
        assert_int_equal(placement_compute(model, N_VARS, n_shards, split_bytes, &p), 0);
        *L = (struct job_layout){.n_vars = N_VARS, .plan = p, .n_shards = n_shards};
        return p;
}

/* Every part is in exactly one group, of its own shard, and part_group says which. */
static void check_cover(const struct push_plan *pl, const struct placement *p) {
        uint32_t seen[16] = {0};
        for (uint32_t g = 0; g < pl->n_groups; g++) {
                assert_true(pl->groups[g].n_parts >= 1);
                for (uint32_t i = 0; i < pl->groups[g].n_parts; i++) {
                        uint32_t part = pl->groups[g].parts[i];
                        assert_true(part < p->n_parts);
                        assert_int_equal(p->parts[part].shard, pl->groups[g].shard);
                        assert_int_equal(pl->part_group[part], g);
                        seen[part]++;
                }
        }
        for (uint32_t i = 0; i < p->n_parts; i++)
                assert_int_equal(seen[i], 1);
}

static void test_blocked_over_two_shards(void **state) {
        struct job_layout L;
        struct placement *p = plan_of(2, 400, &L);
        /* parts by (var, row): dense0/kernel 0-4 and 4-8 (ps:0, ps:1: largest first, ties to the lower
         * shard), dense0/bias (ps:1), dense1/kernel (ps:0), dense1/bias (ps:1) */
        assert_int_equal(p->n_parts, 5);
        const uint32_t shard[5] = {0, 1, 1, 0, 1};
        for (uint32_t i = 0; i < 5; i++)
                assert_int_equal(p->parts[i].shard, shard[i]);

        const bool blocked[N_VARS] = {true, false, false, false};
        struct push_plan *pl;
        assert_int_equal(push_plan_new(&L, blocked, &pl), 0);
        check_cover(pl, p);
        /* each row block alone; the other variables of a shard together */
        assert_int_equal(pl->n_groups, 4);
        const uint32_t part_group[5] = {0, 1, 2, 3, 2};
        for (uint32_t i = 0; i < 5; i++)
                assert_int_equal(pl->part_group[i], part_group[i]);
        assert_int_equal(pl->groups[0].shard, 0);
        assert_int_equal(pl->groups[1].shard, 1);
        assert_int_equal(pl->groups[2].shard, 1);
        assert_int_equal(pl->groups[2].n_parts, 2);
        assert_int_equal(pl->groups[3].shard, 0);

        /* what each callback covers: block b of the blocked variable is its part b */
        uint32_t first, n = push_plan_block(pl, 0, 1, &first);
        assert_int_equal(n, 1);
        assert_int_equal(first, 1);
        n = push_plan_block(pl, 3, 0, &first);
        assert_int_equal(n, 1);
        assert_int_equal(first, 4);

        /* which (var, block) completes which group, the same every step */
        const int32_t completes[5] = {-1, 3, 2, 0, 1};
        for (int step = 0; step < 3; step++) {
                for (uint32_t k = 0; k < 5; k++) {
                        uint32_t groups[5];
                        n = push_plan_ready(pl, backward_order[k][0], backward_order[k][1], groups);
                        if (completes[k] < 0) {
                                assert_int_equal(n, 0);
                        } else {
                                assert_int_equal(n, 1);
                                assert_int_equal(groups[0], (uint32_t)completes[k]);
                        }
                }
                for (uint32_t g = 0; g < pl->n_groups; g++)
                        assert_int_equal(pl->remaining[g], pl->groups[g].n_parts);
        }
        /* a step cut short (a failed push) starts the next one over */
        uint32_t groups[5];
        assert_int_equal(push_plan_ready(pl, 3, 0, groups), 0);
        assert_int_equal(pl->remaining[2], 1);
        push_plan_restart(pl);
        assert_int_equal(pl->remaining[2], 2);
        push_plan_free(pl);
        placement_free(p);
}

/* A variable split over two shards that the model could not block (a conv kernel, say) is one
 * callback covering both its parts, which travel with their shards' other variables. */
static void test_split_not_blocked(void **state) {
        struct job_layout L;
        struct placement *p = plan_of(2, 400, &L);
        const bool blocked[N_VARS] = {false, false, false, false};
        struct push_plan *pl;
        assert_int_equal(push_plan_new(&L, blocked, &pl), 0);
        check_cover(pl, p);
        assert_int_equal(pl->n_groups, 2);   /* one per shard */
        uint32_t first, n = push_plan_block(pl, 0, 0, &first);
        assert_int_equal(n, 2);
        assert_int_equal(first, 0);
        uint32_t groups[5], total = 0;
        for (uint32_t k = 0; k < 4; k++) {
                n = push_plan_ready(pl, backward_order[k][0], backward_order[k][1], groups);
                total += n;
                if (k < 3)
                        assert_int_equal(n, 0);   /* both shards hold a part of dense0/kernel, the last */
        }
        assert_int_equal(total, 2);
        assert_true(groups[0] != groups[1]);
        push_plan_free(pl);
        placement_free(p);
}

/* One shard, nothing split: one push per step, sent when the last gradient is final. */
static void test_one_shard(void **state) {
        struct job_layout L;
        struct placement *p = plan_of(1, 0, &L);
        const bool blocked[N_VARS] = {0};
        struct push_plan *pl;
        assert_int_equal(push_plan_new(&L, blocked, &pl), 0);
        check_cover(pl, p);
        assert_int_equal(pl->n_groups, 1);
        assert_int_equal(pl->groups[0].n_parts, 4);
        uint32_t groups[4];
        for (uint32_t k = 0; k < 3; k++)
                assert_int_equal(push_plan_ready(pl, backward_order[k][0], 0, groups), 0);
        assert_int_equal(push_plan_ready(pl, 0, 0, groups), 1);
        assert_int_equal(groups[0], 0);
        push_plan_free(pl);
        placement_free(p);
        assert_null(push_plan_free(NULL));
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_blocked_over_two_shards), cmocka_unit_test(test_split_not_blocked),
        cmocka_unit_test(test_one_shard))
