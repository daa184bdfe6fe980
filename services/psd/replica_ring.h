/* ps.replicas 2 with the backup on the primary's host: the updates go to the backup through a ring in
 * shared memory instead of Replicate calls (docs/architecture.md, "Replicated shards").
 *
 * The primary creates the ring (a sealed memfd: a header page, then a power-of-two data area) and
 * hands its descriptor to the backup over the backup's replica socket, tied to an authenticated
 * Replicate call (the same two steps as a worker's shared memory, shmlink.h). From then on an update
 * is a record the primary writes past the ring's tail and publishes by moving the tail; the backup
 * applies the records in order and moves the head.
 *
 * Why a published record counts as held by the backup: the backup maps the ring, so the record lives
 * in the backup's memory whatever happens to the primary (kill -9 included); the push it belongs to
 * may be answered at once, with no round trip. The backup applies it at its own pace, and a backup
 * promoted to primary first applies every record published before it closed the ring.
 *
 * Fencing: the tail word carries a closed bit. The backup closes the ring (atomically, with the epoch
 * at which it did: promoted, or taken over by a newer primary) and then drains it; the primary
 * publishes with a compare-and-swap that fails on a closed ring. So a record is either published
 * before the close, and applied by the backup before it serves, or refused to its writer, which must
 * not answer it as done. A primary frozen while writing (SIGSTOP) and resumed after the close finds its
 * write refused.
 *
 * Records: a head (struct ring_rec, 8-aligned), its tensors' heads (part, dtype, bytes), then their
 * bytes one after the other, each padded to 4 (float32 parts lie end to end, as in a shared-memory
 * push's scratch), the record padded to 8. A record that does not fit before the data area's end is
 * preceded by a skip to the start. The backup treats everything in the ring as untrusted: each record's length, part and
 * bytes are checked before it is applied (ring_next, ring_tensor_next).
 *
 * One producer thread at a time (the primary holds its replica's lock) and one consumer (the
 * backup's, under its replica's lock). Errors are -errno with the reason in err. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RING_NONCE 16

struct ring;

/* One update's head as written. */
struct ring_rec {
        uint64_t seq, gs, local_step;
        uint32_t worker, count_step;
        uint32_t n;              /* tensors */
};

/* One tensor of a record: a part of the shard (its index), its wire dtype and bytes. */
struct ring_tensor {
        uint32_t part, dtype;
        uint64_t nbytes;
        const void *data;
};

/* The data area's bytes for records of up to max_record bytes (ring_record_bytes): a power of two, at
 * least 1 MiB, room for two such records. */
size_t ring_size_for(size_t max_record);
/* The bytes a record of n tensors of `bytes` bytes in all takes, head and padding included. */
size_t ring_record_bytes(uint32_t n, size_t bytes);

/* ---- the primary's side ---- */

/* A new ring of `size` data bytes (ring_size_for) for shard `shard` of the job with this fingerprint. */
int ring_create(uint64_t fingerprint, uint32_t shard, size_t size, struct ring **ret, char *err, size_t errlen);
int ring_fd(const struct ring *g);
const uint8_t *ring_nonce(const struct ring *g);
/* Writes one record (rec, its n tensors) and publishes it, waiting up to timeout_us for room while the
 * backup applies. 0; -ESTALE: the backup closed the ring (*closed_epoch: the epoch it closed it at);
 * -ETIMEDOUT: no room in time (the backup does not keep up); -E2BIG: larger than half the ring. */
int ring_put(struct ring *g, const struct ring_rec *rec, const struct ring_tensor *t, uint64_t timeout_us,
             uint64_t *closed_epoch, char *err, size_t errlen);
/* Or in two steps, so a writer can put the bytes in place itself (a shared-memory push's gradients
 * copied out of the worker's segment straight into the ring, and applied from there): ring_reserve
 * makes room for a record of n tensors (t: their part, dtype and nbytes; data unused) and returns in
 * *data where their bytes go (each padded to 4, as above); ring_publish gives the record its head
 * (rec, its n the reservation's) and publishes it. A reservation not published is dropped by the next. Errors as ring_put's. */
int ring_reserve(struct ring *g, uint32_t n, const struct ring_tensor *t, uint64_t timeout_us, uint64_t *closed_epoch,
                 void **data, char *err, size_t errlen);
int ring_publish(struct ring *g, const struct ring_rec *rec, uint64_t *closed_epoch, char *err, size_t errlen);
/* Bytes published and not yet applied; the last record the backup applied (its seq); and how long the
 * head has not moved while bytes were pending (0 when none are): the backup's lag. */
uint64_t ring_pending(const struct ring *g);
uint64_t ring_applied_seq(const struct ring *g);
uint64_t ring_stalled_us(struct ring *g);
/* The backup's pid, as it wrote it when it mapped the ring (0 before). */
int32_t ring_backup_pid(const struct ring *g);

/* ---- the backup's side ---- */

/* Maps the ring of descriptor fd (lent: the caller closes it), after checking it: a psfleet replica
 * memfd with its size sealed, this nonce, fingerprint and shard, a sound layout. Records this process
 * as the ring's backup. -EPROTO for a ring that does not match. */
int ring_open(int fd, const uint8_t nonce[RING_NONCE], uint64_t fingerprint, uint32_t shard, struct ring **ret,
              char *err, size_t errlen);
/* A record's tensors, read one by one with ring_tensor_next. */
struct ring_body {
        const uint8_t *heads, *data;
        uint32_t n, k;
        size_t left;             /* data bytes left in the record */
};
/* The next published record not yet applied: 1 with *rec and its tensors in *body (valid until
 * ring_consumed); 0 when none is published; -EPROTO for a record that does not fit (its length, its
 * tensors' count). */
int ring_next(struct ring *g, struct ring_rec *rec, struct ring_body *body, char *err, size_t errlen);
/* The record's next tensor: 0 with *t (data pointing into the ring); -EPROTO when there is none left or
 * its bytes run past the record. */
int ring_tensor_next(struct ring_body *body, struct ring_tensor *t, char *err, size_t errlen);
/* The record ring_next returned has been applied: the head moves past it, its seq recorded. */
void ring_consumed(struct ring *g, uint64_t seq);
/* Closes the ring at `epoch`: the primary's later writes are refused. Records published before stay
 * for ring_next. Idempotent. */
void ring_close(struct ring *g, uint64_t epoch);
bool ring_closed(const struct ring *g);
/* Sleeps until `bytes` of records are published and not applied (1 at least), or up to ms: returns at
 * once when they are. The primary wakes a sleeping backup only then, so a backup that asks for more
 * than one record is woken less often and applies them in batches. */
void ring_wait(struct ring *g, uint64_t ms, uint64_t bytes);
size_t ring_data_size(const struct ring *g);   /* the data area's bytes */

/* ---- both ---- */

/* Unmaps (and the primary's side closes its descriptor). NULL-safe; returns NULL. */
struct ring *ring_free(struct ring *g);
