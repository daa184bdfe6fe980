/* The steps every call into psd takes, whichever handler serves it: receive a message and check its
 * caller, the one gate of a shard the chief has not assigned yet, refuse (counted, remembered for the
 * status, logged), count a push, and lend a reply's values to gRPC. Calls nothing above it. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "metrics.h"
#include "util.h"

#include "psd-internal.h"

void psd_note_reject(struct psd *p, const char *msg) {
        atomic_fetch_add(&p->rejected, 1);
        metric_add(p->m_rejected, 1);
        pthread_mutex_lock(&p->err_mu);
        snprintf(p->last_error, sizeof(p->last_error), "%s", msg);
        pthread_mutex_unlock(&p->err_mu);
        /* an authorized but broken (or hostile) worker may send thousands: a few lines, and a count */
        static struct log_ratelimit rl = LOG_RATELIMIT_INIT(10000000u, 20);
        if (log_ratelimit_ok(&rl, "rejections"))
                log_warning("rejected: %s", msg);
}

/* The caller's fingerprint is not ours: the refusal says only that it differs (the job's fingerprint
 * is what a caller must know, so it is never handed out); both values go to psd's journal. */
int psd_check_caller(struct psd *p, const Psfleet__V1__Caller *c, char *err, size_t errlen) {
        uint64_t fp = c ? c->fingerprint : 0;
        if (fp != p->L->fingerprint) {
                char who[LOG_PEER_BUF];
                if (c && c->task && *c->task)
                        log_peer_str(c->task, who, sizeof(who));
                else
                        snprintf(who, sizeof(who), "the caller");
                log_warning("%s's job fingerprint %016llx differs from ps:%u's %016llx", who, (unsigned long long)fp,
                            p->shard, (unsigned long long)p->L->fingerprint);
                snprintf(err, errlen,
                         "the job fingerprint of %s differs from ps:%u's: the job files differ "
                         "(the chief names the difference when the worker joins)",
                         who, p->shard);
                return -EPERM;
        }
        return 0;
}

int psd_receive(struct psd *p, struct rpc_call *call, const ProtobufCMessageDescriptor *d, struct psd_request *q,
                char *err, size_t errlen) {
        int r;
        if ((r = wire_in_parse(rpc_call_take_payload(call), &q->in, err, errlen)) < 0)
                return r;
        if ((r = wire_in_header(q->in, d, &q->hm)) < 0)
                return errf(err, errlen, r, "%s does not parse", d->short_name);
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, "caller");
        return psd_check_caller(p, f ? *(const Psfleet__V1__Caller *const *)((const char *)q->hm + f->offset) : NULL,
                                err, errlen);
}

void psd_request_done(struct psd_request *q) {
        if (q->hm)
                protobuf_c_message_free_unpacked(q->hm, NULL);
        wire_in_free(q->in);
        *q = (struct psd_request){0};
}

void psd_reject(struct psd *p, struct rpc_call *call, int r, const char *err) {
        psd_note_reject(p, err);
        rpc_call_fail_errno(call, r, "%s", err);
}

int psd_ready(struct psd *p, char *err, size_t errlen) {
        if (atomic_load(&p->s->initialized))
                return 0;
        return errf(err, errlen, -EAGAIN, "ps:%u is not initialized yet (waiting for the chief)", p->shard);
}

bool psd_ready_or_refuse(struct psd *p, struct rpc_call *call) {
        char err[128];
        int r = psd_ready(p, err, sizeof(err));
        if (r < 0)
                rpc_call_fail_errno(call, r, "%s", err);
        return r == 0;
}

void psd_out_of_memory(struct psd *p, struct rpc_call *call) {
        rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "ps:%u: out of memory", p->shard);
}

uint64_t psd_count_push(struct psd *p, bool count_step, size_t bytes, size_t bytes_out, uint64_t t0) {
        uint64_t gs = 0;
        if (p->shard == 0)
                gs = count_step ? atomic_fetch_add(&p->s->global_step, 1) + 1 : atomic_load(&p->s->global_step);
        atomic_fetch_add(&p->pushes, 1);
        atomic_fetch_add(&p->bytes_in, bytes);
        atomic_fetch_add(&p->bytes_out, bytes_out);
        atomic_fetch_add(&p->apply_us, mono_us() - t0);
        metric_add(p->m_pushes, 1);
        metric_set(p->m_step, (double)gs);
        /* the last steps: a worker held now would wait for one that has stopped */
        if (p->ssp && gs + 1 >= p->cfg->training.max_steps)
                ssp_finish(p->ssp);
        return gs;
}

void psd_lent_release(void *ud) {
        struct psd_lent *l = ud;
        if (atomic_fetch_sub(&l->refs, 1) == 1)
                free(l);
}
