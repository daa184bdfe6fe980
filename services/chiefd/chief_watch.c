/* chiefd's Watch streams: the handler hands each stream to one thread, which sends JobStatus when what
 * it shows changes (at most every min_interval), a heartbeat otherwise, and the last word at the end. */
#include "chief_watch.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include <pthread.h>

#include "chief_status.h"
#include "rpc.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/supervisor.pb-c.h"

#define WATCH_TICK_MS 100                  /* how often the watch thread looks for changes */
#define WATCH_SEND_TIMEOUT_MS 5000         /* a watcher that reads nothing for this long is dropped */

/* One Watch stream. */
struct watcher {
        struct rpc_call *call;
        uint64_t min_interval_us, heartbeat_us;
        uint64_t last_sent_mono;
        uint64_t key;                     /* hash of what the last message showed */
        bool sent;
        struct watcher *next;
};

struct chief_watch {
        struct chief_status *st;          /* what the streams show; its `changed` wakes the thread */
        pthread_mutex_t mu;               /* protects the fields below (waited on with st->changed) */
        struct watcher *new_watchers;     /* handed over by chief_watch_add, taken by the thread */
        bool closed;
        pthread_t thread;
        bool started;
};

int chief_watch_add(struct chief_watch *cw, struct rpc_call *call, uint32_t min_interval_ms, uint32_t heartbeat_ms) {
        struct watcher *w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        uint32_t mi = min_interval_ms ? min_interval_ms : 500;
        w->call = call;
        w->min_interval_us = (uint64_t)(mi < 100 ? 100 : mi) * 1000;
        w->heartbeat_us = (uint64_t)(heartbeat_ms ? heartbeat_ms : 5000) * 1000;
        pthread_mutex_lock(&cw->mu);
        bool closed = cw->closed;
        if (!closed) {
                w->next = cw->new_watchers;
                cw->new_watchers = w;
                pthread_cond_signal(&cw->st->changed);
        }
        pthread_mutex_unlock(&cw->mu);
        if (closed) {
                free(w);
                return -ESHUTDOWN;
        }
        return 0;
}

/* What a watcher sees, hashed: a new value means a message is due. */
static uint64_t status_key(struct chief_status *s, bool *final) {
        uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
        pthread_mutex_lock(&s->lock);
        MIX(s->js.state);
        MIX(s->global_step);
        MIX(s->have_ckpt ? s->last_ckpt.global_step + 1 : 0);
        MIX(s->have_ckpt ? s->last_ckpt.time_us : 0);
        MIX(s->n_ckpts);
        MIX(s->have_eval ? s->eval_step + 1 : 0);
        MIX(s->n_losses);
        MIX(s->wait.on ? s->wait.since_us : 0);
        MIX(s->last_ckpt_error[0]);
        for (const char *p = s->js.reason; *p; p++)
                MIX((unsigned char)*p);
        *final = chief_state_final(&s->js);
        pthread_mutex_unlock(&s->lock);
#undef MIX
        return h;
}

/* One pass over the watchers: sends where due, ends the streams that are over. Returns the list left. */
static struct watcher *watch_serve(struct chief_status *st, struct watcher *list) {
        bool final;
        uint64_t key = status_key(st, &final), t = mono_us();
        grpc_byte_buffer *bb = NULL;
        struct watcher **pp = &list;
        while (*pp) {
                struct watcher *w = *pp;
                bool drop = false;
                if (rpc_call_cancelled(w->call)) {
                        rpc_call_finish(w->call, GRPC_STATUS_CANCELLED, "the watcher went away");
                        drop = true;
                } else if (!w->sent || (key != w->key && t - w->last_sent_mono >= w->min_interval_us) ||
                           t - w->last_sent_mono >= w->heartbeat_us || final) {
                        if (!bb)
                                bb = chief_status_pack(st);
                        int r = bb ? rpc_call_send(w->call, grpc_byte_buffer_copy(bb), WATCH_SEND_TIMEOUT_MS) : -ENOMEM;
                        if (r < 0) {
                                rpc_call_finish(w->call, r == -ETIMEDOUT ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_CANCELLED,
                                                "cannot send to the watcher");
                                drop = true;
                        } else if (final) {
                                rpc_call_finish(w->call, GRPC_STATUS_OK, NULL);
                                drop = true;
                        } else {
                                w->sent = true;
                                w->key = key;
                                w->last_sent_mono = t;
                        }
                }
                if (drop) {
                        *pp = w->next;
                        free(w);
                } else {
                        pp = &w->next;
                }
        }
        if (bb)
                grpc_byte_buffer_destroy(bb);
        return list;
}

static void *watch_main(void *arg) {
        struct chief_watch *cw = arg;
        struct watcher *active = NULL;
        pthread_mutex_lock(&cw->mu);
        for (;;) {
                while (cw->new_watchers) {
                        struct watcher *w = cw->new_watchers;
                        cw->new_watchers = w->next;
                        w->next = active;
                        active = w;
                }
                if (cw->closed)
                        break;
                if (active) {
                        pthread_mutex_unlock(&cw->mu);
                        active = watch_serve(cw->st, active);
                        pthread_mutex_lock(&cw->mu);
                }
                if (cw->closed || cw->new_watchers)
                        continue;
                if (!active) {
                        pthread_cond_wait(&cw->st->changed, &cw->mu);
                } else {
                        struct timespec until = realtime_in_ms(WATCH_TICK_MS);
                        pthread_cond_timedwait(&cw->st->changed, &cw->mu, &until);
                }
        }
        pthread_mutex_unlock(&cw->mu);
        /* A job that has just ended still gets its last word to every watcher (and the stream ends OK). */
        active = watch_serve(cw->st, active);
        while (active) {
                struct watcher *w = active;
                active = w->next;
                rpc_call_finish(w->call, GRPC_STATUS_UNAVAILABLE, "chiefd is stopping");
                free(w);
        }
        return NULL;
}

struct chief_watch *chief_watch_free(struct chief_watch *cw) {
        if (!cw)
                return NULL;
        chief_watch_stop(cw);
        pthread_mutex_destroy(&cw->mu);
        free(cw);
        return NULL;
}

int chief_watch_new(struct chief_status *st, struct chief_watch **ret) {
        struct chief_watch *cw = calloc(1, sizeof(*cw));
        if (!cw)
                return -ENOMEM;
        cw->st = st;
        pthread_mutex_init(&cw->mu, NULL);
        int r = pthread_create(&cw->thread, NULL, watch_main, cw);
        if (r != 0) {
                chief_watch_free(cw);
                return -r;
        }
        cw->started = true;
        *ret = cw;
        return 0;
}

void chief_watch_stop(struct chief_watch *cw) {
        if (!cw)
                return;
        pthread_mutex_lock(&cw->mu);
        cw->closed = true;
        pthread_cond_signal(&cw->st->changed);
        pthread_mutex_unlock(&cw->mu);
        if (cw->started) {
                pthread_join(cw->thread, NULL);
                cw->started = false;
        }
}
