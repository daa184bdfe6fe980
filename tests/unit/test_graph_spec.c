/* The layer list as a graph (graph_spec.c) computes what model.c computes: with model.c's initial
 * parameters copied into the graph's block (the same variables, order and layout), the same
 * probabilities and loss, and the same gradients of the mean softmax cross-entropy, for the demo MLP,
 * a CNN with an odd and an even kernel, and a list over embedding tables' pooled rows. */
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

static void compare(const struct model_spec *spec, uint32_t B)
{
        char err[512] = "";
        struct backend *be;
        struct model *m;
        assert_int_equal(backend_cpu_new(1, &be), 0);
        assert_int_equal(model_new_engine(spec, be, B, MODEL_ENGINE_LAYERS, &m), 0); /* model.c's layer code */
        assert_int_equal(model_init_params(m, 7), 0);
        struct graph *g = NULL;
        int r = graph_from_spec(spec, &g, err, sizeof(err));
        if (r < 0)
                fail_msg("graph_from_spec: %s", err);
        /* the same variables, in the same order and layout */
        assert_int_equal(g->n_params, model_n_params(m));
        uint32_t v = 0;
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                const struct graph_tensor *t = &g->tensors[i];
                if (t->kind != GT_PARAM)
                        continue;
                const struct model_var *mv = model_var(m, v++);
                assert_string_equal(t->name, mv->name);
                assert_int_equal(t->param_offset, mv->offset);
                assert_int_equal(graph_shape_count(&t->shape, 1), (size_t)mv->rows * mv->cols);
        }
        assert_int_equal(v, model_n_vars(m));

        struct graph_exec *x;
        assert_int_equal(graph_exec_new(g, B, &x, err, sizeof(err)), 0);
        memcpy(graph_exec_params(x), model_params(m), sizeof(float) * g->n_params);
        uint32_t D = model_input_size(m), C = model_n_classes(m);
        float *in = gc_rand((size_t)B * D, 0, 1, 99);
        uint8_t *y = malloc(B);
        for (uint32_t b = 0; b < B; b++)
                y[b] = (uint8_t)((b * 7) % C);

        float loss_m;
        assert_int_equal(model_forward(m, in, y, B, &loss_m, NULL), 0);
        const float *probs_m = model_outputs(m);
        assert_int_equal(model_backward(m, NULL, NULL), 0);

        int32_t input = graph_find(g, "input"), logits = graph_find(g, "logits");
        assert_int_equal(graph_set_input(x, input, in, B), 0);
        assert_int_equal(graph_forward(x, true, 0), 0);
        size_t n = 0;
        const float *z = graph_value(x, logits, &n);
        assert_int_equal(n, (size_t)B * C);
        /* the head, in double: softmax, mean cross-entropy, and its gradient (p - onehot) / B */
        float *dz = malloc(sizeof(float) * n);
        double loss = 0, worst_p = 0;
        for (uint32_t b = 0; b < B; b++) {
                double mx = z[b * C], s = 0;
                for (uint32_t j = 1; j < C; j++)
                        mx = fmax(mx, z[b * C + j]);
                for (uint32_t j = 0; j < C; j++)
                        s += exp(z[b * C + j] - mx);
                for (uint32_t j = 0; j < C; j++) {
                        double p = exp(z[b * C + j] - mx) / s;
                        worst_p = fmax(worst_p, fabs(p - probs_m[b * C + j]));
                        dz[b * C + j] = (float)((p - (j == y[b])) / B);
                }
                loss -= (z[b * C + y[b]] - mx - log(s)) / B;
        }
        assert_true(worst_p < 1e-5);
        assert_true(fabs(loss - loss_m) <= 1e-5 * fmax(1, fabs(loss)));
        assert_int_equal(graph_backward(x, logits, dz), 0);
        const float *gg = graph_exec_grads(x), *gm = model_grads(m);
        double num = 0, den = 0;
        for (size_t i = 0; i < g->n_params; i++) {
                num += ((double)gg[i] - gm[i]) * ((double)gg[i] - gm[i]);
                den += (double)gm[i] * gm[i];
        }
        double rel = sqrt(num / fmax(den, 1e-30));
        printf("  %u layers, batch %u: probabilities within %.1e, loss %.6f vs %.6f, gradients' relative L2 %.1e\n",
               spec->n_layers, B, worst_p, loss, loss_m, rel);
        assert_true(rel < 1e-5);
        free(dz);
        free(in);
        free(y);
        graph_exec_free(x);
        graph_free(g);
        model_free(m);
        backend_free(be);
}

static void test_mlp(void **state)
{
        struct model_spec s = { .input = { 1, 1, 784 }, .n_layers = 7, .seed = 1 };
        s.layers[0] = (struct layer_spec){ .type = LAYER_DENSE, .units = 256 };
        s.layers[1] = (struct layer_spec){ .type = LAYER_RELU };
        s.layers[2] = (struct layer_spec){ .type = LAYER_DENSE, .units = 128 };
        s.layers[3] = (struct layer_spec){ .type = LAYER_TANH };
        s.layers[4] = (struct layer_spec){ .type = LAYER_DENSE, .units = 64 };
        s.layers[5] = (struct layer_spec){ .type = LAYER_SIGMOID };
        s.layers[6] = (struct layer_spec){ .type = LAYER_DENSE, .units = 10 };
        compare(&s, 16);
}

static void test_cnn(void **state)
{
        struct model_spec s = { .input = { 1, 12, 12 }, .n_layers = 9, .seed = 1 };
        s.layers[0] = (struct layer_spec){ .type = LAYER_CONV2D, .filters = 4, .kernel = 3 };
        s.layers[1] = (struct layer_spec){ .type = LAYER_RELU };
        s.layers[2] = (struct layer_spec){ .type = LAYER_MAXPOOL2D, .pool = 2 };
        s.layers[3] = (struct layer_spec){ .type = LAYER_CONV2D, .filters = 6, .kernel = 2 }; /* even: pad after */
        s.layers[4] = (struct layer_spec){ .type = LAYER_RELU };
        s.layers[5] = (struct layer_spec){ .type = LAYER_MAXPOOL2D, .pool = 2 };
        s.layers[6] = (struct layer_spec){ .type = LAYER_FLATTEN };
        s.layers[7] = (struct layer_spec){ .type = LAYER_DENSE, .units = 16 };
        s.layers[8] = (struct layer_spec){ .type = LAYER_DENSE, .units = 5 };
        compare(&s, 6);
}

/* A dense layer straight after a convolution reads it flat, as model.c's does. */
static void test_dense_after_conv(void **state)
{
        struct model_spec s = { .input = { 2, 5, 5 }, .n_layers = 3, .seed = 1 };
        s.layers[0] = (struct layer_spec){ .type = LAYER_CONV2D, .filters = 3, .kernel = 3 };
        s.layers[1] = (struct layer_spec){ .type = LAYER_RELU };
        s.layers[2] = (struct layer_spec){ .type = LAYER_DENSE, .units = 4 };
        compare(&s, 3);
}

/* With tables, one flat input: the dense features, then each table's fields' pooled rows; its gradient
 * asked for (the sparse front's). */
static void test_embeddings(void **state)
{
        struct model_spec s = { .input = { 1, 1, 4 }, .n_layers = 3, .n_embeddings = 2 };
        s.emb[0] = (struct embedding_spec){ .dim = 3, .n_fields = 2, .fields = { 0, 1 } };
        s.emb[1] = (struct embedding_spec){ .dim = 2, .n_fields = 1, .fields = { 2 } };
        s.layers[0] = (struct layer_spec){ .type = LAYER_DENSE, .units = 6 };
        s.layers[1] = (struct layer_spec){ .type = LAYER_RELU };
        s.layers[2] = (struct layer_spec){ .type = LAYER_DENSE, .units = 3 };
        char err[256];
        struct graph *g = NULL;
        assert_int_equal(graph_from_spec(&s, &g, err, sizeof(err)), 0);
        const struct graph_tensor *in = &g->tensors[graph_find(g, "input")];
        assert_int_equal(in->shape.rank, 2);
        assert_int_equal(in->shape.dims[1], 4 + 2 * 3 + 2);
        assert_true(in->want_grad);
        graph_free(g);
        compare(&s, 5);
}

UNIT_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_mlp), cmocka_unit_test(test_cnn), cmocka_unit_test(test_dense_after_conv),
               cmocka_unit_test(test_embeddings))
