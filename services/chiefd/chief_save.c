/* Pulls, checkpoints and restores of the shards' values; see chief_save.h. */
#include "chief_save.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "chief_ckpt.h"
#include "chief_eval.h"
#include "chief_metrics.h"
#include "chief_status.h"
#include "config.h"
#include "log.h"
#include "model.h"
#include "notify.h"
#include "ps_client.h"
#include "sparse_table.h"
#include "summary.h"
#include "util.h"

/* Reads every shard into the model's block (and the slots when with_slots); *gs_ret from shard 0. */
int chief_pull(struct chief_save *v, bool with_slots, uint64_t *gs_ret, char *err, size_t errlen) {
        int r = ps_client_pull(v->pc, model_params(v->model), with_slots && v->n_slots ? v->slots : NULL, gs_ret, err,
                               errlen);
        if (r >= 0) {
                pthread_mutex_lock(&v->st->lock);
                if (*gs_ret > v->st->global_step)
                        v->st->global_step = *gs_ret;
                pthread_mutex_unlock(&v->st->lock);
        }
        return r;
}

/* Where a table's pages go while a checkpoint is written. */
struct sink {
        struct chief_ckpt_writing *w;
        uint32_t e;
        bool incremental, lost;
};

static int sink_page(const struct ps_sparse_page *pg, void *ud, char *err, size_t errlen) {
        struct sink *k = ud;
        int r = pg->rows->n ? chief_ckpt_put_rows(k->w, k->e, pg->rows, err, errlen) : 0;
        if (r >= 0 && k->incremental) {
                if (pg->changes_lost)
                        k->lost = true;
                else if (pg->n_evicted)
                        r = chief_ckpt_put_evicted(k->w, k->e, pg->evicted, pg->n_evicted, err, errlen);
        }
        return r;
}

/* Writes the checkpoint of gs: the pulled dense values, and each table streamed from the shards page by
 * page into the file (never held whole here); with parent, only the rows changed since it and the ids
 * evicted since. -ESTALE when a shard cannot tell what changed (the caller writes a full one). */
static int write_checkpoint(struct chief_save *v, uint64_t gs, bool with_slots, const struct chief_db_checkpoint *parent,
                            const struct chief_db_checkpoint *stats, struct chief_db_checkpoint *row, char *err,
                            size_t errlen) {
        const struct job_config *cfg = v->cfg;
        bool track = cfg->supervisor.full_checkpoint_every > 1;
        struct chief_ckpt_writing *w;
        int r = chief_ckpt_begin(v->ckpts, model_params(v->model), with_slots && v->n_slots ? v->slots : NULL,
                                 cfg->model.n_embeddings > 0, gs, parent, &w, err, errlen);
        if (r < 0)
                return r;
        /* with tracking on, every walk takes the shards' marks, full ones too: the next increment holds
         * what changed since this checkpoint */
        const struct ps_sparse_export_opts o = {.dirty_only = parent != NULL, .clean = track, .take_evicted = track};
        for (uint32_t e = 0; e < cfg->model.n_embeddings && r >= 0; e++) {
                struct sink k = {w, e, parent != NULL, false};
                r = ps_client_sparse_export_pages(v->pc, e, &o, sink_page, &k, err, errlen);
                if (r >= 0 && k.lost)
                        r = errf(err, errlen, -ESTALE, "table %s: a shard lost track of its changes",
                                 cfg->model.emb[e].name);
        }
        if (r < 0) {
                chief_ckpt_abort(w);
                return r;
        }
        return chief_ckpt_commit(w, stats, row, err, errlen);
}

/* Writes and records the pulled values (with the slots when pulled), and the embedding tables as the
 * shards hold them now, as the checkpoint of gs. A request at the step of the newest checkpoint returns
 * that one (*existing). */
int chief_save(struct chief_save *v, uint64_t gs, bool with_slots, const char *trigger, struct chief_db_checkpoint *ret,
                bool *existing, char *err, size_t errlen) {
        struct chief_db_checkpoint stats = {0};
        pthread_mutex_lock(&v->st->lock);
        bool same = v->st->have_ckpt && v->st->last_ckpt.global_step == gs;
        struct chief_db_checkpoint prev = v->st->last_ckpt;
        stats.loss = chief_loss_locked(v->st);
        stats.eval_step = v->st->have_eval ? v->st->eval_step : 0;
        stats.eval_accuracy = v->st->have_eval ? v->st->eval_accuracy : -1;
        stats.eval_loss = v->st->have_eval ? v->st->eval_loss : -1;
        pthread_mutex_unlock(&v->st->lock);
        chief_strfmt(stats.trigger, sizeof(stats.trigger), "%s", trigger);
        if (existing)
                *existing = false;
        if (same && strcmp(trigger, "end") != 0) {
                /* Nothing moved since: the newest checkpoint holds these values. */
                v->last_save_mono = mono_us();
                if (existing)
                        *existing = true;
                if (ret)
                        *ret = prev;
                return 0;
        }
        struct chief_db_checkpoint row;
        uint64_t t0 = mono_us();
        /* every full_checkpoint_every-th one full, incremental ones chained between; never chained to a
         * checkpoint of this same step, which this one replaces */
        uint32_t every = v->cfg->supervisor.full_checkpoint_every;
        bool incremental = every > 1 && v->chain_ok && v->since_full + 1 < every && v->chain_last.global_step != gs &&
                           v->cfg->model.n_embeddings > 0;
        struct chief_db_checkpoint newest;
        if (incremental && (chief_ckpt_newest(v->ckpts, &newest, NULL) < 0 ||
                            newest.global_step != v->chain_last.global_step)) {
                /* the parent is no longer the newest record (deleted meanwhile): a chain on it would point nowhere */
                incremental = false;
        }
        int r = write_checkpoint(v, gs, with_slots, incremental ? &v->chain_last : NULL, &stats, &row, err, errlen);
        if (r == -ESTALE) {
                log_full(LOG_NOTICE, 0, gs, "%s; writing a full checkpoint instead of an incremental one", err);
                incremental = false;
                r = write_checkpoint(v, gs, with_slots, NULL, &stats, &row, err, errlen);
        }
        v->chain_ok = r >= 0;
        if (r >= 0) {
                v->chain_last = row;
                v->since_full = incremental ? v->since_full + 1 : 0;
        }
        chief_metrics_checkpoint(r, mono_us() - t0, &row);
        pthread_mutex_lock(&v->st->lock);
        chief_strfmt(v->st->last_ckpt_error, sizeof(v->st->last_ckpt_error), "%s", r < 0 ? err : "");
        pthread_mutex_unlock(&v->st->lock);
        if (r < 0)
                return r;
        v->last_save_step = gs;
        v->last_save_mono = mono_us();
        chief_refresh_ckpt_info(v->st);
        chief_session_log(v->ev, gs, SUMMARY_SESSION_CHECKPOINT, row.path, NULL);
        if (row.incremental)
                log_info_step(gs, "Saved incremental checkpoint \"%s\" at global_step %" PRIu64 " (%s), on global_step %"
                              PRIu64 ": %" PRIu64 " bytes, %s", row.path, gs, trigger, row.parent_step, row.bytes,
                              row.checksum);
        else
                log_info_step(gs, "Saved checkpoint \"%s\" at global_step %" PRIu64 " (%s): %" PRIu64 " bytes, %s",
                              row.path, gs, trigger, row.bytes, row.checksum);
        if (ret)
                *ret = row;
        return 0;
}

/* "ps:1", "ps:0, ps:2", "every shard (3)" */
static void shard_list(const struct chief_save *v, const bool *which, char *buf, size_t len) {
        uint32_t n = 0, N = v->cfg->cluster.n_ps;
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

int chief_import_tables(struct chief_save *v, const bool *which, const struct ps_sparse_rows *tables, uint64_t gs,
                        char *err, size_t errlen) {
        const struct job_config *cfg = v->cfg;
        int r = 0;
        for (uint32_t e = 0; e < cfg->model.n_embeddings && r >= 0; e++) {
                struct ps_sparse_rows none = {.dim = cfg->model.emb[e].dim,
                                              .n_slots = sparse_optimizer_n_slots(cfg->training.sparse_optimizer)};
                r = ps_client_sparse_import(v->pc, which, e, tables ? &tables[e] : &none, gs, err, errlen);
        }
        return r;
}

/* A restore's tables, streamed to the shards in which[] (struct chief_table_sink). */
struct restore_sink {
        struct chief_save *v;
        const bool *which;
        const uint64_t *keep_step;
        const char *shards;
        uint64_t gs;            /* the rows' last touch: the checkpoint's step, or *keep_step */
};

static void sink_begin(void *ud, const struct chief_db_checkpoint *row) {
        struct restore_sink *k = ud;
        chief_event(k->v->st, &(struct chief_event){.kind = CHIEF_EV_RESTORE_FOUND, .shards = k->shards,
                                                    .where = row->path, .step = row->global_step});
        notify_status("restoring %s from %s", k->shards, row->path);
        k->gs = k->keep_step ? *k->keep_step : row->global_step;
}

static int sink_part(void *ud, uint32_t e, const struct ps_sparse_rows *rows, const struct ps_sparse_import_opts *o,
                     char *err, size_t errlen) {
        struct restore_sink *k = ud;
        return ps_client_sparse_import_part(k->v->pc, k->which, e, rows, o, k->gs, err, errlen);
}

/* Restores the shards in which[] from the newest usable checkpoint; with keep_step, global_step and
 * the update counters are set to *keep_step instead of the checkpoint's (supervisor.recovery shard).
 * Returns 1 (restored), 0 (no usable checkpoint: nothing done), -EINVAL (the checkpoints hold a
 * different model: fatal) or another -errno (assigning failed: retry); why says what happened. */
static int restore(struct chief_save *v, const bool *which, const uint64_t *keep_step, char *why, size_t len) {
        char shards[128], err[1024];
        struct chief_db_checkpoint row;
        bool slots_loaded = false;
        shard_list(v, which, shards, sizeof(shards));
        chief_event(v->st, &(struct chief_event){.kind = CHIEF_EV_RESTORE_LOOKING, .shards = shards,
                                             .where = chief_ckpt_dir(v->ckpts)});
        /* the tables first, streamed as they are read (each shard's emptied, then filled): the Assign
         * that follows makes the shard initialized, so no worker sees a restored shard's rows before
         * they are back */
        struct restore_sink k = {.v = v, .which = which, .keep_step = keep_step, .shards = shards};
        struct chief_table_sink sink = {.begin = sink_begin, .part = sink_part, .ud = &k};
        int r = chief_ckpt_restore_latest(v->ckpts, model_params(v->model), v->n_slots ? v->slots : NULL,
                                          &slots_loaded, &sink, &row, err, sizeof(err));
        chief_refresh_ckpt_info(v->st);
        v->chain_ok = false;   /* the shards' change marks no longer describe the newest checkpoint */
        if (r < 0 && r != -EINVAL) {
                chief_strfmt(why, len, "restoring %s: %s", shards, err);
                return r;
        }
        if (r <= 0) {
                chief_strfmt(why, len, "%s", r == 0 ? "no usable checkpoint" : err);
                return r;
        }
        uint64_t gs = keep_step ? *keep_step : row.global_step;
        r = ps_client_assign(v->pc, which, model_params(v->model), slots_loaded ? v->slots : NULL, gs, err,
                             sizeof(err));
        if (r < 0) {
                chief_strfmt(why, len, "restoring %s from \"%s\": %s", shards, row.path, err);
                return r == -EINVAL ? -EIO : r;
        }
        log_info_step(gs, "Restored %s from checkpoint \"%s\" at global_step %" PRIu64 "%s%s", shards, row.path,
                      row.global_step, slots_loaded ? ", with the optimizer's slots" : "",
                      keep_step ? "; global_step kept" : "");
        pthread_mutex_lock(&v->st->lock);
        v->st->restored_step = row.global_step;
        chief_strfmt(v->st->restored_from, sizeof(v->st->restored_from), "%s", row.path);
        if (keep_step) {
                /* global_step did not go back: the rates and the schedule carry on */
                if (which[0] && *keep_step > v->st->global_step)
                        v->st->global_step = *keep_step;
                pthread_mutex_unlock(&v->st->lock);
                return 1;
        }
        chief_forget_report_steps_locked(v->st);
        if (which[0]) {
                /* global_step goes back to the checkpoint's: the rates start over. */
                v->st->global_step = row.global_step;
                v->st->n_samples = 0;
                v->st->sample_next = 0;
        }
        pthread_mutex_unlock(&v->st->lock);
        if (which[0]) {
                v->last_save_step = row.global_step;
                v->ev->last_eval_step = row.global_step;
                chief_session_log(v->ev, row.global_step, SUMMARY_SESSION_START, row.path, "restored");
        }
        v->last_save_mono = mono_us();
        return 1;
}

int chief_restore_shards(struct chief_save *v, const bool *which, char *why, size_t len) {
        return restore(v, which, NULL, why, len);
}

int chief_restore_shards_at(struct chief_save *v, const bool *which, uint64_t global_step, char *why, size_t len) {
        return restore(v, which, &global_step, why, len);
}
