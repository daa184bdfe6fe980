/* A CA and the leaf certificates it issues, with OpenSSL 3's libcrypto (no cryptography of our own),
 * and their PEM files written atomically with exact modes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "util.h"
#include "x509.h"

#define PEM_MAX (1u << 20)      /* a certificate or key file: a few kB; anything this large is not one */
#define BACKDATE_SECS 3600      /* notBefore an hour ago: a node whose clock is behind still accepts */

struct x509_cred {
        X509 *cert;
        EVP_PKEY *key;
};

/* libcrypto's first queued reason, for a message; clears the queue. */
static const char *ssl_reason(char *buf, size_t len) {
        unsigned long e = ERR_get_error();
        if (e)
                ERR_error_string_n(e, buf, len);
        else
                snprintf(buf, len, "unknown libcrypto error");
        ERR_clear_error();
        return buf;
}

static int crypto_fail(char *err, size_t errlen, const char *what) {
        char why[256];
        return errf(err, errlen, -EIO, "%s: %s", what, ssl_reason(why, sizeof(why)));
}

struct x509_cred *x509_cred_free(struct x509_cred *c) {
        if (c) {
                X509_free(c->cert);
                EVP_PKEY_free(c->key);
                free(c);
        }
        return NULL;
}

static int set_subject(X509_NAME *n, const struct x509_subject *s) {
        const char *f[][2] = {{"O", s->o}, {"OU", s->ou}, {"CN", s->cn}};
        for (size_t i = 0; i < ELEMENTSOF(f); i++)
                if (f[i][1] && !X509_NAME_add_entry_by_txt(n, f[i][0], MBSTRING_UTF8,
                                                           (const unsigned char *)f[i][1], -1, -1, 0))
                        return -EIO;
        return 0;
}

/* 128 random bits from libcrypto's generator: unpredictable, so that no two certificates of one CA
 * share a serial (RFC 5280 allows up to 20 octets). */
static int set_serial(X509 *x) {
        BIGNUM *bn = BN_new();
        int r = -EIO;
        if (bn && BN_rand(bn, 128, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) && !BN_is_zero(bn) &&
            BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)))
                r = 0;
        BN_free(bn);
        return r;
}

static int add_ext(X509 *x, X509V3_CTX *ctx, int nid, const char *value) {
        X509_EXTENSION *e = X509V3_EXT_nconf_nid(NULL, ctx, nid, value);
        int ok = e && X509_add_ext(x, e, -1);
        X509_EXTENSION_free(e);
        return ok ? 0 : -EIO;
}

/* Built by hand, not from a "DNS:..." config string, so that no character of dns is syntax. */
static int add_dns_name(X509 *x, const char *dns) {
        GENERAL_NAMES *gens = sk_GENERAL_NAME_new_null();
        GENERAL_NAME *g = GENERAL_NAME_new();
        ASN1_IA5STRING *s = ASN1_IA5STRING_new();
        int r = -EIO;
        if (!gens || !g || !s || !ASN1_STRING_set(s, dns, -1))
                goto out;
        GENERAL_NAME_set0_value(g, GEN_DNS, s);
        s = NULL;
        if (!sk_GENERAL_NAME_push(gens, g))
                goto out;
        g = NULL;
        if (X509_add1_ext_i2d(x, NID_subject_alt_name, gens, 0, X509V3_ADD_DEFAULT) == 1)
                r = 0;
out:
        ASN1_IA5STRING_free(s);
        GENERAL_NAME_free(g);
        GENERAL_NAMES_free(gens);
        return r;
}

/* A certificate with a fresh key, subject, serial and validity, its extensions still to add. With
 * issuer NULL it is its own issuer. */
static int new_cert(const struct x509_subject *subject, uint32_t days, const struct x509_cred *issuer,
                    struct x509_cred **ret) {
        struct x509_cred *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->key = EVP_EC_gen("P-256");
        c->cert = X509_new();
        if (!c->key || !c->cert || !X509_set_version(c->cert, X509_VERSION_3) || set_serial(c->cert) < 0 ||
            set_subject(X509_get_subject_name(c->cert), subject) < 0 || !X509_set_pubkey(c->cert, c->key) ||
            !X509_gmtime_adj(X509_getm_notBefore(c->cert), -BACKDATE_SECS) ||
            !X509_time_adj_ex(X509_getm_notAfter(c->cert), (int)days, 0, NULL))
                goto fail;
        if (issuer) {
                const ASN1_TIME *end = X509_get0_notAfter(issuer->cert);
                if (!X509_set_issuer_name(c->cert, X509_get_subject_name(issuer->cert)) ||
                    (ASN1_TIME_compare(X509_get0_notAfter(c->cert), end) > 0 && !X509_set1_notAfter(c->cert, end)))
                        goto fail;
        } else if (!X509_set_issuer_name(c->cert, X509_get_subject_name(c->cert))) {
                goto fail;
        }
        *ret = c;
        return 0;
fail:
        x509_cred_free(c);
        return -EIO;
}

struct ext {
        int nid;
        const char *value;      /* as in openssl.cnf */
};

/* A certificate of subject with exts, the key identifiers and (unless NULL) the DNS name dns, signed
 * by issuer, or by itself when issuer is NULL. */
static int make_cert(const struct x509_subject *subject, uint32_t days, const struct x509_cred *issuer,
                     const struct ext *exts, size_t n, const char *dns, struct x509_cred **ret, char *err,
                     size_t errlen) {
        static const struct ext ids[] = {
                {NID_subject_key_identifier, "hash"}, {NID_authority_key_identifier, "keyid:always"},
        };
        struct x509_cred *c;
        X509V3_CTX ctx;
        /* X509_time_adj_ex takes an int; 100 years is beyond any sensible certificate */
        if (days < 1 || days > 36500)
                return errf(err, errlen, -EINVAL, "%s: validity of %u days: expected 1..36500", subject->cn, days);
        if (new_cert(subject, days, issuer, &c) < 0)
                return crypto_fail(err, errlen, "cannot make a key and certificate");
        X509V3_set_ctx(&ctx, issuer ? issuer->cert : c->cert, c->cert, NULL, NULL, 0);
        for (size_t i = 0; i < n + ELEMENTSOF(ids); i++) {
                const struct ext *e = i < n ? &exts[i] : &ids[i - n];
                if (add_ext(c->cert, &ctx, e->nid, e->value) < 0)
                        goto fail;
        }
        if ((dns && add_dns_name(c->cert, dns) < 0) || !X509_sign(c->cert, (issuer ? issuer : c)->key, EVP_sha256()))
                goto fail;
        *ret = c;
        return 0;
fail:
        x509_cred_free(c);
        return crypto_fail(err, errlen, subject->cn);
}

int x509_ca_new(const struct x509_subject *subject, uint32_t days, struct x509_cred **ret, char *err,
                size_t errlen) {
        /* pathlen 0: it signs leaves only, never another CA */
        static const struct ext exts[] = {
                {NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                {NID_key_usage, "critical,keyCertSign,cRLSign"},
        };
        return make_cert(subject, days, NULL, exts, ELEMENTSOF(exts), NULL, ret, err, errlen);
}

int x509_issue(const struct x509_cred *ca, const struct x509_subject *subject, const char *dns, uint32_t days,
               struct x509_cred **ret, char *err, size_t errlen) {
        /* every daemon both serves and calls, so each certificate is both a TLS server's and a client's */
        static const struct ext exts[] = {
                {NID_basic_constraints, "critical,CA:FALSE"},
                {NID_key_usage, "critical,digitalSignature"},
                {NID_ext_key_usage, "serverAuth,clientAuth"},
        };
        if (!dns || !*dns)
                return errf(err, errlen, -EINVAL, "%s: no DNS name for the certificate", subject->cn);
        return make_cert(subject, days, ca, exts, ELEMENTSOF(exts), dns, ret, err, errlen);
}

/* An encrypted key is refused instead of prompting for a passphrase on the terminal. */
static int no_passphrase(char *buf, int size, int rwflag, void *u) {
        return -1;
}

/* Reads PEM file path into a memory BIO (*ret). The file's bytes are wiped when freed (a key). */
static int read_pem(const char *path, char **data, BIO **ret, char *err, size_t errlen) {
        size_t len;
        int r = read_file(path, PEM_MAX, data, &len);
        if (r < 0)
                return errf(err, errlen, r, "%s: %s", path, r == -EFBIG ? "too large for a PEM file" : strerror(-r));
        *ret = BIO_new_mem_buf(*data, (int)len);
        if (!*ret) {
                OPENSSL_cleanse(*data, len);
                free(*data);
                return errf(err, errlen, -ENOMEM, "%s: out of memory", path);
        }
        return 0;
}

static void free_pem(char *data, BIO *b) {
        OPENSSL_cleanse(data, strlen(data));
        free(data);
        BIO_free(b);
}

int x509_cred_load(const char *cert_path, const char *key_path, bool is_ca, struct x509_cred **ret, char *err,
                   size_t errlen) {
        char why[256], *data;
        BIO *b;
        struct x509_cred *c = calloc(1, sizeof(*c));
        int r;
        if (!c)
                return errf(err, errlen, -ENOMEM, "out of memory");
        if ((r = read_pem(cert_path, &data, &b, err, errlen)) < 0)
                goto fail;
        c->cert = PEM_read_bio_X509(b, NULL, no_passphrase, NULL);
        free_pem(data, b);
        if (!c->cert) {
                r = errf(err, errlen, -EINVAL, "%s: not a PEM certificate: %s", cert_path, ssl_reason(why, sizeof(why)));
                goto fail;
        }
        if ((r = read_pem(key_path, &data, &b, err, errlen)) < 0)
                goto fail;
        c->key = PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL);
        free_pem(data, b);
        if (!c->key) {
                r = errf(err, errlen, -EINVAL, "%s: not an unencrypted PEM private key: %s", key_path,
                         ssl_reason(why, sizeof(why)));
                goto fail;
        }
        if (!X509_check_private_key(c->cert, c->key)) {
                ERR_clear_error();
                r = errf(err, errlen, -EINVAL, "%s: not the key of %s", key_path, cert_path);
                goto fail;
        }
        if (is_ca && X509_check_ca(c->cert) < 1) {
                r = errf(err, errlen, -EINVAL, "%s: not a CA's certificate", cert_path);
                goto fail;
        }
        *ret = c;
        return 0;
fail:
        x509_cred_free(c);
        return r;
}

/* One PEM file, atomically, its group and mode set while it is still the temp file. */
static int write_pem(const struct x509_file *f, BIO *b, char *err, size_t errlen) {
        char *data;
        long len = BIO_get_mem_data(b, &data);
        struct atomic_file *af;
        int r = atomic_file_open(f->path, NULL, f->mode, &af);
        if (r < 0)
                return errf(err, errlen, r, "%s: %s", f->path, strerror(-r));
        const char *tmp = atomic_file_temp_path(af);
        if ((f->gid != (gid_t)-1 && chown(tmp, (uid_t)-1, f->gid) < 0) || chmod(tmp, f->mode) < 0) {
                r = -errno;
                atomic_file_abort(af);
                return errf(err, errlen, r, "%s: %s", tmp, strerror(-r));
        }
        if ((r = atomic_file_write(af, data, (size_t)len)) < 0) {
                atomic_file_abort(af);
                return errf(err, errlen, r, "%s: %s", f->path, strerror(-r));
        }
        if ((r = atomic_file_commit(af, NULL)) < 0)
                return errf(err, errlen, r, "%s: %s", f->path, strerror(-r));
        return 0;
}

int x509_cred_save(const struct x509_cred *c, const struct x509_file *cert, const struct x509_file *key,
                   char *err, size_t errlen) {
        /* the key's PEM lives in the secure heap when there is one, and is wiped when freed */
        BIO *kb = BIO_new(BIO_s_secmem()), *cb = BIO_new(BIO_s_mem());
        int r;
        if (!kb || !cb) {
                r = errf(err, errlen, -ENOMEM, "out of memory");
                goto out;
        }
        if (!PEM_write_bio_PrivateKey(kb, c->key, NULL, NULL, 0, NULL, NULL) || !PEM_write_bio_X509(cb, c->cert)) {
                r = crypto_fail(err, errlen, key->path);
                goto out;
        }
        if ((r = write_pem(key, kb, err, errlen)) < 0)
                goto out;
        if ((r = write_pem(cert, cb, err, errlen)) < 0)
                unlink(key->path);      /* a key without its certificate would be kept as a pair next time */
out:
        BIO_free(kb);
        BIO_free(cb);
        return r;
}

int x509_cred_verify(const struct x509_cred *c, const struct x509_cred *ca, char *err, size_t errlen) {
        X509_STORE *st = X509_STORE_new();
        X509_STORE_CTX *ctx = X509_STORE_CTX_new();
        int r;
        if (!st || !ctx || !X509_STORE_add_cert(st, ca->cert) || !X509_STORE_CTX_init(ctx, st, c->cert, NULL)) {
                r = crypto_fail(err, errlen, "cannot set up a certificate check");
                goto out;
        }
        if (X509_verify_cert(ctx) == 1) {
                r = 0;
        } else {
                r = errf(err, errlen, -EINVAL, "%s", X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)));
                ERR_clear_error();
        }
out:
        X509_STORE_CTX_free(ctx);
        X509_STORE_free(st);
        return r;
}

time_t x509_cred_not_after(const struct x509_cred *c) {
        struct tm tm;
        if (!ASN1_TIME_to_tm(X509_get0_notAfter(c->cert), &tm))
                return 0;
        return timegm(&tm);
}
