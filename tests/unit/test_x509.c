/* Tests of x509.c: a CA and its leaves, checked from their PEM files with libcrypto as a TLS peer
 * would check them; file modes; loading a CA to issue more; errors that name the file. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "scratch_dir.h"
#include "unit.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "util.h"
#include "x509.h"

static char err[1024];

static int setup(void **state) {
        return scratch_dir_make("x509");
}

static char *path(const char *name) {
        char *p = strdup_printf("%s/%s", scratch_dir, name);
        assert_non_null(p);
        return p;
}

static const struct x509_subject ca_subject = {"psfleet CA demo", "psfleet", "demo"};

static struct x509_cred *make_ca(uint32_t days) {
        struct x509_cred *ca = NULL;
        assert_int_equal(x509_ca_new(&ca_subject, days, &ca, err, sizeof(err)), 0);
        assert_non_null(ca);
        return ca;
}

/* Saves c as NAME.crt (0644) and NAME.key (mode kmode, our group). */
static void save(const struct x509_cred *c, const char *name, mode_t kmode) {
        char *crt = strdup_printf("%s/%s.crt", scratch_dir, name), *key = strdup_printf("%s/%s.key", scratch_dir, name);
        struct x509_file fc = {crt, 0644, (gid_t)-1}, fk = {key, kmode, getegid()};
        assert_int_equal(x509_cred_save(c, &fc, &fk, err, sizeof(err)), 0);
        free(crt);
        free(key);
}

static FILE *open_tmp(const char *name) {
        char *p = path(name);
        FILE *f = fopen(p, "r");
        free(p);
        assert_non_null(f);
        return f;
}

/* A certificate or a private key, read back with libcrypto's own PEM reader. */
static void *read_back(const char *name, bool key) {
        FILE *f = open_tmp(name);
        void *o = key ? (void *)PEM_read_PrivateKey(f, NULL, NULL, NULL) : (void *)PEM_read_X509(f, NULL, NULL, NULL);
        fclose(f);
        assert_non_null(o);
        return o;
}

static X509 *read_cert(const char *name) {
        return read_back(name, false);
}

static EVP_PKEY *read_key(const char *name) {
        return read_back(name, true);
}

/* X509_verify_cert of leaf against the one CA certificate, for a TLS server and a TLS client. */
static int verify(X509 *leaf, X509 *ca, const char *host) {
        int ok = 1;
        int purposes[] = {X509_PURPOSE_SSL_SERVER, X509_PURPOSE_SSL_CLIENT};
        for (size_t i = 0; i < ELEMENTSOF(purposes); i++) {
                X509_STORE *st = X509_STORE_new();
                X509_STORE_CTX *ctx = X509_STORE_CTX_new();
                assert_true(st && ctx && X509_STORE_add_cert(st, ca) && X509_STORE_CTX_init(ctx, st, leaf, NULL));
                X509_VERIFY_PARAM *vp = X509_STORE_CTX_get0_param(ctx);
                X509_VERIFY_PARAM_set_purpose(vp, purposes[i]);
                if (host)
                        X509_VERIFY_PARAM_set1_host(vp, host, 0);
                ok = ok && X509_verify_cert(ctx) == 1;
                X509_STORE_CTX_free(ctx);
                X509_STORE_free(st);
        }
        ERR_clear_error();
        return ok;
}

static void assert_name_entry(X509_NAME *n, int nid, const char *want) {
        char buf[256];
        assert_true(X509_NAME_get_text_by_NID(n, nid, buf, sizeof(buf)) > 0);
        assert_string_equal(buf, want);
}

static mode_t mode_of(const char *name) {
        char *p = path(name);
        struct stat st;
        assert_int_equal(stat(p, &st), 0);
        free(p);
        return st.st_mode & 07777;
}

static void test_ca_and_leaf(void **state) {
        /* the modes are exactly the ones asked for, whatever the umask */
        mode_t um = umask(077);
        struct x509_cred *ca = make_ca(X509_CA_DAYS), *leaf = NULL;
        const struct x509_subject s = {"ps/0", "psfleet", "demo"};
        assert_int_equal(x509_issue(ca, &s, "ps-0.demo.psfleet", X509_LEAF_DAYS, &leaf, err, sizeof(err)), 0);
        save(ca, "ca", 0600);
        save(leaf, "ps-0", 0640);
        umask(um);
        assert_int_equal(mode_of("ca.key"), 0600);
        assert_int_equal(mode_of("ca.crt"), 0644);
        assert_int_equal(mode_of("ps-0.key"), 0640);
        assert_int_equal(mode_of("ps-0.crt"), 0644);

        X509 *cax = read_cert("ca.crt"), *x = read_cert("ps-0.crt");
        EVP_PKEY *k = read_key("ps-0.key"), *cak = read_key("ca.key");
        assert_true(verify(x, cax, "ps-0.demo.psfleet"));
        assert_false(verify(x, cax, "ps-1.demo.psfleet"));     /* the name is checked too */
        assert_true(X509_check_private_key(x, k));
        assert_false(X509_check_private_key(x, cak));
        assert_true(X509_check_private_key(cax, cak));
        assert_int_equal(EVP_PKEY_get_bits(k), 256);

        /* the CA: self-signed, CA:TRUE critical, keyCertSign + cRLSign */
        assert_int_equal(X509_check_ca(cax), 1);
        assert_int_equal(X509_NAME_cmp(X509_get_subject_name(cax), X509_get_issuer_name(cax)), 0);
        assert_name_entry(X509_get_subject_name(cax), NID_commonName, "psfleet CA demo");
        assert_name_entry(X509_get_subject_name(cax), NID_organizationName, "psfleet");
        assert_name_entry(X509_get_subject_name(cax), NID_organizationalUnitName, "demo");
        int crit = -1;
        BASIC_CONSTRAINTS *bc = X509_get_ext_d2i(cax, NID_basic_constraints, &crit, NULL);
        assert_non_null(bc);
        assert_true(bc->ca);
        assert_int_equal(crit, 1);
        BASIC_CONSTRAINTS_free(bc);
        assert_int_equal(X509_get_key_usage(cax), KU_KEY_CERT_SIGN | KU_CRL_SIGN);

        /* the leaf: its names, CA:FALSE, EKU server and client, key identifiers */
        assert_int_equal(X509_check_ca(x), 0);
        assert_name_entry(X509_get_subject_name(x), NID_commonName, "ps/0");
        assert_name_entry(X509_get_subject_name(x), NID_organizationName, "psfleet");
        assert_name_entry(X509_get_subject_name(x), NID_organizationalUnitName, "demo");
        GENERAL_NAMES *gens = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
        assert_non_null(gens);
        assert_int_equal(sk_GENERAL_NAME_num(gens), 1);
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(gens, 0);
        assert_int_equal(g->type, GEN_DNS);
        assert_string_equal((const char *)ASN1_STRING_get0_data(g->d.dNSName), "ps-0.demo.psfleet");
        GENERAL_NAMES_free(gens);
        assert_int_equal(X509_get_extended_key_usage(x), XKU_SSL_SERVER | XKU_SSL_CLIENT);
        assert_int_equal(X509_get_key_usage(x), KU_DIGITAL_SIGNATURE);
        assert_non_null(X509_get0_subject_key_id(x));
        assert_non_null(X509_get0_authority_key_id(x));
        assert_int_equal(ASN1_OCTET_STRING_cmp(X509_get0_authority_key_id(x), X509_get0_subject_key_id(cax)), 0);

        /* validity: about an hour before now to X509_LEAF_DAYS from now */
        time_t now = time(NULL), end = x509_cred_not_after(leaf);
        assert_true(end > now + (time_t)X509_LEAF_DAYS * 86400 - 60 && end <= now + (time_t)X509_LEAF_DAYS * 86400 + 60);
        assert_true(X509_cmp_time(X509_get0_notBefore(x), &(time_t){now - 3000}) < 0);
        assert_int_equal(x509_cred_verify(leaf, ca, err, sizeof(err)), 0);

        X509_free(cax);
        X509_free(x);
        EVP_PKEY_free(k);
        EVP_PKEY_free(cak);
        x509_cred_free(leaf);
        x509_cred_free(ca);
}

/* A leaf of another CA (even one with the same name) does not verify against ours. */
static void test_other_ca(void **state) {
        struct x509_cred *ca = make_ca(30), *other = make_ca(30), *leaf = NULL;
        const struct x509_subject s = {"worker/1", "psfleet", "demo"};
        assert_int_equal(x509_issue(other, &s, "worker-1.demo.psfleet", 10, &leaf, err, sizeof(err)), 0);
        save(ca, "ours", 0600);
        save(leaf, "theirs", 0640);
        X509 *cax = read_cert("ours.crt"), *x = read_cert("theirs.crt");
        assert_false(verify(x, cax, NULL));
        assert_int_equal(x509_cred_verify(leaf, ca, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "issuer"));
        assert_int_equal(x509_cred_verify(leaf, other, err, sizeof(err)), 0);
        X509_free(cax);
        X509_free(x);
        x509_cred_free(leaf);
        x509_cred_free(other);
        x509_cred_free(ca);
}

/* A CA read back from its files issues more leaves, which verify against the first file. */
static void test_load_and_issue_more(void **state) {
        struct x509_cred *ca = make_ca(X509_CA_DAYS), *loaded = NULL, *a = NULL, *b = NULL;
        save(ca, "ca2", 0600);
        char *crt = path("ca2.crt"), *key = path("ca2.key");
        assert_int_equal(x509_cred_load(crt, key, true, &loaded, err, sizeof(err)), 0);
        const struct x509_subject s = {"viewer", "psfleet", "demo"};
        assert_int_equal(x509_issue(loaded, &s, "viewer.demo.psfleet", 100, &a, err, sizeof(err)), 0);
        assert_int_equal(x509_issue(loaded, &s, "viewer.demo.psfleet", 100, &b, err, sizeof(err)), 0);
        save(a, "viewer-a", 0640);
        save(b, "viewer-b", 0640);
        X509 *cax = read_cert("ca2.crt"), *xa = read_cert("viewer-a.crt"), *xb = read_cert("viewer-b.crt");
        assert_true(verify(xa, cax, "viewer.demo.psfleet"));
        assert_true(verify(xb, cax, "viewer.demo.psfleet"));
        assert_int_equal(x509_cred_verify(a, ca, err, sizeof(err)), 0);
        /* random serials: different, positive, at most 16 bytes */
        assert_int_not_equal(ASN1_INTEGER_cmp(X509_get0_serialNumber(xa), X509_get0_serialNumber(xb)), 0);
        BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(xa), NULL);
        assert_false(BN_is_negative(bn));
        assert_true(BN_num_bytes(bn) <= 16 && BN_num_bytes(bn) >= 8);
        BN_free(bn);
        /* a loaded leaf pair is a pair, but not a CA */
        char *lc = path("viewer-a.crt"), *lk = path("viewer-a.key");
        struct x509_cred *l = NULL;
        assert_int_equal(x509_cred_load(lc, lk, false, &l, err, sizeof(err)), 0);
        assert_int_equal(x509_cred_verify(l, loaded, err, sizeof(err)), 0);
        x509_cred_free(l);
        assert_int_equal(x509_cred_load(lc, lk, true, &l, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, lc));
        assert_non_null(strstr(err, "not a CA"));
        X509_free(cax);
        X509_free(xa);
        X509_free(xb);
        free(lc);
        free(lk);
        free(crt);
        free(key);
        x509_cred_free(a);
        x509_cred_free(b);
        x509_cred_free(loaded);
        x509_cred_free(ca);
}

/* A leaf asked to outlive its CA ends with it. */
static void test_leaf_within_ca(void **state) {
        struct x509_cred *ca = make_ca(10), *leaf = NULL;
        const struct x509_subject s = {"chief", "psfleet", "demo"};
        assert_int_equal(x509_issue(ca, &s, "chief.demo.psfleet", X509_LEAF_DAYS, &leaf, err, sizeof(err)), 0);
        assert_int_equal(x509_cred_not_after(leaf), x509_cred_not_after(ca));
        assert_int_equal(x509_cred_verify(leaf, ca, err, sizeof(err)), 0);
        x509_cred_free(leaf);
        x509_cred_free(ca);
}

static void write_text(const char *name, const char *text) {
        char *p = path(name);
        assert_int_equal(write_file_atomic(p, text, strlen(text)), 0);
        free(p);
}

static void test_errors(void **state) {
        struct x509_cred *ca = make_ca(30), *c = (struct x509_cred *)1, *leaf = NULL;
        const struct x509_subject s = {"admin", "psfleet", "demo"};

        /* a directory that cannot be written (a file where it should be: root may write anywhere else) */
        write_text("plain", "x");
        char *crt = path("plain/ca.crt"), *key = path("plain/ca.key");
        struct x509_file fc = {crt, 0644, (gid_t)-1}, fk = {key, 0600, (gid_t)-1};
        assert_int_equal(x509_cred_save(ca, &fc, &fk, err, sizeof(err)), -ENOTDIR);
        assert_non_null(strstr(err, key));
        free(crt);
        free(key);

        /* missing, corrupt, mismatched, encrypted files: each named */
        save(ca, "ca3", 0600);
        crt = path("ca3.crt");
        key = path("ca3.key");
        char *missing = path("nothing.crt"), *bad = path("bad.crt"), *badkey = path("bad.key");
        assert_int_equal(x509_cred_load(missing, key, true, &c, err, sizeof(err)), -ENOENT);
        assert_non_null(strstr(err, missing));
        write_text("bad.crt", "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n");
        assert_int_equal(x509_cred_load(bad, key, true, &c, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, bad));
        assert_non_null(strstr(err, "not a PEM certificate"));
        write_text("bad.key", "garbage\n");
        assert_int_equal(x509_cred_load(crt, badkey, true, &c, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, badkey));
        assert_int_equal(x509_issue(ca, &s, "admin.demo.psfleet", 5, &leaf, err, sizeof(err)), 0);
        save(leaf, "admin", 0640);
        char *lkey = path("admin.key");
        assert_int_equal(x509_cred_load(crt, lkey, true, &c, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "not the key of"));
        assert_non_null(strstr(err, lkey));
        /* an encrypted key is refused, not asked about on the terminal */
        EVP_PKEY *k = read_key("ca3.key");
        FILE *f = fopen(badkey, "w");
        assert_non_null(f);
        assert_true(PEM_write_PKCS8PrivateKey(f, k, EVP_aes_256_cbc(), "secret", 6, NULL, NULL));
        fclose(f);
        EVP_PKEY_free(k);
        assert_int_equal(x509_cred_load(crt, badkey, true, &c, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "unencrypted"));
        assert_ptr_equal(c, (struct x509_cred *)1);     /* untouched on failure */

        /* validity out of range; no DNS name */
        c = NULL;
        assert_int_equal(x509_ca_new(&ca_subject, 0, &c, err, sizeof(err)), -EINVAL);
        assert_int_equal(x509_issue(ca, &s, "admin.demo.psfleet", 40000, &c, err, sizeof(err)), -EINVAL);
        assert_int_equal(x509_issue(ca, &s, "", 5, &c, err, sizeof(err)), -EINVAL);
        assert_null(c);

        free(crt);
        free(key);
        free(missing);
        free(bad);
        free(badkey);
        free(lkey);
        x509_cred_free(leaf);
        x509_cred_free(ca);
}

UNIT_TEST_MAIN(setup, scratch_dir_remove,
        cmocka_unit_test(test_ca_and_leaf),
        cmocka_unit_test(test_other_ca),
        cmocka_unit_test(test_load_and_issue_more),
        cmocka_unit_test(test_leaf_within_ca),
        cmocka_unit_test(test_errors))
