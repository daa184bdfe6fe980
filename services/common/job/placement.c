/* Greedy-by-bytes placement (the LPT rule); deterministic because every tie is broken explicitly. */
#include "placement.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct sort_item {
        struct placement_part *part;
        const char *name;
};

static int by_bytes_desc(const void *a, const void *b)
{
        const struct sort_item *x = a, *y = b;
        if (x->part->bytes != y->part->bytes)
                return x->part->bytes > y->part->bytes ? -1 : 1;
        int c = strcmp(x->name, y->name);
        if (c)
                return c;
        if (x->part->row_begin != y->part->row_begin)
                return x->part->row_begin < y->part->row_begin ? -1 : 1;
        /* equal names: fall back to the input order so qsort's instability can't show */
        return x->part->var < y->part->var ? -1 : x->part->var > y->part->var;
}

static uint64_t n_splits(const struct placement_var *v, uint64_t split_bytes)
{
        uint64_t bytes = (uint64_t)v->rows * v->row_bytes;
        if (split_bytes == 0 || bytes <= split_bytes)
                return 1;
        uint64_t k = bytes / split_bytes + (bytes % split_bytes != 0);
        return k > v->rows ? v->rows : k;
}

int placement_compute(const struct placement_var *vars, uint32_t n_vars, uint32_t n_shards,
                      uint64_t split_bytes, struct placement **ret)
{
        if (n_shards == 0 || (n_vars && !vars))
                return -EINVAL;
        uint64_t total = 0;
        for (uint32_t i = 0; i < n_vars; i++) {
                if (!vars[i].name || vars[i].rows == 0)
                        return -EINVAL;
                total += n_splits(&vars[i], split_bytes);
        }
        if (total > UINT32_MAX)
                return -EINVAL;
        /* the placement and its two arrays in one block, shard_bytes (8-byte) first */
        struct placement *p = calloc(1, sizeof(*p) + n_shards * sizeof(*p->shard_bytes) +
                                                (total ? total : 1) * sizeof(*p->parts));
        struct sort_item *items = calloc(total ? total : 1, sizeof(*items));
        if (!p || !items) {
                free(items);
                placement_free(p);
                return -ENOMEM;
        }
        p->n_shards = n_shards;
        p->n_parts = (uint32_t)total;
        p->shard_bytes = (uint64_t *)(p + 1);
        p->parts = (struct placement_part *)(p->shard_bytes + n_shards);
        uint32_t j = 0;
        for (uint32_t i = 0; i < n_vars; i++) {
                const struct placement_var *v = &vars[i];
                uint64_t k = n_splits(v, split_bytes);
                for (uint64_t s = 0; s < k; s++, j++) {
                        struct placement_part *pt = &p->parts[j];
                        pt->var = i;
                        /* even row ranges: sizes differ by at most one row */
                        pt->row_begin = (uint32_t)(s * v->rows / k);
                        pt->row_end = (uint32_t)((s + 1) * v->rows / k);
                        pt->bytes = (uint64_t)(pt->row_end - pt->row_begin) * v->row_bytes;
                        items[j].part = pt;
                        items[j].name = v->name;
                }
        }
        qsort(items, total, sizeof(*items), by_bytes_desc);
        for (uint32_t t = 0; t < total; t++) {
                uint32_t best = 0;
                for (uint32_t s = 1; s < n_shards; s++)
                        if (p->shard_bytes[s] < p->shard_bytes[best])
                                best = s;
                items[t].part->shard = best;
                p->shard_bytes[best] += items[t].part->bytes;
        }
        free(items);
        *ret = p;
        return 0;
}

struct placement *placement_free(struct placement *p)
{
        free(p);   /* and its arrays */
        return NULL;
}

uint32_t placement_var_parts(const struct placement *p, uint32_t var, uint32_t *first_ret)
{
        uint32_t n = 0;
        for (uint32_t i = 0; i < p->n_parts; i++) {
                if (p->parts[i].var != var)
                        continue;
                if (n == 0 && first_ret)
                        *first_ret = i;
                n++;
        }
        return n;
}

void placement_print(FILE *f, const struct placement *p, const struct placement_var *vars)
{
        fprintf(f, "%-5s  %-32s  %-21s  %12s\n", "shard", "variable", "rows", "bytes");
        for (uint32_t s = 0; s < p->n_shards; s++) {
                for (uint32_t i = 0; i < p->n_parts; i++) {
                        const struct placement_part *pt = &p->parts[i];
                        if (pt->shard != s)
                                continue;
                        char rows[32];
                        snprintf(rows, sizeof(rows), "%u-%u of %u", pt->row_begin, pt->row_end,
                                 vars[pt->var].rows);
                        fprintf(f, "%-5u  %-32s  %-21s  %12llu\n", s, vars[pt->var].name, rows,
                                (unsigned long long)pt->bytes);
                }
                fprintf(f, "%-5u  %-32s  %-21s  %12llu\n", s, "(total)", "",
                        (unsigned long long)p->shard_bytes[s]);
        }
}
