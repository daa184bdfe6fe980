/* data: IDX reading (gzip'd and plain) with exact error messages, datasets, shards, and the real
 * Fashion-MNIST when it is installed. */
#include <errno.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "scratch_dir.h"
#include "unit.h"

#include "data.h"

static int setup(void **state)
{
        (void)state;
        return scratch_dir_make("data");
}

static void put_be32(uint8_t *p, uint32_t v)
{
        p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* Writes magic, dims, then `n_data` bytes (value i % 251), gzip'd or plain; returns the path. */
static const char *write_idx(const char *name, bool gz, uint32_t magic, const uint32_t *dims, uint32_t nd,
                             size_t n_data, size_t cut_header)
{
        static char paths[8][320];
        static int next;
        char *path = paths[next++ % 8];
        snprintf(path, 320, "%s/%s", scratch_dir, name);
        uint8_t hdr[16];
        put_be32(hdr, magic);
        for (uint32_t i = 0; i < nd; i++)
                put_be32(hdr + 4 + 4 * i, dims[i]);
        size_t hlen = 4 + 4 * (size_t)nd;
        if (cut_header)
                hlen = cut_header;
        uint8_t *data = malloc(n_data + 1);
        for (size_t i = 0; i < n_data; i++)
                data[i] = (uint8_t)(i % 251);
        if (gz) {
                gzFile f = gzopen(path, "wb");
                assert_non_null(f);
                gzwrite(f, hdr, (unsigned)hlen);
                if (!cut_header && n_data)
                        gzwrite(f, data, (unsigned)n_data);
                gzclose(f);
        } else {
                FILE *f = fopen(path, "wb");
                assert_non_null(f);
                fwrite(hdr, 1, hlen, f);
                if (!cut_header && n_data)
                        fwrite(data, 1, n_data, f);
                fclose(f);
        }
        free(data);
        return path;
}

static void test_idx_roundtrip(void **state)
{
        for (int gz = 0; gz < 2; gz++) {
                const uint32_t dims[3] = {5, 3, 4};
                const char *p = write_idx(gz ? "a.gz" : "a.raw", gz, 0x803, dims, 3, 60, 0);
                struct idx *x = NULL;
                char err[512] = "";
                assert_int_equal(idx_load(p, &x, err, sizeof(err)), 0);
                assert_int_equal(x->n_dims, 3);
                assert_int_equal(x->dims[0], 5);
                assert_int_equal(x->dims[2], 4);
                assert_int_equal(x->size, 60);
                assert_int_equal(x->data[59], 59);
                idx_free(x);
        }
}

/* idx_load(p) fails with r, says "p: what", and returns no idx. */
static void assert_idx_error(const char *p, int r, const char *what)
{
        char err[512], want[512];
        struct idx *x = NULL;

        assert_int_equal(idx_load(p, &x, err, sizeof(err)), r);
        snprintf(want, sizeof(want), "%s: %s", p, what);
        assert_string_equal(err, want);
        assert_null(x);
}

static void test_idx_errors(void **state)
{
        const uint32_t dims[3] = {1000, 28, 28};

        assert_idx_error(write_idx("magic.gz", true, 0x903, dims, 3, 10, 0), -EBADMSG,
                         "offset 0: bad magic 0x00000903 (expected 0x0000080x)");

        assert_idx_error(write_idx("trunc.gz", true, 0x803, dims, 3, 1000, 0), -EBADMSG,
                         "offset 16: truncated: expected 784000 bytes of data, file ends after 1000");

        assert_idx_error(write_idx("trunc.raw", false, 0x803, dims, 3, 1000, 0), -EBADMSG,
                         "offset 16: truncated: expected 784000 bytes of data, file ends after 1000");

        assert_idx_error(write_idx("hdr.gz", true, 0x803, dims, 3, 0, 11), -EBADMSG,
                         "offset 4: truncated header: expected 12 bytes of dimensions, file ends after 7");

        assert_idx_error(write_idx("magic-short.raw", false, 0x803, dims, 3, 0, 2), -EBADMSG,
                         "offset 0: truncated header: expected 4 bytes of magic, file ends after 2");

        const uint32_t huge[3] = {100000, 100000, 100000};
        assert_idx_error(write_idx("huge.gz", true, 0x803, huge, 3, 0, 0), -EFBIG,
                         "offset 4: dimensions 100000x100000x100000 too large (limit 4294967296 bytes)");

        const uint32_t small[1] = {4};
        assert_idx_error(write_idx("trailing.raw", false, 0x801, small, 1, 5, 0), -EBADMSG,
                         "offset 12: trailing bytes after 4 bytes of data");

        char missing[320];
        snprintf(missing, sizeof(missing), "%s/nope.gz", scratch_dir);
        assert_idx_error(missing, -ENOENT, "No such file or directory");
}

static void test_dataset(void **state)
{
        char err[512] = "", want[700];
        const uint32_t idims[3] = {6, 2, 3}, ldims[1] = {6};
        const char *ip = write_idx("im.gz", true, 0x803, idims, 3, 36, 0);
        const char *lp = write_idx("lb.raw", false, 0x801, ldims, 1, 6, 0);
        struct dataset *d = NULL;
        assert_int_equal(dataset_load(ip, lp, &d, err, sizeof(err)), 0);
        assert_int_equal(d->n, 6);
        assert_int_equal(d->dim, 6);
        assert_float_equal(d->x[0], 0.0, 0);
        assert_float_equal(d->x[35], 35 / 255.0, 1e-7);
        assert_int_equal(d->y[5], 5);
        assert_int_equal(dataset_max_label(d), 5);
        d = dataset_free(d);

        const uint32_t ldims5[1] = {5};
        lp = write_idx("lb5.gz", true, 0x801, ldims5, 1, 5, 0);
        assert_int_equal(dataset_load(ip, lp, &d, err, sizeof(err)), -EBADMSG);
        snprintf(want, sizeof(want), "%s: offset 4: 5 labels, but %s has 6 images", lp, ip);
        assert_string_equal(err, want);

        /* swapped files */
        lp = write_idx("lb6.gz", true, 0x801, ldims, 1, 6, 0);
        assert_int_equal(dataset_load(lp, ip, &d, err, sizeof(err)), -EBADMSG);
        snprintf(want, sizeof(want), "%s: offset 0: images need 3 dimensions (magic 0x00000803), found 1", lp);
        assert_string_equal(err, want);

        /* a missing file is the data's fault, the one kind daemons exit 65 on; the message keeps why */
        char missing[320];
        snprintf(missing, sizeof(missing), "%s/nope.gz", scratch_dir);
        assert_int_equal(dataset_load(ip, missing, &d, err, sizeof(err)), -EBADMSG);
        snprintf(want, sizeof(want), "%s: No such file or directory", missing);
        assert_string_equal(err, want);
        assert_null(d);

        /* does it fit a model: its input and its classes */
        lp = write_idx("lb6b.raw", false, 0x801, ldims, 1, 6, 0);
        assert_int_equal(dataset_load(ip, lp, &d, err, sizeof(err)), 0);
        assert_int_equal(dataset_fits(d, ip, 6, 6, err, sizeof(err)), 0);
        assert_int_equal(dataset_fits(d, ip, 784, 10, err, sizeof(err)), -EBADMSG);
        snprintf(want, sizeof(want), "%s: 6 values per example, labels up to 5; the model takes 784 values and 10 classes", ip);
        assert_string_equal(err, want);
        assert_int_equal(dataset_fits(d, ip, 6, 5, err, sizeof(err)), -EBADMSG);
        dataset_free(d);
        assert_null(dataset_free(NULL));
}

static struct dataset *make_dataset(uint32_t n)
{
        struct dataset *d = calloc(1, sizeof(*d));
        d->n = n, d->rows = 1, d->cols = 2, d->dim = 2;
        d->x = malloc(sizeof(float) * 2 * n);
        d->y = malloc(n);
        for (uint32_t i = 0; i < n; i++) {
                d->x[2 * i] = (float)i; /* the example's index, to check copies */
                d->x[2 * i + 1] = -(float)i;
                d->y[i] = (uint8_t)(i % 10);
        }
        return d;
}

static void test_shards(void **state)
{
        const uint32_t n = 100, W = 3;
        struct dataset *d = make_dataset(n);
        int seen[100] = {0};
        for (uint32_t k = 0; k < W; k++) {
                struct data_iter *it;
                assert_int_equal(data_iter_new(d, k, W, 42, &it), 0);
                uint32_t sz = data_iter_size(it);
                assert_int_equal(sz, k == 0 ? 34 : 33);
                float x[2 * 34];
                uint8_t y[34];
                data_iter_next_batch(it, sz, x, y);
                assert_int_equal(data_iter_epoch(it), 0);
                assert_int_equal(data_iter_examples_seen(it), sz);
                for (uint32_t b = 0; b < sz; b++) {
                        uint32_t i = (uint32_t)x[2 * b];
                        assert_int_equal(i % W, k);
                        assert_float_equal(x[2 * b + 1], -(float)i, 0);
                        assert_int_equal(y[b], i % 10);
                        seen[i]++;
                }
                data_iter_free(it);
        }
        for (uint32_t i = 0; i < n; i++)
                assert_int_equal(seen[i], 1); /* disjoint and covering */
        dataset_free(d);
}

static void test_data_iter_epochs(void **state)
{
        struct dataset *d = make_dataset(50);
        struct data_iter *a, *b, *c;
        assert_int_equal(data_iter_new(d, 1, 2, 7, &a), 0);
        assert_int_equal(data_iter_new(d, 1, 2, 7, &b), 0);
        assert_int_equal(data_iter_new(d, 1, 2, 8, &c), 0);
        uint32_t e0[25], e1[25], other[25];
        for (uint32_t i = 0; i < 25; i++) {
                e0[i] = data_iter_index_at(a, i);
                assert_int_equal(data_iter_index_at(b, i), e0[i]);
                other[i] = data_iter_index_at(c, i);
        }
        assert_memory_not_equal(e0, other, sizeof(e0));
        /* batches of 10 wrap into epoch 1 (reshuffled) at example 25 */
        float x[20];
        uint8_t y[10];
        data_iter_next_batch(a, 10, x, y);
        data_iter_next_batch(a, 10, x, y);
        data_iter_next_batch(a, 10, x, y);
        assert_int_equal(data_iter_epoch(a), 1);
        assert_int_equal(data_iter_examples_seen(a), 30);
        assert_int_equal((uint32_t)x[2 * 4], e0[24]);
        for (uint32_t i = 0; i < 25; i++)
                e1[i] = data_iter_index_at(a, i);
        assert_int_equal((uint32_t)x[2 * 5], e1[0]);
        assert_memory_not_equal(e0, e1, sizeof(e0));
        /* a fresh iterator with the same seed replays the same epochs */
        for (int i = 0; i < 3; i++)
                data_iter_next_batch(b, 10, x, y);
        for (uint32_t i = 0; i < 25; i++)
                assert_int_equal(data_iter_index_at(b, i), e1[i]);

        struct data_iter *bad = NULL;
        assert_int_equal(data_iter_new(d, 2, 2, 7, &bad), -EINVAL);
        assert_int_equal(data_iter_new(d, 0, 0, 7, &bad), -EINVAL);
        assert_int_equal(data_iter_new(d, 50, 60, 7, &bad), -EINVAL); /* empty shard */
        assert_null(bad);
        data_iter_free(a);
        data_iter_free(b);
        data_iter_free(c);
        dataset_free(d);
}

/* Skipping n examples lands where reading them would have, across epoch boundaries too. */
static void test_data_iter_skip(void **state)
{
        (void)state;
        struct dataset *d = make_dataset(50);
        uint64_t skips[] = {0, 3, 16, 17, 40, 123};
        for (size_t s = 0; s < sizeof(skips) / sizeof(skips[0]); s++) {
                struct data_iter *a, *b;
                assert_int_equal(data_iter_new(d, 1, 3, 9, &a), 0);
                assert_int_equal(data_iter_new(d, 1, 3, 9, &b), 0);
                float xa[4 * 2], xb[4 * 2];   /* (B, dim) */
                uint8_t ya[4], yb[4];
                for (uint64_t i = 0; i < skips[s]; i++)
                        data_iter_next_batch(a, 1, xa, ya);
                data_iter_skip(b, skips[s]);
                assert_int_equal(data_iter_examples_seen(a), data_iter_examples_seen(b));
                for (int i = 0; i < 20; i++) {
                        data_iter_next_batch(a, 4, xa, ya);
                        data_iter_next_batch(b, 4, xb, yb);
                        assert_memory_equal(ya, yb, 4);
                        assert_memory_equal(xa, xb, sizeof(xa));
                }
                data_iter_free(a);
                data_iter_free(b);
        }
        dataset_free(d);
}

static void test_fashion_mnist(void **state)
{
        const char *base = "/usr/share/datasets/fashion-mnist";
        char ip[256], lp[256], err[512] = "";
        snprintf(ip, sizeof(ip), "%s/train-images-idx3-ubyte.gz", base);
        snprintf(lp, sizeof(lp), "%s/train-labels-idx1-ubyte.gz", base);
        if (access(ip, R_OK) != 0 || access(lp, R_OK) != 0) {
                print_message("Fashion-MNIST not installed under %s (package dataset-fashion-mnist): skipped\n",
                              base);
                skip();
        }
        struct dataset *d = NULL;
        assert_int_equal(dataset_load(ip, lp, &d, err, sizeof(err)), 0);
        assert_int_equal(d->n, 60000);
        assert_int_equal(d->rows, 28);
        assert_int_equal(d->cols, 28);
        assert_int_equal(dataset_max_label(d), 9);
        uint32_t counts[10] = {0};
        for (uint32_t i = 0; i < d->n; i++)
                counts[d->y[i]]++;
        for (int c = 0; c < 10; c++)
                assert_int_equal(counts[c], 6000);
        float lo = 1, hi = 0;
        for (size_t i = 0; i < (size_t)d->n * d->dim; i++) {
                lo = d->x[i] < lo ? d->x[i] : lo;
                hi = d->x[i] > hi ? d->x[i] : hi;
        }
        assert_float_equal(lo, 0.0, 0);
        assert_float_equal(hi, 1.0, 0);
        dataset_free(d);
}

UNIT_TEST_MAIN(setup, scratch_dir_remove,
        cmocka_unit_test(test_idx_roundtrip), cmocka_unit_test(test_idx_errors),
        cmocka_unit_test(test_dataset),       cmocka_unit_test(test_shards),
        cmocka_unit_test(test_data_iter_epochs),  cmocka_unit_test(test_data_iter_skip),
        cmocka_unit_test(test_fashion_mnist))
