/* What chief_ckpt.c (the files, saving, deleting) and chief_ckpt_load.c (reading back) share. */
#pragma once

#include <pthread.h>
#include <stdint.h>

#include "chief_ckpt.h"

#define FORMAT "psfleet.checkpoint.v1"   /* the files' "format" metadata */

struct chief_ckpt {
        struct chief_db *db;
        char *dir, *job;
        const struct job_layout *L;
        const struct model_spec *model;
        enum sparse_optimizer sparse_optimizer;
        uint64_t fingerprint;
        uint32_t keep, keep_corrupt;
        pthread_mutex_t mu;
};

/* Removes the ".corrupt" files beyond the newest keep_corrupt (s->mu held): they are kept for a
 * post-mortem, not forever. Returns how many were removed. */
int chief_ckpt_prune_corrupt_locked(struct chief_ckpt *s);
