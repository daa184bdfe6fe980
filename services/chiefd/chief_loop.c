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
#include "chief_metrics.h"
#include "job.h"
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
        bool signalled;                   /* a signal asked for the orderly stop: a second one exits */
        bool said_evaluator;              /* logged that the evaluator evaluates */
        char last_why[512];
        uint64_t last_why_log;
};

/* Applies an event that ends the job: records it (chief_event_locked), answers the waiting
 * SaveCheckpoint calls, logs. chiefd stays up to say why. Returns 0. */
/* When to look at global_step next. With save_checkpoint_steps, no later than the step rate says the
 * next checkpoint falls due: checkpoints stay save_checkpoint_steps apart instead of drifting by a
 * poll's worth of steps (about 240 at 950 steps/s), which bounds what a lost shard can lose. */
static uint64_t next_poll_us(struct chief *c) {
        uint64_t every = c->cfg->supervisor.save_checkpoint_steps;
        if (!every)
                return POLL_US;
        pthread_mutex_lock(&c->st.lock);
        double rate = chief_steps_per_s_locked(&c->st);
        uint64_t gs = c->st.global_step;
        pthread_mutex_unlock(&c->st.lock);
        uint64_t due = c->sv.last_save_step + every;
        if (rate <= 0)
                return POLL_US;
        double us = gs >= due ? 0 : (double)(due - gs) / rate * 1e6;
        return us < 5000 ? 5000 : us > POLL_US ? POLL_US : (uint64_t)us;
}

static int fail_job(struct chief *c, const struct chief_event *ev) {
        char why[CHIEF_REASON_MAX];
        pthread_mutex_lock(&c->st.lock);
        chief_event_locked(&c->st, ev);
        chief_strfmt(why, sizeof(why), "%s", c->st.js.reason);
        pthread_mutex_unlock(&c->st.lock);
        chief_answer_saves(&c->st, -EPERM, NULL, false, why);
        notify_status("failed: %s", why);
        log_error("Job failed: %s", why);
        return 0;
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

/* A worker (or the chief's own evaluation) said the model went numerically wrong: the job fails with
 * that reason, whatever it was doing. Returns true when it did. */
static bool fail_if_diverged(struct chief *c) {
        pthread_mutex_lock(&c->st.lock);
        struct chief_divergence d = c->st.diverged;
        bool fail = d.on && !chief_state_ended(&c->st.js);
        c->st.diverged.on = false;
        pthread_mutex_unlock(&c->st.lock);
        if (fail)
                fail_job(c, &(struct chief_event){.kind = CHIEF_EV_DIVERGED, .where = d.task, .why = d.what,
                                                  .step = d.step});
        return fail;
}

/* Scheduled checkpoints (save_checkpoint_steps, save_checkpoint_secs) and evaluations
 * (eval_every_steps; none when the cluster has an evaluator, which evaluates each checkpoint), from one
 * pull when both are due. A failure is logged and retried later. */
static void maybe_snapshot(struct chief *c) {
        const struct supervisor_config *sv = &c->cfg->supervisor;
        uint64_t t = mono_us();
        if (t < c->next_snapshot_try)
                return;
        pthread_mutex_lock(&c->st.lock);
        uint64_t gs = c->st.global_step;
        pthread_mutex_unlock(&c->st.lock);
        bool by_steps = sv->save_checkpoint_steps && gs >= c->sv.last_save_step + sv->save_checkpoint_steps;
        bool by_secs = sv->save_checkpoint_secs && t - c->sv.last_save_mono >= sv->save_checkpoint_secs * 1000000ULL;
        bool eval = sv->eval_every_steps && !c->cfg->cluster.n_evaluator &&
                    gs >= c->ev.last_eval_step + sv->eval_every_steps;
        if (!by_steps && !by_secs && !eval)
                return;
        char err[1024];
        int r = chief_pull(&c->sv, by_steps || by_secs, &gs, err, sizeof(err));
        if (r >= 0 && eval)
                r = chief_evaluate(&c->ev, gs, err, sizeof(err));
        if (r >= 0 && (by_steps || by_secs))
                r = chief_save(&c->sv, gs, true, by_steps ? "steps" : "secs", NULL, NULL, err, sizeof(err));
        if (r < 0) {
                log_warning("Scheduled %s at global_step %" PRIu64 " failed: %s; retrying in %llu s",
                            by_steps || by_secs ? "checkpoint" : "evaluation", gs, err, SNAPSHOT_RETRY_US / 1000000);
                c->next_snapshot_try = t + SNAPSHOT_RETRY_US;
        }
}

/* SaveCheckpoint calls that wait: one checkpoint now answers them all. */
static void serve_saves(struct chief *c) {
        if (!chief_saves_pending(&c->st))
                return;
        struct chief_db_checkpoint row;
        bool existing = false;
        char err[1024];
        uint64_t gs = 0;
        int r = chief_pull(&c->sv, true, &gs, err, sizeof(err));
        if (r >= 0)
                r = chief_save(&c->sv, gs, true, "request", &row, &existing, err, sizeof(err));
        if (r < 0)
                log_warning("Requested checkpoint failed: %s", err);
        chief_answer_saves(&c->st, r, &row, existing, err);
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

/* The lost shards (every shard with recovery job, or every restored one when the whole job started
 * again) went back to the checkpoint of restored_step while the job was at job_step: one row and one
 * journal line per lost shard, none when nothing was lost. */
static void record_losses(struct chief *c, const bool *gone, uint64_t job_step, bool every) {
        bool only = c->cfg->supervisor.recovery == RECOVERY_SHARD && !every;
        pthread_mutex_lock(&c->st.lock);
        uint64_t S = c->st.restored_step;
        pthread_mutex_unlock(&c->st.lock);
        for (uint32_t s = 0; s < c->cfg->cluster.n_ps; s++) {
                if (!gone[s] || (every && job_step <= S))
                        continue;
                struct chief_db_loss l = {.time_us = now_us(), .shard = s, .restored_step = S, .job_step = job_step,
                                          .steps_lost = job_step > S ? job_step - S : 0};
                chief_add_loss(&c->st, &l);
                if (only)
                        log_full(LOG_WARNING, 0, job_step,
                                 "ps:%u lost its variables: it alone restored from the checkpoint of global_step %" PRIu64
                                 "; %" PRIu64 " steps of its updates lost, its values now older than the other "
                                 "shards' (the job stays at global_step %" PRIu64 ")",
                                 s, S, l.steps_lost, job_step);
                else
                        log_full(LOG_WARNING, 0, S,
                                 "ps:%u lost its variables: every shard restored from the checkpoint of global_step %" PRIu64
                                 "; %" PRIu64 " steps of updates lost (the job was at global_step %" PRIu64 ")",
                                 s, S, l.steps_lost, job_step);
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
        uint32_t n_ok = chief_probe_shards(&c->st, c->pc, &n_init, why, sizeof(why));
        int r = 0;
        bool restored = false, restore_failed = false;
        bool force = c->force_restore;
        if (n_ok == cfg->cluster.n_ps && (n_init < n_ok || force)) {
                /* Every shard when none is initialized, or after Restart; after a chiefd restart, only
                 * those that lost their variables meanwhile. */
                bool *which = calloc(cfg->cluster.n_ps, sizeof(bool));
                if (!which)
                        return log_error_errno(-ENOMEM, "Out of memory");
                pthread_mutex_lock(&c->st.lock);
                for (uint32_t s = 0; s < cfg->cluster.n_ps; s++)
                        which[s] = force || n_init == 0 || !c->st.ps[s].initialized;
                pthread_mutex_unlock(&c->st.lock);
                r = chief_restore_shards(&c->sv, which, why, sizeof(why));
                if (r > 0 && !force && c->prev_run_step) {
                        /* the job went further before this chiefd started (a whole-job restart: a
                         * requeue, a power cut): the steps past the checkpoint are done again */
                        record_losses(c, which, c->prev_run_step, true);
                        c->prev_run_step = 0;
                }
                free(which);
                if (r == -EINVAL)
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_MISMATCH, .why = why});
                if (r > 0) {
                        chief_event(&c->st, &(struct chief_event){.kind = CHIEF_EV_RESTORE_DONE});
                        c->force_restore = false;
                }
                restored = r > 0;
                restore_failed = r < 0;
        }
        if (n_ok == cfg->cluster.n_ps && (n_init < n_ok || force) && r == 0) {
                if (n_init > 0)
                        log_warning("%u of %u shards are initialized and the others not; without a checkpoint "
                                    "to restore from, initializing all of them",
                                    n_init, n_ok);
                log_info("No checkpoint to restore from in %s: initializing the variables", chief_ckpt_dir(c->ckpts));
                chief_event(&c->st, &(struct chief_event){.kind = CHIEF_EV_RESTORE_NONE, .why = why});
                r = model_init_params(c->model, cfg->model.seed);
                if (r >= 0)   /* tables emptied (a shard may hold rows of an earlier run), then the variables */
                        r = chief_import_tables(&c->sv, NULL, NULL, 0, err, sizeof(err));
                if (r >= 0)
                        r = ps_client_assign(c->pc, NULL, model_params(c->model), NULL, 0, err, sizeof(err));
                if (r < 0) {
                        chief_strfmt(why, sizeof(why), "assigning the variables: %s", err);
                } else {
                        log_info("Initialized %u ps shard%s with %zu parameters (seed %" PRIu64 ")",
                                 cfg->cluster.n_ps, cfg->cluster.n_ps == 1 ? "" : "s",
                                 model_n_params(c->model), cfg->model.seed);
                        pthread_mutex_lock(&c->st.lock);
                        c->st.global_step = 0;
                        chief_forget_report_steps_locked(&c->st);
                        pthread_mutex_unlock(&c->st.lock);
                        c->force_restore = false;
                        chief_session_log(&c->ev, 0, SUMMARY_SESSION_START, NULL, "initialized");
                }
        }
        const char *peer = "ps";
        char ps_peer[32];
        for (uint32_t s = 0; s < cfg->cluster.n_ps && n_ok < cfg->cluster.n_ps; s++) {
                pthread_mutex_lock(&c->st.lock);
                bool up = c->st.ps[s].reachable;
                pthread_mutex_unlock(&c->st.lock);
                if (!up) {
                        chief_strfmt(ps_peer, sizeof(ps_peer), "ps:%u", s);
                        peer = ps_peer;
                        break;
                }
        }
        if (n_ok == cfg->cluster.n_ps && r >= 0 && !c->st.have_ckpt) {
                /* Every loss of a shard must be recoverable: with no checkpoint yet, the values the
                 * shards hold now (the initial ones, usually) become one before any worker starts. */
                uint64_t gs = 0;
                r = chief_pull(&c->sv, true, &gs, err, sizeof(err));
                if (r >= 0)
                        r = chief_save(&c->sv, gs, true, "init", NULL, NULL, err, sizeof(err));
                if (r < 0) {
                        chief_strfmt(why, sizeof(why), "saving the checkpoint of global_step %" PRIu64 ": %s", gs, err);
                        peer = "checkpoint";
                }
        }
        if (n_ok < cfg->cluster.n_ps || r < 0) {
                pthread_mutex_lock(&c->st.lock);
                chief_wait_set_locked(&c->st, peer, now_us() - (t - lp->init_start), cfg->supervisor.ready_timeout_secs, why);
                pthread_mutex_unlock(&c->st.lock);
                if (t - lp->init_start > timeout_us && n_ok < cfg->cluster.n_ps)
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_WAIT_TIMEOUT, .where = peer, .why = why,
                                                                 .timeout_s = cfg->supervisor.ready_timeout_secs});
                if (t - lp->init_start > timeout_us)
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_READY_TIMEOUT, .why = why,
                                                                 .timeout_s = cfg->supervisor.ready_timeout_secs});
                chief_event(&c->st, &(struct chief_event){.kind = restore_failed ? CHIEF_EV_RESTORE_FAILED
                                                                            : CHIEF_EV_SHARDS_WAITING,
                                                     .why = why});
                notify_status("initializing: waiting for %s", why);
                log_wait(lp, "Waiting", why);
                lp->next = t + backoff_next(&lp->backoff);
                return 0;
        }

        if (n_init < cfg->cluster.n_ps || restored) {
                /* The shards were assigned in this pass: the status shows them as they are now. */
                uint32_t n_now;
                char e[512];
                chief_probe_shards(&c->st, c->pc, &n_now, e, sizeof(e));
        }
        pthread_mutex_lock(&c->st.lock);
        if (!restored && n_init == cfg->cluster.n_ps && c->st.ps[0].global_step > c->st.global_step)
                c->st.global_step = c->st.ps[0].global_step;
        uint64_t gs = c->st.global_step;
        c->st.wait.on = false;
        chief_event_locked(&c->st, &(struct chief_event){.kind = CHIEF_EV_SHARDS_READY});
        c->st.ready_mono = mono_us();
        c->st.ready_step = gs;
        lp->last_progress_log = c->st.ready_mono;
        chief_add_sample_locked(&c->st, c->st.ready_mono, gs);
        pthread_mutex_unlock(&c->st.lock);
        c->sv.last_save_step = gs;
        c->sv.last_save_mono = c->ev.last_summary_mono = mono_us();
        c->ev.last_eval_step = gs;
        if (n_init == cfg->cluster.n_ps && !restored) {
                log_info("Every ps shard is already initialized: carrying on at global_step %" PRIu64, gs);
                chief_session_log(&c->ev, gs, SUMMARY_SESSION_START, NULL, "chiefd restarted");
        }
        log_info("Job ready at global_step %" PRIu64 " of %" PRIu64, gs, cfg->training.max_steps);
        if (cfg->cluster.n_evaluator && cfg->supervisor.eval_every_steps && !lp->said_evaluator) {
                log_info("The cluster has an evaluator (%s): it evaluates each checkpoint, the chief only the "
                         "end (no evaluation every %" PRIu64 " steps)", cfg->cluster.evaluator[0].addr,
                         cfg->supervisor.eval_every_steps);
                lp->said_evaluator = true;
        }
        notify_status("ready: global_step %" PRIu64 "/%" PRIu64 ", waiting for workers", gs, cfg->training.max_steps);
        chief_save_job(&c->st);
        lp->next = mono_us();
        return 0;
}

static void notify_progress(struct chief *c, struct loop *lp) {
        uint64_t t = mono_us();
        if (t - lp->last_notify < NOTIFY_EVERY_US)
                return;
        lp->last_notify = t;
        pthread_mutex_lock(&c->st.lock);
        uint64_t gs = c->st.global_step;
        double eps = chief_steps_per_s_locked(&c->st) * (double)config_examples_per_step(c->cfg);
        float loss = chief_loss_locked(&c->st);
        pthread_mutex_unlock(&c->st.lock);
        notify_status("step %" PRIu64 "/%" PRIu64 ", loss %.3g, %.0f ex/s", gs, c->cfg->training.max_steps,
                      (double)loss, eps);
        if (t - lp->last_progress_log >= 60 * 1000000ULL) {
                lp->last_progress_log = t;
                log_full(LOG_INFO, 0, gs, "step %" PRIu64 "/%" PRIu64 ", loss %.3g, %.0f examples/s", gs,
                         c->cfg->training.max_steps, (double)loss, eps);
        }
}

/* No worker live: the job waits for one, up to the deadline; past it the job fails with the workers'
 * last states. Returns -ETIMEDOUT when it failed. */
static int check_workers(struct chief *c) {
        const struct job_config *cfg = c->cfg;
        uint64_t now = now_us(), since = 0;
        char why[CHIEF_REASON_MAX] = "";
        pthread_mutex_lock(&c->st.lock);
        uint32_t n_live = 0;
        for (uint32_t w = 0; w < cfg->cluster.n_worker; w++) {
                const struct worker_info *wi = &c->st.workers[w];
                n_live += chief_worker_live_locked(&c->st, w, now);
                if (wi->last_report_us > since)
                        since = wi->last_report_us + cfg->supervisor.worker_timeout_secs * 1000000ULL;
                chief_strfmt(why + strlen(why), sizeof(why) - strlen(why), "%sworker:%u %s", w ? "; " : "", w,
                             wi->state[0] ? wi->state : "not joined");
        }
        uint64_t ready_us = now - (mono_us() - c->st.ready_mono);
        if (since < ready_us)
                since = ready_us;
        if (n_live || since > now) {
                c->st.wait.on = false;
                pthread_mutex_unlock(&c->st.lock);
                return 0;
        }
        chief_wait_set_locked(&c->st, "workers", since, cfg->supervisor.ready_timeout_secs, why);
        bool past = now > c->st.wait.deadline_us;
        pthread_mutex_unlock(&c->st.lock);
        if (!past)
                return 0;
        fail_job(c, &(struct chief_event){.kind = CHIEF_EV_WAIT_TIMEOUT, .where = "every worker", .why = why,
                                          .timeout_s = cfg->supervisor.ready_timeout_secs});
        return -ETIMEDOUT;
}

/* READY and TRAINING: follow global_step on shard 0, watch the shards, notice the end. */
static int phase_poll(struct chief *c, struct loop *lp) {
        const struct job_config *cfg = c->cfg;
        uint64_t timeout_us = cfg->supervisor.ready_timeout_secs * 1000000ULL;
        char why[512];
        uint32_t n_init;
        chief_probe_shards(&c->st, c->pc, &n_init, why, sizeof(why));
        uint64_t t = mono_us();

        bool *which = calloc(cfg->cluster.n_ps, sizeof(bool)), *gone = calloc(cfg->cluster.n_ps, sizeof(bool));
        bool lost = false, waiting = false;
        if (!which || !gone) {
                free(which);
                free(gone);
                return log_error_errno(-ENOMEM, "Out of memory");
        }
        pthread_mutex_lock(&c->st.lock);
        for (uint32_t s = 0; s < cfg->cluster.n_ps; s++) {
                const struct ps_info *pi = &c->st.ps[s];
                if (!pi->reachable && !waiting) {
                        char peer[32];
                        chief_strfmt(peer, sizeof(peer), "ps:%u", s);
                        chief_wait_set_locked(&c->st, peer, now_us() - (t - pi->lost_since_mono),
                                              cfg->supervisor.ready_timeout_secs, pi->state);
                        waiting = true;
                }
                if (!pi->reachable && t - pi->lost_since_mono > timeout_us) {
                        char st[sizeof(pi->state)];
                        chief_strfmt(st, sizeof(st), "%s", pi->state);
                        pthread_mutex_unlock(&c->st.lock);
                        free(which);
                        free(gone);
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_SHARD_LOST, .shard = s,
                                                                 .where = cfg->cluster.ps[s].addr, .why = st,
                                                                 .timeout_s = cfg->supervisor.ready_timeout_secs});
                }
                gone[s] = pi->reachable && !pi->initialized;
                lost |= gone[s];
        }
        if (!waiting)
                c->st.wait.on = false;
        uint64_t job_step = c->st.global_step;
        /* a lost shard 0 took global_step with it: the job's step is the highest the chief saw, from
         * its polls or the workers' reports since the last restore */
        for (uint32_t w = 0; w < cfg->cluster.n_worker; w++)
                if (c->st.workers[w].step_known && c->st.workers[w].global_step > job_step)
                        job_step = c->st.workers[w].global_step;
        bool only = cfg->supervisor.recovery == RECOVERY_SHARD;
        pthread_mutex_unlock(&c->st.lock);
        if (lost) {
                /* A psd restarted (new incarnation, uninitialized). Every shard goes back to the newest
                 * checkpoint, not only the lost one, as TensorFlow's Supervisor restores the whole model:
                 * the parameters then hold one step, and global_step says which. Pushes fail meanwhile,
                 * so the workers drain, wait and pull again. With recovery shard, only the lost shards go
                 * back, and global_step stays. */
                for (uint32_t s = 0; s < cfg->cluster.n_ps; s++)
                        which[s] = only ? gone[s] : true;
                if (!lp->restore_since) {
                        lp->restore_since = t;
                        for (uint32_t s = 0; s < cfg->cluster.n_ps; s++)
                                if (gone[s])
                                        log_warning("ps:%u (%s) restarted (incarnation %" PRIu64 ") without its variables: "
                                                    "restoring %s from the newest checkpoint while the workers wait",
                                                    s, cfg->cluster.ps[s].addr, c->st.ps[s].incarnation,
                                                    only ? "it alone" : "every shard");
                }
                int r = only ? chief_restore_shards_at(&c->sv, which, job_step, why, sizeof(why))
                             : chief_restore_shards(&c->sv, which, why, sizeof(why));
                free(which);
                if (r > 0)
                        record_losses(c, gone, job_step, false);
                free(gone);
                if (r == -EINVAL)
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_MISMATCH, .why = why});
                if (r == 0)
                        return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_NONE, .why = why});
                if (r < 0) {
                        pthread_mutex_lock(&c->st.lock);
                        chief_wait_set_locked(&c->st, "ps", now_us() - (t - lp->restore_since),
                                              cfg->supervisor.ready_timeout_secs, why);
                        pthread_mutex_unlock(&c->st.lock);
                        if (t - lp->restore_since > timeout_us)
                                return fail_job(c, &(struct chief_event){.kind = CHIEF_EV_RESTORE_TIMEOUT, .why = why,
                                                                         .timeout_s = cfg->supervisor.ready_timeout_secs});
                        chief_event(&c->st, &(struct chief_event){.kind = CHIEF_EV_RESTORE_FAILED, .why = why});
                        log_wait(lp, "Restore failed, retrying", why);
                        lp->next = t + BACKOFF_MAX_US;
                        return 0;
                }
                lp->restore_since = 0;
                chief_wait_clear(&c->st);
                chief_event(&c->st, &(struct chief_event){.kind = CHIEF_EV_RESTORE_DONE});
                lp->next = mono_us() + POLL_US;
                return 0;
        }
        free(which);
        free(gone);
        if (!waiting && check_workers(c) < 0)
                return 0;
        pthread_mutex_lock(&c->st.lock);
        if (c->st.ps[0].reachable) {
                /* Shard 0 holds global_step: a worker's report from before a restore may not raise it. */
                c->st.global_step = c->st.ps[0].global_step;
                chief_note_progress_locked(&c->st, t);
                chief_add_sample_locked(&c->st, t, c->st.global_step);
        }
        chief_event_locked(&c->st, &(struct chief_event){.kind = CHIEF_EV_POLLED, .why = why,
                                                    .advanced = c->st.global_step > c->st.ready_step,
                                                    .reachable = c->st.ps[0].reachable});
        bool max = c->st.global_step >= cfg->training.max_steps, end = max || c->st.stop_requested;
        uint64_t gs = c->st.global_step;
        if (end) {
                chief_mark_end_locked(&c->st);
                chief_event_locked(&c->st, &(struct chief_event){.kind = max ? CHIEF_EV_MAX_STEPS : CHIEF_EV_STOP_ASKED});
        }
        pthread_mutex_unlock(&c->st.lock);

        if (end) {
                log_info("%s at global_step %" PRIu64 ": %s",
                         max ? "Reached max_steps" : "Stop requested", gs,
                         max ? "waiting for the workers to finish" : "telling the workers to stop");
                notify_status("stopping at step %" PRIu64 "/%" PRIu64, gs, cfg->training.max_steps);
                lp->stop_begin = t;
                chief_wait_clear(&c->st);
                chief_save_job(&c->st);
                if (!max)
                        chief_stop_workers(c->cfg, c->worker_ch);
        } else {
                notify_progress(c, lp);
                maybe_snapshot(c);
                chief_maybe_write_summaries(&c->ev);
        }
        lp->next = t + next_poll_us(c);
        return 0;
}

/* An orderly stop: one pull with the optimizer's slots, the final checkpoint, STOPPED, the shards
 * told. A start afterwards resumes from that checkpoint with nothing lost. */
static int finish_stopped(struct chief *c) {
        char err[1024], why[1200] = "";
        uint64_t gs = 0;
        chief_event(&c->st, &(struct chief_event){.kind = CHIEF_EV_SAVING_FINAL});
        struct chief_db_checkpoint row;
        int r = chief_pull(&c->sv, true, &gs, err, sizeof(err));
        if (r >= 0)
                r = chief_save(&c->sv, gs, true, "stop", &row, NULL, err, sizeof(err));
        chief_answer_saves(&c->st, r, &row, false, err);
        pthread_mutex_lock(&c->st.lock);
        uint64_t resume = c->st.have_ckpt ? c->st.last_ckpt.global_step : 0;
        pthread_mutex_unlock(&c->st.lock);
        if (r < 0) {
                /* Nothing else can be done in the stop's time; say what a start will find. */
                chief_strfmt(why, sizeof(why), "the final checkpoint failed (%s): a start resumes from global_step %" PRIu64,
                             err, resume);
                log_error("Cannot save the final checkpoint: %s", err);
        }
        pthread_mutex_lock(&c->st.lock);
        chief_event_locked(&c->st, &(struct chief_event){.kind = CHIEF_EV_STOPPED, .step = r >= 0 ? gs : resume, .why = why});
        pthread_mutex_unlock(&c->st.lock);
        chief_session_log(&c->ev, gs, SUMMARY_SESSION_STOP, r >= 0 ? row.path : NULL, "stopped");
        log_full(LOG_INFO, 0, gs, "Stopped at global_step %" PRIu64 "%s%s", r >= 0 ? gs : resume,
                 why[0] ? ": " : " after its final checkpoint", why);
        notify_status("stopped: step %" PRIu64, r >= 0 ? gs : resume);
        r = ps_client_stop(c->pc, "job stopped");
        if (r < 0)
                log_info_errno(r, "Could not tell every ps shard to stop (they may have stopped already)");
        return 0;
}

/* The end: one pull with the optimizer's slots, the final evaluation, the final checkpoint. */
static int finish(struct chief *c) {
        const struct job_config *cfg = c->cfg;
        char err[1024];
        uint64_t gs = 0;

        chief_event(&c->st, &(struct chief_event){.kind = CHIEF_EV_EVALUATING});
        int r = chief_pull(&c->sv, true, &gs, err, sizeof(err));
        if (r < 0)
                return fail_jobf(c, "pulling the final parameters: %s", err);
        r = chief_evaluate(&c->ev, gs, err, sizeof(err));
        if (r < 0 && fail_if_diverged(c))
                return 0;
        if (r < 0)
                return fail_jobf(c, "%s", err);
        chief_event(&c->st, &(struct chief_event){.kind = CHIEF_EV_SAVING_FINAL});
        struct chief_db_checkpoint row;
        r = chief_save(&c->sv, gs, true, "end", &row, NULL, err, sizeof(err));
        if (r < 0)
                /* The training is done and evaluated; a checkpoint that cannot be written does not undo that. */
                log_error("Cannot save the final checkpoint: %s", err);
        chief_answer_saves(&c->st, r, &row, false, err);

        pthread_mutex_lock(&c->st.lock);
        c->st.test_accuracy = c->st.eval_accuracy;
        c->st.test_auc = c->cfg->model.head == HEAD_LOGISTIC && c->cfg->data.format != DATA_IDX ? (float)c->st.eval_auc : -1;
        c->st.test_rmse = c->cfg->model.head == HEAD_MSE && c->cfg->data.format != DATA_IDX ? (float)c->st.eval_rmse : -1;
        c->st.test_loss = c->st.eval_loss;
        float acc = c->st.eval_accuracy, loss = c->st.eval_loss;
        chief_event_locked(&c->st, &(struct chief_event){.kind = CHIEF_EV_FINISHED});
        float wall = c->st.wall_s;
        double eps = chief_steps_per_s_locked(&c->st) * (double)config_examples_per_step(cfg);
        pthread_mutex_unlock(&c->st.lock);
        chief_save_job(&c->st);
        /* the curves end at the last step: a session shorter than save_summaries_secs has points too */
        chief_write_summaries(&c->ev);
        chief_session_log(&c->ev, gs, SUMMARY_SESSION_STOP, r >= 0 ? row.path : NULL, "done");
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

/* STOPPING: wait (bounded) until every worker is done or gone, then evaluate (at max_steps) or save
 * (after a stop). */
static int phase_stopping(struct chief *c, struct loop *lp) {
        int64_t first_busy;
        uint32_t busy = chief_probe_workers(&c->st, c->worker_ch, &first_busy);
        uint64_t t = mono_us();
        pthread_mutex_lock(&c->st.lock);
        bool max = c->st.global_step >= c->cfg->training.max_steps, stop = c->st.stop_requested;
        pthread_mutex_unlock(&c->st.lock);
        if (busy && t - lp->stop_begin < (stop ? STOP_FAST_US : STOP_WAIT_US)) {
                lp->next = t + POLL_US;
                return 0;
        }
        if (busy) {
                log_warning("worker:%" PRIi64 " (and %u more) still training %llu s after the end; "
                            "telling them to stop and evaluating anyway",
                            first_busy, busy - 1, (stop ? STOP_FAST_US : STOP_WAIT_US) / 1000000);
                chief_stop_workers(c->cfg, c->worker_ch);
        }
        lp->next = 0;
        return max ? finish(c) : finish_stopped(c);
}

/* Restart: the ended job trains again, from its newest valid checkpoint (or the initial values). */
static void restart(struct chief *c, struct loop *lp) {
        pthread_mutex_lock(&c->st.lock);
        char why[sizeof(c->st.restart_reason)];
        chief_strfmt(why, sizeof(why), "%s", c->st.restart_reason);
        c->st.restart_requested = false;
        c->st.stop_requested = false;
        c->st.end_mono = c->st.ready_mono = c->st.first_mono = 0;
        c->st.wall_s = 0;
        c->st.test_accuracy = c->st.test_loss = -1;
        c->st.n_samples = c->st.sample_next = 0;
        for (uint32_t w = 0; w < c->cfg->cluster.n_worker; w++)
                c->st.workers[w].finished = false;
        chief_event_locked(&c->st, &(struct chief_event){.kind = CHIEF_EV_RESTART, .why = why});
        pthread_mutex_unlock(&c->st.lock);
        c->force_restore = true;
        struct backoff b = lp->backoff;
        *lp = (struct loop){.backoff = b};
        backoff_reset(&lp->backoff);
        char wb[LOG_PEER_BUF];   /* why holds the caller's reason */
        log_notice("Restart requested%s%s: training the job again from its newest checkpoint", why[0] ? ": " : "",
                   why[0] ? log_peer_str(why, wb, sizeof(wb)) : "");
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
                        const char *name = read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)
                                                   ? strsignal((int)si.ssi_signo) : "a signal";
                        pthread_mutex_lock(&c->st.lock);
                        /* While the job can train, a signal asks for the orderly stop; a second one, or
                         * one at any other time, ends chiefd now. */
                        bool orderly = !lp.signalled && c->st.js.ready_once && !chief_state_ended(&c->st.js);
                        c->st.stop_requested = true;
                        pthread_mutex_unlock(&c->st.lock);
                        if (!orderly) {
                                log_info("Received %s, stopping", name);
                                return 0;
                        }
                        log_info("Received %s: stopping the job in order (the workers, a final checkpoint, the "
                                 "shards); another signal ends chiefd at once", name);
                        lp.signalled = true;
                        lp.next = 0;
                        continue;
                }
                bool woken = false;
                if (n > 0 && (fds[1].revents & POLLIN)) {
                        uint64_t v;
                        woken = read(c->wake_fd, &v, sizeof(v)) == (ssize_t)sizeof(v);
                }
                if (!woken && mono_us() < lp.next)
                        continue;

                fail_if_diverged(c);
                pthread_mutex_lock(&c->st.lock);
                enum chief_phase phase = chief_state_phase(&c->st.js, c->st.stop_requested);
                pthread_mutex_unlock(&c->st.lock);
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
                        pthread_mutex_lock(&c->st.lock);
                        bool again = c->st.restart_requested;
                        pthread_mutex_unlock(&c->st.lock);
                        if (again)
                                restart(c, &lp);
                        if (!again && c->exit_at_end) {
                                pthread_mutex_lock(&c->st.lock);
                                const char *st = job_state_name(c->st.js.state);
                                pthread_mutex_unlock(&c->st.lock);
                                log_info("The job has ended (%s): exiting (--exit-at-end)", st);
                                return 0;
                        }
                        lp.next = again ? 0 : UINT64_MAX;
                        break;
                case CHIEF_PHASE_EXIT:
                        return 0;
                }
                if (r < 0)
                        return r;
                pthread_mutex_lock(&c->st.lock);
                Psfleet__V1__JobState st = c->st.js.state;
                chief_metrics_tick(st, c->st.global_step, chief_steps_per_s_locked(&c->st),
                                   chief_n_live_locked(&c->st, now_us()));
                pthread_mutex_unlock(&c->st.lock);
                if (st == PSFLEET__V1__JOB_STATE__JOB_STATE_READY || st == PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING ||
                    st == PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING)
                        serve_saves(c);
                /* A Stop that arrived after the end: the loop returns on the next pass. */
                pthread_mutex_lock(&c->st.lock);
                if (c->st.stop_requested && chief_state_ended(&c->st.js))
                        lp.next = 0;
                pthread_mutex_unlock(&c->st.lock);
        }
}
