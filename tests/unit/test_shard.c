/* A ps shard without RPC: the same gradients through psd's gRPC path (a wire-encoded push, built as
 * the ps client builds one), its shared-memory path (gradients where a worker's segment has them) and
 * the standalone trainer's apply give bit-equal parameters, for every optimizer; a push with any bad
 * tensor (NaN, wrong shape, unknown variable, given twice) changes nothing. The sync step is
 * test_agg.c's, the ssp clocks test_ssp.c's. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "config.h"
#include "job.h"
#include "optim.h"
#include "rng.h"
#include "shard.h"
#include "trainer.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"

#include "shard_fixture.h"
#include "unit.h"

#define N_PS 2
#define STEPS 6

/* psd_push.c's order for a gRPC push: everything checked, then applied; -EINVAL and nothing applied otherwise. */
static int push_wire(struct shard *s, const struct wire_in *in, float *values, char *err, size_t errlen) {
        struct shard_part **parts = calloc(in->n_tensors + 1, sizeof(*parts));
        size_t floats;
        float scale = 0;
        int r = shard_wire_check(s, in, "worker:0", parts, &floats, &scale, err, errlen);
        if (r == 0)
                shard_wire_apply(s, in, parts, scale, values);
        free(parts);
        return r;
}

/* psd_push.c's order for a shared-memory push, with all of the shard's parts as one group. */
static int push_block(struct shard *s, const float *grads, float *values, char *err, size_t errlen) {
        uint32_t *idx = calloc(s->n_parts + 1, sizeof(*idx));
        float *scratch = malloc((s->n_floats + 1) * sizeof(float));
        for (uint32_t k = 0; k < s->n_parts; k++)
                idx[k] = k;
        int r = shard_block_check(s, grads, idx, s->n_parts, scratch, "worker:3", err, errlen);
        if (r == 0)
                shard_block_apply(s, idx, s->n_parts, scratch, values);
        free(idx);
        free(scratch);
        return r;
}

/* Every part of shards a and b, values and slots, bit-equal; the values also to the trainer's. */
static void assert_same(const struct job_layout *L, struct shard *const *a, struct shard *const *b,
                        const float *trainer) {
        for (uint32_t s = 0; s < N_PS; s++) {
                assert_int_equal(a[s]->n_floats, b[s]->n_floats);
                assert_memory_equal(a[s]->block, b[s]->block, a[s]->n_floats * (1 + a[s]->n_slots) * sizeof(float));
                for (uint32_t k = 0; k < a[s]->n_parts; k++) {
                        const struct shard_part *q = &a[s]->parts[k];
                        assert_int_equal(q->a.updates, b[s]->parts[k].a.updates);
                        assert_memory_equal(q->a.w, trainer + q->model_off, q->a.n * sizeof(float));
                }
        }
        (void)L;
}

static void three_paths(const char *training) {
        struct job_config *cfg = job(training);
        struct job_layout *L;
        assert_int_equal(job_layout_new(cfg, &L), 0);
        assert_int_equal(L->n_shards, N_PS);
        assert_true(L->plan->n_parts > L->n_vars);   /* a variable is split */
        size_t np = L->n_params;
        float *trainer = malloc(np * sizeof(float)), *grads = malloc(np * sizeof(float));
        float *segment = malloc(np * sizeof(float)), *values = malloc(np * sizeof(float));
        struct rng g;
        rng_init(&g, 7, 0);
        random_block(&g, trainer, np, 0.1f);
        memcpy(segment, trainer, np * sizeof(float));
        struct trainer_apply *ta;
        assert_int_equal(trainer_apply_new(&cfg->training, L, trainer, &ta), 0);
        struct shard *a[N_PS], *b[N_PS];
        for (uint32_t s = 0; s < N_PS; s++) {
                a[s] = assigned_shard(cfg, L, s, trainer);
                b[s] = assigned_shard(cfg, L, s, trainer);
        }
        assert_same(L, a, b, trainer);

        char err[512];
        for (int step = 0; step < STEPS; step++) {
                random_block(&g, grads, np, 1.0f);
                for (uint32_t s = 0; s < N_PS; s++) {
                        struct wire_in *in = shard_message(L, s, grads, NULL);
                        memset(values, 0, a[s]->n_floats * sizeof(float));
                        assert_int_equal(push_wire(a[s], in, values, err, sizeof(err)), 0);
                        /* the reply's values: the fresh ones, in the tensors' order */
                        assert_memory_equal(values, a[s]->block, a[s]->n_floats * sizeof(float));
                        wire_in_free(in);
                        assert_int_equal(push_block(b[s], grads, segment, err, sizeof(err)), 0);
                }
                trainer_apply_step(ta, grads);
                assert_same(L, a, b, trainer);
                /* the segment got every part's fresh values, where the worker's model has them */
                assert_memory_equal(segment, trainer, np * sizeof(float));
        }
        for (uint32_t s = 0; s < N_PS; s++) {
                assert_int_equal(a[s]->parts[0].a.updates, STEPS);
                shard_free(a[s]);
                shard_free(b[s]);
        }
        trainer_apply_free(ta);
        free(trainer);
        free(grads);
        free(segment);
        free(values);
        job_layout_free(L);
        config_free(cfg);
}

/* A push of gradients in dtype (rpc.compression bf16, int8, topk) applies exactly what a float32 push
 * of the values it decodes to applies; one holding a NaN (bf16, topk: sent as it is; int8 sends a NaN
 * scale, which wire_in_parse refuses: test_wire) is refused as a float32 one is, nothing applied; an
 * Assign in anything but float32 is refused (the model itself is float32 only). */
static void push_as_decoded(uint32_t dtype, uint64_t seed) {
        struct job_config *cfg = job("\"optimizer\": \"momentum\", \"momentum\": 0.9");
        struct job_layout *L;
        assert_int_equal(job_layout_new(cfg, &L), 0);
        size_t np = L->n_params;
        float *params = malloc(np * sizeof(float)), *grads = malloc(np * sizeof(float));
        float *decoded = malloc(np * sizeof(float)), *va = malloc(np * sizeof(float)), *vb = malloc(np * sizeof(float));
        struct rng g;
        rng_init(&g, seed, 0);
        random_block(&g, params, np, 0.1f);
        char err[512];
        for (uint32_t s = 0; s < N_PS; s++) {
                struct shard *a = assigned_shard(cfg, L, s, params), *b = assigned_shard(cfg, L, s, params);
                struct wire_in *in = shard_message_as(L, s, params, NULL, dtype);
                assert_int_equal(shard_assign(a, in, false, 0, err, sizeof(err)), -EINVAL);
                assert_non_null(strstr(err, "expected float32"));
                wire_in_free(in);
                for (int step = 0; step < 3; step++) {
                        random_block(&g, grads, np, 1.0f);
                        in = shard_message_as(L, s, grads, NULL, dtype);
                        memset(decoded, 0, np * sizeof(float));
                        for (size_t t = 0; t < in->n_tensors; t++) {
                                const struct wire_tensor *wt = &in->tensors[t];
                                const struct job_var *v = &L->vars[job_layout_find(L, wt->name)];
                                wire_tensor_copy_f32(wt, decoded + v->offset + wt->row_offset * v->cols);
                        }
                        assert_int_equal(push_wire(a, in, va, err, sizeof(err)), 0);
                        wire_in_free(in);
                        in = shard_message(L, s, decoded, NULL);
                        assert_int_equal(push_wire(b, in, vb, err, sizeof(err)), 0);
                        wire_in_free(in);
                        assert_memory_equal(a->block, b->block, a->n_floats * (1 + a->n_slots) * sizeof(float));
                        assert_memory_equal(va, vb, a->n_floats * sizeof(float));
                }
                if (dtype != WIRE_DTYPE_INT8_BLOCKS) {
                        const struct placement_part *pp = &L->plan->parts[L->shard_parts[L->shard_first[s]]];
                        grads[L->vars[pp->var].offset + (size_t)pp->row_begin * L->vars[pp->var].cols] = NAN;
                        in = shard_message_as(L, s, grads, NULL, dtype);
                        assert_int_equal(push_wire(a, in, va, err, sizeof(err)), -EINVAL);
                        assert_non_null(strstr(err, "contains NaN or Inf; nothing applied"));
                        assert_memory_equal(a->block, b->block, a->n_floats * (1 + a->n_slots) * sizeof(float));
                        wire_in_free(in);
                }
                shard_free(a);
                shard_free(b);
        }
        free(params), free(grads), free(decoded), free(va), free(vb);
        job_layout_free(L);
        config_free(cfg);
}

static void test_bf16_push(void **state) {
        (void)state;
        push_as_decoded(WIRE_DTYPE_BFLOAT16, 11);
}

static void test_compressed_push(void **state) {
        (void)state;
        push_as_decoded(WIRE_DTYPE_INT8_BLOCKS, 12);
        push_as_decoded(WIRE_DTYPE_TOPK, 13);
}

static void test_sgd_decay(void **state) {
        (void)state;
        three_paths("\"optimizer\": \"sgd\", \"learning_rate\": 0.05, \"lr_schedule\": \"exponential\","
                    " \"lr_decay_rate\": 0.5, \"lr_decay_steps\": 2");
}

static void test_momentum_nesterov(void **state) {
        (void)state;
        three_paths("\"optimizer\": \"momentum\", \"momentum\": 0.9, \"nesterov\": true, \"learning_rate\": 0.02");
}

static void test_adam(void **state) {
        (void)state;
        three_paths("\"optimizer\": \"adam\", \"learning_rate\": 0.001");
}

static void test_adagrad(void **state) {
        (void)state;
        three_paths("\"optimizer\": \"adagrad\", \"learning_rate\": 0.1, \"initial_accumulator\": 0.1");
}

/* ---- validation: a bad push changes nothing ---- */

struct tensor {
        const char *name;
        uint64_t rows, cols, row;
        const float *data;
};

static struct wire_in *message(const struct tensor *t, size_t n) {
        struct wire_out *o;
        assert_int_equal(wire_out_new(&o), 0);
        for (size_t i = 0; i < n; i++) {
                uint64_t shape[2] = {t[i].rows, t[i].cols};
                assert_int_equal(wire_out_tensor_copy(o, t[i].name, WIRE_DTYPE_FLOAT32, shape, 2, t[i].row, t[i].data,
                                                      shape[0] * shape[1] * sizeof(float)),
                                 0);
        }
        grpc_byte_buffer *bb;
        assert_int_equal(wire_out_finish(o, &bb), 0);
        wire_out_free(o);
        struct wire_in *in;
        assert_int_equal(wire_in_parse(bb, &in, NULL, 0), 0);
        return in;
}

struct fx {
        struct job_config *cfg;
        struct job_layout *L;
        float *params, *grads;
        struct shard *s;       /* the shard holding dense1/bias */
        float *before;         /* its block before the push */
};

static struct fx *fixture_with(const char *training) {
        struct fx *f = calloc(1, sizeof(*f));
        f->cfg = job(training);
        assert_int_equal(job_layout_new(f->cfg, &f->L), 0);
        f->params = calloc(f->L->n_params, sizeof(float));
        f->grads = calloc(f->L->n_params, sizeof(float));
        for (size_t i = 0; i < f->L->n_params; i++)
                f->params[i] = f->grads[i] = (float)(i % 13) * 0.01f;
        int v = job_layout_find(f->L, "dense1/bias");
        assert_true(v >= 0);
        uint32_t first;
        assert_int_equal(placement_var_parts(f->L->plan, (uint32_t)v, &first), 1);
        f->s = assigned_shard(f->cfg, f->L, f->L->plan->parts[first].shard, f->params);
        size_t n = f->s->n_floats * (1 + f->s->n_slots);
        f->before = malloc(n * sizeof(float));
        memcpy(f->before, f->s->block, n * sizeof(float));
        return f;
}

static struct fx *fixture(void) {
        return fixture_with("\"optimizer\": \"adam\"");
}

static void fixture_free(struct fx *f) {
        shard_free(f->s);
        free(f->before);
        free(f->params);
        free(f->grads);
        job_layout_free(f->L);
        config_free(f->cfg);
        free(f);
}

/* Whatever the push, nothing changed. */
static void unchanged(struct fx *f) {
        assert_memory_equal(f->before, f->s->block, f->s->n_floats * (1 + f->s->n_slots) * sizeof(float));
        for (uint32_t k = 0; k < f->s->n_parts; k++)
                assert_int_equal(f->s->parts[k].a.updates, 0);
        fixture_free(f);
}

/* Valid gradients of all the shard's parts but `except` (nullable) into t (16); returns how many. */
static size_t valid_tensors(struct fx *f, const struct shard_part *except, struct tensor *t) {
        size_t n = 0;
        for (uint32_t k = 0; k < f->s->n_parts && n < 15; k++) {
                const struct shard_part *q = &f->s->parts[k];
                if (q != except)
                        t[n++] = (struct tensor){q->name, q->rows, q->cols, q->row_begin, f->grads + q->model_off};
        }
        return n;
}

/* A whole, valid push of the shard's parts, then one more tensor; the push is refused with msg. */
static void refused(struct fx *f, const struct tensor *extra, const char *msg) {
        struct tensor t[16];
        size_t n = valid_tensors(f, NULL, t);
        t[n++] = *extra;
        struct wire_in *in = message(t, n);
        char err[512] = "";
        assert_int_equal(push_wire(f->s, in, NULL, err, sizeof(err)), -EINVAL);
        wire_in_free(in);
        if (!strstr(err, msg))
                fail_msg("\"%s\" does not say \"%s\"", err, msg);
}

static void test_nan(void **state) {
        (void)state;
        struct fx *f = fixture();
        struct shard_part *q = shard_find(f->s, "dense1/bias", 0);
        assert_non_null(q);
        float g[10] = {0, 1, 2, NAN};
        /* given once, in place of the valid one, last: every other tensor is valid */
        struct tensor t[16];
        size_t n = valid_tensors(f, q, t);
        t[n++] = (struct tensor){"dense1/bias", 1, 10, 0, g};
        struct wire_in *in = message(t, n);
        char err[512];
        assert_int_equal(push_wire(f->s, in, NULL, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "gradient \"dense1/bias\" from worker:0 contains NaN or Inf; nothing applied");
        wire_in_free(in);

        /* the shared-memory path: the same gradient where the worker's segment has it */
        memcpy(f->grads + q->model_off, g, sizeof(g));
        f->grads[q->model_off + 5] = INFINITY;
        assert_int_equal(push_block(f->s, f->grads, f->params, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "gradient \"dense1/bias\" rows 0..1 from worker:3 contains NaN or Inf; nothing applied");
        unchanged(f);
}

/* Each after a whole valid push of the shard's parts: refused, naming the tensor. */
static void test_refused(void **state) {
        (void)state;
        static const struct {
                const char *name;
                uint64_t cols;
                const char *msg;
        } cases[] = {
                /* the shape is checked before the repetition */
                {"dense1/bias", 9, "tensor \"dense1/bias\": shape (1, 9), expected (1, 10)"},
                {"dense7/kernel", 10, "tensor \"dense7/kernel\" rows from 0: no such variable on ps:%u"},
                {"dense1/bias/m", 10, "tensor \"dense1/bias/m\" rows from 0: no such variable on ps:%u"}, /* no slots */
                {"dense1/bias", 10, "tensor \"dense1/bias\" appears twice in one push"},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct fx *f = fixture();
                struct tensor t = {cases[i].name, 1, cases[i].cols, 0, f->grads};
                char msg[256];
                snprintf(msg, sizeof(msg), cases[i].msg, f->s->index);
                refused(f, &t, msg);
                unchanged(f);
        }
}

/* ---- training.max_gradient_norm: over it a push is refused whole, or clipped to it ---- */

/* Every gradient of the shard's parts set to v (where a whole model's block has them). */
static void fill_grads(struct fx *f, float v) {
        for (uint32_t k = 0; k < f->s->n_parts; k++) {
                const struct shard_part *q = &f->s->parts[k];
                for (size_t i = 0; i < q->a.n; i++)
                        f->grads[q->model_off + i] = v;
        }
}

static void test_norm_reject(void **state) {
        (void)state;
        struct fx *f = fixture_with("\"optimizer\": \"adam\", \"max_gradient_norm\": 10");
        fill_grads(f, 1e30f);   /* finite, so only the norm can refuse it */
        struct tensor t[16];
        struct wire_in *in = message(t, valid_tensors(f, NULL, t));
        char err[512];
        assert_int_equal(push_wire(f->s, in, NULL, err, sizeof(err)), -EINVAL);
        wire_in_free(in);
        if (!strstr(err, "gradients from worker:0 to ps:") || !strstr(err, "over training.max_gradient_norm 10; nothing applied"))
                fail_msg("%s", err);
        assert_int_equal(push_block(f->s, f->grads, f->params, err, sizeof(err)), -EINVAL);
        if (!strstr(err, "gradients from worker:3 to ps:") || !strstr(err, "over training.max_gradient_norm 10"))
                fail_msg("%s", err);
        /* NaN is refused as such, with or without a limit */
        f->grads[f->s->parts[0].model_off] = NAN;
        assert_int_equal(push_block(f->s, f->grads, f->params, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "contains NaN or Inf"));
        assert_int_equal(atomic_load(&f->s->clipped), 0);
        unchanged(f);
}

/* Clipped: the gRPC and the shared-memory path apply the same scaled gradients, whose norm is the limit:
 * with sgd the parameters move by lr * limit in norm. A push within the limit is applied as it is. */
static void test_norm_clip(void **state) {
        (void)state;
        static const char training[] =
                "\"optimizer\": \"sgd\", \"learning_rate\": 0.1, \"max_gradient_norm\": 2, \"gradient_norm_action\": \"clip\"";
        struct fx *a = fixture_with(training), *b = fixture_with(training);
        size_t n = a->s->n_floats;
        fill_grads(a, 1e30f);
        fill_grads(b, 1e30f);
        a->grads[a->s->parts[0].model_off] = -3e30f;
        b->grads[b->s->parts[0].model_off] = -3e30f;
        struct tensor t[16];
        struct wire_in *in = message(t, valid_tensors(a, NULL, t));
        char err[512];
        assert_int_equal(push_wire(a->s, in, NULL, err, sizeof(err)), 0);
        wire_in_free(in);
        assert_int_equal(push_block(b->s, b->grads, b->params, err, sizeof(err)), 0);
        assert_memory_equal(a->s->block, b->s->block, n * sizeof(float));
        double moved = 0;
        for (size_t i = 0; i < n; i++)
                moved += ((double)a->s->block[i] - a->before[i]) * ((double)a->s->block[i] - a->before[i]);
        assert_float_equal(sqrt(moved), 0.1 * 2, 1e-5);
        assert_int_equal(atomic_load(&a->s->clipped), 1);
        assert_int_equal(atomic_load(&b->s->clipped), 1);

        /* within the limit: as it is, and not counted */
        memcpy(a->before, a->s->block, n * sizeof(float));
        fill_grads(a, 0.01f);
        in = message(t, valid_tensors(a, NULL, t));
        assert_int_equal(push_wire(a->s, in, NULL, err, sizeof(err)), 0);
        wire_in_free(in);
        for (size_t i = 0; i < n; i++)
                assert_float_equal(a->s->block[i], a->before[i] - 0.1f * 0.01f, 1e-6);
        assert_int_equal(atomic_load(&a->s->clipped), 1);
        fixture_free(a);
        fixture_free(b);
}

static void test_assign_incomplete(void **state) {
        (void)state;
        struct fx *f = fixture();
        const struct shard_part *q = &f->s->parts[0];
        struct tensor t = {q->name, q->rows, q->cols, q->row_begin, f->params + q->model_off};
        struct wire_in *in = message(&t, 1);
        char err[512];
        if (f->s->n_parts > 1) {
                assert_int_equal(shard_assign(f->s, in, false, 5, err, sizeof(err)), -EINVAL);
                assert_non_null(strstr(err, "Assign is missing"));
        }
        /* with slots, even a whole set of values is not enough */
        wire_in_free(in);
        in = shard_message(f->L, f->s->index, f->params, NULL);
        assert_int_equal(shard_assign(f->s, in, true, 5, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "/m\" rows"));
        wire_in_free(in);
        unchanged(f);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_sgd_decay),
        cmocka_unit_test(test_bf16_push),
        cmocka_unit_test(test_compressed_push),
        cmocka_unit_test(test_momentum_nesterov),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_nan),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_norm_reject),
        cmocka_unit_test(test_norm_clip),
        cmocka_unit_test(test_assign_incomplete))
