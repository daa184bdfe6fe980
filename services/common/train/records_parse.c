/* One line of a record file into one record of a batch (records.h's formats): the numbers parsed
 * strictly over (pointer, length), never past the end, and a message naming the column when a line is
 * bad. Pure: no I/O, no allocation. */
#include "records-internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define CRITEO_COLUMNS (1 + RECORDS_CRITEO_DENSE + RECORDS_CRITEO_FIELDS)

/* ---- numbers: strict, over (pointer, length), never past the end ---- */

/* Copies a field into a NUL-terminated buffer; false when it does not fit (then it is no number). */
static bool field_str(const char *s, size_t len, char *buf, size_t size)
{
        if (len == 0 || len >= size || memchr(s, 0, len))
                return false;
        memcpy(buf, s, len);
        buf[len] = 0;
        return true;
}

/* A finite decimal number, nothing else in the field (no spaces, no "nan", no hex). */
bool records_parse_float(const char *s, size_t len, float *ret)
{
        char buf[64], *end;
        if (!field_str(s, len, buf, sizeof(buf)) || !strchr("+-.0123456789", buf[0]) || strpbrk(buf, "xXnN"))
                return false;
        errno = 0;
        double v = strtod(buf, &end);
        if (*end || !isfinite(v) || fabs(v) > 3.4e38)
                return false;
        *ret = (float)v;
        return true;
}

static bool parse_int(const char *s, size_t len, long long *ret)
{
        char buf[32], *end;
        if (!field_str(s, len, buf, sizeof(buf)) || !strchr("+-0123456789", buf[0]))
                return false;
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        if (*end || errno)
                return false;
        *ret = v;
        return true;
}

static bool parse_index(const char *s, size_t len, uint64_t *ret)
{
        char buf[32];
        return field_str(s, len, buf, sizeof(buf)) && parse_u64(buf, 0, UINT64_MAX, ret) == 0;
}

/* A field's text for a message: at most 40 bytes of it, quoted by the caller. */
static int shown(size_t len)
{
        return len > 40 ? 40 : (int)len;
}

/* ---- one line into record `i` of b: 0, or -EBADMSG with why (no file or line) in err ---- */

static int parse_criteo(struct records_batch *b, uint32_t i, struct records_line l, char *why, size_t wl)
{
        const char *col[CRITEO_COLUMNS + 1];
        size_t len[CRITEO_COLUMNS + 1];
        size_t n = 0;
        const char *p = l.s, *end = l.s + l.len;
        for (;;) {
                const char *t = memchr(p, '\t', (size_t)(end - p));
                if (n <= CRITEO_COLUMNS) {
                        col[n] = p;
                        len[n] = (size_t)((t ? t : end) - p);
                }
                n++;
                if (!t)
                        break;
                p = t + 1;
        }
        if (n != CRITEO_COLUMNS)
                return errf(why, wl, -EBADMSG, "%zu tab-separated columns, expected %u", n, CRITEO_COLUMNS);
        float y;
        if (!records_parse_float(col[0], len[0], &y))
                return errf(why, wl, -EBADMSG, "label '%.*s' is not a number", shown(len[0]), col[0]);
        if (y != 0 && y != 1)
                return errf(why, wl, -EBADMSG, "label '%.*s' is not 0 or 1", shown(len[0]), col[0]);
        b->label[i] = y;
        float *d = b->dense + (size_t)i * RECORDS_CRITEO_DENSE;
        for (uint32_t j = 0; j < RECORDS_CRITEO_DENSE; j++) {
                long long x = 0;
                const char *c = col[1 + j];
                if (len[1 + j] && !parse_int(c, len[1 + j], &x))
                        return errf(why, wl, -EBADMSG, "field I%u: '%.*s' is not an integer", j + 1,
                                    shown(len[1 + j]), c);
                d[j] = x > 0 ? log1pf((float)x) : 0;
        }
        uint32_t *off = b->off + (size_t)i * RECORDS_CRITEO_FIELDS, o = off[0], base = o;
        for (uint32_t f = 0; f < RECORDS_CRITEO_FIELDS; f++) {
                size_t k = 1 + RECORDS_CRITEO_DENSE + f;
                if (len[k]) {
                        if (o - base >= b->max_ids)
                                return errf(why, wl, -EBADMSG, "field C%u: more than max_ids (%u) ids", f + 1,
                                            b->max_ids);
                        b->ids[o] = records_hash(f, col[k], len[k]);
                        b->val[o++] = 1;
                }
                off[f + 1] = o;
        }
        return 0;
}

static bool is_space(char c)
{
        return c == ' ' || c == '\t';
}

static int parse_libsvm(struct records_batch *b, uint32_t i, struct records_line l, char *why, size_t wl)
{
        const char *p = l.s, *end = l.s + l.len;
        uint32_t o = b->off[i], base = o;
        bool first = true;
        for (;;) {
                while (p < end && is_space(*p))
                        p++;
                if (p == end)
                        break;
                const char *t = p;
                while (t < end && !is_space(*t))
                        t++;
                size_t n = (size_t)(t - p);
                if (first) {
                        if (!records_parse_float(p, n, &b->label[i]))
                                return errf(why, wl, -EBADMSG, "label '%.*s' is not a number", shown(n), p);
                        first = false;
                } else {
                        const char *c = memchr(p, ':', n);
                        uint64_t idx;
                        float v;
                        if (!c)
                                return errf(why, wl, -EBADMSG, "'%.*s' is not idx:val", shown(n), p);
                        if (!parse_index(p, (size_t)(c - p), &idx))
                                return errf(why, wl, -EBADMSG, "index '%.*s' is not a non-negative integer",
                                            shown((size_t)(c - p)), p);
                        if (!records_parse_float(c + 1, (size_t)(t - c - 1), &v))
                                return errf(why, wl, -EBADMSG, "value '%.*s' of index %llu is not a number",
                                            shown((size_t)(t - c - 1)), c + 1, (unsigned long long)idx);
                        if (o - base >= b->max_ids)
                                return errf(why, wl, -EBADMSG, "more than max_ids (%u) ids", b->max_ids);
                        b->ids[o] = idx;
                        b->val[o++] = v;
                }
                p = t;
        }
        b->off[i + 1] = o;
        return 0;
}

void records_trim(const char **s, size_t *n)
{
        while (*n && is_space(**s))
                (*s)++, (*n)--;
        while (*n && is_space((*s)[*n - 1]))
                (*n)--;
}

/* The comma-separated columns of a line. */
size_t records_csv_columns(struct records_line l)
{
        size_t n = 1;
        for (const char *p = l.s; (p = memchr(p, ',', (size_t)(l.s + l.len - p))); p++)
                n++;
        return n;
}

static int parse_csv(struct records_batch *b, uint32_t i, struct records_line l, char *why, size_t wl)
{
        size_t n = records_csv_columns(l);
        if (n != (size_t)b->n_dense + 1)
                return errf(why, wl, -EBADMSG, "%zu comma-separated columns, expected %u", n, b->n_dense + 1);
        const char *p = l.s, *end = l.s + l.len;
        for (uint32_t j = 0; j <= b->n_dense; j++) {
                const char *c = memchr(p, ',', (size_t)(end - p));
                const char *s = p;
                size_t len = (size_t)((c ? c : end) - p);
                records_trim(&s, &len);
                float *dst = j == 0 ? &b->label[i] : &b->dense[(size_t)i * b->n_dense + j - 1];
                if (!records_parse_float(s, len, dst)) {
                        if (j == 0)
                                return errf(why, wl, -EBADMSG, "label '%.*s' is not a number", shown(len), s);
                        return errf(why, wl, -EBADMSG, "column %u: '%.*s' is not a number", j + 1, shown(len), s);
                }
                p = c ? c + 1 : end;
        }
        return 0;
}

/* Parses l into record i of b (which has off[i * n_fields] set). */
int records_parse_line(enum records_format fmt, struct records_batch *b, uint32_t i, struct records_line l,
                       char *why, size_t wl)
{
        switch (fmt) {
        case RECORDS_CRITEO: return parse_criteo(b, i, l, why, wl);
        case RECORDS_LIBSVM: return parse_libsvm(b, i, l, why, wl);
        case RECORDS_CSV: return parse_csv(b, i, l, why, wl);
        case RECORDS_TFRECORD: break; /* records_tfrecord.c: not lines */
        }
        return -EINVAL;
}
