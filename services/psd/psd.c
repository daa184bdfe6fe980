/* psd: one parameter-server shard. Its variables (shard.c) are the job's parts placed on it, with
 * their optimizer slots; it applies gradients as they arrive (async) and replies with fresh values.
 * Shard 0 owns global_step. Starts uninitialized; the chief assigns it. This file is run(), the
 * handlers' table and the chief's calls (Assign, Pull, status, Stop); shard.c validates and applies.
 *
 * Data flow of a push, top to bottom in psd_push.c: receive → validate → apply → reply, one pipeline
 * for a gRPC Push and for a worker on this host that pushes through shared memory (shmlink.h; links.c
 * runs a thread per such worker, whose pushes go to the same pipeline). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "config.h"
#include "agg.h"
#include "authz.h"
#include "daemon.h"
#include "job.h"
#include "log.h"
#include "metrics.h"
#include "notify.h"
#include "optim.h"
#include "rpc.h"
#include "shard.h"
#include "shmlink.h"
#include "ssp.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"

#include "psd-internal.h"

/* ---- helpers ---- */

/* What a scrape shows (docs/operations.md, "Metrics"); by gRPC and shared memory alike. */
static void psd_metrics(struct psd *p) {
        char shard[16];
        snprintf(shard, sizeof(shard), "%u", p->shard);
        p->m_pushes = metric_counter("psfleet_ps_pushes_total", "Pushes applied by this shard.", "shard", shard);
        p->m_rejected = metric_counter("psfleet_ps_rejected_total", "Calls refused (bad gradients, wrong job, attach "
                                       "refused).", "shard", shard);
        p->m_in = metric_counter("psfleet_ps_bytes_received_total", "Bytes of pushes received (gRPC message or "
                                 "shared-memory gradients).", "shard", shard);
        p->m_out = metric_counter("psfleet_ps_bytes_sent_total", "Bytes of fresh values sent back to pushes.", "shard",
                                  shard);
        p->m_apply = metric_histogram("psfleet_ps_apply_seconds", "Time to apply one push's gradients (optimizer and "
                                      "reply values).", "shard", shard, metrics_latency_buckets,
                                      metrics_n_latency_buckets);
        p->m_step = metric_gauge("psfleet_ps_global_step", "global_step as shard 0 holds it (0 on other shards).",
                                 "shard", shard);
        p->m_links = metric_gauge("psfleet_ps_shm_links", "Workers pushing through shared memory.", "shard", shard);
}

/* ---- Assign: the chief initializes or restores the shard ---- */

static void on_assign(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        char err[600], who[LOG_PEER_BUF];
        struct psd_request q = {0};
        int r = psd_receive(p, call, &psfleet__v1__assign_header__descriptor, &q, err, sizeof(err));
        const Psfleet__V1__AssignHeader *h = (const Psfleet__V1__AssignHeader *)q.hm;
        if (r == 0)
                r = shard_assign(p->s, q.in, h->with_slots, h->global_step, err, sizeof(err));
        if (r == 0 && p->agg)
                agg_reset(p->agg, h->global_step);   /* the step starts over from the values assigned */
        if (r < 0) {
                psd_reject(p, call, r, err);
        } else {
                log_info_step(h->global_step, "assigned by %s: %u variable part(s)%s at global_step %llu",
                              log_peer_str(h->caller->task, who, sizeof(who)), p->s->n_parts,
                              h->with_slots ? " with optimizer slots" : "", (unsigned long long)h->global_step);
                Psfleet__V1__AssignReply rep = PSFLEET__V1__ASSIGN_REPLY__INIT;
                rep.incarnation = p->incarnation;
                rpc_call_reply_msg(call, &rep.base);
        }
        psd_request_done(&q);
}

/* ---- Pull ---- */

static void on_pull(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        char err[600];
        ProtobufCMessage *m = NULL;
        int r;
        if ((r = wire_unpack(rpc_call_payload(call), &psfleet__v1__pull_request__descriptor, &m)) < 0) {
                snprintf(err, sizeof(err), "PullRequest does not parse");
                goto reject;
        }
        const Psfleet__V1__PullRequest *q = (const Psfleet__V1__PullRequest *)m;
        static const Psfleet__V1__PullHeader empty = PSFLEET__V1__PULL_HEADER__INIT;
        const Psfleet__V1__PullHeader *h = q->header ? q->header : &empty;
        if ((r = psd_check_caller(p, h->caller, err, sizeof(err))) < 0)
                goto reject;
        if (!psd_ready_or_refuse(p, call))
                goto out;
        /* ps.replicas 2: workers read the primary, whose values are the newest (a backup's trail it by
         * the update in flight); the chief may read either (to compare them) */
        if (!replica_is_primary(p->rep) && h->caller && h->caller->task && !strncmp(h->caller->task, "worker", 6)) {
                r = -EAGAIN;
                snprintf(err, sizeof(err), "ps:%u at %s is its shard's backup: read the primary", p->shard,
                         p->args.listen);
                rpc_call_fail_errno(call, r, "%s", err);
                goto out;
        }
        unsigned ns = h->with_slots ? p->s->n_slots : 0;
        struct psd_lent *vals = malloc(sizeof(*vals) + p->s->n_floats * (1 + ns) * sizeof(float));
        struct wire_out *o;
        if (!vals || wire_out_new(&o) < 0) {
                free(vals);
                psd_out_of_memory(p, call);
                goto out;
        }
        atomic_init(&vals->refs, 1);
        Psfleet__V1__PullReplyHeader rh = PSFLEET__V1__PULL_REPLY_HEADER__INIT;
        rh.incarnation = p->incarnation;
        size_t at = 0;
        for (uint32_t k = 0; k < p->s->n_parts; k++) {
                const struct shard_part *pt = &p->s->parts[k];
                bool wanted = h->n_names == 0;
                for (size_t i = 0; i < h->n_names && !wanted; i++)
                        wanted = strcmp(h->names[i], pt->name) == 0;
                if (!wanted)
                        continue;
                uint64_t shape[2] = {pt->rows, pt->cols};
                shard_read(p->s, k, ns, vals->data + at);
                for (unsigned s = 0; s <= ns; s++) {
                        char name[300];
                        snprintf(name, sizeof(name), "%s%s%s", pt->name, s ? "/" : "",
                                 s ? optim_slot_name(p->cfg->training.optimizer, s - 1) : "");
                        atomic_fetch_add(&vals->refs, 1);
                        wire_out_tensor(o, name, WIRE_DTYPE_FLOAT32, shape, 2, pt->row_begin, vals->data + at,
                                        pt->a.n * sizeof(float), psd_lent_release, vals);
                        at += pt->a.n;
                }
        }
        /* protobuf fields may come in any order: the header goes last, read after the values */
        rh.global_step = atomic_load(&p->s->global_step);
        grpc_byte_buffer *bb;
        wire_out_header(o, &rh.base);
        wire_out_finish(o, &bb);
        wire_out_free(o);
        psd_lent_release(vals);
        rpc_call_reply(call, bb);
        goto out;
reject:
        psd_reject(p, call, r, err);
out:
        if (m)
                protobuf_c_message_free_unpacked(m, NULL);
}

static void on_status(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        Psfleet__V1__ShardStatus st = PSFLEET__V1__SHARD_STATUS__INIT;
        st.shard = p->shard;
        st.initialized = atomic_load(&p->s->initialized);
        st.incarnation = p->incarnation;
        st.global_step = atomic_load(&p->s->global_step);
        st.pushes = atomic_load(&p->pushes);
        st.rejected = atomic_load(&p->rejected);
        st.clipped = atomic_load(&p->s->clipped);
        st.bytes_in = atomic_load(&p->bytes_in);
        st.bytes_out = atomic_load(&p->bytes_out);
        st.apply_us = atomic_load(&p->apply_us);
        st.bytes = p->s->n_floats * sizeof(float);
        st.variables = p->s->n_parts;
        pthread_mutex_lock(&p->err_mu);
        char last[sizeof(p->last_error)];
        memcpy(last, p->last_error, sizeof(last));
        pthread_mutex_unlock(&p->err_mu);
        st.last_error = last;
        st.shared_memory_links = links_count(p);
        Psfleet__V1__ReplicaStatus rs;
        char rerr[300];
        if (p->rep) {
                replica_status(p->rep, &rs, rerr, sizeof(rerr));
                st.replica = &rs;
        }
        if (sparse_status(p, &st) < 0) {
                psd_out_of_memory(p, call);
                return;
        }
        Psfleet__V1__WaitingFor wf = PSFLEET__V1__WAITING_FOR__INIT;
        wf.peer = (char *)"chief:0";
        if ((wf.since_us = atomic_load(&p->grace_since_us))) {
                wf.deadline_us = atomic_load(&p->grace_deadline_us);
                wf.last_error = (char *)"stopping (SIGTERM): serving until the chief's Stop or ps.stop_grace_secs";
                st.waiting_for = &wf;
        } else if (!st.initialized) {
                wf.since_us = p->ready_since_us;
                wf.deadline_us = p->ready_deadline_us;
                wf.last_error = *last ? last : (char *)"no Assign yet";
                st.waiting_for = &wf;
        }
        struct agg_status as;
        if (p->agg) {
                agg_status_get(p->agg, &as);
                st.sync_step = as.step;
                st.stale_dropped = as.stale;
                st.held_pushes = as.waiting;
                if (as.waiting && !st.waiting_for) {
                        /* pushes held for the step: whose gradients it lacks */
                        wf.peer = as.peer;
                        wf.since_us = as.since_us;
                        wf.deadline_us = as.deadline_us;
                        wf.last_error = as.reason;
                        st.waiting_for = &wf;
                }
        }
        uint32_t W = p->cfg->cluster.n_worker;
        struct ssp_clock *clk = p->ssp ? calloc(W, sizeof(*clk)) : NULL;
        Psfleet__V1__WorkerClock *wc = clk ? calloc(W, sizeof(*wc)) : NULL, **wcp = wc ? calloc(W, sizeof(*wcp)) : NULL;
        char why[300];
        int peer;
        char peer_name[32];
        if (wcp) {
                ssp_table(p->ssp, clk, &st.max_ahead, why, sizeof(why), &peer);
                for (uint32_t w = 0; w < W; w++) {
                        psfleet__v1__worker_clock__init(&wc[w]);
                        wc[w] = (Psfleet__V1__WorkerClock){.base = wc[w].base, .worker = w, .clock = clk[w].clock,
                                                           .live = clk[w].live, .waiting = clk[w].waiting};
                        wcp[w] = &wc[w];
                }
                st.n_clocks = W;
                st.clocks = wcp;
                if (peer >= 0 && !st.waiting_for) {
                        snprintf(peer_name, sizeof(peer_name), "worker:%d", peer);
                        wf.peer = peer_name;
                        wf.since_us = 0;
                        for (uint32_t w = 0; w < W; w++)
                                if (clk[w].waiting && (!wf.since_us || clk[w].waiting_since_us < wf.since_us))
                                        wf.since_us = clk[w].waiting_since_us;
                        wf.deadline_us = wf.since_us + p->cfg->rpc.deadline_ms * 1000u;
                        wf.last_error = why;
                        st.waiting_for = &wf;
                }
        }
        rpc_call_reply_msg(call, &st.base);
        sparse_status_done(&st);
        free(clk);
        free(wc);
        free(wcp);
}

static void on_stop(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        ProtobufCMessage *m = NULL;
        if (wire_unpack(rpc_call_payload(call), &psfleet__v1__stop_request__descriptor, &m) == 0) {
                const char *why = ((Psfleet__V1__StopRequest *)m)->reason;
                char buf[LOG_PEER_BUF];
                log_info("stop requested: %s", why && *why ? log_peer_str(why, buf, sizeof(buf)) : "(no reason given)");
                protobuf_c_message_free_unpacked(m, NULL);
        }
        Psfleet__V1__StopReply rep = PSFLEET__V1__STOP_REPLY__INIT;
        rpc_call_reply_msg(call, &rep.base);
        uint64_t one = 1;
        if (write(p->stop_fd, &one, sizeof(one)) < 0)
                log_warning_errno(errno, "cannot wake the main loop");
}

/* ---- set-up ---- */

static int psd_build(struct psd *p) {
        char err[256];
        int r;
        p->cfg = p->args.cfg;
        p->shard = p->args.task.index;
        p->incarnation = now_us();
        p->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (p->stop_fd < 0)
                return log_error_errno(errno, "eventfd");
        pthread_mutex_init(&p->err_mu, NULL);
        pthread_mutex_init(&p->links_mu, NULL);
        /* the variables' shapes come from the model the job file describes */
        if ((r = job_layout_new(p->cfg, &p->L)) < 0)
                return log_error_errno(r, "cannot place the variables");
        if ((r = shard_new(p->cfg, p->L, p->shard, &p->s, err, sizeof(err))) < 0)
                return log_error_errno(r, "%s", err);
        if (p->cfg->training.mode == MODE_SYNC &&
            (r = agg_new(p->s, p->cfg->cluster.n_worker, config_replicas_to_aggregate(p->cfg), &p->agg)) < 0)
                return log_error_errno(r, "cannot set up the sync step");
        if (p->cfg->training.mode == MODE_SSP && p->shard == 0 &&
            (r = ssp_new(p->cfg->cluster.n_worker, p->cfg->training.staleness,
                         p->cfg->supervisor.worker_timeout_secs * 1000000u, &p->ssp)) < 0)
                return log_error_errno(r, "cannot set up the workers' clocks");
        if ((r = replica_new(p, &p->rep)) < 0)
                return log_error_errno(r, "cannot set up the replica");
        size_t *parts_n = calloc(p->s->n_parts + 1, sizeof(size_t));
        for (uint32_t i = 0; parts_n && i < p->s->n_parts; i++)
                parts_n[i] = p->s->parts[i].a.n;
        r = parts_n ? psd_answers_new(p->cfg->cluster.n_worker, p->s->n_parts, parts_n, &p->answers) : -ENOMEM;
        free(parts_n);
        if (r < 0)
                return log_error_errno(r, "cannot set up the workers' answers");
        if (p->rep && p->agg)   /* a step's pushes are let go once the backup holds its update */
                agg_defer(p->agg, psd_sync_applied, p);
        psd_metrics(p);
        return sparse_tables_new(p);
}

static void psd_done(struct psd *p) {
        rpc_server_free(p->server);
        links_free(p->links);   /* after the server: no attach can come any more */
        p->links = NULL;
        p->agg = agg_free(p->agg);   /* after the links: nothing is held any more */
        p->ssp = ssp_free(p->ssp);
        p->rep = replica_free(p->rep);   /* after the server: no write can come any more */
        p->attach = shmlink_server_free(p->attach);   /* closes the descriptors still pending, removes the socket */
        sparse_tables_free(p);
        p->answers = psd_answers_free(p->answers);   /* after the server and the replica: no answer is built */
        shard_free(p->s);
        job_layout_free(p->L);
        if (p->stop_fd >= 0)
                close(p->stop_fd);
        daemon_args_done(&p->args);
}

/* A health check of addr on a fresh channel: 0, -EAGAIN when nothing answers there (refused), or
 * another -errno (-ETIMEDOUT: something holds the port but does not answer in time). */
static int health_check(const char *addr, const char *name, uint64_t timeout_ms) {
        struct rpc_channel *ch;
        int r = rpc_channel_new(addr, name, &ch);
        if (r < 0)
                return r;
        struct rpc_result res;
        r = rpc_call(ch, RPC_HEALTH_CHECK, NULL, timeout_ms, false, &res);
        rpc_result_clear(&res);
        rpc_channel_free(ch);
        return r;
}

/* Where our own health check calls: the address we listen on (a server bound to one interface does not
 * answer on loopback), loopback when that is a wildcard. */
static void self_address(const char *listen, int port, char *buf, size_t len) {
        char host[256];
        const char *p;
        if (split_host_port(listen, host, sizeof(host), &p) < 0 || !*host || !strcmp(host, "0.0.0.0") ||
            !strcmp(host, "::"))
                snprintf(buf, len, "127.0.0.1:%d", port);
        else if (strchr(host, ':'))
                snprintf(buf, len, "[%s]:%d", host, port);
        else
                snprintf(buf, len, "%s:%d", host, port);
}

/* The watchdog is fed only after the server answered a health check of its own: a hung server stops
 * feeding it and systemd restarts the daemon. */
static void feed_watchdog(const struct psd *p, const char *addr) {
        if (health_check(addr, p->args.task_name, 2000) == 0)
                notify_watchdog();
}

/* In the stop grace: the chief is gone when its address refuses us twice in a row (a chief stopped
 * at the same moment that has already exited): no pull for a final checkpoint can come, so waiting on
 * would only delay the stop. A chief that is there, busy or slow, keeps the grace going. */
static bool chief_gone(struct psd *p, unsigned *refused) {
        *refused = health_check(p->cfg->cluster.chief[0].addr, "chief:0", 500) == -EAGAIN ? *refused + 1 : 0;
        return *refused >= 2;
}

/* The main loop's next wake-up: the watchdog's tick, or sooner a deadline (µs, monotonic; 0: none). */
static int next_tick_ms(uint64_t tick_ms, uint64_t deadline) {
        uint64_t now = mono_us();
        if (deadline && deadline <= now)
                return 0;
        if (deadline && (deadline - now) / 1000 + 1 < tick_ms)
                return (int)((deadline - now) / 1000 + 1);
        return (int)tick_ms;
}

/* A signal: the first starts the grace (if the shard holds anything a chief may still pull); returns
 * true to stop now. */
static bool on_signal(struct psd *p, int sfd, uint64_t *grace_end) {
        struct signalfd_siginfo si;
        const char *name = read(sfd, &si, sizeof(si)) == sizeof(si) ? strsignal((int)si.ssi_signo) : "signal";
        uint64_t grace = p->cfg->ps.stop_grace_secs;
        if (*grace_end || grace == 0 || !atomic_load(&p->s->initialized)) {
                log_info("%s: stopping%s", name, *grace_end ? " now (the second signal)" : "");
                return true;
        }
        uint64_t now = now_us();
        *grace_end = mono_us() + grace * 1000000u;
        atomic_store(&p->grace_deadline_us, now + grace * 1000000u);
        atomic_store(&p->grace_since_us, now);   /* last: a status that sees it sees the deadline too */
        /* a chief stopped at the same moment (systemctl stop psfleet.target) pulls for its final
         * checkpoint, and says Stop when it has it */
        log_info("%s: serving for up to %llu s (ps.stop_grace_secs) until the chief's Stop, so that it can pull the "
                 "variables for a final checkpoint; a second signal stops at once",
                 name, (unsigned long long)grace);
        notify_status("stopping: waiting up to %llu s for the chief's Stop", (unsigned long long)grace);
        return false;
}

static int run(int argc, char **argv) {
        struct psd p = {.stop_fd = -1};
        int sfd = daemon_signals_fd();
        if (sfd < 0) {
                fprintf(stderr, "psd: cannot set up signals: %s\n", strerror(-sfd));
                return DAEMON_EX_FAILURE;
        }
        int r = daemon_args_parse(argc, argv, "psd", ROLE_PS, &p.args);
        if (r != 0)
                return r == 1 ? 0 : r;
        rpc_global_init();
        int ret = DAEMON_EX_FAILURE;
        if ((r = psd_build(&p)) < 0 || (r = links_socket_open(&p)) < 0) {
                /* psd_build's -E2BIG: ps.memory_limit_bytes below what the dense part needs (memplan) */
                ret = r == -E2BIG ? DAEMON_EX_CONFIG : daemon_exit_code(r);
                goto out;
        }

        static const char *const services[] = {"psfleet.v1.ParameterServer", NULL};
        struct rpc_method methods[] = {
                {"/psfleet.v1.ParameterServer/Push", psd_on_push, &p},
                {"/psfleet.v1.ParameterServer/Assign", on_assign, &p},
                {"/psfleet.v1.ParameterServer/Pull", on_pull, &p},
                {"/psfleet.v1.ParameterServer/GetShardStatus", on_status, &p},
                {"/psfleet.v1.ParameterServer/AttachSharedMemory", links_on_attach, &p},
                {"/psfleet.v1.ParameterServer/Stop", on_stop, &p},
                {"/psfleet.v1.ParameterServer/SparseExchange", on_sparse_exchange, &p},
                {"/psfleet.v1.ParameterServer/SparseExport", on_sparse_export, &p},
                {"/psfleet.v1.ParameterServer/SparseImport", on_sparse_import, &p},
                {"/psfleet.v1.ParameterServer/Replicate", replica_on_replicate, &p},
                {"/psfleet.v1.ParameterServer/SetRole", replica_on_set_role, &p},
                {RPC_HEALTH_CHECK, rpc_health_handler, (void *)services},
        };
        /* One server thread per training.threads (default 1). A single thread both polls the socket and
         * runs the handler, so a push is applied without a hand-over between threads: on two cores,
         * with one worker, that was 5-10 % more examples/s than two threads (docs/performance.md).
         * No handler blocks, so one thread never starves another call for long. */
        uint64_t ready = p.cfg->supervisor.ready_timeout_secs * 1000000u;
        p.ready_since_us = now_us();
        p.ready_deadline_us = p.ready_since_us + ready;
        uint64_t ready_end = mono_us() + ready, grace_end = 0;
        unsigned chief_refused = 0;
        /* The largest legal request: an Assign of every part with its slots, or a Push, plus each
         * tensor's header, or the largest sparse request; an eighth and 1 MiB more as the margin. */
        size_t legal = (1 + p.s->n_slots) * p.s->n_floats * sizeof(float) + (size_t)p.s->n_parts * 512;
        if (legal < sparse_max_request(&p))
                legal = sparse_max_request(&p);
        if ((r = daemon_listen(&p.args, methods, sizeof(methods) / sizeof(methods[0]), p.cfg->training.threads,
                               legal + legal / 8 + (1u << 20), &p.server)) < 0) {
                ret = daemon_exit_code(r);
                goto out;
        }
        char self[300];
        self_address(p.args.listen, rpc_server_port(p.server), self, sizeof(self));
        log_info("serving ps:%u on %s: %u variable part(s), %zu bytes, optimizer %s; waiting up to %llu s "
                 "(supervisor.ready_timeout_secs) for the chief to assign it",
                 p.shard, p.args.listen, p.s->n_parts, p.s->n_floats * sizeof(float), optim_name(p.cfg->training.optimizer),
                 (unsigned long long)p.cfg->supervisor.ready_timeout_secs);
        notify_ready();

        uint64_t wd = notify_watchdog_usec();
        uint64_t tick_ms = wd ? wd / 2000 : 2000;
        if (tick_ms > 2000)
                tick_ms = 2000;
        for (;;) {
                bool initialized = atomic_load(&p.s->initialized);
                struct pollfd fds[2] = {{.fd = sfd, .events = POLLIN}, {.fd = p.stop_fd, .events = POLLIN}};
                int n = poll(fds, 2, next_tick_ms(grace_end ? 250 : tick_ms, grace_end ? grace_end : initialized ? 0 : ready_end));
                if (n < 0 && errno != EINTR) {
                        log_error_errno(errno, "poll");
                        break;
                }
                if (fds[1].revents & POLLIN) {
                        ret = 0;
                        break;
                }
                if ((fds[0].revents & POLLIN) && on_signal(&p, sfd, &grace_end)) {
                        ret = 0;
                        break;
                }
                if (grace_end && mono_us() >= grace_end) {
                        log_notice("no Stop from the chief within ps.stop_grace_secs=%llu s: stopping",
                                   (unsigned long long)p.cfg->ps.stop_grace_secs);
                        ret = 0;
                        break;
                }
                if (grace_end && chief_gone(&p, &chief_refused)) {
                        log_info("the chief is gone (%s refuses connections): nobody will pull, stopping",
                                 p.cfg->cluster.chief[0].addr);
                        ret = 0;
                        break;
                }
                if (!grace_end && !atomic_load(&p.s->initialized) && mono_us() >= ready_end) {
                        /* a chief that never comes: exit so that systemd restarts us and the unit shows it */
                        log_error("no Assign from chief:0 within supervisor.ready_timeout_secs=%llu s: exiting",
                                  (unsigned long long)p.cfg->supervisor.ready_timeout_secs);
                        ret = DAEMON_EX_TEMPFAIL;
                        break;
                }
                if (wd)
                        feed_watchdog(&p, self);
                links_free(links_take(&p, UINT32_MAX));   /* links whose worker is gone */
                if (p.agg)
                        agg_expire(p.agg, now_us());   /* held pushes past their deadline: answered with why */
                if (p.ssp)
                        ssp_tick(p.ssp, now_us());   /* and those a worker gone no longer holds back */
                metric_set(p.m_links, links_count(&p));
                sparse_tables_tick(&p);
                if (grace_end)
                        continue;
                if (atomic_load(&p.s->initialized))
                        notify_status("serving: global_step %llu, %llu pushes, %llu rejected, %u shared-memory link(s)",
                                      (unsigned long long)atomic_load(&p.s->global_step),
                                      (unsigned long long)atomic_load(&p.pushes),
                                      (unsigned long long)atomic_load(&p.rejected), links_count(&p));
                else
                        notify_status("uninitialized: waiting for chief:0 to assign the variables (%llu s left)",
                                      (unsigned long long)((ready_end - mono_us()) / 1000000u));
        }
        notify_stopping();
        if (p.agg)
                agg_expire(p.agg, UINT64_MAX);   /* a held call would hold the shutdown */
        if (p.ssp)
                ssp_tick(p.ssp, UINT64_MAX);     /* nobody is live then: every held worker goes */
        if (rpc_server_shutdown(p.server, 10000) < 0)
                log_warning("some calls did not end within 10 s");
out:
        psd_done(&p);
        close(sfd);
        return ret;
}

int main(int argc, char **argv) {
        return run(argc, argv);
}
