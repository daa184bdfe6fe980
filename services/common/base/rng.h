/* Deterministic, portable random numbers: splitmix64 seeding + xoshiro256**. The same (seed, stream)
 * gives the same sequence on every machine (normal() uses libm's log/cos; glibc's are correctly
 * rounded enough that x86-64 and aarch64 agree in practice). Not thread-safe per struct rng; use one
 * per thread. Plain data so it can live on the stack. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct rng {
        uint64_t s[4];
};

/* Seeds from (seed, stream); different streams give independent-looking sequences. */
void rng_init(struct rng *r, uint64_t seed, uint64_t stream);
uint64_t rng_next(struct rng *r);                    /* 64 random bits */
uint32_t rng_below(struct rng *r, uint32_t n);       /* uniform in [0, n); n > 0; unbiased */
double rng_uniform(struct rng *r);                   /* uniform in [0, 1), 53 bits */
float rng_uniform_f(struct rng *r, float lo, float hi); /* uniform in [lo, hi) */
double rng_normal(struct rng *r);                    /* standard normal, Box-Muller (no caching) */
void rng_shuffle_u32(struct rng *r, uint32_t *a, size_t n); /* Fisher–Yates, in place */
uint64_t rng_splitmix64(uint64_t *state);            /* one splitmix64 step; also a good mixer */
