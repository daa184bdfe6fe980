/* Harness: Slurm's values (slurm.c) as a launched task reads them. The first byte picks the entry point:
 * 'h' a host list, 't' tasks per node, anything else the whole placement from newline-separated
 * SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE and the GPUs.
 * What is accepted must be what slurm.h promises: bounded, well-formed names, every rank placed once. */
#include <ctype.h>

#include "fuzz_util.h"
#include "slurm.h"

static void check_hosts(const char *s) {
        char **h = NULL, why[256];
        size_t n = 0;
        if (slurm_expand_hostlist(s, &h, &n, why, sizeof(why)) < 0)
                return;
        FUZZ_CHECK(n >= 1 && n <= SLURM_MAX_HOSTS, "%zu hosts", n);
        for (size_t i = 0; i < n; i++) {
                size_t len = strlen(h[i]);
                FUZZ_CHECK(len >= 1 && len <= SLURM_HOST_MAX, "host %zu is %zu characters", i, len);
                for (size_t k = 0; k < len; k++)
                        FUZZ_CHECK(isalnum((unsigned char)h[i][k]) || strchr(".-_", h[i][k]), "host %zu: bad character", i);
        }
        slurm_hosts_free(h, n);
}

static void check_tasks(const char *s) {
        uint32_t *v = NULL;
        size_t n = 0;
        uint64_t total = 0;
        char why[256];
        if (slurm_expand_tasks_per_node(s, &v, &n, why, sizeof(why)) < 0)
                return;
        FUZZ_CHECK(n >= 1 && n <= SLURM_MAX_HOSTS, "%zu nodes", n);
        for (size_t i = 0; i < n; i++) {
                FUZZ_CHECK(v[i] >= 1, "node %zu has no task", i);
                total += v[i];
        }
        FUZZ_CHECK(total <= SLURM_MAX_TASKS, "%llu tasks", (unsigned long long)total);
        free(v);
}

static void check_resolve(char *s) {
        char *field[5] = {NULL};
        for (int i = 0; i < 5 && s; i++) {
                field[i] = s;
                s = strchr(s, '\n');
                if (s)
                        *s++ = 0;
        }
        const struct slurm_job jobs[] = {{"worker", 2}, {"ps", 2}, {"chief", 1}};
        struct slurm_alloc a = {field[0], field[1], field[2], field[3], field[4]};
        struct slurm_cluster *c = NULL;
        enum slurm_var var;
        char why[256];
        if (slurm_resolve(&a, jobs, 3, 8888, &c, &var, why, sizeof(why)) < 0)
                return;
        FUZZ_CHECK(c->n_tasks == 5 && c->self < c->n_tasks, "%zu tasks, self %zu", c->n_tasks, c->self);
        /* jobs sorted by name, each one's indices 0.. in turn */
        static const char *const order[] = {"chief", "ps", "ps", "worker", "worker"};
        static const uint32_t index[] = {0, 0, 1, 0, 1};
        for (size_t i = 0; i < c->n_tasks; i++) {
                FUZZ_CHECK(strcmp(c->tasks[i].job, order[i]) == 0 && c->tasks[i].index == index[i], "rank %zu is %s:%u",
                           i, c->tasks[i].job, c->tasks[i].index);
                const char *colon = strrchr(c->tasks[i].addr, ':');
                FUZZ_CHECK(colon && colon > c->tasks[i].addr && atoi(colon + 1) >= 8888, "rank %zu at %s", i,
                           c->tasks[i].addr);
        }
        FUZZ_CHECK(!c->gpus || (*c->gpus && field[4] && strstr(field[4], c->gpus)), "gpus %s", c->gpus);
        slurm_cluster_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size == 0)
                return 0;
        char *s = fuzz_string(data + 1, size - 1);
        if (data[0] == 'h')
                check_hosts(s);
        else if (data[0] == 't')
                check_tasks(s);
        else
                check_resolve(s);
        free(s);
        return 0;
}
