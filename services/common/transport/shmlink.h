/* The shared-memory link between a workerd and the psd shards on its host: tensors move through
 * memory both processes map, instead of through loopback gRPC.
 *
 * The worker owns one segment (a sealed memfd): its model's parameter block and gradient block, and a
 * control area. A psd on the same host maps it when the worker attaches, and from then on serves that
 * worker's pushes straight out of it: it reads the gradients where backward wrote them and writes the
 * fresh values where forward reads them. A push is then a sequence number in memory and, only when
 * the other side sleeps, one futex wake-up. The segment has no name in any file system: it goes with
 * the last process that maps it, however that process ends.
 *
 * Attaching takes two steps, and both must agree:
 *   1. the worker connects to psd's unix socket RUNTIME_DIR/JOB-ps-N.sock (shmlink_socket_path; the
 *      directory 0750, the socket 0660, both of the psfleet user) and sends the segment's descriptor
 *      (SCM_RIGHTS) with the segment's nonce (shmlink_send). psd's listener (shmlink_server) reads the
 *      peer's credentials (SO_PEERCRED): a uid other than psd's own or root is refused. It keeps the
 *      descriptor with the peer's pid, pending, for SHMLINK_PENDING_MS (at most SHMLINK_PENDING_MAX,
 *      one per process), and acknowledges.
 *   2. the worker calls ParameterServer/AttachSharedMemory over gRPC with the nonce, its pid, its
 *      worker index and the push groups; with mTLS that call is authenticated as worker/N. psd takes
 *      the pending descriptor with that nonce (shmlink_server_take), checks that the socket's pid is
 *      the pid the call claims and the worker index the caller's identity, and maps the segment
 *      (shmlink_open), which must name the same worker and pid.
 * So the socket proves the worker runs on psd's host as psd's user, and the gRPC call ties that
 * process to an authenticated worker identity. psd never opens another process's files, so it needs no
 * ptrace-like access to the worker. Every wait on either side has a deadline. A psd that cannot make
 * its socket offers no shared memory; a worker that finds no socket, or is refused, pushes through gRPC.
 *
 * A push group is a fixed set of parts of one shard (agreed when attaching). Per group:
 *   worker  shmlink_push():  the group's gradients are final in the block; push_seq = seq
 *   psd     shmlink_next():  sees the new seq; copies the gradients out, checks them, applies them,
 *                            writes the values into the parameter block
 *           shmlink_reply(): status, global_step and message; done_seq = seq
 *   worker  shmlink_wait():  before reading the group's values again.
 * Between push and the end of wait the worker neither writes the group's gradients nor reads its
 * values; psd touches a group's ranges only while serving its push.
 *
 * Trust: psd treats everything in the segment as untrusted input. It maps only a psfleet memfd whose
 * size is sealed (so it can never fault on a segment cut short), checks the layout once, never reads
 * an offset from the segment afterwards (the groups come from the attach call), and copies gradients
 * out before it checks them.
 *
 * Each side's functions are for one thread at a time per group (worker) or per shard (psd); the two
 * sides run concurrently. Errors are -errno; functions with (err, errlen) also say why there. */
#pragma once
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SHMLINK_NONCE 16
#define SHMLINK_MSG 384          /* bytes of a reply's message, NUL included */
#define SHMLINK_MAX_SHARDS 1024
#define SHMLINK_MAX_GROUPS 65536
#define SHMLINK_PENDING_MS 5000  /* how long psd keeps a descriptor for its AttachSharedMemory call */
#define SHMLINK_PENDING_MAX 64   /* descriptors psd keeps pending at most */

struct shmlink;

/* ---- the worker's side ---- */

/* Creates and maps a new segment for worker `worker` of `job` with n_params floats in each block,
 * n_shards shards and n_groups push groups; the blocks start zeroed, page-aligned, and all the memory
 * is reserved at once. Returns -errno (e.g. -ENOMEM, -ENOSPC) with the reason in err. */
int shmlink_create(const char *job, uint32_t worker, uint64_t fingerprint, size_t n_params, uint32_t n_shards,
                   uint32_t n_groups, struct shmlink **ret, char *err, size_t errlen);

/* The segment's descriptor (owned by the link), for shmlink_send, and the nonce psd must find in it. */
int shmlink_fd(const struct shmlink *l);
const uint8_t *shmlink_nonce(const struct shmlink *l);

/* Starts a new generation of the link to `shard` and returns it: a psd still serving an older
 * generation stops. The worker sends the new generation when it attaches. */
uint32_t shmlink_shard_open(struct shmlink *l, uint32_t shard);
/* Ends the link to `shard` (the psd serving it stops at its next look). */
void shmlink_shard_close(struct shmlink *l, uint32_t shard);

/* Group g's gradients (of `shard`) are in the gradient block: hands them to psd. Returns the push's
 * sequence number, to wait for. */
uint32_t shmlink_push(struct shmlink *l, uint32_t g, uint32_t shard, uint64_t local_step, bool count_step);
/* True when push `seq` of group g has been answered. */
bool shmlink_answered(const struct shmlink *l, uint32_t g, uint32_t seq);
/* Waits until push `seq` of group g is answered: returns 0 (*global_step_ret: shard 0's after the
 * push, else 0), or psd's refusal (-EINVAL, -EAGAIN, ...) with psd's message. Spins up to spin_us,
 * then sleeps. While waiting, checks every 20 ms that process psd_pid still exists: -ECONNRESET when it
 * does not; -ETIMEDOUT after timeout_us. */
int shmlink_wait(struct shmlink *l, uint32_t g, uint32_t seq, pid_t psd_pid, uint64_t spin_us, uint64_t timeout_us,
                 uint64_t *global_step_ret, char *err, size_t errlen);

/* ---- psd's side ---- */

/* Maps the segment of descriptor fd (lent: the caller closes it), received from process pid, for
 * serving `shard` at generation gen, after checking it: a psfleet memfd with its size sealed, created
 * by process pid, with this nonce, fingerprint and block size; the shard and generation must exist,
 * the layout must fit. Records this process as the shard's server. -EPROTO for a segment that does not
 * match, -ESTALE for a replaced generation, -EBADF for no descriptor, with the reason in err. */
int shmlink_open(int fd, pid_t pid, const uint8_t nonce[SHMLINK_NONCE], uint64_t fingerprint, size_t n_params,
                 uint32_t shard, uint32_t gen, struct shmlink **ret, char *err, size_t errlen);
uint32_t shmlink_n_groups(const struct shmlink *l);
pid_t shmlink_worker_pid(const struct shmlink *l);
uint32_t shmlink_worker(const struct shmlink *l);
/* False once the worker's process no longer exists (it died without closing the segment). */
bool shmlink_worker_alive(const struct shmlink *l);

/* One push to serve. */
struct shmlink_push {
        uint32_t index;          /* into the groups[] passed to shmlink_next */
        uint32_t seq;
        uint64_t local_step;
        bool count_step;
};

/* Records in last[] (n entries) the pushes of groups[0..n) (group indices of the segment, <
 * shmlink_n_groups) made so far: they belong to an earlier link and are never served. Call it before
 * the attach is acknowledged, then pass last[] to every shmlink_next. */
void shmlink_mark(struct shmlink *l, const uint32_t *groups, uint32_t n, uint32_t *last);
/* Waits for the next push to the shard this link was opened for, among groups[0..n); last[] keeps
 * which push of each was served. Spins up to spin_us, then sleeps up to timeout_ms. Returns 1 with
 * *ret, 0 on timeout, -ESHUTDOWN when the worker ended this generation or closed the segment, or
 * when *stop is set (see shmlink_kick). */
int shmlink_next(struct shmlink *l, const uint32_t *groups, uint32_t n, uint32_t *last, uint64_t spin_us,
                 uint64_t timeout_ms, const atomic_bool *stop, struct shmlink_push *ret);
/* Answers push `seq` of group g: status 0 or -errno, the message (NULL: none), global_step. */
void shmlink_reply(struct shmlink *l, uint32_t g, uint32_t seq, int status, uint64_t global_step, const char *msg);
/* Wakes a thread sleeping in shmlink_next on this link, so it sees its stop flag. */
void shmlink_kick(struct shmlink *l);

/* ---- both ---- */

/* The parameter and gradient blocks, (n_params) floats each, page-aligned. */
float *shmlink_params(struct shmlink *l);
float *shmlink_grads(struct shmlink *l);

/* Unmaps. The worker's side also marks the segment closed (every psd serving it stops) and closes its
 * descriptor. NULL-safe; returns NULL. */
struct shmlink *shmlink_free(struct shmlink *l);

/* ---- the attach socket (shmlink_sock.c) ---- */

/* psd shard `shard` of `job`'s socket: "RUNTIME_DIR/JOB-ps-N.sock" into buf. -ENAMETOOLONG when it does
 * not fit a unix socket's address (107 bytes), with the reason in err. */
int shmlink_socket_path(const char *runtime_dir, const char *job, uint32_t shard, char *buf, size_t len, char *err,
                        size_t errlen);

/* The worker's step 1: connects to the psd listening at path, sends descriptor fd (-1: none, for tests)
 * and the nonce, and waits for psd's answer, all within timeout_ms. Returns 0 once psd holds them;
 * -ENOENT or -ECONNREFUSED when nobody listens there (psd on another host, or without shared memory);
 * psd's refusal (-EACCES: another user; -EPROTO: a bad message; -EBUSY: too many pending) or
 * -ETIMEDOUT; the reason in err. */
int shmlink_send(const char *path, int fd, const uint8_t nonce[SHMLINK_NONCE], uint64_t timeout_ms, char *err,
                 size_t errlen);

/* psd's listener. */
struct shmlink_server;
/* Called on the listener's thread for each attempt refused on the socket (another uid, no descriptor,
 * a bad message, too many pending, no message in time), with why: psd counts and logs it. */
typedef void (*shmlink_refused_fn)(void *ud, const char *why);

/* Listens at path: creates its directory (0750) when missing, replaces a stale socket (nobody accepts
 * on it), makes the socket 0660, and serves it on a thread of its own. -EADDRINUSE when a listener is
 * alive there; other -errno (the directory cannot be made or written, a file that is not a socket is
 * in the way) with the reason in err. */
int shmlink_server_new(const char *path, shmlink_refused_fn refused, void *ud, struct shmlink_server **ret, char *err,
                       size_t errlen);
/* Takes the pending descriptor sent with this nonce: *fd_ret (the caller's to close) and the sender's
 * pid and uid (SO_PEERCRED). -ENOENT (with why in err) when none was sent, or it expired. Thread-safe. */
int shmlink_server_take(struct shmlink_server *s, const uint8_t nonce[SHMLINK_NONCE], int *fd_ret, pid_t *pid_ret,
                        uid_t *uid_ret, char *err, size_t errlen);
/* Stops the thread, closes the pending descriptors, removes the socket (if it is still ours).
 * NULL-safe; returns NULL. */
struct shmlink_server *shmlink_server_free(struct shmlink_server *s);
