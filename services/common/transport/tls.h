/* A job's security.* keys made real for one task: which mode is in force (auto: insecure only when
 * every endpoint of the cluster is loopback), and for mutual TLS the CA, certificate and key read and
 * checked before anything listens — a missing file, a certificate of another task, another CA, a key
 * that does not match or a certificate out of its validity is a config error naming the key and the
 * file, not a handshake that fails later with no reason. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "config.h"
#include "rpc.h"

/* The first endpoint of the cluster that is not loopback ("ps:1 at 10.0.0.2:7001") in buf; false
 * when every endpoint is loopback (127.0.0.0/8, ::1, localhost). */
bool tls_remote_endpoint(const struct job_config *c, char *buf, size_t len);

/* "127.0.0.1:7001", "[::1]:7001", "localhost:7001". */
bool tls_addr_is_loopback(const char *addr);
/* True when the job's daemons speak mutual TLS: security.mode mtls or auto (only insecure does not). */
bool tls_job_uses_mtls(const struct job_config *c);
/* True when they do so with the job's own credentials in security.auto_dir: auto, every endpoint
 * loopback. */
bool tls_job_uses_auto(const struct job_config *c);

/* For a job that tls_job_uses_auto: makes security.auto_dir (0700, refused when it is another user's
 * or open to others) and in it, under a lock (so that daemons starting at once agree), the job's CA
 * unless it exists and a key (0600) and certificate for each of the n tasks that has no valid pair
 * yet. Returns 0; -EINVAL with one line in err naming the key, the directory and the reason; -errno of
 * the file system likewise. Not for another user's job: it writes into the directory. */
int tls_auto_prepare(const struct job_config *c, const char *const *tasks, size_t n, char *err, size_t errlen);

/* The files `task` presents: the CA's certificate, its own certificate and key, as tls_from_config
 * reads them (security.ca/cert/key, or security.auto_dir's for auto on loopback). 0, or -EINVAL /
 * -ENAMETOOLONG for a pattern that cannot be expanded. */
int tls_paths(const struct job_config *c, const char *task, char ca[1024], char cert[1024], char key[1024]);

/* pattern with {job} and {task} replaced. -ENAMETOOLONG, -EINVAL for another {...}. */
int tls_expand_path(const char *pattern, const char *job, const char *task, char *buf, size_t len);

/* Resolves security.* for `task` ("ps-0", "chief", "admin"; see authz_task_name). Returns 0 with
 * *ret the credentials (rpc_tls_free them) under mTLS (for auto on loopback those tls_auto_prepare
 * made; nothing is made here), or 0 with *ret NULL when the job runs insecure (a warning is logged
 * when that is allowed only by security.allow_insecure). -EINVAL: a
 * config error, one line in err naming the keys, the files and what to do; -ENOMEM. */
int tls_from_config(const struct job_config *c, const char *task, struct rpc_tls **ret, char *err, size_t errlen);
