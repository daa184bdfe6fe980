/* The standalone trainer: see trainer.h. The step loop: batch → forward → backward → apply. */
#include "trainer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "apply.h"
#include "backend.h"
#include "ctr_train.h"
#include "blocks.h"
#include "data.h"
#include "device.h"
#include "job.h"
#include "model.h"
#include "optim.h"
#include "util.h"

char *trainer_data_path(const struct job_config *cfg, const char *file) {
        if (file[0] == '/')
                return strdup(file);
        return strdup_printf("%s/%s", cfg->data.dir, file);
}

void trainer_log_loss(FILE *f, uint64_t step, double loss) {
        fprintf(f, "%llu %.9g\n", (unsigned long long)step, loss);
}

struct trainer_apply {
        const struct training_config *t;
        const float *params;     /* the caller's block; a variable's gradient is where its values are */
        uint32_t n_vars;
        struct apply_rows *vars; /* (n_vars) */
        float *slots;            /* (n_slots, n_params) */
};

int trainer_apply_new(const struct training_config *t, const struct job_layout *L, float *params,
                      struct trainer_apply **ret) {
        struct trainer_apply *a = calloc(1, sizeof(*a));
        unsigned ns = optim_n_slots(t->optimizer);
        if (!a)
                return -ENOMEM;
        a->t = t;
        a->params = params;
        a->n_vars = L->n_vars;
        a->vars = calloc(L->n_vars + 1, sizeof(*a->vars));
        a->slots = malloc((ns ? ns : 1) * L->n_params * sizeof(float) + 1);
        if (!a->vars || !a->slots) {
                trainer_apply_free(a);
                return -ENOMEM;
        }
        float *slot_blocks[OPTIM_MAX_SLOTS];
        for (unsigned s = 0; s < ns; s++)
                slot_blocks[s] = a->slots + s * L->n_params;
        for (uint32_t v = 0; v < L->n_vars; v++) {
                const struct job_var *jv = &L->vars[v];
                a->vars[v] = apply_rows_at(params, slot_blocks, ns, jv->offset, (size_t)jv->rows * jv->cols);
                a->vars[v].moving = jv->moving;
                apply_reset(t, &a->vars[v], 0);
        }
        *ret = a;
        return 0;
}

struct trainer_apply *trainer_apply_free(struct trainer_apply *a) {
        if (!a)
                return NULL;
        free(a->vars);
        free(a->slots);
        free(a);
        return NULL;
}

void trainer_apply_step(struct trainer_apply *a, const float *grads) {
        /* per variable, exactly as a ps shard applies it: each has had as many gradients as steps */
        for (uint32_t v = 0; v < a->n_vars; v++)
                apply_gradient(a->t, &a->vars[v], grads + (a->vars[v].w - a->params));
}

/* The variables of params (laid out as L says) as a safetensors file: a little-endian length, the JSON
 * header, the data. */
int trainer_save_params(const struct job_layout *L, const float *params, const char *path, char *err, size_t errlen) {
        size_t cap = 256 + (size_t)L->n_vars * 384, at = 0;
        char *hdr = malloc(cap);
        if (!hdr)
                return errf(err, errlen, -ENOMEM, "out of memory");
        at += (size_t)snprintf(hdr + at, cap - at, "{");
        size_t off = 0;
        for (uint32_t v = 0; v < L->n_vars; v++) {
                size_t n = (size_t)L->vars[v].rows * L->vars[v].cols;
                at += (size_t)snprintf(hdr + at, cap - at, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%u,%u],"
                                       "\"data_offsets\":[%zu,%zu]}", v ? "," : "", L->vars[v].name, L->vars[v].rows,
                                       L->vars[v].cols, off * 4, (off + n) * 4);
                off += n;
        }
        at += (size_t)snprintf(hdr + at, cap - at, "}");
        FILE *f = fopen(path, "we");
        uint64_t len = at;
        int r = 0;
        if (!f) {
                r = errf(err, errlen, -errno, "cannot create %s: %s", path, strerror(errno));
        } else {
                fwrite(&len, 8, 1, f);   /* little-endian hosts only, as the checkpoints */
                fwrite(hdr, 1, at, f);
                for (uint32_t v = 0; v < L->n_vars; v++)
                        fwrite(params + L->vars[v].offset, sizeof(float), (size_t)L->vars[v].rows * L->vars[v].cols, f);
                if (fclose(f) != 0)
                        r = errf(err, errlen, -EIO, "cannot write %s", path);
        }
        free(hdr);
        return r;
}

int trainer_standalone(const struct job_config *cfg, FILE *loss_log, const char *params_out,
                       trainer_progress_cb progress, void *ud, struct trainer_result *ret, char *err, size_t errlen) {
        const struct training_config *t = &cfg->training;
        struct backend *be = NULL;
        struct model *m = NULL;
        struct dataset *train = NULL, *test = NULL;
        struct data_iter **it = NULL;
        /* sync: one step is every worker's batch, each from its own shard of the data, their gradients
         * summed in worker order and scaled by 1 / W, as a ps shard aggregates them (agg.c) */
        uint32_t W = cfg->training.mode == MODE_SYNC ? cfg->cluster.n_worker : 1, B = t->batch_size * W;
        float *sum = NULL;
        struct job_layout *L = NULL;
        struct trainer_apply *ap = NULL;
        float *x = NULL;
        uint8_t *y = NULL;
        char *ip = trainer_data_path(cfg, cfg->data.train_images), *lp = trainer_data_path(cfg, cfg->data.train_labels);
        char *tip = trainer_data_path(cfg, cfg->data.test_images), *tlp = trainer_data_path(cfg, cfg->data.test_labels);
        struct trainer_result res = {0};
        int r;

        if (cfg->data.format != DATA_IDX) {  /* records and embeddings: ctr_train.c */
                free(ip), free(lp), free(tip), free(tlp);
                return trainer_ctr(cfg, loss_log, params_out, progress, ud, ret, err, errlen);
        }

        if ((r = dataset_load(ip, lp, &train, err, errlen)) < 0 || (r = dataset_load(tip, tlp, &test, err, errlen)) < 0)
                goto out;
        char msg[512];
        if ((r = device_backend_new(&cfg->device, t->threads, &be, msg, sizeof(msg))) < 0 ||
            (r = device_model_new(be, &cfg->model, t->batch_size, &m, msg, sizeof(msg))) < 0) {
                snprintf(err, errlen, "%s", msg);
                goto out;
        }
        if (model_input_size(m) != train->dim || dataset_max_label(train) >= model_n_classes(m)) {
                snprintf(err, errlen, "%s: examples of %u values with labels up to %u do not fit the model's input of %u and %u classes",
                         ip, train->dim, dataset_max_label(train), model_input_size(m), model_n_classes(m));
                r = -EINVAL;
                goto out;
        }
        /* the row blocks a distributed run computes in, so the arithmetic is the same */
        if ((r = job_layout_new(cfg, &L)) < 0 || (r = job_model_blocks(L, m, NULL)) < 0) {
                snprintf(err, errlen, "cannot lay out the variables: %s", strerror(-r));
                goto out;
        }
        if (!(it = calloc(W, sizeof(*it)))) {
                r = errf(err, errlen, -ENOMEM, "out of memory");
                goto out;
        }
        r = model_init_params(m, cfg->model.seed);
        for (uint32_t k = 0; k < W && r >= 0; k++)
                r = data_iter_new(train, k, W, t->seed, &it[k]);
        if (r < 0) {
                snprintf(err, errlen, "cannot initialize: %s", strerror(-r));
                goto out;
        }
        x = malloc((size_t)t->batch_size * train->dim * sizeof(float));
        y = malloc(t->batch_size);
        if (W > 1)
                sum = malloc(L->n_params * sizeof(float));
        if (!x || !y || (W > 1 && !sum) || trainer_apply_new(t, L, model_params(m), &ap) < 0) {
                r = -ENOMEM;
                snprintf(err, errlen, "out of memory");
                goto out;
        }
        const float *grads = model_grads(m);
        uint64_t warm = t->max_steps > 200 ? 20 : t->max_steps / 10;
        uint64_t t0 = mono_us(), tw = t0;
        for (uint64_t step = 0; step < t->max_steps; step++) {
                if (step == warm)
                        tw = mono_us();
                float loss = 0;
                for (uint32_t k = 0; k < W; k++) {
                        float l;
                        data_iter_next_batch(it[k], t->batch_size, x, y);
                        if ((r = model_forward(m, x, y, t->batch_size, &l, NULL)) < 0 ||
                            (r = model_backward(m, NULL, NULL)) < 0) {
                                snprintf(err, errlen, "step %llu: %s", (unsigned long long)step, strerror(-r));
                                goto out;
                        }
                        loss = k ? loss + l : l;
                        if (W > 1 && k == 0)
                                memcpy(sum, grads, L->n_params * sizeof(float));
                        else if (W > 1)
                                for (size_t i = 0; i < L->n_params; i++)
                                        sum[i] += grads[i];
                }
                if (W > 1) {
                        apply_scale(sum, L->n_params, 1.0f / (float)W);
                        loss /= (float)W;
                }
                trainer_apply_step(ap, W > 1 ? sum : grads);
                model_params_sync(m);
                if (loss_log)
                        trainer_log_loss(loss_log, step, loss);
                res.final_loss = loss;
                if (progress && (step + 1) % t->report_every_steps == 0) {
                        double s = (double)(mono_us() - tw) / 1e6;
                        progress(ud, step + 1, t->max_steps, loss,
                                 step + 1 > warm && s > 0 ? (double)(step + 1 - warm) * B / s : 0);
                }
        }
        uint64_t t1 = mono_us();
        res.steps = t->max_steps;
        res.wall_s = (double)(t1 - t0) / 1e6;
        res.examples_per_s = t1 > tw ? (double)(t->max_steps - warm) * B / ((double)(t1 - tw) / 1e6) : 0;
        if (params_out && (r = trainer_save_params(L, model_params(m), params_out, err, errlen)) < 0)
                goto out;
        float tl, ta;
        if ((r = model_evaluate(m, test->x, test->y, test->n, &tl, &ta)) < 0) {
                snprintf(err, errlen, "evaluation: %s", strerror(-r));
                goto out;
        }
        res.test_loss = tl;
        res.test_accuracy = ta;
        *ret = res;
        r = 0;
out:
        free(x);
        free(y);
        free(sum);
        trainer_apply_free(ap);
        for (uint32_t k = 0; it && k < W; k++)
                data_iter_free(it[k]);
        free(it);
        job_layout_free(L);
        dataset_free(train);
        dataset_free(test);
        model_free(m);
        backend_free(be);
        free(ip);
        free(lp);
        free(tip);
        free(tlp);
        return r;
}
