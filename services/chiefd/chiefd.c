/* chiefd: the supervisor of one job. Initializes every ps shard or restores it from the latest
 * checkpoint, lets workers join once the job is ready, tracks global_step and per-worker progress
 * (SQLite), saves checkpoints (safetensors) on schedule and on request, writes TensorBoard summaries,
 * evaluates on the test split, answers GetStatus and Watch, and tells everyone to stop.
 *
 * Threads: the RPC server's threads run the handlers (Join, Report, GetStatus, Stop, the checkpoint
 * calls, health), which only read and update `struct chief` under its lock (SaveCheckpoint is queued
 * for the main thread and answered when done). The main thread owns every outgoing call and every
 * state change that needs one (waiting for the shards, initializing or restoring them, polling
 * global_step, snapshots: checkpoints and evaluations, the end) and is the one place where signals are
 * handled (signalfd). The watch thread sends JobStatus to Watch streams. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "backend.h"
#include "chief_ckpt.h"
#include "chief_db.h"
#include "config.h"
#include "daemon.h"
#include "data.h"
#include "job.h"
#include "ps_client.h"
#include "log.h"
#include "model.h"
#include "notify.h"
#include "optim.h"
#include "rpc.h"
#include "summary.h"
#include "trainer.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"
#include "psfleet/v1/supervisor.pb-c.h"
#include "psfleet/v1/worker.pb-c.h"

#define M_JOIN "/psfleet.v1.Supervisor/Join"
#define M_REPORT "/psfleet.v1.Supervisor/Report"
#define M_STATUS "/psfleet.v1.Supervisor/GetStatus"
#define M_STOP "/psfleet.v1.Supervisor/Stop"
#define M_WATCH "/psfleet.v1.Supervisor/Watch"
#define M_LIST_CKPT "/psfleet.v1.Supervisor/ListCheckpoints"
#define M_SAVE_CKPT "/psfleet.v1.Supervisor/SaveCheckpoint"
#define M_DELETE_CKPT "/psfleet.v1.Supervisor/DeleteCheckpoint"
#define M_WORKER_STATUS "/psfleet.v1.Worker/GetWorkerStatus"
#define M_WORKER_STOP "/psfleet.v1.Worker/Stop"

#define POLL_US (250 * 1000ULL)          /* global_step and shard status polling */
#define PROBE_TIMEOUT_MS 2000            /* status calls: short, so a signal is never kept waiting long */
#define BACKOFF_MIN_US (100 * 1000ULL)
#define BACKOFF_MAX_US (2 * 1000 * 1000ULL)
#define RATE_WINDOW_US (10 * 1000 * 1000ULL)
#define STOP_WAIT_US (30 * 1000 * 1000ULL) /* how long STOPPING waits for workers to finish */
#define NOTIFY_EVERY_US (1000 * 1000ULL)
#define EVAL_BATCH 500
#define N_SAMPLES 64
#define SNAPSHOT_RETRY_US (5 * 1000000ULL)  /* after a failed scheduled checkpoint or evaluation */
#define WATCH_TICK_MS 100                  /* how often the watch thread looks for changes */
#define WATCH_SEND_TIMEOUT_MS 5000         /* a watcher that reads nothing for this long is dropped */
#define TEST_DELAY_ENV "PSFLEET_TEST_CHECKPOINT_DELAY_MS"

static const char *const health_services[] = {"psfleet.v1.Supervisor", NULL};

struct worker_info {
        bool joined, reported, finished;
        uint64_t local_step, global_step, examples;
        float loss, examples_per_s;
        uint64_t last_report_us;        /* wall clock */
        char state[128];
};

struct ps_info {
        bool reachable, initialized;
        uint64_t incarnation, global_step, last_seen_us;
        uint64_t lost_since_mono;       /* 0 while reachable */
        char state[256];
};

struct sample {
        uint64_t t_mono, step;
};

/* One Watch stream. */
struct watcher {
        struct rpc_call *call;
        uint64_t min_interval_us, heartbeat_us;
        uint64_t last_sent_mono;
        uint64_t key;                     /* hash of what the last message showed */
        bool sent;
        struct watcher *next;
};

struct chief {
        /* Set up by run() before the server starts; read-only afterwards. */
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
        uint64_t test_delay_ms;           /* the checkpoint test hook, 0: off */

        /* Main thread only. */
        uint64_t last_save_step, last_save_mono, last_eval_step, last_summary_mono;
        uint64_t next_snapshot_try;       /* mono: after a failed scheduled snapshot */
        Psfleet__V1__JobState resume_state; /* READY or TRAINING: where a shard's restore returns to */

        pthread_mutex_t watch_mu;         /* protects the watch fields below */
        pthread_cond_t watch_cond;
        struct watcher *new_watchers;     /* handed over by h_watch, taken by the watch thread */
        bool watch_closed;
        pthread_t watch_thread;
        bool watch_started;

        pthread_mutex_t lock;             /* protects everything below */
        Psfleet__V1__JobState state;
        char reason[512];
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
        uint64_t restored_step;
        char restored_from[1024];
        struct rpc_call **save_calls;     /* SaveCheckpoint calls waiting for the main thread */
        size_t n_save_calls;
        bool saves_closed;
};

/* snprintf that truncates on purpose: reasons and states are bounded, and a cut message beats none. */
static void strfmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void strfmt(char *buf, size_t len, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, len, fmt, ap);
        va_end(ap);
}

/* ---- derived figures (lock held) ---- */

static void add_sample_locked(struct chief *c, uint64_t t, uint64_t step) {
        c->samples[c->sample_next] = (struct sample){t, step};
        c->sample_next = (c->sample_next + 1) % N_SAMPLES;
        if (c->n_samples < N_SAMPLES)
                c->n_samples++;
}

/* global_step per second over the last RATE_WINDOW_US; after the end, over the whole training. */
static double steps_per_s_locked(const struct chief *c) {
        /* After the end: the rate while training, from the first step seen to the end, so that the
         * workers' start-up (loading data) does not count against throughput; wall_s does include it. */
        if (c->end_mono && c->first_mono && c->end_mono > c->first_mono)
                return (double)(c->end_step - c->first_step) * 1e6 / (double)(c->end_mono - c->first_mono);
        if (c->end_mono && c->wall_s > 0)
                return (double)(c->end_step - c->ready_step) / c->wall_s;
        if (c->n_samples < 2)
                return 0;
        const struct sample *newest = &c->samples[(c->sample_next + N_SAMPLES - 1) % N_SAMPLES];
        const struct sample *oldest = NULL;
        for (unsigned i = 0; i < c->n_samples; i++) {
                const struct sample *s = &c->samples[(c->sample_next + N_SAMPLES - c->n_samples + i) % N_SAMPLES];
                if (newest->t_mono - s->t_mono <= RATE_WINDOW_US) {
                        oldest = s;
                        break;
                }
        }
        if (!oldest || oldest == newest || newest->t_mono <= oldest->t_mono)
                return 0;
        return (double)(newest->step - oldest->step) * 1e6 / (double)(newest->t_mono - oldest->t_mono);
}

/* Mean of every worker's latest reported loss; NAN before any report. */
static float loss_locked(const struct chief *c) {
        double sum = 0;
        unsigned n = 0;
        for (uint32_t w = 0; w < c->cfg->cluster.n_worker; w++)
                if (c->workers[w].reported && isfinite(c->workers[w].loss)) {
                        sum += c->workers[w].loss;
                        n++;
                }
        return n ? (float)(sum / n) : NAN;
}

static void set_state_locked(struct chief *c, Psfleet__V1__JobState s, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static void set_state_locked(struct chief *c, Psfleet__V1__JobState s, const char *fmt, ...) {
        if (c->state != s)
                pthread_cond_signal(&c->watch_cond);   /* watchers hear of it now, not at the next tick */
        c->state = s;
        if (fmt) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(c->reason, sizeof(c->reason), fmt, ap);
                va_end(ap);
        } else {
                c->reason[0] = 0;
        }
}

/* Call after raising global_step: remembers when it first moved after READY. */
static void note_progress_locked(struct chief *c, uint64_t t) {
        if (!c->first_mono && c->ready_mono && c->global_step > c->ready_step) {
                c->first_mono = t;
                c->first_step = c->global_step;
        }
}

/* Records that global_step reached max_steps, or that a stop was requested: the end of training. */
static void mark_end_locked(struct chief *c) {
        if (c->end_mono)
                return;
        c->end_mono = mono_us();
        c->end_step = c->global_step;
        c->wall_s = c->ready_mono ? (float)((double)(c->end_mono - c->ready_mono) / 1e6) : 0;
}

static bool should_stop_locked(const struct chief *c) {
        return c->stop_requested || c->global_step >= c->cfg->training.max_steps ||
               c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING ||
               c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE ||
               c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED;
}

static void save_job(struct chief *c) {
        pthread_mutex_lock(&c->lock);
        struct chief_db_job j = {
                .fingerprint = c->fingerprint,
                .state = c->state,
                .global_step = c->global_step,
                .max_steps = c->cfg->training.max_steps,
                .started_us = c->started_us,
                .updated_us = now_us(),
                .test_accuracy = c->test_accuracy,
                .test_loss = c->test_loss,
                .wall_s = c->wall_s,
        };
        pthread_mutex_unlock(&c->lock);
        int r = chief_db_save_job(c->db, &j);
        if (r < 0)
                log_warning_errno(r, "Cannot record the job's state in the database, continuing");
}

/* ---- RPC handlers (server threads) ---- */


/* "worker:3" -> 3 when it names a worker of the cluster, else -1. */
static int64_t worker_index(const struct chief *c, const char *task) {
        unsigned idx;
        char role[16], extra;
        if (!task || sscanf(task, "%15[^:]:%u%c", role, &idx, &extra) != 2 || strcmp(role, "worker") != 0 ||
            idx >= c->cfg->cluster.n_worker)
                return -1;
        return idx;
}

static void h_join(struct rpc_call *call, void *ud) {
        struct chief *c = ud;
        ProtobufCMessage *m;
        if (wire_unpack(rpc_call_payload(call), &psfleet__v1__join_request__descriptor, &m) < 0) {
                rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "JoinRequest does not parse");
                return;
        }
        const Psfleet__V1__JoinRequest *q = (const Psfleet__V1__JoinRequest *)m;
        const char *task = q->task && *q->task ? q->task : "(unnamed task)";
        Psfleet__V1__JoinReply rep = PSFLEET__V1__JOIN_REPLY__INIT;
        char reason[1024];

        rep.max_steps = c->cfg->training.max_steps;
        if (q->fingerprint != c->fingerprint) {
                char diff[768];
                int d = q->job_json && *q->job_json ? config_diff(c->canonical, q->job_json, diff, sizeof(diff))
                                                    : -EINVAL;
                if (d == 1)
                        strfmt(reason, sizeof(reason), "job file differs from the chief's: %s", diff);
                else
                        strfmt(reason, sizeof(reason),
                                 "job fingerprint %016" PRIx64 " differs from the chief's %016" PRIx64,
                                 q->fingerprint, c->fingerprint);
                log_warning("Refusing %s: %s", task, reason);
                rep.refused = true;
                rep.reason = reason;
                pthread_mutex_lock(&c->lock);
                rep.state = c->state;
                rep.global_step = c->global_step;
                pthread_mutex_unlock(&c->lock);
                rpc_call_reply_msg(call, &rep.base);
                protobuf_c_message_free_unpacked(m, NULL);
                return;
        }

        int64_t w = worker_index(c, q->task);
        pthread_mutex_lock(&c->lock);
        rep.state = c->state;
        rep.global_step = c->global_step;
        switch (c->state) {
        case PSFLEET__V1__JOB_STATE__JOB_STATE_READY:
        case PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING:
                rep.ready = !c->stop_requested;
                if (c->stop_requested)
                        strfmt(reason, sizeof(reason), "the job is stopping");
                else
                        reason[0] = 0;
                break;
        case PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING:
        case PSFLEET__V1__JOB_STATE__JOB_STATE_DONE:
                strfmt(reason, sizeof(reason), "the job has ended (%s at global_step %" PRIu64 ")",
                         job_state_name(c->state), c->global_step);
                break;
        case PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED:
                strfmt(reason, sizeof(reason), "the job failed: %s", c->reason);
                break;
        default:
                strfmt(reason, sizeof(reason), "the job is %s: %s", job_state_name(c->state),
                         c->reason[0] ? c->reason : "starting");
                break;
        }
        if (w >= 0) {
                struct worker_info *wi = &c->workers[w];
                bool first = !wi->joined;
                wi->joined = true;
                if (!wi->reported)
                        strfmt(wi->state, sizeof(wi->state), "%s", rep.ready ? "joined" : "waiting to join");
                if (first && rep.ready)
                        log_info("%s joined at global_step %" PRIu64, task, c->global_step);
        }
        pthread_mutex_unlock(&c->lock);
        rep.reason = reason;
        rpc_call_reply_msg(call, &rep.base);
        protobuf_c_message_free_unpacked(m, NULL);
}

static void h_report(struct rpc_call *call, void *ud) {
        static bool db_warned;  /* one warning per process, not one per report */
        struct chief *c = ud;
        ProtobufCMessage *m;
        if (wire_unpack(rpc_call_payload(call), &psfleet__v1__report_request__descriptor, &m) < 0) {
                rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "ReportRequest does not parse");
                return;
        }
        const Psfleet__V1__ReportRequest *q = (const Psfleet__V1__ReportRequest *)m;
        if (q->worker >= c->cfg->cluster.n_worker) {
                rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "worker %u is not in the cluster (%u workers)",
                              q->worker, c->cfg->cluster.n_worker);
                protobuf_c_message_free_unpacked(m, NULL);
                return;
        }
        const char *st = q->state && *q->state ? q->state : "training";
        uint64_t t = now_us();
        Psfleet__V1__ReportReply rep = PSFLEET__V1__REPORT_REPLY__INIT;

        pthread_mutex_lock(&c->lock);
        struct worker_info *wi = &c->workers[q->worker];
        wi->joined = wi->reported = true;
        wi->local_step = q->local_step;
        wi->global_step = q->global_step;
        wi->examples = q->examples;
        wi->loss = q->loss;
        wi->examples_per_s = q->examples_per_s;
        wi->last_report_us = t;
        strfmt(wi->state, sizeof(wi->state), "%s", st);
        if (strcmp(st, "done") == 0)
                wi->finished = true;
        if (q->global_step > c->global_step)
                c->global_step = q->global_step;
        note_progress_locked(c, mono_us());
        if (c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_READY && q->local_step > 0)
                set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING, NULL);
        if (c->global_step >= c->cfg->training.max_steps && c->ready_mono)
                mark_end_locked(c);
        rep.stop = should_stop_locked(c);
        rep.max_steps = c->cfg->training.max_steps;
        pthread_mutex_unlock(&c->lock);

        struct chief_db_progress p = {t, q->worker, q->local_step, q->global_step, q->loss, q->examples_per_s,
                                      q->examples, st};
        int r = chief_db_add_progress(c->db, &p);
        if (r < 0 && !__atomic_exchange_n(&db_warned, true, __ATOMIC_RELAXED))
                log_warning_errno(r, "Cannot record progress in the database, continuing without it");
        rpc_call_reply_msg(call, &rep.base);
        protobuf_c_message_free_unpacked(m, NULL);
}

/* A Checkpoint message pointing into row (which must outlive the packing). */
static void ckpt_msg(const struct chief_db_checkpoint *row, Psfleet__V1__Checkpoint *m) {
        psfleet__v1__checkpoint__init(m);
        m->global_step = row->global_step;
        m->time_us = row->time_us;
        m->path = (char *)row->path;
        m->bytes = row->bytes;
        m->checksum = (char *)row->checksum;
        m->loss = row->loss;
        m->eval_step = row->eval_step;
        m->eval_accuracy = row->eval_accuracy;
        m->eval_loss = row->eval_loss;
        m->trigger = (char *)row->trigger;
}

/* The job's status, packed (caller owns the buffer); NULL when out of memory. */
static grpc_byte_buffer *status_pack(struct chief *c) {
        const struct cluster *cl = &c->cfg->cluster;
        uint32_t n = cl->n_ps + cl->n_worker;
        Psfleet__V1__NodeStatus *nodes = calloc(n, sizeof(*nodes));
        Psfleet__V1__NodeStatus **np = calloc(n, sizeof(*np));
        char (*tasks)[32] = calloc(n, sizeof(*tasks));
        grpc_byte_buffer *bb = NULL;
        if (!nodes || !np || !tasks)
                goto out;
        Psfleet__V1__JobStatus s = PSFLEET__V1__JOB_STATUS__INIT;
        Psfleet__V1__Checkpoint last = PSFLEET__V1__CHECKPOINT__INIT;
        s.job = c->cfg->name;
        s.max_steps = c->cfg->training.max_steps;
        s.fingerprint = c->fingerprint;
        s.checkpoint_dir = (char *)chief_ckpt_dir(c->ckpts);
        s.summary_dir = c->summary_dir;

        pthread_mutex_lock(&c->lock);
        s.state = c->state;
        s.reason = c->reason;
        s.global_step = c->global_step;
        double sps = steps_per_s_locked(c);
        s.steps_per_s = (float)sps;
        s.examples_per_s = (float)(sps * c->cfg->training.batch_size);
        if (c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE || c->end_mono)
                s.eta_s = 0;
        else if (sps > 0)
                s.eta_s = (float)((double)(s.max_steps > s.global_step ? s.max_steps - s.global_step : 0) / sps);
        else
                s.eta_s = -1;
        s.loss = loss_locked(c);
        s.test_accuracy = c->test_accuracy;
        s.test_loss = c->test_loss;
        s.started_us = c->started_us;
        if (c->end_mono)
                s.wall_s = c->wall_s;
        else if (c->ready_mono)
                s.wall_s = (float)((double)(mono_us() - c->ready_mono) / 1e6);
        if (c->have_ckpt) {
                ckpt_msg(&c->last_ckpt, &last);
                s.last_checkpoint = &last;
        }
        s.checkpoints = c->n_ckpts;
        s.eval_step = c->have_eval ? c->eval_step : 0;
        s.eval_accuracy = c->have_eval ? c->eval_accuracy : -1;
        s.eval_loss = c->have_eval ? c->eval_loss : -1;
        s.restored_step = c->restored_step;
        s.restored_from = c->restored_from;
        for (uint32_t i = 0; i < cl->n_ps; i++) {
                Psfleet__V1__NodeStatus *ns = &nodes[i];
                const struct ps_info *pi = &c->ps[i];
                psfleet__v1__node_status__init(ns);
                strfmt(tasks[i], sizeof(tasks[i]), "ps:%u", i);
                ns->task = tasks[i];
                ns->address = cl->ps[i].addr;
                ns->state = (char *)(pi->state[0] ? pi->state : "unknown");
                ns->local_step = pi->global_step;
                ns->last_report_us = pi->last_seen_us;
                np[i] = ns;
        }
        for (uint32_t w = 0; w < cl->n_worker; w++) {
                Psfleet__V1__NodeStatus *ns = &nodes[cl->n_ps + w];
                const struct worker_info *wi = &c->workers[w];
                psfleet__v1__node_status__init(ns);
                strfmt(tasks[cl->n_ps + w], sizeof(tasks[0]), "worker:%u", w);
                ns->task = tasks[cl->n_ps + w];
                ns->address = cl->worker[w].addr;
                ns->state = (char *)(wi->state[0] ? wi->state : "not joined");
                ns->local_step = wi->local_step;
                ns->loss = wi->loss;
                ns->examples_per_s = wi->examples_per_s;
                ns->last_report_us = wi->last_report_us;
                np[cl->n_ps + w] = ns;
        }
        s.n_nodes = n;
        s.nodes = np;
        bb = wire_pack(&s.base);   /* packs at once: the strings may change after unlock */
        pthread_mutex_unlock(&c->lock);
out:
        free(nodes);
        free(np);
        free(tasks);
        return bb;
}

static void h_status(struct rpc_call *call, void *ud) {
        grpc_byte_buffer *bb = status_pack(ud);
        if (!bb)
                rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        else
                rpc_call_reply(call, bb);
}

static void wake_main(struct chief *c) {
        uint64_t one = 1;
        if (write(c->wake_fd, &one, sizeof(one)) < 0) {
                /* The counter cannot overflow at one write per Stop call; nothing to do. */
        }
}

static void h_stop(struct rpc_call *call, void *ud) {
        struct chief *c = ud;
        ProtobufCMessage *m;
        if (wire_unpack(rpc_call_payload(call), &psfleet__v1__stop_request__descriptor, &m) < 0) {
                rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "StopRequest does not parse");
                return;
        }
        const Psfleet__V1__StopRequest *q = (const Psfleet__V1__StopRequest *)m;
        char *peer = rpc_call_peer(call);
        log_info("Stop requested by %s%s%s%s", peer ? peer : "a client", q->reason && *q->reason ? " (" : "",
                 q->reason && *q->reason ? q->reason : "", q->reason && *q->reason ? ")" : "");
        free(peer);
        pthread_mutex_lock(&c->lock);
        c->stop_requested = true;
        pthread_mutex_unlock(&c->lock);
        wake_main(c);
        Psfleet__V1__StopReply rep = PSFLEET__V1__STOP_REPLY__INIT;
        rpc_call_reply_msg(call, &rep.base);
        protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- checkpoints: list, save (queued for the main thread), delete ---- */

static bool ready_once_locked(const struct chief *c) {
        return c->ready_mono != 0;
}

/* Refreshes the newest checkpoint and the count that the status shows. */
static void refresh_ckpt_info(struct chief *c) {
        struct chief_db_checkpoint row;
        uint32_t n = 0;
        int r = chief_ckpt_newest(c->ckpts, &row, &n);
        pthread_mutex_lock(&c->lock);
        c->have_ckpt = r >= 0;
        if (r >= 0)
                c->last_ckpt = row;
        c->n_ckpts = n;
        pthread_mutex_unlock(&c->lock);
}

static void h_list_ckpts(struct rpc_call *call, void *ud) {
        struct chief *c = ud;
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0;
        int r = chief_db_list_checkpoints(c->db, &rows, &n);
        if (r < 0) {
                rpc_call_fail_errno(call, r, "cannot read the checkpoint records: %s", strerror(-r));
                return;
        }
        Psfleet__V1__Checkpoint *msgs = calloc(n ? n : 1, sizeof(*msgs));
        Psfleet__V1__Checkpoint **mp = calloc(n ? n : 1, sizeof(*mp));
        if (!msgs || !mp) {
                rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        } else {
                Psfleet__V1__ListCheckpointsReply rep = PSFLEET__V1__LIST_CHECKPOINTS_REPLY__INIT;
                for (size_t i = 0; i < n; i++) {
                        ckpt_msg(&rows[i], &msgs[i]);
                        mp[i] = &msgs[i];
                }
                rep.n_checkpoints = n;
                rep.checkpoints = mp;
                rep.checkpoint_dir = (char *)chief_ckpt_dir(c->ckpts);
                rep.keep = c->cfg->supervisor.keep_checkpoints;
                rpc_call_reply_msg(call, &rep.base);
        }
        free(msgs);
        free(mp);
        free(rows);
}

static void wake_main(struct chief *c);

static void h_save_ckpt(struct rpc_call *call, void *ud) {
        struct chief *c = ud;
        ProtobufCMessage *m;
        if (wire_unpack(rpc_call_payload(call), &psfleet__v1__save_checkpoint_request__descriptor, &m) < 0) {
                rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "SaveCheckpointRequest does not parse");
                return;
        }
        const char *why = ((const Psfleet__V1__SaveCheckpointRequest *)m)->reason;
        char *peer = rpc_call_peer(call);
        pthread_mutex_lock(&c->lock);
        Psfleet__V1__JobState st = c->state;
        bool queue = false;
        if (c->saves_closed) {
                rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "chiefd is stopping");
        } else if (st == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE) {
                if (c->have_ckpt)
                        rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                                      "the job is done; its final checkpoint is \"%s\" (global_step %" PRIu64 ")",
                                      c->last_ckpt.path, c->last_ckpt.global_step);
                else
                        rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "the job is done");
        } else if (st == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED) {
                rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "the job failed: %s", c->reason);
        } else if (!ready_once_locked(c)) {
                rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "the job is not ready yet (%s: %s)", job_state_name(st),
                              c->reason);
        } else {
                struct rpc_call **a = realloc(c->save_calls, (c->n_save_calls + 1) * sizeof(*a));
                if (!a) {
                        rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
                } else {
                        a[c->n_save_calls++] = call;
                        c->save_calls = a;
                        queue = true;
                }
        }
        pthread_mutex_unlock(&c->lock);
        if (queue) {
                log_info("Checkpoint requested by %s%s%s%s", peer ? peer : "a client", why && *why ? " (" : "",
                         why && *why ? why : "", why && *why ? ")" : "");
                wake_main(c);
        }
        free(peer);
        protobuf_c_message_free_unpacked(m, NULL);
}

/* Answers every queued SaveCheckpoint: with row, or with the error r/err. Main thread. */
static void answer_saves(struct chief *c, int r, const struct chief_db_checkpoint *row, bool existing, const char *err) {
        pthread_mutex_lock(&c->lock);
        struct rpc_call **calls = c->save_calls;
        size_t n = c->n_save_calls;
        c->save_calls = NULL;
        c->n_save_calls = 0;
        pthread_mutex_unlock(&c->lock);
        for (size_t i = 0; i < n; i++) {
                if (r < 0) {
                        rpc_call_fail_errno(calls[i], r, "%s", err);
                        continue;
                }
                Psfleet__V1__Checkpoint ck;
                ckpt_msg(row, &ck);
                Psfleet__V1__SaveCheckpointReply rep = PSFLEET__V1__SAVE_CHECKPOINT_REPLY__INIT;
                rep.checkpoint = &ck;
                rep.existing = existing;
                rpc_call_reply_msg(calls[i], &rep.base);
        }
        free(calls);
}

static bool saves_pending(struct chief *c) {
        pthread_mutex_lock(&c->lock);
        bool r = c->n_save_calls > 0;
        pthread_mutex_unlock(&c->lock);
        return r;
}

static void h_delete_ckpt(struct rpc_call *call, void *ud) {
        struct chief *c = ud;
        ProtobufCMessage *m;
        if (wire_unpack(rpc_call_payload(call), &psfleet__v1__delete_checkpoint_request__descriptor, &m) < 0) {
                rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "DeleteCheckpointRequest does not parse");
                return;
        }
        uint64_t step = ((const Psfleet__V1__DeleteCheckpointRequest *)m)->global_step;
        protobuf_c_message_free_unpacked(m, NULL);
        struct chief_db_checkpoint row;
        char err[512];
        int r = chief_ckpt_delete(c->ckpts, step, &row, err, sizeof(err));
        if (r < 0) {
                rpc_call_fail_errno(call, r, "%s", err);
                return;
        }
        char *peer = rpc_call_peer(call);
        log_info("Deleted the checkpoint of global_step %" PRIu64 " (\"%s\"), as %s asked", step, row.path,
                 peer ? peer : "a client");
        free(peer);
        refresh_ckpt_info(c);
        Psfleet__V1__Checkpoint ck;
        ckpt_msg(&row, &ck);
        Psfleet__V1__DeleteCheckpointReply rep = PSFLEET__V1__DELETE_CHECKPOINT_REPLY__INIT;
        rep.deleted = &ck;
        rpc_call_reply_msg(call, &rep.base);
}

/* ---- Watch: a thread sends JobStatus to every stream ---- */

static void h_watch(struct rpc_call *call, void *ud) {
        struct chief *c = ud;
        ProtobufCMessage *m;
        if (wire_unpack(rpc_call_payload(call), &psfleet__v1__watch_request__descriptor, &m) < 0) {
                rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "WatchRequest does not parse");
                return;
        }
        const Psfleet__V1__WatchRequest *q = (const Psfleet__V1__WatchRequest *)m;
        struct watcher *w = calloc(1, sizeof(*w));
        if (!w) {
                protobuf_c_message_free_unpacked(m, NULL);
                rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
                return;
        }
        uint32_t mi = q->min_interval_ms ? q->min_interval_ms : 500;
        w->call = call;
        w->min_interval_us = (uint64_t)(mi < 100 ? 100 : mi) * 1000;
        w->heartbeat_us = (uint64_t)(q->heartbeat_ms ? q->heartbeat_ms : 5000) * 1000;
        protobuf_c_message_free_unpacked(m, NULL);
        pthread_mutex_lock(&c->watch_mu);
        bool closed = c->watch_closed;
        if (!closed) {
                w->next = c->new_watchers;
                c->new_watchers = w;
                pthread_cond_signal(&c->watch_cond);
        }
        pthread_mutex_unlock(&c->watch_mu);
        if (closed) {
                free(w);
                rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "chiefd is stopping");
        }
}

/* What a watcher sees, hashed: a new value means a message is due. */
static uint64_t status_key(struct chief *c, bool *final) {
        uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
        pthread_mutex_lock(&c->lock);
        MIX(c->state);
        MIX(c->global_step);
        MIX(c->have_ckpt ? c->last_ckpt.global_step + 1 : 0);
        MIX(c->have_ckpt ? c->last_ckpt.time_us : 0);
        MIX(c->n_ckpts);
        MIX(c->have_eval ? c->eval_step + 1 : 0);
        for (const char *p = c->reason; *p; p++)
                MIX((unsigned char)*p);
        *final = c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE || c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED;
        pthread_mutex_unlock(&c->lock);
#undef MIX
        return h;
}

/* One pass over the watchers: sends where due, ends the streams that are over. Returns the list left. */
static struct watcher *watch_serve(struct chief *c, struct watcher *list) {
        bool final;
        uint64_t key = status_key(c, &final), t = mono_us();
        grpc_byte_buffer *bb = NULL;
        struct watcher **pp = &list;
        while (*pp) {
                struct watcher *w = *pp;
                bool drop = false;
                if (rpc_call_cancelled(w->call)) {
                        rpc_call_finish(w->call, GRPC_STATUS_CANCELLED, "the watcher went away");
                        drop = true;
                } else if (!w->sent || (key != w->key && t - w->last_sent_mono >= w->min_interval_us) ||
                           t - w->last_sent_mono >= w->heartbeat_us || final) {
                        if (!bb)
                                bb = status_pack(c);
                        int r = bb ? rpc_call_send(w->call, grpc_byte_buffer_copy(bb), WATCH_SEND_TIMEOUT_MS) : -ENOMEM;
                        if (r < 0) {
                                rpc_call_finish(w->call, r == -ETIMEDOUT ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_CANCELLED,
                                                "cannot send to the watcher");
                                drop = true;
                        } else if (final) {
                                rpc_call_finish(w->call, GRPC_STATUS_OK, NULL);
                                drop = true;
                        } else {
                                w->sent = true;
                                w->key = key;
                                w->last_sent_mono = t;
                        }
                }
                if (drop) {
                        *pp = w->next;
                        free(w);
                } else {
                        pp = &w->next;
                }
        }
        if (bb)
                grpc_byte_buffer_destroy(bb);
        return list;
}

static void *watch_main(void *arg) {
        struct chief *c = arg;
        struct watcher *active = NULL;
        pthread_mutex_lock(&c->watch_mu);
        for (;;) {
                while (c->new_watchers) {
                        struct watcher *w = c->new_watchers;
                        c->new_watchers = w->next;
                        w->next = active;
                        active = w;
                }
                if (c->watch_closed)
                        break;
                if (active) {
                        pthread_mutex_unlock(&c->watch_mu);
                        active = watch_serve(c, active);
                        pthread_mutex_lock(&c->watch_mu);
                }
                if (c->watch_closed || c->new_watchers)
                        continue;
                if (!active) {
                        pthread_cond_wait(&c->watch_cond, &c->watch_mu);
                } else {
                        struct timespec until;
                        clock_gettime(CLOCK_REALTIME, &until);
                        until.tv_nsec += WATCH_TICK_MS * 1000000L;
                        if (until.tv_nsec >= 1000000000L) {
                                until.tv_sec++;
                                until.tv_nsec -= 1000000000L;
                        }
                        pthread_cond_timedwait(&c->watch_cond, &c->watch_mu, &until);
                }
        }
        pthread_mutex_unlock(&c->watch_mu);
        /* A job that has just ended still gets its last word to every watcher (and the stream ends OK). */
        active = watch_serve(c, active);
        while (active) {
                struct watcher *w = active;
                active = w->next;
                rpc_call_finish(w->call, GRPC_STATUS_UNAVAILABLE, "chiefd is stopping");
                free(w);
        }
        return NULL;
}

/* Before the server shuts down: ends every stream and queued call, and refuses new ones. */
static void close_streams(struct chief *c) {
        pthread_mutex_lock(&c->lock);
        c->saves_closed = true;
        pthread_mutex_unlock(&c->lock);
        answer_saves(c, -ESHUTDOWN, NULL, false, "chiefd is stopping");
        pthread_mutex_lock(&c->watch_mu);
        c->watch_closed = true;
        pthread_cond_signal(&c->watch_cond);
        pthread_mutex_unlock(&c->watch_mu);
        if (c->watch_started) {
                pthread_join(c->watch_thread, NULL);
                c->watch_started = false;
        }
}

/* ---- the main loop's phases (main thread) ---- */

struct loop {
        uint64_t init_start, backoff, next;
        uint64_t restore_since;           /* mono: a restarted shard's restore began (0: none) */
        uint64_t last_notify, last_progress_log;
        uint64_t stop_begin;
        char last_why[512];
        uint64_t last_why_log;
};

static int fail_job(struct chief *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_job(struct chief *c, const char *fmt, ...) {
        char why[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        pthread_mutex_lock(&c->lock);
        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED, "%s", why);
        pthread_mutex_unlock(&c->lock);
        save_job(c);
        answer_saves(c, -EPERM, NULL, false, why);
        notify_status("failed: %s", why);
        return log_error_errno(-EIO, "Job failed: %s", why);
}

/* One status call with a short deadline. On failure writes "ps:1 (127.0.0.1:7002): UNAVAILABLE: ..."
 * into why. */
static int probe_call(struct rpc_channel *ch, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *reply_desc, uint64_t timeout_ms, ProtobufCMessage **ret,
                      char *why, size_t len) {
        struct rpc_result res;
        int r = rpc_call(ch, method, wire_pack(req), timeout_ms, false, &res);
        if (r < 0) {
                const char *tail = strstr(res.message, rpc_status_name(res.status));
                strfmt(why, len, "%s (%s): %s", rpc_channel_name(ch), rpc_channel_target(ch),
                         tail ? tail : res.message);
        } else {
                r = wire_unpack(res.reply, reply_desc, ret);
                if (r < 0)
                        strfmt(why, len, "%s (%s): reply does not parse", rpc_channel_name(ch),
                                 rpc_channel_target(ch));
        }
        rpc_result_clear(&res);
        return r;
}

/* Asks every shard for its status and records it. Returns the number of shards reachable; *n_init gets
 * the number initialized; why gets the first failure. */
static uint32_t probe_shards(struct chief *c, uint32_t *n_init, char *why, size_t len) {
        uint32_t n_ok = 0, n_in = 0;
        why[0] = 0;
        for (uint32_t s = 0; s < c->cfg->cluster.n_ps; s++) {
                ProtobufCMessage *m = NULL;
                char e[512];
                int r = ps_client_probe(c->pc, s, PROBE_TIMEOUT_MS, (void **)&m, e, sizeof(e));
                uint64_t t = mono_us();
                pthread_mutex_lock(&c->lock);
                struct ps_info *pi = &c->ps[s];
                if (r < 0) {
                        pi->reachable = false;
                        if (!pi->lost_since_mono)
                                pi->lost_since_mono = t;
                        strfmt(pi->state, sizeof(pi->state), "unreachable: %s", e);
                        if (!why[0])
                                strfmt(why, len, "%s", e);
                } else {
                        const Psfleet__V1__ShardStatus *st = (const Psfleet__V1__ShardStatus *)m;
                        pi->reachable = true;
                        pi->lost_since_mono = 0;
                        pi->initialized = st->initialized;
                        pi->incarnation = st->incarnation;
                        pi->global_step = st->global_step;
                        pi->last_seen_us = now_us();
                        if (st->initialized)
                                strfmt(pi->state, sizeof(pi->state),
                                         "initialized: %u variables, %" PRIu64 " bytes, %" PRIu64
                                         " pushes, %" PRIu64 " rejected, %u shared-memory link(s)",
                                         st->variables, st->bytes, st->pushes, st->rejected,
                                         st->shared_memory_links);
                        else
                                strfmt(pi->state, sizeof(pi->state), "uninitialized");
                        n_ok++;
                        n_in += st->initialized;
                        protobuf_c_message_free_unpacked(m, NULL);
                }
                pthread_mutex_unlock(&c->lock);
        }
        *n_init = n_in;
        return n_ok;
}

/* Logs a wait reason when it changes, and every 30 s while it lasts. */
static void log_wait(struct loop *lp, const char *what, const char *why) {
        uint64_t t = mono_us();
        if (strcmp(lp->last_why, why) != 0 || t - lp->last_why_log > 30 * 1000000ULL) {
                log_info("%s: %s", what, why);
                strfmt(lp->last_why, sizeof(lp->last_why), "%s", why);
                lp->last_why_log = t;
        }
}

/* ---- summaries, evaluations, checkpoints, restores (main thread) ---- */

static void summary_failed(struct chief *c, int r) {
        log_warning_errno(r, "Cannot write summaries to \"%s\"; writing no more", summary_writer_path(c->sw));
        c->sw = summary_writer_free(c->sw);
}

static void write_scalars(struct chief *c, uint64_t step, const struct summary_scalar *v, size_t n) {
        if (!c->sw || !n)
                return;
        int r = summary_write_scalars(c->sw, step, now_us(), v, n);
        if (r >= 0)
                r = summary_flush(c->sw);
        if (r < 0)
                summary_failed(c, r);
}

static void write_session_log(struct chief *c, uint64_t step, int status, const char *path, const char *msg) {
        if (!c->sw)
                return;
        int r = summary_write_session_log(c->sw, step, now_us(), status, path, msg);
        if (r >= 0)
                r = summary_flush(c->sw);
        if (r < 0)
                summary_failed(c, r);
}

/* Every save_summaries_secs while the job runs: loss per worker and their mean, global_step/sec,
 * examples/sec, learning rate. */
static void maybe_write_summaries(struct chief *c) {
        const struct job_config *cfg = c->cfg;
        uint64_t t = mono_us();
        if (!c->sw || !cfg->supervisor.save_summaries_secs ||
            t - c->last_summary_mono < cfg->supervisor.save_summaries_secs * 1000000ULL)
                return;
        c->last_summary_mono = t;
        uint32_t W = cfg->cluster.n_worker;
        struct summary_scalar *v = calloc(W + 4, sizeof(*v));
        char (*tags)[32] = calloc(W ? W : 1, sizeof(*tags));
        if (!v || !tags) {
                free(v);
                free(tags);
                return;
        }
        size_t n = 0;
        pthread_mutex_lock(&c->lock);
        uint64_t gs = c->global_step;
        double sps = steps_per_s_locked(c);
        float loss = loss_locked(c);
        for (uint32_t w = 0; w < W; w++)
                if (c->workers[w].reported && isfinite(c->workers[w].loss)) {
                        strfmt(tags[w], sizeof(tags[w]), "loss/worker_%u", w);
                        v[n++] = (struct summary_scalar){tags[w], c->workers[w].loss};
                }
        pthread_mutex_unlock(&c->lock);
        if (isfinite(loss))
                v[n++] = (struct summary_scalar){"loss", loss};
        v[n++] = (struct summary_scalar){"global_step/sec", (float)sps};
        v[n++] = (struct summary_scalar){"examples/sec", (float)(sps * cfg->training.batch_size)};
        v[n++] = (struct summary_scalar){"learning_rate", (float)optim_learning_rate(&cfg->training, gs)};
        write_scalars(c, gs, v, n);
        free(v);
        free(tags);
}

/* Reads every shard into the model's block (and the slots when with_slots); *gs_ret from shard 0. */
static int pull_all(struct chief *c, bool with_slots, uint64_t *gs_ret, char *err, size_t errlen) {
        int r = ps_client_pull(c->pc, model_params(c->model), with_slots && c->n_slots ? c->slots : NULL, gs_ret, err,
                               errlen);
        if (r >= 0) {
                pthread_mutex_lock(&c->lock);
                if (*gs_ret > c->global_step)
                        c->global_step = *gs_ret;
                pthread_mutex_unlock(&c->lock);
        }
        return r;
}

/* Evaluates the pulled values on the test split; records and summarizes the result. */
static int evaluate(struct chief *c, uint64_t gs, char *err, size_t errlen) {
        float loss, acc;
        int r = model_params_sync(c->model);
        if (r >= 0)
                r = model_evaluate(c->model, c->test->x, c->test->y, c->test->n, &loss, &acc);
        if (r < 0) {
                strfmt(err, errlen, "evaluating on the test split: %s", strerror(-r));
                return r;
        }
        r = chief_db_add_evaluation(c->db, now_us(), gs, c->test->n, loss, acc);
        if (r < 0)
                log_warning_errno(r, "Cannot record the evaluation in the database, continuing");
        pthread_mutex_lock(&c->lock);
        c->have_eval = true;
        c->eval_step = gs;
        c->eval_accuracy = acc;
        c->eval_loss = loss;
        pthread_mutex_unlock(&c->lock);
        c->last_eval_step = gs;
        const struct summary_scalar v[] = {{"eval/accuracy", acc}, {"eval/loss", loss}};
        write_scalars(c, gs, v, ELEMENTSOF(v));
        log_info_step(gs, "Evaluation at global_step %" PRIu64 ": test accuracy %.4f, test loss %.4f (%u examples)", gs,
                      (double)acc, (double)loss, c->test->n);
        return 0;
}

/* Writes and records the pulled values (with the slots when pulled) as the checkpoint of gs. A
 * request at the step of the newest checkpoint returns that one (*existing). */
static int save(struct chief *c, uint64_t gs, bool with_slots, const char *trigger, struct chief_db_checkpoint *ret,
                bool *existing, char *err, size_t errlen) {
        struct chief_db_checkpoint stats = {0};
        pthread_mutex_lock(&c->lock);
        bool same = c->have_ckpt && c->last_ckpt.global_step == gs;
        struct chief_db_checkpoint prev = c->last_ckpt;
        stats.loss = loss_locked(c);
        stats.eval_step = c->have_eval ? c->eval_step : 0;
        stats.eval_accuracy = c->have_eval ? c->eval_accuracy : -1;
        stats.eval_loss = c->have_eval ? c->eval_loss : -1;
        pthread_mutex_unlock(&c->lock);
        strfmt(stats.trigger, sizeof(stats.trigger), "%s", trigger);
        if (existing)
                *existing = false;
        if (same && strcmp(trigger, "end") != 0) {
                /* Nothing moved since: the newest checkpoint holds these values. */
                c->last_save_mono = mono_us();
                if (existing)
                        *existing = true;
                if (ret)
                        *ret = prev;
                return 0;
        }
        struct chief_db_checkpoint row;
        int r = chief_ckpt_save(c->ckpts, model_params(c->model), with_slots && c->n_slots ? c->slots : NULL, gs, &stats,
                                &row, err, errlen);
        if (r < 0)
                return r;
        c->last_save_step = gs;
        c->last_save_mono = mono_us();
        refresh_ckpt_info(c);
        write_session_log(c, gs, SUMMARY_SESSION_CHECKPOINT, row.path, NULL);
        log_info_step(gs, "Saved checkpoint \"%s\" at global_step %" PRIu64 " (%s): %" PRIu64 " bytes, %s", row.path, gs,
                      trigger, row.bytes, row.checksum);
        if (ret)
                *ret = row;
        return 0;
}

/* Scheduled checkpoints (save_checkpoint_steps, save_checkpoint_secs) and evaluations
 * (eval_every_steps), from one pull when both are due. A failure is logged and retried later. */
static void maybe_snapshot(struct chief *c) {
        const struct supervisor_config *sv = &c->cfg->supervisor;
        uint64_t t = mono_us();
        if (t < c->next_snapshot_try)
                return;
        pthread_mutex_lock(&c->lock);
        uint64_t gs = c->global_step;
        pthread_mutex_unlock(&c->lock);
        bool by_steps = sv->save_checkpoint_steps && gs >= c->last_save_step + sv->save_checkpoint_steps;
        bool by_secs = sv->save_checkpoint_secs && t - c->last_save_mono >= sv->save_checkpoint_secs * 1000000ULL;
        bool eval = sv->eval_every_steps && gs >= c->last_eval_step + sv->eval_every_steps;
        if (!by_steps && !by_secs && !eval)
                return;
        char err[1024];
        int r = pull_all(c, by_steps || by_secs, &gs, err, sizeof(err));
        if (r >= 0 && eval)
                r = evaluate(c, gs, err, sizeof(err));
        if (r >= 0 && (by_steps || by_secs))
                r = save(c, gs, true, by_steps ? "steps" : "secs", NULL, NULL, err, sizeof(err));
        if (r < 0) {
                log_warning("Scheduled %s at global_step %" PRIu64 " failed: %s; retrying in %llu s",
                            by_steps || by_secs ? "checkpoint" : "evaluation", gs, err, SNAPSHOT_RETRY_US / 1000000);
                c->next_snapshot_try = t + SNAPSHOT_RETRY_US;
        }
}

/* SaveCheckpoint calls that wait: one checkpoint now answers them all. */
static void serve_saves(struct chief *c) {
        if (!saves_pending(c))
                return;
        struct chief_db_checkpoint row;
        bool existing = false;
        char err[1024];
        uint64_t gs = 0;
        int r = pull_all(c, true, &gs, err, sizeof(err));
        if (r >= 0)
                r = save(c, gs, true, "request", &row, &existing, err, sizeof(err));
        if (r < 0)
                log_warning("Requested checkpoint failed: %s", err);
        answer_saves(c, r, &row, existing, err);
}

/* "ps:1", "ps:0, ps:2", "every shard (3)" */
static void shard_list(const struct chief *c, const bool *which, char *buf, size_t len) {
        uint32_t n = 0, N = c->cfg->cluster.n_ps;
        for (uint32_t s = 0; s < N; s++)
                n += which[s];
        if (n == N && N > 1) {
                strfmt(buf, len, "every shard (%u)", N);
                return;
        }
        buf[0] = 0;
        for (uint32_t s = 0; s < N; s++)
                if (which[s])
                        strfmt(buf + strlen(buf), len - strlen(buf), "%sps:%u", buf[0] ? ", " : "", s);
}

/* Restores the shards in which[] from the newest usable checkpoint. Returns 1 (restored), 0 (no
 * usable checkpoint: nothing done), -EINVAL (the checkpoints hold a different model: fatal) or
 * another -errno (assigning failed: retry); why says what happened. */
static int restore_shards(struct chief *c, const bool *which, char *why, size_t len) {
        char shards[128], err[1024];
        struct chief_db_checkpoint row;
        bool slots_loaded = false;
        shard_list(c, which, shards, sizeof(shards));
        pthread_mutex_lock(&c->lock);
        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_RESTORING, "restoring %s: looking for a checkpoint in %s",
                         shards, chief_ckpt_dir(c->ckpts));
        pthread_mutex_unlock(&c->lock);
        int r = chief_ckpt_load_latest(c->ckpts, model_params(c->model), c->n_slots ? c->slots : NULL, &slots_loaded,
                                       &row, err, sizeof(err));
        refresh_ckpt_info(c);
        if (r <= 0) {
                strfmt(why, len, "%s", r == 0 ? "no usable checkpoint" : err);
                return r;
        }
        pthread_mutex_lock(&c->lock);
        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_RESTORING, "restoring %s from \"%s\" (global_step %" PRIu64 ")",
                         shards, row.path, row.global_step);
        pthread_mutex_unlock(&c->lock);
        notify_status("restoring %s from %s", shards, row.path);
        r = ps_client_assign(c->pc, which, model_params(c->model), slots_loaded ? c->slots : NULL, row.global_step, err,
                          sizeof(err));
        if (r < 0) {
                strfmt(why, len, "restoring %s from \"%s\": %s", shards, row.path, err);
                return r == -EINVAL ? -EIO : r;
        }
        log_info_step(row.global_step, "Restored %s from checkpoint \"%s\" at global_step %" PRIu64 "%s", shards,
                      row.path, row.global_step, slots_loaded ? ", with the optimizer's slots" : "");
        pthread_mutex_lock(&c->lock);
        c->restored_step = row.global_step;
        strfmt(c->restored_from, sizeof(c->restored_from), "%s", row.path);
        if (which[0]) {
                /* global_step goes back to the checkpoint's: the rates start over. */
                c->global_step = row.global_step;
                c->n_samples = 0;
                c->sample_next = 0;
        }
        pthread_mutex_unlock(&c->lock);
        if (which[0]) {
                c->last_save_step = row.global_step;
                c->last_eval_step = row.global_step;
                write_session_log(c, row.global_step, SUMMARY_SESSION_START, row.path, "restored");
        }
        c->last_save_mono = mono_us();
        return 1;
}

static int phase_initialize(struct chief *c, struct loop *lp) {
        const struct job_config *cfg = c->cfg;
        uint64_t t = mono_us();
        uint64_t timeout_us = cfg->supervisor.ready_timeout_secs * 1000000ULL;
        char why[1024], err[512];
        uint32_t n_init;

        if (!lp->init_start)
                lp->init_start = t;
        uint32_t n_ok = probe_shards(c, &n_init, why, sizeof(why));
        int r = 0;
        bool restored = false, restore_failed = false;
        if (n_ok == cfg->cluster.n_ps && n_init < n_ok) {
                /* Every shard when none is initialized; after a chiefd restart, only those that lost
                 * their variables meanwhile. */
                bool *which = calloc(cfg->cluster.n_ps, sizeof(bool));
                if (!which)
                        return log_error_errno(-ENOMEM, "Out of memory");
                pthread_mutex_lock(&c->lock);
                for (uint32_t s = 0; s < cfg->cluster.n_ps; s++)
                        which[s] = n_init == 0 || !c->ps[s].initialized;
                pthread_mutex_unlock(&c->lock);
                r = restore_shards(c, which, why, sizeof(why));
                free(which);
                if (r == -EINVAL)
                        return fail_job(c, "%s", why);
                restored = r > 0;
                restore_failed = r < 0;
        }
        if (n_ok == cfg->cluster.n_ps && n_init < n_ok && r == 0) {
                if (n_init > 0)
                        log_warning("%u of %u shards are initialized and the others not; without a checkpoint "
                                    "to restore from, initializing all of them",
                                    n_init, n_ok);
                log_info("No checkpoint to restore from in %s: initializing the variables", chief_ckpt_dir(c->ckpts));
                pthread_mutex_lock(&c->lock);
                set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_INITIALIZING, "initializing variables");
                pthread_mutex_unlock(&c->lock);
                r = model_init_params(c->model, cfg->model.seed);
                if (r >= 0)
                        r = ps_client_assign(c->pc, NULL, model_params(c->model), NULL, 0, err, sizeof(err));
                if (r < 0) {
                        strfmt(why, sizeof(why), "assigning the variables: %s", err);
                } else {
                        log_info("Initialized %u ps shard%s with %zu parameters (seed %" PRIu64 ")",
                                 cfg->cluster.n_ps, cfg->cluster.n_ps == 1 ? "" : "s",
                                 model_n_params(c->model), cfg->model.seed);
                        pthread_mutex_lock(&c->lock);
                        c->global_step = 0;
                        pthread_mutex_unlock(&c->lock);
                        write_session_log(c, 0, SUMMARY_SESSION_START, NULL, "initialized");
                }
        }
        if (n_ok < cfg->cluster.n_ps || r < 0) {
                if (t - lp->init_start > timeout_us)
                        return fail_job(c, "not ready after %" PRIu64 " s (supervisor.ready_timeout_secs): %s",
                                        cfg->supervisor.ready_timeout_secs, why);
                pthread_mutex_lock(&c->lock);
                set_state_locked(c, restore_failed ? PSFLEET__V1__JOB_STATE__JOB_STATE_RESTORING
                                          : PSFLEET__V1__JOB_STATE__JOB_STATE_INITIALIZING,
                                 "waiting for %s", why);
                pthread_mutex_unlock(&c->lock);
                notify_status("initializing: waiting for %s", why);
                log_wait(lp, "Waiting", why);
                lp->backoff = lp->backoff ? lp->backoff * 2 : BACKOFF_MIN_US;
                if (lp->backoff > BACKOFF_MAX_US)
                        lp->backoff = BACKOFF_MAX_US;
                lp->next = t + lp->backoff;
                return 0;
        }

        pthread_mutex_lock(&c->lock);
        if (!restored && n_init == cfg->cluster.n_ps && c->ps[0].global_step > c->global_step)
                c->global_step = c->ps[0].global_step;
        uint64_t gs = c->global_step;
        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_READY, NULL);
        c->ready_mono = mono_us();
        c->ready_step = gs;
        lp->last_progress_log = c->ready_mono;
        add_sample_locked(c, c->ready_mono, gs);
        pthread_mutex_unlock(&c->lock);
        c->last_save_step = gs;
        c->last_save_mono = c->last_summary_mono = mono_us();
        c->last_eval_step = gs;
        if (n_init == cfg->cluster.n_ps) {
                log_info("Every ps shard is already initialized: carrying on at global_step %" PRIu64, gs);
                write_session_log(c, gs, SUMMARY_SESSION_START, NULL, "chiefd restarted");
        }
        log_info("Job ready at global_step %" PRIu64 " of %" PRIu64, gs, cfg->training.max_steps);
        notify_status("ready: global_step %" PRIu64 "/%" PRIu64 ", waiting for workers", gs, cfg->training.max_steps);
        save_job(c);
        lp->next = mono_us();
        return 0;
}

static void notify_progress(struct chief *c, struct loop *lp) {
        uint64_t t = mono_us();
        if (t - lp->last_notify < NOTIFY_EVERY_US)
                return;
        lp->last_notify = t;
        pthread_mutex_lock(&c->lock);
        uint64_t gs = c->global_step;
        double eps = steps_per_s_locked(c) * c->cfg->training.batch_size;
        float loss = loss_locked(c);
        pthread_mutex_unlock(&c->lock);
        notify_status("step %" PRIu64 "/%" PRIu64 ", loss %.3g, %.0f ex/s", gs, c->cfg->training.max_steps,
                      (double)loss, eps);
        if (t - lp->last_progress_log >= 60 * 1000000ULL) {
                lp->last_progress_log = t;
                log_full(LOG_INFO, 0, gs, "step %" PRIu64 "/%" PRIu64 ", loss %.3g, %.0f examples/s", gs,
                         c->cfg->training.max_steps, (double)loss, eps);
        }
}

/* READY and TRAINING: follow global_step on shard 0, watch the shards, notice the end. */
static int phase_poll(struct chief *c, struct loop *lp) {
        const struct job_config *cfg = c->cfg;
        uint64_t timeout_us = cfg->supervisor.ready_timeout_secs * 1000000ULL;
        char why[512];
        uint32_t n_init;
        probe_shards(c, &n_init, why, sizeof(why));
        uint64_t t = mono_us();

        bool *which = calloc(cfg->cluster.n_ps, sizeof(bool)), lost = false;
        if (!which)
                return log_error_errno(-ENOMEM, "Out of memory");
        pthread_mutex_lock(&c->lock);
        for (uint32_t s = 0; s < cfg->cluster.n_ps; s++) {
                const struct ps_info *pi = &c->ps[s];
                if (!pi->reachable && t - pi->lost_since_mono > timeout_us) {
                        pthread_mutex_unlock(&c->lock);
                        free(which);
                        return fail_job(c, "ps:%u (%s) lost for more than %" PRIu64 " s: %s", s,
                                        cfg->cluster.ps[s].addr, cfg->supervisor.ready_timeout_secs,
                                        pi->state);
                }
                which[s] = pi->reachable && !pi->initialized;
                lost |= which[s];
        }
        if (lost && c->state != PSFLEET__V1__JOB_STATE__JOB_STATE_RESTORING)
                c->resume_state = c->state;
        pthread_mutex_unlock(&c->lock);
        if (lost) {
                /* A psd restarted (new incarnation, uninitialized): restore it from the newest checkpoint.
                 * Its pushes fail meanwhile, so the workers drain, wait and pull again. */
                if (!lp->restore_since) {
                        lp->restore_since = t;
                        for (uint32_t s = 0; s < cfg->cluster.n_ps; s++)
                                if (which[s])
                                        log_warning("ps:%u (%s) restarted (incarnation %" PRIu64 ") without its variables: "
                                                    "restoring it from the newest checkpoint while the workers wait",
                                                    s, cfg->cluster.ps[s].addr, c->ps[s].incarnation);
                }
                int r = restore_shards(c, which, why, sizeof(why));
                free(which);
                if (r == -EINVAL)
                        return fail_job(c, "%s", why);
                if (r == 0)
                        return fail_job(c, "a ps shard restarted and lost its variables; there is no checkpoint to "
                                        "restore it from (%s)", why);
                if (r < 0) {
                        if (t - lp->restore_since > timeout_us)
                                return fail_job(c, "restore not done after %" PRIu64 " s: %s",
                                                cfg->supervisor.ready_timeout_secs, why);
                        pthread_mutex_lock(&c->lock);
                        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_RESTORING, "waiting: %s", why);
                        pthread_mutex_unlock(&c->lock);
                        log_wait(lp, "Restore failed, retrying", why);
                        lp->next = t + BACKOFF_MAX_US;
                        return 0;
                }
                lp->restore_since = 0;
                pthread_mutex_lock(&c->lock);
                set_state_locked(c, c->resume_state, NULL);
                pthread_mutex_unlock(&c->lock);
                lp->next = mono_us() + POLL_US;
                return 0;
        }
        free(which);
        if (c->ps[0].reachable) {
                if (c->ps[0].global_step > c->global_step)
                        c->global_step = c->ps[0].global_step;
                note_progress_locked(c, t);
                add_sample_locked(c, t, c->global_step);
        }
        if (c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_READY && c->global_step > c->ready_step)
                set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING, NULL);
        if (c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING && !c->ps[0].reachable)
                strfmt(c->reason, sizeof(c->reason), "ps:0 not reachable: %s", why);
        else if (c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING)
                c->reason[0] = 0;
        bool end = c->global_step >= cfg->training.max_steps || c->stop_requested;
        uint64_t gs = c->global_step;
        if (end) {
                mark_end_locked(c);
                set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING, "waiting for the workers to finish");
        }
        pthread_mutex_unlock(&c->lock);

        if (end) {
                log_info("%s at global_step %" PRIu64 ": waiting for the workers to finish",
                         gs >= cfg->training.max_steps ? "Reached max_steps" : "Stop requested", gs);
                notify_status("stopping at step %" PRIu64 "/%" PRIu64, gs, cfg->training.max_steps);
                lp->stop_begin = t;
                save_job(c);
        } else {
                notify_progress(c, lp);
                maybe_snapshot(c);
                maybe_write_summaries(c);
        }
        lp->next = t + POLL_US;
        return 0;
}

/* A worker still computing? "training..." states are; "done", "waiting..." and anything else are not. */
static bool worker_busy(const char *state) {
        return strncmp(state, "training", 8) == 0 || strcmp(state, "joined") == 0;
}

/* The end: one pull with the optimizer's slots, the final evaluation, the final checkpoint. */
static int finish(struct chief *c) {
        const struct job_config *cfg = c->cfg;
        char err[1024];
        uint64_t gs = 0;

        pthread_mutex_lock(&c->lock);
        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING, "evaluating on the test split");
        pthread_mutex_unlock(&c->lock);
        int r = pull_all(c, true, &gs, err, sizeof(err));
        if (r < 0)
                return fail_job(c, "pulling the final parameters: %s", err);
        r = evaluate(c, gs, err, sizeof(err));
        if (r < 0)
                return fail_job(c, "%s", err);
        pthread_mutex_lock(&c->lock);
        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING, "saving the final checkpoint");
        pthread_mutex_unlock(&c->lock);
        struct chief_db_checkpoint row;
        r = save(c, gs, true, "end", &row, NULL, err, sizeof(err));
        if (r < 0)
                /* The training is done and evaluated; a checkpoint that cannot be written does not undo that. */
                log_error("Cannot save the final checkpoint: %s", err);
        answer_saves(c, r, &row, false, err);

        pthread_mutex_lock(&c->lock);
        c->test_accuracy = c->eval_accuracy;
        c->test_loss = c->eval_loss;
        float acc = c->eval_accuracy, loss = c->eval_loss;
        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_DONE, NULL);
        float wall = c->wall_s;
        double eps = steps_per_s_locked(c) * cfg->training.batch_size;
        pthread_mutex_unlock(&c->lock);
        save_job(c);
        write_session_log(c, gs, SUMMARY_SESSION_STOP, r >= 0 ? row.path : NULL, "done");
        log_full(LOG_INFO, 0, gs,
                 "Done at global_step %" PRIu64 ": test accuracy %.4f, test loss %.4f; %.1f s of training, "
                 "%.0f examples/s",
                 gs, (double)acc, (double)loss, (double)wall, eps);
        notify_status("done: step %" PRIu64 ", test accuracy %.4f", gs, (double)acc);
        r = ps_client_stop(c->pc, "job done");
        if (r < 0)
                log_info_errno(r, "Could not tell every ps shard to stop (they may have stopped already)");
        return 0;
}

/* STOPPING: wait (bounded) until every worker is done or gone, then evaluate. */
static int phase_stopping(struct chief *c, struct loop *lp) {
        const struct job_config *cfg = c->cfg;
        uint32_t busy = 0;
        int64_t first_busy = -1;
        for (uint32_t w = 0; w < cfg->cluster.n_worker; w++) {
                pthread_mutex_lock(&c->lock);
                bool fin = c->workers[w].finished;
                pthread_mutex_unlock(&c->lock);
                if (fin)
                        continue;
                Psfleet__V1__WorkerStatusRequest q = PSFLEET__V1__WORKER_STATUS_REQUEST__INIT;
                ProtobufCMessage *m = NULL;
                char e[512];
                int r = probe_call(c->worker_ch[w], M_WORKER_STATUS, &q.base, &psfleet__v1__worker_status__descriptor,
                                   1000, &m, e, sizeof(e));
                pthread_mutex_lock(&c->lock);
                struct worker_info *wi = &c->workers[w];
                if (r < 0) {
                        /* Gone (exited, or never started): nothing more will come from it. */
                        wi->finished = r != -ETIMEDOUT;
                        if (wi->finished && strcmp(wi->state, "done") != 0)
                                strfmt(wi->state, sizeof(wi->state), "unreachable: %s", e);
                } else {
                        const Psfleet__V1__WorkerStatus *ws = (const Psfleet__V1__WorkerStatus *)m;
                        const char *st = ws->state ? ws->state : "";
                        wi->finished = !worker_busy(st);
                        strfmt(wi->state, sizeof(wi->state), "%s", st);
                        protobuf_c_message_free_unpacked(m, NULL);
                }
                fin = wi->finished;
                pthread_mutex_unlock(&c->lock);
                if (!fin && busy++ == 0)
                        first_busy = w;
        }
        uint64_t t = mono_us();
        if (busy && t - lp->stop_begin < STOP_WAIT_US) {
                lp->next = t + POLL_US;
                return 0;
        }
        if (busy) {
                log_warning("worker:%" PRIi64 " (and %u more) still training %llu s after the end; "
                            "telling them to stop and evaluating anyway",
                            first_busy, busy - 1, STOP_WAIT_US / 1000000);
                for (uint32_t w = 0; w < cfg->cluster.n_worker; w++) {
                        Psfleet__V1__StopRequest q = PSFLEET__V1__STOP_REQUEST__INIT;
                        q.reason = (char *)"the job has ended";
                        ProtobufCMessage *m = NULL;
                        char e[512];
                        if (probe_call(c->worker_ch[w], M_WORKER_STOP, &q.base, &psfleet__v1__stop_reply__descriptor,
                                       1000, &m, e, sizeof(e)) >= 0)
                                protobuf_c_message_free_unpacked(m, NULL);
                }
        }
        lp->next = UINT64_MAX;
        return finish(c);
}

/* Runs the job until a signal, a Stop after the end, or a failure. Returns 0 (clean stop) or -errno. */
static int supervise(struct chief *c, int sfd) {
        struct loop lp = {0};
        struct pollfd fds[2] = {{.fd = sfd, .events = POLLIN}, {.fd = c->wake_fd, .events = POLLIN}};
        /* The watchdog is fed on every turn of this loop: every call it makes has a deadline, so a
         * chiefd whose loop stops turning is hung, and systemd restarts it. */
        uint64_t wd = notify_watchdog_usec();
        int wd_ms = wd ? (int)(wd / 4000) : -1;
        for (;;) {
                uint64_t t = mono_us();
                int timeout = lp.next == UINT64_MAX ? -1
                              : lp.next > t         ? (int)((lp.next - t + 999) / 1000)
                                                    : 0;
                if (wd_ms >= 0 && (timeout < 0 || timeout > wd_ms))
                        timeout = wd_ms;
                int n = poll(fds, 2, timeout);
                if (wd)
                        notify_watchdog();
                if (n < 0 && errno != EINTR)
                        return log_error_errno(errno, "poll() failed");
                if (n > 0 && (fds[0].revents & POLLIN)) {
                        struct signalfd_siginfo si;
                        if (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
                                log_info("Received %s, stopping", strsignal((int)si.ssi_signo));
                        return 0;
                }
                bool woken = false;
                if (n > 0 && (fds[1].revents & POLLIN)) {
                        uint64_t v;
                        woken = read(c->wake_fd, &v, sizeof(v)) == (ssize_t)sizeof(v);
                }
                if (!woken && mono_us() < lp.next)
                        continue;

                pthread_mutex_lock(&c->lock);
                Psfleet__V1__JobState st = c->state;
                bool stop = c->stop_requested;
                pthread_mutex_unlock(&c->lock);
                int r = 0;
                pthread_mutex_lock(&c->lock);
                bool was_ready = ready_once_locked(c);
                pthread_mutex_unlock(&c->lock);
                switch (st) {
                case PSFLEET__V1__JOB_STATE__JOB_STATE_RESTORING:
                        if (was_ready) {
                                /* a restarted shard's restore is being retried */
                                r = phase_poll(c, &lp);
                                break;
                        }
                        /* fall through */
                case PSFLEET__V1__JOB_STATE__JOB_STATE_INITIALIZING:
                        if (stop)
                                return 0;
                        r = phase_initialize(c, &lp);
                        break;
                case PSFLEET__V1__JOB_STATE__JOB_STATE_READY:
                case PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING:
                        r = phase_poll(c, &lp);
                        break;
                case PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING:
                        r = phase_stopping(c, &lp);
                        break;
                case PSFLEET__V1__JOB_STATE__JOB_STATE_DONE:
                        if (stop)
                                return 0;
                        lp.next = UINT64_MAX;
                        break;
                default:
                        return -EIO;
                }
                if (r < 0)
                        return r;
                pthread_mutex_lock(&c->lock);
                st = c->state;
                pthread_mutex_unlock(&c->lock);
                if (st == PSFLEET__V1__JOB_STATE__JOB_STATE_READY || st == PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING ||
                    st == PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING)
                        serve_saves(c);
                /* A Stop that arrived after the end: the loop returns on the next pass. */
                pthread_mutex_lock(&c->lock);
                if (c->stop_requested && c->state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE)
                        lp.next = 0;
                pthread_mutex_unlock(&c->lock);
        }
}

/* ---- start-up and tear-down ---- */

static struct chief *chief_free(struct chief *c) {
        if (!c)
                return NULL;
        for (uint32_t w = 0; c->worker_ch && w < c->cfg->cluster.n_worker; w++)
                rpc_channel_free(c->worker_ch[w]);
        free(c->worker_ch);
        ps_client_free(c->pc);
        job_layout_free(c->L);
        model_free(c->model);
        backend_free(c->be);
        dataset_free(c->test);
        summary_writer_free(c->sw);
        free(c->summary_dir);
        chief_ckpt_free(c->ckpts);
        for (unsigned k = 0; k < OPTIM_MAX_SLOTS; k++)
                free(c->slots[k]);
        free(c->save_calls);
        pthread_mutex_destroy(&c->watch_mu);
        pthread_cond_destroy(&c->watch_cond);
        chief_db_close(c->db);
        if (c->wake_fd >= 0)
                close(c->wake_fd);
        free(c->workers);
        free(c->ps);
        free(c->canonical);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return NULL;
}

/* Everything but the server. Logs what failed. */
static int chief_new(struct job_config *cfg, const char *state_root, struct chief **ret) {
        struct chief *c = calloc(1, sizeof(*c));
        char err[1024];
        int r;
        if (!c)
                return log_error_errno(-ENOMEM, "Cannot allocate the chief");
        pthread_mutex_init(&c->lock, NULL);
        pthread_mutex_init(&c->watch_mu, NULL);
        pthread_cond_init(&c->watch_cond, NULL);
        c->wake_fd = -1;
        c->cfg = cfg;
        c->state = PSFLEET__V1__JOB_STATE__JOB_STATE_INITIALIZING;
        strfmt(c->reason, sizeof(c->reason), "starting");
        c->test_accuracy = -1;
        c->test_loss = -1;
        c->started_us = now_us();
        c->canonical = config_canonical_json(cfg);
        c->fingerprint = config_fingerprint(cfg);
        c->workers = calloc(cfg->cluster.n_worker, sizeof(*c->workers));
        c->ps = calloc(cfg->cluster.n_ps, sizeof(*c->ps));
        c->worker_ch = calloc(cfg->cluster.n_worker, sizeof(*c->worker_ch));
        if (!c->canonical || !c->workers || !c->ps || !c->worker_ch) {
                r = log_error_errno(-ENOMEM, "Cannot allocate the chief");
                goto fail;
        }
        for (uint32_t s = 0; s < cfg->cluster.n_ps; s++)
                strfmt(c->ps[s].state, sizeof(c->ps[s].state), "not contacted yet");

        /* The test hook that slows checkpoint writes down, so that a test can kill us mid-write. */
        const char *delay = getenv(TEST_DELAY_ENV);
        if (delay && *delay) {
                if (parse_u64(delay, 0, 600000, &c->test_delay_ms) < 0)
                        log_warning("%s=\"%s\" is not a number of milliseconds (0..600000); ignoring it", TEST_DELAY_ENV,
                                    delay);
                else if (c->test_delay_ms)
                        log_warning("Test hook %s=%" PRIu64 ": every checkpoint write sleeps %" PRIu64
                                    " ms before its rename and again before its record", TEST_DELAY_ENV,
                                    c->test_delay_ms, c->test_delay_ms);
        }

        /* The record. */
        char *dir = strdup_printf("%s/%s", state_root, cfg->name);
        char *db_path = dir ? strdup_printf("%s/chief.db", dir) : NULL;
        if (!db_path) {
                free(dir);
                r = log_error_errno(-ENOMEM, "Cannot allocate the chief");
                goto fail;
        }
        r = mkdir_p(dir, 0750);
        if (r < 0)
                log_error_errno(r, "Cannot create the state directory \"%s\"", dir);
        else if ((r = chief_db_open(db_path, &c->db)) < 0)
                log_error_errno(r, "Cannot open the database \"%s\"", db_path);
        free(dir);
        if (r < 0) {
                free(db_path);
                goto fail;
        }
        struct chief_db_job prev;
        r = chief_db_load_job(c->db, &prev);
        if (r >= 0 && prev.fingerprint == c->fingerprint) {
                /* A restart of the same job: it keeps its start time. */
                c->started_us = prev.started_us;
                log_info("Database \"%s\": the job was last %s at global_step %" PRIu64, db_path,
                         job_state_name(prev.state), prev.global_step);
        } else if (r >= 0) {
                log_notice("Database \"%s\" holds a job with another fingerprint (%016" PRIx64 "): starting afresh",
                           db_path, prev.fingerprint);
        } else if (r != -ENOENT) {
                log_warning_errno(r, "Cannot read the job's row from \"%s\", starting afresh", db_path);
        }
        for (uint32_t w = 0; w < cfg->cluster.n_worker; w++) {
                struct chief_db_progress p;
                char st[128];
                if (r >= 0 && prev.fingerprint == c->fingerprint &&
                    chief_db_last_progress(c->db, w, &p, st, sizeof(st)) >= 0) {
                        struct worker_info *wi = &c->workers[w];
                        wi->local_step = p.local_step;
                        wi->global_step = p.global_step;
                        wi->loss = p.loss;
                        wi->examples = p.examples;
                        wi->last_report_us = p.time_us;
                        strfmt(wi->state, sizeof(wi->state), "%s (before the chief restarted)", st);
                }
        }
        free(db_path);

        /* The model, for initializers and the final evaluation. */
        r = backend_cpu_new(cfg->training.threads, &c->be);
        if (r >= 0)
                r = model_new(&cfg->model, c->be, EVAL_BATCH, &c->model);
        if (r >= 0)
                r = job_layout_new(cfg, &c->L);
        if (r >= 0)
                r = ps_client_new(cfg, c->L, "chief:0", &c->pc);
        if (r < 0) {
                log_error_errno(r, "Cannot build the model and its layout over %u ps shards", cfg->cluster.n_ps);
                goto fail;
        }
        /* Checkpoints: the files and the rows must agree before anything reads them. */
        char *job_dir = strdup_printf("%s/%s", state_root, cfg->name);
        char *ckpt_dir = !job_dir                                      ? NULL
                         : cfg->supervisor.checkpoint_dir[0] == '/' ? strdup(cfg->supervisor.checkpoint_dir)
                                                                      : strdup_printf("%s/%s", job_dir,
                                                                                      cfg->supervisor.checkpoint_dir);
        c->summary_dir = !job_dir                                     ? NULL
                         : cfg->supervisor.summary_dir[0] == '/' ? strdup(cfg->supervisor.summary_dir)
                                                                   : strdup_printf("%s/%s", job_dir, cfg->supervisor.summary_dir);
        free(job_dir);
        if (!ckpt_dir || !c->summary_dir) {
                free(ckpt_dir);
                r = log_error_errno(-ENOMEM, "Cannot allocate the chief");
                goto fail;
        }
        struct chief_ckpt_config cc = {.dir = ckpt_dir, .L = c->L, .job = cfg->name, .fingerprint = c->fingerprint,
                                       .keep = cfg->supervisor.keep_checkpoints, .test_delay_ms = c->test_delay_ms};
        r = chief_ckpt_new(c->db, &cc, &c->ckpts, err, sizeof(err));
        free(ckpt_dir);
        if (r < 0) {
                log_error_errno(r, "%s", err);
                goto fail;
        }
        r = chief_ckpt_reconcile(c->ckpts);
        if (r < 0) {
                log_error_errno(r, "Cannot compare the checkpoint files in \"%s\" with their records",
                                chief_ckpt_dir(c->ckpts));
                goto fail;
        }
        refresh_ckpt_info(c);
        if (c->have_ckpt)
                log_info("Checkpoints in \"%s\": %u, the newest at global_step %" PRIu64, chief_ckpt_dir(c->ckpts),
                         c->n_ckpts, c->last_ckpt.global_step);
        if (chief_db_last_evaluation(c->db, &c->eval_step, &c->eval_loss, &c->eval_accuracy) >= 0)
                c->have_eval = true;
        c->n_slots = optim_n_slots(cfg->training.optimizer);
        for (unsigned k = 0; k < c->n_slots; k++)
                if (!(c->slots[k] = calloc(model_n_params(c->model) ? model_n_params(c->model) : 1, sizeof(float)))) {
                        r = log_error_errno(-ENOMEM, "Cannot allocate the optimizer's slots");
                        goto fail;
                }
        if (cfg->supervisor.save_summaries_secs) {
                char host[256] = "localhost";
                if (gethostname(host, sizeof(host) - 1) < 0 || !host[0])
                        strfmt(host, sizeof(host), "localhost");
                host[sizeof(host) - 1] = 0;
                r = summary_writer_new(c->summary_dir, now_us(), host, &c->sw);
                if (r < 0)
                        log_warning_errno(r, "Cannot create an event file in \"%s\"; no summaries", c->summary_dir);
                else
                        log_info("Summaries go to \"%s\"", summary_writer_path(c->sw));
        }

        for (uint32_t w = 0; w < cfg->cluster.n_worker; w++) {
                char name[32];
                strfmt(name, sizeof(name), "worker:%u", w);
                r = rpc_channel_new(cfg->cluster.worker[w].addr, name, &c->worker_ch[w]);
                if (r < 0) {
                        log_error_errno(r, "Cannot create a channel to %s (%s)", name, cfg->cluster.worker[w].addr);
                        goto fail;
                }
        }

        /* The test split, now: a missing file should stop the job before it trains, not after. */
        char *img = trainer_data_path(cfg, cfg->data.test_images);
        char *lab = trainer_data_path(cfg, cfg->data.test_labels);
        r = img && lab ? dataset_load(img, lab, &c->test, err, sizeof(err)) : -ENOMEM;
        if (r >= 0 && c->test->dim != model_input_size(c->model)) {
                strfmt(err, sizeof(err), "%s: %u values per example, the model's input takes %u", img, c->test->dim,
                         model_input_size(c->model));
                r = -EINVAL;
        }
        free(img);
        free(lab);
        if (r < 0) {
                log_error_errno(r, "Cannot load the test split: %s", err);
                goto fail;
        }

        c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->wake_fd < 0) {
                r = log_error_errno(errno, "eventfd() failed");
                goto fail;
        }
        *ret = c;
        return 0;
fail:
        chief_free(c);
        return r;
}

static int run(int argc, char **argv) {
        struct daemon_args args = {0};
        struct chief *c = NULL;
        struct rpc_server *srv = NULL;
        int ret = EXIT_FAILURE, r;

        /* Before any thread exists (gRPC's inherit the mask): SIGINT, SIGTERM and SIGHUP arrive only
         * through this signalfd, read in supervise(). */
        int sfd = daemon_signals_fd();
        if (sfd < 0) {
                fprintf(stderr, "chiefd: cannot set up signals: %s\n", strerror(-sfd));
                return EXIT_FAILURE;
        }
        r = daemon_args_parse(argc, argv, "chiefd", ROLE_CHIEF, &args);
        if (r != 0) {
                close(sfd);
                return r == 1 ? EXIT_SUCCESS : r;
        }
        struct job_config *cfg = args.cfg;
        log_setup("chiefd", cfg->name, args.task_name);

        rpc_global_init();
        if (chief_new(cfg, args.state_dir, &c) < 0)
                goto out;

        struct rpc_method methods[] = {
                {M_JOIN, h_join, c},
                {M_REPORT, h_report, c},
                {M_STATUS, h_status, c},
                {M_STOP, h_stop, c},
                {M_WATCH, h_watch, c},
                {M_LIST_CKPT, h_list_ckpts, c},
                {M_SAVE_CKPT, h_save_ckpt, c},
                {M_DELETE_CKPT, h_delete_ckpt, c},
                {RPC_HEALTH_CHECK, rpc_health_handler, (void *)health_services},
        };
        r = pthread_create(&c->watch_thread, NULL, watch_main, c);
        if (r != 0) {
                log_error_errno(-r, "Cannot start the watch thread");
                goto out;
        }
        c->watch_started = true;
        r = rpc_server_new(args.listen, methods, ELEMENTSOF(methods), 2, &srv);
        if (r < 0) {
                log_error_errno(r, "Cannot listen on \"%s\"", args.listen);
                goto out;
        }
        r = rpc_server_start(srv);
        if (r < 0) {
                log_error_errno(r, "Cannot start the server on \"%s\"", args.listen);
                goto out;
        }
        log_info("Listening on %s (job \"%s\", fingerprint %016" PRIx64 ", %u ps, %u workers, max_steps %" PRIu64 ")",
                 args.listen, cfg->name, c->fingerprint, cfg->cluster.n_ps, cfg->cluster.n_worker,
                 cfg->training.max_steps);
        notify_ready();
        r = supervise(c, sfd);
        notify_stopping();
        ret = r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
out:
        if (c)
                close_streams(c);
        r = srv ? rpc_server_shutdown(srv, 5000) : 0;
        if (r < 0)
                log_warning_errno(r, "Server shutdown did not finish in time");
        rpc_server_free(srv);
        close(sfd);
        chief_free(c);
        rpc_global_shutdown();
        daemon_args_done(&args);
        return ret;
}

int main(int argc, char **argv) {
        return run(argc, argv);
}
