/* The shared-memory link between a workerd and the psd shards on its host: see shmlink.h.
 *
 * Segment layout (offsets page-aligned where blocks start):
 *   header (one page) | shard control (n_shards x 128 B) | group control (n_groups x 512 B) |
 *   parameter block | gradient block
 * Each control record keeps what the worker writes and what psd writes on separate cache lines.
 *
 * Sleeping and waking: a side that has nothing to do spins briefly, then raises its "sleeping" flag
 * and futex-waits on the word the other side changes; the other side changes the word, then wakes
 * only if the flag is up. Both steps are sequentially consistent, so either the waker sees the flag
 * or the sleeper sees the new word (and futex_wait itself refuses to sleep on a changed word). */
#include "shmlink.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#define MAGIC "PSFLSHM1"
#define VERSION 1
#define LINE 64
#define PAGE 4096

struct shm_header {
        char magic[8];
        uint32_t version;
        uint32_t n_shards, n_groups;
        uint32_t worker;
        int32_t worker_pid;
        uint8_t nonce[SHMLINK_NONCE];
        uint64_t fingerprint, n_params;
        uint64_t shards_off, groups_off, params_off, grads_off, size;
        _Atomic uint32_t closed;  /* worker: the segment is going away */
};

struct shm_shard {
        /* the worker's line */
        _Atomic uint32_t bell;     /* +1 per push to this shard */
        _Atomic uint32_t gen;      /* the link's generation; a change ends psd's serving */
        char pad0[LINE - 8];
        /* psd's line */
        _Atomic uint32_t sleeping; /* psd waits on bell */
        _Atomic int32_t psd_pid;
        char pad1[LINE - 8];
};

struct shm_group {
        /* the worker's line */
        _Atomic uint32_t push_seq;
        _Atomic uint32_t waiting;  /* the worker waits on done_seq */
        uint32_t count_step, shard;
        uint64_t local_step;
        char pad0[LINE - 24];
        /* psd's line, then its message */
        _Atomic uint32_t done_seq;
        int32_t status;            /* 0 or -errno */
        uint64_t global_step;
        char pad1[LINE - 16];
        char msg[SHMLINK_MSG];
};

_Static_assert(sizeof(struct shm_header) <= PAGE, "header fits its page");
_Static_assert(sizeof(struct shm_shard) == 2 * LINE, "shard record: two lines");
_Static_assert(sizeof(struct shm_group) == 2 * LINE + SHMLINK_MSG, "group record: two lines and a message");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "atomics shared between processes must be lock-free");

struct shmlink {
        bool owner;                /* the worker's side */
        int fd;                    /* the worker's: the memfd, or -1 */
        void *base;
        size_t size;
        struct shm_header *h;
        struct shm_shard *shards;
        struct shm_group *groups;
        uint32_t n_shards, n_groups; /* as checked at open: never re-read from the segment */
        float *params, *grads;
        uint32_t shard, gen;       /* psd's side: what it serves */
        uint8_t nonce[SHMLINK_NONCE];
        uint32_t *seq;             /* worker: (n_groups) last seq pushed */
};

static size_t round_page(size_t n) {
        return (n + PAGE - 1) / PAGE * PAGE;
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
        /* shared (not FUTEX_PRIVATE): the word lives in memory two processes map */
        return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
        futex(addr, FUTEX_WAKE, INT32_MAX, NULL);
}

/* Sleeps while *addr == val, at most ms. */
static void futex_wait_ms(_Atomic uint32_t *addr, uint32_t val, uint64_t ms) {
        struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
        futex(addr, FUTEX_WAIT, val, &ts);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
}

/* Changes the shard's bell and wakes its server: one sleeping on the old value, or about to, looks
 * again (at its stop flag, the generation, the closed mark). */
static void ring(struct shm_shard *s) {
        atomic_fetch_add(&s->bell, 1);
        futex_wake_all(&s->bell);
}

/* A process that no longer exists. EPERM means it exists as another user. */
static bool process_gone(pid_t pid) {
        return pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH);
}

static void layout(uint32_t n_shards, uint32_t n_groups, size_t n_params, uint64_t *shards_off, uint64_t *groups_off,
                   uint64_t *params_off, uint64_t *grads_off, uint64_t *size) {
        *shards_off = PAGE;
        *groups_off = *shards_off + (uint64_t)n_shards * sizeof(struct shm_shard);
        *params_off = round_page(*groups_off + (uint64_t)n_groups * sizeof(struct shm_group));
        *grads_off = *params_off + round_page(n_params * sizeof(float));
        *size = *grads_off + round_page(n_params * sizeof(float));
}

static void point(struct shmlink *l, const struct shm_header *h) {
        char *b = l->base;
        l->h = l->base;
        l->shards = (struct shm_shard *)(b + h->shards_off);
        l->groups = (struct shm_group *)(b + h->groups_off);
        l->params = (float *)(b + h->params_off);
        l->grads = (float *)(b + h->grads_off);
}

int shmlink_create(const char *job, uint32_t worker, uint64_t fingerprint, size_t n_params, uint32_t n_shards,
                   uint32_t n_groups, struct shmlink **ret, char *err, size_t errlen) {
        if (!job || n_shards == 0 || n_shards > SHMLINK_MAX_SHARDS || n_groups > SHMLINK_MAX_GROUPS ||
            n_params > (SIZE_MAX / 8) / sizeof(float))
                return errf(err, errlen, -EINVAL, "shared memory: bad sizes (%u shards, %u groups)", n_shards, n_groups);
        struct shmlink *l = calloc(1, sizeof(*l));
        if (!l)
                return errf(err, errlen, -ENOMEM, "out of memory");
        l->owner = true;
        l->fd = -1;
        l->seq = calloc(n_groups ? n_groups : 1, sizeof(uint32_t));
        int r;
        if (!l->seq) {
                r = errf(err, errlen, -ENOMEM, "out of memory");
                goto fail;
        }
        char label[128];
        snprintf(label, sizeof(label), "psfleet-%s-worker%u", job, worker);
        uint64_t so, go, po, gro, size;
        layout(n_shards, n_groups, n_params, &so, &go, &po, &gro, &size);
        /* A memfd: it has no name anyone could leave behind, it goes with the last process that maps it
         * however that process ends, and its size is sealed, so a psd mapping it can never fault on a
         * segment cut short under it. */
        l->fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (l->fd < 0) {
                r = errf(err, errlen, -errno, "cannot create shared memory: memfd_create: %s", strerror(errno));
                goto fail;
        }
        /* posix_fallocate, not ftruncate alone: no memory for it is an error now, not a SIGBUS later */
        int fr = ftruncate(l->fd, (off_t)size) < 0 ? errno : posix_fallocate(l->fd, 0, (off_t)size);
        if (fr == 0 && fcntl(l->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                fr = errno;
        if (fr != 0) {
                r = errf(err, errlen, -fr, "cannot make %llu bytes of shared memory: %s", (unsigned long long)size,
                         strerror(fr));
                goto fail;
        }
        l->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, l->fd, 0);
        if (l->base == MAP_FAILED) {
                int me = errno;
                l->base = NULL;
                r = errf(err, errlen, -me, "cannot map shared memory: %s", strerror(me));
                goto fail;
        }
        l->size = size;
        struct shm_header *h = l->base;
        memcpy(h->magic, MAGIC, sizeof(h->magic));
        h->version = VERSION;
        h->n_shards = n_shards;
        h->n_groups = n_groups;
        h->worker = worker;
        h->worker_pid = (int32_t)getpid();
        h->fingerprint = fingerprint;
        h->n_params = n_params;
        h->shards_off = so, h->groups_off = go, h->params_off = po, h->grads_off = gro, h->size = size;
        if (getrandom(h->nonce, sizeof(h->nonce), 0) != (ssize_t)sizeof(h->nonce)) {
                r = errf(err, errlen, -EIO, "cannot draw a nonce for shared memory");
                goto fail;
        }
        memcpy(l->nonce, h->nonce, sizeof(l->nonce));
        point(l, h);
        l->n_shards = n_shards;
        l->n_groups = n_groups;
        *ret = l;
        return 0;
fail:
        if (l->base)
                munmap(l->base, l->size);
        if (l->fd >= 0)
                close(l->fd);
        free(l->seq);
        free(l);
        return r;
}

int shmlink_fd(const struct shmlink *l) {
        return l->fd;
}

const uint8_t *shmlink_nonce(const struct shmlink *l) {
        return l->nonce;
}

uint32_t shmlink_shard_open(struct shmlink *l, uint32_t shard) {
        if (shard >= l->n_shards)
                abort();
        struct shm_shard *s = &l->shards[shard];
        uint32_t gen = atomic_fetch_add(&s->gen, 1) + 1;
        atomic_store(&s->psd_pid, 0);
        ring(s);   /* a psd serving the old generation looks again and stops */
        return gen;
}

void shmlink_shard_close(struct shmlink *l, uint32_t shard) {
        shmlink_shard_open(l, shard);
}

uint32_t shmlink_push(struct shmlink *l, uint32_t g, uint32_t shard, uint64_t local_step, bool count_step) {
        if (g >= l->n_groups || shard >= l->n_shards)
                abort();
        struct shm_group *gr = &l->groups[g];
        struct shm_shard *s = &l->shards[shard];
        uint32_t seq = ++l->seq[g];
        gr->local_step = local_step;
        gr->count_step = count_step;
        gr->shard = shard;
        atomic_store(&gr->push_seq, seq);   /* releases the gradients and the fields above */
        atomic_fetch_add(&s->bell, 1);
        if (atomic_load(&s->sleeping))
                futex_wake_all(&s->bell);
        return seq;
}

bool shmlink_answered(const struct shmlink *l, uint32_t g, uint32_t seq) {
        return atomic_load_explicit(&l->groups[g].done_seq, memory_order_acquire) == seq;
}

int shmlink_wait(struct shmlink *l, uint32_t g, uint32_t seq, pid_t psd_pid, uint64_t spin_us, uint64_t timeout_us,
                 uint64_t *global_step_ret, char *err, size_t errlen) {
        struct shm_group *gr = &l->groups[g];
        uint64_t t0 = mono_us(), now = t0;
        while (!shmlink_answered(l, g, seq)) {
                now = mono_us();
                if (now - t0 < spin_us) {
                        for (int i = 0; i < 64; i++)
                                cpu_relax();
                        continue;
                }
                if (now - t0 >= timeout_us)
                        return errf(err, errlen, -ETIMEDOUT, "no answer through shared memory within %llu ms",
                                    (unsigned long long)(timeout_us / 1000));
                if (process_gone(psd_pid))
                        return errf(err, errlen, -ECONNRESET, "the ps process (pid %d) is gone", (int)psd_pid);
                uint32_t seen = atomic_load(&gr->done_seq);
                atomic_store(&gr->waiting, 1);
                if (seen != seq && atomic_load(&gr->done_seq) == seen)
                        futex_wait_ms(&gr->done_seq, seen, 20);
                atomic_store(&gr->waiting, 0);
        }
        int st = gr->status;
        if (st > 0 || st < -4095)
                st = -EPROTO;
        if (st < 0) {
                char msg[SHMLINK_MSG];
                memcpy(msg, gr->msg, sizeof(msg));
                msg[sizeof(msg) - 1] = 0;
                return errf(err, errlen, st, "%s", msg[0] ? msg : strerror(-st));
        }
        if (global_step_ret)
                *global_step_ret = gr->global_step;
        return 0;
}

/* ---- psd's side ---- */

static int check_header(const struct shm_header *h, size_t file_size, const uint8_t *nonce, uint64_t fingerprint,
                        size_t n_params, uint32_t shard, char *err, size_t errlen) {
        if (memcmp(h->magic, MAGIC, sizeof(h->magic)) != 0 || h->version != VERSION)
                return errf(err, errlen, -EPROTO, "not a psfleet segment of version %d", VERSION);
        if (memcmp(h->nonce, nonce, SHMLINK_NONCE) != 0)
                return errf(err, errlen, -EPROTO, "its nonce is not the one the worker sent");
        if (h->fingerprint != fingerprint)
                return errf(err, errlen, -EPROTO, "its job fingerprint differs from this job's");
        if (h->n_params != n_params)
                return errf(err, errlen, -EPROTO, "%llu parameters, the job has %zu", (unsigned long long)h->n_params,
                            n_params);
        if (h->n_shards == 0 || h->n_shards > SHMLINK_MAX_SHARDS || shard >= h->n_shards ||
            h->n_groups > SHMLINK_MAX_GROUPS)
                return errf(err, errlen, -EPROTO, "%u shards and %u groups do not fit shard %u", h->n_shards,
                            h->n_groups, shard);
        uint64_t so, go, po, gro, size;
        layout(h->n_shards, h->n_groups, n_params, &so, &go, &po, &gro, &size);
        if (h->shards_off != so || h->groups_off != go || h->params_off != po || h->grads_off != gro ||
            h->size != size || size > file_size)
                return errf(err, errlen, -EPROTO, "its layout does not match its sizes (%llu bytes, file %zu)",
                            (unsigned long long)h->size, file_size);
        return 0;
}

int shmlink_open(int fd, pid_t pid, const uint8_t nonce[SHMLINK_NONCE], uint64_t fingerprint, size_t n_params,
                 uint32_t shard, uint32_t gen, struct shmlink **ret, char *err, size_t errlen) {
        char why[300];
        if (fd < 0)
                return errf(err, errlen, -EBADF, "no descriptor of shared memory");
        /* what we were given: only a psfleet worker's memfd, its size sealed */
        char target[256];
        int fr = fd_sealed_memfd(fd, "psfleet-", target, sizeof(target));
        if (fr == -ENOENT)
                return errf(err, errlen, -EPROTO, "the shared memory of process %d is \"%s\", not a psfleet segment",
                            (int)pid, target);
        if (fr < 0)
                return errf(err, errlen, -EPROTO, "the shared memory of process %d may shrink (not sealed)", (int)pid);
        struct stat st;
        if (fstat(fd, &st) < 0 || (size_t)st.st_size < PAGE)
                return errf(err, errlen, -EPROTO, "the shared memory of process %d is too small to be a segment", (int)pid);
        size_t size = (size_t)st.st_size;
        void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED)
                return errf(err, errlen, -errno, "cannot map the shared memory of process %d: %s", (int)pid,
                            strerror(errno));
        /* read the header once, into private memory, and check that copy */
        struct shm_header h;
        memcpy(&h, base, sizeof(h));
        int r = check_header(&h, size, nonce, fingerprint, n_params, shard, why, sizeof(why));
        if (r == 0 && h.worker_pid != (int32_t)pid)
                r = errf(why, sizeof(why), -EPROTO, "it belongs to process %d", (int)h.worker_pid);
        if (r < 0) {
                munmap(base, size);
                return errf(err, errlen, r, "the shared memory of process %d: %s", (int)pid, why);
        }
        struct shmlink *l = calloc(1, sizeof(*l));
        if (!l) {
                munmap(base, size);
                return errf(err, errlen, -ENOMEM, "out of memory");
        }
        l->fd = -1;
        l->base = base;
        l->size = size;
        point(l, &h);
        l->n_shards = h.n_shards;
        l->n_groups = h.n_groups;
        l->shard = shard;
        l->gen = gen;
        memcpy(l->nonce, nonce, SHMLINK_NONCE);
        struct shm_shard *s = &l->shards[shard];
        if (atomic_load(&s->gen) != gen) {
                shmlink_free(l);
                return errf(err, errlen, -ESTALE, "the shared memory of process %d: generation %u of ps:%u's link was "
                            "replaced", (int)pid, gen, shard);
        }
        atomic_store(&s->psd_pid, (int32_t)getpid());
        *ret = l;
        return 0;
}

uint32_t shmlink_n_groups(const struct shmlink *l) {
        return l->n_groups;
}

pid_t shmlink_worker_pid(const struct shmlink *l) {
        return l->h->worker_pid;
}

uint32_t shmlink_worker(const struct shmlink *l) {
        return l->h->worker;
}

bool shmlink_worker_alive(const struct shmlink *l) {
        return !process_gone(l->h->worker_pid);
}

static bool ended(const struct shmlink *l, const atomic_bool *stop) {
        return (stop && atomic_load(stop)) || atomic_load(&l->h->closed) ||
               atomic_load(&l->shards[l->shard].gen) != l->gen;
}

void shmlink_mark(struct shmlink *l, const uint32_t *groups, uint32_t n, uint32_t *last) {
        for (uint32_t i = 0; i < n; i++) {
                if (groups[i] >= l->n_groups)
                        abort();
                last[i] = atomic_load(&l->groups[groups[i]].push_seq);
        }
}

/* The first group with a push not served yet. */
static int scan(struct shmlink *l, const uint32_t *groups, uint32_t n, uint32_t *last, struct shmlink_push *ret) {
        for (uint32_t i = 0; i < n; i++) {
                struct shm_group *gr = &l->groups[groups[i]];
                uint32_t seq = atomic_load_explicit(&gr->push_seq, memory_order_acquire);
                if (seq == last[i])
                        continue;
                last[i] = seq;
                *ret = (struct shmlink_push){.index = i, .seq = seq, .local_step = gr->local_step,
                                             .count_step = gr->count_step != 0};
                return 1;
        }
        return 0;
}

int shmlink_next(struct shmlink *l, const uint32_t *groups, uint32_t n, uint32_t *last, uint64_t spin_us,
                 uint64_t timeout_ms, const atomic_bool *stop, struct shmlink_push *ret) {
        for (uint32_t i = 0; i < n; i++)
                if (groups[i] >= l->n_groups)
                        abort();
        struct shm_shard *s = &l->shards[l->shard];
        uint64_t t0 = mono_us();
        for (;;) {
                if (ended(l, stop))
                        return -ESHUTDOWN;
                uint32_t bell = atomic_load(&s->bell);
                if (scan(l, groups, n, last, ret))
                        return 1;
                uint64_t now = mono_us();
                if (now - t0 >= timeout_ms * 1000)
                        return 0;
                if (now - t0 < spin_us) {
                        while (atomic_load_explicit(&s->bell, memory_order_relaxed) == bell && mono_us() - t0 < spin_us)
                                for (int i = 0; i < 64; i++)
                                        cpu_relax();
                        continue;
                }
                atomic_store(&s->sleeping, 1);
                if (atomic_load(&s->bell) == bell && !ended(l, stop)) {
                        uint64_t left = timeout_ms - (now - t0) / 1000;
                        futex_wait_ms(&s->bell, bell, left ? left : 1);
                }
                atomic_store(&s->sleeping, 0);
        }
}

void shmlink_reply(struct shmlink *l, uint32_t g, uint32_t seq, int status, uint64_t global_step, const char *msg) {
        if (g >= l->n_groups)
                abort();
        struct shm_group *gr = &l->groups[g];
        gr->status = status;
        gr->global_step = global_step;
        snprintf(gr->msg, sizeof(gr->msg), "%s", msg ? msg : "");
        atomic_store(&gr->done_seq, seq);   /* releases the fields above and the values */
        if (atomic_load(&gr->waiting))
                futex_wake_all(&gr->done_seq);
}

void shmlink_kick(struct shmlink *l) {
        ring(&l->shards[l->shard]);
}

/* ---- both ---- */

float *shmlink_params(struct shmlink *l) {
        return l->params;
}

float *shmlink_grads(struct shmlink *l) {
        return l->grads;
}

struct shmlink *shmlink_free(struct shmlink *l) {
        if (!l)
                return NULL;
        if (l->base) {
                if (l->owner) {
                        atomic_store(&l->h->closed, 1);
                        for (uint32_t s = 0; s < l->n_shards; s++)
                                ring(&l->shards[s]);
                } else if (atomic_load(&l->shards[l->shard].psd_pid) == (int32_t)getpid()) {
                        atomic_store(&l->shards[l->shard].psd_pid, 0);
                }
                munmap(l->base, l->size);
        }
        if (l->owner && l->fd >= 0)
                close(l->fd);
        free(l->seq);
        free(l);
        return NULL;
}
