/* replica.c's state, shared with replica_backup.c (the backup's side and the chief's SetRole): what
 * one applied update is on its way to the backup, and a shard's replica. Only those two files include
 * it. */
#pragma once
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "replica.h"

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
};

/* This psd steps down (mu held): it forgets the updates its shard's new primary never saw and waits,
 * uninitialized, for the primary's state transfer. */
void replica_step_down(struct replica *r, uint64_t epoch, const char *why);
const char *replica_role_name(int role);   /* "primary" or "backup" */
