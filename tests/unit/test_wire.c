/* Tensor encoding: our zero-copy writer and slice-walking reader against protobuf-c's own packer. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>

#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"

static size_t flatten(grpc_byte_buffer *bb, uint8_t **ret) {
        grpc_byte_buffer_reader r;
        grpc_byte_buffer_reader_init(&r, bb);
        grpc_slice all = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
        size_t n = GRPC_SLICE_LENGTH(all);
        *ret = malloc(n + 1);
        memcpy(*ret, GRPC_SLICE_START_PTR(all), n);
        grpc_slice_unref(all);
        return n;
}

/* A byte buffer whose slices are `chunk` bytes each: varints and tensors straddle slice boundaries. */
static grpc_byte_buffer *chopped(const uint8_t *p, size_t n, size_t chunk) {
        size_t k = (n + chunk - 1) / chunk;
        grpc_slice *s = calloc(k ? k : 1, sizeof(*s));
        for (size_t i = 0; i < k; i++) {
                size_t len = (i + 1) * chunk <= n ? chunk : n - i * chunk;
                s[i] = grpc_slice_from_copied_buffer((const char *)p + i * chunk, len);
        }
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, k);
        for (size_t i = 0; i < k; i++)
                grpc_slice_unref(s[i]);
        free(s);
        return bb;
}

static int released;
static void release_cb(void *ud) {
        (void)ud;
        released++;
}

static grpc_byte_buffer *build_push(const float *w, size_t nw, const float *b, size_t nb) {
        Psfleet__V1__PushHeader h = PSFLEET__V1__PUSH_HEADER__INIT;
        h.worker = 3;
        h.local_step = 123456789012ull;
        struct wire_out *o;
        grpc_byte_buffer *bb;
        assert_int_equal(wire_out_new(&o), 0);
        assert_int_equal(wire_out_header(o, &h.base), 0);
        uint64_t sw[2] = {nw / 4, 4}, sb[1] = {nb};
        assert_int_equal(wire_out_tensor(o, "dense0/kernel", WIRE_DTYPE_FLOAT32, sw, 2, 300, w, nw * 4, release_cb, NULL), 0);
        assert_int_equal(wire_out_tensor(o, "dense0/bias", WIRE_DTYPE_FLOAT32, sb, 1, 0, b, nb * 4, release_cb, NULL), 0);
        assert_int_equal(wire_out_finish(o, &bb), 0);
        wire_out_free(o);
        return bb;
}

static void test_roundtrip_and_protobuf_c_reads_it(void **state) {
        (void)state;
        size_t nw = 4096, nb = 5;
        float *w = malloc(nw * 4), b[5] = {1, -2, 3.5f, 0, 1e-30f};
        for (size_t i = 0; i < nw; i++)
                w[i] = (float)i * 0.25f - 7;
        released = 0;
        grpc_byte_buffer *bb = build_push(w, nw, b, nb);

        /* protobuf-c, the reference decoder, reads what we wrote */
        uint8_t *flat;
        size_t n = flatten(bb, &flat);
        Psfleet__V1__PushRequest *pr = psfleet__v1__push_request__unpack(NULL, n, flat);
        assert_non_null(pr);
        assert_int_equal(pr->header->worker, 3);
        assert_true(pr->header->local_step == 123456789012ull);
        assert_int_equal(pr->n_grads, 2);
        assert_string_equal(pr->grads[0]->name, "dense0/kernel");
        assert_int_equal(pr->grads[0]->dtype, PSFLEET__V1__DTYPE__DTYPE_FLOAT32);
        assert_int_equal(pr->grads[0]->n_shape, 2);
        assert_int_equal(pr->grads[0]->shape[0], nw / 4);
        assert_int_equal(pr->grads[0]->row_offset, 300);
        assert_int_equal(pr->grads[0]->data.len, nw * 4);
        assert_memory_equal(pr->grads[0]->data.data, w, nw * 4);
        assert_memory_equal(pr->grads[1]->data.data, b, sizeof(b));
        psfleet__v1__push_request__free_unpacked(pr, NULL);

        /* and we read it back, over slices of every awkward size */
        size_t chunks[] = {1, 3, 7, 64, 4096, 1 << 20};
        for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
                struct wire_in *in;
                char err[256];
                assert_int_equal(wire_in_parse(chopped(flat, n, chunks[c]), &in, err, sizeof(err)), 0);
                assert_int_equal(in->n_tensors, 2);
                ProtobufCMessage *hm;
                assert_int_equal(wire_in_header(in, &psfleet__v1__push_header__descriptor, &hm), 0);
                assert_int_equal(((Psfleet__V1__PushHeader *)hm)->worker, 3);
                protobuf_c_message_free_unpacked(hm, NULL);
                struct wire_tensor *t = &in->tensors[0];
                assert_string_equal(t->name, "dense0/kernel");
                assert_int_equal(t->ndims, 2);
                assert_int_equal(t->shape[1], 4);
                assert_int_equal(t->row_offset, 300);
                assert_int_equal(t->elements, nw);
                float *back = malloc(nw * 4);
                wire_tensor_copy(t, back);
                assert_memory_equal(back, w, nw * 4);
                free(back);
                float bb5[5];
                wire_tensor_copy(&in->tensors[1], bb5);
                assert_memory_equal(bb5, b, sizeof(b));
                wire_in_free(in);
        }
        grpc_byte_buffer_destroy(bb);
        assert_int_equal(released, 2);   /* the lent kernel and the copied bias both released */
        free(flat);
        free(w);
}

static void test_we_read_protobuf_c(void **state) {
        (void)state;
        /* protobuf-c packs (unpacked or packed shapes alike); our reader must agree */
        Psfleet__V1__Tensor t = PSFLEET__V1__TENSOR__INIT;
        float v[6] = {1, 2, 3, 4, 5, 6};
        uint64_t shape[2] = {2, 3};
        t.name = "x";
        t.dtype = PSFLEET__V1__DTYPE__DTYPE_FLOAT32;
        t.n_shape = 2;
        t.shape = shape;
        t.data.len = sizeof(v);
        t.data.data = (uint8_t *)v;
        Psfleet__V1__Tensor *ts[1] = {&t};
        Psfleet__V1__PullReplyHeader h = PSFLEET__V1__PULL_REPLY_HEADER__INIT;
        h.global_step = 42;
        Psfleet__V1__PullReply pr = PSFLEET__V1__PULL_REPLY__INIT;
        pr.header = &h;
        pr.n_tensors = 1;
        pr.tensors = ts;
        size_t n = psfleet__v1__pull_reply__get_packed_size(&pr);
        uint8_t *buf = malloc(n);
        psfleet__v1__pull_reply__pack(&pr, buf);
        struct wire_in *in;
        assert_int_equal(wire_in_parse(chopped(buf, n, 5), &in, NULL, 0), 0);
        assert_int_equal(in->n_tensors, 1);
        assert_int_equal(in->tensors[0].elements, 6);
        float back[6];
        wire_tensor_copy(&in->tensors[0], back);
        assert_memory_equal(back, v, sizeof(v));
        ProtobufCMessage *hm;
        assert_int_equal(wire_in_header(in, &psfleet__v1__pull_reply_header__descriptor, &hm), 0);
        assert_int_equal(((Psfleet__V1__PullReplyHeader *)hm)->global_step, 42);
        protobuf_c_message_free_unpacked(hm, NULL);
        wire_in_free(in);
        free(buf);
}

static void expect_error(const uint8_t *p, size_t n, const char *want) {
        struct wire_in *in = NULL;
        char err[256] = "";
        grpc_slice s = grpc_slice_from_copied_buffer((const char *)p, n);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        assert_int_equal(wire_in_parse(bb, &in, err, sizeof(err)), -EBADMSG);
        assert_null(in);
        assert_string_equal(err, want);
}

static void test_malformed(void **state) {
        (void)state;
        /* data length 8 but shape says 3 floats */
        const uint8_t mismatch[] = {0x12, 0x12, 0x0a, 0x01, 'w', 0x10, 0x01, 0x1a, 0x01, 0x03, 0x2a, 0x08,
                                    0, 0, 0, 0, 0, 0, 0, 0};
        expect_error(mismatch, sizeof(mismatch),
                     "tensor 0: tensor \"w\": 8 data bytes do not match shape (3 elements of 4 bytes)");
        /* unknown dtype 9 */
        const uint8_t dtype[] = {0x12, 0x05, 0x0a, 0x01, 'w', 0x10, 0x09};
        expect_error(dtype, sizeof(dtype), "tensor 0: tensor \"w\": unknown dtype 9");
        /* tensor length beyond the message */
        const uint8_t overrun[] = {0x12, 0x7f, 0x0a, 0x01, 'w'};
        expect_error(overrun, sizeof(overrun), "tensor 0: length 127 overruns the message (3 bytes left)");
        /* a group wire type (3) at top level */
        const uint8_t group[] = {0x1b};
        expect_error(group, sizeof(group), "bad field 3 (wire type 3) at byte 1");
        /* truncated varint tag */
        const uint8_t trunc[] = {0x80};
        expect_error(trunc, sizeof(trunc), "truncated field tag at byte 1");
        /* nine dimensions */
        const uint8_t dims[] = {0x12, 0x0f, 0x10, 0x01, 0x1a, 0x09, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0x2a, 0x00};
        expect_error(dims, sizeof(dims), "tensor 0: tensor \"\": more than 8 dimensions");
}

static void test_truncation_everywhere(void **state) {
        (void)state;
        float w[64], b[2] = {1, 2};
        for (int i = 0; i < 64; i++)
                w[i] = (float)i;
        grpc_byte_buffer *bb = build_push(w, 64, b, 2);
        uint8_t *flat;
        size_t n = flatten(bb, &flat);
        grpc_byte_buffer_destroy(bb);
        /* every strict prefix either fails cleanly or parses (a prefix can end at a field boundary) */
        for (size_t k = 0; k < n; k++) {
                struct wire_in *in = NULL;
                char err[256];
                int r = wire_in_parse(chopped(flat, k, 3), &in, err, sizeof(err));
                assert_true(r == 0 || r == -EBADMSG);
                wire_in_free(in);
        }
        free(flat);
}

static void test_unknown_fields_skipped(void **state) {
        (void)state;
        /* field 9 varint, field 10 fixed64, field 11 bytes: skipped; then an empty header */
        const uint8_t p[] = {0x48, 0x05, 0x51, 1, 2, 3, 4, 5, 6, 7, 8, 0x5a, 0x02, 'h', 'i', 0x0a, 0x00};
        struct wire_in *in;
        grpc_slice s = grpc_slice_from_copied_buffer((const char *)p, sizeof(p));
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        assert_int_equal(wire_in_parse(bb, &in, NULL, 0), 0);
        assert_int_equal(in->n_tensors, 0);
        wire_in_free(in);
        /* a tensor without a name field (dtype float32, shape [0], no data): its name is "", not NULL */
        const uint8_t nameless[] = {0x12, 0x05, 0x10, 0x01, 0x1a, 0x01, 0x00};
        s = grpc_slice_from_copied_buffer((const char *)nameless, sizeof(nameless));
        bb = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        assert_int_equal(wire_in_parse(bb, &in, NULL, 0), 0);
        assert_int_equal(in->n_tensors, 1);
        assert_non_null(in->tensors[0].name);
        assert_string_equal(in->tensors[0].name, "");
        wire_in_free(in);
        /* an absent message is an empty one */
        assert_int_equal(wire_in_parse(NULL, &in, NULL, 0), 0);
        ProtobufCMessage *hm;
        assert_int_equal(wire_in_header(in, &psfleet__v1__push_header__descriptor, &hm), 0);
        protobuf_c_message_free_unpacked(hm, NULL);
        wire_in_free(in);
}

static void test_reader_in_pieces(void **state) {
        (void)state;
        float w[1000], b[2] = {1, 2};
        for (int i = 0; i < 1000; i++)
                w[i] = (float)i * 0.5f;
        grpc_byte_buffer *bb = build_push(w, 1000, b, 2);
        uint8_t *flat;
        size_t n = flatten(bb, &flat);
        grpc_byte_buffer_destroy(bb);
        /* slices of 13 bytes: floats straddle them; read in pieces of 7 floats */
        struct wire_in *in;
        assert_int_equal(wire_in_parse(chopped(flat, n, 13), &in, NULL, 0), 0);
        struct wire_reader rd;
        wire_reader_init(&rd, &in->tensors[0]);
        float got[1000];
        for (size_t at = 0; at < 1000; at += 7)
                wire_reader_read(&rd, got + at, (1000 - at < 7 ? 1000 - at : 7) * sizeof(float));
        assert_memory_equal(got, w, sizeof(w));
        wire_in_free(in);
        free(flat);
}

static void test_dtype_size(void **state) {
        (void)state;
        assert_int_equal(wire_dtype_size(WIRE_DTYPE_FLOAT32), 4);
        assert_int_equal(wire_dtype_size(WIRE_DTYPE_INT64), 8);
        assert_int_equal(wire_dtype_size(0), 0);
        assert_int_equal(wire_dtype_size(77), 0);
}

/* A float and its bits (type punning through a union is defined in C). */
union fbits {
        float f;
        uint32_t u;
};
#define f_of(bits) ((union fbits){.u = (bits)}.f)
#define u_of(x) ((union fbits){.f = (x)}.u)

/* float32 -> bfloat16: nearest, ties to even; NaN stays NaN; exact values and the widening are exact. */
static void test_bf16_rounding(void **state) {
        (void)state;
        const struct {
                uint32_t in;
                uint16_t out;
        } cases[] = {
                {0x3f800000u, 0x3f80},   /* 1.0: exact */
                {0x3f808000u, 0x3f80},   /* 1 + 2^-8: a tie, to the even 0x3f80 */
                {0x3f818000u, 0x3f82},   /* a tie, to the even 0x3f82 */
                {0x3f808001u, 0x3f81},   /* just over the tie: up */
                {0x3f807fffu, 0x3f80},   /* just under: down */
                {0xbf808001u, 0xbf81},   /* negative: away from zero on magnitude */
                {0x7f800000u, 0x7f80},   /* +Inf */
                {0xff800000u, 0xff80},   /* -Inf */
                {0x7f7fffffu, 0x7f80},   /* FLT_MAX rounds past bfloat16's largest: Inf */
                {0x00000001u, 0x0000},   /* the smallest denormal: to zero */
                {0x80000000u, 0x8000},   /* -0 */
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                float in = f_of(cases[i].in), back;
                uint16_t h;
                wire_bf16_from_f32(&h, &in, 1);
                assert_int_equal(h, cases[i].out);
                wire_bf16_to_f32(&back, &h, 1);
                assert_int_equal(u_of(back), (uint32_t)cases[i].out << 16);
        }
        /* NaN (quiet and signalling, whose payload is only in the low half) stays NaN */
        const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu};
        for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
                float in = f_of(nans[i]), back;
                uint16_t h;
                wire_bf16_from_f32(&h, &in, 1);
                wire_bf16_to_f32(&back, &h, 1);
                assert_true(back != back);
        }
        /* relative error within 2^-8 over a range of magnitudes */
        for (int e = -30; e <= 30; e++)
                for (int k = 0; k < 100; k++) {
                        float x = ldexpf(1.0f + (float)k / 97.0f, e), y;
                        uint16_t h;
                        wire_bf16_from_f32(&h, &x, 1);
                        wire_bf16_to_f32(&y, &h, 1);
                        assert_true(fabsf(y - x) <= ldexpf(fabsf(x), -8));
                }
}

/* A message of one tensor (flat, len bytes) read back over slices of many sizes: its dtype, data bytes
 * and row offset, and as float32 want (n values), copied whole and read `piece` values at a time. */
static void reads_as(const uint8_t *flat, size_t len, uint32_t dtype, size_t nbytes, uint64_t row_offset,
                     const float *want, size_t n, size_t piece) {
        float *got = malloc((n + 1) * sizeof(float));
        for (size_t chunk = 1; chunk <= len; chunk = chunk * 3 + 1) {
                struct wire_in *in;
                char err[256];
                assert_int_equal(wire_in_parse(chopped(flat, len, chunk), &in, err, sizeof(err)), 0);
                assert_int_equal(in->n_tensors, 1);
                assert_int_equal(in->tensors[0].dtype, dtype);
                assert_int_equal(in->tensors[0].nbytes, nbytes);
                assert_int_equal(in->tensors[0].row_offset, row_offset);
                assert_int_equal(in->tensors[0].elements, n);
                memset(got, 0, n * sizeof(float));
                wire_tensor_copy_f32(&in->tensors[0], got);
                assert_memory_equal(got, want, n * sizeof(float));
                struct wire_reader rd;
                wire_reader_init(&rd, &in->tensors[0]);
                memset(got, 0, n * sizeof(float));
                for (size_t at = 0; at < n; at += piece)
                        wire_reader_read_f32(&rd, got + at, n - at < piece ? n - at : piece);
                assert_memory_equal(got, want, n * sizeof(float));
                wire_in_free(in);
        }
        free(got);
}

/* A bfloat16 tensor: half the bytes on the wire, read back widened whatever the slices' boundaries, and
 * what is lent is released at once (the message holds the converted copy). */
static void test_bf16_tensor_roundtrip(void **state) {
        (void)state;
        size_t n = 5001;   /* odd: the last element alone */
        float *w = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
                w[i] = sinf((float)i * 0.37f) * 3.0f + (float)i * 1e-3f;
        wire_bf16_from_f32((uint16_t *)got, w, 0);   /* n = 0: nothing */
        for (size_t i = 0; i < n; i++) {
                uint16_t h;
                wire_bf16_from_f32(&h, &w[i], 1);
                wire_bf16_to_f32(&want[i], &h, 1);
        }
        struct wire_out *o;
        grpc_byte_buffer *bb;
        uint64_t shape[2] = {n, 1};
        released = 0;
        assert_int_equal(wire_out_new(&o), 0);
        assert_int_equal(wire_out_tensor_f32(o, "v", WIRE_DTYPE_BFLOAT16, shape, 2, 7, w, n, release_cb, NULL), 0);
        assert_int_equal(released, 1);
        assert_int_equal(wire_out_tensor_f32(o, "v", WIRE_DTYPE_INT64, shape, 2, 7, w, n, release_cb, NULL), -EINVAL);
        assert_int_equal(released, 2);
        assert_int_equal(wire_out_finish(o, &bb), 0);
        wire_out_free(o);
        uint8_t *flat;
        size_t len = flatten(bb, &flat);
        grpc_byte_buffer_destroy(bb);
        reads_as(flat, len, WIRE_DTYPE_BFLOAT16, n * 2, 7, want, n, 777);
        /* a float32 tensor through the same functions: lent, not released, read as it is */
        assert_int_equal(wire_out_new(&o), 0);
        released = 0;
        assert_int_equal(wire_out_tensor_f32(o, "v", WIRE_DTYPE_FLOAT32, shape, 2, 0, w, n, release_cb, NULL), 0);
        assert_int_equal(released, 0);
        assert_int_equal(wire_out_finish(o, &bb), 0);
        wire_out_free(o);
        struct wire_in *in;
        char err[256];
        assert_int_equal(wire_in_parse(bb, &in, err, sizeof(err)), 0);
        wire_tensor_copy_f32(&in->tensors[0], got);
        assert_memory_equal(got, w, n * sizeof(float));
        wire_in_free(in);
        assert_int_equal(released, 1);   /* gRPC let go of the lent slice with the message */
        free(flat), free(w), free(got), free(want);
}

/* One tensor of `dtype` with these raw data bytes, parsed: wire_in_parse's result, err its reason. */
static int parse_raw(uint32_t dtype, uint64_t rows, uint64_t cols, const uint8_t *data, size_t nbytes,
                     struct wire_in **in_ret, char *err, size_t errlen) {
        struct wire_out *o;
        grpc_byte_buffer *bb;
        uint64_t shape[2] = {rows, cols};
        assert_int_equal(wire_out_new(&o), 0);
        assert_int_equal(wire_out_tensor_copy(o, "v", dtype, shape, 2, 0, data, nbytes), 0);
        assert_int_equal(wire_out_finish(o, &bb), 0);
        wire_out_free(o);
        struct wire_in *in = NULL;
        err[0] = 0;
        int r = wire_in_parse(bb, &in, err, errlen);
        if (in_ret)
                *in_ret = in;
        else
                wire_in_free(in);
        return r;
}

static float scale_of(const uint8_t *block) {
        float f;
        memcpy(&f, block, 4);
        return f;
}

/* int8 blocks: the size, each value within half its block's scale, zeros exact, and the same floats
 * whether decoded whole, through a message read in pieces or copied, whatever the slices. */
static void test_int8_roundtrip(void **state) {
        (void)state;
        size_t n = 1000;   /* 3 full blocks and one of 232 */
        float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
                x[i] = i < 256 ? 0 : sinf((float)i * 0.77f) * (i < 512 ? 1e-6f : 40.0f) + (i % 17 == 0 ? 3.0f : 0);
        assert_int_equal(wire_int8_size(n), n + 4 * 4);
        assert_int_equal(wire_int8_size(0), 0);
        assert_int_equal(wire_int8_size(256), 260);
        uint8_t *enc = malloc(wire_int8_size(n));
        wire_int8_encode(enc, x, n);
        wire_int8_decode(y, enc, n);
        for (size_t b = 0; b < 4; b++) {
                float sc = scale_of(enc + b * 260), max = 0;
                for (size_t i = b * 256; i < n && i < (b + 1) * 256; i++)
                        max = fabsf(x[i]) > max ? fabsf(x[i]) : max;
                assert_true(fabsf(sc - max / 127) <= 1e-6f * max);
                for (size_t i = b * 256; i < n && i < (b + 1) * 256; i++)
                        assert_true(fabsf(x[i] - y[i]) <= sc / 2 * (1 + 1e-5f) + 1e-30f);
        }
        for (size_t i = 0; i < 256; i++)
                assert_true(y[i] == 0);
        /* through a message: the same floats as decoded whole */
        struct wire_in *in;
        char err[256];
        assert_int_equal(parse_raw(WIRE_DTYPE_INT8_BLOCKS, n / 8, 8, enc, wire_int8_size(n), &in, err, sizeof(err)), 0);
        uint8_t *flat;
        size_t len = flatten(in->bb, &flat);
        wire_in_free(in);
        reads_as(flat, len, WIRE_DTYPE_INT8_BLOCKS, wire_int8_size(n), 0, y, n, 97);
        /* a block with a NaN or Inf: a NaN scale, which a receiver refuses */
        x[300] = NAN;
        x[700] = -INFINITY;
        wire_int8_encode(enc, x, n);
        assert_true(isnan(scale_of(enc + 260)) && isnan(scale_of(enc + 520)) && !isnan(scale_of(enc + 780)));
        assert_int_equal(parse_raw(WIRE_DTYPE_INT8_BLOCKS, n / 8, 8, enc, wire_int8_size(n), NULL, err, sizeof(err)),
                         -EBADMSG);
        assert_non_null(strstr(err, "block 1's int8 scale is not finite"));
        free(flat), free(enc), free(x), free(y);
}

/* top-k: per block the k largest magnitudes, ties to the lower index, indices increasing, zeros for
 * the rest; a short block sends what it has; NaN and Inf are taken first. */
static void test_topk_selection(void **state) {
        (void)state;
        size_t n = 256 + 3;
        float x[256 + 3] = {0}, y[256 + 3];
        x[10] = -5, x[200] = 4, x[3] = 4, x[4] = -4, x[255] = 1;   /* block 0: -5, then three 4s for two places */
        x[256] = 0.5f, x[257] = -0.25f, x[258] = 0;                  /* block 1: 3 values, k = 2 */
        uint8_t enc[600];
        assert_int_equal(wire_topk_max_size(n, 2), 2 * (2 + 2 * 5));
        assert_int_equal(wire_topk_max_size(n, 1000), 2 * 2 + 259 * 5);
        size_t m = wire_topk_encode(enc, x, n, 3);
        assert_int_equal(m, 2 + 3 * 5 + 2 + 3 * 5);
        assert_int_equal(enc[0] | enc[1] << 8, 3);
        assert_int_equal(enc[2], 3);    /* 4 at 3 */
        assert_int_equal(enc[7], 4);    /* -4 at 4 */
        assert_int_equal(enc[12], 10);  /* -5 at 10; 4 at 200 lost the tie to the lower indices */
        assert_int_equal(wire_topk_decode(y, enc, n), m);
        for (size_t i = 0; i < 256; i++)
                assert_true(y[i] == (i == 3 || i == 4 || i == 10 ? x[i] : 0));
        for (size_t i = 256; i < n; i++)
                assert_true(y[i] == x[i]);   /* the short block: all three (0 among them) */
        m = wire_topk_encode(enc, x, n, 1);
        assert_int_equal(m, 2 + 5 + 2 + 5);
        wire_topk_decode(y, enc, n);
        assert_true(y[10] == -5 && y[256] == 0.5f && y[3] == 0 && y[257] == 0);
        x[100] = NAN;
        wire_topk_encode(enc, x, n, 1);
        wire_topk_decode(y, enc, n);
        assert_true(isnan(y[100]) && y[10] == 0);
        /* through a message, read in pieces */
        x[100] = 0;
        m = wire_topk_encode(enc, x, n, 2);
        wire_topk_decode(y, enc, n);
        struct wire_in *in;
        char err[256];
        assert_int_equal(parse_raw(WIRE_DTYPE_TOPK, n, 1, enc, m, &in, err, sizeof(err)), 0);
        uint8_t *flat;
        size_t len = flatten(in->bb, &flat);
        wire_in_free(in);
        reads_as(flat, len, WIRE_DTYPE_TOPK, m, 0, y, n, 5);
        free(flat);
}

/* Compressed payloads that lie: each refused by wire_in_parse with a reason, never read. */
static void test_packed_malformed(void **state) {
        (void)state;
        char err[256];
        float x[300];
        for (size_t i = 0; i < 300; i++)
                x[i] = (float)i - 150;
        uint8_t enc[2000];
        wire_int8_encode(enc, x, 300);
        size_t n8 = wire_int8_size(300);
        assert_int_equal(parse_raw(WIRE_DTYPE_INT8_BLOCKS, 300, 1, enc, n8, NULL, err, sizeof(err)), 0);
        assert_int_equal(parse_raw(WIRE_DTYPE_INT8_BLOCKS, 300, 1, enc, n8 - 1, NULL, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "do not match shape"));
        assert_int_equal(parse_raw(WIRE_DTYPE_INT8_BLOCKS, 301, 1, enc, n8, NULL, err, sizeof(err)), -EBADMSG);
        assert_int_equal(parse_raw(WIRE_DTYPE_INT8_BLOCKS, 1ull << 62, 1, enc, n8, NULL, err, sizeof(err)), -EBADMSG);
        /* and a scale whose values could overflow (127 of it past float's largest): psd's check skips
         * reading int8 blocks for finiteness, so the parse must hold every value finite */
        float bad[] = {NAN, INFINITY, -1.0f, 3e38f / 100};
        const char *why[] = {"not finite", "not finite", "negative", "too large (its values would overflow)"};
        for (size_t i = 0; i < 4; i++) {
                uint8_t copy[2000];
                memcpy(copy, enc, n8);
                memcpy(copy + 260, &bad[i], 4);   /* block 1's scale */
                assert_int_equal(parse_raw(WIRE_DTYPE_INT8_BLOCKS, 300, 1, copy, n8, NULL, err, sizeof(err)), -EBADMSG);
                assert_non_null(strstr(err, "block 1's int8 scale is"));
                assert_non_null(strstr(err, why[i]));
        }
        float ok = FLT_MAX / 128;   /* the largest an encoder sends is max|x| / 127 of a finite x */
        uint8_t copy[2000];
        memcpy(copy, enc, n8);
        memcpy(copy + 260, &ok, 4);
        assert_int_equal(parse_raw(WIRE_DTYPE_INT8_BLOCKS, 300, 1, copy, n8, NULL, err, sizeof(err)), 0);
        float big = FLT_MAX / 2;   /* and what it sends for a huge gradient (within 127/128 of float's largest
                                    * it would be refused: its -128 could overflow) */
        uint8_t one[8];
        wire_int8_encode(one, &big, 1);
        assert_int_equal(parse_raw(WIRE_DTYPE_INT8_BLOCKS, 1, 1, one, 5, NULL, err, sizeof(err)), 0);

        size_t m = wire_topk_encode(enc, x, 300, 4);   /* 2 + 20 + 2 + 20 */
        assert_int_equal(parse_raw(WIRE_DTYPE_TOPK, 300, 1, enc, m, NULL, err, sizeof(err)), 0);
        assert_int_equal(parse_raw(WIRE_DTYPE_TOPK, 300, 1, enc, m - 1, NULL, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "top-k data ends in block 1"));
        uint8_t more[2000];
        memcpy(more, enc, m);
        more[m] = 0;
        assert_int_equal(parse_raw(WIRE_DTYPE_TOPK, 300, 1, more, m + 1, NULL, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "after the last top-k block"));
        assert_int_equal(parse_raw(WIRE_DTYPE_TOPK, 1ull << 40, 1, enc, m, NULL, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "cannot hold"));
        memcpy(more, enc, m);
        more[22] = 45, more[23] = 0;   /* block 1 (44 values) claims 45 entries */
        assert_int_equal(parse_raw(WIRE_DTYPE_TOPK, 300, 1, more, m, NULL, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "45 top-k entries for 44 values"));
        memcpy(more, enc, m);
        more[24] = 44;                  /* block 1's first index past its 44 values */
        assert_int_equal(parse_raw(WIRE_DTYPE_TOPK, 300, 1, more, m, NULL, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "index 44 out of range"));
        memcpy(more, enc, m);
        more[7] = more[2];              /* block 0: the second index repeats the first */
        assert_int_equal(parse_raw(WIRE_DTYPE_TOPK, 300, 1, more, m, NULL, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "out of order"));
        assert_int_equal(parse_raw(WIRE_DTYPE_TOPK, 0, 1, enc, 0, NULL, err, sizeof(err)), 0);
        assert_int_equal(parse_raw(WIRE_DTYPE_TOPK, 0, 1, enc, 2, NULL, err, sizeof(err)), -EBADMSG);
        assert_int_equal(wire_dtype_size(WIRE_DTYPE_INT8_BLOCKS), 0);
        assert_true(wire_dtype_is_f32(WIRE_DTYPE_TOPK) && !wire_dtype_is_f32(WIRE_DTYPE_INT64));
}

int main(void) {
        grpc_init();
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_roundtrip_and_protobuf_c_reads_it),
                cmocka_unit_test(test_we_read_protobuf_c),
                cmocka_unit_test(test_malformed),
                cmocka_unit_test(test_truncation_everywhere),
                cmocka_unit_test(test_unknown_fields_skipped),
                cmocka_unit_test(test_reader_in_pieces),
                cmocka_unit_test(test_dtype_size),
                cmocka_unit_test(test_bf16_rounding),
                cmocka_unit_test(test_bf16_tensor_roundtrip),
                cmocka_unit_test(test_int8_roundtrip),
                cmocka_unit_test(test_topk_selection),
                cmocka_unit_test(test_packed_malformed),
        };
        int r = cmocka_run_group_tests(tests, NULL, NULL);
        grpc_shutdown_blocking();
        return r;
}
