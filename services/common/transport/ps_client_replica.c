/* ps.replicas 2, the clients' side: which of a shard's two psds is its primary. The chief decides
 * (SetRole, with an epoch) and every client follows what the psds say of themselves: after a failed
 * call a client asks both and talks to the initialized primary of the newest epoch. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "ps_client-internal.h"
#include "util.h"

#define FIND_TIMEOUT_MS 300

uint32_t ps_client_primary(const struct ps_client *pc, uint32_t shard) {
        return pc->shard[shard].cur;
}

void ps_client_use(struct ps_client *pc, uint32_t shard, uint32_t which) {
        struct ps_shard *sh = &pc->shard[shard];
        if (which == sh->cur)
                return;
        ps_client_link_down(pc, shard);
        struct rpc_channel *t = sh->ch;
        sh->ch = sh->alt;
        sh->alt = t;
        sh->cur = which;
        if (!sh->ch) {
                char name[32];
                snprintf(name, sizeof(name), "ps:%u", shard);
                if (rpc_channel_new(ps_client_addr(pc, shard, which), name, &sh->ch) < 0) {
                        /* keep the old one: the next failure tries again */
                        sh->ch = sh->alt;
                        sh->alt = NULL;
                        sh->cur = !which;
                }
        }
}

int ps_client_set_role(struct ps_client *pc, uint32_t shard, uint32_t which, int role, uint64_t epoch,
                       bool unreplicated_ok, char *err, size_t errlen) {
        void *st;
        struct ps_shard *sh = &pc->shard[shard];
        /* the probe makes the channel when there is none yet */
        int r = ps_client_probe_psd(pc, shard, which, FIND_TIMEOUT_MS, &st, err, errlen);
        if (r < 0)
                return r;
        psfleet__v1__shard_status__free_unpacked(st, NULL);
        Psfleet__V1__SetRoleRequest q = PSFLEET__V1__SET_ROLE_REQUEST__INIT;
        Psfleet__V1__Caller c;
        ps_client_caller_init(pc, &c);
        q.caller = &c;
        q.role = (Psfleet__V1__ReplicaRole)role;
        q.epoch = epoch;
        q.unreplicated_ok = unreplicated_ok;
        ProtobufCMessage *m;
        r = rpc_call_msg(which == sh->cur ? sh->ch : sh->alt, "/psfleet.v1.ParameterServer/SetRole", &q.base,
                         &psfleet__v1__set_role_reply__descriptor, pc->deadline_ms < 2000 ? pc->deadline_ms : 2000,
                         false, &m, err, errlen);
        if (r >= 0)
                protobuf_c_message_free_unpacked(m, NULL);
        return r;
}

bool ps_client_find_primary(struct ps_client *pc, uint32_t shard) {
        if (!pc->cfg->cluster.n_ps_backup)
                return false;
        int best = -1;
        uint64_t best_epoch = 0;
        for (uint32_t which = 0; which < 2; which++) {
                void *m;
                char e[300];
                if (ps_client_probe_psd(pc, shard, which, FIND_TIMEOUT_MS, &m, e, sizeof(e)) < 0)
                        continue;
                const Psfleet__V1__ShardStatus *st = m;
                if (st->initialized && st->replica && st->replica->role == PSFLEET__V1__REPLICA_ROLE__REPLICA_ROLE_PRIMARY &&
                    (best < 0 || st->replica->epoch > best_epoch)) {
                        best = (int)which;
                        best_epoch = st->replica->epoch;
                }
                psfleet__v1__shard_status__free_unpacked(m, NULL);
        }
        if (best < 0 || (uint32_t)best == pc->shard[shard].cur)
                return false;
        log_notice("ps:%u: its primary is now %s (epoch %llu); switching to it", shard,
                   ps_client_addr(pc, shard, (uint32_t)best), (unsigned long long)best_epoch);
        ps_client_use(pc, shard, (uint32_t)best);
        return true;
}
