/* workerd: one training worker. Reads its own shard of the data, computes gradients, pushes them to the
 * ps shards and trains on the fresh values their replies carry.
 *
 * The step loop, in train(): batch → forward → backward → push → (next step) fresh values → report.
 * Communication overlaps compute: each layer's gradients are pushed as soon as backward produces them,
 * and the next forward waits for a layer's fresh values only when it reaches that layer. */
#include <errno.h>
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
#include "data.h"
#include "job.h"
#include "log.h"
#include "model.h"
#include "notify.h"
#include "rpc.h"
#include "trainer.h"
#include "util.h"
#include "psfleet/v1/supervisor.pb-c.h"
#include "psfleet/v1/worker.pb-c.h"

struct worker {
        struct daemon_args args;
        const struct job_config *cfg;
        uint32_t index, n_workers;
        struct backend *be;
        struct model *m;
        struct job_layout *L;
        struct ps_client *pc;
        struct rpc_channel *chief;
        struct dataset *train;
        struct shard_iter *it;
        float *x;                 /* (B, D) */
        uint8_t *y;               /* (B) */
        FILE *loss_log;
        int sfd;                  /* signalfd */

        /* per layer and shard: the parts to push, and the push in flight */
        uint32_t n_layers;
        uint32_t **lparts;        /* [layer * n_shards + shard] -> part indices */
        uint32_t *lcount;         /* [layer * n_shards + shard] */
        struct rpc_pending **pending; /* [layer * n_shards + shard] */
        uint32_t count_layer;     /* the last layer pushed to shard 0 in a step carries count_step */
        struct rpc_batch *batch;
        int step_err;
        char step_msg[600];

        uint64_t local_step, global_step, examples;
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
                        return model_params_sync(w->m);
                }
                set_state(w, "waiting: cannot read the parameters: %s", err);
                if (mono_us() > deadline || (r != -EAGAIN && r != -ETIMEDOUT))
                        return log_error_errno(r, "cannot read the parameters: %s", err);
                log_info("cannot read the parameters yet: %s; retrying", err);
                nap(w, backoff);
                if (atomic_load(&w->stop))
                        return -ECANCELED;
                backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
        }
}

/* ---- the step's communication, called from inside forward and backward ---- */

/* Before a layer's forward: its fresh values must have arrived. */
static int wait_layer(void *ud, uint32_t first_var, uint32_t n_vars) {
        struct worker *w = ud;
        uint32_t layer = w->L->vars[first_var].layer, S = w->L->n_shards;
        (void)n_vars;
        for (uint32_t s = 0; s < S; s++) {
                struct rpc_pending *p = w->pending[layer * S + s];
                if (!p)
                        continue;
                struct rpc_result *res = rpc_batch_wait(w->batch, p);
                uint64_t gs = 0;
                char err[600];
                int r = ps_client_push_done(w->pc, res, model_params(w->m), &gs, NULL, err, sizeof(err));
                rpc_batch_release(w->batch, p);
                w->pending[layer * S + s] = NULL;
                if (r < 0) {
                        if (!w->step_err) {
                                w->step_err = r;
                                snprintf(w->step_msg, sizeof(w->step_msg), "%s", err);
                        }
                        continue;
                }
                if (s == 0 && gs > w->global_step)
                        w->global_step = gs;
        }
        return 0;
}

/* After a layer's backward: push its gradients at once. */
static int push_layer(void *ud, uint32_t first_var, uint32_t n_vars) {
        struct worker *w = ud;
        uint32_t layer = w->L->vars[first_var].layer, S = w->L->n_shards;
        (void)n_vars;
        for (uint32_t s = 0; s < S; s++) {
                uint32_t n = w->lcount[layer * S + s];
                if (!n)
                        continue;
                int r = ps_client_push_start(w->pc, w->batch, s, w->lparts[layer * S + s], n, model_grads(w->m), w->index,
                                             w->local_step, s == 0 && layer == w->count_layer,
                                             &w->pending[layer * S + s]);
                if (r < 0 && !w->step_err) {
                        w->step_err = r;
                        snprintf(w->step_msg, sizeof(w->step_msg), "cannot start a push to ps:%u: %s", s, strerror(-r));
                }
        }
        return 0;
}

static void wait_all(struct worker *w) {
        for (uint32_t v = 0; v < w->L->n_vars; v++)
                wait_layer(w, v, 1);
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
        set_state(w, "training");
        log_info_step(w->global_step, "training from global_step %llu to %llu on shard %u of %u (%u examples)",
                      (unsigned long long)w->global_step, (unsigned long long)max, w->index, w->n_workers,
                      shard_size(w->it));
        while (!signalled(w)) {
                /* one push that counts a step may still be in flight */
                uint64_t in_flight = w->pending[w->count_layer * w->L->n_shards] ? 1 : 0;
                if (w->global_step + in_flight >= max)
                        break;
                float loss;
                shard_next_batch(w->it, t->batch_size, w->x, w->y);
                w->step_err = 0;
                int r = model_forward_hooked(w->m, w->x, w->y, t->batch_size, &loss, NULL, wait_layer, w);
                if (r >= 0 && !w->step_err)
                        r = model_backward(w->m, push_layer, w);
                if (r < 0)
                        return log_error_errno(r, "step %llu failed", (unsigned long long)w->local_step);
                if (w->step_err) {
                        /* a shard was lost or restarted: wait for it, re-read the values, carry on */
                        log_warning("step %llu: %s; re-reading the parameters", (unsigned long long)w->local_step, w->step_msg);
                        wait_all(w);
                        if ((r = pull_all(w)) < 0)
                                return r;
                        continue;
                }
                if (w->loss_log)
                        trainer_log_loss(w->loss_log, w->local_step, loss);
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
        wait_all(w);
        return 0;
}

/* ---- set-up ---- */

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
        if ((r = backend_cpu_new(cfg->training.threads, &w->be)) < 0)
                return log_error_errno(r, "cannot create the CPU backend");
        log_info("backend %s, %u thread(s)", backend_name(w->be), cfg->training.threads);
        if ((r = model_new(&cfg->model, w->be, cfg->training.batch_size, &w->m)) < 0)
                return log_error_errno(r, "cannot build the model");
        if (model_input_size(w->m) != w->train->dim || dataset_max_label(w->train) >= model_n_classes(w->m))
                return log_error_errno(EINVAL, "the training data (%u values, labels up to %u) do not fit the model (input %u, %u classes)",
                                       w->train->dim, dataset_max_label(w->train), model_input_size(w->m), model_n_classes(w->m));
        if ((r = shard_iter_new(w->train, w->index, w->n_workers, cfg->training.seed, &w->it)) < 0)
                return log_error_errno(r, "cannot shard the data");
        if ((r = job_layout_new(cfg, w->m, &w->L)) < 0 || (r = ps_client_new(cfg, w->L, w->args.task_name, &w->pc)) < 0)
                return log_error_errno(r, "cannot set up the ps clients");
        if ((r = rpc_channel_new(cfg->cluster.chief[0].addr, "chief:0", &w->chief)) < 0)
                return log_error_errno(r, "cannot set up the chief's channel");
        if ((r = rpc_batch_new(&w->batch)) < 0)
                return r;
        w->x = malloc((size_t)cfg->training.batch_size * w->train->dim * sizeof(float));
        w->y = malloc(cfg->training.batch_size);
        /* which parts each layer pushes to each shard */
        uint32_t S = w->L->n_shards;
        w->n_layers = cfg->model.n_layers;
        w->lparts = calloc((size_t)w->n_layers * S, sizeof(*w->lparts));
        w->lcount = calloc((size_t)w->n_layers * S, sizeof(*w->lcount));
        w->pending = calloc((size_t)w->n_layers * S, sizeof(*w->pending));
        if (!w->x || !w->y || !w->lparts || !w->lcount || !w->pending)
                return log_error_errno(ENOMEM, "out of memory");
        w->count_layer = UINT32_MAX;
        for (uint32_t p = 0; p < w->L->plan->n_parts; p++) {
                const struct placement_part *pp = &w->L->plan->parts[p];
                uint32_t layer = w->L->vars[pp->var].layer, k = layer * S + pp->shard;
                uint32_t *n = realloc(w->lparts[k], (w->lcount[k] + 1) * sizeof(*n));
                if (!n)
                        return log_error_errno(ENOMEM, "out of memory");
                n[w->lcount[k]++] = p;
                w->lparts[k] = n;
                if (pp->shard == 0 && (w->count_layer == UINT32_MAX || layer < w->count_layer))
                        w->count_layer = layer;
        }
        if (w->args.loss_log) {
                w->loss_log = fopen(w->args.loss_log, "we");
                if (!w->loss_log)
                        return log_error_errno(errno, "cannot open --loss-log \"%s\"", w->args.loss_log);
        }
        return 0;
}

static void done(struct worker *w) {
        rpc_server_free(w->server);
        rpc_batch_free(w->batch);
        for (uint32_t i = 0; w->lparts && i < w->n_layers * w->L->n_shards; i++)
                free(w->lparts[i]);
        free(w->lparts);
        free(w->lcount);
        free(w->pending);
        ps_client_free(w->pc);
        rpc_channel_free(w->chief);
        job_layout_free(w->L);
        shard_iter_free(w->it);
        dataset_free(w->train);
        model_free(w->m);
        backend_free(w->be);
        free(w->x);
        free(w->y);
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
        if (build(&w) < 0)
                goto out;

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
        r = join(&w);
        if (r == -EPERM) {
                ret = CONFIG_EX_CONFIG;
                goto out;
        }
        if (r == -ECANCELED) {
                ret = 0;
                goto out;
        }
        if (r < 0 || (r = pull_all(&w)) < 0)
                goto out;
        if (w.global_step >= w.cfg->training.max_steps) {
                log_info("the job is already at global_step %llu of %llu: nothing to do",
                         (unsigned long long)w.global_step, (unsigned long long)w.cfg->training.max_steps);
        } else if ((r = train(&w)) < 0) {
                goto out;
        }
        set_state(&w, "done: %llu local steps, global_step %llu", (unsigned long long)w.local_step,
                  (unsigned long long)w.global_step);
        report(&w, "done");
        log_info_step(w.global_step, "done: %llu local steps, loss %.4f", (unsigned long long)w.local_step, w.last_loss);
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
