/* ps.replicas 2: the two psds of a shard, its primary and its backup (docs/operations.md, "Replicated
 * shards"). The primary applies each update under the replica's lock, forwards it to the backup and
 * waits for the acknowledgement before the push is answered, so the backup applies the same updates in
 * the same order and its variables and slots stay bit-equal. The chief alone sets the roles
 * (SetRole), each with an epoch; a psd refuses writes unless it is the primary, and a primary whose
 * backup answers with a newer epoch steps down (fenced). A backup that does not answer within
 * ps.replica_timeout_ms is dropped (the write that found it so fails) and, once the chief has
 * recorded it (SetRole unreplicated_ok; writes are refused until then), the shard runs unreplicated;
 * the replica's thread brings a
 * backup (back) by a state transfer: the primary's whole state (a snapshot, under the lock), then
 * the updates since. Thread-safe. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "rpc.h"
#include "shard.h"
#include "psfleet/v1/ps.pb-c.h"

struct psd;
struct replica;

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

/* A write (a push) begins: 0 with the replica's lock held (the caller applies, then calls
 * replica_write_end), or -EAGAIN with err saying this psd is not the shard's primary (counted as
 * fenced; nothing held). */
int replica_write_begin(struct replica *r, char *err, size_t errlen);
/* The write applied: parts[0..n) got grads (float32, as applied: scaled), gs is global_step after it.
 * Forwards it to the backup and waits for its acknowledgement (bounded: ps.replica_timeout_ms), then
 * releases the lock (grads NULL: it cannot be forwarded, the backup is dropped). 0 (acknowledged, or
 * the shard runs unreplicated), or -errno with err when the write must not be answered as done: this
 * psd was found fenced (no longer the primary), or the backup did not acknowledge it (dropped). */
int replica_write_end(struct replica *r, struct shard_part *const *parts, uint32_t n, const float *grads, uint64_t gs,
                      const struct replica_push *push, char *err, size_t errlen);

/* Whether p may serve a write now (a primary; true without replicas). */
bool replica_is_primary(struct replica *r);

/* The status's replica field (unset when r is NULL); strings valid until the next call. */
void replica_status(struct replica *r, Psfleet__V1__ReplicaStatus *st, char *err_buf, size_t len);

void replica_on_replicate(struct rpc_call *call, void *ud);   /* gRPC Replicate (ud: struct psd) */
void replica_on_set_role(struct rpc_call *call, void *ud);    /* gRPC SetRole (ud: struct psd) */
