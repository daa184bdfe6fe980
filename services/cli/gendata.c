/* The generator behind psfleet gen-data: a planted logistic model over Zipf-distributed categorical
 * ranks and small counts (or a linear regression for CSV), its rows formatted by hand into one buffer
 * (printf per field would be most of the time) and streamed through zlib. */
#include "gendata.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "binmetrics.h"
#include "crc32c.h"
#include "rng.h"
#include "util.h"

#define DENSE RECORDS_CRITEO_DENSE
#define FIELDS RECORDS_CRITEO_FIELDS
#define CSV_DENSE 13
#define NO_RANK UINT32_MAX
#define RARE_RANK 100.0         /* weights shrink as 1 / (1 + rank / RARE_RANK): rare ids matter little */
#define LOGIT_STD 1.3           /* the planted logit's spread, for an AUC of ~0.78 */
#define POSITIVE_RATE 0.25
#define CALIBRATION_ROWS 20000
#define OUT_BUF (1u << 20)
#define ROW_MAX 4096            /* more than any row's bytes */
#define CALIBRATION_STREAM 0x63616c6962ull
#define GUIDE 65536            /* a guide table narrows the search of the cdf to a few ranks */
#define LOG1P_TABLE 1024

struct gendata {
        struct gendata_opts o;
        double *cdf;            /* (vocab) P(rank <= r) */
        uint32_t *guide;        /* (GUIDE + 1) the first rank whose cdf reaches i / GUIDE */
        uint64_t key;           /* the weights' seed */
        double field_scale[FIELDS];
        double dense_w[DENSE];
        double bias;
        double log1p[LOG1P_TABLE]; /* log1p(count): libm's is a good part of a row's time */
};


/* A uniform in [0, 1) from a key, the same everywhere. */
static double unit(uint64_t key)
{
        return (double)(rng_splitmix64(&key) >> 11) * 0x1.0p-53;
}

void gendata_token(uint32_t field, uint32_t rank, char buf[9])
{
        /* murmur3's finalizer: a bijection on 32 bits, so distinct ranks give distinct tokens */
        uint32_t h = rank ^ (field + 1) * 0x9e3779b9u;
        h = (h ^ h >> 16) * 0x85ebca6bu;
        h = (h ^ h >> 13) * 0xc2b2ae35u;
        h ^= h >> 16;
        static const char hex[] = "0123456789abcdef";
        for (int i = 7; i >= 0; i--, h >>= 4)
                buf[i] = hex[h & 15];
        buf[8] = 0;
}

double gendata_weight(const struct gendata *g, uint32_t field, uint32_t rank)
{
        double u = 2 * unit(g->key ^ (uint64_t)field << 40 ^ rank) - 1; /* variance 1/3 */
        return g->field_scale[field] * sqrt(3.0) * u / (1 + rank / RARE_RANK);
}

double gendata_bias(const struct gendata *g)
{
        return g->bias;
}

double gendata_dense_weight(const struct gendata *g, uint32_t j)
{
        return g->dense_w[j];
}

static uint32_t zipf_rank(const struct gendata *g, struct rng *r)
{
        double u = rng_uniform(r);
        size_t i = (size_t)(u * GUIDE);
        uint32_t lo = g->guide[i], hi = g->guide[i + 1];
        while (lo < hi) { /* the first rank with cdf > u */
                uint32_t mid = lo + (hi - lo) / 2;
                if (g->cdf[mid] > u)
                        hi = mid;
                else
                        lo = mid + 1;
        }
        return lo < g->o.vocab ? lo : g->o.vocab - 1;
}

static double count_log1p(const struct gendata *g, int64_t c)
{
        return c < LOG1P_TABLE ? g->log1p[c] : log1p((double)c);
}

/* One Criteo-like row: counts (-1: empty), ranks (NO_RANK: empty), and its logit less the bias. */
struct row {
        int64_t count[DENSE];
        uint32_t rank[FIELDS];
        double z;
};

static void draw_row(const struct gendata *g, struct rng *r, struct row *w)
{
        w->z = 0;
        for (uint32_t j = 0; j < DENSE; j++) {
                double empty = j % 3 == 2 ? 0.2 : 0.03;
                if (rng_uniform(r) < empty) {
                        w->count[j] = -1;
                        continue;
                }
                /* log1p(count) about uniform on [0, 1 + j % 6]: counts up to a few hundred */
                w->count[j] = (int64_t)expm1(rng_uniform(r) * (1 + j % 6));
                w->z += g->dense_w[j] * count_log1p(g, w->count[j]);
        }
        for (uint32_t f = 0; f < FIELDS; f++) {
                double empty = f % 4 == 3 ? 0.25 : 0.02;
                if (rng_uniform(r) < empty) {
                        w->rank[f] = NO_RANK;
                        continue;
                }
                w->rank[f] = zipf_rank(g, r);
                w->z += gendata_weight(g, f, w->rank[f]);
        }
}

static double sigmoid(double x)
{
        return 1 / (1 + exp(-x));
}

/* Scales the fields' weights for a logit of spread LOGIT_STD and sets the bias for POSITIVE_RATE,
 * on rows of a stream of their own. */
static int calibrate(struct gendata *g)
{
        double *z = malloc(CALIBRATION_ROWS * sizeof(double)), *d = malloc(CALIBRATION_ROWS * sizeof(double));
        if (!z || !d) {
                free(z);
                free(d);
                return -ENOMEM;
        }
        struct rng r;
        rng_init(&r, g->o.seed, CALIBRATION_STREAM);
        double sf = 0, sf2 = 0, sd = 0, sd2 = 0, n = CALIBRATION_ROWS;
        for (int i = 0; i < CALIBRATION_ROWS; i++) {
                struct row w;
                draw_row(g, &r, &w);
                double dense = 0;
                for (uint32_t j = 0; j < DENSE; j++)
                        dense += w.count[j] < 0 ? 0 : g->dense_w[j] * count_log1p(g, w.count[j]);
                z[i] = w.z - dense;
                d[i] = dense;
                sf += z[i], sf2 += z[i] * z[i], sd += d[i], sd2 += d[i] * d[i];
        }
        double vf = sf2 / n - (sf / n) * (sf / n), vd = sd2 / n - (sd / n) * (sd / n);
        double c = vf > 0 && vd < LOGIT_STD * LOGIT_STD ? sqrt((LOGIT_STD * LOGIT_STD - vd) / vf) : 1;
        for (uint32_t f = 0; f < FIELDS; f++)
                g->field_scale[f] *= c;
        double lo = -20, hi = 20;
        for (int it = 0; it < 60; it++) {
                double b = (lo + hi) / 2, p = 0;
                for (int i = 0; i < CALIBRATION_ROWS; i++)
                        p += sigmoid(b + c * z[i] + d[i]);
                if (p / n < POSITIVE_RATE)
                        lo = b;
                else
                        hi = b;
        }
        g->bias = (lo + hi) / 2;
        free(z);
        free(d);
        return 0;
}

int gendata_new(const struct gendata_opts *o, struct gendata **ret)
{
        if (o->vocab == 0 || !(o->zipf > 0) || !(o->noise >= 0) || (unsigned)o->format > RECORDS_TFRECORD)
                return -EINVAL;
        struct gendata *g = calloc(1, sizeof(*g));
        if (!g)
                return -ENOMEM;
        g->o = *o;
        uint64_t s = o->seed;
        g->key = rng_splitmix64(&s);
        for (int i = 0; i < LOG1P_TABLE; i++)
                g->log1p[i] = log1p((double)i);
        for (uint32_t j = 0; j < DENSE; j++) /* a few strong counts, a few weak, both signs */
                g->dense_w[j] = (j % 2 ? -1 : 1) * (0.05 + 0.1 * unit(g->key + 2000 + j));
        if (o->format == RECORDS_CSV) { /* features of spread 1, not log1p of counts: larger weights */
                for (uint32_t j = 0; j < DENSE; j++)
                        g->dense_w[j] *= 4;
                g->bias = 0.5;
                *ret = g;
                return 0;
        }
        /* the two tables in one block: they live as long */
        g->cdf = malloc((size_t)o->vocab * sizeof(double) + (GUIDE + 1) * sizeof(uint32_t));
        if (!g->cdf) {
                gendata_free(g);
                return -ENOMEM;
        }
        g->guide = (uint32_t *)(g->cdf + o->vocab);
        double sum = 0;
        for (uint32_t k = 0; k < o->vocab; k++)
                g->cdf[k] = sum += pow(k + 1.0, -o->zipf);
        for (uint32_t k = 0; k < o->vocab; k++)
                g->cdf[k] /= sum;
        for (uint32_t i = 0, k = 0; i <= GUIDE; i++) {
                while (k + 1 < o->vocab && g->cdf[k] <= (double)i / GUIDE)
                        k++;
                g->guide[i] = i == 0 ? 0 : k;
        }
        for (uint32_t f = 0; f < FIELDS; f++) /* fields of different strength */
                g->field_scale[f] = 0.3 + 1.4 * unit(g->key + 1000 + f);
        int e = calibrate(g);
        if (e < 0) {
                gendata_free(g);
                return e;
        }
        *ret = g;
        return 0;
}

struct gendata *gendata_free(struct gendata *g)
{
        if (g) {
                free(g->cdf);   /* and guide */
                free(g);
        }
        return NULL;
}

/* ---- formatting, by hand ---- */

static char *put_u64(char *p, uint64_t v)
{
        char tmp[20];
        int n = 0;
        do
                tmp[n++] = (char)('0' + v % 10);
        while (v /= 10);
        while (n)
                *p++ = tmp[--n];
        return p;
}

/* v with 4 decimals (v rounded so: the caller computes with what the file says). */
static char *put_fixed4(char *p, double v)
{
        long long q = llround(v * 1e4);
        if (q < 0) {
                *p++ = '-';
                q = -q;
        }
        p = put_u64(p, (uint64_t)q / 10000);
        *p++ = '.';
        uint32_t f = (uint32_t)(q % 10000);
        for (uint32_t d = 1000; d; d /= 10)
                *p++ = (char)('0' + f / d % 10);
        return p;
}

static double round4(double v)
{
        return (double)llround(v * 1e4) / 1e4;
}

static char *put_criteo(char *p, const struct row *w, int label)
{
        *p++ = (char)('0' + label);
        for (uint32_t j = 0; j < DENSE; j++) {
                *p++ = '\t';
                if (w->count[j] >= 0)
                        p = put_u64(p, (uint64_t)w->count[j]);
        }
        for (uint32_t f = 0; f < FIELDS; f++) {
                *p++ = '\t';
                if (w->rank[f] != NO_RANK) {
                        gendata_token(f, w->rank[f], p);
                        p += 8;
                }
        }
        *p++ = '\n';
        return p;
}

/* Field f's rank as index f * vocab + rank, then the counts as FIELDS * vocab + j: ascending. */
static char *put_libsvm(char *p, const struct row *w, int label, uint64_t vocab)
{
        *p++ = (char)('0' + label);
        for (uint32_t f = 0; f < FIELDS; f++) {
                if (w->rank[f] == NO_RANK)
                        continue;
                *p++ = ' ';
                p = put_u64(p, f * vocab + w->rank[f]);
                memcpy(p, ":1", 2);
                p += 2;
        }
        for (uint32_t j = 0; j < DENSE; j++) {
                if (w->count[j] <= 0)
                        continue;
                *p++ = ' ';
                p = put_u64(p, FIELDS * vocab + j);
                *p++ = ':';
                p = put_fixed4(p, log1p((double)w->count[j]));
        }
        *p++ = '\n';
        return p;
}

/* ---- tf.train.Example in TFRecord framing, encoded by hand (the reader decodes with protobuf-c) ---- */

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
        for (; v >= 0x80; v >>= 7)
                *p++ = (uint8_t)(v | 0x80);
        *p++ = (uint8_t)v;
        return p;
}

static size_t varint_len(uint64_t v)
{
        size_t n = 1;
        for (; v >= 0x80; v >>= 7)
                n++;
        return n;
}

static uint8_t *put_le32(uint8_t *p, uint32_t v)
{
        for (int i = 0; i < 4; i++)
                *p++ = (uint8_t)(v >> 8 * i);
        return p;
}

/* One entry of Features' map: key, then a Feature whose list (kind: 1 bytes_list, 2 float_list, 3
 * int64_list) holds the n bytes at c as its field 1 (one bytes value, packed floats or varints). */
static uint8_t *put_entry(uint8_t *p, const char *key, unsigned kind, const uint8_t *c, size_t n)
{
        size_t klen = strlen(key), list = 1 + varint_len(n) + n, feat = 1 + varint_len(list) + list;
        p = put_varint(p, 0x0a); /* Features.feature (1, length-delimited) */
        p = put_varint(p, 1 + varint_len(klen) + klen + 1 + varint_len(feat) + feat);
        *p++ = 0x0a;             /* key */
        p = put_varint(p, klen);
        memcpy(p, key, klen);
        p += klen;
        *p++ = 0x12;             /* value */
        p = put_varint(p, feat);
        *p++ = (uint8_t)(kind << 3 | 2);
        p = put_varint(p, list);
        *p++ = 0x0a;             /* the list's value */
        p = put_varint(p, n);
        memcpy(p, c, n);
        return p + n;
}

/* The row as an Example of "label" (int64), "I1".."I13" (float: log1p of the count as the criteo
 * reader computes it, absent when empty) and "C1".."C26" (bytes: the token, absent when empty), in a
 * TFRecord frame: the same records as the criteo row, read through data.tfrecord. */
static char *put_tfrecord(char *at, const struct row *w, int label)
{
        uint8_t feat[ROW_MAX], *p = feat, v[16], *q;
        char key[8];
        v[0] = (uint8_t)label;
        p = put_entry(p, "label", 3, v, 1);
        for (uint32_t j = 0; j < DENSE; j++) {
                if (w->count[j] < 0)
                        continue;
                float x = w->count[j] > 0 ? log1pf((float)w->count[j]) : 0;
                uint32_t bits;
                memcpy(&bits, &x, 4);
                put_le32(v, bits);
                snprintf(key, sizeof(key), "I%u", j + 1);
                p = put_entry(p, key, 2, v, 4);
        }
        for (uint32_t f = 0; f < FIELDS; f++) {
                if (w->rank[f] == NO_RANK)
                        continue;
                char tok[9];
                gendata_token(f, w->rank[f], tok);
                snprintf(key, sizeof(key), "C%u", f + 1);
                p = put_entry(p, key, 1, (const uint8_t *)tok, 8);
        }
        size_t flen = (size_t)(p - feat), len = 1 + varint_len(flen) + flen;
        uint8_t *h = (uint8_t *)at, *d = h + 12;
        for (int i = 0; i < 8; i++)
                h[i] = (uint8_t)((uint64_t)len >> 8 * i);
        put_le32(h + 8, crc32c_mask(crc32c(h, 8)));
        q = d;
        *q++ = 0x0a; /* Example.features */
        q = put_varint(q, flen);
        memcpy(q, feat, flen);
        q += flen;
        q = put_le32(q, crc32c_mask(crc32c(d, len)));
        return (char *)q;
}

/* ---- the output ---- */

struct out {
        gzFile f;
        const char *path;
        char *buf;              /* (OUT_BUF) */
        size_t n;
        uint64_t bytes;
};

static int out_flush(struct out *o, char *err, size_t errlen)
{
        if (o->n && gzwrite(o->f, o->buf, (unsigned)o->n) != (int)o->n) {
                int zerr;
                const char *msg = gzerror(o->f, &zerr);
                return errf(err, errlen, -EIO, "cannot write \"%s\": %s", o->path,
                            zerr == Z_ERRNO ? strerror(errno) : msg);
        }
        o->bytes += o->n;
        o->n = 0;
        return 0;
}

static bool ends_with(const char *s, const char *tail)
{
        size_t n = strlen(s), t = strlen(tail);
        return n >= t && strcmp(s + n - t, tail) == 0;
}

/* One row of the planted classifier (criteo, libsvm) at `at`: returns its end, with the planted
 * probability in *p and the drawn label in *y. */
static char *row_binary(const struct gendata *g, struct rng *r, char *at, double *p, double *y)
{
        struct row w;
        draw_row(g, r, &w);
        *p = sigmoid(g->bias + w.z);
        int label = rng_uniform(r) < *p;
        *y = label;
        if (g->o.format == RECORDS_TFRECORD)
                return put_tfrecord(at, &w, label);
        return g->o.format == RECORDS_CRITEO ? put_criteo(at, &w, label) : put_libsvm(at, &w, label, g->o.vocab);
}

/* One row of the regression, y = bias + sum_j w_j x_j + noise over x ~ N(0, 1): *p the planted
 * prediction, *y the label as written. */
static char *row_csv(const struct gendata *g, struct rng *r, char *at, double *p, double *y)
{
        double x[CSV_DENSE], pred = g->bias;
        for (uint32_t j = 0; j < CSV_DENSE; j++) {
                x[j] = round4(rng_normal(r));
                pred += g->dense_w[j] * x[j];
        }
        *p = pred;
        *y = round4(pred + g->o.noise * rng_normal(r));
        at = put_fixed4(at, *y);
        for (uint32_t j = 0; j < CSV_DENSE; j++) {
                *at++ = ',';
                at = put_fixed4(at, x[j]);
        }
        *at++ = '\n';
        return at;
}

/* The rows into o (a CSV header first), their (p, y) into m. */
static int write_rows(const struct gendata *g, struct out *o, struct rng *r, uint64_t rows, struct binmetrics *m,
                      uint64_t *positives, char *err, size_t errlen)
{
        bool csv = g->o.format == RECORDS_CSV;
        if (csv) {
                o->n = (size_t)snprintf(o->buf, OUT_BUF, "y");
                for (uint32_t j = 0; j < CSV_DENSE; j++)
                        o->n += (size_t)snprintf(o->buf + o->n, OUT_BUF - o->n, ",x%u", j + 1);
                o->buf[o->n++] = '\n';
        }
        float p[256], y[256];
        size_t k = 0;
        for (uint64_t i = 0; i < rows; i++) {
                double pi, yi;
                char *end = csv ? row_csv(g, r, o->buf + o->n, &pi, &yi) : row_binary(g, r, o->buf + o->n, &pi, &yi);
                o->n = (size_t)(end - o->buf);
                *positives += yi > 0.5;
                p[k] = (float)pi, y[k] = (float)yi;
                if (++k == 256 || i + 1 == rows) {
                        if (binmetrics_add(m, p, y, k) < 0)
                                return errf(err, errlen, -ENOMEM, "out of memory");
                        k = 0;
                }
                int e;
                if (o->n > OUT_BUF - ROW_MAX && (e = out_flush(o, err, errlen)) < 0)
                        return e;
        }
        return 0;
}

int gendata_write(struct gendata *g, const char *path, uint64_t rows, uint64_t stream, struct gendata_stats *st,
                  char *err, size_t errlen)
{
        struct out o = {.path = path, .buf = malloc(OUT_BUF)};
        struct binmetrics *m = NULL;
        int e = -ENOMEM;
        if (!o.buf || binmetrics_new(rows < (1u << 20) ? rows : 1u << 20, &m) < 0) {
                e = errf(err, errlen, -ENOMEM, "out of memory");
                goto out;
        }
        o.f = gzopen(path, ends_with(path, ".gz") ? "wb1" : "wbT");
        if (!o.f) {
                e = errf(err, errlen, errno ? -errno : -ENOMEM, "cannot create \"%s\": %s", path,
                         strerror(errno ? errno : ENOMEM));
                goto out;
        }
        gzbuffer(o.f, 1u << 20);
        struct rng r;
        rng_init(&r, g->o.seed, stream);
        uint64_t positives = 0;
        e = write_rows(g, &o, &r, rows, m, &positives, err, errlen);
        if (e == 0)
                e = out_flush(&o, err, errlen);
        int c = gzclose(o.f);
        if (e == 0 && c != Z_OK)
                e = errf(err, errlen, -EIO, "cannot write \"%s\": %s", path,
                         c == Z_ERRNO ? strerror(errno) : "zlib failed");
        if (e < 0) {
                unlink(path);
                goto out;
        }
        *st = (struct gendata_stats){.rows = rows, .bytes = o.bytes, .planted_rmse = NAN};
        if (g->o.format == RECORDS_CSV) {
                st->planted_rmse = binmetrics_rmse(m);
                st->positive_rate = st->planted_auc = st->planted_logloss = NAN;
        } else {
                st->positive_rate = rows ? (double)positives / (double)rows : NAN;
                st->planted_auc = binmetrics_auc(m);
                st->planted_logloss = binmetrics_logloss(m);
        }
out:
        binmetrics_free(m);
        free(o.buf);
        return e;
}

/* A number, or null where it is undefined (no rows, one class). */
static json_t *real_or_null(double v)
{
        return isfinite(v) ? json_real(v) : json_null();
}

int gendata_write_meta(const struct gendata *g, const char *path, const struct gendata_stats *st, char *err,
                       size_t errlen)
{
        json_t *o = json_object();
        json_object_set_new(o, "format", json_string(records_format_name(g->o.format)));
        json_object_set_new(o, "rows", json_integer((json_int_t)st->rows));
        json_object_set_new(o, "seed", json_integer((json_int_t)g->o.seed));
        if (g->o.format == RECORDS_CSV) {
                json_object_set_new(o, "dense", json_integer(CSV_DENSE));
                json_object_set_new(o, "noise", json_real(g->o.noise));
                json_object_set_new(o, "planted_rmse", real_or_null(st->planted_rmse));
        } else {
                json_object_set_new(o, "vocab", json_integer(g->o.vocab));
                json_object_set_new(o, "zipf", json_real(g->o.zipf));
                json_object_set_new(o, "positive_rate", real_or_null(st->positive_rate));
                json_object_set_new(o, "planted_auc", real_or_null(st->planted_auc));
                json_object_set_new(o, "planted_logloss", real_or_null(st->planted_logloss));
        }
        json_object_set_new(o, "bytes", json_integer((json_int_t)st->bytes));
        char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        json_decref(o);
        char *meta = strdup_printf("%s.meta.json", path), *line = text ? strdup_printf("%s\n", text) : NULL;
        int e = !meta || !line ? -ENOMEM : write_file_atomic(meta, line, strlen(line));
        if (e < 0)
                errf(err, errlen, e, "cannot write \"%s.meta.json\": %s", path, strerror(-e));
        free(text);
        free(meta);
        free(line);
        return e;
}
