/* A worker's steps on a model with embeddings (docs/sparse.md, "Sparse pull and push"): the batch read
 * from the worker's shard of the record files, the rows it uses fetched from the ps shards in the same
 * round trip that pushes the previous step's row gradients, the pooled input for the dense layers,
 * and after backward the rows' gradients kept for the next exchange. The dense variables travel as in
 * any job (push.h). One thread: the worker's compute thread. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "config.h"
#include "model.h"
#include "ps_client.h"

/* Worker index of W: its shard of data.train_files, read in epochs, as a batch source (batch.h):
 *   next           the next batch and its rows: the previous step's row gradients pushed and this
 *                  batch's rows pulled, one exchange per table. 0; -EBADMSG (a bad record: err says
 *                  FILE:LINE); or another -errno from the ps shards (then the previous step's row
 *                  gradients are dropped: async training loses that step's sparse update, as a refused
 *                  push loses a dense one);
 *   forward        the batch's rows pooled into the dense layers' input, forward on replica 0;
 *   backward_done  the rows' gradients (from the model's input gradient) kept for the next exchange;
 *   flush          the row gradients still kept pushed (the end of training);
 *   skip           moves on by this many records of the shard (a resumed job).
 * The model must compute its input gradient (model_set_input_grad). 0, or -errno with err naming the
 * file (-EBADMSG: the data are at fault). */
int sparse_step_new(const struct job_config *cfg, uint32_t index, uint32_t W, struct ps_client *pc,
                    struct batch_source **ret, char *err, size_t errlen);
