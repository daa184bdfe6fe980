/* psfleet gen-data's generator: Criteo-like rows (or the same model as LIBSVM or as TFRecord files of
 * tf.train.Example, or a CSV regression)
 * with labels from a planted model, so that the best reachable AUC (or RMSE) is known. The planted
 * weights are a function of (seed, field, rank), so the model takes no memory; the rows are streamed.
 * Deterministic: the same options give the same bytes. Not thread-safe: one gendata per thread. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "records.h"

#define GENDATA_EX_IOERR 74 /* sysexits.h EX_IOERR: psfleet gen-data could not write a file */

struct gendata_opts {
        enum records_format format;
        uint64_t seed;
        uint32_t vocab;         /* ranks per categorical field (>= 1) */
        double zipf;            /* the rank's power law: P(rank r) ~ (r + 1)^-zipf, zipf > 0 */
        double noise;           /* CSV: the standard deviation of the label's noise, >= 0 */
};

/* What one output holds: written to PATH.meta.json. */
struct gendata_stats {
        uint64_t rows, bytes;   /* bytes: uncompressed */
        double positive_rate;   /* criteo, libsvm */
        double planted_auc, planted_logloss; /* the planted model's own, on exactly these rows */
        double planted_rmse;    /* csv: of the planted regression (the noise as drawn and rounded) */
};

struct gendata;

/* Builds the planted model (its bias calibrated on a few thousand rows of a stream of its own, for a
 * positive rate of ~25% and a planted AUC of ~0.78). 0, -EINVAL (an option out of range), -ENOMEM. */
int gendata_new(const struct gendata_opts *o, struct gendata **ret);
struct gendata *gendata_free(struct gendata *g); /* NULL-safe; returns NULL */

/* Writes `rows` rows drawn from random stream `stream` (0 for training, 1 for test rows) to path,
 * gzip'd (level 1) when it ends in ".gz", and fills *st. 0, or -errno with err naming the path
 * (-ENOMEM for the metrics' pairs). */
int gendata_write(struct gendata *g, const char *path, uint64_t rows, uint64_t stream, struct gendata_stats *st,
                  char *err, size_t errlen);
/* Writes path + ".meta.json": format, rows, seed and the planted model's metrics. 0 or -errno (err). */
int gendata_write_meta(const struct gendata *g, const char *path, const struct gendata_stats *st, char *err,
                       size_t errlen);

/* The planted model's pieces, for tests: field f's categorical token of rank r (8 lowercase hex digits
 * and a NUL into buf; distinct ranks give distinct tokens), its weight, and the bias. */
void gendata_token(uint32_t field, uint32_t rank, char buf[9]);
double gendata_weight(const struct gendata *g, uint32_t field, uint32_t rank);
double gendata_bias(const struct gendata *g);
/* The weight of the dense feature j (criteo: of log1p(I_j); csv: of x_j). */
double gendata_dense_weight(const struct gendata *g, uint32_t j);
