/* The job file's layer list (model_spec.h) as a graph (graph.h): the same model that model.c builds,
 * with the same variables in the same order and layout, so that the one graph engine can run the
 * layer lists too. dense i: Gemm over "dense<i>/kernel" (in, units) and "dense<i>/bias" (1, units),
 * after a Flatten when its input is an image; conv2d i: Conv with "same" padding, the extra row and
 * column after (TensorFlow's), over "conv<i>/kernel" (filters, C, k, k) — model.c's (filters, C*k*k),
 * the same floats — and "conv<i>/bias" (filters); maxpool2d: MaxPool, window = stride, partial windows
 * dropped; relu, tanh, sigmoid, flatten: their ops. The input is "input", (batch, N) for a flat input
 * and (batch, C, H, W) for an image; the output "logits" is the last layer's, before the head (the graph's
 * loss output). With embedding tables the input is flat, (batch, model_spec_dense_input): the dense
 * features followed by the tables' pooled rows, as model.c reads it; it is marked want_grad, since the
 * sparse front turns its gradient into the rows' (the lookups themselves are not in the graph).
 * Parameters start at zero (copy model.c's, or initialize them). */
#pragma once
#include <stddef.h>

#include "graph.h"
#include "model_spec.h"

/* Returns 0 and a finalized graph in *ret (graph_free), or -EINVAL / -ENOMEM with one line in err. */
int graph_from_spec(const struct model_spec *spec, struct graph **ret, char *err, size_t errlen);
