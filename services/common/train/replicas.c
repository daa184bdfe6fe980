/* Data-parallel replicas: one model per backend (one per local GPU), the batch split between them,
 * behind the same forward/backward-blocks calls as one model: see replicas.h. */
#include "replicas.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

enum job { JOB_NONE, JOB_FORWARD, JOB_BACKWARD, JOB_QUIT };

struct replica {
        struct replicas *set;
        uint32_t index;
        struct model *m;
        pthread_t thread;
        bool started;
        /* this pass */
        uint32_t off, B;           /* its shard: examples [off, off + B) */
        uint64_t items;            /* (var, block) items it has reached */
        bool finished;
        int result;
        float loss;
        uint32_t correct;
};

struct replicas {
        uint32_t n, active;        /* replicas, and those with examples in this pass */
        struct replica rep[DEVICE_MAX_GPUS];
        uint32_t B;                /* this pass's whole batch */
        const float *x;
        const uint8_t *labels;
        bool want_correct;
        pthread_mutex_t mu;
        pthread_cond_t cv;
        enum job job;
        uint64_t job_seq;
        uint64_t published;        /* forward: blocks replica 0 has made ready */
        bool abort;
        model_block_cb user_cb;
        void *user_ud;
};

uint32_t replicas_count(const struct replicas *r)
{
        return r->n;
}

struct model *replicas_model(struct replicas *r)
{
        return r->rep[0].m;
}

/* Floats [*first, *first + *count) of var's block in the parameter (and gradient) blocks. */
static void block_range(const struct model *m, uint32_t var, uint32_t block, size_t *first, size_t *count)
{
        const struct model_var *v = model_var(m, var);
        const uint32_t *rb;
        model_var_blocks(m, var, &rb);
        *first = v->offset + (size_t)rb[block] * v->cols;
        *count = (size_t)(rb[block + 1] - rb[block]) * v->cols;
}

/* Forward, replica i > 0: wait until replica 0 has made the next block ready, then copy it. */
static int follower_before(void *ud, uint32_t var, uint32_t block)
{
        struct replica *p = ud;
        struct replicas *s = p->set;
        uint64_t k = ++p->items;
        pthread_mutex_lock(&s->mu);
        while (s->published < k && !s->abort)
                pthread_cond_wait(&s->cv, &s->mu);
        bool ab = s->abort;
        pthread_mutex_unlock(&s->mu);
        if (ab)
                return -ECANCELED;
        size_t first, count;
        block_range(p->m, var, block, &first, &count);
        memcpy(model_params(p->m) + first, model_params(s->rep[0].m) + first, sizeof(float) * count);
        return 0;
}

/* Forward, replica 0: the caller's callback fills the block, then the others may read it. */
static int leader_before(void *ud, uint32_t var, uint32_t block)
{
        struct replicas *s = ud;
        int r = s->user_cb ? s->user_cb(s->user_ud, var, block) : 0;
        pthread_mutex_lock(&s->mu);
        if (r != 0)
                s->abort = true;
        else
                s->published++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        return r;
}

/* Backward, replica i > 0: its gradient of the block is on the host. */
static int follower_after(void *ud, uint32_t var, uint32_t block)
{
        struct replica *p = ud;
        struct replicas *s = p->set;
        pthread_mutex_lock(&s->mu);
        p->items++;
        bool ab = s->abort;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        return ab ? -ECANCELED : 0;
}

/* Backward, replica 0: when every replica has the block, sum_i (B_i / B) g_i into replica 0's, then
 * the caller's callback. */
static int leader_after(void *ud, uint32_t var, uint32_t block)
{
        struct replicas *s = ud;
        uint64_t k = ++s->rep[0].items;
        int err = 0;
        pthread_mutex_lock(&s->mu);
        for (uint32_t i = 1; i < s->active && !err; i++) {
                struct replica *p = &s->rep[i];
                while (p->items < k && !p->finished && !s->abort)
                        pthread_cond_wait(&s->cv, &s->mu);
                if (p->items < k)
                        err = s->abort ? -ECANCELED : p->result < 0 ? p->result : -EPROTO;
        }
        pthread_mutex_unlock(&s->mu);
        if (err)
                return err;
        size_t first, count;
        block_range(s->rep[0].m, var, block, &first, &count);
        float *g0 = model_grads(s->rep[0].m) + first;
        if (s->active > 1) {
                float w0 = (float)s->rep[0].B / (float)s->B;
                for (size_t j = 0; j < count; j++)
                        g0[j] *= w0;
                for (uint32_t i = 1; i < s->active; i++) {
                        const float *gi = model_grads(s->rep[i].m) + first;
                        float wi = (float)s->rep[i].B / (float)s->B;
                        for (size_t j = 0; j < count; j++)
                                g0[j] += wi * gi[j];
                }
        }
        return s->user_cb ? s->user_cb(s->user_ud, var, block) : 0;
}

static void *follower_main(void *arg)
{
        struct replica *p = arg;
        struct replicas *s = p->set;
        uint64_t seen = 0;
        for (;;) {
                pthread_mutex_lock(&s->mu);
                while (s->job_seq == seen)
                        pthread_cond_wait(&s->cv, &s->mu);
                seen = s->job_seq;
                enum job job = s->job;
                bool mine = p->index < s->active;
                pthread_mutex_unlock(&s->mu);
                if (job == JOB_QUIT)
                        return NULL;
                if (!mine)
                        continue;
                int r = 0;
                if (job == JOB_FORWARD)
                        r = model_forward_blocks(p->m, s->x + (size_t)p->off * model_input_size(p->m), s->labels + p->off,
                                                 p->B, &p->loss, s->want_correct ? &p->correct : NULL, follower_before, p);
                else if (job == JOB_BACKWARD)
                        r = model_backward_blocks(p->m, follower_after, p);
                pthread_mutex_lock(&s->mu);
                p->result = r;
                p->finished = true;
                if (r != 0)
                        s->abort = true;
                pthread_cond_broadcast(&s->cv);
                pthread_mutex_unlock(&s->mu);
        }
}

/* Starts job on the active followers (the caller runs replica 0). */
static void start_job(struct replicas *s, enum job job)
{
        pthread_mutex_lock(&s->mu);
        s->job = job;
        s->published = 0;
        s->abort = false;
        for (uint32_t i = 0; i < s->n; i++) {
                s->rep[i].items = 0;
                s->rep[i].finished = false;
                s->rep[i].result = 0;
        }
        s->job_seq++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
}

/* Ends replica 0's part (result r0) and waits for the followers; the first error wins. */
static int finish_job(struct replicas *s, int r0)
{
        pthread_mutex_lock(&s->mu);
        if (r0 != 0) {
                s->abort = true;
                pthread_cond_broadcast(&s->cv);
        }
        int r = r0;
        for (uint32_t i = 1; i < s->active; i++) {
                while (!s->rep[i].finished)
                        pthread_cond_wait(&s->cv, &s->mu);
                if (r == 0 && s->rep[i].result != -ECANCELED)
                        r = s->rep[i].result;
        }
        for (uint32_t i = 1; i < s->active && r == 0; i++)
                r = s->rep[i].result;
        pthread_mutex_unlock(&s->mu);
        return r;
}

int replicas_forward_blocks(struct replicas *s, const float *x, const uint8_t *labels, uint32_t B, float *loss_ret,
                            uint32_t *correct_ret, model_block_cb before, void *ud)
{
        if (s->n == 1)
                return model_forward_blocks(s->rep[0].m, x, labels, B, loss_ret, correct_ret, before, ud);
        uint32_t max = model_max_batch(s->rep[0].m) * s->n;
        if (B == 0 || B > max || !x || !labels)
                return -EINVAL;
        s->active = B < s->n ? B : s->n;
        for (uint32_t i = 0, off = 0; i < s->active; i++) {
                uint32_t b = B / s->active + (i < B % s->active);
                if (b > model_max_batch(s->rep[i].m))
                        return -EINVAL;
                s->rep[i].off = off;
                s->rep[i].B = b;
                off += b;
        }
        s->B = B;
        s->x = x;
        s->labels = labels;
        s->want_correct = correct_ret != NULL;
        s->user_cb = before;
        s->user_ud = ud;
        struct replica *p0 = &s->rep[0];
        start_job(s, JOB_FORWARD);
        int r = model_forward_blocks(p0->m, x, labels, p0->B, &p0->loss, correct_ret ? &p0->correct : NULL,
                                     leader_before, s);
        r = finish_job(s, r);
        if (r != 0)
                return r;
        double loss = 0;
        uint32_t correct = 0;
        for (uint32_t i = 0; i < s->active; i++) {
                loss += (double)s->rep[i].loss * s->rep[i].B;
                correct += s->rep[i].correct;
        }
        if (loss_ret)
                *loss_ret = (float)(loss / B);
        if (correct_ret)
                *correct_ret = correct;
        return 0;
}

int replicas_backward_blocks(struct replicas *s, model_block_cb after, void *ud)
{
        if (s->n == 1)
                return model_backward_blocks(s->rep[0].m, after, ud);
        if (s->B == 0)
                return -EINVAL;
        s->user_cb = after;
        s->user_ud = ud;
        start_job(s, JOB_BACKWARD);
        int r = model_backward_blocks(s->rep[0].m, leader_after, s);
        return finish_job(s, r);
}

int replicas_params_sync(struct replicas *s)
{
        const float *p0 = model_params(s->rep[0].m);
        size_t n = model_n_params(s->rep[0].m);
        int r = model_params_sync(s->rep[0].m);
        for (uint32_t i = 1; i < s->n && r == 0; i++) {
                memcpy(model_params(s->rep[i].m), p0, sizeof(float) * n);
                r = model_params_sync(s->rep[i].m);
        }
        return r;
}

int replicas_set_var_blocks(struct replicas *s, uint32_t var, uint32_t n_blocks, const uint32_t *row_begin)
{
        for (uint32_t i = 0; i < s->n; i++) {
                int r = model_set_var_blocks(s->rep[i].m, var, n_blocks, row_begin);
                if (r < 0)
                        return r;
        }
        return 0;
}

int replicas_follow_blocks(struct replicas *s)
{
        for (uint32_t v = 0; v < model_n_vars(s->rep[0].m); v++) {
                const uint32_t *rows;
                uint32_t nb = model_var_blocks(s->rep[0].m, v, &rows);
                for (uint32_t i = 1; i < s->n && nb > 1; i++) {
                        int r = model_set_var_blocks(s->rep[i].m, v, nb, rows);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

struct replicas *replicas_free(struct replicas *s)
{
        if (!s)
                return NULL;
        pthread_mutex_lock(&s->mu);
        s->job = JOB_QUIT;
        s->job_seq++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        for (uint32_t i = 0; i < s->n; i++) {
                if (s->rep[i].started)
                        pthread_join(s->rep[i].thread, NULL);
                model_free(s->rep[i].m);
        }
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
}

int replicas_new(struct backend *const *bes, uint32_t n, const struct model_spec *spec, uint32_t max_batch,
                        struct replicas **ret, char *msg, size_t msglen)
{
        if (n == 0 || n > DEVICE_MAX_GPUS || max_batch == 0) {
                snprintf(msg, msglen, "%u replicas of batch %u: between 1 and %d replicas, batch at least 1", n, max_batch,
                         DEVICE_MAX_GPUS);
                return -EINVAL;
        }
        struct replicas *s = calloc(1, sizeof(*s));
        if (!s) {
                snprintf(msg, msglen, "out of memory");
                return -ENOMEM;
        }
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->cv, NULL);
        s->n = n;
        uint32_t per = (max_batch + n - 1) / n; /* the largest shard */
        int r = 0;
        for (uint32_t i = 0; i < n && r == 0; i++) {
                s->rep[i].set = s;
                s->rep[i].index = i;
                r = device_model_new(bes[i], spec, per, &s->rep[i].m, msg, msglen);
        }
        for (uint32_t i = 1; i < n && r == 0; i++) {
                r = -pthread_create(&s->rep[i].thread, NULL, follower_main, &s->rep[i]);
                if (r == 0)
                        s->rep[i].started = true;
                else
                        snprintf(msg, msglen, "cannot start a replica thread: %s", strerror(-r));
        }
        if (r < 0) {
                replicas_free(s);
                return r;
        }
        *ret = s;
        return 0;
}
