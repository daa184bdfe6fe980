/* The op table: for each op of the set, its ONNX name, how many inputs and outputs it takes (after the
 * loader moved constant inputs into attributes: graph.h), its shape function and the sizes of its state
 * and scratch; and the CPU's kernel table (graph_kernels_cpu), the reference every backend's is held to. */
#include "graph-internal.h"

#include <errno.h>
#include <string.h>

#define OP(n, i0, i1, o0, o1, sh, st, sc) { n, i0, i1, o0, o1, sh, st, sc }

gk_sgemm_fn gk_sgemm; /* set by graph_exec_new */

const bool graph_op_bwd_sets[GOP__COUNT] = {
        [GOP_GEMM] = true, [GOP_RELU] = true, [GOP_LEAKY_RELU] = true, [GOP_SIGMOID] = true, [GOP_TANH] = true,
        [GOP_BATCHNORM] = true, [GOP_CONV] = true, [GOP_MAXPOOL] = true, [GOP_AVGPOOL] = true,
        [GOP_ADD] = true, [GOP_SUB] = true, [GOP_MUL] = true, [GOP_DIV] = true,
};

const struct graph_op_info graph_ops[GOP__COUNT] = {
        [GOP_GEMM] = OP("Gemm", 2, 3, 1, 1, gs_gemm, NULL, NULL),
        [GOP_MATMUL] = OP("MatMul", 2, 2, 1, 1, gs_matmul, NULL, NULL),
        [GOP_ADD] = OP("Add", 2, 2, 1, 1, gs_binary, NULL, NULL),
        [GOP_SUB] = OP("Sub", 2, 2, 1, 1, gs_binary, NULL, NULL),
        [GOP_MUL] = OP("Mul", 2, 2, 1, 1, gs_binary, NULL, NULL),
        [GOP_DIV] = OP("Div", 2, 2, 1, 1, gs_binary, NULL, NULL),
        [GOP_RELU] = OP("Relu", 1, 1, 1, 1, gs_same, NULL, NULL),
        [GOP_LEAKY_RELU] = OP("LeakyRelu", 1, 1, 1, 1, gs_same, NULL, NULL),
        [GOP_SIGMOID] = OP("Sigmoid", 1, 1, 1, 1, gs_same, NULL, NULL),
        [GOP_TANH] = OP("Tanh", 1, 1, 1, 1, gs_same, NULL, NULL),
        [GOP_SOFTMAX] = OP("Softmax", 1, 1, 1, 1, gs_same, NULL, NULL),
        [GOP_LOG_SOFTMAX] = OP("LogSoftmax", 1, 1, 1, 1, gs_same, NULL, NULL),
        [GOP_CONV] = OP("Conv", 2, 3, 1, 1, gs_conv, NULL, gk_conv_scratch),
        [GOP_MAXPOOL] = OP("MaxPool", 1, 1, 1, 1, gs_pool, NULL, NULL),
        [GOP_AVGPOOL] = OP("AveragePool", 1, 1, 1, 1, gs_pool, NULL, NULL),
        [GOP_GLOBAL_AVGPOOL] = OP("GlobalAveragePool", 1, 1, 1, 1, gs_gap, NULL, NULL),
        [GOP_BATCHNORM] = OP("BatchNormalization", 5, 5, 1, 3, gs_batchnorm, gk_batchnorm_state, NULL),
        [GOP_DROPOUT] = OP("Dropout", 1, 1, 1, 1, gs_same, gk_dropout_state, NULL),
        [GOP_LAYERNORM] = OP("LayerNormalization", 2, 3, 1, 1, gs_layernorm, gk_layernorm_state, NULL),
        [GOP_PAD] = OP("Pad", 1, 1, 1, 1, gs_pad, NULL, NULL),
        [GOP_FLATTEN] = OP("Flatten", 1, 1, 1, 1, gs_flatten, NULL, NULL),
        [GOP_RESHAPE] = OP("Reshape", 1, 1, 1, 1, gs_reshape, NULL, NULL),
        [GOP_TRANSPOSE] = OP("Transpose", 1, 1, 1, 1, gs_transpose, NULL, NULL),
        [GOP_CONCAT] = OP("Concat", 1, GRAPH_MAX_IN, 1, 1, gs_concat, NULL, NULL),
        [GOP_SQUEEZE] = OP("Squeeze", 1, 1, 1, 1, gs_squeeze, NULL, NULL),
        [GOP_UNSQUEEZE] = OP("Unsqueeze", 1, 1, 1, 1, gs_unsqueeze, NULL, NULL),
        [GOP_GATHER] = OP("Gather", 2, 2, 1, 1, gs_gather, NULL, NULL),
        [GOP_REDUCE_SUM] = OP("ReduceSum", 1, 1, 1, 1, gs_reduce, NULL, NULL),
        [GOP_REDUCE_MEAN] = OP("ReduceMean", 1, 1, 1, 1, gs_reduce, NULL, NULL),
        [GOP_IDENTITY] = OP("Identity", 1, 1, 1, 1, gs_same, NULL, NULL),
};

const struct graph_kernels graph_kernels_cpu = {
        .name = "cpu",
        .fwd = {
                [GOP_GEMM] = gk_gemm_fwd,
                [GOP_MATMUL] = gk_matmul_fwd,
                [GOP_ADD] = gk_binary_fwd,
                [GOP_SUB] = gk_binary_fwd,
                [GOP_MUL] = gk_binary_fwd,
                [GOP_DIV] = gk_binary_fwd,
                [GOP_RELU] = gk_unary_fwd,
                [GOP_LEAKY_RELU] = gk_unary_fwd,
                [GOP_SIGMOID] = gk_unary_fwd,
                [GOP_TANH] = gk_unary_fwd,
                [GOP_SOFTMAX] = gk_softmax_fwd,
                [GOP_LOG_SOFTMAX] = gk_softmax_fwd,
                [GOP_CONV] = gk_conv_fwd,
                [GOP_MAXPOOL] = gk_pool_fwd,
                [GOP_AVGPOOL] = gk_pool_fwd,
                [GOP_GLOBAL_AVGPOOL] = gk_gap_fwd,
                [GOP_BATCHNORM] = gk_batchnorm_fwd,
                [GOP_DROPOUT] = gk_dropout_fwd,
                [GOP_LAYERNORM] = gk_layernorm_fwd,
                [GOP_PAD] = gk_pad_fwd,
                [GOP_FLATTEN] = gk_copy_fwd,
                [GOP_RESHAPE] = gk_copy_fwd,
                [GOP_TRANSPOSE] = gk_transpose_fwd,
                [GOP_CONCAT] = gk_concat_fwd,
                [GOP_SQUEEZE] = gk_copy_fwd,
                [GOP_UNSQUEEZE] = gk_copy_fwd,
                [GOP_GATHER] = gk_gather_fwd,
                [GOP_REDUCE_SUM] = gk_reduce_fwd,
                [GOP_REDUCE_MEAN] = gk_reduce_fwd,
                [GOP_IDENTITY] = gk_copy_fwd,
        },
        .bwd = {
                [GOP_GEMM] = gk_gemm_bwd,
                [GOP_MATMUL] = gk_matmul_bwd,
                [GOP_ADD] = gk_binary_bwd,
                [GOP_SUB] = gk_binary_bwd,
                [GOP_MUL] = gk_binary_bwd,
                [GOP_DIV] = gk_binary_bwd,
                [GOP_RELU] = gk_unary_bwd,
                [GOP_LEAKY_RELU] = gk_unary_bwd,
                [GOP_SIGMOID] = gk_unary_bwd,
                [GOP_TANH] = gk_unary_bwd,
                [GOP_SOFTMAX] = gk_softmax_bwd,
                [GOP_LOG_SOFTMAX] = gk_softmax_bwd,
                [GOP_CONV] = gk_conv_bwd,
                [GOP_MAXPOOL] = gk_pool_bwd,
                [GOP_AVGPOOL] = gk_pool_bwd,
                [GOP_GLOBAL_AVGPOOL] = gk_gap_bwd,
                [GOP_BATCHNORM] = gk_batchnorm_bwd,
                [GOP_DROPOUT] = gk_dropout_bwd,
                [GOP_LAYERNORM] = gk_layernorm_bwd,
                [GOP_PAD] = gk_pad_bwd,
                [GOP_FLATTEN] = gk_copy_bwd,
                [GOP_RESHAPE] = gk_copy_bwd,
                [GOP_TRANSPOSE] = gk_transpose_bwd,
                [GOP_CONCAT] = gk_concat_bwd,
                [GOP_SQUEEZE] = gk_copy_bwd,
                [GOP_UNSQUEEZE] = gk_copy_bwd,
                [GOP_GATHER] = gk_gather_bwd,
                [GOP_REDUCE_SUM] = gk_reduce_bwd,
                [GOP_REDUCE_MEAN] = gk_reduce_bwd,
                [GOP_IDENTITY] = gk_copy_bwd,
        },
};

const char *graph_op_name(enum graph_op op)
{
        return (unsigned)op < GOP__COUNT ? graph_ops[op].name : "?";
}

int graph_op_by_name(const char *name)
{
        for (int i = 0; i < GOP__COUNT; i++)
                if (strcmp(graph_ops[i].name, name) == 0)
                        return i;
        return -ENOENT;
}
