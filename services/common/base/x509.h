/* Certificates for mutual TLS, made with OpenSSL's libcrypto: a self-signed CA, the leaf certificates
 * it issues (each both a TLS server and a TLS client), and their PEM files. Names are the caller's
 * (`psfleet certs` gives the job's); nothing here knows psfleet's roles. Keys are EC P-256, signatures
 * ECDSA with SHA-256. Thread-safe; a cred may be read by several threads at once. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define X509_CA_DAYS 3650       /* a CA: 10 years */
#define X509_LEAF_DAYS 825      /* a leaf: the longest validity browsers ever accepted; the node rotates sooner */

/* A subject: CN, O, OU (UTF-8; o and ou may be NULL to leave them out). */
struct x509_subject {
        const char *cn, *o, *ou;
};

/* A certificate with its private key (a CA or a leaf). Opaque. */
struct x509_cred;

/* ---- Errors ----
 * Every function that takes (err, errlen) writes one line there on failure, naming the file when one
 * is involved ("/etc/psfleet/tls/demo/ca.crt: not a PEM certificate: ..."), and returns -errno:
 * -EINVAL for a file that is not what it should be (not PEM, a key that does not match, not a CA),
 * -ENOMEM, -EIO for a failure inside libcrypto, or the -errno of the file system. err may be NULL. */

/* A new CA: a fresh key, a self-signed certificate with basicConstraints CA:TRUE, pathlen 0 (critical),
 * keyUsage keyCertSign and cRLSign (critical), a subject key identifier, a random 128-bit serial;
 * valid from an hour ago (for the nodes' clock skew) for `days` days. Returns 0 and *ret (free with
 * x509_cred_free). */
int x509_ca_new(const struct x509_subject *subject, uint32_t days, struct x509_cred **ret, char *err,
                size_t errlen);

/* A new leaf signed by ca: a fresh key; subject; the DNS subjectAltName dns; basicConstraints CA:FALSE;
 * keyUsage digitalSignature (critical); extendedKeyUsage serverAuth and clientAuth; subject and
 * authority key identifiers; a random 128-bit serial; valid from an hour ago for `days` days, but not
 * beyond the CA's own end. Returns 0 and *ret (free with x509_cred_free). */
int x509_issue(const struct x509_cred *ca, const struct x509_subject *subject, const char *dns, uint32_t days,
               struct x509_cred **ret, char *err, size_t errlen);

/* Reads a certificate (PEM) and its private key (PEM, unencrypted) and checks that they belong
 * together; with is_ca, also that the certificate is a CA's. Returns 0 and *ret. */
int x509_cred_load(const char *cert_path, const char *key_path, bool is_ca, struct x509_cred **ret, char *err,
                   size_t errlen);

/* Where and how x509_cred_save writes a file: its mode, exactly (the umask does not apply), and its
 * group ((gid_t)-1: the writer's). */
struct x509_file {
        const char *path;
        mode_t mode;
        gid_t gid;
};

/* Writes the key, then the certificate, each atomically (a temp file beside it, fsync, rename) with
 * its mode and group set before it appears under its name. When the certificate cannot be written,
 * the key just written is removed again. Returns 0 or -errno. */
int x509_cred_save(const struct x509_cred *c, const struct x509_file *cert, const struct x509_file *key,
                   char *err, size_t errlen);

/* Checks c's certificate as a TLS peer would: a chain to ca's certificate (signature, validity now,
 * CA flags). Returns 0, or -EINVAL with libcrypto's reason in err. */
int x509_cred_verify(const struct x509_cred *c, const struct x509_cred *ca, char *err, size_t errlen);

/* The end of c's certificate's validity, in seconds since the epoch. */
time_t x509_cred_not_after(const struct x509_cred *c);

/* Frees c. NULL-safe; returns NULL. */
struct x509_cred *x509_cred_free(struct x509_cred *c);
