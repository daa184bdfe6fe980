/* What psd's files share: the daemon's state, and each file's calls. They stack without a cycle:
 * psd.c (run(), the handlers' table, Assign, Pull, status, Stop) calls links.c (the shared-memory links
 * and their attach), psd_push.c (the push pipeline, both transports), sparse_rpc.c (the embedding
 * tables) and psd_call.c (the steps every call takes); links.c calls psd_push.c and psd_call.c; the
 * others call psd_call.c; psd_call.c calls none of them. */
#pragma once
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agg.h"
#include "answers.h"
#include "daemon.h"
#include "job.h"
#include "metrics.h"
#include "rpc.h"
#include "shard.h"
#include "shmlink.h"
#include "memplan.h"
#include "sparse_table.h"
#include "ssp.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"
#include "replica.h"

/* How long a link's thread spins for the next push before it sleeps: not at all. Its core is the one a
 * second worker on this host computes on; spinning there for 100 µs after each push cost 1 ps + 2
 * workers a third of its examples/s on two cores, while the one wake-up per push it saves did not show
 * with one worker (docs/performance.md). */
#define LINK_SPIN_US 0

struct psd {
        struct daemon_args args;
        const struct job_config *cfg;
        uint32_t shard;
        struct job_layout *L;
        struct shard *s;         /* the variables */
        struct agg *agg;         /* training.mode sync: the step's gradients and held pushes; else NULL */
        struct ssp *ssp;         /* training.mode ssp, shard 0: the workers' clocks and held answers; else NULL */
        struct replica *rep;     /* ps.replicas 2: this psd's place in its shard (replica.h); else NULL */
        struct psd_answers *answers;   /* the workers' copies for int8 answers (answers.h) */
        /* ps.replicas 2, training.mode sync: the update agg_push's step applied (psd_sync_applied), under
         * the write that pushed it */
        bool sync_applied;
        struct replica_update *sync_update;
        uint64_t incarnation;
        atomic_uint_fast64_t pushes, rejected;
        atomic_uint_fast64_t bytes_in, bytes_out, apply_us;   /* of the pushes applied (status, psfleet top) */
        pthread_mutex_t err_mu;
        char last_error[512];
        /* the waits status shows (wall clock, µs): for the chief's first Assign, and, after SIGTERM,
         * for its Stop; the second's since is 0 until a signal came */
        uint64_t ready_since_us, ready_deadline_us;
        atomic_uint_fast64_t grace_since_us, grace_deadline_us;
        int stop_fd;             /* eventfd: a Stop call asks the main loop to end */
        struct rpc_server *server;
        struct shmlink_server *attach;   /* the unix socket workers on this host attach through; NULL: none */
        pthread_mutex_t links_mu;
        struct link *links;      /* workers pushing through shared memory */
        struct metric *m_pushes, *m_rejected, *m_in, *m_out, *m_apply, *m_step, *m_links; /* psd_metrics() */
        /* model.embeddings: this shard's rows of each table (sparse_rpc.c) */
        struct psd_table *tables;
        uint32_t n_tables;
        atomic_uint_fast64_t sparse_step;   /* the newest global_step a worker's exchange reported */
        atomic_uint_fast64_t export_us;     /* mono_us of a SparseExport page with more to come (0: the walk
                                             * ended): eviction waits for its end, or 30 s */
        struct metric *m_sparse_ids, *m_sparse_in, *m_sparse_out;
        struct memplan_ps plan;             /* what the job file says this psd needs (ps.memory_limit_bytes) */
};

/* One embedding table's rows on this shard, and what its exchanges moved (status, metrics). */
struct psd_table {
        struct sparse_table *t;
        const struct embedding_spec *spec;
        unsigned n_slots;
        atomic_uint_fast64_t ids_in, bytes_in, bytes_out;
        uint64_t max_rows;         /* this shard's bound (max_rows' share or ps.memory_limit_bytes'); 0: none */
        struct sparse_table_stats seen;   /* the main loop's last reading, for the counters' increments */
        /* the evicted ids a checkpoint's walk took, handed out a page at a time (SparseExport) */
        pthread_mutex_t gone_lock;
        uint64_t *gone;
        size_t n_gone;
        bool gone_lost;
        struct metric *m_rows, *m_bytes, *m_evicted_limit, *m_evicted_age, *m_admitted, *m_pending, *m_dropped;
        struct metric *m_disk_rows, *m_disk_bytes, *m_disk_reads, *m_disk_spills, *m_disk_errors, *m_disk_refused;
};

/* A worker on this host whose pushes come through its shared-memory segment; served by a thread of
 * its own. */
struct link {
        struct psd *p;
        struct shmlink *l;
        uint32_t worker;
        char name[24];           /* "worker:<i>", for messages */
        uint32_t n_groups;
        uint32_t *groups;        /* (n_groups) the groups' records in the segment */
        uint32_t *last;          /* (n_groups) the push of each served last */
        uint32_t *first, *count; /* (n_groups) each group's parts: parts[first, first + count) */
        uint32_t *parts;         /* indices into the shard's parts, a group's adjacent */
        float *scratch;          /* (largest group) the gradients, copied out of the segment */
        struct link_held *held;  /* (n_groups) each group's push held (sync, ssp); owns groups, last, first
                                  * and count, which follow it in one allocation */
        pthread_t thread;
        bool started;
        atomic_bool stop, ended;
        atomic_uint pending;     /* its pushes not yet released: waiting for the backup (ps.replicas 2) */
        struct link *next;
};

/* A push held by the sync step or by ssp (agg.h), whichever way it came: answered through its
 * transport's table when released (psd_push.c). */
struct psd_push_ops;
struct psd_held {
        struct agg_waiter w;     /* first: the release callback gets it */
        const struct psd_push_ops *ops;
        struct psd *p;
};

/* A worker's shared-memory push held: one per group, as a group has one push in flight at most. */
struct link_held {
        struct psd_held hd;      /* first */
        struct link *k;
        uint32_t g;              /* the group's record in the segment */
        uint32_t seq;
};

/* psd_call.c: the steps every call takes */

/* A refused call counted, remembered for the status (last_error) and logged, rate-limited. */
void psd_note_reject(struct psd *p, const char *msg);
/* Whether caller c (nullable) names this job's fingerprint: 0, or -EPERM with err saying so. */
int psd_check_caller(struct psd *p, const Psfleet__V1__Caller *c, char *err, size_t errlen);
/* A received message of a header and tensors; psd_request_done frees both (NULL-safe fields). */
struct psd_request {
        struct wire_in *in;
        ProtobufCMessage *hm;
};
/* The call's payload taken, its header (descriptor d) unpacked and the caller it names (the header's
 * field "caller", in every request that carries tensors) checked. 0, or -errno with err saying why;
 * q holds what was read either way. */
int psd_receive(struct psd *p, struct rpc_call *call, const ProtobufCMessageDescriptor *d, struct psd_request *q,
                char *err, size_t errlen);
void psd_request_done(struct psd_request *q);
/* A refused call: psd_note_reject, and the call failed with err. */
void psd_reject(struct psd *p, struct rpc_call *call, int r, const char *err);
/* The one gate of a shard the chief has not assigned yet: 0, or -EAGAIN with err saying so (not the
 * caller's fault: not counted). psd_ready_or_refuse fails the call with it and returns false. */
int psd_ready(struct psd *p, char *err, size_t errlen);
bool psd_ready_or_refuse(struct psd *p, struct rpc_call *call);
void psd_out_of_memory(struct psd *p, struct rpc_call *call);   /* fails the call: "ps:N: out of memory" */
/* shard 0 counts the step of a push that says so; every shard counts the push, its bytes (of
 * gradients in, of values back, as they travelled: float32 or bfloat16) and the time since t0 (mono_us
 * at receive). Returns global_step as shard 0 holds it (0 elsewhere). */
uint64_t psd_count_push(struct psd *p, bool count_step, size_t bytes, size_t bytes_out, uint64_t t0);
/* A reply's values in one buffer lent to gRPC (refs: one per tensor slice, one for the builder),
 * freed when the last reference is released (psd_lent_release, a wire_out release callback). */
struct psd_lent {
        atomic_int refs;
        float data[];
};
void psd_lent_release(void *ud);

/* psd_push.c: a push, gate → check → async, sync or ssp → apply → count → reply */
void psd_on_push(struct rpc_call *call, void *ud);                      /* gRPC Push */
void psd_push_link(struct link *k, const struct shmlink_push *push);   /* a push in k's segment */
void psd_sync_applied(void *ud, const uint32_t *idx, uint32_t n, const float *acc);   /* agg_defer's (ud: psd) */

/* sparse_rpc.c: the embedding tables' RPCs (docs/sparse.md) */
/* 0, or -errno (logged): -E2BIG when ps.memory_limit_bytes is below what the dense part needs (exit 78) */
int sparse_tables_new(struct psd *p);
void sparse_tables_free(struct psd *p);
void sparse_tables_tick(struct psd *p);          /* the main loop: eviction, the rows' gauges */
void sparse_tables_clear(struct psd *p);         /* every row of every table dropped (a state transfer) */
size_t sparse_max_request(const struct psd *p);  /* the largest legal sparse request, in bytes */
/* Fills st->tables (0, or -ENOMEM); sparse_status_done frees what it allocated. */
int sparse_status(struct psd *p, Psfleet__V1__ShardStatus *st);
void sparse_status_done(Psfleet__V1__ShardStatus *st);
/* sparse_rpc.c's checks and import, which the backup's replay (sparse_replica.c) shares: 0 or -errno
 * with err. A table index of the job; ids of this shard as packed uint64 (malloc'd, *n of them); each
 * id once; tensor `name` of in as float32 (n, dim), finite. */
int sparse_check_table(struct psd *p, uint32_t e, char *err, size_t errlen);
int sparse_take_ids(struct psd *p, const ProtobufCBinaryData *b, const char *field, uint64_t **ids, size_t *n,
                    char *err, size_t errlen);
int sparse_check_unique(const uint64_t *ids, size_t n, const char *field, char *err, size_t errlen);
int sparse_take_rows(const struct wire_in *in, const char *name, size_t n, uint32_t dim, float *dst, char *err,
                     size_t errlen);
/* An import's writes: clear, the evicted ids dropped, the rows stored (vals, then the slots slot-major);
 * *dropped the evicted rows that went. How many ids were stored already, or -ENOMEM. */
int sparse_import_apply(struct psd_table *pt, bool clear, const uint64_t *evicted, size_t n_evicted,
                        const uint64_t *ids, size_t n, const float *vals, uint64_t step, uint64_t *dropped);
void on_sparse_exchange(struct rpc_call *call, void *ud);
void on_sparse_export(struct rpc_call *call, void *ud);
void on_sparse_import(struct rpc_call *call, void *ud);

/* links.c */
struct link *links_take(struct psd *p, uint32_t worker);
void links_free(struct link *k);
uint32_t links_count(struct psd *p);
void links_on_attach(struct rpc_call *call, void *ud);   /* gRPC AttachSharedMemory */
int links_socket_open(struct psd *p);   /* the attach socket; 0 without one, -EADDRINUSE fatal (logged) */
