/* A graph model (model.onnx): the model's interface (model.h) over the graph engine (graph.h). The
 * model's flat input is cut into the graph's feeds (model_spec.h: the data's input, then each table's
 * rows); the graph's output is what the head reads; the head's gradient flows back through the graph
 * into the parameter block and, for the tables' feeds, into the input gradient the sparse front turns
 * into row gradients.
 *
 * The hooks: a variable is one block (no row blocking) and one "layer" of its own. On a host-memory
 * backend the graph computes in the model's blocks themselves, and each variable's "before" hook runs
 * right before the first node that reads it, its "after" hook as soon as its gradient is final (a
 * running statistic's once graph_moving_deltas has written it): a worker's pulls and pushes overlap the
 * graph's compute, as the layer list's per layer. On a device (the CUDA backend's graph kernels) the
 * graph computes in the model's device blocks, as the layer list does there: every "before" hook runs
 * first and the parameter block is uploaded, the gradient block is downloaded before every "after" hook,
 * last variable first. A backend without graph kernels gives -EOPNOTSUPP. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "graph_spec.h"
#include "model-internal.h"
#include "rng.h"

/* The variables' tensors and the exec, for m->g and m->feeds. */
static int bind_graph(struct model *m)
{
        const struct graph *g = m->g;
        uint64_t total = 0;
        for (uint32_t i = 0; i < m->n_feeds; i++)
                total += m->feeds[i].count;
        if (total != m->in_n || m->classes == 0)
                return -EINVAL;
        if (!(m->tensor_var = malloc(sizeof(int32_t) * (g->n_tensors ? g->n_tensors : 1))))
                return -ENOMEM;
        for (uint32_t t = 0, v = 0; t < g->n_tensors; t++)
                m->tensor_var[t] = g->tensors[t].kind == GT_PARAM && v < m->n_vars ? (int32_t)v++ : -1;
        char err[256];
        return graph_exec_new_on(g, m->max_batch, m->be, &m->gx, err, sizeof(err));
}

int model_graph_plan(struct model *m, const struct model_spec *spec)
{
        const struct graph *g = spec->graph;
        if (!g->final || g->loss < 0 || spec->n_feeds > MODEL_MAX_FEEDS)
                return -EINVAL;
        m->g = g;
        m->head = spec->head;
        m->n_layers = 0;
        m->first_param_layer = m->n_vars ? 0 : -1;
        m->in_n = model_spec_dense_input(spec);
        m->classes = (uint32_t)graph_shape_count(&g->tensors[g->loss].shape, 1);
        m->n_feeds = spec->n_feeds;
        memcpy(m->feeds, spec->feeds, sizeof(m->feeds[0]) * spec->n_feeds);
        m->seed = spec->seed;
        m->init = spec->init;
        return bind_graph(m);
}

int model_graph_plan_layers(struct model *m, const struct model_spec *spec)
{
        char err[256];
        int r = graph_from_spec(spec, &m->own_g, err, sizeof(err));
        if (r < 0)
                return r == -ENOMEM ? r : -EINVAL;
        const struct graph *g = m->g = m->own_g;
        if (g->n_params != m->n_params ||
            graph_shape_count(&g->tensors[g->loss].shape, 1) != m->classes)
                return -EINVAL; /* not the list plan() laid out */
        m->n_feeds = 1;
        /* one feed, the whole flat input (with tables, the pooled rows too: graph_spec.h) */
        m->feeds[0] = (struct model_feed){ .kind = FEED_DATA, .tensor = graph_find(g, "input"), .count = m->in_n };
        m->seed = spec->seed;
        return bind_graph(m);
}

int model_graph_want_input_grad(struct model *m)
{
        struct graph_tensor *in = &m->own_g->tensors[m->feeds[0].tensor];
        if (in->want_grad)
                return 0;
        in->want_grad = true;
        char err[256];
        struct graph_exec *x = NULL;
        int r = graph_exec_new_on(m->g, m->max_batch, m->be, &x, err, sizeof(err));
        if (r == 0) { /* use_blocks keeps the exec's values: the model's are the ones to keep (host memory) */
                memcpy(graph_exec_params(x), m->params, sizeof(float) * m->n_params);
                r = graph_exec_use_blocks(x, m->params, m->grads);
        }
        for (uint32_t t = 0; r == 0 && t < m->g->n_tensors; t++) {
                int32_t v = m->tensor_var[t];
                if (v >= 0 && m->n_blocks[v] > 1)
                        r = graph_exec_set_blocks(x, (int32_t)t, m->n_blocks[v], m->rb[v]);
        }
        if (r < 0) { /* as it was */
                in->want_grad = false;
                graph_exec_free(x);
                return r;
        }
        graph_exec_free(m->gx);
        m->gx = x;
        return 0;
}

void model_graph_free(struct model *m)
{
        m->gx = graph_exec_free(m->gx);
        free(m->tensor_var);
        m->tensor_var = NULL;
        graph_free(m->own_g);
        m->own_g = NULL;
}

int model_graph_set_blocks(struct model *m, uint32_t var, uint32_t n_blocks, const uint32_t *row_begin)
{
        if (!m->host)
                return n_blocks == 1 ? 0 : -EOPNOTSUPP;
        for (uint32_t t = 0; t < m->g->n_tensors; t++)
                if (m->tensor_var[t] == (int32_t)var) {
                        int r = graph_exec_set_blocks(m->gx, (int32_t)t, n_blocks, n_blocks > 1 ? row_begin : NULL);
                        return r == -EOPNOTSUPP && n_blocks == 1 ? 0 : r; /* whole it is */
                }
        return n_blocks == 1 ? 0 : -EOPNOTSUPP;
}

/* A variable's hooks, from the graph's call for its tensor and block: the block hook for each block, the
 * layer hook once a variable (forward: with its first block; backward: with its last). */
struct var_hooks {
        const struct model *m;
        const struct hooks *h;
        bool backward;
};

static int var_hook(void *ud, int32_t t, uint32_t block)
{
        const struct var_hooks *vh = ud;
        int32_t v = vh->m->tensor_var[t];
        if (v < 0)
                return 0;
        int r = 0;
        if (vh->h->block)
                r = vh->h->block(vh->h->ud, (uint32_t)v, block);
        if (r == 0 && vh->h->layer && block == (vh->backward ? vh->m->n_blocks[v] - 1 : 0))
                r = vh->h->layer(vh->h->ud, (uint32_t)v, 1);
        return r;
}

void model_graph_init_params(struct model *m, uint64_t seed)
{
        const struct graph *g = m->g;
        uint32_t v = 0;
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                const struct graph_tensor *t = &g->tensors[i];
                if (t->kind != GT_PARAM)
                        continue;
                size_t n = graph_shape_count(&t->shape, 1);
                float *w = m->params_host + t->param_offset;
                if (m->init != GRAPH_INIT_GLOROT || t->shape.rank < 2 || t->moving) {
                        memcpy(w, t->data, sizeof(float) * n);
                        v++;
                        continue;
                }
                /* (a, b, k...): fans a * k and b * k, whichever way round the layer holds them */
                double k = (double)n / ((double)t->shape.dims[0] * (double)t->shape.dims[1]);
                float lim = (float)sqrt(6.0 / (((double)t->shape.dims[0] + (double)t->shape.dims[1]) * k));
                struct rng r;
                rng_init(&r, seed, v++);
                for (size_t j = 0; j < n; j++)
                        w[j] = rng_uniform_f(&r, -lim, lim);
        }
}

void model_set_training(struct model *m, bool training)
{
        m->eval = !training;
}

void model_set_seed(struct model *m, uint64_t seed)
{
        m->seed = seed;
        m->n_fwd = 0;
}

/* splitmix64's finalizer: the step's Dropout seed from the model's seed and the forward's count. */
static uint64_t mix(uint64_t z)
{
        z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
        return z ^ (z >> 31);
}

int model_graph_forward(struct model *m, const float *x, uint32_t B, const struct hooks *h, float **out)
{
        int r;
        if (!m->host) {
                if (h->layer && (r = h->layer(h->ud, 0, m->n_vars)) != 0)
                        return r;
                for (uint32_t v = 0; h->block && v < m->n_vars; v++)
                        if ((r = h->block(h->ud, v, 0)) != 0)
                                return r;
                if ((r = backend_upload(m->be, m->params, m->params_host, sizeof(float) * m->n_params)) < 0)
                        return r;
        }
        size_t at = 0;
        for (uint32_t i = 0; i < m->n_feeds; i++) {
                if ((r = graph_set_input_rows(m->gx, m->feeds[i].tensor, x + at, m->in_n, B)) < 0)
                        return r;
                at += m->feeds[i].count;
        }
        uint64_t seed = mix(m->seed ^ mix(++m->n_fwd));
        struct var_hooks vh = { m, h, false };
        bool hooked = m->host && (h->layer || h->block);
        if ((r = graph_forward_hooked(m->gx, !m->eval, seed, hooked ? var_hook : NULL, &vh)) != 0)
                return r;
        *out = (float *)graph_value(m->gx, m->g->loss, NULL);
        return 0;
}

int model_graph_backward(struct model *m, const float *dy, const struct hooks *h)
{
        int r;
        struct var_hooks vh = { m, h, true };
        bool hooked = m->host && (h->layer || h->block);
        if ((r = graph_backward_hooked(m->gx, m->g->loss, dy, hooked ? var_hook : NULL, &vh)) != 0)
                return r;
        /* the running statistics' updates, where the gradients go, then their hooks */
        if ((r = graph_moving_deltas(m->gx)) < 0)
                return r;
        for (uint32_t t = 0; hooked && t < m->g->n_tensors; t++)
                if (m->g->tensors[t].kind == GT_PARAM && m->g->tensors[t].moving && (r = var_hook(&vh, (int32_t)t, 0)) != 0)
                        return r;
        if (!m->host && (r = backend_download(m->be, m->grads_host, m->grads, sizeof(float) * m->n_params)) < 0)
                return r;
        if (m->want_dx) {
                /* (B, in_n): each feed's gradient in its columns; the data's own input gets none (zeros).
                 * A device's are assembled in the host copy model_input_grad returns. */
                float *dx = m->host ? m->gbuf[1] : m->dx_host;
                size_t at = 0;
                for (uint32_t i = 0; i < m->n_feeds; i++) {
                        const struct model_feed *f = &m->feeds[i];
                        const float *gi = m->host ? graph_grad(m->gx, f->tensor) : graph_grad_host(m->gx, f->tensor);
                        if (!m->host && !gi && graph_grad(m->gx, f->tensor))
                                return -EIO; /* the download failed */
                        for (uint32_t b = 0; b < m->B; b++) {
                                float *row = dx + (size_t)b * m->in_n + at;
                                if (gi)
                                        memcpy(row, gi + (size_t)b * f->count, sizeof(float) * f->count);
                                else
                                        memset(row, 0, sizeof(float) * f->count);
                        }
                        at += f->count;
                }
                m->dx = m->gbuf[1];
        }
        if (hooked)
                return 0;
        for (uint32_t v = m->n_vars; h->block && v-- > 0;)
                if ((r = h->block(h->ud, v, 0)) != 0)
                        return r;
        if (h->layer && m->n_vars && (r = h->layer(h->ud, 0, m->n_vars)) != 0)
                return r;
        return 0;
}

void model_graph_describe(const struct model *m, FILE *f)
{
        const struct graph *g = m->g;
        uint32_t count[GOP__COUNT] = { 0 };
        for (uint32_t i = 0; i < g->n_nodes; i++)
                count[g->nodes[i].op]++;
        fprintf(f, "graph of %u nodes:", g->n_nodes);
        for (int op = 0; op < GOP__COUNT; op++)
                if (count[op])
                        fprintf(f, " %s x%u", graph_op_name((enum graph_op)op), count[op]);
        fputc('\n', f);
        for (uint32_t i = 0; i < m->n_feeds; i++)
                fprintf(f, "input %-24s %u per example (%s)\n", g->tensors[m->feeds[i].tensor].name, m->feeds[i].count,
                        m->feeds[i].kind == FEED_DATA ? "the data" : "a table's rows");
        for (uint32_t v = 0; v < m->n_vars; v++)
                fprintf(f, "%-32s (%u, %u)\n", m->vars[v].name, m->vars[v].rows, m->vars[v].cols);
        fprintf(f, "output %s\n", g->tensors[g->loss].name);
}
