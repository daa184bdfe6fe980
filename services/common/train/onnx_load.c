/* The ONNX loader (onnx_load.h): a ModelProto into a graph. The nodes are taken in topological order; the
 * shape arithmetic exporters emit is folded into constants as it comes, and every other node is added to
 * the graph and checked at once, its output shapes inferred by the op table's shape function, so that a
 * Shape further on reads a static shape and a Reshape knows whether its input carries the batch. */
#include "onnx_load.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph-internal.h"
#include "onnx/onnx.pb-c.h"

#define OPSET_MIN 13
#define OPSET_MAX 17
/* An input's values per example: past this a model is refused rather than risk the products of its
 * dims (2^31 floats are 8 GiB an example). */
#define INPUT_MAX_VALUES ((int64_t)1 << 31)
/* A constant's dims, zeros counted as ones, multiply to at most this, so that no product of some of
 * them overflows; its data must be in the file anyway. */
#define CONST_MAX_SPAN ((size_t)1 << 40)
/* Values a node's output may hold an example: past this a model is refused, so that the shape functions
 * further on never multiply dims past int64 (2^40 floats are 4 TiB). */
#define NODE_MAX_VALUES ((int64_t)1 << 40)
/* Pad's pads, before the shape function adds them to dims. */
#define PAD_MAX ((int64_t)1 << 31)
/* Values a fold may make: shape arithmetic is small, and a hostile file must not grow it unbounded. */
#define FOLD_MAX_VALUES ((size_t)1 << 22)

/* ---- what the loader knows of each value (tensor name) of the file ---- */

enum vkind {
        V_INPUT,  /* a graph input: a GT_INPUT tensor */
        V_PARAM,  /* a float initializer: a GT_PARAM tensor once a node reads it as data */
        V_CONST,  /* an int initializer, a Constant node's value or a folded value: known at load time */
        V_NODE,   /* computed by a node of the graph (until the node folds: then V_CONST) */
};

struct val {
        const char *name;                /* the file's (in the unpacked model) */
        enum vkind kind;
        enum graph_dtype dtype;
        struct graph_shape shape;        /* V_PARAM, V_CONST (dims may be 0: an empty constant) */
        const Onnx__TensorProto *init;   /* V_PARAM: its values, read when it becomes a tensor */
        void *data;                      /* V_CONST: count values of dtype (owned) */
        uint8_t *batch;                  /* V_CONST int64: 1 where the value is the batch size (NULL: none) */
        size_t count;
        int32_t t;                       /* its tensor in the graph, -1 while none */
        int32_t producer;                /* the node (index in the file) that computes it, or -1 */
        uint32_t consumers;              /* node inputs that read it */
        bool output;                     /* a graph output */
        bool is_init;
        bool param_used;                 /* V_PARAM: a node reads it as data */
};

struct ld {
        const char *origin;
        char *err;
        size_t errlen;
        const Onnx__GraphProto *gp;
        struct graph *g;
        struct val *v;                   /* (n_v) */
        uint32_t n_v, cap_v;
        uint32_t *tab;                   /* names: index + 1 into v, 0 for a free slot (tab_cap a power of 2) */
        uint32_t tab_cap;
        uint32_t *onnx_of;               /* (graph nodes) each graph node's index in the file */
};

static const char *str(const char *s)
{
        return s ? s : "";
}

static size_t dtype_size(enum graph_dtype t)
{
        return t == GDT_I64 ? sizeof(int64_t) : sizeof(float);
}

/* ---- errors: one line, the file first ---- */

static int fail(struct ld *L, int r, const char *fmt, ...)
{
        char why[600];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        if (L->errlen) {
                snprintf(L->err, L->errlen, "%s: %s", L->origin, why);
                for (char *s = L->err; *s; s++) /* names come from the file: keep the message one line */
                        if ((unsigned char)*s < 0x20 || *s == 0x7f)
                                *s = '?';
        }
        return r;
}

/* A node's problem: "node \"name\" (Op): why", or "node 3 (Op): why" for an unnamed one (its index in
 * the file), as graph_finalize words its own. */
static int node_fail(struct ld *L, uint32_t ni, int r, const char *fmt, ...)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        char why[400], who[160];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        if (np->name && np->name[0])
                snprintf(who, sizeof(who), "node \"%.100s\"", np->name);
        else
                snprintf(who, sizeof(who), "node %u", ni);
        return fail(L, r, "%s (%.40s): %s", who, str(np->op_type), why);
}

/* ---- the table of names ---- */

static uint32_t name_hash(const char *s)
{
        uint32_t h = 2166136261u;
        for (; *s; s++)
                h = (h ^ (unsigned char)*s) * 16777619u;
        return h;
}

static struct val *find(const struct ld *L, const char *name)
{
        for (uint32_t i = name_hash(name) & (L->tab_cap - 1);; i = (i + 1) & (L->tab_cap - 1)) {
                if (!L->tab[i])
                        return NULL;
                if (strcmp(L->v[L->tab[i] - 1].name, name) == 0)
                        return &L->v[L->tab[i] - 1];
        }
}

/* A new value called name (not yet in the table: the caller checked). */
static struct val *add_val(struct ld *L, const char *name, enum vkind kind)
{
        assert(L->n_v < L->cap_v);
        struct val *v = &L->v[L->n_v];
        *v = (struct val){ .name = name, .kind = kind, .t = -1, .producer = -1 };
        uint32_t i = name_hash(name) & (L->tab_cap - 1);
        while (L->tab[i])
                i = (i + 1) & (L->tab_cap - 1);
        L->tab[i] = ++L->n_v;
        return v;
}

/* a * b for a, b >= 0, INT64_MAX past it. */
static int64_t sat_mul(int64_t a, int64_t b)
{
        return a && b > INT64_MAX / a ? INT64_MAX : a * b;
}

/* ---- tensors in the file ---- */

static const char *type_name(int32_t t)
{
        static const char *const names[] = { "undefined", "float", "uint8", "int8", "uint16", "int16", "int32",
                                             "int64", "string", "bool", "float16", "double", "uint32", "uint64",
                                             "complex64", "complex128", "bfloat16" };
        return t >= 0 && t < (int32_t)(sizeof(names) / sizeof(names[0])) ? names[t] : "unknown";
}

/* Values in a shape (dims >= 0); -EINVAL when the dims, zeros taken as ones, multiply past
 * CONST_MAX_SPAN. */
static int shape_count(const struct graph_shape *s, size_t *ret)
{
        size_t span = 1, count = 1;
        for (uint32_t i = 0; i < s->rank; i++) {
                if (s->dims[i] < 0)
                        return -EINVAL;
                size_t d = (size_t)s->dims[i];
                if (d > CONST_MAX_SPAN || span * (d ? d : 1) > CONST_MAX_SPAN)
                        return -EINVAL;
                span *= d ? d : 1;
                count *= d;
        }
        *ret = count;
        return 0;
}

/* What a TensorProto holds: float32, or int64 (int32 and bool widened), its shape and count, checked
 * against the data present (raw_data, little-endian, or the typed field). */
struct tmeta {
        int32_t type;                    /* the file's */
        enum graph_dtype dtype;
        struct graph_shape shape;
        size_t count;
};

static int tensor_meta(const Onnx__TensorProto *tp, struct tmeta *m, char *why, size_t wl)
{
        if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
                return snprintf(why, wl, "its data is in an external file (not supported)"), -ENOTSUP;
        if (tp->segment)
                return snprintf(why, wl, "it is a segment of a tensor (not supported)"), -ENOTSUP;
        m->type = tp->has_data_type ? tp->data_type : 0;
        size_t esize;
        switch (m->type) {
        case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
                m->dtype = GDT_F32, esize = 4;
                break;
        case ONNX__TENSOR_PROTO__DATA_TYPE__INT64:
                m->dtype = GDT_I64, esize = 8;
                break;
        case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
                m->dtype = GDT_I64, esize = 4;
                break;
        case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL:
                m->dtype = GDT_I64, esize = 1;
                break;
        default:
                return snprintf(why, wl, "it has type %s: only float, int64, int32 and bool are supported",
                                type_name(m->type)), -ENOTSUP;
        }
        if (tp->n_dims > GRAPH_MAX_RANK)
                return snprintf(why, wl, "it has rank %zu, at most %d is supported", tp->n_dims, GRAPH_MAX_RANK),
                       -ENOTSUP;
        m->shape.rank = (uint32_t)tp->n_dims;
        for (size_t i = 0; i < tp->n_dims; i++)
                m->shape.dims[i] = tp->dims[i];
        if (shape_count(&m->shape, &m->count) < 0)
                return snprintf(why, wl, "its dims are negative or too large"), -EINVAL;
        if (tp->has_raw_data) {
                if (tp->raw_data.len % esize || tp->raw_data.len / esize != m->count)
                        return snprintf(why, wl, "its raw data has %zu bytes, its dims say %zu values of %zu bytes",
                                        tp->raw_data.len, m->count, esize), -EINVAL;
                return 0;
        }
        size_t have = m->type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? tp->n_float_data
                      : m->type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 ? tp->n_int64_data
                                                                         : tp->n_int32_data;
        if (have != m->count)
                return snprintf(why, wl, "it holds %zu values, its dims say %zu", have, m->count), -EINVAL;
        return 0;
}

static uint64_t le(const uint8_t *p, size_t n)
{
        uint64_t x = 0;
        for (size_t i = n; i-- > 0;)
                x = x << 8 | p[i];
        return x;
}

/* The values tensor_meta checked, into out (m->count values of m->dtype). */
static void tensor_values(const Onnx__TensorProto *tp, const struct tmeta *m, void *out)
{
        float *f = out;
        int64_t *q = out;
        const uint8_t *raw = tp->has_raw_data ? tp->raw_data.data : NULL;
        for (size_t i = 0; i < m->count; i++) {
                switch (m->type) {
                case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
                        if (raw) {
                                uint32_t b = (uint32_t)le(raw + 4 * i, 4);
                                memcpy(&f[i], &b, sizeof(b));
                        } else {
                                f[i] = tp->float_data[i];
                        }
                        break;
                case ONNX__TENSOR_PROTO__DATA_TYPE__INT64:
                        q[i] = raw ? (int64_t)le(raw + 8 * i, 8) : tp->int64_data[i];
                        break;
                case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
                        q[i] = raw ? (int32_t)(uint32_t)le(raw + 4 * i, 4) : tp->int32_data[i];
                        break;
                default: /* bool */
                        q[i] = raw ? raw[i] != 0 : tp->int32_data[i] != 0;
                        break;
                }
        }
}

/* ---- constants ---- */

static void val_clear(struct val *v)
{
        free(v->data);
        free(v->batch);
        v->data = NULL;
        v->batch = NULL;
}

/* v becomes a constant of dtype and shape, its values zeroed (and no batch marks); -EINVAL with why when
 * it would be too large. */
static int const_new(struct val *v, enum graph_dtype dt, const struct graph_shape *s, char *why, size_t wl)
{
        size_t c;
        if (shape_count(s, &c) < 0 || c > FOLD_MAX_VALUES)
                return snprintf(why, wl, "the folded value has a negative dim or is too large (more than %zu "
                                "values)", FOLD_MAX_VALUES), -EINVAL;
        val_clear(v);
        v->kind = V_CONST;
        v->dtype = dt;
        v->shape = *s;
        v->count = c;
        v->data = calloc(c ? c : 1, dtype_size(dt));
        v->batch = dt == GDT_I64 ? calloc(c ? c : 1, 1) : NULL;
        if (!v->data || (dt == GDT_I64 && !v->batch))
                return snprintf(why, wl, "out of memory"), -ENOMEM;
        return 0;
}

/* Drops the batch marks when none is set. */
static void const_trim(struct val *v)
{
        for (size_t i = 0; v->batch && i < v->count; i++)
                if (v->batch[i])
                        return;
        free(v->batch);
        v->batch = NULL;
}

static bool marked(const struct val *v, size_t i)
{
        return v->batch && v->batch[i];
}

static bool any_marked(const struct val *v)
{
        for (size_t i = 0; v->batch && i < v->count; i++)
                if (v->batch[i])
                        return true;
        return false;
}

/* Copies n values of a from i into o from j (same dtype), their marks too. */
static void const_copy(struct val *o, size_t j, const struct val *a, size_t i, size_t n)
{
        size_t es = dtype_size(a->dtype);
        if (!n)
                return;
        memcpy((char *)o->data + j * es, (const char *)a->data + i * es, n * es);
        if (o->batch && a->batch)
                memcpy(o->batch + j, a->batch + i, n);
        else if (o->batch)
                memset(o->batch + j, 0, n);
}

static void const_copy1(struct val *o, size_t j, const struct val *a, size_t i)
{
        const_copy(o, j, a, i, 1);
}

/* ---- shapes of values ---- */

static struct graph_shape val_shape(const struct ld *L, const struct val *v)
{
        if ((v->kind == V_INPUT || v->kind == V_NODE) && v->t >= 0)
                return L->g->tensors[v->t].shape;
        return v->shape;
}

/* The value's tensor in the graph, made now for a parameter or constant read as data by a node. */
static int val_tensor(struct ld *L, struct val *v, int32_t *ret, char *why, size_t wl)
{
        if (v->t >= 0) {
                *ret = v->t;
                return 0;
        }
        int t;
        if (v->kind == V_PARAM) {
                struct tmeta m;
                int r = tensor_meta(v->init, &m, why, wl);
                if (r < 0)
                        return r;
                for (uint32_t i = 0; i < m.shape.rank; i++)
                        if (m.shape.dims[i] < 1)
                                return snprintf(why, wl, "\"%.100s\" has an empty dim", v->name), -ENOTSUP;
                float *data = malloc(sizeof(float) * (m.count ? m.count : 1));
                if (!data)
                        return snprintf(why, wl, "out of memory"), -ENOMEM;
                tensor_values(v->init, &m, data);
                t = graph_add_tensor(L->g, v->name, GT_PARAM, GDT_F32, &m.shape, data);
                free(data);
        } else if (v->kind == V_CONST) {
                if (any_marked(v))
                        return snprintf(why, wl, "\"%.100s\" is a shape that does not fold to static (it holds "
                                        "the batch size)", v->name), -ENOTSUP;
                for (uint32_t i = 0; i < v->shape.rank; i++)
                        if (v->shape.dims[i] < 1)
                                return snprintf(why, wl, "\"%.100s\" is an empty constant", v->name), -ENOTSUP;
                t = graph_add_tensor(L->g, v->name, GT_CONST, v->dtype, &v->shape, v->data);
        } else {
                return snprintf(why, wl, "\"%.100s\" is not computed by the graph", v->name), -EINVAL;
        }
        if (t < 0)
                return snprintf(why, wl, "\"%.100s\": %s", v->name, strerror(-t)), t;
        v->t = t;
        *ret = t;
        return 0;
}

/* ---- attributes ---- */

static const Onnx__AttributeProto *attr_find(const Onnx__NodeProto *np, const char *name)
{
        const Onnx__AttributeProto *a = NULL;
        for (size_t i = 0; i < np->n_attribute; i++)
                if (strcmp(str(np->attribute[i]->name), name) == 0)
                        a = np->attribute[i];
        return a;
}

/* Whether attribute a is of type t (or, in a file that leaves the type out, carries that field). */
static bool attr_is(const Onnx__AttributeProto *a, Onnx__AttributeProto__AttributeType t)
{
        if (a->has_type)
                return a->type == t;
        switch (t) {
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT:
                return a->has_i;
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT:
                return a->has_f;
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING:
                return a->has_s;
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS:
                return a->n_ints > 0;
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS:
                return a->n_floats > 0;
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR:
                return a->t != NULL;
        default:
                return false;
        }
}

static int attr_int(struct ld *L, uint32_t ni, const char *name, int64_t def, int64_t *ret)
{
        const Onnx__AttributeProto *a = attr_find(L->gp->node[ni], name);
        if (!a) {
                *ret = def;
                return 0;
        }
        if (!attr_is(a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT))
                return node_fail(L, ni, -EINVAL, "attribute \"%s\" is not an int", name);
        *ret = a->i;
        return 0;
}

/* Every attribute of the node must be one of names (NULL-terminated). */
static int attrs_only(struct ld *L, uint32_t ni, const char *const *names)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        for (size_t i = 0; i < np->n_attribute; i++) {
                const char *an = str(np->attribute[i]->name);
                bool ok = false;
                for (const char *const *n = names; *n && !ok; n++)
                        ok = strcmp(*n, an) == 0;
                if (!ok)
                        return node_fail(L, ni, -ENOTSUP, "attribute \"%.60s\" is not supported", an);
        }
        return 0;
}

/* ---- Constant nodes ---- */

static int fold_constant(struct ld *L, uint32_t ni, struct val *o)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        char why[300];
        if (np->n_attribute != 1)
                return node_fail(L, ni, -EINVAL, "%zu attributes: a Constant takes exactly one", np->n_attribute);
        const Onnx__AttributeProto *a = np->attribute[0];
        const char *an = str(a->name);
        struct graph_shape s = { 0 };
        int r;
        if (strcmp(an, "value") == 0) {
                if (!attr_is(a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR) || !a->t)
                        return node_fail(L, ni, -EINVAL, "attribute \"value\" is not a tensor");
                struct tmeta m;
                if ((r = tensor_meta(a->t, &m, why, sizeof(why))) < 0 ||
                    (r = const_new(o, m.dtype, &m.shape, why, sizeof(why))) < 0)
                        return node_fail(L, ni, r, "its value: %s", why);
                tensor_values(a->t, &m, o->data);
        } else if (strcmp(an, "value_float") == 0 || strcmp(an, "value_floats") == 0 || strcmp(an, "value_int") == 0 ||
                   strcmp(an, "value_ints") == 0) {
                /* value_float, value_floats, value_int, value_ints: one value, or a list (rank 1) */
                bool fl = an[6] == 'f', one = an[fl ? 11 : 9] == 0;
                Onnx__AttributeProto__AttributeType want =
                        fl ? (one ? ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT : ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS)
                           : (one ? ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT : ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
                if (!attr_is(a, want))
                        return node_fail(L, ni, -EINVAL, "attribute \"%s\" is not a%s %s%s", an, fl ? "" : "n",
                                         fl ? "float" : "int", one ? "" : " list");
                size_t n = fl ? a->n_floats : a->n_ints, size = fl ? sizeof(float) : sizeof(int64_t);
                const void *one_v = fl ? (const void *)&a->f : (const void *)&a->i;
                const void *list = fl ? (const void *)a->floats : (const void *)a->ints;
                s.rank = one ? 0 : 1;
                s.dims[0] = (int64_t)n;
                if ((r = const_new(o, fl ? GDT_F32 : GDT_I64, &s, why, sizeof(why))) < 0)
                        return node_fail(L, ni, r, "%s", why);
                if (one)
                        memcpy(o->data, one_v, size);
                else if (n)
                        memcpy(o->data, list, size * n);
        } else {
                return node_fail(L, ni, -ENOTSUP, "attribute \"%.60s\" is not supported (value, value_float(s) and "
                                 "value_int(s) are)", an);
        }
        const_trim(o);
        return 0;
}

/* ---- folding the shape arithmetic ---- */

/* Input slot i of the node (NULL when left out: past the end or ""). */
static struct val *node_in(struct ld *L, uint32_t ni, size_t i)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        if (i >= np->n_input || !np->input[i][0])
                return NULL;
        return find(L, np->input[i]);
}

static bool is_const(const struct val *v)
{
        return v && v->kind == V_CONST;
}

/* A constant int64 list (rank 0 or 1) of at most max values, no batch size among them. */
static int const_ints(struct ld *L, uint32_t ni, size_t slot, const char *what, uint32_t max, int64_t *out,
                      uint32_t *n_ret)
{
        struct val *v = node_in(L, ni, slot);
        if (!v)
                return node_fail(L, ni, -EINVAL, "input %zu (%s) is required", slot, what);
        if (v->kind != V_CONST && v->kind != V_PARAM)
                return node_fail(L, ni, -ENOTSUP, "input %zu \"%.100s\" (%s) is not a constant (the graph engine "
                                 "takes it only as one)", slot, v->name, what);
        if (v->dtype != GDT_I64 || v->kind == V_PARAM)
                return node_fail(L, ni, -EINVAL, "input %zu \"%.100s\" (%s) is not int64", slot, v->name, what);
        if (v->shape.rank > 1)
                return node_fail(L, ni, -EINVAL, "input %zu \"%.100s\" (%s) has rank %u, needs 1", slot, v->name,
                                 what, v->shape.rank);
        if (v->count > max)
                return node_fail(L, ni, -ENOTSUP, "input %zu \"%.100s\" (%s) has %zu values, at most %u are "
                                 "supported", slot, v->name, what, v->count, max);
        for (size_t i = 0; i < v->count; i++)
                if (marked(v, i))
                        return node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: %s holds the "
                                         "batch size", what);
        memcpy(out, v->data, sizeof(int64_t) * v->count);
        *n_ret = (uint32_t)v->count;
        return 0;
}

/* An axis in [-rank, rank) made non-negative, for the folds. */
static int fold_axis(struct ld *L, uint32_t ni, int64_t axis, uint32_t rank, uint32_t *ret)
{
        if (graph_axis(axis, rank, ret) < 0)
                return node_fail(L, ni, -EINVAL, "axis %lld is out of range for rank %u", (long long)axis, rank);
        return 0;
}

static int fold_shape(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        static const char *const ok[] = { "start", "end", NULL };
        int64_t start, end;
        struct graph_shape s = val_shape(L, x), os = { .rank = 1 };
        int r;
        if ((r = attrs_only(L, ni, ok)) < 0 || (r = attr_int(L, ni, "start", 0, &start)) < 0 ||
            (r = attr_int(L, ni, "end", s.rank, &end)) < 0)
                return r;
        int64_t R = s.rank;
        start = start < 0 ? start + R : start;
        end = end < 0 ? end + R : end;
        start = start < 0 ? 0 : start > R ? R : start;
        end = end < 0 ? 0 : end > R ? R : end;
        os.dims[0] = end > start ? end - start : 0;
        char why[200];
        if ((r = const_new(o, GDT_I64, &os, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        for (int64_t i = 0; i < os.dims[0]; i++) {
                int64_t d = s.dims[start + i];
                ((int64_t *)o->data)[i] = d == GRAPH_BATCH ? 0 : d;
                o->batch[i] = d == GRAPH_BATCH;
        }
        const_trim(o);
        return 0;
}

static int fold_gather(struct ld *L, uint32_t ni, struct val *d, struct val *ix, struct val *o)
{
        static const char *const ok[] = { "axis", NULL };
        int64_t axis;
        int r;
        if ((r = attrs_only(L, ni, ok)) < 0 || (r = attr_int(L, ni, "axis", 0, &axis)) < 0)
                return r;
        if (ix->dtype != GDT_I64)
                return node_fail(L, ni, -EINVAL, "the indices \"%.100s\" are not int64", ix->name);
        if (d->shape.rank == 0)
                return node_fail(L, ni, -EINVAL, "the data \"%.100s\" is a scalar", d->name);
        uint32_t ax;
        if ((r = fold_axis(L, ni, axis, d->shape.rank, &ax)) < 0)
                return r;
        uint32_t R = d->shape.rank - 1 + ix->shape.rank;
        if (R > GRAPH_MAX_RANK)
                return node_fail(L, ni, -ENOTSUP, "the output would have rank %u, at most %d is supported", R,
                                 GRAPH_MAX_RANK);
        struct graph_shape os = { .rank = R };
        uint32_t j = 0;
        size_t outer = 1, inner = 1, A = (size_t)d->shape.dims[ax];
        for (uint32_t i = 0; i < ax; i++)
                outer *= (size_t)(os.dims[j++] = d->shape.dims[i]);
        for (uint32_t i = 0; i < ix->shape.rank; i++)
                os.dims[j++] = ix->shape.dims[i];
        for (uint32_t i = ax + 1; i < d->shape.rank; i++)
                inner *= (size_t)(os.dims[j++] = d->shape.dims[i]);
        const int64_t *idx = ix->data;
        for (size_t k = 0; k < ix->count; k++) {
                if (marked(ix, k))
                        return node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: index %zu is the "
                                         "batch size", k);
                if (idx[k] < -(int64_t)A || idx[k] >= (int64_t)A)
                        return node_fail(L, ni, -EINVAL, "index %lld is out of range for dim %zu", (long long)idx[k],
                                         A);
        }
        char why[200];
        if ((r = const_new(o, d->dtype, &os, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        size_t at = 0;
        for (size_t p = 0; p < outer; p++)
                for (size_t k = 0; k < ix->count; k++, at += inner)
                        const_copy(o, at, d, (p * A + (size_t)(idx[k] < 0 ? idx[k] + (int64_t)A : idx[k])) * inner,
                                   inner);
        const_trim(o);
        return 0;
}

static int fold_unsqueeze(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        int64_t axes[GRAPH_MAX_RANK];
        uint32_t n, ax;
        int r;
        static const char *const ok[] = { NULL };
        if ((r = attrs_only(L, ni, ok)) < 0 ||
            (r = const_ints(L, ni, 1, "axes", GRAPH_MAX_RANK, axes, &n)) < 0)
                return r;
        uint32_t R = x->shape.rank + n;
        if (R > GRAPH_MAX_RANK)
                return node_fail(L, ni, -ENOTSUP, "the output would have rank %u, at most %d is supported", R,
                                 GRAPH_MAX_RANK);
        bool ins[GRAPH_MAX_RANK] = { false };
        for (uint32_t i = 0; i < n; i++) {
                if ((r = fold_axis(L, ni, axes[i], R, &ax)) < 0)
                        return r;
                if (ins[ax])
                        return node_fail(L, ni, -EINVAL, "axes list axis %u twice", ax);
                ins[ax] = true;
        }
        struct graph_shape os = { .rank = R };
        for (uint32_t i = 0, j = 0; i < R; i++)
                os.dims[i] = ins[i] ? 1 : x->shape.dims[j++];
        char why[200];
        if ((r = const_new(o, x->dtype, &os, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        const_copy(o, 0, x, 0, x->count);
        const_trim(o);
        return 0;
}

static int fold_squeeze(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        int64_t axes[GRAPH_MAX_RANK];
        uint32_t n = 0, ax;
        int r;
        static const char *const ok[] = { NULL };
        if ((r = attrs_only(L, ni, ok)) < 0)
                return r;
        if (node_in(L, ni, 1) && (r = const_ints(L, ni, 1, "axes", GRAPH_MAX_RANK, axes, &n)) < 0)
                return r;
        bool drop[GRAPH_MAX_RANK] = { false };
        for (uint32_t i = 0; i < n; i++) {
                if ((r = fold_axis(L, ni, axes[i], x->shape.rank, &ax)) < 0)
                        return r;
                if (x->shape.dims[ax] != 1)
                        return node_fail(L, ni, -EINVAL, "axis %u has dim %lld, not 1", ax,
                                         (long long)x->shape.dims[ax]);
                drop[ax] = true;
        }
        struct graph_shape os = { 0 };
        for (uint32_t i = 0; i < x->shape.rank; i++)
                if (!(n ? drop[i] : x->shape.dims[i] == 1))
                        os.dims[os.rank++] = x->shape.dims[i];
        char why[200];
        if ((r = const_new(o, x->dtype, &os, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        const_copy(o, 0, x, 0, x->count);
        const_trim(o);
        return 0;
}

static int fold_concat(struct ld *L, uint32_t ni, struct val *o)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        static const char *const ok[] = { "axis", NULL };
        int r;
        if ((r = attrs_only(L, ni, ok)) < 0)
                return r;
        if (!attr_find(np, "axis"))
                return node_fail(L, ni, -EINVAL, "attribute \"axis\" is required");
        int64_t axis;
        if ((r = attr_int(L, ni, "axis", 0, &axis)) < 0)
                return r;
        struct val *x0 = node_in(L, ni, 0);
        if (x0->shape.rank == 0)
                return node_fail(L, ni, -EINVAL, "input 0 is a scalar");
        uint32_t ax;
        if ((r = fold_axis(L, ni, axis, x0->shape.rank, &ax)) < 0)
                return r;
        struct graph_shape os = x0->shape;
        os.dims[ax] = 0;
        for (size_t i = 0; i < np->n_input; i++) {
                struct val *x = node_in(L, ni, i);
                if (x->dtype != x0->dtype || x->shape.rank != x0->shape.rank)
                        return node_fail(L, ni, -EINVAL, "input %zu's type or rank differs from input 0's", i);
                for (uint32_t d = 0; d < os.rank; d++)
                        if (d != ax && x->shape.dims[d] != x0->shape.dims[d])
                                return node_fail(L, ni, -EINVAL, "input %zu has dim %u = %lld, input 0 %lld", i, d,
                                                 (long long)x->shape.dims[d], (long long)x0->shape.dims[d]);
                os.dims[ax] += x->shape.dims[ax];
                if (os.dims[ax] > (int64_t)CONST_MAX_SPAN)
                        break; /* const_new refuses it */
        }
        char why[200];
        if ((r = const_new(o, x0->dtype, &os, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        size_t outer = 1, inner = 1, at = 0;
        for (uint32_t d = 0; d < ax; d++)
                outer *= (size_t)os.dims[d];
        for (uint32_t d = ax + 1; d < os.rank; d++)
                inner *= (size_t)os.dims[d];
        if (o->count == 0)
                return 0;
        struct val **xs = malloc(sizeof(*xs) * np->n_input);
        if (!xs)
                return node_fail(L, ni, -ENOMEM, "out of memory");
        for (size_t i = 0; i < np->n_input; i++)
                xs[i] = node_in(L, ni, i);
        for (size_t p = 0; p < outer; p++)
                for (size_t i = 0; i < np->n_input; i++) {
                        size_t run = (size_t)xs[i]->shape.dims[ax] * inner;
                        const_copy(o, at, xs[i], p * run, run);
                        at += run;
                }
        free(xs);
        const_trim(o);
        return 0;
}

/* Steps through the indices of a shape (an odometer); false after the last. */
static bool odometer(const struct graph_shape *s, int64_t *idx)
{
        for (uint32_t i = s->rank; i-- > 0;) {
                if (++idx[i] < s->dims[i])
                        return true;
                idx[i] = 0;
        }
        return false;
}

static void strides_of(const struct graph_shape *s, int64_t *st)
{
        int64_t k = 1;
        for (uint32_t i = s->rank; i-- > 0;) {
                st[i] = k;
                k *= s->dims[i] ? s->dims[i] : 1;
        }
}

static int fold_slice(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        static const char *const ok[] = { NULL };
        int64_t starts[GRAPH_MAX_RANK], ends[GRAPH_MAX_RANK], axes[GRAPH_MAX_RANK], steps[GRAPH_MAX_RANK];
        uint32_t ns, ne, na, nst, R = x->shape.rank;
        int r;
        if ((r = attrs_only(L, ni, ok)) < 0 || (r = const_ints(L, ni, 1, "starts", R, starts, &ns)) < 0 ||
            (r = const_ints(L, ni, 2, "ends", R, ends, &ne)) < 0)
                return r;
        na = nst = ns;
        for (uint32_t i = 0; i < ns; i++)
                axes[i] = i, steps[i] = 1;
        if (node_in(L, ni, 3) && (r = const_ints(L, ni, 3, "axes", R, axes, &na)) < 0)
                return r;
        if (node_in(L, ni, 4) && (r = const_ints(L, ni, 4, "steps", R, steps, &nst)) < 0)
                return r;
        if (ne != ns || na != ns || nst != ns)
                return node_fail(L, ni, -EINVAL, "starts, ends, axes and steps differ in length");
        int64_t b[GRAPH_MAX_RANK], st[GRAPH_MAX_RANK];
        struct graph_shape os = x->shape;
        bool seen[GRAPH_MAX_RANK] = { false };
        for (uint32_t d = 0; d < R; d++)
                b[d] = 0, st[d] = 1;
        for (uint32_t i = 0; i < ns; i++) {
                uint32_t ax;
                if ((r = fold_axis(L, ni, axes[i], R, &ax)) < 0)
                        return r;
                if (seen[ax])
                        return node_fail(L, ni, -EINVAL, "axes list axis %u twice", ax);
                seen[ax] = true;
                int64_t D = x->shape.dims[ax], s = starts[i], e = ends[i], k = steps[i];
                if (k == 0)
                        return node_fail(L, ni, -EINVAL, "step 0 on axis %u", ax);
                k = k < -D - 1 ? -D - 1 : k > D + 1 ? D + 1 : k; /* the same slice, no overflow below */
                s = s < 0 ? s + D : s;
                e = e < 0 ? e + D : e;
                int64_t n;
                if (k > 0) {
                        s = s < 0 ? 0 : s > D ? D : s;
                        e = e < 0 ? 0 : e > D ? D : e;
                        n = e > s ? (e - s + k - 1) / k : 0;
                } else {
                        s = s < 0 ? 0 : s > D - 1 ? D - 1 : s;
                        e = e < -1 ? -1 : e > D - 1 ? D - 1 : e;
                        n = s > e ? (s - e - k - 1) / -k : 0;
                }
                os.dims[ax] = n;
                b[ax] = s;
                st[ax] = k;
        }
        char why[200];
        if ((r = const_new(o, x->dtype, &os, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        int64_t xs[GRAPH_MAX_RANK], idx[GRAPH_MAX_RANK] = { 0 };
        strides_of(&x->shape, xs);
        for (size_t j = 0; j < o->count; j++, odometer(&os, idx)) {
                int64_t src = 0;
                for (uint32_t d = 0; d < R; d++)
                        src += (b[d] + idx[d] * st[d]) * xs[d];
                const_copy1(o, j, x, (size_t)src);
        }
        const_trim(o);
        return 0;
}

static int fold_transpose(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        static const char *const ok[] = { "perm", NULL };
        const Onnx__AttributeProto *pa = attr_find(L->gp->node[ni], "perm");
        uint32_t R = x->shape.rank, perm[GRAPH_MAX_RANK];
        bool seen[GRAPH_MAX_RANK] = { false };
        int r;
        if ((r = attrs_only(L, ni, ok)) < 0)
                return r;
        if (pa && (!attr_is(pa, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS) || pa->n_ints != R))
                return node_fail(L, ni, -EINVAL, "perm is not a list of %u ints", R);
        for (uint32_t i = 0; i < R; i++) {
                int64_t p = pa ? pa->ints[i] : (int64_t)(R - 1 - i);
                if (p < 0 || p >= (int64_t)R || seen[p])
                        return node_fail(L, ni, -EINVAL, "perm is not a permutation of 0..%u", R - 1);
                seen[p] = true;
                perm[i] = (uint32_t)p;
        }
        struct graph_shape os = { .rank = R };
        for (uint32_t i = 0; i < R; i++)
                os.dims[i] = x->shape.dims[perm[i]];
        char why[200];
        if ((r = const_new(o, x->dtype, &os, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        int64_t xs[GRAPH_MAX_RANK], idx[GRAPH_MAX_RANK] = { 0 };
        strides_of(&x->shape, xs);
        for (size_t j = 0; j < o->count; j++, odometer(&os, idx)) {
                int64_t src = 0;
                for (uint32_t d = 0; d < R; d++)
                        src += idx[d] * xs[perm[d]];
                const_copy1(o, j, x, (size_t)src);
        }
        const_trim(o);
        return 0;
}

static int fold_cast(struct ld *L, uint32_t ni, struct val *x, int64_t to, struct val *o)
{
        enum graph_dtype dt = to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? GDT_F32 : GDT_I64;
        char why[200];
        int r;
        if ((r = const_new(o, dt, &x->shape, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        for (size_t i = 0; i < x->count; i++) {
                if (dt == x->dtype) {
                        const_copy1(o, i, x, i);
                } else if (dt == GDT_F32) {
                        if (marked(x, i))
                                return node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: the batch "
                                                 "size cast to float");
                        ((float *)o->data)[i] = (float)((int64_t *)x->data)[i];
                } else {
                        float f = ((float *)x->data)[i];
                        if (!(f > -9.2e18f && f < 9.2e18f))
                                return node_fail(L, ni, -EINVAL, "value %zu (%g) does not fit an int64", i, (double)f);
                        ((int64_t *)o->data)[i] = (int64_t)f;
                }
                if (to == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 && !marked(o, i)) {
                        int64_t q = ((int64_t *)o->data)[i];
                        if (q < INT32_MIN || q > INT32_MAX)
                                return node_fail(L, ni, -EINVAL, "value %zu (%lld) does not fit an int32", i,
                                                 (long long)q);
                }
        }
        const_trim(o);
        return 0;
}

/* ONNX's Reshape (allowzero 0) of a constant. */
static int fold_reshape(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        static const char *const ok[] = { "allowzero", NULL };
        int64_t t[GRAPH_MAX_RANK];
        uint32_t n;
        int r;
        if ((r = attrs_only(L, ni, ok)) < 0 || (r = const_ints(L, ni, 1, "shape", GRAPH_MAX_RANK, t, &n)) < 0)
                return r;
        struct graph_shape os = { .rank = n };
        int infer = -1;
        size_t known = 1;
        for (uint32_t i = 0; i < n; i++) {
                if (t[i] == -1 && infer < 0) {
                        infer = (int)i;
                        continue;
                }
                os.dims[i] = t[i] == 0 && i < x->shape.rank ? x->shape.dims[i] : t[i];
                if (os.dims[i] < 1 || (size_t)os.dims[i] > x->count)
                        return node_fail(L, ni, -EINVAL, "the target's dim %u (%lld) does not fit the constant's %zu "
                                         "values", i, (long long)t[i], x->count);
                known *= (size_t)os.dims[i];
                if (known > x->count)
                        break;
        }
        if (infer >= 0 && known && known <= x->count)
                os.dims[infer] = (int64_t)(x->count / known);
        size_t c;
        if (shape_count(&os, &c) < 0 || c != x->count)
                return node_fail(L, ni, -EINVAL, "the target does not hold the constant's %zu values", x->count);
        char why[200];
        if ((r = const_new(o, x->dtype, &os, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        const_copy(o, 0, x, 0, x->count);
        const_trim(o);
        return 0;
}

/* Add, Sub, Mul, Div of two int64 constants (broadcasting); the batch size takes no part. */
static int fold_arith(struct ld *L, uint32_t ni, const char *op, struct val *a, struct val *b, struct val *o)
{
        static const char *const ok[] = { NULL };
        int r;
        if ((r = attrs_only(L, ni, ok)) < 0)
                return r;
        if (any_marked(a) || any_marked(b))
                return node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: arithmetic on the batch "
                                 "size");
        struct graph_shape os = { .rank = a->shape.rank > b->shape.rank ? a->shape.rank : b->shape.rank };
        int64_t as[GRAPH_MAX_RANK], bs[GRAPH_MAX_RANK], sa[GRAPH_MAX_RANK], sb[GRAPH_MAX_RANK];
        strides_of(&a->shape, sa);
        strides_of(&b->shape, sb);
        for (uint32_t i = 0; i < os.rank; i++) {
                uint32_t ia = i + a->shape.rank - os.rank, ib = i + b->shape.rank - os.rank;
                int64_t da = i < os.rank - a->shape.rank ? 1 : a->shape.dims[ia];
                int64_t db = i < os.rank - b->shape.rank ? 1 : b->shape.dims[ib];
                as[i] = da == 1 || i < os.rank - a->shape.rank ? 0 : sa[ia];
                bs[i] = db == 1 || i < os.rank - b->shape.rank ? 0 : sb[ib];
                if (da != db && da != 1 && db != 1)
                        return node_fail(L, ni, -EINVAL, "shapes do not broadcast: dim %u is %lld and %lld", i,
                                         (long long)da, (long long)db);
                os.dims[i] = da == 1 ? db : da;
        }
        char why[200];
        if ((r = const_new(o, GDT_I64, &os, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        int64_t idx[GRAPH_MAX_RANK] = { 0 };
        const int64_t *x = a->data, *y = b->data;
        int64_t *z = o->data;
        for (size_t j = 0; j < o->count; j++, odometer(&os, idx)) {
                int64_t ia = 0, ib = 0;
                for (uint32_t d = 0; d < os.rank; d++)
                        ia += idx[d] * as[d], ib += idx[d] * bs[d];
                uint64_t p = (uint64_t)x[ia], q = (uint64_t)y[ib]; /* wrapping, as int64 arithmetic does */
                switch (op[0]) {
                case 'A':
                        z[j] = (int64_t)(p + q);
                        break;
                case 'S':
                        z[j] = (int64_t)(p - q);
                        break;
                case 'M':
                        z[j] = (int64_t)(p * q);
                        break;
                default:
                        if (y[ib] == 0 || (x[ia] == INT64_MIN && y[ib] == -1))
                                return node_fail(L, ni, -EINVAL, "%lld / %lld", (long long)x[ia], (long long)y[ib]);
                        z[j] = x[ia] / y[ib];
                        break;
                }
        }
        const_trim(o);
        return 0;
}

static int fold_constant_of_shape(struct ld *L, uint32_t ni, struct val *o)
{
        static const char *const ok[] = { "value", NULL };
        int64_t dims[GRAPH_MAX_RANK];
        uint32_t n;
        int r;
        if ((r = attrs_only(L, ni, ok)) < 0 ||
            (r = const_ints(L, ni, 0, "shape", GRAPH_MAX_RANK, dims, &n)) < 0)
                return r;
        struct graph_shape os = { .rank = n };
        memcpy(os.dims, dims, sizeof(int64_t) * n);
        const Onnx__AttributeProto *va = attr_find(L->gp->node[ni], "value");
        struct val fill = { .dtype = GDT_F32 };
        float zero = 0;
        fill.data = &zero;
        char why[200];
        struct tmeta m;
        int64_t q = 0;
        float f = 0;
        if (va) {
                if (!attr_is(va, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR) || !va->t)
                        return node_fail(L, ni, -EINVAL, "attribute \"value\" is not a tensor");
                if ((r = tensor_meta(va->t, &m, why, sizeof(why))) < 0)
                        return node_fail(L, ni, r, "its value: %s", why);
                if (m.count != 1)
                        return node_fail(L, ni, -EINVAL, "its value has %zu values, needs 1", m.count);
                fill.dtype = m.dtype;
                fill.data = m.dtype == GDT_I64 ? (void *)&q : (void *)&f;
                tensor_values(va->t, &m, fill.data);
        }
        if ((r = const_new(o, fill.dtype, &os, why, sizeof(why))) < 0)
                return node_fail(L, ni, r, "%s", why);
        fill.count = 1;
        for (size_t i = 0; i < o->count; i++)
                const_copy1(o, i, &fill, 0);
        const_trim(o);
        return 0;
}

/* Folds the node when it computes a constant from constants: 1 when it did, 0 when it is left to the
 * graph, -errno. */
static int try_fold(struct ld *L, uint32_t ni)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        const char *op = str(np->op_type);
        struct val *x = node_in(L, ni, 0), *y = node_in(L, ni, 1);
        bool all = np->n_input > 0;
        for (size_t i = 0; i < np->n_input; i++)
                all &= is_const(node_in(L, ni, i)) || !np->input[i][0];
        struct val *o = np->n_output ? find(L, np->output[0]) : NULL;
        bool can;
        if (strcmp(op, "Shape") == 0)
                can = x != NULL;
        else if (strcmp(op, "Gather") == 0 || strcmp(op, "Concat") == 0 || strcmp(op, "Identity") == 0 ||
                 strcmp(op, "Transpose") == 0 || strcmp(op, "ConstantOfShape") == 0)
                can = all;
        else if (strcmp(op, "Unsqueeze") == 0 || strcmp(op, "Squeeze") == 0 || strcmp(op, "Slice") == 0 ||
                 strcmp(op, "Reshape") == 0 || strcmp(op, "Cast") == 0)
                can = is_const(x);
        else if (strcmp(op, "Add") == 0 || strcmp(op, "Sub") == 0 || strcmp(op, "Mul") == 0 ||
                 strcmp(op, "Div") == 0)
                can = is_const(x) && is_const(y) && x->dtype == GDT_I64 && y->dtype == GDT_I64;
        else
                return 0;
        if (!can)
                return 0;
        if (!o || np->n_output != 1)
                return node_fail(L, ni, -EINVAL, "%zu outputs; it gives 1", np->n_output);
        if (!x && strcmp(op, "Concat") != 0)
                return node_fail(L, ni, -EINVAL, "input 0 is required");
        if (np->n_input == 0)
                return node_fail(L, ni, -EINVAL, "no inputs");
        int r;
        if (strcmp(op, "Shape") == 0) {
                r = fold_shape(L, ni, x, o);
        } else if (strcmp(op, "Gather") == 0) {
                r = y ? fold_gather(L, ni, x, y, o) : node_fail(L, ni, -EINVAL, "input 1 (indices) is required");
        } else if (strcmp(op, "Concat") == 0) {
                for (size_t i = 0; i < np->n_input; i++)
                        if (!node_in(L, ni, i))
                                return node_fail(L, ni, -EINVAL, "input %zu is left out", i);
                r = fold_concat(L, ni, o);
        } else if (strcmp(op, "Identity") == 0) {
                static const char *const ok[] = { NULL };
                char why[200];
                if ((r = attrs_only(L, ni, ok)) < 0)
                        return r;
                if ((r = const_new(o, x->dtype, &x->shape, why, sizeof(why))) < 0)
                        return node_fail(L, ni, r, "%s", why);
                const_copy(o, 0, x, 0, x->count);
                const_trim(o);
        } else if (strcmp(op, "Transpose") == 0) {
                r = fold_transpose(L, ni, x, o);
        } else if (strcmp(op, "ConstantOfShape") == 0) {
                r = fold_constant_of_shape(L, ni, o);
        } else if (strcmp(op, "Unsqueeze") == 0) {
                r = fold_unsqueeze(L, ni, x, o);
        } else if (strcmp(op, "Squeeze") == 0) {
                r = fold_squeeze(L, ni, x, o);
        } else if (strcmp(op, "Slice") == 0) {
                r = fold_slice(L, ni, x, o);
        } else if (strcmp(op, "Reshape") == 0) {
                r = fold_reshape(L, ni, x, o);
        } else if (strcmp(op, "Cast") == 0) {
                static const char *const ok[] = { "to", NULL };
                int64_t to;
                if ((r = attrs_only(L, ni, ok)) < 0 || (r = attr_int(L, ni, "to", 0, &to)) < 0)
                        return r;
                if (to != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && to != ONNX__TENSOR_PROTO__DATA_TYPE__INT64 &&
                    to != ONNX__TENSOR_PROTO__DATA_TYPE__INT32)
                        return node_fail(L, ni, -ENOTSUP, "Cast to %s is not supported (float, int64 and int32 are)",
                                         type_name((int32_t)to));
                r = fold_cast(L, ni, x, to, o);
        } else {
                r = fold_arith(L, ni, op, x, y, o);
        }
        return r < 0 ? r : 1;
}

/* ---- a node of the graph ---- */

/* The attributes each op reads, by ONNX's name, into struct graph_attrs. Read and ignored, as harmless:
 * BatchNormalization's training_mode (graph_forward's training decides), Dropout's seed (graph_forward's
 * seed decides), MaxPool's storage_order (it lays out the Indices output, which is not produced),
 * LayerNormalization's stash_type (the statistics' precision: float32 is the only one here). */
enum akind { AK_INT, AK_FLOAT, AK_INTS, AK_IGNORED };

struct attr_spec {
        const char *name;
        uint64_t ops;                    /* a bit per enum graph_op */
        enum akind kind;
        size_t off, n_off;               /* the field; AK_INTS: the array, and its count */
        uint32_t max;                    /* AK_INTS: capacity */
};

#define OPB(o) (1ull << (o))
#define POOLS (OPB(GOP_MAXPOOL) | OPB(GOP_AVGPOOL))
#define AINT(n, ops, f) { n, ops, AK_INT, offsetof(struct graph_attrs, f), 0, 0 }
#define AFLT(n, ops, f) { n, ops, AK_FLOAT, offsetof(struct graph_attrs, f), 0, 0 }
#define AINTS(n, ops, f, nf, max) \
        { n, ops, AK_INTS, offsetof(struct graph_attrs, f), offsetof(struct graph_attrs, nf), max }
#define AIGN(n, ops) { n, ops, AK_IGNORED, 0, 0, 0 }

static const struct attr_spec attr_specs[] = {
        AINT("axis", OPB(GOP_SOFTMAX) | OPB(GOP_LOG_SOFTMAX) | OPB(GOP_CONCAT) | OPB(GOP_GATHER) |
                     OPB(GOP_FLATTEN) | OPB(GOP_LAYERNORM), axis),
        AINT("transA", OPB(GOP_GEMM), trans_a),
        AINT("transB", OPB(GOP_GEMM), trans_b),
        AFLT("alpha", OPB(GOP_GEMM) | OPB(GOP_LEAKY_RELU), alpha),
        AFLT("beta", OPB(GOP_GEMM), beta),
        AINT("keepdims", OPB(GOP_REDUCE_SUM) | OPB(GOP_REDUCE_MEAN), keepdims),
        AINT("noop_with_empty_axes", OPB(GOP_REDUCE_SUM), noop_with_empty_axes),
        AINT("group", OPB(GOP_CONV), group),
        AINT("count_include_pad", OPB(GOP_AVGPOOL), count_include_pad),
        AINT("ceil_mode", POOLS, ceil_mode),
        AFLT("epsilon", OPB(GOP_BATCHNORM) | OPB(GOP_LAYERNORM), epsilon),
        AFLT("momentum", OPB(GOP_BATCHNORM), momentum),
        AINTS("axes", OPB(GOP_REDUCE_MEAN), axes, n_axes, GRAPH_MAX_RANK), /* an input from opset 18 */
        AINTS("perm", OPB(GOP_TRANSPOSE), perm, n_perm, GRAPH_MAX_RANK),
        AINTS("pads", OPB(GOP_CONV) | POOLS, pads, n_pads, 2 * GRAPH_MAX_RANK),
        AINTS("strides", OPB(GOP_CONV) | POOLS, strides, n_strides, GRAPH_MAX_RANK),
        AINTS("dilations", OPB(GOP_CONV) | OPB(GOP_MAXPOOL), dilations, n_dilations, GRAPH_MAX_RANK),
        AINTS("kernel_shape", OPB(GOP_CONV) | POOLS, kernel, n_kernel, GRAPH_MAX_RANK),
        AIGN("training_mode", OPB(GOP_BATCHNORM)),
        AIGN("seed", OPB(GOP_DROPOUT)),
        AIGN("storage_order", OPB(GOP_MAXPOOL)),
        AIGN("stash_type", OPB(GOP_LAYERNORM)),
        /* read by node_attrs itself */
        AIGN("auto_pad", OPB(GOP_CONV) | POOLS),
        AIGN("allowzero", OPB(GOP_RESHAPE)),
        AIGN("mode", OPB(GOP_PAD)),
};

/* ONNX's defaults where they differ from graph_attrs_default's, then the node's attributes. */
static int node_attrs(struct ld *L, uint32_t ni, enum graph_op op, struct graph_attrs *a)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        graph_attrs_default(a);
        switch (op) {
        case GOP_LEAKY_RELU:
                a->alpha = 0.01f;
                break;
        case GOP_SOFTMAX:
        case GOP_LOG_SOFTMAX:
        case GOP_LAYERNORM:
                a->axis = -1;
                break;
        case GOP_GATHER:
                a->axis = 0;
                break;
        case GOP_REDUCE_SUM:
        case GOP_REDUCE_MEAN:
                a->keepdims = 1;
                break;
        default:
                break;
        }
        for (size_t i = 0; i < np->n_attribute; i++) {
                const Onnx__AttributeProto *at = np->attribute[i];
                const char *an = str(at->name);
                const struct attr_spec *sp = NULL;
                for (size_t k = 0; k < sizeof(attr_specs) / sizeof(attr_specs[0]) && !sp; k++)
                        if ((attr_specs[k].ops & OPB(op)) && strcmp(attr_specs[k].name, an) == 0)
                                sp = &attr_specs[k];
                if (!sp)
                        return node_fail(L, ni, -ENOTSUP, "attribute \"%.60s\" is not supported", an);
                if (at->ref_attr_name && at->ref_attr_name[0])
                        return node_fail(L, ni, -ENOTSUP, "attribute \"%s\" refers to a function's attribute (not "
                                         "supported)", an);
                char *field = (char *)a + sp->off;
                switch (sp->kind) {
                case AK_INT:
                        if (!attr_is(at, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT))
                                return node_fail(L, ni, -EINVAL, "attribute \"%s\" is not an int", an);
                        memcpy(field, &at->i, sizeof(int64_t));
                        break;
                case AK_FLOAT:
                        if (!attr_is(at, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT))
                                return node_fail(L, ni, -EINVAL, "attribute \"%s\" is not a float", an);
                        memcpy(field, &at->f, sizeof(float));
                        break;
                case AK_INTS: {
                        if (!attr_is(at, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS))
                                return node_fail(L, ni, -EINVAL, "attribute \"%s\" is not a list of ints", an);
                        if (at->n_ints > sp->max)
                                return node_fail(L, ni, -ENOTSUP, "attribute \"%s\" has %zu values, at most %u are "
                                                 "supported", an, at->n_ints, sp->max);
                        uint32_t n = (uint32_t)at->n_ints;
                        if (n)
                                memcpy(field, at->ints, sizeof(int64_t) * n);
                        memcpy((char *)a + sp->n_off, &n, sizeof(n));
                        break;
                }
                case AK_IGNORED:
                        break;
                }
        }
        return 0;
}

/* auto_pad (Conv and the pools): NOTSET keeps pads; VALID is no padding; SAME_UPPER and SAME_LOWER pad
 * so that each spatial output dim is ceil(input / stride), the odd one at the end or the start. */
static int auto_pad(struct ld *L, uint32_t ni, enum graph_op op, struct graph_attrs *a, const int32_t *in)
{
        const Onnx__AttributeProto *at = attr_find(L->gp->node[ni], "auto_pad");
        if (!at)
                return 0;
        if (!attr_is(at, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING))
                return node_fail(L, ni, -EINVAL, "attribute \"auto_pad\" is not a string");
        char mode[16] = "";
        if (at->s.len && at->s.len < sizeof(mode))
                memcpy(mode, at->s.data, at->s.len);
        if (strcmp(mode, "NOTSET") == 0)
                return 0;
        if (strcmp(mode, "VALID") == 0) {
                a->n_pads = 0;
                return 0;
        }
        bool upper = strcmp(mode, "SAME_UPPER") == 0;
        if (!upper && strcmp(mode, "SAME_LOWER") != 0)
                return node_fail(L, ni, -ENOTSUP, "auto_pad \"%.*s\" is not supported",
                                 (int)(at->s.len < 40 ? at->s.len : 40), at->s.len ? (const char *)at->s.data : "");
        const struct graph_shape *x = &L->g->tensors[in[0]].shape;
        const struct graph_shape *w = op == GOP_CONV && in[1] >= 0 ? &L->g->tensors[in[1]].shape : NULL;
        uint32_t S = x->rank >= 2 ? x->rank - 2 : 0;
        for (uint32_t i = 0; i < S; i++) {
                int64_t k = a->n_kernel > i ? a->kernel[i] : w && w->rank == x->rank ? w->dims[2 + i] : 0;
                int64_t s = a->n_strides > i ? a->strides[i] : 1, d = a->n_dilations > i ? a->dilations[i] : 1;
                int64_t n = x->dims[2 + i];
                const int64_t big = (int64_t)1 << 24;
                if (k < 1 || s < 1 || d < 1 || n < 1 || k > big || s > big || d > big || n > big)
                        return node_fail(L, ni, -EINVAL, "auto_pad %s: spatial dim %u (%lld), its kernel (%lld), "
                                         "stride (%lld) or dilation (%lld) is out of range", mode, i, (long long)n,
                                         (long long)k, (long long)s, (long long)d);
                int64_t out = (n + s - 1) / s, total = (out - 1) * s + (k - 1) * d + 1 - n;
                total = total > 0 ? total : 0;
                a->pads[i] = upper ? total / 2 : total - total / 2;
                a->pads[S + i] = total - a->pads[i];
        }
        a->n_pads = 2 * S;
        return 0;
}

/* The ONNX inputs of each op from which on they are constants that become attributes (graph.h), and how
 * many ONNX inputs it takes at most (opsets 13 to 17). */
static void op_inputs(enum graph_op op, uint32_t *moved_from, uint32_t *onnx_max)
{
        *moved_from = UINT32_MAX;
        *onnx_max = graph_ops[op].max_in;
        switch (op) {
        case GOP_RESHAPE:
        case GOP_SQUEEZE:
        case GOP_UNSQUEEZE:
        case GOP_REDUCE_SUM:
                *moved_from = 1, *onnx_max = 2;
                break;
        case GOP_PAD:
        case GOP_DROPOUT:
                *moved_from = 1, *onnx_max = 3;
                break;
        default:
                break;
        }
}

/* A constant scalar float input (Pad's value, Dropout's ratio); a float initializer is read from the
 * file. */
static int const_float(struct ld *L, uint32_t ni, size_t slot, const char *what, float *ret)
{
        struct val *v = node_in(L, ni, slot);
        if (!v)
                return 0; /* left out: the default */
        if (v->kind == V_PARAM) {
                struct tmeta m;
                char why[200];
                int r = tensor_meta(v->init, &m, why, sizeof(why));
                if (r < 0)
                        return node_fail(L, ni, r, "input %zu \"%.100s\" (%s): %s", slot, v->name, what, why);
                if (m.count != 1)
                        return node_fail(L, ni, -EINVAL, "input %zu \"%.100s\" (%s) has %zu values, needs 1", slot,
                                         v->name, what, m.count);
                tensor_values(v->init, &m, ret);
                return 0;
        }
        if (v->kind != V_CONST)
                return node_fail(L, ni, -ENOTSUP, "input %zu \"%.100s\" (%s) is not a constant (the graph engine "
                                 "takes it only as one)", slot, v->name, what);
        if (v->count != 1)
                return node_fail(L, ni, -EINVAL, "input %zu \"%.100s\" (%s) has %zu values, needs 1", slot, v->name,
                                 what, v->count);
        if (marked(v, 0))
                return node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: %s is the batch size", what);
        *ret = v->dtype == GDT_F32 ? *(float *)v->data : (float)*(int64_t *)v->data;
        return 0;
}

/* The constant inputs of Reshape, Pad, Squeeze, Unsqueeze, ReduceSum and Dropout into attributes. x is
 * the node's data input (its tensor). */
static int moved_inputs(struct ld *L, uint32_t ni, enum graph_op op, struct graph_attrs *a, int32_t x)
{
        int r = 0;
        struct val *v;
        switch (op) {
        case GOP_RESHAPE: {
                int64_t allowzero;
                if ((r = attr_int(L, ni, "allowzero", 0, &allowzero)) < 0)
                        return r;
                v = node_in(L, ni, 1);
                /* the batch size, read by Shape, may be the target's first entry: the input's own dim 0
                 * when that is the batch (0 copies it), else what is left (-1) */
                for (size_t i = 1; v && v->kind == V_CONST && i < v->count; i++)
                        if (marked(v, i))
                                return node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: entry %zu of "
                                                 "the target is the batch size (only the first may be)", i);
                bool batch0 = v && v->kind == V_CONST && v->count >= 1 && marked(v, 0);
                if (batch0)
                        v->batch[0] = 0;
                r = const_ints(L, ni, 1, "shape", GRAPH_MAX_RANK, a->shape, &a->n_shape);
                if (batch0)
                        v->batch[0] = 1;
                if (r < 0)
                        return r;
                for (uint32_t i = 0; allowzero && i < a->n_shape; i++)
                        if (a->shape[i] == 0 && !(batch0 && i == 0))
                                return node_fail(L, ni, -ENOTSUP, "allowzero=1 with a 0 in the shape is not supported");
                const struct graph_shape *s = &L->g->tensors[x].shape;
                if (batch0)
                        a->shape[0] = s->rank && s->dims[0] == GRAPH_BATCH ? 0 : -1;
                /* a target's static dims hold at most the input's values (an example's): checked here so that
                 * no product of a hostile file's dims overflows further on */
                int64_t per = 1, known = 1;
                for (uint32_t i = 0; i < s->rank; i++)
                        per = sat_mul(per, s->dims[i] == GRAPH_BATCH ? 1 : s->dims[i]);
                for (uint32_t i = 0; i < a->n_shape; i++)
                        if (a->shape[i] > 0 && (known = sat_mul(known, a->shape[i])) > per)
                                return node_fail(L, ni, -EINVAL, "the target's dims (%lld at index %u) hold more than "
                                                 "the input's %lld values", (long long)a->shape[i], i, (long long)per);
                return 0;
        }
        case GOP_PAD: {
                const Onnx__AttributeProto *m = attr_find(L->gp->node[ni], "mode");
                if (m && !attr_is(m, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING))
                        return node_fail(L, ni, -EINVAL, "attribute \"mode\" is not a string");
                if (m && !(m->s.len == 8 && memcmp(m->s.data, "constant", 8) == 0))
                        return node_fail(L, ni, -ENOTSUP, "mode \"%.*s\" is not supported (only \"constant\")",
                                         (int)(m->s.len < 40 ? m->s.len : 40), m->s.len ? (const char *)m->s.data : "");
                if ((r = const_ints(L, ni, 1, "pads", 2 * GRAPH_MAX_RANK, a->pads, &a->n_pads)) < 0)
                        return r;
                for (uint32_t i = 0; i < a->n_pads; i++)
                        if (a->pads[i] < -PAD_MAX || a->pads[i] > PAD_MAX)
                                return node_fail(L, ni, -EINVAL, "pads[%u] is %lld: out of range", i,
                                                 (long long)a->pads[i]);
                return const_float(L, ni, 2, "constant_value", &a->pad_value);
        }
        case GOP_SQUEEZE:
        case GOP_REDUCE_SUM:
                if (!node_in(L, ni, 1))
                        return 0;
                /* fall through */
        case GOP_UNSQUEEZE:
                return const_ints(L, ni, 1, "axes", GRAPH_MAX_RANK, a->axes, &a->n_axes);
        case GOP_DROPOUT:
                if ((r = const_float(L, ni, 1, "ratio", &a->ratio)) < 0)
                        return r;
                /* training_mode: graph_forward's training decides; it must still be a constant */
                v = node_in(L, ni, 2);
                if (v && v->kind != V_CONST)
                        return node_fail(L, ni, -ENOTSUP, "input 2 \"%.100s\" (training_mode) is not a constant "
                                         "(the graph engine takes it only as one)", v->name);
                return 0;
        default:
                return 0;
        }
}

/* What graph_finalize checks of a node, and its output shapes, now: the folds further on read them. */
static int node_infer(struct ld *L, uint32_t ni, uint32_t gi)
{
        char why[400] = "";
        int r = graph_infer_node(L->g, gi, why, sizeof(why));
        return r < 0 ? node_fail(L, ni, r, "%s", why) : 0;
}

static int node_add(struct ld *L, uint32_t ni, enum graph_op op, bool no_attrs)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        struct graph_attrs a;
        int r;
        if (no_attrs)
                graph_attrs_default(&a);
        else if ((r = node_attrs(L, ni, op, &a)) < 0)
                return r;
        if (op == GOP_CONCAT && !attr_find(np, "axis"))
                return node_fail(L, ni, -EINVAL, "attribute \"axis\" is required");
        uint32_t moved_from, onnx_max;
        op_inputs(op, &moved_from, &onnx_max);
        if (np->n_input > onnx_max)
                return node_fail(L, ni, -EINVAL, "%zu inputs; it takes at most %u", np->n_input, onnx_max);
        int32_t in[GRAPH_MAX_IN];
        uint32_t n_in = 0;
        char why[300];
        for (size_t i = 0; i < np->n_input && i < moved_from; i++) {
                struct val *v = node_in(L, ni, i);
                in[n_in] = -1;
                if (v && (r = val_tensor(L, v, &in[n_in], why, sizeof(why))) < 0)
                        return node_fail(L, ni, r, "input %zu %s", i, why);
                n_in++;
        }
        while (n_in && in[n_in - 1] < 0)
                n_in--; /* optional inputs left out at the end */
        if (n_in == 0 || in[0] < 0)
                return node_fail(L, ni, -EINVAL, "input 0 is required");
        if ((r = moved_inputs(L, ni, op, &a, in[0])) < 0)
                return r;
        if ((op == GOP_CONV || op == GOP_MAXPOOL || op == GOP_AVGPOOL) && !no_attrs &&
            (r = auto_pad(L, ni, op, &a, in)) < 0)
                return r;
        /* outputs: those left out at the end go, and so do unused ones past what the op gives (Dropout's
         * mask, LayerNormalization's statistics, as exporters write them) */
        uint32_t n_out = (uint32_t)np->n_output;
        while (n_out) {
                const char *nm = np->output[n_out - 1];
                struct val *v = nm[0] ? find(L, nm) : NULL;
                if (nm[0] && (n_out <= graph_ops[op].max_out || v->consumers || v->output))
                        break;
                n_out--;
        }
        if (n_out == 0)
                return node_fail(L, ni, -EINVAL, "no outputs");
        if (n_out > GRAPH_MAX_OUT)
                return node_fail(L, ni, -ENOTSUP, "%u outputs are used; it gives %u to %u", n_out,
                                 graph_ops[op].min_out, graph_ops[op].max_out);
        const char *outs[GRAPH_MAX_OUT];
        for (uint32_t i = 0; i < n_out; i++) {
                outs[i] = np->output[i];
                if (!outs[i][0])
                        return node_fail(L, ni, -ENOTSUP, "output %u is left out while a later one is not (not "
                                         "supported)", i);
        }
        int gi = graph_add_node(L->g, op, str(np->name), in, n_in, outs, n_out, &a);
        if (gi < 0)
                return node_fail(L, ni, gi, "the graph refuses it: %s", strerror(-gi));
        L->onnx_of[gi] = ni;
        struct graph_node *n = &L->g->nodes[gi];
        for (uint32_t i = 0; i < n_out; i++)
                find(L, outs[i])->t = n->out[i];
        return node_infer(L, ni, (uint32_t)gi);
}

/* Ops folded over constants only: a node of one over a computed value is refused. */
static bool fold_only(const char *op)
{
        static const char *const ops[] = { "Shape", "Slice", "Cast", "ConstantOfShape", NULL };
        for (const char *const *o = ops; *o; o++)
                if (strcmp(*o, op) == 0)
                        return true;
        return false;
}

static int node_do(struct ld *L, uint32_t ni)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        const char *op = str(np->op_type), *dom = str(np->domain);
        if (dom[0] && strcmp(dom, "ai.onnx") != 0)
                return node_fail(L, ni, -ENOTSUP, "domain \"%.60s\" is not supported (only ONNX's default)", dom);
        if (strcmp(op, "Constant") == 0) {
                if (np->n_input != 0 || np->n_output != 1 || !np->output[0][0])
                        return node_fail(L, ni, -EINVAL, "a Constant takes no inputs and gives one output");
                return fold_constant(L, ni, find(L, np->output[0]));
        }
        int r = try_fold(L, ni);
        if (r != 0)
                return r < 0 ? r : 0;
        if (strcmp(op, "Cast") == 0) {
                /* to float, of a float: nothing to do */
                static const char *const ok[] = { "to", NULL };
                int64_t to;
                struct val *x = node_in(L, ni, 0);
                if ((r = attrs_only(L, ni, ok)) < 0 || (r = attr_int(L, ni, "to", 0, &to)) < 0)
                        return r;
                if (x && to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT &&
                    (x->kind == V_PARAM || ((x->kind == V_INPUT || x->kind == V_NODE) && x->t >= 0 &&
                                            L->g->tensors[x->t].dtype == GDT_F32)))
                        return node_add(L, ni, GOP_IDENTITY, true);
        }
        int gop = graph_op_by_name(op);
        if (gop < 0) {
                if (fold_only(op))
                        return node_fail(L, ni, -ENOTSUP, "op not in the supported set (it is folded over constants "
                                         "only, and its input is computed by the graph)");
                return node_fail(L, ni, -ENOTSUP, "op not in the supported set");
        }
        return node_add(L, ni, (enum graph_op)gop, false);
}

/* ---- the graph: values, order, nodes ---- */

static int graph_inputs(struct ld *L)
{
        const Onnx__GraphProto *gp = L->gp;
        for (size_t i = 0; i < gp->n_input; i++) {
                const Onnx__ValueInfoProto *vi = gp->input[i];
                const char *nm = str(vi->name);
                if (!nm[0])
                        return fail(L, -EINVAL, "graph input %zu has no name", i);
                struct val *v = find(L, nm);
                if (v && v->is_init)
                        continue; /* an initializer listed as an input too (IR < 4): the initializer */
                if (v)
                        return fail(L, -EINVAL, "input \"%.100s\" is listed twice", nm);
                const Onnx__TypeProto *tp = vi->type;
                if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
                        return fail(L, -ENOTSUP, "input \"%.100s\" is not a tensor", nm);
                const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
                int32_t et = tt->has_elem_type ? tt->elem_type : 0;
                if (et != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && et != ONNX__TENSOR_PROTO__DATA_TYPE__INT64)
                        return fail(L, -ENOTSUP, "input \"%.100s\" has type %s: only float and int64 are supported",
                                    nm, type_name(et));
                if (!tt->shape)
                        return fail(L, -ENOTSUP, "input \"%.100s\" has no shape", nm);
                if (tt->shape->n_dim > GRAPH_MAX_RANK)
                        return fail(L, -ENOTSUP, "input \"%.100s\" has rank %zu, at most %d is supported", nm,
                                    tt->shape->n_dim, GRAPH_MAX_RANK);
                struct graph_shape s = { .rank = (uint32_t)tt->shape->n_dim };
                int64_t per = 1;
                for (uint32_t d = 0; d < s.rank; d++) {
                        const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
                        bool sym = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
                        bool val = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
                        if (d == 0 && (sym || !val || dim->dim_value == 0)) {
                                s.dims[0] = GRAPH_BATCH;
                                continue;
                        }
                        if (sym)
                                return fail(L, -ENOTSUP, "input \"%.100s\" dim %u is symbolic (\"%.60s\"): only the "
                                            "batch may be", nm, d, str(dim->dim_param));
                        if (!val)
                                return fail(L, -ENOTSUP, "input \"%.100s\" dim %u has no size: only the batch may be "
                                            "symbolic", nm, d);
                        if (dim->dim_value < 1 || dim->dim_value > INPUT_MAX_VALUES / per)
                                return fail(L, -ENOTSUP, "input \"%.100s\" dim %u is %lld: dims are 1 to %lld values "
                                            "an example in all", nm, d, (long long)dim->dim_value,
                                            (long long)INPUT_MAX_VALUES);
                        s.dims[d] = dim->dim_value;
                        per *= dim->dim_value;
                }
                v = add_val(L, nm, V_INPUT);
                v->dtype = et == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? GDT_F32 : GDT_I64;
                v->shape = s;
                int t = graph_add_tensor(L->g, nm, GT_INPUT, v->dtype, &s, NULL);
                if (t < 0)
                        return fail(L, t, "input \"%.100s\": %s", nm, strerror(-t));
                v->t = t;
        }
        return 0;
}

static int initializers(struct ld *L)
{
        const Onnx__GraphProto *gp = L->gp;
        if (gp->n_sparse_initializer)
                return fail(L, -ENOTSUP, "sparse initializers are not supported");
        for (size_t i = 0; i < gp->n_initializer; i++) {
                const Onnx__TensorProto *tp = gp->initializer[i];
                const char *nm = str(tp->name);
                char why[300];
                if (!nm[0])
                        return fail(L, -EINVAL, "initializer %zu has no name", i);
                if (find(L, nm))
                        return fail(L, -EINVAL, "initializer \"%.100s\" is listed twice", nm);
                struct tmeta m;
                int r = tensor_meta(tp, &m, why, sizeof(why));
                if (r < 0)
                        return fail(L, r, "initializer \"%.100s\": %s", nm, why);
                struct val *v = add_val(L, nm, m.type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? V_PARAM : V_CONST);
                v->is_init = true;
                v->dtype = m.dtype;
                v->shape = m.shape;
                v->count = m.count;
                if (v->kind == V_PARAM) {
                        v->init = tp;
                        continue;
                }
                if (!(v->data = malloc(sizeof(int64_t) * (m.count ? m.count : 1))))
                        return fail(L, -ENOMEM, "initializer \"%.100s\": out of memory", nm);
                tensor_values(tp, &m, v->data);
        }
        return 0;
}

/* Every node's outputs are new values; every input is known; the graph's outputs are. */
static int node_values(struct ld *L)
{
        const Onnx__GraphProto *gp = L->gp;
        for (size_t ni = 0; ni < gp->n_node; ni++) {
                const Onnx__NodeProto *np = gp->node[ni];
                for (size_t j = 0; j < np->n_output; j++) {
                        const char *nm = np->output[j];
                        if (!nm[0])
                                continue;
                        struct val *v = find(L, nm);
                        if (v && v->producer >= 0)
                                return node_fail(L, (uint32_t)ni, -EINVAL, "output \"%.100s\" is also node %d's",
                                                 nm, v->producer);
                        if (v)
                                return node_fail(L, (uint32_t)ni, -EINVAL, "output \"%.100s\" is also an %s", nm,
                                                 v->kind == V_INPUT ? "input" : "initializer");
                        v = add_val(L, nm, V_NODE);
                        v->producer = (int32_t)ni;
                }
        }
        for (size_t ni = 0; ni < gp->n_node; ni++) {
                const Onnx__NodeProto *np = gp->node[ni];
                for (size_t j = 0; j < np->n_input; j++) {
                        if (!np->input[j][0])
                                continue;
                        struct val *v = find(L, np->input[j]);
                        if (!v)
                                return node_fail(L, (uint32_t)ni, -EINVAL, "input \"%.100s\" is no graph input, "
                                                 "initializer or node's output", np->input[j]);
                        v->consumers++;
                }
        }
        for (size_t i = 0; i < gp->n_output; i++) {
                const char *nm = str(gp->output[i]->name);
                struct val *v = find(L, nm);
                if (!v)
                        return fail(L, -EINVAL, "output \"%.100s\" is no graph input, initializer or node's output",
                                    nm);
                v->output = true;
        }
        return 0;
}

/* The float initializers a node reads as data (not as a constant that becomes an attribute, not through
 * Shape) are the graph's parameters, added in the initializers' order. */
static int params(struct ld *L)
{
        const Onnx__GraphProto *gp = L->gp;
        for (size_t ni = 0; ni < gp->n_node; ni++) {
                const Onnx__NodeProto *np = gp->node[ni];
                const char *op = str(np->op_type);
                if (strcmp(op, "Shape") == 0)
                        continue;
                int gop = graph_op_by_name(op);
                uint32_t moved_from = UINT32_MAX, onnx_max;
                if (gop >= 0)
                        op_inputs((enum graph_op)gop, &moved_from, &onnx_max);
                for (size_t j = 0; j < np->n_input && j < moved_from; j++) {
                        struct val *v = node_in(L, (uint32_t)ni, j);
                        if (v && v->kind == V_PARAM)
                                v->param_used = true;
                }
        }
        for (size_t i = 0; i < L->gp->n_initializer; i++) {
                struct val *v = find(L, str(gp->initializer[i]->name));
                char why[300];
                int32_t t;
                int r;
                if (v->kind == V_PARAM && (v->param_used || v->output) &&
                    (r = val_tensor(L, v, &t, why, sizeof(why))) < 0)
                        return fail(L, r, "initializer %s", why);
        }
        return 0;
}

/* Kahn's algorithm, the ready node of lowest index first (a sorted file keeps its order): the nodes'
 * indices in order into order. A cycle is reported through a node on it. */
static int toposort(struct ld *L, uint32_t *order)
{
        const Onnx__GraphProto *gp = L->gp;
        uint32_t n = (uint32_t)gp->n_node, *deg = calloc(n ? n : 1, sizeof(uint32_t));
        uint32_t *first = calloc(n + 1, sizeof(uint32_t)), *heap = malloc(sizeof(uint32_t) * (n ? n : 1));
        uint32_t *edges = NULL, n_edges = 0, hn = 0, k = 0;
        int r = 0;
        if (!deg || !first || !heap) {
                r = fail(L, -ENOMEM, "out of memory");
                goto out;
        }
        /* producer -> consumer edges, one per input slot, grouped by producer */
        for (uint32_t i = 0; i < n; i++)
                for (size_t j = 0; j < gp->node[i]->n_input; j++) {
                        struct val *v = node_in(L, i, j);
                        if (v && v->producer >= 0) {
                                first[v->producer + 1]++;
                                deg[i]++;
                                n_edges++;
                        }
                }
        for (uint32_t i = 0; i < n; i++)
                first[i + 1] += first[i];
        if (!(edges = malloc(sizeof(uint32_t) * (n_edges ? n_edges : 1)))) {
                r = fail(L, -ENOMEM, "out of memory");
                goto out;
        }
        {
                uint32_t *fill = heap; /* as a cursor per producer, before the heap is used */
                memcpy(fill, first, sizeof(uint32_t) * n);
                for (uint32_t i = 0; i < n; i++)
                        for (size_t j = 0; j < gp->node[i]->n_input; j++) {
                                struct val *v = node_in(L, i, j);
                                if (v && v->producer >= 0)
                                        edges[fill[v->producer]++] = i;
                        }
        }
        for (uint32_t i = 0; i < n; i++)
                if (deg[i] == 0) /* pushed in increasing order: already a heap */
                        heap[hn++] = i;
        while (hn) {
                uint32_t u = heap[0];
                heap[0] = heap[--hn];
                for (uint32_t p = 0;;) { /* sift down */
                        uint32_t c = 2 * p + 1, m = p;
                        if (c < hn && heap[c] < heap[m])
                                m = c;
                        if (c + 1 < hn && heap[c + 1] < heap[m])
                                m = c + 1;
                        if (m == p)
                                break;
                        uint32_t t = heap[p];
                        heap[p] = heap[m], heap[m] = t, p = m;
                }
                order[k++] = u;
                for (uint32_t e = first[u]; e < first[u + 1]; e++) {
                        uint32_t c = edges[e];
                        if (--deg[c] == 0) {
                                uint32_t p = hn++;
                                heap[p] = c;
                                while (p && heap[(p - 1) / 2] > heap[p]) { /* sift up */
                                        uint32_t t = heap[p];
                                        heap[p] = heap[(p - 1) / 2], heap[(p - 1) / 2] = t, p = (p - 1) / 2;
                                }
                        }
                }
        }
        if (k < n) {
                /* every node left waits on another left: walking back n steps from one lands on a cycle */
                uint32_t u = 0;
                while (deg[u] == 0)
                        u++;
                for (uint32_t s = 0; s < n; s++)
                        for (size_t j = 0; j < gp->node[u]->n_input; j++) {
                                struct val *v = node_in(L, u, j);
                                if (v && v->producer >= 0 && deg[v->producer]) {
                                        u = (uint32_t)v->producer;
                                        break;
                                }
                        }
                r = node_fail(L, u, -EINVAL, "on a cycle (its inputs depend on its outputs)");
        }
out:
        free(deg);
        free(first);
        free(heap);
        free(edges);
        return r;
}

static int load_graph(struct ld *L)
{
        const Onnx__GraphProto *gp = L->gp;
        uint32_t *order = NULL;
        int r;
        /* every value is a graph input, an initializer or a node's output */
        size_t cap = gp->n_input + gp->n_initializer;
        for (size_t i = 0; i < gp->n_node; i++)
                cap += gp->node[i]->n_output;
        if (cap >= UINT32_MAX / 4 || gp->n_node >= UINT32_MAX / 4)
                return fail(L, -ENOTSUP, "too many values");
        L->cap_v = (uint32_t)cap;
        for (L->tab_cap = 16; L->tab_cap < 2 * cap;)
                L->tab_cap *= 2;
        L->v = calloc(cap ? cap : 1, sizeof(*L->v));
        L->tab = calloc(L->tab_cap, sizeof(uint32_t));
        L->onnx_of = calloc(gp->n_node ? gp->n_node : 1, sizeof(uint32_t));
        order = malloc(sizeof(uint32_t) * (gp->n_node ? gp->n_node : 1));
        if (!L->v || !L->tab || !L->onnx_of || !order) {
                r = fail(L, -ENOMEM, "out of memory");
                goto out;
        }
        if ((r = initializers(L)) < 0 || (r = graph_inputs(L)) < 0 || (r = node_values(L)) < 0 ||
            (r = params(L)) < 0 || (r = toposort(L, order)) < 0)
                goto out;
        for (size_t i = 0; i < gp->n_node; i++)
                if ((r = node_do(L, order[i])) < 0)
                        goto out;
        /* a graph output that is a constant becomes a tensor, so that graph_find finds it */
        for (size_t i = 0; i < gp->n_output; i++) {
                struct val *v = find(L, str(gp->output[i]->name));
                char why[300];
                int32_t t;
                if ((r = val_tensor(L, v, &t, why, sizeof(why))) < 0) {
                        r = fail(L, r, "output %s", why);
                        goto out;
                }
        }
out:
        free(order);
        return r;
}

static void ld_free(struct ld *L)
{
        for (uint32_t i = 0; L->v && i < L->n_v; i++)
                val_clear(&L->v[i]);
        free(L->v);
        free(L->tab);
        free(L->onnx_of);
}

int onnx_load_buf(const void *buf, size_t len, const char *origin, struct graph **ret, char *err, size_t errlen)
{
        struct ld L = { .origin = origin ? origin : "<memory>", .err = err, .errlen = errlen };
        Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
        int r = 0;
        if (!m)
                return fail(&L, -EBADMSG, "not an ONNX model (protobuf does not parse)");
        if (!m->graph) {
                r = fail(&L, -EBADMSG, "not an ONNX model (no graph)");
                goto out;
        }
        bool opset = false;
        for (size_t i = 0; i < m->n_opset_import; i++) {
                const Onnx__OperatorSetIdProto *o = m->opset_import[i];
                const char *d = str(o->domain);
                if (d[0] && strcmp(d, "ai.onnx") != 0)
                        continue; /* other domains (ai.onnx.ml): imported is fine, a node of one is refused */
                int64_t v = o->has_version ? o->version : 0;
                if (v < OPSET_MIN || v > OPSET_MAX) {
                        r = fail(&L, -ENOTSUP, "opset %lld is not supported (ONNX's default domain: %d to %d)",
                                 (long long)v, OPSET_MIN, OPSET_MAX);
                        goto out;
                }
                opset = true;
        }
        if (!opset) {
                r = fail(&L, -ENOTSUP, "no opset of ONNX's default domain is imported (%d to %d are supported)",
                         OPSET_MIN, OPSET_MAX);
                goto out;
        }
        L.gp = m->graph;
        if (!(L.g = graph_new())) {
                r = fail(&L, -ENOMEM, "out of memory");
                goto out;
        }
        if ((r = load_graph(&L)) < 0)
                goto out;
        L.g->loss = -1;
        char fe[512] = "";
        if ((r = graph_finalize(L.g, fe, sizeof(fe))) < 0) {
                /* its node indices are the graph's, in the order the nodes were added: the file's are wanted */
                unsigned gi;
                int at = 0;
                if (sscanf(fe, "node %u (%n", &gi, &at) == 1 && at > 0 && gi < L.g->n_nodes)
                        r = fail(&L, r, "node %u (%s", L.onnx_of[gi], fe + at);
                else
                        r = fail(&L, r, "%s", fe);
                goto out;
        }
        *ret = L.g;
        L.g = NULL;
out:
        graph_free(L.g);
        ld_free(&L);
        onnx__model_proto__free_unpacked(m, NULL);
        return r;
}

int onnx_load_file(const char *path, struct graph **ret, char *err, size_t errlen)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
                int r = -errno;
                if (fd >= 0)
                        close(fd);
                snprintf(err, errlen, "%s: %s", path, strerror(-r));
                return r;
        }
        size_t size = st.st_size > 0 ? (size_t)st.st_size : 0, at = 0;
        uint8_t *buf = malloc(size ? size : 1);
        if (!buf) {
                close(fd);
                snprintf(err, errlen, "%s: out of memory for %zu bytes", path, size);
                return -ENOMEM;
        }
        while (at < size) {
                ssize_t n = read(fd, buf + at, size - at);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        int r = n < 0 ? -errno : -EIO;
                        snprintf(err, errlen, "%s: %s", path, n < 0 ? strerror(-r) : "the file shrank while read");
                        free(buf);
                        close(fd);
                        return r;
                }
                at += (size_t)n;
        }
        close(fd);
        int r = onnx_load_buf(buf, size, path, ret, err, errlen);
        free(buf);
        return r;
}
