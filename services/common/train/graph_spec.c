/* The layer list as a graph (graph_spec.h). The shapes are followed as model.c follows them, since a
 * dense layer's kernel needs the width that reaches it before graph_finalize infers anything. */
#include "graph_spec.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

struct builder {
        struct graph *g;
        int32_t cur;         /* the tensor the next layer reads */
        uint32_t c, h, w;    /* its shape per example, as model.c sees it */
        bool image;          /* rank 4 in the graph (else (batch, c*h*w)) */
};

/* One node reading b->cur (and the extra inputs), its output the new b->cur. */
static int add(struct builder *b, enum graph_op op, const char *name, const int32_t *extra, uint32_t n_extra,
               const struct graph_attrs *a, const char *out_name)
{
        char out[64];
        snprintf(out, sizeof(out), "%s", out_name ? out_name : name);
        int32_t in[GRAPH_MAX_IN] = { b->cur };
        for (uint32_t i = 0; i < n_extra; i++)
                in[1 + i] = extra[i];
        const char *outs[1] = { out };
        int r = graph_add_node(b->g, op, name, in, 1 + n_extra, outs, 1, a);
        if (r < 0)
                return r;
        b->cur = graph_find(b->g, out);
        return 0;
}

static int param(struct builder *b, const char *name, uint32_t rank, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
        struct graph_shape s = { rank, { d0, d1, d2, d3 } };
        return graph_add_tensor(b->g, name, GT_PARAM, GDT_F32, &s, NULL);
}

static int layer(struct builder *b, const struct layer_spec *L, uint32_t i, bool last, uint32_t *n_dense,
                 uint32_t *n_conv)
{
        char name[48], kname[64], bname[64];
        const char *out = last ? "logits" : NULL;
        struct graph_attrs a;
        graph_attrs_default(&a);
        int r, k, bias;
        switch (L->type) {
        case LAYER_DENSE: {
                uint32_t in = b->c * b->h * b->w;
                if (b->image) { /* model.c's dense reads its input flat */
                        snprintf(name, sizeof(name), "flatten%u", i);
                        if ((r = add(b, GOP_FLATTEN, name, NULL, 0, &a, NULL)) < 0)
                                return r;
                        b->image = false;
                }
                snprintf(name, sizeof(name), "dense%u", *n_dense);
                snprintf(kname, sizeof(kname), "dense%u/kernel", *n_dense);
                snprintf(bname, sizeof(bname), "dense%u/bias", *n_dense);
                (*n_dense)++;
                if ((k = param(b, kname, 2, in, L->units, 0, 0)) < 0 || (bias = param(b, bname, 2, 1, L->units, 0, 0)) < 0)
                        return k < 0 ? k : bias;
                int32_t ex[2] = { k, bias };
                b->c = b->h = 1;
                b->w = L->units;
                return add(b, GOP_GEMM, name, ex, 2, &a, out);
        }
        case LAYER_CONV2D: {
                snprintf(name, sizeof(name), "conv%u", *n_conv);
                snprintf(kname, sizeof(kname), "conv%u/kernel", *n_conv);
                snprintf(bname, sizeof(bname), "conv%u/bias", *n_conv);
                (*n_conv)++;
                uint32_t kk = L->kernel;
                if ((k = param(b, kname, 4, L->filters, b->c, kk, kk)) < 0 || (bias = param(b, bname, 1, L->filters, 0, 0, 0)) < 0)
                        return k < 0 ? k : bias;
                /* "same", stride 1: k - 1 rows of padding, the odd one after (TensorFlow's) */
                int64_t lo = (kk - 1) / 2, hi = kk - 1 - lo;
                a.n_pads = 4;
                a.pads[0] = a.pads[1] = lo;
                a.pads[2] = a.pads[3] = hi;
                a.n_kernel = 2;
                a.kernel[0] = a.kernel[1] = kk;
                int32_t ex[2] = { k, bias };
                b->c = L->filters;
                return add(b, GOP_CONV, name, ex, 2, &a, out);
        }
        case LAYER_MAXPOOL2D:
                snprintf(name, sizeof(name), "maxpool%u", i);
                a.n_kernel = a.n_strides = 2;
                a.kernel[0] = a.kernel[1] = a.strides[0] = a.strides[1] = L->pool;
                b->h /= L->pool;
                b->w /= L->pool;
                return add(b, GOP_MAXPOOL, name, NULL, 0, &a, out);
        case LAYER_FLATTEN:
                snprintf(name, sizeof(name), "flatten%u", i);
                b->w = b->c * b->h * b->w;
                b->c = b->h = 1;
                if (!b->image) /* already flat: nothing to do but keep the name chain */
                        return add(b, GOP_IDENTITY, name, NULL, 0, &a, out);
                b->image = false;
                return add(b, GOP_FLATTEN, name, NULL, 0, &a, out);
        case LAYER_RELU:
        case LAYER_TANH:
        case LAYER_SIGMOID:
                snprintf(name, sizeof(name), "%s%u", L->type == LAYER_RELU ? "relu" : L->type == LAYER_TANH ? "tanh" : "sigmoid",
                         i);
                return add(b, L->type == LAYER_RELU ? GOP_RELU : L->type == LAYER_TANH ? GOP_TANH : GOP_SIGMOID, name,
                           NULL, 0, &a, out);
        }
        return -EINVAL;
}

/* model.c reads its input as an image when a conv2d or maxpool2d comes before any dense or flatten layer:
 * (1, 1, N) then is an image of one row. */
static bool image_input(const struct model_spec *spec)
{
        if (spec->n_embeddings)
                return false;
        if (!(spec->input[0] == 1 && spec->input[1] == 1))
                return true;
        for (uint32_t i = 0; i < spec->n_layers; i++) {
                enum layer_type t = spec->layers[i].type;
                if (t == LAYER_CONV2D || t == LAYER_MAXPOOL2D)
                        return true;
                if (t == LAYER_DENSE || t == LAYER_FLATTEN)
                        return false;
        }
        return false;
}

int graph_from_spec(const struct model_spec *spec, struct graph **ret, char *err, size_t errlen)
{
        if (spec->n_layers == 0) {
                snprintf(err, errlen, "model.layers: no layers");
                return -EINVAL;
        }
        struct builder b = { .g = graph_new(), .c = spec->input[0], .h = spec->input[1], .w = spec->input[2] };
        if (!b.g)
                return -ENOMEM;
        if (spec->n_embeddings) /* the dense features and the tables' pooled rows, flat */
                b.c = b.h = 1, b.w = model_spec_dense_input(spec);
        b.image = image_input(spec);
        struct graph_shape in = b.image ? (struct graph_shape){ 4, { GRAPH_BATCH, b.c, b.h, b.w } }
                                        : (struct graph_shape){ 2, { GRAPH_BATCH, b.w } };
        int r = b.cur = graph_add_tensor(b.g, "input", GT_INPUT, GDT_F32, &in, NULL);
        if (r >= 0 && spec->n_embeddings) /* the sparse front turns the input's gradient into the rows' */
                b.g->tensors[r].want_grad = true;
        uint32_t n_dense = 0, n_conv = 0;
        for (uint32_t i = 0; i < spec->n_layers && r >= 0; i++)
                r = layer(&b, &spec->layers[i], i, i + 1 == spec->n_layers, &n_dense, &n_conv);
        if (r < 0) {
                snprintf(err, errlen, "model.layers: cannot build the graph: %s", strerror(-r));
        } else if ((b.g->loss = b.cur), (r = graph_finalize(b.g, err, errlen)) == 0) {
                *ret = b.g;
                return 0;
        }
        graph_free(b.g);
        return r;
}
