/* A layer list on the CPU runs on the graph engine (model_new's default there) and computes what model.c's
 * layer code computes (model_new_engine(MODEL_ENGINE_LAYERS), what device backends run): the same
 * variables and initial values to the bit, the same description; loss, outputs, every gradient and the
 * input gradient to the bit where no convolution is involved (an MLP, a list over embedding tables, the
 * logistic and mse heads, max pooling and dense layers on an image), within 1e-5 (relative L2) for a CNN;
 * twenty SGD steps later still so. Row blocks: every (variable, block)
 * hook once a pass, a variable's blocks in order, a block's parameters read only after its forward hook
 * and never after its backward hook, its gradient final at that hook (model_hooks.h); the blocks kept when the input
 * gradient is turned on later (the exec is built again); the blocks moved into the caller's memory. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "backend.h"
#include "graph_check.h"
#include "model.h"
#include "rng.h"
#include "model_hooks.h"

static struct backend *be;

static int setup(void **state)
{
        return backend_cpu_new(1, &be);
}

static int teardown(void **state)
{
        be = backend_free(be);
        return 0;
}

static char *describe(const struct model *m)
{
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        assert_non_null(f);
        model_describe(m, f);
        fclose(f);
        return buf;
}

/* The pair: the graph engine's model (g) and the layer code's (l), the same initial values. */
static void pair_new(const struct model_spec *spec, uint32_t B, struct model **g, struct model **l)
{
        assert_int_equal(model_new(spec, be, B, g), 0);
        assert_int_equal(model_new_engine(spec, be, B, MODEL_ENGINE_LAYERS, l), 0);
        assert_true(model_runs_graph(*g));
        assert_false(model_runs_graph(*l));
        assert_int_equal(model_n_vars(*g), model_n_vars(*l));
        assert_int_equal(model_n_params(*g), model_n_params(*l));
        assert_int_equal(model_input_size(*g), model_input_size(*l));
        assert_int_equal(model_n_classes(*g), model_n_classes(*l));
        for (uint32_t v = 0; v < model_n_vars(*l); v++) {
                assert_string_equal(model_var(*g, v)->name, model_var(*l, v)->name);
                assert_int_equal(model_var(*g, v)->offset, model_var(*l, v)->offset);
                assert_int_equal(model_var(*g, v)->rows, model_var(*l, v)->rows);
                assert_int_equal(model_var(*g, v)->layer, model_var(*l, v)->layer);
        }
        assert_int_equal(model_init_params(*g, 21), 0);
        assert_int_equal(model_init_params(*l, 21), 0);
        assert_memory_equal(model_params(*g), model_params(*l), sizeof(float) * model_n_params(*l));
        char *dg = describe(*g), *dl = describe(*l);
        assert_string_equal(dg, dl);
        free(dg);
        free(dl);
        /* nonzero biases, so that they count */
        float *pg = model_params(*g), *pl = model_params(*l);
        for (uint32_t v = 0; v < model_n_vars(*l); v++)
                if (model_var(*l, v)->rows == 1)
                        for (uint32_t i = 0; i < model_var(*l, v)->cols; i++)
                                pg[model_var(*l, v)->offset + i] = pl[model_var(*l, v)->offset + i] = 0.01f * (float)(i + v);
}

/* A batch: inputs in [-1, 1], labels as the head reads them (integers in y8, floats in yf). */
static void batch(const struct model *m, enum model_head head, uint32_t B, uint64_t seed, float *x, uint8_t *y8,
                  float *yf)
{
        struct rng r;
        rng_init(&r, seed, 1);
        for (size_t i = 0; i < (size_t)B * model_input_size(m); i++)
                x[i] = rng_uniform_f(&r, -1.0f, 1.0f);
        for (uint32_t b = 0; b < B; b++) {
                y8[b] = (uint8_t)rng_below(&r, head == HEAD_SOFTMAX ? model_n_classes(m) : 2);
                yf[b] = head == HEAD_MSE ? rng_uniform_f(&r, -2.0f, 2.0f) : (float)y8[b];
        }
}

static int step(struct model *m, enum model_head head, const float *x, const uint8_t *y8, const float *yf, uint32_t B,
                float *loss, uint32_t *correct)
{
        int r = head == HEAD_SOFTMAX ? model_forward(m, x, y8, B, loss, correct)
                                     : model_forward_f(m, x, yf, B, loss, correct);
        return r < 0 ? r : model_backward(m, NULL, NULL);
}

/* exact: the same bits (no convolution: the graph's may take its direct path, another order of sums). */
static void compare(const struct model_spec *spec, uint32_t B, bool input_grad, bool exact)
{
        struct model *g, *l;
        pair_new(spec, B, &g, &l);
        if (input_grad) {
                assert_int_equal(model_set_input_grad(g, true), 0);
                assert_int_equal(model_set_input_grad(l, true), 0);
        }
        uint32_t D = model_input_size(l), C = model_n_classes(l);
        size_t n = model_n_params(l);
        float *x = malloc(sizeof(float) * B * D), *yf = malloc(sizeof(float) * B);
        uint8_t *y8 = malloc(B);
        double worst = 0;
        for (uint32_t it = 0; it < 20; it++) {
                batch(l, spec->head, B, 100 + it, x, y8, yf);
                float lg, ll;
                uint32_t cg, cl;
                assert_int_equal(step(g, spec->head, x, y8, yf, B, &lg, &cg), 0);
                assert_int_equal(step(l, spec->head, x, y8, yf, B, &ll, &cl), 0);
                if (fabs((double)lg - ll) > 1e-5 * fmax(1, fabs(ll)))
                        fail_msg("step %u: loss %.9g on the graph, %.9g on the layers", it, lg, ll);
                double eo = gc_rel_l2(model_outputs(g), model_outputs(l), (size_t)B * C);
                double eg = gc_rel_l2(model_grads(g), model_grads(l), n);
                double ex = input_grad ? gc_rel_l2(model_input_grad(g), model_input_grad(l), (size_t)B * D) : 0;
                if (eo > 1e-5 || eg > 1e-5 || ex > 1e-5)
                        fail_msg("step %u: outputs %.3g, gradients %.3g, input gradient %.3g apart (relative L2)", it, eo,
                                 eg, ex);
                if (it == 0)
                        assert_int_equal(cg, cl);
                if (exact && (memcmp(&lg, &ll, sizeof(lg)) || eg > 0 || ex > 0 || eo > 0))
                        fail_msg("step %u: not the same bits (loss %.9g against %.9g)", it, lg, ll);
                worst = fmax(worst, fmax(eg, ex));
                float *pg = model_params(g), *pl = model_params(l);
                const float *gg = model_grads(g), *gl = model_grads(l);
                for (size_t i = 0; i < n; i++) {
                        pg[i] -= 0.1f * gg[i];
                        pl[i] -= 0.1f * gl[i];
                }
        }
        double ep = gc_rel_l2(model_params(g), model_params(l), n);
        printf("  %u layers, %u inputs, batch %u: gradients within %.1e, parameters after 20 steps %.1e apart\n",
               spec->n_layers, D, B, worst, ep);
        assert_true(ep < 1e-5);
        assert_null(input_grad ? NULL : model_input_grad(g));
        free(x);
        free(yf);
        free(y8);
        model_free(g);
        model_free(l);
}

#define DENSE(n) { .type = LAYER_DENSE, .units = (n) }
#define ACT(t) { .type = (t) }

static void test_mlp(void **state)
{
        /* the demo's shapes: the bias added after the product, or OpenBLAS's sums come out otherwise */
        struct model_spec w = { .input = { 1, 28, 28 }, .n_layers = 8,
                                .layers = { DENSE(256), ACT(LAYER_RELU), DENSE(128), ACT(LAYER_RELU), DENSE(64),
                                            ACT(LAYER_RELU), DENSE(10), ACT(LAYER_FLATTEN) } };
        compare(&w, 64, false, true);
        struct model_spec s = { .input = { 1, 1, 20 }, .n_layers = 5,
                                .layers = { DENSE(16), ACT(LAYER_RELU), DENSE(8), ACT(LAYER_SIGMOID), DENSE(5) } };
        compare(&s, 7, false, true);
        compare(&s, 7, true, true);
}

static void test_cnn(void **state)
{
        struct model_spec s = { .input = { 2, 9, 9 }, .n_layers = 7,
                                .layers = { { .type = LAYER_CONV2D, .filters = 4, .kernel = 3 }, ACT(LAYER_RELU),
                                            { .type = LAYER_MAXPOOL2D, .pool = 2 },
                                            { .type = LAYER_CONV2D, .filters = 3, .kernel = 2 }, ACT(LAYER_TANH),
                                            ACT(LAYER_FLATTEN), DENSE(6) } };
        compare(&s, 5, false, false);
        /* a dense layer right on an image, no flatten */
        struct model_spec d = { .input = { 3, 4, 4 }, .n_layers = 3,
                                .layers = { { .type = LAYER_MAXPOOL2D, .pool = 2 }, DENSE(4), DENSE(3) } };
        compare(&d, 4, true, true);
}

static void test_embeddings(void **state)
{
        struct model_spec s = { .input = { 1, 1, 3 }, .n_layers = 4, .head = HEAD_LOGISTIC, .n_embeddings = 2,
                                .layers = { DENSE(8), ACT(LAYER_RELU), DENSE(4), DENSE(1) } };
        s.emb[0] = (struct embedding_spec){ .dim = 4, .n_fields = 2, .fields = { 0, 1 } };
        s.emb[1] = (struct embedding_spec){ .dim = 2, .n_fields = 1, .fields = { 2 } };
        compare(&s, 6, true, true);
}

static void test_mse(void **state)
{
        struct model_spec s = { .input = { 1, 1, 6 }, .n_layers = 3, .head = HEAD_MSE,
                                .layers = { DENSE(5), ACT(LAYER_TANH), DENSE(1) } };
        compare(&s, 8, false, true);
}

/* ---- row blocks ---- */

static const struct model_spec mlp = { .input = { 1, 1, 20 }, .n_layers = 5,
                                       .layers = { DENSE(16), ACT(LAYER_RELU), DENSE(8), ACT(LAYER_SIGMOID), DENSE(5) } };
static const uint32_t rb0[4] = { 0, 3, 11, 12 }; /* dense0/kernel (20, 16) */
static const uint32_t rb2[2] = { 0, 9 };         /* dense1/kernel (16, 8) */

/* Where in the log var's block was handed on. */
static uint32_t at(const struct blk_log *l, uint32_t var, uint32_t block)
{
        for (uint32_t i = 0; i < l->n; i++)
                if (l->var[i] == var && l->block[i] == block)
                        return i;
        fail_msg("(%u, %u) never handed on", var, block);
        return 0;
}

/* Every (variable, block) once in the log, and a variable's blocks in order (backward too). */
static void check_all_once(const struct blk_log *l, uint32_t total)
{
        assert_int_equal(l->n, total);
        uint32_t next[8] = { 0 };
        for (uint32_t i = 0; i < l->n; i++) {
                assert_true(l->var[i] < 8);
                assert_int_equal(l->block[i], next[l->var[i]]++);
        }
        for (uint32_t v = 0; v < model_n_vars(l->m); v++)
                assert_int_equal(next[v], model_var_blocks(l->m, v, NULL));
}

static void test_block_hooks(void **state)
{
        const uint32_t B = 4;
        struct model *g, *l;
        pair_new(&mlp, B, &g, &l);
        assert_int_equal(model_set_var_blocks(g, 0, 4, rb0), 0);
        assert_int_equal(model_set_var_blocks(g, 2, 2, rb2), 0);
        assert_int_equal(model_set_var_blocks(g, 1, 2, rb2), -EOPNOTSUPP); /* a bias: whole, as the layers' */
        /* the input gradient turned on after the blocks: the exec is built again, the blocks kept */
        assert_int_equal(model_set_input_grad(g, true), 0);
        assert_int_equal(model_set_input_grad(l, true), 0);
        assert_int_equal(model_var_blocks(g, 0, NULL), 4);
        size_t n = model_n_params(l);
        float x[4 * 20], yf[4], lg, ll;
        uint8_t y[4];
        batch(l, HEAD_SOFTMAX, B, 8, x, y, yf);
        assert_int_equal(step(l, HEAD_SOFTMAX, x, y, yf, B, &ll, NULL), 0);

        float *ref = malloc(sizeof(float) * n), *snap = malloc(sizeof(float) * n);
        memcpy(ref, model_params(g), sizeof(float) * n);
        for (size_t i = 0; i < n; i++)
                model_params(g)[i] = snap[i] = NAN;
        struct blk_log fl = { .m = g, .ref = ref, .bias_first = true };
        assert_int_equal(model_forward_blocks(g, x, y, B, &lg, NULL, before_cb, &fl), 0);
        check_all_once(&fl, 4 + 1 + 2 + 1 + 1 + 1);
        assert_true(at(&fl, 1, 0) < at(&fl, 0, 0)); /* model.h: the Gemm's C before its B */
        assert_true(at(&fl, 2, 1) < at(&fl, 4, 0)); /* layers first to last */
        assert_true(fabs((double)lg - ll) <= 1e-5 * fabs(ll));
        memcpy(model_params(g), ref, sizeof(float) * n); /* un-poisoned for backward */
        struct blk_log bl = { .m = g, .snap = snap };
        assert_int_equal(model_backward_blocks(g, after_cb, &bl), 0);
        check_all_once(&bl, 10);
        assert_true(at(&bl, 1, 0) > at(&bl, 0, 3)); /* model.h: a dense bias after its kernel's blocks */
        assert_true(at(&bl, 4, 0) < at(&bl, 2, 0)); /* layers last to first */
        assert_true(gc_rel_l2(snap, model_grads(l), n) < 1e-5);
        assert_true(gc_rel_l2(model_input_grad(g), model_input_grad(l), (size_t)B * 20) < 1e-5);
        for (size_t i = 0; i < n; i++) /* nothing wrote a block after its hook */
                assert_true(isnan(model_grads(g)[i]));
        free(ref);
        free(snap);
        model_free(g);
        model_free(l);
}

/* The blocks in memory of the caller's: the same values, the same results, left alone by model_free. */
static void test_use_host_blocks(void **state)
{
        const uint32_t B = 4;
        struct model *g, *l;
        pair_new(&mlp, B, &g, &l);
        assert_int_equal(model_set_var_blocks(g, 0, 4, rb0), 0);
        size_t n = model_n_params(l);
        float *mem = aligned_alloc(64, (2 * n * sizeof(float) + 63) / 64 * 64 + 64);
        float *params = mem, *grads = mem + (n + 15) / 16 * 16;
        assert_int_equal(model_use_host_blocks(g, params, grads), 0);
        assert_ptr_equal(model_params(g), params);
        assert_memory_equal(params, model_params(l), sizeof(float) * n);
        float x[4 * 20], yf[4], lg, ll;
        uint8_t y[4];
        batch(l, HEAD_SOFTMAX, B, 9, x, y, yf);
        assert_int_equal(step(g, HEAD_SOFTMAX, x, y, yf, B, &lg, NULL), 0);
        assert_int_equal(step(l, HEAD_SOFTMAX, x, y, yf, B, &ll, NULL), 0);
        assert_true(fabs((double)lg - ll) <= 1e-5 * fabs(ll));
        assert_true(gc_rel_l2(grads, model_grads(l), n) < 1e-5);
        model_free(g);
        model_free(l);
        free(mem);
}

UNIT_TEST_MAIN(setup, teardown, cmocka_unit_test(test_mlp), cmocka_unit_test(test_cnn),
               cmocka_unit_test(test_embeddings), cmocka_unit_test(test_mse), cmocka_unit_test(test_block_hooks),
               cmocka_unit_test(test_use_host_blocks))
