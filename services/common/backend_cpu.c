/* The CPU backend: OpenBLAS sgemm for every matrix product, plain C loops for the rest. It is the
 * reference implementation other backends are tested against, so it favours obvious code. */
#include "backend.h"

#include <assert.h>
#include <cblas.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- pure kernels (no allocation, no globals) ---- */

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
                /* log-sum-exp form: finite even when p[label] underflows */
                loss += (double)logf(sum) + (double)mx - (double)l[labels[b]];
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
        for (uint32_t b = 0; b < B; b++) {
                const float *s = scores + (size_t)b * C;
                uint32_t best = 0;
                for (uint32_t c = 1; c < C; c++)
                        if (s[c] > s[best])
                                best = c;
                correct += best == labels[b];
        }
        return correct;
}

/* col (C*k*k, H*W): col[(c, ky, kx), (y, x)] = img[c, y + ky - pad, x + kx - pad], 0 outside. */
static void im2col_k(const float *img /* (C, H, W) */, uint32_t C, uint32_t H, uint32_t W, uint32_t k,
                     float *col)
{
        int pad = (int)(k - 1) / 2;
        for (uint32_t c = 0; c < C; c++)
                for (uint32_t ky = 0; ky < k; ky++)
                        for (uint32_t kx = 0; kx < k; kx++) {
                                float *row = col + ((size_t)(c * k + ky) * k + kx) * H * W;
                                for (uint32_t y = 0; y < H; y++) {
                                        int sy = (int)y + (int)ky - pad;
                                        float *out = row + (size_t)y * W;
                                        if (sy < 0 || sy >= (int)H) {
                                                memset(out, 0, sizeof(float) * W);
                                                continue;
                                        }
                                        const float *in = img + ((size_t)c * H + (size_t)sy) * W;
                                        for (uint32_t x = 0; x < W; x++) {
                                                int sx = (int)x + (int)kx - pad;
                                                out[x] = (sx < 0 || sx >= (int)W) ? 0.0f : in[sx];
                                        }
                                }
                        }
}

/* The adjoint of im2col: img += scatter(col). */
static void col2im_add_k(const float *col, uint32_t C, uint32_t H, uint32_t W, uint32_t k,
                         float *img /* (C, H, W) */)
{
        int pad = (int)(k - 1) / 2;
        for (uint32_t c = 0; c < C; c++)
                for (uint32_t ky = 0; ky < k; ky++)
                        for (uint32_t kx = 0; kx < k; kx++) {
                                const float *row = col + ((size_t)(c * k + ky) * k + kx) * H * W;
                                for (uint32_t y = 0; y < H; y++) {
                                        int sy = (int)y + (int)ky - pad;
                                        if (sy < 0 || sy >= (int)H)
                                                continue;
                                        const float *in = row + (size_t)y * W;
                                        float *out = img + ((size_t)c * H + (size_t)sy) * W;
                                        for (uint32_t x = 0; x < W; x++) {
                                                int sx = (int)x + (int)kx - pad;
                                                if (sx >= 0 && sx < (int)W)
                                                        out[sx] += in[x];
                                        }
                                }
                        }
}

static void conv2d_fwd_k(const float *x, const float *w /* (F, C*k*k) */, const float *bias /* (F) */,
                         float *y, uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k,
                         float *col)
{
        uint32_t HW = H * W, CKK = C * k * k;
        for (uint32_t b = 0; b < B; b++) {
                const float *xb = x + (size_t)b * C * HW;
                float *yb = y + (size_t)b * F * HW; /* (F, HW) */
                for (uint32_t f = 0; f < F; f++)
                        for (uint32_t i = 0; i < HW; i++)
                                yb[(size_t)f * HW + i] = bias[f];
                im2col_k(xb, C, H, W, k, col);
                cpu_gemm_k(false, false, F, HW, CKK, 1.0f, w, CKK, col, HW, 1.0f, yb, HW);
        }
}

static void conv2d_bwd_k(const float *x, const float *w, const float *dy, float *dw, float *db, float *dx,
                         uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k,
                         float *col)
{
        uint32_t HW = H * W, CKK = C * k * k;
        memset(db, 0, sizeof(float) * F);
        for (uint32_t b = 0; b < B; b++) {
                const float *xb = x + (size_t)b * C * HW;
                const float *dyb = dy + (size_t)b * F * HW; /* (F, HW) */
                for (uint32_t f = 0; f < F; f++) {
                        const float *r = dyb + (size_t)f * HW;
                        float s = 0.0f;
                        for (uint32_t i = 0; i < HW; i++)
                                s += r[i];
                        db[f] += s;
                }
                im2col_k(xb, C, H, W, k, col);
                /* dw (F, CKK) (+)= dy_b (F, HW) @ col^T (HW, CKK) */
                cpu_gemm_k(false, true, F, CKK, HW, 1.0f, dyb, HW, col, HW, b == 0 ? 0.0f : 1.0f, dw, CKK);
                if (dx) {
                        float *dxb = dx + (size_t)b * C * HW;
                        /* dcol (CKK, HW) = w^T (CKK, F) @ dy_b (F, HW), reusing the workspace */
                        cpu_gemm_k(true, false, CKK, HW, F, 1.0f, w, CKK, dyb, HW, 0.0f, col, HW);
                        memset(dxb, 0, sizeof(float) * C * HW);
                        col2im_add_k(col, C, H, W, k, dxb);
                }
        }
}

static void maxpool2d_fwd_k(const float *x, float *y, uint32_t B, uint32_t C, uint32_t H, uint32_t W,
                            uint32_t p)
{
        uint32_t OH = H / p, OW = W / p;
        for (size_t bc = 0; bc < (size_t)B * C; bc++) {
                const float *xi = x + bc * H * W;
                float *yo = y + bc * OH * OW;
                for (uint32_t oy = 0; oy < OH; oy++)
                        for (uint32_t ox = 0; ox < OW; ox++) {
                                float m = -INFINITY;
                                for (uint32_t dy = 0; dy < p; dy++)
                                        for (uint32_t dx = 0; dx < p; dx++) {
                                                float v = xi[(size_t)(oy * p + dy) * W + ox * p + dx];
                                                m = v > m ? v : m;
                                        }
                                yo[(size_t)oy * OW + ox] = m;
                        }
        }
}

static void maxpool2d_bwd_k(const float *x, const float *dy, float *dx, uint32_t B, uint32_t C,
                            uint32_t H, uint32_t W, uint32_t p)
{
        uint32_t OH = H / p, OW = W / p;
        memset(dx, 0, sizeof(float) * B * C * H * W);
        for (size_t bc = 0; bc < (size_t)B * C; bc++) {
                const float *xi = x + bc * H * W;
                const float *dyo = dy + bc * OH * OW;
                float *dxi = dx + bc * H * W;
                for (uint32_t oy = 0; oy < OH; oy++)
                        for (uint32_t ox = 0; ox < OW; ox++) {
                                size_t best = (size_t)(oy * p) * W + ox * p;
                                for (uint32_t wy = 0; wy < p; wy++)
                                        for (uint32_t wx = 0; wx < p; wx++) {
                                                size_t i = (size_t)(oy * p + wy) * W + ox * p + wx;
                                                if (xi[i] > xi[best])
                                                        best = i;
                                        }
                                dxi[best] += dyo[(size_t)oy * OW + ox];
                        }
        }
}

/* ---- the table ---- */

static void cpu_free(struct backend *be)
{
        (void)be;
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

/* Elementwise kernels run in blocks of 8: each block loads into a local array before storing, so
 * in-place calls are well defined and GCC's -O2 (very-cheap vectorizer cost model) emits branch-free
 * SIMD; a plain `x > 0 ? x : 0` loop compiles to a branch that mispredicts half the time. */
#define BLK 8

static int cpu_relu_fwd(struct backend *be, const void *xv, void *yv, size_t n)
{
        const float *x = xv;
        float *y = yv;
        size_t i = 0;
        for (; i + BLK <= n; i += BLK) {
                float t[BLK];
                for (int j = 0; j < BLK; j++)
                        t[j] = x[i + j] > 0.0f ? x[i + j] : 0.0f;
                for (int j = 0; j < BLK; j++)
                        y[i + j] = t[j];
        }
        for (; i < n; i++)
                y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        return 0;
}

static int cpu_relu_bwd(struct backend *be, const void *yv, const void *dyv, void *dxv, size_t n)
{
        const float *y = yv, *dy = dyv;
        float *dx = dxv;
        size_t i = 0;
        for (; i + BLK <= n; i += BLK) {
                float t[BLK];
                for (int j = 0; j < BLK; j++) {
                        float d = dy[i + j]; /* loaded unconditionally, so the select is branch-free */
                        t[j] = y[i + j] > 0.0f ? d : 0.0f;
                }
                for (int j = 0; j < BLK; j++)
                        dx[i + j] = t[j];
        }
        for (; i < n; i++)
                dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
        return 0;
}

static int cpu_tanh_fwd(struct backend *be, const void *xv, void *yv, size_t n)
{
        const float *x = xv;
        float *y = yv;
        for (size_t i = 0; i < n; i++)
                y[i] = tanhf(x[i]);
        return 0;
}

static int cpu_tanh_bwd(struct backend *be, const void *yv, const void *dyv, void *dxv, size_t n)
{
        const float *y = yv, *dy = dyv;
        float *dx = dxv;
        size_t i = 0;
        for (; i + BLK <= n; i += BLK) {
                float t[BLK];
                for (int j = 0; j < BLK; j++)
                        t[j] = dy[i + j] * (1.0f - y[i + j] * y[i + j]);
                for (int j = 0; j < BLK; j++)
                        dx[i + j] = t[j];
        }
        for (; i < n; i++)
                dx[i] = dy[i] * (1.0f - y[i] * y[i]);
        return 0;
}

static int cpu_sigmoid_fwd(struct backend *be, const void *xv, void *yv, size_t n)
{
        const float *x = xv;
        float *y = yv;
        for (size_t i = 0; i < n; i++)
                y[i] = 1.0f / (1.0f + expf(-x[i]));
        return 0;
}

static int cpu_sigmoid_bwd(struct backend *be, const void *yv, const void *dyv, void *dxv, size_t n)
{
        const float *y = yv, *dy = dyv;
        float *dx = dxv;
        size_t i = 0;
        for (; i + BLK <= n; i += BLK) {
                float t[BLK];
                for (int j = 0; j < BLK; j++)
                        t[j] = dy[i + j] * y[i + j] * (1.0f - y[i + j]);
                for (int j = 0; j < BLK; j++)
                        dx[i + j] = t[j];
        }
        for (; i < n; i++)
                dx[i] = dy[i] * y[i] * (1.0f - y[i]);
        return 0;
}

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
        conv2d_fwd_k(x, w, b, y, B, C, H, W, F, k, col);
        return 0;
}

static int cpu_conv2d_bwd(struct backend *be, const void *x, const void *w, const void *dy, void *dw,
                          void *db, void *dx, uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F,
                          uint32_t k, void *col)
{
        conv2d_bwd_k(x, w, dy, dw, db, dx, B, C, H, W, F, k, col);
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
};

int backend_cpu_new(unsigned threads, struct backend **ret)
{
        struct backend *be = calloc(1, sizeof(*be));
        if (!be)
                return -ENOMEM;
        be->ops = &cpu_ops;
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
