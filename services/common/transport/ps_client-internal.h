/* What ps_client.c (dense blocks, pushes) and ps_client_sparse.c (embedding tables) share: the
 * client's state and the steps of a call to every shard. */
#pragma once
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "job.h"
#include "metrics.h"
#include "ps_client.h"
#include "rpc.h"
#include "shmlink.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"

/* The compute thread spins this long for a shared-memory answer before it sleeps: answers are due
 * within tens of microseconds once psd has the push. */
#define LINK_SPIN_US 200

enum via { VIA_NONE, VIA_GRPC, VIA_LINK };

/* One push group and its push in flight. `via`, `answered`, `count_step`, `reply`, `err` and `msg`
 * are under pc->mu (the reply thread fills them in); the rest belongs to the pushing thread. */
struct flight {
        struct ps_group g;        /* parts owned */
        enum via via;             /* how the push in flight went; VIA_NONE: none in flight */
        bool answered;            /* VIA_GRPC: the reply (or the failure) is here */
        bool count_step;          /* it counts a step, and is not answered yet */
        uint32_t seq;             /* VIA_LINK: the push's sequence number */
        uint64_t t0;              /* mono_us when the push started */
        struct metric *latency;   /* psfleet_worker_push_seconds of its shard */
        struct wire_in *reply;    /* answered: the fresh values, checked against the layout */
        struct wire_in *held;     /* overlap: an earlier push's values, for the next ps_client_take (the
                                   * pushing thread's) */
        uint64_t version;         /* training.mode sync: the step of the group's values (the shard's answers) */
        uint64_t answer_seq;      /* int8 answers: the answer the group's values stand at (0: none; the pushing
                                   * thread's) */
        uint64_t reply_seq;       /* answered: the reply's answer_seq */
        uint64_t sent_base;       /* the push in flight's answer_base when it asked for int8 changes, else 0 */
        int err;
        char msg[600];
};

/* A shard's side of the shared memory. */
struct shard_link {
        bool up;                        /* this shard's pushes go through the link */
        bool said;                      /* why not was logged once */
        int32_t pid;                    /* its psd's process */
};

/* What the client keeps of one shard. */
struct ps_shard {
        struct rpc_channel *ch;         /* to its primary: cluster.ps[s], or cluster.ps_backup[s] when cur is 1 */
        struct rpc_channel *alt;        /* ps.replicas 2: to the other psd (status, roles); NULL until used */
        uint32_t cur;
        struct shard_link link;         /* meaningful only while pc->link is there */
        uint64_t sparse_inc;            /* the incarnation it last answered an exchange with (0: none yet) */
};

struct ps_client {
        const struct job_config *cfg;
        const struct job_layout *L;
        struct ps_shard *shard;         /* (n_shards) */
        char task[32];                  /* "worker:1" */
        uint64_t deadline_ms;

        /* a worker's pushes (ps_client_link) */
        uint32_t worker;
        struct flight *fl;              /* (n_fl) one per push group */
        uint32_t n_fl;
        float *params;                  /* where fresh values land */
        const float *grads;             /* where gradients are read (lent to gRPC while a push is in flight) */
        /* rpc.compression int8, topk: what the pushes through gRPC dropped so far, laid out as grads
         * (error feedback: compress.h); NULL for the others */
        float *residual;
        unsigned topk_k;                /* topk: entries per block */
        enum rpc_compression *compress; /* (n_shards) rpc.compression for each shard, auto resolved */
        struct rpc_batch *batch;        /* gRPC pushes in flight: started by the pusher, taken by `receiver` */
        pthread_t receiver;
        bool receiving;
        atomic_bool stop;
        pthread_mutex_t mu;             /* the flights' answers, global_step, counting */
        pthread_cond_t cond;            /* a flight was answered */
        uint64_t global_step;
        uint32_t counting;              /* pushes in flight that count a step */

        /* shared memory with the shards on this host (NULL: every push through gRPC) */
        struct shmlink *link;

        /* embedding tables (ps_client_sparse.c) */
        atomic_uint_fast64_t sparse_sent, sparse_received;   /* payload bytes */
};

/* c names this client's job and task. */
void ps_client_caller_init(struct ps_client *pc, Psfleet__V1__Caller *c);
/* Waits for the batch and frees it; r (ours) or the first failure (a server's, with its message)
 * becomes the result, with why in err. */
int ps_client_batch_end(struct rpc_batch *b, int r, const char *what, char *err, size_t errlen);

/* Builds shard s's request of a fan-out, caller filled in: 0 with *bb the message (the caller's), 1 to
 * leave the shard out, or -errno. */
typedef int (*ps_client_build_fn)(struct ps_client *pc, uint32_t s, Psfleet__V1__Caller *caller, void *ud,
                                  grpc_byte_buffer **bb);
/* Starts `method` on every shard that build gives a request, all in batch b (waited for by the
 * caller); pend (n_shards; may be NULL) gets each shard's call, NULL for one left out. Returns 0, or the
 * first failure to build or start (the shards after it are not started). */
int ps_client_fan_out(struct ps_client *pc, struct rpc_batch *b, const char *method, bool wait_for_ready,
                      ps_client_build_fn build, void *ud, struct rpc_pending **pend);

/* The shard's shared-memory link closed (its pushes go through gRPC until linked again). */
void ps_client_link_down(struct ps_client *pc, uint32_t shard);
