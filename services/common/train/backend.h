/* A compute backend: a table of function pointers plus a context (ggml-backend style). The CPU backend
 * (backend_cpu.c, OpenBLAS) is always built and is the reference every other backend is tested against.
 *
 * Buffers are backend-owned device pointers (void *), allocated with backend_alloc. Unless stated,
 * buffers hold float32 and sizes count elements; labels are uint8 buffers. Tensors are row-major;
 * images are NCHW. Ops may run asynchronously on a device backend; backend_download and the ops that
 * return a host scalar (softmax_xent_fwd, correct_count) synchronize.
 *
 * Ops return 0 or -errno (a device backend translates its own error codes into errno). Shape
 * arguments are the caller's responsibility: a bad shape is a bug, not a runtime error.
 *
 * Thread-safety: one backend is used by one thread at a time. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct backend;
struct graph_kernels;

/* The table a backend implements. Implementers fill it; everyone else calls the backend_* wrappers. */
struct backend_ops {
        const char *name;
        /* true when device pointers are host pointers (upload/download are memcpy, and callers may
         * pass host memory directly as read-only inputs) */
        bool host_memory;
        void (*free)(struct backend *be);

        void *(*alloc)(struct backend *be, size_t bytes); /* NULL on failure; zero-filled */
        void (*buf_free)(struct backend *be, void *buf);  /* NULL-safe */
        int (*upload)(struct backend *be, void *dst, const void *src, size_t bytes);
        int (*download)(struct backend *be, void *dst, const void *src, size_t bytes);
        int (*memset0)(struct backend *be, void *dst, size_t bytes);
        int (*synchronize)(struct backend *be);

        /* C (M, N) = alpha * op(A) @ op(B) + beta * C; op(A) is (M, K), op(B) is (K, N). */
        int (*gemm)(struct backend *be, bool trans_a, bool trans_b, uint32_t M, uint32_t N, uint32_t K,
                    float alpha, const void *A, uint32_t lda, const void *B, uint32_t ldb, float beta,
                    void *C, uint32_t ldc);
        int (*add_bias_rows)(struct backend *be, void *y /* (rows, n) */, const void *bias /* (n) */,
                             uint32_t rows, uint32_t n);
        /* db = column sums of dy (overwrites db) */
        int (*bias_grad)(struct backend *be, const void *dy /* (rows, n) */, void *db /* (n) */,
                         uint32_t rows, uint32_t n);

        /* Elementwise activations; x and y may alias. Backward takes the forward *output* y;
         * dy and dx may alias. */
        int (*relu_fwd)(struct backend *be, const void *x, void *y, size_t n);
        int (*relu_bwd)(struct backend *be, const void *y, const void *dy, void *dx, size_t n);
        int (*tanh_fwd)(struct backend *be, const void *x, void *y, size_t n);
        int (*tanh_bwd)(struct backend *be, const void *y, const void *dy, void *dx, size_t n);
        int (*sigmoid_fwd)(struct backend *be, const void *x, void *y, size_t n);
        int (*sigmoid_bwd)(struct backend *be, const void *y, const void *dy, void *dx, size_t n);

        /* probs = softmax(logits) row by row; *loss_ret = mean over B of -log p[b, label[b]] (host). */
        int (*softmax_xent_fwd)(struct backend *be, const void *logits /* (B, C) */,
                                const void *labels /* uint8 (B) */, uint32_t B, uint32_t C,
                                void *probs /* (B, C) */, float *loss_ret);
        /* dlogits = (probs - onehot(labels)) / B; probs and dlogits may alias. */
        int (*softmax_xent_bwd)(struct backend *be, const void *probs, const void *labels, uint32_t B,
                                uint32_t C, void *dlogits /* (B, C) */);
        /* *correct_ret = #{b : argmax_c scores[b, c] == labels[b]} (first maximum wins) (host). */
        int (*correct_count)(struct backend *be, const void *scores /* (B, C) */, const void *labels,
                             uint32_t B, uint32_t C, uint32_t *correct_ret);

        /* "same" padding, stride 1, odd kernel k. w is (F, C*k*k) (index (f, c, ky, kx)), b is (F).
         * col is a workspace of backend_conv2d_col_floats(C, H, W, k) floats. */
        int (*conv2d_fwd)(struct backend *be, const void *x /* (B, C, H, W) */, const void *w,
                          const void *b, void *y /* (B, F, H, W) */, uint32_t B, uint32_t C, uint32_t H,
                          uint32_t W, uint32_t F, uint32_t k, void *col);
        /* dw, db overwritten; dx (nullable: not computed) overwritten. */
        int (*conv2d_bwd)(struct backend *be, const void *x, const void *w, const void *dy, void *dw,
                          void *db, void *dx, uint32_t B, uint32_t C, uint32_t H, uint32_t W,
                          uint32_t F, uint32_t k, void *col);
        /* window = stride = p; output (B, C, H/p, W/p) (rows and columns that don't fill a window are
         * dropped, TF's "valid"). Backward recomputes the argmax from x (first maximum wins); dx is
         * overwritten, zero outside the maxima. */
        int (*maxpool2d_fwd)(struct backend *be, const void *x /* (B, C, H, W) */, void *y, uint32_t B,
                             uint32_t C, uint32_t H, uint32_t W, uint32_t p);
        int (*maxpool2d_bwd)(struct backend *be, const void *x, const void *dy, void *dx, uint32_t B,
                             uint32_t C, uint32_t H, uint32_t W, uint32_t p);

        /* The single-output heads (model.head), with float labels. A backend may leave them NULL:
         * model_new then refuses those heads (-EOPNOTSUPP). Kept last, so that a table initialized in
         * order without them (the CUDA backend's) still compiles. */
        /* probs = sigmoid(logits); *loss_ret = mean over B of the sigmoid cross-entropy, computed as
         * max(z, 0) - z y + log1p(exp(-|z|)) (host); *correct_ret (nullable) = #{b : (p > 0.5) == y}. */
        int (*logistic_xent_fwd)(struct backend *be, const void *logits /* (B) */, const void *labels /* (B) */,
                                 uint32_t B, void *probs /* (B) */, float *loss_ret, uint32_t *correct_ret);
        /* dlogits = (probs - labels) / B; probs and dlogits may alias. */
        int (*logistic_xent_bwd)(struct backend *be, const void *probs, const void *labels, uint32_t B,
                                 void *dlogits);
        /* *loss_ret = mean over B of (pred - label)^2 (host), as tf.losses.mean_squared_error. */
        int (*mse_fwd)(struct backend *be, const void *pred /* (B) */, const void *labels /* (B) */, uint32_t B,
                       float *loss_ret);
        /* dpred = 2 (pred - labels) / B; pred and dpred may alias. */
        int (*mse_bwd)(struct backend *be, const void *pred, const void *labels, uint32_t B, void *dpred);

        /* Page-lock host memory the backend copies to and from every step (the model's parameter and
         * gradient blocks), so that upload and download run at the bus's speed rather than through a
         * staging copy; host_unpin undoes it before the memory is freed. Optional (NULL: nothing to
         * do, as on the CPU); a failure only costs speed, so callers go on without it. */
        int (*host_pin)(struct backend *be, void *p, size_t bytes);
        void (*host_unpin)(struct backend *be, void *p);

        /* The graph engine's kernels on this backend's memory (graph-internal.h: one forward and one
         * backward per op of graph.h), which graph_exec_new_on runs a graph model with. The CPU's are the
         * reference (graph_kernels_cpu); NULL on a host-memory backend means those, on any other that the
         * backend computes no graph. */
        const struct graph_kernels *graph;
};

struct backend {
        const struct backend_ops *ops;
        void *ctx;
};

/* CPU backend over OpenBLAS. threads: OpenBLAS threads (process-wide setting; 0 leaves it as is). */
int backend_cpu_new(unsigned threads, struct backend **ret);

/* Frees the backend (NULL-safe); every buffer must have been freed. Returns NULL. */
struct backend *backend_free(struct backend *be);
const char *backend_name(const struct backend *be);
bool backend_host_memory(const struct backend *be);

static inline size_t backend_conv2d_col_floats(uint32_t C, uint32_t H, uint32_t W, uint32_t k)
{
        return (size_t)C * k * k * H * W;
}

/* Thin wrappers over the table, for readability at call sites. */
static inline void *backend_alloc(struct backend *be, size_t bytes)
{
        return be->ops->alloc(be, bytes);
}
static inline void *backend_buf_free(struct backend *be, void *buf)
{
        if (buf)
                be->ops->buf_free(be, buf);
        return NULL;
}
/* Pins [p, p + bytes) for fast copies where the backend has such a thing: true when pinned. */
static inline bool backend_host_pin(struct backend *be, void *p, size_t bytes)
{
        return be->ops->host_pin && bytes && be->ops->host_pin(be, p, bytes) == 0;
}
static inline void backend_host_unpin(struct backend *be, void *p)
{
        if (be->ops->host_unpin)
                be->ops->host_unpin(be, p);
}
static inline int backend_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
        return be->ops->upload(be, dst, src, bytes);
}
static inline int backend_download(struct backend *be, void *dst, const void *src, size_t bytes)
{
        return be->ops->download(be, dst, src, bytes);
}
