/* psfleet local: a whole job on this machine. P psd, W workerd and one chiefd run as child processes on
 * loopback ports picked here, with one cluster in every child's TF_CONFIG (so every fingerprint agrees)
 * and a temporary state directory. The job ends with one JSON line on stdout. --standalone runs the
 * same training in this process without RPC (the reference the distributed path is held to).
 * The children and their supervision are cli_local_run.c's. */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_jobref.h"
#include "cli_local.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "rpc.h"
#include "trainer.h"
#include "tls.h"
#include "util.h"

static void local_help(FILE *f) {
        fprintf(f,
                "Usage: psfleet local JOB.json [OPTIONS]\n"
                "\n"
                "Runs the whole job on this machine: P psd, W workerd and one chiefd as child processes on\n"
                "free loopback ports, with a temporary state directory, and waits until the chief reports\n"
                "the job done. Prints one JSON line on stdout:\n"
                "  {\"global_step\": N, \"test_accuracy\": x, \"examples_per_s\": y, \"wall_s\": z,\n"
                "   \"mode\": \"distributed\", \"ps\": P, \"workers\": W,\n"
                "   \"cpu_s\": CPU seconds all the job's processes used so far}\n"
                "Progress goes to stderr: a bar on a terminal, a line every 5 s otherwise. The children's\n"
                "logs go to stderr too. Ctrl-C, SIGTERM, or a child dying with a non-zero status stops\n"
                "every child and exits non-zero.\n"
                "\n"
                "  --standalone       train in this process without RPC (the reference); \"mode\": \"standalone\"\n"
                "  --params-out FILE  --standalone: write the final variables to FILE (safetensors)\n"
                "  --ps N             run N ps shards instead of the job's count\n"
                "  --workers N        run N workers instead of the job's count\n"
                "  --max-steps N      override training.max_steps\n"
                "  --loss-log FILE    write \"global_step loss\" for every step (with several workers, worker k\n"
                "                     writes FILE.k)\n"
                "  --keep-state       keep the state directory (its path is printed)\n"
                "  --state-dir DIR    use DIR as the state directory (created if missing, never removed): a job\n"
                "                     run again with the same DIR restores from its latest checkpoint; the\n"
                "                     chief's record, checkpoints and summaries are in DIR/JOB/, the job file the\n"
                "                     children read (with this run's cluster) in DIR/job.json, psd's sockets\n"
                "                     for workers' shared memory in DIR/run/ (rpc.runtime_dir, unless\n"
                "                     PSFLEET_RUNTIME_DIR is set), and under security.mode auto the job's\n"
                "                     own CA and keys in DIR/tls/ (security.auto_dir; 0700, keys 0600)\n"
                "  --quiet            no progress display; children log warnings and errors only\n"
                "\n"
                "At the start one line on stderr says where the chief listens and the state directory is;\n"
                "while it runs, `psfleet status|watch|checkpoints|stop --job NAME` (or --job JOB.json, the file\n"
                "it was started from) find the job through its record in $XDG_RUNTIME_DIR/psfleet/local/\n"
                "(/run/psfleet/local as root), removed when it ends.\n"
                "\n"
                "The daemons are looked up in $PSFLEET_BIN_DIR when set; else next to this program in the\n"
                "build tree (<dir>/../psd/psd, ...), then in the same directory (<dir>/psd), then in PATH.\n"
                "\n"
                "Exit status: 0 done; the exit status of the daemon that failed first (65 data error, 74 I/O\n"
                "error, 75 address in use or a peer that never came, 78 bad job file; see docs/operations.md);\n"
                "75 also when the job was stopped in order before it was done (psfleet stop);\n"
                "1 another failure (a child killed, the job failed); 2 bad usage; 78 bad job file; 130/143\n"
                "interrupted by SIGINT/SIGTERM.\n");
}

/* ---- standalone ---- */

static void standalone_progress(void *ud, uint64_t step, uint64_t max_steps, double loss, double examples_per_s) {
        struct local *L = ud;
        double eta = examples_per_s > 0 ? (double)(max_steps - step) * L->cfg->training.batch_size / examples_per_s
                                        : -1;
        progress_update(&L->prog, "training", step, max_steps, loss, examples_per_s, eta);
}

static int run_standalone(struct local *L) {
        if (L->max_steps)
                L->cfg->training.max_steps = L->max_steps;
        FILE *log = NULL;
        if (L->loss_log && !(log = fopen(L->loss_log, "we"))) {
                cli_error("cannot create the loss log \"%s\": %m", L->loss_log);
                return 1;
        }
        struct trainer_result res;
        char err[1024];
        int r = trainer_standalone(L->cfg, log, L->params_out, standalone_progress, L, &res, err, sizeof(err));
        progress_end(&L->prog);
        if (log && fclose(log) != 0 && r >= 0) {
                cli_error("cannot write the loss log \"%s\": %m", L->loss_log);
                return 1;
        }
        if (r < 0) {
                cli_error("standalone training failed: %s", err);
                return 1;
        }
        char extra[96];
        local_result_extra(L->cfg->data.format != DATA_IDX && L->cfg->model.head == HEAD_LOGISTIC ? res.test_auc : -1,
                     L->cfg->data.format != DATA_IDX && L->cfg->model.head == HEAD_MSE ? res.test_rmse : -1, extra,
                     sizeof(extra));
        printf("{\"global_step\": %llu, \"test_accuracy\": %.4f,%s \"examples_per_s\": %.1f, \"wall_s\": %.3f, "
               "\"mode\": \"standalone\", \"ps\": 0, \"workers\": 1, \"cpu_s\": %.2f}\n",
               (unsigned long long)res.steps, isnan(res.test_accuracy) ? 0.0 : res.test_accuracy, extra,
               res.examples_per_s, res.wall_s, local_used_cpu_s(L));
        return 0;
}

/* ---- the command ---- */

/* Records the job for the other commands (`psfleet status --job NAME`) and says where it is. */
static void announce(struct local *L) {
        char *source = realpath(L->job_path, NULL);
        const struct cli_local_job j = {
                .name = L->cfg->name, .chief = L->kids[L->chief].addr, .job_file = L->job_copy,
                .state_dir = L->state_dir, .source = source ? source : (char *)L->job_path, .pid = (long)getpid(),
        };
        int r = cli_local_register(&j, &L->record);
        if (r == -EEXIST)
                cli_error("another `psfleet local` runs a job named %s: `--job %s` finds that one; use "
                          "--address %s for this one", j.name, j.name, j.chief);
        else if (r < 0)
                cli_error("warning: cannot record the job for `--job %s` (%s); use --address %s", j.name,
                          strerror(-r), j.chief);
        fprintf(stderr, "psfleet: job %s: chief at %s%s, state in %s%s; `psfleet status %s %s` finds it\n", j.name,
                j.chief, tls_job_uses_mtls(L->cfg) ? " (mutual TLS)" : "", L->state_dir,
                L->keep_state ? "" : " (removed at the end)", r < 0 ? "--address" : "--job", r < 0 ? j.chief : j.name);
        free(source);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        (void)st;
        (void)flag;
        (void)ftw;
        remove(path);
        return 0;
}

int cmd_local(int argc, char **argv) {
        struct local L = {.cpu_base = local_rusage_cpu_s(RUSAGE_SELF) + local_rusage_cpu_s(RUSAGE_CHILDREN)};
        const struct cli_opt opts[] = {
                CLI_FLAG("standalone", &L.standalone),
                CLI_STRING("params-out", &L.params_out),
                CLI_STRING("loss-log", &L.loss_log),
                CLI_FLAG("keep-state", &L.keep_state),
                CLI_FLAG("quiet", &L.quiet),
                CLI_NUMBER("workers", &L.n_workers, 1, MAX_TASKS),
                CLI_NUMBER("ps", &L.n_ps, 1, MAX_TASKS),
                CLI_NUMBER("max-steps", &L.max_steps, 1, 1000000000000ULL),
                CLI_STRING("state-dir", &L.state_dir_opt),
                {},
        };
        const struct cli_args args = {
                .cmd = "local", .opts = opts, .help = local_help, .min_operands = 1, .max_operands = 1,
                .usage = "Usage: psfleet local JOB.json [OPTIONS]  (psfleet local --help)",
        };
        int first, r;
        if (!cli_args_parse(&args, argc, argv, &first, &r))
                return r;
        L.job_path = argv[first];
        if ((r = cli_load_job(L.job_path, &L.cfg)))
                return r;
        /* the operator's own calls (health checks, status, stop) as admin under mutual TLS; a job on
         * loopback gets its credentials with its state directory, below */
        if (!tls_job_uses_auto(L.cfg) && (r = cli_secure(L.cfg, "admin"))) {
                config_free(L.cfg);
                return r;
        }
        progress_init(&L.prog, L.quiet);
        if ((r = local_signals_setup()) < 0) {
                cli_error("cannot set up signal handling: %s", strerror(-r));
                config_free(L.cfg);
                return 1;
        }
        if (L.standalone) {
                r = run_standalone(&L);
                config_free(L.cfg);
                return r;
        }

        int ret = 1;
        static const char *const names[3] = {"psd", "workerd", "chiefd"};
        for (int i = 0; i < 3; i++)
                if (!(L.bins[i] = local_find_bin(names[i])))
                        goto out;
        if (L.state_dir_opt) {
                /* The user's: kept, and reused by the next run (which then restores from it). */
                L.keep_state = true;
                r = mkdir_p(L.state_dir_opt, 0750);
                L.state_dir = r >= 0 ? realpath(L.state_dir_opt, NULL) : NULL;
                if (!L.state_dir) {
                        cli_error("cannot use \"%s\" as the state directory: %s", L.state_dir_opt,
                                strerror(r < 0 ? -r : errno));
                        goto out;
                }
        } else {
                const char *tmp = getenv("TMPDIR");
                L.state_dir = strdup_printf("%s/psfleet-local-XXXXXX", tmp && *tmp ? tmp : "/tmp");
                if (!L.state_dir || !mkdtemp(L.state_dir)) {
                        cli_error("cannot create a state directory: %m");
                        free(L.state_dir);
                        L.state_dir = NULL;
                        goto out;
                }
        }
        if (!(L.runtime_env = strdup_printf("PSFLEET_RUNTIME_DIR=%s/run", L.state_dir))) {
                cli_error("out of memory");
                goto out;
        }
        if ((ret = local_build_children(&L)) != 0 || (ret = local_auto_tls(&L)) != 0)
                goto out;
        announce(&L);
        /* gRPC's threads start here, after every allocation the children need was made. */
        rpc_global_init();
        L.rpc_up = true;
        ret = local_supervise(&L);
out:
        cli_local_unregister(L.record);
        local_free_children(&L);
        if (L.state_dir) {
                if (L.keep_state)
                        fprintf(stderr, "psfleet: state kept in %s\n", L.state_dir);
                else
                        nftw(L.state_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        }
        free(L.state_dir);
        free(L.runtime_env);
        free(L.job_copy);
        for (int i = 0; i < 3; i++)
                free(L.bins[i]);
        config_free(L.cfg);
        if (L.rpc_up)
                rpc_global_shutdown();
        return ret;
}
