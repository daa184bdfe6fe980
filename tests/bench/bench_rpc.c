/* RPC goodput and latency on loopback: push and pull of one tensor through our RPC layer against a plain
 * TCP transfer of the same bytes (request + 1-byte ack), measured side by side in one run.
 * Also through the same layer with mutual TLS (--tls, or by default unless --no-tls): certificates made
 * in a temporary directory with base/x509, the server as ps-0 and the client as worker-0 of a job.
 * Prints one JSON line per size, then one for small-call latency. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "authz.h"
#include "rpc.h"
#include "util.h"
#include "wire.h"
#include "x509.h"
#include "../lib/scratch.h"
#include "psfleet/v1/ps.pb-c.h"

/* psfleet's own method names, so that the same handlers can be served under mutual TLS (where every
 * method must be in the authorization table); the handlers are the bench's. */
#define M_PUSH "/psfleet.v1.ParameterServer/Push"
#define M_PULL "/psfleet.v1.ParameterServer/Pull"
#define M_PING "/psfleet.v1.ParameterServer/GetShardStatus"

static uint8_t *server_buf;   /* pull source */
static uint8_t *server_dst;   /* push destination */
static size_t max_size;
static bool with_tls = true;   /* --no-tls: skip the same calls under mutual TLS */
static bool no_copy;   /* --no-copy: leave received tensors in gRPC's slices, to show what the copy costs */

static grpc_byte_buffer *range_msg(uint64_t n, uint64_t off);

static double now_s(void) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static grpc_byte_buffer *empty_header_msg(uint64_t n) {
        return range_msg(n, 0);
}

static grpc_byte_buffer *range_msg(uint64_t n, uint64_t off) {
        Psfleet__V1__PushReplyHeader h = PSFLEET__V1__PUSH_REPLY_HEADER__INIT;
        h.global_step = n;
        h.incarnation = off;
        struct wire_out *o;
        grpc_byte_buffer *bb;
        wire_out_new(&o);
        wire_out_header(o, &h.base);
        wire_out_finish(o, &bb);
        wire_out_free(o);
        return bb;
}

static void h_push(struct rpc_call *c, void *ud) {
        (void)ud;
        struct wire_in *in;
        char err[256];
        if (wire_in_parse(rpc_call_take_payload(c), &in, err, sizeof(err)) < 0 || in->n_tensors != 1) {
                rpc_call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "bad push");
                return;
        }
        if (!no_copy)
                wire_tensor_copy(&in->tensors[0], server_dst + in->tensors[0].row_offset * 4);   /* straight into the destination */
        size_t n = in->tensors[0].nbytes;
        wire_in_free(in);
        rpc_call_reply(c, empty_header_msg(n));
}

static void h_pull(struct rpc_call *c, void *ud) {
        (void)ud;
        struct wire_in *in;
        if (wire_in_parse(rpc_call_take_payload(c), &in, NULL, 0) < 0) {
                rpc_call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "bad pull");
                return;
        }
        ProtobufCMessage *hm;
        wire_in_header(in, &psfleet__v1__push_reply_header__descriptor, &hm);
        size_t n = ((Psfleet__V1__PushReplyHeader *)hm)->global_step;
        size_t off = ((Psfleet__V1__PushReplyHeader *)hm)->incarnation;
        protobuf_c_message_free_unpacked(hm, NULL);
        wire_in_free(in);
        struct wire_out *o;
        grpc_byte_buffer *bb;
        wire_out_new(&o);
        uint64_t shape[1] = {n / 4};
        wire_out_tensor(o, "t", WIRE_DTYPE_FLOAT32, shape, 1, off / 4, server_buf + off, n, NULL, NULL);
        wire_out_finish(o, &bb);
        wire_out_free(o);
        rpc_call_reply(c, bb);
}

static void h_ping(struct rpc_call *c, void *ud) {
        (void)ud;
        rpc_call_reply(c, rpc_call_take_payload(c));
}

/* ---- TCP baseline ---- */

static int tcp_listen_fd;

static int read_full(int fd, void *p, size_t n) {
        uint8_t *b = p;
        while (n) {
                ssize_t k = read(fd, b, n);
                if (k <= 0)
                        return -1;
                b += k;
                n -= (size_t)k;
        }
        return 0;
}

static int write_full(int fd, const void *p, size_t n) {
        const uint8_t *b = p;
        while (n) {
                ssize_t k = write(fd, b, n);
                if (k <= 0)
                        return -1;
                b += k;
                n -= (size_t)k;
        }
        return 0;
}

static void *tcp_server(void *arg) {
        (void)arg;
        int fd = accept(tcp_listen_fd, NULL, NULL);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        for (;;) {
                uint64_t n;
                if (read_full(fd, &n, 8) < 0 || n == 0)
                        break;
                if (read_full(fd, server_dst, n) < 0)
                        break;
                uint8_t ack = 1;
                write_full(fd, &ack, 1);
        }
        close(fd);
        return NULL;
}

static double bench_tcp(int fd, const uint8_t *src, size_t n, double min_s, unsigned min_reps) {
        unsigned reps = 0;
        double t0 = now_s(), t;
        do {
                uint64_t len = n;
                uint8_t ack;
                write_full(fd, &len, 8);
                write_full(fd, src, n);
                read_full(fd, &ack, 1);
                reps++;
                t = now_s();
        } while (t - t0 < min_s || reps < min_reps);
        return (double)n * reps / (t - t0) / 1e9;
}

/* CPU of the whole process (client and server) per byte of the last bench_push, in ns */
static double push_cpu_ns_per_byte;

static double cpu_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double bench_push(struct rpc_channel *ch, const uint8_t *src, size_t n, double min_s, unsigned min_reps) {
        unsigned reps = 0;
        double t0 = now_s(), t, c0 = cpu_s();
        do {
                Psfleet__V1__PushHeader h = PSFLEET__V1__PUSH_HEADER__INIT;
                struct wire_out *o;
                grpc_byte_buffer *bb;
                wire_out_new(&o);
                wire_out_header(o, &h.base);
                uint64_t shape[1] = {n / 4};
                wire_out_tensor(o, "t", WIRE_DTYPE_FLOAT32, shape, 1, 0, src, n, NULL, NULL);
                wire_out_finish(o, &bb);
                wire_out_free(o);
                struct rpc_result r;
                if (rpc_call(ch, M_PUSH, bb, 60000, false, &r) < 0) {
                        fprintf(stderr, "push: %s\n", r.message);
                        exit(1);
                }
                rpc_result_clear(&r);
                reps++;
                t = now_s();
        } while (t - t0 < min_s || reps < min_reps);
        push_cpu_ns_per_byte = (cpu_s() - c0) * 1e9 / ((double)n * reps);
        return (double)n * reps / (t - t0) / 1e9;
}

static double bench_pull(struct rpc_channel *ch, uint8_t *dst, size_t n, double min_s, unsigned min_reps) {
        unsigned reps = 0;
        double t0 = now_s(), t;
        do {
                struct rpc_result r;
                if (rpc_call(ch, M_PULL, empty_header_msg(n), 60000, false, &r) < 0) {
                        fprintf(stderr, "pull: %s\n", r.message);
                        exit(1);
                }
                struct wire_in *in;
                if (wire_in_parse(r.reply, &in, NULL, 0) < 0 || in->n_tensors != 1 || in->tensors[0].nbytes != n) {
                        fprintf(stderr, "pull: bad reply\n");
                        exit(1);
                }
                if (!no_copy) wire_tensor_copy(&in->tensors[0], dst);    /* straight into the destination */
                wire_in_free(in);
                reps++;
                t = now_s();
        } while (t - t0 < min_s || reps < min_reps);
        return (double)n * reps / (t - t0) / 1e9;
}

/* A large tensor as psfleet moves it: row blocks of `block` bytes, all in flight at once, each copied
 * into its place on arrival while later blocks are still on the wire. */
static double bench_blocked(struct rpc_channel *ch, bool push, const uint8_t *src, uint8_t *dst, size_t n, size_t block,
                            double min_s, unsigned min_reps) {
        unsigned reps = 0;
        size_t nb = (n + block - 1) / block;
        struct rpc_pending **p = calloc(nb, sizeof(*p));
        double t0 = now_s(), t;
        do {
                struct rpc_batch *b;
                rpc_batch_new(&b);
                for (size_t k = 0; k < nb; k++) {
                        size_t off = k * block, len = n - off < block ? n - off : block;
                        grpc_byte_buffer *bb;
                        if (push) {
                                Psfleet__V1__PushHeader h = PSFLEET__V1__PUSH_HEADER__INIT;
                                struct wire_out *o;
                                wire_out_new(&o);
                                wire_out_header(o, &h.base);
                                uint64_t shape[1] = {len / 4};
                                wire_out_tensor(o, "t", WIRE_DTYPE_FLOAT32, shape, 1, off / 4, src + off, len, NULL, NULL);
                                wire_out_finish(o, &bb);
                                wire_out_free(o);
                        } else {
                                bb = range_msg(len, off);
                        }
                        rpc_batch_start(b, ch, push ? M_PUSH : M_PULL, bb, 60000, false, &p[k]);
                }
                for (size_t k = 0; k < nb; k++) {
                        struct rpc_result *r = rpc_batch_wait(b, p[k]);
                        if (r->err) {
                                fprintf(stderr, "blocked %s: %s\n", push ? "push" : "pull", r->message);
                                exit(1);
                        }
                        if (!push) {
                                struct wire_in *in;
                                if (wire_in_parse(r->reply, &in, NULL, 0) < 0 || in->n_tensors != 1) {
                                        fprintf(stderr, "pull: bad reply\n");
                                        exit(1);
                                }
                                r->reply = NULL;
                                if (!no_copy)
                                        wire_tensor_copy(&in->tensors[0], dst + in->tensors[0].row_offset * 4);
                                wire_in_free(in);
                        }
                        rpc_batch_release(b, p[k]);
                }
                rpc_batch_free(b);
                reps++;
                t = now_s();
        } while (t - t0 < min_s || reps < min_reps);
        free(p);
        return (double)n * reps / (t - t0) / 1e9;
}

static int cmp_d(const void *a, const void *b) {
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

/* Latency of 16-byte calls: prints p50 and p99 (keys prefixed with `prefix`). */
static int latency(struct rpc_channel *ch, const char *prefix) {
        enum { N = 3000 };
        static double lat[N];
        for (int i = 0; i < N; i++) {
                uint8_t p[16] = {0};
                grpc_slice sl16 = grpc_slice_from_copied_buffer((const char *)p, 16);
                grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl16, 1);
                grpc_slice_unref(sl16);
                struct rpc_result r;
                double t0 = now_s();
                if (rpc_call(ch, M_PING, bb, 5000, false, &r) < 0) {
                        fprintf(stderr, "ping: %s\n", r.message);
                        return -1;
                }
                lat[i] = (now_s() - t0) * 1e6;
                rpc_result_clear(&r);
        }
        qsort(lat, N, sizeof(lat[0]), cmp_d);
        printf("{\"%slatency_bytes\": 16, \"calls\": %d, \"p50_us\": %.1f, \"p99_us\": %.1f}\n", prefix, N, lat[N / 2],
               lat[N * 99 / 100]);
        return 0;
}

/* Credentials of task `task` of job "bench", from a CA made here: the PEM texts read back. */
static struct rpc_tls *bench_creds(const char *dir, const struct x509_cred *ca, const char *task) {
        char err[512], dns[128], *crt = strdup_printf("%s/%s.crt", dir, task), *key = strdup_printf("%s/%s.key", dir, task),
             *cap = strdup_printf("%s/ca.crt", dir);
        struct x509_subject sub = {.cn = task, .o = "psfleet", .ou = "bench"};
        struct x509_cred *leaf;
        struct rpc_tls *t = calloc(1, sizeof(*t));
        authz_dns_name("bench", task, dns, sizeof(dns));
        if (x509_issue(ca, &sub, dns, 1, &leaf, err, sizeof(err)) < 0 ||
            x509_cred_save(leaf, &(struct x509_file){crt, 0644, (gid_t)-1}, &(struct x509_file){key, 0600, (gid_t)-1},
                           err, sizeof(err)) < 0) {
                fprintf(stderr, "bench_rpc: certificates: %s\n", err);
                exit(1);
        }
        x509_cred_free(leaf);
        if (read_file(cap, 1 << 20, &t->ca_pem, NULL) < 0 || read_file(crt, 1 << 20, &t->cert_pem, NULL) < 0 ||
            read_file(key, 1 << 20, &t->key_pem, NULL) < 0)
                exit(1);
        t->job = strdup("bench");
        t->task = strdup(task);
        unlink(crt);
        unlink(key);
        free(crt);
        free(key);
        free(cap);
        return t;
}

/* A server as ps-0 and a channel to it as worker-0, under mutual TLS. */
static void tls_pair(const struct rpc_method *m, size_t n, struct rpc_server **srv, struct rpc_channel **ch) {
        char dir[64], err[512] = "", *cap, *cak;
        struct x509_cred *ca;
        struct x509_subject cs = {.cn = "psfleet CA bench", .o = "psfleet", .ou = "bench"};
        int r = scratch_make(dir, sizeof(dir), "bench-rpc");
        if (r < 0)
                snprintf(err, sizeof(err), "its directory: %s", strerror(-r));
        if (r < 0 || x509_ca_new(&cs, 1, &ca, err, sizeof(err)) < 0) {
                fprintf(stderr, "bench_rpc: a CA: %s\n", err);
                exit(1);
        }
        cap = strdup_printf("%s/ca.crt", dir);
        cak = strdup_printf("%s/ca.key", dir);
        if (x509_cred_save(ca, &(struct x509_file){cap, 0644, (gid_t)-1}, &(struct x509_file){cak, 0600, (gid_t)-1},
                           err, sizeof(err)) < 0) {
                fprintf(stderr, "bench_rpc: %s\n", err);
                exit(1);
        }
        struct rpc_tls *server = bench_creds(dir, ca, "ps-0"), *client = bench_creds(dir, ca, "worker-0");
        rm_tree(dir);   /* the credentials are in memory now */
        free(cap);
        free(cak);
        x509_cred_free(ca);
        struct rpc_server_opts o = {.tls = server};
        char addr[64];
        if (rpc_server_new_opts("127.0.0.1:0", m, n, 1, &o, srv) < 0 || rpc_server_start(*srv) < 0) {
                fprintf(stderr, "cannot start the TLS server\n");
                exit(1);
        }
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", rpc_server_port(*srv));
        if (rpc_channel_new_tls(addr, "ps:0", client, ch) < 0)
                exit(1);
        rpc_tls_free(server);
        rpc_tls_free(client);
}

int main(int argc, char **argv) {
        double min_s = 0.4;
        unsigned rounds = 3;
        size_t block = 4u << 20;     /* --block: a large tensor also moved as blocks this big, all in flight */
        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
                        min_s = strtod(argv[++i], NULL);
                else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
                        rounds = (unsigned)strtoul(argv[++i], NULL, 10);
                else if (strcmp(argv[i], "--block") == 0 && i + 1 < argc)
                        block = strtoul(argv[++i], NULL, 10);
                else if (strcmp(argv[i], "--no-tls") == 0)
                        with_tls = false;
                else if (strcmp(argv[i], "--no-copy") == 0)
                        no_copy = true;
                else {
                        fprintf(stderr, "usage: bench_rpc [--seconds S] [--rounds R] [--block BYTES] [--no-copy] [--no-tls]\n");
                        return 2;
                }
        }
        if (min_s <= 0 || rounds == 0 || block < 4096 || block % 4) {
                fprintf(stderr, "bench_rpc: --seconds and --rounds must be positive, --block a multiple of 4 >= 4096\n");
                return 2;
        }
        rpc_global_init();
        static const size_t sizes[] = {4u << 10, 64u << 10, 1u << 20, 16u << 20, 64u << 20};
        max_size = 64u << 20;
        server_buf = malloc(max_size);
        server_dst = malloc(max_size);
        uint8_t *src = malloc(max_size), *dst = malloc(max_size);
        for (size_t i = 0; i < max_size; i++)
                src[i] = server_buf[i] = (uint8_t)(i * 131u);
        memset(server_dst, 0, max_size);
        memset(dst, 0, max_size);

        struct rpc_method m[] = {{M_PUSH, h_push, NULL}, {M_PULL, h_pull, NULL}, {M_PING, h_ping, NULL}};
        struct rpc_server *s;
        if (rpc_server_new("127.0.0.1:0", m, 3, 1, &s) < 0 || rpc_server_start(s) < 0) {
                fprintf(stderr, "cannot start server\n");
                return 1;
        }
        char addr[64];
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", rpc_server_port(s));
        struct rpc_channel *ch, *tch = NULL;
        struct rpc_server *ts = NULL;
        rpc_channel_new(addr, "bench", &ch);
        if (with_tls)
                tls_pair(m, 3, &ts, &tch);

        tcp_listen_fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof(sa);
        bind(tcp_listen_fd, (struct sockaddr *)&sa, sizeof(sa));
        listen(tcp_listen_fd, 1);
        getsockname(tcp_listen_fd, (struct sockaddr *)&sa, &sl);
        pthread_t tt;
        pthread_create(&tt, NULL, tcp_server, NULL);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        connect(fd, (struct sockaddr *)&sa, sizeof(sa));
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

        /* warm up both paths */
        bench_push(ch, src, 1u << 20, 0.1, 3);
        bench_pull(ch, dst, 1u << 20, 0.1, 3);
        bench_tcp(fd, src, 1u << 20, 0.1, 3);

        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
                size_t n = sizes[i];
                double best_push = 0, best_pull = 0, best_tcp = 0, best_bpush = 0, best_bpull = 0, best_tpush = 0,
                       best_tpull = 0, best_tbpush = 0, best_tbpull = 0, cpu_push = 0, cpu_tpush = 0;
                /* interleaved rounds, best of each: the machine is shared and noisy */
                for (unsigned r = 0; r < rounds; r++) {
                        double t = bench_tcp(fd, src, n, min_s, 3);
                        double pu = bench_push(ch, src, n, min_s, 3);
                        if (pu > best_push) cpu_push = push_cpu_ns_per_byte;
                        double pl = bench_pull(ch, dst, n, min_s, 3);
                        if (t > best_tcp) best_tcp = t;
                        if (pu > best_push) best_push = pu;
                        if (pl > best_pull) best_pull = pl;
                        if (tch) {
                                double tpu = bench_push(tch, src, n, min_s, 3);
                                if (tpu > best_tpush) cpu_tpush = push_cpu_ns_per_byte;
                                double tpl = bench_pull(tch, dst, n, min_s, 3);
                                if (tpu > best_tpush) best_tpush = tpu;
                                if (tpl > best_tpull) best_tpull = tpl;
                        }
                        if (n > block) {
                                double bp = bench_blocked(ch, true, src, dst, n, block, min_s, 3);
                                double bl = bench_blocked(ch, false, src, dst, n, block, min_s, 3);
                                if (bp > best_bpush) best_bpush = bp;
                                if (bl > best_bpull) best_bpull = bl;
                        }
                        if (n > block && tch) {   /* and under TLS: one connection, the blocks' calls in flight */
                                double bp = bench_blocked(tch, true, src, dst, n, block, min_s, 3);
                                double bl = bench_blocked(tch, false, src, dst, n, block, min_s, 3);
                                if (bp > best_tbpush) best_tbpush = bp;
                                if (bl > best_tbpull) best_tbpull = bl;
                        }
                }
                if (!no_copy && (memcmp(dst, src, n) != 0 || memcmp(server_dst, src, n) != 0)) {
                        fprintf(stderr, "data mismatch at size %zu\n", n);
                        return 1;
                }
                double ours = best_push < best_pull ? best_push : best_pull;
                printf("{\"size\": %zu, \"push_gbps\": %.3f, \"pull_gbps\": %.3f, \"tcp_gbps\": %.3f, \"ratio\": %.2f",
                       n, best_push, best_pull, best_tcp, ours / best_tcp);
                if (tch) {
                        double to = best_tpush < best_tpull ? best_tpush : best_tpull;
                        printf(", \"tls_push_gbps\": %.3f, \"tls_pull_gbps\": %.3f, \"tls_ratio\": %.2f", best_tpush,
                               best_tpull, to / ours);
                        /* the process's CPU (client and server) per byte pushed, the best rounds' */
                        printf(", \"push_cpu_ns_per_byte\": %.3f, \"tls_push_cpu_ns_per_byte\": %.3f", cpu_push, cpu_tpush);
                }
                if (n > block) {
                        double bo = best_bpush < best_bpull ? best_bpush : best_bpull;
                        printf(", \"block\": %zu, \"push_blocked_gbps\": %.3f, \"pull_blocked_gbps\": %.3f, \"ratio_blocked\": %.2f",
                               block, best_bpush, best_bpull, bo / best_tcp);
                        if (tch) {
                                double tbo = best_tbpush < best_tbpull ? best_tbpush : best_tbpull;
                                printf(", \"tls_push_blocked_gbps\": %.3f, \"tls_pull_blocked_gbps\": %.3f, "
                                       "\"tls_ratio_blocked\": %.2f", best_tbpush, best_tbpull, tbo / bo);
                        }
                }
                printf("}\n");
                fflush(stdout);
        }

        /* small-call latency */
        if (latency(ch, "") < 0 || (tch && latency(tch, "tls_") < 0))
                return 1;

        uint64_t zero = 0;
        write_full(fd, &zero, 8);
        close(fd);
        pthread_join(tt, NULL);
        close(tcp_listen_fd);
        rpc_channel_free(ch);
        rpc_server_free(s);
        rpc_channel_free(tch);
        rpc_server_free(ts);
        free(server_buf);
        free(server_dst);
        free(src);
        free(dst);
        return 0;
}
