/* The one apply: see apply.h. Slicing is done once, in apply_rows_at; the step is the rows' own count
 * of applied gradients, which every caller keeps in the same struct. */
#include "apply.h"

#include <errno.h>
#include <math.h>

#include "util.h"

struct apply_rows apply_rows_at(float *w, float *const *slots, unsigned n_slots, size_t offset, size_t n) {
        struct apply_rows a = {.w = w + offset, .n = n};
        for (unsigned s = 0; s < n_slots && s < OPTIM_MAX_SLOTS; s++)
                a.slot[s] = slots[s] + offset;
        return a;
}

void apply_reset(const struct training_config *t, struct apply_rows *a, uint64_t updates) {
        for (unsigned s = 0; s < optim_n_slots(t->optimizer); s++) {
                float v = optim_slot_init(t, s);
                for (size_t i = 0; i < a->n; i++)
                        a->slot[s][i] = v;
        }
        a->updates = updates;
}

/* A moving average's update: its "gradient" is what to subtract (graph_moving_deltas). */
static void apply_moving(float *w, const float *g, size_t n) {
        for (size_t i = 0; i < n; i++)
                w[i] -= g[i];
}

void apply_gradient(const struct training_config *t, struct apply_rows *a, const float *g) {
        if (a->moving)
                apply_moving(a->w, g, a->n);
        else
                optim_apply(t, a->updates, a->w, g, a->slot, a->n);
        a->updates++;
}

void apply_gradient_read(const struct training_config *t, struct apply_rows *a, float scale, apply_read_fn read,
                         void *ud) {
        float bounce[APPLY_BOUNCE] __attribute__((aligned(64)));
        unsigned ns = optim_n_slots(t->optimizer);
        for (size_t at = 0; at < a->n; at += APPLY_BOUNCE) {
                size_t k = a->n - at < APPLY_BOUNCE ? a->n - at : APPLY_BOUNCE;
                float *sl[OPTIM_MAX_SLOTS] = {0};
                for (unsigned s = 0; s < ns; s++)
                        sl[s] = a->slot[s] + at;
                read(ud, bounce, k);
                if (scale != 1.0f)
                        apply_scale(bounce, k, scale);
                if (a->moving)
                        apply_moving(a->w + at, bounce, k);
                else
                        optim_apply(t, a->updates, a->w + at, bounce, sl, k);
        }
        a->updates++;
}

void apply_scale(float *g, size_t n, float scale) {
        for (size_t i = 0; i < n; i++)
                g[i] *= scale;
}

/* Four partial sums, so the loop is not one long chain of dependent adds; in double, where the
 * squares of finite floats cannot overflow: the sum is finite exactly when every value is. */
static double sum_squares(const float *g, size_t n) {
        double s[4] = {0, 0, 0, 0};
        size_t i = 0;
        for (; i + 4 <= n; i += 4)
                for (unsigned j = 0; j < 4; j++)
                        s[j] += (double)g[i + j] * (double)g[i + j];
        for (; i < n; i++)
                s[0] += (double)g[i] * (double)g[i];
        return (s[0] + s[1]) + (s[2] + s[3]);
}

bool apply_check(const float *g, size_t n, double *sumsq) {
        if (!sumsq)
                return optim_all_finite(g, n);
        double s = sum_squares(g, n);
        *sumsq += s;
        return isfinite(s);
}

bool apply_check_read(size_t n, apply_read_fn read, void *ud, double *sumsq) {
        float bounce[APPLY_BOUNCE] __attribute__((aligned(64)));
        for (size_t at = 0; at < n; at += APPLY_BOUNCE) {
                size_t k = n - at < APPLY_BOUNCE ? n - at : APPLY_BOUNCE;
                read(ud, bounce, k);
                if (!apply_check(bounce, k, sumsq))
                        return false;
        }
        return true;
}

int apply_norm_limit(const struct training_config *t, double sumsq, const char *from, float *scale_ret, char *err,
                     size_t errlen) {
        double limit = t->max_gradient_norm, norm = sqrt(sumsq);
        *scale_ret = 1.0f;
        if (limit <= 0 || norm <= limit)
                return 0;
        if (t->gradient_norm_action == GRAD_NORM_REJECT)
                return errf(err, errlen, -EINVAL,
                            "gradients from %s have L2 norm %.6g, over training.max_gradient_norm %.6g; nothing applied",
                            from, norm, limit);
        *scale_ret = (float)(limit / norm);
        return 1;
}
