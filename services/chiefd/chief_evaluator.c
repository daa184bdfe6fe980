/* chiefd --evaluator: TF_CONFIG's evaluator task, as TensorFlow's evaluator is. It asks the chief for
 * new checkpoints (ListCheckpoints, as the evaluator of the job's certificate), reads each from the
 * job's state directory (shared storage, as TensorFlow's model_dir; its chain when incremental, every
 * file checked against its row), evaluates it on the test split with the chief's own evaluation
 * (chief_eval_run: the same numbers for the same values) and writes its scalars into its own event
 * file, <summary_dir>/eval. It exits once the job has ended and its last checkpoint is evaluated.
 *
 * One thread; every wait is bounded: the chief is waited for up to supervisor.ready_timeout_secs (exit
 * 75 past it). A chief that is gone after the end (psfleet run ends it with the job) is read from its
 * record, chief.db, read-only, as `psfleet checkpoints` reads a chief that is down. */
#include "chief_evaluator.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "backend.h"
#include "chief_ckpt.h"
#include "chief_db.h"
#include "chief_eval.h"
#include "chief_status.h"
#include "daemon.h"
#include "data.h"
#include "job.h"
#include "log.h"
#include "model.h"
#include "notify.h"
#include "rpc.h"
#include "sparse_opts.h"
#include "sparse_table.h"
#include "summary.h"
#include "util.h"
#include "psfleet/v1/supervisor.pb-c.h"

#define EVAL_POLL_US (1000 * 1000ULL)        /* between two looks at the chief's checkpoints */
#define EVAL_CALL_MS 5000
/* GetStatus waits for the channel to be ready this long: a process that serves nothing has no other
 * thread driving gRPC's reconnection, so a call that fails at once would never see the chief come. */
#define EVAL_CONNECT_MS 2000
#define EVAL_WAIT_LOG_US (30 * 1000000ULL)   /* a wait's reason again, while it lasts */
#define EVAL_TRIES 10                        /* looks at a checkpoint that cannot be read (I/O) before it is skipped */

struct evaluator {
        const struct job_config *cfg;
        struct backend *be;
        struct model *model;
        struct job_layout *L;
        struct dataset *test;             /* idx; NULL: the test files are streamed */
        struct chief_ckpt *ckpts;         /* no database: it reads files, records nothing */
        char *ckpt_dir, *db_path;
        struct summary_writer *sw;        /* NULL when summaries are off or failed */
        struct rpc_channel *chief;
        struct sparse_table *tables[MODEL_MAX_EMBEDDINGS];   /* the evaluated checkpoint's rows */
        bool have_last;
        uint64_t last_step;               /* the newest checkpoint evaluated (or found unreadable) */
        uint32_t n_evaluated;
        uint32_t tries;                   /* failed looks at the next checkpoint in a row */
};

/* What the chief says: the job's state and its checkpoints, newest first. */
struct chief_view {
        int state;                        /* Psfleet__V1__JobState */
        struct chief_db_checkpoint *rows;
        size_t n;
        bool from_record;                 /* read from chief.db: the chief is gone */
};

static bool state_ended(int s) {
        return s == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE || s == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED ||
               s == PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPED;
}

static struct evaluator *evaluator_free(struct evaluator *e) {
        if (!e)
                return NULL;
        rpc_channel_free(e->chief);
        summary_writer_free(e->sw);
        chief_ckpt_free(e->ckpts);
        for (uint32_t t = 0; t < MODEL_MAX_EMBEDDINGS; t++)
                sparse_table_free(e->tables[t]);
        dataset_free(e->test);
        job_layout_free(e->L);
        model_free(e->model);
        backend_free(e->be);
        free(e->ckpt_dir);
        free(e->db_path);
        free(e);
        return NULL;
}

/* Everything but the first call. Logs what failed; returns -errno (-EBADMSG: the test split). */
static int evaluator_new(const struct job_config *cfg, const char *state_root, struct evaluator **ret) {
        struct evaluator *e = calloc(1, sizeof(*e));
        char err[1024];
        int r;
        if (!e)
                return log_error_errno(-ENOMEM, "Cannot allocate the evaluator");
        e->cfg = cfg;
        /* the chief's model, backend and batch: the same arithmetic, so the same figures */
        r = backend_cpu_new(cfg->training.threads, &e->be);
        if (r >= 0)
                r = model_new(&cfg->model, e->be, CHIEF_EVAL_BATCH, &e->model);
        if (r >= 0)
                r = job_layout_new(cfg, &e->L);
        if (r < 0) {
                log_error_errno(r, "Cannot build the model");
                goto fail;
        }
        r = chief_eval_load_test(cfg, e->model, &e->test, err, sizeof(err));
        if (r < 0) {
                log_error("Cannot load the test split: %s", err);
                goto fail;
        }
        e->ckpt_dir = chief_job_path(state_root, cfg->name, cfg->supervisor.checkpoint_dir);
        char *job_dir = strdup_printf("%s/%s", state_root, cfg->name);
        e->db_path = job_dir ? strdup_printf("%s/chief.db", job_dir) : NULL;
        char *sum_dir = chief_job_path(state_root, cfg->name, cfg->supervisor.summary_dir);
        char *eval_dir = sum_dir ? strdup_printf("%s/eval", sum_dir) : NULL;
        free(job_dir);
        free(sum_dir);
        if (!e->ckpt_dir || !e->db_path || !eval_dir) {
                free(eval_dir);
                r = log_error_errno(-ENOMEM, "Cannot allocate the evaluator");
                goto fail;
        }
        struct chief_ckpt_config cc = {.dir = e->ckpt_dir, .L = e->L, .model = &cfg->model,
                                       .sparse_optimizer = cfg->training.sparse_optimizer, .job = cfg->name,
                                       .fingerprint = config_fingerprint(cfg), .keep = 1};
        r = chief_ckpt_new(NULL, &cc, &e->ckpts, err, sizeof(err));
        if (r < 0) {
                free(eval_dir);
                log_error_errno(r, "%s", err);
                goto fail;
        }
        for (uint32_t t = 0; t < cfg->model.n_embeddings; t++) {
                struct sparse_table_opts o;
                sparse_table_opts_from_config(cfg, t, &o);
                o.max_rows = 0;   /* a checkpoint's rows, all of them; none is made by a lookup */
                if ((r = sparse_table_new(&o, &e->tables[t])) < 0) {
                        free(eval_dir);
                        log_error_errno(r, "Cannot set up embedding table \"%s\"", cfg->model.emb[t].name);
                        goto fail;
                }
        }
        if (cfg->supervisor.save_summaries_secs)
                chief_eval_summaries_open(eval_dir, &e->sw);
        free(eval_dir);
        r = rpc_channel_new(cfg->cluster.chief[0].addr, "chief", &e->chief);
        if (r < 0) {
                log_error_errno(r, "Cannot create a channel to the chief (%s)", cfg->cluster.chief[0].addr);
                goto fail;
        }
        *ret = e;
        return 0;
fail:
        evaluator_free(e);
        return r;
}

/* Rows of an embedding table through the tables of the evaluated checkpoint; an id it does not hold
 * gives its initial row, as a shard's lookup does. */
static int table_lookup(void *ud, uint32_t t, const uint64_t *ids, size_t n, float *rows, char *err, size_t errlen) {
        struct evaluator *e = ud;
        int r = sparse_table_pull(e->tables[t], ids, n, rows, false, 0);
        return r < 0 ? errf(err, errlen, r, "embedding table %s: %s", e->cfg->model.emb[t].name, strerror(-r)) : 0;
}

/* A Checkpoint message as a row; the file is looked for in this evaluator's checkpoint directory (the
 * shared one may be mounted elsewhere than on the chief's host). */
static void row_of(const struct evaluator *e, const Psfleet__V1__Checkpoint *m, struct chief_db_checkpoint *row) {
        const char *slash = strrchr(m->path, '/');
        *row = (struct chief_db_checkpoint){.global_step = m->global_step, .time_us = m->time_us, .bytes = m->bytes,
                                            .loss = m->loss, .eval_step = m->eval_step,
                                            .eval_accuracy = m->eval_accuracy, .eval_loss = m->eval_loss,
                                            .incremental = m->incremental, .parent_step = m->parent_step};
        chief_strfmt(row->path, sizeof(row->path), "%s/%s", e->ckpt_dir, slash ? slash + 1 : m->path);
        chief_strfmt(row->checksum, sizeof(row->checksum), "%s", m->checksum);
        chief_strfmt(row->trigger, sizeof(row->trigger), "%s", m->trigger);
}

/* GetStatus, then ListCheckpoints: a job seen ended has its last checkpoint in the list. Returns 0 and
 * *v (rows malloc'd), or -errno with err. */
static int ask_chief(struct evaluator *e, struct chief_view *v, char *err, size_t errlen) {
        Psfleet__V1__StatusRequest sq = PSFLEET__V1__STATUS_REQUEST__INIT;
        Psfleet__V1__ListCheckpointsRequest lq = PSFLEET__V1__LIST_CHECKPOINTS_REQUEST__INIT;
        ProtobufCMessage *sm = NULL, *lm = NULL;
        int r = rpc_call_msg(e->chief, "/psfleet.v1.Supervisor/GetStatus", &sq.base, &psfleet__v1__job_status__descriptor,
                             EVAL_CONNECT_MS, true, &sm, err, errlen);
        if (r >= 0)
                r = rpc_call_msg(e->chief, "/psfleet.v1.Supervisor/ListCheckpoints", &lq.base,
                                 &psfleet__v1__list_checkpoints_reply__descriptor, EVAL_CALL_MS, false, &lm, err, errlen);
        if (r >= 0) {
                const Psfleet__V1__ListCheckpointsReply *l = (const Psfleet__V1__ListCheckpointsReply *)lm;
                *v = (struct chief_view){.state = ((const Psfleet__V1__JobStatus *)sm)->state, .n = l->n_checkpoints};
                v->rows = calloc(l->n_checkpoints + 1, sizeof(*v->rows));
                if (!v->rows)
                        r = errf(err, errlen, -ENOMEM, "out of memory");
                for (size_t i = 0; r >= 0 && i < l->n_checkpoints; i++)
                        row_of(e, l->checkpoints[i], &v->rows[i]);
        }
        if (sm)
                protobuf_c_message_free_unpacked(sm, NULL);
        if (lm)
                protobuf_c_message_free_unpacked(lm, NULL);
        return r;
}

/* The chief is not answering: its record says whether the job has ended (then it is read as the chief's
 * answer) or not (the chief is waited for). Returns 1 and *v when the record says the job ended, 0 when
 * it does not (or there is none), -errno when it cannot be read. */
static int read_record(struct evaluator *e, struct chief_view *v) {
        struct chief_db *db = NULL;
        struct chief_db_job job;
        if (access(e->db_path, F_OK) < 0)
                return 0;
        int r = chief_db_open_readonly(e->db_path, &db);
        if (r >= 0)
                r = chief_db_load_job(db, &job);
        if (r == -ENOENT) {
                chief_db_close(db);
                return 0;
        }
        if (r >= 0 && job.fingerprint == config_fingerprint(e->cfg) && state_ended(job.state)) {
                *v = (struct chief_view){.state = job.state, .from_record = true};
                r = chief_db_list_checkpoints(db, &v->rows, &v->n);
                for (size_t i = 0; r >= 0 && i < v->n; i++) {
                        const char *slash = strrchr(v->rows[i].path, '/');
                        char name[sizeof(v->rows[i].path)];
                        chief_strfmt(name, sizeof(name), "%s", slash ? slash + 1 : v->rows[i].path);
                        chief_strfmt(v->rows[i].path, sizeof(v->rows[i].path), "%s/%s", e->ckpt_dir, name);
                }
                r = r < 0 ? r : 1;
        } else if (r >= 0) {
                r = 0;
        }
        chief_db_close(db);
        return r;
}

/* Evaluates rows[i]: reads its values (its chain), evaluates them, writes the scalars. Returns 0 (also
 * for a checkpoint that is gone or unreadable, or values gone wrong: logged, the next one is tried), or
 * -EINVAL (the checkpoint is of another model: a configuration error), or another -errno (retried). */
static int evaluate_one(struct evaluator *e, const struct chief_db_checkpoint *rows, size_t n, size_t i) {
        const struct chief_db_checkpoint *row = &rows[i];
        struct ps_sparse_rows tables[MODEL_MAX_EMBEDDINGS] = {0};
        char err[1024];
        uint32_t n_tables = e->cfg->model.n_embeddings;
        int r = chief_ckpt_read_chain(e->ckpts, rows, n, i, model_params(e->model), n_tables ? tables : NULL, err,
                                      sizeof(err));
        for (uint32_t t = 0; r >= 0 && t < n_tables; t++) {
                sparse_table_clear(e->tables[t]);   /* the rows of this checkpoint only; no slots: lookups only */
                int imp = tables[t].n ? sparse_table_import(e->tables[t], tables[t].ids, tables[t].n, tables[t].values,
                                                             NULL, row->global_step) : 0;
                if (imp < 0) {   /* >= 0: the rows stored over (none: the table was just emptied) */
                        r = imp;
                        chief_strfmt(err, sizeof(err), "importing table %s: %s", e->cfg->model.emb[t].name,
                                     strerror(-r));
                }
        }
        for (uint32_t t = 0; t < MODEL_MAX_EMBEDDINGS; t++)
                ps_sparse_rows_clear(&tables[t]);
        if (r == -EINVAL)
                return log_error_errno(r, "%s: this evaluator's job file is not the chief's", err);
        if (r == -ENOENT || r == -EBADMSG) {
                /* removed meanwhile (supervisor.keep_checkpoints) or damaged: the chief deals with it */
                log_warning_step(row->global_step, "Not evaluating the checkpoint of global_step %" PRIu64 ": %s",
                                 row->global_step, err);
                return 0;
        }
        if (r < 0) {
                log_warning_step(row->global_step, "Cannot read the checkpoint of global_step %" PRIu64 ": %s; "
                                 "retrying in %llu s", row->global_step, err, EVAL_POLL_US / 1000000);
                return r;
        }
        struct chief_eval_result x;
        r = chief_eval_run(e->cfg, e->model, e->test, table_lookup, e, &x, err, sizeof(err));
        if (r == -EDOM) {
                /* the chief fails the job for it; the evaluator says what it saw and goes on */
                log_warning_step(row->global_step, "The checkpoint of global_step %" PRIu64 " has %s", row->global_step,
                                 err);
                return 0;
        }
        if (r < 0) {
                log_warning_step(row->global_step, "Cannot evaluate the checkpoint of global_step %" PRIu64 ": %s; "
                                 "retrying in %llu s", row->global_step, err, EVAL_POLL_US / 1000000);
                return r;
        }
        if (x.n)
                chief_eval_report(&e->sw, e->cfg, row->global_step, &x);
        e->n_evaluated++;
        notify_status("evaluated global_step %" PRIu64 ", test accuracy %.4f", row->global_step, (double)x.accuracy);
        return 0;
}

/* Every checkpoint newer than the last evaluated, oldest first (rows: newest first). Returns 0 or the
 * first failure of evaluate_one (the rest waits for the next look). */
static int evaluate_new(struct evaluator *e, const struct chief_view *v) {
        for (size_t i = v->n; i-- > 0;) {
                if (e->have_last && v->rows[i].global_step <= e->last_step)
                        continue;
                int r = evaluate_one(e, v->rows, v->n, i);
                if (r < 0 && r != -EINVAL && ++e->tries >= EVAL_TRIES) {
                        log_warning_step(v->rows[i].global_step, "Skipping the checkpoint of global_step %" PRIu64
                                         " after %u failed tries", v->rows[i].global_step, EVAL_TRIES);
                        r = 0;
                }
                if (r < 0)
                        return r;
                e->tries = 0;
                e->have_last = true;
                e->last_step = v->rows[i].global_step;
        }
        return 0;
}

/* Logs a wait's reason when it changes, and every EVAL_WAIT_LOG_US while it lasts. */
static void log_wait(char *last, size_t len, uint64_t *last_log, const char *why, uint64_t left_s) {
        uint64_t t = mono_us();
        if (strcmp(last, why) != 0 || t - *last_log >= EVAL_WAIT_LOG_US) {
                log_info("Waiting for the chief: %s; giving up in %" PRIu64 " s (supervisor.ready_timeout_secs)", why,
                         left_s);
                chief_strfmt(last, len, "%s", why);
                *last_log = t;
        }
}

/* The loop: look, evaluate what is new, until the job has ended (0: DONE or STOPPED, 65: FAILED), a
 * signal (0), the chief not coming in time (75), or a checkpoint of another model (78). */
static int evaluate_loop(struct evaluator *e, int sfd) {
        const struct job_config *cfg = e->cfg;
        uint64_t wait_since = 0, last_log = 0, timeout_us = cfg->supervisor.ready_timeout_secs * 1000000ULL;
        char last_why[512] = "";
        bool ever = false;
        for (;;) {
                struct chief_view v = {0};
                char err[1024];
                int r = ask_chief(e, &v, err, sizeof(err));
                if (r < 0) {
                        int rec = read_record(e, &v);
                        if (rec < 0)   /* while the chief writes it, say; the chief is waited for */
                                log_debug_errno(rec, "Cannot read the chief's record \"%s\"", e->db_path);
                        if (rec > 0) {
                                log_info("The chief (%s) is gone (%s); its record says the job has ended (%s): "
                                         "evaluating what it lists", cfg->cluster.chief[0].addr, err,
                                         job_state_name(v.state));
                                r = 0;
                        }
                }
                if (r < 0) {
                        uint64_t t = mono_us();
                        if (!wait_since)
                                wait_since = t;
                        if (t - wait_since > timeout_us) {
                                log_error("The chief (%s) did not answer for %" PRIu64 " s (supervisor.ready_timeout_secs): "
                                          "%s", cfg->cluster.chief[0].addr, cfg->supervisor.ready_timeout_secs, err);
                                return DAEMON_EX_TEMPFAIL;
                        }
                        notify_status("waiting for the chief: %s", err);
                        log_wait(last_why, sizeof(last_why), &last_log, err,
                                 (timeout_us - (t - wait_since)) / 1000000);
                } else {
                        if (!v.from_record && (wait_since || !ever))
                                log_info("The chief answers: the job is %s, %zu checkpoint%s recorded",
                                         job_state_name(v.state), v.n, v.n == 1 ? "" : "s");
                        wait_since = 0;
                        last_why[0] = 0;
                        ever = true;
                        r = evaluate_new(e, &v);
                        bool end = r >= 0 && state_ended(v.state);
                        int state = v.state;
                        free(v.rows);
                        if (r == -EINVAL)
                                return DAEMON_EX_CONFIG;
                        if (end) {
                                log_info("The job has ended (%s) and its checkpoints are evaluated (the newest at "
                                         "global_step %" PRIu64 "; %" PRIu32 " evaluation%s): exiting",
                                         job_state_name(state), e->last_step, e->n_evaluated,
                                         e->n_evaluated == 1 ? "" : "s");
                                return state == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED ? DAEMON_EX_DATAERR : 0;
                        }
                }
                struct pollfd pfd = {.fd = sfd, .events = POLLIN};
                int n = poll(&pfd, 1, (int)(EVAL_POLL_US / 1000));
                if (n < 0 && errno != EINTR)
                        return log_error_errno(-errno, "poll() failed"), DAEMON_EX_FAILURE;
                if (n > 0 && (pfd.revents & POLLIN)) {
                        struct signalfd_siginfo si;
                        const char *name = read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si) ? strsignal((int)si.ssi_signo)
                                                                                             : "a signal";
                        log_info("Received %s, stopping", name);
                        return 0;
                }
        }
}

int chief_evaluator_main(int argc, char **argv) {
        struct daemon_args args = {0};
        struct evaluator *e = NULL;
        int sfd = daemon_signals_fd();
        if (sfd < 0) {
                fprintf(stderr, "chiefd: cannot set up signals: %s\n", strerror(-sfd));
                return EXIT_FAILURE;
        }
        int r = daemon_args_parse(argc, argv, "chiefd", ROLE_EVALUATOR, &args);
        if (r != 0) {
                close(sfd);
                return r == 1 ? EXIT_SUCCESS : r;
        }
        const struct job_config *cfg = args.cfg;
        rpc_global_init();
        int ret;
        if ((r = evaluator_new(cfg, args.state_dir, &e)) < 0) {
                ret = daemon_exit_code(r);
                goto out;
        }
        log_info("Evaluating the checkpoints of job \"%s\" from the chief at %s (checkpoints in \"%s\")", cfg->name,
                 cfg->cluster.chief[0].addr, e->ckpt_dir);
        notify_ready();
        ret = evaluate_loop(e, sfd);
        notify_stopping();
out:
        evaluator_free(e);
        rpc_global_shutdown();
        close(sfd);
        daemon_args_done(&args);
        return ret;
}
