/* gendata (psfleet gen-data's generator): the same options give the same bytes; what it writes reads
 * back through the records readers, and the planted model recomputed from the rows read back gives
 * the AUC (RMSE) it reported; tokens distinct per rank; errors name the path. */
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
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "binmetrics.h"
#include "gendata.h"
#include "records.h"
#include "scratch_dir.h"
#include "unit.h"
#include "util.h"

static char err[512];

static int setup(void **state)
{
        (void)state;
        return scratch_dir_make("gendata");
}

static const char *path_of(const char *name)
{
        static char paths[8][320];
        static int next;
        char *p = paths[next++ % 8];
        snprintf(p, 320, "%s/%s", scratch_dir, name);
        return p;
}

static struct gendata *gen(enum records_format fmt, uint64_t seed, uint32_t vocab)
{
        struct gendata_opts o = {.format = fmt, .seed = seed, .vocab = vocab, .zipf = 1.1, .noise = 0.1};
        struct gendata *g;
        assert_int_equal(gendata_new(&o, &g), 0);
        return g;
}

static void write_ok(struct gendata *g, const char *path, uint64_t rows, uint64_t stream, struct gendata_stats *st)
{
        int e = gendata_write(g, path, rows, stream, st, err, sizeof(err));
        if (e)
                print_error("gendata_write: %s\n", err);
        assert_int_equal(e, 0);
        assert_int_equal(st->rows, rows);
}

static void test_deterministic(void **state)
{
        (void)state;
        const char *names[][2] = {{"a.tsv", "b.tsv"}, {"a.svm.gz", "b.svm.gz"}, {"a.csv", "b.csv"}};
        enum records_format fmts[] = {RECORDS_CRITEO, RECORDS_LIBSVM, RECORDS_CSV};
        for (int i = 0; i < 3; i++) {
                char *data[3];
                size_t len[3];
                for (int k = 0; k < 3; k++) {
                        /* k = 2: another seed, which must differ */
                        struct gendata *g = gen(fmts[i], k == 2 ? 8 : 7, 1000);
                        struct gendata_stats st;
                        const char *p = path_of(names[i][k % 2]);
                        write_ok(g, p, 3000, 0, &st);
                        assert_int_equal(read_file(p, 1u << 30, &data[k], &len[k]), 0);
                        gendata_free(g);
                }
                assert_int_equal(len[0], len[1]);
                assert_memory_equal(data[0], data[1], len[0]);
                assert_true(len[0] != len[2] || memcmp(data[0], data[2], len[0]) != 0);
                if (i == 1) /* gzip'd: the magic */
                        assert_true((uint8_t)data[0][0] == 0x1f && (uint8_t)data[0][1] == 0x8b);
                for (int k = 0; k < 3; k++)
                        free(data[k]);
        }
}

struct idw {
        uint64_t id;
        double w;
};

static int by_id(const void *a, const void *b)
{
        uint64_t x = ((const struct idw *)a)->id, y = ((const struct idw *)b)->id;
        return (x > y) - (x < y);
}

static struct records_reader *reader(enum records_format fmt, const char *path, uint32_t max_ids)
{
        static const char *files[1];
        files[0] = path;
        struct records_opts o = {.format = fmt, .files = files, .n_files = 1, .n_workers = 1, .max_ids = max_ids};
        struct records_reader *r;
        int e = records_open(&o, &r, err, sizeof(err));
        if (e)
                print_error("records_open: %s\n", err);
        assert_int_equal(e, 0);
        return r;
}

/* Criteo rows read back: every id is a token of the planted vocabulary, and the planted logit
 * recomputed from the record gives the AUC and log loss gendata reported. */
static void test_criteo_reads_back(void **state)
{
        (void)state;
        const uint32_t V = 2000;
        struct gendata *g = gen(RECORDS_CRITEO, 3, V);
        struct gendata_stats st;
        const char *p = path_of("c.tsv.gz");
        write_ok(g, p, 20000, 1, &st);
        assert_true(st.positive_rate > 0.22 && st.positive_rate < 0.28);
        assert_true(st.planted_auc > 0.74 && st.planted_auc < 0.84);
        assert_true(st.planted_logloss > 0.3 && st.planted_logloss < 0.55);
        struct idw *tab = malloc((size_t)26 * V * sizeof(*tab));
        for (uint32_t f = 0; f < 26; f++)
                for (uint32_t k = 0; k < V; k++) {
                        char tok[9];
                        gendata_token(f, k, tok);
                        tab[f * V + k] = (struct idw){records_hash(f, tok, 8), gendata_weight(g, f, k)};
                }
        qsort(tab, (size_t)26 * V, sizeof(*tab), by_id);
        struct records_reader *r = reader(RECORDS_CRITEO, p, 26);
        struct records_batch *b;
        assert_int_equal(records_batch_new(512, 13, 26, 26, &b), 0);
        struct binmetrics *m;
        assert_int_equal(binmetrics_new(0, &m), 0);
        uint64_t rank0 = 0, rank_high = 0; /* field 0's rank 0 against ranks >= 100 */
        char tok0[9];
        gendata_token(0, 0, tok0);
        uint64_t id0 = records_hash(0, tok0, 8);
        int n;
        while ((n = records_next(r, b, err, sizeof(err))) > 0)
                for (int i = 0; i < n; i++) {
                        double z = gendata_bias(g);
                        for (int j = 0; j < 13; j++)
                                z += gendata_dense_weight(g, (uint32_t)j) * b->dense[i * 13 + j];
                        for (uint32_t k = b->off[i * 26]; k < b->off[i * 26 + 26]; k++) {
                                struct idw key = {b->ids[k], 0}, *hit = bsearch(&key, tab, (size_t)26 * V,
                                                                               sizeof(*tab), by_id);
                                assert_non_null(hit);
                                z += hit->w;
                        }
                        if (b->off[i * 26 + 1] > b->off[i * 26]) {
                                rank0 += b->ids[b->off[i * 26]] == id0;
                                rank_high++;
                        }
                        float pr = (float)(1 / (1 + exp(-z)));
                        assert_int_equal(binmetrics_add(m, &pr, &b->label[i], 1), 0);
                }
        assert_int_equal(n, 0);
        assert_int_equal(records_read(r), 20000);
        assert_int_equal(records_bad_lines(r), 0);
        /* Zipf 1.1 over 2000 ranks: rank 0 has about 1/8 of the field's draws */
        assert_true(rank0 > rank_high / 12 && rank0 < rank_high / 5);
        /* dense features pass through log1p in float in the reader: a hair from the generator's doubles */
        assert_true(fabs(binmetrics_auc(m) - st.planted_auc) < 2e-3);
        assert_true(fabs(binmetrics_logloss(m) - st.planted_logloss) < 2e-3);
        binmetrics_free(m);
        records_batch_free(b);
        records_close(r);
        free(tab);
        gendata_free(g);
}

/* The criteo layout as data.tfrecord says it: "label", I1..I13 float (0 when missing, as an empty
 * count), C1..C26 bytes. */
static struct tfr_spec criteo_spec(void)
{
        struct tfr_spec s = {.max_record_bytes = 1 << 20};
        snprintf(s.label.name, TFR_NAME_MAX, "label");
        for (uint32_t j = 0; j < 13; j++) {
                snprintf(s.dense[j].name, TFR_NAME_MAX, "I%u", j + 1);
                s.dense[j].kind = TFR_FLOAT;
                s.dense[j].length = 1;
                s.dense[j].has_default = true;
        }
        for (uint32_t f = 0; f < 26; f++) {
                snprintf(s.sparse[f].name, TFR_NAME_MAX, "C%u", f + 1);
                s.sparse[f].kind = TFR_BYTES;
        }
        s.n_dense = 13;
        s.n_sparse = 26;
        return s;
}

/* --format tfrecord writes the criteo rows: read through the spec above, plain and GZIP, every record
 * is the criteo reader's record of the same row, to the bit. */
static void test_tfrecord_is_criteo(void **state)
{
        (void)state;
        struct gendata *g = gen(RECORDS_CRITEO, 7, 3000), *t = gen(RECORDS_TFRECORD, 7, 3000);
        struct gendata_stats sc, stf, stg;
        const char *pc = path_of("same.tsv"), *pt = path_of("same.tfrecord"), *pg = path_of("same.tfrecord.gz");
        write_ok(g, pc, 3000, 0, &sc);
        write_ok(t, pt, 3000, 0, &stf);
        write_ok(t, pg, 3000, 0, &stg);
        assert_true(sc.planted_auc == stf.planted_auc && sc.positive_rate == stg.positive_rate);
        struct tfr_spec spec = criteo_spec();
        for (int gz = 0; gz < 2; gz++) {
                const char *files[] = {gz ? pg : pt};
                struct records_opts o = {.format = RECORDS_TFRECORD, .files = files, .n_files = 1, .n_workers = 1,
                                         .max_ids = 26, .tfrecord = &spec};
                struct records_reader *rt, *rc = reader(RECORDS_CRITEO, pc, 26);
                assert_int_equal(records_open(&o, &rt, err, sizeof(err)), 0);
                assert_int_equal(records_n_dense(rt), 13);
                assert_int_equal(records_n_fields(rt), 26);
                struct records_batch *bc, *bt;
                assert_int_equal(records_batch_new(256, 13, 26, 26, &bc), 0);
                assert_int_equal(records_batch_new(256, 13, 26, 26, &bt), 0);
                int n, total = 0;
                while ((n = records_next(rc, bc, err, sizeof(err))) > 0) {
                        assert_int_equal(records_next(rt, bt, err, sizeof(err)), n);
                        assert_memory_equal(bc->label, bt->label, n * sizeof(float));
                        assert_memory_equal(bc->dense, bt->dense, (size_t)n * 13 * sizeof(float));
                        assert_memory_equal(bc->off, bt->off, ((size_t)n * 26 + 1) * sizeof(uint32_t));
                        assert_memory_equal(bc->ids, bt->ids, bc->off[n * 26] * sizeof(uint64_t));
                        assert_memory_equal(bc->val, bt->val, bc->off[n * 26] * sizeof(float));
                        total += n;
                }
                assert_int_equal(n, 0);
                assert_int_equal(records_next(rt, bt, err, sizeof(err)), 0);
                assert_int_equal(total, 3000);
                records_batch_free(bc);
                records_batch_free(bt);
                records_close(rc);
                records_close(rt);
        }
        gendata_free(g);
        gendata_free(t);
}

static void test_libsvm_reads_back(void **state)
{
        (void)state;
        const uint32_t V = 500;
        struct gendata *g = gen(RECORDS_LIBSVM, 5, V);
        struct gendata_stats st;
        const char *p = path_of("l.svm");
        write_ok(g, p, 5000, 0, &st);
        struct records_reader *r = reader(RECORDS_LIBSVM, p, 39);
        struct records_batch *b;
        assert_int_equal(records_batch_new(100, 0, 1, 39, &b), 0);
        struct binmetrics *m;
        assert_int_equal(binmetrics_new(0, &m), 0);
        int n;
        while ((n = records_next(r, b, err, sizeof(err))) > 0)
                for (int i = 0; i < n; i++) {
                        double z = gendata_bias(g);
                        for (uint32_t k = b->off[i]; k < b->off[i + 1]; k++) {
                                uint64_t idx = b->ids[k];
                                if (k > b->off[i])
                                        assert_true(idx > b->ids[k - 1]); /* ascending */
                                if (idx < 26ull * V) {
                                        assert_true(b->val[k] == 1);
                                        z += gendata_weight(g, (uint32_t)(idx / V), (uint32_t)(idx % V));
                                } else {
                                        assert_true(idx < 26ull * V + 13);
                                        z += gendata_dense_weight(g, (uint32_t)(idx - 26ull * V)) * b->val[k];
                                }
                        }
                        float pr = (float)(1 / (1 + exp(-z)));
                        assert_int_equal(binmetrics_add(m, &pr, &b->label[i], 1), 0);
                }
        assert_int_equal(n, 0);
        assert_int_equal(records_read(r), 5000);
        assert_true(fabs(binmetrics_auc(m) - st.planted_auc) < 2e-3);
        binmetrics_free(m);
        records_batch_free(b);
        records_close(r);
        gendata_free(g);
}

static void test_csv_reads_back(void **state)
{
        (void)state;
        struct gendata *g = gen(RECORDS_CSV, 9, 1);
        struct gendata_stats st;
        const char *p = path_of("r.csv");
        write_ok(g, p, 4000, 0, &st);
        assert_true(fabs(st.planted_rmse - 0.1) < 0.01);
        struct records_reader *r = reader(RECORDS_CSV, p, 0);
        assert_int_equal(records_n_dense(r), 13); /* the header skipped, its count from the first row */
        struct records_batch *b;
        assert_int_equal(records_batch_new(64, 13, 0, 0, &b), 0);
        double se = 0;
        int n;
        while ((n = records_next(r, b, err, sizeof(err))) > 0)
                for (int i = 0; i < n; i++) {
                        double pred = gendata_bias(g);
                        for (int j = 0; j < 13; j++)
                                pred += gendata_dense_weight(g, (uint32_t)j) * b->dense[i * 13 + j];
                        se += (pred - b->label[i]) * (pred - b->label[i]);
                }
        assert_int_equal(records_read(r), 4000);
        assert_true(fabs(sqrt(se / 4000) - st.planted_rmse) < 1e-3);
        /* the meta file */
        assert_int_equal(gendata_write_meta(g, p, &st, err, sizeof(err)), 0);
        char mp[400];
        snprintf(mp, sizeof(mp), "%s.meta.json", p);
        json_t *meta = json_load_file(mp, 0, NULL);
        assert_non_null(meta);
        assert_string_equal(json_string_value(json_object_get(meta, "format")), "csv");
        assert_int_equal(json_integer_value(json_object_get(meta, "rows")), 4000);
        assert_int_equal(json_integer_value(json_object_get(meta, "seed")), 9);
        assert_true(fabs(json_real_value(json_object_get(meta, "planted_rmse")) - st.planted_rmse) < 1e-9);
        json_decref(meta);
        records_batch_free(b);
        records_close(r);
        gendata_free(g);
}

static int cmp_str(const void *a, const void *b)
{
        return strcmp((const char *)a, (const char *)b);
}

static void test_tokens_and_errors(void **state)
{
        (void)state;
        const uint32_t n = 100000;
        char(*t)[9] = malloc((size_t)n * 9);
        for (uint32_t k = 0; k < n; k++)
                gendata_token(7, k, t[k]);
        qsort(t, n, 9, cmp_str);
        for (uint32_t k = 1; k < n; k++)
                assert_true(strcmp(t[k - 1], t[k]) != 0);
        free(t);
        char a[9], b[9];
        gendata_token(1, 5, a);
        gendata_token(2, 5, b);
        assert_string_not_equal(a, b);

        struct gendata *g;
        struct gendata_opts o = {.format = RECORDS_CRITEO, .vocab = 0, .zipf = 1.1};
        assert_int_equal(gendata_new(&o, &g), -EINVAL);
        o.vocab = 10, o.zipf = 0;
        assert_int_equal(gendata_new(&o, &g), -EINVAL);
        g = gen(RECORDS_CRITEO, 1, 10);
        struct gendata_stats st;
        const char *p = "/nonexistent-psfleet-dir/x.tsv";
        assert_true(gendata_write(g, p, 10, 0, &st, err, sizeof(err)) < 0);
        assert_non_null(strstr(err, p));
        gendata_free(g);
        gendata_free(NULL);
}

UNIT_TEST_MAIN(setup, scratch_dir_remove,
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_criteo_reads_back),
        cmocka_unit_test(test_libsvm_reads_back),
        cmocka_unit_test(test_tfrecord_is_criteo),
        cmocka_unit_test(test_csv_reads_back),
        cmocka_unit_test(test_tokens_and_errors))
