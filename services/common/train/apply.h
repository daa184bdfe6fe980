/* The one apply of a gradient to a variable's rows and their optimizer slots. A ps shard's gRPC
 * pushes, its shared-memory pushes and the standalone trainer all go through here, so the three
 * compute bit-identical values. Not locked: the caller serializes applies to the same rows. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "optim.h"

#define APPLY_BOUNCE 4096   /* floats: a gradient read in pieces streams through this much stack, in cache */

/* Rows of one variable (or a part of it) and of its optimizer slots, laid out alike: views into
 * blocks the caller owns. */
struct apply_rows {
        float *w;                        /* (n) parameters */
        float *slot[OPTIM_MAX_SLOTS];    /* (n) each; optim_n_slots() of them */
        size_t n;                        /* floats: rows * cols */
        uint64_t updates;                /* gradients applied: the step Adam's t and the decay count from */
        bool moving;                     /* a moving average: w -= g, whatever the optimizer (job_var's) */
};

/* The n floats at offset into a parameter block w and into slot blocks laid out as w (n_slots of
 * them, slots may be NULL when 0); no gradient applied yet. */
struct apply_rows apply_rows_at(float *w, float *const *slots, unsigned n_slots, size_t offset, size_t n);

/* Sets the slots to the optimizer's initial values and the count of applied gradients to updates. */
void apply_reset(const struct training_config *t, struct apply_rows *a, uint64_t updates);

/* Applies gradient g (a->n floats) at the rows' step, then counts it. */
void apply_gradient(const struct training_config *t, struct apply_rows *a, const float *g);

/* A gradient that arrives in pieces (from a message's slices, say): read(ud, buf, k) writes its next
 * k floats to buf. */
typedef void (*apply_read_fn)(void *ud, float *buf, size_t k);

/* As apply_gradient, reading a->n floats through a buffer of APPLY_BOUNCE that stays in cache, each
 * multiplied by scale first (1: as they are; a clipped push's limit / norm). */
void apply_gradient_read(const struct training_config *t, struct apply_rows *a, float scale, apply_read_fn read,
                         void *ud);

/* g[i] *= scale for n floats. */
void apply_scale(float *g, size_t n, float scale);

/* A push is checked whole before any of it is applied: every gradient finite, and (with
 * training.max_gradient_norm) the L2 norm of all its gradients within the limit.
 *
 * apply_check: true when all n floats of g are finite; with sumsq (NULL: no limit, the norm is not
 * needed) it also adds their squares, in double, to *sumsq. apply_check_read does the same for n
 * floats read in pieces. */
bool apply_check(const float *g, size_t n, double *sumsq);
bool apply_check_read(size_t n, apply_read_fn read, void *ud, double *sumsq);

/* The verdict on a finite push whose squares sum to sumsq, from `from` ("worker:0"): 0 and *scale_ret 1
 * (no limit, or within it); 1 and *scale_ret = limit / norm (over the limit, action clip: scale the
 * gradients by it, then apply); -EINVAL with a message naming the norm and the limit (over it, action
 * reject: nothing may be applied). */
int apply_norm_limit(const struct training_config *t, double sumsq, const char *from, float *scale_ret, char *err,
                     size_t errlen);
