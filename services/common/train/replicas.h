/* Data-parallel replicas: the model a worker trains, as one model or one model per local GPU, behind
 * the same forward/backward-blocks calls (model.h), so that the step loop reads the same for both.
 *
 * With one backend it is that backend's model: each call below is the model's own (model_forward_blocks,
 * model_backward_blocks, model_params_sync) with the caller's callbacks, on the caller's thread, and
 * no thread is started.
 *
 * With n backends it runs one model per backend. A batch of B examples is split into n contiguous
 * shards (sizes differ by at most one); every replica runs forward and backward on its shard in its
 * own thread, replica 0 on the caller's thread; the gradients are combined into replica 0's host
 * gradient block as the gradient of the mean loss over the whole batch, sum_i (B_i / B) g_i, so the
 * caller sees one model with one set of gradients and pushes once per step. Parameters flow the other
 * way: the caller writes replica 0's host parameter block (in its before callback, as with one model),
 * and every other replica copies each block from there before it reads it.
 *
 * Callbacks run on the caller's thread, in the order model_forward_blocks / model_backward_blocks
 * give, once per (var, block): before is called before any replica reads that block; after is
 * called when every replica's gradient of that block is final and summed. The sum is on the host
 * (each replica downloads its gradients, as a single model does); see docs/gpu.md. One thread drives
 * a replicas object at a time. */
#pragma once
#include <stdint.h>

#include "backend.h"
#include "model.h"

struct replicas;

/* Builds n models (device_model_new on each backend, max_batch split as the batches will be) and
 * their n - 1 threads. The backends are borrowed: free them after replicas_free. Returns 0 or -errno
 * with one line in msg. */
int replicas_new(struct backend *const *bes, uint32_t n, const struct model_spec *spec, uint32_t max_batch,
                 struct replicas **ret, char *msg, size_t msglen);
struct replicas *replicas_free(struct replicas *r); /* NULL-safe; returns NULL */
uint32_t replicas_count(const struct replicas *r);
/* Replica 0: variables, sizes, and the host parameter and gradient blocks the caller reads and writes. */
struct model *replicas_model(struct replicas *r);
/* model_set_var_blocks on every replica. */
int replicas_set_var_blocks(struct replicas *r, uint32_t var, uint32_t n_blocks, const uint32_t *row_begin);
/* Every other replica computes in the row blocks replica 0 was given (model_set_var_blocks on it).
 * 0, or -errno from model_set_var_blocks. */
int replicas_follow_blocks(struct replicas *r);
/* As model_forward_blocks over the whole batch: *loss_ret the mean over B, *correct_ret the sum. */
int replicas_forward_blocks(struct replicas *r, const float *x, const uint8_t *labels, uint32_t B, float *loss_ret,
                            uint32_t *correct_ret, model_block_cb before, void *ud);
/* As model_backward_blocks: replica 0's gradient block gets the whole batch's gradient. */
int replicas_backward_blocks(struct replicas *r, model_block_cb after, void *ud);
/* Replica 0's host parameters to every replica's device. */
int replicas_params_sync(struct replicas *r);
