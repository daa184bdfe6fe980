/* A dense job's batches (data.format idx): worker k of W reads its shard of the dataset (data.h),
 * batch_size examples a step, into buffers the model reads in place. Nothing is pushed besides the
 * dense variables (push.h), so it has no backward_done and no flush. */
#pragma once
#include <stdint.h>

#include "batch.h"
#include "data.h"

/* d is borrowed and must outlive the source. 0, -EINVAL (shard k of W would be empty: data_iter_new),
 * or -ENOMEM. */
int dense_step_new(const struct dataset *d, uint32_t k, uint32_t W, uint64_t seed, uint32_t batch_size,
                   struct batch_source **ret);
