/* model: finite-difference gradient checks for every layer type and the loss, a hand-computed forward,
 * initializer determinism, batch bounds, the forward/backward callbacks, and row-blocked kernels
 * (also on a pretend device backend: the CPU ops with host_memory off, so uploads and downloads are
 * real copies); the logistic and mse heads, their outputs and the input gradient by finite differences.
 * All of it on model.c's layer code, asked for by name (model_new_engine): what device backends run. On
 * the CPU a layer list runs on the graph engine by default, held to this code in test_model_engines.c. */
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
#include "model.h"
#include "rng.h"
#include "model_hooks.h"

static struct backend *be;

static int layers_new(const struct model_spec *spec, struct backend *b, uint32_t max_batch, struct model **ret)
{
        return model_new_engine(spec, b, max_batch, MODEL_ENGINE_LAYERS, ret);
}

static int setup(void **state)
{
        return backend_cpu_new(1, &be);
}

static int teardown(void **state)
{
        be = backend_free(be);
        return 0;
}

static struct layer_spec L(enum layer_type t, uint32_t n)
{
        struct layer_spec s = {.type = t};
        switch (t) {
        case LAYER_DENSE: s.units = n; break;
        case LAYER_MAXPOOL2D: s.pool = n; break;
        default: break;
        }
        return s;
}

static struct layer_spec conv(uint32_t filters, uint32_t k)
{
        return (struct layer_spec){.type = LAYER_CONV2D, .filters = filters, .kernel = k};
}

static void random_batch(struct rng *r, float *x, size_t n, uint8_t *y, uint32_t B, uint32_t classes)
{
        for (size_t i = 0; i < n; i++)
                x[i] = rng_uniform_f(r, -1.0f, 1.0f);
        for (uint32_t b = 0; b < B; b++)
                y[b] = (uint8_t)rng_below(r, classes);
}

/* Central differences of the float loss against the analytic gradient, for every parameter; var
 * `bvar` split into nb blocks at rb first when nb > 1. */
static void gradcheck_blocked(const struct model_spec *spec, uint32_t B, float h, float atol, float rtol,
                              uint32_t bvar, uint32_t nb, const uint32_t *rb)
{
        struct model *m;
        assert_int_equal(layers_new(spec, be, B, &m), 0);
        if (nb > 1)
                assert_int_equal(model_set_var_blocks(m, bvar, nb, rb), 0);
        assert_int_equal(model_init_params(m, 7), 0);
        uint32_t D = model_input_size(m), C = model_n_classes(m);
        float *x = malloc(sizeof(float) * B * D);
        uint8_t *y = malloc(B);
        struct rng r;
        rng_init(&r, 99, 0);
        random_batch(&r, x, (size_t)B * D, y, B, C);
        /* give the biases something to do */
        float *p = model_params(m);
        for (size_t i = 0; i < model_n_params(m); i++)
                if (p[i] == 0.0f)
                        p[i] = rng_uniform_f(&r, -0.1f, 0.1f);

        float loss;
        assert_int_equal(model_forward(m, x, y, B, &loss, NULL), 0);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        size_t n = model_n_params(m);
        float *g = malloc(sizeof(float) * n);
        memcpy(g, model_grads(m), sizeof(float) * n);

        size_t bad = 0;
        double worst = 0.0;
        for (size_t i = 0; i < n; i++) {
                float keep = p[i];
                float lp, lm;
                p[i] = keep + h;
                assert_int_equal(model_forward(m, x, y, B, &lp, NULL), 0);
                p[i] = keep - h;
                assert_int_equal(model_forward(m, x, y, B, &lm, NULL), 0);
                p[i] = keep;
                double num = ((double)lp - (double)lm) / (2.0 * h);
                double err = fabs(num - g[i]);
                double tol = atol + rtol * fabs(num);
                if (err > tol) {
                        bad++;
                        if (bad < 5)
                                print_message("param %zu: analytic %g numeric %g\n", i, (double)g[i], num);
                }
                worst = err > worst ? err : worst;
        }
        /* A kink (relu, max) crossed by a step can spoil a rare single entry. */
        assert_true(bad <= n / 200);
        free(g);
        free(x);
        free(y);
        model_free(m);
}

static void gradcheck(const struct model_spec *spec, uint32_t B, float h, float atol, float rtol)
{
        gradcheck_blocked(spec, B, h, atol, rtol, 0, 1, NULL);
}

static void test_grad_dense_loss(void **state)
{
        struct model_spec s = {.input = {1, 1, 5}, .n_layers = 1, .layers = {L(LAYER_DENSE, 4)}};
        gradcheck(&s, 3, 1e-2f, 1e-4f, 5e-3f);
}

static void test_grad_dense_activations(void **state)
{
        struct model_spec s = {.input = {1, 1, 6}, .n_layers = 7,
                               .layers = {L(LAYER_DENSE, 5), L(LAYER_TANH, 0), L(LAYER_DENSE, 4),
                                          L(LAYER_SIGMOID, 0), L(LAYER_DENSE, 5), L(LAYER_RELU, 0),
                                          L(LAYER_DENSE, 3)}};
        gradcheck(&s, 4, 1e-3f, 2e-4f, 5e-3f);
}

static void test_grad_chained_activations(void **state)
{
        /* relu in place on dense output, then tanh and sigmoid out of place on the relu's output */
        struct model_spec s = {.input = {1, 1, 4}, .n_layers = 6,
                               .layers = {L(LAYER_DENSE, 6), L(LAYER_RELU, 0), L(LAYER_TANH, 0),
                                          L(LAYER_SIGMOID, 0), L(LAYER_DENSE, 3), L(LAYER_TANH, 0)}};
        gradcheck(&s, 3, 1e-3f, 2e-4f, 5e-3f);
}

static void test_grad_conv_pool(void **state)
{
        struct model_spec s = {.input = {2, 6, 5}, .n_layers = 9,
                               .layers = {conv(3, 3), L(LAYER_TANH, 0), conv(4, 3), L(LAYER_RELU, 0),
                                          L(LAYER_MAXPOOL2D, 2), L(LAYER_FLATTEN, 0), L(LAYER_DENSE, 5),
                                          L(LAYER_SIGMOID, 0), L(LAYER_DENSE, 3)}};
        gradcheck(&s, 2, 1e-3f, 2e-4f, 5e-3f);
}

static void test_grad_conv_even_kernel_pool_first(void **state)
{
        /* an activation on the raw input, a pool before any parameters, an even kernel */
        struct model_spec s = {.input = {1, 8, 8}, .n_layers = 6,
                               .layers = {L(LAYER_SIGMOID, 0), L(LAYER_MAXPOOL2D, 2), conv(2, 2),
                                          L(LAYER_TANH, 0), L(LAYER_FLATTEN, 0), L(LAYER_DENSE, 3)}};
        gradcheck(&s, 2, 1e-3f, 2e-4f, 5e-3f);
}

static void test_forward_known(void **state)
{
        /* logits = x @ W + b with W (2, 3), by hand */
        struct model_spec s = {.input = {1, 1, 2}, .n_layers = 1, .layers = {L(LAYER_DENSE, 3)}};
        struct model *m;
        assert_int_equal(layers_new(&s, be, 2, &m), 0);
        assert_int_equal(model_n_vars(m), 2);
        assert_string_equal(model_var(m, 0)->name, "dense0/kernel");
        assert_string_equal(model_var(m, 1)->name, "dense0/bias");
        assert_int_equal(model_var(m, 0)->rows, 2);
        assert_int_equal(model_var(m, 0)->cols, 3);
        assert_int_equal(model_var(m, 1)->offset, 6);
        assert_int_equal(model_n_params(m), 9);
        float *p = model_params(m);
        const float W[6] = {1, 0, -1, 0.5f, 2, 0}, bias[3] = {0.1f, -0.2f, 0.3f};
        memcpy(p, W, sizeof(W));
        memcpy(p + 6, bias, sizeof(bias));
        assert_int_equal(model_params_sync(m), 0);
        const float x[4] = {1, 2, -1, 0.5f};
        const uint8_t y[2] = {1, 2};
        double want = 0.0;
        int want_correct = 0;
        for (int b = 0; b < 2; b++) {
                double z[3], mx = -1e9, sum = 0;
                for (int c = 0; c < 3; c++) {
                        z[c] = bias[c] + x[2 * b] * W[c] + x[2 * b + 1] * W[3 + c];
                        mx = z[c] > mx ? z[c] : mx;
                }
                int arg = 0;
                for (int c = 0; c < 3; c++) {
                        sum += exp(z[c] - mx);
                        if (z[c] > z[arg])
                                arg = c;
                }
                want += -(z[y[b]] - mx - log(sum));
                want_correct += arg == y[b];
        }
        want /= 2;
        float loss;
        uint32_t correct;
        assert_int_equal(model_forward(m, x, y, 2, &loss, &correct), 0);
        assert_float_equal(loss, want, 1e-6);
        assert_int_equal(correct, want_correct);
        /* z row 0 = (2.1, 3.8, -0.7): argmax 1 == y; row 1 = (-0.65, 0.8, 1.3): argmax 2 == y */
        assert_int_equal(correct, 2);

        /* gradient of the bias is the mean of (p - onehot) */
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        float gsum = 0;
        for (int c = 0; c < 3; c++)
                gsum += model_grads(m)[6 + c];
        assert_float_equal(gsum, 0.0, 1e-6);
        model_free(m);
}

/* A blown-up model: its loss is what it is (log C when every logit is alike, however huge; NaN when
 * they overflow), never 0, and model_params_check names the variable. */
static void test_blown_up(void **state)
{
        struct model_spec s = {.input = {1, 1, 4}, .n_layers = 3,
                               .layers = {L(LAYER_DENSE, 8), L(LAYER_RELU, 0), L(LAYER_DENSE, 10)}};
        struct model *m;
        assert_int_equal(layers_new(&s, be, 4, &m), 0);
        assert_int_equal(model_init_params(m, 3), 0);
        char why[128] = "";
        assert_int_equal(model_params_check(m, why, sizeof(why)), 0);
        const float x[16] = {0.1f, 0.9f, 0.5f, 0.3f, 1, 0, 0.2f, 0.4f, 0.7f, 0.7f, 0, 1, 0.3f, 0.6f, 0.9f, 0.1f};
        const uint8_t y[4] = {0, 3, 7, 9};
        float *p = model_params(m);
        size_t n = model_n_params(m);
        float loss;
        /* every weight pushed down by 1e29, as by gradients of 1e30: the hidden layer dies, the logits
         * are the (equal) biases */
        for (size_t i = 0; i < n; i++)
                p[i] -= 1e29f;
        assert_int_equal(model_params_sync(m), 0);
        assert_int_equal(model_forward(m, x, y, 4, &loss, NULL), 0);
        assert_float_equal(loss, log(10.0), 1e-5);
        assert_int_equal(model_params_check(m, why, sizeof(why)), -ERANGE);
        assert_string_equal(why, "dense0/kernel holds -1e+29");
        /* pushed up instead: the logits overflow, and the loss says so */
        for (size_t i = 0; i < n; i++)
                p[i] = 1e30f;
        assert_int_equal(model_params_sync(m), 0);
        assert_int_equal(model_forward(m, x, y, 4, &loss, NULL), 0);
        assert_false(isfinite(loss));
        /* one NaN bias, within the limit otherwise */
        assert_int_equal(model_init_params(m, 3), 0);
        p[n - 1] = NAN;
        assert_int_equal(model_params_check(m, why, sizeof(why)), -ERANGE);
        assert_string_equal(why, "dense1/bias holds nan");
        p[n - 1] = MODEL_WEIGHT_LIMIT;
        assert_int_equal(model_params_check(m, why, sizeof(why)), 0);
        model_free(m);
}

static void test_init_deterministic(void **state)
{
        struct model_spec s = {.input = {1, 1, 30}, .n_layers = 5,
                               .layers = {L(LAYER_DENSE, 40), L(LAYER_RELU, 0), L(LAYER_DENSE, 20),
                                          L(LAYER_TANH, 0), L(LAYER_DENSE, 10)}};
        struct model *a, *b;
        assert_int_equal(layers_new(&s, be, 4, &a), 0);
        assert_int_equal(layers_new(&s, be, 8, &b), 0);
        assert_int_equal(model_init_params(a, 42), 0);
        assert_int_equal(model_init_params(b, 42), 0);
        size_t n = model_n_params(a);
        assert_memory_equal(model_params(a), model_params(b), sizeof(float) * n);
        assert_int_equal(model_init_params(b, 43), 0);
        assert_memory_not_equal(model_params(a), model_params(b), sizeof(float) * n);

        /* dense0 feeds a relu: He normal, truncated at 2 sigma; dense1 feeds tanh: Glorot uniform */
        const struct model_var *k0 = model_var(a, 0), *b0 = model_var(a, 1), *k1 = model_var(a, 2);
        const float *p = model_params(a);
        double sd = sqrt(2.0 / 30), sum2 = 0;
        for (size_t i = 0; i < (size_t)k0->rows * k0->cols; i++) {
                float v = p[k0->offset + i];
                assert_true(fabs(v) <= 2 * sd / 0.87962566103423978 + 1e-6);
                sum2 += (double)v * v;
        }
        double got_sd = sqrt(sum2 / (k0->rows * k0->cols));
        assert_true(got_sd > 0.8 * sd && got_sd < 1.2 * sd);
        for (uint32_t i = 0; i < b0->cols; i++)
                assert_true(p[b0->offset + i] == 0.0f);
        float lim = (float)sqrt(6.0 / (40 + 20));
        for (size_t i = 0; i < (size_t)k1->rows * k1->cols; i++)
                assert_true(fabsf(p[k1->offset + i]) <= lim);
        model_free(a);
        model_free(b);
}

static void test_batch_bounds(void **state)
{
        struct model_spec s = {.input = {1, 1, 3}, .n_layers = 1, .layers = {L(LAYER_DENSE, 2)}};
        struct model *m;
        assert_int_equal(layers_new(&s, be, 4, &m), 0);
        assert_int_equal(model_max_batch(m), 4);
        float x[15] = {0};
        uint8_t y[5] = {0};
        float loss;
        assert_int_equal(model_backward(m, NULL, NULL), -EINVAL); /* no forward yet */
        assert_int_equal(model_forward(m, x, y, 5, &loss, NULL), -EINVAL);
        assert_int_equal(model_forward(m, x, y, 0, &loss, NULL), -EINVAL);
        y[1] = 2; /* 2 classes */
        assert_int_equal(model_forward(m, x, y, 4, &loss, NULL), -EINVAL);
        y[1] = 1;
        assert_int_equal(model_forward(m, x, y, 4, &loss, NULL), 0);
        assert_float_equal(loss, log(2.0), 1e-6);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        model_free(m);
}

static void test_bad_specs(void **state)
{
        struct model *m = NULL;
        struct model_spec s = {.input = {1, 1, 3}, .n_layers = 1, .layers = {L(LAYER_DENSE, 1)}};
        assert_int_equal(layers_new(&s, be, 4, &m), -EINVAL); /* one class */
        s.layers[0].units = 257;
        assert_int_equal(layers_new(&s, be, 4, &m), -EINVAL); /* labels are bytes */
        s.layers[0].units = 0;
        assert_int_equal(layers_new(&s, be, 4, &m), -EINVAL);
        s.layers[0].units = 2;
        assert_int_equal(layers_new(&s, be, 0, &m), -EINVAL);
        s.n_layers = 0;
        assert_int_equal(layers_new(&s, be, 4, &m), -EINVAL);
        struct model_spec c = {.input = {1, 4, 4}, .n_layers = 2, .layers = {conv(2, 5), L(LAYER_DENSE, 2)}};
        assert_int_equal(layers_new(&c, be, 4, &m), -EINVAL); /* kernel larger than the image */
        c.layers[0] = L(LAYER_MAXPOOL2D, 5);
        assert_int_equal(layers_new(&c, be, 4, &m), -EINVAL);
        struct model_spec z = {.input = {0, 1, 3}, .n_layers = 1, .layers = {L(LAYER_DENSE, 2)}};
        assert_int_equal(layers_new(&z, be, 4, &m), -EINVAL);
        assert_null(m);
        assert_null(model_free(NULL));
}

static void test_input_untouched(void **state)
{
        /* an activation on the raw input must not write into the caller's x */
        struct model_spec s = {.input = {1, 1, 4}, .n_layers = 2, .layers = {L(LAYER_RELU, 0), L(LAYER_DENSE, 2)}};
        struct model *m;
        assert_int_equal(layers_new(&s, be, 2, &m), 0);
        assert_int_equal(model_init_params(m, 1), 0);
        const float x0[8] = {-1, 2, -3, 4, 5, -6, 7, -8};
        float x[8];
        memcpy(x, x0, sizeof(x));
        uint8_t y[2] = {0, 1};
        float loss;
        assert_int_equal(model_forward(m, x, y, 2, &loss, NULL), 0);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        assert_memory_equal(x, x0, sizeof(x));
        model_free(m);
}

struct cb_log {
        uint32_t n;
        uint32_t first[8], count[8];
        int stop_at;   /* return -EIO on this call (1-based); 0: never */
        struct model *m;
        float set_to;  /* forward hook: fill the layer's params with this */
};

static int log_cb(void *ud, uint32_t first_var, uint32_t n_vars)
{
        struct cb_log *l = ud;
        l->first[l->n] = first_var;
        l->count[l->n] = n_vars;
        l->n++;
        if (l->m) {
                const struct model_var *a = model_var(l->m, first_var);
                const struct model_var *z = model_var(l->m, first_var + n_vars - 1);
                float *p = model_params(l->m);
                for (size_t i = a->offset; i < z->offset + (size_t)z->rows * z->cols; i++)
                        p[i] = l->set_to;
        }
        return l->stop_at == (int)l->n ? -EIO : 0;
}

static void test_callbacks(void **state)
{
        struct model_spec s = {.input = {1, 1, 3}, .n_layers = 4,
                               .layers = {L(LAYER_DENSE, 4), L(LAYER_RELU, 0), L(LAYER_DENSE, 3),
                                          L(LAYER_DENSE, 2)}};
        struct model *m;
        assert_int_equal(layers_new(&s, be, 2, &m), 0);
        assert_int_equal(model_init_params(m, 3), 0);
        float x[6] = {1, 2, 3, 4, 5, 6};
        uint8_t y[2] = {0, 1};
        float loss;

        struct cb_log fl = {0};
        assert_int_equal(model_forward_hooked(m, x, y, 2, &loss, NULL, log_cb, &fl), 0);
        assert_int_equal(fl.n, 3);
        assert_int_equal(fl.first[0], 0);
        assert_int_equal(fl.first[1], 2);
        assert_int_equal(fl.first[2], 4);
        assert_int_equal(fl.count[0], 2);

        struct cb_log bl = {0};
        assert_int_equal(model_backward(m, log_cb, &bl), 0);
        assert_int_equal(bl.n, 3);
        assert_int_equal(bl.first[0], 4); /* last layer first */
        assert_int_equal(bl.first[1], 2);
        assert_int_equal(bl.first[2], 0);
        assert_int_equal(bl.count[2], 2);

        struct cb_log stop = {.stop_at = 2};
        assert_int_equal(model_backward(m, log_cb, &stop), -EIO);
        assert_int_equal(stop.n, 2);

        /* values written in the hook are the ones the layer reads: all-zero weights -> uniform probs */
        struct cb_log zero = {.m = m, .set_to = 0.0f};
        assert_int_equal(model_forward_hooked(m, x, y, 2, &loss, NULL, log_cb, &zero), 0);
        assert_float_equal(loss, log(2.0), 1e-6);
        model_free(m);
}

static void test_evaluate_chunks(void **state)
{
        struct model_spec s = {.input = {1, 1, 5}, .n_layers = 3,
                               .layers = {L(LAYER_DENSE, 6), L(LAYER_TANH, 0), L(LAYER_DENSE, 4)}};
        struct model *small, *big;
        assert_int_equal(layers_new(&s, be, 3, &small), 0);
        assert_int_equal(layers_new(&s, be, 10, &big), 0);
        assert_int_equal(model_init_params(small, 5), 0);
        assert_int_equal(model_init_params(big, 5), 0);
        float x[50];
        uint8_t y[10];
        struct rng r;
        rng_init(&r, 1, 2);
        random_batch(&r, x, 50, y, 10, 4);
        float l1, a1, l2;
        uint32_t c2;
        assert_int_equal(model_evaluate(small, x, y, 10, &l1, &a1), 0);
        assert_int_equal(model_forward(big, x, y, 10, &l2, &c2), 0);
        assert_float_equal(l1, l2, 1e-5);
        assert_float_equal(a1, c2 / 10.0, 1e-6);
        assert_int_equal(model_backward(small, NULL, NULL), -EINVAL);
        model_free(small);
        model_free(big);
}

static void test_describe(void **state)
{
        struct model_spec s = {.input = {1, 1, 784}, .n_layers = 7,
                               .layers = {L(LAYER_DENSE, 256), L(LAYER_RELU, 0), L(LAYER_DENSE, 128),
                                          L(LAYER_RELU, 0), L(LAYER_DENSE, 64), L(LAYER_RELU, 0),
                                          L(LAYER_DENSE, 10)}};
        struct model *m;
        assert_int_equal(layers_new(&s, be, 64, &m), 0);
        assert_int_equal(model_n_params(m), 242762);
        assert_int_equal(model_find_var(m, "dense3/bias"), 7);
        assert_int_equal(model_find_var(m, "nope"), -ENOENT);
        char buf[4096] = {0};
        FILE *f = fmemopen(buf, sizeof(buf) - 1, "w");
        model_describe(m, f);
        fclose(f);
        assert_non_null(strstr(buf, "dense0/kernel (784, 256)"));
        assert_non_null(strstr(buf, "242762 parameters"));
        model_free(m);
}

static struct backend *fake_device(void);

/* ---- heads, outputs and the input gradient ---- */

/* Labels as the head takes them: class indices, 0/1 with a soft one, or reals. */
static void head_labels(struct rng *r, enum model_head head, uint32_t C, float *y, uint32_t B)
{
        for (uint32_t b = 0; b < B; b++)
                y[b] = head == HEAD_SOFTMAX  ? (float)rng_below(r, C)
                       : head == HEAD_MSE    ? rng_uniform_f(r, -2.0f, 2.0f)
                       : b == 1              ? 0.3f
                                             : (float)rng_below(r, 2);
}

/* Central differences of the loss of model_forward_f, against the parameters' gradient and (with the
 * input gradient on) against dx, on the CPU and on the pretend device. */
static void gradcheck_f(struct backend *b, const struct model_spec *spec, uint32_t B, float h, float atol, float rtol)
{
        struct model *m;
        assert_int_equal(layers_new(spec, b, B, &m), 0);
        assert_int_equal(model_init_params(m, 5), 0);
        assert_int_equal(model_set_input_grad(m, true), 0);
        uint32_t D = model_input_size(m);
        float *x = malloc(sizeof(float) * B * D), y[16], loss, lp, lm;
        struct rng r;
        rng_init(&r, 3, 1);
        for (size_t i = 0; i < (size_t)B * D; i++)   /* away from a relu's kink on the raw input */
                x[i] = rng_uniform_f(&r, 0.1f, 1.0f) * (rng_below(&r, 2) ? 1.0f : -1.0f);
        head_labels(&r, spec->head, model_n_classes(m), y, B);
        float *p = model_params(m);
        for (size_t i = 0; i < model_n_params(m); i++)
                if (p[i] == 0.0f)
                        p[i] = rng_uniform_f(&r, -0.1f, 0.1f);
        assert_int_equal(model_params_sync(m), 0);
        assert_null(model_input_grad(m));
        assert_int_equal(model_forward_f(m, x, y, B, &loss, NULL), 0);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        size_t n = model_n_params(m), bad = 0;
        float *g = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * B * D);
        memcpy(g, model_grads(m), sizeof(float) * n);
        assert_non_null(model_input_grad(m));
        memcpy(dx, model_input_grad(m), sizeof(float) * B * D);
        for (size_t i = 0; i < n + (size_t)B * D; i++) {
                float *v = i < n ? &p[i] : &x[i - n], keep = *v;
                *v = keep + h;
                assert_int_equal(model_params_sync(m), 0);
                assert_int_equal(model_forward_f(m, x, y, B, &lp, NULL), 0);
                *v = keep - h;
                assert_int_equal(model_params_sync(m), 0);
                assert_int_equal(model_forward_f(m, x, y, B, &lm, NULL), 0);
                *v = keep;
                double num = ((double)lp - (double)lm) / (2.0 * h), an = i < n ? g[i] : dx[i - n];
                if (fabs(num - an) > atol + rtol * fabs(num) && ++bad < 5)
                        print_message("%s %zu: analytic %g numeric %g\n", i < n ? "param" : "x", i < n ? i : i - n,
                                      an, num);
        }
        assert_true(bad <= (n + (size_t)B * D) / 200);
        assert_int_equal(model_params_sync(m), 0);
        free(g);
        free(dx);
        free(x);
        model_free(m);
}

static void test_grad_heads(void **state)
{
        struct model_spec lg = {.input = {1, 1, 5}, .n_layers = 3, .head = HEAD_LOGISTIC,
                                .layers = {L(LAYER_DENSE, 4), L(LAYER_RELU, 0), L(LAYER_DENSE, 1)}};
        struct model_spec ms = {.input = {1, 1, 5}, .n_layers = 3, .head = HEAD_MSE,
                                .layers = {L(LAYER_DENSE, 4), L(LAYER_TANH, 0), L(LAYER_DENSE, 1)}};
        /* the input gradient through layers before the first with parameters: relu on the raw input */
        struct model_spec sm = {.input = {1, 1, 6}, .n_layers = 4,
                                .layers = {L(LAYER_RELU, 0), L(LAYER_DENSE, 5), L(LAYER_RELU, 0), L(LAYER_DENSE, 3)}};
        struct model_spec cv = {.input = {2, 4, 4}, .n_layers = 4, .head = HEAD_LOGISTIC,
                                .layers = {conv(2, 3), L(LAYER_MAXPOOL2D, 2), L(LAYER_FLATTEN, 0), L(LAYER_DENSE, 1)}};
        for (int d = 0; d < 2; d++) {
                struct backend *b = d ? fake_device() : be;
                gradcheck_f(b, &lg, 6, 1e-3f, 2e-4f, 5e-3f);
                gradcheck_f(b, &ms, 6, 1e-3f, 2e-4f, 5e-3f);
                gradcheck_f(b, &sm, 4, 1e-3f, 2e-4f, 5e-3f);
                gradcheck_f(b, &cv, 3, 1e-3f, 2e-4f, 5e-3f);
        }
}

/* One dense unit, weights (1, -1), bias 0: z = x0 - x1, known losses, outputs and counts. */
static void test_heads_known(void **state)
{
        struct model_spec s = {.input = {1, 1, 2}, .n_layers = 1, .head = HEAD_LOGISTIC, .layers = {L(LAYER_DENSE, 1)}};
        float x[8] = {1, 1, 100, 0, 0, 100, 2, 0}, y[4] = {1, 0, 0, 1}, loss;
        uint32_t correct;
        struct model *m;
        assert_int_equal(layers_new(&s, be, 4, &m), 0);
        assert_int_equal(model_n_classes(m), 1);
        model_params(m)[0] = 1, model_params(m)[1] = -1;
        assert_null(model_outputs(m));
        assert_int_equal(model_forward_f(m, x, y, 4, &loss, &correct), 0);
        /* z = 0, 100, -100, 2: log 2, 100 (no overflow), ~0, log(1 + e^-2) */
        double want = (log(2.0) + 100.0 + log1p(exp(-100.0)) + log1p(exp(-2.0))) / 4;
        assert_float_equal(loss, want, 1e-5);
        const float *o = model_outputs(m);
        assert_non_null(o);
        assert_float_equal(o[0], 0.5, 1e-7);
        assert_float_equal(o[1], 1.0, 1e-7);
        assert_float_equal(o[2], 0.0, 1e-7);
        assert_float_equal(o[3], 1 / (1 + exp(-2.0)), 1e-6);
        assert_int_equal(correct, 2); /* p > 0.5: no, yes, no, yes against 1, 0, 0, 1 */
        y[0] = 1.5f;
        assert_int_equal(model_forward_f(m, x, y, 4, &loss, NULL), -EINVAL);
        y[0] = NAN;
        assert_int_equal(model_forward_f(m, x, y, 4, &loss, NULL), -EINVAL);
        uint8_t y8[4] = {1, 0, 0, 1};
        assert_int_equal(model_forward(m, x, y8, 4, &loss, NULL), 0); /* class labels as 0/1 */
        assert_float_equal(loss, want, 1e-5);
        y8[2] = 2;
        assert_int_equal(model_forward(m, x, y8, 4, &loss, NULL), -EINVAL);
        model_free(m);

        s.head = HEAD_MSE;
        assert_int_equal(layers_new(&s, be, 4, &m), 0);
        model_params(m)[0] = 1, model_params(m)[1] = -1;
        float t[4] = {1, 99, -100, -1};   /* errors -1, 1, 0, 3 */
        correct = 7;
        assert_int_equal(model_forward_f(m, x, t, 4, &loss, &correct), 0);
        assert_float_equal(loss, (1 + 1 + 0 + 9) / 4.0, 1e-5);
        assert_int_equal(correct, 0);
        o = model_outputs(m);
        assert_float_equal(o[1], 100, 1e-5);
        assert_float_equal(o[3], 2, 1e-6);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        /* d loss / d bias = 2 * mean error = 1.5 */
        assert_float_equal(model_grads(m)[2], 1.5, 1e-6);
        assert_null(model_input_grad(m)); /* not asked for */
        t[0] = INFINITY;
        assert_int_equal(model_forward_f(m, x, t, 4, &loss, NULL), -EINVAL);
        model_free(m);

        /* softmax with float labels: whole class indices only; outputs are the probabilities */
        struct model_spec c = {.input = {1, 1, 2}, .n_layers = 1, .layers = {L(LAYER_DENSE, 3)}};
        assert_int_equal(layers_new(&c, be, 4, &m), 0);
        float k[4] = {0, 2, 1, 2};
        assert_int_equal(model_forward_f(m, x, k, 4, &loss, NULL), 0);
        assert_float_equal(loss, log(3.0), 1e-6); /* zero weights */
        assert_float_equal(model_outputs(m)[5], 1 / 3.0, 1e-6);
        k[1] = 1.5f;
        assert_int_equal(model_forward_f(m, x, k, 4, &loss, NULL), -EINVAL);
        k[1] = 3;
        assert_int_equal(model_forward_f(m, x, k, 4, &loss, NULL), -EINVAL);
        assert_int_equal(model_forward_f(m, x, NULL, 4, &loss, NULL), -EINVAL);
        model_free(m);
}

/* A backend without the single-output heads' ops (as the CUDA one) refuses those heads only. */
static void test_head_unsupported(void **state)
{
        static struct backend_ops ops;
        struct backend nb;
        struct model *m = NULL;
        struct model_spec s = {.input = {1, 1, 3}, .n_layers = 1, .head = HEAD_LOGISTIC, .layers = {L(LAYER_DENSE, 1)}};
        ops = *be->ops;
        ops.logistic_xent_fwd = NULL;
        ops.mse_bwd = NULL;
        nb = (struct backend){.ops = &ops, .ctx = be->ctx};
        assert_int_equal(layers_new(&s, &nb, 4, &m), -EOPNOTSUPP);
        s.head = HEAD_MSE;
        assert_int_equal(layers_new(&s, &nb, 4, &m), -EOPNOTSUPP);
        assert_null(m);
        s.head = HEAD_SOFTMAX;
        assert_int_equal(layers_new(&s, &nb, 4, &m), -EINVAL); /* one output is no softmax */
        s.layers[0].units = 2;
        assert_int_equal(layers_new(&s, &nb, 4, &m), 0);
        model_free(m);
        s.head = HEAD_LOGISTIC; /* a single-output head has exactly one output */
        assert_int_equal(layers_new(&s, be, 4, &m), -EINVAL);
}

/* With embeddings the model reads the widened flat input (model_spec_dense_input). */
static void test_embedding_input(void **state)
{
        struct model_spec s = {.input = {1, 1, 3}, .n_layers = 1, .head = HEAD_LOGISTIC, .layers = {L(LAYER_DENSE, 1)},
                               .n_embeddings = 2};
        s.emb[0] = (struct embedding_spec){.name = "a", .dim = 4, .n_fields = 2, .fields = {0, 1}};
        s.emb[1] = (struct embedding_spec){.name = "b", .dim = 2, .n_fields = 1, .fields = {1}};
        struct model *m;
        assert_int_equal(layers_new(&s, be, 4, &m), 0);
        assert_int_equal(model_input_size(m), 3 + 8 + 2);
        assert_int_equal(model_var(m, 0)->rows, 13);
        model_free(m);
        s.input[2] = 0; /* no dense features at all (LIBSVM) */
        assert_int_equal(layers_new(&s, be, 4, &m), 0);
        assert_int_equal(model_input_size(m), 10);
        model_free(m);
}

/* ---- row blocks ---- */

/* The CPU ops as if on a device: separate buffers, real upload/download copies. */
static struct backend_ops dev_ops;
static struct backend dev_be;

static struct backend *fake_device(void)
{
        dev_ops = *be->ops;
        dev_ops.name = "fake-device";
        dev_ops.host_memory = false;
        dev_be = (struct backend){.ops = &dev_ops, .ctx = be->ctx};
        return &dev_be;
}

static void test_grad_blocked(void **state)
{
        struct model_spec s = {.input = {1, 1, 7}, .n_layers = 3,
                               .layers = {L(LAYER_DENSE, 5), L(LAYER_TANH, 0), L(LAYER_DENSE, 3)}};
        const uint32_t rb0[3] = {0, 2, 3};
        gradcheck_blocked(&s, 4, 1e-3f, 2e-4f, 5e-3f, 0, 3, rb0);
        const uint32_t rb2[5] = {0, 1, 2, 3, 4}; /* dense1/kernel (5, 3): a block per row */
        gradcheck_blocked(&s, 4, 1e-3f, 2e-4f, 5e-3f, 2, 5, rb2);
}

static const struct model_spec mlp = {.input = {1, 1, 20}, .n_layers = 5,
                                      .layers = {{.type = LAYER_DENSE, .units = 16}, {.type = LAYER_RELU},
                                                 {.type = LAYER_DENSE, .units = 8}, {.type = LAYER_SIGMOID},
                                                 {.type = LAYER_DENSE, .units = 5}}};
static const uint32_t mlp_rb0[4] = {0, 3, 11, 12}; /* dense0/kernel (20, 16) */
static const uint32_t mlp_rb2[2] = {0, 9};         /* dense1/kernel (16, 8) */

static struct model *mlp_new(struct backend *b, bool blocked, uint32_t B)
{
        struct model *m;
        assert_int_equal(layers_new(&mlp, b, B, &m), 0);
        assert_int_equal(model_init_params(m, 11), 0);
        float *p = model_params(m);
        for (uint32_t v = 1; v < model_n_vars(m); v += 2) /* nonzero biases */
                for (uint32_t i = 0; i < model_var(m, v)->cols; i++)
                        p[model_var(m, v)->offset + i] = 0.01f * (float)(i + v);
        assert_int_equal(model_params_sync(m), 0);
        if (blocked) {
                assert_int_equal(model_set_var_blocks(m, 0, 4, mlp_rb0), 0);
                assert_int_equal(model_set_var_blocks(m, 2, 2, mlp_rb2), 0);
        }
        return m;
}

static void test_blocked_matches_unblocked(void **state)
{
        const uint32_t B = 6;
        struct model *u = mlp_new(be, false, B), *b1 = mlp_new(be, true, B), *b2 = mlp_new(be, true, B);
        float x[6 * 20];
        uint8_t y[6];
        struct rng r;
        rng_init(&r, 5, 5);
        random_batch(&r, x, sizeof(x) / sizeof(x[0]), y, B, 5);
        float lu, l1, l2;
        uint32_t cu, c1, c2;
        assert_int_equal(model_forward(u, x, y, B, &lu, &cu), 0);
        assert_int_equal(model_backward(u, NULL, NULL), 0);
        assert_int_equal(model_forward(b1, x, y, B, &l1, &c1), 0);
        assert_int_equal(model_backward(b1, NULL, NULL), 0);
        assert_int_equal(model_forward_blocks(b2, x, y, B, &l2, &c2, NULL, NULL), 0);
        assert_int_equal(model_backward_blocks(b2, NULL, NULL), 0);
        assert_true(fabsf(l1 - lu) <= 1e-5f * fabsf(lu));
        assert_int_equal(c1, cu);
        size_t n = model_n_params(u);
        const float *gu = model_grads(u), *g1 = model_grads(b1);
        for (size_t i = 0; i < n; i++)
                assert_true(fabsf(g1[i] - gu[i]) <= 1e-5f * fabsf(gu[i]) + 1e-7f);
        /* the same blocks give the same bits, whichever entry points */
        assert_memory_equal(&l1, &l2, sizeof(float));
        assert_int_equal(c1, c2);
        assert_memory_equal(g1, model_grads(b2), sizeof(float) * n);

        /* one block again: back to the unblocked bits */
        assert_int_equal(model_set_var_blocks(b1, 0, 1, NULL), 0);
        const uint32_t zero = 0;
        assert_int_equal(model_set_var_blocks(b1, 2, 1, &zero), 0);
        assert_int_equal(model_var_blocks(b1, 0, NULL), 1);
        assert_int_equal(model_forward(b1, x, y, B, &l1, NULL), 0);
        assert_int_equal(model_backward(b1, NULL, NULL), 0);
        assert_memory_equal(&l1, &lu, sizeof(float));
        assert_memory_equal(g1, gu, sizeof(float) * n);
        model_free(u);
        model_free(b1);
        model_free(b2);
}

static void check_block_callbacks(struct backend *b)
{
        const uint32_t B = 4;
        struct model *ref = mlp_new(be, true, B), *m = mlp_new(b, true, B);
        size_t n = model_n_params(m);
        float x[4 * 20];
        uint8_t y[4];
        struct rng r;
        rng_init(&r, 8, 1);
        random_batch(&r, x, sizeof(x) / sizeof(x[0]), y, B, 5);
        float lref, loss;
        assert_int_equal(model_forward(ref, x, y, B, &lref, NULL), 0);
        assert_int_equal(model_backward(ref, NULL, NULL), 0);

        /* every parameter NaN until its block's callback writes it */
        float *p = model_params(m);
        for (size_t i = 0; i < n; i++)
                p[i] = NAN;
        assert_int_equal(model_params_sync(m), 0);
        struct blk_log fl = {.m = m, .ref = model_params(ref)};
        assert_int_equal(model_forward_blocks(m, x, y, B, &loss, NULL, before_cb, &fl), 0);
        assert_memory_equal(&loss, &lref, sizeof(float));
        const uint32_t fvar[] = {0, 0, 0, 0, 1, 2, 2, 3, 4, 5};
        const uint32_t fblk[] = {0, 1, 2, 3, 0, 0, 1, 0, 0, 0};
        assert_int_equal(fl.n, 10);
        assert_memory_equal(fl.var, fvar, sizeof(fvar));
        assert_memory_equal(fl.block, fblk, sizeof(fblk));
        memcpy(p, model_params(ref), sizeof(float) * n); /* un-poison for backward's dx */
        assert_int_equal(model_params_sync(m), 0);

        float *snap = malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++)
                snap[i] = NAN;
        struct blk_log bl = {.m = m, .snap = snap};
        assert_int_equal(model_backward_blocks(m, after_cb, &bl), 0);
        const uint32_t bvar[] = {5, 4, 3, 2, 2, 1, 0, 0, 0, 0}; /* last layer first; bias first */
        const uint32_t bblk[] = {0, 0, 0, 0, 1, 0, 0, 1, 2, 3};
        assert_int_equal(bl.n, 10);
        assert_memory_equal(bl.var, bvar, sizeof(bvar));
        assert_memory_equal(bl.block, bblk, sizeof(bblk));
        assert_memory_equal(snap, model_grads(ref), sizeof(float) * n);
        if (backend_host_memory(b)) /* nothing wrote a block after its callback */
                for (size_t i = 0; i < n; i++)
                        assert_true(isnan(model_grads(m)[i]));
        free(snap);
        model_free(ref);
        model_free(m);
}

static void test_block_callbacks(void **state)
{
        check_block_callbacks(be);
}

static void test_block_callbacks_device(void **state)
{
        check_block_callbacks(fake_device());
}

/* The host blocks moved into memory of the caller's: same values, same results, left alone by
 * model_free. */
static void check_use_host_blocks(struct backend *b)
{
        const uint32_t B = 4;
        struct model *ref = mlp_new(be, true, B), *m = mlp_new(b, true, B);
        size_t n = model_n_params(m);
        float *mem = aligned_alloc(64, (2 * n * sizeof(float) + 63) / 64 * 64 + 64);
        float *params = mem, *grads = mem + (n + 15) / 16 * 16;
        assert_int_equal(model_use_host_blocks(m, params + 1, grads), -EINVAL);     /* misaligned */
        assert_int_equal(model_use_host_blocks(m, params, params + 16), -EINVAL);   /* overlapping */
        assert_int_equal(model_use_host_blocks(m, params, grads), 0);
        assert_ptr_equal(model_params(m), params);
        assert_ptr_equal(model_grads(m), grads);
        assert_memory_equal(params, model_params(ref), sizeof(float) * n);
        assert_int_equal(model_use_host_blocks(m, params, grads), -EINVAL);         /* once */
        float x[4 * 20];
        uint8_t y[4];
        struct rng r;
        rng_init(&r, 9, 1);
        random_batch(&r, x, sizeof(x) / sizeof(x[0]), y, B, 5);
        float lref, loss;
        assert_int_equal(model_forward(ref, x, y, B, &lref, NULL), 0);
        assert_int_equal(model_backward(ref, NULL, NULL), 0);
        assert_int_equal(model_forward(m, x, y, B, &loss, NULL), 0);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        assert_memory_equal(&loss, &lref, sizeof(float));
        assert_memory_equal(grads, model_grads(ref), sizeof(float) * n);
        /* new values written into the caller's block reach the passes after a sync */
        params[0] += 1.0f;
        assert_int_equal(model_params_sync(m), 0);
        assert_int_equal(model_forward(m, x, y, B, &loss, NULL), 0);
        assert_true(memcmp(&loss, &lref, sizeof(float)) != 0);
        model_free(m);        /* must not free mem: ASan would report the free below */
        model_free(ref);
        free(mem);
}

static void test_use_host_blocks(void **state)
{
        check_use_host_blocks(be);
}

static void test_use_host_blocks_device(void **state)
{
        check_use_host_blocks(fake_device());
}

static void test_block_callbacks_stop(void **state)
{
        const uint32_t B = 2;
        struct model *m = mlp_new(be, true, B);
        float x[2 * 20] = {0};
        uint8_t y[2] = {1, 2};
        float loss;
        size_t n = model_n_params(m);
        float *ref = malloc(sizeof(float) * n);
        memcpy(ref, model_params(m), sizeof(float) * n);
        struct blk_log fl = {.m = m, .ref = ref, .stop_at = 3, .ret = -EIO};
        assert_int_equal(model_forward_blocks(m, x, y, B, &loss, NULL, before_cb, &fl), -EIO);
        assert_int_equal(fl.n, 3);
        assert_int_equal(model_backward_blocks(m, NULL, NULL), -EINVAL); /* no complete forward */

        memcpy(model_params(m), ref, sizeof(float) * n);
        assert_int_equal(model_forward_blocks(m, x, y, B, &loss, NULL, NULL, NULL), 0);
        float *snap = malloc(sizeof(float) * n);
        struct blk_log bl = {.m = m, .snap = snap, .stop_at = 5, .ret = 7}; /* any nonzero */
        assert_int_equal(model_backward_blocks(m, after_cb, &bl), 7);
        assert_int_equal(bl.n, 5);
        struct blk_log b2 = {.m = m, .snap = snap, .stop_at = 9, .ret = -EPIPE}; /* dense0 block 2 */
        assert_int_equal(model_backward_blocks(m, after_cb, &b2), -EPIPE);
        assert_int_equal(b2.n, 9);
        free(snap);
        free(ref);
        model_free(m);
}

static void test_block_bad_specs(void **state)
{
        struct model_spec s = {.input = {1, 6, 6}, .n_layers = 3,
                               .layers = {conv(2, 3), L(LAYER_FLATTEN, 0), L(LAYER_DENSE, 4)}};
        struct model *m;
        assert_int_equal(layers_new(&s, be, 2, &m), 0);
        const uint32_t ok[3] = {0, 10, 40}; /* dense0/kernel is var 2, (72, 4) */
        assert_int_equal(model_set_var_blocks(m, 0, 3, ok), -EOPNOTSUPP); /* conv kernel */
        assert_int_equal(model_set_var_blocks(m, 3, 1, NULL), -EOPNOTSUPP); /* bias */
        assert_int_equal(model_set_var_blocks(m, 4, 3, ok), -EINVAL);        /* no such var */
        assert_int_equal(model_set_var_blocks(m, 2, 0, ok), -EINVAL);
        assert_int_equal(model_set_var_blocks(m, 2, 3, NULL), -EINVAL);
        const uint32_t not0[2] = {1, 10}, flat[3] = {0, 10, 10}, down[3] = {0, 10, 5}, past[2] = {0, 72};
        assert_int_equal(model_set_var_blocks(m, 2, 2, not0), -EINVAL);
        assert_int_equal(model_set_var_blocks(m, 2, 1, not0), -EINVAL);
        assert_int_equal(model_set_var_blocks(m, 2, 3, flat), -EINVAL);
        assert_int_equal(model_set_var_blocks(m, 2, 3, down), -EINVAL);
        assert_int_equal(model_set_var_blocks(m, 2, 2, past), -EINVAL);
        assert_int_equal(model_set_var_blocks(m, 2, 73, ok), -EINVAL); /* more blocks than rows */
        assert_int_equal(model_var_blocks(m, 2, NULL), 1);              /* failures change nothing */

        assert_int_equal(model_set_var_blocks(m, 2, 3, ok), 0);
        assert_int_equal(model_var_blocks(m, 2, NULL), 3);
        assert_int_equal(model_set_var_blocks(m, 2, 2, down), 0); /* only {0, 10} is read */
        assert_int_equal(model_set_var_blocks(m, 2, 3, flat), -EINVAL);
        const uint32_t *rb;
        assert_int_equal(model_var_blocks(m, 2, &rb), 2);
        const uint32_t want[3] = {0, 10, 72};
        assert_memory_equal(rb, want, sizeof(want));
        assert_int_equal(model_var_blocks(m, 0, &rb), 1); /* conv kernel: one block of all rows */
        assert_int_equal(rb[0], 0);
        assert_int_equal(rb[1], 2);
        model_free(m);
}

UNIT_TEST_MAIN(setup, teardown,
        cmocka_unit_test(test_grad_dense_loss),
        cmocka_unit_test(test_grad_dense_activations),
        cmocka_unit_test(test_grad_chained_activations),
        cmocka_unit_test(test_grad_conv_pool),
        cmocka_unit_test(test_grad_conv_even_kernel_pool_first),
        cmocka_unit_test(test_forward_known),
        cmocka_unit_test(test_blown_up),
        cmocka_unit_test(test_init_deterministic),
        cmocka_unit_test(test_batch_bounds),
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_input_untouched),
        cmocka_unit_test(test_callbacks),
        cmocka_unit_test(test_evaluate_chunks),
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_grad_heads),
        cmocka_unit_test(test_heads_known),
        cmocka_unit_test(test_head_unsupported),
        cmocka_unit_test(test_embedding_input),
        cmocka_unit_test(test_grad_blocked),
        cmocka_unit_test(test_blocked_matches_unblocked),
        cmocka_unit_test(test_block_callbacks),
        cmocka_unit_test(test_block_callbacks_device),
        cmocka_unit_test(test_block_callbacks_stop),
        cmocka_unit_test(test_use_host_blocks),
        cmocka_unit_test(test_use_host_blocks_device),
        cmocka_unit_test(test_block_bad_specs))
