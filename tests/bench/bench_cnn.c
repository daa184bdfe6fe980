/* CNN training speed: forward + backward + Momentum update of examples/fmnist-cnn.json's model on random
 * data, at the job's batch size, through the same device selection workerd uses (device.h). Prints one
 * JSON line per thread count (CPU) or one for the GPU(s), with the GFLOP/s the figure means.
 *
 *   bench_cnn [--config FILE] [--device cpu|gpu:N|auto] [--threads 1,2] [--steps N] [--batch N]
 *             [--profile] [--worker-step]
 *
 * --profile adds the time spent in each backend op (synchronizing after each one). --worker-step leaves
 * out the host's optimizer update: what workerd's device does per step (forward, backward, gradients
 * to the host, parameters to the device), the update being the ps's. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "config.h"
#include "device.h"
#include "model.h"
#include "optim.h"
#include "rng.h"
#include "util.h"

#ifndef PSFLEET_SOURCE_DIR
#define PSFLEET_SOURCE_DIR "."
#endif

/* ---- a timing wrapper around a backend's heavy ops ---- */

enum { P_GEMM, P_BIAS, P_CONV_F, P_CONV_B, P_POOL_F, P_POOL_B, P_ACT_F, P_ACT_B, P_XENT, P_UP, P_DOWN, P_N };
static const char *const p_names[P_N] = { "gemm", "bias", "conv_fwd", "conv_bwd", "pool_fwd",
                                          "pool_bwd", "act_fwd", "act_bwd", "xent", "upload", "download" };
static double p_us[P_N];
static struct backend *p_inner;
static struct backend_ops p_ops;

#define TIMED(slot, call)                                                                          \
        do {                                                                                       \
                uint64_t t0_ = mono_us();                                                          \
                int r_ = (call);                                                                   \
                if (r_ == 0)                                                                       \
                        r_ = p_inner->ops->synchronize(p_inner);                                   \
                p_us[slot] += (double)(mono_us() - t0_);                                           \
                return r_;                                                                         \
        } while (0)

static void *p_alloc(struct backend *be, size_t n) { return p_inner->ops->alloc(p_inner, n); }
static void p_buf_free(struct backend *be, void *b) { p_inner->ops->buf_free(p_inner, b); }
static int p_upload(struct backend *be, void *d, const void *s, size_t n) { TIMED(P_UP, p_inner->ops->upload(p_inner, d, s, n)); }
static int p_download(struct backend *be, void *d, const void *s, size_t n) { TIMED(P_DOWN, p_inner->ops->download(p_inner, d, s, n)); }
static int p_memset0(struct backend *be, void *d, size_t n) { return p_inner->ops->memset0(p_inner, d, n); }
static int p_sync(struct backend *be) { return p_inner->ops->synchronize(p_inner); }
static int p_pin(struct backend *be, void *p, size_t n) { return backend_host_pin(p_inner, p, n) ? 0 : -ENOTSUP; }
static void p_unpin(struct backend *be, void *p) { backend_host_unpin(p_inner, p); }
static int p_gemm(struct backend *be, bool ta, bool tb, uint32_t M, uint32_t N, uint32_t K, float alpha,
                  const void *A, uint32_t lda, const void *B, uint32_t ldb, float beta, void *C, uint32_t ldc)
{
        TIMED(P_GEMM, p_inner->ops->gemm(p_inner, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
}
static int p_add_bias(struct backend *be, void *y, const void *b, uint32_t rows, uint32_t n)
{
        TIMED(P_BIAS, p_inner->ops->add_bias_rows(p_inner, y, b, rows, n));
}
static int p_bias_grad(struct backend *be, const void *dy, void *db, uint32_t rows, uint32_t n)
{
        TIMED(P_BIAS, p_inner->ops->bias_grad(p_inner, dy, db, rows, n));
}
static int p_relu_f(struct backend *be, const void *x, void *y, size_t n) { TIMED(P_ACT_F, p_inner->ops->relu_fwd(p_inner, x, y, n)); }
static int p_relu_b(struct backend *be, const void *y, const void *dy, void *dx, size_t n) { TIMED(P_ACT_B, p_inner->ops->relu_bwd(p_inner, y, dy, dx, n)); }
static int p_tanh_f(struct backend *be, const void *x, void *y, size_t n) { TIMED(P_ACT_F, p_inner->ops->tanh_fwd(p_inner, x, y, n)); }
static int p_tanh_b(struct backend *be, const void *y, const void *dy, void *dx, size_t n) { TIMED(P_ACT_B, p_inner->ops->tanh_bwd(p_inner, y, dy, dx, n)); }
static int p_sigm_f(struct backend *be, const void *x, void *y, size_t n) { TIMED(P_ACT_F, p_inner->ops->sigmoid_fwd(p_inner, x, y, n)); }
static int p_sigm_b(struct backend *be, const void *y, const void *dy, void *dx, size_t n) { TIMED(P_ACT_B, p_inner->ops->sigmoid_bwd(p_inner, y, dy, dx, n)); }
static int p_xent_f(struct backend *be, const void *l, const void *lab, uint32_t B, uint32_t C, void *p, float *loss)
{
        TIMED(P_XENT, p_inner->ops->softmax_xent_fwd(p_inner, l, lab, B, C, p, loss));
}
static int p_xent_b(struct backend *be, const void *p, const void *lab, uint32_t B, uint32_t C, void *d)
{
        TIMED(P_XENT, p_inner->ops->softmax_xent_bwd(p_inner, p, lab, B, C, d));
}
static int p_correct(struct backend *be, const void *s, const void *lab, uint32_t B, uint32_t C, uint32_t *c)
{
        TIMED(P_XENT, p_inner->ops->correct_count(p_inner, s, lab, B, C, c));
}
static int p_conv_f(struct backend *be, const void *x, const void *w, const void *b, void *y, uint32_t B,
                    uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k, void *col)
{
        TIMED(P_CONV_F, p_inner->ops->conv2d_fwd(p_inner, x, w, b, y, B, C, H, W, F, k, col));
}
static int p_conv_b(struct backend *be, const void *x, const void *w, const void *dy, void *dw, void *db,
                    void *dx, uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k, void *col)
{
        TIMED(P_CONV_B, p_inner->ops->conv2d_bwd(p_inner, x, w, dy, dw, db, dx, B, C, H, W, F, k, col));
}
static int p_pool_f(struct backend *be, const void *x, void *y, uint32_t B, uint32_t C, uint32_t H, uint32_t W,
                    uint32_t p)
{
        TIMED(P_POOL_F, p_inner->ops->maxpool2d_fwd(p_inner, x, y, B, C, H, W, p));
}
static int p_pool_b(struct backend *be, const void *x, const void *dy, void *dx, uint32_t B, uint32_t C,
                    uint32_t H, uint32_t W, uint32_t p)
{
        TIMED(P_POOL_B, p_inner->ops->maxpool2d_bwd(p_inner, x, dy, dx, B, C, H, W, p));
}
static void p_free(struct backend *be) { }

/* Wraps inner in a timing backend; the wrapper borrows inner (free the wrapper, then inner). */
static struct backend *profile_wrap(struct backend *inner)
{
        static struct backend wrapped;
        p_inner = inner;
        p_ops = (struct backend_ops){
                .name = inner->ops->name, .host_memory = inner->ops->host_memory, .free = p_free,
                .alloc = p_alloc, .buf_free = p_buf_free, .upload = p_upload, .download = p_download,
                .memset0 = p_memset0, .synchronize = p_sync, .gemm = p_gemm, .add_bias_rows = p_add_bias,
                .bias_grad = p_bias_grad, .relu_fwd = p_relu_f, .relu_bwd = p_relu_b, .tanh_fwd = p_tanh_f,
                .tanh_bwd = p_tanh_b, .sigmoid_fwd = p_sigm_f, .sigmoid_bwd = p_sigm_b,
                .softmax_xent_fwd = p_xent_f, .softmax_xent_bwd = p_xent_b, .correct_count = p_correct,
                .conv2d_fwd = p_conv_f, .conv2d_bwd = p_conv_b, .maxpool2d_fwd = p_pool_f,
                .maxpool2d_bwd = p_pool_b, .host_pin = p_pin, .host_unpin = p_unpin,
        };
        wrapped.ops = &p_ops;
        wrapped.ctx = NULL;
        memset(p_us, 0, sizeof(p_us));
        return &wrapped;
}

/* ---- the benchmark ---- */

/* Multiply-adds x2 of one example's forward + backward (no input gradient for the first layer with
 * parameters, as model_backward skips it). */
static double flops_per_example(const struct model_spec *s)
{
        double f = 0;
        uint64_t c = s->input[0], h = s->input[1], w = s->input[2];
        bool first = true;
        for (uint32_t i = 0; i < s->n_layers; i++) {
                const struct layer_spec *l = &s->layers[i];
                double fwd = 0;
                switch (l->type) {
                case LAYER_CONV2D:
                        fwd = 2.0 * l->filters * c * l->kernel * l->kernel * h * w;
                        c = l->filters;
                        break;
                case LAYER_DENSE:
                        fwd = 2.0 * c * h * w * l->units;
                        c = 1, h = 1, w = l->units;
                        break;
                case LAYER_MAXPOOL2D:
                        h /= l->pool, w /= l->pool;
                        break;
                case LAYER_FLATTEN:
                        w = c * h * w, c = 1, h = 1;
                        break;
                default:
                        break;
                }
                if (fwd > 0) {
                        f += fwd * (first ? 2 : 3);
                        first = false;
                }
        }
        return f;
}

struct run_result {
        double examples_per_s, ms_per_step;
        float first_loss, last_loss;
};

static int run_one(const struct job_config *cfg, struct backend *be, uint32_t B, unsigned steps, bool update,
                   struct run_result *res, char *err, size_t errlen)
{
        struct model *m = NULL;
        float *x = NULL, *slots = NULL;
        uint8_t *y = NULL;
        int r = device_model_new(be, &cfg->model, B, &m, err, errlen);
        if (r < 0)
                return r;
        if ((r = model_init_params(m, cfg->model.seed)) < 0)
                goto out;
        uint32_t D = model_input_size(m), C = model_n_classes(m);
        size_t np = model_n_params(m);
        unsigned ns = optim_n_slots(cfg->training.optimizer);
        x = malloc(sizeof(float) * B * D);
        y = malloc(B);
        slots = calloc((ns ? ns : 1) * np, sizeof(float));
        if (!x || !y || !slots) {
                r = -ENOMEM;
                goto out;
        }
        /* A fixed batch of Fashion-MNIST-like values: speed does not depend on the data. */
        struct rng rg;
        rng_init(&rg, 7, 0);
        for (size_t i = 0; i < (size_t)B * D; i++)
                x[i] = rng_uniform_f(&rg, 0.0f, 1.0f);
        for (uint32_t b = 0; b < B; b++)
                y[b] = (uint8_t)(b % C);
        unsigned warm = 3;
        uint64_t t0 = 0;
        for (unsigned s = 0; s < warm + steps; s++) {
                if (s == warm) {
                        memset(p_us, 0, sizeof(p_us));
                        t0 = mono_us();
                }
                float loss;
                if ((r = model_forward(m, x, y, B, &loss, NULL)) < 0 || (r = model_backward(m, NULL, NULL)) < 0)
                        goto out;
                float *p = model_params(m), *g = model_grads(m);
                for (uint32_t v = 0; update && v < model_n_vars(m); v++) {
                        const struct model_var *mv = model_var(m, v);
                        float *sl[OPTIM_MAX_SLOTS] = { 0 };
                        for (unsigned k = 0; k < ns; k++)
                                sl[k] = slots + k * np + mv->offset;
                        optim_apply(&cfg->training, s, p + mv->offset, g + mv->offset, sl,
                                    (size_t)mv->rows * mv->cols);
                }
                if ((r = model_params_sync(m)) < 0)
                        goto out;
                if (s == 0)
                        res->first_loss = loss;
                res->last_loss = loss;
        }
        double sec = (double)(mono_us() - t0) / 1e6;
        res->examples_per_s = (double)steps * B / sec;
        res->ms_per_step = sec * 1e3 / steps;
        r = 0;
out:
        if (r < 0 && err[0] == 0)
                snprintf(err, errlen, "%s", strerror(-r));
        free(x);
        free(y);
        free(slots);
        model_free(m);
        return r;
}

static void usage(void)
{
        fprintf(stderr, "usage: bench_cnn [--config FILE] [--device DEV] [--threads 1,2] [--steps N] "
                        "[--batch N] [--profile] [--worker-step]\n");
}

int main(int argc, char **argv)
{
        const char *config = PSFLEET_SOURCE_DIR "/examples/fmnist-cnn.json";
        const char *device = "cpu", *threads = "1,2";
        unsigned steps = 20;
        uint32_t batch = 0;
        bool profile = false, worker_step = false;
        for (int i = 1; i < argc; i++) {
                bool more = i + 1 < argc;
                if (strcmp(argv[i], "--config") == 0 && more)
                        config = argv[++i];
                else if (strcmp(argv[i], "--device") == 0 && more)
                        device = argv[++i];
                else if (strcmp(argv[i], "--threads") == 0 && more)
                        threads = argv[++i];
                else if (strcmp(argv[i], "--steps") == 0 && more)
                        steps = (unsigned)strtoul(argv[++i], NULL, 10);
                else if (strcmp(argv[i], "--batch") == 0 && more)
                        batch = (uint32_t)strtoul(argv[++i], NULL, 10);
                else if (strcmp(argv[i], "--profile") == 0)
                        profile = true;
                else if (strcmp(argv[i], "--worker-step") == 0)
                        worker_step = true;
                else {
                        usage();
                        return 2;
                }
        }
        if (steps == 0) {
                usage();
                return 2;
        }
        char err[512] = "";
        struct job_config *cfg;
        if (config_load(config, &cfg, err, sizeof(err)) < 0) {
                fprintf(stderr, "bench_cnn: %s\n", err);
                return 1;
        }
        free(cfg->device.device);
        cfg->device.device = strdup(device);
        if (batch == 0)
                batch = cfg->training.batch_size;
        double fpe = flops_per_example(&cfg->model);
        bool is_cpu = strcmp(device, "cpu") == 0;
        int rc = 0;
        for (const char *t = threads; *t;) {
                unsigned nt = (unsigned)strtoul(t, (char **)&t, 10);
                if (*t == ',')
                        t++;
                struct backend *be = NULL;
                char msg[512] = "";
                err[0] = 0;
                int r = device_backend_new(&cfg->device, nt, &be, msg, sizeof(msg));
                if (r < 0) {
                        fprintf(stderr, "bench_cnn: %s\n", msg);
                        rc = 1;
                        break;
                }
                fprintf(stderr, "bench_cnn: %s\n", msg); /* where it runs, and any fallback */
                struct run_result res = { 0 };
                struct backend *use = profile ? profile_wrap(be) : be;
                r = run_one(cfg, use, batch, steps, !worker_step, &res, err, sizeof(err));
                const char *name = backend_name(be);
                if (r < 0) {
                        fprintf(stderr, "bench_cnn: %s: %s\n", name, err);
                        rc = 1;
                } else {
                        printf("{\"bench\": \"cnn\", \"step\": \"%s\", \"backend\": \"%s\", \"device\": \"%s\", \"threads\": %u, "
                               "\"batch\": %u, \"steps\": %u, \"examples_per_s\": %.1f, \"ms_per_step\": %.2f, "
                               "\"gflop_per_s\": %.1f, \"loss_first\": %.4f, \"loss_last\": %.4f",
                               worker_step ? "worker (no host update)" : "standalone (host update)", name, device, nt,
                               batch, steps, res.examples_per_s, res.ms_per_step,
                               res.examples_per_s * fpe / 1e9, res.first_loss, res.last_loss);
                        if (profile) {
                                printf(", \"ms_per_step_by_op\": {");
                                for (int k = 0; k < P_N; k++)
                                        printf("%s\"%s\": %.2f", k ? ", " : "", p_names[k], p_us[k] / 1e3 / steps);
                                printf("}");
                        }
                        printf("}\n");
                        fflush(stdout);
                }
                backend_free(be);
                if (!is_cpu || rc)
                        break; /* a GPU backend ignores the thread count */
        }
        config_free(cfg);
        return rc;
}
