/* transport/authz: the table covers every RPC of every proto, roles parse and print, peers come from
 * their certificates' names, and each role gets exactly what docs/security.md says. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "unit.h"

#include "authz.h"
#include "util.h"

static struct peer peer_of(const char *job, const char *name) {
        struct peer p;
        const char *names[] = {name};
        authz_peer_from_names(job, names, 1, &p);
        return p;
}

static void test_tasks(void **state) {
        (void)state;
        char buf[AUTHZ_TASK_MAX];
        enum peer_role r;
        uint32_t i;
        authz_task_name(PEER_WORKER, 12, buf, sizeof(buf));
        assert_string_equal(buf, "worker-12");
        authz_task_name(PEER_CHIEF, 0, buf, sizeof(buf));
        assert_string_equal(buf, "chief");
        authz_task_name(PEER_VIEWER, 0, buf, sizeof(buf));
        assert_string_equal(buf, "viewer");

        assert_int_equal(authz_parse_task("ps-3", &r, &i), 0);
        assert_int_equal(r, PEER_PS);
        assert_int_equal(i, 3);
        assert_int_equal(authz_parse_task("worker:1", &r, &i), 0);
        assert_int_equal(r, PEER_WORKER);
        assert_int_equal(i, 1);
        assert_int_equal(authz_parse_task("chief:0", &r, &i), 0);
        assert_int_equal(r, PEER_CHIEF);
        assert_int_equal(authz_parse_task("admin", &r, &i), 0);
        assert_int_equal(r, PEER_ADMIN);
        const char *bad[] = {"", "ps", "ps-", "ps-01", "ps-x", "ps-4294967296", "worker-1x", "admin-1", "chief:1",
                             "chief-0", "root", "viewers", "psd-0", NULL};
        for (size_t k = 0; bad[k]; k++)
                assert_int_equal(authz_parse_task(bad[k], &r, &i), -EINVAL);
        char dns[64];
        assert_int_equal(authz_dns_name("demo", "ps-0", dns, sizeof(dns)), 0);
        assert_string_equal(dns, "ps-0.demo.psfleet");
        assert_int_equal(authz_dns_name("demo", "ps-0", dns, 10), -ENAMETOOLONG);
}

static void test_peers(void **state) {
        (void)state;
        struct peer p = peer_of("demo", "worker-1.demo.psfleet");
        assert_int_equal(p.role, PEER_WORKER);
        assert_int_equal(p.index, 1);
        assert_string_equal(p.name, "worker/1");
        p = peer_of("a.b", "chief.a.b.psfleet");
        assert_int_equal(p.role, PEER_CHIEF);
        p = peer_of("demo", "admin.Demo.PSFLEET");   /* the job and the suffix compare without case, as DNS */
        assert_int_equal(p.role, PEER_ADMIN);
        /* another job's certificate, a name of no task, lookalikes */
        const char *foreign[] = {"worker-1.other.psfleet", "root.demo.psfleet", "worker-1.demo.psfleet.evil.com",
                                 "worker-1.demo", "worker:1.demo.psfleet", "worker-1.xdemo.psfleet", ".demo.psfleet",
                                 "worker-1.demo.psfleetx", NULL};
        for (size_t k = 0; foreign[k]; k++) {
                p = peer_of("demo", foreign[k]);
                assert_int_equal(p.role, PEER_UNKNOWN);
                assert_non_null(strstr(p.name, foreign[k]));
        }
        /* the first name of this job counts */
        const char *names[] = {"www.example.com", "ps-2.demo.psfleet", "chief.demo.psfleet"};
        authz_peer_from_names("demo", names, 3, &p);
        assert_int_equal(p.role, PEER_PS);
        assert_int_equal(p.index, 2);
        authz_peer_from_names("demo", NULL, 0, &p);
        assert_int_equal(p.role, PEER_UNKNOWN);
}

#define PS "/psfleet.v1.ParameterServer/"
#define SUP "/psfleet.v1.Supervisor/"

static void test_roles(void **state) {
        (void)state;
        char why[300];
        struct peer viewer = peer_of("j", "viewer.j.psfleet"), worker = peer_of("j", "worker-0.j.psfleet"),
                    chief = peer_of("j", "chief.j.psfleet"), admin = peer_of("j", "admin.j.psfleet"),
                    ps = peer_of("j", "ps-0.j.psfleet"), unknown = peer_of("j", "x.k.psfleet"),
                    insecure = {.role = PEER_INSECURE}, evaluator = peer_of("j", "evaluator.j.psfleet");
        struct { const char *method; const struct peer *p; int want; } cases[] = {
                /* the evaluator reads, as a viewer does: the status and the checkpoints' list */
                {SUP "GetStatus", &evaluator, 0}, {SUP "ListCheckpoints", &evaluator, 0},
                {SUP "Watch", &evaluator, 0}, {SUP "SaveCheckpoint", &evaluator, -EPERM},
                {SUP "Stop", &evaluator, -EPERM}, {SUP "Report", &evaluator, -EPERM},
                {PS "Pull", &evaluator, -EPERM}, {PS "SparseExchange", &evaluator, -EPERM},
                {PS "Push", &worker, 0}, {PS "Push", &viewer, -EPERM}, {PS "Push", &chief, -EPERM},
                {PS "Push", &admin, -EPERM}, {PS "Pull", &chief, 0}, {PS "Pull", &worker, 0},
                {PS "Pull", &viewer, -EPERM}, {PS "Assign", &chief, 0}, {PS "Assign", &worker, -EPERM},
                {PS "Assign", &admin, -EPERM}, {PS "Stop", &chief, 0}, {PS "Stop", &worker, -EPERM},
                {PS "Stop", &viewer, -EPERM}, {PS "AttachSharedMemory", &worker, 0},
                {PS "AttachSharedMemory", &ps, -EPERM}, {PS "GetShardStatus", &viewer, 0},
                {SUP "Report", &worker, 0}, {SUP "Report", &admin, -EPERM}, {SUP "Stop", &admin, 0},
                {SUP "Stop", &worker, -EPERM}, {SUP "Stop", &viewer, -EPERM}, {SUP "Stop", &chief, -EPERM},
                {SUP "SaveCheckpoint", &admin, 0}, {SUP "SaveCheckpoint", &viewer, -EPERM},
                {SUP "DeleteCheckpoint", &viewer, -EPERM}, {SUP "Restart", &admin, 0},
                {SUP "GetStatus", &viewer, 0}, {SUP "Watch", &viewer, 0}, {SUP "ListCheckpoints", &viewer, 0},
                {"/grpc.health.v1.Health/Check", &viewer, 0}, {SUP "GetStatus", &unknown, -EPERM},
                {"/psfleet.v1.Worker/Stop", &chief, 0}, {"/psfleet.v1.Worker/Stop", &admin, -EPERM},
                {PS "Push", &insecure, 0}, {SUP "Stop", &insecure, 0},
                /* an export is written on the chief's host: the chief and an administrator only */
                {SUP "Export", &admin, 0}, {SUP "Export", &chief, 0}, {SUP "Export", &worker, -EPERM},
                {SUP "Export", &viewer, -EPERM}, {SUP "Export", &evaluator, -EPERM}, {SUP "Export", &ps, -EPERM},
                {"/x.Y/Z", &admin, -EPERM},   /* not in the table: nobody */
        };
        for (size_t k = 0; k < ELEMENTSOF(cases); k++) {
                int r = authz_check(cases[k].method, cases[k].p, why, sizeof(why));
                if (r != cases[k].want)
                        fail_msg("%s by %s: %d, expected %d (%s)", cases[k].method, cases[k].p->name, r, cases[k].want, why);
        }
        assert_int_equal(authz_check(PS "Assign", &worker, why, sizeof(why)), -EPERM);
        assert_string_equal(why, "worker/0 may not call ParameterServer/Assign: chief only");
        assert_int_equal(authz_check(SUP "Stop", &viewer, why, sizeof(why)), -EPERM);
        assert_string_equal(why, "viewer may not call Supervisor/Stop: admin only");
        assert_int_equal(authz_check(SUP "Export", &worker, why, sizeof(why)), -EPERM);
        assert_string_equal(why, "worker/0 may not call Supervisor/Export: chief, admin only");
        assert_int_equal(authz_check(PS "Pull", &viewer, why, sizeof(why)), -EPERM);
        assert_string_equal(why, "viewer may not call ParameterServer/Pull: chief, worker only");
        assert_int_equal(evaluator.role, PEER_EVALUATOR);
        assert_string_equal(evaluator.name, "evaluator");
        assert_true(authz_peer_is(&worker, PEER_WORKER, 0));
        assert_false(authz_peer_is(&worker, PEER_WORKER, 1));
        assert_false(authz_peer_is(&chief, PEER_WORKER, 0));
        assert_true(authz_peer_is(&insecure, PEER_WORKER, 7));
}

/* Every rpc of every proto has a rule, and every rule names an rpc that exists. */
static void test_table_covers_protos(void **state) {
        (void)state;
        const char *src = getenv("PSFLEET_SOURCE_DIR");
        if (!src)
                skip();
        const char *protos[] = {"ps.proto", "supervisor.proto", "worker.proto"};
        size_t n_rules, seen = 0;
        const struct authz_rule *rules = authz_rules(&n_rules);
        for (size_t f = 0; f < ELEMENTSOF(protos); f++) {
                char *path = strdup_printf("%s/proto/psfleet/v1/%s", src, protos[f]), *text, *service = NULL;
                assert_int_equal(read_file(path, 1 << 20, &text, NULL), 0);
                for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
                        char name[128];
                        if (sscanf(line, " service %127s", name) == 1) {
                                free(service);
                                service = strdup(name);
                        } else if (sscanf(line, " rpc %127[A-Za-z0-9_]", name) == 1) {
                                char method[300];
                                snprintf(method, sizeof(method), "/psfleet.v1.%s/%s", service, name);
                                if (!authz_allowed(method))
                                        fail_msg("%s (%s) is not in the authorization table", method, protos[f]);
                                seen++;
                        }
                }
                free(service);
                free(text);
                free(path);
        }
        assert_int_equal(seen + 2, n_rules);   /* and the health check, and the metrics endpoint's scrape */
        for (size_t k = 0; k < n_rules; k++)
                assert_true(rules[k].allow != 0);
}

/* docs/security.md has the table as the code enforces it. */
static void test_docs_current(void **state) {
        (void)state;
        const char *src = getenv("PSFLEET_SOURCE_DIR");
        if (!src)
                skip();
        char *path = strdup_printf("%s/docs/security.md", src), *doc, *table = NULL;
        size_t len;
        assert_int_equal(read_file(path, 1 << 20, &doc, NULL), 0);
        FILE *f = open_memstream(&table, &len);
        authz_print_table(f);
        fclose(f);
        if (!strstr(doc, table))
                fail_msg("docs/security.md lacks the authorization table as the code has it:\n%s", table);
        free(table);
        free(doc);
        free(path);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_tasks),
        cmocka_unit_test(test_peers),
        cmocka_unit_test(test_roles),
        cmocka_unit_test(test_table_covers_protos),
        cmocka_unit_test(test_docs_current))
