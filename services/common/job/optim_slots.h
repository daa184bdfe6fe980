/* What the job file's optimizers (training.optimizer) keep beside each variable: the slots, by count
 * and by the names checkpoints store them under. Facts about the job, below the kernels (train/optim.h)
 * so that the job's layout and the wire can name the slots. Pure; thread-safe. */
#pragma once
#include "config.h"

#define OPTIM_MAX_SLOTS 2

/* Number of per-parameter slots the optimizer keeps (0..OPTIM_MAX_SLOTS). */
unsigned optim_n_slots(enum optimizer_kind kind);
/* Slot names as checkpoints store them: "momentum"; "m", "v"; "accumulator". NULL if out of range. */
const char *optim_slot_name(enum optimizer_kind kind, unsigned slot);
/* "sgd", "momentum", "adam", "adagrad" */
const char *optim_name(enum optimizer_kind kind);
