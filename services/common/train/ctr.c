/* The sparse front of a model with embeddings (ctr.h): a batch's unique ids per table, found with an
 * open-addressing map sized per batch inside buffers that are reused, so a step allocates nothing and
 * touches memory in proportion to the ids it uses. The buffers start at one id per field per record
 * (Criteo's records) and grow only when a batch holds more, up to the max_ids bound. */
#include "ctr.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct table {
        struct embedding_spec e;
        uint32_t x_off;          /* floats into a row of x of this table's first field slice */
        uint32_t n_uniq;
        size_t have;             /* occurrences (and so unique ids) the buffers hold */
        void *buf;               /* one block, carved into the views below */
        uint64_t *uniq;          /* (have) */
        uint64_t *hkey;          /* (map) the map of a power of two >= 2 * have slots: hval 0 empty, else the
                                  * unique index + 1 */
        float *rows, *grads;     /* (have, dim) */
        uint32_t *occ;           /* (have) each occurrence's unique index, in gather order */
        uint32_t *hval;          /* (map) */
};

struct ctr {
        uint32_t n_dense, width, max_batch, max_ids, n_tables;
        size_t cap;              /* the most occurrences (and so unique ids) of a table in a batch */
        struct table t[MODEL_MAX_EMBEDDINGS];
};

static uint64_t mix(uint64_t x)
{
        x ^= x >> 30;
        x *= UINT64_C(0xbf58476d1ce4e5b9);
        x ^= x >> 27;
        x *= UINT64_C(0x94d049bb133111eb);
        return x ^ (x >> 31);
}

/* Room for n occurrences and a map of twice as many slots (a power of two), in one new block: nothing
 * in the buffers is kept (a batch fills them afresh). The old block stays when there is no memory for
 * the new one. 0 or -ENOMEM. */
static int grow(struct table *t, size_t n)
{
        size_t h = 16, nf = n * t->e.dim;
        while (h < 2 * n)
                h <<= 1;
        /* the 8-byte arrays first, so that every view is aligned */
        char *p = malloc((n + h) * sizeof(uint64_t) + 2 * nf * sizeof(float) + (n + h) * sizeof(uint32_t));
        if (!p)
                return -ENOMEM;
        free(t->buf);
        t->buf = p;
        t->uniq = (uint64_t *)p;
        t->hkey = t->uniq + n;
        t->rows = (float *)(t->hkey + h);
        t->grads = t->rows + nf;
        t->occ = (uint32_t *)(t->grads + nf);
        t->hval = t->occ + n;
        t->have = n;
        return 0;
}

int ctr_new(const struct model_spec *spec, uint32_t max_batch, uint32_t max_ids, struct ctr **ret)
{
        /* a record's dense features are flat, or without embeddings an image (tfrecord) as [C, H, W] */
        if (!spec || spec->n_embeddings > MODEL_MAX_EMBEDDINGS || max_batch == 0 || max_ids == 0 ||
            (spec->n_embeddings && (spec->input[0] != 1 || spec->input[1] != 1)))
                return -EINVAL;
        /* a table's occurrences in a batch: each record has at most max_ids ids, all fields together */
        size_t cap = (size_t)max_batch * max_ids;
        if (cap >= UINT32_MAX / 4)
                return -EINVAL;
        struct ctr *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        *c = (struct ctr){.n_dense = spec->input[0] * spec->input[1] * spec->input[2], .width = model_spec_dense_input(spec), .max_batch = max_batch,
                          .max_ids = max_ids, .n_tables = spec->n_embeddings, .cap = cap};
        uint32_t off = c->n_dense;
        for (uint32_t i = 0; i < c->n_tables; i++) {
                struct table *t = &c->t[i];
                t->e = spec->emb[i];
                if (t->e.dim == 0 || t->e.n_fields == 0 || t->e.n_fields > MODEL_MAX_FIELDS) {
                        ctr_free(c);
                        return -EINVAL;
                }
                t->x_off = off;
                off += t->e.n_fields * t->e.dim;
                size_t first = (size_t)max_batch * t->e.n_fields;
                if (grow(t, first < cap ? first : cap) < 0) {
                        ctr_free(c);
                        return -ENOMEM;
                }
        }
        *ret = c;
        return 0;
}

struct ctr *ctr_free(struct ctr *c)
{
        if (!c)
                return NULL;
        for (uint32_t i = 0; i < c->n_tables; i++)
                free(c->t[i].buf);
        free(c);
        return NULL;
}

uint32_t ctr_width(const struct ctr *c)
{
        return c->width;
}

/* Ids [lo, hi) of record r's field f in b. */
static void field_span(const struct records_batch *b, uint32_t r, uint32_t f, uint32_t *lo, uint32_t *hi)
{
        *lo = b->off[(size_t)r * b->n_fields + f];
        *hi = b->off[(size_t)r * b->n_fields + f + 1];
}

static int gather_table(struct ctr *c, struct table *t, const struct records_batch *b)
{
        size_t n_occ = 0, hcap = 16;
        uint32_t lo, hi;
        int err;

        for (uint32_t r = 0; r < b->n; r++)
                for (uint32_t j = 0; j < t->e.n_fields; j++) {
                        field_span(b, r, t->e.fields[j], &lo, &hi);
                        if (hi < lo)
                                return -EINVAL;
                        n_occ += hi - lo;
                }
        if (n_occ > c->cap)
                return -EINVAL;
        /* a batch past the high-water mark grows the buffers for good: later ones reuse them */
        if (n_occ > t->have && (err = grow(t, n_occ < c->cap / 2 ? 2 * n_occ : c->cap)) < 0)
                return err;
        while (hcap < 2 * n_occ)
                hcap <<= 1;
        memset(t->hval, 0, sizeof(uint32_t) * hcap);
        size_t mask = hcap - 1, o = 0;
        t->n_uniq = 0;
        for (uint32_t r = 0; r < b->n; r++)
                for (uint32_t j = 0; j < t->e.n_fields; j++) {
                        field_span(b, r, t->e.fields[j], &lo, &hi);
                        for (uint32_t k = lo; k < hi; k++) {
                                uint64_t id = t->e.vocab ? b->ids[k] % t->e.vocab : b->ids[k];
                                size_t s = mix(id) & mask;
                                while (t->hval[s] && t->hkey[s] != id)
                                        s = (s + 1) & mask;
                                if (!t->hval[s]) {
                                        t->hkey[s] = id;
                                        t->uniq[t->n_uniq] = id;
                                        t->hval[s] = ++t->n_uniq;
                                }
                                t->occ[o++] = t->hval[s] - 1;
                        }
                }
        return 0;
}

int ctr_gather(struct ctr *c, const struct records_batch *b)
{
        int r;

        if (!b || b->n > c->max_batch || b->n_dense != c->n_dense || b->max_ids > c->max_ids)
                return -EINVAL;
        for (uint32_t i = 0; i < c->n_tables; i++) {
                for (uint32_t j = 0; j < c->t[i].e.n_fields; j++)
                        if (c->t[i].e.fields[j] >= b->n_fields)
                                return -EINVAL;
        }
        for (uint32_t i = 0; i < c->n_tables; i++)
                if ((r = gather_table(c, &c->t[i], b)) < 0) {
                        for (uint32_t k = 0; k < c->n_tables; k++)
                                c->t[k].n_uniq = 0;
                        return r;
                }
        return 0;
}

uint32_t ctr_n_unique(const struct ctr *c, uint32_t e)
{
        return e < c->n_tables ? c->t[e].n_uniq : 0;
}

const uint64_t *ctr_unique(const struct ctr *c, uint32_t e)
{
        return e < c->n_tables ? c->t[e].uniq : NULL;
}

float *ctr_rows(struct ctr *c, uint32_t e)
{
        return e < c->n_tables ? c->t[e].rows : NULL;
}

const float *ctr_grads(const struct ctr *c, uint32_t e)
{
        return e < c->n_tables ? c->t[e].grads : NULL;
}

/* An occurrence's pooling weight: its value (sum), or 1 / the field's ids (mean). */
static float weight(const struct table *t, const struct records_batch *b, uint32_t k, uint32_t n)
{
        return t->e.pooling == POOL_MEAN ? 1.0f / (float)n : b->val[k];
}

void ctr_input(struct ctr *c, const struct records_batch *b, float *x)
{
        for (uint32_t r = 0; r < b->n; r++)
                memcpy(x + (size_t)r * c->width, b->dense + (size_t)r * c->n_dense, sizeof(float) * c->n_dense);
        for (uint32_t i = 0; i < c->n_tables; i++) {
                const struct table *t = &c->t[i];
                uint32_t dim = t->e.dim, lo, hi;
                size_t o = 0;
                for (uint32_t r = 0; r < b->n; r++)
                        for (uint32_t j = 0; j < t->e.n_fields; j++) {
                                float *s = x + (size_t)r * c->width + t->x_off + (size_t)j * dim;
                                memset(s, 0, sizeof(float) * dim);
                                field_span(b, r, t->e.fields[j], &lo, &hi);
                                for (uint32_t k = lo; k < hi; k++) {
                                        const float *row = t->rows + (size_t)t->occ[o++] * dim;
                                        float w = weight(t, b, k, hi - lo);
                                        for (uint32_t d = 0; d < dim; d++)
                                                s[d] += w * row[d];
                                }
                        }
        }
}

void ctr_row_grads(struct ctr *c, const struct records_batch *b, const float *dx)
{
        for (uint32_t i = 0; i < c->n_tables; i++) {
                struct table *t = &c->t[i];
                uint32_t dim = t->e.dim, lo, hi;
                size_t o = 0;
                memset(t->grads, 0, sizeof(float) * t->n_uniq * dim);
                for (uint32_t r = 0; r < b->n; r++)
                        for (uint32_t j = 0; j < t->e.n_fields; j++) {
                                const float *g = dx + (size_t)r * c->width + t->x_off + (size_t)j * dim;
                                field_span(b, r, t->e.fields[j], &lo, &hi);
                                for (uint32_t k = lo; k < hi; k++) {
                                        float *row = t->grads + (size_t)t->occ[o++] * dim;
                                        float w = weight(t, b, k, hi - lo);
                                        for (uint32_t d = 0; d < dim; d++)
                                                row[d] += w * g[d];
                                }
                        }
        }
}
