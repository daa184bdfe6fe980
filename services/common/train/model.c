/* The model: a list of layers over one parameter block and one gradient block, run on a backend.
 * Activation buffers are allocated once for max_batch. Elementwise activations run in place when the
 * buffer they read is one whose producer's backward doesn't need it (dense, conv2d, maxpool2d
 * outputs), so a dense+relu pair costs one buffer. Backward ping-pongs between two gradient buffers
 * and stops at the first layer with parameters, unless the input gradient is asked for
 * (model_set_input_grad: a sparse front turns it into embedding rows' gradients).
 *
 * A dense kernel may be split into row blocks (model_set_var_blocks) so a worker can overlap a large
 * variable's transfer with compute. Every path runs the same arithmetic for the same blocks, whichever
 * hooks are passed: forward is y = sum_b x[:, rows_b] @ W[rows_b, :] (one gemm per block, K = block
 * rows, accumulating with beta = 1 after the first), backward dW[rows_b, :] = x[:, rows_b]^T @ dy per
 * block. An unblocked kernel is one block covering all rows: exactly the single-gemm code. */
#include "model.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

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
};

uint32_t model_n_vars(const struct model *m)
{
        return m->n_vars;
}

const struct model_var *model_var(const struct model *m, uint32_t i)
{
        assert(i < m->n_vars);
        return &m->vars[i];
}

int model_find_var(const struct model *m, const char *name)
{
        for (uint32_t i = 0; i < m->n_vars; i++)
                if (strcmp(m->vars[i].name, name) == 0)
                        return (int)i;
        return -ENOENT;
}

size_t model_n_params(const struct model *m)
{
        return m->n_params;
}

uint32_t model_max_batch(const struct model *m)
{
        return m->max_batch;
}

uint32_t model_input_size(const struct model *m)
{
        return m->in_n;
}

uint32_t model_n_classes(const struct model *m)
{
        return m->classes;
}

float *model_params(struct model *m)
{
        return m->params_host;
}

int model_params_check(struct model *m, char *why, size_t len)
{
        const float *p = m->params_host;
        for (uint32_t v = 0; v < m->n_vars; v++) {
                const struct model_var *mv = &m->vars[v];
                for (size_t i = 0, n = (size_t)mv->rows * mv->cols; i < n; i++) {
                        float x = p[mv->offset + i];
                        if (!(fabsf(x) <= MODEL_WEIGHT_LIMIT)) {   /* NaN fails the comparison too */
                                snprintf(why, len, "%s holds %g", mv->name, (double)x);
                                return -ERANGE;
                        }
                }
        }
        return 0;
}

float *model_grads(struct model *m)
{
        return m->grads_host;
}

/* The element-wise activations: forward y = f(x), and backward dy *= f'(y) in place (from the output). */
static int activation_fwd(struct backend *be, enum layer_type t, const void *x, void *y, size_t n)
{
        const struct backend_ops *op = be->ops;
        return t == LAYER_RELU ? op->relu_fwd(be, x, y, n)
               : t == LAYER_TANH ? op->tanh_fwd(be, x, y, n)
                                 : op->sigmoid_fwd(be, x, y, n);
}

static int activation_bwd(struct backend *be, enum layer_type t, const void *y, void *dy, size_t n)
{
        const struct backend_ops *op = be->ops;
        return t == LAYER_RELU ? op->relu_bwd(be, y, dy, dy, n)
               : t == LAYER_TANH ? op->tanh_bwd(be, y, dy, dy, n)
                                 : op->sigmoid_bwd(be, y, dy, dy, n);
}

/* Shapes, variables and buffer plan; no allocation. The variables (and the checks on the spec) come
 * from model_spec_vars(), the one derivation psd's layout uses too; this adds each layer's shapes. */
static int plan(struct model *m, const struct model_spec *spec)
{
        struct model_spec_var sv[MODEL_MAX_VARS];
        int nv = model_spec_vars(spec, sv, &m->n_params);
        if (nv < 0)
                return nv;
        for (uint32_t v = 0; v < (uint32_t)nv; v++) {
                memcpy(m->names[v], sv[v].name, sizeof(m->names[v]));
                m->vars[v] = (struct model_var){.name = m->names[v], .rows = sv[v].rows, .cols = sv[v].cols,
                                                .offset = sv[v].offset, .layer = sv[v].layer};
                m->n_blocks[v] = 1;
                m->whole[v][0] = 0;
                m->whole[v][1] = sv[v].rows;
                m->rb[v] = m->whole[v];
        }
        m->n_vars = (uint32_t)nv;
        uint64_t c = spec->input[0], h = spec->input[1], w = spec->input[2];
        if (spec->n_embeddings)  /* the dense features and the pooled rows, flat (model_spec.h) */
                c = 1, h = 1, w = model_spec_dense_input(spec);
        m->in_n = (uint32_t)(c * h * w);
        m->head = spec->head;
        m->n_layers = spec->n_layers;
        m->first_param_layer = -1;
        /* Which kind of layer produced the buffer the next layer reads (through aliases). */
        enum { SRC_INPUT, SRC_REUSABLE, SRC_KEEP } src = SRC_INPUT;
        uint32_t next_var = 0;
        for (uint32_t i = 0; i < spec->n_layers; i++) {
                struct layer *L = &m->layers[i];
                const struct layer_spec *ls = &spec->layers[i];
                L->spec = *ls;
                L->c = (uint32_t)c, L->h = (uint32_t)h, L->w = (uint32_t)w;
                L->in_n = (uint32_t)(c * h * w);
                L->first_var = next_var;
                while (next_var < m->n_vars && m->vars[next_var].layer == i)
                        next_var++;
                L->n_vars = next_var - L->first_var;
                switch (ls->type) {
                case LAYER_DENSE:
                        c = 1, h = 1, w = ls->units;
                        src = SRC_REUSABLE;
                        break;
                case LAYER_CONV2D:
                        c = ls->filters;
                        src = SRC_REUSABLE;
                        break;
                case LAYER_MAXPOOL2D:
                        h /= ls->pool, w /= ls->pool;
                        src = SRC_REUSABLE;
                        break;
                case LAYER_FLATTEN:
                        w = c * h * w, c = 1, h = 1;
                        L->alias_input = true;
                        break;
                default:   /* activations: model_spec_vars refused any other type */
                        L->alias_input = src == SRC_REUSABLE;
                        src = SRC_KEEP;
                        break;
                }
                if (L->n_vars && m->first_param_layer < 0)
                        m->first_param_layer = (int)i;
                L->oc = (uint32_t)c, L->oh = (uint32_t)h, L->ow = (uint32_t)w;
                L->out_n = (uint32_t)(c * h * w);
        }
        m->classes = m->layers[m->n_layers - 1].out_n;
        return 0;
}

int model_new(const struct model_spec *spec, struct backend *be, uint32_t max_batch, struct model **ret)
{
        if (!spec || !be || max_batch == 0)
                return -EINVAL;
        struct model *m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->be = be;
        m->host = backend_host_memory(be);
        m->max_batch = max_batch;
        int r = plan(m, spec);
        if (r < 0)
                goto fail;
        const struct backend_ops *op = be->ops;
        if ((m->head == HEAD_LOGISTIC && (!op->logistic_xent_fwd || !op->logistic_xent_bwd)) ||
            (m->head == HEAD_MSE && (!op->mse_fwd || !op->mse_bwd))) {
                r = -EOPNOTSUPP;
                goto fail;
        }

        r = -ENOMEM;
        size_t max_n = m->in_n, col_floats = 0;
        for (uint32_t i = 0; i < m->n_layers; i++) {
                struct layer *L = &m->layers[i];
                max_n = L->out_n > max_n ? L->out_n : max_n;
                if (L->spec.type == LAYER_CONV2D) {
                        size_t cf = backend_conv2d_col_floats(L->c, L->h, L->w, L->spec.kernel);
                        col_floats = cf > col_floats ? cf : col_floats;
                }
                if (!L->alias_input) {
                        L->buf = backend_alloc(be, sizeof(float) * max_batch * L->out_n);
                        if (!L->buf)
                                goto fail;
                }
        }
        m->params = backend_alloc(be, sizeof(float) * (m->n_params ? m->n_params : 1));
        m->grads = backend_alloc(be, sizeof(float) * (m->n_params ? m->n_params : 1));
        m->labels = backend_alloc(be, max_batch);
        m->yf = backend_alloc(be, sizeof(float) * max_batch);
        m->lab_host = malloc(sizeof(float) * max_batch);
        m->probs = backend_alloc(be, sizeof(float) * max_batch * m->classes);
        m->gbuf[0] = backend_alloc(be, sizeof(float) * max_batch * max_n);
        m->gbuf[1] = backend_alloc(be, sizeof(float) * max_batch * max_n);
        if (!m->params || !m->grads || !m->labels || !m->yf || !m->lab_host || !m->probs ||
            !m->gbuf[0] || !m->gbuf[1])
                goto fail;
        if (col_floats && !(m->col = backend_alloc(be, sizeof(float) * col_floats)))
                goto fail;
        if (m->host) {
                m->params_host = m->params;
                m->grads_host = m->grads;
        } else {
                m->params_host = calloc(m->n_params ? m->n_params : 1, sizeof(float));
                m->grads_host = calloc(m->n_params ? m->n_params : 1, sizeof(float));
                m->x_dev = backend_alloc(be, sizeof(float) * max_batch * m->in_n);
                m->out_host = malloc(sizeof(float) * max_batch * m->classes);
                if (!m->params_host || !m->grads_host || !m->x_dev || !m->out_host)
                        goto fail;
        }
        *ret = m;
        return 0;
fail:
        model_free(m);
        return r;
}

struct model *model_free(struct model *m)
{
        if (!m)
                return NULL;
        struct backend *be = m->be;
        for (uint32_t i = 0; i < m->n_layers; i++)
                backend_buf_free(be, m->layers[i].buf);
        if (!m->host && !m->ext_host) {
                free(m->params_host);
                free(m->grads_host);
        }
        if (!m->host || !m->ext_host) {
                backend_buf_free(be, m->params);
                backend_buf_free(be, m->grads);
        }
        backend_buf_free(be, m->x_dev);
        backend_buf_free(be, m->labels);
        backend_buf_free(be, m->yf);
        free(m->lab_host);
        free(m->out_host);
        free(m->dx_host);
        backend_buf_free(be, m->probs);
        backend_buf_free(be, m->gbuf[0]);
        backend_buf_free(be, m->gbuf[1]);
        backend_buf_free(be, m->col);
        for (uint32_t v = 0; v < m->n_vars; v++)
                free(m->blk[v]);
        free(m);
        return NULL;
}

int model_use_host_blocks(struct model *m, float *params, float *grads)
{
        size_t bytes = sizeof(float) * m->n_params;
        if (!params || !grads || m->ext_host || (uintptr_t)params % 64 || (uintptr_t)grads % 64 ||
            (params < grads ? (char *)params + bytes > (char *)grads : (char *)grads + bytes > (char *)params))
                return -EINVAL;
        memcpy(params, m->params_host, bytes);
        memcpy(grads, m->grads_host, bytes);
        if (m->host) {
                backend_buf_free(m->be, m->params);
                backend_buf_free(m->be, m->grads);
                m->params = params;
                m->grads = grads;
        } else {
                free(m->params_host);
                free(m->grads_host);
        }
        m->params_host = params;
        m->grads_host = grads;
        m->ext_host = true;
        return 0;
}

/* Vars [first, first + n) are contiguous: their first float and their count. */
static size_t vars_span(const struct model *m, uint32_t first, uint32_t n, size_t *count)
{
        const struct model_var *a = &m->vars[first], *z = &m->vars[first + n - 1];
        *count = z->offset + (size_t)z->rows * z->cols - a->offset;
        return a->offset;
}

/* Host -> device for vars [first, first + n). */
static int upload_vars(struct model *m, uint32_t first, uint32_t n)
{
        if (m->host || n == 0)
                return 0;
        size_t count, begin = vars_span(m, first, n, &count);
        return backend_upload(m->be, m->params + begin, m->params_host + begin, sizeof(float) * count);
}

static int download_grads(struct model *m, uint32_t first, uint32_t n)
{
        if (m->host || n == 0)
                return 0;
        size_t count, begin = vars_span(m, first, n, &count);
        return backend_download(m->be, m->grads_host + begin, m->grads + begin, sizeof(float) * count);
}

/* Rows [r0, r1) of var v as a float range of a block: *begin_ret and the count (rows are contiguous in
 * the row-major view). */
static size_t rows_span(const struct model *m, uint32_t v, uint32_t r0, uint32_t r1, size_t *begin_ret)
{
        const struct model_var *a = &m->vars[v];
        *begin_ret = a->offset + (size_t)r0 * a->cols;
        return (size_t)(r1 - r0) * a->cols;
}

/* Host -> device for rows [r0, r1) of var v. */
static int upload_rows(struct model *m, uint32_t v, uint32_t r0, uint32_t r1)
{
        size_t begin, n = rows_span(m, v, r0, r1, &begin);
        if (m->host || n == 0)
                return 0;
        return backend_upload(m->be, m->params + begin, m->params_host + begin, sizeof(float) * n);
}

/* Device -> host for the gradient of rows [r0, r1) of var v. */
static int download_grad_rows(struct model *m, uint32_t v, uint32_t r0, uint32_t r1)
{
        size_t begin, n = rows_span(m, v, r0, r1, &begin);
        if (m->host || n == 0)
                return 0;
        return backend_download(m->be, m->grads_host + begin, m->grads + begin, sizeof(float) * n);
}

int model_set_var_blocks(struct model *m, uint32_t var, uint32_t n_blocks, const uint32_t *row_begin)
{
        if (var >= m->n_vars || n_blocks == 0)
                return -EINVAL;
        const struct model_var *v = &m->vars[var];
        const struct layer *L = &m->layers[v->layer];
        if (L->spec.type != LAYER_DENSE || var != L->first_var)
                return -EOPNOTSUPP;
        if (n_blocks > v->rows || (n_blocks > 1 && !row_begin))
                return -EINVAL;
        if (row_begin) {
                if (row_begin[0] != 0)
                        return -EINVAL;
                for (uint32_t b = 1; b < n_blocks; b++)
                        if (row_begin[b] <= row_begin[b - 1] || row_begin[b] >= v->rows)
                                return -EINVAL;
        }
        uint32_t *a = NULL;
        if (n_blocks > 1) {
                if (!(a = malloc(sizeof(uint32_t) * (n_blocks + 1))))
                        return -ENOMEM;
                memcpy(a, row_begin, sizeof(uint32_t) * n_blocks);
                a[n_blocks] = v->rows;
        }
        free(m->blk[var]);
        m->blk[var] = a;
        m->rb[var] = a ? a : m->whole[var];
        m->n_blocks[var] = n_blocks;
        return 0;
}

uint32_t model_var_blocks(const struct model *m, uint32_t var, const uint32_t **row_begin_ret)
{
        assert(var < m->n_vars);
        if (row_begin_ret)
                *row_begin_ret = m->rb[var];
        return m->n_blocks[var];
}

int model_params_sync(struct model *m)
{
        return upload_vars(m, 0, m->n_vars);
}

/* The layer after `i` that isn't a flatten, or NULL. */
static const struct layer *next_real_layer(const struct model *m, uint32_t i)
{
        for (uint32_t j = i + 1; j < m->n_layers; j++)
                if (m->layers[j].spec.type != LAYER_FLATTEN)
                        return &m->layers[j];
        return NULL;
}

int model_init_params(struct model *m, uint64_t seed)
{
        float *p = m->params_host;
        for (uint32_t v = 0; v < m->n_vars; v++) {
                const struct model_var *var = &m->vars[v];
                const struct layer *L = &m->layers[var->layer];
                float *w = p + var->offset;
                size_t n = (size_t)var->rows * var->cols;
                if (v != L->first_var) { /* bias */
                        memset(w, 0, sizeof(float) * n);
                        continue;
                }
                double fan_in, fan_out;
                if (L->spec.type == LAYER_DENSE) {
                        fan_in = var->rows;
                        fan_out = var->cols;
                } else { /* conv2d: (F, C*k*k) */
                        double kk = (double)L->spec.kernel * L->spec.kernel;
                        fan_in = var->cols;
                        fan_out = var->rows * kk;
                }
                enum init_kind kind = L->spec.init;
                if (kind == INIT_DEFAULT) {
                        const struct layer *nx = next_real_layer(m, var->layer);
                        kind = nx && nx->spec.type == LAYER_RELU ? INIT_HE_NORMAL : INIT_GLOROT_UNIFORM;
                }
                struct rng r;
                rng_init(&r, seed, v);
                switch (kind) {
                case INIT_ZEROS:
                        memset(w, 0, sizeof(float) * n);
                        break;
                case INIT_HE_NORMAL: {
                        /* TF's truncated normal at 2 sigma, stddev corrected for the truncation */
                        double sd = sqrt(2.0 / fan_in) / 0.87962566103423978;
                        for (size_t i = 0; i < n; i++) {
                                double z;
                                do
                                        z = rng_normal(&r);
                                while (fabs(z) > 2.0);
                                w[i] = (float)(z * sd);
                        }
                        break;
                }
                case INIT_GLOROT_UNIFORM:
                default: {
                        float lim = (float)sqrt(6.0 / (fan_in + fan_out));
                        for (size_t i = 0; i < n; i++)
                                w[i] = rng_uniform_f(&r, -lim, lim);
                        break;
                }
                }
        }
        return model_params_sync(m);
}

/* Per-layer or per-block callbacks (at most one kind set) and their user data. */
struct hooks {
        model_layer_cb layer;
        model_block_cb block;
        void *ud;
};

/* Before var v's rows [rb[b], rb[b+1]) are read: the block hook, then that upload. In layer-hook mode
 * the whole layer was uploaded after the layer hook already. */
static int before_block(struct model *m, const struct hooks *h, uint32_t v, uint32_t b)
{
        if (!h->block)
                return 0;
        int r = h->block(h->ud, v, b);
        if (r != 0)
                return r;
        return upload_rows(m, v, m->rb[v][b], m->rb[v][b + 1]);
}

/* Rows [rb[b], rb[b+1]) of var v's gradient are final: that download, then the block hook. */
static int after_block(struct model *m, const struct hooks *h, uint32_t v, uint32_t b)
{
        if (!h->block)
                return 0;
        int r = download_grad_rows(m, v, m->rb[v][b], m->rb[v][b + 1]);
        if (r < 0)
                return r;
        return h->block(h->ud, v, b);
}

/* The batch's labels as the head reads them, uploaded: class indices for softmax (a float label must be
 * one), floats for the single-output heads (logistic: in [0, 1]). One of l8, lf is set. */
static int put_labels(struct model *m, const uint8_t *l8, const float *lf, uint32_t B)
{
        if (m->head == HEAD_SOFTMAX) {
                uint8_t *c = (uint8_t *)m->lab_host;
                for (uint32_t b = 0; !l8 && b < B; b++) {
                        if (!(lf[b] >= 0 && lf[b] < (float)m->classes && lf[b] == floorf(lf[b])))
                                return -EINVAL;
                        c[b] = (uint8_t)lf[b];
                }
                l8 = l8 ? l8 : c;
                for (uint32_t b = 0; b < B; b++)
                        if (l8[b] >= m->classes)
                                return -EINVAL;
                return backend_upload(m->be, m->labels, l8, B);
        }
        for (uint32_t b = 0; !lf && b < B; b++)
                m->lab_host[b] = l8[b];
        lf = lf ? lf : m->lab_host;
        for (uint32_t b = 0; b < B; b++)
                if (!isfinite(lf[b]) || (m->head == HEAD_LOGISTIC && !(lf[b] >= 0 && lf[b] <= 1)))
                        return -EINVAL;
        return backend_upload(m->be, m->yf, lf, sizeof(float) * B);
}

/* The head's loss over the last layer's output `in`; sets the pass's outputs. */
static int head_fwd(struct model *m, const float *in, uint32_t B, float *loss, uint32_t *correct_ret)
{
        struct backend *be = m->be;
        const struct backend_ops *op = be->ops;
        int r;
        m->outputs = m->head == HEAD_MSE ? in : m->probs;
        if (m->head == HEAD_LOGISTIC)
                return op->logistic_xent_fwd(be, in, m->yf, B, m->probs, loss, correct_ret);
        if (m->head == HEAD_MSE && correct_ret)
                *correct_ret = 0;   /* "correct" means nothing for a regression */
        if (m->head == HEAD_MSE)
                return op->mse_fwd(be, in, m->yf, B, loss);
        if ((r = op->softmax_xent_fwd(be, in, m->labels, B, m->classes, m->probs, loss)) < 0)
                return r;
        return correct_ret ? op->correct_count(be, in, m->labels, B, m->classes, correct_ret) : 0;
}

static int head_bwd(struct model *m, uint32_t B, float *dy)
{
        struct backend *be = m->be;
        const struct backend_ops *op = be->ops;
        return m->head == HEAD_LOGISTIC ? op->logistic_xent_bwd(be, m->probs, m->yf, B, dy)
               : m->head == HEAD_MSE    ? op->mse_bwd(be, m->outputs, m->yf, B, dy)
                                        : op->softmax_xent_bwd(be, m->probs, m->labels, B, m->classes, dy);
}

static int forward(struct model *m, const float *x, const uint8_t *labels, const float *yf, uint32_t B,
                   float *loss_ret, uint32_t *correct_ret, const struct hooks *h)
{
        struct backend *be = m->be;
        const struct backend_ops *op = be->ops;
        int r;
        m->B = 0;
        m->dx = NULL;
        if (B == 0 || B > m->max_batch || !x || (!labels && !yf))
                return -EINVAL;
        if ((r = put_labels(m, labels, yf, B)) < 0)
                return r;
        if (m->host) {
                m->input = x;
        } else {
                if ((r = backend_upload(be, m->x_dev, x, sizeof(float) * B * m->in_n)) < 0)
                        return r;
                m->input = m->x_dev;
        }

        /* The input is only ever read: the cast lets a flatten alias it. */
        float *in = (float *)m->input;
        for (uint32_t i = 0; i < m->n_layers; i++) {
                struct layer *L = &m->layers[i];
                float *out = L->alias_input ? in : L->buf;
                size_t n = (size_t)B * L->out_n;
                if (L->n_vars && !h->block) {
                        if (h->layer && (r = h->layer(h->ud, L->first_var, L->n_vars)) != 0)
                                return r;
                        if ((r = upload_vars(m, L->first_var, L->n_vars)) < 0)
                                return r;
                }
                const float *wt = L->n_vars ? m->params + m->vars[L->first_var].offset : NULL;
                const float *bs = L->n_vars ? m->params + m->vars[L->first_var + 1].offset : NULL;
                switch (L->spec.type) {
                case LAYER_DENSE: {
                        /* y (B, units) = sum_b x[:, rows_b] (B, k) @ W[rows_b, :] (k, units) + bias */
                        uint32_t kv = L->first_var;
                        const uint32_t *rb = m->rb[kv];
                        r = 0;
                        for (uint32_t b = 0; r == 0 && b < m->n_blocks[kv]; b++) {
                                if ((r = before_block(m, h, kv, b)) != 0)
                                        return r;
                                r = op->gemm(be, false, false, B, L->out_n, rb[b + 1] - rb[b], 1.0f, in + rb[b],
                                             L->in_n, wt + (size_t)rb[b] * L->out_n, L->out_n,
                                             b ? 1.0f : 0.0f, out, L->out_n);
                        }
                        if (r == 0 && (r = before_block(m, h, kv + 1, 0)) != 0)
                                return r;
                        if (r == 0)
                                r = op->add_bias_rows(be, out, bs, B, L->out_n);
                        break;
                }
                case LAYER_CONV2D:
                        if ((r = before_block(m, h, L->first_var, 0)) != 0 ||
                            (r = before_block(m, h, L->first_var + 1, 0)) != 0)
                                return r;
                        r = op->conv2d_fwd(be, in, wt, bs, out, B, L->c, L->h, L->w, L->oc, L->spec.kernel,
                                           m->col);
                        break;
                case LAYER_MAXPOOL2D:
                        r = op->maxpool2d_fwd(be, in, out, B, L->c, L->h, L->w, L->spec.pool);
                        break;
                case LAYER_RELU:
                case LAYER_TANH:
                case LAYER_SIGMOID:
                        r = activation_fwd(be, L->spec.type, in, out, n);
                        break;
                case LAYER_FLATTEN:
                        r = 0;
                        break;
                }
                if (r < 0)
                        return r;
                L->out = out;
                in = out;
        }
        float loss;
        if ((r = head_fwd(m, in, B, &loss, correct_ret)) < 0)
                return r;
        m->B = B;
        if (loss_ret)
                *loss_ret = loss;
        return 0;
}

int model_forward_hooked(struct model *m, const float *x, const uint8_t *labels, uint32_t B,
                         float *loss_ret, uint32_t *correct_ret, model_layer_cb before_layer, void *ud)
{
        struct hooks h = {.layer = before_layer, .ud = ud};
        return forward(m, x, labels, NULL, B, loss_ret, correct_ret, &h);
}

int model_forward_blocks(struct model *m, const float *x, const uint8_t *labels, uint32_t B,
                         float *loss_ret, uint32_t *correct_ret, model_block_cb before, void *ud)
{
        struct hooks h = {.block = before, .ud = ud};
        return forward(m, x, labels, NULL, B, loss_ret, correct_ret, &h);
}

int model_forward_f_blocks(struct model *m, const float *x, const float *y, uint32_t B, float *loss_ret,
                           uint32_t *correct_ret, model_block_cb before, void *ud)
{
        struct hooks h = {.block = before, .ud = ud};
        return y ? forward(m, x, NULL, y, B, loss_ret, correct_ret, &h) : -EINVAL;
}

int model_forward_f(struct model *m, const float *x, const float *y, uint32_t B, float *loss_ret,
                    uint32_t *correct_ret)
{
        return model_forward_f_blocks(m, x, y, B, loss_ret, correct_ret, NULL, NULL);
}

const float *model_outputs(struct model *m)
{
        if (m->B == 0)
                return NULL;
        if (m->host)
                return m->outputs;
        if (backend_download(m->be, m->out_host, m->outputs, sizeof(float) * m->B * m->classes) < 0)
                return NULL;
        return m->out_host;
}

int model_set_input_grad(struct model *m, bool on)
{
        if (on && !m->host && !m->dx_host && !(m->dx_host = malloc(sizeof(float) * m->max_batch * m->in_n)))
                return -ENOMEM;
        m->want_dx = on;
        return 0;
}

const float *model_input_grad(const struct model *m)
{
        return !m->dx ? NULL : m->host ? m->dx : m->dx_host;
}

int model_forward(struct model *m, const float *x, const uint8_t *labels, uint32_t B, float *loss_ret,
                  uint32_t *correct_ret)
{
        return model_forward_hooked(m, x, labels, B, loss_ret, correct_ret, NULL, NULL);
}

static int backward(struct model *m, const struct hooks *h)
{
        struct backend *be = m->be;
        const struct backend_ops *op = be->ops;
        uint32_t B = m->B;
        int r;
        m->dx = NULL;
        if (B == 0)
                return -EINVAL;
        if (m->first_param_layer < 0)
                return 0;
        int cur = 0;
        if ((r = head_bwd(m, B, m->gbuf[cur])) < 0)
                return r;
        for (int i = (int)m->n_layers - 1; i >= (m->want_dx ? 0 : m->first_param_layer); i--) {
                struct layer *L = &m->layers[i];
                const float *in = i == 0 ? m->input : m->layers[i - 1].out;
                float *dy = m->gbuf[cur], *dx = m->gbuf[cur ^ 1];
                bool need_dx = i > m->first_param_layer || m->want_dx;
                size_t n = (size_t)B * L->out_n;
                switch (L->spec.type) {
                case LAYER_DENSE: {
                        uint32_t kv = L->first_var;
                        const uint32_t *rb = m->rb[kv];
                        float *dw = m->grads + m->vars[kv].offset;
                        float *db = m->grads + m->vars[kv + 1].offset;
                        /* The bias first: it is ready at once and its push can start earliest. */
                        if ((r = op->bias_grad(be, dy, db, B, L->out_n)) < 0)
                                return r;
                        if ((r = after_block(m, h, kv + 1, 0)) != 0)
                                return r;
                        /* The input gradient before the kernel's blocks: once a block's callback runs,
                         * this pass reads the kernel no more, so the caller may overwrite it. */
                        if (need_dx) {
                                const float *wt = m->params + m->vars[L->first_var].offset;
                                /* dx (B, in) = dy (B, units) @ W^T (units, in) */
                                if ((r = op->gemm(be, false, true, B, L->in_n, L->out_n, 1.0f, dy, L->out_n, wt,
                                                  L->out_n, 0.0f, dx, L->in_n)) < 0)
                                        return r;
                                cur ^= 1;
                        }
                        /* dW[rows_b, :] (k, units) = x[:, rows_b]^T (k, B) @ dy (B, units) */
                        for (uint32_t b = 0; b < m->n_blocks[kv]; b++) {
                                r = op->gemm(be, true, false, rb[b + 1] - rb[b], L->out_n, B, 1.0f, in + rb[b],
                                             L->in_n, dy, L->out_n, 0.0f, dw + (size_t)rb[b] * L->out_n,
                                             L->out_n);
                                if (r < 0 || (r = after_block(m, h, kv, b)) != 0)
                                        return r;
                        }
                        break;
                }
                case LAYER_CONV2D: {
                        float *dw = m->grads + m->vars[L->first_var].offset;
                        float *db = m->grads + m->vars[L->first_var + 1].offset;
                        const float *wt = m->params + m->vars[L->first_var].offset;
                        r = op->conv2d_bwd(be, in, wt, dy, dw, db, need_dx ? dx : NULL, B, L->c, L->h, L->w,
                                           L->oc, L->spec.kernel, m->col);
                        if (need_dx)
                                cur ^= 1;
                        if (r < 0 || (r = after_block(m, h, L->first_var + 1, 0)) != 0 ||
                            (r = after_block(m, h, L->first_var, 0)) != 0)
                                return r;
                        break;
                }
                case LAYER_MAXPOOL2D:
                        r = op->maxpool2d_bwd(be, in, dy, dx, B, L->c, L->h, L->w, L->spec.pool);
                        cur ^= 1;
                        break;
                case LAYER_RELU:
                case LAYER_TANH:
                case LAYER_SIGMOID:
                        r = activation_bwd(be, L->spec.type, L->out, dy, n);
                        break;
                case LAYER_FLATTEN:
                        r = 0;
                        break;
                }
                if (r < 0)
                        return r;
                if (L->n_vars && !h->block) {
                        if ((r = download_grads(m, L->first_var, L->n_vars)) < 0)
                                return r;
                        if (h->layer && (r = h->layer(h->ud, L->first_var, L->n_vars)) != 0)
                                return r;
                }
        }
        if (m->want_dx) {
                if (!m->host && (r = backend_download(be, m->dx_host, m->gbuf[cur], sizeof(float) * B * m->in_n)) < 0)
                        return r;
                m->dx = m->gbuf[cur];
        }
        return 0;
}

int model_backward(struct model *m, model_layer_cb cb, void *ud)
{
        struct hooks h = {.layer = cb, .ud = ud};
        return backward(m, &h);
}

int model_backward_blocks(struct model *m, model_block_cb after, void *ud)
{
        struct hooks h = {.block = after, .ud = ud};
        return backward(m, &h);
}

int model_evaluate(struct model *m, const float *x, const uint8_t *y, uint32_t n, float *loss_ret,
                   float *accuracy_ret)
{
        if (n == 0)
                return -EINVAL;
        double loss = 0.0;
        uint64_t correct = 0;
        for (uint32_t i = 0; i < n; i += m->max_batch) {
                uint32_t B = n - i < m->max_batch ? n - i : m->max_batch;
                float l;
                uint32_t c;
                int r = model_forward(m, x + (size_t)i * m->in_n, y + i, B, &l, &c);
                if (r < 0)
                        return r;
                loss += (double)l * B;
                correct += c;
        }
        m->B = 0; /* the chunks' state is not a pass to run backward over */
        if (loss_ret)
                *loss_ret = (float)(loss / n);
        if (accuracy_ret)
                *accuracy_ret = (float)((double)correct / n);
        return 0;
}

static const char *const layer_type_names[] = {
        [LAYER_DENSE] = "dense",   [LAYER_RELU] = "relu",           [LAYER_TANH] = "tanh",
        [LAYER_SIGMOID] = "sigmoid", [LAYER_CONV2D] = "conv2d", [LAYER_MAXPOOL2D] = "maxpool2d",
        [LAYER_FLATTEN] = "flatten",
};

void model_describe(const struct model *m, FILE *f)
{
        fprintf(f, "input (%u, %u, %u)\n", m->layers[0].c, m->layers[0].h, m->layers[0].w);
        for (uint32_t i = 0; i < m->n_layers; i++) {
                const struct layer *L = &m->layers[i];
                size_t np = 0;
                fprintf(f, "%2u %-9s -> (%u, %u, %u)", i, layer_type_names[L->spec.type], L->oc, L->oh, L->ow);
                for (uint32_t v = L->first_var; v < L->first_var + L->n_vars; v++) {
                        const struct model_var *var = &m->vars[v];
                        fprintf(f, "%s %s (%u, %u)", v == L->first_var ? "" : ",", var->name, var->rows,
                                var->cols);
                        np += (size_t)var->rows * var->cols;
                }
                if (L->n_vars)
                        fprintf(f, "  %zu params", np);
                fputc('\n', f);
        }
        static const char *const heads[] = {[HEAD_SOFTMAX] = "softmax cross-entropy over %u classes",
                                            [HEAD_LOGISTIC] = "sigmoid cross-entropy over %u output",
                                            [HEAD_MSE] = "mean squared error over %u output"};
        fprintf(f, heads[m->head], m->classes);
        fprintf(f, "; %zu parameters (%zu bytes)\n", m->n_params, m->n_params * sizeof(float));
}
