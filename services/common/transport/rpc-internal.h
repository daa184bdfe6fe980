/* What the RPC layer's files (rpc.c, rpc_server.c, rpc_client.c) share, and nobody else uses. */
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "config.h"

/* A caller's bug: prints file and line, aborts. */
#define die_if(cond, what) do { if (cond) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, what); abort(); } } while (0)

/* gRPC's end of a completion queue, the one order it allows: shut it down, take every event left
 * until it says so, destroy it. The caller has ended or cancelled every call on it. */
void rpc_cq_drain_destroy(grpc_completion_queue *cq);

/* A deadline ms from now on gRPC's monotonic clock. */
gpr_timespec rpc_deadline_in(uint64_t ms);
/* The channels' reconnect options into *ret: rpc_configure()'s, else (rpc_configure_env) the defaults
 * with their environment overrides. Returns 0, or -EINVAL when an override is bad (-ENOMEM).
 * Thread-safe. */
int rpc_channel_options(struct rpc_config *ret);
