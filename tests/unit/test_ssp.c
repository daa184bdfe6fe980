/* psd's bounded staleness (ssp.c) without RPC: held at the bound, let go when the slowest moves, a
 * late or restarted worker joining at the slowest clock. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "ssp.h"
#include "util.h"

#include "shard_fixture.h"
#include "unit.h"

static void test_ssp_clocks(void **state) {
        struct ssp *sp;
        struct rec a, b;
        struct ssp_clock clk[2];
        uint64_t ahead;
        int peer;
        char why[300];
        assert_int_equal(ssp_new(2, 1, 10000000u, &sp), 0);
        rec_init(&a, 0, 0, NULL, 0);
        rec_init(&b, 1, 0, NULL, 0);
        /* worker 0 alone: nobody to wait for */
        assert_false(ssp_arrive(sp, &a.w, 0, 1000000));
        assert_false(ssp_arrive(sp, &a.w, 1, 1000000));
        /* worker 1 comes late: it joins at the slowest clock, not 2 steps behind */
        assert_false(ssp_arrive(sp, &b.w, 0, 1000000));
        assert_int_equal(ssp_table(sp, clk, &ahead, why, sizeof(why), &peer), 2);
        assert_true(clk[0].clock == 2 && clk[1].clock == 2 && clk[0].live && clk[1].live);
        /* s = 1: one step ahead goes, two are held until worker 1 moves */
        assert_false(ssp_arrive(sp, &a.w, 2, 1000000));
        assert_true(ssp_arrive(sp, &a.w, 3, 1000000));
        assert_int_equal(ssp_table(sp, clk, &ahead, why, sizeof(why), &peer), 2);
        assert_true(clk[0].waiting && !clk[1].waiting && peer == 1 && ahead == 1);
        assert_non_null(strstr(why, "worker:0 is 2 steps ahead of worker:1"));
        assert_false(ssp_arrive(sp, &b.w, 1, 1000000));
        assert_true(a.released == 1 && a.status == 0);
        /* a deadline ends a wait with the reason */
        rec_init(&a, 0, 0, NULL, 0);
        assert_true(ssp_arrive(sp, &a.w, 4, 0));
        ssp_tick(sp, now_us());
        assert_true(a.released == 1 && a.status == -ETIMEDOUT);
        assert_non_null(strstr(a.msg, "ahead of worker:1"));
        /* a held link that goes away is dropped unanswered; a worker gone stops holding others back */
        rec_init(&a, 0, 0, NULL, 0);
        a.w.owner = &a;
        assert_true(ssp_arrive(sp, &a.w, 5, 1000000));
        ssp_forget(sp, &a);
        assert_int_equal(a.released, 0);
        rec_init(&a, 0, 0, NULL, 0);
        assert_true(ssp_arrive(sp, &a.w, 6, 100000000));
        ssp_tick(sp, now_us() + 20000000u);
        assert_true(a.released == 1 && a.status == 0);
        /* worker 1 restarted (its local steps start over): it joins at the slowest clock again */
        assert_false(ssp_arrive(sp, &b.w, 0, 1000000));
        ssp_table(sp, clk, &ahead, NULL, 0, &peer);
        assert_int_equal(clk[1].clock, 3);
        /* the job's last steps: nobody waits any more */
        rec_init(&a, 0, 0, NULL, 0);
        ssp_finish(sp);
        assert_false(ssp_arrive(sp, &a.w, 20, 1000000));
        ssp_free(sp);
}

/* ps.replicas 2: a backup's clocks follow the primary's pushes (ssp_note, nobody held) and a state
 * transfer copies the table */
static void test_ssp_backup(void **state) {
        struct ssp *primary, *backup, *fresh;
        struct rec a, b;
        uint64_t clock[2], raw[2], c2[2], r2[2];
        (void)state;
        assert_int_equal(ssp_new(2, 1, 10000000u, &primary), 0);
        assert_int_equal(ssp_new(2, 1, 10000000u, &backup), 0);
        assert_int_equal(ssp_new(2, 1, 10000000u, &fresh), 0);
        rec_init(&a, 0, 0, NULL, 0);
        rec_init(&b, 1, 0, NULL, 0);
        uint64_t steps[][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {0, 3}};
        for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
                struct rec *r = steps[i][0] ? &b : &a;
                rec_init(r, (uint32_t)steps[i][0], 0, NULL, 0);
                ssp_arrive(primary, &r->w, steps[i][1], 1000000);
                ssp_note(backup, (uint32_t)steps[i][0], steps[i][1]);
        }
        ssp_copy_out(primary, clock, raw);
        ssp_copy_out(backup, c2, r2);
        assert_memory_equal(clock, c2, sizeof(clock));
        assert_memory_equal(raw, r2, sizeof(raw));
        assert_true(clock[0] == 4 && clock[1] == 2);
        ssp_copy_in(fresh, clock, raw);
        ssp_copy_out(fresh, c2, r2);
        assert_memory_equal(clock, c2, sizeof(clock));
        assert_int_equal(ssp_n_workers(fresh), 2);
        ssp_tick(primary, UINT64_MAX);
        ssp_free(primary);
        ssp_free(backup);
        ssp_free(fresh);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_ssp_clocks),
        cmocka_unit_test(test_ssp_backup))
