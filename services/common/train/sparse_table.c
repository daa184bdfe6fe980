/* An embedding table on a ps shard: 64 lock stripes, each an open-addressing index of 32-bit row
 * numbers over rows kept in chunks that never move; rows start as a function of (seed, id) alone. */
#include "sparse_table.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"
#include "rng.h"

#define STRIPE_BITS 6
#define N_STRIPES (1u << STRIPE_BITS)
#define FIRST_CHUNK_SHIFT 4          /* the first chunk of a stripe holds 16 rows */
#define CHUNK_BYTES_MAX (1u << 20)   /* chunks double up to about this size, then stay there */
#define INDEX_MIN 16u
#define INIT_SALT 0x5bd1e9955bd1e995ULL
/* A row number is stored as row + 1 (0: an empty index slot), and a stripe's index of 2^31 slots
 * holds at most 3/4 of that. */
#define ROWS_MAX (UINT32_MAX / 2u)

/* One allocation: ids[cap], touch[cap], then vals[cap][row_floats] at a 64-byte boundary. Untouched
 * tails are never written, so a fresh chunk costs no resident memory until its rows are used. */
struct chunk {
        uint64_t *ids;     /* the row's id; a free row's next free row + 1 */
        uint32_t *touch;   /* last touched step + 1, saturating; 0: a free row */
        float *vals;       /* (cap, dim * (1 + slots)): the row, then each slot */
};

struct stripe {
        pthread_mutex_t lock;
        uint32_t *index;   /* (cap) row + 1 or 0; linear probing, deletions shift back */
        uint32_t cap;      /* index slots: 0 or a power of two */
        uint32_t live;     /* rows in the index */
        uint32_t used;     /* rows handed out, live or free: the next new row number */
        uint32_t free_head; /* row + 1 of the first free row, 0: none */
        struct chunk *chunks;
        uint32_t n_chunks, chunks_cap;
        size_t bytes;      /* index, chunk table and chunks */
} __attribute__((aligned(64)));

struct sparse_table {
        struct sparse_table_opts o;
        unsigned n_slots;
        size_t row_floats;             /* dim * (1 + n_slots) */
        unsigned geo_k;                /* chunks 0..geo_k double in size; later ones are max_rows */
        unsigned max_shift;            /* log2(rows of a full chunk) */
        uint64_t geo_rows;             /* rows in chunks 0..geo_k */
        struct stripe stripes[N_STRIPES];
};

const char *sparse_optimizer_name(enum sparse_optimizer o)
{
        switch (o) {
        case SPARSE_SGD: return "sgd";
        case SPARSE_ADAGRAD: return "adagrad";
        case SPARSE_FTRL: return "ftrl";
        }
        return "?";
}

unsigned sparse_optimizer_n_slots(enum sparse_optimizer o)
{
        switch (o) {
        case SPARSE_SGD: return 0;
        case SPARSE_ADAGRAD: return 1;
        case SPARSE_FTRL: return 2;
        }
        return 0;
}

const char *sparse_optimizer_slot_name(enum sparse_optimizer o, unsigned slot)
{
        if (slot >= sparse_optimizer_n_slots(o))
                return NULL;
        if (o == SPARSE_ADAGRAD)
                return "accumulator";
        return slot == 0 ? "accum" : "linear";
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
        uint64_t z = id + 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
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

static inline float *row_vals(const struct sparse_table *t, const struct stripe *s, uint32_t r, uint64_t **id,
                              uint32_t **touch)
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
        const struct chunk *c = &s->chunks[k];
        if (id)
                *id = &c->ids[off];
        if (touch)
                *touch = &c->touch[off];
        return c->vals + off * t->row_floats;
}

static size_t chunk_alloc_bytes(const struct sparse_table *t, uint64_t rows, size_t *vals_at)
{
        size_t head = (size_t)rows * (sizeof(uint64_t) + sizeof(uint32_t));
        *vals_at = (head + 63) & ~(size_t)63;
        size_t total = *vals_at + (size_t)rows * t->row_floats * sizeof(float);
        return (total + 63) & ~(size_t)63;
}

static int add_chunk(const struct sparse_table *t, struct stripe *s)
{
        if (s->n_chunks == s->chunks_cap) {
                uint32_t ncap = s->chunks_cap ? 2 * s->chunks_cap : 8;
                struct chunk *nc = realloc(s->chunks, ncap * sizeof(*nc));
                if (!nc)
                        return -ENOMEM;
                s->bytes += (ncap - s->chunks_cap) * sizeof(*nc);
                s->chunks = nc;
                s->chunks_cap = ncap;
        }
        uint64_t rows = chunk_rows(t, s->n_chunks);
        size_t vals_at, bytes = chunk_alloc_bytes(t, rows, &vals_at);
        char *mem = aligned_alloc(64, bytes);
        if (!mem)
                return -ENOMEM;
        s->chunks[s->n_chunks++] = (struct chunk){.ids = (uint64_t *)mem,
                                                  .touch = (uint32_t *)(mem + rows * sizeof(uint64_t)),
                                                  .vals = (float *)(mem + vals_at)};
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
                uint64_t *rid;
                row_vals(t, s, e - 1, &rid, NULL);
                if (*rid == id) {
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
                uint64_t *rid;
                row_vals(t, s, e - 1, &rid, NULL);
                uint32_t pos = (uint32_t)stripe_hash(*rid) & mask;
                while (ni[pos])
                        pos = (pos + 1) & mask;
                ni[pos] = e;
        }
        free(s->index);
        s->bytes = s->bytes - (size_t)s->cap * sizeof(uint32_t) + (size_t)ncap * sizeof(uint32_t);
        s->index = ni;
        s->cap = ncap;
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
        uint64_t *rid;
        if (s->free_head) {
                r = s->free_head - 1;
                row_vals(t, s, r, &rid, NULL);
                s->free_head = (uint32_t)*rid;
        } else {
                if (s->used == rows_in_chunks(t, s->n_chunks)) {
                        int rc = add_chunk(t, s);
                        if (rc < 0)
                                return rc;
                }
                r = s->used++;
                row_vals(t, s, r, &rid, NULL);
        }
        *rid = id;
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
                uint64_t *rid;
                row_vals(t, s, s->index[i] - 1, &rid, NULL);
                uint32_t home = (uint32_t)stripe_hash(*rid) & mask;
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

int sparse_table_new(const struct sparse_table_opts *o, struct sparse_table **ret)
{
        if (!o || o->dim < 1 || o->dim > 1024 ||
            (o->optimizer != SPARSE_SGD && o->optimizer != SPARSE_ADAGRAD && o->optimizer != SPARSE_FTRL) ||
            !(o->init_stddev >= 0 && isfinite(o->init_stddev)) ||
            !(o->initial_accumulator >= 0 && isfinite(o->initial_accumulator)) ||
            !(o->epsilon >= 0 && isfinite(o->epsilon)))
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
        size_t row_bytes = t->row_floats * sizeof(float) + sizeof(uint64_t) + sizeof(uint32_t);
        unsigned max_shift = FIRST_CHUNK_SHIFT;
        while (((size_t)2 << max_shift) * row_bytes <= CHUNK_BYTES_MAX)
                max_shift++;
        t->max_shift = max_shift;
        t->geo_k = max_shift - FIRST_CHUNK_SHIFT;
        t->geo_rows = (((uint64_t)1 << (t->geo_k + 1)) - 1) << FIRST_CHUNK_SHIFT;
        for (unsigned i = 0; i < N_STRIPES; i++)
                pthread_mutex_init(&t->stripes[i].lock, NULL);
        *ret = t;
        return 0;
}

static void stripe_release(struct stripe *s)
{
        for (uint32_t k = 0; k < s->n_chunks; k++)
                free(s->chunks[k].ids);
        free(s->chunks);
        free(s->index);
        s->chunks = NULL;
        s->index = NULL;
        s->n_chunks = s->chunks_cap = s->cap = s->live = s->used = s->free_head = 0;
        s->bytes = 0;
}

struct sparse_table *sparse_table_free(struct sparse_table *t)
{
        if (!t)
                return NULL;
        for (unsigned i = 0; i < N_STRIPES; i++) {
                stripe_release(&t->stripes[i]);
                pthread_mutex_destroy(&t->stripes[i].lock);
        }
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

/* The row of id locked in its stripe, made (initialized) when missing and create. Returns its values
 * with the stripe locked, NULL with it unlocked when missing and !create; *err: -ENOMEM. */
static float *row_locked(struct sparse_table *t, uint64_t id, bool create, uint64_t step, struct stripe **sp,
                         int *err)
{
        uint64_t h = stripe_hash(id);
        struct stripe *s = &t->stripes[stripe_of(h)];
        *sp = s;
        *err = 0;
        pthread_mutex_lock(&s->lock);
        bool found;
        uint32_t pos = index_find(t, s, id, h, &found);
        float *row;
        uint32_t *touch;
        if (found) {
                row = row_vals(t, s, s->index[pos] - 1, NULL, &touch);
        } else {
                int64_t r = create ? row_new(t, s, id, h, pos) : -ENOENT;
                if (r < 0) {
                        pthread_mutex_unlock(&s->lock);
                        *err = r == -ENOENT ? 0 : (int)r;
                        return NULL;
                }
                row = row_vals(t, s, (uint32_t)r, NULL, &touch);
                sparse_table_init_row(t, id, row);
                slots_init(t, row);
        }
        *touch = touch_of(step);
        return row;
}

int sparse_table_pull(struct sparse_table *t, const uint64_t *ids, size_t n, float *rows, bool create,
                      uint64_t step)
{
        uint32_t dim = t->o.dim;
        for (size_t i = 0; i < n; i++) {
                struct stripe *s;
                int err;
                float *out = rows + i * dim;
                const float *row = row_locked(t, ids[i], create, step, &s, &err);
                if (err < 0)
                        return err;
                if (!row) {
                        sparse_table_init_row(t, ids[i], out);
                        continue;
                }
                memcpy(out, row, dim * sizeof(float));
                pthread_mutex_unlock(&s->lock);
        }
        return 0;
}

int sparse_table_push(struct sparse_table *t, const uint64_t *ids, size_t n, const float *g, float lr,
                      uint64_t step)
{
        const struct sparse_table_opts *o = &t->o;
        uint32_t dim = o->dim;
        for (size_t i = 0; i < n; i++) {
                struct stripe *s;
                int err;
                float *w = row_locked(t, ids[i], true, step, &s, &err);
                if (!w)
                        return err;
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
        return 0;
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
        return sizeof(*t) + stripes_sum(t, true);
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
                        uint64_t *rid;
                        uint32_t *touch;
                        row_vals(t, s, r, &rid, &touch);
                        /* a saturated touch (step >= 2^32 - 2) is of unknown age: kept */
                        if (*touch == 0 || *touch == UINT32_MAX || (uint64_t)(*touch - 1) >= before)
                                continue;
                        bool found;
                        uint32_t pos = index_find(t, s, *rid, stripe_hash(*rid), &found);
                        assert(found);
                        index_remove(t, s, pos);
                        *touch = 0;
                        *rid = s->free_head;
                        s->free_head = r + 1;
                        evicted++;
                }
                pthread_mutex_unlock(&s->lock);
        }
        return evicted;
}

size_t sparse_table_export(struct sparse_table *t, uint64_t *cursor, size_t max, uint64_t *ids, float *values,
                           float *slots)
{
        uint32_t dim = t->o.dim;
        size_t n = 0;
        uint64_t si = *cursor >> 32;
        uint32_t r = (uint32_t)*cursor;
        while (n < max && si < N_STRIPES) {
                struct stripe *s = &t->stripes[si];
                pthread_mutex_lock(&s->lock);
                for (; r < s->used && n < max; r++) {
                        uint64_t *rid;
                        uint32_t *touch;
                        const float *row = row_vals(t, s, r, &rid, &touch);
                        if (!*touch)
                                continue;
                        ids[n] = *rid;
                        memcpy(values + n * dim, row, dim * sizeof(float));
                        for (unsigned sl = 0; slots && sl < t->n_slots; sl++)
                                memcpy(slots + (sl * max + n) * dim, row + (size_t)(1 + sl) * dim,
                                       dim * sizeof(float));
                        n++;
                }
                bool done = r >= s->used;
                pthread_mutex_unlock(&s->lock);
                if (done) {
                        si++;
                        r = 0;
                }
        }
        *cursor = si << 32 | r;
        return n;
}

int sparse_table_import(struct sparse_table *t, const uint64_t *ids, size_t n, const float *values,
                        const float *slots, uint64_t step)
{
        uint32_t dim = t->o.dim;
        for (size_t i = 0; i < n; i++) {
                uint64_t h = stripe_hash(ids[i]);
                struct stripe *s = &t->stripes[stripe_of(h)];
                pthread_mutex_lock(&s->lock);
                bool found;
                uint32_t pos = index_find(t, s, ids[i], h, &found);
                int64_t r = found ? (int64_t)s->index[pos] - 1 : row_new(t, s, ids[i], h, pos);
                if (r < 0) {
                        pthread_mutex_unlock(&s->lock);
                        return (int)r;
                }
                uint32_t *touch;
                float *row = row_vals(t, s, (uint32_t)r, NULL, &touch);
                memcpy(row, values + i * dim, dim * sizeof(float));
                if (slots) {
                        for (unsigned sl = 0; sl < t->n_slots; sl++)
                                memcpy(row + (size_t)(1 + sl) * dim, slots + (sl * n + i) * dim,
                                       dim * sizeof(float));
                } else {
                        slots_init(t, row);
                }
                *touch = touch_of(step);
                pthread_mutex_unlock(&s->lock);
        }
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
}
