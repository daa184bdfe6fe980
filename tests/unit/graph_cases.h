/* One small graph per op of graph.h, and a runner that takes a graph through an exec on a backend (or
 * the host) and brings back host copies of everything a step computes. Shared by tests/unit/test_graph.c
 * (the host exec against an exec in device memory, the CPU kernels on both) and
 * tests/gpu/test_backend_equiv.c (the CPU against the CUDA kernels). gcase_build knows every op: a new op
 * of graph.h without a case here gives -ENOENT, and both tests fail on it.
 *
 * Each case: a batch input "x" (and "x2" where an op takes two batch inputs), parameters with random
 * values, the op's node with attributes that exercise what its kernels handle (broadcasting, strides,
 * pads, dilations, transposes, a repeated gather index), output "y" as the loss. Header-only: include it
 * once. */
#pragma once
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "graph.h"

#define GCASE_VARIANTS 2

static inline float gcase_u(unsigned *s, float lo, float hi)
{
        *s = *s * 1103515245u + 12345u;
        return lo + (hi - lo) * (float)((*s >> 8) & 0xffff) / 65536.0f;
}

/* A tensor of shape (batch or not, then dims) with random values in [lo, hi) (ids: integers in [0, hi)). */
static inline int gcase_tensor(struct graph *g, const char *name, enum graph_tensor_kind kind, enum graph_dtype dt,
                               bool batch, uint32_t rank, const int64_t *dims, float lo, float hi, unsigned seed)
{
        struct graph_shape s = { .rank = rank + (batch ? 1 : 0) };
        uint32_t at = 0;
        if (batch)
                s.dims[at++] = GRAPH_BATCH;
        for (uint32_t i = 0; i < rank; i++)
                s.dims[at++] = dims[i];
        void *data = NULL;
        if (kind != GT_INPUT) {
                size_t n = graph_shape_count(&s, 1);
                if (dt == GDT_I64) {
                        int64_t *v = malloc(sizeof(int64_t) * (n ? n : 1));
                        for (size_t i = 0; i < n; i++)
                                v[i] = (int64_t)gcase_u(&seed, 0, hi);
                        data = v;
                } else {
                        float *v = malloc(sizeof(float) * (n ? n : 1));
                        for (size_t i = 0; i < n; i++)
                                v[i] = gcase_u(&seed, lo, hi);
                        data = v;
                }
        }
        int t = graph_add_tensor(g, name, kind, dt, &s, data);
        free(data);
        if (t >= 0 && kind == GT_INPUT && dt == GDT_F32)
                g->tensors[t].want_grad = true;
        return t;
}

#define GC_DIMS(...) (sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), ((int64_t[]){ __VA_ARGS__ })
#define GC_IN(name, ...) gcase_tensor(g, name, GT_INPUT, GDT_F32, true, GC_DIMS(__VA_ARGS__), 0, 0, 0)
#define GC_PARAM(name, lo, hi, seed, ...) gcase_tensor(g, name, GT_PARAM, GDT_F32, false, GC_DIMS(__VA_ARGS__), lo, hi, seed)
#define GC_SET(field, ...)                                                                 \
        do {                                                                              \
                int64_t v_[] = { __VA_ARGS__ };                                           \
                a.n_##field = sizeof(v_) / sizeof(v_[0]);                                 \
                memcpy(a.field, v_, sizeof(v_));                                          \
        } while (0)

/* The case (op, variant) finalized in *ret (graph_free it), its loss "y". 0; -ENOENT where the op has no
 * such variant (variant 0: the op has no case at all); -EINVAL with why in err when it does not build. */
static inline int gcase_build(enum graph_op op, int variant, struct graph **ret, char *err, size_t errlen)
{
        struct graph *g = graph_new();
        struct graph_attrs a;
        graph_attrs_default(&a);
        int32_t in[GRAPH_MAX_IN];
        uint32_t n_in = 1, n_out = 1;
        in[0] = -1; /* "x" of (B, 3, 4) unless the case makes its own */
        switch (op) {
        case GOP_GEMM:
                if (variant == 0) {
                        in[0] = GC_IN("x", 6);
                        in[1] = GC_PARAM("w", -1, 1, 11, 5, 6);
                        in[2] = GC_PARAM("c", -1, 1, 12, 5);
                        a.trans_b = 1;
                        a.alpha = 0.7f;
                        a.beta = 1.3f;
                        n_in = 3;
                } else if (variant == 1) {
                                in[0] = GC_IN("x", 6);
                        in[1] = GC_PARAM("w", -1, 1, 13, 6, 5);
                        in[2] = GC_PARAM("c", -1, 1, 14, 1, 5);
                        n_in = 3;
                } else {
                        goto none;
                }
                break;
        case GOP_MATMUL:
                if (variant == 0) { /* (B, 3, 4) @ (4, 5): one product */
                        in[1] = GC_PARAM("w", -1, 1, 15, 4, 5);
                } else if (variant == 1) { /* (B, 3, 4) @ (B, 4, 5): batched */
                        in[1] = GC_IN("x2", 4, 5);
                } else {
                        goto none;
                }
                n_in = 2;
                break;
        case GOP_ADD:
        case GOP_SUB:
        case GOP_MUL:
        case GOP_DIV:
                if (variant == 0) /* broadcast along the batch and rows */
                        in[1] = GC_PARAM("p", 1, 2, 16, 4);
                else if (variant == 1) /* along the columns, and two batch inputs */
                        in[1] = op == GOP_DIV ? GC_PARAM("p", 1, 2, 17, 3, 1) : GC_IN("x2", 3, 4);
                else
                        goto none;
                n_in = 2;
                break;
        case GOP_RELU:
        case GOP_SIGMOID:
        case GOP_TANH:
        case GOP_IDENTITY:
        case GOP_FLATTEN:
                if (variant)
                        goto none;
                break;
        case GOP_LEAKY_RELU:
                if (variant)
                        goto none;
                a.alpha = 0.1f;
                break;
        case GOP_SOFTMAX:
        case GOP_LOG_SOFTMAX:
                if (variant > 1)
                        goto none;
                a.axis = variant ? 1 : -1;
                break;
        case GOP_CONV:
                in[0] = GC_IN("x", 3, 7, 6);
                if (variant == 0) { /* pads, strides and dilations of their own per axis */
                        in[1] = GC_PARAM("w", -1, 1, 18, 4, 3, 3, 2);
                        in[2] = GC_PARAM("b", -1, 1, 19, 4);
                        n_in = 3;
                        GC_SET(pads, 1, 0, 1, 1);
                        GC_SET(strides, 2, 1);
                        GC_SET(dilations, 1, 2);
                } else if (variant == 1) { /* no bias, "same" */
                        in[1] = GC_PARAM("w", -1, 1, 20, 2, 3, 3, 3);
                        n_in = 2;
                        GC_SET(pads, 1, 1, 1, 1);
                } else {
                        goto none;
                }
                break;
        case GOP_MAXPOOL:
        case GOP_AVGPOOL:
                if (variant > 1)
                        goto none;
                in[0] = GC_IN("x", 2, 6, 7);
                GC_SET(kernel, 3, 2);
                if (variant == 0) {
                        GC_SET(strides, 2, 2);
                        GC_SET(pads, 1, 0, 1, 1);
                } else {
                        GC_SET(strides, 1, 1); /* overlapping windows */
                        a.count_include_pad = 1;
                }
                break;
        case GOP_GLOBAL_AVGPOOL:
                if (variant)
                        goto none;
                in[0] = GC_IN("x", 3, 4, 5);
                break;
        case GOP_BATCHNORM:
                if (variant > 1)
                        goto none;
                in[0] = variant ? GC_IN("x", 3) : GC_IN("x", 3, 4, 5);
                in[1] = GC_PARAM("scale", 0.5f, 1.5f, 21, 3);
                in[2] = GC_PARAM("bias", -1, 1, 22, 3);
                in[3] = GC_PARAM("mean", -0.2f, 0.2f, 23, 3);
                in[4] = GC_PARAM("var", 0.5f, 1.5f, 24, 3);
                n_in = 5;
                n_out = variant ? 1 : 3;
                a.momentum = 0.8f;
                break;
        case GOP_DROPOUT:
                if (variant)
                        goto none;
                in[0] = GC_IN("x", 50);
                a.ratio = 0.3f;
                break;
        case GOP_LAYERNORM:
                if (variant > 1)
                        goto none;
                in[0] = GC_IN("x", 3, 6);
                in[1] = variant ? GC_PARAM("scale", 0.5f, 1.5f, 25, 3, 6) : GC_PARAM("scale", 0.5f, 1.5f, 25, 6);
                in[2] = variant ? GC_PARAM("bias", -1, 1, 26, 3, 6) : GC_PARAM("bias", -1, 1, 26, 6);
                n_in = 3;
                a.axis = variant ? 1 : -1;
                break;
        case GOP_PAD:
                if (variant)
                        goto none;
                GC_SET(pads, 0, 1, 2, 0, 2, 0);
                a.pad_value = 0.5f;
                break;
        case GOP_RESHAPE:
                if (variant)
                        goto none;
                GC_SET(shape, 0, 2, 6);
                break;
        case GOP_TRANSPOSE:
                if (variant)
                        goto none;
                in[0] = GC_IN("x", 2, 3, 4);
                GC_SET(perm, 0, 2, 3, 1);
                break;
        case GOP_CONCAT:
                if (variant)
                        goto none;
                in[1] = GC_IN("x2", 2, 4);
                in[2] = GC_IN("x3", 1, 4);
                n_in = 3;
                a.axis = 1;
                break;
        case GOP_SQUEEZE:
                if (variant)
                        goto none;
                in[0] = GC_IN("x", 1, 5);
                GC_SET(axes, 1);
                break;
        case GOP_UNSQUEEZE:
                if (variant)
                        goto none;
                GC_SET(axes, 2);
                break;
        case GOP_GATHER:
                if (variant == 0) { /* an embedding lookup: ids fed with the batch */
                                in[0] = GC_PARAM("table", -1, 1, 27, 10, 4);
                        in[1] = gcase_tensor(g, "ids", GT_INPUT, GDT_I64, true, GC_DIMS(3), 0, 0, 0);
                        a.axis = 0;
                } else if (variant == 1) { /* constant indices on another axis, one listed twice */
                        in[1] = gcase_tensor(g, "idx", GT_CONST, GDT_I64, false, GC_DIMS(3), 0, 4, 28);
                        a.axis = 2;
                } else {
                        goto none;
                }
                n_in = 2;
                break;
        case GOP_REDUCE_SUM:
        case GOP_REDUCE_MEAN:
                if (variant == 0) {
                        GC_SET(axes, 2);
                        a.keepdims = 1;
                } else if (variant == 1) {
                        GC_SET(axes, 1, 2);
                        a.keepdims = 0;
                } else {
                        goto none;
                }
                break;
        default:
                goto none;
        }
        if (in[0] == -1)
                in[0] = GC_IN("x", 3, 4);
        const char *outs[GRAPH_MAX_OUT] = { "y", "y_mean", "y_var" };
        int r = graph_add_node(g, op, "node", in, n_in, outs, n_out, &a);
        if (r >= 0) {
                g->loss = graph_find(g, "y");
                r = graph_finalize(g, err, errlen);
        }
        if (r < 0) {
                graph_free(g);
                return r;
        }
        *ret = g;
        return 0;
none:
        graph_free(g);
        return -ENOENT;
}

/* What one step computed, in host memory (malloc'd; gcase_out_free). */
struct gcase_out {
        float *y;                      /* (ny) the loss tensor's values */
        size_t ny;
        float *grads;                  /* (n_params) after graph_backward and graph_moving_deltas */
        size_t n_params;
        float *dx[GRAPH_MAX_IN];       /* the batch inputs' gradients (want_grad), in tensor order */
        size_t ndx[GRAPH_MAX_IN];
        uint32_t n_dx;
};

static inline void gcase_out_free(struct gcase_out *o)
{
        free(o->y);
        free(o->grads);
        for (uint32_t i = 0; i < o->n_dx; i++)
                free(o->dx[i]);
        memset(o, 0, sizeof(*o));
}

/* Runs g on be (NULL: the host) at batch B: inputs random from seed 7 (ids in range), forward (training
 * as given, Dropout seed 99), backward from fixed random weights on y, the moving deltas. 0, or the
 * first -errno, with where in err. */
static inline int gcase_run(const struct graph *g, struct backend *be, uint32_t B, bool training, struct gcase_out *o,
                            char *err, size_t errlen)
{
        memset(o, 0, sizeof(*o));
        struct graph_exec *x = NULL;
        void *dt = NULL;
        int r = graph_exec_new_on(g, B, be, &x, err, errlen);
        if (r < 0)
                return r;
        unsigned seed = 7;
        for (uint32_t t = 0; t < g->n_tensors; t++) {
                const struct graph_tensor *tt = &g->tensors[t];
                if (tt->kind != GT_INPUT)
                        continue;
                size_t n = graph_shape_count(&tt->shape, B);
                void *v = malloc(8 * (n ? n : 1));
                for (size_t i = 0; i < n; i++) {
                        if (tt->dtype == GDT_I64)
                                ((int64_t *)v)[i] = (int64_t)gcase_u(&seed, 0, 10);
                        else
                                ((float *)v)[i] = gcase_u(&seed, -1, 1);
                }
                r = graph_set_input(x, (int32_t)t, v, B);
                free(v);
                if (r < 0) {
                        snprintf(err, errlen, "graph_set_input: %d", r);
                        goto out;
                }
        }
        if ((r = graph_forward(x, training, 99)) < 0) {
                snprintf(err, errlen, "graph_forward: %d", r);
                goto out;
        }
        const void *y = graph_value_host(x, g->loss, &o->ny);
        o->y = malloc(sizeof(float) * (o->ny ? o->ny : 1));
        if (!y) {
                r = -EIO;
                snprintf(err, errlen, "graph_value_host failed");
                goto out;
        }
        memcpy(o->y, y, sizeof(float) * o->ny);
        float *w = malloc(sizeof(float) * (o->ny ? o->ny : 1));
        for (size_t i = 0; i < o->ny; i++)
                w[i] = gcase_u(&seed, -1, 1);
        dt = w;
        if (be && !backend_host_memory(be)) {
                dt = backend_alloc(be, sizeof(float) * (o->ny ? o->ny : 1));
                backend_upload(be, dt, w, sizeof(float) * o->ny);
                free(w);
        }
        if ((r = graph_backward(x, g->loss, dt)) < 0 || (r = graph_moving_deltas(x)) < 0) {
                snprintf(err, errlen, "graph_backward: %d", r);
                goto out;
        }
        o->n_params = g->n_params;
        o->grads = malloc(sizeof(float) * (o->n_params ? o->n_params : 1));
        if (be && !backend_host_memory(be))
                r = backend_download(be, o->grads, graph_exec_grads(x), sizeof(float) * o->n_params);
        else
                memcpy(o->grads, graph_exec_grads(x), sizeof(float) * o->n_params);
        for (uint32_t t = 0; r == 0 && t < g->n_tensors && o->n_dx < GRAPH_MAX_IN; t++) {
                if (g->tensors[t].kind != GT_INPUT || !g->tensors[t].want_grad)
                        continue;
                const float *d = graph_grad_host(x, (int32_t)t);
                size_t n = graph_shape_count(&g->tensors[t].shape, B);
                o->dx[o->n_dx] = malloc(sizeof(float) * (n ? n : 1));
                o->ndx[o->n_dx] = n;
                if (!d) {
                        r = -EIO;
                        snprintf(err, errlen, "graph_grad_host(%s) failed", g->tensors[t].name);
                        o->n_dx++;
                        break;
                }
                memcpy(o->dx[o->n_dx++], d, sizeof(float) * n);
        }
out:
        if (be && !backend_host_memory(be))
                backend_buf_free(be, dt);
        else
                free(dt);
        graph_exec_free(x);
        return r;
}
