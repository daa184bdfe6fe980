/* What wire.c and wire_codec.c share; not part of wire.h's interface. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t get_u16(const uint8_t *p) {
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static inline float get_f32(const uint8_t *p) {
        uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        float f;
        memcpy(&f, &u, sizeof(f));
        return f;
}

static inline void put_f32(uint8_t *p, float f) {
        uint32_t u;
        memcpy(&u, &f, sizeof(u));
        p[0] = (uint8_t)u;
        p[1] = (uint8_t)(u >> 8);
        p[2] = (uint8_t)(u >> 16);
        p[3] = (uint8_t)(u >> 24);
}

/* n floats as bfloat16 (round to nearest even, NaN kept NaN), little-endian, into dst (2n bytes). */
void wire_bf16_pack(uint8_t *dst, const float *src, size_t n);
