/* Evaluations on the test split and TensorBoard summaries; see chief_eval.h. */
#include "chief_eval.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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

static void summary_failed(struct chief_eval *e, int r) {
        log_warning_errno(r, "Cannot write summaries to \"%s\"; writing no more", summary_writer_path(e->sw));
        e->sw = summary_writer_free(e->sw);
}

static void write_scalars(struct chief_eval *e, uint64_t step, const struct summary_scalar *v, size_t n) {
        if (!e->sw || !n)
                return;
        int r = summary_write_scalars(e->sw, step, now_us(), v, n);
        if (r >= 0)
                r = summary_flush(e->sw);
        if (r < 0)
                summary_failed(e, r);
}

void chief_session_log(struct chief_eval *e, uint64_t step, int status, const char *path, const char *msg) {
        if (!e->sw)
                return;
        int r = summary_write_session_log(e->sw, step, now_us(), status, path, msg);
        if (r >= 0)
                r = summary_flush(e->sw);
        if (r < 0)
                summary_failed(e, r);
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
        write_scalars(e, gs, v, n);
        free(v);
        free(tags);
}

/* Rows for the evaluation of a model with embeddings: read from the shards, none created. */
static int chief_lookup(void *ud, uint32_t e, const uint64_t *ids, size_t n, float *rows, char *err, size_t errlen) {
        struct chief_eval *ev = ud;
        return ps_client_sparse_lookup(ev->pc, e, ids, n, rows, err, errlen);
}

/* Evaluates the pulled values on the test split; records and summarizes the result. Weights that blew
 * up or a test loss that is not finite are recorded as the model gone wrong (the main loop fails the
 * job) and return -EDOM. */
int chief_evaluate(struct chief_eval *e, uint64_t gs, char *err, size_t errlen) {
        float loss, acc;
        char why[160], what[200];
        if (model_params_check(e->model, why, sizeof(why)) < 0) {
                chief_strfmt(what, sizeof(what), "weights blown up (%s)", why);
                goto diverged;
        }
        struct ctr_eval ev = {.auc = NAN, .rmse = NAN, .logloss = NAN};
        uint64_t n_test;
        int r = model_params_sync(e->model);
        if (r >= 0 && e->test) {
                r = model_evaluate(e->model, e->test->x, e->test->y, e->test->n, &loss, &acc);
                n_test = e->test->n;
        } else if (r >= 0) {
                char why2[600];
                r = ctr_evaluate(e->cfg, e->model, chief_lookup, e, &ev, why2, sizeof(why2));
                if (r < 0) {
                        chief_strfmt(err, errlen, "evaluating on the test files: %s", why2);
                        return r;
                }
                if (ev.n == 0)   /* no data.test_files: nothing to evaluate */
                        return 0;
                loss = (float)ev.loss;
                acc = isnan(ev.accuracy) ? 0.0f : (float)ev.accuracy;
                n_test = ev.n;
        }
        if (r < 0) {
                chief_strfmt(err, errlen, "evaluating on the test split: %s", strerror(-r));
                return r;
        }
        if (!isfinite(loss)) {
                chief_strfmt(what, sizeof(what), "a non-finite test loss (%g)", (double)loss);
                goto diverged;
        }
        r = chief_db_add_evaluation(e->db, now_us(), gs, (uint32_t)n_test, loss, acc);
        if (r < 0)
                log_warning_errno(r, "Cannot record the evaluation in the database, continuing");
        pthread_mutex_lock(&e->st->lock);
        e->st->have_eval = true;
        e->st->eval_step = gs;
        e->st->eval_accuracy = acc;
        e->st->eval_loss = loss;
        e->st->eval_auc = ev.auc;
        e->st->eval_rmse = ev.rmse;
        pthread_mutex_unlock(&e->st->lock);
        e->last_eval_step = gs;
        if (e->cfg->model.head == HEAD_LOGISTIC) {
                const struct summary_scalar v[] = {{"eval/auc", (float)ev.auc}, {"eval/logloss", (float)ev.logloss},
                                                   {"eval/accuracy", acc}, {"eval/loss", loss}};
                write_scalars(e, gs, v, ELEMENTSOF(v));
                log_info_step(gs, "Evaluation at global_step %" PRIu64 ": test AUC %.4f, log loss %.4f, accuracy %.4f "
                              "(%" PRIu64 " examples)", gs, ev.auc, ev.logloss, (double)acc, n_test);
        } else if (e->cfg->model.head == HEAD_MSE) {
                const struct summary_scalar v[] = {{"eval/rmse", (float)ev.rmse}, {"eval/loss", loss}};
                write_scalars(e, gs, v, ELEMENTSOF(v));
                log_info_step(gs, "Evaluation at global_step %" PRIu64 ": test RMSE %.4f, loss %.4f (%" PRIu64
                              " examples)", gs, ev.rmse, (double)loss, n_test);
        } else {
                const struct summary_scalar v[] = {{"eval/accuracy", acc}, {"eval/loss", loss}};
                write_scalars(e, gs, v, ELEMENTSOF(v));
                log_info_step(gs, "Evaluation at global_step %" PRIu64 ": test accuracy %.4f, test loss %.4f (%" PRIu64
                              " examples)", gs, (double)acc, (double)loss, n_test);
        }
        return 0;
diverged:
        pthread_mutex_lock(&e->st->lock);
        chief_note_diverged_locked(e->st, "the evaluation", what, gs);
        pthread_mutex_unlock(&e->st->lock);
        chief_strfmt(err, errlen, "the evaluation at global_step %" PRIu64 " found %s", gs, what);
        return -EDOM;
}
