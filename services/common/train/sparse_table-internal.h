/* What the embedding table's files share: its structs, the record layout and the small helpers over them.
 * sparse_table.c is the hash table; sparse_table_bounds.c the bound (eviction, admission),
 * sparse_table_changes.c the walk and change tracking, sparse_table_tier.c the disk tier's glue. Not
 * for other files: sparse_table.h is the interface. */
#pragma once
#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cmsketch.h"
#include "sparse_table.h"
#include "sparse_tier.h"

#define STRIPE_BITS 6
#define N_STRIPES (1u << STRIPE_BITS)
#define FIRST_CHUNK_SHIFT 4          /* the first chunk of a stripe holds 16 rows */

/* A chunk is an array of records, each 12 + 4 * row_floats bytes (16 + with evict_policy lfu): the id
 * (8 bytes, unaligned: read with memcpy; a free row's next free row + 1), the last touched step + 1
 * (uint32, saturating; 0: a free row), under lfu its use count (uint32, saturating), then the row's dim
 * floats and each slot's. The key beside its row costs one cache miss less
 * than a separate array. Untouched tails are never written, so a fresh chunk holds no resident memory
 * until its rows are used. */
struct stripe {
        pthread_mutex_t lock;
        /* (cap) row + 1 or 0; linear probing, deletions shift back. index and cap are also read
         * without the lock, atomically, to prefetch: a stale pair only prefetches a useless line. */
        uint32_t *index;
        uint32_t cap;      /* index slots: 0 or a power of two */
        uint32_t live;     /* rows in the index */
        uint32_t used;     /* rows handed out, live or free: the next new row number */
        uint32_t free_head; /* row + 1 of the first free row, 0: none */
        uint32_t max_live; /* max_rows' share of this stripe; 0: no bound */
        uint32_t lfu_gone; /* lfu: rows evicted since the counts were last halved */
        uint32_t walk_at;  /* an export's walk is inside this stripe: rows below it are walked (0: none) */
        char **chunks;
        uint32_t n_chunks, chunks_cap;
        size_t bytes;      /* index, chunk table and chunks */
        /* change tracking for incremental checkpoints (sparse_table_track): one bit per row number,
         * set when the row is made, pushed or imported, cleared by an export that cleans; and the ids
         * evicted since the last sparse_table_take_evicted */
        uint64_t *dirty;   /* (dirty_words) */
        uint32_t dirty_words, last_row;   /* last_row: the row rec_locked returned */
        uint64_t *gone;
        size_t n_gone, gone_cap;
        /* sparse_table_journal: the rows made and dropped for good since the last take, in order */
        struct sparse_event *events;
        size_t n_events, events_cap;
        /* with a disk tier: one bit per row number, set when the current walk has given the row */
        uint64_t *given;
        uint32_t given_words;
} __attribute__((aligned(64)));

struct sparse_table {
        struct sparse_table_opts o;
        unsigned n_slots;
        size_t row_floats;             /* dim * (1 + n_slots) */
        size_t rec_bytes;              /* a record: id, touch, [count,] row_floats floats */
        size_t vals_off;               /* where a record's floats start: 12, or 16 with a use count */
        unsigned geo_k;                /* chunks 0..geo_k double in size; later ones hold 2^max_shift */
        unsigned max_shift;            /* log2(rows of a full chunk) */
        uint64_t geo_rows;             /* rows in chunks 0..geo_k */
        struct cmsketch *sketch;       /* admit_after > 1: sightings of ids without a row */
        uint64_t evicted_age, evicted_limit, admitted, admit_pending, grads_dropped; /* atomic */
        bool track;                    /* change tracking on (set before any row is made) */
        bool changes_lost;             /* an evicted id could not be noted (atomic) */
        bool journal;                  /* sparse_table_journal on */
        bool journal_lost;             /* an event could not be noted (atomic) */
        /* the disk tier (tier_dir): rows past max_rows, as tier values (struct tier_hdr, row_floats) */
        struct sparse_tier *tier;
        const struct sparse_tier_ops *tops;   /* the tier's functions (o.tier_ops) */
        size_t tier_val_bytes;
        uint64_t tier_rows, tier_reads, tier_spills, tier_errors, tier_refused; /* atomic */
        pthread_mutex_t walk_lock;     /* the walk's state below */
        uint32_t walk_gen;             /* the current walk's number (atomic reads), never 0 */
        bool walking;                  /* a walk is under way (atomic) */
        struct sparse_tier_iter *walk_it;  /* the disk part of the walk, at walk_seq keys */
        uint64_t walk_seq;
        struct stripe stripes[N_STRIPES];
};

/* A row's value in the disk tier: its record's state, then its row_floats floats. Native byte order:
 * the store is this process's working state, wiped at every start, never read by another machine. */
struct tier_hdr {
        uint32_t touch, count;   /* as the record's */
        uint32_t gen;            /* the walk that gave it (walk_gen), or 0 */
        uint32_t flags;          /* TIER_DIRTY */
};
#define TIER_DIRTY 1u

/* A walk's cursor: DRAM's part is (stripe << 32 | row); the disk part sets TIER_PHASE and counts the
 * keys its iterator has passed; TIER_DONE: the walk has ended. */
#define TIER_PHASE (1ull << 63)
#define TIER_DONE UINT64_MAX

/* The stripe mix (murmur3's fmix64) and the shard mix (splitmix64's finalizer) differ, so that the
 * ids of one shard still spread over every stripe. */
static inline uint64_t stripe_hash(uint64_t id)
{
        id ^= id >> 33;
        id *= 0xff51afd7ed558ccdULL;
        id ^= id >> 33;
        id *= 0xc4ceb9fe1a85ec53ULL;
        return id ^ (id >> 33);
}

static inline unsigned stripe_of(uint64_t h)
{
        return (unsigned)(h >> (64 - STRIPE_BITS));
}

static inline unsigned log2_floor(uint64_t x)
{
        return 63u - (unsigned)__builtin_clzll(x);
}

#define REC_VALS 12   /* a record's floats start here, after id (8) and touch (4), */
#define REC_VALS_LFU 16 /* or after id, touch and use count (4) */

static inline char *rec_at(const struct sparse_table *t, const struct stripe *s, uint32_t r)
{
        uint64_t k, off;
        if (r < t->geo_rows) {
                k = log2_floor(((uint64_t)r >> FIRST_CHUNK_SHIFT) + 1);
                off = r - ((((uint64_t)1 << k) - 1) << FIRST_CHUNK_SHIFT);
        } else {
                uint64_t x = r - t->geo_rows;
                k = t->geo_k + 1 + (x >> t->max_shift);
                off = x & (((uint64_t)1 << t->max_shift) - 1);
        }
        assert(k < s->n_chunks);
        return s->chunks[k] + off * t->rec_bytes;
}

static inline uint64_t rec_id(const char *rec)
{
        uint64_t id;
        memcpy(&id, rec, sizeof(id));
        return id;
}

static inline void rec_set_id(char *rec, uint64_t id)
{
        memcpy(rec, &id, sizeof(id));
}

static inline uint32_t *rec_touch(char *rec)
{
        return (uint32_t *)(void *)(rec + 8);
}

static inline uint32_t *rec_count(char *rec)
{
        return (uint32_t *)(void *)(rec + REC_VALS);
}

static inline float *rec_vals(const struct sparse_table *t, char *rec)
{
        return (float *)(void *)(rec + t->vals_off);
}

static inline void dirty_set(struct stripe *s, uint32_t r)
{
        assert(r / 64 < s->dirty_words);
        s->dirty[r / 64] |= 1ull << (r % 64);
}

static inline bool dirty_get(const struct stripe *s, uint32_t r)
{
        return r / 64 < s->dirty_words && (s->dirty[r / 64] >> (r % 64) & 1);
}

static inline void dirty_clear(struct stripe *s, uint32_t r)
{
        if (r / 64 < s->dirty_words)
                s->dirty[r / 64] &= ~(1ull << (r % 64));
}

static inline bool given_get(const struct stripe *s, uint32_t r)
{
        return r / 64 < s->given_words && (s->given[r / 64] >> (r % 64) & 1);
}

static inline void given_put(struct stripe *s, uint32_t r, bool on)
{
        if (r / 64 >= s->given_words)
                return;   /* given_reserve covers every row made while a tier is on */
        if (on)
                s->given[r / 64] |= 1ull << (r % 64);
        else
                s->given[r / 64] &= ~(1ull << (r % 64));
}

/* ---- across the files; s locked wherever a stripe is passed ---- */

/* sparse_table.c: the index slot holding id (*found) or the empty slot where it would go (h: its
 * stripe_hash). */
uint32_t sparse_table_index_find(const struct sparse_table *t, const struct stripe *s, uint64_t id, uint64_t h,
                                 bool *found);
/* sparse_table.c: frees live row r of s, its id leaving the index (its disk copy, if any, is not
 * touched). */
void sparse_table_row_free(struct sparse_table *t, struct stripe *s, uint32_t r);

/* sparse_table_bounds.c: whether a missing id may have a row now, the sketch having seen it
 * admit_after times (admitted or admit_pending counted). */
bool sparse_table_admit(struct sparse_table *t, uint64_t id);
/* sparse_table_bounds.c: a full stripe (live >= max_live) evicts about 1/32 of its rows, those with the
 * smallest keys, so that the scan is paid once per that many new rows; with a disk tier they move
 * there instead. 0, -ENOMEM (the scratch of keys), or the tier's -errno when not one row could be
 * moved. */
int sparse_table_make_room(struct sparse_table *t, struct stripe *s);

/* sparse_table_changes.c: makes a bitmap of *words words cover row number used (the next new row).
 * 0 or -ENOMEM, the bitmap unchanged. */
int sparse_table_bits_reserve(uint64_t **bits, uint32_t *words, uint32_t used);
/* sparse_table_changes.c: notes an evicted id. A failed allocation loses the note: the table remembers
 * that, and sparse_table_take_evicted reports it so that the next checkpoint is a full one. */
void sparse_table_gone_add(struct sparse_table *t, struct stripe *s, uint64_t id);
/* With the journal on, notes that id's row was made (new, not read back from disk) or dropped for good,
 * in s (locked). */
void sparse_table_event(struct sparse_table *t, struct stripe *s, uint64_t id, enum sparse_event_kind kind);
/* sparse_table_changes.c: writes one row as the n-th of a page (sparse_table_export's layout). */
void sparse_table_give_row(const struct sparse_table *t, const float *row, uint64_t id, size_t n, size_t max,
                           uint64_t *ids, float *values, float *slots);

/* sparse_table_tier.c: opens the tier of t's options (o.tier_ops) in dir. 0 or the store's -errno. */
int sparse_table_tier_open(struct sparse_table *t, const char *dir);
/* Frees the store and the walk's iterator; nothing without a tier. */
void sparse_table_tier_close(struct sparse_table *t);
/* Empties the store and ends a walk's disk part (takes walk_lock); nothing without a tier. */
void sparse_table_tier_clear(struct sparse_table *t);
/* Looks a missing id up on disk (no-op without a tier or rows there): 1 found, its value in scratch
 * (tier_val_bytes) and its header in *th; 0 not there; -EIO when the disk cannot be read. */
int sparse_table_tier_read(struct sparse_table *t, uint64_t id, char *scratch, struct tier_hdr *th);
/* Fills new row r of s (record rec) from the value sparse_table_tier_read found: its floats and state. */
void sparse_table_tier_restore(struct sparse_table *t, struct stripe *s, uint32_t r, char *rec,
                               const struct tier_hdr *th, const char *scratch);
/* Writes live row r of s to the disk tier (buf: tier_val_bytes) and frees it in DRAM: a move, not an
 * eviction. 0, or the tier's -errno with the row left in place. */
int sparse_table_tier_spill(struct sparse_table *t, struct stripe *s, uint32_t r, char *buf);
/* Removes the rows on disk last touched before `before` (sparse_table_evict's rule); no stripe locked.
 * Returns how many. */
size_t sparse_table_tier_evict(struct sparse_table *t, uint64_t before);
/* A new walk (walk_lock held): nothing given yet. */
void sparse_table_walk_start(struct sparse_table *t);
/* The disk part of a walk from seq keys on, into the page from its n-th row (walk_lock held, no stripe
 * locked). Returns the page's rows; *cursor set. */
size_t sparse_table_walk_disk(struct sparse_table *t, uint64_t *cursor, uint64_t seq, size_t n, size_t max,
                              uint64_t *ids, float *values, float *slots, bool dirty_only, bool clean);

/* Makes the dirty bitmap cover row number s->used (sparse_table_bits_reserve). 0 or -ENOMEM. */
static inline int dirty_reserve(struct stripe *s)
{
        return sparse_table_bits_reserve(&s->dirty, &s->dirty_words, s->used);
}

/* Makes the given bitmap cover row number s->used. 0 or -ENOMEM. */
static inline int given_reserve(struct stripe *s)
{
        return sparse_table_bits_reserve(&s->given, &s->given_words, s->used);
}
