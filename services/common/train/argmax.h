/* First maxima, as both backends define them: of a row of scores (what "correct" means) and of a
 * max-pooling window (where its gradient goes). One definition for the CPU backend and the CUDA
 * backend's kernels (host and device functions when nvcc compiles them). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define ARGMAX_HD __host__ __device__
#else
#define ARGMAX_HD
#endif

/* The index of the first largest of s[0..C). */
static inline ARGMAX_HD uint32_t row_argmax(const float *s, uint32_t C)
{
        uint32_t best = 0;
        for (uint32_t c = 1; c < C; c++)
                if (s[c] > s[best])
                        best = c;
        return best;
}

/* The index into x (an (H, W) plane, row stride W) of the first largest element of the p x p window
 * at output (oy, ox), scanning rows then columns. */
static inline ARGMAX_HD size_t window_argmax(const float *x, uint32_t W, uint32_t p, uint32_t oy, uint32_t ox)
{
        size_t best = (size_t)(oy * p) * W + ox * p;
        for (uint32_t a = 0; a < p; a++)
                for (uint32_t b = 0; b < p; b++) {
                        size_t j = (size_t)(oy * p + a) * W + ox * p + b;
                        if (x[j] > x[best])
                                best = j;
                }
        return best;
}
