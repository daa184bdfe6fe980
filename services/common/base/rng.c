/* xoshiro256** (Blackman & Vigna) seeded through splitmix64. */
#include "rng.h"

#include <assert.h>
#include <math.h>

uint64_t rng_splitmix64(uint64_t *state)
{
        uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
}

void rng_init(struct rng *r, uint64_t seed, uint64_t stream)
{
        uint64_t st = seed;
        uint64_t mixed = rng_splitmix64(&st) ^ stream;
        st = mixed;
        /* Feed the stream through a second splitmix step so nearby (seed, stream) pairs diverge. */
        st = rng_splitmix64(&st) ^ (stream * 0xd1b54a32d192ed03ULL);
        for (int i = 0; i < 4; i++)
                r->s[i] = rng_splitmix64(&st);
        if ((r->s[0] | r->s[1] | r->s[2] | r->s[3]) == 0)
                r->s[0] = 1; /* the all-zero state is a fixed point */
}

static inline uint64_t rotl(uint64_t x, int k)
{
        return (x << k) | (x >> (64 - k));
}

uint64_t rng_next(struct rng *r)
{
        uint64_t *s = r->s;
        uint64_t result = rotl(s[1] * 5, 7) * 9;
        uint64_t t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = rotl(s[3], 45);
        return result;
}

uint32_t rng_below(struct rng *r, uint32_t n)
{
        assert(n > 0);
        /* Lemire's multiply-shift with rejection: unbiased. */
        uint64_t m = (uint64_t)(uint32_t)(rng_next(r) >> 32) * n;
        uint32_t lo = (uint32_t)m;
        if (lo < n) {
                uint32_t thresh = (uint32_t)(-n) % n;
                while (lo < thresh) {
                        m = (uint64_t)(uint32_t)(rng_next(r) >> 32) * n;
                        lo = (uint32_t)m;
                }
        }
        return (uint32_t)(m >> 32);
}

double rng_uniform(struct rng *r)
{
        return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

float rng_uniform_f(struct rng *r, float lo, float hi)
{
        return (float)(lo + (hi - lo) * rng_uniform(r));
}

double rng_normal(struct rng *r)
{
        double u1 = 1.0 - rng_uniform(r); /* (0, 1]: log is finite */
        double u2 = rng_uniform(r);
        return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void rng_shuffle_u32(struct rng *r, uint32_t *a, size_t n)
{
        assert(n <= UINT32_MAX);
        for (size_t i = n; i > 1; i--) {
                uint32_t j = rng_below(r, (uint32_t)i);
                uint32_t t = a[i - 1];
                a[i - 1] = a[j];
                a[j] = t;
        }
}
