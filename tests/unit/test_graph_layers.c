/* graph_layers: a layer list compiled to a graph computes what the layer-list engine computes, with the
 * same variables at the same offsets: an MLP, a CNN with odd and even kernels and pools, a dense layer
 * straight on an image, each head's output (softmax's probabilities from the logits, logistic's sigmoid,
 * mse's value), forward and the parameters' gradients; and what it refuses. */
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
#include "graph.h"
#include "graph_layers.h"
#include "model.h"

static struct layer_spec L(enum layer_type t, uint32_t n, uint32_t k)
{
        struct layer_spec s = { .type = t };
        if (t == LAYER_DENSE)
                s.units = n;
        else if (t == LAYER_CONV2D)
                s.filters = n, s.kernel = k;
        else if (t == LAYER_MAXPOOL2D)
                s.pool = n;
        return s;
}

/* The model and the graph on the same parameters and inputs: outputs (the head's, from the graph's
 * logits) and parameter gradients (of the mean loss) agree. */
static void same_as_model(const struct model_spec *spec, uint32_t B)
{
        struct backend *be = NULL;
        assert_int_equal(backend_cpu_new(1, &be), 0);
        struct model *m = NULL;
        assert_int_equal(model_new(spec, be, B, &m), 0);
        assert_int_equal(model_init_params(m, 7), 0);
        char err[256] = "";
        struct graph *g = NULL;
        int r = graph_from_layers(spec, &g, err, sizeof(err));
        if (r != 0)
                print_error("graph_from_layers: %s\n", err);
        assert_int_equal(r, 0);
        assert_int_equal(g->n_params, model_n_params(m));
        for (uint32_t v = 0; v < model_n_vars(m); v++) {
                int t = graph_find(g, model_var(m, v)->name);
                assert_true(t >= 0);
                assert_int_equal(g->tensors[t].param_offset, model_var(m, v)->offset);
        }
        struct graph_exec *x = NULL;
        assert_int_equal(graph_exec_new(g, B, &x, err, sizeof(err)), 0);
        memcpy(graph_exec_params(x), model_params(m), sizeof(float) * model_n_params(m));

        uint32_t in = model_input_size(m), C = model_n_classes(m);
        float *xs = malloc(sizeof(float) * B * in), *y = malloc(sizeof(float) * B);
        srand(3);
        for (size_t i = 0; i < (size_t)B * in; i++)
                xs[i] = (float)rand() / RAND_MAX * 2 - 1;
        for (uint32_t b = 0; b < B; b++)
                y[b] = spec->head == HEAD_SOFTMAX ? (float)(b % C) : spec->head == HEAD_LOGISTIC ? (float)(b % 2) : 0.5f * b;
        float loss;
        assert_int_equal(model_forward_f(m, xs, y, B, &loss, NULL), 0);
        const float *want = model_outputs(m);
        assert_int_equal(graph_set_input(x, graph_find(g, "input"), xs, B), 0);
        assert_int_equal(graph_forward(x, true, 0), 0);
        size_t n = 0;
        const float *z = graph_value(x, g->loss, &n);
        assert_int_equal(n, (size_t)B * C);
        /* the head on the logits, and its gradient by the logits (of the mean loss) */
        float *dz = malloc(sizeof(float) * n);
        double worst = 0;
        for (uint32_t b = 0; b < B; b++) {
                const float *zb = z + (size_t)b * C;
                double mx = zb[0], s = 0;
                for (uint32_t c = 1; c < C; c++)
                        mx = fmax(mx, zb[c]);
                for (uint32_t c = 0; c < C; c++)
                        s += exp(zb[c] - mx);
                for (uint32_t c = 0; c < C; c++) {
                        double p = spec->head == HEAD_SOFTMAX ? exp(zb[c] - mx) / s
                                   : spec->head == HEAD_LOGISTIC ? 1 / (1 + exp(-zb[c])) : zb[c];
                        worst = fmax(worst, fabs(p - want[(size_t)b * C + c]));
                        double t = spec->head == HEAD_SOFTMAX ? (c == (uint32_t)y[b]) : y[b];
                        dz[(size_t)b * C + c] = (float)((spec->head == HEAD_MSE ? 2 * (p - t) : p - t) / B);
                }
        }
        print_message("outputs max abs %.3g\n", worst);
        assert_true(worst <= 1e-5);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        assert_int_equal(graph_backward(x, g->loss, dz), 0);
        const float *ga = model_grads(m), *gb = graph_exec_grads(x);
        double gmax = 1e-3, gw = 0;
        for (size_t i = 0; i < model_n_params(m); i++)
                gmax = fmax(gmax, fabs(ga[i]));
        for (size_t i = 0; i < model_n_params(m); i++)
                gw = fmax(gw, fabs(ga[i] - gb[i]));
        print_message("gradients max abs %.3g of scale %.3g\n", gw, gmax);
        assert_true(gw <= 1e-4 * gmax);
        free(dz), free(xs), free(y);
        graph_exec_free(x);
        graph_free(g);
        model_free(m);
        backend_free(be);
}

static void test_mlp(void **state)
{
        struct model_spec s = { .input = { 1, 1, 12 }, .n_layers = 5,
                                .layers = { L(LAYER_DENSE, 9, 0), L(LAYER_RELU, 0, 0), L(LAYER_DENSE, 7, 0),
                                            L(LAYER_TANH, 0, 0), L(LAYER_DENSE, 4, 0) } };
        same_as_model(&s, 6);
}

static void test_cnn(void **state)
{
        /* odd and even kernels ("same": the even one's extra row and column after), a pool that drops a
         * row, an explicit flatten */
        struct model_spec s = { .input = { 2, 9, 8 }, .n_layers = 9,
                                .layers = { L(LAYER_CONV2D, 3, 3), L(LAYER_RELU, 0, 0), L(LAYER_MAXPOOL2D, 2, 0),
                                            L(LAYER_CONV2D, 4, 2), L(LAYER_SIGMOID, 0, 0), L(LAYER_FLATTEN, 0, 0),
                                            L(LAYER_DENSE, 6, 0), L(LAYER_RELU, 0, 0), L(LAYER_DENSE, 3, 0) } };
        same_as_model(&s, 4);
}

static void test_dense_on_image_and_heads(void **state)
{
        struct model_spec s = { .input = { 1, 4, 5 }, .n_layers = 3, .head = HEAD_LOGISTIC,
                                .layers = { L(LAYER_DENSE, 5, 0), L(LAYER_TANH, 0, 0), L(LAYER_DENSE, 1, 0) } };
        same_as_model(&s, 5);
        s.head = HEAD_MSE;
        same_as_model(&s, 5);
}

static void test_refused(void **state)
{
        char err[256];
        struct graph *g = (struct graph *)1;
        struct model_spec s = { .input = { 1, 1, 4 }, .n_layers = 1, .layers = { L(LAYER_DENSE, 2, 0) },
                                .n_embeddings = 1 };
        assert_int_equal(graph_from_layers(&s, &g, err, sizeof(err)), -ENOTSUP);
        assert_null(g);
        assert_non_null(strstr(err, "embedding"));
        struct model_spec e = { .input = { 1, 1, 4 }, .n_layers = 0 };
        assert_int_equal(graph_from_layers(&e, &g, err, sizeof(err)), -EINVAL);
        assert_null(g);
        assert_true(err[0] != '\0');
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_mlp),
                cmocka_unit_test(test_cnn),
                cmocka_unit_test(test_dense_on_image_and_heads),
                cmocka_unit_test(test_refused),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
