/* Harness: the tensor wire decoder (wire_in_parse, the header's protobuf-c unpack, the tensor reader)
 * on a message cut into gRPC slices where the input says (the first byte: slice length), so tensors
 * split across slices are read too. A parsed tensor must have the bytes its dtype and shape say; a
 * compressed one (int8 blocks, top-k) must decode the same whole or in pieces. */
#include <stdlib.h>
#include <string.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "fuzz_util.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static int init;
        if (!init++)
                grpc_init();
        if (size < 1)
                return 0;
        size_t cut = data[0] ? data[0] : size;
        data++, size--;
        grpc_slice sl[64];
        size_t n = 0;
        for (size_t at = 0; at < size && n < 64; n++) {
                size_t len = n == 63 || size - at < cut ? size - at : cut;
                sl[n] = grpc_slice_from_copied_buffer((const char *)data + at, len);
                at += len;
        }
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, n);
        for (size_t i = 0; i < n; i++)
                grpc_slice_unref(sl[i]);
        struct wire_in *in = NULL;
        char err[512];
        if (wire_in_parse(bb, &in, err, sizeof(err)) == 0) {
                ProtobufCMessage *h = NULL;
                if (wire_in_header(in, &psfleet__v1__push_header__descriptor, &h) == 0)
                        protobuf_c_message_free_unpacked(h, NULL);
                for (size_t i = 0; i < in->n_tensors; i++) {
                        const struct wire_tensor *t = &in->tensors[i];
                        size_t width = t->dtype == WIRE_DTYPE_FLOAT32 ? 4 : t->dtype == WIRE_DTYPE_INT64 ? 8 : 0;
                        FUZZ_CHECK(t->ndims <= WIRE_MAX_DIMS, "tensor %zu: %u dims", i, t->ndims);
                        if (width)
                                FUZZ_CHECK(t->nbytes == t->elements * width, "tensor %zu: %zu bytes for %llu elements",
                                           i, t->nbytes, (unsigned long long)t->elements);
                        uint8_t *dst = malloc(t->nbytes ? t->nbytes : 1);
                        wire_tensor_copy(t, dst);
                        struct wire_reader r;
                        wire_reader_init(&r, t);
                        for (size_t at = 0; at < t->nbytes; at += 7)
                                wire_reader_read(&r, dst, t->nbytes - at < 7 ? t->nbytes - at : 7);
                        free(dst);
                        /* compressed (int8 blocks, top-k): parsing checked them, so they decode, and alike
                         * whole or in pieces */
                        if (t->dtype == WIRE_DTYPE_INT8_BLOCKS || t->dtype == WIRE_DTYPE_TOPK) {
                                FUZZ_CHECK(t->elements <= (uint64_t)t->nbytes * WIRE_BLOCK, "tensor %zu: %llu elements "
                                           "from %zu bytes", i, (unsigned long long)t->elements, t->nbytes);
                                float *a = malloc((t->elements + 1) * sizeof(float)), *b = malloc((t->elements + 1) * sizeof(float));
                                wire_tensor_copy_f32(t, a);
                                wire_reader_init(&r, t);
                                for (size_t at = 0; at < t->elements; at += 7)
                                        wire_reader_read_f32(&r, b + at, t->elements - at < 7 ? t->elements - at : 7);
                                FUZZ_CHECK(memcmp(a, b, t->elements * sizeof(float)) == 0, "tensor %zu: decoded "
                                           "differently in pieces", i);
                                free(a);
                                free(b);
                        }
                }
        }
        wire_in_free(in);
        return 0;
}
