/* Checkpoint files in the safetensors format: the bytes on disk (header length, JSON, alignment,
 * contiguous offsets), reading back, and every way a file can be refused. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include "scratch_dir.h"

#include "ckpt.h"
#include "crc32c.h"
#include "util.h"

static const float A[6] = {1, 2, 3, 4, 5, 6};       /* (2, 3) */
static const float B[4] = {-1, 0.5f, 1e-30f, 7};    /* (1, 4) */

static int setup(void **state) {
        (void)state;
        return scratch_dir_make("ckpt");
}

static char *path_of(const char *name) {
        char *p = strdup_printf("%s/%s", scratch_dir, name);
        assert_non_null(p);
        return p;
}

static void write_two(const char *path, struct ckpt_written *w) {
        const struct ckpt_tensor t[] = {{"dense0/kernel", 2, 3, A, CKPT_F32, 2}, {"dense0/bias", 1, 4, B, CKPT_F32, 2}};
        const struct ckpt_kv meta[] = {{"global_step", "42"}, {"optimizer", "sgd"}};
        char err[256];
        assert_int_equal(ckpt_write(path, t, 2, meta, 2, w, err, sizeof(err)), 0);
}

static uint8_t *slurp(const char *path, size_t *len) {
        char *d;
        assert_int_equal(read_file(path, 1 << 24, &d, len), 0);
        return (uint8_t *)d;
}

static void spit(const char *path, const void *d, size_t n) {
        assert_int_equal(write_file_atomic(path, d, n), 0);
}

static void test_layout_on_disk(void **state) {
        (void)state;
        char *p = path_of("a.safetensors");
        struct ckpt_written w;
        write_two(p, &w);
        size_t len;
        uint8_t *d = slurp(p, &len);
        assert_int_equal(w.bytes, len);
        assert_int_equal(w.crc32c, crc32c(d, len));
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++)
                hlen |= (uint64_t)d[i] << (8 * i);
        assert_int_equal(hlen % 8, 0);                  /* data starts 8-byte aligned */
        assert_int_equal(len, 8 + hlen + sizeof(A) + sizeof(B));
        assert_int_equal(d[8], '{');
        json_error_t je;
        json_t *h = json_loadb((const char *)d + 8, hlen, 0, &je);
        assert_non_null(h);
        json_t *k = json_object_get(h, "dense0/kernel"), *b = json_object_get(h, "dense0/bias");
        assert_string_equal(json_string_value(json_object_get(k, "dtype")), "F32");
        assert_int_equal(json_integer_value(json_array_get(json_object_get(k, "shape"), 0)), 2);
        assert_int_equal(json_integer_value(json_array_get(json_object_get(k, "shape"), 1)), 3);
        assert_int_equal(json_integer_value(json_array_get(json_object_get(k, "data_offsets"), 0)), 0);
        assert_int_equal(json_integer_value(json_array_get(json_object_get(k, "data_offsets"), 1)), 24);
        assert_int_equal(json_integer_value(json_array_get(json_object_get(b, "data_offsets"), 0)), 24);
        assert_int_equal(json_integer_value(json_array_get(json_object_get(b, "data_offsets"), 1)), 40);
        assert_string_equal(json_string_value(json_object_get(json_object_get(h, "__metadata__"), "global_step")), "42");
        assert_memory_equal(d + 8 + hlen, A, sizeof(A));
        assert_memory_equal(d + 8 + hlen + sizeof(A), B, sizeof(B));
        json_decref(h);
        free(d);
        /* no temp file is left behind */
        char *tmp = ckpt_temp_path(p);
        assert_int_equal(access(tmp, F_OK), -1);
        assert_int_equal(strcmp(tmp + strlen(scratch_dir), "/.a.safetensors.tmp"), 0);
        free(tmp);
        free(p);
}

static void test_read_back(void **state) {
        (void)state;
        char *p = path_of("b.safetensors");
        struct ckpt_written w;
        write_two(p, &w);
        struct ckpt *c;
        char err[256];
        assert_int_equal(ckpt_read(p, 1 << 20, &c, err, sizeof(err)), 0);
        assert_int_equal(ckpt_bytes(c), w.bytes);
        assert_int_equal(ckpt_crc32c(c), w.crc32c);
        assert_int_equal(ckpt_n_tensors(c), 2);
        assert_string_equal(ckpt_meta(c, "optimizer"), "sgd");
        assert_null(ckpt_meta(c, "nope"));
        float a[6], b[4];
        assert_int_equal(ckpt_get(c, "dense0/kernel", 2, 3, a, err, sizeof(err)), 0);
        assert_memory_equal(a, A, sizeof(A));
        assert_int_equal(ckpt_get(c, "dense0/bias", 1, 4, b, err, sizeof(err)), 0);
        assert_memory_equal(b, B, sizeof(B));
        assert_int_equal(ckpt_get(c, "dense0/kernel", 3, 2, a, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "[2, 3]"));
        assert_int_equal(ckpt_get(c, "dense1/kernel", 2, 3, a, err, sizeof(err)), -ENOENT);
        ckpt_free(c);
        assert_null(ckpt_free(NULL));
        char sum[32];
        assert_string_equal(ckpt_format_checksum(0x1a2b3c4d, sum, sizeof(sum)), "crc32c:1a2b3c4d");
        free(p);
}

/* An embedding table's ids: U64 of one dimension beside F32 rows, read back where they lie; ckpt_get
 * (the dense variables' reader) refuses them. */
static void test_u64_ids(void **state) {
        (void)state;
        char *p = path_of("ids.safetensors");
        const uint64_t ids[3] = {7, 1ull << 63, 42};
        const struct ckpt_tensor t[] = {{"emb/cat/ids", 3, 1, ids, CKPT_U64, 1}, {"emb/cat", 3, 2, A, CKPT_F32, 2}};
        struct ckpt_written w;
        char err[256];
        assert_int_equal(ckpt_write(p, t, 2, NULL, 0, &w, err, sizeof(err)), 0);
        assert_int_equal(w.bytes % 8, 0);
        struct ckpt *c;
        assert_int_equal(ckpt_read(p, 1 << 20, &c, err, sizeof(err)), 0);
        enum ckpt_dtype dt;
        unsigned nd;
        uint64_t shape[CKPT_MAX_DIMS], got[3];
        const void *data;
        assert_int_equal(ckpt_view(c, "emb/cat/ids", &dt, &nd, shape, &data), 0);
        assert_int_equal(dt, CKPT_U64);
        assert_int_equal(nd, 1);
        assert_int_equal(shape[0], 3);
        memcpy(got, data, sizeof(got));
        assert_memory_equal(got, ids, sizeof(ids));
        assert_int_equal(ckpt_view(c, "emb/cat", &dt, &nd, shape, &data), 0);
        assert_int_equal(dt, CKPT_F32);
        assert_int_equal(nd, 2);
        assert_int_equal(shape[1], 2);
        assert_int_equal(ckpt_view(c, "emb/dog", &dt, &nd, shape, &data), -ENOENT);
        float f[3];
        assert_int_equal(ckpt_get(c, "emb/cat/ids", 1, 3, f, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "U64"));
        ckpt_free(c);
        free(p);
}

/* A file another writer made: a 1-D bias (as other frameworks store it), extra spaces, any key order. */
static void test_foreign_file(void **state) {
        (void)state;
        const char hdr[] = "{\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                           "\"__metadata__\":{\"x\":\"y\"}}   ";
        uint8_t buf[8 + sizeof(hdr) - 1 + 16];
        uint64_t hl = sizeof(hdr) - 1;
        for (int i = 0; i < 8; i++)
                buf[i] = (uint8_t)(hl >> (8 * i));
        memcpy(buf + 8, hdr, hl);
        memcpy(buf + 8 + hl, B, 16);
        char *p = path_of("foreign.safetensors");
        spit(p, buf, sizeof(buf));
        struct ckpt *c;
        char err[256];
        assert_int_equal(ckpt_read(p, 1 << 20, &c, err, sizeof(err)), 0);
        float b[4];
        assert_int_equal(ckpt_get(c, "b", 1, 4, b, err, sizeof(err)), 0);
        assert_memory_equal(b, B, 16);
        assert_int_equal(ckpt_get(c, "b", 2, 2, b, err, sizeof(err)), -EINVAL);
        ckpt_free(c);
        free(p);
}

static void expect_bad(const char *name, const void *d, size_t n, const char *why) {
        char *p = path_of(name);
        spit(p, d, n);
        struct ckpt *c = NULL;
        char err[256] = "";
        assert_int_equal(ckpt_read(p, 1 << 20, &c, err, sizeof(err)), -EBADMSG);
        assert_null(c);
        if (!strstr(err, why))
                fail_msg("%s: expected \"%s\" in \"%s\"", name, why, err);
        free(p);
}

static void with_header(const char *name, const char *hdr, size_t data_len, const char *why) {
        size_t hl = strlen(hdr), n = 8 + hl + data_len;
        uint8_t *buf = calloc(1, n);
        for (int i = 0; i < 8; i++)
                buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
        memcpy(buf + 8, hdr, hl);
        expect_bad(name, buf, n, why);
        free(buf);
}

static void test_refused(void **state) {
        (void)state;
        expect_bad("short", "abc", 3, "too short");
        uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0};
        expect_bad("huge", huge, sizeof(huge), "header length");
        with_header("notjson", "{nope", 0, "not valid JSON");
        with_header("array", "[1,2]", 0, "not a JSON object");
        with_header("f16", "{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "dtype F16");
        with_header("size", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "its shape needs 8");
        with_header("gap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "starts at byte 4");
        with_header("tail", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "cover 4 bytes");
        with_header("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "starts at byte 4");
        with_header("meta", "{\"__metadata__\":{\"a\":1}}", 0, "not a string");
        with_header("dup", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                           "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "not valid JSON");

        /* truncated: a write cut short is refused, not read as zeros */
        char *p = path_of("whole.safetensors");
        struct ckpt_written w;
        write_two(p, &w);
        size_t len;
        uint8_t *d = slurp(p, &len);
        expect_bad("truncated", d, len - 4, "cover 40 bytes");
        free(d);
        free(p);

        struct ckpt *c = NULL;
        char err[256];
        char *missing = path_of("missing.safetensors");
        assert_int_equal(ckpt_read(missing, 1 << 20, &c, err, sizeof(err)), -ENOENT);
        free(missing);
}

/* A flipped data byte still parses: only the checksum tells, so the caller compares it. */
static void test_bit_flip_changes_checksum(void **state) {
        (void)state;
        char *p = path_of("flip.safetensors");
        struct ckpt_written w;
        write_two(p, &w);
        size_t len;
        uint8_t *d = slurp(p, &len);
        d[len - 3] ^= 0x10;
        spit(p, d, len);
        struct ckpt *c;
        char err[256];
        assert_int_equal(ckpt_read(p, 1 << 20, &c, err, sizeof(err)), 0);
        assert_int_not_equal(ckpt_crc32c(c), w.crc32c);
        ckpt_free(c);
        assert_int_equal(ckpt_read(p, 16, &c, err, sizeof(err)), -EFBIG);
        free(d);
        free(p);
}

static void test_write_errors(void **state) {
        (void)state;
        const struct ckpt_tensor t[] = {{"x", 1, 1, A, CKPT_F32, 2}, {"x", 1, 1, B, CKPT_F32, 2}};
        struct ckpt_written w;
        char err[256];
        char *p = path_of("dup.safetensors");
        assert_int_equal(ckpt_write(p, t, 2, NULL, 0, &w, err, sizeof(err)), -EINVAL);
        assert_int_equal(access(p, F_OK), -1);
        free(p);
        p = path_of("no/such/dir/x.safetensors");
        assert_int_equal(ckpt_write(p, t, 1, NULL, 0, &w, err, sizeof(err)), -ENOENT);
        assert_non_null(strstr(err, "cannot create"));
        free(p);
        /* replacing an existing file leaves the new content, whole */
        p = path_of("replace.safetensors");
        write_two(p, &w);
        ckpt_set_test_delay(1);
        assert_int_equal(ckpt_write(p, t, 1, NULL, 0, &w, err, sizeof(err)), 0);
        ckpt_set_test_delay(0);
        struct ckpt *c;
        assert_int_equal(ckpt_read(p, 1 << 20, &c, err, sizeof(err)), 0);
        assert_int_equal(ckpt_n_tensors(c), 1);
        ckpt_free(c);
        free(p);
}

/* A table streamed in pages through ckpt_writer is byte for byte the file ckpt_write makes of the whole
 * tensors, and leaves no spool behind. */
static void test_stream_in_parts(void **state) {
        (void)state;
        enum { N = 1000, DIM = 3 };
        static uint64_t ids[N];
        static float rows[N * DIM], acc[N * DIM];
        for (int i = 0; i < N; i++)
                ids[i] = (uint64_t)i * 7919u + 3;
        for (int i = 0; i < N * DIM; i++) {
                rows[i] = (float)i * 0.25f;
                acc[i] = 1.0f / (float)(i + 1);
        }
        const struct ckpt_kv meta[] = {{"global_step", "9"}, {"checkpoint", "full"}};
        const struct ckpt_tensor whole[] = {{"dense0/kernel", 2, 3, A, CKPT_F32, 2}, {"emb/cat/ids", N, 1, ids, CKPT_U64, 1},
                                            {"emb/cat", N, DIM, rows, CKPT_F32, 2},
                                            {"emb/cat/accumulator", N, DIM, acc, CKPT_F32, 2}};
        char *p1 = path_of("whole.safetensors"), *p2 = path_of("streamed.safetensors"), err[256];
        struct ckpt_written w1, w2;
        assert_int_equal(ckpt_write(p1, whole, 4, meta, 2, &w1, err, sizeof(err)), 0);
        struct ckpt_writer *w;
        size_t ix[3];
        assert_int_equal(ckpt_writer_new(p2, &w), 0);
        assert_int_equal(ckpt_writer_add(w, &whole[0]), 0);
        assert_int_equal(ckpt_writer_add(w, &whole[0]), -EEXIST);
        assert_int_equal(ckpt_writer_stream(w, "emb/cat/ids", CKPT_U64, 1, 1, &ix[0]), 0);
        assert_int_equal(ckpt_writer_stream(w, "emb/cat", CKPT_F32, 2, DIM, &ix[1]), 0);
        assert_int_equal(ckpt_writer_stream(w, "emb/cat/accumulator", CKPT_F32, 2, DIM, &ix[2]), 0);
        /* pages of uneven sizes, as shards answer */
        for (size_t at = 0, page = 1; at < N; at += page, page = page * 3 % 257 + 1) {
                size_t n = at + page > N ? N - at : page;
                assert_int_equal(ckpt_writer_append(w, ix[0], ids + at, n), 0);
                assert_int_equal(ckpt_writer_append(w, ix[1], rows + at * DIM, n), 0);
                assert_int_equal(ckpt_writer_append(w, ix[2], acc + at * DIM, n), 0);
        }
        assert_int_equal(ckpt_writer_rows(w, ix[1]), N);
        assert_int_equal(ckpt_writer_finish(w, meta, 2, &w2, err, sizeof(err)), 0);
        ckpt_writer_free(w);
        assert_int_equal(w1.bytes, w2.bytes);
        assert_int_equal(w1.crc32c, w2.crc32c);
        size_t l1, l2;
        uint8_t *d1 = slurp(p1, &l1), *d2 = slurp(p2, &l2);
        assert_int_equal(l1, l2);
        assert_memory_equal(d1, d2, l1);
        assert_int_equal(crc32c(d2, l2), w2.crc32c);
        free(d1);
        free(d2);
        /* no spool is left in the directory: they were never linked, or unlinked at once */
        DIR *dir = opendir(scratch_dir);
        for (struct dirent *e; (e = readdir(dir));)
                assert_false(strncmp(e->d_name, ".ckpt-spool", 11) == 0 || strstr(e->d_name, ".tmp"));
        closedir(dir);
        /* a writer dropped before finishing leaves nothing */
        char *p3 = path_of("dropped.safetensors");
        assert_int_equal(ckpt_writer_new(p3, &w), 0);
        assert_int_equal(ckpt_writer_stream(w, "emb/cat/ids", CKPT_U64, 1, 1, &ix[0]), 0);
        assert_int_equal(ckpt_writer_append(w, ix[0], ids, N), 0);
        ckpt_writer_free(w);
        assert_int_equal(access(p3, F_OK), -1);
        free(p1);
        free(p2);
        free(p3);
}

/* A file past the CRC's 4 MiB buffer: its checksum is that of the whole file, and a table's rows read
 * a page at a time (ckpt_read_rows) are those written, from any row. */
static void test_large_in_pages(void **state) {
        (void)state;
        enum { ROWS = 100000, DIM = 16 };   /* 6.4 MB of rows, 0.8 MB of ids */
        char *p = path_of("large.safetensors");
        uint64_t *ids = malloc(ROWS * sizeof(*ids));
        float *rows = malloc((size_t)ROWS * DIM * sizeof(float));
        for (size_t i = 0; i < ROWS; i++) {
                ids[i] = i * 7919 + 3;
                for (size_t j = 0; j < DIM; j++)
                        rows[i * DIM + j] = (float)i - 0.5f * (float)j;
        }
        const struct ckpt_tensor t[] = {{"emb/cat/ids", ROWS, 1, ids, CKPT_U64, 1},
                                        {"emb/cat", ROWS, DIM, rows, CKPT_F32, 2}};
        struct ckpt_written w;
        char err[256];
        assert_int_equal(ckpt_write(p, t, 2, NULL, 0, &w, err, sizeof(err)), 0);
        assert_true(w.bytes > (5u << 20));
        /* the checksum by hand, of the file whole */
        FILE *fp = fopen(p, "rb");
        assert_non_null(fp);
        uint8_t *all = malloc(w.bytes);
        assert_int_equal(fread(all, 1, w.bytes, fp), w.bytes);
        fclose(fp);
        assert_int_equal(crc32c(all, w.bytes), w.crc32c);
        free(all);
        struct ckpt *c;
        assert_int_equal(ckpt_read(p, 1ull << 30, &c, err, sizeof(err)), 0);
        assert_int_equal(ckpt_crc32c(c), w.crc32c);
        enum ckpt_dtype dt;
        unsigned nd;
        uint64_t shape[CKPT_MAX_DIMS];
        assert_int_equal(ckpt_shape(c, "emb/cat", &dt, &nd, shape), 0);
        assert_int_equal(shape[0], ROWS);
        assert_int_equal(shape[1], DIM);
        enum { PAGE = 4096 };
        uint64_t got_ids[PAGE];
        static float got[PAGE * DIM];
        for (uint64_t at = 0; at < ROWS; at += PAGE) {
                uint64_t n = ROWS - at < PAGE ? ROWS - at : PAGE;
                assert_int_equal(ckpt_read_rows(c, "emb/cat/ids", at, n, got_ids), 0);
                assert_int_equal(ckpt_read_rows(c, "emb/cat", at, n, got), 0);
                assert_memory_equal(got_ids, ids + at, n * sizeof(*ids));
                assert_memory_equal(got, rows + at * DIM, n * DIM * sizeof(float));
        }
        assert_int_equal(ckpt_read_rows(c, "emb/dog", 0, 1, got), -ENOENT);
        ckpt_free(c);
        free(ids);
        free(rows);
        free(p);
}

UNIT_TEST_MAIN(setup, scratch_dir_remove,
        cmocka_unit_test(test_layout_on_disk),
        cmocka_unit_test(test_read_back),
        cmocka_unit_test(test_u64_ids),
        cmocka_unit_test(test_foreign_file),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_bit_flip_changes_checksum),
        cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_stream_in_parts),
        cmocka_unit_test(test_large_in_pages))
