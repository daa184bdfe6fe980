/* backend: every op of the table against naive double-precision loops written here. The checks go
 * through alloc/upload/download only, so a device backend can be held to the same references. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "backend.h"
#include "rng.h"

static struct backend *be;
static struct rng r;

static int setup(void **state)
{
        rng_init(&r, 2024, 0);
        return backend_cpu_new(1, &be);
}

static int teardown(void **state)
{
        be = backend_free(be);
        return 0;
}

static float *rand_host(size_t n, float lo, float hi)
{
        float *p = malloc(sizeof(float) * (n ? n : 1));
        for (size_t i = 0; i < n; i++)
                p[i] = rng_uniform_f(&r, lo, hi);
        return p;
}

static void *dev_from(const void *host, size_t bytes)
{
        void *d = backend_alloc(be, bytes ? bytes : 1);
        assert_non_null(d);
        if (bytes)
                assert_int_equal(backend_upload(be, d, host, bytes), 0);
        return d;
}

static float *host_from(const void *dev, size_t n)
{
        float *h = malloc(sizeof(float) * (n ? n : 1));
        if (n)
                assert_int_equal(backend_download(be, h, dev, sizeof(float) * n), 0);
        return h;
}

static void assert_close(const float *got, const double *want, size_t n, double tol)
{
        for (size_t i = 0; i < n; i++)
                if (fabs(got[i] - want[i]) > tol * (1.0 + fabs(want[i])))
                        fail_msg("element %zu: got %.8g, want %.8g", i, (double)got[i], want[i]);
}

static void test_buffers(void **state)
{
        assert_string_equal(backend_name(be), "cpu");
        assert_true(backend_host_memory(be));
        float *d = backend_alloc(be, 40);
        assert_non_null(d);
        float z[10], h[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
        assert_int_equal(backend_download(be, z, d, sizeof(z)), 0);
        for (int i = 0; i < 10; i++)
                assert_true(z[i] == 0.0f);
        assert_int_equal(backend_upload(be, d, h, sizeof(h)), 0);
        assert_int_equal(backend_download(be, z, d, sizeof(z)), 0);
        assert_memory_equal(z, h, sizeof(h));
        assert_int_equal(be->ops->memset0(be, d, sizeof(h)), 0);
        assert_int_equal(be->ops->synchronize(be), 0);
        assert_int_equal(backend_download(be, z, d, sizeof(z)), 0);
        assert_true(z[9] == 0.0f);
        assert_null(backend_buf_free(be, d));
        assert_null(backend_buf_free(be, NULL));
        assert_null(backend_free(NULL));
}

static void check_gemm(bool ta, bool tb, uint32_t M, uint32_t N, uint32_t K, float alpha, float beta)
{
        uint32_t lda = ta ? M : K, ldb = tb ? K : N;
        float *A = rand_host((size_t)M * K, -1, 1), *B = rand_host((size_t)K * N, -1, 1);
        float *C = rand_host((size_t)M * N, -1, 1);
        double *want = malloc(sizeof(double) * M * N);
        for (uint32_t i = 0; i < M; i++)
                for (uint32_t j = 0; j < N; j++) {
                        double s = 0;
                        for (uint32_t k = 0; k < K; k++)
                                s += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                                     (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                        want[(size_t)i * N + j] = alpha * s + beta * C[(size_t)i * N + j];
                }
        void *dA = dev_from(A, sizeof(float) * M * K), *dB = dev_from(B, sizeof(float) * K * N);
        void *dC = dev_from(C, sizeof(float) * M * N);
        assert_int_equal(be->ops->gemm(be, ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, N), 0);
        float *got = host_from(dC, (size_t)M * N);
        assert_close(got, want, (size_t)M * N, 1e-5);
        backend_buf_free(be, dA), backend_buf_free(be, dB), backend_buf_free(be, dC);
        free(A), free(B), free(C), free(want), free(got);
}

static void test_gemm(void **state)
{
        for (int t = 0; t < 4; t++) {
                check_gemm(t & 1, t & 2, 7, 5, 3, 1.0f, 0.0f);
                check_gemm(t & 1, t & 2, 13, 17, 33, 0.5f, 1.0f);
                check_gemm(t & 1, t & 2, 64, 10, 64, 1.0f, 0.0f);
        }
}

static void test_bias(void **state)
{
        const uint32_t R = 5, N = 11;
        float *y = rand_host(R * N, -1, 1), *b = rand_host(N, -1, 1);
        double want[55], wantb[11] = {0};
        for (uint32_t i = 0; i < R; i++)
                for (uint32_t j = 0; j < N; j++) {
                        want[i * N + j] = (double)y[i * N + j] + b[j];
                        wantb[j] += y[i * N + j];
                }
        void *dy = dev_from(y, sizeof(float) * R * N), *db = dev_from(b, sizeof(float) * N);
        assert_int_equal(be->ops->bias_grad(be, dy, db, R, N), 0);
        float *gotb = host_from(db, N);
        assert_close(gotb, wantb, N, 1e-6);
        assert_int_equal(backend_upload(be, db, b, sizeof(float) * N), 0);
        assert_int_equal(be->ops->add_bias_rows(be, dy, db, R, N), 0);
        float *got = host_from(dy, R * N);
        assert_close(got, want, R * N, 1e-6);
        backend_buf_free(be, dy), backend_buf_free(be, db);
        free(y), free(b), free(got), free(gotb);
}

typedef int (*act_fn)(struct backend *, const void *, void *, size_t);
typedef int (*act_bwd_fn)(struct backend *, const void *, const void *, void *, size_t);

static void check_activation(act_fn fwd, act_bwd_fn bwd, double (*f)(double), double (*df_y)(double))
{
        const size_t n = 37; /* blocks of 8 and a tail */
        float *x = rand_host(n, -3, 3), *dy = rand_host(n, -1, 1);
        x[3] = 0.0f;
        double wy[37], wdx[37];
        for (size_t i = 0; i < n; i++) {
                wy[i] = f(x[i]);
                wdx[i] = dy[i] * df_y((float)wy[i]);
        }
        void *dx_ = dev_from(x, sizeof(float) * n), *dyd = dev_from(dy, sizeof(float) * n);
        void *dout = backend_alloc(be, sizeof(float) * n);
        assert_int_equal(fwd(be, dx_, dout, n), 0);
        float *y = host_from(dout, n);
        assert_close(y, wy, n, 1e-6);
        assert_int_equal(fwd(be, dx_, dx_, n), 0); /* in place */
        float *y2 = host_from(dx_, n);
        assert_close(y2, wy, n, 1e-6);
        assert_int_equal(bwd(be, dout, dyd, dyd, n), 0); /* in place on dy */
        float *g = host_from(dyd, n);
        assert_close(g, wdx, n, 1e-5);
        backend_buf_free(be, dx_), backend_buf_free(be, dyd), backend_buf_free(be, dout);
        free(x), free(dy), free(y), free(y2), free(g);
}

static double relu_d(double x) { return x > 0 ? x : 0; }
static double relu_dy(double y) { return y > 0 ? 1 : 0; }
static double tanh_dy(double y) { return 1 - y * y; }
static double sigm(double x) { return 1 / (1 + exp(-x)); }
static double sigm_dy(double y) { return y * (1 - y); }

static void test_activations(void **state)
{
        check_activation(be->ops->relu_fwd, be->ops->relu_bwd, relu_d, relu_dy);
        check_activation(be->ops->tanh_fwd, be->ops->tanh_bwd, tanh, tanh_dy);
        check_activation(be->ops->sigmoid_fwd, be->ops->sigmoid_bwd, sigm, sigm_dy);
}

static void test_softmax_xent(void **state)
{
        const uint32_t B = 6, C = 10;
        float *l = rand_host(B * C, -5, 5);
        l[0] = 80.0f; /* large logits stay finite */
        l[C + 1] = -90.0f;
        uint8_t y[6] = {1, 1, 9, 0, 4, 4};
        double wp[60], wd[60], wloss = 0;
        uint32_t wcorrect = 0;
        for (uint32_t b = 0; b < B; b++) {
                double mx = -1e300, s = 0;
                uint32_t arg = 0;
                for (uint32_t c = 0; c < C; c++) {
                        mx = fmax(mx, l[b * C + c]);
                        if (l[b * C + c] > l[b * C + arg])
                                arg = c;
                }
                for (uint32_t c = 0; c < C; c++)
                        s += exp(l[b * C + c] - mx);
                for (uint32_t c = 0; c < C; c++) {
                        wp[b * C + c] = exp(l[b * C + c] - mx) / s;
                        wd[b * C + c] = (wp[b * C + c] - (c == y[b])) / B;
                }
                wloss += -(l[b * C + y[b]] - mx - log(s));
                wcorrect += arg == y[b];
        }
        wloss /= B;
        void *dl = dev_from(l, sizeof(float) * B * C), *dy = dev_from(y, B);
        void *dp = backend_alloc(be, sizeof(float) * B * C);
        float loss;
        uint32_t correct;
        assert_int_equal(be->ops->softmax_xent_fwd(be, dl, dy, B, C, dp, &loss), 0);
        assert_float_equal(loss, wloss, 1e-5 * (1 + wloss));
        float *p = host_from(dp, B * C);
        assert_close(p, wp, B * C, 1e-6);
        assert_int_equal(be->ops->correct_count(be, dl, dy, B, C, &correct), 0);
        assert_int_equal(correct, wcorrect);
        assert_int_equal(be->ops->softmax_xent_bwd(be, dp, dy, B, C, dp), 0); /* in place */
        float *d = host_from(dp, B * C);
        assert_close(d, wd, B * C, 1e-6);
        backend_buf_free(be, dl), backend_buf_free(be, dy), backend_buf_free(be, dp);
        free(l), free(p), free(d);
}

static void test_correct_ties(void **state)
{
        const float s[6] = {1, 1, 0, 0, 2, 2}; /* first maximum wins */
        const uint8_t y[2] = {0, 2}; /* row 0: argmax 0, right; row 1: argmax 1, wrong */
        void *ds = dev_from(s, sizeof(s)), *dy = dev_from(y, 2);
        uint32_t correct;
        assert_int_equal(be->ops->correct_count(be, ds, dy, 2, 3, &correct), 0);
        assert_int_equal(correct, 1);
        backend_buf_free(be, ds), backend_buf_free(be, dy);
}

/* Direct convolution, "same" padding with TF's split (pad_top = (k - 1) / 2). */
static double xat(const float *x, uint32_t C, uint32_t H, uint32_t W, uint32_t b, uint32_t c, int yy, int xx)
{
        if (yy < 0 || xx < 0 || yy >= (int)H || xx >= (int)W)
                return 0;
        return x[(((size_t)b * C + c) * H + (uint32_t)yy) * W + (uint32_t)xx];
}

static void check_conv(uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k)
{
        int pad = (int)(k - 1) / 2;
        size_t nx = (size_t)B * C * H * W, ny = (size_t)B * F * H * W, nw = (size_t)F * C * k * k;
        float *x = rand_host(nx, -1, 1), *w = rand_host(nw, -1, 1), *bias = rand_host(F, -1, 1);
        float *dy = rand_host(ny, -1, 1);
        double *wy = calloc(ny, sizeof(double)), *wdw = calloc(nw, sizeof(double));
        double *wdb = calloc(F, sizeof(double)), *wdx = calloc(nx, sizeof(double));
        for (uint32_t b = 0; b < B; b++)
                for (uint32_t f = 0; f < F; f++)
                        for (uint32_t oy = 0; oy < H; oy++)
                                for (uint32_t ox = 0; ox < W; ox++) {
                                        size_t yi = (((size_t)b * F + f) * H + oy) * W + ox;
                                        double s = bias[f], g = dy[yi];
                                        wdb[f] += g;
                                        for (uint32_t c = 0; c < C; c++)
                                                for (uint32_t ky = 0; ky < k; ky++)
                                                        for (uint32_t kx = 0; kx < k; kx++) {
                                                                int iy = (int)(oy + ky) - pad, ix = (int)(ox + kx) - pad;
                                                                size_t wi = (((size_t)f * C + c) * k + ky) * k + kx;
                                                                double xv = xat(x, C, H, W, b, c, iy, ix);
                                                                s += w[wi] * xv;
                                                                wdw[wi] += g * xv;
                                                                if (iy >= 0 && ix >= 0 && iy < (int)H && ix < (int)W)
                                                                        wdx[(((size_t)b * C + c) * H + (uint32_t)iy) * W + (uint32_t)ix] += g * w[wi];
                                                        }
                                        wy[yi] = s;
                                }
        void *dx_ = dev_from(x, sizeof(float) * nx), *dw_ = dev_from(w, sizeof(float) * nw);
        void *db_ = dev_from(bias, sizeof(float) * F), *dyd = dev_from(dy, sizeof(float) * ny);
        void *dout = backend_alloc(be, sizeof(float) * ny);
        void *col = backend_alloc(be, sizeof(float) * backend_conv2d_col_floats(C, H, W, k));
        void *gw = backend_alloc(be, sizeof(float) * nw), *gb = backend_alloc(be, sizeof(float) * F);
        void *gx = backend_alloc(be, sizeof(float) * nx);
        assert_int_equal(be->ops->conv2d_fwd(be, dx_, dw_, db_, dout, B, C, H, W, F, k, col), 0);
        float *got = host_from(dout, ny);
        assert_close(got, wy, ny, 1e-5);
        assert_int_equal(be->ops->conv2d_bwd(be, dx_, dw_, dyd, gw, gb, gx, B, C, H, W, F, k, col), 0);
        float *ggw = host_from(gw, nw), *ggb = host_from(gb, F), *ggx = host_from(gx, nx);
        assert_close(ggw, wdw, nw, 1e-5);
        assert_close(ggb, wdb, F, 1e-5);
        assert_close(ggx, wdx, nx, 1e-5);
        /* dx NULL: only the parameter gradients */
        assert_int_equal(be->ops->conv2d_bwd(be, dx_, dw_, dyd, gw, gb, NULL, B, C, H, W, F, k, col), 0);
        free(ggw);
        ggw = host_from(gw, nw);
        assert_close(ggw, wdw, nw, 1e-5);
        void *bufs[] = {dx_, dw_, db_, dyd, dout, col, gw, gb, gx};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
                backend_buf_free(be, bufs[i]);
        free(x), free(w), free(bias), free(dy), free(wy), free(wdw), free(wdb), free(wdx);
        free(got), free(ggw), free(ggb), free(ggx);
}

static void test_conv2d(void **state)
{
        check_conv(2, 3, 5, 6, 4, 3);
        check_conv(1, 1, 4, 4, 2, 1);
        check_conv(2, 2, 5, 4, 3, 2); /* even kernel: one more padding row/column after */
        check_conv(1, 2, 7, 7, 2, 5);
}

static void test_maxpool2d(void **state)
{
        const uint32_t B = 2, C = 3, H = 5, W = 7, p = 2, OH = 2, OW = 3;
        size_t nx = (size_t)B * C * H * W, ny = (size_t)B * C * OH * OW;
        float *x = rand_host(nx, -1, 1), *dy = rand_host(ny, -1, 1);
        x[1] = x[0]; /* a tie: the first maximum takes the gradient */
        x[W] = x[W + 1] = -5;
        double wy[84], wdx[210] = {0};
        for (uint32_t bc = 0; bc < B * C; bc++)
                for (uint32_t oy = 0; oy < OH; oy++)
                        for (uint32_t ox = 0; ox < OW; ox++) {
                                size_t best = (size_t)bc * H * W + (size_t)(oy * p) * W + ox * p;
                                for (uint32_t a = 0; a < p; a++)
                                        for (uint32_t c = 0; c < p; c++) {
                                                size_t i = (size_t)bc * H * W + (size_t)(oy * p + a) * W + ox * p + c;
                                                if (x[i] > x[best])
                                                        best = i;
                                        }
                                size_t yi = ((size_t)bc * OH + oy) * OW + ox;
                                wy[yi] = x[best];
                                wdx[best] += dy[yi];
                        }
        void *dx_ = dev_from(x, sizeof(float) * nx), *dyd = dev_from(dy, sizeof(float) * ny);
        void *dout = backend_alloc(be, sizeof(float) * ny), *gx = dev_from(x, sizeof(float) * nx);
        assert_int_equal(be->ops->maxpool2d_fwd(be, dx_, dout, B, C, H, W, p), 0);
        float *got = host_from(dout, ny);
        assert_close(got, wy, ny, 0);
        assert_int_equal(be->ops->maxpool2d_bwd(be, dx_, dyd, gx, B, C, H, W, p), 0);
        float *g = host_from(gx, nx);
        assert_close(g, wdx, nx, 0);
        backend_buf_free(be, dx_), backend_buf_free(be, dyd), backend_buf_free(be, dout), backend_buf_free(be, gx);
        free(x), free(dy), free(got), free(g);
}

UNIT_TEST_MAIN(setup, teardown,
        cmocka_unit_test(test_buffers),      cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_bias),         cmocka_unit_test(test_activations),
        cmocka_unit_test(test_softmax_xent), cmocka_unit_test(test_correct_ties),
        cmocka_unit_test(test_conv2d),       cmocka_unit_test(test_maxpool2d))
