/* onnx_save: every op's case (graph_cases.h) written as ONNX and read back by the loader computes what
 * the graph it came from computes in inference, bit for bit; the file has the head's output after the
 * logits, its batch dims symbolic, its parameters' values; a layer list's graph (graph_from_spec) goes through as well; the
 * embedding tables' lookups before it; and what the writer refuses. */
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

#include "graph_cases.h"
#include "graph_spec.h"
#include "onnx/onnx.pb-c.h"
#include "onnx_load.h"
#include "onnx_save.h"

/* The parameter block of g as built (each parameter's initial values at its offset). */
static float *params_of(const struct graph *g)
{
        float *p = calloc(g->n_params ? g->n_params : 1, sizeof(float));
        assert_non_null(p);
        for (uint32_t i = 0; i < g->n_tensors; i++)
                if (g->tensors[i].kind == GT_PARAM)
                        memcpy(p + g->tensors[i].param_offset, g->tensors[i].data,
                               sizeof(float) * graph_shape_count(&g->tensors[i].shape, 1));
        return p;
}

static struct graph *roundtrip(const struct graph *g, const float *params, enum model_head head, Onnx__ModelProto **mp)
{
        char err[512] = "";
        void *buf = NULL;
        size_t len = 0;
        int r = onnx_save_buf(g, params, head, "test", &buf, &len, err, sizeof(err));
        if (r != 0)
                print_error("onnx_save_buf: %s\n", err);
        assert_int_equal(r, 0);
        struct graph *g2 = NULL;
        r = onnx_load_buf(buf, len, "<saved>", &g2, err, sizeof(err));
        if (r != 0)
                print_error("onnx_load_buf: %s\n", err);
        assert_int_equal(r, 0);
        if (mp)
                assert_non_null(*mp = onnx__model_proto__unpack(NULL, len, buf));
        free(buf);
        return g2;
}

static void test_every_op(void **state)
{
        unsigned n_cases = 0;
        for (int op = 0; op < GOP__COUNT; op++)
                for (int v = 0; v < GCASE_VARIANTS; v++) {
                        char err[512] = "";
                        struct graph *g = NULL;
                        int r = gcase_build((enum graph_op)op, v, &g, err, sizeof(err));
                        if (r == -ENOENT && v > 0)
                                continue; /* the op has fewer variants */
                        if (r != 0)
                                print_error("%s variant %d: %s\n", graph_op_name((enum graph_op)op), v, err);
                        assert_int_equal(r, 0);
                        float *p = params_of(g);
                        struct graph *g2 = roundtrip(g, p, HEAD_MSE, NULL);
                        for (uint32_t t = 0; t < g->n_tensors; t++) /* (gcase_run differentiates) */
                                if (g->tensors[t].kind == GT_INPUT && graph_find(g2, g->tensors[t].name) >= 0)
                                        g2->tensors[graph_find(g2, g->tensors[t].name)].want_grad = g->tensors[t].want_grad;
                        struct gcase_out a, b;
                        assert_int_equal(gcase_run(g, NULL, 3, false, &a, err, sizeof(err)), 0);
                        r = gcase_run(g2, NULL, 3, false, &b, err, sizeof(err));
                        if (r != 0)
                                print_error("%s variant %d read back: %s\n", graph_op_name((enum graph_op)op), v, err);
                        assert_int_equal(r, 0);
                        assert_int_equal(a.ny, b.ny);
                        assert_memory_equal(a.y, b.y, sizeof(float) * a.ny);
                        assert_int_equal(g2->n_params, g->n_params);
                        gcase_out_free(&a);
                        gcase_out_free(&b);
                        graph_free(g2);
                        graph_free(g);
                        free(p);
                        n_cases++;
                }
        print_message("%u cases of %d ops read back the same\n", n_cases, GOP__COUNT);
        assert_true(n_cases >= GOP__COUNT);
}

static void test_heads_and_layers(void **state)
{
        struct model_spec s = { .input = { 1, 6, 6 }, .n_layers = 6,
                                .layers = { { .type = LAYER_CONV2D, .filters = 2, .kernel = 3 }, { .type = LAYER_RELU },
                                            { .type = LAYER_MAXPOOL2D, .pool = 2 }, { .type = LAYER_FLATTEN },
                                            { .type = LAYER_DENSE, .units = 4 }, { .type = LAYER_TANH } } };
        char err[256] = "";
        struct graph *g = NULL;
        assert_int_equal(graph_from_spec(&s, &g, err, sizeof(err)), 0);
        float *p = calloc(g->n_params, sizeof(float));
        for (size_t i = 0; i < g->n_params; i++)
                p[i] = (float)sin((double)i);
        static const char *const outs[] = { "probabilities", "probability", "prediction" };
        for (int h = 0; h < 3; h++) {
                Onnx__ModelProto *m = NULL;
                struct graph *g2 = roundtrip(g, p, (enum model_head)h, &m);
                assert_int_equal(m->n_opset_import, 1);
                assert_int_equal(m->opset_import[0]->version, 17);
                assert_int_equal(m->graph->n_output, 2);
                assert_string_equal(m->graph->output[0]->name, "logits");
                assert_string_equal(m->graph->output[1]->name, outs[h]);
                assert_int_equal(m->graph->n_input, 1);
                assert_string_equal(m->graph->input[0]->name, "input");
                assert_string_equal(m->graph->input[0]->type->tensor_type->shape->dim[0]->dim_param, "batch");
                /* the values under the variables' names */
                int t = graph_find(g2, "dense0/kernel");
                assert_true(t >= 0);
                assert_memory_equal(g2->tensors[t].data, p + g->tensors[graph_find(g, "dense0/kernel")].param_offset,
                                    sizeof(float) * 8 * 4);
                onnx__model_proto__free_unpacked(m, NULL);
                graph_free(g2);
        }
        /* a tensor already called what the head's output is called */
        struct graph *bad = graph_new();
        struct graph_shape sh = { .rank = 2, .dims = { GRAPH_BATCH, 3 } };
        int32_t in = graph_add_tensor(bad, "x", GT_INPUT, GDT_F32, &sh, NULL);
        const char *o[1] = { "probabilities" };
        struct graph_attrs a;
        graph_attrs_default(&a);
        assert_true(graph_add_node(bad, GOP_RELU, "r", &in, 1, o, 1, &a) >= 0);
        bad->loss = graph_find(bad, "probabilities");
        assert_int_equal(graph_finalize(bad, err, sizeof(err)), 0);
        void *buf = NULL;
        size_t len;
        assert_int_equal(onnx_save_buf(bad, NULL, HEAD_SOFTMAX, NULL, &buf, &len, err, sizeof(err)), -EINVAL);
        assert_null(buf);
        assert_non_null(strstr(err, "probabilities"));
        graph_free(bad);
        graph_free(g);
        free(p);
}

static const Onnx__NodeProto *find_node(const Onnx__ModelProto *m, const char *op)
{
        for (size_t i = 0; i < m->graph->n_node; i++)
                if (strcmp(m->graph->node[i]->op_type, op) == 0)
                        return m->graph->node[i];
        return NULL;
}

static const Onnx__TensorProto *find_init(const Onnx__ModelProto *m, const char *name)
{
        for (size_t i = 0; i < m->graph->n_initializer; i++)
                if (strcmp(m->graph->initializer[i]->name, name) == 0)
                        return m->graph->initializer[i];
        return NULL;
}

static Onnx__ModelProto *save_front(const struct graph *g, const float *p, const struct onnx_front *f, int want,
                                    const char *why)
{
        char err[256] = "";
        void *buf = NULL;
        size_t len = 0;
        int r = onnx_save_front_buf(g, p, HEAD_LOGISTIC, f, NULL, NULL, &buf, &len, err, sizeof(err));
        if (r != want)
                print_error("onnx_save_front_buf: %d, %s\n", r, err);
        assert_int_equal(r, want);
        if (want) {
                assert_null(buf);
                assert_non_null(strstr(err, why));
                return NULL;
        }
        Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
        free(buf);
        assert_non_null(m);
        return m;
}

/* The tables' lookups before a layer list: the file's inputs are the dense features, the ids and their
 * weights (the graph's own input made by a Concat), a raw-id table through a LabelEncoder of domain
 * ai.onnx.ml, a hashed one through Mod with the wrap-around of unsigned ids, and a table served from
 * outside as its pooled input; what the front refuses. */
static void test_tables_front(void **state)
{
        (void)state;
        /* 1 dense feature, then table a (2 fields of dim 1), then table b (1 field of dim 2) */
        struct model_spec s = { .input = { 1, 1, 5 }, .head = HEAD_LOGISTIC, .n_layers = 1,
                                .layers = { { .type = LAYER_DENSE, .units = 1 } } };
        char err[256] = "";
        struct graph *g = NULL;
        assert_int_equal(graph_from_spec(&s, &g, err, sizeof(err)), 0);
        float *p = calloc(g->n_params, sizeof(float));
        static const uint64_t keys[] = { 5, UINT64_C(0xfffffffffffffff0) };
        static const float rows_a[] = { 1, 2, 0 }, rows_b[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14 };
        static const uint32_t fa[] = { 0, 1 }, fb[] = { 2 };
        struct onnx_table t[2] = {
                { .name = "a", .ids = "ids", .weights = "weights", .ids_width = 3, .n_fields = 2, .fields = fa,
                  .dim = 1, .rows = rows_a, .n_rows = 3, .keys = keys },
                { .name = "b", .ids = "ids", .weights = "weights", .ids_width = 3, .n_fields = 1, .fields = fb,
                  .dim = 2, .vocab = 7, .mean = true, .rows = rows_b, .n_rows = 7 },
        };
        struct onnx_front f = { .n_tables = 2, .tables = t, .concat = "input", .dense = "dense", .n_dense = 1 };
        Onnx__ModelProto *m = save_front(g, p, &f, 0, NULL);
        assert_int_equal(m->n_opset_import, 2);
        assert_string_equal(m->opset_import[1]->domain, "ai.onnx.ml");
        assert_int_equal(m->graph->n_input, 3);
        assert_string_equal(m->graph->input[0]->name, "dense");
        assert_string_equal(m->graph->input[1]->name, "ids");
        assert_string_equal(m->graph->input[2]->name, "weights");
        assert_int_equal(m->graph->input[1]->type->tensor_type->elem_type, ONNX__TENSOR_PROTO__DATA_TYPE__INT64);
        const Onnx__NodeProto *le = find_node(m, "LabelEncoder"), *mod = find_node(m, "Mod");
        assert_non_null(le);
        assert_string_equal(le->domain, "ai.onnx.ml");
        assert_int_equal(le->attribute[0]->n_ints, 2);
        assert_int_equal((uint64_t)le->attribute[0]->ints[1], keys[1]);
        assert_int_equal(le->attribute[2]->i, 2); /* default_int64: the last row, for ids never trained */
        assert_non_null(mod);
        const Onnx__TensorProto *wrap = find_init(m, "emb/b/wrap");
        assert_non_null(wrap);
        int64_t w;
        memcpy(&w, wrap->raw_data.data, sizeof(w));
        assert_int_equal(w, (UINT64_MAX % 7 + 1) % 7); /* 2^64 mod 7 */
        assert_non_null(find_node(m, "Concat"));
        assert_non_null(find_init(m, "emb/b/table"));
        onnx__model_proto__free_unpacked(m, NULL);

        /* the initializers of at least 40 bytes as external data: table b's rows and nothing smaller */
        struct onnx_external x = { .location = "m.data", .min_bytes = 40 };
        void *buf = NULL;
        size_t len = 0;
        assert_int_equal(onnx_save_front_buf(g, p, HEAD_LOGISTIC, &f, &x, NULL, &buf, &len, err, sizeof(err)), 0);
        m = onnx__model_proto__unpack(NULL, len, buf);
        free(buf);
        assert_non_null(m);
        assert_int_equal(x.n, 1);
        assert_ptr_equal(x.pieces[0].data, rows_b);
        assert_int_equal(x.pieces[0].offset, 0);
        assert_int_equal(x.pieces[0].len, sizeof(rows_b));
        assert_int_equal(x.size, sizeof(rows_b));
        const Onnx__TensorProto *tb = find_init(m, "emb/b/table"), *ta = find_init(m, "emb/a/table");
        assert_int_equal(tb->data_location, ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL);
        assert_false(tb->has_raw_data);
        assert_int_equal(tb->n_dims, 2);
        assert_int_equal(tb->n_external_data, 3);
        assert_string_equal(tb->external_data[0]->value, "m.data");
        assert_string_equal(tb->external_data[2]->value, "56");
        assert_true(ta->has_raw_data && !ta->has_data_location);
        free(x.pieces);
        onnx__model_proto__free_unpacked(m, NULL);
        /* several pieces: each at a multiple of 4096 (the kernel, then tables a and b; the bias is 4 bytes) */
        x.min_bytes = 12;
        assert_int_equal(onnx_save_front_buf(g, p, HEAD_LOGISTIC, &f, &x, NULL, &buf, &len, err, sizeof(err)), 0);
        free(buf);
        assert_int_equal(x.n, 3);
        assert_int_equal(x.pieces[1].offset, 4096);
        assert_int_equal(x.pieces[2].offset, 8192);
        assert_int_equal(x.size, 8192 + sizeof(rows_b));
        free(x.pieces);

        /* several ids per field: ids and weights (batch, 3, ids_per_field) */
        t[0].multi = t[1].multi = true;
        m = save_front(g, p, &f, 0, NULL);
        const Onnx__TensorShapeProto *ids_shape = m->graph->input[1]->type->tensor_type->shape;
        assert_int_equal(ids_shape->n_dim, 3);
        assert_int_equal(ids_shape->dim[1]->dim_value, 3);
        assert_string_equal(ids_shape->dim[2]->dim_param, "ids_per_field");
        onnx__model_proto__free_unpacked(m, NULL);
        t[0].multi = t[1].multi = false;

        /* table b served from outside: its pooled rows an input, no lookup of it in the file */
        t[1].rows = NULL;
        m = save_front(g, p, &f, 0, NULL);
        assert_int_equal(m->graph->n_input, 4);
        assert_string_equal(m->graph->input[3]->name, "b/pooled");
        assert_null(find_node(m, "Mod"));
        assert_null(find_init(m, "emb/b/table"));
        onnx__model_proto__free_unpacked(m, NULL);

        /* refused: a concat or an `into` that is no input of the graph */
        f.concat = "nothing";
        save_front(g, p, &f, -EINVAL, "nothing");
        f.concat = "input";
        t[0].into = "logits";
        save_front(g, p, &f, -EINVAL, "logits");
        graph_free(g);
        free(p);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_every_op),
                cmocka_unit_test(test_heads_and_layers),
                cmocka_unit_test(test_tables_front),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
