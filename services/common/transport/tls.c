/* security.* for one task: the mode in force and the credentials, checked with libcrypto (see tls.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "authz.h"
#include "log.h"
#include "tls.h"
#include "util.h"
#include "x509.h"

#define PEM_MAX (1 << 20)

static bool host_is_loopback(const char *h) {
        return strncmp(h, "127.", 4) == 0 || strcmp(h, "::1") == 0 || strcmp(h, "[::1]") == 0 ||
               strcasecmp(h, "localhost") == 0;
}

bool tls_addr_is_loopback(const char *addr) {
        char host[256];
        const char *colon = strrchr(addr, ':');
        size_t n = colon ? (size_t)(colon - addr) : strlen(addr);
        if (n >= sizeof(host))
                return false;
        memcpy(host, addr, n);
        host[n] = '\0';
        return host_is_loopback(host);
}

bool tls_remote_endpoint(const struct job_config *c, char *buf, size_t len) {
        const struct { const char *kind; const struct endpoint *e; uint32_t n; } lists[] = {
                {"chief", c->cluster.chief, c->cluster.n_chief},
                {"ps", c->cluster.ps, c->cluster.n_ps},
                {"worker", c->cluster.worker, c->cluster.n_worker},
        };
        for (size_t l = 0; l < ELEMENTSOF(lists); l++)
                for (uint32_t i = 0; i < lists[l].n; i++)
                        if (!host_is_loopback(lists[l].e[i].host)) {
                                snprintf(buf, len, "%s:%" PRIu32 " at %s", lists[l].kind, i, lists[l].e[i].addr);
                                return true;
                        }
        return false;
}

int tls_expand_path(const char *pattern, const char *job, const char *task, char *buf, size_t len) {
        size_t o = 0;
        for (const char *p = pattern; *p;) {
                const char *v = NULL;
                if (*p == '{') {
                        if (strncmp(p, "{job}", 5) == 0)
                                v = job;
                        else if (strncmp(p, "{task}", 6) == 0)
                                v = task;
                        else
                                return -EINVAL;
                        p += v == job ? 5 : 6;
                } else {
                        if (o + 1 >= len)
                                return -ENAMETOOLONG;
                        buf[o++] = *p++;
                        continue;
                }
                size_t n = strlen(v);
                if (o + n >= len)
                        return -ENAMETOOLONG;
                memcpy(buf + o, v, n);
                o += n;
        }
        if (o >= len)
                return -ENAMETOOLONG;
        buf[o] = '\0';
        return 0;
}

/* The first reason libcrypto gave, or "not PEM". */
static const char *ossl_reason(char *buf, size_t len) {
        unsigned long e = ERR_get_error();
        ERR_clear_error();
        if (!e)
                return "not PEM";
        ERR_error_string_n(e, buf, len);
        return buf;
}

static X509 *pem_cert(const char *pem) {
        BIO *b = BIO_new_mem_buf(pem, -1);
        X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
        BIO_free(b);
        return x;
}

static EVP_PKEY *pem_key(const char *pem) {
        BIO *b = BIO_new_mem_buf(pem, -1);
        EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
        BIO_free(b);
        return k;
}

static bool cert_names(X509 *x, const char *dns) {
        return X509_check_host(x, dns, strlen(dns), X509_CHECK_FLAG_NO_WILDCARDS, NULL) == 1;
}

/* The certificate is ours (names `dns`), issued by the CA, in its validity, and the key matches. */
static int check_credentials(const struct rpc_tls *t, const char *dns, const char *ca_path, const char *cert_path,
                             const char *key_path, char *err, size_t errlen) {
        char why[256];
        int r = -EINVAL;
        X509 *ca = pem_cert(t->ca_pem), *cert = NULL;
        EVP_PKEY *key = NULL;
        X509_STORE *store = NULL;
        X509_STORE_CTX *ctx = NULL;
        if (!ca) {
                snprintf(err, errlen, "security.ca: %s: not a PEM certificate (%s)", ca_path, ossl_reason(why, sizeof(why)));
                goto out;
        }
        if (!(cert = pem_cert(t->cert_pem))) {
                snprintf(err, errlen, "security.cert: %s: not a PEM certificate (%s)", cert_path,
                         ossl_reason(why, sizeof(why)));
                goto out;
        }
        if (!(key = pem_key(t->key_pem))) {
                snprintf(err, errlen, "security.key: %s: not a PEM private key (%s)", key_path, ossl_reason(why, sizeof(why)));
                goto out;
        }
        if (X509_check_private_key(cert, key) != 1) {
                ERR_clear_error();
                snprintf(err, errlen, "security.key: %s does not belong to the certificate %s", key_path, cert_path);
                goto out;
        }
        if (!cert_names(cert, dns)) {
                snprintf(err, errlen, "security.cert: %s is not a certificate of %s (it must name %s; issue one with "
                         "`psfleet certs --job %s --task %s`)", cert_path, t->task, dns, t->job, t->task);
                goto out;
        }
        store = X509_STORE_new();
        ctx = X509_STORE_CTX_new();
        if (!store || !ctx || X509_STORE_add_cert(store, ca) != 1 || X509_STORE_CTX_init(ctx, store, cert, NULL) != 1) {
                r = -ENOMEM;
                snprintf(err, errlen, "security: out of memory checking %s", cert_path);
                goto out;
        }
        if (X509_verify_cert(ctx) != 1) {
                snprintf(err, errlen, "security.cert: %s does not verify against security.ca %s: %s", cert_path, ca_path,
                         X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)));
                goto out;
        }
        r = 0;
out:
        ERR_clear_error();
        X509_STORE_CTX_free(ctx);
        X509_STORE_free(store);
        EVP_PKEY_free(key);
        X509_free(cert);
        X509_free(ca);
        return r;
}

bool tls_job_uses_mtls(const struct job_config *c) {
        return c->security.mode != SECURITY_INSECURE;
}

bool tls_job_uses_auto(const struct job_config *c) {
        char remote[300];
        return c->security.mode == SECURITY_AUTO && !tls_remote_endpoint(c, remote, sizeof(remote));
}

/* security.auto_dir expanded for the job ({task} has no meaning there). */
static int auto_dir(const struct job_config *c, char *buf, size_t len) {
        if (strstr(c->security.auto_dir, "{task}"))
                return -EINVAL;
        return tls_expand_path(c->security.auto_dir, c->name, "", buf, len);
}

int tls_paths(const struct job_config *c, const char *task, char ca[1024], char cert[1024], char key[1024]) {
        const struct security_config *sc = &c->security;
        if (tls_job_uses_auto(c)) {
                char dir[900];
                int r = auto_dir(c, dir, sizeof(dir));
                if (r < 0)
                        return r;
                snprintf(ca, 1024, "%s/ca.crt", dir);
                snprintf(cert, 1024, "%s/%s.crt", dir, task);
                snprintf(key, 1024, "%s/%s.key", dir, task);
                return 0;
        }
        int r = tls_expand_path(sc->ca, c->name, task, ca, 1024);
        if (r >= 0)
                r = tls_expand_path(sc->cert, c->name, task, cert, 1024);
        if (r >= 0)
                r = tls_expand_path(sc->key, c->name, task, key, 1024);
        return r;
}

static bool exists(const char *path) {
        return access(path, F_OK) == 0;
}

/* The job's CA in dir: loaded when both files are there, made when neither is. */
static int auto_ca(const char *dir, const char *job, struct x509_cred **ca, char *err, size_t errlen) {
        char crt[1024], key[1024];
        snprintf(crt, sizeof(crt), "%s/ca.crt", dir);
        snprintf(key, sizeof(key), "%s/ca.key", dir);
        if (exists(crt) && exists(key)) {
                int r = x509_cred_load(crt, key, true, ca, err, errlen);
                if (r >= 0 && x509_cred_not_after(*ca) <= time(NULL)) {
                        *ca = x509_cred_free(*ca);
                        return errf(err, errlen, -EINVAL, "security.auto_dir: the job's CA %s has ended: remove %s to "
                                    "make a new one", crt, dir);
                }
                return r;
        }
        if (exists(crt) || exists(key))
                return errf(err, errlen, -EINVAL, "security.auto_dir: %s exists without %s: remove %s to make the "
                            "job's credentials again", exists(crt) ? crt : key, exists(crt) ? key : crt, dir);
        char cn[160];
        snprintf(cn, sizeof(cn), "psfleet CA %s (auto)", job);
        const struct x509_subject s = {cn, "psfleet", job};
        const struct x509_file fc = {crt, 0644, (gid_t)-1}, fk = {key, 0600, (gid_t)-1};
        int r = x509_ca_new(&s, X509_CA_DAYS, ca, err, errlen);
        if (r >= 0 && (r = x509_cred_save(*ca, &fc, &fk, err, errlen)) < 0)
                *ca = x509_cred_free(*ca);
        return r;
}

/* task's pair in dir, kept when this CA issued it and it is still valid, else issued (again). */
static int auto_leaf(const char *dir, const char *job, const char *task, const struct x509_cred *ca, char *err,
                     size_t errlen) {
        char crt[1024], key[1024], dns[300], cn[AUTHZ_TASK_MAX], why[256];
        snprintf(crt, sizeof(crt), "%s/%s.crt", dir, task);
        snprintf(key, sizeof(key), "%s/%s.key", dir, task);
        struct x509_cred *cred = NULL;
        if (exists(crt) && exists(key) && x509_cred_load(crt, key, false, &cred, why, sizeof(why)) >= 0) {
                int v = x509_cred_verify(cred, ca, why, sizeof(why));
                x509_cred_free(cred);
                if (v >= 0)
                        return 0;
        }
        if (authz_dns_name(job, task, dns, sizeof(dns)) < 0)
                return errf(err, errlen, -EINVAL, "security.auto_dir: job name too long for a certificate");
        snprintf(cn, sizeof(cn), "%s", task);
        char *dash = strchr(cn, '-');
        if (dash)
                *dash = '/';
        const struct x509_subject s = {cn, "psfleet", job};
        const struct x509_file fc = {crt, 0644, (gid_t)-1}, fk = {key, 0600, (gid_t)-1};
        int r = x509_issue(ca, &s, dns, X509_LEAF_DAYS, &cred, err, errlen);
        if (r >= 0)
                r = x509_cred_save(cred, &fc, &fk, err, errlen);
        x509_cred_free(cred);
        return r;
}

int tls_auto_prepare(const struct job_config *c, const char *const *tasks, size_t n, char *err, size_t errlen) {
        char dir[900];
        int r = auto_dir(c, dir, sizeof(dir));
        if (r < 0)
                return errf(err, errlen, -EINVAL, "%s: security.auto_dir: \"%s\": %s", c->path, c->security.auto_dir,
                            r == -ENAMETOOLONG ? "too long" : "only {job} may be replaced");
        /* The parents as the job's user's own (a state directory is); the directory itself private. */
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
                *slash = '\0';
                r = mkdir_p(dir, 0700);
                *slash = '/';
                if (r < 0)
                        return errf(err, errlen, r, "security.auto_dir: cannot make the parent of %s: %s", dir,
                                    strerror(-r));
        }
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return errf(err, errlen, -errno, "security.auto_dir: cannot make %s: %m", dir);
        struct stat st;
        if (lstat(dir, &st) < 0)
                return errf(err, errlen, -errno, "security.auto_dir: %s: %m", dir);
        if (!S_ISDIR(st.st_mode))
                return errf(err, errlen, -EINVAL, "security.auto_dir: %s is not a directory", dir);
        if (st.st_uid != geteuid())
                return errf(err, errlen, -EINVAL, "security.auto_dir: %s belongs to uid %u, not to this job's user "
                            "(uid %u): the job's keys must be its user's only", dir, (unsigned)st.st_uid,
                            (unsigned)geteuid());
        if (st.st_mode & 077)
                return errf(err, errlen, -EINVAL, "security.auto_dir: %s is open to others (mode %04o): it must be "
                            "0700, since the job's keys are in it", dir, (unsigned)(st.st_mode & 07777));
        char lock[1024];
        snprintf(lock, sizeof(lock), "%s/.lock", dir);
        int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return errf(err, errlen, -errno, "security.auto_dir: %s: %m", lock);
        while (flock(fd, LOCK_EX) < 0)
                if (errno != EINTR) {
                        r = errf(err, errlen, -errno, "security.auto_dir: cannot lock %s: %m", lock);
                        close(fd);
                        return r;
                }
        struct x509_cred *ca = NULL;
        r = auto_ca(dir, c->name, &ca, err, errlen);
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = auto_leaf(dir, c->name, tasks[i], ca, err, errlen);
        x509_cred_free(ca);
        close(fd);      /* and the lock with it */
        return r < 0 ? r : 0;
}

int tls_from_config(const struct job_config *c, const char *task, struct rpc_tls **ret, char *err, size_t errlen) {
        const struct security_config *sc = &c->security;
        char remote[300];
        bool is_remote = tls_remote_endpoint(c, remote, sizeof(remote));
        bool is_auto = sc->mode == SECURITY_AUTO && !is_remote;
        *ret = NULL;
        if (sc->mode == SECURITY_INSECURE) {
                if (!is_remote)
                        return 0;
                if (!sc->allow_insecure) {
                        snprintf(err, errlen, "%s: security.mode: insecure, but %s is beyond loopback: anyone who reaches "
                                 "a port would own the job; use mtls (psfleet certs), or set security.allow_insecure: true",
                                 c->path, remote);
                        return -EINVAL;
                }
                log_warning("job %s runs WITHOUT TLS although %s is beyond loopback (security.allow_insecure): anyone "
                            "who reaches a port can read and change the model", c->name, remote);
                return 0;
        }

        const char *keys[3] = {"security.ca", "security.cert", "security.key"};
        const char *patterns[3] = {sc->ca, sc->cert, sc->key};
        char paths[3][1024], missing[2048] = "";
        char *pem[3] = {NULL, NULL, NULL};
        size_t mo = 0;
        int r = 0, denied = 0;
        if (is_auto)
                keys[0] = keys[1] = keys[2] = "security.auto_dir";
        if (tls_paths(c, task, paths[0], paths[1], paths[2]) < 0) {
                for (size_t i = 0; i < 3; i++) {
                        const char *pat = is_auto ? sc->auto_dir : patterns[i];
                        int e = is_auto ? auto_dir(c, paths[i], sizeof(paths[i]))
                                        : tls_expand_path(pat, c->name, task, paths[i], sizeof(paths[i]));
                        if (e < 0) {
                                snprintf(err, errlen, "%s: %s: \"%s\": %s", c->path, keys[i], pat,
                                         e == -ENAMETOOLONG ? "too long" : is_auto ? "only {job} may be replaced"
                                         : "only {job} and {task} may be replaced");
                                return -EINVAL;
                        }
                }
        }
        for (size_t i = 0; i < 3; i++) {
                size_t len;
                int e = read_file(paths[i], PEM_MAX, &pem[i], &len);
                denied |= e == -EACCES;
                if (e < 0 && mo < sizeof(missing))
                        mo += (size_t)snprintf(missing + mo, sizeof(missing) - mo, "%s%s (%s: %s)", mo ? ", " : "",
                                               keys[i], paths[i], strerror(-e));
        }
        if (mo && is_auto) {
                snprintf(err, errlen, "%s: security.mode is auto and every endpoint is loopback, so the job runs under "
                         "mutual TLS with its own credentials, but %s; %s", c->path, missing,
                         denied ? "they are the job's user's only: run this as that user (or root)"
                                : "the job's daemons make them at their first start (psfleet local at its start), "
                                  "or run it insecure with security.mode: insecure");
                r = -EINVAL;
                goto out;
        }
        if (mo) {
                snprintf(err, errlen, "%s: security.mode is mtls%s, but %s; create them with `psfleet certs --job %s` "
                         "(docs/security.md)%s", c->path, sc->mode == SECURITY_AUTO ? " (auto: an endpoint is beyond loopback)" : "",
                         missing, c->name, sc->mode == SECURITY_AUTO ? ", or run it insecure with security.mode: insecure "
                         "and security.allow_insecure: true" : "");
                r = -EINVAL;
                goto out;
        }
        struct rpc_tls t = {.ca_pem = pem[0], .cert_pem = pem[1], .key_pem = pem[2], .job = c->name, .task = (char *)task};
        char dns[300];
        if (authz_dns_name(c->name, task, dns, sizeof(dns)) < 0) {
                snprintf(err, errlen, "%s: job name too long for a certificate", c->path);
                r = -EINVAL;
                goto out;
        }
        if ((r = check_credentials(&t, dns, paths[0], paths[1], paths[2], err, errlen)) < 0)
                goto out;
        if (!(*ret = rpc_tls_copy(&t)))
                r = -ENOMEM;
out:
        if (pem[2])
                explicit_bzero(pem[2], strlen(pem[2]));
        for (size_t i = 0; i < 3; i++)
                free(pem[i]);
        return r;
}
