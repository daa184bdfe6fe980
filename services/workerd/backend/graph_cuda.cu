/* The graph engine's kernels on the CUDA backend (graph-internal.h: struct graph_kernels): a forward and a
 * backward for every op of graph.h, a second implementation of the CPU's (graph_k_*.c), held to them op
 * by op by tests/gpu/test_backend_equiv.c. Same contract: shapes and attributes are host values, every
 * buffer is device memory, a backward adds into din unless din_set says to write it whole, and the
 * per-node state has the CPU's layout (graph_exec.c's graph_moving_deltas reads a BatchNormalization's).
 *
 * cuBLAS for the products (Gemm, MatMul, Conv as im2col + sgemm, one example at a time inside the CPU's
 * scratch); small kernels of our own for the rest, on the backend's one stream. Reductions sum in double
 * per thread and per block, as the CPU sums its long runs in double. */
#include "cuda-internal.h"
#include "graph-internal.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#define THREADS 256
#define R GRAPH_MAX_RANK

static unsigned grid_for(size_t n)
{
        size_t b = (n + THREADS - 1) / THREADS;
        return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

#define FOR_EACH(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* A launch's error, at once. */
#define LAUNCHED() do { int e_ = cuda_status_errno(cudaGetLastError()); if (e_ < 0) return e_; } while (0)
#define CK(expr) do { int e_ = cuda_status_errno(expr); if (e_ < 0) return e_; } while (0)
#define DEV(k, d) struct cuda_graph_dev d; do { int e_ = cuda_graph_dev((k)->dev, &d); if (e_ < 0) return e_; } while (0)

static size_t count_of(const struct graph_shape *s)
{
        size_t c = 1;
        for (uint32_t i = 0; i < s->rank; i++)
                c *= (size_t)s->dims[i];
        return c;
}

static uint32_t axis_of(int64_t a, uint32_t rank)
{
        return (uint32_t)(a < 0 ? a + (int64_t)rank : a); /* checked by the shape functions */
}

static size_t prod(const struct graph_shape *s, uint32_t lo, uint32_t hi)
{
        size_t c = 1;
        for (uint32_t i = lo; i < hi; i++)
                c *= (size_t)s->dims[i];
        return c;
}

/* Row-major C (M, N) = alpha op(A) op(B) + beta C, A and B stored as they are (lda, ldb their row
 * lengths): as the CPU kernels' sgemm helper, through cuBLAS's column-major (operands swapped). */
static int mm(const struct cuda_graph_dev &d, bool ta, bool tb, size_t M, size_t N, size_t K, float alpha,
              const float *A, const float *B, float beta, float *C)
{
        if (M == 0 || N == 0)
                return 0;
        int lda = (int)(ta ? M : K), ldb = (int)(tb ? K : N), ldc = (int)N;
        return cublas_status_errno(cublasSgemm(d.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                               (int)N, (int)M, (int)K, &alpha, B, ldb, A, lda, &beta, C, ldc));
}

/* ---- n-dimensional walks ---- */

/* A shape walked in row-major order with up to 3 operands at their own strides (0: broadcast along that
 * dim), by value into the kernels. */
struct ndw {
        int rank;
        long long dims[R];
        long long st[3][R];
};

/* Row-major strides of shape o aligned from the right with full's rank, 0 where o has 1. */
static void bstrides(const struct graph_shape *full, const struct graph_shape *o, long long *st)
{
        uint32_t lead = full->rank - o->rank;
        long long stride = 1;
        for (uint32_t d = full->rank; d-- > 0;) {
                long long n = d < lead ? 1 : (long long)o->dims[d - lead];
                st[d] = n == 1 ? 0 : stride;
                stride *= n;
        }
}

static struct ndw nd_make(const struct graph_shape *full, const struct graph_shape *const *ops, int n_ops)
{
        struct ndw w;
        memset(&w, 0, sizeof(w));
        w.rank = (int)full->rank;
        for (uint32_t d = 0; d < full->rank; d++)
                w.dims[d] = full->dims[d];
        for (int o = 0; o < n_ops; o++)
                bstrides(full, ops[o], w.st[o]);
        return w;
}

__device__ inline void nd_offs(const ndw &w, size_t i, size_t *o)
{
        size_t a = 0, b = 0, c = 0;
        for (int d = w.rank - 1; d >= 0; d--) {
                size_t n = (size_t)w.dims[d], id = i % n;
                i /= n;
                a += id * (size_t)w.st[0][d];
                b += id * (size_t)w.st[1][d];
                c += id * (size_t)w.st[2][d];
        }
        o[0] = a;
        o[1] = b;
        o[2] = c;
}

__device__ inline float bin_one(int op, float a, float b)
{
        switch (op) {
        case GOP_ADD: return a + b;
        case GOP_SUB: return a - b;
        case GOP_MUL: return a * b;
        default: return a / b;
        }
}

/* as graph_k_elem.c's bin_grad */
__device__ inline float bin_grad(int op, int which, float dy, float a, float b)
{
        switch (op) {
        case GOP_ADD: return dy;
        case GOP_SUB: return which ? -dy : dy;
        case GOP_MUL: return which ? dy * a : dy * b;
        default: return which ? -(dy * (a / b)) / b : dy / b;
        }
}

/* A reduction: for every kept index j (over the kept dims, which is the target's storage order), the sum
 * over the reduced dims of operand 0 (op < 0) or of bin_grad(op, which, operands 0, 1, 2). */
struct redw {
        int nk, nr;
        long long kd[R], rd[R];
        long long ks[3][R], rs[3][R];
};

__device__ inline void red_offs(int n, const long long *dims, const long long (*st)[R], size_t i, size_t *o)
{
        for (int d = n - 1; d >= 0; d--) {
                size_t m = (size_t)dims[d], id = i % m;
                i /= m;
                o[0] += id * (size_t)st[0][d];
                o[1] += id * (size_t)st[1][d];
                o[2] += id * (size_t)st[2][d];
        }
}

__global__ void k_reduce(redw w, size_t n_keep, size_t n_red, const float *p0, const float *p1, const float *p2,
                         int op, int which, float scale, bool add, float *out)
{
        __shared__ double sh[THREADS];
        for (size_t j = blockIdx.x; j < n_keep; j += gridDim.x) {
                size_t base[3] = { 0, 0, 0 };
                red_offs(w.nk, w.kd, w.ks, j, base);
                double acc = 0;
                for (size_t r = threadIdx.x; r < n_red; r += blockDim.x) {
                        size_t o[3] = { base[0], base[1], base[2] };
                        red_offs(w.nr, w.rd, w.rs, r, o);
                        acc += op < 0 ? p0[o[0]] : bin_grad(op, which, p0[o[0]], p1[o[1]], p2[o[2]]);
                }
                sh[threadIdx.x] = acc;
                __syncthreads();
                for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
                        if (threadIdx.x < s)
                                sh[threadIdx.x] += sh[threadIdx.x + s];
                        __syncthreads();
                }
                if (threadIdx.x == 0)
                        out[j] = (add ? out[j] : 0.0f) + (float)(sh[0] * scale);
                __syncthreads();
        }
}

/* out (target's shape, aligned from the right with full's) = [out +] scale * the sum over the dims of full
 * where target has 1 of operand 0, or of bin_grad over operands 0..2 (shapes ops, each broadcasting to
 * full). */
static int reduce_to(const struct cuda_graph_dev &d, float *out, bool add, float scale, const struct graph_shape *full,
                     const struct graph_shape *target, int n_ops, const struct graph_shape *const *ops,
                     const float *const *p, int op, int which)
{
        long long st[3][R];
        memset(st, 0, sizeof(st));
        for (int o = 0; o < n_ops; o++)
                bstrides(full, ops[o], st[o]);
        redw w;
        memset(&w, 0, sizeof(w));
        size_t nk = 1, nr = 1;
        uint32_t lead = full->rank - target->rank;
        for (uint32_t dd = 0; dd < full->rank; dd++) {
                long long n = full->dims[dd];
                if (n == 1)
                        continue;
                bool kept = dd >= lead && target->dims[dd - lead] != 1;
                int at = kept ? w.nk++ : w.nr++;
                (kept ? w.kd : w.rd)[at] = n;
                for (int o = 0; o < 3; o++)
                        (kept ? w.ks : w.rs)[o][at] = st[o][dd];
                *(kept ? &nk : &nr) *= (size_t)n;
        }
        k_reduce<<<(unsigned)(nk < 65535 ? nk : 65535), THREADS, 0, d.stream>>>(
                w, nk, nr, p[0], n_ops > 1 ? p[1] : p[0], n_ops > 2 ? p[2] : p[0], op, which, scale, add, out);
        LAUNCHED();
        return 0;
}

__global__ void k_add(float *y, const float *x, size_t n)
{
        FOR_EACH(i, n)
                y[i] += x[i];
}

static int add_into(const struct cuda_graph_dev &d, float *y, const float *x, size_t n)
{
        if (n == 0)
                return 0;
        k_add<<<grid_for(n), THREADS, 0, d.stream>>>(y, x, n);
        LAUNCHED();
        return 0;
}

static int zero(const struct cuda_graph_dev &d, void *p, size_t bytes)
{
        CK(cudaMemsetAsync(p, 0, bytes, d.stream));
        return 0;
}

/* ---- Gemm, MatMul ---- */

__global__ void k_bcast_scale(float *y, const float *c, float beta, ndw w, size_t n)
{
        FOR_EACH(i, n) {
                size_t o[3];
                nd_offs(w, i, o);
                y[i] = beta * c[o[1]];
        }
}

static int gemm_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        const struct graph_attrs *at = &k->node->a;
        bool ta = at->trans_a, tb = at->trans_b;
        size_t M = (size_t)k->out_shape[0].dims[0], N = (size_t)k->out_shape[0].dims[1];
        size_t K = (size_t)k->in_shape[0].dims[ta ? 0 : 1];
        const float *A = (const float *)k->in[0], *B = (const float *)k->in[1], *C = (const float *)k->in[2];
        float *Y = (float *)k->out[0];
        float beta = 0.0f;
        if (C && at->beta != 0.0f) {
                const struct graph_shape *ops[2] = { &k->out_shape[0], &k->in_shape[2] };
                ndw w = nd_make(&k->out_shape[0], ops, 2);
                k_bcast_scale<<<grid_for(M * N), THREADS, 0, d.stream>>>(Y, C, at->beta, w, M * N);
                LAUNCHED();
                beta = 1.0f;
        }
        return mm(d, ta, tb, M, N, K, at->alpha, A, B, beta, Y);
}

static int gemm_bwd(struct graph_kctx *k)
{
        const float *dY = k->dout[0];
        if (!dY)
                return 0;
        DEV(k, d);
        const struct graph_attrs *at = &k->node->a;
        bool ta = at->trans_a, tb = at->trans_b;
        size_t M = (size_t)k->out_shape[0].dims[0], N = (size_t)k->out_shape[0].dims[1];
        size_t K = (size_t)k->in_shape[0].dims[ta ? 0 : 1];
        const float *A = (const float *)k->in[0], *B = (const float *)k->in[1];
        float *dA = k->din[0], *dB = k->din[1], *dC = k->din[2];
        float ba = k->din_set[0] ? 0.0f : 1.0f, bb = k->din_set[1] ? 0.0f : 1.0f;
        int r;
        if (dA && (r = !ta ? mm(d, false, !tb, M, K, N, at->alpha, dY, B, ba, dA)
                           : mm(d, tb, true, K, M, N, at->alpha, B, dY, ba, dA)) < 0)
                return r;
        if (dB && (r = !tb ? mm(d, !ta, false, K, N, M, at->alpha, A, dY, bb, dB)
                           : mm(d, true, ta, N, K, M, at->alpha, dY, A, bb, dB)) < 0)
                return r;
        if (dC && k->in[2]) {
                const struct graph_shape *ops[1] = { &k->out_shape[0] };
                const float *p[1] = { dY };
                return reduce_to(d, dC, !k->din_set[2], at->beta, &k->out_shape[0], &k->in_shape[2], 1, ops, p, -1, 0);
        }
        return 0;
}

struct mm_dims {
        size_t nb, ba, bb, M, K, N;
};

static struct mm_dims mm_dims_of(const struct graph_kctx *k)
{
        const struct graph_shape *A = &k->in_shape[0], *B = &k->in_shape[1], *Y = &k->out_shape[0];
        struct mm_dims m;
        m.nb = Y->rank == 3 ? (size_t)Y->dims[0] : 1;
        m.ba = A->rank == 3 ? (size_t)A->dims[0] : 1;
        m.bb = B->rank == 3 ? (size_t)B->dims[0] : 1;
        m.M = (size_t)A->dims[A->rank - 2];
        m.K = (size_t)A->dims[A->rank - 1];
        m.N = (size_t)B->dims[B->rank - 1];
        return m;
}

static int matmul_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        struct mm_dims m = mm_dims_of(k);
        const float *A = (const float *)k->in[0], *B = (const float *)k->in[1];
        float *Y = (float *)k->out[0];
        if (m.bb == 1)
                return mm(d, false, false, m.ba * m.M, m.N, m.K, 1.0f, A, B, 0.0f, Y);
        float one = 1.0f, zero_f = 0.0f;
        /* column-major: Y_i^T (N, M) = B_i^T A_i^T, A shared (stride 0) where ba is 1 */
        return cublas_status_errno(cublasSgemmStridedBatched(
                d.blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)m.N, (int)m.M, (int)m.K, &one, B, (int)m.N,
                (long long)(m.K * m.N), A, (int)m.K, m.ba == 1 ? 0 : (long long)(m.M * m.K), &zero_f, Y, (int)m.N,
                (long long)(m.M * m.N), (int)m.nb));
}

/* A shared input's gradient gathers every batch's, one product after another on the stream (a strided
 * batch would write it concurrently). */
static int matmul_bwd(struct graph_kctx *k)
{
        const float *dY = k->dout[0];
        if (!dY)
                return 0;
        DEV(k, d);
        struct mm_dims m = mm_dims_of(k);
        const float *A = (const float *)k->in[0], *B = (const float *)k->in[1];
        float *dA = k->din[0], *dB = k->din[1];
        int r;
        if (m.bb == 1) {
                if (dA && (r = mm(d, false, true, m.ba * m.M, m.K, m.N, 1.0f, dY, B, 1.0f, dA)) < 0)
                        return r;
                if (dB && (r = mm(d, true, false, m.K, m.N, m.ba * m.M, 1.0f, A, dY, 1.0f, dB)) < 0)
                        return r;
                return 0;
        }
        for (size_t i = 0; i < m.nb; i++) {
                size_t ia = m.ba == 1 ? 0 : i;
                const float *dYi = dY + i * m.M * m.N;
                if (dA && (r = mm(d, false, true, m.M, m.K, m.N, 1.0f, dYi, B + i * m.K * m.N, 1.0f,
                                  dA + ia * m.M * m.K)) < 0)
                        return r;
                if (dB && (r = mm(d, true, false, m.K, m.N, m.M, 1.0f, A + ia * m.M * m.K, dYi, 1.0f,
                                  dB + i * m.K * m.N)) < 0)
                        return r;
        }
        return 0;
}

/* ---- Add, Sub, Mul, Div ---- */

__global__ void k_binary(int op, float *y, const float *a, const float *b, ndw w, size_t n)
{
        FOR_EACH(i, n) {
                size_t o[3];
                nd_offs(w, i, o);
                y[i] = bin_one(op, a[o[1]], b[o[2]]);
        }
}

__global__ void k_binary_grad(int op, int which, float *dd, const float *dy, const float *a, const float *b, ndw w,
                              size_t n)
{
        FOR_EACH(i, n) {
                size_t o[3];
                nd_offs(w, i, o);
                dd[i] += bin_grad(op, which, dy[i], a[o[1]], b[o[2]]);
        }
}

static int binary_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        const struct graph_shape *ops[3] = { &k->out_shape[0], &k->in_shape[0], &k->in_shape[1] };
        ndw w = nd_make(&k->out_shape[0], ops, 3);
        size_t n = count_of(&k->out_shape[0]);
        k_binary<<<grid_for(n), THREADS, 0, d.stream>>>((int)k->node->op, (float *)k->out[0], (const float *)k->in[0],
                                                        (const float *)k->in[1], w, n);
        LAUNCHED();
        return 0;
}

/* An input as large as the output takes its gradient element by element; a broadcast one the sum over
 * the dims it is broadcast along. */
static int binary_bwd(struct graph_kctx *k)
{
        if (!k->dout[0])
                return 0;
        DEV(k, d);
        const struct graph_shape *ops[3] = { &k->out_shape[0], &k->in_shape[0], &k->in_shape[1] };
        ndw w = nd_make(&k->out_shape[0], ops, 3);
        size_t n = count_of(&k->out_shape[0]);
        const float *p[3] = { k->dout[0], (const float *)k->in[0], (const float *)k->in[1] };
        for (int which = 0; which < 2; which++) {
                float *dd = k->din[which];
                if (!dd)
                        continue;
                int r;
                if (k->din_set[which] && (r = zero(d, dd, sizeof(float) * count_of(&k->in_shape[which]))) < 0)
                        return r;
                if (count_of(&k->in_shape[which]) == n) {
                        k_binary_grad<<<grid_for(n), THREADS, 0, d.stream>>>((int)k->node->op, which, dd, p[0], p[1],
                                                                             p[2], w, n);
                        LAUNCHED();
                        continue;
                }
                r = reduce_to(d, dd, true, 1.0f, &k->out_shape[0], &k->in_shape[which], 3, ops, p,
                              (int)k->node->op, which);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* ---- Relu, LeakyRelu, Sigmoid, Tanh ---- */

__global__ void k_unary_fwd(int op, const float *x, float *y, float alpha, size_t n)
{
        FOR_EACH(i, n) {
                float v = x[i];
                y[i] = op == GOP_RELU         ? (v > 0.0f ? v : 0.0f)
                       : op == GOP_LEAKY_RELU ? (v > 0.0f ? v : alpha * v)
                       : op == GOP_SIGMOID    ? 1.0f / (1.0f + expf(-v))
                                              : tanhf(v);
        }
}

__global__ void k_unary_bwd(int op, const float *x, const float *y, const float *dy, float *dx, float alpha,
                            bool set, size_t n)
{
        FOR_EACH(i, n) {
                float dv = dy[i];
                float g = op == GOP_RELU         ? (x[i] > 0.0f ? dv : 0.0f)
                          : op == GOP_LEAKY_RELU ? (x[i] > 0.0f ? dv : alpha * dv)
                          : op == GOP_SIGMOID    ? dv * y[i] * (1.0f - y[i])
                                                 : dv * (1.0f - y[i] * y[i]);
                dx[i] = set ? g : dx[i] + g;
        }
}

static int unary_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        size_t n = count_of(&k->out_shape[0]);
        k_unary_fwd<<<grid_for(n), THREADS, 0, d.stream>>>((int)k->node->op, (const float *)k->in[0],
                                                           (float *)k->out[0], k->node->a.alpha, n);
        LAUNCHED();
        return 0;
}

static int unary_bwd(struct graph_kctx *k)
{
        if (!k->din[0] || !k->dout[0])
                return 0;
        DEV(k, d);
        size_t n = count_of(&k->out_shape[0]);
        k_unary_bwd<<<grid_for(n), THREADS, 0, d.stream>>>((int)k->node->op, (const float *)k->in[0],
                                                           (const float *)k->out[0], k->dout[0], k->din[0],
                                                           k->node->a.alpha, k->din_set[0], n);
        LAUNCHED();
        return 0;
}

/* ---- Softmax, LogSoftmax: one thread a line (L values, inner apart) ---- */

__global__ void k_softmax_fwd(const float *xb, float *yb, size_t outer, size_t L, size_t inner, bool log_form)
{
        FOR_EACH(line, outer * inner) {
                size_t o = line / inner, i = line % inner;
                const float *x = xb + o * L * inner + i;
                float *y = yb + o * L * inner + i;
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
                        float ls = (float)log(sum);
                        for (size_t l = 0; l < L; l++)
                                y[l * inner] = (x[l * inner] - mx) - ls;
                } else {
                        float inv = (float)(1.0 / sum);
                        for (size_t l = 0; l < L; l++)
                                y[l * inner] *= inv;
                }
        }
}

__global__ void k_softmax_bwd(const float *yb, const float *dyb, float *dxb, size_t outer, size_t L, size_t inner,
                              bool log_form)
{
        FOR_EACH(line, outer * inner) {
                size_t base = (line / inner) * L * inner + line % inner;
                const float *y = yb + base, *dy = dyb + base;
                float *dx = dxb + base;
                double s = 0.0;
                for (size_t l = 0; l < L; l++)
                        s += log_form ? dy[l * inner] : (double)dy[l * inner] * y[l * inner];
                float sf = (float)s;
                for (size_t l = 0; l < L; l++)
                        dx[l * inner] += log_form ? dy[l * inner] - expf(y[l * inner]) * sf : y[l * inner] * (dy[l * inner] - sf);
        }
}

static void softmax_dims(const struct graph_kctx *k, size_t *outer, size_t *L, size_t *inner)
{
        const struct graph_shape *s = &k->in_shape[0];
        uint32_t axis = axis_of(k->node->a.axis, s->rank);
        *outer = prod(s, 0, axis);
        *L = (size_t)s->dims[axis];
        *inner = prod(s, axis + 1, s->rank);
}

static int softmax_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        size_t outer, L, inner;
        softmax_dims(k, &outer, &L, &inner);
        k_softmax_fwd<<<grid_for(outer * inner), THREADS, 0, d.stream>>>((const float *)k->in[0], (float *)k->out[0],
                                                                         outer, L, inner,
                                                                         k->node->op == GOP_LOG_SOFTMAX);
        LAUNCHED();
        return 0;
}

static int softmax_bwd(struct graph_kctx *k)
{
        if (!k->din[0] || !k->dout[0])
                return 0;
        DEV(k, d);
        size_t outer, L, inner;
        softmax_dims(k, &outer, &L, &inner);
        k_softmax_bwd<<<grid_for(outer * inner), THREADS, 0, d.stream>>>((const float *)k->out[0], k->dout[0],
                                                                         k->din[0], outer, L, inner,
                                                                         k->node->op == GOP_LOG_SOFTMAX);
        LAUNCHED();
        return 0;
}

/* ---- Conv, MaxPool, AveragePool: windows over (N, C, H, W) ---- */

struct win {
        long long N, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW;
};

/* The geometry from the attributes (checked by the shape functions) and the output's shape. */
static struct win win_of(const struct graph_attrs *a, const struct graph_shape *x, const struct graph_shape *y,
                         long long kh, long long kw)
{
        struct win q;
        q.N = x->dims[0];
        q.C = x->dims[1];
        q.H = x->dims[2];
        q.W = x->dims[3];
        q.kh = kh;
        q.kw = kw;
        q.sh = a->n_strides ? a->strides[0] : 1;
        q.sw = a->n_strides ? a->strides[1] : 1;
        q.dh = a->n_dilations ? a->dilations[0] : 1;
        q.dw = a->n_dilations ? a->dilations[1] : 1;
        q.pt = a->n_pads ? a->pads[0] : 0;
        q.pl = a->n_pads ? a->pads[1] : 0;
        q.OH = y->dims[2];
        q.OW = y->dims[3];
        return q;
}

/* col (C*kh*kw, OH*OW) of one example: 0 in the padding */
__global__ void k_im2col(const float *img, win q, float *col)
{
        size_t ohw = (size_t)(q.OH * q.OW), n = (size_t)(q.C * q.kh * q.kw) * ohw;
        FOR_EACH(i, n) {
                size_t row = i / ohw, p = i % ohw;
                long long kx = (long long)(row % q.kw), ky = (long long)(row / q.kw % q.kh), ci = (long long)(row / q.kw / q.kh);
                long long oy = (long long)p / q.OW, ox = (long long)p % q.OW;
                long long iy = oy * q.sh - q.pt + ky * q.dh, ix = ox * q.sw - q.pl + kx * q.dw;
                col[i] = iy >= 0 && iy < q.H && ix >= 0 && ix < q.W ? img[(ci * q.H + iy) * q.W + ix] : 0.0f;
        }
}

/* img += col2im(col): each input element gathers the columns that read it (no atomics) */
__global__ void k_col2im_add(const float *col, win q, float *img)
{
        size_t ohw = (size_t)(q.OH * q.OW), n = (size_t)(q.C * q.H * q.W);
        FOR_EACH(i, n) {
                long long ix = (long long)(i % q.W), iy = (long long)(i / q.W % q.H), ci = (long long)(i / q.W / q.H);
                float s = 0.0f;
                for (long long ky = 0; ky < q.kh; ky++) {
                        long long ty = iy + q.pt - ky * q.dh;
                        if (ty < 0 || ty % q.sh || ty / q.sh >= q.OH)
                                continue;
                        for (long long kx = 0; kx < q.kw; kx++) {
                                long long tx = ix + q.pl - kx * q.dw;
                                if (tx < 0 || tx % q.sw || tx / q.sw >= q.OW)
                                        continue;
                                size_t row = (size_t)((ci * q.kh + ky) * q.kw + kx);
                                s += col[row * ohw + (size_t)(ty / q.sh * q.OW + tx / q.sw)];
                        }
                }
                img[i] += s;
        }
}

__global__ void k_conv_bias(float *y, const float *bias, size_t N, size_t M, size_t ohw)
{
        FOR_EACH(i, N * M * ohw)
                y[i] += bias[i / ohw % M];
}

static int conv_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        const struct graph_shape *ws = &k->in_shape[1];
        struct win q = win_of(&k->node->a, &k->in_shape[0], &k->out_shape[0], ws->dims[2], ws->dims[3]);
        const float *x = (const float *)k->in[0], *w = (const float *)k->in[1], *bias = (const float *)k->in[2];
        float *y = (float *)k->out[0], *col = k->scratch;
        size_t N = (size_t)q.N, M = (size_t)ws->dims[0], ohw = (size_t)(q.OH * q.OW);
        size_t chw = (size_t)(q.C * q.H * q.W), ckk = (size_t)(q.C * q.kh * q.kw);
        for (size_t b = 0; b < N; b++) {
                k_im2col<<<grid_for(ckk * ohw), THREADS, 0, d.stream>>>(x + b * chw, q, col);
                LAUNCHED();
                int r = mm(d, false, false, M, ohw, ckk, 1.0f, w, col, 0.0f, y + b * M * ohw);
                if (r < 0)
                        return r;
        }
        if (bias) {
                k_conv_bias<<<grid_for(N * M * ohw), THREADS, 0, d.stream>>>(y, bias, N, M, ohw);
                LAUNCHED();
        }
        return 0;
}

static int conv_bwd(struct graph_kctx *k)
{
        const float *dy = k->dout[0];
        if (!dy)
                return 0;
        DEV(k, d);
        float *dx = k->din[0], *dw = k->din[1], *db = k->node->n_in > 2 ? k->din[2] : NULL;
        const struct graph_shape *ws = &k->in_shape[1];
        struct win q = win_of(&k->node->a, &k->in_shape[0], &k->out_shape[0], ws->dims[2], ws->dims[3]);
        const float *x = (const float *)k->in[0], *w = (const float *)k->in[1];
        float *col = k->scratch;
        size_t N = (size_t)q.N, M = (size_t)ws->dims[0], ohw = (size_t)(q.OH * q.OW);
        size_t chw = (size_t)(q.C * q.H * q.W), ckk = (size_t)(q.C * q.kh * q.kw);
        int r;
        if (db) {
                struct graph_shape full = { 3, { (int64_t)N, (int64_t)M, (int64_t)ohw } };
                struct graph_shape tgt = { 3, { 1, (int64_t)M, 1 } };
                const struct graph_shape *ops[1] = { &full };
                const float *p[1] = { dy };
                if ((r = reduce_to(d, db, !k->din_set[2], 1.0f, &full, &tgt, 1, ops, p, -1, 0)) < 0)
                        return r;
        }
        if (dx && k->din_set[0] && (r = zero(d, dx, sizeof(float) * N * chw)) < 0)
                return r;
        float dw_beta = k->din_set[1] ? 0.0f : 1.0f;
        for (size_t b = 0; (dx || dw) && b < N; b++) {
                const float *dyb = dy + b * M * ohw;
                if (dw) {
                        k_im2col<<<grid_for(ckk * ohw), THREADS, 0, d.stream>>>(x + b * chw, q, col);
                        LAUNCHED();
                        if ((r = mm(d, false, true, M, ckk, ohw, 1.0f, dyb, col, dw_beta, dw)) < 0)
                                return r;
                        dw_beta = 1.0f;
                }
                if (dx) {
                        if ((r = mm(d, true, false, ckk, ohw, M, 1.0f, w, dyb, 0.0f, col)) < 0)
                                return r;
                        k_col2im_add<<<grid_for(chw), THREADS, 0, d.stream>>>(col, q, dx + b * chw);
                        LAUNCHED();
                }
        }
        return 0;
}

/* the window of output (oy, ox) clipped to the input */
__device__ inline void pool_window(const win &q, long long oy, long long ox, long long *y0, long long *y1,
                                   long long *x0, long long *x1)
{
        long long ys = oy * q.sh - q.pt, xs = ox * q.sw - q.pl;
        *y0 = ys > 0 ? ys : 0;
        *y1 = ys + q.kh < q.H ? ys + q.kh : q.H;
        *x0 = xs > 0 ? xs : 0;
        *x1 = xs + q.kw < q.W ? xs + q.kw : q.W;
}

/* the first maximum in row-major order, as the CPU's window_argmax */
__device__ inline size_t window_argmax(const float *plane, const win &q, long long y0, long long y1, long long x0,
                                       long long x1)
{
        size_t best = (size_t)(y0 * q.W + x0);
        for (long long iy = y0; iy < y1; iy++)
                for (long long ix = x0; ix < x1; ix++) {
                        size_t i = (size_t)(iy * q.W + ix);
                        if (plane[i] > plane[best])
                                best = i;
                }
        return best;
}

__global__ void k_pool_fwd(const float *x, float *y, win q, bool max, bool include_pad)
{
        size_t ohw = (size_t)(q.OH * q.OW), hw = (size_t)(q.H * q.W);
        FOR_EACH(i, (size_t)(q.N * q.C) * ohw) {
                size_t p = i / ohw;
                long long oy = (long long)(i % ohw) / q.OW, ox = (long long)(i % ohw) % q.OW, y0, y1, x0, x1;
                pool_window(q, oy, ox, &y0, &y1, &x0, &x1);
                const float *plane = x + p * hw;
                if (max) {
                        y[i] = plane[window_argmax(plane, q, y0, y1, x0, x1)];
                        continue;
                }
                float s = 0.0f;
                for (long long iy = y0; iy < y1; iy++)
                        for (long long ix = x0; ix < x1; ix++)
                                s += plane[iy * q.W + ix];
                y[i] = s / (include_pad ? (float)(q.kh * q.kw) : (float)((y1 - y0) * (x1 - x0)));
        }
}

/* windows overlap where the stride is below the kernel: the scatter adds atomically */
__global__ void k_pool_bwd(const float *x, const float *dy, float *dx, win q, bool max, bool include_pad)
{
        size_t ohw = (size_t)(q.OH * q.OW), hw = (size_t)(q.H * q.W);
        FOR_EACH(i, (size_t)(q.N * q.C) * ohw) {
                size_t p = i / ohw;
                long long oy = (long long)(i % ohw) / q.OW, ox = (long long)(i % ohw) % q.OW, y0, y1, x0, x1;
                pool_window(q, oy, ox, &y0, &y1, &x0, &x1);
                float *dplane = dx + p * hw;
                if (max) {
                        atomicAdd(dplane + window_argmax(x + p * hw, q, y0, y1, x0, x1), dy[i]);
                        continue;
                }
                float g = dy[i] / (include_pad ? (float)(q.kh * q.kw) : (float)((y1 - y0) * (x1 - x0)));
                for (long long iy = y0; iy < y1; iy++)
                        for (long long ix = x0; ix < x1; ix++)
                                atomicAdd(dplane + iy * q.W + ix, g);
        }
}

static int pool_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        const struct graph_attrs *a = &k->node->a;
        struct win q = win_of(a, &k->in_shape[0], &k->out_shape[0], a->kernel[0], a->kernel[1]);
        size_t n = count_of(&k->out_shape[0]);
        k_pool_fwd<<<grid_for(n), THREADS, 0, d.stream>>>((const float *)k->in[0], (float *)k->out[0], q,
                                                          k->node->op == GOP_MAXPOOL, a->count_include_pad != 0);
        LAUNCHED();
        return 0;
}

static int pool_bwd(struct graph_kctx *k)
{
        if (!k->dout[0] || !k->din[0])
                return 0;
        DEV(k, d);
        const struct graph_attrs *a = &k->node->a;
        struct win q = win_of(a, &k->in_shape[0], &k->out_shape[0], a->kernel[0], a->kernel[1]);
        size_t n = count_of(&k->out_shape[0]);
        int r;
        if (k->din_set[0] && (r = zero(d, k->din[0], sizeof(float) * count_of(&k->in_shape[0]))) < 0)
                return r;
        k_pool_bwd<<<grid_for(n), THREADS, 0, d.stream>>>((const float *)k->in[0], k->dout[0], k->din[0], q,
                                                          k->node->op == GOP_MAXPOOL, a->count_include_pad != 0);
        LAUNCHED();
        return 0;
}

/* ---- GlobalAveragePool ---- */

static void planes_of(const struct graph_shape *x, size_t *planes, size_t *per)
{
        *planes = (size_t)(x->dims[0] * x->dims[1]);
        *per = prod(x, 2, x->rank);
}

static int gap_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        size_t planes, per;
        planes_of(&k->in_shape[0], &planes, &per);
        struct graph_shape full = { 2, { (int64_t)planes, (int64_t)per } }, tgt = { 2, { (int64_t)planes, 1 } };
        const struct graph_shape *ops[1] = { &full };
        const float *p[1] = { (const float *)k->in[0] };
        return reduce_to(d, (float *)k->out[0], false, (float)(1.0 / (double)per), &full, &tgt, 1, ops, p, -1, 0);
}

__global__ void k_gap_bwd(const float *dy, float *dx, size_t planes, size_t per)
{
        FOR_EACH(i, planes * per)
                dx[i] += dy[i / per] / (float)per;
}

static int gap_bwd(struct graph_kctx *k)
{
        if (!k->dout[0] || !k->din[0])
                return 0;
        DEV(k, d);
        size_t planes, per;
        planes_of(&k->in_shape[0], &planes, &per);
        k_gap_bwd<<<grid_for(planes * per), THREADS, 0, d.stream>>>(k->dout[0], k->din[0], planes, per);
        LAUNCHED();
        return 0;
}

/* ---- BatchNormalization: one block a channel; state mean, 1/std, the batch's biased variance (C each) ---- */

__device__ inline void block_sum2(double *a, double *b, double *sh)
{
        double *s1 = sh, *s2 = sh + THREADS;
        s1[threadIdx.x] = *a;
        s2[threadIdx.x] = *b;
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
                if (threadIdx.x < s) {
                        s1[threadIdx.x] += s1[threadIdx.x + s];
                        s2[threadIdx.x] += s2[threadIdx.x + s];
                }
                __syncthreads();
        }
        *a = s1[0];
        *b = s2[0];
        __syncthreads();
}

__global__ void k_bn_fwd(const float *x, const float *scale, const float *bias, const float *imean, const float *ivar,
                         float *y, float *rmean, float *rvar, float *state, size_t N, size_t C, size_t S,
                         bool training, double eps, double mom)
{
        __shared__ double sh[2 * THREADS];
        size_t c = blockIdx.x;
        float *mean = state, *istd = state + C, *bvar = state + 2 * C;
        double mu, var;
        if (training) {
                float shift = isfinite(imean[c]) ? imean[c] : 0.0f;
                double s1 = 0, s2 = 0, m = (double)(N * S);
                for (size_t i = threadIdx.x; i < N * S; i += blockDim.x) {
                        double dv = (double)x[(i / S * C + c) * S + i % S] - shift;
                        s1 += dv;
                        s2 += dv * dv;
                }
                block_sum2(&s1, &s2, sh);
                double dm = s1 / m;
                mu = shift + dm;
                var = s2 / m - dm * dm;
                if (var < 0)
                        var = 0;
        } else {
                mu = imean[c];
                var = ivar[c];
        }
        double is = 1.0 / sqrt(var + eps);
        if (threadIdx.x == 0) {
                if (rmean)
                        rmean[c] = training ? (float)(imean[c] * mom + mu * (1 - mom)) : imean[c];
                if (rvar)
                        rvar[c] = training ? (float)(ivar[c] * mom + var * (1 - mom)) : ivar[c];
                bvar[c] = (float)var;
                mean[c] = (float)mu;
                istd[c] = (float)is;
        }
        double a = scale[c] * is, b0 = bias[c] - mu * a;
        for (size_t i = threadIdx.x; i < N * S; i += blockDim.x) {
                size_t at = (i / S * C + c) * S + i % S;
                y[at] = (float)(a * x[at] + b0);
        }
}

__global__ void k_bn_bwd(const float *x, const float *scale, const float *dy, const float *state, float *dx,
                         float *dscale, float *dbias, size_t N, size_t C, size_t S, bool training, bool set_dx,
                         bool set_ds, bool set_db)
{
        __shared__ double sh[2 * THREADS];
        size_t c = blockIdx.x;
        float mu = state[c], is = state[C + c];
        double sdy = 0, sdyx = 0;
        for (size_t i = threadIdx.x; i < N * S; i += blockDim.x) {
                size_t at = (i / S * C + c) * S + i % S;
                sdy += dy[at];
                sdyx += (double)dy[at] * (x[at] - mu);
        }
        block_sum2(&sdy, &sdyx, sh);
        sdyx *= is;
        if (threadIdx.x == 0) {
                if (dscale)
                        dscale[c] = (set_ds ? 0.0f : dscale[c]) + (float)sdyx;
                if (dbias)
                        dbias[c] = (set_db ? 0.0f : dbias[c]) + (float)sdy;
        }
        if (!dx)
                return;
        double m = (double)(N * S), a = (double)scale[c] * is;
        double k0 = training ? a * sdy / m : 0.0, k1 = training ? a * sdyx / m * is : 0.0;
        for (size_t i = threadIdx.x; i < N * S; i += blockDim.x) {
                size_t at = (i / S * C + c) * S + i % S;
                float v = (float)(a * dy[at] - k0 - k1 * ((double)x[at] - mu));
                dx[at] = set_dx ? v : dx[at] + v;
        }
}

static void bn_dims(const struct graph_shape *x, size_t *N, size_t *C, size_t *S)
{
        *N = (size_t)x->dims[0];
        *C = (size_t)x->dims[1];
        *S = prod(x, 2, x->rank);
}

static int batchnorm_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        size_t N, C, S;
        bn_dims(&k->in_shape[0], &N, &C, &S);
        k_bn_fwd<<<(unsigned)C, THREADS, 0, d.stream>>>(
                (const float *)k->in[0], (const float *)k->in[1], (const float *)k->in[2], (const float *)k->in[3],
                (const float *)k->in[4], (float *)k->out[0], (float *)k->out[1], (float *)k->out[2], k->state, N, C, S,
                k->training, k->node->a.epsilon, k->node->a.momentum);
        LAUNCHED();
        return 0;
}

/* the gradients of input_mean and input_var are not propagated (as the CPU's): set ones are zeroed */
static int batchnorm_bwd(struct graph_kctx *k)
{
        if (!k->dout[0])
                return 0;
        DEV(k, d);
        size_t N, C, S;
        bn_dims(&k->in_shape[0], &N, &C, &S);
        int r;
        for (uint32_t j = 3; j < 5; j++)
                if (k->din[j] && k->din_set[j] && (r = zero(d, k->din[j], sizeof(float) * C)) < 0)
                        return r;
        k_bn_bwd<<<(unsigned)C, THREADS, 0, d.stream>>>((const float *)k->in[0], (const float *)k->in[1], k->dout[0],
                                                        k->state, k->din[0], k->din[1], k->din[2], N, C, S, k->training,
                                                        k->din_set[0], k->din_set[1], k->din_set[2]);
        LAUNCHED();
        return 0;
}

/* ---- Dropout: state[0] the scale applied (0: passed through), then the mask ---- */

__device__ inline uint64_t splitmix64(uint64_t z)
{
        z += 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

static uint64_t splitmix64_host(uint64_t z)
{
        z += 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

/* element i's draw: the CPU's hash of (seed, node, i), bit for bit */
__global__ void k_dropout_fwd(const float *x, float *y, float *state, uint64_t key, float ratio, float scale, size_t n)
{
        if (blockIdx.x == 0 && threadIdx.x == 0)
                state[0] = scale;
        float *mask = state + 1;
        FOR_EACH(i, n) {
                float u = (float)(splitmix64(key + i * 0x9e3779b97f4a7c15ull) >> 40) * 0x1p-24f;
                bool keep = u >= ratio;
                mask[i] = keep ? 1.0f : 0.0f;
                y[i] = keep ? x[i] * scale : 0.0f;
        }
}

__global__ void k_dropout_bwd(const float *dy, float *dx, const float *state, size_t n)
{
        float scale = state[0];
        const float *mask = state + 1;
        FOR_EACH(i, n)
                dx[i] += scale == 0.0f ? dy[i] : (mask[i] != 0.0f ? dy[i] * scale : 0.0f);
}

static int dropout_fwd(struct graph_kctx *k)
{
        if (!k->state)
                return -EINVAL;
        DEV(k, d);
        size_t n = count_of(&k->out_shape[0]);
        float ratio = k->node->a.ratio;
        if (!k->training || ratio == 0.0f) {
                CK(cudaMemsetAsync(k->state, 0, sizeof(float), d.stream)); /* 0.0f */
                CK(cudaMemcpyAsync(k->out[0], k->in[0], sizeof(float) * n, cudaMemcpyDeviceToDevice, d.stream));
                return 0;
        }
        uint64_t key = splitmix64_host(k->seed ^ splitmix64_host(0x6a09e667f3bcc909ull + k->node_index));
        k_dropout_fwd<<<grid_for(n), THREADS, 0, d.stream>>>((const float *)k->in[0], (float *)k->out[0], k->state, key,
                                                             ratio, 1.0f / (1.0f - ratio), n);
        LAUNCHED();
        return 0;
}

static int dropout_bwd(struct graph_kctx *k)
{
        if (!k->din[0] || !k->dout[0])
                return 0;
        if (!k->state)
                return -EINVAL;
        DEV(k, d);
        size_t n = count_of(&k->out_shape[0]);
        k_dropout_bwd<<<grid_for(n), THREADS, 0, d.stream>>>(k->dout[0], k->din[0], k->state, n);
        LAUNCHED();
        return 0;
}

/* ---- LayerNormalization: one block a row; state mean, 1/std (a row each) ---- */

__global__ void k_ln_fwd(const float *x, const float *scale, const float *bias, float *y, float *state, size_t Rn,
                         size_t D, double eps)
{
        __shared__ double sh[2 * THREADS];
        for (size_t r = blockIdx.x; r < Rn; r += gridDim.x) {
                const float *xr = x + r * D;
                double s = 0, unused = 0;
                for (size_t i = threadIdx.x; i < D; i += blockDim.x)
                        s += xr[i];
                block_sum2(&s, &unused, sh);
                double mu = s / (double)D, ss = 0;
                unused = 0;
                for (size_t i = threadIdx.x; i < D; i += blockDim.x)
                        ss += (xr[i] - mu) * (xr[i] - mu);
                block_sum2(&ss, &unused, sh);
                double is = 1.0 / sqrt(ss / (double)D + eps);
                if (threadIdx.x == 0) {
                        state[r] = (float)mu;
                        state[Rn + r] = (float)is;
                }
                for (size_t i = threadIdx.x; i < D; i += blockDim.x)
                        y[r * D + i] = (float)((xr[i] - mu) * is * scale[i] + (bias ? bias[i] : 0.0f));
        }
}

__global__ void k_ln_bwd_x(const float *x, const float *scale, const float *dy, const float *state, float *dx,
                           size_t Rn, size_t D)
{
        __shared__ double sh[2 * THREADS];
        for (size_t r = blockIdx.x; r < Rn; r += gridDim.x) {
                const float *xr = x + r * D, *dyr = dy + r * D;
                double mu = state[r], is = state[Rn + r], sg = 0, sgx = 0;
                for (size_t i = threadIdx.x; i < D; i += blockDim.x) {
                        double xh = (xr[i] - mu) * is, gi = (double)dyr[i] * scale[i];
                        sg += gi;
                        sgx += gi * xh;
                }
                block_sum2(&sg, &sgx, sh);
                sg /= (double)D;
                sgx /= (double)D;
                for (size_t i = threadIdx.x; i < D; i += blockDim.x) {
                        double xh = (xr[i] - mu) * is, gi = (double)dyr[i] * scale[i];
                        dx[r * D + i] += (float)(is * (gi - sg - xh * sgx));
                }
        }
}

/* dScale, dB: a thread a column, down the rows */
__global__ void k_ln_bwd_params(const float *x, const float *dy, const float *state, float *dscale, float *dbias,
                                size_t Rn, size_t D)
{
        FOR_EACH(i, D) {
                double ss = 0, sb = 0;
                for (size_t r = 0; r < Rn; r++) {
                        double xh = (x[r * D + i] - (double)state[r]) * (double)state[Rn + r];
                        ss += dy[r * D + i] * xh;
                        sb += dy[r * D + i];
                }
                if (dscale)
                        dscale[i] += (float)ss;
                if (dbias)
                        dbias[i] += (float)sb;
        }
}

static void ln_dims(const struct graph_kctx *k, size_t *Rn, size_t *D)
{
        const struct graph_shape *x = &k->in_shape[0];
        uint32_t ax = axis_of(k->node->a.axis, x->rank);
        *Rn = prod(x, 0, ax);
        *D = prod(x, ax, x->rank);
}

static int layernorm_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        size_t Rn, D;
        ln_dims(k, &Rn, &D);
        k_ln_fwd<<<(unsigned)(Rn < 65535 ? Rn : 65535), THREADS, 0, d.stream>>>(
                (const float *)k->in[0], (const float *)k->in[1], (const float *)k->in[2], (float *)k->out[0], k->state,
                Rn, D, k->node->a.epsilon);
        LAUNCHED();
        return 0;
}

static int layernorm_bwd(struct graph_kctx *k)
{
        if (!k->dout[0])
                return 0;
        DEV(k, d);
        size_t Rn, D;
        ln_dims(k, &Rn, &D);
        float *dx = k->din[0], *dscale = k->din[1], *dbias = k->node->n_in > 2 ? k->din[2] : NULL;
        if (dscale || dbias) {
                k_ln_bwd_params<<<grid_for(D), THREADS, 0, d.stream>>>((const float *)k->in[0], k->dout[0], k->state,
                                                                       dscale, dbias, Rn, D);
                LAUNCHED();
        }
        if (dx) {
                k_ln_bwd_x<<<(unsigned)(Rn < 65535 ? Rn : 65535), THREADS, 0, d.stream>>>(
                        (const float *)k->in[0], (const float *)k->in[1], k->dout[0], k->state, dx, Rn, D);
                LAUNCHED();
        }
        return 0;
}

/* ---- Flatten, Reshape, Squeeze, Unsqueeze, Identity: the same bytes ---- */

static size_t dsize(enum graph_dtype t)
{
        return t == GDT_I64 ? sizeof(int64_t) : sizeof(float);
}

static int copy_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        if (k->out[0] != k->in[0])
                CK(cudaMemcpyAsync(k->out[0], k->in[0], count_of(&k->out_shape[0]) * dsize(k->in_dtype[0]),
                                   cudaMemcpyDeviceToDevice, d.stream));
        return 0;
}

static int copy_bwd(struct graph_kctx *k)
{
        if (!k->din[0] || !k->dout[0])
                return 0;
        DEV(k, d);
        return add_into(d, k->din[0], k->dout[0], count_of(&k->out_shape[0]));
}

/* ---- Transpose, Pad: a walk over one side with the other's strides ---- */

static void strides_of(const struct graph_shape *s, long long *st)
{
        long long c = 1;
        for (int i = (int)s->rank - 1; i >= 0; i--) {
                st[i] = c;
                c *= s->dims[i];
        }
}

/* y[i] = x[off(i)] over the walk (operand 0's strides: x's) */
template <typename T> __global__ void k_gather_nd(const T *x, T *y, ndw w, size_t base, size_t n)
{
        FOR_EACH(i, n) {
                size_t o[3];
                nd_offs(w, i, o);
                y[i] = x[base + o[0]];
        }
}

/* d[off(i)] += s[i] (a permutation or an embedding: every off distinct) */
__global__ void k_scatter_add_nd(float *dd, const float *s, ndw w, size_t base, size_t n)
{
        FOR_EACH(i, n) {
                size_t o[3];
                nd_offs(w, i, o);
                dd[base + o[0]] += s[i];
        }
}

/* d[i] += s[off(i)] */
__global__ void k_gather_add_nd(float *dd, const float *s, ndw w, size_t base, size_t n)
{
        FOR_EACH(i, n) {
                size_t o[3];
                nd_offs(w, i, o);
                dd[i] += s[base + o[0]];
        }
}

/* the walk over the output with the input's strides permuted */
static struct ndw transpose_walk(const struct graph_kctx *k)
{
        const struct graph_shape *s = &k->in_shape[0];
        const struct graph_attrs *a = &k->node->a;
        long long ist[R];
        strides_of(s, ist);
        struct ndw w;
        memset(&w, 0, sizeof(w));
        w.rank = (int)s->rank;
        for (uint32_t i = 0; i < s->rank; i++) {
                uint32_t p = a->n_perm ? (uint32_t)a->perm[i] : s->rank - 1 - i;
                w.dims[i] = k->out_shape[0].dims[i];
                w.st[0][i] = ist[p];
        }
        return w;
}

static int transpose_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        struct ndw w = transpose_walk(k);
        size_t n = count_of(&k->out_shape[0]);
        if (k->in_dtype[0] == GDT_I64)
                k_gather_nd<int64_t><<<grid_for(n), THREADS, 0, d.stream>>>((const int64_t *)k->in[0],
                                                                            (int64_t *)k->out[0], w, 0, n);
        else
                k_gather_nd<float><<<grid_for(n), THREADS, 0, d.stream>>>((const float *)k->in[0], (float *)k->out[0],
                                                                          w, 0, n);
        LAUNCHED();
        return 0;
}

static int transpose_bwd(struct graph_kctx *k)
{
        if (!k->din[0] || !k->dout[0])
                return 0;
        DEV(k, d);
        struct ndw w = transpose_walk(k);
        size_t n = count_of(&k->out_shape[0]);
        k_scatter_add_nd<<<grid_for(n), THREADS, 0, d.stream>>>(k->din[0], k->dout[0], w, 0, n);
        LAUNCHED();
        return 0;
}

/* the output filled with the constant, then the input's elements at the output's strides from the pads'
 * corner */
template <typename T> __global__ void k_fill(T *y, T v, size_t n)
{
        FOR_EACH(i, n)
                y[i] = v;
}

template <typename T> __global__ void k_place_nd(const T *x, T *y, ndw w, size_t base, size_t n)
{
        FOR_EACH(i, n) {
                size_t o[3];
                nd_offs(w, i, o);
                y[base + o[0]] = x[i];
        }
}

static struct ndw pad_walk(const struct graph_kctx *k, size_t *base)
{
        const struct graph_shape *s = &k->in_shape[0];
        long long ost[R];
        strides_of(&k->out_shape[0], ost);
        struct ndw w;
        memset(&w, 0, sizeof(w));
        w.rank = (int)s->rank;
        *base = 0;
        for (uint32_t i = 0; i < s->rank; i++) {
                w.dims[i] = s->dims[i];
                w.st[0][i] = ost[i];
                *base += (size_t)(k->node->a.pads[i] * ost[i]);
        }
        return w;
}

static int pad_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        size_t n = count_of(&k->out_shape[0]), ni = count_of(&k->in_shape[0]), base;
        struct ndw w = pad_walk(k, &base);
        if (k->in_dtype[0] == GDT_I64) {
                k_fill<int64_t><<<grid_for(n), THREADS, 0, d.stream>>>((int64_t *)k->out[0],
                                                                       (int64_t)k->node->a.pad_value, n);
                LAUNCHED();
                k_place_nd<int64_t><<<grid_for(ni), THREADS, 0, d.stream>>>((const int64_t *)k->in[0],
                                                                            (int64_t *)k->out[0], w, base, ni);
        } else {
                k_fill<float><<<grid_for(n), THREADS, 0, d.stream>>>((float *)k->out[0], k->node->a.pad_value, n);
                LAUNCHED();
                k_place_nd<float><<<grid_for(ni), THREADS, 0, d.stream>>>((const float *)k->in[0], (float *)k->out[0],
                                                                          w, base, ni);
        }
        LAUNCHED();
        return 0;
}

static int pad_bwd(struct graph_kctx *k)
{
        if (!k->din[0] || !k->dout[0])
                return 0;
        DEV(k, d);
        size_t ni = count_of(&k->in_shape[0]), base;
        struct ndw w = pad_walk(k, &base);
        k_gather_add_nd<<<grid_for(ni), THREADS, 0, d.stream>>>(k->din[0], k->dout[0], w, base, ni);
        LAUNCHED();
        return 0;
}

/* ---- Concat: (outer, axis * inner) blocks side by side ---- */

__global__ void k_add_2d(float *dx, const float *dy, size_t outer, size_t blk, size_t row)
{
        FOR_EACH(i, outer * blk)
                dx[i] += dy[i / blk * row + i % blk];
}

static int concat_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        const struct graph_shape *s = &k->out_shape[0];
        uint32_t ax = axis_of(k->node->a.axis, s->rank);
        size_t outer = prod(s, 0, ax), inner = prod(s, ax + 1, s->rank), esz = dsize(k->in_dtype[0]);
        size_t row = (size_t)s->dims[ax] * inner * esz, at = 0;
        for (uint32_t i = 0; i < k->node->n_in; i++) {
                size_t blk = (size_t)k->in_shape[i].dims[ax] * inner * esz;
                if (blk && outer)
                        CK(cudaMemcpy2DAsync((char *)k->out[0] + at, row, k->in[i], blk, blk, outer,
                                             cudaMemcpyDeviceToDevice, d.stream));
                at += blk;
        }
        return 0;
}

static int concat_bwd(struct graph_kctx *k)
{
        if (!k->dout[0])
                return 0;
        DEV(k, d);
        const struct graph_shape *s = &k->out_shape[0];
        uint32_t ax = axis_of(k->node->a.axis, s->rank);
        size_t outer = prod(s, 0, ax), inner = prod(s, ax + 1, s->rank);
        size_t row = (size_t)s->dims[ax] * inner, at = 0;
        for (uint32_t i = 0; i < k->node->n_in; i++) {
                size_t blk = (size_t)k->in_shape[i].dims[ax] * inner;
                if (k->din[i] && blk && outer) {
                        k_add_2d<<<grid_for(outer * blk), THREADS, 0, d.stream>>>(k->din[i], k->dout[0] + at, outer,
                                                                                  blk, row);
                        LAUNCHED();
                }
                at += blk;
        }
        return 0;
}

/* ---- Gather: data (outer, A, inner), indices (N), output (outer, N, inner) ---- */

/* An index out of range writes zeros and raises the flag: forward_done turns it into -EINVAL. */
template <typename T>
__global__ void k_gather(const T *x, const int64_t *idx, T *y, size_t outer, size_t A, size_t inner, size_t N, int *flag)
{
        FOR_EACH(i, outer * N * inner) {
                size_t e = i % inner, j = i / inner % N, o = i / inner / N;
                int64_t id = idx[j];
                if (id < -(int64_t)A || id >= (int64_t)A) {
                        *flag = 1;
                        y[i] = (T)0;
                        continue;
                }
                size_t at = (size_t)(id < 0 ? id + (int64_t)A : id);
                y[i] = x[(o * A + at) * inner + e];
        }
}

/* an index listed twice collects both gradients: atomically */
__global__ void k_gather_bwd(float *dx, const int64_t *idx, const float *dy, size_t outer, size_t A, size_t inner,
                             size_t N)
{
        FOR_EACH(i, outer * N * inner) {
                size_t e = i % inner, j = i / inner % N, o = i / inner / N;
                int64_t id = idx[j];
                if (id < -(int64_t)A || id >= (int64_t)A)
                        continue;
                size_t at = (size_t)(id < 0 ? id + (int64_t)A : id);
                atomicAdd(dx + (o * A + at) * inner + e, dy[i]);
        }
}

static void gather_dims(const struct graph_kctx *k, size_t *outer, size_t *A, size_t *inner, size_t *N)
{
        const struct graph_shape *s = &k->in_shape[0];
        uint32_t ax = axis_of(k->node->a.axis, s->rank);
        *outer = prod(s, 0, ax);
        *A = (size_t)s->dims[ax];
        *inner = prod(s, ax + 1, s->rank);
        *N = count_of(&k->in_shape[1]);
}

static int gather_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        size_t outer, A, inner, N;
        gather_dims(k, &outer, &A, &inner, &N);
        size_t n = outer * N * inner;
        if (n == 0)
                return 0;
        const int64_t *idx = (const int64_t *)k->in[1];
        if (k->in_dtype[0] == GDT_I64)
                k_gather<int64_t><<<grid_for(n), THREADS, 0, d.stream>>>((const int64_t *)k->in[0], idx,
                                                                         (int64_t *)k->out[0], outer, A, inner, N, d.flag);
        else
                k_gather<float><<<grid_for(n), THREADS, 0, d.stream>>>((const float *)k->in[0], idx, (float *)k->out[0],
                                                                       outer, A, inner, N, d.flag);
        LAUNCHED();
        return 0;
}

static int gather_bwd(struct graph_kctx *k)
{
        if (!k->din[0] || !k->dout[0])
                return 0;
        DEV(k, d);
        size_t outer, A, inner, N;
        gather_dims(k, &outer, &A, &inner, &N);
        size_t n = outer * N * inner;
        if (n == 0)
                return 0;
        k_gather_bwd<<<grid_for(n), THREADS, 0, d.stream>>>(k->din[0], (const int64_t *)k->in[1], k->dout[0], outer, A,
                                                            inner, N);
        LAUNCHED();
        return 0;
}

/* ---- ReduceSum, ReduceMean ---- */

/* The input's shape with the reduced dims 1 (the output's layout, with or without keepdims), and the
 * mean's divisor; as graph_k_matmul.c's reduce_axes (the shape function checked the axes). */
static struct graph_shape reduce_kept(const struct graph_kctx *k, float *scale)
{
        const struct graph_shape *x = &k->in_shape[0];
        const struct graph_attrs *at = &k->node->a;
        bool red[R] = { false };
        if (at->n_axes == 0)
                for (uint32_t dd = 0; dd < x->rank; dd++)
                        red[dd] = !at->noop_with_empty_axes;
        for (uint32_t i = 0; i < at->n_axes; i++)
                red[axis_of(at->axes[i], x->rank)] = true;
        struct graph_shape kept = *x;
        size_t count = 1;
        for (uint32_t dd = 0; dd < x->rank; dd++)
                if (red[dd]) {
                        count *= (size_t)x->dims[dd];
                        kept.dims[dd] = 1;
                }
        *scale = k->node->op == GOP_REDUCE_MEAN ? (float)(1.0 / (double)count) : 1.0f;
        return kept;
}

static int reduce_fwd(struct graph_kctx *k)
{
        DEV(k, d);
        float scale;
        struct graph_shape kept = reduce_kept(k, &scale);
        const struct graph_shape *ops[1] = { &k->in_shape[0] };
        const float *p[1] = { (const float *)k->in[0] };
        return reduce_to(d, (float *)k->out[0], false, scale, &k->in_shape[0], &kept, 1, ops, p, -1, 0);
}

__global__ void k_reduce_bwd(float *dx, const float *dy, float scale, ndw w, size_t n)
{
        FOR_EACH(i, n) {
                size_t o[3];
                nd_offs(w, i, o);
                dx[i] += dy[o[1]] * scale;
        }
}

static int reduce_bwd(struct graph_kctx *k)
{
        if (!k->din[0] || !k->dout[0])
                return 0;
        DEV(k, d);
        float scale;
        struct graph_shape kept = reduce_kept(k, &scale);
        const struct graph_shape *ops[2] = { &k->in_shape[0], &kept };
        ndw w = nd_make(&k->in_shape[0], ops, 2);
        size_t n = count_of(&k->in_shape[0]);
        k_reduce_bwd<<<grid_for(n), THREADS, 0, d.stream>>>(k->din[0], k->dout[0], scale, w, n);
        LAUNCHED();
        return 0;
}

/* ---- the table ---- */

/* A Gather's index out of range, flagged on the device: read (synchronizing) and cleared. */
static int forward_done(struct backend *be)
{
        struct cuda_graph_dev d;
        int r = cuda_graph_dev(be, &d), h = 0;
        if (r < 0)
                return r;
        CK(cudaMemcpyAsync(&h, d.flag, sizeof(int), cudaMemcpyDeviceToHost, d.stream));
        CK(cudaStreamSynchronize(d.stream));
        if (!h)
                return 0;
        CK(cudaMemsetAsync(d.flag, 0, sizeof(int), d.stream));
        return -EINVAL;
}

static struct graph_kernels make_table(void)
{
        struct graph_kernels t;
        memset(&t, 0, sizeof(t));
        t.name = "cuda";
        t.forward_done = forward_done;
#define K(op, f, b) (t.fwd[op] = f, t.bwd[op] = b)
        K(GOP_GEMM, gemm_fwd, gemm_bwd);
        K(GOP_MATMUL, matmul_fwd, matmul_bwd);
        K(GOP_ADD, binary_fwd, binary_bwd);
        K(GOP_SUB, binary_fwd, binary_bwd);
        K(GOP_MUL, binary_fwd, binary_bwd);
        K(GOP_DIV, binary_fwd, binary_bwd);
        K(GOP_RELU, unary_fwd, unary_bwd);
        K(GOP_LEAKY_RELU, unary_fwd, unary_bwd);
        K(GOP_SIGMOID, unary_fwd, unary_bwd);
        K(GOP_TANH, unary_fwd, unary_bwd);
        K(GOP_SOFTMAX, softmax_fwd, softmax_bwd);
        K(GOP_LOG_SOFTMAX, softmax_fwd, softmax_bwd);
        K(GOP_CONV, conv_fwd, conv_bwd);
        K(GOP_MAXPOOL, pool_fwd, pool_bwd);
        K(GOP_AVGPOOL, pool_fwd, pool_bwd);
        K(GOP_GLOBAL_AVGPOOL, gap_fwd, gap_bwd);
        K(GOP_BATCHNORM, batchnorm_fwd, batchnorm_bwd);
        K(GOP_DROPOUT, dropout_fwd, dropout_bwd);
        K(GOP_LAYERNORM, layernorm_fwd, layernorm_bwd);
        K(GOP_PAD, pad_fwd, pad_bwd);
        K(GOP_FLATTEN, copy_fwd, copy_bwd);
        K(GOP_RESHAPE, copy_fwd, copy_bwd);
        K(GOP_TRANSPOSE, transpose_fwd, transpose_bwd);
        K(GOP_CONCAT, concat_fwd, concat_bwd);
        K(GOP_SQUEEZE, copy_fwd, copy_bwd);
        K(GOP_UNSQUEEZE, copy_fwd, copy_bwd);
        K(GOP_GATHER, gather_fwd, gather_bwd);
        K(GOP_REDUCE_SUM, reduce_fwd, reduce_bwd);
        K(GOP_REDUCE_MEAN, reduce_fwd, reduce_bwd);
        K(GOP_IDENTITY, copy_fwd, copy_bwd);
#undef K
        return t;
}

/* (C++ has no designated array initializers: the table is built once, at load) */
const struct graph_kernels cuda_graph_kernels = make_table();
