/* A ps shard's synchronous step (training.mode sync): the gradients of N workers per part, computed from
 * the part's current step, summed in worker order, applied once as their mean, and the pushes held
 * until then. No RPC: a held push is a waiter whose release callback answers it (a gRPC call, or a
 * worker's shared-memory group), so this is unit tested alone (tests/unit/test_agg.c).
 *
 * Each part keeps its own step and counts its own gradients, as TensorFlow's per-variable accumulators
 * do; the shard's step is the step every part has reached (docs/architecture.md, "Synchronous and
 * bounded-staleness training"). Thread-safe: one lock over it all, taken before a part's lock. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shard.h"

struct agg;

/* A push held until the step of its parts is applied. Filled by the caller, owned by the caller, and
 * queued by agg_push until released. */
struct agg_waiter {
        uint32_t worker;
        uint64_t version;          /* the step its gradients were computed from */
        uint32_t n;                /* its parts: indices into the shard's parts */
        const uint32_t *idx;
        void *owner;               /* agg_forget(owner) drops every waiter of it (a link that goes away) */
        /* Called once, under the aggregator's lock (so it may read the parts, under their locks, but
         * must not call agg_*): status 0 with the step now reached, or -ETIMEDOUT / -ECANCELED with why. */
        void (*release)(struct agg_waiter *w, int status, uint64_t step, const char *msg);
        /* the aggregator's */
        uint64_t since_us, deadline_us;   /* wall clock, µs */
        bool queued;
        struct agg_waiter *next;
};

/* A list of held waiters, oldest first (the sync step's and ssp's): w appended (queued), w taken
 * out (not queued any more), and every waiter of owner taken out unreleased. */
void waiters_append(struct agg_waiter **head, struct agg_waiter *w, uint64_t wait_us);
void waiters_remove(struct agg_waiter **head, struct agg_waiter *w);
void waiters_forget(struct agg_waiter **head, const void *owner);

/* For shard s (lent; outlives the aggregator), workers with indices below n_workers, n_aggregate
 * gradients per step. Starts at step 0 (agg_reset). 0, -EINVAL (n_aggregate 0 or over n_workers),
 * -ENOMEM. */
int agg_new(struct shard *s, uint32_t n_workers, uint32_t n_aggregate, struct agg **ret);
struct agg *agg_free(struct agg *a);   /* NULL-safe; returns NULL; releases no waiter */

/* The shard was assigned at global_step: every part's step becomes it, gradients held are dropped,
 * and waiters are released with -ECANCELED (their step is gone). */
void agg_reset(struct agg *a, uint64_t step);

/* What agg_push did with a push. */
enum agg_verdict {
        AGG_HELD,    /* queued: w->release comes later, or came already (this push completed the step) */
        AGG_STALE,   /* computed from an older step: dropped and counted; answer now with the values of *step_ret */
        AGG_REFUSED, /* from a step this shard has not reached (it was assigned again), or a worker outside the job */
};
/* Offers w's gradients: grads holds, one after the other, the floats of parts w->idx[0..n) (checked,
 * and scaled if clipped), copied here. A gradient of the same worker and step replaces its earlier one
 * (a worker that gave up waiting and pushed again), whose waiter is released with -ECANCELED. When a
 * part has n_aggregate gradients, their sum in worker order is scaled by 1 / n_aggregate and applied
 * (apply_gradient, under the part's lock); waiters whose parts have all moved on are released.
 * *step_ret: the step of w's parts after the call. wait_us: how long w may be held. */
enum agg_verdict agg_push(struct agg *a, struct agg_waiter *w, const float *grads, uint64_t wait_us,
                          uint64_t *step_ret);
/* ps.replicas 2: the parts a push completes are applied at once, but the waiters they free are let go
 * only by agg_advance, once the backup holds the update. fn, called by agg_push under the
 * aggregator's lock (so it must not call agg_*), gets the parts it applied, idx[0..n), and their mean
 * gradients as applied, each at its part's offset of the shard's block in acc (valid during the call).
 * fn NULL: agg_push lets them go itself (the default). */
typedef void (*agg_applied_fn)(void *ud, const uint32_t *idx, uint32_t n, const float *acc);
void agg_defer(struct agg *a, agg_applied_fn fn, void *ud);
/* Lets go the waiters whose parts have all moved on: with status 0, or, when the backup never
 * acknowledged the update that moved them, status < 0 and msg. */
void agg_advance(struct agg *a, int status, const char *msg);
/* The backup's side: parts idx[0..n) were applied as the primary's step applied them; their steps
 * move on (and the shard's, and global_step, with them). */
void agg_replayed(struct agg *a, const uint32_t *idx, uint32_t n);
/* Each part's step, the shard's n_parts of them (the state transfer): out, and in (which drops any
 * gradient held and releases any waiter with -ECANCELED, as agg_reset does). */
void agg_steps_get(struct agg *a, uint64_t *steps);
void agg_steps_set(struct agg *a, const uint64_t *steps);
/* Releases with -ETIMEDOUT every waiter whose deadline has passed at now_us (wall clock). Returns
 * how many. */
uint32_t agg_expire(struct agg *a, uint64_t now_us);
/* Drops w if it is queued (not released). */
void agg_cancel(struct agg *a, struct agg_waiter *w);
/* Drops every queued waiter of owner (not released). */
void agg_forget(struct agg *a, const void *owner);

/* What status shows. */
struct agg_status {
        uint64_t step;             /* the step every part has reached */
        uint64_t stale;            /* pushes dropped as computed from an older step */
        uint64_t steps;            /* steps aggregated and applied since start */
        uint32_t waiting;          /* pushes held */
        uint64_t since_us, deadline_us;   /* of the oldest held push; 0: none */
        uint32_t have;             /* gradients of the oldest step in progress */
        char reason[400];          /* "step 12: 1 of 2 gradients (worker:0); waiting for worker:1" or "" */
        char peer[32];             /* the first worker not heard from at that step ("worker:1"), or "" */
};
void agg_status_get(struct agg *a, struct agg_status *st);
