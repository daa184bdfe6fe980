/* The bound of an embedding table: eviction at max_rows by its policy (age, lru, lfu), eviction by age
 * (sparse_table_evict), and admission of new ids through a count-min sketch. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "sparse_table-internal.h"

bool sparse_table_admit(struct sparse_table *t, uint64_t id)
{
        if (cmsketch_add(t->sketch, id) < t->o.admit_after) {
                __atomic_add_fetch(&t->admit_pending, 1, __ATOMIC_RELAXED);
                return false;
        }
        __atomic_add_fetch(&t->admitted, 1, __ATOMIC_RELAXED);
        return true;
}

/* Frees live row r of s for good: the next incremental checkpoint drops its id. */
static void row_drop(struct sparse_table *t, struct stripe *s, uint32_t r)
{
        if (t->track)
                sparse_table_gone_add(t, s, rec_id(rec_at(t, s, r)));
        sparse_table_event(t, s, rec_id(rec_at(t, s, r)), SPARSE_DROPPED);
        sparse_table_row_free(t, s, r);
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

int sparse_table_make_room(struct sparse_table *t, struct stripe *s)
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
                                if ((err = sparse_table_tier_spill(t, s, r, buf)) < 0)
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
                evicted += sparse_table_tier_evict(t, before);
        __atomic_add_fetch(&t->evicted_age, evicted, __ATOMIC_RELAXED);
        return evicted;
}


size_t sparse_table_delete(struct sparse_table *t, const uint64_t *ids, size_t n)
{
        size_t gone = 0;
        char *buf = t->tier ? malloc(t->tier_val_bytes) : NULL;
        for (size_t i = 0; i < n; i++) {
                uint64_t h = stripe_hash(ids[i]);
                struct stripe *s = &t->stripes[stripe_of(h)];
                pthread_mutex_lock(&s->lock);
                bool found;
                uint32_t pos = sparse_table_index_find(t, s, ids[i], h, &found);
                bool on_disk = false;
                /* a row on disk (or a stale copy of one read back) goes too; without the buffer for
                 * reading it (out of memory), it is deleted uncounted */
                if (t->tier)
                        on_disk = buf ? t->tops->get(t->tier, ids[i], buf, t->tier_val_bytes) == 1 : false;
                if (t->tier && t->tops->del(t->tier, ids[i]) < 0)
                        __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                else if (on_disk && !found)
                        __atomic_sub_fetch(&t->tier_rows, 1, __ATOMIC_RELAXED);
                if (found)
                        sparse_table_row_free(t, s, s->index[pos] - 1);
                gone += found || on_disk;
                pthread_mutex_unlock(&s->lock);
        }
        free(buf);
        return gone;
}
