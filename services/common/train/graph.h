/* A model as a graph: a DAG of typed nodes over tensors with static shapes, the batch being the one
 * symbolic dimension (docs/architecture.md, "The graph engine"). The graph is built node by node (by the
 * ONNX loader, onnx_load.h, or from code), then graph_finalize orders it topologically, infers every
 * shape and checks every node's attributes against what the op supports. A graph_exec runs it for
 * batches up to a maximum: forward in topological order, backward by reverse-mode differentiation over
 * the same nodes, with every buffer allocated once when the exec is made (no allocation per step).
 *
 * Tensors are row-major, float32 or int64. Parameters (float initializers that train) are one
 * contiguous block, in the order they were added, gradients another block with the same layout, as
 * model.h's variables are; constants (int64 initializers, and float ones marked constant) never train.
 *
 * The ops are ONNX's (opsets 13 to 17), with ONNX's attribute names and semantics; graph_ops.c holds the
 * table of what each op accepts and its shape function, graph_k_*.c the CPU kernels (forward and
 * backward). An exec computes on the host with those (graph_exec_new), or on a backend's device with the
 * backend's own kernels (graph_exec_new_on; the CUDA plugin's are services/workerd/backend/graph_cuda.cu):
 * its buffers are then the device's, and what crosses to the host says so below. Errors name the node,
 * its op and why, in one line.
 *
 * Not thread-safe: one thread builds a graph and drives an exec. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GRAPH_MAX_RANK 6
#define GRAPH_MAX_IN 8
#define GRAPH_MAX_OUT 3
/* The symbolic batch dimension in a shape (only as dims[0] of inputs, and wherever it propagates). */
#define GRAPH_BATCH (-1)

enum graph_op {
        GOP_GEMM, GOP_MATMUL, GOP_ADD, GOP_SUB, GOP_MUL, GOP_DIV,
        GOP_RELU, GOP_LEAKY_RELU, GOP_SIGMOID, GOP_TANH, GOP_SOFTMAX, GOP_LOG_SOFTMAX,
        GOP_CONV, GOP_MAXPOOL, GOP_AVGPOOL, GOP_GLOBAL_AVGPOOL, GOP_BATCHNORM, GOP_DROPOUT,
        GOP_LAYERNORM, GOP_PAD, GOP_FLATTEN, GOP_RESHAPE, GOP_TRANSPOSE, GOP_CONCAT, GOP_SQUEEZE,
        GOP_UNSQUEEZE, GOP_GATHER, GOP_REDUCE_SUM, GOP_REDUCE_MEAN, GOP_IDENTITY,
        GOP__COUNT
};

/* ONNX's name of an op ("Gemm"), and the op of a name (-ENOENT for one outside the set). */
const char *graph_op_name(enum graph_op op);
int graph_op_by_name(const char *name);

enum graph_dtype { GDT_F32, GDT_I64 };

enum graph_tensor_kind {
        GT_INPUT,       /* fed each step (dims[0] may be GRAPH_BATCH) */
        GT_PARAM,       /* a float initializer that trains: a variable */
        GT_CONST,       /* an initializer that does not train (int64, or float marked constant) */
        GT_VALUE,       /* computed by a node */
};

struct graph_shape {
        uint32_t rank;
        int64_t dims[GRAPH_MAX_RANK]; /* GRAPH_BATCH for the batch; every other dim >= 1 */
};

struct graph_tensor {
        char *name;
        enum graph_tensor_kind kind;
        enum graph_dtype dtype;
        struct graph_shape shape;    /* inferred by graph_finalize for GT_VALUE */
        void *data;                  /* GT_PARAM: initial values; GT_CONST: the values (owned) */
        size_t param_offset;         /* GT_PARAM: floats into the parameter block */
        int producer;                /* index of the node that computes it, or -1 */
        bool want_grad;              /* GT_INPUT: backward computes its gradient too (graph_grad); set
                                      * before graph_exec_new */
        bool moving;                 /* GT_PARAM read only as a BatchNormalization's running mean or
                                      * variance: a moving average, not trained (graph_finalize sets it) */
};

/* Attributes, by ONNX's names. A node's op says which it reads. graph_attrs_default gives one set of
 * defaults for all ops (axis 1 as Flatten's, alpha 1 as Gemm's): where an op's own ONNX default
 * differs (Softmax's axis -1, LeakyRelu's alpha 0.01, LayerNormalization's axis -1) the builder sets it. What ONNX passes as constant inputs since opset 13 arrives here as attributes,
 * the input dropped: Reshape's shape (shape, n_shape), Pad's pads and constant value, the axes of
 * Squeeze, Unsqueeze and ReduceSum, Dropout's ratio (the loader moves them; graph_finalize refuses
 * such an input that is not constant). */
struct graph_attrs {
        int64_t axis;                /* Softmax, LogSoftmax, Concat, Gather, Flatten, LayerNormalization */
        int64_t trans_a, trans_b;    /* Gemm */
        int64_t keepdims;            /* ReduceSum, ReduceMean */
        int64_t noop_with_empty_axes;
        int64_t group;               /* Conv: 1 only */
        int64_t count_include_pad;   /* AveragePool */
        int64_t ceil_mode;           /* MaxPool, AveragePool: 0 only */
        float alpha, beta;           /* Gemm; LeakyRelu's alpha */
        float epsilon, momentum;     /* BatchNormalization, LayerNormalization */
        float ratio;                 /* Dropout */
        float pad_value;             /* Pad (constant mode) */
        uint32_t n_axes, n_perm, n_pads, n_strides, n_dilations, n_kernel;
        int64_t axes[GRAPH_MAX_RANK];      /* Squeeze, Unsqueeze, Reduce*: as given (negatives allowed) */
        int64_t perm[GRAPH_MAX_RANK];      /* Transpose (n_perm 0: reversed) */
        int64_t pads[2 * GRAPH_MAX_RANK];  /* Conv, pools: begins then ends; Pad: the same over all axes */
        int64_t strides[GRAPH_MAX_RANK], dilations[GRAPH_MAX_RANK], kernel[GRAPH_MAX_RANK];
        int64_t shape[GRAPH_MAX_RANK];     /* Reshape's target (from its constant input), n in n_shape */
        uint32_t n_shape;
};

void graph_attrs_default(struct graph_attrs *a);

struct graph_node {
        enum graph_op op;
        char *name;
        uint32_t n_in, n_out;
        int32_t in[GRAPH_MAX_IN];    /* tensor indices; -1 for an optional input left out */
        int32_t out[GRAPH_MAX_OUT];
        struct graph_attrs a;
};

struct graph {
        struct graph_tensor *tensors;
        uint32_t n_tensors, cap_tensors;
        struct graph_node *nodes;    /* in topological order after graph_finalize */
        uint32_t n_nodes, cap_nodes;
        int32_t loss;                /* the output differentiated (a scalar, or summed), -1: none yet */
        size_t n_params;             /* floats in the parameter block */
        bool final;
};

struct graph *graph_new(void);
struct graph *graph_free(struct graph *g); /* NULL-safe; returns NULL */

/* Adds a tensor; returns its index, or -EEXIST (the name is taken), -ENOMEM. data (nullable) is copied:
 * shape's element count times the dtype's size. */
int graph_add_tensor(struct graph *g, const char *name, enum graph_tensor_kind kind, enum graph_dtype dtype,
                     const struct graph_shape *shape, const void *data);
/* The index of the tensor called name, or -ENOENT. */
int graph_find(const struct graph *g, const char *name);
/* Adds a node over existing tensors (in[i] -1: an optional input left out); its outputs are new
 * GT_VALUE tensors with the given names. Returns the node's index, or -EEXIST (an output's name is
 * taken), -EINVAL (n_in or n_out out of range, an unknown input), -ENOMEM. */
int graph_add_node(struct graph *g, enum graph_op op, const char *name, const int32_t *in, uint32_t n_in,
                   const char *const *out_names, uint32_t n_out, const struct graph_attrs *a);

/* Orders the nodes topologically, infers every shape, lays out the parameter block and checks each
 * node against its op (inputs, attributes, shapes). Returns 0, or -EINVAL with one line in err naming
 * the node, its op and why ("node \"fc1\" (Gemm): transA=1 is not supported"; "a cycle through node
 * ..."). */
int graph_finalize(struct graph *g, char *err, size_t errlen);

/* What graph_finalize checks of node i (its inputs' count and dtypes, its attributes and input shapes
 * through its op's shape function) and its outputs' inferred shapes, written into their tensors; for a
 * builder that needs shapes before the graph is whole (the ONNX loader's folds). 0, or -EINVAL or
 * -ENOTSUP with why (not naming the node: the caller does). */
int graph_infer_node(struct graph *g, uint32_t i, char *why, size_t whylen);

/* A copy of finalized graph g without node `node`, whose one output becomes a GT_INPUT of the same
 * name and shape (fed from outside: an embedding lookup done on the ps, say); the tensors no remaining
 * node reads are dropped unless they are g's loss (the lookup's table and ids, when nothing else reads
 * them). The copy is finalized; the parameters keep their order. 0, or -EINVAL (a node with more than
 * one output, the loss's producer) or -ENOMEM with why in err. */
int graph_cut_node(const struct graph *g, uint32_t node, struct graph **ret, char *err, size_t errlen);

/* Element count of a shape with the batch as B. */
size_t graph_shape_count(const struct graph_shape *s, uint32_t B);

/* ---- running it ---- */

struct graph_exec;
struct backend;

/* Buffers for batches up to max_batch, in host memory, computed by the CPU kernels. The parameters start
 * as the initializers' values. */
int graph_exec_new(const struct graph *g, uint32_t max_batch, struct graph_exec **ret, char *err, size_t errlen);
/* The same on backend be (backend.h): a host-memory backend (or be NULL) gives graph_exec_new's exec,
 * computed by the backend's graph kernels where it has its own; any other allocates every buffer (values,
 * gradients, state, scratch, the parameter and gradient blocks, the constants) with be and computes with
 * be's graph kernels: "the exec's memory" below is then the device's. -EOPNOTSUPP with why in err when be
 * has no graph kernels, or lacks a kernel an op of g needs; -ENOMEM when the buffers do not fit. */
int graph_exec_new_on(const struct graph *g, uint32_t max_batch, struct backend *be, struct graph_exec **ret,
                      char *err, size_t errlen);
/* Frees the exec and every buffer it allocated (NULL-safe); returns NULL. */
struct graph_exec *graph_exec_free(struct graph_exec *x);
/* true when the exec's memory is a device's (graph_exec_new_on on a backend without host memory). */
bool graph_exec_on_device(const struct graph_exec *x);

float *graph_exec_params(struct graph_exec *x); /* (n_params) in the exec's memory */
float *graph_exec_grads(struct graph_exec *x);  /* (n_params) in the exec's memory, written by graph_backward */
/* Moves the parameter and gradient blocks into memory of the caller's (n_params floats each, not
 * overlapping; in the exec's memory: the backend's buffers on a device), the parameters' values kept; the
 * exec computes in them from then on and leaves them alone when freed. May be called again to move them
 * on (the blocks before are left to their owner). */
int graph_exec_use_blocks(struct graph_exec *x, float *params, float *grads);

/* Feeds input tensor t (GT_INPUT) for a batch of B: B * (its count per example) values of its dtype,
 * copied from host memory (uploaded on a device). */
int graph_set_input(struct graph_exec *x, int32_t t, const void *data, uint32_t B);
/* The same from rows ld floats apart (row b at data + b * ld), in host memory: a slice of a wider input. */
int graph_set_input_rows(struct graph_exec *x, int32_t t, const float *data, size_t ld, uint32_t B);
/* Runs every node for the batch the inputs were fed with. training: Dropout drops and BatchNormalization
 * uses the batch's statistics; seed makes Dropout's masks (the same seed, the same masks). */
int graph_forward(struct graph_exec *x, bool training, uint64_t seed);
/* Called with a parameter (its tensor's index) and a block of its rows: by graph_forward_hooked right
 * before the first node that reads it runs, by graph_backward_hooked as soon as its gradient is final
 * (after its first reader's backward: the last to add to it), once per parameter and pass; the
 * parameters no node reads after every node. block is 0, except for a parameter split by
 * graph_exec_set_blocks: its Gemm calls it once per block, in order, right before it computes with the
 * block's rows (forward) and as soon as their gradient is final (backward). A moving parameter (a
 * running statistic) gets no backward call: its value in the gradient block comes from
 * graph_moving_deltas. A nonzero return stops the pass, which returns it. For a caller that moves
 * parameters and gradients while the graph computes (a worker's pulls and pushes). */
typedef int (*graph_param_cb)(void *ud, int32_t tensor, uint32_t block);
int graph_forward_hooked(struct graph_exec *x, bool training, uint64_t seed, graph_param_cb before, void *ud);
/* Splits parameter t into n blocks of rows, block b rows [row_begin[b], row_begin[b + 1]) (row_begin[0]
 * 0, increasing, below the rows; n 1, row_begin NULL: whole again), so that the hooks move each block as
 * soon as it is needed or final: for a rank-2 parameter that one Gemm alone reads, as its B (its rows
 * are K with transB 0, N with transB 1), on the host. The Gemm then computes block by block (the same
 * arithmetic wherever the boundaries are the same). -EOPNOTSUPP for any other tensor or a device exec,
 * -EINVAL for bad boundaries, -ENOMEM. */
int graph_exec_set_blocks(struct graph_exec *x, int32_t t, uint32_t n, const uint32_t *row_begin);
/* The current values of tensor t (after graph_forward), in the exec's memory, and its count for this
 * batch. */
const void *graph_value(const struct graph_exec *x, int32_t t, size_t *count_ret);
/* The same in host memory: graph_value itself on a host exec; on a device a copy, downloaded into a
 * buffer of the exec's that the next *_host call overwrites (NULL when the download fails). */
const void *graph_value_host(struct graph_exec *x, int32_t t, size_t *count_ret);
/* Reverse-mode: seeds d(loss)/d(output t) with dt (count floats in the exec's memory, the output's count
 * for this batch; NULL: ones, i.e. the gradient of the sum), and writes every parameter's gradient into
 * the gradient block. Needs a graph_forward with training as it will be differentiated. */
int graph_backward(struct graph_exec *x, int32_t t, const float *dt);
int graph_backward_hooked(struct graph_exec *x, int32_t t, const float *dt, graph_param_cb after, void *ud);
/* For every moving parameter (a BatchNormalization's running statistic), what the moving average
 * subtracts after the last training forward, into the gradient block: old - new = (1 - momentum) *
 * (old - the batch's statistic), the batch's variance the biased one (ONNX's). Applied as v -= g, it is
 * TensorFlow's assign_moving_average. Zeros after an inference forward. Call after graph_backward
 * (which clears the gradient block). On a device it goes through host copies of the statistics (a few
 * floats per channel). 0, or -errno when a transfer fails (never on the host). */
int graph_moving_deltas(struct graph_exec *x);
/* The gradient of input t (one marked want_grad) written by the last graph_backward, in the exec's
 * memory, its count that batch's; NULL for any other tensor. */
const float *graph_grad(const struct graph_exec *x, int32_t t);
/* The same in host memory, as graph_value_host. */
const float *graph_grad_host(struct graph_exec *x, int32_t t);

#ifdef __cplusplus
}
#endif
