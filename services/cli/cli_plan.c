/* psfleet plan: the memory each psd of a job will need, from the job file alone (memplan.h), so that
 * ps.memory_limit_bytes and the machines can be chosen before the job starts. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cli_json.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "job.h"
#include "memplan.h"

static void plan_help(FILE *f) {
        fprintf(f, "Usage: psfleet plan [--json] JOB.json\n\n"
                   "Prints the memory each psd of the job will need, computed from the job file alone: its\n"
                   "dense variables with their optimizer slots as placement puts them, each embedding table\n"
                   "at its bound (max_rows), its vocab or its expected_rows, with slots, index and records\n"
                   "as the table lays them out, the buffers of messages and shared memory in flight (and the\n"
                   "copies int8 answers keep per worker), and the process itself. A table with no bound is\n"
                   "reported unbounded (its total is a floor).\n"
                   "Under ps.memory_limit_bytes, the rows each table may hold under the limit.\n\n"
                   "  --json    one JSON object per psd in an array\n\n"
                   "Exit status: 0; 78 when the job file is bad or ps.memory_limit_bytes is below what a psd\n"
                   "needs without its tables.\n");
}

static double mib(uint64_t b) {
        return (double)b / (1 << 20);
}

static void print_ps(const struct job_config *cfg, uint32_t s, const struct memplan_ps *p) {
        printf("ps:%u%s\n", s, p->unbounded ? "  (a table is unbounded: the total is a floor)" : "");
        printf("  %-24s %14s %12s %14s\n", "part", "rows", "bytes/row", "MiB");
        printf("  %-24s %14s %12s %14.1f\n", "dense variables + slots", "", "", mib(p->dense_bytes));
        for (uint32_t e = 0; e < p->n_tables; e++) {
                const struct memplan_table *t = &p->tables[e];
                char name[64], rows[32];
                snprintf(name, sizeof(name), "table %s", cfg->model.emb[e].name);
                if (t->from == MEMPLAN_UNBOUNDED)
                        snprintf(rows, sizeof(rows), "unbounded");
                else
                        snprintf(rows, sizeof(rows), "%" PRIu64, t->rows);
                printf("  %-24s %14s %12.1f %14.1f  (%s)\n", name, rows,
                       t->rows ? (double)t->bytes / (double)t->rows : (double)t->row_bytes, mib(t->bytes),
                       memplan_rows_name(t->from));
                if (t->disk_tier) {
                        printf("  %-24s %14s %12s %14.1f\n", "  disk tier cache", "", "", mib(t->tier_memory));
                        if (t->disk_rows)
                                snprintf(rows, sizeof(rows), "%" PRIu64, t->disk_rows);
                        else
                                snprintf(rows, sizeof(rows), "unknown");
                        printf("  %-24s %14s %12.1f %14.1f  (on disk, not in the total)\n", "  on disk", rows,
                               (double)(8 + 16 + t->row_bytes), mib(t->disk_bytes));
                }
        }
        printf("  %-24s %14s %12s %14.1f\n", "buffers", "", "", mib(p->buffers));
        printf("  %-24s %14s %12s %14.1f\n", "process", "", "", mib(p->base));
        printf("  %-24s %14s %12s %14.1f%s\n", "total", "", "", mib(p->total), p->unbounded ? "+" : "");
}

static json_t *ps_json(const struct job_config *cfg, uint32_t s, const struct memplan_ps *p) {
        json_t *tables = json_array();
        for (uint32_t e = 0; e < p->n_tables; e++) {
                const struct memplan_table *t = &p->tables[e];
                json_t *o = json_pack("{s:s, s:I, s:s, s:I, s:I, s:I}", "name", cfg->model.emb[e].name,
                                      "rows", (json_int_t)t->rows, "rows_from", memplan_rows_name(t->from), "row_bytes",
                                      (json_int_t)t->row_bytes, "bytes", (json_int_t)t->bytes, "max_rows",
                                      (json_int_t)t->max_rows);
                if (o && t->disk_tier)
                        json_object_update_new(o, json_pack("{s:I, s:I, s:I}", "tier_memory", (json_int_t)t->tier_memory,
                                                            "disk_rows", (json_int_t)t->disk_rows, "disk_bytes",
                                                            (json_int_t)t->disk_bytes));
                json_array_append_new(tables, o);
        }
        return json_pack("{s:I, s:I, s:I, s:I, s:I, s:o, s:I, s:b, s:I}", "ps", (json_int_t)s, "dense_floats",
                         (json_int_t)p->dense_floats, "dense_bytes", (json_int_t)p->dense_bytes, "buffers",
                         (json_int_t)p->buffers, "process", (json_int_t)p->base, "tables", tables, "total",
                         (json_int_t)p->total, "unbounded", p->unbounded, "memory_limit_bytes",
                         (json_int_t)cfg->ps.memory_limit_bytes);
}

int cmd_plan(int argc, char **argv) {
        bool as_json = false;
        const struct cli_opt opts[] = {CLI_FLAG("json", &as_json), {NULL}};
        const struct cli_args args = {
                .cmd = "plan", .opts = opts, .help = plan_help,
                .min_operands = 1, .max_operands = 1, .usage = "Usage: psfleet plan [--json] JOB.json",
        };
        const char *path;
        struct job_config *cfg;
        struct job_layout *L = NULL;
        int r;
        if (!cli_job_file_command(&args, argc, argv, &path, &cfg, &L, &r))
                return r;
        json_t *all = json_array();
        int ret = 1;
        if (!as_json)
                printf("job %s: %u ps shard%s, memory limit %s\n", cfg->name, L->n_shards, L->n_shards == 1 ? "" : "s",
                       cfg->ps.memory_limit_bytes ? "ps.memory_limit_bytes" : "none");
        for (uint32_t s = 0; s < L->n_shards; s++) {
                struct memplan_ps p;
                char err[1024];
                if ((r = memplan_ps(cfg, L, s, &p, err, sizeof(err))) < 0) {
                        cli_error("%s: %s", path, err);
                        ret = r == -E2BIG ? CONFIG_EX_CONFIG : 1;
                        goto out;
                }
                if (as_json)
                        json_array_append_new(all, ps_json(cfg, s, &p));
                else
                        print_ps(cfg, s, &p);
        }
        if (cfg->ps.memory_limit_bytes && !as_json)
                printf("limit %.1f MiB per psd (ps.memory_limit_bytes %" PRIu64 ")\n", mib(cfg->ps.memory_limit_bytes),
                       cfg->ps.memory_limit_bytes);
        if (as_json) {
                cli_print_json(stdout, all);
                all = NULL;
        }
        ret = 0;
out:
        json_decref(all);
        job_layout_free(L);
        config_free(cfg);
        return ret;
}
