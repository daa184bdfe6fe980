/* chiefd's snapshots of the shards' values, all on the main thread: TensorBoard summaries, evaluations
 * on the test split, checkpoints (scheduled, requested, final) and restores from the newest one. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctr_train.h"
#include "chiefd-internal.h"
#include "chief_metrics.h"
#include "data.h"
#include "log.h"
#include "model.h"
#include "notify.h"
#include "ps_client.h"
#include "summary.h"
#include "util.h"

static void summary_failed(struct chief *c, int r) {
        log_warning_errno(r, "Cannot write summaries to \"%s\"; writing no more", summary_writer_path(c->sw));
        c->sw = summary_writer_free(c->sw);
}

static void write_scalars(struct chief *c, uint64_t step, const struct summary_scalar *v, size_t n) {
        if (!c->sw || !n)
                return;
        int r = summary_write_scalars(c->sw, step, now_us(), v, n);
        if (r >= 0)
                r = summary_flush(c->sw);
        if (r < 0)
                summary_failed(c, r);
}

void chief_session_log(struct chief *c, uint64_t step, int status, const char *path, const char *msg) {
        if (!c->sw)
                return;
        int r = summary_write_session_log(c->sw, step, now_us(), status, path, msg);
        if (r >= 0)
                r = summary_flush(c->sw);
        if (r < 0)
                summary_failed(c, r);
}

/* Every save_summaries_secs while the job runs: loss per worker and their mean, global_step/sec,
 * examples/sec, learning rate. */
void chief_maybe_write_summaries(struct chief *c) {
        const struct job_config *cfg = c->cfg;
        uint64_t t = mono_us();
        if (!c->sw || !cfg->supervisor.save_summaries_secs ||
            t - c->last_summary_mono < cfg->supervisor.save_summaries_secs * 1000000ULL)
                return;
        c->last_summary_mono = t;
        uint32_t W = cfg->cluster.n_worker;
        struct summary_scalar *v = calloc(W + 4, sizeof(*v));
        char (*tags)[32] = calloc(W ? W : 1, sizeof(*tags));
        if (!v || !tags) {
                free(v);
                free(tags);
                return;
        }
        size_t n = 0;
        pthread_mutex_lock(&c->st.lock);
        uint64_t gs = c->st.global_step;
        double sps = chief_steps_per_s_locked(&c->st);
        float loss = chief_loss_locked(&c->st);
        for (uint32_t w = 0; w < W; w++)
                if (c->st.workers[w].reported && isfinite(c->st.workers[w].loss)) {
                        chief_strfmt(tags[w], sizeof(tags[w]), "loss/worker_%u", w);
                        v[n++] = (struct summary_scalar){tags[w], c->st.workers[w].loss};
                }
        pthread_mutex_unlock(&c->st.lock);
        if (isfinite(loss))
                v[n++] = (struct summary_scalar){"loss", loss};
        v[n++] = (struct summary_scalar){"global_step/sec", (float)sps};
        v[n++] = (struct summary_scalar){"examples/sec", (float)(sps * (double)config_examples_per_step(cfg))};
        v[n++] = (struct summary_scalar){"learning_rate", (float)optim_learning_rate(&cfg->training, gs)};
        write_scalars(c, gs, v, n);
        free(v);
        free(tags);
}

/* Reads every shard into the model's block (and the slots when with_slots); *gs_ret from shard 0. */
int chief_pull(struct chief *c, bool with_slots, uint64_t *gs_ret, char *err, size_t errlen) {
        int r = ps_client_pull(c->pc, model_params(c->model), with_slots && c->n_slots ? c->slots : NULL, gs_ret, err,
                               errlen);
        if (r >= 0) {
                pthread_mutex_lock(&c->st.lock);
                if (*gs_ret > c->st.global_step)
                        c->st.global_step = *gs_ret;
                pthread_mutex_unlock(&c->st.lock);
        }
        return r;
}

/* Rows for the evaluation of a model with embeddings: read from the shards, none created. */
static int chief_lookup(void *ud, uint32_t e, const uint64_t *ids, size_t n, float *rows, char *err, size_t errlen) {
        struct chief *c = ud;
        return ps_client_sparse_lookup(c->pc, e, ids, n, rows, err, errlen);
}

/* Evaluates the pulled values on the test split; records and summarizes the result. Weights that blew
 * up or a test loss that is not finite are recorded as the model gone wrong (the main loop fails the
 * job) and return -EDOM. */
int chief_evaluate(struct chief *c, uint64_t gs, char *err, size_t errlen) {
        float loss, acc;
        char why[160], what[200];
        if (model_params_check(c->model, why, sizeof(why)) < 0) {
                chief_strfmt(what, sizeof(what), "weights blown up (%s)", why);
                goto diverged;
        }
        struct ctr_eval ev = {.auc = NAN, .rmse = NAN, .logloss = NAN};
        uint64_t n_test;
        int r = model_params_sync(c->model);
        if (r >= 0 && c->test) {
                r = model_evaluate(c->model, c->test->x, c->test->y, c->test->n, &loss, &acc);
                n_test = c->test->n;
        } else if (r >= 0) {
                char why2[600];
                r = ctr_evaluate(c->cfg, c->model, chief_lookup, c, &ev, why2, sizeof(why2));
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
        r = chief_db_add_evaluation(c->db, now_us(), gs, (uint32_t)n_test, loss, acc);
        if (r < 0)
                log_warning_errno(r, "Cannot record the evaluation in the database, continuing");
        pthread_mutex_lock(&c->st.lock);
        c->st.have_eval = true;
        c->st.eval_step = gs;
        c->st.eval_accuracy = acc;
        c->st.eval_loss = loss;
        c->st.eval_auc = ev.auc;
        c->st.eval_rmse = ev.rmse;
        pthread_mutex_unlock(&c->st.lock);
        c->last_eval_step = gs;
        if (c->cfg->model.head == HEAD_LOGISTIC) {
                const struct summary_scalar v[] = {{"eval/auc", (float)ev.auc}, {"eval/logloss", (float)ev.logloss},
                                                   {"eval/accuracy", acc}, {"eval/loss", loss}};
                write_scalars(c, gs, v, ELEMENTSOF(v));
                log_info_step(gs, "Evaluation at global_step %" PRIu64 ": test AUC %.4f, log loss %.4f, accuracy %.4f "
                              "(%" PRIu64 " examples)", gs, ev.auc, ev.logloss, (double)acc, n_test);
        } else if (c->cfg->model.head == HEAD_MSE) {
                const struct summary_scalar v[] = {{"eval/rmse", (float)ev.rmse}, {"eval/loss", loss}};
                write_scalars(c, gs, v, ELEMENTSOF(v));
                log_info_step(gs, "Evaluation at global_step %" PRIu64 ": test RMSE %.4f, loss %.4f (%" PRIu64
                              " examples)", gs, ev.rmse, (double)loss, n_test);
        } else {
                const struct summary_scalar v[] = {{"eval/accuracy", acc}, {"eval/loss", loss}};
                write_scalars(c, gs, v, ELEMENTSOF(v));
                log_info_step(gs, "Evaluation at global_step %" PRIu64 ": test accuracy %.4f, test loss %.4f (%" PRIu64
                              " examples)", gs, (double)acc, (double)loss, n_test);
        }
        return 0;
diverged:
        pthread_mutex_lock(&c->st.lock);
        chief_note_diverged_locked(&c->st, "the evaluation", what, gs);
        pthread_mutex_unlock(&c->st.lock);
        chief_strfmt(err, errlen, "the evaluation at global_step %" PRIu64 " found %s", gs, what);
        return -EDOM;
}

/* Every embedding table's rows, with their slots, from every shard into tables[0..n_embeddings)
 * (cleared by the caller, also on failure). */
static int export_tables(struct chief *c, struct ps_sparse_rows *tables, char *err, size_t errlen) {
        for (uint32_t e = 0; e < c->cfg->model.n_embeddings; e++) {
                int r = ps_client_sparse_export(c->pc, e, &tables[e], err, errlen);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Writes and records the pulled values (with the slots when pulled), and the embedding tables as the
 * shards hold them now, as the checkpoint of gs. A request at the step of the newest checkpoint returns
 * that one (*existing). */
int chief_save(struct chief *c, uint64_t gs, bool with_slots, const char *trigger, struct chief_db_checkpoint *ret,
                bool *existing, char *err, size_t errlen) {
        struct chief_db_checkpoint stats = {0};
        pthread_mutex_lock(&c->st.lock);
        bool same = c->st.have_ckpt && c->st.last_ckpt.global_step == gs;
        struct chief_db_checkpoint prev = c->st.last_ckpt;
        stats.loss = chief_loss_locked(&c->st);
        stats.eval_step = c->st.have_eval ? c->st.eval_step : 0;
        stats.eval_accuracy = c->st.have_eval ? c->st.eval_accuracy : -1;
        stats.eval_loss = c->st.have_eval ? c->st.eval_loss : -1;
        pthread_mutex_unlock(&c->st.lock);
        chief_strfmt(stats.trigger, sizeof(stats.trigger), "%s", trigger);
        if (existing)
                *existing = false;
        if (same && strcmp(trigger, "end") != 0) {
                /* Nothing moved since: the newest checkpoint holds these values. */
                c->last_save_mono = mono_us();
                if (existing)
                        *existing = true;
                if (ret)
                        *ret = prev;
                return 0;
        }
        struct chief_db_checkpoint row;
        uint64_t t0 = mono_us();
        /* the whole file is built in memory: the tables' rows are held here until it is written */
        struct ps_sparse_rows tables[MODEL_MAX_EMBEDDINGS] = {0};
        int r = export_tables(c, tables, err, errlen);
        if (r >= 0)
                r = chief_ckpt_save_tables(c->ckpts, model_params(c->model), with_slots && c->n_slots ? c->slots : NULL,
                                           c->cfg->model.n_embeddings ? tables : NULL, gs, &stats, &row, err, errlen);
        for (uint32_t e = 0; e < MODEL_MAX_EMBEDDINGS; e++)
                ps_sparse_rows_clear(&tables[e]);
        chief_metrics_checkpoint(r, mono_us() - t0, &row);
        pthread_mutex_lock(&c->st.lock);
        chief_strfmt(c->st.last_ckpt_error, sizeof(c->st.last_ckpt_error), "%s", r < 0 ? err : "");
        pthread_mutex_unlock(&c->st.lock);
        if (r < 0)
                return r;
        c->last_save_step = gs;
        c->last_save_mono = mono_us();
        chief_refresh_ckpt_info(&c->st);
        chief_session_log(c, gs, SUMMARY_SESSION_CHECKPOINT, row.path, NULL);
        log_info_step(gs, "Saved checkpoint \"%s\" at global_step %" PRIu64 " (%s): %" PRIu64 " bytes, %s", row.path, gs,
                      trigger, row.bytes, row.checksum);
        if (ret)
                *ret = row;
        return 0;
}

/* Scheduled checkpoints (save_checkpoint_steps, save_checkpoint_secs) and evaluations
 * (eval_every_steps), from one pull when both are due. A failure is logged and retried later. */
void chief_maybe_snapshot(struct chief *c) {
        const struct supervisor_config *sv = &c->cfg->supervisor;
        uint64_t t = mono_us();
        if (t < c->next_snapshot_try)
                return;
        pthread_mutex_lock(&c->st.lock);
        uint64_t gs = c->st.global_step;
        pthread_mutex_unlock(&c->st.lock);
        bool by_steps = sv->save_checkpoint_steps && gs >= c->last_save_step + sv->save_checkpoint_steps;
        bool by_secs = sv->save_checkpoint_secs && t - c->last_save_mono >= sv->save_checkpoint_secs * 1000000ULL;
        bool eval = sv->eval_every_steps && gs >= c->last_eval_step + sv->eval_every_steps;
        if (!by_steps && !by_secs && !eval)
                return;
        char err[1024];
        int r = chief_pull(c, by_steps || by_secs, &gs, err, sizeof(err));
        if (r >= 0 && eval)
                r = chief_evaluate(c, gs, err, sizeof(err));
        if (r >= 0 && (by_steps || by_secs))
                r = chief_save(c, gs, true, by_steps ? "steps" : "secs", NULL, NULL, err, sizeof(err));
        if (r < 0) {
                log_warning("Scheduled %s at global_step %" PRIu64 " failed: %s; retrying in %llu s",
                            by_steps || by_secs ? "checkpoint" : "evaluation", gs, err, SNAPSHOT_RETRY_US / 1000000);
                c->next_snapshot_try = t + SNAPSHOT_RETRY_US;
        }
}

/* SaveCheckpoint calls that wait: one checkpoint now answers them all. */
void chief_serve_saves(struct chief *c) {
        if (!chief_saves_pending(c))
                return;
        struct chief_db_checkpoint row;
        bool existing = false;
        char err[1024];
        uint64_t gs = 0;
        int r = chief_pull(c, true, &gs, err, sizeof(err));
        if (r >= 0)
                r = chief_save(c, gs, true, "request", &row, &existing, err, sizeof(err));
        if (r < 0)
                log_warning("Requested checkpoint failed: %s", err);
        chief_answer_saves(c, r, &row, existing, err);
}

/* "ps:1", "ps:0, ps:2", "every shard (3)" */
static void shard_list(const struct chief *c, const bool *which, char *buf, size_t len) {
        uint32_t n = 0, N = c->cfg->cluster.n_ps;
        for (uint32_t s = 0; s < N; s++)
                n += which[s];
        if (n == N && N > 1) {
                chief_strfmt(buf, len, "every shard (%u)", N);
                return;
        }
        buf[0] = 0;
        for (uint32_t s = 0; s < N; s++)
                if (which[s])
                        chief_strfmt(buf + strlen(buf), len - strlen(buf), "%sps:%u", buf[0] ? ", " : "", s);
}

int chief_import_tables(struct chief *c, const bool *which, const struct ps_sparse_rows *tables, uint64_t gs,
                        char *err, size_t errlen) {
        const struct job_config *cfg = c->cfg;
        int r = 0;
        for (uint32_t e = 0; e < cfg->model.n_embeddings && r >= 0; e++) {
                struct ps_sparse_rows none = {.dim = cfg->model.emb[e].dim,
                                              .n_slots = sparse_optimizer_n_slots(cfg->training.sparse_optimizer)};
                r = ps_client_sparse_import(c->pc, which, e, tables ? &tables[e] : &none, gs, err, errlen);
        }
        return r;
}

/* Restores the shards in which[] from the newest usable checkpoint. Returns 1 (restored), 0 (no
 * usable checkpoint: nothing done), -EINVAL (the checkpoints hold a different model: fatal) or
 * another -errno (assigning failed: retry); why says what happened. */
int chief_restore_shards(struct chief *c, const bool *which, char *why, size_t len) {
        char shards[128], err[1024];
        struct chief_db_checkpoint row;
        bool slots_loaded = false;
        shard_list(c, which, shards, sizeof(shards));
        chief_event(&c->st, &(struct chief_event){.kind = CHIEF_EV_RESTORE_LOOKING, .shards = shards,
                                             .where = chief_ckpt_dir(c->ckpts)});
        struct ps_sparse_rows tables[MODEL_MAX_EMBEDDINGS] = {0};
        int r = chief_ckpt_load_latest_tables(c->ckpts, model_params(c->model), c->n_slots ? c->slots : NULL,
                                              &slots_loaded, tables, &row, err, sizeof(err));
        chief_refresh_ckpt_info(&c->st);
        if (r <= 0) {
                chief_strfmt(why, len, "%s", r == 0 ? "no usable checkpoint" : err);
                return r;
        }
        chief_event(&c->st, &(struct chief_event){.kind = CHIEF_EV_RESTORE_FOUND, .shards = shards, .where = row.path,
                                             .step = row.global_step});
        notify_status("restoring %s from %s", shards, row.path);
        /* the tables first (each shard's emptied, then filled): the Assign that follows makes the shard
         * initialized, so no worker sees a restored shard's rows before they are back */
        r = chief_import_tables(c, which, tables, row.global_step, err, sizeof(err));
        if (r >= 0)
                r = ps_client_assign(c->pc, which, model_params(c->model), slots_loaded ? c->slots : NULL,
                                     row.global_step, err, sizeof(err));
        for (uint32_t e = 0; e < MODEL_MAX_EMBEDDINGS; e++)
                ps_sparse_rows_clear(&tables[e]);
        if (r < 0) {
                chief_strfmt(why, len, "restoring %s from \"%s\": %s", shards, row.path, err);
                return r == -EINVAL ? -EIO : r;
        }
        log_info_step(row.global_step, "Restored %s from checkpoint \"%s\" at global_step %" PRIu64 "%s", shards,
                      row.path, row.global_step, slots_loaded ? ", with the optimizer's slots" : "");
        pthread_mutex_lock(&c->st.lock);
        chief_forget_report_steps_locked(&c->st);
        c->st.restored_step = row.global_step;
        chief_strfmt(c->st.restored_from, sizeof(c->st.restored_from), "%s", row.path);
        if (which[0]) {
                /* global_step goes back to the checkpoint's: the rates start over. */
                c->st.global_step = row.global_step;
                c->st.n_samples = 0;
                c->st.sample_next = 0;
        }
        pthread_mutex_unlock(&c->st.lock);
        if (which[0]) {
                c->last_save_step = row.global_step;
                c->last_eval_step = row.global_step;
                chief_session_log(c, row.global_step, SUMMARY_SESSION_START, row.path, "restored");
        }
        c->last_save_mono = mono_us();
        return 1;
}
