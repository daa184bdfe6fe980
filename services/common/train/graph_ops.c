/* The op table: for each op of the set, its ONNX name, how many inputs and outputs it takes (after the
 * loader moved constant inputs into attributes: graph.h), its shape function and kernels. */
#include "graph-internal.h"

#include <errno.h>
#include <string.h>

#define OP(n, i0, i1, o0, o1, sh, f, b, st, sc) { n, i0, i1, o0, o1, sh, f, b, st, sc }

gk_sgemm_fn gk_sgemm; /* set by graph_exec_new */

const bool graph_op_bwd_sets[GOP__COUNT] = {
        [GOP_GEMM] = true, [GOP_RELU] = true, [GOP_LEAKY_RELU] = true, [GOP_SIGMOID] = true, [GOP_TANH] = true,
        [GOP_BATCHNORM] = true, [GOP_CONV] = true,
};

const struct graph_op_info graph_ops[GOP__COUNT] = {
        [GOP_GEMM] = OP("Gemm", 2, 3, 1, 1, gs_gemm, gk_gemm_fwd, gk_gemm_bwd, NULL, NULL),
        [GOP_MATMUL] = OP("MatMul", 2, 2, 1, 1, gs_matmul, gk_matmul_fwd, gk_matmul_bwd, NULL, NULL),
        [GOP_ADD] = OP("Add", 2, 2, 1, 1, gs_binary, gk_binary_fwd, gk_binary_bwd, NULL, NULL),
        [GOP_SUB] = OP("Sub", 2, 2, 1, 1, gs_binary, gk_binary_fwd, gk_binary_bwd, NULL, NULL),
        [GOP_MUL] = OP("Mul", 2, 2, 1, 1, gs_binary, gk_binary_fwd, gk_binary_bwd, NULL, NULL),
        [GOP_DIV] = OP("Div", 2, 2, 1, 1, gs_binary, gk_binary_fwd, gk_binary_bwd, NULL, NULL),
        [GOP_RELU] = OP("Relu", 1, 1, 1, 1, gs_same, gk_unary_fwd, gk_unary_bwd, NULL, NULL),
        [GOP_LEAKY_RELU] = OP("LeakyRelu", 1, 1, 1, 1, gs_same, gk_unary_fwd, gk_unary_bwd, NULL, NULL),
        [GOP_SIGMOID] = OP("Sigmoid", 1, 1, 1, 1, gs_same, gk_unary_fwd, gk_unary_bwd, NULL, NULL),
        [GOP_TANH] = OP("Tanh", 1, 1, 1, 1, gs_same, gk_unary_fwd, gk_unary_bwd, NULL, NULL),
        [GOP_SOFTMAX] = OP("Softmax", 1, 1, 1, 1, gs_same, gk_softmax_fwd, gk_softmax_bwd, NULL, NULL),
        [GOP_LOG_SOFTMAX] = OP("LogSoftmax", 1, 1, 1, 1, gs_same, gk_softmax_fwd, gk_softmax_bwd, NULL, NULL),
        [GOP_CONV] = OP("Conv", 2, 3, 1, 1, gs_conv, gk_conv_fwd, gk_conv_bwd, NULL, gk_conv_scratch),
        [GOP_MAXPOOL] = OP("MaxPool", 1, 1, 1, 1, gs_pool, gk_pool_fwd, gk_pool_bwd, NULL, NULL),
        [GOP_AVGPOOL] = OP("AveragePool", 1, 1, 1, 1, gs_pool, gk_pool_fwd, gk_pool_bwd, NULL, NULL),
        [GOP_GLOBAL_AVGPOOL] = OP("GlobalAveragePool", 1, 1, 1, 1, gs_gap, gk_gap_fwd, gk_gap_bwd, NULL, NULL),
        [GOP_BATCHNORM] = OP("BatchNormalization", 5, 5, 1, 3, gs_batchnorm, gk_batchnorm_fwd, gk_batchnorm_bwd,
                             gk_batchnorm_state, NULL),
        [GOP_DROPOUT] = OP("Dropout", 1, 1, 1, 1, gs_same, gk_dropout_fwd, gk_dropout_bwd, gk_dropout_state, NULL),
        [GOP_LAYERNORM] = OP("LayerNormalization", 2, 3, 1, 1, gs_layernorm, gk_layernorm_fwd, gk_layernorm_bwd,
                             gk_layernorm_state, NULL),
        [GOP_PAD] = OP("Pad", 1, 1, 1, 1, gs_pad, gk_pad_fwd, gk_pad_bwd, NULL, NULL),
        [GOP_FLATTEN] = OP("Flatten", 1, 1, 1, 1, gs_flatten, gk_copy_fwd, gk_copy_bwd, NULL, NULL),
        [GOP_RESHAPE] = OP("Reshape", 1, 1, 1, 1, gs_reshape, gk_copy_fwd, gk_copy_bwd, NULL, NULL),
        [GOP_TRANSPOSE] = OP("Transpose", 1, 1, 1, 1, gs_transpose, gk_transpose_fwd, gk_transpose_bwd, NULL, NULL),
        [GOP_CONCAT] = OP("Concat", 1, GRAPH_MAX_IN, 1, 1, gs_concat, gk_concat_fwd, gk_concat_bwd, NULL, NULL),
        [GOP_SQUEEZE] = OP("Squeeze", 1, 1, 1, 1, gs_squeeze, gk_copy_fwd, gk_copy_bwd, NULL, NULL),
        [GOP_UNSQUEEZE] = OP("Unsqueeze", 1, 1, 1, 1, gs_unsqueeze, gk_copy_fwd, gk_copy_bwd, NULL, NULL),
        [GOP_GATHER] = OP("Gather", 2, 2, 1, 1, gs_gather, gk_gather_fwd, gk_gather_bwd, NULL, NULL),
        [GOP_REDUCE_SUM] = OP("ReduceSum", 1, 1, 1, 1, gs_reduce, gk_reduce_fwd, gk_reduce_bwd, NULL, NULL),
        [GOP_REDUCE_MEAN] = OP("ReduceMean", 1, 1, 1, 1, gs_reduce, gk_reduce_fwd, gk_reduce_bwd, NULL, NULL),
        [GOP_IDENTITY] = OP("Identity", 1, 1, 1, 1, gs_same, gk_copy_fwd, gk_copy_bwd, NULL, NULL),
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
