/* Bounded staleness (training.mode ssp, as Petuum's Bösen): shard 0 keeps each worker's clock, the
 * steps it has finished, and holds the answer to a worker's counting push while that worker is more
 * than training.staleness steps ahead of the slowest live worker. The gradients are applied at once,
 * as in async; only the worker's next step waits (its forward needs the answer). No RPC: a held push
 * is an agg_waiter (agg.h) answered through its release callback; unit tested alone
 * (tests/unit/test_ssp.c). Thread-safe (one lock). */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "agg.h"

struct ssp;

/* Workers with indices below n_workers, bound `staleness`; a worker is live while its last counting
 * push is younger than live_us. 0, -ENOMEM. */
int ssp_new(uint32_t n_workers, uint32_t staleness, uint64_t live_us, struct ssp **ret);
struct ssp *ssp_free(struct ssp *s);   /* NULL-safe; returns NULL; releases no waiter */

/* Worker w->worker has finished its step local_step (its counting push, applied). Its clock moves on
 * (a worker seen for the first time, or again after it was not live or with a smaller step — it
 * restarted — joins at the slowest live worker's clock). Returns false when it may go on (answer
 * now); true when w is held until the slowest live worker is within the bound, or wait_us passes
 * (then released with -ETIMEDOUT and why). Other held workers the move lets go are released. */
bool ssp_arrive(struct ssp *s, struct agg_waiter *w, uint64_t local_step, uint64_t wait_us);
/* As ssp_arrive, on a shard's backup psd (ps.replicas 2): the worker's clock moves the same way, and
 * nobody is held (the backup answers no push). */
void ssp_note(struct ssp *s, uint32_t worker, uint64_t local_step);
/* A backup's state transfer (ps.replicas 2): the workers' clocks and local steps (n_workers each) out
 * of the primary's, and into the backup's (a worker with a step counts as live from now). */
void ssp_copy_out(struct ssp *s, uint64_t *clock, uint64_t *raw);
void ssp_copy_in(struct ssp *s, const uint64_t *clock, const uint64_t *raw);
uint32_t ssp_n_workers(const struct ssp *s);
/* The job has reached max_steps: nobody waits any more (held workers go, none is held again). */
void ssp_finish(struct ssp *s);
/* Releases the held workers whose deadline passed, and those a worker that stopped being live no
 * longer holds back (now_us: wall clock). */
void ssp_tick(struct ssp *s, uint64_t now_us);
/* Drops every held waiter of owner (not released). */
void ssp_forget(struct ssp *s, const void *owner);

/* The clock table status shows. */
struct ssp_clock {
        uint64_t clock;            /* steps finished (on the job's common scale) */
        bool live, waiting;
        uint64_t waiting_since_us;
};
/* Fills clocks (n_workers entries); returns the slowest live clock. *max_ahead_ret: the most any
 * worker has been allowed ahead of the slowest live worker when it went on (the bound holds when it
 * is <= staleness). why (nullable, len) gets the oldest wait's reason and *peer_ret the worker it waits
 * for (-1: none). */
uint64_t ssp_table(struct ssp *s, struct ssp_clock *clocks, uint64_t *max_ahead_ret, char *why, size_t len,
                   int *peer_ret);
