/* The model as the job file describes it: an input shape and a list of layers. Shared by the config
 * parser (which fills it) and the model library (which builds from it); model_spec_vars() derives its
 * variables from it alone, so a node that only stores them (psd) needs no backend. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum layer_type {
        LAYER_DENSE,
        LAYER_RELU,
        LAYER_TANH,
        LAYER_SIGMOID,
        LAYER_CONV2D,    /* issue: GPU/CNN; "same" padding, stride 1 */
        LAYER_MAXPOOL2D,
        LAYER_FLATTEN,
};

enum init_kind {
        INIT_DEFAULT,        /* he_normal before ReLU, glorot_uniform otherwise */
        INIT_GLOROT_UNIFORM,
        INIT_HE_NORMAL,
        INIT_ZEROS,
};

struct layer_spec {
        enum layer_type type;
        uint32_t units;       /* dense: output features */
        uint32_t filters;     /* conv2d: output channels */
        uint32_t kernel;      /* conv2d: kernel height = width */
        uint32_t pool;        /* maxpool2d: window = stride */
        enum init_kind init;  /* dense, conv2d: kernel initializer; biases start at zero */
};

#define MODEL_MAX_LAYERS 64

/* What the loss is computed from the last dense layer's outputs with (model.head). */
enum model_head {
        HEAD_SOFTMAX,    /* softmax cross-entropy over C >= 2 outputs; integer labels 0..C-1 */
        HEAD_LOGISTIC,   /* one output: sigmoid cross-entropy; labels 0 or 1 */
        HEAD_MSE,        /* one output: mean squared error; any real label */
};

enum embedding_pooling { POOL_SUM, POOL_MEAN };

#define MODEL_MAX_EMBEDDINGS 8
#define MODEL_MAX_FIELDS 64

/* An embedding table (model.embeddings[]): rows of `dim` floats by 64-bit id, sharded by id over every
 * ps shard, created on first touch (docs/sparse.md). Each of its fields is looked up in it and pooled
 * into its own dim-wide slice of the dense layers' input. */
/* What a table at its bound (max_rows, ps.memory_limit_bytes) evicts first: age and lru the rows touched
 * longest ago (age also drops rows past evict_after_steps; lru only at the bound), lfu the rows used
 * least (a stripe's counts halved each time it has evicted as many rows as it holds). */
enum sparse_evict_policy { SPARSE_EVICT_AGE, SPARSE_EVICT_LRU, SPARSE_EVICT_LFU };

struct embedding_spec {
        char name[32];              /* checkpoints: "emb/<name>", "emb/<name>/ids", "emb/<name>/<slot>" */
        uint32_t dim;               /* 1..1024 */
        uint64_t vocab;             /* a field's id is taken modulo vocab (hashing); 0: as it is */
        enum embedding_pooling pooling; /* a multi-valued field: sum (weighted by values) or mean */
        uint32_t n_fields;
        uint32_t fields[MODEL_MAX_FIELDS]; /* the data's field indices, each one slice of the input */
        double init_stddev;         /* rows start truncated-normal with this stddev (0: zeros) */
        uint64_t evict_after_steps; /* a row untouched this many global steps is dropped; 0: never */
        uint64_t max_rows;          /* rows of the table over all shards (each shard max_rows / n_ps); 0: no bound */
        uint64_t expected_rows;     /* psfleet plan's row count of a table without max_rows; 0: unknown */
        uint32_t admit_after;       /* an id gets a row once pulled this many times; 0, 1: at once */
        enum sparse_evict_policy evict_policy;
        bool disk_tier;             /* rows past the shard's bound move to the psd's disk (ps.disk_tier_dir) */
        char initializer[128];      /* model.onnx: the initializer a Gather looks this table's rows up in
                                     * (cut out of the graph: the rows come from the ps); "" otherwise */
        const float *init_rows;     /* model.onnx: that initializer's values, (n_init_rows, dim), owned by
                                     * the job config (copies of the spec share them); NULL otherwise */
        uint64_t n_init_rows;
};

struct graph; /* graph.h: the model of model.onnx */

/* What a graph model's inputs are fed (model.inputs), in the order of the model's flat input: the data's
 * input (the image, or a record's dense features) first when the graph reads it, then each table's
 * fields' rows, tables in order, as the sparse front lays them out (ctr.h). */
enum model_feed_kind { FEED_DATA, FEED_TABLE };
#define MODEL_MAX_FEEDS (1 + MODEL_MAX_EMBEDDINGS)
struct model_feed {
        enum model_feed_kind kind;
        uint32_t table;             /* FEED_TABLE: index into emb[] */
        int32_t tensor;             /* the graph's GT_INPUT */
        uint32_t count;             /* floats per example */
};

struct model_spec {
        uint32_t input[3];    /* (C, H, W); a flat input of N features is (1, 1, N) */
        uint32_t n_layers;
        struct layer_spec layers[MODEL_MAX_LAYERS];
        uint64_t seed;        /* initializers' seed (embedding rows: with the id) */
        enum model_head head; /* the loss over the last dense layer's outputs */
        enum graph_init { GRAPH_INIT_FILE, GRAPH_INIT_GLOROT } init; /* model.init: a graph's initial values */
        uint32_t n_embeddings;
        struct embedding_spec emb[MODEL_MAX_EMBEDDINGS];
        /* With embeddings, input is (1, 1, N): N dense features of each record (0 allowed), and the
         * dense layers' input is those N followed by each table's fields' pooled rows, in order
         * (model_spec_dense_input). */

        /* model.onnx: the graph is the model and n_layers is 0. The graph (finalized, the tables' lookups
         * cut out, its loss the output the head reads) is owned by the job config that loaded it;
         * copies of the spec share it. */
        char *onnx_path;
        struct graph *graph;
        uint8_t onnx_sha256[32];    /* of the file: part of the job's fingerprint */
        uint32_t n_feeds;
        struct model_feed feeds[MODEL_MAX_FEEDS];
};

/* Floats per example the first dense layer reads: C*H*W, plus every embedding field's dim. */
uint32_t model_spec_dense_input(const struct model_spec *spec);

#define MODEL_MAX_VARS (2 * MODEL_MAX_LAYERS)
#define MODEL_VAR_NAME 128

/* A variable as model_new() lays it out (see model.h): a view into one parameter block. */
struct model_spec_var {
        char name[MODEL_VAR_NAME];  /* "dense<i>/kernel", "conv<i>/bias", ... */
        uint32_t rows, cols;        /* a bias is (1, units) */
        size_t offset;              /* floats into the parameter block */
        uint32_t layer;             /* index into spec->layers */
        bool moving;                /* a moving average (a graph's BatchNormalization statistic): its
                                     * "gradient" is what to subtract, applied as v -= g, no optimizer */
};

/* The variables of the model spec describes, in the model's order, into vars (MODEL_MAX_VARS room);
 * *n_params_ret (nullable) gets the floats of a whole block. Returns the number of variables, or
 * -EINVAL for a spec model_new() refuses (no detail: config validation owns the messages). */
int model_spec_vars(const struct model_spec *spec, struct model_spec_var *vars, size_t *n_params_ret);
