/* Calls to a job's chief (chiefd) for the commands that ask it something. The channel is the transport's
 * opaque rpc_channel: no gRPC type is named here. The caller runs rpc_global_init() first. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "psfleet/v1/supervisor.pb-c.h"

struct rpc_channel;

/* A channel to the chief at `address`: returns 0, or 1 after printing why (free it with
 * rpc_channel_free). */
int cli_chief_channel(const char *address, struct rpc_channel **ret);

/* One unary call of `method` ("/psfleet.v1.Supervisor/...") with request q, whose reply is a `reply`.
 * Returns 0 with the reply in *ret (free it with protobuf_c_message_free_unpacked); else prints
 * "psfleet: cannot <what>: <why>" and returns 1. */
int cli_chief_call(struct rpc_channel *ch, const char *method, const ProtobufCMessage *q,
                   const ProtobufCMessageDescriptor *reply, uint64_t timeout_ms, const char *what,
                   ProtobufCMessage **ret);

/* The chief's JobStatus as protobuf-c (free with psfleet__v1__job_status__free_unpacked), from
 * `address` over a channel of its own. Returns 0, or -errno with the reason in err. */
int cli_get_status(const char *address, uint64_t timeout_ms, Psfleet__V1__JobStatus **ret, char *err, size_t errlen);
