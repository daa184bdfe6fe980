/* The CUDA backend: the backend table (services/common/backend.h) on one NVIDIA GPU. cuBLAS for matrix
 * products, cuDNN for convolution, pooling, activations and softmax, small kernels of our own for the
 * rest, and a caching allocator that holds the memory cap the options give. It is a second
 * implementation of the CPU backend's functions, held to them by tests/gpu/test_backend_equiv.c.
 *
 * This is the only file that includes CUDA headers. Every CUDA, cuBLAS and cuDNN status becomes a
 * -errno in one place (the *_errno functions below), with the library's own words kept in the context
 * for the messages of backend_cuda_new. One stream per backend: ops are asynchronous, and the ops that
 * return host values (downloads, the loss, the correct count) synchronize. */
#include "backend.h"
#include "argmax.h"
#include "cuda-internal.h"
#include "device.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors: the one place foreign codes become errno ---- */

static int cuda_errno(cudaError_t e)
{
        switch (e) {
        case cudaSuccess: return 0;
        case cudaErrorMemoryAllocation: return -ENOMEM;
        case cudaErrorNoDevice:
        case cudaErrorInvalidDevice:
        case cudaErrorInsufficientDriver:
        case cudaErrorDevicesUnavailable:
        case cudaErrorCallRequiresNewerDriver: return -ENODEV;
        case cudaErrorInvalidValue: return -EINVAL;
        case cudaErrorNoKernelImageForDevice:
        case cudaErrorUnsupportedPtxVersion:
        case cudaErrorNotSupported: return -ENOTSUP;
        default: return -EIO;
        }
}

static int cublas_errno(cublasStatus_t s)
{
        switch (s) {
        case CUBLAS_STATUS_SUCCESS: return 0;
        case CUBLAS_STATUS_ALLOC_FAILED: return -ENOMEM;
        case CUBLAS_STATUS_NOT_INITIALIZED: return -ENODEV;
        case CUBLAS_STATUS_INVALID_VALUE: return -EINVAL;
        case CUBLAS_STATUS_ARCH_MISMATCH:
        case CUBLAS_STATUS_NOT_SUPPORTED: return -ENOTSUP;
        default: return -EIO;
        }
}

static int cudnn_errno(cudnnStatus_t s)
{
        int v = (int)s;
        if (v == 0)
                return 0;
        if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
            s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
                return -ENOMEM;
        /* cuDNN 9 groups its codes by thousands */
        switch (v / 1000) {
        case 1: return -ENODEV;  /* not initialized, sub-library missing or mismatched */
        case 2: return -EINVAL;  /* bad parameter */
        case 3: return -ENOTSUP; /* not supported */
        default: return -EIO;    /* internal error, execution failed */
        }
}

/* Records the library's words for a failure (kept for messages) and returns the errno. */
struct cuda_ctx;
static int fail(struct cuda_ctx *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A library call whose status is not `ok`: return fail() with its errno and words. */
#define CK_STATUS(c, T, ok, errno_of, words_of, expr)                                                \
        do {                                                                                         \
                T s_ = (expr);                                                                       \
                if (s_ != (ok))                                                                      \
                        return fail((c), errno_of(s_), "%s: %s", #expr, words_of(s_));               \
        } while (0)
#define CK_CUDA(c, expr) CK_STATUS(c, cudaError_t, cudaSuccess, cuda_errno, cudaGetErrorString, expr)
#define CK_BLAS(c, expr) CK_STATUS(c, cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublas_errno, cublasGetStatusString, expr)
#define CK_DNN(c, expr) CK_STATUS(c, cudnnStatus_t, CUDNN_STATUS_SUCCESS, cudnn_errno, cudnnGetErrorString, expr)
/* A kernel launch: the launch error, if any, is checked at once. */
#define CK_LAUNCH(c) CK_CUDA(c, cudaGetLastError())

/* ---- the caching allocator ----
 * Blocks carved out of segments obtained from cudaMalloc, best fit, split and coalesced; freed blocks
 * return to the segment, never to the driver, so a step loop that frees and allocates the same sizes
 * never calls cudaMalloc. Without allow_growth one segment of the whole cap is taken at start (TF's
 * default: the memory is ours from the first moment, and a cap that cannot be had is an error then);
 * with allow_growth segments of at least SEG_MIN are added as needed up to the cap, and segments with
 * nothing in use are given back before an allocation is refused. Host-side bookkeeping only; device
 * memory is reused in stream order, which the single stream guarantees. */

#define ALIGN 512
#define SEG_MIN ((size_t)2 << 20)
#define MAX_PLANS 16

struct blk {
        char *ptr;
        size_t size;
        bool used;
        struct blk *prev, *next; /* address order within the segment */
        struct seg *seg;
};

struct seg {
        char *base;
        size_t size;
        struct blk *first;
        struct seg *next;
};

/* Merges n, a free block, into the block a just before it, and frees n's record. */
static void blk_merge(struct blk *a, struct blk *n)
{
        a->size += n->size;
        a->next = n->next;
        if (n->next)
                n->next->prev = a;
        free(n);
}

struct pool {
        struct seg *segs;
        struct device_mem_stats st;   /* what backend_cuda_mem_stats reports, kept as the pool works */
        bool growth;
};

static size_t round_up(size_t n, size_t a)
{
        return (n + a - 1) / a * a;
}

static struct seg *seg_new(struct pool *p, size_t size)
{
        void *base = NULL;
        if (cudaMalloc(&base, size) != cudaSuccess) {
                cudaGetLastError(); /* clear the sticky-free error state of the runtime */
                return NULL;
        }
        struct seg *s = (struct seg *)calloc(1, sizeof(*s));
        struct blk *b = (struct blk *)calloc(1, sizeof(*b));
        if (!s || !b) {
                cudaFree(base);
                free(s);
                free(b);
                return NULL;
        }
        p->st.device_mallocs++;
        s->base = (char *)base;
        s->size = size;
        b->ptr = s->base;
        b->size = size;
        b->seg = s;
        s->first = b;
        s->next = p->segs;
        p->segs = s;
        p->st.reserved += size;
        return s;
}

static void seg_free(struct seg *s)
{
        for (struct blk *b = s->first, *n; b; b = n) {
                n = b->next;
                free(b);
        }
        cudaFree(s->base);
        free(s);
}

/* Gives back every segment with nothing in use (growth mode only). */
static void pool_trim(struct pool *p)
{
        for (struct seg **sp = &p->segs; *sp;) {
                struct seg *s = *sp;
                if (!s->first->used && !s->first->next) {
                        *sp = s->next;
                        p->st.reserved -= s->size;
                        seg_free(s);
                } else {
                        sp = &s->next;
                }
        }
}

static struct blk *best_fit(struct pool *p, size_t size)
{
        struct blk *best = NULL;
        for (struct seg *s = p->segs; s; s = s->next)
                for (struct blk *b = s->first; b; b = b->next)
                        if (!b->used && b->size >= size && (!best || b->size < best->size))
                                best = b;
        return best;
}

static void *pool_alloc(struct pool *p, size_t bytes)
{
        size_t size = round_up(bytes ? bytes : 1, ALIGN);
        struct blk *b = best_fit(p, size);
        if (!b && p->growth) {
                size_t want = size > SEG_MIN ? round_up(size, SEG_MIN) : SEG_MIN;
                if (p->st.reserved + want > p->st.cap)
                        want = size; /* the last bit under the cap */
                if (p->st.reserved + want > p->st.cap)
                        pool_trim(p);
                if (p->st.reserved + want <= p->st.cap) {
                        struct seg *s = seg_new(p, want);
                        if (!s) {
                                pool_trim(p);
                                s = seg_new(p, want);
                        }
                        if (s)
                                b = s->first;
                }
        }
        if (!b) {
                p->st.last_failed = size;
                return NULL;
        }
        if (b->size - size >= ALIGN) { /* split off the rest as a free block */
                struct blk *r = (struct blk *)calloc(1, sizeof(*r));
                if (r) {
                        r->ptr = b->ptr + size;
                        r->size = b->size - size;
                        r->seg = b->seg;
                        r->prev = b;
                        r->next = b->next;
                        if (b->next)
                                b->next->prev = r;
                        b->next = r;
                        b->size = size;
                }
        }
        b->used = true;
        p->st.in_use += b->size;
        p->st.peak = p->st.in_use > p->st.peak ? p->st.in_use : p->st.peak;
        return b->ptr;
}

static bool pool_free(struct pool *p, void *ptr)
{
        for (struct seg *s = p->segs; s; s = s->next) {
                if ((char *)ptr < s->base || (char *)ptr >= s->base + s->size)
                        continue;
                for (struct blk *b = s->first; b; b = b->next) {
                        if (b->ptr != ptr || !b->used)
                                continue;
                        b->used = false;
                        p->st.in_use -= b->size;
                        if (b->next && !b->next->used)
                                blk_merge(b, b->next);
                        if (b->prev && !b->prev->used)
                                blk_merge(b->prev, b); /* b is gone */
                        return true;
                }
        }
        return false;
}

static void pool_destroy(struct pool *p)
{
        for (struct seg *s = p->segs, *n; s; s = n) {
                n = s->next;
                seg_free(s);
        }
        p->segs = NULL;
}

/* ---- the context ---- */

/* cuDNN's view of one convolution shape, with the algorithms chosen for it. Even kernels run on a
 * zero-padded copy of x (cuDNN pads symmetrically; TF's "same" puts the extra row and column after),
 * so the descriptors then describe the padded input and no padding. */
struct conv_plan {
        uint32_t B, C, H, W, F, k;
        bool padded;
        uint32_t Hp, Wp;
        cudnnTensorDescriptor_t x, y, bias;
        cudnnFilterDescriptor_t w;
        cudnnConvolutionDescriptor_t conv;
        cudnnConvolutionFwdAlgo_t fwd;
        cudnnConvolutionBwdDataAlgo_t bwd_data;
        cudnnConvolutionBwdFilterAlgo_t bwd_filter;
        size_t ws_fwd, ws_data, ws_filter;
        uint64_t used; /* for replacing the least recently used plan */
};

struct cuda_ctx {
        int device;
        char name[128];
        cudaStream_t stream;
        cublasHandle_t blas;
        cudnnHandle_t dnn;
        bool tf32;
        struct pool pool;
        void *blas_ws;                 /* cuBLAS's workspace, from the pool */
        void *ws;                      /* cuDNN's workspace and padded copies, from the pool */
        size_t ws_bytes;
        void *dev_scalars;             /* (2 x 8 bytes) the loss and the count, on the device */
        void *host_scalars;            /* pinned mirror */
        cudnnTensorDescriptor_t t0, t1;
        cudnnActivationDescriptor_t act;
        cudnnPoolingDescriptor_t poold;
        struct conv_plan plans[MAX_PLANS];
        uint32_t n_plans;
        uint64_t clock;
        int *graph_flag;               /* the graph kernels' error flag (cuda_graph_dev), from the pool */
        char err[256];
};

static int fail(struct cuda_ctx *c, int err, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, sizeof(c->err), fmt, ap);
        va_end(ap);
        return err;
}

/* The calling thread's current device, as this file last set it. */
static __thread int thread_device = -1;

/* cudaSetDevice, remembered for ctx_of: every change of device in this file goes through here. */
static cudaError_t use_device(int device)
{
        cudaError_t e = cudaSetDevice(device);
        thread_device = e == cudaSuccess ? device : -1;
        return e;
}

/* Every op reaches its context here, and makes its GPU the calling thread's current device first: the
 * replicas of a worker (replicas.c) run each backend on a thread of its own, and CUDA, cuBLAS and
 * cuDNN calls go to the current device, which a new thread has at 0. */
static struct cuda_ctx *ctx_of(struct backend *be)
{
        struct cuda_ctx *c = (struct cuda_ctx *)be->ctx;
        if (c && thread_device != c->device)
                use_device(c->device);
        return c;
}

/* ---- what graph_cuda.cu reaches (cuda-internal.h) ---- */

int cuda_status_errno(cudaError_t e)
{
        return cuda_errno(e);
}

int cublas_status_errno(cublasStatus_t s)
{
        return cublas_errno(s);
}

int cuda_graph_dev(struct backend *be, struct cuda_graph_dev *ret)
{
        struct cuda_ctx *c = ctx_of(be);
        if (!c->graph_flag) {
                c->graph_flag = (int *)pool_alloc(&c->pool, sizeof(int));
                if (!c->graph_flag)
                        return fail(c, -ENOMEM, "the graph kernels' flag does not fit the GPU memory cap");
                CK_CUDA(c, cudaMemsetAsync(c->graph_flag, 0, sizeof(int), c->stream));
        }
        *ret = (struct cuda_graph_dev){ c->stream, c->blas, c->graph_flag };
        return 0;
}

/* ---- kernels of our own ---- */

#define THREADS 256

static unsigned blocks_for(size_t n)
{
        size_t b = (n + THREADS - 1) / THREADS;
        return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

__global__ void k_add_bias_rows(float *y, const float *bias, uint32_t rows, uint32_t n)
{
        size_t total = (size_t)rows * n;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
                y[i] += bias[i % n];
}

/* db[j] = sum over rows of dy[r, j]: one thread per column, rows in order (deterministic). */
__global__ void k_bias_grad(const float *dy, float *db, uint32_t rows, uint32_t n)
{
        for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
                float s = 0.0f;
                for (uint32_t r = 0; r < rows; r++)
                        s += dy[(size_t)r * n + j];
                db[j] = s;
        }
}

/* Every thread of the block adds v: the total lands in part[0], summed in the same tree order on every
 * run (no atomics), so the result is deterministic. */
template <typename T>
__device__ void block_sum(T *part, T v)
{
        part[threadIdx.x] = v;
        __syncthreads();
        for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
                if (threadIdx.x < w)
                        part[threadIdx.x] += part[threadIdx.x + w];
                __syncthreads();
        }
}

/* One block: the mean over rows of logsumexp(logits[b]) - logits[b, label[b]] (the CPU backend's
 * log-sum-exp form, finite even where p[label] underflows), summed in double. */
__global__ void k_xent_loss(const float *logits, const uint8_t *labels, uint32_t B, uint32_t C, float *loss)
{
        __shared__ double part[THREADS];
        double s = 0.0;
        for (uint32_t b = threadIdx.x; b < B; b += blockDim.x) {
                const float *l = logits + (size_t)b * C;
                float mx = -INFINITY;
                for (uint32_t c = 0; c < C; c++)
                        mx = l[c] > mx ? l[c] : mx;
                float sum = 0.0f;
                for (uint32_t c = 0; c < C; c++)
                        sum += expf(l[c] - mx);
                /* the difference first: with huge logits, log(sum) + mx would round log(sum) away */
                s += (double)logf(sum) + ((double)mx - (double)l[labels[b]]);
        }
        block_sum(part, s);
        if (threadIdx.x == 0)
                *loss = (float)(part[0] / B);
}

__global__ void k_xent_bwd(const float *probs, const uint8_t *labels, uint32_t B, uint32_t C, float *d)
{
        float inv_b = 1.0f / (float)B;
        size_t total = (size_t)B * C;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
                uint32_t b = (uint32_t)(i / C), c = (uint32_t)(i % C);
                /* two roundings, as the CPU: no fused multiply-add */
                float v = __fmul_rn(probs[i], inv_b);
                d[i] = c == labels[b] ? __fsub_rn(v, inv_b) : v;
        }
}

/* One block: #{b : first argmax of scores[b] == label[b]}. */
__global__ void k_correct(const float *scores, const uint8_t *labels, uint32_t B, uint32_t C, uint32_t *out)
{
        __shared__ uint32_t part[THREADS];
        uint32_t n = 0;
        for (uint32_t b = threadIdx.x; b < B; b += blockDim.x)
                n += row_argmax(scores + (size_t)b * C, C) == labels[b];
        block_sum(part, n);
        if (threadIdx.x == 0)
                *out = part[0];
}

/* dx for max pooling, one thread per input element: dy of its window if it is the window's first
 * maximum (the CPU backend's rule), else 0; 0 outside every window. No atomics: windows don't overlap. */
__global__ void k_maxpool_bwd(const float *x, const float *dy, float *dx, uint32_t BC, uint32_t H, uint32_t W,
                              uint32_t p)
{
        uint32_t OH = H / p, OW = W / p;
        size_t total = (size_t)BC * H * W;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
                size_t bc = i / ((size_t)H * W);
                uint32_t r = (uint32_t)(i % ((size_t)H * W)), yy = r / W, xx = r % W;
                uint32_t oy = yy / p, ox = xx / p;
                float g = 0.0f;
                if (oy < OH && ox < OW) {
                        size_t best = window_argmax(x + bc * H * W, W, p, oy, ox);
                        if (best == r)
                                g = dy[(bc * OH + oy) * OW + ox];
                }
                dx[i] = g;
        }
}

/* xp (BC, Hp, Wp) = x (BC, H, W) placed at (top, left), zero around it. */
__global__ void k_pad(const float *x, float *xp, uint32_t BC, uint32_t H, uint32_t W, uint32_t Hp, uint32_t Wp,
                      uint32_t top, uint32_t left)
{
        size_t total = (size_t)BC * Hp * Wp;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
                size_t bc = i / ((size_t)Hp * Wp);
                uint32_t r = (uint32_t)(i % ((size_t)Hp * Wp)), yy = r / Wp, xx = r % Wp;
                bool in = yy >= top && yy < top + H && xx >= left && xx < left + W;
                xp[i] = in ? x[(bc * H + (yy - top)) * W + (xx - left)] : 0.0f;
        }
}

/* dx (BC, H, W) = the (top, left) window of dxp (BC, Hp, Wp). */
__global__ void k_crop(const float *dxp, float *dx, uint32_t BC, uint32_t H, uint32_t W, uint32_t Hp, uint32_t Wp,
                       uint32_t top, uint32_t left)
{
        size_t total = (size_t)BC * H * W;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
                size_t bc = i / ((size_t)H * W);
                uint32_t r = (uint32_t)(i % ((size_t)H * W)), yy = r / W, xx = r % W;
                dx[i] = dxp[(bc * Hp + yy + top) * Wp + xx + left];
        }
}

/* ---- buffers ---- */

static void *cu_alloc(struct backend *be, size_t bytes)
{
        struct cuda_ctx *c = ctx_of(be);
        void *p = pool_alloc(&c->pool, bytes);
        if (p && cudaMemsetAsync(p, 0, round_up(bytes ? bytes : 1, ALIGN), c->stream) != cudaSuccess) {
                cudaGetLastError();
                pool_free(&c->pool, p);
                return NULL;
        }
        return p;
}

static void cu_buf_free(struct backend *be, void *buf)
{
        if (buf)
                pool_free(&ctx_of(be)->pool, buf);
}

static int cu_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
        struct cuda_ctx *c = ctx_of(be);
        if (bytes)
                CK_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
        return 0;
}

static int cu_download(struct backend *be, void *dst, const void *src, size_t bytes)
{
        struct cuda_ctx *c = ctx_of(be);
        if (bytes)
                CK_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
        CK_CUDA(c, cudaStreamSynchronize(c->stream));
        return 0;
}

static int cu_memset0(struct backend *be, void *dst, size_t bytes)
{
        struct cuda_ctx *c = ctx_of(be);
        if (bytes)
                CK_CUDA(c, cudaMemsetAsync(dst, 0, bytes, c->stream));
        return 0;
}

static int cu_sync(struct backend *be)
{
        struct cuda_ctx *c = ctx_of(be);
        CK_CUDA(c, cudaStreamSynchronize(c->stream));
        return 0;
}

/* The workspace grows to the largest a shape has needed; the model's warm-up pass reaches it. */
static int ws_reserve(struct cuda_ctx *c, size_t bytes)
{
        if (bytes <= c->ws_bytes)
                return 0;
        if (c->ws) {
                /* the old workspace may still be read by queued work; the stream orders reuse */
                pool_free(&c->pool, c->ws);
                c->ws = NULL;
                c->ws_bytes = 0;
        }
        c->ws = pool_alloc(&c->pool, bytes);
        if (!c->ws)
                return fail(c, -ENOMEM, "workspace of %zu bytes does not fit the GPU memory cap", bytes);
        c->ws_bytes = round_up(bytes, ALIGN);
        return 0;
}

/* ---- matrix products and elementwise ops ---- */

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep the flags. */
static int cu_gemm(struct backend *be, bool ta, bool tb, uint32_t M, uint32_t N, uint32_t K, float alpha,
                   const void *A, uint32_t lda, const void *B, uint32_t ldb, float beta, void *C, uint32_t ldc)
{
        struct cuda_ctx *c = ctx_of(be);
        if (M == 0 || N == 0)
                return 0;
        CK_BLAS(c, cublasSgemm(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N,
                               (int)M, (int)K, &alpha, (const float *)B, (int)ldb, (const float *)A, (int)lda, &beta,
                               (float *)C, (int)ldc));
        return 0;
}

static int cu_add_bias_rows(struct backend *be, void *y, const void *bias, uint32_t rows, uint32_t n)
{
        struct cuda_ctx *c = ctx_of(be);
        k_add_bias_rows<<<blocks_for((size_t)rows * n), THREADS, 0, c->stream>>>((float *)y, (const float *)bias,
                                                                                 rows, n);
        CK_LAUNCH(c);
        return 0;
}

static int cu_bias_grad(struct backend *be, const void *dy, void *db, uint32_t rows, uint32_t n)
{
        struct cuda_ctx *c = ctx_of(be);
        k_bias_grad<<<blocks_for(n), THREADS, 0, c->stream>>>((const float *)dy, (float *)db, rows, n);
        CK_LAUNCH(c);
        return 0;
}

/* n elements as a (1, 1, 1, n) tensor; cuDNN's activations are elementwise, the shape is moot. */
static int act(struct backend *be, cudnnActivationMode_t mode, bool fwd, const void *y, const void *dy,
               const void *x, void *out, size_t n)
{
        struct cuda_ctx *c = ctx_of(be);
        const float one = 1.0f, zero = 0.0f;
        if (n == 0)
                return 0;
        if (n > 0x7fffffffu)
                return fail(c, -EINVAL, "activation over %zu elements: more than cuDNN takes", n);
        CK_DNN(c, cudnnSetTensor4dDescriptor(c->t0, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 1, (int)n));
        CK_DNN(c, cudnnSetActivationDescriptor(c->act, mode, CUDNN_NOT_PROPAGATE_NAN, 0.0));
        if (fwd)
                CK_DNN(c, cudnnActivationForward(c->dnn, c->act, &one, c->t0, x, &zero, c->t0, out));
        else /* the model keeps only the forward output y; every mode here is a function of y */
                CK_DNN(c, cudnnActivationBackward(c->dnn, c->act, &one, c->t0, y, c->t0, dy, c->t0, y, &zero, c->t0, out));
        return 0;
}

static int cu_relu_fwd(struct backend *be, const void *x, void *y, size_t n)
{
        return act(be, CUDNN_ACTIVATION_RELU, true, NULL, NULL, x, y, n);
}
static int cu_relu_bwd(struct backend *be, const void *y, const void *dy, void *dx, size_t n)
{
        return act(be, CUDNN_ACTIVATION_RELU, false, y, dy, NULL, dx, n);
}
static int cu_tanh_fwd(struct backend *be, const void *x, void *y, size_t n)
{
        return act(be, CUDNN_ACTIVATION_TANH, true, NULL, NULL, x, y, n);
}
static int cu_tanh_bwd(struct backend *be, const void *y, const void *dy, void *dx, size_t n)
{
        return act(be, CUDNN_ACTIVATION_TANH, false, y, dy, NULL, dx, n);
}
static int cu_sigmoid_fwd(struct backend *be, const void *x, void *y, size_t n)
{
        return act(be, CUDNN_ACTIVATION_SIGMOID, true, NULL, NULL, x, y, n);
}
static int cu_sigmoid_bwd(struct backend *be, const void *y, const void *dy, void *dx, size_t n)
{
        return act(be, CUDNN_ACTIVATION_SIGMOID, false, y, dy, NULL, dx, n);
}

/* ---- loss ---- */

static int cu_softmax_xent_fwd(struct backend *be, const void *logits, const void *labels, uint32_t B, uint32_t C,
                               void *probs, float *loss_ret)
{
        struct cuda_ctx *c = ctx_of(be);
        const float one = 1.0f, zero = 0.0f;
        CK_DNN(c, cudnnSetTensor4dDescriptor(c->t0, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)B, (int)C, 1, 1));
        CK_DNN(c, cudnnSoftmaxForward(c->dnn, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_INSTANCE, &one, c->t0, logits,
                                      &zero, c->t0, probs));
        k_xent_loss<<<1, THREADS, 0, c->stream>>>((const float *)logits, (const uint8_t *)labels, B, C,
                                                  (float *)c->dev_scalars);
        CK_LAUNCH(c);
        CK_CUDA(c, cudaMemcpyAsync(c->host_scalars, c->dev_scalars, sizeof(float), cudaMemcpyDeviceToHost, c->stream));
        CK_CUDA(c, cudaStreamSynchronize(c->stream));
        memcpy(loss_ret, c->host_scalars, sizeof(float));
        return 0;
}

static int cu_softmax_xent_bwd(struct backend *be, const void *probs, const void *labels, uint32_t B, uint32_t C,
                               void *dlogits)
{
        struct cuda_ctx *c = ctx_of(be);
        k_xent_bwd<<<blocks_for((size_t)B * C), THREADS, 0, c->stream>>>((const float *)probs, (const uint8_t *)labels,
                                                                          B, C, (float *)dlogits);
        CK_LAUNCH(c);
        return 0;
}

static int cu_correct_count(struct backend *be, const void *scores, const void *labels, uint32_t B, uint32_t C,
                            uint32_t *correct_ret)
{
        struct cuda_ctx *c = ctx_of(be);
        uint32_t *d = (uint32_t *)((char *)c->dev_scalars + 8), *h = (uint32_t *)((char *)c->host_scalars + 8);
        k_correct<<<1, THREADS, 0, c->stream>>>((const float *)scores, (const uint8_t *)labels, B, C, d);
        CK_LAUNCH(c);
        CK_CUDA(c, cudaMemcpyAsync(h, d, sizeof(uint32_t), cudaMemcpyDeviceToHost, c->stream));
        CK_CUDA(c, cudaStreamSynchronize(c->stream));
        *correct_ret = *h;
        return 0;
}

/* ---- convolution ---- */

static void plan_destroy(struct conv_plan *p)
{
        if (p->x)
                cudnnDestroyTensorDescriptor(p->x);
        if (p->y)
                cudnnDestroyTensorDescriptor(p->y);
        if (p->bias)
                cudnnDestroyTensorDescriptor(p->bias);
        if (p->w)
                cudnnDestroyFilterDescriptor(p->w);
        if (p->conv)
                cudnnDestroyConvolutionDescriptor(p->conv);
        memset(p, 0, sizeof(*p));
}

/* cuDNN's heuristics and workspace size for each direction of a convolution, by the type of its
 * candidates (so that pick_algo below is written once). */
static cudnnStatus_t heuristics(const struct cuda_ctx *c, const struct conv_plan *p, int max, int *n,
                                cudnnConvolutionFwdAlgoPerf_t *perf)
{
        return cudnnGetConvolutionForwardAlgorithm_v7(c->dnn, p->x, p->w, p->conv, p->y, max, n, perf);
}
static cudnnStatus_t heuristics(const struct cuda_ctx *c, const struct conv_plan *p, int max, int *n,
                                cudnnConvolutionBwdDataAlgoPerf_t *perf)
{
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(c->dnn, p->w, p->y, p->conv, p->x, max, n, perf);
}
static cudnnStatus_t heuristics(const struct cuda_ctx *c, const struct conv_plan *p, int max, int *n,
                                cudnnConvolutionBwdFilterAlgoPerf_t *perf)
{
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(c->dnn, p->x, p->y, p->conv, p->w, max, n, perf);
}
static cudnnStatus_t ws_size(const struct cuda_ctx *c, const struct conv_plan *p, cudnnConvolutionFwdAlgo_t a, size_t *ws)
{
        return cudnnGetConvolutionForwardWorkspaceSize(c->dnn, p->x, p->w, p->conv, p->y, a, ws);
}
static cudnnStatus_t ws_size(const struct cuda_ctx *c, const struct conv_plan *p, cudnnConvolutionBwdDataAlgo_t a,
                             size_t *ws)
{
        return cudnnGetConvolutionBackwardDataWorkspaceSize(c->dnn, p->w, p->y, p->conv, p->x, a, ws);
}
static cudnnStatus_t ws_size(const struct cuda_ctx *c, const struct conv_plan *p, cudnnConvolutionBwdFilterAlgo_t a,
                             size_t *ws)
{
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(c->dnn, p->x, p->y, p->conv, p->w, a, ws);
}

/* The algorithms that transform the operands (FFT, Winograd) and so do not compute the plain fp32 sums
 * the CPU computes: on an H200, FFT-class filter gradients of the CNN's first layer (1 channel, 5x5, batch
 * 64) were 0.4 % off the CPU's, 5000 times the error of the direct ones. Left out unless TF32 is
 * allowed (device.cuda_tf32: the fast, approximate mode). */
static bool transformed(cudnnConvolutionFwdAlgo_t a)
{
        return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
               a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
static bool transformed(cudnnConvolutionBwdDataAlgo_t a)
{
        return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
               a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
static bool transformed(cudnnConvolutionBwdFilterAlgo_t a)
{
        return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
               a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

/* The fastest algorithm cuDNN's heuristics offer (they never run anything) that cuDNN accepts for this
 * shape with a workspace under the limit, deterministic ones first: *algo, and its exact workspace in
 * *ws. Without TF32 the descriptor stays at CUDNN_FMA_MATH (plain fp32, as the CPU) and the tensor-op
 * and transformed (FFT, Winograd) variants are skipped. N: the direction's number of algorithms; Perf: its candidates' type. */
template <int N, typename Perf>
static int pick_algo(struct cuda_ctx *c, const struct conv_plan *p, size_t limit, decltype(Perf::algo) *algo,
                     size_t *ws)
{
        Perf perf[N];
        int n = 0;
        CK_DNN(c, heuristics(c, p, N, &n, perf));
        for (int pass = 0; pass < 2; pass++)
                for (int i = 0; i < n; i++) {
                        if (perf[i].status != CUDNN_STATUS_SUCCESS)
                                continue;
                        if (!c->tf32 && (perf[i].mathType == CUDNN_TENSOR_OP_MATH ||
                                         perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ||
                                         transformed(perf[i].algo)))
                                continue;
                        if (pass == 0 && perf[i].determinism != CUDNN_DETERMINISTIC)
                                continue;
                        size_t need = 0;
                        if (ws_size(c, p, perf[i].algo, &need) != CUDNN_STATUS_SUCCESS || need > limit)
                                continue;
                        *algo = perf[i].algo;
                        *ws = need;
                        return 0;
                }
        return fail(c, -ENOTSUP, "cuDNN offers no fp32 algorithm for this convolution");
}

static int plan_build(struct cuda_ctx *c, struct conv_plan *p, uint32_t B, uint32_t C, uint32_t H, uint32_t W,
                      uint32_t F, uint32_t k)
{
        p->B = B, p->C = C, p->H = H, p->W = W, p->F = F, p->k = k;
        p->padded = k % 2 == 0;
        int pad = p->padded ? 0 : (int)(k - 1) / 2;
        p->Hp = p->padded ? H + k - 1 : H;
        p->Wp = p->padded ? W + k - 1 : W;
        CK_DNN(c, cudnnCreateTensorDescriptor(&p->x));
        CK_DNN(c, cudnnCreateTensorDescriptor(&p->y));
        CK_DNN(c, cudnnCreateTensorDescriptor(&p->bias));
        CK_DNN(c, cudnnCreateFilterDescriptor(&p->w));
        CK_DNN(c, cudnnCreateConvolutionDescriptor(&p->conv));
        CK_DNN(c, cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)B, (int)C, (int)p->Hp,
                                             (int)p->Wp));
        CK_DNN(c, cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)B, (int)F, (int)H, (int)W));
        CK_DNN(c, cudnnSetTensor4dDescriptor(p->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, (int)F, 1, 1));
        /* (F, C*k*k) with index (f, c, ky, kx) is cuDNN's KCRS filter layout */
        CK_DNN(c, cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, (int)F, (int)C, (int)k, (int)k));
        /* cross-correlation: no kernel flip, as im2col */
        CK_DNN(c, cudnnSetConvolution2dDescriptor(p->conv, pad, pad, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
        CK_DNN(c, cudnnSetConvolutionMathType(p->conv, c->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
        /* a workspace larger than a quarter of the cap is not worth the memory */
        size_t limit = c->pool.st.cap / 4 < ((size_t)1 << 30) ? c->pool.st.cap / 4 : (size_t)1 << 30;
        int r = pick_algo<CUDNN_CONVOLUTION_FWD_ALGO_COUNT, cudnnConvolutionFwdAlgoPerf_t>(c, p, limit, &p->fwd, &p->ws_fwd);
        if (r == 0)
                r = pick_algo<CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, cudnnConvolutionBwdDataAlgoPerf_t>(c, p, limit, &p->bwd_data,
                                                                                                   &p->ws_data);
        if (r == 0)
                r = pick_algo<CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, cudnnConvolutionBwdFilterAlgoPerf_t>(
                        c, p, limit, &p->bwd_filter, &p->ws_filter);
        return r;
}

static int plan_get(struct cuda_ctx *c, uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k,
                    struct conv_plan **ret)
{
        c->clock++;
        for (uint32_t i = 0; i < c->n_plans; i++) {
                struct conv_plan *p = &c->plans[i];
                if (p->B == B && p->C == C && p->H == H && p->W == W && p->F == F && p->k == k) {
                        p->used = c->clock;
                        *ret = p;
                        return 0;
                }
        }
        struct conv_plan *p;
        if (c->n_plans < MAX_PLANS) {
                p = &c->plans[c->n_plans++];
        } else {
                p = &c->plans[0];
                for (uint32_t i = 1; i < MAX_PLANS; i++)
                        if (c->plans[i].used < p->used)
                                p = &c->plans[i];
                plan_destroy(p);
        }
        int r = plan_build(c, p, B, C, H, W, F, k);
        if (r < 0) {
                plan_destroy(p); /* leaves B == 0: never matches, reused first */
                return r;
        }
        p->used = c->clock;
        *ret = p;
        return 0;
}

/* Bytes of the padded input copy an even kernel needs, at the head of the workspace. */
static size_t pad_bytes(const struct conv_plan *p)
{
        return p->padded ? round_up(sizeof(float) * p->B * p->C * p->Hp * p->Wp, ALIGN) : 0;
}

static int pad_input(struct cuda_ctx *c, const struct conv_plan *p, const void *x, float *xp)
{
        uint32_t top = (p->k - 1) / 2;
        k_pad<<<blocks_for((size_t)p->B * p->C * p->Hp * p->Wp), THREADS, 0, c->stream>>>(
                (const float *)x, xp, p->B * p->C, p->H, p->W, p->Hp, p->Wp, top, top);
        CK_LAUNCH(c);
        return 0;
}

static int cu_conv2d_fwd(struct backend *be, const void *x, const void *w, const void *b, void *y, uint32_t B,
                         uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k, void *col)
{
        struct cuda_ctx *c = ctx_of(be);
        const float one = 1.0f, zero = 0.0f;
        struct conv_plan *p;
        int r;
        if ((r = plan_get(c, B, C, H, W, F, k, &p)) < 0 || (r = ws_reserve(c, pad_bytes(p) + p->ws_fwd)) < 0)
                return r;
        const void *xin = x;
        if (p->padded) {
                if ((r = pad_input(c, p, x, (float *)c->ws)) < 0)
                        return r;
                xin = c->ws;
        }
        CK_DNN(c, cudnnConvolutionForward(c->dnn, &one, p->x, xin, p->w, w, p->conv, p->fwd,
                                          (char *)c->ws + pad_bytes(p), p->ws_fwd, &zero, p->y, y));
        CK_DNN(c, cudnnAddTensor(c->dnn, &one, p->bias, b, &one, p->y, y));
        return 0;
}

static int cu_conv2d_bwd(struct backend *be, const void *x, const void *w, const void *dy, void *dw, void *db,
                         void *dx, uint32_t B, uint32_t C, uint32_t H, uint32_t W, uint32_t F, uint32_t k, void *col)
{
        struct cuda_ctx *c = ctx_of(be);
        const float one = 1.0f, zero = 0.0f;
        struct conv_plan *p;
        int r;
        if ((r = plan_get(c, B, C, H, W, F, k, &p)) < 0)
                return r;
        /* workspace: [padded x][padded dx][cuDNN's] */
        size_t pb = pad_bytes(p), need = p->ws_filter > p->ws_data ? p->ws_filter : p->ws_data;
        if ((r = ws_reserve(c, 2 * pb + need)) < 0)
                return r;
        char *ws = (char *)c->ws;
        const void *xin = x;
        if (p->padded) {
                if ((r = pad_input(c, p, x, (float *)ws)) < 0)
                        return r;
                xin = ws;
        }
        CK_DNN(c, cudnnConvolutionBackwardBias(c->dnn, &one, p->y, dy, &zero, p->bias, db));
        CK_DNN(c, cudnnConvolutionBackwardFilter(c->dnn, &one, p->x, xin, p->y, dy, p->conv, p->bwd_filter, ws + 2 * pb,
                                                 p->ws_filter, &zero, p->w, dw));
        if (!dx)
                return 0;
        void *dxp = p->padded ? (void *)(ws + pb) : dx;
        CK_DNN(c, cudnnConvolutionBackwardData(c->dnn, &one, p->w, w, p->y, dy, p->conv, p->bwd_data, ws + 2 * pb,
                                               p->ws_data, &zero, p->x, dxp));
        if (p->padded) {
                uint32_t top = (k - 1) / 2;
                k_crop<<<blocks_for((size_t)B * C * H * W), THREADS, 0, c->stream>>>((const float *)dxp, (float *)dx,
                                                                                     B * C, H, W, p->Hp, p->Wp, top, top);
                CK_LAUNCH(c);
        }
        return 0;
}

/* ---- pooling ---- */

static int cu_maxpool2d_fwd(struct backend *be, const void *x, void *y, uint32_t B, uint32_t C, uint32_t H,
                            uint32_t W, uint32_t p)
{
        struct cuda_ctx *c = ctx_of(be);
        const float one = 1.0f, zero = 0.0f;
        CK_DNN(c, cudnnSetPooling2dDescriptor(c->poold, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, (int)p, (int)p, 0, 0,
                                              (int)p, (int)p));
        CK_DNN(c, cudnnSetTensor4dDescriptor(c->t0, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)B, (int)C, (int)H, (int)W));
        CK_DNN(c, cudnnSetTensor4dDescriptor(c->t1, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)B, (int)C, (int)(H / p),
                                             (int)(W / p)));
        CK_DNN(c, cudnnPoolingForward(c->dnn, c->poold, &one, c->t0, x, &zero, c->t1, y));
        return 0;
}

/* Our own kernel: cuDNN's backward wants the forward output, which the table does not pass, and does
 * not promise which of tied maxima (common after a ReLU) takes the gradient; the CPU backend's rule
 * is the first. */
static int cu_maxpool2d_bwd(struct backend *be, const void *x, const void *dy, void *dx, uint32_t B, uint32_t C,
                            uint32_t H, uint32_t W, uint32_t p)
{
        struct cuda_ctx *c = ctx_of(be);
        k_maxpool_bwd<<<blocks_for((size_t)B * C * H * W), THREADS, 0, c->stream>>>(
                (const float *)x, (const float *)dy, (float *)dx, B * C, H, W, p);
        CK_LAUNCH(c);
        return 0;
}

/* ---- life cycle ---- */

static void ctx_destroy(struct cuda_ctx *c)
{
        if (!c)
                return;
        use_device(c->device);
        if (c->stream)
                cudaStreamSynchronize(c->stream);
        for (uint32_t i = 0; i < c->n_plans; i++)
                plan_destroy(&c->plans[i]);
        if (c->t0)
                cudnnDestroyTensorDescriptor(c->t0);
        if (c->t1)
                cudnnDestroyTensorDescriptor(c->t1);
        if (c->act)
                cudnnDestroyActivationDescriptor(c->act);
        if (c->poold)
                cudnnDestroyPoolingDescriptor(c->poold);
        if (c->dnn)
                cudnnDestroy(c->dnn);
        if (c->blas)
                cublasDestroy(c->blas);
        pool_destroy(&c->pool);
        if (c->host_scalars)
                cudaFreeHost(c->host_scalars);
        if (c->stream)
                cudaStreamDestroy(c->stream);
        cudaGetLastError(); /* leave no error behind for the next backend's launch checks */
        free(c);
}

/* cudaHostRegister: the driver page-locks the range and maps it for DMA, so cudaMemcpyAsync reads and
 * writes it directly (on an H200: 13 MB of parameters in 0.5 ms instead of 2.2 ms through the driver's
 * staging buffer). */
static int cu_host_pin(struct backend *be, void *p, size_t bytes)
{
        struct cuda_ctx *c = ctx_of(be);
        if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
                cudaGetLastError(); /* not sticky: the copies still work, pageable */
                return -ENOMEM;
        }
        return 0;
}

static void cu_host_unpin(struct backend *be, void *p)
{
        if (cudaHostUnregister(p) != cudaSuccess)
                cudaGetLastError();
}

static void cu_free(struct backend *be)
{
        ctx_destroy(ctx_of(be));
        be->ctx = NULL;
}

static const struct backend_ops cuda_ops = {
        /* .name */ "cuda",
        /* .host_memory */ false,
        cu_free,
        cu_alloc,
        cu_buf_free,
        cu_upload,
        cu_download,
        cu_memset0,
        cu_sync,
        cu_gemm,
        cu_add_bias_rows,
        cu_bias_grad,
        cu_relu_fwd,
        cu_relu_bwd,
        cu_tanh_fwd,
        cu_tanh_bwd,
        cu_sigmoid_fwd,
        cu_sigmoid_bwd,
        cu_softmax_xent_fwd,
        cu_softmax_xent_bwd,
        cu_correct_count,
        cu_conv2d_fwd,
        cu_conv2d_bwd,
        cu_maxpool2d_fwd,
        cu_maxpool2d_bwd,
        /* the single-output heads (logistic, mse): not on the GPU yet, model_new refuses them here */
        /* .logistic_xent_fwd */ NULL,
        /* .logistic_xent_bwd */ NULL,
        /* .mse_fwd */ NULL,
        /* .mse_bwd */ NULL,
        cu_host_pin,
        cu_host_unpin,
        &cuda_graph_kernels,
};

static double gib(size_t b)
{
        return (double)b / (1024.0 * 1024.0 * 1024.0);
}

extern "C" int backend_cuda_probe(struct device_gpu_info *infos, uint32_t max, char *msg, size_t msglen)
{
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e == cudaErrorNoDevice)
                return 0;
        if (e != cudaSuccess) {
                snprintf(msg, msglen, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
                cudaGetLastError();
                return cuda_errno(e);
        }
        for (int i = 0; i < n && (uint32_t)i < max; i++) {
                cudaDeviceProp pr;
                memset(&infos[i], 0, sizeof(infos[i]));
                infos[i].ordinal = i;
                if ((e = cudaGetDeviceProperties(&pr, i)) != cudaSuccess) {
                        snprintf(msg, msglen, "cudaGetDeviceProperties(%d): %s", i, cudaGetErrorString(e));
                        return cuda_errno(e);
                }
                snprintf(infos[i].name, sizeof(infos[i].name), "%.90s", pr.name);
                infos[i].cc_major = pr.major;
                infos[i].cc_minor = pr.minor;
                infos[i].total_bytes = pr.totalGlobalMem;
        }
        return n;
}

/* Headroom left to the CUDA context, cuBLAS and cuDNN when the whole card is asked for. */
#define HEADROOM DEVICE_GPU_HEADROOM
/* cuBLAS's workspace: NVIDIA's advice for Hopper, less under a small cap */
#define BLAS_WS(cap) ((cap) >= ((size_t)1 << 30) ? (size_t)32 << 20 : (size_t)4 << 20)

/* Handles, stream, the memory cap and its reservation. */
static int setup(struct cuda_ctx *c, const struct device_opts *o)
{
        CK_CUDA(c, use_device(c->device));
        cudaDeviceProp pr;
        CK_CUDA(c, cudaGetDeviceProperties(&pr, c->device));
        snprintf(c->name, sizeof(c->name), "cuda:%d (%.100s)", c->device, pr.name);
        CK_CUDA(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
        CK_BLAS(c, cublasCreate(&c->blas));
        CK_BLAS(c, cublasSetStream(c->blas, c->stream));
        CK_BLAS(c, cublasSetMathMode(c->blas, c->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
        CK_DNN(c, cudnnCreate(&c->dnn));
        CK_DNN(c, cudnnSetStream(c->dnn, c->stream));
        CK_DNN(c, cudnnCreateTensorDescriptor(&c->t0));
        CK_DNN(c, cudnnCreateTensorDescriptor(&c->t1));
        CK_DNN(c, cudnnCreateActivationDescriptor(&c->act));
        CK_DNN(c, cudnnCreatePoolingDescriptor(&c->poold));
        CK_CUDA(c, cudaMallocHost(&c->host_scalars, 16));

        /* the cap, after the libraries have taken what they take for themselves */
        size_t free_b = 0, total = 0;
        CK_CUDA(c, cudaMemGetInfo(&free_b, &total));
        size_t want = (size_t)(o->gpu_memory_fraction * (double)total);
        size_t avail = free_b > HEADROOM ? free_b - HEADROOM : 0;
        if (want > avail) {
                if (o->gpu_memory_fraction < 1.0)
                        return fail(c, -ENOMEM,
                                    "gpu_memory_fraction %.3g asks for %.2f GiB but only %.2f GiB of the %.2f GiB "
                                    "are free (other processes hold the rest)",
                                    o->gpu_memory_fraction, gib(want), gib(free_b), gib(total));
                want = avail; /* the whole card: what is free */
        }
        c->pool.st.cap = want / ALIGN * ALIGN;
        c->pool.growth = o->allow_growth;
        if (!o->allow_growth && !seg_new(&c->pool, c->pool.st.cap)) {
                cudaGetLastError();
                return fail(c, -ENOMEM, "cannot reserve the GPU memory cap of %.2f GiB (%.2f GiB free)",
                            gib(c->pool.st.cap), gib(free_b));
        }
        /* cuBLAS's workspace and our scalars from the pool: no allocation behind our back */
        size_t blas_ws = BLAS_WS(c->pool.st.cap);
        c->blas_ws = pool_alloc(&c->pool, blas_ws);
        c->dev_scalars = pool_alloc(&c->pool, 16);
        if (!c->blas_ws || !c->dev_scalars)
                return fail(c, -ENOMEM, "the GPU memory cap of %.1f MiB cannot hold cuBLAS's workspace",
                            (double)c->pool.st.cap / (1 << 20));
        CK_BLAS(c, cublasSetWorkspace(c->blas, c->blas_ws, blas_ws));
        return 0;
}

extern "C" int backend_cuda_new(const struct device_opts *o, struct backend **ret, char *msg, size_t msglen)
{
        if (o->n_gpus != 1) {
                snprintf(msg, msglen, "one GPU per CUDA backend (asked for %u)", o->n_gpus);
                return -EOPNOTSUPP;
        }
        struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof(*c));
        struct backend *be = (struct backend *)calloc(1, sizeof(*be));
        int r = -ENOMEM;
        if (!c || !be) {
                snprintf(msg, msglen, "out of memory");
                goto fail;
        }
        c->device = o->gpus[0];
        c->err[0] = 0;
        c->tf32 = o->tf32;
        r = setup(c, o);
        if (r < 0) {
                snprintf(msg, msglen, "%s", c->err[0] ? c->err : strerror(-r));
                goto fail;
        }
        be->ops = &cuda_ops;
        be->ctx = c;
        *ret = be;
        return 0;
fail:
        ctx_destroy(c);
        free(be);
        return r;
}

extern "C" int backend_cuda_mem_stats(const struct backend *be, struct device_mem_stats *ret)
{
        if (!be || be->ops != &cuda_ops)
                return -EINVAL;
        const struct pool *p = &((const struct cuda_ctx *)be->ctx)->pool;
        *ret = p->st;
        return 0;
}

extern "C" const char *backend_cuda_device_name(const struct backend *be)
{
        if (!be || be->ops != &cuda_ops)
                return NULL;
        return ((const struct cuda_ctx *)be->ctx)->name;
}
