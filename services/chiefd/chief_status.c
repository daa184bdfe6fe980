/* chiefd's figures derived under its lock (rates, loss, the end), the one place where the job's
 * state changes, and the JobStatus message that GetStatus and Watch send. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "chief_status.h"

#include "chief_metrics.h"
#include "config.h"
#include "log.h"
#include "rpc.h"
#include "util.h"
#include "wire.h"

void chief_strfmt(char *buf, size_t len, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, len, fmt, ap);
        va_end(ap);
}

void chief_status_init(struct chief_status *s) {
        pthread_mutex_init(&s->lock, NULL);
        pthread_cond_init(&s->changed, NULL);
        chief_state_init(&s->js);
        s->state_since_us = s->started_us = now_us();
        s->test_accuracy = s->test_loss = -1;
        s->test_auc = s->test_rmse = -1;
}

void chief_status_done(struct chief_status *s) {
        if (!s)
                return;
        free(s->save_calls);
        free(s->workers);
        free(s->ps);
        free(s->losses);
        pthread_cond_destroy(&s->changed);
        pthread_mutex_destroy(&s->lock);
}

Psfleet__V1__JobState chief_event_locked(struct chief_status *s, const struct chief_event *ev) {
        if (chief_state_next(&s->js, ev, &s->js)) {
                s->state_since_us = now_us();
                chief_metrics_state(s->js.state);
                if (chief_state_ended(&s->js))
                        s->wait.on = false;
                /* Every change is durable before anyone can act on it: a chief started after a crash
                 * finds the state, and the reason, that the clients were last told. */
                chief_save_job_locked(s);
                pthread_cond_signal(&s->changed);   /* watchers hear of it now, not at the next tick */
        }
        return s->js.state;
}

void chief_wait_set_locked(struct chief_status *s, const char *peer, uint64_t since_us, uint64_t timeout_s,
                           const char *last_error) {
        struct chief_wait *w = &s->wait;
        w->on = true;
        chief_strfmt(w->peer, sizeof(w->peer), "%s", peer);
        w->since_us = since_us;
        w->deadline_us = since_us + timeout_s * 1000000ULL;
        chief_strfmt(w->last_error, sizeof(w->last_error), "%s", last_error ? last_error : "");
}

void chief_wait_clear(struct chief_status *s) {
        pthread_mutex_lock(&s->lock);
        s->wait.on = false;
        pthread_mutex_unlock(&s->lock);
}

void chief_add_loss(struct chief_status *s, const struct chief_db_loss *l) {
        int r = chief_db_add_loss(s->db, l);
        if (r < 0)
                log_warning_errno(r, "Cannot record the loss of ps:%u in the database, continuing", l->shard);
        pthread_mutex_lock(&s->lock);
        struct chief_db_loss *a = realloc(s->losses, (s->n_losses + 1) * sizeof(*a));
        if (a) {
                a[s->n_losses++] = *l;
                s->losses = a;
        }
        s->steps_lost += l->steps_lost;
        pthread_cond_signal(&s->changed);
        pthread_mutex_unlock(&s->lock);
}

bool chief_worker_live_locked(const struct chief_status *s, uint32_t w, uint64_t now) {
        const struct worker_info *wi = &s->workers[w];
        return wi->reported && wi->last_report_us && !wi->finished &&
               now - wi->last_report_us <= s->cfg->supervisor.worker_timeout_secs * 1000000ULL;
}

uint32_t chief_n_live_locked(const struct chief_status *s, uint64_t now) {
        uint32_t live = 0;
        for (uint32_t w = 0; w < s->cfg->cluster.n_worker; w++)
                live += chief_worker_live_locked(s, w, now);
        return live;
}

Psfleet__V1__JobState chief_event(struct chief_status *s, const struct chief_event *ev) {
        pthread_mutex_lock(&s->lock);
        Psfleet__V1__JobState st = chief_event_locked(s, ev);
        pthread_mutex_unlock(&s->lock);
        return st;
}

void chief_add_sample_locked(struct chief_status *s, uint64_t t, uint64_t step) {
        s->samples[s->sample_next] = (struct sample){t, step};
        s->sample_next = (s->sample_next + 1) % N_SAMPLES;
        if (s->n_samples < N_SAMPLES)
                s->n_samples++;
}

/* global_step per second over the last RATE_WINDOW_US; after the end, over the whole training. */
double chief_steps_per_s_locked(const struct chief_status *s) {
        /* After the end: the rate while training, from the first step seen to the end, so that the
         * workers' start-up (loading data) does not count against throughput; wall_s does include it. */
        if (s->end_mono && s->first_mono && s->end_mono > s->first_mono && s->end_step > s->first_step)
                return (double)(s->end_step - s->first_step) * 1e6 / (double)(s->end_mono - s->first_mono);
        /* (a job that ended before the chief first saw it move: from READY, start-up included) */
        if (s->end_mono && s->wall_s > 0)
                return (double)(s->end_step - s->ready_step) / s->wall_s;
        if (s->n_samples < 2)
                return 0;
        const struct sample *newest = &s->samples[(s->sample_next + N_SAMPLES - 1) % N_SAMPLES];
        const struct sample *oldest = NULL;
        for (unsigned i = 0; i < s->n_samples; i++) {
                const struct sample *x = &s->samples[(s->sample_next + N_SAMPLES - s->n_samples + i) % N_SAMPLES];
                if (newest->t_mono - x->t_mono <= RATE_WINDOW_US) {
                        oldest = x;
                        break;
                }
        }
        if (!oldest || oldest == newest || newest->t_mono <= oldest->t_mono)
                return 0;
        return (double)(newest->step - oldest->step) * 1e6 / (double)(newest->t_mono - oldest->t_mono);
}

/* Mean of every worker's latest reported loss; NAN before any report. */
float chief_loss_locked(const struct chief_status *s) {
        double sum = 0;
        unsigned n = 0;
        /* a worker's non-finite loss makes the mean one: a diverged model is never averaged away */
        for (uint32_t w = 0; w < s->cfg->cluster.n_worker; w++)
                if (s->workers[w].reported) {
                        sum += s->workers[w].loss;
                        n++;
                }
        return n ? (float)(sum / n) : NAN;
}

int chief_report_admit_locked(struct chief_status *s, uint32_t w, uint64_t global_step, float loss, const char *state,
                              char *why, size_t len) {
        const struct worker_info *wi = &s->workers[w];
        char task[32], what[sizeof(s->diverged.what)];
        chief_strfmt(task, sizeof(task), "worker:%u", w);
        struct chief_report r = {.task = task, .global_step = global_step, .loss = loss, .state = state,
                                 .have_last = wi->step_known, .last_step = wi->global_step,
                                 .known_step = s->global_step, .max_steps = s->cfg->training.max_steps,
                                 .n_workers = s->cfg->cluster.n_worker};
        if (!chief_state_report_ok(&r, why, len))
                return -EINVAL;
        if (!chief_state_report_diverged(&r, what, sizeof(what)))
                return 0;
        chief_note_diverged_locked(s, task, what, global_step);
        return 1;
}

void chief_note_diverged_locked(struct chief_status *s, const char *task, const char *what, uint64_t step) {
        if (s->diverged.on)
                return;
        s->diverged.on = true;
        chief_strfmt(s->diverged.task, sizeof(s->diverged.task), "%s", task);
        /* a worker's words, kept as the job's reason: escaped, so no control byte reaches a log or a status */
        log_peer_str_max(what, sizeof(s->diverged.what), s->diverged.what, sizeof(s->diverged.what));
        s->diverged.step = step;
}

void chief_forget_report_steps_locked(struct chief_status *s) {
        for (uint32_t w = 0; w < s->cfg->cluster.n_worker; w++)
                s->workers[w].step_known = false;
}

/* Call after raising global_step: remembers when it first moved after READY. */
void chief_note_progress_locked(struct chief_status *s, uint64_t t) {
        if (!s->first_mono && s->ready_mono && s->global_step > s->ready_step) {
                s->first_mono = t;
                s->first_step = s->global_step;
        }
}

/* Records that global_step reached max_steps, or that a stop was requested: the end of training. */
void chief_mark_end_locked(struct chief_status *s) {
        if (s->end_mono)
                return;
        s->end_mono = mono_us();
        s->end_step = s->global_step;
        s->wall_s = s->ready_mono ? (float)((double)(s->end_mono - s->ready_mono) / 1e6) : 0;
}

void chief_save_job_locked(struct chief_status *s) {
        struct chief_db_job j = {
                .fingerprint = s->fingerprint,
                .state = s->js.state,
                .global_step = s->global_step,
                .max_steps = s->cfg->training.max_steps,
                .started_us = s->started_us,
                .updated_us = now_us(),
                .test_accuracy = s->test_accuracy,
                .test_loss = s->test_loss,
                .test_auc = s->test_auc,
                .test_rmse = s->test_rmse,
                .wall_s = s->wall_s,
                .state_since_us = s->state_since_us,
        };
        chief_strfmt(j.reason, sizeof(j.reason), "%s", s->js.reason);
        int r = chief_db_save_job(s->db, &j);
        if (r < 0)
                log_warning_errno(r, "Cannot record the job's state in the database, continuing");
}

void chief_save_job(struct chief_status *s) {
        pthread_mutex_lock(&s->lock);
        chief_save_job_locked(s);
        pthread_mutex_unlock(&s->lock);
}

/* Refreshes the newest checkpoint and the count that the status shows. */
void chief_refresh_ckpt_info(struct chief_status *s) {
        struct chief_db_checkpoint row;
        uint32_t n = 0;
        int r = chief_ckpt_newest(s->ckpts, &row, &n);
        pthread_mutex_lock(&s->lock);
        s->have_ckpt = r >= 0;
        if (r >= 0) {
                s->last_ckpt = row;
                chief_metrics_checkpoint(0, 0, &row);
        }
        s->n_ckpts = n;
        pthread_mutex_unlock(&s->lock);
}

/* The job's status, packed (caller owns the buffer); NULL when out of memory. */
grpc_byte_buffer *chief_status_pack(struct chief_status *s) {
        const struct cluster *cl = &s->cfg->cluster;
        uint32_t n = cl->n_ps + cl->n_worker;
        Psfleet__V1__NodeStatus *nodes = calloc(n, sizeof(*nodes));
        Psfleet__V1__NodeStatus **np = calloc(n, sizeof(*np));
        char (*tasks)[32] = calloc(n, sizeof(*tasks));
        uint32_t *live = calloc(cl->n_worker, sizeof(*live)), *missing = calloc(cl->n_worker, sizeof(*missing));
        Psfleet__V1__ShardLoss *losses = NULL, **lp = NULL;
        grpc_byte_buffer *bb = NULL;
        if (!nodes || !np || !tasks || !live || !missing)
                goto out;
        Psfleet__V1__WaitingFor wf = PSFLEET__V1__WAITING_FOR__INIT;
        Psfleet__V1__JobStatus m = PSFLEET__V1__JOB_STATUS__INIT;
        Psfleet__V1__Checkpoint last = PSFLEET__V1__CHECKPOINT__INIT;
        m.job = s->cfg->name;
        m.max_steps = s->cfg->training.max_steps;
        m.fingerprint = s->fingerprint;
        m.checkpoint_dir = (char *)chief_ckpt_dir(s->ckpts);
        m.summary_dir = (char *)s->summary_dir;

        pthread_mutex_lock(&s->lock);
        m.state = s->js.state;
        m.reason = s->js.reason;
        m.global_step = s->global_step;
        double sps = chief_steps_per_s_locked(s);
        m.steps_per_s = (float)sps;
        m.examples_per_s = (float)(sps * (double)config_examples_per_step(s->cfg));
        if (s->js.state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE || s->end_mono)
                m.eta_s = 0;
        else if (sps > 0)
                m.eta_s = (float)((double)(m.max_steps > m.global_step ? m.max_steps - m.global_step : 0) / sps);
        else
                m.eta_s = -1;
        m.loss = chief_loss_locked(s);
        m.test_accuracy = s->test_accuracy;
        m.test_auc = s->test_auc;
        m.test_rmse = s->test_rmse;
        m.test_loss = s->test_loss;
        m.started_us = s->started_us;
        if (s->end_mono || chief_state_final(&s->js))   /* a sticky state keeps the recorded time */
                m.wall_s = s->wall_s;
        else if (s->ready_mono)
                m.wall_s = (float)((double)(mono_us() - s->ready_mono) / 1e6);
        if (s->have_ckpt) {
                chief_checkpoint_msg(&s->last_ckpt, &last);
                m.last_checkpoint = &last;
        }
        m.checkpoints = s->n_ckpts;
        m.eval_step = s->have_eval ? s->eval_step : 0;
        m.eval_accuracy = s->have_eval ? s->eval_accuracy : -1;
        m.eval_loss = s->have_eval ? s->eval_loss : -1;
        m.restored_step = s->restored_step;
        m.restored_from = s->restored_from;
        m.state_since_us = s->state_since_us;
        if (s->wait.on) {
                wf.peer = s->wait.peer;
                wf.since_us = s->wait.since_us;
                wf.deadline_us = s->wait.deadline_us;
                wf.last_error = s->wait.last_error;
                m.waiting_for = &wf;
        }
        if (s->n_losses) {
                losses = calloc(s->n_losses, sizeof(*losses));
                lp = calloc(s->n_losses, sizeof(*lp));
                if (!losses || !lp) {
                        pthread_mutex_unlock(&s->lock);
                        goto out;
                }
                for (size_t i = 0; i < s->n_losses; i++) {
                        const struct chief_db_loss *l = &s->losses[i];
                        psfleet__v1__shard_loss__init(&losses[i]);
                        losses[i].shard = l->shard;
                        losses[i].restored_step = l->restored_step;
                        losses[i].job_step = l->job_step;
                        losses[i].steps_lost = l->steps_lost;
                        losses[i].time_us = l->time_us;
                        lp[i] = &losses[i];
                }
                m.n_losses = s->n_losses;
                m.losses = lp;
        }
        m.steps_lost = s->steps_lost;
        m.last_checkpoint_error = s->last_ckpt_error;
        uint64_t now = now_us();
        for (uint32_t w = 0; w < cl->n_worker; w++)
                if (chief_worker_live_locked(s, w, now))
                        live[m.n_workers_live++] = w;
                else
                        missing[m.n_workers_missing++] = w;
        m.workers_live = live;
        m.workers_missing = missing;
        for (uint32_t i = 0; i < cl->n_ps; i++) {
                Psfleet__V1__NodeStatus *ns = &nodes[i];
                const struct ps_info *pi = &s->ps[i];
                psfleet__v1__node_status__init(ns);
                chief_strfmt(tasks[i], sizeof(tasks[i]), "ps:%u", i);
                ns->task = tasks[i];
                ns->address = cl->ps[i].addr;
                if (cl->n_ps_backup) {
                        ns->address = pi->primary ? cl->ps_backup[i].addr : cl->ps[i].addr;
                        ns->backup = pi->primary ? cl->ps[i].addr : cl->ps_backup[i].addr;
                        ns->epoch = pi->epoch;
                        ns->replicated = pi->replicated;
                        ns->replication_lag_us = pi->lag_us;
                        ns->failovers = pi->failovers;
                }
                ns->state = (char *)(pi->state[0] ? pi->state : "unknown");
                ns->local_step = pi->global_step;
                ns->last_report_us = pi->last_seen_us;
                np[i] = ns;
        }
        for (uint32_t w = 0; w < cl->n_worker; w++) {
                Psfleet__V1__NodeStatus *ns = &nodes[cl->n_ps + w];
                const struct worker_info *wi = &s->workers[w];
                psfleet__v1__node_status__init(ns);
                chief_strfmt(tasks[cl->n_ps + w], sizeof(tasks[0]), "worker:%u", w);
                ns->task = tasks[cl->n_ps + w];
                ns->address = cl->worker[w].addr;
                ns->state = (char *)(wi->state[0] ? wi->state : "not joined");
                ns->local_step = wi->local_step;
                ns->loss = wi->loss;
                ns->examples_per_s = wi->examples_per_s;
                ns->last_report_us = wi->last_report_us;
                ns->examples = wi->examples;
                ns->report_interval_us = wi->report_interval_us;
                np[cl->n_ps + w] = ns;
        }
        m.n_nodes = n;
        m.nodes = np;
        bb = wire_pack(&m.base);   /* packs at once: the strings may change after unlock */
        pthread_mutex_unlock(&s->lock);
out:
        free(nodes);
        free(np);
        free(tasks);
        free(live);
        free(missing);
        free(losses);
        free(lp);
        return bb;
}

int chief_saves_add_locked(struct chief_status *s, struct rpc_call *call) {
        struct rpc_call **a = realloc(s->save_calls, (s->n_save_calls + 1) * sizeof(*a));
        if (!a)
                return -ENOMEM;
        a[s->n_save_calls++] = call;
        s->save_calls = a;
        return 0;
}

void chief_answer_saves(struct chief_status *s, int r, const struct chief_db_checkpoint *row, bool existing, const char *err) {
        pthread_mutex_lock(&s->lock);
        struct rpc_call **calls = s->save_calls;
        size_t n = s->n_save_calls;
        s->save_calls = NULL;
        s->n_save_calls = 0;
        pthread_mutex_unlock(&s->lock);
        Psfleet__V1__Checkpoint ck;
        Psfleet__V1__SaveCheckpointReply rep = PSFLEET__V1__SAVE_CHECKPOINT_REPLY__INIT;
        if (r >= 0) {
                chief_checkpoint_msg(row, &ck);
                rep.checkpoint = &ck;
                rep.existing = existing;
        }
        for (size_t i = 0; i < n; i++)
                if (r < 0)
                        rpc_call_fail_errno(calls[i], r, "%s", err);
                else
                        rpc_call_reply_msg(calls[i], &rep.base);
        free(calls);
}

bool chief_saves_pending(struct chief_status *s) {
        pthread_mutex_lock(&s->lock);
        bool r = s->n_save_calls > 0;
        pthread_mutex_unlock(&s->lock);
        return r;
}
