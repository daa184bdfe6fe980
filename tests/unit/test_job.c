/* The job layout from the model spec alone: the same variables (names, shapes, offsets, layers) and
 * parameter count as a model built from the spec, for the examples' MLP and CNN; the layout's shard
 * tables cover the placement; a spec no model can be built from is refused alike. */
#include <errno.h>
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
#include "config.h"
#include "job.h"
#include "model.h"

static struct job_config *example(const char *file) {
        const char *src = getenv("PSFLEET_SOURCE_DIR");
        char path[1024], err[512];
        snprintf(path, sizeof(path), "%s/examples/%s", src ? src : ".", file);
        struct job_config *cfg;
        if (config_load(path, &cfg, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        return cfg;
}

static void same_as_model(struct job_config *cfg) {
        struct backend *be;
        struct model *m;
        struct job_layout *L;
        assert_int_equal(backend_cpu_new(1, &be), 0);
        assert_int_equal(model_new(&cfg->model, be, 1, &m), 0);
        assert_int_equal(job_layout_new(cfg, &L), 0);
        assert_int_equal(L->n_vars, model_n_vars(m));
        assert_int_equal(L->n_params, model_n_params(m));
        for (uint32_t v = 0; v < L->n_vars; v++) {
                const struct model_var *mv = model_var(m, v);
                assert_string_equal(L->vars[v].name, mv->name);
                assert_int_equal(L->vars[v].rows, mv->rows);
                assert_int_equal(L->vars[v].cols, mv->cols);
                assert_int_equal(L->vars[v].offset, mv->offset);
                assert_int_equal(L->vars[v].layer, mv->layer);
        }
        assert_int_equal(L->fingerprint, config_fingerprint(cfg));
        assert_int_equal(L->n_shards, cfg->cluster.n_ps);
        /* every part in exactly one shard's list */
        uint32_t total = 0;
        for (uint32_t s = 0; s < L->n_shards; s++)
                for (uint32_t k = 0; k < L->shard_count[s]; k++, total++)
                        assert_int_equal(L->plan->parts[L->shard_parts[L->shard_first[s] + k]].shard, s);
        assert_int_equal(total, L->plan->n_parts);
        job_layout_free(L);
        model_free(m);
        backend_free(be);
}

static void expect_var(const struct job_layout *L, uint32_t v, const char *name, uint32_t rows, uint32_t cols,
                       uint32_t layer) {
        assert_true(v < L->n_vars);
        assert_string_equal(L->vars[v].name, name);
        if (L->vars[v].rows != rows || L->vars[v].cols != cols || L->vars[v].layer != layer)
                fail_msg("%s: (%u, %u) of layer %u, expected (%u, %u) of layer %u", name, L->vars[v].rows,
                         L->vars[v].cols, L->vars[v].layer, rows, cols, layer);
}

/* An example's layout, checked against its model first. */
static struct job_layout *example_layout(const char *file, struct job_config **cfg_ret) {
        struct job_config *cfg = example(file);
        same_as_model(cfg);
        struct job_layout *L;
        assert_int_equal(job_layout_new(cfg, &L), 0);
        *cfg_ret = cfg;
        return L;
}

static void test_mlp(void **state) {
        (void)state;
        struct job_config *cfg;
        struct job_layout *L = example_layout("fmnist-mlp.json", &cfg);
        assert_int_equal(L->n_vars, 8);
        expect_var(L, 0, "dense0/kernel", 784, 256, 0);
        expect_var(L, 1, "dense0/bias", 1, 256, 0);
        expect_var(L, 6, "dense3/kernel", 64, 10, 6);
        assert_int_equal(L->n_params, 242762);
        assert_int_equal(job_layout_find(L, "dense3/bias"), 7);
        assert_int_equal(job_layout_find(L, "dense4/bias"), -ENOENT);
        job_layout_free(L);
        config_free(cfg);
}

static void test_cnn(void **state) {
        (void)state;
        struct job_config *cfg;
        struct job_layout *L = example_layout("fmnist-cnn.json", &cfg);
        expect_var(L, 0, "conv0/kernel", 32, 25, 0);
        expect_var(L, 1, "conv0/bias", 1, 32, 0);
        expect_var(L, 2, "conv1/kernel", 64, 32 * 25, 3);
        expect_var(L, 4, "dense0/kernel", 64 * 7 * 7, 1024, 7);
        job_layout_free(L);
        config_free(cfg);
}

/* More shards than one, a variable split: the same variables, placed. */
static void test_mlp_three_shards(void **state) {
        (void)state;
        char err[512];
        struct job_config *cfg;
        const char *json =
                "{\"job\": \"t\", \"cluster\": {\"chief\": [\"127.0.0.1:1\"], \"ps\": [\"127.0.0.1:2\", \"127.0.0.1:3\","
                " \"127.0.0.1:4\"], \"worker\": [\"127.0.0.1:5\"]}, \"ps\": {\"split_bytes\": 65536},"
                " \"model\": {\"input\": [784], \"layers\": [{\"type\": \"dense\", \"units\": 256}, {\"type\": \"relu\"},"
                " {\"type\": \"dense\", \"units\": 10}]}}";
        if (config_load_string(json, "test.json", &cfg, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        same_as_model(cfg);
        config_free(cfg);
}

static void test_bad_specs(void **state) {
        (void)state;
        struct backend *be;
        assert_int_equal(backend_cpu_new(1, &be), 0);
        struct model_spec bad[] = {
                {.input = {1, 1, 4}, .n_layers = 1, .layers = {{.type = LAYER_DENSE, .units = 1}}},   /* one class */
                {.input = {1, 1, 4}, .n_layers = 0},
                {.input = {0, 1, 4}, .n_layers = 1, .layers = {{.type = LAYER_DENSE, .units = 2}}},
                {.input = {1, 4, 4}, .n_layers = 1, .layers = {{.type = LAYER_CONV2D, .filters = 2, .kernel = 5}}},
                {.input = {1, 4, 4}, .n_layers = 1, .layers = {{.type = LAYER_MAXPOOL2D, .pool = 5}}},
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                struct model_spec_var vars[MODEL_MAX_VARS];
                struct model *m = NULL;
                assert_int_equal(model_spec_vars(&bad[i], vars, NULL), -EINVAL);
                assert_int_equal(model_new(&bad[i], be, 1, &m), -EINVAL);
        }
        struct model_spec ok = {.input = {2, 4, 4}, .n_layers = 3,
                                .layers = {{.type = LAYER_CONV2D, .filters = 3, .kernel = 3},
                                           {.type = LAYER_MAXPOOL2D, .pool = 2},
                                           {.type = LAYER_DENSE, .units = 5}}};
        struct model_spec_var vars[MODEL_MAX_VARS];
        size_t np;
        assert_int_equal(model_spec_vars(&ok, vars, &np), 4);
        assert_int_equal(vars[2].rows, 3 * 2 * 2);   /* pooled, not flattened: C*H*W all the same */
        assert_int_equal(np, 3 * 18 + 3 + 12 * 5 + 5);
        backend_free(be);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_mlp),
        cmocka_unit_test(test_cnn),
        cmocka_unit_test(test_mlp_three_shards),
        cmocka_unit_test(test_bad_specs))
