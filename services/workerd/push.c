/* A worker's communication overlapping its compute (push.h): the plan of which parts travel together,
 * and the model's thin block callbacks that push a group once complete and wait for it before reuse. */
#include "push.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "log.h"
#include "placement.h"
#include "util.h"

/* ---- the plan ---- */

int push_plan_new(const struct job_layout *L, const bool *blocked, struct push_plan **ret) {
        uint32_t NP = L->plan->n_parts, S = L->n_shards;
        struct push_plan *pl = calloc(1, sizeof(*pl));
        uint32_t *shard_group = malloc((S + 1) * sizeof(uint32_t));   /* the group of a shard's other parts */
        /* one allocation for the tables of parts: part_group, the groups' parts, remaining */
        if (!pl || !shard_group || !(pl->part_group = calloc(3 * (size_t)NP + 1, sizeof(uint32_t))) ||
            !(pl->groups = calloc(NP + 1, sizeof(*pl->groups))) ||
            !(pl->blocked = calloc(L->n_vars + 1, sizeof(bool)))) {
                free(shard_group);
                push_plan_free(pl);
                return -ENOMEM;
        }
        uint32_t *parts = pl->part_group + NP;
        pl->remaining = parts + NP;
        pl->L = L;
        memcpy(pl->blocked, blocked, L->n_vars * sizeof(bool));
        for (uint32_t s = 0; s < S; s++)
                shard_group[s] = UINT32_MAX;
        /* each part's group, in the order of the parts, and how many parts each group has */
        for (uint32_t p = 0; p < NP; p++) {
                const struct placement_part *pp = &L->plan->parts[p];
                uint32_t g;
                if (blocked[pp->var]) {
                        g = pl->n_groups++;
                } else {
                        if (shard_group[pp->shard] == UINT32_MAX)
                                shard_group[pp->shard] = pl->n_groups++;
                        g = shard_group[pp->shard];
                }
                pl->part_group[p] = g;
                pl->groups[g].shard = pp->shard;
                pl->groups[g].n_parts++;
        }
        /* the groups' parts side by side, each group's in the order of the parts (`remaining` counts
         * where each group's next part goes meanwhile) */
        for (uint32_t g = 0, n = 0; g < pl->n_groups; n += pl->groups[g].n_parts, g++) {
                pl->remaining[g] = n;
                pl->groups[g].parts = parts + n;
        }
        for (uint32_t p = 0; p < NP; p++)
                parts[pl->remaining[pl->part_group[p]]++] = p;
        push_plan_restart(pl);
        free(shard_group);
        *ret = pl;
        return 0;
}

struct push_plan *push_plan_free(struct push_plan *pl) {
        if (!pl)
                return NULL;
        free(pl->part_group);   /* and the groups' parts, and remaining */
        free(pl->groups);
        free(pl->blocked);
        free(pl);
        return NULL;
}

uint32_t push_plan_block(const struct push_plan *pl, uint32_t var, uint32_t block, uint32_t *first_ret) {
        uint32_t n = placement_var_parts(pl->L->plan, var, first_ret);
        if (!pl->blocked[var])
                return n;
        *first_ret += block;
        return 1;
}

uint32_t push_plan_ready(struct push_plan *pl, uint32_t var, uint32_t block, uint32_t *groups_ret) {
        uint32_t first, n = push_plan_block(pl, var, block, &first), k = 0;
        for (uint32_t i = 0; i < n; i++) {
                uint32_t g = pl->part_group[first + i];
                if (--pl->remaining[g] > 0)
                        continue;
                pl->remaining[g] = pl->groups[g].n_parts;
                groups_ret[k++] = g;
        }
        return k;
}

void push_plan_restart(struct push_plan *pl) {
        for (uint32_t g = 0; g < pl->n_groups; g++)
                pl->remaining[g] = pl->groups[g].n_parts;
}

/* ---- the pusher ---- */

struct pusher {
        struct ps_client *pc;
        struct push_plan *plan;
        uint32_t *ready;          /* (n_parts) scratch: the groups a block completes */
        bool linked;              /* the ps client has our groups */
        bool overlap;             /* training.overlap_push: a step does not wait for its own pushes */
        uint64_t local_step;
        bool counted;             /* this step has sent the push that counts it */
        int err;                  /* the step's first failure, and why */
        char msg[600];
        uint64_t wait_us, push_us;
};

static int move_model(void *m, float *params, float *grads) {
        return model_use_host_blocks(m, params, grads);
}

int pusher_new(const struct job_config *cfg, const struct job_layout *L, struct replicas *rep, struct ps_client *pc,
               uint32_t worker, struct pusher **ret) {
        struct model *m = replicas_model(rep);
        struct pusher *pu = calloc(1, sizeof(*pu));
        bool *blocked = calloc(L->n_vars + 1, sizeof(bool));
        int r = -ENOMEM;
        if (!pu || !blocked || !(pu->ready = calloc(L->plan->n_parts + 1, sizeof(uint32_t))))
                goto fail;
        pu->pc = pc;
        pu->overlap = cfg->training.overlap_push;
        if ((r = job_model_blocks(L, m, blocked)) < 0 || (r = replicas_follow_blocks(rep)) < 0 ||
            (r = push_plan_new(L, blocked, &pu->plan)) < 0)
                goto fail;
        uint32_t nb = 0;
        for (uint32_t v = 0; v < L->n_vars; v++)
                nb += blocked[v];
        log_info("%u variable(s) in %u part(s) over %u shard(s), %u pushed in row blocks; %u pushes per step",
                 L->n_vars, L->plan->n_parts, L->n_shards, nb, pu->plan->n_groups);
        ps_client_move_fn move = NULL;
        if (!cfg->rpc.shared_memory)
                log_info("rpc.shared_memory is off: pushing through gRPC only");
        else if (replicas_count(rep) > 1)
                log_info("pushing through gRPC only: shared memory is not used with several local GPUs");
        else
                move = move_model;
        if ((r = ps_client_link(pc, worker, pu->plan->n_groups, pu->plan->groups, model_params(m), model_grads(m), move,
                                m)) < 0)
                goto fail;
        pu->linked = true;
        free(blocked);
        *ret = pu;
        return 0;
fail:
        free(blocked);
        pusher_free(pu);
        return r;
}

/* Waits for every push in flight. */
static void drain(struct pusher *pu) {
        char err[sizeof(pu->msg)];
        for (uint32_t g = 0; g < pu->plan->n_groups; g++)
                ps_client_wait(pu->pc, g, err, sizeof(err));
        push_plan_restart(pu->plan);
}

struct pusher *pusher_free(struct pusher *pu) {
        if (!pu)
                return NULL;
        if (pu->linked)
                drain(pu);
        push_plan_free(pu->plan);
        free(pu->ready);
        free(pu);
        return NULL;
}

void push_step_begin(struct pusher *pu, uint64_t local_step) {
        pu->local_step = local_step;
        pu->counted = false;
        pu->err = 0;
}

/* The step's first failure is kept, with why. */
static void note_failure(struct pusher *pu, int r, const char *why) {
        if (r < 0 && !pu->err) {
                pu->err = r;
                snprintf(pu->msg, sizeof(pu->msg), "%s", why);
        }
}

int push_await(void *ud, uint32_t var, uint32_t block) {
        struct pusher *pu = ud;
        uint64_t t0 = mono_us();
        uint32_t first, n = push_plan_block(pu->plan, var, block, &first);
        for (uint32_t i = 0; i < n; i++) {
                char err[sizeof(pu->msg)];
                uint32_t g = pu->plan->part_group[first + i];
                /* overlapped: the values kept from the push before; the last one still travels */
                int r = pu->overlap ? ps_client_take(pu->pc, g, err, sizeof(err))
                                    : ps_client_wait(pu->pc, g, err, sizeof(err));
                note_failure(pu, r, err);
        }
        pu->wait_us += mono_us() - t0;
        return 0;
}

int push_ready(void *ud, uint32_t var, uint32_t block) {
        struct pusher *pu = ud;
        uint64_t t0 = mono_us();
        uint32_t n = push_plan_ready(pu->plan, var, block, pu->ready);
        for (uint32_t i = 0; i < n; i++) {
                uint32_t g = pu->ready[i];
                char err[sizeof(pu->msg)];
                /* overlapped: the group's last push ends here (its values kept for the next step) */
                int r = pu->overlap ? ps_client_hold(pu->pc, g, err, sizeof(err)) : 0;
                note_failure(pu, r, err);
                if (r < 0)
                        continue;
                /* the first push to shard 0 of a step counts it in global_step */
                bool count = pu->plan->groups[g].shard == 0 && !pu->counted;
                pu->counted |= count;
                ps_client_push(pu->pc, g, pu->local_step, count);
        }
        pu->push_us += mono_us() - t0;
        return 0;
}

bool push_failed(const struct pusher *pu) {
        return pu->err != 0;
}

int push_step_end(struct pusher *pu, char *err, size_t errlen) {
        if (!pu->err)
                return 0;
        drain(pu);
        return errf(err, errlen, pu->err, "%s", pu->msg);
}

void push_finish(struct pusher *pu) {
        drain(pu);
}

void push_times(const struct pusher *pu, uint64_t *wait_us_ret, uint64_t *push_us_ret) {
        *wait_us_ret = pu->wait_us;
        *push_us_ret = pu->push_us;
}
