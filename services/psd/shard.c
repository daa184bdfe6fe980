/* A ps shard's variables, and the checks and applies of pushes: see shard.h. Every push is validated
 * whole before any of it is applied, so a bad push changes nothing; the apply itself is train/apply.c,
 * the same code the standalone trainer runs. */
#include "shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "optim.h"
#include "util.h"

int shard_new(const struct job_config *cfg, const struct job_layout *L, uint32_t index, struct shard **ret,
              char *err, size_t errlen) {
        if (index >= L->n_shards)
                return errf(err, errlen, -EINVAL, "ps:%u: the job has %u ps shard(s)", index, L->n_shards);
        struct shard *s = calloc(1, sizeof(*s));
        if (!s)
                return errf(err, errlen, -ENOMEM, "out of memory");
        s->t = &cfg->training;
        s->L = L;
        s->index = index;
        s->n_slots = optim_n_slots(cfg->training.optimizer);
        s->n_parts = L->shard_count[index];
        s->plan_part = malloc((L->plan->n_parts + 1) * sizeof(uint32_t));
        s->parts = calloc(s->n_parts + 1, sizeof(*s->parts));
        if (!s->plan_part || !s->parts) {
                shard_free(s);
                return errf(err, errlen, -ENOMEM, "out of memory");
        }
        for (uint32_t i = 0; i < L->plan->n_parts; i++)
                s->plan_part[i] = UINT32_MAX;
        for (uint32_t k = 0; k < s->n_parts; k++) {
                uint32_t pi = L->shard_parts[L->shard_first[index] + k];
                const struct placement_part *pp = &L->plan->parts[pi];
                const struct job_var *v = &L->vars[pp->var];
                struct shard_part *q = &s->parts[k];
                s->plan_part[pi] = k;
                *q = (struct shard_part){.var = pp->var, .name = v->name, .row_begin = pp->row_begin,
                                         .rows = pp->row_end - pp->row_begin, .cols = v->cols};
                q->a.n = (size_t)q->rows * q->cols;
                q->model_off = v->offset + (size_t)pp->row_begin * v->cols;
                s->n_floats += q->a.n;
                pthread_mutex_init(&q->mu, NULL);
        }
        s->block = calloc(s->n_floats * (1 + s->n_slots) + 1, sizeof(float));
        if (!s->block) {
                size_t bytes = s->n_floats * (1 + s->n_slots) * 4;
                shard_free(s);
                return errf(err, errlen, -ENOMEM, "cannot allocate %zu bytes for the shard", bytes);
        }
        float *slots[OPTIM_MAX_SLOTS];
        for (unsigned j = 0; j < s->n_slots; j++)
                slots[j] = s->block + (j + 1) * s->n_floats;
        size_t at = 0;
        for (uint32_t k = 0; k < s->n_parts; k++) {
                s->parts[k].a = apply_rows_at(s->block, slots, s->n_slots, at, s->parts[k].a.n);
                s->parts[k].a.moving = L->vars[s->parts[k].var].moving;
                at += s->parts[k].a.n;
        }
        *ret = s;
        return 0;
}

struct shard *shard_free(struct shard *s) {
        if (!s)
                return NULL;
        for (uint32_t k = 0; s->parts && k < s->n_parts; k++)
                pthread_mutex_destroy(&s->parts[k].mu);
        free(s->parts);
        free(s->plan_part);
        free(s->block);
        free(s);
        return NULL;
}

struct shard_part *shard_find(struct shard *s, const char *name, uint64_t row_offset) {
        for (uint32_t i = 0; i < s->n_parts; i++)
                if (s->parts[i].row_begin == row_offset && strcmp(s->parts[i].name, name) == 0)
                        return &s->parts[i];
        return NULL;
}

int shard_plan_part(const struct shard *s, uint32_t plan_index) {
        if (plan_index >= s->L->plan->n_parts || s->plan_part[plan_index] == UINT32_MAX)
                return -ENOENT;
        return (int)s->plan_part[plan_index];
}

int shard_match(struct shard *s, const struct wire_tensor *t, bool allow_slot, struct shard_part **part_ret,
                int *slot_ret, char *err, size_t errlen) {
        char name[300], pn[LOG_PEER_BUF];   /* pn: the name as a message shows it (log_peer_str) */
        snprintf(name, sizeof(name), "%s", t->name ? t->name : "");
        int slot = -1;
        struct shard_part *q = shard_find(s, name, t->row_offset);
        if (!q && allow_slot) {
                char *sl = strrchr(name, '/'), sn[LOG_PEER_BUF];
                if (sl) {
                        *sl = 0;
                        q = shard_find(s, name, t->row_offset);
                        for (unsigned j = 0; q && j < s->n_slots; j++)
                                if (strcmp(sl + 1, optim_slot_name(s->t->optimizer, j)) == 0)
                                        slot = (int)j;
                        if (q && slot < 0)
                                return errf(err, errlen, -EINVAL, "tensor \"%s\": optimizer %s has no slot \"%s\"",
                                            log_peer_str(t->name, pn, sizeof(pn)), optim_name(s->t->optimizer),
                                            log_peer_str(sl + 1, sn, sizeof(sn)));
                }
        }
        if (!q)
                return errf(err, errlen, -EINVAL, "tensor \"%s\" rows from %llu: no such variable on ps:%u",
                            log_peer_str(t->name ? t->name : "", pn, sizeof(pn)), (unsigned long long)t->row_offset,
                            s->index);
        /* a push's gradients may come as bfloat16, int8 blocks or top-k (rpc.compression), read as float32
         * (wire_in_parse has checked the compressed ones' structure); an Assign's values are the model
         * itself: float32 only */
        if (t->dtype != WIRE_DTYPE_FLOAT32 && (allow_slot || !wire_dtype_is_f32(t->dtype)))
                return errf(err, errlen, -EINVAL, "tensor \"%s\": dtype %u, expected float32 (%u)%s",
                            log_peer_str(t->name ? t->name : "", pn, sizeof(pn)), t->dtype, WIRE_DTYPE_FLOAT32,
                            allow_slot ? "" : ", bfloat16 (3), int8 blocks (4) or top-k (5)");
        if (t->ndims != 2 || t->shape[0] != q->rows || t->shape[1] != q->cols) {
                char shape[128] = "";
                for (unsigned i = 0, at = 0; i < t->ndims && at < sizeof(shape) - 24; i++)
                        at += (unsigned)snprintf(shape + at, sizeof(shape) - at, "%s%llu", i ? ", " : "",
                                                 (unsigned long long)t->shape[i]);
                return errf(err, errlen, -EINVAL, "tensor \"%s\": shape (%s), expected (%u, %u)",
                            log_peer_str(t->name ? t->name : "", pn, sizeof(pn)), shape, q->rows, q->cols);
        }
        *part_ret = q;
        *slot_ret = slot;
        return 0;
}

/* ---- gRPC pushes: gradients stream out of the message's slices, never copied whole ---- */

static void read_wire(void *ud, float *buf, size_t k) {
        wire_reader_read_f32(ud, buf, k);
}

/* The norm's verdict for a push that has passed every other check; counts a clipped one. */
static int norm_verdict(struct shard *s, double sumsq, const char *from, float *scale_ret, char *err, size_t errlen) {
        char who[96] = "", fb[LOG_PEER_BUF];
        if (s->t->max_gradient_norm > 0)   /* only a norm over the limit names the sender */
                snprintf(who, sizeof(who), "%s to ps:%u", log_peer_str(from, fb, sizeof(fb)), s->index);
        int r = apply_norm_limit(s->t, sumsq, who, scale_ret, err, errlen);
        if (r > 0)
                atomic_fetch_add(&s->clipped, 1);
        return r < 0 ? r : 0;
}

int shard_wire_check(struct shard *s, const struct wire_in *in, const char *from, struct shard_part **parts,
                     size_t *floats_ret, float *scale_ret, char *err, size_t errlen) {
        size_t total = 0;
        char pn[LOG_PEER_BUF], fb[LOG_PEER_BUF];   /* the tensor's name and the sender as a message shows them */
        for (size_t i = 0; i < in->n_tensors; i++) {
                int slot, r;
                if ((r = shard_match(s, &in->tensors[i], false, &parts[i], &slot, err, errlen)) < 0)
                        return r;
                for (size_t j = 0; j < i; j++)
                        if (parts[j] == parts[i])
                                return errf(err, errlen, -EINVAL, "tensor \"%s\" appears twice in one push",
                                            log_peer_str(in->tensors[i].name, pn, sizeof(pn)));
                total += parts[i]->a.n;
        }
        double sumsq = 0;
        double *norm = s->t->max_gradient_norm > 0 ? &sumsq : NULL;
        for (size_t i = 0; i < in->n_tensors; i++) {
                /* int8 blocks need no reading for the check alone: wire_in_parse has held every scale to
                 * one whose values are all finite */
                if (!norm && in->tensors[i].dtype == WIRE_DTYPE_INT8_BLOCKS)
                        continue;
                struct wire_reader rd;
                wire_reader_init(&rd, &in->tensors[i]);
                if (!apply_check_read(parts[i]->a.n, read_wire, &rd, norm))
                        return errf(err, errlen, -EINVAL, "gradient \"%s\" from %s contains NaN or Inf; nothing applied",
                                    log_peer_str(in->tensors[i].name, pn, sizeof(pn)),
                                    log_peer_str(from, fb, sizeof(fb)));
        }
        *floats_ret = total;
        return norm_verdict(s, sumsq, from, scale_ret, err, errlen);
}

void shard_wire_apply(struct shard *s, const struct wire_in *in, struct shard_part *const *parts, float scale,
                      float *values) {
        shard_tensors_apply(s, in->tensors, in->n_tensors, parts, scale, values);
}

void shard_tensors_apply(struct shard *s, const struct wire_tensor *t, size_t n, struct shard_part *const *parts,
                         float scale, float *values) {
        for (size_t i = 0, at = 0; i < n; at += parts[i]->a.n, i++) {
                struct shard_part *q = parts[i];
                struct wire_reader rd;
                wire_reader_init(&rd, &t[i]);
                /* float32 in one aligned piece (a backup's ring, a large slice): applied where it lies */
                const float *whole = scale == 1.0f && t[i].dtype == WIRE_DTYPE_FLOAT32 && t[i].n_segs == 1 &&
                                     (uintptr_t)t[i].segs[0].p % sizeof(float) == 0 ? (const float *)t[i].segs[0].p : NULL;
                pthread_mutex_lock(&q->mu);
                if (whole)
                        apply_gradient(s->t, &q->a, whole);
                else
                        apply_gradient_read(s->t, &q->a, scale, read_wire, &rd);
                if (values)
                        memcpy(values + at, q->a.w, q->a.n * sizeof(float));
                pthread_mutex_unlock(&q->mu);
        }
}

void shard_wire_read(const struct wire_in *in, struct shard_part *const *parts, float scale, float *dst) {
        for (size_t i = 0, at = 0; i < in->n_tensors; at += parts[i]->a.n, i++) {
                struct wire_reader rd;
                wire_reader_init(&rd, &in->tensors[i]);
                read_wire(&rd, dst + at, parts[i]->a.n);
        }
        size_t total = 0;
        for (size_t i = 0; i < in->n_tensors; i++)
                total += parts[i]->a.n;
        if (scale != 1.0f)
                apply_scale(dst, total, scale);
}

void shard_block_read(struct shard *s, const uint32_t *idx, uint32_t n, float *values) {
        for (uint32_t j = 0; j < n; j++) {
                struct shard_part *q = &s->parts[idx[j]];
                pthread_mutex_lock(&q->mu);
                memcpy(values + q->model_off, q->a.w, q->a.n * sizeof(float));
                pthread_mutex_unlock(&q->mu);
        }
}

/* ---- shared-memory pushes ---- */

int shard_block_check(struct shard *s, const float *grads, const uint32_t *idx, uint32_t n, float *scratch,
                      const char *from, char *err, size_t errlen) {
        size_t at = 0;
        double sumsq = 0;
        double *norm = s->t->max_gradient_norm > 0 ? &sumsq : NULL;
        for (uint32_t j = 0; j < n; j++) {
                const struct shard_part *q = &s->parts[idx[j]];
                memcpy(scratch + at, grads + q->model_off, q->a.n * sizeof(float));
                if (!apply_check(scratch + at, q->a.n, norm))
                        return errf(err, errlen, -EINVAL,
                                    "gradient \"%s\" rows %u..%u from %s contains NaN or Inf; nothing applied", q->name,
                                    q->row_begin, q->row_begin + q->rows, from);
                at += q->a.n;
        }
        float scale;
        int r = norm_verdict(s, sumsq, from, &scale, err, errlen);
        if (r == 0 && scale != 1.0f)
                apply_scale(scratch, at, scale);
        return r;
}

void shard_block_apply(struct shard *s, const uint32_t *idx, uint32_t n, const float *scratch, float *values) {
        size_t at = 0;
        for (uint32_t j = 0; j < n; j++) {
                struct shard_part *q = &s->parts[idx[j]];
                pthread_mutex_lock(&q->mu);
                apply_gradient(s->t, &q->a, scratch + at);
                memcpy(values + q->model_off, q->a.w, q->a.n * sizeof(float));
                pthread_mutex_unlock(&q->mu);
                at += q->a.n;
        }
}

/* ---- assign, pull ---- */

int shard_assign(struct shard *s, const struct wire_in *in, bool with_slots, uint64_t global_step, char *err,
                 size_t errlen) {
        struct shard_part **parts = calloc(in->n_tensors + 1, sizeof(*parts));
        int *slots = calloc(in->n_tensors + 1, sizeof(*slots));
        bool *seen = calloc((size_t)s->n_parts * (1 + s->n_slots) + 1, sizeof(*seen));
        int r = 0;
        if (!parts || !slots || !seen) {
                r = errf(err, errlen, -ENOMEM, "out of memory");
                goto out;
        }
        for (size_t i = 0; i < in->n_tensors; i++) {
                if ((r = shard_match(s, &in->tensors[i], true, &parts[i], &slots[i], err, errlen)) < 0)
                        goto out;
                seen[(size_t)(parts[i] - s->parts) * (1 + s->n_slots) + (size_t)(slots[i] + 1)] = true;
        }
        /* every variable must be given, and every slot too when slots are given */
        for (uint32_t k = 0; k < s->n_parts; k++)
                for (unsigned j = 0; j <= (with_slots ? s->n_slots : 0); j++)
                        if (!seen[(size_t)k * (1 + s->n_slots) + j]) {
                                const struct shard_part *q = &s->parts[k];
                                r = errf(err, errlen, -EINVAL, "Assign is missing \"%s%s%s\" rows %u..%u", q->name,
                                         j ? "/" : "", j ? optim_slot_name(s->t->optimizer, j - 1) : "",
                                         q->row_begin, q->row_begin + q->rows);
                                goto out;
                        }
        for (uint32_t k = 0; k < s->n_parts; k++)
                pthread_mutex_lock(&s->parts[k].mu);
        for (size_t i = 0; i < in->n_tensors; i++)
                wire_tensor_copy(&in->tensors[i], slots[i] < 0 ? parts[i]->a.w : parts[i]->a.slot[slots[i]]);
        for (uint32_t k = 0; k < s->n_parts; k++) {
                if (with_slots)
                        s->parts[k].a.updates = global_step;
                else
                        apply_reset(s->t, &s->parts[k].a, global_step);
        }
        atomic_store(&s->global_step, s->index == 0 ? global_step : 0);
        atomic_store(&s->initialized, true);
        for (uint32_t k = 0; k < s->n_parts; k++)
                pthread_mutex_unlock(&s->parts[k].mu);
out:
        free(parts);
        free(slots);
        free(seen);
        return r;
}

void shard_read(struct shard *s, uint32_t k, unsigned n_slots, float *dst) {
        struct shard_part *q = &s->parts[k];
        pthread_mutex_lock(&q->mu);
        for (unsigned j = 0; j <= n_slots; j++)
                memcpy(dst + j * q->a.n, j ? q->a.slot[j - 1] : q->a.w, q->a.n * sizeof(float));
        pthread_mutex_unlock(&q->mu);
}
