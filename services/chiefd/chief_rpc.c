/* chiefd's Supervisor service: Join, Report, GetStatus, Stop and the checkpoint calls, run on the RPC
 * server's threads. They read and update `struct chief` under its lock and never call out; what needs
 * a call (SaveCheckpoint) is queued for the main thread, an export (Export) for the export thread. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chiefd-internal.h"
#include "chief_metrics.h"
#include "chief_watch.h"
#include "authz.h"
#include "config.h"
#include "job.h"
#include "log.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/supervisor.pb-c.h"

#define M_JOIN "/psfleet.v1.Supervisor/Join"
#define M_REPORT "/psfleet.v1.Supervisor/Report"
#define M_STATUS "/psfleet.v1.Supervisor/GetStatus"
#define M_STOP "/psfleet.v1.Supervisor/Stop"
#define M_RESTART "/psfleet.v1.Supervisor/Restart"
#define M_WATCH "/psfleet.v1.Supervisor/Watch"
#define M_LIST_CKPT "/psfleet.v1.Supervisor/ListCheckpoints"
#define M_SAVE_CKPT "/psfleet.v1.Supervisor/SaveCheckpoint"
#define M_DELETE_CKPT "/psfleet.v1.Supervisor/DeleteCheckpoint"
#define M_EXPORT "/psfleet.v1.Supervisor/Export"

static const char *const health_services[] = {"psfleet.v1.Supervisor", NULL};

/* Every method with a request: unpacked here (a request that does not parse fails the call with
 * INVALID_ARGUMENT), handed to the method's handler, freed when it returns. */
static void dispatch(struct rpc_call *call, void *ud) {
        const struct chief_handler *h = ud;
        ProtobufCMessage *m;
        if (wire_unpack(rpc_call_payload(call), h->desc, &m) < 0) {
                rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s does not parse", h->desc->short_name);
                return;
        }
        h->fn(h->c, call, m);
        protobuf_c_message_free_unpacked(m, NULL);
}

/* "worker:3" -> 3 when it names a worker of the cluster, else -1. */
static int64_t worker_index(const struct chief *c, const char *task) {
        unsigned idx;
        char role[16], extra;
        if (!task || sscanf(task, "%15[^:]:%u%c", role, &idx, &extra) != 2 || strcmp(role, "worker") != 0 ||
            idx >= c->cfg->cluster.n_worker)
                return -1;
        return idx;
}

static void h_join(struct chief *c, struct rpc_call *call, const ProtobufCMessage *m) {
        const Psfleet__V1__JoinRequest *q = (const Psfleet__V1__JoinRequest *)m;
        const char *task = q->task && *q->task ? q->task : "(unnamed task)";
        Psfleet__V1__JoinReply rep = PSFLEET__V1__JOIN_REPLY__INIT;
        char reason[1024];
        enum peer_role role;
        uint32_t index;
        const struct peer *who = rpc_call_identity(call);
        if (who->role != PEER_INSECURE &&
            (authz_parse_task(q->task, &role, &index) < 0 || !authz_peer_is(who, role, index))) {
                rpc_call_refuse(call, "%s may not join as %s", who->name, task);
                        return;
        }

        rep.max_steps = c->cfg->training.max_steps;
        if (q->fingerprint != c->fingerprint) {
                char diff[768];
                int d = q->job_json && *q->job_json ? config_diff(c->canonical, q->job_json, diff, sizeof(diff))
                                                    : -EINVAL;
                if (d == 1)
                        chief_strfmt(reason, sizeof(reason), "job file differs from the chief's: %s", diff);
                else
                        chief_strfmt(reason, sizeof(reason),
                                 "job fingerprint %016" PRIx64 " differs from the chief's %016" PRIx64,
                                 q->fingerprint, c->fingerprint);
                char tb[LOG_PEER_BUF];
                log_warning("Refusing %s: %s", log_peer_str(task, tb, sizeof(tb)), reason);
                rep.refused = true;
                rep.reason = reason;
                pthread_mutex_lock(&c->st.lock);
                rep.state = c->st.js.state;
                rep.global_step = c->st.global_step;
                pthread_mutex_unlock(&c->st.lock);
                rpc_call_reply_msg(call, &rep.base);
                        return;
        }

        int64_t w = worker_index(c, q->task);
        pthread_mutex_lock(&c->st.lock);
        rep.state = c->st.js.state;
        rep.global_step = c->st.global_step;
        rep.ready = chief_state_may_join(&c->st.js, c->st.stop_requested, c->st.global_step, reason, sizeof(reason));
        if (w >= 0) {
                struct worker_info *wi = &c->st.workers[w];
                bool first = !wi->joined;
                wi->joined = true;
                if (!wi->reported)
                        chief_strfmt(wi->state, sizeof(wi->state), "%s", rep.ready ? "joined" : "waiting to join");
                char tb[LOG_PEER_BUF];
                if (first && rep.ready)
                        log_info("%s joined at global_step %" PRIu64, log_peer_str(task, tb, sizeof(tb)),
                                 c->st.global_step);
        }
        pthread_mutex_unlock(&c->st.lock);
        rep.reason = reason;
        rpc_call_reply_msg(call, &rep.base);
}

/* A Report that cannot be true: refused whole, and said in the journal (at most once a second: a
 * flood of them must not flood it). */
static void report_refused(struct rpc_call *call, const char *why) {
        static uint64_t last_log_us;
        uint64_t t = mono_us(), last = __atomic_load_n(&last_log_us, __ATOMIC_RELAXED);
        if (t - last >= 1000000 && __atomic_compare_exchange_n(&last_log_us, &last, t, false, __ATOMIC_RELAXED,
                                                               __ATOMIC_RELAXED))
                log_warning("Report refused: %s", why);
        rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s: refused", why);
}

static void h_report(struct chief *c, struct rpc_call *call, const ProtobufCMessage *m) {
        static bool db_warned;  /* one warning per process, not one per report */
        const Psfleet__V1__ReportRequest *q = (const Psfleet__V1__ReportRequest *)m;
        if (q->worker >= c->cfg->cluster.n_worker) {
                rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "worker %u is not in the cluster (%u workers)",
                              q->worker, c->cfg->cluster.n_worker);
                        return;
        }
        const struct peer *who = rpc_call_identity(call);
        if (!authz_peer_is(who, PEER_WORKER, q->worker)) {
                rpc_call_refuse(call, "%s may not report as worker/%u", who->name, q->worker);
                        return;
        }
        const char *st = q->state && *q->state ? q->state : "training";
        uint64_t t = now_us();
        Psfleet__V1__ReportReply rep = PSFLEET__V1__REPORT_REPLY__INIT;

        pthread_mutex_lock(&c->st.lock);
        char why[CHIEF_REASON_MAX];
        int admit = chief_report_admit_locked(&c->st, q->worker, q->global_step, q->loss, st, why, sizeof(why));
        if (admit < 0) {
                pthread_mutex_unlock(&c->st.lock);
                report_refused(call, why);
                        return;
        }
        struct worker_info *wi = &c->st.workers[q->worker];
        wi->joined = wi->reported = wi->step_known = true;
        wi->local_step = q->local_step;
        wi->global_step = q->global_step;
        wi->examples = q->examples;
        wi->loss = q->loss;
        wi->examples_per_s = q->examples_per_s;
        wi->report_interval_us = wi->last_report_us && t > wi->last_report_us ? t - wi->last_report_us : 0;
        wi->last_report_us = t;
        chief_metrics_report(q->worker);
        chief_strfmt(wi->state, sizeof(wi->state), "%s", st);
        if (strcmp(st, "done") == 0)
                wi->finished = true;
        /* global_step is ps:0's alone (chief_loop.c polls it): a worker's word never moves it, nor ends
         * the job */
        chief_event_locked(&c->st, &(struct chief_event){.kind = CHIEF_EV_WORKER_REPORT, .step = q->local_step});
        rep.stop = chief_state_workers_stop(&c->st.js, c->st.stop_requested, c->st.global_step, c->cfg->training.max_steps);
        rep.max_steps = c->cfg->training.max_steps;
        pthread_mutex_unlock(&c->st.lock);
        /* the main loop fails the job; or, a worker done, looks at global_step now rather than at its next
         * poll (up to supervisor's 250 ms later), so that the job's end, and its examples/s, are when
         * training ended */
        if (admit > 0 || wi->finished)
                chief_wake(c);

        struct chief_db_progress p = {t, q->worker, q->local_step, q->global_step, q->loss, q->examples_per_s,
                                      q->examples, st};
        int r = chief_db_add_progress(c->db, &p);
        if (r < 0 && !__atomic_exchange_n(&db_warned, true, __ATOMIC_RELAXED))
                log_warning_errno(r, "Cannot record progress in the database, continuing without it");
        rpc_call_reply_msg(call, &rep.base);
}

static void h_status(struct rpc_call *call, void *ud) {
        grpc_byte_buffer *bb = chief_status_pack(&((struct chief *)ud)->st);
        if (!bb)
                rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        else
                rpc_call_reply(call, bb);
}

void chief_wake(struct chief *c) {
        uint64_t one = 1;
        if (write(c->wake_fd, &one, sizeof(one)) < 0) {
                /* The counter cannot overflow at one write per Stop call; nothing to do. */
        }
}

static void h_stop(struct chief *c, struct rpc_call *call, const ProtobufCMessage *m) {
        const Psfleet__V1__StopRequest *q = (const Psfleet__V1__StopRequest *)m;
        char *peer = rpc_call_peer(call);
        char rb[LOG_PEER_BUF];
        log_info("Stop requested by %s%s%s%s", peer ? peer : "a client", q->reason && *q->reason ? " (" : "",
                 q->reason && *q->reason ? log_peer_str(q->reason, rb, sizeof(rb)) : "",
                 q->reason && *q->reason ? ")" : "");
        free(peer);
        pthread_mutex_lock(&c->st.lock);
        c->st.stop_requested = true;
        pthread_mutex_unlock(&c->st.lock);
        chief_wake(c);
        Psfleet__V1__StopReply rep = PSFLEET__V1__STOP_REPLY__INIT;
        rpc_call_reply_msg(call, &rep.base);
}

/* Restart: trains an ended job (DONE, FAILED, STOPPED) again; the main loop does it. */
static void h_restart(struct chief *c, struct rpc_call *call, const ProtobufCMessage *m) {
        const char *why = ((const Psfleet__V1__RestartRequest *)m)->reason;
        char *peer = rpc_call_peer(call);
        pthread_mutex_lock(&c->st.lock);
        bool ok = chief_state_ended(&c->st.js) && !c->st.stop_requested;
        Psfleet__V1__JobState st = c->st.js.state;
        if (ok) {
                c->st.restart_requested = true;
                chief_strfmt(c->st.restart_reason, sizeof(c->st.restart_reason), "asked by %s%s%s", peer ? peer : "a client",
                             why && *why ? ": " : "", why && *why ? why : "");
        }
        pthread_mutex_unlock(&c->st.lock);
        if (ok) {
                char wb[LOG_PEER_BUF];
                log_info("Restart requested by %s%s%s", peer ? peer : "a client", why && *why ? ": " : "",
                         why && *why ? log_peer_str(why, wb, sizeof(wb)) : "");
                chief_wake(c);
                Psfleet__V1__RestartReply rep = PSFLEET__V1__RESTART_REPLY__INIT;
                rpc_call_reply_msg(call, &rep.base);
        } else {
                rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                              "the job is %s: only a job that has ended (done, failed, stopped) is restarted",
                              job_state_name(st));
        }
        free(peer);
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
                        chief_checkpoint_msg(&rows[i], &msgs[i]);
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

static void h_save_ckpt(struct chief *c, struct rpc_call *call, const ProtobufCMessage *m) {
        const char *why = ((const Psfleet__V1__SaveCheckpointRequest *)m)->reason;
        char *peer = rpc_call_peer(call);
        pthread_mutex_lock(&c->st.lock);
        Psfleet__V1__JobState st = c->st.js.state;
        bool queue = false;
        if (c->st.saves_closed) {
                rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "chiefd is stopping");
        } else if (st == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE) {
                if (c->st.have_ckpt)
                        rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                                      "the job is done; its final checkpoint is \"%s\" (global_step %" PRIu64 ")",
                                      c->st.last_ckpt.path, c->st.last_ckpt.global_step);
                else
                        rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "the job is done");
        } else if (st == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED) {
                rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "the job failed: %s", c->st.js.reason);
        } else if (!c->st.js.ready_once) {
                rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "the job is not ready yet (%s: %s)", job_state_name(st),
                              c->st.js.reason);
        } else {
                queue = chief_saves_add_locked(&c->st, call) >= 0;
                if (!queue)
                        rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        pthread_mutex_unlock(&c->st.lock);
        if (queue) {
                char wb[LOG_PEER_BUF];
                log_info("Checkpoint requested by %s%s%s%s", peer ? peer : "a client", why && *why ? " (" : "",
                         why && *why ? log_peer_str(why, wb, sizeof(wb)) : "", why && *why ? ")" : "");
                chief_wake(c);
        }
        free(peer);
}

static void h_delete_ckpt(struct chief *c, struct rpc_call *call, const ProtobufCMessage *m) {
        uint64_t step = ((const Psfleet__V1__DeleteCheckpointRequest *)m)->global_step;
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
        chief_refresh_ckpt_info(&c->st);
        Psfleet__V1__Checkpoint ck;
        chief_checkpoint_msg(&row, &ck);
        Psfleet__V1__DeleteCheckpointReply rep = PSFLEET__V1__DELETE_CHECKPOINT_REPLY__INIT;
        rep.deleted = &ck;
        rpc_call_reply_msg(call, &rep.base);
}

/* Watch: the stream goes to the watch thread (chief_watch.c). */
static void h_watch(struct chief *c, struct rpc_call *call, const ProtobufCMessage *m) {
        const Psfleet__V1__WatchRequest *q = (const Psfleet__V1__WatchRequest *)m;
        int r = chief_watch_add(c->watch, call, q->min_interval_ms, q->heartbeat_ms);
        if (r == -ENOMEM)
                rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        else if (r < 0)
                rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "chiefd is stopping");
}

/* Export: written by the export thread (chief_exporter.c), which answers. */
static void h_export(struct chief *c, struct rpc_call *call, const ProtobufCMessage *m) {
        const Psfleet__V1__ExportRequest *q = (const Psfleet__V1__ExportRequest *)m;
        const struct chief_export_ask ask = {q->step, q->since, q->max_inline_rows, q->external_data};
        int r = chief_exporter_add(c->exporter, call, &ask);
        if (r == -ENOMEM)
                rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        else if (r == -EBUSY)
                rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "%d exports are waiting already: retry later",
                              CHIEF_EXPORTS_MAX);
        else if (r < 0)
                rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "chiefd is stopping");
}

void chief_rpc_methods(struct chief *c, struct rpc_method m[CHIEF_RPC_N_METHODS]) {
        const struct chief_handler with_request[CHIEF_RPC_N_HANDLERS] = {
                {c, &psfleet__v1__join_request__descriptor, h_join},
                {c, &psfleet__v1__report_request__descriptor, h_report},
                {c, &psfleet__v1__stop_request__descriptor, h_stop},
                {c, &psfleet__v1__restart_request__descriptor, h_restart},
                {c, &psfleet__v1__watch_request__descriptor, h_watch},
                {c, &psfleet__v1__save_checkpoint_request__descriptor, h_save_ckpt},
                {c, &psfleet__v1__delete_checkpoint_request__descriptor, h_delete_ckpt},
                {c, &psfleet__v1__export_request__descriptor, h_export},
        };
        memcpy(c->handlers, with_request, sizeof(with_request));
        const struct rpc_method all[CHIEF_RPC_N_METHODS] = {
                {M_JOIN, dispatch, &c->handlers[0]},
                {M_REPORT, dispatch, &c->handlers[1]},
                {M_STATUS, h_status, c},
                {M_STOP, dispatch, &c->handlers[2]},
                {M_RESTART, dispatch, &c->handlers[3]},
                {M_WATCH, dispatch, &c->handlers[4]},
                {M_LIST_CKPT, h_list_ckpts, c},
                {M_SAVE_CKPT, dispatch, &c->handlers[5]},
                {M_DELETE_CKPT, dispatch, &c->handlers[6]},
                {M_EXPORT, dispatch, &c->handlers[7]},
                {RPC_HEALTH_CHECK, rpc_health_handler, (void *)health_services},
        };
        memcpy(m, all, sizeof(all));
}
