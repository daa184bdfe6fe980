/* The psfleet command line: one function per command, and what they share (job loading, progress
 * display, asking the chief for its status). Single-threaded apart from gRPC's own threads. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "psfleet/v1/supervisor.pb-c.h"

#define CLI_EX_USAGE 2

/* Each command gets argv from its own name on (argv[0] = "local") and returns the exit status. */
int cmd_local(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_placement(int argc, char **argv);

/* Loads a job file; on failure prints the config error and returns CONFIG_EX_CONFIG (else 0). */
int cli_load_job(const char *path, struct job_config **ret);

/* A progress display on stderr: a bar redrawn in place on a terminal, a plain line every ~5 s
 * otherwise, nothing when quiet. */
struct progress {
        bool tty, quiet, drawn;
        uint64_t last_line_us;
};
void progress_init(struct progress *p, bool quiet);
/* loss NAN and examples_per_s or eta_s < 0 mean unknown. */
void progress_update(struct progress *p, const char *state, uint64_t step, uint64_t max_steps, double loss,
                     double examples_per_s, double eta_s);
/* Ends the bar's line (so that the next message starts on a fresh one). */
void progress_end(struct progress *p);

/* Formats seconds as "1:02:03" / "2:03" / "?" into buf. */
const char *cli_format_duration(double s, char *buf, size_t len);

/* The chief's JobStatus as protobuf-c (free with psfleet__v1__job_status__free_unpacked), from
 * `address`. Returns 0, or -errno with the reason in err. */
int cli_get_status(const char *address, uint64_t timeout_ms, Psfleet__V1__JobStatus **ret, char *err, size_t errlen);
/* "initializing", "training", ...; "unknown" otherwise. */
const char *cli_state_name(int state);
