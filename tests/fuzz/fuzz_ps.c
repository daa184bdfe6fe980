/* Harness: every ParameterServer handler of a real psd (its own main, on a thread of this process,
 * with a shard of a small job) fed through gRPC on loopback, so each input goes through the protobuf-c
 * unpack, psd's validation and the handler as a worker's or a chief's call would. Input: one byte
 * choosing the method (0xff: Stop, then psd is started again and restored), then the request's bytes.
 *
 * The invariant, after every input: a Pull of the shard (values and slots) equals the harness's copy,
 * which changes only by a legal apply: a push psd accepted must be legal by the harness's own reading
 * (every tensor a float32 part of this shard with its exact shape, none twice, all finite), and the
 * copy gets the optimizer's apply (apply.h) of its gradients; an accepted Assign must have set what it
 * carried; anything else changes nothing.
 *
 * FUZZ_PS_SEED=DIR writes the seed corpus (legal calls of each method) into DIR and exits.
 * Built a second time as fuzz_ps_broken (tests only) with the shard's finite check wrapped away
 * (FUZZ_PS_BREAK_FINITE, -Wl,--wrap): the test fuzz.ps_catches_broken_validation shows that the
 * invariant then fails. */
#include <math.h>

#include "apply.h"
#include "config.h"
#include "fuzz_daemon.h"
#include "job.h"
#include "log.h"
#include "optim.h"
#include "rpc.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"

int psd_main(int argc, char **argv);   /* services/psd/psd.c, built here with main renamed */

#ifdef FUZZ_PS_BREAK_FINITE
/* The deliberately broken validation: psd's shard takes every gradient as finite. */
bool __real_apply_check_read(size_t n, apply_read_fn read, void *ud, double *sumsq);
bool __wrap_apply_check_read(size_t n, apply_read_fn read, void *ud, double *sumsq);
bool __wrap_apply_check_read(size_t n, apply_read_fn read, void *ud, double *sumsq) {
        __real_apply_check_read(n, read, ud, sumsq);
        if (sumsq)
                *sumsq = 0;
        return true;
}
#endif

static const char *const methods[] = {
        "/psfleet.v1.ParameterServer/Push",
        "/psfleet.v1.ParameterServer/Assign",
        "/psfleet.v1.ParameterServer/Pull",
        "/psfleet.v1.ParameterServer/GetShardStatus",
        "/psfleet.v1.ParameterServer/AttachSharedMemory",
        "/psfleet.v1.ParameterServer/Stop",
};
enum { M_PUSH, M_ASSIGN, M_PULL, M_STATUS, M_ATTACH, M_STOP, M_CHOICES = M_STOP };

/* The shard as a Pull with slots shows it: each part's values, then its slots. */
struct part {
        char name[128];
        uint64_t row_offset, rows, cols;
        size_t off;          /* into state.f: values, then each slot, n floats each */
        size_t n;
        uint64_t updates;    /* gradients applied since the Assign (the optimizer's step) */
};
struct state {
        struct part parts[32];
        unsigned n_parts;
        float *f;
        size_t n_floats;
        uint64_t global_step;
};

static struct job_config *cfg;
static struct job_layout *L;
static unsigned n_slots;
static struct fuzz_daemon psd = {.main = psd_main, .name = "ps:0", .stop = "/psfleet.v1.ParameterServer/Stop"};
static struct state copy;   /* what the shard must hold */

static void caller(Psfleet__V1__Caller *c) {
        c->fingerprint = L->fingerprint;
        c->task = (char *)"chief:0";
}

static int call(int m, const uint8_t *data, size_t size, grpc_byte_buffer **reply) {
        return fuzz_daemon_call(&psd, methods[m], data, size, reply);
}

static grpc_byte_buffer *packed(const ProtobufCMessage *m) {
        return wire_pack(m);
}

/* Pulls the shard with its slots into st (st->f malloc'd). */
static void pull(struct state *st) {
        Psfleet__V1__PullHeader h = PSFLEET__V1__PULL_HEADER__INIT;
        Psfleet__V1__Caller c = PSFLEET__V1__CALLER__INIT;
        caller(&c);
        h.caller = &c;
        h.with_slots = true;
        Psfleet__V1__PullRequest q = PSFLEET__V1__PULL_REQUEST__INIT;
        q.header = &h;
        ProtobufCMessage *hm = NULL;
        struct wire_in *in = fuzz_daemon_request(&psd, methods[M_PULL], &q.base, &psfleet__v1__pull_reply_header__descriptor,
                                                 &hm);
        st->global_step = ((Psfleet__V1__PullReplyHeader *)hm)->global_step;
        protobuf_c_message_free_unpacked(hm, NULL);
        size_t total = 0;
        for (size_t i = 0; i < in->n_tensors; i++)
                total += in->tensors[i].nbytes / sizeof(float);
        free(st->f);
        st->f = malloc((total ? total : 1) * sizeof(float));
        st->n_floats = total;
        st->n_parts = 0;
        size_t at = 0;
        for (size_t i = 0; i < in->n_tensors; i++) {
                const struct wire_tensor *t = &in->tensors[i];
                if (i % (1 + n_slots) == 0) {
                        FUZZ_CHECK(st->n_parts < 32 && t->ndims == 2, "Pull reply layout");
                        struct part *pt = &st->parts[st->n_parts++];
                        snprintf(pt->name, sizeof(pt->name), "%s", t->name);
                        pt->row_offset = t->row_offset;
                        pt->rows = t->shape[0];
                        pt->cols = t->shape[1];
                        pt->off = at;
                        pt->n = t->elements;
                }
                wire_tensor_copy(t, st->f + at);
                at += t->nbytes / sizeof(float);
        }
        wire_in_free(in);
}

static bool same(const struct state *a, const struct state *b) {
        if (a->n_floats != b->n_floats || a->n_parts != b->n_parts)
                return false;
        for (unsigned k = 0; k < a->n_parts; k++)
                if (strcmp(a->parts[k].name, b->parts[k].name) || a->parts[k].row_offset != b->parts[k].row_offset)
                        return false;
        return memcmp(a->f, b->f, a->n_floats * sizeof(float)) == 0;
}

/* A message of a header and tensors: begun, and ended into its bytes (malloc'd). */
static struct wire_out *out_begin(const ProtobufCMessage *h) {
        struct wire_out *o;
        if (wire_out_new(&o) < 0)
                abort();
        wire_out_header(o, h);
        return o;
}

static void out_end(struct wire_out *o, uint8_t **p, size_t *n) {
        grpc_byte_buffer *bb;
        wire_out_finish(o, &bb);
        wire_out_free(o);
        fuzz_bytes_of(bb, p, n);
}

/* An Assign of st (values and slots) at global_step gs; the bytes (malloc'd). */
static void assign_bytes(const struct state *st, uint64_t gs, bool slots, uint8_t **p, size_t *n) {
        Psfleet__V1__AssignHeader h = PSFLEET__V1__ASSIGN_HEADER__INIT;
        Psfleet__V1__Caller c = PSFLEET__V1__CALLER__INIT;
        caller(&c);
        h.caller = &c;
        h.global_step = gs;
        h.with_slots = slots;
        struct wire_out *o = out_begin(&h.base);
        for (unsigned k = 0; k < st->n_parts; k++) {
                const struct part *pt = &st->parts[k];
                uint64_t shape[2] = {pt->rows, pt->cols};
                for (unsigned s = 0; s <= (slots ? n_slots : 0); s++) {
                        char name[200];
                        snprintf(name, sizeof(name), "%s%s%s", pt->name, s ? "/" : "",
                                 s ? optim_slot_name(cfg->training.optimizer, s - 1) : "");
                        wire_out_tensor_copy(o, name, WIRE_DTYPE_FLOAT32, shape, 2, pt->row_offset, st->f + pt->off + s * pt->n,
                                             pt->n * sizeof(float));
                }
        }
        out_end(o, p, n);
}

/* A Push of gradients g (one per part listed, in copy's layout) of parts ks[0..nk). */
static void push_bytes(const unsigned *ks, unsigned nk, const float *g, uint8_t **p, size_t *n) {
        Psfleet__V1__PushHeader h = PSFLEET__V1__PUSH_HEADER__INIT;
        Psfleet__V1__Caller c = PSFLEET__V1__CALLER__INIT;
        caller(&c);
        c.task = (char *)"worker:0";
        h.caller = &c;
        h.want_values = true;
        h.count_step = true;
        struct wire_out *o = out_begin(&h.base);
        for (unsigned i = 0, at = 0; i < nk; i++) {
                const struct part *pt = &copy.parts[ks[i]];
                uint64_t shape[2] = {pt->rows, pt->cols};
                wire_out_tensor_copy(o, pt->name, WIRE_DTYPE_FLOAT32, shape, 2, pt->row_offset, g + at, pt->n * sizeof(float));
                at += pt->n;
        }
        out_end(o, p, n);
}

/* psd's state after a start: the copy, assigned with its slots. */
static void restore(void) {
        uint8_t *p;
        size_t n;
        int r;
        assign_bytes(&copy, copy.global_step, true, &p, &n);
        while ((r = call(M_ASSIGN, p, n, NULL)) == -ECONNREFUSED || r == -EAGAIN)
                usleep(10000);
        free(p);
        FUZZ_CHECK(r == 0, "the harness's Assign after a restart failed (%d)", r);
}

static void setup(void) {
        char job[2048], err[512];
        /* the job's addresses are fixed, so is its fingerprint (the seeds carry it) */
        snprintf(job, sizeof(job), FUZZ_JOB_FMT, "127.0.0.1:2", "127.0.0.1:3", "/nonexistent", "momentum", "");
        static const char *const extra[] = {"--task-index", "0", NULL};
        fuzz_daemon_init(&psd, job, extra);
        if (config_load(psd.job_path, &cfg, err, sizeof(err)) < 0 || job_layout_new(cfg, &L) < 0) {
                fprintf(stderr, "fuzz_ps: %s\n", err);
                abort();
        }
        n_slots = optim_n_slots(cfg->training.optimizer);
        fuzz_daemon_start(&psd);
        /* the chief's first Assign: every part of ps:0 as the placement made them, values from a fixed
         * sequence, slots at the optimizer's start; then the copy is what a Pull shows */
        struct state init = {0};
        size_t total = 0;
        for (uint32_t i = 0; i < L->shard_count[0]; i++) {
                const struct placement_part *pp = &L->plan->parts[L->shard_parts[L->shard_first[0] + i]];
                const struct job_var *jv = &L->vars[pp->var];
                struct part *pt = &init.parts[init.n_parts++];
                snprintf(pt->name, sizeof(pt->name), "%s", jv->name);
                pt->row_offset = pp->row_begin;
                pt->rows = pp->row_end - pp->row_begin;
                pt->cols = jv->cols;
                pt->n = pt->rows * pt->cols;
                pt->off = total;
                total += pt->n * (1 + n_slots);
        }
        init.f = calloc(total, sizeof(float));
        init.n_floats = total;
        for (unsigned k = 0; k < init.n_parts; k++)
                for (size_t j = 0; j < init.parts[k].n; j++)
                        init.f[init.parts[k].off + j] = (float)((int)((k * 131 + j * 29) % 61) - 30) / 64.f;
        uint8_t *p;
        size_t n;
        assign_bytes(&init, 0, false, &p, &n);
        int r;
        while ((r = call(M_ASSIGN, p, n, NULL)) == -ECONNREFUSED || r == -EAGAIN)
                usleep(10000);
        FUZZ_CHECK(r == 0, "the harness's first Assign failed (%d)", r);
        free(p);
        pull(&copy);
        FUZZ_CHECK(copy.n_floats == total && copy.n_parts == init.n_parts, "the first Pull");
        free(init.f);
}

/* FUZZ_PS_SEED=DIR: legal calls of each method, and a push of a NaN (tests/fuzz/broken). */
static void seeds(const char *dir) {
        uint8_t *p;
        size_t n;
        unsigned ks[32];
        size_t floats = 0;
        for (unsigned k = 0; k < copy.n_parts; k++)
                ks[k] = k, floats += copy.parts[k].n;
        float *g = calloc(floats, sizeof(float));
        for (size_t i = 0; i < floats; i++)
                g[i] = (float)((int)(i % 7) - 3) / 16.f;
        push_bytes(ks, copy.n_parts, g, &p, &n);
        fuzz_write_seed(dir, "push-all", M_PUSH, p, n);
        free(p);
        push_bytes(ks + 1, 1, g, &p, &n);
        fuzz_write_seed(dir, "push-one", M_PUSH, p, n);
        free(p);
        g[2] = NAN;
        push_bytes(ks, 1, g, &p, &n);
        fuzz_write_seed(dir, "push-nan", M_PUSH, p, n);
        free(p);
        assign_bytes(&copy, 5, true, &p, &n);
        fuzz_write_seed(dir, "assign-slots", M_ASSIGN, p, n);
        free(p);
        Psfleet__V1__PullHeader h = PSFLEET__V1__PULL_HEADER__INIT;
        Psfleet__V1__Caller c = PSFLEET__V1__CALLER__INIT;
        caller(&c);
        h.caller = &c;
        char *names[] = {copy.parts[0].name};
        h.names = names;
        h.n_names = 1;
        Psfleet__V1__PullRequest q = PSFLEET__V1__PULL_REQUEST__INIT;
        q.header = &h;
        fuzz_bytes_of(packed(&q.base), &p, &n);
        fuzz_write_seed(dir, "pull-one", M_PULL, p, n);
        free(p);
        fuzz_write_seed(dir, "status", M_STATUS, NULL, 0);
        Psfleet__V1__AttachSharedMemoryRequest at = PSFLEET__V1__ATTACH_SHARED_MEMORY_REQUEST__INIT;
        at.caller = &c;
        fuzz_bytes_of(packed(&at.base), &p, &n);
        fuzz_write_seed(dir, "attach", M_ATTACH, p, n);
        free(p);
        Psfleet__V1__StopRequest st = PSFLEET__V1__STOP_REQUEST__INIT;
        st.reason = (char *)"fuzz";
        fuzz_bytes_of(packed(&st.base), &p, &n);
        fuzz_write_seed(dir, "stop", 0xff, p, n);
        free(p);
        free(g);
}

/* The harness's own reading of a push psd accepted: legal, and its gradients in copy's layout (g,
 * copy.n_floats, zero where a part got none; got[k] says which parts did). False when illegal. */
static bool legal_push(const uint8_t *data, size_t size, float *g, bool *got, char *why, size_t len) {
        grpc_slice sl = grpc_slice_from_copied_buffer((const char *)data, size);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
        struct wire_in *in;
        char err[256];
        if (wire_in_parse(bb, &in, err, sizeof(err)) < 0) {
                snprintf(why, len, "it does not parse: %s", err);
                return false;
        }
        bool ok = true;
        for (size_t i = 0; i < in->n_tensors && ok; i++) {
                const struct wire_tensor *t = &in->tensors[i];
                unsigned k;
                for (k = 0; k < copy.n_parts; k++)
                        if (strcmp(copy.parts[k].name, t->name) == 0 && copy.parts[k].row_offset == t->row_offset)
                                break;
                if (k == copy.n_parts || got[k] || t->dtype != WIRE_DTYPE_FLOAT32 || t->ndims != 2 ||
                    t->shape[0] != copy.parts[k].rows || t->shape[1] != copy.parts[k].cols) {
                        snprintf(why, len, "tensor %zu (\"%s\") is no part of the shard, or a second time", i, t->name);
                        ok = false;
                        break;
                }
                got[k] = true;
                float *dst = g + copy.parts[k].off;
                wire_tensor_copy(t, dst);
                for (size_t j = 0; j < copy.parts[k].n; j++)
                        if (!isfinite(dst[j])) {
                                snprintf(why, len, "tensor \"%s\" element %zu is not finite", t->name, j);
                                ok = false;
                                break;
                        }
        }
        wire_in_free(in);
        return ok;
}

/* An Assign psd accepted: every tensor it carried ("<var>" or "<var>/<slot>") is now in st. */
static void check_assigned(const uint8_t *data, size_t size, const struct state *st) {
        grpc_slice sl = grpc_slice_from_copied_buffer((const char *)data, size);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
        struct wire_in *in;
        char err[256];
        FUZZ_CHECK(wire_in_parse(bb, &in, err, sizeof(err)) == 0, "psd accepted an Assign that does not parse: %s", err);
        for (size_t i = 0; i < in->n_tensors; i++) {
                const struct wire_tensor *t = &in->tensors[i];
                unsigned k, slot = 0;
                for (k = 0; k < st->n_parts; k++) {
                        size_t len = strlen(st->parts[k].name);
                        if (st->parts[k].row_offset != t->row_offset || strncmp(st->parts[k].name, t->name, len) != 0)
                                continue;
                        if (t->name[len] == 0)
                                break;
                        for (slot = 0; t->name[len] == '/' && slot < n_slots; slot++)
                                if (strcmp(t->name + len + 1, optim_slot_name(cfg->training.optimizer, slot)) == 0)
                                        break;
                        if (t->name[len] == '/' && slot < n_slots) {
                                slot++;
                                break;
                        }
                }
                FUZZ_CHECK(k < st->n_parts && t->nbytes == st->parts[k].n * sizeof(float),
                           "psd accepted an Assign of \"%s\", no part of the shard", t->name);
                float *v = malloc(t->nbytes + 1);
                wire_tensor_copy(t, v);
                FUZZ_CHECK(memcmp(v, st->f + st->parts[k].off + slot * st->parts[k].n, t->nbytes) == 0,
                           "after an accepted Assign, \"%s\" is not what it carried", t->name);
                free(v);
        }
        wire_in_free(in);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        fuzz_daemon_first(&psd, setup, "FUZZ_PS_SEED", seeds);
        int m = fuzz_daemon_method(&data, &size, M_CHOICES, M_STOP);
        if (m < 0)
                return 0;
        int r = call(m, data, size, NULL);
        if (fuzz_daemon_after(&psd, m, M_STOP, r))
                restore();   /* psd starts uninitialized: give it the copy */
        struct state now = {0};
        pull(&now);
        if (m == M_PUSH && r == 0) {
                float *g = calloc(copy.n_floats ? copy.n_floats : 1, sizeof(float));
                bool got[32] = {0};
                char why[300];
                FUZZ_CHECK(legal_push(data, size, g, got, why, sizeof(why)), "psd applied an illegal push: %s", why);
                for (unsigned k = 0; k < copy.n_parts; k++) {
                        struct part *pt = &copy.parts[k];
                        if (!got[k])
                                continue;
                        float *slots[OPTIM_MAX_SLOTS] = {0};
                        for (unsigned s = 0; s < n_slots; s++)
                                slots[s] = copy.f + pt->off + (1 + s) * pt->n;
                        struct apply_rows a = apply_rows_at(copy.f + pt->off, slots, n_slots, 0, pt->n);
                        a.updates = pt->updates++;
                        apply_gradient(&cfg->training, &a, g + pt->off);
                }
                free(g);
        } else if (m == M_ASSIGN && r == 0) {
                /* what it carried is now the shard, updates counted from its global_step */
                check_assigned(data, size, &now);
                for (unsigned k = 0; k < copy.n_parts; k++)
                        copy.parts[k].updates = now.global_step;
                memcpy(copy.f, now.f, copy.n_floats * sizeof(float));
        }
        FUZZ_CHECK(same(&now, &copy), "after a %s (%s), the shard differs from a legal apply to its copy", methods[m],
                   r == 0 ? "accepted" : "refused");
        copy.global_step = now.global_step;
        free(now.f);
        return 0;
}
