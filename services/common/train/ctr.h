/* The sparse front of a model with embeddings (model.embeddings, docs/sparse.md): from a batch of
 * records to the dense layers' input, and from the input's gradient back to the gradients of the
 * embedding rows the batch used. Where the rows come from is the caller's business: a ps through
 * ps_client_sparse (workerd, chiefd's evaluation) or local tables (the standalone trainer).
 *
 * A step: ctr_gather(batch) -> for each table e, ctr_unique(e) lists the ids the batch uses, once
 * each (after the table's vocab hashing); the caller writes their rows, in that order, into
 * ctr_rows(e); ctr_input() pools them into x; the dense model runs forward and backward on x, giving
 * dx; ctr_row_grads(dx) writes each unique id's gradient into ctr_grads(e) (the gradient of the
 * model's mean loss, so it can be applied as is). Not thread-safe: one per thread. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "model_spec.h"
#include "records.h"

struct ctr;

/* For batches of up to max_batch records of at most max_ids ids each (data.max_ids_per_example). A
 * spec without embeddings (a CSV regression, a TFRecord image) has no tables: x is the dense features
 * alone, its input [C, H, W] or flat. 0, -EINVAL (a spec with embeddings whose input is not flat,
 * max_batch or max_ids 0), -ENOMEM. */
int ctr_new(const struct model_spec *spec, uint32_t max_batch, uint32_t max_ids, struct ctr **ret);
struct ctr *ctr_free(struct ctr *c); /* NULL-safe; returns NULL */

uint32_t ctr_width(const struct ctr *c);  /* floats per example of x: model_spec_dense_input */

/* The ids of b, per table, unique (first-seen order: record by record, each table's fields in its
 * order). Returns 0, or -EINVAL (every table then empty) when b does not fit: more than max_batch
 * records or more ids than max_ids each, dense features other than the spec's input, a field index the
 * data does not have (config validation prevents these); -ENOMEM when a batch with more ids than any
 * before cannot grow the buffers (they start at one id per field per record). Earlier pointers from
 * ctr_unique, ctr_rows and ctr_grads are then stale: ask again after each gather. */
int ctr_gather(struct ctr *c, const struct records_batch *b);
uint32_t ctr_n_unique(const struct ctr *c, uint32_t e);
const uint64_t *ctr_unique(const struct ctr *c, uint32_t e);
float *ctr_rows(struct ctr *c, uint32_t e);     /* (n_unique, dim): the caller fills it */

/* x (b->n, width): each record's dense features, then for each table and each of its fields the
 * pooled rows of the field's ids (sum of value * row, or their mean; zeros for a field without ids). */
void ctr_input(struct ctr *c, const struct records_batch *b, float *x);

/* From dx (b->n, width), the gradient of the loss by x, the gradient of each unique id's row into
 * ctr_grads(e) (n_unique, dim): the sum over its occurrences of the slice's gradient times the
 * occurrence's pooling weight. */
void ctr_row_grads(struct ctr *c, const struct records_batch *b, const float *dx);
const float *ctr_grads(const struct ctr *c, uint32_t e);
