/* A worker's steps on a model with embeddings (docs/sparse.md, "Sparse pull and push"): the batch read
 * from the worker's shard of the record files, the rows it uses fetched from the ps shards in the same
 * round trip that pushes the previous step's row gradients, the pooled input for the dense layers,
 * and after backward the rows' gradients kept for the next exchange. The dense variables travel as in
 * any job (push.h). One thread: the worker's compute thread. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "model.h"
#include "ps_client.h"

struct sparse_step;

/* Worker index of W: its shard of data.train_files, read in epochs. 0, or -errno with err naming the
 * file (-EBADMSG: the data are at fault). */
int sparse_step_new(const struct job_config *cfg, uint32_t index, uint32_t W, struct ps_client *pc,
                    struct sparse_step **ret, char *err, size_t errlen);
struct sparse_step *sparse_step_free(struct sparse_step *s); /* NULL-safe; returns NULL */

/* Moves on by this many records of the shard (a resumed job). 0 or -errno with err. */
int sparse_step_skip(struct sparse_step *s, uint64_t records, char *err, size_t errlen);

/* The next batch and its rows: the previous step's row gradients pushed and this batch's rows pulled,
 * one exchange per table. 0; -EBADMSG (a bad record: err says FILE:LINE); or another -errno from the
 * ps shards (then the previous step's row gradients are dropped: async training loses that step's
 * sparse update, as a refused push loses a dense one). */
int sparse_step_fetch(struct sparse_step *s, char *err, size_t errlen);

/* Forward on the batch fetched (before, ud: model_forward_blocks'). */
int sparse_step_forward(struct sparse_step *s, struct model *m, float *loss, model_block_cb before, void *ud);

/* After backward: the rows' gradients (from the model's input gradient) kept for the next fetch. */
void sparse_step_backward_done(struct sparse_step *s, struct model *m);

/* Pushes the row gradients still kept (the end of training). 0 or -errno with err. */
int sparse_step_flush(struct sparse_step *s, char *err, size_t errlen);

uint64_t sparse_step_bad_lines(const struct sparse_step *s); /* skipped under data.bad_lines: skip */
