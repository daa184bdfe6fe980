/* The ONNX loader's folds (onnx_load-internal.h): Constant nodes, and the shape arithmetic exporters
 * emit around Reshape and Flatten, computed over constants as the file loads; the batch size read by
 * Shape stays a marker that may only end up first in a Reshape's target. */
#include "onnx_load-internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Constant nodes ---- */

int ox_fold_constant(struct ld *L, uint32_t ni, struct val *o)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        char why[300];
        if (np->n_attribute != 1)
                return ox_node_fail(L, ni, -EINVAL, "%zu attributes: a Constant takes exactly one", np->n_attribute);
        const Onnx__AttributeProto *a = np->attribute[0];
        const char *an = ox_str(a->name);
        struct graph_shape s = { 0 };
        int r;
        if (strcmp(an, "value") == 0) {
                if (!ox_attr_is(a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR) || !a->t)
                        return ox_node_fail(L, ni, -EINVAL, "attribute \"value\" is not a tensor");
                struct tmeta m;
                if ((r = ox_tensor_meta(a->t, &m, why, sizeof(why))) < 0 ||
                    (r = ox_const_new(o, m.dtype, &m.shape, why, sizeof(why))) < 0)
                        return ox_node_fail(L, ni, r, "its value: %s", why);
                ox_tensor_values(a->t, &m, o->data);
        } else if (strcmp(an, "value_float") == 0 || strcmp(an, "value_floats") == 0 || strcmp(an, "value_int") == 0 ||
                   strcmp(an, "value_ints") == 0) {
                /* value_float, value_floats, value_int, value_ints: one value, or a list (rank 1) */
                bool fl = an[6] == 'f', one = an[fl ? 11 : 9] == 0;
                Onnx__AttributeProto__AttributeType want =
                        fl ? (one ? ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT : ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS)
                           : (one ? ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT : ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
                if (!ox_attr_is(a, want))
                        return ox_node_fail(L, ni, -EINVAL, "attribute \"%s\" is not a%s %s%s", an, fl ? "" : "n",
                                         fl ? "float" : "int", one ? "" : " list");
                size_t n = fl ? a->n_floats : a->n_ints, size = fl ? sizeof(float) : sizeof(int64_t);
                const void *one_v = fl ? (const void *)&a->f : (const void *)&a->i;
                const void *list = fl ? (const void *)a->floats : (const void *)a->ints;
                s.rank = one ? 0 : 1;
                s.dims[0] = (int64_t)n;
                if ((r = ox_const_new(o, fl ? GDT_F32 : GDT_I64, &s, why, sizeof(why))) < 0)
                        return ox_node_fail(L, ni, r, "%s", why);
                if (one)
                        memcpy(o->data, one_v, size);
                else if (n)
                        memcpy(o->data, list, size * n);
        } else {
                return ox_node_fail(L, ni, -ENOTSUP, "attribute \"%.60s\" is not supported (value, value_float(s) and "
                                 "value_int(s) are)", an);
        }
        ox_const_trim(o);
        return 0;
}

/* ---- folding the shape arithmetic ---- */

/* Input slot i of the node (NULL when left out: past the end or ""). */
struct val *ox_node_in(struct ld *L, uint32_t ni, size_t i)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        if (i >= np->n_input || !np->input[i][0])
                return NULL;
        return ox_find(L, np->input[i]);
}

static bool ox_is_const(const struct val *v)
{
        return v && v->kind == V_CONST;
}

/* A constant int64 list (rank 0 or 1) of at most max values, no batch size among them. */
int ox_const_ints(struct ld *L, uint32_t ni, size_t slot, const char *what, uint32_t max, int64_t *out,
                      uint32_t *n_ret)
{
        struct val *v = ox_node_in(L, ni, slot);
        if (!v)
                return ox_node_fail(L, ni, -EINVAL, "input %zu (%s) is required", slot, what);
        if (v->kind != V_CONST && v->kind != V_PARAM)
                return ox_node_fail(L, ni, -ENOTSUP, "input %zu \"%.100s\" (%s) is not a constant (the graph engine "
                                 "takes it only as one)", slot, v->name, what);
        if (v->dtype != GDT_I64 || v->kind == V_PARAM)
                return ox_node_fail(L, ni, -EINVAL, "input %zu \"%.100s\" (%s) is not int64", slot, v->name, what);
        if (v->shape.rank > 1)
                return ox_node_fail(L, ni, -EINVAL, "input %zu \"%.100s\" (%s) has rank %u, needs 1", slot, v->name,
                                 what, v->shape.rank);
        if (v->count > max)
                return ox_node_fail(L, ni, -ENOTSUP, "input %zu \"%.100s\" (%s) has %zu values, at most %u are "
                                 "supported", slot, v->name, what, v->count, max);
        for (size_t i = 0; i < v->count; i++)
                if (ox_marked(v, i))
                        return ox_node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: %s holds the "
                                         "batch size", what);
        memcpy(out, v->data, sizeof(int64_t) * v->count);
        *n_ret = (uint32_t)v->count;
        return 0;
}

/* An axis in [-rank, rank) made non-negative, for the folds. */
static int ox_fold_axis(struct ld *L, uint32_t ni, int64_t axis, uint32_t rank, uint32_t *ret)
{
        if (graph_axis(axis, rank, ret) < 0)
                return ox_node_fail(L, ni, -EINVAL, "axis %lld is out of range for rank %u", (long long)axis, rank);
        return 0;
}

static int ox_fold_shape(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        static const char *const ok[] = { "start", "end", NULL };
        int64_t start, end;
        struct graph_shape s = ox_val_shape(L, x), os = { .rank = 1 };
        int r;
        if ((r = ox_attrs_only(L, ni, ok)) < 0 || (r = ox_attr_int(L, ni, "start", 0, &start)) < 0 ||
            (r = ox_attr_int(L, ni, "end", s.rank, &end)) < 0)
                return r;
        int64_t R = s.rank;
        start = start < 0 ? start + R : start;
        end = end < 0 ? end + R : end;
        start = start < 0 ? 0 : start > R ? R : start;
        end = end < 0 ? 0 : end > R ? R : end;
        os.dims[0] = end > start ? end - start : 0;
        char why[200];
        if ((r = ox_const_new(o, GDT_I64, &os, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        for (int64_t i = 0; i < os.dims[0]; i++) {
                int64_t d = s.dims[start + i];
                ((int64_t *)o->data)[i] = d == GRAPH_BATCH ? 0 : d;
                o->batch[i] = d == GRAPH_BATCH;
        }
        ox_const_trim(o);
        return 0;
}

static int ox_fold_gather(struct ld *L, uint32_t ni, struct val *d, struct val *ix, struct val *o)
{
        static const char *const ok[] = { "axis", NULL };
        int64_t axis;
        int r;
        if ((r = ox_attrs_only(L, ni, ok)) < 0 || (r = ox_attr_int(L, ni, "axis", 0, &axis)) < 0)
                return r;
        if (ix->dtype != GDT_I64)
                return ox_node_fail(L, ni, -EINVAL, "the indices \"%.100s\" are not int64", ix->name);
        if (d->shape.rank == 0)
                return ox_node_fail(L, ni, -EINVAL, "the data \"%.100s\" is a scalar", d->name);
        uint32_t ax;
        if ((r = ox_fold_axis(L, ni, axis, d->shape.rank, &ax)) < 0)
                return r;
        uint32_t R = d->shape.rank - 1 + ix->shape.rank;
        if (R > GRAPH_MAX_RANK)
                return ox_node_fail(L, ni, -ENOTSUP, "the output would have rank %u, at most %d is supported", R,
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
                if (ox_marked(ix, k))
                        return ox_node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: index %zu is the "
                                         "batch size", k);
                if (idx[k] < -(int64_t)A || idx[k] >= (int64_t)A)
                        return ox_node_fail(L, ni, -EINVAL, "index %lld is out of range for dim %zu", (long long)idx[k],
                                         A);
        }
        char why[200];
        if ((r = ox_const_new(o, d->dtype, &os, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        size_t at = 0;
        for (size_t p = 0; p < outer; p++)
                for (size_t k = 0; k < ix->count; k++, at += inner)
                        ox_const_copy(o, at, d, (p * A + (size_t)(idx[k] < 0 ? idx[k] + (int64_t)A : idx[k])) * inner,
                                   inner);
        ox_const_trim(o);
        return 0;
}

static int ox_fold_unsqueeze(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        int64_t axes[GRAPH_MAX_RANK];
        uint32_t n, ax;
        int r;
        static const char *const ok[] = { NULL };
        if ((r = ox_attrs_only(L, ni, ok)) < 0 ||
            (r = ox_const_ints(L, ni, 1, "axes", GRAPH_MAX_RANK, axes, &n)) < 0)
                return r;
        uint32_t R = x->shape.rank + n;
        if (R > GRAPH_MAX_RANK)
                return ox_node_fail(L, ni, -ENOTSUP, "the output would have rank %u, at most %d is supported", R,
                                 GRAPH_MAX_RANK);
        bool ins[GRAPH_MAX_RANK] = { false };
        for (uint32_t i = 0; i < n; i++) {
                if ((r = ox_fold_axis(L, ni, axes[i], R, &ax)) < 0)
                        return r;
                if (ins[ax])
                        return ox_node_fail(L, ni, -EINVAL, "axes list axis %u twice", ax);
                ins[ax] = true;
        }
        struct graph_shape os = { .rank = R };
        for (uint32_t i = 0, j = 0; i < R; i++)
                os.dims[i] = ins[i] ? 1 : x->shape.dims[j++];
        char why[200];
        if ((r = ox_const_new(o, x->dtype, &os, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        ox_const_copy(o, 0, x, 0, x->count);
        ox_const_trim(o);
        return 0;
}

static int ox_fold_squeeze(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        int64_t axes[GRAPH_MAX_RANK];
        uint32_t n = 0, ax;
        int r;
        static const char *const ok[] = { NULL };
        if ((r = ox_attrs_only(L, ni, ok)) < 0)
                return r;
        if (ox_node_in(L, ni, 1) && (r = ox_const_ints(L, ni, 1, "axes", GRAPH_MAX_RANK, axes, &n)) < 0)
                return r;
        bool drop[GRAPH_MAX_RANK] = { false };
        for (uint32_t i = 0; i < n; i++) {
                if ((r = ox_fold_axis(L, ni, axes[i], x->shape.rank, &ax)) < 0)
                        return r;
                if (x->shape.dims[ax] != 1)
                        return ox_node_fail(L, ni, -EINVAL, "axis %u has dim %lld, not 1", ax,
                                         (long long)x->shape.dims[ax]);
                drop[ax] = true;
        }
        struct graph_shape os = { 0 };
        for (uint32_t i = 0; i < x->shape.rank; i++)
                if (!(n ? drop[i] : x->shape.dims[i] == 1))
                        os.dims[os.rank++] = x->shape.dims[i];
        char why[200];
        if ((r = ox_const_new(o, x->dtype, &os, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        ox_const_copy(o, 0, x, 0, x->count);
        ox_const_trim(o);
        return 0;
}

static int ox_fold_concat(struct ld *L, uint32_t ni, struct val *o)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        static const char *const ok[] = { "axis", NULL };
        int r;
        if ((r = ox_attrs_only(L, ni, ok)) < 0)
                return r;
        if (!ox_attr_find(np, "axis"))
                return ox_node_fail(L, ni, -EINVAL, "attribute \"axis\" is required");
        int64_t axis;
        if ((r = ox_attr_int(L, ni, "axis", 0, &axis)) < 0)
                return r;
        struct val *x0 = ox_node_in(L, ni, 0);
        if (x0->shape.rank == 0)
                return ox_node_fail(L, ni, -EINVAL, "input 0 is a scalar");
        uint32_t ax;
        if ((r = ox_fold_axis(L, ni, axis, x0->shape.rank, &ax)) < 0)
                return r;
        struct graph_shape os = x0->shape;
        os.dims[ax] = 0;
        for (size_t i = 0; i < np->n_input; i++) {
                struct val *x = ox_node_in(L, ni, i);
                if (x->dtype != x0->dtype || x->shape.rank != x0->shape.rank)
                        return ox_node_fail(L, ni, -EINVAL, "input %zu's type or rank differs from input 0's", i);
                for (uint32_t d = 0; d < os.rank; d++)
                        if (d != ax && x->shape.dims[d] != x0->shape.dims[d])
                                return ox_node_fail(L, ni, -EINVAL, "input %zu has dim %u = %lld, input 0 %lld", i, d,
                                                 (long long)x->shape.dims[d], (long long)x0->shape.dims[d]);
                os.dims[ax] += x->shape.dims[ax];
                if (os.dims[ax] > (int64_t)CONST_MAX_SPAN)
                        break; /* const_new refuses it */
        }
        char why[200];
        if ((r = ox_const_new(o, x0->dtype, &os, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        size_t outer = 1, inner = 1, at = 0;
        for (uint32_t d = 0; d < ax; d++)
                outer *= (size_t)os.dims[d];
        for (uint32_t d = ax + 1; d < os.rank; d++)
                inner *= (size_t)os.dims[d];
        if (o->count == 0)
                return 0;
        struct val **xs = malloc(sizeof(*xs) * np->n_input);
        if (!xs)
                return ox_node_fail(L, ni, -ENOMEM, "out of memory");
        for (size_t i = 0; i < np->n_input; i++)
                xs[i] = ox_node_in(L, ni, i);
        for (size_t p = 0; p < outer; p++)
                for (size_t i = 0; i < np->n_input; i++) {
                        size_t run = (size_t)xs[i]->shape.dims[ax] * inner;
                        ox_const_copy(o, at, xs[i], p * run, run);
                        at += run;
                }
        free(xs);
        ox_const_trim(o);
        return 0;
}

/* Steps through the indices of a shape (an odometer); false after the last. */
static bool ox_odometer(const struct graph_shape *s, int64_t *idx)
{
        for (uint32_t i = s->rank; i-- > 0;) {
                if (++idx[i] < s->dims[i])
                        return true;
                idx[i] = 0;
        }
        return false;
}

static void ox_strides_of(const struct graph_shape *s, int64_t *st)
{
        int64_t k = 1;
        for (uint32_t i = s->rank; i-- > 0;) {
                st[i] = k;
                k *= s->dims[i] ? s->dims[i] : 1;
        }
}

static int ox_fold_slice(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        static const char *const ok[] = { NULL };
        int64_t starts[GRAPH_MAX_RANK], ends[GRAPH_MAX_RANK], axes[GRAPH_MAX_RANK], steps[GRAPH_MAX_RANK];
        uint32_t ns, ne, na, nst, R = x->shape.rank;
        int r;
        if ((r = ox_attrs_only(L, ni, ok)) < 0 || (r = ox_const_ints(L, ni, 1, "starts", R, starts, &ns)) < 0 ||
            (r = ox_const_ints(L, ni, 2, "ends", R, ends, &ne)) < 0)
                return r;
        na = nst = ns;
        for (uint32_t i = 0; i < ns; i++)
                axes[i] = i, steps[i] = 1;
        if (ox_node_in(L, ni, 3) && (r = ox_const_ints(L, ni, 3, "axes", R, axes, &na)) < 0)
                return r;
        if (ox_node_in(L, ni, 4) && (r = ox_const_ints(L, ni, 4, "steps", R, steps, &nst)) < 0)
                return r;
        if (ne != ns || na != ns || nst != ns)
                return ox_node_fail(L, ni, -EINVAL, "starts, ends, axes and steps differ in length");
        int64_t b[GRAPH_MAX_RANK], st[GRAPH_MAX_RANK];
        struct graph_shape os = x->shape;
        bool seen[GRAPH_MAX_RANK] = { false };
        for (uint32_t d = 0; d < R; d++)
                b[d] = 0, st[d] = 1;
        for (uint32_t i = 0; i < ns; i++) {
                uint32_t ax;
                if ((r = ox_fold_axis(L, ni, axes[i], R, &ax)) < 0)
                        return r;
                if (seen[ax])
                        return ox_node_fail(L, ni, -EINVAL, "axes list axis %u twice", ax);
                seen[ax] = true;
                int64_t D = x->shape.dims[ax], s = starts[i], e = ends[i], k = steps[i];
                if (k == 0)
                        return ox_node_fail(L, ni, -EINVAL, "step 0 on axis %u", ax);
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
        if ((r = ox_const_new(o, x->dtype, &os, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        int64_t xs[GRAPH_MAX_RANK], idx[GRAPH_MAX_RANK] = { 0 };
        ox_strides_of(&x->shape, xs);
        for (size_t j = 0; j < o->count; j++, ox_odometer(&os, idx)) {
                int64_t src = 0;
                for (uint32_t d = 0; d < R; d++)
                        src += (b[d] + idx[d] * st[d]) * xs[d];
                ox_const_copy1(o, j, x, (size_t)src);
        }
        ox_const_trim(o);
        return 0;
}

static int ox_fold_transpose(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        static const char *const ok[] = { "perm", NULL };
        const Onnx__AttributeProto *pa = ox_attr_find(L->gp->node[ni], "perm");
        uint32_t R = x->shape.rank, perm[GRAPH_MAX_RANK];
        bool seen[GRAPH_MAX_RANK] = { false };
        int r;
        if ((r = ox_attrs_only(L, ni, ok)) < 0)
                return r;
        if (pa && (!ox_attr_is(pa, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS) || pa->n_ints != R))
                return ox_node_fail(L, ni, -EINVAL, "perm is not a list of %u ints", R);
        for (uint32_t i = 0; i < R; i++) {
                int64_t p = pa ? pa->ints[i] : (int64_t)(R - 1 - i);
                if (p < 0 || p >= (int64_t)R || seen[p])
                        return ox_node_fail(L, ni, -EINVAL, "perm is not a permutation of 0..%u", R - 1);
                seen[p] = true;
                perm[i] = (uint32_t)p;
        }
        struct graph_shape os = { .rank = R };
        for (uint32_t i = 0; i < R; i++)
                os.dims[i] = x->shape.dims[perm[i]];
        char why[200];
        if ((r = ox_const_new(o, x->dtype, &os, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        int64_t xs[GRAPH_MAX_RANK], idx[GRAPH_MAX_RANK] = { 0 };
        ox_strides_of(&x->shape, xs);
        for (size_t j = 0; j < o->count; j++, ox_odometer(&os, idx)) {
                int64_t src = 0;
                for (uint32_t d = 0; d < R; d++)
                        src += idx[d] * xs[perm[d]];
                ox_const_copy1(o, j, x, (size_t)src);
        }
        ox_const_trim(o);
        return 0;
}

static int ox_fold_cast(struct ld *L, uint32_t ni, struct val *x, int64_t to, struct val *o)
{
        enum graph_dtype dt = to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? GDT_F32 : GDT_I64;
        char why[200];
        int r;
        if ((r = ox_const_new(o, dt, &x->shape, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        for (size_t i = 0; i < x->count; i++) {
                if (dt == x->dtype) {
                        ox_const_copy1(o, i, x, i);
                } else if (dt == GDT_F32) {
                        if (ox_marked(x, i))
                                return ox_node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: the batch "
                                                 "size cast to float");
                        ((float *)o->data)[i] = (float)((int64_t *)x->data)[i];
                } else {
                        float f = ((float *)x->data)[i];
                        if (!(f > -9.2e18f && f < 9.2e18f))
                                return ox_node_fail(L, ni, -EINVAL, "value %zu (%g) does not fit an int64", i, (double)f);
                        ((int64_t *)o->data)[i] = (int64_t)f;
                }
                if (to == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 && !ox_marked(o, i)) {
                        int64_t q = ((int64_t *)o->data)[i];
                        if (q < INT32_MIN || q > INT32_MAX)
                                return ox_node_fail(L, ni, -EINVAL, "value %zu (%lld) does not fit an int32", i,
                                                 (long long)q);
                }
        }
        ox_const_trim(o);
        return 0;
}

/* ONNX's Reshape (allowzero 0) of a constant. */
static int ox_fold_reshape(struct ld *L, uint32_t ni, struct val *x, struct val *o)
{
        static const char *const ok[] = { "allowzero", NULL };
        int64_t t[GRAPH_MAX_RANK];
        uint32_t n;
        int r;
        if ((r = ox_attrs_only(L, ni, ok)) < 0 || (r = ox_const_ints(L, ni, 1, "shape", GRAPH_MAX_RANK, t, &n)) < 0)
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
                        return ox_node_fail(L, ni, -EINVAL, "the target's dim %u (%lld) does not fit the constant's %zu "
                                         "values", i, (long long)t[i], x->count);
                known *= (size_t)os.dims[i];
                if (known > x->count)
                        break;
        }
        if (infer >= 0 && known && known <= x->count)
                os.dims[infer] = (int64_t)(x->count / known);
        size_t c;
        if (ox_shape_count(&os, &c) < 0 || c != x->count)
                return ox_node_fail(L, ni, -EINVAL, "the target does not hold the constant's %zu values", x->count);
        char why[200];
        if ((r = ox_const_new(o, x->dtype, &os, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        ox_const_copy(o, 0, x, 0, x->count);
        ox_const_trim(o);
        return 0;
}

/* Add, Sub, Mul, Div of two int64 constants (broadcasting); the batch size takes no part. */
static int ox_fold_arith(struct ld *L, uint32_t ni, const char *op, struct val *a, struct val *b, struct val *o)
{
        static const char *const ok[] = { NULL };
        int r;
        if ((r = ox_attrs_only(L, ni, ok)) < 0)
                return r;
        if (ox_any_marked(a) || ox_any_marked(b))
                return ox_node_fail(L, ni, -ENOTSUP, "a shape that does not fold to static: arithmetic on the batch "
                                 "size");
        struct graph_shape os = { .rank = a->shape.rank > b->shape.rank ? a->shape.rank : b->shape.rank };
        int64_t as[GRAPH_MAX_RANK], bs[GRAPH_MAX_RANK], sa[GRAPH_MAX_RANK], sb[GRAPH_MAX_RANK];
        ox_strides_of(&a->shape, sa);
        ox_strides_of(&b->shape, sb);
        for (uint32_t i = 0; i < os.rank; i++) {
                uint32_t ia = i + a->shape.rank - os.rank, ib = i + b->shape.rank - os.rank;
                int64_t da = i < os.rank - a->shape.rank ? 1 : a->shape.dims[ia];
                int64_t db = i < os.rank - b->shape.rank ? 1 : b->shape.dims[ib];
                as[i] = da == 1 || i < os.rank - a->shape.rank ? 0 : sa[ia];
                bs[i] = db == 1 || i < os.rank - b->shape.rank ? 0 : sb[ib];
                if (da != db && da != 1 && db != 1)
                        return ox_node_fail(L, ni, -EINVAL, "shapes do not broadcast: dim %u is %lld and %lld", i,
                                         (long long)da, (long long)db);
                os.dims[i] = da == 1 ? db : da;
        }
        char why[200];
        if ((r = ox_const_new(o, GDT_I64, &os, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        int64_t idx[GRAPH_MAX_RANK] = { 0 };
        const int64_t *x = a->data, *y = b->data;
        int64_t *z = o->data;
        for (size_t j = 0; j < o->count; j++, ox_odometer(&os, idx)) {
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
                                return ox_node_fail(L, ni, -EINVAL, "%lld / %lld", (long long)x[ia], (long long)y[ib]);
                        z[j] = x[ia] / y[ib];
                        break;
                }
        }
        ox_const_trim(o);
        return 0;
}

static int ox_fold_constant_of_shape(struct ld *L, uint32_t ni, struct val *o)
{
        static const char *const ok[] = { "value", NULL };
        int64_t dims[GRAPH_MAX_RANK];
        uint32_t n;
        int r;
        if ((r = ox_attrs_only(L, ni, ok)) < 0 ||
            (r = ox_const_ints(L, ni, 0, "shape", GRAPH_MAX_RANK, dims, &n)) < 0)
                return r;
        struct graph_shape os = { .rank = n };
        memcpy(os.dims, dims, sizeof(int64_t) * n);
        const Onnx__AttributeProto *va = ox_attr_find(L->gp->node[ni], "value");
        struct val fill = { .dtype = GDT_F32 };
        float zero = 0;
        fill.data = &zero;
        char why[200];
        struct tmeta m;
        int64_t q = 0;
        float f = 0;
        if (va) {
                if (!ox_attr_is(va, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR) || !va->t)
                        return ox_node_fail(L, ni, -EINVAL, "attribute \"value\" is not a tensor");
                if ((r = ox_tensor_meta(va->t, &m, why, sizeof(why))) < 0)
                        return ox_node_fail(L, ni, r, "its value: %s", why);
                if (m.count != 1)
                        return ox_node_fail(L, ni, -EINVAL, "its value has %zu values, needs 1", m.count);
                fill.dtype = m.dtype;
                fill.data = m.dtype == GDT_I64 ? (void *)&q : (void *)&f;
                ox_tensor_values(va->t, &m, fill.data);
        }
        if ((r = ox_const_new(o, fill.dtype, &os, why, sizeof(why))) < 0)
                return ox_node_fail(L, ni, r, "%s", why);
        fill.count = 1;
        for (size_t i = 0; i < o->count; i++)
                ox_const_copy1(o, i, &fill, 0);
        ox_const_trim(o);
        return 0;
}

/* Folds the node when it computes a constant from constants: 1 when it did, 0 when it is left to the
 * graph, -errno. */
int ox_try_fold(struct ld *L, uint32_t ni)
{
        const Onnx__NodeProto *np = L->gp->node[ni];
        const char *op = ox_str(np->op_type);
        struct val *x = ox_node_in(L, ni, 0), *y = ox_node_in(L, ni, 1);
        bool all = np->n_input > 0;
        for (size_t i = 0; i < np->n_input; i++)
                all &= ox_is_const(ox_node_in(L, ni, i)) || !np->input[i][0];
        struct val *o = np->n_output ? ox_find(L, np->output[0]) : NULL;
        bool can;
        if (strcmp(op, "Shape") == 0)
                can = x != NULL;
        else if (strcmp(op, "Gather") == 0 || strcmp(op, "Concat") == 0 || strcmp(op, "Identity") == 0 ||
                 strcmp(op, "Transpose") == 0 || strcmp(op, "ConstantOfShape") == 0)
                can = all;
        else if (strcmp(op, "Unsqueeze") == 0 || strcmp(op, "Squeeze") == 0 || strcmp(op, "Slice") == 0 ||
                 strcmp(op, "Reshape") == 0 || strcmp(op, "Cast") == 0)
                can = ox_is_const(x);
        else if (strcmp(op, "Add") == 0 || strcmp(op, "Sub") == 0 || strcmp(op, "Mul") == 0 ||
                 strcmp(op, "Div") == 0)
                can = ox_is_const(x) && ox_is_const(y) && x->dtype == GDT_I64 && y->dtype == GDT_I64;
        else
                return 0;
        if (!can)
                return 0;
        if (!o || np->n_output != 1)
                return ox_node_fail(L, ni, -EINVAL, "%zu outputs; it gives 1", np->n_output);
        if (!x && strcmp(op, "Concat") != 0)
                return ox_node_fail(L, ni, -EINVAL, "input 0 is required");
        if (np->n_input == 0)
                return ox_node_fail(L, ni, -EINVAL, "no inputs");
        int r;
        if (strcmp(op, "Shape") == 0) {
                r = ox_fold_shape(L, ni, x, o);
        } else if (strcmp(op, "Gather") == 0) {
                r = y ? ox_fold_gather(L, ni, x, y, o) : ox_node_fail(L, ni, -EINVAL, "input 1 (indices) is required");
        } else if (strcmp(op, "Concat") == 0) {
                for (size_t i = 0; i < np->n_input; i++)
                        if (!ox_node_in(L, ni, i))
                                return ox_node_fail(L, ni, -EINVAL, "input %zu is left out", i);
                r = ox_fold_concat(L, ni, o);
        } else if (strcmp(op, "Identity") == 0) {
                static const char *const ok[] = { NULL };
                char why[200];
                if ((r = ox_attrs_only(L, ni, ok)) < 0)
                        return r;
                if ((r = ox_const_new(o, x->dtype, &x->shape, why, sizeof(why))) < 0)
                        return ox_node_fail(L, ni, r, "%s", why);
                ox_const_copy(o, 0, x, 0, x->count);
                ox_const_trim(o);
        } else if (strcmp(op, "Transpose") == 0) {
                r = ox_fold_transpose(L, ni, x, o);
        } else if (strcmp(op, "ConstantOfShape") == 0) {
                r = ox_fold_constant_of_shape(L, ni, o);
        } else if (strcmp(op, "Unsqueeze") == 0) {
                r = ox_fold_unsqueeze(L, ni, x, o);
        } else if (strcmp(op, "Squeeze") == 0) {
                r = ox_fold_squeeze(L, ni, x, o);
        } else if (strcmp(op, "Slice") == 0) {
                r = ox_fold_slice(L, ni, x, o);
        } else if (strcmp(op, "Reshape") == 0) {
                r = ox_fold_reshape(L, ni, x, o);
        } else if (strcmp(op, "Cast") == 0) {
                static const char *const ok[] = { "to", NULL };
                int64_t to;
                if ((r = ox_attrs_only(L, ni, ok)) < 0 || (r = ox_attr_int(L, ni, "to", 0, &to)) < 0)
                        return r;
                if (to != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && to != ONNX__TENSOR_PROTO__DATA_TYPE__INT64 &&
                    to != ONNX__TENSOR_PROTO__DATA_TYPE__INT32)
                        return ox_node_fail(L, ni, -ENOTSUP, "Cast to %s is not supported (float, int64 and int32 are)",
                                         ox_type_name((int32_t)to));
                r = ox_fold_cast(L, ni, x, to, o);
        } else {
                r = ox_fold_arith(L, ni, op, x, y, o);
        }
        return r < 0 ? r : 1;
}
