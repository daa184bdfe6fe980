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
#include "chief_status.h"
#include "optim.h"
#include "rpc.h"

#define POLL_US (250 * 1000ULL)          /* global_step and shard status polling */
#define PROBE_TIMEOUT_MS 2000            /* status calls: short, so a signal is never kept waiting long */
#define BACKOFF_MIN_US (100 * 1000ULL)
#define BACKOFF_MAX_US (2 * 1000 * 1000ULL)
#define STOP_WAIT_US (30 * 1000 * 1000ULL) /* how long STOPPING waits for workers to finish */
/* After a stop (SIGTERM, Stop): the workers are told at once and waited for this long, so that the
 * final checkpoint and ParameterServer.Stop fit well inside the unit's TimeoutStopSec (30 s). */
#define STOP_FAST_US (5 * 1000 * 1000ULL)
#define NOTIFY_EVERY_US (1000 * 1000ULL)
#define EVAL_BATCH 500
#define SNAPSHOT_RETRY_US (5 * 1000000ULL)  /* after a failed scheduled checkpoint or evaluation */




struct watcher;


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
        struct watcher *new_watchers;     /* handed over by the Watch handler, taken by the watch thread */
        bool watch_closed;
        pthread_t watch_thread;
        bool watch_started;

        struct chief_status st;           /* what the chief reports, with its lock (chief_status.h) */
};

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

/* ---- chief_loop.c: the main thread ---- */

/* Runs the job until it is told to stop (a signal, Stop): while it trains, after an orderly stop
 * (the workers told, a final checkpoint, STOPPED, the shards told); after the end (DONE, FAILED) at
 * once. Returns 0, or -errno when the loop itself cannot go on. */
int chief_supervise(struct chief *c, int sfd);
