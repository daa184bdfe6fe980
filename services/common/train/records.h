/* Tabular training data, streamed: LIBSVM, Criteo-style TSV and CSV files (gzip'd or plain, told
 * apart by their first bytes, not their names), and TFRecord files of tf.train.Example (plain, GZIP or
 * ZLIB), read a batch at a time in memory bounded by the batch,
 * whatever the size of the files. Each worker reads its own shard: by file when there are at least as
 * many files as workers, else by line within every file (docs/sparse.md, "Data").
 *
 * A record is a label, n_dense dense features and n_fields sparse fields; a field holds zero or more
 * (id, value) pairs. The formats:
 *   LIBSVM  "label idx:val idx:val ..."      no dense features; one multi-valued field 0 (id idx)
 *   CRITEO  label \t I1..I13 \t C1..C26      13 dense (log1p of the count, 0 when empty or negative),
 *                                            26 single-valued fields; an empty C is no id; the id of a
 *                                            token is records_hash(field, token), value 1
 *   CSV     "label,x1,...,xN"                N dense features (the first line's count, or n_dense);
 *                                            no fields. A first line that does not parse as numbers is
 *                                            a header and is skipped.
 *   TFRECORD one tf.train.Example per record     the features the spec (opts.tfrecord) names: its dense
 *                                            ones (then the image) as dense, its sparse ones as fields
 *                                            (int64: the value is the id; bytes: records_hash(field,
 *                                            bytes)); a "line" is a record, counted from 0 in messages
 * Not thread-safe: a reader belongs to one thread. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

enum records_format { RECORDS_LIBSVM, RECORDS_CRITEO, RECORDS_CSV, RECORDS_TFRECORD };

#define RECORDS_CRITEO_DENSE DATA_CRITEO_DENSE   /* 13, the job's (config.h) */
#define RECORDS_CRITEO_FIELDS DATA_CRITEO_FIELDS /* 26 */

/* "libsvm", "criteo", "csv", "tfrecord" */
const char *records_format_name(enum records_format f);
/* The fields a format's records have (LIBSVM 1, CRITEO 26, CSV 0; TFRECORD: its spec's, 0 here). */
uint32_t records_format_fields(enum records_format f);

/* The 64-bit id of a categorical token of field `field` (FNV-1a of the bytes, mixed with the field by
 * splitmix64): the same token in two fields gives two ids. Stable: checkpoints hold these ids.
 * Exactly: h = FNV-1a 64 of the bytes (offset basis 0xcbf29ce484222325, prime 0x100000001b3); s = h ^
 * field * 0x9e3779b97f4a7c15; the id is rng_splitmix64(&s) (s += 0x9e3779b97f4a7c15, then its mix). */
uint64_t records_hash(uint32_t field, const char *token, size_t len);

struct records_opts {
        enum records_format format;
        const char *const *files;   /* n_files paths, read in this order */
        uint32_t n_files;
        uint32_t worker, n_workers; /* this reader's shard: worker < n_workers */
        uint32_t n_dense;           /* CSV: expected features per line (0: the first line's count);
                                       ignored for the other formats */
        uint32_t max_ids;           /* per record, all fields together; a longer LIBSVM line is bad */
        bool skip_bad;              /* data.bad_lines "skip": count and skip a bad line, else fail */
        bool loop;                  /* at the end of the shard, start it again (the next epoch) */
        uint32_t shuffle;           /* > 1: records drawn at random from a buffer of this many read ahead
                                       (data.shuffle_buffer; across epochs when looping); 0 or 1: in order */
        uint64_t seed;              /* the draws' seed (with worker as the stream) */
        const struct tfr_spec *tfrecord; /* TFRECORD: the features a record takes (config.h); must outlive
                                            the reader */
};

/* A batch of records in arrays the batch owns (records_batch_new), sized for `cap` records.
 * Record b's field f holds ids[off[b * n_fields + f] .. off[b * n_fields + f + 1]) with their
 * values in val[] alike; off has cap * n_fields + 1 entries, off[0] == 0. */
struct records_batch {
        uint32_t n;                /* records in it */
        uint32_t cap;
        uint32_t n_dense, n_fields, max_ids;
        float *label;              /* (cap) */
        float *dense;              /* (cap, n_dense) */
        uint32_t *off;             /* (cap * n_fields + 1) */
        uint64_t *ids;             /* (cap * max_ids) */
        float *val;                /* (cap * max_ids) */
};

int records_batch_new(uint32_t cap, uint32_t n_dense, uint32_t n_fields, uint32_t max_ids,
                      struct records_batch **ret); /* 0, -EINVAL (cap 0), -ENOMEM */
struct records_batch *records_batch_free(struct records_batch *b); /* NULL-safe; returns NULL */

struct records_reader;

/* Opens the shard's first file. 0, or -errno with err naming the file and why: -EINVAL for options
 * that make no sense (no files, worker >= n_workers), -EBADMSG for a file that is missing, not a
 * regular file, or whose first record is bad (CSV: the feature count), the open's errno otherwise. */
int records_open(const struct records_opts *o, struct records_reader **ret, char *err, size_t errlen);
struct records_reader *records_close(struct records_reader *r); /* NULL-safe; returns NULL */

/* The features per record this reader gives (CSV: known once open). */
uint32_t records_n_dense(const struct records_reader *r);
uint32_t records_n_fields(const struct records_reader *r);

/* Reads up to b->cap records of the shard into b (b->n set). Returns the records read: fewer than
 * cap only at the end of the shard without loop (0: the end), or with loop when a whole pass gave no
 * record (all lines empty or skipped as bad: it would spin). -EBADMSG with err as
 * "FILE:LINE: why" for a bad line (TFRECORD: "FILE: record INDEX at byte OFFSET: why", INDEX from 0,
 * OFFSET in the uncompressed file) (unless skip_bad: then counted and skipped), -EIO (and the file)
 * for a read error, a corrupt gzip stream or a file of the shard gone since records_open. After an
 * error b->n records read before it are in b, and a later call goes on after the bad line (or file).
 * b must have been made for this reader's n_dense, n_fields and max_ids (-EINVAL otherwise). */
int records_next(struct records_reader *r, struct records_batch *b, char *err, size_t errlen);

uint64_t records_bad_lines(const struct records_reader *r); /* skipped so far */
uint64_t records_read(const struct records_reader *r);      /* records read so far, all epochs (with a
                                                               shuffle buffer, up to its size ahead of
                                                               those given) */
uint64_t records_epoch(const struct records_reader *r);     /* 0 during the first pass */
