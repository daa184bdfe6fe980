/* Writing a graph as ONNX: see onnx_save.h. Every message of the ModelProto is made in one arena that is
 * freed once the bytes are packed. */
#include "onnx_save.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_load-internal.h"

#define OPSET 17
#define IR_VERSION 8 /* ONNX 1.13, the first with opset 17 */

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
                if (s->dims[i] == GRAPH_BATCH) {
                        d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
                        d->dim_param = a_str(A, "batch");
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
};

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

int onnx_save_buf(const struct graph *g, const float *params, enum model_head head, const char *doc, void **ret,
                  size_t *len_ret, char *err, size_t errlen)
{
        *ret = NULL;
        if (!g->final || g->loss < 0) {
                snprintf(err, errlen, "the graph is not finalized or has no output");
                return -EINVAL;
        }
        struct save S = { .g = g };
        struct arena *A = &S.A;
        size_t cap = (size_t)g->n_nodes * 3 + g->n_tensors + 8;
        S.nodes.v = a_new(A, sizeof(void *) * cap);
        S.inits.v = a_new(A, sizeof(void *) * cap);
        S.inputs.v = a_new(A, sizeof(void *) * (g->n_tensors + 1));
        S.outputs.v = a_new(A, sizeof(void *) * 3);
        int r = A->failed ? -ENOMEM : 0;
        for (uint32_t i = 0; r == 0 && i < g->n_tensors; i++) {
                const struct graph_tensor *t = &g->tensors[i];
                if (t->kind == GT_PARAM)
                        push(&S.inits, tensor(A, t->name, GDT_F32, &t->shape, params + t->param_offset));
                else if (t->kind == GT_CONST)
                        push(&S.inits, tensor(A, t->name, t->dtype, &t->shape, t->data));
                else if (t->kind == GT_INPUT)
                        push(&S.inputs, value_info(A, t->name, t->dtype, &t->shape, NULL));
        }
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
                Onnx__OperatorSetIdProto os = ONNX__OPERATOR_SET_ID_PROTO__INIT, *osp = &os;
                os.domain = "";
                os.has_version = 1, os.version = OPSET;
                Onnx__ModelProto m = ONNX__MODEL_PROTO__INIT;
                m.has_ir_version = 1, m.ir_version = IR_VERSION;
                m.n_opset_import = 1, m.opset_import = &osp;
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
        a_free(A);
        return r;
}
