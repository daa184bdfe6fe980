/* The graph engine's matrix products (Gemm, MatMul, through OpenBLAS's sgemm), Softmax and LogSoftmax
 * along one axis, and the reductions ReduceSum and ReduceMean (graph-internal.h). */
#include "graph-internal.h"
#include "graph_k_nd.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* A dim for an error message: the batch by name, not as -1. */
static const char *dim_str(int64_t d, char *buf, size_t len)
{
        if (d == GRAPH_BATCH)
                return "the batch";
        snprintf(buf, len, "%lld", (long long)d);
        return buf;
}

/* C (M, N) = alpha * op(A) op(B) + beta * C, where op(A) is (M, K) and op(B) (K, N), each stored row-major
 * as it is or, transposed, as its transpose. */
static void sgemm(bool ta, bool tb, size_t M, size_t N, size_t K, float alpha, const float *A, const float *B,
                  float beta, float *C)
{
        gk_sgemm(ta, tb, (int)M, (int)N, (int)K, alpha, A, (int)(ta ? M : K), B, (int)(tb ? K : N), beta, C, (int)N);
}

/* An attribute that is a flag: 0 or 1. */
static int flag(const char *name, int64_t v, char *err, size_t errlen)
{
        if (v == 0 || v == 1)
                return 0;
        snprintf(err, errlen, "%s=%lld is not 0 or 1", name, (long long)v);
        return -EINVAL;
}

/* ---- Gemm ---- */

GRAPH_SHAPE_FN(gs_gemm)
{
        const struct graph_attrs *at = &n->a;
        char b1[24], b2[24];
        if (flag("transA", at->trans_a, err, errlen) < 0 || flag("transB", at->trans_b, err, errlen) < 0)
                return -EINVAL;
        const struct graph_shape *A = graph_in_shape(g, n, 0), *B = graph_in_shape(g, n, 1);
        const struct graph_shape *C = graph_in_shape(g, n, 2); /* NULL: no C */
        if (!A || !B) {
                snprintf(err, errlen, "input %d is required", A ? 1 : 0);
                return -EINVAL;
        }
        for (uint32_t i = 0; i < 2; i++) {
                uint32_t r = (i ? B : A)->rank;
                if (r != 2) {
                        snprintf(err, errlen, "input %u has rank %u; Gemm takes 2-D", i, r);
                        return -EINVAL;
                }
        }
        int64_t M = A->dims[at->trans_a ? 1 : 0], Ka = A->dims[at->trans_a ? 0 : 1];
        int64_t Kb = B->dims[at->trans_b ? 1 : 0], N = B->dims[at->trans_b ? 0 : 1];
        /* only M may be the batch: K and N size the weights */
        if (Ka == GRAPH_BATCH) {
                snprintf(err, errlen, "with transA=1 input 0's batch would be K; K must be known");
                return -EINVAL;
        }
        if (Kb == GRAPH_BATCH || N == GRAPH_BATCH) {
                snprintf(err, errlen, "input 1 has the batch as a dim; Gemm's K and N must be known");
                return -EINVAL;
        }
        if (Ka != Kb) {
                snprintf(err, errlen, "K differs: input 0 (A) gives %lld, input 1 (B) %lld", (long long)Ka,
                         (long long)Kb);
                return -EINVAL;
        }
        if (C) {
                /* unidirectional: C broadcasts to (M, N), never the other way */
                if (C->rank > 2) {
                        snprintf(err, errlen, "input 2 (C) has rank %u; it must broadcast to (M, N)", C->rank);
                        return -EINVAL;
                }
                int64_t mn[2] = { M, N };
                for (uint32_t d = 0; d < C->rank; d++) {
                        int64_t want = mn[2 - C->rank + d], cd = C->dims[d];
                        if (cd != 1 && cd != want) {
                                snprintf(err, errlen, "input 2 (C) has %s in dim %u; it must be 1 or %s to broadcast "
                                         "to (M, N)", dim_str(cd, b1, sizeof(b1)), d, dim_str(want, b2, sizeof(b2)));
                                return -EINVAL;
                        }
                }
        }
        out[0] = (struct graph_shape){ .rank = 2, .dims = { M, N } };
        return 0;
}

/* Y = alpha op(A) op(B), then beta C added on, broadcast: the product first and the bias after, as a
 * layer list's dense layer always computed it (model_pass.c: sgemm, then add_bias_rows), so that a
 * layer list gives the same bits on either engine. */
int gk_gemm_fwd(struct graph_kctx *k)
{
        const struct graph_attrs *at = &k->node->a;
        bool ta = at->trans_a, tb = at->trans_b;
        size_t M = (size_t)k->out_shape[0].dims[0], N = (size_t)k->out_shape[0].dims[1];
        size_t K = (size_t)k->in_shape[0].dims[ta ? 0 : 1];
        const float *A = k->in[0], *B = k->in[1], *C = k->in[2]; /* A (M, K) or (K, M), B (K, N) or (N, K) */
        float *Y = k->out[0];                                      /* (M, N) */
        if (!k->blk_n) {
                sgemm(ta, tb, M, N, K, at->alpha, A, B, 0.0f, Y);
        } else {
                /* B in row blocks: each block's share of the product once its hook has run. transB 0: B
                 * (K, N), a block is rows [k0, k1) of K, and Y += op(A)[:, k0:k1] B[k0:k1, :]; transB 1: B
                 * (N, K), a block is outputs [n0, n1), and Y[:, n0:n1] = op(A) B[n0:n1, :]^T. */
                int lda = (int)(ta ? M : K);
                for (uint32_t b = 0; b < k->blk_n; b++) {
                        size_t r0 = k->blk_rows[b], r1 = k->blk_rows[b + 1];
                        int r;
                        if (k->blk_hook && (r = k->blk_hook(k->blk_ud, k->blk_tensor, b)) != 0)
                                return r;
                        if (!tb)
                                gk_sgemm(ta, false, (int)M, (int)N, (int)(r1 - r0), at->alpha, A + (ta ? r0 * M : r0),
                                         lda, B + r0 * N, (int)N, b ? 1.0f : 0.0f, Y, (int)N);
                        else
                                gk_sgemm(ta, true, (int)M, (int)(r1 - r0), (int)K, at->alpha, A, lda, B + r0 * K,
                                         (int)K, 0.0f, Y + r0, (int)N);
                }
        }
        if (C && at->beta != 0.0f) {
                const struct graph_shape *ops[2] = { &k->out_shape[0], &k->in_shape[2] };
                struct gk_nd it;
                gk_nd_init(&it, &k->out_shape[0], ops, 2);
                size_t idx[GRAPH_MAX_RANK] = { 0 }, off[GK_ND_OPS] = { 0 };
                uint32_t last = it.rank - 1;
                size_t n = it.dims[last], sc = it.st[1][last];
                float beta = at->beta;
                if (beta == 1.0f && sc == 1) /* a bias row: the loop vectorizes */
                        do {
                                float *y = Y + off[0];
                                const float *c = C + off[1];
                                for (size_t j = 0; j < n; j++)
                                        y[j] += c[j];
                        } while (gk_nd_next(&it, idx, off, 2));
                else
                        do {
                                for (size_t j = 0; j < n; j++)
                                        Y[off[0] + j] += beta * C[off[1] + j * sc];
                        } while (gk_nd_next(&it, idx, off, 2));
        }
        return 0;
}

/* dB block by block (B in row blocks, graph_exec_set_blocks), each block's hook as soon as its rows are
 * final: the same products as gk_gemm_bwd's, cut along B's rows. */
static int gemm_bwd_blocks(struct graph_kctx *k, const float *dY, float *dB, float bb)
{
        const struct graph_attrs *at = &k->node->a;
        bool ta = at->trans_a, tb = at->trans_b;
        size_t M = (size_t)k->out_shape[0].dims[0], N = (size_t)k->out_shape[0].dims[1];
        size_t K = (size_t)k->in_shape[0].dims[ta ? 0 : 1];
        const float *A = k->in[0];
        for (uint32_t b = 0; b < k->blk_n; b++) {
                size_t r0 = k->blk_rows[b], r1 = k->blk_rows[b + 1];
                int r;
                if (dY && dB) {
                        if (!tb) /* dB[k0:k1, :] = alpha op(A)[:, k0:k1]^T dY */
                                gk_sgemm(!ta, false, (int)(r1 - r0), (int)N, (int)M, at->alpha, A + (ta ? r0 * M : r0),
                                         (int)(ta ? M : K), dY, (int)N, bb, dB + r0 * N, (int)N);
                        else     /* dB[n0:n1, :] = alpha dY[:, n0:n1]^T op(A) */
                                gk_sgemm(true, ta, (int)(r1 - r0), (int)K, (int)M, at->alpha, dY + r0, (int)N, A,
                                         (int)(ta ? M : K), bb, dB + r0 * K, (int)K);
                }
                if (k->blk_hook && (r = k->blk_hook(k->blk_ud, k->blk_tensor, b)) != 0)
                        return r;
        }
        return 0;
}

/* With Y = alpha op(A) op(B) + beta C: dop(A) = alpha dY op(B)^T, dop(B) = alpha op(A)^T dY, and dC beta dY
 * summed over the dims C is broadcast along. A transposed input takes the transpose of its op's
 * gradient, which is the same product with the factors swapped and transposed. */
int gk_gemm_bwd(struct graph_kctx *k)
{
        const float *dY = k->dout[0]; /* (M, N) */
        if (!dY)
                return k->blk_n ? gemm_bwd_blocks(k, NULL, NULL, 0.0f) : 0; /* (the blocks' hooks all the same) */
        const struct graph_attrs *at = &k->node->a;
        bool ta = at->trans_a, tb = at->trans_b;
        size_t M = (size_t)k->out_shape[0].dims[0], N = (size_t)k->out_shape[0].dims[1];
        size_t K = (size_t)k->in_shape[0].dims[ta ? 0 : 1];
        const float *A = k->in[0], *B = k->in[1];
        float *dA = k->din[0], *dB = k->din[1], *dC = k->din[2];
        float ba = k->din_set[0] ? 0.0f : 1.0f, bb = k->din_set[1] ? 0.0f : 1.0f; /* set: overwrite */
        if (dA) {
                if (!ta)
                        sgemm(false, !tb, M, K, N, at->alpha, dY, B, ba, dA); /* (M, K) */
                else
                        sgemm(tb, true, K, M, N, at->alpha, B, dY, ba, dA); /* (K, M) */
        }
        if (dB && !k->blk_n) {
                if (!tb)
                        sgemm(!ta, false, K, N, M, at->alpha, A, dY, bb, dB); /* (K, N) */
                else
                        sgemm(true, ta, N, K, M, at->alpha, dY, A, bb, dB); /* (N, K) */
        }
        int r;
        if (k->blk_n && (r = gemm_bwd_blocks(k, dY, dB, bb)) != 0)
                return r;
        if (dC && k->in[2] && k->din_set[2])
                memset(dC, 0, sizeof(float) * graph_count(&k->in_shape[2]));
        if (dC && k->in[2]) {
                const struct graph_shape *ops[2] = { &k->out_shape[0], &k->in_shape[2] };
                struct gk_nd it;
                gk_nd_init(&it, &k->out_shape[0], ops, 2);
                size_t idx[GRAPH_MAX_RANK] = { 0 }, off[GK_ND_OPS] = { 0 };
                uint32_t last = it.rank - 1;
                size_t n = it.dims[last], sc = it.st[1][last];
                do {
                        if (sc) {
                                for (size_t j = 0; j < n; j++)
                                        dC[off[1] + j] += at->beta * dY[off[0] + j];
                        } else {
                                float acc = 0.0f;
                                for (size_t j = 0; j < n; j++)
                                        acc += dY[off[0] + j];
                                dC[off[1]] += at->beta * acc;
                        }
                } while (gk_nd_next(&it, idx, off, 2));
        }
        return 0;
}

/* ---- MatMul ---- */

/* 2-D x 2-D, and batched: 3-D x 3-D, 3-D x 2-D, 2-D x 3-D, the leading (batch) dim broadcast from 1.
 * ONNX's 1-D operands and ranks over 3 are refused: nothing in the models we load needs them. */
GRAPH_SHAPE_FN(gs_matmul)
{
        const struct graph_shape *A = graph_in_shape(g, n, 0), *B = graph_in_shape(g, n, 1);
        char b1[24], b2[24];
        if (!A || !B) {
                snprintf(err, errlen, "input %d is required", A ? 1 : 0);
                return -EINVAL;
        }
        for (uint32_t i = 0; i < 2; i++) {
                uint32_t r = (i ? B : A)->rank;
                if (r != 2 && r != 3) {
                        snprintf(err, errlen, "input %u has rank %u; MatMul takes 2-D or 3-D", i, r);
                        return -EINVAL;
                }
        }
        uint32_t ra = A->rank, rb = B->rank;
        int64_t M = A->dims[ra - 2], Ka = A->dims[ra - 1], Kb = B->dims[rb - 2], N = B->dims[rb - 1];
        if (Kb == GRAPH_BATCH) {
                snprintf(err, errlen, "input 1's rows (K) are the batch; K must be known");
                return -EINVAL;
        }
        if (Ka != Kb) {
                snprintf(err, errlen, "K differs: input 0 has %lld columns, input 1 %lld rows", (long long)Ka,
                         (long long)Kb);
                return -EINVAL;
        }
        if (ra == 2 && rb == 2) {
                out[0] = (struct graph_shape){ .rank = 2, .dims = { M, N } };
                return 0;
        }
        if (ra == 2 && M == GRAPH_BATCH) {
                snprintf(err, errlen, "input 0's rows are the batch and input 1 is 3-D: the batch would not lead "
                         "the output");
                return -EINVAL;
        }
        int64_t ba = ra == 3 ? A->dims[0] : 1, bb = rb == 3 ? B->dims[0] : 1;
        if (ba != bb && ba != 1 && bb != 1) {
                snprintf(err, errlen, "the leading dims %s and %s do not broadcast", dim_str(ba, b1, sizeof(b1)),
                         dim_str(bb, b2, sizeof(b2)));
                return -EINVAL;
        }
        out[0] = (struct graph_shape){ .rank = 3, .dims = { ba == 1 ? bb : ba, M, N } };
        return 0;
}

struct mm_dims {
        size_t nb, ba, bb, M, K, N; /* ba, bb: 1 where that input is shared by every batch */
};

static struct mm_dims mm_dims(const struct graph_kctx *k)
{
        const struct graph_shape *A = &k->in_shape[0], *B = &k->in_shape[1], *Y = &k->out_shape[0];
        return (struct mm_dims){
                .nb = Y->rank == 3 ? (size_t)Y->dims[0] : 1,
                .ba = A->rank == 3 ? (size_t)A->dims[0] : 1,
                .bb = B->rank == 3 ? (size_t)B->dims[0] : 1,
                .M = (size_t)A->dims[A->rank - 2],
                .K = (size_t)A->dims[A->rank - 1],
                .N = (size_t)B->dims[B->rank - 1],
        };
}

int gk_matmul_fwd(struct graph_kctx *k)
{
        struct mm_dims d = mm_dims(k);
        const float *A = k->in[0], *B = k->in[1]; /* (ba, M, K), (bb, K, N) */
        float *Y = k->out[0];                       /* (nb, M, N) */
        if (d.bb == 1) {
                /* one B for all: the batches of A are rows of one (ba M, K) matrix, one call */
                sgemm(false, false, d.ba * d.M, d.N, d.K, 1.0f, A, B, 0.0f, Y);
                return 0;
        }
        for (size_t i = 0; i < d.nb; i++)
                sgemm(false, false, d.M, d.N, d.K, 1.0f, A + (d.ba == 1 ? 0 : i) * d.M * d.K,
                      B + i * d.K * d.N, 0.0f, Y + i * d.M * d.N);
        return 0;
}

/* dA_i += dY_i B_i^T, dB_i += A_i^T dY_i; an input shared by every batch gathers all of theirs (sgemm's
 * beta 1 accumulates them in place). */
int gk_matmul_bwd(struct graph_kctx *k)
{
        const float *dY = k->dout[0]; /* (nb, M, N) */
        if (!dY)
                return 0;
        struct mm_dims d = mm_dims(k);
        const float *A = k->in[0], *B = k->in[1];
        float *dA = k->din[0], *dB = k->din[1];
        if (d.bb == 1) {
                if (dA)
                        sgemm(false, true, d.ba * d.M, d.K, d.N, 1.0f, dY, B, 1.0f, dA);
                if (dB)
                        sgemm(true, false, d.K, d.N, d.ba * d.M, 1.0f, A, dY, 1.0f, dB);
                return 0;
        }
        for (size_t i = 0; i < d.nb; i++) {
                size_t ia = d.ba == 1 ? 0 : i;
                const float *dYi = dY + i * d.M * d.N;
                if (dA)
                        sgemm(false, true, d.M, d.K, d.N, 1.0f, dYi, B + i * d.K * d.N, 1.0f,
                              dA + ia * d.M * d.K);
                if (dB)
                        sgemm(true, false, d.K, d.N, d.M, 1.0f, A + ia * d.M * d.K, dYi, 1.0f,
                              dB + i * d.K * d.N);
        }
        return 0;
}

/* ---- Softmax, LogSoftmax (opset 13: along the one axis) ---- */

/* The input as (outer, L, inner) around the axis; gs_same checked the axis. */
static void softmax_dims(const struct graph_kctx *k, size_t *outer, size_t *L, size_t *inner)
{
        const struct graph_shape *s = &k->in_shape[0];
        uint32_t axis = 0;
        graph_axis(k->node->a.axis, s->rank, &axis);
        *outer = *inner = 1;
        for (uint32_t d = 0; d < axis; d++)
                *outer *= (size_t)s->dims[d];
        *L = (size_t)s->dims[axis];
        for (uint32_t d = axis + 1; d < s->rank; d++)
                *inner *= (size_t)s->dims[d];
}

/* Each line (L values, inner apart) less its max before exp: no overflow, and the largest term is 1, so
 * the sum is at least 1 and its log finite. */
int gk_softmax_fwd(struct graph_kctx *k)
{
        size_t outer, L, inner;
        softmax_dims(k, &outer, &L, &inner);
        bool log_form = k->node->op == GOP_LOG_SOFTMAX;
        for (size_t o = 0; o < outer; o++)
                for (size_t i = 0; i < inner; i++) {
                        const float *x = (const float *)k->in[0] + o * L * inner + i; /* (L) at stride inner */
                        float *y = (float *)k->out[0] + o * L * inner + i;
                        float mx = -INFINITY;
                        for (size_t l = 0; l < L; l++)
                                mx = x[l * inner] > mx ? x[l * inner] : mx;
                        double sum = 0.0;
                        for (size_t l = 0; l < L; l++) {
                                float e = expf(x[l * inner] - mx);
                                sum += e;
                                if (!log_form)
                                        y[l * inner] = e;
                        }
                        if (log_form) {
                                /* (x - max) - log(sum), not x - (max + log(sum)): x - max is exact, and
                                 * with logits near 1000 adding log(sum) to the max rounds at 6e-5 */
                                float ls = (float)log(sum);
                                for (size_t l = 0; l < L; l++)
                                        y[l * inner] = (x[l * inner] - mx) - ls;
                        } else {
                                float inv = (float)(1.0 / sum);
                                for (size_t l = 0; l < L; l++)
                                        y[l * inner] *= inv;
                        }
                }
        return 0;
}

/* From the output: softmax dx = y (dy - sum(dy y)); log-softmax dx = dy - exp(y) sum(dy). */
int gk_softmax_bwd(struct graph_kctx *k)
{
        float *dxb = k->din[0];
        if (!dxb || !k->dout[0])
                return 0;
        size_t outer, L, inner;
        softmax_dims(k, &outer, &L, &inner);
        bool log_form = k->node->op == GOP_LOG_SOFTMAX;
        for (size_t o = 0; o < outer; o++)
                for (size_t i = 0; i < inner; i++) {
                        size_t base = o * L * inner + i;
                        const float *y = (const float *)k->out[0] + base, *dy = k->dout[0] + base;
                        float *dx = dxb + base;
                        double s = 0.0;
                        for (size_t l = 0; l < L; l++)
                                s += log_form ? dy[l * inner] : (double)dy[l * inner] * y[l * inner];
                        float sf = (float)s;
                        if (log_form)
                                for (size_t l = 0; l < L; l++)
                                        dx[l * inner] += dy[l * inner] - expf(y[l * inner]) * sf;
                        else
                                for (size_t l = 0; l < L; l++)
                                        dx[l * inner] += y[l * inner] * (dy[l * inner] - sf);
                }
        return 0;
}

/* ---- ReduceSum, ReduceMean ---- */

/* Which axes of an input of rank `rank` the node reduces (red[d]); -EINVAL with why for an axis out of
 * range or given twice. No axes: all of them, unless noop_with_empty_axes (then none). */
static int reduce_axes(const struct graph_node *n, uint32_t rank, bool *red, char *err, size_t errlen)
{
        const struct graph_attrs *at = &n->a;
        memset(red, 0, sizeof(bool) * GRAPH_MAX_RANK);
        if (at->n_axes == 0) {
                for (uint32_t d = 0; d < rank; d++)
                        red[d] = !at->noop_with_empty_axes;
                return 0;
        }
        if (at->n_axes > rank) {
                snprintf(err, errlen, "%u axes for an input of rank %u", at->n_axes, rank);
                return -EINVAL;
        }
        for (uint32_t i = 0; i < at->n_axes; i++) {
                uint32_t d;
                if (graph_axis(at->axes[i], rank, &d) < 0) {
                        snprintf(err, errlen, "axes[%u]=%lld is out of range for input 0 of rank %u", i,
                                 (long long)at->axes[i], rank);
                        return -EINVAL;
                }
                if (red[d]) {
                        snprintf(err, errlen, "axes names axis %u twice", d);
                        return -EINVAL;
                }
                red[d] = true;
        }
        return 0;
}

GRAPH_SHAPE_FN(gs_reduce)
{
        const struct graph_attrs *at = &n->a;
        const struct graph_shape *x = graph_in_shape(g, n, 0);
        if (!x) {
                snprintf(err, errlen, "input 0 is required");
                return -EINVAL;
        }
        if (flag("keepdims", at->keepdims, err, errlen) < 0 ||
            flag("noop_with_empty_axes", at->noop_with_empty_axes, err, errlen) < 0)
                return -EINVAL;
        bool red[GRAPH_MAX_RANK];
        int r = reduce_axes(n, x->rank, red, err, errlen);
        if (r < 0)
                return r;
        struct graph_shape o = { 0 };
        for (uint32_t d = 0; d < x->rank; d++) {
                if (!red[d])
                        o.dims[o.rank++] = x->dims[d];
                else if (at->keepdims)
                        o.dims[o.rank++] = 1;
        }
        out[0] = o;
        return 0;
}

/* The walk over the input with the output as its second operand, broadcast (stride 0) along the reduced
 * dims: the output with or without keepdims has the same layout as the input's shape with 1 there. Also
 * the mean's divisor. */
static int reduce_walk(const struct graph_kctx *k, struct gk_nd *it, float *scale)
{
        const struct graph_shape *x = &k->in_shape[0];
        bool red[GRAPH_MAX_RANK];
        char why[160];
        if (reduce_axes(k->node, x->rank, red, why, sizeof(why)) < 0)
                return -EINVAL;
        struct graph_shape kept = *x;
        size_t count = 1;
        for (uint32_t d = 0; d < x->rank; d++)
                if (red[d]) {
                        count *= (size_t)x->dims[d];
                        kept.dims[d] = 1;
                }
        const struct graph_shape *ops[2] = { x, &kept };
        gk_nd_init(it, x, ops, 2);
        *scale = k->node->op == GOP_REDUCE_MEAN ? (float)(1.0 / (double)count) : 1.0f;
        return 0;
}

int gk_reduce_fwd(struct graph_kctx *k)
{
        struct gk_nd it;
        float scale;
        if (reduce_walk(k, &it, &scale) < 0)
                return -EINVAL;
        const float *x = k->in[0]; /* the input's shape */
        float *y = k->out[0];      /* that shape with the reduced dims 1 (or gone) */
        size_t ny = graph_count(&k->out_shape[0]);
        memset(y, 0, sizeof(float) * ny);
        size_t idx[GRAPH_MAX_RANK] = { 0 }, off[GK_ND_OPS] = { 0 };
        uint32_t last = it.rank - 1;
        size_t n = it.dims[last], sy = it.st[1][last];
        do {
                const float *xo = x + off[0];
                float *yo = y + off[1];
                if (sy) {
                        for (size_t j = 0; j < n; j++)
                                yo[j] += xo[j];
                } else {
                        /* a run reduced into one output: summed in double, one rounding */
                        double acc = 0.0;
                        for (size_t j = 0; j < n; j++)
                                acc += xo[j];
                        yo[0] += (float)acc;
                }
        } while (gk_nd_next(&it, idx, off, 2));
        if (scale != 1.0f)
                for (size_t i = 0; i < ny; i++)
                        y[i] *= scale;
        return 0;
}

int gk_reduce_bwd(struct graph_kctx *k)
{
        float *dx = k->din[0];
        const float *dy = k->dout[0];
        if (!dx || !dy)
                return 0;
        struct gk_nd it;
        float scale;
        if (reduce_walk(k, &it, &scale) < 0)
                return -EINVAL;
        size_t idx[GRAPH_MAX_RANK] = { 0 }, off[GK_ND_OPS] = { 0 };
        uint32_t last = it.rank - 1;
        size_t n = it.dims[last], sy = it.st[1][last];
        do {
                float *dxo = dx + off[0];
                const float *dyo = dy + off[1];
                for (size_t j = 0; j < n; j++)
                        dxo[j] += dyo[j * sy] * scale;
        } while (gk_nd_next(&it, idx, off, 2));
        return 0;
}
