/* Which job `--job X` names: a job file, a running `psfleet local` job by its name, or a job of the
 * configuration directory; and the records through which `psfleet local` makes its jobs findable (one
 * small JSON file per running local job in a per-user runtime directory). */
#pragma once
#include <stdbool.h>

/* A running `psfleet local` job, as it records itself. Strings malloc'd (cli_local_job_clear frees). */
struct cli_local_job {
        char *name;             /* the job's name */
        char *chief;            /* "127.0.0.1:PORT" */
        char *job_file;         /* the job file its daemons read (STATE_DIR/job.json) */
        char *state_dir;        /* the state root its daemons were given (the chief's records: STATE_DIR/JOB/) */
        char *source;           /* the job file it was started from, resolved (realpath) */
        long pid;               /* the `psfleet local` process */
};

void cli_local_job_clear(struct cli_local_job *j);

/* Where the records are: $XDG_RUNTIME_DIR/psfleet/local; else /run/psfleet/local as root; else
 * $TMPDIR/psfleet-UID/local (made 0700, refused when another user owns it). Returns a malloc'd path
 * (not created), or NULL when out of memory. */
char *cli_local_dir(void);

/* Records j (its name, chief, files and pid) as NAME.json, atomically, creating the directory. Returns
 * 0 with the record's path in *path_ret (malloc'd: give it to cli_local_unregister), -EEXIST when a live
 * `psfleet local` already records that name, or -errno. */
int cli_local_register(const struct cli_local_job *j, char **path_ret);

/* Removes the record at path (NULL-safe) and frees path. */
void cli_local_unregister(char *path);

/* The running local job named `name`, or (name NULL) the one started from the job file `source` (a
 * resolved path). A record whose process is gone is removed and not returned. Returns 0 with *ret
 * filled (the caller clears it), -ENOENT, or -errno. */
int cli_local_find(const char *name, const char *source, struct cli_local_job *ret);

/* Resolves --job ARG, in this order: a path to a job file (which a running local job started from that
 * file replaces: its daemons listen elsewhere); else the running local job named ARG; else
 * $PSFLEET_CONFIG_DIR/jobs/ARG.json (default /etc/psfleet). Returns 0 with the job file to load in
 * *path_ret (malloc'd) and, when it is a local job's, that job in *local_ret (else local_ret->pid is 0;
 * local_ret may be NULL); else prints why and returns CONFIG_EX_CONFIG (or 1: out of memory). */
int cli_job_resolve(const char *arg, char **path_ret, struct cli_local_job *local_ret);
