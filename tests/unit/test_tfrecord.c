/* records' tfrecord format (records_tfrecord.c): the framing and both CRCs, plain, GZIP (one member and
 * several) and ZLIB files told apart by their bytes or by the key, tf.train.Example parsed into records
 * as the spec says (label, dense with defaults, sparse int64 and bytes, images), every bad input named
 * with file, record index, byte offset and feature (and counted when skipped), sharding by record and by
 * file, loops, memory that does not grow with the file. The Examples are packed here through protobuf-c's packer; the framing is written here. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <cmocka.h>

#include "crc32c.h"
#include "psfleet/tfrecord/example.pb-c.h"
#include "records.h"
#include "scratch_dir.h"
#include "unit.h"
#include "records_fixture.h"

static char err[512];

static int setup(void **state)
{
        (void)state;
        return scratch_dir_make("tfrecord");
}

/* ---- writing Examples and frames ---- */

enum { K_BYTES = 1, K_FLOAT = 2, K_INT64 = 3 };

struct feat {
        const char *name;
        int kind;
        size_t n;
        const float *f;
        const int64_t *i;
        const char *const *b;
};

/* The Example of the features into out (room for 4096 bytes): its length. */
static size_t pack_example(const struct feat *fs, size_t n, uint8_t *out)
{
        Psfleet__Tfrecord__Example ex = PSFLEET__TFRECORD__EXAMPLE__INIT;
        Psfleet__Tfrecord__Features feats = PSFLEET__TFRECORD__FEATURES__INIT;
        Psfleet__Tfrecord__Features__FeatureEntry ent[16], *pe[16];
        Psfleet__Tfrecord__Feature fv[16];
        Psfleet__Tfrecord__BytesList bl[16];
        Psfleet__Tfrecord__FloatList fl[16];
        Psfleet__Tfrecord__Int64List il[16];
        ProtobufCBinaryData bd[16][8];
        assert_true(n <= 16);
        for (size_t k = 0; k < n; k++) {
                psfleet__tfrecord__features__feature_entry__init(&ent[k]);
                psfleet__tfrecord__feature__init(&fv[k]);
                ent[k].key = (char *)fs[k].name;
                ent[k].value = &fv[k];
                pe[k] = &ent[k];
                if (fs[k].kind == K_FLOAT) {
                        psfleet__tfrecord__float_list__init(&fl[k]);
                        fl[k].n_value = fs[k].n;
                        fl[k].value = (float *)fs[k].f;
                        fv[k].kind_case = PSFLEET__TFRECORD__FEATURE__KIND_FLOAT_LIST;
                        fv[k].float_list = &fl[k];
                } else if (fs[k].kind == K_INT64) {
                        psfleet__tfrecord__int64_list__init(&il[k]);
                        il[k].n_value = fs[k].n;
                        il[k].value = (int64_t *)fs[k].i;
                        fv[k].kind_case = PSFLEET__TFRECORD__FEATURE__KIND_INT64_LIST;
                        fv[k].int64_list = &il[k];
                } else if (fs[k].kind == K_BYTES) {
                        psfleet__tfrecord__bytes_list__init(&bl[k]);
                        assert_true(fs[k].n <= 8);
                        for (size_t j = 0; j < fs[k].n; j++)
                                bd[k][j] = (ProtobufCBinaryData){strlen(fs[k].b[j]), (uint8_t *)fs[k].b[j]};
                        bl[k].n_value = fs[k].n;
                        bl[k].value = bd[k];
                        fv[k].kind_case = PSFLEET__TFRECORD__FEATURE__KIND_BYTES_LIST;
                        fv[k].bytes_list = &bl[k];
                }
        }
        feats.n_feature = n;
        feats.feature = pe;
        ex.features = &feats;
        size_t len = psfleet__tfrecord__example__get_packed_size(&ex);
        assert_true(len <= 4096);
        return psfleet__tfrecord__example__pack(&ex, out);
}

static void le(uint8_t *p, uint64_t v, int n)
{
        for (int i = 0; i < n; i++)
                p[i] = (uint8_t)(v >> 8 * i);
}

/* A buffer of frames. */
struct frames {
        uint8_t buf[1 << 16];
        size_t n;
        size_t at[256];         /* each record's offset */
        uint32_t count;
};

static void frame(struct frames *f, const uint8_t *d, size_t len)
{
        uint8_t *p = f->buf + f->n;
        assert_true(f->n + len + 16 <= sizeof(f->buf) && f->count < 256);
        f->at[f->count++] = f->n;
        le(p, len, 8);
        le(p + 8, crc32c_mask(crc32c(p, 8)), 4);
        memcpy(p + 12, d, len);
        le(p + 12 + len, crc32c_mask(crc32c(d, len)), 4);
        f->n += len + 16;
}

/* Record i of the test data: label i % 2, dense "x" = [i, 2i] (float), "n" = i (int64, a dense
 * feature too), sparse "id" = int64 [i, 100 + i], "tok" = bytes ["a<i>"], and "img" (4 bytes) that
 * spec_std does not ask for (and so ignores). */
static void put_example(struct frames *f, int i)
{
        int64_t label = i % 2, n = i, ids[2] = {i, 100 + i};
        float x[2] = {(float)i, 2.0f * (float)i};
        char tok[16];
        snprintf(tok, sizeof(tok), "a%d", i);
        const char *toks[1] = {tok}, *img[1] = {"abcd"};
        struct feat fs[] = {
                {"label", K_INT64, 1, NULL, &label, NULL}, {"x", K_FLOAT, 2, x, NULL, NULL},
                {"n", K_INT64, 1, NULL, &n, NULL},         {"id", K_INT64, 2, NULL, ids, NULL},
                {"tok", K_BYTES, 1, NULL, NULL, toks},     {"img", K_BYTES, 1, NULL, NULL, img},
        };
        uint8_t ex[4096];
        frame(f, ex, pack_example(fs, 6, ex));
}

static struct tfr_spec spec_std(void)
{
        struct tfr_spec s = {.max_record_bytes = 1 << 20};
        snprintf(s.label.name, TFR_NAME_MAX, "label");
        s.dense[0] = (struct tfr_feature){.name = "x", .kind = TFR_FLOAT, .length = 2};
        s.dense[1] = (struct tfr_feature){.name = "n", .kind = TFR_INT64, .length = 1};
        s.n_dense = 2;
        s.sparse[0] = (struct tfr_feature){.name = "id", .kind = TFR_INT64};
        s.sparse[1] = (struct tfr_feature){.name = "tok", .kind = TFR_BYTES};
        s.n_sparse = 2;
        return s;
}

enum wrap { PLAIN, GZIP, ZLIB, GZIP2 };

/* Writes bytes to scratch_dir/name as is, gzip'd (GZIP2: in two members) or as one zlib stream. */
static const char *put(const char *name, const uint8_t *d, size_t n, enum wrap w)
{
        static char paths[16][320];
        static int next;
        char *path = paths[next++ % 16];
        snprintf(path, 320, "%s/%s", scratch_dir, name);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (w == PLAIN) {
                assert_int_equal(fwrite(d, 1, n, f), n);
        } else if (w == ZLIB) {
                uLongf cap = compressBound(n);
                uint8_t *z = malloc(cap);
                assert_int_equal(compress2(z, &cap, d, n, 6), Z_OK);
                assert_int_equal(fwrite(z, 1, cap, f), cap);
                free(z);
        } else {
                size_t half = w == GZIP2 ? n / 2 : n;
                for (int m = 0; m < (w == GZIP2 ? 2 : 1); m++) {
                        const uint8_t *src = m ? d + half : d;
                        size_t len = m ? n - half : half;
                        z_stream zs = {0};
                        assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY), Z_OK);
                        uint8_t *z = malloc(deflateBound(&zs, len) + 32);
                        zs.next_in = (Bytef *)src;
                        zs.avail_in = (uInt)len;
                        zs.next_out = z;
                        zs.avail_out = (uInt)deflateBound(&zs, len) + 32;
                        assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
                        assert_int_equal(fwrite(z, 1, zs.total_out, f), zs.total_out);
                        deflateEnd(&zs);
                        free(z);
                }
        }
        assert_int_equal(fclose(f), 0);
        return path;
}

static struct records_opts opts(const struct tfr_spec *s, const char *const *files, uint32_t n)
{
        return (struct records_opts){.format = RECORDS_TFRECORD, .files = files, .n_files = n, .n_workers = 1,
                                     .max_ids = 64, .tfrecord = s};
}

/* Record k of b is put_example(i)'s, as spec_std takes it. */
static void check_record(const struct records_batch *b, uint32_t k, int i)
{
        char tok[16];
        snprintf(tok, sizeof(tok), "a%d", i);
        assert_true(b->label[k] == (float)(i % 2));
        assert_true(b->dense[k * 3 + 0] == (float)i);
        assert_true(b->dense[k * 3 + 1] == 2.0f * (float)i);
        assert_true(b->dense[k * 3 + 2] == (float)i);
        const uint32_t *off = b->off + k * 2;
        assert_int_equal(off[1] - off[0], 2);
        assert_true(b->ids[off[0]] == (uint64_t)i && b->ids[off[0] + 1] == (uint64_t)(100 + i));
        assert_int_equal(off[2] - off[1], 1);
        assert_true(b->ids[off[1]] == records_hash(1, tok, strlen(tok)));
        assert_true(b->val[off[0]] == 1 && b->val[off[1]] == 1);
}

static const char *make_file(const char *name, int n, enum wrap w)
{
        struct frames *f = calloc(1, sizeof(*f));
        for (int i = 0; i < n; i++)
                put_example(f, i);
        const char *p = put(name, f->buf, f->n, w);
        free(f);
        return p;
}

/* ---- tests ---- */

static void test_mask(void **state)
{
        (void)state;
        /* TFRecord's mask: rotate right 15, add 0xa282ead8 */
        assert_int_equal(crc32c_mask(0), 0xa282ead8u);
        assert_int_equal(crc32c_mask(0xE3069283u), (uint32_t)((0xE3069283u >> 15 | 0xE3069283u << 17) + 0xa282ead8u));
        assert_string_equal(records_format_name(RECORDS_TFRECORD), "tfrecord");
}

/* Every compression, by its bytes (auto) and by the key, gives the same 50 records in order. */
static void test_compressions(void **state)
{
        (void)state;
        static const struct { const char *name; enum wrap w; enum tfr_compression key; } cases[] = {
                {"plain.tfrecord", PLAIN, TFR_NONE}, {"g.tfrecord.gz", GZIP, TFR_GZIP},
                {"z.tfrecord", ZLIB, TFR_ZLIB},      {"g2.tfrecord.gz", GZIP2, TFR_GZIP},
        };
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
                const char *files[] = {make_file(cases[c].name, 50, cases[c].w)};
                for (int by_key = 0; by_key < 2; by_key++) {
                        struct tfr_spec s = spec_std();
                        s.compression = by_key ? cases[c].key : TFR_AUTO;
                        struct records_opts o = opts(&s, files, 1);
                        struct records_reader *r = open_ok(&o);
                        assert_int_equal(records_n_dense(r), 3);
                        assert_int_equal(records_n_fields(r), 2);
                        struct records_batch *b = batch_for(r, 16, 64);
                        int i = 0, n;
                        while ((n = records_next(r, b, err, sizeof(err))) > 0)
                                for (int k = 0; k < n; k++)
                                        check_record(b, (uint32_t)k, i++);
                        assert_int_equal(n, 0);
                        assert_int_equal(i, 50);
                        records_batch_free(b);
                        records_close(r);
                }
        }
        /* a plain file read as if it were gzip: a corrupt stream, an I/O error naming the file */
        const char *files[] = {make_file("notgz.tfrecord", 3, PLAIN)};
        struct tfr_spec s = spec_std();
        s.compression = TFR_GZIP;
        struct records_opts o = opts(&s, files, 1);
        struct records_reader *r = NULL;
        assert_int_equal(records_open(&o, &r, err, sizeof(err)), -EIO);
        assert_non_null(strstr(err, "notgz.tfrecord: corrupt gzip stream"));
}

/* A gzip file cut short is a corrupt stream (-EIO), as for the text formats. */
static void test_cut_gzip(void **state)
{
        (void)state;
        const char *path = make_file("cut.tfrecord.gz", 200, GZIP);
        FILE *f = fopen(path, "r+b");
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fclose(f);
        assert_int_equal(truncate(path, size / 2), 0);
        const char *files[] = {path};
        struct tfr_spec s = spec_std();
        struct records_opts o = opts(&s, files, 1);
        struct records_reader *r = open_ok(&o);
        struct records_batch *b = batch_for(r, 16, 64);
        int n;
        while ((n = records_next(r, b, err, sizeof(err))) > 0)
                ;
        assert_int_equal(n, -EIO);
        assert_non_null(strstr(err, "corrupt gzip stream (unexpected end of file)"));
        records_batch_free(b);
        records_close(r);
}

/* Reads the file expecting records 0..good-1 and then a bad one whose message has want. */
static void expect_bad(const struct tfr_spec *s, const uint8_t *d, size_t n, int good, const char *want)
{
        const char *files[] = {put("bad.tfrecord", d, n, PLAIN)};
        struct records_opts o = opts(s, files, 1);
        struct records_reader *r = NULL;
        int e = records_open(&o, &r, err, sizeof(err));
        if (good == 0) { /* the first record bad: records_open says so */
                assert_int_equal(e, -EBADMSG);
        } else {
                assert_int_equal(e, 0);
                struct records_batch *b = batch_for(r, 64, 64);
                e = records_next(r, b, err, sizeof(err));
                assert_int_equal(e, -EBADMSG);
                assert_int_equal(b->n, good);
                records_batch_free(b);
                records_close(r);
        }
        if (!strstr(err, want) || !strstr(err, files[0]))
                fail_msg("\"%s\" lacks \"%s\"", err, want);
}

static void test_bad_framing(void **state)
{
        (void)state;
        struct tfr_spec s = spec_std();
        struct frames *f = calloc(1, sizeof(*f));
        char want[160];
        for (int i = 0; i < 3; i++)
                put_example(f, i);
        /* the data's CRC of record 1 */
        f->buf[f->at[1] + 20] ^= 1;
        snprintf(want, sizeof(want), "bad.tfrecord: record 1 at byte %zu: the data's CRC does not match", f->at[1]);
        expect_bad(&s, f->buf, f->n, 1, want);
        f->buf[f->at[1] + 20] ^= 1;
        /* the length's CRC of record 2 */
        f->buf[f->at[2] + 9] ^= 0x40;
        snprintf(want, sizeof(want), "record 2 at byte %zu: the length's CRC does not match", f->at[2]);
        expect_bad(&s, f->buf, f->n, 2, want);
        f->buf[f->at[2] + 9] ^= 0x40;
        /* truncated: in the data, in the header */
        snprintf(want, sizeof(want), "record 2 at byte %zu: truncated record: the file ends 20 bytes into its", f->at[2]);
        expect_bad(&s, f->buf, f->at[2] + 32, 2, want);
        snprintf(want, sizeof(want), "record 2 at byte %zu: truncated record: the file ends 5 bytes into its 12-byte",
                 f->at[2]);
        expect_bad(&s, f->buf, f->at[2] + 5, 2, want);
        /* longer than max_record_bytes */
        s.max_record_bytes = 64;
        expect_bad(&s, f->buf, f->n, 0, "record 0 at byte 0: a record of");
        s.max_record_bytes = 1 << 20;
        /* not a TFRecord file at all */
        expect_bad(&s, (const uint8_t *)"label,x\n1,2\n", 12, 0, "record 0 at byte 0: the length's CRC does not match");
        /* framed, but no Example */
        struct frames *g = calloc(1, sizeof(*g));
        put_example(g, 0);
        frame(g, (const uint8_t *)"\xff\xff\xff", 3);
        snprintf(want, sizeof(want), "record 1 at byte %zu: not a tf.train.Example", g->at[1]);
        expect_bad(&s, g->buf, g->n, 1, want);
        free(g);
        free(f);
}

/* One record of the given features after a good one: bad with want. */
static void bad_example(const struct tfr_spec *s, const struct feat *fs, size_t n, const char *want)
{
        struct frames *f = calloc(1, sizeof(*f));
        uint8_t ex[4096];
        put_example(f, 0);
        frame(f, ex, pack_example(fs, n, ex));
        char w[256];
        snprintf(w, sizeof(w), "record 1 at byte %zu: %s", f->at[1], want);
        expect_bad(s, f->buf, f->n, 1, w);
        free(f);
}

static void test_bad_features(void **state)
{
        (void)state;
        struct tfr_spec s = spec_std();
        int64_t one = 1, two[2] = {1, 2};
        float x2[2] = {1, 2}, x3[3] = {1, 2, 3}, inf = INFINITY;
        const char *tok[1] = {"t"};
        struct feat lab = {"label", K_INT64, 1, NULL, &one, NULL}, n1 = {"n", K_INT64, 1, NULL, &one, NULL};
        struct feat x = {"x", K_FLOAT, 2, x2, NULL, NULL};
        bad_example(&s, (struct feat[]){x, n1}, 2, "feature 'label' (the label): missing");
        bad_example(&s, (struct feat[]){{"label", K_BYTES, 1, NULL, NULL, tok}, x, n1}, 3,
                    "feature 'label': a bytes_list, expected float_list or int64_list");
        bad_example(&s, (struct feat[]){{"label", K_INT64, 2, NULL, two, NULL}, x, n1}, 3,
                    "feature 'label': 2 values, expected 1");
        bad_example(&s, (struct feat[]){{"label", K_FLOAT, 1, &inf, NULL, NULL}, x, n1}, 3,
                    "feature 'label': value 0 is not finite");
        bad_example(&s, (struct feat[]){lab, {"x", K_FLOAT, 3, x3, NULL, NULL}, n1}, 3, "feature 'x': 3 values, expected 2");
        bad_example(&s, (struct feat[]){lab, {"x", K_INT64, 2, NULL, two, NULL}, n1}, 3,
                    "feature 'x': a int64_list, expected float_list (dtype float32)");
        bad_example(&s, (struct feat[]){lab, n1}, 2, "feature 'x': missing, and it has no default_value");
        bad_example(&s, (struct feat[]){lab, x, n1, {"id", K_BYTES, 1, NULL, NULL, tok}}, 4,
                    "feature 'id': a bytes_list, expected int64_list (dtype int64)");
        bad_example(&s, (struct feat[]){lab, x, n1, {"tok", K_FLOAT, 2, x2, NULL, NULL}}, 4,
                    "feature 'tok': a float_list, expected bytes_list (dtype string)");
        int64_t many[70];
        for (int i = 0; i < 70; i++)
                many[i] = i;
        bad_example(&s, (struct feat[]){lab, x, n1, {"id", K_INT64, 70, NULL, many, NULL}}, 4,
                    "feature 'id': more than max_ids (64) ids");
        s.image = (struct tfr_feature){.name = "img", .kind = TFR_BYTES, .length = 4, .shape = {1, 2, 2}};
        bad_example(&s, (struct feat[]){lab, x, n1}, 3, "feature 'img': missing");
        bad_example(&s, (struct feat[]){lab, x, n1, {"img", K_BYTES, 1, NULL, NULL, tok}}, 4,
                    "feature 'img': 1 bytes, expected 4 (shape [1, 2, 2])");
}

/* Defaults for missing (or empty) dense features, sparse features missing (no ids), images. */
static void test_defaults_and_images(void **state)
{
        (void)state;
        struct tfr_spec s = spec_std();
        s.dense[0].has_default = true;
        s.dense[0].default_value = -1.5f;
        s.sparse[1].kind = TFR_BYTES;
        s.image = (struct tfr_feature){.name = "img", .kind = TFR_BYTES, .length = 4, .shape = {1, 2, 2}};
        struct tfr_spec sf = s;
        sf.image.kind = TFR_FLOAT;
        int64_t one = 1;
        float px[4] = {0.5f, 0.25f, 1, 0};
        const char *img[1] = {"\x01\x02\xff\x80"}, *toks[2] = {"p", "q"};
        struct frames *f = calloc(1, sizeof(*f));
        uint8_t ex[4096];
        struct feat a[] = {{"label", K_FLOAT, 1, (float[]){0.75f}, NULL, NULL}, {"n", K_INT64, 1, NULL, &one, NULL},
                           {"x", K_FLOAT, 0, NULL, NULL, NULL}, {"img", K_BYTES, 1, NULL, NULL, img},
                           {"tok", K_BYTES, 2, NULL, NULL, toks}};
        frame(f, ex, pack_example(a, 5, ex));
        const char *files[] = {put("img.tfrecord", f->buf, f->n, PLAIN)};
        struct records_opts o = opts(&s, files, 1);
        struct records_reader *r = open_ok(&o);
        assert_int_equal(records_n_dense(r), 7);
        struct records_batch *b = batch_for(r, 4, 64);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 1);
        assert_true(b->label[0] == 0.75f);
        assert_true(b->dense[0] == -1.5f && b->dense[1] == -1.5f && b->dense[2] == 1);
        assert_true(b->dense[3] == 1 / 255.0f && b->dense[4] == 2 / 255.0f && b->dense[5] == 1.0f &&
                    b->dense[6] == 128 / 255.0f);
        assert_int_equal(b->off[1], 0); /* no "id": no ids */
        assert_int_equal(b->off[2], 2);
        assert_true(b->ids[0] == records_hash(1, "p", 1) && b->ids[1] == records_hash(1, "q", 1));
        records_batch_free(b);
        records_close(r);
        /* a float image */
        f->n = f->count = 0;
        struct feat c[] = {{"label", K_INT64, 1, NULL, &one, NULL}, {"n", K_INT64, 1, NULL, &one, NULL},
                           {"img", K_FLOAT, 4, px, NULL, NULL}};
        frame(f, ex, pack_example(c, 3, ex));
        files[0] = put("imgf.tfrecord", f->buf, f->n, PLAIN);
        o = opts(&sf, files, 1);
        r = open_ok(&o);
        b = batch_for(r, 4, 64);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 1);
        assert_true(b->dense[3] == 0.5f && b->dense[4] == 0.25f && b->dense[5] == 1 && b->dense[6] == 0);
        records_batch_free(b);
        records_close(r);
        free(f);
}

/* With skip_bad every kind of bad record is counted and the good ones all come through. */
static void test_skip_bad(void **state)
{
        (void)state;
        struct tfr_spec s = spec_std();
        struct frames *f = calloc(1, sizeof(*f));
        for (int i = 0; i < 10; i++)
                put_example(f, i);
        f->buf[f->at[3] + 14] ^= 2;                /* record 3: data CRC */
        frame(f, (const uint8_t *)"\x0a\x05", 2);  /* record 10: no Example */
        put_example(f, 11);
        f->buf[f->at[11] + 2] ^= 1;                /* record 11: the length's CRC: the file ends */
        const char *files[] = {put("skip.tfrecord", f->buf, f->n, PLAIN)};
        struct records_opts o = opts(&s, files, 1);
        o.skip_bad = true;
        struct records_reader *r = open_ok(&o);
        struct records_batch *b = batch_for(r, 64, 64);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 9);
        for (uint32_t k = 0; k < 9; k++)
                check_record(b, k, k < 3 ? (int)k : (int)k + 1);
        assert_int_equal(records_next(r, b, err, sizeof(err)), 0);
        assert_int_equal(records_bad_lines(r), 3);
        records_batch_free(b);
        records_close(r);
        free(f);
}

/* By record (fewer files than workers): disjoint, covering, record i to worker i % W whatever is bad;
 * by file otherwise. */
static void test_sharding(void **state)
{
        (void)state;
        struct tfr_spec s = spec_std();
        const char *one[] = {make_file("shard.tfrecord", 30, GZIP)};
        int seen[30] = {0};
        for (uint32_t w = 0; w < 4; w++) {
                struct records_opts o = opts(&s, one, 1);
                o.worker = w;
                o.n_workers = 4;
                struct records_reader *r = open_ok(&o);
                struct records_batch *b = batch_for(r, 64, 64);
                int n = records_next(r, b, err, sizeof(err));
                assert_int_equal(n, (30 - (int)w + 3) / 4);
                for (int k = 0; k < n; k++) {
                        int i = (int)b->dense[k * 3 + 2];
                        assert_int_equal(i % 4, w);
                        check_record(b, (uint32_t)k, i);
                        seen[i]++;
                }
                records_batch_free(b);
                records_close(r);
        }
        for (int i = 0; i < 30; i++)
                assert_int_equal(seen[i], 1);
        const char *four[] = {make_file("f0.tfrecord", 5, PLAIN), make_file("f1.tfrecord", 6, ZLIB),
                              make_file("f2.tfrecord", 7, GZIP), make_file("f3.tfrecord", 8, PLAIN)};
        for (uint32_t w = 0; w < 2; w++) {
                struct records_opts o = opts(&s, four, 4);
                o.worker = w;
                o.n_workers = 2;
                struct records_reader *r = open_ok(&o);
                struct records_batch *b = batch_for(r, 64, 64);
                assert_int_equal(records_next(r, b, err, sizeof(err)), w == 0 ? 5 + 7 : 6 + 8);
                records_batch_free(b);
                records_close(r);
        }
}

/* A looping reader over one compressed file: epochs, every record each time, in order. */
static void test_loop(void **state)
{
        (void)state;
        struct tfr_spec s = spec_std();
        const char *files[] = {make_file("loop.tfrecord", 7, ZLIB)};
        struct records_opts o = opts(&s, files, 1);
        o.loop = true;
        struct records_reader *r = open_ok(&o);
        struct records_batch *b = batch_for(r, 5, 64);
        for (int k = 0; k < 7; k++) { /* 35 records: 5 epochs */
                assert_int_equal(records_next(r, b, err, sizeof(err)), 5);
                for (uint32_t j = 0; j < 5; j++)
                        check_record(b, j, (k * 5 + (int)j) % 7);
        }
        assert_int_equal(records_epoch(r), 4);
        records_batch_free(b);
        records_close(r);
}

/* 40,000 records (about 5 MB uncompressed), GZIP and plain: what the reader holds stays far below the
 * file's size. */
static void test_bounded_memory(void **state)
{
        (void)state;
        for (int gz = 0; gz < 2; gz++) {
                char path[320];
                snprintf(path, sizeof(path), "%s/big.tfrecord%s", scratch_dir, gz ? ".gz" : "");
                gzFile z = gzopen(path, gz ? "wb1" : "wbT");
                assert_non_null(z);
                struct frames *f = calloc(1, sizeof(*f));
                size_t bytes = 0;
                for (int i = 0; i < 40000; i++) {
                        put_example(f, i % 1000);
                        if (f->count == 256 || i == 39999) {
                                assert_int_equal(gzwrite(z, f->buf, (unsigned)f->n), (int)f->n);
                                bytes += f->n;
                                f->n = f->count = 0;
                        }
                }
                assert_int_equal(gzclose(z), Z_OK);
                free(f);
                const char *files[] = {path};
                struct tfr_spec s = spec_std();
                size_t before = heap_in_use(), peak = 0;
                struct records_opts o = opts(&s, files, 1);
                struct records_reader *r = open_ok(&o);
                struct records_batch *b = batch_for(r, 256, 64);
                int got, n = 0;
                while ((got = records_next(r, b, err, sizeof(err))) > 0) {
                        for (int k = 0; k < got; k++)
                                check_record(b, (uint32_t)k, (n + k) % 1000);
                        n += got;
                        size_t now = heap_in_use() - before;
                        peak = now > peak ? now : peak;
                }
                assert_int_equal(got, 0);
                assert_int_equal(n, 40000);
                assert_true(bytes > (4u << 20));
                assert_true(peak < (1u << 20)); /* batch, read and input buffers, zlib, the arena */
                records_batch_free(b);
                records_close(r);
        }
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_mask),
                cmocka_unit_test(test_compressions),
                cmocka_unit_test(test_cut_gzip),
                cmocka_unit_test(test_bad_framing),
                cmocka_unit_test(test_bad_features),
                cmocka_unit_test(test_defaults_and_images),
                cmocka_unit_test(test_skip_bad),
                cmocka_unit_test(test_sharding),
                cmocka_unit_test(test_loop),
                cmocka_unit_test(test_bounded_memory),
        };
        return cmocka_run_group_tests(tests, setup, scratch_dir_remove);
}
