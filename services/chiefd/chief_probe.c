/* chiefd's status calls: every shard's ShardStatus (is it up, initialized, at which step) and, at the
 * end, every worker's WorkerStatus and Stop. Each call has a short deadline. Main thread. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chief_probe.h"

#include "chief_metrics.h"
#include "chief_status.h"
#include "config.h"
#include "log.h"
#include "rpc.h"
#include "ps_client.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"
#include "psfleet/v1/supervisor.pb-c.h"
#include "psfleet/v1/worker.pb-c.h"

#define M_WORKER_STATUS "/psfleet.v1.Worker/GetWorkerStatus"
#define M_WORKER_STOP "/psfleet.v1.Worker/Stop"
#define WORKER_TIMEOUT_MS 1000

/* One status call with a short deadline. On failure writes "ps:1 (127.0.0.1:7002): UNAVAILABLE: ..."
 * into why. */
static int probe_call(struct rpc_channel *ch, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *reply_desc, uint64_t timeout_ms, ProtobufCMessage **ret,
                      char *why, size_t len) {
        struct rpc_result res;
        int r = rpc_call(ch, method, wire_pack(req), timeout_ms, false, &res);
        if (r < 0) {
                const char *tail = strstr(res.message, rpc_status_name(res.status));
                chief_strfmt(why, len, "%s (%s): %s", rpc_channel_name(ch), rpc_channel_target(ch),
                         tail ? tail : res.message);
        } else {
                r = wire_unpack(res.reply, reply_desc, ret);
                if (r < 0)
                        chief_strfmt(why, len, "%s (%s): reply does not parse", rpc_channel_name(ch),
                                 rpc_channel_target(ch));
        }
        rpc_result_clear(&res);
        return r;
}

/* training.mode sync: the shard's step and its dropped pushes, for its state line; else "". */
static const char *sync_state(const struct job_config *cfg, const Psfleet__V1__ShardStatus *st, char *buf, size_t len) {
        if (cfg->training.mode == MODE_SYNC) {
                chief_strfmt(buf, len, "; sync step %" PRIu64 ", %" PRIu64 " stale dropped, %u held", st->sync_step,
                             st->stale_dropped, st->held_pushes);
                return buf;
        }
        if (cfg->training.mode != MODE_SSP || !st->n_clocks)
                return "";
        /* ssp: the clock table, "w0 12, w1 10 (waits), w2 - (not live)" */
        size_t at = (size_t)snprintf(buf, len, "; ssp clocks");
        for (size_t i = 0; i < st->n_clocks && at < len; i++) {
                const Psfleet__V1__WorkerClock *k = st->clocks[i];
                at += (size_t)snprintf(buf + at, len - at, "%s w%u %" PRIu64 "%s", i ? "," : "", k->worker, k->clock,
                                       k->waiting ? " (waits)" : k->live ? "" : " (not live)");
        }
        if (at < len)
                snprintf(buf + at, len - at, ", most ahead %" PRIu64 " (bound %u)", st->max_ahead,
                         cfg->training.staleness);
        return buf;
}

/* ---- ps.replicas 2: the chief alone decides which psd of a shard is its primary ---- */

#define ROLE_PRIMARY PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY
#define ROLE_BACKUP PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_BACKUP
#define REPLICA_PROBE_MS 500   /* a frozen psd holds a pass this long, twice at most (ps.failover_ms counts on it) */

static bool is_primary(const Psfleet__V1__ShardStatus *st) {
        return st && st->replica && st->replica->role == ROLE_PRIMARY;
}

/* Shard s's two psds looked at: at the chief's start it adopts the primary of the newest epoch (or
 * makes cluster.ps[s] the primary of epoch 1); a primary lost for ps.failover_ms, or back without its
 * variables, while its backup held every update, is replaced by the backup at the next epoch; the
 * other psd, when it answers at an older epoch, is told to be the backup (it then gets the primary's
 * state). The client then talks to the primary. Main thread. */
/* Returns the primary's status (*ret, the caller's to free) as ps_client_probe would, or -errno with
 * why in err: the primary is probed once per pass. */
static int manage_replicas(struct chief_status *status, struct ps_client *pc, uint32_t s, ProtobufCMessage **ret,
                           char *err, size_t errlen) {
        const struct job_config *cfg = status->cfg;
        Psfleet__V1__ShardStatus *st[2] = {NULL, NULL};
        char e[512], why[2][512];
        int pr[2];
        for (uint32_t w = 0; w < 2; w++)
                if ((pr[w] = ps_client_probe_psd(pc, s, w, REPLICA_PROBE_MS, (void **)&st[w], why[w], sizeof(why[w]))) < 0)
                        st[w] = NULL;
        pthread_mutex_lock(&status->lock);
        struct ps_info *pi = &status->ps[s];
        uint32_t cur = pi->primary, other = !cur;
        uint64_t t = mono_us();
        pthread_mutex_unlock(&status->lock);
        int r;
        if (!pi->epoch) {
                /* the chief's start: a primary already there (chiefd restarted), else ps[s] at epoch 1 */
                int best = -1;
                for (uint32_t w = 0; w < 2; w++)
                        if (is_primary(st[w]) && (best < 0 || st[w]->replica->epoch > st[best]->replica->epoch))
                                best = (int)w;
                uint64_t epoch = best >= 0 ? st[best]->replica->epoch : 1;
                if (best < 0 && st[0] && (r = ps_client_set_role(pc, s, 0, ROLE_PRIMARY, 1, true, e, sizeof(e))) < 0) {
                        log_warning("Cannot make ps:%u's %s its primary: %s", s, cfg->cluster.ps[s].addr, e);
                        goto out;
                }
                if (best < 0 && !st[0])
                        goto out;   /* ps[s] is not up yet: decided when it is */
                cur = best >= 0 ? (uint32_t)best : 0;
                other = !cur;
                pthread_mutex_lock(&status->lock);
                pi->epoch = epoch;
                pi->primary = cur;
                pthread_mutex_unlock(&status->lock);
                ps_client_use(pc, s, cur);
                log_info("ps:%u: primary %s, backup %s, epoch %" PRIu64, s, ps_client_addr(pc, s, cur),
                         ps_client_addr(pc, s, other), epoch);
        }
        const Psfleet__V1__ShardStatus *p = st[cur], *b = st[other];
        bool lost = !p || (!p->initialized && b && b->initialized) || (p->replica && p->replica->epoch > pi->epoch);
        if (!lost)
                pi->primary_lost_mono = 0;
        else if (!pi->primary_lost_mono)
                pi->primary_lost_mono = t;
        /* back without its variables: at once; not answering: after ps.failover_ms */
        bool due = lost && (p || t - pi->primary_lost_mono >= cfg->ps.failover_ms * 1000u);
        if (due && b && b->initialized && b->replica && b->replica->role == ROLE_BACKUP && pi->replicated) {
                uint64_t epoch = pi->epoch + 1, since = pi->primary_lost_mono;
                if ((r = ps_client_set_role(pc, s, other, ROLE_PRIMARY, epoch, true, e, sizeof(e))) < 0) {
                        log_warning("Cannot promote ps:%u's backup %s: %s; trying again", s, ps_client_addr(pc, s, other), e);
                        goto out;
                }
                ps_client_use(pc, s, other);
                pthread_mutex_lock(&status->lock);
                pi->epoch = epoch;
                pi->primary = other;
                pi->failovers++;
                pi->last_failover_us = t - since;
                pi->primary_lost_mono = 0;
                pi->replicated = false;   /* until its new backup is in sync */
                pthread_mutex_unlock(&status->lock);
                log_notice("ps:%u: its primary %s %s; promoted its backup %s at epoch %" PRIu64 " after %" PRIu64
                           " ms: no update lost", s, ps_client_addr(pc, s, cur),
                           p ? "came back without its variables" : "is lost", ps_client_addr(pc, s, other), epoch,
                           (t - since) / 1000);
                cur = other;
                other = !cur;
                p = st[cur];
                b = st[other];
        }
        /* the other psd at an older epoch (restarted, or a primary that was frozen): the backup */
        if (b && b->replica && b->replica->epoch < pi->epoch &&
            (r = ps_client_set_role(pc, s, other, ROLE_BACKUP, pi->epoch, false, e, sizeof(e))) < 0)
                log_warning("Cannot make %s ps:%u's backup: %s", ps_client_addr(pc, s, other), s, e);
        if (p && p->replica && p->replica->role == ROLE_PRIMARY && p->replica->epoch == pi->epoch) {
                pthread_mutex_lock(&status->lock);
                pi->replicated = p->replica->replicating;
                pi->lag_us = p->replica->lag_us;
                pthread_mutex_unlock(&status->lock);
                /* it dropped its backup: recorded above (no promotion of that backup from now on), then
                 * it may answer writes again */
                if (p->replica->awaiting_chief) {
                        if ((r = ps_client_set_role(pc, s, cur, ROLE_PRIMARY, pi->epoch, true, e, sizeof(e))) < 0)
                                log_warning("Cannot tell ps:%u's primary that it runs unreplicated: %s", s, e);
                        else
                                log_warning("ps:%u: its primary %s dropped its backup %s: running unreplicated until "
                                            "the backup has caught up", s, ps_client_addr(pc, s, cur),
                                            ps_client_addr(pc, s, other));
                }
        }
out:
        cur = ps_client_primary(pc, s);
        int r0 = pr[cur];
        if (r0 < 0)
                chief_strfmt(err, errlen, "%s", why[cur]);
        else
                *ret = &st[cur]->base;
        for (uint32_t w = 0; w < 2; w++)
                if (st[w] && (r0 < 0 || w != cur))
                        psfleet__v1__shard_status__free_unpacked(st[w], NULL);
        return r0;
}

/* Asks every shard for its status and records it. Returns the number of shards reachable; *n_init gets
 * the number initialized; why gets the first failure. */
uint32_t chief_probe_shards(struct chief_status *status, struct ps_client *pc, uint32_t *n_init, char *why, size_t len) {
        uint32_t n_ok = 0, n_in = 0;
        why[0] = 0;
        for (uint32_t s = 0; s < status->cfg->cluster.n_ps; s++) {
                ProtobufCMessage *m = NULL;
                char e[512];
                int r = status->cfg->cluster.n_ps_backup ? manage_replicas(status, pc, s, &m, e, sizeof(e))
                                                          : ps_client_probe(pc, s, PROBE_TIMEOUT_MS, (void **)&m, e, sizeof(e));
                uint64_t t = mono_us();
                pthread_mutex_lock(&status->lock);
                struct ps_info *pi = &status->ps[s];
                if (r < 0) {
                        pi->reachable = false;
                        if (!pi->lost_since_mono)
                                pi->lost_since_mono = t;
                        chief_strfmt(pi->state, sizeof(pi->state), "unreachable: %s", e);
                        if (!why[0])
                                chief_strfmt(why, len, "%s", e);
                } else {
                        const Psfleet__V1__ShardStatus *st = (const Psfleet__V1__ShardStatus *)m;
                        char sync[256];
                        pi->reachable = true;
                        pi->lost_since_mono = 0;
                        pi->initialized = st->initialized;
                        pi->incarnation = st->incarnation;
                        pi->global_step = st->global_step;
                        pi->last_seen_us = now_us();
                        if (st->initialized)
                                chief_strfmt(pi->state, sizeof(pi->state),
                                         "initialized: %u variables, %" PRIu64 " bytes, %" PRIu64
                                         " pushes, %" PRIu64 " rejected, %" PRIu64 " clipped, %u shared-memory link(s)"
                                         "%s%s%s",
                                         st->variables, st->bytes, st->pushes, st->rejected, st->clipped,
                                         st->shared_memory_links, sync_state(status->cfg, st, sync, sizeof(sync)),
                                         st->waiting_for ? "; " : "", st->waiting_for ? st->waiting_for->last_error : "");
                        else
                                chief_strfmt(pi->state, sizeof(pi->state), "uninitialized");
                        if (status->cfg->cluster.n_ps_backup)
                                chief_metrics_replica(s, pi->epoch, pi->replicated, pi->lag_us, pi->failovers);
                        if (status->cfg->cluster.n_ps_backup)
                                chief_strfmt(pi->state + strlen(pi->state), sizeof(pi->state) - strlen(pi->state),
                                             "; primary %s (epoch %" PRIu64 "), backup %s %s, lag %" PRIu64 " us, %"
                                             PRIu64 " fail-over(s)",
                                             ps_client_addr(pc, s, pi->primary), pi->epoch,
                                             ps_client_addr(pc, s, !pi->primary),
                                             pi->replicated ? "in sync" : "not in sync (unreplicated)", pi->lag_us,
                                             pi->failovers);
                        n_ok++;
                        n_in += st->initialized;
                        protobuf_c_message_free_unpacked(m, NULL);
                }
                pthread_mutex_unlock(&status->lock);
        }
        *n_init = n_in;
        return n_ok;
}

/* A worker still computing? "training..." states are; "done", "waiting..." and anything else are not. */
static bool worker_busy(const char *state) {
        return strncmp(state, "training", 8) == 0 || strcmp(state, "joined") == 0;
}

uint32_t chief_probe_workers(struct chief_status *status, struct rpc_channel **worker_ch, int64_t *first_busy) {
        uint32_t busy = 0;
        *first_busy = -1;
        for (uint32_t w = 0; w < status->cfg->cluster.n_worker; w++) {
                pthread_mutex_lock(&status->lock);
                bool fin = status->workers[w].finished;
                pthread_mutex_unlock(&status->lock);
                if (fin)
                        continue;
                Psfleet__V1__WorkerStatusRequest q = PSFLEET__V1__WORKER_STATUS_REQUEST__INIT;
                ProtobufCMessage *m = NULL;
                char e[512];
                int r = probe_call(worker_ch[w], M_WORKER_STATUS, &q.base, &psfleet__v1__worker_status__descriptor,
                                   WORKER_TIMEOUT_MS, &m, e, sizeof(e));
                pthread_mutex_lock(&status->lock);
                struct worker_info *wi = &status->workers[w];
                if (r < 0) {
                        /* Gone (exited, or never started): nothing more will come from it. */
                        wi->finished = r != -ETIMEDOUT;
                        if (wi->finished && strcmp(wi->state, "done") != 0)
                                chief_strfmt(wi->state, sizeof(wi->state), "unreachable: %s", e);
                } else {
                        const Psfleet__V1__WorkerStatus *ws = (const Psfleet__V1__WorkerStatus *)m;
                        const char *st = ws->state ? ws->state : "";
                        wi->finished = !worker_busy(st);
                        chief_strfmt(wi->state, sizeof(wi->state), "%s", st);
                        protobuf_c_message_free_unpacked(m, NULL);
                }
                fin = wi->finished;
                pthread_mutex_unlock(&status->lock);
                if (!fin && busy++ == 0)
                        *first_busy = w;
        }
        return busy;
}

void chief_stop_workers(const struct job_config *cfg, struct rpc_channel **worker_ch) {
        for (uint32_t w = 0; w < cfg->cluster.n_worker; w++) {
                Psfleet__V1__StopRequest q = PSFLEET__V1__STOP_REQUEST__INIT;
                q.reason = (char *)"the job has ended";
                ProtobufCMessage *m = NULL;
                char e[512];
                if (probe_call(worker_ch[w], M_WORKER_STOP, &q.base, &psfleet__v1__stop_reply__descriptor,
                               WORKER_TIMEOUT_MS, &m, e, sizeof(e)) >= 0)
                        protobuf_c_message_free_unpacked(m, NULL);
        }
}
