/* Calls to a job's chief for the psfleet commands: a channel, a unary call, the job's status. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli_chief.h"
#include "cli_util.h"
#include "rpc.h"

int cli_chief_channel(const char *address, struct rpc_channel **ret) {
        int r = rpc_channel_new(address, "chief", ret);
        if (r < 0) {
                cli_error("cannot create a channel to \"%s\": %s", address, strerror(-r));
                return 1;
        }
        return 0;
}

int cli_chief_call(struct rpc_channel *ch, const char *method, const ProtobufCMessage *q,
                   const ProtobufCMessageDescriptor *reply, uint64_t timeout_ms, const char *what,
                   ProtobufCMessage **ret) {
        char err[1024];
        if (rpc_call_msg(ch, method, q, reply, timeout_ms, false, ret, err, sizeof(err)) < 0) {
                cli_error("cannot %s: %s", what, err);
                return 1;
        }
        return 0;
}

int cli_get_status(const char *address, uint64_t timeout_ms, Psfleet__V1__JobStatus **ret, char *err, size_t errlen) {
        struct rpc_channel *ch;
        int r = rpc_channel_new(address, "chief", &ch);
        if (r < 0) {
                snprintf(err, errlen, "cannot create a channel to \"%s\": %s", address, strerror(-r));
                return r;
        }
        Psfleet__V1__StatusRequest q = PSFLEET__V1__STATUS_REQUEST__INIT;
        ProtobufCMessage *m;
        r = rpc_call_msg(ch, "/psfleet.v1.Supervisor/GetStatus", &q.base, &psfleet__v1__job_status__descriptor,
                         timeout_ms, false, &m, err, errlen);
        rpc_channel_free(ch);
        if (r >= 0)
                *ret = (Psfleet__V1__JobStatus *)m;
        return r;
}
