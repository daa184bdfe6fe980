/* chiefd: the supervisor of one job. Initializes every ps shard, lets workers join once the job is
 * ready, tracks global_step and per-worker progress (SQLite), evaluates the final model on the test
 * split, answers GetStatus, and tells everyone to stop.
 *
 * Threads: the RPC server's threads run the handlers (Join, Report, GetStatus, Stop, health), which only
 * read and update `struct chief` under its lock. The main thread owns every outgoing call and every state
 * change that needs one (waiting for the shards, initializing them, polling global_step, the final pull
 * and evaluation), and is the one place where signals are handled (signalfd). */
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
#include "chief_db.h"
#include "config.h"
#include "daemon.h"
#include "data.h"
#include "job.h"
#include "log.h"
#include "model.h"
#include "notify.h"
#include "rpc.h"
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
#define M_SHARD_STATUS "/psfleet.v1.ParameterServer/GetShardStatus"
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
        int wake_fd;                      /* eventfd: a Stop RPC wakes the main loop */

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
};

/* snprintf that truncates on purpose: reasons and states are bounded, and a cut message beats none. */
static void strfmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void strfmt(char *buf, size_t len, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, len, fmt, ap);
        va_end(ap);
}

static const char *state_name(Psfleet__V1__JobState s) {
        switch (s) {
        case PSFLEET__V1__JOB_STATE__JOB_STATE_INITIALIZING: return "initializing";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_RESTORING: return "restoring";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_READY: return "ready";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING: return "training";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING: return "stopping";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_DONE: return "done";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED: return "failed";
        default: return "unspecified";
        }
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
                         state_name(c->state), c->global_step);
                break;
        case PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED:
                strfmt(reason, sizeof(reason), "the job failed: %s", c->reason);
                break;
        default:
                strfmt(reason, sizeof(reason), "the job is %s: %s", state_name(c->state),
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

static void h_status(struct rpc_call *call, void *ud) {
        struct chief *c = ud;
        const struct cluster *cl = &c->cfg->cluster;
        uint32_t n = cl->n_ps + cl->n_worker;
        Psfleet__V1__NodeStatus *nodes = calloc(n, sizeof(*nodes));
        Psfleet__V1__NodeStatus **np = calloc(n, sizeof(*np));
        char (*tasks)[32] = calloc(n, sizeof(*tasks));
        if (!nodes || !np || !tasks) {
                free(nodes);
                free(np);
                free(tasks);
                rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
                return;
        }
        Psfleet__V1__JobStatus s = PSFLEET__V1__JOB_STATUS__INIT;
        s.job = c->cfg->name;
        s.max_steps = c->cfg->training.max_steps;

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
        rpc_call_reply_msg(call, &s.base);   /* packs at once: the strings may change after unlock */
        pthread_mutex_unlock(&c->lock);
        free(nodes);
        free(np);
        free(tasks);
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

/* ---- the main loop's phases (main thread) ---- */

struct loop {
        uint64_t init_start, backoff, next;
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
                Psfleet__V1__ShardStatusRequest q = PSFLEET__V1__SHARD_STATUS_REQUEST__INIT;
                ProtobufCMessage *m = NULL;
                char e[512];
                int r = probe_call(c->pc->ch[s], M_SHARD_STATUS, &q.base, &psfleet__v1__shard_status__descriptor,
                                   PROBE_TIMEOUT_MS, &m, e, sizeof(e));
                uint64_t t = mono_us();
                if (r < 0) {
                        /* gRPC backs off reconnecting (up to minutes) and fails calls fast meanwhile; a
                         * fresh channel notices a shard that has just come up at the next probe. Only
                         * this thread uses the ps channels. */
                        struct rpc_channel *fresh;
                        char name[32];
                        strfmt(name, sizeof(name), "ps:%u", s);
                        if (rpc_channel_new(c->cfg->cluster.ps[s].addr, name, &fresh) >= 0) {
                                rpc_channel_free(c->pc->ch[s]);
                                c->pc->ch[s] = fresh;
                        }
                }
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
                                         " pushes, %" PRIu64 " rejected",
                                         st->variables, st->bytes, st->pushes, st->rejected);
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

static int phase_initialize(struct chief *c, struct loop *lp) {
        const struct job_config *cfg = c->cfg;
        uint64_t t = mono_us();
        uint64_t timeout_us = cfg->supervisor.ready_timeout_secs * 1000000ULL;
        char why[512], err[512];
        uint32_t n_init;

        if (!lp->init_start)
                lp->init_start = t;
        uint32_t n_ok = probe_shards(c, &n_init, why, sizeof(why));
        int r = 0;
        if (n_ok == cfg->cluster.n_ps && n_init < n_ok) {
                if (n_init > 0)
                        log_warning("%u of %u shards are initialized and the others not; without a checkpoint "
                                    "to restore from, initializing all of them",
                                    n_init, n_ok);
                pthread_mutex_lock(&c->lock);
                set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_INITIALIZING, "initializing variables");
                pthread_mutex_unlock(&c->lock);
                r = model_init_params(c->model, cfg->model.seed);
                if (r >= 0)
                        r = ps_client_assign(c->pc, model_params(c->model), NULL, 0, err, sizeof(err));
                if (r < 0)
                        strfmt(why, sizeof(why), "assigning the variables: %s", err);
                else
                        log_info("Initialized %u ps shard%s with %zu parameters (seed %" PRIu64 ")",
                                 cfg->cluster.n_ps, cfg->cluster.n_ps == 1 ? "" : "s",
                                 model_n_params(c->model), cfg->model.seed);
        }
        if (n_ok < cfg->cluster.n_ps || r < 0) {
                if (t - lp->init_start > timeout_us)
                        return fail_job(c, "not ready after %" PRIu64 " s (supervisor.ready_timeout_secs): %s",
                                        cfg->supervisor.ready_timeout_secs, why);
                pthread_mutex_lock(&c->lock);
                set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_INITIALIZING, "waiting for %s", why);
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
        if (n_init == cfg->cluster.n_ps && c->ps[0].global_step > c->global_step)
                c->global_step = c->ps[0].global_step;
        uint64_t gs = c->global_step;
        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_READY, NULL);
        c->ready_mono = mono_us();
        c->ready_step = gs;
        lp->last_progress_log = c->ready_mono;
        add_sample_locked(c, c->ready_mono, gs);
        pthread_mutex_unlock(&c->lock);
        if (n_init == cfg->cluster.n_ps)
                log_info("Every ps shard is already initialized: carrying on at global_step %" PRIu64, gs);
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

        pthread_mutex_lock(&c->lock);
        for (uint32_t s = 0; s < cfg->cluster.n_ps; s++) {
                const struct ps_info *pi = &c->ps[s];
                if (!pi->reachable && t - pi->lost_since_mono > timeout_us) {
                        pthread_mutex_unlock(&c->lock);
                        return fail_job(c, "ps:%u (%s) lost for more than %" PRIu64 " s: %s", s,
                                        cfg->cluster.ps[s].addr, cfg->supervisor.ready_timeout_secs,
                                        pi->state);
                }
                if (pi->reachable && !pi->initialized) {
                        uint64_t inc = pi->incarnation;
                        pthread_mutex_unlock(&c->lock);
                        /* Restoring one shard needs a checkpoint of it; until chiefd writes them, the
                         * job cannot go on with a shard that lost its variables. */
                        return fail_job(c, "ps:%u (%s) restarted (incarnation %" PRIu64 ") and lost its variables; "
                                        "there is no checkpoint to restore it from",
                                        s, cfg->cluster.ps[s].addr, inc);
                }
        }
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
        }
        lp->next = t + POLL_US;
        return 0;
}

/* A worker still computing? "training..." states are; "done", "waiting..." and anything else are not. */
static bool worker_busy(const char *state) {
        return strncmp(state, "training", 8) == 0 || strcmp(state, "joined") == 0;
}

static int finish(struct chief *c) {
        const struct job_config *cfg = c->cfg;
        char err[512];
        uint64_t gs = 0;

        pthread_mutex_lock(&c->lock);
        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING, "evaluating on the test split");
        pthread_mutex_unlock(&c->lock);
        int r = ps_client_pull(c->pc, model_params(c->model), NULL, &gs, err, sizeof(err));
        if (r < 0)
                return fail_job(c, "pulling the final parameters: %s", err);
        float loss, acc;
        r = model_params_sync(c->model);
        if (r >= 0)
                r = model_evaluate(c->model, c->test->x, c->test->y, c->test->n, &loss, &acc);
        if (r < 0)
                return fail_job(c, "evaluating on the test split: %s", strerror(-r));
        r = chief_db_add_evaluation(c->db, now_us(), gs, c->test->n, loss, acc);
        if (r < 0)
                log_warning_errno(r, "Cannot record the evaluation in the database, continuing");

        pthread_mutex_lock(&c->lock);
        if (gs > c->global_step)
                c->global_step = gs;
        c->test_accuracy = acc;
        c->test_loss = loss;
        set_state_locked(c, PSFLEET__V1__JOB_STATE__JOB_STATE_DONE, NULL);
        float wall = c->wall_s;
        double eps = steps_per_s_locked(c) * cfg->training.batch_size;
        pthread_mutex_unlock(&c->lock);
        save_job(c);
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
        for (;;) {
                uint64_t t = mono_us();
                int timeout = lp.next == UINT64_MAX ? -1
                              : lp.next > t         ? (int)((lp.next - t + 999) / 1000)
                                                    : 0;
                int n = poll(fds, 2, timeout);
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
                switch (st) {
                case PSFLEET__V1__JOB_STATE__JOB_STATE_INITIALIZING:
                case PSFLEET__V1__JOB_STATE__JOB_STATE_RESTORING:
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
                         state_name((Psfleet__V1__JobState)prev.state), prev.global_step);
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
                r = job_layout_new(cfg, c->model, &c->L);
        if (r >= 0)
                r = ps_client_new(cfg, c->L, "chief:0", &c->pc);
        if (r < 0) {
                log_error_errno(r, "Cannot build the model and its layout over %u ps shards", cfg->cluster.n_ps);
                goto fail;
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
                {M_JOIN, h_join, c},     {M_REPORT, h_report, c},
                {M_STATUS, h_status, c}, {M_STOP, h_stop, c},
                {RPC_HEALTH_CHECK, rpc_health_handler, (void *)health_services},
        };
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
