/* psfleet certs --k8s-secrets: the job's certificates as Kubernetes Secrets, one per task and one for
 * the CA's certificate (never its key), for pods to mount as a projected volume of their role's
 * Secrets (docs/operations.md, "On Kubernetes"). */
#include "cli_certs.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "authz.h"
#include "cli_util.h"
#include "util.h"

#define K8S_NAME_MAX 253        /* a Secret's name: a DNS subdomain */

/* The Secret names' stem: the job's name in lower case with '_' as '-' (Kubernetes names are DNS
 * subdomains); -EINVAL when that is still not one. */
int certs_k8s_stem(const char *job, char *buf, size_t len) {
        size_t n = strlen(job);
        if (n == 0 || n + 1 > len)
                return -EINVAL;
        for (size_t i = 0; i <= n; i++) {
                char ch = (char)tolower((unsigned char)job[i]);
                buf[i] = ch == '_' ? '-' : ch;
                if (i < n && !(isalnum((unsigned char)buf[i]) || buf[i] == '-' || buf[i] == '.'))
                        return -EINVAL;
        }
        return isalnum((unsigned char)buf[0]) && isalnum((unsigned char)buf[n - 1]) ? 0 : -EINVAL;
}

/* Appends `  KEY: <base64 of FILE>` to f; -errno (file unreadable) with the path in err. */
static int put_file(FILE *f, const char *key, const char *path, char *err, size_t errlen) {
        char *data = NULL;
        size_t n = 0;
        int r = read_file(path, 1 << 20, &data, &n);
        if (r < 0) {
                snprintf(err, errlen, "%s: %s", path, strerror(-r));
                return r;
        }
        unsigned char *b64 = malloc(4 * ((n + 2) / 3) + 1);
        if (!b64) {
                free(data);
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        EVP_EncodeBlock(b64, (const unsigned char *)data, (int)n);
        fprintf(f, "  %s: %s\n", key, (const char *)b64);
        free(b64);
        free(data);
        return 0;
}

static void put_head(FILE *f, const char *name, const char *job, const char *task) {
        fprintf(f,
                "---\n"
                "apiVersion: v1\n"
                "kind: Secret\n"
                "metadata:\n"
                "  name: %s\n"
                "  labels:\n"
                "    app.kubernetes.io/part-of: psfleet\n"
                "    psfleet.io/job: \"%s\"\n"
                "    psfleet.io/task: %s\n"
                "type: Opaque\n"
                "data:\n",
                name, job, task);
}

/* One task's Secret, STEM-TASK: TASK.crt and TASK.key. */
static int put_task(FILE *f, const char *dir, const char *stem, const char *job, const char *task, char *err,
                    size_t errlen) {
        char name[K8S_NAME_MAX + AUTHZ_TASK_MAX + 8], key[AUTHZ_TASK_MAX + 8];
        snprintf(name, sizeof(name), "%s-tls-%s", stem, task);
        if (strlen(name) > K8S_NAME_MAX)
                return errf(err, errlen, -EINVAL, "job \"%s\": its Secrets' names would pass %d characters", job,
                            K8S_NAME_MAX);
        put_head(f, name, job, task);
        char *crt = strdup_printf("%s/%s.crt", dir, task), *k = strdup_printf("%s/%s.key", dir, task);
        int r = crt && k ? 0 : -ENOMEM;
        if (r < 0)
                snprintf(err, errlen, "out of memory");
        snprintf(key, sizeof(key), "%s.crt", task);
        if (r >= 0)
                r = put_file(f, key, crt, err, errlen);
        snprintf(key, sizeof(key), "%s.key", task);
        if (r >= 0)
                r = put_file(f, key, k, err, errlen);
        free(crt);
        free(k);
        return r;
}

/* The whole document: the CA's Secret, then each task's of the cluster. */
static int put_all(FILE *f, const char *dir, const char *stem, const struct job_config *cfg, char *err, size_t errlen) {
        fprintf(f, "# psfleet certs --k8s-secrets: job %s's TLS Secrets (keys inside: keep this file private).\n"
                   "# A pod mounts the CA's Secret and its role's task Secrets as one projected volume.\n",
                cfg->name);
        char name[K8S_NAME_MAX + 16], *ca = strdup_printf("%s/ca.crt", dir);
        snprintf(name, sizeof(name), "%s-tls-ca", stem);
        put_head(f, name, cfg->name, "ca");
        int r = ca ? put_file(f, "ca.crt", ca, err, errlen) : -ENOMEM;
        free(ca);
        const struct {
                enum peer_role role;
                uint32_t n;
        } all[] = {{PEER_CHIEF, cfg->cluster.n_chief}, {PEER_PS, cfg->cluster.n_ps}, {PEER_WORKER, cfg->cluster.n_worker},
                   {PEER_EVALUATOR, cfg->cluster.n_evaluator}};
        for (size_t i = 0; r >= 0 && i < ELEMENTSOF(all); i++)
                for (uint32_t k = 0; r >= 0 && k < all[i].n; k++) {
                        char task[AUTHZ_TASK_MAX];
                        authz_task_name(all[i].role, k, task, sizeof(task));
                        r = put_task(f, dir, stem, cfg->name, task, err, errlen);
                }
        return r;
}

int certs_write_k8s_secrets(const char *out, const char *dir, const struct job_config *cfg, char *err,
                            size_t errlen) {
        char stem[K8S_NAME_MAX + 1];
        if (certs_k8s_stem(cfg->name, stem, sizeof(stem)) < 0)
                return errf(err, errlen, -EINVAL, "job \"%s\": no Kubernetes name for it (letters, digits, '-', '_' "
                            "and '.', starting and ending with a letter or digit)", cfg->name);
        char *doc = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&doc, &len);
        if (!f)
                return errf(err, errlen, -ENOMEM, "out of memory");
        int r = put_all(f, dir, stem, cfg, err, errlen);
        if (fclose(f) != 0 && r >= 0)
                r = errf(err, errlen, -ENOMEM, "out of memory");
        if (r >= 0 && strcmp(out, "-") == 0) {
                if (fwrite(doc, 1, len, stdout) != len || fflush(stdout) != 0)
                        r = errf(err, errlen, -errno, "stdout: %s", strerror(errno));
        } else if (r >= 0) {
                /* the tasks' keys are in it: readable by its writer only */
                struct atomic_file *af;
                r = atomic_file_open(out, NULL, 0600, &af);
                if (r >= 0 && (r = atomic_file_write(af, doc, len)) < 0)
                        atomic_file_abort(af);
                else if (r >= 0)
                        r = atomic_file_commit(af, NULL);
                if (r < 0)
                        errf(err, errlen, r, "%s: %s", out, strerror(-r));
        }
        free(doc);
        return r;
}
