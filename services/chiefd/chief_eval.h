/* chiefd's evaluations and summaries (main thread): the values a pull put in the model's block,
 * evaluated on the test split, and the TensorBoard event file (losses, rates, evaluations, session
 * lines). Unlike chief_save.c, nothing here talks to the shards' values or to checkpoint files: it
 * reads what chief_pull left in the model (and, for embeddings, looks rows up). */
#pragma once
#include <stddef.h>
#include <stdint.h>

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
