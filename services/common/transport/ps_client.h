/* The client of a job's ps shards: channels to every shard, with the job's fingerprint stamped on each
 * call, and whole parameter blocks moved to and from them (assign, pull, push). */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "job.h"
#include "rpc.h"

/* Channels to every ps shard, with the job's fingerprint stamped on each call. */
struct ps_client {
        const struct job_config *cfg;
        const struct job_layout *L;
        struct rpc_channel **ch;        /* (n_shards) */
        char task[32];                  /* "worker:1" */
        uint64_t deadline_ms;
};

int ps_client_new(const struct job_config *cfg, const struct job_layout *L, const char *task, struct ps_client **ret);
struct ps_client *ps_client_free(struct ps_client *pc);

/* The shards in which[] (NULL: every shard) get their variables (and slots, if given; else the
 * optimizer's initial values) from these blocks; shard 0 also gets global_step. All in parallel. */
int ps_client_assign(struct ps_client *pc, const bool *which, const float *params, float *const *slots,
                     uint64_t global_step, char *err, size_t errlen);
/* Reads every shard into the blocks (slots too when slots != NULL). global_step from shard 0. */
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
/* Tells every shard to stop (best effort; returns the first error). */
int ps_client_stop(struct ps_client *pc, const char *reason);

/* One push of gradients to one shard, for the parts listed; grads are lent to gRPC until the call
 * finishes; userdata comes back with the finished call (rpc_pending_userdata). */
int ps_client_push_start(struct ps_client *pc, struct rpc_batch *b, uint32_t shard, const uint32_t *parts,
                         uint32_t n_parts, const float *grads, uint32_t worker, uint64_t local_step, bool count_step,
                         void *userdata, struct rpc_pending **ret);
/* Checks a push's reply against the layout without copying the values: *in_ret (caller frees with
 * wire_in_free) holds them until job_layout_copy_in() puts them in place. */
int ps_client_push_reply(struct ps_client *pc, struct rpc_result *r, void **in_ret, uint64_t *global_step_ret,
                         uint64_t *incarnation_ret, char *err, size_t errlen);

/* Asks `shard` to serve this worker's pushes through its shared-memory segment (shmlink.h) from now
 * on: segment name, nonce and the shard's link generation; the groups that go to this shard, each
 * with its record index in the segment and its placement parts. Returns 0 with psd's process id, or
 * -errno with the reason (psd on another host cannot open the segment: FAILED_PRECONDITION). */
int ps_client_attach_shm(struct ps_client *pc, uint32_t shard, uint32_t worker, const char *segment,
                         const uint8_t *nonce, uint32_t generation, uint32_t n_groups, const uint32_t *group_index,
                         const uint32_t *const *group_parts, const uint32_t *group_n, int32_t *pid_ret, char *err,
                         size_t errlen);

