/* An n-dimensional walk shared by the broadcasting kernels (graph_k_elem.c's binary ops, graph_k_matmul.c's
 * Gemm bias and reductions): one shape visited in row-major order, with up to GK_ND_OPS operands each read
 * or written at its own strides, 0 along a dimension the operand is broadcast over. Kernel-private: only
 * graph_k_*.c include it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "graph.h"

#define GK_ND_OPS 3

struct gk_nd {
        uint32_t rank;                              /* >= 1 once built */
        size_t dims[GRAPH_MAX_RANK];
        size_t st[GK_ND_OPS][GRAPH_MAX_RANK];       /* in elements; 0: broadcast along that dim */
};

/* The walk over `full` (dims resolved); operand o has shape ops[o], of rank <= full's, aligned from the
 * right, every dim equal to full's or 1 (what the shape functions checked). Dims of 1 are dropped and
 * neighbours that every operand walks contiguously are merged, so that the inner loop runs as long as it
 * can: an add of equal shapes becomes one flat loop, a bias over (B, N) a loop of N per row. */
static inline void gk_nd_init(struct gk_nd *it, const struct graph_shape *full, const struct graph_shape *const *ops,
                              uint32_t n_ops)
{
        size_t st[GK_ND_OPS][GRAPH_MAX_RANK];
        uint32_t R = full->rank;
        for (uint32_t o = 0; o < n_ops; o++) {
                uint32_t lead = R - ops[o]->rank;
                size_t stride = 1;
                for (uint32_t d = R; d-- > 0;) {
                        size_t n = d < lead ? 1 : (size_t)ops[o]->dims[d - lead];
                        st[o][d] = n == 1 ? 0 : stride;
                        stride *= n;
                }
        }
        it->rank = 0;
        for (uint32_t d = 0; d < R; d++) {
                size_t n = (size_t)full->dims[d];
                if (n == 1)
                        continue;
                if (it->rank) {
                        /* index k * n + j of the merged dim lands at k * prev + j * cur for every operand */
                        uint32_t p = it->rank - 1;
                        bool merge = true;
                        for (uint32_t o = 0; o < n_ops; o++)
                                merge &= it->st[o][p] == st[o][d] * n;
                        if (merge) {
                                it->dims[p] *= n;
                                for (uint32_t o = 0; o < n_ops; o++)
                                        it->st[o][p] = st[o][d];
                                continue;
                        }
                }
                it->dims[it->rank] = n;
                for (uint32_t o = 0; o < n_ops; o++)
                        it->st[o][it->rank] = st[o][d];
                it->rank++;
        }
        if (it->rank == 0) { /* a single element */
                it->rank = 1;
                it->dims[0] = 1;
                for (uint32_t o = 0; o < n_ops; o++)
                        it->st[o][0] = 0;
        }
}

/* Steps the outer index (every dim but the last) and each operand's offset; false once past the end.
 * The caller walks the last dim itself: dims[rank - 1] elements at strides st[o][rank - 1]. */
static inline bool gk_nd_next(const struct gk_nd *it, size_t *idx, size_t *off, uint32_t n_ops)
{
        for (uint32_t d = it->rank - 1; d-- > 0;) {
                for (uint32_t o = 0; o < n_ops; o++)
                        off[o] += it->st[o][d];
                if (++idx[d] < it->dims[d])
                        return true;
                for (uint32_t o = 0; o < n_ops; o++)
                        off[o] -= it->st[o][d] * it->dims[d];
                idx[d] = 0;
        }
        return false;
}
