/* The client of a job's ps shards: block transfers to and from the shards over gRPC. */
#include "ps_client.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"
#include "shmlink.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"
#include "psfleet/v1/supervisor.pb-c.h"

/* ---- client ---- */

int ps_client_new(const struct job_config *cfg, const struct job_layout *L, const char *task, struct ps_client **ret) {
        struct ps_client *pc = calloc(1, sizeof(*pc));
        if (!pc)
                return -ENOMEM;
        pc->cfg = cfg;
        pc->L = L;
        pc->deadline_ms = cfg->rpc.deadline_ms;
        snprintf(pc->task, sizeof(pc->task), "%s", task);
        pc->ch = calloc(L->n_shards, sizeof(*pc->ch));
        if (!pc->ch) {
                free(pc);
                return -ENOMEM;
        }
        for (uint32_t s = 0; s < L->n_shards; s++) {
                char name[32];
                snprintf(name, sizeof(name), "ps:%u", s);
                int r = rpc_channel_new(cfg->cluster.ps[s].addr, name, &pc->ch[s]);
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
        for (uint32_t s = 0; pc->ch && s < pc->L->n_shards; s++)
                rpc_channel_free(pc->ch[s]);
        free(pc->ch);
        free(pc);
        return NULL;
}

static void caller_init(struct ps_client *pc, Psfleet__V1__Caller *c) {
        psfleet__v1__caller__init(c);
        c->fingerprint = pc->L->fingerprint;
        c->task = pc->task;
}

/* Appends part p of a block (lent) as a tensor named name[/suffix]. */
static int add_part(struct wire_out *o, const struct job_layout *L, uint32_t p, const float *block,
                    const char *suffix) {
        const struct placement_part *pp = &L->plan->parts[p];
        const struct job_var *v = &L->vars[pp->var];
        char name[300];
        if (suffix)
                snprintf(name, sizeof(name), "%s/%s", v->name, suffix);
        else
                snprintf(name, sizeof(name), "%s", v->name);
        uint64_t shape[2] = {pp->row_end - pp->row_begin, v->cols};
        const float *data = block + v->offset + (size_t)pp->row_begin * v->cols;
        return wire_out_tensor(o, name, WIRE_DTYPE_FLOAT32, shape, 2, pp->row_begin, data,
                               (size_t)shape[0] * shape[1] * sizeof(float), NULL, NULL);
}

/* Waits for the batch; the first failure (ours or a server's, with its message) becomes the result. */
static int batch_end(struct rpc_batch *b, int r, const char *what, char *err, size_t errlen) {
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

int ps_client_assign(struct ps_client *pc, const bool *which, const float *params, float *const *slots,
                     uint64_t global_step, char *err, size_t errlen) {
        const struct job_layout *L = pc->L;
        struct rpc_batch *b;
        int r = rpc_batch_new(&b);
        if (r < 0)
                return r;
        for (uint32_t s = 0; s < L->n_shards && r >= 0; s++) {
                if (which && !which[s])
                        continue;
                Psfleet__V1__Caller caller;
                caller_init(pc, &caller);
                Psfleet__V1__AssignHeader h = PSFLEET__V1__ASSIGN_HEADER__INIT;
                h.caller = &caller;
                h.global_step = global_step;
                h.with_slots = slots != NULL;
                struct wire_out *o;
                grpc_byte_buffer *bb;
                if ((r = wire_out_new(&o)) < 0)
                        break;
                wire_out_header(o, &h.base);
                for (uint32_t i = 0; i < L->shard_count[s] && r >= 0; i++) {
                        uint32_t p = L->shard_parts[L->shard_first[s] + i];
                        r = add_part(o, L, p, params, NULL);
                        for (unsigned k = 0; slots && k < L->n_slots && r >= 0; k++)
                                r = add_part(o, L, p, slots[k], optim_slot_name(L->optimizer, k));
                }
                if (r >= 0)
                        r = wire_out_finish(o, &bb);
                wire_out_free(o);
                struct rpc_pending *pend;
                if (r >= 0)
                        r = rpc_batch_start(b, pc->ch[s], "/psfleet.v1.ParameterServer/Assign", bb, pc->deadline_ms,
                                            true, &pend);
        }
        return batch_end(b, r, "assign", err, errlen);
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
        for (uint32_t s = 0; s < L->n_shards && r >= 0; s++) {
                Psfleet__V1__Caller caller;
                caller_init(pc, &caller);
                Psfleet__V1__PullHeader h = PSFLEET__V1__PULL_HEADER__INIT;
                h.caller = &caller;
                h.with_slots = slots != NULL;
                Psfleet__V1__PullRequest q = PSFLEET__V1__PULL_REQUEST__INIT;
                q.header = &h;
                r = rpc_batch_start(b, pc->ch[s], "/psfleet.v1.ParameterServer/Pull", wire_pack(&q.base),
                                    pc->deadline_ms, false, &pend[s]);
        }
        if (r >= 0)
                rpc_batch_wait_all(b);
        for (uint32_t s = 0; s < L->n_shards && r >= 0; s++) {
                struct rpc_result *res = rpc_pending_result(pend[s]);
                if (res->err) {
                        r = res->err;
                        errf(err, errlen, r, "%s", res->message);
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
                        if (s == 0 && global_step_ret)
                                *global_step_ret = ((Psfleet__V1__PullReplyHeader *)hm)->global_step;
                        protobuf_c_message_free_unpacked(hm, NULL);
                }
                for (size_t i = 0; i < in->n_tensors && r >= 0; i++) {
                        r = job_layout_copy_in(L, &in->tensors[i], params, slots, e2, sizeof(e2));
                        if (r < 0)
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
        int r = rpc_call_msg(pc->ch[shard], "/psfleet.v1.ParameterServer/GetShardStatus", &q.base,
                             &psfleet__v1__shard_status__descriptor, pc->deadline_ms, false, &m, err, errlen);
        if (r >= 0)
                *status_ret = m;
        return r;
}

int ps_client_probe(struct ps_client *pc, uint32_t shard, uint64_t timeout_ms, void **status_ret, char *err,
                    size_t errlen) {
        Psfleet__V1__ShardStatusRequest q = PSFLEET__V1__SHARD_STATUS_REQUEST__INIT;
        struct rpc_channel *ch = pc->ch[shard];
        struct rpc_result res;
        int r = rpc_call(ch, "/psfleet.v1.ParameterServer/GetShardStatus", wire_pack(&q.base), timeout_ms, false, &res);
        if (r < 0) {
                const char *tail = strstr(res.message, rpc_status_name(res.status));
                errf(err, errlen, r, "%s (%s): %s", rpc_channel_name(ch), rpc_channel_target(ch), tail ? tail : res.message);
                /* gRPC backs off reconnecting (up to minutes) and fails calls fast meanwhile; a fresh
                 * channel notices a shard that has just come up at the next probe. */
                struct rpc_channel *fresh;
                if (rpc_channel_new(pc->cfg->cluster.ps[shard].addr, rpc_channel_name(ch), &fresh) >= 0) {
                        rpc_channel_free(ch);
                        pc->ch[shard] = fresh;
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
                rpc_batch_start(b, pc->ch[s], "/psfleet.v1.ParameterServer/Stop", wire_pack(&q.base), 5000, false, &p);
        }
        r = rpc_batch_wait_all(b);
        rpc_batch_free(b);
        return r;
}

int ps_client_push_start(struct ps_client *pc, struct rpc_batch *b, uint32_t shard, const uint32_t *parts,
                         uint32_t n_parts, const float *grads, uint32_t worker, uint64_t local_step, bool count_step,
                         void *userdata, struct rpc_pending **ret) {
        Psfleet__V1__Caller caller;
        caller_init(pc, &caller);
        Psfleet__V1__PushHeader h = PSFLEET__V1__PUSH_HEADER__INIT;
        h.caller = &caller;
        h.worker = worker;
        h.local_step = local_step;
        h.want_values = true;
        h.count_step = count_step;
        struct wire_out *o;
        grpc_byte_buffer *bb;
        int r = wire_out_new(&o);
        if (r < 0)
                return r;
        wire_out_header(o, &h.base);
        for (uint32_t i = 0; i < n_parts && r >= 0; i++)
                r = add_part(o, pc->L, parts[i], grads, NULL);
        if (r >= 0)
                r = wire_out_finish(o, &bb);
        wire_out_free(o);
        if (r < 0)
                return r;
        return rpc_batch_start_ud(b, pc->ch[shard], "/psfleet.v1.ParameterServer/Push", bb, pc->deadline_ms, false,
                                  userdata, ret);
}

int ps_client_push_reply(struct ps_client *pc, struct rpc_result *res, void **in_ret, uint64_t *global_step_ret,
                         uint64_t *incarnation_ret, char *err, size_t errlen) {
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
        Psfleet__V1__PushReplyHeader *h = (Psfleet__V1__PushReplyHeader *)hm;
        if (global_step_ret)
                *global_step_ret = h->global_step;
        if (incarnation_ret)
                *incarnation_ret = h->incarnation;
        protobuf_c_message_free_unpacked(hm, NULL);
        for (size_t i = 0; i < in->n_tensors && r >= 0; i++) {
                r = job_layout_copy_in(pc->L, &in->tensors[i], NULL, NULL, e2, sizeof(e2));
                if (r < 0)
                        errf(err, errlen, r, "Push reply: %s", e2);
        }
        if (r < 0) {
                wire_in_free(in);
                return r;
        }
        *in_ret = in;
        return 0;
}

int ps_client_attach_shm(struct ps_client *pc, uint32_t shard, uint32_t worker, const char *segment,
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
        caller_init(pc, &caller);
        Psfleet__V1__AttachSharedMemoryRequest q = PSFLEET__V1__ATTACH_SHARED_MEMORY_REQUEST__INIT;
        q.caller = &caller;
        q.worker = worker;
        q.segment = (char *)segment;
        q.nonce.data = (uint8_t *)nonce;
        q.nonce.len = SHMLINK_NONCE;
        q.generation = generation;
        q.n_groups = n_groups;
        q.groups = gp;
        ProtobufCMessage *m;
        int r = rpc_call_msg(pc->ch[shard], "/psfleet.v1.ParameterServer/AttachSharedMemory", &q.base,
                             &psfleet__v1__attach_shared_memory_reply__descriptor, pc->deadline_ms, false, &m, err, errlen);
        free(groups);
        free(gp);
        if (r < 0)
                return r;
        *pid_ret = ((Psfleet__V1__AttachSharedMemoryReply *)m)->pid;
        protobuf_c_message_free_unpacked(m, NULL);
        return 0;
}

