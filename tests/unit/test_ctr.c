/* ctr: the sparse front. Unique ids per table in first-seen order, vocab hashing, sum and mean pooling
 * and empty fields in the input's layout, row gradients against a brute-force sum, and an end-to-end
 * finite-difference check of the rows' gradients through a model with the logistic head. Batches are
 * built by hand, as a reader would fill them. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "backend.h"
#include "ctr.h"
#include "model.h"
#include "rng.h"

/* An empty batch with room for cap records (filled by put_field), its labels and features zero. */
static struct records_batch *batch_new(uint32_t cap, uint32_t n_dense, uint32_t n_fields, uint32_t max_ids)
{
        struct records_batch *b = NULL;
        assert_int_equal(records_batch_new(cap, n_dense, n_fields, max_ids, &b), 0);
        memset(b->label, 0, cap * sizeof(float));
        memset(b->dense, 0, (size_t)cap * n_dense * sizeof(float));
        return b;
}

/* Appends the batch's next (record, field): n ids with their values (NULL: all 1). */
static void put_field(struct records_batch *b, uint32_t *field_no, const uint64_t *ids, const float *vals, uint32_t n)
{
        uint32_t at = b->off[*field_no];
        for (uint32_t i = 0; i < n; i++) {
                b->ids[at + i] = ids[i];
                b->val[at + i] = vals ? vals[i] : 1.0f;
        }
        b->off[++*field_no] = at + n;
}

static struct model_spec two_tables(void)
{
        struct model_spec s = {.input = {1, 1, 2}, .n_layers = 1, .head = HEAD_LOGISTIC,
                               .layers = {{.type = LAYER_DENSE, .units = 1}}, .n_embeddings = 2};
        s.emb[0] = (struct embedding_spec){.name = "a", .dim = 2, .n_fields = 2, .fields = {0, 2}};
        s.emb[1] = (struct embedding_spec){.name = "b", .dim = 3, .n_fields = 1, .fields = {1}, .pooling = POOL_MEAN};
        return s;
}

/* Three records of three fields: ids per (record, field). */
static struct records_batch *three_records(void)
{
        struct records_batch *b = batch_new(4, 2, 3, 4);
        uint32_t f = 0;
        static const uint64_t r0f0[] = {7}, r0f1[] = {100, 101}, r0f2[] = {9, 7};
        static const uint64_t r1f0[] = {9}, r1f2[] = {8};
        static const uint64_t r2f0[] = {8}, r2f1[] = {101, 102, 100}, r2f2[] = {7};
        static const float v0f1[] = {2, 3}, v0f2[] = {0.5f, -1};
        put_field(b, &f, r0f0, NULL, 1);
        put_field(b, &f, r0f1, v0f1, 2);
        put_field(b, &f, r0f2, v0f2, 2);
        put_field(b, &f, r1f0, NULL, 1);
        put_field(b, &f, NULL, NULL, 0); /* record 1's field 1 is empty */
        put_field(b, &f, r1f2, NULL, 1);
        put_field(b, &f, r2f0, NULL, 1);
        put_field(b, &f, r2f1, NULL, 3);
        put_field(b, &f, r2f2, NULL, 1);
        b->n = 3;
        for (uint32_t i = 0; i < 6; i++)
                b->dense[i] = (float)(i + 1) / 10;
        return b;
}

static void test_gather_unique_order(void **state)
{
        struct model_spec s = two_tables();
        struct records_batch *b = three_records();
        struct ctr *c;
        assert_int_equal(ctr_new(&s, 4, 4, &c), 0);
        assert_int_equal(ctr_width(c), 2 + 2 * 2 + 3);
        assert_int_equal(ctr_gather(c, b), 0);
        /* table a reads fields 0 and 2: record by record, field by field, first seen first */
        static const uint64_t want_a[] = {7, 9, 8};
        assert_int_equal(ctr_n_unique(c, 0), 3);
        assert_memory_equal(ctr_unique(c, 0), want_a, sizeof(want_a));
        static const uint64_t want_b[] = {100, 101, 102};
        assert_int_equal(ctr_n_unique(c, 1), 3);
        assert_memory_equal(ctr_unique(c, 1), want_b, sizeof(want_b));
        /* table b's buffers start at one id per record (4) and grew for this batch's 5; a second
         * batch reuses everything: only its own ids, in the same memory */
        const float *rows_b = ctr_rows(c, 1), *grads_b = ctr_grads(c, 1);
        b->n = 1;
        assert_int_equal(ctr_gather(c, b), 0);
        assert_ptr_equal(ctr_rows(c, 1), rows_b);
        assert_ptr_equal(ctr_grads(c, 1), grads_b);
        static const uint64_t want_a1[] = {7, 9};
        assert_int_equal(ctr_n_unique(c, 0), 2);
        assert_memory_equal(ctr_unique(c, 0), want_a1, sizeof(want_a1));
        assert_int_equal(ctr_n_unique(c, 1), 2);
        assert_int_equal(ctr_n_unique(c, 2), 0); /* no such table */
        b->n = 0;
        assert_int_equal(ctr_gather(c, b), 0);
        assert_int_equal(ctr_n_unique(c, 0), 0);
        ctr_free(c);
        records_batch_free(b);
}

static void test_vocab_hashing(void **state)
{
        struct model_spec s = two_tables();
        s.emb[0].vocab = 10;
        struct records_batch *b = batch_new(2, 2, 3, 4);
        uint32_t f = 0;
        static const uint64_t f0[] = {13, 3}, f1[] = {UINT64_MAX}, f2[] = {23, 4, UINT64_MAX};
        put_field(b, &f, f0, NULL, 2);
        put_field(b, &f, f1, NULL, 1);
        put_field(b, &f, f2, NULL, 3);
        b->n = 1;
        struct ctr *c;
        assert_int_equal(ctr_new(&s, 2, 4, &c), 0);
        assert_int_equal(ctr_gather(c, b), 0);
        static const uint64_t want[] = {3, 4, UINT64_MAX % 10};
        assert_int_equal(ctr_n_unique(c, 0), 3);
        assert_memory_equal(ctr_unique(c, 0), want, sizeof(want));
        assert_int_equal(ctr_n_unique(c, 1), 1); /* vocab 0: as it is */
        assert_true(ctr_unique(c, 1)[0] == UINT64_MAX);
        ctr_free(c);
        records_batch_free(b);
}

/* Row u of table e holds e * 100 + u * 10 + d. */
static void fill_rows(struct ctr *c, const struct model_spec *s)
{
        for (uint32_t e = 0; e < s->n_embeddings; e++)
                for (uint32_t u = 0; u < ctr_n_unique(c, e); u++)
                        for (uint32_t d = 0; d < s->emb[e].dim; d++)
                                ctr_rows(c, e)[u * s->emb[e].dim + d] = (float)(e * 100 + u * 10 + d);
}

static void test_pooling(void **state)
{
        struct model_spec s = two_tables();
        struct records_batch *b = three_records();
        struct ctr *c;
        assert_int_equal(ctr_new(&s, 4, 4, &c), 0);
        assert_int_equal(ctr_gather(c, b), 0);
        fill_rows(c, &s);
        float x[3 * 9];
        memset(x, 0xff, sizeof(x)); /* NaNs: every float must be written */
        ctr_input(c, b, x);
        /* a: unique 7 -> 0, 9 -> 1, 8 -> 2 (rows (0,1), (10,11), (20,21)); b: 100, 101, 102 -> rows
         * (100,101,102), (110,111,112), (120,121,122) */
        const float want[3][9] = {
                /* dense; a field 0 = row 7; a field 2 = 0.5 row 9 - row 7; b field 1 = mean(100, 101) */
                {0.1f, 0.2f, 0, 1, 0.5f * 10 - 0, 0.5f * 11 - 1, 105, 106, 107},
                /* a field 0 = row 9; field 2 = row 8; b: empty field, zeros */
                {0.3f, 0.4f, 10, 11, 20, 21, 0, 0, 0},
                /* a field 0 = row 8; field 2 = row 7; b = mean(101, 102, 100) */
                {0.5f, 0.6f, 20, 21, 0, 1, 110, 111, 112},
        };
        for (int r = 0; r < 3; r++)
                for (int i = 0; i < 9; i++)
                        assert_float_equal(x[r * 9 + i], want[r][i], 1e-5);
        /* sum pooling weighs by the values: b's field 1 of record 0 is 2 row(100) + 3 row(101) */
        s.emb[1].pooling = POOL_SUM;
        ctr_free(c);
        assert_int_equal(ctr_new(&s, 4, 4, &c), 0);
        assert_int_equal(ctr_gather(c, b), 0);
        fill_rows(c, &s);
        ctr_input(c, b, x);
        assert_float_equal(x[6], 2 * 100 + 3 * 110, 1e-4);
        assert_float_equal(x[9 * 2 + 6], 110 + 120 + 100, 1e-4);
        ctr_free(c);
        records_batch_free(b);
}

/* A random batch: n records, each field 0..3 ids out of a few, random values. */
static struct records_batch *random_batch(struct rng *r, uint32_t n, uint32_t n_dense, uint32_t n_fields)
{
        struct records_batch *b = batch_new(n, n_dense, n_fields, 4 * n_fields);
        uint32_t f = 0;
        for (uint32_t i = 0; i < n; i++) {
                for (uint32_t j = 0; j < n_fields; j++) {
                        uint64_t ids[3];
                        float vals[3];
                        uint32_t k = (uint32_t)rng_below(r, 4);
                        for (uint32_t q = 0; q < k; q++) {
                                ids[q] = 1000 + rng_below(r, 7) * 3 + (j == 2 ? 1000 : 0);
                                vals[q] = rng_uniform_f(r, 0.5f, 2.0f);
                        }
                        put_field(b, &f, ids, vals, k);
                }
                for (uint32_t d = 0; d < n_dense; d++)
                        b->dense[i * n_dense + d] = rng_uniform_f(r, -1, 1);
                b->label[i] = (float)rng_below(r, 2);
        }
        b->n = n;
        return b;
}

static void test_row_grads_bruteforce(void **state)
{
        struct model_spec s = two_tables();
        s.emb[0].vocab = 5; /* collisions too */
        struct rng r;
        rng_init(&r, 17, 0);
        struct records_batch *b = random_batch(&r, 6, 2, 3);
        struct ctr *c;
        assert_int_equal(ctr_new(&s, 8, 12, &c), 0);
        assert_int_equal(ctr_gather(c, b), 0);
        uint32_t W = ctr_width(c);
        float *dx = malloc(sizeof(float) * b->n * W);
        for (uint32_t i = 0; i < b->n * W; i++)
                dx[i] = rng_uniform_f(&r, -1, 1);
        ctr_row_grads(c, b, dx);
        uint32_t x_off = 2;
        for (uint32_t e = 0; e < 2; e++) {
                const struct embedding_spec *es = &s.emb[e];
                for (uint32_t u = 0; u < ctr_n_unique(c, e); u++)
                        for (uint32_t d = 0; d < es->dim; d++) {
                                double want = 0;
                                for (uint32_t i = 0; i < b->n; i++)
                                        for (uint32_t j = 0; j < es->n_fields; j++) {
                                                uint32_t lo = b->off[i * 3 + es->fields[j]], hi = b->off[i * 3 + es->fields[j] + 1];
                                                for (uint32_t k = lo; k < hi; k++) {
                                                        uint64_t id = es->vocab ? b->ids[k] % es->vocab : b->ids[k];
                                                        if (id != ctr_unique(c, e)[u])
                                                                continue;
                                                        double w = es->pooling == POOL_MEAN ? 1.0 / (hi - lo) : b->val[k];
                                                        want += w * dx[i * W + x_off + j * es->dim + d];
                                                }
                                        }
                                assert_float_equal(ctr_grads(c, e)[u * es->dim + d], want, 1e-5);
                        }
                x_off += es->n_fields * es->dim;
        }
        free(dx);
        ctr_free(c);
        records_batch_free(b);
}

/* The loss as a function of the rows: finite differences against ctr_row_grads(model_input_grad). */
static void test_end_to_end_gradient(void **state)
{
        struct backend *be;
        struct model_spec s = two_tables();
        s.n_layers = 3;
        s.layers[0] = (struct layer_spec){.type = LAYER_DENSE, .units = 4};
        s.layers[1] = (struct layer_spec){.type = LAYER_TANH};
        s.layers[2] = (struct layer_spec){.type = LAYER_DENSE, .units = 1};
        struct rng r;
        rng_init(&r, 5, 0);
        struct records_batch *b = random_batch(&r, 5, 2, 3);
        struct model *m;
        struct ctr *c;
        assert_int_equal(backend_cpu_new(1, &be), 0);
        assert_int_equal(model_new(&s, be, 8, &m), 0);
        assert_int_equal(model_init_params(m, 3), 0);
        assert_int_equal(model_set_input_grad(m, true), 0);
        assert_int_equal(ctr_new(&s, 8, 12, &c), 0);
        assert_int_equal(model_input_size(m), ctr_width(c));
        assert_int_equal(ctr_gather(c, b), 0);
        for (uint32_t e = 0; e < 2; e++)
                for (uint32_t i = 0; i < ctr_n_unique(c, e) * s.emb[e].dim; i++)
                        ctr_rows(c, e)[i] = rng_uniform_f(&r, -0.5f, 0.5f);
        float *x = malloc(sizeof(float) * b->n * ctr_width(c)), loss, lp, lm;
        ctr_input(c, b, x);
        assert_int_equal(model_forward_f(m, x, b->label, b->n, &loss, NULL), 0);
        assert_int_equal(model_backward(m, NULL, NULL), 0);
        ctr_row_grads(c, b, model_input_grad(m));
        size_t checked = 0;
        const float h = 1e-3f;
        for (uint32_t e = 0; e < 2; e++)
                for (uint32_t i = 0; i < ctr_n_unique(c, e) * s.emb[e].dim; i++) {
                        float *v = &ctr_rows(c, e)[i], keep = *v;
                        *v = keep + h;
                        ctr_input(c, b, x);
                        assert_int_equal(model_forward_f(m, x, b->label, b->n, &lp, NULL), 0);
                        *v = keep - h;
                        ctr_input(c, b, x);
                        assert_int_equal(model_forward_f(m, x, b->label, b->n, &lm, NULL), 0);
                        *v = keep;
                        double num = ((double)lp - lm) / (2.0 * h), an = ctr_grads(c, e)[i];
                        if (fabs(num - an) > 2e-4 + 5e-3 * fabs(num))
                                print_message("table %u float %u: analytic %g numeric %g\n", e, i, an, num);
                        assert_true(fabs(num - an) <= 2e-4 + 5e-3 * fabs(num));
                        checked++;
                }
        assert_true(checked >= 10);
        free(x);
        ctr_free(c);
        model_free(m);
        backend_free(be);
        records_batch_free(b);
}

static void test_errors(void **state)
{
        struct model_spec s = two_tables();
        struct ctr *c = NULL;
        struct model_spec none = s;
        none.n_embeddings = 0;   /* records of dense features only (CSV): no tables, x is the features */
        assert_int_equal(ctr_new(&none, 4, 4, &c), 0);
        assert_int_equal(ctr_width(c), none.input[2]);
        assert_int_equal(ctr_n_unique(c, 0), 0);
        c = ctr_free(c);
        none.input[1] = 2;       /* not flat: an image as [C, H, W] (TFRecord), without tables only */
        assert_int_equal(ctr_new(&none, 4, 4, &c), 0);
        assert_int_equal(ctr_width(c), 2 * none.input[2]);
        c = ctr_free(c);
        s.input[1] = 2;
        assert_int_equal(ctr_new(&s, 4, 4, &c), -EINVAL);
        s.input[1] = 1;
        assert_int_equal(ctr_new(&s, 0, 4, &c), -EINVAL);
        assert_int_equal(ctr_new(&s, 4, 0, &c), -EINVAL);
        assert_null(c);
        assert_null(ctr_free(NULL));
        struct records_batch *b = three_records();
        assert_int_equal(ctr_new(&s, 2, 4, &c), 0);
        assert_int_equal(ctr_gather(c, b), -EINVAL); /* 3 records, room for 2 */
        assert_int_equal(ctr_n_unique(c, 0), 0);
        ctr_free(c);
        s.emb[0].fields[1] = 3; /* the batch has fields 0..2 */
        assert_int_equal(ctr_new(&s, 4, 4, &c), 0);
        assert_int_equal(ctr_gather(c, b), -EINVAL);
        ctr_free(c);
        s = two_tables();
        s.input[2] = 3; /* the batch has 2 dense features */
        assert_int_equal(ctr_new(&s, 4, 4, &c), 0);
        assert_int_equal(ctr_gather(c, b), -EINVAL);
        ctr_free(c);
        records_batch_free(b);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_gather_unique_order),
        cmocka_unit_test(test_vocab_hashing),
        cmocka_unit_test(test_pooling),
        cmocka_unit_test(test_row_grads_bruteforce),
        cmocka_unit_test(test_end_to_end_gradient),
        cmocka_unit_test(test_errors))
