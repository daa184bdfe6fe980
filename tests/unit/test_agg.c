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

/* Two shards 0 of one job, assigned the same random values, and the indices of all their parts. */
struct twins {
        struct job_config *cfg;
        struct job_layout *L;
        float *params;
        struct rng g;
        struct shard *a, *b;
        uint32_t n, idx[16];
};

static void twins_init(struct twins *t, const char *training, uint64_t seed) {
        t->cfg = job(training);
        assert_int_equal(job_layout_new(t->cfg, &t->L), 0);
        t->params = malloc(t->L->n_params * sizeof(float));
        rng_init(&t->g, seed, 0);
        random_block(&t->g, t->params, t->L->n_params, 0.1f);
        t->a = assigned_shard(t->cfg, t->L, 0, t->params);
        t->b = assigned_shard(t->cfg, t->L, 0, t->params);
        t->n = t->a->n_parts;
        assert_true(t->n >= 2 && t->n <= 16);
        for (uint32_t k = 0; k < t->n; k++)
                t->idx[k] = k;
}

static void twins_done(struct twins *t) {
        free(t->params);
        shard_free(t->a);
        shard_free(t->b);
        job_layout_free(t->L);
        config_free(t->cfg);
}

static void test_sync_step(void **state) {
        struct twins t;
        twins_init(&t, "\"optimizer\": \"momentum\", \"nesterov\": true", 11);
        struct shard *a = t.a, *b = t.b;
        struct rng g = t.g;
        size_t nf = a->n_floats;
        uint32_t n = t.n, *idx = t.idx;
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
        twins_done(&t);
}

/* What agg_defer's function saw: the parts applied and their mean gradients (a copy). */
struct applied {
        struct shard *s;
        int calls;
        uint32_t n, idx[16];
        float *mean;   /* (n_floats) at each part's offset */
};

static void on_applied(void *ud, const uint32_t *idx, uint32_t n, const float *acc) {
        struct applied *ap = ud;
        ap->calls++;
        ap->n = n;
        for (uint32_t i = 0; i < n; i++) {
                const struct shard_part *q = &ap->s->parts[idx[i]];
                ap->idx[i] = idx[i];
                memcpy(ap->mean + (q->a.w - ap->s->block), acc + (q->a.w - ap->s->block), q->a.n * sizeof(float));
        }
}

/* ps.replicas 2: the primary's step applied at once but its pushes let go only by agg_advance (with
 * the backup's verdict); the backup applies the mean the primary applied and its steps follow
 * (agg_replayed), bit-equal; a state transfer carries each part's step (agg_steps_get/_set). */
static void test_deferred_step(void **state) {
        struct twins t;
        twins_init(&t, "\"optimizer\": \"adam\"", 5);
        struct shard *a = t.a, *b = t.b;
        struct rng g = t.g;
        size_t nf = a->n_floats;
        uint32_t n = t.n, *idx = t.idx;
        float *gw[2];
        for (int w = 0; w < 2; w++) {
                gw[w] = malloc(nf * sizeof(float));
                random_block(&g, gw[w], nf, 1.0f);
        }
        struct applied ap = {.s = a, .mean = calloc(nf, sizeof(float))};
        struct agg *pa, *ba;
        assert_int_equal(agg_new(a, 2, 2, &pa), 0);
        assert_int_equal(agg_new(b, 2, 2, &ba), 0);
        agg_reset(pa, 0);
        agg_reset(ba, 0);
        agg_defer(pa, on_applied, &ap);
        struct rec r0, r1;
        uint64_t step;
        for (uint64_t st = 0; st < 3; st++) {
                rec_init(&r0, 0, st, idx, n);
                rec_init(&r1, 1, st, idx, n);
                assert_int_equal(agg_push(pa, &r0.w, gw[0], 1000000, &step), AGG_HELD);
                assert_int_equal(ap.calls, (int)st);
                assert_int_equal(agg_push(pa, &r1.w, gw[1], 1000000, &step), AGG_HELD);
                /* applied, the parts' steps moved, but nobody let go and global_step not moved yet */
                assert_int_equal(ap.calls, (int)st + 1);
                assert_int_equal(ap.n, n);
                assert_int_equal(step, st + 1);
                assert_true(r0.released == 0 && r1.released == 0);
                assert_int_equal(atomic_load(&a->global_step), st);
                /* the backup applies the same mean, its steps follow */
                for (uint32_t i = 0; i < ap.n; i++) {
                        struct shard_part *q = &b->parts[ap.idx[i]];
                        pthread_mutex_lock(&q->mu);
                        apply_gradient(b->t, &q->a, ap.mean + (q->a.w - b->block));
                        pthread_mutex_unlock(&q->mu);
                }
                agg_replayed(ba, ap.idx, ap.n);
                assert_int_equal(atomic_load(&b->global_step), st + 1);
                /* its acknowledgement lets them go; the last one's, refused, says why */
                if (st < 2)
                        agg_advance(pa, 0, NULL);
                else
                        agg_advance(pa, -EAGAIN, "its backup did not acknowledge the update");
                assert_true(r0.released == 1 && r1.released == 1 && r0.step == st + 1);
                assert_int_equal(r1.status, st < 2 ? 0 : -EAGAIN);
                assert_int_equal(atomic_load(&a->global_step), st + 1);
        }
        assert_non_null(strstr(r1.msg, "did not acknowledge"));
        assert_memory_equal(a->block, b->block, nf * (1 + a->n_slots) * sizeof(float));
        /* a state transfer: every part's step, whatever they are, and the shard's the least */
        uint64_t steps[16];
        agg_steps_get(pa, steps);
        for (uint32_t k = 0; k < n; k++)
                assert_int_equal(steps[k], 3);
        steps[1] = 4;
        agg_steps_set(ba, steps);
        struct agg_status st;
        agg_status_get(ba, &st);
        assert_int_equal(st.step, 3);
        /* a push of step 3 to part 1, which is at step 4: stale */
        rec_init(&r0, 0, 3, idx + 1, 1);
        assert_int_equal(agg_push(ba, &r0.w, gw[0], 1000000, &step), AGG_STALE);
        assert_int_equal(step, 4);
        agg_free(pa);
        agg_free(ba);
        for (int w = 0; w < 2; w++)
                free(gw[w]);
        free(ap.mean);
        twins_done(&t);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_sync_step),
        cmocka_unit_test(test_deferred_step))
