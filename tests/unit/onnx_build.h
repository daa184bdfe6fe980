/* Building ONNX models in memory for the unit tests (the loader's, the config's): a ModelProto of
 * protobuf-c structs, everything malloc'd so that onnx__model_proto__free_unpacked frees it all.
 * Static functions for a test file to include after cmocka.h. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx.pb-c.h"

#define T_FLOAT ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT
#define T_INT64 ONNX__TENSOR_PROTO__DATA_TYPE__INT64
#define T_INT32 ONNX__TENSOR_PROTO__DATA_TYPE__INT32
#define T_BOOL ONNX__TENSOR_PROTO__DATA_TYPE__BOOL

/* ---- building models: everything malloc'd, so that free_unpacked frees it all ---- */

static inline void *xalloc(size_t n)
{
        void *p = calloc(1, n ? n : 1);
        assert_non_null(p);
        return p;
}

static inline char *xstrdup(const char *s)
{
        char *p = strdup(s);
        assert_non_null(p);
        return p;
}

/* Appends x to the array *arr of *n pointers. */
#define APPEND(arr, n, x)                                                                      \
        do {                                                                                   \
                *(arr) = realloc(*(arr), sizeof(**(arr)) * (*(n) + 1));                        \
                assert_non_null(*(arr));                                                       \
                (*(arr))[(*(n))++] = (x);                                                      \
        } while (0)

static inline Onnx__ModelProto *model_new(int64_t opset)
{
        Onnx__ModelProto *m = xalloc(sizeof(*m));
        onnx__model_proto__init(m);
        m->has_ir_version = true;
        m->ir_version = 8;
        m->producer_name = xstrdup("test_onnx_load");
        Onnx__OperatorSetIdProto *o = xalloc(sizeof(*o));
        onnx__operator_set_id_proto__init(o);
        o->domain = xstrdup("");
        o->has_version = true;
        o->version = opset;
        APPEND(&m->opset_import, &m->n_opset_import, o);
        m->graph = xalloc(sizeof(*m->graph));
        onnx__graph_proto__init(m->graph);
        m->graph->name = xstrdup("g");
        return m;
}

static inline void import_domain(Onnx__ModelProto *m, const char *domain, int64_t version)
{
        Onnx__OperatorSetIdProto *o = xalloc(sizeof(*o));
        onnx__operator_set_id_proto__init(o);
        o->domain = xstrdup(domain);
        o->has_version = true;
        o->version = version;
        APPEND(&m->opset_import, &m->n_opset_import, o);
}

/* A graph input; dims "batch,4": a number is a dim_value, a word a dim_param, "?" neither. */
static inline void add_input(Onnx__ModelProto *m, const char *name, int32_t elem, const char *dims)
{
        Onnx__ValueInfoProto *vi = xalloc(sizeof(*vi));
        onnx__value_info_proto__init(vi);
        vi->name = xstrdup(name);
        vi->type = xalloc(sizeof(*vi->type));
        onnx__type_proto__init(vi->type);
        vi->type->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
        vi->type->tensor_type = xalloc(sizeof(*vi->type->tensor_type));
        onnx__type_proto__tensor__init(vi->type->tensor_type);
        vi->type->tensor_type->has_elem_type = true;
        vi->type->tensor_type->elem_type = elem;
        Onnx__TensorShapeProto *s = xalloc(sizeof(*s));
        onnx__tensor_shape_proto__init(s);
        vi->type->tensor_type->shape = s;
        char *copy = xstrdup(dims), *save = NULL;
        for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                Onnx__TensorShapeProto__Dimension *d = xalloc(sizeof(*d));
                onnx__tensor_shape_proto__dimension__init(d);
                if (tok[0] >= '0' && tok[0] <= '9') {
                        d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
                        d->dim_value = strtoll(tok, NULL, 10);
                } else if (strcmp(tok, "?") != 0) {
                        d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
                        d->dim_param = xstrdup(tok);
                }
                APPEND(&s->dim, &s->n_dim, d);
        }
        free(copy);
        APPEND(&m->graph->input, &m->graph->n_input, vi);
}

static inline void add_output(Onnx__ModelProto *m, const char *name)
{
        Onnx__ValueInfoProto *vi = xalloc(sizeof(*vi));
        onnx__value_info_proto__init(vi);
        vi->name = xstrdup(name);
        APPEND(&m->graph->output, &m->graph->n_output, vi);
}

/* A tensor of type with rank dims; values: count of float or int64_t (int32 and bool given as
 * int64_t); raw: in raw_data (little-endian) rather than the typed field. */
static inline Onnx__TensorProto *tensor(const char *name, int32_t type, uint32_t rank, const int64_t *dims,
                                 const void *values, bool raw)
{
        Onnx__TensorProto *t = xalloc(sizeof(*t));
        onnx__tensor_proto__init(t);
        if (name)
                t->name = xstrdup(name);
        t->has_data_type = true;
        t->data_type = type;
        t->n_dims = rank;
        t->dims = xalloc(sizeof(int64_t) * rank);
        size_t count = 1;
        for (uint32_t i = 0; i < rank; i++) {
                t->dims[i] = dims[i];
                count *= (size_t)dims[i];
        }
        const float *f = values;
        const int64_t *q = values;
        if (raw) {
                size_t es = type == T_FLOAT || type == T_INT32 ? 4 : type == T_BOOL ? 1 : 8;
                uint8_t *b = xalloc(es * count);
                for (size_t i = 0; i < count; i++) {
                        uint64_t v = 0;
                        if (type == T_FLOAT) {
                                uint32_t u;
                                memcpy(&u, &f[i], 4);
                                v = u;
                        } else {
                                v = (uint64_t)q[i];
                        }
                        for (size_t k = 0; k < es; k++)
                                b[i * es + k] = (uint8_t)(v >> (8 * k));
                }
                t->has_raw_data = true;
                t->raw_data.data = b;
                t->raw_data.len = es * count;
        } else if (type == T_FLOAT) {
                t->n_float_data = count;
                t->float_data = xalloc(sizeof(float) * count);
                memcpy(t->float_data, f, sizeof(float) * count);
        } else if (type == T_INT64) {
                t->n_int64_data = count;
                t->int64_data = xalloc(sizeof(int64_t) * count);
                memcpy(t->int64_data, q, sizeof(int64_t) * count);
        } else {
                t->n_int32_data = count;
                t->int32_data = xalloc(sizeof(int32_t) * count);
                for (size_t i = 0; i < count; i++)
                        t->int32_data[i] = (int32_t)q[i];
        }
        return t;
}

static inline void add_init(Onnx__ModelProto *m, const char *name, int32_t type, uint32_t rank, const int64_t *dims,
                     const void *values, bool raw)
{
        APPEND(&m->graph->initializer, &m->graph->n_initializer, tensor(name, type, rank, dims, values, raw));
}

/* A node: inputs and outputs as comma lists ("x,,b": the second left out); name NULL for none. */
static inline Onnx__NodeProto *add_node(Onnx__ModelProto *m, const char *op, const char *name, const char *ins,
                                 const char *outs)
{
        Onnx__NodeProto *n = xalloc(sizeof(*n));
        onnx__node_proto__init(n);
        n->op_type = xstrdup(op);
        if (name)
                n->name = xstrdup(name);
        for (int k = 0; k < 2; k++) {
                const char *list = k ? outs : ins;
                size_t *cnt = k ? &n->n_output : &n->n_input;
                char ***arr = k ? &n->output : &n->input;
                for (const char *p = list; *p;) {
                        const char *e = strchr(p, ',');
                        size_t len = e ? (size_t)(e - p) : strlen(p);
                        char *s = xalloc(len + 1);
                        memcpy(s, p, len);
                        APPEND(arr, cnt, s);
                        if (!e)
                                break;
                        p = e + 1;
                        if (!*p)
                                APPEND(arr, cnt, xstrdup(""));
                }
        }
        APPEND(&m->graph->node, &m->graph->n_node, n);
        return n;
}

static inline Onnx__AttributeProto *attr(Onnx__NodeProto *n, const char *name, Onnx__AttributeProto__AttributeType type)
{
        Onnx__AttributeProto *a = xalloc(sizeof(*a));
        onnx__attribute_proto__init(a);
        a->name = xstrdup(name);
        a->has_type = true;
        a->type = type;
        APPEND(&n->attribute, &n->n_attribute, a);
        return a;
}

static inline void attr_i(Onnx__NodeProto *n, const char *name, int64_t v)
{
        Onnx__AttributeProto *a = attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
        a->has_i = true;
        a->i = v;
}

static inline void attr_f(Onnx__NodeProto *n, const char *name, float v)
{
        Onnx__AttributeProto *a = attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
        a->has_f = true;
        a->f = v;
}

static inline void attr_ints(Onnx__NodeProto *n, const char *name, size_t count, const int64_t *v)
{
        Onnx__AttributeProto *a = attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
        a->n_ints = count;
        a->ints = xalloc(sizeof(int64_t) * count);
        memcpy(a->ints, v, sizeof(int64_t) * count);
}

static inline void attr_s(Onnx__NodeProto *n, const char *name, const char *v)
{
        Onnx__AttributeProto *a = attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
        a->has_s = true;
        a->s.len = strlen(v);
        a->s.data = xalloc(a->s.len);
        memcpy(a->s.data, v, a->s.len);
}

static inline void attr_t(Onnx__NodeProto *n, const char *name, Onnx__TensorProto *t)
{
        attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR)->t = t;
}

/* A Constant node giving out: an int64 list. */
static inline void const_ints(Onnx__ModelProto *m, const char *out, size_t count, const int64_t *v)
{
        int64_t d = (int64_t)count;
        attr_t(add_node(m, "Constant", NULL, "", out), "value", tensor(NULL, T_INT64, 1, &d, v, false));
}

static inline uint8_t *pack(const Onnx__ModelProto *m, size_t *len)
{
        *len = onnx__model_proto__get_packed_size(m);
        uint8_t *buf = xalloc(*len);
        assert_int_equal(onnx__model_proto__pack(m, buf), *len);
        return buf;
}

