/* Tests of slurm.c: host lists and tasks per node against SlurmClusterResolver's own cases
 * (tensorflow/python/distribute/cluster_resolver/slurm_cluster_resolver_test.py), its placements of
 * ranks, ports and GPUs, and the values that must be refused with a reason. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "unit.h"

#include "slurm.h"

/* The expansion of s joined by spaces, or "ERR <r>: <why>". */
static char *hosts(const char *s) {
        static char out[65536];
        char **h = NULL, why[256] = "";
        size_t n = 0;
        int r = slurm_expand_hostlist(s, &h, &n, why, sizeof(why));
        if (r < 0) {
                snprintf(out, sizeof(out), "ERR %d: %s", r, why);
                return out;
        }
        out[0] = 0;
        for (size_t i = 0; i < n; i++) {
                strcat(out, i ? " " : "");
                strcat(out, h[i]);
        }
        slurm_hosts_free(h, n);
        return out;
}

static char *tasks(const char *s) {
        static char out[65536];
        uint32_t *v = NULL;
        size_t n = 0;
        char why[256] = "";
        int r = slurm_expand_tasks_per_node(s, &v, &n, why, sizeof(why));
        if (r < 0) {
                snprintf(out, sizeof(out), "ERR %d: %s", r, why);
                return out;
        }
        out[0] = 0;
        for (size_t i = 0; i < n; i++)
                snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s%u", i ? " " : "", v[i]);
        free(v);
        return out;
}

static void test_expand_hostlist(void **state) {
        (void)state;
        /* SlurmClusterResolver's test_expand_hostlist */
        assert_string_equal(hosts("n1"), "n1");
        assert_string_equal(hosts("n[1,3]"), "n1 n3");
        assert_string_equal(hosts("n[1-3]"), "n1 n2 n3");
        assert_string_equal(hosts("n[1-2],m5,o[3-4,6,7-9]"), "n1 n2 m5 o3 o4 o6 o7 o8 o9");
        assert_string_equal(hosts("n[0001-0003],m5,o[009-011]"), "n0001 n0002 n0003 m5 o009 o010 o011");
        /* the example; the list's own order, no sort, no dedup */
        assert_string_equal(hosts("n[01-02],m5,o[3-4,6]"), "n01 n02 m5 o3 o4 o6");
        assert_string_equal(hosts("z9,a1,z9"), "z9 a1 z9");
        /* a range wider than its first number's width, suffixes, several groups */
        assert_string_equal(hosts("n[8-11]"), "n8 n9 n10 n11");
        assert_string_equal(hosts("gpu[1-2]-ib"), "gpu1-ib gpu2-ib");
        assert_string_equal(hosts("r[1-2]n[01-02]"), "r1n01 r1n02 r2n01 r2n02");
        assert_string_equal(hosts("[1-2]"), "1 2");
        assert_string_equal(hosts("node.example.org"), "node.example.org");
}

static void test_expand_hostlist_bad(void **state) {
        (void)state;
        assert_string_equal(hosts(""), "ERR -22: empty");
        assert_string_equal(hosts("n[1-2"), "ERR -22: '[' without ']'");
        assert_string_equal(hosts("n1-2]"), "ERR -22: ']' without '['");
        assert_string_equal(hosts("n[[1]]"), "ERR -22: '[' inside brackets");
        assert_string_equal(hosts("n[]"), "ERR -22: an empty range \"[]\"");
        assert_string_equal(hosts("n[3-1]"), "ERR -22: the range 3-1 runs backwards");
        assert_string_equal(hosts("n[a-b]"), "ERR -22: \"a-b\" is not a number or a range N-M");
        assert_string_equal(hosts("n[1,]"), "ERR -22: a ',' before ']'");
        assert_string_equal(hosts("n[1,,2]"), "ERR -22: \"\" is not a number or a range N-M");
        assert_string_equal(hosts("n1,,n2"), "ERR -22: an empty host name");
        assert_string_equal(hosts("n1 n2"), "ERR -22: ' ' in a host name");
        assert_string_equal(hosts("n/1"), "ERR -22: '/' in a host name");
        /* bounded: a huge range is refused before anything is allocated */
        assert_string_equal(hosts("n[0-99999999999]"), "ERR -7: more than 4096 hosts");
        assert_string_equal(hosts("a[1-64]b[1-64]c[1-2]"), "ERR -7: more than 4096 hosts");
        assert_true(strncmp(hosts("a[1-64]b[1-64]"), "a1b1 a1b2 ", 10) == 0);  /* exactly 4096: fine */
        assert_true(strstr(hosts("a[1-64]b[1-64]"), " a64b64") != NULL);
}

static void test_expand_tasks_per_node(void **state) {
        (void)state;
        /* SlurmClusterResolver's test_expand_tasks_per_node */
        assert_string_equal(tasks("2"), "2");
        assert_string_equal(tasks("2,1,3"), "2 1 3");
        assert_string_equal(tasks("3(x2),2,1"), "3 3 2 1");
        assert_string_equal(tasks("3(x2),2,11(x4)"), "3 3 2 11 11 11 11");
        assert_string_equal(tasks("13(x10)"), "13 13 13 13 13 13 13 13 13 13");
}

static void test_expand_tasks_per_node_bad(void **state) {
        (void)state;
        assert_string_equal(tasks(""), "ERR -22: empty");
        assert_string_equal(tasks("0"), "ERR -22: \"0\" is not a task count (1 to 4096), or N(xR)");
        assert_string_equal(tasks("2,"), "ERR -22: \"\" is not a task count (1 to 4096), or N(xR)");
        assert_string_equal(tasks("x2"), "ERR -22: \"x2\" is not a task count (1 to 4096), or N(xR)");
        assert_string_equal(tasks("3(2)"), "ERR -22: \"3(2)\" is not N(xR) with R a whole number from 1");
        assert_string_equal(tasks("3(x)"), "ERR -22: \"3(x)\" is not N(xR) with R a whole number from 1");
        assert_string_equal(tasks("3(x0)"), "ERR -22: \"3(x0)\" is not N(xR) with R a whole number from 1");
        assert_string_equal(tasks("3(x2"), "ERR -22: \"3(x2\" is not N(xR) with R a whole number from 1");
        assert_string_equal(tasks("1(x5000)"), "ERR -7: more than 4096 nodes");
        assert_string_equal(tasks("100(x41)"), "ERR -7: more than 4096 tasks");
        assert_string_equal(tasks("1(x99999999999999)"), "ERR -7: more than 4096 nodes");
}

/* Resolves and returns "job:index@addr ... | self=R gpus=G", or "ERR VAR: why". */
static char *resolve(const char *procid, const char *num, const char *nodes, const char *tpn, const char *gpus,
                     const struct slurm_job *jobs, size_t n_jobs, uint16_t base) {
        static char out[8192];
        struct slurm_alloc a = {procid, num, nodes, tpn, gpus};
        struct slurm_cluster *c = NULL;
        enum slurm_var var;
        char why[256] = "";
        int r = slurm_resolve(&a, jobs, n_jobs, base, &c, &var, why, sizeof(why));
        if (r < 0) {
                snprintf(out, sizeof(out), "ERR %s: %s", slurm_var_name(var), why);
                return out;
        }
        out[0] = 0;
        for (size_t i = 0; i < c->n_tasks; i++)
                snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s:%u@%s ", c->tasks[i].job, c->tasks[i].index,
                         c->tasks[i].addr);
        snprintf(out + strlen(out), sizeof(out) - strlen(out), "| self=%zu gpus=%s", c->self,
                 c->gpus ? c->gpus : "-");
        slurm_cluster_free(c);
        return out;
}

static void test_resolve_as_tensorflow(void **state) {
        (void)state;
        const struct slurm_job ps1w2[] = {{"worker", 2}, {"ps", 1}};
        const struct slurm_job ps1w4[] = {{"ps", 1}, {"worker", 4}};
        /* testSimpleSuccessfulRetrieval / testTaskPerNodeNotSetRetrieval: jobs sorted by name, ps first */
        assert_string_equal(resolve("0", "3", "t02n13,t02n41,t02n43", "1(x3)", NULL, ps1w2, 2, 8888),
                            "ps:0@t02n13:8888 worker:0@t02n41:8888 worker:1@t02n43:8888 | self=0 gpus=-");
        /* testMultiTaskPerNodeRetrieval: two tasks on the first two nodes, ports 8888 and 8889; rank 1
         * is the second task of t02n13 and takes GPU 1 of 0,1 */
        assert_string_equal(resolve("1", "5", "t02n13,t02n41,t02n43", "2(x2),1", "0,1", ps1w4, 2, 8888),
                            "ps:0@t02n13:8888 worker:0@t02n13:8889 worker:1@t02n41:8888 worker:2@t02n41:8889 "
                            "worker:3@t02n43:8888 | self=1 gpus=1");
        /* testMultipleGpusPerTaskRetrieval: 4 GPUs, 2 tasks on the node: 2 each, rank 1 the second pair */
        assert_string_equal(resolve("1", "5", "t02n13,t02n41,t02n43", "2(x2),1", "0,1,2,3", ps1w4, 2, 8888),
                            "ps:0@t02n13:8888 worker:0@t02n13:8889 worker:1@t02n41:8888 worker:2@t02n41:8889 "
                            "worker:3@t02n43:8888 | self=1 gpus=2,3");
        /* the first task on a node takes the first share, names as Slurm gives them */
        assert_string_equal(resolve("2", "5", "t02n13,t02n41,t02n43", "2(x2),1", "4,5,6,7", ps1w4, 2, 8888),
                            "ps:0@t02n13:8888 worker:0@t02n13:8889 worker:1@t02n41:8888 worker:2@t02n41:8889 "
                            "worker:3@t02n43:8888 | self=2 gpus=4,5");
}

static void test_resolve_psfleet_roles(void **state) {
        (void)state;
        /* chief, evaluator, ps, worker: the sorted order gives the chief rank 0 */
        const struct slurm_job roles[] = {{"ps", 2}, {"worker", 3}, {"chief", 1}, {"evaluator", 1}};
        assert_string_equal(resolve("6", "7", "n[01-02]", "4,3", "", roles, 4, 7000),
                            "chief:0@n01:7000 evaluator:0@n01:7001 ps:0@n01:7002 ps:1@n01:7003 worker:0@n02:7000 "
                            "worker:1@n02:7001 worker:2@n02:7002 | self=6 gpus=-");
        /* fewer GPUs than tasks on a node: no share, each task keeps the step's */
        assert_string_equal(resolve("6", "7", "n[01-02]", "4,3", "0,1", roles, 4, 7000),
                            "chief:0@n01:7000 evaluator:0@n01:7001 ps:0@n01:7002 ps:1@n01:7003 worker:0@n02:7000 "
                            "worker:1@n02:7001 worker:2@n02:7002 | self=6 gpus=-");
        /* a job of no tasks is left out */
        const struct slurm_job none[] = {{"evaluator", 0}, {"chief", 1}, {"ps", 1}};
        assert_string_equal(resolve("1", "2", "a,b", "1,1", NULL, none, 3, 9000),
                            "chief:0@a:9000 ps:0@b:9000 | self=1 gpus=-");
}

static void test_resolve_bad(void **state) {
        (void)state;
        const struct slurm_job r3[] = {{"chief", 1}, {"ps", 1}, {"worker", 1}};
        assert_string_equal(resolve(NULL, "3", "a,b,c", "1(x3)", NULL, r3, 3, 1),
                            "ERR SLURM_PROCID: not set (not a task srun started?)");
        assert_string_equal(resolve("x", "3", "a,b,c", "1(x3)", NULL, r3, 3, 1),
                            "ERR SLURM_PROCID: not a rank from 0 to 4095");
        assert_string_equal(resolve("3", "3", "a,b,c", "1(x3)", NULL, r3, 3, 1),
                            "ERR SLURM_PROCID: rank 3 is not below SLURM_STEP_NUM_TASKS=3");
        assert_string_equal(resolve("0", "0", "a,b,c", "1(x3)", NULL, r3, 3, 1),
                            "ERR SLURM_STEP_NUM_TASKS: not a task count from 1 to 4096");
        assert_string_equal(resolve("0", "3", "a,[b", "1(x3)", NULL, r3, 3, 1),
                            "ERR SLURM_STEP_NODELIST: '[' without ']'");
        assert_string_equal(resolve("0", "3", "a,b,c", NULL, NULL, r3, 3, 1), "ERR SLURM_STEP_TASKS_PER_NODE: not set");
        assert_string_equal(resolve("0", "3", "a,b,c", "1(x2)", NULL, r3, 3, 1),
                            "ERR SLURM_STEP_TASKS_PER_NODE: counts tasks on 2 nodes, SLURM_STEP_NODELIST lists 3");
        assert_string_equal(resolve("0", "3", "a,b,c", "1,1,2", NULL, r3, 3, 1),
                            "ERR SLURM_STEP_TASKS_PER_NODE: adds up to 4 tasks, SLURM_STEP_NUM_TASKS says 3");
        assert_string_equal(resolve("0", "3", "a", "3", NULL, r3, 3, 65534),
                            "ERR SLURM_STEP_TASKS_PER_NODE: 3 tasks on a node from port 65534 run past port 65535");
        /* fewer tasks than roles, and more */
        const struct slurm_job r4[] = {{"chief", 1}, {"ps", 1}, {"worker", 2}};
        assert_string_equal(resolve("0", "3", "a,b,c", "1(x3)", NULL, r4, 3, 1),
                            "ERR the roles: they need 4 tasks, the step has 3 (too few: ask srun for more)");
        const struct slurm_job r2[] = {{"chief", 1}, {"ps", 1}};
        assert_string_equal(resolve("0", "3", "a,b,c", "1(x3)", NULL, r2, 2, 1),
                            "ERR the roles: they need 2 tasks, the step has 3 (one task per role: fewer)");
        assert_string_equal(resolve("0", "3", "a,b,c", "1(x3)", "0,,1", r3, 3, 1),
                            "ERR the step's GPUs: an empty GPU name");
        assert_string_equal(resolve("0", "3", "a,b,c", "1(x3)", "0;1", r3, 3, 1),
                            "ERR the step's GPUs: ';' in a GPU name");
}

UNIT_TEST_MAIN(NULL, NULL,
               cmocka_unit_test(test_expand_hostlist),
               cmocka_unit_test(test_expand_hostlist_bad),
               cmocka_unit_test(test_expand_tasks_per_node),
               cmocka_unit_test(test_expand_tasks_per_node_bad),
               cmocka_unit_test(test_resolve_as_tensorflow),
               cmocka_unit_test(test_resolve_psfleet_roles),
               cmocka_unit_test(test_resolve_bad))
