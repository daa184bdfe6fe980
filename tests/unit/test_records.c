/* records: the three formats gzip'd and plain, shards by file and by line (disjoint, covering every
 * line), loop and epochs, bad lines (messages naming file:line, counted skips), CSV headers, max_ids,
 * and memory that does not grow with the file. */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "records.h"
#include "scratch_dir.h"
#include "unit.h"
#include "records_fixture.h"
#include "rng.h"

static char err[512];

static int setup(void **state)
{
        (void)state;
        return scratch_dir_make("records");
}

/* Writes text (len bytes) to scratch_dir/name, gzip'd or plain; returns the path (one of 16 kept). */
static const char *put(const char *name, const char *text, size_t len, bool gz)
{
        static char paths[16][320];
        static int next;
        char *path = paths[next++ % 16];
        snprintf(path, 320, "%s/%s", scratch_dir, name);
        if (gz) {
                gzFile f = gzopen(path, "wb1");
                assert_non_null(f);
                if (len)
                        assert_int_equal(gzwrite(f, text, (unsigned)len), (int)len);
                assert_int_equal(gzclose(f), Z_OK);
        } else {
                FILE *f = fopen(path, "wb");
                assert_non_null(f);
                assert_int_equal(fwrite(text, 1, len, f), len);
                assert_int_equal(fclose(f), 0);
        }
        return path;
}

static const char *puts_(const char *name, const char *text, bool gz)
{
        return put(name, text, strlen(text), gz);
}

static struct records_opts opts(enum records_format fmt, const char *const *files, uint32_t n)
{
        return (struct records_opts){.format = fmt, .files = files, .n_files = n, .worker = 0, .n_workers = 1,
                                     .max_ids = 64};
}

/* FNV-1a 64 then one splitmix64 step, as records.h spells it out, written independently. */
static uint64_t hash_ref(uint32_t field, const char *s)
{
        uint64_t h = 14695981039346656037ull;
        for (; *s; s++)
                h = (h ^ (unsigned char)*s) * 1099511628211ull;
        uint64_t z = (h ^ (uint64_t)field * 0x9e3779b97f4a7c15ull) + 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

static void test_hash(void **state)
{
        (void)state;
        assert_true(records_hash(3, "68fd1e64", 8) == hash_ref(3, "68fd1e64"));
        assert_true(records_hash(0, "", 0) == hash_ref(0, ""));
        assert_true(records_hash(0, "a", 1) != records_hash(1, "a", 1));
        assert_true(records_hash(5, "ab", 2) != records_hash(5, "ba", 2));
        assert_string_equal(records_format_name(RECORDS_CRITEO), "criteo");
        assert_string_equal(records_format_name(RECORDS_LIBSVM), "libsvm");
        assert_string_equal(records_format_name(RECORDS_CSV), "csv");
        assert_int_equal(records_format_fields(RECORDS_CRITEO), 26);
        assert_int_equal(records_format_fields(RECORDS_LIBSVM), 1);
        assert_int_equal(records_format_fields(RECORDS_CSV), 0);
}

/* A Criteo line: label, I1..I13 from ints (INT32_MIN: empty), C1..C26 "t<f>_<v>" (v < 0: empty). */
static int criteo_line(char *buf, size_t len, int label, const int *I, const int *C)
{
        int n = snprintf(buf, len, "%d", label);
        for (int j = 0; j < 13; j++)
                n += I[j] == INT32_MIN ? snprintf(buf + n, len - n, "\t") : snprintf(buf + n, len - n, "\t%d", I[j]);
        for (int f = 0; f < 26; f++)
                n += C[f] < 0 ? snprintf(buf + n, len - n, "\t") : snprintf(buf + n, len - n, "\tt%d_%d", f, C[f]);
        n += snprintf(buf + n, len - n, "\n");
        return n;
}

static void check_criteo(bool gz)
{
        int I[13], C[26];
        char text[4096];
        size_t n = 0;
        for (int line = 0; line < 3; line++) {
                for (int j = 0; j < 13; j++)
                        I[j] = (j + line) % 4 == 0 ? INT32_MIN : j == 1 ? -1 : j * 10 + line;
                for (int f = 0; f < 26; f++)
                        C[f] = (f + line) % 5 == 0 ? -1 : f * 7 + line;
                n += (size_t)criteo_line(text + n, sizeof(text) - n, line % 2, I, C);
                if (line == 0)
                        n += (size_t)snprintf(text + n, sizeof(text) - n, "\n\r\n"); /* empty lines */
        }
        const char *files[] = {put(gz ? "c.gz" : "c.tsv", text, n, gz)};
        struct records_opts o = opts(RECORDS_CRITEO, files, 1);
        struct records_reader *r = open_ok(&o);
        assert_int_equal(records_n_dense(r), 13);
        assert_int_equal(records_n_fields(r), 26);
        struct records_batch *b = batch_for(r, 8, 64);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 3);
        for (uint32_t line = 0; line < 3; line++) {
                assert_true(b->label[line] == (float)(line % 2));
                for (int j = 0; j < 13; j++) {
                        int x = (j + (int)line) % 4 == 0 ? 0 : j == 1 ? -1 : j * 10 + (int)line;
                        float want = x > 0 ? log1pf((float)x) : 0;
                        assert_true(b->dense[line * 13 + j] == want);
                }
                for (uint32_t f = 0; f < 26; f++) {
                        uint32_t lo = b->off[line * 26 + f], hi = b->off[line * 26 + f + 1];
                        if ((f + line) % 5 == 0) {
                                assert_int_equal(hi, lo);
                                continue;
                        }
                        assert_int_equal(hi, lo + 1);
                        char tok[32];
                        snprintf(tok, sizeof(tok), "t%u_%u", f, f * 7 + line);
                        assert_true(b->ids[lo] == records_hash(f, tok, strlen(tok)));
                        assert_true(b->val[lo] == 1.0f);
                }
        }
        assert_int_equal(b->off[0], 0);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 0);
        assert_int_equal(records_read(r), 3);
        assert_int_equal(records_bad_lines(r), 0);
        records_batch_free(b);
        records_close(r);
}

static void test_criteo_plain(void **state)
{
        (void)state;
        check_criteo(false);
}

static void test_criteo_gzip(void **state)
{
        (void)state;
        check_criteo(true);
}

/* The message of the one bad line of `text`, read as fmt with max_ids; checks the error and file:line. */
static void expect_bad(enum records_format fmt, const char *text, uint32_t max_ids, const char *want)
{
        const char *files[] = {puts_("bad.txt", text, false)};
        struct records_opts o = opts(fmt, files, 1);
        o.max_ids = max_ids;
        o.n_dense = fmt == RECORDS_CSV ? 2 : 0;
        struct records_reader *r = NULL;
        int e = records_open(&o, &r, err, sizeof(err));
        if (e == 0) {
                struct records_batch *b = batch_for(r, 16, max_ids);
                e = records_next(r, b, err, sizeof(err));
                records_batch_free(b);
        }
        char full[600];
        snprintf(full, sizeof(full), "%s:%s", files[0], want);
        if (e != -EBADMSG || strcmp(err, full) != 0)
                print_error("got %d \"%s\", want \"%s\"\n", e, err, full);
        assert_int_equal(e, -EBADMSG);
        assert_string_equal(err, full);
        records_close(r);
}

static void test_bad_lines_named(void **state)
{
        (void)state;
        char good[1024], line[2100];
        int I[13] = {0}, C[26] = {0};
        criteo_line(good, sizeof(good), 1, I, C);
        /* label */
        snprintf(line, sizeof(line), "%sx%s", good, good + 1);
        expect_bad(RECORDS_CRITEO, line, 64, "2: label 'x' is not a number");
        snprintf(line, sizeof(line), "%s2%s", good, good + 1);
        expect_bad(RECORDS_CRITEO, line, 64, "2: label '2' is not 0 or 1");
        /* columns: 27 */
        char *p = line + snprintf(line, sizeof(line), "%s", good), *q = p;
        q += snprintf(q, 64, "0");
        for (int i = 0; i < 26; i++)
                q += snprintf(q, 8, "\t1");
        snprintf(q, 4, "\n");
        expect_bad(RECORDS_CRITEO, line, 64, "2: 27 tab-separated columns, expected 40");
        I[2] = 0;
        criteo_line(line, sizeof(line), 0, I, C);
        char *t = strstr(line, "\t0\t0\t0");
        memcpy(t + 5, "z", 1); /* I3 */
        expect_bad(RECORDS_CRITEO, line, 64, "1: field I3: 'z' is not an integer");
        expect_bad(RECORDS_CRITEO, good, 25, "1: field C26: more than max_ids (25) ids");
        /* LIBSVM */
        expect_bad(RECORDS_LIBSVM, "1 3:1\n\n1 2:0.5 7\n", 64, "3: '7' is not idx:val");
        expect_bad(RECORDS_LIBSVM, "1 -3:1\n", 64, "1: index '-3' is not a non-negative integer");
        expect_bad(RECORDS_LIBSVM, "0 3:nan\n", 64, "1: value 'nan' of index 3 is not a number");
        expect_bad(RECORDS_LIBSVM, "one 3:1\n", 64, "1: label 'one' is not a number");
        expect_bad(RECORDS_LIBSVM, "1 1:1 2:1 3:1\n", 2, "1: more than max_ids (2) ids");
        /* CSV */
        expect_bad(RECORDS_CSV, "1,2,3\n1,2\n", 64, "2: 2 comma-separated columns, expected 3");
        expect_bad(RECORDS_CSV, "1,2,3\n0,,1\n", 64, "2: column 2: '' is not a number");
        expect_bad(RECORDS_CSV, "1,2,3\n0,1,1e999\n", 64, "2: column 3: '1e999' is not a number");
}

static void test_libsvm(void **state)
{
        (void)state;
        for (int gz = 0; gz < 2; gz++) {
                const char *files[] = {puts_(gz ? "l.gz" : "l.svm",
                                             "1 3:1 18446744073709551615:0.5\n"
                                             "-1\t 7:2.5e-1   2:-3\n"
                                             "0.25\n"
                                             "\n"
                                             "0 5:1", gz)};
                struct records_opts o = opts(RECORDS_LIBSVM, files, 1);
                struct records_reader *r = open_ok(&o);
                assert_int_equal(records_n_dense(r), 0);
                assert_int_equal(records_n_fields(r), 1);
                struct records_batch *b = batch_for(r, 3, 64);
                assert_int_equal(records_next(r, b, err, sizeof(err)), 3);
                assert_true(b->label[0] == 1 && b->label[1] == -1 && b->label[2] == 0.25f);
                uint32_t want_off[] = {0, 2, 4, 4};
                for (int i = 0; i < 4; i++)
                        assert_int_equal(b->off[i], want_off[i]);
                assert_true(b->ids[0] == 3 && b->val[0] == 1);
                assert_true(b->ids[1] == UINT64_MAX && b->val[1] == 0.5f);
                assert_true(b->ids[2] == 7 && b->val[2] == 0.25f);
                assert_true(b->ids[3] == 2 && b->val[3] == -3);
                assert_int_equal(records_next(r, b, err, sizeof(err)), 1); /* the last line, no newline */
                assert_true(b->label[0] == 0 && b->off[1] == 1 && b->ids[0] == 5);
                assert_int_equal(records_next(r, b, err, sizeof(err)), 0);
                records_batch_free(b);
                records_close(r);
        }
}

static void test_csv_header_and_count(void **state)
{
        (void)state;
        for (int gz = 0; gz < 2; gz++) {
                const char *files[] = {
                        puts_(gz ? "a.csv.gz" : "a.csv", "y, x1, x2\n1.5, 2, -3\n-0.5,4e1,5\n", gz),
                        puts_(gz ? "b.csv.gz" : "b.csv", "7,8,9\r\n", gz), /* no header: its first line is data */
                };
                struct records_opts o = opts(RECORDS_CSV, files, 2);
                struct records_reader *r = open_ok(&o);
                assert_int_equal(records_n_dense(r), 2);
                assert_int_equal(records_n_fields(r), 0);
                struct records_batch *b = batch_for(r, 10, 64);
                assert_int_equal(records_next(r, b, err, sizeof(err)), 3);
                float want[] = {1.5f, 2, -3, -0.5f, 40, 5, 7, 8, 9};
                for (int i = 0; i < 3; i++) {
                        assert_true(b->label[i] == want[3 * i]);
                        assert_true(b->dense[2 * i] == want[3 * i + 1] && b->dense[2 * i + 1] == want[3 * i + 2]);
                }
                records_batch_free(b);
                records_close(r);
        }
        /* n_dense given and the first record disagrees: records_open fails, naming the line */
        const char *files[] = {puts_("c.csv", "y,a\n1,2\n", false)};
        struct records_opts o = opts(RECORDS_CSV, files, 1);
        o.n_dense = 3;
        struct records_reader *r = NULL;
        assert_int_equal(records_open(&o, &r, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "c.csv:2: 2 comma-separated columns, expected 4"));
        assert_null(r);
        /* skip_bad: the reader opens, and the line is counted when read */
        o.skip_bad = true;
        r = open_ok(&o);
        struct records_batch *b = batch_for(r, 4, 64);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 0);
        assert_int_equal(records_bad_lines(r), 1);
        records_batch_free(b);
        records_close(r);
}

static void test_open_errors(void **state)
{
        (void)state;
        struct records_reader *r = NULL;
        char missing[320];
        snprintf(missing, sizeof(missing), "%s/nope", scratch_dir);
        const char *files[] = {missing};
        struct records_opts o = opts(RECORDS_LIBSVM, files, 1);
        assert_int_equal(records_open(&o, &r, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, missing));
        files[0] = scratch_dir;
        assert_int_equal(records_open(&o, &r, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "not a regular file"));
        /* any file of the shard, not only its first */
        const char *two[] = {puts_("here.svm", "1 1:1\n", false), missing};
        o.files = two, o.n_files = 2;
        assert_int_equal(records_open(&o, &r, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, missing));
        o.worker = 0, o.n_workers = 2; /* by file: the missing one is the other worker's */
        r = open_ok(&o);
        r = records_close(r);
        o.files = files, o.n_files = 1, o.n_workers = 1;
        o.n_files = 0;
        assert_int_equal(records_open(&o, &r, err, sizeof(err)), -EINVAL);
        o.n_files = 1;
        o.worker = 2, o.n_workers = 2;
        assert_int_equal(records_open(&o, &r, err, sizeof(err)), -EINVAL);
        assert_null(r);
        /* the first record bad */
        files[0] = puts_("first.svm", "x 1:1\n1 2:1\n", false);
        o.worker = 0, o.n_workers = 1;
        assert_int_equal(records_open(&o, &r, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "first.svm:1: label 'x' is not a number"));
        /* a batch made for another reader */
        files[0] = puts_("ok.svm", "1 2:1\n", false);
        r = open_ok(&o);
        struct records_batch *b;
        assert_int_equal(records_batch_new(0, 0, 1, 64, &b), -EINVAL);
        assert_int_equal(records_batch_new(4, 0, 1, 63, &b), 0);
        assert_int_equal(records_next(r, b, err, sizeof(err)), -EINVAL);
        records_batch_free(b);
        records_close(r);
        records_close(NULL);
        records_batch_free(NULL);
}

/* A file removed after records_open: a read error even with skip_bad (not a bad line), naming it; the
 * records before it stay in the batch and reading goes on with the next file. */
static void test_file_gone(void **state)
{
        (void)state;
        const char *files[] = {puts_("g1.svm", "1 1:1\n0 2:1\n", false), puts_("g2.svm", "1 3:1\n", false),
                               puts_("g3.svm", "0 4:1\n", true)};
        struct records_opts o = opts(RECORDS_LIBSVM, files, 3);
        o.skip_bad = true;
        struct records_reader *r = open_ok(&o);
        assert_int_equal(unlink(files[1]), 0);
        struct records_batch *b = batch_for(r, 10, 64);
        assert_int_equal(records_next(r, b, err, sizeof(err)), -EIO);
        assert_non_null(strstr(err, files[1]));
        assert_int_equal(b->n, 2);
        assert_true(b->ids[0] == 1 && b->ids[1] == 2);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 1);
        assert_true(b->ids[0] == 4);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 0);
        assert_int_equal(records_read(r), 3);
        assert_int_equal(records_bad_lines(r), 0);
        records_batch_free(b);
        records_close(r);
}

static void test_skip_bad(void **state)
{
        (void)state;
        const char *files[] = {puts_("s.svm", "1 1:1\nbad\n0 2:1\n1 x\n\n0 3:1 4:1 5:1\n1 6:1\n", false)};
        struct records_opts o = opts(RECORDS_LIBSVM, files, 1);
        o.skip_bad = true;
        o.max_ids = 2;
        struct records_reader *r = open_ok(&o);
        struct records_batch *b = batch_for(r, 10, 2);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 3);
        assert_true(b->ids[0] == 1 && b->ids[1] == 2 && b->ids[2] == 6);
        assert_int_equal(b->off[3], 3);
        assert_int_equal(records_bad_lines(r), 3);
        records_batch_free(b);
        records_close(r);
        /* without skip: the error, then reading goes on after the bad line */
        o.skip_bad = false;
        r = open_ok(&o);
        b = batch_for(r, 10, 2);
        assert_int_equal(records_next(r, b, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "s.svm:2: label 'bad' is not a number"));
        assert_int_equal(b->n, 1); /* the record before it */
        assert_true(b->ids[0] == 1);
        assert_int_equal(records_next(r, b, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "s.svm:4: 'x' is not idx:val"));
        assert_int_equal(records_next(r, b, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "s.svm:6: more than max_ids (2) ids"));
        assert_int_equal(records_next(r, b, err, sizeof(err)), 1);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 0);
        records_batch_free(b);
        records_close(r);
}

static void test_long_line(void **state)
{
        (void)state;
        size_t big = (3u << 20) / 2; /* 1.5 MiB: past the 1 MiB line limit */
        size_t n = big + 64;
        char *text = malloc(n);
        size_t k = (size_t)snprintf(text, n, "1 1:1\n0");
        while (k < big)
                k += (size_t)snprintf(text + k, n - k, " 9:1");
        k += (size_t)snprintf(text + k, n - k, "\n0 2:1\n");
        for (int gz = 0; gz < 2; gz++) {
                const char *files[] = {put(gz ? "long.gz" : "long.svm", text, k, gz)};
                struct records_opts o = opts(RECORDS_LIBSVM, files, 1);
                struct records_reader *r = open_ok(&o);
                struct records_batch *b = batch_for(r, 10, 64);
                assert_int_equal(records_next(r, b, err, sizeof(err)), -EBADMSG);
                assert_non_null(strstr(err, ":2: a line longer than 1048576 bytes"));
                assert_int_equal(records_next(r, b, err, sizeof(err)), 1);
                assert_true(b->ids[0] == 2 && b->label[0] == 0);
                records_batch_free(b);
                records_close(r);
        }
        free(text);
}

static void test_corrupt_gzip(void **state)
{
        (void)state;
        char text[20000];
        size_t n = 0;
        for (int i = 0; i < 1000; i++)
                n += (size_t)snprintf(text + n, sizeof(text) - n, "%d,%d\n", i % 2, i);
        const char *path = put("cut.csv.gz", text, n, true);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(truncate(path, st.st_size - 12), 0); /* the trailer and a little data */
        const char *files[] = {path};
        struct records_opts o = opts(RECORDS_CSV, files, 1);
        struct records_reader *r = open_ok(&o);
        struct records_batch *b = batch_for(r, 4096, 64);
        int e;
        while ((e = records_next(r, b, err, sizeof(err))) > 0)
                ;
        assert_int_equal(e, -EIO);
        assert_non_null(strstr(err, "cut.csv.gz"));
        records_batch_free(b);
        records_close(r);
        /* garbage after a gzip header */
        char junk[64] = "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" "this is not deflate data at all, no";
        files[0] = put("junk.gz", junk, sizeof(junk), false);
        r = NULL;
        e = records_open(&o, &r, err, sizeof(err));
        assert_int_equal(e, -EIO);
        assert_non_null(strstr(err, "junk.gz: corrupt gzip stream"));
}

/* Writes n CSV lines "label,id" to each of the files, id numbering every line of all files; every
 * 7th line empty and every 11th bad, so that the shards are seen not to depend on them. */
static void write_numbered(const char **files, uint32_t n_files, uint32_t lines, bool gz)
{
        static char names[8][32];
        uint32_t id = 0;
        for (uint32_t f = 0; f < n_files; f++) {
                size_t cap = (size_t)lines * 32 + 1, k = 0;
                char *text = malloc(cap);
                for (uint32_t i = 0; i < lines; i++, id++)
                        k += (size_t)(i % 7 == 3   ? snprintf(text + k, cap - k, "\n")
                                      : i % 11 == 5 ? snprintf(text + k, cap - k, "bad,%u\n", id)
                                                    : snprintf(text + k, cap - k, "%u,%u\n", id % 2, id));
                snprintf(names[f], sizeof(names[f]), "n%u%s", f, gz ? ".gz" : ".csv");
                files[f] = put(names[f], text, k, gz);
                free(text);
        }
}

/* Reads the whole shard of each worker; every good line's id must come exactly once. */
static void check_shards(uint32_t n_files, uint32_t n_workers, uint32_t lines, bool gz)
{
        const char *files[8];
        write_numbered(files, n_files, lines, gz);
        uint32_t total = n_files * lines;
        uint8_t *seen = calloc(total, 1);
        uint64_t bad = 0;
        for (uint32_t w = 0; w < n_workers; w++) {
                struct records_opts o = opts(RECORDS_CSV, files, n_files);
                o.worker = w, o.n_workers = n_workers, o.skip_bad = true;
                struct records_reader *r = open_ok(&o);
                assert_int_equal(records_n_dense(r), 1);
                struct records_batch *b = batch_for(r, 5, 64);
                int n;
                while ((n = records_next(r, b, err, sizeof(err))) > 0)
                        for (int i = 0; i < n; i++) {
                                uint32_t id = (uint32_t)b->dense[i];
                                assert_true(id < total);
                                uint32_t file = id / lines, line = id % lines;
                                /* by file: i % W; by line: line % W */
                                assert_int_equal(n_files >= n_workers ? file % n_workers : line % n_workers, w);
                                assert_int_equal(seen[id], 0);
                                seen[id] = 1;
                        }
                assert_int_equal(n, 0);
                bad += records_bad_lines(r);
                records_batch_free(b);
                records_close(r);
        }
        uint64_t want_bad = 0;
        for (uint32_t id = 0; id < total; id++) {
                uint32_t i = id % lines;
                bool empty = i % 7 == 3, isbad = !empty && i % 11 == 5;
                want_bad += isbad;
                assert_int_equal(seen[id], !empty && !isbad);
        }
        assert_int_equal(bad, want_bad);
        free(seen);
}

static void test_shard_by_file(void **state)
{
        (void)state;
        check_shards(5, 3, 40, false);
        check_shards(4, 4, 30, true);
}

static void test_shard_by_line(void **state)
{
        (void)state;
        check_shards(2, 3, 100, false);
        check_shards(1, 4, 77, true);
        check_shards(3, 7, 50, false);
}

static void test_loop_epochs(void **state)
{
        (void)state;
        const char *files[] = {puts_("e1.csv", "0,0\n0,1\n", false), puts_("e2.csv", "0,2\n\n0,3\n0,4\n", true)};
        struct records_opts o = opts(RECORDS_CSV, files, 2);
        o.loop = true;
        struct records_reader *r = open_ok(&o);
        struct records_batch *b = batch_for(r, 3, 64);
        for (int i = 0; i < 20; i++) {
                assert_int_equal(records_next(r, b, err, sizeof(err)), 3); /* full batches across epochs */
                for (int k = 0; k < 3; k++)
                        assert_true(b->dense[k] == (float)((3 * i + k) % 5));
                assert_int_equal(records_epoch(r), (3 * i + 2) / 5);
        }
        assert_int_equal(records_read(r), 60);
        records_batch_free(b);
        records_close(r);
        /* a shard of one file rewinds in place (no open per pass): the file may even be gone */
        files[0] = puts_("one.csv", "0,7\n0,8\n", true);
        o.n_files = 1;
        r = open_ok(&o);
        b = batch_for(r, 3, 64);
        assert_int_equal(unlink(files[0]), 0);
        for (int i = 0; i < 4; i++) {
                assert_int_equal(records_next(r, b, err, sizeof(err)), 3);
                assert_true(b->dense[0] == (float)(7 + (3 * i) % 2));
        }
        assert_int_equal(records_epoch(r), 5);
        records_batch_free(b);
        records_close(r);
        /* a pass without records ends even with loop */
        files[0] = puts_("allbad.csv", "0,1\nx,1\n\n", false);
        o.n_files = 1, o.worker = 1, o.n_workers = 2, o.skip_bad = true;
        r = open_ok(&o);
        b = batch_for(r, 3, 64);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 0);
        assert_int_equal(records_bad_lines(r), 1);
        records_batch_free(b);
        records_close(r);
}

/* Reads every record of r, in batches of 7, into order (labels); checks each record's ids travel with it. */
static uint32_t read_labels(struct records_reader *r, uint32_t *order, uint32_t cap)
{
        struct records_batch *b = batch_for(r, 7, 64);
        uint32_t n = 0;
        int k;
        while ((k = records_next(r, b, err, sizeof(err))) > 0)
                for (int i = 0; i < k; i++) {
                        uint32_t label = (uint32_t)b->label[i];
                        assert_true(n < cap);
                        order[n++] = label;
                        assert_int_equal(b->off[i + 1] - b->off[i], label % 5);
                        for (uint32_t j = b->off[i]; j < b->off[i + 1]; j++) {
                                assert_true(b->ids[j] == (uint64_t)label * 8 + (j - b->off[i]));
                                assert_true(b->val[j] == (float)(j - b->off[i] + 1));
                        }
                }
        assert_int_equal(k, 0);
        records_batch_free(b);
        return n;
}

/* data.shuffle_buffer: every record once per pass, each with its own ids, none given before it could
 * have been read (at most the buffer's size ahead), the same order for the same seed, and across the
 * files' boundary and the epochs' when looping. */
static void test_shuffle(void **state)
{
        (void)state;
        enum { N = 1000, BUF = 64 };
        char *text = malloc(N * 64);
        size_t len = 0;
        for (uint32_t i = 0; i < N; i++) {
                len += (size_t)snprintf(text + len, 64, "%u", i);
                for (uint32_t k = 0; k < i % 5; k++)
                        len += (size_t)snprintf(text + len, 64, " %u:%u", i * 8 + k, k + 1);
                text[len++] = '\n';
        }
        /* two files: the first half of the lines, then the rest */
        size_t cut = 0;
        for (uint32_t nl = 0; cut < len && nl < N / 2; cut++)
                nl += text[cut] == '\n';
        const char *files[] = {put("s1.svm", text, cut, false), put("s2.svm.gz", text + cut, len - cut, true)};
        free(text);
        uint32_t order[2 * N], again[2 * N];
        struct records_opts o = opts(RECORDS_LIBSVM, files, 2);
        o.shuffle = BUF, o.seed = 7;
        struct records_reader *r = open_ok(&o);
        assert_int_equal(read_labels(r, order, 2 * N), N);
        records_close(r);
        uint8_t seen[N] = {0};
        uint32_t moved = 0;
        for (uint32_t p = 0; p < N; p++) {
                assert_true(order[p] < N);
                assert_int_equal(seen[order[p]]++, 0);
                assert_true(order[p] < p + BUF);   /* read at most the buffer ahead of what was given */
                moved += order[p] != p;
        }
        assert_true(moved > N * 9 / 10);
        /* the same seed, the same order; another seed, another */
        r = open_ok(&o);
        assert_int_equal(read_labels(r, again, 2 * N), N);
        records_close(r);
        assert_memory_equal(order, again, N * sizeof(*order));
        o.seed = 8;
        r = open_ok(&o);
        assert_int_equal(read_labels(r, again, 2 * N), N);
        records_close(r);
        assert_true(memcmp(order, again, N * sizeof(*order)) != 0);
        /* a buffer of 1 (or 0): the files' order */
        o.shuffle = 1;
        r = open_ok(&o);
        assert_int_equal(read_labels(r, order, 2 * N), N);
        records_close(r);
        for (uint32_t p = 0; p < N; p++)
                assert_int_equal(order[p], p);
        /* looping: two passes' worth holds every record twice, the buffer mixing across the epochs */
        o.shuffle = BUF, o.loop = true;
        r = open_ok(&o);
        struct records_batch *b = batch_for(r, 8, 64);
        uint8_t times[N] = {0};
        for (uint32_t got = 0; got < 2 * N;) {
                int k = records_next(r, b, err, sizeof(err));
                assert_int_equal(k, 8);
                for (int i = 0; i < k && got < 2 * N; i++, got++)
                        times[(uint32_t)b->label[i]]++;
        }
        uint32_t twice = 0;
        for (uint32_t i = 0; i < N; i++)
                twice += times[i] == 2;
        assert_true(twice > N * 9 / 10);   /* the last BUF read may still wait in the buffer */
        assert_int_equal(records_epoch(r), 2);
        records_batch_free(b);
        records_close(r);
}

/* 10^5 lines (about 8 MB, gzip'd and plain): what the reader holds stays far below the file's size. */
static void test_bounded_memory(void **state)
{
        (void)state;
        uint32_t lines = 100000;
        size_t cap = (size_t)lines * 96, k = 0;
        char *text = malloc(cap);
        struct rng g;
        rng_init(&g, 1, 0);
        for (uint32_t i = 0; i < lines; i++) {
                k += (size_t)snprintf(text + k, cap - k, "%u", i % 2);
                for (int j = 0; j < 8; j++)
                        k += (size_t)snprintf(text + k, cap - k, " %u:1", rng_below(&g, 1000000));
                k += (size_t)snprintf(text + k, cap - k, "\n");
        }
        for (int gz = 0; gz < 2; gz++) {
                const char *files[] = {put(gz ? "big.gz" : "big.svm", text, k, gz)};
                size_t before = heap_in_use(), peak = 0;
                struct records_opts o = opts(RECORDS_LIBSVM, files, 1);
                struct records_reader *r = open_ok(&o);
                struct records_batch *b = batch_for(r, 256, 64);
                uint64_t n = 0;
                int got;
                while ((got = records_next(r, b, err, sizeof(err))) > 0) {
                        n += (uint64_t)got;
                        size_t now = heap_in_use() - before;
                        peak = now > peak ? now : peak;
                }
                assert_int_equal(got, 0);
                assert_int_equal(n, lines);
                /* batch (~200 KB) + read buffer + zlib's state; the file is ~8 MB. (mallinfo2 reads 0
                 * under the sanitizers, which then check leaks instead.) */
                assert_true(peak < (2u << 20));
                assert_true(k > (6u << 20));
                records_batch_free(b);
                records_close(r);
        }
        free(text);
}

UNIT_TEST_MAIN(setup, scratch_dir_remove,
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_criteo_plain),
        cmocka_unit_test(test_criteo_gzip),
        cmocka_unit_test(test_bad_lines_named),
        cmocka_unit_test(test_libsvm),
        cmocka_unit_test(test_csv_header_and_count),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_skip_bad),
        cmocka_unit_test(test_file_gone),
        cmocka_unit_test(test_long_line),
        cmocka_unit_test(test_corrupt_gzip),
        cmocka_unit_test(test_shuffle),
        cmocka_unit_test(test_shard_by_file),
        cmocka_unit_test(test_shard_by_line),
        cmocka_unit_test(test_loop_epochs),
        cmocka_unit_test(test_bounded_memory))
