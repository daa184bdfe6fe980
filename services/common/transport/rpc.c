/* The RPC layer over gRPC C core (see rpc.h): what its server (rpc_server.c) and client (rpc_client.c)
 * share — gRPC's global set-up, status codes and errno, the channels' options, deadlines — and the
 * standard health service every daemon answers. */
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
#include <unistd.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "config.h"
#include "log.h"
#include "util.h"
#include "wire.h"
#include "grpc/health/v1/health.pb-c.h"

static pthread_once_t global_once = PTHREAD_ONCE_INIT;

/* gRPC's own error lines (a failed TLS handshake: a port scan, a client without a certificate) go to
 * our log, at most GRPC_LOG_BURST per GRPC_LOG_WINDOW_US, the rest counted: a flood of hostile
 * connections cannot flood the journal. Lower severities are gRPC's debugging and are dropped. */
#define GRPC_LOG_BURST 10
#define GRPC_LOG_WINDOW_US 60000000ull

static void grpc_log_to_ours(gpr_log_func_args *a) {
        static struct log_ratelimit rl = LOG_RATELIMIT_INIT(GRPC_LOG_WINDOW_US, GRPC_LOG_BURST);
        if (a->severity == GPR_LOG_SEVERITY_ERROR && log_ratelimit_ok(&rl, "gRPC errors"))
                log_warning("grpc: %s", a->message);
}

static void global_init_once(void) {
        gpr_set_log_function(grpc_log_to_ours);
        /* Large messages: keep freed buffers in the heap instead of unmapping them, or every message
         * pays a page fault per 4 KiB (measured: 0.3 vs 2.7 GB/s for 4 MiB pulls). */
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
        /* One malloc arena, set before gRPC starts its threads: what they free could otherwise stay in
         * arenas of their own, out of malloc_trim's reach (measured: 30 MB left resident after a refused
         * 512 MiB request, against none with one arena; rpc_memory_bound). The hot paths allocate
         * little, so they do not contend for it. */
        mallopt(M_ARENA_MAX, 1);
        grpc_init();
}

void rpc_global_init(void) {
        pthread_once(&global_once, global_init_once);
}

/* gRPC (1.51) reads a request whole before it compares its size with the server's limit, so a refused
 * 512 MiB request has been resident once; glibc then keeps the freed memory in gRPC's threads' arenas.
 * A watcher hands it back when the process grows past its baseline plus twice the largest legal
 * message: nothing to do in normal operation, one malloc_trim after such a request. */
#define MEMORY_CHECK_MS 1000

static size_t resident_bytes(void) {
        unsigned long size, resident;
        FILE *f = fopen("/proc/self/statm", "re");
        if (!f)
                return 0;
        int n = fscanf(f, "%lu %lu", &size, &resident);
        fclose(f);
        return n == 2 ? (size_t)resident * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

static void *memory_watch(void *arg) {
        size_t bound = (size_t)(uintptr_t)arg;
        uint64_t next_try = 0;
        for (;;) {
                struct timespec ts = {MEMORY_CHECK_MS / 1000, (MEMORY_CHECK_MS % 1000) * 1000000L};
                nanosleep(&ts, NULL);
                size_t before = resident_bytes();
                if (before <= bound || mono_us() < next_try)
                        continue;
                malloc_trim(0);
                size_t after = resident_bytes();
                if (before < after + ((size_t)1 << 20)) {
                        next_try = mono_us() + 3000000u;   /* nothing to hand back: it is in use */
                        continue;
                }
                log_info("memory: %zu MiB resident, over %zu MiB (the baseline, twice the largest legal message "
                         "and 8 MiB): %zu MiB handed back", before >> 20, bound >> 20, (before - after) >> 20);
        }
        return NULL;
}

void rpc_memory_bound(size_t largest) {
        static atomic_bool started;
        if (atomic_exchange(&started, true))
                return;
        size_t bound = resident_bytes() + 2 * largest + ((size_t)8 << 20);
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &at, memory_watch, (void *)(uintptr_t)bound) != 0)
                log_warning("memory: cannot start the watcher; a refused oversized request may stay resident");
        pthread_attr_destroy(&at);
}

void rpc_global_shutdown(void) {
        grpc_shutdown_blocking();
}

/* ---------------- status codes ---------------- */

grpc_status_code rpc_status_from_errno(int err) {
        switch (err < 0 ? -err : err) {
        case 0: return GRPC_STATUS_OK;
        case ECANCELED: return GRPC_STATUS_CANCELLED;
        case EINVAL: case EBADMSG: case EDOM: return GRPC_STATUS_INVALID_ARGUMENT;
        case ETIMEDOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
        case ENOENT: return GRPC_STATUS_NOT_FOUND;
        case EEXIST: return GRPC_STATUS_ALREADY_EXISTS;
        case EACCES: return GRPC_STATUS_PERMISSION_DENIED;
        case ENOMEM: case ENOSPC: case EMSGSIZE: return GRPC_STATUS_RESOURCE_EXHAUSTED;
        case EPERM: case ESTALE: return GRPC_STATUS_FAILED_PRECONDITION;
        case ECONNABORTED: return GRPC_STATUS_ABORTED;
        case ERANGE: return GRPC_STATUS_OUT_OF_RANGE;
        case EOPNOTSUPP: return GRPC_STATUS_UNIMPLEMENTED;
        case EAGAIN: case ECONNREFUSED: case EHOSTUNREACH: case ENOTCONN: case ESHUTDOWN:
                return GRPC_STATUS_UNAVAILABLE;
        case EIO: case EPROTO: return GRPC_STATUS_INTERNAL;
        default: return GRPC_STATUS_UNKNOWN;
        }
}

int rpc_errno_from_status(grpc_status_code code) {
        switch (code) {
        case GRPC_STATUS_OK: return 0;
        case GRPC_STATUS_CANCELLED: return -ECANCELED;
        case GRPC_STATUS_INVALID_ARGUMENT: return -EINVAL;
        case GRPC_STATUS_DEADLINE_EXCEEDED: return -ETIMEDOUT;
        case GRPC_STATUS_NOT_FOUND: return -ENOENT;
        case GRPC_STATUS_ALREADY_EXISTS: return -EEXIST;
        case GRPC_STATUS_PERMISSION_DENIED: return -EACCES;
        case GRPC_STATUS_RESOURCE_EXHAUSTED: return -ENOMEM;
        case GRPC_STATUS_FAILED_PRECONDITION: return -EPERM;
        case GRPC_STATUS_ABORTED: return -ECONNABORTED;
        case GRPC_STATUS_OUT_OF_RANGE: return -ERANGE;
        case GRPC_STATUS_UNIMPLEMENTED: return -EOPNOTSUPP;
        case GRPC_STATUS_UNAVAILABLE: return -EAGAIN;
        case GRPC_STATUS_INTERNAL: case GRPC_STATUS_DATA_LOSS: return -EIO;
        case GRPC_STATUS_UNAUTHENTICATED: return -EACCES;
        default: return -EIO;
        }
}

const char *rpc_status_name(grpc_status_code code) {
        static const char *const names[] = {
                "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                "UNAUTHENTICATED",
        };
        if ((unsigned)code < sizeof(names) / sizeof(names[0]))
                return names[code];
        return "UNKNOWN";
}

/* The channels' reconnect backoff: the job's rpc.* keys (rpc_configure), or in a program without a
 * job (the CLI, tests) their defaults (rpc_configure_env), with the environment overrides either way
 * (config_apply_env). */
static struct {
        pthread_mutex_t mu;
        bool set;
        struct rpc_config rc;
} chan_opts = {.mu = PTHREAD_MUTEX_INITIALIZER};

void rpc_configure(const struct rpc_config *rc) {
        pthread_mutex_lock(&chan_opts.mu);
        chan_opts.rc = *rc;
        chan_opts.rc.runtime_dir = NULL;   /* not the channels' business, and not ours to keep */
        chan_opts.rc.compression = NULL;
        chan_opts.set = true;
        pthread_mutex_unlock(&chan_opts.mu);
}

int rpc_configure_env(char *err, size_t errlen) {
        struct job_config tmp = {0};
        int r = config_section_defaults(&tmp, "rpc");
        if (r < 0) {
                if (err && errlen)
                        snprintf(err, errlen, "out of memory");
        } else if ((r = config_apply_env(&tmp, "rpc", err, errlen)) >= 0)
                rpc_configure(&tmp.rpc);
        free(tmp.rpc.runtime_dir);
        free(tmp.rpc.compression);
        return r;
}

int rpc_channel_options(struct rpc_config *ret) {
        pthread_mutex_lock(&chan_opts.mu);
        bool set = chan_opts.set;
        pthread_mutex_unlock(&chan_opts.mu);
        /* a program that set nothing: its environment, checked here if it was not at start-up */
        int r = set ? 0 : rpc_configure_env(NULL, 0);
        if (r < 0)
                return r;
        pthread_mutex_lock(&chan_opts.mu);
        *ret = chan_opts.rc;
        pthread_mutex_unlock(&chan_opts.mu);
        return 0;
}

void rpc_cq_drain_destroy(grpc_completion_queue *cq) {
        grpc_completion_queue_shutdown(cq);
        while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN)
                ;
        grpc_completion_queue_destroy(cq);
}

gpr_timespec rpc_deadline_in(uint64_t ms) {
        return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis((int64_t)ms, GPR_TIMESPAN));
}

void rpc_health_handler(struct rpc_call *c, void *services) {
        ProtobufCMessage *m;
        if (wire_unpack(rpc_call_payload(c), &grpc__health__v1__health_check_request__descriptor, &m) < 0) {
                rpc_call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "HealthCheckRequest does not parse");
                return;
        }
        const char *svc = ((Grpc__Health__V1__HealthCheckRequest *)m)->service;
        bool known = !svc || !*svc;
        for (const char *const *s = services; s && *s && !known; s++)
                known = strcmp(*s, svc) == 0;
        if (!known) {
                rpc_call_fail(c, GRPC_STATUS_NOT_FOUND, "unknown service \"%s\"", svc);
        } else {
                Grpc__Health__V1__HealthCheckResponse rsp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
                rsp.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
                rpc_call_reply_msg(c, &rsp.base);
        }
        protobuf_c_message_free_unpacked(m, NULL);
}

/* ---------------- transport security ---------------- */

static struct {
        pthread_mutex_t mu;
        struct rpc_tls *tls;
} security = {.mu = PTHREAD_MUTEX_INITIALIZER};

struct rpc_tls *rpc_tls_free(struct rpc_tls *t) {
        if (!t)
                return NULL;
        if (t->key_pem)
                explicit_bzero(t->key_pem, strlen(t->key_pem));
        free(t->ca_pem);
        free(t->cert_pem);
        free(t->key_pem);
        free(t->job);
        free(t->task);
        free(t);
        return NULL;
}

struct rpc_tls *rpc_tls_copy(const struct rpc_tls *t) {
        struct rpc_tls *c = calloc(1, sizeof(*c));
        if (!c)
                return NULL;
        c->ca_pem = strdup(t->ca_pem ? t->ca_pem : "");
        c->cert_pem = strdup(t->cert_pem ? t->cert_pem : "");
        c->key_pem = strdup(t->key_pem ? t->key_pem : "");
        c->job = strdup(t->job ? t->job : "");
        c->task = strdup(t->task ? t->task : "");
        if (!c->ca_pem || !c->cert_pem || !c->key_pem || !c->job || !c->task)
                return rpc_tls_free(c);
        return c;
}

int rpc_secure(const struct rpc_tls *tls) {
        struct rpc_tls *c = NULL;
        if (tls && !(c = rpc_tls_copy(tls)))
                return -ENOMEM;
        pthread_mutex_lock(&security.mu);
        /* The old copy stays: servers and channels made with it may still point at it. Replacing the
         * credentials happens once per process, so this keeps one extra copy at most. */
        static struct rpc_tls *retired;
        rpc_tls_free(retired);
        retired = security.tls;
        security.tls = c;
        pthread_mutex_unlock(&security.mu);
        return 0;
}

const struct rpc_tls *rpc_security(void) {
        pthread_mutex_lock(&security.mu);
        const struct rpc_tls *t = security.tls;
        pthread_mutex_unlock(&security.mu);
        return t;
}
