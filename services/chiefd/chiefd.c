/* chiefd: the supervisor of one job. Initializes every ps shard or restores it from the latest
 * checkpoint, lets workers join once the job is ready, tracks global_step and per-worker progress
 * (SQLite), saves checkpoints (safetensors) on schedule and on request, writes TensorBoard summaries,
 * evaluates on the test split, answers GetStatus and Watch, and tells everyone to stop.
 *
 * This file builds the chief and wires its parts: the handlers (chief_rpc.c, chief_watch.c), the main
 * loop (chief_loop.c) and the state machine it drives (chief_state.c); see chiefd-internal.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ctr_train.h"
#include "backend.h"
#include "chiefd-internal.h"
#include "chief_evaluator.h"
#include "chief_metrics.h"
#include "ckpt.h"
#include "config.h"
#include "daemon.h"
#include "data.h"
#include "job.h"
#include "log.h"
#include "model.h"
#include "notify.h"
#include "ps_client.h"
#include "summary.h"
#include "trainer.h"
#include "util.h"

/* The test hook supervisor.test_checkpoint_delay_ms (PSFLEET_TEST_CHECKPOINT_DELAY_MS, through the key
 * table like every PSFLEET_* variable): slows every checkpoint write down so that an integration test
 * can kill chiefd mid-write (tests/integration/test_checkpoint_crash.py). A bad value is a
 * configuration error naming the variable. Returns 0 or -EINVAL, logged. */
static int test_hook_setup(struct job_config *cfg) {
        char err[512];
        if (config_apply_env(cfg, "supervisor", err, sizeof(err)) < 0) {
                log_error("%s", err);
                return -EINVAL;
        }
        uint64_t ms = cfg->supervisor.test_checkpoint_delay_ms;
        if (ms)
                log_warning("Test hook PSFLEET_TEST_CHECKPOINT_DELAY_MS=%" PRIu64 ": every checkpoint write sleeps %"
                            PRIu64 " ms before its rename and again before its record", ms, ms);
        ckpt_set_test_delay(ms);
        return 0;
}

static struct chief *chief_free(struct chief *c) {
        if (!c)
                return NULL;
        for (uint32_t w = 0; c->worker_ch && w < c->cfg->cluster.n_worker; w++)
                rpc_channel_free(c->worker_ch[w]);
        free(c->worker_ch);
        ps_client_free(c->pc);
        chief_metrics_done();
        chief_exporter_free(c->exporter); /* first: its thread uses the records, the store and the job */
        job_layout_free(c->L);
        model_free(c->model);
        backend_free(c->be);
        dataset_free(c->test);
        summary_writer_free(c->ev.sw);
        free(c->summary_dir);
        chief_ckpt_free(c->ckpts);
        for (unsigned k = 0; k < OPTIM_MAX_SLOTS; k++)
                free(c->sv.slots[k]);
        chief_watch_free(c->watch);
        chief_db_close(c->db);
        if (c->wake_fd >= 0)
                close(c->wake_fd);
        chief_status_done(&c->st);
        free(c->canonical);
        free(c);
        return NULL;
}

/* Everything but the server. Logs what failed. */
static int chief_new(struct job_config *cfg, const char *state_root, struct chief **ret) {
        struct chief *c = calloc(1, sizeof(*c));
        char err[1024];
        int r;
        if (!c)
                return log_error_errno(-ENOMEM, "Cannot allocate the chief");
        chief_status_init(&c->st);
        c->wake_fd = -1;
        c->cfg = cfg;
        c->st.cfg = cfg;
        chief_metrics_init(cfg->cluster.n_worker, cfg->cluster.n_ps_backup);
        c->canonical = config_canonical_json(cfg);
        c->fingerprint = c->st.fingerprint = config_fingerprint(cfg);
        c->st.workers = calloc(cfg->cluster.n_worker, sizeof(*c->st.workers));
        c->st.ps = calloc(cfg->cluster.n_ps, sizeof(*c->st.ps));
        c->worker_ch = calloc(cfg->cluster.n_worker, sizeof(*c->worker_ch));
        if (!c->canonical || !c->st.workers || !c->st.ps || !c->worker_ch) {
                r = log_error_errno(-ENOMEM, "Cannot allocate the chief");
                goto fail;
        }
        for (uint32_t s = 0; s < cfg->cluster.n_ps; s++)
                chief_strfmt(c->st.ps[s].state, sizeof(c->st.ps[s].state), "not contacted yet");

        /* The record. */
        char *dir = strdup_printf("%s/%s", state_root, cfg->name);
        char *db_path = dir ? strdup_printf("%s/chief.db", dir) : NULL;
        if (!db_path) {
                free(dir);
                r = log_error_errno(-ENOMEM, "Cannot allocate the chief");
                goto fail;
        }
        r = mkdir_p(dir, 0750);
        if (r < 0)
                log_error_errno(r, "Cannot create the state directory \"%s\"", dir);
        else if ((r = chief_db_open(db_path, &c->db)) < 0)
                log_error_errno(r, "Cannot open the database \"%s\"", db_path);
        free(dir);
        if (r < 0) {
                free(db_path);
                goto fail;
        }
        struct chief_db_job prev;
        r = chief_db_load_job(c->db, &prev);
        bool same_job = r >= 0 && prev.fingerprint == c->fingerprint;
        if (same_job) {
                /* A restart of the same job: it keeps its start time, its losses, and an ended state. */
                c->st.started_us = prev.started_us;
                log_info("Database \"%s\": the job was last %s at global_step %" PRIu64 "%s%s", db_path,
                         job_state_name(prev.state), prev.global_step, prev.reason[0] ? ": " : "", prev.reason);
                chief_state_from_record(&c->st.js, prev.state, prev.reason);
                if (chief_state_final(&c->st.js)) {
                        c->st.global_step = c->st.end_step = prev.global_step;
                        c->st.test_accuracy = prev.test_accuracy;
                        c->st.test_loss = prev.test_loss;
                        c->st.test_auc = prev.test_auc;
                        c->st.test_rmse = prev.test_rmse;
                        c->st.wall_s = prev.wall_s;
                        c->st.state_since_us = prev.state_since_us ? prev.state_since_us : prev.updated_us;
                        log_notice("The job is %s%s%s: not training it again (psfleet restart trains it again)",
                                   job_state_name(prev.state), prev.reason[0] ? ": " : "", prev.reason);
                }
                struct chief_db_loss *losses = NULL;
                size_t n_losses = 0;
                if (chief_db_list_losses(c->db, &losses, &n_losses) >= 0) {
                        c->st.losses = losses;
                        c->st.n_losses = n_losses;
                        for (size_t i = 0; i < n_losses; i++)
                                c->st.steps_lost += losses[i].steps_lost;
                }
        } else if (r >= 0) {
                log_notice("Database \"%s\" holds a job with another fingerprint (%016" PRIx64 "): starting afresh",
                           db_path, prev.fingerprint);
        } else if (r != -ENOENT) {
                log_warning_errno(r, "Cannot read the job's row from \"%s\", starting afresh", db_path);
        }
        for (uint32_t w = 0; w < cfg->cluster.n_worker; w++) {
                struct chief_db_progress p;
                char st[128];
                if (same_job && chief_db_last_progress(c->db, w, &p, st, sizeof(st)) >= 0) {
                        struct worker_info *wi = &c->st.workers[w];
                        wi->local_step = p.local_step;
                        wi->global_step = p.global_step;
                        wi->loss = p.loss;
                        wi->examples = p.examples;
                        wi->last_report_us = p.time_us;
                        chief_strfmt(wi->state, sizeof(wi->state), "%s (before the chief restarted)", st);
                        if (p.global_step > c->prev_run_step)
                                c->prev_run_step = p.global_step;
                }
        }
        if (same_job && !chief_state_final(&c->st.js) && prev.global_step > c->prev_run_step)
                c->prev_run_step = prev.global_step;
        free(db_path);

        /* The model, for initializers and the final evaluation. */
        r = backend_cpu_new(cfg->training.threads, &c->be);
        if (r >= 0)
                r = model_new(&cfg->model, c->be, CHIEF_EVAL_BATCH, &c->model);
        if (r >= 0)
                r = job_layout_new(cfg, &c->L);
        if (r >= 0)
                r = ps_client_new(cfg, c->L, "chief:0", &c->pc);
        if (r < 0) {
                log_error_errno(r, "Cannot build the model and its layout over %u ps shards", cfg->cluster.n_ps);
                goto fail;
        }
        /* Checkpoints: the files and the rows must agree before anything reads them. */
        char *ckpt_dir = chief_job_path(state_root, cfg->name, cfg->supervisor.checkpoint_dir);
        c->summary_dir = chief_job_path(state_root, cfg->name, cfg->supervisor.summary_dir);
        if (!ckpt_dir || !c->summary_dir) {
                free(ckpt_dir);
                r = log_error_errno(-ENOMEM, "Cannot allocate the chief");
                goto fail;
        }
        struct chief_ckpt_config cc = {.dir = ckpt_dir, .L = c->L, .model = &cfg->model,
                                       .sparse_optimizer = cfg->training.sparse_optimizer, .job = cfg->name,
                                       .fingerprint = c->fingerprint,
                                       .keep = cfg->supervisor.keep_checkpoints,
                                       .keep_corrupt = cfg->supervisor.keep_corrupt};
        r = chief_ckpt_new(c->db, &cc, &c->ckpts, err, sizeof(err));
        c->st.db = c->db;
        c->st.ckpts = c->ckpts;
        c->st.summary_dir = c->summary_dir;
        free(ckpt_dir);
        if (r < 0) {
                log_error_errno(r, "%s", err);
                goto fail;
        }
        r = chief_ckpt_reconcile(c->ckpts);
        if (r < 0) {
                log_error_errno(r, "Cannot compare the checkpoint files in \"%s\" with their records",
                                chief_ckpt_dir(c->ckpts));
                goto fail;
        }
        chief_refresh_ckpt_info(&c->st);
        if (c->st.have_ckpt)
                log_info("Checkpoints in \"%s\": %u, the newest at global_step %" PRIu64, chief_ckpt_dir(c->ckpts),
                         c->st.n_ckpts, c->st.last_ckpt.global_step);
        if (chief_db_last_evaluation(c->db, &c->st.eval_step, &c->st.eval_loss, &c->st.eval_accuracy) >= 0)
                c->st.have_eval = true;
        c->sv.n_slots = optim_n_slots(cfg->training.optimizer);
        for (unsigned k = 0; k < c->sv.n_slots; k++)
                if (!(c->sv.slots[k] = calloc(model_n_params(c->model) ? model_n_params(c->model) : 1, sizeof(float)))) {
                        r = log_error_errno(-ENOMEM, "Cannot allocate the optimizer's slots");
                        goto fail;
                }
        if (cfg->supervisor.save_summaries_secs)
                chief_eval_summaries_open(c->summary_dir, &c->ev.sw);

        for (uint32_t w = 0; w < cfg->cluster.n_worker; w++) {
                char name[32];
                chief_strfmt(name, sizeof(name), "worker:%u", w);
                r = rpc_channel_new(cfg->cluster.worker[w].addr, name, &c->worker_ch[w]);
                if (r < 0) {
                        log_error_errno(r, "Cannot create a channel to %s (%s)", name, cfg->cluster.worker[w].addr);
                        goto fail;
                }
        }

        /* The test split, now: a missing file should stop the job before it trains, not after. */
        r = chief_eval_load_test(cfg, c->model, &c->test, err, sizeof(err));
        if (r < 0) {
                log_error("Cannot load the test split: %s", err);
                goto fail;
        }

        /* What the snapshots and the evaluations work with, each in its own struct. */
        c->sv.cfg = c->ev.cfg = cfg;
        c->sv.st = c->ev.st = &c->st;
        c->sv.ckpts = c->ckpts;
        c->sv.pc = c->ev.pc = c->pc;
        c->sv.model = c->ev.model = c->model;
        c->sv.ev = &c->ev;
        c->ev.db = c->db;
        c->ev.test = c->test;

        c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->wake_fd < 0) {
                r = log_error_errno(errno, "eventfd() failed");
                goto fail;
        }
        *ret = c;
        return 0;
fail:
        chief_free(c);
        return r;
}

/* Before the server shuts down: ends every stream and queued call, and refuses new ones. */
static void close_streams(struct chief *c) {
        pthread_mutex_lock(&c->st.lock);
        c->st.saves_closed = true;
        pthread_mutex_unlock(&c->st.lock);
        chief_answer_saves(&c->st, -ESHUTDOWN, NULL, false, "chiefd is stopping");
        chief_watch_stop(c->watch);
        chief_exporter_stop(c->exporter);
}

static int run(int argc, char **argv) {
        struct daemon_args args = {0};
        struct chief *c = NULL;
        struct rpc_server *srv = NULL;
        int ret = EXIT_FAILURE, r;

        /* Before any thread exists (gRPC's inherit the mask): SIGINT, SIGTERM and SIGHUP arrive only
         * through this signalfd, read in chief_supervise(). */
        int sfd = daemon_signals_fd();
        if (sfd < 0) {
                fprintf(stderr, "chiefd: cannot set up signals: %s\n", strerror(-sfd));
                return EXIT_FAILURE;
        }
        r = daemon_args_parse(argc, argv, "chiefd", ROLE_CHIEF, &args);
        if (r != 0) {
                close(sfd);
                return r == 1 ? EXIT_SUCCESS : r;
        }
        struct job_config *cfg = args.cfg;
        if (test_hook_setup(cfg) < 0) {
                close(sfd);
                daemon_args_done(&args);
                return DAEMON_EX_CONFIG;
        }

        rpc_global_init();
        if ((r = chief_new(cfg, args.state_dir, &c)) < 0)
                goto out;

        c->exit_at_end = args.exit_at_end;
        struct rpc_method methods[CHIEF_RPC_N_METHODS];
        chief_rpc_methods(c, methods);
        r = chief_watch_new(&c->st, &c->watch);
        if (r < 0) {
                log_error_errno(r, "Cannot start the watch thread");
                goto out;
        }
        char *job_dir = strdup_printf("%s/%s", args.state_dir, cfg->name);
        r = job_dir ? chief_exporter_new(c->cfg, c->db, c->ckpts, job_dir, &c->exporter) : -ENOMEM;
        free(job_dir);
        if (r < 0) {
                log_error_errno(r, "Cannot start the export thread");
                goto out;
        }
        if ((r = daemon_listen(&args, methods, ELEMENTSOF(methods), 2, DAEMON_SMALL_MESSAGES, &srv)) < 0)
                goto out;
        log_info("Listening on %s (job \"%s\", fingerprint %016" PRIx64 ", %u ps, %u workers, max_steps %" PRIu64 ")",
                 args.listen, cfg->name, c->fingerprint, cfg->cluster.n_ps, cfg->cluster.n_worker,
                 cfg->training.max_steps);
        notify_ready();
        pthread_mutex_lock(&c->st.lock);
        if (chief_state_final(&c->st.js))
                notify_status("%s: %s", job_state_name(c->st.js.state), c->st.js.reason[0] ? c->st.js.reason : "the job has ended");
        pthread_mutex_unlock(&c->st.lock);
        r = chief_supervise(c, sfd);
        notify_stopping();
        ret = r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        if (r >= 0 && c->exit_at_end) {
                /* A FAILED job stays failed whatever restarts it: a permanent status, never requeued. */
                pthread_mutex_lock(&c->st.lock);
                if (c->st.js.state == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED)
                        ret = DAEMON_EX_DATAERR;
                pthread_mutex_unlock(&c->st.lock);
        }
out:
        ret = !srv && r < 0 ? daemon_exit_code(r) : ret;   /* before serving: the status systemd acts on */
        if (c)
                close_streams(c);
        r = srv ? rpc_server_shutdown(srv, 5000) : 0;
        if (r < 0)
                log_warning_errno(r, "Server shutdown did not finish in time");
        rpc_server_free(srv);
        close(sfd);
        chief_free(c);
        rpc_global_shutdown();
        daemon_args_done(&args);
        return ret;
}

int main(int argc, char **argv) {
        /* TF_CONFIG's evaluator task: the same model, data and evaluation, no server (chief_evaluator.c) */
        for (int i = 1; i < argc; i++)
                if (strcmp(argv[i], "--evaluator") == 0)
                        return chief_evaluator_main(argc, argv);
        return run(argc, argv);
}
