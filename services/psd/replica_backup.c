/* ps.replicas 2, the backup's side (replica.h): a Replicate call taken — a snapshot, a page of the
 * tables' rows, or a batch of updates in the primary's order, each applied as the primary applied it —
 * and the chief's SetRole, which moves a psd between primary and backup at an epoch. The primary's
 * side (numbering, forwarding, the state transfer) is replica.c. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "agg.h"
#include "authz.h"
#include "log.h"
#include "util.h"
#include "wire.h"

#include "psd-internal.h"
#include "replica-internal.h"

void replica_apply_dense(struct replica *r, const struct wire_tensor *t, size_t n, struct shard_part *const *parts,
                         const uint32_t *idx, uint64_t seq, uint64_t gs, bool count_step, uint32_t worker,
                         uint64_t local_step) {
        struct shard *s = r->p->s;
        /* the gradients as the primary applied them (scaled): the same apply, the same bits */
        shard_tensors_apply(s, t, n, parts, 1.0f, NULL);
        if (r->p->agg)   /* a sync step: its parts' steps, and global_step with them */
                agg_replayed(r->p->agg, idx, n);
        else if (s->index == 0)
                atomic_store(&s->global_step, gs);
        if (count_step && r->p->ssp)
                ssp_note(r->p->ssp, worker, local_step);
        atomic_store(&r->seq, seq);
}

/* A snapshot (every part with its slots, the counters) or one update, in order. mu held. */
static int take(struct replica *r, const struct wire_in *in, const Psfleet__V1__ReplicateHeader *h, char *err,
                size_t errlen) {
        struct shard *s = r->p->s;
        int e;
        if (h->snapshot) {
                if (h->n_updates != s->n_parts)
                        return errf(err, errlen, -EINVAL, "snapshot of %zu part counters, ps:%u has %u parts",
                                    h->n_updates, r->p->shard, s->n_parts);
                if (r->p->agg && h->n_sync_steps != s->n_parts)
                        return errf(err, errlen, -EINVAL, "snapshot of %zu sync steps, ps:%u (training.mode sync) has "
                                    "%u parts", h->n_sync_steps, r->p->shard, s->n_parts);
                replica_shm_close(r, h->epoch, false);   /* an older stream's: this state replaces it */
                if ((e = shard_assign(s, in, true, h->global_step, err, errlen)) < 0)
                        return e;
                for (uint32_t k = 0; k < s->n_parts; k++) {
                        pthread_mutex_lock(&s->parts[k].mu);
                        s->parts[k].a.updates = h->updates[k];
                        pthread_mutex_unlock(&s->parts[k].mu);
                }
                if (r->p->ssp && h->n_clocks == ssp_n_workers(r->p->ssp) && h->n_raw_steps == h->n_clocks)
                        ssp_copy_in(r->p->ssp, h->clocks, h->raw_steps);
                if (r->p->agg)
                        agg_steps_set(r->p->agg, h->sync_steps);
                sparse_tables_clear(r->p);   /* the transfer's pages of rows follow (snapshot_rows) */
                atomic_store(&r->seq, 0);
                return 0;
        }
        if (h->snapshot_rows) {   /* a page of the transfer's rows: one import, which takes no seq */
                if (h->n_batch != 1 || !h->batch[0]->table || !h->batch[0]->import ||
                    h->batch[0]->n_tensors != in->n_tensors)
                        return errf(err, errlen, -EINVAL, "a page of the state transfer's rows must be one table's import");
                if (!atomic_load(&s->initialized))
                        return errf(err, errlen, -EINVAL, "a page of rows before the snapshot");
                return sparse_replay(r->p, h->batch[0], in, 0, err, errlen);
        }
        if (h->ring_nonce.len) {   /* from now on the updates come through a ring (replica_shm.c) */
                if (!atomic_load(&s->initialized))
                        return errf(err, errlen, -EINVAL, "a ring before the snapshot");
                return replica_shm_take(r, h, err, errlen);
        }
        replica_shm_close(r, h->epoch, false);   /* updates through calls: a ring taken before is unused */
        /* a batch: every update in order after the last, every dense tensor a part; a dense update is
         * checked before any is applied, a table's as it comes (the backup is dropped on an error) */
        if (!atomic_load(&s->initialized))
                return errf(err, errlen, -EINVAL, "updates of epoch %" PRIu64 ": ps:%u has had no state transfer yet",
                            h->epoch, r->p->shard);
        size_t tensors = 0;
        for (size_t b = 0; b < h->n_batch; b++) {
                if (h->batch[b]->seq != atomic_load(&r->seq) + 1 + b)
                        return errf(err, errlen, -EINVAL, "update %" PRIu64 " of epoch %" PRIu64 " out of order: ps:%u "
                                    "holds update %" PRIu64, h->batch[b]->seq, h->epoch, r->p->shard,
                                    atomic_load(&r->seq) + b);
                tensors += h->batch[b]->n_tensors;
        }
        if (tensors != in->n_tensors)
                return errf(err, errlen, -EINVAL, "a batch of %zu updates of %zu tensors in all, with %zu tensors",
                            h->n_batch, tensors, in->n_tensors);
        struct shard_part **parts = calloc(in->n_tensors + 1, sizeof(*parts));
        uint32_t *idx = calloc(in->n_tensors + 1, sizeof(*idx));
        if (!parts || !idx) {
                free(idx);
                free(parts);
                return errf(err, errlen, -ENOMEM, "out of memory");
        }
        for (size_t b = 0, at = 0; b < h->n_batch; at += h->batch[b]->n_tensors, b++) {
                for (size_t i = at; !h->batch[b]->table && i < at + h->batch[b]->n_tensors; i++) {
                        int slot;
                        if ((e = shard_match(s, &in->tensors[i], false, &parts[i], &slot, err, errlen)) < 0) {
                                free(idx);
                                free(parts);
                                return e;
                        }
                        idx[i] = (uint32_t)(parts[i] - s->parts);
                }
        }
        for (size_t b = 0, at = 0; b < h->n_batch; at += h->batch[b]->n_tensors, b++) {
                const Psfleet__V1__ReplicateUpdate *u = h->batch[b];
                if (u->table) {   /* an embedding table's write, checked whole before it is applied */
                        if ((e = sparse_replay(r->p, u, in, at, err, errlen)) < 0) {
                                free(idx);
                                free(parts);
                                return e;
                        }
                        atomic_store(&r->seq, u->seq);
                        continue;
                }
                replica_apply_dense(r, in->tensors + at, u->n_tensors, parts + at, idx + at, u->seq, u->global_step,
                                    u->count_step, u->worker, u->local_step);
        }
        free(idx);
        free(parts);
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
                        replica_step_down(r, h->epoch, "a primary of a newer epoch replicates to it");
                atomic_store(&r->epoch, h->epoch);
                e = take(r, q.in, h, err, sizeof(err));
                if (e == 0 && h->snapshot)
                        log_info("ps:%u: backup of epoch %" PRIu64 " in sync (state transfer from %s at global_step "
                                 "%" PRIu64 ")", p->shard, h->epoch, r->peer_addr, h->global_step);
        }
        Psfleet__V1__ReplicateReply rep = PSFLEET__V1__REPLICATE_REPLY__INIT;
        rep.epoch = atomic_load(&r->epoch);
        rep.seq = atomic_load(&r->seq);
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
                replica_step_down(r, q->epoch, "the chief says so");
        if (want == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY && was != want)
                replica_shm_close(r, q->epoch, true);   /* every update its primary published, applied first */
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

