/* psfleet run: what a cluster manager starts on each node. Resolves this task's role and the cluster
 * from the command line, TF_CONFIG (as Kubeflow's training-operator writes it) or a Slurm allocation
 * (as SlurmClusterResolver reads it), then execs psd, workerd or chiefd (chiefd --evaluator for an
 * evaluator task) in the foreground with the
 * resolved cluster in its TF_CONFIG; or, with --dry-run, prints what it resolved and starts nothing. */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_local.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "daemon.h"
#include "slurm.h"

#define NO_INDEX UINT64_MAX
/* The training-operator's ExitCode restart policy retries 130, 137, 143 (signals) and 138, the code it
 * keeps for "retryable, by the program's own choice" (128 + SIGUSR1); every other code is permanent. */
#define K8S_RETRYABLE 138

static void run_help(FILE *f) {
        fprintf(f,
                "Usage: psfleet run JOB.json [--job-name TYPE --task-index N | --slurm --ps N --workers M\n"
                "                    [--evaluator] [--port-base P]] [--state-dir DIR] [--listen ADDR]\n"
                "                    [--exit-codes kubernetes] [--dry-run]\n"
                "\n"
                "Runs this node's task of the job in the foreground, as Slurm (srun) or Kubernetes starts it: psd,\n"
                "workerd, chiefd or, for the evaluator, chiefd --evaluator (looked up as `psfleet local` looks\n"
                "them up), no systemd. The task and the cluster come from the first of:\n"
                "  --job-name TYPE      chief (or master), ps, worker, evaluator; with --task-index N (0 for the\n"
                "                       chief and the evaluator).\n"
                "  --task-index N       The cluster is TF_CONFIG's, else the Slurm allocation's with --slurm,\n"
                "                       else the job file's.\n"
                "  TF_CONFIG            {\"cluster\": {...}, \"task\": {\"type\": \"worker\", \"index\": 1}} as the\n"
                "                       training-operator writes it: chief or master, ps, worker, evaluator;\n"
                "                       environment; sparseCluster (checked against the job file's cluster).\n"
                "  --slurm              the Slurm step: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST,\n"
                "                       SLURM_STEP_TASKS_PER_NODE. Ranks go to chief (1), evaluator, ps, worker\n"
                "                       (sorted by name) over the nodes in the list's order; ports from --port-base\n"
                "                       plus the task's index on its node. The step's GPUs (SLURM_STEP_GPUS, else\n"
                "                       CUDA_VISIBLE_DEVICES) are shared out: CUDA_VISIBLE_DEVICES per task.\n"
                "  --ps N, --workers M  the roles' counts under --slurm (together one task each, with the chief)\n"
                "  --evaluator          one more task under --slurm, the evaluator: it evaluates each new\n"
                "                       checkpoint on the test split, and the chief skips its periodic ones\n"
                "  --port-base P        the first port on each node under --slurm (default 8888)\n"
                "  --state-dir DIR      the daemon's state directory (default /var/lib/psfleet)\n"
                "  --listen ADDR        the daemon binds here instead of its cluster entry (0.0.0.0:2222 in a\n"
                "                       pod, whose own service name may not resolve yet when it starts)\n"
                "  --exit-codes kubernetes\n"
                "                       run the daemon as a child and exit with %d (the training-operator's\n"
                "                       retryable code) where it exits 75 (a temporary failure); signals are\n"
                "                       passed on. Without it psfleet run becomes the daemon (exec).\n"
                "  --dry-run            print what was resolved as one JSON line, TF_CONFIG's shape plus \"exec\"\n"
                "                       (the daemon's argv) and \"env\" (what is set for it), and start nothing\n"
                "\n"
                "Exit status: the daemon's (docs/operations.md, \"Exit codes\"); 78 when the job file, TF_CONFIG,\n"
                "the Slurm variables or the task are wrong, before anything listens; 2 bad usage.\n",
                K8S_RETRYABLE);
}

/* The options, gathered. */
struct run_opts {
        const char *job_name, *state_dir, *listen, *exit_codes;
        uint64_t task_index, n_ps, n_workers, port_base;
        bool slurm, evaluator, dry_run;
};

/* "the roles" as SlurmClusterResolver's jobs dict. */
static int slurm_tf_config(const struct run_opts *o, bool with_task, char **tf_ret, char **gpus_ret) {
        const struct slurm_job jobs[] = {{"chief", 1}, {"ps", (uint32_t)o->n_ps}, {"worker", (uint32_t)o->n_workers},
                                         {"evaluator", o->evaluator ? 1 : 0}};
        const char *gpus = getenv("SLURM_STEP_GPUS");
        struct slurm_alloc a = {getenv("SLURM_PROCID"), getenv("SLURM_STEP_NUM_TASKS"), getenv("SLURM_STEP_NODELIST"),
                                getenv("SLURM_STEP_TASKS_PER_NODE"), gpus && *gpus ? gpus : getenv("CUDA_VISIBLE_DEVICES")};
        struct slurm_cluster *c = NULL;
        enum slurm_var var;
        char why[256];
        int r = slurm_resolve(&a, jobs, 4, (uint16_t)o->port_base, &c, &var, why, sizeof(why));
        if (r < 0) {
                const char *v = var == SLURM_VAR_PROCID ? a.procid : var == SLURM_VAR_NUM_TASKS ? a.num_tasks
                              : var == SLURM_VAR_NODELIST ? a.nodelist : var == SLURM_VAR_TASKS_PER_NODE ? a.tasks_per_node
                              : var == SLURM_VAR_GPUS ? a.gpus : NULL;
                if (var == SLURM_VAR_JOBS)
                        cli_error("the Slurm step does not fit the roles (chief 1, ps %llu, worker %llu%s): %s",
                                  (unsigned long long)o->n_ps, (unsigned long long)o->n_workers,
                                  o->evaluator ? ", evaluator 1" : "", why);
                else if (v)
                        cli_error("%s=\"%.200s\": %s", slurm_var_name(var), v, why);
                else
                        cli_error("%s: %s", slurm_var_name(var), why);
                return CONFIG_EX_CONFIG;
        }
        json_t *cluster = json_object(), *tf = json_object();
        for (size_t i = 0; i < c->n_tasks; i++) {
                json_t *list = json_object_get(cluster, c->tasks[i].job);
                if (!list)
                        json_object_set_new(cluster, c->tasks[i].job, list = json_array());
                json_array_append_new(list, json_string(c->tasks[i].addr));
        }
        json_object_set_new(tf, "cluster", cluster);
        if (with_task)
                json_object_set_new(tf, "task", json_pack("{s:s, s:I}", "type", c->tasks[c->self].job, "index",
                                                          (json_int_t)c->tasks[c->self].index));
        *tf_ret = json_dumps(tf, JSON_COMPACT | JSON_PRESERVE_ORDER);
        *gpus_ret = c->gpus ? strdup(c->gpus) : NULL;
        json_decref(tf);
        slurm_cluster_free(c);
        if (!*tf_ret) {
                cli_error("out of memory");
                return 1;
        }
        return 0;
}

static json_t *endpoints(const struct endpoint *e, uint32_t n) {
        json_t *a = json_array();
        for (uint32_t i = 0; i < n; i++)
                json_array_append_new(a, json_string(e[i].addr));
        return a;
}

/* Runs argv as a child, passing on SIGTERM, SIGINT and SIGHUP, and returns its status mapped for the
 * training-operator: 75 becomes K8S_RETRYABLE, a signal 128 + its number, the rest as they are. */
static int run_child_kubernetes(char **argv) {
        sigset_t set, old;
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGHUP);
        sigaddset(&set, SIGCHLD);
        sigprocmask(SIG_BLOCK, &set, &old);
        pid_t pid = fork();
        if (pid < 0) {
                cli_error("cannot start %s: %m", argv[0]);
                return 1;
        }
        if (pid == 0) {
                sigprocmask(SIG_SETMASK, &old, NULL);
                execv(argv[0], argv);
                fprintf(stderr, "psfleet: cannot run %s: %s\n", argv[0], strerror(errno));
                _exit(127);
        }
        for (;;) {
                int sig = 0, status;
                if (sigwait(&set, &sig) != 0)
                        continue;
                if (sig != SIGCHLD) {
                        kill(pid, sig);
                        continue;
                }
                pid_t w = waitpid(pid, &status, WNOHANG);
                if (w != pid)
                        continue;
                if (WIFSIGNALED(status))
                        return 128 + WTERMSIG(status);
                int code = WEXITSTATUS(status);
                if (code == DAEMON_EX_TEMPFAIL) {
                        cli_error("%s exited with %d (%s): exiting %d, which the training-operator retries", argv[0],
                                  code, daemon_exit_meaning(code), K8S_RETRYABLE);
                        return K8S_RETRYABLE;
                }
                return code;
        }
}

int cmd_run(int argc, char **argv) {
        struct run_opts o = {.task_index = NO_INDEX, .port_base = 8888};
        const struct cli_opt opts[] = {
                CLI_STRING("job-name", &o.job_name),
                CLI_NUMBER("task-index", &o.task_index, 0, 4095),
                CLI_FLAG("slurm", &o.slurm),
                CLI_NUMBER("ps", &o.n_ps, 1, 4095),
                CLI_NUMBER("workers", &o.n_workers, 1, 4095),
                CLI_FLAG("evaluator", &o.evaluator),
                CLI_NUMBER("port-base", &o.port_base, 1, 65535),
                CLI_STRING("state-dir", &o.state_dir),
                CLI_STRING("listen", &o.listen),
                CLI_STRING("exit-codes", &o.exit_codes),
                CLI_FLAG("dry-run", &o.dry_run),
                {NULL},
        };
        const struct cli_args args = {
                .cmd = "run", .opts = opts, .help = run_help, .min_operands = 1, .max_operands = 1,
                .usage = "Usage: psfleet run JOB.json [options] (psfleet run --help)",
        };
        int first, r;
        if (!cli_args_parse(&args, argc, argv, &first, &r))
                return r;
        if (o.slurm != (o.n_ps && o.n_workers) || (!o.slurm && (o.evaluator || o.port_base != 8888))) {
                cli_error("run: --slurm goes with --ps N and --workers M (and --evaluator, --port-base), and they with it");
                return CLI_EX_USAGE;
        }
        if (o.exit_codes && strcmp(o.exit_codes, "kubernetes") != 0) {
                cli_error("run: --exit-codes \"%s\": only kubernetes", o.exit_codes);
                return CLI_EX_USAGE;
        }
        if (o.task_index != NO_INDEX && !o.job_name) {
                cli_error("run: --task-index goes with --job-name");
                return CLI_EX_USAGE;
        }
        const char *path = argv[first];
        struct job_config *cfg = NULL;
        if ((r = cli_load_job(path, &cfg)))
                return r;

        char err[1024], *tf_text = NULL, *gpus = NULL, *out = NULL, *bin = NULL;
        json_t *res = NULL;
        struct task t = {0};
        bool have = false;
        int ret = CONFIG_EX_CONFIG;
        const char *tf_env = getenv("TF_CONFIG");
        bool from_slurm = false;

        /* the cluster (and perhaps the task): TF_CONFIG, else Slurm, else the job file's */
        if (tf_env && *tf_env) {
                tf_text = strdup(tf_env);
        } else if (o.slurm) {
                if ((r = slurm_tf_config(&o, !o.job_name, &tf_text, &gpus))) {
                        ret = r;
                        goto out;
                }
                from_slurm = true;
        }
        if (tf_text && config_apply_tf_config(cfg, tf_text, &t, &have, err, sizeof(err)) < 0) {
                /* Slurm's cluster went through TF_CONFIG's checks; say where it came from */
                const char *msg = from_slurm && strncmp(err, "TF_CONFIG: ", 11) == 0 ? err + 11 : err;
                cli_error("%s%s", from_slurm ? "the cluster from the Slurm allocation: " : "", msg);
                goto out;
        }
        /* the task: the command line's, which TF_CONFIG's must not contradict */
        if (o.job_name) {
                struct task ct;
                char idx[24];
                if (o.task_index == NO_INDEX && strcmp(o.job_name, "chief") != 0 && strcmp(o.job_name, "master") != 0 &&
                    strcmp(o.job_name, "evaluator") != 0) {
                        cli_error("--job-name %s needs --task-index N", o.job_name);
                        goto out;
                }
                snprintf(idx, sizeof(idx), "%llu", (unsigned long long)(o.task_index == NO_INDEX ? 0 : o.task_index));
                if (config_parse_task(cfg, o.job_name, idx, &ct, err, sizeof(err)) < 0) {
                        cli_error("--job-name %s --task-index %s: %s", o.job_name, idx, err);
                        goto out;
                }
                if (have && (ct.role != t.role || ct.index != t.index)) {
                        cli_error("--job-name %s --task-index %s disagrees with TF_CONFIG's task (%s %u)", o.job_name, idx,
                                  role_name(t.role), t.index);
                        goto out;
                }
                t = ct;
                have = true;
        }
        if (!have) {
                cli_error(tf_text ? "TF_CONFIG: task: missing, and no --job-name given: which task is this?"
                                  : "which task is this? Give --job-name and --task-index, set TF_CONFIG, or --slurm "
                                    "--ps N --workers M under srun");
                goto out;
        }

        /* what was resolved, in TF_CONFIG's shape: the training cluster and the evaluator given with it */
        json_t *cluster = json_object();
        json_object_set_new(cluster, "chief", endpoints(cfg->cluster.chief, cfg->cluster.n_chief));
        json_object_set_new(cluster, "ps", endpoints(cfg->cluster.ps, cfg->cluster.n_ps));
        json_object_set_new(cluster, "worker", endpoints(cfg->cluster.worker, cfg->cluster.n_worker));
        if (cfg->cluster.n_evaluator)
                json_object_set_new(cluster, "evaluator", endpoints(cfg->cluster.evaluator, cfg->cluster.n_evaluator));
        res = json_pack("{s:o, s:{s:s, s:I}}", "cluster", cluster, "task", "type", role_name(t.role), "index",
                        (json_int_t)t.index);
        char *tf_out = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);

        static const char *const daemon_of[] = {[ROLE_CHIEF] = "chiefd", [ROLE_PS] = "psd", [ROLE_WORKER] = "workerd",
                                                [ROLE_EVALUATOR] = "chiefd"};
        bin = local_find_bin(daemon_of[t.role]);
        char *real = bin ? realpath(bin, NULL) : NULL;  /* "build/services/workerd/workerd", not ".../cli/../" */
        if (real) {
                free(bin);
                bin = real;
        }
        if (!bin || !tf_out) {
                free(tf_out);
                ret = 1;
                goto out;
        }
        char index[24];
        snprintf(index, sizeof(index), "%u", t.index);
        char *dargv[11];
        int n = 0;
        dargv[n++] = bin;
        dargv[n++] = "--job";
        dargv[n++] = (char *)path;
        if (t.role == ROLE_EVALUATOR) {
                dargv[n++] = "--evaluator";     /* it exits once the job has ended */
        } else if (t.role != ROLE_CHIEF) {
                dargv[n++] = "--task-index";
                dargv[n++] = index;
        } else {
                dargv[n++] = "--exit-at-end";   /* the step or the pod ends with the job */
        }
        if (o.state_dir) {
                dargv[n++] = "--state-dir";
                dargv[n++] = (char *)o.state_dir;
        }
        if (o.listen) {
                dargv[n++] = "--listen";
                dargv[n++] = (char *)o.listen;
        }
        dargv[n] = NULL;

        if (o.dry_run) {
                json_t *ex = json_array(), *env = json_object();
                for (int i = 0; i < n; i++)
                        json_array_append_new(ex, json_string(dargv[i]));
                json_object_set_new(res, "exec", ex);
                if (tf_text)
                        json_object_set_new(env, "TF_CONFIG", json_string(tf_out));
                if (gpus)
                        json_object_set_new(env, "CUDA_VISIBLE_DEVICES", json_string(gpus));
                json_object_set_new(res, "env", env);
                out = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);
                free(tf_out);
                if (!out) {
                        ret = 1;
                        goto out;
                }
                printf("%s\n", out);
                ret = fflush(stdout) == 0 ? 0 : 1;
                goto out;
        }
        /* the daemon reads the resolved cluster and task from TF_CONFIG; the job file's own needs none */
        if ((tf_text ? setenv("TF_CONFIG", tf_out, 1) : unsetenv("TF_CONFIG")) < 0 ||
            (gpus && setenv("CUDA_VISIBLE_DEVICES", gpus, 1) < 0)) {
                cli_error("cannot set the daemon's environment: %m");
                free(tf_out);
                ret = 1;
                goto out;
        }
        free(tf_out);
        fflush(NULL);
        if (o.exit_codes) {
                ret = run_child_kubernetes(dargv);
                goto out;
        }
        execv(bin, dargv);
        cli_error("cannot run %s: %m", bin);
        ret = 1;
out:
        free(out);
        free(bin);
        free(gpus);
        free(tf_text);
        json_decref(res);
        config_free(cfg);
        return ret;
}
