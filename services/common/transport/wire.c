/* Tensors on the wire without copying their payload: see wire.h. */
#include "wire.h"
#include "wire-internal.h"
#include "job.h"
#include "optim_slots.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define WIRE_SMALL_COPY 1024   /* tensors below this are copied: a slice of their own costs more */
#define WIRE_MAX_NAME 1024

size_t wire_dtype_size(uint32_t dtype) {
        switch (dtype) {
        case WIRE_DTYPE_FLOAT32: return 4;
        case WIRE_DTYPE_INT64: return 8;
        case WIRE_DTYPE_BFLOAT16: return 2;
        default: return 0;
        }
}

bool wire_dtype_is_f32(uint32_t dtype) {
        return dtype == WIRE_DTYPE_FLOAT32 || dtype == WIRE_DTYPE_BFLOAT16 || dtype == WIRE_DTYPE_INT8_BLOCKS ||
               dtype == WIRE_DTYPE_TOPK;
}

/* ---- varints ---- */

static size_t put_varint(uint8_t *p, uint64_t v) {
        size_t n = 0;
        while (v >= 0x80) {
                p[n++] = (uint8_t)(v | 0x80);
                v >>= 7;
        }
        p[n++] = (uint8_t)v;
        return n;
}

static size_t varint_len(uint64_t v) {
        size_t n = 1;
        while (v >= 0x80) {
                v >>= 7;
                n++;
        }
        return n;
}

/* ---- sending ---- */

struct wire_out {
        grpc_slice *slices;
        size_t n, cap;
};

int wire_out_new(struct wire_out **ret) {
        struct wire_out *o = calloc(1, sizeof(*o));
        if (!o)
                return -ENOMEM;
        *ret = o;
        return 0;
}

static void out_clear(struct wire_out *o) {
        for (size_t i = 0; i < o->n; i++)
                grpc_slice_unref(o->slices[i]);
        o->n = 0;
}

struct wire_out *wire_out_free(struct wire_out *o) {
        if (!o)
                return NULL;
        out_clear(o);
        free(o->slices);
        free(o);
        return NULL;
}

static int out_push(struct wire_out *o, grpc_slice s) {
        if (o->n == o->cap) {
                size_t cap = o->cap ? o->cap * 2 : 8;
                grpc_slice *n = realloc(o->slices, cap * sizeof(*n));
                if (!n) {
                        grpc_slice_unref(s);
                        return -ENOMEM;
                }
                o->slices = n;
                o->cap = cap;
        }
        o->slices[o->n++] = s;
        return 0;
}

int wire_out_header(struct wire_out *o, const ProtobufCMessage *header) {
        size_t len = protobuf_c_message_get_packed_size(header);
        grpc_slice s = grpc_slice_malloc(len + 11);
        uint8_t *p = GRPC_SLICE_START_PTR(s);
        size_t n = put_varint(p, (WIRE_FIELD_HEADER << 3) | 2);
        n += put_varint(p + n, len);
        n += protobuf_c_message_pack(header, p + n);
        s = grpc_slice_sub_no_ref(s, 0, n);
        return out_push(o, s);
}

/* Writes the Tensor's field-2 tag, its length, and every field but the data's bytes. */
static size_t tensor_prefix(uint8_t *p, const char *name, size_t name_len, uint32_t dtype,
                            const uint64_t *shape, unsigned ndims, uint64_t row_offset, size_t nbytes) {
        size_t shape_len = 0;
        for (unsigned i = 0; i < ndims; i++)
                shape_len += varint_len(shape[i]);
        size_t inner = 1 + varint_len(name_len) + name_len + 1 + varint_len(dtype) +
                       (ndims ? 1 + varint_len(shape_len) + shape_len : 0) +
                       (row_offset ? 1 + varint_len(row_offset) : 0) + 1 + varint_len(nbytes) + nbytes;
        size_t n = put_varint(p, (WIRE_FIELD_TENSORS << 3) | 2);
        n += put_varint(p + n, inner);
        p[n++] = (1 << 3) | 2;
        n += put_varint(p + n, name_len);
        memcpy(p + n, name, name_len);
        n += name_len;
        p[n++] = (2 << 3) | 0;
        n += put_varint(p + n, dtype);
        if (ndims) {
                p[n++] = (3 << 3) | 2;
                n += put_varint(p + n, shape_len);
                for (unsigned i = 0; i < ndims; i++)
                        n += put_varint(p + n, shape[i]);
        }
        if (row_offset) {
                p[n++] = (4 << 3) | 0;
                n += put_varint(p + n, row_offset);
        }
        p[n++] = (5 << 3) | 2;
        n += put_varint(p + n, nbytes);
        return n;
}


/* How a tensor's data gets into the message: lent as it is, copied, or converted from float32 to
 * bfloat16 (nbytes: the bfloat16 bytes). */
enum out_mode { OUT_LEND, OUT_COPY, OUT_BF16 };

static int out_tensor(struct wire_out *o, const char *name, uint32_t dtype, const uint64_t *shape,
                      unsigned ndims, uint64_t row_offset, const void *data, size_t nbytes,
                      enum out_mode mode, void (*release)(void *), void *release_ud) {
        size_t name_len = strlen(name);
        if (ndims > WIRE_MAX_DIMS || name_len > WIRE_MAX_NAME)
                return -EINVAL;
        if (nbytes < WIRE_SMALL_COPY && mode == OUT_LEND)
                mode = OUT_COPY;
        bool copy = mode != OUT_LEND;
        size_t max = 2 * 10 + 1 + 10 + name_len + 1 + 10 + 1 + 10 + ndims * 10 + 1 + 10 + 1 + 10;
        grpc_slice s = grpc_slice_malloc(max + (copy ? nbytes : 0));
        uint8_t *p = GRPC_SLICE_START_PTR(s);
        size_t n = tensor_prefix(p, name, name_len, dtype, shape, ndims, row_offset, nbytes);
        if (mode == OUT_BF16)
                wire_bf16_pack(p + n, data, nbytes / 2);
        else if (copy && nbytes)
                memcpy(p + n, data, nbytes);
        if (copy)
                n += nbytes;
        int r = out_push(o, grpc_slice_sub_no_ref(s, 0, n));
        if (r < 0 || copy) {
                if (release)
                        release(release_ud);
                return r;
        }
        grpc_slice d = release ? grpc_slice_new_with_user_data((void *)data, nbytes, release, release_ud)
                               : grpc_slice_from_static_buffer(data, nbytes);
        return out_push(o, d);
}

int wire_out_tensor(struct wire_out *o, const char *name, uint32_t dtype, const uint64_t *shape,
                    unsigned ndims, uint64_t row_offset, const void *data, size_t nbytes,
                    void (*release)(void *), void *release_ud) {
        return out_tensor(o, name, dtype, shape, ndims, row_offset, data, nbytes, OUT_LEND, release, release_ud);
}

int wire_out_tensor_f32(struct wire_out *o, const char *name, uint32_t dtype, const uint64_t *shape,
                        unsigned ndims, uint64_t row_offset, const float *data, size_t n,
                        void (*release)(void *), void *release_ud) {
        if (dtype == WIRE_DTYPE_FLOAT32)
                return out_tensor(o, name, dtype, shape, ndims, row_offset, data, n * sizeof(float), OUT_LEND,
                                  release, release_ud);
        if (dtype != WIRE_DTYPE_BFLOAT16) {
                if (release)
                        release(release_ud);
                return -EINVAL;
        }
        return out_tensor(o, name, dtype, shape, ndims, row_offset, data, n * sizeof(uint16_t), OUT_BF16, release,
                          release_ud);
}

int wire_out_tensor_copy(struct wire_out *o, const char *name, uint32_t dtype, const uint64_t *shape,
                         unsigned ndims, uint64_t row_offset, const void *data, size_t nbytes) {
        return out_tensor(o, name, dtype, shape, ndims, row_offset, data, nbytes, OUT_COPY, NULL, NULL);
}

int wire_out_finish(struct wire_out *o, grpc_byte_buffer **ret) {
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(o->slices, o->n);
        if (!bb)
                return -ENOMEM;
        out_clear(o);
        *ret = bb;
        return 0;
}

grpc_byte_buffer *wire_pack(const ProtobufCMessage *m) {
        size_t len = protobuf_c_message_get_packed_size(m);
        grpc_slice s = grpc_slice_malloc(len);
        protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        return bb;
}

/* ---- receiving ---- */

/* A cursor over the received slices. */
struct cur {
        const struct wire_seg *segs;
        size_t n_segs, i, off;
        size_t pos;             /* bytes consumed from the start */
};

static bool cur_byte(struct cur *c, uint8_t *b) {
        while (c->i < c->n_segs && c->off == c->segs[c->i].n) {
                c->i++;
                c->off = 0;
        }
        if (c->i == c->n_segs)
                return false;
        *b = c->segs[c->i].p[c->off++];
        c->pos++;
        return true;
}

static bool cur_varint(struct cur *c, uint64_t *v) {
        uint64_t x = 0;
        for (unsigned shift = 0; shift < 64; shift += 7) {
                uint8_t b;
                if (!cur_byte(c, &b))
                        return false;
                x |= (uint64_t)(b & 0x7f) << shift;
                if (!(b & 0x80)) {
                        *v = x;
                        return true;
                }
        }
        return false;
}

/* Consumes n bytes; if out != NULL, records the pieces they lie in (appending to *out). */
static int cur_take(struct cur *c, size_t n, struct wire_seg **out, size_t *n_out) {
        while (n > 0) {
                while (c->i < c->n_segs && c->off == c->segs[c->i].n) {
                        c->i++;
                        c->off = 0;
                }
                if (c->i == c->n_segs)
                        return -EBADMSG;
                size_t k = c->segs[c->i].n - c->off;
                if (k > n)
                        k = n;
                if (out) {
                        size_t m = *n_out;
                        if ((m & (m - 1)) == 0) { /* grow at powers of two */
                                struct wire_seg *g = realloc(*out, (m ? 2 * m : 1) * sizeof(*g));
                                if (!g)
                                        return -ENOMEM;
                                *out = g;
                        }
                        (*out)[m] = (struct wire_seg){c->segs[c->i].p + c->off, k};
                        *n_out = m + 1;
                }
                c->off += k;
                c->pos += k;
                n -= k;
        }
        return 0;
}

static int cur_gather(struct cur *c, size_t n, uint8_t *dst) {
        struct wire_seg *g = NULL;
        size_t ng = 0, at = 0;
        int r = cur_take(c, n, &g, &ng);
        if (r == 0)
                for (size_t i = 0; i < ng; i++) {
                        memcpy(dst + at, g[i].p, g[i].n);
                        at += g[i].n;
                }
        free(g);
        return r;
}

static int cur_skip(struct cur *c, unsigned wt) {
        uint64_t v;
        switch (wt) {
        case 0: return cur_varint(c, &v) ? 0 : -EBADMSG;
        case 1: return cur_take(c, 8, NULL, NULL);
        case 2: return cur_varint(c, &v) ? cur_take(c, v, NULL, NULL) : -EBADMSG;
        case 5: return cur_take(c, 4, NULL, NULL);
        default: return -EBADMSG;
        }
}

static int fail(char *err, size_t errlen, const char *fmt, ...) {
        if (err && errlen) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(err, errlen, fmt, ap);
                va_end(ap);
        }
        return -EBADMSG;
}

static void reader_skip(struct wire_reader *r, size_t n) {
        while (n > 0 && r->seg < r->t->n_segs) {
                size_t k = r->t->segs[r->seg].n - r->off < n ? r->t->segs[r->seg].n - r->off : n;
                n -= k;
                r->off += k;
                if (r->off == r->t->segs[r->seg].n) {
                        r->seg++;
                        r->off = 0;
                }
        }
}

/* A compressed tensor's payload walked whole before anyone decodes it: its length to the byte, every
 * scale finite and >= 0, every count within its block and every index in range and increasing — so the
 * readers (wire_reader_read_f32) trust it. el: the elements its shape says. */
static int check_packed(const struct wire_tensor *t, uint64_t el, const char *nm, char *err, size_t errlen) {
        struct wire_reader rd;
        uint64_t blocks = el / WIRE_BLOCK + (el % WIRE_BLOCK != 0);
        wire_reader_init(&rd, t);
        if (t->dtype == WIRE_DTYPE_INT8_BLOCKS || t->dtype == WIRE_DTYPE_INT8_DELTA) {
                if (el > SIZE_MAX / 2 || wire_int8_size(el) != t->nbytes)
                        return fail(err, errlen, "tensor \"%s\": %zu data bytes do not match shape (%llu elements "
                                    "as int8 blocks: %zu bytes)", nm, t->nbytes, (unsigned long long)el,
                                    el > SIZE_MAX / 2 ? SIZE_MAX : wire_int8_size(el));
                for (uint64_t b = 0; b < blocks; b++) {
                        uint8_t sc[4];
                        uint64_t len = el - b * WIRE_BLOCK < WIRE_BLOCK ? el - b * WIRE_BLOCK : WIRE_BLOCK;
                        wire_reader_read(&rd, sc, 4);
                        float f = get_f32(sc);
                        /* within max|x| / 127 of any finite x: every value it decodes to is finite */
                        if (!isfinite(f * 128.0f) || f < 0)
                                return fail(err, errlen, "tensor \"%s\": block %llu's int8 scale is %s", nm,
                                            (unsigned long long)b, isfinite(f * 128.0f) ? "negative" : !isfinite(f) ?
                                            "not finite" : "too large (its values would overflow)");
                        reader_skip(&rd, len);
                }
                return 0;
        }
        /* TOPK: each block takes 2 bytes at least, which bounds a shape that a short payload claims */
        if (blocks > t->nbytes / 2 + 1)
                return fail(err, errlen, "tensor \"%s\": %zu data bytes cannot hold %llu top-k blocks", nm, t->nbytes,
                            (unsigned long long)blocks);
        size_t at = 0;
        for (uint64_t b = 0; b < blocks; b++) {
                uint64_t len = el - b * WIRE_BLOCK < WIRE_BLOCK ? el - b * WIRE_BLOCK : WIRE_BLOCK;
                uint8_t h[2], e[WIRE_TOPK_ENTRY];
                if (t->nbytes - at < 2)
                        return fail(err, errlen, "tensor \"%s\": top-k data ends in block %llu", nm, (unsigned long long)b);
                wire_reader_read(&rd, h, 2);
                at += 2;
                uint32_t c = get_u16(h);
                if (c > len)
                        return fail(err, errlen, "tensor \"%s\": block %llu has %u top-k entries for %llu values", nm,
                                    (unsigned long long)b, c, (unsigned long long)len);
                if ((t->nbytes - at) / WIRE_TOPK_ENTRY < c)
                        return fail(err, errlen, "tensor \"%s\": top-k data ends in block %llu", nm, (unsigned long long)b);
                int prev = -1;
                for (uint32_t i = 0; i < c; i++) {
                        wire_reader_read(&rd, e, WIRE_TOPK_ENTRY);
                        if (e[0] >= len || (int)e[0] <= prev)
                                return fail(err, errlen, "tensor \"%s\": block %llu: top-k index %u out of range or "
                                            "out of order", nm, (unsigned long long)b, e[0]);
                        prev = e[0];
                }
                at += (size_t)c * WIRE_TOPK_ENTRY;
        }
        if (at != t->nbytes)
                return fail(err, errlen, "tensor \"%s\": %zu bytes after the last top-k block", nm, t->nbytes - at);
        return 0;
}

int wire_tensor_check(struct wire_tensor *t, char *err, size_t errlen) {
        const char *nm = t->name ? t->name : "";
        bool packed = t->dtype == WIRE_DTYPE_INT8_BLOCKS || t->dtype == WIRE_DTYPE_TOPK ||
                      t->dtype == WIRE_DTYPE_INT8_DELTA;
        size_t es = wire_dtype_size(t->dtype);
        if (!es && !packed)
                return fail(err, errlen, "tensor \"%s\": unknown dtype %u", nm, t->dtype);
        uint64_t el = 1;
        for (unsigned i = 0; i < t->ndims; i++) {
                if (t->shape[i] && el > UINT64_MAX / t->shape[i])
                        return fail(err, errlen, "tensor \"%s\": shape overflows", nm);
                el *= t->shape[i];
        }
        if (packed) {
                int r = check_packed(t, el, nm, err, errlen);
                if (r < 0)
                        return r;
        } else if (el > SIZE_MAX / es || el * es != t->nbytes)
                return fail(err, errlen, "tensor \"%s\": %zu data bytes do not match shape (%llu elements of %zu bytes)",
                            nm, t->nbytes, (unsigned long long)el, es);
        t->elements = el;
        return 0;
}

static int parse_tensor(struct cur *c, size_t end, struct wire_tensor *t, char *err, size_t errlen) {
        while (c->pos < end) {
                uint64_t tag, v, len;
                if (!cur_varint(c, &tag))
                        return fail(err, errlen, "tensor: truncated field tag at byte %zu", c->pos);
                unsigned field = (unsigned)(tag >> 3), wt = tag & 7;
                if (field == 1 && wt == 2) {
                        if (!cur_varint(c, &len) || len > WIRE_MAX_NAME || c->pos + len > end)
                                return fail(err, errlen, "tensor: bad name length at byte %zu", c->pos);
                        char *name = malloc(len + 1);
                        if (!name)
                                return -ENOMEM;
                        if (cur_gather(c, len, (uint8_t *)name) < 0) {
                                free(name);
                                return fail(err, errlen, "tensor: truncated name");
                        }
                        name[len] = 0;
                        free(t->name);
                        t->name = name;
                } else if (field == 2 && wt == 0) {
                        if (!cur_varint(c, &v))
                                return fail(err, errlen, "tensor: truncated dtype");
                        t->dtype = (uint32_t)v;
                } else if (field == 3 && wt == 2) {
                        if (!cur_varint(c, &len) || c->pos + len > end)
                                return fail(err, errlen, "tensor: bad shape length at byte %zu", c->pos);
                        size_t stop = c->pos + len;
                        while (c->pos < stop) {
                                if (t->ndims == WIRE_MAX_DIMS)
                                        return fail(err, errlen, "tensor \"%s\": more than %d dimensions",
                                                    t->name ? t->name : "", WIRE_MAX_DIMS);
                                if (!cur_varint(c, &t->shape[t->ndims++]))
                                        return fail(err, errlen, "tensor: truncated shape");
                        }
                        if (c->pos != stop)
                                return fail(err, errlen, "tensor: shape overruns its field");
                } else if (field == 3 && wt == 0) {
                        if (t->ndims == WIRE_MAX_DIMS)
                                return fail(err, errlen, "tensor \"%s\": more than %d dimensions",
                                            t->name ? t->name : "", WIRE_MAX_DIMS);
                        if (!cur_varint(c, &t->shape[t->ndims++]))
                                return fail(err, errlen, "tensor: truncated shape");
                } else if (field == 4 && wt == 0) {
                        if (!cur_varint(c, &t->row_offset))
                                return fail(err, errlen, "tensor: truncated row_offset");
                } else if (field == 5 && wt == 2) {
                        if (!cur_varint(c, &len) || c->pos + len > end)
                                return fail(err, errlen, "tensor: data length overruns the message at byte %zu",
                                            c->pos);
                        free(t->segs);
                        t->segs = NULL;
                        t->n_segs = 0;
                        int r = cur_take(c, len, &t->segs, &t->n_segs);
                        if (r < 0)
                                return r == -ENOMEM ? r : fail(err, errlen, "tensor: truncated data");
                        t->nbytes = len;
                } else {
                        int r = cur_skip(c, wt);
                        if (r < 0)
                                return fail(err, errlen, "tensor: bad field %u (wire type %u)", field, wt);
                }
        }
        if (c->pos != end)
                return fail(err, errlen, "tensor: fields overrun the tensor's length");
        int r = wire_tensor_check(t, err, errlen);
        if (r < 0)
                return r;
        if (!t->name && !(t->name = strdup("")))   /* no name field: proto3's empty string, never NULL */
                return -ENOMEM;
        return 0;
}

static void tensor_clear(struct wire_tensor *t) {
        free(t->name);
        free(t->segs);
}

struct wire_in *wire_in_free(struct wire_in *in) {
        if (!in)
                return NULL;
        for (size_t i = 0; i < in->n_tensors; i++)
                tensor_clear(&in->tensors[i]);
        free(in->tensors);
        free(in->header);
        free(in->slices);
        if (in->reader) {
                grpc_byte_buffer_reader_destroy(in->reader);
                free(in->reader);
        }
        if (in->bb)
                grpc_byte_buffer_destroy(in->bb);
        free(in);
        return NULL;
}

int wire_in_parse(grpc_byte_buffer *bb, struct wire_in **ret, char *err, size_t errlen) {
        int r = -ENOMEM;
        struct wire_in *in = calloc(1, sizeof(*in));
        if (!in) {
                if (bb)
                        grpc_byte_buffer_destroy(bb);
                return -ENOMEM;
        }
        in->bb = bb;
        if (!bb)
                goto done;      /* an empty message */
        in->reader = malloc(sizeof(grpc_byte_buffer_reader));
        if (!in->reader)
                goto fail;
        if (!grpc_byte_buffer_reader_init(in->reader, bb)) {
                free(in->reader);
                in->reader = NULL;
                r = fail(err, errlen, "cannot read the message (decompression failed)");
                goto fail;
        }
        grpc_slice *s;
        size_t cap = 0;
        while (grpc_byte_buffer_reader_peek(in->reader, &s)) {
                if ((r = grow_array((void **)&in->slices, &cap, in->n_slices + 1, sizeof(*in->slices), 16)) < 0)
                        goto fail;
                in->slices[in->n_slices++] = (struct wire_seg){GRPC_SLICE_START_PTR(*s), GRPC_SLICE_LENGTH(*s)};
        }

        struct cur c = {.segs = in->slices, .n_segs = in->n_slices};
        size_t total = 0, tcap = 0;
        for (size_t i = 0; i < in->n_slices; i++)
                total += in->slices[i].n;
        for (;;) {
                uint64_t tag, len;
                uint8_t b;
                if (!cur_byte(&c, &b))
                        break;
                /* re-read the tag as a varint from that byte */
                tag = b & 0x7f;
                if (b & 0x80) {
                        uint64_t rest;
                        if (!cur_varint(&c, &rest)) {
                                r = fail(err, errlen, "truncated field tag at byte %zu", c.pos);
                                goto fail;
                        }
                        tag |= rest << 7;
                }
                unsigned field = (unsigned)(tag >> 3), wt = tag & 7;
                if (field == WIRE_FIELD_HEADER && wt == 2) {
                        if (!cur_varint(&c, &len) || len > (64u << 20)) {
                                r = fail(err, errlen, "bad header length at byte %zu", c.pos);
                                goto fail;
                        }
                        uint8_t *h = realloc(in->header, in->header_len + len + 1);
                        if (!h)
                                goto fail;
                        in->header = h;
                        if (cur_gather(&c, len, h + in->header_len) < 0) {
                                r = fail(err, errlen, "truncated header");
                                goto fail;
                        }
                        in->header_len += len;
                } else if (field == WIRE_FIELD_TENSORS && wt == 2) {
                        if (!cur_varint(&c, &len)) {
                                r = fail(err, errlen, "truncated tensor length at byte %zu", c.pos);
                                goto fail;
                        }
                        if (len > total - c.pos) {
                                r = fail(err, errlen, "tensor %zu: length %llu overruns the message (%zu bytes left)",
                                         in->n_tensors, (unsigned long long)len, total - c.pos);
                                goto fail;
                        }
                        if ((r = grow_array((void **)&in->tensors, &tcap, in->n_tensors + 1, sizeof(*in->tensors), 8)) < 0)
                                goto fail;
                        struct wire_tensor *t = &in->tensors[in->n_tensors++];
                        memset(t, 0, sizeof(*t));
                        r = parse_tensor(&c, c.pos + len, t, err, errlen);
                        if (r < 0) {
                                if (r == -EBADMSG && err && errlen) {
                                        char tmp[512];
                                        snprintf(tmp, sizeof(tmp), "tensor %zu: %s", in->n_tensors - 1, err);
                                        snprintf(err, errlen, "%s", tmp);
                                }
                                goto fail;
                        }
                } else {
                        r = cur_skip(&c, wt);
                        if (r < 0) {
                                r = fail(err, errlen, "bad field %u (wire type %u) at byte %zu", field, wt, c.pos);
                                goto fail;
                        }
                }
        }
done:
        *ret = in;
        return 0;
fail:
        if (r == -ENOMEM && err && errlen)
                snprintf(err, errlen, "out of memory");
        wire_in_free(in);
        return r;
}

int wire_in_header(const struct wire_in *in, const ProtobufCMessageDescriptor *d, ProtobufCMessage **ret) {
        static const uint8_t empty;
        ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, in->header_len,
                                                        in->header ? in->header : &empty);
        if (!m)
                return -EBADMSG;
        *ret = m;
        return 0;
}

/* The next block of a compressed tensor decoded into out (r->blk: kept as the current block; else
 * taken whole by the caller); returns its length. */
static uint32_t reader_next_block(struct wire_reader *r, float *out) {
        const struct wire_tensor *t = r->t;
        uint64_t left = t->elements - r->done;
        uint32_t len = left < WIRE_BLOCK ? (uint32_t)left : WIRE_BLOCK;
        uint8_t buf[2 + WIRE_BLOCK * WIRE_TOPK_ENTRY];
        if (t->dtype == WIRE_DTYPE_INT8_BLOCKS || t->dtype == WIRE_DTYPE_INT8_DELTA) {
                wire_reader_read(r, buf, 4 + len);
                wire_int8_decode(out, buf, len);
        } else {
                wire_reader_read(r, buf, 2);
                uint32_t c = get_u16(buf);
                c = c < len ? c : len;   /* wire_in_parse has checked it; stay in the buffer regardless */
                wire_reader_read(r, buf + 2, (size_t)c * WIRE_TOPK_ENTRY);
                buf[0] = (uint8_t)c;
                buf[1] = (uint8_t)(c >> 8);
                wire_topk_decode(out, buf, len);
        }
        r->blk_len = out == r->blk ? len : 0;
        r->blk_pos = 0;
        r->done += len;
        return len;
}

static void read_packed(struct wire_reader *r, float *dst, size_t n) {
        while (n > 0) {
                if (r->blk_pos == r->blk_len) {
                        if (r->done >= r->t->elements) {
                                memset(dst, 0, n * sizeof(float));   /* past the end: the caller's bug */
                                return;
                        }
                        /* a whole block wanted: decoded where it goes */
                        uint64_t left = r->t->elements - r->done;
                        if (n >= WIRE_BLOCK || n >= left) {
                                uint32_t len = reader_next_block(r, dst);
                                dst += len;
                                n -= len;
                                continue;
                        }
                        reader_next_block(r, r->blk);
                }
                size_t k = r->blk_len - r->blk_pos < n ? r->blk_len - r->blk_pos : n;
                memcpy(dst, r->blk + r->blk_pos, k * sizeof(float));
                r->blk_pos += (uint32_t)k;
                dst += k;
                n -= k;
        }
}

void wire_reader_read_f32(struct wire_reader *r, float *dst, size_t n) {
        if (r->t->dtype == WIRE_DTYPE_INT8_BLOCKS || r->t->dtype == WIRE_DTYPE_TOPK ||
            r->t->dtype == WIRE_DTYPE_INT8_DELTA) {
                read_packed(r, dst, n);
                return;
        }
        if (r->t->dtype != WIRE_DTYPE_BFLOAT16) {
                wire_reader_read(r, dst, n * sizeof(float));
                return;
        }
        uint16_t buf[2048];   /* a tensor's bytes may be split anywhere between slices: through a buffer */
        while (n > 0) {
                size_t k = n < 2048 ? n : 2048;
                wire_reader_read(r, buf, k * sizeof(uint16_t));
                wire_bf16_to_f32(dst, buf, k);
                dst += k;
                n -= k;
        }
}

void wire_tensor_copy_f32(const struct wire_tensor *t, float *dst) {
        if (t->dtype != WIRE_DTYPE_BFLOAT16 && t->dtype != WIRE_DTYPE_INT8_BLOCKS && t->dtype != WIRE_DTYPE_TOPK &&
            t->dtype != WIRE_DTYPE_INT8_DELTA) {
                wire_tensor_copy(t, dst);
                return;
        }
        struct wire_reader rd;
        wire_reader_init(&rd, t);
        wire_reader_read_f32(&rd, dst, t->elements);
}

void wire_tensor_copy(const struct wire_tensor *t, void *dst) {
        uint8_t *p = dst;
        for (size_t i = 0; i < t->n_segs; i++) {
                memcpy(p, t->segs[i].p, t->segs[i].n);
                p += t->segs[i].n;
        }
}

int wire_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d, ProtobufCMessage **ret) {
        static const uint8_t empty;
        ProtobufCMessage *m;
        if (!bb) {
                m = protobuf_c_message_unpack(d, NULL, 0, &empty);
        } else {
                grpc_byte_buffer_reader rd;
                if (!grpc_byte_buffer_reader_init(&rd, bb))
                        return -EBADMSG;
                grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
                grpc_byte_buffer_reader_destroy(&rd);
                m = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
                grpc_slice_unref(all);
        }
        if (!m)
                return -EBADMSG;
        *ret = m;
        return 0;
}

void wire_reader_init(struct wire_reader *r, const struct wire_tensor *t) {
        r->t = t;   /* blk needs no clearing: blk_len 0 says it is empty */
        r->seg = r->off = 0;
        r->done = 0;
        r->blk_len = r->blk_pos = 0;
}

void wire_reader_read(struct wire_reader *r, void *dst, size_t n) {
        uint8_t *p = dst;
        while (n > 0 && r->seg < r->t->n_segs) {
                const struct wire_seg *g = &r->t->segs[r->seg];
                size_t k = g->n - r->off < n ? g->n - r->off : n;
                memcpy(p, g->p + r->off, k);
                p += k;
                n -= k;
                r->off += k;
                if (r->off == g->n) {
                        r->seg++;
                        r->off = 0;
                }
        }
}

/* ---- into a job's variables ---- */

int wire_tensor_copy_in(const struct wire_tensor *t, const struct job_layout *L, float *params, float *const *slots,
                        char *err, size_t errlen) {
        char name[256];
        snprintf(name, sizeof(name), "%s", t->name ? t->name : "");
        int slot = -1;
        int v = job_layout_find(L, name);
        if (v < 0) {
                char *sl = strrchr(name, '/');
                if (sl) {
                        *sl = 0;
                        v = job_layout_find(L, name);
                        for (unsigned s = 0; v >= 0 && s < L->n_slots; s++)
                                if (strcmp(sl + 1, optim_slot_name(L->optimizer, s)) == 0)
                                        slot = (int)s;
                        if (v >= 0 && slot < 0)
                                return errf(err, errlen, -EINVAL, "tensor \"%s\": no slot \"%s\" for optimizer %s",
                                            t->name, sl + 1, optim_name(L->optimizer));
                }
        }
        if (v < 0)
                return errf(err, errlen, -EINVAL, "tensor \"%s\": no such variable", t->name ? t->name : "");
        const struct job_var *jv = &L->vars[v];
        if (t->dtype != WIRE_DTYPE_FLOAT32 && t->dtype != WIRE_DTYPE_BFLOAT16 &&
            (t->dtype != WIRE_DTYPE_INT8_DELTA || slot >= 0))
                return errf(err, errlen, -EINVAL, "tensor \"%s\": dtype %u, expected float32 or bfloat16%s", t->name,
                            t->dtype, slot < 0 ? " or int8 changes" : "");
        if (t->ndims != 2 || t->shape[1] != jv->cols || t->row_offset >= jv->rows ||
            t->shape[0] > jv->rows - t->row_offset || t->shape[0] == 0)
                return errf(err, errlen, -EINVAL,
                            "tensor \"%s\": shape (%llu, %llu) at row %llu does not fit variable (%u, %u)", t->name,
                            (unsigned long long)(t->ndims > 0 ? t->shape[0] : 0),
                            (unsigned long long)(t->ndims > 1 ? t->shape[1] : 0), (unsigned long long)t->row_offset,
                            jv->rows, jv->cols);
        float *block = slot < 0 ? params : (slots ? slots[slot] : NULL);
        if (!block)
                return 0;   /* slots not wanted */
        float *dst = block + jv->offset + t->row_offset * jv->cols;
        if (t->dtype != WIRE_DTYPE_INT8_DELTA) {
                wire_tensor_copy_f32(t, dst);
                return 0;
        }
        struct wire_reader rd;
        float y[WIRE_BLOCK];
        wire_reader_init(&rd, t);
        for (size_t at = 0; at < t->elements; at += WIRE_BLOCK) {
                size_t k = t->elements - at < WIRE_BLOCK ? t->elements - at : WIRE_BLOCK;
                wire_reader_read_f32(&rd, y, k);
                wire_f32_add(dst + at, y, k);
        }
        return 0;
}
