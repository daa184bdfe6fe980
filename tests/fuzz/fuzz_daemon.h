/* A daemon of psfleet inside a harness: its own main (built into the harness with main renamed) on a
 * thread, listening on a free loopback port (--listen) while the job file keeps fixed addresses, so
 * the job's fingerprint, which the seeds carry, is the same in every run. Inputs reach it as gRPC
 * calls on loopback, through the same server code as any client's. */
#pragma once
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/socket.h>

#include <grpc/byte_buffer_reader.h>

#include "../lib/daemons.h"
#include "../lib/scratch.h"
#include "fuzz_util.h"
#include "rpc.h"
#include "wire.h"

struct fuzz_daemon {
        int (*main)(int argc, char **argv);
        const char *name;         /* "ps:0" */
        const char *stop;         /* its Stop method: the daemon is stopped so at exit */
        char *argv[16];
        int argc;
        char addr[32];            /* where it listens */
        int port;
        char last_msg[512];       /* the last call's status message ("" when it succeeded), for a check's report */
        char dir[64];             /* its state directory, the job file's too */
        char job_path[128];
        pthread_t thread;
        struct rpc_channel *ch;
};

static void *fuzz_daemon_thread(void *arg) {
        struct fuzz_daemon *d = arg;
        int r = d->main(d->argc, d->argv);
        if (r != 0) {
                fprintf(stderr, "fuzz: %s exited %d\n", d->name, r);
                abort();
        }
        return NULL;
}

static struct fuzz_daemon *fuzz_daemon_running;

static int fuzz_daemon_call(struct fuzz_daemon *d, const char *method, const uint8_t *data, size_t size,
                            grpc_byte_buffer **reply);

/* At exit (libFuzzer's, after its runs): the daemon stopped and its main returned, so that what it
 * holds is freed before LeakSanitizer looks (registered after LeakSanitizer's own check, it runs
 * first); then its state directory removed, whether or not the daemon still answered. */
static void fuzz_daemon_exit(void) {
        struct fuzz_daemon *d = fuzz_daemon_running;
        if (!d || !d->ch)
                return;
        if (fuzz_daemon_call(d, d->stop, NULL, 0, NULL) == 0)
                pthread_join(d->thread, NULL);
        rm_tree(d->dir);
        d->ch = rpc_channel_free(d->ch);
}

/* A state directory with the job file (json) in it, and the command line: --job, --state-dir,
 * --listen, then extra (NULL-terminated). Logs quiet unless PSFLEET_LOG_LEVEL says otherwise. */
static inline void fuzz_daemon_init(struct fuzz_daemon *d, const char *json, const char *const *extra) {
        if (scratch_make(d->dir, sizeof(d->dir), "fuzz-daemon") < 0)
                abort();
        snprintf(d->job_path, sizeof(d->job_path), "%s/fuzz.json", d->dir);
        FILE *f = fopen(d->job_path, "w");
        if (!f || fputs(json, f) < 0 || fclose(f) != 0)
                abort();
        if ((d->port = daemons_free_port()) < 0)
                abort();
        snprintf(d->addr, sizeof(d->addr), "127.0.0.1:%d", d->port);
        const char *a[] = {d->name, "--job", d->job_path, "--state-dir", d->dir, "--listen", d->addr};
        d->argc = 0;
        for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
                d->argv[d->argc++] = strdup(a[i]);
        for (size_t i = 0; extra && extra[i] && d->argc < 15; i++)
                d->argv[d->argc++] = strdup(extra[i]);
        d->argv[d->argc] = NULL;
        setenv("PSFLEET_RUNTIME_DIR", d->dir, 1);
        if (!getenv("PSFLEET_LOG_LEVEL"))
                setenv("PSFLEET_LOG_LEVEL", "crit", 1);
        rpc_global_init();
        fuzz_daemon_running = d;
        atexit(fuzz_daemon_exit);
}

/* daemons_wait_healthy's question: whether something listens on d's port. */
static inline int fuzz_daemon_listens(void *arg, char *why, size_t len) {
        const struct fuzz_daemon *d = arg;
        if (daemons_listens(d->port))
                return 0;
        snprintf(why, len, "nothing listens on %s", d->addr);
        return -ECONNREFUSED;
}

/* Starts the daemon, waits (30 s at most) until it listens, and makes a fresh channel to it: gRPC
 * would otherwise meet a port that refuses and wait out its reconnect backoff, longer than a call's
 * deadline after a few restarts. */
static inline void fuzz_daemon_start(struct fuzz_daemon *d) {
        /* chiefd's main ends with rpc_global_shutdown(), while its rpc_global_init() initializes once
         * per process: a reference for each run, so gRPC is never torn down under the harness */
        grpc_init();
        if (pthread_create(&d->thread, NULL, fuzz_daemon_thread, d) != 0)
                abort();
        char why[300];
        if (daemons_wait_healthy(0, fuzz_daemon_listens, d, 30000, 5, why, sizeof(why)) < 0) {
                fprintf(stderr, "fuzz: %s %s\n", d->name, why);
                abort();
        }
        rpc_channel_free(d->ch);
        if (rpc_channel_new(d->addr, d->name, &d->ch) < 0)
                abort();
}

/* After a Stop: waits for its main to return, and starts it again. */
static inline void fuzz_daemon_restart(struct fuzz_daemon *d) {
        pthread_join(d->thread, NULL);
        fuzz_daemon_start(d);
}

/* One unary call of data; its reply (when OK) in *reply (taken; reply may be NULL). Waits for the
 * daemon to listen. Returns the call's -errno; a daemon that does not answer in 10 s aborts. */
static int fuzz_daemon_call(struct fuzz_daemon *d, const char *method, const uint8_t *data, size_t size,
                            grpc_byte_buffer **reply) {
        grpc_slice sl = grpc_slice_from_copied_buffer((const char *)data, size);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
        struct rpc_result res;
        int r = rpc_call(d->ch, method, bb, 10000, true, &res);
        if (r == -ETIMEDOUT) {
                fprintf(stderr, "fuzz: %s %s: no answer: %s\n", d->name, method, res.message);
                abort();
        }
        if (reply) {
                *reply = res.reply;
                res.reply = NULL;
        }
        snprintf(d->last_msg, sizeof(d->last_msg), "%s", r < 0 ? res.message : "");
        rpc_result_clear(&res);
        return r;
}

/* A byte buffer's bytes (malloc'd); the buffer is destroyed. */
static inline void fuzz_bytes_of(grpc_byte_buffer *bb, uint8_t **p, size_t *n) {
        grpc_byte_buffer_reader rd;
        grpc_byte_buffer_reader_init(&rd, bb);
        grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
        *n = GRPC_SLICE_LENGTH(s);
        *p = malloc(*n ? *n : 1);
        memcpy(*p, GRPC_SLICE_START_PTR(s), *n);
        grpc_slice_unref(s);
        grpc_byte_buffer_destroy(bb);
}

/* The harness's own call of method with request q, which must succeed: its reply parsed, with its
 * header (of desc) unpacked into *hm. */
static inline struct wire_in *fuzz_daemon_request(struct fuzz_daemon *d, const char *method, const ProtobufCMessage *q,
                                                  const ProtobufCMessageDescriptor *desc, ProtobufCMessage **hm) {
        uint8_t *p;
        size_t n;
        fuzz_bytes_of(wire_pack(q), &p, &n);
        grpc_byte_buffer *reply = NULL;
        int r = fuzz_daemon_call(d, method, p, n, &reply);
        free(p);
        FUZZ_CHECK(r == 0, "the harness's %s failed (%d)", method, r);
        struct wire_in *in;
        char err[256];
        FUZZ_CHECK(wire_in_parse(reply, &in, err, sizeof(err)) == 0, "a %s reply does not parse: %s", method, err);
        FUZZ_CHECK(wire_in_header(in, desc, hm) == 0, "a %s reply's header", method);
        return in;
}

/* A seed: the method's selector byte, then the request. */
static inline void fuzz_write_seed(const char *dir, const char *name, uint8_t sel, const uint8_t *p, size_t n) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        FILE *f = fopen(path, "w");
        if (!f || fwrite(&sel, 1, 1, f) != 1 || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0)
                abort();
}

/* At the harness's first input: setup() (which starts the daemon), then, when the environment
 * variable seed_env names a directory, the seed corpus written there by seeds() and the process ended. */
static inline void fuzz_daemon_first(const struct fuzz_daemon *d, void (*setup)(void), const char *seed_env,
                                     void (*seeds)(const char *dir)) {
        if (d->ch)
                return;
        setup();
        const char *dir = getenv(seed_env);
        if (dir) {
                seeds(dir);
                exit(0);
        }
}

/* The method an input picks with its first byte (taken off data): 0xff is stop, else one of the
 * first choices. -1 for an empty input. */
static inline int fuzz_daemon_method(const uint8_t **data, size_t *size, int choices, int stop) {
        if (*size < 1)
                return -1;
        int m = **data == 0xff ? stop : **data % choices;
        (*data)++, (*size)--;
        return m;
}

/* After a call of method m (r: its outcome): an accepted Stop ended the daemon's main; start it
 * again. Returns whether it did. */
static inline bool fuzz_daemon_after(struct fuzz_daemon *d, int m, int stop, int r) {
        if (m != stop || r != 0)   /* a Stop that does not parse is refused */
                return false;
        fuzz_daemon_restart(d);
        return true;
}

/* The daemon's liveness: its status method (an empty request) must answer with a message of desc
 * that parses; returned (free with protobuf_c_message_free_unpacked). */
static inline ProtobufCMessage *fuzz_daemon_status(struct fuzz_daemon *d, const char *method,
                                                   const ProtobufCMessageDescriptor *desc, const char *after) {
        grpc_byte_buffer *reply = NULL;
        int r = fuzz_daemon_call(d, method, NULL, 0, &reply);
        FUZZ_CHECK(r == 0, "%s: %s failed after a %s (%d)", d->name, method, after, r);
        ProtobufCMessage *st = NULL;
        FUZZ_CHECK(wire_unpack(reply, desc, &st) == 0, "%s: a %s that does not parse", d->name, desc->short_name);
        grpc_byte_buffer_destroy(reply);
        return st;
}
