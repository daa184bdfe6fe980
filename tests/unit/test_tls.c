/* transport/tls and mutual TLS in the RPC layer: security.* resolved per task (modes, paths, every
 * wrong file named), then real calls over TLS with certificates made by base/x509: the server knows
 * who calls, the table refuses what a role may not do, the client refuses a server of another task,
 * strangers fail the handshake, and a request over the server's limit is refused. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "scratch_dir.h"
#include "unit.h"
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include "authz.h"
#include "config.h"
#include "rpc.h"
#include "tls.h"
#include "util.h"
#include "x509.h"

/* A CA for job `job` in DIR/NAME/ and certificates of the given tasks. */
static void make_certs(const char *name, const char *job, const char *const *tasks) {
        char *d = strdup_printf("%s/%s", scratch_dir, name), *p, *k, err[512];
        assert_int_equal(mkdir(d, 0755), 0);
        struct x509_cred *ca, *leaf;
        struct x509_subject cs = {.cn = "psfleet CA", .o = "psfleet", .ou = job};
        assert_int_equal(x509_ca_new(&cs, 30, &ca, err, sizeof(err)), 0);
        p = strdup_printf("%s/ca.crt", d);
        k = strdup_printf("%s/ca.key", d);
        assert_int_equal(x509_cred_save(ca, &(struct x509_file){p, 0644, (gid_t)-1},
                                        &(struct x509_file){k, 0600, (gid_t)-1}, err, sizeof(err)), 0);
        free(p);
        free(k);
        for (size_t i = 0; tasks[i]; i++) {
                char dns[256];
                struct x509_subject s = {.cn = tasks[i], .o = "psfleet", .ou = job};
                assert_int_equal(authz_dns_name(job, tasks[i], dns, sizeof(dns)), 0);
                assert_int_equal(x509_issue(ca, &s, dns, 30, &leaf, err, sizeof(err)), 0);
                p = strdup_printf("%s/%s.crt", d, tasks[i]);
                k = strdup_printf("%s/%s.key", d, tasks[i]);
                assert_int_equal(x509_cred_save(leaf, &(struct x509_file){p, 0644, (gid_t)-1},
                                                &(struct x509_file){k, 0600, (gid_t)-1}, err, sizeof(err)), 0);
                free(p);
                free(k);
                x509_cred_free(leaf);
        }
        x509_cred_free(ca);
        free(d);
}

static int setup(void **state) {
        (void)state;
        assert_int_equal(scratch_dir_make("tls"), 0);
        static const char *const tasks[] = {"chief", "ps-0", "worker-0", "worker-1", "viewer", NULL};
        make_certs("j", "j", tasks);
        static const char *const strangers[] = {"worker-0", NULL};
        make_certs("other", "j", strangers);
        rpc_global_init();
        return 0;
}

static int teardown(void **state) {
        assert_int_equal(scratch_dir_remove(state), 0);
        return 0;
}

static struct job_config *job(const char *host, const char *security) {
        char *json = strdup_printf(
                "{\"job\": \"j\", \"cluster\": {\"chief\": [\"%s:7000\"], \"ps\": [\"%s:7001\"], \"worker\": [\"%s:7002\"]},"
                " \"model\": {\"input\": [4], \"layers\": [{\"type\": \"dense\", \"units\": 2}]}%s%s}",
                host, host, host, security ? ", \"security\": " : "", security ? security : "");
        struct job_config *c;
        char err[512];
        if (config_load_string(json, "j.json", &c, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        free(json);
        return c;
}

static char *files(const char *ca_dir, const char *mode) {
        return strdup_printf("{\"mode\": \"%s\", \"ca\": \"%s/%s/ca.crt\", \"cert\": \"%s/{job}/{task}.crt\", "
                             "\"key\": \"%s/{job}/{task}.key\"}", mode, scratch_dir, ca_dir, scratch_dir, scratch_dir);
}

static void test_paths(void **state) {
        (void)state;
        char buf[64];
        assert_int_equal(tls_expand_path("/etc/psfleet/tls/{job}/{task}.crt", "demo", "ps-0", buf, sizeof(buf)), 0);
        assert_string_equal(buf, "/etc/psfleet/tls/demo/ps-0.crt");
        assert_int_equal(tls_expand_path("{task}{task}", "j", "ab", buf, sizeof(buf)), 0);
        assert_string_equal(buf, "abab");
        assert_int_equal(tls_expand_path("/x/{user}", "j", "t", buf, sizeof(buf)), -EINVAL);
        assert_int_equal(tls_expand_path("/a/very/long/path/{job}", "j", "t", buf, 10), -ENAMETOOLONG);
        assert_true(tls_addr_is_loopback("127.0.0.1:7000"));
        assert_true(tls_addr_is_loopback("127.3.2.1:7000"));
        assert_true(tls_addr_is_loopback("[::1]:7000"));
        assert_true(tls_addr_is_loopback("localhost:1"));
        assert_false(tls_addr_is_loopback("0.0.0.0:7000"));
        assert_false(tls_addr_is_loopback("10.0.0.1:7000"));
        assert_false(tls_addr_is_loopback("[::]:7000"));
        assert_false(tls_addr_is_loopback("128.0.0.1:7000"));
}

/* auto on loopback: mutual TLS with the job's own CA, made in security.auto_dir by the first to start. */
static void test_auto(void **state) {
        (void)state;
        char err[2048], *sec = strdup_printf("{\"auto_dir\": \"%s/auto/{job}\"}", scratch_dir);
        struct job_config *c = job("127.0.0.1", sec);
        struct rpc_tls *t = (struct rpc_tls *)1;
        assert_true(tls_job_uses_mtls(c));
        assert_true(tls_job_uses_auto(c));
        /* nothing made yet: an error that names the key and the directory, and says who makes them */
        assert_int_equal(tls_from_config(c, "ps-0", &t, err, sizeof(err)), -EINVAL);
        assert_null(t);
        assert_non_null(strstr(err, "security.auto_dir ("));
        assert_non_null(strstr(err, "/auto/j/ca.crt: No such file or directory"));
        assert_non_null(strstr(err, "make them at their first start"));

        static const char *const tasks[] = {"ps-0", "admin"};
        assert_int_equal(tls_auto_prepare(c, tasks, 2, err, sizeof(err)), 0);
        char *dir = strdup_printf("%s/auto/j", scratch_dir), *key = strdup_printf("%s/ps-0.key", dir);
        struct stat st;
        assert_int_equal(stat(dir, &st), 0);
        assert_int_equal(st.st_mode & 07777, 0700);
        assert_int_equal(stat(key, &st), 0);
        assert_int_equal(st.st_mode & 07777, 0600);
        assert_int_equal(tls_from_config(c, "ps-0", &t, err, sizeof(err)), 0);
        assert_non_null(t);
        rpc_tls_free(t);
        /* only the tasks asked for */
        assert_int_equal(tls_from_config(c, "worker-0", &t, err, sizeof(err)), -EINVAL);
        /* a second start keeps the CA and the pair it finds */
        char *ca1 = NULL, *ca2 = NULL, *ca = strdup_printf("%s/ca.crt", dir);
        size_t n;
        assert_int_equal(read_file(ca, 1 << 20, &ca1, &n), 0);
        static const char *const more[] = {"ps-0", "worker-0"};
        assert_int_equal(tls_auto_prepare(c, more, 2, err, sizeof(err)), 0);
        assert_int_equal(read_file(ca, 1 << 20, &ca2, &n), 0);
        assert_string_equal(ca1, ca2);
        assert_int_equal(tls_from_config(c, "worker-0", &t, err, sizeof(err)), 0);
        rpc_tls_free(t);
        /* a pair of another CA in its place is issued again, not trusted */
        char *cmd = strdup_printf("cp %s/other/worker-0.crt %s/worker-0.crt && cp %s/other/worker-0.key %s/worker-0.key",
                                  scratch_dir, dir, scratch_dir, dir);
        assert_int_equal(system(cmd), 0);
        assert_int_equal(tls_from_config(c, "worker-0", &t, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "does not verify"));
        assert_int_equal(tls_auto_prepare(c, more, 2, err, sizeof(err)), 0);
        assert_int_equal(tls_from_config(c, "worker-0", &t, err, sizeof(err)), 0);
        rpc_tls_free(t);
        /* a directory others may read is refused, naming it and the mode */
        assert_int_equal(chmod(dir, 0750), 0);
        assert_int_equal(tls_auto_prepare(c, more, 2, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "is open to others (mode 0750)"));
        assert_int_equal(chmod(dir, 0700), 0);
        config_free(c);
        /* {task} has no meaning in it */
        free(sec);
        sec = strdup_printf("{\"auto_dir\": \"%s/auto/{task}\"}", scratch_dir);
        c = job("127.0.0.1", sec);
        assert_int_equal(tls_auto_prepare(c, tasks, 2, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "only {job} may be replaced"));
        config_free(c);
        free(sec);
        free(cmd);
        free(ca);
        free(ca1);
        free(ca2);
        free(key);
        free(dir);
}

static void test_modes(void **state) {
        (void)state;
        char err[2048];
        struct rpc_tls *t = (struct rpc_tls *)1;
        struct job_config *c = job("127.0.0.1", "{\"mode\": \"insecure\"}");   /* asked for: plain */
        assert_int_equal(tls_from_config(c, "ps-0", &t, err, sizeof(err)), 0);
        assert_null(t);
        assert_false(tls_job_uses_mtls(c));
        config_free(c);

        c = job("10.0.0.1", NULL);                            /* auto, beyond loopback: mtls, no files */
        assert_int_equal(tls_from_config(c, "ps-0", &t, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "security.mode is mtls (auto: an endpoint is beyond loopback)"));
        assert_non_null(strstr(err, "security.ca (/etc/psfleet/tls/j/ca.crt: No such file or directory)"));
        assert_non_null(strstr(err, "security.cert (/etc/psfleet/tls/j/ps-0.crt"));
        assert_non_null(strstr(err, "security.key (/etc/psfleet/tls/j/ps-0.key"));
        assert_non_null(strstr(err, "psfleet certs --job j"));
        config_free(c);

        c = job("10.0.0.1", "{\"mode\": \"insecure\"}");
        assert_int_equal(tls_from_config(c, "ps-0", &t, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "security.mode: insecure, but chief:0 at 10.0.0.1:7000 is beyond loopback"));
        config_free(c);
        c = job("10.0.0.1", "{\"mode\": \"insecure\", \"allow_insecure\": true}");
        assert_int_equal(tls_from_config(c, "ps-0", &t, err, sizeof(err)), 0);
        assert_null(t);
        config_free(c);

        char *sec = files("j", "mtls");
        c = job("127.0.0.1", sec);                            /* explicit mtls on loopback */
        assert_int_equal(tls_from_config(c, "ps-0", &t, err, sizeof(err)), 0);
        assert_non_null(t);
        assert_string_equal(t->job, "j");
        assert_string_equal(t->task, "ps-0");
        assert_non_null(strstr(t->cert_pem, "BEGIN CERTIFICATE"));
        rpc_tls_free(t);
        /* admin has no files here */
        assert_int_equal(tls_from_config(c, "admin", &t, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "security.cert ("));
        config_free(c);
        free(sec);

        /* a certificate of another task under this task's name */
        char *cmd = strdup_printf("cp %s/j/ps-0.crt %s/j/ps-9.crt && cp %s/j/ps-0.key %s/j/ps-9.key", scratch_dir, scratch_dir, scratch_dir, scratch_dir);
        assert_int_equal(system(cmd), 0);
        free(cmd);
        sec = files("j", "mtls");
        c = job("127.0.0.1", sec);
        assert_int_equal(tls_from_config(c, "ps-9", &t, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "is not a certificate of ps-9 (it must name ps-9.j.psfleet"));
        config_free(c);
        free(sec);
        /* a key that is not the certificate's */
        cmd = strdup_printf("cp %s/j/worker-1.key %s/j/ps-9.key", scratch_dir, scratch_dir);
        assert_int_equal(system(cmd), 0);
        free(cmd);
        sec = files("j", "mtls");
        c = job("127.0.0.1", sec);
        assert_int_equal(tls_from_config(c, "ps-9", &t, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "does not belong to the certificate"));
        config_free(c);
        free(sec);
        /* a certificate from another CA */
        sec = files("other", "mtls");
        c = job("127.0.0.1", sec);
        assert_int_equal(tls_from_config(c, "worker-0", &t, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "does not verify against security.ca"));
        config_free(c);
        free(sec);
}

/* ---- calls over TLS ---- */

static void h_whoami(struct rpc_call *c, void *ud) {
        (void)ud;
        const struct peer *p = rpc_call_identity(c);
        grpc_slice s = grpc_slice_from_copied_string(p->name);
        rpc_call_reply(c, grpc_raw_byte_buffer_create(&s, 1));
        grpc_slice_unref(s);
}

static struct rpc_tls *creds(const char *ca_dir, const char *task) {
        char err[1024];
        struct rpc_tls *t;
        char *sec = files(ca_dir, "mtls");
        struct job_config *c = job("127.0.0.1", sec);
        if (tls_from_config(c, task, &t, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        config_free(c);
        free(sec);
        return t;
}

/* A stranger: a certificate of another CA for worker-0, trusting this job's CA (so that only the
 * server can refuse it). */
static struct rpc_tls *stranger_creds(void) {
        struct rpc_tls *t = calloc(1, sizeof(*t));
        char *ca = strdup_printf("%s/j/ca.crt", scratch_dir), *crt = strdup_printf("%s/other/worker-0.crt", scratch_dir),
             *key = strdup_printf("%s/other/worker-0.key", scratch_dir);
        assert_int_equal(read_file(ca, 1 << 20, &t->ca_pem, NULL), 0);
        assert_int_equal(read_file(crt, 1 << 20, &t->cert_pem, NULL), 0);
        assert_int_equal(read_file(key, 1 << 20, &t->key_pem, NULL), 0);
        t->job = strdup("j");
        t->task = strdup("worker-0");
        free(ca);
        free(crt);
        free(key);
        return t;
}

static char *reply_text(struct rpc_result *r) {
        grpc_byte_buffer_reader rd;
        assert_true(grpc_byte_buffer_reader_init(&rd, r->reply));
        grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
        char *t = strndup((const char *)GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
        grpc_slice_unref(s);
        grpc_byte_buffer_reader_destroy(&rd);
        return t;
}

static int call(const char *addr, const char *name, struct rpc_tls *t, const char *method, size_t payload,
                struct rpc_result *r) {
        struct rpc_channel *ch;
        assert_int_equal(rpc_channel_new_tls(addr, name, t, &ch), 0);
        grpc_byte_buffer *req = NULL;
        if (payload) {
                grpc_slice s = grpc_slice_malloc(payload);
                memset(GRPC_SLICE_START_PTR(s), 7, payload);
                req = grpc_raw_byte_buffer_create(&s, 1);
                grpc_slice_unref(s);
        }
        int e = rpc_call(ch, method, req, 5000, false, r);
        rpc_channel_free(ch);
        return e;
}

/* call() must fail with status and, unless msg is NULL, a message holding msg. */
static void call_fails(const char *addr, const char *name, struct rpc_tls *t, const char *method, size_t payload,
                       grpc_status_code status, const char *msg) {
        struct rpc_result r;
        assert_true(call(addr, name, t, method, payload, &r) < 0);
        assert_int_equal(r.status, status);
        if (msg)
                assert_non_null(strstr(r.message, msg));
        rpc_result_clear(&r);
}

#define STATUS "/psfleet.v1.ParameterServer/GetShardStatus"
#define ASSIGN "/psfleet.v1.ParameterServer/Assign"

static void test_calls(void **state) {
        (void)state;
        struct rpc_tls *server = creds("j", "ps-0"), *worker = creds("j", "worker-0"),
                       *viewer = creds("j", "viewer"), *chief = creds("j", "chief"), *stranger = stranger_creds();
        struct rpc_method m[] = {{STATUS, h_whoami, NULL}, {ASSIGN, h_whoami, NULL}};
        struct rpc_server *s;
        struct rpc_server_opts o = {.max_receive = 1 << 20, .tls = server};
        assert_int_equal(rpc_server_new_opts("127.0.0.1:0", m, 2, 1, &o, &s), 0);
        assert_int_equal(rpc_server_start(s), 0);
        char addr[64];
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", rpc_server_port(s));
        struct rpc_result r;

        /* the server knows who calls */
        assert_int_equal(call(addr, "ps:0", worker, STATUS, 0, &r), 0);
        char *who = reply_text(&r);
        assert_string_equal(who, "worker/0");
        free(who);
        rpc_result_clear(&r);
        assert_int_equal(call(addr, "ps:0", chief, ASSIGN, 0, &r), 0);
        who = reply_text(&r);
        assert_string_equal(who, "chief");
        free(who);
        rpc_result_clear(&r);

        /* the table refuses what a role may not do */
        call_fails(addr, "ps:0", viewer, ASSIGN, 0, GRPC_STATUS_PERMISSION_DENIED,
                   "viewer may not call ParameterServer/Assign: chief only");
        call_fails(addr, "ps:0", worker, ASSIGN, 0, GRPC_STATUS_PERMISSION_DENIED, NULL);

        /* strangers, plain TCP, and a client that expects another server fail the handshake */
        call_fails(addr, "ps:0", stranger, STATUS, 0, GRPC_STATUS_UNAVAILABLE, NULL);
        call_fails(addr, "ps:0", NULL, STATUS, 0, GRPC_STATUS_UNAVAILABLE, NULL);
        call_fails(addr, "ps:1", worker, STATUS, 0, GRPC_STATUS_UNAVAILABLE, NULL);
        struct rpc_channel *ch;
        assert_int_equal(rpc_channel_new_tls(addr, "bench", worker, &ch), -EINVAL);   /* names no task */

        /* a request over the server's limit */
        assert_int_equal(call(addr, "ps:0", worker, STATUS, 512 << 10, &r), 0);
        rpc_result_clear(&r);
        call_fails(addr, "ps:0", worker, STATUS, 2 << 20, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL);

        rpc_server_free(s);
        rpc_tls_free(server);
        rpc_tls_free(worker);
        rpc_tls_free(viewer);
        rpc_tls_free(chief);
        rpc_tls_free(stranger);
}

UNIT_TEST_MAIN(setup, teardown,
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_calls))
