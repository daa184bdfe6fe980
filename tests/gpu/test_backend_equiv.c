/* Every op of the CUDA backend against the CPU backend (the reference) on random inputs, forward and
 * backward, within the tolerances below; every op of the graph engine, its CUDA kernels against the
 * CPU's; then the CNN of examples/fmnist-cnn.json as a whole (loss and gradients), the memory cap and "no
 * cudaMalloc in the step loop". Prints one JSON line per check with the worst error seen. Exits 77
 * ("SKIP: no CUDA device") where there is no usable GPU, 1 on a failed check (anywhere, GPU or not: a
 * graph op without a case in tests/unit/graph_cases.h), 0 when everything holds.
 *
 * Tolerances, |gpu - cpu| <= atol + rtol * max(|cpu|, rms(cpu)) per element, rms(cpu) being the
 * reference tensor's root mean square: an element that a long sum cancels to near zero is held to the
 * tensor's scale, not to its own (docs/gpu.md repeats them):
 *   exact (0, 0): relu forward and backward, max pooling forward and backward (ties included),
 *                 softmax-xent backward given the same probabilities, correct count, buffers
 *   (1e-6, 1e-5): bias add, tanh, sigmoid, softmax probabilities, the loss
 *   (1e-5, 1e-4): bias gradient (a sum over the batch)
 *   (1e-4, 1e-4): gemm and convolution, inputs in [-1, 1], reductions of up to 12544 terms summed in
 *                 a different order (cuBLAS/cuDNN vs OpenBLAS/im2col), fp32 without TF32 (on an H200,
 *                 the second CNN layer's filter gradient, 34 in rms, differed by up to 8e-4 in
 *                 elements that cancel to 0.06: 1 % of the element, 2.4e-5 of the tensor's scale)
 *   graph ops:    every op of graph.h (tests/unit/graph_cases.h: a case or two each, an op without one
 *                 fails), the CUDA graph kernels against the CPU's through a whole exec on each, training
 *                 and inference, the output, every parameter's gradient (with the moving averages'
 *                 deltas) and the inputs' gradients: exact for what only moves or selects values (the
 *                 copies, Transpose, Concat, Pad, Gather forward, Relu, MaxPool forward, Dropout: its
 *                 mask is the CPU's hash bit for bit); (1e-4, 1e-4) for the products and normalizations;
 *                 (1e-5, 1e-4) for the rest (sums in another order, expf and tanhf of CUDA's libm)
 *   whole model:  loss rtol 1e-5; each gradient variable's relative L2 error <= 1e-2. Looser than the
 *                 ops: a ReLU input within rounding of 0, or two maxima of a pooling window within
 *                 rounding of each other, can come out on different sides on the two backends (about
 *                 one per step at this size), which moves one element's whole gradient; a wrong
 *                 layout, padding or transpose gives errors of order 1. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "device.h"
#include "graph.h"
#include "graph_cases.h"
#include "model.h"
#include "rng.h"

static struct backend *cpu, *gpu;
static struct rng rg;
static int failures;

/* ---- helpers ---- */

static float *rnd(size_t n, float lo, float hi)
{
        float *p = malloc(sizeof(float) * (n ? n : 1));
        for (size_t i = 0; i < n; i++)
                p[i] = rng_uniform_f(&rg, lo, hi);
        return p;
}

/* A copy of host on both backends. */
struct pair {
        void *c, *g;
        size_t bytes;
};

static struct pair up(const void *host, size_t bytes)
{
        struct pair p = { backend_alloc(cpu, bytes ? bytes : 1), backend_alloc(gpu, bytes ? bytes : 1), bytes };
        if (!p.c || !p.g) {
                fprintf(stderr, "allocation of %zu bytes failed\n", bytes);
                exit(1);
        }
        if (host && bytes) {
                backend_upload(cpu, p.c, host, bytes);
                if (backend_upload(gpu, p.g, host, bytes) < 0) {
                        fprintf(stderr, "upload failed\n");
                        exit(1);
                }
        }
        return p;
}

static struct pair upf(const float *host, size_t n)
{
        return up(host, sizeof(float) * n);
}

static void drop(struct pair p)
{
        backend_buf_free(cpu, p.c);
        backend_buf_free(gpu, p.g);
}

struct tol {
        double atol, rtol;
};
static const struct tol EXACT = { 0, 0 }, ELEM = { 1e-6, 1e-5 }, SUM = { 1e-5, 1e-4 }, PROD = { 1e-4, 1e-4 };

static void cmp_host(const char *what, const float *a, const float *b, size_t n, struct tol t, int r);

/* Compares the first n floats of p on both backends; prints one JSON line. */
static void cmp(const char *what, struct pair p, size_t n, struct tol t)
{
        float *a = malloc(sizeof(float) * (n ? n : 1)), *b = malloc(sizeof(float) * (n ? n : 1));
        int r = backend_download(gpu, b, p.g, sizeof(float) * n);
        backend_download(cpu, a, p.c, sizeof(float) * n);
        cmp_host(what, a, b, n, t, r);
        free(a);
        free(b);
}

/* a (the CPU's) against b (the GPU's, r the status of bringing it over); one JSON line. */
static void cmp_host(const char *what, const float *a, const float *b, size_t n, struct tol t, int r)
{
        double worst = 0, worst_rel = 0, ss = 0;
        size_t bad = 0, first_bad = 0;
        for (size_t i = 0; i < n; i++)
                ss += (double)a[i] * (double)a[i];
        double rms = n ? sqrt(ss / (double)n) : 0;
        for (size_t i = 0; i < n; i++) {
                double d = fabs((double)a[i] - (double)b[i]);
                double scale = fabs((double)a[i]) > rms ? fabs((double)a[i]) : rms;
                bool ok = d <= t.atol + t.rtol * scale && !isnan(b[i]) == !isnan(a[i]);
                if (!ok && bad++ == 0)
                        first_bad = i;
                worst = d > worst ? d : worst;
                double rel = d / (fabs((double)a[i]) + 1e-30);
                worst_rel = fabs(a[i]) > 1e-3 && rel > worst_rel ? rel : worst_rel;
        }
        bool pass = r == 0 && bad == 0;
        printf("{\"check\": \"%s\", \"n\": %zu, \"max_abs_err\": %.3g, \"max_rel_err\": %.3g, \"rms\": %.3g, "
               "\"atol\": %g, \"rtol\": %g, \"pass\": %s}\n",
               what, n, worst, worst_rel, rms, t.atol, t.rtol, pass ? "true" : "false");
        if (!pass) {
                failures++;
                if (r < 0)
                        printf("  download failed: %s\n", strerror(-r));
                else
                        printf("  %zu of %zu outside; first at %zu: cpu %.9g gpu %.9g\n", bad, n, first_bad,
                               (double)a[first_bad], (double)b[first_bad]);
        }
}

static void check(bool ok, const char *fmt, const char *detail)
{
        printf("{\"check\": \"%s\", \"pass\": %s}\n", fmt, ok ? "true" : "false");
        if (!ok) {
                failures++;
                if (detail)
                        printf("  %s\n", detail);
        }
}

#define OK(expr)                                                                                  \
        do {                                                                                      \
                int r_ = (expr);                                                                  \
                if (r_ < 0) {                                                                     \
                        printf("  %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, strerror(-r_));    \
                        failures++;                                                               \
                        return;                                                                   \
                }                                                                                 \
        } while (0)

/* Runs the same op on both backends: OP(be, pick) where pick(pair) gives that backend's pointer. */
#define BOTH(call_c, call_g)                                                                      \
        do {                                                                                      \
                OK(call_c);                                                                       \
                OK(call_g);                                                                       \
        } while (0)

/* ---- ops ---- */

static void t_buffers(void)
{
        float h[1000];
        for (int i = 0; i < 1000; i++)
                h[i] = (float)i - 500.0f;
        struct pair z = up(NULL, sizeof(h)); /* alloc zero-fills */
        cmp("alloc_zeroed", z, 1000, EXACT);
        struct pair p = upf(h, 1000);
        cmp("upload_download", p, 1000, EXACT);
        BOTH(cpu->ops->memset0(cpu, (char *)p.c + 40, 400), gpu->ops->memset0(gpu, (char *)p.g + 40, 400));
        cmp("memset0", p, 1000, EXACT);
        OK(gpu->ops->synchronize(gpu));
        drop(z);
        drop(p);
}

static void t_gemm(uint32_t M, uint32_t N, uint32_t K, bool ta, bool tb, float alpha, float beta, uint32_t pad)
{
        /* stored shapes: A (M, K) or (K, M), B (K, N) or (N, K), with pad extra columns (ld > cols) */
        uint32_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
        uint32_t lda = ac + pad, ldb = bc + pad, ldc = N + pad;
        float *a = rnd((size_t)ar * lda, -1, 1), *b = rnd((size_t)br * ldb, -1, 1), *c = rnd((size_t)M * ldc, -1, 1);
        struct pair A = upf(a, (size_t)ar * lda), B = upf(b, (size_t)br * ldb), C = upf(c, (size_t)M * ldc);
        BOTH(cpu->ops->gemm(cpu, ta, tb, M, N, K, alpha, A.c, lda, B.c, ldb, beta, C.c, ldc),
             gpu->ops->gemm(gpu, ta, tb, M, N, K, alpha, A.g, lda, B.g, ldb, beta, C.g, ldc));
        char name[96];
        snprintf(name, sizeof(name), "gemm %ux%ux%u ta%d tb%d a%g b%g pad%u", M, N, K, ta, tb, alpha, beta, pad);
        cmp(name, C, (size_t)M * ldc, PROD);
        drop(A), drop(B), drop(C);
        free(a), free(b), free(c);
}

static void t_bias(uint32_t rows, uint32_t n)
{
        float *y = rnd((size_t)rows * n, -1, 1), *bias = rnd(n, -1, 1);
        struct pair Y = upf(y, (size_t)rows * n), Bs = upf(bias, n), D = up(NULL, sizeof(float) * n);
        BOTH(cpu->ops->add_bias_rows(cpu, Y.c, Bs.c, rows, n), gpu->ops->add_bias_rows(gpu, Y.g, Bs.g, rows, n));
        cmp("add_bias_rows", Y, (size_t)rows * n, ELEM);
        BOTH(cpu->ops->bias_grad(cpu, Y.c, D.c, rows, n), gpu->ops->bias_grad(gpu, Y.g, D.g, rows, n));
        cmp("bias_grad", D, n, SUM);
        drop(Y), drop(Bs), drop(D);
        free(y), free(bias);
}

static void t_activations(size_t n)
{
        float *x = rnd(n, -4, 4), *dy = rnd(n, -1, 1);
        x[0] = 0.0f; /* the kink */
        static const char *const names[] = { "relu", "tanh", "sigmoid" };
        for (int k = 0; k < 3; k++) {
                struct pair X = upf(x, n), Y = up(NULL, sizeof(float) * n), DY = upf(dy, n);
                const struct backend_ops *oc = cpu->ops, *og = gpu->ops;
                int (*fc)(struct backend *, const void *, void *, size_t) =
                        k == 0 ? oc->relu_fwd : k == 1 ? oc->tanh_fwd : oc->sigmoid_fwd;
                int (*fg)(struct backend *, const void *, void *, size_t) =
                        k == 0 ? og->relu_fwd : k == 1 ? og->tanh_fwd : og->sigmoid_fwd;
                int (*bc)(struct backend *, const void *, const void *, void *, size_t) =
                        k == 0 ? oc->relu_bwd : k == 1 ? oc->tanh_bwd : oc->sigmoid_bwd;
                int (*bg)(struct backend *, const void *, const void *, void *, size_t) =
                        k == 0 ? og->relu_bwd : k == 1 ? og->tanh_bwd : og->sigmoid_bwd;
                struct tol t = k == 0 ? EXACT : ELEM;
                char name[64];
                BOTH(fc(cpu, X.c, Y.c, n), fg(gpu, X.g, Y.g, n));
                snprintf(name, sizeof(name), "%s_fwd", names[k]);
                cmp(name, Y, n, t);
                /* backward in place (dx == dy), as the model runs it, from the CPU's y on both */
                float *yh = malloc(sizeof(float) * n);
                backend_download(cpu, yh, Y.c, sizeof(float) * n);
                backend_upload(gpu, Y.g, yh, sizeof(float) * n);
                BOTH(bc(cpu, Y.c, DY.c, DY.c, n), bg(gpu, Y.g, DY.g, DY.g, n));
                snprintf(name, sizeof(name), "%s_bwd_inplace", names[k]);
                cmp(name, DY, n, t);
                /* forward in place (x == y) */
                BOTH(fc(cpu, X.c, X.c, n), fg(gpu, X.g, X.g, n));
                snprintf(name, sizeof(name), "%s_fwd_inplace", names[k]);
                cmp(name, X, n, t);
                free(yh);
                drop(X), drop(Y), drop(DY);
        }
        free(x), free(dy);
}

static void t_softmax(uint32_t B, uint32_t C, float scale)
{
        float *l = rnd((size_t)B * C, -scale, scale);
        uint8_t *lab = malloc(B);
        for (uint32_t b = 0; b < B; b++)
                lab[b] = (uint8_t)rng_below(&rg, C);
        if (B > 2) { /* ties for the count: the first maximum wins */
                for (uint32_t c = 0; c < C; c++)
                        l[c] = c < 2 ? 5.0f : 0.0f;
                lab[0] = 1;
        }
        struct pair L = upf(l, (size_t)B * C), Lab = up(lab, B), P = up(NULL, sizeof(float) * B * C);
        float lc, lg;
        BOTH(cpu->ops->softmax_xent_fwd(cpu, L.c, Lab.c, B, C, P.c, &lc),
             gpu->ops->softmax_xent_fwd(gpu, L.g, Lab.g, B, C, P.g, &lg));
        char name[64];
        snprintf(name, sizeof(name), "softmax_probs %ux%u scale %g", B, C, scale);
        cmp(name, P, (size_t)B * C, ELEM);
        double d = fabs((double)lc - lg);
        snprintf(name, sizeof(name), "xent_loss scale %g", scale);
        printf("{\"check\": \"%s\", \"cpu\": %.9g, \"gpu\": %.9g, \"abs_err\": %.3g, \"pass\": %s}\n", name, lc, lg, d,
               d <= ELEM.atol + ELEM.rtol * fabs(lc) ? "true" : "false");
        if (!(d <= ELEM.atol + ELEM.rtol * fabs(lc)))
                failures++;
        /* backward from the same probabilities on both, in place as the model may */
        float *ph = malloc(sizeof(float) * B * C);
        backend_download(cpu, ph, P.c, sizeof(float) * B * C);
        backend_upload(gpu, P.g, ph, sizeof(float) * B * C);
        BOTH(cpu->ops->softmax_xent_bwd(cpu, P.c, Lab.c, B, C, P.c), gpu->ops->softmax_xent_bwd(gpu, P.g, Lab.g, B, C, P.g));
        cmp("softmax_xent_bwd", P, (size_t)B * C, EXACT);
        uint32_t cc, cg;
        BOTH(cpu->ops->correct_count(cpu, L.c, Lab.c, B, C, &cc), gpu->ops->correct_count(gpu, L.g, Lab.g, B, C, &cg));
        char det[96];
        snprintf(det, sizeof(det), "cpu %u gpu %u", cc, cg);
        check(cc == cg, "correct_count", det);
        drop(L), drop(Lab), drop(P);
        free(l), free(lab), free(ph);
}

static void t_conv(uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k)
{
        size_t nx = (size_t)B * C * H * W, ny = (size_t)B * F * H * W, nw = (size_t)F * C * k * k;
        float *x = rnd(nx, -1, 1), *w = rnd(nw, -1, 1), *b = rnd(F, -1, 1), *dy = rnd(ny, -1, 1);
        struct pair X = upf(x, nx), Wt = upf(w, nw), Bs = upf(b, F), Y = up(NULL, sizeof(float) * ny), DY = upf(dy, ny);
        struct pair DW = up(NULL, sizeof(float) * nw), DB = up(NULL, sizeof(float) * F), DX = up(NULL, sizeof(float) * nx);
        struct pair col = up(NULL, sizeof(float) * backend_conv2d_col_floats(C, H, W, k));
        char name[96];
        BOTH(cpu->ops->conv2d_fwd(cpu, X.c, Wt.c, Bs.c, Y.c, B, C, H, W, F, k, col.c),
             gpu->ops->conv2d_fwd(gpu, X.g, Wt.g, Bs.g, Y.g, B, C, H, W, F, k, col.g));
        snprintf(name, sizeof(name), "conv2d_fwd B%u C%u %ux%u F%u k%u", B, C, H, W, F, k);
        cmp(name, Y, ny, PROD);
        BOTH(cpu->ops->conv2d_bwd(cpu, X.c, Wt.c, DY.c, DW.c, DB.c, DX.c, B, C, H, W, F, k, col.c),
             gpu->ops->conv2d_bwd(gpu, X.g, Wt.g, DY.g, DW.g, DB.g, DX.g, B, C, H, W, F, k, col.g));
        snprintf(name, sizeof(name), "conv2d_bwd_dw B%u C%u %ux%u F%u k%u", B, C, H, W, F, k);
        cmp(name, DW, nw, PROD);
        snprintf(name, sizeof(name), "conv2d_bwd_db B%u C%u %ux%u F%u k%u", B, C, H, W, F, k);
        cmp(name, DB, F, PROD);
        snprintf(name, sizeof(name), "conv2d_bwd_dx B%u C%u %ux%u F%u k%u", B, C, H, W, F, k);
        cmp(name, DX, nx, PROD);
        /* dx NULL: parameter gradients only (the model's first layer) */
        BOTH(cpu->ops->memset0(cpu, DW.c, sizeof(float) * nw), gpu->ops->memset0(gpu, DW.g, sizeof(float) * nw));
        BOTH(cpu->ops->conv2d_bwd(cpu, X.c, Wt.c, DY.c, DW.c, DB.c, NULL, B, C, H, W, F, k, col.c),
             gpu->ops->conv2d_bwd(gpu, X.g, Wt.g, DY.g, DW.g, DB.g, NULL, B, C, H, W, F, k, col.g));
        snprintf(name, sizeof(name), "conv2d_bwd_dw_nodx B%u C%u %ux%u F%u k%u", B, C, H, W, F, k);
        cmp(name, DW, nw, PROD);
        drop(X), drop(Wt), drop(Bs), drop(Y), drop(DY), drop(DW), drop(DB), drop(DX), drop(col);
        free(x), free(w), free(b), free(dy);
}

static void t_pool(uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t p, bool ties)
{
        size_t nx = (size_t)B * C * H * W, ny = (size_t)B * C * (H / p) * (W / p);
        float *x = rnd(nx, -1, 1), *dy = rnd(ny, -1, 1);
        if (ties) /* as after a ReLU: many zeros, and a few repeated values */
                for (size_t i = 0; i < nx; i++)
                        x[i] = x[i] < 0 ? 0.0f : floorf(x[i] * 4.0f) / 4.0f;
        struct pair X = upf(x, nx), Y = up(NULL, sizeof(float) * ny), DY = upf(dy, ny), DX = upf(x, nx);
        char name[96];
        BOTH(cpu->ops->maxpool2d_fwd(cpu, X.c, Y.c, B, C, H, W, p), gpu->ops->maxpool2d_fwd(gpu, X.g, Y.g, B, C, H, W, p));
        snprintf(name, sizeof(name), "maxpool2d_fwd %ux%u p%u%s", H, W, p, ties ? " ties" : "");
        cmp(name, Y, ny, EXACT);
        BOTH(cpu->ops->maxpool2d_bwd(cpu, X.c, DY.c, DX.c, B, C, H, W, p),
             gpu->ops->maxpool2d_bwd(gpu, X.g, DY.g, DX.g, B, C, H, W, p));
        snprintf(name, sizeof(name), "maxpool2d_bwd %ux%u p%u%s", H, W, p, ties ? " ties" : "");
        cmp(name, DX, nx, EXACT);
        drop(X), drop(Y), drop(DY), drop(DX);
        free(x), free(dy);
}

/* ---- the CNN as a whole ---- */

/* ---- the graph engine's ops ---- */

static struct tol graph_tol(enum graph_op op, bool fwd)
{
        switch (op) {
        case GOP_FLATTEN: case GOP_RESHAPE: case GOP_SQUEEZE: case GOP_UNSQUEEZE: case GOP_IDENTITY:
        case GOP_TRANSPOSE: case GOP_CONCAT: case GOP_PAD: case GOP_RELU: case GOP_DROPOUT:
                return EXACT;
        case GOP_GATHER: case GOP_MAXPOOL:
                return fwd ? EXACT : SUM; /* backward: a scatter-add in another order */
        case GOP_GEMM: case GOP_MATMUL: case GOP_CONV: case GOP_BATCHNORM: case GOP_LAYERNORM:
                return PROD;
        default:
                return SUM;
        }
}

/* Every op's cases (graph_cases.h) on both backends at batch 64, training and inference: one JSON line
 * per output, parameter gradient block and input gradient. */
static void t_graph_ops(void)
{
        char err[256] = "", what[160];
        for (int op = 0; op < GOP__COUNT; op++)
                for (int v = 0; v < GCASE_VARIANTS; v++) {
                        const char *name = graph_op_name((enum graph_op)op);
                        struct graph *g = NULL;
                        int r = gcase_build((enum graph_op)op, v, &g, err, sizeof(err));
                        if (r == -ENOENT && v > 0)
                                break;
                        if (r < 0) {
                                snprintf(what, sizeof(what), "graph %s has a case", name);
                                check(false, what, err);
                                break;
                        }
                        for (int training = 1; training >= 0; training--) {
                                const char *mode = training ? "training" : "inference";
                                struct gcase_out c, d;
                                int rc = gcase_run(g, NULL, 64, training, &c, err, sizeof(err));
                                int rd = rc < 0 ? rc : gcase_run(g, gpu, 64, training, &d, err, sizeof(err));
                                if (rc < 0 || rd < 0) {
                                        snprintf(what, sizeof(what), "graph %s/%d %s runs", name, v, mode);
                                        check(false, what, err);
                                        if (rc == 0)
                                                gcase_out_free(&c);
                                        continue;
                                }
                                snprintf(what, sizeof(what), "graph %s/%d %s forward", name, v, mode);
                                cmp_host(what, c.y, d.y, c.ny, graph_tol((enum graph_op)op, true), 0);
                                if (c.n_params) {
                                        snprintf(what, sizeof(what), "graph %s/%d %s backward params", name, v, mode);
                                        cmp_host(what, c.grads, d.grads, c.n_params, graph_tol((enum graph_op)op, false), 0);
                                }
                                for (uint32_t i = 0; i < c.n_dx; i++) {
                                        snprintf(what, sizeof(what), "graph %s/%d %s backward input %u", name, v, mode, i);
                                        cmp_host(what, c.dx[i], d.dx[i], c.ndx[i], graph_tol((enum graph_op)op, false), 0);
                                }
                                gcase_out_free(&c);
                                gcase_out_free(&d);
                        }
                        graph_free(g);
                }
}

static struct model_spec cnn(void)
{
        struct model_spec s = { .input = { 1, 28, 28 }, .n_layers = 10, .seed = 1 };
        s.layers[0] = (struct layer_spec){ .type = LAYER_CONV2D, .filters = 32, .kernel = 5 };
        s.layers[1] = (struct layer_spec){ .type = LAYER_RELU };
        s.layers[2] = (struct layer_spec){ .type = LAYER_MAXPOOL2D, .pool = 2 };
        s.layers[3] = (struct layer_spec){ .type = LAYER_CONV2D, .filters = 64, .kernel = 5 };
        s.layers[4] = (struct layer_spec){ .type = LAYER_RELU };
        s.layers[5] = (struct layer_spec){ .type = LAYER_MAXPOOL2D, .pool = 2 };
        s.layers[6] = (struct layer_spec){ .type = LAYER_FLATTEN };
        s.layers[7] = (struct layer_spec){ .type = LAYER_DENSE, .units = 1024 };
        s.layers[8] = (struct layer_spec){ .type = LAYER_RELU };
        s.layers[9] = (struct layer_spec){ .type = LAYER_DENSE, .units = 10 };
        return s;
}

static void t_model(void)
{
        const uint32_t B = 64;
        struct model_spec s = cnn();
        struct model *mc = NULL, *mg = NULL;
        char msg[512] = "";
        OK(device_model_new(cpu, &s, B, &mc, msg, sizeof(msg)));
        if (device_model_new(gpu, &s, B, &mg, msg, sizeof(msg)) < 0) {
                check(false, "cnn model on the GPU", msg);
                model_free(mc);
                return;
        }
        OK(model_init_params(mc, 1));
        OK(model_init_params(mg, 1));
        uint32_t D = model_input_size(mc);
        float *x = rnd((size_t)B * D, 0, 1);
        uint8_t y[64];
        for (uint32_t b = 0; b < B; b++)
                y[b] = (uint8_t)rng_below(&rg, 10);
        struct device_mem_stats st0, st1;
        device_cuda_mem_stats(gpu, &st0);
        for (int step = 0; step < 3; step++) {
                float lc, lg;
                uint32_t cc, cg;
                OK(model_forward(mc, x, y, B, &lc, &cc));
                OK(model_forward(mg, x, y, B, &lg, &cg));
                OK(model_backward(mc, NULL, NULL));
                OK(model_backward(mg, NULL, NULL));
                double d = fabs((double)lc - lg);
                bool ok = d <= 1e-5 * fabs(lc) + 1e-6;
                printf("{\"check\": \"cnn step %d loss\", \"cpu\": %.9g, \"gpu\": %.9g, \"correct_cpu\": %u, \"correct_gpu\": %u, "
                       "\"pass\": %s}\n", step, lc, lg, cc, cg, ok ? "true" : "false");
                failures += !ok;
                const float *gc = model_grads(mc), *gg = model_grads(mg);
                for (uint32_t v = 0; v < model_n_vars(mc); v++) {
                        const struct model_var *mv = model_var(mc, v);
                        double num = 0, den = 0;
                        for (size_t i = 0; i < (size_t)mv->rows * mv->cols; i++) {
                                double e = (double)gc[mv->offset + i] - gg[mv->offset + i];
                                num += e * e;
                                den += (double)gc[mv->offset + i] * gc[mv->offset + i];
                        }
                        double rel = sqrt(num / (den > 0 ? den : 1e-30));
                        bool gok = rel <= 1e-2;
                        printf("{\"check\": \"cnn step %d grad %s\", \"rel_l2_err\": %.3g, \"pass\": %s}\n", step, mv->name,
                               rel, gok ? "true" : "false");
                        failures += !gok;
                }
                /* a plain SGD step on both, from the CPU's gradients so both stay on the same path */
                float *pc = model_params(mc), *pg = model_params(mg);
                for (size_t i = 0; i < model_n_params(mc); i++) {
                        pc[i] -= 0.05f * gc[i];
                        pg[i] = pc[i];
                }
                OK(model_params_sync(mc));
                OK(model_params_sync(mg));
        }
        device_cuda_mem_stats(gpu, &st1);
        char det[128];
        snprintf(det, sizeof(det), "cudaMalloc calls: %llu after the model was built, %llu after 3 steps",
                 (unsigned long long)st0.device_mallocs, (unsigned long long)st1.device_mallocs);
        check(st1.device_mallocs == st0.device_mallocs, "no cudaMalloc in the step loop", det);
        printf("{\"check\": \"gpu memory\", \"cap_mib\": %.1f, \"reserved_mib\": %.1f, \"peak_in_use_mib\": %.1f}\n",
               st1.cap / 1048576.0, st1.reserved / 1048576.0, st1.peak / 1048576.0);
        free(x);
        model_free(mc);
        model_free(mg);
}

/* A cap too small for the model is a clear error at build time, in both memory modes. */
static void t_cap(const struct device_gpu_info *gi)
{
        for (int growth = 0; growth < 2; growth++) {
                struct device_opts o = { .n_gpus = 1, .gpus = { 0 }, .allow_growth = growth };
                o.gpu_memory_fraction = (double)(24 << 20) / (double)gi->total_bytes; /* 24 MiB */
                struct backend *be = NULL;
                struct model *m = NULL;
                char msg[512] = "";
                int r = device_cuda_new(&o, &be, msg, sizeof(msg));
                if (r == 0) {
                        struct model_spec s = cnn();
                        r = device_model_new(be, &s, 64, &m, msg, sizeof(msg));
                }
                printf("  cap 24 MiB, allow_growth %d: %d %s\n", growth, r, msg);
                check(r == -ENOMEM && strstr(msg, "gpu_memory_fraction") != NULL,
                      growth ? "small cap is a clear error (allow_growth)" : "small cap is a clear error (reserved)", msg);
                model_free(m);
                backend_free(be);
        }
        struct device_opts two = { .n_gpus = 2, .gpus = { 0, 1 }, .gpu_memory_fraction = 0.1 };
        struct backend *be = NULL;
        char msg[256] = "";
        check(device_cuda_new(&two, &be, msg, sizeof(msg)) == -EOPNOTSUPP, "two GPUs in one backend refused", msg);
}

int main(void)
{
        struct device_gpu_info infos[DEVICE_MAX_GPUS];
        char msg[512] = "";
        /* every graph op has a case to run here: checked with or without a GPU */
        int n_cases = 0;
        for (int op = 0; op < GOP__COUNT; op++) {
                struct graph *g;
                if (gcase_build((enum graph_op)op, 0, &g, msg, sizeof(msg)) < 0) {
                        printf("FAIL: graph op %s has no case in tests/unit/graph_cases.h (%s)\n",
                               graph_op_name((enum graph_op)op), msg);
                        return 1;
                }
                graph_free(g);
                for (int v = 0; v < GCASE_VARIANTS && gcase_build((enum graph_op)op, v, &g, msg, sizeof(msg)) == 0; v++) {
                        graph_free(g);
                        n_cases++;
                }
        }
        int n = device_cuda_probe(infos, DEVICE_MAX_GPUS, msg, sizeof(msg));
        if (n <= 0) {
                printf("SKIP: no CUDA device (%s); the CUDA backend's ops and the %d graph ops (%d cases) are not "
                       "checked\n", n < 0 ? msg : "none visible", GOP__COUNT, n_cases);
                return 77;
        }
        printf("# gpu:0 %s, cc %d.%d, %.1f GiB\n", infos[0].name, infos[0].cc_major, infos[0].cc_minor,
               infos[0].total_bytes / 1073741824.0);
        rng_init(&rg, 2024, 6);
        struct device_opts o = { .n_gpus = 1, .gpus = { 0 }, .gpu_memory_fraction = 0.25, .allow_growth = true };
        if (backend_cpu_new(1, &cpu) < 0 || device_cuda_new(&o, &gpu, msg, sizeof(msg)) < 0) {
                printf("cannot start the backends: %s\n", msg);
                return 1;
        }
        t_buffers();
        for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                        t_gemm(37, 53, 71, ta, tb, 1.0f, 0.0f, 0);
                        t_gemm(64, 1024, 3136, ta, tb, 1.0f, 0.0f, 0);
                        t_gemm(13, 7, 5, ta, tb, 0.5f, 0.25f, 3);
                }
        t_gemm(1, 1, 1, false, false, 1.0f, 1.0f, 0);
        t_bias(64, 1024);
        t_bias(3, 10);
        t_activations(64 * 32 * 28 * 28);
        t_activations(5);
        t_softmax(64, 10, 3.0f);
        t_softmax(7, 13, 60.0f); /* large logits: underflowing probabilities, finite loss */
        t_softmax(1, 2, 1.0f);
        t_conv(3, 2, 7, 9, 4, 3);
        t_conv(2, 3, 6, 5, 5, 5);
        t_conv(2, 2, 5, 4, 3, 2); /* even kernels: extra padding after */
        t_conv(2, 3, 8, 8, 4, 4);
        t_conv(2, 3, 4, 4, 2, 1);
        t_conv(64, 1, 28, 28, 32, 5); /* the CNN's layers */
        t_conv(64, 32, 14, 14, 64, 5);
        t_pool(2, 3, 5, 7, 2, false);
        t_pool(64, 32, 28, 28, 2, true);
        t_pool(2, 2, 7, 8, 3, true);
        t_graph_ops();
        t_model();
        t_cap(&infos[0]);
        backend_free(cpu);
        backend_free(gpu);
        printf("%s: %d check%s failed\n", failures ? "FAIL" : "PASS", failures, failures == 1 ? "" : "s");
        return failures ? 1 : 0;
}
