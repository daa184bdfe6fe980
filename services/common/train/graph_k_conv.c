/* The graph engine's CPU kernels for images (graph-internal.h): Conv (im2col + sgemm),
 * MaxPool, AveragePool, GlobalAveragePool, with ONNX's semantics (opsets 13 to 17); the normalizations are in
 * graph_k_norm.c. NCHW; convolutions and pools are 2-D. */
#include "graph-internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>

/* Sets err (the shape functions' why) and yields -EINVAL. err may be NULL (errlen 0): the kernels plan
 * with already checked shapes and pass none. */
#define FAIL(...) (snprintf(err, errlen, __VA_ARGS__), -EINVAL)

/* Sizes past this are refused by the shape functions, so that the kernels' products of them fit in
 * size_t and each sgemm's dimensions in an int. */
#define DIM_MAX ((int64_t)1 << 24)

/* (graph_finalize has refused int64 inputs to these ops before their shape functions run.) */
static bool has_in(const struct graph_node *n, uint32_t i)
{
        return i < n->n_in && n->in[i] >= 0;
}

/* ---- a window sliding over a plane: a convolution's kernel or a pool's ---- */

struct win {
        int64_t N, C, H, W;        /* the input, N possibly GRAPH_BATCH in shape functions */
        int64_t kh, kw;            /* the kernel */
        int64_t sh, sw, dh, dw;    /* strides, dilations */
        int64_t pt, pl, pb, pr;    /* pads: top, left, bottom, right */
        int64_t OH, OW;            /* the output plane */
};

/* Reads the attributes (pads, strides, dilations; n_* 0: the defaults) for a kh x kw kernel over x
 * (rank 4) and works out the output plane. */
static int win_plan(const struct graph_attrs *a, const struct graph_shape *x, int64_t kh, int64_t kw,
                    struct win *q, char *err, size_t errlen)
{
        if (x->rank != 4)
                return FAIL("input 0 has rank %u, needs 4 (N, C, H, W: 2-D only)", x->rank);
        if (a->n_pads != 0 && a->n_pads != 4)
                return FAIL("pads has %u values, needs 4", a->n_pads);
        if (a->n_strides != 0 && a->n_strides != 2)
                return FAIL("strides has %u values, needs 2", a->n_strides);
        if (a->n_dilations != 0 && a->n_dilations != 2)
                return FAIL("dilations has %u values, needs 2", a->n_dilations);
        *q = (struct win){
                .N = x->dims[0], .C = x->dims[1], .H = x->dims[2], .W = x->dims[3],
                .kh = kh, .kw = kw,
                .sh = a->n_strides ? a->strides[0] : 1, .sw = a->n_strides ? a->strides[1] : 1,
                .dh = a->n_dilations ? a->dilations[0] : 1, .dw = a->n_dilations ? a->dilations[1] : 1,
                .pt = a->n_pads ? a->pads[0] : 0, .pl = a->n_pads ? a->pads[1] : 0,
                .pb = a->n_pads ? a->pads[2] : 0, .pr = a->n_pads ? a->pads[3] : 0,
        };
        for (int i = 1; i < 4; i++)
                if (x->dims[i] < 1 || x->dims[i] > DIM_MAX)
                        return FAIL("input 0's dim %d is %lld", i, (long long)x->dims[i]);
        if (kh < 1 || kw < 1 || kh > DIM_MAX || kw > DIM_MAX)
                return FAIL("kernel %lldx%lld", (long long)kh, (long long)kw);
        if (q->sh < 1 || q->sw < 1 || q->sh > DIM_MAX || q->sw > DIM_MAX)
                return FAIL("strides %lld,%lld", (long long)q->sh, (long long)q->sw);
        if (q->dh < 1 || q->dw < 1 || q->dh > DIM_MAX || q->dw > DIM_MAX)
                return FAIL("dilations %lld,%lld", (long long)q->dh, (long long)q->dw);
        for (int i = 0; i < 4; i++)
                if (a->n_pads && (a->pads[i] < 0 || a->pads[i] > DIM_MAX))
                        return FAIL("pads[%d] is %lld", i, (long long)a->pads[i]);
        int64_t eh = (kh - 1) * q->dh + 1, ew = (kw - 1) * q->dw + 1; /* the dilated kernel's extent */
        if (q->H + q->pt + q->pb < eh || q->W + q->pl + q->pr < ew)
                return FAIL("the kernel (%lldx%lld, dilated) is larger than the padded input (%lldx%lld)",
                            (long long)eh, (long long)ew, (long long)(q->H + q->pt + q->pb),
                            (long long)(q->W + q->pl + q->pr));
        q->OH = (q->H + q->pt + q->pb - eh) / q->sh + 1;
        q->OW = (q->W + q->pl + q->pr - ew) / q->sw + 1;
        return 0;
}

/* The output positions o in [0, n_out) whose input position o*s + off lies inside [0, n): [*lo, *hi). */
static void valid_range(int64_t off, int64_t s, int64_t n, int64_t n_out, int64_t *lo, int64_t *hi)
{
        int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
        int64_t z = n - off <= 0 ? 0 : (n - off + s - 1) / s;
        if (z > n_out)
                z = n_out;
        if (a > n_out)
                a = n_out;
        *lo = a;
        *hi = z > a ? z : a;
}

/* ---- Conv ---- */

/* A convolution's geometry: the window over X, and W's M filters of C*kh*kw weights. */
struct conv {
        struct win q;
        int64_t M;
        bool direct_ok;     /* stride 1, no dilation, small planes: graph_k_dconv.c's can */
        bool direct;        /* and it is faster: it does */
        struct gk_dconv d;
};

static int conv_plan(const struct graph_node *n, const struct graph_shape *x, const struct graph_shape *w,
                     struct conv *c, char *err, size_t errlen)
{
        const struct graph_attrs *a = &n->a;
        if (a->group != 1)
                return FAIL("group=%lld is not supported", (long long)a->group);
        if (w->rank != 4)
                return FAIL("input 1 (W) has rank %u, needs 4 (M, C, kH, kW)", w->rank);
        for (int i = 0; i < 4; i++)
                if (w->dims[i] < 1 || w->dims[i] > DIM_MAX)
                        return FAIL("input 1 (W)'s dim %d is %lld", i, (long long)w->dims[i]);
        if (a->n_kernel != 0 &&
            (a->n_kernel != 2 || a->kernel[0] != w->dims[2] || a->kernel[1] != w->dims[3]))
                return FAIL("kernel_shape does not match W's %lldx%lld", (long long)w->dims[2],
                            (long long)w->dims[3]);
        int r = win_plan(a, x, w->dims[2], w->dims[3], &c->q, err, errlen);
        if (r < 0)
                return r;
        if (w->dims[1] != x->dims[1])
                return FAIL("W has %lld input channels, X %lld", (long long)w->dims[1], (long long)x->dims[1]);
        c->M = w->dims[0];
        if (c->q.C * c->q.kh * c->q.kw > INT_MAX || c->q.OH * c->q.OW > INT_MAX)
                return FAIL("too large for one sgemm");
        const int64_t pads[4] = { c->q.pt, c->q.pl, c->q.pb, c->q.pr };
        c->direct_ok = gk_dconv_geometry(&c->d, c->q.C, c->q.H, c->q.W, c->M, c->q.kh, c->q.kw, c->q.sh, c->q.sw,
                                         c->q.dh, c->q.dw, pads) == 0;
        c->direct = c->direct_ok && gk_dconv_wins(&c->d);
        return 0;
}

GRAPH_SHAPE_FN(gs_conv)
{
        const struct graph_shape *x = graph_in_shape(g, n, 0), *w = graph_in_shape(g, n, 1);
        struct conv c;
        int r = conv_plan(n, x, w, &c, err, errlen);
        if (r < 0)
                return r;
        if (has_in(n, 2)) {
                const struct graph_shape *b = graph_in_shape(g, n, 2);
                if (b->rank != 1 || b->dims[0] != c.M)
                        return FAIL("input 2 (B) must have shape (%lld)", (long long)c.M);
        }
        out[0] = (struct graph_shape){ .rank = 4, .dims = { x->dims[0], c.M, c.q.OH, c.q.OW } };
        return 0;
}

/* Examples per im2col chunk: col about the size of a core's L2 (1 MiB), as backend_cpu.c measured for
 * its convolution: small layers batch several examples into one wider sgemm, large ones run one each. */
#define CONV_CHUNK_FLOATS ((size_t)1 << 18)

static size_t conv_chunk(const struct conv *c, size_t N)
{
        size_t per = (size_t)(c->q.C * c->q.kh * c->q.kw * c->q.OH * c->q.OW);
        size_t G = CONV_CHUNK_FLOATS / per;
        if (G > N)
                G = N;
        return G ? G : 1;
}

/* col (C*kh*kw, G*OH*OW) for a chunk of G examples, then, when G > 1, tmp (M, G*OH*OW) for the product
 * (one example goes straight into Y). */
static size_t conv_scratch_floats(const struct conv *c, size_t G)
{
        size_t ohw = (size_t)(c->q.OH * c->q.OW), ckk = (size_t)(c->q.C * c->q.kh * c->q.kw);
        return ckk * G * ohw + (G > 1 ? (size_t)c->M * G * ohw : 0);
}

size_t gk_conv_scratch(const struct graph *g, const struct graph_node *n, uint32_t B)
{
        const struct graph_shape *x = graph_in_shape(g, n, 0);
        struct conv c;
        if (conv_plan(n, x, graph_in_shape(g, n, 1), &c, NULL, 0) < 0)
                return 0;
        /* room for either path: which one runs is decided at each call (gk_dconv_wins) */
        size_t N = x->dims[0] == GRAPH_BATCH ? B : (size_t)x->dims[0];
        size_t s = conv_scratch_floats(&c, conv_chunk(&c, N)), sd = c.direct_ok ? gk_dconv_scratch(&c.d, N) : 0;
        return s > sd ? s : sd;
}

/* Where one kernel offset reads, for a convolution whose rows keep their width (stride 1 across, OW ==
 * W: "same" padding across, any dilation): output position i = oy*W + ox reads input i + off, off =
 * offy*W + offx, so the offset's whole plane is one flat copy [lo, hi), then the columns outside [x0, x1)
 * (they read a neighbouring row) and the rows outside [y0, y1) are zero. Row-sized library calls cost
 * more than the sgemm they feed on small planes (28, 14, 7 wide): this makes them one per plane. */
struct flat {
        int64_t off, lo, hi;     /* the flat range of output positions copied */
        int64_t y0, y1, x0, x1;  /* output rows and columns that read inside the image */
};

static bool flat_ok(const struct win *q)
{
        return q->sw == 1 && q->OW == q->W && q->sh == 1;
}

static void flat_plan(const struct win *q, int64_t offy, int64_t offx, struct flat *f)
{
        int64_t n = q->OH * q->OW, HW = q->H * q->W;
        valid_range(offy, 1, q->H, q->OH, &f->y0, &f->y1);
        valid_range(offx, 1, q->W, q->OW, &f->x0, &f->x1);
        f->off = offy * q->W + offx;
        int64_t lo = f->y0 * q->W, hi = f->y1 * q->W;
        lo = lo > -f->off ? lo : -f->off;
        hi = hi < HW - f->off ? hi : HW - f->off;
        f->lo = lo < 0 ? 0 : lo > n ? n : lo;
        f->hi = hi < f->lo ? f->lo : hi;
}

/* Zeroes, in rows [y0, y1) of an output plane, the columns outside [x0, x1): a column at a time, as
 * margins are a pad or two wide (row by row, each margin would be a library call of a float or two). */
static void flat_zero_margins(float *r0, int64_t W, const struct flat *f)
{
        for (int64_t x = 0; x < f->x0; x++)
                for (int64_t y = f->y0; y < f->y1; y++)
                        r0[y * W + x] = 0.0f;
        for (int64_t x = f->x1; x < W; x++)
                for (int64_t y = f->y0; y < f->y1; y++)
                        r0[y * W + x] = 0.0f;
}

/* One example's im2col: row (ci, ky, kx) of col (row stride ld) holds, at output position (oy, ox), the
 * input img[ci][oy*sh - pt + ky*dh][ox*sw - pl + kx*dw], 0 in the padding. */
static void im2col(const float *img /* (C, H, W) */, const struct win *q, float *col, size_t ld)
{
        if (flat_ok(q)) {
                size_t n = (size_t)(q->OH * q->OW);
                for (int64_t ky = 0; ky < q->kh; ky++)
                        for (int64_t kx = 0; kx < q->kw; kx++) {
                                struct flat f;
                                flat_plan(q, ky * q->dh - q->pt, kx * q->dw - q->pl, &f);
                                for (int64_t ci = 0; ci < q->C; ci++) {
                                        float *row = col + (size_t)((ci * q->kh + ky) * q->kw + kx) * ld;
                                        const float *plane = img + (size_t)(ci * q->H * q->W);
                                        memset(row, 0, sizeof(float) * (size_t)f.lo);
                                        memcpy(row + f.lo, plane + f.lo + f.off, sizeof(float) * (size_t)(f.hi - f.lo));
                                        memset(row + f.hi, 0, sizeof(float) * (n - (size_t)f.hi));
                                        flat_zero_margins(row, q->W, &f);
                                }
                        }
                return;
        }
        for (int64_t ci = 0; ci < q->C; ci++)
                for (int64_t ky = 0; ky < q->kh; ky++)
                        for (int64_t kx = 0; kx < q->kw; kx++) {
                                float *row = col + (size_t)((ci * q->kh + ky) * q->kw + kx) * ld;
                                const float *plane = img + (size_t)(ci * q->H * q->W);
                                int64_t offy = ky * q->dh - q->pt, offx = kx * q->dw - q->pl, x0, x1;
                                valid_range(offx, q->sw, q->W, q->OW, &x0, &x1);
                                for (int64_t oy = 0; oy < q->OH; oy++) {
                                        float *r = row + oy * q->OW;
                                        int64_t iy = oy * q->sh + offy;
                                        if (iy < 0 || iy >= q->H) {
                                                memset(r, 0, sizeof(float) * (size_t)q->OW);
                                                continue;
                                        }
                                        int64_t base = iy * q->W + offx; /* + ox*sw: inside the row */
                                        for (int64_t ox = 0; ox < x0; ox++)
                                                r[ox] = 0.0f;
                                        if (q->sw == 1)
                                                memcpy(r + x0, plane + base + x0, sizeof(float) * (size_t)(x1 - x0));
                                        else if (q->sw == 2) /* a constant stride: the loop vectorizes */
                                                for (int64_t ox = x0; ox < x1; ox++)
                                                        r[ox] = plane[base + ox * 2];
                                        else
                                                for (int64_t ox = x0; ox < x1; ox++)
                                                        r[ox] = plane[base + ox * q->sw];
                                        for (int64_t ox = x1; ox < q->OW; ox++)
                                                r[ox] = 0.0f;
                                }
                        }
}

/* im2col's adjoint: img += the scatter of one example's column block (padding entries dropped). col is
 * scratch: the flat path zeroes its margins first, so that one flat add per plane is exact. */
static void col2im_add(float *col, size_t ld, const struct win *q, float *img /* (C, H, W) */)
{
        if (flat_ok(q)) {
                for (int64_t ky = 0; ky < q->kh; ky++)
                        for (int64_t kx = 0; kx < q->kw; kx++) {
                                struct flat f;
                                flat_plan(q, ky * q->dh - q->pt, kx * q->dw - q->pl, &f);
                                for (int64_t ci = 0; ci < q->C; ci++) {
                                        float *row = col + (size_t)((ci * q->kh + ky) * q->kw + kx) * ld;
                                        float *out = img + (size_t)(ci * q->H * q->W) + f.lo + f.off;
                                        flat_zero_margins(row, q->W, &f);
                                        const float *in = row + f.lo;
                                        for (int64_t i = 0; i < f.hi - f.lo; i++)
                                                out[i] += in[i];
                                }
                        }
                return;
        }
        for (int64_t ci = 0; ci < q->C; ci++)
                for (int64_t ky = 0; ky < q->kh; ky++)
                        for (int64_t kx = 0; kx < q->kw; kx++) {
                                const float *row = col + (size_t)((ci * q->kh + ky) * q->kw + kx) * ld;
                                float *plane = img + (size_t)(ci * q->H * q->W);
                                int64_t offy = ky * q->dh - q->pt, offx = kx * q->dw - q->pl, x0, x1, y0, y1;
                                valid_range(offx, q->sw, q->W, q->OW, &x0, &x1);
                                valid_range(offy, q->sh, q->H, q->OH, &y0, &y1);
                                for (int64_t oy = y0; oy < y1; oy++) {
                                        const float *r = row + oy * q->OW;
                                        int64_t base = (oy * q->sh + offy) * q->W + offx;
                                        if (q->sw == 2)
                                                for (int64_t ox = x0; ox < x1; ox++)
                                                        plane[base + ox * 2] += r[ox];
                                        else
                                                for (int64_t ox = x0; ox < x1; ox++)
                                                        plane[base + ox * q->sw] += r[ox];
                                }
                        }
}

int gk_conv_fwd(struct graph_kctx *k)
{
        struct conv c;
        if (conv_plan(k->node, &k->in_shape[0], &k->in_shape[1], &c, NULL, 0) < 0)
                return -EINVAL;
        const struct win *q = &c.q;
        const float *x = k->in[0];    /* (N, C, H, W) */
        const float *w = k->in[1];    /* (M, C*kh*kw) */
        const float *bias = k->in[2]; /* (M), or NULL */
        float *y = k->out[0];         /* (N, M, OH, OW) */
        if (c.direct) {
                gk_dconv_fwd(&c.d, (size_t)q->N, x, w, bias, y, k->scratch);
                return 0;
        }
        size_t N = (size_t)q->N, M = (size_t)c.M, ohw = (size_t)(q->OH * q->OW);
        size_t chw = (size_t)(q->C * q->H * q->W), ckk = (size_t)(q->C * q->kh * q->kw);
        size_t G = conv_chunk(&c, N);
        float *col = k->scratch, *tmp = col + ckk * G * ohw;
        for (size_t b0 = 0; b0 < N; b0 += G) {
                size_t gn = N - b0 < G ? N - b0 : G, ld = gn * ohw;
                for (size_t j = 0; j < gn; j++)
                        im2col(x + (b0 + j) * chw, q, col + j * ohw, ld);
                if (gn == 1) {
                        /* straight into Y's example, the bias first */
                        float *yb = y + b0 * M * ohw;
                        for (size_t m = 0; m < M; m++)
                                for (size_t i = 0; i < ohw; i++)
                                        yb[m * ohw + i] = bias ? bias[m] : 0.0f;
                        gk_sgemm(false, false, (int)M, (int)ohw, (int)ckk, 1.0f, w,
                                 (int)ckk, col, (int)ld, 1.0f, yb, (int)ohw);
                        continue;
                }
                /* tmp (M, gn*ohw) = W @ col, then Y[b0 + j][m] = tmp[m][j*ohw ...] + bias[m] */
                gk_sgemm(false, false, (int)M, (int)ld, (int)ckk, 1.0f, w, (int)ckk,
                         col, (int)ld, 0.0f, tmp, (int)ld);
                for (size_t j = 0; j < gn; j++)
                        for (size_t m = 0; m < M; m++) {
                                const float *src = tmp + m * ld + j * ohw;
                                float *dst = y + ((b0 + j) * M + m) * ohw, bm = bias ? bias[m] : 0.0f;
                                for (size_t i = 0; i < ohw; i++)
                                        dst[i] = src[i] + bm;
                        }
        }
        return 0;
}

/* dB = the sum of dY over examples and positions; dW += dY @ col^T; dX += col2im(W^T @ dY), a chunk of
 * examples per product as forward. */
int gk_conv_bwd(struct graph_kctx *k)
{
        const float *dy = k->dout[0]; /* (N, M, OH, OW) */
        float *dx = k->din[0], *dw = k->din[1], *db = k->node->n_in > 2 ? k->din[2] : NULL;
        if (!dy)
                return 0;
        struct conv c;
        if (conv_plan(k->node, &k->in_shape[0], &k->in_shape[1], &c, NULL, 0) < 0)
                return -EINVAL;
        const struct win *q = &c.q;
        const float *x = k->in[0], *w = k->in[1];
        size_t N = (size_t)q->N, M = (size_t)c.M, ohw = (size_t)(q->OH * q->OW);
        size_t chw = (size_t)(q->C * q->H * q->W), ckk = (size_t)(q->C * q->kh * q->kw);
        /* set: db and dx start from zero (they are summed into), dw's first product overwrites */
        if (db && k->din_set[2])
                memset(db, 0, sizeof(float) * M);
        float dw_beta = k->din_set[1] ? 0.0f : 1.0f;
        if (db)
                for (size_t b = 0; b < N; b++)
                        for (size_t m = 0; m < M; m++) {
                                const float *d = dy + (b * M + m) * ohw;
                                float s = 0.0f;
                                for (size_t i = 0; i < ohw; i++)
                                        s += d[i];
                                db[m] += s;
                        }
        if (!dx && !dw)
                return 0;
        if (c.direct) {
                gk_dconv_bwd(&c.d, N, x, w, dy, dx, k->din_set[0], dw, k->din_set[1], k->scratch);
                return 0;
        }
        if (dx && k->din_set[0])
                memset(dx, 0, sizeof(float) * N * chw);
        size_t G = conv_chunk(&c, N);
        float *col = k->scratch, *tmp = col + ckk * G * ohw;
        for (size_t b0 = 0; b0 < N; b0 += G) {
                size_t gn = N - b0 < G ? N - b0 : G, ld = gn * ohw;
                const float *dyc = dy + b0 * M * ohw; /* (M, ld): the chunk's dY side by side */
                if (gn > 1) {
                        for (size_t j = 0; j < gn; j++)
                                for (size_t m = 0; m < M; m++)
                                        memcpy(tmp + m * ld + j * ohw, dy + ((b0 + j) * M + m) * ohw,
                                               sizeof(float) * ohw);
                        dyc = tmp;
                }
                if (dw) {
                        for (size_t j = 0; j < gn; j++)
                                im2col(x + (b0 + j) * chw, q, col + j * ohw, ld);
                        gk_sgemm(false, true, (int)M, (int)ckk, (int)ld, 1.0f, dyc,
                                 (int)ld, col, (int)ld, dw_beta, dw, (int)ckk);
                        dw_beta = 1.0f;
                }
                if (dx) {
                        /* col, done with, now takes d(col) = W^T @ dY */
                        gk_sgemm(true, false, (int)ckk, (int)ld, (int)M, 1.0f, w,
                                 (int)ckk, dyc, (int)ld, 0.0f, col, (int)ld);
                        for (size_t j = 0; j < gn; j++)
                                col2im_add(col + j * ohw, ld, q, dx + (b0 + j) * chw);
                }
        }
        return 0;
}

/* ---- MaxPool, AveragePool ---- */

static int pool_plan(const struct graph_node *n, const struct graph_shape *x, struct win *q, char *err,
                     size_t errlen)
{
        const struct graph_attrs *a = &n->a;
        if (a->ceil_mode != 0)
                return FAIL("ceil_mode=%lld is not supported", (long long)a->ceil_mode);
        if (a->n_kernel != 2)
                return FAIL("kernel_shape has %u values, needs 2", a->n_kernel);
        /* AveragePool has no dilations before opset 19; MaxPool's are refused so that its backward can
         * search plain windows */
        for (uint32_t i = 0; i < a->n_dilations; i++)
                if (a->dilations[i] != 1)
                        return FAIL("dilations other than 1 are not supported");
        if (n->op == GOP_AVGPOOL && a->count_include_pad != 0 && a->count_include_pad != 1)
                return FAIL("count_include_pad=%lld", (long long)a->count_include_pad);
        int r = win_plan(a, x, a->kernel[0], a->kernel[1], q, err, errlen);
        if (r < 0)
                return r;
        /* so that every window holds at least one element of the input (never only padding) */
        if (q->pt >= q->kh || q->pb >= q->kh || q->pl >= q->kw || q->pr >= q->kw)
                return FAIL("pads must be smaller than the kernel");
        return 0;
}

GRAPH_SHAPE_FN(gs_pool)
{
        const struct graph_shape *x = graph_in_shape(g, n, 0);
        struct win q;
        int r = pool_plan(n, x, &q, err, errlen);
        if (r < 0)
                return r;
        out[0] = (struct graph_shape){ .rank = 4, .dims = { x->dims[0], x->dims[1], q.OH, q.OW } };
        return 0;
}

/* The window of output (oy, ox) clipped to the input: rows [*y0, *y1), columns [*x0, *x1). */
static inline void pool_window(const struct win *q, int64_t oy, int64_t ox, int64_t *y0, int64_t *y1, int64_t *x0,
                               int64_t *x1)
{
        int64_t ys = oy * q->sh - q->pt, xs = ox * q->sw - q->pl;
        *y0 = ys > 0 ? ys : 0;
        *y1 = ys + q->kh < q->H ? ys + q->kh : q->H;
        *x0 = xs > 0 ? xs : 0;
        *x1 = xs + q->kw < q->W ? xs + q->kw : q->W;
}

/* The first maximum of a window in row-major order (the one that takes the gradient): its flat index in
 * the plane. */
static inline size_t window_argmax(const float *plane, const struct win *q, int64_t y0, int64_t y1, int64_t x0,
                                   int64_t x1)
{
        size_t best = (size_t)(y0 * q->W + x0);
        for (int64_t iy = y0; iy < y1; iy++)
                for (int64_t ix = x0; ix < x1; ix++) {
                        size_t i = (size_t)(iy * q->W + ix);
                        if (plane[i] > plane[best])
                                best = i;
                }
        return best;
}

/* AveragePool's divisor: the whole kernel (count_include_pad; a window never passes the padded input
 * with ceil_mode 0), else the elements inside the input. */
static inline float pool_divisor(const struct graph_node *n, const struct win *q, int64_t y0, int64_t y1, int64_t x0,
                                 int64_t x1)
{
        return n->a.count_include_pad ? (float)(q->kh * q->kw) : (float)((y1 - y0) * (x1 - x0));
}

/* A max pool whose windows tile the plane (kernel = stride, no pads): the layer lists' maxpool2d and most
 * CNNs'. Its windows are read directly, and its backward writes every element of dX (0 outside the
 * maxima, and in the rows and columns no window covers), so dX need not be zeroed first. */
static bool pool_tiles(const struct graph_node *n, const struct win *q)
{
        return n->op == GOP_MAXPOOL && q->kh == q->sh && q->kw == q->sw && !q->pt && !q->pl && !q->pb && !q->pr;
}

/* The index in its plane of the first maximum of tiled window (oy, ox), as window_argmax finds it. */
static inline size_t tile_argmax(const float *plane, const struct win *q, int64_t oy, int64_t ox)
{
        size_t best = (size_t)(oy * q->sh * q->W + ox * q->sw);
        for (int64_t ky = 0; ky < q->kh; ky++)
                for (int64_t kx = 0; kx < q->kw; kx++) {
                        size_t i = (size_t)((oy * q->sh + ky) * q->W + ox * q->sw + kx);
                        if (plane[i] > plane[best])
                                best = i;
                }
        return best;
}

int gk_pool_fwd(struct graph_kctx *k)
{
        struct win q;
        if (pool_plan(k->node, &k->in_shape[0], &q, NULL, 0) < 0)
                return -EINVAL;
        bool max = k->node->op == GOP_MAXPOOL;
        const float *x = k->in[0]; /* (N, C, H, W) */
        float *y = k->out[0];      /* (N, C, OH, OW) */
        size_t planes = (size_t)(q.N * q.C), hw = (size_t)(q.H * q.W);
        if (pool_tiles(k->node, &q)) {
                for (size_t p = 0; p < planes; p++)
                        for (int64_t oy = 0; oy < q.OH; oy++) {
                                if (q.kh == 2 && q.kw == 2) { /* the common one, two rows at once */
                                        const float *r0 = x + p * hw + 2 * oy * q.W, *r1 = r0 + q.W;
                                        for (int64_t ox = 0; ox < q.OW; ox++) {
                                                float m = r0[2 * ox];
                                                m = r0[2 * ox + 1] > m ? r0[2 * ox + 1] : m;
                                                m = r1[2 * ox] > m ? r1[2 * ox] : m;
                                                *y++ = r1[2 * ox + 1] > m ? r1[2 * ox + 1] : m;
                                        }
                                        continue;
                                }
                                for (int64_t ox = 0; ox < q.OW; ox++)
                                        *y++ = x[p * hw + tile_argmax(x + p * hw, &q, oy, ox)];
                        }
                return 0;
        }
        for (size_t p = 0; p < planes; p++) {
                const float *plane = x + p * hw;
                for (int64_t oy = 0; oy < q.OH; oy++)
                        for (int64_t ox = 0; ox < q.OW; ox++) {
                                int64_t y0, y1, x0, x1;
                                pool_window(&q, oy, ox, &y0, &y1, &x0, &x1);
                                float v;
                                if (max) {
                                        v = plane[window_argmax(plane, &q, y0, y1, x0, x1)];
                                } else {
                                        float s = 0.0f;
                                        for (int64_t iy = y0; iy < y1; iy++)
                                                for (int64_t ix = x0; ix < x1; ix++)
                                                        s += plane[iy * q.W + ix];
                                        v = s / pool_divisor(k->node, &q, y0, y1, x0, x1);
                                }
                                *y++ = v;
                        }
        }
        return 0;
}

/* MaxPool: each output's gradient to its window's first maximum, found again in the input (no state);
 * AveragePool: spread over the window's elements inside the input, divided as forward. */
int gk_pool_bwd(struct graph_kctx *k)
{
        const float *dy = k->dout[0];
        float *dx = k->din[0];
        if (!dy || !dx)
                return 0;
        struct win q;
        if (pool_plan(k->node, &k->in_shape[0], &q, NULL, 0) < 0)
                return -EINVAL;
        bool max = k->node->op == GOP_MAXPOOL;
        const float *x = k->in[0];
        size_t planes = (size_t)(q.N * q.C), hw = (size_t)(q.H * q.W);
        if (pool_tiles(k->node, &q)) {
                /* each window's elements written (0, or dY at the maximum, added to when not set), then
                 * the rows and columns past the last window */
                int64_t cov_h = q.OH * q.sh, cov_w = q.OW * q.sw;
                for (size_t p = 0; p < planes; p++) {
                        const float *plane = x + p * hw;
                        float *dplane = dx + p * hw;
                        for (int64_t oy = 0; oy < q.OH && k->din_set[0] && q.kh == 2 && q.kw == 2; oy++) {
                                /* 2x2, the common one: the four elements written at once */
                                const float *r0 = plane + 2 * oy * q.W, *r1 = r0 + q.W;
                                float *d0 = dplane + 2 * oy * q.W, *d1 = d0 + q.W;
                                for (int64_t ox = 0; ox < q.OW; ox++) {
                                        int64_t i = 2 * ox;
                                        float m = r0[i], v = *dy++;
                                        int best = 0;
                                        if (r0[i + 1] > m)
                                                m = r0[i + 1], best = 1;
                                        if (r1[i] > m)
                                                m = r1[i], best = 2;
                                        if (r1[i + 1] > m)
                                                best = 3;
                                        d0[i] = best == 0 ? v : 0.0f;
                                        d0[i + 1] = best == 1 ? v : 0.0f;
                                        d1[i] = best == 2 ? v : 0.0f;
                                        d1[i + 1] = best == 3 ? v : 0.0f;
                                }
                        }
                        for (int64_t oy = 0; oy < q.OH && !(k->din_set[0] && q.kh == 2 && q.kw == 2); oy++)
                                for (int64_t ox = 0; ox < q.OW; ox++) {
                                        size_t best = tile_argmax(plane, &q, oy, ox);
                                        if (k->din_set[0])
                                                for (int64_t ky = 0; ky < q.kh; ky++)
                                                        for (int64_t kx = 0; kx < q.kw; kx++)
                                                                dplane[(oy * q.sh + ky) * q.W + ox * q.sw + kx] = 0.0f;
                                        dplane[best] += *dy++;
                                }
                        for (int64_t iy = 0; k->din_set[0] && iy < q.H; iy++)
                                for (int64_t ix = iy < cov_h ? cov_w : 0; ix < q.W; ix++)
                                        dplane[iy * q.W + ix] = 0.0f;
                }
                return 0;
        }
        if (k->din_set[0])
                memset(dx, 0, sizeof(float) * planes * hw);
        for (size_t p = 0; p < planes; p++) {
                const float *plane = x + p * hw;
                float *dplane = dx + p * hw;
                for (int64_t oy = 0; oy < q.OH; oy++)
                        for (int64_t ox = 0; ox < q.OW; ox++) {
                                float d = *dy++;
                                int64_t y0, y1, x0, x1;
                                pool_window(&q, oy, ox, &y0, &y1, &x0, &x1);
                                if (max) {
                                        dplane[window_argmax(plane, &q, y0, y1, x0, x1)] += d;
                                        continue;
                                }
                                d /= pool_divisor(k->node, &q, y0, y1, x0, x1);
                                for (int64_t iy = y0; iy < y1; iy++)
                                        for (int64_t ix = x0; ix < x1; ix++)
                                                dplane[iy * q.W + ix] += d;
                        }
        }
        return 0;
}

/* ---- GlobalAveragePool ---- */

GRAPH_SHAPE_FN(gs_gap)
{
        const struct graph_shape *x = graph_in_shape(g, n, 0);
        if (x->rank < 3)
                return FAIL("input 0 has rank %u, needs at least 3 (N, C, spatial...)", x->rank);
        out[0] = *x;
        for (uint32_t i = 2; i < x->rank; i++)
                out[0].dims[i] = 1;
        return 0;
}

/* planes (N*C) and elements per plane of an (N, C, spatial...) shape, the batch resolved */
static void planes_of(const struct graph_shape *x, size_t *planes, size_t *per)
{
        *planes = (size_t)(x->dims[0] * x->dims[1]);
        *per = 1;
        for (uint32_t i = 2; i < x->rank; i++)
                *per *= (size_t)x->dims[i];
}

int gk_gap_fwd(struct graph_kctx *k)
{
        const float *x = k->in[0]; /* (N, C, spatial...) */
        float *y = k->out[0];      /* (N, C, 1...) */
        size_t planes, per;
        planes_of(&k->in_shape[0], &planes, &per);
        for (size_t p = 0; p < planes; p++) {
                double s = 0;
                for (size_t i = 0; i < per; i++)
                        s += x[p * per + i];
                y[p] = (float)(s / (double)per);
        }
        return 0;
}

int gk_gap_bwd(struct graph_kctx *k)
{
        const float *dy = k->dout[0];
        float *dx = k->din[0];
        if (!dy || !dx)
                return 0;
        size_t planes, per;
        planes_of(&k->in_shape[0], &planes, &per);
        for (size_t p = 0; p < planes; p++) {
                float d = dy[p] / (float)per;
                for (size_t i = 0; i < per; i++)
                        dx[p * per + i] += d;
        }
        return 0;
}
