/* chiefd's `struct chief`: the parts chiefd.c builds, as the three files at the top use them. Only
 * chiefd.c (builds and frees it), chief_loop.c (the main thread, which drives every part) and
 * chief_rpc.c (the Supervisor handlers, which answer from several parts at once) include this header;
 * every file below them gets its own struct or explicit parameters (chief_status.h, chief_save.h,
 * chief_eval.h, chief_probe.h, chief_watch.h, chief_metrics.h, chief_ckpt.h, chief_db.h).
 *
 * Threads: the RPC server's threads run the handlers (chief_rpc.c), which read and update the status
 * under its lock (SaveCheckpoint is queued in it for the main thread and answered when done). The
 * main thread (chief_loop.c) owns every outgoing call and every state change that needs one (waiting
 * for the shards, initializing or restoring them, polling global_step, snapshots: checkpoints and
 * evaluations, the end) and is the one place where signals are handled (signalfd). The watch thread
 * (chief_watch.c) sends JobStatus to Watch streams; the export thread (chief_exporter.c) writes the
 * exports Export asks for, one at a time, and answers them. Every state change is decided by the pure state
 * machine of chief_state.c, applied in chief_status.c. */
#pragma once
#include <grpc/grpc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chief_ckpt.h"
#include "chief_db.h"
#include "chief_eval.h"
#include "chief_exporter.h"
#include "chief_probe.h"
#include "chief_save.h"
#include "chief_state.h"
#include "chief_status.h"
#include "chief_watch.h"
#include "optim.h"
#include "rpc.h"

#define POLL_US (250 * 1000ULL)          /* global_step and shard status polling */
#define BACKOFF_MIN_US (100 * 1000ULL)
#define BACKOFF_MAX_US (2 * 1000 * 1000ULL)
#define STOP_WAIT_US (30 * 1000 * 1000ULL) /* how long STOPPING waits for workers to finish */
/* After a stop (SIGTERM, Stop): the workers are told at once and waited for this long, so that the
 * final checkpoint and ParameterServer.Stop fit well inside the unit's TimeoutStopSec (30 s). */
#define STOP_FAST_US (5 * 1000 * 1000ULL)
#define NOTIFY_EVERY_US (1000 * 1000ULL)
#define SNAPSHOT_RETRY_US (5 * 1000000ULL)  /* after a failed scheduled checkpoint or evaluation */

#define CHIEF_RPC_N_METHODS 11
#define CHIEF_RPC_N_HANDLERS 8           /* the methods with a request, unpacked before their handler */
struct chief;
/* A method whose request chief_rpc.c unpacks (as desc) before calling fn; the request is freed after. */
struct chief_handler {
        struct chief *c;
        const ProtobufCMessageDescriptor *desc;
        void (*fn)(struct chief *c, struct rpc_call *call, const ProtobufCMessage *request);
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
        bool exit_at_end;                 /* --exit-at-end: the end of the job ends chiefd */

        /* Main thread only. */
        bool force_restore;               /* after Restart: every shard restored (or initialized) anew */
        uint64_t prev_run_step;           /* the step the job reached before this chiefd started (its record,
                                           * the workers' last reports); 0 once the first restore is counted */
        uint64_t next_snapshot_try;       /* mono: after a failed scheduled snapshot */
        struct chief_save sv;             /* pulls, checkpoints, restores (chief_save.h) */
        struct chief_eval ev;             /* evaluations and summaries (chief_eval.h) */

        struct chief_watch *watch;        /* the Watch streams' thread (chief_watch.h); thread-safe */
        struct chief_exporter *exporter;  /* the Export calls' thread (chief_exporter.h); thread-safe */
        struct chief_handler handlers[CHIEF_RPC_N_HANDLERS];   /* the methods' user data (chief_rpc_methods) */

        struct chief_status st;           /* what the chief reports, with its lock (chief_status.h) */
};

/* ---- chief_rpc.c: the Supervisor service's handlers (server threads) ---- */

/* Fills m with every method chiefd serves, with c (or its entry in c->handlers) as user data. */
void chief_rpc_methods(struct chief *c, struct rpc_method m[CHIEF_RPC_N_METHODS]);
/* Wakes the main loop (Stop, Restart, SaveCheckpoint). */
void chief_wake(struct chief *c);

/* ---- chief_loop.c: the main thread ---- */

/* Runs the job until it is told to stop (a signal, Stop): while it trains, after an orderly stop
 * (the workers told, a final checkpoint, STOPPED, the shards told); after the end (DONE, FAILED) at
 * once. Returns 0, or -errno when the loop itself cannot go on. */
int chief_supervise(struct chief *c, int sfd);
