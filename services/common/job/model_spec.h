/* The model as the job file describes it: an input shape and a list of layers. Shared by the config
 * parser (which fills it) and the model library (which builds from it). Plain data, no functions. */
#pragma once
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

struct model_spec {
        uint32_t input[3];    /* (C, H, W); a flat input of N features is (1, 1, N) */
        uint32_t n_layers;
        struct layer_spec layers[MODEL_MAX_LAYERS];
        uint64_t seed;        /* initializers' seed */
        /* The loss is always softmax cross-entropy over the last layer's outputs. */
};
