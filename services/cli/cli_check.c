/* psfleet check: a job file's pre-flight, without starting anything. Every problem is listed (the
 * config, each endpoint, the data, the certificates), not just the first, so that one run tells the
 * operator everything to fix before the job starts. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli_json.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "data.h"
#include "graph.h"
#include "grpc/health/v1/health.pb-c.h"
#include "job.h"
#include "memplan.h"
#include "psfleet/v1/ps.pb-c.h"
#include "psfleet/v1/supervisor.pb-c.h"
#include "rpc.h"
#include "tls.h"
#include "trainer.h"
#include "util.h"
#include "wire.h"
#include "x509.h"

#define EXPIRY_WARN_DAYS 30

static void check_help(FILE *f) {
        fprintf(f, "Usage: psfleet check [--json] [--timeout MS] [--identity NAME] JOB.json\n"
                   "\n"
                   "Checks a job before it starts, and starts nothing: the job file (TF_CONFIG's cluster\n"
                   "when set), that no two endpoints are one socket, that every endpoint resolves and is\n"
                   "either free on this host or answered by a psfleet daemon of the right role and of the\n"
                   "same job, that the data files are readable and fit the model's input and classes, and\n"
                   "under mutual TLS the certificates. Every problem is listed, one line each.\n"
                   "\n"
                   "  --json           one JSON object: what was checked, and the problems\n"
                   "  --timeout MS     how long an endpoint may take to answer (default 2000)\n"
                   CLI_IDENTITY_HELP
                   "\n"
                   "Errors: what would stop the job or a task (a port taken by another program, a daemon\n"
                   "of another role or job, a host that does not resolve or cannot be reached, data that\n"
                   "do not fit, a missing or invalid certificate). Warnings: a remote endpoint that\n"
                   "refuses connections (its daemon is not started yet), a certificate ending within %d\n"
                   "days, what cannot be checked from this host.\n"
                   "Exit status: 0 no errors (warnings allowed), 2 bad usage, 78 errors found.\n",
                EXPIRY_WARN_DAYS);
}

struct check {
        const struct job_config *cfg;
        uint64_t timeout_ms;
        bool json, talk;        /* talk: our credentials allow gRPC calls to the job's daemons */
        unsigned errors, warnings;
        json_t *problems, *checked;
};

/* One problem: `thing` names what is wrong ("ps:0 127.0.0.1:7001", "data", "certs admin"). */
static void __attribute__((format(printf, 4, 5)))
problem(struct check *c, bool error, const char *thing, const char *fmt, ...) {
        char msg[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        *(error ? &c->errors : &c->warnings) += 1;
        if (c->json)
                json_array_append_new(c->problems, json_pack("{s:s, s:s, s:s}", "severity", error ? "error" : "warning",
                                                             "thing", thing, "message", msg));
        else
                printf("%-7s %s: %s\n", error ? "error" : "warning", thing, msg);
}

/* What was checked and how it came out, for the summary. */
static void __attribute__((format(printf, 3, 4))) checked(struct check *c, const char *what, const char *fmt, ...) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        json_array_append_new(c->checked, json_pack("{s:s, s:s}", "check", what, "result", msg));
}

/* ---- endpoints ---- */

struct ep {
        const struct endpoint *e;
        enum role role;
        uint32_t index;
        char label[300];        /* "ps:0 127.0.0.1:7001" */
        char name[32];          /* "ps:0", the channel's name (under TLS: the certificate it must carry) */
        struct addrinfo *ai;    /* NULL: does not resolve */
};

static const char *const role_service[] = {
        [ROLE_CHIEF] = "psfleet.v1.Supervisor", [ROLE_PS] = "psfleet.v1.ParameterServer",
        [ROLE_WORKER] = "psfleet.v1.Worker",
};

static bool same_sockaddr(const struct addrinfo *a, const struct addrinfo *b) {
        return a->ai_addrlen == b->ai_addrlen && memcmp(a->ai_addr, b->ai_addr, a->ai_addrlen) == 0;
}

/* 0: something accepted a TCP connection; -ECONNREFUSED: nothing listens; else why not (-ETIMEDOUT:
 * no answer at all, the host or a firewall drops it). */
static int tcp_connect(const struct addrinfo *ai, uint64_t timeout_ms) {
        int first = -EADDRNOTAVAIL;
        for (const struct addrinfo *a = ai; a; a = a->ai_next) {
                int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol), r = 0;
                if (fd < 0)
                        continue;
                if (connect(fd, a->ai_addr, a->ai_addrlen) < 0) {
                        r = -errno;
                        if (r == -EINPROGRESS) {
                                struct pollfd p = {.fd = fd, .events = POLLOUT};
                                int soerr = 0;
                                socklen_t l = sizeof(soerr);
                                if (poll(&p, 1, (int)timeout_ms) <= 0)
                                        r = -ETIMEDOUT;
                                else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &l) < 0 || soerr)
                                        r = soerr ? -soerr : -errno;
                                else
                                        r = 0;
                        }
                }
                close(fd);
                if (r == 0)
                        return 0;
                if (first == -EADDRNOTAVAIL || r == -ECONNREFUSED)
                        first = r;
        }
        return first;
}

static int health(struct rpc_channel *ch, const char *service, uint64_t timeout_ms, char *err, size_t errlen) {
        Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        q.service = (char *)service;
        ProtobufCMessage *m;
        int r = rpc_call_msg(ch, RPC_HEALTH_CHECK, &q.base, &grpc__health__v1__health_check_response__descriptor,
                             timeout_ms, false, &m, err, errlen);
        if (r >= 0)
                protobuf_c_message_free_unpacked(m, NULL);
        return r;
}

/* The chief's fingerprint from its status; the ps's by a Pull of no variable stamped with ours (psd
 * never tells its fingerprint, it refuses a different one). 1: the same job, 0: another, -errno:
 * not known (err says why). */
static int same_job(struct check *c, struct ep *p, struct rpc_channel *ch, uint64_t fp, char *err, size_t errlen) {
        int r;
        if (p->role == ROLE_CHIEF) {
                Psfleet__V1__StatusRequest q = PSFLEET__V1__STATUS_REQUEST__INIT;
                ProtobufCMessage *m;
                if ((r = rpc_call_msg(ch, "/psfleet.v1.Supervisor/GetStatus", &q.base, &psfleet__v1__job_status__descriptor,
                                      c->timeout_ms, false, &m, err, errlen)) < 0)
                        return r;
                uint64_t theirs = ((Psfleet__V1__JobStatus *)m)->fingerprint;
                protobuf_c_message_free_unpacked(m, NULL);
                snprintf(err, errlen, "its job fingerprint is %016" PRIx64 ", this file's %016" PRIx64, theirs, fp);
                return theirs == fp;
        }
        if (p->role != ROLE_PS) {
                snprintf(err, errlen, "a worker does not tell its job");
                return -ENOTSUP;
        }
        Psfleet__V1__Caller caller = PSFLEET__V1__CALLER__INIT;
        caller.fingerprint = fp;
        caller.task = (char *)"psfleet check";
        char *names[] = {(char *)"(psfleet check: no variable)"};
        Psfleet__V1__PullHeader h = PSFLEET__V1__PULL_HEADER__INIT;
        h.caller = &caller;
        h.n_names = 1;
        h.names = names;
        Psfleet__V1__PullRequest q = PSFLEET__V1__PULL_REQUEST__INIT;
        q.header = &h;
        struct rpc_result res;
        r = rpc_call(ch, "/psfleet.v1.ParameterServer/Pull", wire_pack(&q.base), c->timeout_ms, false, &res);
        grpc_status_code status = res.status;
        snprintf(err, errlen, "%s", res.message);
        rpc_result_clear(&res);
        if (r == 0 || status == GRPC_STATUS_UNAVAILABLE)   /* answered, or not initialized yet: ours */
                return 1;
        if (status == GRPC_STATUS_FAILED_PRECONDITION && strstr(err, "differs"))
                return 0;
        if (status == GRPC_STATUS_PERMISSION_DENIED && rpc_security()) {
                /* only the chief and workers may Pull; the handshake proved a task of this job and CA */
                snprintf(err, errlen, "under mutual TLS its certificate names it; its fingerprint is for tasks to ask");
                return -ENOTSUP;
        }
        return r;
}

/* Something accepts connections at p: is it the daemon the job file says, of this job? */
static void talk(struct check *c, struct ep *p, uint64_t fp) {
        char err[1024];
        struct rpc_channel *ch;
        int r = rpc_channel_new(p->e->addr, p->name, &ch);
        if (r < 0) {
                problem(c, true, p->label, "cannot make a channel: %s", strerror(-r));
                return;
        }
        if (health(ch, "", c->timeout_ms, err, sizeof(err)) < 0) {
                if (rpc_security())
                        problem(c, true, p->label,
                                "something accepts TCP connections there but does not answer a gRPC health check as %s "
                                "over the job's mutual TLS: a daemon of another task, of a job of another CA, or "
                                "another program (%s)",
                                p->name, err);
                else
                        problem(c, true, p->label,
                                "the port is taken by another program: it accepts TCP connections but does not "
                                "answer a gRPC health check in plain TCP (a daemon running mutual TLS would not "
                                "either) (%s)",
                                err);
                goto out;
        }
        if (health(ch, role_service[p->role], c->timeout_ms, err, sizeof(err)) < 0) {
                const char *is = NULL;
                for (int k = ROLE_CHIEF; k <= ROLE_WORKER && !is; k++)
                        if (k != (int)p->role && health(ch, role_service[k], c->timeout_ms, err, sizeof(err)) == 0)
                                is = role_name((enum role)k);
                problem(c, true, p->label, "a %s answers there, not a %s (%s is not served)",
                        is ? is : "gRPC server of another program", role_name(p->role), role_service[p->role]);
                goto out;
        }
        r = same_job(c, p, ch, fp, err, sizeof(err));
        if (r == 0)
                problem(c, true, p->label, "a %s of another job answers there (%s)", role_name(p->role), err);
        else if (r < 0 && r != -ENOTSUP)
                problem(c, false, p->label, "its %s answers, but its job could not be compared: %s", role_name(p->role),
                        err);
out:
        rpc_channel_free(ch);
}

static void check_endpoint(struct check *c, struct ep *p, uint64_t fp) {
        int r = rpc_probe_bind(p->e->addr);
        /* free as a server sees it (one of the addresses a name resolves to can be bound); but a
         * program on another of them ("localhost": 127.0.0.1 taken, ::1 free) is still found */
        if (r == 0 && tcp_connect(p->ai, c->timeout_ms) < 0)
                return;   /* the daemon can start here */
        if (r == 0)
                r = -EADDRINUSE;
        if (r != -EADDRINUSE && r != -EADDRNOTAVAIL) {
                problem(c, true, p->label, "the port cannot be bound on this host: %s", strerror(-r));
                return;
        }
        bool local = r == -EADDRINUSE;
        if ((r = tcp_connect(p->ai, c->timeout_ms)) == -ECONNREFUSED) {
                if (local)
                        problem(c, true, p->label, "the port is in use on this host, but nothing accepts connections");
                else
                        problem(c, false, p->label, "nothing listens there (not started yet?)");
                return;
        }
        if (r < 0) {
                problem(c, true, p->label, "cannot be reached: %s%s", strerror(-r),
                        r == -ETIMEDOUT ? " (the host is down, or a firewall drops the connection)" : "");
                return;
        }
        if (c->talk)
                talk(c, p, fp);
        else
                problem(c, false, p->label, "something listens there; its role and job were not checked (no credentials)");
}

static void check_endpoints(struct check *c) {
        const struct cluster *cl = &c->cfg->cluster;
        uint32_t n = cl->n_chief + cl->n_ps + cl->n_worker, k = 0;
        struct ep *eps = calloc(n, sizeof(*eps));
        if (!eps) {
                problem(c, true, "psfleet", "out of memory");
                return;
        }
        const struct {
                enum role role;
                const struct endpoint *e;
                uint32_t n;
        } lists[] = {{ROLE_CHIEF, cl->chief, cl->n_chief}, {ROLE_PS, cl->ps, cl->n_ps}, {ROLE_WORKER, cl->worker, cl->n_worker}};
        for (size_t l = 0; l < ELEMENTSOF(lists); l++)
                for (uint32_t i = 0; i < lists[l].n; i++, k++) {
                        struct ep *p = &eps[k];
                        p->e = &lists[l].e[i];
                        p->role = lists[l].role;
                        p->index = i;
                        if (p->role == ROLE_CHIEF)
                                snprintf(p->name, sizeof(p->name), "chief");
                        else
                                snprintf(p->name, sizeof(p->name), "%s:%" PRIu32, role_name(p->role), i);
                        snprintf(p->label, sizeof(p->label), "%s %s", p->name, p->e->addr);
                        char port[8];
                        snprintf(port, sizeof(port), "%u", p->e->port);
                        struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
                        int r = getaddrinfo(p->e->host, port, &hints, &p->ai);
                        if (r != 0) {
                                p->ai = NULL;
                                problem(c, true, p->label, "host \"%s\" does not resolve: %s", p->e->host,
                                        gai_strerror(r));
                        }
                }
        /* the config refuses an endpoint written twice; two spellings of one socket pass it */
        unsigned dup = 0;
        for (uint32_t i = 0; i < n; i++)
                for (uint32_t j = 0; j < i && eps[i].ai; j++) {
                        bool same = false;
                        for (const struct addrinfo *a = eps[i].ai; a && !same; a = a->ai_next)
                                for (const struct addrinfo *b = eps[j].ai; b && !same; b = b->ai_next)
                                        same = same_sockaddr(a, b);
                        if (same) {
                                problem(c, true, eps[i].label, "the same socket as %s (two daemons cannot share a port)",
                                        eps[j].label);
                                eps[i].ai = (freeaddrinfo(eps[i].ai), NULL);   /* checked once, as the first */
                                dup++;
                                break;
                        }
                }
        uint64_t fp = config_fingerprint(c->cfg);
        for (uint32_t i = 0; i < n; i++)
                if (eps[i].ai)
                        check_endpoint(c, &eps[i], fp);
        checked(c, "endpoints", "%" PRIu32 " endpoints: resolved, %s; %u duplicated", n,
                c->talk ? "free here or asked for their role and job" : "free here or listening", dup);
        for (uint32_t i = 0; i < n; i++)
                if (eps[i].ai)
                        freeaddrinfo(eps[i].ai);
        free(eps);
}

/* ---- data ---- */

/* The model's input values per example and classes, from its variables (the last is the output
 * layer's bias, one column per class). */
static int model_shape(const struct model_spec *m, uint32_t *dim, uint32_t *classes) {
        struct model_spec_var vars[MODEL_MAX_VARS];
        int n = model_spec_vars(m, vars, NULL);
        if (n <= 0)
                return -EINVAL;
        *dim = m->input[0] * m->input[1] * m->input[2];
        *classes = m->graph ? (uint32_t)graph_shape_count(&m->graph->tensors[m->graph->loss].shape, 1) : vars[n - 1].cols;
        return 0;
}

static void check_split(struct check *c, const char *split, const char *images, const char *labels, uint32_t dim,
                        uint32_t classes) {
        char *ip = trainer_data_path(c->cfg, images), *lp = trainer_data_path(c->cfg, labels), err[1024], thing[64];
        struct dataset *d = NULL;
        snprintf(thing, sizeof(thing), "data %s", split);
        if (!ip || !lp) {
                problem(c, true, thing, "out of memory");
        } else if (dataset_load(ip, lp, &d, err, sizeof(err)) < 0) {
                problem(c, true, thing, "%s", err);
        } else if (dim && dataset_fits(d, ip, dim, classes, err, sizeof(err)) < 0) {
                problem(c, true, thing, "%s", err);
        } else {
                checked(c, thing, "%" PRIu32 " examples of %" PRIu32 "x%" PRIu32 ", labels below %" PRIu32, d->n,
                        d->rows, d->cols, (uint32_t)dataset_max_label(d) + 1);
        }
        dataset_free(d);
        free(ip);
        free(lp);
}

static void check_data(struct check *c) {
        const struct data_config *dc = &c->cfg->data;
        struct stat st;
        if (stat(dc->dir, &st) < 0) {
                problem(c, true, "data", "data.dir \"%s\": %s", dc->dir, strerror(errno));
                return;
        }
        if (!S_ISDIR(st.st_mode) || access(dc->dir, R_OK | X_OK) < 0) {
                problem(c, true, "data", "data.dir \"%s\": %s", dc->dir,
                        S_ISDIR(st.st_mode) ? strerror(errno) : "not a directory");
                return;
        }
        if (dc->format != DATA_IDX) { /* record files: each is there and readable (their rows are read as trained) */
                for (int split = 0; split < 2; split++) {
                        char **files = split ? dc->test_files : dc->train_files;
                        uint32_t n = split ? dc->n_test_files : dc->n_train_files, ok = 0;
                        for (uint32_t i = 0; i < n; i++) {
                                char *p = trainer_data_path(c->cfg, files[i]);
                                if (!p)
                                        problem(c, true, "data", "out of memory");
                                else if (access(p, R_OK) < 0)
                                        problem(c, true, split ? "data test" : "data train", "%s: %s", p, strerror(errno));
                                else
                                        ok++;
                                free(p);
                        }
                        if (n)
                                checked(c, split ? "data test" : "data train", "%" PRIu32 " of %" PRIu32 " files readable",
                                        ok, n);
                }
                return;
        }
        uint32_t dim = 0, classes = 0;
        if (model_shape(&c->cfg->model, &dim, &classes) < 0)
                problem(c, true, "model", "its variables cannot be laid out; the data's fit was not checked");
        check_split(c, "train", dc->train_images, dc->train_labels, dim, classes);
        check_split(c, "test", dc->test_images, dc->test_labels, dim, classes);
}

/* ---- certificates ---- */

static bool task_local(const struct job_config *cfg, const char *task) {
        enum role roles[] = {ROLE_CHIEF, ROLE_PS, ROLE_WORKER, ROLE_EVALUATOR};
        for (size_t r = 0; r < ELEMENTSOF(roles); r++) {
                size_t l = strlen(role_name(roles[r]));
                if (strncmp(task, role_name(roles[r]), l) != 0)
                        continue;
                bool one = roles[r] == ROLE_CHIEF || roles[r] == ROLE_EVALUATOR;   /* "chief", "evaluator": no index */
                struct task t = {roles[r], one ? 0 : (uint32_t)strtoul(task + l + 1, NULL, 10)};
                const struct endpoint *e = config_endpoint(cfg, t);
                int b = e ? rpc_probe_bind(e->addr) : -EADDRNOTAVAIL;
                return b != -EADDRNOTAVAIL;
        }
        return true;    /* admin, viewer: the operator's, on this host */
}

/* One task's files: 1 checked, 0 absent here (and not needed here), or a problem reported (-1). */
static int check_task_cert(struct check *c, const char *task) {
        const struct job_config *cfg = c->cfg;
        char crt[1024], key[1024], err[2048], thing[64];
        snprintf(thing, sizeof(thing), "certs %s", task);
        if (tls_expand_path(cfg->security.cert, cfg->name, task, crt, sizeof(crt)) < 0 ||
            tls_expand_path(cfg->security.key, cfg->name, task, key, sizeof(key)) < 0) {
                problem(c, true, thing, "security.cert or security.key does not expand");
                return -1;
        }
        bool has_crt = access(crt, F_OK) == 0, has_key = access(key, F_OK) == 0;
        if (!has_crt && !has_key && !task_local(cfg, task))
                return 0;   /* another host's task: its files are there */
        if (!has_crt || !has_key) {
                problem(c, strcmp(task, "viewer") != 0, thing, "%s is missing (make it with `psfleet certs --job %s --task %s`)",
                        has_crt ? key : crt, cfg->path, task);
                return -1;
        }
        if (access(key, R_OK) < 0) {
                problem(c, false, thing, "%s cannot be read by this user (%s): not checked", key, strerror(errno));
                return -1;
        }
        struct rpc_tls *tls = NULL;
        if (tls_from_config(cfg, task, &tls, err, sizeof(err)) < 0) {
                problem(c, true, thing, "%s", err);
                return -1;
        }
        rpc_tls_free(tls);
        struct x509_cred *x;
        if (x509_cred_load(crt, key, false, &x, err, sizeof(err)) == 0) {
                time_t end = x509_cred_not_after(x), now = time(NULL);
                if (end - now < EXPIRY_WARN_DAYS * 86400) {
                        char when[32];
                        struct tm tm;
                        strftime(when, sizeof(when), "%Y-%m-%d", gmtime_r(&end, &tm));
                        problem(c, false, thing, "%s ends on %s, within %d days (`psfleet certs --job %s --task %s --force`)",
                                crt, when, EXPIRY_WARN_DAYS, cfg->path, task);
                }
                x509_cred_free(x);
        }
        return 1;
}

/* Returns whether this process may talk to the daemons (insecure, or the identity's credentials). */
static bool check_certs(struct check *c, const char *identity) {
        const struct job_config *cfg = c->cfg;
        char err[2048];
        struct rpc_tls *tls = NULL;
        /* an insecure job needs no files: the mode alone decides, whatever the task */
        if (tls_from_config(cfg, "admin", &tls, err, sizeof(err)) == 0 && !tls) {
                checked(c, "certs", "none needed: the job runs without TLS");
                return true;
        }
        rpc_tls_free(tls);
        if (tls_job_uses_auto(cfg)) {
                /* the job's own CA and pairs, made by its daemons at start: nothing to check before */
                char ca[1024], crt[1024], key[1024];
                if (tls_paths(cfg, identity ? identity : "admin", ca, crt, key) < 0) {
                        problem(c, true, "certs", "security.auto_dir \"%s\" does not expand", cfg->security.auto_dir);
                        return false;
                }
                if (access(key, R_OK) < 0) {
                        checked(c, "certs", "mutual TLS with the job's own CA, made by its daemons at start beside %s "
                                "(security.auto_dir; %s for this user: the daemons were not asked)", key, strerror(errno));
                        return false;
                }
                if (tls_from_config(cfg, identity ? identity : "admin", &tls, err, sizeof(err)) < 0) {
                        problem(c, true, "certs", "%s", err);
                        return false;
                }
                checked(c, "certs", "mutual TLS with the job's own CA (security.auto_dir), as %s",
                        identity ? identity : "admin");
                bool ok = rpc_secure(tls) == 0;
                rpc_tls_free(tls);
                return ok;
        }
        char ca[1024];
        if (tls_expand_path(cfg->security.ca, cfg->name, "ca", ca, sizeof(ca)) == 0 && access(ca, R_OK) < 0)
                problem(c, true, "certs", "the job's CA %s: %s (make the job's certificates with `psfleet certs --job %s`)",
                        ca, strerror(errno), cfg->path);
        unsigned n = 0;
        char task[32];
        for (uint32_t i = 0; i < cfg->cluster.n_chief + cfg->cluster.n_ps + cfg->cluster.n_worker; i++) {
                if (i < cfg->cluster.n_chief)
                        snprintf(task, sizeof(task), "chief");
                else if (i < cfg->cluster.n_chief + cfg->cluster.n_ps)
                        snprintf(task, sizeof(task), "ps-%" PRIu32, i - cfg->cluster.n_chief);
                else
                        snprintf(task, sizeof(task), "worker-%" PRIu32, i - cfg->cluster.n_chief - cfg->cluster.n_ps);
                n += check_task_cert(c, task) > 0;
        }
        if (cfg->cluster.n_evaluator)
                n += check_task_cert(c, "evaluator") > 0;
        int admin = check_task_cert(c, "admin"), viewer = check_task_cert(c, "viewer");
        n += (admin > 0) + (viewer > 0);
        checked(c, "certs", "mutual TLS: %u tasks' certificates on this host checked", n);
        if (!identity)
                identity = admin > 0 ? "admin" : "viewer";
        if (tls_from_config(cfg, identity, &tls, err, sizeof(err)) < 0)
                return false;   /* its problem is listed above */
        bool ok = rpc_secure(tls) == 0;
        rpc_tls_free(tls);
        return ok;
}

/* ps.memory_limit_bytes against what each psd needs without its tables (psfleet plan's figures). */
static void check_memory(struct check *c) {
        struct job_layout *L = NULL;
        char err[1024], thing[32];
        if (!c->cfg->ps.memory_limit_bytes)
                return;
        if (job_layout_new(c->cfg, &L) < 0)
                return;   /* the model's own problem is the data check's */
        uint64_t most = 0;
        for (uint32_t s = 0; s < L->n_shards; s++) {
                struct memplan_ps p;
                snprintf(thing, sizeof(thing), "ps:%u memory", s);
                if (memplan_ps(c->cfg, L, s, &p, err, sizeof(err)) < 0)
                        problem(c, true, thing, "%s", err);
                else if (p.total > most)
                        most = p.total;
        }
        if (most)
                checked(c, "memory", "ps.memory_limit_bytes %" PRIu64 ": every psd fits, the largest plans %" PRIu64
                        " bytes (psfleet plan)", c->cfg->ps.memory_limit_bytes, most);
        job_layout_free(L);
}

static int finish(struct check *c, const char *path) {
        int status = c->errors ? CONFIG_EX_CONFIG : 0;
        if (c->json) {
                json_t *o = json_pack("{s:s, s:s?, s:b, s:i, s:i, s:o, s:o}", "file", path, "job",
                                      c->cfg ? c->cfg->name : NULL, "ok", !c->errors, "errors", (int)c->errors,
                                      "warnings", (int)c->warnings, "checked", c->checked, "problems", c->problems);
                cli_print_json(stdout, o);
                return status;
        }
        size_t i;
        json_t *v;
        json_array_foreach(c->checked, i, v)
                printf("checked %s: %s\n", json_string_value(json_object_get(v, "check")),
                       json_string_value(json_object_get(v, "result")));
        printf("%s: %u error%s, %u warning%s\n", path, c->errors, c->errors == 1 ? "" : "s", c->warnings,
               c->warnings == 1 ? "" : "s");
        json_decref(c->checked);
        json_decref(c->problems);
        return status;
}

int cmd_check(int argc, char **argv) {
        struct check c = {.timeout_ms = 2000};
        const char *identity = NULL;
        const struct cli_opt opts[] = {
                CLI_FLAG("json", &c.json),
                CLI_NUMBER("timeout", &c.timeout_ms, 1, 600000),
                CLI_STRING("identity", &identity),
                {},
        };
        const struct cli_args args = {
                .cmd = "check", .opts = opts, .help = check_help,
                .min_operands = 1, .max_operands = 1, .usage = "Usage: psfleet check [--json] JOB.json",
        };
        int first, r;
        if (!cli_args_parse(&args, argc, argv, &first, &r))
                return r;
        if (identity && strcmp(identity, "admin") != 0 && strcmp(identity, "viewer") != 0) {
                cli_error("check: --identity %s: expected admin or viewer", identity);
                return CLI_EX_USAGE;
        }
        const char *path = argv[first];
        c.problems = json_array();
        c.checked = json_array();
        struct job_config *cfg = NULL;
        char err[1024];
        if (config_load(path, &cfg, err, sizeof(err)) < 0 ||
            config_apply_tf_config(cfg, getenv("TF_CONFIG"), NULL, NULL, err, sizeof(err)) < 0) {
                problem(&c, true, "config", "%s", err);
                config_free(cfg);
                return finish(&c, path);
        }
        c.cfg = cfg;
        checked(&c, "config", "job %s: %s, cluster from %s", cfg->name, "valid", cfg->cluster_origin);
        rpc_global_init();
        c.talk = check_certs(&c, identity);
        check_endpoints(&c);
        check_data(&c);
        check_memory(&c);
        r = finish(&c, path);
        config_free(cfg);
        return r;
}
