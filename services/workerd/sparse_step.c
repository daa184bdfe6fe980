/* A worker's steps with embeddings: see sparse_step.h. */
#include "sparse_step.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctr.h"
#include "ctr_train.h"
#include "records.h"
#include "util.h"

struct sparse_step {
        struct batch_source src;
        const struct job_config *cfg;
        struct ps_client *pc;
        struct records_reader *rd;
        struct ctr_step *cs;
        uint32_t n_tables;
        /* the previous step's row gradients, waiting for the next exchange */
        uint64_t *pend_ids[MODEL_MAX_EMBEDDINGS];
        float *pend_grads[MODEL_MAX_EMBEDDINGS];
        uint32_t n_pend[MODEL_MAX_EMBEDDINGS];
};

static struct sparse_step *of(struct batch_source *bs) {
        return (struct sparse_step *)bs;
}

static void sparse_free(struct batch_source *bs) {
        struct sparse_step *s = of(bs);
        for (uint32_t e = 0; e < s->n_tables; e++) {
                free(s->pend_ids[e]);
                free(s->pend_grads[e]);
        }
        ctr_step_free(s->cs);
        records_close(s->rd);
        free(s);
}

static int sparse_skip(struct batch_source *bs, uint64_t records, char *err, size_t errlen) {
        struct sparse_step *s = of(bs);
        while (records > 0) {
                int r = records_next(s->rd, s->cs->b, err, errlen);
                if (r < 0)
                        return r;
                records -= records < (uint64_t)r ? records : (uint64_t)r;
        }
        return 0;
}

static void drop_pending(struct sparse_step *s) {
        for (uint32_t e = 0; e < s->n_tables; e++)
                s->n_pend[e] = 0;
}

static int sparse_next(struct batch_source *bs, char *err, size_t errlen) {
        struct sparse_step *s = of(bs);
        struct ctr *c = s->cs->c;
        int r = records_next(s->rd, s->cs->b, err, errlen);

        if (r < 0)
                return r;
        if ((r = ctr_gather(c, s->cs->b)) < 0)
                return errf(err, errlen, r, "the records do not fit the model");
        for (uint32_t e = 0; e < s->n_tables; e++) {
                r = ps_client_sparse(s->pc, e, s->pend_ids[e], s->n_pend[e], s->pend_grads[e], ctr_unique(c, e),
                                     ctr_n_unique(c, e), ctr_rows(c, e), err, errlen);
                if (r < 0) {
                        drop_pending(s);
                        return r;
                }
                s->n_pend[e] = 0;
        }
        return 0;
}

static int sparse_forward(struct batch_source *bs, struct replicas *rep, float *loss, model_block_cb before,
                          void *ud) {
        struct sparse_step *s = of(bs);
        return ctr_step_forward(s->cfg, s->cs, replicas_model(rep), loss, NULL, before, ud);
}

static void sparse_backward_done(struct batch_source *bs, struct model *m) {
        struct sparse_step *s = of(bs);
        struct ctr *c = s->cs->c;

        ctr_row_grads(c, s->cs->b, model_input_grad(m));
        for (uint32_t e = 0; e < s->n_tables; e++) {
                uint32_t n = ctr_n_unique(c, e);
                memcpy(s->pend_ids[e], ctr_unique(c, e), n * sizeof(uint64_t));
                memcpy(s->pend_grads[e], ctr_grads(c, e), (size_t)n * s->cfg->model.emb[e].dim * sizeof(float));
                s->n_pend[e] = n;
        }
}

static int sparse_flush(struct batch_source *bs, char *err, size_t errlen) {
        struct sparse_step *s = of(bs);
        for (uint32_t e = 0; e < s->n_tables; e++) {
                if (!s->n_pend[e])
                        continue;
                int r = ps_client_sparse(s->pc, e, s->pend_ids[e], s->n_pend[e], s->pend_grads[e], NULL, 0, NULL, err,
                                         errlen);
                s->n_pend[e] = 0;
                if (r < 0)
                        return r;
        }
        return 0;
}

static const struct batch_ops sparse_ops = {
        .next = sparse_next,
        .forward = sparse_forward,
        .backward_done = sparse_backward_done,
        .flush = sparse_flush,
        .skip = sparse_skip,
        /* no examples, no epoch: the record files are read as they come, with no count ahead */
        .free = sparse_free,
};

int sparse_step_new(const struct job_config *cfg, uint32_t index, uint32_t W, struct ps_client *pc,
                    struct batch_source **ret, char *err, size_t errlen) {
        struct sparse_step *s = calloc(1, sizeof(*s));
        uint32_t B = cfg->training.batch_size;
        size_t max_unique = (size_t)B * cfg->data.max_ids_per_example;
        int r;

        if (!s)
                return errf(err, errlen, -ENOMEM, "out of memory");
        s->src.ops = &sparse_ops;
        s->cfg = cfg;
        s->pc = pc;
        s->n_tables = cfg->model.n_embeddings;
        if ((r = ctr_records_open(cfg, false, index, W, true, &s->rd, err, errlen)) < 0)
                goto fail;
        if ((r = ctr_step_new(cfg, s->rd, B, &s->cs)) < 0) {
                errf(err, errlen, r, "cannot set up the batch: %s", strerror(-r));
                goto fail;
        }
        for (uint32_t e = 0; e < s->n_tables; e++) {
                s->pend_ids[e] = malloc(max_unique * sizeof(uint64_t));
                s->pend_grads[e] = malloc(max_unique * cfg->model.emb[e].dim * sizeof(float));
                if (!s->pend_ids[e] || !s->pend_grads[e]) {
                        r = errf(err, errlen, -ENOMEM, "out of memory");
                        goto fail;
                }
        }
        *ret = &s->src;
        return 0;
fail:
        sparse_free(&s->src);
        return r;
}
