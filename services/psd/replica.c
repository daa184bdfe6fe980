/* ps.replicas 2: a shard's primary forwards every update it applies to its backup, in order, and the
 * chief moves the roles (replica.h). What is replicated: dense pushes of training.mode async, through
 * gRPC and shared memory alike, with global_step; under training.mode ssp the workers' clocks; under
 * training.mode sync each step's applied mean (an update of the parts it completed, which moves their
 * steps on the backup: agg_replayed), the pushes it frees answered once the backup holds it. Embedding
 * tables are refused at start (config) until they are.
 *
 * The order, and why the forward is not under the apply lock: a write takes the lock only to apply
 * its update and to number it (seq, the shard's order) and queue it. Outside the lock, with no call
 * in flight, the writing thread sends what is queued in one Replicate call (a batch); the replica's
 * thread takes the call's completion, answers its writes, and sends in one call whatever queued
 * meanwhile. So the next push applies while earlier ones are on the wire, and a shard's pushes
 * overlap again. One call in flight per shard, not one per push: the backup must apply in seq order,
 * and with several calls in flight it would have to put them back in order (hold one that came early,
 * time out on a gap that never fills); one call at a time keeps the order by construction and batches
 * by itself when pushes come faster than round trips. The replica's thread makes the state transfers
 * only with no call in flight. */
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

#include "agg.h"
#include "authz.h"
#include "log.h"
#include "optim.h"
#include "sparse_table.h"
#include "util.h"
#include "wire.h"

#include "psd-internal.h"
#include "replica-internal.h"

#define M_REPLICATE "/psfleet.v1.ParameterServer/Replicate"
#define M_STATUS "/psfleet.v1.ParameterServer/GetShardStatus"
#define TICK_US 100000u          /* the thread looks for a backup to bring in this often */
#define RETRY_US 1000000u        /* and tries one that failed again after this */
#define PROBE_MS 300u


static void set_error(struct replica *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(struct replica *r, const char *fmt, ...) {
        va_list ap;
        pthread_mutex_lock(&r->err_mu);
        va_start(ap, fmt);
        vsnprintf(r->last_error, sizeof(r->last_error), fmt, ap);
        va_end(ap);
        pthread_mutex_unlock(&r->err_mu);
}

const char *replica_role_name(int role) {
        return role == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY ? "primary" : "backup";
}

/* Answers the updates of the list u: each its done with status and why. */
static void answer(struct replica_update *u, int status, const char *why) {
        for (; u; u = u->next)
                u->done(u->ud, status, why);
}

static void update_free(struct replica_update *u) {
        if (u && u->sparse)
                replica_sparse_free(&u->sp);
        free(u);
}

static void free_list(struct replica_update *u) {
        while (u) {
                struct replica_update *next = u->next;
                update_free(u);
                u = next;
        }
}

/* The stream of updates ends (mu held): those queued and not yet sent are given up, not answered as
 * done (the backup may never get them); a batch on the wire meanwhile is its sender's to answer. */
static void end_stream(struct replica *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void end_stream(struct replica *r, const char *fmt, ...) {
        pthread_mutex_lock(&r->qmu);
        struct replica_update *u = r->head;
        r->head = NULL;
        r->tail = &r->head;
        r->gen++;
        pthread_mutex_unlock(&r->qmu);
        if (!u)
                return;
        char why[700];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        answer(u, -EAGAIN, why);
        free_list(u);
}

/* This psd steps down (mu held): its state may hold updates its shard's new primary never saw, so it
 * forgets them and waits, uninitialized, for the primary's state transfer. */
void replica_step_down(struct replica *r, uint64_t epoch, const char *why) {
        atomic_store(&r->role, PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_BACKUP);
        replica_shm_detach(r);
        if (epoch > atomic_load(&r->epoch))
                atomic_store(&r->epoch, epoch);
        atomic_store(&r->replicating, false);
        atomic_store(&r->p->s->initialized, false);
        atomic_store(&r->seq, 0);
        atomic_store(&r->acked, 0);
        end_stream(r, "ps:%u at %s was fenced by a newer primary of its shard: %s", r->p->shard, r->p->args.listen,
                   why);
        log_warning("ps:%u is no longer its shard's primary (%s): refusing writes, rejoining as the backup of epoch "
                    "%" PRIu64, r->p->shard, why, atomic_load(&r->epoch));
        set_error(r, "stepped down: %s", why);
}

void replica_drop_backup(struct replica *r, const char *why) {
        replica_shm_detach(r);
        atomic_store(&r->replicating, false);
        /* until the chief has recorded it, no write is answered: a chief that still took the backup
         * for in sync could otherwise promote it without updates this psd answered */
        atomic_store(&r->unreplicated_ok, false);
        atomic_fetch_add(&r->dropped, 1);
        end_stream(r, "ps:%u: its backup did not acknowledge the update: %s", r->p->shard, why);
        log_warning("ps:%u: dropped its backup %s: %s; the shard runs unreplicated until it catches up", r->p->shard,
                    r->peer_addr, why);
        set_error(r, "backup dropped: %s", why);
}

/* A Replicate call's outcome: 0 (its reply's epoch in *epoch_ret), -ESTALE (the backup is at a newer
 * epoch: we are fenced), or another -errno with why. */
static int replicated(const struct rpc_result *res, uint64_t *epoch_ret, char *why, size_t len) {
        if (res->err < 0) {
                errf(why, len, res->err, "%s", res->message);
                return res->status == GRPC_STATUS_FAILED_PRECONDITION ? -ESTALE : res->err;
        }
        ProtobufCMessage *m;
        if (wire_unpack(res->reply, &psfleet__v1__replicate_reply__descriptor, &m) == 0) {
                *epoch_ret = ((Psfleet__V1__ReplicateReply *)m)->epoch;
                protobuf_c_message_free_unpacked(m, NULL);
        }
        return 0;
}

/* One Replicate call to the backup, waited for (the state transfer): as replicated(). */
static int send(struct replica *r, struct wire_out *o, uint64_t timeout_ms, uint64_t *epoch_ret, char *why,
                size_t len) {
        grpc_byte_buffer *bb;
        int e = wire_out_finish(o, &bb);
        if (e < 0)
                return errf(why, len, e, "out of memory");
        struct rpc_result res;
        rpc_call(r->peer, M_REPLICATE, bb, timeout_ms, false, &res);
        e = replicated(&res, epoch_ret, why, len);
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

/* A dense update of n_parts parts with tail bytes after its head and parts (not zeroed: every caller
 * writes all of them, a dense push's are up to a megabyte). */
static struct replica_update *update_alloc(uint32_t n_parts, size_t floats, size_t tail) {
        size_t head = sizeof(struct replica_update) + (n_parts + 1) * sizeof(struct shard_part *);
        struct replica_update *u = malloc(head + tail);
        if (!u)
                return NULL;
        memset(u, 0, head);
        u->n = n_parts;
        u->floats = floats;
        u->parts = (struct shard_part **)(u + 1);
        return u;
}

int replica_update_new(uint32_t n_parts, size_t floats, struct replica_update **ret) {
        struct replica_update *u = update_alloc(n_parts, floats, floats * sizeof(float));
        if (!u)
                return -ENOMEM;
        u->grads = (float *)(u->parts + n_parts + 1);
        u->bytes = floats * sizeof(float);
        *ret = u;
        return 0;
}

bool replica_ring_active(struct replica *r) {
        return r && atomic_load(&r->ring_mode);
}

int replica_update_wire(const struct wire_tensor *t, uint32_t n, struct shard_part *const *parts,
                        struct replica_update **ret) {
        size_t bytes = 0, floats = 0;
        for (uint32_t k = 0; k < n; k++) {
                bytes += t[k].nbytes;
                floats += parts[k]->a.n;
        }
        /* after the parts: the sizes, the dtypes, the bytes (each array's alignment at least the next's) */
        struct replica_update *u = update_alloc(n, floats, n * (sizeof(size_t) + sizeof(uint32_t)) + bytes + 1);
        if (!u)
                return -ENOMEM;
        u->bytes = bytes;
        u->sizes = (size_t *)(u->parts + n + 1);
        u->dtypes = (uint32_t *)(u->sizes + n);
        u->raw = (uint8_t *)(u->dtypes + n);
        memcpy(u->parts, parts, n * sizeof(*parts));
        for (size_t k = 0, at = 0; k < n; at += t[k].nbytes, k++) {
                u->sizes[k] = t[k].nbytes;
                u->dtypes[k] = t[k].dtype;
                wire_tensor_copy(&t[k], u->raw + at);
        }
        *ret = u;
        return 0;
}

void replica_sparse_free(struct replica_sparse *sp) {
        free(sp->ids);
        free(sp->ids2);
        free(sp->vals);
        free(sp->ev);
        free(sp->ev2);
        *sp = (struct replica_sparse){0};
}

int replica_update_sparse(const struct replica_sparse *sp, struct replica_update **ret) {
        struct replica_update *u = calloc(1, sizeof(*u));
        if (!u) {
                struct replica_sparse gone = *sp;
                replica_sparse_free(&gone);
                return -ENOMEM;
        }
        u->sparse = true;
        u->sp = *sp;
        u->floats = sp->n_vals;
        *ret = u;
        return 0;
}

struct shard_part **replica_update_parts(struct replica_update *u) {
        return u->parts;
}

float *replica_update_grads(struct replica_update *u) {
        return u->grads;
}

struct replica_update *replica_update_free(struct replica_update *u) {
        update_free(u);
        return NULL;
}

static void start_batch(struct replica *r);

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

int replica_write_end(struct replica *r, struct replica_update *u, uint64_t gs, const struct replica_push *push,
                      replica_done_fn done, void *ud, char *err, size_t errlen) {
        if (!r)
                return 0;
        int ret = 0;
        if (!atomic_load(&r->replicating))
                goto out;
        if (!u) {
                replica_drop_backup(r, "out of memory for the update's copy");
                ret = errf(err, errlen, -ENOMEM, "ps:%u: out of memory", r->p->shard);
                goto out;
        }
        /* numbered under the lock that applied it: the backup applies in this order */
        u->seq = atomic_load(&r->seq) + 1;
        u->gs = gs;
        u->epoch = atomic_load(&r->epoch);
        u->push = *push;
        if (r->out) {   /* a backup on this host: published in its ring, it holds the update now */
                if ((ret = replica_shm_put(r, u, err, errlen)) < 0)
                        goto out;
                atomic_store(&r->seq, u->seq);
                atomic_fetch_add(&r->n_bytes, u->bytes);
                atomic_fetch_add(&r->n_values, u->floats);
                update_free(u);
                return 2;   /* the lock still held: the caller answers, then replica_write_release */
        }
        atomic_store(&r->seq, u->seq);
        u->done = done;
        u->ud = ud;
        pthread_mutex_lock(&r->qmu);
        *r->tail = u;
        r->tail = &u->next;
        pthread_mutex_unlock(&r->qmu);
        u = NULL;
        ret = 1;
out:
        pthread_mutex_unlock(&r->mu);
        update_free(u);
        if (ret > 0)
                start_batch(r);   /* at once if no call is in flight: no hand-over to the thread */
        return ret;
}

int replica_write_reserve(struct replica *r, const uint32_t *idx, uint32_t n, float **grads, char *err,
                          size_t errlen) {
        if (!r || !r->out || !atomic_load(&r->replicating))
                return -ENOENT;
        r->res_floats = 0;
        for (uint32_t k = 0; k < n; k++)
                r->res_floats += r->p->s->parts[idx[k]].a.n;
        return replica_shm_reserve(r, idx, n, grads, err, errlen);
}

int replica_write_publish(struct replica *r, uint64_t gs, const struct replica_push *push, char *err, size_t errlen) {
        int ret = -ENOENT;
        if (r->out) {   /* else dropped or stepped down meanwhile (by the reserve): refused as such */
                struct ring_rec rec = {.seq = atomic_load(&r->seq) + 1, .gs = gs, .local_step = push->local_step,
                                       .worker = push->worker, .count_step = push->count_step};
                ret = replica_shm_publish(r, &rec, err, errlen);   /* rec.n: the reservation's */
                if (ret == 0) {
                        atomic_store(&r->seq, rec.seq);
                        atomic_fetch_add(&r->n_bytes, r->res_floats * sizeof(float));
                        atomic_fetch_add(&r->n_values, r->res_floats);
                }
        }
        if (ret == -ENOENT)
                ret = errf(err, errlen, -EAGAIN, "ps:%u: the ring to its backup is gone", r->p->shard);
        return ret;
}

void replica_write_release(struct replica *r) {
        pthread_mutex_unlock(&r->mu);
}

void replica_write_cancel(struct replica *r) {
        if (r)
                pthread_mutex_unlock(&r->mu);
}

bool replica_is_primary(struct replica *r) {
        return !r || atomic_load(&r->role) == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY;
}

/* ---- the queue forwarded in batches, one call in flight ---- */

/* A batch in a Replicate call: its updates lent to gRPC, freed when both the call's completion and
 * gRPC are done with them. */
struct batch {
        atomic_uint refs;
        struct replica_update *list;
        uint64_t gen, t0;            /* the stream it is of; when it was sent */
};

static void batch_unref(void *arg) {
        struct batch *b = arg;
        if (atomic_fetch_sub(&b->refs, 1) > 1)
                return;
        free_list(b->list);
        free(b);
}

/* The bytes an update's gradients, values and ids take in a call. */
static size_t update_bytes(const struct replica_update *u) {
        return (u->sparse ? u->floats * sizeof(float) : u->bytes) +
               (u->sparse ? (u->sp.n_ids + u->sp.n_ids2) * sizeof(uint64_t) + u->sp.ev_len + u->sp.ev2_len : 0);
}

/* The head of the queue that one call carries: of one epoch, and no larger than a snapshot or an
 * embedding table's largest request (what the backup accepts: psd's largest legal request), but at
 * least one update. Taken off the queue (qmu held); its length in *n_ret. */
static struct replica_update *take_batch(struct replica *r, size_t *n_ret) {
        const struct shard *s = r->p->s;
        size_t max_bytes = (1 + s->n_slots) * s->n_floats * sizeof(float), max_tensors = (1 + s->n_slots) * (size_t)s->n_parts;
        size_t sparse_max = sparse_max_request(r->p);
        if (sparse_max > max_bytes)
                max_bytes = sparse_max - (64u << 10);
        if (r->p->n_tables && max_tensors < 64)
                max_tensors = 64;
        size_t n = 0, bytes = 0, tensors = 0;
        struct replica_update *first = r->head, *last = NULL;
        for (struct replica_update *u = first; u && u->epoch == first->epoch; u = u->next) {
                size_t nt = u->sparse ? 1 + SPARSE_MAX_SLOTS : u->n;
                if (n && (bytes + update_bytes(u) > max_bytes || tensors + nt > max_tensors))
                        break;
                bytes += update_bytes(u);
                tensors += nt;
                n++;
                last = u;
        }
        if (!last)
                return NULL;
        r->head = last->next;
        if (!r->head)
                r->tail = &r->head;
        last->next = NULL;
        *n_ret = n;
        return first;
}

/* A batch's call ended (e: replicated()'s): its writes answered as done if the backup holds them all,
 * whatever happened here meanwhile; else refused, and the backup dropped or this psd fenced unless
 * the batch's stream had ended already. Then the next batch, if any queued meanwhile. b NULL: list was
 * never lent (out of memory). */
static void complete(struct replica *r, struct batch *b, struct replica_update *list, uint64_t gen, uint64_t t0,
                     int e, uint64_t epoch, const char *why) {
        if (e == 0) {
                const struct replica_update *last = list;
                while (last->next)
                        last = last->next;
                atomic_store(&r->acked, last->seq);
                atomic_store(&r->lag_us, mono_us() - t0);
                answer(list, 0, NULL);
        } else {
                char msg[700];
                pthread_mutex_lock(&r->mu);
                if (gen == r->gen) {
                        if (e == -ESTALE)
                                replica_step_down(r, epoch, why);
                        else
                                replica_drop_backup(r, why);
                }
                pthread_mutex_unlock(&r->mu);
                /* the backup may not have them: not answered as done (the worker pulls again) */
                if (e == -ESTALE)
                        snprintf(msg, sizeof(msg), "ps:%u at %s was fenced by a newer primary of its shard: %s",
                                 r->p->shard, r->p->args.listen, why);
                else
                        snprintf(msg, sizeof(msg), "ps:%u: its backup did not acknowledge the update: %s",
                                 r->p->shard, why);
                answer(list, -EAGAIN, msg);
        }
        if (b)
                batch_unref(b);   /* the updates' memory goes once gRPC is done with it too */
        else
                free_list(list);
        pthread_mutex_lock(&r->qmu);
        r->in_flight = false;
        pthread_mutex_unlock(&r->qmu);
        start_batch(r);
}

/* Sends what is queued in one Replicate call, unless a call is in flight (its completion sends what
 * queued meanwhile) or psd is stopping. Any thread; the call's completion is the replica thread's. */
static void start_batch(struct replica *r) {
        size_t n = 0;
        pthread_mutex_lock(&r->qmu);
        struct replica_update *list = r->in_flight || atomic_load(&r->stop) ? NULL : take_batch(r, &n);
        uint64_t gen = r->gen, t0 = mono_us();
        if (list)
                r->in_flight = true;
        pthread_mutex_unlock(&r->qmu);
        if (!list)
                return;
        char why[600], task[32];
        Psfleet__V1__ReplicateHeader h;
        Psfleet__V1__Caller c;
        header_init(r, &h, &c, task, sizeof(task));
        h.epoch = list->epoch;
        Psfleet__V1__ReplicateUpdate *ups = calloc(n, sizeof(*ups));
        Psfleet__V1__ReplicateUpdate **pups = calloc(n, sizeof(*pups));
        struct batch *b = calloc(1, sizeof(*b));
        struct wire_out *o = NULL;
        struct rpc_pending *pd = NULL;
        grpc_byte_buffer *bb;
        size_t bytes = 0, values = 0;
        int e = -ENOMEM;
        if (b && ups && pups && wire_out_new(&o) == 0) {
                *b = (struct batch){.list = list, .gen = gen, .t0 = t0};
                atomic_init(&b->refs, 1);
                size_t i = 0;
                for (struct replica_update *u = list; u; u = u->next, i++) {
                        psfleet__v1__replicate_update__init(&ups[i]);
                        ups[i].seq = u->seq;
                        ups[i].global_step = u->gs;
                        ups[i].count_step = u->push.count_step;
                        ups[i].worker = u->push.worker;
                        ups[i].local_step = u->push.local_step;
                        ups[i].n_tensors = u->n;
                        pups[i] = &ups[i];
                        bytes += update_bytes(u);
                        values += u->floats;
                        if (u->sparse)
                                ups[i].n_tensors = sparse_update_out(r->p, o, &ups[i], &u->sp);
                        for (size_t k = 0, at = 0; !u->sparse && k < u->n; k++) {
                                const struct shard_part *pt = u->parts[k];
                                uint64_t shape[2] = {pt->rows, pt->cols};
                                size_t len = u->raw ? u->sizes[k] : pt->a.n * sizeof(float);
                                atomic_fetch_add(&b->refs, 1);
                                wire_out_tensor(o, pt->name, u->raw ? u->dtypes[k] : WIRE_DTYPE_FLOAT32, shape, 2,
                                                pt->row_begin, (u->raw ? u->raw : (uint8_t *)u->grads) + at, len,
                                                batch_unref, b);
                                at += len;
                        }
                }
                h.n_batch = n;
                h.batch = pups;
                wire_out_header(o, &h.base);
                if (wire_out_finish(o, &bb) == 0)
                        e = rpc_batch_start_ud(r->calls, r->peer, M_REPLICATE, bb, r->p->cfg->ps.replica_timeout_ms,
                                               false, b, &pd);
        }
        wire_out_free(o);
        free(pups);
        free(ups);
        if (e == 0) {   /* list may be gone already: its completion is another thread's */
                atomic_fetch_add(&r->n_calls, 1);
                atomic_fetch_add(&r->n_bytes, bytes);
                atomic_fetch_add(&r->n_values, values);
                return;
        }
        snprintf(why, sizeof(why), "%s", e == -ENOMEM ? "out of memory" : "cannot start the call");
        if (pd)   /* started and failed at once: no completion comes */
                rpc_batch_release(r->calls, pd);
        if (b && !b->list) {   /* not lent */
                free(b);
                b = NULL;
        }
        complete(r, b, list, gen, t0, e, 0, why);
}

/* The thread: a batch's call ended. */
static void on_call_done(struct replica *r, struct rpc_pending *pd) {
        struct batch *b = rpc_pending_userdata(pd);
        char why[600];
        uint64_t epoch = 0;
        int e = replicated(rpc_pending_result(pd), &epoch, why, sizeof(why));
        rpc_batch_release(r->calls, pd);
        complete(r, b, b->list, b->gen, b->t0, e, epoch, why);
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

static uint64_t transfer_timeout(const struct replica *r) {
        uint64_t t = r->p->cfg->ps.replica_timeout_ms;
        return t < 10000 ? 10000 : t;
}

/* A page of the transfer's rows: u, its tensors in o, one Replicate call waited for. */
static int send_page(void *ud, struct wire_out *o, const Psfleet__V1__ReplicateUpdate *u, char *why, size_t len) {
        struct replica *r = ud;
        Psfleet__V1__ReplicateHeader h;
        Psfleet__V1__Caller c;
        char task[32];
        header_init(r, &h, &c, task, sizeof(task));
        h.snapshot_rows = true;
        Psfleet__V1__ReplicateUpdate *pu = (Psfleet__V1__ReplicateUpdate *)u;
        h.n_batch = 1;
        h.batch = &pu;
        wire_out_header(o, &h.base);
        uint64_t epoch = 0;
        return send(r, o, transfer_timeout(r), &epoch, why, len);
}

/* Under the lock: every part with its slots and update counter, and global_step; then every
 * embedding table's rows with their slots. */
static int transfer(struct replica *r, char *why, size_t len) {
        struct psd *p = r->p;
        struct shard *s = p->s;
        unsigned ns = s->n_slots;
        float *buf = malloc(s->n_floats * (1 + ns) * sizeof(float) + 1);
        uint64_t *updates = calloc(s->n_parts + 1, sizeof(*updates));
        uint32_t W = p->ssp ? ssp_n_workers(p->ssp) : 0;
        uint64_t *clocks = calloc(2 * (size_t)W + 1, sizeof(*clocks));
        uint64_t *steps = calloc(s->n_parts + 1, sizeof(*steps));
        struct wire_out *o = NULL;
        int e = -ENOMEM;
        if (!buf || !updates || !clocks || !steps || wire_out_new(&o) < 0) {
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
        if (p->agg) {   /* the sync step: each part's, as no push can apply one meanwhile (the lock) */
                agg_steps_get(p->agg, steps);
                h.n_sync_steps = s->n_parts;
                h.sync_steps = steps;
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
        uint64_t epoch = 0;
        e = send(r, o, transfer_timeout(r), &epoch, why, len);
        if (e == 0 && p->n_tables)   /* then the tables' rows, a page at a time */
                e = sparse_transfer(p, send_page, r, why, len);
        if (e == -ESTALE)
                replica_step_down(r, epoch, why);
out:
        wire_out_free(o);
        free(steps);
        free(clocks);
        free(updates);
        free(buf);
        return e;
}

/* The replica's one thread: takes the completions of the calls that carry the updates (and sends what
 * queued meanwhile) and, while the shard runs unreplicated, brings its backup in by a state transfer,
 * never while a call of updates is in flight. */
static void *replica_main(void *arg) {
        struct replica *r = arg;
        uint64_t next = 0;
        char why[600];
        while (!atomic_load(&r->stop)) {
                struct rpc_pending *pd = rpc_batch_next(r->calls, TICK_US / 1000);
                if (pd) {
                        on_call_done(r, pd);
                        continue;
                }
                replica_shm_tick(r);
                pthread_mutex_lock(&r->qmu);
                bool in_flight = r->in_flight;
                pthread_mutex_unlock(&r->qmu);
                if (atomic_load(&r->role) != PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY ||
                    !atomic_load(&r->p->s->initialized) || atomic_load(&r->replicating) || in_flight ||
                    mono_us() < next)
                        continue;
                next = mono_us() + RETRY_US;
                int e = peer_ready(r, why, sizeof(why));
                pthread_mutex_lock(&r->mu);
                if (e == -ESTALE) {
                        replica_step_down(r, 0, why);
                } else if (e < 0) {
                        set_error(r, "no backup: %s", why);
                } else if (atomic_load(&r->role) == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY &&
                           !atomic_load(&r->replicating)) {
                        /* nothing queued or in flight: updates are queued only while replicating */
                        uint64_t t0 = mono_us();
                        if ((e = transfer(r, why, sizeof(why))) == 0) {
                                int se = r->p->n_tables ? -ENOENT : replica_shm_attach(r, why, sizeof(why));
                                if (se < 0 && se != -ENOENT)
                                        log_warning("ps:%u: no shared memory with backup %s, forwarding through "
                                                    "Replicate calls: %s", r->p->shard, r->peer_addr, why);
                                atomic_store(&r->seq, 0);
                                atomic_store(&r->acked, 0);
                                atomic_store(&r->n_calls, 0);
                                atomic_store(&r->n_bytes, 0);
                                atomic_store(&r->n_values, 0);
                                atomic_store(&r->replicating, true);
                                log_info("ps:%u: backup %s in sync at epoch %" PRIu64 " (state transfer of %zu bytes "
                                         "in %" PRIu64 " ms); every update is forwarded to it from now on%s",
                                         r->p->shard, r->peer_addr, atomic_load(&r->epoch),
                                         r->p->s->n_floats * (1 + r->p->s->n_slots) * sizeof(float),
                                         (mono_us() - t0) / 1000, r->out ? ", through a ring in shared memory" : "");
                                set_error(r, "%s", "");
                        } else if (e != -ESTALE) {
                                set_error(r, "state transfer to %s failed: %s", r->peer_addr, why);
                        }
                }
                pthread_mutex_unlock(&r->mu);
        }
        /* stopping: the call in flight ends (within ps.replica_timeout_ms) and its writes are answered */
        while (rpc_batch_running(r->calls) > 0) {
                struct rpc_pending *pd = rpc_batch_next(r->calls, 1000);
                if (pd)
                        on_call_done(r, pd);
        }
        return NULL;
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
        st->seq = atomic_load(&r->seq);
        st->acked = atomic_load(&r->acked);
        st->lag_us = atomic_load(&r->lag_us);
        st->calls = atomic_load(&r->n_calls);
        st->bytes = atomic_load(&r->n_bytes);
        st->values = atomic_load(&r->n_values);
        st->ring = atomic_load(&r->ring_mode);
        st->ring_bytes = atomic_load(&r->ring_bytes);
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
        pthread_mutex_init(&r->qmu, NULL);
        r->tail = &r->head;
        atomic_init(&r->role, PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_BACKUP);
        const struct cluster *cl = &p->cfg->cluster;
        snprintf(r->peer_addr, sizeof(r->peer_addr), "%s",
                 p->args.backup ? cl->ps[p->shard].addr : cl->ps_backup[p->shard].addr);
        char name[32];
        snprintf(name, sizeof(name), "ps:%u", p->shard);   /* the same task: its certificate names it so */
        int e = rpc_channel_new(r->peer_addr, name, &r->peer);
        if (e < 0 || (e = rpc_batch_new(&r->calls)) < 0 || (e = replica_shm_start(r)) < 0 ||
            (e = -pthread_create(&r->thread, NULL, replica_main, r)) < 0) {
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
        replica_shm_stop(r);
        /* after the server and the links no write can come; one queued as the thread stopped is refused */
        answer(r->head, -ECANCELED, "psd is stopping");
        free_list(r->head);
        rpc_batch_free(r->calls);
        rpc_channel_free(r->peer);
        pthread_mutex_destroy(&r->qmu);
        pthread_mutex_destroy(&r->mu);
        pthread_mutex_destroy(&r->err_mu);
        free(r);
        return NULL;
}
