/* workerd: one training worker. Reads its own shard of the data, computes gradients, pushes them to the
 * ps shards and trains on the fresh values their replies carry.
 *
 * The step loop, in train(): batch → forward → backward → push → (next step) fresh values → report.
 * Communication overlaps compute: each layer's gradients are pushed as soon as backward produces them,
 * and the next forward waits for a layer's fresh values only when it reaches that layer.
 *
 * Two ways a push travels: to a psd on another host, through gRPC (a sender and a receiver thread);
 * to a psd on this host, through shared memory (shmlink.h): the model's blocks live in a segment psd
 * maps, so psd reads the gradients where backward wrote them and writes the fresh values where
 * forward reads them, and the compute thread itself pushes and waits. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "backend.h"
#include "blocks.h"
#include "config.h"
#include "daemon.h"
#include "device.h"
#include "data.h"
#include "job.h"
#include "ps_client.h"
#include "log.h"
#include "model.h"
#include "notify.h"
#include "rpc.h"
#include "shmlink.h"
#include "trainer.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/supervisor.pb-c.h"
#include "psfleet/v1/worker.pb-c.h"

enum group_state { G_IDLE, G_QUEUED, G_FLIGHT, G_ARRIVED, G_FAILED };

/* The compute thread spins this long for a shared-memory answer before it sleeps: answers are due
 * within tens of microseconds once psd has the push. */
#define LINK_SPIN_US 200

struct group {
        uint32_t shard;
        uint32_t *parts, n_parts;
        uint32_t remaining;       /* parts whose gradients are not final yet this step (compute thread) */
        /* under worker.mu */
        enum group_state state;
        bool count_step;
        struct wire_in *reply;    /* G_ARRIVED: the fresh values */
        uint32_t unconsumed;      /* parts of the reply not yet copied into the model */
        bool via_link;            /* G_FLIGHT through shared memory: answer `seq` comes there */
        uint32_t seq;
        int err;
        char msg[600];
};

struct worker {
        struct daemon_args args;
        const struct job_config *cfg;
        uint32_t index, n_workers;
        struct backend *be;
        struct model *m;          /* the model; with several local GPUs, replica 0 of rep */
        struct device_replicas *rep; /* several local GPUs: the batch split across them, gradients summed */
        struct backend *bes[DEVICE_MAX_GPUS];
        uint32_t n_bes;
        struct job_layout *L;
        struct ps_client *pc;
        struct rpc_channel *chief;
        struct dataset *train;
        struct shard_iter *it;
        float *x;                 /* (B, D) */
        uint8_t *y;               /* (B) */
        FILE *loss_log;
        int sfd;                  /* signalfd */

        /* Communication runs on two threads of its own: a sender that starts pushes as backward
         * hands over gradients, and a receiver that takes the replies as they arrive. The compute
         * thread only waits, in forward, for the values it is about to use. */
        struct group *groups;     /* (n_groups) a push: one row block, or a layer's small variables */
        uint32_t n_groups;
        uint32_t *cb_first, *cb_count; /* [(var, block) callback slot] -> parts, via cb_parts */
        uint32_t *cb_parts;
        uint32_t *var_cb;         /* (n_vars) first callback slot of each variable */
        uint32_t n_cb;
        uint32_t *part_group;     /* (n_parts) */
        struct rpc_batch *batch;
        pthread_t sender, receiver;
        bool threads_started;
        pthread_mutex_t mu;       /* guards the groups' state, the queue, global_step, count_inflight */
        pthread_cond_t cond;      /* a group's state changed: what compute (and drain) wait for */
        pthread_cond_t send_cond; /* the queue grew, or comm_stop: what the sender waits for */
        uint32_t *queue;          /* (n_groups) ring of groups to send */
        uint32_t q_head, q_len;
        bool comm_stop;
        uint32_t count_inflight;  /* pushes that will increment global_step, not yet answered */
        bool counted;             /* this step has sent its counting push */
        int step_err;
        char step_msg[600];

        /* Shared memory with the ps shards on this host (NULL: every push through gRPC). */
        struct shmlink *link;
        bool *link_up;            /* (n_shards) this shard's pushes go through the link */
        bool *link_said;          /* (n_shards) why not was logged once */
        int32_t *link_pid;        /* (n_shards) its psd's process */

        uint64_t local_step, global_step, examples;
        uint64_t wait_us, push_us;  /* time spent waiting for fresh values, and starting pushes */
        uint64_t wd_usec, wd_last;  /* systemd's watchdog interval, and when it was last fed */
        bool config_error;          /* the device options are wrong: exit 78, restarting cannot help */
        atomic_bool stop;
        float last_loss;
        double ex_per_s;
        pthread_mutex_t st_mu;
        char state[256];
        struct rpc_server *server;
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

/* ---- the Worker service: status and stop ---- */

static void on_status(struct rpc_call *call, void *ud) {
        struct worker *w = ud;
        Psfleet__V1__WorkerStatus st = PSFLEET__V1__WORKER_STATUS__INIT;
        char state[256];
        pthread_mutex_lock(&w->st_mu);
        memcpy(state, w->state, sizeof(state));
        st.local_step = w->local_step;
        st.global_step = w->global_step;
        st.loss = w->last_loss;
        st.examples_per_s = (float)w->ex_per_s;
        pthread_mutex_unlock(&w->st_mu);
        st.worker = w->index;
        st.state = state;
        st.backend = (char *)backend_name(w->be);
        rpc_call_reply_msg(call, &st.base);
}

static void on_stop(struct rpc_call *call, void *ud) {
        struct worker *w = ud;
        atomic_store(&w->stop, true);
        Psfleet__V1__StopReply rep = PSFLEET__V1__STOP_REPLY__INIT;
        rpc_call_reply_msg(call, &rep.base);
}

/* ---- joining the job ---- */

/* Asks the chief until the job is ready. Every wait is bounded (supervisor.ready_timeout_secs) and its
 * reason is logged and shown in the status. Returns 0, -EPERM when the chief refuses our job file (the
 * caller exits 78), -ETIMEDOUT, or -ECANCELED on a signal. */
static int join(struct worker *w) {
        char *canon = config_canonical_json(w->cfg);
        if (!canon)
                return -ENOMEM;
        uint64_t deadline = mono_us() + w->cfg->supervisor.ready_timeout_secs * 1000000u;
        uint64_t backoff = 100;
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
                        if (rep->state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE ||
                            rep->state == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED) {
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
                        protobuf_c_message_free_unpacked(m, NULL);
                } else {
                        snprintf(why, sizeof(why), "waiting: chief not reachable: %s", err);
                }
                if (strcmp(why, last) != 0) {
                        log_info("%s; retrying for up to %llu s", why,
                                 (unsigned long long)((deadline - mono_us()) / 1000000u));
                        snprintf(last, sizeof(last), "%s", why);
                }
                set_state(w, "%s", why);
                feed_watchdog(w);
                if (mono_us() > deadline) {
                        log_error("gave up after supervisor.ready_timeout_secs=%llu: %s",
                                  (unsigned long long)w->cfg->supervisor.ready_timeout_secs, why);
                        r = -ETIMEDOUT;
                        break;
                }
                nap(w, backoff);
                if (atomic_load(&w->stop)) {
                        r = -ECANCELED;
                        break;
                }
                backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
        }
        free(canon);
        return r;
}

/* Reads every shard into the model, retrying (bounded) while shards are unreachable or uninitialized. */
static int pull_all(struct worker *w) {
        uint64_t deadline = mono_us() + w->cfg->supervisor.ready_timeout_secs * 1000000u;
        uint64_t backoff = 100;
        for (;;) {
                char err[600];
                uint64_t gs = 0;
                int r = ps_client_pull(w->pc, model_params(w->m), NULL, &gs, err, sizeof(err));
                if (r == 0) {
                        w->global_step = gs;
                        return w->rep ? device_replicas_params_sync(w->rep) : model_params_sync(w->m);
                }
                set_state(w, "waiting: cannot read the parameters: %s", err);
                feed_watchdog(w);
                if (mono_us() > deadline || (r != -EAGAIN && r != -ETIMEDOUT))
                        return log_error_errno(r, "cannot read the parameters: %s", err);
                log_info("cannot read the parameters yet: %s; retrying", err);
                nap(w, backoff);
                if (atomic_load(&w->stop))
                        return -ECANCELED;
                backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
        }
}

/* ---- the step's communication ---- */

/* Pushes of `shard` go through gRPC from now on (until link_attach succeeds again). */
static void link_down(struct worker *w, uint32_t shard) {
        if (!w->link || !w->link_up[shard])
                return;
        w->link_up[shard] = false;
        shmlink_shard_close(w->link, shard);
}

/* Asks each shard not linked yet to serve our pushes through shared memory. A shard that cannot (on
 * another host; an older psd) is told again after the next recovery, and why is logged once. */
static void link_attach(struct worker *w) {
        const struct job_layout *L = w->L;
        if (!w->link)
                return;
        uint32_t *index = calloc(w->n_groups + 1, sizeof(uint32_t)), *n = calloc(w->n_groups + 1, sizeof(uint32_t));
        const uint32_t **parts = calloc(w->n_groups + 1, sizeof(*parts));
        for (uint32_t s = 0; index && n && parts && s < L->n_shards; s++) {
                if (w->link_up[s])
                        continue;
                uint32_t k = 0;
                for (uint32_t i = 0; i < w->n_groups; i++)
                        if (w->groups[i].shard == s) {
                                index[k] = i;
                                parts[k] = w->groups[i].parts;
                                n[k++] = w->groups[i].n_parts;
                        }
                uint32_t gen = shmlink_shard_open(w->link, s);
                int32_t pid = 0;
                char err[800];
                int r = ps_client_attach_shm(w->pc, s, w->index, shmlink_name(w->link), shmlink_nonce(w->link), gen, k,
                                             index, parts, n, &pid, err, sizeof(err));
                if (r == 0 && (pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH)))
                        r = errf(err, sizeof(err), -ESRCH, "ps:%u's process %d is not visible from here (another PID namespace?)",
                                 s, (int)pid);
                if (r < 0) {
                        shmlink_shard_close(w->link, s);
                        if (!w->link_said[s])
                                log_info("ps:%u: pushing through gRPC: %s", s, err);
                        w->link_said[s] = true;
                        continue;
                }
                w->link_up[s] = true;
                w->link_pid[s] = pid;
                w->link_said[s] = false;
                log_info("ps:%u is on this host: pushing through shared memory (%u group(s))", s, k);
        }
        free(index);
        free(n);
        free(parts);
}

/* Waits for the answer to group gi's shared-memory push (its values are then in the model) and makes
 * the group idle. A refusal or a lost psd becomes the step's error; a lost psd also takes the link
 * down. Compute thread only. */
static void link_settle(struct worker *w, uint32_t gi) {
        struct group *g = &w->groups[gi];
        uint64_t gs = 0;
        char err[500];
        int r = -ECONNRESET;
        if (w->link_up[g->shard])
                r = shmlink_wait(w->link, gi, g->seq, w->link_pid[g->shard], LINK_SPIN_US, w->cfg->rpc.deadline_ms * 1000,
                                 &gs, err, sizeof(err));
        else
                snprintf(err, sizeof(err), "the shared-memory link is down");
        pthread_mutex_lock(&w->mu);
        if (r == 0 && g->shard == 0 && gs > w->global_step)
                w->global_step = gs;
        if (g->count_step) {
                g->count_step = false;
                w->count_inflight--;
        }
        g->state = G_IDLE;
        g->via_link = false;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->mu);
        if (r < 0) {
                if (!w->step_err) {
                        w->step_err = r;
                        snprintf(w->step_msg, sizeof(w->step_msg), "ps:%u through shared memory: %s", g->shard, err);
                }
                if (r == -ETIMEDOUT || r == -ECONNRESET || r == -EPROTO)
                        link_down(w, g->shard);
        }
}

static void *sender_main(void *arg) {
        struct worker *w = arg;
        pthread_mutex_lock(&w->mu);
        for (;;) {
                while (w->q_len == 0 && !w->comm_stop)
                        pthread_cond_wait(&w->send_cond, &w->mu);
                if (w->q_len == 0)
                        break;
                struct group *g = &w->groups[w->queue[w->q_head]];
                w->q_head = (w->q_head + 1) % w->n_groups;
                w->q_len--;
                g->state = G_FLIGHT;
                bool count = g->count_step;
                uint64_t step = w->local_step;
                pthread_mutex_unlock(&w->mu);
                struct rpc_pending *p;
                int r = ps_client_push_start(w->pc, w->batch, g->shard, g->parts, g->n_parts, model_grads(w->m), w->index,
                                             step, count, g, &p);
                pthread_mutex_lock(&w->mu);
                if (r < 0 && g->state == G_FLIGHT && !rpc_batch_running(w->batch)) {
                        /* not started at all: no completion will come */
                        g->state = G_FAILED;
                        g->err = r;
                        snprintf(g->msg, sizeof(g->msg), "cannot start a push to ps:%u: %s", g->shard, strerror(-r));
                        pthread_cond_broadcast(&w->cond);
                }
        }
        pthread_mutex_unlock(&w->mu);
        return NULL;
}

static void *receiver_main(void *arg) {
        struct worker *w = arg;
        for (;;) {
                struct rpc_pending *p = rpc_batch_next(w->batch, 100);
                if (!p) {
                        pthread_mutex_lock(&w->mu);
                        bool end = w->comm_stop && w->q_len == 0 && rpc_batch_running(w->batch) == 0;
                        pthread_mutex_unlock(&w->mu);
                        if (end)
                                break;
                        continue;
                }
                struct group *g = rpc_pending_userdata(p);
                void *in = NULL;
                uint64_t gs = 0;
                char err[600];
                int r = ps_client_push_reply(w->pc, rpc_pending_result(p), &in, &gs, NULL, err, sizeof(err));
                rpc_batch_release(w->batch, p);
                pthread_mutex_lock(&w->mu);
                g->unconsumed = g->n_parts;
                if (r < 0) {
                        g->state = G_FAILED;
                        g->err = r;
                        snprintf(g->msg, sizeof(g->msg), "%s", err);
                } else {
                        g->state = G_ARRIVED;
                        g->reply = in;
                        if (g->shard == 0 && gs > w->global_step)
                                w->global_step = gs;
                }
                if (g->count_step) {
                        g->count_step = false;
                        w->count_inflight--;
                }
                pthread_cond_broadcast(&w->cond);
                pthread_mutex_unlock(&w->mu);
        }
        return NULL;
}

/* Before forward reads a block: its fresh values must be in place. Copies them from the reply. */
static int before_block(void *ud, uint32_t var, uint32_t block) {
        struct worker *w = ud;
        uint32_t slot = w->var_cb[var] + block;
        for (uint32_t i = 0; i < w->cb_count[slot]; i++) {
                uint32_t part = w->cb_parts[w->cb_first[slot] + i];
                struct group *g = &w->groups[w->part_group[part]];
                uint64_t t0 = mono_us();
                if (g->via_link) {
                        /* psd wrote the values into the model already: wait for its answer only */
                        link_settle(w, w->part_group[part]);
                        w->wait_us += mono_us() - t0;
                        continue;
                }
                pthread_mutex_lock(&w->mu);
                while (g->state == G_QUEUED || g->state == G_FLIGHT)
                        pthread_cond_wait(&w->cond, &w->mu);   /* bounded: every push has a deadline */
                enum group_state st = g->state;
                pthread_mutex_unlock(&w->mu);
                w->wait_us += mono_us() - t0;
                if (st == G_IDLE)
                        continue;      /* nothing was pushed for it yet: the first step */
                if (st == G_ARRIVED) {
                        const struct placement_part *pp = &w->L->plan->parts[part];
                        const char *name = w->L->vars[pp->var].name;
                        for (size_t t = 0; t < g->reply->n_tensors; t++)
                                if (g->reply->tensors[t].row_offset == pp->row_begin &&
                                    strcmp(g->reply->tensors[t].name, name) == 0)
                                        job_layout_copy_in(w->L, &g->reply->tensors[t], model_params(w->m), NULL, NULL, 0);
                } else if (!w->step_err) {
                        w->step_err = g->err;
                        snprintf(w->step_msg, sizeof(w->step_msg), "%s", g->msg);
                }
                pthread_mutex_lock(&w->mu);
                if (--g->unconsumed == 0) {
                        g->reply = wire_in_free(g->reply);
                        g->state = G_IDLE;
                }
                pthread_mutex_unlock(&w->mu);
        }
        return 0;
}

/* After backward made a block's gradient final: its group goes to the sender once complete. */
static int after_block(void *ud, uint32_t var, uint32_t block) {
        struct worker *w = ud;
        uint64_t t0 = mono_us();
        uint32_t slot = w->var_cb[var] + block;
        for (uint32_t i = 0; i < w->cb_count[slot]; i++) {
                uint32_t gi = w->part_group[w->cb_parts[w->cb_first[slot] + i]];
                struct group *g = &w->groups[gi];
                if (--g->remaining > 0)
                        continue;
                g->remaining = g->n_parts;
                bool link = w->link && w->link_up[g->shard];
                pthread_mutex_lock(&w->mu);
                g->state = link ? G_FLIGHT : G_QUEUED;
                g->via_link = link;
                /* the first push to shard 0 of a step counts it in global_step */
                g->count_step = g->shard == 0 && !w->counted;
                if (g->count_step) {
                        w->counted = true;
                        w->count_inflight++;
                }
                if (!link) {
                        w->queue[(w->q_head + w->q_len++) % w->n_groups] = gi;
                        pthread_cond_signal(&w->send_cond);
                }
                pthread_mutex_unlock(&w->mu);
                if (link)
                        g->seq = shmlink_push(w->link, gi, g->shard, w->local_step, g->count_step);
        }
        w->push_us += mono_us() - t0;
        return 0;
}

/* Waits for every push in flight and drops the values they bring. */
static void drain(struct worker *w) {
        for (uint32_t i = 0; i < w->n_groups; i++)
                if (w->groups[i].via_link)
                        link_settle(w, i);
        pthread_mutex_lock(&w->mu);
        for (uint32_t i = 0; i < w->n_groups; i++) {
                struct group *g = &w->groups[i];
                while (g->state == G_QUEUED || g->state == G_FLIGHT)
                        pthread_cond_wait(&w->cond, &w->mu);
                g->reply = wire_in_free(g->reply);
                g->state = G_IDLE;
                g->remaining = g->n_parts;
        }
        pthread_mutex_unlock(&w->mu);
}

static int comm_start(struct worker *w) {
        int r = pthread_create(&w->sender, NULL, sender_main, w);
        if (r != 0)
                return -r;
        r = pthread_create(&w->receiver, NULL, receiver_main, w);
        if (r != 0) {
                pthread_mutex_lock(&w->mu);
                w->comm_stop = true;
                pthread_cond_signal(&w->send_cond);
                pthread_mutex_unlock(&w->mu);
                pthread_join(w->sender, NULL);
                return -r;
        }
        w->threads_started = true;
        return 0;
}

static void comm_stop(struct worker *w) {
        if (!w->threads_started)
                return;
        drain(w);
        pthread_mutex_lock(&w->mu);
        w->comm_stop = true;
        pthread_cond_signal(&w->send_cond);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->sender, NULL);
        pthread_join(w->receiver, NULL);
        w->threads_started = false;
}

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

static int train(struct worker *w) {
        const struct training_config *t = &w->cfg->training;
        uint64_t max = t->max_steps;
        uint64_t win_t = mono_us(), win_ex = 0;
        int r = comm_start(w);
        if (r < 0)
                return log_error_errno(r, "cannot start the communication threads");
        set_state(w, "training");
        log_info_step(w->global_step, "training from global_step %llu to %llu on shard %u of %u (%u examples)",
                      (unsigned long long)w->global_step, (unsigned long long)max, w->index, w->n_workers,
                      shard_size(w->it));
        while (!signalled(w)) {
                /* a push that counts a step may still be in flight */
                pthread_mutex_lock(&w->mu);
                bool reached = w->global_step + w->count_inflight >= max;
                w->counted = false;
                pthread_mutex_unlock(&w->mu);
                if (reached)
                        break;
                float loss;
                shard_next_batch(w->it, t->batch_size, w->x, w->y);
                w->step_err = 0;
                r = w->rep ? device_replicas_forward_blocks(w->rep, w->x, w->y, t->batch_size, &loss, NULL, before_block, w)
                           : model_forward_blocks(w->m, w->x, w->y, t->batch_size, &loss, NULL, before_block, w);
                if (r >= 0 && !w->step_err)
                        r = w->rep ? device_replicas_backward_blocks(w->rep, after_block, w)
                                   : model_backward_blocks(w->m, after_block, w);
                if (r < 0) {
                        comm_stop(w);
                        return log_error_errno(r, "step %llu failed", (unsigned long long)w->local_step);
                }
                if (w->step_err) {
                        /* a shard was lost or restarted: wait for it, re-read the values, carry on */
                        log_warning("step %llu: %s; re-reading the parameters", (unsigned long long)w->local_step, w->step_msg);
                        drain(w);
                        if ((r = pull_all(w)) < 0) {
                                comm_stop(w);
                                return r;
                        }
                        link_attach(w);
                        continue;
                }
                if (w->loss_log)
                        trainer_log_loss(w->loss_log, w->local_step, loss);
                feed_watchdog(w);
                pthread_mutex_lock(&w->st_mu);
                w->local_step++;
                w->examples += t->batch_size;
                w->last_loss = loss;
                pthread_mutex_unlock(&w->st_mu);
                win_ex += t->batch_size;
                if (w->local_step % t->report_every_steps == 0) {
                        uint64_t now = mono_us();
                        w->ex_per_s = (double)win_ex / ((double)(now - win_t) / 1e6);
                        win_t = now;
                        win_ex = 0;
                        report(w, "training");
                        set_state(w, "training: step %llu/%llu, loss %.3f, %.0f ex/s", (unsigned long long)w->global_step,
                                  (unsigned long long)max, loss, w->ex_per_s);
                        log_debug_step(w->global_step, "loss %.4f, %.0f examples/s", loss, w->ex_per_s);
                }
        }
        /* the last pushes' values are the job's; apply them so status and logs agree */
        for (uint32_t v = 0; v < w->L->n_vars; v++)
                for (uint32_t b = 0; b < (v + 1 < w->L->n_vars ? w->var_cb[v + 1] : w->n_cb) - w->var_cb[v]; b++)
                        before_block(w, v, b);
        comm_stop(w);
        return 0;
}

/* ---- set-up ---- */

/* Which parts each forward/backward callback covers, and how parts group into pushes: a row block of
 * a large variable is a push of its own; all other variables of a shard go together in one push (each
 * call costs tens of microseconds of CPU on both ends: measured, fewer pushes per step won). */
static int comm_layout(struct worker *w) {
        const struct job_layout *L = w->L;
        uint32_t NP = L->plan->n_parts, S = L->n_shards;
        bool *blocked = calloc(L->n_vars, sizeof(bool));
        w->var_cb = calloc(L->n_vars, sizeof(uint32_t));
        w->cb_first = calloc(NP, sizeof(uint32_t));
        w->cb_count = calloc(NP, sizeof(uint32_t));
        w->cb_parts = calloc(NP, sizeof(uint32_t));
        w->part_group = calloc(NP, sizeof(uint32_t));
        w->groups = calloc(NP, sizeof(*w->groups));
        w->queue = calloc(NP, sizeof(uint32_t));
        uint32_t *layer_group = malloc((size_t)w->cfg->model.n_layers * S * sizeof(uint32_t));
        int r = -ENOMEM;
        if (!blocked || !w->var_cb || !w->cb_first || !w->cb_count || !w->cb_parts || !w->part_group || !w->groups ||
            !w->queue || !layer_group)
                goto out;
        if ((r = job_model_blocks(L, w->m, blocked)) < 0)
                goto out;
        for (uint32_t v = 0; w->rep && v < L->n_vars; v++) {
                const uint32_t *rows;
                uint32_t nb = model_var_blocks(w->m, v, &rows);
                if (nb <= 1)
                        continue;
                /* a copy: setting the blocks again on replica 0 frees the model's own array */
                uint32_t *copy = malloc(nb * sizeof(uint32_t));
                if (!copy) {
                        r = -ENOMEM;
                        goto out;
                }
                memcpy(copy, rows, nb * sizeof(uint32_t));
                r = device_replicas_set_var_blocks(w->rep, v, nb, copy);
                free(copy);
                if (r < 0)
                        goto out;
        }
        for (uint32_t i = 0; i < w->cfg->model.n_layers * S; i++)
                layer_group[i] = UINT32_MAX;
        uint32_t k = 0;
        for (uint32_t v = 0; v < L->n_vars; v++) {
                uint32_t first, n = placement_var_parts(L->plan, v, &first);
                w->var_cb[v] = w->n_cb;
                for (uint32_t i = 0; i < n; i++) {
                        uint32_t p = first + i;
                        if (blocked[v] || i == 0) {
                                w->cb_first[w->n_cb] = k;
                                w->n_cb++;
                        }
                        w->cb_parts[k++] = p;
                        w->cb_count[w->n_cb - 1]++;
                        /* its group */
                        const struct placement_part *pp = &L->plan->parts[p];
                        uint32_t gi, *lg = &layer_group[pp->shard];
                        if (blocked[v]) {
                                gi = w->n_groups++;
                        } else {
                                if (*lg == UINT32_MAX)
                                        *lg = w->n_groups++;
                                gi = *lg;
                        }
                        struct group *g = &w->groups[gi];
                        uint32_t *np = realloc(g->parts, (g->n_parts + 1) * sizeof(uint32_t));
                        if (!np) {
                                r = -ENOMEM;
                                goto out;
                        }
                        g->parts = np;
                        g->parts[g->n_parts++] = p;
                        g->remaining = g->n_parts;
                        g->shard = pp->shard;
                        w->part_group[p] = gi;
                }
        }
        uint32_t nb = 0;
        for (uint32_t v = 0; v < L->n_vars; v++)
                nb += blocked[v];
        log_info("%u variable(s) in %u part(s) over %u shard(s), %u pushed in row blocks; %u pushes per step",
                 L->n_vars, NP, S, nb, w->n_groups);
        r = 0;
out:
        free(blocked);
        free(layer_group);
        return r;
}

/* The model's blocks move into a shared-memory segment that psd shards on this host can map. Without
 * one (no memory for it, several local GPUs), every push goes through gRPC. */
static void link_setup(struct worker *w) {
        const struct job_layout *L = w->L;
        char err[600];
        int r;
        if (w->rep) {
                log_info("pushing through gRPC only: shared memory is not used with several local GPUs");
                return;
        }
        w->link_up = calloc(L->n_shards, sizeof(bool));
        w->link_said = calloc(L->n_shards, sizeof(bool));
        w->link_pid = calloc(L->n_shards, sizeof(int32_t));
        if (!w->link_up || !w->link_said || !w->link_pid) {
                r = errf(err, sizeof(err), -ENOMEM, "out of memory");
        } else if ((r = shmlink_create(w->cfg->name, w->index, L->fingerprint, L->n_params, L->n_shards, w->n_groups,
                                       &w->link, err, sizeof(err))) == 0 &&
                   (r = model_use_host_blocks(w->m, shmlink_params(w->link), shmlink_grads(w->link))) < 0) {
                snprintf(err, sizeof(err), "cannot move the model into it: %s", strerror(-r));
                w->link = shmlink_free(w->link);
        }
        if (r < 0)
                log_notice("no shared memory for ps shards on this host (%s): pushing through gRPC only", err);
}

static int build(struct worker *w) {
        const struct job_config *cfg = w->cfg;
        char err[1024];
        int r;
        char *ip = trainer_data_path(cfg, cfg->data.train_images), *lp = trainer_data_path(cfg, cfg->data.train_labels);
        r = dataset_load(ip, lp, &w->train, err, sizeof(err));
        free(ip);
        free(lp);
        if (r < 0)
                return log_error_errno(r, "cannot read the training data: %s", err);
        /* where to compute: the job's device options, overridable per node (PSFLEET_DEVICE, ...) */
        char msg[1024];
        struct device_request req;
        if ((r = device_request_resolve(&cfg->device, &req, msg, sizeof(msg))) < 0) {
                w->config_error = true;
                return log_error_errno(r, "device: %s", msg);
        }
        if (req.kind == DEVICE_GPU && req.n_gpus > 1) {
                /* several local GPUs: one model per GPU, the batch split across them, one push per step */
                int fell = device_backends_new(&cfg->device, cfg->training.threads, w->bes, &w->n_bes, msg, sizeof(msg));
                r = fell;
                if (fell == DEVICE_FELL_BACK)
                        log_notice("%s", msg);
                if (r < 0 ||
                    (r = device_replicas_new(w->bes, w->n_bes, &cfg->model, cfg->training.batch_size, &w->rep, msg,
                                             sizeof(msg))) < 0) {
                        w->config_error = r == -EINVAL || r == -ENODEV || r == -ENOMEM;
                        return log_error_errno(r, "device: %s", msg);
                }
                w->be = w->bes[0];
                w->m = device_replicas_model(w->rep);
                if (fell != DEVICE_FELL_BACK)
                        log_info("device: %u replicas, the batch of %u split across them: %s", w->n_bes,
                                 cfg->training.batch_size, msg);
        } else {
                r = device_backend_new(&cfg->device, cfg->training.threads, &w->be, msg, sizeof(msg));
                if (r < 0) {
                        w->config_error = true;
                        return log_error_errno(r, "device: %s", msg);
                }
                if (r == DEVICE_FELL_BACK)
                        log_notice("%s", msg);
                else
                        log_info("device: %s", msg);
                if ((r = device_model_new(w->be, &cfg->model, cfg->training.batch_size, &w->m, msg, sizeof(msg))) < 0) {
                        w->config_error = r == -ENOMEM;   /* a memory cap too small for the model: fix the options */
                        return log_error_errno(r, "cannot build the model: %s", msg);
                }
        }
        if (device_log_placement(&cfg->device)) {
                char lines[8192];
                device_placement(w->be, w->m, lines, sizeof(lines));
                for (char *save = NULL, *l = strtok_r(lines, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
                        log_info("placement: %s", l);
        }
        if (model_input_size(w->m) != w->train->dim || dataset_max_label(w->train) >= model_n_classes(w->m))
                return log_error_errno(EINVAL, "the training data (%u values, labels up to %u) do not fit the model (input %u, %u classes)",
                                       w->train->dim, dataset_max_label(w->train), model_input_size(w->m), model_n_classes(w->m));
        if ((r = shard_iter_new(w->train, w->index, w->n_workers, cfg->training.seed, &w->it)) < 0)
                return log_error_errno(r, "cannot shard the data");
        if ((r = job_layout_new(cfg, &w->L)) < 0 || (r = ps_client_new(cfg, w->L, w->args.task_name, &w->pc)) < 0)
                return log_error_errno(r, "cannot set up the ps clients");
        if ((r = rpc_channel_new(cfg->cluster.chief[0].addr, "chief:0", &w->chief)) < 0)
                return log_error_errno(r, "cannot set up the chief's channel");
        if ((r = rpc_batch_new(&w->batch)) < 0)
                return r;
        w->x = malloc((size_t)cfg->training.batch_size * w->train->dim * sizeof(float));
        w->y = malloc(cfg->training.batch_size);
        if (!w->x || !w->y)
                return log_error_errno(ENOMEM, "out of memory");
        if ((r = comm_layout(w)) < 0)
                return log_error_errno(r, "cannot lay out the pushes");
        if (cfg->rpc.shared_memory)
                link_setup(w);
        else
                log_info("rpc.shared_memory is off: pushing through gRPC only");
        if (w->args.loss_log) {
                w->loss_log = fopen(w->args.loss_log, "we");
                if (!w->loss_log)
                        return log_error_errno(errno, "cannot open --loss-log \"%s\"", w->args.loss_log);
        }
        return 0;
}

static void done(struct worker *w) {
        rpc_server_free(w->server);
        comm_stop(w);
        rpc_batch_free(w->batch);
        for (uint32_t i = 0; w->groups && i < w->n_groups; i++) {
                free(w->groups[i].parts);
                wire_in_free(w->groups[i].reply);
        }
        free(w->groups);
        free(w->var_cb);
        free(w->cb_first);
        free(w->cb_count);
        free(w->cb_parts);
        free(w->part_group);
        free(w->queue);
        ps_client_free(w->pc);
        rpc_channel_free(w->chief);
        job_layout_free(w->L);
        shard_iter_free(w->it);
        dataset_free(w->train);
        if (w->rep) {
                device_replicas_free(w->rep);
                for (uint32_t i = 0; i < w->n_bes; i++)
                        backend_free(w->bes[i]);
        } else {
                model_free(w->m);
                backend_free(w->be);
        }
        shmlink_free(w->link);   /* after the model, whose blocks it held */
        free(w->link_up);
        free(w->link_said);
        free(w->link_pid);
        free(w->x);
        free(w->y);
        if (w->loss_log)
                fclose(w->loss_log);
        daemon_args_done(&w->args);
}

static int run(int argc, char **argv) {
        struct worker w = {0};
        pthread_mutex_init(&w.st_mu, NULL);
        pthread_mutex_init(&w.mu, NULL);
        pthread_cond_init(&w.cond, NULL);
        pthread_cond_init(&w.send_cond, NULL);
        w.sfd = daemon_signals_fd();
        if (w.sfd < 0) {
                fprintf(stderr, "workerd: cannot set up signals: %s\n", strerror(-w.sfd));
                return 1;
        }
        int r = daemon_args_parse(argc, argv, "workerd", ROLE_WORKER, &w.args);
        if (r != 0)
                return r == 1 ? 0 : r;
        w.cfg = w.args.cfg;
        w.index = w.args.task.index;
        w.n_workers = w.cfg->cluster.n_worker;
        log_setup("workerd", w.cfg->name, w.args.task_name);
        rpc_global_init();
        snprintf(w.state, sizeof(w.state), "starting");
        int ret = 1;
        if (build(&w) < 0) {
                if (w.config_error)
                        ret = CONFIG_EX_CONFIG;
                goto out;
        }

        static const char *const services[] = {"psfleet.v1.Worker", NULL};
        struct rpc_method methods[] = {
                {"/psfleet.v1.Worker/GetWorkerStatus", on_status, &w},
                {"/psfleet.v1.Worker/Stop", on_stop, &w},
                {RPC_HEALTH_CHECK, rpc_health_handler, (void *)services},
        };
        if ((r = rpc_server_new(w.args.listen, methods, 3, 1, &w.server)) < 0 || (r = rpc_server_start(w.server)) < 0) {
                log_error_errno(r, "cannot listen on \"%s\"", w.args.listen);
                goto out;
        }
        notify_ready();
        w.wd_usec = notify_watchdog_usec();
        r = join(&w);
        if (r == -EPERM) {
                ret = CONFIG_EX_CONFIG;
                goto out;
        }
        if (r == -ECANCELED || r == -ESHUTDOWN) {
                ret = 0;
                goto out;
        }
        if (r < 0 || (r = pull_all(&w)) < 0)
                goto out;
        link_attach(&w);
        if (w.global_step > 0) {
                /* a resumed job: carry on in the data where this worker's share of the steps left it */
                uint64_t skip = w.global_step / w.n_workers * w.cfg->training.batch_size;
                shard_skip(w.it, skip);
                log_info_step(w.global_step, "resuming at global_step %llu: skipped %llu examples of this shard (epoch %llu)",
                              (unsigned long long)w.global_step, (unsigned long long)skip,
                              (unsigned long long)shard_epoch(w.it));
        }
        if (w.global_step >= w.cfg->training.max_steps) {
                log_info("the job is already at global_step %llu of %llu: nothing to do",
                         (unsigned long long)w.global_step, (unsigned long long)w.cfg->training.max_steps);
        } else if ((r = train(&w)) < 0) {
                goto out;
        }
        set_state(&w, "done: %llu local steps, global_step %llu", (unsigned long long)w.local_step,
                  (unsigned long long)w.global_step);
        report(&w, "done");
        log_info_step(w.global_step, "done: %llu local steps, loss %.4f; waited %.2f s for fresh values, %.2f s starting pushes",
                      (unsigned long long)w.local_step, w.last_loss, (double)w.wait_us / 1e6, (double)w.push_us / 1e6);
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
