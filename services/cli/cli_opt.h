/* The options of a psfleet command, as a table: each a flag, a string, a bounded number or a bounded
 * duration, parsed by one getopt_long loop so that the bounds and their messages are written once. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum cli_opt_type {
        CLI_OPT_FLAG,           /* --name: *flag = true */
        CLI_OPT_STRING,         /* --name VALUE: *str = VALUE (points into argv) */
        CLI_OPT_NUMBER,         /* --name N, N in [min, max]: *num = N */
        CLI_OPT_DURATION,       /* --name N, N in [min, max] units of unit_us: *num = N * unit_us (microseconds) */
};

struct cli_opt {
        const char *name;       /* without the dashes; NULL ends a table */
        enum cli_opt_type type;
        union {
                bool *flag;
                const char **str;
                uint64_t *num;
        };
        uint64_t min, max;      /* NUMBER, DURATION: bounds, in the option's own unit */
        uint64_t unit_us;       /* DURATION: 1000 for an option in ms, 1000000 for one in seconds (max * unit_us
                                 * must fit in 64 bits) */
};

#define CLI_FLAG(n, p) {.name = (n), .type = CLI_OPT_FLAG, .flag = (p)}
#define CLI_STRING(n, p) {.name = (n), .type = CLI_OPT_STRING, .str = (p)}
#define CLI_NUMBER(n, p, lo, hi) {.name = (n), .type = CLI_OPT_NUMBER, .num = (p), .min = (lo), .max = (hi)}
#define CLI_DURATION(n, p, lo, hi, unit) \
        {.name = (n), .type = CLI_OPT_DURATION, .num = (p), .min = (lo), .max = (hi), .unit_us = (unit)}
/* Which chief a command asks, for cli_chief_address: --address HOST:PORT or --job JOB.json. */
/* --address, --job, and --identity (kept in cli_identity: the commands that take --job share it). */
extern const char *cli_identity;
#define CLI_CHIEF_OPTS(address, job) \
        CLI_STRING("address", (address)), CLI_STRING("job", (job)), CLI_STRING("identity", &cli_identity)
#define CLI_JOB_HELP \
        "  --job JOB            the job file, a running `psfleet local` job's name, or JOB for\n" \
        "                       $PSFLEET_CONFIG_DIR/jobs/JOB.json (default /etc/psfleet): its chief\n" \
        "                       (TF_CONFIG's cluster, if set)\n"
#define CLI_IDENTITY_HELP \
        "  --identity NAME      with --job under mutual TLS: whose certificate to present, admin or viewer\n" \
        "                       (default: admin when its key is readable, else viewer; docs/security.md)\n"

/* A command's command line: its options (--help is always there) and how many operands follow. */
struct cli_args {
        const char *cmd;                /* "status": names the command in messages */
        const struct cli_opt *opts;     /* ends with {NULL} */
        void (*help)(FILE *f);          /* --help: on stdout; an unknown option: on stderr, unless terse */
        bool terse;                     /* an unknown option: getopt's complaint only */
        int min_operands, max_operands; /* max < 0: no limit */
        const char *usage;              /* a wrong operand count: this line on stderr (NULL: help) */
};

/* Parses argv (argv[0] is the command's name) by a. Returns true with the index of the first operand in
 * *first when the command should run; false when it should exit with *status: 0 after --help, or
 * CLI_EX_USAGE after printing why (an unknown option, a value out of bounds, the operand count). The
 * destinations of options not given keep their values (the defaults). */
bool cli_args_parse(const struct cli_args *a, int argc, char **argv, int *first, int *status);
