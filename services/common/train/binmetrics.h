/* Metrics of binary classifiers and regressors: AUC (exact, ties counted half), log loss, RMSE. An
 * accumulator collects (score, label) pairs batch by batch; the chief's evaluation, the standalone
 * trainer and psfleet gen-data (the planted model's own AUC) all compute through here. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct binmetrics;

/* cap_hint: expected pairs (grows past it). 0, -ENOMEM. */
int binmetrics_new(size_t cap_hint, struct binmetrics **ret);
struct binmetrics *binmetrics_free(struct binmetrics *m); /* NULL-safe; returns NULL */
void binmetrics_reset(struct binmetrics *m);

/* n pairs: p[i] the predicted probability of label 1 (logistic head) or the prediction (MSE head),
 * y[i] the label (0 or 1 for AUC and log loss; any value for RMSE). -ENOMEM. */
int binmetrics_add(struct binmetrics *m, const float *p, const float *y, size_t n);

size_t binmetrics_count(const struct binmetrics *m);
/* Area under the ROC curve of the pairs so far (labels > 0.5 are positives); ties between a positive
 * and a negative count one half. NAN when there are no positives or no negatives. O(n log n). */
double binmetrics_auc(struct binmetrics *m);
/* Mean of -(y log p + (1 - y) log(1 - p)), p clamped to [1e-7, 1 - 1e-7]. NAN when empty. */
double binmetrics_logloss(const struct binmetrics *m);
/* sqrt(mean (p - y)^2). NAN when empty. */
double binmetrics_rmse(const struct binmetrics *m);
