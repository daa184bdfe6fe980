/* psfleet: the command-line client. Dispatches to one function per command (cli_*.c) and holds
 * what they share: job loading, the progress display, the chief's status call, `placement`. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cli.h"
#include "job.h"
#include "model.h"
#include "placement.h"
#include "rpc.h"
#include "util.h"
#include "wire.h"

static void usage(FILE *f) {
        fprintf(f,
                "Usage: psfleet COMMAND [OPTIONS]\n"
                "\n"
                "Commands:\n"
                "  local JOB.json       run the whole job on this machine (P psd, W workerd, 1 chiefd as\n"
                "                       child processes on loopback), or in one process with --standalone\n"
                "  status               ask a job's chief how the job is doing\n"
                "  watch                follow a job's progress as it happens (a live bar on a terminal)\n"
                "  checkpoints list|save|rm STEP\n"
                "                       a job's checkpoints: list them, save one now, delete one\n"
                "  placement JOB.json   print how the job's variables are spread over its ps shards\n"
                "\n"
                "`psfleet COMMAND --help` describes each command.\n"
                "Exit status: 0 success, 1 failure, 2 bad usage, 78 bad job file.\n");
}

int cli_load_job(const char *path, struct job_config **ret) {
        char err[1024];
        if (config_load(path, ret, err, sizeof(err)) < 0) {
                fprintf(stderr, "psfleet: %s\n", err);
                return CONFIG_EX_CONFIG;
        }
        return 0;
}

/* ---- progress display ---- */

void progress_init_file(struct progress *p, FILE *f, bool quiet) {
        *p = (struct progress){.f = f, .tty = isatty(fileno(f)) == 1, .quiet = quiet};
}

void progress_init(struct progress *p, bool quiet) {
        progress_init_file(p, stderr, quiet);
}

int cli_parse_number(const char *cmd, const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *ret) {
        if (parse_u64(s, min, max, ret) >= 0)
                return 0;
        fprintf(stderr, "psfleet %s: %s \"%s\": expected %llu..%llu\n", cmd, opt, s, (unsigned long long)min,
                (unsigned long long)max);
        return CLI_EX_USAGE;
}

int cli_chief_address(const char *cmd, const char *address, const char *job, char **ret) {
        if (!address == !job) {
                fprintf(stderr, "psfleet %s: give exactly one of --address HOST:PORT and --job JOB.json\n", cmd);
                return CLI_EX_USAGE;
        }
        if (address) {
                *ret = strdup(address);
                return *ret ? 0 : 1;
        }
        struct job_config *cfg;
        char err[1024];
        int r = cli_load_job(job, &cfg);
        if (r)
                return r;
        if (config_apply_tf_config(cfg, getenv("TF_CONFIG"), NULL, NULL, err, sizeof(err)) < 0) {
                fprintf(stderr, "psfleet: %s\n", err);
                config_free(cfg);
                return CONFIG_EX_CONFIG;
        }
        *ret = strdup(cfg->cluster.chief[0].addr);
        config_free(cfg);
        return *ret ? 0 : 1;
}

const char *cli_format_duration(double s, char *buf, size_t len) {
        if (!(s >= 0) || s > 1e8) {
                snprintf(buf, len, "?");
                return buf;
        }
        unsigned long t = (unsigned long)(s + 0.5);
        if (t >= 3600)
                snprintf(buf, len, "%lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
        else
                snprintf(buf, len, "%lu:%02lu", t / 60, t % 60);
        return buf;
}

void progress_update(struct progress *p, const char *state, uint64_t step, uint64_t max_steps, double loss,
                     double examples_per_s, double eta_s) {
        progress_update_extra(p, state, step, max_steps, loss, examples_per_s, eta_s, NULL, false);
}

void progress_update_extra(struct progress *p, const char *state, uint64_t step, uint64_t max_steps, double loss,
                           double examples_per_s, double eta_s, const char *extra, bool force_line) {
        if (p->quiet)
                return;
        char eta[32], lossbuf[32], eps[32];
        cli_format_duration(eta_s, eta, sizeof(eta));
        if (isfinite(loss))
                snprintf(lossbuf, sizeof(lossbuf), "%.4f", loss);
        else
                snprintf(lossbuf, sizeof(lossbuf), "?");
        if (examples_per_s >= 0)
                snprintf(eps, sizeof(eps), "%.0f", examples_per_s);
        else
                snprintf(eps, sizeof(eps), "?");
        if (p->tty) {
                enum { WIDTH = 30 };
                char bar[WIDTH + 1];
                unsigned fill = max_steps ? (unsigned)((double)(step > max_steps ? max_steps : step) * WIDTH / max_steps)
                                          : 0;
                for (unsigned i = 0; i < WIDTH; i++)
                        bar[i] = i < fill ? '#' : '-';
                bar[WIDTH] = 0;
                fprintf(p->f, "\r\033[K%-8.8s [%s] %llu/%llu  loss %s  %s ex/s  ETA %s%s%s", state, bar,
                        (unsigned long long)step, (unsigned long long)max_steps, lossbuf, eps, eta,
                        extra ? "  " : "", extra ? extra : "");
                fflush(p->f);
                p->drawn = true;
                return;
        }
        uint64_t t = mono_us();
        if (!force_line && p->last_line_us && t - p->last_line_us < 5 * 1000000ULL)
                return;
        p->last_line_us = t;
        fprintf(p->f, "psfleet: %s: step %llu/%llu, loss %s, %s examples/s, ETA %s%s%s\n", state,
                (unsigned long long)step, (unsigned long long)max_steps, lossbuf, eps, eta, extra ? ", " : "",
                extra ? extra : "");
        fflush(p->f);
}

void progress_end(struct progress *p) {
        if (p->tty && p->drawn) {
                fputc('\n', p->f);
                fflush(p->f);
                p->drawn = false;
        }
}

/* ---- the chief's status ---- */

int cli_get_status(const char *address, uint64_t timeout_ms, Psfleet__V1__JobStatus **ret, char *err, size_t errlen) {
        struct rpc_channel *ch;
        int r = rpc_channel_new(address, "chief", &ch);
        if (r < 0) {
                snprintf(err, errlen, "cannot create a channel to \"%s\": %s", address, strerror(-r));
                return r;
        }
        Psfleet__V1__StatusRequest q = PSFLEET__V1__STATUS_REQUEST__INIT;
        ProtobufCMessage *m;
        r = rpc_call_msg(ch, "/psfleet.v1.Supervisor/GetStatus", &q.base, &psfleet__v1__job_status__descriptor,
                         timeout_ms, false, &m, err, errlen);
        rpc_channel_free(ch);
        if (r >= 0)
                *ret = (Psfleet__V1__JobStatus *)m;
        return r;
}

/* ---- placement ---- */

int cmd_placement(int argc, char **argv) {
        static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {}};
        int c;
        optind = 1;
        while ((c = getopt_long(argc, argv, "", opts, NULL)) >= 0) {
                if (c == 'h') {
                        printf("Usage: psfleet placement JOB.json\n\n"
                               "Prints where each variable of the job's model lives: one row per variable (or row\n"
                               "range of a split variable) with its shard and bytes, then the bytes per shard. Every\n"
                               "node computes the same plan from the job file (greedy by bytes; variables larger\n"
                               "than ps.split_bytes are split into row ranges).\n");
                        return 0;
                }
                return CLI_EX_USAGE;
        }
        if (argc - optind != 1) {
                fprintf(stderr, "Usage: psfleet placement JOB.json\n");
                return CLI_EX_USAGE;
        }
        struct job_config *cfg;
        int r = cli_load_job(argv[optind], &cfg);
        if (r)
                return r;
        struct backend *be = NULL;
        struct model *m = NULL;
        struct job_layout *L = NULL;
        struct placement_var *pv = NULL;
        int ret = 1;
        r = backend_cpu_new(1, &be);
        if (r >= 0)
                r = model_new(&cfg->model, be, 1, &m);
        if (r >= 0)
                r = job_layout_new(cfg, &L);
        if (r < 0) {
                fprintf(stderr, "psfleet: cannot build the model of \"%s\": %s\n", argv[optind], strerror(-r));
                goto out;
        }
        pv = calloc(L->n_vars, sizeof(*pv));
        if (!pv) {
                fprintf(stderr, "psfleet: out of memory\n");
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
        model_free(m);
        backend_free(be);
        config_free(cfg);
        return ret;
}

int main(int argc, char **argv) {
        if (argc < 2) {
                usage(stderr);
                return CLI_EX_USAGE;
        }
        const char *cmd = argv[1];
        if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
                usage(stdout);
                return 0;
        }
        if (strcmp(cmd, "--version") == 0) {
                printf("psfleet %s\n", PSFLEET_VERSION);
                return 0;
        }
        if (strcmp(cmd, "local") == 0)
                return cmd_local(argc - 1, argv + 1);
        if (strcmp(cmd, "status") == 0)
                return cmd_status(argc - 1, argv + 1);
        if (strcmp(cmd, "watch") == 0)
                return cmd_watch(argc - 1, argv + 1);
        if (strcmp(cmd, "checkpoints") == 0)
                return cmd_checkpoints(argc - 1, argv + 1);
        if (strcmp(cmd, "placement") == 0)
                return cmd_placement(argc - 1, argv + 1);
        fprintf(stderr, "psfleet: unknown command \"%s\"\n\n", cmd);
        usage(stderr);
        return CLI_EX_USAGE;
}
