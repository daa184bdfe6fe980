/* psd's embedding tables under ps.replicas 2, the backup's side (replica.h): a table's update from its
 * primary replayed — the rows the primary's table made and dropped (its journal), then the gradients
 * on the rows that exist, or an import — and the state transfer's pages of rows, sent and taken. The
 * primary's side (each write's journal, taken under the write) is in sparse_rpc.c. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "sparse_opts.h"
#include "util.h"
#include "wire.h"

#include "psd-internal.h"

#define TRANSFER_PAGE_ROWS 65536u

/* Events of a ReplicateUpdate (field) back, each checked (a kind, an id of this shard). 0 or -errno. */
static int journal_in(struct psd *p, const ProtobufCBinaryData *b, const char *field, struct sparse_event **ev,
                      size_t *n, char *err, size_t errlen) {
        *ev = NULL;
        *n = 0;
        if (b->len % 9 || b->len / 9 > 4 * (size_t)SPARSE_MAX_IDS)
                return errf(err, errlen, -EINVAL, "%s: %zu bytes, not a multiple of 9 (id, kind) or too many", field,
                            b->len);
        size_t k = b->len / 9;
        if (!k)
                return 0;
        struct sparse_event *v = malloc(k * sizeof(*v));
        if (!v)
                return errf(err, errlen, -ENOMEM, "out of memory");
        for (size_t i = 0; i < k; i++) {
                memcpy(&v[i].id, b->data + 9 * i, 8);
                v[i].kind = b->data[9 * i + 8];
                if ((v[i].kind != SPARSE_MADE && v[i].kind != SPARSE_DROPPED) ||
                    sparse_shard_of(v[i].id, p->cfg->cluster.n_ps) != p->shard) {
                        free(v);
                        return errf(err, errlen, -EINVAL, "%s[%zu]: kind %u of id %" PRIu64 " (1 made, 2 dropped, of "
                                    "ps:%u's ids)", field, i, v[i].kind, v[i].id, p->shard);
                }
        }
        *ev = v;
        *n = k;
        return 0;
}

/* A backup's own journal (its replays note events too), forgotten. */
static void journal_forget(struct psd_table *pt) {
        struct sparse_event *ev;
        size_t n;
        if (sparse_table_journal_take(pt->t, &ev, &n) == 0)
                free(ev);
}

/* ---- ps.replicas 2: the backup's side, and the state transfer's rows ---- */

void sparse_tables_clear(struct psd *p) {
        for (uint32_t e = 0; e < p->n_tables; e++)
                sparse_table_clear(p->tables[e].t);
}

/* Tensor k of a table's update: an exchange's "grads"; an import's "rows", then its slots by name. */
static const char *update_tensor(const struct psd *p, bool import, unsigned k) {
        return !import ? "grads" : k ? sparse_optimizer_slot_name(p->cfg->training.sparse_optimizer, k - 1) : "rows";
}

uint32_t sparse_update_out(struct psd *p, struct wire_out *o, Psfleet__V1__ReplicateUpdate *m,
                           const struct replica_sparse *sp) {
        const struct psd_table *pt = &p->tables[sp->table];
        size_t dim = sparse_table_dim(pt->t), n = sp->n_ids;
        m->table = sp->table + 1;
        m->import = sp->import;
        m->clear = sp->clear;
        m->ids = (ProtobufCBinaryData){n * sizeof(uint64_t), (uint8_t *)sp->ids};
        m->pull_ids = (ProtobufCBinaryData){sp->n_ids2 * sizeof(uint64_t), (uint8_t *)sp->ids2};
        m->lr = sp->lr;
        m->step = sp->step;
        m->events = (ProtobufCBinaryData){sp->ev_len, sp->ev};
        m->events_after = (ProtobufCBinaryData){sp->ev2_len, sp->ev2};
        unsigned nt = !n ? 0 : sp->import ? 1 + pt->n_slots : 1;
        uint64_t shape[2] = {n, dim};
        for (unsigned k = 0; k < nt; k++)
                wire_out_tensor_copy(o, update_tensor(p, sp->import, k), WIRE_DTYPE_FLOAT32, shape, 2, 0,
                                     sp->vals + k * n * dim, n * dim * sizeof(float));
        return nt;
}

static int cmp_id(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

/* An import replayed: the primary's own import, then the rows its bound dropped meanwhile (ev, of which
 * the dropped ones count). The backup's bound must not have dropped any of its own, and none the
 * primary dropped may be of the page (the order within it is not replayed): else -EDOM, and the
 * primary brings its backup in again by a state transfer. */
static int import_replay(struct psd_table *pt, const Psfleet__V1__ReplicateUpdate *u, uint64_t *ids, size_t n,
                         const uint64_t *evicted, size_t n_evicted, const float *vals, struct sparse_event *ev,
                         size_t n_ev) {
        struct sparse_table_stats before, after;
        sparse_table_get_stats(pt->t, &before);
        uint64_t dropped;
        if (sparse_import_apply(pt, u->clear, evicted, n_evicted, ids, n, vals, u->step, &dropped) < 0)
                return -ENOMEM;
        qsort(ids, n, sizeof(*ids), cmp_id);
        size_t k = 0;
        for (size_t i = 0; i < n_ev; i++)
                if (ev[i].kind == SPARSE_DROPPED) {
                        if (bsearch(&ev[i].id, ids, n, sizeof(*ids), cmp_id))
                                return -EDOM;
                        ev[k++] = ev[i];
                }
        int r = sparse_table_replay(pt->t, ev, k, u->step);
        sparse_table_get_stats(pt->t, &after);
        return r < 0 ? r : after.evicted_limit != before.evicted_limit ? -EDOM : 0;
}

int sparse_replay(struct psd *p, const Psfleet__V1__ReplicateUpdate *u, const struct wire_in *in, size_t at,
                  char *err, size_t errlen) {
        uint32_t e = u->table - 1;
        uint64_t *ids = NULL, *ids2 = NULL;
        float *vals = NULL;
        struct sparse_event *ev = NULL, *ev2 = NULL;
        size_t n = 0, n2 = 0, n_ev = 0, n_ev2 = 0;
        int r;
        if ((r = sparse_check_table(p, e, err, errlen)) < 0 ||
            (r = sparse_take_ids(p, &u->ids, "ids", &ids, &n, err, errlen)) < 0 ||
            (r = sparse_check_unique(ids, n, "ids", err, errlen)) < 0 ||
            (r = sparse_take_ids(p, &u->pull_ids, "pull_ids", &ids2, &n2, err, errlen)) < 0 ||
            (r = journal_in(p, &u->events, "events", &ev, &n_ev, err, errlen)) < 0 ||
            (r = journal_in(p, &u->events_after, "events_after", &ev2, &n_ev2, err, errlen)) < 0)
                goto out;
        struct psd_table *pt = &p->tables[e];
        uint32_t dim = sparse_table_dim(pt->t);
        unsigned nt = !n ? 0 : u->import ? 1 + pt->n_slots : 1;
        if (u->n_tensors != nt || at + nt > in->n_tensors || n * dim * (1 + pt->n_slots) > SPARSE_MAX_FLOATS) {
                r = errf(err, errlen, -EINVAL, "table %u's update of %zu rows: %u tensors, %u expected (or too large)", e,
                         n, u->n_tensors, nt);
                goto out;
        }
        struct wire_in mine = *in;   /* its own tensors, by name */
        mine.tensors = in->tensors + at;
        mine.n_tensors = nt;
        if (!(vals = malloc(n * dim * (nt ? nt : 1) * sizeof(float) + sizeof(float)))) {
                r = errf(err, errlen, -ENOMEM, "out of memory");
                goto out;
        }
        for (unsigned k = 0; k < nt && r >= 0; k++)
                r = sparse_take_rows(&mine, update_tensor(p, u->import, k), n, dim, vals + (size_t)k * n * dim, err, errlen);
        if (r < 0)
                goto out;
        if (u->import) {
                r = import_replay(pt, u, ids, n, ids2, n2, vals, ev, n_ev);
        } else {
                /* the rows the push made and dropped, its gradients on the rows that exist, the pull's rows */
                uint64_t seen = atomic_load(&p->sparse_step);
                while (u->step > seen && !atomic_compare_exchange_weak(&p->sparse_step, &seen, u->step))
                        ;
                r = sparse_table_replay(pt->t, ev, n_ev, u->step);
                if (r == 0 && n)
                        r = sparse_table_push_existing(pt->t, ids, n, vals, u->lr, u->step);
                if (r == 0)
                        r = sparse_table_replay(pt->t, ev2, n_ev2, u->step);
        }
        journal_forget(pt);
        if (r == -EDOM)
                r = errf(err, errlen, r, "table \"%s\": the backup's bound dropped other rows than the primary's: it "
                         "needs a state transfer", pt->spec->name);
        else if (r < 0)
                r = errf(err, errlen, -ENOMEM, "out of memory");
out:
        free(ids);
        free(ids2);
        free(vals);
        free(ev);
        free(ev2);
        return r;
}

int sparse_transfer(struct psd *p, replica_page_fn send_page, void *ud, char *why, size_t len) {
        for (uint32_t e = 0; e < p->n_tables; e++) {
                struct psd_table *pt = &p->tables[e];
                size_t dim = sparse_table_dim(pt->t), per_row = dim * (1 + pt->n_slots);
                size_t page = SPARSE_MAX_FLOATS / per_row < TRANSFER_PAGE_ROWS ? SPARSE_MAX_FLOATS / per_row : TRANSFER_PAGE_ROWS;
                uint64_t *ids = malloc(page * sizeof(*ids));
                float *vals = malloc(page * per_row * sizeof(float));
                float *slots = malloc(page * dim * (pt->n_slots ? pt->n_slots : 1) * sizeof(float));
                uint64_t cursor = 0, step = atomic_load(&p->sparse_step);
                int r = ids && vals && slots ? 0 : errf(why, len, -ENOMEM, "out of memory");
                for (size_t got; r == 0 && (got = sparse_table_export(pt->t, &cursor, page, ids, vals, slots)) > 0;) {
                        /* rows then slots slot-major, as an import takes them: the slots were written for
                         * page rows each */
                        for (unsigned k = 0; k < pt->n_slots; k++)
                                memmove(vals + (1 + k) * got * dim, slots + k * page * dim, got * dim * sizeof(float));
                        struct replica_sparse sp = {.table = e, .import = true, .ids = ids, .n_ids = got, .vals = vals,
                                                    .n_vals = got * per_row, .step = step};
                        Psfleet__V1__ReplicateUpdate u = PSFLEET__V1__REPLICATE_UPDATE__INIT;
                        struct wire_out *o = NULL;
                        if (wire_out_new(&o) < 0) {
                                r = errf(why, len, -ENOMEM, "out of memory");
                                break;
                        }
                        u.n_tensors = sparse_update_out(p, o, &u, &sp);
                        r = send_page(ud, o, &u, why, len);
                        wire_out_free(o);
                }
                free(ids);
                free(vals);
                free(slots);
                if (r < 0)
                        return r;
        }
        return 0;
}
