/* An embedding table's walk (export) and its change tracking for incremental checkpoints: the rows
 * changed since the last walk that cleaned, and the ids evicted since the last take. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sparse_table-internal.h"

int sparse_table_bits_reserve(uint64_t **bits, uint32_t *words, uint32_t used)
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

void sparse_table_gone_add(struct sparse_table *t, struct stripe *s, uint64_t id)
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

void sparse_table_event(struct sparse_table *t, struct stripe *s, uint64_t id, enum sparse_event_kind kind)
{
        if (!t->journal)
                return;
        if (s->n_events == s->events_cap) {
                size_t cap = s->events_cap ? 2 * s->events_cap : 64;
                struct sparse_event *e = realloc(s->events, cap * sizeof(*e));
                if (!e) {
                        __atomic_store_n(&t->journal_lost, true, __ATOMIC_RELAXED);
                        return;
                }
                s->events = e;
                s->events_cap = cap;
        }
        s->events[s->n_events++] = (struct sparse_event){.id = id, .kind = (uint8_t)kind};
}

void sparse_table_journal(struct sparse_table *t, bool on)
{
        t->journal = on;
}

int sparse_table_journal_take(struct sparse_table *t, struct sparse_event **ev_ret, size_t *n_ret)
{
        *ev_ret = NULL;
        *n_ret = 0;
        size_t n = 0;
        for (unsigned si = 0; si < N_STRIPES; si++) {
                pthread_mutex_lock(&t->stripes[si].lock);
                n += t->stripes[si].n_events;
                pthread_mutex_unlock(&t->stripes[si].lock);
        }
        struct sparse_event *ev = n ? malloc(n * sizeof(*ev)) : NULL;
        size_t at = 0;
        for (unsigned si = 0; si < N_STRIPES; si++) {
                struct stripe *s = &t->stripes[si];
                pthread_mutex_lock(&s->lock);
                size_t k = s->n_events;
                if (ev && k && at + k <= n) {
                        memcpy(ev + at, s->events, k * sizeof(*ev));
                        at += k;
                }
                s->n_events = 0;
                pthread_mutex_unlock(&s->lock);
        }
        bool lost = __atomic_exchange_n(&t->journal_lost, false, __ATOMIC_RELAXED);
        if ((n && !ev) || at != n || lost) {
                free(ev);
                return -ENOMEM;
        }
        *ev_ret = ev;
        *n_ret = n;
        return 0;
}

void sparse_table_track(struct sparse_table *t, bool on)
{
        t->track = on;
}

void sparse_table_give_row(const struct sparse_table *t, const float *row, uint64_t id, size_t n, size_t max,
                           uint64_t *ids, float *values, float *slots)
{
        uint32_t dim = t->o.dim;
        ids[n] = id;
        memcpy(values + n * dim, row, dim * sizeof(float));
        for (unsigned sl = 0; slots && sl < t->n_slots; sl++)
                memcpy(slots + (sl * max + n) * dim, row + (size_t)(1 + sl) * dim, dim * sizeof(float));
}

size_t sparse_table_export(struct sparse_table *t, uint64_t *cursor, size_t max, uint64_t *ids, float *values,
                           float *slots)
{
        return sparse_table_export_changes(t, cursor, max, ids, values, slots, false, false);
}

size_t sparse_table_export_changes(struct sparse_table *t, uint64_t *cursor, size_t max, uint64_t *ids,
                                   float *values, float *slots, bool dirty_only, bool clean)
{
        size_t n = 0;
        if (t->tier) {
                pthread_mutex_lock(&t->walk_lock);
                if (*cursor == 0)
                        sparse_table_walk_start(t);
                if (*cursor == TIER_DONE) {
                        pthread_mutex_unlock(&t->walk_lock);
                        return 0;
                }
                if (*cursor & TIER_PHASE) {
                        n = sparse_table_walk_disk(t, cursor, *cursor & ~TIER_PHASE, 0, max, ids, values, slots, dirty_only, clean);
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
                        sparse_table_give_row(t, rec_vals(t, rec), rec_id(rec), n, max, ids, values, slots);
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
                        n = sparse_table_walk_disk(t, cursor, 0, n, max, ids, values, slots, dirty_only, clean);
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
