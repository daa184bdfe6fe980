/* Where a worker's batches come from, behind one set of hooks, so that the step loop reads the same
 * for every job: a dense job's shard of the dataset (dense_step.h), or the record files and rows from
 * the ps shards of a model with embeddings (sparse_step.h). The step (workerd.c) calls, in order:
 * batch_next, batch_forward, the replicas' backward, batch_backward_done; batch_flush at the end of
 * training. One thread: the worker's compute thread. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "replicas.h"

struct batch_source;

struct batch_ops {
        int (*next)(struct batch_source *bs, char *err, size_t errlen);
        int (*forward)(struct batch_source *bs, struct replicas *rep, float *loss, model_block_cb before, void *ud);
        void (*backward_done)(struct batch_source *bs, struct model *m);
        int (*flush)(struct batch_source *bs, char *err, size_t errlen);
        int (*skip)(struct batch_source *bs, uint64_t examples, char *err, size_t errlen);
        uint32_t (*examples)(const struct batch_source *bs);
        uint64_t (*epoch)(const struct batch_source *bs);
        void (*free)(struct batch_source *bs);
};

/* The first member of each source's own struct. */
struct batch_source {
        const struct batch_ops *ops;
};

/* The next batch. 0; -EBADMSG: bad data (err says where), training cannot go on; another -errno from
 * the ps shards (a shard lost or restarted, err says which): re-read the parameters and carry on. */
static inline int batch_next(struct batch_source *bs, char *err, size_t errlen) {
        return bs->ops->next(bs, err, errlen);
}

/* Forward on the batch over rep (before, ud: model_forward_blocks'): *loss the batch's mean. */
static inline int batch_forward(struct batch_source *bs, struct replicas *rep, float *loss, model_block_cb before,
                                void *ud) {
        return bs->ops->forward(bs, rep, loss, before, ud);
}

/* Backward has run on the batch (m: replica 0, its gradients final): what the source keeps of them
 * for its next exchange (the rows' gradients of a model with embeddings). NULL in ops: nothing. */
static inline void batch_backward_done(struct batch_source *bs, struct model *m) {
        if (bs->ops->backward_done)
                bs->ops->backward_done(bs, m);
}

/* The end of training: pushes what the source still keeps (NULL in ops: nothing). 0 or -errno with err. */
static inline int batch_flush(struct batch_source *bs, char *err, size_t errlen) {
        return bs->ops->flush ? bs->ops->flush(bs, err, errlen) : 0;
}

/* A resumed job: moves on by this many examples, as if batches had read them. 0 or -errno with err. */
static inline int batch_skip(struct batch_source *bs, uint64_t examples, char *err, size_t errlen) {
        return bs->ops->skip(bs, examples, err, errlen);
}

/* For the log: examples in this worker's shard, and the epoch; 0 from a source that does not count
 * them ahead (record files: examples and epoch NULL). */
static inline uint32_t batch_examples(const struct batch_source *bs) {
        return bs->ops->examples ? bs->ops->examples(bs) : 0;
}
static inline uint64_t batch_epoch(const struct batch_source *bs) {
        return bs->ops->epoch ? bs->ops->epoch(bs) : 0;
}

/* NULL-safe; returns NULL. */
static inline struct batch_source *batch_free(struct batch_source *bs) {
        if (bs)
                bs->ops->free(bs);
        return NULL;
}
