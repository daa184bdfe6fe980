/* IDX reading through zlib (gzread reads plain files as they are) and per-worker data shards. */
#include "data.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "rng.h"

static void fmt_err(char *err, size_t errlen, const char *fmt, ...)
{
        if (!err || errlen == 0)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
}

/* Reads up to len bytes; returns bytes read (< len only at end of file) or -errno. */
static long long read_full(gzFile f, void *buf, size_t len, const char **zmsg)
{
        size_t got = 0;
        while (got < len) {
                size_t chunk = len - got > (1u << 30) ? (1u << 30) : len - got;
                int r = gzread(f, (uint8_t *)buf + got, (unsigned)chunk);
                if (r < 0) {
                        int zerr;
                        *zmsg = gzerror(f, &zerr);
                        return zerr == Z_ERRNO ? -(errno ? errno : EIO) : -EBADMSG;
                }
                if (r == 0)
                        break;
                got += (size_t)r;
        }
        return (long long)got;
}

/* Reads the size bytes of data into a buffer that grows with what the file holds (doubling from 1 MiB),
 * so a header that claims gigabytes costs memory only as far as the data really go. Returns bytes
 * read (< size: the file ends early; *buf holds at least that many) or -errno (-ENOMEM). */
static long long read_data(gzFile f, size_t size, uint8_t **buf, const char **zmsg)
{
        size_t cap = size < (1u << 20) ? size : (1u << 20), got = 0;
        uint8_t *b = malloc(cap ? cap : 1);
        if (!b)
                return -ENOMEM;
        *buf = b;
        for (;;) {
                long long r = read_full(f, b + got, cap - got, zmsg);
                if (r < 0)
                        return r;
                got += (size_t)r;
                if (got < cap || cap == size)
                        return (long long)got;
                cap = cap > size / 2 ? size : cap * 2;
                if (!(b = realloc(b, cap)))
                        return -ENOMEM;
                *buf = b;
        }
}

static uint32_t be32(const uint8_t *p)
{
        return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

struct idx *idx_free(struct idx *x)
{
        if (x) {
                free(x->data);
                free(x);
        }
        return NULL;
}

int idx_load(const char *path, struct idx **ret, char *err, size_t errlen)
{
        struct idx *x = NULL;
        const char *zmsg = NULL;
        long long got;
        int r;
        gzFile f = gzopen(path, "rb");
        if (!f) {
                r = -(errno ? errno : ENOMEM);
                fmt_err(err, errlen, "%s: %s", path, strerror(-r));
                return r;
        }
        uint8_t hdr[16];
        if ((got = read_full(f, hdr, 4, &zmsg)) < 0)
                goto read_error;
        if (got < 4) {
                r = -EBADMSG;
                fmt_err(err, errlen, "%s: offset 0: truncated header: expected 4 bytes of magic, file ends after %lld",
                        path, got);
                goto out;
        }
        uint32_t magic = be32(hdr);
        if (magic < 0x801 || magic > 0x803) {
                r = -EBADMSG;
                fmt_err(err, errlen, "%s: offset 0: bad magic 0x%08x (expected 0x0000080x)", path, magic);
                goto out;
        }
        uint32_t nd = magic & 0xff;
        if ((got = read_full(f, hdr + 4, 4 * nd, &zmsg)) < 0)
                goto read_error;
        if (got < 4 * nd) {
                r = -EBADMSG;
                fmt_err(err, errlen, "%s: offset 4: truncated header: expected %u bytes of dimensions, file ends after %lld",
                        path, 4 * nd, got);
                goto out;
        }
        x = calloc(1, sizeof(*x));
        if (!x) {
                r = -ENOMEM;
                fmt_err(err, errlen, "%s: out of memory", path);
                goto out;
        }
        x->n_dims = nd;
        size_t size = 1;
        bool too_big = false;
        for (uint32_t i = 0; i < nd; i++) {
                x->dims[i] = be32(hdr + 4 + 4 * i);
                if (x->dims[i] != 0 && size > IDX_MAX_BYTES / x->dims[i])
                        too_big = true;
                size *= x->dims[i];
        }
        if (too_big || size > IDX_MAX_BYTES) {
                char dims[64];
                int o = 0;
                for (uint32_t i = 0; i < nd; i++)
                        o += snprintf(dims + o, sizeof(dims) - (size_t)o, "%s%u", i ? "x" : "", x->dims[i]);
                r = -EFBIG;
                fmt_err(err, errlen, "%s: offset 4: dimensions %s too large (limit %zu bytes)", path, dims,
                        (size_t)IDX_MAX_BYTES);
                goto out;
        }
        x->size = size;
        size_t off = 4 + 4 * (size_t)nd;
        if ((got = read_data(f, size, &x->data, &zmsg)) == -ENOMEM) {
                r = -ENOMEM;
                fmt_err(err, errlen, "%s: out of memory for %zu bytes", path, size);
                goto out;
        }
        if (got < 0)
                goto read_error;
        if ((size_t)got < size) {
                r = -EBADMSG;
                fmt_err(err, errlen, "%s: offset %zu: truncated: expected %zu bytes of data, file ends after %lld",
                        path, off, size, got);
                goto out;
        }
        uint8_t extra;
        if ((got = read_full(f, &extra, 1, &zmsg)) < 0)
                goto read_error;
        if (got > 0) {
                r = -EBADMSG;
                fmt_err(err, errlen, "%s: offset %zu: trailing bytes after %zu bytes of data", path, off + size,
                        size);
                goto out;
        }
        *ret = x;
        x = NULL;
        r = 0;
        goto out;
read_error:
        r = (int)got;
        fmt_err(err, errlen, "%s: read error: %s", path, zmsg ? zmsg : strerror(-r));
out:
        idx_free(x);
        gzclose(f);
        return r;
}

struct dataset *dataset_free(struct dataset *d)
{
        if (d) {
                free(d->x);
                free(d->y);
                free(d);
        }
        return NULL;
}

int dataset_load(const char *images_path, const char *labels_path, struct dataset **ret, char *err,
                 size_t errlen)
{
        struct idx *im = NULL, *lb = NULL;
        struct dataset *d = NULL;
        int r;
        if ((r = idx_load(images_path, &im, err, errlen)) < 0 || (r = idx_load(labels_path, &lb, err, errlen)) < 0) {
                /* the file's own fault, as opposed to the host's: one kind, the message keeps which */
                if (r == -ENOENT || r == -ENOTDIR || r == -EISDIR || r == -EFBIG)
                        r = -EBADMSG;
                goto out;
        }
        r = -EBADMSG;
        if (im->n_dims != 3) {
                fmt_err(err, errlen, "%s: offset 0: images need 3 dimensions (magic 0x00000803), found %u",
                        images_path, im->n_dims);
                goto out;
        }
        if (lb->n_dims != 1) {
                fmt_err(err, errlen, "%s: offset 0: labels need 1 dimension (magic 0x00000801), found %u",
                        labels_path, lb->n_dims);
                goto out;
        }
        if (lb->dims[0] != im->dims[0]) {
                fmt_err(err, errlen, "%s: offset 4: %u labels, but %s has %u images", labels_path, lb->dims[0],
                        images_path, im->dims[0]);
                goto out;
        }
        if (im->dims[0] == 0 || im->dims[1] == 0 || im->dims[2] == 0) {
                fmt_err(err, errlen, "%s: offset 4: no images (%ux%ux%u)", images_path, im->dims[0], im->dims[1],
                        im->dims[2]);
                goto out;
        }
        r = -ENOMEM;
        d = calloc(1, sizeof(*d));
        if (!d)
                goto oom;
        d->n = im->dims[0];
        d->rows = im->dims[1];
        d->cols = im->dims[2];
        d->dim = d->rows * d->cols;
        d->x = malloc(sizeof(float) * im->size);
        if (!d->x)
                goto oom;
        float scale[256];
        for (int i = 0; i < 256; i++)
                scale[i] = (float)i / 255.0f;
        for (size_t i = 0; i < im->size; i++)
                d->x[i] = scale[im->data[i]];
        d->y = lb->data; /* take the labels' bytes as they are */
        lb->data = NULL;
        *ret = d;
        d = NULL;
        r = 0;
        goto out;
oom:
        fmt_err(err, errlen, "%s: out of memory", images_path);
out:
        dataset_free(d);
        idx_free(im);
        idx_free(lb);
        return r;
}

int dataset_fits(const struct dataset *d, const char *images_path, uint32_t dim, uint32_t n_classes, char *err,
                 size_t errlen)
{
        uint8_t top = dataset_max_label(d);
        if (d->dim == dim && top < n_classes)
                return 0;
        fmt_err(err, errlen, "%s: %u values per example, labels up to %u; the model takes %u values and %u classes",
                images_path, d->dim, top, dim, n_classes);
        return -EBADMSG;
}

uint8_t dataset_max_label(const struct dataset *d)
{
        uint8_t m = 0;
        for (uint32_t i = 0; i < d->n; i++)
                m = d->y[i] > m ? d->y[i] : m;
        return m;
}

struct data_iter {
        const struct dataset *d;
        uint32_t k, W;
        uint64_t seed;
        uint32_t n;          /* examples in the shard */
        uint32_t *order;     /* (n) dataset indices in this epoch's order */
        uint32_t pos;        /* next position in order */
        uint64_t epoch;
        uint64_t seen;
};

static void iter_shuffle(struct data_iter *it)
{
        for (uint32_t i = 0; i < it->n; i++)
                it->order[i] = it->k + i * it->W;
        struct rng r;
        rng_init(&r, it->seed, (uint64_t)it->k << 40 ^ it->epoch);
        rng_shuffle_u32(&r, it->order, it->n);
        it->pos = 0;
}

int data_iter_new(const struct dataset *d, uint32_t k, uint32_t W, uint64_t seed, struct data_iter **ret)
{
        if (!d || W == 0 || k >= W || k >= d->n)
                return -EINVAL;
        uint32_t n = (d->n - k + W - 1) / W;
        struct data_iter *it = calloc(1, sizeof(*it) + sizeof(uint32_t) * n);   /* and its order */
        if (!it)
                return -ENOMEM;
        it->d = d;
        it->k = k;
        it->W = W;
        it->seed = seed;
        it->n = n;
        it->order = (uint32_t *)(it + 1);
        iter_shuffle(it);
        *ret = it;
        return 0;
}

struct data_iter *data_iter_free(struct data_iter *it)
{
        free(it);   /* and its order */
        return NULL;
}

void data_iter_next_batch(struct data_iter *it, uint32_t B, float *x, uint8_t *y)
{
        const struct dataset *d = it->d;
        for (uint32_t b = 0; b < B; b++) {
                if (it->pos == it->n) {
                        it->epoch++;
                        iter_shuffle(it);
                }
                uint32_t i = it->order[it->pos++];
                memcpy(x + (size_t)b * d->dim, d->x + (size_t)i * d->dim, sizeof(float) * d->dim);
                y[b] = d->y[i];
        }
        it->seen += B;
}

void data_iter_skip(struct data_iter *it, uint64_t examples)
{
        /* whole epochs are skipped by count: each epoch's order depends only on (seed, k, epoch) */
        uint64_t left = it->n - it->pos;
        if (examples >= left && it->n > 0) {
                uint64_t rest = examples - left, epochs = rest / it->n;
                it->epoch += 1 + epochs;
                iter_shuffle(it);
                it->pos = (uint32_t)(rest % it->n);
        } else {
                it->pos += (uint32_t)examples;
        }
        it->seen += examples;
}

uint64_t data_iter_epoch(const struct data_iter *it)
{
        return it->epoch;
}

uint64_t data_iter_examples_seen(const struct data_iter *it)
{
        return it->seen;
}

uint32_t data_iter_size(const struct data_iter *it)
{
        return it->n;
}

uint32_t data_iter_index_at(const struct data_iter *it, uint32_t pos)
{
        return pos < it->n ? it->order[pos] : UINT32_MAX;
}
