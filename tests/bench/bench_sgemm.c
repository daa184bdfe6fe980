/* OpenBLAS sgemm GFLOP/s on large square matrices: the physical limit the training benchmark's
 * GFLOP/s is compared with. Prints one JSON line per thread count. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void openblas_set_num_threads(int);

static double now_s(void) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
        int n = argc > 1 ? atoi(argv[1]) : 1536;
        if (n < 64 || n > 8192) {
                fprintf(stderr, "usage: bench_sgemm [N (64..8192)]\n");
                return 2;
        }
        float *a = malloc((size_t)n * n * sizeof(float)), *b = malloc((size_t)n * n * sizeof(float)),
              *c = malloc((size_t)n * n * sizeof(float));
        if (!a || !b || !c)
                return 1;
        for (size_t i = 0; i < (size_t)n * n; i++) {
                a[i] = (float)(i % 7) * 0.1f;
                b[i] = (float)(i % 5) * 0.2f;
        }
        for (int threads = 1; threads <= 2; threads++) {
                openblas_set_num_threads(threads);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
                double best = 0;
                for (int rep = 0; rep < 3; rep++) {
                        double t0 = now_s();
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
                        double g = 2.0 * n * n * (double)n / (now_s() - t0) / 1e9;
                        if (g > best)
                                best = g;
                }
                printf("{\"sgemm_n\": %d, \"threads\": %d, \"gflops\": %.1f}\n", n, threads, best);
        }
        free(a);
        free(b);
        free(c);
        return 0;
}
