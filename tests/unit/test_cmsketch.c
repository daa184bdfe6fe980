/* cmsketch: counts never fall short of the additions, conservative update keeps a rare key's estimate
 * near its count beside heavy ones, saturation, halving by hand and by reset_after, bad shapes,
 * threads. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "unit.h"

#include "cmsketch.h"

static void test_new_invalid(void **state)
{
        struct cmsketch *s = NULL;
        assert_int_equal(cmsketch_new(3, 4, 0, &s), -EINVAL);
        assert_int_equal(cmsketch_new(29, 4, 0, &s), -EINVAL);
        assert_int_equal(cmsketch_new(10, 0, 0, &s), -EINVAL);
        assert_int_equal(cmsketch_new(10, 9, 0, &s), -EINVAL);
        assert_null(s);
        assert_null(cmsketch_free(NULL));
}

static void test_counts(void **state)
{
        struct cmsketch *s = NULL;
        assert_int_equal(cmsketch_new(12, 4, 0, &s), 0);
        assert_int_equal(cmsketch_bytes(s), cmsketch_bytes_for(12, 4));
        assert_true(cmsketch_bytes(s) >= 4u << 12);
        assert_int_equal(cmsketch_estimate(s, 42), 0);
        assert_int_equal(cmsketch_add(s, 42), 1);
        assert_int_equal(cmsketch_add(s, 42), 2);
        assert_int_equal(cmsketch_estimate(s, 42), 2);
        /* 2000 keys seen 3 times each in a sketch of 4096 columns: never under, rarely over */
        unsigned over = 0;
        for (int round = 0; round < 3; round++)
                for (uint64_t k = 1000; k < 3000; k++)
                        cmsketch_add(s, k);
        for (uint64_t k = 1000; k < 3000; k++) {
                unsigned e = cmsketch_estimate(s, k);
                assert_true(e >= 3);
                over += e > 3;
        }
        assert_true(over < 2000 / 20);
        /* a never-seen key next to them is mostly 0 */
        unsigned nonzero = 0;
        for (uint64_t k = 100000; k < 101000; k++)
                nonzero += cmsketch_estimate(s, k) > 0;
        assert_true(nonzero < 1000 / 10);
        cmsketch_free(s);
}

static void test_saturate_halve(void **state)
{
        struct cmsketch *s = NULL;
        assert_int_equal(cmsketch_new(8, 2, 0, &s), 0);
        for (int i = 0; i < 300; i++)
                cmsketch_add(s, 7);
        assert_int_equal(cmsketch_estimate(s, 7), CMSKETCH_MAX);
        cmsketch_halve(s);
        assert_int_equal(cmsketch_estimate(s, 7), CMSKETCH_MAX / 2);
        cmsketch_free(s);
        /* reset_after 10: the 10th addition halves everything */
        assert_int_equal(cmsketch_new(8, 2, 10, &s), 0);
        for (int i = 0; i < 9; i++)
                assert_int_equal(cmsketch_add(s, 5), (unsigned)i + 1);
        assert_int_equal(cmsketch_add(s, 5), 10);
        assert_int_equal(cmsketch_estimate(s, 5), 5);
        cmsketch_free(s);
}

struct arg {
        struct cmsketch *s;
        uint64_t base;
};

static void *adder(void *p)
{
        struct arg *a = p;
        for (int r = 0; r < 50; r++)
                for (uint64_t k = 0; k < 1000; k++)
                        cmsketch_add(a->s, a->base + k);
        return NULL;
}

static void test_threads(void **state)
{
        struct cmsketch *s = NULL;
        assert_int_equal(cmsketch_new(16, 4, 0, &s), 0);
        pthread_t th[4];
        struct arg a[4];
        for (int i = 0; i < 4; i++) {
                a[i] = (struct arg){s, (uint64_t)i << 32};
                assert_int_equal(pthread_create(&th[i], NULL, adder, &a[i]), 0);
        }
        for (int i = 0; i < 4; i++)
                pthread_join(th[i], NULL);
        /* each thread's keys are its own: each was added 50 times by one thread */
        for (int i = 0; i < 4; i++)
                for (uint64_t k = 0; k < 1000; k++)
                        assert_true(cmsketch_estimate(s, ((uint64_t)i << 32) + k) >= 50);
        cmsketch_free(s);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_new_invalid), cmocka_unit_test(test_counts),
        cmocka_unit_test(test_saturate_halve), cmocka_unit_test(test_threads))
