/* The graph engine's image and normalization ops (graph_k_conv.c): Conv, MaxPool, AveragePool,
 * GlobalAveragePool, BatchNormalization, LayerNormalization, each forward against a plain loop computed
 * here and backward against finite differences (graph_check.h); Conv's chunked im2col also against a
 * plain backward at sizes finite differences would take too long over, its direct path (graph_k_dconv.c)
 * likewise; the batch kept symbolic; and the attributes refused, in graph_finalize's words. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "graph-internal.h"
#include "graph.h"
#include "graph_check.h"
#include "unit.h"

/* The bound on a forward's error: 1e-5 of the output's scale (its largest magnitude, at least 1). */
static double fwd_tol(const float *ref, size_t n)
{
        double m = 1;
        for (size_t i = 0; i < n; i++)
                m = fmax(m, fabs((double)ref[i]));
        return 1e-5 * m;
}

static void expect_ok(int rc, const struct gc_result *r, const float *ref, size_t n_ref, const char *what)
{
        print_message("%s: fwd_max_abs %.3g (bound %.3g), bwd_max_rel %.3g over %zu\n", what, r->fwd_max_abs,
                      ref ? fwd_tol(ref, n_ref) : 0.0, r->bwd_max_rel, r->n_checked);
        if (rc != 0 || r->msg[0])
                print_error("%s: rc %d: %s\n", what, rc, r->msg);
        assert_int_equal(rc, 0);
        if (ref)
                assert_true(r->fwd_max_abs <= fwd_tol(ref, n_ref));
}

/* ---- Conv ---- */

struct cg {
        int N, C, H, W, M, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr;
        int OH, OW;
};

static void cg_init(struct cg *c)
{
        c->OH = (c->H + c->pt + c->pb - ((c->kh - 1) * c->dh + 1)) / c->sh + 1;
        c->OW = (c->W + c->pl + c->pr - ((c->kw - 1) * c->dw + 1)) / c->sw + 1;
}

static struct graph_attrs cg_attrs(const struct cg *c)
{
        struct graph_attrs a;
        graph_attrs_default(&a);
        a.n_pads = 4;
        a.pads[0] = c->pt, a.pads[1] = c->pl, a.pads[2] = c->pb, a.pads[3] = c->pr;
        a.n_strides = 2;
        a.strides[0] = c->sh, a.strides[1] = c->sw;
        a.n_dilations = 2;
        a.dilations[0] = c->dh, a.dilations[1] = c->dw;
        return a;
}

/* the input position of output (oy, ox) under kernel offset (ky, kx), or -1 in the padding */
static long cg_at(const struct cg *c, int oy, int ox, int ky, int kx)
{
        int iy = oy * c->sh - c->pt + ky * c->dh, ix = ox * c->sw - c->pl + kx * c->dw;
        return iy < 0 || iy >= c->H || ix < 0 || ix >= c->W ? -1 : (long)iy * c->W + ix;
}

static void ref_conv(const struct cg *c, const float *x, const float *w, const float *b, float *y)
{
        for (int n = 0; n < c->N; n++)
                for (int m = 0; m < c->M; m++)
                        for (int oy = 0; oy < c->OH; oy++)
                                for (int ox = 0; ox < c->OW; ox++) {
                                        double s = b ? b[m] : 0;
                                        for (int ci = 0; ci < c->C; ci++)
                                                for (int ky = 0; ky < c->kh; ky++)
                                                        for (int kx = 0; kx < c->kw; kx++) {
                                                                long at = cg_at(c, oy, ox, ky, kx);
                                                                long xi = ((long)n * c->C + ci) * c->H * c->W + at;
                                                                long wi = ((m * c->C + ci) * c->kh + ky) * c->kw + kx;
                                                                if (at >= 0)
                                                                        s += (double)x[xi] * w[wi];
                                                        }
                                        y[(((long)n * c->M + m) * c->OH + oy) * c->OW + ox] = (float)s;
                                }
}

/* The plain backward: dX, dW, dB (each zeroed first) from dY. */
static void ref_conv_bwd(const struct cg *c, const float *x, const float *w, const float *dy, double *dx, double *dw,
                         double *db)
{
        memset(dx, 0, sizeof(double) * c->N * c->C * c->H * c->W);
        memset(dw, 0, sizeof(double) * c->M * c->C * c->kh * c->kw);
        memset(db, 0, sizeof(double) * c->M);
        for (int n = 0; n < c->N; n++)
                for (int m = 0; m < c->M; m++)
                        for (int oy = 0; oy < c->OH; oy++)
                                for (int ox = 0; ox < c->OW; ox++) {
                                        double d = dy[(((long)n * c->M + m) * c->OH + oy) * c->OW + ox];
                                        db[m] += d;
                                        for (int ci = 0; ci < c->C; ci++)
                                                for (int ky = 0; ky < c->kh; ky++)
                                                        for (int kx = 0; kx < c->kw; kx++) {
                                                                long at = cg_at(c, oy, ox, ky, kx);
                                                                if (at < 0)
                                                                        continue;
                                                                long xi = ((long)n * c->C + ci) * c->H * c->W + at;
                                                                long wi = ((m * c->C + ci) * c->kh + ky) * c->kw + kx;
                                                                dx[xi] += d * w[wi];
                                                                dw[wi] += d * x[xi];
                                                        }
                                }
}

/* Conv c through gc_check (X, W and, with bias, B as parameters), forward against ref_conv. The loss is
 * linear in each single parameter, so central differences have no truncation error at any step: h 0.1
 * keeps float32's rounding of Y (about 1e-5 of the difference at h 1e-2, near the 1e-3 bound) small. */
static void conv_case(struct cg *c, bool bias, bool kernel_attr, double h, const char *what)
{
        cg_init(c);
        size_t nx = (size_t)c->N * c->C * c->H * c->W, nw = (size_t)c->M * c->C * c->kh * c->kw;
        size_t ny = (size_t)c->N * c->M * c->OH * c->OW;
        float *x = gc_rand(nx, -1, 1, 11), *w = gc_rand(nw, -1, 1, 12), *b = gc_rand(c->M, -1, 1, 13);
        float *ref = calloc(ny, sizeof(float));
        ref_conv(c, x, w, bias ? b : NULL, ref);
        struct graph_attrs a = cg_attrs(c);
        if (kernel_attr) {
                a.n_kernel = 2;
                a.kernel[0] = c->kh, a.kernel[1] = c->kw;
        }
        struct gc_input in[3] = {
                { "X", GDT_F32, GC_SHAPE(c->N, c->C, c->H, c->W), x },
                { "W", GDT_F32, GC_SHAPE(c->M, c->C, c->kh, c->kw), w },
                { bias ? "B" : NULL, GDT_F32, GC_SHAPE(c->M), b },
        };
        struct gc_result r;
        int rc = gc_check(GOP_CONV, &a, in, 3, 1, true, ref, h, &r);
        expect_ok(rc, &r, ref, ny, what);
        assert_true(r.bwd_max_rel <= 1e-3);
        assert_int_equal(r.n_checked, nx + nw + (bias ? (size_t)c->M : 0));
        free(x), free(w), free(b), free(ref);
}

static void test_conv_pads_strides(void **state)
{
        /* asymmetric pads, strides 2 both ways, a bias */
        struct cg c = { .N = 2, .C = 3, .H = 7, .W = 6, .M = 4, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .dh = 1, .dw = 1,
                        .pt = 1, .pl = 0, .pb = 2, .pr = 1 };
        conv_case(&c, true, true, 1e-1, "conv pads 1,0,2,1 strides 2");
}

static void test_conv_dilations(void **state)
{
        /* dilations 2, a non-square kernel, no bias */
        struct cg c = { .N = 2, .C = 2, .H = 8, .W = 7, .M = 3, .kh = 3, .kw = 2, .sh = 1, .sw = 1, .dh = 2, .dw = 2,
                        .pt = 2, .pl = 1, .pb = 1, .pr = 2 };
        conv_case(&c, false, false, 1e-1, "conv dilations 2, no bias");
        /* strides and dilations mixed, no pads */
        struct cg d = { .N = 1, .C = 2, .H = 9, .W = 8, .M = 2, .kh = 2, .kw = 3, .sh = 2, .sw = 1, .dh = 1, .dw = 2,
                        .pt = 0, .pl = 0, .pb = 0, .pr = 0 };
        conv_case(&d, true, false, 1e-1, "conv strides 2,1 dilations 1,2");
        /* stride 1 with the width kept (OW == W: the kernels' flat path, a plane per copy) but not the
         * height, dilated, asymmetric pads; and the common 3x3 "same" */
        struct cg e = { .N = 2, .C = 2, .H = 9, .W = 7, .M = 3, .kh = 3, .kw = 3, .sh = 1, .sw = 1, .dh = 2, .dw = 2,
                        .pt = 1, .pl = 3, .pb = 0, .pr = 1 };
        conv_case(&e, true, true, 1e-1, "conv flat rows, dilations 2, pads 1,3,0,1");
        struct cg f = { .N = 2, .C = 3, .H = 5, .W = 6, .M = 2, .kh = 3, .kw = 3, .sh = 1, .sw = 1, .dh = 1, .dw = 1,
                        .pt = 1, .pl = 1, .pb = 1, .pr = 1 };
        conv_case(&f, true, true, 1e-1, "conv 3x3 same");
}

/* Conv c through an exec, forward and all three gradients against the plain loops. shared: X feeds two
 * convolutions (W and a second W2), Y their sum, so that dX is added to rather than set. */
static void conv_vs_plain(struct cg *c, bool shared, unsigned seed, const char *what)
{
        cg_init(c);
        size_t nx = (size_t)c->N * c->C * c->H * c->W, nw = (size_t)c->M * c->C * c->kh * c->kw;
        size_t ny = (size_t)c->N * c->M * c->OH * c->OW;
        float *x = gc_rand(nx, -1, 1, seed), *w = gc_rand(nw, -1, 1, seed + 1), *b = gc_rand(c->M, -1, 1, seed + 2);
        float *w2 = gc_rand(nw, -1, 1, seed + 3), *dy = gc_rand(ny, -1, 1, seed + 4);
        float *ref = calloc(ny, sizeof(float)), *ref2 = calloc(ny, sizeof(float));
        double *dx = malloc(sizeof(double) * nx), *dw = malloc(sizeof(double) * nw);
        double *dx2 = calloc(nx, sizeof(double)), *dw2 = calloc(nw, sizeof(double));
        double *db = malloc(sizeof(double) * c->M), *db2 = calloc((size_t)c->M, sizeof(double));
        ref_conv(c, x, w, b, ref);
        ref_conv_bwd(c, x, w, dy, dx, dw, db);
        if (shared) {
                ref_conv(c, x, w2, NULL, ref2);
                ref_conv_bwd(c, x, w2, dy, dx2, dw2, db2);
                for (size_t i = 0; i < ny; i++)
                        ref[i] += ref2[i];
                for (size_t i = 0; i < nx; i++)
                        dx[i] += dx2[i];
        }

        struct graph *g = graph_new();
        struct graph_shape sx = GC_SHAPE(c->N, c->C, c->H, c->W), sw = GC_SHAPE(c->M, c->C, c->kh, c->kw);
        struct graph_shape sb = GC_SHAPE(c->M);
        int32_t in[3] = { graph_add_tensor(g, "X", GT_PARAM, GDT_F32, &sx, x),
                          graph_add_tensor(g, "W", GT_PARAM, GDT_F32, &sw, w),
                          graph_add_tensor(g, "B", GT_PARAM, GDT_F32, &sb, b) };
        int32_t w2t = graph_add_tensor(g, "W2", GT_PARAM, GDT_F32, &sw, w2);
        struct graph_attrs a = cg_attrs(c);
        const char *outs[1] = { shared ? "y1" : "y" };
        assert_true(graph_add_node(g, GOP_CONV, "conv", in, 3, outs, 1, &a) >= 0);
        if (shared) {
                const char *o2[1] = { "y2" }, *o3[1] = { "y" };
                int32_t in2[2] = { in[0], w2t };
                assert_true(graph_add_node(g, GOP_CONV, "conv2", in2, 2, o2, 1, &a) >= 0);
                int32_t sum[2] = { graph_find(g, "y1"), graph_find(g, "y2") };
                struct graph_attrs none;
                graph_attrs_default(&none);
                assert_true(graph_add_node(g, GOP_ADD, "add", sum, 2, o3, 1, &none) >= 0);
        }
        char err[512] = "";
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        struct graph_exec *xe = NULL;
        assert_int_equal(graph_exec_new(g, 1, &xe, err, sizeof(err)), 0);
        assert_int_equal(graph_forward(xe, true, 1), 0);
        int32_t y = graph_find(g, "y");
        size_t n = 0;
        const float *v = graph_value(xe, y, &n);
        assert_int_equal(n, ny);
        double fe = 0;
        for (size_t i = 0; i < ny; i++)
                fe = fmax(fe, fabs((double)v[i] - ref[i]));
        assert_int_equal(graph_backward(xe, y, dy), 0);
        const float *gr = graph_exec_grads(xe);
        double dmax = 1, be = 0;
        for (size_t i = 0; i < nx; i++)
                dmax = fmax(dmax, fabs(dx[i]));
        for (size_t i = 0; i < nw; i++)
                dmax = fmax(dmax, fmax(fabs(dw[i]), shared ? fabs(dw2[i]) : 0.0));
        for (int i = 0; i < c->M; i++)
                dmax = fmax(dmax, fabs(db[i]));
        for (size_t i = 0; i < nx; i++)
                be = fmax(be, fabs(gr[g->tensors[in[0]].param_offset + i] - dx[i]));
        for (size_t i = 0; i < nw; i++)
                be = fmax(be, fabs(gr[g->tensors[in[1]].param_offset + i] - dw[i]));
        for (size_t i = 0; shared && i < nw; i++)
                be = fmax(be, fabs(gr[g->tensors[w2t].param_offset + i] - dw2[i]));
        for (int i = 0; i < c->M; i++)
                be = fmax(be, fabs(gr[g->tensors[in[2]].param_offset + i] - db[i]));
        print_message("%s: fwd_max_abs %.3g (bound %.3g), bwd max abs %.3g of scale %.3g\n", what, fe,
                      fwd_tol(ref, ny), be, dmax);
        assert_true(fe <= fwd_tol(ref, ny));
        assert_true(be <= 1e-5 * dmax);
        graph_exec_free(xe);
        graph_free(g);
        free(x), free(w), free(b), free(w2), free(dy), free(ref), free(ref2), free(dx), free(dw), free(dx2), free(dw2),
                free(db), free(db2);
}

#define CG1(n, ci, h, w_, m, k, p0, p1, p2, p3)                                                                \
        { .N = (n), .C = (ci), .H = (h), .W = (w_), .M = (m), .kh = (k), .kw = (k), .sh = 1, .sw = 1, .dh = 1, .dw = 1, \
          .pt = (p0), .pl = (p1), .pb = (p2), .pr = (p3) }

/* Stride 1 at sizes finite differences would take too long over, each way of both kernels:
 * - the im2col chunk two examples with one left over (3 examples), and one example (the product straight
 *   into Y), where one example's planes are past a core's L2 (im2col + sgemm);
 * - graph_k_dconv.c's direct convolution: output channels in tiles of 4 and one left over, (channel,
 *   offset) pairs likewise, asymmetric pads up to the kernel's size - 1, 1x1 and 5x5 kernels, a plane
 *   narrower than a vector; and pads past the kernel, which it refuses (im2col again);
 * each with X read by this convolution alone (dX set) and by two (dX added to). */
static void test_conv_stride1(void **state)
{
        struct cg cs[] = {
                CG1(3, 10, 34, 34, 4, 3, 1, 1, 1, 1),        /* direct */
                CG1(2, 16, 50, 49, 5, 3, 1, 2, 0, 1),        /* direct, pads 1,2,0,1 */
                CG1(2, 3, 6, 5, 9, 5, 2, 1, 4, 0),           /* direct 5x5, pads 2,1,4,0 */
                CG1(2, 7, 9, 11, 6, 1, 0, 0, 0, 0),          /* direct 1x1 */
                CG1(2, 2, 3, 2, 3, 3, 2, 2, 2, 2),           /* a plane smaller than a vector */
                CG1(1, 3, 8, 8, 4, 3, 3, 0, 1, 1),           /* pads past the kernel: im2col */
                CG1(1, 72, 64, 64, 2, 3, 1, 1, 1, 1),        /* past L2: im2col, one example */
                CG1(3, 4, 40, 40, 3, 3, 1, 1, 1, 1),         /* direct, 3 examples */
        };
        const bool direct[] = { true, true, true, true, true, false, false, true }; /* the geometry allows it */
        for (size_t t = 0; t < sizeof(cs) / sizeof(cs[0]); t++) {
                struct cg *c = &cs[t];
                struct gk_dconv d;
                const int64_t pads[4] = { c->pt, c->pl, c->pb, c->pr };
                assert_int_equal(gk_dconv_geometry(&d, c->C, c->H, c->W, c->M, c->kh, c->kw, 1, 1, 1, 1, pads) == 0,
                                 direct[t]);
                /* each path where it can run: direct (forced), and im2col (forced) */
                for (int path = direct[t] ? 0 : 1; path < 2; path++)
                        for (int shared = 0; shared < 2; shared++) {
                                char what[80];
                                snprintf(what, sizeof(what), "conv stride 1 case %zu, %s%s", t,
                                         path ? "im2col" : "direct", shared ? ", X shared" : "");
                                gk_dconv_mode = path ? GK_DCONV_NEVER : GK_DCONV_ALWAYS;
                                conv_vs_plain(c, shared, 21 + (unsigned)t * 10, what);
                                gk_dconv_mode = GK_DCONV_AUTO;
                        }
        }
}

/* X fed as a batch: the output keeps the symbolic batch, and the kernels run at two batch sizes under one
 * exec (its scratch sized at the larger). */
static void test_conv_batch(void **state)
{
        struct cg c = { .N = 4, .C = 2, .H = 6, .W = 5, .M = 3, .kh = 3, .kw = 3, .sh = 2, .sw = 1, .dh = 1, .dw = 1,
                        .pt = 1, .pl = 1, .pb = 1, .pr = 1 };
        cg_init(&c);
        size_t nx = (size_t)c.N * c.C * c.H * c.W, nw = (size_t)c.M * c.C * c.kh * c.kw;
        float *x = gc_rand(nx, -1, 1, 31), *w = gc_rand(nw, -1, 1, 32), *b = gc_rand(c.M, -1, 1, 33);
        struct graph *g = graph_new();
        struct graph_shape sx = GC_SHAPE(GRAPH_BATCH, c.C, c.H, c.W), sw = GC_SHAPE(c.M, c.C, c.kh, c.kw);
        struct graph_shape sb = GC_SHAPE(c.M);
        int32_t in[3] = { graph_add_tensor(g, "X", GT_INPUT, GDT_F32, &sx, NULL),
                          graph_add_tensor(g, "W", GT_PARAM, GDT_F32, &sw, w),
                          graph_add_tensor(g, "B", GT_PARAM, GDT_F32, &sb, b) };
        const char *outs[1] = { "y" };
        struct graph_attrs a = cg_attrs(&c);
        assert_true(graph_add_node(g, GOP_CONV, "conv", in, 3, outs, 1, &a) >= 0);
        char err[512] = "";
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        int32_t y = graph_find(g, "y");
        const struct graph_shape *ys = &g->tensors[y].shape;
        assert_int_equal(ys->rank, 4);
        assert_int_equal(ys->dims[0], GRAPH_BATCH);
        assert_int_equal(ys->dims[1], c.M);
        assert_int_equal(ys->dims[2], c.OH);
        assert_int_equal(ys->dims[3], c.OW);
        struct graph_exec *xe = NULL;
        assert_int_equal(graph_exec_new(g, 4, &xe, err, sizeof(err)), 0);
        for (int B = 4; B >= 3; B--) {
                c.N = B;
                size_t ny = (size_t)B * c.M * c.OH * c.OW;
                float *ref = calloc(ny, sizeof(float)), *dy = gc_rand(ny, -1, 1, 34);
                double *dx = malloc(sizeof(double) * nx), *dw = malloc(sizeof(double) * nw), db[3];
                ref_conv(&c, x, w, b, ref);
                ref_conv_bwd(&c, x, w, dy, dx, dw, db);
                assert_int_equal(graph_set_input(xe, in[0], x, (uint32_t)B), 0);
                assert_int_equal(graph_forward(xe, true, 1), 0);
                size_t n = 0;
                const float *v = graph_value(xe, y, &n);
                assert_int_equal(n, ny);
                for (size_t i = 0; i < ny; i++)
                        assert_true(fabs(v[i] - ref[i]) <= fwd_tol(ref, ny));
                assert_int_equal(graph_backward(xe, y, dy), 0);
                const float *gw = graph_exec_grads(xe) + g->tensors[in[1]].param_offset;
                const float *gb = graph_exec_grads(xe) + g->tensors[in[2]].param_offset;
                for (size_t i = 0; i < nw; i++)
                        assert_true(fabs(gw[i] - dw[i]) <= 1e-5 * fmax(1, fabs(dw[i])));
                for (int i = 0; i < c.M; i++)
                        assert_true(fabs(gb[i] - db[i]) <= 1e-5 * fmax(1, fabs(db[i])));
                free(ref), free(dy), free(dx), free(dw);
        }
        graph_exec_free(xe);
        graph_free(g);
        free(x), free(w), free(b);
}

/* ---- MaxPool, AveragePool ---- */

/* Distinct values 0.05 apart, shuffled: no window holds two within a finite difference's step. */
static float *distinct(size_t n, unsigned seed)
{
        float *v = malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++)
                v[i] = (float)(((double)i - (double)n / 2) * 0.05);
        for (size_t i = n; i-- > 1;) {
                size_t j = (size_t)(gc_frand(&seed) * (double)(i + 1));
                float t = v[i];
                v[i] = v[j > i ? i : j];
                v[j > i ? i : j] = t;
        }
        return v;
}

static void ref_pool(bool max, bool cip, const struct cg *c, const float *x, float *y)
{
        for (int p = 0; p < c->N * c->C; p++)
                for (int oy = 0; oy < c->OH; oy++)
                        for (int ox = 0; ox < c->OW; ox++) {
                                double s = 0, best = -INFINITY;
                                int cnt = 0;
                                for (int ky = 0; ky < c->kh; ky++)
                                        for (int kx = 0; kx < c->kw; kx++) {
                                                long at = cg_at(c, oy, ox, ky, kx);
                                                if (at < 0)
                                                        continue;
                                                double v = x[(long)p * c->H * c->W + at];
                                                s += v;
                                                best = fmax(best, v);
                                                cnt++;
                                        }
                                y[((long)p * c->OH + oy) * c->OW + ox] =
                                        (float)(max ? best : s / (cip ? c->kh * c->kw : cnt));
                        }
}

static void pool_case(enum graph_op op, int cip, struct cg *c, double h, const char *what)
{
        c->M = c->C, c->dh = c->dw = 1;
        cg_init(c);
        size_t nx = (size_t)c->N * c->C * c->H * c->W, ny = (size_t)c->N * c->C * c->OH * c->OW;
        float *x = op == GOP_MAXPOOL ? distinct(nx, 41) : gc_rand(nx, -1, 1, 41);
        float *ref = calloc(ny, sizeof(float));
        ref_pool(op == GOP_MAXPOOL, cip, c, x, ref);
        struct graph_attrs a = cg_attrs(c);
        a.n_dilations = 0;
        a.n_kernel = 2;
        a.kernel[0] = c->kh, a.kernel[1] = c->kw;
        a.count_include_pad = cip;
        struct gc_input in[1] = { { "X", GDT_F32, GC_SHAPE(c->N, c->C, c->H, c->W), x } };
        struct gc_result r;
        int rc = gc_check(op, &a, in, 1, 1, true, ref, h, &r);
        expect_ok(rc, &r, ref, ny, what);
        assert_true(r.bwd_max_rel <= 1e-3);
        assert_int_equal(r.n_checked, nx);
        free(x), free(ref);
}

static void test_maxpool(void **state)
{
        struct cg c = { .N = 2, .C = 3, .H = 7, .W = 8, .kh = 3, .kw = 2, .sh = 2, .sw = 2, .pt = 1, .pl = 1, .pb = 2,
                        .pr = 0 };
        pool_case(GOP_MAXPOOL, 0, &c, 1e-3, "maxpool 3x2 strides 2 pads 1,1,2,0");
        struct cg d = { .N = 1, .C = 2, .H = 6, .W = 5, .kh = 3, .kw = 3, .sh = 1, .sw = 2, .pt = 0, .pl = 1, .pb = 0,
                        .pr = 1 };
        pool_case(GOP_MAXPOOL, 0, &d, 1e-3, "maxpool 3x3 strides 1,2 overlapping");
        /* windows that tile the plane (kernel = stride, no pads: the kernels' direct path), a row and a
         * column left over */
        struct cg e = { .N = 2, .C = 2, .H = 5, .W = 7, .kh = 2, .kw = 2, .sh = 2, .sw = 2 };
        pool_case(GOP_MAXPOOL, 0, &e, 1e-3, "maxpool 2x2 tiles, a row and a column over");
        struct cg f = { .N = 1, .C = 3, .H = 6, .W = 6, .kh = 3, .kw = 2, .sh = 3, .sw = 2 };
        pool_case(GOP_MAXPOOL, 0, &f, 1e-3, "maxpool 3x2 tiles");
}

/* The tiled max pool writes its input's gradient whole when it is the one reader (graph_op_bwd_sets): a
 * gradient block full of NaN before the backward holds 1 at each window's maximum and 0 everywhere else,
 * the uncovered row and column too. */
static void test_maxpool_tiles_set(void **state)
{
        enum { H = 5, W = 7 };
        struct graph *g = graph_new();
        struct graph_shape sx = GC_SHAPE(1, 1, H, W);
        float *xv = distinct(H * W, 5);
        int32_t x = graph_add_tensor(g, "X", GT_PARAM, GDT_F32, &sx, xv);
        struct graph_attrs a;
        graph_attrs_default(&a);
        a.n_kernel = a.n_strides = 2;
        a.kernel[0] = a.kernel[1] = a.strides[0] = a.strides[1] = 2;
        const char *outs[1] = { "y" };
        assert_true(graph_add_node(g, GOP_MAXPOOL, "pool", &x, 1, outs, 1, &a) >= 0);
        g->loss = graph_find(g, "y");
        char err[256] = "";
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        struct graph_exec *xe = NULL;
        assert_int_equal(graph_exec_new(g, 1, &xe, err, sizeof(err)), 0);
        memset(graph_exec_grads(xe), 0xff, sizeof(float) * H * W);
        assert_int_equal(graph_forward(xe, true, 0), 0);
        assert_int_equal(graph_backward(xe, g->loss, NULL), 0);
        const float *gx = graph_exec_grads(xe);
        for (int oy = 0; oy < H / 2; oy++)
                for (int ox = 0; ox < W / 2; ox++) {
                        int best = oy * 2 * W + ox * 2;
                        for (int ky = 0; ky < 2; ky++)
                                for (int kx = 0; kx < 2; kx++)
                                        if (xv[(oy * 2 + ky) * W + ox * 2 + kx] > xv[best])
                                                best = (oy * 2 + ky) * W + ox * 2 + kx;
                        for (int ky = 0; ky < 2; ky++)
                                for (int kx = 0; kx < 2; kx++) {
                                        int i = (oy * 2 + ky) * W + ox * 2 + kx;
                                        assert_float_equal(gx[i], i == best ? 1.0f : 0.0f, 0);
                                }
                }
        for (int i = 0; i < W; i++)
                assert_float_equal(gx[(H - 1) * W + i], 0.0f, 0);
        for (int i = 0; i < H; i++)
                assert_float_equal(gx[i * W + W - 1], 0.0f, 0);
        graph_exec_free(xe);
        graph_free(g);
        free(xv);
}

/* Ties: the gradient goes to the window's first maximum in row-major order, once. */
static void test_maxpool_ties(void **state)
{
        float x[8] = { 1, 2, 2, 0, /* row 0 */ 2, 2, 0, 0 /* row 1 */ };
        struct graph *g = graph_new();
        struct graph_shape sx = GC_SHAPE(1, 1, 2, 4);
        int32_t in[1] = { graph_add_tensor(g, "X", GT_PARAM, GDT_F32, &sx, x) };
        const char *outs[1] = { "y" };
        struct graph_attrs a;
        graph_attrs_default(&a);
        a.n_kernel = 2;
        a.kernel[0] = 2, a.kernel[1] = 2;
        a.n_strides = 2;
        a.strides[0] = 2, a.strides[1] = 2;
        assert_true(graph_add_node(g, GOP_MAXPOOL, "mp", in, 1, outs, 1, &a) >= 0);
        char err[512] = "";
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        struct graph_exec *xe = NULL;
        assert_int_equal(graph_exec_new(g, 1, &xe, err, sizeof(err)), 0);
        assert_int_equal(graph_forward(xe, true, 1), 0);
        const float *v = graph_value(xe, graph_find(g, "y"), NULL);
        assert_float_equal(v[0], 2, 0);
        assert_float_equal(v[1], 2, 0);
        assert_int_equal(graph_backward(xe, graph_find(g, "y"), NULL), 0);
        const float *gr = graph_exec_grads(xe);
        const float want[8] = { 0, 1, 1, 0, 0, 0, 0, 0 };
        for (int i = 0; i < 8; i++)
                assert_float_equal(gr[i], want[i], 0);
        graph_exec_free(xe);
        graph_free(g);
}

static void test_avgpool(void **state)
{
        for (int cip = 0; cip <= 1; cip++) {
                struct cg c = { .N = 2, .C = 2, .H = 7, .W = 6, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .pt = 1, .pl = 2,
                                .pb = 2, .pr = 1 };
                pool_case(GOP_AVGPOOL, cip, &c, 1e-2,
                          cip ? "avgpool 3x3 strides 2 pads, count_include_pad 1"
                              : "avgpool 3x3 strides 2 pads, count_include_pad 0");
                struct cg d = { .N = 1, .C = 3, .H = 5, .W = 6, .kh = 2, .kw = 3, .sh = 1, .sw = 3, .pt = 1, .pl = 0,
                                .pb = 0, .pr = 2 };
                pool_case(GOP_AVGPOOL, cip, &d, 1e-2,
                          cip ? "avgpool 2x3 strides 1,3, count_include_pad 1"
                              : "avgpool 2x3 strides 1,3, count_include_pad 0");
        }
}

/* ---- GlobalAveragePool ---- */

static void test_gap(void **state)
{
        enum { N = 2, C = 3, H = 4, W = 5 };
        float *x = gc_rand(N * C * H * W, -1, 1, 51), ref[N * C];
        for (int p = 0; p < N * C; p++) {
                double s = 0;
                for (int i = 0; i < H * W; i++)
                        s += x[p * H * W + i];
                ref[p] = (float)(s / (H * W));
        }
        struct gc_input in[1] = { { "X", GDT_F32, GC_SHAPE(N, C, H, W), x } };
        struct gc_result r;
        int rc = gc_check(GOP_GLOBAL_AVGPOOL, NULL, in, 1, 1, true, ref, 1e-2, &r);
        expect_ok(rc, &r, ref, N * C, "globalaveragepool");
        assert_true(r.bwd_max_rel <= 1e-3);
        free(x);

        /* the output's shape, the batch kept */
        struct graph *g = graph_new();
        struct graph_shape sx = GC_SHAPE(GRAPH_BATCH, C, H, W);
        int32_t t[1] = { graph_add_tensor(g, "X", GT_INPUT, GDT_F32, &sx, NULL) };
        const char *outs[1] = { "y" };
        assert_true(graph_add_node(g, GOP_GLOBAL_AVGPOOL, "gap", t, 1, outs, 1, NULL) >= 0);
        char err[512] = "";
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        const struct graph_shape *ys = &g->tensors[graph_find(g, "y")].shape;
        assert_int_equal(ys->rank, 4);
        assert_int_equal(ys->dims[0], GRAPH_BATCH);
        assert_int_equal(ys->dims[1], C);
        assert_int_equal(ys->dims[2], 1);
        assert_int_equal(ys->dims[3], 1);
        graph_free(g);
}

/* ---- BatchNormalization ---- */

struct bn_case {
        int N, C, S;           /* X as (N, C, S) */
        struct graph_shape xs; /* its real shape */
        float *x, *scale, *bias, *mean, *var;
};

static void bn_init(struct bn_case *b, struct graph_shape xs)
{
        b->xs = xs;
        b->N = (int)xs.dims[0];
        b->C = (int)xs.dims[1];
        b->S = 1;
        for (uint32_t i = 2; i < xs.rank; i++)
                b->S *= (int)xs.dims[i];
        b->x = gc_rand((size_t)b->N * b->C * b->S, -2, 3, 61);
        b->scale = gc_rand(b->C, 0.2f, 0.8f, 62);
        b->bias = gc_rand(b->C, -0.5f, 0.5f, 63);
        b->mean = gc_rand(b->C, -0.5f, 0.5f, 64);
        b->var = gc_rand(b->C, 0.5f, 2.0f, 65);
}

static void bn_free(struct bn_case *b)
{
        free(b->x), free(b->scale), free(b->bias), free(b->mean), free(b->var);
}

/* y, and (training) the running mean and variance ONNX defines: the biased batch variance. */
static void ref_bn(const struct bn_case *b, bool training, double eps, double mom, float *y, float *rmean, float *rvar)
{
        for (int c = 0; c < b->C; c++) {
                double mu = b->mean[c], var = b->var[c];
                if (training) {
                        double s = 0, ss = 0, m = (double)b->N * b->S;
                        for (int n = 0; n < b->N; n++)
                                for (int i = 0; i < b->S; i++)
                                        s += b->x[((long)n * b->C + c) * b->S + i];
                        mu = s / m;
                        for (int n = 0; n < b->N; n++)
                                for (int i = 0; i < b->S; i++) {
                                        double d = b->x[((long)n * b->C + c) * b->S + i] - mu;
                                        ss += d * d;
                                }
                        var = ss / m;
                }
                rmean[c] = (float)(training ? b->mean[c] * mom + mu * (1 - mom) : b->mean[c]);
                rvar[c] = (float)(training ? b->var[c] * mom + var * (1 - mom) : b->var[c]);
                for (int n = 0; n < b->N; n++)
                        for (int i = 0; i < b->S; i++) {
                                long j = ((long)n * b->C + c) * b->S + i;
                                y[j] = (float)((b->x[j] - mu) / sqrt(var + eps) * b->scale[c] + b->bias[c]);
                        }
        }
}

/* Forward with Y alone, then with all three outputs, each against ref_bn. Training: the gradients of X,
 * scale and B through gc_check (input_mean and input_var get none, and have none numerically either).
 * Inference: the backward of fixed statistics, dX = scale / sqrt(var + eps) * dY, dscale = sum dY * xhat,
 * dB = sum dY, against those formulas with dY = 1. */
static void bn_run(struct bn_case *b, bool training, float eps, float mom, const char *what)
{
        size_t nx = (size_t)b->N * b->C * b->S;
        float *y = malloc(sizeof(float) * nx), *rm = malloc(sizeof(float) * b->C), *rv = malloc(sizeof(float) * b->C);
        ref_bn(b, training, eps, mom, y, rm, rv);
        struct graph_attrs a;
        graph_attrs_default(&a);
        a.epsilon = eps;
        a.momentum = mom;
        struct gc_input in[5] = {
                { "X", GDT_F32, b->xs, b->x },
                { "scale", GDT_F32, GC_SHAPE(b->C), b->scale },
                { "B", GDT_F32, GC_SHAPE(b->C), b->bias },
                { "input_mean", GDT_F32, GC_SHAPE(b->C), b->mean },
                { "input_var", GDT_F32, GC_SHAPE(b->C), b->var },
        };

        for (uint32_t n_out = 1; n_out <= 3; n_out += 2) {
                struct graph *g = graph_new();
                int32_t t[5];
                for (int i = 0; i < 5; i++)
                        t[i] = graph_add_tensor(g, in[i].name, GT_PARAM, GDT_F32, &in[i].shape, in[i].data);
                const char *outs[3] = { "y", "running_mean", "running_var" };
                assert_true(graph_add_node(g, GOP_BATCHNORM, "bn", t, 5, outs, n_out, &a) >= 0);
                char err[512] = "";
                assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
                struct graph_exec *xe = NULL;
                assert_int_equal(graph_exec_new(g, 1, &xe, err, sizeof(err)), 0);
                assert_int_equal(graph_forward(xe, training, 1), 0);
                int32_t ty = graph_find(g, "y");
                const float *vy = graph_value(xe, ty, NULL);
                double fe = 0, re = 0;
                for (size_t i = 0; i < nx; i++)
                        fe = fmax(fe, fabs((double)vy[i] - y[i]));
                if (n_out == 3) {
                        for (int i = 1; i < 3; i++) {
                                const struct graph_shape *rs = &g->tensors[graph_find(g, outs[i])].shape;
                                assert_int_equal(rs->rank, 1);
                                assert_int_equal(rs->dims[0], b->C);
                        }
                        const float *vm = graph_value(xe, graph_find(g, "running_mean"), NULL);
                        const float *vv = graph_value(xe, graph_find(g, "running_var"), NULL);
                        for (int c = 0; c < b->C; c++)
                                re = fmax(re, fmax(fabs((double)vm[c] - rm[c]), fabs((double)vv[c] - rv[c])));
                }
                print_message("%s, %u output(s): fwd_max_abs %.3g, running stats max abs %.3g\n", what, n_out, fe, re);
                assert_true(fe <= fwd_tol(y, nx));
                assert_true(re <= 1e-6);
                if (!training) {
                        assert_int_equal(graph_backward(xe, ty, NULL), 0);
                        const float *gr = graph_exec_grads(xe);
                        const float *gx = gr + g->tensors[t[0]].param_offset, *gs = gr + g->tensors[t[1]].param_offset;
                        const float *gb = gr + g->tensors[t[2]].param_offset;
                        for (int c = 0; c < b->C; c++) {
                                double is = 1 / sqrt((double)b->var[c] + eps), sx = 0;
                                for (int n = 0; n < b->N; n++)
                                        for (int i = 0; i < b->S; i++) {
                                                long j = ((long)n * b->C + c) * b->S + i;
                                                assert_float_equal(gx[j], b->scale[c] * is, 1e-6);
                                                sx += (b->x[j] - b->mean[c]) * is;
                                        }
                                assert_float_equal(gs[c], sx, 1e-5 * fmax(1, fabs(sx)));
                                assert_float_equal(gb[c], b->N * b->S, 0);
                                /* untouched: the statistics' gradients */
                                assert_float_equal(gr[g->tensors[t[3]].param_offset + c], 0, 0);
                                assert_float_equal(gr[g->tensors[t[4]].param_offset + c], 0, 0);
                        }
                }
                graph_exec_free(xe);
                graph_free(g);
        }

        if (training) {
                struct gc_result r;
                int rc = gc_check(GOP_BATCHNORM, &a, in, 5, 1, true, y, 5e-3, &r);
                expect_ok(rc, &r, y, nx, what);
                assert_true(r.bwd_max_rel <= 1e-3);
        }
        free(y), free(rm), free(rv);
}

static void test_batchnorm_training(void **state)
{
        struct bn_case b;
        bn_init(&b, GC_SHAPE(3, 4, 2, 3));
        bn_run(&b, true, 1e-5f, 0.9f, "batchnorm training (3,4,2,3)");
        bn_free(&b);
        bn_init(&b, GC_SHAPE(5, 3));
        bn_run(&b, true, 1e-2f, 0.7f, "batchnorm training (5,3) eps 1e-2 momentum 0.7");
        bn_free(&b);
}

static void test_batchnorm_eval(void **state)
{
        struct bn_case b;
        bn_init(&b, GC_SHAPE(2, 3, 4, 2));
        bn_run(&b, false, 1e-5f, 0.9f, "batchnorm inference (2,3,4,2)");
        bn_free(&b);
}

/* ---- LayerNormalization ---- */

static void ref_ln(const float *x, const float *scale, const float *bias, size_t R, size_t D, double eps, float *y)
{
        for (size_t r = 0; r < R; r++) {
                double s = 0, ss = 0;
                for (size_t i = 0; i < D; i++)
                        s += x[r * D + i];
                double mu = s / D;
                for (size_t i = 0; i < D; i++)
                        ss += (x[r * D + i] - mu) * (x[r * D + i] - mu);
                double is = 1 / sqrt(ss / D + eps);
                for (size_t i = 0; i < D; i++)
                        y[r * D + i] = (float)((x[r * D + i] - mu) * is * scale[i] + (bias ? bias[i] : 0));
        }
}

static void ln_case(struct graph_shape xs, int64_t axis, struct graph_shape ss, bool bias, double h, const char *what)
{
        size_t nx = graph_shape_count(&xs, 1), D = graph_shape_count(&ss, 1), R = nx / D;
        float *x = gc_rand(nx, -2, 2, 71), *s = gc_rand(D, 0.2f, 0.6f, 72), *b = gc_rand(D, -0.5f, 0.5f, 73);
        float *ref = calloc(nx, sizeof(float));
        ref_ln(x, s, bias ? b : NULL, R, D, 1e-5, ref);
        struct graph_attrs a;
        graph_attrs_default(&a);
        a.axis = axis;
        struct gc_input in[3] = {
                { "X", GDT_F32, xs, x },
                { "Scale", GDT_F32, ss, s },
                { "B", GDT_F32, ss, b },
        };
        struct gc_result r;
        int rc = gc_check(GOP_LAYERNORM, &a, in, bias ? 3 : 2, 1, true, ref, h, &r);
        expect_ok(rc, &r, ref, nx, what);
        assert_true(r.bwd_max_rel <= 1e-3);
        assert_int_equal(r.n_checked, nx + D * (bias ? 2 : 1));
        free(x), free(s), free(b), free(ref);
}

static void test_layernorm(void **state)
{
        ln_case(GC_SHAPE(3, 2, 8), -1, GC_SHAPE(8), true, 1e-2, "layernorm (3,2,8) axis -1");
        ln_case(GC_SHAPE(2, 3, 4), 1, GC_SHAPE(3, 4), false, 1e-2, "layernorm (2,3,4) axis 1, no B");
        ln_case(GC_SHAPE(2, 3, 4), 1, GC_SHAPE(3, 4), true, 1e-2, "layernorm (2,3,4) axis 1");
}

/* ---- what the shape functions refuse, in graph_finalize's words ---- */

/* One node over tensors of the given shapes (the first an input when its dims[0] is the batch, the rest
 * parameters); graph_finalize's return, its error in err ("" when it succeeds). */
static int finalize_one(enum graph_op op, const char *name, const struct graph_attrs *a, const struct graph_shape *s,
                        uint32_t n_in, char *err, size_t errlen)
{
        struct graph *g = graph_new();
        int32_t t[GRAPH_MAX_IN];
        for (uint32_t i = 0; i < n_in; i++) {
                char nm[16];
                snprintf(nm, sizeof(nm), "t%u", i);
                enum graph_tensor_kind kind = i == 0 && s[0].dims[0] == GRAPH_BATCH ? GT_INPUT : GT_PARAM;
                t[i] = graph_add_tensor(g, nm, kind, GDT_F32, &s[i], NULL);
        }
        const char *outs[1] = { "y" };
        assert_true(graph_add_node(g, op, name, t, n_in, outs, 1, a) >= 0);
        err[0] = 0;
        int rc = graph_finalize(g, err, errlen);
        graph_free(g);
        return rc;
}

static void test_bad_attrs(void **state)
{
        char err[512];
        struct graph_attrs a;
        struct graph_shape cs[2] = { GC_SHAPE(1, 2, 5, 5), GC_SHAPE(4, 1, 3, 3) };

        graph_attrs_default(&a);
        a.group = 2;
        assert_int_equal(finalize_one(GOP_CONV, "conv1", &a, cs, 2, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"conv1\" (Conv): group=2 is not supported");

        graph_attrs_default(&a);
        cs[1] = GC_SHAPE(4, 2, 3, 3);
        a.n_kernel = 2;
        a.kernel[0] = 3, a.kernel[1] = 2;
        assert_int_equal(finalize_one(GOP_CONV, "conv1", &a, cs, 2, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"conv1\" (Conv): kernel_shape does not match W's 3x3");

        graph_attrs_default(&a);
        cs[1] = GC_SHAPE(4, 3, 3, 3);
        assert_int_equal(finalize_one(GOP_CONV, "conv1", &a, cs, 2, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"conv1\" (Conv): W has 3 input channels, X 2");

        struct graph_shape ps[1] = { GC_SHAPE(GRAPH_BATCH, 2, 6, 6) };
        graph_attrs_default(&a);
        a.n_kernel = 2;
        a.kernel[0] = a.kernel[1] = 2;
        a.ceil_mode = 1;
        assert_int_equal(finalize_one(GOP_MAXPOOL, "pool1", &a, ps, 1, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"pool1\" (MaxPool): ceil_mode=1 is not supported");
        assert_int_equal(finalize_one(GOP_AVGPOOL, "pool2", &a, ps, 1, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"pool2\" (AveragePool): ceil_mode=1 is not supported");

        a.ceil_mode = 0;
        a.n_dilations = 2;
        a.dilations[0] = a.dilations[1] = 2;
        assert_int_equal(finalize_one(GOP_MAXPOOL, "pool1", &a, ps, 1, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"pool1\" (MaxPool): dilations other than 1 are not supported");

        a.n_dilations = 0;
        a.n_kernel = 0;
        assert_int_equal(finalize_one(GOP_MAXPOOL, "pool1", &a, ps, 1, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"pool1\" (MaxPool): kernel_shape has 0 values, needs 2");

        a.n_kernel = 2;
        a.n_pads = 4;
        a.pads[0] = 2, a.pads[1] = a.pads[2] = a.pads[3] = 0;
        assert_int_equal(finalize_one(GOP_AVGPOOL, "pool2", &a, ps, 1, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"pool2\" (AveragePool): pads must be smaller than the kernel");

        /* the batch kept symbolic where the pools take it */
        a.n_pads = 0;
        assert_int_equal(finalize_one(GOP_MAXPOOL, "pool1", &a, ps, 1, err, sizeof(err)), 0);

        struct graph_shape bs[5] = { GC_SHAPE(GRAPH_BATCH, 3, 4), GC_SHAPE(3), GC_SHAPE(3), GC_SHAPE(3), GC_SHAPE(4) };
        graph_attrs_default(&a);
        assert_int_equal(finalize_one(GOP_BATCHNORM, "bn", &a, bs, 5, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"bn\" (BatchNormalization): input 4 (input_var) must have shape (3)");
        bs[4] = GC_SHAPE(3);
        assert_int_equal(finalize_one(GOP_BATCHNORM, "bn", &a, bs, 5, err, sizeof(err)), 0);

        struct graph_shape ls[2] = { GC_SHAPE(GRAPH_BATCH, 3), GC_SHAPE(3) };
        graph_attrs_default(&a);
        a.axis = 0;
        assert_int_equal(finalize_one(GOP_LAYERNORM, "ln", &a, ls, 2, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "node \"ln\" (LayerNormalization): axis 0 normalizes over the batch");
        a.axis = -1;
        ls[1] = GC_SHAPE(4);
        assert_int_equal(finalize_one(GOP_LAYERNORM, "ln", &a, ls, 2, err, sizeof(err)), -EINVAL);
        assert_string_equal(err,
                            "node \"ln\" (LayerNormalization): input 1 (Scale) must have X's shape from axis 1 on");
        ls[1] = GC_SHAPE(3);
        assert_int_equal(finalize_one(GOP_LAYERNORM, "ln", &a, ls, 2, err, sizeof(err)), 0);
}

UNIT_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_conv_pads_strides), cmocka_unit_test(test_conv_dilations),
               cmocka_unit_test(test_conv_stride1), cmocka_unit_test(test_conv_batch), cmocka_unit_test(test_maxpool), cmocka_unit_test(test_maxpool_tiles_set),
               cmocka_unit_test(test_maxpool_ties), cmocka_unit_test(test_avgpool), cmocka_unit_test(test_gap),
               cmocka_unit_test(test_batchnorm_training), cmocka_unit_test(test_batchnorm_eval),
               cmocka_unit_test(test_layernorm), cmocka_unit_test(test_bad_attrs))
