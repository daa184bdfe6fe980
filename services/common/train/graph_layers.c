/* The layer list as a graph: see graph_layers.h. */
#include "graph_layers.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "graph.h"

/* The builder's state: the graph, the tensor the next layer reads, and the variables' names in
 * model_spec_vars' order (the parameters are added in that order, so the block's layout is the same). */
struct build {
        struct graph *g;
        int32_t cur;
        struct graph_shape shape;
        uint32_t n_nodes;
        const struct model_spec_var *vars;
        uint32_t next_var;
};

/* Adds node op over in[0..n_in) with one output, the next tensor read; the last layer's is "logits". */
static int add(struct build *b, enum graph_op op, const int32_t *in, uint32_t n_in, const struct graph_attrs *a,
               bool last)
{
        char name[32], out[32];
        snprintf(name, sizeof(name), "node%u", b->n_nodes);
        snprintf(out, sizeof(out), last ? "logits" : "t%u", b->n_nodes);
        const char *outs[1] = { out };
        int r = graph_add_node(b->g, op, name, in, n_in, outs, 1, a);
        if (r < 0)
                return r;
        b->n_nodes++;
        b->cur = graph_find(b->g, out);
        return 0;
}

/* The next variable of the list, as a parameter of the given shape (its count checked against the
 * list's rows x cols). */
static int param(struct build *b, const struct graph_shape *s)
{
        const struct model_spec_var *v = &b->vars[b->next_var++];
        size_t n = 1;
        for (uint32_t i = 0; i < s->rank; i++)
                n *= (size_t)s->dims[i];
        if (n != (size_t)v->rows * v->cols)
                return -EINVAL;
        return graph_add_tensor(b->g, v->name, GT_PARAM, GDT_F32, s, NULL);
}

static int layer(struct build *b, const struct layer_spec *ls, bool last)
{
        struct graph_attrs a;
        graph_attrs_default(&a);
        int64_t *d = b->shape.dims;
        switch (ls->type) {
        case LAYER_DENSE: {
                if (b->shape.rank != 2) {
                        int r = add(b, GOP_FLATTEN, &b->cur, 1, &a, false);
                        if (r < 0)
                                return r;
                        b->shape = (struct graph_shape){ .rank = 2, .dims = { GRAPH_BATCH, d[1] * d[2] * d[3] } };
                }
                struct graph_shape ks = { .rank = 2, .dims = { d[1], ls->units } }, bs = { .rank = 1, .dims = { ls->units } };
                int32_t in[3] = { b->cur, param(b, &ks), param(b, &bs) };
                if (in[1] < 0 || in[2] < 0)
                        return in[1] < 0 ? in[1] : in[2];
                b->shape.dims[1] = ls->units;
                return add(b, GOP_GEMM, in, 3, &a, last);
        }
        case LAYER_CONV2D: {
                if (b->shape.rank != 4)
                        return -EINVAL;
                int64_t k = ls->kernel, before = (k - 1) / 2;
                struct graph_shape ks = { .rank = 4, .dims = { ls->filters, d[1], k, k } };
                struct graph_shape bs = { .rank = 1, .dims = { ls->filters } };
                int32_t in[3] = { b->cur, param(b, &ks), param(b, &bs) };
                if (in[1] < 0 || in[2] < 0)
                        return in[1] < 0 ? in[1] : in[2];
                a.n_pads = 4;
                a.pads[0] = a.pads[1] = before;
                a.pads[2] = a.pads[3] = k - 1 - before;
                d[1] = ls->filters;
                return add(b, GOP_CONV, in, 3, &a, last);
        }
        case LAYER_MAXPOOL2D:
                if (b->shape.rank != 4 || ls->pool < 1 || d[2] < ls->pool || d[3] < ls->pool)
                        return -EINVAL;
                a.n_kernel = a.n_strides = 2;
                a.kernel[0] = a.kernel[1] = a.strides[0] = a.strides[1] = ls->pool;
                d[2] /= ls->pool;
                d[3] /= ls->pool;
                return add(b, GOP_MAXPOOL, &b->cur, 1, &a, last);
        case LAYER_FLATTEN:
                if (b->shape.rank == 4)
                        b->shape = (struct graph_shape){ .rank = 2, .dims = { GRAPH_BATCH, d[1] * d[2] * d[3] } };
                return add(b, GOP_FLATTEN, &b->cur, 1, &a, last);
        case LAYER_RELU:
                return add(b, GOP_RELU, &b->cur, 1, &a, last);
        case LAYER_TANH:
                return add(b, GOP_TANH, &b->cur, 1, &a, last);
        case LAYER_SIGMOID:
                return add(b, GOP_SIGMOID, &b->cur, 1, &a, last);
        }
        return -EINVAL;
}

int graph_from_layers(const struct model_spec *spec, struct graph **ret, char *err, size_t errlen)
{
        *ret = NULL;
        if (errlen)
                err[0] = '\0';
        if (spec->graph || spec->n_embeddings) {
                snprintf(err, errlen, "%s", spec->graph ? "the model is a graph already (model.onnx)"
                                                        : "embedding tables (model.embeddings) live on the ps: not a layer list alone");
                return -ENOTSUP;
        }
        struct model_spec_var vars[MODEL_MAX_VARS];
        size_t n_params;
        int nv = model_spec_vars(spec, vars, &n_params);
        if (nv < 0 || spec->n_layers == 0) {
                snprintf(err, errlen, "the layer list does not make a model");
                return -EINVAL;
        }
        struct build b = { .g = graph_new(), .vars = vars };
        if (!b.g)
                return -ENOMEM;
        int64_t C = spec->input[0], H = spec->input[1], W = spec->input[2];
        b.shape = C * H > 1 ? (struct graph_shape){ .rank = 4, .dims = { GRAPH_BATCH, C, H, W } }
                            : (struct graph_shape){ .rank = 2, .dims = { GRAPH_BATCH, C * H * W } };
        int r = b.cur = graph_add_tensor(b.g, "input", GT_INPUT, GDT_F32, &b.shape, NULL);
        for (uint32_t i = 0; r >= 0 && i < spec->n_layers; i++)
                r = layer(&b, &spec->layers[i], i + 1 == spec->n_layers);
        if (r >= 0 && b.next_var != (uint32_t)nv)
                r = -EINVAL;
        if (r >= 0) {
                b.g->loss = graph_find(b.g, "logits");
                r = graph_finalize(b.g, err, errlen);
        }
        /* the same layout as the layer-list engine's block, variable by variable */
        for (int v = 0; r >= 0 && v < nv; v++) {
                int t = graph_find(b.g, vars[v].name);
                if (t < 0 || b.g->tensors[t].param_offset != vars[v].offset)
                        r = -EINVAL;
        }
        if (r < 0) {
                if (r == -EINVAL && (!err[0] || errlen == 0))
                        snprintf(err, errlen, "the layer list does not make a graph");
                else if (r == -ENOMEM)
                        snprintf(err, errlen, "out of memory");
                graph_free(b.g);
                return r;
        }
        *ret = b.g;
        return 0;
}
