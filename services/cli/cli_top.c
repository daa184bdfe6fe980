/* psfleet top: a live view of a job's workers and shards. Each refresh asks the chief for its
 * JobStatus and, all at once, every shard for its ShardStatus and every worker for its WorkerStatus;
 * rates come from the difference to the previous refresh, and stragglers are marked by the definition
 * in cli_top.h. On a terminal the view is redrawn in place; otherwise one block per refresh. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_json.h"
#include "cli_opt.h"
#include "cli_top.h"
#include "cli_util.h"
#include "commands.h"
#include "job.h"
#include "rpc.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"
#include "psfleet/v1/supervisor.pb-c.h"
#include "psfleet/v1/worker.pb-c.h"

/* ---- the arithmetic (cli_top.h) ---- */

double top_rate(uint64_t before, uint64_t after, uint64_t dt_us) {
        if (!dt_us || after < before)
                return NAN;
        return (double)(after - before) / ((double)dt_us / 1e6);
}

double top_worker_rate(const struct top_report *before, const struct top_report *after) {
        if (!after->reported)
                return NAN;
        if (before && before->reported && after->last_report_us > before->last_report_us &&
            after->local_step >= before->local_step)
                return top_rate(before->local_step, after->local_step, after->last_report_us - before->last_report_us);
        if (after->examples && after->local_step && after->examples_per_s >= 0)
                return after->examples_per_s * (double)after->local_step / (double)after->examples;
        return NAN;
}

/* The k-th smallest (from 0) of the finite values at(ctx, 0..n); counted, not sorted, so nothing is
 * allocated (a job has at most some thousands of workers). */
static double kth_finite(size_t n, const void *ctx, double (*at)(const void *, size_t), size_t k) {
        for (size_t i = 0; i < n; i++) {
                double x = at(ctx, i);
                if (!isfinite(x))
                        continue;
                size_t less = 0, leq = 0;
                for (size_t j = 0; j < n; j++) {
                        double y = at(ctx, j);
                        less += isfinite(y) && y < x;
                        leq += isfinite(y) && y <= x;
                }
                if (less <= k && k < leq)
                        return x;
        }
        return NAN;
}

static double median_by(size_t n, const void *ctx, double (*at)(const void *, size_t), size_t *count) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
                m += isfinite(at(ctx, i)) != 0;
        if (count)
                *count = m;
        if (!m)
                return NAN;
        return (kth_finite(n, ctx, at, (m - 1) / 2) + kth_finite(n, ctx, at, m / 2)) / 2;
}

static double at_array(const void *ctx, size_t i) {
        return ((const double *)ctx)[i];
}

static double at_training_rate(const void *ctx, size_t i) {
        const struct top_worker *w = (const struct top_worker *)ctx + i;
        return w->training ? w->steps_per_s : NAN;
}

static double at_interval(const void *ctx, size_t i) {
        const struct top_worker *w = (const struct top_worker *)ctx + i;
        return w->training && w->report_interval_s > 0 ? w->report_interval_s : NAN;
}

double top_median(const double *v, size_t n) {
        return median_by(n, v, at_array, NULL);
}

double top_stragglers(struct top_worker *w, size_t n) {
        size_t known;
        double median = median_by(n, w, at_training_rate, &known);
        double interval = median_by(n, w, at_interval, NULL);
        if (known < 2)
                median = NAN;
        for (size_t i = 0; i < n; i++) {
                struct top_worker *x = &w[i];
                x->straggler = TOP_OK;
                if (!x->training)
                        continue;
                /* silent first: a worker that stopped reporting still shows its last, healthy rate */
                double own = x->report_interval_s > 0 ? x->report_interval_s : interval;
                if (isfinite(own) && isfinite(x->age_s) && x->age_s > fmax(TOP_SILENT_FACTOR * own, TOP_SILENT_MIN_S))
                        x->straggler = TOP_SILENT;
                else if (isfinite(median) && isfinite(x->steps_per_s) && x->steps_per_s < TOP_SLOW_FRACTION * median)
                        x->straggler = TOP_SLOW;
        }
        return median;
}

const char *top_straggler_name(enum top_straggler s) {
        return s == TOP_SLOW ? "slow" : s == TOP_SILENT ? "silent" : NULL;
}

/* ---- samples: the chief's status, and every shard's and worker's own ---- */

#define M_STATUS "/psfleet.v1.Supervisor/GetStatus"
#define M_SHARD "/psfleet.v1.ParameterServer/GetShardStatus"
#define M_WORKER "/psfleet.v1.Worker/GetWorkerStatus"

/* One node's own answer. */
struct answer {
        ProtobufCMessage *m;    /* a ShardStatus or WorkerStatus; NULL: none (err says why) */
        char err[512];
};

struct sample {
        uint64_t mono_us;
        Psfleet__V1__JobStatus *js;
        struct answer *a;       /* (js->n_nodes) in the order of js->nodes */
};

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
        interrupted = sig;
}

struct top {
        char *chief;                    /* its address (owned) */
        uint64_t interval_us, timeout_ms;
        bool json, once, tty;
        struct rpc_channel *chief_ch;
        struct rpc_channel **ch;        /* (n_ch) per node of the status, made at the first sample */
        size_t n_ch;
};

static void sample_clear(struct sample *s) {
        for (size_t i = 0; s->js && s->a && i < s->js->n_nodes; i++)
                if (s->a[i].m)
                        protobuf_c_message_free_unpacked(s->a[i].m, NULL);
        free(s->a);
        if (s->js)
                psfleet__v1__job_status__free_unpacked(s->js, NULL);
        *s = (struct sample){0};
}

static bool is_task(const char *task, const char *role) {
        size_t n = strlen(role);
        return task && strncmp(task, role, n) == 0 && task[n] == ':';
}

/* A channel per node, named by its task (under mutual TLS the name is whose certificate to expect).
 * Made once: the cluster of a job does not change while it runs. */
static int node_channels(struct top *t, const Psfleet__V1__JobStatus *js, char *err, size_t errlen) {
        if (t->ch)
                return t->n_ch == js->n_nodes ? 0 : errf(err, errlen, -EPROTO, "the chief's list of nodes changed");
        t->ch = calloc(js->n_nodes ? js->n_nodes : 1, sizeof(*t->ch));
        if (!t->ch)
                return errf(err, errlen, -ENOMEM, "out of memory");
        t->n_ch = js->n_nodes;
        for (size_t i = 0; i < js->n_nodes; i++) {
                const Psfleet__V1__NodeStatus *n = js->nodes[i];
                if (!(is_task(n->task, "ps") || is_task(n->task, "worker")) || !n->address || !*n->address)
                        continue;
                int r = rpc_channel_new(n->address, n->task, &t->ch[i]);
                if (r < 0)
                        return errf(err, errlen, r, "cannot create a channel to %s (\"%s\"): %s", n->task, n->address,
                                    strerror(-r));
        }
        return 0;
}

/* A sample's first half: the chief's status. 0, or -errno with the call's error in err. */
static int ask_chief(struct top *t, struct sample *s, char *err, size_t errlen) {
        Psfleet__V1__StatusRequest q = PSFLEET__V1__STATUS_REQUEST__INIT;
        ProtobufCMessage *m;
        int r = rpc_call_msg(t->chief_ch, M_STATUS, &q.base, &psfleet__v1__job_status__descriptor, t->timeout_ms,
                             false, &m, err, errlen);
        if (r < 0)
                return r;
        s->mono_us = mono_us();
        s->js = (Psfleet__V1__JobStatus *)m;
        return 0;
}

/* Its second half: every shard and worker the status lists, in parallel, each bounded by the timeout;
 * a node's failure is in its answer. Returns 0, or -errno with err when none could be asked. */
static int ask_nodes(struct top *t, struct sample *s, char *err, size_t errlen) {
        size_t n = s->js->n_nodes;
        int r;
        if (!(s->a = calloc(n ? n : 1, sizeof(*s->a))))
                return errf(err, errlen, -ENOMEM, "out of memory");
        if ((r = node_channels(t, s->js, err, errlen)) < 0)
                return r;
        struct rpc_batch *b;
        struct rpc_pending **p = calloc(n ? n : 1, sizeof(*p));
        if (!p || (r = rpc_batch_new(&b)) < 0) {
                free(p);
                return errf(err, errlen, -ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < n; i++) {
                if (!t->ch[i]) {
                        snprintf(s->a[i].err, sizeof(s->a[i].err), "the chief knows no address of it");
                        continue;
                }
                bool ps = is_task(s->js->nodes[i]->task, "ps");
                Psfleet__V1__ShardStatusRequest sq = PSFLEET__V1__SHARD_STATUS_REQUEST__INIT;
                Psfleet__V1__WorkerStatusRequest wq = PSFLEET__V1__WORKER_STATUS_REQUEST__INIT;
                if ((r = rpc_batch_start(b, t->ch[i], ps ? M_SHARD : M_WORKER, wire_pack(ps ? &sq.base : &wq.base),
                                         t->timeout_ms, false, &p[i])) < 0)
                        snprintf(s->a[i].err, sizeof(s->a[i].err), "%s", strerror(-r));
        }
        for (size_t i = 0; i < n; i++) {
                if (!p[i])
                        continue;
                struct rpc_result *res = rpc_batch_wait(b, p[i]);
                bool ps = is_task(s->js->nodes[i]->task, "ps");
                if (res->err < 0)
                        snprintf(s->a[i].err, sizeof(s->a[i].err), "%s", res->message);
                else if (wire_unpack(res->reply, ps ? &psfleet__v1__shard_status__descriptor
                                                    : &psfleet__v1__worker_status__descriptor, &s->a[i].m) < 0)
                        snprintf(s->a[i].err, sizeof(s->a[i].err), "its reply does not parse");
                rpc_batch_release(b, p[i]);
        }
        rpc_batch_free(b);
        free(p);
        return 0;
}

/* ---- one view: the rates between two samples ---- */

struct view_worker {
        const Psfleet__V1__NodeStatus *node;    /* the chief's word */
        const Psfleet__V1__WorkerStatus *own;   /* the worker's own; NULL: no answer */
        const char *err;
        struct top_worker judged;
        double examples_per_s;          /* steps/s times the examples of its steps; NAN: unknown */
};

struct view_shard {
        const Psfleet__V1__NodeStatus *node;
        const Psfleet__V1__ShardStatus *now;    /* NULL: no answer (err) */
        const char *err;
        double pushes_per_s, in_per_s, out_per_s;   /* bytes */
        double apply_ms;                /* per push, over the interval; NAN: no push */
        double busy;                    /* applying time per second of the interval, summed over psd's threads
                                         * (a shared-memory link has one each): may exceed 1 */
};

struct view {
        const Psfleet__V1__JobStatus *js;
        struct view_worker *w;
        struct view_shard *s;
        size_t n_w, n_s;
        double median, dt_s;
};

static struct top_report report_of(const Psfleet__V1__NodeStatus *n) {
        return (struct top_report){.reported = n->last_report_us != 0, .local_step = n->local_step,
                                   .examples = n->examples, .examples_per_s = n->examples_per_s,
                                   .last_report_us = n->last_report_us};
}

static bool state_is(const char *state, const char *word) {
        return state && strncmp(state, word, strlen(word)) == 0;
}

/* The node of the same task in an earlier sample (the list keeps its order, so usually at i). */
static size_t find_node(const struct sample *s, size_t i, const char *task) {
        if (!s->js)
                return SIZE_MAX;
        if (i < s->js->n_nodes && strcmp(s->js->nodes[i]->task, task) == 0)
                return i;
        for (size_t j = 0; j < s->js->n_nodes; j++)
                if (strcmp(s->js->nodes[j]->task, task) == 0)
                        return j;
        return SIZE_MAX;
}

/* Fills v from cur and prev (prev->js NULL: the first sample, rates from the workers' own word).
 * Returns 0 or -ENOMEM. */
static int view_make(struct view *v, const struct sample *prev, const struct sample *cur) {
        const Psfleet__V1__JobStatus *js = cur->js;
        *v = (struct view){.js = js, .median = NAN, .dt_s = prev->js ? (double)(cur->mono_us - prev->mono_us) / 1e6 : 0};
        v->w = calloc(js->n_nodes ? js->n_nodes : 1, sizeof(*v->w));
        v->s = calloc(js->n_nodes ? js->n_nodes : 1, sizeof(*v->s));
        if (!v->w || !v->s)
                return -ENOMEM;
        struct top_worker *judged = calloc(js->n_nodes ? js->n_nodes : 1, sizeof(*judged));
        if (!judged)
                return -ENOMEM;
        uint64_t now = now_us(), dt = prev->js ? cur->mono_us - prev->mono_us : 0;
        bool training = js->state == PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING;
        for (size_t i = 0; i < js->n_nodes; i++) {
                const Psfleet__V1__NodeStatus *n = js->nodes[i];
                size_t j = find_node(prev, i, n->task);
                const Psfleet__V1__NodeStatus *pn = j != SIZE_MAX ? prev->js->nodes[j] : NULL;
                if (is_task(n->task, "worker")) {
                        struct view_worker *w = &v->w[v->n_w];
                        w->node = n;
                        w->own = (const Psfleet__V1__WorkerStatus *)cur->a[i].m;
                        w->err = cur->a[i].err;
                        struct top_report a = report_of(n), b = pn ? report_of(pn) : (struct top_report){0};
                        struct top_worker *x = &judged[v->n_w++];
                        x->training = training && a.reported && !state_is(n->state, "done") &&
                                      !state_is(n->state, "diverged");
                        x->steps_per_s = top_worker_rate(pn ? &b : NULL, &a);
                        x->age_s = a.reported ? (now > a.last_report_us ? (double)(now - a.last_report_us) / 1e6 : 0)
                                              : NAN;
                        x->report_interval_s = (double)n->report_interval_us / 1e6;
                        /* the same window as steps/s (the worker's own figure is of its last report's) */
                        w->examples_per_s = a.local_step ? x->steps_per_s * (double)a.examples / (double)a.local_step
                                                         : NAN;
                } else if (is_task(n->task, "ps")) {
                        struct view_shard *s = &v->s[v->n_s++];
                        const Psfleet__V1__ShardStatus *c = (const Psfleet__V1__ShardStatus *)cur->a[i].m,
                                                       *p = pn ? (const Psfleet__V1__ShardStatus *)prev->a[j].m : NULL;
                        s->node = n;
                        s->now = c;
                        s->err = cur->a[i].err;
                        s->pushes_per_s = s->in_per_s = s->out_per_s = s->apply_ms = s->busy = NAN;
                        if (c && p && c->incarnation == p->incarnation) {
                                s->pushes_per_s = top_rate(p->pushes, c->pushes, dt);
                                s->in_per_s = top_rate(p->bytes_in, c->bytes_in, dt);
                                s->out_per_s = top_rate(p->bytes_out, c->bytes_out, dt);
                                s->busy = top_rate(p->apply_us, c->apply_us, dt) / 1e6;
                                if (c->pushes > p->pushes && c->apply_us >= p->apply_us)
                                        s->apply_ms = (double)(c->apply_us - p->apply_us) / 1e3 /
                                                      (double)(c->pushes - p->pushes);
                        }
                }
        }
        v->median = top_stragglers(judged, v->n_w);
        for (size_t i = 0; i < v->n_w; i++)
                v->w[i].judged = judged[i];
        free(judged);
        return 0;
}

static void view_free(struct view *v) {
        free(v->w);
        free(v->s);
}

/* ---- output ---- */

static json_t *jnum(double x) {
        return isfinite(x) ? json_real(x) : json_null();
}

/* A shard's embedding tables: rows against their bound, memory, evictions, admission. */
static json_t *tables_json(const Psfleet__V1__ShardStatus *st) {
        json_t *a = json_array();
        for (size_t k = 0; k < st->n_tables; k++) {
                const Psfleet__V1__SparseTableStatus *t = st->tables[k];
                json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "name",
                                      t->name ? t->name : "", "rows", (json_int_t)t->rows, "max_rows",
                                      (json_int_t)t->max_rows, "bytes", (json_int_t)t->bytes,
                                      "evicted_age", (json_int_t)t->evicted, "evicted_limit",
                                      (json_int_t)t->evicted_limit, "admitted", (json_int_t)t->admitted,
                                      "admit_pending", (json_int_t)t->admit_pending, "grads_dropped",
                                      (json_int_t)t->grads_dropped);
                if (o && (t->disk_rows || t->disk_spills || t->disk_errors))
                        json_object_update_new(o, json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "disk_rows",
                                                            (json_int_t)t->disk_rows, "disk_bytes",
                                                            (json_int_t)t->disk_bytes, "disk_reads",
                                                            (json_int_t)t->disk_reads, "disk_spills",
                                                            (json_int_t)t->disk_spills, "disk_errors",
                                                            (json_int_t)t->disk_errors, "disk_refused",
                                                            (json_int_t)t->disk_refused));
                json_array_append_new(a, o);
        }
        return a;
}

/* ps.replicas 2: the shard's primary (the psd that answered), backup, epoch and how far the backup is. */
static json_t *replica_json(const Psfleet__V1__NodeStatus *n, const Psfleet__V1__ReplicaStatus *r) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:b, s:I, s:I, s:I, s:I, s:I, s:b, s:I, s:I, s:b, s:I}", "primary",
                              n->address ? n->address : "", "backup", r->peer ? r->peer : "", "epoch",
                              (json_int_t)r->epoch, "replicating", r->replicating, "seq", (json_int_t)r->seq, "acked",
                              (json_int_t)r->acked, "lag_us", (json_int_t)r->lag_us, "fenced_writes",
                              (json_int_t)r->fenced_writes, "dropped", (json_int_t)r->dropped, "awaiting_chief",
                              r->awaiting_chief, "bytes", (json_int_t)r->bytes, "values", (json_int_t)r->values,
                              "ring", r->ring, "ring_bytes", (json_int_t)r->ring_bytes);
        if (o)
                json_object_set_new(o, "last_error", r->last_error && *r->last_error ? json_string(r->last_error)
                                                                                      : json_null());
        return o;
}

static void print_json(const struct view *v) {
        json_t *o = json_object(), *ws = json_array(), *ss = json_array(), *st = json_array();
        json_object_set_new(o, "job", json_string(v->js->job ? v->js->job : ""));
        json_object_set_new(o, "state", json_string(job_state_name(v->js->state)));
        json_object_set_new(o, "global_step", json_integer((json_int_t)v->js->global_step));
        json_object_set_new(o, "max_steps", json_integer((json_int_t)v->js->max_steps));
        json_object_set_new(o, "interval_s", jnum(v->dt_s));
        json_object_set_new(o, "median_steps_per_s", jnum(v->median));
        for (size_t i = 0; i < v->n_w; i++) {
                const struct view_worker *w = &v->w[i];
                const char *why = top_straggler_name(w->judged.straggler);
                json_t *x = json_object();
                json_object_set_new(x, "task", json_string(w->node->task));
                json_object_set_new(x, "state", json_string(w->own && w->own->state ? w->own->state
                                                            : w->node->state ? w->node->state : ""));
                json_object_set_new(x, "local_step", json_integer((json_int_t)w->node->local_step));
                json_object_set_new(x, "steps_per_s", jnum(w->judged.steps_per_s));
                json_object_set_new(x, "examples_per_s", jnum(w->examples_per_s));
                json_object_set_new(x, "last_report_age_s", jnum(w->judged.age_s));
                json_object_set_new(x, "report_interval_s",
                                    jnum(w->judged.report_interval_s > 0 ? w->judged.report_interval_s : NAN));
                json_object_set_new(x, "waiting_for", w->own ? cli_waiting_for_json(w->own->waiting_for) : json_null());
                json_object_set_new(x, "error", w->own ? json_null() : json_string(w->err));
                json_object_set_new(x, "straggler", json_boolean(why != NULL));
                json_object_set_new(x, "straggler_reason", why ? json_string(why) : json_null());
                json_array_append_new(ws, x);
                if (why)
                        json_array_append_new(st, json_string(w->node->task));
        }
        for (size_t i = 0; i < v->n_s; i++) {
                const struct view_shard *s = &v->s[i];
                json_t *x = json_object();
                json_object_set_new(x, "task", json_string(s->node->task));
                json_object_set_new(x, "address", json_string(s->node->address ? s->node->address : ""));
                json_object_set_new(x, "error", s->now ? json_null() : json_string(s->err));
                json_object_set_new(x, "initialized", json_boolean(s->now && s->now->initialized));
                json_object_set_new(x, "pushes", s->now ? json_integer((json_int_t)s->now->pushes) : json_null());
                json_object_set_new(x, "pushes_per_s", jnum(s->pushes_per_s));
                json_object_set_new(x, "bytes_in_per_s", jnum(s->in_per_s));
                json_object_set_new(x, "bytes_out_per_s", jnum(s->out_per_s));
                json_object_set_new(x, "apply_ms_per_push", jnum(s->apply_ms));
                json_object_set_new(x, "busy", jnum(s->busy));
                json_object_set_new(x, "rejected", s->now ? json_integer((json_int_t)s->now->rejected) : json_null());
                json_object_set_new(x, "clipped", s->now ? json_integer((json_int_t)s->now->clipped) : json_null());
                json_object_set_new(x, "shared_memory_links",
                                    s->now ? json_integer((json_int_t)s->now->shared_memory_links) : json_null());
                if (s->now && s->now->replica)
                        json_object_set_new(x, "replica", replica_json(s->node, s->now->replica));
                if (s->now) {
                        json_object_set_new(x, "memory_limit_bytes", json_integer((json_int_t)s->now->memory_limit_bytes));
                        json_object_set_new(x, "memory_planned_bytes",
                                            json_integer((json_int_t)s->now->memory_planned_bytes));
                        json_object_set_new(x, "tables", tables_json(s->now));
                }
                json_array_append_new(ss, x);
        }
        json_object_set_new(o, "workers", ws);
        json_object_set_new(o, "shards", ss);
        json_object_set_new(o, "stragglers", st);
        cli_print_json(stdout, o);
}

/* One line per table of every shard that has any, and the shard's memory against its limit. */
static void print_tables(const struct view *v) {
        bool any = false;
        for (size_t i = 0; i < v->n_s; i++)
                any = any || (v->s[i].now && v->s[i].now->n_tables);
        if (!any)
                return;
        printf("%-11s %-12s %11s %11s %9s %9s %9s %10s %10s %10s\n", "SHARD", "TABLE", "ROWS", "MAX_ROWS", "MIB",
               "EVICT_AGE", "EVICT_LIM", "ADMITTED", "PENDING", "DROPPED");
        for (size_t i = 0; i < v->n_s; i++) {
                const Psfleet__V1__ShardStatus *st = v->s[i].now;
                for (size_t k = 0; st && k < st->n_tables; k++) {
                        const Psfleet__V1__SparseTableStatus *t = st->tables[k];
                        char cap[24];
                        if (t->max_rows)
                                snprintf(cap, sizeof(cap), "%llu", (unsigned long long)t->max_rows);
                        else
                                snprintf(cap, sizeof(cap), "-");
                        printf("%-11s %-12s %11llu %11s %9.1f %9llu %9llu %10llu %10llu %10llu\n", v->s[i].node->task,
                               t->name ? t->name : "", (unsigned long long)t->rows, cap, (double)t->bytes / (1 << 20),
                               (unsigned long long)t->evicted, (unsigned long long)t->evicted_limit,
                               (unsigned long long)t->admitted, (unsigned long long)t->admit_pending,
                               (unsigned long long)t->grads_dropped);
                        if (t->disk_rows || t->disk_spills || t->disk_errors)
                                printf("%-11s %-12s disk tier: %llu rows, %.1f MiB, %llu read back, %llu spilled, "
                                       "%llu errors, %llu new rows refused\n", "", "", (unsigned long long)t->disk_rows,
                                       (double)t->disk_bytes / (1 << 20), (unsigned long long)t->disk_reads,
                                       (unsigned long long)t->disk_spills, (unsigned long long)t->disk_errors,
                                       (unsigned long long)t->disk_refused);
                }
                uint64_t held = 0;
                for (size_t k = 0; st && k < st->n_tables; k++)
                        held += st->tables[k]->bytes;
                if (st && st->memory_limit_bytes)
                        printf("%-11s memory: tables hold %.1f MiB; plan %.1f MiB of a limit of %.1f MiB "
                               "(ps.memory_limit_bytes)\n", v->s[i].node->task, (double)held / (1 << 20),
                               (double)st->memory_planned_bytes / (1 << 20), (double)st->memory_limit_bytes / (1 << 20));
        }
}

/* "12.3", or "-" for unknown. */
static const char *fmt(double x, const char *f, char *buf, size_t len) {
        if (!isfinite(x))
                snprintf(buf, len, "-");
        else
                snprintf(buf, len, f, x);
        return buf;
}

/* ps.replicas 2: one line per shard that has a backup, as its primary answered. */
static void print_replicas(const struct view *v) {
        bool any = false;
        for (size_t i = 0; i < v->n_s; i++)
                any = any || (v->s[i].now && v->s[i].now->replica);
        if (!any)
                return;
        printf("%-11s %-21s %-21s %6s %-12s %4s %9s %8s %7s %7s %7s\n", "SHARD", "PRIMARY", "BACKUP", "EPOCH",
               "REPLICATION", "VIA", "BEHIND", "LAG MS", "B/VALUE", "FENCED", "DROPPED");
        for (size_t i = 0; i < v->n_s; i++) {
                const Psfleet__V1__ShardStatus *st = v->s[i].now;
                if (!st || !st->replica)
                        continue;
                const Psfleet__V1__ReplicaStatus *r = st->replica;
                const char *state = r->replicating ? "replicated" : r->awaiting_chief ? "AWAIT CHIEF" : "UNREPLICATED";
                char per[16];   /* bytes a forwarded value: 4 in float32, about 1 for int8 pushes */
                fmt(r->values ? (double)r->bytes / (double)r->values : NAN, "%.2f", per, sizeof(per));
                /* VIA: a ring in shared memory to a backup on the primary's host, or Replicate calls */
                printf("%-11s %-21s %-21s %6llu %-12s %4s %9llu %8.2f %7s %7llu %7llu%s%s\n", v->s[i].node->task,
                       v->s[i].node->address ? v->s[i].node->address : "", r->peer && *r->peer ? r->peer : "-",
                       (unsigned long long)r->epoch, state, !r->replicating ? "-" : r->ring ? "ring" : "rpc",
                       (unsigned long long)(r->seq > r->acked ? r->seq - r->acked : 0), (double)r->lag_us / 1e3,
                       per, (unsigned long long)r->fenced_writes, (unsigned long long)r->dropped,
                       r->last_error && *r->last_error ? "  " : "", r->last_error ? r->last_error : "");
        }
}

static void print_text(const struct top *t, const struct view *v) {
        char a[32], b[32], c[32], d[32], e[32];
        const Psfleet__V1__JobStatus *js = v->js;
        if (t->tty)
                printf("\033[H\033[J");   /* home, clear: the view is redrawn in place */
        printf("job %s: %s, step %llu/%llu, %zu workers, %zu shards (every %.1f s; stragglers: below %.1f x the "
               "median steps/s, or silent)\n",
               js->job ? js->job : "?", job_state_name(js->state), (unsigned long long)js->global_step,
               (unsigned long long)js->max_steps, v->n_w, v->n_s, (double)t->interval_us / 1e6, TOP_SLOW_FRACTION);
        printf("%-11s %10s %9s %9s %10s  %s\n", "WORKER", "STEP", "STEPS/S", "EX/S", "REPORTED", "STATE");
        for (size_t i = 0; i < v->n_w; i++) {
                const struct view_worker *w = &v->w[i];
                const char *why = top_straggler_name(w->judged.straggler);
                const char *state = w->own && w->own->state ? w->own->state : w->node->state ? w->node->state : "";
                printf("%-11s %10llu %9s %9s %10s  %s", w->node->task, (unsigned long long)w->node->local_step,
                       fmt(w->judged.steps_per_s, "%.1f", a, sizeof(a)),
                       fmt(w->examples_per_s, "%.0f", b, sizeof(b)),
                       fmt(w->judged.age_s, "%.1fs ago", c, sizeof(c)), state);
                if (w->own && w->own->waiting_for)
                        printf(" (waiting for %s%s%s)", w->own->waiting_for->peer ? w->own->waiting_for->peer : "?",
                               w->own->waiting_for->last_error && *w->own->waiting_for->last_error ? ": " : "",
                               w->own->waiting_for->last_error ? w->own->waiting_for->last_error : "");
                if (!w->own)
                        printf(" (no answer: %s)", w->err);
                if (why)
                        printf("  <- STRAGGLER (%s)", why);
                printf("\n");
        }
        printf("%-11s %10s %9s %9s %10s %8s %9s %9s\n", "SHARD", "PUSHES/S", "IN MB/S", "OUT MB/S", "APPLY MS", "BUSY",
               "REJECTED", "CLIPPED");
        for (size_t i = 0; i < v->n_s; i++) {
                const struct view_shard *s = &v->s[i];
                if (!s->now) {
                        printf("%-11s no answer: %s\n", s->node->task, s->err);
                        continue;
                }
                printf("%-11s %10s %9s %9s %10s %8s %9llu %9llu%s\n", s->node->task,
                       fmt(s->pushes_per_s, "%.1f", a, sizeof(a)), fmt(s->in_per_s / 1e6, "%.2f", b, sizeof(b)),
                       fmt(s->out_per_s / 1e6, "%.2f", c, sizeof(c)), fmt(s->apply_ms, "%.3f", d, sizeof(d)),
                       fmt(s->busy * 100, "%.0f%%", e, sizeof(e)), (unsigned long long)s->now->rejected,
                       (unsigned long long)s->now->clipped, s->now->initialized ? "" : "  (not initialized)");
        }
        print_replicas(v);
        print_tables(v);
        if (!t->tty)
                printf("\n");
        fflush(stdout);
}

/* ---- the command ---- */

static void top_help(FILE *f) {
        fprintf(f, "Usage: psfleet top (--job JOB.json | --address HOST:PORT) [OPTIONS]\n"
                   "\n"
                   "A live view of a job: per worker its steps/s, when it last reported and what it waits for;\n"
                   "per shard its pushes/s, bytes/s in and out and apply time. Stragglers are marked: a training\n"
                   "worker below 0.5 x the median steps/s of the workers, or one that has not reported for 3 of\n"
                   "its report intervals (and at least 2 s). Redrawn in place on a terminal; Ctrl-C ends it.\n"
                   "\n"
                   "  --address HOST:PORT  the chief's address\n"
                   "  --job JOB.json       the job file: its cluster's chief entry (TF_CONFIG's cluster, if set)\n"
                   CLI_IDENTITY_HELP
                   "  --interval-ms N      time between refreshes, and between --once's two samples (default 1000)\n"
                   "  --once               take two samples, print one view and exit\n"
                   "  --json               each view as one JSON object (workers[], shards[], stragglers[])\n"
                   "  --timeout-ms N       deadline of each call (default 2000)\n"
                   "\n"
                   "Exit status: 0 done (or Ctrl-C), 1 the chief could not be reached, 2 bad usage, 78 bad job file.\n");
}

/* Sleeps until `until` (mono µs), waking for a signal. */
static void nap_until(uint64_t until) {
        for (uint64_t now = mono_us(); now < until && !interrupted; now = mono_us()) {
                uint64_t left = until - now;
                usleep((useconds_t)(left < 50000 ? left : 50000));
        }
}

static int top_run(struct top *t) {
        struct sample prev = {0}, cur = {0};
        char err[1024];
        int ret = 0;
        for (bool first = true; !interrupted; first = false) {
                uint64_t next = mono_us() + t->interval_us;
                if (ask_chief(t, &cur, err, sizeof(err)) < 0) {
                        cli_error("cannot get the job's status from the chief at %s: %s", t->chief, err);
                        ret = 1;
                        break;
                }
                if (ask_nodes(t, &cur, err, sizeof(err)) < 0) {
                        cli_error("%s", err);
                        ret = 1;
                        break;
                }
                /* --once: the first sample only sets the baseline of the rates */
                if (!(t->once && first)) {
                        struct view v;
                        if (view_make(&v, &prev, &cur) < 0) {
                                view_free(&v);
                                cli_error("out of memory");
                                ret = 1;
                                break;
                        }
                        if (t->json)
                                print_json(&v);
                        else
                                print_text(t, &v);
                        view_free(&v);
                        if (t->once)
                                break;
                }
                sample_clear(&prev);
                prev = cur;
                cur = (struct sample){0};
                nap_until(next);
        }
        sample_clear(&prev);
        sample_clear(&cur);
        return ret;
}

int cmd_top(int argc, char **argv) {
        const char *address = NULL, *job = NULL;
        struct top t = {.interval_us = 1000 * 1000, .timeout_ms = 2000};
        uint64_t timeout_us = 2000 * 1000;
        const struct cli_opt opts[] = {
                CLI_FLAG("json", &t.json),
                CLI_FLAG("once", &t.once),
                CLI_CHIEF_OPTS(&address, &job),
                CLI_DURATION("interval-ms", &t.interval_us, 100, 3600000, 1000),
                CLI_DURATION("timeout-ms", &timeout_us, 1, 3600000, 1000),
                {},
        };
        const struct cli_args args = {.cmd = "top", .opts = opts, .help = top_help, .max_operands = 0};
        int first, r;
        if (!cli_args_parse(&args, argc, argv, &first, &r) || (r = cli_chief_address("top", address, job, &t.chief)))
                return r;
        t.timeout_ms = timeout_us / 1000;
        t.tty = isatty(STDOUT_FILENO) == 1 && !t.json;
        struct sigaction sa = {.sa_handler = on_signal};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        rpc_global_init();
        if ((r = rpc_channel_new(t.chief, "chief", &t.chief_ch)) < 0) {
                cli_error("cannot create a channel to \"%s\": %s", t.chief, strerror(-r));
                r = 1;
        } else {
                r = top_run(&t);
        }
        for (size_t i = 0; i < t.n_ch; i++)
                rpc_channel_free(t.ch[i]);
        free(t.ch);
        rpc_channel_free(t.chief_ch);
        free(t.chief);
        rpc_global_shutdown();
        return r;
}
