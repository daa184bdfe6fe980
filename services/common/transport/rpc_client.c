/* The RPC layer's client over gRPC C core: channels, unary calls alone or in batches, server streams;
 * see rpc.h. */
#include "rpc.h"
#include "rpc-internal.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "authz.h"
#include "log.h"
#include "util.h"
#include "wire.h"

/* ---------------- client ---------------- */

struct registered {
        char *method;
        void *handle;
};

struct rpc_channel {
        grpc_channel *ch;
        char *target, *name;
        pthread_mutex_t mu;
        struct registered *reg;
        size_t n_reg;
};

int rpc_channel_new(const char *target, const char *name, struct rpc_channel **ret) {
        return rpc_channel_new_tls(target, name, rpc_security(), ret);
}

/* Credentials for a channel to the task `name` names, and the DNS name its certificate must carry. */
static int channel_tls(const struct rpc_tls *tls, const char *name, char *server_name, size_t len,
                       grpc_channel_credentials **ret) {
        enum peer_role role;
        uint32_t index;
        char task[AUTHZ_TASK_MAX];
        if (!name || authz_parse_task(name, &role, &index) < 0)
                return -EINVAL;
        authz_task_name(role, index, task, sizeof(task));
        if (authz_dns_name(tls->job, task, server_name, len) < 0)
                return -EINVAL;
        grpc_ssl_pem_key_cert_pair pair = {.private_key = tls->key_pem, .cert_chain = tls->cert_pem};
        *ret = grpc_ssl_credentials_create(tls->ca_pem, &pair, NULL, NULL);
        return *ret ? 0 : -ENOMEM;
}

int rpc_channel_new_tls(const char *target, const char *name, const struct rpc_tls *tls, struct rpc_channel **ret) {
        rpc_global_init();
        char server_name[256];
        grpc_channel_credentials *creds = NULL;
        struct rpc_config rc;
        int r = rpc_channel_options(&rc);
        if (r >= 0 && tls)
                r = channel_tls(tls, name, server_name, sizeof(server_name), &creds);
        if (r < 0)
                return r;
        if (!tls)
                creds = grpc_insecure_credentials_create();
        struct rpc_channel *c = calloc(1, sizeof(*c));
        if (!c) {
                grpc_channel_credentials_release(creds);
                return -ENOMEM;
        }
        c->target = strdup(target);
        c->name = strdup(name ? name : target);
        pthread_mutex_init(&c->mu, NULL);
        grpc_arg args[] = {
                {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = -1},
                {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = -1},
                {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ENABLE_RETRIES, .value.integer = 0},
                /* Each channel its own connection: peers do not share one TCP stream by accident. */
                {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, .value.integer = 1},
                /* A peer that comes up late (a psd restarted by systemd) is noticed within a second by
                 * default, not after gRPC's default backoff of up to two minutes (rpc.* keys). */
                {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
                 .value.integer = (int)rc.initial_reconnect_backoff_ms},
                {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                 .value.integer = (int)rc.max_reconnect_backoff_ms},
                /* TLS: the server must be the task this channel is for, whatever address it has. */
                {.type = GRPC_ARG_STRING, .key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, .value.string = server_name},
        };
        grpc_channel_args cargs = {.num_args = ELEMENTSOF(args) - (tls ? 0 : 1), .args = args};
        c->ch = grpc_channel_create(target, creds, &cargs);
        grpc_channel_credentials_release(creds);
        if (!c->ch || !c->target || !c->name) {
                rpc_channel_free(c);
                return -ENOMEM;
        }
        *ret = c;
        return 0;
}

struct rpc_channel *rpc_channel_free(struct rpc_channel *c) {
        if (!c)
                return NULL;
        if (c->ch)
                grpc_channel_destroy(c->ch);
        for (size_t i = 0; i < c->n_reg; i++)
                free(c->reg[i].method);
        free(c->reg);
        pthread_mutex_destroy(&c->mu);
        free(c->target);
        free(c->name);
        free(c);
        return NULL;
}

const char *rpc_channel_target(const struct rpc_channel *c) {
        return c->target;
}

const char *rpc_channel_name(const struct rpc_channel *c) {
        return c->name;
}

static void *channel_method(struct rpc_channel *c, const char *method) {
        void *h = NULL;
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < c->n_reg; i++)
                if (strcmp(c->reg[i].method, method) == 0) {
                        h = c->reg[i].handle;
                        break;
                }
        if (!h) {
                struct registered *n = realloc(c->reg, (c->n_reg + 1) * sizeof(*n));
                char *m = strdup(method);
                if (n && m) {
                        c->reg = n;
                        h = grpc_channel_register_call(c->ch, method, NULL, NULL);
                        c->reg[c->n_reg++] = (struct registered){m, h};
                } else {
                        if (n)
                                c->reg = n;
                        free(m);
                }
        }
        pthread_mutex_unlock(&c->mu);
        return h;
}

void rpc_result_clear(struct rpc_result *r) {
        if (r->reply)
                grpc_byte_buffer_destroy(r->reply);
        r->reply = NULL;
}

struct rpc_pending {
        struct rpc_batch *b;
        struct rpc_pending *next, *prev;
        struct rpc_channel *ch;
        char method[128];
        grpc_call *call;
        grpc_metadata_array init_md, trail_md;
        grpc_byte_buffer *req, *recv;
        grpc_status_code status;
        grpc_slice details;
        bool done;
        void *userdata;
        struct rpc_result res;
};

struct rpc_batch {
        grpc_completion_queue *cq;
        pthread_mutex_t mu;        /* the list and the count: a starter and a waiter may be two threads */
        struct rpc_pending *head;
        size_t running;
};

int rpc_batch_new(struct rpc_batch **ret) {
        rpc_global_init();
        struct rpc_batch *b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        b->cq = grpc_completion_queue_create_for_next(NULL);
        pthread_mutex_init(&b->mu, NULL);
        *ret = b;
        return 0;
}

static void pending_finish(struct rpc_pending *p) {
        struct rpc_result *r = &p->res;
        r->status = p->status;
        r->err = rpc_errno_from_status(p->status);
        if (r->err == 0) {
                r->reply = p->recv ? p->recv : grpc_raw_byte_buffer_create(NULL, 0);
                r->message[0] = 0;
        } else {
                if (p->recv)
                        grpc_byte_buffer_destroy(p->recv);
                const char *m = strrchr(p->method, '/');
                snprintf(r->message, sizeof(r->message), "%s (%s) %s: %s: %.*s", p->ch->name, p->ch->target,
                         m ? m + 1 : p->method, rpc_status_name(p->status), (int)GRPC_SLICE_LENGTH(p->details),
                         (const char *)GRPC_SLICE_START_PTR(p->details));
        }
        p->recv = NULL;
        grpc_slice_unref(p->details);
        grpc_metadata_array_destroy(&p->init_md);
        grpc_metadata_array_destroy(&p->trail_md);
        if (p->req)
                grpc_byte_buffer_destroy(p->req);
        p->req = NULL;
        grpc_call_unref(p->call);
        p->call = NULL;
        pthread_mutex_lock(&p->b->mu);
        p->done = true;
        p->b->running--;
        pthread_mutex_unlock(&p->b->mu);
}

static struct rpc_pending *batch_next_until(struct rpc_batch *b, gpr_timespec until) {
        grpc_event ev = grpc_completion_queue_next(b->cq, until, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT)
                return NULL;
        die_if(ev.type != GRPC_OP_COMPLETE, "rpc: client completion queue broke");
        struct rpc_pending *p = ev.tag;
        if (!ev.success)
                p->status = GRPC_STATUS_UNAVAILABLE;  /* the batch itself failed: treat as transport loss */
        pending_finish(p);
        return p;
}

static void batch_next(struct rpc_batch *b) {
        batch_next_until(b, gpr_inf_future(GPR_CLOCK_MONOTONIC));
}

struct rpc_pending *rpc_batch_next(struct rpc_batch *b, uint64_t timeout_ms) {
        return batch_next_until(b, rpc_deadline_in(timeout_ms));
}

size_t rpc_batch_running(struct rpc_batch *b) {
        pthread_mutex_lock(&b->mu);
        size_t n = b->running;
        pthread_mutex_unlock(&b->mu);
        return n;
}

void *rpc_pending_userdata(const struct rpc_pending *p) {
        return p->userdata;
}

int rpc_batch_start(struct rpc_batch *b, struct rpc_channel *ch, const char *method, grpc_byte_buffer *request,
                    uint64_t timeout_ms, bool wait_for_ready, struct rpc_pending **ret) {
        return rpc_batch_start_ud(b, ch, method, request, timeout_ms, wait_for_ready, NULL, ret);
}

int rpc_batch_start_ud(struct rpc_batch *b, struct rpc_channel *ch, const char *method, grpc_byte_buffer *request,
                       uint64_t timeout_ms, bool wait_for_ready, void *userdata, struct rpc_pending **ret) {
        struct rpc_pending *p = calloc(1, sizeof(*p));
        if (!p) {
                if (request)
                        grpc_byte_buffer_destroy(request);
                return -ENOMEM;
        }
        p->b = b;
        p->ch = ch;
        p->userdata = userdata;
        snprintf(p->method, sizeof(p->method), "%s", method);
        p->req = request ? request : grpc_raw_byte_buffer_create(NULL, 0);
        grpc_metadata_array_init(&p->init_md);
        grpc_metadata_array_init(&p->trail_md);
        p->details = grpc_empty_slice();
        void *h = channel_method(ch, method);
        if (!h) {
                grpc_byte_buffer_destroy(p->req);
                free(p);
                return -ENOMEM;
        }
        p->call = grpc_channel_create_registered_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, b->cq, h,
                                                      rpc_deadline_in(timeout_ms), NULL);
        grpc_op ops[6];
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[0].flags = wait_for_ready ? GRPC_INITIAL_METADATA_WAIT_FOR_READY : 0;
        ops[1].op = GRPC_OP_SEND_MESSAGE;
        ops[1].data.send_message.send_message = p->req;
        ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[3].data.recv_initial_metadata.recv_initial_metadata = &p->init_md;
        ops[4].op = GRPC_OP_RECV_MESSAGE;
        ops[4].data.recv_message.recv_message = &p->recv;
        ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[5].data.recv_status_on_client.trailing_metadata = &p->trail_md;
        ops[5].data.recv_status_on_client.status = &p->status;
        ops[5].data.recv_status_on_client.status_details = &p->details;
        /* in the list before the call starts: its completion may be taken at once by another thread */
        pthread_mutex_lock(&b->mu);
        b->running++;
        p->next = b->head;
        if (b->head)
                b->head->prev = p;
        b->head = p;
        pthread_mutex_unlock(&b->mu);
        *ret = p;
        grpc_call_error e = grpc_call_start_batch(p->call, ops, 6, p, NULL);
        if (e != GRPC_CALL_OK) {
                /* finish it as failed so the list stays consistent */
                p->status = GRPC_STATUS_INTERNAL;
                p->details = grpc_slice_from_copied_string("cannot start the call");
                pending_finish(p);
                return -EIO;
        }
        return 0;
}

struct rpc_result *rpc_batch_wait(struct rpc_batch *b, struct rpc_pending *p) {
        while (!p->done)
                batch_next(b);
        return &p->res;
}

int rpc_batch_wait_all(struct rpc_batch *b) {
        while (b->running > 0)
                batch_next(b);
        for (struct rpc_pending *p = b->head; p; p = p->next)
                if (p->res.err)
                        return p->res.err;
        return 0;
}

const struct rpc_result *rpc_batch_first_error(struct rpc_batch *b) {
        const struct rpc_result *first = NULL;
        for (struct rpc_pending *p = b->head; p; p = p->next)   /* newest first: keep the last seen */
                if (p->done && p->res.err)
                        first = &p->res;
        return first;
}

struct rpc_result *rpc_pending_result(struct rpc_pending *p) {
        return &p->res;
}

bool rpc_pending_done(const struct rpc_pending *p) {
        return p->done;
}

void rpc_batch_release(struct rpc_batch *b, struct rpc_pending *p) {
        die_if(!p->done, "rpc_batch_release: call still running");
        pthread_mutex_lock(&b->mu);
        if (p->prev)
                p->prev->next = p->next;
        else
                b->head = p->next;
        if (p->next)
                p->next->prev = p->prev;
        pthread_mutex_unlock(&b->mu);
        rpc_result_clear(&p->res);
        free(p);
}

struct rpc_batch *rpc_batch_free(struct rpc_batch *b) {
        if (!b)
                return NULL;
        for (struct rpc_pending *p = b->head; p; p = p->next)
                if (!p->done)
                        grpc_call_cancel(p->call, NULL);
        while (b->running > 0)
                batch_next(b);
        while (b->head)
                rpc_batch_release(b, b->head);
        rpc_cq_drain_destroy(b->cq);
        pthread_mutex_destroy(&b->mu);
        free(b);
        return NULL;
}

int rpc_call(struct rpc_channel *ch, const char *method, grpc_byte_buffer *request, uint64_t timeout_ms,
             bool wait_for_ready, struct rpc_result *r) {
        struct rpc_batch *b;
        struct rpc_pending *p;
        memset(r, 0, sizeof(*r));
        int e = rpc_batch_new(&b);
        if (e < 0) {
                if (request)
                        grpc_byte_buffer_destroy(request);
                r->err = e;
                return e;
        }
        e = rpc_batch_start(b, ch, method, request, timeout_ms, wait_for_ready, &p);
        if (e < 0) {
                r->err = e;
                snprintf(r->message, sizeof(r->message), "%s (%s) %s: cannot start call", ch->name, ch->target, method);
        } else {
                *r = *rpc_batch_wait(b, p);
                p->res.reply = NULL;   /* moved to r */
        }
        rpc_batch_free(b);
        return r->err;
}

int rpc_call_msg(struct rpc_channel *ch, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *reply_desc, uint64_t timeout_ms, bool wait_for_ready,
                 ProtobufCMessage **reply_ret, char *err, size_t errlen) {
        struct rpc_result r;
        int e = rpc_call(ch, method, wire_pack(req), timeout_ms, wait_for_ready, &r);
        if (e < 0) {
                if (err && errlen)
                        snprintf(err, errlen, "%s", r.message);
                rpc_result_clear(&r);
                return e;
        }
        e = wire_unpack(r.reply, reply_desc, reply_ret);
        rpc_result_clear(&r);
        if (e < 0 && err && errlen)
                snprintf(err, errlen, "%s (%s) %s: reply does not parse", ch->name, ch->target, method);
        return e;
}

/* ---------------- client streaming ---------------- */

struct rpc_stream {
        struct rpc_channel *ch;
        char method[128];
        grpc_completion_queue *cq;
        grpc_call *call;
        grpc_metadata_array init_md, trail_md;
        grpc_byte_buffer *req, *recv;
        grpc_status_code status;
        grpc_slice details;
        unsigned outstanding;     /* batches started whose completion was not yet taken */
        bool recv_pending, status_done, ended;
        char tag_start, tag_recv, tag_status;   /* their addresses tag the three kinds of batch */
        struct rpc_result res;
};

static void stream_end(struct rpc_stream *s) {
        struct rpc_result *r = &s->res;
        r->status = s->status;
        r->err = rpc_errno_from_status(s->status);
        if (r->err) {
                const char *m = strrchr(s->method, '/');
                snprintf(r->message, sizeof(r->message), "%s (%s) %s: %s: %.*s", s->ch->name, s->ch->target,
                         m ? m + 1 : s->method, rpc_status_name(s->status), (int)GRPC_SLICE_LENGTH(s->details),
                         (const char *)GRPC_SLICE_START_PTR(s->details));
        }
        s->ended = true;
}

/* Takes one completion (waiting until `until`); false on timeout. */
static bool stream_take(struct rpc_stream *s, gpr_timespec until, void **tag_ret, bool *ok_ret) {
        grpc_event ev = grpc_completion_queue_next(s->cq, until, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT)
                return false;
        die_if(ev.type != GRPC_OP_COMPLETE, "rpc: stream completion queue broke");
        s->outstanding--;
        if (ev.tag == &s->tag_status)
                s->status_done = true;
        else if (ev.tag == &s->tag_recv)
                s->recv_pending = false;
        *tag_ret = ev.tag;
        *ok_ret = ev.success;
        return true;
}

int rpc_stream_open(struct rpc_channel *ch, const char *method, grpc_byte_buffer *request, uint64_t timeout_ms,
                    struct rpc_stream **ret) {
        struct rpc_stream *s = calloc(1, sizeof(*s));
        void *h = channel_method(ch, method);
        if (!s || !h) {
                free(s);
                if (request)
                        grpc_byte_buffer_destroy(request);
                return -ENOMEM;
        }
        s->ch = ch;
        snprintf(s->method, sizeof(s->method), "%s", method);
        s->req = request ? request : grpc_raw_byte_buffer_create(NULL, 0);
        s->details = grpc_empty_slice();
        grpc_metadata_array_init(&s->init_md);
        grpc_metadata_array_init(&s->trail_md);
        s->cq = grpc_completion_queue_create_for_next(NULL);
        gpr_timespec deadline = timeout_ms ? rpc_deadline_in(timeout_ms) : gpr_inf_future(GPR_CLOCK_MONOTONIC);
        s->call = grpc_channel_create_registered_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, h, deadline, NULL);

        grpc_op ops[4];
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_SEND_MESSAGE;
        ops[1].data.send_message.send_message = s->req;
        ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
        grpc_call_error e1 = grpc_call_start_batch(s->call, ops, 4, &s->tag_start, NULL);
        if (e1 == GRPC_CALL_OK)
                s->outstanding++;
        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[0].data.recv_status_on_client.trailing_metadata = &s->trail_md;
        ops[0].data.recv_status_on_client.status = &s->status;
        ops[0].data.recv_status_on_client.status_details = &s->details;
        grpc_call_error e2 = grpc_call_start_batch(s->call, ops, 1, &s->tag_status, NULL);
        if (e2 == GRPC_CALL_OK) {
                s->outstanding++;
        } else {
                /* Cannot happen on a fresh call; fail the stream rather than wait for a status forever. */
                s->status_done = true;
                s->status = GRPC_STATUS_INTERNAL;
                grpc_call_cancel(s->call, NULL);
                stream_end(s);
        }
        *ret = s;
        return 0;
}

int rpc_stream_next(struct rpc_stream *s, uint64_t timeout_ms, grpc_byte_buffer **msg_ret) {
        if (s->ended)
                return s->res.err;
        if (!s->recv_pending) {
                grpc_op op;
                memset(&op, 0, sizeof(op));
                op.op = GRPC_OP_RECV_MESSAGE;
                op.data.recv_message.recv_message = &s->recv;
                s->recv = NULL;
                if (grpc_call_start_batch(s->call, &op, 1, &s->tag_recv, NULL) != GRPC_CALL_OK) {
                        grpc_call_cancel(s->call, NULL);
                } else {
                        s->recv_pending = true;
                        s->outstanding++;
                }
        }
        gpr_timespec until = rpc_deadline_in(timeout_ms);
        while (s->recv_pending) {
                void *tag;
                bool ok;
                if (!stream_take(s, until, &tag, &ok))
                        return -ETIMEDOUT;
                if (tag == &s->tag_recv && ok && s->recv) {
                        *msg_ret = s->recv;
                        s->recv = NULL;
                        return 1;
                }
        }
        /* No message: the stream is over (the server finished it, or the call failed). The status
         * follows promptly either way. */
        while (!s->status_done) {
                void *tag;
                bool ok;
                stream_take(s, gpr_inf_future(GPR_CLOCK_MONOTONIC), &tag, &ok);
        }
        stream_end(s);
        return s->res.err;
}

const struct rpc_result *rpc_stream_status(const struct rpc_stream *s) {
        return &s->res;
}

struct rpc_stream *rpc_stream_close(struct rpc_stream *s) {
        if (!s)
                return NULL;
        if (!s->status_done)
                grpc_call_cancel(s->call, NULL);
        while (s->outstanding > 0) {
                void *tag;
                bool ok;
                stream_take(s, gpr_inf_future(GPR_CLOCK_MONOTONIC), &tag, &ok);
        }
        if (s->recv)
                grpc_byte_buffer_destroy(s->recv);
        grpc_byte_buffer_destroy(s->req);
        grpc_metadata_array_destroy(&s->init_md);
        grpc_metadata_array_destroy(&s->trail_md);
        grpc_slice_unref(s->details);
        grpc_call_unref(s->call);
        rpc_cq_drain_destroy(s->cq);
        free(s);
        return NULL;
}

