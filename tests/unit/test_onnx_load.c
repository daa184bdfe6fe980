/* onnx_load: small ModelProtos built here through the generated protobuf-c API, packed and loaded: an
 * MLP (tensor kinds, the parameter block, shapes, a forward run against values computed here), the
 * shape arithmetic torch writes around view/reshape folded away, Constant nodes and the constant inputs
 * that become attributes; then every refusal, its message asserted. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"
#include "scratch_dir.h"

#include "graph.h"
#include "onnx/onnx.pb-c.h"
#include "onnx_load.h"

#include "onnx_build.h"

/* Packs and loads m, then frees it. */
static int load(Onnx__ModelProto *m, struct graph **g, char *err, size_t errlen)
{
        size_t len;
        uint8_t *buf = pack(m, &len);
        onnx__model_proto__free_unpacked(m, NULL);
        *g = NULL;
        err[0] = 0;
        int r = onnx_load_buf(buf, len, "t.onnx", g, err, errlen);
        free(buf);
        if (r == 0)
                assert_non_null(*g);
        else
                assert_null(*g);
        return r;
}

/* Loading m must fail with r and an error that holds want (one line, naming the file). */
static void refuse(Onnx__ModelProto *m, int r, const char *want)
{
        struct graph *g;
        char err[512];
        int got = load(m, &g, err, sizeof(err));
        if (got != r || !strstr(err, want) || strncmp(err, "t.onnx: ", 8) != 0 || strchr(err, '\n'))
                fail_msg("got %d \"%s\", wanted %d with \"%s\"", got, err, r, want);
}

static const struct graph_tensor *tensor_of(const struct graph *g, const char *name)
{
        int t = graph_find(g, name);
        if (t < 0)
                fail_msg("no tensor \"%s\"", name);
        return &g->tensors[t];
}

static void assert_shape(const struct graph_shape *s, uint32_t rank, ...)
{
        va_list ap;
        va_start(ap, rank);
        assert_int_equal(s->rank, rank);
        for (uint32_t i = 0; i < rank; i++)
                assert_int_equal(s->dims[i], va_arg(ap, int));
        va_end(ap);
}

/* ---- the MLP ---- */

static const float W1[4 * 3] = { 0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f, -0.7f, 0.8f, 0.9f, 1.0f, -1.1f, 0.2f };
static const float B1[3] = { 0.05f, -0.1f, 0.2f };
static const float W2[2 * 3] = { 0.3f, -0.5f, 0.7f, 0.2f, 0.4f, -0.6f }; /* (2, 3): transB */
static const float B2[2] = { -0.3f, 0.1f };

/* x (batch, 4) -> Gemm(W1 (4, 3), B1) -> Relu -> Gemm(W2 (2, 3) transposed, B2) -> y (batch, 2) */
static Onnx__ModelProto *mlp(void)
{
        Onnx__ModelProto *m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,4");
        add_init(m, "fc1.weight", T_FLOAT, 2, (int64_t[]){ 4, 3 }, W1, false);
        add_init(m, "fc1.bias", T_FLOAT, 1, (int64_t[]){ 3 }, B1, true);
        add_init(m, "fc2.weight", T_FLOAT, 2, (int64_t[]){ 2, 3 }, W2, true);
        add_init(m, "fc2.bias", T_FLOAT, 1, (int64_t[]){ 2 }, B2, false);
        add_node(m, "Gemm", "fc1", "x,fc1.weight,fc1.bias", "h");
        add_node(m, "Relu", "relu", "h", "hr");
        Onnx__NodeProto *n = add_node(m, "Gemm", "fc2", "hr,fc2.weight,fc2.bias", "y");
        attr_i(n, "transB", 1);
        attr_f(n, "alpha", 1.0f);
        add_output(m, "y");
        return m;
}

static void mlp_ref(const float *x, uint32_t B, float *y)
{
        for (uint32_t b = 0; b < B; b++) {
                float h[3];
                for (int j = 0; j < 3; j++) {
                        h[j] = B1[j];
                        for (int k = 0; k < 4; k++)
                                h[j] += x[b * 4 + k] * W1[k * 3 + j];
                        h[j] = h[j] > 0 ? h[j] : 0;
                }
                for (int j = 0; j < 2; j++) {
                        y[b * 2 + j] = B2[j];
                        for (int k = 0; k < 3; k++)
                                y[b * 2 + j] += h[k] * W2[j * 3 + k];
                }
        }
}

/* Runs g forward on x (B rows of its input "x") and compares output "y" with want. */
static void run_and_compare(const struct graph *g, const float *x, uint32_t B, const float *want, size_t n)
{
        struct graph_exec *ex = NULL;
        char err[256];
        int r = graph_exec_new(g, 4, &ex, err, sizeof(err));
        if (r < 0)
                fail_msg("graph_exec_new: %s", err);
        assert_int_equal(graph_set_input(ex, graph_find(g, "x"), x, B), 0);
        assert_int_equal(graph_forward(ex, false, 1), 0);
        size_t count = 0;
        const float *y = graph_value(ex, graph_find(g, "y"), &count);
        assert_int_equal(count, n);
        for (size_t i = 0; i < n; i++)
                assert_float_equal(y[i], want[i], 1e-5);
        graph_exec_free(ex);
}

static void test_mlp(void **state)
{
        struct graph *g;
        char err[512];
        if (load(mlp(), &g, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        assert_true(g->final);
        assert_int_equal(g->loss, graph_find(g, "y")); /* the first output is what a head reads */
        assert_int_equal(g->n_nodes, 3);
        const struct graph_tensor *x = tensor_of(g, "x");
        assert_int_equal(x->kind, GT_INPUT);
        assert_int_equal(x->dtype, GDT_F32);
        assert_shape(&x->shape, 2, GRAPH_BATCH, 4);
        /* the parameters, in the initializers' order; raw_data and float_data read alike */
        const char *names[] = { "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias" };
        const float *vals[] = { W1, B1, W2, B2 };
        size_t sizes[] = { 12, 3, 6, 2 }, off = 0;
        for (int i = 0; i < 4; i++) {
                const struct graph_tensor *t = tensor_of(g, names[i]);
                assert_int_equal(t->kind, GT_PARAM);
                assert_int_equal(t->dtype, GDT_F32);
                assert_int_equal(t->param_offset, off);
                assert_memory_equal(t->data, vals[i], sizes[i] * sizeof(float));
                off += sizes[i];
        }
        assert_int_equal(g->n_params, 23);
        assert_shape(&tensor_of(g, "fc1.weight")->shape, 2, 4, 3);
        assert_shape(&tensor_of(g, "h")->shape, 2, GRAPH_BATCH, 3);
        const struct graph_tensor *y = tensor_of(g, "y");
        assert_int_equal(y->kind, GT_VALUE);
        assert_shape(&y->shape, 2, GRAPH_BATCH, 2);
        assert_int_equal(g->nodes[2].op, GOP_GEMM);
        assert_string_equal(g->nodes[2].name, "fc2");
        assert_int_equal(g->nodes[2].a.trans_b, 1);
        assert_int_equal(g->nodes[2].a.trans_a, 0);

        const float in[3 * 4] = { 1, 2, 3, 4, -1, 0.5f, 2, -3, 0.25f, -0.5f, 1.5f, 0 };
        float want[3 * 2];
        mlp_ref(in, 3, want);
        run_and_compare(g, in, 3, want, 6);
        graph_free(g);
}

/* The same MLP from a file; a path that does not exist. */
static void test_file(void **state)
{
        char path[300], err[512];
        snprintf(path, sizeof(path), "%s/mlp.onnx", scratch_dir);
        Onnx__ModelProto *m = mlp();
        size_t len;
        uint8_t *buf = pack(m, &len);
        onnx__model_proto__free_unpacked(m, NULL);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        assert_int_equal(fwrite(buf, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
        free(buf);
        struct graph *g = NULL;
        if (onnx_load_file(path, &g, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        assert_int_equal(g->n_params, 23);
        graph_free(g);

        snprintf(path, sizeof(path), "%s/none.onnx", scratch_dir);
        g = NULL;
        assert_int_equal(onnx_load_file(path, &g, err, sizeof(err)), -ENOENT);
        assert_null(g);
        assert_non_null(strstr(err, path));
}

/* ---- the shape arithmetic ---- */

/* torch's x.view(x.size(0), -1) on x (batch, 3, 2), then a Gemm: Shape, Gather, Unsqueeze, Concat and
 * the Constants fold into Reshape's target (0, -1). */
static void test_view_folds(void **state)
{
        Onnx__ModelProto *m = model_new(13);
        add_input(m, "x", T_FLOAT, "N,3,2");
        const float w[6 * 2] = { 1, 0, 0, 1, 1, 1, -1, 0, 0, -1, 0.5f, 0.5f };
        add_init(m, "w", T_FLOAT, 2, (int64_t[]){ 6, 2 }, w, false);
        add_node(m, "Shape", "shape", "x", "s");
        attr_t(add_node(m, "Constant", "c0", "", "zero"), "value",
               tensor(NULL, T_INT64, 0, NULL, (int64_t[]){ 0 }, false));
        attr_i(add_node(m, "Gather", "g", "s,zero", "n"), "axis", 0);
        const_ints(m, "ax0", 1, (int64_t[]){ 0 });
        add_node(m, "Unsqueeze", "u", "n,ax0", "n1");
        const_ints(m, "minus1", 1, (int64_t[]){ -1 });
        attr_i(add_node(m, "Concat", "cat", "n1,minus1", "target"), "axis", 0);
        add_node(m, "Reshape", "view", "x,target", "flat");
        add_node(m, "Gemm", "fc", "flat,w", "y");
        add_output(m, "y");
        struct graph *g;
        char err[512];
        if (load(m, &g, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        assert_int_equal(g->n_nodes, 2);
        const struct graph_node *r = &g->nodes[0];
        assert_int_equal(r->op, GOP_RESHAPE);
        assert_int_equal(r->n_in, 1);
        assert_int_equal(r->a.n_shape, 2);
        assert_int_equal(r->a.shape[0], 0);
        assert_int_equal(r->a.shape[1], -1);
        assert_shape(&tensor_of(g, "flat")->shape, 2, GRAPH_BATCH, 6);
        assert_shape(&tensor_of(g, "y")->shape, 2, GRAPH_BATCH, 2);
        /* nothing of the arithmetic is left in the graph */
        assert_int_equal(graph_find(g, "s"), -ENOENT);
        assert_int_equal(graph_find(g, "target"), -ENOENT);
        for (uint32_t i = 0; i < g->n_tensors; i++)
                assert_int_equal(g->tensors[i].dtype, GDT_F32);

        const float x[2 * 6] = { 1, 2, 3, 4, 5, 6, -1, 0, 2, 0.5f, 1, -2 };
        float want[2 * 2];
        for (int b = 0; b < 2; b++)
                for (int j = 0; j < 2; j++) {
                        want[b * 2 + j] = 0;
                        for (int k = 0; k < 6; k++)
                                want[b * 2 + j] += x[b * 6 + k] * w[k * 2 + j];
                }
        run_and_compare(g, x, 2, want, 4);
        graph_free(g);
}

/* x.view(x.size(0), x.size(1) * x.size(2)) and a Slice of the shape through Cast: Mul of two folded
 * dims, Slice(Shape(x), [1], [INT64_MAX]); the batch as a target's first entry where the reshaped
 * tensor's dim 0 is not the batch becomes -1. */
static void test_shape_arith(void **state)
{
        Onnx__ModelProto *m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,3,2");
        add_init(m, "p", T_FLOAT, 2, (int64_t[]){ 2, 2 }, (float[]){ 1, 2, 3, 4 }, false);
        add_node(m, "Shape", NULL, "x", "s");
        add_init(m, "i0", T_INT64, 0, NULL, (int64_t[]){ 0 }, false);
        add_init(m, "i1", T_INT32, 0, NULL, (int64_t[]){ 1 }, true); /* int32: converted */
        add_init(m, "i2", T_INT64, 0, NULL, (int64_t[]){ 2 }, true);
        add_node(m, "Gather", NULL, "s,i0", "d0");
        add_node(m, "Gather", NULL, "s,i1", "d1");
        add_node(m, "Gather", NULL, "s,i2", "d2");
        add_node(m, "Mul", NULL, "d1,d2", "d12");
        const_ints(m, "axes", 1, (int64_t[]){ 0 });
        add_node(m, "Unsqueeze", NULL, "d0,axes", "u0");
        add_node(m, "Unsqueeze", NULL, "d12,axes", "u12");
        attr_i(add_node(m, "Concat", NULL, "u0,u12", "t1"), "axis", 0);
        attr_i(add_node(m, "Cast", NULL, "t1", "t1c"), "to", T_INT64);
        add_node(m, "Reshape", "r1", "x,t1c", "y1");
        /* (batch, 3, 2) again, through Slice of the shape */
        const_ints(m, "st", 1, (int64_t[]){ 1 });
        const_ints(m, "en", 1, (int64_t[]){ INT64_MAX });
        add_node(m, "Slice", NULL, "s,st,en", "tail");
        attr_i(add_node(m, "Concat", NULL, "u0,tail", "t2"), "axis", 0);
        add_node(m, "Reshape", "r2", "y1,t2", "y2");
        /* the batch's size as the target of a tensor whose dim 0 is not the batch: -1 */
        add_node(m, "Reshape", "r3", "p,u0", "pflat");
        add_output(m, "y2");
        add_output(m, "pflat");
        struct graph *g;
        char err[512];
        if (load(m, &g, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        assert_int_equal(g->n_nodes, 3);
        assert_int_equal(g->nodes[0].a.n_shape, 2);
        assert_int_equal(g->nodes[0].a.shape[0], 0);
        assert_int_equal(g->nodes[0].a.shape[1], 6);
        assert_shape(&tensor_of(g, "y1")->shape, 2, GRAPH_BATCH, 6);
        assert_int_equal(g->nodes[1].a.n_shape, 3);
        assert_int_equal(g->nodes[1].a.shape[0], 0);
        assert_int_equal(g->nodes[1].a.shape[1], 3);
        assert_int_equal(g->nodes[1].a.shape[2], 2);
        assert_shape(&tensor_of(g, "y2")->shape, 3, GRAPH_BATCH, 3, 2);
        assert_int_equal(g->nodes[2].a.n_shape, 1);
        assert_int_equal(g->nodes[2].a.shape[0], -1);
        assert_shape(&tensor_of(g, "pflat")->shape, 1, 4);
        assert_int_equal(tensor_of(g, "p")->kind, GT_PARAM);
        graph_free(g);
}

/* Constant nodes (value, value_float, value_ints), an int32 initializer as Gather's indices, Dropout's
 * ratio and training_mode as Constants (its mask output dropped), Pad's pads and value, Squeeze's and
 * ReduceSum's axes, LeakyRelu's and Softmax's ONNX defaults. */
static void test_constants(void **state)
{
        Onnx__ModelProto *m = model_new(15);
        import_domain(m, "ai.onnx.ml", 3); /* imported, unused: fine */
        add_input(m, "ids", T_INT64, "batch,2");
        const float emb[5 * 3] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14 };
        add_init(m, "emb", T_FLOAT, 2, (int64_t[]){ 5, 3 }, emb, true);
        add_node(m, "Gather", "lookup", "emb,ids", "e");                     /* (batch, 2, 3) */
        const_ints(m, "rs_axes", 1, (int64_t[]){ 1 });
        attr_i(add_node(m, "ReduceSum", "pool", "e,rs_axes", "p"), "keepdims", 0); /* (batch, 3) */
        attr_f(add_node(m, "Constant", "two", "", "c2"), "value_float", 2.0f);
        add_node(m, "Mul", "scale", "p,c2", "ps");
        Onnx__NodeProto *c = add_node(m, "Constant", "ratio", "", "r");
        attr_t(c, "value", tensor(NULL, T_FLOAT, 0, NULL, (float[]){ 0.25f }, false));
        c = add_node(m, "Constant", "train", "", "tm");
        attr_t(c, "value", tensor(NULL, T_BOOL, 0, NULL, (int64_t[]){ 1 }, true));
        add_node(m, "Dropout", "drop", "ps,r,tm", "pd,mask");
        const_ints(m, "pads", 4, (int64_t[]){ 0, 1, 0, 2 });
        attr_f(add_node(m, "Constant", NULL, "", "pv"), "value_float", 0.5f);
        attr_s(add_node(m, "Pad", "pad", "pd,pads,pv", "padded"), "mode", "constant"); /* (batch, 6) */
        add_node(m, "LeakyRelu", "lrelu", "padded", "l");
        const_ints(m, "u_axes", 1, (int64_t[]){ 2 });
        add_node(m, "Unsqueeze", "unsq", "l,u_axes", "lu");                  /* (batch, 6, 1) */
        add_node(m, "Squeeze", "sq", "lu,u_axes", "ls");
        add_node(m, "Softmax", "sm", "ls", "y");
        add_init(m, "idx32", T_INT32, 1, (int64_t[]){ 2 }, (int64_t[]){ 4, 1 }, false);
        add_node(m, "Gather", "rows", "emb,idx32", "rows");
        add_output(m, "y");
        add_output(m, "rows");
        struct graph *g;
        char err[512];
        if (load(m, &g, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        const struct graph_tensor *t = tensor_of(g, "ids");
        assert_int_equal(t->kind, GT_INPUT);
        assert_int_equal(t->dtype, GDT_I64);
        t = tensor_of(g, "c2");
        assert_int_equal(t->kind, GT_CONST);
        assert_int_equal(t->dtype, GDT_F32);
        assert_int_equal(t->shape.rank, 0);
        assert_float_equal(((float *)t->data)[0], 2.0, 0);
        t = tensor_of(g, "idx32");
        assert_int_equal(t->kind, GT_CONST);
        assert_int_equal(t->dtype, GDT_I64);
        assert_int_equal(((int64_t *)t->data)[0], 4);
        assert_int_equal(((int64_t *)t->data)[1], 1);
        assert_int_equal(tensor_of(g, "emb")->kind, GT_PARAM);
        assert_int_equal(g->n_params, 15);
        /* the constants that became attributes are not tensors */
        assert_int_equal(graph_find(g, "r"), -ENOENT);
        assert_int_equal(graph_find(g, "tm"), -ENOENT);
        assert_int_equal(graph_find(g, "pads"), -ENOENT);
        assert_int_equal(graph_find(g, "mask"), -ENOENT);
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                const struct graph_node *n = &g->nodes[i];
                switch (n->op) {
                case GOP_DROPOUT:
                        assert_int_equal(n->n_in, 1);
                        assert_int_equal(n->n_out, 1);
                        assert_float_equal(n->a.ratio, 0.25, 0);
                        break;
                case GOP_PAD:
                        assert_int_equal(n->n_in, 1);
                        assert_int_equal(n->a.n_pads, 4);
                        assert_int_equal(n->a.pads[1], 1);
                        assert_int_equal(n->a.pads[3], 2);
                        assert_float_equal(n->a.pad_value, 0.5, 0);
                        break;
                case GOP_REDUCE_SUM:
                        assert_int_equal(n->n_in, 1);
                        assert_int_equal(n->a.n_axes, 1);
                        assert_int_equal(n->a.axes[0], 1);
                        assert_int_equal(n->a.keepdims, 0);
                        break;
                case GOP_SQUEEZE:
                case GOP_UNSQUEEZE:
                        assert_int_equal(n->n_in, 1);
                        assert_int_equal(n->a.n_axes, 1);
                        assert_int_equal(n->a.axes[0], 2);
                        break;
                case GOP_LEAKY_RELU:
                        assert_float_equal(n->a.alpha, 0.01, 1e-9);
                        break;
                case GOP_SOFTMAX:
                        assert_int_equal(n->a.axis, -1);
                        break;
                case GOP_GATHER:
                        assert_int_equal(n->a.axis, 0);
                        break;
                default:
                        break;
                }
        }
        assert_shape(&tensor_of(g, "e")->shape, 3, GRAPH_BATCH, 2, 3);
        assert_shape(&tensor_of(g, "padded")->shape, 2, GRAPH_BATCH, 6);
        assert_shape(&tensor_of(g, "y")->shape, 2, GRAPH_BATCH, 6);
        assert_shape(&tensor_of(g, "rows")->shape, 2, 2, 3);
        graph_free(g);
}

/* Nodes out of order in the file (ONNX says sorted; not every writer does): the loader sorts them. */
static void test_unsorted(void **state)
{
        Onnx__ModelProto *m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,4");
        add_node(m, "Sigmoid", "c", "b", "y");
        add_node(m, "Tanh", "b", "a", "b");
        add_node(m, "Relu", "a", "x", "a");
        add_output(m, "y");
        struct graph *g;
        char err[512];
        if (load(m, &g, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        assert_int_equal(g->n_nodes, 3);
        assert_string_equal(g->nodes[0].name, "a");
        assert_string_equal(g->nodes[1].name, "b");
        assert_string_equal(g->nodes[2].name, "c");
        assert_shape(&tensor_of(g, "y")->shape, 2, GRAPH_BATCH, 4);
        graph_free(g);
}

/* The fuzz harness's seeds, written by python3-onnx's helper and passed by its checker (full shape
 * inference): what the reference library writes loads. */
static void test_seed_files(void **state)
{
        const char *src = getenv("PSFLEET_SOURCE_DIR");
        if (!src)
                skip();
        const char *names[] = { "mlp", "view", "cnn", "embed" };
        for (int i = 0; i < 4; i++) {
                char path[512], err[512];
                snprintf(path, sizeof(path), "%s/tests/fuzz/corpus/onnx/%s", src, names[i]);
                struct graph *g = NULL;
                if (onnx_load_file(path, &g, err, sizeof(err)) < 0)
                        fail_msg("%s", err);
                if (strcmp(names[i], "cnn") == 0) {
                        /* Pad's pads and Dropout's Constants moved, its mask dropped; BatchNormalization's
                         * running statistics kept as outputs */
                        assert_shape(&tensor_of(g, "p")->shape, 2, GRAPH_BATCH, 3);
                        assert_shape(&tensor_of(g, "pd")->shape, 4, GRAPH_BATCH, 4, 5, 5);
                        assert_int_equal(graph_find(g, "mask"), -ENOENT);
                        assert_int_equal(tensor_of(g, "rv_out")->kind, GT_VALUE);
                        assert_int_equal(g->n_params, 4 * 9 + 4 * 5 + 3 * 4 + 3);
                        for (uint32_t j = 0; j < g->n_nodes; j++)
                                if (g->nodes[j].op == GOP_DROPOUT)
                                        assert_float_equal(g->nodes[j].a.ratio, 0.1, 1e-7);
                } else if (strcmp(names[i], "view") == 0) {
                        assert_shape(&tensor_of(g, "p")->shape, 2, GRAPH_BATCH, 2);
                } else if (strcmp(names[i], "embed") == 0) {
                        assert_shape(&tensor_of(g, "y")->shape, 2, GRAPH_BATCH, 4);
                        assert_int_equal(graph_find(g, "sq"), -ENOENT); /* Squeeze's axes: an attribute */
                        assert_int_equal(tensor_of(g, "ids")->dtype, GDT_I64);
                }
                graph_free(g);
        }
}

/* ---- refusals ---- */

static void test_op_not_supported(void **state)
{
        Onnx__ModelProto *m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,4,8");
        add_node(m, "Relu", "n0", "x", "h");
        add_node(m, "LSTM", "n3", "h", "y");
        add_output(m, "y");
        refuse(m, -ENOTSUP, "t.onnx: node \"n3\" (LSTM): op not in the supported set");
        /* unnamed: its index in the file */
        m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,4");
        add_node(m, "Relu", NULL, "x", "h");
        add_node(m, "Erf", NULL, "h", "y");
        add_output(m, "y");
        refuse(m, -ENOTSUP, "t.onnx: node 1 (Erf): op not in the supported set");
        /* Shape arithmetic over a computed value does not fold */
        m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,4");
        const_ints(m, "st", 1, (int64_t[]){ 0 });
        const_ints(m, "en", 1, (int64_t[]){ 2 });
        const_ints(m, "ax", 1, (int64_t[]){ 1 });
        add_node(m, "Slice", "sl", "x,st,en,ax", "y");
        add_output(m, "y");
        refuse(m, -ENOTSUP, "node \"sl\" (Slice): op not in the supported set");
        /* a node of another domain */
        m = model_new(17);
        import_domain(m, "ai.onnx.ml", 3);
        add_input(m, "x", T_FLOAT, "batch,4");
        add_node(m, "Normalizer", "norm", "x", "y")->domain = xstrdup("ai.onnx.ml");
        add_output(m, "y");
        refuse(m, -ENOTSUP, "node \"norm\" (Normalizer): domain \"ai.onnx.ml\" is not supported");
}

/* Attribute values the op does not support: graph_ops' shape functions name them. */
static void test_bad_attribute_value(void **state)
{
        Onnx__ModelProto *m = mlp();
        attr_i(m->graph->node[0], "transA", 2);
        refuse(m, -EINVAL, "t.onnx: node \"fc1\" (Gemm): transA=2 is not 0 or 1");

        m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,2,5,5");
        float w[4 * 1 * 3 * 3] = { 0 };
        add_init(m, "w", T_FLOAT, 4, (int64_t[]){ 4, 1, 3, 3 }, w, false);
        Onnx__NodeProto *n = add_node(m, "Conv", "conv1", "x,w", "y");
        attr_i(n, "group", 2);
        attr_ints(n, "kernel_shape", 2, (int64_t[]){ 3, 3 });
        add_output(m, "y");
        refuse(m, -EINVAL, "t.onnx: node \"conv1\" (Conv): group=2 is not supported");

        /* an attribute the op does not have */
        m = mlp();
        attr_i(m->graph->node[1], "foo", 1);
        refuse(m, -ENOTSUP, "t.onnx: node \"relu\" (Relu): attribute \"foo\" is not supported");
        /* of the wrong type */
        m = mlp();
        attr_f(m->graph->node[0], "transB", 1.0f);
        refuse(m, -EINVAL, "node \"fc1\" (Gemm): attribute \"transB\" is not an int");
        /* Pad in a mode other than constant */
        m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,4");
        const_ints(m, "pads", 4, (int64_t[]){ 0, 1, 0, 1 });
        attr_s(add_node(m, "Pad", "p", "x,pads", "y"), "mode", "reflect");
        add_output(m, "y");
        refuse(m, -ENOTSUP, "node \"p\" (Pad): mode \"reflect\" is not supported (only \"constant\")");
}

static void test_symbolic_dim(void **state)
{
        Onnx__ModelProto *m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,4,seq");
        add_node(m, "Relu", "r", "x", "y");
        add_output(m, "y");
        refuse(m, -ENOTSUP, "t.onnx: input \"x\" dim 2 is symbolic (\"seq\"): only the batch may be");
        m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,?");
        add_node(m, "Relu", "r", "x", "y");
        add_output(m, "y");
        refuse(m, -ENOTSUP, "t.onnx: input \"x\" dim 1 has no size: only the batch may be symbolic");
        /* dim 0 as 0 or absent is the batch too */
        for (int k = 0; k < 2; k++) {
                m = model_new(17);
                add_input(m, "x", T_FLOAT, k ? "0,4" : "?,4");
                add_node(m, "Relu", "r", "x", "y");
                add_output(m, "y");
                struct graph *g;
                char err[512];
                if (load(m, &g, err, sizeof(err)) < 0)
                        fail_msg("%s", err);
                assert_shape(&tensor_of(g, "x")->shape, 2, GRAPH_BATCH, 4);
                graph_free(g);
        }
}

/* The batch's size anywhere but the first entry of a Reshape's target; a target that is not constant. */
static void test_not_static(void **state)
{
        Onnx__ModelProto *m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,3,2");
        add_node(m, "Shape", NULL, "x", "s");
        const_ints(m, "i", 1, (int64_t[]){ 0 });
        add_node(m, "Gather", NULL, "s,i", "b");
        const_ints(m, "m1", 1, (int64_t[]){ -1 });
        attr_i(add_node(m, "Concat", NULL, "m1,b", "t"), "axis", 0);
        add_node(m, "Reshape", "r", "x,t", "y");
        add_output(m, "y");
        refuse(m, -ENOTSUP, "t.onnx: node \"r\" (Reshape): a shape that does not fold to static");

        m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,3,2");
        add_node(m, "Shape", NULL, "x", "s");
        const_ints(m, "i", 1, (int64_t[]){ 0 });
        add_node(m, "Gather", NULL, "s,i", "b");
        const_ints(m, "k", 1, (int64_t[]){ 6 });
        add_node(m, "Mul", "mul", "b,k", "b6");
        add_node(m, "Reshape", "r", "x,b6", "y");
        add_output(m, "y");
        refuse(m, -ENOTSUP, "t.onnx: node \"mul\" (Mul): a shape that does not fold to static");

        m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,6");
        add_input(m, "s", T_INT64, "2");
        add_node(m, "Reshape", "r", "x,s", "y");
        add_output(m, "y");
        refuse(m, -ENOTSUP, "t.onnx: node \"r\" (Reshape): input 1 \"s\" (shape) is not a constant");
}

static void test_cycle(void **state)
{
        Onnx__ModelProto *m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,4");
        add_node(m, "Relu", "after", "b", "y");     /* waits on the cycle, not on it */
        add_node(m, "Add", "a", "x,b", "a");
        add_node(m, "Tanh", "b", "a", "b");
        add_output(m, "y");
        struct graph *g;
        char err[512];
        assert_int_equal(load(m, &g, err, sizeof(err)), -EINVAL);
        if (!strstr(err, ": on a cycle (its inputs depend on its outputs)") || strstr(err, "\"after\"") ||
            strncmp(err, "t.onnx: node ", 13) != 0)
                fail_msg("%s", err);
}

/* A graph without an output gives a model nothing to train. */
static void test_no_output(void **state)
{
        (void)state;
        Onnx__ModelProto *m = model_new(17);
        add_input(m, "x", T_FLOAT, "batch,4");
        add_node(m, "Relu", "r", "x", "y");
        refuse(m, -EINVAL, "the graph has no output");
}

static void test_not_onnx(void **state)
{
        struct graph *g = NULL;
        char err[512];
        const char text[] = "this is not a model, it is text\n";
        assert_int_equal(onnx_load_buf(text, sizeof(text) - 1, "t.onnx", &g, err, sizeof(err)), -EBADMSG);
        assert_string_equal(err, "t.onnx: not an ONNX model (protobuf does not parse)");
        assert_null(g);
        /* the first half of a valid model */
        Onnx__ModelProto *m = mlp();
        size_t len;
        uint8_t *buf = pack(m, &len);
        onnx__model_proto__free_unpacked(m, NULL);
        assert_int_equal(onnx_load_buf(buf, len / 2, "t.onnx", &g, err, sizeof(err)), -EBADMSG);
        assert_string_equal(err, "t.onnx: not an ONNX model (protobuf does not parse)");
        free(buf);
        /* a message with no graph (an empty one parses) */
        assert_int_equal(onnx_load_buf("", 0, "t.onnx", &g, err, sizeof(err)), -EBADMSG);
        assert_string_equal(err, "t.onnx: not an ONNX model (no graph)");
        assert_null(g);
}

static void test_opset(void **state)
{
        Onnx__ModelProto *m = mlp();
        m->opset_import[0]->version = 12;
        refuse(m, -ENOTSUP, "t.onnx: opset 12 is not supported (ONNX's default domain: 13 to 17)");
        m = mlp();
        m->opset_import[0]->version = 18;
        refuse(m, -ENOTSUP, "t.onnx: opset 18 is not supported");
        m = mlp();
        free(m->opset_import[0]->domain);
        m->opset_import[0]->domain = xstrdup("ai.onnx.ml");
        refuse(m, -ENOTSUP, "t.onnx: no opset of ONNX's default domain is imported");
}

/* Inputs nobody computes, outputs computed twice, initializers whose data does not match. */
static void test_malformed(void **state)
{
        Onnx__ModelProto *m = mlp();
        free(m->graph->node[1]->input[0]);
        m->graph->node[1]->input[0] = xstrdup("nothing");
        refuse(m, -EINVAL, "t.onnx: node \"relu\" (Relu): input \"nothing\" is no graph input, initializer or "
               "node's output");
        m = mlp();
        free(m->graph->node[1]->output[0]);
        m->graph->node[1]->output[0] = xstrdup("h");
        refuse(m, -EINVAL, "t.onnx: node \"relu\" (Relu): output \"h\" is also node 0's");
        m = mlp();
        m->graph->initializer[0]->dims[0] = 5;
        refuse(m, -EINVAL, "t.onnx: initializer \"fc1.weight\": it holds 12 values, its dims say 15");
        m = mlp();
        m->graph->initializer[2]->raw_data.len -= 4;
        refuse(m, -EINVAL, "t.onnx: initializer \"fc2.weight\": its raw data has 20 bytes, its dims say 6 values");
        m = mlp();
        m->graph->initializer[0]->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
        refuse(m, -ENOTSUP, "initializer \"fc1.weight\": it has type double");
        /* a shape the op refuses, found as the node is added */
        m = mlp();
        m->graph->initializer[2]->dims[1] = 2;
        m->graph->initializer[2]->raw_data.len = 16;
        refuse(m, -EINVAL, "t.onnx: node \"fc2\" (Gemm): ");
}

static int setup(void **state)
{
        return scratch_dir_make("onnx_load");
}

UNIT_TEST_MAIN(setup, scratch_dir_remove,
               cmocka_unit_test(test_mlp),
               cmocka_unit_test(test_file),
               cmocka_unit_test(test_view_folds),
               cmocka_unit_test(test_shape_arith),
               cmocka_unit_test(test_constants),
               cmocka_unit_test(test_unsorted),
               cmocka_unit_test(test_seed_files),
               cmocka_unit_test(test_op_not_supported),
               cmocka_unit_test(test_bad_attribute_value),
               cmocka_unit_test(test_symbolic_dim),
               cmocka_unit_test(test_not_static),
               cmocka_unit_test(test_cycle),
               cmocka_unit_test(test_no_output), cmocka_unit_test(test_not_onnx),
               cmocka_unit_test(test_opset),
               cmocka_unit_test(test_malformed))
