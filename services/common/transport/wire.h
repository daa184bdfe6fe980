/* Tensors on the wire without copying their payload.
 *
 * Every message of the API that carries tensors has the same shape: field 1 is a small header message
 * (packed and unpacked by protobuf-c), field 2 is `repeated Tensor`. The bytes stay standard protobuf,
 * so clients in other languages read them as usual; only we avoid the copies: a sender lends tensor
 * memory to gRPC as slices, a receiver walks the received slices and copies each tensor's bytes once,
 * straight into its destination.
 *
 * Not thread-safe per object; distinct objects may be used from distinct threads. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <grpc/byte_buffer.h>
#include <protobuf-c/protobuf-c.h>

#define WIRE_MAX_DIMS 8
#define WIRE_FIELD_HEADER 1
#define WIRE_FIELD_TENSORS 2

/* INT8_BLOCKS and TOPK are compressed float32 (rpc.compression), for pushes' gradients only. Both cut a
 * tensor's values (row-major) into blocks of WIRE_BLOCK, the last one shorter:
 *   INT8_BLOCKS: per block a float32 scale (max|x| / 127, finite, >= 0), then its values as int8 q,
 *                x = q * scale (q in -127..127): wire_int8_size(n) bytes in all;
 *   TOPK:        per block a uint16 count c (<= the block's length), then c entries, each a uint8 index
 *                into the block (strictly increasing) and a float32 value; the values not sent are 0.
 *   INT8_DELTA:  as INT8_BLOCKS, the change to add to the values the receiver holds (only in a Push's
 *                answer: wire_int8_delta_encode).
 * All fields little-endian. */
enum wire_dtype {
        WIRE_DTYPE_FLOAT32 = 1, WIRE_DTYPE_INT64 = 2, WIRE_DTYPE_BFLOAT16 = 3, WIRE_DTYPE_INT8_BLOCKS = 4,
        WIRE_DTYPE_TOPK = 5, WIRE_DTYPE_INT8_DELTA = 6,
};
#define WIRE_BLOCK 256
#define WIRE_TOPK_ENTRY 5   /* bytes of one TOPK entry: index, value */

/* Size in bytes of one element; 0 for an unknown dtype, and for the compressed ones (no fixed size). */
size_t wire_dtype_size(uint32_t dtype);
/* The dtypes that read as float32 (wire_reader_read_f32): FLOAT32, BFLOAT16, INT8_BLOCKS, TOPK. */
bool wire_dtype_is_f32(uint32_t dtype);

/* ---- sending ---- */

/* An outgoing message under construction: a list of slices. */
struct wire_out;

int wire_out_new(struct wire_out **ret);
struct wire_out *wire_out_free(struct wire_out *o);

/* Packs `header` as field 1. Copies (headers are small). */
int wire_out_header(struct wire_out *o, const ProtobufCMessage *header);

/* Appends one Tensor as field 2. `data` (nbytes) is lent, not copied: it must stay unchanged until
 * `release(release_ud)` runs, which may happen on a gRPC thread, after the call has finished.
 * `release` may be NULL when the memory outlives the message for certain. */
int wire_out_tensor(struct wire_out *o, const char *name, uint32_t dtype, const uint64_t *shape,
                    unsigned ndims, uint64_t row_offset, const void *data, size_t nbytes,
                    void (*release)(void *), void *release_ud);

/* n float32 values as a tensor of `dtype`: FLOAT32 lends them as wire_out_tensor does; BFLOAT16
 * converts them (round to nearest even) into the message, and releases at once. -EINVAL for another
 * dtype (released too). */
int wire_out_tensor_f32(struct wire_out *o, const char *name, uint32_t dtype, const uint64_t *shape,
                        unsigned ndims, uint64_t row_offset, const float *data, size_t n,
                        void (*release)(void *), void *release_ud);

/* Same, but copies the data into the message. */
int wire_out_tensor_copy(struct wire_out *o, const char *name, uint32_t dtype, const uint64_t *shape,
                         unsigned ndims, uint64_t row_offset, const void *data, size_t nbytes);

/* Builds the byte buffer (caller owns it) and empties `o`. */
int wire_out_finish(struct wire_out *o, grpc_byte_buffer **ret);

/* A whole protobuf-c message without tensors, packed into a new byte buffer (caller owns it). */
grpc_byte_buffer *wire_pack(const ProtobufCMessage *m);

/* ---- receiving ---- */

struct wire_seg {
        const uint8_t *p;
        size_t n;
};

/* One received tensor: its metadata, and where its bytes lie in the received slices (possibly split
 * across several, never aligned for certain). Valid as long as the wire_in it came from. */
struct wire_tensor {
        char *name;             /* never NULL: "" when the message has none */
        uint32_t dtype;
        unsigned ndims;
        uint64_t shape[WIRE_MAX_DIMS];
        uint64_t row_offset;
        uint64_t elements;      /* product of shape */
        size_t nbytes;          /* bytes of data actually present */
        struct wire_seg *segs;
        size_t n_segs;
};

struct wire_in {
        grpc_byte_buffer *bb;   /* owned */
        uint8_t *header;        /* gathered header bytes (field 1), owned */
        size_t header_len;
        struct wire_tensor *tensors;
        size_t n_tensors;
        /* private */
        void *reader;
        struct wire_seg *slices;
        size_t n_slices;
};

/* Parses a message of the header+tensors shape. Takes ownership of `bb` in all cases.
 * Returns -EBADMSG with a reason in err for malformed input (truncated varint, bad wire type,
 * tensor data size not matching dtype and shape, too many dimensions). */
int wire_in_parse(grpc_byte_buffer *bb, struct wire_in **ret, char *err, size_t errlen);
struct wire_in *wire_in_free(struct wire_in *in);

/* Unpacks the header (NULL + -EBADMSG if it does not parse). A missing header unpacks as an empty
 * message. Free with protobuf_c_message_free_unpacked(m, NULL). */
int wire_in_header(const struct wire_in *in, const ProtobufCMessageDescriptor *d, ProtobufCMessage **ret);

/* A tensor's dtype, shape and bytes checked as wire_in_parse checks each it parses (a compressed one's
 * payload walked whole), and its elements set: for tensors from elsewhere than a message (the ring of
 * a backup on the same host). 0 or -EBADMSG with the reason in err. */
int wire_tensor_check(struct wire_tensor *t, char *err, size_t errlen);

/* Copies the tensor's bytes into dst (nbytes of room). */
void wire_tensor_copy(const struct wire_tensor *t, void *dst);

/* Reads a tensor's bytes a piece at a time, e.g. through a small buffer that stays in cache, so a
 * consumer (the optimizer) reads gradients without a full-size copy. */
struct wire_reader {
        const struct wire_tensor *t;
        size_t seg, off;
        /* a compressed tensor read as float32: its current block, decoded */
        uint64_t done;            /* elements decoded so far */
        uint32_t blk_len, blk_pos;
        float blk[WIRE_BLOCK];
};
void wire_reader_init(struct wire_reader *r, const struct wire_tensor *t);
/* Copies the next n bytes (the caller keeps within nbytes) into dst. */
void wire_reader_read(struct wire_reader *r, void *dst, size_t n);

/* A FLOAT32, BFLOAT16, INT8_BLOCKS or TOPK tensor read as float32 (bfloat16 widened exactly, the
 * compressed ones decoded; wire_in_parse has checked their structure): the next n elements, or all of
 * them into dst (t->elements floats of room). Any other dtype is copied as it is. */
void wire_reader_read_f32(struct wire_reader *r, float *dst, size_t n);
void wire_tensor_copy_f32(const struct wire_tensor *t, float *dst);

/* A received tensor named "<var>" or "<var>/<slot>" at rows [row_offset, row_offset + shape[0]) is
 * checked against the job's layout (job.h) and copied into params (or slots[s]; NULL: checked only);
 * an INT8_DELTA is added to them.
 * -EINVAL with a message naming the tensor for any mismatch. */
struct job_layout;
int wire_tensor_copy_in(const struct wire_tensor *t, const struct job_layout *L, float *params, float *const *slots,
                        char *err, size_t errlen);

/* bfloat16 <-> float32 for n values: to bfloat16 rounds to nearest, ties to even (NaN stays NaN, a
 * value past bfloat16's largest becomes Inf); from bfloat16 is exact. */
void wire_bf16_from_f32(uint16_t *dst, const float *src, size_t n);
void wire_bf16_to_f32(float *dst, const uint16_t *src, size_t n);

/* ---- the compressed encodings (pure: no allocation; trusted input for the decoders) ---- */

/* Bytes of n values as INT8_BLOCKS. */
size_t wire_int8_size(size_t n);
/* n values as INT8_BLOCKS into dst (wire_int8_size(n) bytes). A block holding NaN or Inf gets a NaN
 * scale and zeros, so that a receiver refuses it as it refuses a non-finite float32 gradient. */
void wire_int8_encode(uint8_t *dst, const float *src, size_t n);
void wire_int8_decode(float *dst, const uint8_t *src, size_t n);
/* The change from *copy to v as INT8_DELTA into dst (wire_int8_size(n) bytes), and *copy moved by what
 * the receiver will add: wire_f32_add of the decoded change, as wire_tensor_copy_in adds it. So while
 * *copy starts equal to the receiver's values, it stays equal to the bit, and what the int8 dropped
 * goes out with the next change. */
void wire_int8_delta_encode(uint8_t *dst, const float *v, float *copy, size_t n);
/* dst += y, value by value (the one addition both ends of an INT8_DELTA make). */
void wire_f32_add(float *dst, const float *y, size_t n);

/* Most bytes of n values as TOPK with at most k entries per block. */
size_t wire_topk_max_size(size_t n, unsigned k);
/* The k largest-magnitude values of each block (all of a block shorter than k; ties: the lower index;
 * NaN and Inf count as largest, so a receiver sees and refuses them) as TOPK into dst
 * (wire_topk_max_size(n, k) bytes of room). Returns the bytes written. k >= 1. */
size_t wire_topk_encode(uint8_t *dst, const float *src, size_t n, unsigned k);
/* Decodes n values; returns the bytes read. */
size_t wire_topk_decode(float *dst, const uint8_t *src, size_t n);

/* Unpacks a whole message without tensors from a byte buffer (not taken). */
int wire_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d, ProtobufCMessage **ret);
