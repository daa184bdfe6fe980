/* The ONNX loader's state and the file's values (onnx_load-internal.h): one-line errors naming the file
 * and node, the table of names, the file's tensors and their values, constants, attributes. */
#include "onnx_load-internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ox_str(const char *s)
{
        return s ? s : "";
}

static size_t ox_dtype_size(enum graph_dtype t)
{
        return t == GDT_I64 ? sizeof(int64_t) : sizeof(float);
}

/* ---- errors: one line, the file first ---- */

int ox_fail(struct ld *L, int r, const char *fmt, ...)
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
int ox_node_fail(struct ld *L, uint32_t ni, int r, const char *fmt, ...)
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
        return ox_fail(L, r, "%s (%.40s): %s", who, ox_str(np->op_type), why);
}

/* ---- the table of names ---- */

static uint32_t ox_name_hash(const char *s)
{
        uint32_t h = 2166136261u;
        for (; *s; s++)
                h = (h ^ (unsigned char)*s) * 16777619u;
        return h;
}

struct val *ox_find(const struct ld *L, const char *name)
{
        for (uint32_t i = ox_name_hash(name) & (L->tab_cap - 1);; i = (i + 1) & (L->tab_cap - 1)) {
                if (!L->tab[i])
                        return NULL;
                if (strcmp(L->v[L->tab[i] - 1].name, name) == 0)
                        return &L->v[L->tab[i] - 1];
        }
}

/* A new value called name (not yet in the table: the caller checked). */
struct val *ox_add_val(struct ld *L, const char *name, enum vkind kind)
{
        assert(L->n_v < L->cap_v);
        struct val *v = &L->v[L->n_v];
        *v = (struct val){ .name = name, .kind = kind, .t = -1, .producer = -1 };
        uint32_t i = ox_name_hash(name) & (L->tab_cap - 1);
        while (L->tab[i])
                i = (i + 1) & (L->tab_cap - 1);
        L->tab[i] = ++L->n_v;
        return v;
}

/* a * b for a, b >= 0, INT64_MAX past it. */
int64_t ox_sat_mul(int64_t a, int64_t b)
{
        return a && b > INT64_MAX / a ? INT64_MAX : a * b;
}

/* ---- tensors in the file ---- */

const char *ox_type_name(int32_t t)
{
        static const char *const names[] = { "undefined", "float", "uint8", "int8", "uint16", "int16", "int32",
                                             "int64", "string", "bool", "float16", "double", "uint32", "uint64",
                                             "complex64", "complex128", "bfloat16" };
        return t >= 0 && t < (int32_t)(sizeof(names) / sizeof(names[0])) ? names[t] : "unknown";
}

/* Values in a shape (dims >= 0); -EINVAL when the dims, zeros taken as ones, multiply past
 * CONST_MAX_SPAN. */
int ox_shape_count(const struct graph_shape *s, size_t *ret)
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

int ox_tensor_meta(const Onnx__TensorProto *tp, struct tmeta *m, char *why, size_t wl)
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
                                ox_type_name(m->type)), -ENOTSUP;
        }
        if (tp->n_dims > GRAPH_MAX_RANK)
                return snprintf(why, wl, "it has rank %zu, at most %d is supported", tp->n_dims, GRAPH_MAX_RANK),
                       -ENOTSUP;
        m->shape.rank = (uint32_t)tp->n_dims;
        for (size_t i = 0; i < tp->n_dims; i++)
                m->shape.dims[i] = tp->dims[i];
        if (ox_shape_count(&m->shape, &m->count) < 0)
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

static uint64_t ox_le(const uint8_t *p, size_t n)
{
        uint64_t x = 0;
        for (size_t i = n; i-- > 0;)
                x = x << 8 | p[i];
        return x;
}

/* The values tensor_meta checked, into out (m->count values of m->dtype). */
void ox_tensor_values(const Onnx__TensorProto *tp, const struct tmeta *m, void *out)
{
        float *f = out;
        int64_t *q = out;
        const uint8_t *raw = tp->has_raw_data ? tp->raw_data.data : NULL;
        for (size_t i = 0; i < m->count; i++) {
                switch (m->type) {
                case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
                        if (raw) {
                                uint32_t b = (uint32_t)ox_le(raw + 4 * i, 4);
                                memcpy(&f[i], &b, sizeof(b));
                        } else {
                                f[i] = tp->float_data[i];
                        }
                        break;
                case ONNX__TENSOR_PROTO__DATA_TYPE__INT64:
                        q[i] = raw ? (int64_t)ox_le(raw + 8 * i, 8) : tp->int64_data[i];
                        break;
                case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
                        q[i] = raw ? (int32_t)(uint32_t)ox_le(raw + 4 * i, 4) : tp->int32_data[i];
                        break;
                default: /* bool */
                        q[i] = raw ? raw[i] != 0 : tp->int32_data[i] != 0;
                        break;
                }
        }
}

/* ---- constants ---- */

void ox_val_clear(struct val *v)
{
        free(v->data);
        free(v->batch);
        v->data = NULL;
        v->batch = NULL;
}

/* v becomes a constant of dtype and shape, its values zeroed (and no batch marks); -EINVAL with why when
 * it would be too large. */
int ox_const_new(struct val *v, enum graph_dtype dt, const struct graph_shape *s, char *why, size_t wl)
{
        size_t c;
        if (ox_shape_count(s, &c) < 0 || c > FOLD_MAX_VALUES)
                return snprintf(why, wl, "the folded value has a negative dim or is too large (more than %zu "
                                "values)", FOLD_MAX_VALUES), -EINVAL;
        ox_val_clear(v);
        v->kind = V_CONST;
        v->dtype = dt;
        v->shape = *s;
        v->count = c;
        v->data = calloc(c ? c : 1, ox_dtype_size(dt));
        v->batch = dt == GDT_I64 ? calloc(c ? c : 1, 1) : NULL;
        if (!v->data || (dt == GDT_I64 && !v->batch))
                return snprintf(why, wl, "out of memory"), -ENOMEM;
        return 0;
}

/* Drops the batch marks when none is set. */
void ox_const_trim(struct val *v)
{
        for (size_t i = 0; v->batch && i < v->count; i++)
                if (v->batch[i])
                        return;
        free(v->batch);
        v->batch = NULL;
}

bool ox_marked(const struct val *v, size_t i)
{
        return v->batch && v->batch[i];
}

bool ox_any_marked(const struct val *v)
{
        for (size_t i = 0; v->batch && i < v->count; i++)
                if (v->batch[i])
                        return true;
        return false;
}

/* Copies n values of a from i into o from j (same dtype), their marks too. */
void ox_const_copy(struct val *o, size_t j, const struct val *a, size_t i, size_t n)
{
        size_t es = ox_dtype_size(a->dtype);
        if (!n)
                return;
        memcpy((char *)o->data + j * es, (const char *)a->data + i * es, n * es);
        if (o->batch && a->batch)
                memcpy(o->batch + j, a->batch + i, n);
        else if (o->batch)
                memset(o->batch + j, 0, n);
}

void ox_const_copy1(struct val *o, size_t j, const struct val *a, size_t i)
{
        ox_const_copy(o, j, a, i, 1);
}

/* ---- shapes of values ---- */

struct graph_shape ox_val_shape(const struct ld *L, const struct val *v)
{
        if ((v->kind == V_INPUT || v->kind == V_NODE) && v->t >= 0)
                return L->g->tensors[v->t].shape;
        return v->shape;
}

/* The value's tensor in the graph, made now for a parameter or constant read as data by a node. */
int ox_val_tensor(struct ld *L, struct val *v, int32_t *ret, char *why, size_t wl)
{
        if (v->t >= 0) {
                *ret = v->t;
                return 0;
        }
        int t;
        if (v->kind == V_PARAM) {
                struct tmeta m;
                int r = ox_tensor_meta(v->init, &m, why, wl);
                if (r < 0)
                        return r;
                for (uint32_t i = 0; i < m.shape.rank; i++)
                        if (m.shape.dims[i] < 1)
                                return snprintf(why, wl, "\"%.100s\" has an empty dim", v->name), -ENOTSUP;
                float *data = malloc(sizeof(float) * (m.count ? m.count : 1));
                if (!data)
                        return snprintf(why, wl, "out of memory"), -ENOMEM;
                ox_tensor_values(v->init, &m, data);
                t = graph_add_tensor(L->g, v->name, GT_PARAM, GDT_F32, &m.shape, data);
                free(data);
        } else if (v->kind == V_CONST) {
                if (ox_any_marked(v))
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

const Onnx__AttributeProto *ox_attr_find(const Onnx__NodeProto *np, const char *name)
{
        const Onnx__AttributeProto *a = NULL;
        for (size_t i = 0; i < np->n_attribute; i++)
                if (strcmp(ox_str(np->attribute[i]->name), name) == 0)
                        a = np->attribute[i];
        return a;
}

/* Whether attribute a is of type t (or, in a file that leaves the type out, carries that field). */
bool ox_attr_is(const Onnx__AttributeProto *a, Onnx__AttributeProto__AttributeType t)
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

int ox_attr_int(struct ld *L, uint32_t ni, const char *name, int64_t def, int64_t *ret)
{
        const Onnx__AttributeProto *a = ox_attr_find(L->gp->node[ni], name);
        if (!a) {
                *ret = def;
                return 0;
        }
        if (!ox_attr_is(a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT))
                return ox_node_fail(L, ni, -EINVAL, "attribute \"%s\" is not an int", name);
        *ret = a->i;
        return 0;
}

/* Every attribute of the node must be one of names (NULL-terminated). */
int ox_attrs_only(struct ld *L, uint32_t ni, const char *const *names)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        for (size_t i = 0; i < np->n_attribute; i++) {
                const char *an = ox_str(np->attribute[i]->name);
                bool ok = false;
                for (const char *const *n = names; *n && !ok; n++)
                        ok = strcmp(*n, an) == 0;
                if (!ok)
                        return ox_node_fail(L, ni, -ENOTSUP, "attribute \"%.60s\" is not supported", an);
        }
        return 0;
}
