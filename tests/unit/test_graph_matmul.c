/* graph_k_matmul.c: Gemm (transposes, alpha, beta, C broadcast), MatMul (2-D and batched), Softmax and
 * LogSoftmax along an axis, ReduceSum and ReduceMean; each forward against a naive reference in double,
 * each backward against finite differences (graph_check.h), shapes with the batch, and the shape
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

/* The step of the finite differences for Gemm and MatMul. Both are linear in each input, so a central
 * difference has no truncation error at any step and only float32's rounding of the outputs remains,
 * which shrinks as the step grows: at 1e-2 it reached 1.3e-3 on a gradient element of 8e-4 with
 * OpenBLAS's Prescott kernel, at 1e-1 it stays under 5e-5 on every kernel tried. */
#define H_PRODUCT 1e-1

/* ---- Gemm ---- */

/* C's element for output (m, n), C of rank 0 to 2 broadcast to (M, N). */
static double c_at(const float *c, const struct graph_shape *sc, int m, int n)
{
        if (sc->rank == 0)
                return c[0];
        if (sc->rank == 1)
                return c[sc->dims[0] == 1 ? 0 : n];
        int64_t cn = sc->dims[1];
        return c[(sc->dims[0] == 1 ? 0 : m) * cn + (cn == 1 ? 0 : n)];
}

static void gemm_case(int ta, int tb, float alpha, float beta, int M, int K, int N, const struct graph_shape *sc,
                      const char *what)
{
        struct graph_shape sa = ta ? GC_SHAPE(K, M) : GC_SHAPE(M, K), sb = tb ? GC_SHAPE(N, K) : GC_SHAPE(K, N);
        float *a = gc_rand((size_t)M * K, -1, 1, 51), *b = gc_rand((size_t)K * N, -1, 1, 52);
        float *c = sc ? gc_rand(graph_shape_count(sc, 1), -1, 1, 53) : NULL;
        float *ref = calloc(M * N, sizeof(float));
        for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                        double s = 0;
                        for (int k = 0; k < K; k++)
                                s += (double)a[ta ? k * M + m : m * K + k] * b[tb ? n * K + k : k * N + n];
                        ref[m * N + n] = (float)(alpha * s + (sc ? beta * c_at(c, sc, m, n) : 0));
                }
        struct gc_input in[3] = { { "A", GDT_F32, sa, a }, { "B", GDT_F32, sb, b } };
        if (sc)
                in[2] = (struct gc_input){ "C", GDT_F32, *sc, c };
        struct graph_attrs at;
        graph_attrs_default(&at);
        at.trans_a = ta;
        at.trans_b = tb;
        at.alpha = alpha;
        at.beta = beta;
        struct gc_result r;
        int rc = gc_check(GOP_GEMM, &at, in, sc ? 3 : 2, 1, false, ref, H_PRODUCT, &r);
        gc_expect_close(what, rc, &r, ref, (size_t)M * N);
        free(a);
        free(b);
        free(c);
        free(ref);
}

static void test_gemm(void **state)
{
        gemm_case(0, 0, 1, 1, 3, 4, 5, NULL, "Gemm (3,4)x(4,5)");
        struct graph_shape cn = GC_SHAPE(5), cm1 = GC_SHAPE(3, 1), cmn = GC_SHAPE(3, 5), c1n = GC_SHAPE(1, 2);
        struct graph_shape c0 = { .rank = 0 };
        gemm_case(0, 0, 1, 1, 3, 4, 5, &cn, "Gemm C (5)");
        gemm_case(1, 0, 0.7f, 1.3f, 3, 4, 5, &cm1, "Gemm transA alpha .7 beta 1.3 C (3,1)");
        gemm_case(0, 1, 0.7f, 1.3f, 3, 4, 5, &cmn, "Gemm transB alpha .7 beta 1.3 C (3,5)");
        gemm_case(1, 1, -1.5f, 0.5f, 6, 7, 2, &c1n, "Gemm transA transB alpha -1.5 beta .5 C (1,2)");
        gemm_case(1, 1, 2.0f, -2.0f, 4, 3, 6, &c0, "Gemm transA transB C scalar");
        struct graph_shape c6 = GC_SHAPE(6);
        gemm_case(0, 0, 1.0f, 0.0f, 4, 3, 6, &c6, "Gemm beta 0 (C ignored)");
}

/* ---- MatMul ---- */

static void matmul_case(struct graph_shape sa, struct graph_shape sb, const char *what)
{
        int64_t M = sa.dims[sa.rank - 2], K = sa.dims[sa.rank - 1], N = sb.dims[sb.rank - 1];
        int64_t ba = sa.rank == 3 ? sa.dims[0] : 1, bb = sb.rank == 3 ? sb.dims[0] : 1;
        int64_t nb = ba > bb ? ba : bb;
        float *a = gc_rand(graph_shape_count(&sa, 1), -1, 1, 61), *b = gc_rand(graph_shape_count(&sb, 1), -1, 1, 62);
        size_t no = (size_t)(nb * M * N);
        float *ref = calloc(no, sizeof(float));
        for (int64_t i = 0; i < nb; i++)
                for (int64_t m = 0; m < M; m++)
                        for (int64_t n = 0; n < N; n++) {
                                double s = 0;
                                for (int64_t k = 0; k < K; k++)
                                        s += (double)a[(ba == 1 ? 0 : i) * M * K + m * K + k] *
                                             b[(bb == 1 ? 0 : i) * K * N + k * N + n];
                                ref[(i * M + m) * N + n] = (float)s;
                        }
        struct gc_input in[2] = { { "A", GDT_F32, sa, a }, { "B", GDT_F32, sb, b } };
        struct gc_result r;
        int rc = gc_check(GOP_MATMUL, NULL, in, 2, 1, false, ref, H_PRODUCT, &r);
        gc_expect_close(what, rc, &r, ref, no);
        free(a);
        free(b);
        free(ref);
}

static void test_matmul(void **state)
{
        matmul_case(GC_SHAPE(3, 4), GC_SHAPE(4, 5), "MatMul (3,4)x(4,5)");
        matmul_case(GC_SHAPE(2, 3, 4), GC_SHAPE(2, 4, 5), "MatMul (2,3,4)x(2,4,5)");
        matmul_case(GC_SHAPE(2, 3, 4), GC_SHAPE(4, 5), "MatMul (2,3,4)x(4,5)");
        matmul_case(GC_SHAPE(3, 4), GC_SHAPE(2, 4, 5), "MatMul (3,4)x(2,4,5)");
        matmul_case(GC_SHAPE(1, 3, 4), GC_SHAPE(3, 4, 2), "MatMul (1,3,4)x(3,4,2) batch broadcast");
        matmul_case(GC_SHAPE(3, 2, 4), GC_SHAPE(1, 4, 5), "MatMul (3,2,4)x(1,4,5) batch broadcast");
}

/* ---- Softmax, LogSoftmax ---- */

/* check_bwd false for logits far from 0, where graph_check's step (relative to the value: 10 at 1000) is
 * no finite difference; the backward reads only the output, which does not depend on that offset. */
static void softmax_case(enum graph_op op, struct graph_shape s, int64_t axis, float lo, float hi, bool check_bwd,
                         const char *what)
{
        size_t n = graph_shape_count(&s, 1);
        uint32_t ax = (uint32_t)(axis < 0 ? axis + s.rank : axis);
        size_t L = (size_t)s.dims[ax], inner = 1;
        for (uint32_t d = ax + 1; d < s.rank; d++)
                inner *= (size_t)s.dims[d];
        float *x = gc_rand(n, lo, hi, 71), *ref = calloc(n, sizeof(float));
        for (size_t i = 0; i < n; i++) {
                /* the line through element i: the same coordinates but along the axis */
                size_t base = i / (L * inner) * L * inner + i % inner;
                double mx = -INFINITY, sum = 0;
                for (size_t l = 0; l < L; l++)
                        mx = fmax(mx, x[base + l * inner]);
                for (size_t l = 0; l < L; l++)
                        sum += exp(x[base + l * inner] - mx);
                ref[i] = (float)(op == GOP_SOFTMAX ? exp(x[i] - mx) / sum : x[i] - mx - log(sum));
        }
        struct gc_input in[1] = { { "x", GDT_F32, s, x } };
        struct graph_attrs at;
        graph_attrs_default(&at);
        at.axis = axis;
        struct gc_result r;
        int rc = gc_check(op, &at, in, 1, 1, false, ref, 1e-2, &r);
        if (check_bwd) {
                gc_expect_close(what, rc, &r, ref, n);
        } else {
                printf("  %-48s fwd %.2e (scale %.3g)  bwd not checked\n", what, r.fwd_max_abs, 1.0);
                assert_int_equal(rc, 0);
                assert_true(r.fwd_max_abs <= 1e-5 * 4.2); /* |log-softmax| of 6 logits 4 apart: at most ~4.2 */
        }
        free(x);
        free(ref);
}

static void test_softmax(void **state)
{
        softmax_case(GOP_SOFTMAX, GC_SHAPE(2, 3, 4), 1, -2, 2, true, "Softmax (2,3,4) axis 1");
        softmax_case(GOP_SOFTMAX, GC_SHAPE(2, 3, 4), -1, -2, 2, true, "Softmax (2,3,4) axis -1");
        softmax_case(GOP_SOFTMAX, GC_SHAPE(4, 5), 0, -2, 2, true, "Softmax (4,5) axis 0");
        /* exp(1000) overflows: only the max's subtraction keeps it finite */
        softmax_case(GOP_SOFTMAX, GC_SHAPE(3, 6), -1, 998, 1002, false, "Softmax (3,6) axis -1, logits near 1000");
}

static void test_log_softmax(void **state)
{
        softmax_case(GOP_LOG_SOFTMAX, GC_SHAPE(2, 3, 4), 1, -2, 2, true, "LogSoftmax (2,3,4) axis 1");
        softmax_case(GOP_LOG_SOFTMAX, GC_SHAPE(2, 3, 4), -1, -2, 2, true, "LogSoftmax (2,3,4) axis -1");
        softmax_case(GOP_LOG_SOFTMAX, GC_SHAPE(3, 6), -1, -1002, -998, false,
                     "LogSoftmax (3,6) axis -1, logits near -1000");
}

/* ---- ReduceSum, ReduceMean ---- */

static void reduce_case(enum graph_op op, struct graph_shape s, const int64_t *axes, uint32_t n_axes, int keepdims,
                        int noop, const char *what)
{
        bool red[GRAPH_MAX_RANK] = { false };
        for (uint32_t d = 0; d < s.rank; d++)
                red[d] = n_axes == 0 && !noop;
        for (uint32_t i = 0; i < n_axes; i++)
                red[axes[i] < 0 ? axes[i] + s.rank : axes[i]] = true;
        size_t n = graph_shape_count(&s, 1), no = 1, count = 1;
        for (uint32_t d = 0; d < s.rank; d++) {
                if (red[d])
                        count *= (size_t)s.dims[d];
                else
                        no *= (size_t)s.dims[d];
        }
        float *x = gc_rand(n, -1, 1, 81), *ref = calloc(no, sizeof(float));
        double *acc = calloc(no, sizeof(double));
        for (size_t i = 0; i < n; i++) {
                /* the output index: the input's coordinates less the reduced ones */
                size_t rest = i, o = 0, mul = 1;
                for (uint32_t d = s.rank; d-- > 0;) {
                        size_t c = rest % (size_t)s.dims[d];
                        rest /= (size_t)s.dims[d];
                        if (!red[d]) {
                                o += c * mul;
                                mul *= (size_t)s.dims[d];
                        }
                }
                acc[o] += x[i];
        }
        for (size_t o = 0; o < no; o++)
                ref[o] = (float)(op == GOP_REDUCE_MEAN ? acc[o] / count : acc[o]);
        struct gc_input in[1] = { { "x", GDT_F32, s, x } };
        struct graph_attrs at;
        graph_attrs_default(&at);
        at.keepdims = keepdims;
        at.noop_with_empty_axes = noop;
        at.n_axes = n_axes;
        for (uint32_t i = 0; i < n_axes; i++)
                at.axes[i] = axes[i];
        struct gc_result r;
        int rc = gc_check(op, &at, in, 1, 1, false, ref, 1e-2, &r);
        gc_expect_close(what, rc, &r, ref, no);
        free(x);
        free(ref);
        free(acc);
}

static void test_reduce_sum(void **state)
{
        struct graph_shape s = GC_SHAPE(2, 3, 4);
        reduce_case(GOP_REDUCE_SUM, s, (int64_t[]){ 1 }, 1, 1, 0, "ReduceSum (2,3,4) axes 1 keepdims");
        reduce_case(GOP_REDUCE_SUM, s, (int64_t[]){ 0, 2 }, 2, 0, 0, "ReduceSum (2,3,4) axes 0,2");
        reduce_case(GOP_REDUCE_SUM, s, (int64_t[]){ -1 }, 1, 0, 0, "ReduceSum (2,3,4) axes -1");
        reduce_case(GOP_REDUCE_SUM, s, NULL, 0, 0, 0, "ReduceSum (2,3,4) all");
        reduce_case(GOP_REDUCE_SUM, s, NULL, 0, 1, 1, "ReduceSum (2,3,4) no axes, noop_with_empty_axes");
        reduce_case(GOP_REDUCE_SUM, GC_SHAPE(2, 3, 2, 3), (int64_t[]){ 3, 1 }, 2, 1, 0,
                    "ReduceSum (2,3,2,3) axes 3,1 keepdims");
}

static void test_reduce_mean(void **state)
{
        struct graph_shape s = GC_SHAPE(2, 3, 4);
        reduce_case(GOP_REDUCE_MEAN, s, (int64_t[]){ 0, -1 }, 2, 1, 0, "ReduceMean (2,3,4) axes 0,-1 keepdims");
        reduce_case(GOP_REDUCE_MEAN, s, (int64_t[]){ 1, 2 }, 2, 0, 0, "ReduceMean (2,3,4) axes 1,2");
        reduce_case(GOP_REDUCE_MEAN, s, NULL, 0, 1, 0, "ReduceMean (2,3,4) all keepdims");
}

/* ---- the batch ---- */

/* A node over a batch input x and parameters, finalized: its output's shape, then values at B = 3 of max
 * 4 against ref. */
static void batch_case(enum graph_op op, const struct graph_attrs *at, struct graph_shape sx, const float *xv,
                       const struct graph_shape *sp, const float *const *pv, uint32_t n_p, struct graph_shape want,
                       const float *ref, const char *what)
{
        struct graph *g = graph_new();
        int32_t in[3];
        in[0] = graph_add_tensor(g, "x", GT_INPUT, GDT_F32, &sx, NULL);
        for (uint32_t i = 0; i < n_p; i++) {
                char name[8];
                snprintf(name, sizeof(name), "p%u", i);
                in[1 + i] = graph_add_tensor(g, name, GT_PARAM, GDT_F32, &sp[i], pv[i]);
        }
        const char *outs[1] = { "y" };
        char err[256] = "";
        assert_true(graph_add_node(g, op, what, in, 1 + n_p, outs, 1, at) >= 0);
        if (graph_finalize(g, err, sizeof(err)) < 0)
                fail_msg("%s: %s", what, err);
        int32_t y = graph_find(g, "y");
        const struct graph_shape *got = &g->tensors[y].shape;
        assert_int_equal(got->rank, want.rank);
        for (uint32_t d = 0; d < want.rank; d++)
                assert_int_equal(got->dims[d], want.dims[d]);
        struct graph_exec *ex = NULL;
        assert_int_equal(graph_exec_new(g, 4, &ex, err, sizeof(err)), 0);
        assert_int_equal(graph_set_input(ex, in[0], xv, 3), 0);
        assert_int_equal(graph_forward(ex, false, 1), 0);
        size_t n = 0;
        const float *v = graph_value(ex, y, &n);
        assert_int_equal(n, graph_shape_count(&want, 3));
        double worst = 0;
        for (size_t i = 0; i < n; i++)
                worst = fmax(worst, fabs((double)v[i] - ref[i]));
        printf("  %-48s fwd %.2e at B 3\n", what, worst);
        assert_true(worst <= 1e-5);
        graph_exec_free(ex);
        graph_free(g);
}

static void test_batch(void **state)
{
        /* x (B, 2) W^T: W (3, 2), transB, C (3) */
        float x[6] = { 1, 2, 3, 4, 5, 6 }, w[6] = { 1, 0, 0, 1, 1, 1 }, c[3] = { 0.5f, -0.5f, 1 };
        float ref_gemm[9] = { 1.5f, 1.5f, 4, 3.5f, 3.5f, 8, 5.5f, 5.5f, 12 };
        struct graph_attrs at;
        graph_attrs_default(&at);
        at.trans_b = 1;
        batch_case(GOP_GEMM, &at, GC_SHAPE(GRAPH_BATCH, 2), x, (struct graph_shape[]){ GC_SHAPE(3, 2), GC_SHAPE(3) },
                   (const float *[]){ w, c }, 2, GC_SHAPE(GRAPH_BATCH, 3), ref_gemm, "Gemm (batch,2)x(3,2)^T+C");
        /* (B, 1, 2) x (2, 3) */
        float w2[6] = { 1, 0, 1, 0, 1, 1 };
        float ref_mm[9] = { 1, 2, 3, 3, 4, 7, 5, 6, 11 };
        batch_case(GOP_MATMUL, NULL, GC_SHAPE(GRAPH_BATCH, 1, 2), x, (struct graph_shape[]){ GC_SHAPE(2, 3) },
                   (const float *[]){ w2 }, 1, GC_SHAPE(GRAPH_BATCH, 1, 3), ref_mm, "MatMul (batch,1,2)x(2,3)");
        /* the mean over the batch: no batch left in the shape */
        graph_attrs_default(&at);
        at.n_axes = 1;
        at.axes[0] = 0;
        at.keepdims = 0;
        float ref_mean[2] = { 3, 4 };
        batch_case(GOP_REDUCE_MEAN, &at, GC_SHAPE(GRAPH_BATCH, 2), x, NULL, NULL, 0, GC_SHAPE(2), ref_mean,
                   "ReduceMean (batch,2) axes 0");
        graph_attrs_default(&at);
        at.axis = -1;
        float ref_sm[6];
        for (int i = 0; i < 3; i++) {
                ref_sm[2 * i] = (float)(1 / (1 + exp(1.0)));
                ref_sm[2 * i + 1] = (float)(1 / (1 + exp(-1.0)));
        }
        batch_case(GOP_SOFTMAX, &at, GC_SHAPE(GRAPH_BATCH, 2), x, NULL, NULL, 0, GC_SHAPE(GRAPH_BATCH, 2), ref_sm,
                   "Softmax (batch,2) axis -1");
}

/* ---- refusals ---- */

/* graph_finalize's one line for a node the shape function refuses: the node, its op, the reason. A
 * shape whose dims[0] is the batch is an input, the others parameters. */
static void expect_refused(enum graph_op op, const struct graph_attrs *at, const struct graph_shape *s, uint32_t n_in,
                           const char *want)
{
        struct graph *g = graph_new();
        int32_t in[3];
        for (uint32_t i = 0; i < n_in; i++) {
                char name[8];
                snprintf(name, sizeof(name), "t%u", i);
                bool batch = s[i].rank && s[i].dims[0] == GRAPH_BATCH;
                in[i] = graph_add_tensor(g, name, batch ? GT_INPUT : GT_PARAM, GDT_F32, &s[i], NULL);
                assert_true(in[i] >= 0);
        }
        const char *outs[1] = { "y" };
        assert_true(graph_add_node(g, op, "bad", in, n_in, outs, 1, at) >= 0);
        char err[256] = "";
        assert_int_equal(graph_finalize(g, err, sizeof(err)), -EINVAL);
        printf("  refused: %s\n", err);
        assert_non_null(strstr(err, "\"bad\""));
        assert_non_null(strstr(err, graph_op_name(op)));
        if (!strstr(err, want))
                fail_msg("\"%s\" does not say \"%s\"", err, want);
        graph_free(g);
}

static void test_refusals(void **state)
{
        struct graph_attrs at;
        struct graph_shape ab[3] = { GC_SHAPE(3, 4), GC_SHAPE(4, 5), GC_SHAPE(4) };
        graph_attrs_default(&at);
        at.trans_a = 2;
        expect_refused(GOP_GEMM, &at, ab, 2, "transA=2 is not 0 or 1");
        graph_attrs_default(&at);
        at.trans_b = -1;
        expect_refused(GOP_GEMM, &at, ab, 2, "transB=-1");
        at.trans_b = 1; /* B^T is (5, 4): K 4 against 5 */
        expect_refused(GOP_GEMM, &at, ab, 2, "K differs");
        expect_refused(GOP_GEMM, NULL, ab, 3, "input 2 (C)"); /* C (4) against N = 5 */
        struct graph_shape a3[2] = { GC_SHAPE(2, 3, 4), GC_SHAPE(4, 5) };
        expect_refused(GOP_GEMM, NULL, a3, 2, "input 0 has rank 3; Gemm takes 2-D");
        graph_attrs_default(&at);
        at.trans_a = 1;
        struct graph_shape ak[2] = { GC_SHAPE(GRAPH_BATCH, 4), GC_SHAPE(GRAPH_BATCH, 5) };
        expect_refused(GOP_GEMM, &at, ak, 2, "K must be known");

        struct graph_shape m4[2] = { GC_SHAPE(3, 4), GC_SHAPE(1, 2, 4, 5) };
        expect_refused(GOP_MATMUL, NULL, m4, 2, "input 1 has rank 4; MatMul takes 2-D or 3-D");
        struct graph_shape m1[2] = { GC_SHAPE(4), GC_SHAPE(4, 5) };
        expect_refused(GOP_MATMUL, NULL, m1, 2, "input 0 has rank 1");
        struct graph_shape mb[2] = { GC_SHAPE(2, 3, 4), GC_SHAPE(3, 4, 5) };
        expect_refused(GOP_MATMUL, NULL, mb, 2, "leading dims 2 and 3");
        struct graph_shape mk[2] = { GC_SHAPE(2, 3, 4), GC_SHAPE(2, 5, 5) };
        expect_refused(GOP_MATMUL, NULL, mk, 2, "K differs");

        struct graph_shape r3[1] = { GC_SHAPE(2, 3, 4) };
        graph_attrs_default(&at);
        at.keepdims = 2;
        expect_refused(GOP_REDUCE_SUM, &at, r3, 1, "keepdims=2");
        graph_attrs_default(&at);
        at.n_axes = 2;
        at.axes[0] = 1;
        at.axes[1] = -2;
        expect_refused(GOP_REDUCE_MEAN, &at, r3, 1, "axis 1 twice");
        at.axes[1] = 3;
        expect_refused(GOP_REDUCE_SUM, &at, r3, 1, "axes[1]=3 is out of range");
        graph_attrs_default(&at);
        at.noop_with_empty_axes = 5;
        expect_refused(GOP_REDUCE_SUM, &at, r3, 1, "noop_with_empty_axes=5");
}

UNIT_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_gemm), cmocka_unit_test(test_matmul), cmocka_unit_test(test_softmax),
               cmocka_unit_test(test_log_softmax), cmocka_unit_test(test_reduce_sum),
               cmocka_unit_test(test_reduce_mean), cmocka_unit_test(test_batch), cmocka_unit_test(test_refusals))
