/* What psd, workerd and chiefd share as daemons: command line, job file and task resolution (TF_CONFIG
 * too), signals handled in one place, the exit status systemd acts on, and binding the server. */
#pragma once
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "rpc.h"

/* Exit statuses (sysexits.h) the units act on; docs/operations.md, "Exit codes", has the table. The
 * permanent ones (65, 74, 78) are in every unit's RestartPreventExitStatus=: a restart cannot fix them. */
#define DAEMON_EX_FAILURE 1            /* anything else: systemd restarts the daemon */
#define DAEMON_EX_DATAERR 65           /* EX_DATAERR: data missing, empty, truncated, not fitting the model */
#define DAEMON_EX_IOERR 74             /* EX_IOERR: the state directory cannot be created or written */
#define DAEMON_EX_TEMPFAIL 75          /* EX_TEMPFAIL: address in use, a peer did not come in time: restarted */
#define DAEMON_EX_CONFIG CONFIG_EX_CONFIG /* 78 EX_CONFIG: the job file, TF_CONFIG or the options */

/* The one mapping of a failure (-errno, as the daemons' set-up and waits return it) to an exit status:
 * 0 for r >= 0; -EBADMSG (the data module's kind for bad data, data.h) 65; -EACCES, -EROFS, -ENOSPC,
 * -EDQUOT, -EIO, -ENOTDIR, -EISDIR 74; -EADDRINUSE, -EADDRNOTAVAIL, -ETIMEDOUT 75; anything else 1.
 * A config error is known where it is found (the caller returns DAEMON_EX_CONFIG itself). */
int daemon_exit_code(int r);
/* What an exit status of a daemon means, for messages ("data error", ...); NULL if none of the above. */
const char *daemon_exit_meaning(int status);

struct daemon_args {
        struct job_config *cfg;
        struct task task;
        char *task_name;        /* "ps:0" */
        char *state_dir;        /* --state-dir, $STATE_DIRECTORY, /var/lib/psfleet */
        char *listen;           /* --listen, else the task's own cluster entry */
        char *loss_log;         /* --loss-log FILE (workerd): "global_step loss" per step */
        bool exit_at_end;       /* --exit-at-end (chiefd): exit once the job has ended instead of staying up */
        bool backup;            /* --backup (psd): this is cluster.ps_backup[index], the shard's other psd */
};

/* The log.* keys for this process (log_set_max_level, log_set_time): c's (a loaded job) or, with c NULL,
 * the keys' defaults; with their environment overrides (PSFLEET_LOG_LEVEL, PSFLEET_LOG_TIME) either way,
 * which are also applied to c. Returns 0, or -EINVAL with "VARIABLE: \"value\" is not ..." in err and
 * the log left as it was (-ENOMEM). */
int daemon_log_config(struct job_config *c, char *err, size_t errlen);

/* Parses the command line of daemon `ident` with role `role`, and sets the log up: its level and
 * timestamps from the environment first (daemon_log_config: a bad value is a config error), then from
 * the job, and under the daemon's name, job and task (log_setup) once the task is known. Returns 0 to
 * run, 1 when --help was printed (exit 0), or CONFIG_EX_CONFIG after printing the reason (exit 78,
 * nothing started). */
int daemon_args_parse(int argc, char **argv, const char *ident, enum role role, struct daemon_args *ret);
void daemon_args_done(struct daemon_args *a);

/* Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (call before any thread exists, so every
 * thread inherits the mask) and returns a signalfd that reports them, or -errno. */
int daemon_signals_fd(void);

/* The request limit of a daemon whose requests are all small (chiefd, workerd). */
#define DAEMON_SMALL_MESSAGES (1u << 20)

/* Binds and starts `a`'s server (the table is copied), with mutual TLS when the job has it (set up by
 * daemon_args_parse), refusing requests over max_receive bytes (the largest legal one plus a margin:
 * RESOURCE_EXHAUSTED). On failure logs one line, "cannot listen on ADDR: REASON", and returns -errno
 * (-EADDRINUSE, -EADDRNOTAVAIL, -EACCES, ...; daemon_exit_code maps it). With metrics.listen set it
 * also starts the process's /metrics server (transport/metrics_http.h; stopped by daemon_args_done), and
 * fails the same way when that address cannot be bound. */
int daemon_listen(const struct daemon_args *a, const struct rpc_method *methods, size_t n_methods, unsigned threads,
                  size_t max_receive, struct rpc_server **ret);
