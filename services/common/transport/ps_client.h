/* The client of a job's ps shards: channels to every shard, with the job's fingerprint stamped on each
 * call; whole parameter blocks moved to and from them (assign, pull); and a worker's pushes, through
 * gRPC or, to a shard on this host, through shared memory (shmlink.h), behind one API. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "job.h"

struct ps_client;

/* Channels to every shard of the job (L, lent until ps_client_free); task ("worker:1") names the
 * caller to the shards. Returns 0 or -errno. */
int ps_client_new(const struct job_config *cfg, const struct job_layout *L, const char *task, struct ps_client **ret);
/* Stops the reply thread, cancels pushes still in flight, unmaps the shared memory (so after the model
 * that lives in it is freed). NULL-safe; returns NULL. */
struct ps_client *ps_client_free(struct ps_client *pc);

/* The shards in which[] (NULL: every shard) get their variables (and slots, if given; else the
 * optimizer's initial values) from these blocks; shard 0 also gets global_step. All in parallel. */
int ps_client_assign(struct ps_client *pc, const bool *which, const float *params, float *const *slots,
                     uint64_t global_step, char *err, size_t errlen);
/* Reads every shard into the blocks (slots too when slots != NULL). global_step from shard 0, which
 * the client also remembers (ps_client_global_step). */
int ps_client_pull(struct ps_client *pc, float *params, float *const *slots, uint64_t *global_step_ret,
                   char *err, size_t errlen);
/* Shard status, for the chief and the CLI. The reply is protobuf-c's; free with
 * psfleet__v1__shard_status__free_unpacked. */
int ps_client_status(struct ps_client *pc, uint32_t shard, void **status_ret, char *err, size_t errlen);
/* As ps_client_status with its own timeout, for a supervisor that polls: when the shard does not
 * answer, the channel to it is replaced by a fresh one, so a shard that has just come up is seen at
 * the next probe (gRPC otherwise backs off reconnecting for up to minutes). The error names the shard
 * and its address. Not thread-safe against other calls on the same shard. */
int ps_client_probe(struct ps_client *pc, uint32_t shard, uint64_t timeout_ms, void **status_ret, char *err,
                    size_t errlen);
/* ---- ps.replicas 2: each shard's two psds (0: cluster.ps[s], 1: cluster.ps_backup[s]) ----
 * The client talks to one of them, its primary as far as it knows (0 at first). */

/* As ps_client_probe, of psd `which` of the shard. */
int ps_client_probe_psd(struct ps_client *pc, uint32_t shard, uint32_t which, uint64_t timeout_ms, void **status_ret,
                        char *err, size_t errlen);
/* The address of psd `which` of the shard. */
const char *ps_client_addr(const struct ps_client *pc, uint32_t shard, uint32_t which);
/* Which psd of the shard the client talks to. */
uint32_t ps_client_primary(const struct ps_client *pc, uint32_t shard);
/* Talks to psd `which` of the shard from now on (call with no push in flight: its link is closed). */
void ps_client_use(struct ps_client *pc, uint32_t shard, uint32_t which);
/* SetRole (PSFLEET__V1__REPLICA_ROLE__*) at epoch on psd `which` of the shard (the chief);
 * unreplicated_ok: the chief has recorded that its backup is out. 0 or -errno. */
int ps_client_set_role(struct ps_client *pc, uint32_t shard, uint32_t which, int role, uint64_t epoch,
                       bool unreplicated_ok, char *err, size_t errlen);
/* After a failed call to the shard: its psd that says it is the initialized primary of the newest
 * epoch, if it is not the one the client talks to, is used from now on. Two status calls with short
 * deadlines; returns true when it switched. No-op without replicas. */
bool ps_client_find_primary(struct ps_client *pc, uint32_t shard);

/* Tells every shard to stop (best effort; returns the first error). */
int ps_client_stop(struct ps_client *pc, const char *reason);

/* ---- a worker's pushes ----
 *
 * A push group is a fixed set of placement parts of one shard that travel together. ps_client_push
 * hands a group's gradients to its shard without blocking; ps_client_wait waits for the answer, after
 * which the group's fresh values are in the parameter block: through shared memory psd wrote them
 * there itself, through gRPC the reply is copied in by the wait. One thread pushes and waits (the
 * compute thread); the client's own thread takes gRPC replies as they arrive. */
struct ps_group {
        uint32_t shard;
        uint32_t n_parts;
        const uint32_t *parts;  /* placement parts, all of `shard` */
};

/* Moves the caller's parameter and gradient blocks into memory given to it (n_params floats each,
 * page-aligned, contents kept), as model_use_host_blocks() does; returns 0 or -errno. */
typedef int (*ps_client_move_fn)(void *ud, float *params, float *grads);

/* Sets up worker `worker`'s pushes: n_groups groups (copied), and the blocks pushes read gradients
 * from and fresh values land in (n_params floats each, lent until ps_client_free). With move, the
 * blocks first move into a shared-memory segment the psd shards on this host can map (move(ud, ...)
 * puts the caller's model there, and the segment's blocks are used from then on); when that cannot be
 * done, why is logged and every push goes through gRPC. Without move (NULL) every push goes through
 * gRPC. Once per client; returns 0 or -errno. */
int ps_client_link(struct ps_client *pc, uint32_t worker, uint32_t n_groups, const struct ps_group *groups,
                   float *params, float *grads, ps_client_move_fn move, void *ud);
/* Asks each shard not linked yet to serve this worker's pushes through the shared memory (its
 * descriptor through the shard's socket in rpc.runtime_dir, then AttachSharedMemory); a shard that
 * cannot (no socket of it here: another host, or a psd without one; a refusal) gets its pushes through
 * gRPC, and why is logged once (until it links). Call when no push is in flight: after the first pull, and after recovering from a failed
 * push. No-op without shared memory. */
void ps_client_link_shards(struct ps_client *pc);
/* Hands group g's gradients (final in the gradient block, unchanged until ps_client_wait(g)) to its
 * shard; count_step: the shard (shard 0) counts a step in global_step with it. Does not block. A push
 * that cannot start fails at ps_client_wait. training.mode sync: the push carries, instead of
 * local_step, the step of the group's values (from the last pull or the shard's last answer); the
 * shards count the steps they aggregate, whatever count_step says; its answer comes when the step is
 * applied. */
void ps_client_push(struct ps_client *pc, uint32_t g, uint64_t local_step, bool count_step);
/* Waits for the answer to group g's push, if one is in flight (nothing to wait for: 0). On 0 the fresh
 * values are in the parameter block; otherwise -errno (the shard refused the push, or is lost: then
 * its shared-memory link goes down until ps_client_link_shards), with why in err. */
int ps_client_wait(struct ps_client *pc, uint32_t g, char *err, size_t errlen);
/* ---- overlapped pushes (training.overlap_push): the next step computes while a push travels ----
 *
 * Instead of ps_client_wait before forward reads a group: ps_client_hold(g) before the group's next
 * push starts (waits for the one in flight and keeps its values aside: 0, or its failure with why),
 * and ps_client_take(g) before forward reads the group (puts the values kept aside in the parameter
 * block; does not wait for a gRPC push in flight). So a step computes with the values answered to the
 * push of two steps back: one step stale in the worker's own updates. The gradients of such a push
 * are copied into its message (the next step writes the block meanwhile). A shared-memory push is
 * answered in place: hold and take wait for it, as ps_client_wait does. ps_client_wait still waits for
 * everything and puts the newest values in. */
int ps_client_hold(struct ps_client *pc, uint32_t g, char *err, size_t errlen);
int ps_client_take(struct ps_client *pc, uint32_t g, char *err, size_t errlen);

/* The global_step shard 0 last told (a pull, or the newest answer to a push), and in *counting_ret
 * the pushes still unanswered that will count a step: where global_step is heading. Thread-safe. */
uint64_t ps_client_global_step(struct ps_client *pc, uint32_t *counting_ret);

/* The AttachSharedMemory call itself, as ps_client_link_shards makes it after handing the segment's
 * descriptor to the shard's unix socket (shmlink_send), for tests that play a worker: asks `shard` to
 * serve worker's pushes through the segment that process `pid` sent it with `nonce` (and the shard's
 * link generation); the groups that go to this shard, each with its record index in the segment and
 * its placement parts. Returns 0 with psd's process id, or -errno with the reason (no such descriptor,
 * a segment that does not match: FAILED_PRECONDITION; another pid or worker: PERMISSION_DENIED). */
int ps_client_attach_shm(struct ps_client *pc, uint32_t shard, uint32_t worker, int32_t pid, const uint8_t *nonce,
                         uint32_t generation, uint32_t n_groups, const uint32_t *group_index,
                         const uint32_t *const *group_parts, const uint32_t *group_n, int32_t *pid_ret, char *err,
                         size_t errlen);

/* ---- embedding tables (docs/sparse.md, "Sparse pull and push") ----
 *
 * Rows of table e (model.embeddings[e]) live on shard sparse_shard_of(id, n_ps). One call is one round
 * trip to each shard that holds any of the ids, all shards in parallel (at most one message each way
 * per shard): first the gradients push_grads (n_push rows of the table's dim) of push_ids are applied,
 * then the rows of pull_ids are read into pull_rows (n_pull rows), each created on first touch. Either
 * list may be empty; ids are unique within each list. Refused pushes fail the call with why in err
 * (nothing of that shard's push applied). Thread-compatible: one thread per client calls these. */
int ps_client_sparse(struct ps_client *pc, uint32_t e, const uint64_t *push_ids, size_t n_push,
                     const float *push_grads, const uint64_t *pull_ids, size_t n_pull, float *pull_rows, char *err,
                     size_t errlen);
/* As the pull side of ps_client_sparse, without creating rows: an id not stored gives its initial
 * value (evaluation, which must not grow the tables). */
int ps_client_sparse_lookup(struct ps_client *pc, uint32_t e, const uint64_t *ids, size_t n, float *rows,
                            char *err, size_t errlen);
/* Payload bytes of the sparse calls so far (ids, rows and gradients, both ways), for counters. */
void ps_client_sparse_bytes(const struct ps_client *pc, uint64_t *sent_ret, uint64_t *received_ret);

/* ---- embedding tables: the chief's checkpoints ---- */

/* Rows of one table with their optimizer slots, in no particular order. */
struct ps_sparse_rows {
        size_t n;
        uint32_t dim;
        unsigned n_slots;               /* training.sparse_optimizer's (sparse_optimizer_n_slots) */
        uint64_t *ids;                  /* (n) */
        float *values;                  /* (n x dim) */
        float *slots[2];                /* (n x dim) each, n_slots of them; SPARSE_MAX_SLOTS */
};
/* Frees what the arrays hold (malloc'd) and zeroes r. NULL-safe. */
void ps_sparse_rows_clear(struct ps_sparse_rows *r);

/* Every stored row of table e from every shard, paged through SparseExport (each page of every shard
 * in parallel), into out (zeroed first; the caller clears it). Rows made meanwhile may be missed, as
 * in any async checkpoint. Returns 0, or -errno with why in err (out cleared). */
int ps_client_sparse_export(struct ps_client *pc, uint32_t e, struct ps_sparse_rows *out, char *err, size_t errlen);
/* A streaming export (a checkpoint's walk): what to ask each shard. */
struct ps_sparse_export_opts {
        uint32_t max_rows;      /* rows per page of a shard; 0: psd's default */
        bool dirty_only;        /* only rows changed since the last clean walk (incremental checkpoints) */
        bool clean;             /* mark the rows sent unchanged */
        bool take_evicted;      /* each shard's last page carries the ids evicted since the last such walk */
};
/* One page of one shard, lent to the callback for the length of the call. */
struct ps_sparse_page {
        uint32_t shard;
        const struct ps_sparse_rows *rows;   /* n rows (maybe 0 on the last page) */
        bool last;                           /* take_evicted: the shard's last page */
        const uint64_t *evicted;             /* (n_evicted) take_evicted: ids evicted since the last walk that
                                              * took them, on the pages after the rows (a page's worth each) */
        size_t n_evicted;
        bool changes_lost;                   /* the shard cannot tell what changed: no increment possible */
};
/* Returns 0, or -errno with err (which stops the walk). */
typedef int (*ps_sparse_page_fn)(const struct ps_sparse_page *pg, void *ud, char *err, size_t errlen);
/* Pages through table e on every shard as ps_client_sparse_export does (o NULL: defaults), handing each
 * page to fn as it comes, so that no more than one page per shard is held at a time. 0, or -errno with
 * err (fn's, or the shard's). */
int ps_client_sparse_export_pages(struct ps_client *pc, uint32_t e, const struct ps_sparse_export_opts *o,
                                  ps_sparse_page_fn fn, void *ud, char *err, size_t errlen);
/* Stores rows (their slots as given, n_slots the optimizer's) into table e of the shards in which[]
 * (NULL: every shard), each id on sparse_shard_of(id, n_ps), in pages; each of those shards' table
 * is emptied first (so a shard that gets no row ends empty). global_step: the rows' last touch.
 * Returns 0, or -errno with why in err. */
int ps_client_sparse_import(struct ps_client *pc, const bool *which, uint32_t e, const struct ps_sparse_rows *rows,
                            uint64_t global_step, char *err, size_t errlen);
/* A part of a restore streamed (docs/checkpoints.md, "Restore"): as ps_client_sparse_import, but each
 * shard's table is emptied only with clear (the first part), and each shard first drops its share of
 * evicted (at most SPARSE_MAX_IDS: an incremental checkpoint's evicted ids, a page at a time). The
 * shards' counts are added to *replaced (rows whose id was stored already) and *dropped (evicted ids
 * that were stored) when those are not NULL. 0, or -errno with why in err. */
struct ps_sparse_import_opts {
        bool clear;
        const uint64_t *evicted;        /* (n_evicted) */
        size_t n_evicted;
        uint64_t *replaced, *dropped;
};
int ps_client_sparse_import_part(struct ps_client *pc, const bool *which, uint32_t e, const struct ps_sparse_rows *rows,
                                 const struct ps_sparse_import_opts *o, uint64_t global_step, char *err,
                                 size_t errlen);

/* How ps_client_sparse splits ids over n_shards: order[] (n) lists the ids' indices shard after shard,
 * keeping their order within a shard; first[] (n_shards + 1) where each shard's run starts. For tests. */
void ps_client_sparse_split(const uint64_t *ids, size_t n, uint32_t n_shards, size_t *order, size_t *first);
