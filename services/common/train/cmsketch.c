/* A count-min sketch of 8-bit counters with conservative update and periodic halving (cmsketch.h). */
#include "cmsketch.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

struct cmsketch {
        unsigned width_log2, depth;
        uint64_t reset_after;
        uint64_t adds;             /* additions since the last halving (atomic) */
        uint8_t *c;                /* (depth, 2^width_log2) */
};

int cmsketch_new(unsigned width_log2, unsigned depth, uint64_t reset_after, struct cmsketch **ret)
{
        if (width_log2 < 4 || width_log2 > 28 || depth < 1 || depth > 8)
                return -EINVAL;
        struct cmsketch *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->c = calloc((size_t)depth << width_log2, 1);
        if (!s->c) {
                free(s);
                return -ENOMEM;
        }
        s->width_log2 = width_log2;
        s->depth = depth;
        s->reset_after = reset_after;
        *ret = s;
        return 0;
}

struct cmsketch *cmsketch_free(struct cmsketch *s)
{
        if (s) {
                free(s->c);
                free(s);
        }
        return NULL;
}

size_t cmsketch_bytes_for(unsigned width_log2, unsigned depth)
{
        return sizeof(struct cmsketch) + ((size_t)depth << width_log2);
}

size_t cmsketch_bytes(const struct cmsketch *s)
{
        return cmsketch_bytes_for(s->width_log2, s->depth);
}

/* Row d's counter of key: double hashing over one 64-bit mix (Kirsch and Mitzenmacher). */
static inline uint8_t *counter(const struct cmsketch *s, uint64_t h1, uint64_t h2, unsigned d)
{
        size_t mask = ((size_t)1 << s->width_log2) - 1;
        return &s->c[((size_t)d << s->width_log2) + ((h1 + d * h2) & mask)];
}

static inline void mix(uint64_t key, uint64_t *h1, uint64_t *h2)
{
        uint64_t st = key;
        *h1 = rng_splitmix64(&st);
        *h2 = rng_splitmix64(&st) | 1;
}

/* The smallest of a key's counters. */
static unsigned min_of(const struct cmsketch *s, uint64_t h1, uint64_t h2)
{
        unsigned m = CMSKETCH_MAX;
        for (unsigned d = 0; d < s->depth; d++) {
                unsigned v = __atomic_load_n(counter(s, h1, h2, d), __ATOMIC_RELAXED);
                if (v < m)
                        m = v;
        }
        return m;
}

unsigned cmsketch_estimate(const struct cmsketch *s, uint64_t key)
{
        uint64_t h1, h2;
        mix(key, &h1, &h2);
        return min_of(s, h1, h2);
}

void cmsketch_halve(struct cmsketch *s)
{
        size_t n = (size_t)s->depth << s->width_log2;
        for (size_t i = 0; i < n; i++) {
                uint8_t v = __atomic_load_n(&s->c[i], __ATOMIC_RELAXED);
                if (v)
                        __atomic_store_n(&s->c[i], (uint8_t)(v >> 1), __ATOMIC_RELAXED);
        }
}

unsigned cmsketch_add(struct cmsketch *s, uint64_t key)
{
        uint64_t h1, h2;
        mix(key, &h1, &h2);
        unsigned m = min_of(s, h1, h2);
        if (m < CMSKETCH_MAX) {
                /* conservative update: only the counters at the minimum move (less overcounting) */
                for (unsigned d = 0; d < s->depth; d++) {
                        uint8_t *p = counter(s, h1, h2, d);
                        uint8_t v = __atomic_load_n(p, __ATOMIC_RELAXED);
                        while (v <= m && !__atomic_compare_exchange_n(p, &v, (uint8_t)(m + 1), false,
                                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                                ;
                }
                m++;
        }
        if (s->reset_after && __atomic_add_fetch(&s->adds, 1, __ATOMIC_RELAXED) % s->reset_after == 0)
                cmsketch_halve(s);
        return m;
}
