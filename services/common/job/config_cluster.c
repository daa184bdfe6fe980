/* The cluster of a job (TensorFlow's ClusterSpec shape), its tasks, TF_CONFIG and systemd instance
 * names. */
#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_internal.h"
#include "util.h"

/* ---- cluster -------------------------------------------------------------------------------- */

void cfg_cluster_clear(struct cluster *cl) {
        struct endpoint *lists[] = { cl->chief, cl->ps, cl->worker, cl->ps_backup, cl->evaluator };
        uint32_t counts[] = { cl->n_chief, cl->n_ps, cl->n_worker, cl->n_ps_backup, cl->n_evaluator };

        for (size_t l = 0; l < 5; l++) {
                for (uint32_t i = 0; i < counts[l]; i++)
                        free(lists[l][i].addr);
                free(lists[l]);
        }
        memset(cl, 0, sizeof(*cl));
}

bool cfg_host_char_ok(char ch) {
        return isalnum((unsigned char) ch) || ch == '.' || ch == '-' || ch == '_';
}

/* Splits "host:port", "[v6]:port". On failure writes the reason and returns -EINVAL. */
static int parse_hostport(const char *s, struct endpoint *ep, char *why, size_t whylen) {
        const char *host, *colon;
        size_t hlen;
        uint64_t port;
        int r;

        if (s[0] == '[') {
                const char *close = strchr(s, ']');
                char buf[64];
                struct in6_addr a6;

                if (!close) {
                        snprintf(why, whylen, "missing ']'");
                        return -EINVAL;
                }
                host = s + 1;
                hlen = (size_t) (close - host);
                if (hlen == 0) {
                        snprintf(why, whylen, "empty host");
                        return -EINVAL;
                }
                if (hlen >= sizeof(buf)) {
                        snprintf(why, whylen, "bad IPv6 address");
                        return -EINVAL;
                }
                memcpy(buf, host, hlen);
                buf[hlen] = 0;
                if (inet_pton(AF_INET6, buf, &a6) != 1) {
                        snprintf(why, whylen, "bad IPv6 address");
                        return -EINVAL;
                }
                if (close[1] != ':') {
                        snprintf(why, whylen, close[1] ? "unexpected text after ']'" : "missing port");
                        return -EINVAL;
                }
                colon = close + 1;
        } else {
                colon = strrchr(s, ':');
                if (!colon) {
                        snprintf(why, whylen, "missing port");
                        return -EINVAL;
                }
                host = s;
                hlen = (size_t) (colon - s);
                if (hlen == 0) {
                        snprintf(why, whylen, "empty host");
                        return -EINVAL;
                }
                for (size_t i = 0; i < hlen; i++) {
                        if (host[i] == ':') {
                                snprintf(why, whylen, "an IPv6 address must be in brackets");
                                return -EINVAL;
                        }
                        if (!cfg_host_char_ok(host[i])) {
                                snprintf(why, whylen, "bad character in host");
                                return -EINVAL;
                        }
                }
        }
        if (hlen >= sizeof(ep->host)) {
                snprintf(why, whylen, "host longer than %zu characters", sizeof(ep->host) - 1);
                return -EINVAL;
        }
        if (!colon[1]) {
                snprintf(why, whylen, "missing port");
                return -EINVAL;
        }
        r = parse_u64(colon + 1, 1, 65535, &port);
        if (r == -EINVAL) {
                snprintf(why, whylen, "port is not a number");
                return r;
        }
        if (r < 0) {
                snprintf(why, whylen, "port out of range [1, 65535]");
                return r;
        }
        memcpy(ep->host, host, hlen);
        ep->host[hlen] = 0;
        ep->port = (uint16_t) port;
        return 0;
}

/* the three training roles' lists, then the optional ps_backup (list 3) and evaluator (list 4) */
#define LIST_PS_BACKUP 3
#define LIST_EVALUATOR 4
#define N_LISTS 5
static const char *const cluster_keys[] = { "chief", "ps", "worker", "ps_backup", "evaluator", NULL };

static struct endpoint **cluster_list(struct cluster *cl, int role, uint32_t **n) {
        switch (role) {
        case ROLE_CHIEF: *n = &cl->n_chief; return &cl->chief;
        case ROLE_PS: *n = &cl->n_ps; return &cl->ps;
        case LIST_PS_BACKUP: *n = &cl->n_ps_backup; return &cl->ps_backup;
        case LIST_EVALUATOR: *n = &cl->n_evaluator; return &cl->evaluator;
        default: *n = &cl->n_worker; return &cl->worker;
        }
}

int cfg_parse_cluster(const struct ctx *x, const json_t *obj, struct cluster *ret) {
        struct cluster cl = { 0 };
        const char *name, *listname[N_LISTS] = { "chief", "ps", "worker", "ps_backup", "evaluator" };
        const json_t *lists[N_LISTS] = { NULL, NULL, NULL, NULL, NULL };
        json_t *v;
        char key[96], why[128], q[300], d[160];
        int r;

        if (!json_is_object(obj))
                return cfg_fail_type(x, "cluster", "an object", obj);
        json_object_foreach((json_t *) obj, name, v) {
                if (strcmp(name, "master") == 0) {
                        if (json_object_get(obj, "chief"))
                                return cfg_failf(x, "cluster.master", "conflicts with cluster.chief (they are the same task)");
                        lists[ROLE_CHIEF] = v;
                        listname[ROLE_CHIEF] = "master";
                        continue;
                }
                int i = cfg_lookup_choice(cluster_keys, name);
                if (i < 0) {
                        snprintf(key, sizeof(key), "cluster.%s", name);
                        return cfg_failf(x, key, "unknown key");
                }
                lists[i] = v;
        }

        for (int role = 0; role < N_LISTS; role++) {
                const json_t *a = lists[role];
                struct endpoint **eps;
                uint32_t *n;
                size_t len;

                snprintf(key, sizeof(key), "cluster.%s", listname[role]);
                if (!a && (role == LIST_PS_BACKUP || role == LIST_EVALUATOR))
                        continue;   /* optional: ps.replicas 1; no evaluator */
                if (role == LIST_EVALUATOR && json_is_array(a) && json_array_size(a) == 0)
                        continue;   /* "evaluator": [] is none, as TensorFlow reads it */
                if (role == LIST_EVALUATOR && json_is_array(a) && json_array_size(a) > 1) {
                        r = cfg_failf(x, key, "must have at most 1 entry, has %zu", json_array_size(a));
                        goto fail;
                }
                if (!a) {
                        r = cfg_failf(x, key, "missing");
                        goto fail;
                }
                if (!json_is_array(a)) {
                        r = cfg_fail_type(x, key, "an array of \"host:port\" strings", a);
                        goto fail;
                }
                len = json_array_size(a);
                if (len == 0) {
                        r = cfg_failf(x, key, "must not be empty");
                        goto fail;
                }
                if (role == LIST_PS_BACKUP && len != cl.n_ps) {
                        r = cfg_failf(x, key, "has %zu entries, cluster.ps %" PRIu32 ": a backup for each shard, "
                                      "in the same order", len, cl.n_ps);
                        goto fail;
                }
                if (role == ROLE_CHIEF && len != 1) {
                        r = cfg_failf(x, key, "must have exactly 1 entry, has %zu", len);
                        goto fail;
                }
                if (len > CONFIG_MAX_TASKS) {
                        r = cfg_failf(x, key, "has %zu entries, at most %d", len, CONFIG_MAX_TASKS);
                        goto fail;
                }
                eps = cluster_list(&cl, role, &n);
                *eps = calloc(len, sizeof(struct endpoint));
                if (!*eps) {
                        r = cfg_fail_oom(x);
                        goto fail;
                }
                for (size_t i = 0; i < len; i++) {
                        const json_t *e = json_array_get(a, i);
                        struct endpoint *ep = &(*eps)[i];

                        snprintf(key, sizeof(key), "cluster.%s[%zu]", listname[role], i);
                        if (!json_is_string(e)) {
                                r = cfg_failf(x, key, "expected a \"host:port\" string, got %s", cfg_describe(e, d, sizeof(d)));
                                goto fail;
                        }
                        if (parse_hostport(json_string_value(e), ep, why, sizeof(why)) < 0) {
                                r = cfg_failf(x, key, "%s is not host:port (%s)", cfg_quote_json(e, q, sizeof(q)), why);
                                goto fail;
                        }
                        ep->addr = strdup(json_string_value(e));
                        if (!ep->addr) {
                                r = cfg_fail_oom(x);
                                goto fail;
                        }
                        (*n)++;
                        /* An endpoint twice would make two daemons fight over one port. */
                        for (int pr = 0; pr <= role; pr++) {
                                struct endpoint *other;
                                uint32_t *on;

                                other = *cluster_list(&cl, pr, &on);
                                for (uint32_t j = 0; j < *on; j++) {
                                        if (&other[j] == ep)
                                                break;
                                        if (other[j].port == ep->port && strcasecmp(other[j].host, ep->host) == 0) {
                                                r = cfg_failf(x, key, "%s duplicates cluster.%s[%" PRIu32 "]%s",
                                                          cfg_quote_json(e, q, sizeof(q)), listname[pr], j,
                                                          role == LIST_PS_BACKUP && pr == ROLE_PS && j == i
                                                                  ? ": a shard's backup must be another psd than its primary"
                                                                  : "");
                                                goto fail;
                                        }
                                }
                        }
                }
        }
        *ret = cl;
        return 0;
fail:
        cfg_cluster_clear(&cl);
        return r;
}

/* ---- tasks ---------------------------------------------------------------------------------- */

const char *role_name(enum role r) {
        switch (r) {
        case ROLE_CHIEF: return "chief";
        case ROLE_PS: return "ps";
        case ROLE_WORKER: return "worker";
        case ROLE_EVALUATOR: return "evaluator";
        }
        return "unknown";
}

static int role_from_string(const char *s) {
        static const char *const roles[] = { [ROLE_CHIEF] = "chief", [ROLE_PS] = "ps", [ROLE_WORKER] = "worker",
                                             [ROLE_EVALUATOR] = "evaluator", NULL };
        if (!s)
                return -EINVAL;
        if (strcmp(s, "master") == 0)
                return ROLE_CHIEF;
        return cfg_lookup_choice(roles, s);
}

static uint32_t cluster_count(const struct cluster *cl, enum role r) {
        return r == ROLE_CHIEF ? cl->n_chief : r == ROLE_PS ? cl->n_ps : r == ROLE_EVALUATOR ? cl->n_evaluator
                                                                                              : cl->n_worker;
}

static int fail_index(const struct ctx *x, const char *key, const struct cluster *cl, enum role role, uint64_t i) {
        uint32_t n = cluster_count(cl, role);

        if (n == 0)   /* the evaluator, which a cluster may lack */
                return cfg_failf(x, key, "%s%" PRIu64 " is out of range: cluster has 0 %s tasks",
                                 key ? "" : "task index ", i, role_name(role));
        return cfg_failf(x, key, "%s%" PRIu64 " is out of range: cluster has %" PRIu32 " %s task%s (0..%" PRIu32 ")",
                     key ? "" : "task index ", i, n, role_name(role), n == 1 ? "" : "s", n - 1);
}

int config_parse_task(const struct job_config *c, const char *role, const char *index_str, struct task *ret,
                      char *err, size_t errlen) {
        const struct ctx x = { .origin = c->cluster_origin, .err = err, .errlen = errlen };
        char q[160];
        uint64_t i;
        int r;

        assert(c && ret);
        r = role_from_string(role);
        if (r < 0)
                return cfg_failf(&x, NULL, "task type %s is not one of chief, ps, worker, evaluator",
                             cfg_quote_str(role ? role : "", q, sizeof(q)));
        if (parse_u64(index_str, 0, UINT64_MAX, &i) < 0)
                return cfg_failf(&x, NULL, "task index %s is not a whole decimal number",
                             cfg_quote_str(index_str ? index_str : "", q, sizeof(q)));
        if (i >= cluster_count(&c->cluster, (enum role) r))
                return fail_index(&x, NULL, &c->cluster, (enum role) r, i);
        *ret = (struct task) { .role = (enum role) r, .index = (uint32_t) i };
        return 0;
}

/* Task i of role r in cl, or NULL. */
static const struct endpoint *config_endpoint_in(const struct cluster *cl, enum role r, uint64_t i) {
        return i < cluster_count(cl, r) ? &(r == ROLE_CHIEF ? cl->chief : r == ROLE_PS ? cl->ps
                                            : r == ROLE_EVALUATOR ? cl->evaluator : cl->worker)[i] : NULL;
}

const struct endpoint *config_endpoint(const struct job_config *c, struct task t) {
        return config_endpoint_in(&c->cluster, t.role, t.index);
}

/* One entry of sparseCluster (role: index into sparse_roles), task i at e. */
static const char *const sparse_roles[] = { "chief", "ps", "worker", "master", "evaluator", NULL };
enum { SPARSE_MASTER = 3, SPARSE_EVALUATOR = 4 };

static int check_sparse_entry(const struct ctx *x, const char *key, const json_t *e, int role, uint64_t i,
                              const struct cluster *file, uint32_t *n_eval) {
        char why[128], q[300], q2[300];
        struct endpoint ep;

        if (!json_is_string(e))
                return cfg_fail_type(x, key, "a \"host:port\" string", e);
        if (parse_hostport(json_string_value(e), &ep, why, sizeof(why)) < 0)
                return cfg_failf(x, key, "%s is not host:port (%s)", cfg_quote_json(e, q, sizeof(q)), why);
        if (role == SPARSE_EVALUATOR) {        /* counted: the job file's cluster need not list it */
                *n_eval = (uint32_t) i + 1 > *n_eval ? (uint32_t) i + 1 : *n_eval;
                return 0;
        }
        enum role r = role == SPARSE_MASTER ? ROLE_CHIEF : (enum role) role;
        const struct endpoint *f = config_endpoint_in(file, r, i);
        if (!f)
                return cfg_failf(x, key, "is not in the job file's cluster, which has %" PRIu32 " %s task%s",
                             cluster_count(file, r), role_name(r), cluster_count(file, r) == 1 ? "" : "s");
        if (f->port != ep.port || strcasecmp(f->host, ep.host) != 0)
                return cfg_failf(x, key, "%s disagrees with the job file's cluster.%s[%" PRIu64 "] %s",
                             cfg_quote_json(e, q, sizeof(q)), role_name(r), i, cfg_quote_str(f->addr, q2, sizeof(q2)));
        return 0;
}

/* The training-operator's sparseCluster: each task sees the ps and only itself ({"ps": [...], "worker":
 * {"1": "host:port"}}; a role's tasks as a list or as an object keyed by index). It cannot be the
 * cluster, so every entry it has must be the job file's; the evaluator's are counted (*n_eval raised to
 * one past the highest index). */
static int check_sparse_cluster(const struct ctx *x, const json_t *obj, const struct cluster *file, uint32_t *n_eval) {
        const char *name, *idx;
        json_t *list, *e;
        char key[160], q[300];
        int r;

        if (!json_is_object(obj))
                return cfg_fail_type(x, "sparseCluster", "an object", obj);
        json_object_foreach((json_t *) obj, name, list) {
                int role = cfg_lookup_choice(sparse_roles, name);

                snprintf(key, sizeof(key), "sparseCluster.%s", name);
                if (role < 0)
                        return cfg_failf(x, key, "unknown key");
                if (json_is_array(list)) {
                        for (size_t k = 0; k < json_array_size(list); k++) {
                                snprintf(key, sizeof(key), "sparseCluster.%s[%zu]", name, k);
                                if ((r = check_sparse_entry(x, key, json_array_get(list, k), role, k, file, n_eval)) < 0)
                                        return r;
                        }
                } else if (json_is_object(list)) {
                        json_object_foreach(list, idx, e) {
                                uint64_t i;

                                snprintf(key, sizeof(key), "sparseCluster.%s.%.40s", name, idx);
                                if (parse_u64(idx, 0, CONFIG_MAX_TASKS - 1, &i) < 0)
                                        return cfg_failf(x, key, "%s is not a task index (0 to %d)",
                                                     cfg_quote_str(idx, q, sizeof(q)), CONFIG_MAX_TASKS - 1);
                                if ((r = check_sparse_entry(x, key, e, role, i, file, n_eval)) < 0)
                                        return r;
                        }
                } else {
                        return cfg_fail_type(x, key, "an array or an object of \"host:port\" strings by index", list);
                }
        }
        return 0;
}

int config_apply_tf_config(struct job_config *c, const char *tf_config_json, struct task *task_ret,
                           bool *have_task, char *err, size_t errlen) {
        const struct ctx x = { .origin = "TF_CONFIG", .err = err, .errlen = errlen };
        struct cluster cl = { 0 };
        const struct cluster *eff = &c->cluster;
        struct task t = { 0 };
        bool got_task = false, got_cluster = false;
        uint32_t n_eval = c->cluster.n_evaluator;   /* the job file's, unless TF_CONFIG has a cluster */
        json_t *root = NULL, *v;
        const char *name;
        char q[160];
        int r;

        assert(c);
        if (!tf_config_json || !*tf_config_json) {
                if (have_task)
                        *have_task = false;
                return 0;
        }
        r = cfg_load_json(&x, tf_config_json, strlen(tf_config_json), &root);
        if (r < 0)
                return r;
        if (!json_is_object(root)) {
                char d[160];
                r = cfg_failf(&x, NULL, "expected an object at the top level, got %s", cfg_describe(root, d, sizeof(d)));
                goto out;
        }
        json_object_foreach(root, name, v) {
                if (strcmp(name, "cluster") == 0 || strcmp(name, "task") == 0 || strcmp(name, "sparseCluster") == 0)
                        continue;
                if (strcmp(name, "environment") == 0) { /* TensorFlow's "cloud" marker; nothing to do */
                        if (!json_is_string(v)) {
                                r = cfg_fail_type(&x, name, "a string", v);
                                goto out;
                        }
                        continue;
                }
                if (strcmp(name, "rpc_layer") == 0) {
                        if (!json_is_string(v) || strcmp(json_string_value(v), "grpc") != 0) {
                                r = cfg_failf(&x, name, "%s is not \"grpc\"", cfg_quote_json(v, q, sizeof(q)));
                                goto out;
                        }
                        continue;
                }
                r = cfg_failf(&x, name, "unknown key");
                goto out;
        }

        v = json_object_get(root, "cluster");
        if (v && json_object_get(root, "sparseCluster")) {
                r = cfg_failf(&x, "sparseCluster", "conflicts with cluster (give one of them)");
                goto out;
        }
        if (v) {
                if ((r = cfg_parse_cluster(&x, v, &cl)) < 0)
                        goto out;
                n_eval = cl.n_evaluator;
                got_cluster = true;
                eff = &cl;
        }
        v = json_object_get(root, "sparseCluster");
        if (v && (r = check_sparse_cluster(&x, v, &c->cluster, &n_eval)) < 0)
                goto out;

        v = json_object_get(root, "task");
        if (v) {
                const json_t *type, *index;
                json_int_t i = 0;
                bool evaluator;
                int role;

                if (!json_is_object(v)) {
                        r = cfg_fail_type(&x, "task", "an object", v);
                        goto out;
                }
                json_object_foreach(v, name, type) {
                        if (strcmp(name, "type") != 0 && strcmp(name, "index") != 0 &&
                            strcmp(name, "trial") != 0) {
                                char key[96];
                                snprintf(key, sizeof(key), "task.%s", name);
                                r = cfg_failf(&x, key, "unknown key");
                                goto out;
                        }
                }
                type = json_object_get(v, "type");
                if (!type) {
                        r = cfg_failf(&x, "task.type", "missing");
                        goto out;
                }
                if (!json_is_string(type)) {
                        r = cfg_fail_type(&x, "task.type", "a string", type);
                        goto out;
                }
                evaluator = strcmp(json_string_value(type), "evaluator") == 0;
                role = role_from_string(json_string_value(type));
                if (role < 0) {
                        r = cfg_failf(&x, "task.type", "%s is not one of chief, master, ps, worker, evaluator",
                                  cfg_quote_json(type, q, sizeof(q)));
                        goto out;
                }
                index = json_object_get(v, "index");
                if (index) {
                        if (!json_is_integer(index)) {
                                r = cfg_fail_type(&x, "task.index", "an integer", index);
                                goto out;
                        }
                        i = json_integer_value(index);
                        if (i < 0) {
                                r = cfg_failf(&x, "task.index", "%" JSON_INTEGER_FORMAT " is negative", i);
                                goto out;
                        }
                }
                if (evaluator && (uint64_t) i >= n_eval) {
                        /* the cluster's, or sparseCluster's (which the job file's cluster may lack) */
                        r = cfg_failf(&x, "task.index", "%" JSON_INTEGER_FORMAT " is out of range: cluster has %"
                                  PRIu32 " evaluator task%s", i, n_eval, n_eval == 1 ? "" : "s");
                        goto out;
                }
                if (!evaluator && (uint64_t) i >= cluster_count(eff, (enum role) role)) {
                        r = fail_index(&x, "task.index", eff, (enum role) role, (uint64_t) i);
                        goto out;
                }
                t = (struct task) { .role = (enum role) role, .index = (uint32_t) i };
                got_task = true;
        }

        if (got_cluster && (r = cfg_check_training(&x, &c->training, cl.n_worker)) < 0)
                goto out;
        if (got_cluster) {
                char *o = strdup("TF_CONFIG");
                if (!o) {
                        r = cfg_fail_oom(&x);
                        goto out;
                }
                free(c->cluster_origin);
                c->cluster_origin = o;
                cfg_cluster_clear(&c->cluster);
                c->cluster = cl;
                memset(&cl, 0, sizeof(cl));
        }
        if (got_task && task_ret)
                *task_ret = t;
        if (have_task)
                *have_task = got_task;
        r = 0;
out:
        cfg_cluster_clear(&cl);
        json_decref(root);
        return r;
}

int config_parse_instance(const char *instance, char **job_ret, int64_t *index_ret, bool *backup_ret) {
        const char *colon;
        char *job;
        uint64_t i = 0;
        int64_t idx = -1;
        bool backup = false;

        if (!instance || !job_ret || !index_ret)
                return -EINVAL;
        colon = strchr(instance, ':');
        if (colon) {
                /* JOB:N:backup (psd only: backup_ret given): the index up to the second colon */
                const char *second = strchr(colon + 1, ':');
                char num[24];
                if (second) {
                        if (!backup_ret || strcmp(second + 1, "backup") != 0 ||
                            (size_t)(second - colon - 1) >= sizeof(num))
                                return -EINVAL;
                        memcpy(num, colon + 1, (size_t)(second - colon - 1));
                        num[second - colon - 1] = 0;
                        backup = true;
                }
                if (parse_u64(second ? num : colon + 1, 0, INT32_MAX, &i) < 0)
                        return -EINVAL;
                idx = (int64_t) i;
        }
        job = colon ? strndup(instance, (size_t) (colon - instance)) : strdup(instance);
        if (!job)
                return -ENOMEM;
        if (!config_job_name_valid(job)) {
                free(job);
                return -EINVAL;
        }
        *job_ret = job;
        *index_ret = idx;
        if (backup_ret)
                *backup_ret = backup;
        return 0;
}
