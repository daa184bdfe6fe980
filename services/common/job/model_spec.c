/* A model's variables from its spec alone: the same names, shapes, offsets and layers model_new()
 * gives them, checked by the same rules, without building anything. */
#include "model_spec.h"

#include "graph.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int add_var(struct model_spec_var *vars, uint32_t *n, size_t *n_params, uint32_t layer, const char *prefix,
                   uint32_t idx, const char *what, uint32_t rows, uint32_t cols) {
        if (*n >= MODEL_MAX_VARS)
                return -EINVAL;
        struct model_spec_var *v = &vars[(*n)++];
        snprintf(v->name, sizeof(v->name), "%s%u/%s", prefix, idx, what);
        v->rows = rows;
        v->cols = cols;
        v->offset = *n_params;
        v->layer = layer;
        *n_params += (size_t)rows * cols;
        return 0;
}

uint32_t model_spec_dense_input(const struct model_spec *spec) {
        uint64_t n = (uint64_t)spec->input[0] * spec->input[1] * spec->input[2];

        for (uint32_t e = 0; e < spec->n_embeddings; e++)
                n += (uint64_t)spec->emb[e].n_fields * spec->emb[e].dim;
        return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* A graph model's variables: its parameters in the block's order; a tensor of rank 2 or more is (dims[0],
 * the rest), a vector (1, n) as a bias, a scalar (1, 1). The layer is 0 for all. */
static int graph_vars(const struct graph *g, struct model_spec_var *vars, size_t *n_params_ret) {
        uint32_t n = 0;

        if (!g->final)
                return -EINVAL;
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                const struct graph_tensor *t = &g->tensors[i];
                if (t->kind != GT_PARAM)
                        continue;
                size_t count = graph_shape_count(&t->shape, 1);
                size_t rows = t->shape.rank >= 2 ? (size_t)t->shape.dims[0] : 1;
                if (n >= MODEL_MAX_VARS || strlen(t->name) >= MODEL_VAR_NAME || count == 0 || count / rows > UINT32_MAX ||
                    rows > UINT32_MAX)
                        return -EINVAL;
                struct model_spec_var *v = &vars[n++];
                snprintf(v->name, sizeof(v->name), "%s", t->name);
                v->rows = (uint32_t)rows;
                v->cols = (uint32_t)(count / rows);
                v->offset = t->param_offset;
                v->layer = 0;
                v->moving = t->moving;
        }
        if (n_params_ret)
                *n_params_ret = g->n_params;
        return (int)n;
}

int model_spec_vars(const struct model_spec *spec, struct model_spec_var *vars, size_t *n_params_ret) {
        if (spec && spec->graph)
                return graph_vars(spec->graph, vars, n_params_ret);
        if (!spec || spec->n_layers == 0 || spec->n_layers > MODEL_MAX_LAYERS ||
            spec->n_embeddings > MODEL_MAX_EMBEDDINGS || spec->head > HEAD_MSE)
                return -EINVAL;
        for (uint32_t e = 0; e < spec->n_embeddings; e++)
                if (spec->emb[e].dim == 0 || spec->emb[e].n_fields == 0 || spec->emb[e].n_fields > MODEL_MAX_FIELDS)
                        return -EINVAL;
        uint64_t c = spec->input[0], h = spec->input[1], w = spec->input[2];

        if (spec->n_embeddings)  /* the dense layers read the dense features and the pooled rows */
                c = 1, h = 1, w = model_spec_dense_input(spec);
        if (c == 0 || h == 0 || w == 0 || c * h * w > UINT32_MAX / 4)
                return -EINVAL;
        uint32_t n = 0, n_dense = 0, n_conv = 0;
        size_t n_params = 0;
        for (uint32_t i = 0; i < spec->n_layers; i++) {
                const struct layer_spec *ls = &spec->layers[i];
                int r = 0;
                switch (ls->type) {
                case LAYER_DENSE:
                        if (ls->units == 0 || ls->units > UINT32_MAX / 4)
                                return -EINVAL;
                        r = add_var(vars, &n, &n_params, i, "dense", n_dense, "kernel", (uint32_t)(c * h * w), ls->units);
                        if (r == 0)
                                r = add_var(vars, &n, &n_params, i, "dense", n_dense, "bias", 1, ls->units);
                        n_dense++;
                        c = 1, h = 1, w = ls->units;
                        break;
                case LAYER_CONV2D:   /* "same" padding, stride 1: the image keeps its size */
                        if (ls->filters == 0 || ls->kernel == 0 || ls->kernel > h || ls->kernel > w)
                                return -EINVAL;
                        if ((uint64_t)ls->filters * h * w > UINT32_MAX / 4 ||
                            (uint64_t)c * ls->kernel * ls->kernel > UINT32_MAX / 4)
                                return -EINVAL;
                        r = add_var(vars, &n, &n_params, i, "conv", n_conv, "kernel", ls->filters,
                                    (uint32_t)c * ls->kernel * ls->kernel);
                        if (r == 0)
                                r = add_var(vars, &n, &n_params, i, "conv", n_conv, "bias", 1, ls->filters);
                        n_conv++;
                        c = ls->filters;
                        break;
                case LAYER_MAXPOOL2D:
                        if (ls->pool == 0 || ls->pool > h || ls->pool > w)
                                return -EINVAL;
                        h /= ls->pool, w /= ls->pool;
                        break;
                case LAYER_FLATTEN:
                        w = c * h * w, c = 1, h = 1;
                        break;
                case LAYER_RELU:
                case LAYER_TANH:
                case LAYER_SIGMOID:
                        break;
                default:
                        return -EINVAL;
                }
                if (r < 0)
                        return r;
        }
        uint64_t classes = c * h * w;  /* softmax: classes; logistic, mse: one output */
        if (spec->head == HEAD_SOFTMAX ? classes < 2 || classes > 256 : classes != 1)
                return -EINVAL;
        if (n_params_ret)
                *n_params_ret = n_params;
        return (int)n;
}
