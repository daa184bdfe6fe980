/* chiefd's shared state, private to its files: `struct chief` and what each file offers the others.
 *
 * Threads: the RPC server's threads run the handlers (chief_rpc.c), which only read and update
 * `struct chief` under its lock (SaveCheckpoint is queued for the main thread and answered when done).
 * The main thread (chief_loop.c) owns every outgoing call and every state change that needs one
 * (waiting for the shards, initializing or restoring them, polling global_step, snapshots: checkpoints
 * and evaluations, the end) and is the one place where signals are handled (signalfd). The watch
 * thread (chief_watch.c) sends JobStatus to Watch streams. Every state change is decided by the pure
 * state machine of chief_state.c. */
#pragma once
#include <grpc/grpc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chief_ckpt.h"
#include "chief_db.h"
#include "chief_state.h"
#include "optim.h"
#include "rpc.h"

#define POLL_US (250 * 1000ULL)          /* global_step and shard status polling */
#define PROBE_TIMEOUT_MS 2000            /* status calls: short, so a signal is never kept waiting long */
#define BACKOFF_MIN_US (100 * 1000ULL)
#define BACKOFF_MAX_US (2 * 1000 * 1000ULL)
#define RATE_WINDOW_US (10 * 1000 * 1000ULL)
#define STOP_WAIT_US (30 * 1000 * 1000ULL) /* how long STOPPING waits for workers to finish */
/* After a stop (SIGTERM, Stop): the workers are told at once and waited for this long, so that the
 * final checkpoint and ParameterServer.Stop fit well inside the unit's TimeoutStopSec (30 s). */
#define STOP_FAST_US (5 * 1000 * 1000ULL)
#define NOTIFY_EVERY_US (1000 * 1000ULL)
#define EVAL_BATCH 500
#define N_SAMPLES 64
#define SNAPSHOT_RETRY_US (5 * 1000000ULL)  /* after a failed scheduled checkpoint or evaluation */

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
};

struct sample {
        uint64_t t_mono, step;
};

struct watcher;

/* What the job waits for (JobStatus.waiting_for), when `on`. */
struct chief_wait {
        bool on;
        char peer[32];                  /* "ps:1", "workers", "checkpoint" */
        uint64_t since_us, deadline_us; /* wall clock */
        char last_error[512];
};

struct chief {
        /* Set up by chief_new() before the server starts; read-only afterwards. */
        struct job_config *cfg;
        char *canonical;
        uint64_t fingerprint;
        struct chief_db *db;
        struct backend *be;
        struct model *model;
        struct job_layout *L;
        struct ps_client *pc;
        struct dataset *test;
        struct rpc_channel **worker_ch;   /* (n_worker) */
        int wake_fd;                      /* eventfd: Stop and SaveCheckpoint wake the main loop */
        struct chief_ckpt *ckpts;         /* thread-safe: the handlers list and delete too */
        char *summary_dir;
        struct summary_writer *sw;        /* thread-safe; NULL when summaries are off or failed */
        float *slots[OPTIM_MAX_SLOTS];    /* (n_params) each: a snapshot's optimizer slots (main thread) */
        unsigned n_slots;

        /* Main thread only. */
        bool force_restore;               /* after Restart: every shard restored (or initialized) anew */
        uint64_t last_save_step, last_save_mono, last_eval_step, last_summary_mono;
        uint64_t next_snapshot_try;       /* mono: after a failed scheduled snapshot */

        pthread_mutex_t watch_mu;         /* protects the watch fields below */
        pthread_cond_t watch_cond;
        struct watcher *new_watchers;     /* handed over by the Watch handler, taken by the watch thread */
        bool watch_closed;
        pthread_t watch_thread;
        bool watch_started;

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

/* ---- chief_status.c: figures derived under the lock, the state's changes, the JobStatus message ---- */

/* snprintf that truncates on purpose: reasons and states are bounded, and a cut message beats none. */
void chief_strfmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Applies ev to the job's state (lock held); wakes the watchers when the state changed. Returns the
 * state now. */
Psfleet__V1__JobState chief_event_locked(struct chief *c, const struct chief_event *ev);
/* The same, taking the lock. */
Psfleet__V1__JobState chief_event(struct chief *c, const struct chief_event *ev);

void chief_add_sample_locked(struct chief *c, uint64_t t, uint64_t step);
/* global_step per second over the last RATE_WINDOW_US; after the end, over the whole training. */
double chief_steps_per_s_locked(const struct chief *c);
/* Mean of every worker's latest reported loss; NAN before any report, and NaN or Inf when a worker
 * reported one. */
float chief_loss_locked(const struct chief *c);
/* Call after raising global_step: remembers when it first moved after READY. */
void chief_note_progress_locked(struct chief *c, uint64_t t);
/* Records that global_step reached max_steps, or that a stop was requested: the end of training. */
void chief_mark_end_locked(struct chief *c);

/* Weighs worker w's Report (lock held) before any of it is taken (chief_state_report_ok): -EINVAL
 * with why (len bytes) and nothing changed; 0: take it; 1: take it, and it says the model went wrong
 * (recorded by chief_note_diverged_locked: wake the main loop, which fails the job). */
int chief_report_admit_locked(struct chief *c, uint32_t w, uint64_t global_step, float loss, const char *state,
                              char *why, size_t len);
/* Records the first news of a model gone wrong (task reported what at global_step step) for the
 * main loop. Lock held. */
void chief_note_diverged_locked(struct chief *c, const char *task, const char *what, uint64_t step);
/* The chief set every shard's values (initialized or restored): each worker's next report may go back
 * from its last. Lock held. */
void chief_forget_report_steps_locked(struct chief *c);

/* Records the job's row in the database; a failure is logged and ignored. */
void chief_save_job(struct chief *c);
/* The same, with the lock held (every state change is recorded so, by chief_event_locked). */
void chief_save_job_locked(struct chief *c);
/* Sets what the job waits for: since_us and a deadline timeout_s later (wall clock). Lock held. */
void chief_wait_set_locked(struct chief *c, const char *peer, uint64_t since_us, uint64_t timeout_s,
                           const char *last_error);
void chief_wait_clear(struct chief *c);
/* Records a shard's loss (SQLite, the status, one journal line is the caller's). */
void chief_add_loss(struct chief *c, const struct chief_db_loss *l);
/* Whether worker w reported within supervisor.worker_timeout_secs of now (wall clock). Lock held. */
bool chief_worker_live_locked(const struct chief *c, uint32_t w, uint64_t now);
/* Refreshes the newest checkpoint and the count that the status shows. */
void chief_refresh_ckpt_info(struct chief *c);
/* The job's status, packed (caller owns the buffer); NULL when out of memory. */
grpc_byte_buffer *chief_status_pack(struct chief *c);

/* ---- chief_rpc.c: the Supervisor service's handlers (server threads) ---- */

#define CHIEF_RPC_N_METHODS 10
/* Fills m with every method chiefd serves, each with c as its user data. */
void chief_rpc_methods(struct chief *c, struct rpc_method m[CHIEF_RPC_N_METHODS]);
/* The call's request, unpacked (free it with protobuf_c_message_free_unpacked); NULL when it does not
 * parse, and the call has then failed with INVALID_ARGUMENT. */
ProtobufCMessage *chief_rpc_request(struct rpc_call *call, const ProtobufCMessageDescriptor *desc);
/* Wakes the main loop (Stop, Restart, SaveCheckpoint). */
void chief_wake(struct chief *c);
/* Whether SaveCheckpoint calls are waiting for the main thread. */
bool chief_saves_pending(struct chief *c);
/* Answers every queued SaveCheckpoint: with row, or with the error r/err. Main thread. */
void chief_answer_saves(struct chief *c, int r, const struct chief_db_checkpoint *row, bool existing,
                        const char *err);

/* ---- chief_watch.c: the Watch streams ---- */

void chief_watch_handler(struct rpc_call *call, void *ud);
/* Starts the thread that serves the streams. Returns 0 or -errno. */
int chief_watch_start(struct chief *c);
/* Ends every stream (each gets the job's last word first) and joins the thread; refuses new streams. */
void chief_watch_stop(struct chief *c);

/* ---- chief_probe.c: status calls to the shards and the workers (main thread) ---- */

/* Asks every shard for its status and records it. Returns the number of shards reachable; *n_init gets
 * the number initialized; why gets the first failure. */
uint32_t chief_probe_shards(struct chief *c, uint32_t *n_init, char *why, size_t len);
/* Asks every worker not yet finished whether it still computes, and records it. Returns how many do;
 * *first_busy gets the first of them (-1: none). */
uint32_t chief_probe_workers(struct chief *c, int64_t *first_busy);
/* Tells every worker to stop; who does not answer is not waited for. */
void chief_stop_workers(struct chief *c);

/* ---- chief_snapshot.c: summaries, evaluations, checkpoints, restores (main thread) ---- */

/* A TensorBoard SessionLog event (a SUMMARY_SESSION_* status), when summaries are on. */
void chief_session_log(struct chief *c, uint64_t step, int status, const char *path, const char *msg);
/* Every save_summaries_secs while the job runs: losses, rates, learning rate. */
void chief_maybe_write_summaries(struct chief *c);
/* Reads every shard into the model's block (and the slots when with_slots); *gs_ret from shard 0. */
int chief_pull(struct chief *c, bool with_slots, uint64_t *gs_ret, char *err, size_t errlen);
/* Evaluates the pulled values on the test split; records and summarizes the result. */
int chief_evaluate(struct chief *c, uint64_t gs, char *err, size_t errlen);
/* Writes and records the pulled values (with the slots when pulled) as the checkpoint of gs. A
 * request at the step of the newest checkpoint returns that one (*existing). A failure is kept as the
 * status's last_checkpoint_error until the next save succeeds. */
int chief_save(struct chief *c, uint64_t gs, bool with_slots, const char *trigger, struct chief_db_checkpoint *ret,
               bool *existing, char *err, size_t errlen);
/* Scheduled checkpoints and evaluations; a failure is logged and retried later. */
void chief_maybe_snapshot(struct chief *c);
/* SaveCheckpoint calls that wait: one checkpoint now answers them all. */
void chief_serve_saves(struct chief *c);
/* Restores the shards in which[] from the newest usable checkpoint. Returns 1 (restored), 0 (no
 * usable checkpoint: nothing done), -EINVAL (the checkpoints hold a different model: fatal) or
 * another -errno (assigning failed: retry); why says what happened. */
int chief_restore_shards(struct chief *c, const bool *which, char *why, size_t len);
/* The shards in which[] (NULL: all) get every embedding table as tables[e] holds it (each shard its own
 * ids), or empty when tables is NULL (a fresh start); before the Assign that makes a shard initialized.
 * 0, or -errno with why in err. */
struct ps_sparse_rows;
int chief_import_tables(struct chief *c, const bool *which, const struct ps_sparse_rows *tables, uint64_t gs,
                        char *err, size_t errlen);

/* ---- chief_metrics.c: the series a scrape shows (base/metrics.h) ---- */

/* Registers chiefd's series (after c->cfg is set); chief_metrics_done frees what init allocated. */
void chief_metrics_init(struct chief *c);
void chief_metrics_done(void);
/* The job's state is now st (one-hot psfleet_chief_job_state). */
void chief_metrics_state(Psfleet__V1__JobState st);
/* global_step, its rate and the live workers, from c (lock held); each pass of the main loop. */
void chief_metrics_tick_locked(struct chief *c);
/* Worker `worker`'s report was taken. */
void chief_metrics_report(uint32_t worker);
/* A checkpoint save ended with r; when r >= 0, row is the newest checkpoint, written in us
 * microseconds (0: found, not written, as at start). */
void chief_metrics_checkpoint(int r, uint64_t us, const struct chief_db_checkpoint *row);

/* ---- chief_loop.c: the main thread ---- */

/* Runs the job until it is told to stop (a signal, Stop): while it trains, after an orderly stop
 * (the workers told, a final checkpoint, STOPPED, the shards told); after the end (DONE, FAILED) at
 * once. Returns 0, or -errno when the loop itself cannot go on. */
int chief_supervise(struct chief *c, int sfd);
