/* The job's row blocks set on a model: see blocks.h. */
#include "blocks.h"

#include <errno.h>
#include <stdlib.h>

int job_model_blocks(const struct job_layout *L, struct model *m, bool *blocked) {
        for (uint32_t v = 0; v < L->n_vars; v++) {
                uint32_t first, n = placement_var_parts(L->plan, v, &first);
                bool b = false;
                if (n > 1) {
                        uint32_t *rows = malloc(n * sizeof(uint32_t));
                        if (!rows)
                                return -ENOMEM;
                        for (uint32_t i = 0; i < n; i++)
                                rows[i] = L->plan->parts[first + i].row_begin;
                        int r = model_set_var_blocks(m, v, n, rows);
                        free(rows);
                        if (r < 0 && r != -EOPNOTSUPP)
                                return r;
                        b = r >= 0;
                }
                if (blocked)
                        blocked[v] = b;
        }
        return 0;
}
