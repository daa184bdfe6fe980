/* The job's state machine, as pure functions: given where the job stands and what just happened,
 * where it goes next and why. No I/O, no locks, no clock: the caller owns the state, decides the
 * timeouts and does what a transition asks for (log, record, answer). Thread-safe. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "psfleet/v1/supervisor.pb-c.h"

#define CHIEF_REASON_MAX 512

struct chief_state {
        Psfleet__V1__JobState state;
        char reason[CHIEF_REASON_MAX];  /* why the job is where it is; "" when nothing to say */
        bool ready_once;                /* has been READY: a restore since is a restarted shard's */
        Psfleet__V1__JobState resume;   /* READY or TRAINING: where a restarted shard's restore returns */
};

enum chief_event_kind {
        /* Start-up, before READY. */
        CHIEF_EV_SHARDS_WAITING,        /* a shard does not answer, or assigning failed (why) */
        CHIEF_EV_READY_TIMEOUT,         /* not ready after timeout_s (why: the last wait) */
        CHIEF_EV_SHARDS_READY,          /* every shard initialized or restored */
        /* Restores: at start-up, and of a shard that restarted without its variables. */
        CHIEF_EV_RESTORE_LOOKING,       /* restoring `shards`, looking for a checkpoint in `where` */
        CHIEF_EV_RESTORE_FOUND,         /* restoring `shards` from the file `where`, of global_step `step` */
        CHIEF_EV_RESTORE_DONE,          /* the shards hold the checkpoint's values */
        CHIEF_EV_RESTORE_NONE,          /* no usable checkpoint (why) */
        CHIEF_EV_RESTORE_MISMATCH,      /* the checkpoints hold another model (why): fatal */
        CHIEF_EV_RESTORE_FAILED,        /* assigning failed, retried later (why) */
        CHIEF_EV_RESTORE_TIMEOUT,       /* a restarted shard's restore not done after timeout_s (why) */
        CHIEF_EV_SHARD_LOST,            /* ps:`shard` (`where`) unreachable for more than timeout_s (why) */
        /* Training. */
        CHIEF_EV_WORKER_REPORT,         /* a worker reported its local step `step` */
        CHIEF_EV_POLLED,                /* shard 0 polled: `advanced` past the ready step; `reachable` (why) */
        CHIEF_EV_MAX_STEPS,             /* global_step reached max_steps */
        CHIEF_EV_STOP_ASKED,            /* a client called Stop */
        /* The end. */
        CHIEF_EV_EVALUATING,            /* the final evaluation begins */
        CHIEF_EV_SAVING_FINAL,          /* the final checkpoint is being written */
        CHIEF_EV_FINISHED,              /* evaluated (and saved, or not: that does not undo the training) */
        CHIEF_EV_FAILURE,               /* anything else that ends the job (why) */
        CHIEF_EV_STOPPED,               /* after a stop: the final checkpoint of global_step `step` is written */
        CHIEF_EV_WAIT_TIMEOUT,          /* a wait (`where`: "ps:1", "workers") past its deadline of timeout_s (why) */
        CHIEF_EV_RESTART,               /* an operator asked to train the ended job again (why) */
        CHIEF_EV_DIVERGED,              /* `where` ("worker:0") reported `why` ("a non-finite loss (nan)") at
                                         * global_step `step`: the model went numerically wrong */
};

struct chief_event {
        enum chief_event_kind kind;
        const char *why;                /* what is awaited or what failed; NULL reads as "" */
        const char *shards;             /* RESTORE_LOOKING, RESTORE_FOUND: "ps:1", "every shard (3)" */
        const char *where;              /* the checkpoint directory or file; SHARD_LOST: the address */
        uint64_t step;                  /* RESTORE_FOUND: the checkpoint's; WORKER_REPORT: the local step;
                                         * DIVERGED: the global_step */
        uint64_t timeout_s;             /* the *_TIMEOUT and SHARD_LOST events */
        uint32_t shard;                 /* SHARD_LOST */
        bool advanced, reachable;       /* POLLED */
};

/* The state a chief starts in: INITIALIZING, "starting". */
void chief_state_init(struct chief_state *s);

/* The state a chief starts in, given the one recorded by the previous chief of the same job: DONE and
 * FAILED are sticky (with their reason: the job does not train again), anything else (STOPPED
 * included) starts afresh as chief_state_init. */
void chief_state_from_record(struct chief_state *s, Psfleet__V1__JobState recorded, const char *reason);

/* Where event ev takes the job from cur: writes *next (which may be cur itself) and returns true when
 * the state (not only the reason) changed. An event that does not apply in cur leaves it as it is;
 * DONE, FAILED and STOPPED move only on CHIEF_EV_RESTART. */
bool chief_state_next(const struct chief_state *cur, const struct chief_event *ev, struct chief_state *next);

/* What the main loop does in state s. */
enum chief_phase {
        CHIEF_PHASE_INITIALIZE,         /* probe the shards; initialize or restore them */
        CHIEF_PHASE_POLL,               /* follow global_step, watch the shards, notice the end */
        CHIEF_PHASE_STOPPING,           /* wait for the workers, then evaluate and save */
        CHIEF_PHASE_IDLE,               /* DONE or FAILED: answer questions until told to stop */
        CHIEF_PHASE_EXIT,               /* stop now: stopped before READY, STOPPED, or after the end */
};
enum chief_phase chief_state_phase(const struct chief_state *s, bool stop_requested);

/* A worker's Report as the chief weighs it before taking any of it. */
struct chief_report {
        const char *task;               /* "worker:0" */
        uint64_t global_step;           /* the report's */
        float loss;
        const char *state;              /* "training", "done", "diverged: ..." */
        bool have_last;                 /* last_step is the worker's last accepted report's, no restore since */
        uint64_t last_step;
        uint64_t known_step;            /* global_step as the chief last read it from ps:0 */
        uint64_t max_steps;
        uint32_t n_workers;
};

/* Steps per worker that ps:0's global_step may pass max_steps by: a worker stops starting steps at
 * max_steps counting its own unanswered pushes, but not the others' (generous: a report beyond it
 * is a lie, not a race). */
#define CHIEF_REPORT_SLACK 16

/* Whether a report can be true: its global_step not behind the worker's last one (have_last) and
 * not beyond what ps:0 can have, max(max_steps, known_step) + CHIEF_REPORT_SLACK per worker. false
 * with why (len bytes): the report is refused whole. */
bool chief_state_report_ok(const struct chief_report *r, char *why, size_t len);
/* Whether a report says the model went numerically wrong: a loss that is not finite, or the worker's
 * own verdict (state "diverged: WHAT"). what (len bytes) gets the words for CHIEF_EV_DIVERGED. */
bool chief_state_report_diverged(const struct chief_report *r, char *what, size_t len);

/* Whether a worker's Report should be told to stop. */
bool chief_state_workers_stop(const struct chief_state *s, bool stop_requested, uint64_t global_step,
                              uint64_t max_steps);

/* Whether a worker may join now; reason (len bytes) gets why not, "" when it may. */
bool chief_state_may_join(const struct chief_state *s, bool stop_requested, uint64_t global_step, char *reason,
                          size_t len);

/* Whether the job is over for good: DONE or FAILED (sticky across a restart of chiefd). */
bool chief_state_final(const struct chief_state *s);
/* Whether the job has ended: final, or STOPPED. Only CHIEF_EV_RESTART moves it then. */
bool chief_state_ended(const struct chief_state *s);
