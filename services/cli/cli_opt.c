/* One getopt_long loop for every psfleet command, driven by the command's table of options. */
#include <getopt.h>
#include <stdlib.h>

#include "cli_opt.h"
#include "cli_util.h"

#define MAX_OPTS 32                     /* below '?' and ':', which getopt_long returns on errors */
#define HELP 1000

/* One option's value; returns 0 or CLI_EX_USAGE (said why). */
static int set_value(const char *cmd, const struct cli_opt *o, const char *arg) {
        char opt[64];
        uint64_t v;
        switch (o->type) {
        case CLI_OPT_FLAG:
                *o->flag = true;
                return 0;
        case CLI_OPT_STRING:
                *o->str = arg;
                return 0;
        case CLI_OPT_NUMBER:
        case CLI_OPT_DURATION:
                snprintf(opt, sizeof(opt), "--%s", o->name);
                if (cli_parse_number(cmd, opt, arg, o->min, o->max, &v))
                        return CLI_EX_USAGE;
                *o->num = o->type == CLI_OPT_DURATION ? v * o->unit_us : v;
                return 0;
        }
        return CLI_EX_USAGE;
}

bool cli_args_parse(const struct cli_args *a, int argc, char **argv, int *first, int *status) {
        struct option lo[MAX_OPTS + 2] = {{0}};
        int n = 0;
        for (; a->opts[n].name; n++) {
                if (n == MAX_OPTS)
                        abort();        /* a table this long is a bug, found by the first run */
                int has_arg = a->opts[n].type == CLI_OPT_FLAG ? no_argument : required_argument;
                lo[n] = (struct option){a->opts[n].name, has_arg, NULL, n};
        }
        lo[n] = (struct option){"help", no_argument, NULL, HELP};
        int c;
        optind = 0;     /* 0, not 1: glibc then forgets a previous parse (a pointer into its argv) */
        *status = CLI_EX_USAGE;
        while ((c = getopt_long(argc, argv, "", lo, NULL)) >= 0) {
                if (c == HELP) {
                        a->help(stdout);
                        *status = 0;
                        return false;
                }
                if (c >= n) {   /* '?': getopt_long said what is wrong */
                        if (!a->terse)
                                a->help(stderr);
                        return false;
                }
                if (set_value(a->cmd, &a->opts[c], optarg))
                        return false;
        }
        int operands = argc - optind;
        if (operands < a->min_operands || (a->max_operands >= 0 && operands > a->max_operands)) {
                if (a->usage)
                        fprintf(stderr, "%s\n", a->usage);
                else
                        a->help(stderr);
                return false;
        }
        *first = optind;
        return true;
}
