/* What the CUDA plugin's two files share (backend_cuda.cu, the backend; graph_cuda.cu, the graph engine's
 * kernels): the backend's stream and handles for a graph kernel, the one translation of CUDA's and
 * cuBLAS's codes into errno, and the graph kernels' table. Included by nothing outside this folder. */
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backend.h"

struct graph_kernels;

/* A CUDA backend's means for a graph kernel: its stream (every launch and copy goes there), its cuBLAS
 * handle (bound to that stream), and a device int, zero until a kernel flags an error it cannot return
 * (a Gather index out of range; graph_cuda.cu reads and clears it after each forward). */
struct cuda_graph_dev {
        cudaStream_t stream;
        cublasHandle_t blas;
        int *flag;
};

/* Fills *ret for be (a backend of backend_cuda_new), making be's GPU the calling thread's; 0 or -errno
 * (-ENOMEM: the flag's 4 bytes did not fit the cap, the first time). */
int cuda_graph_dev(struct backend *be, struct cuda_graph_dev *ret);

/* CUDA's and cuBLAS's status as -errno (0 for success): backend_cuda.cu's one translation. */
int cuda_status_errno(cudaError_t e);
int cublas_status_errno(cublasStatus_t s);

/* graph_cuda.cu: the graph kernels (graph-internal.h), which the backend's table points at. */
extern const struct graph_kernels cuda_graph_kernels;
