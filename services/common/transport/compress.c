/* Gradients made smaller for gRPC pushes, with error feedback: see compress.h. */
#include "compress.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>

#include "tls.h"
#include "wire.h"

uint32_t compress_dtype(enum rpc_compression c, uint64_t var_bytes, uint64_t min_bytes) {
        switch (c) {
        case RPC_COMPRESS_NONE: return WIRE_DTYPE_FLOAT32;
        case RPC_COMPRESS_BF16: return WIRE_DTYPE_BFLOAT16;
        case RPC_COMPRESS_INT8: return var_bytes < min_bytes ? WIRE_DTYPE_FLOAT32 : WIRE_DTYPE_INT8_BLOCKS;
        case RPC_COMPRESS_TOPK: return var_bytes < min_bytes ? WIRE_DTYPE_FLOAT32 : WIRE_DTYPE_TOPK;
        case RPC_COMPRESS_AUTO: break;   /* resolved per shard first (compress_for_shard) */
        }
        assert(!"unknown rpc.compression");
        return WIRE_DTYPE_FLOAT32;
}

enum rpc_compression compress_for_shard(enum rpc_compression c, const char *addr, const char *backup, bool tls) {
        if (c != RPC_COMPRESS_AUTO)
                return c;
        bool near = tls_addr_is_loopback(addr) && (!backup || tls_addr_is_loopback(backup));
        return near && !tls ? RPC_COMPRESS_NONE : RPC_COMPRESS_INT8;
}

uint32_t compress_answer_dtype(uint32_t pushed) {
        return pushed == WIRE_DTYPE_FLOAT32 ? WIRE_DTYPE_FLOAT32 : WIRE_DTYPE_BFLOAT16;
}

unsigned compress_topk_k(double ratio) {
        double k = ceil(ratio * WIRE_BLOCK);
        return k < 1 ? 1 : k > WIRE_BLOCK ? WIRE_BLOCK : (unsigned)k;
}

size_t compress_max_size(uint32_t dtype, size_t n, unsigned k) {
        assert(dtype == WIRE_DTYPE_INT8_BLOCKS || dtype == WIRE_DTYPE_TOPK);
        return dtype == WIRE_DTYPE_INT8_BLOCKS ? wire_int8_size(n) : wire_topk_max_size(n, k);
}

/* x = g + r, and r = x - y where finite (else 0), for a block: a whole one has a trip count the
 * compiler knows, which it vectorizes at -O2 */
static void add_block(float *x, const float *g, const float *r, size_t len) {
        if (len == WIRE_BLOCK)
                for (size_t i = 0; i < WIRE_BLOCK; i++)
                        x[i] = g[i] + r[i];
        else
                for (size_t i = 0; i < len; i++)
                        x[i] = g[i] + r[i];
}

static void keep_block(float *r, const float *x, const float *y, size_t len) {
        if (len == WIRE_BLOCK)
                for (size_t i = 0; i < WIRE_BLOCK; i++) {
                        float d = x[i] - y[i];
                        r[i] = d - d == 0 ? d : 0;   /* d - d: NaN for NaN and Inf, without a branch */
                }
        else
                for (size_t i = 0; i < len; i++) {
                        float d = x[i] - y[i];
                        r[i] = d - d == 0 ? d : 0;
                }
}

size_t compress_ef(uint32_t dtype, unsigned k, const float *g, float *residual, size_t n, uint8_t *dst) {
        assert(dtype == WIRE_DTYPE_INT8_BLOCKS || dtype == WIRE_DTYPE_TOPK);
        uint8_t *p = dst;
        /* a block at a time: x and its decoded copy stay in cache, and the blocks are the wire's */
        for (size_t b = 0; b < n; b += WIRE_BLOCK) {
                size_t len = n - b < WIRE_BLOCK ? n - b : WIRE_BLOCK;
                float x[WIRE_BLOCK], y[WIRE_BLOCK];   /* (len) to send; as received */
                add_block(x, g + b, residual + b, len);
                if (dtype == WIRE_DTYPE_INT8_BLOCKS) {
                        wire_int8_encode(p, x, len);
                        wire_int8_decode(y, p, len);
                        p += wire_int8_size(len);
                } else {
                        size_t m = wire_topk_encode(p, x, len, k);
                        wire_topk_decode(y, p, len);
                        p += m;
                }
                keep_block(residual + b, x, y, len);
        }
        return (size_t)(p - dst);
}
