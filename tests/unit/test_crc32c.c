/* CRC-32C against published check values (RFC 3720 B.4), in pieces of every alignment, and the
 * TFRecord mask. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "unit.h"

#include "crc32c.h"

static void test_check_values(void **state) {
        (void)state;
        uint8_t buf[32];
        assert_int_equal(crc32c("123456789", 9), 0xE3069283u);
        assert_int_equal(crc32c("", 0), 0);
        memset(buf, 0, sizeof(buf));
        assert_int_equal(crc32c(buf, 32), 0x8A9136AAu);
        memset(buf, 0xff, sizeof(buf));
        assert_int_equal(crc32c(buf, 32), 0x62A8AB43u);
        for (int i = 0; i < 32; i++)
                buf[i] = (uint8_t)i;
        assert_int_equal(crc32c(buf, 32), 0x46DD794Eu);
        for (int i = 0; i < 32; i++)
                buf[i] = (uint8_t)(31 - i);
        assert_int_equal(crc32c(buf, 32), 0x113FDB5Cu);
}

static void test_pieces(void **state) {
        (void)state;
        uint8_t data[1000];
        for (size_t i = 0; i < sizeof(data); i++)
                data[i] = (uint8_t)(i * 131 + 7);
        uint32_t whole = crc32c(data, sizeof(data));
        for (size_t off = 0; off < 9; off++) {
                /* the slicing loop must give the same answer from any start alignment */
                uint8_t *copy = (uint8_t[1016]){0};
                memcpy(copy + off, data, sizeof(data));
                assert_int_equal(crc32c(copy + off, sizeof(data)), whole);
        }
        for (size_t cut = 0; cut <= sizeof(data); cut += 37) {
                uint32_t c = crc32c_update(0, data, cut);
                assert_int_equal(crc32c_update(c, data + cut, sizeof(data) - cut), whole);
        }
}

static void test_mask(void **state) {
        (void)state;
        assert_int_equal(crc32c_mask(0), 0xa282ead8u);
        uint32_t c = crc32c("123456789", 9);
        assert_int_equal(crc32c_mask(c), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_check_values),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_mask))
