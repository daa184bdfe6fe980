/* The model's passes (model.h): the transfers between the host blocks and the backend's, forward and
 * backward over the layers with their per-layer or per-block hooks, the head's loss, evaluation. The
 * arithmetic of a row-blocked kernel is model.c's opening comment's. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "model-internal.h"

/* The layers without parameters that keep their input's shape: the element-wise activations, forward
 * y = f(x) and backward dy *= f'(y) in place (from the output); and flatten, a view of its input with
 * nothing to compute either way. */
static int elementwise_fwd(struct backend *be, enum layer_type t, const void *x, void *y, size_t n)
{
        const struct backend_ops *op = be->ops;
        return t == LAYER_FLATTEN ? 0
               : t == LAYER_RELU  ? op->relu_fwd(be, x, y, n)
               : t == LAYER_TANH  ? op->tanh_fwd(be, x, y, n)
                                  : op->sigmoid_fwd(be, x, y, n);
}

static int elementwise_bwd(struct backend *be, enum layer_type t, const void *y, void *dy, size_t n)
{
        const struct backend_ops *op = be->ops;
        return t == LAYER_FLATTEN ? 0
               : t == LAYER_RELU  ? op->relu_bwd(be, y, dy, dy, n)
               : t == LAYER_TANH  ? op->tanh_bwd(be, y, dy, dy, n)
                                  : op->sigmoid_bwd(be, y, dy, dy, n);
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

int model_params_sync(struct model *m)
{
        return upload_vars(m, 0, m->n_vars);
}

/* Per-layer or per-block callbacks (at most one kind set) and their user data. */

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
        if (m->host || m->gx) { /* a graph uploads its own inputs */
                m->input = x;
        } else {
                if ((r = backend_upload(be, m->x_dev, x, sizeof(float) * B * m->in_n)) < 0)
                        return r;
                m->input = m->x_dev;
        }

        /* The input is only ever read: the cast lets a flatten alias it. */
        float *in = (float *)m->input;
        if (m->gx && (r = model_graph_forward(m, x, B, h, &in)) != 0)
                return r;
        for (uint32_t i = 0; !m->gx && i < m->n_layers; i++) {
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
                case LAYER_FLATTEN:
                        r = elementwise_fwd(be, L->spec.type, in, out, n);
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
        int r;
        if (on && m->own_g && (r = model_graph_want_input_grad(m)) < 0)
                return r;
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
        if (m->gx) {
                if ((r = head_bwd(m, B, m->gbuf[0])) < 0)
                        return r;
                return model_graph_backward(m, m->gbuf[0], h);
        }
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
                case LAYER_FLATTEN:
                        r = elementwise_bwd(be, L->spec.type, L->out, dy, n);
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
        bool was_eval = m->eval;
        m->eval = true;
        for (uint32_t i = 0; i < n; i += m->max_batch) {
                uint32_t B = n - i < m->max_batch ? n - i : m->max_batch;
                float l;
                uint32_t c;
                int r = model_forward(m, x + (size_t)i * m->in_n, y + i, B, &l, &c);
                if (r < 0) {
                        m->eval = was_eval;
                        return r;
                }
                loss += (double)l * B;
                correct += c;
        }
        m->eval = was_eval;
        m->B = 0; /* the chunks' state is not a pass to run backward over */
        if (loss_ret)
                *loss_ret = (float)(loss / n);
        if (accuracy_ret)
                *accuracy_ret = (float)((double)correct / n);
        return 0;
}
