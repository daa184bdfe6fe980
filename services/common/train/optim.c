/* Optimizer kernels and the one entry point (optim_apply) that picks and parameterizes them. */
#include "optim.h"

#include <assert.h>
#include <math.h>

float optim_slot_init(const struct training_config *t, unsigned slot)
{
        return t->optimizer == OPT_ADAGRAD && slot == 0 ? (float)t->initial_accumulator : 0.0f;
}

double optim_learning_rate(const struct training_config *t, uint64_t global_step)
{
        if (t->lr_schedule != LR_EXPONENTIAL || t->lr_decay_steps == 0)
                return t->learning_rate;
        double p = (double)global_step / (double)t->lr_decay_steps;
        if (t->lr_staircase)
                p = (double)(global_step / t->lr_decay_steps);
        return t->learning_rate * pow(t->lr_decay_rate, p);
}

bool optim_all_finite(const float *g, size_t n)
{
        /* g * 0 is 0 for finite g and NaN for inf and NaN; summing keeps the loop branch-free. */
        float acc[8] = {0};
        size_t i = 0;
        for (; i + 8 <= n; i += 8)
                for (int j = 0; j < 8; j++)
                        acc[j] += g[i + j] * 0.0f;
        for (; i < n; i++)
                acc[0] += g[i] * 0.0f;
        float s = 0.0f;
        for (int j = 0; j < 8; j++)
                s += acc[j];
        return s == 0.0f;
}

/* The sgd and momentum loops run in blocks of 8 so GCC's -O2 (very-cheap vectorizer cost model)
 * emits SIMD for them; the arrays never overlap (restrict). */
#define BLK 8

void optim_sgd(float *restrict w, const float *restrict g, size_t n, float lr)
{
        size_t i = 0;
        for (; i + BLK <= n; i += BLK)
                for (int j = 0; j < BLK; j++)
                        w[i + j] -= lr * g[i + j];
        for (; i < n; i++)
                w[i] -= lr * g[i];
}

void optim_momentum(float *restrict w, const float *restrict g, float *restrict accum, size_t n, float lr,
                    float momentum, bool nesterov)
{
        size_t i = 0;
        if (nesterov) {
                for (; i + BLK <= n; i += BLK)
                        for (int j = 0; j < BLK; j++) {
                                accum[i + j] = momentum * accum[i + j] + g[i + j];
                                w[i + j] -= lr * (g[i + j] + momentum * accum[i + j]);
                        }
                for (; i < n; i++) {
                        accum[i] = momentum * accum[i] + g[i];
                        w[i] -= lr * (g[i] + momentum * accum[i]);
                }
        } else {
                for (; i + BLK <= n; i += BLK)
                        for (int j = 0; j < BLK; j++) {
                                accum[i + j] = momentum * accum[i + j] + g[i + j];
                                w[i + j] -= lr * accum[i + j];
                        }
                for (; i < n; i++) {
                        accum[i] = momentum * accum[i] + g[i];
                        w[i] -= lr * accum[i];
                }
        }
}

double optim_adam_lr(double lr, double beta1, double beta2, uint64_t t)
{
        return lr * sqrt(1.0 - pow(beta2, (double)t)) / (1.0 - pow(beta1, (double)t));
}

void optim_adam(float *w, const float *g, float *m, float *v, size_t n, float lr_t, float beta1,
                float beta2, float eps)
{
        for (size_t i = 0; i < n; i++) {
                m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
                v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
                w[i] -= lr_t * m[i] / (sqrtf(v[i]) + eps);
        }
}

void optim_adagrad(float *w, const float *g, float *acc, size_t n, float lr, float eps)
{
        for (size_t i = 0; i < n; i++) {
                acc[i] += g[i] * g[i];
                w[i] -= lr * g[i] / (sqrtf(acc[i]) + eps);
        }
}

void optim_ftrl(float *restrict w, const float *restrict g, float *restrict n_acc, float *restrict z,
                size_t count, float lr, float l1, float l2, float beta, float lr_power)
{
        /* TF folds beta into l2 (adjusted_l2_regularization_strength), the paper's (beta + sqrt(n)) / alpha. */
        float l2_adj = l2 + beta / (2.0f * lr);
        bool root = lr_power == -0.5f;
        for (size_t i = 0; i < count; i++) {
                float n_new = n_acc[i] + g[i] * g[i];
                float p_new = root ? sqrtf(n_new) : powf(n_new, -lr_power);
                float p_old = root ? sqrtf(n_acc[i]) : powf(n_acc[i], -lr_power);
                z[i] += g[i] - (p_new - p_old) / lr * w[i];
                if (fabsf(z[i]) > l1) {
                        float sign = z[i] > 0.0f ? 1.0f : -1.0f;
                        w[i] = (sign * l1 - z[i]) / (p_new / lr + 2.0f * l2_adj);
                } else {
                        w[i] = 0.0f;
                }
                n_acc[i] = n_new;
        }
}

void optim_apply(const struct training_config *t, uint64_t step, float *w, const float *g, float **slots,
                 size_t n)
{
        double lr = optim_learning_rate(t, step);
        switch (t->optimizer) {
        case OPT_SGD:
                optim_sgd(w, g, n, (float)lr);
                break;
        case OPT_MOMENTUM:
                optim_momentum(w, g, slots[0], n, (float)lr, (float)t->momentum, t->nesterov);
                break;
        case OPT_ADAM:
                optim_adam(w, g, slots[0], slots[1], n, (float)optim_adam_lr(lr, t->beta1, t->beta2, step + 1),
                           (float)t->beta1, (float)t->beta2, (float)t->epsilon);
                break;
        case OPT_ADAGRAD:
                optim_adagrad(w, g, slots[0], n, (float)lr, (float)t->epsilon);
                break;
        default:
                assert(!"unknown optimizer");
        }
}
