/* ctr_train: a job's record files opened as a shard, the evaluation of a model with embeddings, and
 * the standalone trainer on such a job (deterministic, and it learns a planted rule). */
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

#include "scratch_dir.h"
#include "unit.h"

#include "config.h"
#include "ctr_train.h"
#include "model.h"
#include "sparse_opts.h"
#include "sparse_table.h"
#include "trainer.h"

/* Criteo-like rows whose label is 1 exactly when field C1's token is "a" (C2 noise): a model with an
 * embedding of C1 can learn it to an AUC of 1. */
static void write_rows(const char *name, int n, unsigned seed) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", scratch_dir, name);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        for (int i = 0; i < n; i++) {
                seed = seed * 1103515245u + 12345u;
                int pos = (seed >> 16) & 1;
                fprintf(f, "%d", pos);
                for (int j = 0; j < 13; j++)
                        fprintf(f, "\t%d", (int)((seed >> (j + 3)) & 3));
                fprintf(f, "\t%s\t%x", pos ? "a" : "b", (seed >> 8) & 15);
                for (int j = 2; j < 26; j++)
                        fputs("\t", f);
                fputc('\n', f);
        }
        assert_int_equal(fclose(f), 0);
}

static struct job_config *job(const char *head, const char *extra_training) {
        char js[2048], err[512];
        snprintf(js, sizeof(js),
                 "{\"job\": \"t\", \"cluster\": {\"chief\": [\"127.0.0.1:1\"], \"ps\": [\"127.0.0.1:2\"], "
                 "\"worker\": [\"127.0.0.1:3\"]}, "
                 "\"model\": {\"input\": [13], \"head\": \"%s\", \"seed\": 3, "
                 "\"embeddings\": [{\"name\": \"c\", \"fields\": [0, 1], \"dim\": 4}], "
                 "\"layers\": [{\"type\": \"dense\", \"units\": 8}, {\"type\": \"relu\"}, "
                 "{\"type\": \"dense\", \"units\": %d}]}, "
                 "\"data\": {\"dir\": \"%s\", \"format\": \"criteo\", \"train_files\": [\"train.tsv\"], "
                 "\"test_files\": [\"test.tsv\"]}, "
                 "\"training\": {\"batch_size\": 32, \"optimizer\": \"adagrad\", \"learning_rate\": 0.1, "
                 "\"sparse_learning_rate\": 0.5, \"max_steps\": 200, \"report_every_steps\": 50%s}}",
                 head, strcmp(head, "softmax") == 0 ? 2 : 1, scratch_dir, extra_training);
        struct job_config *c = NULL;
        int r = config_load_string(js, "t.json", &c, err, sizeof(err));
        if (r < 0)
                fail_msg("%s", err);
        return c;
}

static int setup(void **state) {
        (void)state;
        if (scratch_dir_make("ctr-train") < 0)
                return -1;
        write_rows("train.tsv", 4000, 1);
        write_rows("test.tsv", 500, 2);
        return 0;
}

static void test_records_open(void **state) {
        (void)state;
        struct job_config *c = job("logistic", "");
        struct records_reader *rd = NULL;
        char err[512];
        assert_int_equal(ctr_records_open(c, false, 0, 1, false, &rd, err, sizeof(err)), 0);
        assert_int_equal(records_n_dense(rd), 13);
        assert_int_equal(records_n_fields(rd), 26);
        records_close(rd);
        /* a missing test file: the data are at fault, and the message names it */
        free(c->data.test_files[0]);
        c->data.test_files[0] = strdup("gone.tsv");
        assert_int_equal(ctr_records_open(c, true, 0, 1, false, &rd, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "gone.tsv"));
        config_free(c);
}

struct tables {
        struct sparse_table *t;
};

static int lookup(void *ud, uint32_t e, const uint64_t *ids, size_t n, float *rows, char *err, size_t errlen) {
        (void)e, (void)err, (void)errlen;
        struct tables *tb = ud;
        return sparse_table_pull(tb->t, ids, n, rows, false, 0);
}

/* A model of zeros (dense variables and rows) predicts 0.5 for every record: AUC 0.5 (all ties),
 * log loss ln 2, accuracy the share of label 0. */
static void test_evaluate_zero_model(void **state) {
        (void)state;
        struct job_config *c = job("logistic", "");
        c->model.emb[0].init_stddev = 0;
        struct backend *be = NULL;
        struct model *m = NULL;
        struct sparse_table_opts o;
        struct tables tb = {0};
        char err[512];
        sparse_table_opts_from_config(c, 0, &o);
        assert_int_equal(sparse_table_new(&o, &tb.t), 0);
        assert_int_equal(backend_cpu_new(1, &be), 0);
        assert_int_equal(model_new(&c->model, be, 64, &m), 0);
        memset(model_params(m), 0, model_n_params(m) * sizeof(float));
        struct ctr_eval ev;
        assert_int_equal(ctr_evaluate(c, m, lookup, &tb, &ev, err, sizeof(err)), 0);
        assert_int_equal(ev.n, 500);
        assert_true(fabs(ev.auc - 0.5) < 1e-12);
        assert_true(fabs(ev.logloss - log(2.0)) < 1e-6);
        assert_true(fabs(ev.loss - log(2.0)) < 1e-5);
        assert_true(isnan(ev.rmse));
        assert_true(ev.accuracy > 0.3 && ev.accuracy < 0.7);
        assert_int_equal(sparse_table_rows(tb.t), 0);   /* evaluation creates no rows */
        model_free(m);
        backend_free(be);
        sparse_table_free(tb.t);
        config_free(c);
}

static char *slurp(FILE *f) {
        long n = ftell(f);
        char *s = calloc(1, (size_t)n + 1);
        rewind(f);
        assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
        return s;
}

/* The same job twice: the same loss at every step; and it learns the planted rule. */
static void test_standalone_deterministic_and_learns(void **state) {
        (void)state;
        struct job_config *c = job("logistic", "");
        struct trainer_result r1, r2;
        char err[512];
        FILE *l1 = tmpfile(), *l2 = tmpfile();
        assert_int_equal(trainer_standalone(c, l1, NULL, NULL, NULL, &r1, err, sizeof(err)), 0);
        assert_int_equal(trainer_standalone(c, l2, NULL, NULL, NULL, &r2, err, sizeof(err)), 0);
        char *a = slurp(l1), *b = slurp(l2);
        assert_true(strlen(a) > 100);
        assert_string_equal(a, b);
        assert_int_equal(r1.steps, 200);
        assert_int_equal(r1.test_examples, 500);
        assert_true(r1.test_auc > 0.95);
        assert_true(r1.test_accuracy > 0.9);
        free(a), free(b);
        fclose(l1), fclose(l2);
        config_free(c);
}

/* A softmax head on records: labels must be class indices; these (0 and 1) are, so it trains. An MSE
 * head gives an RMSE and no AUC. */
static void test_other_heads(void **state) {
        (void)state;
        struct trainer_result r;
        char err[512];
        struct job_config *c = job("softmax", "");
        assert_int_equal(trainer_standalone(c, NULL, NULL, NULL, NULL, &r, err, sizeof(err)), 0);
        assert_true(r.test_accuracy > 0.9);
        config_free(c);
        c = job("mse", "");
        assert_int_equal(trainer_standalone(c, NULL, NULL, NULL, NULL, &r, err, sizeof(err)), 0);
        assert_true(r.test_rmse >= 0 && r.test_rmse < 0.3);
        assert_true(isnan(r.test_auc));
        config_free(c);
}

UNIT_TEST_MAIN(setup, scratch_dir_remove,
        cmocka_unit_test(test_records_open),
        cmocka_unit_test(test_evaluate_zero_model),
        cmocka_unit_test(test_standalone_deterministic_and_learns),
        cmocka_unit_test(test_other_heads))
