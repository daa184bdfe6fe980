/* Slurm's host lists and task counts, and a cluster placed over them as SlurmClusterResolver does:
 * see slurm.h. */
#include "slurm.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define NUM_DIGITS_MAX 18       /* a range bound: parse_u64 cannot overflow, a width stays printable */

struct strv {
        char **v;
        size_t n, cap;
};

static void strv_clear(struct strv *s) {
        slurm_hosts_free(s->v, s->n);
        *s = (struct strv){0};
}

static int strv_push(struct strv *s, char *p) {
        if (!p)
                return -ENOMEM;
        if (s->n == s->cap) {
                size_t cap = s->cap ? s->cap * 2 : 8;
                char **v = realloc(s->v, cap * sizeof(*v));
                if (!v) {
                        free(p);
                        return -ENOMEM;
                }
                s->v = v;
                s->cap = cap;
        }
        s->v[s->n++] = p;
        return 0;
}

char **slurm_hosts_free(char **hosts, size_t n) {
        for (size_t i = 0; hosts && i < n; i++)
                free(hosts[i]);
        free(hosts);
        return NULL;
}

static bool host_char_ok(char c) {
        return isalnum((unsigned char)c) || c == '.' || c == '-' || c == '_';
}

static int fail(char *why, size_t whylen, int r, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *why, size_t whylen, int r, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        if (why && whylen)
                vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
        return r;
}

/* A whole decimal number of at most NUM_DIGITS_MAX digits, s[0..len). */
static int parse_num(const char *s, size_t len, uint64_t *ret) {
        char buf[NUM_DIGITS_MAX + 1];
        if (len == 0 || len > NUM_DIGITS_MAX)
                return -EINVAL;
        for (size_t i = 0; i < len; i++)
                if (!isdigit((unsigned char)s[i]))
                        return -EINVAL;
        memcpy(buf, s, len);
        buf[len] = 0;
        return parse_u64(buf, 0, UINT64_MAX, ret);
}

/* Expands one name of the list, s[0..len), which may hold bracket groups, appending to out (which holds
 * `have` names from the list's earlier names, counted against SLURM_MAX_HOSTS). */
static int expand_name(const char *s, size_t len, size_t have, struct strv *out, char *why, size_t whylen) {
        const char *open = memchr(s, '[', len);
        int r;
        if (!open) {
                if (len == 0)
                        return fail(why, whylen, -EINVAL, "an empty host name");
                if (len > SLURM_HOST_MAX)
                        return fail(why, whylen, -EINVAL, "a host name longer than %d characters", SLURM_HOST_MAX);
                for (size_t i = 0; i < len; i++)
                        if (!host_char_ok(s[i]))
                                return fail(why, whylen, -EINVAL, "'%c' in a host name", s[i]);
                if (have + out->n >= SLURM_MAX_HOSTS)
                        return fail(why, whylen, -E2BIG, "more than %d hosts", SLURM_MAX_HOSTS);
                return strv_push(out, strndup(s, len));
        }
        const char *close = memchr(open, ']', len - (size_t)(open - s));
        if (!close)
                return fail(why, whylen, -EINVAL, "'[' without ']'");
        size_t plen = (size_t)(open - s);
        for (size_t i = 0; i < plen; i++)
                if (!host_char_ok(s[i]))
                        return fail(why, whylen, -EINVAL, "'%c' in a host name", s[i]);
        /* what follows the group, expanded once; each number of the group takes each of them */
        struct strv rest = {0};
        const char *after = close + 1;
        size_t alen = len - (size_t)(after - s);
        if (alen == 0)
                r = strv_push(&rest, strdup(""));
        else
                r = expand_name(after, alen, 0, &rest, why, whylen);
        if (r < 0)
                goto out;
        const char *p = open + 1;
        if (p == close) {
                r = fail(why, whylen, -EINVAL, "an empty range \"[]\"");
                goto out;
        }
        while (p < close) {
                const char *end = memchr(p, ',', (size_t)(close - p));
                if (!end)
                        end = close;
                const char *dash = memchr(p, '-', (size_t)(end - p));
                const char *hi_s = dash ? dash + 1 : p;
                size_t lo_len = (size_t)((dash ? dash : end) - p), hi_len = (size_t)(end - hi_s);
                uint64_t lo, hi;
                if (parse_num(p, lo_len, &lo) < 0 || parse_num(hi_s, hi_len, &hi) < 0) {
                        r = fail(why, whylen, -EINVAL, "\"%.*s\" is not a number or a range N-M",
                                 (int)(end - p > 40 ? 40 : end - p), p);
                        goto out;
                }
                if (hi < lo) {
                        r = fail(why, whylen, -EINVAL, "the range %.*s runs backwards", (int)(end - p > 40 ? 40 : end - p), p);
                        goto out;
                }
                if (hi - lo >= SLURM_MAX_HOSTS || (hi - lo + 1) * rest.n > SLURM_MAX_HOSTS - (have + out->n)) {
                        r = fail(why, whylen, -E2BIG, "more than %d hosts", SLURM_MAX_HOSTS);
                        goto out;
                }
                for (uint64_t v = lo; v <= hi; v++)
                        for (size_t j = 0; j < rest.n; j++) {
                                char *h = strdup_printf("%.*s%0*llu%s", (int)plen, s, (int)lo_len,
                                                        (unsigned long long)v, rest.v[j]);
                                if (h && strlen(h) > SLURM_HOST_MAX) {
                                        free(h);
                                        r = fail(why, whylen, -EINVAL, "a host name longer than %d characters",
                                                 SLURM_HOST_MAX);
                                        goto out;
                                }
                                if ((r = strv_push(out, h)) < 0)
                                        goto out;
                        }
                p = end < close ? end + 1 : close;
                if (end < close && p == close) {
                        r = fail(why, whylen, -EINVAL, "a ',' before ']'");
                        goto out;
                }
        }
        r = 0;
out:
        strv_clear(&rest);
        return r;
}

int slurm_expand_hostlist(const char *s, char ***hosts_ret, size_t *n_ret, char *why, size_t whylen) {
        struct strv out = {0};
        int r;
        if (!s || !*s)
                return fail(why, whylen, -EINVAL, "empty");
        /* names are split at the commas outside brackets */
        for (const char *p = s;;) {
                const char *e = p;
                int depth = 0;
                for (; *e && (depth || *e != ','); e++) {
                        if (*e == '[' && depth++)
                                return strv_clear(&out), fail(why, whylen, -EINVAL, "'[' inside brackets");
                        if (*e == ']' && --depth < 0)
                                return strv_clear(&out), fail(why, whylen, -EINVAL, "']' without '['");
                }
                struct strv one = {0};
                r = expand_name(p, (size_t)(e - p), out.n, &one, why, whylen);
                for (size_t i = 0; r >= 0 && i < one.n; i++) {
                        r = strv_push(&out, one.v[i]);
                        one.v[i] = NULL;
                }
                strv_clear(&one);
                if (r < 0) {
                        strv_clear(&out);
                        return r;
                }
                if (!*e)
                        break;
                p = e + 1;
        }
        *hosts_ret = out.v;
        *n_ret = out.n;
        return 0;
}

int slurm_expand_tasks_per_node(const char *s, uint32_t **ret, size_t *n_ret, char *why, size_t whylen) {
        uint32_t *v = NULL;
        size_t n = 0, cap = 0;
        uint64_t total = 0;
        int r;
        if (!s || !*s)
                return fail(why, whylen, -EINVAL, "empty");
        for (const char *p = s;;) {
                const char *e = strchr(p, ',');
                if (!e)
                        e = p + strlen(p);
                const char *paren = memchr(p, '(', (size_t)(e - p));
                uint64_t count, times = 1;
                if (parse_num(p, (size_t)((paren ? paren : e) - p), &count) < 0 || count == 0 ||
                    count > SLURM_MAX_TASKS) {
                        r = fail(why, whylen, -EINVAL, "\"%.*s\" is not a task count (1 to %d), or N(xR)",
                                 (int)(e - p > 40 ? 40 : e - p), p, SLURM_MAX_TASKS);
                        goto bad;
                }
                if (paren && (e - paren < 4 || paren[1] != 'x' || e[-1] != ')' ||
                              parse_num(paren + 2, (size_t)(e - 1 - (paren + 2)), &times) < 0 || times == 0)) {
                        r = fail(why, whylen, -EINVAL, "\"%.*s\" is not N(xR) with R a whole number from 1",
                                 (int)(e - p > 40 ? 40 : e - p), p);
                        goto bad;
                }
                if (times > SLURM_MAX_HOSTS - n) {
                        r = fail(why, whylen, -E2BIG, "more than %d nodes", SLURM_MAX_HOSTS);
                        goto bad;
                }
                total += count * times;
                if (total > SLURM_MAX_TASKS) {
                        r = fail(why, whylen, -E2BIG, "more than %d tasks", SLURM_MAX_TASKS);
                        goto bad;
                }
                if (n + times > cap) {
                        size_t c = cap ? cap : 8;
                        while (c < n + times)
                                c *= 2;
                        uint32_t *nv = realloc(v, c * sizeof(*nv));
                        if (!nv) {
                                r = -ENOMEM;
                                goto bad;
                        }
                        v = nv;
                        cap = c;
                }
                for (uint64_t i = 0; i < times; i++)
                        v[n++] = (uint32_t)count;
                if (!*e)
                        break;
                p = e + 1;
        }
        *ret = v;
        *n_ret = n;
        return 0;
bad:
        free(v);
        return r;
}

const char *slurm_var_name(enum slurm_var v) {
        switch (v) {
        case SLURM_VAR_PROCID: return "SLURM_PROCID";
        case SLURM_VAR_NUM_TASKS: return "SLURM_STEP_NUM_TASKS";
        case SLURM_VAR_NODELIST: return "SLURM_STEP_NODELIST";
        case SLURM_VAR_TASKS_PER_NODE: return "SLURM_STEP_TASKS_PER_NODE";
        case SLURM_VAR_GPUS: return "the step's GPUs";
        case SLURM_VAR_JOBS: return "the roles";
        }
        return "?";
}

struct slurm_cluster *slurm_cluster_free(struct slurm_cluster *c) {
        if (c) {
                free(c->tasks);
                free(c->gpus);
                free(c);
        }
        return NULL;
}

/* This task's share of the node's GPUs: the k-th run of n / max_per_node names of the list. */
static int gpu_share(const char *gpus, uint32_t max_per_node, uint32_t k, char **ret, char *why, size_t whylen) {
        size_t n = 0, starts[SLURM_MAX_TASKS];
        *ret = NULL;
        for (const char *p = gpus;; p++) {
                if (p == gpus || p[-1] == ',') {
                        if (n == SLURM_MAX_TASKS)
                                return fail(why, whylen, -E2BIG, "more than %d GPUs", SLURM_MAX_TASKS);
                        starts[n++] = (size_t)(p - gpus);
                }
                if (*p == ',' || !*p) {
                        if (p == gpus + starts[n - 1])
                                return fail(why, whylen, -EINVAL, "an empty GPU name");
                        if (!*p)
                                break;
                } else if (!isalnum((unsigned char)*p) && *p != '-') {
                        return fail(why, whylen, -EINVAL, "'%c' in a GPU name", *p);
                }
        }
        size_t per_task = n / max_per_node;
        if (per_task == 0)
                return 0;       /* fewer GPUs than tasks on a node: each task keeps the step's own */
        size_t first = (size_t)k * per_task, last = first + per_task - 1;
        size_t end = last + 1 < n ? starts[last + 1] - 1 : strlen(gpus);
        *ret = strndup(gpus + starts[first], end - starts[first]);
        return *ret ? 0 : -ENOMEM;
}

static int by_name(const void *a, const void *b) {
        return strcmp(((const struct slurm_job *)a)->name, ((const struct slurm_job *)b)->name);
}

int slurm_resolve(const struct slurm_alloc *a, const struct slurm_job *jobs, size_t n_jobs, uint16_t port_base,
                  struct slurm_cluster **ret, enum slurm_var *var, char *why, size_t whylen) {
        char **hosts = NULL;
        uint32_t *tpn = NULL;
        size_t n_hosts = 0, n_tpn = 0;
        struct slurm_job *sorted = NULL;
        struct slurm_cluster *c = NULL;
        uint64_t rank, num, sum = 0, need = 0;
        uint32_t max_tpn = 0;
        int r;

        *var = SLURM_VAR_PROCID;
        if (!a->procid || parse_u64(a->procid, 0, SLURM_MAX_TASKS - 1, &rank) < 0)
                return fail(why, whylen, -EINVAL, a->procid ? "not a rank from 0 to %d" : "not set (not a task srun started?)",
                            SLURM_MAX_TASKS - 1);
        *var = SLURM_VAR_NUM_TASKS;
        if (!a->num_tasks || parse_u64(a->num_tasks, 1, SLURM_MAX_TASKS, &num) < 0)
                return fail(why, whylen, -EINVAL, a->num_tasks ? "not a task count from 1 to %d" : "not set",
                            SLURM_MAX_TASKS);
        *var = SLURM_VAR_NODELIST;
        if (!a->nodelist)
                return fail(why, whylen, -EINVAL, "not set");
        if ((r = slurm_expand_hostlist(a->nodelist, &hosts, &n_hosts, why, whylen)) < 0)
                return r;
        *var = SLURM_VAR_TASKS_PER_NODE;
        if (!a->tasks_per_node) {
                r = fail(why, whylen, -EINVAL, "not set");
                goto out;
        }
        if ((r = slurm_expand_tasks_per_node(a->tasks_per_node, &tpn, &n_tpn, why, whylen)) < 0)
                goto out;
        if (n_tpn != n_hosts) {
                r = fail(why, whylen, -EINVAL, "counts tasks on %zu node%s, SLURM_STEP_NODELIST lists %zu", n_tpn,
                         n_tpn == 1 ? "" : "s", n_hosts);
                goto out;
        }
        for (size_t i = 0; i < n_tpn; i++) {
                sum += tpn[i];
                max_tpn = tpn[i] > max_tpn ? tpn[i] : max_tpn;
        }
        if (sum != num) {
                r = fail(why, whylen, -EINVAL, "adds up to %llu tasks, SLURM_STEP_NUM_TASKS says %llu",
                         (unsigned long long)sum, (unsigned long long)num);
                goto out;
        }
        if ((uint64_t)port_base + max_tpn - 1 > 65535) {
                r = fail(why, whylen, -EINVAL, "%u tasks on a node from port %u run past port 65535", max_tpn, port_base);
                goto out;
        }
        *var = SLURM_VAR_PROCID;
        if (rank >= num) {
                r = fail(why, whylen, -EINVAL, "rank %llu is not below SLURM_STEP_NUM_TASKS=%llu",
                         (unsigned long long)rank, (unsigned long long)num);
                goto out;
        }
        *var = SLURM_VAR_JOBS;
        for (size_t j = 0; j < n_jobs; j++)
                need += jobs[j].count;
        if (need != num) {
                r = fail(why, whylen, -EINVAL, "they need %llu tasks, the step has %llu (%s)", (unsigned long long)need,
                         (unsigned long long)num, need > num ? "too few: ask srun for more" : "one task per role: fewer");
                goto out;
        }
        sorted = malloc((n_jobs ? n_jobs : 1) * sizeof(*sorted));
        c = calloc(1, sizeof(*c));
        if (!sorted || !c || !(c->tasks = calloc(num, sizeof(*c->tasks)))) {
                r = -ENOMEM;
                goto out;
        }
        memcpy(sorted, jobs, n_jobs * sizeof(*sorted));
        qsort(sorted, n_jobs, sizeof(*sorted), by_name);
        /* rank order: the hosts in the list's order, each host's tasks in turn (block layout) */
        size_t t = 0;
        uint32_t self_k = 0;
        for (size_t h = 0; h < n_hosts; h++)
                for (uint32_t k = 0; k < tpn[h]; k++, t++) {
                        snprintf(c->tasks[t].addr, sizeof(c->tasks[t].addr), "%s:%u", hosts[h], port_base + k);
                        if (t == rank)
                                self_k = k;
                }
        t = 0;
        for (size_t j = 0; j < n_jobs; j++)
                for (uint32_t i = 0; i < sorted[j].count; i++, t++) {
                        /* point into the caller's array, not our sorted copy */
                        for (size_t o = 0; o < n_jobs; o++)
                                if (strcmp(jobs[o].name, sorted[j].name) == 0)
                                        c->tasks[t].job = jobs[o].name;
                        c->tasks[t].index = i;
                }
        c->n_tasks = num;
        c->self = rank;
        *var = SLURM_VAR_GPUS;
        if (a->gpus && *a->gpus && (r = gpu_share(a->gpus, max_tpn, self_k, &c->gpus, why, whylen)) < 0)
                goto out;
        *ret = c;
        c = NULL;
        r = 0;
out:
        slurm_cluster_free(c);
        free(sorted);
        free(tpn);
        slurm_hosts_free(hosts, n_hosts);
        return r;
}
