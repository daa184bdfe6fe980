/* chiefd's figures derived under its lock (rates, loss, the end), the one place where the job's
 * state changes, and the JobStatus message that GetStatus and Watch send. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "chiefd-internal.h"
#include "config.h"
#include "log.h"
#include "util.h"
#include "wire.h"

void chief_strfmt(char *buf, size_t len, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, len, fmt, ap);
        va_end(ap);
}

Psfleet__V1__JobState chief_event_locked(struct chief *c, const struct chief_event *ev) {
        if (chief_state_next(&c->js, ev, &c->js)) {
                c->state_since_us = now_us();
                chief_metrics_state(c->js.state);
                if (chief_state_ended(&c->js))
                        c->wait.on = false;
                /* Every change is durable before anyone can act on it: a chief started after a crash
                 * finds the state, and the reason, that the clients were last told. */
                chief_save_job_locked(c);
                pthread_cond_signal(&c->watch_cond);   /* watchers hear of it now, not at the next tick */
        }
        return c->js.state;
}

void chief_wait_set_locked(struct chief *c, const char *peer, uint64_t since_us, uint64_t timeout_s,
                           const char *last_error) {
        struct chief_wait *w = &c->wait;
        w->on = true;
        chief_strfmt(w->peer, sizeof(w->peer), "%s", peer);
        w->since_us = since_us;
        w->deadline_us = since_us + timeout_s * 1000000ULL;
        chief_strfmt(w->last_error, sizeof(w->last_error), "%s", last_error ? last_error : "");
}

void chief_wait_clear(struct chief *c) {
        pthread_mutex_lock(&c->lock);
        c->wait.on = false;
        pthread_mutex_unlock(&c->lock);
}

void chief_add_loss(struct chief *c, const struct chief_db_loss *l) {
        int r = chief_db_add_loss(c->db, l);
        if (r < 0)
                log_warning_errno(r, "Cannot record the loss of ps:%u in the database, continuing", l->shard);
        pthread_mutex_lock(&c->lock);
        struct chief_db_loss *a = realloc(c->losses, (c->n_losses + 1) * sizeof(*a));
        if (a) {
                a[c->n_losses++] = *l;
                c->losses = a;
        }
        c->steps_lost += l->steps_lost;
        pthread_cond_signal(&c->watch_cond);
        pthread_mutex_unlock(&c->lock);
}

bool chief_worker_live_locked(const struct chief *c, uint32_t w, uint64_t now) {
        const struct worker_info *wi = &c->workers[w];
        return wi->reported && wi->last_report_us && !wi->finished &&
               now - wi->last_report_us <= c->cfg->supervisor.worker_timeout_secs * 1000000ULL;
}

Psfleet__V1__JobState chief_event(struct chief *c, const struct chief_event *ev) {
        pthread_mutex_lock(&c->lock);
        Psfleet__V1__JobState s = chief_event_locked(c, ev);
        pthread_mutex_unlock(&c->lock);
        return s;
}

void chief_add_sample_locked(struct chief *c, uint64_t t, uint64_t step) {
        c->samples[c->sample_next] = (struct sample){t, step};
        c->sample_next = (c->sample_next + 1) % N_SAMPLES;
        if (c->n_samples < N_SAMPLES)
                c->n_samples++;
}

/* global_step per second over the last RATE_WINDOW_US; after the end, over the whole training. */
double chief_steps_per_s_locked(const struct chief *c) {
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
float chief_loss_locked(const struct chief *c) {
        double sum = 0;
        unsigned n = 0;
        /* a worker's non-finite loss makes the mean one: a diverged model is never averaged away */
        for (uint32_t w = 0; w < c->cfg->cluster.n_worker; w++)
                if (c->workers[w].reported) {
                        sum += c->workers[w].loss;
                        n++;
                }
        return n ? (float)(sum / n) : NAN;
}

int chief_report_admit_locked(struct chief *c, uint32_t w, uint64_t global_step, float loss, const char *state,
                              char *why, size_t len) {
        const struct worker_info *wi = &c->workers[w];
        char task[32], what[sizeof(c->diverged.what)];
        chief_strfmt(task, sizeof(task), "worker:%u", w);
        struct chief_report r = {.task = task, .global_step = global_step, .loss = loss, .state = state,
                                 .have_last = wi->step_known, .last_step = wi->global_step,
                                 .known_step = c->global_step, .max_steps = c->cfg->training.max_steps,
                                 .n_workers = c->cfg->cluster.n_worker};
        if (!chief_state_report_ok(&r, why, len))
                return -EINVAL;
        if (!chief_state_report_diverged(&r, what, sizeof(what)))
                return 0;
        chief_note_diverged_locked(c, task, what, global_step);
        return 1;
}

void chief_note_diverged_locked(struct chief *c, const char *task, const char *what, uint64_t step) {
        if (c->diverged.on)
                return;
        c->diverged.on = true;
        chief_strfmt(c->diverged.task, sizeof(c->diverged.task), "%s", task);
        chief_strfmt(c->diverged.what, sizeof(c->diverged.what), "%s", what);
        c->diverged.step = step;
}

void chief_forget_report_steps_locked(struct chief *c) {
        for (uint32_t w = 0; w < c->cfg->cluster.n_worker; w++)
                c->workers[w].step_known = false;
}

/* Call after raising global_step: remembers when it first moved after READY. */
void chief_note_progress_locked(struct chief *c, uint64_t t) {
        if (!c->first_mono && c->ready_mono && c->global_step > c->ready_step) {
                c->first_mono = t;
                c->first_step = c->global_step;
        }
}

/* Records that global_step reached max_steps, or that a stop was requested: the end of training. */
void chief_mark_end_locked(struct chief *c) {
        if (c->end_mono)
                return;
        c->end_mono = mono_us();
        c->end_step = c->global_step;
        c->wall_s = c->ready_mono ? (float)((double)(c->end_mono - c->ready_mono) / 1e6) : 0;
}

void chief_save_job_locked(struct chief *c) {
        struct chief_db_job j = {
                .fingerprint = c->fingerprint,
                .state = c->js.state,
                .global_step = c->global_step,
                .max_steps = c->cfg->training.max_steps,
                .started_us = c->started_us,
                .updated_us = now_us(),
                .test_accuracy = c->test_accuracy,
                .test_loss = c->test_loss,
                .test_auc = c->test_auc,
                .test_rmse = c->test_rmse,
                .wall_s = c->wall_s,
                .state_since_us = c->state_since_us,
        };
        chief_strfmt(j.reason, sizeof(j.reason), "%s", c->js.reason);
        int r = chief_db_save_job(c->db, &j);
        if (r < 0)
                log_warning_errno(r, "Cannot record the job's state in the database, continuing");
}

void chief_save_job(struct chief *c) {
        pthread_mutex_lock(&c->lock);
        chief_save_job_locked(c);
        pthread_mutex_unlock(&c->lock);
}

/* Refreshes the newest checkpoint and the count that the status shows. */
void chief_refresh_ckpt_info(struct chief *c) {
        struct chief_db_checkpoint row;
        uint32_t n = 0;
        int r = chief_ckpt_newest(c->ckpts, &row, &n);
        pthread_mutex_lock(&c->lock);
        c->have_ckpt = r >= 0;
        if (r >= 0) {
                c->last_ckpt = row;
                chief_metrics_checkpoint(0, 0, &row);
        }
        c->n_ckpts = n;
        pthread_mutex_unlock(&c->lock);
}

/* The job's status, packed (caller owns the buffer); NULL when out of memory. */
grpc_byte_buffer *chief_status_pack(struct chief *c) {
        const struct cluster *cl = &c->cfg->cluster;
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
        Psfleet__V1__JobStatus s = PSFLEET__V1__JOB_STATUS__INIT;
        Psfleet__V1__Checkpoint last = PSFLEET__V1__CHECKPOINT__INIT;
        s.job = c->cfg->name;
        s.max_steps = c->cfg->training.max_steps;
        s.fingerprint = c->fingerprint;
        s.checkpoint_dir = (char *)chief_ckpt_dir(c->ckpts);
        s.summary_dir = c->summary_dir;

        pthread_mutex_lock(&c->lock);
        s.state = c->js.state;
        s.reason = c->js.reason;
        s.global_step = c->global_step;
        double sps = chief_steps_per_s_locked(c);
        s.steps_per_s = (float)sps;
        s.examples_per_s = (float)(sps * (double)config_examples_per_step(c->cfg));
        if (c->js.state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE || c->end_mono)
                s.eta_s = 0;
        else if (sps > 0)
                s.eta_s = (float)((double)(s.max_steps > s.global_step ? s.max_steps - s.global_step : 0) / sps);
        else
                s.eta_s = -1;
        s.loss = chief_loss_locked(c);
        s.test_accuracy = c->test_accuracy;
        s.test_auc = c->test_auc;
        s.test_rmse = c->test_rmse;
        s.test_loss = c->test_loss;
        s.started_us = c->started_us;
        if (c->end_mono || chief_state_final(&c->js))   /* a sticky state keeps the recorded time */
                s.wall_s = c->wall_s;
        else if (c->ready_mono)
                s.wall_s = (float)((double)(mono_us() - c->ready_mono) / 1e6);
        if (c->have_ckpt) {
                chief_checkpoint_msg(&c->last_ckpt, &last);
                s.last_checkpoint = &last;
        }
        s.checkpoints = c->n_ckpts;
        s.eval_step = c->have_eval ? c->eval_step : 0;
        s.eval_accuracy = c->have_eval ? c->eval_accuracy : -1;
        s.eval_loss = c->have_eval ? c->eval_loss : -1;
        s.restored_step = c->restored_step;
        s.restored_from = c->restored_from;
        s.state_since_us = c->state_since_us;
        if (c->wait.on) {
                wf.peer = c->wait.peer;
                wf.since_us = c->wait.since_us;
                wf.deadline_us = c->wait.deadline_us;
                wf.last_error = c->wait.last_error;
                s.waiting_for = &wf;
        }
        if (c->n_losses) {
                losses = calloc(c->n_losses, sizeof(*losses));
                lp = calloc(c->n_losses, sizeof(*lp));
                if (!losses || !lp) {
                        pthread_mutex_unlock(&c->lock);
                        goto out;
                }
                for (size_t i = 0; i < c->n_losses; i++) {
                        const struct chief_db_loss *l = &c->losses[i];
                        psfleet__v1__shard_loss__init(&losses[i]);
                        losses[i].shard = l->shard;
                        losses[i].restored_step = l->restored_step;
                        losses[i].job_step = l->job_step;
                        losses[i].steps_lost = l->steps_lost;
                        losses[i].time_us = l->time_us;
                        lp[i] = &losses[i];
                }
                s.n_losses = c->n_losses;
                s.losses = lp;
        }
        s.steps_lost = c->steps_lost;
        s.last_checkpoint_error = c->last_ckpt_error;
        uint64_t now = now_us();
        for (uint32_t w = 0; w < cl->n_worker; w++)
                if (chief_worker_live_locked(c, w, now))
                        live[s.n_workers_live++] = w;
                else
                        missing[s.n_workers_missing++] = w;
        s.workers_live = live;
        s.workers_missing = missing;
        for (uint32_t i = 0; i < cl->n_ps; i++) {
                Psfleet__V1__NodeStatus *ns = &nodes[i];
                const struct ps_info *pi = &c->ps[i];
                psfleet__v1__node_status__init(ns);
                chief_strfmt(tasks[i], sizeof(tasks[i]), "ps:%u", i);
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
        s.n_nodes = n;
        s.nodes = np;
        bb = wire_pack(&s.base);   /* packs at once: the strings may change after unlock */
        pthread_mutex_unlock(&c->lock);
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
