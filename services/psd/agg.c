/* A ps shard's synchronous step: N gradients per part, summed in worker order and applied once, the
 * pushes held until then (agg.h). The sum's order is fixed whatever order the pushes came in, so a
 * sync job without backups computes the same numbers every run. */
#include "agg.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply.h"
#include "util.h"

struct agg {
        struct shard *s;
        uint32_t W, N;
        pthread_mutex_t mu;       /* over everything below */
        float *grads;             /* (W * n_floats) each worker's gradients, laid out as the shard's block */
        float *acc;               /* (n_floats) the sum */
        size_t *off;              /* (n_parts) each part's offset in the shard's block */
        bool *have;               /* (n_parts * W) worker w's gradient of part k is here for step[k] */
        uint32_t *got;            /* (n_parts) how many */
        uint32_t *applied;        /* (n_parts) agg_push: the parts it applied */
        uint64_t *step;           /* (n_parts) each part's step: the updates applied; owns the arrays above */
        uint64_t shard_step;      /* the least of step[] */
        uint64_t stale, steps;
        struct agg_waiter *head;  /* held pushes, oldest first */
        agg_applied_fn on_applied;   /* agg_defer's; NULL: agg_push lets the waiters go itself */
        void *ud;
};

int agg_new(struct shard *s, uint32_t n_workers, uint32_t n_aggregate, struct agg **ret) {
        if (n_aggregate == 0 || n_aggregate > n_workers)
                return -EINVAL;
        struct agg *a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        /* the arrays in one allocation, as they live as long as a: the widest first, so each is aligned */
        size_t P = s->n_parts + 1, n_grads = (size_t)n_workers * s->n_floats + 1, n_acc = s->n_floats + 1;
        a->step = calloc(1, P * (sizeof(uint64_t) + sizeof(size_t) + 2 * sizeof(uint32_t) + n_workers * sizeof(bool)) +
                                    (n_grads + n_acc) * sizeof(float));
        if (!a->step) {
                free(a);
                return -ENOMEM;
        }
        a->off = (size_t *)(a->step + P);
        a->grads = (float *)(a->off + P);
        a->acc = a->grads + n_grads;
        a->got = (uint32_t *)(a->acc + n_acc);
        a->applied = a->got + P;
        a->have = (bool *)(a->applied + P);
        a->s = s;
        a->W = n_workers;
        a->N = n_aggregate;
        pthread_mutex_init(&a->mu, NULL);
        for (uint32_t k = 0; k < s->n_parts; k++)
                a->off[k] = (size_t)(s->parts[k].a.w - s->block);
        *ret = a;
        return 0;
}

struct agg *agg_free(struct agg *a) {
        if (!a)
                return NULL;
        pthread_mutex_destroy(&a->mu);
        free(a->step);   /* and the other arrays */
        free(a);
        return NULL;
}

/* ---- the held waiters ---- */

void waiters_append(struct agg_waiter **head, struct agg_waiter *w, uint64_t wait_us) {
        w->since_us = now_us();
        w->deadline_us = w->since_us + wait_us;
        w->queued = true;
        w->next = NULL;
        while (*head)
                head = &(*head)->next;
        *head = w;
}

void waiters_remove(struct agg_waiter **head, struct agg_waiter *w) {
        for (; *head; head = &(*head)->next)
                if (*head == w) {
                        *head = w->next;
                        w->next = NULL;
                        w->queued = false;
                        return;
                }
}

void waiters_forget(struct agg_waiter **head, const void *owner) {
        for (struct agg_waiter *w = *head, *next; w; w = next) {
                next = w->next;
                if (w->owner == owner)
                        waiters_remove(head, w);
        }
}

static void release(struct agg *a, struct agg_waiter *w, int status, uint64_t step, const char *msg) {
        waiters_remove(&a->head, w);
        w->release(w, status, step, msg);
}

/* The step of w's parts, the least of them. */
static uint64_t waiter_step(const struct agg *a, const struct agg_waiter *w) {
        uint64_t st = UINT64_MAX;
        for (uint32_t i = 0; i < w->n; i++)
                st = a->step[w->idx[i]] < st ? a->step[w->idx[i]] : st;
        return w->n ? st : a->shard_step;
}

/* Why w still waits: its first part's gradients at its step, and who has not sent one. */
static void why_waiting(const struct agg *a, const struct agg_waiter *w, char *buf, size_t len, char *peer,
                        size_t peerlen) {
        uint32_t k = w->n ? w->idx[0] : 0;
        const bool *have = a->have + (size_t)k * a->W;
        char from[160] = "", missing[160] = "";
        size_t fa = 0, ma = 0;
        if (peer)
                *peer = 0;
        for (uint32_t i = 0; i < a->W; i++) {
                char *b = have[i] ? from : missing;
                size_t *at = have[i] ? &fa : &ma;
                if (*at < 140)
                        *at += (size_t)snprintf(b + *at, 160 - *at, "%sworker:%u", *at ? ", " : "", i);
                if (!have[i] && peer && !*peer)
                        snprintf(peer, peerlen, "worker:%u", i);
        }
        snprintf(buf, len, "sync step %llu of %s: %u of %u gradients%s%s%s; waiting for %u more, from %s",
                 (unsigned long long)a->step[k], a->s->parts[k].name, a->got[k], a->N, fa ? " (" : "", from,
                 fa ? ")" : "", a->N - a->got[k], ma ? missing : "nobody");
}

/* ---- the step ---- */

/* Part k has its N gradients: their sum in worker order, as their mean, applied once. The mean stays
 * in acc at the part's offset (agg_defer's function reads it). */
static void apply_part(struct agg *a, uint32_t k) {
        struct shard_part *q = &a->s->parts[k];
        bool *have = a->have + (size_t)k * a->W;
        float *acc = a->acc + a->off[k];
        bool first = true;
        for (uint32_t w = 0; w < a->W; w++) {
                if (!have[w])
                        continue;
                const float *g = a->grads + (size_t)w * a->s->n_floats + a->off[k];
                if (first)
                        memcpy(acc, g, q->a.n * sizeof(float));
                else
                        for (size_t i = 0; i < q->a.n; i++)
                                acc[i] += g[i];
                first = false;
                have[w] = false;
        }
        apply_scale(acc, q->a.n, 1.0f / (float)a->N);
        pthread_mutex_lock(&q->mu);
        apply_gradient(a->s->t, &q->a, acc);
        pthread_mutex_unlock(&q->mu);
        a->got[k] = 0;
        a->step[k]++;
}

/* After parts moved on: the shard's step, and the waiters whose parts have all moved on, let go with
 * status (0, or < 0 with msg). */
static void advance(struct agg *a, int status, const char *msg) {
        uint64_t least = UINT64_MAX;
        for (uint32_t k = 0; k < a->s->n_parts; k++)
                least = a->step[k] < least ? a->step[k] : least;
        if (a->s->n_parts && least > a->shard_step) {
                a->steps += least - a->shard_step;
                a->shard_step = least;
                atomic_store(&a->s->global_step, least);
        }
        for (struct agg_waiter *w = a->head, *next; w; w = next) {
                next = w->next;
                uint64_t st = waiter_step(a, w);
                if (st > w->version)
                        release(a, w, status, st, msg);
        }
}

void agg_reset(struct agg *a, uint64_t step) {
        pthread_mutex_lock(&a->mu);
        for (uint32_t k = 0; k < a->s->n_parts; k++) {
                a->step[k] = step;
                a->got[k] = 0;
        }
        memset(a->have, 0, (size_t)a->s->n_parts * a->W * sizeof(bool));
        a->shard_step = step;
        atomic_store(&a->s->global_step, step);
        while (a->head)
                release(a, a->head, -ECANCELED, step, "the shard was assigned again (restored): pull and push again");
        pthread_mutex_unlock(&a->mu);
}

enum agg_verdict agg_push(struct agg *a, struct agg_waiter *w, const float *grads, uint64_t wait_us,
                          uint64_t *step_ret) {
        pthread_mutex_lock(&a->mu);
        bool stale = false, ahead = w->worker >= a->W;
        for (uint32_t i = 0; i < w->n; i++) {
                stale |= a->step[w->idx[i]] > w->version;
                ahead |= a->step[w->idx[i]] < w->version;
        }
        *step_ret = waiter_step(a, w);
        if (ahead || stale) {
                a->stale += !ahead;
                pthread_mutex_unlock(&a->mu);
                return ahead ? AGG_REFUSED : AGG_STALE;
        }
        bool again = false;
        for (uint32_t i = 0, at = 0; i < w->n; i++) {
                uint32_t k = w->idx[i];
                size_t n = a->s->parts[k].a.n;
                memcpy(a->grads + (size_t)w->worker * a->s->n_floats + a->off[k], grads + at, n * sizeof(float));
                at += (uint32_t)n;
                bool *h = &a->have[(size_t)k * a->W + w->worker];
                again |= *h;
                a->got[k] += !*h;
                *h = true;
        }
        if (again) {
                /* the worker gave up on its earlier push of these parts and sent them again */
                for (struct agg_waiter *o = a->head, *next; o; o = next) {
                        next = o->next;
                        if (o != w && o->worker == w->worker && o->version == w->version && o->n && w->n &&
                            o->idx[0] == w->idx[0])
                                release(a, o, -ECANCELED, w->version, "pushed again");
                }
        }
        waiters_append(&a->head, w, wait_us);
        uint32_t n_applied = 0;
        for (uint32_t i = 0; i < w->n; i++)
                if (a->got[w->idx[i]] >= a->N) {
                        apply_part(a, w->idx[i]);
                        a->applied[n_applied++] = w->idx[i];
                }
        if (n_applied && a->on_applied)
                a->on_applied(a->ud, a->applied, n_applied, a->acc);   /* agg_advance lets them go */
        else if (n_applied)
                advance(a, 0, NULL);
        *step_ret = waiter_step(a, w);
        pthread_mutex_unlock(&a->mu);
        return AGG_HELD;
}

void agg_defer(struct agg *a, agg_applied_fn fn, void *ud) {
        pthread_mutex_lock(&a->mu);
        a->on_applied = fn;
        a->ud = ud;
        pthread_mutex_unlock(&a->mu);
}

void agg_advance(struct agg *a, int status, const char *msg) {
        pthread_mutex_lock(&a->mu);
        advance(a, status, msg);
        pthread_mutex_unlock(&a->mu);
}

void agg_replayed(struct agg *a, const uint32_t *idx, uint32_t n) {
        pthread_mutex_lock(&a->mu);
        for (uint32_t i = 0; i < n; i++)
                a->step[idx[i]]++;
        advance(a, 0, NULL);
        pthread_mutex_unlock(&a->mu);
}

void agg_steps_get(struct agg *a, uint64_t *steps) {
        pthread_mutex_lock(&a->mu);
        memcpy(steps, a->step, a->s->n_parts * sizeof(*steps));
        pthread_mutex_unlock(&a->mu);
}

void agg_steps_set(struct agg *a, const uint64_t *steps) {
        pthread_mutex_lock(&a->mu);
        memcpy(a->step, steps, a->s->n_parts * sizeof(*steps));
        memset(a->got, 0, a->s->n_parts * sizeof(*a->got));
        memset(a->have, 0, (size_t)a->s->n_parts * a->W * sizeof(bool));
        uint64_t least = UINT64_MAX;
        for (uint32_t k = 0; k < a->s->n_parts; k++)
                least = a->step[k] < least ? a->step[k] : least;
        a->shard_step = a->s->n_parts ? least : 0;
        atomic_store(&a->s->global_step, a->shard_step);
        while (a->head)
                release(a, a->head, -ECANCELED, a->shard_step, "the shard's state was replaced (state transfer)");
        pthread_mutex_unlock(&a->mu);
}

uint32_t agg_expire(struct agg *a, uint64_t now) {
        uint32_t n = 0;
        pthread_mutex_lock(&a->mu);
        for (struct agg_waiter *w = a->head, *next; w; w = next) {
                next = w->next;
                if (w->deadline_us > now)
                        continue;
                char why[400];
                why_waiting(a, w, why, sizeof(why), NULL, 0);
                release(a, w, -ETIMEDOUT, waiter_step(a, w), why);
                n++;
        }
        pthread_mutex_unlock(&a->mu);
        return n;
}

void agg_cancel(struct agg *a, struct agg_waiter *w) {
        pthread_mutex_lock(&a->mu);
        if (w->queued)
                waiters_remove(&a->head, w);
        pthread_mutex_unlock(&a->mu);
}

void agg_forget(struct agg *a, const void *owner) {
        pthread_mutex_lock(&a->mu);
        waiters_forget(&a->head, owner);
        pthread_mutex_unlock(&a->mu);
}

void agg_status_get(struct agg *a, struct agg_status *st) {
        memset(st, 0, sizeof(*st));
        pthread_mutex_lock(&a->mu);
        st->step = a->shard_step;
        st->stale = a->stale;
        st->steps = a->steps;
        for (struct agg_waiter *w = a->head; w; w = w->next)
                st->waiting++;
        if (a->head) {
                st->since_us = a->head->since_us;
                st->deadline_us = a->head->deadline_us;
                st->have = a->head->n ? a->got[a->head->idx[0]] : 0;
                why_waiting(a, a->head, st->reason, sizeof(st->reason), st->peer, sizeof(st->peer));
        }
        pthread_mutex_unlock(&a->mu);
}
