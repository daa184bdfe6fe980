/* psfleet placement: where each variable of a job's model lives, computed from the job file alone as
 * every node computes it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "job.h"
#include "placement.h"

static void placement_help(FILE *f) {
        fprintf(f, "Usage: psfleet placement JOB.json\n\n"
                   "Prints where each variable of the job's model lives: one row per variable (or row\n"
                   "range of a split variable) with its shard and bytes, then the bytes per shard. Every\n"
                   "node computes the same plan from the job file (greedy by bytes; variables larger\n"
                   "than ps.split_bytes are split into row ranges).\n");
}

int cmd_placement(int argc, char **argv) {
        static const struct cli_opt opts[] = {{NULL}};
        static const struct cli_args args = {
                .cmd = "placement", .opts = opts, .help = placement_help, .terse = true,
                .min_operands = 1, .max_operands = 1, .usage = "Usage: psfleet placement JOB.json",
        };
        const char *path;
        struct job_config *cfg;
        struct job_layout *L = NULL;
        int r;
        if (!cli_job_file_command(&args, argc, argv, &path, &cfg, &L, &r))
                return r;
        struct placement_var *pv = NULL;
        int ret = 1;
        pv = calloc(L->n_vars, sizeof(*pv));
        if (!pv) {
                cli_error("out of memory");
                goto out;
        }
        for (uint32_t i = 0; i < L->n_vars; i++)
                pv[i] = (struct placement_var){L->vars[i].name, L->vars[i].rows,
                                               (uint64_t)L->vars[i].cols * sizeof(float)};
        printf("job %s: %u variables, %zu parameters (%zu bytes) on %u ps shard%s, split_bytes %llu\n", cfg->name,
               L->n_vars, L->n_params, L->n_params * sizeof(float), L->n_shards, L->n_shards == 1 ? "" : "s",
               (unsigned long long)cfg->ps.split_bytes);
        placement_print(stdout, L->plan, pv);
        ret = 0;
out:
        free(pv);
        job_layout_free(L);
        config_free(cfg);
        return ret;
}
