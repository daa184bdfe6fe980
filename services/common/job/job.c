/* Layout of a job's variables over its ps shards, from the job file alone. */
#include "job.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_slots.h"
#include "util.h"
#include "psfleet/v1/ps.pb-c.h"
#include "psfleet/v1/supervisor.pb-c.h"

int job_layout_new(const struct job_config *cfg, struct job_layout **ret) {
        struct job_layout *L = calloc(1, sizeof(*L));
        struct model_spec_var *mv = calloc(MODEL_MAX_VARS, sizeof(*mv));
        struct placement_var *pv = calloc(MODEL_MAX_VARS, sizeof(*pv));
        int r = -ENOMEM;
        if (!L || !mv || !pv)
                goto fail;
        L->n_shards = cfg->cluster.n_ps;
        L->fingerprint = config_fingerprint(cfg);
        L->optimizer = cfg->training.optimizer;
        L->n_slots = optim_n_slots(cfg->training.optimizer);
        if ((r = model_spec_vars(&cfg->model, mv, &L->n_params)) < 0)
                goto fail;
        L->n_vars = (uint32_t)r;
        r = -ENOMEM;
        if (!(L->vars = calloc(L->n_vars + 1, sizeof(*L->vars))))
                goto fail;
        for (uint32_t i = 0; i < L->n_vars; i++) {
                const struct model_spec_var *v = &mv[i];
                L->vars[i] = (struct job_var){strdup(v->name), v->rows, v->cols, v->offset, v->layer, v->moving};
                if (!L->vars[i].name)
                        goto fail;
                pv[i] = (struct placement_var){L->vars[i].name, v->rows, (uint64_t)v->cols * sizeof(float)};
        }
        r = placement_compute(pv, L->n_vars, L->n_shards, cfg->ps.split_bytes, &L->plan);
        if (r < 0)
                goto fail;
        r = -ENOMEM;
        /* the three shard tables in one block, shard_first owning it */
        if (!(L->shard_first = calloc(2 * (size_t)L->n_shards + L->plan->n_parts + 1, sizeof(uint32_t))))
                goto fail;
        L->shard_count = L->shard_first + L->n_shards;
        L->shard_parts = L->shard_count + L->n_shards;
        uint32_t k = 0;
        for (uint32_t s = 0; s < L->n_shards; s++) {
                L->shard_first[s] = k;
                for (uint32_t p = 0; p < L->plan->n_parts; p++)
                        if (L->plan->parts[p].shard == s)
                                L->shard_parts[k++] = p;
                L->shard_count[s] = k - L->shard_first[s];
        }
        free(mv);
        free(pv);
        *ret = L;
        return 0;
fail:
        free(mv);
        free(pv);
        job_layout_free(L);
        return r;
}

struct job_layout *job_layout_free(struct job_layout *L) {
        if (!L)
                return NULL;
        for (uint32_t i = 0; L->vars && i < L->n_vars; i++)
                free(L->vars[i].name);
        free(L->vars);
        placement_free(L->plan);
        free(L->shard_first);
        free(L);
        return NULL;
}

int job_layout_find(const struct job_layout *L, const char *name) {
        for (uint32_t i = 0; i < L->n_vars; i++)
                if (strcmp(L->vars[i].name, name) == 0)
                        return (int)i;
        return -ENOENT;
}

const char *job_state_name(int state) {
        switch (state) {
        case PSFLEET__V1__JOB_STATE__JOB_STATE_INITIALIZING: return "initializing";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_RESTORING: return "restoring";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_READY: return "ready";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING: return "training";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPING: return "stopping";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_DONE: return "done";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED: return "failed";
        case PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPED: return "stopped";
        default: return "unknown";
        }
}
