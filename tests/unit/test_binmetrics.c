/* binmetrics: the AUC against a brute-force count over every (positive, negative) pair, with many ties;
 * log loss and RMSE against hand computations; empty and one-class inputs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "unit.h"

#include "binmetrics.h"
#include "rng.h"

static double brute_auc(const float *p, const float *y, size_t n)
{
        double s = 0, np = 0, nn = 0;
        for (size_t i = 0; i < n; i++) {
                np += y[i] > 0.5f;
                nn += y[i] <= 0.5f;
                for (size_t j = 0; j < n; j++)
                        if (y[i] > 0.5f && y[j] <= 0.5f)
                                s += p[i] > p[j] ? 1 : p[i] == p[j] ? 0.5 : 0;
        }
        return s / (np * nn);
}

static void test_auc_random_with_ties(void **state)
{
        (void)state;
        struct rng g;
        rng_init(&g, 7, 0);
        for (int trial = 0; trial < 40; trial++) {
                size_t n = 2 + rng_below(&g, 600);
                uint32_t levels = 1 + rng_below(&g, trial % 2 ? 5 : 1000); /* few levels: many ties */
                float *p = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
                for (size_t i = 0; i < n; i++) {
                        y[i] = rng_below(&g, 3) == 0;
                        p[i] = (float)rng_below(&g, levels) / (float)levels + (y[i] ? 0.1f : 0);
                }
                y[0] = 1, y[1] = 0;
                struct binmetrics *m;
                assert_int_equal(binmetrics_new(trial % 3 ? 0 : 10, &m), 0);
                /* in uneven pieces, as batches come */
                for (size_t i = 0; i < n;) {
                        size_t k = 1 + rng_below(&g, 50);
                        if (k > n - i)
                                k = n - i;
                        assert_int_equal(binmetrics_add(m, p + i, y + i, k), 0);
                        i += k;
                }
                assert_int_equal(binmetrics_count(m), n);
                double want = brute_auc(p, y, n);
                assert_true(fabs(binmetrics_auc(m) - want) < 1e-12);
                assert_true(fabs(binmetrics_auc(m) - want) < 1e-12); /* again, already sorted */
                binmetrics_free(m);
                free(p);
                free(y);
        }
}

static void test_auc_edges(void **state)
{
        (void)state;
        struct binmetrics *m;
        assert_int_equal(binmetrics_new(0, &m), 0);
        assert_true(isnan(binmetrics_auc(m)));
        assert_true(isnan(binmetrics_logloss(m)));
        assert_true(isnan(binmetrics_rmse(m)));
        float p[] = {0.1f, 0.4f, 0.35f, 0.8f}, y[] = {0, 0, 1, 1};
        assert_int_equal(binmetrics_add(m, p, y, 4), 0);
        assert_true(fabs(binmetrics_auc(m) - 0.75) < 1e-12); /* sklearn's textbook example */
        binmetrics_reset(m);
        assert_int_equal(binmetrics_count(m), 0);
        float sep[] = {0.9f, 0.8f, 0.2f}, ys[] = {1, 1, 0};
        assert_int_equal(binmetrics_add(m, sep, ys, 3), 0);
        assert_true(binmetrics_auc(m) == 1.0);
        binmetrics_reset(m);
        float rev[] = {0.1f, 0.8f}, yr[] = {1, 0};
        assert_int_equal(binmetrics_add(m, rev, yr, 2), 0);
        assert_true(binmetrics_auc(m) == 0.0);
        binmetrics_reset(m);
        float tie[] = {0.5f, 0.5f, 0.5f}, yt[] = {1, 0, 0};
        assert_int_equal(binmetrics_add(m, tie, yt, 3), 0);
        assert_true(binmetrics_auc(m) == 0.5);
        binmetrics_reset(m);
        float one[] = {0.5f, 0.7f}, yo[] = {1, 1};
        assert_int_equal(binmetrics_add(m, one, yo, 2), 0);
        assert_true(isnan(binmetrics_auc(m)));
        binmetrics_free(m);
        binmetrics_free(NULL);
}

static void test_logloss_rmse(void **state)
{
        (void)state;
        struct binmetrics *m;
        assert_int_equal(binmetrics_new(2, &m), 0);
        float p[] = {0.9f, 0.2f, 0.6f}, y[] = {1, 0, 0};
        assert_int_equal(binmetrics_add(m, p, y, 3), 0);
        double want = -(log((double)0.9f) + log(1 - (double)0.2f) + log(1 - (double)0.6f)) / 3;
        assert_true(fabs(binmetrics_logloss(m) - want) < 1e-12);
        double r = sqrt((pow(0.9f - 1.0, 2) + pow(0.2f, 2) + pow(0.6f, 2)) / 3);
        assert_true(fabs(binmetrics_rmse(m) - r) < 1e-12);
        /* p clamped: a certain wrong answer costs -log(1e-7), not infinity */
        binmetrics_reset(m);
        float p0[] = {0, 1}, y0[] = {1, 0};
        assert_int_equal(binmetrics_add(m, p0, y0, 2), 0);
        assert_true(fabs(binmetrics_logloss(m) + log(1e-7)) < 1e-6);
        /* RMSE of a regressor: any labels */
        binmetrics_reset(m);
        float pr[] = {3, -1, 10}, yr[] = {1, -2, 10};
        assert_int_equal(binmetrics_add(m, pr, yr, 3), 0);
        assert_true(fabs(binmetrics_rmse(m) - sqrt(5.0 / 3)) < 1e-12);
        binmetrics_free(m);
}

/* 10^5 pairs, as an evaluation has: O(n log n) keeps it quick; a known AUC from two shifted normals. */
static void test_auc_large(void **state)
{
        (void)state;
        struct binmetrics *m;
        assert_int_equal(binmetrics_new(1000, &m), 0);
        struct rng g;
        rng_init(&g, 3, 1);
        for (int i = 0; i < 100000; i++) {
                float y = (float)(i % 2), p = (float)(rng_normal(&g) + (y ? 1.0 : 0.0));
                assert_int_equal(binmetrics_add(m, &p, &y, 1), 0);
        }
        /* P(X + 1 > Y) for X, Y standard normal = Phi(1 / sqrt 2) = 0.7602 */
        assert_true(fabs(binmetrics_auc(m) - 0.7602) < 0.01);
        binmetrics_free(m);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_auc_random_with_ties),
        cmocka_unit_test(test_auc_edges),
        cmocka_unit_test(test_logloss_rmse),
        cmocka_unit_test(test_auc_large))
