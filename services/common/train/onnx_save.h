/* A graph (graph.h) with its parameters' values written as an ONNX model for serving (opset 17, the
 * default domain): the graph switched to inference (Dropout as Identity, BatchNormalization with its
 * running statistics and one output), every parameter and constant an initializer, the graph's inputs
 * with the batch as the symbolic dim "batch", and as outputs the graph's loss output (the logits) and
 * the head's output on it: "probabilities" (Softmax over the last axis; softmax head), "probability"
 * (Sigmoid; logistic head) or "prediction" (the value; mse head). The constant inputs that the loader
 * moved into attributes (Reshape's shape, Pad's pads and value, the axes of Squeeze, Unsqueeze and
 * ReduceSum) go back to being initializers. onnx_load_file reads such a file back into the same graph
 * (less the Dropouts). Not thread-safe. */
#pragma once
#include <stddef.h>

#include "model_spec.h"

struct graph;

/* The ONNX model's bytes for graph g with parameter block params (g->n_params floats): a malloc'd buffer
 * in *ret (the caller frees it) of *len_ret bytes. doc (nullable) is the model's doc_string. 0, or
 * -EINVAL with why in err (a graph this writer cannot express), -ENOMEM. */
int onnx_save_buf(const struct graph *g, const float *params, enum model_head head, const char *doc, void **ret,
                  size_t *len_ret, char *err, size_t errlen);

/* An embedding table's lookup put in front of the graph (docs/serving.md): the ids' columns it reads,
 * hashed modulo vocab as psfleet's input pipeline does (vocab > 0), mapped to rows (a Gather on the
 * table; raw ids through an ai.onnx.ml LabelEncoder from id to row), pooled per field as psfleet pools
 * (sum: each row times its id's weight; mean: the rows of the ids whose weight is not 0, averaged; a
 * field without such ids gives zeros), and the (batch, n_fields * dim) result into the graph's tensor
 * `into`. Ids and weights are (batch, ids_width), one id per field, or with multi (batch, ids_width,
 * "ids_per_field"), padded with weight 0. Without rows the table is served from outside: `into` (or,
 * with into NULL, "<name>/pooled") is an input of the graph instead. */
struct onnx_table {
        const char *name;         /* names its nodes and initializers "emb/<name>/..." */
        const char *ids;          /* the int64 (batch, ids_width) input of the ids, the data's bits */
        const char *weights;      /* the float (batch, ids_width) input of each id's weight (0: no id) */
        uint32_t ids_width;
        bool multi;               /* several ids per field: a third dimension */
        uint32_t n_fields;
        const uint32_t *fields;   /* the columns of ids this table reads, in order (n_fields) */
        uint32_t dim;
        uint64_t vocab;           /* > 0: rows is (vocab, dim), row id mod vocab (ids as unsigned) */
        bool mean;
        const float *rows;        /* (n_rows, dim); NULL: served from outside */
        uint64_t n_rows;          /* vocab, or (vocab 0) the trained ids' count + 1 */
        const uint64_t *keys;     /* vocab 0: the ids of rows[0..n_rows - 1); every other id gets the last row */
        const char *into;         /* a GT_INPUT of the graph; NULL: "<name>/pooled", for concat */
};

/* What goes in front of the graph: its tables, and for a layer list (concat non-NULL, a GT_INPUT of the
 * graph) the input that is the dense features (`dense`, (batch, n_dense); none when n_dense is 0)
 * followed by each table's pooled rows, in order. */
struct onnx_front {
        uint32_t n_tables;
        const struct onnx_table *tables;
        const char *concat;
        const char *dense;
        uint32_t n_dense;
};

/* ONNX's external data, for a model over protobuf's 2 GiB: every initializer of at least min_bytes is
 * left out of the file and said to lie in the file `location` beside it, at an offset that is a multiple
 * of 4096. The save lists the pieces of that file, in order; the caller writes them (zeros between). */
struct onnx_external_piece {
        const void *data;       /* the caller's parameters or rows: not copied */
        uint64_t offset, len;
};
struct onnx_external {
        const char *location;
        uint64_t min_bytes;
        size_t n;                            /* out: the pieces */
        struct onnx_external_piece *pieces;  /* out: malloc'd, the caller frees */
        uint64_t size;                       /* out: the data file's bytes */
};

/* onnx_save_buf with the front before the graph (front nullable: onnx_save_buf) and the large
 * initializers in an external data file (ext nullable: none). The same returns; -EINVAL also for a
 * front that names no input of the graph. */
int onnx_save_front_buf(const struct graph *g, const float *params, enum model_head head,
                        const struct onnx_front *front, struct onnx_external *ext, const char *doc, void **ret,
                        size_t *len_ret, char *err, size_t errlen);
