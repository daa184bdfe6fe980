/* AUC, log loss and RMSE over (score, label) pairs kept in one growing array: the AUC sorts them once
 * per call, so it is exact with ties counted half, not a histogram's approximation. */
#include "binmetrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "util.h"

struct pair {
        float p, y;
};

struct binmetrics {
        struct pair *v;         /* (n) */
        size_t n, cap;
};

int binmetrics_new(size_t cap_hint, struct binmetrics **ret)
{
        struct binmetrics *m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        if (cap_hint && grow_array((void **)&m->v, &m->cap, cap_hint, sizeof(*m->v), cap_hint) < 0) {
                free(m);
                return -ENOMEM;
        }
        *ret = m;
        return 0;
}

struct binmetrics *binmetrics_free(struct binmetrics *m)
{
        if (m) {
                free(m->v);
                free(m);
        }
        return NULL;
}

void binmetrics_reset(struct binmetrics *m)
{
        m->n = 0;
}

int binmetrics_add(struct binmetrics *m, const float *p, const float *y, size_t n)
{
        if (n > SIZE_MAX / 2 - m->n ||
            grow_array((void **)&m->v, &m->cap, m->n + n, sizeof(*m->v), 4096) < 0)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                m->v[m->n + i] = (struct pair){p[i], y[i]};
        m->n += n;
        return 0;
}

size_t binmetrics_count(const struct binmetrics *m)
{
        return m->n;
}

/* Ascending score; NaN first, all equal, so that the order is total and qsort well-defined. */
static int by_score(const void *a, const void *b)
{
        float x = ((const struct pair *)a)->p, y = ((const struct pair *)b)->p;
        if (isnan(x) || isnan(y))
                return isnan(y) - isnan(x);
        return (x > y) - (x < y);
}

double binmetrics_auc(struct binmetrics *m)
{
        if (m->n)
                qsort(m->v, m->n, sizeof(*m->v), by_score);
        /* Each positive scores one per negative below it and one half per negative of equal score. */
        double neg_below = 0, sum = 0, pos = 0;
        for (size_t i = 0; i < m->n;) {
                size_t j = i;
                double gp = 0, gn = 0;
                for (; j < m->n && by_score(&m->v[i], &m->v[j]) == 0; j++) {
                        if (m->v[j].y > 0.5f)
                                gp++;
                        else
                                gn++;
                }
                sum += gp * neg_below + 0.5 * gp * gn;
                neg_below += gn;
                pos += gp;
                i = j;
        }
        if (pos == 0 || neg_below == 0)
                return NAN;
        return sum / (pos * neg_below);
}

double binmetrics_logloss(const struct binmetrics *m)
{
        if (m->n == 0)
                return NAN;
        double s = 0;
        for (size_t i = 0; i < m->n; i++) {
                double p = fmin(fmax(m->v[i].p, 1e-7), 1 - 1e-7), y = m->v[i].y;
                s -= y * log(p) + (1 - y) * log(1 - p);
        }
        return s / (double)m->n;
}

double binmetrics_rmse(const struct binmetrics *m)
{
        if (m->n == 0)
                return NAN;
        double s = 0;
        for (size_t i = 0; i < m->n; i++) {
                double d = (double)m->v[i].p - m->v[i].y;
                s += d * d;
        }
        return sqrt(s / (double)m->n);
}
