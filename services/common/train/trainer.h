/* The standalone trainer: the same training as a job with one worker, in one process, without any
 * RPC — same data order (worker 0 of 1), same initial values, same optimizer code applied per
 * variable. It is the reference the distributed path is held to. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"

struct trainer_result {
        uint64_t steps;
        double wall_s;           /* the whole training loop */
        double examples_per_s;   /* over the steps after the first 20 (warm-up) */
        double final_loss;
        double test_accuracy, test_loss;
        double test_auc, test_logloss, test_rmse; /* models with embeddings (ctr_train.h); else 0 */
        uint64_t test_examples;
};

typedef void (*trainer_progress_cb)(void *ud, uint64_t step, uint64_t max_steps, double loss, double examples_per_s);

/* Opens dir/file of the job's data section; caller frees. */
char *trainer_data_path(const struct job_config *cfg, const char *file);

/* Trains cfg->training.max_steps steps, then evaluates on the test split. If loss_log is not NULL,
 * writes one line per step to it: "<step> <loss>" (step counts from 0; %.9g). progress may be NULL.
 * With params_out (nullable), writes the final variables there as safetensors (float32, the names a
 * checkpoint has). training.mode sync with W workers: each step is a batch of W x batch_size, worker k's
 * next batch_size examples of its shard for each k in order, the examples a sync step of W workers
 * without backups aggregates, computed as it does: the W gradients summed in worker order, times 1 / W
 * (which is the batch's mean gradient, rounded as the job rounds it); the loss is their mean. Returns 0, or -errno with a reason in err. */
int trainer_standalone(const struct job_config *cfg, FILE *loss_log, const char *params_out,
                       trainer_progress_cb progress, void *ud, struct trainer_result *ret, char *err, size_t errlen);

/* The trainer's apply: every variable of a whole parameter block (laid out as L says), each as a ps
 * shard applies its parts (apply.h), with optimizer slots for the whole block at their initial values.
 * params (L->n_params floats) stays the caller's. tests/unit/test_shard.c holds psd's paths to it. */
struct job_layout;
struct trainer_apply;
int trainer_apply_new(const struct training_config *t, const struct job_layout *L, float *params,
                      struct trainer_apply **ret); /* 0, -ENOMEM */
struct trainer_apply *trainer_apply_free(struct trainer_apply *a); /* NULL-safe; returns NULL */
/* One step: grads (L->n_params floats, laid out as params) applied to every variable. */
void trainer_apply_step(struct trainer_apply *a, const float *grads);

/* The variables of params (laid out as L says) as a safetensors file at path. 0, or -errno with err. */
int trainer_save_params(const struct job_layout *L, const float *params, const char *path, char *err, size_t errlen);

/* Loss-log line, shared by the standalone trainer and workerd so the two can be compared as text. */
void trainer_log_loss(FILE *f, uint64_t step, double loss);
