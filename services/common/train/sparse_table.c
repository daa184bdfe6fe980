/* An embedding table on a ps shard: 64 lock stripes, each an open-addressing index of 32-bit row
 * numbers over rows kept in chunks that never move; rows start as a function of (seed, id) alone. */
#include "sparse_table.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cmsketch.h"
#include "sparse_tier.h"
#include "optim.h"
#include "rng.h"

#define STRIPE_BITS 6
#define N_STRIPES (1u << STRIPE_BITS)
#define FIRST_CHUNK_SHIFT 4          /* the first chunk of a stripe holds 16 rows */
#define CHUNK_BYTES_MAX (1u << 20)   /* chunks double up to about this size, then stay there */
#define INDEX_MIN 16u
#define INIT_SALT 0x5bd1e9955bd1e995ULL
/* A row number is stored as row + 1 (0: an empty index slot); a stripe's index stops at 2^31 slots,
 * filled at most 3/4. */
#define ROWS_MAX (3u << 29)

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

/* Each sparse optimizer's name and the names of its slots, by enum sparse_optimizer. */
static const struct {
        const char *name;
        unsigned n_slots;
        const char *slot[SPARSE_MAX_SLOTS];
} sparse_optimizers[] = {
        [SPARSE_SGD] = {"sgd", 0, {NULL, NULL}},
        [SPARSE_ADAGRAD] = {"adagrad", 1, {"accumulator", NULL}},
        [SPARSE_FTRL] = {"ftrl", 2, {"accum", "linear"}},
};

static bool known(enum sparse_optimizer o)
{
        return (unsigned)o < sizeof(sparse_optimizers) / sizeof(sparse_optimizers[0]) && sparse_optimizers[o].name;
}

const char *sparse_optimizer_name(enum sparse_optimizer o)
{
        return known(o) ? sparse_optimizers[o].name : "?";
}

unsigned sparse_optimizer_n_slots(enum sparse_optimizer o)
{
        return known(o) ? sparse_optimizers[o].n_slots : 0;
}

const char *sparse_optimizer_slot_name(enum sparse_optimizer o, unsigned slot)
{
        return slot < sparse_optimizer_n_slots(o) ? sparse_optimizers[o].slot[slot] : NULL;
}

const char *sparse_evict_policy_name(enum sparse_evict_policy p)
{
        static const char *const names[] = {[SPARSE_EVICT_AGE] = "age", [SPARSE_EVICT_LRU] = "lru",
                                            [SPARSE_EVICT_LFU] = "lfu"};
        return (unsigned)p < sizeof(names) / sizeof(names[0]) ? names[p] : "?";
}

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

uint32_t sparse_shard_of(uint64_t id, uint32_t n_shards)
{
        uint64_t z = rng_splitmix64(&id);
        /* multiply-shift: the bias is at most n_shards / 2^32 */
        return (uint32_t)(((z >> 32) * (uint64_t)n_shards) >> 32);
}

static inline unsigned stripe_of(uint64_t h)
{
        return (unsigned)(h >> (64 - STRIPE_BITS));
}

static unsigned log2_floor(uint64_t x)
{
        return 63u - (unsigned)__builtin_clzll(x);
}

static uint64_t chunk_rows(const struct sparse_table *t, uint32_t k)
{
        return (uint64_t)1 << (FIRST_CHUNK_SHIFT + (k < t->geo_k ? k : t->geo_k));
}

/* Rows held by chunks 0..n-1. */
static uint64_t rows_in_chunks(const struct sparse_table *t, uint32_t n)
{
        if (n <= t->geo_k + 1)
                return (((uint64_t)1 << n) - 1) << FIRST_CHUNK_SHIFT;
        return t->geo_rows + ((uint64_t)(n - t->geo_k - 1) << t->max_shift);
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

static int add_chunk(const struct sparse_table *t, struct stripe *s)
{
        if (s->n_chunks == s->chunks_cap) {
                /* the table of chunk pointers moves; the chunks never do */
                uint32_t ncap = s->chunks_cap ? 2 * s->chunks_cap : 8;
                char **nc = realloc(s->chunks, ncap * sizeof(*nc));
                if (!nc)
                        return -ENOMEM;
                s->bytes += (ncap - s->chunks_cap) * sizeof(*nc);
                s->chunks = nc;
                s->chunks_cap = ncap;
        }
        size_t bytes = (chunk_rows(t, s->n_chunks) * t->rec_bytes + 63) & ~(size_t)63;
        char *mem = aligned_alloc(64, bytes);
        if (!mem)
                return -ENOMEM;
        s->chunks[s->n_chunks++] = mem;
        s->bytes += bytes;
        return 0;
}

static inline uint32_t touch_of(uint64_t step)
{
        return step >= UINT32_MAX - 1 ? UINT32_MAX : (uint32_t)step + 1;
}

/* The index slot holding id (*found) or the empty slot where it would go. */
static uint32_t index_find(const struct sparse_table *t, const struct stripe *s, uint64_t id, uint64_t h,
                           bool *found)
{
        *found = false;
        if (!s->cap)
                return 0;
        uint32_t mask = s->cap - 1;
        for (uint32_t pos = (uint32_t)h & mask;; pos = (pos + 1) & mask) {
                uint32_t e = s->index[pos];
                if (!e)
                        return pos;
                if (rec_id(rec_at(t, s, e - 1)) == id) {
                        *found = true;
                        return pos;
                }
        }
}

/* Rehashes one stripe into an index of ncap slots; the rows stay where they are. */
static int index_grow(const struct sparse_table *t, struct stripe *s, uint32_t ncap)
{
        uint32_t *ni = calloc(ncap, sizeof(*ni));
        if (!ni)
                return -ENOMEM;
        uint32_t mask = ncap - 1;
        for (uint32_t i = 0; i < s->cap; i++) {
                uint32_t e = s->index[i];
                if (!e)
                        continue;
                uint32_t pos = (uint32_t)stripe_hash(rec_id(rec_at(t, s, e - 1))) & mask;
                while (ni[pos])
                        pos = (pos + 1) & mask;
                ni[pos] = e;
        }
        free(s->index);
        s->bytes = s->bytes - (size_t)s->cap * sizeof(uint32_t) + (size_t)ncap * sizeof(uint32_t);
        __atomic_store_n(&s->index, ni, __ATOMIC_RELEASE);
        __atomic_store_n(&s->cap, ncap, __ATOMIC_RELEASE);
        return 0;
}

/* A row for id, entered in the index (the caller fills its values and slots). Returns the row number,
 * or -ENOMEM. */
static int64_t row_new(const struct sparse_table *t, struct stripe *s, uint64_t id, uint64_t h, uint32_t pos)
{
        if (s->live >= ROWS_MAX)
                return -ENOMEM;
        if ((uint64_t)(s->live + 1) * 4 > (uint64_t)s->cap * 3) {
                int rc = index_grow(t, s, s->cap ? 2 * s->cap : INDEX_MIN);
                if (rc < 0)
                        return rc;
                bool found;
                pos = index_find(t, s, id, h, &found);
        }
        uint32_t r;
        if (s->free_head) {
                r = s->free_head - 1;
                s->free_head = (uint32_t)rec_id(rec_at(t, s, r));
        } else {
                if (s->used == rows_in_chunks(t, s->n_chunks)) {
                        int rc = add_chunk(t, s);
                        if (rc < 0)
                                return rc;
                }
                r = s->used++;
        }
        rec_set_id(rec_at(t, s, r), id);
        s->index[pos] = r + 1;
        s->live++;
        return r;
}

/* Removes the entry at pos; later entries of its cluster shift back over it (no tombstones). */
static void index_remove(const struct sparse_table *t, struct stripe *s, uint32_t pos)
{
        uint32_t mask = s->cap - 1;
        uint32_t hole = pos;
        for (uint32_t i = (pos + 1) & mask; s->index[i]; i = (i + 1) & mask) {
                uint32_t home = (uint32_t)stripe_hash(rec_id(rec_at(t, s, s->index[i] - 1))) & mask;
                /* the entry at i may fill the hole unless its home lies cyclically in (hole, i] */
                bool stays = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
                if (!stays) {
                        s->index[hole] = s->index[i];
                        hole = i;
                }
        }
        s->index[hole] = 0;
        s->live--;
}

static void slots_init(const struct sparse_table *t, float *row)
{
        uint32_t dim = t->o.dim;
        for (unsigned sl = 0; sl < t->n_slots; sl++) {
                /* ftrl's linear (z) starts at 0, its accum (n) and adagrad's accumulator at the initial value */
                float v = sl == 0 ? (float)t->o.initial_accumulator : 0.0f;
                float *p = row + (size_t)(1 + sl) * dim;
                for (uint32_t j = 0; j < dim; j++)
                        p[j] = v;
        }
}

/* Stripe i's share of max_rows: the shares add up to max_rows exactly. */
static uint32_t stripe_share(uint64_t max_rows, unsigned i)
{
        uint64_t share = max_rows / N_STRIPES + (i < max_rows % N_STRIPES);
        return share > ROWS_MAX ? ROWS_MAX : (uint32_t)share;
}

int sparse_table_new(const struct sparse_table_opts *o, struct sparse_table **ret)
{
        if (!o || o->dim < 1 || o->dim > 1024 ||
            (o->optimizer != SPARSE_SGD && o->optimizer != SPARSE_ADAGRAD && o->optimizer != SPARSE_FTRL) ||
            !(o->init_stddev >= 0 && isfinite(o->init_stddev)) ||
            !(o->initial_accumulator >= 0 && isfinite(o->initial_accumulator)) ||
            !(o->epsilon >= 0 && isfinite(o->epsilon)))
                return -EINVAL;
        /* TF's Adagrad wants a positive start: 0 / sqrt(0) is NaN for a row's first zero gradient */
        if (o->optimizer == SPARSE_ADAGRAD && o->initial_accumulator == 0 && o->epsilon == 0)
                return -EINVAL;
        if ((o->max_rows && o->max_rows < SPARSE_MIN_MAX_ROWS) ||
            (o->evict_policy != SPARSE_EVICT_AGE && o->evict_policy != SPARSE_EVICT_LRU &&
             o->evict_policy != SPARSE_EVICT_LFU) || o->admit_after > CMSKETCH_MAX || (o->tier_dir && !o->tier_ops))
                return -EINVAL;
        if (o->optimizer == SPARSE_FTRL &&
            !(o->ftrl_l1 >= 0 && o->ftrl_l2 >= 0 && o->ftrl_beta >= 0 && o->ftrl_lr_power <= 0 &&
              isfinite(o->ftrl_l1) && isfinite(o->ftrl_l2) && isfinite(o->ftrl_beta) && isfinite(o->ftrl_lr_power)))
                return -EINVAL;
        struct sparse_table *t = aligned_alloc(64, sizeof(*t));
        if (!t)
                return -ENOMEM;
        memset(t, 0, sizeof(*t));
        t->o = *o;
        t->n_slots = sparse_optimizer_n_slots(o->optimizer);
        t->row_floats = (size_t)o->dim * (1 + t->n_slots);
        t->vals_off = o->evict_policy == SPARSE_EVICT_LFU ? REC_VALS_LFU : REC_VALS;
        t->rec_bytes = t->vals_off + t->row_floats * sizeof(float);
        unsigned max_shift = FIRST_CHUNK_SHIFT;
        while (((size_t)2 << max_shift) * t->rec_bytes <= CHUNK_BYTES_MAX)
                max_shift++;
        t->max_shift = max_shift;
        t->geo_k = max_shift - FIRST_CHUNK_SHIFT;
        t->geo_rows = (((uint64_t)1 << (t->geo_k + 1)) - 1) << FIRST_CHUNK_SHIFT;
        if (o->admit_after > 1) {
                int r = cmsketch_new(SPARSE_SKETCH_WIDTH_LOG2, SPARSE_SKETCH_DEPTH, SPARSE_SKETCH_RESET, &t->sketch);
                if (r < 0) {
                        free(t);
                        return r;
                }
        }
        for (unsigned i = 0; i < N_STRIPES; i++) {
                pthread_mutex_init(&t->stripes[i].lock, NULL);
                t->stripes[i].max_live = stripe_share(o->max_rows, i);
        }
        pthread_mutex_init(&t->walk_lock, NULL);
        t->walk_gen = 1;
        t->o.tier_dir = NULL;   /* the caller's string: not kept */
        if (o->tier_dir) {
                t->tops = o->tier_ops;
                t->tier_val_bytes = sizeof(struct tier_hdr) + t->row_floats * sizeof(float);
                int r = t->tops->open(o->tier_dir, &t->tier);
                if (r < 0) {
                        sparse_table_free(t);
                        return r;
                }
        }
        *ret = t;
        return 0;
}

static void stripe_release(struct stripe *s)
{
        for (uint32_t k = 0; k < s->n_chunks; k++)
                free(s->chunks[k]);
        free(s->chunks);
        free(s->index);
        s->chunks = NULL;
        __atomic_store_n(&s->index, NULL, __ATOMIC_RELEASE);
        __atomic_store_n(&s->cap, 0, __ATOMIC_RELEASE);
        s->n_chunks = s->chunks_cap = s->live = s->used = s->free_head = s->lfu_gone = s->walk_at = 0;
        s->bytes = 0;
        free(s->dirty);
        free(s->gone);
        free(s->given);
        s->dirty = s->gone = s->given = NULL;
        s->dirty_words = s->given_words = 0;
        s->n_gone = s->gone_cap = 0;
}

struct sparse_table *sparse_table_free(struct sparse_table *t)
{
        if (!t)
                return NULL;
        for (unsigned i = 0; i < N_STRIPES; i++) {
                stripe_release(&t->stripes[i]);
                pthread_mutex_destroy(&t->stripes[i].lock);
        }
        cmsketch_free(t->sketch);
        if (t->tier) {
                t->tops->iter_free(t->walk_it);
                t->tops->free(t->tier);
        }
        pthread_mutex_destroy(&t->walk_lock);
        free(t);
        return NULL;
}

uint32_t sparse_table_dim(const struct sparse_table *t)
{
        return t->o.dim;
}

const struct sparse_table_opts *sparse_table_options(const struct sparse_table *t)
{
        return &t->o;
}

void sparse_table_init_row(const struct sparse_table *t, uint64_t id, float *row)
{
        uint32_t dim = t->o.dim;
        if (t->o.init_rows && id < t->o.n_init_rows) {
                memcpy(row, t->o.init_rows + id * dim, dim * sizeof(float));
                return;
        }
        if (t->o.init_stddev == 0) {
                memset(row, 0, dim * sizeof(float));
                return;
        }
        struct rng r;
        rng_init(&r, t->o.seed ^ INIT_SALT, id);
        for (uint32_t j = 0; j < dim; j++) {
                double x;
                do /* truncated at 2 sigma by redrawing, as TF's truncated_normal */
                        x = rng_normal(&r);
                while (fabs(x) > 2.0);
                row[j] = (float)(x * t->o.init_stddev);
        }
}

/* A batch's ids hit random rows: while one is looked up, the index slot of one some places ahead is
 * fetched. index and cap are read without the lock; a stale pair costs only a wasted prefetch. */
#define PREFETCH_AHEAD 8

static inline void prefetch_index(const struct sparse_table *t, const uint64_t *ids, size_t i, size_t n)
{
        if (i + PREFETCH_AHEAD >= n)
                return;
        uint64_t h = stripe_hash(ids[i + PREFETCH_AHEAD]);
        const struct stripe *s = &t->stripes[stripe_of(h)];
        uint32_t *index = __atomic_load_n(&s->index, __ATOMIC_ACQUIRE);
        uint32_t cap = __atomic_load_n(&s->cap, __ATOMIC_ACQUIRE);
        if (index && cap)
                __builtin_prefetch(&index[(uint32_t)h & (cap - 1)]);
}


/* ---- change tracking (incremental checkpoints) ---- */

/* Makes a bitmap of words words cover row number used (the next new row). 0 or -ENOMEM. */
static int bits_reserve(uint64_t **bits, uint32_t *words, uint32_t used)
{
        uint32_t need = used / 64 + 1;
        if (need <= *words)
                return 0;
        uint32_t n = *words ? 2 * *words : 16;
        while (n < need)
                n *= 2;
        uint64_t *d = realloc(*bits, n * sizeof(*d));
        if (!d)
                return -ENOMEM;
        memset(d + *words, 0, (n - *words) * sizeof(*d));
        *bits = d;
        *words = n;
        return 0;
}

static int dirty_reserve(struct stripe *s)
{
        return bits_reserve(&s->dirty, &s->dirty_words, s->used);
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

/* Notes an evicted id (s locked). A failed allocation loses the note: the table remembers that, and
 * sparse_table_take_evicted reports it so that the next checkpoint is a full one. */
static void gone_add(struct sparse_table *t, struct stripe *s, uint64_t id)
{
        if (s->n_gone == s->gone_cap) {
                size_t cap = s->gone_cap ? 2 * s->gone_cap : 64;
                uint64_t *g = realloc(s->gone, cap * sizeof(*g));
                if (!g) {
                        __atomic_store_n(&t->changes_lost, true, __ATOMIC_RELAXED);
                        return;
                }
                s->gone = g;
                s->gone_cap = cap;
        }
        s->gone[s->n_gone++] = id;
}

enum lookup {
        FIND,
        CREATE,
        CREATE_BLANK,   /* the caller writes the row and slots */
        ADMIT,          /* CREATE once the sketch has seen the id admit_after times; else as FIND */
        EXISTING,       /* as FIND, for a push under admission: a missing id's gradient is dropped */
};

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

/* Makes the given bitmap cover row number s->used. 0 or -ENOMEM. */
static int given_reserve(struct stripe *s)
{
        return bits_reserve(&s->given, &s->given_words, s->used);
}

/* Frees live row r of s, its id no longer in the index. */
static void row_free(struct sparse_table *t, struct stripe *s, uint32_t r)
{
        char *rec = rec_at(t, s, r);
        bool found;
        uint64_t id = rec_id(rec);
        uint32_t pos = index_find(t, s, id, stripe_hash(id), &found);
        assert(found);
        index_remove(t, s, pos);
        if (t->track)
                dirty_clear(s, r);
        given_put(s, r, false);
        *rec_touch(rec) = 0;
        rec_set_id(rec, s->free_head);
        s->free_head = r + 1;
}

/* Frees live row r of s for good: the next incremental checkpoint drops its id. */
static void row_drop(struct sparse_table *t, struct stripe *s, uint32_t r)
{
        if (t->track)
                gone_add(t, s, rec_id(rec_at(t, s, r)));
        row_free(t, s, r);
}

/* Writes live row r of s to the disk tier (buf: tier_val_bytes) and frees it in DRAM: a move, not an
 * eviction. 0, or the tier's -errno with the row left in place. */
static int row_spill(struct sparse_table *t, struct stripe *s, uint32_t r, char *buf)
{
        char *rec = rec_at(t, s, r);
        bool walking = __atomic_load_n(&t->walking, __ATOMIC_RELAXED);
        struct tier_hdr h = {
                .touch = *rec_touch(rec),
                .count = t->o.evict_policy == SPARSE_EVICT_LFU ? *rec_count(rec) : 0,
                .gen = walking && given_get(s, r) ? __atomic_load_n(&t->walk_gen, __ATOMIC_RELAXED) : 0,
                .flags = t->track && dirty_get(s, r) ? TIER_DIRTY : 0,
        };
        memcpy(buf, &h, sizeof(h));
        memcpy(buf + sizeof(h), rec_vals(t, rec), t->row_floats * sizeof(float));
        int rc = t->tops->put(t->tier, rec_id(rec), buf, t->tier_val_bytes);
        if (rc < 0) {
                __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                return rc;
        }
        row_free(t, s, r);
        __atomic_add_fetch(&t->tier_rows, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&t->tier_spills, 1, __ATOMIC_RELAXED);
        return 0;
}

/* What a full stripe evicts first: the smallest keys go (the touch for age and lru, the use count for
 * lfu). */
static inline uint32_t evict_key(const struct sparse_table *t, char *rec)
{
        return t->o.evict_policy == SPARSE_EVICT_LFU ? *rec_count(rec) : *rec_touch(rec);
}

/* The k-th smallest (0-based, k < n) of a[0..n), reordering a (quickselect, three-way partition). */
static uint32_t select_kth(uint32_t *a, size_t n, size_t k)
{
        size_t lo = 0, hi = n;   /* the k-th lies in a[lo..hi) */
        while (hi - lo > 1) {
                uint32_t p = a[lo + (hi - lo) / 2], x;
                size_t lt = lo, i = lo, gt = hi;
                while (i < gt) {
                        if (a[i] < p) {
                                x = a[lt], a[lt++] = a[i], a[i++] = x;
                        } else if (a[i] > p) {
                                x = a[--gt], a[gt] = a[i], a[i] = x;
                        } else {
                                i++;
                        }
                }
                if (k < lt)
                        hi = lt;
                else if (k >= gt)
                        lo = gt;
                else
                        return p;
        }
        return a[lo];
}

/* The eviction keys of s's live rows from row `from` on, into keys; returns how many. */
static size_t collect_keys(const struct sparse_table *t, const struct stripe *s, uint32_t from, uint32_t *keys)
{
        size_t n = 0;
        for (uint32_t r = from; r < s->used; r++) {
                char *rec = rec_at(t, s, r);
                if (*rec_touch(rec))
                        keys[n++] = evict_key(t, rec);
        }
        return n;
}

/* A full stripe (live >= max_live, locked) evicts about 1/32 of its rows, those with the smallest keys,
 * so that the scan is paid once per that many new rows; with a disk tier they move there instead.
 * 0, -ENOMEM (the scratch of keys), or the tier's -errno when not one row could be moved. */
static int stripe_make_room(struct sparse_table *t, struct stripe *s)
{
        size_t k = s->max_live / 32 ? s->max_live / 32 : 1;
        uint32_t *keys = malloc((size_t)s->live * sizeof(*keys));
        char *buf = t->tier ? malloc(t->tier_val_bytes) : NULL;
        if (!keys || (t->tier && !buf)) {
                free(keys);
                free(buf);
                return -ENOMEM;
        }
        /* while an export walks this stripe, the rows it has given stay: one evicted and made again
         * past the walk's place would be given twice (a checkpoint no import takes). Only when every
         * row is behind the walk (one abandoned there) do those go. */
        uint32_t from = s->walk_at;
        size_t n = collect_keys(t, s, from, keys);
        if (!n && from)
                n = collect_keys(t, s, from = 0, keys);
        uint32_t below = n ? select_kth(keys, n, k - 1 < n ? k - 1 : n - 1) : 0;
        free(keys);
        /* the rows with a key under the k-th smallest go, then rows at it until k went */
        size_t gone = 0;
        int err = 0;
        for (int pass = 0; pass < 2 && gone < k && !err; pass++)
                for (uint32_t r = from; r < s->used && gone < k; r++) {
                        char *rec = rec_at(t, s, r);
                        if (!*rec_touch(rec))
                                continue;
                        uint32_t key = evict_key(t, rec);
                        if (pass == 0 ? key >= below : key != below)
                                continue;
                        if (t->tier) {
                                if ((err = row_spill(t, s, r, buf)) < 0)
                                        break;   /* the disk fails: what is left stays in DRAM */
                        } else {
                                row_drop(t, s, r);
                        }
                        gone++;
                }
        free(buf);
        /* lfu: once the stripe has turned over, its counts are halved, so old fame fades */
        s->lfu_gone += (uint32_t)gone;
        if (t->o.evict_policy == SPARSE_EVICT_LFU && s->lfu_gone >= s->max_live) {
                s->lfu_gone = 0;
                for (uint32_t r = 0; r < s->used; r++) {
                        char *rec = rec_at(t, s, r);
                        if (*rec_touch(rec))
                                *rec_count(rec) >>= 1;
                }
        }
        if (!t->tier)
                __atomic_add_fetch(&t->evicted_limit, gone, __ATOMIC_RELAXED);
        return gone ? 0 : err;
}

/* The record of ids[i] (of a batch of n) with its stripe locked (*sp), made when missing as how says;
 * its last touch becomes step. NULL when missing and not made, with nothing locked; NULL and *err
 * -ENOMEM when out of memory.
 * With a disk tier (scratch: tier_val_bytes), a missing id is first looked for on disk; found, its row
 * comes back into DRAM as a new row would come. When it cannot (FIND, or no room because the disk
 * fails) the stored record is returned in scratch, unlocked, with *sp NULL: its floats are valid, not
 * its touch. A new row refused because the disk fails counts tier_refused (and grads_dropped when
 * push); NULL and *err -EIO when the disk cannot be read. */
static char *rec_locked(struct sparse_table *t, const uint64_t *ids, size_t i, size_t n, enum lookup how,
                        uint64_t step, struct stripe **sp, int *err, char *scratch, bool push)
{
        prefetch_index(t, ids, i, n);
        uint64_t id = ids[i];
        uint64_t h = stripe_hash(id);
        struct stripe *s = &t->stripes[stripe_of(h)];
        *sp = s;
        *err = 0;
        pthread_mutex_lock(&s->lock);
        bool found;
        uint32_t pos = index_find(t, s, id, h, &found);
        char *rec;
        if (found) {
                s->last_row = s->index[pos] - 1;
                rec = rec_at(t, s, s->last_row);
        } else {
                int64_t r = 0;
                bool from_disk = false;
                struct tier_hdr th = {0};
                if (t->tier && __atomic_load_n(&t->tier_rows, __ATOMIC_RELAXED)) {
                        int g = t->tops->get(t->tier, id, scratch, t->tier_val_bytes);
                        if (g < 0) {
                                __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                                pthread_mutex_unlock(&s->lock);
                                *err = -EIO;
                                return NULL;
                        }
                        from_disk = g == 1;
                        if (from_disk)
                                memcpy(&th, scratch, sizeof(th));
                }
                /* the record as seen through scratch: its floats where rec_vals looks (vals_off <= 16) */
                char *disk_rec = from_disk ? scratch + sizeof(struct tier_hdr) - t->vals_off : NULL;
                if (from_disk && how == FIND) {
                        pthread_mutex_unlock(&s->lock);
                        *sp = NULL;
                        return disk_rec;
                }
                if (from_disk) {
                        /* comes back into DRAM below */
                } else if (how == FIND)
                        r = -ENOENT;
                else if (how == EXISTING) {
                        __atomic_add_fetch(&t->grads_dropped, 1, __ATOMIC_RELAXED);
                        r = -ENOENT;
                } else if (how == ADMIT) {
                        if (cmsketch_add(t->sketch, id) < t->o.admit_after) {
                                __atomic_add_fetch(&t->admit_pending, 1, __ATOMIC_RELAXED);
                                r = -ENOENT;
                        } else {
                                __atomic_add_fetch(&t->admitted, 1, __ATOMIC_RELAXED);
                        }
                }
                if (r == 0 && s->max_live && s->live >= s->max_live) {
                        r = stripe_make_room(t, s);
                        pos = index_find(t, s, id, h, &found);
                        if (r < 0 && r != -ENOMEM && how != CREATE_BLANK) {
                                /* the disk fails: a row on disk stays there, a new row is not made */
                                pthread_mutex_unlock(&s->lock);
                                if (from_disk) {
                                        *sp = NULL;
                                        return disk_rec;
                                }
                                __atomic_add_fetch(&t->tier_refused, 1, __ATOMIC_RELAXED);
                                if (push)
                                        __atomic_add_fetch(&t->grads_dropped, 1, __ATOMIC_RELAXED);
                                return NULL;
                        }
                }
                /* with tracking, the bitmap covers a row before it is made, so that marking never fails */
                if (r == 0 && t->track && dirty_reserve(s) < 0)
                        r = -ENOMEM;
                if (r == 0 && t->tier && given_reserve(s) < 0)
                        r = -ENOMEM;
                if (r == 0)
                        r = row_new(t, s, id, h, pos);
                if (r < 0) {
                        pthread_mutex_unlock(&s->lock);
                        *err = r == -ENOENT ? 0 : (int)r;
                        return NULL;
                }
                rec = rec_at(t, s, (uint32_t)r);
                s->last_row = (uint32_t)r;
                if (from_disk) {
                        /* the row moves back with its state: its change mark, whether this walk gave it */
                        if (t->track && (th.flags & TIER_DIRTY))
                                dirty_set(s, (uint32_t)r);
                        given_put(s, (uint32_t)r, th.gen && th.gen == __atomic_load_n(&t->walk_gen, __ATOMIC_RELAXED));
                        if (t->o.evict_policy == SPARSE_EVICT_LFU)
                                *rec_count(rec) = th.count;
                        memcpy(rec_vals(t, rec), scratch + sizeof(th), t->row_floats * sizeof(float));
                        /* one copy counts: DRAM's from now. The disk copy is left (a write less per read;
                         * the next spill of the row overwrites it): a disk key whose id is in DRAM is
                         * stale, and every reader of the disk (walks, eviction by age) looks in DRAM
                         * first. It also lets a walk's disk part find a row that came back into a stripe
                         * the walk had passed: it gives DRAM's copy then. */
                        __atomic_sub_fetch(&t->tier_rows, 1, __ATOMIC_RELAXED);
                        __atomic_add_fetch(&t->tier_reads, 1, __ATOMIC_RELAXED);
                } else if (t->track) {
                        dirty_set(s, (uint32_t)r);
                }
                if (t->o.evict_policy == SPARSE_EVICT_LFU && !from_disk)
                        *rec_count(rec) = 0;
                if (how != CREATE_BLANK && !from_disk) {
                        sparse_table_init_row(t, id, rec_vals(t, rec));
                        slots_init(t, rec_vals(t, rec));
                }
        }
        *rec_touch(rec) = touch_of(step);
        if (t->o.evict_policy == SPARSE_EVICT_LFU && *rec_count(rec) < UINT32_MAX)
                (*rec_count(rec))++;
        return rec;
}

int sparse_table_pull(struct sparse_table *t, const uint64_t *ids, size_t n, float *rows, bool create,
                      uint64_t step)
{
        uint32_t dim = t->o.dim;
        enum lookup how = !create ? FIND : t->sketch ? ADMIT : CREATE;
        char *scratch = NULL;
        if (t->tier && !(scratch = malloc(t->tier_val_bytes)))
                return -ENOMEM;
        int rc = 0;
        for (size_t i = 0; i < n; i++) {
                struct stripe *s;
                float *out = rows + i * dim;
                char *rec = rec_locked(t, ids, i, n, how, step, &s, &rc, scratch, false);
                if (rc < 0)
                        break;
                if (!rec) {
                        sparse_table_init_row(t, ids[i], out);
                        continue;
                }
                memcpy(out, rec_vals(t, rec), dim * sizeof(float));
                if (s)
                        pthread_mutex_unlock(&s->lock);
        }
        free(scratch);
        return rc;
}

int sparse_table_push(struct sparse_table *t, const uint64_t *ids, size_t n, const float *g, float lr,
                      uint64_t step)
{
        const struct sparse_table_opts *o = &t->o;
        uint32_t dim = o->dim;
        enum lookup how = t->sketch ? EXISTING : CREATE;
        char *scratch = NULL;
        if (t->tier && !(scratch = malloc(t->tier_val_bytes)))
                return -ENOMEM;
        int rc = 0;
        for (size_t i = 0; i < n; i++) {
                struct stripe *s;
                char *rec = rec_locked(t, ids, i, n, how, step, &s, &rc, scratch, true);
                if (rc < 0)
                        break;
                if (!rec)
                        continue;
                if (!s) {   /* on disk and kept there: the disk fails */
                        __atomic_add_fetch(&t->grads_dropped, 1, __ATOMIC_RELAXED);
                        continue;
                }
                if (t->track)
                        dirty_set(s, s->last_row);   /* the bitmap covers every row made: cannot fail */
                float *w = rec_vals(t, rec);
                const float *gi = g + i * dim;
                switch (o->optimizer) {
                case SPARSE_SGD:
                        optim_sgd(w, gi, dim, lr);
                        break;
                case SPARSE_ADAGRAD:
                        optim_adagrad(w, gi, w + dim, dim, lr, (float)o->epsilon);
                        break;
                case SPARSE_FTRL:
                        optim_ftrl(w, gi, w + dim, w + 2 * (size_t)dim, dim, lr, (float)o->ftrl_l1,
                                   (float)o->ftrl_l2, (float)o->ftrl_beta, (float)o->ftrl_lr_power);
                        break;
                }
                pthread_mutex_unlock(&s->lock);
        }
        free(scratch);
        return rc;
}

/* The stripes' locks are the only mutable part of a const table. */
static size_t stripes_sum(const struct sparse_table *t, bool bytes)
{
        size_t n = 0;
        for (unsigned i = 0; i < N_STRIPES; i++) {
                struct stripe *s = (struct stripe *)&t->stripes[i];
                pthread_mutex_lock(&s->lock);
                n += bytes ? s->bytes : s->live;
                pthread_mutex_unlock(&s->lock);
        }
        return n;
}

size_t sparse_table_rows(const struct sparse_table *t)
{
        return stripes_sum(t, false);
}

size_t sparse_table_bytes(const struct sparse_table *t)
{
        return sizeof(*t) + (t->sketch ? cmsketch_bytes(t->sketch) : 0) + stripes_sum(t, true);
}

void sparse_table_get_stats(const struct sparse_table *t, struct sparse_table_stats *st)
{
        *st = (struct sparse_table_stats){
                .rows = sparse_table_rows(t), .bytes = sparse_table_bytes(t),
                .evicted_age = __atomic_load_n(&t->evicted_age, __ATOMIC_RELAXED),
                .evicted_limit = __atomic_load_n(&t->evicted_limit, __ATOMIC_RELAXED),
                .admitted = __atomic_load_n(&t->admitted, __ATOMIC_RELAXED),
                .admit_pending = __atomic_load_n(&t->admit_pending, __ATOMIC_RELAXED),
                .grads_dropped = __atomic_load_n(&t->grads_dropped, __ATOMIC_RELAXED),
                .tier_rows = __atomic_load_n(&t->tier_rows, __ATOMIC_RELAXED),
                .tier_bytes = t->tier ? t->tops->bytes(t->tier) : 0,
                .tier_reads = __atomic_load_n(&t->tier_reads, __ATOMIC_RELAXED),
                .tier_spills = __atomic_load_n(&t->tier_spills, __ATOMIC_RELAXED),
                .tier_errors = __atomic_load_n(&t->tier_errors, __ATOMIC_RELAXED),
                .tier_refused = __atomic_load_n(&t->tier_refused, __ATOMIC_RELAXED),
        };
}

struct sparse_tier *sparse_table_tier(struct sparse_table *t)
{
        return t->tier;
}

void sparse_table_tier_error(struct sparse_table *t, char *buf, size_t len)
{
        if (t->tier)
                t->tops->last_error(t->tier, buf, len);
        else if (len)
                buf[0] = 0;
}

/* The bytes of one stripe holding up to c rows, as add_chunk, index_grow and the chunk table count them. */
static uint64_t stripe_bytes_for(const struct sparse_table *t, uint64_t c)
{
        if (!c)
                return 0;
        if (c > ROWS_MAX)   /* a stripe holds no more (a plan of a vocab past what a shard can hold) */
                c = ROWS_MAX;
        uint64_t n = 0, bytes = 0;
        while (n <= t->geo_k && rows_in_chunks(t, (uint32_t)n) < c) {   /* the doubling chunks */
                bytes += (chunk_rows(t, (uint32_t)n) * t->rec_bytes + 63) & ~(uint64_t)63;
                n++;
        }
        if (c > t->geo_rows) {   /* then full chunks, as many as the rest needs */
                uint64_t full = (c - t->geo_rows + ((uint64_t)1 << t->max_shift) - 1) >> t->max_shift;
                bytes += full * ((((uint64_t)1 << t->max_shift) * t->rec_bytes + 63) & ~(uint64_t)63);
                n += full;
        }
        uint64_t chunks_cap = 8;
        while (chunks_cap < n)
                chunks_cap *= 2;
        uint64_t cap = INDEX_MIN;
        while (c * 4 > cap * 3)
                cap *= 2;
        return bytes + chunks_cap * sizeof(char *) + cap * sizeof(uint32_t);
}

uint64_t sparse_table_bytes_for(const struct sparse_table_opts *o, uint64_t rows)
{
        /* the layout of a table of o, without its stripes' memory */
        struct sparse_table *t = NULL;
        struct sparse_table_opts q = *o;
        q.max_rows = 0;
        q.admit_after = 0;
        if (sparse_table_new(&q, &t) < 0)
                return 0;
        uint64_t bytes = sizeof(*t) +
                         (o->admit_after > 1 ? cmsketch_bytes_for(SPARSE_SKETCH_WIDTH_LOG2, SPARSE_SKETCH_DEPTH) : 0);
        /* the first stripes' shares are one row larger: count those at their share and the rest at theirs */
        uint64_t big = rows % N_STRIPES;
        bytes += big * stripe_bytes_for(t, rows / N_STRIPES + 1) + (N_STRIPES - big) * stripe_bytes_for(t, rows / N_STRIPES);
        sparse_table_free(t);
        return bytes;
}

uint64_t sparse_table_rows_within(const struct sparse_table_opts *o, uint64_t bytes)
{
        if (sparse_table_bytes_for(o, SPARSE_MIN_MAX_ROWS) > bytes)
                return 0;
        uint64_t lo = SPARSE_MIN_MAX_ROWS, hi = (uint64_t)ROWS_MAX * N_STRIPES;
        while (lo < hi) {   /* bytes_for grows with rows: the largest rows that fit */
                uint64_t mid = lo + (hi - lo + 1) / 2;
                if (sparse_table_bytes_for(o, mid) <= bytes)
                        lo = mid;
                else
                        hi = mid - 1;
        }
        return lo;
}

/* Removes the rows on disk last touched before `before` (sparse_table_evict's rule). Returns how many. */
static size_t tier_evict(struct sparse_table *t, uint64_t before)
{
        if (!__atomic_load_n(&t->tier_rows, __ATOMIC_RELAXED))
                return 0;
        struct sparse_tier_iter *it;
        char *buf = malloc(t->tier_val_bytes);
        if (!buf || t->tops->iter_new(t->tier, &it) < 0) {
                free(buf);
                return 0;
        }
        size_t evicted = 0;
        uint64_t id;
        const void *val;
        size_t len;
        while (t->tops->iter_next(it, &id, &val, &len)) {
                struct tier_hdr h;
                if (len != t->tier_val_bytes)
                        continue;
                memcpy(&h, val, sizeof(h));
                if (h.touch == 0 || h.touch == UINT32_MAX || (uint64_t)(h.touch - 1) >= before)
                        continue;
                uint64_t hh = stripe_hash(id);
                struct stripe *s = &t->stripes[stripe_of(hh)];
                pthread_mutex_lock(&s->lock);
                bool found;
                index_find(t, s, id, hh, &found);
                /* under the lock, as it is now: a row back in DRAM is DRAM's (sparse_table_evict's pass) */
                int g = found ? 0 : t->tops->get(t->tier, id, buf, t->tier_val_bytes);
                if (g == 1) {
                        memcpy(&h, buf, sizeof(h));
                        if (h.touch != 0 && h.touch != UINT32_MAX && (uint64_t)(h.touch - 1) < before) {
                                if (t->tops->del(t->tier, id) < 0) {
                                        __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                                } else {
                                        if (t->track)
                                                gone_add(t, s, id);
                                        __atomic_sub_fetch(&t->tier_rows, 1, __ATOMIC_RELAXED);
                                        evicted++;
                                }
                        }
                } else if (g < 0) {
                        __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                }
                pthread_mutex_unlock(&s->lock);
        }
        if (t->tops->iter_error(it) < 0)
                __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
        t->tops->iter_free(it);
        free(buf);
        return evicted;
}

size_t sparse_table_evict(struct sparse_table *t, uint64_t now, uint64_t after)
{
        if (after == 0 || now < after)
                return 0;
        uint64_t before = now - after;
        size_t evicted = 0;
        for (unsigned si = 0; si < N_STRIPES; si++) {
                struct stripe *s = &t->stripes[si];
                pthread_mutex_lock(&s->lock);
                for (uint32_t r = 0; r < s->used; r++) {
                        char *rec = rec_at(t, s, r);
                        uint32_t touch = *rec_touch(rec);
                        /* a saturated touch (step >= 2^32 - 2) is of unknown age: kept */
                        if (touch == 0 || touch == UINT32_MAX || (uint64_t)(touch - 1) >= before)
                                continue;
                        /* its stale copy on disk goes too (a row read back leaves one) */
                        if (t->tier && t->tops->del(t->tier, rec_id(rec)) < 0)
                                __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                        row_drop(t, s, r);
                        evicted++;
                }
                pthread_mutex_unlock(&s->lock);
        }
        if (t->tier)
                evicted += tier_evict(t, before);
        __atomic_add_fetch(&t->evicted_age, evicted, __ATOMIC_RELAXED);
        return evicted;
}

size_t sparse_table_export(struct sparse_table *t, uint64_t *cursor, size_t max, uint64_t *ids, float *values,
                           float *slots)
{
        return sparse_table_export_changes(t, cursor, max, ids, values, slots, false, false);
}

int sparse_table_import(struct sparse_table *t, const uint64_t *ids, size_t n, const float *values,
                        const float *slots, uint64_t step)
{
        uint32_t dim = t->o.dim;
        char *scratch = NULL;
        if (t->tier && !(scratch = malloc(t->tier_val_bytes)))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct stripe *s;
                int err;
                char *rec = rec_locked(t, ids, i, n, CREATE_BLANK, step, &s, &err, scratch, false);
                if (!rec) {
                        free(scratch);
                        return err;
                }
                if (t->track)
                        dirty_set(s, s->last_row);
                float *row = rec_vals(t, rec);
                memcpy(row, values + i * dim, dim * sizeof(float));
                if (slots) {
                        for (unsigned sl = 0; sl < t->n_slots; sl++)
                                memcpy(row + (size_t)(1 + sl) * dim, slots + (sl * n + i) * dim,
                                       dim * sizeof(float));
                } else {
                        slots_init(t, row);
                }
                pthread_mutex_unlock(&s->lock);
        }
        free(scratch);
        return 0;
}

void sparse_table_clear(struct sparse_table *t)
{
        for (unsigned i = 0; i < N_STRIPES; i++) {
                struct stripe *s = &t->stripes[i];
                pthread_mutex_lock(&s->lock);
                stripe_release(s);
                pthread_mutex_unlock(&s->lock);
        }
        if (t->tier) {
                pthread_mutex_lock(&t->walk_lock);
                t->walk_it = t->tops->iter_free(t->walk_it);
                __atomic_store_n(&t->walking, false, __ATOMIC_RELAXED);
                if (t->tops->clear(t->tier) < 0)
                        __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                __atomic_store_n(&t->tier_rows, 0, __ATOMIC_RELAXED);
                pthread_mutex_unlock(&t->walk_lock);
        }
}

void sparse_table_track(struct sparse_table *t, bool on)
{
        t->track = on;
}

/* A walk's cursor: DRAM's part is (stripe << 32 | row); the disk part sets TIER_PHASE and counts the
 * keys its iterator has passed; TIER_DONE: the walk has ended. */
#define TIER_PHASE (1ull << 63)
#define TIER_DONE UINT64_MAX

/* Writes one row as the n-th of a page (sparse_table_export's layout). */
static void give_row(const struct sparse_table *t, const float *row, uint64_t id, size_t n, size_t max,
                     uint64_t *ids, float *values, float *slots)
{
        uint32_t dim = t->o.dim;
        ids[n] = id;
        memcpy(values + n * dim, row, dim * sizeof(float));
        for (unsigned sl = 0; slots && sl < t->n_slots; sl++)
                memcpy(slots + (sl * max + n) * dim, row + (size_t)(1 + sl) * dim, dim * sizeof(float));
}

/* A new walk (walk_lock held): nothing given yet. */
static void walk_start(struct sparse_table *t)
{
        t->walk_it = t->tops->iter_free(t->walk_it);
        t->walk_seq = 0;
        uint32_t gen = t->walk_gen + 1 ? t->walk_gen + 1 : 1;
        for (unsigned i = 0; i < N_STRIPES; i++) {
                struct stripe *s = &t->stripes[i];
                pthread_mutex_lock(&s->lock);
                if (s->given)
                        memset(s->given, 0, s->given_words * sizeof(*s->given));
                pthread_mutex_unlock(&s->lock);
        }
        __atomic_store_n(&t->walk_gen, gen, __ATOMIC_RELAXED);
        __atomic_store_n(&t->walking, true, __ATOMIC_RELAXED);
}

/* The disk part of a walk: id, met by its iterator (walk_lock held). Gives the row, DRAM's copy when it
 * is back there, unless this walk gave it or (dirty_only) it is unchanged. 1 given, 0 not. */
static int walk_disk_row(struct sparse_table *t, uint64_t id, size_t n, size_t max, uint64_t *ids,
                         float *values, float *slots, bool dirty_only, bool clean, char *buf)
{
        uint64_t hh = stripe_hash(id);
        struct stripe *s = &t->stripes[stripe_of(hh)];
        int given = 0;
        pthread_mutex_lock(&s->lock);
        bool found;
        uint32_t pos = index_find(t, s, id, hh, &found);
        if (found) {
                uint32_t r = s->index[pos] - 1;
                if (!given_get(s, r) && (!dirty_only || dirty_get(s, r))) {
                        char *rec = rec_at(t, s, r);
                        give_row(t, rec_vals(t, rec), id, n, max, ids, values, slots);
                        given_put(s, r, true);
                        if (clean)
                                dirty_clear(s, r);
                        given = 1;
                }
        } else {
                /* the row as it is now, not as the snapshot saw it: it may have moved meanwhile */
                int g = t->tops->get(t->tier, id, buf, t->tier_val_bytes);
                struct tier_hdr h = {0};
                if (g == 1)
                        memcpy(&h, buf, sizeof(h));
                if (g < 0) {
                        __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                } else if (g == 1 && h.gen != t->walk_gen && (!dirty_only || (h.flags & TIER_DIRTY))) {
                        give_row(t, (const float *)(const void *)(buf + sizeof(h)), id, n, max, ids, values, slots);
                        given = 1;
                        if (clean && (h.flags & TIER_DIRTY)) {
                                h.flags &= ~TIER_DIRTY;
                                h.gen = t->walk_gen;
                                memcpy(buf, &h, sizeof(h));
                                /* failing, the mark stays: the row comes again in the next increment */
                                if (t->tops->put(t->tier, id, buf, t->tier_val_bytes) < 0)
                                        __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                        }
                }
        }
        pthread_mutex_unlock(&s->lock);
        return given;
}

/* The disk part of a walk from seq keys on, into the page from its n-th row (walk_lock held). Returns
 * the page's rows; *cursor set. */
static size_t walk_disk(struct sparse_table *t, uint64_t *cursor, uint64_t seq, size_t n, size_t max,
                        uint64_t *ids, float *values, float *slots, bool dirty_only, bool clean)
{
        char *buf = malloc(t->tier_val_bytes);
        if (!buf) {
                __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                *cursor = TIER_PHASE | seq;   /* the caller may try the page again */
                return n;
        }
        uint64_t id;
        const void *val;
        size_t len;
        if (!t->walk_it || t->walk_seq != seq) {
                /* another walk's iterator, or this one's page asked again: a fresh snapshot, from seq */
                t->walk_it = t->tops->iter_free(t->walk_it);
                if (t->tops->iter_new(t->tier, &t->walk_it) < 0) {
                        __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                        free(buf);
                        *cursor = TIER_PHASE | seq;
                        return n;
                }
                for (t->walk_seq = 0; t->walk_seq < seq && t->tops->iter_next(t->walk_it, &id, &val, &len);)
                        t->walk_seq++;
        }
        bool more = true;
        while (n < max && (more = t->tops->iter_next(t->walk_it, &id, &val, &len))) {
                t->walk_seq++;
                n += (size_t)walk_disk_row(t, id, n, max, ids, values, slots, dirty_only, clean, buf);
        }
        free(buf);
        if (!more) {
                if (t->tops->iter_error(t->walk_it) < 0)
                        __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                t->walk_it = t->tops->iter_free(t->walk_it);
                __atomic_store_n(&t->walking, false, __ATOMIC_RELAXED);
                *cursor = TIER_DONE;
        } else {
                *cursor = TIER_PHASE | t->walk_seq;
        }
        return n;
}

size_t sparse_table_export_changes(struct sparse_table *t, uint64_t *cursor, size_t max, uint64_t *ids,
                                   float *values, float *slots, bool dirty_only, bool clean)
{
        size_t n = 0;
        if (t->tier) {
                pthread_mutex_lock(&t->walk_lock);
                if (*cursor == 0)
                        walk_start(t);
                if (*cursor == TIER_DONE) {
                        pthread_mutex_unlock(&t->walk_lock);
                        return 0;
                }
                if (*cursor & TIER_PHASE) {
                        n = walk_disk(t, cursor, *cursor & ~TIER_PHASE, 0, max, ids, values, slots, dirty_only, clean);
                        pthread_mutex_unlock(&t->walk_lock);
                        return n;
                }
        }
        uint64_t si = *cursor >> 32;
        uint32_t r = (uint32_t)*cursor;
        while (n < max && si < N_STRIPES) {
                struct stripe *s = &t->stripes[si];
                pthread_mutex_lock(&s->lock);
                for (; r < s->used && n < max; r++) {
                        if (dirty_only && !dirty_get(s, r)) {
                                /* the bitmap first: 64 unchanged rows are one word, their records untouched */
                                if (r % 64 == 0 && (r / 64 >= s->dirty_words || !s->dirty[r / 64]))
                                        r += 63;
                                continue;
                        }
                        char *rec = rec_at(t, s, r);
                        if (!*rec_touch(rec) || (t->tier && given_get(s, r)))
                                continue;
                        if (clean)
                                dirty_clear(s, r);
                        if (t->tier)
                                given_put(s, r, true);
                        give_row(t, rec_vals(t, rec), rec_id(rec), n, max, ids, values, slots);
                        n++;
                }
                bool done = r >= s->used;
                s->walk_at = done ? 0 : r;   /* the rows below r are given: kept from eviction at the bound */
                pthread_mutex_unlock(&s->lock);
                if (done) {
                        si++;
                        r = 0;
                }
        }
        *cursor = si << 32 | r;
        if (t->tier) {
                if (si >= N_STRIPES && n < max)
                        n = walk_disk(t, cursor, 0, n, max, ids, values, slots, dirty_only, clean);
                pthread_mutex_unlock(&t->walk_lock);
        }
        return n;
}

int sparse_table_take_evicted(struct sparse_table *t, uint64_t **ids_ret, size_t *n_ret)
{
        size_t n = 0;
        uint64_t *ids = NULL;
        int r = 0;
        for (unsigned i = 0; i < N_STRIPES; i++) {
                struct stripe *s = &t->stripes[i];
                pthread_mutex_lock(&s->lock);
                if (s->n_gone) {
                        uint64_t *grown = realloc(ids, (n + s->n_gone) * sizeof(*ids));
                        if (grown) {
                                ids = grown;
                                memcpy(ids + n, s->gone, s->n_gone * sizeof(*ids));
                                n += s->n_gone;
                        } else {
                                r = -ENOMEM;
                        }
                        s->n_gone = 0;
                }
                pthread_mutex_unlock(&s->lock);
        }
        if (__atomic_exchange_n(&t->changes_lost, false, __ATOMIC_RELAXED))
                r = -ENOMEM;
        if (r < 0) {
                free(ids);
                return r;
        }
        *ids_ret = ids;
        *n_ret = n;
        return 0;
}
