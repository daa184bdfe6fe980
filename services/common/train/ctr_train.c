/* Models with embeddings: the pieces every node shares (ctr_train.h) and the standalone trainer. The
 * step: batch → unique ids → rows → pooled input → forward, backward (with the input's gradient) →
 * the rows' gradients applied to the tables, the dense ones as trainer_apply does. */
#include "ctr_train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "binmetrics.h"
#include "ctr.h"
#include "device.h"
#include "job.h"
#include "optim.h"
#include "sparse_opts.h"
#include "util.h"

static enum records_format records_format_of(enum data_format f) {
        return f == DATA_LIBSVM ? RECORDS_LIBSVM : f == DATA_CRITEO ? RECORDS_CRITEO : f == DATA_TFRECORD ? RECORDS_TFRECORD
                                                                                               : RECORDS_CSV;
}

int ctr_records_open(const struct job_config *cfg, bool test, uint32_t k, uint32_t W, bool loop,
                     struct records_reader **ret, char *err, size_t errlen) {
        const struct data_config *d = &cfg->data;
        uint32_t n = test ? d->n_test_files : d->n_train_files;
        char *const *names = test ? d->test_files : d->train_files;
        char **paths = calloc(n ? n : 1, sizeof(*paths));
        int r = 0;

        if (!paths)
                return errf(err, errlen, -ENOMEM, "out of memory");
        for (uint32_t i = 0; i < n && r == 0; i++)
                if (!(paths[i] = trainer_data_path(cfg, names[i])))
                        r = errf(err, errlen, -ENOMEM, "out of memory");
        if (r == 0) {
                struct records_opts o = {
                        .format = records_format_of(d->format),
                        .files = (const char *const *)paths,
                        .n_files = n,
                        .worker = k,
                        .n_workers = W,
                        .n_dense = d->csv_features,
                        .max_ids = d->max_ids_per_example,
                        .skip_bad = d->bad_lines == BAD_LINES_SKIP,
                        .loop = loop,
                        .shuffle = test ? 0 : d->shuffle_buffer,   /* evaluation reads in order */
                        .seed = cfg->training.seed,
                        .tfrecord = &d->tfrecord,
                };
                r = records_open(&o, ret, err, errlen);
        }
        for (uint32_t i = 0; i < n; i++)
                free(paths[i]);
        free(paths);
        return r;
}

/* ---- one forward (and backward) of the dense layers on a batch of records ---- */

struct ctr_step *ctr_step_free(struct ctr_step *s) {
        if (!s)
                return NULL;
        records_batch_free(s->b);
        ctr_free(s->c);
        free(s);   /* and x, y8 */
        return NULL;
}

int ctr_step_new(const struct job_config *cfg, const struct records_reader *rd, uint32_t cap, struct ctr_step **ret) {
        struct records_batch *b = NULL;
        struct ctr *c = NULL;
        int r;
        if ((r = records_batch_new(cap, records_n_dense(rd), records_n_fields(rd), cfg->data.max_ids_per_example,
                                   &b)) < 0 ||
            (r = ctr_new(&cfg->model, cap, cfg->data.max_ids_per_example, &c)) < 0)
                goto fail;
        /* the step and its inputs in one block */
        size_t nx = (size_t)cap * ctr_width(c);
        struct ctr_step *s = malloc(sizeof(*s) + nx * sizeof(float) + cap);
        if (!s) {
                r = -ENOMEM;
                goto fail;
        }
        *s = (struct ctr_step){.b = b, .c = c, .x = (float *)(s + 1)};
        s->y8 = (uint8_t *)(s->x + nx);
        *ret = s;
        return 0;
fail:
        ctr_free(c);
        records_batch_free(b);
        return r;
}

int ctr_step_forward(const struct job_config *cfg, struct ctr_step *s, struct model *m, float *loss,
                     uint32_t *correct, model_block_cb before, void *ud) {
        const struct records_batch *b = s->b;

        ctr_input(s->c, b, s->x);
        if (cfg->model.head != HEAD_SOFTMAX)
                return model_forward_f_blocks(m, s->x, b->label, b->n, loss, correct, before, ud);
        for (uint32_t i = 0; i < b->n; i++) {
                float l = b->label[i];
                if (!(l >= 0 && l < (float)model_n_classes(m) && l == floorf(l)))
                        return -EDOM;
                s->y8[i] = (uint8_t)l;
        }
        return model_forward_blocks(m, s->x, s->y8, b->n, loss, correct, before, ud);
}

/* ---- evaluation ---- */

int ctr_evaluate(const struct job_config *cfg, struct model *m, ctr_lookup_fn lookup, void *ud,
                 struct ctr_eval *ret, char *err, size_t errlen) {
        struct ctr_eval ev = {.auc = NAN, .logloss = NAN, .rmse = NAN, .accuracy = NAN};
        struct records_reader *rd = NULL;
        struct ctr_step *s = NULL;
        struct binmetrics *bm = NULL;
        double loss_sum = 0;
        uint64_t correct = 0;
        int r;

        if (cfg->data.n_test_files == 0) {
                *ret = ev;
                return 0;
        }
        if ((r = ctr_records_open(cfg, true, 0, 1, false, &rd, err, errlen)) < 0)
                return r;
        if ((r = ctr_step_new(cfg, rd, model_max_batch(m), &s)) < 0 || (r = binmetrics_new(1 << 16, &bm)) < 0) {
                errf(err, errlen, r, "out of memory");
                goto out;
        }
        model_set_training(m, false);
        while ((r = records_next(rd, s->b, err, errlen)) > 0) {
                float loss;
                uint32_t ok = 0;
                if ((r = ctr_gather(s->c, s->b)) < 0) {
                        errf(err, errlen, r, "the test records do not fit the model");
                        goto out;
                }
                for (uint32_t e = 0; e < cfg->model.n_embeddings && r >= 0; e++)
                        r = lookup(ud, e, ctr_unique(s->c, e), ctr_n_unique(s->c, e), ctr_rows(s->c, e), err, errlen);
                if (r < 0)
                        goto out;
                if ((r = ctr_step_forward(cfg, s, m, &loss, &ok, NULL, NULL)) < 0) {
                        errf(err, errlen, r, r == -EDOM ? "a test label is not a class index of the model"
                                                       : "evaluating: %s", strerror(-r));
                        goto out;
                }
                loss_sum += (double)loss * s->b->n;
                correct += ok;
                ev.n += s->b->n;
                if (cfg->model.head != HEAD_SOFTMAX && (r = binmetrics_add(bm, model_outputs(m), s->b->label, s->b->n)) < 0) {
                        errf(err, errlen, r, "out of memory");
                        goto out;
                }
        }
        if (r < 0)
                goto out;
        ev.loss = ev.n ? loss_sum / (double)ev.n : NAN;
        if (cfg->model.head == HEAD_MSE) {
                ev.rmse = binmetrics_rmse(bm);
        } else {
                ev.accuracy = ev.n ? (double)correct / (double)ev.n : NAN;
                if (cfg->model.head == HEAD_LOGISTIC) {
                        ev.auc = binmetrics_auc(bm);
                        ev.logloss = binmetrics_logloss(bm);
                }
        }
        *ret = ev;
        r = 0;
out:
        if (s)
                model_set_training(m, true);
        binmetrics_free(bm);
        ctr_step_free(s);
        records_close(rd);
        return r;
}

/* ---- the standalone trainer ---- */

struct local_tables {
        uint32_t n;
        struct sparse_table *t[MODEL_MAX_EMBEDDINGS];
};

static int local_lookup(void *ud, uint32_t e, const uint64_t *ids, size_t n, float *rows, char *err, size_t errlen) {
        struct local_tables *lt = ud;
        int r = sparse_table_pull(lt->t[e], ids, n, rows, false, 0);
        return r < 0 ? errf(err, errlen, r, "embedding table %u: %s", e, strerror(-r)) : 0;
}

int trainer_ctr(const struct job_config *cfg, FILE *loss_log, const char *params_out, trainer_progress_cb progress,
                void *ud, struct trainer_result *ret, char *err, size_t errlen) {
        const struct training_config *t = &cfg->training;
        struct local_tables lt = {.n = cfg->model.n_embeddings};
        struct records_reader *rd = NULL;
        struct ctr_step *s = NULL;
        struct backend *be = NULL;
        struct model *m = NULL;
        struct job_layout *L = NULL;
        struct trainer_apply *ap = NULL;
        struct trainer_result res = {0};
        char msg[512];
        int r;

        if (cfg->training.mode == MODE_SYNC && cfg->cluster.n_worker > 1)
                return errf(err, errlen, -EOPNOTSUPP, "the standalone trainer runs models with embeddings as one "
                            "worker: training.mode sync with %u workers is not supported", cfg->cluster.n_worker);
        if ((r = ctr_records_open(cfg, false, 0, 1, true, &rd, err, errlen)) < 0)
                return r;
        for (uint32_t e = 0; e < lt.n; e++) {
                struct sparse_table_opts o;
                sparse_table_opts_from_config(cfg, e, &o);
                if ((r = sparse_table_new(&o, &lt.t[e])) < 0) {
                        errf(err, errlen, r, "embedding table %s: %s", cfg->model.emb[e].name, strerror(-r));
                        goto out;
                }
        }
        if ((r = device_backend_new(&cfg->device, t->threads, &be, msg, sizeof(msg))) < 0 ||
            (r = device_model_new(be, &cfg->model, t->batch_size, &m, msg, sizeof(msg))) < 0) {
                errf(err, errlen, r, "%s", msg);
                goto out;
        }
        if ((r = job_layout_new(cfg, &L)) < 0 || (r = model_init_params(m, cfg->model.seed)) < 0 ||
            (r = model_set_input_grad(m, true)) < 0 || (r = ctr_step_new(cfg, rd, t->batch_size, &s)) < 0 ||
            (r = trainer_apply_new(t, L, model_params(m), &ap)) < 0) {
                errf(err, errlen, r, "cannot set up the model: %s", strerror(-r));
                goto out;
        }
        uint64_t warm = t->max_steps > 200 ? 20 : t->max_steps / 10;
        uint64_t t0 = mono_us(), tw = t0;
        for (uint64_t step = 0; step < t->max_steps; step++) {
                float loss;
                if (step == warm)
                        tw = mono_us();
                if ((r = records_next(rd, s->b, err, errlen)) < 0)
                        goto out;
                if ((r = ctr_gather(s->c, s->b)) < 0) {
                        errf(err, errlen, r, "the records do not fit the model");
                        goto out;
                }
                for (uint32_t e = 0; e < lt.n && r >= 0; e++)
                        r = sparse_table_pull(lt.t[e], ctr_unique(s->c, e), ctr_n_unique(s->c, e), ctr_rows(s->c, e),
                                              true, step);
                if (r >= 0 && (r = ctr_step_forward(cfg, s, m, &loss, NULL, NULL, NULL)) >= 0)
                        r = model_backward(m, NULL, NULL);
                if (r < 0) {
                        errf(err, errlen, r, "step %llu: %s", (unsigned long long)step,
                             r == -EDOM ? "a label is not a class index of the model" : strerror(-r));
                        goto out;
                }
                ctr_row_grads(s->c, s->b, model_input_grad(m));
                float lr = sparse_learning_rate(cfg, step);
                for (uint32_t e = 0; e < lt.n && r >= 0; e++)
                        r = sparse_table_push(lt.t[e], ctr_unique(s->c, e), ctr_n_unique(s->c, e), ctr_grads(s->c, e),
                                              lr, step);
                if (r < 0) {
                        errf(err, errlen, r, "step %llu: the embedding tables: %s", (unsigned long long)step,
                             strerror(-r));
                        goto out;
                }
                trainer_apply_step(ap, model_grads(m));
                model_params_sync(m);
                for (uint32_t e = 0; e < lt.n; e++)
                        if (cfg->model.emb[e].evict_after_steps && step % 1000 == 999)
                                sparse_table_evict(lt.t[e], step, cfg->model.emb[e].evict_after_steps);
                if (loss_log)
                        trainer_log_loss(loss_log, step, loss);
                res.final_loss = loss;
                if (progress && (step + 1) % t->report_every_steps == 0) {
                        double sec = (double)(mono_us() - tw) / 1e6;
                        progress(ud, step + 1, t->max_steps, loss,
                                 step + 1 > warm && sec > 0 ? (double)(step + 1 - warm) * t->batch_size / sec : 0);
                }
        }
        uint64_t t1 = mono_us();
        res.steps = t->max_steps;
        res.wall_s = (double)(t1 - t0) / 1e6;
        res.examples_per_s = t1 > tw ? (double)(t->max_steps - warm) * t->batch_size / ((double)(t1 - tw) / 1e6) : 0;
        if (params_out && (r = trainer_save_params(L, model_params(m), params_out, err, errlen)) < 0)
                goto out;
        struct ctr_eval ev;
        if ((r = ctr_evaluate(cfg, m, local_lookup, &lt, &ev, err, errlen)) < 0)
                goto out;
        res.test_examples = ev.n;
        res.test_loss = ev.loss;
        res.test_accuracy = ev.accuracy;
        res.test_auc = ev.auc;
        res.test_logloss = ev.logloss;
        res.test_rmse = ev.rmse;
        *ret = res;
        r = 0;
out:
        trainer_apply_free(ap);
        ctr_step_free(s);
        job_layout_free(L);
        model_free(m);
        backend_free(be);
        for (uint32_t e = 0; e < lt.n; e++)
                sparse_table_free(lt.t[e]);
        records_close(rd);
        return r;
}
