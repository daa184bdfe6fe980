/* ps.replicas 2: the two psds of a shard, its primary and its backup (docs/operations.md, "Replicated
 * shards"). The primary applies each update under the replica's lock and numbers it there (the
 * shard's order); outside the lock the updates go to the backup in that order, one call in flight,
 * several updates in one call when they queue, and a push is answered only once the backup has
 * acknowledged its update, so the backup applies the same updates in the same order and its variables
 * and slots stay bit-equal. The chief alone sets the roles (SetRole), each with an epoch; a psd refuses
 * writes unless it is the primary, and a primary whose backup answers with a newer epoch steps down
 * (fenced). A backup that does not answer within ps.replica_timeout_ms is dropped (the writes waiting
 * for it fail) and, once the chief has recorded it (SetRole unreplicated_ok; writes are refused until
 * then), the shard runs unreplicated; the replica's thread brings a backup (back) by a state transfer:
 * the primary's whole state (a snapshot, under the lock), then the updates since. Thread-safe. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "rpc.h"
#include "shard.h"
#include "psfleet/v1/ps.pb-c.h"

struct psd;
struct replica;
struct wire_in;
struct wire_out;

/* The shard's replica for p (NULL without ps.replicas 2: every call below is then a no-op that lets
 * writes through). Starts as a backup at epoch 0, until the chief says otherwise. 0 or -errno. */
int replica_new(struct psd *p, struct replica **ret);
struct replica *replica_free(struct replica *r);   /* NULL-safe; stops the thread */

/* Whose push an update was: training.mode ssp moves the worker's clock on the backup with it. */
struct replica_push {
        uint32_t worker;
        uint64_t local_step;
        bool count_step;
};

/* A write's update as the backup will apply it, made before the lock: n_parts parts (the caller fills
 * replica_update_parts) and their gradients, float32 as applied (scaled), the parts' one after the
 * other (the caller fills floats of them at replica_update_grads). 0 or -ENOMEM. The caller owns it
 * until replica_write_end takes it. */
struct replica_update;
int replica_update_new(uint32_t n_parts, size_t floats, struct replica_update **ret);
struct shard_part **replica_update_parts(struct replica_update *u);
float *replica_update_grads(struct replica_update *u);
struct replica_update *replica_update_free(struct replica_update *u);   /* NULL-safe */
/* Whether r forwards through a ring to a backup on this host now (a hint: it may change before the
 * write begins; replica_write_reserve says for sure). */
bool replica_ring_active(struct replica *r);
/* Or, for a push applied unscaled, its n tensors as they came (parts: their parts): the backup reads
 * the same bytes the same way (an int8 push's update is an int8 update, a quarter of float32's bytes),
 * so it applies the same floats. 0 or -ENOMEM; owned as above. */
struct wire_tensor;
int replica_update_wire(const struct wire_tensor *t, uint32_t n, struct shard_part *const *parts,
                        struct replica_update **ret);

/* A write to embedding table `table` (its index), as the backup will apply it: an exchange — the
 * gradients of the rows it pushed (vals: n_ids x dim, applied with lr to the rows that exist) and the
 * rows the table made or dropped meanwhile (ev, ev2) — or an import (the chief's restore: clear, then
 * the evicted ids ids2 dropped, then the rows ids stored, vals their values then slots slot-major), or
 * an eviction by age (ev alone). step: the rows' last touch. The arrays are malloc'd and taken, freed
 * with the update (also when this fails: -ENOMEM). */
struct replica_sparse {
        uint32_t table;
        bool import, clear;
        uint64_t *ids, *ids2;
        size_t n_ids, n_ids2;
        float *vals;
        size_t n_vals;
        float lr;
        uint64_t step;
        /* the table's journal (sparse_table_journal) packed: the rows the write made and dropped — an
         * exchange's push in ev and its pull in ev2; an import's or an age eviction's in ev */
        uint8_t *ev, *ev2;
        size_t ev_len, ev2_len;
        bool lost;      /* the journal could not be taken: the backup must be brought in again */
};
int replica_update_sparse(const struct replica_sparse *sp, struct replica_update **ret);
void replica_sparse_free(struct replica_sparse *sp);   /* its arrays, and zeroes it */

/* A write (a push) begins: 0 with the replica's lock held (the caller applies, then calls
 * replica_write_end), or -EAGAIN with err saying this psd is not the shard's primary (counted as
 * fenced; nothing held). */
int replica_write_begin(struct replica *r, char *err, size_t errlen);
/* How a write's update ended: 0, the backup acknowledged it; or -errno with why (valid during the
 * call), and the write must not be answered as done: this psd was found fenced (no longer the
 * primary), or the backup did not acknowledge it (dropped), or psd is stopping. */
typedef void (*replica_done_fn)(void *ud, int status, const char *why);
/* The write applied, gs is global_step after it: its update u (taken; NULL when out of memory: the
 * backup is dropped) is numbered and queued for the backup, the lock released, and the queue sent
 * unless a call is in flight already. Returns 1: queued, done(ud, ...) will be called exactly once,
 * once the backup has acknowledged it or it was given up (bounded: ps.replica_timeout_ms): mostly from
 * the replica's thread, but possibly from any thread, and possibly before this returns (by this very
 * call when the send fails at once); 2: published in the ring to a backup on this host, which holds it:
 * answer the write now, with the lock still held (so what follows from it, ssp's clocks, happens in the
 * order the backup applies the updates), then replica_write_release (done is not called); 0: the shard
 * runs unreplicated, answer the write now (done is not called; the lock released); or -errno with
 * err, the write must not be answered as done (the lock released). */
int replica_write_end(struct replica *r, struct replica_update *u, uint64_t gs, const struct replica_push *push,
                      replica_done_fn done, void *ud, char *err, size_t errlen);

/* Through a ring (a backup on this host), a write begun may put its update in place itself: room for
 * an update of the n float32 parts idx (indices into the shard's parts) end to end at *grads, where the
 * caller writes the gradients as they will be applied (a shared-memory push copies them there out of
 * the worker's segment, checks them there and applies them from there), then replica_write_publish.
 * 0; -ENOENT: no ring now, nothing done (make the update the usual way); or -EAGAIN with err, the
 * backup dropped or this psd fenced: the write must not be answered as done. The lock stays held:
 * replica_write_publish, or replica_write_cancel (the room is given up). */
int replica_write_reserve(struct replica *r, const uint32_t *idx, uint32_t n, float **grads, char *err,
                          size_t errlen);
/* The reserved update applied, gs global_step after it: numbered and published. 0: the backup holds
 * it, answer the write; or -EAGAIN with err as replica_write_end's. The lock stays held either way, so
 * what follows from the write happens in the order the backup applies them (ssp's clocks): then
 * replica_write_release. */
int replica_write_publish(struct replica *r, uint64_t gs, const struct replica_push *push, char *err, size_t errlen);
void replica_write_release(struct replica *r);

/* A write begun that applied nothing (a sync push that completed no part): the lock released. */
void replica_write_cancel(struct replica *r);

/* Whether p may serve a write now (a primary; true without replicas). */
bool replica_is_primary(struct replica *r);

/* The status's replica field (unset when r is NULL); strings valid until the next call. */
void replica_status(struct replica *r, Psfleet__V1__ReplicaStatus *st, char *err_buf, size_t len);

void replica_on_replicate(struct rpc_call *call, void *ud);   /* gRPC Replicate (ud: struct psd) */
/* sparse_rpc.c: an embedding table's update (ReplicateUpdate.table) applied on the backup, its tensors
 * at in->tensors[at...]; checked whole before anything is applied. 0 or -errno with err. */
int sparse_replay(struct psd *p, const Psfleet__V1__ReplicateUpdate *u, const struct wire_in *in, size_t at,
                  char *err, size_t errlen);
/* sparse_rpc.c: an embedding table's update into a Replicate call: its fields in *m, its tensors
 * (copied) in o. Returns how many tensors. */
uint32_t sparse_update_out(struct psd *p, struct wire_out *o, Psfleet__V1__ReplicateUpdate *m,
                           const struct replica_sparse *sp);
/* sparse_rpc.c: the primary's state transfer, after the snapshot: every table's rows in pages
 * (ReplicateHeader.snapshot_rows), each sent by send_page. 0 or send_page's -errno. */
typedef int (*replica_page_fn)(void *ud, struct wire_out *o, const Psfleet__V1__ReplicateUpdate *u, char *why,
                               size_t len);
int sparse_transfer(struct psd *p, replica_page_fn send_page, void *ud, char *why, size_t len);
void replica_on_set_role(struct rpc_call *call, void *ud);    /* gRPC SetRole (ud: struct psd) */
