/* Tests of config_onnx.c: model.onnx and model.inputs. A job file names an ONNX file (relative to the
 * job file's folder); its initializers become the variables, its inputs are matched with the data,
 * a table's lookup is cut out of the graph (the table is no dense variable, its rows a feed), the
 * file's contents are in the fingerprint, and every mistake is refused with a message that names the
 * key and the reason. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "config.h"
#include "graph.h"
#include "onnx_build.h"
#include "scratch_dir.h"
#include "sparse_opts.h"
#include "sparse_table.h"
#include "unit.h"
#include "util.h"

static int setup(void **state)
{
        (void)state;
        return scratch_dir_make("config_onnx");
}

static void write_model(const char *name, Onnx__ModelProto *m)
{
        char path[512];
        size_t len;
        uint8_t *buf = pack(m, &len);
        onnx__model_proto__free_unpacked(m, NULL);
        snprintf(path, sizeof(path), "%s/%s", scratch_dir, name);
        assert_int_equal(write_file_atomic(path, buf, len), 0);
        free(buf);
}

static const float W[4 * 3] = { 0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f, -0.7f, 0.8f, 0.9f, 1.0f, -1.1f, 0.2f };
static const float BIAS[3] = { 0.05f, -0.1f, 0.2f };

/* x (batch, 4) -> Gemm(W (4, 3), b) -> y (batch, 3) */
static Onnx__ModelProto *linear(float b0)
{
        Onnx__ModelProto *m = model_new(17);
        float b[3] = { b0, BIAS[1], BIAS[2] };
        add_input(m, "x", T_FLOAT, "batch,4");
        add_init(m, "fc.weight", T_FLOAT, 2, (int64_t[]){ 4, 3 }, W, false);
        add_init(m, "fc.bias", T_FLOAT, 1, (int64_t[]){ 3 }, b, false);
        add_node(m, "Gemm", "fc", "x,fc.weight,fc.bias", "y");
        add_output(m, "y");
        return m;
}

/* A CTR model: dense (batch, 13) and ids (batch, 26): emb.weight (100, 4) looked up, flattened,
 * concatenated with the dense features, Gemm to one logit; with `first`, a second table first.weight
 * (100, 1) looked up with the same ids and summed in (DeepFM's first-order term). */
static Onnx__ModelProto *ctr(bool first)
{
        Onnx__ModelProto *m = model_new(17);
        static float emb[100 * 4], fo[100], w[(13 + 104) * 1];
        for (int i = 0; i < 100 * 4; i++)
                emb[i] = 0.01f * (float)i;
        add_input(m, "dense", T_FLOAT, "batch,13");
        add_input(m, "ids", T_INT64, "batch,26");
        add_init(m, "emb.weight", T_FLOAT, 2, (int64_t[]){ 100, 4 }, emb, false);
        add_init(m, "top.weight", T_FLOAT, 2, (int64_t[]){ 117, 1 }, w, false);
        add_node(m, "Gather", "lookup", "emb.weight,ids", "e");
        Onnx__NodeProto *n = add_node(m, "Flatten", "flat", "e", "ef");
        attr_i(n, "axis", 1);
        n = add_node(m, "Concat", "cat", "dense,ef", "h");
        attr_i(n, "axis", 1);
        if (!first) {
                add_node(m, "MatMul", "top", "h,top.weight", "logit");
        } else {
                add_init(m, "first.weight", T_FLOAT, 2, (int64_t[]){ 100, 1 }, fo, false);
                add_node(m, "MatMul", "top", "h,top.weight", "deep");
                add_node(m, "Gather", "first", "first.weight,ids", "f");
                const_ints(m, "axes", 1, (int64_t[]){ 1 });
                n = add_node(m, "ReduceSum", "fsum", "f,axes", "fs");
                attr_i(n, "keepdims", 0);
                add_node(m, "Add", "sum", "deep,fs", "logit");
        }
        add_output(m, "logit");
        return m;
}

#define CLUSTER "\"cluster\": {\"chief\": [\"localhost:7000\"], \"ps\": [\"localhost:7001\"], " \
                "\"worker\": [\"localhost:7002\"]}"
#define CRITEO "\"data\": {\"format\": \"criteo\", \"train_files\": [\"a.tsv.gz\"]}"

static int load(const char *model_json, const char *data_json, struct job_config **c, char *err, size_t errlen)
{
        char path[512], json[2048];
        snprintf(path, sizeof(path), "%s/job.json", scratch_dir);
        snprintf(json, sizeof(json), "{%s, \"model\": %s%s%s}", CLUSTER, model_json, data_json ? ", " : "",
                 data_json ? data_json : "");
        assert_int_equal(write_file_atomic(path, json, strlen(json)), 0);
        *c = NULL;
        err[0] = 0;
        return config_load(path, c, err, errlen);
}

static struct job_config *load_ok(const char *model_json, const char *data_json)
{
        struct job_config *c;
        char err[1024];
        if (load(model_json, data_json, &c, err, sizeof(err)) < 0)
                fail_msg("unexpected error: %s", err);
        return c;
}

static void refuse(const char *model_json, const char *data_json, const char *want)
{
        struct job_config *c;
        char err[1024];
        int r = load(model_json, data_json, &c, err, sizeof(err));
        if (r != -EINVAL || !strstr(err, want))
                fail_msg("got %d \"%s\", wanted -EINVAL with \"%s\"", r, err, want);
        assert_null(c);
}

static void test_linear_idx(void **state)
{
        (void)state;
        write_model("linear.onnx", linear(BIAS[0]));
        struct job_config *c = load_ok("{\"input\": [4], \"onnx\": \"linear.onnx\"}", NULL);
        const struct model_spec *m = &c->model;
        assert_non_null(m->graph);
        assert_int_equal(m->n_layers, 0);
        assert_int_equal(m->n_feeds, 1);
        assert_int_equal(m->feeds[0].kind, FEED_DATA);
        assert_string_equal(m->graph->tensors[m->feeds[0].tensor].name, "x");
        assert_int_equal(m->feeds[0].count, 4);
        struct model_spec_var vars[MODEL_MAX_VARS];
        size_t np;
        assert_int_equal(model_spec_vars(m, vars, &np), 2);
        assert_string_equal(vars[0].name, "fc.weight");
        assert_int_equal(vars[0].rows, 4);
        assert_int_equal(vars[0].cols, 3);
        assert_string_equal(vars[1].name, "fc.bias");
        assert_int_equal(vars[1].rows, 1);
        assert_int_equal(vars[1].cols, 3);
        assert_int_equal(vars[1].offset, 12);
        assert_int_equal(np, 15);
        uint64_t fp = config_fingerprint(c);
        config_free(c);

        /* the same file elsewhere: the same job; other contents: another */
        char sub[512];
        snprintf(sub, sizeof(sub), "%s/models", scratch_dir);
        assert_int_equal(mkdir_p(sub, 0700), 0);
        write_model("models/linear.onnx", linear(BIAS[0]));
        c = load_ok("{\"input\": [4], \"onnx\": \"models/linear.onnx\", \"inputs\": {\"x\": \"image\"}}", NULL);
        assert_true(config_fingerprint(c) == fp);
        config_free(c);
        c = load_ok("{\"input\": [4], \"onnx\": \"models/linear.onnx\", \"init\": \"glorot_uniform\"}", NULL);
        assert_int_equal(c->model.init, GRAPH_INIT_GLOROT);
        assert_true(config_fingerprint(c) != fp);
        config_free(c);
        write_model("linear.onnx", linear(0.5f));
        c = load_ok("{\"input\": [4], \"onnx\": \"linear.onnx\"}", NULL);
        assert_true(config_fingerprint(c) != fp);
        config_free(c);
}

static void test_ctr_tables_cut(void **state)
{
        (void)state;
        write_model("ctr.onnx", ctr(false));
        struct job_config *c = load_ok("{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"ctr.onnx\", "
                                       "\"inputs\": {\"ids\": \"ids:emb\", \"dense\": \"dense\"}, "
                                       "\"embeddings\": [{\"name\": \"emb\", \"initializer\": \"emb.weight\"}]}",
                                       CRITEO);
        const struct model_spec *m = &c->model;
        assert_int_equal(m->emb[0].dim, 4);
        assert_int_equal(m->emb[0].n_fields, 26);
        assert_true(m->emb[0].init_stddev == 0.5);
        assert_int_equal(m->n_feeds, 2);
        assert_int_equal(m->feeds[0].kind, FEED_DATA);
        assert_int_equal(m->feeds[0].count, 13);
        assert_int_equal(m->feeds[1].kind, FEED_TABLE);
        assert_int_equal(m->feeds[1].count, 26 * 4);
        const struct graph_tensor *t = &m->graph->tensors[m->feeds[1].tensor];
        assert_string_equal(t->name, "e");
        assert_int_equal(t->kind, GT_INPUT);
        assert_true(t->want_grad);
        assert_true(graph_find(m->graph, "emb.weight") < 0); /* no dense variable */
        assert_true(graph_find(m->graph, "ids") < 0);
        struct model_spec_var vars[MODEL_MAX_VARS];
        assert_int_equal(model_spec_vars(m, vars, NULL), 1);
        assert_string_equal(vars[0].name, "top.weight");
        assert_int_equal(model_spec_dense_input(m), 13 + 104);
        /* the initializer's values kept for the table; without vocab its ids are no row numbers, so its
         * rows start psfleet's way */
        assert_int_equal(m->emb[0].n_init_rows, 100);
        assert_float_equal(m->emb[0].init_rows[5 * 4 + 2], 0.01f * 22, 0);
        struct sparse_table_opts o;
        sparse_table_opts_from_config(c, 0, &o);
        assert_null(o.init_rows);
        config_free(c);

        /* a hashed table (vocab): row id starts as the initializer's row id; past its rows, and with
         * model.init glorot_uniform, psfleet's way */
        static const char *const vocab_jobs[2] = {
                "{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"ctr.onnx\", "
                "\"inputs\": {\"ids\": \"ids:emb\", \"dense\": \"dense\"}, "
                "\"embeddings\": [{\"name\": \"emb\", \"initializer\": \"emb.weight\", \"vocab\": 120}]}",
                "{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"ctr.onnx\", \"init\": \"glorot_uniform\", "
                "\"inputs\": {\"ids\": \"ids:emb\", \"dense\": \"dense\"}, "
                "\"embeddings\": [{\"name\": \"emb\", \"initializer\": \"emb.weight\", \"vocab\": 120}]}",
        };
        for (int j = 0; j < 2; j++) {
                c = load_ok(vocab_jobs[j], CRITEO);
                sparse_table_opts_from_config(c, 0, &o);
                struct sparse_table *st = NULL;
                assert_int_equal(sparse_table_new(&o, &st), 0);
                float row[4];
                sparse_table_init_row(st, 5, row);
                assert_true((row[2] == 0.01f * 22) == (j == 0));
                sparse_table_init_row(st, 110, row);
                assert_true(row[0] != 0.01f * 440);
                sparse_table_free(st);
                config_free(c);
        }

        /* two tables looked up with the same ids */
        write_model("deepfm.onnx", ctr(true));
        c = load_ok("{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"deepfm.onnx\", "
                    "\"inputs\": {\"ids\": \"ids:emb,first\", \"dense\": \"dense\"}, "
                    "\"embeddings\": [{\"name\": \"emb\", \"initializer\": \"emb.weight\"}, "
                    "{\"name\": \"first\", \"initializer\": \"first.weight\", \"init_stddev\": 0}]}", CRITEO);
        assert_int_equal(c->model.n_feeds, 3);
        assert_int_equal(c->model.feeds[2].count, 26);
        assert_int_equal(model_spec_vars(&c->model, vars, NULL), 1);
        config_free(c);
}

static void test_refused(void **state)
{
        (void)state;
        write_model("linear.onnx", linear(BIAS[0]));
        write_model("ctr.onnx", ctr(false));
        write_model("deepfm.onnx", ctr(true));
        char junk[512];
        snprintf(junk, sizeof(junk), "%s/junk.onnx", scratch_dir);
        assert_int_equal(write_file_atomic(junk, "not a model", 11), 0);

        refuse("{\"input\": [4], \"onnx\": \"missing.onnx\"}", NULL, "model.onnx: \"");
        refuse("{\"input\": [4], \"onnx\": \"missing.onnx\"}", NULL, "missing.onnx\": No such file or directory");
        refuse("{\"input\": [4], \"onnx\": \"junk.onnx\"}", NULL, "junk.onnx: not an ONNX model");
        refuse("{\"input\": [4], \"onnx\": 3}", NULL, "model.onnx: expected a path to an ONNX file");
        refuse("{\"input\": [4], \"onnx\": \"linear.onnx\", \"layers\": [{\"type\": \"dense\", \"units\": 2}]}", NULL,
               "model.layers: not with model.onnx");
        refuse("{\"input\": [5], \"onnx\": \"linear.onnx\"}", NULL,
               "model.inputs.x: the graph's input \"x\" takes 4 values per example; model.input gives 5");
        refuse("{\"input\": [4], \"onnx\": \"linear.onnx\", \"inputs\": {\"z\": \"image\"}}", NULL,
               "model.inputs.z: the graph has no input \"z\" (its inputs: \"x\")");
        refuse("{\"input\": [4], \"onnx\": \"linear.onnx\", \"inputs\": {\"x\": \"pixels\"}}", NULL,
               "model.inputs.x: \"pixels\" is not \"image\"");
        refuse("{\"input\": [4], \"head\": \"logistic\", \"onnx\": \"linear.onnx\"}", CRITEO,
               "model.input");
        refuse("{\"input\": [4], \"inputs\": {\"x\": \"image\"}, \"layers\": [{\"type\": \"dense\", \"units\": 2}]}",
               NULL, "model.inputs: only with model.onnx");
        refuse("{\"input\": [4], \"init\": \"file\", \"layers\": [{\"type\": \"dense\", \"units\": 2}]}",
               NULL, "model.init: only with model.onnx");

        const char *emb = "\"embeddings\": [{\"name\": \"emb\", \"initializer\": \"emb.weight\"}]";
        char mj[1024];
        snprintf(mj, sizeof(mj), "{\"input\": [13], \"head\": \"softmax\", \"onnx\": \"ctr.onnx\", \"inputs\": "
                 "{\"ids\": \"ids:emb\", \"dense\": \"dense\"}, %s}", emb);
        refuse(mj, CRITEO, "model.head: softmax needs at least 2 outputs; the graph's output \"logit\" has 1");
        snprintf(mj, sizeof(mj), "{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"ctr.onnx\", \"inputs\": "
                 "{\"dense\": \"dense\"}, %s}", emb);
        refuse(mj, CRITEO, "model.inputs: the graph's input \"ids\" is not mapped");
        snprintf(mj, sizeof(mj), "{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"ctr.onnx\", \"inputs\": "
                 "{\"ids\": \"ids:wide\", \"dense\": \"dense\"}, %s}", emb);
        refuse(mj, CRITEO, "model.inputs.ids: no table of model.embeddings is called \"wide\"");
        refuse("{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"ctr.onnx\", \"inputs\": "
               "{\"ids\": \"ids:emb\", \"dense\": \"dense\"}, \"embeddings\": [{\"name\": \"emb\", \"dim\": 4}]}",
               CRITEO, "model.embeddings[0].initializer: missing");
        refuse("{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"ctr.onnx\", \"inputs\": "
               "{\"ids\": \"ids:emb\", \"dense\": \"dense\"}, \"embeddings\": [{\"name\": \"emb\", "
               "\"initializer\": \"top.weight\"}]}", CRITEO,
               "initializer \"top.weight\" is read by node \"top\" (MatMul)");
        refuse("{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"ctr.onnx\", \"inputs\": "
               "{\"ids\": \"ids:emb\", \"dense\": \"dense\"}, \"embeddings\": [{\"name\": \"emb\", "
               "\"initializer\": \"emb.weight\", \"dim\": 8}]}", CRITEO,
               "\"emb.weight\" has rows of 4 floats, model.embeddings[0].dim is 8");
        refuse("{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"ctr.onnx\", \"inputs\": "
               "{\"ids\": \"ids:emb\", \"dense\": \"dense\"}, \"embeddings\": [{\"name\": \"emb\", "
               "\"initializer\": \"emb.weight\", \"fields\": [0, 1]}]}", CRITEO,
               "the ids input \"ids\" must be int64 (batch, 2)");
        snprintf(mj, sizeof(mj), "{\"input\": [13], \"head\": \"logistic\", \"onnx\": \"deepfm.onnx\", \"inputs\": "
                 "{\"ids\": \"ids:emb\", \"dense\": \"dense\"}, %s}", emb);
        refuse(mj, CRITEO, "the graph's input \"ids\" is still read by node \"first\" (Gather) once the tables' "
                           "lookups are cut out: declare first.weight a table too");
}

UNIT_TEST_MAIN(setup, scratch_dir_remove, cmocka_unit_test(test_linear_idx), cmocka_unit_test(test_ctr_tables_cut),
               cmocka_unit_test(test_refused))
