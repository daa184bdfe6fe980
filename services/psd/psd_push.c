/* A push, whichever way it came, through one pipeline, top to bottom in psd_push_serve(): the gate
 * (assigned yet?) → check (everything before anything is applied, so a bad push changes nothing) →
 * the mode (sync: to the step; async and ssp: apply now) → apply → count → (ps.replicas 2: the
 * backup's acknowledgement, on the replica's thread) → reply. What differs
 * between the two transports is a table of steps (struct psd_push_ops), one per transport, both here:
 * a gRPC Push, whose gradients stream out of the message's slices and whose fresh values are lent to
 * the reply without another copy; and a worker's shared-memory push, whose gradients are read out of
 * its segment and whose fresh values are written straight back into it (links.c serves the link). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "authz.h"
#include "compress.h"
#include "log.h"
#include "metrics.h"
#include "util.h"
#include "wire.h"

#include "psd-internal.h"

/* One push in flight: what the pipeline reads, filled by the transport's adapter and its check. */
struct psd_push {
        const struct psd_push_ops *ops;
        struct psd *p;
        uint32_t worker;          /* whose push: the authenticated caller's, or the link's worker */
        uint64_t local_step;      /* the step its gradients were computed from */
        bool count_step;          /* shard 0 counts a step for it */
        uint64_t t0;              /* mono_us at receive */
        uint64_t gs;              /* global_step once applied */
        /* check fills these */
        size_t bytes, bytes_back;       /* of gradients in and values back, as they travel (psd_count_push) */
        size_t metric_in, metric_out;   /* what the byte counters count now (gRPC counts its reply's when built) */
};

/* A transport's steps. Every push ends in exactly one of reply, fail, or (held) answer; and the push
 * itself in release, once the pipeline is done with it (psd_push_serve, or the replica's thread). */
struct psd_push_ops {
        /* The gradients checked whole (u's bytes filled): 0, or -errno with err; -ENOMEM is ours (not
         * counted as a rejection), any other the sender's. */
        int (*check)(struct psd_push *u, char *err, size_t errlen);
        /* async, ssp: the checked gradients applied; the fresh values where reply sends them from */
        void (*apply)(struct psd_push *u);
        /* sync: the checked gradients, one part after the other (agg_push); NULL when out of memory */
        const float *(*gradients)(struct psd_push *u);
        /* A held record for u (its waiter's worker, version, parts and owner filled); NULL when out of
         * memory. drop: it was not held after all. */
        struct psd_held *(*hold)(struct psd_push *u);
        void (*drop)(struct psd_held *hd);
        /* answered now: status ok with global_step gs and the values apply wrote; or refused with msg */
        void (*reply)(struct psd_push *u, uint64_t gs);
        void (*fail)(struct psd_push *u, int r, const char *msg);
        /* a held push let go (status 0: the values read now) or ended (-ETIMEDOUT, -ECANCELED: msg) */
        void (*answer)(struct psd_held *hd, int status, uint64_t gs, const char *msg);
        /* ps.replicas 2: the update for the backup, the checked gradients as they are applied (float32,
         * scaled) with their parts (replica_update_new); NULL when out of memory */
        struct replica_update *(*update)(struct psd_push *u);
        /* ps.replicas 2 through a ring (replica_ring_active), the write begun: check's work, with the
         * gradients copied straight into room reserved in the ring (replica_write_reserve) and applied
         * from there; -ENOENT when there is no ring after all (nothing done). NULL: check, then update. */
        int (*check_ring)(struct psd_push *u, struct replica *rep, char *err, size_t errlen);
        void (*release)(struct psd_push *u);
};

/* ---- the pipeline ---- */

/* A held push released by the step or by ssp, on whichever thread let it go: ssp answers with
 * global_step, as async does; the sync step with the step its parts reached. */
static void held_release(struct agg_waiter *w, int status, uint64_t step, const char *msg) {
        struct psd_held *hd = (struct psd_held *)w;
        hd->ops->answer(hd, status, hd->p->ssp ? atomic_load(&hd->p->s->global_step) : step, msg);
}

static void held_init(struct psd *p, const struct psd_push *u, struct psd_held *hd) {
        hd->w.release = held_release;
        hd->ops = u->ops;
        hd->p = p;
}

static void count_bytes(struct psd *p, const struct psd_push *u) {
        metric_add(p->m_in, u->metric_in);
        if (u->metric_out)
                metric_add(p->m_out, u->metric_out);
}

/* ps.replicas 2, training.mode sync: the step's update made (under the aggregator's lock, with the
 * replica's held: agg_push's thread holds the write) from the parts one push completed and their mean
 * gradients, for sync_replicate to queue. */
void psd_sync_applied(void *ud, const uint32_t *idx, uint32_t n, const float *acc) {
        struct psd *p = ud;
        size_t floats = 0;
        for (uint32_t i = 0; i < n; i++)
                floats += p->s->parts[idx[i]].a.n;
        struct replica_update *ru = NULL;
        p->sync_applied = true;
        if (replica_update_new(n, floats, &ru) < 0)
                return;   /* NULL: sync_replicate drops the backup */
        struct shard_part **parts = replica_update_parts(ru);
        float *g = replica_update_grads(ru);
        for (uint32_t i = 0, at = 0; i < n; at += (uint32_t)parts[i]->a.n, i++) {
                parts[i] = &p->s->parts[idx[i]];
                memcpy(g + at, acc + (parts[i]->a.w - p->s->block), parts[i]->a.n * sizeof(float));
        }
        p->sync_update = ru;
}

/* The backup's answer to a step's update: the pushes it freed are let go (refused if it never came). */
static void sync_replicated(void *ud, int status, const char *why) {
        struct psd *p = ud;
        agg_advance(p->agg, status, why);
}

/* After agg_push, the write still held: the update of the parts it applied, if any, queued for the
 * backup (the pushes it frees are let go when the backup holds it), or, unreplicated, let go now. */
static void sync_replicate(struct psd *p, const struct psd_push *u) {
        struct replica_update *ru = p->sync_update;
        bool applied = p->sync_applied;
        p->sync_update = NULL;
        p->sync_applied = false;
        if (!applied) {
                replica_write_cancel(p->rep);
                return;
        }
        char err[300];
        struct replica_push who = {.worker = u->worker, .local_step = u->local_step};
        int r = replica_write_end(p->rep, ru, atomic_load(&p->s->global_step), &who, sync_replicated, p, err,
                                  sizeof(err));
        if (r <= 0 || r == 2)
                agg_advance(p->agg, r == 2 ? 0 : r, err);
        if (r == 2)
                replica_write_release(p->rep);
}

/* training.mode sync: the checked gradients go to the step (agg_push); the push is answered when the
 * step is applied (replicated: once the backup holds it), at once when they are stale (with the values
 * they missed), or refused. */
static void push_sync(struct psd *p, struct psd_push *u) {
        const struct psd_push_ops *ops = u->ops;
        struct psd_held *hd = ops->hold(u);
        const float *g = hd ? ops->gradients(u) : NULL;
        char err[300];
        int r;
        if (!g) {
                if (hd)
                        ops->drop(hd);
                snprintf(err, sizeof(err), "ps:%u: out of memory", p->shard);
                ops->fail(u, -ENOMEM, err);
                return;
        }
        if ((r = replica_write_begin(p->rep, err, sizeof(err))) < 0) {
                ops->drop(hd);
                ops->fail(u, r, err);
                return;
        }
        held_init(p, u, hd);
        count_bytes(p, u);
        psd_count_push(p, false, u->bytes, u->bytes_back, u->t0);
        uint64_t step;
        enum agg_verdict v = agg_push(p->agg, &hd->w, g, p->cfg->rpc.deadline_ms * 1000u, &step);
        if (p->rep)
                sync_replicate(p, u);
        if (v == AGG_HELD)
                return;   /* the step's until released */
        if (v == AGG_STALE) {
                held_release(&hd->w, 0, step, NULL);
                return;
        }
        snprintf(err, sizeof(err), "push of worker:%u computed from step %llu, but ps:%u is at step %llu: pull again",
                 u->worker, (unsigned long long)u->local_step, p->shard, (unsigned long long)step);
        psd_note_reject(p, err);
        ops->fail(u, -EAGAIN, err);
        ops->drop(hd);
}

/* training.mode ssp, shard 0: a worker's counting push, applied; true when its answer is held because
 * the worker is too far ahead (ssp.h), false to answer now (also when out of memory for the hold). */
static bool push_ssp_held(struct psd *p, struct psd_push *u) {
        struct psd_held *hd = u->ops->hold(u);
        if (!hd)
                return false;
        held_init(p, u, hd);
        if (ssp_arrive(p->ssp, &hd->w, u->local_step, p->cfg->rpc.deadline_ms * 1000u))
                return true;
        u->ops->drop(hd);
        return false;
}

/* An applied push answered: held under ssp until the slowest worker is near enough, else now. */
static void push_answer(struct psd *p, struct psd_push *u) {
        if (p->ssp && u->count_step && push_ssp_held(p, u))
                return;
        u->ops->reply(u, u->gs);
}

/* ps.replicas 2, mostly on the replica's thread: u's update acknowledged by the backup (status 0), or
 * given up */
static void push_replicated(void *ud, int status, const char *why) {
        struct psd_push *u = ud;
        if (status < 0)
                u->ops->fail(u, status, why);
        else
                push_answer(u->p, u);
        u->ops->release(u);
}

/* Under the write lock: u's checked gradients applied and counted (u->gs); whose update it is. */
static struct replica_push push_apply(struct psd *p, struct psd_push *u) {
        count_bytes(p, u);
        uint64_t t_apply = mono_us();
        u->ops->apply(u);
        metric_observe_us(p->m_apply, mono_us() - t_apply);
        u->gs = psd_count_push(p, u->count_step, u->bytes, u->bytes_back, u->t0);
        return (struct replica_push){.worker = u->worker, .local_step = u->local_step, .count_step = u->count_step};
}

/* ps.replicas 2 through a ring to a backup on this host, async and ssp: under the write lock the
 * gradients are checked straight into the ring, applied from there and published, so the update
 * costs no copy of its own; the push is answered at once (the backup maps the ring). -ENOENT: no ring
 * after all, nothing done (the usual way); else u was answered or refused. */
static int push_ring(struct psd *p, struct psd_push *u) {
        const struct psd_push_ops *ops = u->ops;
        char err[600];
        int r;
        if ((r = replica_write_begin(p->rep, err, sizeof(err))) < 0) {
                ops->fail(u, r, err);
                return r;
        }
        if ((r = ops->check_ring(u, p->rep, err, sizeof(err))) < 0) {
                replica_write_cancel(p->rep);
                if (r == -ENOENT)
                        return r;
                if (r != -ENOMEM && r != -EAGAIN)   /* the sender's gradients, not our backup */
                        psd_note_reject(p, err);
                ops->fail(u, r, err);
                return r;
        }
        struct replica_push who = push_apply(p, u);
        r = replica_write_publish(p->rep, u->gs, &who, err, sizeof(err));
        if (r == 0)   /* still under the lock: ssp moves the worker's clock in the order the backup does */
                push_answer(p, u);
        replica_write_release(p->rep);
        if (r < 0)
                ops->fail(u, r, err);
        return r;
}

/* The pipeline. Returns true when u waits for its backup's acknowledgement: push_replicated answers
 * and releases it then (and may have already); false when done with u (the caller releases it). */
static bool psd_push_serve(struct psd *p, struct psd_push *u) {
        const struct psd_push_ops *ops = u->ops;
        char err[600];
        int r;
        if ((r = psd_ready(p, err, sizeof(err))) < 0) {
                ops->fail(u, r, err);
                return false;
        }
        if (!p->agg && ops->check_ring && replica_ring_active(p->rep) && push_ring(p, u) != -ENOENT)
                return false;
        if ((r = ops->check(u, err, sizeof(err))) < 0) {
                if (r != -ENOMEM)
                        psd_note_reject(p, err);
                ops->fail(u, r, err);
                return false;
        }
        if (p->agg) {
                push_sync(p, u);
                return false;
        }
        /* replicated: the update for the backup made before the lock, applied and numbered under it (the
         * backup applies in that order), sent outside it while the next push applies, answered once the
         * backup has it (replica.h) */
        struct replica_update *ru = p->rep ? ops->update(u) : NULL;
        if ((r = replica_write_begin(p->rep, err, sizeof(err))) < 0) {
                replica_update_free(ru);
                ops->fail(u, r, err);
                return false;
        }
        struct replica_push who = push_apply(p, u);
        if ((r = replica_write_end(p->rep, ru, u->gs, &who, push_replicated, u, err, sizeof(err))) == 2) {
                push_answer(p, u);   /* in the ring: under the lock, in the backup's order */
                replica_write_release(p->rep);
                return false;
        }
        if (r != 0) {
                if (r > 0)
                        return true;   /* u may be answered and gone already */
                ops->fail(u, r, err);
                return false;
        }
        push_answer(p, u);
        return false;
}

/* ---- gRPC: the message's tensors in, the fresh values lent to the reply ---- */

struct grpc_push {
        struct psd_push u;        /* first */
        struct psd *p;
        struct rpc_call *call;
        struct psd_request q;
        const Psfleet__V1__PushHeader *h;
        struct shard_part **parts;   /* (n_tensors) each tensor's part */
        size_t total;                /* floats of them all */
        float scale;                 /* 1, or the clip's */
        uint32_t *dtypes;            /* (n_tensors) each one's answer (answer_dtypes) */
        struct psd_lent *vals;       /* async, ssp: the fresh values (room for total when wanted) */
        float *grads;                /* sync: the gradients, read out of the slices */
};

/* A held gRPC push: its call and parts; freed when answered or dropped. */
struct held_call {
        struct psd_held hd;       /* first */
        struct rpc_call *call;
        uint32_t n_values;        /* parts whose values the reply carries: all, or none */
        uint32_t worker;          /* whose push */
        uint64_t base;            /* its PushHeader.answer_base */
        uint32_t *dtypes;         /* (n) each one's answer */
        struct shard_part **parts;   /* (n) */
        uint32_t *idx;               /* (n) */
};

/* An answer's dtype with this bit: the part was pushed as int8 and the worker takes int8 changes
 * (PushHeader.delta_answers): its answer is INT8_DELTA, or FLOAT32 whole, and sets the worker's copy
 * (answers.h). */
#define ANSWER_KEEP 0x100u

static size_t answer_bytes(uint32_t dtype, size_t n) {
        dtype &= ~ANSWER_KEEP;
        return dtype == WIRE_DTYPE_INT8_DELTA ? wire_int8_size(n) : n * wire_dtype_size(dtype);
}

/* The indices of the kept parts among parts[0..n) into idx (room for n); returns how many, and in
 * *delta whether an answer as changes is planned for them. */
static size_t kept_parts(const struct psd *p, struct shard_part *const *parts, size_t n, const uint32_t *dtypes,
                         uint32_t *idx, bool *delta) {
        size_t k = 0;
        *delta = false;
        for (size_t i = 0; i < n; i++)
                if (dtypes[i] & ANSWER_KEEP) {
                        idx[k++] = (uint32_t)(parts[i] - p->s->parts);
                        *delta |= (dtypes[i] & ~ANSWER_KEEP) == WIRE_DTYPE_INT8_DELTA;
                }
        return k;
}

/* Each part's answer, from the dtype it was pushed as (dtypes: in, the tensors'; out, the answers'):
 * float32 for float32; for a compressed part bfloat16, or, for an int8 one when the worker takes int8
 * changes, a change on its copy when all of them stand at base, else whole (ANSWER_KEEP both). -ENOMEM. */
static int answer_dtypes(struct psd *p, uint32_t worker, bool delta_answers, uint64_t base,
                         struct shard_part *const *parts, size_t n, uint32_t *dtypes) {
        bool any = false;
        for (size_t i = 0; i < n; i++) {
                dtypes[i] = delta_answers && dtypes[i] == WIRE_DTYPE_INT8_BLOCKS ? ANSWER_KEEP | WIRE_DTYPE_FLOAT32
                                                                                : compress_answer_dtype(dtypes[i]);
                any |= (dtypes[i] & ANSWER_KEEP) != 0;
        }
        if (!any)
                return 0;   /* nothing kept: answered as before */
        uint32_t *idx = malloc((n + 1) * sizeof(uint32_t));
        if (!idx)
                return -ENOMEM;
        bool planned;
        size_t k = kept_parts(p, parts, n, dtypes, idx, &planned);
        if (k && psd_answers_at(p->answers, worker, idx, k, base))
                for (size_t i = 0; i < n; i++)
                        if (dtypes[i] & ANSWER_KEEP)
                                dtypes[i] = ANSWER_KEEP | WIRE_DTYPE_INT8_DELTA;
        free(idx);
        return 0;
}

/* One part's answer into o, its fresh values v lent from vals; a kept part through worker's copy (seq:
 * the answer's number, 0: the worker has none here), as a change when delta. */
static int answer_part(struct psd *p, struct wire_out *o, const struct shard_part *part, struct psd_lent *vals,
                       const float *v, uint32_t dtype, uint32_t worker, uint64_t seq, bool delta) {
        uint64_t shape[2] = {part->rows, part->cols};
        uint32_t idx = (uint32_t)(part - p->s->parts);
        if (seq && (dtype & ANSWER_KEEP) && delta) {
                size_t nb = wire_int8_size(part->a.n);
                uint8_t *buf = malloc(nb + 1);
                if (!buf)
                        return -ENOMEM;
                psd_answer_part(p->answers, worker, idx, v, true, seq, buf);   /* its copy is there: at base */
                return wire_out_tensor(o, part->name, WIRE_DTYPE_INT8_DELTA, shape, 2, part->row_begin, buf, nb, free,
                                       buf);
        }
        if (seq && (dtype & ANSWER_KEEP))
                psd_answer_part(p->answers, worker, idx, v, false, seq, NULL);   /* -ENOMEM: kept nowhere */
        if (dtype & ANSWER_KEEP)
                dtype = WIRE_DTYPE_FLOAT32;   /* whole */
        atomic_fetch_add(&vals->refs, 1);
        return wire_out_tensor_f32(o, part->name, dtype, shape, 2, part->row_begin, v, part->a.n, psd_lent_release, vals);
}

/* Answers a push with global_step gs and vals (owned): the fresh values of parts[0..n) one after the
 * other, lent to gRPC without another copy, or as int8 changes on worker's copies (base: the push's
 * answer_base). */
static void reply_values(struct psd *p, struct rpc_call *call, struct shard_part *const *parts, size_t n,
                         struct psd_lent *vals, uint64_t gs, const uint32_t *dtypes, uint32_t worker, uint64_t base) {
        Psfleet__V1__PushReplyHeader rh = PSFLEET__V1__PUSH_REPLY_HEADER__INIT;
        rh.global_step = gs;
        rh.incarnation = p->incarnation;
        struct wire_out *o = NULL;
        grpc_byte_buffer *bb;
        bool kept = false;   /* (no index of kept parts to build when none is, the usual case) */
        for (size_t i = 0; i < n; i++)
                kept |= (dtypes[i] & ANSWER_KEEP) != 0;
        uint32_t *idx = kept ? malloc((n + 1) * sizeof(uint32_t)) : NULL;
        if ((kept && !idx) || wire_out_new(&o) < 0) {
                free(idx);
                free(vals);
                psd_out_of_memory(p, call);
                return;
        }
        bool planned, delta = false;
        size_t k = kept ? kept_parts(p, parts, n, dtypes, idx, &planned) : 0;
        uint64_t seq = k ? psd_answer_begin(p->answers, worker, idx, k, base, planned, &delta) : 0;
        free(idx);
        rh.answer_seq = seq;
        wire_out_header(o, &rh.base);
        atomic_init(&vals->refs, 1);
        int r = 0;
        for (size_t i = 0, at = 0; i < n && r >= 0; at += parts[i]->a.n, i++)
                r = answer_part(p, o, parts[i], vals, vals->data + at, dtypes[i], worker, seq, delta);
        if (seq)
                psd_answer_end(p->answers, worker);
        if (r >= 0)
                r = wire_out_finish(o, &bb);
        wire_out_free(o);
        psd_lent_release(vals);
        if (r < 0) {
                psd_out_of_memory(p, call);
                return;
        }
        metric_add(p->m_out, grpc_byte_buffer_length(bb));
        rpc_call_reply(call, bb);
}

/* As reply_values, reading the parts' values now (a held push, answered when let go). */
static void reply_parts(struct psd *p, struct rpc_call *call, struct shard_part *const *parts, size_t n, uint64_t gs,
                        const uint32_t *dtypes, uint32_t worker, uint64_t base) {
        size_t total = 0;
        for (size_t i = 0; i < n; i++)
                total += parts[i]->a.n;
        struct psd_lent *vals = malloc(sizeof(*vals) + total * sizeof(float));
        if (!vals) {
                psd_out_of_memory(p, call);
                return;
        }
        for (size_t i = 0, at = 0; i < n; at += parts[i]->a.n, i++)
                shard_read(p->s, (uint32_t)(parts[i] - p->s->parts), 0, vals->data + at);
        reply_values(p, call, parts, n, vals, gs, dtypes, worker, base);
}

/* names, shapes, each part once, and (streamed out of gRPC's slices) all finite, within the norm */
static int grpc_check(struct psd_push *u, char *err, size_t errlen) {
        struct grpc_push *gp = (struct grpc_push *)u;
        struct psd *p = gp->p;
        const struct wire_in *in = gp->q.in;
        int r;
        if (!(gp->parts = calloc(in->n_tensors ? in->n_tensors : 1, sizeof(*gp->parts))))
                return errf(err, errlen, -ENOMEM, "ps:%u: out of memory", p->shard);
        if ((r = shard_wire_check(p->s, in, gp->h->caller->task, gp->parts, &gp->total, &gp->scale, err, errlen)) < 0)
                return r;
        /* each tensor as it travelled (compressed ones included), and its answer as it will */
        if (!(gp->dtypes = calloc(in->n_tensors + 1, sizeof(*gp->dtypes))))
                return errf(err, errlen, -ENOMEM, "ps:%u: out of memory", p->shard);
        u->bytes = u->bytes_back = 0;
        for (size_t i = 0; i < in->n_tensors; i++)
                gp->dtypes[i] = in->tensors[i].dtype;
        if (answer_dtypes(p, u->worker, gp->h->delta_answers && gp->h->want_values, gp->h->answer_base, gp->parts,
                          in->n_tensors, gp->dtypes) < 0)
                return errf(err, errlen, -ENOMEM, "ps:%u: out of memory", p->shard);
        for (size_t i = 0; i < in->n_tensors; i++) {
                u->bytes += in->tensors[i].nbytes;
                if (gp->h->want_values)
                        u->bytes_back += answer_bytes(gp->dtypes[i], gp->parts[i]->a.n);
        }
        u->metric_in = grpc_byte_buffer_length(in->bb);
        if (!p->agg && !(gp->vals = malloc(sizeof(*gp->vals) + (gp->h->want_values ? gp->total : 0) * sizeof(float))))
                return errf(err, errlen, -ENOMEM, "ps:%u: out of memory", p->shard);
        return 0;
}

static void grpc_apply(struct psd_push *u) {
        struct grpc_push *gp = (struct grpc_push *)u;
        shard_wire_apply(gp->p->s, gp->q.in, gp->parts, gp->scale, gp->h->want_values ? gp->vals->data : NULL);
}

static const float *grpc_gradients(struct psd_push *u) {
        struct grpc_push *gp = (struct grpc_push *)u;
        if ((gp->grads = malloc((gp->total + 1) * sizeof(float))))
                shard_wire_read(gp->q.in, gp->parts, gp->scale, gp->grads);
        return gp->grads;
}

static struct psd_held *grpc_hold(struct psd_push *u) {
        struct grpc_push *gp = (struct grpc_push *)u;
        size_t n = gp->q.in->n_tensors;
        struct held_call *hc = calloc(1, sizeof(*hc) + n * (sizeof(struct shard_part *) + 2 * sizeof(uint32_t)));
        if (!hc)
                return NULL;
        hc->call = gp->call;
        hc->worker = u->worker;
        hc->base = gp->h->answer_base;
        hc->parts = (struct shard_part **)(hc + 1);
        hc->idx = (uint32_t *)(hc->parts + n);
        hc->dtypes = hc->idx + n;
        hc->n_values = gp->h->want_values ? (uint32_t)n : 0;
        for (size_t i = 0; i < n; i++) {
                hc->parts[i] = gp->parts[i];
                hc->idx[i] = (uint32_t)(gp->parts[i] - gp->p->s->parts);
                hc->dtypes[i] = gp->dtypes[i];
        }
        hc->hd.w = (struct agg_waiter){.worker = u->worker, .version = u->local_step, .n = (uint32_t)n, .idx = hc->idx};
        return &hc->hd;
}

static void grpc_drop(struct psd_held *hd) {
        free(hd);
}

/* reply: the fresh values, lent without another copy (float32 for float32 gradients, bfloat16 for any
 * other: compress_answer_dtype), or int8 changes (answer_dtypes) */
static void grpc_reply(struct psd_push *u, uint64_t gs) {
        struct grpc_push *gp = (struct grpc_push *)u;
        reply_values(gp->p, gp->call, gp->parts, gp->h->want_values ? gp->q.in->n_tensors : 0, gp->vals, gs, gp->dtypes,
                     u->worker, gp->h->answer_base);
        gp->vals = NULL;
}

static void grpc_fail(struct psd_push *u, int r, const char *msg) {
        rpc_call_fail_errno(((struct grpc_push *)u)->call, r, "%s", msg);
}

static void grpc_answer(struct psd_held *hd, int status, uint64_t gs, const char *msg) {
        struct held_call *hc = (struct held_call *)hd;
        if (status == 0)
                reply_parts(hd->p, hc->call, hc->parts, hc->n_values, gs, hc->dtypes, hc->worker, hc->base);
        else
                rpc_call_fail_errno(hc->call, status, "ps:%u: %s", hd->p->shard, msg);
        free(hc);
}

/* unscaled: the tensors as they came (an int8 push's update goes to the backup in int8); scaled (a
 * clipped push): the gradients read out of the slices straight into the update, as applied */
static struct replica_update *grpc_update(struct psd_push *u) {
        struct grpc_push *gp = (struct grpc_push *)u;
        uint32_t n = (uint32_t)gp->q.in->n_tensors;
        struct replica_update *ru;
        if (gp->scale == 1.0f)
                return replica_update_wire(gp->q.in->tensors, n, gp->parts, &ru) < 0 ? NULL : ru;
        if (replica_update_new(n, gp->total, &ru) < 0)
                return NULL;
        memcpy(replica_update_parts(ru), gp->parts, n * sizeof(*gp->parts));
        shard_wire_read(gp->q.in, gp->parts, gp->scale, replica_update_grads(ru));
        return ru;
}

static void grpc_release(struct psd_push *u) {
        struct grpc_push *gp = (struct grpc_push *)u;
        free(gp->vals);
        free(gp->dtypes);
        free(gp->grads);
        free(gp->parts);
        psd_request_done(&gp->q);
        free(gp);
}

static const struct psd_push_ops grpc_ops = {
        .check = grpc_check, .apply = grpc_apply, .gradients = grpc_gradients, .hold = grpc_hold,
        .drop = grpc_drop, .reply = grpc_reply, .fail = grpc_fail, .answer = grpc_answer, .update = grpc_update,
        .release = grpc_release,
};

/* gRPC Push: received, its sender checked, then the pipeline (which may answer it later, from the
 * replica's thread: the push lives on the heap). */
void psd_on_push(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        struct grpc_push *gp = calloc(1, sizeof(*gp));
        char err[600], who[LOG_PEER_BUF];
        int r;
        if (!gp) {
                psd_out_of_memory(p, call);
                return;
        }
        *gp = (struct grpc_push){.u = {.ops = &grpc_ops, .p = p, .t0 = mono_us()}, .p = p, .call = call};
        if ((r = psd_receive(p, call, &psfleet__v1__push_header__descriptor, &gp->q, err, sizeof(err))) < 0)
                goto reject;
        const Psfleet__V1__PushHeader *h = gp->h = (const Psfleet__V1__PushHeader *)gp->q.hm;
        /* a push speaks for the worker its header names: in sync mode its gradient stands in that worker's
         * place in the sum, under ssp it moves that worker's clock. Only the worker itself may send it. */
        if (!authz_peer_is(rpc_call_identity(call), PEER_WORKER, h->worker)) {
                snprintf(err, sizeof(err), "Push as worker:%u from %s, which is not worker/%u", h->worker,
                         log_peer_str(rpc_call_identity(call)->name, who, sizeof(who)), h->worker);
                r = -EACCES;
                goto reject;
        }
        gp->u.worker = h->worker;
        gp->u.local_step = h->local_step;
        gp->u.count_step = h->count_step;
        if (!psd_push_serve(p, &gp->u))
                grpc_release(&gp->u);
        return;
reject:
        psd_reject(p, call, r, err);
        grpc_release(&gp->u);
}

/* ---- shared memory: the gradients in the worker's segment, the fresh values written back into it ---- */

struct link_push {
        struct psd_push u;        /* first */
        struct link *k;
        uint32_t gi, g, seq;      /* the group: its index in k's, its record in the segment; the push's seq */
        const uint32_t *parts;    /* (n) indices into the shard's parts */
        uint32_t n;
        float *grads;             /* where check copied the gradients: the link's scratch, or the ring */
};

/* copied out of the segment first (into grads), so the values checked are the values applied whatever
 * the other process does meanwhile; nothing applied unless all are finite */
static int link_check_into(struct psd_push *u, float *grads, char *err, size_t errlen) {
        struct link_push *lp = (struct link_push *)u;
        struct link *k = lp->k;
        struct psd *p = k->p;
        lp->grads = grads;
        int r = shard_block_check(p->s, shmlink_grads(k->l), lp->parts, lp->n, grads, k->name, err, errlen);
        if (r < 0)
                return r;
        size_t floats = 0;
        for (uint32_t i = 0; i < lp->n; i++)
                floats += p->s->parts[lp->parts[i]].a.n;
        u->bytes = u->bytes_back = u->metric_in = u->metric_out = floats * sizeof(float);
        return 0;
}

static int link_check(struct psd_push *u, char *err, size_t errlen) {
        return link_check_into(u, ((struct link_push *)u)->k->scratch, err, errlen);
}

/* through a ring: the gradients copied out of the segment straight into the room the update takes
 * there, checked and applied there */
static int link_check_ring(struct psd_push *u, struct replica *rep, char *err, size_t errlen) {
        struct link_push *lp = (struct link_push *)u;
        float *grads;
        int r = replica_write_reserve(rep, lp->parts, lp->n, &grads, err, errlen);
        return r < 0 ? r : link_check_into(u, grads, err, errlen);
}

/* the fresh values go where the worker's forward reads them */
static void link_apply(struct psd_push *u) {
        struct link_push *lp = (struct link_push *)u;
        shard_block_apply(lp->k->p->s, lp->parts, lp->n, lp->grads, shmlink_params(lp->k->l));
}

static const float *link_gradients(struct psd_push *u) {
        return ((struct link_push *)u)->grads;
}

/* The group's one record: a push held before, which the worker gave up on (it pushes a group again
 * only then), is dropped first. */
static struct psd_held *link_hold(struct psd_push *u) {
        struct link_push *lp = (struct link_push *)u;
        struct link *k = lp->k;
        struct link_held *lh = &k->held[lp->gi];
        if (k->p->agg)
                agg_cancel(k->p->agg, &lh->hd.w);
        if (k->p->ssp)
                ssp_forget(k->p->ssp, k);
        *lh = (struct link_held){.k = k, .g = lp->g, .seq = lp->seq};
        lh->hd.w = (struct agg_waiter){.worker = k->worker, .version = u->local_step, .n = lp->n, .idx = lp->parts,
                                       .owner = k};
        return &lh->hd;
}

static void link_drop(struct psd_held *hd) {
        (void)hd;   /* the group's record, in the link */
}

static void link_reply(struct psd_push *u, uint64_t gs) {
        struct link_push *lp = (struct link_push *)u;
        shmlink_reply(lp->k->l, lp->g, lp->seq, 0, gs, NULL);
}

static void link_fail(struct psd_push *u, int r, const char *msg) {
        struct link_push *lp = (struct link_push *)u;
        shmlink_reply(lp->k->l, lp->g, lp->seq, r, 0, msg);
}

static void link_answer(struct psd_held *hd, int status, uint64_t gs, const char *msg) {
        struct link_held *lh = (struct link_held *)hd;
        struct link *k = lh->k;
        if (status == 0)
                shard_block_read(hd->p->s, hd->w.idx, hd->w.n, shmlink_params(k->l));
        shmlink_reply(k->l, lh->g, lh->seq, status, gs, msg);
}

/* the gradients copied out of the link's scratch, which its next push reuses (through a ring, link_check_ring
 * puts them there instead) */
static struct replica_update *link_update(struct psd_push *u) {
        struct link_push *lp = (struct link_push *)u;
        struct shard *s = lp->k->p->s;
        size_t floats = u->bytes / sizeof(float);   /* link_check's: the group's floats */
        struct replica_update *ru;
        if (replica_update_new(lp->n, floats, &ru) < 0)
                return NULL;
        struct shard_part **parts = replica_update_parts(ru);
        for (uint32_t i = 0; i < lp->n; i++)
                parts[i] = &s->parts[lp->parts[i]];
        memcpy(replica_update_grads(ru), lp->grads, floats * sizeof(float));
        return ru;
}

static void link_release(struct psd_push *u) {
        struct link *k = ((struct link_push *)u)->k;
        free(u);
        atomic_fetch_sub(&k->pending, 1);   /* last: the link may go once it is 0 */
}

static const struct psd_push_ops link_ops = {
        .check = link_check, .apply = link_apply, .gradients = link_gradients, .hold = link_hold,
        .drop = link_drop, .reply = link_reply, .fail = link_fail, .answer = link_answer, .update = link_update,
        .release = link_release, .check_ring = link_check_ring,
};

/* A push in k's segment (its link's thread): the pipeline. The link's thread goes on to the worker's
 * next push while this one waits for the backup (ps.replicas 2), so the push lives on the heap, counted
 * in k->pending until released. */
void psd_push_link(struct link *k, const struct shmlink_push *push) {
        uint32_t gi = push->index;
        struct link_push *lp = malloc(sizeof(*lp));
        if (!lp) {
                shmlink_reply(k->l, k->groups[gi], push->seq, -ENOMEM, 0, "out of memory");
                return;
        }
        *lp = (struct link_push){
                .u = {.ops = &link_ops, .p = k->p, .worker = k->worker, .local_step = push->local_step,
                      .count_step = push->count_step, .t0 = mono_us()},
                .k = k, .gi = gi, .g = k->groups[gi], .seq = push->seq, .parts = k->parts + k->first[gi],
                .n = k->count[gi],
        };
        atomic_fetch_add(&k->pending, 1);
        if (!psd_push_serve(k->p, &lp->u))
                link_release(&lp->u);
}
