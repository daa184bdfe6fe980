/* A dense job's batches: see dense_step.h. */
#include "dense_step.h"

#include <errno.h>
#include <stdlib.h>

struct dense_step {
        struct batch_source src;
        struct data_iter *it;
        uint32_t B;
        float *x;                 /* (B, D) */
        uint8_t *y;               /* (B) */
};

static struct dense_step *of(struct batch_source *bs) {
        return (struct dense_step *)bs;
}

static void dense_free(struct batch_source *bs) {
        struct dense_step *s = of(bs);
        data_iter_free(s->it);
        free(s->x);
        free(s->y);
        free(s);
}

static int dense_next(struct batch_source *bs, char *err, size_t errlen) {
        struct dense_step *s = of(bs);
        (void)err, (void)errlen;
        data_iter_next_batch(s->it, s->B, s->x, s->y);
        return 0;
}

static int dense_forward(struct batch_source *bs, struct replicas *rep, float *loss, model_block_cb before, void *ud) {
        struct dense_step *s = of(bs);
        return replicas_forward_blocks(rep, s->x, s->y, s->B, loss, NULL, before, ud);
}

static int dense_skip(struct batch_source *bs, uint64_t examples, char *err, size_t errlen) {
        (void)err, (void)errlen;
        data_iter_skip(of(bs)->it, examples);
        return 0;
}

static uint32_t dense_examples(const struct batch_source *bs) {
        return data_iter_size(((const struct dense_step *)bs)->it);
}

static uint64_t dense_epoch(const struct batch_source *bs) {
        return data_iter_epoch(((const struct dense_step *)bs)->it);
}

static const struct batch_ops dense_ops = {
        .next = dense_next,
        .forward = dense_forward,
        /* no backward_done, no flush: only the dense variables are pushed, by the pusher */
        .skip = dense_skip,
        .examples = dense_examples,
        .epoch = dense_epoch,
        .free = dense_free,
};

int dense_step_new(const struct dataset *d, uint32_t k, uint32_t W, uint64_t seed, uint32_t batch_size,
                   struct batch_source **ret) {
        struct dense_step *s = calloc(1, sizeof(*s));
        int r;
        if (!s)
                return -ENOMEM;
        s->src.ops = &dense_ops;
        s->B = batch_size;
        if ((r = data_iter_new(d, k, W, seed, &s->it)) < 0)
                goto fail;
        s->x = malloc((size_t)batch_size * d->dim * sizeof(float));
        s->y = malloc(batch_size);
        if (!s->x || !s->y) {
                r = -ENOMEM;
                goto fail;
        }
        *ret = &s->src;
        return 0;
fail:
        dense_free(&s->src);
        return r;
}
