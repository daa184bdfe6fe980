/* The RPC layer's server over gRPC C core: see rpc.h. Shutdown order follows gRPC core's own end-to-end
 * tests: shutdown_and_notify, cancel_all_calls, wait for the tag and for every call to end, then shut
 * down and drain the completion queue, join, destroy. */
#include "rpc.h"
#include "rpc-internal.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "authz.h"
#include "log.h"
#include "util.h"
#include "wire.h"

/* ---------------- server ---------------- */

enum tag_kind { TAG_NEW_CALL, TAG_NEW_GENERIC, TAG_CLOSE, TAG_REPLY, TAG_SEND, TAG_GENERIC_DONE, TAG_SHUTDOWN };

struct tag {
        enum tag_kind kind;
        void *obj;
};

struct rpc_call {
        struct tag t_new, t_close, t_reply, t_send;
        struct rpc_server *s;
        size_t method;
        grpc_call *call;
        gpr_timespec deadline;
        grpc_metadata_array md;
        grpc_byte_buffer *payload;
        atomic_int refs;
        atomic_bool ended;
        int cancelled;               /* written by RECV_CLOSE_ON_SERVER */
        atomic_bool close_done;
        bool initial_md_sent;
        grpc_byte_buffer *out;       /* reply or streamed message being sent */
        grpc_slice details;
        bool have_details;
        /* streaming: the sender waits here for TAG_SEND */
        pthread_mutex_t mu;
        pthread_cond_t cond;
        bool send_done, send_ok;
        struct peer peer;            /* who calls: set before the handler runs */
};

struct generic_call {
        struct tag t_new, t_done;
        struct rpc_server *s;
        grpc_call *call;
        grpc_call_details details;
        grpc_metadata_array md;
        int cancelled;
};

struct rpc_server {
        grpc_server *server;
        grpc_completion_queue *cq;
        struct rpc_method *methods;
        void **registered;
        size_t n_methods;
        unsigned n_threads;
        pthread_t *threads;
        int port;
        bool started, stopped;
        struct tag t_shutdown;
        pthread_mutex_t mu;
        pthread_cond_t cond;
        uint64_t in_flight;
        bool shutting_down, shutdown_notified;
        char *job;                   /* mTLS: peers must hold a certificate of a task of this job; NULL: plain TCP */
        struct log_ratelimit refusals;   /* REFUSALS_LOGGED per REFUSAL_WINDOW_US */
};

#define REFUSALS_LOGGED 20
#define REFUSAL_WINDOW_US 10000000ull

static void server_call_done(struct rpc_server *s) {
        pthread_mutex_lock(&s->mu);
        s->in_flight--;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->mu);
}

static void call_unref(struct rpc_call *c) {
        if (atomic_fetch_sub(&c->refs, 1) != 1)
                return;
        struct rpc_server *s = c->s;
        if (c->call)
                grpc_call_unref(c->call);
        grpc_metadata_array_destroy(&c->md);
        if (c->payload)
                grpc_byte_buffer_destroy(c->payload);
        if (c->out)
                grpc_byte_buffer_destroy(c->out);
        if (c->have_details)
                grpc_slice_unref(c->details);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cond);
        bool counted = c->call != NULL;
        free(c);
        if (counted)
                server_call_done(s);
}

static int arm_method(struct rpc_server *s, size_t m) {
        struct rpc_call *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->t_new = (struct tag){TAG_NEW_CALL, c};
        c->t_close = (struct tag){TAG_CLOSE, c};
        c->t_reply = (struct tag){TAG_REPLY, c};
        c->t_send = (struct tag){TAG_SEND, c};
        c->s = s;
        c->method = m;
        atomic_init(&c->refs, 1);
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cond, NULL);
        grpc_metadata_array_init(&c->md);
        grpc_call_error e = grpc_server_request_registered_call(s->server, s->registered[m], &c->call, &c->deadline,
                                                                &c->md, &c->payload, s->cq, s->cq, &c->t_new);
        if (e != GRPC_CALL_OK) {
                call_unref(c);
                return -EIO;
        }
        return 0;
}

static int arm_generic(struct rpc_server *s) {
        struct generic_call *g = calloc(1, sizeof(*g));
        if (!g)
                return -ENOMEM;
        g->t_new = (struct tag){TAG_NEW_GENERIC, g};
        g->t_done = (struct tag){TAG_GENERIC_DONE, g};
        g->s = s;
        grpc_call_details_init(&g->details);
        grpc_metadata_array_init(&g->md);
        if (grpc_server_request_call(s->server, &g->call, &g->details, &g->md, s->cq, s->cq, &g->t_new) != GRPC_CALL_OK) {
                grpc_call_details_destroy(&g->details);
                grpc_metadata_array_destroy(&g->md);
                free(g);
                return -EIO;
        }
        return 0;
}

static void generic_free(struct generic_call *g) {
        bool counted = g->call != NULL;
        struct rpc_server *s = g->s;
        if (g->call)
                grpc_call_unref(g->call);
        grpc_call_details_destroy(&g->details);
        grpc_metadata_array_destroy(&g->md);
        free(g);
        if (counted)
                server_call_done(s);
}

static bool server_accepting(struct rpc_server *s) {
        pthread_mutex_lock(&s->mu);
        bool r = !s->shutting_down;
        pthread_mutex_unlock(&s->mu);
        return r;
}

/* A new call counts as in flight; true when the server still takes calls (the caller arms the next). */
static bool call_started(struct rpc_server *s) {
        pthread_mutex_lock(&s->mu);
        s->in_flight++;
        pthread_mutex_unlock(&s->mu);
        return server_accepting(s);
}

static void on_new_generic(struct generic_call *g, bool ok) {
        struct rpc_server *s = g->s;
        if (!ok) {
                g->call = NULL;   /* the request was cancelled by shutdown: no call */
                generic_free(g);
                return;
        }
        if (call_started(s))
                arm_generic(s);
        /* An unknown method is answered at once, or the client would wait for its whole deadline. */
        char msg[300];
        snprintf(msg, sizeof(msg), "unknown method %.*s", (int)GRPC_SLICE_LENGTH(g->details.method),
                 (const char *)GRPC_SLICE_START_PTR(g->details.method));
        grpc_slice details = grpc_slice_from_copied_string(msg);
        grpc_op ops[3];
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[1].data.send_status_from_server.status = GRPC_STATUS_UNIMPLEMENTED;
        ops[1].data.send_status_from_server.status_details = &details;
        ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[2].data.recv_close_on_server.cancelled = &g->cancelled;
        grpc_call_error e = grpc_call_start_batch(g->call, ops, 3, &g->t_done, NULL);
        grpc_slice_unref(details);
        if (e != GRPC_CALL_OK)
                generic_free(g);
}

/* One journal line per refusal, at most REFUSALS_LOGGED per window per server; the rest are counted.
 * A flood of hostile calls cannot flood the journal. */
static void log_refusal(struct rpc_server *s, struct rpc_call *c, const char *why) {
        if (!log_ratelimit_ok(&s->refusals, "refused calls"))
                return;
        char *addr = grpc_call_get_peer(c->call);
        log_warning("refused %s from %s (%s): %s", s->methods[c->method].path, c->peer.name, addr ? addr : "?", why);
        gpr_free(addr);
}

/* Who calls, from the certificate the TLS handshake verified; and whether the table lets it call
 * this method. A refused call is ended here, PERMISSION_DENIED, before any handler sees it. */
static bool authorize(struct rpc_call *c) {
        struct rpc_server *s = c->s;
        if (!s->job) {
                c->peer = (struct peer){.role = PEER_INSECURE};
                snprintf(c->peer.name, sizeof(c->peer.name), "insecure caller");
                return true;
        }
        const char *names[8];
        size_t n = 0;
        grpc_auth_context *ctx = grpc_call_auth_context(c->call);
        if (ctx) {
                grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_SAN_PROPERTY_NAME);
                const grpc_auth_property *p;
                while ((p = grpc_auth_property_iterator_next(&it)) && n < ELEMENTSOF(names))
                        names[n++] = p->value;   /* NUL-terminated by gRPC */
        }
        authz_peer_from_names(s->job, names, n, &c->peer);
        if (ctx)
                grpc_auth_context_release(ctx);
        char why[300];
        if (authz_check(s->methods[c->method].path, &c->peer, why, sizeof(why)) == 0)
                return true;
        rpc_call_refuse(c, "%s", why);
        return false;
}

int rpc_call_refuse(struct rpc_call *c, const char *fmt, ...) {
        char why[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        log_refusal(c->s, c, why);
        return rpc_call_fail(c, GRPC_STATUS_PERMISSION_DENIED, "%s", why);
}

static void on_new_call(struct rpc_call *c, bool ok) {
        struct rpc_server *s = c->s;
        if (!ok) {
                /* Shutdown cancelled the request before a call matched it. */
                if (c->call) {
                        grpc_call_unref(c->call);
                        c->call = NULL;
                }
                call_unref(c);
                return;
        }
        if (call_started(s))
                arm_method(s, c->method);

        /* Learn of cancellation (client gone, deadline, shutdown) even while a reply is deferred. */
        atomic_store(&c->refs, 2);
        grpc_op op;
        memset(&op, 0, sizeof(op));
        op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        op.data.recv_close_on_server.cancelled = &c->cancelled;
        if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK)
                call_unref(c);
        if (authorize(c))
                s->methods[c->method].handler(c, s->methods[c->method].userdata);
}

static void *server_thread(void *arg) {
        struct rpc_server *s = arg;
        for (;;) {
                grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
                if (ev.type == GRPC_QUEUE_SHUTDOWN)
                        break;
                if (ev.type != GRPC_OP_COMPLETE)
                        continue;
                struct tag *t = ev.tag;
                switch (t->kind) {
                case TAG_NEW_CALL:
                        on_new_call(t->obj, ev.success);
                        break;
                case TAG_NEW_GENERIC:
                        on_new_generic(t->obj, ev.success);
                        break;
                case TAG_CLOSE: {
                        struct rpc_call *c = t->obj;
                        atomic_store(&c->close_done, true);
                        call_unref(c);
                        break;
                }
                case TAG_REPLY:
                        call_unref(t->obj);
                        break;
                case TAG_SEND: {
                        struct rpc_call *c = t->obj;
                        pthread_mutex_lock(&c->mu);
                        c->send_done = true;
                        c->send_ok = ev.success;
                        pthread_cond_broadcast(&c->cond);
                        pthread_mutex_unlock(&c->mu);
                        break;
                }
                case TAG_GENERIC_DONE:
                        generic_free(t->obj);
                        break;
                case TAG_SHUTDOWN:
                        pthread_mutex_lock(&s->mu);
                        s->shutdown_notified = true;
                        pthread_cond_broadcast(&s->cond);
                        pthread_mutex_unlock(&s->mu);
                        break;
                }
        }
        return NULL;
}

/* gRPC reports a failed bind only as a multi-line error dump on stderr, and as no reason at all to the
 * caller: so the bind is tried first, the way gRPC will (psfleet check asks the same question). */
int rpc_probe_bind(const char *addr) {
        const char *colon = strrchr(addr, ':');
        if (!colon || strstr(addr, "://") || strncmp(addr, "unix:", 5) == 0 || strncmp(addr, "ipv4:", 5) == 0 ||
            strncmp(addr, "ipv6:", 5) == 0)
                return 0;
        char h[256];
        const char *port;
        if (split_host_port(addr, h, sizeof(h), &port) < 0)
                return 0;
        struct addrinfo hints = {.ai_flags = AI_PASSIVE, .ai_socktype = SOCK_STREAM}, *res;
        if (getaddrinfo(*h ? h : NULL, port, &hints, &res) != 0)
                return -EADDRNOTAVAIL;
        int first = 0;
        bool bound = false;
        for (struct addrinfo *a = res; a && !bound; a = a->ai_next) {
                int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol), one = 1;
                if (fd < 0)
                        continue;
                setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));   /* as gRPC does */
                if (bind(fd, a->ai_addr, a->ai_addrlen) == 0)
                        bound = true;
                else if (!first)
                        first = -errno;
                close(fd);
        }
        freeaddrinfo(res);
        return bound || !first ? 0 : first;
}

int rpc_server_new(const char *addr, const struct rpc_method *methods, size_t n_methods, unsigned threads,
                   struct rpc_server **ret) {
        return rpc_server_new_opts(addr, methods, n_methods, threads, NULL, ret);
}

int rpc_server_new_opts(const char *addr, const struct rpc_method *methods, size_t n_methods, unsigned threads,
                        const struct rpc_server_opts *opts, struct rpc_server **ret) {
        const struct rpc_tls *tls = opts && opts->tls ? opts->tls : rpc_security();
        size_t max_receive = opts ? opts->max_receive : 0;
        int r = rpc_probe_bind(addr);
        if (r < 0)
                return r;
        rpc_global_init();
        die_if(threads == 0, "rpc_server_new: threads == 0");
        struct rpc_server *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->cond, NULL);
        s->refusals = (struct log_ratelimit)LOG_RATELIMIT_INIT(REFUSAL_WINDOW_US, REFUSALS_LOGGED);
        s->t_shutdown = (struct tag){TAG_SHUTDOWN, s};
        s->n_threads = threads;
        s->n_methods = n_methods;
        s->methods = calloc(n_methods ? n_methods : 1, sizeof(*s->methods));
        s->registered = calloc(n_methods ? n_methods : 1, sizeof(*s->registered));
        s->threads = calloc(threads, sizeof(*s->threads));
        if (!s->methods || !s->registered || !s->threads) {
                rpc_server_free(s);
                return -ENOMEM;
        }
        memcpy(s->methods, methods, n_methods * sizeof(*methods));

        grpc_arg args[] = {
                /* A request larger than the largest legal one is refused as it arrives. */
                {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                 .value.integer = max_receive && max_receive < INT_MAX ? (int)max_receive : -1},
                {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = -1},
                /* A second server on the same port must fail, not share connections with the first. */
                {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
        };
        grpc_channel_args cargs = {.num_args = 3, .args = args};
        grpc_arg qa;
        grpc_arg all[4];
        grpc_resource_quota *q = NULL;
        if (max_receive) {
                q = grpc_resource_quota_create("server");
                /* what gRPC may hold for this server at once: every legal request in flight, and room */
                size_t in_flight = opts->max_in_flight ? opts->max_in_flight : 2;
                grpc_resource_quota_resize(q, (in_flight + 1) * max_receive + (16u << 20));
                qa.type = GRPC_ARG_POINTER;
                qa.key = (char *)GRPC_ARG_RESOURCE_QUOTA;
                qa.value.pointer.p = q;
                qa.value.pointer.vtable = grpc_resource_quota_arg_vtable();
                memcpy(all, args, sizeof(args));
                all[3] = qa;
                cargs = (grpc_channel_args){.num_args = 4, .args = all};
        }
        s->server = grpc_server_create(&cargs, NULL);
        if (q)
                grpc_resource_quota_unref(q);   /* the server holds its own reference */
        s->cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(s->server, s->cq, NULL);
        for (size_t i = 0; i < n_methods; i++)
                s->registered[i] = grpc_server_register_method(s->server, methods[i].path, NULL,
                                                               GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        grpc_server_credentials *creds;
        if (tls) {
                /* Every method must be in the authorization table: an RPC nobody decided on is a bug. */
                for (size_t i = 0; i < n_methods; i++)
                        if (!authz_allowed(methods[i].path)) {
                                fprintf(stderr, "rpc_server_new: %s is not in the authorization table (authz.c)\n",
                                        methods[i].path);
                                abort();
                        }
                s->job = strdup(tls->job);
                grpc_ssl_pem_key_cert_pair pair = {.private_key = tls->key_pem, .cert_chain = tls->cert_pem};
                creds = grpc_ssl_server_credentials_create_ex(
                        tls->ca_pem, &pair, 1, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY, NULL);
                if (!s->job || !creds) {
                        if (creds)
                                grpc_server_credentials_release(creds);
                        rpc_server_free(s);
                        return -ENOMEM;
                }
        } else {
                creds = grpc_insecure_server_credentials_create();
        }
        s->port = grpc_server_add_http2_port(s->server, addr, creds);
        grpc_server_credentials_release(creds);
        if (s->port <= 0) {
                rpc_server_free(s);
                return -EADDRINUSE;
        }
        *ret = s;
        return 0;
}

int rpc_server_port(const struct rpc_server *s) {
        return s->port;
}

uint64_t rpc_server_in_flight(const struct rpc_server *s) {
        pthread_mutex_lock((pthread_mutex_t *)&s->mu);
        uint64_t n = s->in_flight;
        pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
        return n;
}

int rpc_server_start(struct rpc_server *s) {
        die_if(s->started, "rpc_server_start: started twice");
        grpc_server_start(s->server);
        s->started = true;
        /* Several requests armed per method, so concurrent calls do not queue behind re-arming. */
        unsigned per_method = s->n_threads < 4 ? 4 : s->n_threads;
        for (size_t m = 0; m < s->n_methods; m++)
                for (unsigned k = 0; k < per_method; k++)
                        if (arm_method(s, m) < 0)
                                return -EIO;
        if (arm_generic(s) < 0)
                return -EIO;
        for (unsigned i = 0; i < s->n_threads; i++) {
                int r = pthread_create(&s->threads[i], NULL, server_thread, s);
                if (r != 0) {
                        s->n_threads = i;
                        return -r;
                }
        }
        return 0;
}

#define RPC_SHUTDOWN_GRACE_MS 1000

/* Waits up to ms for the shutdown notification and for every call to have ended. */
static int server_wait_idle(struct rpc_server *s, uint64_t ms) {
        struct timespec until = realtime_in_ms(ms);
        int r = 0;
        pthread_mutex_lock(&s->mu);
        while (!(s->shutdown_notified && s->in_flight == 0) && r == 0)
                if (pthread_cond_timedwait(&s->cond, &s->mu, &until) == ETIMEDOUT)
                        r = -ETIMEDOUT;
        pthread_mutex_unlock(&s->mu);
        return r;
}

int rpc_server_shutdown(struct rpc_server *s, uint64_t timeout_ms) {
        if (!s->started || s->stopped)
                return 0;
        pthread_mutex_lock(&s->mu);
        s->shutting_down = true;
        pthread_mutex_unlock(&s->mu);
        grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
        /* Replies already given (a Stop call's own, say) are still on their way out: cancelling every
         * call at once would turn them into UNAVAILABLE at the client. So calls get a short grace to
         * end; only those still running after it (streams, held replies) are cancelled. */
        uint64_t grace = timeout_ms / 2 < RPC_SHUTDOWN_GRACE_MS ? timeout_ms / 2 : RPC_SHUTDOWN_GRACE_MS;
        if (server_wait_idle(s, grace) < 0)
                grpc_server_cancel_all_calls(s->server);
        if (server_wait_idle(s, timeout_ms - grace) < 0)
                return -ETIMEDOUT;   /* a handler still holds a call: destroying the queue now would abort */

        grpc_completion_queue_shutdown(s->cq);
        for (unsigned i = 0; i < s->n_threads; i++)
                pthread_join(s->threads[i], NULL);
        s->stopped = true;
        return 0;
}

struct rpc_server *rpc_server_free(struct rpc_server *s) {
        if (!s)
                return NULL;
        if (s->started && !s->stopped && rpc_server_shutdown(s, 10000) < 0) {
                /* Leak rather than abort inside gRPC: some handler never ended its call. */
                fprintf(stderr, "rpc: server shutdown timed out with %llu call(s) in flight\n",
                        (unsigned long long)rpc_server_in_flight(s));
                return NULL;
        }
        if (s->server) {
                if (!s->started) {
                        grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
                        grpc_server_cancel_all_calls(s->server);
                        grpc_completion_queue_shutdown(s->cq);
                        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type
                               != GRPC_QUEUE_SHUTDOWN)
                                ;
                }
                grpc_server_destroy(s->server);
        }
        if (s->cq)
                grpc_completion_queue_destroy(s->cq);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cond);
        free(s->methods);
        free(s->job);
        free(s->registered);
        free(s->threads);
        free(s);
        return NULL;
}

const struct peer *rpc_call_identity(const struct rpc_call *c) {
        return &c->peer;
}

grpc_byte_buffer *rpc_call_payload(struct rpc_call *c) {
        return c->payload;
}

grpc_byte_buffer *rpc_call_take_payload(struct rpc_call *c) {
        grpc_byte_buffer *p = c->payload;
        c->payload = NULL;
        return p;
}

const char *rpc_call_method(const struct rpc_call *c) {
        return c->s->methods[c->method].path;
}

char *rpc_call_peer(const struct rpc_call *c) {
        char *p = grpc_call_get_peer(c->call);
        char *r = strdup(p ? p : "?");
        gpr_free(p);
        return r;
}

bool rpc_call_cancelled(const struct rpc_call *c) {
        return atomic_load(&c->close_done) && c->cancelled;
}

uint64_t rpc_call_deadline_us(const struct rpc_call *c) {
        gpr_timespec d = gpr_convert_clock_type(c->deadline, GPR_CLOCK_REALTIME);
        if (gpr_time_cmp(d, gpr_inf_future(GPR_CLOCK_REALTIME)) == 0 || d.tv_sec < 0)
                return UINT64_MAX;
        return (uint64_t)d.tv_sec * 1000000u + (uint64_t)d.tv_nsec / 1000u;
}

/* Starts a batch of ops on a call: the initial metadata first, once per call. Returns the ops used. */
static size_t ops_begin(struct rpc_call *c, grpc_op *ops, size_t cap) {
        memset(ops, 0, cap * sizeof(*ops));
        if (c->initial_md_sent)
                return 0;
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->initial_md_sent = true;
        return 1;
}

static int call_end(struct rpc_call *c, grpc_byte_buffer *msg, grpc_status_code code, const char *message) {
        die_if(atomic_exchange(&c->ended, true), "rpc: a call was ended twice");
        grpc_op ops[3];
        size_t n = ops_begin(c, ops, 3);
        if (msg) {
                c->out = msg;
                ops[n].op = GRPC_OP_SEND_MESSAGE;
                ops[n++].data.send_message.send_message = msg;
        }
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = code;
        if (message && *message) {
                c->details = grpc_slice_from_copied_string(message);
                c->have_details = true;
                ops[n].data.send_status_from_server.status_details = &c->details;
        }
        n++;
        grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_reply, NULL);
        if (e != GRPC_CALL_OK) {
                call_unref(c);
                return -EIO;
        }
        return 0;
}

int rpc_call_reply(struct rpc_call *c, grpc_byte_buffer *reply) {
        if (!reply)
                reply = grpc_raw_byte_buffer_create(NULL, 0);
        return call_end(c, reply, GRPC_STATUS_OK, NULL);
}

int rpc_call_reply_msg(struct rpc_call *c, const ProtobufCMessage *m) {
        return rpc_call_reply(c, wire_pack(m));
}

static int call_fail_v(struct rpc_call *c, grpc_status_code code, const char *fmt, va_list ap) {
        char msg[1024];
        vsnprintf(msg, sizeof(msg), fmt, ap);
        return call_end(c, NULL, code, msg);
}

int rpc_call_fail(struct rpc_call *c, grpc_status_code code, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        int r = call_fail_v(c, code, fmt, ap);
        va_end(ap);
        return r;
}

int rpc_call_fail_errno(struct rpc_call *c, int err, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        int r = call_fail_v(c, rpc_status_from_errno(err), fmt, ap);
        va_end(ap);
        return r;
}

int rpc_call_send(struct rpc_call *c, grpc_byte_buffer *msg, uint64_t timeout_ms) {
        die_if(atomic_load(&c->ended), "rpc_call_send: call already ended");
        grpc_op ops[2];
        size_t n = ops_begin(c, ops, 2);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = msg;
        c->send_done = false;
        if (grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL) != GRPC_CALL_OK) {
                grpc_byte_buffer_destroy(msg);
                return -EIO;
        }
        struct timespec until = realtime_in_ms(timeout_ms);
        bool cancelled = false;
        pthread_mutex_lock(&c->mu);
        while (!c->send_done)
                if (pthread_cond_timedwait(&c->cond, &c->mu, &until) == ETIMEDOUT && !cancelled) {
                        /* A reader that stopped reading: cancel, the send then completes failed. */
                        grpc_call_cancel(c->call, NULL);
                        cancelled = true;
                }
        bool ok = c->send_ok;
        pthread_mutex_unlock(&c->mu);
        grpc_byte_buffer_destroy(msg);
        return ok ? 0 : (cancelled ? -ETIMEDOUT : -ECANCELED);
}

int rpc_call_finish(struct rpc_call *c, grpc_status_code code, const char *message) {
        return call_end(c, NULL, code, message);
}

