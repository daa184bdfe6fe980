/* The graph kernels' matrix product through OpenBLAS (graph-internal.h, gk_sgemm): the one place the
 * graph engine calls a BLAS, linked only where a graph runs (graph_exec_new points gk_sgemm here). */
#include <cblas.h>

#include "graph-internal.h"

void gk_blas_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc)
{
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                    lda, B, ldb, beta, C, ldc);
}

int gk_blas_threads_openblas(void)
{
        return openblas_get_num_threads();
}
