/* The graph engine's data-movement ops (ONNX opsets 13 to 17): Flatten, Reshape, Squeeze, Unsqueeze and
 * Identity (the same bytes under another shape), Transpose, Concat, Gather and Pad (constant mode). Their
 * shape functions keep the batch symbolic (as dim 0) wherever the count per example stays static. */
#include "graph-internal.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

/* The largest dimension or pad a shape function takes: products of such values stay far from
 * int64's range (graph_infer_node refuses outputs past 2^40 values an example anyway). */
#define DIM_LIMIT ((int64_t)1 << 40)

/* ---- shape functions ---- */

static __attribute__((format(printf, 3, 4))) int why(char *err, size_t errlen, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        if (err && errlen)
                vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

/* How many dims of s are the batch; the first of them in *ax (-1: none). */
static unsigned batch_axes(const struct graph_shape *s, int *ax)
{
        unsigned nb = 0;
        *ax = -1;
        for (uint32_t i = 0; i < s->rank; i++)
                if (s->dims[i] == GRAPH_BATCH && nb++ == 0)
                        *ax = (int)i;
        return nb;
}

/* The product of the dims that are not the batch. */
static int64_t static_count(const struct graph_shape *s)
{
        int64_t c = 1;
        for (uint32_t i = 0; i < s->rank; i++)
                if (s->dims[i] != GRAPH_BATCH)
                        c *= s->dims[i];
        return c;
}

/* The input shape, or NULL with why in err when the input is left out (the table's counts allow -1 for
 * an optional input; none of these ops has one). */
static const struct graph_shape *in_shape(const struct graph *g, const struct graph_node *n, uint32_t i, char *err,
                                          size_t errlen)
{
        if (i >= n->n_in || n->in[i] < 0) {
                why(err, errlen, "input %u is missing", i);
                return NULL;
        }
        return graph_in_shape(g, n, i);
}

/* dims [lo, hi) of s folded into one: the batch survives the fold only beside dims of 1, since the
 * output's count per example has to stay static (B x 3 is not a shape the engine can hold). */
static int fold(const struct graph_shape *s, uint32_t lo, uint32_t hi, int64_t *ret, char *err, size_t errlen)
{
        bool batch = false;
        int64_t c = 1;
        for (uint32_t i = lo; i < hi; i++) {
                if (s->dims[i] == GRAPH_BATCH)
                        batch = true;
                else
                        c *= s->dims[i];
        }
        if (batch && c != 1)
                return why(err, errlen, "dims %u..%u hold the batch and %lld more per example: the output dim would "
                           "be a multiple of the batch", lo, hi - 1, (long long)c);
        *ret = batch ? GRAPH_BATCH : c;
        return 0;
}

/* graph.c holds the batch as dims[0] only (an input's, and so every output's): an op that would move it
 * elsewhere is refused here, with the reason, rather than as an output that is "not static". */
static int set_out(struct graph_shape *out, const struct graph_shape *o, char *err, size_t errlen)
{
        for (uint32_t i = 1; i < o->rank; i++)
                if (o->dims[i] == GRAPH_BATCH)
                        return why(err, errlen, "the batch would be the output's dim %u; it has to stay dim 0", i);
        *out = *o;
        return 0;
}

GRAPH_SHAPE_FN(gs_flatten)
{
        const struct graph_shape *s = in_shape(g, n, 0, err, errlen);
        if (!s)
                return -EINVAL;
        /* Flatten alone takes axis in [-rank, rank]: rank makes (everything, 1) */
        int64_t r = s->rank, axis = n->a.axis < 0 ? n->a.axis + r : n->a.axis;
        if (axis < 0 || axis > r)
                return why(err, errlen, "axis %lld is out of range for rank %lld", (long long)n->a.axis, (long long)r);
        struct graph_shape o = { .rank = 2 };
        int rc = fold(s, 0, (uint32_t)axis, &o.dims[0], err, errlen);
        if (rc == 0)
                rc = fold(s, (uint32_t)axis, s->rank, &o.dims[1], err, errlen);
        return rc < 0 ? rc : set_out(out, &o, err, errlen);
}

/* ONNX's Reshape with allowzero=0: 0 copies the input's dim at that index, one -1 takes what is left.
 * The batch goes through when the target carries it: a 0 at the batch's own index copies it, else the -1
 * becomes it, which holds only when the other target dims account for exactly one example. With the batch
 * first in the input that means a target of (0, ...) or (-1, ...); set_out refuses it anywhere else. */
GRAPH_SHAPE_FN(gs_reshape)
{
        const struct graph_shape *s = in_shape(g, n, 0, err, errlen);
        if (!s)
                return -EINVAL;
        const struct graph_attrs *a = &n->a;
        if (a->n_shape > GRAPH_MAX_RANK)
                return why(err, errlen, "the target has %u dims, at most %d are supported", a->n_shape,
                           GRAPH_MAX_RANK);
        int bin;
        if (batch_axes(s, &bin) > 1)
                return why(err, errlen, "the input holds the batch twice");
        int64_t per = static_count(s); /* values per example (all of them without a batch) */
        struct graph_shape o = { .rank = a->n_shape };
        int infer = -1, bout = -1;
        int64_t known = 1; /* product of the output dims that are neither the batch nor the -1 */
        for (uint32_t i = 0; i < a->n_shape; i++) {
                int64_t t = a->shape[i];
                if (t == 0) {
                        if (i >= s->rank)
                                return why(err, errlen, "target dim %u is 0 (copy) but the input has rank %u", i,
                                           s->rank);
                        o.dims[i] = s->dims[i];
                        if (s->dims[i] == GRAPH_BATCH)
                                bout = (int)i;
                        else
                                known *= s->dims[i];
                } else if (t == -1) {
                        if (infer >= 0)
                                return why(err, errlen, "the target has -1 twice (dims %d and %u)", infer, i);
                        infer = (int)i;
                } else if (t < -1) {
                        return why(err, errlen, "target dim %u is %lld", i, (long long)t);
                } else {
                        /* a target no input could fill; also keeps known from overflowing */
                        if (t > DIM_LIMIT || known > DIM_LIMIT / t)
                                return why(err, errlen, "target dim %u (%lld) makes more values than any input holds",
                                           i, (long long)t);
                        o.dims[i] = t;
                        known *= t;
                }
        }
        if (bin >= 0 && bout < 0) {
                if (infer < 0)
                        return why(err, errlen, "the input's dim %d is the batch and the target neither copies it "
                                   "(0 at index %d) nor infers it (-1)", bin, bin);
                if (known != per)
                        return why(err, errlen, "the target's -1 would not be the batch alone: an example holds "
                                   "%lld values, the target's other dims %lld", (long long)per, (long long)known);
                o.dims[infer] = GRAPH_BATCH;
        } else if (infer >= 0) {
                if (per % known != 0)
                        return why(err, errlen, "cannot infer the -1: %lld values%s are not a multiple of %lld",
                                   (long long)per, bin >= 0 ? " per example" : "", (long long)known);
                o.dims[infer] = per / known;
        } else if (known != per) {
                return why(err, errlen, "the target holds %lld values%s, the input %lld", (long long)known,
                           bin >= 0 ? " per example" : "", (long long)per);
        }
        return set_out(out, &o, err, errlen);
}

GRAPH_SHAPE_FN(gs_squeeze)
{
        const struct graph_shape *s = in_shape(g, n, 0, err, errlen);
        if (!s)
                return -EINVAL;
        const struct graph_attrs *a = &n->a;
        bool drop[GRAPH_MAX_RANK] = { false };
        if (a->n_axes > s->rank)
                return why(err, errlen, "%u axes for rank %u", a->n_axes, s->rank);
        for (uint32_t i = 0; i < a->n_axes; i++) {
                uint32_t ax;
                if (graph_axis(a->axes[i], s->rank, &ax) < 0)
                        return why(err, errlen, "axis %lld is out of range for rank %u", (long long)a->axes[i],
                                   s->rank);
                if (drop[ax])
                        return why(err, errlen, "axes list axis %u twice", ax);
                if (s->dims[ax] == GRAPH_BATCH)
                        return why(err, errlen, "axis %u is the batch: it cannot be squeezed", ax);
                if (s->dims[ax] != 1)
                        return why(err, errlen, "axis %u has dim %lld, not 1", ax, (long long)s->dims[ax]);
                drop[ax] = true;
        }
        /* no axes: every dim of 1, which never includes the batch (GRAPH_BATCH is not 1) */
        struct graph_shape o = { .rank = 0 };
        for (uint32_t i = 0; i < s->rank; i++)
                if (!(a->n_axes ? drop[i] : s->dims[i] == 1))
                        o.dims[o.rank++] = s->dims[i];
        return set_out(out, &o, err, errlen);
}

GRAPH_SHAPE_FN(gs_unsqueeze)
{
        const struct graph_shape *s = in_shape(g, n, 0, err, errlen);
        if (!s)
                return -EINVAL;
        const struct graph_attrs *a = &n->a;
        if (a->n_axes == 0)
                return why(err, errlen, "no axes");
        uint32_t r = s->rank + a->n_axes;
        if (r > GRAPH_MAX_RANK)
                return why(err, errlen, "the output would have rank %u, at most %d is supported", r, GRAPH_MAX_RANK);
        bool ins[GRAPH_MAX_RANK] = { false };
        for (uint32_t i = 0; i < a->n_axes; i++) {
                uint32_t ax;
                if (graph_axis(a->axes[i], r, &ax) < 0)
                        return why(err, errlen, "axis %lld is out of range for the output's rank %u",
                                   (long long)a->axes[i], r);
                if (ins[ax])
                        return why(err, errlen, "axes list axis %u twice", ax);
                ins[ax] = true;
        }
        struct graph_shape o = { .rank = r };
        for (uint32_t i = 0, j = 0; i < r; i++)
                o.dims[i] = ins[i] ? 1 : s->dims[j++];
        return set_out(out, &o, err, errlen);
}

/* The permutation of a node's Transpose over rank axes: perm[i] is the input axis that output axis i
 * takes (n_perm 0: reversed). ONNX's perm entries are in [0, rank): no negatives. */
static int transpose_perm(const struct graph_attrs *a, uint32_t rank, uint32_t *perm, char *err, size_t errlen)
{
        if (a->n_perm == 0) {
                for (uint32_t i = 0; i < rank; i++)
                        perm[i] = rank - 1 - i;
                return 0;
        }
        if (a->n_perm != rank)
                return why(err, errlen, "perm has %u entries for rank %u", a->n_perm, rank);
        bool seen[GRAPH_MAX_RANK] = { false };
        for (uint32_t i = 0; i < rank; i++) {
                int64_t p = a->perm[i];
                if (p < 0 || p >= rank)
                        return why(err, errlen, "perm entry %lld is out of range [0, %u)", (long long)p, rank);
                if (seen[p])
                        return why(err, errlen, "perm lists axis %lld twice", (long long)p);
                seen[p] = true;
                perm[i] = (uint32_t)p;
        }
        return 0;
}

GRAPH_SHAPE_FN(gs_transpose)
{
        const struct graph_shape *s = in_shape(g, n, 0, err, errlen);
        if (!s)
                return -EINVAL;
        uint32_t perm[GRAPH_MAX_RANK];
        int rc = transpose_perm(&n->a, s->rank, perm, err, errlen);
        if (rc < 0)
                return rc;
        struct graph_shape o = { .rank = s->rank };
        for (uint32_t i = 0; i < s->rank; i++)
                o.dims[i] = s->dims[perm[i]];
        return set_out(out, &o, err, errlen);
}

GRAPH_SHAPE_FN(gs_concat)
{
        const struct graph_shape *s0 = in_shape(g, n, 0, err, errlen);
        if (!s0)
                return -EINVAL;
        uint32_t ax;
        if (graph_axis(n->a.axis, s0->rank, &ax) < 0)
                return why(err, errlen, "axis %lld is out of range for rank %u", (long long)n->a.axis, s0->rank);
        enum graph_dtype dt = g->tensors[n->in[0]].dtype;
        struct graph_shape o = *s0;
        for (uint32_t i = 1; i < n->n_in; i++) {
                const struct graph_shape *s = in_shape(g, n, i, err, errlen);
                if (!s)
                        return -EINVAL;
                if (g->tensors[n->in[i]].dtype != dt)
                        return why(err, errlen, "input %u's type differs from input 0's", i);
                if (s->rank != s0->rank)
                        return why(err, errlen, "input %u has rank %u, input 0 rank %u", i, s->rank, s0->rank);
                for (uint32_t d = 0; d < s->rank; d++) {
                        if (d == ax || s->dims[d] == s0->dims[d])
                                continue;
                        if (s->dims[d] == GRAPH_BATCH || s0->dims[d] == GRAPH_BATCH)
                                return why(err, errlen, "dim %u is the batch in input %u but not in input %u", d,
                                           s->dims[d] == GRAPH_BATCH ? i : 0, s->dims[d] == GRAPH_BATCH ? 0 : i);
                        return why(err, errlen, "input %u has dim %u = %lld, input 0 %lld", i, d,
                                   (long long)s->dims[d], (long long)s0->dims[d]);
                }
                /* the batch plus anything is not one symbolic dim */
                if (s->dims[ax] == GRAPH_BATCH || o.dims[ax] == GRAPH_BATCH)
                        return why(err, errlen, "axis %u is the batch: concatenating along it is not supported", ax);
                o.dims[ax] += s->dims[ax];
        }
        return set_out(out, &o, err, errlen);
}

GRAPH_SHAPE_FN(gs_gather)
{
        const struct graph_shape *s = in_shape(g, n, 0, err, errlen);
        const struct graph_shape *is = s ? in_shape(g, n, 1, err, errlen) : NULL;
        if (!is)
                return -EINVAL;
        const struct graph_tensor *it = &g->tensors[n->in[1]];
        if (it->dtype != GDT_I64)
                return why(err, errlen, "the indices (input 1) are not int64");
        uint32_t ax;
        if (graph_axis(n->a.axis, s->rank, &ax) < 0)
                return why(err, errlen, "axis %lld is out of range for rank %u", (long long)n->a.axis, s->rank);
        uint32_t r = s->rank - 1 + is->rank;
        if (r > GRAPH_MAX_RANK)
                return why(err, errlen, "the output would have rank %u, at most %d is supported", r, GRAPH_MAX_RANK);
        struct graph_shape o = { .rank = r };
        uint32_t j = 0;
        for (uint32_t i = 0; i < ax; i++)
                o.dims[j++] = s->dims[i];
        for (uint32_t i = 0; i < is->rank; i++)
                o.dims[j++] = is->dims[i];
        for (uint32_t i = ax + 1; i < s->rank; i++)
                o.dims[j++] = s->dims[i];
        int b;
        if (batch_axes(&o, &b) > 1)
                return why(err, errlen, "both the data and the indices hold the batch: it would appear twice in "
                           "the output");
        /* constant indices are checked now, so that a bad model fails when it loads rather than at its first
         * step; fed ones at run time */
        if (it->kind == GT_CONST && it->data && s->dims[ax] != GRAPH_BATCH) {
                const int64_t *idx = it->data;
                int64_t A = s->dims[ax];
                size_t c = graph_count(is);
                for (size_t i = 0; i < c; i++)
                        if (idx[i] < -A || idx[i] >= A)
                                return why(err, errlen, "index %lld (element %zu) is out of range for dim %lld",
                                           (long long)idx[i], i, (long long)A);
        }
        return set_out(out, &o, err, errlen);
}

GRAPH_SHAPE_FN(gs_pad)
{
        const struct graph_shape *s = in_shape(g, n, 0, err, errlen);
        if (!s)
                return -EINVAL;
        const struct graph_attrs *a = &n->a;
        if (a->n_pads != 2 * s->rank)
                return why(err, errlen, "%u pads for rank %u, needs %u (begins, then ends)", a->n_pads, s->rank,
                           2 * s->rank);
        struct graph_shape o = *s;
        for (uint32_t i = 0; i < s->rank; i++) {
                int64_t b = a->pads[i], e = a->pads[s->rank + i];
                if (b < 0 || e < 0)
                        return why(err, errlen, "pads are negative on axis %u (%lld, %lld): not supported", i,
                                   (long long)b, (long long)e);
                if (b > DIM_LIMIT || e > DIM_LIMIT)
                        return why(err, errlen, "pads on axis %u (%lld, %lld) are too large", i, (long long)b,
                                   (long long)e);
                if (s->dims[i] == GRAPH_BATCH) {
                        if (b || e)
                                return why(err, errlen, "axis %u is the batch: it cannot be padded", i);
                        continue;
                }
                o.dims[i] += b + e;
        }
        return set_out(out, &o, err, errlen);
}

/* ---- kernels ---- */

static size_t dtype_size(enum graph_dtype t)
{
        return t == GDT_I64 ? sizeof(int64_t) : sizeof(float);
}

static size_t prod(const struct graph_shape *s, uint32_t lo, uint32_t hi)
{
        size_t c = 1;
        for (uint32_t i = lo; i < hi; i++)
                c *= (size_t)s->dims[i];
        return c;
}

/* A walk over the rows (the last axis) of a contiguous tensor of shape dims, tracking where each row
 * starts in another buffer that steps step[d] elements per index along axis d: the strided side of a
 * transpose or a pad. An odometer over the outer axes, so that no row costs a division. */
struct rows {
        uint32_t rank;
        int64_t dims[GRAPH_MAX_RANK];
        int64_t step[GRAPH_MAX_RANK];
        int64_t idx[GRAPH_MAX_RANK];
        size_t off;                    /* the current row's start in the other buffer */
        size_t n_rows, len, stride;    /* rows, elements per row, their step in the other buffer */
};

static void rows_start(struct rows *w, const struct graph_shape *s, const int64_t *step, size_t base)
{
        w->rank = s->rank;
        memset(w->idx, 0, sizeof(w->idx));
        for (uint32_t i = 0; i < s->rank; i++) {
                w->dims[i] = s->dims[i];
                w->step[i] = step[i];
        }
        w->off = base;
        w->len = s->rank ? (size_t)s->dims[s->rank - 1] : 1;
        w->stride = s->rank ? (size_t)step[s->rank - 1] : 0;
        w->n_rows = s->rank ? prod(s, 0, s->rank - 1) : 1;
}

static void rows_next(struct rows *w)
{
        for (int d = (int)w->rank - 2; d >= 0; d--) {
                w->off += (size_t)w->step[d];
                if (++w->idx[d] < w->dims[d])
                        return;
                w->off -= (size_t)(w->step[d] * w->dims[d]);
                w->idx[d] = 0;
        }
}

/* Row-major strides of s, in elements. */
static void strides(const struct graph_shape *s, int64_t *st)
{
        int64_t c = 1;
        for (int i = (int)s->rank - 1; i >= 0; i--) {
                st[i] = c;
                c *= s->dims[i];
        }
}

static void add_k(float *y, const float *x, size_t n)
{
        for (size_t i = 0; i < n; i++)
                y[i] += x[i];
}

/* Flatten, Reshape, Squeeze, Unsqueeze, Identity: row-major order is the same under either shape. */
int gk_copy_fwd(struct graph_kctx *k)
{
        size_t bytes = graph_count(&k->out_shape[0]) * dtype_size(k->in_dtype[0]);
        if (k->out[0] != k->in[0])
                memcpy(k->out[0], k->in[0], bytes);
        return 0;
}

int gk_copy_bwd(struct graph_kctx *k)
{
        if (k->din[0] && k->dout[0])
                add_k(k->din[0], k->dout[0], graph_count(&k->out_shape[0]));
        return 0;
}

/* The walk over the output's rows with the input's strides permuted: output axis i steps the input by
 * its stride along perm[i]. */
static void transpose_rows(const struct graph_kctx *k, struct rows *w)
{
        const struct graph_shape *s = &k->in_shape[0];
        uint32_t perm[GRAPH_MAX_RANK];
        int64_t ist[GRAPH_MAX_RANK] = { 0 }, step[GRAPH_MAX_RANK];
        transpose_perm(&k->node->a, s->rank, perm, NULL, 0); /* checked by gs_transpose */
        strides(s, ist);
        for (uint32_t i = 0; i < s->rank; i++)
                step[i] = ist[perm[i]];
        rows_start(w, &k->out_shape[0], step, 0);
}

int gk_transpose_fwd(struct graph_kctx *k)
{
        struct rows w;
        transpose_rows(k, &w);
        size_t o = 0;
        if (k->in_dtype[0] == GDT_I64) {
                const int64_t *x = k->in[0];
                int64_t *y = k->out[0];
                for (size_t r = 0; r < w.n_rows; r++, rows_next(&w))
                        for (size_t j = 0; j < w.len; j++)
                                y[o++] = x[w.off + j * w.stride];
        } else {
                const float *x = k->in[0];
                float *y = k->out[0];
                for (size_t r = 0; r < w.n_rows; r++, rows_next(&w))
                        for (size_t j = 0; j < w.len; j++)
                                y[o++] = x[w.off + j * w.stride];
        }
        return 0;
}

int gk_transpose_bwd(struct graph_kctx *k)
{
        float *dx = k->din[0];
        const float *dy = k->dout[0];
        if (!dx || !dy)
                return 0;
        struct rows w;
        transpose_rows(k, &w);
        size_t o = 0;
        for (size_t r = 0; r < w.n_rows; r++, rows_next(&w))
                for (size_t j = 0; j < w.len; j++)
                        dx[w.off + j * w.stride] += dy[o++];
        return 0;
}

/* Concat as (outer, axis * inner) blocks: each output block is the inputs' blocks side by side. */
static void concat_dims(const struct graph_kctx *k, uint32_t *ax, size_t *outer, size_t *inner)
{
        const struct graph_shape *s = &k->out_shape[0];
        graph_axis(k->node->a.axis, s->rank, ax); /* checked by gs_concat */
        *outer = prod(s, 0, *ax);
        *inner = prod(s, *ax + 1, s->rank);
}

int gk_concat_fwd(struct graph_kctx *k)
{
        uint32_t ax;
        size_t outer, inner, esz = dtype_size(k->in_dtype[0]);
        concat_dims(k, &ax, &outer, &inner);
        size_t row = (size_t)k->out_shape[0].dims[ax] * inner * esz; /* bytes per output block */
        size_t at = 0;
        for (uint32_t i = 0; i < k->node->n_in; i++) {
                size_t blk = (size_t)k->in_shape[i].dims[ax] * inner * esz;
                const char *x = k->in[i];
                char *y = (char *)k->out[0] + at;
                for (size_t o = 0; o < outer; o++)
                        memcpy(y + o * row, x + o * blk, blk);
                at += blk;
        }
        return 0;
}

int gk_concat_bwd(struct graph_kctx *k)
{
        const float *dy = k->dout[0];
        if (!dy)
                return 0;
        uint32_t ax;
        size_t outer, inner;
        concat_dims(k, &ax, &outer, &inner);
        size_t row = (size_t)k->out_shape[0].dims[ax] * inner;
        size_t at = 0;
        for (uint32_t i = 0; i < k->node->n_in; i++) {
                size_t blk = (size_t)k->in_shape[i].dims[ax] * inner;
                float *dx = k->din[i];
                for (size_t o = 0; dx && o < outer; o++)
                        add_k(dx + o * blk, dy + at + o * row, blk);
                at += blk;
        }
        return 0;
}

/* Gather as data (outer, A, inner), indices (N), output (outer, N, inner). Indices are checked before
 * anything is written: fed ones may be out of range at any step. */
struct gather {
        size_t outer, A, inner, N;
        const int64_t *idx;
};

static int gather_dims(const struct graph_kctx *k, struct gather *q)
{
        const struct graph_shape *s = &k->in_shape[0];
        uint32_t ax;
        graph_axis(k->node->a.axis, s->rank, &ax); /* checked by gs_gather */
        q->outer = prod(s, 0, ax);
        q->A = (size_t)s->dims[ax];
        q->inner = prod(s, ax + 1, s->rank);
        q->N = graph_count(&k->in_shape[1]);
        q->idx = k->in[1];
        int64_t A = (int64_t)q->A;
        for (size_t j = 0; j < q->N; j++)
                if (q->idx[j] < -A || q->idx[j] >= A)
                        return -EINVAL;
        return 0;
}

static size_t gather_at(const struct gather *q, size_t j)
{
        return (size_t)(q->idx[j] < 0 ? q->idx[j] + (int64_t)q->A : q->idx[j]);
}

int gk_gather_fwd(struct graph_kctx *k)
{
        struct gather q;
        int rc = gather_dims(k, &q);
        if (rc < 0)
                return rc;
        size_t esz = dtype_size(k->in_dtype[0]), blk = q.inner * esz;
        const char *x = k->in[0];
        char *y = k->out[0];
        for (size_t o = 0; o < q.outer; o++)
                for (size_t j = 0; j < q.N; j++)
                        memcpy(y + (o * q.N + j) * blk, x + (o * q.A + gather_at(&q, j)) * blk, blk);
        return 0;
}

/* The transpose of a gather is a scatter-add: an index listed twice (an embedding row used twice in a
 * batch) collects both gradients. */
int gk_gather_bwd(struct graph_kctx *k)
{
        float *dx = k->din[0];
        const float *dy = k->dout[0];
        if (!dx || !dy)
                return 0;
        struct gather q;
        int rc = gather_dims(k, &q);
        if (rc < 0)
                return rc;
        for (size_t o = 0; o < q.outer; o++)
                for (size_t j = 0; j < q.N; j++)
                        add_k(dx + (o * q.A + gather_at(&q, j)) * q.inner, dy + (o * q.N + j) * q.inner, q.inner);
        return 0;
}

/* The walk over the input's rows, tracking where each lands in the output: the output's strides from
 * the corner at the pads' begins. */
static void pad_rows(const struct graph_kctx *k, struct rows *w)
{
        const struct graph_shape *s = &k->in_shape[0];
        int64_t ost[GRAPH_MAX_RANK];
        strides(&k->out_shape[0], ost);
        size_t base = 0;
        for (uint32_t i = 0; i < s->rank; i++)
                base += (size_t)(k->node->a.pads[i] * ost[i]);
        rows_start(w, s, ost, base);
}

int gk_pad_fwd(struct graph_kctx *k)
{
        size_t n = graph_count(&k->out_shape[0]), esz = dtype_size(k->in_dtype[0]);
        if (k->in_dtype[0] == GDT_I64) {
                /* ONNX casts the constant to the data's type */
                int64_t v = (int64_t)k->node->a.pad_value, *y = k->out[0];
                for (size_t i = 0; i < n; i++)
                        y[i] = v;
        } else {
                float v = k->node->a.pad_value, *y = k->out[0];
                for (size_t i = 0; i < n; i++)
                        y[i] = v;
        }
        struct rows w;
        pad_rows(k, &w);
        const char *x = k->in[0];
        char *y = k->out[0];
        for (size_t r = 0; r < w.n_rows; r++, rows_next(&w))
                memcpy(y + w.off * esz, x + r * w.len * esz, w.len * esz);
        return 0;
}

int gk_pad_bwd(struct graph_kctx *k)
{
        float *dx = k->din[0];
        const float *dy = k->dout[0];
        if (!dx || !dy)
                return 0;
        struct rows w;
        pad_rows(k, &w);
        for (size_t r = 0; r < w.n_rows; r++, rows_next(&w))
                add_k(dx + r * w.len, dy + w.off, w.len);
        return 0;
}
