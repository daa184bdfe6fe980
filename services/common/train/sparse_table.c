/* An embedding table on a ps shard: 64 lock stripes, each an open-addressing index of 32-bit row
 * numbers over rows kept in chunks that never move; rows start as a function of (seed, id) alone.
 * This is the hash table and its pull, push and import; the bound, the walk with its change tracking
 * and the disk tier are in sparse_table_bounds.c, sparse_table_changes.c and sparse_table_tier.c. */
#include "sparse_table-internal.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cmsketch.h"
#include "optim.h"
#include "rng.h"
#include "sparse_tier.h"

#define CHUNK_BYTES_MAX (1u << 20)   /* chunks double up to about this size, then stay there */
#define INDEX_MIN 16u
#define INIT_SALT 0x5bd1e9955bd1e995ULL
/* A row number is stored as row + 1 (0: an empty index slot); a stripe's index stops at 2^31 slots,
 * filled at most 3/4. */
#define ROWS_MAX (3u << 29)

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

uint32_t sparse_shard_of(uint64_t id, uint32_t n_shards)
{
        uint64_t z = rng_splitmix64(&id);
        /* multiply-shift: the bias is at most n_shards / 2^32 */
        return (uint32_t)(((z >> 32) * (uint64_t)n_shards) >> 32);
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

uint32_t sparse_table_index_find(const struct sparse_table *t, const struct stripe *s, uint64_t id, uint64_t h,
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
                pos = sparse_table_index_find(t, s, id, h, &found);
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

void sparse_table_row_free(struct sparse_table *t, struct stripe *s, uint32_t r)
{
        char *rec = rec_at(t, s, r);
        bool found;
        uint64_t id = rec_id(rec);
        uint32_t pos = sparse_table_index_find(t, s, id, stripe_hash(id), &found);
        assert(found);
        index_remove(t, s, pos);
        if (t->track)
                dirty_clear(s, r);
        given_put(s, r, false);
        *rec_touch(rec) = 0;
        rec_set_id(rec, s->free_head);
        s->free_head = r + 1;
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
                int r = sparse_table_tier_open(t, o->tier_dir);
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
        free(s->events);
        free(s->given);
        s->dirty = s->gone = s->given = NULL;
        s->events = NULL;
        s->dirty_words = s->given_words = 0;
        s->n_gone = s->gone_cap = s->n_events = s->events_cap = 0;
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
        sparse_table_tier_close(t);
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

enum lookup {
        FIND,
        CREATE,
        CREATE_BLANK,   /* the caller writes the row and slots */
        ADMIT,          /* CREATE once the sketch has seen the id admit_after times; else as FIND */
        EXISTING,       /* as FIND, for a push under admission: a missing id's gradient is dropped */
};

/* The record of ids[i] (of a batch of n) with its stripe locked (*sp), made when missing as how says;
 * its last touch becomes step. NULL when missing and not made, with nothing locked; NULL and *err
 * -ENOMEM when out of memory.
 * With a disk tier (scratch: tier_val_bytes), a missing id is first looked for on disk; found, its row
 * comes back into DRAM as a new row would come. When it cannot (FIND, or no room because the disk
 * fails) the stored record is returned in scratch, unlocked, with *sp NULL: its floats are valid, not
 * its touch. A new row refused because the disk fails counts tier_refused (and grads_dropped when
 * push); NULL and *err -EIO when the disk cannot be read. */
static char *rec_locked(struct sparse_table *t, const uint64_t *ids, size_t i, size_t n, enum lookup how,
                        uint64_t step, struct stripe **sp, int *err, char *scratch, bool push, bool *stored)
{
        prefetch_index(t, ids, i, n);
        uint64_t id = ids[i];
        uint64_t h = stripe_hash(id);
        struct stripe *s = &t->stripes[stripe_of(h)];
        *sp = s;
        *err = 0;
        pthread_mutex_lock(&s->lock);
        bool found;
        uint32_t pos = sparse_table_index_find(t, s, id, h, &found);
        char *rec;
        if (stored)
                *stored = found;
        if (found) {
                s->last_row = s->index[pos] - 1;
                rec = rec_at(t, s, s->last_row);
        } else {
                int64_t r = 0;
                struct tier_hdr th = {0};
                int g = sparse_table_tier_read(t, id, scratch, &th);
                if (g < 0) {
                        pthread_mutex_unlock(&s->lock);
                        *err = g;
                        return NULL;
                }
                bool from_disk = g == 1;
                if (stored)
                        *stored = from_disk;
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
                } else if (how == ADMIT && !sparse_table_admit(t, id)) {
                        r = -ENOENT;
                }
                if (r == 0 && s->max_live && s->live >= s->max_live) {
                        r = sparse_table_make_room(t, s);
                        pos = sparse_table_index_find(t, s, id, h, &found);
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
                if (!from_disk)
                        sparse_table_event(t, s, id, SPARSE_MADE);
                if (from_disk) {
                        sparse_table_tier_restore(t, s, (uint32_t)r, rec, &th, scratch);
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
                char *rec = rec_locked(t, ids, i, n, how, step, &s, &rc, scratch, false, NULL);
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

static int push_as(struct sparse_table *t, const uint64_t *ids, size_t n, const float *g, float lr, uint64_t step,
                   enum lookup how)
{
        const struct sparse_table_opts *o = &t->o;
        uint32_t dim = o->dim;
        char *scratch = NULL;
        if (t->tier && !(scratch = malloc(t->tier_val_bytes)))
                return -ENOMEM;
        int rc = 0;
        for (size_t i = 0; i < n; i++) {
                struct stripe *s;
                char *rec = rec_locked(t, ids, i, n, how, step, &s, &rc, scratch, true, NULL);
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

int sparse_table_push(struct sparse_table *t, const uint64_t *ids, size_t n, const float *g, float lr,
                      uint64_t step)
{
        return push_as(t, ids, n, g, lr, step, t->sketch ? EXISTING : CREATE);
}

int sparse_table_push_existing(struct sparse_table *t, const uint64_t *ids, size_t n, const float *g, float lr,
                               uint64_t step)
{
        return push_as(t, ids, n, g, lr, step, EXISTING);
}

int sparse_table_replay(struct sparse_table *t, const struct sparse_event *ev, size_t n, uint64_t step)
{
        char *scratch = NULL;
        if (t->tier && !(scratch = malloc(t->tier_val_bytes)))
                return -ENOMEM;
        uint64_t limit0 = __atomic_load_n(&t->evicted_limit, __ATOMIC_RELAXED);
        int rc = 0;
        for (size_t i = 0; i < n && rc == 0; i++) {
                if (ev[i].kind == SPARSE_DROPPED) {
                        sparse_table_delete(t, &ev[i].id, 1);
                        continue;
                }
                struct stripe *s;
                char *rec = rec_locked(t, &ev[i].id, 0, 1, CREATE, step, &s, &rc, scratch, false, NULL);
                if (rec && s)
                        pthread_mutex_unlock(&s->lock);
        }
        free(scratch);
        if (rc == 0 && __atomic_load_n(&t->evicted_limit, __ATOMIC_RELAXED) != limit0)
                rc = -EDOM;   /* it dropped a row of its own at its bound */
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

int sparse_table_import(struct sparse_table *t, const uint64_t *ids, size_t n, const float *values,
                        const float *slots, uint64_t step)
{
        uint32_t dim = t->o.dim;
        char *scratch = NULL;
        size_t replaced = 0;
        if (t->tier && !(scratch = malloc(t->tier_val_bytes)))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct stripe *s;
                int err;
                bool stored = false;
                char *rec = rec_locked(t, ids, i, n, CREATE_BLANK, step, &s, &err, scratch, false, &stored);
                if (!rec) {
                        free(scratch);
                        return err;
                }
                replaced += stored;
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
        return replaced > INT_MAX ? INT_MAX : (int)replaced;
}

void sparse_table_clear(struct sparse_table *t)
{
        for (unsigned i = 0; i < N_STRIPES; i++) {
                struct stripe *s = &t->stripes[i];
                pthread_mutex_lock(&s->lock);
                stripe_release(s);
                pthread_mutex_unlock(&s->lock);
        }
        sparse_table_tier_clear(t);
}

