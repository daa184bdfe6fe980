/* The values' encodings on the wire: bfloat16, int8 blocks and top-k (see wire.h). */
#include "wire.h"
#include "wire-internal.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* ---- bfloat16 ---- */

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire's tensors are little-endian, as this host");

#ifdef __SSE2__
/* Eight values at a time with SSE2 (every x86-64 has it; the compiler at -O2 would not vectorize the
 * rounding): a push converts a megabyte of gradients per step, so this is on the step's path. */
static inline __m128i bf16_round4(__m128i u) {
        const __m128i one = _mm_set1_epi32(1), bias = _mm_set1_epi32(0x7fff);
        const __m128i abs_mask = _mm_set1_epi32(0x7fffffff), inf = _mm_set1_epi32(0x7f800000);
        const __m128i quiet = _mm_set1_epi32(0x400000);
        __m128i r = _mm_add_epi32(_mm_add_epi32(u, bias), _mm_and_si128(_mm_srli_epi32(u, 16), one));
        __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, abs_mask), inf);   /* |u| > Inf bits: NaN */
        __m128i v = _mm_or_si128(_mm_and_si128(nan, _mm_or_si128(u, quiet)), _mm_andnot_si128(nan, r));
        return _mm_srai_epi32(v, 16);   /* arithmetic: packs_epi32 then keeps the 16 bits unsaturated */
}
#endif

/* round to nearest, ties to even; a NaN stays a (quiet) NaN instead of rounding to Inf. Writes
 * little-endian bytes anywhere (no alignment), so it may write straight into a message. */
void wire_bf16_pack(uint8_t *dst, const float *src, size_t n) {
        size_t i = 0;
#ifdef __SSE2__
        for (; i + 8 <= n; i += 8) {
                __m128i a = bf16_round4(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
                __m128i b = bf16_round4(_mm_loadu_si128((const __m128i *)(const void *)(src + i + 4)));
                _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i), _mm_packs_epi32(a, b));
        }
#endif
        for (; i < n; i++) {
                uint32_t u;
                memcpy(&u, &src[i], sizeof(u));
                uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
                uint32_t h = ((u & 0x7fffffffu) > 0x7f800000u ? (u | 0x400000u) : r) >> 16;
                dst[2 * i] = (uint8_t)h;
                dst[2 * i + 1] = (uint8_t)(h >> 8);
        }
}

void wire_bf16_from_f32(uint16_t *dst, const float *src, size_t n) {
        wire_bf16_pack((uint8_t *)dst, src, n);   /* this host is little-endian, as the wire (asserted above) */
}

void wire_bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
        size_t i = 0;
#ifdef __SSE2__
        const __m128i zero = _mm_setzero_si128();
        for (; i + 8 <= n; i += 8) {
                __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
                /* each 16 bits become the upper half of a 32-bit lane: exactly the float */
                _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm_unpacklo_epi16(zero, h));
                _mm_storeu_si128((__m128i *)(void *)(dst + i + 4), _mm_unpackhi_epi16(zero, h));
        }
#endif
        for (; i < n; i++) {
                uint32_t u = (uint32_t)src[i] << 16;
                memcpy(&dst[i], &u, sizeof(u));
        }
}

/* ---- int8 blocks, top-k ---- */

size_t wire_int8_size(size_t n) {
        return n + 4 * (n / WIRE_BLOCK + (n % WIRE_BLOCK != 0));
}

/* max |x| of len values, and whether all are finite (a NaN has no magnitude to compare) */
static float block_absmax(const float *x, size_t len, bool *finite) {
        size_t i = 0;
        float max = 0;
        bool ok = true;
#ifdef __SSE2__
        const __m128 abs = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff)), inf = _mm_set1_ps(INFINITY);
        __m128 m = _mm_setzero_ps(), bad = _mm_setzero_ps();
        for (; i + 4 <= len; i += 4) {
                __m128 v = _mm_and_ps(_mm_loadu_ps(x + i), abs);
                bad = _mm_or_ps(bad, _mm_cmpnlt_ps(v, inf));   /* Inf, or unordered: NaN */
                m = _mm_max_ps(m, v);
        }
        float lane[4];
        _mm_storeu_ps(lane, m);
        for (int k = 0; k < 4; k++)
                max = lane[k] > max ? lane[k] : max;
        ok = _mm_movemask_ps(bad) == 0;
#endif
        for (; i < len; i++) {
                float v = fabsf(x[i]);
                ok &= isfinite(v);
                max = v > max ? v : max;
        }
        *finite = ok;
        return max;
}

/* A push converts a model's gradients every step: 16 values at a time with SSE2, as bfloat16 does
 * (the compiler at -O2 keeps these loops scalar). Both round to nearest even. */
void wire_int8_encode(uint8_t *dst, const float *src, size_t n) {
        for (size_t b = 0; b < n; b += WIRE_BLOCK) {
                size_t len = n - b < WIRE_BLOCK ? n - b : WIRE_BLOCK, i = 0;
                const float *x = src + b;
                bool finite;
                float max = block_absmax(x, len, &finite);
                float inv = finite && max > 0 ? 127.0f / max : 0;   /* |x * inv| <= 127: no clamp needed */
                put_f32(dst, finite ? max / 127.0f : NAN);
                uint8_t *q = dst + 4;
                if (!finite)
                        i = len, memset(q, 0, len);
#ifdef __SSE2__
                const __m128 vinv = _mm_set1_ps(inv);
                for (; i + 16 <= len; i += 16) {
                        __m128i q0 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i), vinv));
                        __m128i q1 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i + 4), vinv));
                        __m128i q2 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i + 8), vinv));
                        __m128i q3 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i + 12), vinv));
                        __m128i w = _mm_packs_epi16(_mm_packs_epi32(q0, q1), _mm_packs_epi32(q2, q3));
                        _mm_storeu_si128((__m128i *)(void *)(q + i), w);
                }
#endif
                for (; i < len; i++)
                        q[i] = (uint8_t)(int8_t)nearbyintf(x[i] * inv);
                dst += 4 + len;
        }
}

void wire_int8_decode(float *dst, const uint8_t *src, size_t n) {
        for (size_t b = 0; b < n; b += WIRE_BLOCK) {
                size_t len = n - b < WIRE_BLOCK ? n - b : WIRE_BLOCK, i = 0;
                float scale = get_f32(src), *y = dst + b;
                const uint8_t *q = src + 4;
#ifdef __SSE2__
                const __m128 vs = _mm_set1_ps(scale);
                for (; i + 16 <= len; i += 16) {
                        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(q + i));
                        /* sign-extend: each byte doubled into a 16-bit lane, shifted down arithmetically */
                        __m128i lo = _mm_srai_epi16(_mm_unpacklo_epi8(v, v), 8), hi = _mm_srai_epi16(_mm_unpackhi_epi8(v, v), 8);
                        __m128i d0 = _mm_srai_epi32(_mm_unpacklo_epi16(lo, lo), 16);
                        __m128i d1 = _mm_srai_epi32(_mm_unpackhi_epi16(lo, lo), 16);
                        __m128i d2 = _mm_srai_epi32(_mm_unpacklo_epi16(hi, hi), 16);
                        __m128i d3 = _mm_srai_epi32(_mm_unpackhi_epi16(hi, hi), 16);
                        _mm_storeu_ps(y + i, _mm_mul_ps(_mm_cvtepi32_ps(d0), vs));
                        _mm_storeu_ps(y + i + 4, _mm_mul_ps(_mm_cvtepi32_ps(d1), vs));
                        _mm_storeu_ps(y + i + 8, _mm_mul_ps(_mm_cvtepi32_ps(d2), vs));
                        _mm_storeu_ps(y + i + 12, _mm_mul_ps(_mm_cvtepi32_ps(d3), vs));
                }
#endif
                for (; i < len; i++)
                        y[i] = (float)(int8_t)q[i] * scale;
                src += 4 + len;
        }
}

void wire_f32_add(float *dst, const float *y, size_t n) {
        size_t i = 0;
#ifdef __SSE2__
        for (; i + 8 <= n; i += 8) {
                _mm_storeu_ps(dst + i, _mm_add_ps(_mm_loadu_ps(dst + i), _mm_loadu_ps(y + i)));
                _mm_storeu_ps(dst + i + 4, _mm_add_ps(_mm_loadu_ps(dst + i + 4), _mm_loadu_ps(y + i + 4)));
        }
#endif
        for (; i < n; i++)
                dst[i] = dst[i] + y[i];
}

/* d = v - c for a block, and its largest magnitude (NaN and Inf: *finite false) */
static float block_sub_absmax(float *d, const float *v, const float *c, size_t len, bool *finite) {
        size_t i = 0;
#ifdef __SSE2__
        for (; i + 4 <= len; i += 4)
                _mm_storeu_ps(d + i, _mm_sub_ps(_mm_loadu_ps(v + i), _mm_loadu_ps(c + i)));
#endif
        for (; i < len; i++)
                d[i] = v[i] - c[i];
        return block_absmax(d, len, finite);
}

void wire_int8_delta_encode(uint8_t *dst, const float *v, float *copy, size_t n) {
        for (size_t b = 0; b < n; b += WIRE_BLOCK) {
                size_t len = n - b < WIRE_BLOCK ? n - b : WIRE_BLOCK, i = 0;
                float d[WIRE_BLOCK], *c = copy + b;
                bool finite;
                float max = block_sub_absmax(d, v + b, c, len, &finite);
                if (!finite || !(max > 0)) {
                        /* nothing changed, or a NaN the receiver will refuse: as wire_int8_encode writes it */
                        wire_int8_encode(dst, d, len);
                        wire_int8_decode(d, dst, len);
                        wire_f32_add(c, d, len);
                        dst += wire_int8_size(len);
                        continue;
                }
                /* as wire_int8_encode, and each value as wire_int8_decode gives it back, added to the copy */
                float scale = max / 127.0f, inv = 127.0f / max;
                put_f32(dst, scale);
                uint8_t *q = dst + 4;
#ifdef __SSE2__
                const __m128 vinv = _mm_set1_ps(inv), vs = _mm_set1_ps(scale);
                for (; i + 16 <= len; i += 16) {
                        __m128i q0 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(d + i), vinv));
                        __m128i q1 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(d + i + 4), vinv));
                        __m128i q2 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(d + i + 8), vinv));
                        __m128i q3 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(d + i + 12), vinv));
                        _mm_storeu_si128((__m128i *)(void *)(q + i),
                                         _mm_packs_epi16(_mm_packs_epi32(q0, q1), _mm_packs_epi32(q2, q3)));
                        _mm_storeu_ps(c + i, _mm_add_ps(_mm_loadu_ps(c + i), _mm_mul_ps(_mm_cvtepi32_ps(q0), vs)));
                        _mm_storeu_ps(c + i + 4, _mm_add_ps(_mm_loadu_ps(c + i + 4), _mm_mul_ps(_mm_cvtepi32_ps(q1), vs)));
                        _mm_storeu_ps(c + i + 8, _mm_add_ps(_mm_loadu_ps(c + i + 8), _mm_mul_ps(_mm_cvtepi32_ps(q2), vs)));
                        _mm_storeu_ps(c + i + 12, _mm_add_ps(_mm_loadu_ps(c + i + 12), _mm_mul_ps(_mm_cvtepi32_ps(q3), vs)));
                }
#endif
                for (; i < len; i++) {
                        int8_t k = (int8_t)nearbyintf(d[i] * inv);
                        q[i] = (uint8_t)k;
                        c[i] = c[i] + (float)k * scale;
                }
                dst += 4 + len;
        }
}

size_t wire_topk_max_size(size_t n, unsigned k) {
        size_t full = n / WIRE_BLOCK, rest = n % WIRE_BLOCK;
        size_t per = k < WIRE_BLOCK ? k : WIRE_BLOCK, last = k < rest ? k : rest;
        return full * (2 + per * WIRE_TOPK_ENTRY) + (rest ? 2 + last * WIRE_TOPK_ENTRY : 0);
}

/* the k-th largest of m[0..n) (1 <= k <= n, no NaN), reordering m: quickselect with a three-way
 * partition (gradients hold many equal values, zeros above all) */
static float kth_largest(float *m, int n, int k) {
        int lo = 0, hi = n - 1, want = k - 1;
        while (lo < hi) {
                float pivot = m[lo + (hi - lo) / 2], t;
                int lt = lo, i = lo, gt = hi;   /* [lo, lt) > pivot, [lt, i) == pivot, (gt, hi] < pivot */
                while (i <= gt) {
                        if (m[i] > pivot) {
                                t = m[lt], m[lt++] = m[i], m[i++] = t;
                        } else if (m[i] < pivot) {
                                t = m[gt], m[gt--] = m[i], m[i] = t;
                        } else {
                                i++;
                        }
                }
                if (want < lt)
                        hi = lt - 1;
                else if (want > gt)
                        lo = gt + 1;
                else
                        return pivot;
        }
        return m[want];
}

/* the k-th largest of m[0..n) (1 <= k <= TOPK_SMALL, k <= n) in one pass: the k largest so far, kept
 * sorted; most values lose to the smallest of them at the first comparison (four at a time with SSE2) */
#define TOPK_SMALL 16
static float kth_largest_small(const float *m, int n, int k) {
        float top[TOPK_SMALL];
        int have = 0, i = 0;
        while (i < n) {
#ifdef __SSE2__
                if (have == k) {
                        const __m128 least = _mm_set1_ps(top[k - 1]);
                        while (i + 4 <= n && !_mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(m + i), least)))
                                i += 4;
                        if (i == n)
                                break;
                }
#endif
                float a = m[i++];
                if (have == k && !(a > top[k - 1]))
                        continue;
                int j = have < k ? have++ : k - 1;
                for (; j > 0 && top[j - 1] < a; j--)
                        top[j] = top[j - 1];
                top[j] = a;
        }
        return top[k - 1];
}

/* mag[i] = |x[i]|, NaN as Inf: a value that is not finite is taken first, sent, and refused */
static void topk_magnitudes(float *mag, const float *x, size_t len) {
        size_t i = 0;
#ifdef __SSE2__
        const __m128 abs = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff)), inf = _mm_set1_ps(INFINITY);
        for (; i + 4 <= len; i += 4) {
                __m128 v = _mm_loadu_ps(x + i), nan = _mm_cmpunord_ps(v, v);
                _mm_storeu_ps(mag + i, _mm_or_ps(_mm_andnot_ps(nan, _mm_and_ps(v, abs)), _mm_and_ps(nan, inf)));
        }
#endif
        for (; i < len; i++)
                mag[i] = isnan(x[i]) ? INFINITY : fabsf(x[i]);
}

/* the indices of mag[0..len) at or above thr, in order, into idx; returns how many */
static size_t topk_candidates(uint8_t *idx, const float *mag, size_t len, float thr) {
        size_t i = 0, n = 0;
#ifdef __SSE2__
        const __m128 t = _mm_set1_ps(thr);
        for (; i + 4 <= len; i += 4)
                for (int m = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(mag + i), t)); m; m &= m - 1)
                        idx[n++] = (uint8_t)(i + (size_t)__builtin_ctz((unsigned)m));
#endif
        for (; i < len; i++)
                if (mag[i] >= thr)
                        idx[n++] = (uint8_t)i;
        return n;
}

size_t wire_topk_encode(uint8_t *dst, const float *src, size_t n, unsigned k) {
        uint8_t *p = dst;
        for (size_t b = 0; b < n; b += WIRE_BLOCK) {
                size_t len = n - b < WIRE_BLOCK ? n - b : WIRE_BLOCK;
                const float *x = src + b;
                float mag[WIRE_BLOCK], sel[WIRE_BLOCK], thr;
                uint8_t cand[WIRE_BLOCK];
                size_t c = k < len ? k : len;
                topk_magnitudes(mag, x, len);
                if (c <= TOPK_SMALL) {
                        thr = kth_largest_small(mag, (int)len, (int)c);
                } else {
                        memcpy(sel, mag, len * sizeof(float));
                        thr = kth_largest(sel, (int)len, (int)c);
                }
                size_t nc = topk_candidates(cand, mag, len, thr), above = 0;
                for (size_t j = 0; j < nc; j++)
                        above += mag[cand[j]] > thr;
                size_t ties = c - above;   /* the values equal to the threshold taken, lowest index first */
                p[0] = (uint8_t)c;
                p[1] = (uint8_t)(c >> 8);
                p += 2;
                for (size_t j = 0; j < nc; j++) {
                        uint8_t i = cand[j];
                        if (!(mag[i] > thr)) {
                                if (!ties)
                                        continue;
                                ties--;
                        }
                        p[0] = i;
                        put_f32(p + 1, x[i]);
                        p += WIRE_TOPK_ENTRY;
                }
        }
        return (size_t)(p - dst);
}

size_t wire_topk_decode(float *dst, const uint8_t *src, size_t n) {
        const uint8_t *p = src;
        for (size_t b = 0; b < n; b += WIRE_BLOCK) {
                size_t len = n - b < WIRE_BLOCK ? n - b : WIRE_BLOCK;
                uint32_t c = get_u16(p);
                p += 2;
                memset(dst + b, 0, len * sizeof(float));
                for (uint32_t i = 0; i < c; i++, p += WIRE_TOPK_ENTRY)
                        if (p[0] < len)
                                dst[b + p[0]] = get_f32(p + 1);
        }
        return (size_t)(p - src);
}
