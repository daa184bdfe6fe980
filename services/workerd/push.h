/* A worker's communication overlapping its compute: which gradients travel together in one push,
 * pushing a group as soon as backward has made its gradients final, and waiting for a group's fresh
 * values only when forward is about to read them. The model's block callbacks are push_await and
 * push_ready; the transfers themselves are the ps client's (ps_client.h). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "job.h"
#include "model.h"
#include "ps_client.h"
#include "replicas.h"

/* ---- the plan: how parts group into pushes (pure; unit tested) ----
 *
 * A row block of a large variable (one the model computes in blocks, `blocked`) is a push of its own;
 * all the other variables of a shard go together in one push (each call costs tens of microseconds of
 * CPU on both ends: measured, fewer pushes per step won). The model calls back once per (var, block):
 * block b of a blocked variable is its part b; an unblocked variable is one block 0 covering all its
 * parts. */
struct push_plan {
        const struct job_layout *L; /* lent */
        uint32_t n_groups;
        struct ps_group *groups;  /* (n_groups) their parts owned by the plan */
        uint32_t *part_group;     /* (n_parts) the group each placement part travels in */
        uint32_t *remaining;      /* (n_groups) parts whose gradients are not final yet this step */
        bool *blocked;            /* (n_vars) the model computes this variable in row blocks, one per part */
};

/* From the layout's placement (L lent for the plan's life) and which variables the model blocks
 * (n_vars entries). Returns 0 or -ENOMEM. */
int push_plan_new(const struct job_layout *L, const bool *blocked, struct push_plan **ret);
struct push_plan *push_plan_free(struct push_plan *pl);   /* NULL-safe; returns NULL */
/* The placement parts the model's (var, block) covers: returns how many, from *first_ret on. */
uint32_t push_plan_block(const struct push_plan *pl, uint32_t var, uint32_t block, uint32_t *first_ret);
/* (var, block)'s gradients are final: writes in groups_ret (room for push_plan_block's count) the
 * groups that are now complete, and returns how many; their count starts over for the next step. */
uint32_t push_plan_ready(struct push_plan *pl, uint32_t var, uint32_t block, uint32_t *groups_ret);
/* Every group starts the step with none of its gradients final. */
void push_plan_restart(struct push_plan *pl);

/* ---- the pusher: the step's pushes and waits ---- */

struct pusher;

/* Lays out the pushes of the model rep trains (replica 0's variables and host blocks), whose
 * variables L describes, makes every replica compute in the same row blocks, and sets up the ps
 * client's pushes (shared memory where cfg allows it and there is one replica). pc and rep stay the
 * caller's and must outlive the pusher. Returns 0 or -errno. */
int pusher_new(const struct job_config *cfg, const struct job_layout *L, struct replicas *rep, struct ps_client *pc,
               uint32_t worker, struct pusher **ret);
/* Waits for the pushes in flight, then frees. NULL-safe; returns NULL. */
struct pusher *pusher_free(struct pusher *pu);

/* A step begins: its pushes carry local_step, and its first push to shard 0 counts it in global_step. */
void push_step_begin(struct pusher *pu, uint64_t local_step);
/* model_forward_blocks' callback (ud: the pusher): waits for the fresh values of (var, block) from
 * the last step's push — or, with training.overlap_push, puts in those of the push before, kept aside,
 * without waiting for the last one (ps_client_take). A failed push becomes the step's failure; returns
 * 0 so forward goes on. */
int push_await(void *pu, uint32_t var, uint32_t block);
/* model_backward_blocks' callback: pushes each group (var, block) completes (with
 * training.overlap_push, first ends the group's push still travelling and keeps its values aside:
 * ps_client_hold; if that push failed, the step has failed and no new push starts). Returns 0. */
int push_ready(void *pu, uint32_t var, uint32_t block);
/* The step has failed so far (backward need not run). */
bool push_failed(const struct pusher *pu);
/* The step ends: 0, or its first failure (a shard refused a push or was lost) with why in err; then
 * every push in flight has been waited for, and the caller reads every shard again (ps_client_pull)
 * and links them again (ps_client_link_shards). */
int push_step_end(struct pusher *pu, char *err, size_t errlen);
/* Waits for every push in flight and puts their values in the model: the job's values at the end. */
void push_finish(struct pusher *pu);
/* Microseconds spent waiting for fresh values, and starting pushes. */
void push_times(const struct pusher *pu, uint64_t *wait_us_ret, uint64_t *push_us_ret);
