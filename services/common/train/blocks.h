/* A model computing in the row blocks of the job's placement: a variable split over several ps parts
 * is computed a part at a time, so a worker can push and receive a block at a time. */
#pragma once
#include <stdbool.h>

#include "job.h"
#include "model.h"

/* Makes the model compute each variable split over several parts in the same row blocks; the
 * standalone trainer sets the same blocks and gets the same arithmetic. blocked (n_vars, may be NULL)
 * says which variables the model could block. 0, or -errno from model_set_var_blocks (-ENOMEM). */
int job_model_blocks(const struct job_layout *L, struct model *m, bool *blocked);
