/* psfleet local's distributed run: finding the daemons, their ports, job copy and environment, starting
 * them as children on loopback, waiting until each is healthy, following the chief to the end and
 * stopping them all in order.
 *
 * Signals reach us through a self-pipe written by the handlers: any thread may run a handler (OpenBLAS
 * starts threads before main() that we cannot give a signal mask), and a pipe does not care which. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "authz.h"
#include "cli_chief.h"
#include "cli_jobref.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "daemon.h"
#include "job.h"
#include "rpc.h"
#include "trainer.h"
#include "tls.h"
#include "util.h"
#include "wire.h"
#include "grpc/health/v1/health.pb-c.h"

extern char **environ;

#include "cli_local.h"

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
        int saved = errno;
        unsigned char b = (unsigned char)sig;
        if (write(sig_pipe[1], &b, 1) < 0) {
                /* full pipe: a byte is already waiting, which is enough */
        }
        errno = saved;
}

int local_signals_setup(void) {
        if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
                return -errno;
        struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGCHLD, &sa, NULL) < 0)
                return -errno;
        /* A closed stdout (| head) must not kill us before the children are stopped and the state
         * directory is removed: the write fails with EPIPE instead. */
        signal(SIGPIPE, SIG_IGN);
        return 0;
}

/* Waits up to timeout_ms for a signal. Returns SIGINT or SIGTERM when one came, else 0 (SIGCHLD or
 * nothing: the caller reaps either way). */
static int wait_signal(int timeout_ms) {
        struct pollfd p = {.fd = sig_pipe[0], .events = POLLIN};
        if (poll(&p, 1, timeout_ms) <= 0)
                return 0;
        unsigned char buf[64];
        int stop = 0;
        ssize_t n;
        while ((n = read(sig_pipe[0], buf, sizeof(buf))) > 0)
                for (ssize_t i = 0; i < n; i++)
                        if (buf[i] == SIGINT || buf[i] == SIGTERM)
                                stop = stop ? stop : buf[i];
        return stop;
}

/* ---- finding the daemons ---- */

static bool executable(const char *p) {
        struct stat st;
        return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

/* Returns a malloc'd path, or NULL after printing where it looked. */
char *local_find_bin(const char *name) {
        const char *env = config_env_value("PSFLEET_BIN_DIR");
        if (env && *env) {
                char *p = strdup_printf("%s/%s", env, name);
                if (p && executable(p))
                        return p;
                fprintf(stderr, "psfleet: %s not found in PSFLEET_BIN_DIR=\"%s\"\n", name, env);
                free(p);
                return NULL;
        }
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n > 0) {
                exe[n] = 0;
                char *slash = strrchr(exe, '/');
                if (slash)
                        *slash = 0;
                char *cand[2] = {strdup_printf("%s/../%s/%s", exe, name, name), strdup_printf("%s/%s", exe, name)};
                char *found = NULL;
                for (int i = 0; i < 2; i++) {
                        if (!found && cand[i] && executable(cand[i]))
                                found = cand[i];
                        else
                                free(cand[i]);
                }
                if (found)
                        return found;
        }
        const char *path = getenv("PATH");
        if (path) {
                char *dup = strdup(path), *save = NULL;
                for (char *d = dup ? strtok_r(dup, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save)) {
                        char *p = strdup_printf("%s/%s", *d ? d : ".", name);
                        if (p && executable(p)) {
                                free(dup);
                                return p;
                        }
                        free(p);
                }
                free(dup);
        }
        fprintf(stderr, "psfleet: cannot find %s: not next to psfleet (build tree or install directory) nor in PATH; "
                        "set PSFLEET_BIN_DIR\n", name);
        return NULL;
}

/* ---- set-up ---- */

/* Free loopback ports: bound all at once so they differ, then released for the children. */
static int pick_ports(uint16_t *ports, uint32_t n) {
        int *fds = calloc(n, sizeof(int));
        int r = 0;
        if (!fds)
                return -ENOMEM;
        for (uint32_t i = 0; i < n; i++)
                fds[i] = -1;
        for (uint32_t i = 0; i < n && r == 0; i++) {
                struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
                socklen_t len = sizeof(a);
                fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof(a)) < 0 ||
                    getsockname(fds[i], (struct sockaddr *)&a, &len) < 0)
                        r = -errno;
                else
                        ports[i] = ntohs(a.sin_port);
        }
        for (uint32_t i = 0; i < n; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        free(fds);
        return r;
}

static json_t *addr_list(const struct child *k, uint32_t first, uint32_t n) {
        json_t *a = json_array();
        for (uint32_t i = 0; i < n; i++)
                json_array_append_new(a, json_string(k[first + i].addr));
        return a;
}

/* The job file as the children read it: the user's file with our cluster, the job's name made explicit
 * (the copy's file name would otherwise name the job) and --max-steps applied. */
static int write_job_copy(struct local *L, json_t *cluster) {
        json_error_t je;
        json_t *root = json_load_file(L->job_path, 0, &je);
        if (!root || !json_is_object(root)) {
                cli_error("%s: cannot re-read the job file: %s", L->job_path, je.text);
                json_decref(root);
                return 1;
        }
        json_object_set_new(root, "job", json_string(L->cfg->name));
        /* a job on loopback keeps its own CA and keys with its other state (security.auto_dir) */
        json_t *sec = json_object_get(root, "security");
        if (!json_is_object(sec)) {
                sec = json_object();
                json_object_set_new(root, "security", sec);
        }
        char *auto_dir = strdup_printf("%s/tls", L->state_dir);
        if (!auto_dir) {
                json_decref(root);
                cli_error("out of memory");
                return 1;
        }
        json_object_set_new(sec, "auto_dir", json_string(auto_dir));
        free(auto_dir);
        json_object_set(root, "cluster", cluster);
        /* model.onnx is relative to the job file, which the copy is not beside */
        json_t *model = json_object_get(root, "model");
        char *onnx = L->cfg->model.onnx_path ? realpath(L->cfg->model.onnx_path, NULL) : NULL;
        if (onnx && json_is_object(model))
                json_object_set_new(model, "onnx", json_string(onnx));
        free(onnx);
        if (L->max_steps) {
                json_t *t = json_object_get(root, "training");
                if (!json_is_object(t)) {
                        t = json_object();
                        json_object_set_new(root, "training", t);
                }
                json_object_set_new(t, "max_steps", json_integer((json_int_t)L->max_steps));
        }
        L->job_copy = strdup_printf("%s/job.json", L->state_dir);
        int r = L->job_copy ? json_dump_file(root, L->job_copy, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : -1;
        json_decref(root);
        if (r < 0) {
                cli_error("cannot write \"%s\"", L->job_copy ? L->job_copy : "job copy");
                return 1;
        }
        /* The children will load this copy; load it here too so that an override out of range is
         * reported once, by us, and so that what we show matches what they run. */
        config_free(L->cfg);
        L->cfg = NULL;
        return cli_load_job(L->job_copy, &L->cfg);
}

/* A job on loopback under security.mode auto: its own CA and every task's pair (and the admin's and the
 * viewer's, for psfleet's commands) in the state directory, made before any daemon starts, so that they
 * find them rather than race to make them; then our own calls as admin. */
int local_auto_tls(struct local *L) {
        if (!tls_job_uses_auto(L->cfg))
                return 0;       /* cmd_local made its calls secure already */
        {
                const char **tasks = calloc(L->n_kids + 2, sizeof(char *));
                char (*names)[AUTHZ_TASK_MAX] = calloc(L->n_kids, sizeof(*names));
                char err[2048];
                int r = tasks && names ? 0 : -ENOMEM;
                for (uint32_t i = 0; r == 0 && i < L->n_kids; i++) {
                        const char *t = L->kids[i].task, *colon = strchr(t, ':');
                        if (i == L->chief)
                                snprintf(names[i], sizeof(names[i]), "chief");
                        else
                                snprintf(names[i], sizeof(names[i]), "%.*s-%s", (int)(colon - t), t, colon + 1);
                        tasks[i] = names[i];
                }
                tasks[L->n_kids] = "admin";
                tasks[L->n_kids + 1] = "viewer";
                if (r == 0)
                        r = tls_auto_prepare(L->cfg, tasks, L->n_kids + 2, err, sizeof(err));
                else
                        snprintf(err, sizeof(err), "out of memory");
                free(tasks);
                free(names);
                if (r < 0) {
                        cli_error("%s", err);
                        return r == -EINVAL ? CONFIG_EX_CONFIG : 1;
                }
        }
        return cli_secure(L->cfg, "admin");
}

/* The environment of a child, built before fork (no allocation between fork and exec). Its
 * rpc.runtime_dir (psd's attach sockets) is runtime_env's directory in our state directory, not the
 * job's: that names the system's /run/psfleet, which the units make and a user usually cannot write,
 * and every daemon on this run is ours. A PSFLEET_RUNTIME_DIR of our own environment wins. */
static char **child_env(const char *tf_config, bool quiet, char *runtime_env) {
        size_t n = 0;
        while (environ[n])
                n++;
        char **e = calloc(n + 5, sizeof(char *));
        if (!e)
                return NULL;
        size_t k = 0;
        bool have_blas = false, have_level = false, have_runtime = false;
        for (size_t i = 0; i < n; i++) {
                if (strncmp(environ[i], "TF_CONFIG=", 10) == 0 || strncmp(environ[i], "NOTIFY_SOCKET=", 14) == 0)
                        continue;
                have_blas |= strncmp(environ[i], "OPENBLAS_NUM_THREADS=", 21) == 0;
                have_level |= strncmp(environ[i], "PSFLEET_LOG_LEVEL=", 18) == 0;
                have_runtime |= strncmp(environ[i], "PSFLEET_RUNTIME_DIR=", 20) == 0;
                e[k++] = environ[i];
        }
        e[k++] = (char *)tf_config;
        if (!have_runtime)
                e[k++] = runtime_env;
        /* OpenBLAS starts its thread pool in a library constructor, before main() can block signals, and
         * that thread would then take SIGTERM with the default action. With one thread at load time the
         * pool is created later (openblas_set_num_threads) and inherits the daemon's mask. */
        if (!have_blas)
                e[k++] = (char *)"OPENBLAS_NUM_THREADS=1";
        if (quiet && !have_level)
                e[k++] = (char *)"PSFLEET_LOG_LEVEL=warning";
        e[k] = NULL;
        return e;
}

int local_build_children(struct local *L) {
        uint32_t P = L->n_ps ? (uint32_t)L->n_ps : L->cfg->cluster.n_ps;
        uint32_t W = L->n_workers ? (uint32_t)L->n_workers : L->cfg->cluster.n_worker;
        L->n_kids = P + 1 + W;
        L->chief = P;
        L->kids = calloc(L->n_kids, sizeof(*L->kids));
        uint16_t *ports = calloc(L->n_kids, sizeof(uint16_t));
        if (!L->kids || !ports) {
                free(ports);
                cli_error("out of memory");
                return 1;
        }
        int r = pick_ports(ports, L->n_kids);
        if (r < 0) {
                free(ports);
                cli_error("cannot find free loopback ports: %s", strerror(-r));
                return 1;
        }
        for (uint32_t i = 0; i < L->n_kids; i++) {
                struct child *k = &L->kids[i];
                if (i < P)
                        snprintf(k->task, sizeof(k->task), "ps:%u", i);
                else if (i == P)
                        snprintf(k->task, sizeof(k->task), "chief:0");
                else
                        snprintf(k->task, sizeof(k->task), "worker:%u", i - P - 1);
                snprintf(k->addr, sizeof(k->addr), "127.0.0.1:%u", ports[i]);
        }
        free(ports);

        json_t *cluster = json_object();
        json_object_set_new(cluster, "chief", addr_list(L->kids, P, 1));
        json_object_set_new(cluster, "ps", addr_list(L->kids, 0, P));
        json_object_set_new(cluster, "worker", addr_list(L->kids, P + 1, W));
        r = write_job_copy(L, cluster);
        if (r) {
                json_decref(cluster);
                return r;
        }

        for (uint32_t i = 0; i < L->n_kids; i++) {
                struct child *k = &L->kids[i];
                const char *role = i < P ? "ps" : i == P ? "chief" : "worker";
                uint32_t index = i < P ? i : i == P ? 0 : i - P - 1;
                json_t *tf = json_pack("{s:O, s:{s:s, s:i}}", "cluster", cluster, "task", "type", role, "index",
                                       (int)index);
                char *text = tf ? json_dumps(tf, JSON_COMPACT) : NULL;
                json_decref(tf);
                k->tf_config = text ? strdup_printf("TF_CONFIG=%s", text) : NULL;
                free(text);
                k->envp = k->tf_config ? child_env(k->tf_config, L->quiet, L->runtime_env) : NULL;
                if (!k->envp) {
                        json_decref(cluster);
                        cli_error("out of memory");
                        return 1;
                }
                k->bin = L->bins[i < P ? 0 : i == P ? 2 : 1];
                int a = 0;
                k->argv[a++] = (char *)(i < P ? "psd" : i == P ? "chiefd" : "workerd");
                k->argv[a++] = (char *)"--job";
                k->argv[a++] = L->job_copy;
                k->argv[a++] = (char *)"--state-dir";
                k->argv[a++] = L->state_dir;
                if (i != P) {
                        char *idx = strdup_printf("%u", index);
                        k->argv[a++] = (char *)"--task-index";
                        k->argv[a++] = idx;
                }
                if (i > P && L->loss_log) {
                        char *path = W == 1 ? strdup(L->loss_log) : strdup_printf("%s.%u", L->loss_log, index);
                        /* fresh, like --standalone's: a rerun must not append to an old log */
                        int fd = path ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
                        if (fd < 0) {
                                cli_error("cannot create the loss log \"%s\": %m",
                                        path ? path : L->loss_log);
                                free(path);
                                json_decref(cluster);
                                return 1;
                        }
                        close(fd);
                        k->argv[a++] = (char *)"--loss-log";
                        k->argv[a++] = path;
                }
                k->argv[a] = NULL;
        }
        json_decref(cluster);
        return 0;
}

void local_free_children(struct local *L) {
        for (uint32_t i = 0; L->kids && i < L->n_kids; i++) {
                struct child *k = &L->kids[i];
                rpc_channel_free(k->ch);
                free(k->envp);
                free(k->tf_config);
                /* argv entries after --task-index / --loss-log were allocated here (decided before an
                 * entry is freed: the next one's test must not read it) */
                bool owned = false;
                for (int a = 0; k->argv[a]; a++) {
                        bool next = strcmp(k->argv[a], "--task-index") == 0 || strcmp(k->argv[a], "--loss-log") == 0;
                        if (owned)
                                free(k->argv[a]);
                        owned = next;
                }
        }
        free(L->kids);
        L->kids = NULL;
}

/* ---- CPU used so far: the JSON line's cpu_s ---- */

double local_rusage_cpu_s(int who) {
        struct rusage ru;
        if (getrusage(who, &ru) < 0)
                return 0;
        return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
               ru.ru_stime.tv_usec * 1e-6;
}

/* Ours and our reaped children's CPU, less what the process had before this command: rusage survives
 * exec, so a shell that built the project and then exec'd us (run-demo.sh) would count the build. */
double local_used_cpu_s(const struct local *L) {
        return local_rusage_cpu_s(RUSAGE_SELF) + local_rusage_cpu_s(RUSAGE_CHILDREN) - L->cpu_base;
}

/* utime + stime of a running child, all its threads, from /proc/PID/stat (fields 14 and 15). */
static double proc_cpu_s(pid_t pid) {
        char buf[1024];
        const char *p = cli_proc_stat((long)pid, buf, sizeof(buf));
        unsigned long long ut = 0, st = 0;
        if (!p || sscanf(p, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
                return 0;
        return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* ---- children ---- */

static int spawn(struct child *k) {
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                /* Dies with us, even on SIGKILL. If we died before prctl, the parent is already gone. */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                        _exit(127);
                signal(SIGINT, SIG_DFL);
                signal(SIGTERM, SIG_DFL);
                signal(SIGCHLD, SIG_DFL);
                signal(SIGPIPE, SIG_DFL);  /* SIG_IGN would survive execve */
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                /* stdout is for our one JSON line */
                dup2(STDERR_FILENO, STDOUT_FILENO);
                execve(k->bin, k->argv, k->envp);
                static const char msg[] = "psfleet: exec of a daemon failed\n";
                if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {
                        /* nothing left to tell */
                }
                _exit(127);
        }
        k->pid = pid;
        return 0;
}

static void describe_status(int status, char *buf, size_t len) {
        const char *why = WIFEXITED(status) ? daemon_exit_meaning(WEXITSTATUS(status)) : NULL;
        if (WIFEXITED(status))
                snprintf(buf, len, "exited with status %d%s%s", WEXITSTATUS(status), why ? ": " : "", why ? why : "");
        else if (WIFSIGNALED(status))
                snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
        else
                snprintf(buf, len, "ended with wait status 0x%x", status);
}

/* Reaps every child that has ended. Returns the index of the first one that ended badly (non-zero
 * status or a signal) in this pass, else -1. */
static int reap(struct local *L) {
        int bad = -1;
        for (;;) {
                int status;
                pid_t pid = waitpid(-1, &status, WNOHANG);
                if (pid <= 0)
                        break;
                for (uint32_t i = 0; i < L->n_kids; i++)
                        if (L->kids[i].pid == pid) {
                                L->kids[i].pid = 0;
                                L->kids[i].status = status;
                                if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && bad < 0)
                                        bad = (int)i;
                        }
        }
        return bad;
}

static uint32_t alive(const struct local *L) {
        uint32_t n = 0;
        for (uint32_t i = 0; i < L->n_kids; i++)
                n += L->kids[i].pid > 0;
        return n;
}

/* Waits until every child has ended or timeout_us passed. */
static void wait_children(struct local *L, uint64_t timeout_us) {
        uint64_t end = mono_us() + timeout_us;
        while (alive(L) && mono_us() < end) {
                reap(L);
                if (alive(L))
                        wait_signal(50);
        }
        reap(L);
}

/* SIGTERM to every child, SIGKILL after TERM_US, every one reaped. */
static void stop_all(struct local *L) {
        for (uint32_t i = 0; i < L->n_kids; i++)
                if (L->kids[i].pid > 0)
                        kill(L->kids[i].pid, SIGTERM);
        wait_children(L, TERM_US);
        for (uint32_t i = 0; i < L->n_kids; i++)
                if (L->kids[i].pid > 0) {
                        cli_error("%s (pid %d) did not stop within %llu s of SIGTERM: killing it",
                                L->kids[i].task, (int)L->kids[i].pid, TERM_US / 1000000);
                        kill(L->kids[i].pid, SIGKILL);
                }
        while (alive(L)) {
                reap(L);
                if (alive(L))
                        wait_signal(20);
        }
}

static bool health_ok(struct child *k) {
        if (!k->ch && rpc_channel_new(k->addr, k->task, &k->ch) < 0)
                return false;
        Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        ProtobufCMessage *m;
        if (rpc_call_msg(k->ch, RPC_HEALTH_CHECK, &q.base, &grpc__health__v1__health_check_response__descriptor, 300,
                         false, &m, NULL, 0) < 0) {
                /* A channel that failed to connect may keep failing fast for a while (reconnect
                 * backoff): the next check starts with a fresh one. */
                k->ch = rpc_channel_free(k->ch);
                return false;
        }
        bool ok = ((Grpc__Health__V1__HealthCheckResponse *)m)->status ==
                  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
        protobuf_c_message_free_unpacked(m, NULL);
        return ok;
}

/* The job has ended: chiefd stays up to say so until told to stop, so it gets SIGTERM and is waited
 * for (SIGKILL after TERM_US). */
static void stop_chief(struct local *L) {
        struct child *k = &L->kids[L->chief];
        if (k->pid <= 0)
                return;
        kill(k->pid, SIGTERM);
        uint64_t end = mono_us() + TERM_US;
        while (k->pid > 0 && mono_us() < end) {
                reap(L);
                if (k->pid > 0)
                        wait_signal(50);
        }
        if (k->pid > 0) {
                cli_error("%s (pid %d) did not stop within %llu s of SIGTERM: killing it", k->task, (int)k->pid,
                          TERM_US / 1000000);
                kill(k->pid, SIGKILL);
        }
}

/* The result line's metrics of a model with embeddings: test_auc (logistic head), test_rmse (mse
 * head); nothing for the others (a value below 0). */
void local_result_extra(double auc, double rmse, char *buf, size_t len) {
        buf[0] = 0;
        if (auc >= 0)
                snprintf(buf, len, " \"test_auc\": %.4f,", auc);
        else if (rmse >= 0)
                snprintf(buf, len, " \"test_rmse\": %.4f,", rmse);
}

/* Runs the children until the chief says DONE. Returns the exit status. */
int local_supervise(struct local *L) {
        char buf[128], err[1024];
        for (uint32_t i = 0; i < L->n_kids; i++) {
                int r = spawn(&L->kids[i]);
                if (r < 0) {
                        cli_error("cannot start %s: %s", L->kids[i].task, strerror(-r));
                        stop_all(L);
                        return 1;
                }
        }
        uint64_t start = mono_us(), last_ok = 0;
        bool all_ready = false;
        Psfleet__V1__JobStatus *done = NULL;
        struct child *chief = &L->kids[L->chief];

        while (!done) {
                int sig = wait_signal(all_ready ? 500 : 100);
                if (sig) {
                        progress_end(&L->prog);
                        cli_error("%s: stopping %u processes", strsignal(sig), alive(L));
                        stop_all(L);
                        return 128 + sig;
                }
                int bad = reap(L);
                if (bad < 0 && chief->pid == 0 && WIFEXITED(chief->status) && WEXITSTATUS(chief->status) == 0) {
                        /* stopped in order from outside (SIGTERM, psfleet stop): STOPPED after a final
                         * checkpoint; not done, and not a failure either */
                        progress_end(&L->prog);
                        cli_error("%s stopped the job in order before it was done (STOPPED: a start resumes "
                                  "from its final checkpoint); stopping the others", chief->task);
                        stop_all(L);
                        return DAEMON_EX_TEMPFAIL;
                }
                if (bad >= 0 || chief->pid == 0) {
                        struct child *k = bad >= 0 ? &L->kids[bad] : chief;
                        progress_end(&L->prog);
                        describe_status(k->status, buf, sizeof(buf));
                        cli_error("%s %s%s; stopping the others (its log above says why)", k->task, buf,
                                bad < 0 ? " before the job was done" : "");
                        stop_all(L);
                        /* the first failure's own status, so that a data or config error reads as one */
                        return WIFEXITED(k->status) && WEXITSTATUS(k->status) != 0 ? WEXITSTATUS(k->status) : 1;
                }
                if (!all_ready) {
                        all_ready = true;
                        for (uint32_t i = 0; i < L->n_kids; i++) {
                                struct child *k = &L->kids[i];
                                /* a worker that already finished (exit 0) counts as ready */
                                if (!k->ready && k->pid > 0)
                                        k->ready = health_ok(k);
                                all_ready &= k->ready || k->pid == 0;
                        }
                        if (!all_ready && mono_us() - start > READY_TIMEOUT_US) {
                                for (uint32_t i = 0; i < L->n_kids; i++)
                                        if (!L->kids[i].ready && L->kids[i].pid > 0) {
                                                cli_error("%s (%s) did not answer its health check within "
                                                          "%llu s; stopping everything",
                                                        L->kids[i].task, L->kids[i].addr, READY_TIMEOUT_US / 1000000);
                                                break;
                                        }
                                stop_all(L);
                                return 1;
                        }
                        if (!all_ready)
                                continue;
                        last_ok = mono_us();
                }
                Psfleet__V1__JobStatus *s = NULL;
                if (cli_get_status(chief->addr, 2000, &s, err, sizeof(err)) < 0) {
                        if (mono_us() - last_ok > STATUS_FAIL_US) {
                                progress_end(&L->prog);
                                cli_error("the chief has not answered for %llu s: %s",
                                        STATUS_FAIL_US / 1000000, err);
                                stop_all(L);
                                return 1;
                        }
                        continue;
                }
                last_ok = mono_us();
                if (s->state == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED) {
                        progress_end(&L->prog);
                        cli_error("the job failed: %s", s->reason ? s->reason : "");
                        psfleet__v1__job_status__free_unpacked(s, NULL);
                        stop_all(L);
                        return 1;
                }
                const char *st = job_state_name(s->state);
                if (s->state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE)
                        st = "done";
                progress_update(&L->prog, st, s->global_step, s->max_steps, s->loss,
                                s->state >= PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING ? s->examples_per_s : -1,
                                s->eta_s);
                if (s->state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE)
                        done = s;
                else
                        psfleet__v1__job_status__free_unpacked(s, NULL);
        }
        progress_end(&L->prog);
        /* ours, the children already reaped, and those still running */
        double cpu = local_used_cpu_s(L);
        for (uint32_t i = 0; i < L->n_kids; i++)
                if (L->kids[i].pid > 0)
                        cpu += proc_cpu_s(L->kids[i].pid);
        char extra[96];
        local_result_extra(done->test_auc, done->test_rmse, extra, sizeof(extra));
        printf("{\"global_step\": %llu, \"test_accuracy\": %.4f,%s \"examples_per_s\": %.1f, \"wall_s\": %.3f, "
               "\"mode\": \"distributed\", \"ps\": %u, \"workers\": %u, \"cpu_s\": %.2f}\n",
               (unsigned long long)done->global_step, done->test_accuracy, extra, done->examples_per_s, done->wall_s,
               L->chief, L->n_kids - L->chief - 1, cpu);
        fflush(stdout);
        psfleet__v1__job_status__free_unpacked(done, NULL);

        stop_chief(L);
        wait_children(L, GRACE_US);
        for (uint32_t i = 0; i < L->n_kids; i++) {
                const struct child *k = &L->kids[i];
                if (k->pid == 0 && !(WIFEXITED(k->status) && WEXITSTATUS(k->status) == 0)) {
                        describe_status(k->status, buf, sizeof(buf));
                        cli_error("warning: %s %s after the job was done", k->task, buf);
                }
        }
        stop_all(L);
        return 0;
}
