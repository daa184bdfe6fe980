/* What graph.c, graph_ops.c and the kernels (graph_k_*.c) share: the op table and the kernel
 * interface. Outside the graph engine only its ONNX loader includes it (for the ops' arities), and the
 * CUDA plugin (services/workerd/backend/graph_cuda.cu: the kernel interface, for its own table). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One node's kernel call: its tensors' buffers for this batch (shapes with the batch resolved). In
 * backward, in[] and out[] still hold the forward's values, and training is the forward's mode. No
 * output shares a buffer with an input. Every pointer is in the exec's memory: host memory for the CPU
 * kernels, the device's for a device backend's (graph_exec_new_on); shapes, attributes and flags are
 * host values either way. */
struct graph_kctx {
        const struct graph_node *node;
        uint32_t B;                                    /* the batch */
        const void *in[GRAPH_MAX_IN];                  /* NULL for an input left out */
        struct graph_shape in_shape[GRAPH_MAX_IN];     /* GRAPH_BATCH replaced by B */
        enum graph_dtype in_dtype[GRAPH_MAX_IN];
        void *out[GRAPH_MAX_OUT];
        struct graph_shape out_shape[GRAPH_MAX_OUT];
        /* backward: d(loss)/d(out[i]) (NULL for an output nothing differentiates), and the gradients of
         * the float inputs, to be ADDED to (a tensor may feed several nodes; the engine zeroes them
         * first); NULL where no gradient is needed (constants, int inputs, inputs of the graph). */
        const float *dout[GRAPH_MAX_OUT];
        float *din[GRAPH_MAX_IN];
        /* din[j] is to be SET, every element written, rather than added to: the tensor feeds this node
         * alone and its op says it can (graph_op_bwd_sets), so the engine left it unzeroed */
        bool din_set[GRAPH_MAX_IN];
        /* per-node state kept from forward to backward (state_floats of the op, at this B), e.g. a batch
         * normalization's mean and inverse deviation, a dropout mask, a pooling's argmax */
        float *state;
        /* per-node scratch for one call (scratch_floats of the op, at this B) */
        float *scratch;
        bool training;
        /* A Gemm whose B is split into row blocks (graph_exec_set_blocks): blk_n blocks, block b rows
         * [blk_rows[b], blk_rows[b + 1]); it computes block by block and calls blk_hook(blk_ud, blk_tensor,
         * b) before a block's forward and after its gradient (NULL: no hook this pass), returning what
         * nonzero the hook returns. blk_n 0 otherwise. */
        uint32_t blk_n;
        const uint32_t *blk_rows;
        int32_t blk_tensor;
        int (*blk_hook)(void *ud, int32_t tensor, uint32_t block);
        void *blk_ud;
        uint64_t seed;                                 /* Dropout: per step; mixed with the node's index */
        uint32_t node_index;
        struct backend *dev;                           /* the exec's backend (its stream, its handles);
                                                        * NULL on the host path */
};

/* A backend's kernels for the graph's ops (backend.h: backend_ops.graph), forward and backward per op,
 * each honouring the contract of graph_kctx as the CPU's (graph_kernels_cpu, the reference the others
 * are held to by tests/gpu/test_backend_equiv.c) do. A NULL bwd where the CPU's is set is refused by
 * graph_exec_new_on for a graph that uses the op. */
struct graph_kernels {
        const char *name;
        int (*fwd[GOP__COUNT])(struct graph_kctx *k);
        int (*bwd[GOP__COUNT])(struct graph_kctx *k);  /* NULL: no gradient flows through */
        /* After each forward of a graph with a Gather: an index out of range that the kernels could only
         * flag on the device, as -EINVAL; the call synchronizes. NULL: none to collect (the CPU's report
         * at once). */
        int (*forward_done)(struct backend *dev);
};

/* The CPU kernels (graph_k_*.c) as a table: graph_ops.c. */
extern const struct graph_kernels graph_kernels_cpu;

/* What the table says of an op. */
struct graph_op_info {
        const char *name;                /* ONNX's */
        uint8_t min_in, max_in;          /* after the loader moved constant inputs into attributes */
        uint8_t min_out, max_out;
        /* Checks the attributes and input shapes and writes the outputs' shapes (batch kept symbolic).
         * -EINVAL with why in err ("transA=1 is not supported"; "input 1 has rank 3, needs 2"): the
         * caller names the node and op. */
        int (*shape)(const struct graph *g, const struct graph_node *n, struct graph_shape *out, char *err,
                     size_t errlen);
        /* floats of state and scratch at batch B (NULL: none) */
        size_t (*state_floats)(const struct graph *g, const struct graph_node *n, uint32_t B);
        size_t (*scratch_floats)(const struct graph *g, const struct graph_node *n, uint32_t B);
};

extern const struct graph_op_info graph_ops[GOP__COUNT];

/* Bytes of one element of a dtype. */
size_t graph_dtype_size(enum graph_dtype t);

/* Row-major C (M, N) = alpha op(A) op(B) + beta C, as cblas_sgemm with CblasRowMajor: the kernels' one
 * matrix product. A pointer that graph_exec_new sets to gk_blas_sgemm (graph_k_blas.c, OpenBLAS): the
 * kernels reach no BLAS symbol themselves, so what only builds and checks graphs (the ONNX loader, a job
 * file's model.onnx, which psd reads for a graph model's variables) links no BLAS; only running one does. */
typedef void (*gk_sgemm_fn)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C, int ldc);
extern gk_sgemm_fn gk_sgemm;
void gk_blas_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc);
/* The ops whose backward honours din_set (writes a gradient whole when told to): the engine zeroes the
 * gradient of a tensor that feeds only such a node no more. */
extern const bool graph_op_bwd_sets[GOP__COUNT];

/* Shape helpers for the ops' shape functions. */
const struct graph_shape *graph_in_shape(const struct graph *g, const struct graph_node *n, uint32_t i);
/* NumPy broadcasting of a and b into out; -EINVAL with why when they do not broadcast. */
int graph_broadcast(const struct graph_shape *a, const struct graph_shape *b, struct graph_shape *out, char *err,
                    size_t errlen);
/* An axis in [-rank, rank) made non-negative; -EINVAL when out of range. */
int graph_axis(int64_t axis, uint32_t rank, uint32_t *ret);
/* Elements of a shape whose dims are all known (the batch resolved). */
size_t graph_count(const struct graph_shape *s);

/* ---- the ops, by file: each op's shape function (gs_*), forward and backward (gk_*) ---- */

#define GRAPH_SHAPE_FN(name)                                                                            \
        int name(const struct graph *g, const struct graph_node *n, struct graph_shape *out, char *err, \
                 size_t errlen)

/* graph_k_elem.c: Add, Sub, Mul, Div (broadcasting), Relu, LeakyRelu, Sigmoid, Tanh, Identity, Dropout
 * (Dropout's optional second output, the mask, is not produced: max_out 1) */
GRAPH_SHAPE_FN(gs_binary);
GRAPH_SHAPE_FN(gs_same);      /* out = in 0: the unary ops, Identity, Dropout, Softmax, LogSoftmax */
int gk_binary_fwd(struct graph_kctx *k);
int gk_binary_bwd(struct graph_kctx *k);
int gk_unary_fwd(struct graph_kctx *k);
int gk_unary_bwd(struct graph_kctx *k);
int gk_dropout_fwd(struct graph_kctx *k);
int gk_dropout_bwd(struct graph_kctx *k);
size_t gk_dropout_state(const struct graph *g, const struct graph_node *n, uint32_t B);

/* graph_k_matmul.c: Gemm, MatMul (2-D, and batched 3-D), Softmax, LogSoftmax, ReduceSum, ReduceMean */
GRAPH_SHAPE_FN(gs_gemm);
GRAPH_SHAPE_FN(gs_matmul);
GRAPH_SHAPE_FN(gs_reduce);
int gk_gemm_fwd(struct graph_kctx *k);
int gk_gemm_bwd(struct graph_kctx *k);
int gk_matmul_fwd(struct graph_kctx *k);
int gk_matmul_bwd(struct graph_kctx *k);
int gk_softmax_fwd(struct graph_kctx *k);
int gk_softmax_bwd(struct graph_kctx *k);
int gk_reduce_fwd(struct graph_kctx *k);
int gk_reduce_bwd(struct graph_kctx *k);

/* graph_k_shape.c: Flatten, Reshape, Squeeze, Unsqueeze (copies), Transpose, Concat, Gather, Pad */
GRAPH_SHAPE_FN(gs_flatten);
GRAPH_SHAPE_FN(gs_reshape);
GRAPH_SHAPE_FN(gs_squeeze);
GRAPH_SHAPE_FN(gs_unsqueeze);
GRAPH_SHAPE_FN(gs_transpose);
GRAPH_SHAPE_FN(gs_concat);
GRAPH_SHAPE_FN(gs_gather);
GRAPH_SHAPE_FN(gs_pad);
int gk_copy_fwd(struct graph_kctx *k);
int gk_copy_bwd(struct graph_kctx *k);
int gk_transpose_fwd(struct graph_kctx *k);
int gk_transpose_bwd(struct graph_kctx *k);
int gk_concat_fwd(struct graph_kctx *k);
int gk_concat_bwd(struct graph_kctx *k);
int gk_gather_fwd(struct graph_kctx *k);
int gk_gather_bwd(struct graph_kctx *k);
int gk_pad_fwd(struct graph_kctx *k);
int gk_pad_bwd(struct graph_kctx *k);

/* graph_k_conv.c: Conv, MaxPool, AveragePool, GlobalAveragePool (NCHW; 2-D convolutions and pools);
 * graph_k_norm.c: BatchNormalization, LayerNormalization */
GRAPH_SHAPE_FN(gs_conv);
GRAPH_SHAPE_FN(gs_pool);      /* MaxPool, AveragePool */
GRAPH_SHAPE_FN(gs_gap);
GRAPH_SHAPE_FN(gs_batchnorm);
GRAPH_SHAPE_FN(gs_layernorm);
int gk_conv_fwd(struct graph_kctx *k);
int gk_conv_bwd(struct graph_kctx *k);
size_t gk_conv_scratch(const struct graph *g, const struct graph_node *n, uint32_t B);
/* graph_k_dconv.c: Conv with stride 1 and no dilation, direct (no im2col). gk_dconv_geometry: 0 where
 * the geometry allows it (pads at most the kernel's size - 1; one example's planes within a core's L2),
 * else -1; gk_dconv_wins: where it also measured faster than graph_k_conv.c's im2col + sgemm, which
 * computes the rest. Forward sets Y (bias or not); backward sets or adds dX (dx_set) and dW (dw_set),
 * either NULL when not wanted; dB is the caller's. Scratch: gk_dconv_scratch floats at N examples. */
struct gk_dconv {
        size_t C, H, W, M, kh, kw;
        size_t pads[4]; /* top, left, bottom, right */
};
int gk_dconv_geometry(struct gk_dconv *d, int64_t C, int64_t H, int64_t W, int64_t M, int64_t kh, int64_t kw,
                      int64_t sh, int64_t sw, int64_t dh, int64_t dw, const int64_t pads[4]);
bool gk_dconv_wins(const struct gk_dconv *d);
size_t gk_dconv_scratch(const struct gk_dconv *d, size_t N);
void gk_dconv_fwd(const struct gk_dconv *d, size_t N, const float *x, const float *w, const float *bias, float *y,
                  float *scratch);
void gk_dconv_bwd(const struct gk_dconv *d, size_t N, const float *x, const float *w, const float *dy, float *dx,
                  bool dx_set, float *dw, bool dw_set, float *scratch);
/* The BLAS's threads (graph_k_blas.c; set by graph_exec_new with gk_sgemm; NULL: one), which
 * gk_dconv_wins weighs, the direct path running on one. */
extern int (*gk_blas_threads)(void);
int gk_blas_threads_openblas(void);
/* For tests and benchmarks, before graph_exec_new: AUTO (the default) takes the direct path where it
 * measured faster, NEVER never, ALWAYS wherever the geometry allows. */
enum gk_dconv_mode { GK_DCONV_AUTO, GK_DCONV_NEVER, GK_DCONV_ALWAYS };
extern enum gk_dconv_mode gk_dconv_mode;
int gk_pool_fwd(struct graph_kctx *k);
int gk_pool_bwd(struct graph_kctx *k);
int gk_gap_fwd(struct graph_kctx *k);
int gk_gap_bwd(struct graph_kctx *k);
int gk_batchnorm_fwd(struct graph_kctx *k);
int gk_batchnorm_bwd(struct graph_kctx *k);
size_t gk_batchnorm_state(const struct graph *g, const struct graph_node *n, uint32_t B);
int gk_layernorm_fwd(struct graph_kctx *k);
int gk_layernorm_bwd(struct graph_kctx *k);
size_t gk_layernorm_state(const struct graph *g, const struct graph_node *n, uint32_t B);

#ifdef __cplusplus
}
#endif
