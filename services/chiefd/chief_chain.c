/* Chains of incremental checkpoints, as data: which records make a chain, and a table's rows with an
 * increment applied (chief_chain.h). No files and no locks: chief_ckpt.c reads the files. */
#include "chief_chain.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* An index of a table's ids (open addressing over row numbers + 1). */
struct id_index {
        uint32_t *slot;
        size_t mask;
};

static size_t id_hash(uint64_t id) {
        id ^= id >> 33;
        id *= 0xff51afd7ed558ccdULL;
        id ^= id >> 33;
        return (size_t)id;
}

/* The slot of id in x over ids (found: *row), or the empty slot where it goes. */
static size_t id_find(const struct id_index *x, const uint64_t *ids, uint64_t id, size_t *row, bool *found) {
        size_t pos = id_hash(id) & x->mask;
        for (; x->slot[pos]; pos = (pos + 1) & x->mask)
                if (ids[x->slot[pos] - 1] == id) {
                        *row = x->slot[pos] - 1;
                        *found = true;
                        return pos;
                }
        *found = false;
        return pos;
}

/* Applies an increment to acc: the evicted ids go, then each of inc's rows replaces or joins acc's
 * (an id evicted and made again since the parent is in both). Order: acc's rows keep theirs, new ones
 * follow. 0 or -ENOMEM (acc unchanged but maybe grown). */
int chief_chain_apply(struct ps_sparse_rows *acc, const struct ps_sparse_rows *inc, const struct ps_sparse_rows *ev) {
        size_t dim = acc->dim, cap = acc->n + inc->n, want = 16;
        while (want < 2 * cap)
                want *= 2;
        if (cap >= UINT32_MAX)
                return -E2BIG;
        struct id_index x = {calloc(want, sizeof(uint32_t)), want - 1};
        bool *dead = calloc(cap + 1, sizeof(bool));
        int r = x.slot && dead ? 0 : -ENOMEM;
        uint64_t *ids = r >= 0 ? realloc(acc->ids, (cap + 1) * sizeof(uint64_t)) : NULL;
        if (ids)
                acc->ids = ids;
        else
                r = -ENOMEM;
        for (unsigned sl = 0; r >= 0 && sl <= acc->n_slots; sl++) {
                float **a = sl ? &acc->slots[sl - 1] : &acc->values;
                float *grown = realloc(*a, (cap + 1) * dim * sizeof(float));
                if (grown)
                        *a = grown;
                else
                        r = -ENOMEM;
        }
        size_t row;
        bool found;
        for (size_t i = 0; r >= 0 && i < acc->n; i++)
                x.slot[id_find(&x, acc->ids, acc->ids[i], &row, &found)] = (uint32_t)i + 1;
        for (size_t i = 0; r >= 0 && i < ev->n; i++) {
                id_find(&x, acc->ids, ev->ids[i], &row, &found);
                if (found)
                        dead[row] = true;
        }
        for (size_t i = 0; r >= 0 && i < inc->n; i++) {
                size_t pos = id_find(&x, acc->ids, inc->ids[i], &row, &found);
                if (!found) {
                        row = acc->n++;
                        acc->ids[row] = inc->ids[i];
                        x.slot[pos] = (uint32_t)row + 1;
                }
                dead[row] = false;
                for (unsigned sl = 0; sl <= acc->n_slots; sl++)
                        memcpy((sl ? acc->slots[sl - 1] : acc->values) + row * dim,
                               (sl ? inc->slots[sl - 1] : inc->values) + i * dim, dim * sizeof(float));
        }
        /* the evicted rows out, the others in their order */
        size_t k = 0;
        for (size_t i = 0; r >= 0 && i < acc->n; i++) {
                if (dead[i])
                        continue;
                if (k != i) {
                        acc->ids[k] = acc->ids[i];
                        for (unsigned sl = 0; sl <= acc->n_slots; sl++) {
                                float *a = sl ? acc->slots[sl - 1] : acc->values;
                                memcpy(a + k * dim, a + i * dim, dim * sizeof(float));
                        }
                }
                k++;
        }
        if (r >= 0)
                acc->n = k;
        free(x.slot);
        free(dead);
        return r;
}

/* The rows of row i's chain, full one first, into chain[] (*k of them). -ENOENT when a link's parent
 * is not recorded (or already forgotten, gone[]): *broken is then the row whose parent is missing. */
int chief_chain_of(const struct chief_db_checkpoint *rows, size_t n, const bool *gone, size_t i, size_t *chain,
                   size_t *k, size_t *broken) {
        size_t m = 0;
        for (size_t at = i;;) {
                if (m == n)
                        return -ELOOP;   /* a cycle: no full checkpoint under it */
                chain[m++] = at;
                if (!rows[at].incremental)
                        break;
                size_t j = n;
                for (size_t q = 0; q < n; q++)
                        if (!gone[q] && rows[q].global_step == rows[at].parent_step && q != at)
                                j = q;
                if (j == n) {
                        *broken = at;
                        return -ENOENT;
                }
                at = j;
        }
        for (size_t a = 0; a < m / 2; a++) {
                size_t t = chain[a];
                chain[a] = chain[m - 1 - a];
                chain[m - 1 - a] = t;
        }
        *k = m;
        return 0;
}
