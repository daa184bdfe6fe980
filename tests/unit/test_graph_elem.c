/* graph_k_elem.c: Add, Sub, Mul, Div with NumPy broadcasting, the activations, Dropout; each forward
 * against a naive reference, each backward against finite differences (graph_check.h), and the shape
 * functions' refusals as graph_finalize words them. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "graph.h"
#include "graph_check.h"

/* Output element i's index in an input of shape s broadcast to o, by division: a different route from
 * the kernel's stride walk. */
static size_t bcast_index(const struct graph_shape *o, const struct graph_shape *s, size_t i)
{
        size_t r = 0, mul = 1;
        uint32_t lead = o->rank - s->rank;
        for (uint32_t d = o->rank; d-- > 0;) {
                size_t c = i % (size_t)o->dims[d];
                i /= (size_t)o->dims[d];
                if (d >= lead) {
                        size_t n = (size_t)s->dims[d - lead];
                        r += (n == 1 ? 0 : c) * mul;
                        mul *= n;
                }
        }
        return r;
}

static void binary_case(enum graph_op op, struct graph_shape sa, struct graph_shape sb, struct graph_shape so,
                        const char *what)
{
        size_t na = graph_shape_count(&sa, 1), nb = graph_shape_count(&sb, 1), no = graph_shape_count(&so, 1);
        float *a = gc_rand(na, -1, 1, 11), *b = gc_rand(nb, 0.5f, 2, 22), *ref = calloc(no, sizeof(float));
        for (size_t i = 0; i < nb; i += 2)
                b[i] = -b[i]; /* both signs, |b| >= 0.5 for Div */
        for (size_t i = 0; i < no; i++) {
                double x = a[bcast_index(&so, &sa, i)], y = b[bcast_index(&so, &sb, i)];
                ref[i] = (float)(op == GOP_ADD ? x + y : op == GOP_SUB ? x - y : op == GOP_MUL ? x * y : x / y);
        }
        struct gc_input in[2] = { { "a", GDT_F32, sa, a }, { "b", GDT_F32, sb, b } };
        struct graph_attrs at;
        graph_attrs_default(&at);
        struct gc_result r;
        int rc = gc_check(op, &at, in, 2, 1, false, ref, 1e-2, &r);
        gc_expect_close(what, rc, &r, ref, no);
        free(a);
        free(b);
        free(ref);
}

static void test_add(void **state)
{
        binary_case(GOP_ADD, GC_SHAPE(2, 3, 4), GC_SHAPE(3, 1), GC_SHAPE(2, 3, 4), "Add (2,3,4)+(3,1)");
        binary_case(GOP_ADD, GC_SHAPE(2, 1, 4), GC_SHAPE(3, 1), GC_SHAPE(2, 3, 4), "Add (2,1,4)+(3,1) both broadcast");
        binary_case(GOP_ADD, GC_SHAPE(5, 7), GC_SHAPE(5, 7), GC_SHAPE(5, 7), "Add (5,7)+(5,7)");
}

static void test_sub(void **state)
{
        binary_case(GOP_SUB, GC_SHAPE(3, 5), GC_SHAPE(3, 5), GC_SHAPE(3, 5), "Sub (3,5)-(3,5)");
        binary_case(GOP_SUB, GC_SHAPE(1), GC_SHAPE(2, 3), GC_SHAPE(2, 3), "Sub (1)-(2,3)");
        binary_case(GOP_SUB, GC_SHAPE(2, 3), (struct graph_shape){ .rank = 0 }, GC_SHAPE(2, 3), "Sub (2,3)-scalar");
}

static void test_mul(void **state)
{
        binary_case(GOP_MUL, GC_SHAPE(4), GC_SHAPE(2, 3, 4), GC_SHAPE(2, 3, 4), "Mul (4)*(2,3,4)");
        binary_case(GOP_MUL, GC_SHAPE(2, 1, 3, 1, 2, 2), GC_SHAPE(2, 1, 3, 1, 2), GC_SHAPE(2, 2, 3, 3, 2, 2),
                    "Mul rank 6 (2,1,3,1,2,2)*(2,1,3,1,2)");
}

static void test_div(void **state)
{
        binary_case(GOP_DIV, GC_SHAPE(2, 3, 4), GC_SHAPE(2, 1, 4), GC_SHAPE(2, 3, 4), "Div (2,3,4)/(2,1,4)");
        binary_case(GOP_DIV, GC_SHAPE(3, 1), GC_SHAPE(4), GC_SHAPE(3, 4), "Div (3,1)/(4)");
}

/* x * x: one tensor feeds both inputs, so both gradients land in the same buffer and must add. */
static void test_mul_same_tensor(void **state)
{
        struct graph *g = graph_new();
        struct graph_shape s = GC_SHAPE(5);
        float x[5] = { -1.5f, -0.5f, 0.25f, 1, 2 };
        int32_t t = graph_add_tensor(g, "x", GT_PARAM, GDT_F32, &s, x);
        int32_t in[2] = { t, t };
        const char *outs[1] = { "y" };
        char err[256] = "";
        assert_true(graph_add_node(g, GOP_MUL, "sq", in, 2, outs, 1, NULL) >= 0);
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        struct graph_exec *ex = NULL;
        assert_int_equal(graph_exec_new(g, 1, &ex, err, sizeof(err)), 0);
        assert_int_equal(graph_forward(ex, true, 1), 0);
        assert_int_equal(graph_backward(ex, graph_find(g, "y"), NULL), 0);
        const float *gr = graph_exec_grads(ex);
        for (int i = 0; i < 5; i++)
                assert_float_equal(gr[i], 2 * x[i], 1e-6);
        graph_exec_free(ex);
        graph_free(g);
}

/* A batch input broadcast against a parameter: shape (batch, 3), values at B = 2 of max 4, and the
 * parameter's gradient summed over the batch. */
static void test_add_batch(void **state)
{
        struct graph *g = graph_new();
        struct graph_shape sx = GC_SHAPE(GRAPH_BATCH, 3), sb = GC_SHAPE(3);
        float bias[3] = { 1, 2, 3 };
        int32_t tx = graph_add_tensor(g, "x", GT_INPUT, GDT_F32, &sx, NULL);
        int32_t tb = graph_add_tensor(g, "b", GT_PARAM, GDT_F32, &sb, bias);
        int32_t in[2] = { tx, tb };
        const char *outs[1] = { "y" };
        char err[256] = "";
        assert_true(graph_add_node(g, GOP_ADD, "add", in, 2, outs, 1, NULL) >= 0);
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        int32_t y = graph_find(g, "y");
        assert_int_equal(g->tensors[y].shape.rank, 2);
        assert_int_equal(g->tensors[y].shape.dims[0], GRAPH_BATCH);
        assert_int_equal(g->tensors[y].shape.dims[1], 3);
        struct graph_exec *ex = NULL;
        assert_int_equal(graph_exec_new(g, 4, &ex, err, sizeof(err)), 0);
        float xv[6] = { 10, 20, 30, 40, 50, 60 };
        assert_int_equal(graph_set_input(ex, tx, xv, 2), 0);
        assert_int_equal(graph_forward(ex, true, 1), 0);
        size_t n = 0;
        const float *v = graph_value(ex, y, &n);
        assert_int_equal(n, 6);
        for (int i = 0; i < 6; i++)
                assert_float_equal(v[i], xv[i] + bias[i % 3], 0);
        assert_int_equal(graph_backward(ex, y, NULL), 0);
        for (int i = 0; i < 3; i++)
                assert_float_equal(graph_exec_grads(ex)[i], 2, 0);
        graph_exec_free(ex);
        graph_free(g);
}

/* Inputs at least 0.1 from 0, where Relu and LeakyRelu have their kink. */
static float *away_from_zero(size_t n, unsigned seed)
{
        float *x = gc_rand(n, -1, 1, seed);
        for (size_t i = 0; i < n; i++)
                x[i] = x[i] < 0 ? -0.1f + 1.9f * x[i] : 0.1f + 1.9f * x[i];
        return x;
}

static void unary_case(enum graph_op op, float alpha, const char *what)
{
        struct graph_shape s = GC_SHAPE(3, 4, 5);
        size_t n = graph_shape_count(&s, 1);
        float *x = away_from_zero(n, 33), *ref = calloc(n, sizeof(float));
        for (size_t i = 0; i < n; i++) {
                double v = x[i];
                ref[i] = (float)(op == GOP_RELU         ? (v > 0 ? v : 0)
                                 : op == GOP_LEAKY_RELU ? (v > 0 ? v : alpha * v)
                                 : op == GOP_SIGMOID    ? 1 / (1 + exp(-v))
                                                        : tanh(v));
        }
        struct gc_input in[1] = { { "x", GDT_F32, s, x } };
        struct graph_attrs at;
        graph_attrs_default(&at);
        at.alpha = alpha;
        struct gc_result r;
        int rc = gc_check(op, &at, in, 1, 1, false, ref, 1e-2, &r);
        gc_expect_close(what, rc, &r, ref, n);
        free(x);
        free(ref);
}

static void test_relu(void **state)
{
        unary_case(GOP_RELU, 1.0f, "Relu (3,4,5)");
}

static void test_leaky_relu(void **state)
{
        unary_case(GOP_LEAKY_RELU, 0.2f, "LeakyRelu alpha 0.2 (3,4,5)");
}

static void test_sigmoid(void **state)
{
        unary_case(GOP_SIGMOID, 1.0f, "Sigmoid (3,4,5)");
        /* far out on both sides: 0 and 1, never NaN */
        struct gc_input in[1] = { { "x", GDT_F32, GC_SHAPE(4), (float[]){ -200, -90, 90, 200 } } };
        float ref[4] = { 0, 0, 1, 1 };
        struct gc_result r;
        assert_int_equal(gc_check(GOP_SIGMOID, NULL, in, 1, 1, false, ref, 1e-2, &r), 0);
        assert_true(r.fwd_max_abs < 1e-30);
}

static void test_tanh(void **state)
{
        unary_case(GOP_TANH, 1.0f, "Tanh (3,4,5)");
}

/* Training: each output is 0 or x / (1 - ratio); the backward holds to finite differences (seed 1 for
 * every forward of gc_check, so the same mask). Eval and ratio 0: identity, both ways. */
static void test_dropout_grad(void **state)
{
        struct graph_shape s = GC_SHAPE(4, 25);
        size_t n = graph_shape_count(&s, 1);
        float *x = gc_rand(n, -1, 1, 44);
        struct gc_input in[1] = { { "x", GDT_F32, s, x } };
        struct graph_attrs at;
        graph_attrs_default(&at);
        at.ratio = 0.3f;
        struct gc_result r;
        int rc = gc_check(GOP_DROPOUT, &at, in, 1, 1, true, NULL, 1e-2, &r);
        gc_expect_close("Dropout ratio 0.3, training", rc, &r, NULL, 0);
        rc = gc_check(GOP_DROPOUT, &at, in, 1, 1, false, x, 1e-2, &r);
        gc_expect_close("Dropout ratio 0.3, eval (identity)", rc, &r, x, n);
        assert_true(r.fwd_max_abs == 0);
        at.ratio = 0;
        rc = gc_check(GOP_DROPOUT, &at, in, 1, 1, true, x, 1e-2, &r);
        gc_expect_close("Dropout ratio 0, training (identity)", rc, &r, x, n);
        assert_true(r.fwd_max_abs == 0);
        free(x);
}

/* Two Dropouts of one input: each drops about ratio of its elements, keeps the mean, gives the same mask
 * for the same seed, another for another seed, and the two nodes' masks differ. */
static void test_dropout_masks(void **state)
{
        enum { N = 20000 };
        const float ratio = 0.3f;
        struct graph *g = graph_new();
        struct graph_shape s = GC_SHAPE(2, N / 2);
        float *ones = malloc(sizeof(float) * N);
        for (int i = 0; i < N; i++)
                ones[i] = 1;
        int32_t tx = graph_add_tensor(g, "x", GT_PARAM, GDT_F32, &s, ones);
        struct graph_attrs at;
        graph_attrs_default(&at);
        at.ratio = ratio;
        const char *o1[1] = { "y1" }, *o2[1] = { "y2" };
        assert_true(graph_add_node(g, GOP_DROPOUT, "d1", &tx, 1, o1, 1, &at) >= 0);
        assert_true(graph_add_node(g, GOP_DROPOUT, "d2", &tx, 1, o2, 1, &at) >= 0);
        char err[256] = "";
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        struct graph_exec *ex = NULL;
        assert_int_equal(graph_exec_new(g, 1, &ex, err, sizeof(err)), 0);
        int32_t y1 = graph_find(g, "y1"), y2 = graph_find(g, "y2");
        float *first = malloc(sizeof(float) * N);

        assert_int_equal(graph_forward(ex, true, 7), 0);
        const float *v = graph_value(ex, y1, NULL), *v2 = graph_value(ex, y2, NULL);
        memcpy(first, v, sizeof(float) * N);
        double sum = 0;
        size_t zeros = 0, differ_nodes = 0;
        float scale = 1.0f / (1.0f - ratio);
        for (int i = 0; i < N; i++) {
                assert_true(v[i] == 0 || v[i] == scale);
                zeros += v[i] == 0;
                sum += v[i];
                differ_nodes += v[i] != v2[i];
        }
        printf("  Dropout %d ones, ratio %.1f: dropped %.4f, mean %.4f, nodes differ at %.3f\n", N, ratio,
               (double)zeros / N, sum / N, (double)differ_nodes / N);
        assert_true(fabs((double)zeros / N - ratio) < 0.02);
        assert_true(fabs(sum / N - 1) < 0.03);
        /* independent masks differ at 2 ratio (1 - ratio) = 0.42 of the elements */
        assert_true(differ_nodes > N / 3);

        assert_int_equal(graph_forward(ex, true, 7), 0);
        assert_memory_equal(graph_value(ex, y1, NULL), first, sizeof(float) * N);
        assert_int_equal(graph_forward(ex, true, 8), 0);
        v = graph_value(ex, y1, NULL);
        size_t differ_seed = 0;
        for (int i = 0; i < N; i++)
                differ_seed += v[i] != first[i];
        assert_true(differ_seed > N / 3);
        assert_int_equal(graph_forward(ex, false, 7), 0);
        assert_memory_equal(graph_value(ex, y1, NULL), ones, sizeof(float) * N);

        free(first);
        free(ones);
        graph_exec_free(ex);
        graph_free(g);
}

/* graph_finalize's one line for a node the shape function refuses: the node, its op, the attribute. */
static void expect_refused(enum graph_op op, const struct graph_attrs *at, struct graph_shape sa,
                           const struct graph_shape *sb, const char *want)
{
        struct graph *g = graph_new();
        int32_t in[2];
        in[0] = graph_add_tensor(g, "a", GT_PARAM, GDT_F32, &sa, NULL);
        if (sb)
                in[1] = graph_add_tensor(g, "b", GT_PARAM, GDT_F32, sb, NULL);
        const char *outs[1] = { "y" };
        assert_true(graph_add_node(g, op, "bad", in, sb ? 2 : 1, outs, 1, at) >= 0);
        char err[256] = "";
        assert_int_equal(graph_finalize(g, err, sizeof(err)), -EINVAL);
        printf("  refused: %s\n", err);
        assert_non_null(strstr(err, "\"bad\""));
        assert_non_null(strstr(err, graph_op_name(op)));
        assert_non_null(strstr(err, want));
        graph_free(g);
}

static void test_refusals(void **state)
{
        struct graph_attrs at;
        graph_attrs_default(&at);
        at.ratio = 1.5f;
        expect_refused(GOP_DROPOUT, &at, GC_SHAPE(2, 3), NULL, "ratio=1.5");
        at.ratio = 1.0f;
        expect_refused(GOP_DROPOUT, &at, GC_SHAPE(2, 3), NULL, "ratio=1");
        graph_attrs_default(&at);
        at.axis = 2;
        expect_refused(GOP_SOFTMAX, &at, GC_SHAPE(2, 3), NULL, "axis=2");
        at.axis = -3;
        expect_refused(GOP_LOG_SOFTMAX, &at, GC_SHAPE(2, 3), NULL, "axis=-3");
        graph_attrs_default(&at);
        at.alpha = NAN;
        expect_refused(GOP_LEAKY_RELU, &at, GC_SHAPE(2, 3), NULL, "alpha");
        struct graph_shape s4 = GC_SHAPE(4);
        expect_refused(GOP_ADD, NULL, GC_SHAPE(2, 3), &s4, "broadcast");
}

UNIT_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_add), cmocka_unit_test(test_sub), cmocka_unit_test(test_mul),
               cmocka_unit_test(test_div), cmocka_unit_test(test_mul_same_tensor), cmocka_unit_test(test_add_batch),
               cmocka_unit_test(test_relu), cmocka_unit_test(test_leaky_relu), cmocka_unit_test(test_sigmoid),
               cmocka_unit_test(test_tanh), cmocka_unit_test(test_dropout_grad), cmocka_unit_test(test_dropout_masks),
               cmocka_unit_test(test_refusals))
