/* The model as the job file describes it: an input shape and a list of layers. Shared by the config
 * parser (which fills it) and the model library (which builds from it); model_spec_vars() derives its
 * variables from it alone, so a node that only stores them (psd) needs no backend. */
#pragma once
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

struct model_spec {
        uint32_t input[3];    /* (C, H, W); a flat input of N features is (1, 1, N) */
        uint32_t n_layers;
        struct layer_spec layers[MODEL_MAX_LAYERS];
        uint64_t seed;        /* initializers' seed */
        /* The loss is always softmax cross-entropy over the last layer's outputs. */
};

#define MODEL_MAX_VARS (2 * MODEL_MAX_LAYERS)
#define MODEL_VAR_NAME 32

/* A variable as model_new() lays it out (see model.h): a view into one parameter block. */
struct model_spec_var {
        char name[MODEL_VAR_NAME];  /* "dense<i>/kernel", "conv<i>/bias", ... */
        uint32_t rows, cols;        /* a bias is (1, units) */
        size_t offset;              /* floats into the parameter block */
        uint32_t layer;             /* index into spec->layers */
};

/* The variables of the model spec describes, in the model's order, into vars (MODEL_MAX_VARS room);
 * *n_params_ret (nullable) gets the floats of a whole block. Returns the number of variables, or
 * -EINVAL for a spec model_new() refuses (no detail: config validation owns the messages). */
int model_spec_vars(const struct model_spec *spec, struct model_spec_var *vars, size_t *n_params_ret);
