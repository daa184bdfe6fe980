/* An embedding table's options as the job file sets them, one function for every node that holds a
 * table (psd's shards, the standalone trainer), so that a row starts alike wherever it lives. */
#pragma once
#include <stdint.h>

#include "config.h"
#include "sparse_table.h"

/* Rows per SparseExchange, SparseExport or SparseImport message, and floats per message (rows and
 * slots): psd refuses more, the ps client splits below it. */
#define SPARSE_MAX_IDS (1u << 20)
#define SPARSE_MAX_FLOATS (1u << 24)

/* The seed of table e's rows: model.seed and the table's index, mixed. */
uint64_t sparse_table_seed(uint64_t model_seed, uint32_t e);

/* Table e (< cfg->model.n_embeddings) of the job: its dim, init_stddev, the training.sparse_optimizer
 * and its keys, sparse_table_seed, and its max_rows (the whole table's: a ps shard holds its share,
 * sparse_shard_max_rows), evict_policy and admit_after. */
void sparse_table_opts_from_config(const struct job_config *cfg, uint32_t e, struct sparse_table_opts *o);

/* The rows table e may hold on one ps shard: max_rows / n_ps (0: no bound). */
uint64_t sparse_shard_max_rows(const struct job_config *cfg, uint32_t e);

/* The rows' learning rate at global_step: training.sparse_learning_rate, or the dense one's schedule
 * (optim_learning_rate) when that is 0. */
float sparse_learning_rate(const struct job_config *cfg, uint64_t global_step);
