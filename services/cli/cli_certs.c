/* psfleet certs: a job's cluster CA and a key and certificate for each of its tasks and for people
 * (admin, viewer), laid out as the security.* keys' defaults expect (/etc/psfleet/tls/JOB/). */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "authz.h"
#include "cli_certs.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "util.h"
#include "x509.h"

#define CERTS_EX_IOERR 74       /* sysexits.h EX_IOERR */
#define DEFAULT_DIR "/etc/psfleet/tls"

static void certs_help(FILE *f) {
        fprintf(f, "Usage: psfleet certs --job JOB [--dir DIR] [--days N] [--ca-days N] [--task TASK,...] [--force]\n"
                   "                     [--k8s-secrets FILE]\n"
                   "\n"
                   "Makes the job's cluster CA, DIR/JOB/ca.crt and ca.key (0600: it stays on this machine),\n"
                   "unless it exists, and with it a key and certificate for every task of the job's cluster\n"
                   "(chief, ps-N, worker-N, and evaluator when the cluster has one) and for people (admin,\n"
                   "viewer): DIR/JOB/TASK.crt (0644) and\n"
                   "DIR/JOB/TASK.key (0640, group psfleet when this machine has that group). Existing\n"
                   "files of a task are kept unless --force. See docs/security.md.\n"
                   "\n"
                   "  --job JOB       the job file, or a job's name for $PSFLEET_CONFIG_DIR/jobs/JOB.json\n"
                   "                  (default /etc/psfleet/jobs/JOB.json)\n"
                   "  --dir DIR       where the job's directory goes (default " DEFAULT_DIR ")\n"
                   "  --days N        validity of the tasks' certificates, in days (default %d; never\n"
                   "                  beyond the CA's)\n"
                   "  --ca-days N     validity of a new CA, in days (default %d)\n"
                   "  --task LIST     only these tasks, comma-separated (chief, ps-0, worker-1, evaluator, admin,\n"
                   "                  viewer)\n"
                   "  --force         issue a task's key and certificate again although they exist\n"
                   "                  (rotation: --task worker-1 --force)\n"
                   "  --k8s-secrets FILE  then write the job's Kubernetes Secrets to FILE (0600; - for stdout):\n"
                   "                  JOB-tls-ca with ca.crt (not the CA's key) and JOB-tls-TASK with TASK.crt\n"
                   "                  and TASK.key for each task of the cluster; a pod mounts the CA's and\n"
                   "                  its role's as one projected volume (docs/operations.md)\n"
                   "\n"
                   "Exit status: 0 done, 2 bad usage, 74 a file could not be read or written, 78 bad job\n"
                   "file, a task not in the job, or an existing file that is not what it should be (a\n"
                   "CA that has ended, a kept certificate this CA did not issue).\n",
                X509_LEAF_DAYS, X509_CA_DAYS);
}

struct certs {
        char *dir;              /* DIR/JOB */
        const char *job;
        uint32_t days;
        bool force;
        gid_t key_gid;          /* psfleet's group, or -1 */
        bool group_noted;       /* said that there is no such group */
        struct x509_cred *ca;
        FILE *say;              /* what was done: stdout, stderr when the Secrets go there */
};

/* A libcrypto or file error, said, as the exit status: a file that is not what it should be is a
 * configuration error, anything else I/O. */
static int fail(int r, const char *err) {
        cli_error("%s", err);
        return r == -EINVAL ? CONFIG_EX_CONFIG : CERTS_EX_IOERR;
}

static const char *date(time_t t, char *buf, size_t len) {
        struct tm tm;
        strftime(buf, len, "%Y-%m-%d", gmtime_r(&t, &tm));
        return buf;
}

static bool exists(const char *path) {
        return access(path, F_OK) == 0;
}

/* --job: a path (with a slash, or ending in .json), or the name of a job in the config directory. */
static char *job_path(const char *arg) {
        size_t n = strlen(arg);
        if (strchr(arg, '/') || (n > 5 && strcmp(arg + n - 5, ".json") == 0) || !config_job_name_valid(arg))
                return strdup(arg);
        const char *dir = config_env_value("PSFLEET_CONFIG_DIR");
        return strdup_printf("%s/jobs/%s.json", dir && *dir ? dir : "/etc/psfleet", arg);
}

static int load_or_make_ca(struct certs *c, uint32_t ca_days) {
        char *crt = strdup_printf("%s/ca.crt", c->dir), *key = strdup_printf("%s/ca.key", c->dir);
        char err[1024], buf[32];
        int r = CERTS_EX_IOERR;
        if (!crt || !key) {
                cli_error("out of memory");
                goto out;
        }
        if (exists(crt) && exists(key)) {
                if ((r = x509_cred_load(crt, key, true, &c->ca, err, sizeof(err))) < 0) {
                        r = fail(r, err);
                        goto out;
                }
                date(x509_cred_not_after(c->ca), buf, sizeof(buf));
                if (x509_cred_not_after(c->ca) <= time(NULL)) {
                        cli_error("%s: the CA ended on %s: make a new one (docs/security.md, \"Rotation\")", crt, buf);
                        r = CONFIG_EX_CONFIG;
                        goto out;
                }
                fprintf(c->say, "using %s (the job's CA, valid until %s)\n", crt, buf);
                r = 0;
        } else if (exists(crt) || exists(key)) {
                cli_error("%s exists without %s: put it back, or move both away to make a new CA (every "
                          "certificate of the job is then issued again)", exists(crt) ? crt : key, exists(crt) ? key : crt);
                r = CONFIG_EX_CONFIG;
        } else {
                char *cn = strdup_printf("psfleet CA %s", c->job);
                struct x509_subject s = {cn, "psfleet", c->job};
                struct x509_file fc = {crt, 0644, (gid_t)-1}, fk = {key, 0600, (gid_t)-1};
                if (!cn)
                        cli_error("out of memory");
                else if ((r = x509_ca_new(&s, ca_days, &c->ca, err, sizeof(err))) < 0 ||
                         (r = x509_cred_save(c->ca, &fc, &fk, err, sizeof(err))) < 0)
                        r = fail(r, err);
                else
                        fprintf(c->say, "wrote %s (the CA's key, 0600: keep it on this machine)\n"
                               "wrote %s (CN \"%s\", valid until %s)\n",
                               key, crt, cn, date(x509_cred_not_after(c->ca), buf, sizeof(buf)));
                free(cn);
        }
out:
        free(crt);
        free(key);
        return r;
}

/* A task's existing files, kept: they must still be a pair this CA issued. */
static int keep(const struct certs *c, const char *crt, const char *key) {
        char err[1024], why[512];
        struct x509_cred *cred;
        int r = x509_cred_load(crt, key, false, &cred, why, sizeof(why));
        if (r >= 0) {
                char how[256];
                r = x509_cred_verify(cred, c->ca, how, sizeof(how));
                if (r < 0)
                        snprintf(why, sizeof(why), "%s: not valid with this CA (%s)", crt, how);
                x509_cred_free(cred);
        }
        if (r < 0) {
                snprintf(err, sizeof(err), "%s; --force issues the task's key and certificate again", why);
                return fail(r, err);
        }
        fprintf(c->say, "kept %s (exists; --force issues it again)\nkept %s\n", crt, key);
        return 0;
}

/* Whether this process may chown a file of its own to group gid: root, or a member of it (an ordinary
 * user making a Slurm job's certificates on a node that has the packages, hence the group). */
static bool may_give_to(gid_t gid) {
        if (geteuid() == 0 || getegid() == gid)
                return true;
        gid_t groups[256];
        int n = getgroups(256, groups);
        for (int i = 0; i < n; i++)
                if (groups[i] == gid)
                        return true;
        return false;
}

/* Without a psfleet group the keys keep the writer's: said once, before the first key. */
static void note_group(struct certs *c) {
        if (c->key_gid != (gid_t)-1 || c->group_noted)
                return;
        struct group *mine = getgrgid(getegid());
        fprintf(stderr, "psfleet certs: the keys stay in group %s (this machine has no group psfleet, or you are not in "
                "it): give them to the daemons' group where you install them\n", mine ? mine->gr_name : "(yours)");
        c->group_noted = true;
}

static int issue(struct certs *c, enum peer_role role, uint32_t index) {
        char task[AUTHZ_TASK_MAX], cn[AUTHZ_TASK_MAX], dns[256], err[1024], buf[32];
        authz_task_name(role, index, task, sizeof(task));
        snprintf(cn, sizeof(cn), "%s", task);
        char *dash = strchr(cn, '-');
        if (dash)
                *dash = '/';    /* the role as people write it: "ps/0" */
        if (authz_dns_name(c->job, task, dns, sizeof(dns)) < 0) {
                cli_error("job \"%s\", task %s: no DNS name for them", c->job, task);
                return CONFIG_EX_CONFIG;
        }
        char *crt = strdup_printf("%s/%s.crt", c->dir, task), *key = strdup_printf("%s/%s.key", c->dir, task);
        struct x509_cred *cred = NULL;
        int r;
        if (!crt || !key) {
                cli_error("out of memory");
                r = CERTS_EX_IOERR;
        } else if (!c->force && exists(crt) && exists(key)) {
                r = keep(c, crt, key);
        } else {
                struct x509_subject s = {cn, "psfleet", c->job};
                struct x509_file fc = {crt, 0644, (gid_t)-1}, fk = {key, 0640, c->key_gid};
                note_group(c);
                if ((r = x509_issue(c->ca, &s, dns, c->days, &cred, err, sizeof(err))) < 0 ||
                    (r = x509_cred_save(cred, &fc, &fk, err, sizeof(err))) < 0)
                        r = fail(r, err);
                else
                        fprintf(c->say, "wrote %s\nwrote %s (CN \"%s\", DNS %s, valid until %s)\n", key, crt, cn, dns,
                               date(x509_cred_not_after(cred), buf, sizeof(buf)));
        }
        x509_cred_free(cred);
        free(crt);
        free(key);
        return r;
}

/* Whether the job has this task: the cluster's chief, ps, workers and evaluator; admin and viewer always. */
static bool in_job(const struct job_config *cfg, enum peer_role role, uint32_t index) {
        switch (role) {
        case PEER_CHIEF:
                return index < cfg->cluster.n_chief;
        case PEER_PS:
                return index < cfg->cluster.n_ps;
        case PEER_WORKER:
                return index < cfg->cluster.n_worker;
        case PEER_EVALUATOR:
                return cfg->cluster.n_evaluator > 0;
        case PEER_ADMIN:
        case PEER_VIEWER:
                return true;
        default:
                return false;
        }
}

/* Issues (or keeps) the tasks of `list` (comma-separated), or every task when list is NULL. */
static int issue_all(struct certs *c, const struct job_config *cfg, const char *list) {
        int r;
        if (!list) {
                const struct {
                        enum peer_role role;
                        uint32_t n;
                } all[] = {{PEER_CHIEF, cfg->cluster.n_chief}, {PEER_PS, cfg->cluster.n_ps},
                           {PEER_WORKER, cfg->cluster.n_worker}, {PEER_EVALUATOR, cfg->cluster.n_evaluator ? 1 : 0},
                           {PEER_ADMIN, 1}, {PEER_VIEWER, 1}};
                for (size_t i = 0; i < ELEMENTSOF(all); i++)
                        for (uint32_t k = 0; k < all[i].n; k++)
                                if ((r = issue(c, all[i].role, k)))
                                        return r;
                return 0;
        }
        for (const char *p = list; *p;) {
                size_t n = strcspn(p, ",");
                char task[AUTHZ_TASK_MAX];
                enum peer_role role;
                uint32_t index;
                snprintf(task, sizeof(task), "%.*s", (int)n, p);
                if (n >= sizeof(task) || authz_parse_task(task, &role, &index) < 0 || !in_job(cfg, role, index)) {
                        cli_error("--task \"%.*s\": not a task of job %s (chief, ps-N below %u, worker-N below %u, "
                                  "%sadmin, viewer)", (int)n, p, c->job, cfg->cluster.n_ps, cfg->cluster.n_worker,
                                  cfg->cluster.n_evaluator ? "evaluator, " : "");
                        return CONFIG_EX_CONFIG;
                }
                if ((r = issue(c, role, index)))
                        return r;
                p += n + (p[n] == ',');
        }
        return 0;
}

/* DIR/JOB: its parents as any directory, itself 0750 in psfleet's group (the daemons read their keys
 * through it). An existing one is left as it is. */
static int make_dir(const char *base, const struct certs *c) {
        int r = mkdir_p(base, 0755);
        if (r < 0) {
                cli_error("%s: %s", base, strerror(-r));
                return CERTS_EX_IOERR;
        }
        if (mkdir(c->dir, 0750) < 0) {
                if (errno == EEXIST)
                        return 0;
                cli_error("%s: %m", c->dir);
                return CERTS_EX_IOERR;
        }
        if (c->key_gid != (gid_t)-1 && chown(c->dir, (uid_t)-1, c->key_gid) < 0) {
                cli_error("%s: %m", c->dir);
                return CERTS_EX_IOERR;
        }
        return 0;
}

int cmd_certs(int argc, char **argv) {
        const char *job = NULL, *dir = DEFAULT_DIR, *tasks = NULL, *secrets = NULL;
        uint64_t days = X509_LEAF_DAYS, ca_days = X509_CA_DAYS;
        bool force = false;
        const struct cli_opt opts[] = {
                CLI_STRING("job", &job), CLI_STRING("dir", &dir), CLI_NUMBER("days", &days, 1, 36500),
                CLI_NUMBER("ca-days", &ca_days, 1, 36500), CLI_STRING("task", &tasks), CLI_FLAG("force", &force),
                CLI_STRING("k8s-secrets", &secrets),
                {},
        };
        const struct cli_args args = {
                .cmd = "certs", .opts = opts, .help = certs_help, .min_operands = 0, .max_operands = 0,
        };
        int first, r;
        if (!cli_args_parse(&args, argc, argv, &first, &r))
                return r;
        if (!job || !*dir) {
                fprintf(stderr, "psfleet certs: --job JOB is needed (and --dir may not be empty)\n");
                return CLI_EX_USAGE;
        }
        /* the option takes one list: a second --task would silently replace the first */
        int n_task = 0;
        for (int i = 1; i < first; i++)
                n_task += strcmp(argv[i], "--task") == 0 || strncmp(argv[i], "--task=", 7) == 0;
        if (n_task > 1) {
                fprintf(stderr, "psfleet certs: give the tasks as one list: --task ps-0,worker-1\n");
                return CLI_EX_USAGE;
        }

        char *path = job_path(job), err[1024];
        struct job_config *cfg = NULL;
        struct certs c = {.days = (uint32_t)days, .force = force, .key_gid = (gid_t)-1,
                          .say = secrets && strcmp(secrets, "-") == 0 ? stderr : stdout};
        if (!path) {
                cli_error("out of memory");
                return CERTS_EX_IOERR;
        }
        if ((r = cli_load_job(path, &cfg)))
                goto out;
        if (config_apply_tf_config(cfg, getenv("TF_CONFIG"), NULL, NULL, err, sizeof(err)) < 0) {
                cli_error("%s", err);
                r = CONFIG_EX_CONFIG;
                goto out;
        }
        c.job = cfg->name;
        c.dir = strdup_printf("%s/%s", dir, cfg->name);
        if (!c.dir) {
                cli_error("out of memory");
                r = CERTS_EX_IOERR;
                goto out;
        }
        struct group *g = getgrnam("psfleet");
        if (g && may_give_to(g->gr_gid))
                c.key_gid = g->gr_gid;
        if (!(r = make_dir(dir, &c)) && !(r = load_or_make_ca(&c, (uint32_t)ca_days)))
                r = issue_all(&c, cfg, tasks);
        if (!r && secrets) {
                int e = certs_write_k8s_secrets(secrets, c.dir, cfg, err, sizeof(err));
                if (e < 0)
                        r = fail(e, err);
                else if (strcmp(secrets, "-") != 0)
                        printf("wrote %s (the job's Kubernetes Secrets, 0600: the tasks' keys are in it)\n", secrets);
        }
out:
        x509_cred_free(c.ca);
        free(c.dir);
        config_free(cfg);
        free(path);
        return r;
}
