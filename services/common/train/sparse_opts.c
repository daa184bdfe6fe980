/* An embedding table's options from the job file: see sparse_opts.h. */
#include "sparse_opts.h"


#include "optim.h"
#include "rng.h"

uint64_t sparse_table_seed(uint64_t model_seed, uint32_t e) {
        /* distinct tables of one model draw unrelated rows for the same id */
        uint64_t s = model_seed ^ (0x9E3779B97F4A7C15ull * ((uint64_t)e + 1));
        return rng_splitmix64(&s);
}

void sparse_table_opts_from_config(const struct job_config *cfg, uint32_t e, struct sparse_table_opts *o) {
        const struct embedding_spec *es = &cfg->model.emb[e];
        const struct training_config *t = &cfg->training;
        /* every field not named here is zero */
        *o = (struct sparse_table_opts){
                .dim = es->dim, .optimizer = t->sparse_optimizer, .init_stddev = es->init_stddev,
                .seed = sparse_table_seed(cfg->model.seed, e),
                .initial_accumulator = t->initial_accumulator, .epsilon = t->epsilon,
                .ftrl_l1 = t->ftrl_l1, .ftrl_l2 = t->ftrl_l2, .ftrl_beta = t->ftrl_beta, .ftrl_lr_power = t->ftrl_lr_power,
                .max_rows = es->max_rows,
                .evict_policy = es->evict_policy, .admit_after = es->admit_after,
        };
        /* a graph's hashed table starts from its initializer's rows, as its dense variables start from
         * theirs (model.init "file"): its ids are the initializer's row numbers (id mod vocab) */
        if (es->init_rows && es->vocab && cfg->model.init == GRAPH_INIT_FILE) {
                o->init_rows = es->init_rows;
                o->n_init_rows = es->n_init_rows;
        }
}

uint64_t sparse_shard_max_rows(const struct job_config *cfg, uint32_t e) {
        return cfg->model.emb[e].max_rows / (cfg->cluster.n_ps ? cfg->cluster.n_ps : 1);
}

float sparse_learning_rate(const struct job_config *cfg, uint64_t global_step) {
        const struct training_config *t = &cfg->training;
        return (float)(t->sparse_learning_rate > 0 ? t->sparse_learning_rate : optim_learning_rate(t, global_step));
}
