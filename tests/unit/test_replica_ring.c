/* The ring of updates from a primary to its backup on one host (services/psd/replica_ring.c): records
 * in order across the data area's end, a close that refuses later writes but keeps what was
 * published, a backup that does not keep up, and a ring that lies. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
#include <unistd.h>
#include <cmocka.h>

#include "replica_ring.h"
#include "util.h"

#include "unit.h"

#define FP 0x1234abcdull

static struct ring *pair(size_t size, struct ring **backup) {
        struct ring *g;
        char err[300];
        assert_int_equal(ring_create(FP, 3, size, &g, err, sizeof(err)), 0);
        assert_int_equal(ring_open(ring_fd(g), ring_nonce(g), FP, 3, backup, err, sizeof(err)), 0);
        assert_int_equal(ring_backup_pid(g), getpid());
        return g;
}

/* One record of two tensors, their bytes from seq (so each record is known by its contents). */
static int put(struct ring *g, uint64_t seq, size_t n0, uint64_t timeout_us, uint64_t *closed) {
        static uint8_t a[600000], b[13];
        memset(a, (int)(seq & 0xff), n0);
        memset(b, (int)(~seq & 0xff), sizeof(b));
        struct ring_rec rec = {.seq = seq, .gs = seq * 10, .local_step = seq + 1, .worker = 1, .count_step = 1, .n = 2};
        struct ring_tensor t[2] = {{.part = 0, .dtype = 1, .nbytes = n0, .data = a},
                                   {.part = 1, .dtype = 4, .nbytes = sizeof(b), .data = b}};
        char err[300];
        return ring_put(g, &rec, t, timeout_us, closed, err, sizeof(err));
}

/* Reads the next record and checks it is seq's, then consumes it. */
static void take(struct ring *b, uint64_t seq, size_t n0) {
        struct ring_rec rec;
        struct ring_body body;
        char err[300];
        assert_int_equal(ring_next(b, &rec, &body, err, sizeof(err)), 1);
        assert_true(rec.seq == seq && rec.gs == seq * 10 && rec.local_step == seq + 1 && rec.n == 2 && rec.count_step);
        struct ring_tensor t;
        assert_int_equal(ring_tensor_next(&body, &t, err, sizeof(err)), 0);
        assert_true(t.part == 0 && t.dtype == 1 && t.nbytes == n0);
        for (size_t i = 0; i < n0; i++)
                assert_int_equal(((const uint8_t *)t.data)[i], seq & 0xff);
        assert_int_equal(ring_tensor_next(&body, &t, err, sizeof(err)), 0);
        assert_true(t.part == 1 && t.dtype == 4 && t.nbytes == 13 && ((const uint8_t *)t.data)[12] == (~seq & 0xff));
        assert_true(body.left < 8);   /* the record padded to 8 */
        assert_int_equal(ring_tensor_next(&body, &t, err, sizeof(err)), -EPROTO);
        ring_consumed(b, seq);
}

static void test_ring_order(void **state) {
        (void)state;
        /* room for two of the largest records, at least 1 MiB */
        assert_int_equal(ring_size_for(100), 1u << 20);
        assert_int_equal(ring_size_for(800000), 2u << 20);
        assert_int_equal(ring_size_for(3u << 20), 8u << 20);
        assert_int_equal(ring_size_for(40u << 20), 128u << 20);
        assert_true(ring_record_bytes(2, 13) >= 48 + 2 * 16 + 13);
        struct ring *b, *g = pair(1u << 20, &b);
        uint64_t closed = 0;
        struct ring_rec rec;
        struct ring_body body;
        char err[300];
        assert_int_equal(ring_next(b, &rec, &body, err, sizeof(err)), 0);
        /* records of odd sizes, many times round the area's end, each read whole and in order */
        uint64_t seq = 1;
        for (int round = 0; round < 40; round++) {
                for (int k = 0; k < 3; k++)
                        assert_int_equal(put(g, seq + (uint64_t)k, 100000 + (size_t)round * 977 + (size_t)k, 1000000, &closed), 0);
                assert_true(ring_pending(g) > 300000);
                for (int k = 0; k < 3; k++)
                        take(b, seq + (uint64_t)k, 100000 + (size_t)round * 977 + (size_t)k);
                seq += 3;
                assert_int_equal(ring_pending(g), 0);
                assert_int_equal(ring_applied_seq(g), seq - 1);
        }
        /* larger than half the ring: refused as such, nothing written */
        assert_int_equal(put(g, seq, 600000, 1000, &closed), -E2BIG);
        assert_int_equal(ring_pending(g), 0);
        assert_int_equal(put(g, seq, 300000, 1000, &closed), 0);
        take(b, seq, 300000);
        ring_free(b);
        ring_free(g);
}

static void test_ring_close(void **state) {
        (void)state;
        struct ring *b, *g = pair(1u << 20, &b);
        uint64_t closed = 0;
        assert_int_equal(put(g, 1, 1000, 1000000, &closed), 0);
        assert_int_equal(put(g, 2, 1000, 1000000, &closed), 0);
        assert_false(ring_closed(b));
        ring_close(b, 7);
        ring_close(b, 9);   /* idempotent: the first epoch stays */
        assert_true(ring_closed(g));
        /* refused after the close, with the epoch; what was published before stays readable */
        assert_int_equal(put(g, 3, 1000, 1000000, &closed), -ESTALE);
        assert_int_equal(closed, 7);
        take(b, 1, 1000);
        take(b, 2, 1000);
        struct ring_rec rec;
        struct ring_body body;
        char err[300];
        assert_int_equal(ring_next(b, &rec, &body, err, sizeof(err)), 0);
        ring_free(b);
        ring_free(g);
}

/* A backup that applies nothing: the primary waits its timeout for room, then says so; the stall is
 * measured. */
static void test_ring_full(void **state) {
        (void)state;
        struct ring *b, *g = pair(1u << 20, &b);
        uint64_t closed = 0, seq = 1;
        int r;
        while ((r = put(g, seq, 200000, 20000, &closed)) == 0)
                seq++;
        assert_int_equal(r, -ETIMEDOUT);
        assert_true(seq >= 4 && seq <= 6);
        usleep(20000);
        assert_true(ring_stalled_us(g) >= 10000);
        take(b, 1, 200000);
        take(b, 2, 200000);
        assert_int_equal(ring_stalled_us(g), 0);
        assert_int_equal(put(g, seq, 200000, 20000, &closed), 0);
        ring_free(b);
        ring_free(g);
}

/* What the backup refuses: another job's ring, a nonce not the call's, a descriptor that is no ring,
 * and records whose lengths lie. */
static void test_ring_hostile(void **state) {
        (void)state;
        struct ring *g, *b;
        char err[300];
        uint8_t nonce[RING_NONCE] = {0};
        assert_int_equal(ring_create(FP, 3, 1u << 20, &g, err, sizeof(err)), 0);
        assert_int_equal(ring_open(ring_fd(g), ring_nonce(g), FP + 1, 3, &b, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "another job"));
        assert_int_equal(ring_open(ring_fd(g), ring_nonce(g), FP, 4, &b, err, sizeof(err)), -EPROTO);
        assert_int_equal(ring_open(ring_fd(g), nonce, FP, 3, &b, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "nonce"));
        int fd = memfd_create("psfleet-replica-x", 0);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, 1 << 20), 0);
        assert_int_equal(ring_open(fd, nonce, FP, 3, &b, err, sizeof(err)), -EPROTO);   /* not sealed */
        close(fd);
        fd = memfd_create("other", 0);
        assert_int_equal(ring_open(fd, nonce, FP, 3, &b, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "not a psfleet replica ring"));
        close(fd);
        assert_int_equal(ring_open(-1, nonce, FP, 3, &b, err, sizeof(err)), -EBADF);
        /* a record whose length runs past what was published, written behind the ring's back */
        assert_int_equal(ring_open(ring_fd(g), ring_nonce(g), FP, 3, &b, err, sizeof(err)), 0);
        uint64_t closed;
        assert_int_equal(put(g, 1, 64, 1000000, &closed), 0);
        uint8_t *data = mmap(NULL, 4096 + (1u << 20), PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd(g), 0);
        assert_true(data != MAP_FAILED);
        uint64_t len;
        memcpy(&len, data + 4096, 8);
        uint64_t bad = len + 8;
        memcpy(data + 4096, &bad, 8);
        struct ring_rec rec;
        struct ring_body body;
        assert_int_equal(ring_next(b, &rec, &body, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "a record of"));
        /* a tensor longer than its record (the first tensor's head: its nbytes after part and dtype) */
        memcpy(data + 4096, &len, 8);
        uint64_t huge = 1u << 30;
        memcpy(data + 4096 + 48 + 8, &huge, 8);
        assert_int_equal(ring_next(b, &rec, &body, err, sizeof(err)), 1);
        struct ring_tensor t;
        assert_int_equal(ring_tensor_next(&body, &t, err, sizeof(err)), -EPROTO);
        munmap(data, 4096 + (1u << 20));
        ring_free(b);
        ring_free(g);
}

/* A writer that puts the bytes in place itself: reserve, write, publish; a reservation not published
 * leaves nothing; a close between reserve and publish refuses the publish. */
static void test_ring_reserve(void **state) {
        (void)state;
        struct ring *b, *g = pair(1u << 20, &b);
        uint64_t closed = 0;
        char err[300];
        struct ring_tensor t[2] = {{.part = 2, .dtype = 1, .nbytes = 12}, {.part = 0, .dtype = 1, .nbytes = 8}};
        void *data;
        assert_int_equal(ring_reserve(g, 2, t, 1000000, &closed, &data, err, sizeof(err)), 0);
        float *f = data;   /* float32 parts end to end, as in a push's scratch */
        for (int i = 0; i < 5; i++)
                f[i] = (float)i + 0.5f;
        assert_int_equal(ring_pending(g), 0);   /* reserved, not published */
        struct ring_rec rec = {.seq = 1, .gs = 7, .n = 2};
        assert_int_equal(ring_publish(g, &rec, &closed, err, sizeof(err)), 0);
        assert_int_equal(ring_publish(g, &rec, &closed, err, sizeof(err)), -EINVAL);   /* once */
        struct ring_rec got;
        struct ring_body body;
        struct ring_tensor rt;
        assert_int_equal(ring_next(b, &got, &body, err, sizeof(err)), 1);
        assert_true(got.seq == 1 && got.gs == 7 && got.n == 2);
        assert_int_equal(ring_tensor_next(&body, &rt, err, sizeof(err)), 0);
        assert_true(rt.part == 2 && rt.nbytes == 12 && ((const float *)rt.data)[2] == 2.5f);
        assert_int_equal(ring_tensor_next(&body, &rt, err, sizeof(err)), 0);
        assert_true(rt.part == 0 && rt.nbytes == 8 && ((const float *)rt.data)[1] == 4.5f);
        ring_consumed(b, 1);
        /* reserved and dropped (a push whose check failed), then the next one in its place */
        assert_int_equal(ring_reserve(g, 2, t, 1000000, &closed, &data, err, sizeof(err)), 0);
        assert_int_equal(ring_reserve(g, 2, t, 1000000, &closed, &data, err, sizeof(err)), 0);
        memset(data, 0, 20);
        rec.seq = 2;
        assert_int_equal(ring_publish(g, &rec, &closed, err, sizeof(err)), 0);
        assert_int_equal(ring_next(b, &got, &body, err, sizeof(err)), 1);
        assert_int_equal(got.seq, 2);
        ring_consumed(b, 2);
        assert_int_equal(ring_next(b, &got, &body, err, sizeof(err)), 0);
        /* closed between the two steps */
        assert_int_equal(ring_reserve(g, 2, t, 1000000, &closed, &data, err, sizeof(err)), 0);
        ring_close(b, 5);
        rec.seq = 3;
        assert_int_equal(ring_publish(g, &rec, &closed, err, sizeof(err)), -ESTALE);
        assert_int_equal(closed, 5);
        assert_int_equal(ring_next(b, &got, &body, err, sizeof(err)), 0);
        ring_free(b);
        ring_free(g);
}

struct sleeper {
        struct ring *b;
        uint64_t ms, bytes, slept_us;
};

static void *sleep_main(void *arg) {
        struct sleeper *z = arg;
        uint64_t t0 = mono_us();
        ring_wait(z->b, z->ms, z->bytes);
        z->slept_us = mono_us() - t0;
        return NULL;
}

/* The backup sleeps until enough is published: one record wakes a backup that asked for one at once,
 * not one that asked for a quarter of the ring (it sleeps its time out); one pending returns at once. */
static void test_ring_wait(void **state) {
        (void)state;
        struct ring *b, *g = pair(1u << 20, &b);
        uint64_t closed;
        struct sleeper z = {.b = b, .ms = 10000, .bytes = 1};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, sleep_main, &z), 0);
        usleep(50000);
        assert_int_equal(put(g, 1, 1000, 1000000, &closed), 0);
        pthread_join(t, NULL);
        assert_true(z.slept_us < 5000000);
        z = (struct sleeper){.b = b, .ms = 300, .bytes = ring_data_size(b) / 4};
        assert_int_equal(pthread_create(&t, NULL, sleep_main, &z), 0);
        usleep(20000);
        assert_int_equal(put(g, 2, 1000, 1000000, &closed), 0);
        pthread_join(t, NULL);
        assert_true(z.slept_us >= 250000);
        uint64_t t0 = mono_us();
        ring_wait(b, 10000, 1);   /* two records pending already */
        assert_true(mono_us() - t0 < 5000000);
        take(b, 1, 1000);
        take(b, 2, 1000);
        ring_free(b);
        ring_free(g);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_ring_wait),
        cmocka_unit_test(test_ring_reserve),
        cmocka_unit_test(test_ring_order),
        cmocka_unit_test(test_ring_close),
        cmocka_unit_test(test_ring_full),
        cmocka_unit_test(test_ring_hostile))
