/* Row-block hooks for model tests (test_model.c, test_model_engines.c), which log every call and poison
 * what a pass may no longer touch: the forward hook writes a block's real values and poisons what was
 * read before it, the backward hook snapshots a block's gradient and poisons it and the block's
 * parameters. A pass that reads a block before its hook, or after a later one, spreads NaN; one that
 * writes a gradient block after its hook leaves a non-NaN behind. Include after cmocka.h and model.h. */
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct blk_log {
        struct model *m;
        const float *ref;    /* (n_params) the values forward should see / the final gradients */
        float *snap;         /* (n_params) gradients seen in the after-callbacks */
        uint32_t n, var[32], block[32];
        uint32_t stop_at;    /* return `ret` on this call (1-based); 0: never */
        int ret;
        bool bias_first;     /* forward hands a dense bias on before its kernel (the graph's Gemm reads
                              * C first): poison only the variable's own earlier blocks */
};

static inline void rows_of(struct model *m, uint32_t var, uint32_t block, size_t *begin, size_t *end)
{
        const uint32_t *rb;
        const struct model_var *v = model_var(m, var);
        assert_true(block < model_var_blocks(m, var, &rb));
        *begin = v->offset + (size_t)rb[block] * v->cols;
        *end = v->offset + (size_t)rb[block + 1] * v->cols;
}

static inline int blk_record(struct blk_log *l, uint32_t var, uint32_t block)
{
        assert_true(l->n < 32);
        l->var[l->n] = var;
        l->block[l->n] = block;
        l->n++;
        return l->stop_at == l->n ? l->ret : 0;
}

/* Writes the block's real values, and poisons everything read earlier (blocks < b of this kernel;
 * the whole kernel at its bias, unless bias_first): a block read before its callback, or after a later
 * one, gives NaN. */
static inline int before_cb(void *ud, uint32_t var, uint32_t block)
{
        struct blk_log *l = ud;
        float *p = model_params(l->m);
        size_t b0, b1;
        rows_of(l->m, var, block, &b0, &b1);
        memcpy(p + b0, l->ref + b0, sizeof(float) * (b1 - b0));
        const struct model_var *v = model_var(l->m, var);
        size_t poison_from = v->rows == 1 && !l->bias_first ? model_var(l->m, var - 1)->offset : v->offset;
        for (size_t i = poison_from; i < b0; i++)
                p[i] = NAN;
        return blk_record(l, var, block);
}

/* Snapshots the block's gradient, then poisons it: a later write would leave no NaN behind. Poisons
 * the block's parameters too: the pass must not read them after this callback (a worker's ps may
 * overwrite them with fresh values from here on), so a later read would spread NaN into the
 * gradients still to come. */
static inline int after_cb(void *ud, uint32_t var, uint32_t block)
{
        struct blk_log *l = ud;
        float *g = model_grads(l->m), *p = model_params(l->m);
        size_t b0, b1;
        rows_of(l->m, var, block, &b0, &b1);
        memcpy(l->snap + b0, g + b0, sizeof(float) * (b1 - b0));
        for (size_t i = b0; i < b1; i++)
                g[i] = p[i] = NAN;
        return blk_record(l, var, block);
}
