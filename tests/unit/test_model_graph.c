/* A graph model through model.h (model_graph.c): the layer list compiled to a graph (graph_spec.c)
 * and run as a graph model computes what model.c computes for that layer list (loss, outputs, every
 * gradient and the input gradient, for a logistic MLP over a wide flat input and a softmax CNN); the
 * flat input is cut into the graph's feeds in order; the hooks run once per variable; the blocks can
 * move (model_use_host_blocks); Dropout drops only when training; the initial values are the
 * initializers'; on a backend without host memory (the CPU's posing as a device) the model computes in
 * its device blocks, uploaded and downloaded around the graph, to the same bits as on the host. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend.h"
#include "graph.h"
#include "graph_check.h"
#include "graph_spec.h"
#include "model.h"
#include "unit.h"

/* spec's layer list as a graph model: one data feed covering the whole input, its gradient asked for. */
static struct model_spec graph_model_spec(const struct model_spec *spec, struct graph **g)
{
        char err[512] = "";
        int r = graph_from_spec(spec, g, err, sizeof(err));
        if (r < 0)
                fail_msg("graph_from_spec: %s", err);
        (*g)->loss = graph_find(*g, "logits");
        int32_t in = graph_find(*g, "input");
        (*g)->tensors[in].want_grad = true;
        struct model_spec gs = *spec;
        gs.n_layers = 0;
        gs.graph = *g;
        gs.n_feeds = 1;
        gs.feeds[0] = (struct model_feed){ .kind = FEED_DATA, .tensor = in,
                                           .count = spec->input[0] * spec->input[1] * spec->input[2] };
        return gs;
}

static void compare(const struct model_spec *spec, uint32_t B, bool float_labels)
{
        struct backend *be;
        struct model *m, *gm;
        struct graph *g;
        assert_int_equal(backend_cpu_new(1, &be), 0);
        assert_int_equal(model_new_engine(spec, be, B, MODEL_ENGINE_LAYERS, &m), 0); /* model.c's layer code */
        assert_int_equal(model_init_params(m, 7), 0);
        struct model_spec gs = graph_model_spec(spec, &g);
        assert_int_equal(model_new(&gs, be, B, &gm), 0);
        assert_int_equal(model_n_params(gm), model_n_params(m));
        assert_int_equal(model_n_vars(gm), model_n_vars(m));
        assert_int_equal(model_input_size(gm), model_input_size(m));
        assert_int_equal(model_n_classes(gm), model_n_classes(m));
        for (uint32_t v = 0; v < model_n_vars(m); v++) {
                assert_string_equal(model_var(gm, v)->name, model_var(m, v)->name);
                assert_int_equal(model_var(gm, v)->offset, model_var(m, v)->offset);
        }
        memcpy(model_params(gm), model_params(m), sizeof(float) * model_n_params(m));
        uint32_t D = model_input_size(m), C = model_n_classes(m);
        float *x = gc_rand((size_t)B * D, -1, 1, 5);
        float *yf = malloc(sizeof(float) * B);
        uint8_t *y = malloc(B);
        for (uint32_t b = 0; b < B; b++) {
                y[b] = (uint8_t)(C > 1 ? (b * 7) % C : b % 2);
                yf[b] = y[b];
        }
        float l1, l2;
        uint32_t c1, c2;
        assert_int_equal(model_set_input_grad(m, true), 0);
        assert_int_equal(model_set_input_grad(gm, true), 0);
        if (float_labels) {
                assert_int_equal(model_forward_f(m, x, yf, B, &l1, &c1), 0);
                assert_int_equal(model_forward_f(gm, x, yf, B, &l2, &c2), 0);
        } else {
                assert_int_equal(model_forward(m, x, y, B, &l1, &c1), 0);
                assert_int_equal(model_forward(gm, x, y, B, &l2, &c2), 0);
        }
        assert_true(fabs(l1 - l2) <= 1e-5 * fmax(1, fabs(l1)));
        assert_int_equal(c1, c2);
        assert_true(gc_rel_l2(model_outputs(gm), model_outputs(m), (size_t)B * C) < 1e-5);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        assert_int_equal(model_backward(gm, NULL, NULL), 0);
        double eg = gc_rel_l2(model_grads(gm), model_grads(m), model_n_params(m));
        double ex = gc_rel_l2(model_input_grad(gm), model_input_grad(m), (size_t)B * D);
        if (eg > 1e-5 || ex > 1e-5)
                fail_msg("gradients differ: parameters %.3g, input %.3g (relative L2)", eg, ex);
        free(x);
        free(y);
        free(yf);
        model_free(gm);
        model_free(m);
        graph_free(g);
        backend_free(be);
}

static void test_mlp_logistic_matches_layers(void **state)
{
        (void)state;
        struct model_spec s = { .input = { 1, 1, 40 }, .n_layers = 3, .head = HEAD_LOGISTIC,
                                .layers = { { .type = LAYER_DENSE, .units = 16 }, { .type = LAYER_RELU },
                                            { .type = LAYER_DENSE, .units = 1 } } };
        compare(&s, 9, true);
}

static void test_cnn_softmax_matches_layers(void **state)
{
        (void)state;
        struct model_spec s = { .input = { 1, 8, 8 }, .n_layers = 5, .head = HEAD_SOFTMAX,
                                .layers = { { .type = LAYER_CONV2D, .filters = 4, .kernel = 3 }, { .type = LAYER_RELU },
                                            { .type = LAYER_MAXPOOL2D, .pool = 2 }, { .type = LAYER_FLATTEN },
                                            { .type = LAYER_DENSE, .units = 5 } } };
        compare(&s, 6, false);
}

struct calls {
        uint32_t before[16], after[16], order[16], block[16], n_after;
        uint32_t last_before[16], last_after[16];
};

/* Each variable's blocks in order: block 0, or the one after the last. */
static int on_before(void *ud, uint32_t var, uint32_t block)
{
        struct calls *c = ud;
        assert_true(block == 0 || block == c->last_before[var] + 1);
        c->last_before[var] = block;
        c->before[var]++;
        return 0;
}

static int on_after(void *ud, uint32_t var, uint32_t block)
{
        struct calls *c = ud;
        assert_true(block == 0 || block == c->last_after[var] + 1);
        c->last_after[var] = block;
        c->after[var]++;
        if (c->n_after < 16) {
                c->block[c->n_after] = block;
                c->order[c->n_after] = var;
        }
        c->n_after++;
        return 0;
}

/* Every variable's hooks once per block and pass, the after hooks last variable first; the first
 * kernel in two row blocks (graph_exec_set_blocks: its Gemm computes and calls block by block), its loss
 * and gradients those of the same model unblocked; the blocks move into the caller's memory and the
 * model computes there. */
static void test_hooks_blocks_and_moved_memory(void **state)
{
        (void)state;
        struct model_spec s = { .input = { 1, 1, 12 }, .n_layers = 3, .head = HEAD_SOFTMAX,
                                .layers = { { .type = LAYER_DENSE, .units = 8 }, { .type = LAYER_TANH },
                                            { .type = LAYER_DENSE, .units = 3 } } };
        struct graph *g;
        struct model_spec gs = graph_model_spec(&s, &g);
        struct backend *be;
        struct model *m;
        assert_int_equal(backend_cpu_new(1, &be), 0);
        assert_int_equal(model_new(&gs, be, 4, &m), 0);
        assert_int_equal(model_init_params(m, 1), 0);
        uint32_t rows[] = { 0, 6 };
        assert_int_equal(model_set_var_blocks(m, 0, 2, rows), 0);
        assert_int_equal(model_var_blocks(m, 0, NULL), 2);
        assert_int_equal(model_var_blocks(m, 1, NULL), 1);
        struct model *whole;
        assert_int_equal(model_new(&gs, be, 4, &whole), 0);
        assert_int_equal(model_init_params(whole, 1), 0);

        float *x = gc_rand(4 * 12, -1, 1, 3);
        uint8_t y[4] = { 0, 1, 2, 1 };
        struct calls c = { 0 };
        float l0, l1, lw;
        assert_int_equal(model_forward_blocks(m, x, y, 4, &l0, NULL, on_before, &c), 0);
        assert_int_equal(model_backward_blocks(m, on_after, &c), 0);
        uint32_t nv = model_n_vars(m);
        for (uint32_t v = 0; v < nv; v++) {
                assert_int_equal(c.before[v], v == 0 ? 2 : 1);
                assert_int_equal(c.after[v], v == 0 ? 2 : 1);
        }
        /* last layer first: dense1's bias and kernel, then dense0's kernel block by block from inside its
         * Gemm's backward, then its bias (the exec's call after the node) */
        const uint32_t order[] = { 3, 2, 0, 0, 1 }, block[] = { 0, 0, 0, 1, 0 };
        assert_int_equal(nv, 4);
        assert_int_equal(c.n_after, 5);
        for (uint32_t i = 0; i < 5; i++) {
                assert_int_equal(c.order[i], order[i]);
                assert_int_equal(c.block[i], block[i]);
        }
        assert_int_equal(model_forward(whole, x, y, 4, &lw, NULL), 0);
        assert_int_equal(model_backward(whole, NULL, NULL), 0);
        assert_float_equal(l0, lw, 1e-6 * fmax(1, fabs(lw)));
        size_t n = model_n_params(m);
        for (size_t i = 0; i < n; i++)
                assert_float_equal(model_grads(m)[i], model_grads(whole)[i], 1e-6);
        model_free(whole);
        float *grads0 = malloc(sizeof(float) * n);
        memcpy(grads0, model_grads(m), sizeof(float) * n);

        float *blocks = aligned_alloc(64, ((sizeof(float) * 2 * n + 63) / 64 + 1) * 64);
        float *p = blocks, *gr = blocks + ((n + 15) / 16) * 16;
        assert_int_equal(model_use_host_blocks(m, p, gr), 0);
        assert_ptr_equal(model_params(m), p);
        assert_int_equal(model_forward(m, x, y, 4, &l1, NULL), 0);
        assert_true(l1 == l0);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        assert_memory_equal(gr, grads0, sizeof(float) * n);
        /* a step in the caller's block is seen by the next forward */
        for (size_t i = 0; i < n; i++)
                p[i] -= 0.5f * gr[i];
        assert_int_equal(model_forward(m, x, y, 4, &l1, NULL), 0);
        assert_true(l1 < l0);
        /* whole again: one block, and the hooks once a variable */
        assert_int_equal(model_set_var_blocks(m, 0, 1, NULL), 0);
        assert_int_equal(model_var_blocks(m, 0, NULL), 1);
        struct calls c1 = { 0 };
        assert_int_equal(model_forward_blocks(m, x, y, 4, &l1, NULL, on_before, &c1), 0);
        assert_int_equal(model_backward_blocks(m, on_after, &c1), 0);
        for (uint32_t v = 0; v < nv; v++) {
                assert_int_equal(c1.before[v], 1);
                assert_int_equal(c1.after[v], 1);
                assert_int_equal(c1.order[v], nv - 1 - v);
        }
        model_free(m);
        free(blocks);
        free(grads0);
        free(x);
        graph_free(g);
        backend_free(be);
}

/* x (batch, 6) -> Dropout(0.5) -> Gemm(W (6, 2), b) -> logits: training forwards drop (and differ from
 * one step to the next), inference does not (model_evaluate, model_set_training(false)); the initial
 * values are the initializers'. */
static void test_dropout_modes_and_initializers(void **state)
{
        (void)state;
        struct graph *g = graph_new();
        struct graph_shape xs = { 2, { GRAPH_BATCH, 6 } }, ws = { 2, { 6, 2 } }, bs = { 1, { 2 } };
        float w[12], b[2] = { 0.25f, -0.5f };
        for (int i = 0; i < 12; i++)
                w[i] = 0.1f * (float)(i - 5);
        int32_t in[3];
        in[0] = graph_add_tensor(g, "x", GT_INPUT, GDT_F32, &xs, NULL);
        in[1] = graph_add_tensor(g, "w", GT_PARAM, GDT_F32, &ws, w);
        in[2] = graph_add_tensor(g, "b", GT_PARAM, GDT_F32, &bs, b);
        struct graph_attrs a;
        graph_attrs_default(&a);
        a.ratio = 0.5f;
        const char *d_out[] = { "xd" }, *z_out[] = { "logits" };
        int dn = graph_add_node(g, GOP_DROPOUT, "drop", in, 1, d_out, 1, &a);
        assert_true(dn >= 0);
        int32_t gin[3] = { g->nodes[dn].out[0], in[1], in[2] };
        graph_attrs_default(&a);
        assert_true(graph_add_node(g, GOP_GEMM, "fc", gin, 3, z_out, 1, &a) >= 0);
        char err[256] = "";
        if (graph_finalize(g, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        g->loss = graph_find(g, "logits");
        struct model_spec s = { .input = { 1, 1, 6 }, .head = HEAD_SOFTMAX, .seed = 3, .graph = g, .n_feeds = 1,
                                .feeds = { { .kind = FEED_DATA, .tensor = in[0], .count = 6 } } };
        struct backend *be;
        struct model *m;
        assert_int_equal(backend_cpu_new(1, &be), 0);
        assert_int_equal(model_new(&s, be, 8, &m), 0);
        memset(model_params(m), 0, sizeof(float) * model_n_params(m));
        assert_int_equal(model_init_params(m, 99), 0);
        assert_memory_equal(model_params(m), w, sizeof(w));
        assert_memory_equal(model_params(m) + 12, b, sizeof(b));
        /* model.init glorot_uniform: the matrix drawn within +-sqrt(6 / (6 + 2)), seeded; the bias the file's */
        struct model_spec s2 = s;
        s2.init = GRAPH_INIT_GLOROT;
        struct model *m2;
        assert_int_equal(model_new(&s2, be, 8, &m2), 0);
        assert_int_equal(model_init_params(m2, 5), 0);
        float lim = sqrtf(6.0f / 8.0f), first[12];
        bool differs = false;
        for (int i = 0; i < 12; i++) {
                assert_true(fabsf(model_params(m2)[i]) <= lim);
                differs |= model_params(m2)[i] != w[i];
        }
        assert_true(differs);
        assert_memory_equal(model_params(m2) + 12, b, sizeof(b));
        memcpy(first, model_params(m2), sizeof(first));
        assert_int_equal(model_init_params(m2, 5), 0);
        assert_memory_equal(model_params(m2), first, sizeof(first));
        assert_int_equal(model_init_params(m2, 6), 0);
        assert_memory_not_equal(model_params(m2), first, sizeof(first));
        model_free(m2);

        float x[8 * 6];
        uint8_t y[8] = { 0 };
        for (int i = 0; i < 8 * 6; i++)
                x[i] = 1.0f + 0.01f * (float)i;
        float l_a, l_b, l_c, l_d, acc;
        assert_int_equal(model_forward(m, x, y, 8, &l_a, NULL), 0);
        assert_int_equal(model_forward(m, x, y, 8, &l_b, NULL), 0);
        assert_true(l_a != l_b); /* other masks */
        model_set_training(m, false);
        assert_int_equal(model_forward(m, x, y, 8, &l_c, NULL), 0);
        assert_int_equal(model_forward(m, x, y, 8, &l_d, NULL), 0);
        assert_true(l_c == l_d);
        model_set_training(m, true);
        float l_e;
        assert_int_equal(model_evaluate(m, x, y, 8, &l_e, &acc), 0);
        assert_true(l_e == l_c); /* evaluation infers whatever the mode */
        model_free(m);
        graph_free(g);
        backend_free(be);
}

/* x (batch, 3, 2, 2) -> BatchNormalization(scale, bias, mean, var; momentum 0.9) -> Flatten -> Gemm ->
 * logits: the running mean and variance are moving variables (model_spec_vars says so); after a training
 * step their "gradients" are (1 - momentum) * (old - the batch's mean, biased variance), what a moving
 * average subtracts; an inference pass normalizes by them. */
static void test_batchnorm_moving_statistics(void **state)
{
        (void)state;
        struct graph *g = graph_new();
        enum { C = 3, S = 4, B = 5, K = 2 };
        struct graph_shape xs = { 4, { GRAPH_BATCH, C, 2, 2 } }, cs = { 1, { C } }, ws = { 2, { C * S, K } };
        float scale[C] = { 1.0f, 0.5f, 2.0f }, bias[C] = { 0.1f, 0.0f, -0.1f }, mean[C] = { 0.2f, -0.3f, 0.0f },
              var[C] = { 1.5f, 0.5f, 2.0f }, w[C * S * K];
        for (int i = 0; i < C * S * K; i++)
                w[i] = 0.05f * (float)((i * 7) % 11 - 5);
        int32_t x = graph_add_tensor(g, "x", GT_INPUT, GDT_F32, &xs, NULL);
        int32_t in[5] = { x, graph_add_tensor(g, "bn.weight", GT_PARAM, GDT_F32, &cs, scale),
                          graph_add_tensor(g, "bn.bias", GT_PARAM, GDT_F32, &cs, bias),
                          graph_add_tensor(g, "bn.running_mean", GT_PARAM, GDT_F32, &cs, mean),
                          graph_add_tensor(g, "bn.running_var", GT_PARAM, GDT_F32, &cs, var) };
        int32_t wt = graph_add_tensor(g, "fc.weight", GT_PARAM, GDT_F32, &ws, w);
        struct graph_attrs a;
        graph_attrs_default(&a);
        a.epsilon = 1e-5f;
        a.momentum = 0.9f;
        const char *o1[] = { "y" }, *o2[] = { "yf" }, *o3[] = { "logits" };
        int n1 = graph_add_node(g, GOP_BATCHNORM, "bn", in, 5, o1, 1, &a);
        graph_attrs_default(&a);
        int n2 = graph_add_node(g, GOP_FLATTEN, "flat", (int32_t[]){ g->nodes[n1].out[0] }, 1, o2, 1, &a);
        int n3 = graph_add_node(g, GOP_MATMUL, "fc", (int32_t[]){ g->nodes[n2].out[0], wt }, 2, o3, 1, &a);
        assert_true(n1 >= 0 && n2 >= 0 && n3 >= 0);
        char err[256] = "";
        if (graph_finalize(g, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        g->loss = graph_find(g, "logits");
        assert_false(g->tensors[in[1]].moving);
        assert_true(g->tensors[in[3]].moving);
        assert_true(g->tensors[in[4]].moving);
        struct model_spec s = { .input = { C, 2, 2 }, .head = HEAD_SOFTMAX, .graph = g, .n_feeds = 1,
                                .feeds = { { .kind = FEED_DATA, .tensor = x, .count = C * S } } };
        struct model_spec_var vars[MODEL_MAX_VARS];
        assert_int_equal(model_spec_vars(&s, vars, NULL), 5);
        assert_false(vars[0].moving || vars[1].moving || vars[4].moving);
        assert_true(vars[2].moving && vars[3].moving);

        struct backend *be;
        struct model *m;
        assert_int_equal(backend_cpu_new(1, &be), 0);
        assert_int_equal(model_new(&s, be, B, &m), 0);
        assert_int_equal(model_init_params(m, 0), 0);
        float *xv = gc_rand(B * C * S, -2, 3, 11);
        uint8_t y[B] = { 0, 1, 1, 0, 1 };
        float loss;
        assert_int_equal(model_forward(m, xv, y, B, &loss, NULL), 0);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        const float *gr = model_grads(m);
        for (int c = 0; c < C; c++) {
                double mu = 0, v = 0;
                for (int b = 0; b < B; b++)
                        for (int i = 0; i < S; i++)
                                mu += xv[(b * C + c) * S + i];
                mu /= B * S;
                for (int b = 0; b < B; b++)
                        for (int i = 0; i < S; i++)
                                v += (xv[(b * C + c) * S + i] - mu) * (xv[(b * C + c) * S + i] - mu);
                v /= B * S;
                assert_float_equal(gr[model_var(m, 2)->offset + c], 0.1 * (mean[c] - mu), 1e-6);
                assert_float_equal(gr[model_var(m, 3)->offset + c], 0.1 * (var[c] - v), 1e-6);
        }
        /* inference normalizes by the running statistics: moving them moves the outputs */
        float l0, l1, acc;
        assert_int_equal(model_evaluate(m, xv, y, B, &l0, &acc), 0);
        model_params(m)[model_var(m, 2)->offset] += 1.0f;
        assert_int_equal(model_evaluate(m, xv, y, B, &l1, &acc), 0);
        assert_true(l0 != l1);
        free(xv);
        model_free(m);
        graph_free(g);
        backend_free(be);
}

/* The same graph model on the CPU backend and on it posing as a device (host_memory false: the model's
 * device blocks, the uploads before the forward and the downloads after the backward, the graph exec's
 * device path; the memory still the host's, so the CPU kernels run): the same loss, outputs and
 * gradients, bit for bit, over two steps with the hooks. */
static void test_device_memory_matches_host(void **state)
{
        (void)state;
        struct model_spec s = { .input = { 1, 8, 8 }, .n_layers = 5, .head = HEAD_SOFTMAX,
                                .layers = { { .type = LAYER_CONV2D, .filters = 4, .kernel = 3 }, { .type = LAYER_RELU },
                                            { .type = LAYER_MAXPOOL2D, .pool = 2 }, { .type = LAYER_FLATTEN },
                                            { .type = LAYER_DENSE, .units = 5 } } };
        struct graph *g;
        struct model_spec gs = graph_model_spec(&s, &g);
        struct backend *be;
        assert_int_equal(backend_cpu_new(1, &be), 0);
        struct backend_ops ops = *be->ops;
        ops.host_memory = false;
        struct backend dev = { .ops = &ops, .ctx = be->ctx };
        struct model *h, *d;
        assert_int_equal(model_new(&gs, be, 6, &h), 0);
        assert_int_equal(model_new(&gs, &dev, 6, &d), 0);
        assert_int_equal(model_init_params(h, 3), 0);
        assert_int_equal(model_init_params(d, 3), 0);
        assert_int_equal(model_set_input_grad(h, true), 0);
        assert_int_equal(model_set_input_grad(d, true), 0);
        size_t n = model_n_params(h), D = model_input_size(h);
        float *x = gc_rand(6 * D, -1, 1, 9);
        uint8_t y[6] = { 0, 1, 2, 3, 4, 0 };
        struct calls ch = { 0 }, cd = { 0 };
        for (int step = 0; step < 2; step++) {
                float lh, ld;
                uint32_t kh, kd;
                assert_int_equal(model_forward_blocks(h, x, y, 6, &lh, &kh, on_before, &ch), 0);
                assert_int_equal(model_forward_blocks(d, x, y, 6, &ld, &kd, on_before, &cd), 0);
                assert_true(lh == ld);
                assert_int_equal(kh, kd);
                assert_memory_equal(model_outputs(h), model_outputs(d), sizeof(float) * 6 * model_n_classes(h));
                cd.n_after = ch.n_after = 0;
                assert_int_equal(model_backward_blocks(h, on_after, &ch), 0);
                assert_int_equal(model_backward_blocks(d, on_after, &cd), 0);
                assert_memory_equal(model_grads(h), model_grads(d), sizeof(float) * n);
                assert_memory_equal(model_input_grad(h), model_input_grad(d), sizeof(float) * 6 * D);
                /* a step on the host blocks: the device model uploads it before its next forward */
                for (size_t i = 0; i < n; i++) {
                        model_params(h)[i] -= 0.1f * model_grads(h)[i];
                        model_params(d)[i] -= 0.1f * model_grads(d)[i];
                }
        }
        assert_memory_equal(ch.before, cd.before, sizeof(ch.before));
        free(x);
        model_free(d);
        model_free(h);
        graph_free(g);
        backend_free(be);
}

UNIT_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_batchnorm_moving_statistics), cmocka_unit_test(test_mlp_logistic_matches_layers),
               cmocka_unit_test(test_cnn_softmax_matches_layers),
               cmocka_unit_test(test_hooks_blocks_and_moved_memory),
               cmocka_unit_test(test_dropout_modes_and_initializers),
               cmocka_unit_test(test_device_memory_matches_host))
