/* Daemon command line, signals, exit statuses and the server's bind: see daemon.h. */
#include "daemon.h"
#include "authz.h"
#include "tls.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "job.h"
#include "log.h"
#include "metrics_http.h"
#include "optim.h"
#include "rpc.h"
#include "util.h"

static void usage(FILE *f, const char *ident, enum role role) {
        bool indexed = role == ROLE_PS || role == ROLE_WORKER;
        fprintf(f,
                "usage: %s --job FILE%s [options]\n"
                "       %s --instance JOB%s [options]\n"
                "\n"
                "  --job FILE          the job file\n"
                "%s"
                "  --instance JOB%s   the job file is $PSFLEET_CONFIG_DIR/jobs/JOB.json (default /etc/psfleet)\n"
                "  --state-dir DIR     state (default $STATE_DIRECTORY, else /var/lib/psfleet)\n"
                "  --listen ADDR       bind here instead of this task's cluster entry\n"
                "%s"
                "  --help              this text and the job file's keys\n"
                "\n"
                "TF_CONFIG, if set, supplies the cluster and this task ({\"cluster\": ..., \"task\": {\"type\": ..., \"index\": N}}).\n"
                "Exit status 78 means the job file, TF_CONFIG or the task is wrong; nothing was started.\n\n",
                ident, indexed ? " --task-index N" : "", ident, indexed ? ":N" : "",
                indexed ? "  --task-index N      this task's index in the cluster's list\n" : "",
                indexed ? ":N" : "  ",
                role == ROLE_WORKER ? "  --loss-log FILE     append \"global_step loss\" for every step\n"
                : role == ROLE_CHIEF ? "  --exit-at-end       exit once the job has ended (DONE: 0, FAILED: 65) instead of staying\n"
                                       "                      up to answer status; psfleet run passes it\n"
                : role == ROLE_PS    ? "  --backup            be the shard's other psd, cluster.ps_backup[N] (ps.replicas 2);\n"
                                       "                      --instance JOB:N:backup is the same\n"
                : role == ROLE_EVALUATOR ? "  --evaluator         be the job's evaluator (TF_CONFIG's evaluator task): evaluate each\n"
                                           "                      new checkpoint on the test split; exit when the job has ended\n"
                                     : "");
        fprintf(f, "Job file keys:\n");
        config_print_keys(f, false);
}

/* security.* for this task: mutual TLS for the server and every channel of the process, or plain TCP
 * where that is allowed — never on an address beyond loopback unless security.allow_insecure says so. */
static int daemon_security(const struct daemon_args *a, const char *ident, enum role role, char *err, size_t errlen) {
        static const enum peer_role peer_of[] = {[ROLE_CHIEF] = PEER_CHIEF, [ROLE_PS] = PEER_PS, [ROLE_WORKER] = PEER_WORKER,
                                                 [ROLE_EVALUATOR] = PEER_EVALUATOR};
        char task[AUTHZ_TASK_MAX];
        struct rpc_tls *tls;
        authz_task_name(peer_of[role], a->task.index, task, sizeof(task));
        /* A job on one host: its own CA and pairs, made by whichever daemon starts first (psfleet local
         * made them already), the admin's and the viewer's with them for psfleet's commands. */
        const char *const mine[] = {task, "admin", "viewer"};
        int r = tls_job_uses_auto(a->cfg) ? tls_auto_prepare(a->cfg, mine, ELEMENTSOF(mine), err, errlen) : 0;
        if (r < 0)
                return r;
        if ((r = tls_from_config(a->cfg, task, &tls, err, errlen)) < 0)
                return r;
        /* the evaluator serves nothing: no address of its own to check */
        if (!tls && a->listen && tls_addr_is_loopback(a->listen))
                log_warning("job %s runs WITHOUT TLS (security.mode: insecure): any process of this host can call "
                            "anything, read the model and stop the job", a->cfg->name);
        if (!tls && a->listen && !tls_addr_is_loopback(a->listen) && !a->cfg->security.allow_insecure) {
                snprintf(err, errlen, "--listen %s is beyond loopback but the job runs without TLS (security.mode); "
                         "use mtls, or set security.allow_insecure: true", a->listen);
                return -EINVAL;
        }
        /* /metrics speaks HTTPS under mutual TLS (transport/metrics_http.c); plain HTTP beyond loopback only
         * where gRPC runs plain by the operator's choice */
        const char *ml = a->cfg->metrics.listen;
        if (*ml && !tls && !tls_addr_is_loopback(ml) && !a->cfg->security.allow_insecure) {
                snprintf(err, errlen, "metrics.listen %s is beyond loopback but the job runs without TLS "
                         "(security.mode), so it would be plain HTTP; bind it to loopback (127.0.0.1:PORT), use "
                         "mtls, or set security.allow_insecure: true", ml);
                return -EINVAL;
        }
        r = rpc_secure(tls);
        if (tls)
                log_info("mutual TLS as %s of job %s%s", task, a->cfg->name,
                         tls_job_uses_auto(a->cfg) ? " (its own CA in security.auto_dir)" : "");
        rpc_tls_free(tls);
        return r;
}

int daemon_log_config(struct job_config *c, char *err, size_t errlen) {
        struct job_config defaults = {0};
        struct job_config *t = c ? c : &defaults;
        int r = c ? 0 : config_section_defaults(&defaults, "log");
        if (r < 0)
                snprintf(err, errlen, "out of memory");
        else if ((r = config_apply_env(t, "log", err, errlen)) >= 0) {
                log_set_max_level(log_level_from_string(t->log.level));
                log_set_time(t->log.time);
        }
        free(defaults.log.level);
        return r;
}

int daemon_args_parse(int argc, char **argv, const char *ident, enum role role, struct daemon_args *ret) {
        static const struct option opts[] = {
                {"job", required_argument, NULL, 'j'},
                {"instance", required_argument, NULL, 'i'},
                {"task-index", required_argument, NULL, 't'},
                {"state-dir", required_argument, NULL, 's'},
                {"listen", required_argument, NULL, 'l'},
                {"loss-log", required_argument, NULL, 'L'},
                {"exit-at-end", no_argument, NULL, 'E'},
                {"backup", no_argument, NULL, 'b'},
                {"evaluator", no_argument, NULL, 'e'},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        const char *job = NULL, *instance = NULL, *index = NULL;
        char err[1024];
        struct daemon_args a = {0};
        int c;
        /* The log's level and timestamps first, from the environment, so that a bad value stops the daemon
         * before anything else; the job file's log.* keys join them once it is loaded. */
        if (daemon_log_config(NULL, err, sizeof(err)) < 0) {
                fprintf(stderr, "%s: %s\n", ident, err);
                return CONFIG_EX_CONFIG;
        }
        optind = 1;
        while ((c = getopt_long(argc, argv, "", opts, NULL)) >= 0)
                switch (c) {
                case 'j': job = optarg; break;
                case 'i': instance = optarg; break;
                case 't': index = optarg; break;
                case 's': free(a.state_dir); a.state_dir = strdup(optarg); break;
                case 'l': free(a.listen); a.listen = strdup(optarg); break;
                case 'L':
                        if (role != ROLE_WORKER)
                                goto bad_usage;
                        free(a.loss_log);
                        a.loss_log = strdup(optarg);
                        break;
                case 'E':
                        if (role != ROLE_CHIEF)
                                goto bad_usage;
                        a.exit_at_end = true;
                        break;
                case 'b':
                        if (role != ROLE_PS)
                                goto bad_usage;
                        a.backup = true;
                        break;
                case 'e':
                        if (role != ROLE_EVALUATOR)
                                goto bad_usage;
                        break;
                case 'h':
                        usage(stdout, ident, role);
                        daemon_args_done(&a);
                        return 1;
                default:
                        goto bad_usage;
                }
        if (optind < argc || (!job == !instance)) {
                fprintf(stderr, "%s: give exactly one of --job FILE and --instance JOB%s\n", ident,
                        role == ROLE_CHIEF ? "" : ":N");
                goto bad_usage;
        }

        char *path = NULL;
        if (instance) {
                char *name;
                int64_t idx;
                bool backup = false;
                if (config_parse_instance(instance, &name, &idx, role == ROLE_PS ? &backup : NULL) < 0) {
                        fprintf(stderr, "%s: --instance \"%s\": expected JOB%s\n", ident, instance,
                                role == ROLE_CHIEF ? "" : role == ROLE_PS ? ":INDEX or JOB:INDEX:backup" : ":INDEX");
                        goto bad;
                }
                a.backup = a.backup || backup;   /* JOB:N:backup: cluster.ps_backup[N], as --backup */
                const char *dir = config_env_value("PSFLEET_CONFIG_DIR");
                path = strdup_printf("%s/jobs/%s.json", dir && *dir ? dir : "/etc/psfleet", name);
                free(name);
                if (idx >= 0) {
                        static char buf[24];
                        snprintf(buf, sizeof(buf), "%lld", (long long)idx);
                        if (index) {
                                fprintf(stderr, "%s: give the index in --instance or --task-index, not both\n", ident);
                                free(path);
                                goto bad;
                        }
                        index = buf;
                }
        } else {
                path = strdup(job);
        }
        if (config_load(path, &a.cfg, err, sizeof(err)) < 0) {
                fprintf(stderr, "%s: %s\n", ident, err);
                free(path);
                goto bad;
        }
        free(path);

        bool have_task = false;
        const char *tf = getenv("TF_CONFIG");
        if (tf && *tf) {
                if (config_apply_tf_config(a.cfg, tf, &a.task, &have_task, err, sizeof(err)) < 0) {
                        fprintf(stderr, "%s: %s\n", ident, err);
                        goto bad;
                }
                if (have_task && a.task.role != role) {
                        fprintf(stderr, "%s: TF_CONFIG: task.type: \"%s\" is not this daemon's role (%s)\n", ident,
                                role_name(a.task.role), role_name(role));
                        goto bad;
                }
                if (have_task && index) {
                        struct task t;
                        if (config_parse_task(a.cfg, role_name(role), index, &t, err, sizeof(err)) < 0) {
                                fprintf(stderr, "%s: %s\n", ident, err);
                                goto bad;
                        }
                        if (t.index != a.task.index) {
                                fprintf(stderr, "%s: --task-index %s disagrees with TF_CONFIG's task.index %u\n", ident,
                                        index, a.task.index);
                                goto bad;
                        }
                }
        }
        if (!have_task) {
                if ((role == ROLE_CHIEF || role == ROLE_EVALUATOR) && !index)
                        index = "0";
                if (!index) {
                        fprintf(stderr, "%s: --task-index N is required (or --instance JOB:N, or TF_CONFIG's task)\n", ident);
                        goto bad;
                }
                if (config_parse_task(a.cfg, role_name(role), index, &a.task, err, sizeof(err)) < 0) {
                        fprintf(stderr, "%s: %s\n", ident, err);
                        goto bad;
                }
        }
        /* This node's overrides of the rpc.* keys, then every channel of the process uses them; the
         * job's log.* keys with their overrides. */
        if (config_apply_env(a.cfg, "rpc", err, sizeof(err)) < 0 ||
            config_apply_env(a.cfg, "metrics", err, sizeof(err)) < 0 || daemon_log_config(a.cfg, err, sizeof(err)) < 0) {
                fprintf(stderr, "%s: %s\n", ident, err);
                goto bad;
        }
        rpc_configure(&a.cfg->rpc);
        a.task_name = strdup_printf("%s:%u", role_name(role), a.task.index);
        log_setup(ident, a.cfg->name, a.task_name);   /* from here on, lines under the daemon's own name */
        if (!a.state_dir) {
                const char *sd = getenv("STATE_DIRECTORY");
                /* systemd may pass several, colon-separated: the first is ours */
                a.state_dir = strdup(sd && *sd ? sd : "/var/lib/psfleet");
                char *colon = strchr(a.state_dir, ':');
                if (colon)
                        *colon = 0;
        }
        if (a.backup && a.task.index >= a.cfg->cluster.n_ps_backup) {
                fprintf(stderr, "%s: --backup: cluster.ps_backup has no entry %u (ps.replicas 2 lists one per shard)\n",
                        ident, a.task.index);
                goto bad;
        }
        if (role == ROLE_EVALUATOR) {   /* it listens nowhere, it only calls the chief: --listen is moot */
                free(a.listen);
                a.listen = NULL;
        } else if (!a.listen) {
                a.listen = strdup(a.backup ? a.cfg->cluster.ps_backup[a.task.index].addr
                                           : config_endpoint(a.cfg, a.task)->addr);
        }
        if (daemon_security(&a, ident, role, err, sizeof(err)) < 0) {
                fprintf(stderr, "%s: %s\n", ident, err);
                goto bad;
        }
        *ret = a;
        return 0;

bad_usage:
        usage(stderr, ident, role);
bad:
        daemon_args_done(&a);
        return CONFIG_EX_CONFIG;
}

/* The process's /metrics server, started with its gRPC server. */
static struct metrics_http *metrics_server;

void daemon_args_done(struct daemon_args *a) {
        metrics_server = metrics_http_free(metrics_server);
        config_free(a->cfg);
        free(a->task_name);
        free(a->state_dir);
        free(a->listen);
        free(a->loss_log);
        *a = (struct daemon_args){0};
}

/* OpenBLAS starts its thread pool in a library constructor, before main() could block any signal, so
 * a SIGTERM could land on one of its threads and kill the process. Shutting the pool down here makes
 * OpenBLAS start it again, when needed, from a thread that has them blocked. */
extern void blas_thread_shutdown_(void) __attribute__((weak));

int daemon_signals_fd(void) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGHUP);
        if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
                return -errno;
        if (blas_thread_shutdown_)
                blas_thread_shutdown_();
        int fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
        return fd < 0 ? -errno : fd;
}

int daemon_exit_code(int r) {
        if (r >= 0)
                return 0;
        switch (-r) {
        case EBADMSG:
                return DAEMON_EX_DATAERR;
        case EACCES:
        case EROFS:
        case ENOSPC:
        case EDQUOT:
        case EIO:
        case ENOTDIR:
        case EISDIR:
                return DAEMON_EX_IOERR;
        case EADDRINUSE:
        case EADDRNOTAVAIL:
        case ETIMEDOUT:
                return DAEMON_EX_TEMPFAIL;
        default:
                return DAEMON_EX_FAILURE;
        }
}

const char *daemon_exit_meaning(int status) {
        switch (status) {
        case DAEMON_EX_DATAERR: return "a data error";
        case DAEMON_EX_IOERR: return "an I/O error (its state directory, a file)";
        case DAEMON_EX_TEMPFAIL: return "a temporary failure: its address is in use, or a peer did not come in time";
        case DAEMON_EX_CONFIG: return "a configuration error";
        default: return NULL;
        }
}

int daemon_listen(const struct daemon_args *a, const struct rpc_method *methods, size_t n_methods, unsigned threads,
                  size_t max_receive, struct rpc_server **ret) {
        struct rpc_server *s = NULL;
        /* every worker with a push in flight, and the chief */
        struct rpc_server_opts o = {.max_receive = max_receive, .max_in_flight = a->cfg->cluster.n_worker + 2};
        struct job_layout *L;
        size_t largest = max_receive;
        if (job_layout_new(a->cfg, &L) >= 0) {
                /* a pull of the whole model with its optimizer slots: the chief's checkpoint */
                size_t model = L->n_params * sizeof(float) * (1 + OPTIM_MAX_SLOTS);
                largest = model > largest ? model : largest;
                job_layout_free(L);
        }
        rpc_memory_bound(largest);
        int r = rpc_server_new_opts(a->listen, methods, n_methods, threads, &o, &s);
        if (r >= 0 && (r = rpc_server_start(s)) < 0)
                s = rpc_server_free(s);
        if (r < 0)
                return log_error_errno(r, "cannot listen on %s", a->listen);
        char err[512];
        if (*a->cfg->metrics.listen && !metrics_server &&
            (r = metrics_http_start(a->cfg->metrics.listen, rpc_security(), &metrics_server, err, sizeof(err))) < 0) {
                rpc_server_free(s);
                log_error("cannot serve metrics: %s", err);
                return r;
        }
        *ret = s;
        return 0;
}
