/* Training data: IDX files (gzip'd or plain), a dataset of images and labels, and each worker's shard
 * of it. Loading is not thread-safe per call site only in the sense that err is written; a loaded
 * dataset is read-only and may be shared between threads. A data_iter belongs to one thread. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* An IDX file of unsigned bytes. Plain data. */
struct idx {
        uint32_t n_dims;   /* 1..3 */
        uint32_t dims[3];
        size_t size;       /* product of dims */
        uint8_t *data;     /* (dims[0], ..., dims[n_dims-1]) */
};

/* Reads a gzip'd or plain IDX file of unsigned bytes (magic 0x00000801..0x00000803). On failure
 * returns -errno and writes a message naming the file and byte offset into err: -EBADMSG for a bad
 * file (bad magic, truncated, trailing bytes), -EFBIG for dimensions past IDX_MAX_BYTES, -ENOMEM, or
 * the open/read errno. */
#define IDX_MAX_BYTES ((size_t)1 << 32)
int idx_load(const char *path, struct idx **ret, char *err, size_t errlen);
struct idx *idx_free(struct idx *x); /* NULL-safe; returns NULL */

struct dataset {
        uint32_t n;        /* examples */
        uint32_t rows, cols;
        uint32_t dim;      /* rows * cols */
        float *x;          /* (n, dim), pixels / 255 in [0, 1] */
        uint8_t *y;        /* (n) */
};

/* Images (3 dims) and labels (1 dim) whose counts must match. Returns 0, or -errno with err naming the
 * file and why. -EBADMSG is the one kind for "the data are at fault", which no restart can fix (the
 * daemons exit 65): a file missing or not a file (idx_load's -ENOENT, -ENOTDIR, -EISDIR), malformed,
 * truncated, too large (-EFBIG), of the wrong dimensionality, no images, or counts that differ (the
 * message names both files). Otherwise -ENOMEM, or the read's errno (-EIO, -EACCES: the host's fault). */
int dataset_load(const char *images_path, const char *labels_path, struct dataset **ret, char *err,
                 size_t errlen);
/* Whether d fits a model of `dim` inputs and `n_classes` classes: 0, or -EBADMSG (bad data, as above)
 * with err naming images_path, its values per example and its largest label. */
int dataset_fits(const struct dataset *d, const char *images_path, uint32_t dim, uint32_t n_classes, char *err,
                 size_t errlen);
struct dataset *dataset_free(struct dataset *d); /* NULL-safe; returns NULL */
uint8_t dataset_max_label(const struct dataset *d);

/* Worker k of W reads the examples whose index is k (mod W), in an order reshuffled every epoch by
 * Fisher–Yates from an rng seeded with (seed, k, epoch). The dataset must outlive the iterator. */
struct data_iter;
/* -EINVAL if W == 0, k >= W, or shard k would be empty. */
int data_iter_new(const struct dataset *d, uint32_t k, uint32_t W, uint64_t seed, struct data_iter **ret);
struct data_iter *data_iter_free(struct data_iter *it); /* NULL-safe; returns NULL */
/* Copies the next B examples into x (B, dim) and y (B), continuing into the next epoch (reshuffled)
 * when this one runs out. */
void data_iter_next_batch(struct data_iter *it, uint32_t B, float *x, uint8_t *y);
/* Moves on by this many examples, as if data_iter_next_batch had read them (without copying). */
void data_iter_skip(struct data_iter *it, uint64_t examples);
uint64_t data_iter_epoch(const struct data_iter *it);         /* 0 for the first pass */
uint64_t data_iter_examples_seen(const struct data_iter *it); /* in total, all epochs */
uint32_t data_iter_size(const struct data_iter *it);          /* examples in this shard */
/* The dataset index of the example at `pos` of the current epoch's order (for tests). */
uint32_t data_iter_index_at(const struct data_iter *it, uint32_t pos);
