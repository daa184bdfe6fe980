/* Checkpoint files in the safetensors format: see ckpt.h. */
#include "ckpt.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "util.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoints store floats as they lie in memory");

#define HEADER_MAX (100u << 20)    /* safetensors' own limit on the JSON header */

static const char *const dtype_names[] = {[CKPT_F32] = "F32", [CKPT_U64] = "U64"};
static const size_t dtype_sizes[] = {[CKPT_F32] = 4, [CKPT_U64] = 8};

static uint64_t tensor_bytes(const struct ckpt_tensor *t) {
        return (uint64_t)t->rows * (t->ndims == 1 ? 1 : t->cols) * dtype_sizes[t->dtype];
}

const char *ckpt_format_checksum(uint32_t crc, char *buf, size_t len) {
        snprintf(buf, len, "crc32c:%08" PRIx32, crc);
        return buf;
}

/* ---- writing ---- */

char *ckpt_temp_path(const char *path) {
        const char *slash = strrchr(path, '/');
        if (!slash)
                return strdup_printf(".%s.tmp", path);
        return strdup_printf("%.*s/.%s.tmp", (int)(slash - path), path, slash + 1);
}

/* Appends to the file and to its checksum. */
static int put(struct atomic_file *af, const void *p, size_t n, uint32_t *crc) {
        *crc = crc32c_update(*crc, p, n);
        return atomic_file_write(af, p, n);
}

/* The header: metadata first, then the tensors in the order given, padded to a multiple of 8. */
static char *build_header(const struct ckpt_tensor *t, size_t n, const struct ckpt_kv *meta, size_t n_meta,
                          size_t *len_ret) {
        json_t *h = json_object(), *m = json_object();
        for (size_t i = 0; i < n_meta; i++)
                json_object_set_new(m, meta[i].key, json_string(meta[i].value));
        json_object_set_new(h, "__metadata__", m);
        uint64_t at = 0;
        for (size_t i = 0; i < n; i++) {
                uint64_t bytes = tensor_bytes(&t[i]);
                json_t *o = t[i].ndims == 1
                                    ? json_pack("{s:s, s:[I], s:[I,I]}", "dtype", dtype_names[t[i].dtype], "shape",
                                                (json_int_t)t[i].rows, "data_offsets", (json_int_t)at,
                                                (json_int_t)(at + bytes))
                                    : json_pack("{s:s, s:[I,I], s:[I,I]}", "dtype", dtype_names[t[i].dtype], "shape",
                                                (json_int_t)t[i].rows, (json_int_t)t[i].cols, "data_offsets",
                                                (json_int_t)at, (json_int_t)(at + bytes));
                if (!o || json_object_set_new(h, t[i].name, o) < 0) {
                        json_decref(h);
                        return NULL;
                }
                at += bytes;
        }
        char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(h);
        if (!text)
                return NULL;
        size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
        char *out = realloc(text, padded + 1);
        if (!out) {
                free(text);
                return NULL;
        }
        memset(out + len, ' ', padded - len);
        out[padded] = 0;
        *len_ret = padded;
        return out;
}

static uint64_t test_delay_ms;   /* set once at start (ckpt_set_test_delay); 0: off */

void ckpt_set_test_delay(uint64_t ms) {
        test_delay_ms = ms;
}

void ckpt_test_delay(void) {
        struct timespec ts = {(time_t)(test_delay_ms / 1000), (long)(test_delay_ms % 1000) * 1000000L};
        while (test_delay_ms && nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

/* ---- the writer: tensors given whole, or streamed in parts ----
 *
 * A streamed tensor's bytes go to a spool file of its own as they come (an unlinked file beside the
 * checkpoint: a crash leaves nothing behind). The header, which needs every tensor's length, is known
 * once the last part is in; then the checkpoint's temp file is written start to end: its length, the
 * header, the whole tensors, and each spool copied in through one buffer, the CRC-32C computed on the
 * way. Memory stays at that buffer and the header, whatever the size of the tables. */

#define COPY_BUF (1u << 20)

struct ckpt_entry {
        struct ckpt_tensor t;           /* t.name owned; t.rows counts the rows streamed so far */
        int spool;                      /* -1: t.data is the caller's, whole */
        uint64_t rows;                  /* streamed rows (may pass 2^32 - 1: refused at finish) */
};

struct ckpt_writer {
        char *path, *dir;
        struct ckpt_entry *e;
        size_t n, cap;
};

int ckpt_writer_new(const char *path, struct ckpt_writer **ret) {
        struct ckpt_writer *w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        w->path = strdup(path);
        const char *slash = strrchr(path, '/');
        w->dir = slash ? strndup(path, (size_t)(slash - path + (slash == path))) : strdup(".");
        if (!w->path || !w->dir) {
                ckpt_writer_free(w);
                return -ENOMEM;
        }
        *ret = w;
        return 0;
}

struct ckpt_writer *ckpt_writer_free(struct ckpt_writer *w) {
        if (!w)
                return NULL;
        for (size_t i = 0; i < w->n; i++) {
                free((char *)w->e[i].t.name);
                if (w->e[i].spool >= 0)
                        close(w->e[i].spool);
        }
        free(w->e);
        free(w->path);
        free(w->dir);
        free(w);
        return NULL;
}

static int entry_new(struct ckpt_writer *w, const char *name, struct ckpt_entry **ret) {
        for (size_t i = 0; i < w->n; i++)
                if (strcmp(w->e[i].t.name, name) == 0)
                        return -EEXIST;
        char *copy = strdup(name);
        if (!copy || grow_array((void **)&w->e, &w->cap, w->n + 1, sizeof(*w->e), 16) < 0) {
                free(copy);
                return -ENOMEM;
        }
        struct ckpt_entry *e = &w->e[w->n++];
        *e = (struct ckpt_entry){.t = {.name = copy}, .spool = -1};
        *ret = e;
        return 0;
}

int ckpt_writer_add(struct ckpt_writer *w, const struct ckpt_tensor *t) {
        struct ckpt_entry *e;
        int r = entry_new(w, t->name, &e);
        if (r < 0)
                return r;
        const char *name = e->t.name;
        e->t = *t;
        e->t.name = name;
        e->rows = t->rows;
        return 0;
}

/* An unlinked file in dir, read-write. */
static int spool_open(const char *dir) {
        int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != ENOENT))
                return fd >= 0 ? fd : -errno;
        char *tmpl = strdup_printf("%s/.ckpt-spool-XXXXXX", dir);
        if (!tmpl)
                return -ENOMEM;
        fd = mkostemp(tmpl, O_CLOEXEC);
        int r = fd >= 0 ? fd : -errno;
        if (fd >= 0)
                unlink(tmpl);
        free(tmpl);
        return r;
}

int ckpt_writer_stream(struct ckpt_writer *w, const char *name, enum ckpt_dtype dtype, unsigned ndims,
                       uint32_t cols, size_t *idx_ret) {
        struct ckpt_entry *e;
        int fd = spool_open(w->dir);
        if (fd < 0)
                return fd;
        int r = entry_new(w, name, &e);
        if (r < 0) {
                close(fd);
                return r;
        }
        e->t.dtype = dtype;
        e->t.ndims = ndims;
        e->t.cols = ndims == 1 ? 1 : cols;
        e->spool = fd;
        *idx_ret = w->n - 1;
        return 0;
}

static int write_full(int fd, const void *p, size_t n) {
        const char *b = p;
        while (n) {
                ssize_t k = write(fd, b, n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                b += k;
                n -= (size_t)k;
        }
        return 0;
}

int ckpt_writer_append(struct ckpt_writer *w, size_t idx, const void *data, uint64_t rows) {
        assert(idx < w->n && w->e[idx].spool >= 0);
        struct ckpt_entry *e = &w->e[idx];
        int r = write_full(e->spool, data, (size_t)(rows * (e->t.ndims == 1 ? 1 : e->t.cols) * dtype_sizes[e->t.dtype]));
        if (r >= 0)
                e->rows += rows;
        return r;
}

uint64_t ckpt_writer_rows(const struct ckpt_writer *w, size_t idx) {
        assert(idx < w->n);
        return w->e[idx].rows;
}

/* Copies spool fd (bytes long) to the end of af through buf. */
static int copy_spool(struct atomic_file *af, int fd, uint64_t bytes, char *buf, uint32_t *crc) {
        if (lseek(fd, 0, SEEK_SET) < 0)
                return -errno;
        while (bytes) {
                size_t want = bytes < COPY_BUF ? (size_t)bytes : COPY_BUF;
                ssize_t k = read(fd, buf, want);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                if (k == 0)
                        return -EIO;   /* the spool is shorter than what was written to it */
                int r = put(af, buf, (size_t)k, crc);
                if (r < 0)
                        return r;
                bytes -= (uint64_t)k;
        }
        return 0;
}

int ckpt_writer_finish(struct ckpt_writer *w, const struct ckpt_kv *meta, size_t n_meta, struct ckpt_written *ret,
                       char *err, size_t errlen) {
        const char *path = w->path;
        struct ckpt_tensor *tensors = calloc(w->n ? w->n : 1, sizeof(*tensors));
        for (size_t i = 0; tensors && i < w->n; i++) {
                if (w->e[i].rows > UINT32_MAX) {
                        free(tensors);
                        return errf(err, errlen, -E2BIG, "tensor \"%s\": %" PRIu64 " rows, more than a checkpoint holds",
                                    w->e[i].t.name, w->e[i].rows);
                }
                tensors[i] = w->e[i].t;
                tensors[i].rows = (uint32_t)w->e[i].rows;
        }
        size_t hlen = 0;
        char *header = tensors ? build_header(tensors, w->n, meta, n_meta, &hlen) : NULL;
        char *tmp = ckpt_temp_path(path), *buf = malloc(COPY_BUF);
        struct atomic_file *af = NULL;
        int r;
        if (!header || !tmp || !buf) {
                r = errf(err, errlen, -ENOMEM, "out of memory");
                goto out;
        }
        /* A fixed temp name: a crash leaves a file that chief_ckpt recognizes and removes. */
        r = atomic_file_open(path, tmp, 0644, &af);
        if (r < 0) {
                errf(err, errlen, r, "cannot create \"%s\": %s", tmp, strerror(-r));
                goto out;
        }
        uint32_t crc = 0;
        uint8_t lenb[8];
        uint64_t total = 8 + hlen;
        for (int i = 0; i < 8; i++)
                lenb[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
        r = put(af, lenb, 8, &crc);
        if (r >= 0)
                r = put(af, header, hlen, &crc);
        for (size_t i = 0; i < w->n && r >= 0; i++) {
                uint64_t bytes = tensor_bytes(&tensors[i]);
                r = w->e[i].spool < 0 ? put(af, tensors[i].data, (size_t)bytes, &crc)
                                      : copy_spool(af, w->e[i].spool, bytes, buf, &crc);
                total += bytes;
        }
        if (r < 0) {
                errf(err, errlen, r, "cannot write \"%s\": %s", tmp, strerror(-r));
                goto out;
        }
        r = atomic_file_sync(af);
        if (r < 0) {
                errf(err, errlen, r, "cannot fsync \"%s\": %s", tmp, strerror(-r));
                goto out;
        }
        ckpt_test_delay();   /* test hook: only the temp file exists */
        bool renamed;
        r = atomic_file_commit(af, &renamed);
        af = NULL;
        if (r < 0 && !renamed) {
                errf(err, errlen, r, "cannot rename \"%s\" to \"%s\": %s", tmp, path, strerror(-r));
                goto out;
        }
        if (r < 0) {
                /* The file is complete and in place; only its directory entry may not survive a power cut. */
                errf(err, errlen, r, "cannot fsync the directory of \"%s\": %s", path, strerror(-r));
                goto out;
        }
        *ret = (struct ckpt_written){.bytes = total, .crc32c = crc};
out:
        atomic_file_abort(af);
        free(header);
        free(tmp);
        free(buf);
        free(tensors);
        return r;
}

int ckpt_write(const char *path, const struct ckpt_tensor *tensors, size_t n, const struct ckpt_kv *meta,
               size_t n_meta, struct ckpt_written *ret, char *err, size_t errlen) {
        struct ckpt_writer *w = NULL;
        int r = ckpt_writer_new(path, &w);
        if (r < 0)
                return errf(err, errlen, r, "out of memory");
        for (size_t i = 0; i < n && r >= 0; i++)
                if ((r = ckpt_writer_add(w, &tensors[i])) == -EEXIST)
                        errf(err, errlen, -EINVAL, "tensor \"%s\" given twice", tensors[i].name);
                else if (r < 0)
                        errf(err, errlen, r, "out of memory");
        if (r >= 0)
                r = ckpt_writer_finish(w, meta, n_meta, ret, err, errlen);
        ckpt_writer_free(w);
        return r == -EEXIST ? -EINVAL : r;
}

/* ---- reading ---- */

struct ckpt_t {
        const char *name;               /* owned by the header's JSON */
        enum ckpt_dtype dtype;
        unsigned ndims;
        uint64_t shape[CKPT_MAX_DIMS];
        uint64_t begin, end;            /* into the data section */
};

struct ckpt {
        int fd;                         /* the file, open while c lives: tensors are read from it */
        char *path;                     /* for errors */
        size_t size;
        uint32_t crc;
        json_t *header;
        uint64_t data_at;               /* where the data section starts: 8 + header length */
        uint8_t *data;                  /* the data section, read whole on the first ckpt_view; or NULL */
        size_t n;
        struct ckpt_t *t;
};

struct ckpt *ckpt_free(struct ckpt *c) {
        if (!c)
                return NULL;
        if (c->fd >= 0)
                close(c->fd);
        json_decref(c->header);
        free(c->t);
        free(c->data);
        free(c->path);
        free(c);
        return NULL;
}

uint64_t ckpt_bytes(const struct ckpt *c) {
        return c->size;
}

uint32_t ckpt_crc32c(const struct ckpt *c) {
        return c->crc;
}

const char *ckpt_meta(const struct ckpt *c, const char *key) {
        json_t *v = json_object_get(json_object_get(c->header, "__metadata__"), key);
        return json_string_value(v);
}

size_t ckpt_n_tensors(const struct ckpt *c) {
        return c->n;
}

const char *ckpt_tensor_name(const struct ckpt *c, size_t i) {
        return c->t[i].name;
}

/* len bytes at off of fd into buf; -EBADMSG when the file ends first. */
static int read_at(int fd, const char *path, uint64_t off, void *buf, size_t len, char *err, size_t errlen) {
        size_t got = 0;
        while (got < len) {
                ssize_t n = pread(fd, (uint8_t *)buf + got, len - got, (off_t)(off + got));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return errf(err, errlen, -errno, "cannot read \"%s\": %s", path, strerror(errno));
                if (n == 0)
                        return errf(err, errlen, -EBADMSG, "\"%s\" shrank while being read", path);
                got += (size_t)n;
        }
        return 0;
}

/* Opens path, checks its size against max and computes its CRC-32C through one CRC_CHUNK buffer, so
 * that a file of any size is checked in bounded memory (docs/checkpoints.md, "Streaming"). */
#define CRC_CHUNK (4u << 20)
static int open_and_sum(struct ckpt *c, const char *path, uint64_t max, char *err, size_t errlen) {
        c->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (c->fd < 0)
                return errf(err, errlen, -errno, "cannot open \"%s\": %s", path, strerror(errno));
        struct stat st;
        if (fstat(c->fd, &st) < 0)
                return errf(err, errlen, -errno, "cannot stat \"%s\": %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return errf(err, errlen, -EBADMSG, "\"%s\" is not a regular file", path);
        if ((uint64_t)st.st_size > max)
                return errf(err, errlen, -EFBIG, "\"%s\" is %lld bytes, more than the %" PRIu64 " expected", path,
                            (long long)st.st_size, max);
        c->size = (size_t)st.st_size;
        size_t chunk = c->size < CRC_CHUNK ? c->size : CRC_CHUNK;
        uint8_t *buf = malloc(chunk ? chunk : 1);
        if (!buf)
                return errf(err, errlen, -ENOMEM, "out of memory for \"%s\"", path);
        int r = 0;
        uint32_t crc = 0;
        for (uint64_t at = 0; at < c->size && r >= 0; at += chunk) {
                size_t len = c->size - at < chunk ? (size_t)(c->size - at) : chunk;
                if ((r = read_at(c->fd, path, at, buf, len, err, errlen)) >= 0)
                        crc = crc32c_update(crc, buf, len);
        }
        free(buf);
        c->crc = crc;
        return r;
}

static int cmp_begin(const void *a, const void *b) {
        const struct ckpt_t *x = *(const struct ckpt_t *const *)a, *y = *(const struct ckpt_t *const *)b;
        return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Checks the parsed header: one entry per tensor, contiguous data covering the data section. */
static int parse_header(struct ckpt *c, const char *path, size_t data_len, char *err, size_t errlen) {
        if (!json_is_object(c->header))
                return errf(err, errlen, -EBADMSG, "\"%s\": the header is not a JSON object", path);
        size_t n = json_object_size(c->header);
        c->t = calloc(n ? n : 1, sizeof(*c->t));
        struct ckpt_t **order = calloc(n ? n : 1, sizeof(*order));
        int r = 0;
        if (!c->t || !order) {
                free(order);
                return errf(err, errlen, -ENOMEM, "out of memory");
        }
        const char *key;
        json_t *v;
        json_object_foreach(c->header, key, v) {
                if (strcmp(key, "__metadata__") == 0) {
                        const char *mk;
                        json_t *mv;
                        if (!json_is_object(v)) {
                                r = errf(err, errlen, -EBADMSG, "\"%s\": __metadata__ is not an object", path);
                                goto out;
                        }
                        json_object_foreach(v, mk, mv) {
                                if (!json_is_string(mv)) {
                                        r = errf(err, errlen, -EBADMSG, "\"%s\": __metadata__ \"%s\" is not a string",
                                                 path, mk);
                                        goto out;
                                }
                        }
                        continue;
                }
                struct ckpt_t *t = &c->t[c->n];
                json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
                       *off = json_object_get(v, "data_offsets");
                if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) || !json_is_array(off) ||
                    json_array_size(off) != 2) {
                        r = errf(err, errlen, -EBADMSG, "\"%s\": tensor \"%s\" lacks dtype, shape or data_offsets", path,
                                 key);
                        goto out;
                }
                if (strcmp(json_string_value(dt), "F32") == 0) {
                        t->dtype = CKPT_F32;
                } else if (strcmp(json_string_value(dt), "U64") == 0) {
                        t->dtype = CKPT_U64;
                } else {
                        r = errf(err, errlen, -EBADMSG, "\"%s\": tensor \"%s\" has dtype %s; only F32 and U64 are used "
                                 "here", path, key, json_string_value(dt));
                        goto out;
                }
                t->name = key;
                t->ndims = (unsigned)json_array_size(shape);
                if (t->ndims > CKPT_MAX_DIMS) {
                        r = errf(err, errlen, -EBADMSG, "\"%s\": tensor \"%s\" has %u dimensions", path, key, t->ndims);
                        goto out;
                }
                uint64_t elems = 1;
                for (unsigned d = 0; d < t->ndims; d++) {
                        json_t *x = json_array_get(shape, d);
                        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > (1LL << 40)) {
                                r = errf(err, errlen, -EBADMSG, "\"%s\": tensor \"%s\": bad shape", path, key);
                                goto out;
                        }
                        t->shape[d] = (uint64_t)json_integer_value(x);
                        elems *= t->shape[d];
                }
                json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
                if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
                    json_integer_value(e) < json_integer_value(b)) {
                        r = errf(err, errlen, -EBADMSG, "\"%s\": tensor \"%s\": bad data_offsets", path, key);
                        goto out;
                }
                t->begin = (uint64_t)json_integer_value(b);
                t->end = (uint64_t)json_integer_value(e);
                if (t->end - t->begin != elems * dtype_sizes[t->dtype]) {
                        r = errf(err, errlen, -EBADMSG,
                                 "\"%s\": tensor \"%s\": data_offsets span %" PRIu64 " bytes, its shape needs %" PRIu64,
                                 path, key, t->end - t->begin, elems * (uint64_t)dtype_sizes[t->dtype]);
                        goto out;
                }
                order[c->n] = t;
                c->n++;
        }
        qsort(order, c->n, sizeof(*order), cmp_begin);
        uint64_t at = 0;
        for (size_t i = 0; i < c->n; i++) {
                if (order[i]->begin != at) {
                        r = errf(err, errlen, -EBADMSG, "\"%s\": tensor \"%s\" starts at byte %" PRIu64 " of the data, expected %" PRIu64,
                                 path, order[i]->name, order[i]->begin, at);
                        goto out;
                }
                at = order[i]->end;
        }
        if (at != data_len)
                r = errf(err, errlen, -EBADMSG, "\"%s\": the tensors cover %" PRIu64 " bytes of data, the file holds %zu",
                         path, at, data_len);
out:
        free(order);
        return r;
}

int ckpt_read(const char *path, uint64_t max_bytes, struct ckpt **ret, char *err, size_t errlen) {
        struct ckpt *c = calloc(1, sizeof(*c));
        if (!c)
                return errf(err, errlen, -ENOMEM, "out of memory");
        c->fd = -1;
        char *hdr = NULL;
        uint8_t len8[8];
        int r = (c->path = strdup(path)) ? open_and_sum(c, path, max_bytes, err, errlen)
                                         : errf(err, errlen, -ENOMEM, "out of memory");
        if (r < 0)
                goto fail;
        if (c->size < 8) {
                r = errf(err, errlen, -EBADMSG, "\"%s\" is %zu bytes: too short for a safetensors file", path, c->size);
                goto fail;
        }
        if ((r = read_at(c->fd, path, 0, len8, 8, err, errlen)) < 0)
                goto fail;
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++)
                hlen |= (uint64_t)len8[i] << (8 * i);
        if (hlen > HEADER_MAX || hlen > c->size - 8) {
                r = errf(err, errlen, -EBADMSG, "\"%s\": header length %" PRIu64 " does not fit the file (%zu bytes)", path,
                         hlen, c->size);
                goto fail;
        }
        if (!(hdr = malloc((size_t)hlen + 1))) {
                r = errf(err, errlen, -ENOMEM, "out of memory for the header of \"%s\"", path);
                goto fail;
        }
        if ((r = read_at(c->fd, path, 8, hdr, (size_t)hlen, err, errlen)) < 0)
                goto fail;
        json_error_t je;
        c->header = json_loadb(hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
        if (!c->header) {
                r = errf(err, errlen, -EBADMSG, "\"%s\": the header is not valid JSON: %s", path, je.text);
                goto fail;
        }
        c->data_at = 8 + hlen;
        r = parse_header(c, path, c->size - 8 - (size_t)hlen, err, errlen);
        if (r < 0)
                goto fail;
        free(hdr);
        *ret = c;
        return 0;
fail:
        free(hdr);
        ckpt_free(c);
        return r;
}

static const struct ckpt_t *find(const struct ckpt *c, const char *name) {
        for (size_t i = 0; i < c->n; i++)
                if (strcmp(c->t[i].name, name) == 0)
                        return &c->t[i];
        return NULL;
}

int ckpt_get(const struct ckpt *c, const char *name, uint32_t rows, uint32_t cols, float *dst, char *err,
             size_t errlen) {
        for (size_t i = 0; i < c->n; i++) {
                const struct ckpt_t *t = &c->t[i];
                if (strcmp(t->name, name) != 0)
                        continue;
                bool ok = t->dtype == CKPT_F32 && ((t->ndims == 2 && t->shape[0] == rows && t->shape[1] == cols) ||
                          (t->ndims == 1 && rows == 1 && t->shape[0] == cols));
                if (!ok) {
                        char shape[160] = "";
                        for (unsigned d = 0, at = 0; d < t->ndims && at < sizeof(shape) - 24; d++)
                                at += (unsigned)snprintf(shape + at, sizeof(shape) - at, "%s%" PRIu64, d ? ", " : "",
                                                         t->shape[d]);
                        return errf(err, errlen, -EINVAL, "tensor \"%s\" has %sshape [%s], the model's is [%u, %u]",
                                    name, t->dtype == CKPT_F32 ? "" : "dtype U64 and ", shape, rows, cols);
                }
                return read_at(c->fd, c->path, c->data_at + t->begin, dst, (size_t)(t->end - t->begin), err,
                               errlen);
        }
        return errf(err, errlen, -ENOENT, "no tensor \"%s\"", name);
}

int ckpt_shape(const struct ckpt *c, const char *name, enum ckpt_dtype *dtype, unsigned *ndims, uint64_t *shape) {
        const struct ckpt_t *t = find(c, name);
        if (!t)
                return -ENOENT;
        *dtype = t->dtype;
        *ndims = t->ndims;
        memcpy(shape, t->shape, t->ndims * sizeof(*shape));
        return 0;
}

int ckpt_view(struct ckpt *c, const char *name, enum ckpt_dtype *dtype, unsigned *ndims, uint64_t *shape,
              const void **data) {
        const struct ckpt_t *t = find(c, name);
        if (!t)
                return -ENOENT;
        if (!c->data) {
                /* the readers that want whole tensors (export, the evaluator) get the data section whole,
                 * as before streaming restores; a restore reads its tables with ckpt_read_rows */
                size_t len = c->size - (size_t)c->data_at;
                if (!(c->data = malloc(len ? len : 1)))
                        return -ENOMEM;
                char e[8];
                int r = read_at(c->fd, "", c->data_at, c->data, len, e, sizeof(e));
                if (r < 0) {
                        free(c->data);
                        c->data = NULL;
                        return r;
                }
        }
        *data = c->data + t->begin;
        return ckpt_shape(c, name, dtype, ndims, shape);
}

int ckpt_read_rows(const struct ckpt *c, const char *name, uint64_t first, uint64_t n, void *dst) {
        const struct ckpt_t *t = find(c, name);
        if (!t)
                return -ENOENT;
        uint64_t row = dtype_sizes[t->dtype];
        for (unsigned d = 1; d < t->ndims; d++)
                row *= t->shape[d];
        uint64_t rows = t->ndims ? t->shape[0] : 1;
        assert(first <= rows && n <= rows - first);
        char e[8];
        return read_at(c->fd, "", c->data_at + t->begin + first * row, dst, (size_t)(n * row), e, sizeof(e));
}
