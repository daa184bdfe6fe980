/* replica.c's state, shared with replica_backup.c (the backup's side and the chief's SetRole): what
 * one applied update is on its way to the backup, and a shard's replica. Only those two files include
 * it. */
#pragma once
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "replica.h"
#include "replica_ring.h"
#include "shmlink.h"
#include "wire.h"

/* One applied update on its way to the backup: queued in seq order, answered (done) once the backup
 * has acknowledged it or the shard has given it up. */
struct replica_update {
        struct replica_update *next;
        uint64_t seq, gs, epoch;     /* its place in the shard's order; global_step after it; the epoch
                                      * it was applied at (a batch is of one epoch) */
        struct replica_push push;
        replica_done_fn done;
        void *ud;
        uint32_t n;
        size_t floats;
        struct shard_part **parts;   /* (n) */
        float *grads;                /* (floats) as applied: scaled; parts' one after the other */
        uint32_t *dtypes;            /* or, an unscaled push: (n) its tensors' wire dtypes, and */
        size_t *sizes;               /* (n) their bytes as they came, one after the other at raw: the */
        uint8_t *raw;                /* backup reads them as the primary did (replica_update_wire) */
        size_t bytes;                /* what grads or raw hold */
        bool sparse;                 /* an embedding table's write instead (sp; n, parts, grads unused) */
        struct replica_sparse sp;
};

struct replica {
        struct psd *p;
        pthread_mutex_t mu;          /* one write at a time: applied, numbered and queued; the fields below
                                      * that say so */
        atomic_int role;             /* PSFLEET__V1__REPLICA_ROLE__* */
        atomic_uint_fast64_t epoch;
        char peer_addr[300];
        struct rpc_channel *peer;    /* the thread's, and the status probe's */
        atomic_bool replicating;     /* primary: the backup holds every update (written under mu) */
        atomic_bool unreplicated_ok; /* primary: the chief knows the backup is out (it promoted this psd,
                                      * or confirmed a drop): writes may be answered without it */
        atomic_uint_fast64_t seq;    /* written under mu: updates applied since the last snapshot */
        atomic_uint_fast64_t acked, lag_us;   /* the last acknowledged update; its batch's round trip */
        atomic_uint_fast64_t n_calls;   /* the calls that carried the updates since the last snapshot, */
        atomic_uint_fast64_t n_bytes, n_values;   /* and the bytes and values of their tensors */
        uint64_t gen;                /* mu: a new one each time the stream of updates ends (a drop, a
                                      * step down): a batch sent before it is none of the new stream's */
        pthread_mutex_t qmu;         /* the queue; taken under mu or alone, never mu under it */
        struct replica_update *head, **tail;   /* qmu: queued, not yet sent */
        bool in_flight;              /* qmu: a Replicate call of updates is on the wire (one at most) */
        struct rpc_batch *calls;     /* that call's; the thread takes its completion */
        atomic_uint_fast64_t fenced, dropped;
        pthread_mutex_t err_mu;
        char last_error[300];
        pthread_t thread;
        bool started;
        atomic_bool stop;
        /* ps.replica_transport auto, a backup on this host (replica_shm.c) */
        struct shmlink_server *sock; /* this psd's replica socket, where a primary sends its ring */
        char peer_sock[256];         /* the other psd's */
        struct ring *out;            /* mu, primary: the ring to the backup (replicating through it) */
        size_t res_floats;           /* mu, primary: the update reserved in it (replica_write_reserve) */
        struct ring *in;             /* mu, backup: the ring from the primary */
        struct ring *in_pinned;      /* mu: the ring the ring thread sleeps on (freed by it, not under it) */
        struct ring *in_gone;        /* mu: that ring, detached meanwhile: the ring thread frees it */
        pthread_t ring_thread;
        bool ring_started;
        atomic_bool ring_mode;       /* status: replicating through out */
        atomic_uint_fast64_t ring_bytes;   /* status: out's bytes not yet applied (the thread's tick) */
};

/* This psd steps down (mu held): it forgets the updates its shard's new primary never saw and waits,
 * uninitialized, for the primary's state transfer. */
void replica_step_down(struct replica *r, uint64_t epoch, const char *why);
const char *replica_role_name(int role);   /* "primary" or "backup" */
/* The backup is gone or behind (mu held): the shard goes on unreplicated until the thread brings it
 * back by a state transfer. */
void replica_drop_backup(struct replica *r, const char *why);

/* One dense update applied as the primary applied it (mu held): its n tensors (checked) onto parts
 * (idx: their indices in the shard), then the sync step or global_step, the worker's clock, the seq. */
void replica_apply_dense(struct replica *r, const struct wire_tensor *t, size_t n, struct shard_part *const *parts,
                         const uint32_t *idx, uint64_t seq, uint64_t gs, bool count_step, uint32_t worker,
                         uint64_t local_step);

/* ---- replica_shm.c: the ring to a backup on this host (replica_ring.h) ---- */

/* This psd's replica socket, and its peer's path; the backup's ring thread. 0, or -errno (a live psd
 * of the same name listens there: fatal as an address in use). Without a socket there is no ring. */
int replica_shm_start(struct replica *r);
void replica_shm_stop(struct replica *r);   /* after the replica's thread: the rings freed */
/* Primary, mu held, right after a state transfer: the updates from now on through a ring, when the
 * backup is on this host. 0 (r->out set); -ENOENT: no socket of the backup's here (another host);
 * other -errno with why: go on through Replicate calls. */
int replica_shm_attach(struct replica *r, char *why, size_t len);
/* Primary, mu held: u's update published in the ring (r->out): 0, and the push may be answered; or
 * -EAGAIN with err, the backup dropped or this psd stepped down (fenced), and it must not be. */
int replica_shm_put(struct replica *r, const struct replica_update *u, char *err, size_t errlen);
/* Primary, mu held: replica_write_reserve's and replica_write_publish's ring steps (errors as put's). */
int replica_shm_reserve(struct replica *r, const uint32_t *idx, uint32_t n, float **grads, char *err, size_t errlen);
int replica_shm_publish(struct replica *r, const struct ring_rec *rec, char *err, size_t errlen);
/* Primary, mu held: the ring let go (a drop, a step down). */
void replica_shm_detach(struct replica *r);
/* Primary, the replica's thread: a backup that stopped applying (its ring's head still for
 * ps.replica_timeout_ms with updates pending) or is gone is dropped; acked refreshed. */
void replica_shm_tick(struct replica *r);
/* Backup, mu held: a Replicate call's ring (h->ring_nonce) taken: 0, or -errno with err. */
int replica_shm_take(struct replica *r, const Psfleet__V1__ReplicateHeader *h, char *err, size_t errlen);
/* Backup, mu held: the ring from the primary closed at epoch, so the primary's later writes are
 * refused; with drain, every update published before is applied first (a promotion). Then let go. */
void replica_shm_close(struct replica *r, uint64_t epoch, bool drain);
