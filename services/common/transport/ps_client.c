/* The client of a job's ps shards: block transfers to and from the shards over gRPC (assign, pull,
 * status), and a worker's pushes, over gRPC or through shared memory with the shards on its host. */
#include "ps_client.h"
#include "ps_client-internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compress.h"
#include "log.h"
#include "metrics.h"
#include "optim.h"
#include "rpc.h"
#include "shmlink.h"
#include "tls.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"
#include "psfleet/v1/supervisor.pb-c.h"

int ps_client_new(const struct job_config *cfg, const struct job_layout *L, const char *task, struct ps_client **ret) {
        struct ps_client *pc = calloc(1, sizeof(*pc));
        if (!pc)
                return -ENOMEM;
        pc->cfg = cfg;
        pc->L = L;
        pc->deadline_ms = cfg->rpc.deadline_ms;
        snprintf(pc->task, sizeof(pc->task), "%s", task);
        pthread_mutex_init(&pc->mu, NULL);
        pthread_cond_init(&pc->cond, NULL);
        pc->shard = calloc(L->n_shards, sizeof(*pc->shard));
        if (!pc->shard) {
                ps_client_free(pc);
                return -ENOMEM;
        }
        for (uint32_t s = 0; s < L->n_shards; s++) {
                char name[32];
                snprintf(name, sizeof(name), "ps:%u", s);
                int r = rpc_channel_new(cfg->cluster.ps[s].addr, name, &pc->shard[s].ch);
                if (r < 0) {
                        ps_client_free(pc);
                        return r;
                }
        }
        *ret = pc;
        return 0;
}

struct ps_client *ps_client_free(struct ps_client *pc) {
        if (!pc)
                return NULL;
        if (pc->receiving) {
                atomic_store(&pc->stop, true);
                pthread_join(pc->receiver, NULL);
        }
        rpc_batch_free(pc->batch);   /* cancels the pushes still in flight */
        for (uint32_t i = 0; i < pc->n_fl; i++) {
                free((uint32_t *)pc->fl[i].g.parts);
                wire_in_free(pc->fl[i].reply);
                wire_in_free(pc->fl[i].held);
        }
        free(pc->fl);
        free(pc->residual);
        free(pc->compress);
        shmlink_free(pc->link);
        for (uint32_t s = 0; pc->shard && s < pc->L->n_shards; s++) {
                rpc_channel_free(pc->shard[s].ch);
                rpc_channel_free(pc->shard[s].alt);
        }
        free(pc->shard);
        pthread_cond_destroy(&pc->cond);
        pthread_mutex_destroy(&pc->mu);
        free(pc);
        return NULL;
}

void ps_client_caller_init(struct ps_client *pc, Psfleet__V1__Caller *c) {
        psfleet__v1__caller__init(c);
        c->fingerprint = pc->L->fingerprint;
        c->task = pc->task;
}

/* Appends part p of a block as a tensor named name[/suffix] of `dtype` (float32: lent unless copy). */
static int add_part(struct wire_out *o, const struct job_layout *L, uint32_t p, const float *block,
                    const char *suffix, uint32_t dtype, bool copy) {
        const struct placement_part *pp = &L->plan->parts[p];
        const struct job_var *v = &L->vars[pp->var];
        char name[300];
        if (suffix)
                snprintf(name, sizeof(name), "%s/%s", v->name, suffix);
        else
                snprintf(name, sizeof(name), "%s", v->name);
        uint64_t shape[2] = {pp->row_end - pp->row_begin, v->cols};
        const float *data = block + v->offset + (size_t)pp->row_begin * v->cols;
        size_t n = (size_t)shape[0] * shape[1];
        if (copy && dtype == WIRE_DTYPE_FLOAT32)
                return wire_out_tensor_copy(o, name, dtype, shape, 2, pp->row_begin, data, n * sizeof(float));
        return wire_out_tensor_f32(o, name, dtype, shape, 2, pp->row_begin, data, n, NULL, NULL);
}

/* Appends part p of the gradients compressed as dtype (INT8_BLOCKS or TOPK) with error feedback: the
 * part's residual is added before and keeps what the encoding dropped after (compress.h). The encoded
 * bytes are the message's: lent to gRPC and freed when it is done with them. */
static int add_part_ef(struct ps_client *pc, struct wire_out *o, uint32_t p, uint32_t dtype) {
        const struct job_layout *L = pc->L;
        const struct placement_part *pp = &L->plan->parts[p];
        const struct job_var *v = &L->vars[pp->var];
        uint64_t shape[2] = {pp->row_end - pp->row_begin, v->cols};
        size_t at = v->offset + (size_t)pp->row_begin * v->cols, n = (size_t)shape[0] * shape[1];
        uint8_t *buf = malloc(compress_max_size(dtype, n, pc->topk_k) + 1);
        if (!buf)
                return -ENOMEM;
        size_t nbytes = compress_ef(dtype, pc->topk_k, pc->grads + at, pc->residual + at, n, buf);
        return wire_out_tensor(o, v->name, dtype, shape, 2, pp->row_begin, buf, nbytes, free, buf);
}

/* Waits for the batch; the first failure (ours or a server's, with its message) becomes the result. */
int ps_client_batch_end(struct rpc_batch *b, int r, const char *what, char *err, size_t errlen) {
        int w = rpc_batch_wait_all(b);
        if (r < 0)
                errf(err, errlen, r, "%s: %s", what, strerror(-r));
        else if (w < 0) {
                const struct rpc_result *f = rpc_batch_first_error(b);
                r = w;
                errf(err, errlen, r, "%s", f ? f->message : strerror(-w));
        }
        rpc_batch_free(b);
        return r;
}

int ps_client_fan_out(struct ps_client *pc, struct rpc_batch *b, const char *method, bool wait_for_ready,
                      ps_client_build_fn build, void *ud, struct rpc_pending **pend) {
        Psfleet__V1__Caller caller;
        ps_client_caller_init(pc, &caller);
        for (uint32_t s = 0; s < pc->L->n_shards; s++) {
                grpc_byte_buffer *bb;
                struct rpc_pending *p = NULL;
                int r = build(pc, s, &caller, ud, &bb);
                if (r == 0)
                        r = rpc_batch_start(b, pc->shard[s].ch, method, bb, pc->deadline_ms, wait_for_ready, &p);
                if (pend)
                        pend[s] = p;
                if (r < 0)
                        return r;
        }
        return 0;
}

struct assign {
        const bool *which;
        const float *params;
        float *const *slots;
        uint64_t global_step;
};

/* Shard s's Assign: its parts of the blocks, with the optimizer's slots when a->slots. */
static int assign_build(struct ps_client *pc, uint32_t s, Psfleet__V1__Caller *caller, void *ud,
                        grpc_byte_buffer **bb) {
        const struct assign *a = ud;
        const struct job_layout *L = pc->L;
        if (a->which && !a->which[s])
                return 1;
        Psfleet__V1__AssignHeader h = PSFLEET__V1__ASSIGN_HEADER__INIT;
        h.caller = caller;
        h.global_step = a->global_step;
        h.with_slots = a->slots != NULL;
        struct wire_out *o;
        int r = wire_out_new(&o);
        if (r < 0)
                return r;
        wire_out_header(o, &h.base);
        for (uint32_t i = 0; i < L->shard_count[s] && r >= 0; i++) {
                uint32_t p = L->shard_parts[L->shard_first[s] + i];
                r = add_part(o, L, p, a->params, NULL, WIRE_DTYPE_FLOAT32, false);
                for (unsigned k = 0; a->slots && k < L->n_slots && r >= 0; k++)
                        r = add_part(o, L, p, a->slots[k], optim_slot_name(L->optimizer, k), WIRE_DTYPE_FLOAT32, false);
        }
        if (r >= 0)
                r = wire_out_finish(o, bb);
        wire_out_free(o);
        return r;
}

int ps_client_assign(struct ps_client *pc, const bool *which, const float *params, float *const *slots,
                     uint64_t global_step, char *err, size_t errlen) {
        struct assign a = {which, params, slots, global_step};
        struct rpc_batch *b;
        int r = rpc_batch_new(&b);
        if (r < 0)
                return r;
        r = ps_client_fan_out(pc, b, "/psfleet.v1.ParameterServer/Assign", true, assign_build, &a, NULL);
        return ps_client_batch_end(b, r, "assign", err, errlen);
}

/* Shard s's Pull: every part it holds, with the optimizer's slots when *(bool *)ud. */
static int pull_build(struct ps_client *pc, uint32_t s, Psfleet__V1__Caller *caller, void *ud,
                      grpc_byte_buffer **bb) {
        (void)pc;
        (void)s;
        Psfleet__V1__PullHeader h = PSFLEET__V1__PULL_HEADER__INIT;
        h.caller = caller;
        h.with_slots = *(const bool *)ud;
        Psfleet__V1__PullRequest q = PSFLEET__V1__PULL_REQUEST__INIT;
        q.header = &h;
        *bb = wire_pack(&q.base);
        return 0;
}

int ps_client_pull(struct ps_client *pc, float *params, float *const *slots, uint64_t *global_step_ret,
                   char *err, size_t errlen) {
        const struct job_layout *L = pc->L;
        struct rpc_batch *b;
        struct rpc_pending **pend = calloc(L->n_shards, sizeof(*pend));
        int r = pend ? rpc_batch_new(&b) : -ENOMEM;
        if (r < 0) {
                free(pend);
                return r;
        }
        bool with_slots = slots != NULL;
        /* a worker's values are replaced (its client pulls nothing else): an int8 change needs whole
         * values first */
        for (uint32_t g = 0; g < pc->n_fl; g++)
                pc->fl[g].answer_seq = 0;
        r = ps_client_fan_out(pc, b, "/psfleet.v1.ParameterServer/Pull", false, pull_build, &with_slots, pend);
        if (r >= 0)
                rpc_batch_wait_all(b);
        for (uint32_t s = 0; s < L->n_shards && r >= 0; s++) {
                struct rpc_result *res = rpc_pending_result(pend[s]);
                if (res->err) {
                        r = res->err;
                        errf(err, errlen, r, "%s", res->message);
                        /* ps.replicas 2: the shard's primary may have moved; the next pull goes there */
                        if (ps_client_find_primary(pc, s))
                                r = -EAGAIN;
                        break;
                }
                struct wire_in *in;
                char e2[256];
                r = wire_in_parse(res->reply, &in, e2, sizeof(e2));
                res->reply = NULL;
                if (r < 0) {
                        errf(err, errlen, r, "ps:%u: Pull reply: %s", s, e2);
                        break;
                }
                ProtobufCMessage *hm;
                r = wire_in_header(in, &psfleet__v1__pull_reply_header__descriptor, &hm);
                if (r >= 0) {
                        /* sync: the values are of this shard's step, which every shard reports */
                        for (uint32_t g = 0; g < pc->n_fl && pc->cfg->training.mode == MODE_SYNC; g++)
                                if (pc->fl[g].g.shard == s)
                                        pc->fl[g].version = ((Psfleet__V1__PullReplyHeader *)hm)->global_step;
                        if (s == 0) {
                                uint64_t gs = ((Psfleet__V1__PullReplyHeader *)hm)->global_step;
                                pthread_mutex_lock(&pc->mu);
                                pc->global_step = gs;
                                pthread_mutex_unlock(&pc->mu);
                                if (global_step_ret)
                                        *global_step_ret = gs;
                        }
                        protobuf_c_message_free_unpacked(hm, NULL);
                }
                for (size_t i = 0; i < in->n_tensors && r >= 0; i++) {
                        if (in->tensors[i].dtype == WIRE_DTYPE_INT8_DELTA)   /* changes: only a push's answer */
                                r = errf(err, errlen, -EPROTO, "ps:%u: Pull reply: tensor \"%s\" is int8 changes, "
                                         "not values", s, in->tensors[i].name);
                        else if ((r = wire_tensor_copy_in(&in->tensors[i], L, params, slots, e2, sizeof(e2))) < 0)
                                errf(err, errlen, r, "ps:%u: Pull reply: %s", s, e2);
                }
                wire_in_free(in);
        }
        rpc_batch_free(b);
        free(pend);
        return r;
}

int ps_client_status(struct ps_client *pc, uint32_t shard, void **status_ret, char *err, size_t errlen) {
        Psfleet__V1__ShardStatusRequest q = PSFLEET__V1__SHARD_STATUS_REQUEST__INIT;
        ProtobufCMessage *m;
        int r = rpc_call_msg(pc->shard[shard].ch, "/psfleet.v1.ParameterServer/GetShardStatus", &q.base,
                             &psfleet__v1__shard_status__descriptor, pc->deadline_ms, false, &m, err, errlen);
        if (r >= 0)
                *status_ret = m;
        return r;
}

const char *ps_client_addr(const struct ps_client *pc, uint32_t s, uint32_t which) {
        return which ? pc->cfg->cluster.ps_backup[s].addr : pc->cfg->cluster.ps[s].addr;
}

int ps_client_probe(struct ps_client *pc, uint32_t shard, uint64_t timeout_ms, void **status_ret, char *err,
                    size_t errlen) {
        return ps_client_probe_psd(pc, shard, pc->shard[shard].cur, timeout_ms, status_ret, err, errlen);
}

int ps_client_probe_psd(struct ps_client *pc, uint32_t shard, uint32_t which, uint64_t timeout_ms, void **status_ret,
                        char *err, size_t errlen) {
        Psfleet__V1__ShardStatusRequest q = PSFLEET__V1__SHARD_STATUS_REQUEST__INIT;
        struct rpc_channel **chp = which == pc->shard[shard].cur ? &pc->shard[shard].ch : &pc->shard[shard].alt;
        if (!*chp) {
                char name[32];
                snprintf(name, sizeof(name), "ps:%u", shard);
                int e = rpc_channel_new(ps_client_addr(pc, shard, which), name, chp);
                if (e < 0)
                        return errf(err, errlen, e, "ps:%u (%s): cannot make a channel", shard,
                                    ps_client_addr(pc, shard, which));
        }
        struct rpc_channel *ch = *chp;
        struct rpc_result res;
        int r = rpc_call(ch, "/psfleet.v1.ParameterServer/GetShardStatus", wire_pack(&q.base), timeout_ms, false, &res);
        if (r < 0) {
                const char *tail = strstr(res.message, rpc_status_name(res.status));
                errf(err, errlen, r, "%s (%s): %s", rpc_channel_name(ch), rpc_channel_target(ch), tail ? tail : res.message);
                /* gRPC backs off reconnecting (up to minutes) and fails calls fast meanwhile; a fresh
                 * channel notices a shard that has just come up at the next probe. */
                struct rpc_channel *fresh;
                if (rpc_channel_new(ps_client_addr(pc, shard, which), rpc_channel_name(ch), &fresh) >= 0) {
                        rpc_channel_free(ch);
                        *chp = fresh;
                }
        } else {
                ProtobufCMessage *m;
                r = wire_unpack(res.reply, &psfleet__v1__shard_status__descriptor, &m);
                if (r < 0)
                        errf(err, errlen, r, "%s (%s): reply does not parse", rpc_channel_name(ch), rpc_channel_target(ch));
                else
                        *status_ret = m;
        }
        rpc_result_clear(&res);
        return r;
}

int ps_client_stop(struct ps_client *pc, const char *reason) {
        struct rpc_batch *b;
        int r = rpc_batch_new(&b);
        if (r < 0)
                return r;
        for (uint32_t s = 0; s < pc->L->n_shards; s++) {
                Psfleet__V1__StopRequest q = PSFLEET__V1__STOP_REQUEST__INIT;
                q.reason = (char *)reason;
                struct rpc_pending *p;
                rpc_batch_start(b, pc->shard[s].ch, "/psfleet.v1.ParameterServer/Stop", wire_pack(&q.base), 5000, false, &p);
                /* ps.replicas 2: the shard's backup too (the chief probes both, so it has the channel) */
                if (pc->shard[s].alt)
                        rpc_batch_start(b, pc->shard[s].alt, "/psfleet.v1.ParameterServer/Stop", wire_pack(&q.base), 5000,
                                        false, &p);
        }
        r = rpc_batch_wait_all(b);
        rpc_batch_free(b);
        return r;
}

/* ---- a worker's pushes ---- */

/* Starts group f's push through gRPC: its gradients are lent to gRPC, not copied — unless the worker
 * overlaps its pushes, when the next step writes them while this push may still be on its way. */
static int push_start(struct ps_client *pc, struct flight *f, uint64_t local_step, bool count_step,
                      struct rpc_pending **ret) {
        Psfleet__V1__Caller caller;
        ps_client_caller_init(pc, &caller);
        Psfleet__V1__PushHeader h = PSFLEET__V1__PUSH_HEADER__INIT;
        h.caller = &caller;
        h.worker = pc->worker;
        h.local_step = local_step;
        h.want_values = true;
        h.count_step = count_step;
        /* int8: the compressed parts' fresh values as int8 changes to what this group holds (not
         * overlapped: there a step's values may be taken after the next push's answer came; not top-k:
         * a block's few large changes would hold its many small ones back, which cost two workers 0.6
         * points of accuracy, docs/performance.md) */
        h.delta_answers = pc->compress[f->g.shard] == RPC_COMPRESS_INT8 && !pc->cfg->training.overlap_push;
        h.answer_base = f->answer_seq;
        f->sent_base = h.delta_answers ? h.answer_base : 0;
        struct wire_out *o;
        grpc_byte_buffer *bb;
        int r = wire_out_new(&o);
        if (r < 0)
                return r;
        wire_out_header(o, &h.base);
        for (uint32_t i = 0; i < f->g.n_parts && r >= 0; i++) {
                uint32_t p = f->g.parts[i];
                const struct job_var *v = &pc->L->vars[pc->L->plan->parts[p].var];
                uint32_t dtype = compress_dtype(pc->compress[f->g.shard], (uint64_t)v->rows * v->cols * sizeof(float),
                                                pc->cfg->rpc.compression_min_bytes);
                if (dtype == WIRE_DTYPE_INT8_BLOCKS || dtype == WIRE_DTYPE_TOPK)
                        r = add_part_ef(pc, o, p, dtype);
                else
                        r = add_part(o, pc->L, p, pc->grads, NULL, dtype, pc->cfg->training.overlap_push);
        }
        if (r >= 0)
                r = wire_out_finish(o, &bb);
        wire_out_free(o);
        if (r < 0)
                return r;
        return rpc_batch_start_ud(pc->batch, pc->shard[f->g.shard].ch, "/psfleet.v1.ParameterServer/Push", bb, pc->deadline_ms,
                                  false, f, ret);
}

/* Checks a push's reply against the layout without copying the values: *in_ret holds them until
 * ps_client_wait copies them in. int8 changes only on the values named by base (the push's
 * answer_base when it asked for changes, else 0: none). */
static int push_reply(struct ps_client *pc, struct rpc_result *res, uint64_t base, struct wire_in **in_ret,
                      uint64_t *global_step_ret, uint64_t *seq_ret, char *err, size_t errlen) {
        if (res->err)
                return errf(err, errlen, res->err, "%s", res->message);
        struct wire_in *in;
        char e2[256];
        int r = wire_in_parse(res->reply, &in, e2, sizeof(e2));
        res->reply = NULL;
        if (r < 0)
                return errf(err, errlen, r, "Push reply: %s", e2);
        ProtobufCMessage *hm;
        r = wire_in_header(in, &psfleet__v1__push_reply_header__descriptor, &hm);
        if (r < 0) {
                wire_in_free(in);
                return errf(err, errlen, r, "Push reply: header does not parse");
        }
        *global_step_ret = ((Psfleet__V1__PushReplyHeader *)hm)->global_step;
        *seq_ret = ((Psfleet__V1__PushReplyHeader *)hm)->answer_seq;
        protobuf_c_message_free_unpacked(hm, NULL);
        for (size_t i = 0; i < in->n_tensors && r >= 0; i++) {
                r = wire_tensor_copy_in(&in->tensors[i], pc->L, NULL, NULL, e2, sizeof(e2));
                if (r < 0)
                        errf(err, errlen, r, "Push reply: %s", e2);
                else if (in->tensors[i].dtype == WIRE_DTYPE_INT8_DELTA && (!base || !*seq_ret))
                        r = errf(err, errlen, -EPROTO, "Push reply: tensor \"%s\" is int8 changes to values this "
                                 "worker %s", in->tensors[i].name, base ? "is not told it will hold (answer_seq 0)"
                                                                        : "did not offer (no answer_base)");
        }
        if (r < 0) {
                wire_in_free(in);
                return r;
        }
        *in_ret = in;
        return 0;
}

/* A flight's push is answered (r: 0 or its failure, gs: shard 0's global_step after it). Under pc->mu. */
static void answered(struct ps_client *pc, struct flight *f, int r, uint64_t gs) {
        if (r == 0)
                metric_observe_us(f->latency, mono_us() - f->t0);
        if (r == 0 && f->g.shard == 0 && gs > pc->global_step)
                pc->global_step = gs;
        if (r == 0 && pc->cfg->training.mode == MODE_SYNC)
                f->version = gs;   /* every shard answers with the step of the values it sends */
        if (f->count_step) {
                f->count_step = false;
                pc->counting--;
        }
        f->answered = true;
        f->err = r;
        pthread_cond_broadcast(&pc->cond);
}

/* The reply thread: takes gRPC replies as they arrive, so they wait, checked, for the compute thread
 * to need their values. */
static void *receiver_main(void *arg) {
        struct ps_client *pc = arg;
        while (!atomic_load(&pc->stop)) {
                struct rpc_pending *p = rpc_batch_next(pc->batch, 100);
                if (!p)
                        continue;
                struct flight *f = rpc_pending_userdata(p);
                struct wire_in *in = NULL;
                uint64_t gs = 0, seq = 0;
                char err[sizeof(f->msg)];
                int r = push_reply(pc, rpc_pending_result(p), f->sent_base, &in, &gs, &seq, err, sizeof(err));
                rpc_batch_release(pc->batch, p);
                pthread_mutex_lock(&pc->mu);
                f->reply = in;
                f->reply_seq = seq;
                if (r < 0)
                        snprintf(f->msg, sizeof(f->msg), "%s", err);
                answered(pc, f, r, gs);
                pthread_mutex_unlock(&pc->mu);
        }
        return NULL;
}

/* The model's blocks move into a shared-memory segment that psd shards on this host can map. Without
 * one (no memory for it, the model cannot move), every push goes through gRPC. */
static void link_setup(struct ps_client *pc, ps_client_move_fn move, void *ud) {
        const struct job_layout *L = pc->L;
        char err[600];
        int r;
        if ((r = shmlink_create(pc->cfg->name, pc->worker, L->fingerprint, L->n_params, L->n_shards, pc->n_fl,
                                &pc->link, err, sizeof(err))) == 0 &&
            (r = move(ud, shmlink_params(pc->link), shmlink_grads(pc->link))) < 0) {
                snprintf(err, sizeof(err), "cannot move the model into it: %s", strerror(-r));
                pc->link = shmlink_free(pc->link);
        }
        if (r < 0) {
                log_notice("no shared memory for ps shards on this host (%s): pushing through gRPC only", err);
                return;
        }
        pc->params = shmlink_params(pc->link);
        pc->grads = shmlink_grads(pc->link);
}

int ps_client_link(struct ps_client *pc, uint32_t worker, uint32_t n_groups, const struct ps_group *groups,
                   float *params, float *grads, ps_client_move_fn move, void *ud) {
        if (pc->fl)
                return -EALREADY;
        pc->worker = worker;
        pc->params = params;
        pc->grads = grads;
        pc->fl = calloc(n_groups + 1, sizeof(*pc->fl));
        if (!pc->fl)
                return -ENOMEM;
        pc->n_fl = n_groups;
        const struct cluster *cl = &pc->cfg->cluster;
        bool lossy = false, tls = tls_job_uses_mtls(pc->cfg);
        if (!(pc->compress = calloc(pc->L->n_shards + 1, sizeof(*pc->compress))))
                return -ENOMEM;
        for (uint32_t s = 0; s < pc->L->n_shards; s++) {
                const char *backup = s < cl->n_ps_backup ? cl->ps_backup[s].addr : NULL;
                enum rpc_compression c = compress_for_shard(pc->cfg->rpc.compress, cl->ps[s].addr, backup, tls);
                pc->compress[s] = c;
                lossy |= c == RPC_COMPRESS_INT8 || c == RPC_COMPRESS_TOPK;
                if (pc->cfg->rpc.compress == RPC_COMPRESS_AUTO && c != RPC_COMPRESS_NONE)
                        log_info("ps:%u (%s) is %s: its gRPC pushes go as int8 with error feedback "
                                 "(rpc.compression auto)", s, cl->ps[s].addr,
                                 compress_for_shard(RPC_COMPRESS_AUTO, cl->ps[s].addr, backup, false) != RPC_COMPRESS_NONE
                                         ? "beyond loopback" : "reached under mutual TLS");
        }
        if (lossy) {
                if (!(pc->residual = calloc(pc->L->n_params + 1, sizeof(float))))
                        return -ENOMEM;
                pc->topk_k = compress_topk_k(pc->cfg->rpc.topk_ratio);
        }
        for (uint32_t i = 0; i < n_groups; i++) {
                uint32_t *parts = malloc((groups[i].n_parts + 1) * sizeof(uint32_t));
                if (!parts)
                        return -ENOMEM;
                memcpy(parts, groups[i].parts, groups[i].n_parts * sizeof(uint32_t));
                pc->fl[i].g = (struct ps_group){.shard = groups[i].shard, .n_parts = groups[i].n_parts, .parts = parts};
                char shard[16];
                snprintf(shard, sizeof(shard), "%u", groups[i].shard);
                pc->fl[i].latency = metric_histogram("psfleet_worker_push_seconds", "From a push's start to its "
                                                     "answer taken (gRPC: on arrival; shared memory: when forward "
                                                     "needs the values), by ps shard.", "shard", shard,
                                                     metrics_latency_buckets, metrics_n_latency_buckets);
        }
        int r = rpc_batch_new(&pc->batch);
        if (r < 0)
                return r;
        if ((r = pthread_create(&pc->receiver, NULL, receiver_main, pc)) != 0)
                return -r;
        pc->receiving = true;
        if (move)
                link_setup(pc, move, ud);
        return 0;
}

/* Attaches the segment to `shard`: its descriptor through the psd's unix socket on this host (none
 * there: the shard is on another host, or offers no shared memory), then the AttachSharedMemory call
 * that ties it to this worker. */
static int link_attach(struct ps_client *pc, uint32_t shard, uint32_t gen, uint32_t n_groups, const uint32_t *index,
                       const uint32_t *const *parts, const uint32_t *n, int32_t *pid_ret, char *err, size_t errlen) {
        char path[256], e[600];
        int r = shmlink_socket_path(pc->cfg->rpc.runtime_dir, pc->cfg->name, shard, path, sizeof(path), e, sizeof(e));
        if (r == 0)
                r = shmlink_send(path, shmlink_fd(pc->link), shmlink_nonce(pc->link), pc->deadline_ms, e, sizeof(e));
        if (r == -ENOENT || r == -ECONNREFUSED)
                return errf(err, errlen, r, "%s (ps:%u runs on another host, or offers no shared memory)", e, shard);
        if (r < 0)
                return errf(err, errlen, r, "%s", e);
        return ps_client_attach_shm(pc, shard, pc->worker, (int32_t)getpid(), shmlink_nonce(pc->link), gen, n_groups,
                                    index, parts, n, pid_ret, err, errlen);
}

/* Pushes to `shard` go through gRPC from now on (until ps_client_link_shards links it again). */
void ps_client_link_down(struct ps_client *pc, uint32_t shard) {
        if (!pc->link || !pc->shard[shard].link.up)
                return;
        pc->shard[shard].link.up = false;
        shmlink_shard_close(pc->link, shard);
}

void ps_client_link_shards(struct ps_client *pc) {
        const struct job_layout *L = pc->L;
        if (!pc->link)
                return;
        uint32_t *index = calloc(pc->n_fl + 1, sizeof(uint32_t)), *n = calloc(pc->n_fl + 1, sizeof(uint32_t));
        const uint32_t **parts = calloc(pc->n_fl + 1, sizeof(*parts));
        for (uint32_t s = 0; index && n && parts && s < L->n_shards; s++) {
                if (pc->shard[s].link.up)
                        continue;
                if (pc->shard[s].cur == 1) {
                        /* its primary is cluster.ps_backup[s], which offers no shared memory: this host's socket
                         * of the shard is the other psd's, maybe stopped (asking it would wait rpc.deadline_ms,
                         * which a sync step's partner does not wait for) */
                        if (!pc->shard[s].link.said)
                                log_info("ps:%u: pushing through gRPC: its primary is its backup psd %s, which offers "
                                         "no shared memory", s, pc->cfg->cluster.ps_backup[s].addr);
                        pc->shard[s].link.said = true;
                        continue;
                }
                uint32_t k = 0;
                for (uint32_t i = 0; i < pc->n_fl; i++)
                        if (pc->fl[i].g.shard == s) {
                                index[k] = i;
                                parts[k] = pc->fl[i].g.parts;
                                n[k++] = pc->fl[i].g.n_parts;
                        }
                uint32_t gen = shmlink_shard_open(pc->link, s);
                int32_t pid = 0;
                char err[800];
                int r = link_attach(pc, s, gen, k, index, parts, n, &pid, err, sizeof(err));
                if (r == 0 && (pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH)))
                        r = errf(err, sizeof(err), -ESRCH, "ps:%u's process %d is not visible from here (another PID namespace?)",
                                 s, (int)pid);
                if (r < 0) {
                        shmlink_shard_close(pc->link, s);
                        if (!pc->shard[s].link.said)
                                log_info("ps:%u: pushing through gRPC: %s", s, err);
                        pc->shard[s].link.said = true;
                        continue;
                }
                pc->shard[s].link = (struct shard_link){.up = true, .pid = pid};
                log_info("ps:%u is on this host: pushing through shared memory (%u group(s))", s, k);
        }
        free(index);
        free(n);
        free(parts);
}

void ps_client_push(struct ps_client *pc, uint32_t g, uint64_t local_step, bool count_step) {
        struct flight *f = &pc->fl[g];
        bool link = pc->link && pc->shard[f->g.shard].link.up;
        /* sync: the shard aggregates the gradients of one step, so it needs to know which; it counts
         * its steps itself (count_step then only says, here, where global_step is heading) */
        if (pc->cfg->training.mode == MODE_SYNC)
                local_step = f->version;
        /* in flight before it starts: the reply thread may take its answer at once */
        pthread_mutex_lock(&pc->mu);
        f->via = link ? VIA_LINK : VIA_GRPC;
        f->answered = false;
        f->count_step = count_step;
        pc->counting += count_step;
        f->t0 = mono_us();
        pthread_mutex_unlock(&pc->mu);
        if (link) {
                f->answer_seq = 0;   /* psd writes the values in place: no copy of its own follows them */
                f->seq = shmlink_push(pc->link, g, f->g.shard, local_step, count_step);
                return;
        }
        struct rpc_pending *p = NULL;
        int r = push_start(pc, f, local_step, count_step, &p);
        if (r < 0) {
                /* not started: no reply will come */
                if (p)
                        rpc_batch_release(pc->batch, p);
                pthread_mutex_lock(&pc->mu);
                snprintf(f->msg, sizeof(f->msg), "cannot start a push to ps:%u: %s", f->g.shard, strerror(-r));
                answered(pc, f, r, 0);
                pthread_mutex_unlock(&pc->mu);
        }
}

/* Waits for the answer to flight g's shared-memory push: psd has written its values into the block. A
 * refusal or a lost psd is the result; a lost psd also takes the link down. */
static int link_settle(struct ps_client *pc, uint32_t g, char *err, size_t errlen) {
        struct flight *f = &pc->fl[g];
        uint32_t s = f->g.shard;
        uint64_t gs = 0;
        char e[500];
        int r = -ECONNRESET;
        if (pc->shard[s].link.up)
                r = shmlink_wait(pc->link, g, f->seq, pc->shard[s].link.pid, LINK_SPIN_US, pc->deadline_ms * 1000, &gs, e,
                                 sizeof(e));
        else
                snprintf(e, sizeof(e), "the shared-memory link is down");
        pthread_mutex_lock(&pc->mu);
        answered(pc, f, r, gs);
        f->via = VIA_NONE;
        pthread_mutex_unlock(&pc->mu);
        if (r < 0) {
                errf(err, errlen, r, "ps:%u through shared memory: %s", s, e);
                if (r == -ETIMEDOUT || r == -ECONNRESET || r == -EPROTO)
                        ps_client_link_down(pc, s);
        }
        return r;
}

/* Waits for flight g's gRPC push (if one is in flight) and takes its reply: 0 with the values in
 * *in_ret (NULL when none), or its failure with why in err. */
static int grpc_settle(struct ps_client *pc, struct flight *f, struct wire_in **in_ret, uint64_t *seq_ret, char *err,
                       size_t errlen) {
        pthread_mutex_lock(&pc->mu);
        while (f->via == VIA_GRPC && !f->answered)
                pthread_cond_wait(&pc->cond, &pc->mu);   /* bounded: every push has a deadline */
        *in_ret = f->reply;
        *seq_ret = f->reply_seq;
        int r = f->via == VIA_NONE ? 0 : f->err;
        if (r < 0)
                errf(err, errlen, r, "%s", f->msg);
        f->reply = NULL;
        f->via = VIA_NONE;
        pthread_mutex_unlock(&pc->mu);
        return r;
}

static void copy_in(struct ps_client *pc, struct wire_in *in) {
        for (size_t t = 0; in && t < in->n_tensors; t++)
                wire_tensor_copy_in(&in->tensors[t], pc->L, pc->params, NULL, NULL, 0);   /* checked on arrival */
        wire_in_free(in);
}

/* Settles flight g's push. Through shared memory its values are in place once answered; through gRPC
 * they are copied in now, or, when hold, kept for ps_client_take. */
static int settle(struct ps_client *pc, uint32_t g, bool hold, char *err, size_t errlen) {
        struct flight *f = &pc->fl[g];
        if (f->via == VIA_LINK)
                return link_settle(pc, g, err, errlen);
        struct wire_in *in;
        uint64_t seq;
        int r = grpc_settle(pc, f, &in, &seq, err, errlen);
        if (hold) {
                if (in) {
                        wire_in_free(f->held);   /* never taken: newer values replace it */
                        f->held = in;
                }
                return r;
        }
        /* values held from an earlier push are older than any that just came */
        if (in || r < 0)
                f->held = wire_in_free(f->held);
        copy_in(pc, f->held);
        f->held = NULL;
        copy_in(pc, in);   /* int8 changes are added to the values answer_seq named */
        if (in || r < 0)
                f->answer_seq = r < 0 ? 0 : seq;
        return r;
}

int ps_client_wait(struct ps_client *pc, uint32_t g, char *err, size_t errlen) {
        return settle(pc, g, false, err, errlen);
}

int ps_client_hold(struct ps_client *pc, uint32_t g, char *err, size_t errlen) {
        return settle(pc, g, true, err, errlen);
}

int ps_client_take(struct ps_client *pc, uint32_t g, char *err, size_t errlen) {
        struct flight *f = &pc->fl[g];
        if (f->via == VIA_LINK)   /* psd writes a shared-memory push's values in place: wait for them */
                return link_settle(pc, g, err, errlen);
        copy_in(pc, f->held);
        f->held = NULL;
        return 0;
}

uint64_t ps_client_global_step(struct ps_client *pc, uint32_t *counting_ret) {
        pthread_mutex_lock(&pc->mu);
        uint64_t gs = pc->global_step;
        if (counting_ret)
                *counting_ret = pc->counting;
        pthread_mutex_unlock(&pc->mu);
        return gs;
}

int ps_client_attach_shm(struct ps_client *pc, uint32_t shard, uint32_t worker, int32_t pid,
                         const uint8_t *nonce, uint32_t generation, uint32_t n_groups, const uint32_t *group_index,
                         const uint32_t *const *group_parts, const uint32_t *group_n, int32_t *pid_ret, char *err,
                         size_t errlen) {
        Psfleet__V1__PushGroup *groups = calloc(n_groups + 1, sizeof(*groups));
        Psfleet__V1__PushGroup **gp = calloc(n_groups + 1, sizeof(*gp));
        if (!groups || !gp) {
                free(groups);
                free(gp);
                return errf(err, errlen, -ENOMEM, "out of memory");
        }
        for (uint32_t i = 0; i < n_groups; i++) {
                psfleet__v1__push_group__init(&groups[i]);
                groups[i].index = group_index[i];
                groups[i].n_parts = group_n[i];
                groups[i].parts = (uint32_t *)group_parts[i];
                gp[i] = &groups[i];
        }
        Psfleet__V1__Caller caller;
        ps_client_caller_init(pc, &caller);
        Psfleet__V1__AttachSharedMemoryRequest q = PSFLEET__V1__ATTACH_SHARED_MEMORY_REQUEST__INIT;
        q.caller = &caller;
        q.worker = worker;
        q.pid = pid;
        q.nonce.data = (uint8_t *)nonce;
        q.nonce.len = SHMLINK_NONCE;
        q.generation = generation;
        q.n_groups = n_groups;
        q.groups = gp;
        ProtobufCMessage *m;
        int r = rpc_call_msg(pc->shard[shard].ch, "/psfleet.v1.ParameterServer/AttachSharedMemory", &q.base,
                             &psfleet__v1__attach_shared_memory_reply__descriptor, pc->deadline_ms, false, &m, err, errlen);
        free(groups);
        free(gp);
        if (r < 0)
                return r;
        *pid_ret = ((Psfleet__V1__AttachSharedMemoryReply *)m)->pid;
        protobuf_c_message_free_unpacked(m, NULL);
        return 0;
}

