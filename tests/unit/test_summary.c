/* TensorBoard event files: the name, the TFRecord framing (lengths and masked CRC-32C checked here the
 * way TensorFlow's record reader checks them) and the Event protos inside. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include "scratch_dir.h"

#include "crc32c.h"
#include "summary.h"
#include "util.h"
#include "tensorboard/event.pb-c.h"

static int setup(void **state) {
        (void)state;
        return scratch_dir_make("summary");
}

static uint64_t le(const uint8_t *p, int n) {
        uint64_t v = 0;
        for (int i = 0; i < n; i++)
                v |= (uint64_t)p[i] << (8 * i);
        return v;
}

/* Splits a file into its records, checking both CRCs of each; returns the events (unpacked). */
static size_t read_events(const char *path, Tensorflow__Event **ev, size_t max) {
        char *d;
        size_t len, at = 0, n = 0;
        assert_int_equal(read_file(path, 1 << 20, &d, &len), 0);
        const uint8_t *p = (const uint8_t *)d;
        while (at < len) {
                assert_true(len - at >= 16);
                uint64_t rl = le(p + at, 8);
                assert_int_equal(le(p + at + 8, 4), crc32c_mask(crc32c(p + at, 8)));
                assert_true(len - at - 16 >= rl);
                assert_int_equal(le(p + at + 12 + rl, 4), crc32c_mask(crc32c(p + at + 12, rl)));
                assert_true(n < max);
                ev[n] = tensorflow__event__unpack(NULL, rl, p + at + 12);
                assert_non_null(ev[n]);
                n++;
                at += 16 + rl;
        }
        free(d);
        return n;
}

static void test_event_file(void **state) {
        (void)state;
        struct summary_writer *w;
        uint64_t t0 = 1700000000123456ULL;
        assert_int_equal(summary_writer_new(scratch_dir, t0, "hostA", &w), 0);
        char want[sizeof(scratch_dir) + 64];
        snprintf(want, sizeof(want), "%s/events.out.tfevents.1700000000.hostA", scratch_dir);
        assert_string_equal(summary_writer_path(w), want);
        const struct summary_scalar v[] = {{"loss/worker_0", 0.5f}, {"global_step/sec", 120.25f}};
        assert_int_equal(summary_write_scalars(w, 100, t0 + 1000000, v, 2), 0);
        assert_int_equal(summary_write_session_log(w, 100, t0 + 2000000, SUMMARY_SESSION_CHECKPOINT, "/x/ckpt", NULL), 0);
        assert_int_equal(summary_flush(w), 0);

        /* a second writer in the same second gets a name of its own */
        struct summary_writer *w2;
        assert_int_equal(summary_writer_new(scratch_dir, t0, "hostA", &w2), 0);
        assert_string_not_equal(summary_writer_path(w2), summary_writer_path(w));
        assert_non_null(strstr(summary_writer_path(w2), "events.out.tfevents.1700000000.hostA."));
        summary_writer_free(w2);

        Tensorflow__Event *ev[8];
        size_t n = read_events(want, ev, 8);
        assert_int_equal(n, 3);
        assert_int_equal(ev[0]->what_case, TENSORFLOW__EVENT__WHAT_FILE_VERSION);
        assert_string_equal(ev[0]->file_version, "brain.Event:2");
        assert_true(ev[0]->wall_time > 1700000000.12 && ev[0]->wall_time < 1700000000.13);
        assert_string_equal(ev[0]->source_metadata->writer, "psfleet.chiefd");
        assert_int_equal(ev[1]->step, 100);
        assert_int_equal(ev[1]->what_case, TENSORFLOW__EVENT__WHAT_SUMMARY);
        assert_int_equal(ev[1]->summary->n_value, 2);
        assert_string_equal(ev[1]->summary->value[0]->tag, "loss/worker_0");
        assert_int_equal(ev[1]->summary->value[0]->value_case, TENSORFLOW__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
        assert_true(ev[1]->summary->value[0]->simple_value == 0.5f);
        assert_true(ev[1]->summary->value[1]->simple_value == 120.25f);
        assert_int_equal(ev[2]->what_case, TENSORFLOW__EVENT__WHAT_SESSION_LOG);
        assert_int_equal(ev[2]->session_log->status, TENSORFLOW__SESSION_LOG__SESSION_STATUS__CHECKPOINT);
        assert_string_equal(ev[2]->session_log->checkpoint_path, "/x/ckpt");
        for (size_t i = 0; i < n; i++)
                tensorflow__event__free_unpacked(ev[i], NULL);
        summary_writer_free(w);
        assert_null(summary_writer_free(NULL));
}

/* The framing of a known record, byte by byte. */
static void test_frame(void **state) {
        (void)state;
        const uint8_t data[3] = {1, 2, 3};
        uint8_t out[19];
        summary_frame(data, 3, out);
        assert_int_equal(le(out, 8), 3);
        assert_int_equal(le(out + 8, 4), crc32c_mask(crc32c(out, 8)));
        assert_memory_equal(out + 12, data, 3);
        assert_int_equal(le(out + 15, 4), crc32c_mask(crc32c(data, 3)));
}

static void test_unwritable(void **state) {
        (void)state;
        struct summary_writer *w = NULL;
        char path[sizeof(scratch_dir) + 16];
        snprintf(path, sizeof(path), "%s/file", scratch_dir);
        assert_int_equal(write_file_atomic(path, "x", 1), 0);
        snprintf(path, sizeof(path), "%s/file/sub", scratch_dir);
        assert_int_equal(summary_writer_new(path, 1, "h", &w), -ENOTDIR);
        assert_null(w);
}

UNIT_TEST_MAIN(setup, scratch_dir_remove,
        cmocka_unit_test(test_event_file),
        cmocka_unit_test(test_frame),
        cmocka_unit_test(test_unwritable))
