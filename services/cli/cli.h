/* The psfleet command line: one function per command, and what they share (job loading, progress
 * display, asking the chief for its status). Single-threaded apart from gRPC's own threads. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

#include "config.h"
#include "job.h"            /* job_state_name */
#include "psfleet/v1/supervisor.pb-c.h"

#define CLI_EX_USAGE 2

/* Each command gets argv from its own name on (argv[0] = "local") and returns the exit status. */
int cmd_local(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_watch(int argc, char **argv);
int cmd_checkpoints(int argc, char **argv);
int cmd_placement(int argc, char **argv);

/* Loads a job file; on failure prints the config error and returns CONFIG_EX_CONFIG (else 0). */
int cli_load_job(const char *path, struct job_config **ret);

/* Which chief to ask: `address`, else the chief entry of the job file `job` (TF_CONFIG's cluster when
 * set). Exactly one must be given. On success returns 0 and a malloc'd "host:port" in *ret; else prints
 * why (prefixed with `cmd`) and returns the exit status (CLI_EX_USAGE or CONFIG_EX_CONFIG). */
int cli_chief_address(const char *cmd, const char *address, const char *job, char **ret);

/* A whole number in [min, max] for option `opt` of `psfleet cmd`; else prints why and returns
 * CLI_EX_USAGE. */
int cli_parse_number(const char *cmd, const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *ret);

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

/* Formats seconds as "1:02:03" / "2:03" / "?" into buf. */
const char *cli_format_duration(double s, char *buf, size_t len);

/* Prints a JobStatus as one compact JSON object and a newline on f. */
void cli_print_status_json(FILE *f, const Psfleet__V1__JobStatus *s);
/* A Checkpoint as a JSON object (new reference). */
struct json_t *cli_checkpoint_json(const Psfleet__V1__Checkpoint *c);

/* The chief's JobStatus as protobuf-c (free with psfleet__v1__job_status__free_unpacked), from
 * `address`. Returns 0, or -errno with the reason in err. */
int cli_get_status(const char *address, uint64_t timeout_ms, Psfleet__V1__JobStatus **ret, char *err, size_t errlen);
