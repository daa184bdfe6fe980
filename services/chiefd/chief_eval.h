/* chiefd's evaluations and summaries (main thread): the values a pull put in the model's block,
 * evaluated on the test split, and the TensorBoard event file (losses, rates, evaluations, session
 * lines). Unlike chief_save.c, nothing here talks to the shards' values or to checkpoint files: it
 * reads what chief_pull left in the model (and, for embeddings, looks rows up). The evaluator
 * (chief_evaluator.c) runs the same evaluation on a checkpoint's values: chief_eval_run and
 * chief_eval_report are the part both share. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ctr_train.h"

struct chief_db;
struct chief_status;
struct dataset;
struct job_config;
struct model;
struct ps_client;
struct summary_writer;

struct chief_eval {
        const struct job_config *cfg;
        struct chief_status *st;          /* the evaluation's figures, a divergence, the workers' losses */
        struct chief_db *db;              /* the evaluations' rows */
        struct model *model;              /* holds the pulled values */
        struct dataset *test;             /* idx: the test split; NULL: the test files are streamed */
        struct ps_client *pc;             /* embeddings: their rows, looked up */
        struct summary_writer *sw;        /* owned; NULL when summaries are off or failed */
        uint64_t last_eval_step, last_summary_mono;
};

/* A TensorBoard SessionLog event (a SUMMARY_SESSION_* status), when summaries are on. */
void chief_session_log(struct chief_eval *e, uint64_t step, int status, const char *path, const char *msg);
/* Every save_summaries_secs while the job runs: losses, rates, learning rate. */
void chief_maybe_write_summaries(struct chief_eval *e);
/* The same scalars now; at the end, the rates are over the whole training. */
void chief_write_summaries(struct chief_eval *e);
/* Evaluates the pulled values on the test split; records and summarizes the result. Weights that blew
 * up or a test loss that is not finite are recorded as the model gone wrong (the main loop fails the
 * job) and return -EDOM; other failures -errno with err. */
int chief_evaluate(struct chief_eval *e, uint64_t gs, char *err, size_t errlen);

/* Examples per forward pass of an evaluation: chiefd's and the evaluator's model are built with it. */
#define CHIEF_EVAL_BATCH 500

/* A new event file in dir (made when missing) into *ret, logged; a failure is logged and leaves *ret
 * NULL: no summaries, the job goes on. */
void chief_eval_summaries_open(const char *dir, struct summary_writer **ret);
/* A directory of the job's state: dir itself when absolute, else <state_root>/<job>/<dir>. malloc'd
 * (NULL: out of memory). */
char *chief_job_path(const char *state_root, const char *job, const char *dir);

/* One evaluation's figures. */
struct chief_eval_result {
        uint64_t n;                       /* examples; 0: nothing was evaluated (no data.test_files) */
        float loss, accuracy;
        double auc, rmse, logloss;        /* NAN where the head has none */
};

/* The test split of an idx job, loaded and checked against the model (*ret; the caller frees it with
 * dataset_free); for a record format *ret is NULL and its test files are opened once to check them.
 * Returns 0, or -errno with err (-EBADMSG: data that are bad or do not fit the model). */
int chief_eval_load_test(const struct job_config *cfg, const struct model *model, struct dataset **ret, char *err,
                         size_t errlen);
/* Evaluates the values in model's block on the test split: test (idx), else the test files streamed
 * with the tables' rows through lookup. Records nothing. Returns 0 and *res; -EDOM with what went
 * wrong in err (weights blown up, a non-finite test loss); or another -errno with err. */
int chief_eval_run(const struct job_config *cfg, struct model *model, const struct dataset *test, ctr_lookup_fn lookup,
                   void *ud, struct chief_eval_result *res, char *err, size_t errlen);
/* The evaluation's scalars (eval/accuracy, eval/loss; eval/auc, eval/logloss for a logistic head;
 * eval/rmse for mse) into *sw when it is not NULL (a failed write frees it: no more summaries), and its
 * journal line. */
void chief_eval_report(struct summary_writer **sw, const struct job_config *cfg, uint64_t gs,
                       const struct chief_eval_result *res);
