/* The streaming readers of records.h: zlib reads gzip'd and plain files alike; a read buffer and one
 * line buffer (capped at RECORDS_MAX_LINE, or data.tfrecord.max_record_bytes for a TFRecord record) are
 * all the memory a reader holds besides the caller's batch, and the shuffle buffer's records when there
 * is one (data.shuffle_buffer). TFRecord files are read and framed by records_tfrecord.c. */
#include "records.h"
#include "records-internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "rng.h"
#include "util.h"

#define READ_BUF RECORDS_READ_BUF
#define RECORDS_MAX_LINE (1u << 20) /* longer lines are bad: a file that is not text ends quickly */

/* The shuffle buffer (data.shuffle_buffer), as TensorFlow's Dataset.shuffle: records read ahead into
 * up to `cap` slots; each record given is drawn uniformly from the slots, and its slot takes the next
 * record read. A slot keeps its own id arrays (grown to the longest record it held), so the pool costs
 * what its records hold, not cap times data.max_ids_per_example. */
struct pool_slot {
        float label;
        uint32_t n_ids, cap_ids;
        uint64_t *ids;
        float *val;
};

struct pool {
        uint32_t n, cap;
        struct pool_slot *slot;         /* (cap) */
        float *dense;                   /* (cap, n_dense) */
        uint32_t *cnt;                  /* (cap, n_fields): ids per field */
        struct records_batch *one;      /* a record as read */
        struct rng g;
};

static int pool_new(const struct records_reader *r, struct pool **ret);
static struct pool *pool_free(struct pool *p);

const char *records_format_name(enum records_format f)
{
        switch (f) {
        case RECORDS_LIBSVM: return "libsvm";
        case RECORDS_CRITEO: return "criteo";
        case RECORDS_CSV: return "csv";
        case RECORDS_TFRECORD: return "tfrecord";
        }
        return "?";
}

uint32_t records_format_fields(enum records_format f)
{
        return f == RECORDS_LIBSVM ? 1 : f == RECORDS_CRITEO ? RECORDS_CRITEO_FIELDS : 0;
}

uint64_t records_hash(uint32_t field, const char *token, size_t len)
{
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < len; i++)
                h = (h ^ (uint8_t)token[i]) * 0x100000001b3ull;
        uint64_t s = h ^ (uint64_t)field * 0x9e3779b97f4a7c15ull;
        return rng_splitmix64(&s);
}

int records_batch_new(uint32_t cap, uint32_t n_dense, uint32_t n_fields, uint32_t max_ids,
                      struct records_batch **ret)
{
        if (cap == 0)
                return -EINVAL;
        /* off[] is uint32_t: the ids of a full batch must be countable in it */
        if ((uint64_t)cap * max_ids > UINT32_MAX || (uint64_t)cap * n_fields >= UINT32_MAX ||
            (uint64_t)cap * n_dense > SIZE_MAX / 4 / sizeof(float))
                return -ENOMEM;
        /* the batch and its arrays in one block, the 8-byte ids first after it so every view is aligned */
        size_t nid = (size_t)cap * max_ids, n_off = (size_t)cap * n_fields + 1;
        size_t n_float = cap + (size_t)cap * n_dense + 1 + nid + 1;   /* label, dense, val */
        size_t size = sizeof(struct records_batch) + (nid + 1) * sizeof(uint64_t) + n_float * sizeof(float) +
                      n_off * sizeof(uint32_t);
        struct records_batch *b = malloc(size);
        if (!b)
                return -ENOMEM;
        *b = (struct records_batch){.cap = cap, .n_dense = n_dense, .n_fields = n_fields, .max_ids = max_ids};
        b->ids = (uint64_t *)(b + 1);
        b->label = (float *)(b->ids + nid + 1);
        b->dense = b->label + cap;
        b->val = b->dense + (size_t)cap * n_dense + 1;
        b->off = (uint32_t *)(b->val + nid + 1);
        memset(b->off, 0, n_off * sizeof(uint32_t));
        *ret = b;
        return 0;
}

struct records_batch *records_batch_free(struct records_batch *b)
{
        free(b);   /* and its arrays */
        return NULL;
}

/* ---- files and lines ---- */

static int open_file(struct records_reader *r, uint32_t k, char *err, size_t errlen)
{
        const char *path = r->files[r->mine[k]];
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return errf(err, errlen, errno == ENOENT ? -EBADMSG : -errno, "%s: %s", path, strerror(errno));
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                close(fd);
                return errf(err, errlen, -EBADMSG, "%s: not a regular file", path);
        }
        if (r->o.format == RECORDS_TFRECORD) {
                int e = tfr_file_open(r, fd, path, err, errlen);
                if (e == 0)
                        r->cur = k;
                return e;
        }
        gzFile f = gzdopen(fd, "rb");
        if (!f) {
                close(fd);
                return errf(err, errlen, -ENOMEM, "%s: out of memory", path);
        }
        gzbuffer(f, 64u << 10);
        r->f = f;
        r->cur = k;
        r->eof = false;
        r->line_idx = 0;
        r->rpos = r->rlen = 0;
        return 0;
}

static void close_file(struct records_reader *r)
{
        if (r->f)
                gzclose(r->f);
        r->f = NULL;
        tfr_file_close(r);
}

static bool file_open(const struct records_reader *r)
{
        return r->f || r->tf;
}

/* Refills rbuf; 0 at the end of the file, else bytes, or -EIO / -errno. */
static int fill(struct records_reader *r, char *err, size_t errlen)
{
        if (r->eof)
                return 0;
        int n = gzread(r->f, r->rbuf, READ_BUF);
        int zerr = Z_OK;
        const char *msg = n >= 0 ? NULL : gzerror(r->f, &zerr);
        if (n == 0) {
                /* a gzip stream cut short ends like a file, but leaves Z_BUF_ERROR behind */
                msg = gzerror(r->f, &zerr);
                if (zerr == Z_OK)
                        r->eof = true;
        }
        if (zerr != Z_OK) {
                const char *path = r->files[r->mine[r->cur]];
                if (zerr == Z_ERRNO)
                        return errf(err, errlen, -EIO, "%s: %s", path, strerror(errno));
                return errf(err, errlen, -EIO, "%s: corrupt gzip stream (%s)", path, msg);
        }
        r->rpos = 0;
        r->rlen = (size_t)n;
        return n;
}

/* The next line of the open file, without its "\n" (or "\r\n"): 1 with *l (valid until the next call;
 * l->s NULL when the line was longer than RECORDS_MAX_LINE), 0 at the end of the file, or -errno. */
static int next_line(struct records_reader *r, struct records_line *l, char *err, size_t errlen)
{
        size_t have = 0;
        bool long_line = false, any = false;
        for (;;) {
                if (r->rpos == r->rlen) {
                        int n = fill(r, err, errlen);
                        if (n < 0)
                                return n;
                        if (n == 0) {
                                if (!any)
                                        return 0;
                                break; /* the last line, without a newline */
                        }
                }
                any = true;
                char *s = r->rbuf + r->rpos;
                size_t avail = r->rlen - r->rpos;
                char *nl = memchr(s, '\n', avail);
                size_t take = nl ? (size_t)(nl - s) : avail;
                r->rpos += take + (nl ? 1 : 0);
                if (nl && have == 0 && !long_line) {
                        *l = (struct records_line){.s = s, .len = take}; /* all in the read buffer: no copy */
                        goto got;
                }
                if (!long_line && have + take > RECORDS_MAX_LINE)
                        long_line = true;
                if (!long_line) {
                        if (have + take > r->line_cap) {
                                size_t cap = r->line_cap;
                                if (grow_array((void **)&r->line, &cap, have + take, 1, 4096) < 0)
                                        return errf(err, errlen, -ENOMEM, "out of memory");
                                r->line_cap = cap;
                        }
                        memcpy(r->line + have, s, take);
                        have += take;
                }
                if (nl)
                        break;
        }
        *l = (struct records_line){.s = long_line ? NULL : r->line, .len = have};
got:
        if (l->s && l->len && l->s[l->len - 1] == '\r')
                l->len--;
        r->line_idx++;
        return 1;
}

static const char *cur_path(const struct records_reader *r)
{
        return r->files[r->mine[r->cur]];
}

/* Whether line l (just read; line_idx counts it) is this file's CSV header. */
static bool csv_header(const struct records_reader *r, struct records_line l)
{
        if (r->o.format != RECORDS_CSV || r->line_idx != 1 || !l.s)
                return false;
        const char *c = memchr(l.s, ',', l.len), *s = l.s;
        size_t n = c ? (size_t)(c - l.s) : l.len;
        float y;
        records_trim(&s, &n);
        return !records_parse_float(s, n, &y);
}

/* The next line of the shard that is this reader's and holds a record (not empty, not a header):
 * 1 with *l, 0 at the end of the shard (of this pass), or -errno. Opens the files in turn. */
static int shard_line(struct records_reader *r, struct records_line *l, char *err, size_t errlen)
{
        for (;;) {
                if (!file_open(r)) {
                        if (r->cur + 1 >= r->n_mine)
                                return 0;
                        /* a file gone since records_open is a read error, not a bad line to skip; the
                         * next call goes on with the file after it */
                        int e = open_file(r, ++r->cur, err, errlen);
                        if (e < 0)
                                return e == -EBADMSG ? -EIO : e;
                }
                int n = r->tf ? tfr_next_record(r, l, err, errlen) : next_line(r, l, err, errlen);
                if (n < 0)
                        return n;
                if (n == 0) {
                        if (r->cur + 1 >= r->n_mine)
                                return 0; /* the pass ends; its last file stays open for a rewind */
                        close_file(r);
                        continue;
                }
                if (r->by_line && (r->line_idx - 1) % r->o.n_workers != r->o.worker)
                        continue;
                if ((l->s && l->len == 0 && !r->tf) || csv_header(r, *l))
                        continue; /* an empty TFRecord record is an Example without features: parsed */
                return 1;
        }
}

/* Reads the shard from its start again: a shard of one file (by line, usually) without opening it
 * again, since a looping reader over a short shard rewinds often. */
static int rewind_shard(struct records_reader *r, char *err, size_t errlen)
{
        if (r->tf && r->cur == 0 && r->n_mine == 1 && tfr_file_rewind(r) == 0)
                return 0;
        if (r->f && r->cur == 0 && r->n_mine == 1 && gzrewind(r->f) == 0) {
                r->eof = false;
                r->line_idx = 0;
                r->rpos = r->rlen = 0;
                return 0;
        }
        close_file(r);
        int e = open_file(r, 0, err, errlen);
        return e == -EBADMSG ? -EIO : e;
}

/* Parses the shard's next line into record b->n of b: 1 a record, 0 the end of the pass, -EBADMSG
 * (err "FILE:LINE: why") a bad line, or -errno. */
static int next_record(struct records_reader *r, struct records_batch *b, char *err, size_t errlen)
{
        struct records_line l;
        int n = shard_line(r, &l, err, errlen);
        if (n <= 0)
                return n;
        char why[256];
        if (l.why)
                n = errf(why, sizeof(why), -EBADMSG, "%s", l.why);
        else if (!l.s)
                n = errf(why, sizeof(why), -EBADMSG, "a line longer than %u bytes", RECORDS_MAX_LINE);
        else if (r->tf)
                n = tfr_parse_example(r->parser, b, b->n, (const uint8_t *)l.s, l.len, why, sizeof(why));
        else
                n = records_parse_line(r->o.format, b, b->n, l, why, sizeof(why));
        if (n < 0 && r->tf)
                return errf(err, errlen, n, "%s: record %llu at byte %llu: %s", cur_path(r),
                            (unsigned long long)r->line_idx - 1, (unsigned long long)r->rec_at, why);
        if (n < 0)
                return errf(err, errlen, n, "%s:%llu: %s", cur_path(r), (unsigned long long)r->line_idx, why);
        return 1;
}

/* CSV without n_dense: the columns of the first record of the shard's first file, header aside. */
static int csv_count(struct records_reader *r, char *err, size_t errlen)
{
        struct records_line l;
        for (;;) {
                int n = next_line(r, &l, err, errlen);
                if (n < 0)
                        return n;
                if (n == 0)
                        return errf(err, errlen, -EBADMSG, "%s: no record to count the features of", cur_path(r));
                if (!l.s)
                        return errf(err, errlen, -EBADMSG, "%s:%llu: a line longer than %u bytes", cur_path(r),
                                    (unsigned long long)r->line_idx, RECORDS_MAX_LINE);
                if (l.len && !csv_header(r, l)) {
                        r->n_dense = (uint32_t)(records_csv_columns(l) - 1);
                        return 0;
                }
        }
}

/* records_open's check: the first record the shard holds must parse (unless bad lines are skipped). */
static int check_first(struct records_reader *r, char *err, size_t errlen)
{
        int e = records_batch_new(1, r->n_dense, r->n_fields, r->o.max_ids, &r->probe);
        if (e < 0)
                return errf(err, errlen, e, "out of memory");
        r->probe->n = 0;
        e = next_record(r, r->probe, err, errlen);
        r->probe = records_batch_free(r->probe);
        if (e == -EBADMSG && r->o.skip_bad)
                e = 0;
        return e < 0 ? e : rewind_shard(r, err, errlen);
}

int records_open(const struct records_opts *o, struct records_reader **ret, char *err, size_t errlen)
{
        if (!o->files || o->n_files == 0)
                return errf(err, errlen, -EINVAL, "no data files");
        if (o->n_workers == 0 || o->worker >= o->n_workers)
                return errf(err, errlen, -EINVAL, "worker %u of %u workers", o->worker, o->n_workers);
        if ((unsigned)o->format > RECORDS_TFRECORD)
                return errf(err, errlen, -EINVAL, "unknown format %d", (int)o->format);
        if (o->format == RECORDS_TFRECORD && !o->tfrecord)
                return errf(err, errlen, -EINVAL, "tfrecord without a feature spec");
        /* the reader, its copy of the file list and its read buffer in one block */
        size_t names = 0;
        for (uint32_t i = 0; i < o->n_files; i++)
                names += strlen(o->files[i]) + 1;
        struct records_reader *r = calloc(1, sizeof(*r) + o->n_files * (sizeof(char *) + sizeof(uint32_t)) + READ_BUF +
                                                     names);
        if (!r)
                return errf(err, errlen, -ENOMEM, "out of memory");
        r->files = (char **)(r + 1);
        r->mine = (uint32_t *)(r->files + o->n_files);
        r->rbuf = (char *)(r->mine + o->n_files);
        char *name = r->rbuf + READ_BUF;
        r->o = *o;
        r->by_line = o->n_files < o->n_workers;
        r->n_fields = records_format_fields(o->format);
        r->n_dense = o->format == RECORDS_CRITEO ? RECORDS_CRITEO_DENSE : o->format == RECORDS_CSV ? o->n_dense : 0;
        int e;
        if (o->format == RECORDS_TFRECORD) {
                r->n_fields = o->tfrecord->n_sparse;
                r->n_dense = tfr_spec_dense(o->tfrecord);
                if (tfr_parser_new(o->tfrecord, &r->parser) < 0) {
                        e = errf(err, errlen, -ENOMEM, "out of memory");
                        goto fail;
                }
        }
        for (uint32_t i = 0; i < o->n_files; i++) {
                size_t len = strlen(o->files[i]) + 1;
                r->files[i] = memcpy(name, o->files[i], len);
                name += len;
                if (r->by_line || i % o->n_workers == o->worker)
                        r->mine[r->n_mine++] = i;
        }
        r->o.files = (const char *const *)r->files;
        for (uint32_t i = 0; i < r->n_mine; i++) { /* a missing file fails now, not hours into training */
                struct stat st;
                const char *path = r->files[r->mine[i]];
                int se = stat(path, &st) < 0 ? errno : 0;
                if (se || !S_ISREG(st.st_mode)) {
                        e = errf(err, errlen, se && se != ENOENT ? -se : -EBADMSG, "%s: %s", path,
                                 se ? strerror(se) : "not a regular file");
                        goto fail;
                }
        }
        if ((e = open_file(r, 0, err, errlen)) < 0)
                goto fail;
        if (o->format == RECORDS_CSV && o->n_dense == 0) {
                if ((e = csv_count(r, err, errlen)) < 0 || (e = rewind_shard(r, err, errlen)) < 0)
                        goto fail;
        }
        if ((e = check_first(r, err, errlen)) < 0)
                goto fail;
        if (o->shuffle > 1 && (e = pool_new(r, &r->pool)) < 0) {
                errf(err, errlen, e, "data.shuffle_buffer: out of memory for %u records", o->shuffle);
                goto fail;
        }
        *ret = r;
        return 0;
fail:
        records_close(r);
        return e;
}

struct records_reader *records_close(struct records_reader *r)
{
        if (r) {
                close_file(r);
                free(r->line);
                records_batch_free(r->probe);
                pool_free(r->pool);
                tfr_parser_free(r->parser);
                free(r);   /* and its file list and read buffer */
        }
        return NULL;
}

uint32_t records_n_dense(const struct records_reader *r)
{
        return r->n_dense;
}

uint32_t records_n_fields(const struct records_reader *r)
{
        return r->n_fields;
}

static struct pool *pool_free(struct pool *p)
{
        if (p) {
                for (uint32_t i = 0; i < p->cap; i++) {
                        free(p->slot[i].ids);
                        free(p->slot[i].val);
                }
                records_batch_free(p->one);
                free(p);   /* and its slots, dense and cnt */
        }
        return NULL;
}

static int pool_new(const struct records_reader *r, struct pool **ret)
{
        /* the pool and its arrays of cap in one block, the slots (with pointers) first */
        size_t cap = r->o.shuffle;
        struct pool *p = calloc(1, sizeof(*p) + cap * sizeof(*p->slot) + (cap * r->n_dense + 1) * sizeof(float) +
                                           (cap * r->n_fields + 1) * sizeof(uint32_t));
        if (!p)
                return -ENOMEM;
        p->cap = r->o.shuffle;
        p->slot = (struct pool_slot *)(p + 1);
        p->dense = (float *)(p->slot + cap);
        p->cnt = (uint32_t *)(p->dense + cap * r->n_dense + 1);
        if (records_batch_new(1, r->n_dense, r->n_fields, r->o.max_ids, &p->one) < 0) {
                pool_free(p);
                return -ENOMEM;
        }
        rng_init(&p->g, r->o.seed, r->o.worker);
        *ret = p;
        return 0;
}

/* The record in p->one into slot i. */
static int pool_put(struct pool *p, const struct records_reader *r, uint32_t i)
{
        const struct records_batch *one = p->one;
        struct pool_slot *sl = &p->slot[i];
        uint32_t n = one->off[r->n_fields];
        if (n > sl->cap_ids) {
                uint64_t *ids = realloc(sl->ids, n * sizeof(*ids));
                if (ids)
                        sl->ids = ids;
                float *val = ids ? realloc(sl->val, n * sizeof(*val)) : NULL;
                if (!val)
                        return -ENOMEM;
                sl->val = val;
                sl->cap_ids = n;
        }
        sl->label = one->label[0];
        sl->n_ids = n;
        if (n) {   /* a record without ids has no arrays yet (memcpy takes no NULL, even for 0 bytes) */
                memcpy(sl->ids, one->ids, n * sizeof(*sl->ids));
                memcpy(sl->val, one->val, n * sizeof(*sl->val));
        }
        if (r->n_dense)
                memcpy(p->dense + (size_t)i * r->n_dense, one->dense, r->n_dense * sizeof(float));
        for (uint32_t f = 0; f < r->n_fields; f++)
                p->cnt[(size_t)i * r->n_fields + f] = one->off[f + 1] - one->off[f];
        return 0;
}

/* Slot i as record b->n of b (which has room: b->n < b->cap, and max_ids per record). */
static void pool_give(const struct pool *p, const struct records_reader *r, uint32_t i, struct records_batch *b)
{
        const struct pool_slot *sl = &p->slot[i];
        uint32_t k = b->n, at = b->off[(size_t)k * r->n_fields];
        b->label[k] = sl->label;
        if (r->n_dense)
                memcpy(b->dense + (size_t)k * r->n_dense, p->dense + (size_t)i * r->n_dense,
                       r->n_dense * sizeof(float));
        if (sl->n_ids) {
                memcpy(b->ids + at, sl->ids, sl->n_ids * sizeof(*sl->ids));
                memcpy(b->val + at, sl->val, sl->n_ids * sizeof(*sl->val));
        }
        for (uint32_t f = 0; f < r->n_fields; f++) {
                at += p->cnt[(size_t)i * r->n_fields + f];
                b->off[(size_t)k * r->n_fields + f + 1] = at;
        }
        b->n++;
}

static int read_batch(struct records_reader *r, struct records_batch *b, char *err, size_t errlen);

/* Fills b from the pool, topping it up from the files before each draw. */
static int pool_next(struct records_reader *r, struct records_batch *b, char *err, size_t errlen)
{
        struct pool *p = r->pool;
        b->n = 0;
        b->off[0] = 0;
        while (b->n < b->cap) {
                while (p->n < p->cap && !r->done) {
                        int e = read_batch(r, p->one, err, errlen);
                        if (e < 0)
                                return e;
                        if (e == 0)
                                break;
                        if (pool_put(p, r, p->n) < 0)
                                return errf(err, errlen, -ENOMEM, "data.shuffle_buffer: out of memory for %u records",
                                            p->cap);
                        p->n++;
                }
                if (p->n == 0)
                        break;
                uint32_t i = rng_below(&p->g, p->n);
                pool_give(p, r, i, b);
                /* the last slot moves into the one drawn (its arrays swapped, not copied) */
                struct pool_slot t = p->slot[i];
                p->slot[i] = p->slot[--p->n];
                p->slot[p->n] = t;
                if (r->n_dense)
                        memmove(p->dense + (size_t)i * r->n_dense, p->dense + (size_t)p->n * r->n_dense,
                                r->n_dense * sizeof(float));
                memmove(p->cnt + (size_t)i * r->n_fields, p->cnt + (size_t)p->n * r->n_fields,
                        r->n_fields * sizeof(uint32_t));
        }
        return (int)b->n;
}

int records_next(struct records_reader *r, struct records_batch *b, char *err, size_t errlen)
{
        if (b->n_dense != r->n_dense || b->n_fields != r->n_fields || b->max_ids != r->o.max_ids)
                return errf(err, errlen, -EINVAL, "a batch of %u dense, %u fields, %u ids for a reader of %u, %u, %u",
                            b->n_dense, b->n_fields, b->max_ids, r->n_dense, r->n_fields, r->o.max_ids);
        return r->pool ? pool_next(r, b, err, errlen) : read_batch(r, b, err, errlen);
}

/* Up to b->cap records from the files, in their order. */
static int read_batch(struct records_reader *r, struct records_batch *b, char *err, size_t errlen)
{
        b->n = 0;
        b->off[0] = 0;
        while (b->n < b->cap && !r->done) {
                int e = next_record(r, b, err, errlen);
                if (e == 1) {
                        b->n++;
                        r->read++;
                        r->read_in_epoch++;
                } else if (e == -EBADMSG && r->o.skip_bad) {
                        r->bad++;
                } else if (e < 0) {
                        return e;
                } else if (!r->o.loop || r->read_in_epoch == 0) {
                        r->done = true; /* an empty pass ends a looping reader too: it would spin */
                        close_file(r);
                } else {
                        if ((e = rewind_shard(r, err, errlen)) < 0)
                                return e;
                        r->epoch++;
                        r->read_in_epoch = 0;
                }
        }
        return (int)b->n;
}

uint64_t records_bad_lines(const struct records_reader *r)
{
        return r->bad;
}

uint64_t records_read(const struct records_reader *r)
{
        return r->read;
}

uint64_t records_epoch(const struct records_reader *r)
{
        return r->epoch;
}
