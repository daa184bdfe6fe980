/* psd's workers on this host: the links their pushes come through (a shared-memory segment, and a
 * thread per worker that hands each push to the pipeline, psd_push.c), and the attach that makes one:
 * the segment's descriptor over psd's unix socket, tied to the authenticated worker's
 * AttachSharedMemory call (shmlink.h). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "authz.h"
#include "log.h"
#include "psd-internal.h"
#include "util.h"

/* ---- a link's thread: each push the worker makes goes to the pipeline (psd_push.c) ---- */

static void *link_main(void *arg) {
        struct link *k = arg;
        const char *why = "stopping";
        for (;;) {
                struct shmlink_push push;
                int r = shmlink_next(k->l, k->groups, k->n_groups, k->last, LINK_SPIN_US, 1000, &k->stop, &push);
                if (r > 0) {
                        psd_push_link(k, &push);
                } else if (r < 0) {
                        if (!atomic_load(&k->stop))
                                why = "the worker ended it";
                        break;
                } else if (!shmlink_worker_alive(k->l)) {
                        why = "the worker's process is gone";
                        break;
                }
        }
        log_info("worker:%u's shared-memory link ended: %s", k->worker, why);
        atomic_store(&k->ended, true);
        return NULL;
}

static struct link *link_free(struct link *k) {
        if (!k)
                return NULL;
        if (k->started) {
                atomic_store(&k->stop, true);
                shmlink_kick(k->l);
                pthread_join(k->thread, NULL);
        }
        /* its pushes still waiting for the backup's acknowledgement answer into the segment and its held
         * records: the replica's thread ends each within ps.replica_timeout_ms */
        while (atomic_load(&k->pending))
                usleep(1000);
        if (k->p->agg)
                agg_forget(k->p->agg, k);   /* its held pushes: nobody reads their answers any more */
        if (k->p->ssp)
                ssp_forget(k->p->ssp, k);
        shmlink_free(k->l);
        free(k->held);   /* and the groups' arrays, parts */
        free(k->scratch);
        free(k);
        return NULL;
}

/* Unlinks the links whose thread ended (and, with worker != UINT32_MAX, that worker's link) into a
 * list the caller frees outside links_mu. */
struct link *links_take(struct psd *p, uint32_t worker) {
        struct link *gone = NULL;
        pthread_mutex_lock(&p->links_mu);
        for (struct link **pk = &p->links; *pk;) {
                struct link *k = *pk;
                if (atomic_load(&k->ended) || k->worker == worker) {
                        *pk = k->next;
                        k->next = gone;
                        gone = k;
                } else {
                        pk = &k->next;
                }
        }
        pthread_mutex_unlock(&p->links_mu);
        return gone;
}

void links_free(struct link *k) {
        while (k) {
                struct link *next = k->next;
                link_free(k);
                k = next;
        }
}

uint32_t links_count(struct psd *p) {
        uint32_t n = 0;
        pthread_mutex_lock(&p->links_mu);
        for (struct link *k = p->links; k; k = k->next)
                n += !atomic_load(&k->ended);
        pthread_mutex_unlock(&p->links_mu);
        return n;
}

/* The groups of an attach request, checked against this shard: each part once, every part ours. */
static int link_groups(struct psd *p, struct link *k, const Psfleet__V1__AttachSharedMemoryRequest *q, char *err,
                       size_t errlen) {
        uint32_t n_plan = p->L->plan->n_parts, n = (uint32_t)q->n_groups, at = 0;
        bool *seen = calloc(n_plan + 1, sizeof(bool));
        bool *gseen = calloc(shmlink_n_groups(k->l) + 1, sizeof(bool));
        k->n_groups = n;
        /* the held records, then the groups' four arrays and their parts (each part once: no more than
         * the shard's): one allocation, as they live as long */
        k->held = calloc(1, ((size_t)n + 1) * (sizeof(*k->held) + 4 * sizeof(uint32_t)) +
                                    (p->s->n_parts + 1) * sizeof(uint32_t));
        int r = -ENOMEM;
        size_t largest = 1;
        if (!seen || !gseen || !k->held) {
                errf(err, errlen, r, "out of memory");
                goto out;
        }
        k->groups = (uint32_t *)(k->held + n + 1);
        k->last = k->groups + n + 1;
        k->first = k->last + n + 1;
        k->count = k->first + n + 1;
        k->parts = k->count + n + 1;
        r = -EINVAL;
        for (size_t i = 0; i < q->n_groups; i++) {
                const Psfleet__V1__PushGroup *pg = q->groups[i];
                if (pg->index >= shmlink_n_groups(k->l) || gseen[pg->index]) {
                        errf(err, errlen, r, "group %u: no such group in the segment, or given twice", pg->index);
                        goto out;
                }
                gseen[pg->index] = true;
                k->groups[i] = pg->index;
                k->first[i] = at;
                size_t floats = 0;
                for (size_t j = 0; j < pg->n_parts; j++) {
                        uint32_t pp = pg->parts[j];
                        int part = shard_plan_part(p->s, pp);
                        if (part < 0 || seen[pp]) {
                                errf(err, errlen, r, "group %u: part %u is not a part of ps:%u, or is given twice",
                                     pg->index, pp, p->shard);
                                goto out;
                        }
                        seen[pp] = true;
                        k->parts[at++] = (uint32_t)part;
                        floats += p->s->parts[part].a.n;
                }
                k->count[i] = at - k->first[i];
                largest = floats > largest ? floats : largest;
        }
        if (!(k->scratch = malloc(largest * sizeof(float)))) {
                r = errf(err, errlen, -ENOMEM, "out of memory");
                goto out;
        }
        r = 0;
out:
        free(seen);
        free(gseen);
        return r;
}

/* Whether the call's authenticated peer is worker `worker`: a worker attaches only its own segment. */
static bool attach_caller_ok(struct rpc_call *call, uint32_t worker) {
        return authz_peer_is(rpc_call_identity(call), PEER_WORKER, worker);
}

/* A refusal the socket's listener made (another user, no descriptor, ...): counted and logged. */
static void on_attach_refused(void *ud, const char *why) {
        psd_note_reject(ud, why);
}

/* Step 2 of an attach (shmlink.h): the descriptor the worker sent on our socket with this nonce, from
 * the process the call names, becomes a link to the worker the caller is. Every refusal is counted:
 * a worker that found our socket is on this host, and its attach should not fail. */
void links_on_attach(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        char err[800], why[600], who[LOG_PEER_BUF];
        ProtobufCMessage *m = NULL;
        struct link *k = NULL;
        int r, fd = -1;
        if ((r = wire_unpack(rpc_call_payload(call), &psfleet__v1__attach_shared_memory_request__descriptor, &m)) < 0) {
                snprintf(err, sizeof(err), "AttachSharedMemoryRequest does not parse");
                goto reject;
        }
        const Psfleet__V1__AttachSharedMemoryRequest *q = (const Psfleet__V1__AttachSharedMemoryRequest *)m;
        if ((r = psd_check_caller(p, q->caller, err, sizeof(err))) < 0)
                goto reject;
        if (q->nonce.len != SHMLINK_NONCE) {
                r = -EINVAL;
                snprintf(err, sizeof(err), "nonce of %zu bytes, expected %d", q->nonce.len, SHMLINK_NONCE);
                goto reject;
        }
        if (!attach_caller_ok(call, q->worker)) {
                r = -EACCES;
                snprintf(err, sizeof(err), "AttachSharedMemory for worker:%u from %s, which is not worker/%u",
                         q->worker, log_peer_str(rpc_call_identity(call)->name, who, sizeof(who)), q->worker);
                goto reject;
        }
        if (!replica_is_primary(p->rep)) {
                r = -EAGAIN;
                snprintf(err, sizeof(err), "ps:%u at %s is its shard's backup: no shared memory with it", p->shard,
                         p->args.listen);
                goto reject;
        }
        if (!p->attach) {
                /* the worker cannot have reached us: not its fault */
                rpc_call_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "ps:%u offers no shared memory (it has no socket "
                              "in rpc.runtime_dir)", p->shard);
                goto out;
        }
        pid_t pid;
        uid_t uid;
        if ((r = shmlink_server_take(p->attach, q->nonce.data, &fd, &pid, &uid, why, sizeof(why))) < 0) {
                r = -EPERM;
                snprintf(err, sizeof(err), "ps:%u cannot serve worker:%u through shared memory: %s", p->shard, q->worker,
                         why);
                goto reject;
        }
        if (pid != q->pid) {
                r = -EACCES;
                snprintf(err, sizeof(err), "ps:%u cannot serve worker:%u through shared memory: the call names process %d, "
                         "the descriptor came from process %d", p->shard, q->worker, q->pid, (int)pid);
                goto reject;
        }
        if (!(k = calloc(1, sizeof(*k)))) {
                r = -ENOMEM;
                snprintf(err, sizeof(err), "out of memory");
                goto reject;
        }
        k->p = p;
        k->worker = q->worker;
        snprintf(k->name, sizeof(k->name), "worker:%u", q->worker);
        if ((r = shmlink_open(fd, pid, q->nonce.data, p->L->fingerprint, p->L->n_params, p->shard, q->generation,
                              &k->l, why, sizeof(why))) == 0 &&
            shmlink_worker(k->l) != q->worker)
                r = errf(why, sizeof(why), -EACCES, "the segment is worker:%u's", shmlink_worker(k->l));
        if (r < 0) {
                r = r == -EACCES ? r : -EPERM;
                snprintf(err, sizeof(err), "ps:%u cannot serve worker:%u through shared memory: %s", p->shard, q->worker,
                         why);
                goto reject;
        }
        if ((r = link_groups(p, k, q, why, sizeof(why))) < 0) {
                snprintf(err, sizeof(err), "AttachSharedMemory from worker:%u: %s", q->worker, why);
                goto reject;
        }
        /* a worker restarted on this host replaces its old link */
        links_free(links_take(p, k->worker));
        shmlink_mark(k->l, k->groups, k->n_groups, k->last);
        if ((r = -pthread_create(&k->thread, NULL, link_main, k)) < 0) {
                snprintf(err, sizeof(err), "cannot start a thread: %s", strerror(-r));
                goto reject;
        }
        k->started = true;
        pthread_mutex_lock(&p->links_mu);
        k->next = p->links;
        p->links = k;
        pthread_mutex_unlock(&p->links_mu);
        log_info("worker:%u (pid %d, uid %u) pushes through shared memory: %u group(s)", k->worker, (int)pid,
                 (unsigned)uid, k->n_groups);
        k = NULL;
        Psfleet__V1__AttachSharedMemoryReply rep = PSFLEET__V1__ATTACH_SHARED_MEMORY_REPLY__INIT;
        rep.incarnation = p->incarnation;
        rep.pid = (int32_t)getpid();
        rpc_call_reply_msg(call, &rep.base);
        goto out;
reject:
        psd_reject(p, call, r, err);
out:
        if (fd >= 0)
                close(fd);   /* mapped, or refused */
        link_free(k);
        if (m)
                protobuf_c_message_free_unpacked(m, NULL);
}

/* The attach socket, RUNTIME_DIR/JOB-ps-N.sock. Without one psd still runs, and workers push through
 * gRPC; only a live psd of the same name there is fatal (as an address in use). */
int links_socket_open(struct psd *p) {
        char path[256], err[600];
        if (p->args.backup) {
                /* the socket's name is the shard's, its primary's: workers push to the backup (once promoted)
                 * through gRPC */
                log_info("no shared memory as cluster.ps_backup[%u]: workers push to it through gRPC", p->shard);
                return 0;
        }
        int r = shmlink_socket_path(p->cfg->rpc.runtime_dir, p->cfg->name, p->shard, path, sizeof(path), err, sizeof(err));
        if (r == 0)
                r = shmlink_server_new(path, on_attach_refused, p, &p->attach, err, sizeof(err));
        if (r == -EADDRINUSE)
                return log_error_errno(r, "%s", err);
        if (r < 0)
                log_warning("no shared memory for workers on this host: %s; they push through gRPC", err);
        else
                log_info("workers on this host attach shared memory through %s", path);
        return 0;
}

