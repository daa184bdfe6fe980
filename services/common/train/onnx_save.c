/* Writing a graph as ONNX: see onnx_save.h. Every message of the ModelProto is made in one arena that is
 * freed once the bytes are packed. */
#include "onnx_save.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_load-internal.h"

#define OPSET 17
#define IR_VERSION 8 /* ONNX 1.13, the first with opset 17 */
#define OPSET_ML 3   /* ai.onnx.ml's beside opset 17: LabelEncoder-2 (int64 keys to int64 values) */
#define DIM_IDS_PER_FIELD (GRAPH_BATCH - 1) /* a front input's symbolic "ids_per_field" */

/* The arena: every allocation of one save, freed together. */
struct arena {
        void **p;
        size_t n, cap;
        bool failed;
};

static void *a_new(struct arena *A, size_t bytes)
{
        if (A->failed)
                return NULL;
        if (A->n == A->cap) {
                size_t cap = A->cap ? 2 * A->cap : 256;
                void **p = realloc(A->p, cap * sizeof(*p));
                if (!p) {
                        A->failed = true;
                        return NULL;
                }
                A->p = p, A->cap = cap;
        }
        void *q = calloc(1, bytes ? bytes : 1);
        if (!q) {
                A->failed = true;
                return NULL;
        }
        return A->p[A->n++] = q;
}

static char *a_str(struct arena *A, const char *s)
{
        char *d = a_new(A, strlen(s) + 1);
        if (d)
                strcpy(d, s);
        return d;
}

static void a_free(struct arena *A)
{
        for (size_t i = 0; i < A->n; i++)
                free(A->p[i]);
        free(A->p);
}

/* The messages' lists grow one by one: a pointer array with room for the most a graph can need. */
struct plist {
        void **v;
        size_t n;
};

static void push(struct plist *l, void *m)
{
        if (m && l->v)
                l->v[l->n++] = m;
}

static Onnx__TensorProto *tensor(struct arena *A, const char *name, enum graph_dtype dt, const struct graph_shape *s,
                                 const void *data)
{
        Onnx__TensorProto *t = a_new(A, sizeof(*t));
        if (!t)
                return NULL;
        onnx__tensor_proto__init(t);
        t->name = a_str(A, name);
        t->has_data_type = 1;
        t->data_type = dt == GDT_F32 ? ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT : ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
        t->n_dims = s->rank;
        t->dims = a_new(A, sizeof(int64_t) * (s->rank ? s->rank : 1));
        for (uint32_t i = 0; t->dims && i < s->rank; i++)
                t->dims[i] = s->dims[i];
        size_t bytes = graph_shape_count(s, 1) * graph_dtype_size(dt);
        t->has_raw_data = 1;
        t->raw_data.len = bytes;
        t->raw_data.data = a_new(A, bytes);
        if (t->raw_data.data)
                memcpy(t->raw_data.data, data, bytes); /* little-endian, as ONNX's raw_data is */
        return t;
}

static Onnx__ValueInfoProto *value_info(struct arena *A, const char *name, enum graph_dtype dt,
                                        const struct graph_shape *s, const char *doc)
{
        Onnx__ValueInfoProto *v = a_new(A, sizeof(*v));
        Onnx__TypeProto *tp = a_new(A, sizeof(*tp));
        Onnx__TypeProto__Tensor *tt = a_new(A, sizeof(*tt));
        Onnx__TensorShapeProto *sp = a_new(A, sizeof(*sp));
        if (!v || !tp || !tt || !sp)
                return NULL;
        onnx__value_info_proto__init(v);
        onnx__type_proto__init(tp);
        onnx__type_proto__tensor__init(tt);
        onnx__tensor_shape_proto__init(sp);
        v->name = a_str(A, name);
        if (doc)
                v->doc_string = a_str(A, doc);
        v->type = tp;
        tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
        tp->tensor_type = tt;
        tt->has_elem_type = 1;
        tt->elem_type = dt == GDT_F32 ? ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT : ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
        tt->shape = sp;
        sp->n_dim = s->rank;
        sp->dim = a_new(A, sizeof(*sp->dim) * (s->rank ? s->rank : 1));
        for (uint32_t i = 0; sp->dim && i < s->rank; i++) {
                Onnx__TensorShapeProto__Dimension *d = a_new(A, sizeof(*d));
                if (!d)
                        return NULL;
                onnx__tensor_shape_proto__dimension__init(d);
                if (s->dims[i] == GRAPH_BATCH || s->dims[i] == DIM_IDS_PER_FIELD) {
                        d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
                        d->dim_param = a_str(A, s->dims[i] == GRAPH_BATCH ? "batch" : "ids_per_field");
                } else {
                        d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
                        d->dim_value = s->dims[i];
                }
                sp->dim[i] = d;
        }
        return v;
}

static Onnx__AttributeProto *attr(struct arena *A, const char *name, Onnx__AttributeProto__AttributeType type)
{
        Onnx__AttributeProto *a = a_new(A, sizeof(*a));
        if (!a)
                return NULL;
        onnx__attribute_proto__init(a);
        a->name = a_str(A, name);
        a->has_type = 1;
        a->type = type;
        return a;
}

/* The node's attributes from the loader's table: every one its op reads, with the value it has (a list
 * left empty stays out: ONNX's default is what an empty list means here). */
static void node_attrs(struct arena *A, const struct graph_node *n, struct plist *out)
{
        const char *base = (const char *)&n->a;
        for (size_t k = 0; k < onnx_n_attr_specs; k++) {
                const struct attr_spec *sp = &onnx_attr_specs[k];
                if (!(sp->ops & OPB(n->op)) || sp->kind == AK_IGNORED)
                        continue;
                Onnx__AttributeProto *a = NULL;
                if (sp->kind == AK_INT) {
                        if ((a = attr(A, sp->name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT)))
                                a->has_i = 1, a->i = *(const int64_t *)(base + sp->off);
                } else if (sp->kind == AK_FLOAT) {
                        if ((a = attr(A, sp->name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT)))
                                a->has_f = 1, a->f = *(const float *)(base + sp->off);
                } else {
                        uint32_t cnt = *(const uint32_t *)(base + sp->n_off);
                        if (cnt == 0)
                                continue;
                        if ((a = attr(A, sp->name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS))) {
                                a->n_ints = cnt;
                                a->ints = a_new(A, sizeof(int64_t) * cnt);
                                if (a->ints)
                                        memcpy(a->ints, base + sp->off, sizeof(int64_t) * cnt);
                        }
                }
                push(out, a);
        }
}

struct save {
        struct arena A;
        const struct graph *g;
        struct plist nodes, inits, inputs, outputs;
        uint32_t n_extra;     /* initializers made for moved constant inputs */
        bool ml;              /* a node of domain ai.onnx.ml (LabelEncoder) */
        struct onnx_external *ext;
        size_t ext_cap;
};

/* A float initializer: in the file, or with S->ext and at least its min_bytes, in the external data. */
static Onnx__TensorProto *init_f32(struct save *S, const char *name, const struct graph_shape *s, const float *data)
{
        struct onnx_external *x = S->ext;
        uint64_t bytes = graph_shape_count(s, 1) * sizeof(float);
        if (!x || bytes < x->min_bytes || bytes == 0)
                return tensor(&S->A, name, GDT_F32, s, data);
        struct graph_shape none = { .rank = 0 };
        Onnx__TensorProto *t = tensor(&S->A, name, GDT_F32, &none, data);
        Onnx__StringStringEntryProto **kv = a_new(&S->A, 3 * sizeof(*kv));
        if (!t || !kv)
                return NULL;
        if (x->n == S->ext_cap) {
                size_t cap = S->ext_cap ? 2 * S->ext_cap : 16;
                struct onnx_external_piece *p = realloc(x->pieces, cap * sizeof(*p));
                if (!p) {
                        S->A.failed = true;
                        return NULL;
                }
                x->pieces = p, S->ext_cap = cap;
        }
        uint64_t off = (x->size + 4095) / 4096 * 4096;
        x->pieces[x->n++] = (struct onnx_external_piece){ .data = data, .offset = off, .len = bytes };
        x->size = off + bytes;
        char num[2][24];
        snprintf(num[0], sizeof(num[0]), "%" PRIu64, off);
        snprintf(num[1], sizeof(num[1]), "%" PRIu64, bytes);
        const char *keys[3] = { "location", "offset", "length" }, *vals[3] = { x->location, num[0], num[1] };
        for (int i = 0; i < 3; i++) {
                if (!(kv[i] = a_new(&S->A, sizeof(**kv))))
                        return NULL;
                onnx__string_string_entry_proto__init(kv[i]);
                kv[i]->key = a_str(&S->A, keys[i]);
                kv[i]->value = a_str(&S->A, vals[i]);
        }
        t->n_dims = s->rank;
        t->dims = a_new(&S->A, sizeof(int64_t) * (s->rank ? s->rank : 1));
        for (uint32_t i = 0; t->dims && i < s->rank; i++)
                t->dims[i] = s->dims[i];
        t->has_raw_data = 0;
        t->raw_data.len = 0;
        t->raw_data.data = NULL;
        t->has_data_location = 1;
        t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
        t->n_external_data = 3;
        t->external_data = kv;
        return t;
}

/* A constant made for node n's moved input: an initializer named after the node. */
static char *const_in(struct save *S, const struct graph_node *n, const char *what, enum graph_dtype dt,
                      const struct graph_shape *s, const void *data)
{
        char name[256];
        snprintf(name, sizeof(name), "%s/%s", n->name, what);
        push(&S->inits, tensor(&S->A, name, dt, s, data));
        return a_str(&S->A, name);
}

static const char *tname(const struct save *S, int32_t t)
{
        return t >= 0 ? S->g->tensors[t].name : "";
}

static Onnx__NodeProto *node_new(struct save *S, const char *op, const char *name, uint32_t n_in, uint32_t n_out)
{
        Onnx__NodeProto *np = a_new(&S->A, sizeof(*np));
        if (!np)
                return NULL;
        onnx__node_proto__init(np);
        np->op_type = a_str(&S->A, op);
        np->name = a_str(&S->A, name);
        np->input = a_new(&S->A, sizeof(char *) * (n_in + 3));
        np->output = a_new(&S->A, sizeof(char *) * (n_out ? n_out : 1));
        np->attribute = a_new(&S->A, sizeof(void *) * 32);
        return np;
}

static int node(struct save *S, const struct graph_node *n, char *err, size_t errlen)
{
        const struct graph *g = S->g;
        bool dropout = n->op == GOP_DROPOUT, bn = n->op == GOP_BATCHNORM;
        uint32_t n_out = bn || dropout ? 1 : n->n_out;
        if (bn)
                for (uint32_t i = 1; i < n->n_out; i++)
                        for (uint32_t j = 0; j < g->n_nodes; j++)
                                for (uint32_t k = 0; k < g->nodes[j].n_in; k++)
                                        if (g->nodes[j].in[k] == n->out[i]) {
                                                snprintf(err, errlen, "node \"%s\" (BatchNormalization): its running "
                                                         "statistic \"%s\" is read by node \"%s\"", n->name,
                                                         tname(S, n->out[i]), g->nodes[j].name);
                                                return -EINVAL;
                                        }
        Onnx__NodeProto *np = node_new(S, dropout ? "Identity" : graph_op_name(n->op), n->name, n->n_in,
                                       n_out);
        if (!np)
                return -ENOMEM;
        for (uint32_t i = 0; i < (dropout ? 1 : n->n_in); i++)
                np->input[np->n_input++] = a_str(&S->A, tname(S, n->in[i]));
        for (uint32_t i = 0; i < n_out; i++)
                np->output[np->n_output++] = a_str(&S->A, tname(S, n->out[i]));
        struct plist at = { (void **)np->attribute, 0 };
        if (!dropout)
                node_attrs(&S->A, n, &at);
        np->n_attribute = at.n;
        const struct graph_attrs *a = &n->a;
        struct graph_shape s1 = { .rank = 1 }, s0 = { .rank = 0 };
        switch (n->op) {
        case GOP_RESHAPE:
                s1.dims[0] = a->n_shape;
                np->input[np->n_input++] = const_in(S, n, "shape", GDT_I64, &s1, a->shape);
                break;
        case GOP_PAD:
                s1.dims[0] = a->n_pads;
                np->input[np->n_input++] = const_in(S, n, "pads", GDT_I64, &s1, a->pads);
                np->input[np->n_input++] = const_in(S, n, "constant_value", GDT_F32, &s0, &a->pad_value);
                break;
        case GOP_SQUEEZE:
        case GOP_UNSQUEEZE:
        case GOP_REDUCE_SUM:
                if (a->n_axes) {
                        s1.dims[0] = a->n_axes;
                        np->input[np->n_input++] = const_in(S, n, "axes", GDT_I64, &s1, a->axes);
                }
                break;
        default:
                break;
        }
        push(&S->nodes, np);
        return 0;
}

/* ---- the tables' lookups in front of the graph (onnx_save.h, struct onnx_front) ---------------- */

static Onnx__AttributeProto *attr_int(struct arena *A, const char *name, int64_t v)
{
        Onnx__AttributeProto *a = attr(A, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
        if (a)
                a->has_i = 1, a->i = v;
        return a;
}

static Onnx__AttributeProto *attr_ints(struct arena *A, const char *name, const int64_t *v, size_t n)
{
        Onnx__AttributeProto *a = attr(A, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
        if (a && (a->ints = a_new(A, sizeof(int64_t) * (n ? n : 1)))) {
                a->n_ints = n;
                memcpy(a->ints, v, sizeof(int64_t) * n);
        }
        return a;
}

/* Node op (domain "" unless given) from in[] to out, named after its output. */
static Onnx__NodeProto *fnode(struct save *S, const char *op, const char *out, const char *const *in, uint32_t n_in)
{
        Onnx__NodeProto *np = node_new(S, op, out, n_in, 1);
        if (!np)
                return NULL;
        for (uint32_t i = 0; i < n_in; i++)
                np->input[np->n_input++] = a_str(&S->A, in[i]);
        np->output[np->n_output++] = a_str(&S->A, out);
        push(&S->nodes, np);
        return np;
}

/* An int64 constant of rank 0 (n 0) or 1, named name. */
static void const_i64(struct save *S, const char *name, const int64_t *v, uint32_t n, bool scalar)
{
        struct graph_shape s = { .rank = scalar ? 0 : 1, .dims = { n } };
        push(&S->inits, tensor(&S->A, name, GDT_I64, &s, v));
}

/* An input of the front, once whatever the tables that read it: (batch, per), or with multi (batch, per,
 * ids_per_field). */
static void front_input(struct save *S, const char *name, enum graph_dtype dt, int64_t per, bool multi)
{
        for (size_t i = 0; i < S->inputs.n; i++)
                if (strcmp(((Onnx__ValueInfoProto *)S->inputs.v[i])->name, name) == 0)
                        return;
        struct graph_shape s = { .rank = multi ? 3 : 2, .dims = { GRAPH_BATCH, per, DIM_IDS_PER_FIELD } };
        push(&S->inputs, value_info(&S->A, name, dt, &s, NULL));
}

/* "emb/<table>/<what>": the name of one of a table's nodes' outputs or initializers (in the arena). */
static const char *tn(struct save *S, const struct onnx_table *t, const char *what)
{
        char name[256];
        snprintf(name, sizeof(name), "emb/%s/%s", t->name, what);
        return a_str(&S->A, name);
}

/* The table's row of each id: (batch, n_fields) int64 into tn("row"). */
static int front_rows(struct save *S, const struct onnx_table *t, const char *ids)
{
        struct arena *A = &S->A;
        const char *row = tn(S, t, "row");
        if (t->vocab) {
                /* psfleet's ids are unsigned 64-bit, ONNX's int64 the same bits: an id of 2^63 or more is
                 * negative here, and id mod vocab = ((x mod vocab) + (2^64 mod vocab)) mod vocab, Mod taking
                 * the divisor's sign (fmod 0), so every step stays within [0, 2 vocab) */
                int64_t v = (int64_t)t->vocab, wrap = (int64_t)((UINT64_MAX % t->vocab + 1) % t->vocab), zero = 0;
                const char *vocab = tn(S, t, "vocab"), *wr = tn(S, t, "wrap"), *z = tn(S, t, "zero");
                const char *mod = tn(S, t, "mod"), *neg = tn(S, t, "negative"), *add = tn(S, t, "wrapped");
                const char *sum = tn(S, t, "sum");
                const_i64(S, vocab, &v, 0, true);
                const_i64(S, wr, &wrap, 0, true);
                const_i64(S, z, &zero, 0, true);
                Onnx__NodeProto *m1 = fnode(S, "Mod", mod, (const char *[]){ ids, vocab }, 2);
                fnode(S, "Less", neg, (const char *[]){ ids, z }, 2);
                fnode(S, "Where", add, (const char *[]){ neg, wr, z }, 3);
                fnode(S, "Add", sum, (const char *[]){ mod, add }, 2);
                Onnx__NodeProto *m2 = fnode(S, "Mod", row, (const char *[]){ sum, vocab }, 2);
                if (!m1 || !m2)
                        return -ENOMEM;
                m1->attribute[m1->n_attribute++] = attr_int(A, "fmod", 0);
                m2->attribute[m2->n_attribute++] = attr_int(A, "fmod", 0);
                return 0;
        }
        /* id -> row: the trained ids to their rows, any other id to the last row */
        uint64_t nk = t->n_rows - 1;
        int64_t *vals = a_new(A, sizeof(int64_t) * (nk ? nk : 1));
        Onnx__NodeProto *le = fnode(S, "LabelEncoder", row, (const char *[]){ ids }, 1);
        if (!vals || !le)
                return -ENOMEM;
        for (uint64_t i = 0; i < nk; i++)
                vals[i] = (int64_t)i;
        le->domain = a_str(A, "ai.onnx.ml");
        /* no trained id: one key that maps to the one row, as every other id does */
        static const int64_t none = 0;
        le->attribute[le->n_attribute++] = attr_ints(A, "keys_int64s", nk ? (const int64_t *)t->keys : &none,
                                                     nk ? nk : 1);
        le->attribute[le->n_attribute++] = attr_ints(A, "values_int64s", nk ? vals : &none, nk ? nk : 1);
        le->attribute[le->n_attribute++] = attr_int(A, "default_int64", (int64_t)nk);
        S->ml = true;
        return 0;
}

/* The shape the pooled rows take: (batch, n_fields * dim), or that of the graph input they go into. */
static int front_shape(struct save *S, const struct onnx_table *t, int64_t *shape, uint32_t *rank, char *err,
                       size_t errlen)
{
        int64_t per = (int64_t)t->n_fields * t->dim;
        shape[0] = -1, shape[1] = per, *rank = 2;
        if (!t->into)
                return 0;
        int32_t it = graph_find(S->g, t->into);
        if (it < 0 || S->g->tensors[it].kind != GT_INPUT) {
                snprintf(err, errlen, "table \"%s\": the graph has no input \"%s\"", t->name, t->into);
                return -EINVAL;
        }
        const struct graph_shape *s = &S->g->tensors[it].shape;
        if (graph_shape_count(s, 1) != (uint64_t)per) {
                snprintf(err, errlen, "table \"%s\": input \"%s\" takes %" PRIu64 " values per example, the table's "
                         "fields %" PRId64, t->name, t->into, graph_shape_count(s, 1), per);
                return -EINVAL;
        }
        *rank = s->rank;
        for (uint32_t i = 1; i < s->rank; i++)
                shape[i] = s->dims[i];
        return 0;
}

static int front_table(struct save *S, const struct onnx_table *t, char *err, size_t errlen)
{
        struct arena *A = &S->A;
        char pooled[200];
        snprintf(pooled, sizeof(pooled), "%s/pooled", t->name);
        const char *into = t->into ? t->into : pooled;
        if (!t->rows) { /* served from outside: the pooled rows are an input */
                if (!t->into)
                        front_input(S, into, GDT_F32, (int64_t)t->n_fields * t->dim, false);
                return 0;
        }
        if (t->n_fields == 0 || t->dim == 0 || t->n_rows == 0 || (!t->vocab && !t->keys) ||
            (t->vocab && t->n_rows != t->vocab)) {
                snprintf(err, errlen, "table \"%s\": no fields, rows or ids to look rows up by", t->name);
                return -EINVAL;
        }
        if (t->vocab > (UINT64_C(1) << 62)) { /* the hashing's sums stay below 2 vocab in int64 */
                snprintf(err, errlen, "table \"%s\": vocab %" PRIu64 " is over 2^62", t->name, t->vocab);
                return -EINVAL;
        }
        int64_t shape[GRAPH_MAX_RANK];
        uint32_t rank;
        int r = front_shape(S, t, shape, &rank, err, errlen);
        if (r < 0)
                return r;
        front_input(S, t->ids, GDT_I64, t->ids_width, t->multi);
        front_input(S, t->weights, GDT_F32, t->ids_width, t->multi);
        const char *ids = t->ids, *w = t->weights;
        bool same = t->n_fields == t->ids_width;
        for (uint32_t j = 0; same && j < t->n_fields; j++)
                same = t->fields[j] == j;
        if (!same) { /* the table's columns of the ids and weights */
                int64_t *cols = a_new(A, sizeof(int64_t) * t->n_fields);
                for (uint32_t j = 0; cols && j < t->n_fields; j++)
                        cols[j] = t->fields[j];
                if (!cols)
                        return -ENOMEM;
                const char *fields = tn(S, t, "fields");
                const_i64(S, fields, cols, t->n_fields, false);
                ids = tn(S, t, "ids");
                w = tn(S, t, "weights");
                Onnx__NodeProto *a = fnode(S, "Gather", ids, (const char *[]){ t->ids, fields }, 2);
                Onnx__NodeProto *b = fnode(S, "Gather", w, (const char *[]){ t->weights, fields }, 2);
                if (!a || !b)
                        return -ENOMEM;
                a->attribute[a->n_attribute++] = attr_int(A, "axis", 1);
                b->attribute[b->n_attribute++] = attr_int(A, "axis", 1);
        }
        const char *ax2 = tn(S, t, "axis2"), *ax3 = tn(S, t, "axis3");
        int64_t two = 2, three = 3;
        const_i64(S, ax2, &two, 1, false);
        const_i64(S, ax3, &three, 1, false);
        if (!t->multi) { /* one id per field: as a field of one id, (batch, n_fields, 1) */
                const char *ids3 = tn(S, t, "ids3"), *w3 = tn(S, t, "weights3");
                fnode(S, "Unsqueeze", ids3, (const char *[]){ ids, ax2 }, 2);
                fnode(S, "Unsqueeze", w3, (const char *[]){ w, ax2 }, 2);
                ids = ids3, w = w3;
        }
        if ((r = front_rows(S, t, ids)) < 0)
                return r;
        struct graph_shape ts = { .rank = 2, .dims = { (int64_t)t->n_rows, t->dim } };
        const char *table = tn(S, t, "table"), *rows = tn(S, t, "rows");
        push(&S->inits, init_f32(S, table, &ts, t->rows));
        Onnx__NodeProto *ga = fnode(S, "Gather", rows, (const char *[]){ table, tn(S, t, "row") }, 2);
        if (!ga)
                return -ENOMEM;
        ga->attribute[ga->n_attribute++] = attr_int(A, "axis", 0);
        /* (batch, n_fields, k): each id's factor; mean: 1 / the field's ids of weight not 0, at least 1 */
        if (t->mean) {
                float fz = 0, one = 1;
                struct graph_shape s0 = { .rank = 0 };
                const char *fzero = tn(S, t, "fzero"), *fone = tn(S, t, "fone"), *is_zero = tn(S, t, "is_zero");
                const char *has = tn(S, t, "has_id"), *m = tn(S, t, "counted"), *cnt = tn(S, t, "count");
                const char *den = tn(S, t, "count1");
                push(&S->inits, tensor(A, fzero, GDT_F32, &s0, &fz));
                push(&S->inits, tensor(A, fone, GDT_F32, &s0, &one));
                fnode(S, "Equal", is_zero, (const char *[]){ w, fzero }, 2);
                fnode(S, "Not", has, (const char *[]){ is_zero }, 1);
                Onnx__NodeProto *c = fnode(S, "Cast", m, (const char *[]){ has }, 1);
                Onnx__NodeProto *rs = fnode(S, "ReduceSum", cnt, (const char *[]){ m, ax2 }, 2);
                if (!c || !rs)
                        return -ENOMEM;
                c->attribute[c->n_attribute++] = attr_int(A, "to", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
                rs->attribute[rs->n_attribute++] = attr_int(A, "keepdims", 1);
                fnode(S, "Max", den, (const char *[]){ cnt, fone }, 2);
                w = tn(S, t, "mean_weights");
                fnode(S, "Div", w, (const char *[]){ m, den }, 2);
        }
        const char *w4 = tn(S, t, "weights4"), *scaled = tn(S, t, "scaled"), *sum = tn(S, t, "pooled3");
        const char *sh = tn(S, t, "shape");
        const_i64(S, sh, shape, rank, false);
        fnode(S, "Unsqueeze", w4, (const char *[]){ w, ax3 }, 2);
        fnode(S, "Mul", scaled, (const char *[]){ rows, w4 }, 2);
        Onnx__NodeProto *rs = fnode(S, "ReduceSum", sum, (const char *[]){ scaled, ax2 }, 2);
        if (!rs)
                return -ENOMEM;
        rs->attribute[rs->n_attribute++] = attr_int(A, "keepdims", 0);
        fnode(S, "Reshape", into, (const char *[]){ sum, sh }, 2);
        return A->failed ? -ENOMEM : 0;
}

/* Whether graph input t is made by the front (so not an input of the file). */
static bool front_makes(const struct onnx_front *f, const char *t)
{
        if (!f)
                return false;
        if (f->concat && strcmp(f->concat, t) == 0)
                return true;
        for (uint32_t i = 0; i < f->n_tables; i++)
                if (f->tables[i].rows && f->tables[i].into && strcmp(f->tables[i].into, t) == 0)
                        return true;
        return false;
}

static int front(struct save *S, const struct onnx_front *f, char *err, size_t errlen)
{
        if (f->concat) {
                int32_t c = graph_find(S->g, f->concat);
                if (c < 0 || S->g->tensors[c].kind != GT_INPUT) {
                        snprintf(err, errlen, "the graph has no input \"%s\"", f->concat);
                        return -EINVAL;
                }
                if (f->n_dense)
                        front_input(S, f->dense, GDT_F32, f->n_dense, false);
        }
        for (uint32_t i = 0; i < f->n_tables; i++) {
                int r = front_table(S, &f->tables[i], err, errlen);
                if (r < 0)
                        return r;
        }
        if (!f->concat)
                return 0;
        Onnx__NodeProto *np = node_new(S, "Concat", f->concat, f->n_tables + 1, 1);
        if (!np)
                return -ENOMEM;
        if (f->n_dense)
                np->input[np->n_input++] = a_str(&S->A, f->dense);
        for (uint32_t i = 0; i < f->n_tables; i++) {
                char pooled[200];
                snprintf(pooled, sizeof(pooled), "%s/pooled", f->tables[i].name);
                np->input[np->n_input++] = a_str(&S->A, pooled);
        }
        np->output[np->n_output++] = a_str(&S->A, f->concat);
        np->attribute[np->n_attribute++] = attr_int(&S->A, "axis", 1);
        push(&S->nodes, np);
        return 0;
}

int onnx_save_buf(const struct graph *g, const float *params, enum model_head head, const char *doc, void **ret,
                  size_t *len_ret, char *err, size_t errlen)
{
        return onnx_save_front_buf(g, params, head, NULL, NULL, doc, ret, len_ret, err, errlen);
}

int onnx_save_front_buf(const struct graph *g, const float *params, enum model_head head,
                        const struct onnx_front *front_, struct onnx_external *ext, const char *doc, void **ret,
                        size_t *len_ret, char *err, size_t errlen)
{
        *ret = NULL;
        if (!g->final || g->loss < 0) {
                snprintf(err, errlen, "the graph is not finalized or has no output");
                return -EINVAL;
        }
        struct save S = { .g = g, .ext = ext };
        struct arena *A = &S.A;
        if (ext)
                ext->n = 0, ext->pieces = NULL, ext->size = 0;
        uint32_t nt = front_ ? front_->n_tables : 0;
        size_t cap = (size_t)g->n_nodes * 3 + g->n_tensors + 8 + 24 * (size_t)nt;
        S.nodes.v = a_new(A, sizeof(void *) * cap);
        S.inits.v = a_new(A, sizeof(void *) * cap);
        S.inputs.v = a_new(A, sizeof(void *) * (g->n_tensors + 2 + 3 * (size_t)nt));
        S.outputs.v = a_new(A, sizeof(void *) * 3);
        int r = A->failed ? -ENOMEM : 0;
        for (uint32_t i = 0; r == 0 && i < g->n_tensors; i++) {
                const struct graph_tensor *t = &g->tensors[i];
                if (t->kind == GT_PARAM)
                        push(&S.inits, init_f32(&S, t->name, &t->shape, params + t->param_offset));
                else if (t->kind == GT_CONST)
                        push(&S.inits, tensor(A, t->name, t->dtype, &t->shape, t->data));
                else if (t->kind == GT_INPUT && !front_makes(front_, t->name))
                        push(&S.inputs, value_info(A, t->name, t->dtype, &t->shape, NULL));
        }
        if (r == 0 && front_)
                r = front(&S, front_, err, errlen);
        for (uint32_t i = 0; r == 0 && i < g->n_nodes; i++)
                r = node(&S, &g->nodes[i], err, errlen);
        /* the outputs: the logits, and the head's output on them */
        const struct graph_tensor *lt = &g->tensors[g->loss];
        static const char *const head_out[] = { [HEAD_SOFTMAX] = "probabilities", [HEAD_LOGISTIC] = "probability",
                                                [HEAD_MSE] = "prediction" };
        static const char *const head_op[] = { [HEAD_SOFTMAX] = "Softmax", [HEAD_LOGISTIC] = "Sigmoid",
                                               [HEAD_MSE] = "Identity" };
        if (r == 0 && graph_find(g, head_out[head]) >= 0) {
                snprintf(err, errlen, "the graph has a tensor called \"%s\", the name of the head's output",
                         head_out[head]);
                r = -EINVAL;
        }
        if (r == 0) {
                Onnx__NodeProto *np = node_new(&S, head_op[head], "head", 1, 1);
                if (np) {
                        np->input[np->n_input++] = a_str(A, lt->name);
                        np->output[np->n_output++] = a_str(A, head_out[head]);
                        if (head == HEAD_SOFTMAX) {
                                Onnx__AttributeProto *ax = attr(A, "axis", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
                                if (ax)
                                        ax->has_i = 1, ax->i = -1, np->attribute[np->n_attribute++] = ax;
                        }
                }
                push(&S.nodes, np);
                push(&S.outputs, value_info(A, lt->name, GDT_F32, &lt->shape, "the logits: what the head reads"));
                push(&S.outputs, value_info(A, head_out[head], GDT_F32, &lt->shape,
                                            head == HEAD_SOFTMAX    ? "softmax probabilities over the last axis"
                                            : head == HEAD_LOGISTIC ? "sigmoid probability of label 1"
                                                                    : "the predicted value"));
        }
        if (r == 0 && A->failed)
                r = -ENOMEM;
        if (r == 0) {
                Onnx__GraphProto gp = ONNX__GRAPH_PROTO__INIT;
                gp.name = "psfleet";
                gp.n_node = S.nodes.n, gp.node = (Onnx__NodeProto **)S.nodes.v;
                gp.n_initializer = S.inits.n, gp.initializer = (Onnx__TensorProto **)S.inits.v;
                gp.n_input = S.inputs.n, gp.input = (Onnx__ValueInfoProto **)S.inputs.v;
                gp.n_output = S.outputs.n, gp.output = (Onnx__ValueInfoProto **)S.outputs.v;
                Onnx__OperatorSetIdProto os = ONNX__OPERATOR_SET_ID_PROTO__INIT, ml = ONNX__OPERATOR_SET_ID_PROTO__INIT;
                Onnx__OperatorSetIdProto *osp[2] = { &os, &ml };
                os.domain = "";
                os.has_version = 1, os.version = OPSET;
                ml.domain = "ai.onnx.ml";
                ml.has_version = 1, ml.version = OPSET_ML;
                Onnx__ModelProto m = ONNX__MODEL_PROTO__INIT;
                m.has_ir_version = 1, m.ir_version = IR_VERSION;
                m.n_opset_import = S.ml ? 2 : 1, m.opset_import = osp;
                m.producer_name = "psfleet";
                m.doc_string = (char *)(doc ? doc : "");
                m.graph = &gp;
                size_t len = onnx__model_proto__get_packed_size(&m);
                uint8_t *buf = malloc(len ? len : 1);
                if (!buf)
                        r = -ENOMEM;
                else {
                        onnx__model_proto__pack(&m, buf);
                        *ret = buf;
                        *len_ret = len;
                }
        }
        if (r == -ENOMEM)
                snprintf(err, errlen, "out of memory");
        if (r < 0 && ext) {
                free(ext->pieces);
                ext->n = 0, ext->pieces = NULL, ext->size = 0;
        }
        a_free(A);
        return r;
}
