/* The model: a list of layers over one parameter block and one gradient block, run on a backend.
 * Activation buffers are allocated once for max_batch. Elementwise activations run in place when the
 * buffer they read is one whose producer's backward doesn't need it (dense, conv2d, maxpool2d
 * outputs), so a dense+relu pair costs one buffer. Backward ping-pongs between two gradient buffers
 * and stops at the first layer with parameters, unless the input gradient is asked for
 * (model_set_input_grad: a sparse front turns it into embedding rows' gradients).
 *
 * A dense kernel may be split into row blocks (model_set_var_blocks) so a worker can overlap a large
 * variable's transfer with compute. Every path runs the same arithmetic for the same blocks, whichever
 * hooks are passed: forward is y = sum_b x[:, rows_b] @ W[rows_b, :] (one gemm per block, K = block
 * rows, accumulating with beta = 1 after the first), backward dW[rows_b, :] = x[:, rows_b]^T @ dy per
 * block. An unblocked kernel is one block covering all rows: exactly the single-gemm code.
 *
 * That layer code (model_pass.c) runs a layer list on device backends. On a host-memory backend the list
 * runs on the graph engine (model_graph.c, the list compiled by graph_from_spec): plan() still lays out
 * the layers' shapes and variables, which the initial values and model_describe read, but the graph owns
 * the activations; model_new_engine(MODEL_ENGINE_LAYERS) keeps the layer code for tests and benchmarks. */
#include "model.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "model-internal.h"
#include "rng.h"

uint32_t model_n_vars(const struct model *m)
{
        return m->n_vars;
}

const struct model_var *model_var(const struct model *m, uint32_t i)
{
        assert(i < m->n_vars);
        return &m->vars[i];
}

int model_find_var(const struct model *m, const char *name)
{
        for (uint32_t i = 0; i < m->n_vars; i++)
                if (strcmp(m->vars[i].name, name) == 0)
                        return (int)i;
        return -ENOENT;
}

bool model_runs_graph(const struct model *m)
{
        return m->gx != NULL;
}

size_t model_n_params(const struct model *m)
{
        return m->n_params;
}

uint32_t model_max_batch(const struct model *m)
{
        return m->max_batch;
}

uint32_t model_input_size(const struct model *m)
{
        return m->in_n;
}

uint32_t model_n_classes(const struct model *m)
{
        return m->classes;
}

float *model_params(struct model *m)
{
        return m->params_host;
}

int model_params_check(struct model *m, char *why, size_t len)
{
        const float *p = m->params_host;
        for (uint32_t v = 0; v < m->n_vars; v++) {
                const struct model_var *mv = &m->vars[v];
                for (size_t i = 0, n = (size_t)mv->rows * mv->cols; i < n; i++) {
                        float x = p[mv->offset + i];
                        if (!(fabsf(x) <= MODEL_WEIGHT_LIMIT)) {   /* NaN fails the comparison too */
                                snprintf(why, len, "%s holds %g", mv->name, (double)x);
                                return -ERANGE;
                        }
                }
        }
        return 0;
}

float *model_grads(struct model *m)
{
        return m->grads_host;
}

/* Shapes, variables and buffer plan; no allocation. The variables (and the checks on the spec) come
 * from model_spec_vars(), the one derivation psd's layout uses too; this adds each layer's shapes. */
static int plan(struct model *m, const struct model_spec *spec, enum model_engine engine)
{
        struct model_spec_var sv[MODEL_MAX_VARS];
        int nv = model_spec_vars(spec, sv, &m->n_params);
        if (nv < 0)
                return nv;
        for (uint32_t v = 0; v < (uint32_t)nv; v++) {
                memcpy(m->names[v], sv[v].name, sizeof(m->names[v]));
                m->vars[v] = (struct model_var){.name = m->names[v], .rows = sv[v].rows, .cols = sv[v].cols,
                                                .offset = sv[v].offset, .layer = sv[v].layer};
                m->n_blocks[v] = 1;
                m->whole[v][0] = 0;
                m->whole[v][1] = sv[v].rows;
                m->rb[v] = m->whole[v];
        }
        m->n_vars = (uint32_t)nv;
        if (spec->graph)
                return model_graph_plan(m, spec);
        uint64_t c = spec->input[0], h = spec->input[1], w = spec->input[2];
        if (spec->n_embeddings)  /* the dense features and the pooled rows, flat (model_spec.h) */
                c = 1, h = 1, w = model_spec_dense_input(spec);
        m->in_n = (uint32_t)(c * h * w);
        m->head = spec->head;
        m->n_layers = spec->n_layers;
        m->first_param_layer = -1;
        /* Which kind of layer produced the buffer the next layer reads (through aliases). */
        enum { SRC_INPUT, SRC_REUSABLE, SRC_KEEP } src = SRC_INPUT;
        uint32_t next_var = 0;
        for (uint32_t i = 0; i < spec->n_layers; i++) {
                struct layer *L = &m->layers[i];
                const struct layer_spec *ls = &spec->layers[i];
                L->spec = *ls;
                L->c = (uint32_t)c, L->h = (uint32_t)h, L->w = (uint32_t)w;
                L->in_n = (uint32_t)(c * h * w);
                L->first_var = next_var;
                while (next_var < m->n_vars && m->vars[next_var].layer == i)
                        next_var++;
                L->n_vars = next_var - L->first_var;
                switch (ls->type) {
                case LAYER_DENSE:
                        c = 1, h = 1, w = ls->units;
                        src = SRC_REUSABLE;
                        break;
                case LAYER_CONV2D:
                        c = ls->filters;
                        src = SRC_REUSABLE;
                        break;
                case LAYER_MAXPOOL2D:
                        h /= ls->pool, w /= ls->pool;
                        src = SRC_REUSABLE;
                        break;
                case LAYER_FLATTEN:
                        w = c * h * w, c = 1, h = 1;
                        L->alias_input = true;
                        break;
                default:   /* activations: model_spec_vars refused any other type */
                        L->alias_input = src == SRC_REUSABLE;
                        src = SRC_KEEP;
                        break;
                }
                if (L->n_vars && m->first_param_layer < 0)
                        m->first_param_layer = (int)i;
                L->oc = (uint32_t)c, L->oh = (uint32_t)h, L->ow = (uint32_t)w;
                L->out_n = (uint32_t)(c * h * w);
        }
        m->classes = m->layers[m->n_layers - 1].out_n;
        return engine == MODEL_ENGINE_AUTO && m->host ? model_graph_plan_layers(m, spec) : 0;
}

/* The parameter and gradient blocks cross the bus every step: page-locked, where the backend can,
 * they move at its full speed. Without it (a backend that cannot, or the driver refused) the copies
 * are only slower. */
static void host_blocks_pin(struct model *m)
{
        size_t bytes = sizeof(float) * m->n_params;
        m->pinned[0] = backend_host_pin(m->be, m->params_host, bytes);
        m->pinned[1] = backend_host_pin(m->be, m->grads_host, bytes);
}

static void host_blocks_unpin(struct model *m)
{
        if (m->pinned[0])
                backend_host_unpin(m->be, m->params_host);
        if (m->pinned[1])
                backend_host_unpin(m->be, m->grads_host);
        m->pinned[0] = m->pinned[1] = false;
}

int model_new(const struct model_spec *spec, struct backend *be, uint32_t max_batch, struct model **ret)
{
        return model_new_engine(spec, be, max_batch, MODEL_ENGINE_AUTO, ret);
}

int model_new_engine(const struct model_spec *spec, struct backend *be, uint32_t max_batch, enum model_engine engine,
                     struct model **ret)
{
        if (!spec || !be || max_batch == 0 || engine > MODEL_ENGINE_LAYERS)
                return -EINVAL;
        struct model *m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->be = be;
        m->host = backend_host_memory(be);
        m->max_batch = max_batch;
        int r = plan(m, spec, engine);
        if (r < 0)
                goto fail;
        const struct backend_ops *op = be->ops;
        if ((m->head == HEAD_LOGISTIC && (!op->logistic_xent_fwd || !op->logistic_xent_bwd)) ||
            (m->head == HEAD_MSE && (!op->mse_fwd || !op->mse_bwd))) {
                r = -EOPNOTSUPP;
                goto fail;
        }

        r = -ENOMEM;
        /* the gradient buffers hold the head's gradient and the input's too */
        size_t max_n = m->in_n > m->classes ? m->in_n : m->classes, col_floats = 0;
        for (uint32_t i = 0; !m->gx && i < m->n_layers; i++) { /* the graph has buffers of its own */
                struct layer *L = &m->layers[i];
                max_n = L->out_n > max_n ? L->out_n : max_n;
                if (L->spec.type == LAYER_CONV2D) {
                        size_t cf = backend_conv2d_col_floats(L->c, L->h, L->w, L->spec.kernel);
                        col_floats = cf > col_floats ? cf : col_floats;
                }
                if (!L->alias_input) {
                        L->buf = backend_alloc(be, sizeof(float) * max_batch * L->out_n);
                        if (!L->buf)
                                goto fail;
                }
        }
        m->params = backend_alloc(be, sizeof(float) * (m->n_params ? m->n_params : 1));
        m->grads = backend_alloc(be, sizeof(float) * (m->n_params ? m->n_params : 1));
        m->labels = backend_alloc(be, max_batch);
        m->yf = backend_alloc(be, sizeof(float) * max_batch);
        m->lab_host = malloc(sizeof(float) * max_batch);
        m->probs = backend_alloc(be, sizeof(float) * max_batch * m->classes);
        m->gbuf[0] = backend_alloc(be, sizeof(float) * max_batch * max_n);
        m->gbuf[1] = backend_alloc(be, sizeof(float) * max_batch * max_n);
        if (!m->params || !m->grads || !m->labels || !m->yf || !m->lab_host || !m->probs ||
            !m->gbuf[0] || !m->gbuf[1])
                goto fail;
        if (col_floats && !(m->col = backend_alloc(be, sizeof(float) * col_floats)))
                goto fail;
        if (m->host) {
                m->params_host = m->params;
                m->grads_host = m->grads;
        } else {
                m->params_host = calloc(m->n_params ? m->n_params : 1, sizeof(float));
                m->grads_host = calloc(m->n_params ? m->n_params : 1, sizeof(float));
                /* a graph model feeds the graph's inputs itself (graph_set_input_rows) */
                m->x_dev = m->gx ? NULL : backend_alloc(be, sizeof(float) * max_batch * m->in_n);
                m->out_host = malloc(sizeof(float) * max_batch * m->classes);
                if (!m->params_host || !m->grads_host || (!m->gx && !m->x_dev) || !m->out_host)
                        goto fail;
                host_blocks_pin(m);
        }
        /* the graph computes in the model's blocks (on a device, the device's) */
        if (m->gx && (r = graph_exec_use_blocks(m->gx, m->params, m->grads)) < 0)
                goto fail;
        *ret = m;
        return 0;
fail:
        model_free(m);
        return r;
}

struct model *model_free(struct model *m)
{
        if (!m)
                return NULL;
        struct backend *be = m->be;
        model_graph_free(m);
        host_blocks_unpin(m);
        for (uint32_t i = 0; i < m->n_layers; i++)
                backend_buf_free(be, m->layers[i].buf);
        if (!m->host && !m->ext_host) {
                free(m->params_host);
                free(m->grads_host);
        }
        if (!m->host || !m->ext_host) {
                backend_buf_free(be, m->params);
                backend_buf_free(be, m->grads);
        }
        backend_buf_free(be, m->x_dev);
        backend_buf_free(be, m->labels);
        backend_buf_free(be, m->yf);
        free(m->lab_host);
        free(m->out_host);
        free(m->dx_host);
        backend_buf_free(be, m->probs);
        backend_buf_free(be, m->gbuf[0]);
        backend_buf_free(be, m->gbuf[1]);
        backend_buf_free(be, m->col);
        for (uint32_t v = 0; v < m->n_vars; v++)
                free(m->blk[v]);
        free(m);
        return NULL;
}

int model_use_host_blocks(struct model *m, float *params, float *grads)
{
        size_t bytes = sizeof(float) * m->n_params;
        if (!params || !grads || m->ext_host || (uintptr_t)params % 64 || (uintptr_t)grads % 64 ||
            (params < grads ? (char *)params + bytes > (char *)grads : (char *)grads + bytes > (char *)params))
                return -EINVAL;
        memcpy(params, m->params_host, bytes);
        memcpy(grads, m->grads_host, bytes);
        if (m->host) {
                int r = m->gx ? graph_exec_use_blocks(m->gx, params, grads) : 0;
                if (r < 0)
                        return r;
                backend_buf_free(m->be, m->params);
                backend_buf_free(m->be, m->grads);
                m->params = params;
                m->grads = grads;
        } else {
                host_blocks_unpin(m);
                free(m->params_host);
                free(m->grads_host);
        }
        m->params_host = params;
        m->grads_host = grads;
        m->ext_host = true;
        if (!m->host)
                host_blocks_pin(m);
        return 0;
}

int model_set_var_blocks(struct model *m, uint32_t var, uint32_t n_blocks, const uint32_t *row_begin)
{
        if (var >= m->n_vars || n_blocks == 0)
                return -EINVAL;
        const struct model_var *v = &m->vars[var];
        if (!m->gx || m->own_g) { /* a dense layer's kernel */
                const struct layer *L = &m->layers[v->layer];
                if (L->spec.type != LAYER_DENSE || var != L->first_var)
                        return -EOPNOTSUPP;
        }
        if (n_blocks > v->rows || (n_blocks > 1 && !row_begin))
                return -EINVAL;
        if (row_begin) {
                if (row_begin[0] != 0)
                        return -EINVAL;
                for (uint32_t b = 1; b < n_blocks; b++)
                        if (row_begin[b] <= row_begin[b - 1] || row_begin[b] >= v->rows)
                                return -EINVAL;
        }
        int r;
        if (m->gx && (r = model_graph_set_blocks(m, var, n_blocks, row_begin)) < 0)
                return r; /* a Gemm's B on the host (graph_exec_set_blocks), or -EOPNOTSUPP */
        uint32_t *a = NULL;
        if (n_blocks > 1) {
                if (!(a = malloc(sizeof(uint32_t) * (n_blocks + 1))))
                        return -ENOMEM;
                memcpy(a, row_begin, sizeof(uint32_t) * n_blocks);
                a[n_blocks] = v->rows;
        }
        free(m->blk[var]);
        m->blk[var] = a;
        m->rb[var] = a ? a : m->whole[var];
        m->n_blocks[var] = n_blocks;
        return 0;
}

uint32_t model_var_blocks(const struct model *m, uint32_t var, const uint32_t **row_begin_ret)
{
        assert(var < m->n_vars);
        if (row_begin_ret)
                *row_begin_ret = m->rb[var];
        return m->n_blocks[var];
}

/* The layer after `i` that isn't a flatten, or NULL. */
static const struct layer *next_real_layer(const struct model *m, uint32_t i)
{
        for (uint32_t j = i + 1; j < m->n_layers; j++)
                if (m->layers[j].spec.type != LAYER_FLATTEN)
                        return &m->layers[j];
        return NULL;
}

int model_init_params(struct model *m, uint64_t seed)
{
        float *p = m->params_host;
        if (m->gx && !m->own_g) { /* the graph's initializers' values */
                model_graph_init_params(m, seed);
                return model_params_sync(m);
        }
        for (uint32_t v = 0; v < m->n_vars; v++) {
                const struct model_var *var = &m->vars[v];
                const struct layer *L = &m->layers[var->layer];
                float *w = p + var->offset;
                size_t n = (size_t)var->rows * var->cols;
                if (v != L->first_var) { /* bias */
                        memset(w, 0, sizeof(float) * n);
                        continue;
                }
                double fan_in, fan_out;
                if (L->spec.type == LAYER_DENSE) {
                        fan_in = var->rows;
                        fan_out = var->cols;
                } else { /* conv2d: (F, C*k*k) */
                        double kk = (double)L->spec.kernel * L->spec.kernel;
                        fan_in = var->cols;
                        fan_out = var->rows * kk;
                }
                enum init_kind kind = L->spec.init;
                if (kind == INIT_DEFAULT) {
                        const struct layer *nx = next_real_layer(m, var->layer);
                        kind = nx && nx->spec.type == LAYER_RELU ? INIT_HE_NORMAL : INIT_GLOROT_UNIFORM;
                }
                struct rng r;
                rng_init(&r, seed, v);
                switch (kind) {
                case INIT_ZEROS:
                        memset(w, 0, sizeof(float) * n);
                        break;
                case INIT_HE_NORMAL: {
                        /* TF's truncated normal at 2 sigma, stddev corrected for the truncation */
                        double sd = sqrt(2.0 / fan_in) / 0.87962566103423978;
                        for (size_t i = 0; i < n; i++) {
                                double z;
                                do
                                        z = rng_normal(&r);
                                while (fabs(z) > 2.0);
                                w[i] = (float)(z * sd);
                        }
                        break;
                }
                case INIT_GLOROT_UNIFORM:
                default: {
                        float lim = (float)sqrt(6.0 / (fan_in + fan_out));
                        for (size_t i = 0; i < n; i++)
                                w[i] = rng_uniform_f(&r, -lim, lim);
                        break;
                }
                }
        }
        return model_params_sync(m);
}

static const char *const layer_type_names[] = {
        [LAYER_DENSE] = "dense",   [LAYER_RELU] = "relu",           [LAYER_TANH] = "tanh",
        [LAYER_SIGMOID] = "sigmoid", [LAYER_CONV2D] = "conv2d", [LAYER_MAXPOOL2D] = "maxpool2d",
        [LAYER_FLATTEN] = "flatten",
};

void model_describe(const struct model *m, FILE *f)
{
        if (m->gx && !m->own_g)
                model_graph_describe(m, f);
        else
                fprintf(f, "input (%u, %u, %u)\n", m->layers[0].c, m->layers[0].h, m->layers[0].w);
        for (uint32_t i = 0; i < m->n_layers; i++) {
                const struct layer *L = &m->layers[i];
                size_t np = 0;
                fprintf(f, "%2u %-9s -> (%u, %u, %u)", i, layer_type_names[L->spec.type], L->oc, L->oh, L->ow);
                for (uint32_t v = L->first_var; v < L->first_var + L->n_vars; v++) {
                        const struct model_var *var = &m->vars[v];
                        fprintf(f, "%s %s (%u, %u)", v == L->first_var ? "" : ",", var->name, var->rows,
                                var->cols);
                        np += (size_t)var->rows * var->cols;
                }
                if (L->n_vars)
                        fprintf(f, "  %zu params", np);
                fputc('\n', f);
        }
        static const char *const heads[] = {[HEAD_SOFTMAX] = "softmax cross-entropy over %u classes",
                                            [HEAD_LOGISTIC] = "sigmoid cross-entropy over %u output",
                                            [HEAD_MSE] = "mean squared error over %u output"};
        fprintf(f, heads[m->head], m->classes);
        fprintf(f, "; %zu parameters (%zu bytes)\n", m->n_params, m->n_params * sizeof(float));
}
