/* Optimizers as TensorFlow 1.x defines them, applied in place on (w, g, slots, n). psd and the
 * standalone trainer both reach optim_apply through apply.h, so they compute the exact same update. The kernels are pure
 * functions; all are thread-safe on disjoint arrays. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "optim_slots.h"  /* OPTIM_MAX_SLOTS, optim_n_slots, optim_slot_name, optim_name */

/* Initial value of a slot (adagrad: initial_accumulator; otherwise 0). */
float optim_slot_init(const struct training_config *t, unsigned slot);

/* Learning rate at global_step: constant, or lr * rate^(step / decay_steps) (floored when staircase;
 * decay_steps == 0 means constant). */
double optim_learning_rate(const struct training_config *t, uint64_t global_step);

/* true when every g[i] is finite. */
bool optim_all_finite(const float *g, size_t n);

/* One update of n parameters. step: global_step before this update (adam uses t = step + 1; the
 * learning-rate schedule uses step). slots: optim_n_slots(t->optimizer) arrays of n floats. */
void optim_apply(const struct training_config *t, uint64_t step, float *w, const float *g, float **slots,
                 size_t n);

/* The kernels. w, g and the slots must not overlap. */
void optim_sgd(float *w, const float *g, size_t n, float lr);
/* accum = m*accum + g; w -= lr*accum  (nesterov: w -= lr*(g + m*accum)) */
void optim_momentum(float *w, const float *g, float *accum, size_t n, float lr, float momentum,
                    bool nesterov);
/* m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr_t * m / (sqrt(v) + eps),
 * lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t) computed by the caller (optim_adam_lr). */
void optim_adam(float *w, const float *g, float *m, float *v, size_t n, float lr_t, float beta1,
                float beta2, float eps);
double optim_adam_lr(double lr, double beta1, double beta2, uint64_t t);
/* acc += g^2; w -= lr * g / (sqrt(acc) + eps) */
void optim_adagrad(float *w, const float *g, float *acc, size_t n, float lr, float eps);
/* FTRL-Proximal as TensorFlow's ApplyFtrl (FtrlOptimizer): n_acc is "accum" (n), z is "linear".
 *   n' = n + g^2;  z += g - (n'^-p - n^-p) / lr * w   (p = lr_power; sqrt when p == -0.5)
 *   w = |z| > l1 ? (sign(z) l1 - z) / (n'^-p / lr + 2 l2') : 0,  l2' = l2 + beta / (2 lr);  n = n'
 * lr_power <= 0; lr > 0. */
void optim_ftrl(float *w, const float *g, float *n_acc, float *z, size_t count, float lr, float l1, float l2,
                float beta, float lr_power);
