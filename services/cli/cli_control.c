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
        fprintf(f, "Usage: psfleet stop [--reason TEXT] (--address HOST:PORT | --job JOB)\n"
                   "\n"
                   "Stops the job in order: the workers are told to stop, a final checkpoint is written, the job\n"
                   "becomes STOPPED and chiefd tells the ps shards to stop, then exits. Starting chiefd again\n"
                   "resumes from that checkpoint. On a job that has ended, chiefd just exits.\n"
                   "\n"
                   "  --address HOST:PORT  the chief's address\n"
                   CLI_JOB_HELP
                   CLI_IDENTITY_HELP
                   "  --reason TEXT        logged by the chief\n"
                   "  --timeout-ms N       deadline of the call (default 5000)\n"
                   "\n"
                   "Exit status: 0 the chief took the request, 1 it could not be reached, 2 bad usage,\n"
                   "78 bad job file.\n");
}

static void restart_help(FILE *f) {
        fprintf(f, "Usage: psfleet restart [--reason TEXT] (--address HOST:PORT | --job JOB)\n"
                   "\n"
                   "Trains a job that has ended (done, failed, stopped) again: chiefd restores every ps shard\n"
                   "from the newest valid checkpoint (or the initial values when there is none) and lets the\n"
                   "workers join again. A restart of chiefd never does this on its own: a failed job stays failed.\n"
                   "\n"
                   "  --address HOST:PORT  the chief's address\n"
                   CLI_JOB_HELP
                   CLI_IDENTITY_HELP
                   "  --reason TEXT        logged by the chief, and the job's reason while it starts\n"
                   "  --timeout-ms N       deadline of the call (default 5000)\n"
                   "\n"
                   "Exit status: 0 the job is starting again, 1 the chief refused (the job has not ended) or\n"
                   "could not be reached, 2 bad usage, 78 bad job file.\n");
}

/* The command line of stop and restart: the chief's address and the reason. */
struct control {
        const char *reason;
        uint64_t timeout_ms;
        struct rpc_channel *ch;
};

/* Parses the command line and opens a channel to the chief. Returns -1 with *c ready, else the exit
 * status (after --help, or having said what is wrong). */
static int control_open(const char *cmd, void (*help)(FILE *), int argc, char **argv, struct control *c) {
        const char *address = NULL, *job = NULL;
        uint64_t timeout_us = 5000 * 1000;
        c->reason = "psfleet";
        const struct cli_opt opts[] = {
                CLI_CHIEF_OPTS(&address, &job),
                CLI_STRING("reason", &c->reason),
                CLI_DURATION("timeout-ms", &timeout_us, 1, 3600000, 1000),
                {},
        };
        const struct cli_args args = {.cmd = cmd, .opts = opts, .help = help, .max_operands = 0};
        int first, r;
        char *chief = NULL;
        if (!cli_args_parse(&args, argc, argv, &first, &r) || (r = cli_chief_address(cmd, address, job, &chief)))
                return r;
        c->timeout_ms = timeout_us / 1000;
        rpc_global_init();
        r = cli_chief_channel(chief, &c->ch);
        free(chief);
        if (r) {
                rpc_global_shutdown();
                return r;
        }
        return -1;
}

/* A command: its call, what it is for in an error, and its line on stdout when it succeeds. */
struct control_cmd {
        const char *name;
        void (*help)(FILE *f);
        const char *method;
        const ProtobufCMessageDescriptor *request, *reply;   /* the request has a string field `reason` */
        const char *what, *done;
};

static int control(const struct control_cmd *k, int argc, char **argv) {
        struct control c;
        int r = control_open(k->name, k->help, argc, argv, &c);
        if (r >= 0)
                return r;
        /* StopRequest and RestartRequest: a message with one field, `reason`, set through the
         * descriptor so that one path serves both. */
        ProtobufCMessage *q = calloc(1, k->request->sizeof_message), *m = NULL;
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field_by_name(k->request, "reason");
        if (!q || !fd) {
                cli_error("out of memory");
                r = 1;
        } else {
                protobuf_c_message_init(k->request, q);
                *(const char **)((char *)q + fd->offset) = c.reason;
                r = cli_chief_call(c.ch, k->method, q, k->reply, c.timeout_ms, k->what, &m);
        }
        if (!r) {
                printf("%s\n", k->done);
                protobuf_c_message_free_unpacked(m, NULL);
        }
        free(q);
        rpc_channel_free(c.ch);
        rpc_global_shutdown();
        return r;
}

/* The control commands: what each asks the chief, and what it says once the chief has it. */
static const struct control_cmd controls[] = {
        {"stop", stop_help, "/psfleet.v1.Supervisor/Stop", &psfleet__v1__stop_request__descriptor,
         &psfleet__v1__stop_reply__descriptor, "stop the job",
         "the chief is stopping the job: a final checkpoint, then STOPPED"},
        {"restart", restart_help, "/psfleet.v1.Supervisor/Restart", &psfleet__v1__restart_request__descriptor,
         &psfleet__v1__restart_reply__descriptor, "restart the job",
         "the job is starting again from its newest checkpoint"},
};

int cmd_stop(int argc, char **argv) {
        return control(&controls[0], argc, argv);
}

int cmd_restart(int argc, char **argv) {
        return control(&controls[1], argc, argv);
}
