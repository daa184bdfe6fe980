/* The ONNX loader: a model file (a ModelProto, opsets 13 to 17 of the default domain) into a finalized
 * graph (graph.h). The schema is Debian's onnx.proto, compiled by protoc-c at build time.
 *
 * What it makes of a file: graph inputs that are not initializers are GT_INPUT tensors (dim 0 is the
 * batch when it is symbolic, 0 or absent; every other dim must be a static value); float initializers
 * that a node reads as data are GT_PARAM tensors, in the initializers' order; int64, int32 (converted)
 * and bool initializers and Constant nodes are constants. The shape arithmetic exporters emit around
 * Reshape and Flatten (Shape, Gather, Unsqueeze, Squeeze, Concat, Slice, Cast, Identity, Reshape and
 * int64 Add/Sub/Mul/Div over constants) is folded when the file loads; the batch size it reads
 * (Shape(x)[0]) may only end up as the first entry of a Reshape's target. The constant inputs that
 * ONNX made inputs since opset 13 (Reshape's shape, Pad's pads and value, the axes of Squeeze,
 * Unsqueeze and ReduceSum, Dropout's ratio and training_mode) become attributes, as graph.h says.
 * Every other node must be an op of graph_op_by_name's set. The graph's first output is its loss
 * (graph.loss: what a model's head reads); a graph without outputs is refused.
 *
 * Thread-safe: no state outside the call. */
#pragma once
#include <stddef.h>

#include "graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads the ONNX file at path. Returns 0 and the finalized graph in *ret (the caller frees it with
 * graph_free), or -errno with one line in err that names the file and, for a problem in the graph, the
 * node (its name, or its index in the file when unnamed), its op and why:
 *   -ENOENT etc.  the file does not open or read
 *   -EBADMSG      not an ONNX model (the bytes do not parse, or there is no graph)
 *   -ENOTSUP      an opset, op, attribute, type or construct the graph engine does not take
 *   -EINVAL       a malformed graph (unknown input, cycle, bad shapes, bad attribute values)
 *   -ENOMEM       out of memory */
int onnx_load_file(const char *path, struct graph **ret, char *err, size_t errlen);

/* The same over len bytes in memory; origin names them in errors (a path, or "<memory>"). */
int onnx_load_buf(const void *buf, size_t len, const char *origin, struct graph **ret, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
