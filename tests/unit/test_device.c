/* device: option parsing and environment overrides, soft placement with "no GPU" faked
 * (PSFLEET_TEST_FAKE_NO_GPU=1), the error for an explicit GPU that cannot be had, device_model_new and the
 * placement description on the CPU. Built twice when CUDA is found: here without the CUDA backend
 * (the "no CUDA compiled in" path), and as gpu.test_device_cuda with it (the real probe, which on a
 * machine without a GPU or driver must fall back just the same). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "backend.h"
#include "config.h"
#include "device.h"
#include "model.h"
#include "replicas.h"

static const char *const vars[] = { "PSFLEET_DEVICE", "PSFLEET_GPU_MEMORY_FRACTION", "PSFLEET_ALLOW_GROWTH",
                                    "PSFLEET_LOG_DEVICE_PLACEMENT", "PSFLEET_ALLOW_SOFT_PLACEMENT",
                                    "PSFLEET_TEST_FAKE_NO_GPU" };

static int clean_env(void **state)
{
        for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
                unsetenv(vars[i]);
        return 0;
}

static struct device_config dc(const char *device)
{
        struct device_config d = { .device = (char *)device, .gpu_memory_fraction = 1.0 };
        return d;
}

static void test_cpu(void **state)
{
        struct device_config d = dc("cpu");
        struct backend *be = NULL;
        char msg[256] = "";
        assert_int_equal(device_backend_new(&d, 1, &be, msg, sizeof(msg)), 0);
        assert_non_null(be);
        assert_string_equal(backend_name(be), "cpu");
        assert_string_equal(msg, "cpu, 1 BLAS thread");
        backend_free(be);
}

static void test_auto_falls_back(void **state)
{
        setenv("PSFLEET_TEST_FAKE_NO_GPU", "1", 1);
        struct device_config d = dc("auto");
        struct backend *be = NULL;
        char msg[512] = "";
        assert_int_equal(device_backend_new(&d, 2, &be, msg, sizeof(msg)), DEVICE_FELL_BACK);
        assert_non_null(be);
        assert_string_equal(backend_name(be), "cpu");
        assert_non_null(strstr(msg, "device auto: no usable GPU (PSFLEET_TEST_FAKE_NO_GPU is set)"));
        assert_non_null(strstr(msg, "running on the CPU with 2 BLAS threads"));
        backend_free(be);
}

/* Without faking anything: a GPU is used when there is one, else the CPU with a reason. */
static void test_auto_real(void **state)
{
        struct device_config d = dc("auto");
        d.allow_growth = true; /* where there is a GPU, take nothing up front */
        struct backend *be = NULL;
        char msg[512] = "";
        int r = device_backend_new(&d, 1, &be, msg, sizeof(msg));
        print_message("auto: %d %s\n", r, msg);
        assert_true(r == 0 || r == DEVICE_FELL_BACK);
        assert_non_null(be);
        if (r == DEVICE_FELL_BACK) {
                assert_string_equal(backend_name(be), "cpu");
                assert_non_null(strstr(msg, "no usable GPU"));
        }
        backend_free(be);
}

static void test_explicit_gpu_fails(void **state)
{
        setenv("PSFLEET_TEST_FAKE_NO_GPU", "1", 1);
        const char *devs[] = { "gpu:0", "gpu:1,0" };
        for (size_t i = 0; i < 2; i++) {
                struct device_config d = dc(devs[i]);
                struct backend *be = (struct backend *)0x1; /* must stay untouched */
                char msg[512] = "";
                assert_int_equal(device_backend_new(&d, 1, &be, msg, sizeof(msg)), -ENODEV);
                assert_ptr_equal(be, (struct backend *)0x1);
                char want[64];
                snprintf(want, sizeof(want), "device \"%s\":", devs[i]);
                assert_non_null(strstr(msg, want));
                assert_non_null(strstr(msg, "no GPU is visible (PSFLEET_TEST_FAKE_NO_GPU is set)"));
                assert_non_null(strstr(msg, "PSFLEET_ALLOW_SOFT_PLACEMENT=1"));
        }
}

static void test_explicit_gpu_soft(void **state)
{
        setenv("PSFLEET_TEST_FAKE_NO_GPU", "1", 1);
        setenv("PSFLEET_ALLOW_SOFT_PLACEMENT", "true", 1);
        struct device_config d = dc("gpu:0");
        struct backend *be = NULL;
        char msg[512] = "";
        assert_int_equal(device_backend_new(&d, 1, &be, msg, sizeof(msg)), DEVICE_FELL_BACK);
        assert_string_equal(backend_name(be), "cpu");
        assert_non_null(strstr(msg, "device \"gpu:0\": no GPU is visible"));
        backend_free(be);
}

static void test_env_overrides(void **state)
{
        struct device_request req;
        char msg[256] = "";
        struct device_config d = { .device = (char *)"gpu:0", .gpu_memory_fraction = 0.5, .allow_growth = false,
                                   .log_device_placement = false };
        assert_int_equal(device_request_resolve(&d, &req, msg, sizeof(msg)), 0);
        assert_int_equal(req.kind, DEVICE_GPU);
        assert_int_equal(req.n_gpus, 1);
        assert_true(req.gpu_memory_fraction == 0.5);
        assert_false(req.allow_growth || req.log_device_placement || req.allow_soft_placement || req.fake_no_gpu);

        setenv("PSFLEET_DEVICE", "gpu:3,1", 1);
        setenv("PSFLEET_GPU_MEMORY_FRACTION", "0.25", 1);
        setenv("PSFLEET_ALLOW_GROWTH", "1", 1);
        setenv("PSFLEET_LOG_DEVICE_PLACEMENT", "yes", 1);
        assert_int_equal(device_request_resolve(&d, &req, msg, sizeof(msg)), 0);
        assert_int_equal(req.kind, DEVICE_GPU);
        assert_int_equal(req.n_gpus, 2);
        assert_int_equal(req.gpus[0], 3);
        assert_int_equal(req.gpus[1], 1);
        assert_true(req.gpu_memory_fraction == 0.25);
        assert_true(req.allow_growth && req.log_device_placement);
        assert_true(device_log_placement(&d));

        /* an empty variable is no override */
        setenv("PSFLEET_DEVICE", "", 1);
        assert_int_equal(device_request_resolve(&d, &req, msg, sizeof(msg)), 0);
        assert_int_equal(req.n_gpus, 1);

        /* PSFLEET_DEVICE=cpu wins over the job file's GPU */
        setenv("PSFLEET_DEVICE", "cpu", 1);
        struct backend *be = NULL;
        assert_int_equal(device_backend_new(&d, 1, &be, msg, sizeof(msg)), 0);
        assert_string_equal(backend_name(be), "cpu");
        backend_free(be);
}

static void test_bad_values(void **state)
{
        static const struct {
                const char *var, *value, *want;
        } bad[] = {
                { "PSFLEET_DEVICE", "gpu", "PSFLEET_DEVICE: \"gpu\" is not auto, cpu" },
                { "PSFLEET_DEVICE", "gpu:", "PSFLEET_DEVICE: \"gpu:\"" },
                { "PSFLEET_DEVICE", "gpu:1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "lists more than 16 GPUs" },
                { "PSFLEET_DEVICE", "gpu:256", "PSFLEET_DEVICE: \"gpu:256\"" },
                { "PSFLEET_DEVICE", "gpu:0,", "PSFLEET_DEVICE: \"gpu:0,\"" },
                { "PSFLEET_DEVICE", "GPU:0", "PSFLEET_DEVICE: \"GPU:0\"" },
                { "PSFLEET_GPU_MEMORY_FRACTION", "0", "PSFLEET_GPU_MEMORY_FRACTION: \"0\" is not a number in (0, 1]" },
                { "PSFLEET_GPU_MEMORY_FRACTION", "1.5", "PSFLEET_GPU_MEMORY_FRACTION: \"1.5\"" },
                { "PSFLEET_GPU_MEMORY_FRACTION", "half", "PSFLEET_GPU_MEMORY_FRACTION: \"half\"" },
                { "PSFLEET_GPU_MEMORY_FRACTION", "0.5x", "PSFLEET_GPU_MEMORY_FRACTION: \"0.5x\"" },
                { "PSFLEET_ALLOW_GROWTH", "maybe", "PSFLEET_ALLOW_GROWTH: \"maybe\" is not 0, 1, true or false" },
                { "PSFLEET_LOG_DEVICE_PLACEMENT", "2", "PSFLEET_LOG_DEVICE_PLACEMENT: \"2\"" },
                { "PSFLEET_TEST_FAKE_NO_GPU", "y", "PSFLEET_TEST_FAKE_NO_GPU: \"y\"" },
        };
        struct device_config d = dc("auto");
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                clean_env(NULL);
                setenv(bad[i].var, bad[i].value, 1);
                struct backend *be = NULL;
                char msg[256] = "";
                assert_int_equal(device_backend_new(&d, 1, &be, msg, sizeof(msg)), -EINVAL);
                assert_null(be);
                if (!strstr(msg, bad[i].want))
                        fail_msg("%s=%s: message \"%s\" lacks \"%s\"", bad[i].var, bad[i].value, msg, bad[i].want);
        }
        clean_env(NULL);
        struct device_config junk = dc("tpu:0");
        struct device_request req;
        char msg[256] = "";
        assert_int_equal(device_request_resolve(&junk, &req, msg, sizeof(msg)), -EINVAL);
        assert_non_null(strstr(msg, "device.device: \"tpu:0\""));
}

static void test_model_and_placement(void **state)
{
        struct model_spec spec = { .input = { 1, 6, 6 }, .n_layers = 7 };
        spec.layers[0] = (struct layer_spec){ .type = LAYER_CONV2D, .filters = 2, .kernel = 3 };
        spec.layers[1] = (struct layer_spec){ .type = LAYER_RELU };
        spec.layers[2] = (struct layer_spec){ .type = LAYER_MAXPOOL2D, .pool = 2 };
        spec.layers[3] = (struct layer_spec){ .type = LAYER_FLATTEN };
        spec.layers[4] = (struct layer_spec){ .type = LAYER_DENSE, .units = 8 };
        spec.layers[5] = (struct layer_spec){ .type = LAYER_TANH };
        spec.layers[6] = (struct layer_spec){ .type = LAYER_DENSE, .units = 3 };
        struct device_config d = dc("cpu");
        struct backend *be;
        struct model *m = NULL;
        char msg[256];
        assert_int_equal(device_backend_new(&d, 1, &be, msg, sizeof(msg)), 0);
        assert_int_equal(device_model_new(be, &spec, 4, &m, msg, sizeof(msg)), 0);
        assert_non_null(m);
        char buf[2048];
        int lines = device_placement(be, m, buf, sizeof(buf));
        print_message("%s\n", buf);
        assert_int_equal(lines, 8); /* seven layers and the loss */
        assert_non_null(strstr(buf, "conv2d"));
        assert_non_null(strstr(buf, ": cpu (OpenBLAS sgemm)"));
        assert_non_null(strstr(buf, "softmax cross-entropy"));
        /* truncation keeps a terminated string */
        char small[16];
        assert_int_equal(device_placement(be, m, small, sizeof(small)), 8);
        assert_int_equal(strlen(small), sizeof(small) - 1);
        model_free(m);

        /* a spec that makes no sense: the error comes back with a message */
        struct model_spec bad = spec;
        bad.layers[0].kernel = 9;
        m = NULL;
        assert_int_equal(device_model_new(be, &bad, 4, &m, msg, sizeof(msg)), -EINVAL);
        assert_null(m);
        assert_non_null(strstr(msg, "cannot build the model"));
        backend_free(be);
}

/* ---- replicas: two CPU backends against one model over the whole batch ---- */

struct trace {
        uint32_t n, var[256], block[256];
        const float *server; /* the values the "ps" hands out in before */
        float *params;       /* the model's host block the callback fills */
        const float *want_grads;
        const float *grads;
        const struct model *m;
        double worst;        /* after: worst relative error against want_grads */
        int fail_at;         /* before returns 7 at this call (-1: never) */
};

static int trace_before(void *ud, uint32_t var, uint32_t block)
{
        struct trace *t = ud;
        if ((int)t->n == t->fail_at)
                return 7;
        const struct model_var *v = model_var(t->m, var);
        const uint32_t *rb;
        model_var_blocks(t->m, var, &rb);
        size_t first = v->offset + (size_t)rb[block] * v->cols, count = (size_t)(rb[block + 1] - rb[block]) * v->cols;
        memcpy(t->params + first, t->server + first, sizeof(float) * count);
        t->var[t->n] = var;
        t->block[t->n++] = block;
        return 0;
}

static int trace_after(void *ud, uint32_t var, uint32_t block)
{
        struct trace *t = ud;
        t->var[t->n] = var;
        t->block[t->n++] = block;
        if (t->want_grads) {
                const struct model_var *v = model_var(t->m, var);
                const uint32_t *rb;
                model_var_blocks(t->m, var, &rb);
                size_t first = v->offset + (size_t)rb[block] * v->cols;
                size_t count = (size_t)(rb[block + 1] - rb[block]) * v->cols;
                for (size_t i = first; i < first + count; i++) {
                        /* 1e-4 relative, 1e-6 absolute */
                        double e = fabs((double)t->grads[i] - t->want_grads[i]) / (0.01 + fabs(t->want_grads[i]));
                        t->worst = e > t->worst ? e : t->worst;
                }
        }
        return 0;
}

static void test_replicas(void **state)
{
        struct model_spec spec = { .input = { 2, 6, 6 }, .n_layers = 8 };
        spec.layers[0] = (struct layer_spec){ .type = LAYER_CONV2D, .filters = 3, .kernel = 3 };
        spec.layers[1] = (struct layer_spec){ .type = LAYER_RELU };
        spec.layers[2] = (struct layer_spec){ .type = LAYER_MAXPOOL2D, .pool = 2 };
        spec.layers[3] = (struct layer_spec){ .type = LAYER_FLATTEN };
        spec.layers[4] = (struct layer_spec){ .type = LAYER_DENSE, .units = 9 };
        spec.layers[5] = (struct layer_spec){ .type = LAYER_TANH };
        spec.layers[6] = (struct layer_spec){ .type = LAYER_DENSE, .units = 4 };
        spec.layers[7] = (struct layer_spec){ .type = LAYER_SIGMOID };
        const uint32_t B = 7, D = 2 * 6 * 6;
        struct backend *b1, *bes[3];
        struct model *m1;
        struct replicas *rs;
        char msg[256];
        assert_int_equal(backend_cpu_new(1, &b1), 0);
        for (int i = 0; i < 3; i++)
                assert_int_equal(backend_cpu_new(1, &bes[i]), 0);
        assert_int_equal(model_new(&spec, b1, B, &m1), 0);
        assert_int_equal(replicas_new(bes, 3, &spec, B, &rs, msg, sizeof(msg)), 0);
        assert_int_equal(replicas_count(rs), 3);
        struct model *m0 = replicas_model(rs);
        assert_int_equal(model_max_batch(m0), 3); /* ceil(7 / 3) */
        const uint32_t rows[] = { 0, 5, 11 };     /* dense0/kernel (27, 9) in three blocks */
        int dv = model_find_var(m1, "dense0/kernel");
        assert_true(dv >= 0);
        assert_int_equal(model_set_var_blocks(m1, (uint32_t)dv, 3, rows), 0);
        assert_int_equal(replicas_set_var_blocks(rs, (uint32_t)dv, 3, rows), 0);

        size_t np = model_n_params(m1);
        float *server = malloc(sizeof(float) * np), *want = malloc(sizeof(float) * np);
        assert_int_equal(model_init_params(m1, 5), 0);
        memcpy(server, model_params(m1), sizeof(float) * np);
        for (size_t i = 0; i < np; i++)
                server[i] += 0.01f * (float)((int)(i % 7) - 3); /* biases nonzero too */
        float *x = malloc(sizeof(float) * B * D);
        uint8_t y[7] = { 0, 1, 2, 3, 3, 2, 1 };
        for (size_t i = 0; i < (size_t)B * D; i++)
                x[i] = (float)((i * 37) % 101) / 101.0f - 0.3f;

        for (int round = 0; round < 2; round++) {
                /* one model, the whole batch */
                struct trace t1 = { .server = server, .params = model_params(m1), .m = m1, .fail_at = -1 };
                float l1, lr;
                uint32_t c1, cr;
                assert_int_equal(model_forward_blocks(m1, x, y, B, &l1, &c1, trace_before, &t1), 0);
                struct trace a1 = { .m = m1, .fail_at = -1 };
                assert_int_equal(model_backward_blocks(m1, trace_after, &a1), 0);
                memcpy(want, model_grads(m1), sizeof(float) * np);

                /* three replicas of 3, 2 and 2 examples */
                struct trace tr = { .server = server, .params = model_params(m0), .m = m0, .fail_at = -1 };
                assert_int_equal(replicas_forward_blocks(rs, x, y, B, &lr, &cr, trace_before, &tr), 0);
                assert_int_equal(tr.n, t1.n);
                assert_memory_equal(tr.var, t1.var, sizeof(uint32_t) * t1.n);
                assert_memory_equal(tr.block, t1.block, sizeof(uint32_t) * t1.n);
                print_message("round %d: loss %.7f vs %.7f, correct %u vs %u\n", round, lr, l1, cr, c1);
                assert_true(fabs(lr - l1) <= 1e-5 * fabs(l1));
                assert_int_equal(cr, c1);
                struct trace ar = { .m = m0, .want_grads = want, .grads = model_grads(m0), .fail_at = -1 };
                assert_int_equal(replicas_backward_blocks(rs, trace_after, &ar), 0);
                assert_int_equal(ar.n, a1.n);
                assert_memory_equal(ar.var, a1.var, sizeof(uint32_t) * a1.n);
                assert_memory_equal(ar.block, a1.block, sizeof(uint32_t) * a1.n);
                print_message("round %d: worst gradient error %.2g (checked inside each after callback)\n", round, ar.worst);
                assert_true(ar.worst < 1e-4);
                for (size_t i = 0; i < np; i++)
                        server[i] -= 0.1f * want[i];
        }

        /* a batch smaller than the replicas: one example runs on replica 0 alone */
        struct trace t = { .server = server, .params = model_params(m0), .m = m0, .fail_at = -1 };
        float l;
        assert_int_equal(replicas_forward_blocks(rs, x, y, 1, &l, NULL, trace_before, &t), 0);
        assert_int_equal(replicas_backward_blocks(rs, NULL, NULL), 0);
        /* a failing callback stops every replica and comes back; the next pass works */
        struct trace tf = { .server = server, .params = model_params(m0), .m = m0, .fail_at = 2 };
        assert_int_equal(replicas_forward_blocks(rs, x, y, B, &l, NULL, trace_before, &tf), 7);
        t.n = 0;
        assert_int_equal(replicas_forward_blocks(rs, x, y, B, &l, NULL, trace_before, &t), 0);
        /* bounds */
        assert_int_equal(replicas_forward_blocks(rs, x, y, 10, &l, NULL, NULL, NULL), -EINVAL);
        assert_int_equal(replicas_forward_blocks(rs, x, y, 0, &l, NULL, NULL, NULL), -EINVAL);
        /* params_sync: replica 0's host values reach every replica */
        memcpy(model_params(m0), server, sizeof(float) * np);
        assert_int_equal(replicas_params_sync(rs), 0);
        assert_int_equal(replicas_forward_blocks(rs, x, y, B, &l, NULL, NULL, NULL), 0);

        replicas_free(rs);
        model_free(m1);
        for (int i = 0; i < 3; i++)
                backend_free(bes[i]);
        backend_free(b1);
        free(server), free(want), free(x);
}

/* One backend: the replicas are that backend's model, bit for bit, with the same callbacks in order. */
static void test_replicas_one(void **state)
{
        struct model_spec spec = { .input = { 1, 4, 4 }, .n_layers = 4 };
        spec.layers[0] = (struct layer_spec){ .type = LAYER_FLATTEN };
        spec.layers[1] = (struct layer_spec){ .type = LAYER_DENSE, .units = 6 };
        spec.layers[2] = (struct layer_spec){ .type = LAYER_RELU };
        spec.layers[3] = (struct layer_spec){ .type = LAYER_DENSE, .units = 3 };
        const uint32_t B = 5, D = 16;
        struct backend *b1, *b2;
        struct model *m1;
        struct replicas *rs;
        char msg[256];
        assert_int_equal(backend_cpu_new(1, &b1), 0);
        assert_int_equal(backend_cpu_new(1, &b2), 0);
        assert_int_equal(model_new(&spec, b1, B, &m1), 0);
        assert_int_equal(replicas_new(&b2, 1, &spec, B, &rs, msg, sizeof(msg)), 0);
        assert_int_equal(replicas_count(rs), 1);
        struct model *m0 = replicas_model(rs);
        assert_int_equal(model_max_batch(m0), B);
        const uint32_t rows[] = { 0, 7 }; /* dense0/kernel (16, 6) in two blocks */
        int dv = model_find_var(m1, "dense0/kernel");
        assert_true(dv >= 0);
        assert_int_equal(model_set_var_blocks(m1, (uint32_t)dv, 2, rows), 0);
        assert_int_equal(model_set_var_blocks(m0, (uint32_t)dv, 2, rows), 0);
        assert_int_equal(replicas_follow_blocks(rs), 0);

        size_t np = model_n_params(m1);
        float *server = malloc(sizeof(float) * np), x[5 * 16];
        assert_int_equal(model_init_params(m1, 3), 0);
        memcpy(server, model_params(m1), sizeof(float) * np);
        uint8_t y[5] = { 0, 1, 2, 1, 0 };
        for (size_t i = 0; i < (size_t)B * D; i++)
                x[i] = (float)((i * 13) % 29) / 29.0f - 0.4f;
        struct trace t1 = { .server = server, .params = model_params(m1), .m = m1, .fail_at = -1 };
        struct trace tr = { .server = server, .params = model_params(m0), .m = m0, .fail_at = -1 };
        float l1, lr;
        uint32_t c1, cr;
        assert_int_equal(model_forward_blocks(m1, x, y, B, &l1, &c1, trace_before, &t1), 0);
        assert_int_equal(replicas_forward_blocks(rs, x, y, B, &lr, &cr, trace_before, &tr), 0);
        assert_memory_equal(&lr, &l1, sizeof(float));
        assert_int_equal(cr, c1);
        assert_int_equal(tr.n, t1.n);
        assert_memory_equal(tr.var, t1.var, sizeof(uint32_t) * t1.n);
        assert_memory_equal(tr.block, t1.block, sizeof(uint32_t) * t1.n);
        struct trace a1 = { .m = m1, .fail_at = -1 }, ar = { .m = m0, .fail_at = -1 };
        assert_int_equal(model_backward_blocks(m1, trace_after, &a1), 0);
        assert_int_equal(replicas_backward_blocks(rs, trace_after, &ar), 0);
        assert_int_equal(ar.n, a1.n);
        assert_memory_equal(ar.var, a1.var, sizeof(uint32_t) * a1.n);
        assert_memory_equal(ar.block, a1.block, sizeof(uint32_t) * a1.n);
        assert_memory_equal(model_grads(m0), model_grads(m1), sizeof(float) * np);
        assert_int_equal(replicas_params_sync(rs), 0);

        replicas_free(rs);
        model_free(m1);
        backend_free(b1);
        backend_free(b2);
        free(server);
}

#ifndef PSFLEET_TEST_DEVICE_CUDA
/* Runs first: the plugin is looked for once per process. A node without the CUDA plugin (or its
 * libraries) runs "auto" on the CPU and says why. */
static void test_plugin_missing(void **state)
{
        (void)state;
        setenv("PSFLEET_CUDA_PLUGIN", "/nonexistent/libpsfleet-cuda.so", 1);
        struct device_config d = dc("auto");
        struct backend *be = NULL;
        char msg[512] = "";
        assert_int_equal(device_backend_new(&d, 1, &be, msg, sizeof(msg)), DEVICE_FELL_BACK);
        assert_string_equal(backend_name(be), "cpu");
        assert_non_null(strstr(msg, "the CUDA backend is not available: /nonexistent/libpsfleet-cuda.so"));
        backend_free(be);
        unsetenv("PSFLEET_CUDA_PLUGIN");
}
#define TEST_PLUGIN_MISSING cmocka_unit_test(test_plugin_missing),
#else
#define TEST_PLUGIN_MISSING /* the CUDA build of this program has the plugin */
#endif

UNIT_TEST_MAIN(NULL, NULL,
        TEST_PLUGIN_MISSING
        cmocka_unit_test_setup_teardown(test_cpu, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_auto_falls_back, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_auto_real, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_explicit_gpu_fails, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_explicit_gpu_soft, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_env_overrides, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_bad_values, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_model_and_placement, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_replicas, clean_env, clean_env),
        cmocka_unit_test_setup_teardown(test_replicas_one, clean_env, clean_env))
