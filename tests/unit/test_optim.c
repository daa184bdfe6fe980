/* optim: each optimizer against hand-computed updates, learning-rate schedules, finiteness; the one
 * apply (apply.h) over it: a gradient read in pieces equals one given whole, and each counts a step. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "apply.h"
#include "optim.h"

static void test_sgd(void **state)
{
        struct training_config t = {.optimizer = OPT_SGD, .learning_rate = 0.5};
        float w[3] = {1, 2, 3};
        const float g[3] = {0.2f, -0.4f, 0};
        assert_int_equal(optim_n_slots(OPT_SGD), 0);
        assert_null(optim_slot_name(OPT_SGD, 0));
        optim_apply(&t, 0, w, g, NULL, 3);
        assert_float_equal(w[0], 0.9, 1e-6);
        assert_float_equal(w[1], 2.2, 1e-6);
        assert_float_equal(w[2], 3.0, 1e-6);
}

static void test_momentum(void **state)
{
        struct training_config t = {.optimizer = OPT_MOMENTUM, .learning_rate = 0.1, .momentum = 0.9};
        assert_int_equal(optim_n_slots(OPT_MOMENTUM), 1);
        assert_string_equal(optim_slot_name(OPT_MOMENTUM, 0), "momentum");
        assert_float_equal(optim_slot_init(&t, 0), 0.0, 0);
        /* 19 elements: the blocked loop and its tail */
        float w[19], acc[19] = {0}, g[19];
        for (int i = 0; i < 19; i++)
                w[i] = 1.0f, g[i] = 1.0f;
        float *slots[1] = {acc};
        optim_apply(&t, 0, w, g, slots, 19); /* acc = 1; w = 1 - 0.1 = 0.9 */
        optim_apply(&t, 1, w, g, slots, 19); /* acc = 1.9; w = 0.9 - 0.19 = 0.71 */
        for (int i = 0; i < 19; i++) {
                assert_float_equal(acc[i], 1.9, 1e-6);
                assert_float_equal(w[i], 0.71, 1e-6);
        }
        t.nesterov = true;
        float wn[1] = {1}, an[1] = {0}, gn[1] = {1};
        float *sn[1] = {an};
        optim_apply(&t, 0, wn, gn, sn, 1); /* acc = 1; w = 1 - 0.1 * (1 + 0.9) = 0.81 */
        assert_float_equal(wn[0], 0.81, 1e-6);
        optim_apply(&t, 1, wn, gn, sn, 1); /* acc = 1.9; w = 0.81 - 0.1 * (1 + 1.71) = 0.539 */
        assert_float_equal(wn[0], 0.539, 1e-6);
}

static void test_adam(void **state)
{
        struct training_config t = {.optimizer = OPT_ADAM, .learning_rate = 0.001, .beta1 = 0.9,
                                    .beta2 = 0.999, .epsilon = 1e-8};
        assert_int_equal(optim_n_slots(OPT_ADAM), 2);
        assert_string_equal(optim_slot_name(OPT_ADAM, 0), "m");
        assert_string_equal(optim_slot_name(OPT_ADAM, 1), "v");
        float w[2] = {1, -1}, g[2] = {0.5f, -2}, m[2] = {0}, v[2] = {0};
        float *slots[2] = {m, v};
        optim_apply(&t, 0, w, g, slots, 2);
        /* t = 1: lr_t = 0.001 * sqrt(0.001) / 0.1; m = 0.1 g; v = 0.001 g^2; step = lr_t * m / sqrt(v)
         * = 0.001 * sign(g) (up to eps) */
        assert_float_equal(m[0], 0.05, 1e-7);
        assert_float_equal(v[1], 0.004, 1e-7);
        assert_float_equal(w[0], 1 - 0.001, 1e-6);
        assert_float_equal(w[1], -1 + 0.001, 1e-6);
        optim_apply(&t, 1, w, g, slots, 2);
        /* t = 2: m = 0.19 * 0.5 = 0.095; v = 0.001999 * 0.25; lr_t = 0.001 sqrt(0.001999) / 0.19 */
        double lr_t = 0.001 * sqrt(1 - 0.999 * 0.999) / (1 - 0.81);
        double mm = 0.095, vv = (0.999 * 0.001 + 0.001) * 0.25;
        assert_float_equal(w[0], 1 - 0.001 - lr_t * mm / (sqrt(vv) + 1e-8), 1e-6);
        assert_float_equal(optim_adam_lr(0.001, 0.9, 0.999, 2), lr_t, 1e-12);
}

static void test_adagrad(void **state)
{
        struct training_config t = {.optimizer = OPT_ADAGRAD, .learning_rate = 0.1,
                                    .initial_accumulator = 0.1, .epsilon = 0};
        assert_int_equal(optim_n_slots(OPT_ADAGRAD), 1);
        assert_string_equal(optim_slot_name(OPT_ADAGRAD, 0), "accumulator");
        assert_float_equal(optim_slot_init(&t, 0), 0.1, 1e-7);
        float w[1] = {1}, g[1] = {0.3f}, acc[1] = {optim_slot_init(&t, 0)};
        float *slots[1] = {acc};
        optim_apply(&t, 0, w, g, slots, 1); /* acc = 0.19; w = 1 - 0.1 * 0.3 / sqrt(0.19) */
        assert_float_equal(acc[0], 0.19, 1e-7);
        assert_float_equal(w[0], 1 - 0.03 / sqrt(0.19), 1e-6);
}

/* TF's ApplyFtrl by hand: lr 0.1, l1 0.01, l2 0.02, from w 0.5, n 0.1, z 0 and g 0.3 (n' = 0.19). */
static void test_ftrl(void **state)
{
        /* lr_power -0.5: z = 0.3 - (sqrt(0.19) - sqrt(0.1)) / 0.1 * 0.5 = -0.2983106;
         * w = (-0.01 + 0.2983106) / (sqrt(0.19) / 0.1 + 2 * 0.02) = 0.2883106 / 4.3988989 = 0.0655415 */
        float w[1] = {0.5f}, g[1] = {0.3f}, n[1] = {0.1f}, z[1] = {0};
        optim_ftrl(w, g, n, z, 1, 0.1f, 0.01f, 0.02f, 0, -0.5f);
        assert_float_equal(n[0], 0.19, 1e-7);
        assert_float_equal(z[0], -0.2983106, 1e-6);
        assert_float_equal(w[0], 0.0655415, 1e-6);
        /* beta 1 adds beta / (2 lr) = 5 to l2: w = 0.2883106 / (4.3588989 + 10.04) = 0.0200231 */
        w[0] = 0.5f, n[0] = 0.1f, z[0] = 0;
        optim_ftrl(w, g, n, z, 1, 0.1f, 0.01f, 0.02f, 1.0f, -0.5f);
        assert_float_equal(w[0], 0.0200231, 1e-6);
        /* |z| within l1: w is 0, n and z still move */
        w[0] = 0.5f, n[0] = 0.1f, z[0] = 0;
        optim_ftrl(w, g, n, z, 1, 0.1f, 0.5f, 0.02f, 0, -0.5f);
        assert_float_equal(w[0], 0.0, 0);
        assert_float_equal(z[0], -0.2983106, 1e-6);
        /* the general power, lr_power -1: z = 0.3 - (0.19 - 0.1) / 0.1 * 0.5 = -0.15;
         * w = (-0.01 + 0.15) / (0.19 / 0.1 + 0.04) = 0.14 / 1.94 = 0.0721649 */
        w[0] = 0.5f, n[0] = 0.1f, z[0] = 0;
        optim_ftrl(w, g, n, z, 1, 0.1f, 0.01f, 0.02f, 0, -1.0f);
        assert_float_equal(z[0], -0.15, 1e-6);
        assert_float_equal(w[0], 0.0721649, 1e-6);
        /* lr_power 0, a fixed rate: n^0 does not change, so z = g = -0.3;
         * w = (-0.01 + 0.3) / (1 / 0.1 + 0.04) = 0.29 / 10.04 = 0.0288845 */
        float gn[1] = {-0.3f};
        w[0] = 0.5f, n[0] = 0.1f, z[0] = 0;
        optim_ftrl(w, gn, n, z, 1, 0.1f, 0.01f, 0.02f, 0, 0.0f);
        assert_float_equal(z[0], -0.3, 1e-6);
        assert_float_equal(w[0], 0.0288845, 1e-6);
        /* two steps from w 0, z > l1 > 0 (the positive sign):
         * 1: z = 0.3; w = (0.01 - 0.3) / 4.3988989 = -0.0659256;
         * 2: g -0.2, n' = 0.23: z = 0.3 - 0.2 - (sqrt(0.23) - sqrt(0.19)) / 0.1 * -0.0659256 = 0.1288050;
         *    w = (0.01 - 0.1288050) / (sqrt(0.23) / 0.1 + 0.04) = -0.0245677 */
        float v[2] = {0, 0}, g2[2] = {0.3f, 0.3f}, n2[2] = {0.1f, 0.1f}, z2[2] = {0, 0};
        optim_ftrl(v, g2, n2, z2, 2, 0.1f, 0.01f, 0.02f, 0, -0.5f);
        assert_float_equal(v[1], -0.0659256, 1e-6);
        g2[0] = g2[1] = -0.2f;
        optim_ftrl(v, g2, n2, z2, 2, 0.1f, 0.01f, 0.02f, 0, -0.5f);
        for (int i = 0; i < 2; i++) {
                assert_float_equal(n2[i], 0.23, 1e-6);
                assert_float_equal(z2[i], 0.1288050, 1e-6);
                assert_float_equal(v[i], -0.0245677, 1e-6);
        }
}

static void test_learning_rate(void **state)
{
        struct training_config t = {.learning_rate = 0.1, .lr_schedule = LR_CONSTANT};
        assert_float_equal(optim_learning_rate(&t, 12345), 0.1, 0);
        t.lr_schedule = LR_EXPONENTIAL;
        t.lr_decay_rate = 0.5;
        t.lr_decay_steps = 100;
        assert_float_equal(optim_learning_rate(&t, 0), 0.1, 1e-12);
        assert_float_equal(optim_learning_rate(&t, 50), 0.1 * sqrt(0.5), 1e-12);
        assert_float_equal(optim_learning_rate(&t, 200), 0.025, 1e-12);
        t.lr_staircase = true;
        assert_float_equal(optim_learning_rate(&t, 50), 0.1, 1e-12);
        assert_float_equal(optim_learning_rate(&t, 199), 0.05, 1e-12);
        assert_float_equal(optim_learning_rate(&t, 200), 0.025, 1e-12);
        t.lr_decay_steps = 0; /* degenerate: constant */
        assert_float_equal(optim_learning_rate(&t, 200), 0.1, 0);

        /* sgd picks up the decayed rate at the given step */
        t.optimizer = OPT_SGD;
        t.lr_decay_steps = 100;
        float w[1] = {1}, g[1] = {1};
        optim_apply(&t, 250, w, g, NULL, 1);
        assert_float_equal(w[0], 1 - 0.025, 1e-7);
}

static void test_all_finite(void **state)
{
        float g[37];
        for (int i = 0; i < 37; i++)
                g[i] = (float)i - 18.0f;
        g[5] = 3e38f;
        assert_true(optim_all_finite(g, 37));
        assert_true(optim_all_finite(g, 0));
        for (int at = 0; at < 37; at += 9) {
                float keep = g[at];
                g[at] = NAN;
                assert_false(optim_all_finite(g, 37));
                g[at] = INFINITY;
                assert_false(optim_all_finite(g, 37));
                g[at] = -INFINITY;
                assert_false(optim_all_finite(g, 37));
                g[at] = keep;
        }
        g[36] = NAN; /* the tail */
        assert_false(optim_all_finite(g, 37));
        assert_true(optim_all_finite(g, 36));
}

static void test_names(void **state)
{
        assert_string_equal(optim_name(OPT_SGD), "sgd");
        assert_string_equal(optim_name(OPT_MOMENTUM), "momentum");
        assert_string_equal(optim_name(OPT_ADAM), "adam");
        assert_string_equal(optim_name(OPT_ADAGRAD), "adagrad");
        assert_null(optim_slot_name(OPT_ADAM, 2));
}

struct pieces {
        const float *g;
        size_t at;
};

static void read_pieces(void *ud, float *buf, size_t k)
{
        struct pieces *p = ud;
        memcpy(buf, p->g + p->at, k * sizeof(float));
        p->at += k;
}

static void test_apply(void **state)
{
        enum { N = 2 * APPLY_BOUNCE + 13 };   /* three pieces, the last a ragged one */
        struct training_config t = {.optimizer = OPT_ADAM, .learning_rate = 0.01, .beta1 = 0.9, .beta2 = 0.999,
                                    .epsilon = 1e-7};
        static float w[2][N], m[2][N], v[2][N], g[N], direct[N], dm[N], dv[N];
        for (size_t i = 0; i < N; i++) {
                w[0][i] = w[1][i] = direct[i] = (float)(i % 17) * 0.1f;
                g[i] = (float)((int)(i % 23) - 11) * 0.05f;
        }
        float *slots[2][2] = {{m[0], v[0]}, {m[1], v[1]}};
        struct apply_rows whole = apply_rows_at(w[0], slots[0], 2, 0, N);
        struct apply_rows read = apply_rows_at(w[1], slots[1], 2, 0, N);
        apply_reset(&t, &whole, 3);
        apply_reset(&t, &read, 3);
        memset(dm, 0, sizeof(dm));
        memset(dv, 0, sizeof(dv));
        for (uint64_t step = 3; step < 6; step++) {
                apply_gradient(&t, &whole, g);
                struct pieces p = {g, 0};
                apply_gradient_read(&t, &read, 1.0f, read_pieces, &p);
                assert_int_equal(p.at, N);
                float *ds[2] = {dm, dv};
                optim_apply(&t, step, direct, g, ds, N);
        }
        assert_int_equal(whole.updates, 6);
        assert_int_equal(read.updates, 6);
        assert_memory_equal(w[0], w[1], sizeof(w[0]));
        assert_memory_equal(w[0], direct, sizeof(direct));
        assert_memory_equal(m[0], m[1], sizeof(m[0]));
        assert_memory_equal(v[0], v[1], sizeof(v[0]));
        /* an offset view slices the parameters and every slot alike */
        struct apply_rows part = apply_rows_at(w[0], slots[0], 2, 100, 5);
        assert_ptr_equal(part.w, &w[0][100]);
        assert_ptr_equal(part.slot[1], &v[0][100]);
        assert_int_equal(part.updates, 0);
        struct pieces p = {g, 0};
        assert_true(apply_check_read(N, read_pieces, &p, NULL));
        g[N - 1] = NAN;
        p.at = 0;
        assert_false(apply_check_read(N, read_pieces, &p, NULL));
        struct training_config ada = {.optimizer = OPT_ADAGRAD, .initial_accumulator = 0.25};
        apply_reset(&ada, &part, 9);
        assert_float_equal(m[0][104], 0.25, 0);
        assert_int_equal(part.updates, 9);
}

/* A moving average (a BatchNormalization statistic) is applied as w -= g whatever the optimizer and
 * learning rate, whole or in pieces, its slots untouched; its count of updates still counts. */
static void test_apply_moving(void **state)
{
        (void)state;
        enum { N = APPLY_BOUNCE + 7 };
        struct training_config t = {.optimizer = OPT_ADAM, .learning_rate = 0.01, .beta1 = 0.9, .beta2 = 0.999,
                                    .epsilon = 1e-7};
        static float w[2][N], m[N], v[N], g[N];
        for (size_t i = 0; i < N; i++) {
                w[0][i] = w[1][i] = (float)(i % 13) * 0.25f;
                g[i] = (float)((int)(i % 7) - 3) * 0.125f;
        }
        float *slots[2] = {m, v};
        struct apply_rows a = apply_rows_at(w[0], slots, 2, 0, N), b = apply_rows_at(w[1], slots, 2, 0, N);
        a.moving = b.moving = true;
        apply_reset(&t, &a, 0);
        apply_gradient(&t, &a, g);
        struct pieces p = {g, 0};
        apply_gradient_read(&t, &b, 1.0f, read_pieces, &p);
        for (size_t i = 0; i < N; i++) {
                assert_float_equal(w[0][i], (float)(i % 13) * 0.25f - g[i], 0);
                assert_float_equal(m[i], 0, 0);
                assert_float_equal(v[i], 0, 0);
        }
        assert_memory_equal(w[0], w[1], sizeof(w[0]));
        assert_int_equal(a.updates, 1);
}

/* The norm of a push: its squares summed in double over the pieces, any non-finite value refused
 * with or without a limit; the verdict rejects or clips (limit / norm) over the limit only. */
static void test_norm(void **state)
{
        enum { N = APPLY_BOUNCE + 7 };
        static float g[N];
        double want = 0;
        for (size_t i = 0; i < N; i++) {
                g[i] = (float)((int)(i % 9) - 4) * 0.5f;
                want += (double)g[i] * g[i];
        }
        double sumsq = 1.0;   /* added to, as over a push's several tensors */
        struct pieces p = {g, 0};
        assert_true(apply_check_read(N, read_pieces, &p, &sumsq));
        assert_float_equal(sumsq, want + 1.0, 1e-9 * want);
        sumsq = 0;
        assert_true(apply_check(g, N, &sumsq));
        assert_float_equal(sumsq, want, 1e-9 * want);
        /* 1e30 squared overflows float, not double: finite, and the norm exact */
        float big[3] = {1e30f, -1e30f, 1e30f};
        sumsq = 0;
        assert_true(apply_check(big, 3, &sumsq));
        assert_float_equal(sqrt(sumsq), sqrt(3.0) * 1e30, 1e22);
        for (int k = 0; k < 3; k++) {
                float bad[5] = {1, 2, 3, 4, 5};
                bad[k + 1] = k == 0 ? NAN : k == 1 ? INFINITY : -INFINITY;
                double s = 0;
                assert_false(apply_check(bad, 5, &s));
                assert_false(apply_check(bad, 5, NULL));
        }

        char err[256] = "";
        float scale = 0;
        struct training_config t = {.max_gradient_norm = 0};
        assert_int_equal(apply_norm_limit(&t, 1e60, "worker:0", &scale, err, sizeof(err)), 0);   /* no limit */
        assert_float_equal(scale, 1.0, 0);
        t.max_gradient_norm = 10;
        t.gradient_norm_action = GRAD_NORM_REJECT;
        assert_int_equal(apply_norm_limit(&t, 100.0, "worker:0", &scale, err, sizeof(err)), 0);   /* at it */
        assert_float_equal(scale, 1.0, 0);
        assert_int_equal(apply_norm_limit(&t, 400.0, "worker:0", &scale, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "gradients from worker:0 have L2 norm 20, over training.max_gradient_norm 10; "
                                 "nothing applied");
        t.gradient_norm_action = GRAD_NORM_CLIP;
        assert_int_equal(apply_norm_limit(&t, 400.0, "worker:0", &scale, err, sizeof(err)), 1);
        assert_float_equal(scale, 0.5, 1e-7);
        float h[3] = {2, -4, 8};
        apply_scale(h, 3, 0.25f);
        assert_float_equal(h[0], 0.5, 0);
        assert_float_equal(h[1], -1.0, 0);
        assert_float_equal(h[2], 2.0, 0);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_sgd),      cmocka_unit_test(test_momentum),
        cmocka_unit_test(test_adam),     cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_ftrl),
        cmocka_unit_test(test_learning_rate), cmocka_unit_test(test_all_finite),
        cmocka_unit_test(test_names),        cmocka_unit_test(test_apply), cmocka_unit_test(test_apply_moving),
        cmocka_unit_test(test_norm))
