/* ps.replicas 2 with ps.replica_transport auto: a primary whose backup runs on its host forwards the
 * updates through a ring in shared memory (replica_ring.h) instead of Replicate calls.
 *
 * Every replicated psd listens on its replica socket, RUNTIME_DIR/JOB-ps-N.primary.sock for
 * cluster.ps[N] and JOB-ps-N.backup.sock for cluster.ps_backup[N] (the places in the cluster, not the
 * roles, which move). After a state transfer the primary makes a ring, sends its descriptor with a
 * nonce on the other psd's socket (which checks the sender's uid, shmlink_server), and then names the
 * nonce and its pid in a Replicate call, authenticated as ps:N: the backup maps the ring only when both
 * agree. No socket there (the backup on another host) or any refusal: the updates go through
 * Replicate calls as before.
 *
 * The primary publishes each update under its replica's lock (so in the shard's order) and answers the
 * push at once: the record is in memory the backup maps. The backup's ring thread applies the records
 * under the backup's replica lock. The primary's replica thread drops a backup whose ring head has not
 * moved for ps.replica_timeout_ms with updates pending (stopped, or too slow), or whose process is
 * gone. A promotion (SetRole) closes the ring and applies what was published before serving; a newer
 * primary's snapshot closes it too; the old primary's next publish is refused (replica_ring.h). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "rpc.h"
#include "util.h"
#include "wire.h"

#include "psd-internal.h"
#include "replica-internal.h"

#define M_REPLICATE "/psfleet.v1.ParameterServer/Replicate"
#define SEND_MS 1000u
#define RING_WAIT_MS 100u      /* the ring thread's sleep with nothing coming: woken by the first record */
#define RING_BATCH_MS 2u        /* and while records come: woken after this, or by a quarter of the ring */

static int socket_path(const struct psd *p, bool backup_place, char *buf, size_t len) {
        size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
        int n = snprintf(buf, len, "%s/%s-ps-%u.%s.sock", p->cfg->rpc.runtime_dir, p->cfg->name, p->shard,
                         backup_place ? "backup" : "primary");
        return n < 0 || (size_t)n >= len || (size_t)n >= max ? -ENAMETOOLONG : 0;
}

static void on_refused(void *ud, const char *why) {
        psd_note_reject(ud, why);
}

/* ---- the backup's side: the ring's records applied in order ---- */

/* Applies what is published (mu held): each record checked whole (its seq the next, each tensor a part
 * of this shard with its bytes as its dtype says) before it is applied. 0, or -EPROTO with why: the
 * stream is broken, the ring closed (the primary drops this backup, which waits for a transfer). */
static int drain(struct replica *r, char *why, size_t len) {
        struct shard *s = r->p->s;
        struct shard_part *parts[64], **pp = parts;
        uint32_t idx[64], *ip = idx;
        struct wire_tensor t[64], *tp = t;
        struct wire_seg seg[64], *sp = seg;
        size_t cap = 64;
        int e = 0;
        for (;;) {
                struct ring_rec rec;
                struct ring_body body;
                if ((e = ring_next(r->in, &rec, &body, why, len)) <= 0)
                        break;
                if (rec.seq != atomic_load(&r->seq) + 1) {
                        e = errf(why, len, -EPROTO, "update %" PRIu64 " in the ring after update %" PRIu64, rec.seq,
                                 atomic_load(&r->seq));
                        break;
                }
                if (rec.n > s->n_parts) {
                        e = errf(why, len, -EPROTO, "an update of %u tensors, ps:%u has %u parts", rec.n, s->index,
                                 s->n_parts);
                        break;
                }
                if (rec.n > cap) {   /* once, for shards of more than 64 parts */
                        if (pp != parts)
                                free(pp);
                        cap = s->n_parts;
                        pp = malloc(cap * (sizeof(*pp) + sizeof(*ip) + sizeof(*tp) + sizeof(*sp)));
                        if (!pp) {
                                e = errf(why, len, -ENOMEM, "out of memory");
                                break;
                        }
                        tp = (struct wire_tensor *)(pp + cap);
                        sp = (struct wire_seg *)(tp + cap);
                        ip = (uint32_t *)(sp + cap);
                }
                e = 0;
                for (uint32_t k = 0; k < rec.n && e == 0; k++) {
                        struct ring_tensor rt;
                        int slot;
                        if ((e = ring_tensor_next(&body, &rt, why, len)) < 0)
                                break;
                        if (rt.part >= s->n_parts) {
                                e = errf(why, len, -EPROTO, "part %u of a shard of %u", rt.part, s->n_parts);
                                break;
                        }
                        const struct shard_part *q = &s->parts[rt.part];
                        sp[k] = (struct wire_seg){.p = rt.data, .n = rt.nbytes};
                        tp[k] = (struct wire_tensor){.name = (char *)q->name, .dtype = rt.dtype, .ndims = 2,
                                                     .shape = {q->rows, q->cols}, .row_offset = q->row_begin,
                                                     .nbytes = rt.nbytes, .segs = &sp[k], .n_segs = 1};
                        if ((e = wire_tensor_check(&tp[k], why, len)) == 0)
                                e = shard_match(s, &tp[k], false, &pp[k], &slot, why, len);
                        ip[k] = rt.part;
                }
                if (e < 0) {
                        e = -EPROTO;
                        break;
                }
                replica_apply_dense(r, tp, rec.n, pp, ip, rec.seq, rec.gs, rec.count_step, rec.worker, rec.local_step);
                ring_consumed(r->in, rec.seq);
        }
        if (pp != parts)
                free(pp);
        return e < 0 ? e : 0;
}

/* Lets the backup's ring go (mu held): the ring thread frees one it sleeps on. */
static void let_go(struct replica *r) {
        struct ring *g = r->in;
        r->in = NULL;
        if (g && g == r->in_pinned)
                r->in_gone = g;
        else
                ring_free(g);
}

void replica_shm_close(struct replica *r, uint64_t epoch, bool drain_first) {
        if (!r->in)
                return;
        char why[400];
        ring_close(r->in, epoch);
        uint64_t before = atomic_load(&r->seq);
        if (drain_first && drain(r, why, sizeof(why)) < 0)
                log_warning("ps:%u: the ring from its primary ends in a bad update: %s", r->p->shard, why);
        if (drain_first)
                log_info("ps:%u: %" PRIu64 " update(s) still in the ring from its primary applied before it serves",
                         r->p->shard, atomic_load(&r->seq) - before);
        let_go(r);
}

/* The backup's ring thread: applies what is published. While records come it sleeps RING_BATCH_MS
 * between batches (or until a quarter of the ring waits): nothing waits for the backup's apply, and
 * each wake-up costs a task switch on the cores the workers compute on. */
static void *ring_main(void *arg) {
        struct replica *r = arg;
        char why[400];
        while (!atomic_load(&r->stop)) {
                pthread_mutex_lock(&r->mu);
                r->in_pinned = NULL;
                r->in_gone = ring_free(r->in_gone);
                uint64_t before = atomic_load(&r->seq);
                if (r->in && drain(r, why, sizeof(why)) < 0) {
                        /* broken: closed, so the primary's next publish is refused and it drops us */
                        log_warning("ps:%u: the ring from its primary is broken, waiting for a state transfer: %s",
                                    r->p->shard, why);
                        ring_close(r->in, atomic_load(&r->epoch));
                        atomic_store(&r->p->s->initialized, false);
                        let_go(r);
                }
                bool busy = atomic_load(&r->seq) != before;
                struct ring *g = r->in_pinned = r->in;
                pthread_mutex_unlock(&r->mu);
                if (g)
                        ring_wait(g, busy ? RING_BATCH_MS : RING_WAIT_MS, busy ? ring_data_size(g) / 4 : 1);
                else
                        usleep(RING_WAIT_MS * 1000);
        }
        return NULL;
}

int replica_shm_take(struct replica *r, const Psfleet__V1__ReplicateHeader *h, char *err, size_t errlen) {
        char why[400];
        int fd = -1, e;
        pid_t pid;
        uid_t uid;
        if (h->ring_nonce.len != RING_NONCE)
                return errf(err, errlen, -EINVAL, "a ring nonce of %zu bytes, expected %d", h->ring_nonce.len, RING_NONCE);
        if (!r->sock)
                return errf(err, errlen, -EINVAL, "ps:%u has no replica socket", r->p->shard);
        if ((e = shmlink_server_take(r->sock, h->ring_nonce.data, &fd, &pid, &uid, why, sizeof(why))) < 0)
                return errf(err, errlen, -EPERM, "no ring: %s", why);
        struct ring *g = NULL;
        if (pid != h->ring_pid)
                e = errf(why, sizeof(why), -EACCES, "the call names process %d, the ring came from process %d",
                         h->ring_pid, (int)pid);
        else
                e = ring_open(fd, h->ring_nonce.data, r->p->L->fingerprint, r->p->shard, &g, why, sizeof(why));
        close(fd);
        if (e < 0)
                return errf(err, errlen, e, "ps:%u refuses the ring of process %d: %s", r->p->shard, (int)pid, why);
        let_go(r);
        r->in = g;
        log_info("ps:%u: the updates of epoch %" PRIu64 " come through a ring in shared memory from process %d",
                 r->p->shard, h->epoch, (int)pid);
        return 0;
}

/* ---- the primary's side ---- */

int replica_shm_attach(struct replica *r, char *why, size_t len) {
        struct psd *p = r->p;
        struct shard *s = p->s;
        if (p->cfg->ps.replica_transport != REPLICA_TRANSPORT_AUTO || !r->peer_sock[0] ||
            access(r->peer_sock, F_OK) != 0)
                return -ENOENT;
        /* the largest update: every part, in float32 or a compressed dtype's worst (top-k, 5 bytes a value
         * and 2 a block) */
        size_t max_record = ring_record_bytes(s->n_parts, s->n_floats * 6 + (size_t)s->n_parts * 16);
        struct ring *g;
        int e = ring_create(p->L->fingerprint, p->shard, ring_size_for(max_record), &g, why, len);
        if (e < 0)
                return e;
        if ((e = shmlink_send(r->peer_sock, ring_fd(g), ring_nonce(g), SEND_MS, why, len)) < 0) {
                ring_free(g);
                return e == -ECONNREFUSED ? -ENOENT : e;
        }
        struct wire_out *o;
        if (wire_out_new(&o) < 0) {
                ring_free(g);
                return errf(why, len, -ENOMEM, "out of memory");
        }
        Psfleet__V1__ReplicateHeader h = PSFLEET__V1__REPLICATE_HEADER__INIT;
        Psfleet__V1__Caller c = PSFLEET__V1__CALLER__INIT;
        char task[32];
        snprintf(task, sizeof(task), "ps:%u", p->shard);
        c.task = task;
        c.fingerprint = p->L->fingerprint;
        h.caller = &c;
        h.epoch = atomic_load(&r->epoch);
        h.ring_nonce.data = (uint8_t *)ring_nonce(g);
        h.ring_nonce.len = RING_NONCE;
        h.ring_pid = (int32_t)getpid();
        wire_out_header(o, &h.base);
        grpc_byte_buffer *bb;
        e = wire_out_finish(o, &bb);
        wire_out_free(o);
        if (e < 0) {
                ring_free(g);
                return errf(why, len, -ENOMEM, "out of memory");
        }
        struct rpc_result res;
        rpc_call(r->peer, M_REPLICATE, bb, p->cfg->ps.replica_timeout_ms, false, &res);
        if (res.err < 0)
                e = errf(why, len, res.err, "%s", res.message);
        rpc_result_clear(&res);
        if (e < 0) {
                ring_free(g);
                return e;
        }
        r->out = g;
        atomic_store(&r->ring_mode, true);
        atomic_store(&r->ring_bytes, 0);
        atomic_store(&r->lag_us, 0);
        return 0;
}

/* A ring step failed (e, why; mu held): fenced (the ring closed at a newer epoch: this psd steps down)
 * or the backup is dropped. Returns -EAGAIN with err: the write is not answered as done. */
static int ring_failed(struct replica *r, int e, uint64_t closed, const char *why, char *err, size_t errlen) {
        if (e == -ESTALE && closed > atomic_load(&r->epoch)) {
                atomic_fetch_add(&r->fenced, 1);   /* a write of a primary its backup replaced */
                replica_step_down(r, closed, why);
                return errf(err, errlen, -EAGAIN, "ps:%u at %s was fenced by a newer primary of its shard: %s",
                            r->p->shard, r->p->args.listen, why);
        }
        replica_drop_backup(r, why);
        return errf(err, errlen, -EAGAIN, "ps:%u: its backup did not take the update: %s", r->p->shard, why);
}

int replica_shm_put(struct replica *r, const struct replica_update *u, char *err, size_t errlen) {
        struct ring_tensor t[64], *tp = u->n <= 64 ? t : malloc(u->n * sizeof(*tp));
        char why[400];
        uint64_t closed = 0;
        int e;
        if (!tp) {
                e = errf(why, sizeof(why), -ENOMEM, "out of memory");
        } else {
                for (size_t k = 0, at = 0; k < u->n; k++) {
                        const struct shard_part *pt = u->parts[k];
                        size_t n = u->raw ? u->sizes[k] : pt->a.n * sizeof(float);
                        tp[k] = (struct ring_tensor){.part = (uint32_t)(pt - r->p->s->parts), .nbytes = n,
                                                     .dtype = u->raw ? u->dtypes[k] : WIRE_DTYPE_FLOAT32,
                                                     .data = (u->raw ? u->raw : (const uint8_t *)u->grads) + at};
                        at += n;
                }
                struct ring_rec rec = {.seq = u->seq, .gs = u->gs, .local_step = u->push.local_step,
                                       .worker = u->push.worker, .count_step = u->push.count_step, .n = u->n};
                e = ring_put(r->out, &rec, tp, r->p->cfg->ps.replica_timeout_ms * 1000, &closed, why, sizeof(why));
        }
        if (tp != t)
                free(tp);
        return e == 0 ? 0 : ring_failed(r, e, closed, why, err, errlen);
}

int replica_shm_reserve(struct replica *r, const uint32_t *idx, uint32_t n, float **grads, char *err, size_t errlen) {
        struct ring_tensor t[64] = {{0}}, *tp = n <= 64 ? t : malloc(n * sizeof(*tp));
        char why[400];
        uint64_t closed = 0;
        void *data = NULL;
        int e;
        if (!tp) {
                e = errf(why, sizeof(why), -ENOMEM, "out of memory");
        } else {
                for (uint32_t k = 0; k < n; k++)
                        tp[k] = (struct ring_tensor){.part = idx[k], .dtype = WIRE_DTYPE_FLOAT32,
                                                     .nbytes = r->p->s->parts[idx[k]].a.n * sizeof(float)};
                e = ring_reserve(r->out, n, tp, r->p->cfg->ps.replica_timeout_ms * 1000, &closed, &data, why,
                                 sizeof(why));
        }
        if (tp != t)
                free(tp);
        *grads = data;
        return e == 0 ? 0 : ring_failed(r, e, closed, why, err, errlen);
}

int replica_shm_publish(struct replica *r, const struct ring_rec *rec, char *err, size_t errlen) {
        char why[400];
        uint64_t closed = 0;
        int e = ring_publish(r->out, rec, &closed, why, sizeof(why));
        return e == 0 ? 0 : ring_failed(r, e, closed, why, err, errlen);
}

void replica_shm_detach(struct replica *r) {
        r->out = ring_free(r->out);
        atomic_store(&r->ring_mode, false);
}

void replica_shm_tick(struct replica *r) {
        pthread_mutex_lock(&r->mu);
        if (r->out && atomic_load(&r->replicating)) {
                char why[300];
                uint64_t stalled = ring_stalled_us(r->out), limit = r->p->cfg->ps.replica_timeout_ms * 1000;
                pid_t pid = ring_backup_pid(r->out);
                atomic_store(&r->acked, ring_applied_seq(r->out));
                atomic_store(&r->ring_bytes, ring_pending(r->out));
                if (stalled >= limit) {
                        snprintf(why, sizeof(why), "it applied nothing of the %" PRIu64 " bytes in its ring for %" PRIu64
                                 " ms", ring_pending(r->out), stalled / 1000);
                        replica_drop_backup(r, why);
                } else if (pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH)) {
                        snprintf(why, sizeof(why), "its process %d is gone", (int)pid);
                        replica_drop_backup(r, why);
                }
        }
        pthread_mutex_unlock(&r->mu);
}

/* ---- both ---- */

int replica_shm_start(struct replica *r) {
        struct psd *p = r->p;
        char path[256], err[600];
        if (socket_path(p, p->args.backup, path, sizeof(path)) < 0 ||
            socket_path(p, !p->args.backup, r->peer_sock, sizeof(r->peer_sock)) < 0) {
                r->peer_sock[0] = 0;
                log_warning("ps:%u: no shared memory with its backup: the replica socket's path in %s is longer "
                            "than a unix socket's (rpc.runtime_dir)", p->shard, p->cfg->rpc.runtime_dir);
        } else if (p->cfg->ps.replica_transport == REPLICA_TRANSPORT_AUTO) {
                int e = shmlink_server_new(path, on_refused, p, &r->sock, err, sizeof(err));
                if (e == -EADDRINUSE)
                        return log_error_errno(e, "%s", err);
                if (e < 0)
                        log_warning("ps:%u: no replica socket, so no shared memory with a primary on this host: %s",
                                    p->shard, err);
        }
        int e = -pthread_create(&r->ring_thread, NULL, ring_main, r);
        r->ring_started = e == 0;
        return e;
}

void replica_shm_stop(struct replica *r) {
        if (r->ring_started)
                pthread_join(r->ring_thread, NULL);   /* r->stop is set: within RING_WAIT_MS */
        r->ring_started = false;
        if (r->in)   /* a clean stop: the primary's next publish is refused, and it drops this backup */
                ring_close(r->in, atomic_load(&r->epoch));
        r->in = ring_free(r->in);
        r->in_gone = ring_free(r->in_gone);
        r->out = ring_free(r->out);
        r->sock = shmlink_server_free(r->sock);
}
