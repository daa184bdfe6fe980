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
/* True when the job's daemons speak mutual TLS: security.mode mtls, or auto with an endpoint beyond
 * loopback. */
bool tls_job_uses_mtls(const struct job_config *c);

/* pattern with {job} and {task} replaced. -ENAMETOOLONG, -EINVAL for another {...}. */
int tls_expand_path(const char *pattern, const char *job, const char *task, char *buf, size_t len);

/* Resolves security.* for `task` ("ps-0", "chief", "admin"; see authz_task_name). Returns 0 with
 * *ret the credentials (rpc_tls_free them) under mTLS, or 0 with *ret NULL when the job runs
 * insecure (a warning is logged when that is allowed only by security.allow_insecure). -EINVAL: a
 * config error, one line in err naming the keys, the files and what to do; -ENOMEM. */
int tls_from_config(const struct job_config *c, const char *task, struct rpc_tls **ret, char *err, size_t errlen);
