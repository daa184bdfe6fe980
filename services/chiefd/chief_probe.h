/* chiefd's status calls to the shards and the workers, and its Stop to the workers (main thread): what
 * they answer is recorded in the status (struct chief_status). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define PROBE_TIMEOUT_MS 2000            /* status calls: short, so a signal is never kept waiting long */

struct chief_status;
struct job_config;
struct ps_client;
struct rpc_channel;

/* Asks every shard for its status and records it. Returns the number of shards reachable; *n_init gets
 * the number initialized; why gets the first failure. */
uint32_t chief_probe_shards(struct chief_status *status, struct ps_client *pc, uint32_t *n_init, char *why, size_t len);
/* Asks every worker not yet finished whether it still computes, and records it. Returns how many do;
 * *first_busy gets the first of them (-1: none). */
uint32_t chief_probe_workers(struct chief_status *status, struct rpc_channel **worker_ch, int64_t *first_busy);
/* Tells every worker to stop; who does not answer is not waited for. */
void chief_stop_workers(const struct job_config *cfg, struct rpc_channel **worker_ch);
