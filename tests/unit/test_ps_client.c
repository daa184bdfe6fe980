/* ps client, a worker's pushes against a fake ps on loopback: values land in the parameter block when
 * waited for, global_step and the counting pushes in flight, a refused push, a shard that is down,
 * shared memory set up but refused by the shard (the pushes then go through gRPC), overlapped
 * pushes (hold and take), and int8 changes in an answer that did not ask for them. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend.h"
#include "config.h"
#include "job.h"
#include "log.h"
#include "model.h"
#include "ps_client.h"
#include "rng.h"
#include "rpc.h"
#include "sparse_table.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"

/* ---- a fake ps: answers a push with each gradient + 1; refuses local_step 99 ---- */

struct fake {
        pthread_mutex_t mu;
        pthread_cond_t cond;
        bool hold;                /* Push handlers wait until it is cleared */
        bool changes;             /* answer with int8 changes (INT8_DELTA), asked for or not */
        uint64_t global_step;
        struct rpc_server *server[2];   /* shard 0's, and shard 1's when it is up */
};

static void h_push(struct rpc_call *c, void *ud) {
        struct fake *f = ud;
        struct wire_in *in;
        char err[256];
        assert_int_equal(wire_in_parse(rpc_call_take_payload(c), &in, err, sizeof(err)), 0);
        ProtobufCMessage *hm;
        assert_int_equal(wire_in_header(in, &psfleet__v1__push_header__descriptor, &hm), 0);
        const Psfleet__V1__PushHeader *h = (const Psfleet__V1__PushHeader *)hm;
        pthread_mutex_lock(&f->mu);
        while (f->hold)
                pthread_cond_wait(&f->cond, &f->mu);
        f->global_step += h->count_step;
        Psfleet__V1__PushReplyHeader rh = PSFLEET__V1__PUSH_REPLY_HEADER__INIT;
        rh.global_step = f->global_step;
        pthread_mutex_unlock(&f->mu);
        if (h->local_step == 99) {
                rpc_call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "refused: step 99");
        } else {
                struct wire_out *o;
                grpc_byte_buffer *bb;
                assert_int_equal(wire_out_new(&o), 0);
                wire_out_header(o, &rh.base);
                for (size_t i = 0; i < in->n_tensors; i++) {
                        const struct wire_tensor *t = &in->tensors[i];
                        float v[64], copy[64] = {0};
                        uint8_t q[64 + 4];
                        assert_true(t->elements <= 64);
                        wire_tensor_copy(t, v);
                        for (uint64_t k = 0; k < t->elements; k++)
                                v[k] += 1;
                        if (f->changes) {
                                wire_int8_delta_encode(q, v, copy, t->elements);
                                wire_out_tensor_copy(o, t->name, WIRE_DTYPE_INT8_DELTA, t->shape, t->ndims, t->row_offset,
                                                     q, wire_int8_size(t->elements));
                        } else {
                                wire_out_tensor_copy(o, t->name, WIRE_DTYPE_FLOAT32, t->shape, t->ndims, t->row_offset,
                                                     v, t->elements * sizeof(float));
                        }
                }
                assert_int_equal(wire_out_finish(o, &bb), 0);
                wire_out_free(o);
                rpc_call_reply(c, bb);
        }
        protobuf_c_message_free_unpacked(hm, NULL);
        wire_in_free(in);
}

static void h_attach(struct rpc_call *c, void *ud) {
        rpc_call_fail(c, GRPC_STATUS_FAILED_PRECONDITION, "cannot serve worker:0 through shared memory: not on this host");
}

/* ---- a job of two shards: both the fake, or shard 1 down ---- */

struct fx {
        struct fake fake;
        struct job_config *cfg;
        struct backend *be;
        struct model *m;
        struct job_layout *L;
        struct ps_client *pc;
        struct ps_group groups[2];   /* all of a shard's parts */
        bool overlap;                /* training.overlap_push */
};

static void fx_job(struct fx *x, bool shard1_up) {
        char json[1024], err[512], ps0[64], ps1[64];
        snprintf(ps0, sizeof(ps0), "127.0.0.1:%d", rpc_server_port(x->fake.server[0]));
        snprintf(ps1, sizeof(ps1), "127.0.0.1:%d", shard1_up ? rpc_server_port(x->fake.server[1]) : 2);
        snprintf(json, sizeof(json),
                 "{\"job\": \"t\", \"cluster\": {\"chief\": [\"127.0.0.1:1\"], \"ps\": [\"%s\", \"%s\"],"
                 " \"worker\": [\"127.0.0.1:4\"]},"
                 " \"model\": {\"input\": [4], \"layers\": [{\"type\": \"dense\", \"units\": 3}, {\"type\": \"relu\"},"
                 " {\"type\": \"dense\", \"units\": 2}]}, \"rpc\": {\"deadline_ms\": 5000},"
                 " \"training\": {\"overlap_push\": %s}}",
                 ps0, ps1, x->overlap ? "true" : "false");
        if (config_load_string(json, "t.json", &x->cfg, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        assert_int_equal(backend_cpu_new(1, &x->be), 0);
        assert_int_equal(model_new(&x->cfg->model, x->be, 1, &x->m), 0);
        assert_int_equal(job_layout_new(x->cfg, &x->L), 0);
        assert_int_equal(ps_client_new(x->cfg, x->L, "worker:0", &x->pc), 0);
        for (uint32_t s = 0; s < 2; s++)
                x->groups[s] = (struct ps_group){.shard = s, .n_parts = x->L->shard_count[s],
                                                 .parts = &x->L->shard_parts[x->L->shard_first[s]]};
}

static int move_model(void *m, float *params, float *grads) {
        return model_use_host_blocks(m, params, grads);
}

static int setup(void **state) {
        log_set_max_level(LOG_ERR);
        struct fx *x = calloc(1, sizeof(*x));
        pthread_mutex_init(&x->fake.mu, NULL);
        pthread_cond_init(&x->fake.cond, NULL);
        struct rpc_method methods[] = {
                {"/psfleet.v1.ParameterServer/Push", h_push, &x->fake},
                {"/psfleet.v1.ParameterServer/AttachSharedMemory", h_attach, &x->fake},
        };
        for (int i = 0; i < 2; i++) {
                assert_int_equal(rpc_server_new("127.0.0.1:0", methods, 2, 1, &x->fake.server[i]), 0);
                assert_int_equal(rpc_server_start(x->fake.server[i]), 0);
        }
        *state = x;
        return 0;
}

static int teardown(void **state) {
        struct fx *x = *state;
        model_free(x->m);
        ps_client_free(x->pc);   /* after the model: its shared memory may hold the model's blocks */
        backend_free(x->be);
        job_layout_free(x->L);
        config_free(x->cfg);
        rpc_server_free(x->fake.server[0]);
        rpc_server_free(x->fake.server[1]);
        free(x);
        return 0;
}

/* Every value of the parts of group g equals grads + add. */
static void check_group(struct fx *x, uint32_t g, const float *params, const float *grads, float add) {
        for (uint32_t i = 0; i < x->groups[g].n_parts; i++) {
                const struct placement_part *pp = &x->L->plan->parts[x->groups[g].parts[i]];
                const struct job_var *v = &x->L->vars[pp->var];
                for (size_t k = v->offset + (size_t)pp->row_begin * v->cols; k < v->offset + (size_t)pp->row_end * v->cols; k++)
                        assert_true(params[k] == grads[k] + add);
        }
}

static void test_push_and_wait(void **state) {
        struct fx *x = *state;
        fx_job(x, true);
        float *params = model_params(x->m), *grads = model_grads(x->m);
        assert_int_equal(ps_client_link(x->pc, 0, 2, x->groups, params, grads, NULL, NULL), 0);
        ps_client_link_shards(x->pc);   /* no shared memory: nothing to do */
        for (size_t i = 0; i < x->L->n_params; i++) {
                grads[i] = (float)i * 0.5f;
                params[i] = -1;
        }
        char err[600];
        assert_int_equal(ps_client_wait(x->pc, 0, err, sizeof(err)), 0);   /* nothing in flight */

        /* a push that counts a step: counted as in flight until its answer is taken */
        pthread_mutex_lock(&x->fake.mu);
        x->fake.hold = true;
        pthread_mutex_unlock(&x->fake.mu);
        ps_client_push(x->pc, 0, 1, true);
        ps_client_push(x->pc, 1, 1, false);
        uint32_t counting;
        assert_int_equal(ps_client_global_step(x->pc, &counting), 0);
        assert_int_equal(counting, 1);
        for (size_t i = 0; i < x->L->n_params; i++)
                assert_true(params[i] == -1);   /* nothing lands before it is waited for */
        pthread_mutex_lock(&x->fake.mu);
        x->fake.hold = false;
        pthread_cond_broadcast(&x->fake.cond);
        pthread_mutex_unlock(&x->fake.mu);
        assert_int_equal(ps_client_wait(x->pc, 0, err, sizeof(err)), 0);
        check_group(x, 0, params, grads, 1);
        assert_int_equal(ps_client_global_step(x->pc, &counting), 1);
        assert_int_equal(counting, 0);
        assert_int_equal(ps_client_wait(x->pc, 1, err, sizeof(err)), 0);
        check_group(x, 1, params, grads, 1);
        assert_int_equal(ps_client_wait(x->pc, 1, err, sizeof(err)), 0);   /* answered once */

        /* refused: the shard's message; the group is idle afterwards */
        ps_client_push(x->pc, 0, 99, true);
        assert_int_equal(ps_client_wait(x->pc, 0, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "refused: step 99"));
        assert_int_equal(ps_client_global_step(x->pc, &counting), 1);
        assert_int_equal(counting, 0);
        assert_int_equal(ps_client_wait(x->pc, 0, err, sizeof(err)), 0);

        /* int8 changes the push did not ask for (float32 pushes: no answer_base): refused, not added to
         * values they were not made from */
        x->fake.changes = true;
        for (size_t i = 0; i < x->L->n_params; i++)
                params[i] = -1;
        ps_client_push(x->pc, 0, 2, false);
        assert_int_equal(ps_client_wait(x->pc, 0, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "is int8 changes to values this worker did not offer"));
        for (size_t i = 0; i < x->L->n_params; i++)
                assert_true(params[i] == -1);
        x->fake.changes = false;
        assert_int_equal(ps_client_link(x->pc, 0, 2, x->groups, params, grads, NULL, NULL), -EALREADY);
}

static void test_shard_down(void **state) {
        struct fx *x = *state;
        fx_job(x, false);
        assert_int_equal(ps_client_link(x->pc, 0, 2, x->groups, model_params(x->m), model_grads(x->m), NULL, NULL), 0);
        ps_client_push(x->pc, 1, 1, false);
        char err[600];
        int r = ps_client_wait(x->pc, 1, err, sizeof(err));
        assert_true(r < 0);
        assert_non_null(strstr(err, "ps:1"));
}

static void test_shared_memory_refused(void **state) {
        struct fx *x = *state;
        fx_job(x, true);
        float *own = model_params(x->m);
        assert_int_equal(ps_client_link(x->pc, 0, 2, x->groups, own, model_grads(x->m), move_model, x->m), 0);
        float *params = model_params(x->m), *grads = model_grads(x->m);
        assert_ptr_not_equal(params, own);   /* the model moved into the segment */
        ps_client_link_shards(x->pc);         /* the fake ps refuses: gRPC it is */
        for (size_t i = 0; i < x->L->n_params; i++)
                grads[i] = (float)i;
        ps_client_push(x->pc, 0, 1, true);
        ps_client_push(x->pc, 1, 1, false);
        char err[600];
        assert_int_equal(ps_client_wait(x->pc, 0, err, sizeof(err)), 0);
        assert_int_equal(ps_client_wait(x->pc, 1, err, sizeof(err)), 0);
        check_group(x, 0, params, grads, 1);
        check_group(x, 1, params, grads, 1);
}

/* training.overlap_push: hold ends a push and keeps its values aside, take puts them in without waiting
 * for the push in flight; a push's message has the gradients of when it started (copied: the next step
 * writes the block meanwhile); wait still waits for everything and puts the newest in. */
static void test_overlap(void **state) {
        struct fx *x = *state;
        x->overlap = true;
        fx_job(x, true);
        float *params = model_params(x->m), *grads = model_grads(x->m);
        size_t np = x->L->n_params;
        float *g1 = malloc(np * sizeof(float)), *g2 = malloc(np * sizeof(float));
        assert_int_equal(ps_client_link(x->pc, 0, 2, x->groups, params, grads, NULL, NULL), 0);
        for (size_t i = 0; i < np; i++) {
                g1[i] = (float)i;
                g2[i] = (float)i * 10;
                params[i] = -1;
        }
        char err[600];
        memcpy(grads, g1, np * sizeof(float));
        ps_client_push(x->pc, 0, 1, true);                                  /* step 1 */
        assert_int_equal(ps_client_take(x->pc, 0, err, sizeof(err)), 0);  /* nothing kept yet */
        assert_true(params[0] == -1);
        assert_int_equal(ps_client_hold(x->pc, 0, err, sizeof(err)), 0);  /* step 2's backward */
        assert_true(params[0] == -1);                                       /* kept aside, not in */

        /* step 2's push travels while gRPC is held back and the block is written again */
        pthread_mutex_lock(&x->fake.mu);
        x->fake.hold = true;
        pthread_mutex_unlock(&x->fake.mu);
        memcpy(grads, g2, np * sizeof(float));
        ps_client_push(x->pc, 0, 2, true);
        for (size_t i = 0; i < np; i++)
                grads[i] = -7;                                              /* step 3 writes gradients */
        assert_int_equal(ps_client_take(x->pc, 0, err, sizeof(err)), 0);  /* does not wait for step 2 */
        check_group(x, 0, params, g1, 1);
        pthread_mutex_lock(&x->fake.mu);
        x->fake.hold = false;
        pthread_cond_broadcast(&x->fake.cond);
        pthread_mutex_unlock(&x->fake.mu);
        assert_int_equal(ps_client_hold(x->pc, 0, err, sizeof(err)), 0);
        check_group(x, 0, params, g1, 1);                                   /* until taken */
        assert_int_equal(ps_client_take(x->pc, 0, err, sizeof(err)), 0);
        check_group(x, 0, params, g2, 1);                                   /* what step 2 pushed */

        /* wait: everything, the newest values in (a kept older one is dropped) */
        ps_client_push(x->pc, 0, 3, true);
        assert_int_equal(ps_client_hold(x->pc, 0, err, sizeof(err)), 0);
        memcpy(grads, g1, np * sizeof(float));
        ps_client_push(x->pc, 0, 4, true);
        assert_int_equal(ps_client_wait(x->pc, 0, err, sizeof(err)), 0);
        check_group(x, 0, params, g1, 1);
        assert_int_equal(ps_client_take(x->pc, 0, err, sizeof(err)), 0);  /* nothing left over */
        check_group(x, 0, params, g1, 1);

        /* a refused push is the hold's failure */
        ps_client_push(x->pc, 1, 99, false);
        assert_int_equal(ps_client_hold(x->pc, 1, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "refused: step 99"));
        free(g1), free(g2);
}

/* ps_client_sparse's split: every id once, each shard's run holding exactly its ids (sparse_shard_of),
 * in the caller's order within the run (so the rows go back where they came from). */
static void test_sparse_split(void **state) {
        (void)state;
        enum { N = 5000 };
        uint64_t *ids = malloc(N * sizeof(*ids));
        size_t *order = malloc(N * sizeof(*order)), first[9];
        bool *seen = malloc(N);
        assert_non_null(ids);
        assert_non_null(order);
        assert_non_null(seen);
        struct rng r;
        rng_init(&r, 5, 0);
        for (size_t i = 0; i < N; i++)
                ids[i] = i % 3 ? rng_next(&r) : i;   /* small ids too, as hashing leaves them */
        for (uint32_t n_shards = 1; n_shards <= 8; n_shards++) {
                ps_client_sparse_split(ids, N, n_shards, order, first);
                assert_int_equal(first[0], 0);
                assert_int_equal(first[n_shards], N);
                memset(seen, 0, N);
                size_t per[8] = {0};
                for (size_t i = 0; i < N; i++)
                        per[sparse_shard_of(ids[i], n_shards)]++;
                for (uint32_t s = 0; s < n_shards; s++) {
                        assert_int_equal(first[s + 1] - first[s], per[s]);
                        for (size_t k = first[s]; k < first[s + 1]; k++) {
                                assert_true(order[k] < N);
                                assert_false(seen[order[k]]);
                                seen[order[k]] = true;
                                assert_int_equal(sparse_shard_of(ids[order[k]], n_shards), s);
                                if (k > first[s])
                                        assert_true(order[k] > order[k - 1]);
                        }
                }
                /* the ids spread over every shard */
                for (uint32_t s = 0; s < n_shards; s++)
                        assert_true(per[s] > N / n_shards / 2);
        }
        ps_client_sparse_split(ids, 0, 3, order, first);
        assert_int_equal(first[3], 0);
        free(ids);
        free(order);
        free(seen);
}

int main(void) {
        rpc_global_init();
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_sparse_split),
                cmocka_unit_test_setup_teardown(test_push_and_wait, setup, teardown),
                cmocka_unit_test_setup_teardown(test_shard_down, setup, teardown),
                cmocka_unit_test_setup_teardown(test_shared_memory_refused, setup, teardown),
                cmocka_unit_test_setup_teardown(test_overlap, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
