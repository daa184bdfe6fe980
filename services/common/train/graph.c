/* The graph engine's core (graph.h): building a graph, ordering and checking it, and running it forward
 * and backward. The ops themselves are in graph_ops.c's table and the graph_k_*.c kernels. */
#include "graph-internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building ---- */

void graph_attrs_default(struct graph_attrs *a)
{
        *a = (struct graph_attrs){
                .axis = 1, /* Flatten's default; the loader sets each op's own (Softmax -1, Concat required) */
                .alpha = 1.0f,
                .beta = 1.0f,
                .epsilon = 1e-5f,
                .momentum = 0.9f,
                .ratio = 0.5f,
                .group = 1,
        };
}

struct graph *graph_new(void)
{
        struct graph *g = calloc(1, sizeof(*g));
        if (g)
                g->loss = -1;
        return g;
}

struct graph *graph_free(struct graph *g)
{
        if (!g)
                return NULL;
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                free(g->tensors[i].name);
                free(g->tensors[i].data);
        }
        for (uint32_t i = 0; i < g->n_nodes; i++)
                free(g->nodes[i].name);
        free(g->tensors);
        free(g->nodes);
        free(g);
        return NULL;
}

size_t graph_count(const struct graph_shape *s)
{
        size_t n = 1;
        for (uint32_t i = 0; i < s->rank; i++)
                n *= (size_t)(s->dims[i] > 0 ? s->dims[i] : 1);
        return n;
}

size_t graph_shape_count(const struct graph_shape *s, uint32_t B)
{
        size_t n = 1;
        for (uint32_t i = 0; i < s->rank; i++)
                n *= s->dims[i] == GRAPH_BATCH ? (size_t)B : (size_t)s->dims[i];
        return n;
}

static size_t dtype_size(enum graph_dtype t)
{
        return t == GDT_I64 ? sizeof(int64_t) : sizeof(float);
}

int graph_find(const struct graph *g, const char *name)
{
        for (uint32_t i = 0; i < g->n_tensors; i++)
                if (strcmp(g->tensors[i].name, name) == 0)
                        return (int)i;
        return -ENOENT;
}

static int grow(void **arr, uint32_t *cap, uint32_t n, size_t size)
{
        if (n < *cap)
                return 0;
        uint32_t nc = *cap ? *cap * 2 : 16;
        void *p = realloc(*arr, size * nc);
        if (!p)
                return -ENOMEM;
        *arr = p;
        *cap = nc;
        return 0;
}

static bool shape_ok(const struct graph_shape *s)
{
        if (s->rank > GRAPH_MAX_RANK)
                return false;
        for (uint32_t i = 0; i < s->rank; i++)
                if (s->dims[i] < 1 && !(s->dims[i] == GRAPH_BATCH && i == 0))
                        return false;
        return true;
}

int graph_add_tensor(struct graph *g, const char *name, enum graph_tensor_kind kind, enum graph_dtype dtype,
                     const struct graph_shape *shape, const void *data)
{
        if (g->final || !name || !shape_ok(shape) ||
            ((kind == GT_PARAM || kind == GT_CONST) && shape->rank && shape->dims[0] == GRAPH_BATCH) ||
            (kind == GT_PARAM && dtype != GDT_F32))
                return -EINVAL;
        if (graph_find(g, name) >= 0)
                return -EEXIST;
        if (grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors, sizeof(*g->tensors)) < 0)
                return -ENOMEM;
        struct graph_tensor t = { .kind = kind, .dtype = dtype, .shape = *shape, .producer = -1 };
        if (!(t.name = strdup(name)))
                return -ENOMEM;
        if (kind == GT_PARAM || kind == GT_CONST) {
                size_t bytes = graph_count(shape) * dtype_size(dtype);
                if (!(t.data = calloc(1, bytes ? bytes : 1))) {
                        free(t.name);
                        return -ENOMEM;
                }
                if (data)
                        memcpy(t.data, data, bytes);
        }
        g->tensors[g->n_tensors] = t;
        return (int)g->n_tensors++;
}

int graph_add_node(struct graph *g, enum graph_op op, const char *name, const int32_t *in, uint32_t n_in,
                   const char *const *out_names, uint32_t n_out, const struct graph_attrs *a)
{
        if (g->final || (unsigned)op >= GOP__COUNT || n_in > GRAPH_MAX_IN || n_out == 0 || n_out > GRAPH_MAX_OUT)
                return -EINVAL;
        for (uint32_t i = 0; i < n_in; i++)
                if (in[i] < -1 || in[i] >= (int32_t)g->n_tensors)
                        return -EINVAL;
        for (uint32_t i = 0; i < n_out; i++)
                if (!out_names[i] || graph_find(g, out_names[i]) >= 0)
                        return out_names[i] ? -EEXIST : -EINVAL;
        if (grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes, sizeof(*g->nodes)) < 0)
                return -ENOMEM;
        struct graph_node n = { .op = op, .n_in = n_in, .n_out = n_out };
        if (a)
                n.a = *a;
        else
                graph_attrs_default(&n.a);
        if (!(n.name = strdup(name ? name : "")))
                return -ENOMEM;
        memcpy(n.in, in, sizeof(int32_t) * n_in);
        for (uint32_t i = 0; i < n_out; i++) {
                struct graph_shape none = { 0 };
                int t = graph_add_tensor(g, out_names[i], GT_VALUE, GDT_F32, &none, NULL);
                if (t < 0) {
                        free(n.name);
                        return t; /* the outputs added before stay, unproduced: graph_finalize refuses them */
                }
                g->tensors[t].producer = (int)g->n_nodes;
                n.out[i] = t;
        }
        g->nodes[g->n_nodes] = n;
        return (int)g->n_nodes++;
}

/* ---- shape helpers for the ops ---- */

const struct graph_shape *graph_in_shape(const struct graph *g, const struct graph_node *n, uint32_t i)
{
        return i < n->n_in && n->in[i] >= 0 ? &g->tensors[n->in[i]].shape : NULL;
}

int graph_axis(int64_t axis, uint32_t rank, uint32_t *ret)
{
        if (axis < -(int64_t)rank || axis >= (int64_t)rank)
                return -EINVAL;
        *ret = (uint32_t)(axis < 0 ? axis + rank : axis);
        return 0;
}

int graph_broadcast(const struct graph_shape *a, const struct graph_shape *b, struct graph_shape *out, char *err,
                    size_t errlen)
{
        struct graph_shape o = { .rank = a->rank > b->rank ? a->rank : b->rank };
        for (uint32_t i = 0; i < o.rank; i++) {
                /* aligned from the right */
                int64_t da = i < o.rank - a->rank ? 1 : a->dims[i - (o.rank - a->rank)];
                int64_t db = i < o.rank - b->rank ? 1 : b->dims[i - (o.rank - b->rank)];
                if (da == db || db == 1)
                        o.dims[i] = da;
                else if (da == 1)
                        o.dims[i] = db;
                else {
                        snprintf(err, errlen, "shapes do not broadcast: dim %u is %lld and %lld", i, (long long)da,
                                 (long long)db);
                        return -EINVAL;
                }
        }
        *out = o;
        return 0;
}

/* ---- finalize: order, shapes, parameters ---- */

static int node_error(char *err, size_t errlen, const struct graph *g, uint32_t ni, const char *fmt, ...)
{
        const struct graph_node *n = &g->nodes[ni];
        char why[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        if (n->name[0])
                snprintf(err, errlen, "node \"%.100s\" (%s): %s", n->name, graph_op_name(n->op), why);
        else
                snprintf(err, errlen, "node %u (%s): %s", ni, graph_op_name(n->op), why);
        return -EINVAL;
}

/* Kahn's algorithm over the producers; nodes keep their relative order where they are free to. */
static int toposort(struct graph *g, char *err, size_t errlen)
{
        uint32_t n = g->n_nodes;
        uint32_t *order = malloc(sizeof(uint32_t) * (n ? n : 1));
        bool *done = calloc(n ? n : 1, sizeof(bool));
        int r = 0;
        if (!order || !done) {
                r = -ENOMEM;
                goto out;
        }
        uint32_t k = 0;
        /* a node is ready when every input's producer has been placed; sweep until nothing moves */
        for (bool moved = true; moved && k < n;) {
                moved = false;
                for (uint32_t i = 0; i < n; i++) {
                        if (done[i])
                                continue;
                        bool ready = true;
                        for (uint32_t j = 0; j < g->nodes[i].n_in && ready; j++) {
                                int32_t t = g->nodes[i].in[j];
                                ready = t < 0 || g->tensors[t].producer < 0 || done[g->tensors[t].producer];
                        }
                        if (ready) {
                                done[i] = true;
                                order[k++] = i;
                                moved = true;
                        }
                }
        }
        if (k < n) {
                for (uint32_t i = 0; i < n; i++)
                        if (!done[i]) {
                                r = node_error(err, errlen, g, i, "on a cycle (its inputs depend on its outputs)");
                                goto out;
                        }
        }
        /* renumber: nodes in order, producers follow */
        struct graph_node *sorted = malloc(sizeof(*sorted) * (n ? n : 1));
        if (!sorted) {
                r = -ENOMEM;
                goto out;
        }
        for (uint32_t i = 0; i < n; i++) {
                sorted[i] = g->nodes[order[i]];
                for (uint32_t j = 0; j < sorted[i].n_out; j++)
                        g->tensors[sorted[i].out[j]].producer = (int)i;
        }
        free(g->nodes);
        g->nodes = sorted;
        g->cap_nodes = n;
out:
        free(order);
        free(done);
        return r;
}

/* Products of dims past this many values an example are refused: no op's index arithmetic overflows
 * below it, whatever the shapes a file or a caller asks for. */
#define NODE_MAX_VALUES ((int64_t)1 << 40)

int graph_infer_node(struct graph *g, uint32_t i, char *why, size_t whylen)
{
        struct graph_node *n = &g->nodes[i];
        const struct graph_op_info *op = &graph_ops[n->op];
        if (n->n_in < op->min_in || n->n_in > op->max_in) {
                snprintf(why, whylen, "%u inputs; it takes %u to %u", n->n_in, op->min_in, op->max_in);
                return -EINVAL;
        }
        if (n->n_out < op->min_out || n->n_out > op->max_out) {
                snprintf(why, whylen, "%u outputs; it gives %u to %u", n->n_out, op->min_out, op->max_out);
                return -EINVAL;
        }
        for (uint32_t j = 0; j < n->n_in; j++) {
                if (n->in[j] < 0) {
                        if (j < op->min_in) {
                                snprintf(why, whylen, "input %u is required", j);
                                return -EINVAL;
                        }
                        continue;
                }
                const struct graph_tensor *t = &g->tensors[n->in[j]];
                if (t->dtype == GDT_I64 && !(n->op == GOP_GATHER && j == 1)) {
                        snprintf(why, whylen, "input %u \"%.80s\" is int64; only Gather's indices may be", j, t->name);
                        return -ENOTSUP;
                }
                if (n->op == GOP_GATHER && j == 1 && t->dtype != GDT_I64) {
                        snprintf(why, whylen, "the indices \"%.80s\" are not int64", t->name);
                        return -EINVAL;
                }
        }
        struct graph_shape out[GRAPH_MAX_OUT];
        memset(out, 0, sizeof(out));
        if (op->shape(g, n, out, why, whylen) < 0) {
                if (!why[0])
                        snprintf(why, whylen, "its inputs or attributes are not supported");
                return -EINVAL;
        }
        for (uint32_t j = 0; j < n->n_out; j++) {
                if (!shape_ok(&out[j])) {
                        snprintf(why, whylen, "output %u's shape is not static", j);
                        return -EINVAL;
                }
                int64_t per = 1;
                for (uint32_t d = 0; d < out[j].rank; d++) {
                        int64_t v = out[j].dims[d] == GRAPH_BATCH ? 1 : out[j].dims[d];
                        per = per > NODE_MAX_VALUES / v ? NODE_MAX_VALUES + 1 : per * v;
                }
                if (per > NODE_MAX_VALUES) {
                        snprintf(why, whylen, "output %u would hold more than 2^40 values an example", j);
                        return -ENOTSUP;
                }
                g->tensors[n->out[j]].shape = out[j];
        }
        return 0;
}

int graph_finalize(struct graph *g, char *err, size_t errlen)
{
        if (g->final)
                return 0;
        int r = toposort(g, err, errlen);
        if (r < 0)
                return r;
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                char why[400] = "";
                if ((r = graph_infer_node(g, i, why, sizeof(why))) < 0)
                        return node_error(err, errlen, g, i, "%s", why);
        }
        g->n_params = 0;
        /* moving: a parameter that only BatchNormalization nodes read, and only as inputs 3 and 4 */
        for (uint32_t i = 0; i < g->n_tensors; i++)
                g->tensors[i].moving = false;
        for (uint32_t pass = 0; pass < 2; pass++)
                for (uint32_t i = 0; i < g->n_nodes; i++) {
                        const struct graph_node *n = &g->nodes[i];
                        for (uint32_t j = 0; j < n->n_in; j++) {
                                if (n->in[j] < 0 || g->tensors[n->in[j]].kind != GT_PARAM)
                                        continue;
                                bool stat = n->op == GOP_BATCHNORM && (j == 3 || j == 4);
                                if (pass == 0 && stat)
                                        g->tensors[n->in[j]].moving = true;
                                else if (pass == 1 && !stat)
                                        g->tensors[n->in[j]].moving = false;
                        }
                }
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                struct graph_tensor *t = &g->tensors[i];
                if (t->kind == GT_VALUE && t->producer < 0) {
                        snprintf(err, errlen, "tensor \"%.100s\" is used but nothing computes it", t->name);
                        return -EINVAL;
                }
                if (t->kind == GT_PARAM) {
                        t->param_offset = g->n_params;
                        g->n_params += graph_count(&t->shape);
                }
        }
        g->final = true;
        return 0;
}

int graph_cut_node(const struct graph *g, uint32_t node, struct graph **ret, char *err, size_t errlen)
{
        if (!g->final || node >= g->n_nodes || g->nodes[node].n_out != 1 || g->nodes[node].out[0] == g->loss) {
                snprintf(err, errlen, "node %u cannot be cut out (%s)", node,
                         !g->final || node >= g->n_nodes ? "no such node" : "it makes the graph's output or several");
                return -EINVAL;
        }
        struct graph *c = graph_new();
        int32_t *map = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(int32_t));
        bool *used = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(bool));
        int r = -ENOMEM;
        if (!c || !map || !used)
                goto fail;
        for (uint32_t i = 0; i < g->n_nodes; i++)
                for (uint32_t j = 0; i != node && j < g->nodes[i].n_in; j++)
                        if (g->nodes[i].in[j] >= 0)
                                used[g->nodes[i].in[j]] = true;
        if (g->loss >= 0)
                used[g->loss] = true;
        int32_t cut = g->nodes[node].out[0];
        /* the tensors that are no node's output, in g's order (so the parameter block keeps its layout) */
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                const struct graph_tensor *t = &g->tensors[i];
                map[i] = -1;
                if ((t->kind == GT_VALUE && (int32_t)i != cut) || !used[i])
                        continue;
                enum graph_tensor_kind k = (int32_t)i == cut ? GT_INPUT : t->kind;
                if ((r = graph_add_tensor(c, t->name, k, t->dtype, &t->shape, t->data)) < 0)
                        goto fail;
                map[i] = r;
        }
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                const struct graph_node *n = &g->nodes[i];
                if (i == node)
                        continue;
                int32_t in[GRAPH_MAX_IN];
                const char *outs[GRAPH_MAX_OUT];
                for (uint32_t j = 0; j < n->n_in; j++)
                        in[j] = n->in[j] >= 0 ? map[n->in[j]] : -1;
                for (uint32_t j = 0; j < n->n_out; j++)
                        outs[j] = g->tensors[n->out[j]].name;
                if ((r = graph_add_node(c, n->op, n->name, in, n->n_in, outs, n->n_out, &n->a)) < 0)
                        goto fail;
                for (uint32_t j = 0; j < n->n_out; j++)
                        map[n->out[j]] = c->nodes[r].out[j];
        }
        c->loss = g->loss >= 0 ? map[g->loss] : -1;
        if ((r = graph_finalize(c, err, errlen)) < 0)
                goto out;
        free(map);
        free(used);
        *ret = c;
        return 0;
fail:
        snprintf(err, errlen, "cutting node %u out: %s", node, strerror(-r));
out:
        free(map);
        free(used);
        graph_free(c);
        return r;
}

/* ---- running ---- */

struct graph_exec {
        const struct graph *g;
        uint32_t max_batch, B;
        float *params, *grads;           /* (n_params) each */
        bool ext_blocks;                 /* params and grads are the caller's (graph_exec_use_blocks) */
        void **val;                      /* (n_tensors) each tensor's buffer */
        float **grad;                    /* (n_tensors) its gradient, or NULL where none flows */
        float **state;                   /* (n_nodes) */
        bool *set;                       /* (n_tensors) its gradient is set whole by its one consumer
                                          * (graph_op_bwd_sets), never zeroed */
        bool *live;                      /* (n_tensors + n_nodes) this backward: the tensors on a path to
                                          * the one differentiated, then the nodes that are */
        float *scratch;
        bool fed;                        /* a batched input was fed since the last forward */
        bool training;                   /* the last forward's mode, which its backward follows */
};

static void **alloc_ptrs(size_t n)
{
        return calloc(n ? n : 1, sizeof(void *));
}

struct graph_exec *graph_exec_free(struct graph_exec *x)
{
        if (!x)
                return NULL;
        const struct graph *g = x->g;
        for (uint32_t i = 0; x->val && i < g->n_tensors; i++)
                if (g->tensors[i].kind == GT_INPUT || g->tensors[i].kind == GT_VALUE)
                        free(x->val[i]);
        for (uint32_t i = 0; x->grad && i < g->n_tensors; i++)
                if (g->tensors[i].kind != GT_PARAM)
                        free(x->grad[i]);
        for (uint32_t i = 0; x->state && i < g->n_nodes; i++)
                free(x->state[i]);
        free(x->val);
        free(x->grad);
        free(x->state);
        free(x->set);
        free(x->live);
        free(x->scratch);
        if (!x->ext_blocks) {
                free(x->params);
                free(x->grads);
        }
        free(x);
        return NULL;
}

int graph_exec_new(const struct graph *g, uint32_t max_batch, struct graph_exec **ret, char *err, size_t errlen)
{
        if (!g->final || max_batch == 0) {
                snprintf(err, errlen, "%s", !g->final ? "the graph is not finalized" : "a batch of 0");
                return -EINVAL;
        }
        struct graph_exec *x = calloc(1, sizeof(*x));
        if (!x)
                return -ENOMEM;
        x->g = g;
        x->max_batch = max_batch;
        x->B = max_batch;
        x->params = calloc(g->n_params ? g->n_params : 1, sizeof(float));
        x->grads = calloc(g->n_params ? g->n_params : 1, sizeof(float));
        x->val = alloc_ptrs(g->n_tensors);
        x->grad = (float **)alloc_ptrs(g->n_tensors);
        x->state = (float **)alloc_ptrs(g->n_nodes);
        x->set = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(bool));
        x->live = calloc((size_t)g->n_tensors + g->n_nodes + 1, sizeof(bool));
        if (!x->params || !x->grads || !x->val || !x->grad || !x->state || !x->set || !x->live)
                goto nomem;
        /* a tensor read once, by a node whose backward can write its gradient whole: no zeroing */
        uint32_t *reads = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(uint32_t));
        if (!reads)
                goto nomem;
        for (uint32_t i = 0; i < g->n_nodes; i++)
                for (uint32_t j = 0; j < g->nodes[i].n_in; j++)
                        if (g->nodes[i].in[j] >= 0)
                                reads[g->nodes[i].in[j]]++;
        for (uint32_t i = 0; i < g->n_nodes; i++)
                for (uint32_t j = 0; j < g->nodes[i].n_in; j++) {
                        int32_t t = g->nodes[i].in[j];
                        if (t >= 0 && t != g->loss && reads[t] == 1 && graph_op_bwd_sets[g->nodes[i].op])
                                x->set[t] = true;
                }
        free(reads);
        /* Which tensors carry a gradient: the parameters, and every float value computed from one. */
        bool *needs = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(bool));
        if (!needs)
                goto nomem;
        for (uint32_t i = 0; i < g->n_tensors; i++)
                needs[i] = g->tensors[i].kind == GT_PARAM ||
                           (g->tensors[i].kind == GT_INPUT && g->tensors[i].want_grad &&
                            g->tensors[i].dtype == GDT_F32);
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                const struct graph_node *n = &g->nodes[i];
                bool any = false;
                for (uint32_t j = 0; j < n->n_in; j++)
                        any |= n->in[j] >= 0 && needs[n->in[j]];
                for (uint32_t j = 0; j < n->n_out; j++)
                        needs[n->out[j]] = any && graph_ops[n->op].bwd;
        }
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                const struct graph_tensor *t = &g->tensors[i];
                size_t count = graph_shape_count(&t->shape, max_batch);
                switch (t->kind) {
                case GT_PARAM:
                        x->val[i] = x->params + t->param_offset;
                        memcpy(x->val[i], t->data, sizeof(float) * count);
                        x->grad[i] = x->grads + t->param_offset;
                        break;
                case GT_CONST:
                        x->val[i] = t->data;
                        break;
                case GT_INPUT:
                case GT_VALUE:
                        if (!(x->val[i] = calloc(count ? count : 1, dtype_size(t->dtype)))) {
                                free(needs);
                                goto nomem;
                        }
                        if (needs[i] && !(x->grad[i] = calloc(count ? count : 1, sizeof(float)))) {
                                free(needs);
                                goto nomem;
                        }
                        break;
                }
        }
        free(needs);
        size_t scratch = 0;
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                const struct graph_node *n = &g->nodes[i];
                const struct graph_op_info *op = &graph_ops[n->op];
                if (op->state_floats) {
                        size_t s = op->state_floats(g, n, max_batch);
                        if (s && !(x->state[i] = calloc(s, sizeof(float))))
                                goto nomem;
                }
                if (op->scratch_floats) {
                        size_t s = op->scratch_floats(g, n, max_batch);
                        scratch = s > scratch ? s : scratch;
                }
        }
        if (scratch && !(x->scratch = malloc(sizeof(float) * scratch)))
                goto nomem;
        *ret = x;
        return 0;
nomem:
        graph_exec_free(x);
        snprintf(err, errlen, "out of memory for the graph's buffers at batch %u", max_batch);
        return -ENOMEM;
}

float *graph_exec_params(struct graph_exec *x)
{
        return x->params;
}

float *graph_exec_grads(struct graph_exec *x)
{
        return x->grads;
}

int graph_exec_use_blocks(struct graph_exec *x, float *params, float *grads)
{
        const struct graph *g = x->g;
        if (!params || !grads || params == grads)
                return -EINVAL;
        if (params != x->params)
                memmove(params, x->params, sizeof(float) * g->n_params);
        memset(grads, 0, sizeof(float) * g->n_params);
        if (!x->ext_blocks) {
                free(x->params);
                free(x->grads);
        }
        x->params = params;
        x->grads = grads;
        x->ext_blocks = true;
        for (uint32_t i = 0; i < g->n_tensors; i++)
                if (g->tensors[i].kind == GT_PARAM) {
                        x->val[i] = params + g->tensors[i].param_offset;
                        x->grad[i] = grads + g->tensors[i].param_offset;
                }
        return 0;
}

void graph_moving_deltas(struct graph_exec *x)
{
        const struct graph *g = x->g;
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                const struct graph_node *n = &g->nodes[i];
                if (n->op != GOP_BATCHNORM)
                        continue;
                size_t C = (size_t)g->tensors[n->in[0]].shape.dims[1];
                const float *batch_mean = x->state[i], *batch_var = x->state[i] + 2 * C; /* gk_batchnorm_fwd */
                double keep = n->a.momentum;
                for (uint32_t j = 3; j <= 4; j++) {
                        const struct graph_tensor *t = &g->tensors[n->in[j]];
                        if (t->kind != GT_PARAM || !t->moving)
                                continue;
                        const float *old = x->val[n->in[j]];
                        float *d = x->grad[n->in[j]];
                        for (size_t c = 0; c < C; c++)
                                d[c] = x->training ? (float)((1 - keep) * ((double)old[c] - (j == 3 ? batch_mean : batch_var)[c]))
                                                   : 0.0f;
                }
        }
}

const float *graph_grad(const struct graph_exec *x, int32_t t)
{
        if (t < 0 || t >= (int32_t)x->g->n_tensors || x->g->tensors[t].kind != GT_INPUT)
                return NULL;
        return x->grad[t];
}

int graph_set_input(struct graph_exec *x, int32_t t, const void *data, uint32_t B)
{
        const struct graph *g = x->g;
        if (t < 0 || t >= (int32_t)g->n_tensors || g->tensors[t].kind != GT_INPUT || B == 0 || B > x->max_batch)
                return -EINVAL;
        const struct graph_tensor *tt = &g->tensors[t];
        bool batched = tt->shape.rank && tt->shape.dims[0] == GRAPH_BATCH;
        if (batched) {
                if (x->fed && x->B != B)
                        return -EINVAL; /* every batched input of one step has the same batch */
                x->B = B;
                x->fed = true;
        }
        memcpy(x->val[t], data, graph_shape_count(&tt->shape, batched ? B : 1) * dtype_size(tt->dtype));
        return 0;
}

int graph_set_input_rows(struct graph_exec *x, int32_t t, const float *data, size_t ld, uint32_t B)
{
        const struct graph *g = x->g;
        if (t < 0 || t >= (int32_t)g->n_tensors || g->tensors[t].kind != GT_INPUT || g->tensors[t].dtype != GDT_F32 ||
            !g->tensors[t].shape.rank || g->tensors[t].shape.dims[0] != GRAPH_BATCH || B == 0 || B > x->max_batch ||
            (x->fed && x->B != B))
                return -EINVAL;
        size_t per = graph_shape_count(&g->tensors[t].shape, 1);
        if (ld < per)
                return -EINVAL;
        float *dst = x->val[t];
        for (uint32_t b = 0; b < B; b++)
                memcpy(dst + (size_t)b * per, data + (size_t)b * ld, sizeof(float) * per);
        x->B = B;
        x->fed = true;
        return 0;
}

static struct graph_shape resolved(const struct graph_shape *s, uint32_t B)
{
        struct graph_shape r = *s;
        for (uint32_t i = 0; i < r.rank; i++)
                if (r.dims[i] == GRAPH_BATCH)
                        r.dims[i] = B;
        return r;
}

static void kctx_fill(const struct graph_exec *x, uint32_t ni, struct graph_kctx *k)
{
        const struct graph *g = x->g;
        const struct graph_node *n = &g->nodes[ni];
        memset(k, 0, sizeof(*k));
        k->node = n;
        k->node_index = ni;
        k->B = x->B;
        k->state = x->state[ni];
        k->scratch = x->scratch;
        for (uint32_t j = 0; j < n->n_in; j++) {
                if (n->in[j] < 0)
                        continue;
                const struct graph_tensor *t = &g->tensors[n->in[j]];
                k->in[j] = x->val[n->in[j]];
                k->in_shape[j] = resolved(&t->shape, x->B);
                k->in_dtype[j] = t->dtype;
        }
        for (uint32_t j = 0; j < n->n_out; j++) {
                k->out[j] = x->val[n->out[j]];
                k->out_shape[j] = resolved(&g->tensors[n->out[j]].shape, x->B);
        }
}

int graph_forward(struct graph_exec *x, bool training, uint64_t seed)
{
        for (uint32_t i = 0; i < x->g->n_nodes; i++) {
                struct graph_kctx k;
                kctx_fill(x, i, &k);
                k.training = training;
                k.seed = seed;
                int r = graph_ops[k.node->op].fwd(&k);
                if (r < 0)
                        return r;
        }
        x->fed = false; /* the next step feeds its batch anew */
        x->training = training;
        return 0;
}

const void *graph_value(const struct graph_exec *x, int32_t t, size_t *count_ret)
{
        if (t < 0 || t >= (int32_t)x->g->n_tensors)
                return NULL;
        if (count_ret)
                *count_ret = graph_shape_count(&x->g->tensors[t].shape, x->B);
        return x->val[t];
}

int graph_backward(struct graph_exec *x, int32_t t, const float *dt)
{
        const struct graph *g = x->g;
        if (t < 0 || t >= (int32_t)g->n_tensors || !x->grad[t])
                return -EINVAL;
        /* Which nodes lie on a path to t, and which tensors feed them: only those run backward, and a
         * gradient that its one consumer sets is zeroed only when that consumer does not run. */
        bool *live = x->live, *node_live = x->live + g->n_tensors;
        memset(live, 0, sizeof(bool) * ((size_t)g->n_tensors + g->n_nodes));
        live[t] = true;
        for (uint32_t i = g->n_nodes; i-- > 0;) {
                const struct graph_node *nd = &g->nodes[i];
                for (uint32_t j = 0; j < nd->n_out; j++)
                        node_live[i] |= live[nd->out[j]] && (x->grad[nd->out[j]] != NULL);
                for (uint32_t j = 0; node_live[i] && j < nd->n_in; j++)
                        if (nd->in[j] >= 0)
                                live[nd->in[j]] = true;
        }
        for (uint32_t i = 0; i < g->n_tensors; i++) /* what is added to starts from zero */
                if (x->grad[i] && (!x->set[i] || !live[i]) && (int32_t)i != t)
                        memset(x->grad[i], 0, sizeof(float) * graph_shape_count(&g->tensors[i].shape, x->B));
        size_t n = graph_shape_count(&g->tensors[t].shape, x->B);
        for (size_t i = 0; i < n; i++)
                x->grad[t][i] = dt ? dt[i] : 1.0f;
        for (uint32_t i = g->n_nodes; i-- > 0;) {
                const struct graph_node *nd = &g->nodes[i];
                const struct graph_op_info *op = &graph_ops[nd->op];
                if (!node_live[i])
                        continue;
                if (!op->bwd) {
                        /* nothing flows back through it: the gradients it would have set are zero */
                        for (uint32_t j = 0; j < nd->n_in; j++)
                                if (nd->in[j] >= 0 && x->set[nd->in[j]] && x->grad[nd->in[j]])
                                        memset(x->grad[nd->in[j]], 0,
                                               sizeof(float) * graph_shape_count(&g->tensors[nd->in[j]].shape, x->B));
                        continue;
                }
                struct graph_kctx k;
                kctx_fill(x, i, &k);
                k.training = x->training;
                for (uint32_t j = 0; j < nd->n_out; j++)
                        k.dout[j] = x->grad[nd->out[j]];
                for (uint32_t j = 0; j < nd->n_in; j++) {
                        k.din[j] = nd->in[j] >= 0 ? x->grad[nd->in[j]] : NULL;
                        k.din_set[j] = nd->in[j] >= 0 && x->set[nd->in[j]];
                }
                int r = op->bwd(&k);
                if (r < 0)
                        return r;
        }
        return 0;
}
