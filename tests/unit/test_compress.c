/* compress.c: which format each variable's gradient takes, and error feedback: over any number of
 * steps, what was sent adds up to what was computed less the residual still held. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "compress.h"
#include "unit.h"
#include "wire.h"

static void test_choice(void **state) {
        (void)state;
        assert_int_equal(compress_dtype(RPC_COMPRESS_NONE, 1 << 20, 0), WIRE_DTYPE_FLOAT32);
        assert_int_equal(compress_dtype(RPC_COMPRESS_BF16, 40, 4096), WIRE_DTYPE_BFLOAT16);
        assert_int_equal(compress_dtype(RPC_COMPRESS_INT8, 4096, 4096), WIRE_DTYPE_INT8_BLOCKS);
        assert_int_equal(compress_dtype(RPC_COMPRESS_INT8, 4092, 4096), WIRE_DTYPE_FLOAT32);   /* a bias */
        assert_int_equal(compress_dtype(RPC_COMPRESS_TOPK, 1 << 20, 4096), WIRE_DTYPE_TOPK);
        assert_int_equal(compress_dtype(RPC_COMPRESS_TOPK, 40, 4096), WIRE_DTYPE_FLOAT32);
        assert_int_equal(compress_answer_dtype(WIRE_DTYPE_FLOAT32), WIRE_DTYPE_FLOAT32);
        assert_int_equal(compress_answer_dtype(WIRE_DTYPE_BFLOAT16), WIRE_DTYPE_BFLOAT16);
        assert_int_equal(compress_answer_dtype(WIRE_DTYPE_INT8_BLOCKS), WIRE_DTYPE_BFLOAT16);
        assert_int_equal(compress_answer_dtype(WIRE_DTYPE_TOPK), WIRE_DTYPE_BFLOAT16);
        assert_int_equal(compress_topk_k(0.01), 3);   /* 2.56 up */
        assert_int_equal(compress_topk_k(1e-9), 1);
        assert_int_equal(compress_topk_k(0.5), 128);
        assert_int_equal(compress_topk_k(0.999999), 256);
}

/* auto: int8 to a shard beyond loopback (its psd or its backup) or under mutual TLS, none over plain TCP on
 * loopback; others as given */
static void test_for_shard(void **state) {
        (void)state;
        assert_int_equal(compress_for_shard(RPC_COMPRESS_AUTO, "127.0.0.1:7000", NULL, false), RPC_COMPRESS_NONE);
        assert_int_equal(compress_for_shard(RPC_COMPRESS_AUTO, "localhost:7000", "[::1]:7001", false), RPC_COMPRESS_NONE);
        assert_int_equal(compress_for_shard(RPC_COMPRESS_AUTO, "10.0.0.2:7000", NULL, false), RPC_COMPRESS_INT8);
        assert_int_equal(compress_for_shard(RPC_COMPRESS_AUTO, "127.0.0.1:7000", "node2:7000", false), RPC_COMPRESS_INT8);
        assert_int_equal(compress_for_shard(RPC_COMPRESS_NONE, "10.0.0.2:7000", NULL, false), RPC_COMPRESS_NONE);
        assert_int_equal(compress_for_shard(RPC_COMPRESS_TOPK, "127.0.0.1:7000", NULL, false), RPC_COMPRESS_TOPK);
        assert_int_equal(compress_for_shard(RPC_COMPRESS_BF16, "node2:7000", NULL, false), RPC_COMPRESS_BF16);
        /* under mutual TLS every byte is also encrypted: auto is int8 on loopback too */
        assert_int_equal(compress_for_shard(RPC_COMPRESS_AUTO, "127.0.0.1:7000", NULL, true), RPC_COMPRESS_INT8);
        assert_int_equal(compress_for_shard(RPC_COMPRESS_AUTO, "10.0.0.2:7000", NULL, true), RPC_COMPRESS_INT8);
        assert_int_equal(compress_for_shard(RPC_COMPRESS_NONE, "127.0.0.1:7000", NULL, true), RPC_COMPRESS_NONE);
}

/* sum over steps of decoded(sent) == sum of gradients - final residual, per value, for int8 and top-k
 * (float32 sums in double: the identity is exact up to the rounding of each step's subtraction) */
static void error_feedback(uint32_t dtype, unsigned k) {
        size_t n = 1000, steps = 200;
        float *g = malloc(n * sizeof(float)), *res = calloc(n, sizeof(float)), *dec = malloc(n * sizeof(float));
        double *sum_g = calloc(n, sizeof(double)), *sum_sent = calloc(n, sizeof(double));
        uint8_t *buf = malloc(compress_max_size(dtype, n, k));
        unsigned seed = 7;
        for (size_t t = 0; t < steps; t++) {
                for (size_t i = 0; i < n; i++) {
                        seed = seed * 1103515245u + 12345u;
                        g[i] = ((float)(seed >> 8) / (float)(1u << 24) - 0.5f) * (i % 100 == 0 ? 50.0f : 1.0f);
                        sum_g[i] += g[i];
                }
                size_t m = compress_ef(dtype, k, g, res, n, buf);
                assert_true(m <= compress_max_size(dtype, n, k));
                if (dtype == WIRE_DTYPE_INT8_BLOCKS)
                        wire_int8_decode(dec, buf, n);
                else
                        assert_int_equal(wire_topk_decode(dec, buf, n), m);
                for (size_t i = 0; i < n; i++)
                        sum_sent[i] += dec[i];
        }
        double worst = 0, carried = 0;
        for (size_t i = 0; i < n; i++) {
                double d = fabs(sum_sent[i] - (sum_g[i] - res[i]));
                worst = d > worst ? d : worst;
                carried = fabs(res[i]) > carried ? fabs(res[i]) : carried;
        }
        assert_true(worst < 1e-3);
        /* and the residual stays bounded: what is dropped goes out later, it does not pile up */
        assert_true(carried < (dtype == WIRE_DTYPE_INT8_BLOCKS ? 1.0 : 200.0));
        /* a NaN is sent (to be refused) and carried no further */
        g[5] = NAN;
        compress_ef(dtype, k, g, res, n, buf);
        for (size_t i = 0; i < n; i++)
                assert_true(isfinite(res[i]));
        free(g), free(res), free(dec), free(sum_g), free(sum_sent), free(buf);
}

static void test_error_feedback_int8(void **state) {
        (void)state;
        error_feedback(WIRE_DTYPE_INT8_BLOCKS, 0);
}

static void test_error_feedback_topk(void **state) {
        (void)state;
        error_feedback(WIRE_DTYPE_TOPK, 3);
        error_feedback(WIRE_DTYPE_TOPK, 256);   /* everything: nothing left over */
}

UNIT_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_choice), cmocka_unit_test(test_for_shard), cmocka_unit_test(test_error_feedback_int8),
               cmocka_unit_test(test_error_feedback_topk))
