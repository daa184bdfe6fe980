/* The RPC layer against a real in-process server on loopback. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "rpc.h"
#include "wire.h"
#include <grpc/byte_buffer_reader.h>
#include "psfleet/v1/ps.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"

#define M_ECHO "/test.Echo/Echo"
#define M_DEFER "/test.Echo/Defer"
#define M_TENSOR "/test.Echo/Tensor"
#define M_BIG "/test.Echo/Big"

/* ---- handlers ---- */

/* Echo: reply with the request's bytes. */
static void h_echo(struct rpc_call *c, void *ud) {
        (void)ud;
        rpc_call_reply(c, rpc_call_take_payload(c));
}

/* Deferred: queue the call; a separate thread answers it later. */
struct deferred {
        pthread_mutex_t mu;
        pthread_cond_t cond;
        struct rpc_call *calls[256];
        size_t n;
        bool stop;
        unsigned delay_ms;
        pthread_t thread;
        atomic_size_t answered;
};

static void h_defer(struct rpc_call *c, void *ud) {
        struct deferred *d = ud;
        pthread_mutex_lock(&d->mu);
        assert_true(d->n < 256);
        d->calls[d->n++] = c;
        pthread_cond_broadcast(&d->cond);
        pthread_mutex_unlock(&d->mu);
}

static void *deferred_thread(void *arg) {
        struct deferred *d = arg;
        for (;;) {
                pthread_mutex_lock(&d->mu);
                while (d->n == 0 && !d->stop)
                        pthread_cond_wait(&d->cond, &d->mu);
                if (d->n == 0 && d->stop) {
                        pthread_mutex_unlock(&d->mu);
                        return NULL;
                }
                struct rpc_call *c = d->calls[--d->n];
                pthread_mutex_unlock(&d->mu);
                usleep(d->delay_ms * 1000);
                /* answered later than the handler that received it, from another thread */
                atomic_fetch_add(&d->answered, 1);   /* before the reply, which the client may see at once */
                rpc_call_reply(c, rpc_call_take_payload(c));
        }
}

/* Tensor: receive a push of tensors, check them, reply with a checksum; request carries PushHeader. */
static uint64_t fnv(const uint8_t *p, size_t n, uint64_t h) {
        for (size_t i = 0; i < n; i++)
                h = (h ^ p[i]) * 1099511628211ull;
        return h;
}

static void h_tensor(struct rpc_call *c, void *ud) {
        (void)ud;
        struct wire_in *in;
        char err[256];
        if (wire_in_parse(rpc_call_take_payload(c), &in, err, sizeof(err)) < 0) {
                rpc_call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
                return;
        }
        ProtobufCMessage *hm;
        assert_int_equal(wire_in_header(in, &psfleet__v1__push_header__descriptor, &hm), 0);
        Psfleet__V1__PushHeader *h = (Psfleet__V1__PushHeader *)hm;
        uint64_t sum = 1469598103934665603ull;
        for (size_t i = 0; i < in->n_tensors; i++) {
                uint8_t *dst = malloc(in->tensors[i].nbytes + 1);
                wire_tensor_copy(&in->tensors[i], dst);
                sum = fnv(dst, in->tensors[i].nbytes, sum);
                free(dst);
        }
        Psfleet__V1__PushReplyHeader rh = PSFLEET__V1__PUSH_REPLY_HEADER__INIT;
        rh.global_step = sum;
        rh.incarnation = h->local_step + in->n_tensors;
        struct wire_out *o;
        grpc_byte_buffer *bb;
        assert_int_equal(wire_out_new(&o), 0);
        wire_out_header(o, &rh.base);
        wire_out_finish(o, &bb);
        wire_out_free(o);
        protobuf_c_message_free_unpacked(hm, NULL);
        wire_in_free(in);
        rpc_call_reply(c, bb);
}

/* Big: reply with one tensor of the requested size (local_step bytes), lent without copying. */
static uint8_t *big_buf;
static size_t big_len;

static void h_big(struct rpc_call *c, void *ud) {
        (void)ud;
        struct wire_in *in;
        assert_int_equal(wire_in_parse(rpc_call_take_payload(c), &in, NULL, 0), 0);
        ProtobufCMessage *hm;
        assert_int_equal(wire_in_header(in, &psfleet__v1__push_header__descriptor, &hm), 0);
        size_t n = ((Psfleet__V1__PushHeader *)hm)->local_step;
        assert_true(n <= big_len);
        struct wire_out *o;
        grpc_byte_buffer *bb;
        wire_out_new(&o);
        uint64_t shape[1] = {n / 4};
        wire_out_tensor(o, "big", WIRE_DTYPE_FLOAT32, shape, 1, 0, big_buf, n, NULL, NULL);
        wire_out_finish(o, &bb);
        wire_out_free(o);
        protobuf_c_message_free_unpacked(hm, NULL);
        wire_in_free(in);
        rpc_call_reply(c, bb);
}

/* ---- fixture ---- */

struct fx {
        struct rpc_server *s;
        struct rpc_channel *ch;
        struct deferred d;
        char addr[64];
};

static int setup(void **state) {
        struct fx *f = calloc(1, sizeof(*f));
        pthread_mutex_init(&f->d.mu, NULL);
        pthread_cond_init(&f->d.cond, NULL);
        f->d.delay_ms = 20;
        static const char *const services[] = {"test.Echo", NULL};
        struct rpc_method m[] = {
                {M_ECHO, h_echo, NULL},
                {M_DEFER, h_defer, &f->d},
                {M_TENSOR, h_tensor, NULL},
                {M_BIG, h_big, NULL},
                {RPC_HEALTH_CHECK, rpc_health_handler, (void *)services},
        };
        assert_int_equal(rpc_server_new("127.0.0.1:0", m, 5, 4, &f->s), 0);
        assert_int_equal(rpc_server_start(f->s), 0);
        assert_int_equal(pthread_create(&f->d.thread, NULL, deferred_thread, &f->d), 0);
        snprintf(f->addr, sizeof(f->addr), "127.0.0.1:%d", rpc_server_port(f->s));
        assert_int_equal(rpc_channel_new(f->addr, "test:0", &f->ch), 0);
        *state = f;
        return 0;
}

static void deferred_stop(struct fx *f) {
        pthread_mutex_lock(&f->d.mu);
        f->d.stop = true;
        pthread_cond_broadcast(&f->d.cond);
        pthread_mutex_unlock(&f->d.mu);
        pthread_join(f->d.thread, NULL);
}

static int teardown(void **state) {
        struct fx *f = *state;
        rpc_channel_free(f->ch);
        if (f->s) {
                /* The deferring thread must keep answering while the server shuts down. */
                assert_int_equal(rpc_server_shutdown(f->s, 10000), 0);
                deferred_stop(f);
                rpc_server_free(f->s);
        } else {
                deferred_stop(f);
        }
        free(f);
        return 0;
}

static grpc_byte_buffer *bytes_bb(const void *p, size_t n) {
        grpc_slice s = grpc_slice_from_copied_buffer(p, n);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        return bb;
}

static size_t bb_read(grpc_byte_buffer *bb, char *out, size_t cap) {
        grpc_byte_buffer_reader r;
        grpc_byte_buffer_reader_init(&r, bb);
        grpc_slice all = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
        size_t n = GRPC_SLICE_LENGTH(all) < cap ? GRPC_SLICE_LENGTH(all) : cap;
        memcpy(out, GRPC_SLICE_START_PTR(all), n);
        grpc_slice_unref(all);
        return n;
}

/* ---- tests ---- */

static void test_unary_echo(void **state) {
        struct fx *f = *state;
        for (int i = 0; i < 100; i++) {
                char msg[32], back[32];
                int n = snprintf(msg, sizeof(msg), "hello %d", i);
                struct rpc_result r;
                assert_int_equal(rpc_call(f->ch, M_ECHO, bytes_bb(msg, (size_t)n), 2000, false, &r), 0);
                assert_int_equal(r.status, GRPC_STATUS_OK);
                assert_int_equal(bb_read(r.reply, back, sizeof(back)), n);
                assert_memory_equal(back, msg, n);
                rpc_result_clear(&r);
        }
}

static void test_empty_message(void **state) {
        struct fx *f = *state;
        struct rpc_result r;
        assert_int_equal(rpc_call(f->ch, M_ECHO, NULL, 2000, false, &r), 0);
        char b[4];
        assert_int_equal(bb_read(r.reply, b, sizeof(b)), 0);
        rpc_result_clear(&r);
}

static void test_unknown_method(void **state) {
        struct fx *f = *state;
        struct rpc_result r;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int e = rpc_call(f->ch, "/test.Echo/Nope", bytes_bb("x", 1), 10000, false, &r);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        assert_int_equal(e, -EOPNOTSUPP);
        assert_int_equal(r.status, GRPC_STATUS_UNIMPLEMENTED);
        assert_non_null(strstr(r.message, "unknown method /test.Echo/Nope"));
        assert_non_null(strstr(r.message, "test:0"));
        /* answered at once, not at the 10 s deadline */
        double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
        assert_true(s < 2.0);
        rpc_result_clear(&r);
}

static void test_deadline_exceeded(void **state) {
        struct fx *f = *state;
        f->d.delay_ms = 500;
        struct rpc_result r;
        assert_int_equal(rpc_call(f->ch, M_DEFER, bytes_bb("slow", 4), 100, false, &r), -ETIMEDOUT);
        assert_int_equal(r.status, GRPC_STATUS_DEADLINE_EXCEEDED);
        assert_non_null(strstr(r.message, "DEADLINE_EXCEEDED"));
        rpc_result_clear(&r);
        /* the late reply to a call the client gave up on must not break the server */
        usleep(700 * 1000);
        f->d.delay_ms = 20;
        assert_int_equal(rpc_call(f->ch, M_ECHO, bytes_bb("ok", 2), 2000, false, &r), 0);
        rpc_result_clear(&r);
}

static void test_deferred_reply(void **state) {
        struct fx *f = *state;
        f->d.delay_ms = 50;
        struct rpc_result r;
        assert_int_equal(rpc_call(f->ch, M_DEFER, bytes_bb("later", 5), 5000, false, &r), 0);
        char b[8];
        assert_int_equal(bb_read(r.reply, b, sizeof(b)), 5);
        assert_memory_equal(b, "later", 5);
        rpc_result_clear(&r);
        assert_true(atomic_load(&f->d.answered) >= 1);
}

static void test_concurrent_32(void **state) {
        struct fx *f = *state;
        f->d.delay_ms = 5;
        struct rpc_batch *b;
        struct rpc_pending *p[32];
        assert_int_equal(rpc_batch_new(&b), 0);
        for (int i = 0; i < 32; i++) {
                char msg[16];
                int n = snprintf(msg, sizeof(msg), "c%d", i);
                assert_int_equal(rpc_batch_start(b, f->ch, i % 2 ? M_DEFER : M_ECHO, bytes_bb(msg, (size_t)n), 10000,
                                                 false, &p[i]), 0);
        }
        assert_int_equal(rpc_batch_wait_all(b), 0);
        for (int i = 0; i < 32; i++) {
                char msg[16], back[16];
                int n = snprintf(msg, sizeof(msg), "c%d", i);
                struct rpc_result *r = rpc_pending_result(p[i]);
                assert_int_equal(r->err, 0);
                assert_int_equal(bb_read(r->reply, back, sizeof(back)), n);
                assert_memory_equal(back, msg, n);
        }
        rpc_batch_free(b);
}

static void test_fanout_two_servers(void **state) {
        struct fx *f = *state;
        struct rpc_method m[] = {{M_ECHO, h_echo, NULL}};
        struct rpc_server *s2;
        struct rpc_channel *c2;
        char addr[64];
        assert_int_equal(rpc_server_new("127.0.0.1:0", m, 1, 2, &s2), 0);
        assert_int_equal(rpc_server_start(s2), 0);
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", rpc_server_port(s2));
        assert_int_equal(rpc_channel_new(addr, "test:1", &c2), 0);
        struct rpc_batch *b;
        struct rpc_pending *p1, *p2;
        rpc_batch_new(&b);
        assert_int_equal(rpc_batch_start(b, f->ch, M_ECHO, bytes_bb("a", 1), 2000, false, &p1), 0);
        assert_int_equal(rpc_batch_start(b, c2, M_ECHO, bytes_bb("b", 1), 2000, false, &p2), 0);
        /* wait for the second first: the first's completion is processed on the way */
        assert_int_equal(rpc_batch_wait(b, p2)->err, 0);
        assert_int_equal(rpc_batch_wait(b, p1)->err, 0);
        rpc_batch_release(b, p1);
        rpc_batch_release(b, p2);
        rpc_batch_free(b);
        rpc_channel_free(c2);
        assert_int_equal(rpc_server_shutdown(s2, 5000), 0);
        rpc_server_free(s2);
}

static void test_tensor_push_64mib(void **state) {
        struct fx *f = *state;
        size_t n = 64u << 20;
        uint8_t *data = malloc(n);
        for (size_t i = 0; i < n; i++)
                data[i] = (uint8_t)(i * 2654435761u >> 13);
        uint8_t small[40];
        for (size_t i = 0; i < sizeof(small); i++)
                small[i] = (uint8_t)i;
        Psfleet__V1__PushHeader h = PSFLEET__V1__PUSH_HEADER__INIT;
        h.local_step = 7;
        struct wire_out *o;
        grpc_byte_buffer *bb;
        wire_out_new(&o);
        wire_out_header(o, &h.base);
        uint64_t shape[2] = {n / 4 / 1024, 1024};
        assert_int_equal(wire_out_tensor(o, "dense0/kernel", WIRE_DTYPE_FLOAT32, shape, 2, 0, data, n, NULL, NULL), 0);
        uint64_t s2[1] = {10};
        assert_int_equal(wire_out_tensor_copy(o, "dense0/bias", WIRE_DTYPE_FLOAT32, s2, 1, 0, small, 40), 0);
        wire_out_finish(o, &bb);
        wire_out_free(o);
        struct rpc_result r;
        assert_int_equal(rpc_call(f->ch, M_TENSOR, bb, 60000, false, &r), 0);
        struct wire_in *in;
        assert_int_equal(wire_in_parse(r.reply, &in, NULL, 0), 0);
        r.reply = NULL;
        ProtobufCMessage *hm;
        assert_int_equal(wire_in_header(in, &psfleet__v1__push_reply_header__descriptor, &hm), 0);
        uint64_t want = fnv(small, 40, fnv(data, n, 1469598103934665603ull));
        assert_true(((Psfleet__V1__PushReplyHeader *)hm)->global_step == want);
        assert_int_equal(((Psfleet__V1__PushReplyHeader *)hm)->incarnation, 9);
        protobuf_c_message_free_unpacked(hm, NULL);
        wire_in_free(in);
        free(data);
}

static void test_tensor_pull_64mib(void **state) {
        struct fx *f = *state;
        big_len = 64u << 20;
        big_buf = malloc(big_len);
        for (size_t i = 0; i < big_len; i++)
                big_buf[i] = (uint8_t)(i * 40503u >> 7);
        Psfleet__V1__PushHeader h = PSFLEET__V1__PUSH_HEADER__INIT;
        h.local_step = big_len;
        struct wire_out *o;
        grpc_byte_buffer *bb;
        wire_out_new(&o);
        wire_out_header(o, &h.base);
        wire_out_finish(o, &bb);
        wire_out_free(o);
        struct rpc_result r;
        assert_int_equal(rpc_call(f->ch, M_BIG, bb, 60000, false, &r), 0);
        struct wire_in *in;
        assert_int_equal(wire_in_parse(r.reply, &in, NULL, 0), 0);
        assert_int_equal(in->n_tensors, 1);
        assert_string_equal(in->tensors[0].name, "big");
        assert_int_equal(in->tensors[0].nbytes, big_len);
        uint8_t *dst = malloc(big_len);
        wire_tensor_copy(&in->tensors[0], dst);
        assert_memory_equal(dst, big_buf, big_len);
        free(dst);
        wire_in_free(in);
        free(big_buf);
        big_buf = NULL;
}

static void test_health(void **state) {
        struct fx *f = *state;
        Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        ProtobufCMessage *m;
        char err[256];
        assert_int_equal(rpc_call_msg(f->ch, RPC_HEALTH_CHECK, &q.base, &grpc__health__v1__health_check_response__descriptor,
                                      2000, false, &m, err, sizeof(err)), 0);
        assert_int_equal(((Grpc__Health__V1__HealthCheckResponse *)m)->status,
                         GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
        protobuf_c_message_free_unpacked(m, NULL);
        q.service = "nope.Service";
        assert_int_equal(rpc_call_msg(f->ch, RPC_HEALTH_CHECK, &q.base, &grpc__health__v1__health_check_response__descriptor,
                                      2000, false, &m, err, sizeof(err)), -ENOENT);
        assert_non_null(strstr(err, "NOT_FOUND: unknown service \"nope.Service\""));
}

static void test_bad_tensor_payload(void **state) {
        struct fx *f = *state;
        /* a Tensor whose data length disagrees with its shape: INVALID_ARGUMENT with the reason */
        struct wire_out *o;
        grpc_byte_buffer *bb;
        wire_out_new(&o);
        uint64_t shape[1] = {3};
        float v[2] = {1, 2};
        wire_out_tensor_copy(o, "w", WIRE_DTYPE_FLOAT32, shape, 1, 0, v, sizeof(v));
        wire_out_finish(o, &bb);
        wire_out_free(o);
        struct rpc_result r;
        assert_int_equal(rpc_call(f->ch, M_TENSOR, bb, 2000, false, &r), -EINVAL);
        assert_non_null(strstr(r.message, "INVALID_ARGUMENT: tensor 0: tensor \"w\": 8 data bytes do not match shape (3 elements of 4 bytes)"));
        /* garbage bytes */
        assert_int_equal(rpc_call(f->ch, M_TENSOR, bytes_bb("\x12\xff\xff\xff\x0f", 5), 2000, false, &r), -EINVAL);
        assert_non_null(strstr(r.message, "INVALID_ARGUMENT"));
}

static void test_port_in_use(void **state) {
        struct fx *f = *state;
        struct rpc_method m[] = {{M_ECHO, h_echo, NULL}};
        struct rpc_server *s2 = NULL;
        assert_int_equal(rpc_server_new(f->addr, m, 1, 1, &s2), -EADDRINUSE);
        assert_null(s2);
        /* an address not of this host (TEST-NET-1): the bind's own reason */
        assert_int_equal(rpc_server_new("192.0.2.1:0", m, 1, 1, &s2), -EADDRNOTAVAIL);
        assert_null(s2);
        /* the same question without a server (psfleet check): taken, not here, free */
        assert_int_equal(rpc_probe_bind(f->addr), -EADDRINUSE);
        assert_int_equal(rpc_probe_bind("192.0.2.1:7001"), -EADDRNOTAVAIL);
        assert_int_equal(rpc_probe_bind("no-such-host.invalid:7001"), -EADDRNOTAVAIL);
        assert_int_equal(rpc_probe_bind("127.0.0.1:0"), 0);
}

static void test_server_down(void **state) {
        (void)state;
        /* a peer that is not there: UNAVAILABLE without waiting for the deadline */
        struct rpc_channel *ch;
        struct rpc_method m[] = {{M_ECHO, h_echo, NULL}};
        struct rpc_server *s;
        assert_int_equal(rpc_server_new("127.0.0.1:0", m, 1, 1, &s), 0);
        char addr[64];
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", rpc_server_port(s));
        rpc_server_free(s);
        assert_int_equal(rpc_channel_new(addr, "ps:9", &ch), 0);
        struct rpc_result r;
        assert_int_equal(rpc_call(ch, M_ECHO, NULL, 5000, false, &r), -EAGAIN);
        assert_non_null(strstr(r.message, "ps:9"));
        assert_non_null(strstr(r.message, "UNAVAILABLE"));
        rpc_channel_free(ch);
}

static void *shutdown_thread(void *arg) {
        struct fx *f = arg;
        usleep(100 * 1000);
        assert_int_equal(rpc_server_shutdown(f->s, 10000), 0);
        return NULL;
}

static void test_shutdown_in_flight(void **state) {
        struct fx *f = *state;
        /* ~40 deferred calls answered one at a time: far longer than the shutdown's 1 s grace, so the
         * shutdown still has calls to cut off */
        f->d.delay_ms = 60;
        struct rpc_batch *b;
        struct rpc_pending *p[64];
        rpc_batch_new(&b);
        for (int i = 0; i < 64; i++) {
                static const uint8_t payload[256 * 1024];
                assert_int_equal(rpc_batch_start(b, f->ch, i % 3 == 0 ? M_ECHO : M_DEFER,
                                                 bytes_bb(payload, sizeof(payload)), 10000, false, &p[i]), 0);
        }
        pthread_t t;
        pthread_create(&t, NULL, shutdown_thread, f);
        rpc_batch_wait_all(b);
        pthread_join(t, NULL);
        int ok = 0, failed = 0;
        for (int i = 0; i < 64; i++) {
                int e = rpc_pending_result(p[i])->err;
                if (e == 0)
                        ok++;
                else
                        failed++;
        }
        assert_int_equal(ok + failed, 64);
        assert_true(failed > 0);   /* the shutdown cut some calls off */
        assert_int_equal(rpc_server_in_flight(f->s), 0);
        rpc_batch_free(b);
        deferred_stop(f);
        f->d.stop = false;
        pthread_create(&f->d.thread, NULL, deferred_thread, &f->d);
}

/* ---- server streaming, client side ---- */

#define M_STREAM "/test.Echo/Stream"

/* Stream: the request says what to send: "N" (N messages "msg-i", then OK), "N:fail" (N messages, then
 * NOT_FOUND), "slow" (a message every 300 ms until the client goes away). A thread per call sends. */
struct streamer {
        pthread_mutex_t mu;
        pthread_t threads[16];
        size_t n_threads;
        atomic_int cancel_seen;
};

struct stream_job {
        struct rpc_call *call;
        struct streamer *st;
        char what[32];
};

static void *stream_thread(void *arg) {
        struct stream_job *j = arg;
        if (strcmp(j->what, "slow") == 0) {
                for (int i = 0;; i++) {
                        char m[32];
                        int n = snprintf(m, sizeof(m), "slow-%d", i);
                        if (rpc_call_send(j->call, bytes_bb(m, (size_t)n), 2000) < 0 || rpc_call_cancelled(j->call)) {
                                atomic_fetch_add(&j->st->cancel_seen, 1);
                                rpc_call_finish(j->call, GRPC_STATUS_CANCELLED, "client went away");
                                break;
                        }
                        usleep(300 * 1000);
                }
        } else {
                int count = atoi(j->what);
                for (int i = 0; i < count; i++) {
                        char m[32];
                        int n = snprintf(m, sizeof(m), "msg-%d", i);
                        assert_int_equal(rpc_call_send(j->call, bytes_bb(m, (size_t)n), 2000), 0);
                }
                if (strstr(j->what, ":fail"))
                        rpc_call_finish(j->call, GRPC_STATUS_NOT_FOUND, "nothing more here");
                else
                        rpc_call_finish(j->call, GRPC_STATUS_OK, NULL);
        }
        free(j);
        return NULL;
}

static void h_stream(struct rpc_call *c, void *ud) {
        struct streamer *st = ud;
        struct stream_job *j = calloc(1, sizeof(*j));
        j->call = c;
        j->st = st;
        bb_read(rpc_call_payload(c), j->what, sizeof(j->what) - 1);
        pthread_mutex_lock(&st->mu);
        assert_true(st->n_threads < 16);
        assert_int_equal(pthread_create(&st->threads[st->n_threads++], NULL, stream_thread, j), 0);
        pthread_mutex_unlock(&st->mu);
}

struct sfx {
        struct rpc_server *s;
        struct rpc_channel *ch;
        struct streamer st;
};

static int stream_setup(void **state) {
        struct sfx *f = calloc(1, sizeof(*f));
        pthread_mutex_init(&f->st.mu, NULL);
        struct rpc_method m[] = {{M_STREAM, h_stream, &f->st}, {M_ECHO, h_echo, NULL}};
        assert_int_equal(rpc_server_new("127.0.0.1:0", m, 2, 2, &f->s), 0);
        assert_int_equal(rpc_server_start(f->s), 0);
        char addr[64];
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", rpc_server_port(f->s));
        assert_int_equal(rpc_channel_new(addr, "streamer:0", &f->ch), 0);
        *state = f;
        return 0;
}

static int stream_teardown(void **state) {
        struct sfx *f = *state;
        for (size_t i = 0; i < f->st.n_threads; i++)
                pthread_join(f->st.threads[i], NULL);
        rpc_channel_free(f->ch);
        assert_int_equal(rpc_server_shutdown(f->s, 10000), 0);
        rpc_server_free(f->s);
        pthread_mutex_destroy(&f->st.mu);
        free(f);
        return 0;
}

static void test_stream_messages(void **state) {
        struct sfx *f = *state;
        struct rpc_stream *s;
        assert_int_equal(rpc_stream_open(f->ch, M_STREAM, bytes_bb("5", 1), 10000, &s), 0);
        for (int i = 0; i < 5; i++) {
                grpc_byte_buffer *m = NULL;
                char got[32] = "", want[32];
                assert_int_equal(rpc_stream_next(s, 5000, &m), 1);
                bb_read(m, got, sizeof(got) - 1);
                grpc_byte_buffer_destroy(m);
                snprintf(want, sizeof(want), "msg-%d", i);
                assert_string_equal(got, want);
        }
        grpc_byte_buffer *m = NULL;
        assert_int_equal(rpc_stream_next(s, 5000, &m), 0);
        assert_null(m);
        assert_int_equal(rpc_stream_next(s, 5000, &m), 0);   /* stays ended */
        assert_int_equal(rpc_stream_status(s)->status, GRPC_STATUS_OK);
        assert_int_equal(rpc_stream_status(s)->err, 0);
        rpc_stream_close(s);
        assert_null(rpc_stream_close(NULL));
}

static void test_stream_failure(void **state) {
        struct sfx *f = *state;
        struct rpc_stream *s;
        assert_int_equal(rpc_stream_open(f->ch, M_STREAM, bytes_bb("2:fail", 6), 10000, &s), 0);
        grpc_byte_buffer *m = NULL;
        assert_int_equal(rpc_stream_next(s, 5000, &m), 1);
        grpc_byte_buffer_destroy(m);
        assert_int_equal(rpc_stream_next(s, 5000, &m), 1);
        grpc_byte_buffer_destroy(m);
        assert_int_equal(rpc_stream_next(s, 5000, &m), -ENOENT);
        const struct rpc_result *r = rpc_stream_status(s);
        assert_int_equal(r->status, GRPC_STATUS_NOT_FOUND);
        assert_non_null(strstr(r->message, "streamer:0"));
        assert_non_null(strstr(r->message, "Stream: NOT_FOUND: nothing more here"));
        rpc_stream_close(s);
}

static void test_stream_timeout_and_cancel(void **state) {
        struct sfx *f = *state;
        struct rpc_stream *s;
        assert_int_equal(rpc_stream_open(f->ch, M_STREAM, bytes_bb("slow", 4), 0, &s), 0);
        grpc_byte_buffer *m = NULL;
        assert_int_equal(rpc_stream_next(s, 5000, &m), 1);    /* slow-0 at once */
        grpc_byte_buffer_destroy(m);
        m = NULL;
        assert_int_equal(rpc_stream_next(s, 20, &m), -ETIMEDOUT);  /* the next is 300 ms away */
        assert_null(m);
        assert_int_equal(rpc_stream_next(s, 5000, &m), 1);    /* the same receive, still waiting */
        char got[32] = "";
        bb_read(m, got, sizeof(got) - 1);
        grpc_byte_buffer_destroy(m);
        assert_string_equal(got, "slow-1");
        rpc_stream_close(s);                                  /* cancels: the server notices */
        for (int i = 0; i < 300 && atomic_load(&f->st.cancel_seen) == 0; i++)
                usleep(10 * 1000);
        assert_int_equal(atomic_load(&f->st.cancel_seen), 1);
}

static void test_stream_deadline(void **state) {
        struct sfx *f = *state;
        struct rpc_stream *s;
        assert_int_equal(rpc_stream_open(f->ch, M_STREAM, bytes_bb("slow", 4), 500, &s), 0);
        grpc_byte_buffer *m = NULL;
        int r, n = 0;
        while ((r = rpc_stream_next(s, 5000, &m)) == 1) {
                grpc_byte_buffer_destroy(m);
                n++;
        }
        assert_int_equal(r, -ETIMEDOUT);       /* DEADLINE_EXCEEDED of the whole call */
        assert_int_equal(rpc_stream_status(s)->status, GRPC_STATUS_DEADLINE_EXCEEDED);
        assert_true(n >= 1 && n <= 3);
        rpc_stream_close(s);
}

static void test_stream_server_down(void **state) {
        (void)state;
        struct rpc_method m[] = {{M_ECHO, h_echo, NULL}};
        struct rpc_server *srv;
        assert_int_equal(rpc_server_new("127.0.0.1:0", m, 1, 1, &srv), 0);
        char addr[64];
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", rpc_server_port(srv));
        rpc_server_free(srv);
        struct rpc_channel *ch;
        assert_int_equal(rpc_channel_new(addr, "chief:0", &ch), 0);
        struct rpc_stream *s;
        assert_int_equal(rpc_stream_open(ch, M_STREAM, NULL, 5000, &s), 0);
        grpc_byte_buffer *msg = NULL;
        assert_int_equal(rpc_stream_next(s, 5000, &msg), -EAGAIN);
        assert_non_null(strstr(rpc_stream_status(s)->message, "UNAVAILABLE"));
        rpc_stream_close(s);
        rpc_channel_free(ch);
}

/* A Stop-like call: the handler answers (4 MiB, so the reply is still on its way) and at once asks for
 * the server to shut down. The reply must reach the client all the same. */
static atomic_bool stop_asked;

static void h_stop(struct rpc_call *c, void *ud) {
        (void)ud;
        size_t n = 4u << 20;
        grpc_slice sl = grpc_slice_malloc(n);
        memset(GRPC_SLICE_START_PTR(sl), 7, n);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
        rpc_call_reply(c, bb);
        atomic_store(&stop_asked, true);
}

struct stop_client {
        struct rpc_channel *ch;
        struct rpc_result r;
        int err;
};

static void *stop_client_thread(void *arg) {
        struct stop_client *sc = arg;
        sc->err = rpc_call(sc->ch, M_ECHO, NULL, 10000, false, &sc->r);
        return NULL;
}

static void test_reply_survives_shutdown(void **state) {
        (void)state;
        for (int round = 0; round < 20; round++) {
                struct rpc_method m[] = {{M_ECHO, h_stop, NULL}};
                struct rpc_server *srv;
                assert_int_equal(rpc_server_new("127.0.0.1:0", m, 1, 1, &srv), 0);
                assert_int_equal(rpc_server_start(srv), 0);
                char addr[64];
                snprintf(addr, sizeof(addr), "127.0.0.1:%d", rpc_server_port(srv));
                struct stop_client sc = {0};
                assert_int_equal(rpc_channel_new(addr, "chief:0", &sc.ch), 0);
                atomic_store(&stop_asked, false);
                pthread_t t;
                assert_int_equal(pthread_create(&t, NULL, stop_client_thread, &sc), 0);
                while (!atomic_load(&stop_asked))
                        usleep(100);
                assert_int_equal(rpc_server_shutdown(srv, 10000), 0);
                pthread_join(t, NULL);
                if (sc.err != 0)
                        fail_msg("round %d: %s", round, sc.r.message);
                grpc_byte_buffer_reader rd;
                grpc_byte_buffer_reader_init(&rd, sc.r.reply);
                grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
                grpc_byte_buffer_reader_destroy(&rd);
                assert_int_equal(GRPC_SLICE_LENGTH(all), 4u << 20);
                grpc_slice_unref(all);
                rpc_result_clear(&sc.r);
                rpc_channel_free(sc.ch);
                rpc_server_free(srv);
        }
}

/* A bad rpc.* override is an error naming the variable, at start-up (rpc_configure_env) and for a
 * channel of a program that configured nothing, never a silent default. Runs before any channel. */
static void test_env_refused(void **state) {
        struct rpc_channel *ch = NULL;
        char err[256] = "";

        setenv("PSFLEET_RPC_MAX_RECONNECT_BACKOFF_MS", "soon", 1);
        assert_int_equal(rpc_configure_env(err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "PSFLEET_RPC_MAX_RECONNECT_BACKOFF_MS: \"soon\" is not an integer"));
        assert_int_equal(rpc_channel_new("127.0.0.1:1", "ps:0", &ch), -EINVAL);
        assert_null(ch);
        unsetenv("PSFLEET_RPC_MAX_RECONNECT_BACKOFF_MS");
        assert_int_equal(rpc_configure_env(err, sizeof(err)), 0);
}

static void test_errno_mapping(void **state) {
        (void)state;
        int errs[] = {EINVAL, ETIMEDOUT, ENOENT, EEXIST, EACCES, ENOMEM, EPERM, ECONNABORTED, ERANGE,
                      EOPNOTSUPP, EAGAIN, EIO, ECANCELED};
        for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
                assert_int_equal(rpc_errno_from_status(rpc_status_from_errno(errs[i])), -errs[i]);
        assert_int_equal(rpc_status_from_errno(0), GRPC_STATUS_OK);
        assert_string_equal(rpc_status_name(GRPC_STATUS_UNAVAILABLE), "UNAVAILABLE");
}

int main(void) {
        rpc_global_init();
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_env_refused),
                cmocka_unit_test(test_errno_mapping),
                cmocka_unit_test_setup_teardown(test_unary_echo, setup, teardown),
                cmocka_unit_test_setup_teardown(test_empty_message, setup, teardown),
                cmocka_unit_test_setup_teardown(test_unknown_method, setup, teardown),
                cmocka_unit_test_setup_teardown(test_deadline_exceeded, setup, teardown),
                cmocka_unit_test_setup_teardown(test_deferred_reply, setup, teardown),
                cmocka_unit_test_setup_teardown(test_concurrent_32, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fanout_two_servers, setup, teardown),
                cmocka_unit_test_setup_teardown(test_tensor_push_64mib, setup, teardown),
                cmocka_unit_test_setup_teardown(test_tensor_pull_64mib, setup, teardown),
                cmocka_unit_test_setup_teardown(test_health, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_tensor_payload, setup, teardown),
                cmocka_unit_test_setup_teardown(test_port_in_use, setup, teardown),
                cmocka_unit_test(test_server_down),
                cmocka_unit_test_setup_teardown(test_shutdown_in_flight, setup, teardown),
                cmocka_unit_test_setup_teardown(test_stream_messages, stream_setup, stream_teardown),
                cmocka_unit_test_setup_teardown(test_stream_failure, stream_setup, stream_teardown),
                cmocka_unit_test_setup_teardown(test_stream_timeout_and_cancel, stream_setup, stream_teardown),
                cmocka_unit_test_setup_teardown(test_stream_deadline, stream_setup, stream_teardown),
                cmocka_unit_test(test_stream_server_down),
                cmocka_unit_test(test_reply_survives_shutdown),
        };
        int r = cmocka_run_group_tests(tests, NULL, NULL);
        rpc_global_shutdown();
        return r;
}
