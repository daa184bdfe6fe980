/* The graph engine's CPU kernels for normalization (graph-internal.h): BatchNormalization (training:
 * the batch's statistics; inference: the running ones) and LayerNormalization, with ONNX's semantics
 * (opsets 13 to 17). Apart from graph_k_conv.c (convolutions and pools), whose windows they share
 * nothing of. */
#include "graph-internal.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* Sets err (the shape functions' why) and yields -EINVAL. */
#define FAIL(...) (snprintf(err, errlen, __VA_ARGS__), -EINVAL)

/* (graph_finalize has refused int64 inputs to these ops before their shape functions run.) */
static bool has_in(const struct graph_node *n, uint32_t i)
{
        return i < n->n_in && n->in[i] >= 0;
}

/* ---- BatchNormalization ---- */

GRAPH_SHAPE_FN(gs_batchnorm)
{
        const struct graph_shape *x = graph_in_shape(g, n, 0);
        if (x->rank < 2)
                return FAIL("input 0 has rank %u, needs at least 2 (N, C, ...)", x->rank);
        int64_t C = x->dims[1];
        if (C < 1)
                return FAIL("the channel dim (1) must be known");
        static const char *const names[] = { "X", "scale", "B", "input_mean", "input_var" };
        for (uint32_t i = 1; i < 5; i++) {
                const struct graph_shape *s = graph_in_shape(g, n, i);
                if (s->rank != 1 || s->dims[0] != C)
                        return FAIL("input %u (%s) must have shape (%lld)", i, names[i], (long long)C);
        }
        out[0] = *x;
        for (uint32_t i = 1; i < n->n_out; i++)
                out[i] = (struct graph_shape){ .rank = 1, .dims = { C } };
        return 0;
}

/* per channel: mean, then inverse standard deviation */
size_t gk_batchnorm_state(const struct graph *g, const struct graph_node *n, uint32_t B)
{
        return 3 * (size_t)graph_in_shape(g, n, 0)->dims[1]; /* mean, 1/std, the batch's biased variance */
}

/* X as (N, C, S): S the product of the spatial dims */
static void bn_dims(const struct graph_shape *x, size_t *N, size_t *C, size_t *S)
{
        *N = (size_t)x->dims[0];
        *C = (size_t)x->dims[1];
        *S = 1;
        for (uint32_t i = 2; i < x->rank; i++)
                *S *= (size_t)x->dims[i];
}

/* Training: the batch's mean and biased variance per channel normalize X (ONNX's training mode), and
 * the running statistics (outputs 1 and 2, when asked for) become input * momentum + batch *
 * (1 - momentum). ONNX (opset 15: "current_var = ReduceVar(X, all but the channel axis)"; its reference
 * implementation, np.var) takes the biased variance for them too, not PyTorch's unbiased one; so do we.
 * Inference: input_mean and input_var normalize, and the running outputs are the inputs unchanged. The
 * statistics used stay in state for backward. */
/* The sums of (x - shift) and (x - shift)^2 over a plane in one pass, the same way: with a shift near
 * the mean (the running mean) the variance E[(x-K)^2] - E[x-K]^2 does not cancel away. */
static void plane_moments(const float *x, size_t n, float shift, double *s1, double *s2)
{
        float a[8] = { 0 }, b[8] = { 0 };
        size_t i = 0;
        for (; i + 8 <= n; i += 8)
                for (int j = 0; j < 8; j++) {
                        float d = x[i + j] - shift;
                        a[j] += d;
                        b[j] += d * d;
                }
        for (; i < n; i++) {
                double d = (double)x[i] - shift;
                *s1 += d;
                *s2 += d * d;
        }
        for (int j = 0; j < 8; j++) {
                *s1 += a[j];
                *s2 += b[j];
        }
}

int gk_batchnorm_fwd(struct graph_kctx *k)
{
        const float *x = k->in[0];     /* (N, C, S) */
        const float *scale = k->in[1]; /* (C) */
        const float *bias = k->in[2];  /* (C) */
        const float *imean = k->in[3]; /* (C) */
        const float *ivar = k->in[4];  /* (C) */
        float *y = k->out[0];          /* (N, C, S) */
        float *rmean = k->out[1], *rvar = k->out[2]; /* (C) each, or NULL */
        size_t N, C, S;
        bn_dims(&k->in_shape[0], &N, &C, &S);
        float *mean = k->state, *istd = k->state + C, *bvar = k->state + 2 * C; /* (C) each */
        double eps = k->node->a.epsilon, mom = k->node->a.momentum;
        for (size_t c = 0; c < C; c++) {
                double mu, var;
                if (k->training) {
                        double s1 = 0, s2 = 0, m = (double)(N * S);
                        float shift = isfinite(imean[c]) ? imean[c] : 0.0f;
                        for (size_t b = 0; b < N; b++)
                                plane_moments(x + (b * C + c) * S, S, shift, &s1, &s2);
                        double d = s1 / m;
                        mu = shift + d;
                        var = s2 / m - d * d;
                        if (var < 0)
                                var = 0;
                        if (rmean)
                                rmean[c] = (float)(imean[c] * mom + mu * (1 - mom));
                        if (rvar)
                                rvar[c] = (float)(ivar[c] * mom + var * (1 - mom));
                } else {
                        mu = imean[c];
                        var = ivar[c];
                        if (rmean)
                                rmean[c] = imean[c];
                        if (rvar)
                                rvar[c] = ivar[c];
                }
                double is = 1.0 / sqrt(var + eps);
                bvar[c] = (float)var;
                mean[c] = (float)mu;
                istd[c] = (float)is;
                /* y = a (x - mu) + bias: the coefficient in double, the planes in float lanes, x centred
                 * first (a x + (bias - a mu) would cancel where mu is large) */
                float af = (float)(scale[c] * is), muf = (float)mu, bf = bias[c];
                for (size_t b = 0; b < N; b++) {
                        const float *xs = x + (b * C + c) * S;
                        float *ys = y + (b * C + c) * S;
                        for (size_t i = 0; i < S; i++)
                                ys[i] = af * (xs[i] - muf) + bf;
                }
        }
        return 0;
}

/* dB = sum dY, dscale = sum dY * xhat per channel; training (the statistics depend on X):
 * dX = scale * istd / m * (m * dY - dB - xhat * dscale), m = N*S; inference: dX = scale * istd * dY.
 * The gradients of input_mean and input_var, and whatever flows into the running outputs, are not
 * propagated. Per plane the sums run in float lanes, across planes in double. */
int gk_batchnorm_bwd(struct graph_kctx *k)
{
        const float *dy = k->dout[0];
        float *dx = k->din[0], *dscale = k->din[1], *dbias = k->din[2];
        if (!dy)
                return 0;
        const float *x = k->in[0], *scale = k->in[1];
        size_t N, C, S;
        bn_dims(&k->in_shape[0], &N, &C, &S);
        const float *mean = k->state, *istd = k->state + C;
        double m = (double)(N * S);
        for (uint32_t j = 1; j < 5; j++) /* set: what is not summed into below starts from zero */
                if (k->din[j] && k->din_set[j])
                        memset(k->din[j], 0, sizeof(float) * C);
        for (size_t c = 0; c < C; c++) {
                double sdy = 0, sdyx = 0;
                float mu = mean[c], is = istd[c];
                for (size_t b = 0; b < N; b++) {
                        const float *dys = dy + (b * C + c) * S, *xs = x + (b * C + c) * S;
                        float s1[8] = { 0 }, s2[8] = { 0 };
                        size_t i = 0;
                        for (; i + 8 <= S; i += 8)
                                for (int j = 0; j < 8; j++) {
                                        s1[j] += dys[i + j];
                                        s2[j] += dys[i + j] * (xs[i + j] - mu);
                                }
                        for (; i < S; i++) {
                                sdy += dys[i];
                                sdyx += (double)dys[i] * (xs[i] - mu);
                        }
                        for (int j = 0; j < 8; j++) {
                                sdy += s1[j];
                                sdyx += s2[j];
                        }
                }
                sdyx *= is;
                if (dscale)
                        dscale[c] += (float)sdyx;
                if (dbias)
                        dbias[c] += (float)sdy;
                if (!dx)
                        continue;
                /* training: dx += a * dy - a * sdy / m - a * sdyx / m * is * (x - mu): the coefficients in
                 * double, the planes in float lanes, x centred first (the terms nearly cancel where the
                 * gradient is small) */
                double a = (double)scale[c] * is;
                double k0 = k->training ? a * sdy / m : 0.0, k1 = k->training ? a * sdyx / m * is : 0.0;
                float af = (float)a, k0f = (float)k0, k1f = (float)k1;
                for (size_t b = 0; b < N; b++) {
                        const float *dys = dy + (b * C + c) * S, *xs = x + (b * C + c) * S;
                        float *dxs = dx + (b * C + c) * S;
                        if (k->din_set[0])
                                for (size_t i = 0; i < S; i++)
                                        dxs[i] = af * dys[i] - k1f * (xs[i] - mu) - k0f;
                        else
                                for (size_t i = 0; i < S; i++)
                                        dxs[i] += af * dys[i] - k1f * (xs[i] - mu) - k0f;
                }
        }
        return 0;
}

/* ---- LayerNormalization ---- */

GRAPH_SHAPE_FN(gs_layernorm)
{
        const struct graph_shape *x = graph_in_shape(g, n, 0);
        uint32_t ax;
        if (x->rank < 1 || graph_axis(n->a.axis, x->rank, &ax) < 0)
                return FAIL("axis %lld is out of range for rank %u", (long long)n->a.axis, x->rank);
        size_t inner = 1;
        for (uint32_t i = ax; i < x->rank; i++) {
                if (x->dims[i] == GRAPH_BATCH)
                        return FAIL("axis %lld normalizes over the batch", (long long)n->a.axis);
                inner *= (size_t)x->dims[i];
        }
        /* Scale and B: X's normalized dims (leading 1s may be left out) */
        for (uint32_t i = 1; i < 3; i++) {
                if (!has_in(n, i))
                        continue;
                const struct graph_shape *s = graph_in_shape(g, n, i);
                bool ok = s->rank <= x->rank - ax && graph_count(s) == inner;
                for (uint32_t j = 0; ok && j < s->rank; j++)
                        ok = s->dims[s->rank - 1 - j] == x->dims[x->rank - 1 - j];
                if (!ok)
                        return FAIL("input %u (%s) must have X's shape from axis %u on", i, i == 1 ? "Scale" : "B", ax);
        }
        out[0] = *x;
        return 0;
}

/* X as (outer, inner): inner the normalized dims [axis, rank) */
static void ln_dims(const struct graph_shape *x, int64_t axis, uint32_t B, size_t *outer, size_t *inner)
{
        uint32_t ax = 0;
        graph_axis(axis, x->rank, &ax);
        *outer = *inner = 1;
        for (uint32_t i = 0; i < x->rank; i++) {
                size_t d = x->dims[i] == GRAPH_BATCH ? B : (size_t)x->dims[i];
                *(i < ax ? outer : inner) *= d;
        }
}

/* per row: mean, then inverse standard deviation */
size_t gk_layernorm_state(const struct graph *g, const struct graph_node *n, uint32_t B)
{
        size_t outer, inner;
        ln_dims(graph_in_shape(g, n, 0), n->a.axis, B, &outer, &inner);
        return 2 * outer;
}

/* Each row of X normalized with its own mean and biased variance (ONNX's ReduceMean of the squared
 * deviation), then scaled and shifted elementwise. */
int gk_layernorm_fwd(struct graph_kctx *k)
{
        const float *x = k->in[0];     /* (outer, inner) */
        const float *scale = k->in[1]; /* (inner) */
        const float *bias = k->in[2];  /* (inner), or NULL */
        float *y = k->out[0];          /* (outer, inner) */
        size_t R, D;
        ln_dims(&k->in_shape[0], k->node->a.axis, k->B, &R, &D);
        float *mean = k->state, *istd = k->state + R; /* (outer) each */
        for (size_t r = 0; r < R; r++) {
                const float *xr = x + r * D;
                float *yr = y + r * D;
                double s = 0, ss = 0;
                for (size_t i = 0; i < D; i++)
                        s += xr[i];
                double mu = s / (double)D;
                for (size_t i = 0; i < D; i++)
                        ss += (xr[i] - mu) * (xr[i] - mu);
                double is = 1.0 / sqrt(ss / (double)D + k->node->a.epsilon);
                mean[r] = (float)mu;
                istd[r] = (float)is;
                for (size_t i = 0; i < D; i++)
                        yr[i] = (float)((xr[i] - mu) * is * scale[i] + (bias ? bias[i] : 0.0f));
        }
        return 0;
}

/* With g = dY * Scale: dX = istd * (g - mean(g) - xhat * mean(g * xhat)) per row; dScale += dY * xhat and
 * dB += dY summed over the rows. */
int gk_layernorm_bwd(struct graph_kctx *k)
{
        const float *dy = k->dout[0];
        float *dx = k->din[0], *dscale = k->din[1], *dbias = k->node->n_in > 2 ? k->din[2] : NULL;
        if (!dy)
                return 0;
        const float *x = k->in[0], *scale = k->in[1];
        size_t R, D;
        ln_dims(&k->in_shape[0], k->node->a.axis, k->B, &R, &D);
        const float *mean = k->state, *istd = k->state + R;
        for (size_t r = 0; r < R; r++) {
                const float *xr = x + r * D, *dyr = dy + r * D;
                double mu = mean[r], is = istd[r], sg = 0, sgx = 0;
                for (size_t i = 0; i < D; i++) {
                        double xh = (xr[i] - mu) * is, gi = (double)dyr[i] * scale[i];
                        sg += gi;
                        sgx += gi * xh;
                        if (dscale)
                                dscale[i] += (float)(dyr[i] * xh);
                        if (dbias)
                                dbias[i] += dyr[i];
                }
                if (!dx)
                        continue;
                sg /= (double)D;
                sgx /= (double)D;
                float *dxr = dx + r * D;
                for (size_t i = 0; i < D; i++) {
                        double xh = (xr[i] - mu) * is, gi = (double)dyr[i] * scale[i];
                        dxr[i] += (float)(is * (gi - sg - xh * sgx));
                }
        }
        return 0;
}
