/* An embedding table's disk tier, the glue to its store (sparse_tier_ops): rows past max_rows spilled
 * there and read back, evicted there by age, and given by the disk part of a walk. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sparse_table-internal.h"

int sparse_table_tier_open(struct sparse_table *t, const char *dir)
{
        t->tops = t->o.tier_ops;
        t->tier_val_bytes = sizeof(struct tier_hdr) + t->row_floats * sizeof(float);
        return t->tops->open(dir, &t->tier);
}

void sparse_table_tier_close(struct sparse_table *t)
{
        if (t->tier) {
                t->tops->iter_free(t->walk_it);
                t->tops->free(t->tier);
        }
}

void sparse_table_tier_clear(struct sparse_table *t)
{
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

int sparse_table_tier_read(struct sparse_table *t, uint64_t id, char *scratch, struct tier_hdr *th)
{
        if (!t->tier || !__atomic_load_n(&t->tier_rows, __ATOMIC_RELAXED))
                return 0;
        int g = t->tops->get(t->tier, id, scratch, t->tier_val_bytes);
        if (g < 0) {
                __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                return -EIO;
        }
        if (g != 1)
                return 0;
        memcpy(th, scratch, sizeof(*th));
        return 1;
}

void sparse_table_tier_restore(struct sparse_table *t, struct stripe *s, uint32_t r, char *rec,
                               const struct tier_hdr *th, const char *scratch)
{
        /* the row moves back with its state: its change mark, whether this walk gave it */
        if (t->track && (th->flags & TIER_DIRTY))
                dirty_set(s, r);
        given_put(s, r, th->gen && th->gen == __atomic_load_n(&t->walk_gen, __ATOMIC_RELAXED));
        if (t->o.evict_policy == SPARSE_EVICT_LFU)
                *rec_count(rec) = th->count;
        memcpy(rec_vals(t, rec), scratch + sizeof(*th), t->row_floats * sizeof(float));
        /* one copy counts: DRAM's from now. The disk copy is left (a write less per read; the next spill
         * of the row overwrites it): a disk key whose id is in DRAM is stale, and every reader of the
         * disk (walks, eviction by age) looks in DRAM first. It also lets a walk's disk part find a row
         * that came back into a stripe the walk had passed: it gives DRAM's copy then. */
        __atomic_sub_fetch(&t->tier_rows, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&t->tier_reads, 1, __ATOMIC_RELAXED);
}

int sparse_table_tier_spill(struct sparse_table *t, struct stripe *s, uint32_t r, char *buf)
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
        sparse_table_row_free(t, s, r);
        __atomic_add_fetch(&t->tier_rows, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&t->tier_spills, 1, __ATOMIC_RELAXED);
        return 0;
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

size_t sparse_table_tier_evict(struct sparse_table *t, uint64_t before)
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
                sparse_table_index_find(t, s, id, hh, &found);
                /* under the lock, as it is now: a row back in DRAM is DRAM's (sparse_table_evict's pass) */
                int g = found ? 0 : t->tops->get(t->tier, id, buf, t->tier_val_bytes);
                if (g == 1) {
                        memcpy(&h, buf, sizeof(h));
                        if (h.touch != 0 && h.touch != UINT32_MAX && (uint64_t)(h.touch - 1) < before) {
                                if (t->tops->del(t->tier, id) < 0) {
                                        __atomic_add_fetch(&t->tier_errors, 1, __ATOMIC_RELAXED);
                                } else {
                                        if (t->track)
                                                sparse_table_gone_add(t, s, id);
                                        sparse_table_event(t, s, id, SPARSE_DROPPED);
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

void sparse_table_walk_start(struct sparse_table *t)
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
        uint32_t pos = sparse_table_index_find(t, s, id, hh, &found);
        if (found) {
                uint32_t r = s->index[pos] - 1;
                if (!given_get(s, r) && (!dirty_only || dirty_get(s, r))) {
                        char *rec = rec_at(t, s, r);
                        sparse_table_give_row(t, rec_vals(t, rec), id, n, max, ids, values, slots);
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
                        sparse_table_give_row(t, (const float *)(const void *)(buf + sizeof(h)), id, n, max, ids,
                                              values, slots);
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

size_t sparse_table_walk_disk(struct sparse_table *t, uint64_t *cursor, uint64_t seq, size_t n, size_t max,
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

