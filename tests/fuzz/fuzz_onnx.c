/* Harness: the ONNX loader (onnx_load_buf) over any bytes. A refusal is one line naming the file and
 * leaves *ret alone; a graph that loads is finalized, its loss a tensor of it (the first output), every shape static but for the
 * batch as dim 0, and its parameter block the sum of its parameters, laid out in order. Seeds
 * (corpus/onnx): an MLP, torch's x.view(x.size(0), -1) arithmetic, a small CNN as torch exports it for
 * training (BatchNormalization, Pad before AveragePool, Dropout with Constant inputs, Flatten, Gemm)
 * and an embedding bag (Gather, ReduceSum, LayerNormalization). */
#include <string.h>

#include "fuzz_util.h"
#include "graph.h"
#include "onnx_load.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char err[512] = "";
        struct graph *sentinel = (struct graph *)&err, *g = sentinel;
        int r = onnx_load_buf(data, size, "fuzz.onnx", &g, err, sizeof(err));
        if (r < 0) {
                FUZZ_CHECK(g == sentinel, "onnx: *ret written on failure (%d)", r);
                FUZZ_CHECK(strncmp(err, "fuzz.onnx: ", 11) == 0 && err[11], "onnx: error \"%s\"", err);
                FUZZ_CHECK(!strchr(err, '\n'), "onnx: error on more than one line: \"%s\"", err);
                return 0;
        }
        FUZZ_CHECK(r == 0 && g && g != sentinel && g->final && g->loss >= 0 && (uint32_t)g->loss < g->n_tensors,
                   "onnx: %d, graph %p", r, (void *)g);
        size_t params = 0;
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                const struct graph_tensor *t = &g->tensors[i];
                FUZZ_CHECK(t->shape.rank <= GRAPH_MAX_RANK, "onnx: tensor %u has rank %u", i, t->shape.rank);
                for (uint32_t d = 0; d < t->shape.rank; d++)
                        FUZZ_CHECK(t->shape.dims[d] >= 1 ||
                                           (d == 0 && t->shape.dims[0] == GRAPH_BATCH &&
                                            (t->kind == GT_INPUT || t->kind == GT_VALUE)),
                                   "onnx: tensor \"%s\" dim %u is %lld", t->name, d, (long long)t->shape.dims[d]);
                FUZZ_CHECK((t->kind == GT_PARAM || t->kind == GT_CONST) == (t->data != NULL),
                           "onnx: tensor \"%s\" of kind %d has data %p", t->name, t->kind, t->data);
                if (t->kind == GT_PARAM) {
                        FUZZ_CHECK(t->dtype == GDT_F32 && t->param_offset == params, "onnx: parameter \"%s\" at %zu",
                                   t->name, t->param_offset);
                        params += graph_shape_count(&t->shape, 1);
                }
        }
        FUZZ_CHECK(params == g->n_params, "onnx: %zu parameter values, the block says %zu", params, g->n_params);
        for (uint32_t i = 0; i < g->n_nodes; i++)
                for (uint32_t j = 0; j < g->nodes[i].n_out; j++)
                        FUZZ_CHECK(g->tensors[g->nodes[i].out[j]].producer == (int)i, "onnx: node %u's output %u", i,
                                   j);
        graph_free(g);
        return 0;
}
