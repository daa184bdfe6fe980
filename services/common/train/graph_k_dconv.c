/* The graph engine's direct convolution (graph-internal.h, gk_dconv_*): Conv with stride 1 and no
 * dilation computed from the padded input itself, without im2col's column matrix nor the sgemm's packing
 * of it. graph_k_conv.c takes this path where gk_dconv_geometry allows it and gk_dconv_wins, and its
 * im2col + sgemm path elsewhere.
 *
 * The layout: each input plane is copied, with its pads, into a row stride of Wp = W + pl + pr; the
 * output is computed in the same row stride ("padded-row coordinates": output (oy, ox) at p = oy*Wp + ox,
 * the columns ox >= OW computed and dropped), so that kernel offset (ky, kx) reads the input at the flat
 * position p + ky*Wp + kx: a contiguous run for a run of outputs. The forward keeps a tile of 4 output
 * channels by 32 positions in registers and adds, for each input channel and kernel offset, 4 broadcast
 * weights times 32 shifted inputs: 16 vector FMAs for 8 loads. The filter gradient is the same loop nest
 * with the roles turned: a tile of 4 output channels by 4 (input channel, offset) pairs, each a running
 * dot product over the positions. The input gradient of a stride-1 convolution is a stride-1
 * convolution of dY, padded by (k - 1 - pad), with the filters transposed and flipped: the forward loop
 * again.
 *
 * Against im2col + OpenBLAS (tests/bench/bench_conv, one thread, batch 64): 3x3 16 to 16 channels on
 * 28x28 1.16x forward, 1.30x backward; with 64 output channels sgemm is ahead (docs/performance.md). It
 * is taken where gk_dconv_wins says it measured faster, and only while one example's padded planes fit
 * a core's L2 (beyond, each tile of output channels would stream the input from memory again), and on
 * a CPU with AVX-512 (x86-64-v4), where it was measured: the vector code is built for it and for the
 * baseline (target_clones), the loader picking the CPU's. */
#include "graph-internal.h"

#include <string.h>

enum gk_dconv_mode gk_dconv_mode = GK_DCONV_AUTO;

/* 8 floats: half an AVX-512 register (its 32 registers hold the forward's 16 accumulators with room),
 * two SSE2 ones on the baseline */
typedef float v8 __attribute__((vector_size(32)));
#define VL 8
#define MB 4                /* output channels per tile */
#define NV 4                /* vectors per tile in the forward */
#define TP (VL * NV)        /* positions per forward tile */
#define QB 4                /* (input channel, offset) pairs per filter-gradient tile */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define DCONV_CLONES __attribute__((target_clones("default", "arch=x86-64-v4")))
#define DCONV_V4 1
#else
#define DCONV_CLONES
#define DCONV_V4 0
#endif

/* (Macros rather than functions: a vector passed or returned by value changes the ABI between the
 * clones, which GCC warns of.) */
#define LOAD8(v, p) memcpy(&(v), (p), sizeof(v8))
#define STORE8(p, v) memcpy((p), &(v), sizeof(v8))
#define BCAST8(s) ((v8){ (s), (s), (s), (s), (s), (s), (s), (s) })

static size_t round_up(size_t n, size_t to)
{
        return (n + to - 1) / to * to;
}

/* The planes of one direction: its input (C planes of H x W, padded to Hp x Wp) and output (M planes of
 * OH x OW, in padded-row coordinates L long); each padded input plane PS floats, with the slack that the
 * last tile's reads run into. */
struct plane_geom {
        size_t C, H, W, M, kh, kw, pt, pl;
        size_t Wp, OH, OW, L, PS;
};

static void plane_geom(struct plane_geom *p, size_t C, size_t H, size_t W, size_t M, size_t kh, size_t kw,
                       size_t pt, size_t pl, size_t pb, size_t pr)
{
        *p = (struct plane_geom){ .C = C, .H = H, .W = W, .M = M, .kh = kh, .kw = kw, .pt = pt, .pl = pl };
        p->Wp = W + pl + pr;
        p->OH = H + pt + pb - kh + 1;
        p->OW = p->Wp - kw + 1;
        p->L = round_up(p->OH * p->Wp, TP);
        p->PS = round_up(p->L + (kh - 1) * p->Wp + kw - 1, 16);
}

/* A convolution's two directions: f, the forward (X to Y), and b, the input gradient's (dY, padded by
 * k - 1 - pad, to dX). */
static void dconv_geoms(const struct gk_dconv *d, struct plane_geom *f, struct plane_geom *b)
{
        plane_geom(f, d->C, d->H, d->W, d->M, d->kh, d->kw, d->pads[0], d->pads[1], d->pads[2], d->pads[3]);
        plane_geom(b, d->M, f->OH, f->OW, d->C, d->kh, d->kw, d->kh - 1 - d->pads[0], d->kw - 1 - d->pads[1],
                   d->kh - 1 - d->pads[2], d->kw - 1 - d->pads[3]);
}

int gk_dconv_geometry(struct gk_dconv *d, int64_t C, int64_t H, int64_t W, int64_t M, int64_t kh, int64_t kw,
                      int64_t sh, int64_t sw, int64_t dh, int64_t dw, const int64_t pads[4])
{
        if (sh != 1 || sw != 1 || dh != 1 || dw != 1)
                return -1;
        /* the input gradient pads dY by k - 1 - pad: no pad past the kernel */
        if (pads[0] > kh - 1 || pads[2] > kh - 1 || pads[1] > kw - 1 || pads[3] > kw - 1)
                return -1;
        *d = (struct gk_dconv){ .C = (size_t)C, .H = (size_t)H, .W = (size_t)W, .M = (size_t)M,
                                .kh = (size_t)kh, .kw = (size_t)kw };
        for (int i = 0; i < 4; i++)
                d->pads[i] = (size_t)pads[i];
        struct plane_geom f, b;
        dconv_geoms(d, &f, &b);
        /* one example's padded input and output planes within about a core's L2 (1 MiB), each way */
        if ((f.C * f.PS + f.M * f.L) * sizeof(float) > ((size_t)1 << 20) ||
            (b.C * b.PS + b.M * b.L + f.C * f.PS) * sizeof(float) > ((size_t)1 << 20))
                return -1;
        return 0;
}

int (*gk_blas_threads)(void);

/* Whether the CPU runs the AVX-512 clone (x86-64-v4), on which the figures below were measured. Its
 * tile holds 21 vectors live: built for AVX2 (16 registers) it spills, and the same 3x3 16-to-16
 * convolution ran at 55.5 / 51.1 GFLOP/s against im2col's 60.8 / 50.9, so elsewhere im2col it is. */
static bool fast_cpu(void)
{
#if DCONV_V4
        static int v4 = -1; /* (a race here writes the same answer twice) */
        if (v4 < 0) {
                __builtin_cpu_init();
                v4 = __builtin_cpu_supports("x86-64-v4") ? 1 : 0;
        }
        return v4 == 1;
#else
        return false;
#endif
}

bool gk_dconv_wins(const struct gk_dconv *d)
{
        if (gk_dconv_mode != GK_DCONV_AUTO)
                return gk_dconv_mode == GK_DCONV_ALWAYS;
        if (!fast_cpu())
                return false;
        /* Where it wins (tests/bench/bench_conv, batch 64, this 2-core machine): with few output channels,
         * where sgemm's tiles are mostly edge (16: 1.1 to 1.4x forward and backward from 7x7 to 28x28
         * planes, on one thread or two); on one thread also with 32 on planes at least 24 wide (1.0 to
         * 1.1x), where sgemm on two threads is 1.2x ahead of it; not with 64 (0.8 to 0.9x), nor 32 on
         * 14x14 planes, whose rows' dropped columns are a seventh of the work (0.96x), nor over a single
         * input channel and 32 outputs (0.95x). */
        size_t OW = d->W + d->pads[1] + d->pads[3] - d->kw + 1;
        int threads = gk_blas_threads ? gk_blas_threads() : 1;
        return d->M <= 16 || (threads <= 1 && d->M <= 32 && OW >= 24 && d->C * d->kh * d->kw >= 64);
}

/* Examples per filter-gradient chunk: their padded inputs and dY about half a core's L2, so that the
 * lanes are summed once a chunk rather than once an example (a 7x7 plane is 8 vectors long). */
static size_t dw_chunk(const struct plane_geom *f, size_t N)
{
        size_t G = ((size_t)1 << 17) / (f->C * f->PS + f->M * f->L);
        return G < 1 ? 1 : G > N ? N : G;
}

size_t gk_dconv_scratch(const struct gk_dconv *d, size_t N)
{
        struct plane_geom f, b;
        dconv_geoms(d, &f, &b);
        /* forward: xp, out; backward: xp, dY in the forward's output coordinates, dY padded, dX's out, the
         * flipped filters */
        size_t fwd = f.C * f.PS + f.M * f.L;
        size_t G = dw_chunk(&f, N);
        size_t bwd = G * (f.C * f.PS + f.M * f.L) + b.C * b.PS + b.M * b.L + d->M * d->C * d->kh * d->kw;
        return fwd > bwd ? fwd : bwd;
}

/* One example's C planes (H x W) into the padded layout, zero around and in the slack. */
static void pad_planes(const struct plane_geom *g, const float *src, float *dst)
{
        for (size_t c = 0; c < g->C; c++) {
                float *plane = dst + c * g->PS;
                const float *s = src + c * g->H * g->W;
                memset(plane, 0, sizeof(float) * g->PS);
                for (size_t y = 0; y < g->H; y++)
                        memcpy(plane + (y + g->pt) * g->Wp + g->pl, s + y * g->W, sizeof(float) * g->W);
        }
}

/* out (M, L) = the convolution of xp (C padded planes) by w (M, C, kh, kw), in padded-row coordinates,
 * for output channels [m0, m0 + mb): mb is MB or 1, each a loop of its own once inlined. */
static inline __attribute__((always_inline)) void fwd_tiles(const struct plane_geom *g, const float *xp,
                                                            const float *w, float *out, size_t m0, size_t mb)
{
        size_t ckk = g->C * g->kh * g->kw;
        for (size_t p0 = 0; p0 < g->L; p0 += TP) {
                v8 acc[MB][NV];
#pragma GCC unroll 4
                for (size_t i = 0; i < mb; i++)
#pragma GCC unroll 4
                        for (size_t j = 0; j < NV; j++)
                                acc[i][j] = BCAST8(0.0f);
                for (size_t c = 0; c < g->C; c++)
                        for (size_t ky = 0; ky < g->kh; ky++) {
                                const float *src = xp + c * g->PS + ky * g->Wp + p0;
                                const float *wr = w + m0 * ckk + (c * g->kh + ky) * g->kw;
                                for (size_t kx = 0; kx < g->kw; kx++) {
                                        v8 xv[NV];
#pragma GCC unroll 4
                                        for (size_t j = 0; j < NV; j++)
                                                LOAD8(xv[j], src + kx + VL * j);
#pragma GCC unroll 4
                                        for (size_t i = 0; i < mb; i++) {
                                                float ws = wr[i * ckk + kx];
                                                v8 wv = BCAST8(ws);
#pragma GCC unroll 4
                                                for (size_t j = 0; j < NV; j++)
                                                        acc[i][j] += wv * xv[j];
                                        }
                                }
                        }
#pragma GCC unroll 4
                for (size_t i = 0; i < mb; i++)
#pragma GCC unroll 4
                        for (size_t j = 0; j < NV; j++)
                                STORE8(out + (m0 + i) * g->L + p0 + VL * j, acc[i][j]);
        }
}

DCONV_CLONES
static void conv_planes(const struct plane_geom *g, const float *xp, const float *w, float *out)
{
        size_t m = 0;
        for (; m + MB <= g->M; m += MB)
                fwd_tiles(g, xp, w, out, m, MB);
        for (; m < g->M; m++)
                fwd_tiles(g, xp, w, out, m, 1);
}

static inline float hsum8(const v8 *v)
{
        float s = 0.0f;
        for (int i = 0; i < VL; i++)
                s += (*v)[i];
        return s;
}

/* dw (M, C*kh*kw) += dyo (ng examples of M planes L long: dY in the forward's output coordinates, 0 in
 * the dropped columns and past them) against xp (ng examples of C padded planes), for output channels
 * [m0, m0 + mb) and pairs [q0, q0 + qb) (q = (c*kh + ky)*kw + kx): dot products over the positions of
 * the ng examples, summed across the lanes once. */
static inline __attribute__((always_inline)) void dw_tile(const struct plane_geom *g, size_t ng, const float *xp,
                                                          const float *dyo, float *dw, size_t m0, size_t mb,
                                                          size_t q0, size_t qb)
{
        size_t Q = g->C * g->kh * g->kw, off[QB];
#pragma GCC unroll 4
        for (size_t j = 0; j < qb; j++) {
                size_t q = q0 + j, kx = q % g->kw, ky = q / g->kw % g->kh, c = q / (g->kw * g->kh);
                off[j] = c * g->PS + ky * g->Wp + kx;
        }
        v8 acc[MB][QB];
#pragma GCC unroll 4
        for (size_t i = 0; i < mb; i++)
#pragma GCC unroll 4
                for (size_t j = 0; j < qb; j++)
                        acc[i][j] = BCAST8(0.0f);
        for (size_t e = 0; e < ng; e++) {
                const float *xe = xp + e * g->C * g->PS, *de = dyo + (e * g->M + m0) * g->L;
                for (size_t p = 0; p < g->L; p += VL) {
                        v8 d[MB], xv[QB];
#pragma GCC unroll 4
                        for (size_t i = 0; i < mb; i++)
                                LOAD8(d[i], de + i * g->L + p);
#pragma GCC unroll 4
                        for (size_t j = 0; j < qb; j++)
                                LOAD8(xv[j], xe + off[j] + p);
#pragma GCC unroll 4
                        for (size_t i = 0; i < mb; i++)
#pragma GCC unroll 4
                                for (size_t j = 0; j < qb; j++)
                                        acc[i][j] += d[i] * xv[j];
                }
        }
#pragma GCC unroll 4
        for (size_t i = 0; i < mb; i++)
#pragma GCC unroll 4
                for (size_t j = 0; j < qb; j++)
                        dw[(m0 + i) * Q + q0 + j] += hsum8(&acc[i][j]);
}

DCONV_CLONES
static void filter_grad(const struct plane_geom *g, size_t ng, const float *xp, const float *dyo, float *dw)
{
        size_t Q = g->C * g->kh * g->kw, m = 0;
        for (; m + MB <= g->M; m += MB) {
                size_t q = 0;
                for (; q + QB <= Q; q += QB)
                        dw_tile(g, ng, xp, dyo, dw, m, MB, q, QB);
                for (; q < Q; q++)
                        dw_tile(g, ng, xp, dyo, dw, m, MB, q, 1);
        }
        for (; m < g->M; m++) {
                size_t q = 0;
                for (; q + QB <= Q; q += QB)
                        dw_tile(g, ng, xp, dyo, dw, m, 1, q, QB);
                for (; q < Q; q++)
                        dw_tile(g, ng, xp, dyo, dw, m, 1, q, 1);
        }
}

void gk_dconv_fwd(const struct gk_dconv *d, size_t N, const float *x, const float *w, const float *bias, float *y,
                  float *scratch)
{
        struct plane_geom f;
        plane_geom(&f, d->C, d->H, d->W, d->M, d->kh, d->kw, d->pads[0], d->pads[1], d->pads[2], d->pads[3]);
        float *xp = scratch, *out = xp + f.C * f.PS;
        size_t ohw = f.OH * f.OW;
        for (size_t b = 0; b < N; b++) {
                pad_planes(&f, x + b * f.C * f.H * f.W, xp);
                conv_planes(&f, xp, w, out);
                for (size_t m = 0; m < f.M; m++) {
                        float bm = bias ? bias[m] : 0.0f, *ym = y + (b * f.M + m) * ohw;
                        for (size_t oy = 0; oy < f.OH; oy++) {
                                const float *o = out + m * f.L + oy * f.Wp;
                                for (size_t ox = 0; ox < f.OW; ox++)
                                        ym[oy * f.OW + ox] = o[ox] + bm;
                        }
                }
        }
}

void gk_dconv_bwd(const struct gk_dconv *d, size_t N, const float *x, const float *w, const float *dy, float *dx,
                  bool dx_set, float *dw, bool dw_set, float *scratch)
{
        struct plane_geom f, b;
        dconv_geoms(d, &f, &b);
        size_t G = dw_chunk(&f, N);
        float *xp = scratch, *dyo = xp + G * f.C * f.PS, *dyp = dyo + G * f.M * f.L, *out = dyp + b.C * b.PS;
        float *wt = out + b.M * b.L;
        size_t ohw = f.OH * f.OW, hw = f.H * f.W, kk = d->kh * d->kw;
        if (dw && dw_set)
                memset(dw, 0, sizeof(float) * d->M * d->C * kk);
        if (dx) /* wt (C, M, kh, kw): W transposed, each kernel flipped */
                for (size_t m = 0; m < d->M; m++)
                        for (size_t c = 0; c < d->C; c++)
                                for (size_t k = 0; k < kk; k++)
                                        wt[(c * d->M + m) * kk + kk - 1 - k] = w[(m * d->C + c) * kk + k];
        for (size_t n0 = 0; n0 < N; n0 += G) {
                size_t ng = N - n0 < G ? N - n0 : G;
                for (size_t e = 0; e < ng; e++) {
                        size_t n = n0 + e;
                        const float *dyn = dy + n * f.M * ohw;
                        if (dw) {
                                float *de = dyo + e * f.M * f.L;
                                pad_planes(&f, x + n * f.C * hw, xp + e * f.C * f.PS);
                                memset(de, 0, sizeof(float) * f.M * f.L);
                                for (size_t m = 0; m < f.M; m++)
                                        for (size_t oy = 0; oy < f.OH; oy++)
                                                memcpy(de + m * f.L + oy * f.Wp, dyn + m * ohw + oy * f.OW,
                                                       sizeof(float) * f.OW);
                        }
                        if (!dx)
                                continue;
                        pad_planes(&b, dyn, dyp);
                        conv_planes(&b, dyp, wt, out);
                        float *dxn = dx + n * f.C * hw;
                        for (size_t c = 0; c < f.C; c++)
                                for (size_t y = 0; y < f.H; y++) {
                                        const float *o = out + c * b.L + y * b.Wp;
                                        float *r = dxn + c * hw + y * f.W;
                                        if (dx_set)
                                                memcpy(r, o, sizeof(float) * f.W);
                                        else
                                                for (size_t i = 0; i < f.W; i++)
                                                        r[i] += o[i];
                                }
                }
                if (dw)
                        filter_grad(&f, ng, xp, dyo, dw);
        }
}
