/* The RPC layer: gRPC C core servers and clients, unary and server-streaming, with completion queues.
 *
 * Server: methods dispatched by a table; N threads serve one completion queue; a handler may answer
 * later than the call that started it, from any thread (sync training holds replies); unknown methods
 * are answered UNIMPLEMENTED at once; a port already in use is an error, never silently shared;
 * messages of any size; shutdown under load waits for every call in flight.
 *
 * Client: one channel per peer; per-call deadlines; several calls started on one batch and waited for
 * together (fan-out to many ps shards); gRPC status mapped to -errno, the server's message kept.
 *
 * Call rpc_global_init() once at start of main(), before any thread is created. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <grpc/grpc.h>
#include <grpc/byte_buffer.h>
#include <protobuf-c/protobuf-c.h>

/* grpc_init plus process-wide settings large messages need (malloc thresholds, so freeing a large
 * message does not hand its pages back to the kernel every time). Idempotent. */
void rpc_global_init(void);
void rpc_global_shutdown(void);
/* The largest message this process handles legally (requests and replies): once the process holds
 * more than its present size plus twice that (and 64 MiB), a watcher thread hands free memory back to
 * the system (a request refused for its size was read whole first). A daemon calls it once, before
 * serving; later calls do nothing. */
void rpc_memory_bound(size_t largest);

/* ---------------- transport security ----------------
 * Mutual TLS: a server requires a client certificate issued by the CA and verifies it; a client
 * verifies that the server's certificate is the task the channel is named for ("ps:0" must present
 * "ps-0.JOB.psfleet"). Who may call what is transport/authz's table, enforced by the server before a
 * handler runs. Without TLS every caller is PEER_INSECURE and may call anything. */
struct rpc_tls {
        char *ca_pem, *cert_pem, *key_pem;
        char *job;              /* peers' certificates must name a task of this job */
        char *task;             /* our own ("ps-0", "admin"), for messages */
};
/* Every server and channel made after this call uses these credentials (copied); NULL: plain TCP,
 * the default. Returns 0 or -ENOMEM. */
int rpc_secure(const struct rpc_tls *tls);
/* The process's credentials (NULL: plain TCP). */
const struct rpc_tls *rpc_security(void);
struct rpc_tls *rpc_tls_free(struct rpc_tls *t);
struct rpc_tls *rpc_tls_copy(const struct rpc_tls *t);     /* deep; NULL when out of memory */

/* errno <-> grpc_status_code, in one place. */
grpc_status_code rpc_status_from_errno(int err);
int rpc_errno_from_status(grpc_status_code code);
const char *rpc_status_name(grpc_status_code code);

/* ---------------- server ---------------- */

struct rpc_server;
struct rpc_call;

/* Runs on a server thread. It must end the call exactly once, now or later (from any thread), with
 * rpc_call_reply*() or rpc_call_fail*(); until then the call stays alive. */
typedef void (*rpc_handler)(struct rpc_call *call, void *userdata);

struct rpc_method {
        const char *path;       /* "/psfleet.v1.ParameterServer/Push" */
        rpc_handler handler;
        void *userdata;
};

/* Binds `addr` ("127.0.0.1:7001", "[::]:0"). The table is copied. threads >= 1.
 * Returns -EADDRINUSE, -EADDRNOTAVAIL (an address not of this host, or unresolved), -EACCES (a
 * privileged port): the bind's own errno, found before gRPC tries (which would only dump its error). */
int rpc_server_new(const char *addr, const struct rpc_method *methods, size_t n_methods, unsigned threads,
                   struct rpc_server **ret);
/* The same, with options. */
struct rpc_server_opts {
        size_t max_receive;             /* largest request accepted (RESOURCE_EXHAUSTED beyond); 0: no limit */
        size_t max_in_flight;           /* with max_receive: legal requests at once (default 2); gRPC's memory
                                         * for the server is bounded to one more than that, and 16 MiB, so a
                                         * larger request is reset as it arrives, not read whole */
        const struct rpc_tls *tls;      /* NULL: the process's (rpc_secure) */
};
int rpc_server_new_opts(const char *addr, const struct rpc_method *methods, size_t n_methods, unsigned threads,
                        const struct rpc_server_opts *opts, struct rpc_server **ret);
/* Binds addr ("host:port", "[v6]:port") as a server would, then lets it go. 0 if some address it
 * resolves to can be bound, else the first -errno (-EADDRINUSE: a program holds the port,
 * -EADDRNOTAVAIL: not an address of this host, or it does not resolve); 0 also for what gRPC alone
 * parses ("unix:...", a URI). */
int rpc_probe_bind(const char *addr);
int rpc_server_port(const struct rpc_server *s);     /* the bound port */
int rpc_server_start(struct rpc_server *s);
/* Stops accepting calls, gives those in flight 1 s (at most half of timeout_ms) to end, so replies
 * already given still reach their clients, cancels the rest, waits (within timeout_ms in all) for every
 * handler to have ended its call, and joins the threads. Returns -ETIMEDOUT if some call was never
 * ended. */
int rpc_server_shutdown(struct rpc_server *s, uint64_t timeout_ms);
struct rpc_server *rpc_server_free(struct rpc_server *s);   /* shuts down first if needed */
uint64_t rpc_server_in_flight(const struct rpc_server *s);

/* The request payload, owned by the call (NULL for an empty message). The handler may take it with
 * rpc_call_take_payload() and then owns it. */
grpc_byte_buffer *rpc_call_payload(struct rpc_call *c);
grpc_byte_buffer *rpc_call_take_payload(struct rpc_call *c);
const char *rpc_call_method(const struct rpc_call *c);
char *rpc_call_peer(const struct rpc_call *c);        /* malloc'd */
struct peer;
/* Who is calling: from its certificate (mTLS), or PEER_INSECURE. Valid while the call lives. */
const struct peer *rpc_call_identity(const struct rpc_call *c);
bool rpc_call_cancelled(const struct rpc_call *c);
uint64_t rpc_call_deadline_us(const struct rpc_call *c); /* wall clock µs; UINT64_MAX: none */

/* End the call with OK and this reply (taken; NULL sends an empty message). Returns -errno if the call
 * could not be answered (it is ended anyway). */
int rpc_call_reply(struct rpc_call *c, grpc_byte_buffer *reply);
int rpc_call_reply_msg(struct rpc_call *c, const ProtobufCMessage *m);
/* End the call PERMISSION_DENIED for a reason about who calls, logged with the peer's identity and
 * address (rate-limited, as the server's own refusals by the authorization table). */
int rpc_call_refuse(struct rpc_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* End the call with a status and message. */
int rpc_call_fail(struct rpc_call *c, grpc_status_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int rpc_call_fail_errno(struct rpc_call *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Server streaming: send one message of a stream now (taken), waiting until it is written or the call
 * is cancelled (-ECANCELED). Then end the stream with rpc_call_reply(c, NULL)-like rpc_call_finish. */
int rpc_call_send(struct rpc_call *c, grpc_byte_buffer *msg, uint64_t timeout_ms);
int rpc_call_finish(struct rpc_call *c, grpc_status_code code, const char *message);

/* ---------------- client ---------------- */

struct rpc_channel;

struct rpc_config;
/* The job's rpc.* keys (reconnect backoff) for every channel made after this call; a program that
 * never calls it gets the keys' defaults with their environment overrides (docs/configuration.md,
 * rpc_configure_env).
 * The daemons call it once the job is loaded (daemon.c). */
void rpc_configure(const struct rpc_config *rc);
/* For a program without a job (the CLI): the rpc.* keys' defaults with this node's environment
 * overrides (PSFLEET_RPC_*), for every channel made after. Returns 0, or -EINVAL with
 * "VARIABLE: \"value\" is not ..." in err (err may be NULL), nothing changed, and the caller exits
 * with CONFIG_EX_CONFIG; -ENOMEM. A channel made before any configure call runs this itself and fails
 * with its error. */
int rpc_configure_env(char *err, size_t errlen);

/* A channel to `target` ("host:port"). `name` ("ps:0") appears in error messages. */
int rpc_channel_new(const char *target, const char *name, struct rpc_channel **ret);
/* With these credentials (NULL: plain TCP) instead of the process's. Under TLS, `name` must name a
 * task ("ps:0", "chief", "worker:1"): it is the identity the server's certificate must carry
 * (-EINVAL otherwise). */
int rpc_channel_new_tls(const char *target, const char *name, const struct rpc_tls *tls, struct rpc_channel **ret);
struct rpc_channel *rpc_channel_free(struct rpc_channel *ch);
const char *rpc_channel_target(const struct rpc_channel *ch);
const char *rpc_channel_name(const struct rpc_channel *ch);

/* One call's outcome. */
struct rpc_result {
        int err;                  /* 0 or -errno mapped from the status */
        grpc_status_code status;
        char message[512];        /* "ps:0 (127.0.0.1:7001) Push: INVALID_ARGUMENT: ..." when err != 0 */
        grpc_byte_buffer *reply;  /* owned by the result: take it, or rpc_result_clear() destroys it */
};
void rpc_result_clear(struct rpc_result *r);

/* Blocking unary call. `request` is taken (may be NULL: empty message). wait_for_ready: wait for the
 * peer to come up instead of failing at once (up to the deadline). Returns r->err. */
int rpc_call(struct rpc_channel *ch, const char *method, grpc_byte_buffer *request, uint64_t timeout_ms,
             bool wait_for_ready, struct rpc_result *r);

/* Convenience: pack `req`, call, unpack the reply as `reply_desc` into *reply_ret. */
int rpc_call_msg(struct rpc_channel *ch, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *reply_desc, uint64_t timeout_ms, bool wait_for_ready,
                 ProtobufCMessage **reply_ret, char *err, size_t errlen);

/* Several calls in flight at once on one completion queue; wait for one or for all.
 * A batch is used by one thread at a time. */
struct rpc_batch;
struct rpc_pending;       /* one call of a batch; owned by the batch */

int rpc_batch_new(struct rpc_batch **ret);
struct rpc_batch *rpc_batch_free(struct rpc_batch *b);   /* cancels and waits for calls still running */
/* Starts a call; `request` is taken. The pending handle stays valid until rpc_batch_release(). */
int rpc_batch_start(struct rpc_batch *b, struct rpc_channel *ch, const char *method, grpc_byte_buffer *request,
                    uint64_t timeout_ms, bool wait_for_ready, struct rpc_pending **ret);
/* Same, with a pointer of the caller's kept with the call (rpc_pending_userdata). */
int rpc_batch_start_ud(struct rpc_batch *b, struct rpc_channel *ch, const char *method, grpc_byte_buffer *request,
                       uint64_t timeout_ms, bool wait_for_ready, void *userdata, struct rpc_pending **ret);
void *rpc_pending_userdata(const struct rpc_pending *p);
/* For a receiving thread: waits up to timeout_ms for any call of the batch to finish and returns it
 * (finished, not released), or NULL on timeout. Calls may be started meanwhile from another thread;
 * do not mix with rpc_batch_wait*() on the same batch. */
struct rpc_pending *rpc_batch_next(struct rpc_batch *b, uint64_t timeout_ms);
size_t rpc_batch_running(struct rpc_batch *b);
/* Waits until `p` has finished; returns its result (owned by the batch until released). */
struct rpc_result *rpc_batch_wait(struct rpc_batch *b, struct rpc_pending *p);
/* Waits for every call started; returns the first error (0 if none). */
int rpc_batch_wait_all(struct rpc_batch *b);
struct rpc_result *rpc_pending_result(struct rpc_pending *p);
/* The result of the earliest-started finished call that failed, or NULL. */
const struct rpc_result *rpc_batch_first_error(struct rpc_batch *b);
bool rpc_pending_done(const struct rpc_pending *p);
/* Frees a finished call's handle and its result. */
void rpc_batch_release(struct rpc_batch *b, struct rpc_pending *p);

/* Server streaming, client side: one call, its own completion queue, messages read one at a time.
 * A stream is used by one thread at a time.
 *
 * rpc_stream_open starts the call (`request` taken; NULL: empty message); timeout_ms bounds the whole
 * call (0: no deadline). It fails only for lack of memory: a peer that is down shows in the first
 * rpc_stream_next. */
struct rpc_stream;
int rpc_stream_open(struct rpc_channel *ch, const char *method, grpc_byte_buffer *request, uint64_t timeout_ms,
                    struct rpc_stream **ret);
/* Waits up to timeout_ms for the next message. Returns 1 with the message in *msg_ret (the caller
 * owns it); 0 when the stream ended with status OK; -ETIMEDOUT when nothing came in time (the stream
 * stays usable: call again); or the -errno of the call's status, the server's message in
 * rpc_stream_status(). After 0 or a failure, every later call returns the same. */
int rpc_stream_next(struct rpc_stream *s, uint64_t timeout_ms, grpc_byte_buffer **msg_ret);
/* The call's outcome once rpc_stream_next returned 0 or a failure (err, status, message); before
 * that, err is 0 and status OK. Owned by the stream. */
const struct rpc_result *rpc_stream_status(const struct rpc_stream *s);
/* Cancels the call if it is still running, waits for gRPC to be done with it, frees everything.
 * NULL-safe; returns NULL. */
struct rpc_stream *rpc_stream_close(struct rpc_stream *s);

/* grpc.health.v1.Health/Check: SERVING for "" and for every name in `services` (a NULL-terminated
 * array passed as userdata, may be NULL), NOT_FOUND for any other service. */
#define RPC_HEALTH_CHECK "/grpc.health.v1.Health/Check"
void rpc_health_handler(struct rpc_call *c, void *services);
