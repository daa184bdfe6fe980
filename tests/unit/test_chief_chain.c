/* chief_chain: which records make a chain of incremental checkpoints, and a table's rows after an
 * increment. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "unit.h"

#include "chief_chain.h"

/* Records: 0 full, 10 on 0, 20 on 10, 30 full, 40 on 25 (a parent never recorded). */
static const struct chief_db_checkpoint rows[] = {
        {.global_step = 0},
        {.global_step = 10, .incremental = true, .parent_step = 0},
        {.global_step = 20, .incremental = true, .parent_step = 10},
        {.global_step = 30},
        {.global_step = 40, .incremental = true, .parent_step = 25},
};
enum { N = sizeof(rows) / sizeof(rows[0]) };

static void test_chain_of(void **state)
{
        (void)state;
        bool gone[N] = {false};
        size_t chain[N], k = 0, broken = N;
        assert_int_equal(chief_chain_of(rows, N, gone, 2, chain, &k, &broken), 0);
        assert_int_equal(k, 3);
        assert_int_equal(chain[0], 0);
        assert_int_equal(chain[1], 1);
        assert_int_equal(chain[2], 2);
        /* a full checkpoint is a chain of itself */
        assert_int_equal(chief_chain_of(rows, N, gone, 3, chain, &k, &broken), 0);
        assert_int_equal(k, 1);
        assert_int_equal(chain[0], 3);
        /* a parent never recorded, or forgotten: the link whose parent is missing */
        assert_int_equal(chief_chain_of(rows, N, gone, 4, chain, &k, &broken), -ENOENT);
        assert_int_equal(broken, 4);
        gone[1] = true;
        assert_int_equal(chief_chain_of(rows, N, gone, 2, chain, &k, &broken), -ENOENT);
        assert_int_equal(broken, 2);
}

static void rows_of(struct ps_sparse_rows *r, size_t n, const uint64_t *ids, float base)
{
        r->n = n;
        r->dim = 2;
        r->n_slots = 1;
        r->ids = malloc((n ? n : 1) * sizeof(uint64_t));
        r->values = malloc((n ? n : 1) * 2 * sizeof(float));
        r->slots[0] = malloc((n ? n : 1) * 2 * sizeof(float));
        for (size_t i = 0; i < n; i++) {
                r->ids[i] = ids[i];
                for (int j = 0; j < 2; j++) {
                        r->values[i * 2 + j] = base + (float)ids[i] + (float)j / 10;
                        r->slots[0][i * 2 + j] = -(base + (float)ids[i]);
                }
        }
}

static void test_apply(void **state)
{
        (void)state;
        struct ps_sparse_rows acc = {0}, inc = {0}, ev = {0};
        rows_of(&acc, 4, (const uint64_t[]){1, 2, 3, 4}, 0);
        /* 2 evicted; 3 changed; 5 new; 4 evicted and made again since */
        rows_of(&inc, 3, (const uint64_t[]){3, 5, 4}, 100);
        rows_of(&ev, 2, (const uint64_t[]){2, 4}, 0);
        assert_int_equal(chief_chain_apply(&acc, &inc, &ev), 0);
        const uint64_t want[] = {1, 3, 4, 5};
        const float base[] = {0, 100, 100, 100};
        assert_int_equal(acc.n, 4);
        for (size_t i = 0; i < acc.n; i++) {
                uint64_t id = acc.ids[i];
                size_t w = 0;
                while (w < 4 && want[w] != id)
                        w++;
                assert_true(w < 4);
                assert_true(acc.values[i * 2 + 1] == base[w] + (float)id + 0.1f);
                assert_true(acc.slots[0][i * 2] == -(base[w] + (float)id));
        }
        /* acc's rows keep their order: 1 first */
        assert_int_equal(acc.ids[0], 1);
        ps_sparse_rows_clear(&acc);
        ps_sparse_rows_clear(&inc);
        ps_sparse_rows_clear(&ev);
}

UNIT_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_chain_of), cmocka_unit_test(test_apply))
