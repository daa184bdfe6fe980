/* psd's synchronous step (agg.c) without RPC: N gradients summed in worker order whatever their order
 * of arrival, stale and ahead pushes, a push sent again, deadlines and the reason status shows. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "agg.h"
#include "apply.h"
#include "util.h"

#include "shard_fixture.h"
#include "unit.h"

static void test_sync_step(void **state) {
        struct job_config *cfg = job("\"optimizer\": \"momentum\", \"nesterov\": true");
        struct job_layout *L;
        assert_int_equal(job_layout_new(cfg, &L), 0);
        size_t np = L->n_params;
        float *params = malloc(np * sizeof(float)), *ref = malloc(np * sizeof(float));
        struct rng g;
        rng_init(&g, 11, 0);
        random_block(&g, params, np, 0.1f);
        struct shard *a = assigned_shard(cfg, L, 0, params), *b = assigned_shard(cfg, L, 0, params);
        size_t nf = a->n_floats;
        uint32_t n = a->n_parts, idx[16];
        assert_true(n <= 16);
        for (uint32_t k = 0; k < n; k++)
                idx[k] = k;
        float *gw[3], *sum = malloc(nf * sizeof(float));
        for (int w = 0; w < 3; w++) {
                gw[w] = malloc(nf * sizeof(float));
                random_block(&g, gw[w], nf, 1.0f);
        }
        struct agg *ag;
        assert_int_equal(agg_new(a, 3, 4, &ag), -EINVAL);   /* N over the workers */
        assert_int_equal(agg_new(a, 3, 2, &ag), 0);
        agg_reset(ag, 0);
        struct rec r0, r1, r2, again;
        uint64_t step;

        /* worker 1 first, then worker 0: the sum is still g0 + g1, applied once as their mean */
        rec_init(&r1, 1, 0, idx, n);
        assert_int_equal(agg_push(ag, &r1.w, gw[1], 1000000, &step), AGG_HELD);
        assert_int_equal(r1.released, 0);
        struct agg_status st;
        agg_status_get(ag, &st);
        assert_int_equal(st.waiting, 1);
        assert_string_equal(st.peer, "worker:0");
        assert_non_null(strstr(st.reason, "1 of 2 gradients (worker:1); waiting for 1 more, from worker:0, worker:2"));
        rec_init(&r0, 0, 0, idx, n);
        assert_int_equal(agg_push(ag, &r0.w, gw[0], 1000000, &step), AGG_HELD);
        assert_int_equal(step, 1);
        assert_true(r0.released == 1 && r1.released == 1 && r0.status == 0 && r0.step == 1 && r1.step == 1);
        for (size_t i = 0; i < nf; i++)
                sum[i] = gw[0][i] + gw[1][i];
        apply_scale(sum, nf, 0.5f);
        for (uint32_t k = 0; k < n; k++) {
                pthread_mutex_lock(&b->parts[k].mu);
                apply_gradient(b->t, &b->parts[k].a, sum + (b->parts[k].a.w - b->block));
                pthread_mutex_unlock(&b->parts[k].mu);
        }
        assert_memory_equal(a->block, b->block, nf * (1 + a->n_slots) * sizeof(float));
        assert_int_equal(atomic_load(&a->global_step), 1);

        /* the backup's gradient of step 0 comes too late: dropped, counted, answered with step 1 */
        rec_init(&r2, 2, 0, idx, n);
        assert_int_equal(agg_push(ag, &r2.w, gw[2], 1000000, &step), AGG_STALE);
        assert_int_equal(step, 1);
        assert_int_equal(r2.released, 0);
        /* a step not reached yet (the shard was restored meanwhile): refused */
        rec_init(&r2, 2, 7, idx, n);
        assert_int_equal(agg_push(ag, &r2.w, gw[2], 1000000, &step), AGG_REFUSED);
        /* worker 0 pushes step 1, gives up, pushes again: the first is cancelled, counted once */
        rec_init(&r0, 0, 1, idx, n);
        assert_int_equal(agg_push(ag, &r0.w, gw[0], 1000000, &step), AGG_HELD);
        rec_init(&again, 0, 1, idx, n);
        assert_int_equal(agg_push(ag, &again.w, gw[1], 1000000, &step), AGG_HELD);
        assert_true(r0.released == 1 && r0.status == -ECANCELED);
        assert_int_equal(again.released, 0);
        agg_status_get(ag, &st);
        assert_int_equal(st.step, 1);
        assert_int_equal(st.stale, 1);
        assert_int_equal(st.have, 1);
        assert_int_equal(st.waiting, 1);
        /* nobody else comes: the deadline answers it, saying for whom it waited */
        assert_int_equal(agg_expire(ag, now_us()), 0);
        assert_int_equal(agg_expire(ag, UINT64_MAX), 1);
        assert_true(again.released == 1 && again.status == -ETIMEDOUT);
        assert_non_null(strstr(again.msg, "sync step 1 of "));
        assert_non_null(strstr(again.msg, "waiting for 1 more, from worker:1, worker:2"));
        /* the gradient of the push that timed out still counts: worker 1's completes step 1 */
        rec_init(&r1, 1, 1, idx, n);
        assert_int_equal(agg_push(ag, &r1.w, gw[1], 1000000, &step), AGG_HELD);
        assert_true(r1.released == 1 && r1.status == 0 && r1.step == 2);
        /* a link that goes away takes its held pushes with it, unanswered */
        rec_init(&r2, 2, 2, idx, n);
        r2.w.owner = &r2;
        assert_int_equal(agg_push(ag, &r2.w, gw[2], 1000000, &step), AGG_HELD);
        agg_forget(ag, &r2);
        agg_status_get(ag, &st);
        assert_int_equal(st.waiting, 0);
        assert_int_equal(r2.released, 0);
        /* assigned again: everything held or gathered is gone, the step is the assigned one */
        agg_reset(ag, 40);
        agg_status_get(ag, &st);
        assert_true(st.step == 40 && st.have == 0);
        agg_free(ag);
        for (int w = 0; w < 3; w++)
                free(gw[w]);
        free(sum);
        free(params);
        free(ref);
        shard_free(a);
        shard_free(b);
        job_layout_free(L);
        config_free(cfg);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_sync_step))
