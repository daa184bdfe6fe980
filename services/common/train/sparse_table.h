/* An embedding table's rows on one ps shard (or in the standalone trainer): a hash table from 64-bit
 * id to a row of `dim` floats and its optimizer state, each row created on first touch with a value
 * drawn from an rng seeded by (seed, id) alone, so the model is the same whatever the number of
 * shards. Rows live in chunks that never move; memory stays within 1.3x the raw bytes of the rows
 * and their state (docs/sparse.md, "Tables on the ps").
 *
 * Thread-safe: ids are spread over lock stripes; a pull or push locks one stripe at a time, so a call
 * is atomic per row, not across rows (as TensorFlow's sparse applies without use_locking). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"  /* enum sparse_optimizer */

#define SPARSE_MAX_SLOTS 2

struct sparse_tier_ops;

struct sparse_table_opts {
        uint32_t dim;                 /* 1..1024 */
        enum sparse_optimizer optimizer;
        double init_stddev;           /* rows start truncated-normal (2 sigma) with this stddev; 0: zeros */
        uint64_t seed;                /* with the id, the only input of a row's initial value */
        const float *init_rows;       /* (n_init_rows, dim): row id < n_init_rows starts as init_rows[id]
                                       * instead (a hashed table of a graph model: its initializer's values);
                                       * the caller's memory, kept as long as the table; NULL: none */
        uint64_t n_init_rows;
        double initial_accumulator;   /* adagrad: the accumulator's start (> 0 unless epsilon > 0); ftrl: n's start */
        double epsilon;               /* adagrad: added to sqrt(accumulator), as the dense path's training.epsilon
                                       * (optim_adagrad); 0 is TF 1.x's AdagradOptimizer */
        double ftrl_l1, ftrl_l2, ftrl_beta, ftrl_lr_power; /* ftrl (TensorFlow's FtrlOptimizer) */
        uint64_t max_rows;            /* 0: no bound; else >= SPARSE_MIN_MAX_ROWS: each of the 64 stripes holds at
                                       * most its share (max_rows / 64, the remainder to the first), and a new row
                                       * in a full stripe first evicts about 3 % of its rows by evict_policy */
        enum sparse_evict_policy evict_policy; /* lfu adds a 4-byte use count to each row; age, lru use the touch */
        uint32_t admit_after;         /* > 1: a missing id gets a row on its admit_after-th pull with create,
                                       * counted in a count-min sketch (SPARSE_SKETCH_*); before that its pulls
                                       * give its initial row, nothing stored, and a push of it is dropped */
        const char *tier_dir;         /* non-NULL: the disk tier's directory (made, wiped and opened by
                                       * sparse_table_new): a row leaving DRAM at max_rows is written there
                                       * instead of dropped, and read back on its next use (sparse_tier.h) */
        const struct sparse_tier_ops *tier_ops; /* with tier_dir: the store (&sparse_tier_rocksdb); a table
                                       * reaches RocksDB only through it, so that programs without a tier
                                       * do not link it */
};

/* The smallest max_rows (one row per stripe), and the admission sketch's shape: 4 rows of 2^20 8-bit
 * counters (4 MiB per table on each shard), halved every 10 * 2^20 sightings. */
#define SPARSE_MIN_MAX_ROWS 64u
#define SPARSE_SKETCH_WIDTH_LOG2 20u
#define SPARSE_SKETCH_DEPTH 4u
#define SPARSE_SKETCH_RESET (10ull << SPARSE_SKETCH_WIDTH_LOG2)

/* What a table did (status, metrics); each counter since the table was made. */
struct sparse_table_stats {
        uint64_t rows, bytes;
        uint64_t evicted_age;     /* by sparse_table_evict (evict_after_steps) */
        uint64_t evicted_limit;   /* to make room at max_rows */
        uint64_t admitted;        /* rows made after admit_after sightings */
        uint64_t admit_pending;   /* pulls of ids below admit_after, answered with the initial row */
        uint64_t grads_dropped;   /* pushed rows of ids without a row under admission, not applied */
        /* the disk tier (all 0 without one) */
        uint64_t tier_rows;       /* rows whose copy is on disk */
        uint64_t tier_bytes;      /* the store's files and memtables */
        uint64_t tier_reads;      /* rows read back from disk into DRAM */
        uint64_t tier_spills;     /* rows written to disk to make room */
        uint64_t tier_errors;     /* failed disk operations */
        uint64_t tier_refused;    /* new rows refused because no row could be written to disk */
};

/* "sgd", "adagrad", "ftrl" */
const char *sparse_optimizer_name(enum sparse_optimizer o);
/* Per-row slots: sgd 0; adagrad 1 ("accumulator"); ftrl 2 ("accum" = n, "linear" = z), as TF names them. */
unsigned sparse_optimizer_n_slots(enum sparse_optimizer o);
const char *sparse_optimizer_slot_name(enum sparse_optimizer o, unsigned slot); /* NULL out of range */

/* "age", "lru", "lfu" */
const char *sparse_evict_policy_name(enum sparse_evict_policy p);

/* The shard an id's row lives on, of n_shards (every node computes it alike). */
uint32_t sparse_shard_of(uint64_t id, uint32_t n_shards);

struct sparse_table;

/* 0, -EINVAL, -ENOMEM, or sparse_tier_open's -errno for tier_dir */
int sparse_table_new(const struct sparse_table_opts *o, struct sparse_table **ret);
struct sparse_table *sparse_table_free(struct sparse_table *t); /* NULL-safe; returns NULL */
uint32_t sparse_table_dim(const struct sparse_table *t);
const struct sparse_table_opts *sparse_table_options(const struct sparse_table *t); /* owned by t */

/* The row of id as it starts (what a pull of an untouched id gives), into row (dim floats). */
void sparse_table_init_row(const struct sparse_table *t, uint64_t id, float *row);

/* The values of ids[0..n) into rows (n x dim). create: a missing id's row is made (initialized) and
 * stored; otherwise its initial value is written and nothing stored (evaluation). Either way a
 * stored row's last touch becomes step. 0, or -ENOMEM (rows before the failing one are written).
 * With a disk tier, a row on disk is read back into DRAM (making room as a new row does); if no room
 * can be made (the disk failing) its stored value is given and it stays on disk, a new row is not
 * made (its initial value given, tier_refused counted), and a failed read returns -EIO. Push alike:
 * a gradient that cannot be applied so is dropped and counted (grads_dropped). */
int sparse_table_pull(struct sparse_table *t, const uint64_t *ids, size_t n, float *rows, bool create,
                      uint64_t step);

/* Applies gradients g (n x dim) to the rows of ids[0..n) (created when missing) with learning rate
 * lr, one id after the other (an id given twice is applied twice). Gradients are the caller's to
 * check (finite, within a norm). 0, or -ENOMEM. */
int sparse_table_push(struct sparse_table *t, const uint64_t *ids, size_t n, const float *g, float lr,
                      uint64_t step);

size_t sparse_table_rows(const struct sparse_table *t);   /* stored rows */
size_t sparse_table_bytes(const struct sparse_table *t);  /* memory held, all of it */
void sparse_table_get_stats(const struct sparse_table *t, struct sparse_table_stats *st);

/* The most memory a table of options o holds with rows rows spread evenly over its stripes, or, with
 * o->max_rows set and rows == o->max_rows, at its bound (the same layout sparse_table_bytes counts:
 * records in their chunks, index at its load limit, chunk tables, the sketch). For plans and limits. */
uint64_t sparse_table_bytes_for(const struct sparse_table_opts *o, uint64_t rows);
/* The largest row bound whose sparse_table_bytes_for fits in bytes (0 if not even SPARSE_MIN_MAX_ROWS). */
uint64_t sparse_table_rows_within(const struct sparse_table_opts *o, uint64_t bytes);

/* Removes rows last touched before now - after (after > 0). Returns how many. Steps are kept in 32 bits:
 * a row last touched at step 2^32 - 2 or later is never evicted. */
size_t sparse_table_evict(struct sparse_table *t, uint64_t now, uint64_t after);

/* Walks the stored rows in pages: start with *cursor = 0; each call writes up to max rows (ids,
 * values (max x dim), and with slots non-NULL the slots, slot-major: slots[s * max * dim + i * dim +
 * j]) and advances *cursor; returns the rows written, 0 at the end. Rows made during the walk may be
 * missed, none is given twice, and each row is read under its lock. (An id evicted by
 * sparse_table_evict and made again during the walk is a new row: it may come twice, so checkpoints
 * walk with that eviction held off. Eviction at max_rows keeps the rows a walk has given in the stripe
 * it is in, so it gives no id twice.) */
size_t sparse_table_export(struct sparse_table *t, uint64_t *cursor, size_t max, uint64_t *ids, float *values,
                           float *slots);

/* Stores rows as given (restoring a checkpoint): values (n x dim); slots as export writes them with
 * max == n, or NULL for the optimizer's initial state. Existing rows of those ids are replaced; each
 * row's last touch becomes step. Returns how many of the ids were stored already (in DRAM or on disk;
 * INT_MAX at most), or -ENOMEM. */
int sparse_table_import(struct sparse_table *t, const uint64_t *ids, size_t n, const float *values,
                        const float *slots, uint64_t step);

/* With a disk tier, the walk gives DRAM's stripes and then the rows on disk (over a snapshot of the
 * store taken when DRAM's part ends); a row moving between DRAM and disk during a walk is given once
 * (each row carries whether this walk has given it). Walks do not overlap: one starting at cursor 0
 * ends the one before. */

/* The last disk tier error's text (empty if none), into buf; "" without a tier. */
void sparse_table_tier_error(struct sparse_table *t, char *buf, size_t len);
/* The table's disk tier (owned by t), or NULL: for tests' fault injection (sparse_tier_fail_writes). */
struct sparse_tier *sparse_table_tier(struct sparse_table *t);

/* Change tracking for incremental checkpoints (docs/checkpoints.md), off by default; turn it on before
 * the first row is made. While on, a row is marked changed when it is made, pushed or imported (a pull
 * of a stored row does not mark it), and evicted ids are noted until taken. Costs one bit per row. */
void sparse_table_track(struct sparse_table *t, bool on);

/* As sparse_table_export; with dirty_only, only the rows marked changed; with clean, the rows given
 * are unmarked (a row changed again after it was read is marked again). */
size_t sparse_table_export_changes(struct sparse_table *t, uint64_t *cursor, size_t max, uint64_t *ids,
                                   float *values, float *slots, bool dirty_only, bool clean);

/* The ids evicted since the last call (malloc'd into *ids_ret, *n_ret of them, maybe twice; NULL when
 * none), and forgets them. -ENOMEM when some could not be noted or returned: the caller must then
 * treat every id as changed (write a full checkpoint). */
int sparse_table_take_evicted(struct sparse_table *t, uint64_t **ids_ret, size_t *n_ret);

/* Drops the rows of ids[0..n) that are stored, on disk too (an incremental checkpoint's evicted ids,
 * restored). The ids are not noted as evicted: a restore is followed by a full checkpoint. Returns how
 * many rows went. */
size_t sparse_table_delete(struct sparse_table *t, const uint64_t *ids, size_t n);

/* Drops every row (a shard made uninitialized again), the disk tier's too. */
void sparse_table_clear(struct sparse_table *t);

/* The journal (ps.replicas 2: what a primary's backup replays): while on, every row made (by a pull
 * with create or admission, a push, an import; not one read back from disk) and every row dropped for
 * good (evicted at max_rows without a disk tier, or by age, disk copies included) is noted, per
 * stripe in order. Rows moving between DRAM and disk are not: that changes no value. Off by default;
 * the caller serializes the writes it journals. */
enum sparse_event_kind { SPARSE_MADE = 1, SPARSE_DROPPED = 2 };
struct sparse_event {
        uint64_t id;
        uint8_t kind;   /* enum sparse_event_kind */
};
void sparse_table_journal(struct sparse_table *t, bool on);
/* The events noted since the last take (malloc'd into *ev_ret, NULL when none; stripe by stripe,
 * each stripe's in order: stripes are independent), forgotten here. -ENOMEM when some could not be
 * noted or returned: the caller must then resynchronize its replica whole. */
int sparse_table_journal_take(struct sparse_table *t, struct sparse_event **ev_ret, size_t *n_ret);
/* The backup's side: events replayed in order (a made row initialized as a new one is, if missing; a
 * dropped row deleted, from disk too). Returns 0, -ENOMEM, or -EDOM when the table had to drop a row
 * of its own to make one (its bound went another way than the primary's: resynchronize). */
int sparse_table_replay(struct sparse_table *t, const struct sparse_event *ev, size_t n, uint64_t step);
/* As sparse_table_push, but a missing id's gradient is always dropped (its row, if the primary made
 * one, came by sparse_table_replay first). */
int sparse_table_push_existing(struct sparse_table *t, const uint64_t *ids, size_t n, const float *g, float lr,
                               uint64_t step);
