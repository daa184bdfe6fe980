/* TFRecord files of tf.train.Example for the streaming readers (records.h, data.format tfrecord): the
 * file's bytes (plain, or GZIP and ZLIB streams as tf.io.TFRecordOptions writes them, inflated here from
 * the file descriptor), the framing with both masked CRC32Cs checked, and an Example parsed by
 * protobuf-c into one record as the job's feature spec says. Memory: the reader's read buffer, one
 * input buffer for a compressed file, the record buffer (at most max_record_bytes) and an arena that
 * each Example is unpacked into and that is reused for the next. */
#include "records-internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"
#include "psfleet/tfrecord/example.pb-c.h"
#include "util.h"

#define HEADER 12               /* uint64 length, uint32 masked CRC32C of the length */
#define ARENA_FIRST (64u << 10)

struct tfr_file {
        int fd;
        enum tfr_compression comp; /* NONE, GZIP or ZLIB once open */
        z_stream zs;
        bool zinit, in_eof, stream_end, any_in;
        bool dead;              /* the framing is lost (a bad length, a truncation): no more records */
        const char *path;
        uint8_t *in;            /* (RECORDS_READ_BUF) compressed bytes */
        char why[200];
};

static uint64_t le64(const uint8_t *p)
{
        uint64_t v = 0;
        for (int i = 7; i >= 0; i--)
                v = v << 8 | p[i];
        return v;
}

static uint32_t le32(const uint8_t *p)
{
        return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static const char *comp_name(enum tfr_compression c)
{
        return c == TFR_GZIP ? "gzip" : c == TFR_ZLIB ? "zlib" : "plain";
}

/* auto: a plain file's first 12 bytes are a length and its masked CRC (a 2^-32 chance for other
 * bytes); else gzip's magic, or a zlib header (deflate, its check bits). Anything else is read as
 * plain, and its first record is then bad. */
static enum tfr_compression detect(int fd)
{
        uint8_t h[HEADER];
        ssize_t n = pread(fd, h, sizeof(h), 0);
        if (n == HEADER && crc32c_mask(crc32c(h, 8)) == le32(h + 8))
                return TFR_NONE;
        if (n >= 2 && h[0] == 0x1f && h[1] == 0x8b)
                return TFR_GZIP;
        if (n >= 2 && (h[0] & 0x0f) == 8 && (h[0] >> 4) <= 7 && ((unsigned)h[0] << 8 | h[1]) % 31 == 0)
                return TFR_ZLIB;
        return TFR_NONE;
}

int tfr_file_open(struct records_reader *r, int fd, const char *path, char *err, size_t errlen)
{
        enum tfr_compression c = r->o.tfrecord->compression;
        struct tfr_file *t = calloc(1, sizeof(*t) + (c == TFR_NONE ? 0 : RECORDS_READ_BUF)); /* and in */
        if (!t) {
                close(fd);
                return errf(err, errlen, -ENOMEM, "%s: out of memory", path);
        }
        t->fd = fd;
        t->path = path;
        t->comp = c == TFR_AUTO ? detect(fd) : c;
        t->in = (uint8_t *)(t + 1);
        if (t->comp != TFR_NONE) {
                /* 16 + 15: a gzip wrapper; 15: a zlib one */
                if (inflateInit2(&t->zs, t->comp == TFR_GZIP ? 31 : 15) != Z_OK) {
                        close(fd);
                        free(t);
                        return errf(err, errlen, -ENOMEM, "%s: out of memory", path);
                }
                t->zinit = true;
        }
        r->tf = t;
        r->eof = false;
        r->line_idx = 0;
        r->at = 0;
        r->rpos = r->rlen = 0;
        return 0;
}

void tfr_file_close(struct records_reader *r)
{
        struct tfr_file *t = r->tf;
        if (!t)
                return;
        if (t->zinit)
                inflateEnd(&t->zs);
        close(t->fd);
        free(t);   /* and its input buffer */
        r->tf = NULL;
}

int tfr_file_rewind(struct records_reader *r)
{
        struct tfr_file *t = r->tf;
        if (lseek(t->fd, 0, SEEK_SET) < 0)
                return -errno;
        if (t->zinit)
                inflateReset(&t->zs);
        t->zs.avail_in = 0;
        t->in_eof = t->stream_end = t->any_in = t->dead = false;
        r->eof = false;
        r->line_idx = 0;
        r->at = 0;
        r->rpos = r->rlen = 0;
        return 0;
}

static int read_some(struct tfr_file *t, void *buf, size_t n, char *err, size_t errlen)
{
        ssize_t k;
        do
                k = read(t->fd, buf, n);
        while (k < 0 && errno == EINTR);
        if (k < 0)
                return errf(err, errlen, -EIO, "%s: %s", t->path, strerror(errno));
        return (int)k;
}

int tfr_file_fill(struct records_reader *r, char *err, size_t errlen)
{
        struct tfr_file *t = r->tf;
        int n;
        r->rpos = r->rlen = 0;
        if (r->eof)
                return 0;
        if (t->comp == TFR_NONE) {
                if ((n = read_some(t, r->rbuf, RECORDS_READ_BUF, err, errlen)) < 0)
                        return n;
                r->eof = n == 0;
                r->rlen = (size_t)n;
                return n;
        }
        t->zs.next_out = (Bytef *)r->rbuf;
        t->zs.avail_out = RECORDS_READ_BUF;
        while (t->zs.avail_out == RECORDS_READ_BUF) {
                if (t->zs.avail_in == 0 && !t->in_eof) {
                        if ((n = read_some(t, t->in, RECORDS_READ_BUF, err, errlen)) < 0)
                                return n;
                        t->in_eof = n == 0;
                        t->any_in |= n > 0;
                        t->zs.next_in = t->in;
                        t->zs.avail_in = (uInt)n;
                }
                if (t->zs.avail_in == 0 && t->in_eof) {
                        /* an empty file is no stream and no record; a stream cut short is corrupt */
                        if (t->stream_end || !t->any_in)
                                break;
                        return errf(err, errlen, -EIO, "%s: corrupt %s stream (unexpected end of file)", t->path,
                                    comp_name(t->comp));
                }
                if (t->stream_end) { /* more bytes after a stream: another one (gzip's members) */
                        inflateReset(&t->zs);
                        t->stream_end = false;
                }
                int z = inflate(&t->zs, Z_NO_FLUSH);
                if (z == Z_STREAM_END)
                        t->stream_end = true;
                else if (z != Z_OK && z != Z_BUF_ERROR)
                        return errf(err, errlen, -EIO, "%s: corrupt %s stream (%s)", t->path, comp_name(t->comp),
                                    t->zs.msg ? t->zs.msg : "inflate failed");
        }
        r->rlen = RECORDS_READ_BUF - t->zs.avail_out;
        r->eof = r->rlen == 0;
        return (int)r->rlen;
}

/* Copies n bytes of the file to dst (NULL: skips them): the bytes got (fewer only at its end), or
 * -errno. */
static long long take(struct records_reader *r, uint8_t *dst, uint64_t n, char *err, size_t errlen)
{
        uint64_t got = 0;
        while (got < n) {
                if (r->rpos == r->rlen) {
                        int f = tfr_file_fill(r, err, errlen);
                        if (f < 0)
                                return f;
                        if (f == 0)
                                break;
                }
                size_t k = r->rlen - r->rpos;
                if (k > n - got)
                        k = (size_t)(n - got);
                if (dst)
                        memcpy(dst + got, r->rbuf + r->rpos, k);
                r->rpos += k;
                got += k;
        }
        r->at += got;
        return (long long)got;
}

/* The record is bad as framed: l says why; dead: nothing after it can be framed. */
static int bad(struct records_reader *r, struct records_line *l, bool dead)
{
        r->tf->dead |= dead;
        *l = (struct records_line){.why = r->tf->why};
        return 1;
}

int tfr_next_record(struct records_reader *r, struct records_line *l, char *err, size_t errlen)
{
        struct tfr_file *t = r->tf;
        uint8_t h[HEADER];
        if (t->dead)
                return 0;
        r->rec_at = r->at;
        long long n = take(r, h, HEADER, err, errlen);
        if (n <= 0)
                return (int)n;
        r->line_idx++;
        if (n < HEADER) {
                snprintf(t->why, sizeof(t->why), "truncated record: the file ends %lld bytes into its 12-byte header", n);
                return bad(r, l, true);
        }
        uint64_t len = le64(h);
        uint32_t want = crc32c_mask(crc32c(h, 8));
        if (want != le32(h + 8)) {
                snprintf(t->why, sizeof(t->why), "the length's CRC does not match (stored 0x%08x, computed 0x%08x): "
                         "not a TFRecord file, or corrupt; the rest of the file cannot be framed", le32(h + 8), want);
                return bad(r, l, true);
        }
        if (len > r->o.tfrecord->max_record_bytes) {
                snprintf(t->why, sizeof(t->why), "a record of %llu bytes, more than data.tfrecord.max_record_bytes (%u)",
                         (unsigned long long)len, r->o.tfrecord->max_record_bytes);
                n = take(r, NULL, len + 4, err, errlen);
                return n < 0 ? (int)n : bad(r, l, (uint64_t)n < len + 4);
        }
        if (r->by_line && (r->line_idx - 1) % r->o.n_workers != r->o.worker) {
                /* another worker's record (sharded by record): its data are that worker's to check */
                n = take(r, NULL, len + 4, err, errlen);
                if (n >= 0 && (uint64_t)n < len + 4) {
                        snprintf(t->why, sizeof(t->why), "truncated record: the file ends %lld bytes into its %llu "
                                 "bytes of data and CRC", n, (unsigned long long)len + 4);
                        return bad(r, l, true);
                }
                *l = (struct records_line){.s = "", .len = 0}; /* not ours: shard_line passes it by */
                return n < 0 ? (int)n : 1;
        }
        const uint8_t *d;
        if (r->rlen - r->rpos >= len + 4) { /* all in the read buffer: no copy */
                d = (const uint8_t *)r->rbuf + r->rpos;
                r->rpos += len + 4;
                r->at += len + 4;
        } else {
                if (len + 4 > r->line_cap) {
                        size_t cap = r->line_cap;
                        if (grow_array((void **)&r->line, &cap, len + 4, 1, 4096) < 0)
                                return errf(err, errlen, -ENOMEM, "out of memory for a record of %llu bytes",
                                            (unsigned long long)len);
                        r->line_cap = cap;
                }
                if ((n = take(r, (uint8_t *)r->line, len + 4, err, errlen)) < 0)
                        return (int)n;
                if ((uint64_t)n < len + 4) {
                        snprintf(t->why, sizeof(t->why), "truncated record: the file ends %lld bytes into its %llu "
                                 "bytes of data and CRC", n, (unsigned long long)len + 4);
                        return bad(r, l, true);
                }
                d = (const uint8_t *)r->line;
        }
        want = crc32c_mask(crc32c(d, len));
        if (want != le32(d + len)) {
                snprintf(t->why, sizeof(t->why), "the data's CRC does not match (stored 0x%08x, computed 0x%08x)",
                         le32(d + len), want);
                return bad(r, l, false);
        }
        *l = (struct records_line){.s = (const char *)d, .len = len};
        return 1;
}

/* ---- the Example ---- */

/* protobuf-c's allocations for one Example: bumped from one block, the overflow in blocks of their
 * own, all freed at once before the next (the block then grows to what the last one needed). */
struct arena {
        char *block;
        size_t cap, used, over;
        void *extra;            /* a list of overflow blocks, each linked through its first pointer */
};

static void *arena_alloc(void *data, size_t n)
{
        struct arena *a = data;
        n = (n + 15) & ~(size_t)15;
        if (a->used + n <= a->cap) {
                void *p = a->block + a->used;
                a->used += n;
                return p;
        }
        void **b = malloc(16 + n);
        if (!b)
                return NULL;
        *b = a->extra;
        a->extra = b;
        a->over += n;
        return (char *)b + 16;
}

static void arena_free(void *data, void *p)
{
        (void)data;
        (void)p; /* all at once, in arena_reset */
}

static void arena_reset(struct arena *a)
{
        while (a->extra) {
                void *next = *(void **)a->extra;
                free(a->extra);
                a->extra = next;
        }
        if (a->over) {
                size_t cap = 2 * (a->cap + a->over);
                char *b = malloc(cap);
                if (b) {
                        free(a->block);
                        a->block = b;
                        a->cap = cap;
                }
        }
        a->used = a->over = 0;
}

struct tfr_parser {
        const struct tfr_spec *s;
        struct arena arena;
        ProtobufCAllocator alloc;
        uint64_t *want;         /* (n_want) the hashes of the spec's names: label, dense, sparse, image */
        uint32_t n_want;
        /* a map of the Example's keys for one record: hash -> entry index + 1, in a table of cap slots,
         * a slot live when its gen is the record's */
        uint32_t cap, gen;
        uint64_t *key;
        uint32_t *idx, *sgen;
};

static uint64_t name_hash(const char *s, size_t n)
{
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < n; i++)
                h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
        return h ^ h >> 29;
}

int tfr_parser_new(const struct tfr_spec *s, struct tfr_parser **ret)
{
        uint32_t n = 1 + s->n_dense + s->n_sparse + 1;
        struct tfr_parser *p = calloc(1, sizeof(*p) + n * sizeof(uint64_t));
        if (!p)
                return -ENOMEM;
        p->s = s;
        p->want = (uint64_t *)(p + 1);
        p->want[p->n_want++] = name_hash(s->label.name, strlen(s->label.name));
        for (uint32_t i = 0; i < s->n_dense; i++)
                p->want[p->n_want++] = name_hash(s->dense[i].name, strlen(s->dense[i].name));
        for (uint32_t i = 0; i < s->n_sparse; i++)
                p->want[p->n_want++] = name_hash(s->sparse[i].name, strlen(s->sparse[i].name));
        p->want[p->n_want++] = name_hash(s->image.name, strlen(s->image.name));
        p->arena.block = malloc(ARENA_FIRST);
        p->arena.cap = ARENA_FIRST;
        p->alloc = (ProtobufCAllocator){.alloc = arena_alloc, .free = arena_free, .allocator_data = &p->arena};
        if (!p->arena.block) {
                tfr_parser_free(p);
                return -ENOMEM;
        }
        *ret = p;
        return 0;
}

struct tfr_parser *tfr_parser_free(struct tfr_parser *p)
{
        if (p) {
                arena_reset(&p->arena);
                free(p->arena.block);
                free(p->key);
                free(p);   /* and want */
        }
        return NULL;
}

/* The map of the Example's n entries (a repeated key: the last one, as a map keeps). 0 or -ENOMEM. */
static int index_entries(struct tfr_parser *p, Psfleet__Tfrecord__Features__FeatureEntry **e, size_t n)
{
        if (2 * n > p->cap) {
                uint32_t cap = 64;
                while (cap < 2 * n)
                        cap *= 2;
                uint64_t *key = malloc(cap * (sizeof(uint64_t) + 2 * sizeof(uint32_t)));
                if (!key)
                        return -ENOMEM;
                free(p->key);
                p->key = key;
                p->idx = (uint32_t *)(key + cap);
                p->sgen = p->idx + cap;
                memset(p->sgen, 0, cap * sizeof(uint32_t));
                p->cap = cap;
                p->gen = 0;
        }
        if (++p->gen == 0) { /* wrapped: every slot's gen could look live */
                memset(p->sgen, 0, p->cap * sizeof(uint32_t));
                p->gen = 1;
        }
        for (size_t i = 0; i < n; i++) {
                const char *k = e[i]->key ? e[i]->key : "";
                uint64_t h = name_hash(k, strlen(k));
                uint32_t s = (uint32_t)h & (p->cap - 1);
                while (p->sgen[s] == p->gen && !(p->key[s] == h && strcmp(e[p->idx[s]]->key, k) == 0))
                        s = (s + 1) & (p->cap - 1);
                p->sgen[s] = p->gen;
                p->key[s] = h;
                p->idx[s] = (uint32_t)i;
        }
        return 0;
}

/* The feature named f->name (its hash h), or NULL: missing, or a Feature with no list set. */
static const Psfleet__Tfrecord__Feature *find(const struct tfr_parser *p, Psfleet__Tfrecord__Features__FeatureEntry **e,
                                              const struct tfr_feature *f, uint64_t h)
{
        if (!p->cap)
                return NULL;
        for (uint32_t s = (uint32_t)h & (p->cap - 1); p->sgen[s] == p->gen; s = (s + 1) & (p->cap - 1)) {
                const Psfleet__Tfrecord__Features__FeatureEntry *x = e[p->idx[s]];
                if (p->key[s] == h && strcmp(x->key ? x->key : "", f->name) == 0)
                        return x->value && x->value->kind_case != PSFLEET__TFRECORD__FEATURE__KIND__NOT_SET ? x->value
                                                                                                          : NULL;
        }
        return NULL;
}

static const char *list_name(const Psfleet__Tfrecord__Feature *v)
{
        return v->kind_case == PSFLEET__TFRECORD__FEATURE__KIND_BYTES_LIST   ? "bytes_list"
               : v->kind_case == PSFLEET__TFRECORD__FEATURE__KIND_FLOAT_LIST ? "float_list"
                                                                             : "int64_list";
}

/* The values of a numeric feature (float_list or int64_list as allowed) into out as floats: 0, or
 * -EBADMSG with why when the list is another kind, holds other than want values, or a float that is
 * not finite. want 0: any count up to cap, *n set. */
static int numbers(const Psfleet__Tfrecord__Feature *v, const struct tfr_feature *f, bool any_numeric, uint32_t want,
                   float *out, char *why, size_t wl)
{
        size_t n;
        if (v->kind_case == PSFLEET__TFRECORD__FEATURE__KIND_FLOAT_LIST && (any_numeric || f->kind == TFR_FLOAT)) {
                n = v->float_list ? v->float_list->n_value : 0;
                if (n != want)
                        return errf(why, wl, -EBADMSG, "feature '%s': %zu values, expected %u", f->name, n, want);
                for (size_t i = 0; i < n; i++) {
                        if (!isfinite(v->float_list->value[i]))
                                return errf(why, wl, -EBADMSG, "feature '%s': value %zu is not finite", f->name, i);
                        out[i] = v->float_list->value[i];
                }
                return 0;
        }
        if (v->kind_case == PSFLEET__TFRECORD__FEATURE__KIND_INT64_LIST && (any_numeric || f->kind == TFR_INT64)) {
                n = v->int64_list ? v->int64_list->n_value : 0;
                if (n != want)
                        return errf(why, wl, -EBADMSG, "feature '%s': %zu values, expected %u", f->name, n, want);
                for (size_t i = 0; i < n; i++)
                        out[i] = (float)v->int64_list->value[i];
                return 0;
        }
        return errf(why, wl, -EBADMSG, "feature '%s': a %s, expected %s", f->name, list_name(v),
                    any_numeric ? "float_list or int64_list" : f->kind == TFR_FLOAT ? "float_list (dtype float32)"
                                                                                    : "int64_list (dtype int64)");
}

/* A list's value count, 0 for a list that is absent. */
static size_t count(const Psfleet__Tfrecord__Feature *v)
{
        switch (v->kind_case) {
        case PSFLEET__TFRECORD__FEATURE__KIND_BYTES_LIST: return v->bytes_list ? v->bytes_list->n_value : 0;
        case PSFLEET__TFRECORD__FEATURE__KIND_FLOAT_LIST: return v->float_list ? v->float_list->n_value : 0;
        case PSFLEET__TFRECORD__FEATURE__KIND_INT64_LIST: return v->int64_list ? v->int64_list->n_value : 0;
        default: return 0;
        }
}

static int parse_image(const Psfleet__Tfrecord__Feature *v, const struct tfr_feature *f, float *out, char *why,
                       size_t wl)
{
        if (!v)
                return errf(why, wl, -EBADMSG, "feature '%s': missing", f->name);
        if (f->kind == TFR_FLOAT)
                return numbers(v, f, false, f->length, out, why, wl);
        if (v->kind_case != PSFLEET__TFRECORD__FEATURE__KIND_BYTES_LIST)
                return errf(why, wl, -EBADMSG, "feature '%s': a %s, expected bytes_list (dtype string)", f->name,
                            list_name(v));
        if (count(v) != 1)
                return errf(why, wl, -EBADMSG, "feature '%s': %zu values, expected 1 (the raw image)", f->name, count(v));
        const ProtobufCBinaryData *d = &v->bytes_list->value[0];
        if (d->len != f->length)
                return errf(why, wl, -EBADMSG, "feature '%s': %zu bytes, expected %u (shape [%u, %u, %u])", f->name,
                            d->len, f->length, f->shape[0], f->shape[1], f->shape[2]);
        for (size_t i = 0; i < d->len; i++)
                out[i] = (float)d->data[i] / 255.0f;
        return 0;
}

/* Sparse field fi's ids into b from *o on (o - base: the record's ids so far). */
static int parse_sparse(const Psfleet__Tfrecord__Feature *v, const struct tfr_feature *f, uint32_t fi,
                        struct records_batch *b, uint32_t base, uint32_t *o, char *why, size_t wl)
{
        size_t n = v ? count(v) : 0;
        if (v && n == 0)
                return 0;
        if (v && v->kind_case != (f->kind == TFR_INT64 ? PSFLEET__TFRECORD__FEATURE__KIND_INT64_LIST
                                                       : PSFLEET__TFRECORD__FEATURE__KIND_BYTES_LIST))
                return errf(why, wl, -EBADMSG, "feature '%s': a %s, expected %s", f->name, list_name(v),
                            f->kind == TFR_INT64 ? "int64_list (dtype int64)" : "bytes_list (dtype string)");
        if (n > b->max_ids - (*o - base))
                return errf(why, wl, -EBADMSG, "feature '%s': more than max_ids (%u) ids", f->name, b->max_ids);
        for (size_t k = 0; k < n; k++) {
                if (f->kind == TFR_INT64) {
                        b->ids[*o] = (uint64_t)v->int64_list->value[k];
                } else {
                        const ProtobufCBinaryData *d = &v->bytes_list->value[k];
                        b->ids[*o] = records_hash(fi, (const char *)d->data, d->len);
                }
                b->val[(*o)++] = 1;
        }
        return 0;
}

int tfr_parse_example(struct tfr_parser *p, struct records_batch *b, uint32_t i, const uint8_t *data, size_t len,
                      char *why, size_t wl)
{
        const struct tfr_spec *s = p->s;
        arena_reset(&p->arena);
        Psfleet__Tfrecord__Example *ex = psfleet__tfrecord__example__unpack(&p->alloc, len, data);
        if (!ex)
                return errf(why, wl, -EBADMSG, "not a tf.train.Example (%zu bytes that do not parse as one)", len);
        Psfleet__Tfrecord__Features__FeatureEntry **e = ex->features ? ex->features->feature : NULL;
        size_t n = ex->features ? ex->features->n_feature : 0;
        if (index_entries(p, e, n) < 0)
                return errf(why, wl, -ENOMEM, "out of memory");
        uint32_t w = 0;
        const Psfleet__Tfrecord__Feature *v = find(p, e, &s->label, p->want[w++]);
        int r;
        if (!v)
                return errf(why, wl, -EBADMSG, "feature '%s' (the label): missing", s->label.name);
        if ((r = numbers(v, &s->label, true, 1, &b->label[i], why, wl)) < 0)
                return r;
        float *d = b->dense + (size_t)i * b->n_dense;
        for (uint32_t j = 0; j < s->n_dense; j++) {
                const struct tfr_feature *f = &s->dense[j];
                v = find(p, e, f, p->want[w++]);
                if (!v || count(v) == 0) { /* an empty list is missing too, as tf.io.parse_example has it */
                        if (!f->has_default)
                                return errf(why, wl, -EBADMSG, "feature '%s': missing, and it has no default_value",
                                            f->name);
                        for (uint32_t k = 0; k < f->length; k++)
                                d[k] = f->default_value;
                } else if ((r = numbers(v, f, false, f->length, d, why, wl)) < 0) {
                        return r;
                }
                d += f->length;
        }
        uint32_t *off = b->off + (size_t)i * b->n_fields, o = off[0];
        for (uint32_t f = 0; f < s->n_sparse; f++) {
                v = find(p, e, &s->sparse[f], p->want[w++]);
                if ((r = parse_sparse(v, &s->sparse[f], f, b, off[0], &o, why, wl)) < 0)
                        return r;
                off[f + 1] = o;
        }
        if (s->image.name[0])
                return parse_image(find(p, e, &s->image, p->want[w]), &s->image, d, why, wl);
        return 0;
}
