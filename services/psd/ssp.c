/* Bounded staleness on shard 0: the workers' clocks, and the answers held while a worker is too far
 * ahead (ssp.h). Every decision to let a worker go on is logged at debug level with the clocks, so a
 * run can be checked step by step against the bound (tests/integration/test_ssp.py). */
#include "ssp.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

struct ssp {
        uint32_t W, s;
        uint64_t live_us;
        pthread_mutex_t mu;        /* over everything below */
        uint64_t *clock;           /* (W) steps finished, on the common scale; owns the next two */
        uint64_t *last_us;         /* (W) wall clock of the last counting push; 0: never */
        uint64_t *raw;             /* (W) its local step + 1 */
        uint64_t max_ahead;
        bool finished;             /* ssp_finish: the bound no longer applies */
        struct agg_waiter *head;   /* held, oldest first */
};

int ssp_new(uint32_t n_workers, uint32_t staleness, uint64_t live_us, struct ssp **ret) {
        struct ssp *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        /* the per-worker arrays in one allocation, as they live as long as s */
        size_t W = (size_t)n_workers + 1;
        if (!(s->clock = calloc(3 * W, sizeof(uint64_t)))) {
                free(s);
                return -ENOMEM;
        }
        s->last_us = s->clock + W;
        s->raw = s->last_us + W;
        s->W = n_workers;
        s->s = staleness;
        s->live_us = live_us;
        pthread_mutex_init(&s->mu, NULL);
        *ret = s;
        return 0;
}

struct ssp *ssp_free(struct ssp *s) {
        if (!s)
                return NULL;
        pthread_mutex_destroy(&s->mu);
        free(s->clock);   /* and the other arrays */
        free(s);
        return NULL;
}

static bool live(const struct ssp *s, uint32_t w, uint64_t now) {
        return s->last_us[w] && now - s->last_us[w] < s->live_us;
}

/* The slowest live worker's clock (UINT64_MAX: none live), and who it is. */
static uint64_t slowest(const struct ssp *s, uint64_t now, uint32_t *who) {
        uint64_t least = UINT64_MAX;
        for (uint32_t w = 0; w < s->W; w++)
                if (live(s, w, now) && s->clock[w] < least) {
                        least = s->clock[w];
                        if (who)
                                *who = w;
                }
        return least;
}

/* Whether worker w may start its next step now; if so, the step is logged against the bound. */
static bool may_go(struct ssp *s, uint32_t w, uint64_t now) {
        if (s->finished)
                return true;
        uint64_t least = slowest(s, now, NULL);
        if (least != UINT64_MAX && s->clock[w] > least + s->s)
                return false;
        uint64_t ahead = least == UINT64_MAX ? 0 : s->clock[w] - least;
        s->max_ahead = ahead > s->max_ahead ? ahead : s->max_ahead;
        log_debug("ssp: worker:%u starts step %llu, %llu ahead of the slowest live worker (bound %u)", w,
                  (unsigned long long)s->clock[w], (unsigned long long)ahead, s->s);
        return true;
}

/* Releases the held workers that may go on now, and those past their deadline. Under mu. */
static void sweep(struct ssp *s, uint64_t now) {
        for (struct agg_waiter *w = s->head, *next; w; w = next) {
                next = w->next;
                if (may_go(s, w->worker, now)) {
                        waiters_remove(&s->head, w);
                        w->release(w, 0, s->clock[w->worker], NULL);
                } else if (w->deadline_us <= now) {
                        char why[300];
                        uint32_t who = 0;
                        uint64_t least = slowest(s, now, &who);
                        snprintf(why, sizeof(why), "ssp: worker:%u is %llu steps ahead of worker:%u, the slowest live "
                                 "worker (training.staleness %u)", w->worker,
                                 (unsigned long long)(s->clock[w->worker] - least), who, s->s);
                        waiters_remove(&s->head, w);
                        w->release(w, -ETIMEDOUT, s->clock[w->worker], why);
                }
        }
}

/* worker k's clock moves for its step local_step (mu held) */
static void move(struct ssp *s, uint32_t k, uint64_t local_step, uint64_t now) {
        bool joins = !live(s, k, now) || local_step + 1 <= s->raw[k];
        if (joins) {
                /* new, back, or restarted (its local steps start over): it joins at the slowest clock */
                uint64_t least = slowest(s, now, NULL);
                s->clock[k] = least == UINT64_MAX || least == 0 ? 0 : least - 1;   /* the step below counts */
        }
        s->clock[k]++;
        s->raw[k] = local_step + 1;
        s->last_us[k] = now;
        sweep(s, now);   /* the move may let others go */
}

void ssp_note(struct ssp *s, uint32_t worker, uint64_t local_step) {
        if (worker >= s->W)
                return;
        pthread_mutex_lock(&s->mu);
        move(s, worker, local_step, now_us());
        pthread_mutex_unlock(&s->mu);
}

void ssp_copy_out(struct ssp *s, uint64_t *clock, uint64_t *raw) {
        pthread_mutex_lock(&s->mu);
        memcpy(clock, s->clock, s->W * sizeof(*clock));
        memcpy(raw, s->raw, s->W * sizeof(*raw));
        pthread_mutex_unlock(&s->mu);
}

void ssp_copy_in(struct ssp *s, const uint64_t *clock, const uint64_t *raw) {
        uint64_t now = now_us();
        pthread_mutex_lock(&s->mu);
        memcpy(s->clock, clock, s->W * sizeof(*clock));
        memcpy(s->raw, raw, s->W * sizeof(*raw));
        for (uint32_t k = 0; k < s->W; k++)
                s->last_us[k] = raw[k] ? now : 0;
        pthread_mutex_unlock(&s->mu);
}

uint32_t ssp_n_workers(const struct ssp *s) {
        return s->W;
}

bool ssp_arrive(struct ssp *s, struct agg_waiter *w, uint64_t local_step, uint64_t wait_us) {
        uint32_t k = w->worker;
        if (k >= s->W)
                return false;
        uint64_t now = now_us();
        pthread_mutex_lock(&s->mu);
        move(s, k, local_step, now);
        bool held = !may_go(s, k, now);
        if (held)
                waiters_append(&s->head, w, wait_us);
        pthread_mutex_unlock(&s->mu);
        return held;
}

void ssp_finish(struct ssp *s) {
        pthread_mutex_lock(&s->mu);
        s->finished = true;
        sweep(s, now_us());
        pthread_mutex_unlock(&s->mu);
}

void ssp_tick(struct ssp *s, uint64_t now) {
        pthread_mutex_lock(&s->mu);
        sweep(s, now);
        pthread_mutex_unlock(&s->mu);
}

void ssp_forget(struct ssp *s, const void *owner) {
        pthread_mutex_lock(&s->mu);
        waiters_forget(&s->head, owner);
        pthread_mutex_unlock(&s->mu);
}

uint64_t ssp_table(struct ssp *s, struct ssp_clock *clocks, uint64_t *max_ahead_ret, char *why, size_t len,
                   int *peer_ret) {
        uint64_t now = now_us();
        pthread_mutex_lock(&s->mu);
        for (uint32_t w = 0; w < s->W; w++)
                clocks[w] = (struct ssp_clock){.clock = s->clock[w], .live = live(s, w, now)};
        for (struct agg_waiter *w = s->head; w; w = w->next) {
                clocks[w->worker].waiting = true;
                clocks[w->worker].waiting_since_us = w->since_us;
        }
        uint32_t who = 0;
        uint64_t least = slowest(s, now, &who);
        *max_ahead_ret = s->max_ahead;
        *peer_ret = -1;
        if (why && len)
                *why = 0;
        if (s->head && least != UINT64_MAX) {
                *peer_ret = (int)who;
                if (why)
                        snprintf(why, len, "ssp: worker:%u is %llu steps ahead of worker:%u, the slowest live worker "
                                 "(training.staleness %u)", s->head->worker,
                                 (unsigned long long)(s->clock[s->head->worker] - least), who, s->s);
        }
        pthread_mutex_unlock(&s->mu);
        return least == UINT64_MAX ? 0 : least;
}
