/* chiefd's Watch streams: the handler hands each stream to one thread, which sends JobStatus when what
 * it shows changes (at most every min_interval), a heartbeat otherwise, and the last word at the end. */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "chiefd-internal.h"
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

void chief_watch_handler(struct rpc_call *call, void *ud) {
        struct chief *c = ud;
        ProtobufCMessage *m = chief_rpc_request(call, &psfleet__v1__watch_request__descriptor);
        if (!m)
                return;
        const Psfleet__V1__WatchRequest *q = (const Psfleet__V1__WatchRequest *)m;
        struct watcher *w = calloc(1, sizeof(*w));
        if (!w) {
                protobuf_c_message_free_unpacked(m, NULL);
                rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
                return;
        }
        uint32_t mi = q->min_interval_ms ? q->min_interval_ms : 500;
        w->call = call;
        w->min_interval_us = (uint64_t)(mi < 100 ? 100 : mi) * 1000;
        w->heartbeat_us = (uint64_t)(q->heartbeat_ms ? q->heartbeat_ms : 5000) * 1000;
        protobuf_c_message_free_unpacked(m, NULL);
        pthread_mutex_lock(&c->watch_mu);
        bool closed = c->watch_closed;
        if (!closed) {
                w->next = c->new_watchers;
                c->new_watchers = w;
                pthread_cond_signal(&c->st.changed);
        }
        pthread_mutex_unlock(&c->watch_mu);
        if (closed) {
                free(w);
                rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "chiefd is stopping");
        }
}

/* What a watcher sees, hashed: a new value means a message is due. */
static uint64_t status_key(struct chief *c, bool *final) {
        uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
        pthread_mutex_lock(&c->st.lock);
        MIX(c->st.js.state);
        MIX(c->st.global_step);
        MIX(c->st.have_ckpt ? c->st.last_ckpt.global_step + 1 : 0);
        MIX(c->st.have_ckpt ? c->st.last_ckpt.time_us : 0);
        MIX(c->st.n_ckpts);
        MIX(c->st.have_eval ? c->st.eval_step + 1 : 0);
        MIX(c->st.n_losses);
        MIX(c->st.wait.on ? c->st.wait.since_us : 0);
        MIX(c->st.last_ckpt_error[0]);
        for (const char *p = c->st.js.reason; *p; p++)
                MIX((unsigned char)*p);
        *final = chief_state_final(&c->st.js);
        pthread_mutex_unlock(&c->st.lock);
#undef MIX
        return h;
}

/* One pass over the watchers: sends where due, ends the streams that are over. Returns the list left. */
static struct watcher *watch_serve(struct chief *c, struct watcher *list) {
        bool final;
        uint64_t key = status_key(c, &final), t = mono_us();
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
                                bb = chief_status_pack(&c->st);
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
        struct chief *c = arg;
        struct watcher *active = NULL;
        pthread_mutex_lock(&c->watch_mu);
        for (;;) {
                while (c->new_watchers) {
                        struct watcher *w = c->new_watchers;
                        c->new_watchers = w->next;
                        w->next = active;
                        active = w;
                }
                if (c->watch_closed)
                        break;
                if (active) {
                        pthread_mutex_unlock(&c->watch_mu);
                        active = watch_serve(c, active);
                        pthread_mutex_lock(&c->watch_mu);
                }
                if (c->watch_closed || c->new_watchers)
                        continue;
                if (!active) {
                        pthread_cond_wait(&c->st.changed, &c->watch_mu);
                } else {
                        struct timespec until = realtime_in_ms(WATCH_TICK_MS);
                        pthread_cond_timedwait(&c->st.changed, &c->watch_mu, &until);
                }
        }
        pthread_mutex_unlock(&c->watch_mu);
        /* A job that has just ended still gets its last word to every watcher (and the stream ends OK). */
        active = watch_serve(c, active);
        while (active) {
                struct watcher *w = active;
                active = w->next;
                rpc_call_finish(w->call, GRPC_STATUS_UNAVAILABLE, "chiefd is stopping");
                free(w);
        }
        return NULL;
}

int chief_watch_start(struct chief *c) {
        int r = pthread_create(&c->watch_thread, NULL, watch_main, c);
        if (r != 0)
                return -r;
        c->watch_started = true;
        return 0;
}

void chief_watch_stop(struct chief *c) {
        pthread_mutex_lock(&c->watch_mu);
        c->watch_closed = true;
        pthread_cond_signal(&c->st.changed);
        pthread_mutex_unlock(&c->watch_mu);
        if (c->watch_started) {
                pthread_join(c->watch_thread, NULL);
                c->watch_started = false;
        }
}
