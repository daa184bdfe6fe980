/* The process's metrics (base/metrics.h) served over HTTP at /metrics by libmicrohttpd, on its own
 * thread: a scrape never runs on a thread that trains or serves RPCs. */
#pragma once
#include <stddef.h>

#include "rpc.h"

struct metrics_http;

/* Checks metrics.listen: "HOST:PORT" (HOST an IPv4 or IPv6 address, [v6] bracketed, or a name that
 * resolves), PORT 1..65535. Returns 0, or -EINVAL with the reason in err. */
int metrics_http_check(const char *addr, char *err, size_t errlen);

/* Binds `addr` and serves GET /metrics (404 for any other path, 405 for any other method). With tls
 * (copied; the process's rpc_security()), HTTPS with tls's certificate and key, TLS 1.2 or 1.3, and
 * only for a scraper whose client certificate chains to tls's CA and names a task of tls->job that
 * transport/authz lets read "GET /metrics"; anyone else gets 403 with the reason, and one rate-limited
 * journal line. NULL: plain HTTP. Returns 0 and *ret (stop it with metrics_http_free), or -errno
 * (-EADDRINUSE, -EADDRNOTAVAIL, -EINVAL, -ENOTSUP: libmicrohttpd without TLS) with the reason in err. */
int metrics_http_start(const char *addr, const struct rpc_tls *tls, struct metrics_http **ret, char *err,
                       size_t errlen);

/* Stops serving and frees; NULL-safe; returns NULL. */
struct metrics_http *metrics_http_free(struct metrics_http *h);
