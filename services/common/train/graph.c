/* The graph engine's core (graph.h): building a graph, ordering and checking it, cutting a node out.
 * Running it is graph_exec.c's; the ops themselves are in graph_ops.c's table and the graph_k_*.c
 * kernels. */
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

size_t graph_dtype_size(enum graph_dtype t)
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
                size_t bytes = graph_count(shape) * graph_dtype_size(dtype);
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
