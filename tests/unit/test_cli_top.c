/* Tests of psfleet top's arithmetic (services/cli/cli_top.h): counter rates, a worker's steps/s from
 * two reports or from its own examples/s, medians, and the straggler definition at its edges. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit.h"

#include "cli_top.h"

/* cmocka has no float comparison: |a - b| <= eps */
#define assert_double_equal(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))

static void test_rate(void **state) {
        (void)state;
        assert_double_equal(top_rate(100, 350, 500000), 500.0, 1e-9);
        assert_double_equal(top_rate(7, 7, 1000000), 0.0, 0);
        assert_true(isnan(top_rate(1, 2, 0)));          /* no time passed */
        assert_true(isnan(top_rate(500, 10, 1000000))); /* the counter restarted */
}

static void test_worker_rate(void **state) {
        (void)state;
        struct top_report a = {.reported = true, .local_step = 100, .examples = 6400, .examples_per_s = 3200,
                               .last_report_us = 10000000},
                          b = {.reported = true, .local_step = 150, .examples = 9600, .examples_per_s = 9999,
                               .last_report_us = 12000000};
        /* two reports: their step difference over their time difference (25 steps/s), not the word */
        assert_double_equal(top_worker_rate(&a, &b), 25.0, 1e-9);
        /* no earlier sample, or no new report since: examples/s over the examples one step takes (64) */
        assert_double_equal(top_worker_rate(NULL, &a), 50.0, 1e-9);
        assert_double_equal(top_worker_rate(&a, &a), 50.0, 1e-9);
        /* a report that went back (the worker restarted): its own word again */
        assert_double_equal(top_worker_rate(&b, &(struct top_report){.reported = true, .local_step = 10, .examples = 640,
                                                                   .examples_per_s = 640, .last_report_us = 13000000}),
                            10.0, 1e-9);
        /* never reported, or reported nothing to go by */
        assert_true(isnan(top_worker_rate(&a, &(struct top_report){0})));
        assert_true(isnan(top_worker_rate(NULL, &(struct top_report){.reported = true, .last_report_us = 1})));
}

static void test_median(void **state) {
        (void)state;
        assert_double_equal(top_median((double[]){3, 1, 2}, 3), 2.0, 0);
        assert_double_equal(top_median((double[]){4, 1, 3, 2}, 4), 2.5, 0);
        assert_double_equal(top_median((double[]){5, NAN, 5, 1}, 4), 5.0, 0);   /* NaN left out */
        assert_double_equal(top_median((double[]){2, 2, 2, 9}, 4), 2.0, 0);     /* ties */
        assert_true(isnan(top_median((double[]){NAN, NAN}, 2)));
        assert_true(isnan(top_median(NULL, 0)));
}

static struct top_worker training(double steps_per_s, double age_s, double interval_s) {
        return (struct top_worker){.training = true, .steps_per_s = steps_per_s, .age_s = age_s,
                                   .report_interval_s = interval_s};
}

static void test_slow(void **state) {
        (void)state;
        /* three workers, one at a tenth of the others: it alone */
        struct top_worker w[3] = {training(100, 0.1, 0.5), training(96, 0.2, 0.5), training(10, 0.5, 5)};
        assert_double_equal(top_stragglers(w, 3), 96.0, 0);
        assert_int_equal(w[0].straggler, TOP_OK);
        assert_int_equal(w[1].straggler, TOP_OK);
        assert_int_equal(w[2].straggler, TOP_SLOW);
        assert_string_equal(top_straggler_name(w[2].straggler), "slow");
        assert_null(top_straggler_name(w[0].straggler));
        /* the edge: below half of the median is slow, half is not */
        struct top_worker e[3] = {training(100, 0, 1), training(100, 0, 1), training(50, 0, 1)};
        top_stragglers(e, 3);
        assert_int_equal(e[2].straggler, TOP_OK);
        e[2].steps_per_s = 49.9;
        top_stragglers(e, 3);
        assert_int_equal(e[2].straggler, TOP_SLOW);
        /* all equally slow: nobody is behind the others */
        struct top_worker same[2] = {training(3, 0, 1), training(3, 0, 1)};
        top_stragglers(same, 2);
        assert_int_equal(same[0].straggler, TOP_OK);
        assert_int_equal(same[1].straggler, TOP_OK);
}

static void test_not_judged(void **state) {
        (void)state;
        /* one known rate is no median: nothing slow */
        struct top_worker one[2] = {training(100, 0, 1), training(NAN, 0, 1)};
        assert_true(isnan(top_stragglers(one, 2)));
        assert_int_equal(one[0].straggler, TOP_OK);
        assert_int_equal(one[1].straggler, TOP_OK);
        /* a worker not training (never reported, done) is neither judged nor counted in the median */
        struct top_worker w[3] = {training(100, 0, 1), training(90, 0, 1),
                                  {.training = false, .steps_per_s = 1, .age_s = 1000, .report_interval_s = 1}};
        assert_double_equal(top_stragglers(w, 3), 95.0, 1e-9);
        assert_int_equal(w[2].straggler, TOP_OK);
        /* a straggler marked before is cleared when it catches up */
        w[1].straggler = TOP_SLOW;
        top_stragglers(w, 3);
        assert_int_equal(w[1].straggler, TOP_OK);
}

static void test_silent(void **state) {
        (void)state;
        /* no report for more than 3 of its own intervals (and at least 2 s): silent, whatever its rate */
        struct top_worker w[3] = {training(100, 0.3, 1), training(100, 3.5, 1), training(100, 2.9, 1)};
        top_stragglers(w, 3);
        assert_int_equal(w[0].straggler, TOP_OK);
        assert_int_equal(w[1].straggler, TOP_SILENT);
        assert_string_equal(top_straggler_name(w[1].straggler), "silent");
        assert_int_equal(w[2].straggler, TOP_OK);
        /* the 2 s floor: a worker that reports every 0.1 s is not silent after 1.5 s */
        struct top_worker f[2] = {training(100, 1.5, 0.1), training(100, 2.1, 0.1)};
        top_stragglers(f, 2);
        assert_int_equal(f[0].straggler, TOP_OK);
        assert_int_equal(f[1].straggler, TOP_SILENT);
        /* its own interval unknown (one report so far): the others' median interval stands in */
        struct top_worker u[3] = {training(100, 0.1, 2), training(100, 0.1, 2), training(NAN, 7, 0)};
        top_stragglers(u, 3);
        assert_int_equal(u[2].straggler, TOP_SILENT);
        u[2].age_s = 5;
        top_stragglers(u, 3);
        assert_int_equal(u[2].straggler, TOP_OK);
        /* no interval known anywhere: silence cannot be judged */
        struct top_worker none[2] = {training(NAN, 100, 0), training(NAN, 100, 0)};
        top_stragglers(none, 2);
        assert_int_equal(none[0].straggler, TOP_OK);
        assert_int_equal(none[1].straggler, TOP_OK);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_rate),
        cmocka_unit_test(test_worker_rate),
        cmocka_unit_test(test_median),
        cmocka_unit_test(test_slow),
        cmocka_unit_test(test_not_judged),
        cmocka_unit_test(test_silent))
