/* psfleet: the command-line client. Finds the command in a table and hands it the rest of the line;
 * each command lives in its own file (cli_<name>.c), what they share in cli_util.c and its neighbours. */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "rpc.h"

static const struct command {
        const char *name;
        int (*run)(int argc, char **argv);
        const char *help;       /* its lines in the usage text */
} commands[] = {
        {"local", cmd_local,
         "local JOB.json       run the whole job on this machine (P psd, W workerd, 1 chiefd as\n"
         "                       child processes on loopback), or in one process with --standalone"},
        {"run", cmd_run,
         "run JOB.json         run this node's task in the foreground, as Slurm or Kubernetes starts it: the\n"
         "                       task and cluster from --job-name/--task-index, TF_CONFIG or --slurm"},
        {"status", cmd_status, "status               ask a job's chief how the job is doing"},
        {"watch", cmd_watch,
         "watch                follow a job's progress as it happens (a live bar on a terminal)"},
        {"top", cmd_top,
         "top                  a live view of a job's workers and shards: steps/s, pushes/s, stragglers"},
        {"checkpoints", cmd_checkpoints,
         "checkpoints list|save|rm STEP\n"
         "                       a job's checkpoints: list them, save one now, delete one"},
        {"stop", cmd_stop, "stop                 stop a job in order: a final checkpoint, then STOPPED"},
        {"restart", cmd_restart,
         "restart              train a job that has ended (done, failed, stopped) again from its newest\n"
         "                       checkpoint"},
        {"placement", cmd_placement,
         "placement JOB.json   print how the job's variables are spread over its ps shards"},
        {"plan", cmd_plan,
         "plan JOB.json        the memory each psd will need: dense variables, tables, buffers"},
        {"export", cmd_export,
         "export --job JOB --out DIR\n"
         "                       a job's trained model as DIR/model.onnx for serving (ONNX Runtime, Triton)"},
        {"check", cmd_check,
         "check JOB.json       pre-flight: the job file, endpoints, data and certificates, starting nothing"},
        {"certs", cmd_certs, "certs --job JOB      make a job's CA and a key and certificate per task (docs/security.md)"},
        {"gen-data", cmd_gendata,
         "gen-data --rows N --out PATH\n"
         "                       write training data from a planted model (Criteo-like, LIBSVM or CSV)"},
};

static void usage(FILE *f) {
        fprintf(f, "Usage: psfleet COMMAND [OPTIONS]\n\nCommands:\n");
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                fprintf(f, "  %s\n", commands[i].help);
        fprintf(f, "\n"
                   "`psfleet COMMAND --help` describes each command.\n"
                   "Exit status: 0 success, 1 failure, 2 bad usage, 78 bad job file or environment value.\n");
}

int main(int argc, char **argv) {
        if (argc < 2) {
                usage(stderr);
                return CLI_EX_USAGE;
        }
        const char *cmd = argv[1];
        if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
                usage(stdout);
                return 0;
        }
        if (strcmp(cmd, "--version") == 0) {
                printf("psfleet %s\n", PSFLEET_VERSION);
                return 0;
        }
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
                if (strcmp(cmd, commands[i].name) != 0)
                        continue;
                /* this node's rpc.* overrides (PSFLEET_RPC_*), for every command's channels: a bad one
                 * is a config error before anything starts, as in the daemons */
                char err[512];
                if (rpc_configure_env(err, sizeof(err)) < 0) {
                        cli_error("%s", err);
                        return CONFIG_EX_CONFIG;
                }
                return commands[i].run(argc - 1, argv + 1);
        }
        fprintf(stderr, "psfleet: unknown command \"%s\"\n\n", cmd);
        usage(stderr);
        return CLI_EX_USAGE;
}
