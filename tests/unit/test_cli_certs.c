/* Tests of psfleet certs' Kubernetes Secrets (services/cli/cli_certs_k8s.c): the names' stem, the YAML
 * stream (one Secret for the CA's certificate, one per task with the evaluator's, the files base64-encoded,
 * mode 0600), and
 * a missing file refused with nothing written. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "scratch_dir.h"
#include "unit.h"

#include "cli_certs.h"
#include "util.h"

static int setup(void **state) {
        (void)state;
        return scratch_dir_make("cli-certs");
}

static void test_stem(void **state) {
        (void)state;
        char buf[64];
        assert_int_equal(certs_k8s_stem("fmnist", buf, sizeof(buf)), 0);
        assert_string_equal(buf, "fmnist");
        assert_int_equal(certs_k8s_stem("Fmnist_MLP.v2", buf, sizeof(buf)), 0);
        assert_string_equal(buf, "fmnist-mlp.v2");
        assert_int_equal(certs_k8s_stem("-job", buf, sizeof(buf)), -EINVAL);
        assert_int_equal(certs_k8s_stem("job_", buf, sizeof(buf)), -EINVAL);   /* ends in '-' once mapped */
        assert_int_equal(certs_k8s_stem("a b", buf, sizeof(buf)), -EINVAL);
        assert_int_equal(certs_k8s_stem("", buf, sizeof(buf)), -EINVAL);
        assert_int_equal(certs_k8s_stem("abcdef", buf, 6), -EINVAL);           /* does not fit */
}

static void put(const char *name, const char *text) {
        char *p = strdup_printf("%s/%s", scratch_dir, name);
        assert_non_null(p);
        assert_int_equal(write_file_atomic(p, text, strlen(text)), 0);
        free(p);
}

static void test_secrets(void **state) {
        (void)state;
        put("ca.crt", "CA");
        put("chief.crt", "C1");
        put("chief.key", "K1");
        put("ps-0.crt", "pscrt");
        put("ps-0.key", "pskey");
        put("worker-0.crt", "wcrt");
        put("worker-0.key", "wkey");
        put("evaluator.crt", "E1");
        put("evaluator.key", "E2");
        put("ca.key", "THE CA KEY");
        struct job_config cfg = {.name = "Demo_job"};
        cfg.cluster.n_chief = cfg.cluster.n_ps = cfg.cluster.n_worker = cfg.cluster.n_evaluator = 1;
        char err[512] = "", *out = strdup_printf("%s/secrets.yaml", scratch_dir), *doc = NULL;
        assert_non_null(out);
        assert_int_equal(certs_write_k8s_secrets(out, scratch_dir, &cfg, err, sizeof(err)), 0);
        struct stat st;
        assert_int_equal(stat(out, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        assert_int_equal(read_file(out, 1 << 20, &doc, NULL), 0);
        /* five Secrets: the CA's certificate and each task's pair (the evaluator's too), base64 */
        size_t n = 0;
        for (const char *p = doc; (p = strstr(p, "kind: Secret\n")); p++)
                n++;
        assert_int_equal(n, 5);
        assert_non_null(strstr(doc, "  name: demo-job-tls-evaluator\n  labels:"));
        assert_non_null(strstr(doc, "  evaluator.crt: RTE=\n  evaluator.key: RTI=\n"));   /* "E1", "E2" */
        assert_non_null(strstr(doc, "  name: demo-job-tls-ca\n"));
        assert_non_null(strstr(doc, "  ca.crt: Q0E=\n"));                       /* "CA" */
        assert_non_null(strstr(doc, "  name: demo-job-tls-chief\n"));
        assert_non_null(strstr(doc, "  chief.crt: QzE=\n  chief.key: SzE=\n"));  /* "C1", "K1" */
        assert_non_null(strstr(doc, "  name: demo-job-tls-ps-0\n"));
        assert_non_null(strstr(doc, "  ps-0.crt: cHNjcnQ=\n  ps-0.key: cHNrZXk=\n"));
        assert_non_null(strstr(doc, "  name: demo-job-tls-worker-0\n"));
        assert_non_null(strstr(doc, "    psfleet.io/job: \"Demo_job\"\n"));
        assert_null(strstr(doc, "ca.key"));
        assert_null(strstr(doc, "VEhFIENBIEtFWQ"));                             /* the CA's key never */
        free(doc);

        /* a task's key missing: the error names it, the earlier file stays as it was */
        char *gone = strdup_printf("%s/ps-0.key", scratch_dir);
        assert_non_null(gone);
        assert_int_equal(unlink(gone), 0);
        cfg.cluster.n_worker = 2;
        assert_int_equal(certs_write_k8s_secrets(out, scratch_dir, &cfg, err, sizeof(err)), -ENOENT);
        assert_non_null(strstr(err, gone));
        assert_int_equal(read_file(out, 1 << 20, &doc, NULL), 0);
        assert_null(strstr(doc, "worker-1"));
        free(doc);
        free(gone);

        cfg.name = "bad name";
        assert_int_equal(certs_write_k8s_secrets(out, scratch_dir, &cfg, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "\"bad name\""));
        free(out);
}

UNIT_TEST_MAIN(setup, scratch_dir_remove, cmocka_unit_test(test_stem), cmocka_unit_test(test_secrets))
