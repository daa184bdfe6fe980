/* The ring of updates from a primary to its backup on the same host (replica_ring.h).
 *
 * Positions are byte counts since the ring began (never wrapped); a position's place in the data area
 * is pos & (size - 1). The tail (published) is written by the primary only, by compare-and-swap so that
 * it cannot publish past a close; the head (applied) by the backup only. The primary writes only in
 * [tail, head + size), the backup reads only in [head, tail): neither touches what the other may be
 * using. The backup sleeps on a futex word the primary changes after publishing, when the backup said
 * it sleeps (the word and the flag, both sequentially consistent, close the race: the backup sees
 * either the new tail or the changed word). */
#include <errno.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "replica_ring.h"
#include "util.h"

#define PAGE 4096u
#define MAGIC 0x676e697231737066ull   /* "fps1ring" */
#define CLOSED (1ull << 63)
#define SKIP (1ull << 63)             /* a record length: the rest of the data area is unused */
#define MIN_SIZE (1u << 20)
#define MAX_SIZE (1ull << 34)

struct ring_header {
        uint64_t magic, size, fingerprint;
        uint32_t shard, pad;
        uint8_t nonce[RING_NONCE];
        _Alignas(64) _Atomic uint64_t tail;      /* primary: published, | CLOSED once the backup closed it */
        _Atomic uint64_t closed_epoch;           /* backup: the epoch it closed the ring at */
        _Alignas(64) _Atomic uint64_t head;      /* backup: applied */
        _Atomic uint64_t applied_seq;            /* backup: the last record's seq it applied */
        _Atomic int32_t backup_pid;
        _Alignas(64) _Atomic uint32_t bell;      /* primary: changed after a publish when the backup sleeps */
        _Atomic uint32_t sleeping;               /* backup: it is (about to be) asleep on bell */
        _Atomic uint64_t wake_bytes;             /* backup: wake it once this many bytes are pending */
};

/* A record's head as it lies in the ring (struct ring_rec, with its length first). */
struct rec_wire {
        uint64_t len;            /* the whole record, head included, a multiple of 8; or SKIP | bytes */
        uint64_t seq, gs, local_step;
        uint32_t worker, count_step, n, pad;
};

struct tensor_wire {
        uint32_t part, dtype;
        uint64_t nbytes;
};

struct ring {
        struct ring_header *h;
        uint8_t *data;
        size_t size, map_size;
        int fd;                  /* the primary's: the memfd; -1 on the backup's side */
        uint64_t pos;            /* backup: the record ring_next returned ends here */
        uint64_t last_head, since_us;   /* primary: the head last seen, and since when (ring_stalled_us) */
        uint64_t res_tail, res_len;     /* primary: the reservation (ring_reserve) to publish: the tail it */
        uint8_t *res_rec;               /* follows, its bytes with a skip before it, where its record is, */
        uint32_t res_n;                 /* its tensors; res_len 0: none */
};

_Static_assert(sizeof(struct ring_header) <= PAGE, "the ring's header fits its page");
_Static_assert(sizeof(struct rec_wire) % 8 == 0 && sizeof(struct tensor_wire) % 8 == 0, "8-aligned records");

static size_t pad4(uint64_t n) {
        return (size_t)((n + 3) & ~3ull);
}

static size_t pad8(uint64_t n) {
        return (size_t)((n + 7) & ~7ull);
}

size_t ring_record_bytes(uint32_t n, size_t bytes) {
        return sizeof(struct rec_wire) + (size_t)n * (sizeof(struct tensor_wire) + 3) + bytes + 7;
}

size_t ring_size_for(size_t max_record) {
        size_t size = MIN_SIZE;
        /* two of the largest records: a record always fits once the backup has applied the ring, and a
         * small ring stays in the caches (each record is written, applied and read there) */
        while (size < MAX_SIZE && size < 2 * max_record)
                size *= 2;
        return size;
}

/* Copies n bytes into the ring. With SSE2, in non-temporal stores: a record is read once, by the backup,
 * after megabytes of other traffic, so it would only push the primary's working set (the shard, the
 * workers' segments) out of the caches, and each line written normally is first read from memory.
 * The caller fences (ring_put's _mm_sfence) before it publishes. */
static void copy_out(uint8_t *dst, const uint8_t *src, size_t n) {
#if defined(__SSE2__)
        size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
        if (n < 256 || head > n) {
                memcpy(dst, src, n);
                return;
        }
        memcpy(dst, src, head);
        size_t i = head;
        for (; i + 64 <= n; i += 64) {
                __m128i a = _mm_loadu_si128((const __m128i *)(src + i)), b = _mm_loadu_si128((const __m128i *)(src + i + 16));
                __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(src + i + 48));
                _mm_stream_si128((__m128i *)(dst + i), a);
                _mm_stream_si128((__m128i *)(dst + i + 16), b);
                _mm_stream_si128((__m128i *)(dst + i + 32), c);
                _mm_stream_si128((__m128i *)(dst + i + 48), d);
        }
        memcpy(dst + i, src + i, n - i);
#else
        memcpy(dst, src, n);
#endif
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
        return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);   /* shared: two processes */
}

int ring_create(uint64_t fingerprint, uint32_t shard, size_t size, struct ring **ret, char *err, size_t errlen) {
        *ret = NULL;
        if (size < PAGE || (size & (size - 1)) || size > MAX_SIZE)
                return errf(err, errlen, -EINVAL, "a ring of %zu bytes (a power of two from 4 KiB)", size);
        struct ring *g = calloc(1, sizeof(*g));
        if (!g)
                return errf(err, errlen, -ENOMEM, "out of memory");
        g->map_size = PAGE + size;
        g->size = size;
        g->since_us = mono_us();
        char label[64];
        snprintf(label, sizeof(label), "psfleet-replica-ps%u", shard);
        int r;
        g->fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (g->fd < 0) {
                r = errf(err, errlen, -errno, "cannot create shared memory: memfd_create: %s", strerror(errno));
                goto fail;
        }
        /* posix_fallocate: no memory for it is an error now, not a SIGBUS later */
        int fr = ftruncate(g->fd, (off_t)g->map_size) < 0 ? errno : posix_fallocate(g->fd, 0, (off_t)g->map_size);
        if (fr == 0 && fcntl(g->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                fr = errno;
        if (fr != 0) {
                r = errf(err, errlen, -fr, "cannot make %zu bytes of shared memory: %s", g->map_size, strerror(fr));
                goto fail;
        }
        void *base = mmap(NULL, g->map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, g->fd, 0);
        if (base == MAP_FAILED) {
                r = errf(err, errlen, -errno, "cannot map shared memory: %s", strerror(errno));
                goto fail;
        }
        g->h = base;
        g->data = (uint8_t *)base + PAGE;
        g->h->magic = MAGIC;
        g->h->size = size;
        g->h->fingerprint = fingerprint;
        g->h->shard = shard;
        if (getrandom(g->h->nonce, RING_NONCE, 0) != RING_NONCE) {
                r = errf(err, errlen, -EIO, "cannot draw a nonce for shared memory");
                goto fail;
        }
        *ret = g;
        return 0;
fail:
        ring_free(g);
        return r;
}

int ring_fd(const struct ring *g) {
        return g->fd;
}

const uint8_t *ring_nonce(const struct ring *g) {
        return g->h->nonce;
}

/* Waits until [tail, tail + need) is free, up to deadline (mono_us): 1; 0 at the deadline; -1 once the
 * ring is closed (nothing may be written then: the backup drains what lies past the head). */
static int room(struct ring *g, uint64_t tail, size_t need, uint64_t deadline) {
        for (unsigned i = 0;; i++) {
                if (atomic_load(&g->h->tail) & CLOSED)
                        return -1;
                if (tail + need - atomic_load_explicit(&g->h->head, memory_order_acquire) <= g->size)
                        return 1;
                if (mono_us() >= deadline)
                        return 0;
                if (i > 64)
                        usleep(50);
        }
}

int ring_reserve(struct ring *g, uint32_t n, const struct ring_tensor *t, uint64_t timeout_us, uint64_t *closed_epoch,
                 void **data, char *err, size_t errlen) {
        size_t bytes = 0;
        for (uint32_t k = 0; k < n; k++)
                bytes += pad4(t[k].nbytes);
        size_t len = pad8(sizeof(struct rec_wire) + n * sizeof(struct tensor_wire) + bytes);
        g->res_len = 0;
        if (len > g->size / 2)
                return errf(err, errlen, -E2BIG, "an update of %zu bytes, the ring to the backup holds %zu", len, g->size);
        uint64_t tail = atomic_load(&g->h->tail);
        if (tail & CLOSED)
                goto closed;
        size_t off = (size_t)(tail & (g->size - 1)), skip = off + len > g->size ? g->size - off : 0;
        int free_ = room(g, tail, skip + len, mono_us() + timeout_us);
        if (free_ < 0)
                goto closed;
        if (free_ == 0)
                return errf(err, errlen, -ETIMEDOUT, "the backup applied nothing of the %llu bytes waiting for it "
                            "in %llu ms", (unsigned long long)ring_pending(g), (unsigned long long)(timeout_us / 1000));
        if (skip) {
                ((struct rec_wire *)(g->data + off))->len = SKIP | skip;
                off = 0;
        }
        g->res_tail = tail;
        g->res_len = skip + len;
        g->res_rec = g->data + off;
        ((struct rec_wire *)g->res_rec)->len = len;
        struct tensor_wire *tw = (struct tensor_wire *)(g->res_rec + sizeof(struct rec_wire));
        for (uint32_t k = 0; k < n; k++)
                tw[k] = (struct tensor_wire){.part = t[k].part, .dtype = t[k].dtype, .nbytes = t[k].nbytes};
        g->res_n = n;
        *data = tw + n;
        return 0;
closed:
        *closed_epoch = atomic_load(&g->h->closed_epoch);
        return errf(err, errlen, -ESTALE, "the backup closed the ring at epoch %llu", (unsigned long long)*closed_epoch);
}

int ring_publish(struct ring *g, const struct ring_rec *rec, uint64_t *closed_epoch, char *err, size_t errlen) {
        if (!g->res_len)
                return errf(err, errlen, -EINVAL, "a publish without its reservation");
        struct rec_wire *w = (struct rec_wire *)g->res_rec;
        *w = (struct rec_wire){.len = w->len, .seq = rec->seq, .gs = rec->gs, .local_step = rec->local_step,
                               .worker = rec->worker, .count_step = rec->count_step, .n = g->res_n};
        uint64_t tail = g->res_tail, advance = g->res_len;
        g->res_len = 0;
#if defined(__SSE2__)
        _mm_sfence();   /* streamed stores (ring_put) before the tail that publishes them */
#endif
        /* published unless closed meanwhile: then refused, and never seen by the backup */
        if (atomic_compare_exchange_strong(&g->h->tail, &tail, tail + advance)) {
                if (atomic_load(&g->h->sleeping) &&
                    ring_pending(g) >= atomic_load(&g->h->wake_bytes) && atomic_exchange(&g->h->sleeping, 0)) {
                        atomic_fetch_add(&g->h->bell, 1);
                        futex(&g->h->bell, FUTEX_WAKE, 1, NULL);
                }
                return 0;
        }
        *closed_epoch = atomic_load(&g->h->closed_epoch);
        return errf(err, errlen, -ESTALE, "the backup closed the ring at epoch %llu", (unsigned long long)*closed_epoch);
}

int ring_put(struct ring *g, const struct ring_rec *rec, const struct ring_tensor *t, uint64_t timeout_us,
             uint64_t *closed_epoch, char *err, size_t errlen) {
        void *data;
        int e = ring_reserve(g, rec->n, t, timeout_us, closed_epoch, &data, err, errlen);
        if (e < 0)
                return e;
        uint8_t *at = data;
        for (uint32_t k = 0; k < rec->n; k++) {
                copy_out(at, t[k].data, t[k].nbytes);
                at += pad4(t[k].nbytes);
        }
        return ring_publish(g, rec, closed_epoch, err, errlen);
}

uint64_t ring_pending(const struct ring *g) {
        return (atomic_load(&g->h->tail) & ~CLOSED) - atomic_load(&g->h->head);
}

uint64_t ring_applied_seq(const struct ring *g) {
        return atomic_load(&g->h->applied_seq);
}

uint64_t ring_stalled_us(struct ring *g) {
        uint64_t head = atomic_load(&g->h->head), now = mono_us();
        if (head != g->last_head || ring_pending(g) == 0) {
                g->last_head = head;
                g->since_us = now;
        }
        return now - g->since_us;
}

int32_t ring_backup_pid(const struct ring *g) {
        return atomic_load(&g->h->backup_pid);
}

/* ---- the backup's side ---- */

int ring_open(int fd, const uint8_t nonce[RING_NONCE], uint64_t fingerprint, uint32_t shard, struct ring **ret,
              char *err, size_t errlen) {
        *ret = NULL;
        if (fd < 0)
                return errf(err, errlen, -EBADF, "no descriptor of shared memory");
        char target[256];
        int fr = fd_sealed_memfd(fd, "psfleet-replica-", target, sizeof(target));
        if (fr == -ENOENT)
                return errf(err, errlen, -EPROTO, "the shared memory is \"%s\", not a psfleet replica ring", target);
        if (fr < 0)
                return errf(err, errlen, -EPROTO, "the ring may shrink (not sealed)");
        struct stat st;
        if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < 2 * PAGE || (uint64_t)st.st_size > PAGE + MAX_SIZE)
                return errf(err, errlen, -EPROTO, "a ring of %lld bytes", (long long)st.st_size);
        size_t map_size = (size_t)st.st_size;
        void *base = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (base == MAP_FAILED)
                return errf(err, errlen, -errno, "cannot map the ring: %s", strerror(errno));
        const struct ring_header *h = base;
        uint64_t size = h->size;
        int r = 0;
        if (h->magic != MAGIC)
                r = errf(err, errlen, -EPROTO, "not a ring (magic)");
        else if (size + PAGE != map_size || (size & (size - 1)))
                r = errf(err, errlen, -EPROTO, "a ring of %llu data bytes in %zu", (unsigned long long)size, map_size);
        else if (memcmp(h->nonce, nonce, RING_NONCE) != 0)
                r = errf(err, errlen, -EPROTO, "the ring's nonce is not the call's");
        else if (h->fingerprint != fingerprint || h->shard != shard)
                r = errf(err, errlen, -EPROTO, "a ring of ps:%u of another job's model (fingerprint %016llx)", h->shard,
                         (unsigned long long)h->fingerprint);
        else if (atomic_load(&h->tail) != 0 || atomic_load(&h->head) != 0)
                r = errf(err, errlen, -EPROTO, "a ring already in use");
        struct ring *g = r == 0 ? calloc(1, sizeof(*g)) : NULL;
        if (r == 0 && !g)
                r = errf(err, errlen, -ENOMEM, "out of memory");
        if (r < 0) {
                munmap(base, map_size);
                return r;
        }
        g->h = base;
        g->data = (uint8_t *)base + PAGE;
        g->size = (size_t)size;
        g->map_size = map_size;
        g->fd = -1;
        atomic_store(&g->h->backup_pid, (int32_t)getpid());
        *ret = g;
        return 0;
}

int ring_next(struct ring *g, struct ring_rec *rec, struct ring_body *body, char *err, size_t errlen) {
        for (;;) {
                uint64_t head = atomic_load_explicit(&g->h->head, memory_order_relaxed);
                uint64_t tail = atomic_load_explicit(&g->h->tail, memory_order_acquire) & ~CLOSED;
                if (head == tail)
                        return 0;
                size_t off = (size_t)(head & (g->size - 1)), room_here = g->size - off;
                if (tail - head > g->size || (head & 7))
                        return errf(err, errlen, -EPROTO, "the ring's positions (head %llu, tail %llu) are not sound",
                                    (unsigned long long)head, (unsigned long long)tail);
                struct rec_wire w;
                if (room_here < sizeof(w.len) || tail - head < sizeof(w.len))
                        return errf(err, errlen, -EPROTO, "a record cut short at %llu", (unsigned long long)head);
                memcpy(&w.len, g->data + off, sizeof(w.len));   /* read once: the writer is not trusted */
                if (w.len & SKIP) {
                        if ((w.len & ~SKIP) != room_here || tail - head < room_here)
                                return errf(err, errlen, -EPROTO, "a skip of %llu bytes at %llu",
                                            (unsigned long long)(w.len & ~SKIP), (unsigned long long)head);
                        atomic_store_explicit(&g->h->head, head + room_here, memory_order_release);
                        continue;
                }
                if (w.len < sizeof(w) || (w.len & 7) || w.len > room_here || w.len > tail - head)
                        return errf(err, errlen, -EPROTO, "a record of %llu bytes at %llu", (unsigned long long)w.len,
                                    (unsigned long long)head);
                size_t len = (size_t)w.len;   /* the first read's, checked above */
                memcpy(&w, g->data + off, sizeof(w));
                if (w.n > (len - sizeof(w)) / sizeof(struct tensor_wire))
                        return errf(err, errlen, -EPROTO, "a record of %u tensors in %zu bytes", w.n, len);
                *rec = (struct ring_rec){.seq = w.seq, .gs = w.gs, .local_step = w.local_step, .worker = w.worker,
                                         .count_step = w.count_step, .n = w.n};
                const uint8_t *heads = g->data + off + sizeof(w);
                *body = (struct ring_body){.heads = heads, .data = heads + (size_t)w.n * sizeof(struct tensor_wire),
                                           .n = w.n, .left = len - sizeof(w) - (size_t)w.n * sizeof(struct tensor_wire)};
                g->pos = head + len;
                return 1;
        }
}

int ring_tensor_next(struct ring_body *body, struct ring_tensor *t, char *err, size_t errlen) {
        struct tensor_wire w;
        if (body->k >= body->n)
                return errf(err, errlen, -EPROTO, "a tensor past the record's %u", body->n);
        memcpy(&w, body->heads + (size_t)body->k * sizeof(w), sizeof(w));
        if (w.nbytes > body->left || pad4(w.nbytes) > body->left)
                return errf(err, errlen, -EPROTO, "a tensor of %llu bytes, %zu left in its record",
                            (unsigned long long)w.nbytes, body->left);
        *t = (struct ring_tensor){.part = w.part, .dtype = w.dtype, .nbytes = w.nbytes, .data = body->data};
        body->data += pad4(w.nbytes);
        body->left -= pad4(w.nbytes);
        body->k++;
        return 0;
}

void ring_consumed(struct ring *g, uint64_t seq) {
        atomic_store_explicit(&g->h->applied_seq, seq, memory_order_relaxed);
        atomic_store_explicit(&g->h->head, g->pos, memory_order_release);
}

void ring_close(struct ring *g, uint64_t epoch) {
        uint64_t tail = atomic_load(&g->h->tail);
        if (tail & CLOSED)
                return;
        atomic_store(&g->h->closed_epoch, epoch);   /* before the bit: a refused writer reads it after */
        atomic_fetch_or(&g->h->tail, CLOSED);
}

bool ring_closed(const struct ring *g) {
        return atomic_load(&g->h->tail) & CLOSED;
}

void ring_wait(struct ring *g, uint64_t ms, uint64_t bytes) {
        uint32_t bell = atomic_load(&g->h->bell);
        atomic_store(&g->h->wake_bytes, bytes ? bytes : 1);
        atomic_store(&g->h->sleeping, 1);
        if (ring_pending(g) < (bytes ? bytes : 1)) {
                struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
                futex(&g->h->bell, FUTEX_WAIT, bell, &ts);
        }
        atomic_store(&g->h->sleeping, 0);
}

size_t ring_data_size(const struct ring *g) {
        return g->size;
}

struct ring *ring_free(struct ring *g) {
        if (!g)
                return NULL;
        if (g->h)
                munmap(g->h, g->map_size);
        if (g->fd >= 0)
                close(g->fd);
        free(g);
        return NULL;
}
