/* The graph engine's op tests share this: one node in a graph of its own, run forward at a batch, its
 * first output compared with a reference, and its backward compared with central finite differences in
 * double precision (the rule: max relative error <= 1e-3).
 *
 * Every float input is a parameter (GT_PARAM), so that its gradient lands in the gradient block; int64
 * inputs are constants. The graph has no batch input (tests of the symbolic batch build their own
 * graph). Header-only: include it once. */
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"

struct gc_input {
        const char *name;
        enum graph_dtype dtype;
        struct graph_shape shape;      /* full shape, the batch included */
        const void *data;              /* graph_shape_count(shape) values */
};

struct gc_result {
        double fwd_max_abs;            /* against the reference (0 when none given) */
        double bwd_max_rel;            /* worst |analytic - numeric| / max(|numeric|, |analytic|, floor) */
        size_t n_checked;              /* gradient elements compared */
        char msg[512];                 /* the first failure, or the graph's error */
};

static inline double gc_frand(unsigned *s)
{
        *s = *s * 1103515245u + 12345u;
        return ((*s >> 8) & 0xffff) / 65536.0;
}

/* Uniform floats in [lo, hi) from seed, malloc'd (the caller frees). */
static inline float *gc_rand(size_t n, float lo, float hi, unsigned seed)
{
        float *v = (float *)malloc(sizeof(float) * (n ? n : 1));
        for (size_t i = 0; i < n; i++)
                v[i] = (float)(lo + (hi - lo) * gc_frand(&seed));
        return v;
}

/* ||a - b|| / ||b|| (plain ||a - b|| where b is zero), in double. */
static inline double gc_rel_l2(const float *a, const float *b, size_t n)
{
        double d = 0, s = 0;
        for (size_t i = 0; i < n; i++) {
                d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
                s += (double)b[i] * b[i];
        }
        return s > 0 ? sqrt(d / s) : sqrt(d);
}

static inline struct graph_shape gc_shape(uint32_t rank, const int64_t *dims)
{
        struct graph_shape s = { .rank = rank };
        for (uint32_t i = 0; i < rank; i++)
                s.dims[i] = dims[i];
        return s;
}
#define GC_SHAPE(...) gc_shape(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t), (int64_t[]){ __VA_ARGS__ })

/* loss = sum_i w_i * out0_i with fixed weights w; returns it in double. */
static inline double gc_loss(struct graph_exec *x, int32_t out, const float *w)
{
        size_t n = 0;
        const float *v = (const float *)graph_value(x, out, &n);
        double s = 0;
        for (size_t i = 0; i < n; i++)
                s += (double)w[i] * (double)v[i];
        return s;
}

/* Builds the node (op, attributes, inputs), runs forward (training as given; seed 1), compares output 0
 * with ref (nullable: no comparison) and checks the gradient of every float input with central
 * differences of step h (relative to each value's size, at least h) in the float graph, accumulated in
 * double. Returns 0 when the graph builds and runs; the figures in *r (the caller asserts its bounds).
 * Every input is a parameter (no batch input): the graph has no symbolic dimension. */
static inline int gc_check(enum graph_op op, const struct graph_attrs *a, const struct gc_input *in, uint32_t n_in,
                           uint32_t n_out, bool training, const float *ref, double h, struct gc_result *r)
{
        memset(r, 0, sizeof(*r));
        struct graph *g = graph_new();
        int32_t idx[GRAPH_MAX_IN];
        for (uint32_t i = 0; i < n_in; i++) {
                if (!in[i].name) {
                        idx[i] = -1;
                        continue;
                }
                idx[i] = graph_add_tensor(g, in[i].name, in[i].dtype == GDT_F32 ? GT_PARAM : GT_CONST, in[i].dtype,
                                          &in[i].shape, in[i].data);
                if (idx[i] < 0) {
                        snprintf(r->msg, sizeof(r->msg), "graph_add_tensor(%s): %d", in[i].name, idx[i]);
                        graph_free(g);
                        return idx[i];
                }
        }
        const char *outs[GRAPH_MAX_OUT] = { "y", "y1", "y2" };
        int node = graph_add_node(g, op, "node", idx, n_in, outs, n_out, a);
        int rc = node < 0 ? node : graph_finalize(g, r->msg, sizeof(r->msg));
        struct graph_exec *x = NULL;
        if (rc == 0)
                rc = graph_exec_new(g, 1, &x, r->msg, sizeof(r->msg));
        if (rc < 0) {
                if (!r->msg[0])
                        snprintf(r->msg, sizeof(r->msg), "building the graph: %d", rc);
                graph_free(g);
                return rc;
        }
        int32_t y = graph_find(g, "y");
        if ((rc = graph_forward(x, training, 1)) < 0) {
                snprintf(r->msg, sizeof(r->msg), "forward: %d", rc);
                goto out;
        }
        size_t ny = 0;
        const float *v = (const float *)graph_value(x, y, &ny);
        if (ref)
                for (size_t i = 0; i < ny; i++) {
                        double d = fabs((double)v[i] - (double)ref[i]);
                        if (d > r->fwd_max_abs || isnan(v[i]))
                                r->fwd_max_abs = isnan(v[i]) ? INFINITY : d;
                }
        float *w = gc_rand(ny, -1, 1, 4242);
        if ((rc = graph_backward(x, y, w)) < 0) {
                snprintf(r->msg, sizeof(r->msg), "backward: %d", rc);
                free(w);
                goto out;
        }
        size_t np = g->n_params;
        float *p = graph_exec_params(x);
        float *an = (float *)malloc(sizeof(float) * (np ? np : 1));
        memcpy(an, graph_exec_grads(x), sizeof(float) * np);
        for (size_t i = 0; i < np; i++) {
                float keep = p[i];
                double step = h * (fabs(keep) > 1 ? fabs(keep) : 1);
                p[i] = (float)(keep + step);
                double step_up = (double)p[i] - keep;
                graph_forward(x, training, 1);
                double lp = gc_loss(x, y, w);
                p[i] = (float)(keep - step);
                double step_dn = keep - (double)p[i];
                graph_forward(x, training, 1);
                double lm = gc_loss(x, y, w);
                p[i] = keep;
                double num = (lp - lm) / (step_up + step_dn);
                double floor = 1e-2;
                double den = fmax(fmax(fabs(num), fabs((double)an[i])), floor);
                double rel = fabs(num - (double)an[i]) / den;
                if (rel > r->bwd_max_rel) {
                        r->bwd_max_rel = rel;
                        if (rel > 1e-3 && !r->msg[0])
                                snprintf(r->msg, sizeof(r->msg), "gradient element %zu: analytic %.7g, numeric %.7g", i,
                                         (double)an[i], num);
                }
                r->n_checked++;
        }
        graph_forward(x, training, 1);
        free(an);
        free(w);
out:
        graph_exec_free(x);
        graph_free(g);
        return rc;
}

#ifdef fail_msg
/* For cmocka tests (include cmocka.h first): forward within 1e-5 of the output's scale, backward within 1e-3
 * relative, as the issue sets them; prints the figures. */
static inline void gc_expect_close(const char *what, int rc, const struct gc_result *r, const float *ref, size_t n)
{
        double scale = 1.0;
        for (size_t i = 0; ref && i < n; i++)
                scale = fmax(scale, fabs((double)ref[i]));
        printf("  %-48s fwd %.2e (scale %.3g)  bwd %.2e over %zu\n", what, r->fwd_max_abs, scale, r->bwd_max_rel,
               r->n_checked);
        if (rc < 0)
                fail_msg("%s: rc %d: %s", what, rc, r->msg);
        if (r->fwd_max_abs > 1e-5 * scale)
                fail_msg("%s: forward off by %g", what, r->fwd_max_abs);
        if (r->bwd_max_rel > 1e-3 || r->n_checked == 0)
                fail_msg("%s: backward rel error %g over %zu: %s", what, r->bwd_max_rel, r->n_checked, r->msg);
}
#endif
