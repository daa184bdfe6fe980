/* What every node of a job derives from the job file alike: the model's variables (from the model
 * spec alone, no backend needed) and where each lives (placement over the ps shards). Read-only after
 * creation: safe to share between threads. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "model_spec.h"
#include "placement.h"

struct job_var {
        char *name;
        uint32_t rows, cols;
        size_t offset;          /* floats into a parameter block laid out like the model's */
        uint32_t layer;
        bool moving;            /* model_spec_var's: applied as v -= g, no optimizer */
};

struct job_layout {
        uint32_t n_vars;
        struct job_var *vars;
        size_t n_params;        /* floats in a whole block */
        struct placement *plan;
        uint32_t n_shards;
        uint32_t *shard_first;  /* (n_shards) index into shard_parts; one allocation with the next two */
        uint32_t *shard_count;  /* (n_shards) */
        uint32_t *shard_parts;  /* (n_parts) part indices grouped by shard */
        uint64_t fingerprint;
        enum optimizer_kind optimizer;
        unsigned n_slots;
};

/* From the job's model spec (the variables model_new() would give it, model_spec_vars()) and its ps
 * list. -EINVAL for a spec no model can be built from, -ENOMEM. */
int job_layout_new(const struct job_config *cfg, struct job_layout **ret);
struct job_layout *job_layout_free(struct job_layout *L);
/* Variable index by name, or -ENOENT. */
int job_layout_find(const struct job_layout *L, const char *name);

/* A psfleet.v1.JobState value as a word ("training"), for logs, status lines and the CLI. */
const char *job_state_name(int state);
