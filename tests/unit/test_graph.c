/* The graph engine's core (graph.c): building and its errors, the parameter block's layout, a batched
 * MLP forward against a hand computation and backward against finite differences, gradients that fan in
 * from several uses, and feeding rules; every op's case (graph_cases.h) through an exec in device memory
 * (the CPU backend posing as a device: the exec's uploads, downloads and staging, the CPU kernels) equal
 * bit for bit to the host exec. The ops' own tests are test_graph_<group>.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "backend.h"
#include "graph.h"
#include "graph_cases.h"
#include "graph_check.h"
#include "unit.h"

static void test_build_errors(void **state)
{
        struct graph *g = graph_new();
        struct graph_shape s = GC_SHAPE(2, 3);
        assert_int_equal(graph_add_tensor(g, "p", GT_PARAM, GDT_F32, &s, NULL), 0);
        assert_int_equal(graph_add_tensor(g, "p", GT_PARAM, GDT_F32, &s, NULL), -EEXIST);
        assert_int_equal(graph_add_tensor(g, "q", GT_PARAM, GDT_I64, &s, NULL), -EINVAL); /* an int variable */
        struct graph_shape b = GC_SHAPE(GRAPH_BATCH, 3);
        assert_int_equal(graph_add_tensor(g, "c", GT_CONST, GDT_F32, &b, NULL), -EINVAL); /* a batched constant */
        struct graph_shape bad = GC_SHAPE(2, GRAPH_BATCH);
        assert_int_equal(graph_add_tensor(g, "x", GT_INPUT, GDT_F32, &bad, NULL), -EINVAL); /* batch not first */
        int32_t in[2] = { 0, 7 };
        const char *out[1] = { "y" };
        assert_int_equal(graph_add_node(g, GOP_ADD, "add", in, 2, out, 1, NULL), -EINVAL); /* no tensor 7 */
        const char *taken[1] = { "p" };
        assert_int_equal(graph_add_node(g, GOP_RELU, "r", in, 1, taken, 1, NULL), -EEXIST);
        assert_int_equal(graph_add_node(g, GOP__COUNT, "r", in, 1, out, 1, NULL), -EINVAL);
        graph_free(g);
}

/* graph_finalize's one-line reasons name the node and its op. */
static void test_finalize_errors(void **state)
{
        char err[512];
        struct graph_shape s = GC_SHAPE(2, 3);
        int64_t idx[2] = { 0, 1 };

        struct graph *g = graph_new();
        int32_t p = graph_add_tensor(g, "p", GT_PARAM, GDT_F32, &s, NULL);
        int32_t in2[2] = { p, p };
        const char *out[1] = { "y" };
        assert_true(graph_add_node(g, GOP_RELU, "relu1", in2, 2, out, 1, NULL) >= 0);
        assert_int_equal(graph_finalize(g, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"relu1\" (Relu): 2 inputs; it takes 1 to 1");
        graph_free(g);

        g = graph_new();
        p = graph_add_tensor(g, "p", GT_PARAM, GDT_F32, &s, NULL);
        struct graph_shape is = GC_SHAPE(2);
        int32_t c = graph_add_tensor(g, "ids", GT_CONST, GDT_I64, &is, idx);
        int32_t in_ai[2] = { p, c };
        assert_true(graph_add_node(g, GOP_ADD, "", in_ai, 2, out, 1, NULL) >= 0);
        assert_int_equal(graph_finalize(g, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node 0 (Add): input 1 \"ids\" is int64; only Gather's indices may be");
        graph_free(g);

        g = graph_new();
        p = graph_add_tensor(g, "p", GT_PARAM, GDT_F32, &s, NULL);
        int32_t q = graph_add_tensor(g, "q", GT_PARAM, GDT_F32, &s, NULL);
        int32_t in_g[2] = { p, q };
        assert_true(graph_add_node(g, GOP_GATHER, "emb", in_g, 2, out, 1, NULL) >= 0);
        assert_int_equal(graph_finalize(g, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"emb\" (Gather): the indices \"q\" are not int64");
        graph_free(g);
}

/* y = sum(relu(x W1 + b1) W2): the batch symbolic, fed at two sizes. */
struct mlp {
        struct graph *g;
        int32_t x, w1, b1, w2, loss;
};

static void mlp_build(struct mlp *m)
{
        char err[512] = "";
        struct graph *g = m->g = graph_new();
        struct graph_shape xs = GC_SHAPE(GRAPH_BATCH, 4), w1s = GC_SHAPE(4, 3), b1s = GC_SHAPE(3), w2s = GC_SHAPE(3, 2);
        float *w1 = gc_rand(12, -1, 1, 1), *b1 = gc_rand(3, -0.5f, 0.5f, 2), *w2 = gc_rand(6, -1, 1, 3);
        m->x = graph_add_tensor(g, "x", GT_INPUT, GDT_F32, &xs, NULL);
        m->w1 = graph_add_tensor(g, "w1", GT_PARAM, GDT_F32, &w1s, w1);
        m->b1 = graph_add_tensor(g, "b1", GT_PARAM, GDT_F32, &b1s, b1);
        m->w2 = graph_add_tensor(g, "w2", GT_PARAM, GDT_F32, &w2s, w2);
        free(w1), free(b1), free(w2);
        struct graph_attrs a;
        graph_attrs_default(&a);
        int32_t in1[3] = { m->x, m->w1, m->b1 };
        const char *h[1] = { "h" }, *r[1] = { "r" }, *z[1] = { "z" }, *l[1] = { "loss" };
        assert_true(graph_add_node(g, GOP_GEMM, "fc1", in1, 3, h, 1, &a) >= 0);
        int32_t in2[1] = { graph_find(g, "h") };
        assert_true(graph_add_node(g, GOP_RELU, "relu", in2, 1, r, 1, NULL) >= 0);
        int32_t in3[2] = { graph_find(g, "r"), m->w2 };
        assert_true(graph_add_node(g, GOP_MATMUL, "fc2", in3, 2, z, 1, NULL) >= 0);
        struct graph_attrs ra;
        graph_attrs_default(&ra);
        ra.keepdims = 0;
        int32_t in4[1] = { graph_find(g, "z") };
        assert_true(graph_add_node(g, GOP_REDUCE_SUM, "sum", in4, 1, l, 1, &ra) >= 0);
        int rc = graph_finalize(g, err, sizeof(err));
        if (rc < 0)
                fail_msg("%s", err);
        m->loss = graph_find(g, "loss");
}

/* The loss by hand, in double. */
static double mlp_ref(const float *p, size_t off_w1, size_t off_b1, size_t off_w2, const float *x, uint32_t B)
{
        double s = 0;
        for (uint32_t b = 0; b < B; b++)
                for (int j = 0; j < 3; j++) {
                        double h = p[off_b1 + j];
                        for (int i = 0; i < 4; i++)
                                h += (double)x[b * 4 + i] * p[off_w1 + i * 3 + j];
                        if (h < 0)
                                h = 0;
                        for (int k = 0; k < 2; k++)
                                s += h * p[off_w2 + j * 2 + k];
                }
        return s;
}

static void test_mlp(void **state)
{
        struct mlp m;
        mlp_build(&m);
        struct graph *g = m.g;
        /* the parameter block: the variables in the order they were added, contiguous */
        assert_int_equal(g->n_params, 12 + 3 + 6);
        assert_int_equal(g->tensors[m.w1].param_offset, 0);
        assert_int_equal(g->tensors[m.b1].param_offset, 12);
        assert_int_equal(g->tensors[m.w2].param_offset, 15);
        assert_int_equal(g->tensors[graph_find(g, "h")].shape.dims[0], GRAPH_BATCH);
        assert_int_equal(g->tensors[m.loss].shape.rank, 0);

        char err[256];
        struct graph_exec *x;
        assert_int_equal(graph_exec_new(g, 8, &x, err, sizeof(err)), 0);
        float *p = graph_exec_params(x);
        for (uint32_t B = 3; B <= 8; B += 5) {
                float *in = gc_rand((size_t)B * 4, -1, 1, 10 + B);
                assert_int_equal(graph_set_input(x, m.x, in, B), 0);
                assert_int_equal(graph_forward(x, true, 0), 0);
                size_t n = 0;
                const float *loss = graph_value(x, m.loss, &n);
                assert_int_equal(n, 1);
                double want = mlp_ref(p, 0, 12, 15, in, B);
                assert_true(fabs(loss[0] - want) <= 1e-5 * fmax(1, fabs(want)));
                assert_int_equal(graph_backward(x, m.loss, NULL), 0);
                const float *gr = graph_exec_grads(x);
                for (size_t i = 0; i < g->n_params; i++) {
                        float keep = p[i];
                        double hstep = 1e-3;
                        p[i] = keep + (float)hstep;
                        double up = mlp_ref(p, 0, 12, 15, in, B);
                        p[i] = keep - (float)hstep;
                        double dn = mlp_ref(p, 0, 12, 15, in, B);
                        p[i] = keep;
                        double num = (up - dn) / (2 * hstep);
                        if (fabs(num - gr[i]) > 1e-3 * fmax(1, fabs(num)))
                                fail_msg("B=%u param %zu: analytic %g numeric %g", B, i, gr[i], num);
                }
                free(in);
        }
        /* feeding: a batch over the maximum, and a parameter, are refused */
        float big[9 * 4] = { 0 };
        assert_int_equal(graph_set_input(x, m.x, big, 9), -EINVAL);
        assert_int_equal(graph_set_input(x, m.w1, big, 1), -EINVAL);
        /* the gradient of something no parameter reaches: refused */
        assert_int_equal(graph_backward(x, m.x, NULL), -EINVAL);
        graph_exec_free(x);
        graph_free(g);
}

/* The parameter hooks come as the graph computes: w2's "before" once fc1 has computed h (not yet fc2's
 * z), w1's and b1's "after" once fc2's backward has written w2's gradient; each once, w2 first backward,
 * then b1 before w1; a nonzero return stops the pass with it. */
struct hook_log {
        struct graph_exec *x;
        const struct mlp *m;
        int32_t seen[16];
        uint32_t block[16];
        uint32_t n;
        int stop_at;
        const float *z;    /* forward: fc2's output, still the mark when w2's hook runs */
};

static int log_hook(void *ud, int32_t t, uint32_t block)
{
        struct hook_log *l = ud;
        l->block[l->n] = block;
        l->seen[l->n++] = t;
        const float *h = graph_value(l->x, graph_find(l->m->g, "h"), NULL);
        if (t == l->m->w2) { /* fc1 ran */
                assert_true(h[0] != 0.0f || h[1] != 0.0f || h[2] != 0.0f);
                if (l->z)
                        assert_float_equal(l->z[0], 12345.0f, 0);
        }
        return t == l->stop_at ? 42 : 0;
}

static void test_param_hooks(void **state)
{
        (void)state;
        struct mlp m;
        mlp_build(&m);
        char err[256];
        struct graph_exec *x;
        enum { B = 3 };
        assert_int_equal(graph_exec_new(m.g, B, &x, err, sizeof(err)), 0);
        float *in = gc_rand(B * 4, -1, 1, 9);
        assert_int_equal(graph_set_input(x, m.x, in, B), 0);
        float *z = (float *)graph_value(x, graph_find(m.g, "z"), NULL);
        z[0] = 12345.0f; /* fc2 has not run when w2's hook is called: still this */
        struct hook_log l = { .x = x, .m = &m, .stop_at = -1, .z = z };
        assert_int_equal(graph_forward_hooked(x, true, 0, log_hook, &l), 0);
        assert_int_equal(l.n, 3);
        assert_int_equal(l.seen[0], m.w1);
        assert_int_equal(l.seen[1], m.b1);
        assert_int_equal(l.seen[2], m.w2);
        assert_true(z[0] != 12345.0f);
        l.n = 0;
        l.z = NULL;
        assert_int_equal(graph_backward_hooked(x, m.loss, NULL, log_hook, &l), 0);
        assert_int_equal(l.n, 3);
        assert_int_equal(l.seen[0], m.w2);
        assert_int_equal(l.seen[1], m.b1);
        assert_int_equal(l.seen[2], m.w1);
        /* stopped */
        l.n = 0;
        l.stop_at = m.b1;
        assert_int_equal(graph_forward_hooked(x, true, 0, log_hook, &l), 42);
        assert_int_equal(l.n, 2);
        graph_exec_free(x);
        graph_free(m.g);
        free(in);
}

/* w1 (4, 3), fc1's B with transB 0, in row blocks {0, 1, 3} (its K cut into rows [0, 1), [1, 3), [3, 4)),
 * then w2 made a Gemm's B with transB 1 in blocks: the hooks come per block, in order, forward and
 * backward, each block's before its rows are used; the loss and every gradient as unblocked (within
 * float rounding: the products are summed in another order); refused where it cannot be. */
static void test_param_blocks(void **state)
{
        (void)state;
        struct mlp m;
        mlp_build(&m);
        char err[256];
        struct graph_exec *x, *y;
        enum { B = 5 };
        assert_int_equal(graph_exec_new(m.g, B, &x, err, sizeof(err)), 0);
        assert_int_equal(graph_exec_new(m.g, B, &y, err, sizeof(err)), 0);
        float *in = gc_rand(B * 4, -1, 1, 19);
        const uint32_t rows[3] = { 0, 1, 3 };
        assert_int_equal(graph_exec_set_blocks(x, m.w1, 3, rows), 0);
        assert_int_equal(graph_exec_set_blocks(x, m.w2, 2, rows), -EOPNOTSUPP); /* a MatMul's */
        assert_int_equal(graph_exec_set_blocks(x, m.b1, 2, rows), -EOPNOTSUPP); /* rank 1 */
        const uint32_t bad[2] = { 0, 4 };
        assert_int_equal(graph_exec_set_blocks(x, m.w1, 2, bad), -EINVAL); /* past the rows */
        for (int e = 0; e < 2; e++) {
                struct graph_exec *xe = e ? y : x;
                assert_int_equal(graph_set_input(xe, m.x, in, B), 0);
        }
        struct hook_log l = { .x = x, .m = &m, .stop_at = -1 };
        assert_int_equal(graph_forward_hooked(x, true, 0, log_hook, &l), 0);
        assert_int_equal(graph_forward(y, true, 0), 0);
        /* b1 by fc1's own call (before its kernel), then w1's three blocks from inside it, then w2 */
        assert_int_equal(l.n, 5);
        assert_int_equal(l.seen[0], m.b1);
        for (uint32_t b = 0; b < 3; b++) {
                assert_int_equal(l.seen[1 + b], m.w1);
                assert_int_equal(l.block[1 + b], b);
        }
        assert_int_equal(l.seen[4], m.w2);
        const float *lx = graph_value(x, m.loss, NULL), *ly = graph_value(y, m.loss, NULL);
        assert_float_equal(lx[0], ly[0], 1e-5 * fmax(1, fabs(ly[0])));
        l.n = 0;
        assert_int_equal(graph_backward_hooked(x, m.loss, NULL, log_hook, &l), 0);
        assert_int_equal(graph_backward(y, m.loss, NULL), 0);
        assert_int_equal(l.n, 5); /* w2, then fc1's: w1's blocks from inside it, b1 after it */
        assert_int_equal(l.seen[0], m.w2);
        for (uint32_t b = 0; b < 3; b++) {
                assert_int_equal(l.seen[1 + b], m.w1);
                assert_int_equal(l.block[1 + b], b);
        }
        assert_int_equal(l.seen[4], m.b1);
        const float *gx = graph_exec_grads(x), *gy = graph_exec_grads(y);
        for (size_t i = 0; i < m.g->n_params; i++)
                assert_float_equal(gx[i], gy[i], 1e-5 * fmax(1, fabs(gy[i])));
        /* a hook that stops inside the blocks stops the pass with its value */
        l.n = 0;
        l.stop_at = m.w1;
        assert_int_equal(graph_forward_hooked(x, true, 0, log_hook, &l), 42);
        assert_int_equal(l.n, 2);
        /* whole again: one call, block 0 */
        assert_int_equal(graph_exec_set_blocks(x, m.w1, 1, NULL), 0);
        l.n = 0;
        l.stop_at = -1;
        assert_int_equal(graph_forward_hooked(x, true, 0, log_hook, &l), 0);
        assert_int_equal(l.n, 3);
        graph_exec_free(x);
        graph_exec_free(y);
        graph_free(m.g);
        free(in);
}

/* fc (x (B, 4) by w (3, 4), transB 1, B (1, 3)) in two blocks of w's rows (outputs [0, 2), [2, 3)) and
 * whole, forward and backward alike. */
static void test_param_blocks_transb(void **state)
{
        (void)state;
        char err[512] = "";
        struct graph *g = graph_new();
        struct graph_shape xs = GC_SHAPE(GRAPH_BATCH, 4), ws = GC_SHAPE(3, 4), bs = GC_SHAPE(3);
        float *w = gc_rand(12, -1, 1, 31), *b = gc_rand(3, -1, 1, 32);
        int32_t in[3] = { graph_add_tensor(g, "x", GT_INPUT, GDT_F32, &xs, NULL),
                          graph_add_tensor(g, "w", GT_PARAM, GDT_F32, &ws, w),
                          graph_add_tensor(g, "b", GT_PARAM, GDT_F32, &bs, b) };
        struct graph_attrs a;
        graph_attrs_default(&a);
        a.trans_b = 1;
        a.alpha = 0.5f;
        const char *o[1] = { "y" };
        assert_true(graph_add_node(g, GOP_GEMM, "fc", in, 3, o, 1, &a) >= 0);
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        enum { B = 4 };
        struct graph_exec *x, *y;
        assert_int_equal(graph_exec_new(g, B, &x, err, sizeof(err)), 0);
        assert_int_equal(graph_exec_new(g, B, &y, err, sizeof(err)), 0);
        const uint32_t rows[2] = { 0, 2 };
        assert_int_equal(graph_exec_set_blocks(x, in[1], 2, rows), 0);
        float *xin = gc_rand(B * 4, -1, 1, 33), *dy = gc_rand(B * 3, -1, 1, 34);
        int32_t yt = graph_find(g, "y");
        for (int e = 0; e < 2; e++) {
                struct graph_exec *xe = e ? y : x;
                assert_int_equal(graph_set_input(xe, in[0], xin, B), 0);
                assert_int_equal(graph_forward(xe, true, 0), 0);
                assert_int_equal(graph_backward(xe, yt, dy), 0);
        }
        const float *vx = graph_value(x, yt, NULL), *vy = graph_value(y, yt, NULL);
        for (int i = 0; i < B * 3; i++)
                assert_float_equal(vx[i], vy[i], 1e-6);
        const float *gx = graph_exec_grads(x), *gy = graph_exec_grads(y);
        for (size_t i = 0; i < g->n_params; i++)
                assert_float_equal(gx[i], gy[i], 1e-6);
        graph_exec_free(x);
        graph_exec_free(y);
        graph_free(g);
        free(w), free(b), free(xin), free(dy);
}

/* Gradients a node's backward sets whole rather than adds to (a tensor read once, by Gemm or Relu: h, w1,
 * b1 here) are never stale: after a backward from the loss, a backward from h (seeded with ones) gives
 * d(sum h)/dw1 = x^T 1 and d/db1 = B, and nothing of the loss's, and the loss's again is what it was. */
static void test_set_gradients_not_stale(void **state)
{
        (void)state;
        struct mlp m;
        mlp_build(&m);
        struct graph *g = m.g;
        char err[256];
        struct graph_exec *x;
        enum { B = 5 };
        assert_int_equal(graph_exec_new(g, B, &x, err, sizeof(err)), 0);
        float *in = gc_rand(B * 4, -1, 1, 77), first[21];
        assert_int_equal(graph_set_input(x, m.x, in, B), 0);
        assert_int_equal(graph_forward(x, true, 0), 0);
        assert_int_equal(graph_backward(x, m.loss, NULL), 0);
        memcpy(first, graph_exec_grads(x), sizeof(first));
        int32_t h = graph_find(g, "h");
        assert_int_equal(graph_backward(x, h, NULL), 0);
        const float *gr = graph_exec_grads(x);
        for (int k = 0; k < 4; k++)
                for (int j = 0; j < 3; j++) {
                        double s = 0;
                        for (int b = 0; b < B; b++)
                                s += in[b * 4 + k];
                        assert_float_equal(gr[k * 3 + j], s, 1e-5);
                }
        for (int j = 0; j < 3; j++)
                assert_float_equal(gr[12 + j], B, 1e-6);
        for (int i = 15; i < 21; i++)
                assert_float_equal(gr[i], 0, 0); /* w2 is downstream of h */
        assert_int_equal(graph_backward(x, m.loss, NULL), 0);
        assert_memory_equal(graph_exec_grads(x), first, sizeof(first));
        free(in);
        graph_exec_free(x);
        graph_free(g);
}

/* A tensor used twice: its gradient is the sum of both uses' (d(p*p)/dp = 2p). */
static void test_fan_in(void **state)
{
        float pv[3] = { 0.5f, -2.0f, 3.0f };
        struct gc_input in[2] = { { "p", GDT_F32, GC_SHAPE(3), pv }, { "p2", GDT_F32, GC_SHAPE(3), pv } };
        struct gc_result r;
        /* Mul(p, p2) with two parameters checks the binary path; the same tensor twice needs a graph by hand */
        assert_int_equal(gc_check(GOP_MUL, NULL, in, 2, 1, true, NULL, 1e-3, &r), 0);
        assert_true(r.bwd_max_rel <= 1e-3);

        char err[256];
        struct graph *g = graph_new();
        struct graph_shape s = GC_SHAPE(3);
        int32_t p = graph_add_tensor(g, "p", GT_PARAM, GDT_F32, &s, pv);
        int32_t ins[2] = { p, p };
        const char *out[1] = { "y" };
        assert_true(graph_add_node(g, GOP_MUL, "sq", ins, 2, out, 1, NULL) >= 0);
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        struct graph_exec *x;
        assert_int_equal(graph_exec_new(g, 1, &x, err, sizeof(err)), 0);
        assert_int_equal(graph_forward(x, true, 0), 0);
        assert_int_equal(graph_backward(x, graph_find(g, "y"), NULL), 0);
        for (int i = 0; i < 3; i++)
                assert_float_equal(graph_exec_grads(x)[i], 2 * pv[i], 1e-6);
        /* backward again: gradients are recomputed, not accumulated across calls */
        assert_int_equal(graph_backward(x, graph_find(g, "y"), NULL), 0);
        for (int i = 0; i < 3; i++)
                assert_float_equal(graph_exec_grads(x)[i], 2 * pv[i], 1e-6);
        graph_exec_free(x);
        graph_free(g);
}

static void test_op_names(void **state)
{
        for (int i = 0; i < GOP__COUNT; i++)
                assert_int_equal(graph_op_by_name(graph_op_name((enum graph_op)i)), i);
        assert_int_equal(graph_op_by_name("LSTM"), -ENOENT);
        assert_int_equal(graph_op_by_name("gemm"), -ENOENT); /* ONNX's names are case-sensitive */
}

/* The CPU backend with host_memory false: everything a device exec does (alloc, upload, download,
 * memset0, the staging of graph_value_host) goes through the backend table, and the memory is still the
 * host's, so the CPU kernels run on it. */
struct posing {
        struct backend be;
        struct backend_ops ops;
};

static void pose_as_device(struct backend *cpu, struct posing *p)
{
        p->ops = *cpu->ops;
        p->ops.name = "posing";
        p->ops.host_memory = false;
        p->be.ops = &p->ops;
        p->be.ctx = cpu->ctx;
}

static void test_device_exec_matches_host(void **state)
{
        struct backend *cpu;
        struct posing dev;
        char err[256] = "";
        int cases = 0;
        assert_int_equal(backend_cpu_new(1, &cpu), 0);
        pose_as_device(cpu, &dev);
        for (int op = 0; op < GOP__COUNT; op++)
                for (int v = 0; v < GCASE_VARIANTS; v++) {
                        struct graph *g = NULL;
                        int r = gcase_build((enum graph_op)op, v, &g, err, sizeof(err));
                        if (r == -ENOENT && v > 0)
                                break;
                        if (r < 0)
                                fail_msg("%s variant %d: no case or it does not build (%d): %s",
                                         graph_op_name((enum graph_op)op), v, r, err);
                        cases++;
                        for (int training = 0; training < 2; training++) {
                                struct gcase_out h, d;
                                if (gcase_run(g, NULL, 3, training, &h, err, sizeof(err)) < 0 ||
                                    gcase_run(g, &dev.be, 3, training, &d, err, sizeof(err)) < 0)
                                        fail_msg("%s variant %d: %s", graph_op_name((enum graph_op)op), v, err);
                                assert_int_equal(h.ny, d.ny);
                                assert_memory_equal(h.y, d.y, sizeof(float) * h.ny);
                                assert_int_equal(h.n_params, d.n_params);
                                assert_memory_equal(h.grads, d.grads, sizeof(float) * h.n_params);
                                assert_int_equal(h.n_dx, d.n_dx);
                                for (uint32_t i = 0; i < h.n_dx; i++)
                                        assert_memory_equal(h.dx[i], d.dx[i], sizeof(float) * h.ndx[i]);
                                gcase_out_free(&h);
                                gcase_out_free(&d);
                        }
                        graph_free(g);
                }
        printf("  %d cases over %d ops, host and device memory bit for bit equal\n", cases, GOP__COUNT);
        /* a device backend without graph kernels computes no graph */
        struct graph *g;
        assert_int_equal(gcase_build(GOP_RELU, 0, &g, err, sizeof(err)), 0);
        struct graph_exec *x;
        dev.ops.graph = NULL;
        assert_int_equal(graph_exec_new_on(g, 2, &dev.be, &x, err, sizeof(err)), -EOPNOTSUPP);
        assert_non_null(strstr(err, "computes no graph"));
        graph_free(g);
        backend_free(cpu);
}

UNIT_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_device_exec_matches_host), cmocka_unit_test(test_build_errors), cmocka_unit_test(test_finalize_errors),
               cmocka_unit_test(test_set_gradients_not_stale), cmocka_unit_test(test_param_hooks), cmocka_unit_test(test_param_blocks),
               cmocka_unit_test(test_param_blocks_transb),
               cmocka_unit_test(test_mlp), cmocka_unit_test(test_fan_in), cmocka_unit_test(test_op_names))
