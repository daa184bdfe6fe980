/* Evaluations on the test split and TensorBoard summaries; see chief_eval.h. */
#include "chief_eval.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chief_status.h"
#include "config.h"
#include "ctr_train.h"
#include "data.h"
#include "log.h"
#include "model.h"
#include "optim.h"
#include "ps_client.h"
#include "summary.h"
#include "util.h"

static void summary_failed(struct summary_writer **sw, int r) {
        log_warning_errno(r, "Cannot write summaries to \"%s\"; writing no more", summary_writer_path(*sw));
        *sw = summary_writer_free(*sw);
}

/* A failed write stops the summaries (*sw freed), not the job. */
static void write_scalars(struct summary_writer **sw, uint64_t step, const struct summary_scalar *v, size_t n) {
        if (!*sw || !n)
                return;
        int r = summary_write_scalars(*sw, step, now_us(), v, n);
        if (r >= 0)
                r = summary_flush(*sw);
        if (r < 0)
                summary_failed(sw, r);
}

void chief_session_log(struct chief_eval *e, uint64_t step, int status, const char *path, const char *msg) {
        if (!e->sw)
                return;
        int r = summary_write_session_log(e->sw, step, now_us(), status, path, msg);
        if (r >= 0)
                r = summary_flush(e->sw);
        if (r < 0)
                summary_failed(&e->sw, r);
}

/* Every save_summaries_secs while the job runs: loss per worker and their mean, global_step/sec,
 * examples/sec, learning rate. */
void chief_maybe_write_summaries(struct chief_eval *e) {
        const struct job_config *cfg = e->cfg;
        if (!e->sw || !cfg->supervisor.save_summaries_secs ||
            mono_us() - e->last_summary_mono < cfg->supervisor.save_summaries_secs * 1000000ULL)
                return;
        chief_write_summaries(e);
}

void chief_write_summaries(struct chief_eval *e) {
        const struct job_config *cfg = e->cfg;
        if (!e->sw || !cfg->supervisor.save_summaries_secs)
                return;
        e->last_summary_mono = mono_us();
        uint32_t W = cfg->cluster.n_worker;
        struct summary_scalar *v = calloc(W + 4, sizeof(*v));
        char (*tags)[32] = calloc(W ? W : 1, sizeof(*tags));
        if (!v || !tags) {
                free(v);
                free(tags);
                return;
        }
        size_t n = 0;
        pthread_mutex_lock(&e->st->lock);
        uint64_t gs = e->st->global_step;
        double sps = chief_steps_per_s_locked(e->st);
        float loss = chief_loss_locked(e->st);
        for (uint32_t w = 0; w < W; w++)
                if (e->st->workers[w].reported && isfinite(e->st->workers[w].loss)) {
                        chief_strfmt(tags[w], sizeof(tags[w]), "loss/worker_%u", w);
                        v[n++] = (struct summary_scalar){tags[w], e->st->workers[w].loss};
                }
        pthread_mutex_unlock(&e->st->lock);
        if (isfinite(loss))
                v[n++] = (struct summary_scalar){"loss", loss};
        v[n++] = (struct summary_scalar){"global_step/sec", (float)sps};
        v[n++] = (struct summary_scalar){"examples/sec", (float)(sps * (double)config_examples_per_step(cfg))};
        v[n++] = (struct summary_scalar){"learning_rate", (float)optim_learning_rate(&cfg->training, gs)};
        write_scalars(&e->sw, gs, v, n);
        free(v);
        free(tags);
}

/* Rows for the evaluation of a model with embeddings: read from the shards, none created. */
static int chief_lookup(void *ud, uint32_t e, const uint64_t *ids, size_t n, float *rows, char *err, size_t errlen) {
        struct chief_eval *ev = ud;
        return ps_client_sparse_lookup(ev->pc, e, ids, n, rows, err, errlen);
}

void chief_eval_summaries_open(const char *dir, struct summary_writer **ret) {
        char host[256] = "localhost";
        if (gethostname(host, sizeof(host) - 1) < 0 || !host[0])
                chief_strfmt(host, sizeof(host), "localhost");
        host[sizeof(host) - 1] = 0;
        int r = summary_writer_new(dir, now_us(), host, ret);
        if (r < 0)
                log_warning_errno(r, "Cannot create an event file in \"%s\"; no summaries", dir);
        else
                log_info("Summaries go to \"%s\"", summary_writer_path(*ret));
}

char *chief_job_path(const char *state_root, const char *job, const char *dir) {
        return dir[0] == '/' ? strdup(dir) : strdup_printf("%s/%s/%s", state_root, job, dir);
}

int chief_eval_load_test(const struct job_config *cfg, const struct model *model, struct dataset **ret, char *err,
                         size_t errlen) {
        int r = 0;
        *ret = NULL;
        if (cfg->data.format == DATA_IDX) {
                char *img = trainer_data_path(cfg, cfg->data.test_images);
                char *lab = trainer_data_path(cfg, cfg->data.test_labels);
                r = img && lab ? dataset_load(img, lab, ret, err, errlen) : -ENOMEM;
                if (r >= 0)   /* data that do not fit the model: a data error (exit 65), as a missing file */
                        r = dataset_fits(*ret, img, model_input_size(model), model_n_classes(model), err, errlen);
                if (r == -ENOMEM)
                        chief_strfmt(err, errlen, "out of memory");
                free(img);
                free(lab);
                if (r < 0)
                        *ret = dataset_free(*ret);
        } else if (cfg->data.n_test_files) {
                /* the test files are streamed at each evaluation; that they open is checked now */
                struct records_reader *rd = NULL;
                r = ctr_records_open(cfg, true, 0, 1, false, &rd, err, errlen);
                records_close(rd);
        }
        return r;
}

int chief_eval_run(const struct job_config *cfg, struct model *model, const struct dataset *test, ctr_lookup_fn lookup,
                   void *ud, struct chief_eval_result *res, char *err, size_t errlen) {
        char why[160];
        if (model_params_check(model, why, sizeof(why)) < 0) {
                chief_strfmt(err, errlen, "weights blown up (%s)", why);
                return -EDOM;
        }
        struct ctr_eval ev = {.auc = NAN, .rmse = NAN, .logloss = NAN};
        struct chief_eval_result x = {.auc = NAN, .rmse = NAN, .logloss = NAN};
        int r = model_params_sync(model);
        if (r >= 0 && test) {
                r = model_evaluate(model, test->x, test->y, test->n, &x.loss, &x.accuracy);
                x.n = test->n;
        } else if (r >= 0) {
                char why2[600];
                r = ctr_evaluate(cfg, model, lookup, ud, &ev, why2, sizeof(why2));
                if (r < 0) {
                        chief_strfmt(err, errlen, "evaluating on the test files: %s", why2);
                        return r;
                }
                if (ev.n == 0) {   /* no data.test_files: nothing to evaluate */
                        *res = x;
                        return 0;
                }
                x.loss = (float)ev.loss;
                x.accuracy = isnan(ev.accuracy) ? 0.0f : (float)ev.accuracy;
                x.auc = ev.auc;
                x.rmse = ev.rmse;
                x.logloss = ev.logloss;
                x.n = ev.n;
        }
        if (r < 0) {
                chief_strfmt(err, errlen, "evaluating on the test split: %s", strerror(-r));
                return r;
        }
        if (!isfinite(x.loss)) {
                chief_strfmt(err, errlen, "a non-finite test loss (%g)", (double)x.loss);
                return -EDOM;
        }
        *res = x;
        return 0;
}

void chief_eval_report(struct summary_writer **sw, const struct job_config *cfg, uint64_t gs,
                       const struct chief_eval_result *x) {
        if (cfg->model.head == HEAD_LOGISTIC) {
                const struct summary_scalar v[] = {{"eval/auc", (float)x->auc}, {"eval/logloss", (float)x->logloss},
                                                   {"eval/accuracy", x->accuracy}, {"eval/loss", x->loss}};
                write_scalars(sw, gs, v, ELEMENTSOF(v));
                log_info_step(gs, "Evaluation at global_step %" PRIu64 ": test AUC %.4f, log loss %.4f, accuracy %.4f "
                              "(%" PRIu64 " examples)", gs, x->auc, x->logloss, (double)x->accuracy, x->n);
        } else if (cfg->model.head == HEAD_MSE) {
                const struct summary_scalar v[] = {{"eval/rmse", (float)x->rmse}, {"eval/loss", x->loss}};
                write_scalars(sw, gs, v, ELEMENTSOF(v));
                log_info_step(gs, "Evaluation at global_step %" PRIu64 ": test RMSE %.4f, loss %.4f (%" PRIu64
                              " examples)", gs, x->rmse, (double)x->loss, x->n);
        } else {
                const struct summary_scalar v[] = {{"eval/accuracy", x->accuracy}, {"eval/loss", x->loss}};
                write_scalars(sw, gs, v, ELEMENTSOF(v));
                log_info_step(gs, "Evaluation at global_step %" PRIu64 ": test accuracy %.4f, test loss %.4f (%" PRIu64
                              " examples)", gs, (double)x->accuracy, (double)x->loss, x->n);
        }
}

/* Evaluates the pulled values on the test split; records and summarizes the result. Weights that blew
 * up or a test loss that is not finite are recorded as the model gone wrong (the main loop fails the
 * job) and return -EDOM. */
int chief_evaluate(struct chief_eval *e, uint64_t gs, char *err, size_t errlen) {
        struct chief_eval_result x;
        char what[200];
        int r = chief_eval_run(e->cfg, e->model, e->test, chief_lookup, e, &x, what, sizeof(what));
        if (r == -EDOM)
                goto diverged;
        if (r < 0) {
                chief_strfmt(err, errlen, "%s", what);
                return r;
        }
        if (x.n == 0)   /* no data.test_files: nothing to evaluate */
                return 0;
        r = chief_db_add_evaluation(e->db, now_us(), gs, (uint32_t)x.n, x.loss, x.accuracy);
        if (r < 0)
                log_warning_errno(r, "Cannot record the evaluation in the database, continuing");
        pthread_mutex_lock(&e->st->lock);
        e->st->have_eval = true;
        e->st->eval_step = gs;
        e->st->eval_accuracy = x.accuracy;
        e->st->eval_loss = x.loss;
        e->st->eval_auc = x.auc;
        e->st->eval_rmse = x.rmse;
        pthread_mutex_unlock(&e->st->lock);
        e->last_eval_step = gs;
        chief_eval_report(&e->sw, e->cfg, gs, &x);
        return 0;
diverged:
        pthread_mutex_lock(&e->st->lock);
        chief_note_diverged_locked(e->st, "the evaluation", what, gs);
        pthread_mutex_unlock(&e->st->lock);
        chief_strfmt(err, errlen, "the evaluation at global_step %" PRIu64 " found %s", gs, what);
        return -EDOM;
}
