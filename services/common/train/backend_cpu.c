/* The CPU backend: OpenBLAS sgemm for every matrix product, plain C loops for the rest. It is the
 * reference implementation other backends are tested against, so it favours obvious code. */
#include "backend.h"
#include "graph-internal.h"
#include "argmax.h"

#include <assert.h>
#include <cblas.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- pure kernels (no allocation, no globals) ---- */

/* Elementwise kernels run in blocks of 8: each block loads into a local array before storing, so
 * in-place calls are well defined and GCC's -O2 (very-cheap vectorizer cost model) emits branch-free
 * SIMD; a plain `x > 0 ? x : 0` loop compiles to a branch that mispredicts half the time. */
#define BLK 8

/* The element-wise ops: the activations of y, their gradients from their outputs y and the incoming
 * dy, and a sum (col2im's accumulation). */
enum ew { EW_RELU, EW_TANH, EW_SIGMOID, EW_RELU_GRAD, EW_TANH_GRAD, EW_SIGMOID_GRAD, EW_ADD };

static inline __attribute__((always_inline)) float ew_one(enum ew op, float y, float dy)
{
        switch (op) {
        case EW_RELU:
                return y > 0.0f ? y : 0.0f;
        case EW_TANH:
                return tanhf(y);
        case EW_SIGMOID:
                return 1.0f / (1.0f + expf(-y));
        case EW_RELU_GRAD:
                return y > 0.0f ? dy : 0.0f; /* dy loaded unconditionally, so the select is branch-free */
        case EW_TANH_GRAD:
                return dy * (1.0f - y * y);
        case EW_SIGMOID_GRAD:
                return dy * y * (1.0f - y);
        case EW_ADD:
                return y + dy;
        }
        return 0.0f;
}

/* out = op(y, dy), a block at a time through a temporary so that GCC vectorises the selects. Always
 * inlined: op is a constant at each call, so each op gets its own loop, as if written out. */
static inline __attribute__((always_inline)) void ew_apply(enum ew op, const float *y, const float *dy, float *out,
                                                           size_t n)
{
        size_t i = 0;
        for (; i + BLK <= n; i += BLK) {
                float t[BLK];
                for (int j = 0; j < BLK; j++)
                        t[j] = ew_one(op, y[i + j], dy[i + j]);
                for (int j = 0; j < BLK; j++)
                        out[i + j] = t[j];
        }
        for (; i < n; i++)
                out[i] = ew_one(op, y[i], dy[i]);
}

static void cpu_gemm_k(bool ta, bool tb, uint32_t M, uint32_t N, uint32_t K, float alpha, const float *A,
                       uint32_t lda, const float *B, uint32_t ldb, float beta, float *C, uint32_t ldc)
{
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C,
                    (blasint)ldc);
}

static void add_bias_rows_k(float *y /* (rows, n) */, const float *bias /* (n) */, uint32_t rows,
                            uint32_t n)
{
        for (uint32_t r = 0; r < rows; r++) {
                float *yr = y + (size_t)r * n;
                for (uint32_t j = 0; j < n; j++)
                        yr[j] += bias[j];
        }
}

static void bias_grad_k(const float *dy /* (rows, n) */, float *db /* (n) */, uint32_t rows, uint32_t n)
{
        memset(db, 0, sizeof(float) * n);
        for (uint32_t r = 0; r < rows; r++) {
                const float *dr = dy + (size_t)r * n;
                for (uint32_t j = 0; j < n; j++)
                        db[j] += dr[j];
        }
}

static void softmax_xent_fwd_k(const float *logits /* (B, C) */, const uint8_t *labels /* (B) */,
                               uint32_t B, uint32_t C, float *probs /* (B, C) */, float *loss_ret)
{
        double loss = 0.0;
        for (uint32_t b = 0; b < B; b++) {
                const float *l = logits + (size_t)b * C;
                float *p = probs + (size_t)b * C;
                float mx = -INFINITY;
                for (uint32_t c = 0; c < C; c++)
                        mx = l[c] > mx ? l[c] : mx;
                float sum = 0.0f;
                for (uint32_t c = 0; c < C; c++) {
                        p[c] = expf(l[c] - mx);
                        sum += p[c];
                }
                float inv = 1.0f / sum;
                for (uint32_t c = 0; c < C; c++)
                        p[c] *= inv;
                /* log-sum-exp form: finite even when p[label] underflows. The difference first: with
                 * logits of 1e29, log(sum) + mx rounds log(sum) away, and a blown-up model whose
                 * logits are all alike reported a loss of exactly 0 */
                loss += (double)logf(sum) + ((double)mx - (double)l[labels[b]]);
        }
        *loss_ret = (float)(loss / B);
}

static void softmax_xent_bwd_k(const float *probs, const uint8_t *labels, uint32_t B, uint32_t C,
                               float *dlogits)
{
        float inv_b = 1.0f / (float)B;
        for (uint32_t b = 0; b < B; b++) {
                const float *p = probs + (size_t)b * C;
                float *d = dlogits + (size_t)b * C;
                for (uint32_t c = 0; c < C; c++)
                        d[c] = p[c] * inv_b;
                d[labels[b]] -= inv_b;
        }
}

static uint32_t correct_count_k(const float *scores, const uint8_t *labels, uint32_t B, uint32_t C)
{
        uint32_t correct = 0;
        for (uint32_t b = 0; b < B; b++)
                correct += row_argmax(scores + (size_t)b * C, C) == labels[b];
        return correct;
}

/* The logistic head on one output per example. */
static void logistic_xent_fwd_k(const float *z, const float *y, uint32_t B, float *probs, float *loss_ret,
                                uint32_t *correct_ret)
{
        double loss = 0.0;
        uint32_t correct = 0;
        for (uint32_t b = 0; b < B; b++) {
                /* exp of -|z| only: no overflow whatever the logit, and log1p keeps the small losses */
                double e = exp(-fabs((double)z[b]));
                loss += (z[b] > 0 ? (double)z[b] : 0.0) - (double)z[b] * y[b] + log1p(e);
                probs[b] = (float)(z[b] >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e));
                correct += (probs[b] > 0.5f) == (y[b] > 0.5f);
        }
        *loss_ret = (float)(loss / B);
        if (correct_ret)
                *correct_ret = correct;
}

/* d = (a - y) * scale: the logistic head's gradient (a: probabilities, scale 1/B) and the MSE's (a:
 * predictions, scale 2/B). */
static void diff_scale_k(const float *a, const float *y, uint32_t B, float scale, float *d)
{
        for (uint32_t b = 0; b < B; b++)
                d[b] = (a[b] - y[b]) * scale;
}

static void mse_fwd_k(const float *pred, const float *y, uint32_t B, float *loss_ret)
{
        double loss = 0.0;
        for (uint32_t b = 0; b < B; b++)
                loss += ((double)pred[b] - y[b]) * ((double)pred[b] - y[b]);
        *loss_ret = (float)(loss / B);
}

/* Convolution as im2col + one sgemm per chunk of G examples. The chunk's columns sit side by side:
 * col (C*k*k, G*H*W), col[(c, ky, kx), j*H*W + y*W + x] = img_j[c, y + ky - pad, x + kx - pad] (0
 * outside), pad = (k - 1) / 2 (TF's "same": an even kernel gets the extra row/column after). With
 * stride 1 each row of col is its input channel shifted as a whole, so im2col is one memcpy per row
 * plus the zeroed borders, and col2im one vectorized add per row: per-element index arithmetic and
 * row-sized library calls cost more than the sgemm they feed. */

/* Examples per chunk: col about the size of a core's L2 (1 MiB), so that im2col's output is still in
 * cache when the sgemm reads it. Measured on the CNN of examples/fmnist-cnn.json (2 cores, batch 64):
 * 0.6 to 1.6 MiB chunks are best; 4 and 16 MiB lose 10 to 25 %. Layers whose col for one example is
 * that large already (conv 5x5x64 on 14x14: 0.6 MiB) run one example per sgemm; small ones (the first
 * conv: 25 rows) batch a dozen examples into one wider product. */
#define CONV_CHUNK_FLOATS ((size_t)1 << 18)

static uint32_t conv_chunk(uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t k)
{
        size_t per = (size_t)C * k * k * H * W;
        size_t g = per ? CONV_CHUNK_FLOATS / per : B;
        return g < 1 ? 1 : g > B ? B : (uint32_t)g;
}

/* The x range [x0, x1) whose source column x + d lies inside [0, W). */
static void valid_cols(int d, uint32_t W, uint32_t *x0, uint32_t *x1)
{
        int a = d < 0 ? -d : 0, z = d > 0 ? (int)W - d : (int)W;
        *x0 = (uint32_t)(a < (int)W ? a : (int)W);
        *x1 = (uint32_t)(z > a ? z : a);
}

/* One im2col row (c, ky, kx) covers the whole channel image shifted by (dy, d) = (ky - pad, kx - pad):
 * out[y*W + x] = in[(y + dy)*W + x + d], in flat terms out[i] = in[i + off] with off = dy*W + d. The
 * flat range [lo, hi) where the source index stays inside the channel is copied in one piece; then the
 * columns whose x + d falls outside [0, W) (they read a neighbouring row) are zeroed, as are the rows
 * outside the image. */
struct shift {
        long off;
        size_t lo, hi;      /* flat range copied */
        uint32_t y0, y1;    /* rows inside the image */
        uint32_t x0, x1;    /* columns inside the image */
};

static void shift_plan(uint32_t H, uint32_t W, int dy, int d, struct shift *s)
{
        long HW = (long)H * W, off = (long)dy * W + d;
        int y0 = dy < 0 ? -dy : 0, y1 = dy > 0 ? (int)H - dy : (int)H;
        if (y1 < y0)
                y1 = y0;
        s->y0 = (uint32_t)(y0 < (int)H ? y0 : (int)H);
        s->y1 = (uint32_t)(y1 < (int)H ? y1 : (int)H);
        long lo = (long)s->y0 * W, hi = (long)s->y1 * W;
        lo = lo > -off ? lo : -off;
        hi = hi < HW - off ? hi : HW - off;
        s->off = off;
        s->lo = (size_t)(lo < 0 ? 0 : lo);
        s->hi = (size_t)(hi > lo ? hi : lo);
        valid_cols(d, W, &s->x0, &s->x1);
}

/* Zeroes, in rows [y0, y1) of an (H, W) plane, the columns outside [x0, x1): where a shift by a
 * kernel offset reads padding. */
static inline void zero_margins(float *plane, uint32_t W, const struct shift *s)
{
        if (s->x0 == 0 && s->x1 == W)
                return;
        for (uint32_t y = s->y0; y < s->y1; y++) {
                float *r = plane + (size_t)y * W;
                for (uint32_t x = 0; x < s->x0; x++)
                        r[x] = 0.0f;
                for (uint32_t x = s->x1; x < W; x++)
                        r[x] = 0.0f;
        }
}

/* One example's kernel offsets, both ways: to_col, im2col (img's shifted planes into its column block
 * of col, row stride ld floats, padding zeroed); else its adjoint, img += scatter(the column block),
 * zeroing first the entries of col that im2col would have zeroed, so that one flat add per row is
 * exact. Always inlined: each direction gets its own loop. */
static inline __attribute__((always_inline)) void shifts_k(bool to_col, float *img /* (C, H, W) */, uint32_t C,
                                                           uint32_t H, uint32_t W, uint32_t k, float *col, size_t ld)
{
        int pad = (int)(k - 1) / 2;
        size_t HW = (size_t)H * W;
        for (uint32_t ky = 0; ky < k; ky++)
                for (uint32_t kx = 0; kx < k; kx++) {
                        struct shift s;
                        shift_plan(H, W, (int)ky - pad, (int)kx - pad, &s);
                        for (uint32_t c = 0; c < C; c++) {
                                float *row = col + ((size_t)(c * k + ky) * k + kx) * ld;
                                float *plane = img + (size_t)c * HW;
                                if (to_col) {
                                        memset(row, 0, sizeof(float) * s.lo);
                                        memcpy(row + s.lo, plane + (long)s.lo + s.off, sizeof(float) * (s.hi - s.lo));
                                        memset(row + s.hi, 0, sizeof(float) * (HW - s.hi));
                                        zero_margins(row, W, &s);
                                } else {
                                        zero_margins(row, W, &s);
                                        /* plane[i + off] += row[i] for i in [lo, hi); lo + off >= 0 */
                                        float *out = plane + (size_t)((long)s.lo + s.off);
                                        ew_apply(EW_ADD, out, row + s.lo, out, s.hi - s.lo);
                                }
                        }
                }
}

static void im2col_k(const float *img /* (C, H, W) */, uint32_t C, uint32_t H, uint32_t W, uint32_t k,
                     float *col, size_t ld)
{
        shifts_k(true, (float *)img /* only read */, C, H, W, k, col, ld);
}

static void col2im_add_k(float *col, size_t ld, uint32_t C, uint32_t H, uint32_t W, uint32_t k,
                         float *img /* (C, H, W) */)
{
        shifts_k(false, img, C, H, W, k, col, ld);
}

/* G: examples per chunk; col holds C*k*k*G*H*W floats, tmp (unused when G == 1) F*G*H*W. */
static void conv2d_fwd_k(const float *x, const float *w /* (F, C*k*k) */, const float *bias /* (F) */,
                         float *y, uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k,
                         uint32_t G, float *col, float *tmp)
{
        uint32_t HW = H * W, CKK = C * k * k;
        for (uint32_t b0 = 0; b0 < B; b0 += G) {
                uint32_t g = B - b0 < G ? B - b0 : G;
                size_t ld = (size_t)g * HW;
                for (uint32_t j = 0; j < g; j++)
                        im2col_k(x + (size_t)(b0 + j) * C * HW, C, H, W, k, col + (size_t)j * HW, ld);
                if (g == 1) {
                        /* straight into y_b (F, HW), bias first */
                        float *yb = y + (size_t)b0 * F * HW;
                        for (uint32_t f = 0; f < F; f++)
                                for (uint32_t i = 0; i < HW; i++)
                                        yb[(size_t)f * HW + i] = bias[f];
                        cpu_gemm_k(false, false, F, HW, CKK, 1.0f, w, CKK, col, HW, 1.0f, yb, HW);
                        continue;
                }
                /* tmp (F, g*HW) = w @ col, then y_{b0+j}[f] = tmp[f, j*HW ...] + bias[f] */
                cpu_gemm_k(false, false, F, (uint32_t)ld, CKK, 1.0f, w, CKK, col, (uint32_t)ld, 0.0f, tmp, (uint32_t)ld);
                for (uint32_t j = 0; j < g; j++)
                        for (uint32_t f = 0; f < F; f++) {
                                const float *src = tmp + (size_t)f * ld + (size_t)j * HW;
                                float *dst = y + ((size_t)(b0 + j) * F + f) * HW;
                                float bf = bias[f];
                                uint32_t i = 0;
                                for (; i + BLK <= HW; i += BLK)
                                        for (int t = 0; t < BLK; t++)
                                                dst[i + t] = src[i + t] + bf;
                                for (; i < HW; i++)
                                        dst[i] = src[i] + bf;
                        }
        }
}

static void conv2d_bwd_k(const float *x, const float *w, const float *dy, float *dw, float *db, float *dx,
                         uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k,
                         uint32_t G, float *col, float *tmp)
{
        uint32_t HW = H * W, CKK = C * k * k;
        memset(db, 0, sizeof(float) * F);
        for (uint32_t b0 = 0; b0 < B; b0 += G) {
                uint32_t g = B - b0 < G ? B - b0 : G;
                size_t ld = (size_t)g * HW;
                const float *dyt; /* (F, g*HW): this chunk's dy with the examples side by side */
                if (g == 1) {
                        dyt = dy + (size_t)b0 * F * HW;
                } else {
                        for (uint32_t j = 0; j < g; j++)
                                for (uint32_t f = 0; f < F; f++)
                                        memcpy(tmp + (size_t)f * ld + (size_t)j * HW,
                                               dy + ((size_t)(b0 + j) * F + f) * HW, sizeof(float) * HW);
                        dyt = tmp;
                }
                for (uint32_t f = 0; f < F; f++) {
                        /* eight partial sums: SIMD, and no chain of dependent adds */
                        const float *r = dyt + (size_t)f * ld;
                        float p[BLK] = { 0 };
                        size_t i = 0;
                        for (; i + BLK <= ld; i += BLK)
                                for (int t = 0; t < BLK; t++)
                                        p[t] += r[i + t];
                        float s = 0.0f;
                        for (; i < ld; i++)
                                s += r[i];
                        for (int t = 0; t < BLK; t++)
                                s += p[t];
                        db[f] += s;
                }
                for (uint32_t j = 0; j < g; j++)
                        im2col_k(x + (size_t)(b0 + j) * C * HW, C, H, W, k, col + (size_t)j * HW, ld);
                /* dw (F, CKK) (+)= dyt (F, g*HW) @ col^T (g*HW, CKK) */
                cpu_gemm_k(false, true, F, CKK, (uint32_t)ld, 1.0f, dyt, (uint32_t)ld, col, (uint32_t)ld,
                           b0 == 0 ? 0.0f : 1.0f, dw, CKK);
                if (dx) {
                        /* dcol (CKK, g*HW) = w^T (CKK, F) @ dyt (F, g*HW), reusing col */
                        cpu_gemm_k(true, false, CKK, (uint32_t)ld, F, 1.0f, w, CKK, dyt, (uint32_t)ld, 0.0f, col,
                                   (uint32_t)ld);
                        for (uint32_t j = 0; j < g; j++) {
                                float *dxb = dx + (size_t)(b0 + j) * C * HW;
                                memset(dxb, 0, sizeof(float) * C * HW);
                                col2im_add_k(col + (size_t)j * HW, ld, C, H, W, k, dxb);
                        }
                }
        }
}

/* Max pooling, window = stride = p. p == 2 (the common case) has its own loops, same results. */
static void maxpool2d_fwd_k(const float *x, float *y, uint32_t B, uint32_t C, uint32_t H, uint32_t W,
                            uint32_t p)
{
        uint32_t OH = H / p, OW = W / p;
        for (size_t bc = 0; bc < (size_t)B * C; bc++) {
                const float *xi = x + bc * H * W;
                float *yo = y + bc * OH * OW;
                for (uint32_t oy = 0; oy < OH; oy++) {
                        float *yr = yo + (size_t)oy * OW;
                        if (p == 2) {
                                const float *r0 = xi + (size_t)(2 * oy) * W, *r1 = r0 + W;
                                for (uint32_t ox = 0; ox < OW; ox++) {
                                        float a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];
                                        float m = b > a ? b : a;
                                        m = c > m ? c : m;
                                        yr[ox] = d > m ? d : m;
                                }
                                continue;
                        }
                        for (uint32_t ox = 0; ox < OW; ox++) {
                                float m = -INFINITY;
                                for (uint32_t dy = 0; dy < p; dy++)
                                        for (uint32_t dx = 0; dx < p; dx++) {
                                                float v = xi[(size_t)(oy * p + dy) * W + ox * p + dx];
                                                m = v > m ? v : m;
                                        }
                                yr[ox] = m;
                        }
                }
        }
}

/* Windows don't overlap, so every dx entry is written once: dy at the window's first maximum, 0 at
 * the rest of the window and in the rows and columns no window covers. */
static void maxpool2d_bwd_k(const float *x, const float *dy, float *dx, uint32_t B, uint32_t C,
                            uint32_t H, uint32_t W, uint32_t p)
{
        uint32_t OH = H / p, OW = W / p;
        for (size_t bc = 0; bc < (size_t)B * C; bc++) {
                const float *xi = x + bc * H * W;
                const float *dyo = dy + bc * OH * OW;
                float *dxi = dx + bc * H * W;
                for (uint32_t oy = 0; oy < OH; oy++) {
                        const float *g = dyo + (size_t)oy * OW;
                        if (p == 2) {
                                const float *r0 = xi + (size_t)(2 * oy) * W, *r1 = r0 + W;
                                float *d0 = dxi + (size_t)(2 * oy) * W, *d1 = d0 + W;
                                for (uint32_t ox = 0; ox < OW; ox++) {
                                        uint32_t i = 2 * ox;
                                        float a = r0[i], b = r0[i + 1], c = r1[i], d = r1[i + 1], v = g[ox];
                                        int best = 0;
                                        float m = a;
                                        if (b > m)
                                                m = b, best = 1;
                                        if (c > m)
                                                m = c, best = 2;
                                        if (d > m)
                                                best = 3;
                                        d0[i] = best == 0 ? v : 0.0f;
                                        d0[i + 1] = best == 1 ? v : 0.0f;
                                        d1[i] = best == 2 ? v : 0.0f;
                                        d1[i + 1] = best == 3 ? v : 0.0f;
                                }
                        } else {
                                for (uint32_t ox = 0; ox < OW; ox++) {
                                        size_t best = window_argmax(xi, W, p, oy, ox);
                                        for (uint32_t wy = 0; wy < p; wy++)
                                                memset(dxi + (size_t)(oy * p + wy) * W + ox * p, 0, sizeof(float) * p);
                                        dxi[best] = g[ox];
                                }
                        }
                        for (uint32_t wy = 0; wy < p; wy++) /* columns past the last window */
                                for (uint32_t xx = OW * p; xx < W; xx++)
                                        dxi[(size_t)(oy * p + wy) * W + xx] = 0.0f;
                }
                memset(dxi + (size_t)OH * p * W, 0, sizeof(float) * (H - OH * p) * W); /* rows past them */
        }
}

/* ---- the table ---- */

/* The backend's own state: a scratch area for chunked convolution, grown (never shrunk) at the first
 * pass that needs it; device_model_new runs that pass before training. */
struct cpu_ctx {
        float *scratch;
        size_t scratch_floats;
};

static void cpu_free(struct backend *be)
{
        struct cpu_ctx *c = be->ctx;
        if (c)
                free(c->scratch);
        free(c);
}

/* Examples per chunk, and col/tmp for them: the scratch area when it can hold a chunk of G > 1,
 * else one example in the caller's workspace (G = 1 needs no tmp). */
static uint32_t conv_buffers(struct backend *be, uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F,
                             uint32_t k, float *ws, float **col, float **tmp)
{
        struct cpu_ctx *c = be->ctx;
        uint32_t G = conv_chunk(B, C, H, W, k);
        size_t need = (size_t)G * H * W * ((size_t)C * k * k + F);
        if (G > 1 && need > c->scratch_floats) {
                float *p = aligned_alloc(64, (need * sizeof(float) + 63) & ~(size_t)63);
                if (p) {
                        free(c->scratch);
                        c->scratch = p;
                        c->scratch_floats = need;
                }
        }
        if (G == 1 || need > c->scratch_floats) {
                *col = ws;
                *tmp = NULL;
                return 1;
        }
        *col = c->scratch;
        *tmp = c->scratch + (size_t)G * C * k * k * H * W;
        return G;
}

static void *cpu_alloc(struct backend *be, size_t bytes)
{
        /* 64-byte aligned for the vector units; calloc semantics. */
        size_t sz = (bytes + 63) & ~(size_t)63;
        void *p = aligned_alloc(64, sz ? sz : 64);
        if (p)
                memset(p, 0, sz ? sz : 64);
        return p;
}

static void cpu_buf_free(struct backend *be, void *buf)
{
        free(buf);
}

static int cpu_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
        if (dst != src && bytes)
                memcpy(dst, src, bytes);
        return 0;
}

static int cpu_memset0(struct backend *be, void *dst, size_t bytes)
{
        memset(dst, 0, bytes);
        return 0;
}

static int cpu_sync(struct backend *be)
{
        return 0;
}

static int cpu_gemm(struct backend *be, bool ta, bool tb, uint32_t M, uint32_t N, uint32_t K, float alpha,
                    const void *A, uint32_t lda, const void *B, uint32_t ldb, float beta, void *C,
                    uint32_t ldc)
{
        cpu_gemm_k(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return 0;
}

static int cpu_add_bias_rows(struct backend *be, void *y, const void *bias, uint32_t rows, uint32_t n)
{
        add_bias_rows_k(y, bias, rows, n);
        return 0;
}

static int cpu_bias_grad(struct backend *be, const void *dy, void *db, uint32_t rows, uint32_t n)
{
        bias_grad_k(dy, db, rows, n);
        return 0;
}


/* The activations and their gradients, each one ew_apply (their names are what the ops table uses). */
#define EW_FWD(fn, op)                                                                   \
        static int fn(struct backend *be, const void *x, void *y, size_t n)              \
        {                                                                                \
                ew_apply(op, x, x, y, n);                                                \
                return 0;                                                                \
        }
#define EW_BWD(fn, op)                                                                   \
        static int fn(struct backend *be, const void *y, const void *dy, void *dx, size_t n) \
        {                                                                                \
                ew_apply(op, y, dy, dx, n);                                              \
                return 0;                                                                \
        }
EW_FWD(cpu_relu_fwd, EW_RELU)
EW_BWD(cpu_relu_bwd, EW_RELU_GRAD)
EW_FWD(cpu_tanh_fwd, EW_TANH)
EW_BWD(cpu_tanh_bwd, EW_TANH_GRAD)
EW_FWD(cpu_sigmoid_fwd, EW_SIGMOID)
EW_BWD(cpu_sigmoid_bwd, EW_SIGMOID_GRAD)

static int cpu_softmax_xent_fwd(struct backend *be, const void *logits, const void *labels, uint32_t B,
                                uint32_t C, void *probs, float *loss_ret)
{
        softmax_xent_fwd_k(logits, labels, B, C, probs, loss_ret);
        return 0;
}

static int cpu_softmax_xent_bwd(struct backend *be, const void *probs, const void *labels, uint32_t B,
                                uint32_t C, void *dlogits)
{
        softmax_xent_bwd_k(probs, labels, B, C, dlogits);
        return 0;
}

static int cpu_correct_count(struct backend *be, const void *scores, const void *labels, uint32_t B,
                             uint32_t C, uint32_t *correct_ret)
{
        *correct_ret = correct_count_k(scores, labels, B, C);
        return 0;
}

static int cpu_conv2d_fwd(struct backend *be, const void *x, const void *w, const void *b, void *y,
                          uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k, void *col)
{
        float *cb, *tmp;
        uint32_t G = conv_buffers(be, B, C, H, W, F, k, col, &cb, &tmp);
        conv2d_fwd_k(x, w, b, y, B, C, H, W, F, k, G, cb, tmp);
        return 0;
}

static int cpu_conv2d_bwd(struct backend *be, const void *x, const void *w, const void *dy, void *dw,
                          void *db, void *dx, uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F,
                          uint32_t k, void *col)
{
        float *cb, *tmp;
        uint32_t G = conv_buffers(be, B, C, H, W, F, k, col, &cb, &tmp);
        conv2d_bwd_k(x, w, dy, dw, db, dx, B, C, H, W, F, k, G, cb, tmp);
        return 0;
}

static int cpu_maxpool2d_fwd(struct backend *be, const void *x, void *y, uint32_t B, uint32_t C,
                             uint32_t H, uint32_t W, uint32_t p)
{
        maxpool2d_fwd_k(x, y, B, C, H, W, p);
        return 0;
}

static int cpu_maxpool2d_bwd(struct backend *be, const void *x, const void *dy, void *dx, uint32_t B,
                             uint32_t C, uint32_t H, uint32_t W, uint32_t p)
{
        maxpool2d_bwd_k(x, dy, dx, B, C, H, W, p);
        return 0;
}

static int cpu_logistic_xent_fwd(struct backend *be, const void *logits, const void *labels, uint32_t B, void *probs,
                                 float *loss_ret, uint32_t *correct_ret)
{
        logistic_xent_fwd_k(logits, labels, B, probs, loss_ret, correct_ret);
        return 0;
}

static int cpu_logistic_xent_bwd(struct backend *be, const void *probs, const void *labels, uint32_t B,
                                 void *dlogits)
{
        diff_scale_k(probs, labels, B, 1.0f / (float)B, dlogits);
        return 0;
}

static int cpu_mse_fwd(struct backend *be, const void *pred, const void *labels, uint32_t B, float *loss_ret)
{
        mse_fwd_k(pred, labels, B, loss_ret);
        return 0;
}

static int cpu_mse_bwd(struct backend *be, const void *pred, const void *labels, uint32_t B, void *dpred)
{
        diff_scale_k(pred, labels, B, 2.0f / (float)B, dpred);
        return 0;
}

static const struct backend_ops cpu_ops = {
        .name = "cpu",
        .host_memory = true,
        .free = cpu_free,
        .alloc = cpu_alloc,
        .buf_free = cpu_buf_free,
        .upload = cpu_copy,
        .download = cpu_copy,
        .memset0 = cpu_memset0,
        .synchronize = cpu_sync,
        .gemm = cpu_gemm,
        .add_bias_rows = cpu_add_bias_rows,
        .bias_grad = cpu_bias_grad,
        .relu_fwd = cpu_relu_fwd,
        .relu_bwd = cpu_relu_bwd,
        .tanh_fwd = cpu_tanh_fwd,
        .tanh_bwd = cpu_tanh_bwd,
        .sigmoid_fwd = cpu_sigmoid_fwd,
        .sigmoid_bwd = cpu_sigmoid_bwd,
        .softmax_xent_fwd = cpu_softmax_xent_fwd,
        .softmax_xent_bwd = cpu_softmax_xent_bwd,
        .correct_count = cpu_correct_count,
        .conv2d_fwd = cpu_conv2d_fwd,
        .conv2d_bwd = cpu_conv2d_bwd,
        .maxpool2d_fwd = cpu_maxpool2d_fwd,
        .maxpool2d_bwd = cpu_maxpool2d_bwd,
        .logistic_xent_fwd = cpu_logistic_xent_fwd,
        .logistic_xent_bwd = cpu_logistic_xent_bwd,
        .mse_fwd = cpu_mse_fwd,
        .mse_bwd = cpu_mse_bwd,
        .graph = &graph_kernels_cpu,
};

int backend_cpu_new(unsigned threads, struct backend **ret)
{
        struct backend *be = calloc(1, sizeof(*be));
        struct cpu_ctx *c = calloc(1, sizeof(*c));
        if (!be || !c) {
                free(be);
                free(c);
                return -ENOMEM;
        }
        be->ops = &cpu_ops;
        be->ctx = c;
        if (threads > 0)
                openblas_set_num_threads((int)threads);
        *ret = be;
        return 0;
}

struct backend *backend_free(struct backend *be)
{
        if (!be)
                return NULL;
        if (be->ops->free)
                be->ops->free(be);
        free(be);
        return NULL;
}

const char *backend_name(const struct backend *be)
{
        return be->ops->name;
}

bool backend_host_memory(const struct backend *be)
{
        return be->ops->host_memory;
}
