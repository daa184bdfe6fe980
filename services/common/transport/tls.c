/* security.* for one task: the mode in force and the credentials, checked with libcrypto (see tls.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "authz.h"
#include "log.h"
#include "tls.h"
#include "util.h"

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
        char remote[300];
        return c->security.mode == SECURITY_MTLS ||
               (c->security.mode == SECURITY_AUTO && tls_remote_endpoint(c, remote, sizeof(remote)));
}

int tls_from_config(const struct job_config *c, const char *task, struct rpc_tls **ret, char *err, size_t errlen) {
        const struct security_config *sc = &c->security;
        char remote[300];
        bool is_remote = tls_remote_endpoint(c, remote, sizeof(remote));
        enum security_mode mode = sc->mode == SECURITY_AUTO ? (is_remote ? SECURITY_MTLS : SECURITY_INSECURE) : sc->mode;
        *ret = NULL;
        if (mode == SECURITY_INSECURE) {
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

        const struct { const char *key, *pattern; } files[] = {
                {"security.ca", sc->ca}, {"security.cert", sc->cert}, {"security.key", sc->key},
        };
        char paths[3][1024], missing[2048] = "";
        char *pem[3] = {NULL, NULL, NULL};
        size_t mo = 0;
        int r = 0;
        for (size_t i = 0; i < 3; i++) {
                int e = tls_expand_path(files[i].pattern, c->name, task, paths[i], sizeof(paths[i]));
                if (e < 0) {
                        snprintf(err, errlen, "%s: %s: \"%s\": %s", c->path, files[i].key, files[i].pattern,
                                 e == -EINVAL ? "only {job} and {task} may be replaced" : "too long");
                        r = -EINVAL;
                        goto out;
                }
                size_t len;
                e = read_file(paths[i], PEM_MAX, &pem[i], &len);
                if (e < 0 && mo < sizeof(missing))
                        mo += (size_t)snprintf(missing + mo, sizeof(missing) - mo, "%s%s (%s: %s)", mo ? ", " : "",
                                               files[i].key, paths[i], strerror(-e));
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
