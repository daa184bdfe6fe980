/* Placement of variables on ps shards: deterministic greedy by bytes, computed identically by every
 * node from the job file. A variable larger than split_bytes is split into row ranges; parts are
 * taken largest first (ties: name, then first row) and each goes to the least-loaded shard (ties: lowest
 * index). Pure computation; thread-safe. */
#pragma once
#include <stdint.h>
#include <stdio.h>

struct placement_var {
        const char *name;
        uint32_t rows;
        uint64_t row_bytes;   /* bytes per row */
};

struct placement_part {
        uint32_t var;         /* index into the input variables */
        uint32_t row_begin, row_end; /* [row_begin, row_end) */
        uint32_t shard;
        uint64_t bytes;
};

/* Plain data. parts are ordered by (var, row_begin); a variable's parts are adjacent. */
struct placement {
        uint32_t n_shards;
        uint32_t n_parts;
        struct placement_part *parts;
        uint64_t *shard_bytes;   /* (n_shards) */
};

/* split_bytes == 0: never split. -EINVAL for n_shards == 0, a variable with 0 rows, or a NULL name;
 * -ENOMEM. */
int placement_compute(const struct placement_var *vars, uint32_t n_vars, uint32_t n_shards,
                      uint64_t split_bytes, struct placement **ret);
struct placement *placement_free(struct placement *p); /* NULL-safe; returns NULL */

/* Parts of variable `var`: writes the index of its first part and returns how many (0 if unknown). */
uint32_t placement_var_parts(const struct placement *p, uint32_t var, uint32_t *first_ret);

/* A table: shard, variable, rows, bytes; then the total per shard. */
void placement_print(FILE *f, const struct placement *p, const struct placement_var *vars);
