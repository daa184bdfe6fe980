/* The model's state, shared by model.c (building it, its memory, row blocks, initial values) and
 * model_pass.c (the passes: transfers, forward, backward, evaluation). Not for other files: model.h is
 * the interface. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "model.h"

#define MAX_VARS MODEL_MAX_VARS

struct layer {
        struct layer_spec spec;
        uint32_t c, h, w;       /* input shape of one example (C, H, W) */
        uint32_t oc, oh, ow;    /* output shape */
        uint32_t in_n, out_n;   /* c*h*w, oc*oh*ow */
        uint32_t first_var, n_vars;
        float *buf;             /* (max_batch, out_n) owned output buffer, or NULL when aliasing */
        bool alias_input;       /* output is the input buffer (flatten; in-place activation) */
        float *out;             /* this pass's output: buf, or the input when aliasing */
};

struct model {
        struct backend *be;
        bool host;               /* backend memory is host memory */
        uint32_t max_batch;
        uint32_t n_layers;
        struct layer layers[MODEL_MAX_LAYERS];
        uint32_t in_n, classes;
        int first_param_layer;   /* -1: no parameters */
        enum model_head head;

        uint32_t n_vars;
        struct model_var vars[MAX_VARS];
        char names[MAX_VARS][MODEL_VAR_NAME];
        size_t n_params;
        /* Row blocks of each variable: n_blocks[v] blocks, block b is rows [rb[v][b], rb[v][b + 1]).
         * rb[v] points at whole[v] = {0, rows} when unblocked, else at blk[v] (owned, n_blocks + 1). */
        uint32_t n_blocks[MAX_VARS];
        const uint32_t *rb[MAX_VARS];
        uint32_t whole[MAX_VARS][2];
        uint32_t *blk[MAX_VARS];

        float *params;           /* (n_params) device */
        float *grads;            /* (n_params) device */
        float *params_host;      /* == params on host-memory backends */
        float *grads_host;
        bool ext_host;           /* the host blocks are the caller's (model_use_host_blocks) */
        bool pinned[2];          /* params_host, grads_host page-locked by the backend (host_pin) */

        float *x_dev;            /* (max_batch, in_n) device copy of the input; NULL on host backends */
        uint8_t *labels;         /* (max_batch) device: softmax's class indices */
        float *yf;               /* (max_batch) device: the single-output heads' labels */
        float *lab_host;         /* (max_batch) host: labels converted for the head (softmax: as uint8) */
        float *probs;            /* (max_batch, classes) */
        const float *outputs;    /* the last forward's outputs (device): probs, or mse's predictions */
        float *out_host;         /* (max_batch, classes) host copy of them; device backends only */
        bool want_dx;            /* backward computes the input gradient */
        const float *dx;         /* the last backward's input gradient (device), or NULL */
        float *dx_host;          /* (max_batch, in_n) host copy of it; device backends only */
        float *gbuf[2];          /* (max_batch, max_n) gradient ping-pong */
        float *col;              /* conv im2col workspace, or NULL */

        const float *input;      /* this pass's input (device) */
        uint32_t B;              /* batch of the last forward; 0: none */

        /* The graph engine (model_graph.c) runs the passes between the input and the head: a graph model's
         * (spec->graph; layers are none), or on a host-memory backend a layer list's (own_g). */
        struct graph_exec *gx;
        const struct graph *g;
        struct graph *own_g;     /* a layer list's graph (graph_from_spec), owned: g points at it; the
                                  * layers keep their shapes (describe, initial values), not their buffers */
        int32_t *tensor_var;     /* (g->n_tensors) the variable a parameter tensor is, -1 for the others */
        uint32_t n_feeds;
        struct model_feed feeds[MODEL_MAX_FEEDS];
        bool eval;               /* passes in inference mode (model_set_training) */
        uint64_t seed, n_fwd;    /* Dropout's masks: from model.seed and the count of training forwards */
        enum graph_init init;    /* model.init */
};

/* The hooks of one pass: per layer (the graph: all variables as one layer) or per (var, block). */
struct hooks {
        model_layer_cb layer;
        model_block_cb block;
        void *ud;
};

/* model_graph.c: a graph model's variables and exec (from model_new, before the blocks exist; model.c
 * binds the exec to the blocks with graph_exec_use_blocks once they do, and when they move); its forward from the
 * model's flat input to the output the head reads; its backward from dy, the head's gradient. */
int model_graph_plan(struct model *m, const struct model_spec *spec);
/* A layer list on the graph engine (after plan() laid out its layers and variables): -EINVAL where
 * graph_from_spec refuses the list. */
int model_graph_plan_layers(struct model *m, const struct model_spec *spec);
/* A layer list's graph with its input's gradient on (model_set_input_grad): the exec again, its row
 * blocks as they were, bound to the model's blocks. */
int model_graph_want_input_grad(struct model *m);
int model_graph_forward(struct model *m, const float *x, uint32_t B, const struct hooks *h, float **out);
int model_graph_backward(struct model *m, const float *dy, const struct hooks *h);
void model_graph_free(struct model *m);
/* Splits var's tensor into row blocks in the exec (graph_exec_set_blocks): 0, or -EOPNOTSUPP where the
 * graph cannot (not a host exec, not a Gemm's B alone). */
int model_graph_set_blocks(struct model *m, uint32_t var, uint32_t n_blocks, const uint32_t *row_begin);
void model_graph_init_params(struct model *m, uint64_t seed);
void model_graph_describe(const struct model *m, FILE *f);
