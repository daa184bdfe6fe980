/* A feed-forward model built from a model_spec, running on a backend: forward, backward, evaluate.
 *
 * All parameters live in ONE contiguous float block, all gradients in another with the same layout;
 * variables are views (offset, rows, cols) into them, in layer order, kernel before bias, so the
 * variables of one layer are also one contiguous range. Names: "dense<i>/kernel" (in, units),
 * "dense<i>/bias" (units), "conv<i>/kernel" (filters, C*k*k), "conv<i>/bias" (filters), i counting
 * layers of that type from 0. The loss over the last layer's outputs is spec->head's: softmax
 * cross-entropy (C >= 2 classes, integer labels), logistic (one output, sigmoid cross-entropy, labels 0
 * or 1) or mse (one output, the mean over the batch of (prediction - label)^2, as TensorFlow's
 * tf.losses.mean_squared_error: the gradient is 2 (z - y) / B). With embeddings the input is the flat
 * model_spec_dense_input(spec) floats the sparse front (ctr.h) makes.
 *
 * Host and device: model_params()/model_grads() return host blocks. On a host-memory backend (CPU)
 * they are the live buffers. On a device backend the model uploads a layer's parameters from the host
 * block right after the forward hook for that layer returns, and downloads a layer's gradients into
 * the host block before the backward callback for it (with the block entry points, the same per
 * (var, block) row range); after writing the host parameters outside a hook, call model_params_sync().
 *
 * Not thread-safe: one thread drives a model at a time (the callbacks run on that thread). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "model_spec.h"

struct model;

struct model_var {
        const char *name;  /* owned by the model */
        uint32_t rows, cols; /* a bias is (1, units) */
        size_t offset;     /* floats into the parameter (and gradient) block */
        uint32_t layer;    /* index into spec->layers */
};

/* Called with a layer's variables [first_var, first_var + n_vars). A nonzero return stops the pass,
 * which returns that value. */
typedef int (*model_layer_cb)(void *ud, uint32_t first_var, uint32_t n_vars);

/* Builds the model and allocates everything for batches up to max_batch (forward and backward never
 * allocate). Parameters start at zero: call model_init_params or load them. -EINVAL for a spec that
 * doesn't make sense (with no detail: config validation owns the messages), -EOPNOTSUPP for a head
 * whose ops the backend lacks (the CUDA backend has softmax only), -ENOMEM. */
int model_new(const struct model_spec *spec, struct backend *be, uint32_t max_batch, struct model **ret);
/* Which engine runs a layer list. AUTO: on a host-memory backend the graph engine (graph.h), the list
 * compiled by graph_from_spec, the same variables, initial values and arithmetic; on a device backend
 * the layer code of model_pass.c. LAYERS: the layer code everywhere (the reference the graph is held to in
 * tests and benchmarks). A graph model (model.onnx) always runs on the graph engine. */
enum model_engine { MODEL_ENGINE_AUTO, MODEL_ENGINE_LAYERS };
int model_new_engine(const struct model_spec *spec, struct backend *be, uint32_t max_batch, enum model_engine engine,
                     struct model **ret);
bool model_runs_graph(const struct model *m); /* the graph engine runs its passes */
struct model *model_free(struct model *m); /* NULL-safe; returns NULL */

uint32_t model_n_vars(const struct model *m);
const struct model_var *model_var(const struct model *m, uint32_t i); /* i < model_n_vars */
int model_find_var(const struct model *m, const char *name);          /* index, or -ENOENT */
size_t model_n_params(const struct model *m);                         /* floats in each block */
uint32_t model_max_batch(const struct model *m);
uint32_t model_input_size(const struct model *m);                     /* C*H*W, or the widened flat input */
uint32_t model_n_classes(const struct model *m);                      /* outputs: 1 for logistic and mse */

float *model_params(struct model *m); /* (n_params) host block */
float *model_grads(struct model *m);  /* (n_params) host block, written by model_backward */
int model_params_sync(struct model *m); /* host params -> device; no-op on host-memory backends */
/* Moves the host parameter and gradient blocks into memory of the caller's (n_params floats each,
 * 64-byte aligned, not overlapping; a shared-memory segment, say), contents kept: from then on
 * model_params()/model_grads() return them and, on a host-memory backend, the passes compute in
 * them. The caller keeps that memory valid until model_free(), which leaves it alone. Once per
 * model; -EINVAL otherwise or for misaligned or overlapping blocks. */
int model_use_host_blocks(struct model *m, float *params, float *grads);

/* Beyond this a weight has blown up: the product of two such overflows float, so the passes can no
 * longer be trusted (sqrt(FLT_MAX) is 1.8e19; trained weights are many orders of magnitude below). */
#define MODEL_WEIGHT_LIMIT 1.8e19f

/* Whether the host parameter block holds a model that can still compute: every value finite and
 * within MODEL_WEIGHT_LIMIT. 0, or -ERANGE with why (len bytes) naming the first variable that does
 * not and its value ("dense0/kernel holds 1e+30"). Reads n_params floats. */
int model_params_check(struct model *m, char *why, size_t len);

/* Glorot uniform / He normal (truncated at 2 sigma, as TF/Keras) per the spec's initializer kinds,
 * each variable drawn from an rng seeded by (seed, variable index); biases zero. Deterministic. */
int model_init_params(struct model *m, uint64_t seed);

/* Forward pass over B <= max_batch examples; keeps what backward needs. *loss_ret: the head's mean
 * loss; *correct_ret (nullable): examples whose argmax matches the label (logistic: whose p > 0.5 is
 * the label's y > 0.5; mse: 0). -EINVAL if B is 0 or > max_batch or a label the head cannot take
 * (softmax: >= the number of classes; logistic: outside [0, 1]). */
int model_forward(struct model *m, const float *x /* (B, C*H*W) */, const uint8_t *labels /* (B) */,
                  uint32_t B, float *loss_ret, uint32_t *correct_ret);
/* As model_forward; before_layer (nullable) is called before a layer with parameters reads them. */
int model_forward_hooked(struct model *m, const float *x, const uint8_t *labels, uint32_t B,
                         float *loss_ret, uint32_t *correct_ret, model_layer_cb before_layer, void *ud);
/* As model_forward with float labels, as record files have them: softmax takes only whole class
 * indices, logistic values in [0, 1], mse any finite value (-EINVAL otherwise). */
int model_forward_f(struct model *m, const float *x, const float *y /* (B) */, uint32_t B, float *loss_ret,
                    uint32_t *correct_ret);

/* The last forward's outputs, host, (B, n_classes): softmax probabilities, the logistic head's sigmoid
 * probabilities, or the mse head's predictions (for AUC, log loss, RMSE). Owned by the model, valid
 * until the next forward; NULL without a forward (model_evaluate leaves none) or when a device's
 * download fails. */
const float *model_outputs(struct model *m);

/* Whether backward also computes the gradient of the mean loss by the input x (off at first; -ENOMEM).
 * Layers before the first one with parameters are then run backward too. */
int model_set_input_grad(struct model *m, bool on);
/* That gradient, host, (B, input_size), of the last backward; owned by the model, valid until the next
 * forward or backward; NULL when not computed. */
const float *model_input_grad(const struct model *m);

/* Gradients of the mean loss of the last forward into the gradient block (overwritten). cb
 * (nullable) is called as soon as each layer's parameter gradients are final, last layer first.
 * -EINVAL without a preceding forward. */
int model_backward(struct model *m, model_layer_cb cb, void *ud);

/* Row blocks: a variable split into blocks of whole rows, so a worker can pipeline its transfer with
 * compute (wait for block b while blocks < b are multiplied; push block b while b+1 is computed).
 *
 * Splits `var` into n_blocks blocks, block b being rows [row_begin[b], row_begin[b + 1]) and the last
 * ending at the variable's rows; row_begin has n_blocks entries, starts at 0 and strictly increases
 * (copied). n_blocks == 1 (row_begin NULL or {0}) removes blocking. Only dense kernels can be split:
 * -EOPNOTSUPP for any other variable; -EINVAL for a bad index or spec, -ENOMEM.
 *
 * Blocking applies to every pass, hooked or not, and the arithmetic depends only on the boundaries:
 * two models with the same blocks compute bit-identical results whichever entry points they use. It
 * changes float summation order against the unblocked model (forward sums per-block products). */
int model_set_var_blocks(struct model *m, uint32_t var, uint32_t n_blocks, const uint32_t *row_begin);
/* Number of blocks of var (1 when unblocked); *row_begin_ret (nullable) gets its n_blocks + 1
 * boundaries, the last being rows (owned by the model, valid until the next model_set_var_blocks). */
uint32_t model_var_blocks(const struct model *m, uint32_t var, const uint32_t **row_begin_ret);

/* Called for one block of one variable (an unblocked variable is one block 0). A nonzero return
 * stops the pass, which returns that value. */
typedef int (*model_block_cb)(void *ud, uint32_t var, uint32_t block);

/* As model_forward_hooked, but before (nullable) is called right before each block of each variable
 * is first read, and exactly once per (var, block), a variable's blocks in order. The layer code:
 * dense kernel blocks in order, each just before its gemm (on a device backend, the block is uploaded
 * when before returns, so earlier blocks' gemms are already queued), then the bias just before it is
 * added; conv2d: kernel, then bias, then the layer. The graph engine (model_runs_graph): each variable
 * before the first node that reads it, in the node's input order, so a dense bias (the Gemm's C) before
 * its kernel's blocks. */
int model_forward_blocks(struct model *m, const float *x, const uint8_t *labels, uint32_t B,
                         float *loss_ret, uint32_t *correct_ret, model_block_cb before, void *ud);
/* The same with float labels (model_forward_f). */
int model_forward_f_blocks(struct model *m, const float *x, const float *y, uint32_t B, float *loss_ret,
                           uint32_t *correct_ret, model_block_cb before, void *ud);
/* As model_backward, but after (nullable) is called as soon as each (var, block)'s gradient is final
 * (downloaded to the host block first on a device backend), exactly once each, a variable's blocks in
 * order. Layers last to first; in the layer code, inside a layer the bias FIRST, then the kernel blocks
 * in order (dense: the input gradient first, then each block right after its gemm, before the next
 * block's gemm); on the graph engine a dense bias after its kernel's blocks. When after() runs for a
 * variable's block, the pass reads that variable's parameters no more: the callback may overwrite
 * them (with fresh values from a ps, say) and the rest of the pass is unchanged. */
int model_backward_blocks(struct model *m, model_block_cb after, void *ud);

/* Whether the passes train (the default) or infer: a graph model's Dropout drops and its
 * BatchNormalization normalizes by the batch only when training (model_evaluate infers whatever this
 * says). Layer-list models compute the same either way. */
void model_set_training(struct model *m, bool training);
/* A graph model's Dropout seed: training forward k draws its masks from (seed, k), the same seed the
 * same masks. model.seed at first; a worker makes its own from training.seed and its index. */
void model_set_seed(struct model *m, uint64_t seed);

/* Mean loss and accuracy over n examples, in max_batch chunks (clobbers the forward state). Labels as
 * model_forward's, for any head. */
int model_evaluate(struct model *m, const float *x, const uint8_t *y, uint32_t n, float *loss_ret,
                   float *accuracy_ret);

/* One line per layer: type, output shape, variables and parameter count; then the total. */
void model_describe(const struct model *m, FILE *f);
