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

#include "onnx_load-internal.h"

/* ---- a node of the graph ---- */

const struct attr_spec onnx_attr_specs[] = {
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
const size_t onnx_n_attr_specs = sizeof(onnx_attr_specs) / sizeof(onnx_attr_specs[0]);

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
                const char *an = ox_str(at->name);
                const struct attr_spec *sp = NULL;
                for (size_t k = 0; k < onnx_n_attr_specs && !sp; k++)
                        if ((onnx_attr_specs[k].ops & OPB(op)) && strcmp(onnx_attr_specs[k].name, an) == 0)
                                sp = &onnx_attr_specs[k];
                if (!sp)
                        return ox_node_fail(L, ni, -ENOTSUP, "attribute \"%.60s\" is not supported", an);
                if (at->ref_attr_name && at->ref_attr_name[0])
                        return ox_node_fail(L, ni, -ENOTSUP, "attribute \"%s\" refers to a function's attribute (not "
                                         "supported)", an);
                char *field = (char *)a + sp->off;
                switch (sp->kind) {
                case AK_INT:
                        if (!ox_attr_is(at, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT))
                                return ox_node_fail(L, ni, -EINVAL, "attribute \"%s\" is not an int", an);
                        memcpy(field, &at->i, sizeof(int64_t));
                        break;
                case AK_FLOAT:
                        if (!ox_attr_is(at, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT))
                                return ox_node_fail(L, ni, -EINVAL, "attribute \"%s\" is not a float", an);
                        memcpy(field, &at->f, sizeof(float));
                        break;
                case AK_INTS: {
                        if (!ox_attr_is(at, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS))
                                return ox_node_fail(L, ni, -EINVAL, "attribute \"%s\" is not a list of ints", an);
                        if (at->n_ints > sp->max)
                                return ox_node_fail(L, ni, -ENOTSUP, "attribute \"%s\" has %zu values, at most %u are "
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
        const Onnx__AttributeProto *at = ox_attr_find(L->gp->node[ni], "auto_pad");
        if (!at)
                return 0;
        if (!ox_attr_is(at, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING))
                return ox_node_fail(L, ni, -EINVAL, "attribute \"auto_pad\" is not a string");
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
                return ox_node_fail(L, ni, -ENOTSUP, "auto_pad \"%.*s\" is not supported",
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
                        return ox_node_fail(L, ni, -EINVAL, "auto_pad %s: spatial dim %u (%lld), its kernel (%lld), "
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
        struct val *v = ox_node_in(L, ni, slot);
        if (!v)
                return 0; /* left out: the default */
        if (v->kind == V_PARAM) {
                struct tmeta m;
                char why[200];
                int r = ox_tensor_meta(v->init, &m, why, sizeof(why));
                if (r < 0)
                        return ox_node_fail(L, ni, r, "input %zu \"%.100s\" (%s): %s", slot, v->name, what, why);
                if (m.count != 1)
                        return ox_node_fail(L, ni, -EINVAL, "input %zu \"%.100s\" (%s) has %zu values, needs 1", slot,
                                         v->name, what, m.count);
                ox_tensor_values(v->init, &m, ret);
                return 0;
        }
        if (v->kind != V_CONST)
                return ox_node_fail(L, ni, -ENOTSUP, "input %zu \"%.100s\" (%s) is not a constant (the graph engine "
                                 "takes it only as one)", slot, v->name, what);
        if (v->count != 1)
                return ox_node_fail(L, ni, -EINVAL, "input %zu \"%.100s\" (%s) has %zu values, needs 1", slot, v->name,
                                 what, v->count);
        if (ox_marked(v, 0))
                return ox_node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: %s is the batch size", what);
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
                if ((r = ox_attr_int(L, ni, "allowzero", 0, &allowzero)) < 0)
                        return r;
                v = ox_node_in(L, ni, 1);
                /* the batch size, read by Shape, may be the target's first entry: the input's own dim 0
                 * when that is the batch (0 copies it), else what is left (-1) */
                for (size_t i = 1; v && v->kind == V_CONST && i < v->count; i++)
                        if (ox_marked(v, i))
                                return ox_node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: entry %zu of "
                                                 "the target is the batch size (only the first may be)", i);
                bool batch0 = v && v->kind == V_CONST && v->count >= 1 && ox_marked(v, 0);
                if (batch0)
                        v->batch[0] = 0;
                r = ox_const_ints(L, ni, 1, "shape", GRAPH_MAX_RANK, a->shape, &a->n_shape);
                if (batch0)
                        v->batch[0] = 1;
                if (r < 0)
                        return r;
                for (uint32_t i = 0; allowzero && i < a->n_shape; i++)
                        if (a->shape[i] == 0 && !(batch0 && i == 0))
                                return ox_node_fail(L, ni, -ENOTSUP, "allowzero=1 with a 0 in the shape is not supported");
                const struct graph_shape *s = &L->g->tensors[x].shape;
                if (batch0)
                        a->shape[0] = s->rank && s->dims[0] == GRAPH_BATCH ? 0 : -1;
                /* a target's static dims hold at most the input's values (an example's): checked here so that
                 * no product of a hostile file's dims overflows further on */
                int64_t per = 1, known = 1;
                for (uint32_t i = 0; i < s->rank; i++)
                        per = ox_sat_mul(per, s->dims[i] == GRAPH_BATCH ? 1 : s->dims[i]);
                for (uint32_t i = 0; i < a->n_shape; i++)
                        if (a->shape[i] > 0 && (known = ox_sat_mul(known, a->shape[i])) > per)
                                return ox_node_fail(L, ni, -EINVAL, "the target's dims (%lld at index %u) hold more than "
                                                 "the input's %lld values", (long long)a->shape[i], i, (long long)per);
                return 0;
        }
        case GOP_PAD: {
                const Onnx__AttributeProto *m = ox_attr_find(L->gp->node[ni], "mode");
                if (m && !ox_attr_is(m, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING))
                        return ox_node_fail(L, ni, -EINVAL, "attribute \"mode\" is not a string");
                if (m && !(m->s.len == 8 && memcmp(m->s.data, "constant", 8) == 0))
                        return ox_node_fail(L, ni, -ENOTSUP, "mode \"%.*s\" is not supported (only \"constant\")",
                                         (int)(m->s.len < 40 ? m->s.len : 40), m->s.len ? (const char *)m->s.data : "");
                if ((r = ox_const_ints(L, ni, 1, "pads", 2 * GRAPH_MAX_RANK, a->pads, &a->n_pads)) < 0)
                        return r;
                for (uint32_t i = 0; i < a->n_pads; i++)
                        if (a->pads[i] < -PAD_MAX || a->pads[i] > PAD_MAX)
                                return ox_node_fail(L, ni, -EINVAL, "pads[%u] is %lld: out of range", i,
                                                 (long long)a->pads[i]);
                return const_float(L, ni, 2, "constant_value", &a->pad_value);
        }
        case GOP_SQUEEZE:
        case GOP_REDUCE_SUM:
                if (!ox_node_in(L, ni, 1))
                        return 0;
                /* fall through */
        case GOP_UNSQUEEZE:
                return ox_const_ints(L, ni, 1, "axes", GRAPH_MAX_RANK, a->axes, &a->n_axes);
        case GOP_DROPOUT:
                if ((r = const_float(L, ni, 1, "ratio", &a->ratio)) < 0)
                        return r;
                /* training_mode: graph_forward's training decides; it must still be a constant */
                v = ox_node_in(L, ni, 2);
                if (v && v->kind != V_CONST)
                        return ox_node_fail(L, ni, -ENOTSUP, "input 2 \"%.100s\" (training_mode) is not a constant "
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
        return r < 0 ? ox_node_fail(L, ni, r, "%s", why) : 0;
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
        if (op == GOP_CONCAT && !ox_attr_find(np, "axis"))
                return ox_node_fail(L, ni, -EINVAL, "attribute \"axis\" is required");
        uint32_t moved_from, onnx_max;
        op_inputs(op, &moved_from, &onnx_max);
        if (np->n_input > onnx_max)
                return ox_node_fail(L, ni, -EINVAL, "%zu inputs; it takes at most %u", np->n_input, onnx_max);
        int32_t in[GRAPH_MAX_IN];
        uint32_t n_in = 0;
        char why[300];
        for (size_t i = 0; i < np->n_input && i < moved_from; i++) {
                struct val *v = ox_node_in(L, ni, i);
                in[n_in] = -1;
                if (v && (r = ox_val_tensor(L, v, &in[n_in], why, sizeof(why))) < 0)
                        return ox_node_fail(L, ni, r, "input %zu %s", i, why);
                n_in++;
        }
        while (n_in && in[n_in - 1] < 0)
                n_in--; /* optional inputs left out at the end */
        if (n_in == 0 || in[0] < 0)
                return ox_node_fail(L, ni, -EINVAL, "input 0 is required");
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
                struct val *v = nm[0] ? ox_find(L, nm) : NULL;
                if (nm[0] && (n_out <= graph_ops[op].max_out || v->consumers || v->output))
                        break;
                n_out--;
        }
        if (n_out == 0)
                return ox_node_fail(L, ni, -EINVAL, "no outputs");
        if (n_out > GRAPH_MAX_OUT)
                return ox_node_fail(L, ni, -ENOTSUP, "%u outputs are used; it gives %u to %u", n_out,
                                 graph_ops[op].min_out, graph_ops[op].max_out);
        const char *outs[GRAPH_MAX_OUT];
        for (uint32_t i = 0; i < n_out; i++) {
                outs[i] = np->output[i];
                if (!outs[i][0])
                        return ox_node_fail(L, ni, -ENOTSUP, "output %u is left out while a later one is not (not "
                                         "supported)", i);
        }
        int gi = graph_add_node(L->g, op, ox_str(np->name), in, n_in, outs, n_out, &a);
        if (gi < 0)
                return ox_node_fail(L, ni, gi, "the graph refuses it: %s", strerror(-gi));
        L->onnx_of[gi] = ni;
        struct graph_node *n = &L->g->nodes[gi];
        for (uint32_t i = 0; i < n_out; i++)
                ox_find(L, outs[i])->t = n->out[i];
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
        const char *op = ox_str(np->op_type), *dom = ox_str(np->domain);
        if (dom[0] && strcmp(dom, "ai.onnx") != 0)
                return ox_node_fail(L, ni, -ENOTSUP, "domain \"%.60s\" is not supported (only ONNX's default)", dom);
        if (strcmp(op, "Constant") == 0) {
                if (np->n_input != 0 || np->n_output != 1 || !np->output[0][0])
                        return ox_node_fail(L, ni, -EINVAL, "a Constant takes no inputs and gives one output");
                return ox_fold_constant(L, ni, ox_find(L, np->output[0]));
        }
        int r = ox_try_fold(L, ni);
        if (r != 0)
                return r < 0 ? r : 0;
        if (strcmp(op, "Cast") == 0) {
                /* to float, of a float: nothing to do */
                static const char *const ok[] = { "to", NULL };
                int64_t to;
                struct val *x = ox_node_in(L, ni, 0);
                if ((r = ox_attrs_only(L, ni, ok)) < 0 || (r = ox_attr_int(L, ni, "to", 0, &to)) < 0)
                        return r;
                if (x && to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT &&
                    (x->kind == V_PARAM || ((x->kind == V_INPUT || x->kind == V_NODE) && x->t >= 0 &&
                                            L->g->tensors[x->t].dtype == GDT_F32)))
                        return node_add(L, ni, GOP_IDENTITY, true);
        }
        int gop = graph_op_by_name(op);
        if (gop < 0) {
                if (fold_only(op))
                        return ox_node_fail(L, ni, -ENOTSUP, "op not in the supported set (it is folded over constants "
                                         "only, and its input is computed by the graph)");
                return ox_node_fail(L, ni, -ENOTSUP, "op not in the supported set");
        }
        return node_add(L, ni, (enum graph_op)gop, false);
}

/* ---- the graph: values, order, nodes ---- */

static int graph_inputs(struct ld *L)
{
        const Onnx__GraphProto *gp = L->gp;
        for (size_t i = 0; i < gp->n_input; i++) {
                const Onnx__ValueInfoProto *vi = gp->input[i];
                const char *nm = ox_str(vi->name);
                if (!nm[0])
                        return ox_fail(L, -EINVAL, "graph input %zu has no name", i);
                struct val *v = ox_find(L, nm);
                if (v && v->is_init)
                        continue; /* an initializer listed as an input too (IR < 4): the initializer */
                if (v)
                        return ox_fail(L, -EINVAL, "input \"%.100s\" is listed twice", nm);
                const Onnx__TypeProto *tp = vi->type;
                if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
                        return ox_fail(L, -ENOTSUP, "input \"%.100s\" is not a tensor", nm);
                const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
                int32_t et = tt->has_elem_type ? tt->elem_type : 0;
                if (et != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && et != ONNX__TENSOR_PROTO__DATA_TYPE__INT64)
                        return ox_fail(L, -ENOTSUP, "input \"%.100s\" has type %s: only float and int64 are supported",
                                    nm, ox_type_name(et));
                if (!tt->shape)
                        return ox_fail(L, -ENOTSUP, "input \"%.100s\" has no shape", nm);
                if (tt->shape->n_dim > GRAPH_MAX_RANK)
                        return ox_fail(L, -ENOTSUP, "input \"%.100s\" has rank %zu, at most %d is supported", nm,
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
                                return ox_fail(L, -ENOTSUP, "input \"%.100s\" dim %u is symbolic (\"%.60s\"): only the "
                                            "batch may be", nm, d, ox_str(dim->dim_param));
                        if (!val)
                                return ox_fail(L, -ENOTSUP, "input \"%.100s\" dim %u has no size: only the batch may be "
                                            "symbolic", nm, d);
                        if (dim->dim_value < 1 || dim->dim_value > INPUT_MAX_VALUES / per)
                                return ox_fail(L, -ENOTSUP, "input \"%.100s\" dim %u is %lld: dims are 1 to %lld values "
                                            "an example in all", nm, d, (long long)dim->dim_value,
                                            (long long)INPUT_MAX_VALUES);
                        s.dims[d] = dim->dim_value;
                        per *= dim->dim_value;
                }
                v = ox_add_val(L, nm, V_INPUT);
                v->dtype = et == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? GDT_F32 : GDT_I64;
                v->shape = s;
                int t = graph_add_tensor(L->g, nm, GT_INPUT, v->dtype, &s, NULL);
                if (t < 0)
                        return ox_fail(L, t, "input \"%.100s\": %s", nm, strerror(-t));
                v->t = t;
        }
        return 0;
}

static int initializers(struct ld *L)
{
        const Onnx__GraphProto *gp = L->gp;
        if (gp->n_sparse_initializer)
                return ox_fail(L, -ENOTSUP, "sparse initializers are not supported");
        for (size_t i = 0; i < gp->n_initializer; i++) {
                const Onnx__TensorProto *tp = gp->initializer[i];
                const char *nm = ox_str(tp->name);
                char why[300];
                if (!nm[0])
                        return ox_fail(L, -EINVAL, "initializer %zu has no name", i);
                if (ox_find(L, nm))
                        return ox_fail(L, -EINVAL, "initializer \"%.100s\" is listed twice", nm);
                struct tmeta m;
                int r = ox_tensor_meta(tp, &m, why, sizeof(why));
                if (r < 0)
                        return ox_fail(L, r, "initializer \"%.100s\": %s", nm, why);
                struct val *v = ox_add_val(L, nm, m.type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? V_PARAM : V_CONST);
                v->is_init = true;
                v->dtype = m.dtype;
                v->shape = m.shape;
                v->count = m.count;
                if (v->kind == V_PARAM) {
                        v->init = tp;
                        continue;
                }
                if (!(v->data = malloc(sizeof(int64_t) * (m.count ? m.count : 1))))
                        return ox_fail(L, -ENOMEM, "initializer \"%.100s\": out of memory", nm);
                ox_tensor_values(tp, &m, v->data);
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
                        struct val *v = ox_find(L, nm);
                        if (v && v->producer >= 0)
                                return ox_node_fail(L, (uint32_t)ni, -EINVAL, "output \"%.100s\" is also node %d's",
                                                 nm, v->producer);
                        if (v)
                                return ox_node_fail(L, (uint32_t)ni, -EINVAL, "output \"%.100s\" is also an %s", nm,
                                                 v->kind == V_INPUT ? "input" : "initializer");
                        v = ox_add_val(L, nm, V_NODE);
                        v->producer = (int32_t)ni;
                }
        }
        for (size_t ni = 0; ni < gp->n_node; ni++) {
                const Onnx__NodeProto *np = gp->node[ni];
                for (size_t j = 0; j < np->n_input; j++) {
                        if (!np->input[j][0])
                                continue;
                        struct val *v = ox_find(L, np->input[j]);
                        if (!v)
                                return ox_node_fail(L, (uint32_t)ni, -EINVAL, "input \"%.100s\" is no graph input, "
                                                 "initializer or node's output", np->input[j]);
                        v->consumers++;
                }
        }
        for (size_t i = 0; i < gp->n_output; i++) {
                const char *nm = ox_str(gp->output[i]->name);
                struct val *v = ox_find(L, nm);
                if (!v)
                        return ox_fail(L, -EINVAL, "output \"%.100s\" is no graph input, initializer or node's output",
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
                const char *op = ox_str(np->op_type);
                if (strcmp(op, "Shape") == 0)
                        continue;
                int gop = graph_op_by_name(op);
                uint32_t moved_from = UINT32_MAX, onnx_max;
                if (gop >= 0)
                        op_inputs((enum graph_op)gop, &moved_from, &onnx_max);
                for (size_t j = 0; j < np->n_input && j < moved_from; j++) {
                        struct val *v = ox_node_in(L, (uint32_t)ni, j);
                        if (v && v->kind == V_PARAM)
                                v->param_used = true;
                }
        }
        for (size_t i = 0; i < L->gp->n_initializer; i++) {
                struct val *v = ox_find(L, ox_str(gp->initializer[i]->name));
                char why[300];
                int32_t t;
                int r;
                if (v->kind == V_PARAM && (v->param_used || v->output) &&
                    (r = ox_val_tensor(L, v, &t, why, sizeof(why))) < 0)
                        return ox_fail(L, r, "initializer %s", why);
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
                r = ox_fail(L, -ENOMEM, "out of memory");
                goto out;
        }
        /* producer -> consumer edges, one per input slot, grouped by producer */
        for (uint32_t i = 0; i < n; i++)
                for (size_t j = 0; j < gp->node[i]->n_input; j++) {
                        struct val *v = ox_node_in(L, i, j);
                        if (v && v->producer >= 0) {
                                first[v->producer + 1]++;
                                deg[i]++;
                                n_edges++;
                        }
                }
        for (uint32_t i = 0; i < n; i++)
                first[i + 1] += first[i];
        if (!(edges = malloc(sizeof(uint32_t) * (n_edges ? n_edges : 1)))) {
                r = ox_fail(L, -ENOMEM, "out of memory");
                goto out;
        }
        {
                uint32_t *fill = heap; /* as a cursor per producer, before the heap is used */
                memcpy(fill, first, sizeof(uint32_t) * n);
                for (uint32_t i = 0; i < n; i++)
                        for (size_t j = 0; j < gp->node[i]->n_input; j++) {
                                struct val *v = ox_node_in(L, i, j);
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
                                struct val *v = ox_node_in(L, u, j);
                                if (v && v->producer >= 0 && deg[v->producer]) {
                                        u = (uint32_t)v->producer;
                                        break;
                                }
                        }
                r = ox_node_fail(L, u, -EINVAL, "on a cycle (its inputs depend on its outputs)");
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
                return ox_fail(L, -ENOTSUP, "too many values");
        L->cap_v = (uint32_t)cap;
        for (L->tab_cap = 16; L->tab_cap < 2 * cap;)
                L->tab_cap *= 2;
        L->v = calloc(cap ? cap : 1, sizeof(*L->v));
        L->tab = calloc(L->tab_cap, sizeof(uint32_t));
        L->onnx_of = calloc(gp->n_node ? gp->n_node : 1, sizeof(uint32_t));
        order = malloc(sizeof(uint32_t) * (gp->n_node ? gp->n_node : 1));
        if (!L->v || !L->tab || !L->onnx_of || !order) {
                r = ox_fail(L, -ENOMEM, "out of memory");
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
                struct val *v = ox_find(L, ox_str(gp->output[i]->name));
                char why[300];
                int32_t t;
                if ((r = ox_val_tensor(L, v, &t, why, sizeof(why))) < 0) {
                        r = ox_fail(L, r, "output %s", why);
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
                ox_val_clear(&L->v[i]);
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
                return ox_fail(&L, -EBADMSG, "not an ONNX model (protobuf does not parse)");
        if (!m->graph) {
                r = ox_fail(&L, -EBADMSG, "not an ONNX model (no graph)");
                goto out;
        }
        bool opset = false;
        for (size_t i = 0; i < m->n_opset_import; i++) {
                const Onnx__OperatorSetIdProto *o = m->opset_import[i];
                const char *d = ox_str(o->domain);
                if (d[0] && strcmp(d, "ai.onnx") != 0)
                        continue; /* other domains (ai.onnx.ml): imported is fine, a node of one is refused */
                int64_t v = o->has_version ? o->version : 0;
                if (v < OPSET_MIN || v > OPSET_MAX) {
                        r = ox_fail(&L, -ENOTSUP, "opset %lld is not supported (ONNX's default domain: %d to %d)",
                                 (long long)v, OPSET_MIN, OPSET_MAX);
                        goto out;
                }
                opset = true;
        }
        if (!opset) {
                r = ox_fail(&L, -ENOTSUP, "no opset of ONNX's default domain is imported (%d to %d are supported)",
                         OPSET_MIN, OPSET_MAX);
                goto out;
        }
        L.gp = m->graph;
        if (!(L.g = graph_new())) {
                r = ox_fail(&L, -ENOMEM, "out of memory");
                goto out;
        }
        if ((r = load_graph(&L)) < 0)
                goto out;
        /* the graph's first output is what a model's head reads */
        L.g->loss = m->graph->n_output ? graph_find(L.g, ox_str(m->graph->output[0]->name)) : -1;
        if (L.g->loss < 0) {
                r = ox_fail(&L, -EINVAL, "the graph has no output");
                goto out;
        }
        char fe[512] = "";
        if ((r = graph_finalize(L.g, fe, sizeof(fe))) < 0) {
                /* its node indices are the graph's, in the order the nodes were added: the file's are wanted */
                unsigned gi;
                int at = 0;
                if (sscanf(fe, "node %u (%n", &gi, &at) == 1 && at > 0 && gi < L.g->n_nodes)
                        r = ox_fail(&L, r, "node %u (%s", L.onnx_of[gi], fe + at);
                else
                        r = ox_fail(&L, r, "%s", fe);
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
