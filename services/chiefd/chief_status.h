/* The status the chief reports (GetStatus, Watch, the metrics, the job's row in SQLite) and the one
 * place where the job's state changes: `struct chief_status`, its lock and the figures derived under
 * it. The handlers' threads and the main thread read and update it under `lock`; chief_status.c is
 * the only file that changes the state (chief_event_locked) or derives rates, the loss and the end.
 * Its fields are visible because the handlers and the main loop read several of them at once under
 * one lock hold; what is derived from them goes through the functions below. */
#pragma once
#include <grpc/grpc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chief_ckpt.h"
#include "chief_db.h"
#include "chief_state.h"

#define RATE_WINDOW_US (10 * 1000 * 1000ULL)
#define N_SAMPLES 64

struct job_config;
struct rpc_call;

struct worker_info {
        bool joined, reported, finished;
        bool step_known;                /* global_step is its last accepted report's, with no restore since */
        uint64_t local_step, global_step, examples;
        float loss, examples_per_s;
        uint64_t last_report_us;        /* wall clock */
        uint64_t report_interval_us;    /* between its last two reports; 0: fewer than two */
        char state[128];
};

struct ps_info {
        bool reachable, initialized;
        uint64_t incarnation, global_step, last_seen_us;
        uint64_t lost_since_mono;       /* 0 while reachable */
        char state[640];                /* with, in sync mode, the step it holds pushes for and whose it lacks */
        /* ps.replicas 2 (chief_probe.c): which psd is the shard's primary, at which epoch */
        uint32_t primary;               /* 0: cluster.ps[s], 1: cluster.ps_backup[s] */
        uint64_t epoch;                 /* 0: not decided yet */
        bool replicated;                /* the primary's last status: its backup acknowledges every update */
        uint64_t lag_us, failovers, last_failover_us;
        uint64_t primary_lost_mono;     /* the primary has not answered since (0: it answers) */
};

struct sample {
        uint64_t t_mono, step;
};

/* What the job waits for (JobStatus.waiting_for), when `on`. */
struct chief_wait {
        bool on;
        char peer[32];                  /* "ps:1", "workers", "checkpoint" */
        uint64_t since_us, deadline_us; /* wall clock */
        char last_error[512];
};
struct chief_status {
        /* Set once before any thread reads the status. */
        const struct job_config *cfg;
        struct chief_db *db;              /* every state change is recorded there */
        struct chief_ckpt *ckpts;         /* the newest checkpoint and the count, for the status */
        uint64_t fingerprint;
        const char *summary_dir;
        pthread_cond_t changed;           /* signalled on a change the watchers hear of at once (they wait
                                           * on it with their own mutex, chief_watch.c) */

        pthread_mutex_t lock;             /* protects everything below */
        struct chief_state js;            /* the job's state and reason; changed by chief_event_locked only */
        uint64_t state_since_us;          /* wall clock: when js.state was entered */
        struct chief_wait wait;
        struct chief_db_loss *losses;     /* (n_losses) every shard restored from behind the job's step */
        size_t n_losses;
        uint64_t steps_lost;
        char last_ckpt_error[512];        /* the last failed save; "" after a successful one */
        bool restart_requested;           /* Restart: the main loop trains the ended job again */
        char restart_reason[256];
        uint64_t global_step;
        uint64_t ready_step;              /* global_step when the job became ready */
        bool stop_requested;
        uint64_t started_us;              /* wall clock */
        uint64_t ready_mono, end_mono;    /* READY, and global_step reaching max_steps (or a stop) */
        uint64_t end_step;
        uint64_t first_mono, first_step;  /* global_step first seen moving after READY */
        float wall_s;
        float test_accuracy, test_loss;
        struct worker_info *workers;      /* (n_worker) */
        struct ps_info *ps;               /* (n_ps) */
        struct sample samples[N_SAMPLES]; /* ring of (time, global_step) for rates */
        unsigned n_samples, sample_next;
        struct chief_db_checkpoint last_ckpt; /* newest recorded checkpoint, when have_ckpt */
        bool have_ckpt;
        uint32_t n_ckpts;
        bool have_eval;
        uint64_t eval_step;               /* latest evaluation, when have_eval */
        float eval_accuracy, eval_loss;
        double eval_auc, eval_rmse;       /* models with embeddings: logistic head / mse head; else NAN */
        float test_auc, test_rmse;        /* of the final evaluation, as eval_*; -1: none */
        uint64_t restored_step;
        char restored_from[1024];
        struct chief_divergence {         /* the first news of a model gone wrong; the main loop fails the job */
                bool on;
                char task[32];            /* "worker:0", "the evaluation" */
                char what[256];           /* "a non-finite loss (nan)", "weights blown up (...)" */
                uint64_t step;
        } diverged;
        struct rpc_call **save_calls;     /* SaveCheckpoint calls waiting for the main thread */
        size_t n_save_calls;
        bool saves_closed;
};

/* Sets up the lock and the condition, and the figures that start at -1; the caller sets the pointers. */
void chief_status_init(struct chief_status *s);
/* Frees what the status holds (NULL-safe). */
void chief_status_done(struct chief_status *s);

/* snprintf that truncates on purpose: reasons and states are bounded, and a cut message beats none. */
void chief_strfmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Applies ev to the job's state (lock held); wakes the watchers when the state changed. Returns the
 * state now. */
Psfleet__V1__JobState chief_event_locked(struct chief_status *s, const struct chief_event *ev);
/* The same, taking the lock. */
Psfleet__V1__JobState chief_event(struct chief_status *s, const struct chief_event *ev);

void chief_add_sample_locked(struct chief_status *s, uint64_t t, uint64_t step);
/* global_step per second over the last RATE_WINDOW_US; after the end, over the whole training. */
double chief_steps_per_s_locked(const struct chief_status *s);
/* Mean of every worker's latest reported loss; NAN before any report, and NaN or Inf when a worker
 * reported one. */
float chief_loss_locked(const struct chief_status *s);
/* Call after raising global_step: remembers when it first moved after READY. */
void chief_note_progress_locked(struct chief_status *s, uint64_t t);
/* Records that global_step reached max_steps, or that a stop was requested: the end of training. */
void chief_mark_end_locked(struct chief_status *s);

/* Weighs worker w's Report (lock held) before any of it is taken (chief_state_report_ok): -EINVAL
 * with why (len bytes) and nothing changed; 0: take it; 1: take it, and it says the model went wrong
 * (recorded by chief_note_diverged_locked: wake the main loop, which fails the job). */
int chief_report_admit_locked(struct chief_status *s, uint32_t w, uint64_t global_step, float loss, const char *state,
                              char *why, size_t len);
/* Records the first news of a model gone wrong (task reported what at global_step step) for the
 * main loop. Lock held. */
void chief_note_diverged_locked(struct chief_status *s, const char *task, const char *what, uint64_t step);
/* The chief set every shard's values (initialized or restored): each worker's next report may go back
 * from its last. Lock held. */
void chief_forget_report_steps_locked(struct chief_status *s);

/* Records the job's row in the database; a failure is logged and ignored. */
void chief_save_job(struct chief_status *s);
/* The same, with the lock held (every state change is recorded so, by chief_event_locked). */
void chief_save_job_locked(struct chief_status *s);
/* Sets what the job waits for: since_us and a deadline timeout_s later (wall clock). Lock held. */
void chief_wait_set_locked(struct chief_status *s, const char *peer, uint64_t since_us, uint64_t timeout_s,
                           const char *last_error);
void chief_wait_clear(struct chief_status *s);
/* Records a shard's loss (SQLite, the status, one journal line is the caller's). */
void chief_add_loss(struct chief_status *s, const struct chief_db_loss *l);
/* Whether worker w reported within supervisor.worker_timeout_secs of now (wall clock). Lock held. */
bool chief_worker_live_locked(const struct chief_status *s, uint32_t w, uint64_t now);
/* How many workers are live now. Lock held. */
uint32_t chief_n_live_locked(const struct chief_status *s, uint64_t now);
/* Refreshes the newest checkpoint and the count that the status shows. */
void chief_refresh_ckpt_info(struct chief_status *s);
/* The job's status, packed (caller owns the buffer); NULL when out of memory. */
grpc_byte_buffer *chief_status_pack(struct chief_status *s);

/* SaveCheckpoint calls wait in the status for the main thread, which takes one checkpoint for all. */
/* Queues call (lock held). 0, or -ENOMEM and the call is the caller's to fail. */
int chief_saves_add_locked(struct chief_status *s, struct rpc_call *call);
/* Whether SaveCheckpoint calls are waiting. */
bool chief_saves_pending(struct chief_status *s);
/* Answers every queued SaveCheckpoint: with row, or with the error r/err. Main thread. */
void chief_answer_saves(struct chief_status *s, int r, const struct chief_db_checkpoint *row, bool existing,
                        const char *err);
