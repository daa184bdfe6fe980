/* answers.c and the INT8_DELTA encoding: psd's copy of a worker's values and the worker's values, the
 * one moved by wire_int8_delta_encode, the other by what it reads off the wire, stay equal to the bit
 * over many answers; what an answer drops goes out with the next; the numbers decide change or whole. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "answers.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"

static float frand(uint64_t *s) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 - 0.5f;
}

/* The receiver's side, as ps_client takes an answer: the tensor through a message cut in slices of 7
 * bytes, parsed, and its changes added as wire_tensor_copy_in adds them. */
static void receive_delta(const uint8_t *bytes, size_t nbytes, size_t n, float *values) {
        struct wire_out *o;
        grpc_byte_buffer *bb;
        Psfleet__V1__PushReplyHeader h = PSFLEET__V1__PUSH_REPLY_HEADER__INIT;
        uint64_t shape[2] = {n, 1};
        assert_int_equal(wire_out_new(&o), 0);
        assert_int_equal(wire_out_header(o, &h.base), 0);
        assert_int_equal(wire_out_tensor(o, "w", WIRE_DTYPE_INT8_DELTA, shape, 2, 0, bytes, nbytes, NULL, NULL), 0);
        assert_int_equal(wire_out_finish(o, &bb), 0);
        wire_out_free(o);
        /* re-cut into small slices: a block's bytes split anywhere */
        size_t len = grpc_byte_buffer_length(bb);
        uint8_t *flat = malloc(len);
        grpc_byte_buffer_reader rd;
        grpc_slice sl;
        size_t at = 0;
        grpc_byte_buffer_reader_init(&rd, bb);
        while (grpc_byte_buffer_reader_next(&rd, &sl)) {
                memcpy(flat + at, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl));
                at += GRPC_SLICE_LENGTH(sl);
                grpc_slice_unref(sl);
        }
        grpc_byte_buffer_reader_destroy(&rd);
        grpc_byte_buffer_destroy(bb);
        size_t ns = (len + 6) / 7;
        grpc_slice *s = malloc(ns * sizeof(*s));
        for (size_t i = 0; i < ns; i++)
                s[i] = grpc_slice_from_copied_buffer((const char *)flat + 7 * i, len - 7 * i < 7 ? len - 7 * i : 7);
        bb = grpc_raw_byte_buffer_create(s, ns);
        for (size_t i = 0; i < ns; i++)
                grpc_slice_unref(s[i]);
        free(s);
        free(flat);
        struct wire_in *in;
        char err[256];
        assert_int_equal(wire_in_parse(bb, &in, err, sizeof(err)), 0);
        assert_int_equal(in->n_tensors, 1);
        assert_int_equal(in->tensors[0].dtype, WIRE_DTYPE_INT8_DELTA);
        struct wire_reader r;
        float y[WIRE_BLOCK];
        wire_reader_init(&r, &in->tensors[0]);
        for (size_t i = 0; i < n; i += WIRE_BLOCK) {
                size_t k = n - i < WIRE_BLOCK ? n - i : WIRE_BLOCK;
                wire_reader_read_f32(&r, y, k);
                wire_f32_add(values + i, y, k);
        }
        wire_in_free(in);
}

/* 60 answers of a part whose length is no multiple of a block: after each, the worker's values equal
 * psd's copy to the bit, and sit within a block's step (its largest change / 254) of the fresh values;
 * once the values stop changing, the next answers bring the worker to them (what was dropped is sent). */
static void test_copy_follows(void **state) {
        (void)state;
        size_t parts_n[2] = {1000, 300};
        struct psd_answers *a;
        assert_int_equal(psd_answers_new(2, 2, parts_n, &a), 0);
        size_t n = parts_n[0];
        float *v = malloc(n * sizeof(float)), *held = malloc(n * sizeof(float));
        uint8_t *buf = malloc(wire_int8_size(n));
        uint64_t rng = 7, base = 0;
        uint32_t idx = 0;
        for (size_t i = 0; i < n; i++)
                v[i] = frand(&rng);
        for (int step = 0; step < 70; step++) {
                if (step < 60)   /* an optimizer's step: small changes, now and then a large one */
                        for (size_t i = 0; i < n; i++)
                                v[i] += 0.01f * frand(&rng) + (i % 97 == (size_t)step % 97 ? 0.5f : 0);
                bool delta;
                uint64_t seq = psd_answer_begin(a, 1, &idx, 1, base, true, &delta);
                assert_true(seq != 0);
                assert_int_equal(delta, step > 0);   /* the first answer is whole */
                assert_int_equal(psd_answer_part(a, 1, 0, v, delta, seq, buf), 0);
                psd_answer_end(a, 1);
                if (delta)
                        receive_delta(buf, wire_int8_size(n), n, held);
                else
                        memcpy(held, v, n * sizeof(float));
                base = seq;
                assert_true(psd_answers_at(a, 1, &idx, 1, base));
                /* the copy psd keeps is the worker's, to the bit: the next change is from there */
                assert_memory_equal(psd_answers_copy(a, 1, 0), held, n * sizeof(float));
                assert_null(psd_answers_copy(a, 0, 0));
                double worst = 0;
                for (size_t i = 0; i < n; i++)
                        worst = fmax(worst, fabs((double)held[i] - v[i]));
                if (step >= 62)
                        assert_true(worst < 1e-6);   /* settled: what was dropped went out since */
                else
                        assert_true(worst <= 0.6 / 254 + 1e-6);
        }
        free(v);
        free(held);
        free(buf);
        psd_answers_free(a);
}

/* the number decides: 0 or another psd's or a stale one is answered whole; a worker past the cluster's
 * gets none kept */
static void test_numbers(void **state) {
        (void)state;
        size_t parts_n[3] = {10, 20, 30};
        struct psd_answers *a, *other;
        assert_int_equal(psd_answers_new(2, 3, parts_n, &a), 0);
        assert_int_equal(psd_answers_new(2, 3, parts_n, &other), 0);
        float v[30] = {1, 2, 3};
        uint8_t buf[64];
        uint32_t both[2] = {0, 2};
        bool delta;
        assert_false(psd_answers_at(a, 0, both, 2, 0));
        uint64_t s1 = psd_answer_begin(a, 0, both, 2, 0, true, &delta);
        assert_false(delta);
        assert_int_equal(psd_answer_part(a, 0, 0, v, false, s1, NULL), 0);
        assert_int_equal(psd_answer_part(a, 0, 2, v, false, s1, NULL), 0);
        psd_answer_end(a, 0);
        assert_true(psd_answers_at(a, 0, both, 2, s1));
        assert_false(psd_answers_at(a, 1, both, 2, s1));   /* another worker's copies stand nowhere */
        assert_false(psd_answers_at(a, 0, both, 2, s1 + 1));
        uint32_t one = 1;
        assert_false(psd_answers_at(a, 0, &one, 1, s1));   /* a part never answered */
        /* another psd's numbers start elsewhere: its first numbers match none of ours */
        uint64_t o1 = psd_answer_begin(other, 0, both, 2, 0, true, &delta);
        psd_answer_end(other, 0);
        assert_false(psd_answers_at(a, 0, both, 2, o1));
        /* a change planned, but one part moved on meanwhile (a retried push): whole */
        uint64_t s2 = psd_answer_begin(a, 0, &both[1], 1, s1, true, &delta);
        assert_true(delta);
        assert_int_equal(psd_answer_part(a, 0, 2, v, true, s2, buf), 0);
        psd_answer_end(a, 0);
        psd_answer_begin(a, 0, both, 2, s1, true, &delta);
        assert_false(delta);
        psd_answer_end(a, 0);
        /* asked for no change: none */
        psd_answer_begin(a, 0, &both[1], 1, s2, false, &delta);
        assert_false(delta);
        psd_answer_end(a, 0);
        assert_true(psd_answer_begin(a, 2, both, 2, s1, true, &delta) == 0);   /* no such worker */
        assert_false(delta);
        assert_false(psd_answers_at(a, 2, both, 2, s1));
        psd_answers_free(a);
        psd_answers_free(other);
}

/* a NaN in the fresh values goes out as a NaN scale, which the receiver refuses */
static void test_nan_refused(void **state) {
        (void)state;
        float v[300], copy[300];
        for (int i = 0; i < 300; i++)
                v[i] = copy[i] = (float)i;
        v[270] = NAN;
        uint8_t buf[400];
        wire_int8_delta_encode(buf, v, copy, 300);
        float sc0, sc1;
        memcpy(&sc0, buf, 4);
        memcpy(&sc1, buf + 4 + WIRE_BLOCK, 4);
        assert_true(sc0 == 0);   /* no change in the first block */
        assert_true(isnan(sc1));
}

int main(void) {
        grpc_init();
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_copy_follows),
                cmocka_unit_test(test_numbers),
                cmocka_unit_test(test_nan_refused),
        };
        int r = cmocka_run_group_tests(tests, NULL, NULL);
        grpc_shutdown();
        return r;
}
