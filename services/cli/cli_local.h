/* What psfleet local's two files share: the run's state (struct local, one struct child per daemon)
 * and what cli_local.c (the command, --standalone) calls in cli_local_run.c (the children on loopback,
 * supervised). Not thread-safe: one run per process. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "cli_util.h"
#include "config.h"
#include "rpc.h"

#define MAX_TASKS 64                            /* --ps, --workers */
#define READY_TIMEOUT_US (60 * 1000000ULL)      /* every child answers its health check within this */
#define STATUS_FAIL_US (30 * 1000000ULL)        /* the chief may stay silent this long */
#define GRACE_US (3 * 1000000ULL)               /* after DONE: children exit on their own within this */
#define TERM_US (10 * 1000000ULL)               /* after SIGTERM: then SIGKILL */

struct child {
        char task[32];          /* "ps:0", "chief:0", "worker:1" */
        char addr[64];          /* "127.0.0.1:PORT" */
        const char *bin;
        char *argv[12];
        char **envp;
        char *tf_config;
        pid_t pid;              /* 0 once reaped */
        int status;             /* wait status, once reaped */
        bool ready;
        struct rpc_channel *ch;
};

struct local {
        /* options */
        const char *job_path, *loss_log, *state_dir_opt, *params_out;
        bool standalone, keep_state, quiet;
        uint64_t max_steps, n_ps, n_workers;    /* 0: the job's own */

        struct job_config *cfg;                 /* the job as the children see it */
        char *state_dir, *job_copy;
        char *runtime_env;                      /* "PSFLEET_RUNTIME_DIR=STATE_DIR/run" for the children */
        char *record;                           /* our record for `--job NAME` (cli_jobref.h), or NULL */
        char *bins[3];                          /* psd, workerd, chiefd */
        struct child *kids;
        uint32_t n_kids, chief;                 /* index of the chief in kids */
        struct progress prog;
        bool rpc_up;
        double cpu_base;                        /* CPU seconds already counted when we started */
};

/* Signals reach the run through a self-pipe (cli_local_run.c): SIGINT, SIGTERM, SIGCHLD; SIGPIPE
 * ignored. 0 or -errno. */
int local_signals_setup(void);
/* psd, workerd or chiefd: PSFLEET_BIN_DIR, next to psfleet, the build tree, PATH. A malloc'd path, or
 * NULL after saying why. */
char *local_find_bin(const char *name);
/* The children of L (ports, the job copy every child reads, their argv and environment): 0, or the exit
 * status after saying why. */
/* The job's own credentials when it runs on loopback under security.mode auto (tls_auto_prepare),
 * then psfleet's calls as admin (cli_secure). Returns 0 or the exit status, after saying why. */
int local_auto_tls(struct local *L);
int local_build_children(struct local *L);
void local_free_children(struct local *L);
/* Starts the children, waits until each is healthy, follows the chief until the job ends, stops them
 * all and prints the JSON line: the command's exit status. */
int local_supervise(struct local *L);
/* CPU seconds of `who` (RUSAGE_SELF, RUSAGE_CHILDREN); those of this run so far. */
double local_rusage_cpu_s(int who);
double local_used_cpu_s(const struct local *L);
/* The JSON line's test_auc / test_rmse members (each < 0: left out) into buf. */
void local_result_extra(double auc, double rmse, char *buf, size_t len);
