/* ps.replicas 2: a shard's primary forwards every update it applies to its backup, in order, and the
 * chief moves the roles (replica.h). What is replicated: dense pushes of training.mode async, through
 * gRPC and shared memory alike, with global_step, and under training.mode ssp the workers' clocks;
 * sync and embedding tables are refused at start (config) until they are. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "replica.h"

#include "authz.h"
#include "log.h"
#include "optim.h"
#include "util.h"
#include "wire.h"

#include "psd-internal.h"

#define M_REPLICATE "/psfleet.v1.ParameterServer/Replicate"
#define M_STATUS "/psfleet.v1.ParameterServer/GetShardStatus"
#define TICK_US 100000u          /* the thread looks for a backup to bring in this often */
#define RETRY_US 1000000u        /* and tries one that failed again after this */
#define PROBE_MS 300u

struct replica {
        struct psd *p;
        pthread_mutex_t mu;          /* one write at a time: applied, forwarded, acknowledged; the fields
                                      * below that say so */
        atomic_int role;             /* PSFLEET__V1__REPLICA_ROLE__* */
        atomic_uint_fast64_t epoch;
        char peer_addr[300];
        struct rpc_channel *peer;    /* mu */
        atomic_bool replicating;     /* primary: the backup holds every update (written under mu) */
        atomic_bool unreplicated_ok; /* primary: the chief knows the backup is out (it promoted this psd,
                                      * or confirmed a drop): writes may be answered without it */
        uint64_t seq, acked, lag_us; /* mu: updates since the last snapshot; the last acknowledged */
        atomic_uint_fast64_t fenced, dropped;
        pthread_mutex_t err_mu;
        char last_error[300];
        pthread_t thread;
        bool started;
        atomic_bool stop;
};

static void set_error(struct replica *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(struct replica *r, const char *fmt, ...) {
        va_list ap;
        pthread_mutex_lock(&r->err_mu);
        va_start(ap, fmt);
        vsnprintf(r->last_error, sizeof(r->last_error), fmt, ap);
        va_end(ap);
        pthread_mutex_unlock(&r->err_mu);
}

static const char *replica_role_name(int role) {
        return role == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY ? "primary" : "backup";
}

/* This psd steps down (mu held): its state may hold updates its shard's new primary never saw, so it
 * forgets them and waits, uninitialized, for the primary's state transfer. */
static void step_down(struct replica *r, uint64_t epoch, const char *why) {
        atomic_store(&r->role, PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_BACKUP);
        if (epoch > atomic_load(&r->epoch))
                atomic_store(&r->epoch, epoch);
        atomic_store(&r->replicating, false);
        atomic_store(&r->p->s->initialized, false);
        r->seq = r->acked = 0;
        log_warning("ps:%u is no longer its shard's primary (%s): refusing writes, rejoining as the backup of epoch "
                    "%" PRIu64, r->p->shard, why, atomic_load(&r->epoch));
        set_error(r, "stepped down: %s", why);
}

/* The backup is gone or behind (mu held): the shard goes on unreplicated until the thread brings it
 * back by a state transfer. */
static void drop_backup(struct replica *r, const char *why) {
        atomic_store(&r->replicating, false);
        /* until the chief has recorded it, no write is answered: a chief that still took the backup
         * for in sync could otherwise promote it without updates this psd answered */
        atomic_store(&r->unreplicated_ok, false);
        atomic_fetch_add(&r->dropped, 1);
        log_warning("ps:%u: dropped its backup %s: %s; the shard runs unreplicated until it catches up", r->p->shard,
                    r->peer_addr, why);
        set_error(r, "backup dropped: %s", why);
}

/* One Replicate call to the backup (mu held); its reply's epoch in *epoch_ret. 0, -ESTALE (the backup
 * is at a newer epoch: we are fenced), or another -errno with why. */
static int send(struct replica *r, struct wire_out *o, uint64_t timeout_ms, uint64_t *epoch_ret, char *why,
                size_t len) {
        grpc_byte_buffer *bb;
        int e = wire_out_finish(o, &bb);
        if (e < 0)
                return errf(why, len, e, "out of memory");
        struct rpc_result res;
        e = rpc_call(r->peer, M_REPLICATE, bb, timeout_ms, false, &res);
        if (e == 0) {
                ProtobufCMessage *m;
                if (wire_unpack(res.reply, &psfleet__v1__replicate_reply__descriptor, &m) == 0) {
                        *epoch_ret = ((Psfleet__V1__ReplicateReply *)m)->epoch;
                        protobuf_c_message_free_unpacked(m, NULL);
                }
        } else {
                errf(why, len, e, "%s", res.message);
                if (res.status == GRPC_STATUS_FAILED_PRECONDITION)
                        e = -ESTALE;
        }
        rpc_result_clear(&res);
        return e;
}

static void header_init(struct replica *r, Psfleet__V1__ReplicateHeader *h, Psfleet__V1__Caller *c, char *task,
                        size_t len) {
        psfleet__v1__caller__init(c);
        snprintf(task, len, "ps:%u", r->p->shard);
        c->task = task;
        c->fingerprint = r->p->L->fingerprint;
        psfleet__v1__replicate_header__init(h);
        h->caller = c;
        h->epoch = atomic_load(&r->epoch);
}

int replica_write_begin(struct replica *r, char *err, size_t errlen) {
        if (!r)
                return 0;
        pthread_mutex_lock(&r->mu);
        bool primary = atomic_load(&r->role) == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY;
        if (primary && (atomic_load(&r->replicating) || atomic_load(&r->unreplicated_ok)))
                return 0;
        pthread_mutex_unlock(&r->mu);
        if (primary)
                return errf(err, errlen, -EAGAIN, "ps:%u at %s dropped its backup %s: waiting for the chief to "
                            "record that the shard runs unreplicated", r->p->shard, r->p->args.listen, r->peer_addr);
        atomic_fetch_add(&r->fenced, 1);
        return errf(err, errlen, -EAGAIN, "ps:%u at %s is its shard's backup (epoch %" PRIu64 "): writes go to the "
                    "primary", r->p->shard, r->p->args.listen, atomic_load(&r->epoch));
}

int replica_write_end(struct replica *r, struct shard_part *const *parts, uint32_t n, const float *grads, uint64_t gs,
                      const struct replica_push *push, char *err, size_t errlen) {
        if (!r)
                return 0;
        int ret = 0;
        if (!atomic_load(&r->replicating))
                goto out;
        if (!grads) {
                drop_backup(r, "out of memory for the update's copy");
                ret = errf(err, errlen, -ENOMEM, "ps:%u: out of memory", r->p->shard);
                goto out;
        }
        Psfleet__V1__ReplicateHeader h;
        Psfleet__V1__Caller c;
        char task[32], why[600];
        header_init(r, &h, &c, task, sizeof(task));
        h.seq = r->seq + 1;
        h.global_step = gs;
        h.count_step = push->count_step;
        h.worker = push->worker;
        h.local_step = push->local_step;
        struct wire_out *o;
        if (wire_out_new(&o) < 0) {
                drop_backup(r, "out of memory");
                ret = errf(err, errlen, -ENOMEM, "ps:%u: out of memory", r->p->shard);
                goto out;
        }
        wire_out_header(o, &h.base);
        for (uint32_t i = 0, at = 0; i < n; at += (uint32_t)parts[i]->a.n, i++) {
                uint64_t shape[2] = {parts[i]->rows, parts[i]->cols};
                wire_out_tensor_copy(o, parts[i]->name, WIRE_DTYPE_FLOAT32, shape, 2, parts[i]->row_begin, grads + at,
                                     parts[i]->a.n * sizeof(float));
        }
        uint64_t t0 = mono_us(), epoch = 0;
        int e = send(r, o, r->p->cfg->ps.replica_timeout_ms, &epoch, why, sizeof(why));
        wire_out_free(o);
        if (e == 0) {
                r->seq = r->acked = h.seq;
                r->lag_us = mono_us() - t0;
        } else if (e == -ESTALE) {
                step_down(r, epoch, why);
                ret = errf(err, errlen, -EAGAIN, "ps:%u at %s was fenced by a newer primary of its shard: %s", r->p->shard,
                           r->p->args.listen, why);
        } else {
                /* the backup may not have it: the push is not answered as done (the worker pulls again) */
                drop_backup(r, why);
                ret = errf(err, errlen, -EAGAIN, "ps:%u: its backup did not acknowledge the update: %s", r->p->shard,
                           why);
        }
out:
        pthread_mutex_unlock(&r->mu);
        return ret;
}

bool replica_is_primary(struct replica *r) {
        return !r || atomic_load(&r->role) == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY;
}

/* ---- the state transfer: the primary's whole state, then the updates since ---- */

/* The backup answers and may take a snapshot: its status, with a short deadline, outside the lock
 * (a backup that is stopped or gone must not hold the pushes). 0, -ESTALE (it is a primary of a newer
 * epoch: we are fenced) or -errno. */
static int peer_ready(struct replica *r, char *why, size_t len) {
        Psfleet__V1__ShardStatusRequest q = PSFLEET__V1__SHARD_STATUS_REQUEST__INIT;
        ProtobufCMessage *m;
        int e = rpc_call_msg(r->peer, M_STATUS, &q.base, &psfleet__v1__shard_status__descriptor, PROBE_MS, false, &m,
                             why, len);
        if (e < 0)
                return e;
        const Psfleet__V1__ShardStatus *st = (const Psfleet__V1__ShardStatus *)m;
        if (st->replica && st->replica->role == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY &&
            st->replica->epoch >= atomic_load(&r->epoch))
                e = errf(why, len, -ESTALE, "%s is the primary of epoch %" PRIu64, r->peer_addr, st->replica->epoch);
        protobuf_c_message_free_unpacked(m, NULL);
        return e;
}

/* Under the lock: every part with its slots and update counter, and global_step. */
static int transfer(struct replica *r, char *why, size_t len) {
        struct psd *p = r->p;
        struct shard *s = p->s;
        unsigned ns = s->n_slots;
        float *buf = malloc(s->n_floats * (1 + ns) * sizeof(float) + 1);
        uint64_t *updates = calloc(s->n_parts + 1, sizeof(*updates));
        uint32_t W = p->ssp ? ssp_n_workers(p->ssp) : 0;
        uint64_t *clocks = calloc(2 * (size_t)W + 1, sizeof(*clocks));
        struct wire_out *o = NULL;
        int e = -ENOMEM;
        if (!buf || !updates || !clocks || wire_out_new(&o) < 0) {
                errf(why, len, e, "out of memory");
                goto out;
        }
        Psfleet__V1__ReplicateHeader h;
        Psfleet__V1__Caller c;
        char task[32];
        header_init(r, &h, &c, task, sizeof(task));
        h.snapshot = true;
        h.global_step = atomic_load(&s->global_step);
        h.n_updates = s->n_parts;
        h.updates = updates;
        if (W) {   /* the workers' clocks with the values: no push can move them meanwhile (the lock) */
                ssp_copy_out(p->ssp, clocks, clocks + W);
                h.n_clocks = h.n_raw_steps = W;
                h.clocks = clocks;
                h.raw_steps = clocks + W;
        }
        size_t at = 0;
        for (uint32_t k = 0; k < s->n_parts; k++) {
                const struct shard_part *pt = &s->parts[k];
                uint64_t shape[2] = {pt->rows, pt->cols};
                shard_read(s, k, ns, buf + at);
                updates[k] = pt->a.updates;
                for (unsigned j = 0; j <= ns; j++, at += pt->a.n) {
                        char name[300];
                        snprintf(name, sizeof(name), "%s%s%s", pt->name, j ? "/" : "",
                                 j ? optim_slot_name(p->cfg->training.optimizer, j - 1) : "");
                        wire_out_tensor_copy(o, name, WIRE_DTYPE_FLOAT32, shape, 2, pt->row_begin, buf + at,
                                             pt->a.n * sizeof(float));
                }
        }
        wire_out_header(o, &h.base);
        uint64_t timeout = p->cfg->ps.replica_timeout_ms < 10000 ? 10000 : p->cfg->ps.replica_timeout_ms, epoch = 0;
        e = send(r, o, timeout, &epoch, why, len);
        if (e == -ESTALE)
                step_down(r, epoch, why);
out:
        wire_out_free(o);
        free(clocks);
        free(updates);
        free(buf);
        return e;
}

static void *replica_main(void *arg) {
        struct replica *r = arg;
        uint64_t next = 0;
        char why[600];
        while (!atomic_load(&r->stop)) {
                usleep(TICK_US);
                if (atomic_load(&r->role) != PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY ||
                    !atomic_load(&r->p->s->initialized) || atomic_load(&r->replicating) || mono_us() < next)
                        continue;
                next = mono_us() + RETRY_US;
                int e = peer_ready(r, why, sizeof(why));
                pthread_mutex_lock(&r->mu);
                if (e == -ESTALE) {
                        step_down(r, 0, why);
                } else if (e < 0) {
                        set_error(r, "no backup: %s", why);
                } else if (atomic_load(&r->role) == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY) {
                        uint64_t t0 = mono_us();
                        if ((e = transfer(r, why, sizeof(why))) == 0) {
                                r->seq = r->acked = 0;
                                atomic_store(&r->replicating, true);
                                log_info("ps:%u: backup %s in sync at epoch %" PRIu64 " (state transfer of %zu bytes "
                                         "in %" PRIu64 " ms); every update is forwarded to it from now on",
                                         r->p->shard, r->peer_addr, atomic_load(&r->epoch),
                                         r->p->s->n_floats * (1 + r->p->s->n_slots) * sizeof(float),
                                         (mono_us() - t0) / 1000);
                                set_error(r, "%s", "");
                        } else if (e != -ESTALE) {
                                set_error(r, "state transfer to %s failed: %s", r->peer_addr, why);
                        }
                }
                pthread_mutex_unlock(&r->mu);
        }
        return NULL;
}

/* ---- the backup's side, and the chief's SetRole ---- */

/* A snapshot (every part with its slots, the counters) or one update, in order. mu held. */
static int take(struct replica *r, const struct wire_in *in, const Psfleet__V1__ReplicateHeader *h, char *err,
                size_t errlen) {
        struct shard *s = r->p->s;
        int e;
        if (h->snapshot) {
                if (h->n_updates != s->n_parts)
                        return errf(err, errlen, -EINVAL, "snapshot of %zu part counters, ps:%u has %u parts",
                                    h->n_updates, r->p->shard, s->n_parts);
                if ((e = shard_assign(s, in, true, h->global_step, err, errlen)) < 0)
                        return e;
                for (uint32_t k = 0; k < s->n_parts; k++) {
                        pthread_mutex_lock(&s->parts[k].mu);
                        s->parts[k].a.updates = h->updates[k];
                        pthread_mutex_unlock(&s->parts[k].mu);
                }
                if (r->p->ssp && h->n_clocks == ssp_n_workers(r->p->ssp) && h->n_raw_steps == h->n_clocks)
                        ssp_copy_in(r->p->ssp, h->clocks, h->raw_steps);
                r->seq = 0;
                return 0;
        }
        if (!atomic_load(&s->initialized) || h->seq != r->seq + 1)
                return errf(err, errlen, -EINVAL, "update %" PRIu64 " of epoch %" PRIu64 " out of order: ps:%u %s",
                            h->seq, h->epoch, r->p->shard,
                            atomic_load(&s->initialized) ? "holds an earlier update" : "has had no state transfer yet");
        struct shard_part **parts = calloc(in->n_tensors + 1, sizeof(*parts));
        if (!parts)
                return errf(err, errlen, -ENOMEM, "out of memory");
        for (size_t i = 0; i < in->n_tensors; i++) {
                int slot;
                if ((e = shard_match(s, &in->tensors[i], false, &parts[i], &slot, err, errlen)) < 0) {
                        free(parts);
                        return e;
                }
        }
        /* the gradients as the primary applied them (scaled): the same apply, the same bits */
        shard_wire_apply(s, in, parts, 1.0f, NULL);
        free(parts);
        if (s->index == 0)
                atomic_store(&s->global_step, h->global_step);
        if (h->count_step && r->p->ssp)
                ssp_note(r->p->ssp, h->worker, h->local_step);
        r->seq = h->seq;
        return 0;
}

void replica_on_replicate(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        struct replica *r = p->rep;
        char err[600], who[LOG_PEER_BUF];
        struct psd_request q = {0};
        int e = psd_receive(p, call, &psfleet__v1__replicate_header__descriptor, &q, err, sizeof(err));
        const Psfleet__V1__ReplicateHeader *h = (const Psfleet__V1__ReplicateHeader *)q.hm;
        if (e == 0 && !r)
                e = errf(err, sizeof(err), -EINVAL, "ps:%u is not replicated (ps.replicas 1)", p->shard);
        if (e == 0 && !authz_peer_is(rpc_call_identity(call), PEER_PS, p->shard))
                e = errf(err, sizeof(err), -EACCES, "Replicate from %s, which is not ps/%u",
                         log_peer_str(rpc_call_identity(call)->name, who, sizeof(who)), p->shard);
        if (e < 0) {
                psd_reject(p, call, e, err);
                psd_request_done(&q);
                return;
        }
        pthread_mutex_lock(&r->mu);
        uint64_t mine = atomic_load(&r->epoch);
        bool primary = atomic_load(&r->role) == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY;
        if (h->epoch < mine || (primary && h->epoch == mine)) {
                /* the sender is a primary of an older epoch (frozen, partitioned): it is fenced */
                atomic_fetch_add(&r->fenced, 1);
                e = errf(err, sizeof(err), -ESTALE, "ps:%u at %s is at epoch %" PRIu64 "%s: an update of epoch %" PRIu64
                         " is refused (its sender is no longer the primary)", p->shard, p->args.listen, mine,
                         primary ? " as the primary" : "", h->epoch);
        } else {
                if (primary)
                        step_down(r, h->epoch, "a primary of a newer epoch replicates to it");
                atomic_store(&r->epoch, h->epoch);
                e = take(r, q.in, h, err, sizeof(err));
                if (e == 0 && h->snapshot)
                        log_info("ps:%u: backup of epoch %" PRIu64 " in sync (state transfer from %s at global_step "
                                 "%" PRIu64 ")", p->shard, h->epoch, r->peer_addr, h->global_step);
        }
        Psfleet__V1__ReplicateReply rep = PSFLEET__V1__REPLICATE_REPLY__INIT;
        rep.epoch = atomic_load(&r->epoch);
        rep.seq = r->seq;
        pthread_mutex_unlock(&r->mu);
        if (e < 0)
                rpc_call_fail_errno(call, e, "%s", err);   /* the primary decides and logs */
        else
                rpc_call_reply_msg(call, &rep.base);
        psd_request_done(&q);
}

void replica_on_set_role(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        struct replica *r = p->rep;
        char err[600];
        ProtobufCMessage *m = NULL;
        int e = wire_unpack(rpc_call_payload(call), &psfleet__v1__set_role_request__descriptor, &m);
        if (e < 0) {
                snprintf(err, sizeof(err), "SetRoleRequest does not parse");
                goto reject;
        }
        const Psfleet__V1__SetRoleRequest *q = (const Psfleet__V1__SetRoleRequest *)m;
        if ((e = psd_check_caller(p, q->caller, err, sizeof(err))) < 0)
                goto reject;
        if (!r) {
                e = errf(err, sizeof(err), -EINVAL, "ps:%u is not replicated (ps.replicas 1)", p->shard);
                goto reject;
        }
        if (q->role != PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY &&
            q->role != PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_BACKUP) {
                e = errf(err, sizeof(err), -EINVAL, "SetRole: role %d is neither primary nor backup", q->role);
                goto reject;
        }
        pthread_mutex_lock(&r->mu);
        uint64_t mine = atomic_load(&r->epoch);
        int was = atomic_load(&r->role), want = (int)q->role;
        if (q->epoch < mine) {
                pthread_mutex_unlock(&r->mu);
                e = errf(err, sizeof(err), -ESTALE, "SetRole of epoch %" PRIu64 ": ps:%u is at epoch %" PRIu64, q->epoch,
                         p->shard, mine);
                goto reject;
        }
        if (was == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY && want != was)
                step_down(r, q->epoch, "the chief says so");
        atomic_store(&r->epoch, q->epoch);
        atomic_store(&r->role, q->role);
        if (want == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY && (was != want || q->unreplicated_ok))
                atomic_store(&r->unreplicated_ok, true);   /* the chief knows: it just decided so */
        if (want == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY && was == want && q->unreplicated_ok &&
            q->epoch == mine && !atomic_load(&r->replicating))
                log_info("ps:%u: the chief recorded that the shard runs unreplicated: answering writes again",
                         p->shard);
        if (q->role == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY && was != want) {
                atomic_store(&r->replicating, false);   /* its backup is brought in by a state transfer */
                log_notice("ps:%u at %s is its shard's primary from epoch %" PRIu64 "%s", p->shard, p->args.listen,
                           q->epoch, atomic_load(&p->s->initialized) ? ", with every update its primary had acknowledged" : "");
        } else if (was != want || q->epoch != mine) {
                log_info("ps:%u at %s is its shard's %s at epoch %" PRIu64, p->shard, p->args.listen, replica_role_name((int)q->role),
                         q->epoch);
        }
        Psfleet__V1__SetRoleReply rep = PSFLEET__V1__SET_ROLE_REPLY__INIT;
        rep.epoch = q->epoch;
        rep.role = q->role;
        pthread_mutex_unlock(&r->mu);
        rpc_call_reply_msg(call, &rep.base);
        protobuf_c_message_free_unpacked(m, NULL);
        return;
reject:
        psd_reject(p, call, e, err);
        if (m)
                protobuf_c_message_free_unpacked(m, NULL);
}

void replica_status(struct replica *r, Psfleet__V1__ReplicaStatus *st, char *err_buf, size_t len) {
        if (!r)
                return;
        psfleet__v1__replica_status__init(st);
        st->role = atomic_load(&r->role);
        st->epoch = atomic_load(&r->epoch);
        st->peer = r->peer_addr;
        st->replicating = atomic_load(&r->replicating);
        st->awaiting_chief = st->role == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY && !st->replicating &&
                             !atomic_load(&r->unreplicated_ok);
        /* seq, acked and lag are the lock's; a status must not wait behind a write, so they are read as
         * they are (a torn read shows a lag a moment old) */
        st->seq = r->seq;
        st->acked = r->acked;
        st->lag_us = r->lag_us;
        st->fenced_writes = atomic_load(&r->fenced);
        st->dropped = atomic_load(&r->dropped);
        pthread_mutex_lock(&r->err_mu);
        snprintf(err_buf, len, "%s", r->last_error);
        pthread_mutex_unlock(&r->err_mu);
        st->last_error = err_buf;
}

int replica_new(struct psd *p, struct replica **ret) {
        *ret = NULL;
        if (p->cfg->ps.replicas < 2)
                return 0;
        struct replica *r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        r->p = p;
        pthread_mutex_init(&r->mu, NULL);
        pthread_mutex_init(&r->err_mu, NULL);
        atomic_init(&r->role, PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_BACKUP);
        const struct cluster *cl = &p->cfg->cluster;
        snprintf(r->peer_addr, sizeof(r->peer_addr), "%s",
                 p->args.backup ? cl->ps[p->shard].addr : cl->ps_backup[p->shard].addr);
        char name[32];
        snprintf(name, sizeof(name), "ps:%u", p->shard);   /* the same task: its certificate names it so */
        int e = rpc_channel_new(r->peer_addr, name, &r->peer);
        if (e < 0 || (e = -pthread_create(&r->thread, NULL, replica_main, r)) < 0) {
                replica_free(r);
                return e;
        }
        r->started = true;
        *ret = r;
        return 0;
}

struct replica *replica_free(struct replica *r) {
        if (!r)
                return NULL;
        atomic_store(&r->stop, true);
        if (r->started)
                pthread_join(r->thread, NULL);
        rpc_channel_free(r->peer);
        pthread_mutex_destroy(&r->mu);
        pthread_mutex_destroy(&r->err_mu);
        free(r);
        return NULL;
}
