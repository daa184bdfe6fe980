/* chiefd's main thread: a loop over the job's phases (start-up, training, stopping, done), each a
 * function that probes, snapshots and turns what it saw into events for the state machine. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "chiefd-internal.h"
#include "log.h"
#include "model.h"
#include "notify.h"
#include "ps_client.h"
#include "summary.h"
#include "util.h"

struct loop {
        uint64_t init_start, next;
        struct backoff backoff;           /* between start-up attempts */
        uint64_t restore_since;           /* mono: a restarted shard's restore began (0: none) */
        uint64_t last_notify, last_progress_log;
        uint64_t stop_begin;
        char last_why[512];
        uint64_t last_why_log;
};

/* Applies an event that ends the job: records it, answers the waiting SaveCheckpoint calls, logs.
 * Returns -EIO. */
static int fail_job(struct chief *c, const struct chief_event *ev) {
        char why[CHIEF_REASON_MAX];
        pthread_mutex_lock(&c->lock);
        chief_event_locked(c, ev);
        chief_strfmt(why, sizeof(why), "%s", c->js.reason);
        pthread_mutex_unlock(&c->lock);
        chief_save_job(c);
        chief_answer_saves(c, -EPERM, NULL, false, why);
        notify_status("failed: %s", why);
        return log_error_errno(-EIO, "Job failed: %s", why);
}

/* The same for a failure that only the caller can word. */
static int fail_jobf(struct chief *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_jobf(struct chief *c, const char *fmt, ...) {
        char why[CHIEF_REASON_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_FAILURE, .why = why});
}

/* Logs a wait reason when it changes, and every 30 s while it lasts. */
static void log_wait(struct loop *lp, const char *what, const char *why) {
        uint64_t t = mono_us();
        if (strcmp(lp->last_why, why) != 0 || t - lp->last_why_log > 30 * 1000000ULL) {
                log_info("%s: %s", what, why);
                chief_strfmt(lp->last_why, sizeof(lp->last_why), "%s", why);
                lp->last_why_log = t;
        }
}

static int phase_initialize(struct chief *c, struct loop *lp) {
        const struct job_config *cfg = c->cfg;
        uint64_t t = mono_us();
        uint64_t timeout_us = cfg->supervisor.ready_timeout_secs * 1000000ULL;
        char why[1024], err[512];
        uint32_t n_init;

        if (!lp->init_start)
                lp->init_start = t;
        uint32_t n_ok = chief_probe_shards(c, &n_init, why, sizeof(why));
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
                r = chief_restore_shards(c, which, why, sizeof(why));
                free(which);
                if (r == -EINVAL)
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_MISMATCH, .why = why});
                if (r > 0)
                        chief_event(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_DONE});
                restored = r > 0;
                restore_failed = r < 0;
        }
        if (n_ok == cfg->cluster.n_ps && n_init < n_ok && r == 0) {
                if (n_init > 0)
                        log_warning("%u of %u shards are initialized and the others not; without a checkpoint "
                                    "to restore from, initializing all of them",
                                    n_init, n_ok);
                log_info("No checkpoint to restore from in %s: initializing the variables", chief_ckpt_dir(c->ckpts));
                chief_event(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_NONE, .why = why});
                r = model_init_params(c->model, cfg->model.seed);
                if (r >= 0)
                        r = ps_client_assign(c->pc, NULL, model_params(c->model), NULL, 0, err, sizeof(err));
                if (r < 0) {
                        chief_strfmt(why, sizeof(why), "assigning the variables: %s", err);
                } else {
                        log_info("Initialized %u ps shard%s with %zu parameters (seed %" PRIu64 ")",
                                 cfg->cluster.n_ps, cfg->cluster.n_ps == 1 ? "" : "s",
                                 model_n_params(c->model), cfg->model.seed);
                        pthread_mutex_lock(&c->lock);
                        c->global_step = 0;
                        pthread_mutex_unlock(&c->lock);
                        chief_session_log(c, 0, SUMMARY_SESSION_START, NULL, "initialized");
                }
        }
        if (n_ok < cfg->cluster.n_ps || r < 0) {
                if (t - lp->init_start > timeout_us)
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_READY_TIMEOUT, .why = why,
                                                                 .timeout_s = cfg->supervisor.ready_timeout_secs});
                chief_event(c, &(struct chief_event){.kind = restore_failed ? CHIEF_EV_RESTORE_FAILED
                                                                            : CHIEF_EV_SHARDS_WAITING,
                                                     .why = why});
                notify_status("initializing: waiting for %s", why);
                log_wait(lp, "Waiting", why);
                lp->next = t + backoff_next(&lp->backoff);
                return 0;
        }

        pthread_mutex_lock(&c->lock);
        if (!restored && n_init == cfg->cluster.n_ps && c->ps[0].global_step > c->global_step)
                c->global_step = c->ps[0].global_step;
        uint64_t gs = c->global_step;
        chief_event_locked(c, &(struct chief_event){.kind = CHIEF_EV_SHARDS_READY});
        c->ready_mono = mono_us();
        c->ready_step = gs;
        lp->last_progress_log = c->ready_mono;
        chief_add_sample_locked(c, c->ready_mono, gs);
        pthread_mutex_unlock(&c->lock);
        c->last_save_step = gs;
        c->last_save_mono = c->last_summary_mono = mono_us();
        c->last_eval_step = gs;
        if (n_init == cfg->cluster.n_ps) {
                log_info("Every ps shard is already initialized: carrying on at global_step %" PRIu64, gs);
                chief_session_log(c, gs, SUMMARY_SESSION_START, NULL, "chiefd restarted");
        }
        log_info("Job ready at global_step %" PRIu64 " of %" PRIu64, gs, cfg->training.max_steps);
        notify_status("ready: global_step %" PRIu64 "/%" PRIu64 ", waiting for workers", gs, cfg->training.max_steps);
        chief_save_job(c);
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
        double eps = chief_steps_per_s_locked(c) * c->cfg->training.batch_size;
        float loss = chief_loss_locked(c);
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
        chief_probe_shards(c, &n_init, why, sizeof(why));
        uint64_t t = mono_us();

        bool *which = calloc(cfg->cluster.n_ps, sizeof(bool)), lost = false;
        if (!which)
                return log_error_errno(-ENOMEM, "Out of memory");
        pthread_mutex_lock(&c->lock);
        for (uint32_t s = 0; s < cfg->cluster.n_ps; s++) {
                const struct ps_info *pi = &c->ps[s];
                if (!pi->reachable && t - pi->lost_since_mono > timeout_us) {
                        char st[sizeof(pi->state)];
                        chief_strfmt(st, sizeof(st), "%s", pi->state);
                        pthread_mutex_unlock(&c->lock);
                        free(which);
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_SHARD_LOST, .shard = s,
                                                                 .where = cfg->cluster.ps[s].addr, .why = st,
                                                                 .timeout_s = cfg->supervisor.ready_timeout_secs});
                }
                which[s] = pi->reachable && !pi->initialized;
                lost |= which[s];
        }
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
                int r = chief_restore_shards(c, which, why, sizeof(why));
                free(which);
                if (r == -EINVAL)
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_MISMATCH, .why = why});
                if (r == 0)
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_NONE, .why = why});
                if (r < 0) {
                        if (t - lp->restore_since > timeout_us)
                                return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_TIMEOUT, .why = why,
                                                                         .timeout_s = cfg->supervisor.ready_timeout_secs});
                        chief_event(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_FAILED, .why = why});
                        log_wait(lp, "Restore failed, retrying", why);
                        lp->next = t + BACKOFF_MAX_US;
                        return 0;
                }
                lp->restore_since = 0;
                chief_event(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_DONE});
                lp->next = mono_us() + POLL_US;
                return 0;
        }
        free(which);
        pthread_mutex_lock(&c->lock);
        if (c->ps[0].reachable) {
                if (c->ps[0].global_step > c->global_step)
                        c->global_step = c->ps[0].global_step;
                chief_note_progress_locked(c, t);
                chief_add_sample_locked(c, t, c->global_step);
        }
        chief_event_locked(c, &(struct chief_event){.kind = CHIEF_EV_POLLED, .why = why,
                                                    .advanced = c->global_step > c->ready_step,
                                                    .reachable = c->ps[0].reachable});
        bool max = c->global_step >= cfg->training.max_steps, end = max || c->stop_requested;
        uint64_t gs = c->global_step;
        if (end) {
                chief_mark_end_locked(c);
                chief_event_locked(c, &(struct chief_event){.kind = max ? CHIEF_EV_MAX_STEPS : CHIEF_EV_STOP_ASKED});
        }
        pthread_mutex_unlock(&c->lock);

        if (end) {
                log_info("%s at global_step %" PRIu64 ": waiting for the workers to finish",
                         gs >= cfg->training.max_steps ? "Reached max_steps" : "Stop requested", gs);
                notify_status("stopping at step %" PRIu64 "/%" PRIu64, gs, cfg->training.max_steps);
                lp->stop_begin = t;
                chief_save_job(c);
        } else {
                notify_progress(c, lp);
                chief_maybe_snapshot(c);
                chief_maybe_write_summaries(c);
        }
        lp->next = t + POLL_US;
        return 0;
}

/* The end: one pull with the optimizer's slots, the final evaluation, the final checkpoint. */
static int finish(struct chief *c) {
        const struct job_config *cfg = c->cfg;
        char err[1024];
        uint64_t gs = 0;

        chief_event(c, &(struct chief_event){.kind = CHIEF_EV_EVALUATING});
        int r = chief_pull(c, true, &gs, err, sizeof(err));
        if (r < 0)
                return fail_jobf(c, "pulling the final parameters: %s", err);
        r = chief_evaluate(c, gs, err, sizeof(err));
        if (r < 0)
                return fail_jobf(c, "%s", err);
        chief_event(c, &(struct chief_event){.kind = CHIEF_EV_SAVING_FINAL});
        struct chief_db_checkpoint row;
        r = chief_save(c, gs, true, "end", &row, NULL, err, sizeof(err));
        if (r < 0)
                /* The training is done and evaluated; a checkpoint that cannot be written does not undo that. */
                log_error("Cannot save the final checkpoint: %s", err);
        chief_answer_saves(c, r, &row, false, err);

        pthread_mutex_lock(&c->lock);
        c->test_accuracy = c->eval_accuracy;
        c->test_loss = c->eval_loss;
        float acc = c->eval_accuracy, loss = c->eval_loss;
        chief_event_locked(c, &(struct chief_event){.kind = CHIEF_EV_FINISHED});
        float wall = c->wall_s;
        double eps = chief_steps_per_s_locked(c) * cfg->training.batch_size;
        pthread_mutex_unlock(&c->lock);
        chief_save_job(c);
        chief_session_log(c, gs, SUMMARY_SESSION_STOP, r >= 0 ? row.path : NULL, "done");
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
        int64_t first_busy;
        uint32_t busy = chief_probe_workers(c, &first_busy);
        uint64_t t = mono_us();
        if (busy && t - lp->stop_begin < STOP_WAIT_US) {
                lp->next = t + POLL_US;
                return 0;
        }
        if (busy) {
                log_warning("worker:%" PRIi64 " (and %u more) still training %llu s after the end; "
                            "telling them to stop and evaluating anyway",
                            first_busy, busy - 1, STOP_WAIT_US / 1000000);
                chief_stop_workers(c);
        }
        lp->next = UINT64_MAX;
        return finish(c);
}

/* Runs the job until a signal, a Stop after the end, or a failure. Returns 0 (clean stop) or -errno. */
int chief_supervise(struct chief *c, int sfd) {
        struct loop lp = {0};
        backoff_init(&lp.backoff, BACKOFF_MIN_US, BACKOFF_MAX_US);
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
                enum chief_phase phase = chief_state_phase(&c->js, c->stop_requested);
                pthread_mutex_unlock(&c->lock);
                int r = 0;
                switch (phase) {
                case CHIEF_PHASE_INITIALIZE:
                        r = phase_initialize(c, &lp);
                        break;
                case CHIEF_PHASE_POLL:
                        r = phase_poll(c, &lp);
                        break;
                case CHIEF_PHASE_STOPPING:
                        r = phase_stopping(c, &lp);
                        break;
                case CHIEF_PHASE_IDLE:
                        lp.next = UINT64_MAX;
                        break;
                case CHIEF_PHASE_EXIT:
                        return 0;
                case CHIEF_PHASE_FAILED:
                        return -EIO;
                }
                if (r < 0)
                        return r;
                pthread_mutex_lock(&c->lock);
                Psfleet__V1__JobState st = c->js.state;
                pthread_mutex_unlock(&c->lock);
                if (st == PSFLEET__V1__JOB_STATE__JOB_STATE_READY || st == PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING ||
                    st == PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING)
                        chief_serve_saves(c);
                /* A Stop that arrived after the end: the loop returns on the next pass. */
                pthread_mutex_lock(&c->lock);
                if (c->stop_requested && c->js.state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE)
                        lp.next = 0;
                pthread_mutex_unlock(&c->lock);
        }
}
