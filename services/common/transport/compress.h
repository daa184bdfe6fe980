/* Gradients made smaller for gRPC pushes (rpc.compression): which wire format each variable's
 * gradient travels in, and error feedback for the lossy ones (int8 blocks, top-k), as BytePS's
 * compressors do it: what a push drops is kept in a residual and added to the next gradient, so that
 * over the steps everything computed is sent. Pure functions over pointers and sizes; the residuals
 * belong to the caller (ps_client, per variable part). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* The wire dtype of a gradient of var_bytes (float32 bytes of its whole variable) under compression
 * c: FLOAT32 (none; int8 and topk below min_bytes), BFLOAT16, INT8_BLOCKS or TOPK. */
uint32_t compress_dtype(enum rpc_compression c, uint64_t var_bytes, uint64_t min_bytes);

/* What compression c is for the pushes to one shard at addr (and its backup, NULL for none) through
 * channels under mutual TLS (tls) or plain TCP: c itself, but AUTO is INT8 when either is beyond loopback
 * or the channel is TLS, NONE for plain TCP on loopback (measured: int8 sends 0.257 of float32's bytes
 * for the same accuracy, and under TLS every byte is also encrypted and framed: 1 ps + 1 worker through
 * loopback gRPC under mutual TLS 0.35 of standalone with int8 against 0.23 with float32; plain TCP on
 * loopback keeps float32, which keeps gRPC training equal to the standalone trainer; one host's jobs use
 * shared memory anyway). */
enum rpc_compression compress_for_shard(enum rpc_compression c, const char *addr, const char *backup, bool tls);

/* The dtype psd answers a push of `pushed` with: the values themselves, so never a lossy format that
 * error feedback cannot repair: FLOAT32 for FLOAT32, BFLOAT16 for anything else. */
uint32_t compress_answer_dtype(uint32_t pushed);

/* Top-k entries per block of WIRE_BLOCK for a ratio in (0, 1): ceil(ratio x WIRE_BLOCK), at least 1. */
unsigned compress_topk_k(double ratio);

/* Most bytes compress_ef writes for n values as dtype (INT8_BLOCKS, or TOPK with k per block). */
size_t compress_max_size(uint32_t dtype, size_t n, unsigned k);

/* x = g + residual (n values) encoded as dtype (INT8_BLOCKS, or TOPK with k per block) into dst
 * (compress_max_size bytes of room); residual becomes x - decoded(dst). A value of x that is NaN or
 * Inf is sent (the receiver refuses the push) and leaves 0 in the residual, so that one bad step does
 * not poison every push after it. Returns the bytes written. */
size_t compress_ef(uint32_t dtype, unsigned k, const float *g, float *residual, size_t n, uint8_t *dst);
