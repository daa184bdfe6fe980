/* Training and evaluating a model with embeddings (docs/sparse.md) in the pieces every node shares:
 * the job's record files opened as a worker's shard, a batch on its way into the dense layers, the
 * evaluation over the test files (AUC, log loss, RMSE) given a way to look rows up, and the standalone
 * trainer. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "model.h"
#include "records.h"
#include "sparse_table.h"
#include "trainer.h"

/* Opens the job's training (test false) or test files as shard k of W (records.h); loop: epochs. 0, or
 * -errno with err naming the file (-EBADMSG: the data are at fault, exit 65). */
int ctr_records_open(const struct job_config *cfg, bool test, uint32_t k, uint32_t W, bool loop,
                     struct records_reader **ret, char *err, size_t errlen);

/* A batch of records on its way into the dense layers: the batch, the sparse front (ctr.h), the
 * pooled input and softmax's class labels. For batches of up to cap records of reader rd's shape. */
struct ctr_step {
        struct records_batch *b;
        struct ctr *c;
        float *x;              /* (cap, ctr_width) */
        uint8_t *y8;           /* (cap) */
};
int ctr_step_new(const struct job_config *cfg, const struct records_reader *rd, uint32_t cap,
                 struct ctr_step **ret); /* 0, -ENOMEM */
struct ctr_step *ctr_step_free(struct ctr_step *s); /* NULL-safe; returns NULL */
/* With the rows of s's batch in ctr_rows: pools them into x and runs m forward on it (before, ud as
 * model_forward_blocks'). -EDOM for a softmax head and a label that is not a class index. */
int ctr_step_forward(const struct job_config *cfg, struct ctr_step *s, struct model *m, float *loss,
                     uint32_t *correct, model_block_cb before, void *ud);

struct ctr_eval {
        uint64_t n;             /* examples */
        double loss;            /* the head's mean loss */
        double accuracy;        /* softmax: argmax == label; logistic: (p > 0.5) == label; mse: NAN */
        double auc, logloss;    /* logistic; NAN otherwise */
        double rmse;            /* mse; NAN otherwise */
};

/* Reads the rows of table e's ids[0..n) into rows (n x dim), without creating any. 0 or -errno with
 * why in err. */
typedef int (*ctr_lookup_fn)(void *ud, uint32_t e, const uint64_t *ids, size_t n, float *rows, char *err,
                             size_t errlen);

/* Evaluates m (its dense variables as they are) over every test file, rows through lookup. 0 (an
 * evaluation of 0 examples when the job has no test files), or -errno with err. */
int ctr_evaluate(const struct job_config *cfg, struct model *m, ctr_lookup_fn lookup, void *ud,
                 struct ctr_eval *ret, char *err, size_t errlen);

/* trainer_standalone for a job with a record format: the embedding tables local (the same tables and
 * arithmetic as the ps shards'), the dense variables applied as trainer_apply does. Fills test_* of
 * ret from ctr_evaluate. */
int trainer_ctr(const struct job_config *cfg, FILE *loss_log, const char *params_out, trainer_progress_cb progress,
                void *ud, struct trainer_result *ret, char *err, size_t errlen);
