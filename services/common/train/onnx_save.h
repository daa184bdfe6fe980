/* A graph (graph.h) with its parameters' values written as an ONNX model for serving (opset 17, the
 * default domain): the graph switched to inference (Dropout as Identity, BatchNormalization with its
 * running statistics and one output), every parameter and constant an initializer, the graph's inputs
 * with the batch as the symbolic dim "batch", and as outputs the graph's loss output (the logits) and
 * the head's output on it: "probabilities" (Softmax over the last axis; softmax head), "probability"
 * (Sigmoid; logistic head) or "prediction" (the value; mse head). The constant inputs that the loader
 * moved into attributes (Reshape's shape, Pad's pads and value, the axes of Squeeze, Unsqueeze and
 * ReduceSum) go back to being initializers. onnx_load_file reads such a file back into the same graph
 * (less the Dropouts). Not thread-safe. */
#pragma once
#include <stddef.h>

#include "model_spec.h"

struct graph;

/* The ONNX model's bytes for graph g with parameter block params (g->n_params floats): a malloc'd buffer
 * in *ret (the caller frees it) of *len_ret bytes. doc (nullable) is the model's doc_string. 0, or
 * -EINVAL with why in err (a graph this writer cannot express), -ENOMEM. */
int onnx_save_buf(const struct graph *g, const float *params, enum model_head head, const char *doc, void **ret,
                  size_t *len_ret, char *err, size_t errlen);
