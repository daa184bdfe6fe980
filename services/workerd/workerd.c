/* workerd: one training worker. Reads its own shard of the data, computes gradients, pushes them to the
 * ps shards and trains on the fresh values their replies carry.
 *
 * The step loop, in train() and step(), reads top to bottom and is the same for every job: batch →
 * forward (waiting for each block's fresh values) → backward (pushing each block's gradients as soon
 * as they are final) → end of step → report; a lost shard is recovered from in one place. Where the
 * batches come from, dense or with embeddings, is the batch source's (batch.h); one model or one per
 * local GPU, the replicas' (replicas.h). Communication overlaps compute; which gradients travel
 * together, and when to push and to wait, is push.c's; how a push travels (gRPC, or shared memory to a
 * psd on this host) is the ps client's (ps_client.h). */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "daemon.h"
#include "device.h"
#include "data.h"
#include "dense_step.h"
#include "job.h"
#include "ps_client.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "notify.h"
#include "push.h"
#include "replicas.h"
#include "rng.h"
#include "rpc.h"
#include "sparse_step.h"
#include "trainer.h"
#include "util.h"
#include "psfleet/v1/supervisor.pb-c.h"
#include "psfleet/v1/worker.pb-c.h"

struct worker {
        struct daemon_args args;
        const struct job_config *cfg;
        uint32_t index, n_workers;
        struct backend *bes[DEVICE_MAX_GPUS]; /* one, or one per local GPU */
        uint32_t n_bes;
        struct replicas *rep;     /* the model on each backend: with several, the batch split across them */
        struct model *m;          /* replica 0: the variables pulls write and pushes read */
        struct job_layout *L;
        struct ps_client *pc;
        struct pusher *pu;        /* the step's pushes and waits */
        struct rpc_channel *chief;
        struct dataset *train;      /* data.format idx: the dataset src reads its shard of */
        struct batch_source *src;   /* the batches: dense_step.h, or sparse_step.h for a model with embeddings */
        FILE *loss_log;
        int sfd;                  /* signalfd */

        uint64_t local_step, global_step, examples;
        uint64_t win_t, win_ex;     /* the examples/s window: since when, how many */
        uint64_t wd_usec, wd_last;  /* systemd's watchdog interval, and when it was last fed */
        bool config_error;          /* the device options are wrong: exit 78, restarting cannot help */
        atomic_bool stop;
        float last_loss;
        bool diverged;              /* said so once in the journal */
        uint64_t last_refused_report; /* mono: a diverged step's report after its pushes were refused */
        double ex_per_s;
        uint64_t slow_step_ms;      /* test hook PSFLEET_TEST_SLOW_STEP_MS; 0 (always, outside tests): off */
        pthread_mutex_t st_mu;      /* what on_status reads: state, steps, loss, speed, the wait */
        char state[768];
        struct wait {               /* what the worker waits for; peer[0] == 0: nothing */
                char peer[16];          /* "chief:0", "ps:1" */
                uint64_t since_us, deadline_us;   /* wall clock */
                char last_error[600];
        } wait;
        struct rpc_server *server;
        struct metric *m_steps, *m_examples, *m_step, *m_loss, *m_stale, *m_pull;   /* worker_metrics() */
};

static void set_state(struct worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_state(struct worker *w, const char *fmt, ...) {
        va_list ap;
        pthread_mutex_lock(&w->st_mu);
        va_start(ap, fmt);
        vsnprintf(w->state, sizeof(w->state), fmt, ap);
        va_end(ap);
        pthread_mutex_unlock(&w->st_mu);
        notify_status("%s", w->state);
}

/* A bounded wait for `peer` begins (since_us == 0), goes on (its last error), or ends (peer NULL): shown
 * in the status as waiting_for and, with the time left, in the state line. */
static void set_waiting(struct worker *w, const char *peer, uint64_t since_us, uint64_t deadline_us, const char *state,
                        const char *last_error) {
        pthread_mutex_lock(&w->st_mu);
        w->wait = (struct wait){.since_us = since_us, .deadline_us = deadline_us};
        if (peer) {
                snprintf(w->wait.peer, sizeof(w->wait.peer), "%s", peer);
                snprintf(w->wait.last_error, sizeof(w->wait.last_error), "%s", last_error);
        }
        pthread_mutex_unlock(&w->st_mu);
        if (peer) {
                uint64_t now = now_us();
                set_state(w, "%s (gives up in %llu s)", state,
                          (unsigned long long)(deadline_us > now ? (deadline_us - now) / 1000000u : 0));
        }
}

/* The ps shard an error of the ps client names ("ps:1 (127.0.0.1:7001): ..."), else "ps". */
static void ps_peer(const char *err, char *peer, size_t len) {
        const char *at = strstr(err, "ps:");
        unsigned shard;
        if (at && sscanf(at, "ps:%u", &shard) == 1)
                snprintf(peer, len, "ps:%u", shard);
        else
                snprintf(peer, len, "ps");
}

/* The watchdog is fed after each step, and on each round of a bounded wait: a worker stuck anywhere
 * else (a hung BLAS call, a deadlock) stops feeding it and systemd restarts it. */
static void feed_watchdog(struct worker *w) {
        if (!w->wd_usec)
                return;
        uint64_t now = mono_us();
        if (now - w->wd_last >= w->wd_usec / 4) {
                notify_watchdog();
                w->wd_last = now;
        }
}

static bool signalled(struct worker *w) {
        struct signalfd_siginfo si;
        if (read(w->sfd, &si, sizeof(si)) == sizeof(si)) {
                log_info("signal %s: stopping after this step", strsignal((int)si.ssi_signo));
                atomic_store(&w->stop, true);
        }
        return atomic_load(&w->stop);
}

/* Sleeps up to ms, waking early on a signal. */
static void nap(struct worker *w, uint64_t ms) {
        struct pollfd p = {.fd = w->sfd, .events = POLLIN};
        poll(&p, 1, (int)ms);
        signalled(w);
}

/* The test hook PSFLEET_TEST_SLOW_STEP_MS: a worker made slow on purpose, so that the straggler
 * tests have one (psfleet top). Read once at start, so an unset hook costs the step loop one branch. */
static uint64_t test_hook_slow_step_ms(void) {
        const char *v = config_env_value("PSFLEET_TEST_SLOW_STEP_MS");
        uint64_t ms = 0;
        if (!v || !*v)
                return 0;
        if (parse_u64(v, 0, 10000, &ms) < 0) {
                log_warning("Test hook PSFLEET_TEST_SLOW_STEP_MS=\"%s\" is not a number of milliseconds (0..10000); "
                            "ignoring it", v);
                return 0;
        }
        if (ms)
                log_warning("Test hook PSFLEET_TEST_SLOW_STEP_MS=%llu: every step sleeps %llu ms",
                            (unsigned long long)ms, (unsigned long long)ms);
        return ms;
}

/* ---- the Worker service: status and stop ---- */

static void on_status(struct rpc_call *call, void *ud) {
        struct worker *w = ud;
        Psfleet__V1__WorkerStatus st = PSFLEET__V1__WORKER_STATUS__INIT;
        char state[sizeof(w->state)];
        pthread_mutex_lock(&w->st_mu);
        memcpy(state, w->state, sizeof(state));
        st.local_step = w->local_step;
        st.global_step = w->global_step;
        st.loss = w->last_loss;
        st.examples_per_s = (float)w->ex_per_s;
        struct wait wait = w->wait;
        pthread_mutex_unlock(&w->st_mu);
        Psfleet__V1__WaitingFor wf = PSFLEET__V1__WAITING_FOR__INIT;
        if (wait.peer[0]) {
                wf.peer = wait.peer;
                wf.since_us = wait.since_us;
                wf.deadline_us = wait.deadline_us;
                wf.last_error = wait.last_error;
                st.waiting_for = &wf;
        }
        st.worker = w->index;
        st.state = state;
        st.backend = (char *)backend_name(w->bes[0]);
        rpc_call_reply_msg(call, &st.base);
}

static void on_stop(struct rpc_call *call, void *ud) {
        struct worker *w = ud;
        atomic_store(&w->stop, true);
        Psfleet__V1__StopReply rep = PSFLEET__V1__STOP_REPLY__INIT;
        rpc_call_reply_msg(call, &rep.base);
}

/* ---- joining the job, reading the parameters ---- */

/* Asks the chief until the job is ready. Every wait is bounded (supervisor.ready_timeout_secs) and its
 * reason is logged and shown in the status. Returns 0, -EPERM when the chief refuses our job file (the
 * caller exits 78), -ETIMEDOUT, or -ECANCELED on a signal. */
static int join(struct worker *w) {
        char *canon = config_canonical_json(w->cfg);
        if (!canon)
                return -ENOMEM;
        uint64_t deadline = mono_us() + w->cfg->supervisor.ready_timeout_secs * 1000000u;
        uint64_t since = now_us(), wall_deadline = since + w->cfg->supervisor.ready_timeout_secs * 1000000u;
        struct backoff bo;
        backoff_init(&bo, 100, 2000);
        char last[700] = "";
        int r;
        for (;;) {
                Psfleet__V1__JoinRequest q = PSFLEET__V1__JOIN_REQUEST__INIT;
                q.task = w->args.task_name;
                q.fingerprint = w->L->fingerprint;
                q.job_json = canon;
                ProtobufCMessage *m;
                char err[600], why[700];
                r = rpc_call_msg(w->chief, "/psfleet.v1.Supervisor/Join", &q.base, &psfleet__v1__join_reply__descriptor,
                                 2000, false, &m, err, sizeof(err));
                if (r == 0) {
                        Psfleet__V1__JoinReply *rep = (Psfleet__V1__JoinReply *)m;
                        if (rep->refused) {
                                log_error("the chief refused this worker: %s", rep->reason);
                                set_state(w, "refused: %s", rep->reason);
                                protobuf_c_message_free_unpacked(m, NULL);
                                r = -EPERM;
                                break;
                        }
                        /* STOPPED: the chief is stopping in order; a start of the job later resumes */
                        if (rep->state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE ||
                            rep->state == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED ||
                            rep->state == PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPED) {
                                log_info("the job has ended: %s; nothing to do", rep->reason);
                                protobuf_c_message_free_unpacked(m, NULL);
                                r = -ESHUTDOWN;
                                break;
                        }
                        if (rep->ready) {
                                w->global_step = rep->global_step;
                                protobuf_c_message_free_unpacked(m, NULL);
                                break;
                        }
                        snprintf(why, sizeof(why), "waiting: the job is not ready: %s", rep->reason);
                        snprintf(err, sizeof(err), "the job is not ready: %s", rep->reason);
                        protobuf_c_message_free_unpacked(m, NULL);
                } else {
                        snprintf(why, sizeof(why), "waiting: chief not reachable: %s", err);
                }
                if (strcmp(why, last) != 0) {
                        log_info("%s; retrying for up to %llu s", why,
                                 (unsigned long long)((deadline - mono_us()) / 1000000u));
                        snprintf(last, sizeof(last), "%s", why);
                }
                set_waiting(w, "chief:0", since, wall_deadline, why, err);
                feed_watchdog(w);
                if (mono_us() > deadline) {
                        log_error("gave up after supervisor.ready_timeout_secs=%llu: %s",
                                  (unsigned long long)w->cfg->supervisor.ready_timeout_secs, why);
                        r = -ETIMEDOUT;
                        break;
                }
                nap(w, backoff_next(&bo));
                if (atomic_load(&w->stop)) {
                        r = -ECANCELED;
                        break;
                }
        }
        set_waiting(w, NULL, 0, 0, NULL, NULL);
        free(canon);
        return r;
}

/* What a scrape shows (docs/operations.md, "Metrics"); the per-shard push latency is the ps client's. */
static void worker_metrics(struct worker *w) {
        char i[16];
        snprintf(i, sizeof(i), "%u", w->index);
        w->m_steps = metric_counter("psfleet_worker_steps_total", "Training steps this worker completed.", "worker", i);
        w->m_examples = metric_counter("psfleet_worker_examples_total", "Examples this worker trained on.", "worker", i);
        w->m_step = metric_gauge("psfleet_worker_global_step", "global_step as this worker last heard it.", "worker", i);
        w->m_loss = metric_gauge("psfleet_worker_loss", "Loss of the last step (softmax cross-entropy).", "worker", i);
        w->m_stale = metric_gauge("psfleet_worker_staleness_steps", "Steps of other workers applied during this "
                                  "worker's last step (async staleness).", "worker", i);
        w->m_pull = metric_histogram("psfleet_worker_pull_seconds", "Time to read every shard's values (start, and "
                                     "after a lost shard).", "worker", i, metrics_latency_buckets,
                                     metrics_n_latency_buckets);
}

/* Reads every shard into the model, retrying (bounded: supervisor.ready_timeout_secs) while shards are
 * unreachable or uninitialized. Returns 0, -ETIMEDOUT past the deadline, -ECANCELED on a signal, or
 * the pull's error when retrying cannot help. */
static int pull_all(struct worker *w) {
        uint64_t timeout = w->cfg->supervisor.ready_timeout_secs * 1000000u;
        uint64_t deadline = mono_us() + timeout, since = now_us();
        struct backoff bo;
        backoff_init(&bo, 100, 2000);
        for (;;) {
                char err[600], why[700], peer[16];
                uint64_t gs = 0;
                uint64_t t0 = mono_us();
                int r = ps_client_pull(w->pc, model_params(w->m), NULL, &gs, err, sizeof(err));
                if (r == 0) {
                        metric_observe_us(w->m_pull, mono_us() - t0);
                        set_waiting(w, NULL, 0, 0, NULL, NULL);
                        w->global_step = gs;
                        return replicas_params_sync(w->rep);
                }
                ps_peer(err, peer, sizeof(peer));
                snprintf(why, sizeof(why), "waiting: cannot read the parameters: %s", err);
                set_waiting(w, peer, since, since + timeout, why, err);
                feed_watchdog(w);
                if (r != -EAGAIN && r != -ETIMEDOUT)
                        return log_error_errno(r, "cannot read the parameters: %s", err);
                if (mono_us() > deadline) {
                        log_error("gave up waiting for %s after supervisor.ready_timeout_secs=%llu: %s", peer,
                                  (unsigned long long)w->cfg->supervisor.ready_timeout_secs, err);
                        return -ETIMEDOUT;
                }
                log_info("cannot read the parameters yet: %s; retrying", err);
                nap(w, backoff_next(&bo));
                if (atomic_load(&w->stop))
                        return -ECANCELED;
        }
}

/* Tells the chief how training goes; its answer may say stop. A failed report is no reason to stop. */
static void report(struct worker *w, const char *state) {
        Psfleet__V1__ReportRequest q = PSFLEET__V1__REPORT_REQUEST__INIT;
        q.worker = w->index;
        q.local_step = w->local_step;
        q.global_step = w->global_step;
        q.loss = w->last_loss;
        q.examples_per_s = (float)w->ex_per_s;
        q.examples = w->examples;
        q.state = (char *)state;
        ProtobufCMessage *m;
        char err[600];
        if (rpc_call_msg(w->chief, "/psfleet.v1.Supervisor/Report", &q.base, &psfleet__v1__report_reply__descriptor,
                         2000, false, &m, err, sizeof(err)) < 0) {
                log_warning("report to the chief failed (training goes on): %s", err);
                return;
        }
        if (((Psfleet__V1__ReportReply *)m)->stop) {
                if (!atomic_load(&w->stop))
                        log_info("the chief says stop");
                atomic_store(&w->stop, true);
        }
        protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- the step loop ---- */

/* global_step as shard 0 last told it, now also the worker's; *counting_ret: the pushes in flight
 * that will count a step once answered. */
static uint64_t update_global_step(struct worker *w, uint32_t *counting_ret) {
        uint64_t gs = ps_client_global_step(w->pc, counting_ret);
        pthread_mutex_lock(&w->st_mu);
        w->global_step = gs;
        pthread_mutex_unlock(&w->st_mu);
        return gs;
}

/* "nan", "inf", "-inf": a loss that is not finite, as the chief words it. */
static const char *nonfinite_name(float x) {
        return isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
}

/* Whether training has gone numerically wrong: a loss that is not finite, or weights that blew up
 * (what says which). Asked at report time only: the scan reads the whole model. */
static bool diverged(struct worker *w, float loss, char *what, size_t len) {
        char why[160];
        if (!isfinite(loss))
                snprintf(what, len, "a non-finite loss (%s)", nonfinite_name(loss));
        else if (model_params_check(w->m, why, sizeof(why)) < 0)
                snprintf(what, len, "weights blown up (%s)", why);
        else
                return false;
        return true;
}

/* Tells the chief how training goes: "training", or "diverged: WHAT" for a model gone wrong (the
 * chief then fails the job), never a healthy-looking report. */
static void report_progress(struct worker *w, float loss) {
        const struct training_config *t = &w->cfg->training;
        char what[200], state[220] = "training";
        if (diverged(w, loss, what, sizeof(what))) {
                snprintf(state, sizeof(state), "diverged: %s", what);
                if (!w->diverged)
                        log_full(LOG_ERR, 0, w->global_step, "the model diverged or was poisoned: %s", what);
                w->diverged = true;
        }
        report(w, state);
        set_state(w, "%s: step %llu/%llu, loss %.3f, %.0f ex/s", state, (unsigned long long)w->global_step,
                  (unsigned long long)t->max_steps, loss, w->ex_per_s);
}

/* A step is done: its loss logged and counted, and every report_every_steps the chief told. */
static void step_done(struct worker *w, float loss) {
        const struct training_config *t = &w->cfg->training;
        if (w->loss_log)
                trainer_log_loss(w->loss_log, w->local_step, loss);
        feed_watchdog(w);
        pthread_mutex_lock(&w->st_mu);
        w->local_step++;
        w->examples += t->batch_size;
        w->last_loss = loss;
        pthread_mutex_unlock(&w->st_mu);
        w->win_ex += t->batch_size;
        metric_add(w->m_steps, 1);
        metric_add(w->m_examples, t->batch_size);
        metric_set(w->m_loss, loss);
        if (w->local_step % t->report_every_steps == 0) {
                uint64_t now = mono_us();
                w->ex_per_s = (double)w->win_ex / ((double)(now - w->win_t) / 1e6);
                w->win_t = now;
                w->win_ex = 0;
                report_progress(w, loss);
                log_debug_step(w->global_step, "loss %.4f, %.0f examples/s", loss, w->ex_per_s);
        }
}

/* sync: whether the job still needs steps, from a pull (the shards' own global_step; the answers to
 * pushes carry the step of the pushed parts, which may be ahead of it). A pull that fails: the job is
 * being stopped, so no. */
static bool sync_unfinished(struct worker *w) {
        char err[600];
        uint64_t gs;
        if (ps_client_pull(w->pc, model_params(w->m), NULL, &gs, err, sizeof(err)) < 0 ||
            replicas_params_sync(w->rep) < 0)
                return false;
        update_global_step(w, NULL);
        return gs < w->cfg->training.max_steps;
}

/* What a step came to: STEP_DONE, its pushes answered and the step counted; STEP_LOST, a shard was
 * lost or restarted (why in err): re-read the parameters and carry on; STEP_STOP, its pushes were
 * refused and the chief, told so, says stop. */
enum { STEP_DONE, STEP_LOST, STEP_STOP };

/* A step's pushes failed. A model gone wrong computes gradients that are not finite, which the shards
 * refuse: no step completes, so say so here (once a second) instead of retrying in silence; the
 * chief's answer is to stop. Returns whether it did. */
static bool report_refused(struct worker *w, float loss) {
        if (isfinite(loss) || mono_us() - w->last_refused_report < 1000000)
                return false;
        w->last_refused_report = mono_us();
        pthread_mutex_lock(&w->st_mu);
        w->last_loss = loss;
        pthread_mutex_unlock(&w->st_mu);
        report_progress(w, loss);
        return atomic_load(&w->stop);
}

/* One step: the batch → forward (the pusher's push_await waits for each block's fresh values before
 * forward reads it) → backward (push_ready pushes each block's gradients as soon as they are final)
 * → the step's pushes answered. Returns STEP_*, or -errno (logged) when training cannot go on. */
static int step(struct worker *w, float *loss, char *err, size_t errlen) {
        int r = batch_next(w->src, err, errlen);
        if (r == -EBADMSG)
                return log_error_errno(r, "cannot read the training data: %s", err);
        if (r < 0)
                return STEP_LOST;
        push_step_begin(w->pu, w->local_step);
        r = batch_forward(w->src, w->rep, loss, push_await, w->pu);
        bool backward_ran = r >= 0 && !push_failed(w->pu);
        if (backward_ran)
                r = replicas_backward_blocks(w->rep, push_ready, w->pu);
        if (r < 0)
                return log_error_errno(r, "step %llu failed", (unsigned long long)w->local_step);
        if (backward_ran)   /* a failed push skips backward: nothing for the source to keep either */
                batch_backward_done(w->src, w->m);
        if (push_step_end(w->pu, err, errlen) < 0)
                return report_refused(w, *loss) ? STEP_STOP : STEP_LOST;
        return STEP_DONE;
}

/* A shard was lost or restarted (err says which): wait for it, re-read the values, link again. */
static int recover(struct worker *w, const char *err) {
        log_warning("step %llu: %s; re-reading the parameters", (unsigned long long)w->local_step, err);
        int r = pull_all(w);
        if (r < 0)
                return r;
        ps_client_link_shards(w->pc);
        return 0;
}

static int train(struct worker *w) {
        const struct training_config *t = &w->cfg->training;
        uint32_t counting;
        char err[600];
        int r;
        set_state(w, "training");
        log_info_step(w->global_step, "training from global_step %llu to %llu on shard %u of %u (%u examples)",
                      (unsigned long long)w->global_step, (unsigned long long)t->max_steps, w->index, w->n_workers,
                      batch_examples(w->src));
        w->win_t = mono_us();
        uint64_t gs = w->global_step, prev = gs;
        /* sync: a push counted as heading for global_step may be dropped as stale (another worker's
         * made the step), and an answer's step is its parts': the job is done when a pull says so */
again:
        /* a push that counts a step may still be in flight */
        while (!signalled(w) && (gs = update_global_step(w, &counting)) + counting < t->max_steps) {
                float loss;
                metric_set(w->m_step, (double)gs);
                metric_set(w->m_stale, gs > prev + 1 ? (double)(gs - prev - 1) : 0);
                prev = gs;
                if ((r = step(w, &loss, err, sizeof(err))) < 0)
                        return r;
                if (r == STEP_STOP)
                        break;
                if (r == STEP_LOST) {
                        if ((r = recover(w, err)) < 0)
                                return r;
                        continue;
                }
                step_done(w, loss);
                if (w->slow_step_ms)
                        nap(w, w->slow_step_ms);
        }
        /* the last pushes' values are the job's; apply them so status and logs agree */
        push_finish(w->pu);
        if ((r = batch_flush(w->src, err, sizeof(err))) < 0)
                log_warning("the last step's embedding gradients were not applied: %s", err);
        update_global_step(w, NULL);
        if (t->mode == MODE_SYNC && !signalled(w) && sync_unfinished(w))
                goto again;
        return 0;
}

/* ---- set-up ---- */

static int build_rest(struct worker *w);

/* A model with embeddings: records instead of a dataset, and rows from the shards (sparse_step.h). */
static int build_sparse(struct worker *w) {
        char err[1024];
        int r;
        if ((r = model_set_input_grad(w->m, true)) < 0)
                return log_error_errno(r, "cannot build the model");
        if ((r = job_layout_new(w->cfg, &w->L)) < 0 || (r = ps_client_new(w->cfg, w->L, w->args.task_name, &w->pc)) < 0)
                return log_error_errno(r, "cannot set up the ps clients");
        if ((r = sparse_step_new(w->cfg, w->index, w->n_workers, w->pc, &w->src, err, sizeof(err))) < 0) {
                /* one line naming the file and why; -EBADMSG, bad data, exits 65 */
                log_error("cannot read the training data: %s", err);
                return r;
        }
        return build_rest(w);
}

static int build(struct worker *w) {
        const struct job_config *cfg = w->cfg;
        char err[1024];
        int r;
        char *ip = trainer_data_path(cfg, cfg->data.train_images), *lp = trainer_data_path(cfg, cfg->data.train_labels);
        r = cfg->data.format == DATA_IDX ? dataset_load(ip, lp, &w->train, err, sizeof(err)) : 0;
        free(ip);
        free(lp);
        if (r < 0) {
                /* one line naming the file and why (err says both); -EBADMSG, bad data, exits 65 */
                log_error("cannot read the training data: %s", err);
                return r;
        }
        /* where to compute: the job's device options, overridable per node (PSFLEET_DEVICE, ...) */
        char msg[1024];
        struct device_request req;
        if ((r = device_request_resolve(&cfg->device, &req, msg, sizeof(msg))) < 0) {
                w->config_error = true;
                return log_error_errno(r, "device: %s", msg);
        }
        if (req.kind == DEVICE_GPU && req.n_gpus > 1 && cfg->model.n_embeddings > 0) {
                /* the sparse front (ctr) runs on replica 0 alone: its rows' gradients would miss the
                 * other replicas' share of the batch */
                w->config_error = true;
                return log_error_errno(-EINVAL, "device: a model with embedding tables (model.embeddings) trains on "
                                       "one device per worker; the device names %u GPUs", req.n_gpus);
        }
        if (req.kind == DEVICE_GPU && req.n_gpus > 1) {
                /* several local GPUs: one model per GPU, the batch split across them, one push per step */
                int fell = device_backends_new(&cfg->device, cfg->training.threads, w->bes, &w->n_bes, msg, sizeof(msg));
                r = fell;
                if (fell == DEVICE_FELL_BACK)
                        log_notice("%s", msg);
                if (r < 0 ||
                    (r = replicas_new(w->bes, w->n_bes, &cfg->model, cfg->training.batch_size, &w->rep, msg,
                                      sizeof(msg))) < 0) {
                        w->config_error = r == -EINVAL || r == -ENODEV || r == -ENOMEM;
                        return log_error_errno(r, "device: %s", msg);
                }
                if (fell != DEVICE_FELL_BACK)
                        log_info("device: %u replicas, the batch of %u split across them: %s", w->n_bes,
                                 cfg->training.batch_size, msg);
        } else {
                r = device_backend_new(&cfg->device, cfg->training.threads, &w->bes[0], msg, sizeof(msg));
                if (r < 0) {
                        w->config_error = true;
                        return log_error_errno(r, "device: %s", msg);
                }
                if (r == DEVICE_FELL_BACK)
                        log_notice("%s", msg);
                else
                        log_info("device: %s", msg);
                w->n_bes = 1;
                if ((r = replicas_new(w->bes, 1, &cfg->model, cfg->training.batch_size, &w->rep, msg, sizeof(msg))) < 0) {
                        /* a memory cap too small for the model, or a head the device cannot compute: fix the options */
                        w->config_error = r == -ENOMEM || r == -EOPNOTSUPP;
                        return log_error_errno(r, "cannot build the model: %s", msg);
                }
        }
        w->m = replicas_model(w->rep);
        /* Dropout's masks: training.seed, this worker and the step (graph models) */
        uint64_t ds = cfg->training.seed * UINT64_C(0x9e3779b97f4a7c15) + w->index + 1;
        model_set_seed(w->m, rng_splitmix64(&ds));
        if (device_log_placement(&cfg->device)) {
                char lines[8192];
                device_placement(w->bes[0], w->m, lines, sizeof(lines));
                for (char *save = NULL, *l = strtok_r(lines, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
                        log_info("placement: %s", l);
        }
        if (cfg->data.format != DATA_IDX)
                return build_sparse(w);
        ip = trainer_data_path(cfg, cfg->data.train_images);
        r = dataset_fits(w->train, ip ? ip : cfg->data.train_images, model_input_size(w->m), model_n_classes(w->m), err,
                         sizeof(err));
        free(ip);
        if (r < 0) {
                log_error("the training data do not fit the model: %s", err);
                return r;
        }
        if ((r = dense_step_new(w->train, w->index, w->n_workers, cfg->training.seed, cfg->training.batch_size,
                                &w->src)) < 0)
                return log_error_errno(r, "cannot shard the data");
        if ((r = job_layout_new(cfg, &w->L)) < 0 || (r = ps_client_new(cfg, w->L, w->args.task_name, &w->pc)) < 0)
                return log_error_errno(r, "cannot set up the ps clients");
        return build_rest(w);
}

/* What every worker builds once its model, data and ps clients are: the chief's channel, the pushes,
 * the loss log, the metrics. */
static int build_rest(struct worker *w) {
        const struct job_config *cfg = w->cfg;
        int r;
        if ((r = rpc_channel_new(cfg->cluster.chief[0].addr, "chief:0", &w->chief)) < 0)
                return log_error_errno(r, "cannot set up the chief's channel");
        if ((r = pusher_new(cfg, w->L, w->rep, w->pc, w->index, &w->pu)) < 0)
                return log_error_errno(r, "cannot lay out the pushes");
        if (w->args.loss_log) {
                w->loss_log = fopen(w->args.loss_log, "we");
                if (!w->loss_log)
                        return log_error_errno(errno, "cannot open --loss-log \"%s\"", w->args.loss_log);
        }
        worker_metrics(w);
        return 0;
}

static void done(struct worker *w) {
        rpc_server_free(w->server);
        pusher_free(w->pu);   /* waits for the pushes in flight, which read the model's gradients */
        rpc_channel_free(w->chief);
        batch_free(w->src);
        dataset_free(w->train);
        replicas_free(w->rep);
        for (uint32_t i = 0; i < w->n_bes; i++)
                backend_free(w->bes[i]);
        ps_client_free(w->pc);   /* after the model, whose blocks its shared memory may hold */
        job_layout_free(w->L);
        if (w->loss_log)
                fclose(w->loss_log);
        daemon_args_done(&w->args);
}

static int run(int argc, char **argv) {
        struct worker w = {0};
        pthread_mutex_init(&w.st_mu, NULL);
        w.sfd = daemon_signals_fd();
        if (w.sfd < 0) {
                fprintf(stderr, "workerd: cannot set up signals: %s\n", strerror(-w.sfd));
                return DAEMON_EX_FAILURE;
        }
        int r = daemon_args_parse(argc, argv, "workerd", ROLE_WORKER, &w.args);
        if (r != 0)
                return r == 1 ? 0 : r;
        w.cfg = w.args.cfg;
        w.index = w.args.task.index;
        w.n_workers = w.cfg->cluster.n_worker;
        w.slow_step_ms = test_hook_slow_step_ms();
        rpc_global_init();
        snprintf(w.state, sizeof(w.state), "starting");
        int ret = DAEMON_EX_FAILURE;
        if ((r = build(&w)) < 0) {
                ret = w.config_error ? DAEMON_EX_CONFIG : daemon_exit_code(r);
                goto out;
        }

        static const char *const services[] = {"psfleet.v1.Worker", NULL};
        struct rpc_method methods[] = {
                {"/psfleet.v1.Worker/GetWorkerStatus", on_status, &w},
                {"/psfleet.v1.Worker/Stop", on_stop, &w},
                {RPC_HEALTH_CHECK, rpc_health_handler, (void *)services},
        };
        if ((r = daemon_listen(&w.args, methods, sizeof(methods) / sizeof(methods[0]), 1, DAEMON_SMALL_MESSAGES,
                                  &w.server)) < 0) {
                ret = daemon_exit_code(r);
                goto out;
        }
        notify_ready();
        w.wd_usec = notify_watchdog_usec();
        r = join(&w);
        if (r == -EPERM) {
                ret = DAEMON_EX_CONFIG;
                goto out;
        }
        if (r == -ECANCELED || r == -ESHUTDOWN) {
                ret = 0;
                goto out;
        }
        /* a wait past its deadline (-ETIMEDOUT) exits 75: systemd restarts the worker, which joins again */
        if (r < 0 || (r = pull_all(&w)) < 0) {
                ret = r == -ECANCELED ? 0 : daemon_exit_code(r);
                goto out;
        }
        ps_client_link_shards(w.pc);
        if (w.global_step > 0) {
                /* a resumed job: carry on in the data where this worker's share of the steps left it */
                uint64_t skip = w.global_step / w.n_workers * w.cfg->training.batch_size;
                char err[1024];
                if ((r = batch_skip(w.src, skip, err, sizeof(err))) < 0) {
                        log_error("cannot read the training data: %s", err);
                        ret = daemon_exit_code(r);
                        goto out;
                }
                log_info_step(w.global_step, "resuming at global_step %llu: skipped %llu examples of this shard (epoch %llu)",
                              (unsigned long long)w.global_step, (unsigned long long)skip,
                              (unsigned long long)batch_epoch(w.src));
        }
        if (w.global_step >= w.cfg->training.max_steps) {
                log_info("the job is already at global_step %llu of %llu: nothing to do",
                         (unsigned long long)w.global_step, (unsigned long long)w.cfg->training.max_steps);
        } else if ((r = train(&w)) < 0) {
                ret = r == -ECANCELED ? 0 : daemon_exit_code(r);
                goto out;
        }
        set_state(&w, "done: %llu local steps, global_step %llu", (unsigned long long)w.local_step,
                  (unsigned long long)w.global_step);
        report(&w, "done");
        uint64_t wait_us, push_us;
        push_times(w.pu, &wait_us, &push_us);
        log_info_step(w.global_step, "done: %llu local steps, loss %.4f; waited %.2f s for fresh values, %.2f s starting pushes",
                      (unsigned long long)w.local_step, w.last_loss, (double)wait_us / 1e6, (double)push_us / 1e6);
        ret = 0;
out:
        notify_stopping();
        done(&w);
        close(w.sfd);
        return ret;
}

int main(int argc, char **argv) {
        return run(argc, argv);
}
