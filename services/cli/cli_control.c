/* psfleet stop and psfleet restart: the operator's two acts on a job's life, through its chief. `stop`
 * ends a running job in order (STOPPED after a final checkpoint); `restart` trains a job that has ended
 * (done, failed, stopped) again, from its newest valid checkpoint. */
#include <stdio.h>
#include <stdlib.h>

#include "cli_chief.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "rpc.h"

static void stop_help(FILE *f) {
        fprintf(f, "Usage: psfleet stop [--reason TEXT] (--address HOST:PORT | --job JOB.json)\n"
                   "\n"
                   "Stops the job in order: the workers are told to stop, a final checkpoint is written, the job\n"
                   "becomes STOPPED and chiefd tells the ps shards to stop, then exits. Starting chiefd again\n"
                   "resumes from that checkpoint. On a job that has ended, chiefd just exits.\n"
                   "\n"
                   "  --address HOST:PORT  the chief's address\n"
                   "  --job JOB.json       the job file: its cluster's chief entry (TF_CONFIG's cluster, if set)\n"
                   "  --reason TEXT        logged by the chief\n"
                   "  --timeout-ms N       deadline of the call (default 5000)\n"
                   "\n"
                   "Exit status: 0 the chief took the request, 1 it could not be reached, 2 bad usage,\n"
                   "78 bad job file.\n");
}

static void restart_help(FILE *f) {
        fprintf(f, "Usage: psfleet restart [--reason TEXT] (--address HOST:PORT | --job JOB.json)\n"
                   "\n"
                   "Trains a job that has ended (done, failed, stopped) again: chiefd restores every ps shard\n"
                   "from the newest valid checkpoint (or the initial values when there is none) and lets the\n"
                   "workers join again. A restart of chiefd never does this on its own: a failed job stays failed.\n"
                   "\n"
                   "  --address HOST:PORT  the chief's address\n"
                   "  --job JOB.json       the job file: its cluster's chief entry (TF_CONFIG's cluster, if set)\n"
                   "  --reason TEXT        logged by the chief, and the job's reason while it starts\n"
                   "  --timeout-ms N       deadline of the call (default 5000)\n"
                   "\n"
                   "Exit status: 0 the job is starting again, 1 the chief refused (the job has not ended) or\n"
                   "could not be reached, 2 bad usage, 78 bad job file.\n");
}

/* The command's one call to the chief; prints and returns as cli_chief_call. */
typedef int call_fn(struct rpc_channel *ch, const char *reason, uint64_t timeout_ms);

static int control(const char *cmd, void (*help)(FILE *), int argc, char **argv, call_fn *call) {
        const char *address = NULL, *job = NULL, *reason = "psfleet";
        uint64_t timeout_us = 5000 * 1000;
        const struct cli_opt opts[] = {
                CLI_CHIEF_OPTS(&address, &job),
                CLI_STRING("reason", &reason),
                CLI_DURATION("timeout-ms", &timeout_us, 1, 3600000, 1000),
                {NULL},
        };
        const struct cli_args args = {.cmd = cmd, .opts = opts, .help = help, .max_operands = 0};
        int first, r;
        char *chief = NULL;
        if (!cli_args_parse(&args, argc, argv, &first, &r) || (r = cli_chief_address(cmd, address, job, &chief)))
                return r;
        rpc_global_init();
        struct rpc_channel *ch = NULL;
        if (!(r = cli_chief_channel(chief, &ch)))
                r = call(ch, reason, timeout_us / 1000);
        rpc_channel_free(ch);
        free(chief);
        rpc_global_shutdown();
        return r;
}

static int call_stop(struct rpc_channel *ch, const char *reason, uint64_t timeout_ms) {
        Psfleet__V1__StopRequest q = PSFLEET__V1__STOP_REQUEST__INIT;
        q.reason = (char *)reason;
        ProtobufCMessage *m;
        int r = cli_chief_call(ch, "/psfleet.v1.Supervisor/Stop", &q.base, &psfleet__v1__stop_reply__descriptor,
                               timeout_ms, "stop the job", &m);
        if (!r) {
                printf("the chief is stopping the job: a final checkpoint, then STOPPED\n");
                protobuf_c_message_free_unpacked(m, NULL);
        }
        return r;
}

static int call_restart(struct rpc_channel *ch, const char *reason, uint64_t timeout_ms) {
        Psfleet__V1__RestartRequest q = PSFLEET__V1__RESTART_REQUEST__INIT;
        q.reason = (char *)reason;
        ProtobufCMessage *m;
        int r = cli_chief_call(ch, "/psfleet.v1.Supervisor/Restart", &q.base, &psfleet__v1__restart_reply__descriptor,
                               timeout_ms, "restart the job", &m);
        if (!r) {
                printf("the job is starting again from its newest checkpoint\n");
                protobuf_c_message_free_unpacked(m, NULL);
        }
        return r;
}

int cmd_stop(int argc, char **argv) {
        return control("stop", stop_help, argc, argv, call_stop);
}

int cmd_restart(int argc, char **argv) {
        return control("restart", restart_help, argc, argv, call_restart);
}
