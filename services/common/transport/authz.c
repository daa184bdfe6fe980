/* Who may call what. The table below is the only place that says which role may call which method;
 * docs/security.md has it as printed by authz_print_table (test_authz keeps the two equal). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "authz.h"
#include "util.h"

#define PS "/psfleet.v1.ParameterServer/"
#define SUP "/psfleet.v1.Supervisor/"
#define WRK "/psfleet.v1.Worker/"

static const struct authz_rule rules[] = {
        {PS "Push", AUTHZ_WORKER, "only as itself: the worker the header names is the certificate's"},
        {PS "AttachSharedMemory", AUTHZ_WORKER,
         "only for the worker the certificate names, over psd's unix socket on the same host"},
        {PS "Pull", AUTHZ_WORKER | AUTHZ_CHIEF, NULL},
        {PS "Assign", AUTHZ_CHIEF, NULL},
        {PS "SparseExchange", AUTHZ_WORKER | AUTHZ_CHIEF,
         "the chief only to look rows up (evaluation): nothing pushed or created"},
        {PS "SparseExport", AUTHZ_CHIEF, NULL},
        {PS "SparseImport", AUTHZ_CHIEF, NULL},
        {PS "Stop", AUTHZ_CHIEF, NULL},
        {PS "Replicate", AUTHZ_PS, "only from the other psd of the same shard (ps.replicas 2)"},
        {PS "SetRole", AUTHZ_CHIEF, NULL},
        {PS "GetShardStatus", AUTHZ_ANY, NULL},
        {SUP "Join", AUTHZ_WORKER, "only as the worker the certificate names"},
        {SUP "Report", AUTHZ_WORKER, "only as the worker the certificate names"},
        {SUP "GetStatus", AUTHZ_ANY, NULL},
        {SUP "Watch", AUTHZ_ANY, NULL},
        {SUP "ListCheckpoints", AUTHZ_ANY, NULL},
        {SUP "Stop", AUTHZ_ADMIN, NULL},
        {SUP "Restart", AUTHZ_ADMIN, NULL},
        {SUP "SaveCheckpoint", AUTHZ_ADMIN, NULL},
        {SUP "DeleteCheckpoint", AUTHZ_ADMIN, NULL},
        {SUP "Export", AUTHZ_CHIEF | AUTHZ_ADMIN, "written into the chief's state directory, never to a path the caller names"},
        {WRK "GetWorkerStatus", AUTHZ_ANY, NULL},
        {WRK "Stop", AUTHZ_CHIEF, NULL},
        {"/grpc.health.v1.Health/Check", AUTHZ_ANY, NULL},
        {"GET /metrics", AUTHZ_ANY, "HTTPS on metrics.listen, the client certificate checked as for gRPC"},
};

static const char *const role_names[] = {
        [PEER_UNKNOWN] = "unknown", [PEER_INSECURE] = "insecure", [PEER_CHIEF] = "chief", [PEER_PS] = "ps",
        [PEER_WORKER] = "worker", [PEER_ADMIN] = "admin", [PEER_VIEWER] = "viewer", [PEER_EVALUATOR] = "evaluator",
};

static void describe_allow(unsigned allow, char *buf, size_t len);

void authz_print_table(FILE *f) {
        fprintf(f, "| Method | Who may call it | Checked besides the role |\n| --- | --- | --- |\n");
        for (size_t i = 0; i < ELEMENTSOF(rules); i++) {
                char who[96];
                const char *svc = strstr(rules[i].method, ".v1.");
                describe_allow(rules[i].allow, who, sizeof(who));
                fprintf(f, "| `%s` | %s | %s |\n", svc ? svc + 4 : rules[i].method + (rules[i].method[0] == '/'), who,
                        rules[i].note ? rules[i].note : "");
        }
}

const struct authz_rule *authz_rules(size_t *n) {
        *n = ELEMENTSOF(rules);
        return rules;
}

static bool indexed(enum peer_role role) {
        return role == PEER_PS || role == PEER_WORKER;
}

void authz_task_name(enum peer_role role, uint32_t index, char *buf, size_t len) {
        const char *n = (size_t)role < ELEMENTSOF(role_names) ? role_names[role] : "unknown";
        if (indexed(role))
                snprintf(buf, len, "%s-%" PRIu32, n, index);
        else
                snprintf(buf, len, "%s", n);
}

int authz_parse_task(const char *task, enum peer_role *role, uint32_t *index) {
        static const enum peer_role parsable[] = {PEER_CHIEF, PEER_PS, PEER_WORKER, PEER_ADMIN, PEER_VIEWER,
                                                  PEER_EVALUATOR};
        if (!task)
                return -EINVAL;
        for (size_t i = 0; i < ELEMENTSOF(parsable); i++) {
                const char *n = role_names[parsable[i]];
                size_t l = strlen(n);
                if (strncmp(task, n, l) != 0)
                        continue;
                const char *rest = task + l;
                uint32_t idx = 0;
                if (*rest == '-' || *rest == ':') {
                        char *end;
                        if (rest[1] < '0' || rest[1] > '9')
                                return -EINVAL;
                        errno = 0;
                        unsigned long long v = strtoull(rest + 1, &end, 10);
                        if (errno || *end || v > UINT32_MAX || (rest[1] == '0' && rest[2]))
                                return -EINVAL;
                        /* "chief:0" is the chief; "admin-1" is nothing */
                        if (!indexed(parsable[i]) && !(parsable[i] == PEER_CHIEF && *rest == ':' && v == 0))
                                return -EINVAL;
                        idx = (uint32_t)v;
                } else if (*rest || indexed(parsable[i])) {
                        return -EINVAL;
                }
                *role = parsable[i];
                *index = idx;
                return 0;
        }
        return -EINVAL;
}

int authz_dns_name(const char *job, const char *task, char *buf, size_t len) {
        int n = snprintf(buf, len, "%s.%s.psfleet", task, job);
        return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

void authz_peer_from_names(const char *job, const char *const *names, size_t n, struct peer *p) {
        size_t jl = strlen(job);
        memset(p, 0, sizeof(*p));
        p->role = PEER_UNKNOWN;
        for (size_t i = 0; i < n; i++) {
                const char *s = names[i];
                const char *dot = s ? strchr(s, '.') : NULL;
                size_t l = s ? strlen(s) : 0;
                /* TASK "." JOB ".psfleet" */
                if (!dot || l != (size_t)(dot - s) + 1 + jl + 8 || strncasecmp(dot + 1, job, jl) != 0 ||
                    strcasecmp(dot + 1 + jl, ".psfleet") != 0)
                        continue;
                char task[AUTHZ_TASK_MAX];
                if ((size_t)(dot - s) >= sizeof(task))
                        continue;
                memcpy(task, s, (size_t)(dot - s));
                task[dot - s] = '\0';
                enum peer_role role;
                uint32_t index;
                if (authz_parse_task(task, &role, &index) < 0 || strchr(task, ':'))
                        continue;
                p->role = role;
                p->index = index;
                if (indexed(role))
                        snprintf(p->name, sizeof(p->name), "%s/%" PRIu32, role_names[role], index);
                else
                        snprintf(p->name, sizeof(p->name), "%s", role_names[role]);
                return;
        }
        int o = snprintf(p->name, sizeof(p->name), "unknown (no name of job %s among", job);
        for (size_t i = 0; i < n && o > 0 && (size_t)o < sizeof(p->name); i++)
                o += snprintf(p->name + o, sizeof(p->name) - (size_t)o, " %s", names[i] ? names[i] : "?");
        if (o > 0 && (size_t)o < sizeof(p->name))
                snprintf(p->name + o, sizeof(p->name) - (size_t)o, "%s)", n ? "" : " none");
}

unsigned authz_allowed(const char *method) {
        for (size_t i = 0; i < ELEMENTSOF(rules); i++)
                if (strcmp(rules[i].method, method) == 0)
                        return rules[i].allow;
        return 0;
}

static void describe_allow(unsigned allow, char *buf, size_t len) {
        size_t o = 0;
        buf[0] = '\0';
        if (allow == AUTHZ_ANY) {
                snprintf(buf, len, "any role (chief, ps, worker, evaluator, admin, viewer)");
                return;
        }
        for (int r = PEER_CHIEF; r <= PEER_EVALUATOR && o < len; r++)
                if (allow & (1u << r)) {
                        int n = snprintf(buf + o, len - o, "%s%s", o ? ", " : "", role_names[r]);
                        if (n < 0)
                                break;
                        o += (size_t)n;
                }
        if (o == 0)
                snprintf(buf, len, "nobody");
}

int authz_check(const char *method, const struct peer *p, char *why, size_t whylen) {
        unsigned allow = authz_allowed(method);
        if (p->role == PEER_INSECURE && allow)
                return 0;
        if (allow && p->role != PEER_UNKNOWN && (allow & (1u << p->role)))
                return 0;
        if (why) {
                char who[64];
                const char *svc = strstr(method, ".v1.");
                const char *shown = svc ? svc + 4 : method;     /* "ParameterServer/Push" */
                describe_allow(allow, who, sizeof(who));
                if (p->role == PEER_UNKNOWN)
                        snprintf(why, whylen, "%s may not call %s: its certificate names no task of this job",
                                 p->name, shown);
                else
                        snprintf(why, whylen, "%s may not call %s: %s only", p->name, shown, who);
        }
        return -EPERM;
}

bool authz_peer_is(const struct peer *p, enum peer_role role, uint32_t index) {
        return p->role == PEER_INSECURE || (p->role == role && (!indexed(role) || p->index == index));
}
