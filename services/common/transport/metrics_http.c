/* /metrics over HTTP, or HTTPS with client certificates when the job runs mutual TLS. The socket is
 * bound here (so a taken port is a clear -EADDRINUSE at start) and handed to libmicrohttpd, which
 * parses HTTP and TLS (GnuTLS) and serves it on its own thread; who may scrape is decided by the same
 * table (transport/authz) and the same certificate names as every gRPC call. */
#include <errno.h>
#include <fcntl.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "authz.h"
#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "util.h"

struct metrics_http {
        struct MHD_Daemon *d;
        int fd;
        /* HTTPS: the PEM buffers libmicrohttpd reads (it keeps no copy), and the job whose certificate
         * scrapers must hold; NULL: HTTP */
        struct rpc_tls *tls;
        struct log_ratelimit refusals;
};

#define METRICS_PATH "/metrics"
#define MAX_NAMES 16

/* Splits "HOST:PORT" / "[V6]:PORT" into host and port and resolves it. */
static int resolve(const char *addr, struct addrinfo **res, char *err, size_t errlen) {
        char host[256];
        const char *port_s;
        if (!addr || split_host_port(addr, host, sizeof(host), &port_s) < 0 || !*host)
                return errf(err, errlen, -EINVAL, "metrics.listen \"%s\" is not HOST:PORT", addr ? addr : "");
        uint64_t port;
        if (parse_u64(port_s, 1, 65535, &port) < 0)
                return errf(err, errlen, -EINVAL, "metrics.listen \"%s\": the port is not 1..65535", addr);
        struct addrinfo hints = {.ai_flags = AI_PASSIVE, .ai_socktype = SOCK_STREAM};
        int g = getaddrinfo(host, port_s, &hints, res);
        if (g != 0)
                return errf(err, errlen, -EINVAL, "metrics.listen \"%s\": %s", addr, gai_strerror(g));
        return 0;
}

int metrics_http_check(const char *addr, char *err, size_t errlen) {
        struct addrinfo *res;
        int r = resolve(addr, &res, err, errlen);
        if (r == 0)
                freeaddrinfo(res);
        return r;
}

/* The scraper's identity from the certificate it presented, verified against the job's CA (which
 * libmicrohttpd gave GnuTLS as the trust list). Returns 0 with *p, or -EPERM with the reason. */
static int scraper(struct MHD_Connection *c, const char *job, struct peer *p, char *why, size_t whylen) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
        gnutls_session_t session = ci ? (gnutls_session_t)ci->tls_session : NULL;
        unsigned status = 0, n_certs = 0;
        if (!session)
                return errf(why, whylen, -EPERM, "no TLS session");
        int r = gnutls_certificate_verify_peers2(session, &status);
        const gnutls_datum_t *certs = gnutls_certificate_get_peers(session, &n_certs);
        if (r == GNUTLS_E_NO_CERTIFICATE_FOUND || !certs || n_certs == 0)
                return errf(why, whylen, -EPERM, "no client certificate: scrape with a certificate of job %s "
                            "(psfleet certs --job %s; viewer.crt and viewer.key)", job, job);
        if (r < 0)
                return errf(why, whylen, -EPERM, "its certificate cannot be checked: %s", gnutls_strerror(r));
        if (status != 0) {
                gnutls_datum_t out = {0};
                r = gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &out, 0);
                errf(why, whylen, -EPERM, "its certificate is not valid for job %s: %s", job,
                     r == 0 && out.data ? (const char *)out.data : "verification failed");
                gnutls_free(out.data);
                return -EPERM;
        }
        gnutls_x509_crt_t crt;
        if (gnutls_x509_crt_init(&crt) < 0)
                return errf(why, whylen, -EPERM, "out of memory");
        char *names[MAX_NAMES];
        size_t n = 0;
        if (gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER) == 0)
                for (unsigned i = 0; n < MAX_NAMES; i++) {
                        char buf[256];
                        size_t len = sizeof(buf) - 1;
                        unsigned critical;
                        r = gnutls_x509_crt_get_subject_alt_name(crt, i, buf, &len, &critical);
                        if (r == GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE)
                                break;
                        if (r == GNUTLS_SAN_DNSNAME && len < sizeof(buf) && memchr(buf, '\0', len) == NULL) {
                                buf[len] = '\0';
                                if ((names[n] = strdup(buf)))
                                        n++;
                        }
                }
        gnutls_x509_crt_deinit(crt);
        authz_peer_from_names(job, (const char *const *)names, n, p);
        for (size_t i = 0; i < n; i++)
                free(names[i]);
        return authz_check("GET " METRICS_PATH, p, why, whylen);
}

/* One journal line per refused scrape, rate limited: a peer cannot flood the journal. */
static void log_refusal(struct metrics_http *h, struct MHD_Connection *c, const char *why) {
        if (!log_ratelimit_ok(&h->refusals, "refused scrapes"))
                return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        char host[NI_MAXHOST] = "?";
        if (ci && ci->client_addr)
                getnameinfo(ci->client_addr, ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                                     : sizeof(struct sockaddr_in),
                            host, sizeof(host), NULL, 0, NI_NUMERICHOST);
        log_warning("refused a scrape of " METRICS_PATH " from %s: %s", host, why);
}

static enum MHD_Result serve(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                             const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
        (void)version, (void)upload_data, (void)upload_data_size, (void)con_cls;
        struct metrics_http *h = cls;
        unsigned status = MHD_HTTP_OK;
        char *body = NULL, why[512];
        size_t len = 0;
        struct peer p;
        if (h->tls && scraper(c, h->tls->job, &p, why, sizeof(why)) < 0) {
                log_refusal(h, c, why);
                status = MHD_HTTP_FORBIDDEN;
                body = strdup_printf("forbidden: %s\n", why);
        } else if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
                status = MHD_HTTP_METHOD_NOT_ALLOWED;
        else if (strcmp(url, METRICS_PATH) != 0)
                status = MHD_HTTP_NOT_FOUND;
        else if (!(body = metrics_render(&len)))
                status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        if (status == MHD_HTTP_FORBIDDEN) {
                len = body ? strlen(body) : 0;
        } else if (status != MHD_HTTP_OK) {
                body = strdup_printf("%s\n", status == MHD_HTTP_NOT_FOUND ? "not found: the metrics are at /metrics"
                                             : status == MHD_HTTP_METHOD_NOT_ALLOWED ? "only GET"
                                                                                     : "out of memory");
                len = body ? strlen(body) : 0;
        }
        struct MHD_Response *resp = MHD_create_response_from_buffer(len, body ? body : "", body ? MHD_RESPMEM_MUST_FREE
                                                                                                : MHD_RESPMEM_PERSISTENT);
        if (!resp) {
                free(body);
                return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                                status == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain");
        enum MHD_Result r = MHD_queue_response(c, status, resp);
        MHD_destroy_response(resp);
        return r;
}

int metrics_http_start(const char *addr, const struct rpc_tls *tls, struct metrics_http **ret, char *err,
                       size_t errlen) {
        if (tls && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
                return errf(err, errlen, -ENOTSUP, "metrics.listen %s: the job runs mutual TLS, but this "
                            "libmicrohttpd was built without TLS", addr);
        struct addrinfo *res;
        int r = resolve(addr, &res, err, errlen);
        if (r < 0)
                return r;
        int fd = -1;
        r = -EADDRNOTAVAIL;
        for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
                fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
                if (fd < 0) {
                        r = -errno;
                        continue;
                }
                int one = 1;
                setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
                if (bind(fd, a->ai_addr, a->ai_addrlen) < 0 || listen(fd, 16) < 0) {
                        r = -errno;
                        close(fd);
                        fd = -1;
                }
        }
        freeaddrinfo(res);
        if (fd < 0)
                return errf(err, errlen, r, "metrics.listen %s: %s", addr, strerror(-r));
        struct metrics_http *h = calloc(1, sizeof(*h));
        if (!h) {
                close(fd);
                return -ENOMEM;
        }
        h->fd = fd;
        h->refusals = (struct log_ratelimit)LOG_RATELIMIT_INIT(10000000ull, 20);
        if (tls && !(h->tls = rpc_tls_copy(tls))) {
                metrics_http_free(h);
                return -ENOMEM;
        }
        /* libmicrohttpd closes the socket it was given when it stops: it gets a duplicate, so that h->fd is
         * ours to close and never a number some other thread has opened since */
        int mhd_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (mhd_fd < 0) {
                r = -errno;
                metrics_http_free(h);
                return errf(err, errlen, r, "metrics.listen %s: %s", addr, strerror(-r));
        }
        /* Client certificates are requested (the trust list makes libmicrohttpd ask for them) and checked
         * in serve(): a scrape without one is answered 403 with the reason, not a bare handshake failure. */
        h->d = tls ? MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_TLS, 0, NULL, NULL,
                                      serve, h, MHD_OPTION_LISTEN_SOCKET, mhd_fd, MHD_OPTION_CONNECTION_LIMIT, 16u,
                                      MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_HTTPS_MEM_KEY, h->tls->key_pem,
                                      MHD_OPTION_HTTPS_MEM_CERT, h->tls->cert_pem, MHD_OPTION_HTTPS_MEM_TRUST,
                                      h->tls->ca_pem, MHD_OPTION_HTTPS_PRIORITIES,
                                      "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2", MHD_OPTION_END)
                   : MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL, serve, h,
                                      MHD_OPTION_LISTEN_SOCKET, mhd_fd, MHD_OPTION_CONNECTION_LIMIT, 16u,
                                      MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
        if (!h->d) {
                metrics_http_free(h);
                return errf(err, errlen, -EIO, "metrics.listen %s: libmicrohttpd did not start%s", addr,
                            tls ? " (with the job's certificate and key)" : "");
        }
        log_info("metrics at %s://%s" METRICS_PATH "%s", tls ? "https" : "http", addr,
                 tls ? ", for client certificates of the job's CA" : "");
        *ret = h;
        return 0;
}

struct metrics_http *metrics_http_free(struct metrics_http *h) {
        if (!h)
                return NULL;
        if (h->d)
                MHD_stop_daemon(h->d);
        close(h->fd);
        rpc_tls_free(h->tls);
        free(h);
        return NULL;
}
