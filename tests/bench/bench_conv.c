/* The graph engine's two convolution paths side by side: graph_k_dconv.c's direct convolution against
 * im2col + sgemm (gk_dconv_mode), one Conv node ("same" pads, stride 1, a bias) forward, then backward
 * (dX, dW, dB), on random data at batch B and one OpenBLAS thread; best of R repetitions each. Prints
 * one JSON line per geometry with the GFLOP/s of each path (2*N*M*C*k*k*H*W a forward, twice that a
 * backward) and which one the engine picks (gk_dconv_geometry, gk_dconv_wins) at this many OpenBLAS threads
 * (OPENBLAS_NUM_THREADS). The figures behind that choice
 * (docs/performance.md).
 *
 *   bench_conv [--batch N] [--reps R] [C,M,HW,k[,stride] ...]
 *
 * A stride other than 1 has no direct path: both figures are im2col's, and "picked" says so.
 *
 * Default: the ResNet example's and the CNN example's layers, and their neighbours. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph-internal.h"
#include "graph.h"
#include "util.h"

struct geom {
        int C, M, HW, k, s; /* s: the stride, both ways */
};

/* Seconds of the best forward and backward over reps; -1 on an error (said on stderr). */
static int time_conv(const struct geom *q, int N, int reps, bool direct, double *fwd, double *bwd)
{
        int64_t C = q->C, M = q->M, HW = q->HW, k = q->k, p = (k - 1) / 2;
        struct graph *g = graph_new();
        struct graph_shape sx = { .rank = 4, .dims = { N, C, HW, HW } }, sw = { .rank = 4, .dims = { M, C, k, k } };
        struct graph_shape sb = { .rank = 1, .dims = { M } };
        int64_t OHW = (HW + 2 * p - k) / q->s + 1;
        size_t nx = (size_t)(N * C * HW * HW), nw = (size_t)(M * C * k * k), ny = (size_t)(N * M * OHW * OHW);
        float *x = malloc(sizeof(float) * nx), *w = malloc(sizeof(float) * nw), *b = calloc((size_t)M, sizeof(float));
        float *dy = malloc(sizeof(float) * ny);
        if (!g || !x || !w || !b || !dy)
                return -1;
        unsigned s = 1;
        for (size_t i = 0; i < nx; i++)
                x[i] = (float)rand_r(&s) / (float)RAND_MAX - 0.5f;
        for (size_t i = 0; i < nw; i++)
                w[i] = (float)rand_r(&s) / (float)RAND_MAX - 0.5f;
        for (size_t i = 0; i < ny; i++)
                dy[i] = (float)rand_r(&s) / (float)RAND_MAX - 0.5f;
        int32_t in[3] = { graph_add_tensor(g, "X", GT_PARAM, GDT_F32, &sx, x),
                          graph_add_tensor(g, "W", GT_PARAM, GDT_F32, &sw, w),
                          graph_add_tensor(g, "B", GT_PARAM, GDT_F32, &sb, b) };
        struct graph_attrs a;
        graph_attrs_default(&a);
        a.n_pads = 4;
        for (int i = 0; i < 4; i++)
                a.pads[i] = p;
        a.n_strides = 2;
        a.strides[0] = a.strides[1] = q->s;
        const char *outs[1] = { "y" };
        char err[256] = "";
        struct graph_exec *xe = NULL;
        gk_dconv_mode = direct ? GK_DCONV_ALWAYS : GK_DCONV_NEVER;
        int rc = graph_add_node(g, GOP_CONV, "conv", in, 3, outs, 1, &a) < 0 ? -1 : graph_finalize(g, err, sizeof(err));
        if (rc == 0)
                rc = graph_exec_new(g, 1, &xe, err, sizeof(err));
        int32_t y = graph_find(g, "y");
        *fwd = *bwd = 1e30;
        for (int r = 0; rc == 0 && r < reps; r++) {
                double t0 = (double)mono_us() * 1e-6;
                rc = graph_forward(xe, true, 1);
                double t1 = (double)mono_us() * 1e-6;
                if (rc == 0)
                        rc = graph_backward(xe, y, dy);
                double t2 = (double)mono_us() * 1e-6;
                *fwd = t1 - t0 < *fwd ? t1 - t0 : *fwd;
                *bwd = t2 - t1 < *bwd ? t2 - t1 : *bwd;
        }
        if (rc < 0)
                fprintf(stderr, "bench_conv: C%d M%d %dx%d k%d: %s\n", q->C, q->M, q->HW, q->HW, q->k,
                        err[0] ? err : "failed");
        graph_exec_free(xe);
        graph_free(g);
        free(x), free(w), free(b), free(dy);
        gk_dconv_mode = GK_DCONV_AUTO;
        return rc < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
        static const struct geom defaults[] = {
                { 1, 16, 28, 3, 1 },  { 16, 16, 28, 3, 1 }, { 16, 32, 28, 3, 1 }, { 32, 32, 28, 3, 1 },
                { 32, 32, 14, 3, 1 }, { 16, 16, 7, 3, 1 },  { 64, 64, 7, 3, 1 },   { 64, 64, 14, 3, 1 },
                { 1, 32, 28, 5, 1 },  { 32, 64, 14, 5, 1 }, { 16, 32, 28, 3, 2 },  { 32, 64, 14, 3, 2 },
        };
        struct geom list[64];
        size_t n = 0;
        int N = 64, reps = 8;
        for (int i = 1; i < argc; i++) {
                struct geom q = { .s = 1 };
                if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
                        N = atoi(argv[++i]);
                else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
                        reps = atoi(argv[++i]);
                else if (n < 64 && sscanf(argv[i], "%d,%d,%d,%d,%d", &q.C, &q.M, &q.HW, &q.k, &q.s) >= 4 &&
                         q.C > 0 && q.M > 0 && q.HW >= q.k && q.k % 2 == 1 && q.s > 0)
                        list[n++] = q;
                else {
                        fprintf(stderr, "usage: bench_conv [--batch N] [--reps R] [C,M,HW,k[,stride] (k odd) ...]\n");
                        return 2;
                }
        }
        if (N < 1 || reps < 1)
                return 2;
        if (!n) {
                n = sizeof(defaults) / sizeof(defaults[0]);
                memcpy(list, defaults, sizeof(defaults));
        }
        for (size_t i = 0; i < n; i++) {
                const struct geom *q = &list[i];
                double df, db, sf, sb;
                if (time_conv(q, N, reps, true, &df, &db) < 0 || time_conv(q, N, reps, false, &sf, &sb) < 0)
                        return 1;
                struct gk_dconv d;
                int64_t p = (q->k - 1) / 2, pads[4] = { p, p, p, p };
                bool picks = gk_dconv_geometry(&d, q->C, q->HW, q->HW, q->M, q->k, q->k, q->s, q->s, 1, 1, pads) == 0 &&
                             gk_dconv_wins(&d);
                int64_t ohw = (q->HW + 2 * p - q->k) / q->s + 1;
                double fl = 2.0 * N * q->M * q->C * q->k * q->k * (double)(ohw * ohw);
                printf("{\"bench\": \"conv\", \"C\": %d, \"M\": %d, \"hw\": %d, \"k\": %d, \"stride\": %d, \"batch\": %d, "
                       "\"fwd_gflops_direct\": %.1f, \"fwd_gflops_im2col\": %.1f, \"bwd_gflops_direct\": %.1f, "
                       "\"bwd_gflops_im2col\": %.1f, \"fwd_ratio\": %.2f, \"bwd_ratio\": %.2f, \"picked\": \"%s\"}\n",
                       q->C, q->M, q->HW, q->k, q->s, N, fl / df / 1e9, fl / sf / 1e9, 2 * fl / db / 1e9, 2 * fl / sb / 1e9,
                       sf / df, sb / db, picks ? "direct" : "im2col");
                fflush(stdout);
        }
        return 0;
}
