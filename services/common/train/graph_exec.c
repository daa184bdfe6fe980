/* Running a graph: see graph.h. Apart from building (graph.c) so that what only builds and checks
 * graphs (the ONNX loader, the job file's model.onnx, which psd needs for a graph model's variables)
 * links no matrix library: the kernels' one sgemm comes through gk_sgemm, which graph_exec_new sets.
 *
 * Where the buffers live: on the host (be NULL) they are calloc'd and the CPU kernels run on them, as
 * ever; on a device (graph_exec_new_on with a backend without host memory) every one is the backend's,
 * and what crosses to the host (inputs, graph_*_host, the moving averages' statistics) goes through one
 * staging buffer of the exec's, sized once for the largest transfer. */
#include "backend.h"
#include "graph-internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct graph_exec {
        const struct graph *g;
        struct backend *be;              /* the device's backend; NULL: host memory */
        const struct graph_kernels *kt;  /* the kernels that compute it */
        uint32_t max_batch, B;
        float *params, *grads;           /* (n_params) each */
        bool ext_blocks;                 /* params and grads are the caller's (graph_exec_use_blocks) */
        void **val;                      /* (n_tensors) each tensor's buffer */
        float **grad;                    /* (n_tensors) its gradient, or NULL where none flows */
        float **state;                   /* (n_nodes) */
        bool *set;                       /* (n_tensors) its gradient is set whole by its one consumer
                                          * (graph_op_bwd_sets), never zeroed */
        bool *live;                      /* (n_tensors + n_nodes) this backward: the tensors on a path to
                                          * the one differentiated, then the nodes that are */
        float *scratch;
        void *host;                      /* device only: (host_bytes) staging for transfers */
        size_t host_bytes;
        int32_t *first;                  /* (n_tensors) the first node that reads each tensor, or -1 */
        bool gathers;                    /* a node is a Gather: kt->forward_done collects what it flagged */
        bool fed;                        /* a batched input was fed since the last forward */
        bool training;                   /* the last forward's mode, which its backward follows */
        uint32_t **blk;                  /* (n_tensors) a parameter's row blocks' starts and its rows
                                          * (graph_exec_set_blocks), or NULL: whole */
        uint32_t *n_blk;                 /* (n_tensors) their count, 0 when whole */
};

/* The exec's memory: the backend's on a device (zero-filled, as backend_alloc's contract), else calloc. */
static void *xalloc(const struct graph_exec *x, size_t bytes)
{
        bytes = bytes ? bytes : 1;
        return x->be ? backend_alloc(x->be, bytes) : calloc(1, bytes);
}

static void xfree(const struct graph_exec *x, void *p)
{
        if (x->be)
                backend_buf_free(x->be, p);
        else
                free(p);
}

static int xzero(const struct graph_exec *x, void *p, size_t bytes)
{
        if (x->be)
                return x->be->ops->memset0(x->be, p, bytes);
        memset(p, 0, bytes);
        return 0;
}

static int xput(const struct graph_exec *x, void *dst, const void *src, size_t bytes)
{
        if (x->be)
                return backend_upload(x->be, dst, src, bytes);
        memcpy(dst, src, bytes);
        return 0;
}

static void **alloc_ptrs(size_t n)
{
        return calloc(n ? n : 1, sizeof(void *));
}

struct graph_exec *graph_exec_free(struct graph_exec *x)
{
        if (!x)
                return NULL;
        const struct graph *g = x->g;
        for (uint32_t i = 0; x->val && i < g->n_tensors; i++)
                if (g->tensors[i].kind == GT_INPUT || g->tensors[i].kind == GT_VALUE ||
                    (x->be && g->tensors[i].kind == GT_CONST))
                        xfree(x, x->val[i]);
        for (uint32_t i = 0; x->grad && i < g->n_tensors; i++)
                if (g->tensors[i].kind != GT_PARAM)
                        xfree(x, x->grad[i]);
        for (uint32_t i = 0; x->state && i < g->n_nodes; i++)
                xfree(x, x->state[i]);
        free(x->val);
        free(x->grad);
        free(x->state);
        free(x->set);
        free(x->live);
        free(x->first);
        for (uint32_t i = 0; x->blk && i < g->n_tensors; i++)
                free(x->blk[i]);
        free(x->blk);
        free(x->n_blk);
        xfree(x, x->scratch);
        if (!x->ext_blocks) {
                xfree(x, x->params);
                xfree(x, x->grads);
        }
        free(x->host);
        free(x);
        return NULL;
}

bool graph_exec_on_device(const struct graph_exec *x)
{
        return x->be != NULL;
}

/* Every op of g has a forward in kt, and a backward wherever the CPU's has one. */
static int kernels_cover(const struct graph *g, const struct graph_kernels *kt, char *err, size_t errlen)
{
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                enum graph_op op = g->nodes[i].op;
                if (!kt->fwd[op] || (graph_kernels_cpu.bwd[op] && !kt->bwd[op])) {
                        snprintf(err, errlen, "node \"%s\" (%s): the %s kernels have no %s", g->nodes[i].name,
                                 graph_op_name(op), kt->name, kt->fwd[op] ? "backward" : "forward");
                        return -EOPNOTSUPP;
                }
        }
        return 0;
}

/* Bytes of the largest transfer a device exec stages: a tensor at max_batch, the parameter block, a
 * batch normalization's statistics (graph_moving_deltas: 5 floats a channel). */
static size_t staging_bytes(const struct graph *g, uint32_t max_batch)
{
        size_t m = sizeof(float) * g->n_params;
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                size_t b = graph_shape_count(&g->tensors[i].shape, max_batch) * graph_dtype_size(g->tensors[i].dtype);
                m = b > m ? b : m;
        }
        for (uint32_t i = 0; i < g->n_nodes; i++)
                if (g->nodes[i].op == GOP_BATCHNORM) {
                        size_t b = 5 * sizeof(float) * (size_t)g->tensors[g->nodes[i].in[0]].shape.dims[1];
                        m = b > m ? b : m;
                }
        return m;
}

int graph_exec_new_on(const struct graph *g, uint32_t max_batch, struct backend *be, struct graph_exec **ret,
                      char *err, size_t errlen)
{
        if (!g->final || max_batch == 0) {
                snprintf(err, errlen, "%s", !g->final ? "the graph is not finalized" : "a batch of 0");
                return -EINVAL;
        }
        const struct graph_kernels *kt = be && be->ops->graph ? be->ops->graph : &graph_kernels_cpu;
        if (be && !be->ops->host_memory && !be->ops->graph) {
                snprintf(err, errlen, "the %s backend computes no graph", be->ops->name);
                return -EOPNOTSUPP;
        }
        int r = kernels_cover(g, kt, err, errlen);
        if (r < 0)
                return r;
        struct graph_exec *x = calloc(1, sizeof(*x));
        if (!x)
                return -ENOMEM;
        gk_sgemm = gk_blas_sgemm;
        gk_blas_threads = gk_blas_threads_openblas;
        x->g = g;
        x->be = be && !be->ops->host_memory ? be : NULL;
        x->kt = kt;
        x->max_batch = max_batch;
        x->B = max_batch;
        for (uint32_t i = 0; i < g->n_nodes; i++)
                x->gathers |= g->nodes[i].op == GOP_GATHER;
        x->params = xalloc(x, sizeof(float) * g->n_params);
        x->grads = xalloc(x, sizeof(float) * g->n_params);
        x->val = alloc_ptrs(g->n_tensors);
        x->grad = (float **)alloc_ptrs(g->n_tensors);
        x->state = (float **)alloc_ptrs(g->n_nodes);
        x->set = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(bool));
        x->live = calloc((size_t)g->n_tensors + g->n_nodes + 1, sizeof(bool));
        x->first = malloc(sizeof(int32_t) * (g->n_tensors ? g->n_tensors : 1));
        x->blk = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(uint32_t *));
        x->n_blk = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(uint32_t));
        if (!x->params || !x->grads || !x->val || !x->grad || !x->state || !x->set || !x->live || !x->first ||
            !x->blk || !x->n_blk)
                goto nomem;
        for (uint32_t i = 0; i < g->n_tensors; i++)
                x->first[i] = -1;
        for (uint32_t i = g->n_nodes; i-- > 0;)
                for (uint32_t j = 0; j < g->nodes[i].n_in; j++)
                        if (g->nodes[i].in[j] >= 0)
                                x->first[g->nodes[i].in[j]] = (int32_t)i;
        if (x->be) {
                x->host_bytes = staging_bytes(g, max_batch);
                if (!(x->host = malloc(x->host_bytes ? x->host_bytes : 1)))
                        goto nomem;
        }
        /* a tensor read once, by a node whose backward can write its gradient whole: no zeroing */
        uint32_t *reads = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(uint32_t));
        if (!reads)
                goto nomem;
        for (uint32_t i = 0; i < g->n_nodes; i++)
                for (uint32_t j = 0; j < g->nodes[i].n_in; j++)
                        if (g->nodes[i].in[j] >= 0)
                                reads[g->nodes[i].in[j]]++;
        for (uint32_t i = 0; i < g->n_nodes; i++)
                for (uint32_t j = 0; j < g->nodes[i].n_in; j++) {
                        int32_t t = g->nodes[i].in[j];
                        if (t >= 0 && t != g->loss && reads[t] == 1 && graph_op_bwd_sets[g->nodes[i].op])
                                x->set[t] = true;
                }
        free(reads);
        /* Which tensors carry a gradient: the parameters, and every float value computed from one. */
        bool *needs = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(bool));
        if (!needs)
                goto nomem;
        for (uint32_t i = 0; i < g->n_tensors; i++)
                needs[i] = g->tensors[i].kind == GT_PARAM ||
                           (g->tensors[i].kind == GT_INPUT && g->tensors[i].want_grad &&
                            g->tensors[i].dtype == GDT_F32);
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                const struct graph_node *n = &g->nodes[i];
                bool any = false;
                for (uint32_t j = 0; j < n->n_in; j++)
                        any |= n->in[j] >= 0 && needs[n->in[j]];
                for (uint32_t j = 0; j < n->n_out; j++)
                        needs[n->out[j]] = any && graph_kernels_cpu.bwd[n->op];
        }
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                const struct graph_tensor *t = &g->tensors[i];
                size_t count = graph_shape_count(&t->shape, max_batch);
                switch (t->kind) {
                case GT_PARAM:
                        x->val[i] = x->params + t->param_offset;
                        if ((r = xput(x, x->val[i], t->data, sizeof(float) * count)) < 0) {
                                free(needs);
                                goto fail;
                        }
                        x->grad[i] = x->grads + t->param_offset;
                        break;
                case GT_CONST:
                        /* the host's are the graph's own; a device's a copy */
                        if (!x->be) {
                                x->val[i] = t->data;
                                break;
                        }
                        if (!(x->val[i] = xalloc(x, count * graph_dtype_size(t->dtype)))) {
                                free(needs);
                                goto nomem;
                        }
                        if ((r = xput(x, x->val[i], t->data, count * graph_dtype_size(t->dtype))) < 0) {
                                free(needs);
                                goto fail;
                        }
                        break;
                case GT_INPUT:
                case GT_VALUE:
                        if (!(x->val[i] = xalloc(x, count * graph_dtype_size(t->dtype)))) {
                                free(needs);
                                goto nomem;
                        }
                        if (needs[i] && !(x->grad[i] = xalloc(x, count * sizeof(float)))) {
                                free(needs);
                                goto nomem;
                        }
                        break;
                }
        }
        free(needs);
        size_t scratch = 0;
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                const struct graph_node *n = &g->nodes[i];
                const struct graph_op_info *op = &graph_ops[n->op];
                if (op->state_floats) {
                        size_t s = op->state_floats(g, n, max_batch);
                        if (s && !(x->state[i] = xalloc(x, s * sizeof(float))))
                                goto nomem;
                }
                if (op->scratch_floats) {
                        size_t s = op->scratch_floats(g, n, max_batch);
                        scratch = s > scratch ? s : scratch;
                }
        }
        if (scratch && !(x->scratch = x->be ? xalloc(x, sizeof(float) * scratch) : malloc(sizeof(float) * scratch)))
                goto nomem;
        *ret = x;
        return 0;
nomem:
        graph_exec_free(x);
        snprintf(err, errlen, "out of memory for the graph's buffers at batch %u%s%s", max_batch,
                 be ? " on " : "", be ? be->ops->name : "");
        return -ENOMEM;
fail:
        graph_exec_free(x);
        snprintf(err, errlen, "the graph's constants and initial values could not be copied to %s: %s",
                 be ? be->ops->name : "the host", strerror(-r));
        return r;
}

int graph_exec_new(const struct graph *g, uint32_t max_batch, struct graph_exec **ret, char *err, size_t errlen)
{
        return graph_exec_new_on(g, max_batch, NULL, ret, err, errlen);
}

int graph_exec_set_blocks(struct graph_exec *x, int32_t t, uint32_t n, const uint32_t *row_begin)
{
        const struct graph *g = x->g;
        if (t < 0 || t >= (int32_t)g->n_tensors || n == 0)
                return -EINVAL;
        const struct graph_tensor *tt = &g->tensors[t];
        /* its one reader: a Gemm, as B alone */
        uint32_t reads = 0;
        int32_t reader = -1;
        for (uint32_t i = 0; i < g->n_nodes; i++)
                for (uint32_t j = 0; j < g->nodes[i].n_in; j++)
                        if (g->nodes[i].in[j] == t) {
                                reads++;
                                reader = g->nodes[i].op == GOP_GEMM && j == 1 ? (int32_t)i : -1;
                        }
        if (x->be || tt->kind != GT_PARAM || tt->moving || tt->shape.rank != 2 || reads != 1 || reader < 0)
                return -EOPNOTSUPP;
        uint32_t rows = (uint32_t)tt->shape.dims[0];
        if (n > rows || (n > 1 && (!row_begin || row_begin[0] != 0)))
                return -EINVAL;
        for (uint32_t b = 1; n > 1 && b < n; b++)
                if (row_begin[b] <= row_begin[b - 1] || row_begin[b] >= rows)
                        return -EINVAL;
        uint32_t *a = NULL;
        if (n > 1) {
                if (!(a = malloc(sizeof(uint32_t) * (n + 1))))
                        return -ENOMEM;
                memcpy(a, row_begin, sizeof(uint32_t) * n);
                a[n] = rows;
        }
        free(x->blk[t]);
        x->blk[t] = a;
        x->n_blk[t] = n > 1 ? n : 0;
        return 0;
}

float *graph_exec_params(struct graph_exec *x)
{
        return x->params;
}

float *graph_exec_grads(struct graph_exec *x)
{
        return x->grads;
}

int graph_exec_use_blocks(struct graph_exec *x, float *params, float *grads)
{
        const struct graph *g = x->g;
        size_t bytes = sizeof(float) * g->n_params;
        int r;
        if (!params || !grads || params == grads)
                return -EINVAL;
        if (x->be) {
                /* device to device through the host: once, when the blocks move */
                if (params != x->params &&
                    ((r = backend_download(x->be, x->host, x->params, bytes)) < 0 ||
                     (r = backend_upload(x->be, params, x->host, bytes)) < 0))
                        return r;
                if ((r = xzero(x, grads, bytes)) < 0)
                        return r;
        } else {
                if (params != x->params)
                        memmove(params, x->params, bytes);
                memset(grads, 0, bytes);
        }
        if (!x->ext_blocks) {
                xfree(x, x->params);
                xfree(x, x->grads);
        }
        x->params = params;
        x->grads = grads;
        x->ext_blocks = true;
        for (uint32_t i = 0; i < g->n_tensors; i++)
                if (g->tensors[i].kind == GT_PARAM) {
                        x->val[i] = params + g->tensors[i].param_offset;
                        x->grad[i] = grads + g->tensors[i].param_offset;
                }
        return 0;
}

int graph_moving_deltas(struct graph_exec *x)
{
        const struct graph *g = x->g;
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                const struct graph_node *n = &g->nodes[i];
                if (n->op != GOP_BATCHNORM)
                        continue;
                size_t C = (size_t)g->tensors[n->in[0]].shape.dims[1];
                /* gk_batchnorm_fwd's state: mean, 1/std, the batch's variance; a device's staged: then the
                 * old value and the delta (staging_bytes counts 5 C) */
                const float *st = x->state[i];
                float *stage = x->host;
                int r;
                if (x->be && (r = backend_download(x->be, stage, st, sizeof(float) * 3 * C)) < 0)
                        return r;
                if (x->be)
                        st = stage;
                const float *batch_mean = st, *batch_var = st + 2 * C;
                double keep = n->a.momentum;
                for (uint32_t j = 3; j <= 4; j++) {
                        const struct graph_tensor *t = &g->tensors[n->in[j]];
                        if (t->kind != GT_PARAM || !t->moving)
                                continue;
                        const float *old = x->val[n->in[j]];
                        float *d = x->grad[n->in[j]];
                        if (x->be) {
                                if ((r = backend_download(x->be, stage + 3 * C, old, sizeof(float) * C)) < 0)
                                        return r;
                                old = stage + 3 * C;
                                d = stage + 4 * C;
                        }
                        for (size_t c = 0; c < C; c++)
                                d[c] = x->training ? (float)((1 - keep) * ((double)old[c] - (j == 3 ? batch_mean : batch_var)[c]))
                                                   : 0.0f;
                        if (x->be && (r = backend_upload(x->be, x->grad[n->in[j]], d, sizeof(float) * C)) < 0)
                                return r;
                }
        }
        return 0;
}

const float *graph_grad(const struct graph_exec *x, int32_t t)
{
        if (t < 0 || t >= (int32_t)x->g->n_tensors || x->g->tensors[t].kind != GT_INPUT)
                return NULL;
        return x->grad[t];
}

/* bytes of src (the exec's memory) in host memory: src itself, or a device's copy in the staging buffer */
static const void *host_copy(struct graph_exec *x, const void *src, size_t bytes)
{
        if (!x->be || !src)
                return src;
        return backend_download(x->be, x->host, src, bytes) < 0 ? NULL : x->host;
}

const float *graph_grad_host(struct graph_exec *x, int32_t t)
{
        const float *d = graph_grad(x, t);
        return d ? host_copy(x, d, sizeof(float) * graph_shape_count(&x->g->tensors[t].shape, x->B)) : NULL;
}

int graph_set_input(struct graph_exec *x, int32_t t, const void *data, uint32_t B)
{
        const struct graph *g = x->g;
        if (t < 0 || t >= (int32_t)g->n_tensors || g->tensors[t].kind != GT_INPUT || B == 0 || B > x->max_batch)
                return -EINVAL;
        const struct graph_tensor *tt = &g->tensors[t];
        bool batched = tt->shape.rank && tt->shape.dims[0] == GRAPH_BATCH;
        if (batched) {
                if (x->fed && x->B != B)
                        return -EINVAL; /* every batched input of one step has the same batch */
                x->B = B;
                x->fed = true;
        }
        return xput(x, x->val[t], data, graph_shape_count(&tt->shape, batched ? B : 1) * graph_dtype_size(tt->dtype));
}

int graph_set_input_rows(struct graph_exec *x, int32_t t, const float *data, size_t ld, uint32_t B)
{
        const struct graph *g = x->g;
        if (t < 0 || t >= (int32_t)g->n_tensors || g->tensors[t].kind != GT_INPUT || g->tensors[t].dtype != GDT_F32 ||
            !g->tensors[t].shape.rank || g->tensors[t].shape.dims[0] != GRAPH_BATCH || B == 0 || B > x->max_batch ||
            (x->fed && x->B != B))
                return -EINVAL;
        size_t per = graph_shape_count(&g->tensors[t].shape, 1);
        if (ld < per)
                return -EINVAL;
        /* a device's rows are packed on the host first: one upload */
        float *dst = x->be ? x->host : x->val[t];
        for (uint32_t b = 0; b < B; b++)
                memcpy(dst + (size_t)b * per, data + (size_t)b * ld, sizeof(float) * per);
        int r = x->be ? backend_upload(x->be, x->val[t], dst, sizeof(float) * per * B) : 0;
        if (r < 0)
                return r;
        x->B = B;
        x->fed = true;
        return 0;
}

static struct graph_shape resolved(const struct graph_shape *s, uint32_t B)
{
        struct graph_shape r = *s;
        for (uint32_t i = 0; i < r.rank; i++)
                if (r.dims[i] == GRAPH_BATCH)
                        r.dims[i] = B;
        return r;
}

static void kctx_fill(const struct graph_exec *x, uint32_t ni, struct graph_kctx *k)
{
        const struct graph *g = x->g;
        const struct graph_node *n = &g->nodes[ni];
        memset(k, 0, sizeof(*k));
        k->node = n;
        k->node_index = ni;
        k->B = x->B;
        k->state = x->state[ni];
        k->scratch = x->scratch;
        k->dev = x->be;
        for (uint32_t j = 0; j < n->n_in; j++) {
                if (n->in[j] < 0)
                        continue;
                const struct graph_tensor *t = &g->tensors[n->in[j]];
                k->in[j] = x->val[n->in[j]];
                k->in_shape[j] = resolved(&t->shape, x->B);
                k->in_dtype[j] = t->dtype;
        }
        for (uint32_t j = 0; j < n->n_out; j++) {
                k->out[j] = x->val[n->out[j]];
                k->out_shape[j] = resolved(&g->tensors[n->out[j]].shape, x->B);
        }
        if (n->op == GOP_GEMM && n->n_in > 1 && n->in[1] >= 0 && x->n_blk[n->in[1]]) {
                k->blk_n = x->n_blk[n->in[1]];
                k->blk_rows = x->blk[n->in[1]];
                k->blk_tensor = n->in[1];
        }
}

/* The hook for node i's parameters that it reads first (each once, however many of its inputs name it;
 * in input order forward, the reverse backward, as the layer list's kernel then bias, bias then kernel);
 * i = n_nodes: the parameters no node reads. after: the backward's, which skips moving parameters. */
static int param_hooks(const struct graph_exec *x, uint32_t i, bool after, bool blocks, graph_param_cb cb, void *ud)
{
        const struct graph *g = x->g;
        if (i == g->n_nodes) {
                for (uint32_t t = 0; t < g->n_tensors; t++) {
                        int r;
                        if (g->tensors[t].kind == GT_PARAM && x->first[t] < 0 && !(after && g->tensors[t].moving) &&
                            (r = cb(ud, (int32_t)t, 0)) != 0)
                                return r;
                }
                return 0;
        }
        const struct graph_node *n = &g->nodes[i];
        for (uint32_t jj = 0; jj < n->n_in; jj++) {
                uint32_t j = after ? n->n_in - 1 - jj : jj;
                int32_t t = n->in[j];
                bool again = false; /* named by an input already called for */
                for (uint32_t e = 0; e < n->n_in; e++)
                        again |= n->in[e] == t && (after ? e > j : e < j);
                int r;
                if (t < 0 || again || g->tensors[t].kind != GT_PARAM || x->first[t] != (int32_t)i ||
                    (after && g->tensors[t].moving))
                        continue;
                /* a parameter in row blocks: its Gemm calls for each block as it goes, unless it did not
                 * run (blocks: a backward that nothing needed) */
                for (uint32_t b = 0; b < (x->n_blk[t] ? x->n_blk[t] : 1); b++)
                        if ((!x->n_blk[t] || blocks) && (r = cb(ud, t, b)) != 0)
                                return r;
        }
        return 0;
}

int graph_forward(struct graph_exec *x, bool training, uint64_t seed)
{
        return graph_forward_hooked(x, training, seed, NULL, NULL);
}

int graph_forward_hooked(struct graph_exec *x, bool training, uint64_t seed, graph_param_cb before, void *ud)
{
        int r;
        for (uint32_t i = 0; i < x->g->n_nodes; i++) {
                if (before && (r = param_hooks(x, i, false, false, before, ud)) != 0)
                        return r;
                struct graph_kctx k;
                kctx_fill(x, i, &k);
                k.training = training;
                k.seed = seed;
                k.blk_hook = before;
                k.blk_ud = ud;
                if ((r = x->kt->fwd[k.node->op](&k)) != 0) /* an error, or a block's hook's stop */
                        return r;
        }
        if (before && (r = param_hooks(x, x->g->n_nodes, false, false, before, ud)) != 0)
                return r;
        if (x->be && x->gathers && x->kt->forward_done && (r = x->kt->forward_done(x->be)) < 0)
                return r;
        x->fed = false; /* the next step feeds its batch anew */
        x->training = training;
        return 0;
}

const void *graph_value(const struct graph_exec *x, int32_t t, size_t *count_ret)
{
        if (t < 0 || t >= (int32_t)x->g->n_tensors)
                return NULL;
        if (count_ret)
                *count_ret = graph_shape_count(&x->g->tensors[t].shape, x->B);
        return x->val[t];
}

const void *graph_value_host(struct graph_exec *x, int32_t t, size_t *count_ret)
{
        size_t n;
        const void *v = graph_value(x, t, &n);
        if (!v)
                return NULL;
        if (count_ret)
                *count_ret = n;
        return host_copy(x, v, n * graph_dtype_size(x->g->tensors[t].dtype));
}

int graph_backward(struct graph_exec *x, int32_t t, const float *dt)
{
        return graph_backward_hooked(x, t, dt, NULL, NULL);
}

int graph_backward_hooked(struct graph_exec *x, int32_t t, const float *dt, graph_param_cb after, void *ud)
{
        const struct graph *g = x->g;
        if (t < 0 || t >= (int32_t)g->n_tensors || !x->grad[t])
                return -EINVAL;
        /* Which nodes lie on a path to t, and which tensors feed them: only those run backward, and a
         * gradient that its one consumer sets is zeroed only when that consumer does not run. */
        bool *live = x->live, *node_live = x->live + g->n_tensors;
        memset(live, 0, sizeof(bool) * ((size_t)g->n_tensors + g->n_nodes));
        live[t] = true;
        for (uint32_t i = g->n_nodes; i-- > 0;) {
                const struct graph_node *nd = &g->nodes[i];
                for (uint32_t j = 0; j < nd->n_out; j++)
                        node_live[i] |= live[nd->out[j]] && (x->grad[nd->out[j]] != NULL);
                for (uint32_t j = 0; node_live[i] && j < nd->n_in; j++)
                        if (nd->in[j] >= 0)
                                live[nd->in[j]] = true;
        }
        int r;
        for (uint32_t i = 0; i < g->n_tensors; i++) /* what is added to starts from zero */
                if (x->grad[i] && (!x->set[i] || !live[i]) && (int32_t)i != t &&
                    (r = xzero(x, x->grad[i], sizeof(float) * graph_shape_count(&g->tensors[i].shape, x->B))) < 0)
                        return r;
        size_t n = graph_shape_count(&g->tensors[t].shape, x->B);
        /* The seed: on the host copied into t's gradient; on a device dt is read where it is (nothing
         * downstream of t runs backward, so nothing adds into it), or ones are uploaded. */
        const float *seed = x->grad[t];
        if (!x->be) {
                for (size_t i = 0; i < n; i++)
                        x->grad[t][i] = dt ? dt[i] : 1.0f;
        } else if (dt) {
                seed = dt;
        } else {
                float *ones = x->host;
                for (size_t i = 0; i < n; i++)
                        ones[i] = 1.0f;
                if ((r = backend_upload(x->be, x->grad[t], ones, sizeof(float) * n)) < 0)
                        return r;
        }
        for (uint32_t i = g->n_nodes; i-- > 0;) {
                const struct graph_node *nd = &g->nodes[i];
                int (*bwd)(struct graph_kctx *) = x->kt->bwd[nd->op];
                /* (an op without a backward sets no gradient: graph_op_bwd_sets holds only ops with one) */
                if (!node_live[i] || !bwd) {
                        if (after && (r = param_hooks(x, i, true, true, after, ud)) != 0)
                                return r;
                        continue;
                }
                struct graph_kctx k;
                kctx_fill(x, i, &k);
                k.training = x->training;
                for (uint32_t j = 0; j < nd->n_out; j++)
                        k.dout[j] = nd->out[j] == t ? seed : x->grad[nd->out[j]];
                for (uint32_t j = 0; j < nd->n_in; j++) {
                        k.din[j] = nd->in[j] >= 0 ? x->grad[nd->in[j]] : NULL;
                        k.din_set[j] = nd->in[j] >= 0 && x->set[nd->in[j]];
                }
                k.blk_hook = after;
                k.blk_ud = ud;
                if ((r = bwd(&k)) != 0)
                        return r;
                /* its first reader's backward was the last to add to a parameter's gradient */
                if (after && (r = param_hooks(x, i, true, false, after, ud)) != 0)
                        return r;
        }
        if (after && (r = param_hooks(x, g->n_nodes, true, false, after, ud)) != 0)
                return r;
        return 0;
}
