/* What every psfleet command shares: exit statuses, messages, job loading, the chief's address,
 * numbers and durations, and the progress display. No RPC here: a command that only reads a job file
 * (placement) needs none. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"

#define CLI_EX_USAGE 2

/* Prints "psfleet: " and the formatted message and a newline on stderr, in one write (the children of
 * `psfleet local` share our stderr); keeps errno for %m. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Loads a job file; on failure prints the config error and returns CONFIG_EX_CONFIG (else 0). The caller
 * frees *ret with config_free. */
int cli_load_job(const char *path, struct job_config **ret);
struct job_layout;
/* cli_load_job, then the model's variables and their placement (*L_ret, job_layout_free); on failure
 * prints why and returns the exit status (CONFIG_EX_CONFIG, 1), with nothing left to free. */
int cli_load_job_layout(const char *path, struct job_config **cfg_ret, struct job_layout **L_ret);
struct cli_args;
/* A command whose one operand is a job file: parses argv by a, then cli_load_job_layout of that operand.
 * True with *path (in argv), *cfg_ret and *L_ret set; false with *status the exit status (after --help
 * too) and nothing to free. */
bool cli_job_file_command(const struct cli_args *a, int argc, char **argv, const char **path,
                          struct job_config **cfg_ret, struct job_layout **L_ret, int *status);

/* Which chief to ask: `address`, else the job that `job` names (cli_job_resolve: a job file, a running
 * `psfleet local` job's name, or $PSFLEET_CONFIG_DIR/jobs/JOB.json): its chief entry (TF_CONFIG's
 * cluster when set, except for a local job). Exactly one must be given. Sets up TLS from that job
 * (cli_secure). On success returns 0 and a malloc'd "host:port" in *ret (the caller frees it); else
 * prints why (prefixed with `cmd`) and returns the exit status (1, CLI_EX_USAGE or CONFIG_EX_CONFIG). */
int cli_chief_address(const char *cmd, const char *address, const char *job, char **ret);

/* The same, with what a command may need beyond the address (strings malloc'd; NULL when unknown). */
struct cli_chief_ref {
        char *address;          /* "host:port" */
        char *job_name;         /* the job's name; NULL with --address */
        char *state_dir;        /* a running local job's state root (chief's records in STATE_DIR/JOB/) */
        char *tls_error;        /* offline_ok: why the job's credentials could not be had (no call made) */
};
/* offline_ok: a command that can do without the chief (reading its records) gets 0 also when the
 * job's credentials are missing or not this user's, with the reason in tls_error instead of printed. */
int cli_chief_locate(const char *cmd, const char *address, const char *job, bool offline_ok,
                     struct cli_chief_ref *ret);
void cli_chief_ref_clear(struct cli_chief_ref *r);   /* frees the strings */

/* The job's security.* for psfleet's own calls, as `identity` (admin or viewer; NULL: admin when its
 * key is readable, else viewer; psfleet local: admin): mutual TLS for every channel made after, or
 * plain TCP where the job allows it. Returns 0, or prints why and returns the exit status. */
int cli_secure(const struct job_config *cfg, const char *identity);
/* The same, the reason written into why instead of printed. */
int cli_secure_why(const struct job_config *cfg, const char *identity, char *why, size_t len);

/* A whole number in [min, max] for option `opt` of `psfleet cmd`: returns 0 with it in *ret; else
 * prints why ("psfleet cmd: --opt "s": expected min..max") and returns CLI_EX_USAGE (*ret untouched). */
int cli_parse_number(const char *cmd, const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *ret);

/* /proc/PID/stat read into buf: returns where its third field (the state) starts, after the command
 * name, or NULL when the process is gone or the line is not what it should be. */
const char *cli_proc_stat(long pid, char *buf, size_t len);

/* Formats seconds as "1:02:03" / "2:03", or "?" when negative, NaN or absurd, into buf; returns buf. */
const char *cli_format_duration(double s, char *buf, size_t len);

/* Formats a wall-clock time (µs since the epoch) as local "2026-12-03 08:40:12", with " +0000" when
 * zone, into buf; returns buf. */
const char *cli_format_time(uint64_t us, bool zone, char *buf, size_t len);

/* A progress display: a bar redrawn in place on a terminal, a plain line every ~5 s otherwise,
 * nothing when quiet. */
struct progress {
        FILE *f;
        bool tty, quiet, drawn;
        uint64_t last_line_us;
};
/* On stderr. */
void progress_init(struct progress *p, bool quiet);
/* On f (a terminal or not). */
void progress_init_file(struct progress *p, FILE *f, bool quiet);
/* loss NAN and examples_per_s or eta_s < 0 mean unknown. */
void progress_update(struct progress *p, const char *state, uint64_t step, uint64_t max_steps, double loss,
                     double examples_per_s, double eta_s);
/* The same with `extra` (may be NULL) after the ETA; force_line prints a plain line even within 5 s
 * of the last one (a state change). */
void progress_update_extra(struct progress *p, const char *state, uint64_t step, uint64_t max_steps, double loss,
                           double examples_per_s, double eta_s, const char *extra, bool force_line);
/* Ends the bar's line (so that the next message starts on a fresh one). */
void progress_end(struct progress *p);
