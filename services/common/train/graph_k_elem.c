/* The graph engine's element-wise ops (graph-internal.h): Add, Sub, Mul and Div with NumPy broadcasting,
 * the activations Relu, LeakyRelu, Sigmoid and Tanh, and Dropout. Plain loops: this is the CPU reference. */
#include "graph-internal.h"
#include "graph_k_nd.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- shapes ---- */

GRAPH_SHAPE_FN(gs_binary)
{
        const struct graph_shape *a = graph_in_shape(g, n, 0), *b = graph_in_shape(g, n, 1);
        if (!a || !b) {
                snprintf(err, errlen, "input %d is required", a ? 1 : 0);
                return -EINVAL;
        }
        return graph_broadcast(a, b, &out[0], err, errlen);
}

GRAPH_SHAPE_FN(gs_same)
{
        const struct graph_shape *x = graph_in_shape(g, n, 0);
        if (!x) {
                snprintf(err, errlen, "input 0 is required");
                return -EINVAL;
        }
        uint32_t axis;
        switch (n->op) {
        case GOP_SOFTMAX:
        case GOP_LOG_SOFTMAX:
                if (graph_axis(n->a.axis, x->rank, &axis) < 0) {
                        snprintf(err, errlen, "axis=%lld is out of range for input 0 of rank %u", (long long)n->a.axis,
                                 x->rank);
                        return -EINVAL;
                }
                break;
        case GOP_DROPOUT:
                /* ratio 1 would scale by 1 / 0; NaN fails both comparisons */
                if (!(n->a.ratio >= 0.0f && n->a.ratio < 1.0f)) {
                        snprintf(err, errlen, "ratio=%g is not in [0, 1)", (double)n->a.ratio);
                        return -EINVAL;
                }
                break;
        case GOP_LEAKY_RELU:
                if (!isfinite(n->a.alpha)) {
                        snprintf(err, errlen, "alpha=%g is not finite", (double)n->a.alpha);
                        return -EINVAL;
                }
                break;
        default:
                break;
        }
        out[0] = *x;
        return 0;
}

/* ---- Add, Sub, Mul, Div ---- */

static inline __attribute__((always_inline)) float bin_one(enum graph_op op, float a, float b)
{
        switch (op) {
        case GOP_ADD:
                return a + b;
        case GOP_SUB:
                return a - b;
        case GOP_MUL:
                return a * b;
        default:
                return a / b;
        }
}

/* d(op(a, b))/da times dy (which 0) or d/db times dy (which 1) */
static inline __attribute__((always_inline)) float bin_grad(enum graph_op op, int which, float dy, float a, float b)
{
        switch (op) {
        case GOP_ADD:
                return dy;
        case GOP_SUB:
                return which ? -dy : dy;
        case GOP_MUL:
                return which ? dy * a : dy * b;
        default:
                /* a / b^2 as (a / b) / b: b^2 overflows or underflows where the quotient does not */
                return which ? -(dy * (a / b)) / b : dy / b;
        }
}

/* Operands of the walk: 0 the output, 1 input a, 2 input b. Always inlined so that each op gets its own
 * loop, op being a constant at every call. */
static inline __attribute__((always_inline)) void bin_fwd_walk(enum graph_op op, const struct gk_nd *it, float *y,
                                                               const float *a, const float *b)
{
        size_t idx[GRAPH_MAX_RANK] = { 0 }, off[GK_ND_OPS] = { 0 };
        uint32_t last = it->rank - 1;
        size_t n = it->dims[last], sa = it->st[1][last], sb = it->st[2][last];
        do {
                /* inner strides are 1 or 0 (broadcast): one loop per case, so the common ones (equal shapes,
                 * a bias, a scalar) are plain loops the compiler can vectorise */
                float *yo = y + off[0];
                const float *ao = a + off[1], *bo = b + off[2];
                if (sa && sb) {
                        for (size_t j = 0; j < n; j++)
                                yo[j] = bin_one(op, ao[j], bo[j]);
                } else if (sa) {
                        float bv = bo[0];
                        for (size_t j = 0; j < n; j++)
                                yo[j] = bin_one(op, ao[j], bv);
                } else {
                        float av = ao[0];
                        for (size_t j = 0; j < n; j++)
                                yo[j] = bin_one(op, av, bo[j * sb]);
                }
        } while (gk_nd_next(it, idx, off, 3));
}

/* Adds the gradient of input `which` into d: where that input is broadcast along the inner dim (stride
 * 0), the run is summed first, which is the reduction over broadcast dims; along outer dims the += does
 * it. */
static inline __attribute__((always_inline)) void bin_bwd_walk(enum graph_op op, int which, const struct gk_nd *it,
                                                               const float *dy, const float *a, const float *b,
                                                               float *d)
{
        size_t idx[GRAPH_MAX_RANK] = { 0 }, off[GK_ND_OPS] = { 0 };
        uint32_t last = it->rank - 1;
        size_t n = it->dims[last], sa = it->st[1][last], sb = it->st[2][last], sd = which ? sb : sa;
        do {
                const float *dyo = dy + off[0], *ao = a + off[1], *bo = b + off[2];
                float *dd = d + off[1 + which];
                if (sd) {
                        for (size_t j = 0; j < n; j++)
                                dd[j] += bin_grad(op, which, dyo[j], ao[j * sa], bo[j * sb]);
                } else {
                        float acc = 0.0f;
                        for (size_t j = 0; j < n; j++)
                                acc += bin_grad(op, which, dyo[j], ao[j * sa], bo[j * sb]);
                        dd[0] += acc;
                }
        } while (gk_nd_next(it, idx, off, 3));
}

static void bin_walk_init(const struct graph_kctx *k, struct gk_nd *it)
{
        const struct graph_shape *ops[3] = { &k->out_shape[0], &k->in_shape[0], &k->in_shape[1] };
        gk_nd_init(it, &k->out_shape[0], ops, 3);
}

int gk_binary_fwd(struct graph_kctx *k)
{
        struct gk_nd it;
        bin_walk_init(k, &it);
        float *y = k->out[0];
        const float *a = k->in[0], *b = k->in[1];
        switch (k->node->op) {
        case GOP_ADD:
                bin_fwd_walk(GOP_ADD, &it, y, a, b);
                return 0;
        case GOP_SUB:
                bin_fwd_walk(GOP_SUB, &it, y, a, b);
                return 0;
        case GOP_MUL:
                bin_fwd_walk(GOP_MUL, &it, y, a, b);
                return 0;
        case GOP_DIV:
                bin_fwd_walk(GOP_DIV, &it, y, a, b);
                return 0;
        default:
                return -EINVAL;
        }
}

int gk_binary_bwd(struct graph_kctx *k)
{
        if (!k->dout[0])
                return 0;
        struct gk_nd it;
        bin_walk_init(k, &it);
        const float *dy = k->dout[0], *a = k->in[0], *b = k->in[1];
        size_t n = graph_count(&k->out_shape[0]);
        for (int which = 0; which < 2; which++) {
                float *d = k->din[which];
                if (!d)
                        continue;
                size_t nd = graph_count(&k->in_shape[which]);
                bool sub = k->node->op == GOP_SUB && which == 1;
                if (k->din_set[which] && nd == n && (k->node->op == GOP_ADD || k->node->op == GOP_SUB)) {
                        /* the gradient is dY itself (or -dY): written, not added (a residual's sum) */
                        for (size_t i = 0; i < n; i++)
                                d[i] = sub ? -dy[i] : dy[i];
                        continue;
                }
                if (k->din_set[which])
                        memset(d, 0, sizeof(float) * nd);
                switch (k->node->op) {
                case GOP_ADD:
                        bin_bwd_walk(GOP_ADD, which, &it, dy, a, b, d);
                        break;
                case GOP_SUB:
                        bin_bwd_walk(GOP_SUB, which, &it, dy, a, b, d);
                        break;
                case GOP_MUL:
                        bin_bwd_walk(GOP_MUL, which, &it, dy, a, b, d);
                        break;
                case GOP_DIV:
                        bin_bwd_walk(GOP_DIV, which, &it, dy, a, b, d);
                        break;
                default:
                        return -EINVAL;
                }
        }
        return 0;
}

/* ---- Relu, LeakyRelu, Sigmoid, Tanh ---- */

int gk_unary_fwd(struct graph_kctx *k)
{
        size_t n = graph_count(&k->out_shape[0]);
        const float *x = k->in[0]; /* (n) */
        float *y = k->out[0];      /* (n) */
        float alpha = k->node->a.alpha;
        switch (k->node->op) {
        case GOP_RELU:
                for (size_t i = 0; i < n; i++)
                        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
                return 0;
        case GOP_LEAKY_RELU:
                for (size_t i = 0; i < n; i++)
                        y[i] = x[i] > 0.0f ? x[i] : alpha * x[i];
                return 0;
        case GOP_SIGMOID:
                /* expf(-x) overflows to inf for x < -88, and 1 / inf is the right 0: no NaN either way */
                for (size_t i = 0; i < n; i++)
                        y[i] = 1.0f / (1.0f + expf(-x[i]));
                return 0;
        case GOP_TANH:
                for (size_t i = 0; i < n; i++)
                        y[i] = tanhf(x[i]);
                return 0;
        default:
                return -EINVAL;
        }
}

/* Relu and LeakyRelu read the input (the kink is at x = 0); Sigmoid and Tanh their output, whose
 * derivative is a function of it. */
int gk_unary_bwd(struct graph_kctx *k)
{
        float *dx = k->din[0];
        if (!dx || !k->dout[0])
                return 0;
        size_t n = graph_count(&k->out_shape[0]);
        const float *dy = k->dout[0];
        const float *x = k->in[0], *y = k->out[0];
        float alpha = k->node->a.alpha;
        /* dy[i] is loaded whatever the sign (not under the condition): the loops then vectorize, where a
         * load only on one branch keeps them scalar and mispredicted */
        if (k->din_set[0] && k->node->op == GOP_RELU) {
                for (size_t i = 0; i < n; i++) {
                        float d = dy[i];
                        dx[i] = x[i] > 0.0f ? d : 0.0f;
                }
                return 0;
        }
        if (k->din_set[0])
                memset(dx, 0, sizeof(float) * n);
        switch (k->node->op) {
        case GOP_RELU:
                for (size_t i = 0; i < n; i++) {
                        float d = dy[i];
                        dx[i] += x[i] > 0.0f ? d : 0.0f;
                }
                return 0;
        case GOP_LEAKY_RELU:
                for (size_t i = 0; i < n; i++) {
                        float d = dy[i];
                        dx[i] += x[i] > 0.0f ? d : alpha * d;
                }
                return 0;
        case GOP_SIGMOID:
                for (size_t i = 0; i < n; i++)
                        dx[i] += dy[i] * y[i] * (1.0f - y[i]);
                return 0;
        case GOP_TANH:
                for (size_t i = 0; i < n; i++)
                        dx[i] += dy[i] * (1.0f - y[i] * y[i]);
                return 0;
        default:
                return -EINVAL;
        }
}

/* ---- Dropout ---- */

/* The state: state[0] the scale forward applied (0: it passed x through, not training or ratio 0), then
 * the mask (count floats, 1 kept, 0 dropped). The scale is kept because backward is not told whether
 * the forward it follows was training. */
size_t gk_dropout_state(const struct graph *g, const struct graph_node *n, uint32_t B)
{
        return 1 + graph_shape_count(graph_in_shape(g, n, 0), B);
}

static inline uint64_t splitmix64(uint64_t z)
{
        z += 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

/* Element i's draw is a hash of (seed, node, i), not the next number of a stream: a mask depends on
 * nothing but those, whatever ran before, and a backward replay or another thread's order changes
 * nothing. */
int gk_dropout_fwd(struct graph_kctx *k)
{
        size_t n = graph_count(&k->out_shape[0]);
        const float *x = k->in[0]; /* (n) */
        float *y = k->out[0];      /* (n) */
        float ratio = k->node->a.ratio;
        if (!k->state)
                return -EINVAL;
        if (!k->training || ratio == 0.0f) {
                k->state[0] = 0.0f;
                memcpy(y, x, sizeof(float) * n);
                return 0;
        }
        float *mask = k->state + 1; /* (n) */
        float scale = 1.0f / (1.0f - ratio);
        k->state[0] = scale;
        uint64_t key = splitmix64(k->seed ^ splitmix64(0x6a09e667f3bcc909ull + k->node_index));
        for (size_t i = 0; i < n; i++) {
                /* key + i * gamma: the i-th draw of splitmix64's own sequence from key */
                float u = (float)(splitmix64(key + i * 0x9e3779b97f4a7c15ull) >> 40) * 0x1p-24f; /* [0, 1) */
                bool keep = u >= ratio;
                mask[i] = keep ? 1.0f : 0.0f;
                y[i] = keep ? x[i] * scale : 0.0f; /* not x * 0: an inf dropped is 0, not NaN */
        }
        return 0;
}

int gk_dropout_bwd(struct graph_kctx *k)
{
        float *dx = k->din[0];
        if (!dx || !k->dout[0])
                return 0;
        if (!k->state)
                return -EINVAL;
        size_t n = graph_count(&k->out_shape[0]);
        const float *dy = k->dout[0];
        float scale = k->state[0];
        const float *mask = k->state + 1;
        if (scale == 0.0f) {
                for (size_t i = 0; i < n; i++)
                        dx[i] += dy[i];
                return 0;
        }
        for (size_t i = 0; i < n; i++) {
                float d = dy[i] * scale; /* loaded either way: the loop vectorizes */
                dx[i] += mask[i] != 0.0f ? d : 0.0f;
        }
        return 0;
}
