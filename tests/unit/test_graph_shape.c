/* graph_k_shape.c: the data-movement ops (Flatten, Reshape, Squeeze, Unsqueeze, Identity, Transpose,
 * Concat, Gather, Pad) against references computed here (exact: they only move values), their gradients
 * against finite differences, their shape inference with and without the symbolic batch, and their
 * refusals through graph_finalize. */
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

#include "graph.h"
#include "graph_check.h"

#define BATCH GRAPH_BATCH /* a shape's symbolic batch dim */

/* ---- helpers ---- */

/* Builds one node "n" (output "y") over inputs made as gc_check makes them, except that an input whose
 * shape holds the batch is fed (GT_INPUT), and finalizes it. Returns graph_finalize's result; the
 * output's shape in *out on success, the message in err. */
static int infer(enum graph_op op, const struct graph_attrs *a, const struct gc_input *in, uint32_t n_in,
                 struct graph_shape *out, char *err, size_t errlen)
{
        struct graph *g = graph_new();
        assert_non_null(g);
        int32_t idx[GRAPH_MAX_IN];
        err[0] = 0;
        for (uint32_t i = 0; i < n_in; i++) {
                bool fed = false;
                for (uint32_t d = 0; d < in[i].shape.rank; d++)
                        fed |= in[i].shape.dims[d] == GRAPH_BATCH;
                enum graph_tensor_kind kind = fed ? GT_INPUT : in[i].dtype == GDT_F32 ? GT_PARAM : GT_CONST;
                idx[i] = graph_add_tensor(g, in[i].name, kind, in[i].dtype, &in[i].shape, fed ? NULL : in[i].data);
                assert_true(idx[i] >= 0);
        }
        const char *outs[1] = { "y" };
        int rc = graph_add_node(g, op, "n", idx, n_in, outs, 1, a);
        assert_true(rc >= 0);
        rc = graph_finalize(g, err, errlen);
        if (rc == 0)
                *out = g->tensors[graph_find(g, "y")].shape;
        graph_free(g);
        return rc;
}

static void expect_shape_(enum graph_op op, const struct graph_attrs *a, const struct gc_input *in, uint32_t n_in,
                          struct graph_shape want)
{
        char err[256];
        struct graph_shape got;
        int rc = infer(op, a, in, n_in, &got, err, sizeof(err));
        if (rc != 0)
                fail_msg("%s: %d: %s", graph_op_name(op), rc, err);
        assert_int_equal(got.rank, want.rank);
        for (uint32_t i = 0; i < want.rank; i++)
                if (got.dims[i] != want.dims[i])
                        fail_msg("%s: dim %u is %lld, want %lld", graph_op_name(op), i, (long long)got.dims[i],
                                 (long long)want.dims[i]);
}
#define EXPECT_SHAPE(op, a, in, n_in, ...) expect_shape_(op, a, in, n_in, GC_SHAPE(__VA_ARGS__))

/* graph_finalize refuses the node with -EINVAL, naming it, its op, and why (containing because). */
static void expect_refused(enum graph_op op, const struct graph_attrs *a, const struct gc_input *in, uint32_t n_in,
                           const char *because)
{
        char err[256];
        struct graph_shape got;
        int rc = infer(op, a, in, n_in, &got, err, sizeof(err));
        if (rc != -EINVAL)
                fail_msg("%s: finalize returned %d, want -EINVAL (err \"%s\")", graph_op_name(op), rc, err);
        char opname[64];
        snprintf(opname, sizeof(opname), "(%s)", graph_op_name(op));
        if (!strstr(err, "\"n\"") || !strstr(err, opname) || !strstr(err, because))
                fail_msg("%s: err \"%s\" should name node \"n\", %s and say \"%s\"", graph_op_name(op), err, opname,
                         because);
}

/* Runs gc_check and asserts the forward is exact and the gradient within the bound. */
static void check_(enum graph_op op, const struct graph_attrs *a, const struct gc_input *in, uint32_t n_in,
                   const float *ref, const char *what)
{
        struct gc_result r;
        int rc = gc_check(op, a, in, n_in, 1, false, ref, 1e-2, &r);
        if (rc != 0)
                fail_msg("%s: %d: %s", what, rc, r.msg);
        print_message("%-40s fwd max abs %.3g, bwd max rel %.3g over %zu\n", what, r.fwd_max_abs, r.bwd_max_rel,
                      r.n_checked);
        if (r.fwd_max_abs != 0.0 || r.bwd_max_rel > 1e-3)
                fail_msg("%s: fwd %g, bwd %g: %s", what, r.fwd_max_abs, r.bwd_max_rel, r.msg);
        assert_true(r.n_checked > 0);
}

static struct graph_attrs attrs(void)
{
        struct graph_attrs a;
        graph_attrs_default(&a);
        return a;
}

static void set_axes(struct graph_attrs *a, uint32_t n, const int64_t *v)
{
        a->n_axes = n;
        memcpy(a->axes, v, sizeof(int64_t) * n);
}
#define SET_AXES(a, ...) set_axes(a, sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t), (int64_t[]){ __VA_ARGS__ })

static void set_target(struct graph_attrs *a, uint32_t n, const int64_t *v)
{
        a->n_shape = n;
        memcpy(a->shape, v, sizeof(int64_t) * n);
}
#define SET_TARGET(a, ...) \
        set_target(a, sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t), (int64_t[]){ __VA_ARGS__ })

static void set_perm(struct graph_attrs *a, uint32_t n, const int64_t *v)
{
        a->n_perm = n;
        memcpy(a->perm, v, sizeof(int64_t) * n);
}
#define SET_PERM(a, ...) set_perm(a, sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t), (int64_t[]){ __VA_ARGS__ })

static void set_pads(struct graph_attrs *a, uint32_t n, const int64_t *v)
{
        a->n_pads = n;
        memcpy(a->pads, v, sizeof(int64_t) * n);
}
#define SET_PADS(a, ...) set_pads(a, sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t), (int64_t[]){ __VA_ARGS__ })

/* ---- the copies ---- */

static void test_flatten(void **state)
{
        float *x = gc_rand(24, -1, 1, 1); /* (2, 3, 4) */
        struct gc_input in = { "x", GDT_F32, GC_SHAPE(2, 3, 4), x };
        struct graph_attrs a = attrs();
        assert_int_equal(a.axis, 1); /* ONNX's default */
        EXPECT_SHAPE(GOP_FLATTEN, &a, &in, 1, 2, 12);
        check_(GOP_FLATTEN, &a, &in, 1, x, "Flatten axis 1");
        a.axis = -1;
        EXPECT_SHAPE(GOP_FLATTEN, &a, &in, 1, 6, 4);
        check_(GOP_FLATTEN, &a, &in, 1, x, "Flatten axis -1");
        a.axis = 0;
        EXPECT_SHAPE(GOP_FLATTEN, &a, &in, 1, 1, 24);
        a.axis = 3;
        EXPECT_SHAPE(GOP_FLATTEN, &a, &in, 1, 24, 1);
        a.axis = -3;
        EXPECT_SHAPE(GOP_FLATTEN, &a, &in, 1, 1, 24);
        a.axis = 4;
        expect_refused(GOP_FLATTEN, &a, &in, 1, "out of range");
        a.axis = -4;
        expect_refused(GOP_FLATTEN, &a, &in, 1, "out of range");

        /* the batch: kept when the dims folded with it are 1s, refused when it would be multiplied */
        struct gc_input fed = { "x", GDT_F32, GC_SHAPE(BATCH, 3, 4), NULL };
        a.axis = 1;
        EXPECT_SHAPE(GOP_FLATTEN, &a, &fed, 1, BATCH, 12);
        a.axis = 0;
        expect_refused(GOP_FLATTEN, &a, &fed, 1, "multiple of the batch");
        a.axis = 2;
        expect_refused(GOP_FLATTEN, &a, &fed, 1, "multiple of the batch");
        struct gc_input fed1 = { "x", GDT_F32, GC_SHAPE(BATCH, 1, 4), NULL };
        EXPECT_SHAPE(GOP_FLATTEN, &a, &fed1, 1, BATCH, 4);
        free(x);
}

static void test_reshape(void **state)
{
        float *x = gc_rand(24, -1, 1, 2); /* (2, 3, 4) */
        struct gc_input in = { "x", GDT_F32, GC_SHAPE(2, 3, 4), x };
        struct graph_attrs a = attrs();
        SET_TARGET(&a, 0, -1);
        EXPECT_SHAPE(GOP_RESHAPE, &a, &in, 1, 2, 12);
        check_(GOP_RESHAPE, &a, &in, 1, x, "Reshape (0, -1)");
        SET_TARGET(&a, 4, 0, -1); /* the 0 copies the input's dim 1 */
        EXPECT_SHAPE(GOP_RESHAPE, &a, &in, 1, 4, 3, 2);
        check_(GOP_RESHAPE, &a, &in, 1, x, "Reshape (4, 0, -1)");
        SET_TARGET(&a, 6, 2, 2);
        EXPECT_SHAPE(GOP_RESHAPE, &a, &in, 1, 6, 2, 2);
        SET_TARGET(&a, 1, 1, 24, 1);
        EXPECT_SHAPE(GOP_RESHAPE, &a, &in, 1, 1, 1, 24, 1);

        SET_TARGET(&a, -1, 0, -1);
        expect_refused(GOP_RESHAPE, &a, &in, 1, "-1 twice");
        SET_TARGET(&a, 5, -1);
        expect_refused(GOP_RESHAPE, &a, &in, 1, "not a multiple of 5");
        SET_TARGET(&a, 5, 5);
        expect_refused(GOP_RESHAPE, &a, &in, 1, "holds 25 values");
        SET_TARGET(&a, 2, -2, 12);
        expect_refused(GOP_RESHAPE, &a, &in, 1, "is -2");
        SET_TARGET(&a, 2, 3, 4, 0);
        expect_refused(GOP_RESHAPE, &a, &in, 1, "has rank 3");

        /* the batch flows through a 0 at its index, or through the -1 when the rest is one example */
        struct gc_input fed = { "x", GDT_F32, GC_SHAPE(BATCH, 3, 4), NULL };
        SET_TARGET(&a, 0, -1);
        EXPECT_SHAPE(GOP_RESHAPE, &a, &fed, 1, BATCH, 12);
        SET_TARGET(&a, -1, 12);
        EXPECT_SHAPE(GOP_RESHAPE, &a, &fed, 1, BATCH, 12);
        SET_TARGET(&a, -1, 2, 6);
        EXPECT_SHAPE(GOP_RESHAPE, &a, &fed, 1, BATCH, 2, 6);
        SET_TARGET(&a, 0, 0, 2, 2);
        EXPECT_SHAPE(GOP_RESHAPE, &a, &fed, 1, BATCH, 3, 2, 2);
        SET_TARGET(&a, 0, 12);
        EXPECT_SHAPE(GOP_RESHAPE, &a, &fed, 1, BATCH, 12);
        SET_TARGET(&a, 12, -1); /* (12, B) would be the same bytes, but the engine keeps the batch first */
        expect_refused(GOP_RESHAPE, &a, &fed, 1, "has to stay dim 0");
        SET_TARGET(&a, -1, 6);
        expect_refused(GOP_RESHAPE, &a, &fed, 1, "not be the batch alone");
        SET_TARGET(&a, 2, -1);
        expect_refused(GOP_RESHAPE, &a, &fed, 1, "not be the batch alone");
        SET_TARGET(&a, 3, 4);
        expect_refused(GOP_RESHAPE, &a, &fed, 1, "neither copies it");
        SET_TARGET(&a, 0, 5, -1);
        expect_refused(GOP_RESHAPE, &a, &fed, 1, "12 values per example are not a multiple of 5");

        /* and runs at a batch */
        struct graph *g = graph_new();
        int32_t xi = graph_add_tensor(g, "x", GT_INPUT, GDT_F32, &fed.shape, NULL);
        SET_TARGET(&a, 0, -1);
        const char *outs[1] = { "y" };
        assert_true(graph_add_node(g, GOP_RESHAPE, "n", &xi, 1, outs, 1, &a) >= 0);
        char err[256] = "";
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        struct graph_exec *e = NULL;
        assert_int_equal(graph_exec_new(g, 4, &e, err, sizeof(err)), 0);
        float *xb = gc_rand(36, -1, 1, 3); /* (3, 3, 4) */
        assert_int_equal(graph_set_input(e, xi, xb, 3), 0);
        assert_int_equal(graph_forward(e, false, 1), 0);
        size_t ny = 0;
        const float *y = graph_value(e, graph_find(g, "y"), &ny);
        assert_int_equal(ny, 36);
        assert_memory_equal(y, xb, sizeof(float) * 36);
        free(xb);
        graph_exec_free(e);
        graph_free(g);
        free(x);
}

static void test_squeeze(void **state)
{
        float *x = gc_rand(6, -1, 1, 4); /* (2, 1, 3, 1) */
        struct gc_input in = { "x", GDT_F32, GC_SHAPE(2, 1, 3, 1), x };
        struct graph_attrs a = attrs();
        EXPECT_SHAPE(GOP_SQUEEZE, &a, &in, 1, 2, 3); /* no axes: every 1 */
        check_(GOP_SQUEEZE, &a, &in, 1, x, "Squeeze ()");
        SET_AXES(&a, -1);
        EXPECT_SHAPE(GOP_SQUEEZE, &a, &in, 1, 2, 1, 3);
        check_(GOP_SQUEEZE, &a, &in, 1, x, "Squeeze (-1)");
        SET_AXES(&a, 1, -1);
        EXPECT_SHAPE(GOP_SQUEEZE, &a, &in, 1, 2, 3);
        SET_AXES(&a, 2);
        expect_refused(GOP_SQUEEZE, &a, &in, 1, "not 1");
        SET_AXES(&a, 3, -1);
        expect_refused(GOP_SQUEEZE, &a, &in, 1, "twice");
        SET_AXES(&a, 4);
        expect_refused(GOP_SQUEEZE, &a, &in, 1, "out of range");

        struct gc_input fed = { "x", GDT_F32, GC_SHAPE(BATCH, 1, 3), NULL };
        a.n_axes = 0;
        EXPECT_SHAPE(GOP_SQUEEZE, &a, &fed, 1, BATCH, 3);
        SET_AXES(&a, 0);
        expect_refused(GOP_SQUEEZE, &a, &fed, 1, "is the batch");
        free(x);
}

static void test_unsqueeze(void **state)
{
        float *x = gc_rand(6, -1, 1, 5); /* (2, 3) */
        struct gc_input in = { "x", GDT_F32, GC_SHAPE(2, 3), x };
        struct graph_attrs a = attrs();
        SET_AXES(&a, 0, -1);
        EXPECT_SHAPE(GOP_UNSQUEEZE, &a, &in, 1, 1, 2, 3, 1);
        check_(GOP_UNSQUEEZE, &a, &in, 1, x, "Unsqueeze (0, -1)");
        SET_AXES(&a, 1);
        EXPECT_SHAPE(GOP_UNSQUEEZE, &a, &in, 1, 2, 1, 3);
        SET_AXES(&a, -2, 1);
        EXPECT_SHAPE(GOP_UNSQUEEZE, &a, &in, 1, 2, 1, 1, 3);
        a.n_axes = 0;
        expect_refused(GOP_UNSQUEEZE, &a, &in, 1, "no axes");
        SET_AXES(&a, 3);
        expect_refused(GOP_UNSQUEEZE, &a, &in, 1, "out of range");
        SET_AXES(&a, 1, -3);
        expect_refused(GOP_UNSQUEEZE, &a, &in, 1, "twice");
        SET_AXES(&a, 0, 1, 2, 3, 4);
        expect_refused(GOP_UNSQUEEZE, &a, &in, 1, "rank 7");

        struct gc_input fed = { "x", GDT_F32, GC_SHAPE(BATCH, 3), NULL };
        SET_AXES(&a, 1);
        EXPECT_SHAPE(GOP_UNSQUEEZE, &a, &fed, 1, BATCH, 1, 3);
        SET_AXES(&a, 0);
        expect_refused(GOP_UNSQUEEZE, &a, &fed, 1, "has to stay dim 0");
        free(x);
}

static void test_identity(void **state)
{
        float *x = gc_rand(12, -1, 1, 6);
        struct gc_input in = { "x", GDT_F32, GC_SHAPE(3, 4), x };
        struct graph_attrs a = attrs();
        check_(GOP_IDENTITY, &a, &in, 1, x, "Identity");
        free(x);
}

/* ---- Transpose ---- */

/* y = x transposed by perm, by index arithmetic (not the kernel's walk). */
static void ref_transpose(const float *x, struct graph_shape s, const uint32_t *perm, float *y)
{
        size_t n = graph_shape_count(&s, 1);
        int64_t st[GRAPH_MAX_RANK], od[GRAPH_MAX_RANK];
        int64_t c = 1;
        for (int i = (int)s.rank - 1; i >= 0; i--) {
                st[i] = c;
                c *= s.dims[i];
        }
        for (uint32_t i = 0; i < s.rank; i++)
                od[i] = s.dims[perm[i]];
        for (size_t o = 0; o < n; o++) {
                size_t rem = o, src = 0;
                for (int i = (int)s.rank - 1; i >= 0; i--) {
                        src += (rem % (size_t)od[i]) * (size_t)st[perm[i]];
                        rem /= (size_t)od[i];
                }
                y[o] = x[src];
        }
}

static void test_transpose(void **state)
{
        float *x = gc_rand(24, -1, 1, 7), y[120];
        struct gc_input in = { "x", GDT_F32, GC_SHAPE(2, 3, 4), x };
        struct graph_attrs a = attrs();
        SET_PERM(&a, 2, 0, 1);
        EXPECT_SHAPE(GOP_TRANSPOSE, &a, &in, 1, 4, 2, 3);
        ref_transpose(x, in.shape, (uint32_t[]){ 2, 0, 1 }, y);
        /* spot check of the reference itself: y[l][i][j] = x[i][j][l] */
        assert_true(y[(3 * 2 + 1) * 3 + 2] == x[(1 * 3 + 2) * 4 + 3]);
        check_(GOP_TRANSPOSE, &a, &in, 1, y, "Transpose (2, 0, 1)");
        a.n_perm = 0; /* reversed */
        EXPECT_SHAPE(GOP_TRANSPOSE, &a, &in, 1, 4, 3, 2);
        ref_transpose(x, in.shape, (uint32_t[]){ 2, 1, 0 }, y);
        check_(GOP_TRANSPOSE, &a, &in, 1, y, "Transpose ()");

        float *x4 = gc_rand(120, -1, 1, 8); /* NCHW (2, 3, 4, 5) to NHWC */
        struct gc_input in4 = { "x", GDT_F32, GC_SHAPE(2, 3, 4, 5), x4 };
        SET_PERM(&a, 0, 2, 3, 1);
        EXPECT_SHAPE(GOP_TRANSPOSE, &a, &in4, 1, 2, 4, 5, 3);
        ref_transpose(x4, in4.shape, (uint32_t[]){ 0, 2, 3, 1 }, y);
        check_(GOP_TRANSPOSE, &a, &in4, 1, y, "Transpose NCHW->NHWC");

        SET_PERM(&a, 0, 2, 2);
        expect_refused(GOP_TRANSPOSE, &a, &in, 1, "perm lists axis 2 twice");
        SET_PERM(&a, 1, 0);
        expect_refused(GOP_TRANSPOSE, &a, &in, 1, "2 entries for rank 3");
        SET_PERM(&a, 0, 1, 3);
        expect_refused(GOP_TRANSPOSE, &a, &in, 1, "out of range");
        SET_PERM(&a, 0, -1, 1);
        expect_refused(GOP_TRANSPOSE, &a, &in, 1, "out of range");

        struct gc_input fed = { "x", GDT_F32, GC_SHAPE(BATCH, 3, 4), NULL };
        SET_PERM(&a, 0, 2, 1);
        EXPECT_SHAPE(GOP_TRANSPOSE, &a, &fed, 1, BATCH, 4, 3);
        a.n_perm = 0;
        expect_refused(GOP_TRANSPOSE, &a, &fed, 1, "the batch would be the output's dim 2");
        free(x4);
        free(x);
}

/* ---- Concat ---- */

static void test_concat(void **state)
{
        /* (2, 1, 3), (2, 2, 3), (2, 3, 3) on axis 1: (2, 6, 3) */
        float *p = gc_rand(6, -1, 1, 9), *q = gc_rand(12, -1, 1, 10), *r = gc_rand(18, -1, 1, 11), y[36];
        struct gc_input in[3] = {
                { "p", GDT_F32, GC_SHAPE(2, 1, 3), p },
                { "q", GDT_F32, GC_SHAPE(2, 2, 3), q },
                { "r", GDT_F32, GC_SHAPE(2, 3, 3), r },
        };
        for (int i = 0; i < 2; i++)
                for (int j = 0; j < 6; j++)
                        for (int l = 0; l < 3; l++)
                                y[(i * 6 + j) * 3 + l] = j < 1   ? p[(i * 1 + j) * 3 + l]
                                                         : j < 3 ? q[(i * 2 + j - 1) * 3 + l]
                                                                 : r[(i * 3 + j - 3) * 3 + l];
        struct graph_attrs a = attrs();
        a.axis = 1;
        EXPECT_SHAPE(GOP_CONCAT, &a, in, 3, 2, 6, 3);
        check_(GOP_CONCAT, &a, in, 3, y, "Concat of 3 on axis 1");
        a.axis = -2;
        EXPECT_SHAPE(GOP_CONCAT, &a, in, 3, 2, 6, 3);
        check_(GOP_CONCAT, &a, in, 3, y, "Concat of 3 on axis -2");
        a.axis = 0; /* dims 1 differ */
        expect_refused(GOP_CONCAT, &a, in, 3, "input 1 has dim 1 = 2");
        a.axis = 3;
        expect_refused(GOP_CONCAT, &a, in, 3, "out of range");
        struct gc_input bad[2] = { in[0], { "s", GDT_F32, GC_SHAPE(2, 3), q } };
        a.axis = 1;
        expect_refused(GOP_CONCAT, &a, bad, 2, "rank 2");
        int64_t ids[6] = { 0 };
        struct gc_input mixed[2] = { in[0], { "s", GDT_I64, GC_SHAPE(2, 1, 3), ids } };
        expect_refused(GOP_CONCAT, &a, mixed, 2, "int64");

        /* the batch beside the axis flows; along it, refused */
        struct gc_input fed[2] = { { "f", GDT_F32, GC_SHAPE(BATCH, 2, 3), NULL },
                                   { "g", GDT_F32, GC_SHAPE(BATCH, 4, 3), NULL } };
        EXPECT_SHAPE(GOP_CONCAT, &a, fed, 2, BATCH, 6, 3);
        struct gc_input fp[2] = { fed[0], { "w", GDT_F32, GC_SHAPE(1, 2, 3), NULL } };
        expect_refused(GOP_CONCAT, &a, fp, 2, "batch in input 0 but not in input 1");
        a.axis = 0;
        expect_refused(GOP_CONCAT, &a, fp, 2, "axis 0 is the batch");
        free(p);
        free(q);
        free(r);
}

/* ---- Gather ---- */

static void test_gather_axis0(void **state)
{
        float *d = gc_rand(15, -1, 1, 12), y[24]; /* (5, 3) */
        const int64_t idx[4] = { 4, -1, 0, 2 };   /* -1 is 4 */
        struct gc_input in[2] = { { "d", GDT_F32, GC_SHAPE(5, 3), d }, { "i", GDT_I64, GC_SHAPE(4), idx } };
        for (int j = 0; j < 4; j++)
                for (int l = 0; l < 3; l++)
                        y[j * 3 + l] = d[(idx[j] < 0 ? idx[j] + 5 : idx[j]) * 3 + l];
        struct graph_attrs a = attrs();
        a.axis = 0;
        EXPECT_SHAPE(GOP_GATHER, &a, in, 2, 4, 3);
        check_(GOP_GATHER, &a, in, 2, y, "Gather axis 0 (rows 4 twice)");
        in[1].shape = GC_SHAPE(2, 2); /* the same indices as (2, 2): (2, 2, 3), the same values */
        EXPECT_SHAPE(GOP_GATHER, &a, in, 2, 2, 2, 3);
        check_(GOP_GATHER, &a, in, 2, y, "Gather axis 0, indices (2, 2)");
        const int64_t one = -5; /* a scalar index: (3) */
        struct gc_input sc[2] = { in[0], { "i", GDT_I64, { .rank = 0 }, &one } };
        EXPECT_SHAPE(GOP_GATHER, &a, sc, 2, 3);
        check_(GOP_GATHER, &a, sc, 2, d, "Gather axis 0, scalar index -5");

        const int64_t far[2] = { 1, 5 }, low[2] = { -6, 0 };
        struct gc_input bad[2] = { in[0], { "i", GDT_I64, GC_SHAPE(2), far } };
        expect_refused(GOP_GATHER, &a, bad, 2, "index 5 (element 1) is out of range");
        bad[1].data = low;
        expect_refused(GOP_GATHER, &a, bad, 2, "index -6");
        float fi[2] = { 0, 1 };
        struct gc_input fl[2] = { in[0], { "i", GDT_F32, GC_SHAPE(2), fi } };
        expect_refused(GOP_GATHER, &a, fl, 2, "not int64");
        a.axis = 2;
        expect_refused(GOP_GATHER, &a, in, 2, "out of range");
        free(d);
}

static void test_gather_axis1(void **state)
{
        float *d = gc_rand(24, -1, 1, 13), y[16]; /* (2, 4, 3) */
        const int64_t idx[2] = { 3, -2 };         /* -2 is 2 */
        struct gc_input in[2] = { { "d", GDT_F32, GC_SHAPE(2, 4, 3), d }, { "i", GDT_I64, GC_SHAPE(2), idx } };
        for (int o = 0; o < 2; o++)
                for (int j = 0; j < 2; j++)
                        for (int l = 0; l < 3; l++)
                                y[(o * 2 + j) * 3 + l] = d[(o * 4 + (idx[j] < 0 ? idx[j] + 4 : idx[j])) * 3 + l];
        struct graph_attrs a = attrs();
        a.axis = 1;
        EXPECT_SHAPE(GOP_GATHER, &a, in, 2, 2, 2, 3);
        check_(GOP_GATHER, &a, in, 2, y, "Gather axis 1");
        a.axis = -2;
        check_(GOP_GATHER, &a, in, 2, y, "Gather axis -2");
        const int64_t rep[3] = { 1, 1, -3 }; /* all row 1: the scatter-add sums three gradients */
        struct gc_input r3[2] = { in[0], { "i", GDT_I64, GC_SHAPE(3), rep } };
        check_(GOP_GATHER, &a, r3, 2, NULL, "Gather axis -2, one row thrice");
        a.axis = 2; /* on the last axis: inner 1 */
        const int64_t last[2] = { -1, 0 };
        struct gc_input l2[2] = { in[0], { "i", GDT_I64, GC_SHAPE(1, 2), last } };
        EXPECT_SHAPE(GOP_GATHER, &a, l2, 2, 2, 4, 1, 2);
        for (int o = 0; o < 8; o++) {
                y[o * 2] = d[o * 3 + 2];
                y[o * 2 + 1] = d[o * 3];
        }
        check_(GOP_GATHER, &a, l2, 2, y, "Gather axis 2, indices (1, 2)");
        free(d);
}

/* An embedding lookup: the table a parameter, the ids fed per example; its gradient the scatter-add of
 * the rows' gradients. Fed ids out of range fail the step. */
static void test_gather_embedding(void **state)
{
        struct graph *g = graph_new();
        float *table = gc_rand(15, -1, 1, 14); /* (5, 3) */
        struct graph_shape ts = GC_SHAPE(5, 3), is = GC_SHAPE(BATCH, 2);
        int32_t in[2] = { graph_add_tensor(g, "table", GT_PARAM, GDT_F32, &ts, table),
                          graph_add_tensor(g, "ids", GT_INPUT, GDT_I64, &is, NULL) };
        struct graph_attrs a = attrs();
        a.axis = 0;
        const char *outs[1] = { "y" };
        assert_true(graph_add_node(g, GOP_GATHER, "emb", in, 2, outs, 1, &a) >= 0);
        char err[256] = "";
        assert_int_equal(graph_finalize(g, err, sizeof(err)), 0);
        int32_t yi = graph_find(g, "y");
        const struct graph_shape *ys = &g->tensors[yi].shape;
        assert_int_equal(ys->rank, 3);
        assert_true(ys->dims[0] == BATCH && ys->dims[1] == 2 && ys->dims[2] == 3);
        struct graph_exec *e = NULL;
        assert_int_equal(graph_exec_new(g, 4, &e, err, sizeof(err)), 0);
        const int64_t ids[6] = { 1, 4, -1, 1, 0, 1 }; /* (3, 2): row 1 thrice, 4 twice */
        assert_int_equal(graph_set_input(e, in[1], ids, 3), 0);
        assert_int_equal(graph_forward(e, true, 1), 0);
        size_t ny = 0;
        const float *y = graph_value(e, yi, &ny);
        assert_int_equal(ny, 18);
        for (int j = 0; j < 6; j++)
                for (int l = 0; l < 3; l++)
                        assert_true(y[j * 3 + l] == table[(ids[j] < 0 ? ids[j] + 5 : ids[j]) * 3 + l]);
        float *dy = gc_rand(18, -1, 1, 15), want[15] = { 0 };
        for (int j = 0; j < 6; j++)
                for (int l = 0; l < 3; l++)
                        want[(ids[j] < 0 ? ids[j] + 5 : ids[j]) * 3 + l] += dy[j * 3 + l];
        assert_int_equal(graph_backward(e, yi, dy), 0);
        const float *gr = graph_exec_grads(e);
        double worst = 0;
        for (int i = 0; i < 15; i++)
                worst = fmax(worst, fabs((double)gr[i] - want[i]));
        print_message("%-40s bwd max abs %.3g\n", "Gather embedding (B=3)", worst);
        assert_true(worst <= 1e-6);

        const int64_t badids[2] = { 0, 5 };
        assert_int_equal(graph_set_input(e, in[1], badids, 1), 0);
        assert_int_equal(graph_forward(e, true, 1), -EINVAL);
        free(dy);
        graph_exec_free(e);
        graph_free(g);
        free(table);

        /* the batch in both the data and the indices would be a (B, B) output */
        struct gc_input both[2] = { { "d", GDT_F32, GC_SHAPE(BATCH, 4), NULL },
                                    { "i", GDT_I64, GC_SHAPE(BATCH), NULL } };
        a.axis = 1;
        expect_refused(GOP_GATHER, &a, both, 2, "twice");
        /* fed indices into axis 1 would put the batch second */
        struct gc_input mid[2] = { { "d", GDT_F32, GC_SHAPE(4, 5), NULL }, { "i", GDT_I64, GC_SHAPE(BATCH, 2), NULL } };
        expect_refused(GOP_GATHER, &a, mid, 2, "has to stay dim 0");
        a.axis = 0;
        EXPECT_SHAPE(GOP_GATHER, &a, mid, 2, BATCH, 2, 5);
}

/* ---- Pad ---- */

static void test_pad(void **state)
{
        /* NCHW (2, 3, 4, 5), pads begins (0, 1, 2, 0), ends (0, 0, 1, 3): (2, 4, 7, 8) */
        float *x = gc_rand(120, -1, 1, 16), y[2 * 4 * 7 * 8];
        struct gc_input in = { "x", GDT_F32, GC_SHAPE(2, 3, 4, 5), x };
        struct graph_attrs a = attrs();
        SET_PADS(&a, 0, 1, 2, 0, 0, 0, 1, 3);
        a.pad_value = 0.5f;
        for (int n = 0; n < 2; n++)
                for (int c = 0; c < 4; c++)
                        for (int h = 0; h < 7; h++)
                                for (int w = 0; w < 8; w++) {
                                        int sc = c - 1, sh = h - 2, sw = w;
                                        bool inside = sc >= 0 && sc < 3 && sh >= 0 && sh < 4 && sw < 5;
                                        y[((n * 4 + c) * 7 + h) * 8 + w] =
                                                inside ? x[((n * 3 + sc) * 4 + sh) * 5 + sw] : 0.5f;
                                }
        EXPECT_SHAPE(GOP_PAD, &a, &in, 1, 2, 4, 7, 8);
        check_(GOP_PAD, &a, &in, 1, y, "Pad NCHW asymmetric, value 0.5");
        SET_PADS(&a, 0, 0, 0, 0, 0, 0, 0, 0);
        check_(GOP_PAD, &a, &in, 1, x, "Pad nothing");

        SET_PADS(&a, 0, 1, -1, 0, 0, 0, 1, 3);
        expect_refused(GOP_PAD, &a, &in, 1, "pads are negative");
        SET_PADS(&a, 0, 1, 0, 1);
        expect_refused(GOP_PAD, &a, &in, 1, "4 pads for rank 4");

        struct gc_input fed = { "x", GDT_F32, GC_SHAPE(BATCH, 3, 4, 5), NULL };
        SET_PADS(&a, 0, 0, 1, 1, 0, 0, 1, 1);
        EXPECT_SHAPE(GOP_PAD, &a, &fed, 1, BATCH, 3, 6, 7);
        SET_PADS(&a, 1, 0, 0, 0, 0, 0, 0, 0);
        expect_refused(GOP_PAD, &a, &fed, 1, "is the batch");
        free(x);
}

UNIT_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_flatten), cmocka_unit_test(test_reshape),
               cmocka_unit_test(test_squeeze), cmocka_unit_test(test_unsqueeze), cmocka_unit_test(test_identity),
               cmocka_unit_test(test_transpose), cmocka_unit_test(test_concat), cmocka_unit_test(test_gather_axis0),
               cmocka_unit_test(test_gather_axis1), cmocka_unit_test(test_gather_embedding),
               cmocka_unit_test(test_pad))
