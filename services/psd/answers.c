/* Per worker, the values of its int8 parts as psd's answers left them: see answers.h. */
#include "answers.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "wire.h"

struct worker_copies {
        pthread_mutex_t mu;     /* over seq and copy (two answers to one worker: a retried push) */
        uint64_t *seq;          /* (n_parts) the answer each copy stands at; 0: none */
        float **copy;           /* (n_parts) NULL until the part's first answer */
};

struct psd_answers {
        uint32_t n_workers, n_parts;
        const size_t *parts_n;  /* (n_parts) copied below */
        atomic_uint_fast64_t next;
        struct worker_copies *w;
};

int psd_answers_new(uint32_t n_workers, uint32_t n_parts, const size_t *parts_n, struct psd_answers **ret) {
        struct psd_answers *a = calloc(1, sizeof(*a));
        size_t *pn = calloc(n_parts + 1, sizeof(size_t));
        if (!a || !pn || !(a->w = calloc(n_workers + 1, sizeof(*a->w)))) {
                free(a);
                free(pn);
                return -ENOMEM;
        }
        memcpy(pn, parts_n, n_parts * sizeof(size_t));
        a->parts_n = pn;
        a->n_parts = n_parts;
        a->n_workers = n_workers;
        for (uint32_t w = 0; w < n_workers; w++)
                pthread_mutex_init(&a->w[w].mu, NULL);
        for (uint32_t w = 0; w < n_workers; w++)
                if (!(a->w[w].seq = calloc(n_parts + 1, sizeof(uint64_t))) ||
                    !(a->w[w].copy = calloc(n_parts + 1, sizeof(float *)))) {
                        psd_answers_free(a);
                        return -ENOMEM;
                }
        /* numbers start at a random point (below 2^62: they never wrap), so another psd's never match */
        uint64_t start = 0;
        if (getrandom(&start, sizeof(start), 0) != sizeof(start))
                start = (uint64_t)(uintptr_t)a ^ 0x9e3779b97f4a7c15ull;
        atomic_init(&a->next, (start >> 2) | 1);
        *ret = a;
        return 0;
}

struct psd_answers *psd_answers_free(struct psd_answers *a) {
        if (!a)
                return NULL;
        for (uint32_t w = 0; w < a->n_workers; w++) {
                for (uint32_t i = 0; a->w[w].copy && i < a->n_parts; i++)
                        free(a->w[w].copy[i]);
                free(a->w[w].copy);
                free(a->w[w].seq);
                pthread_mutex_destroy(&a->w[w].mu);
        }
        free(a->w);
        free((size_t *)a->parts_n);
        free(a);
        return NULL;
}

/* every part's copy at base (under the worker's lock, or advisory) */
static bool all_at(const struct worker_copies *wc, const uint32_t *idx, size_t n, uint64_t base) {
        if (!base)
                return false;
        for (size_t i = 0; i < n; i++)
                if (wc->seq[idx[i]] != base)
                        return false;
        return true;
}

bool psd_answers_at(struct psd_answers *a, uint32_t w, const uint32_t *idx, size_t n, uint64_t base) {
        if (!a || w >= a->n_workers)
                return false;
        pthread_mutex_lock(&a->w[w].mu);
        bool at = all_at(&a->w[w], idx, n, base);
        pthread_mutex_unlock(&a->w[w].mu);
        return at;
}

uint64_t psd_answer_begin(struct psd_answers *a, uint32_t w, const uint32_t *idx, size_t n, uint64_t base,
                          bool want_delta, bool *delta) {
        *delta = false;
        if (!a || w >= a->n_workers)
                return 0;
        pthread_mutex_lock(&a->w[w].mu);
        *delta = want_delta && all_at(&a->w[w], idx, n, base);
        return atomic_fetch_add(&a->next, 1);
}

int psd_answer_part(struct psd_answers *a, uint32_t w, uint32_t idx, const float *v, bool delta, uint64_t seq,
                    uint8_t *dst) {
        struct worker_copies *wc = &a->w[w];
        size_t n = a->parts_n[idx];
        if (!wc->copy[idx] && !(wc->copy[idx] = malloc((n + 1) * sizeof(float)))) {
                wc->seq[idx] = 0;
                return -ENOMEM;
        }
        if (delta)
                wire_int8_delta_encode(dst, v, wc->copy[idx], n);
        else
                memcpy(wc->copy[idx], v, n * sizeof(float));
        wc->seq[idx] = seq;
        return 0;
}

void psd_answer_end(struct psd_answers *a, uint32_t w) {
        pthread_mutex_unlock(&a->w[w].mu);
}

const float *psd_answers_copy(const struct psd_answers *a, uint32_t w, uint32_t idx) {
        return w < a->n_workers && idx < a->n_parts ? a->w[w].copy[idx] : NULL;
}
