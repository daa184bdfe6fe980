/* What the tests of psd's shard library share (test_shard.c, test_agg.c, test_ssp.c): a small job, a
 * shard assigned from a block, random gradients, and a held push that records its release. Include
 * after cmocka.h. */
#pragma once
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg.h"
#include "config.h"
#include "job.h"
#include "rng.h"
#include "shard.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"

/* dense0/kernel is (300, 40): 48,000 bytes, split at 40,000 into rows 0..250 (10,000 floats, more
 * than one bounce buffer) and 250..300 */
static inline struct job_config *job(const char *training) {
        static const char fmt[] =
                "{\"job\": \"t\", \"training\": {%s}, \"ps\": {\"split_bytes\": 40000},"
                " \"model\": {\"input\": [300], \"layers\": [{\"type\": \"dense\", \"units\": 40}, {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 10}]},"
                " \"cluster\": {\"chief\": [\"127.0.0.1:1\"], \"ps\": [\"127.0.0.1:2\", \"127.0.0.1:3\"], \"worker\": [\"127.0.0.1:4\"]}}";
        char json[2048], err[512];
        snprintf(json, sizeof(json), fmt, training);
        struct job_config *cfg;
        if (config_load_string(json, "test.json", &cfg, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        return cfg;
}

/* The parts of shard s of a block, as the ps client's add_part sends them (suffix: a slot's name), in
 * dtype (float32, bfloat16, or compressed: int8 blocks, top-k with 3 per block). */
static inline struct wire_in *shard_message_as(const struct job_layout *L, uint32_t s, const float *block,
                                               const char *suffix, uint32_t dtype) {
        struct wire_out *o;
        assert_int_equal(wire_out_new(&o), 0);
        Psfleet__V1__PushHeader h = PSFLEET__V1__PUSH_HEADER__INIT;
        assert_int_equal(wire_out_header(o, &h.base), 0);
        for (uint32_t k = 0; k < L->shard_count[s]; k++) {
                const struct placement_part *pp = &L->plan->parts[L->shard_parts[L->shard_first[s] + k]];
                const struct job_var *v = &L->vars[pp->var];
                char name[300];
                snprintf(name, sizeof(name), "%s%s%s", v->name, suffix ? "/" : "", suffix ? suffix : "");
                uint64_t shape[2] = {pp->row_end - pp->row_begin, v->cols};
                const float *data = block + v->offset + (size_t)pp->row_begin * v->cols;
                size_t n = (size_t)shape[0] * shape[1];
                if (dtype == WIRE_DTYPE_INT8_BLOCKS || dtype == WIRE_DTYPE_TOPK) {
                        uint8_t *enc = malloc(wire_int8_size(n) + wire_topk_max_size(n, 3) + 1);
                        size_t nbytes = wire_int8_size(n);
                        if (dtype == WIRE_DTYPE_INT8_BLOCKS)
                                wire_int8_encode(enc, data, n);
                        else
                                nbytes = wire_topk_encode(enc, data, n, 3);
                        assert_int_equal(wire_out_tensor_copy(o, name, dtype, shape, 2, pp->row_begin, enc, nbytes), 0);
                        free(enc);
                        continue;
                }
                assert_int_equal(wire_out_tensor_f32(o, name, dtype, shape, 2, pp->row_begin, data, n, NULL, NULL), 0);
        }
        grpc_byte_buffer *bb;
        assert_int_equal(wire_out_finish(o, &bb), 0);
        wire_out_free(o);
        struct wire_in *in;
        char err[256];
        assert_int_equal(wire_in_parse(bb, &in, err, sizeof(err)), 0);
        return in;
}

static inline struct wire_in *shard_message(const struct job_layout *L, uint32_t s, const float *block,
                                            const char *suffix) {
        return shard_message_as(L, s, block, suffix, WIRE_DTYPE_FLOAT32);
}

static inline struct shard *assigned_shard(const struct job_config *cfg, const struct job_layout *L,
                                           uint32_t index, const float *params) {
        struct shard *s;
        char err[256];
        assert_int_equal(shard_new(cfg, L, index, &s, err, sizeof(err)), 0);
        struct wire_in *in = shard_message(L, index, params, NULL);
        assert_int_equal(shard_assign(s, in, false, 0, err, sizeof(err)), 0);
        wire_in_free(in);
        assert_true(atomic_load(&s->initialized));
        return s;
}

static inline void random_block(struct rng *g, float *x, size_t n, float scale) {
        for (size_t i = 0; i < n; i++)
                x[i] = (float)rng_normal(g) * scale;
}

/* A held push that records its release. */
struct rec {
        struct agg_waiter w;
        int released, status;
        uint64_t step;
        char msg[400];
};

static inline void rec_release(struct agg_waiter *w, int status, uint64_t step, const char *msg) {
        struct rec *r = (struct rec *)w;
        r->released++;
        r->status = status;
        r->step = step;
        snprintf(r->msg, sizeof(r->msg), "%s", msg ? msg : "");
}

static inline void rec_init(struct rec *r, uint32_t worker, uint64_t version, const uint32_t *idx, uint32_t n) {
        memset(r, 0, sizeof(*r));
        r->w = (struct agg_waiter){.worker = worker, .version = version, .n = n, .idx = idx, .release = rec_release};
}

