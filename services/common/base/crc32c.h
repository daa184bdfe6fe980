/* CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected), as TFRecord framing and the checkpoint
 * checksums use it. Table-driven (slicing by 8); pure functions, thread-safe. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes at p. crc32c_update(0, "123456789", 9) == 0xE3069283. */
uint32_t crc32c_update(uint32_t crc, const void *p, size_t n);
static inline uint32_t crc32c(const void *p, size_t n) {
        return crc32c_update(0, p, n);
}
/* TFRecord's masked CRC: rotate right by 15 bits and add 0xa282ead8, so that a CRC stored in data
 * that is itself checksummed does not cancel out. */
static inline uint32_t crc32c_mask(uint32_t crc) {
        return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
