/* A ps shard's variables: its parts of the job's variables and their optimizer slots in one
 * contiguous block, checked and applied here whichever way a push came (a gRPC message's tensors, or
 * a worker's shared-memory segment), assigned by the chief and read for pulls. No RPC: psd_push.c
 * receives and replies, this file validates and applies, so it is unit tested alone
 * (tests/unit/test_shard.c).
 *
 * Thread-safe: each part has its own lock; a push locks its parts one at a time, an assign all of
 * them. The layout and cfg must outlive the shard. */
#pragma once
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apply.h"
#include "config.h"
#include "job.h"
#include "wire.h"

struct shard_part {
        uint32_t var;             /* index into the layout's variables */
        const char *name;         /* the variable's */
        uint32_t row_begin, rows, cols;
        size_t model_off;         /* floats into a whole model's block (a worker's segment) */
        struct apply_rows a;      /* (rows, cols) views into shard.block; a.n floats; a.updates */
        pthread_mutex_t mu;       /* over a */
};

struct shard {
        const struct training_config *t;
        const struct job_layout *L;
        uint32_t index;           /* ps:<index>; shard 0 owns global_step */
        unsigned n_slots;
        uint32_t n_parts;
        struct shard_part *parts;
        size_t n_floats;          /* of this shard's variables */
        float *block;             /* (1 + n_slots) * n_floats: values, then each slot */
        uint32_t *plan_part;      /* (plan parts) index into parts[], or UINT32_MAX: another shard's */
        atomic_bool initialized;  /* assigned by the chief */
        atomic_uint_fast64_t global_step;
        atomic_uint_fast64_t clipped;  /* pushes over training.max_gradient_norm, scaled down (action clip) */
};

/* Shard `index` of the layout, values zero, not initialized. -EINVAL for an index out of range,
 * -ENOMEM; a reason in err either way. */
int shard_new(const struct job_config *cfg, const struct job_layout *L, uint32_t index, struct shard **ret,
              char *err, size_t errlen);
struct shard *shard_free(struct shard *s); /* NULL-safe; returns NULL */

/* The part of variable `name` starting at row row_offset, or NULL. */
struct shard_part *shard_find(struct shard *s, const char *name, uint64_t row_offset);
/* Index into parts[] of the placement's part plan_index, or -ENOENT: another shard's or out of range. */
int shard_plan_part(const struct shard *s, uint32_t plan_index);

/* Checks a tensor's metadata against the parts: name (with an optional "/slot" when allow_slot), row
 * offset, dtype, shape. 0 with the part and the slot (-1: the values) in *part_ret and *slot_ret, or
 * -EINVAL with a message naming the tensor. */
int shard_match(struct shard *s, const struct wire_tensor *t, bool allow_slot, struct shard_part **part_ret,
                int *slot_ret, char *err, size_t errlen);

/* ---- a push from a gRPC message: each tensor is the gradient of one whole part ---- */

/* Validates every tensor before anything is applied: each names a part of this shard (shard_match),
 * none twice, all finite, and their L2 norm together within training.max_gradient_norm (apply.h).
 * parts (in->n_tensors) gets each tensor's part, *floats_ret the floats of them all and *scale_ret
 * what to scale them by (1, or limit / norm when clipped: counted in s->clipped). 0, or -EINVAL with
 * a message naming the tensor or the norm (from: the caller, as "worker:0"). */
int shard_wire_check(struct shard *s, const struct wire_in *in, const char *from, struct shard_part **parts,
                     size_t *floats_ret, float *scale_ret, char *err, size_t errlen);
/* Applies checked tensors, scaled by shard_wire_check's scale, each to its part under its lock;
 * values (nullable, the floats of shard_wire_check) gets the fresh values of the parts in the
 * tensors' order. */
void shard_wire_apply(struct shard *s, const struct wire_in *in, struct shard_part *const *parts, float scale,
                      float *values);
/* The same for n tensors t[0..n) of a message, parts[i] t[i]'s (a batch of updates, one at a time). */
void shard_tensors_apply(struct shard *s, const struct wire_tensor *t, size_t n, struct shard_part *const *parts,
                         float scale, float *values);

/* Reads checked tensors, one after the other in the tensors' order, into dst (the floats of
 * shard_wire_check), scaled by its scale: a sync step keeps them until it has enough (agg.h). */
void shard_wire_read(const struct wire_in *in, struct shard_part *const *parts, float scale, float *dst);
/* Copies the values of parts idx[0..n), each under its lock, where a whole model's block has them in
 * values (a worker's segment). */
void shard_block_read(struct shard *s, const uint32_t *idx, uint32_t n, float *values);

/* ---- a push through shared memory: gradients where a whole model's block has them ---- */

/* Copies the gradients of parts idx[0..n) out of grads (laid out as a whole model's block) into
 * scratch (room for their floats), so the values checked are the values applied whatever the worker
 * does meanwhile; checks them all finite and their L2 norm within training.max_gradient_norm (a
 * clipped push is scaled in scratch, and counted). 0, or -EINVAL with a message (from: the worker,
 * as "worker:0"). */
int shard_block_check(struct shard *s, const float *grads, const uint32_t *idx, uint32_t n, float *scratch,
                      const char *from, char *err, size_t errlen);
/* Applies the checked scratch to parts idx[0..n), each under its lock, and writes their fresh values
 * where a whole model's block has them in values. */
void shard_block_apply(struct shard *s, const uint32_t *idx, uint32_t n, const float *scratch, float *values);

/* ---- assign, pull ---- */

/* The chief's initial or restored values: every part given once, and every slot too when with_slots
 * (otherwise the slots start at the optimizer's initial values). Validated first; then, under all the
 * parts' locks, copied in, each part's step set to global_step, global_step taken (shard 0) and the
 * shard marked initialized. 0, or -EINVAL/-ENOMEM with a message and nothing changed. */
int shard_assign(struct shard *s, const struct wire_in *in, bool with_slots, uint64_t global_step, char *err,
                 size_t errlen);

/* Copies part k's values, then its first n_slots slots, each a->n floats, into dst under its lock. */
void shard_read(struct shard *s, uint32_t k, unsigned n_slots, float *dst);
