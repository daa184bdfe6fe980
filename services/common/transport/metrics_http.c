/* /metrics over HTTP. The socket is bound here (so a taken port is a clear -EADDRINUSE at start) and
 * handed to libmicrohttpd, which parses HTTP and serves it on its own thread. */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "util.h"

struct metrics_http {
        struct MHD_Daemon *d;
        int fd;
};

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

static enum MHD_Result serve(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                             const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
        (void)cls, (void)version, (void)upload_data, (void)upload_data_size, (void)con_cls;
        unsigned status = MHD_HTTP_OK;
        char *body = NULL;
        size_t len = 0;
        if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
                status = MHD_HTTP_METHOD_NOT_ALLOWED;
        else if (strcmp(url, "/metrics") != 0)
                status = MHD_HTTP_NOT_FOUND;
        else if (!(body = metrics_render(&len)))
                status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        if (status != MHD_HTTP_OK) {
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

int metrics_http_start(const char *addr, struct metrics_http **ret, char *err, size_t errlen) {
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
        h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL, serve, NULL,
                                MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, 16u,
                                MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
        if (!h->d) {
                close(fd);
                free(h);
                return errf(err, errlen, -EIO, "metrics.listen %s: libmicrohttpd did not start", addr);
        }
        log_info("metrics at http://%s/metrics", addr);
        *ret = h;
        return 0;
}

struct metrics_http *metrics_http_free(struct metrics_http *h) {
        if (!h)
                return NULL;
        MHD_stop_daemon(h->d);
        close(h->fd);
        free(h);
        return NULL;
}
