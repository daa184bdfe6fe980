/* A job file's layer list (model.layers) as a graph (graph.h): the same model the layer-list engine
 * (model.c) computes, with its variables under their names ("dense0/kernel", "conv1/bias", ...), in its
 * order and with its layout, so that a checkpoint's parameter block is the graph's as it is. For what
 * only a graph can do with a layer list: export it (onnx_save.h), and run it on the graph engine.
 *
 * The graph's one input is "input": (batch, C, H, W) for an image (C*H > 1), (batch, N) for a flat input
 * of N features; its loss output is "logits", the last layer's outputs (what the head reads: the softmax's
 * logits, the logistic head's one logit, the mse head's prediction). conv2d is Conv with TF's "same"
 * padding (an even kernel's extra row and column after), maxpool2d MaxPool with window = stride, dense
 * Gemm (a Flatten before it where the tensor is an image), the activations their ONNX ops. */
#pragma once
#include <stddef.h>

#include "model_spec.h"

struct graph;

/* The graph of spec's layer list, finalized, the parameters zero. -ENOTSUP with why for a model the
 * compiler does not take (a graph model, which is one already; embedding tables, whose rows live on the
 * ps), -EINVAL for a spec that does not make sense, -ENOMEM. */
int graph_from_layers(const struct model_spec *spec, struct graph **ret, char *err, size_t errlen);
