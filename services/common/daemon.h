/* What psd and workerd share as daemons: command line, job file and task resolution (TF_CONFIG too),
 * signals handled in one place, and the watchdog fed only while the daemon still answers. */
#pragma once
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"

struct daemon_args {
        struct job_config *cfg;
        struct task task;
        char *task_name;        /* "ps:0" */
        char *state_dir;        /* --state-dir, $STATE_DIRECTORY, /var/lib/psfleet */
        char *listen;           /* --listen, else the task's own cluster entry */
        char *loss_log;         /* --loss-log FILE (workerd): "global_step loss" per step */
};

/* Parses the command line of daemon `ident` with role `role`. Returns 0 to run, 1 when --help was
 * printed (exit 0), or CONFIG_EX_CONFIG after printing the reason (exit 78, nothing started). */
int daemon_args_parse(int argc, char **argv, const char *ident, enum role role, struct daemon_args *ret);
void daemon_args_done(struct daemon_args *a);

/* Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (call before any thread exists, so every
 * thread inherits the mask) and returns a signalfd that reports them, or -errno. */
int daemon_signals_fd(void);
