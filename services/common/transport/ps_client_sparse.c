/* The ps client's embedding tables (docs/sparse.md): a worker's exchange of rows and their gradients
 * with every shard holding any of a batch's ids, in parallel, and the chief's export and import of
 * whole tables for checkpoints. Ids travel as packed little-endian uint64 bytes. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_client.h"
#include "ps_client-internal.h"
#include "sparse_opts.h"
#include "sparse_table.h"
#include "util.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ids travel as they lie in memory");
_Static_assert(SPARSE_MAX_SLOTS == 2, "struct ps_sparse_rows' slots");

#define EXCHANGE "/psfleet.v1.ParameterServer/SparseExchange"
#define EXPORT "/psfleet.v1.ParameterServer/SparseExport"
#define IMPORT "/psfleet.v1.ParameterServer/SparseImport"

void ps_client_sparse_split(const uint64_t *ids, size_t n, uint32_t n_shards, size_t *order, size_t *first) {
        memset(first, 0, (n_shards + 1) * sizeof(*first));
        for (size_t i = 0; i < n; i++)
                first[sparse_shard_of(ids[i], n_shards) + 1]++;
        for (uint32_t s = 0; s < n_shards; s++)
                first[s + 1] += first[s];
        /* a counting sort: stable, so each shard's ids keep the caller's order */
        size_t *at = malloc((n_shards + 1) * sizeof(*at));
        if (at) {
                memcpy(at, first, (n_shards + 1) * sizeof(*at));
                for (size_t i = 0; i < n; i++)
                        order[at[sparse_shard_of(ids[i], n_shards)]++] = i;
                free(at);
        } else {
                for (uint32_t s = 0, k = 0; s < n_shards; s++)
                        for (size_t i = 0; i < n; i++)
                                if (sparse_shard_of(ids[i], n_shards) == s)
                                        order[k++] = i;
        }
}

/* One exchange's side of a list of ids: split by shard, gathered shard after shard. */
struct split {
        size_t *order, *first;
        uint64_t *ids;          /* ids[order[k]] at k */
};

static void split_free(struct split *sp) {
        free(sp->order);
        free(sp->first);
        free(sp->ids);
}

static int split_ids(const uint64_t *ids, size_t n, uint32_t n_shards, struct split *sp) {
        sp->order = malloc((n ? n : 1) * sizeof(*sp->order));
        sp->first = malloc((n_shards + 1) * sizeof(*sp->first));
        sp->ids = malloc((n ? n : 1) * sizeof(*sp->ids));
        if (!sp->order || !sp->first || !sp->ids)
                return -ENOMEM;
        ps_client_sparse_split(ids, n, n_shards, sp->order, sp->first);
        for (size_t k = 0; k < n; k++)
                sp->ids[k] = ids[sp->order[k]];
        return 0;
}

static ProtobufCBinaryData id_bytes(const struct split *sp, uint32_t s) {
        return (ProtobufCBinaryData){(sp->first[s + 1] - sp->first[s]) * sizeof(uint64_t),
                                     (uint8_t *)(sp->ids + sp->first[s])};
}

/* A reply's tensor `name`: float32 (n, dim). */
static const struct wire_tensor *reply_rows(const struct wire_in *in, const char *name, size_t n, uint32_t dim) {
        for (size_t i = 0; i < in->n_tensors; i++) {
                const struct wire_tensor *t = &in->tensors[i];
                if (strcmp(t->name, name) == 0)
                        return t->dtype == WIRE_DTYPE_FLOAT32 && t->ndims == 2 && t->shape[0] == n && t->shape[1] == dim
                                       ? t
                                       : NULL;
        }
        return NULL;
}

/* What an exchange's shards are sent: the ids split by shard, the gradients in that order. */
struct exchange {
        const struct model_spec *m;
        uint32_t e, dim;
        bool create;
        uint64_t global_step;
        struct split ps, pl;
        float *g;               /* (n_push, dim) */
        char *err;
        size_t errlen;
};

/* Shard s's SparseExchange: its ids to push (with their gradients) and to pull; none: left out. */
static int exchange_build(struct ps_client *pc, uint32_t s, Psfleet__V1__Caller *caller, void *ud,
                          grpc_byte_buffer **bb) {
        struct exchange *x = ud;
        uint32_t dim = x->dim;
        size_t np = x->ps.first[s + 1] - x->ps.first[s], nl = x->pl.first[s + 1] - x->pl.first[s];
        if (!np && !nl)
                return 1;
        if ((np > nl ? np : nl) * dim > SPARSE_MAX_FLOATS)
                return errf(x->err, x->errlen, -E2BIG, "table %s: %zu rows of ps:%u in one step, more than a message "
                            "carries (%u floats)", x->m->emb[x->e].name, np > nl ? np : nl, s, SPARSE_MAX_FLOATS);
        Psfleet__V1__SparseExchangeHeader h = PSFLEET__V1__SPARSE_EXCHANGE_HEADER__INIT;
        h.caller = caller;
        h.worker = pc->worker;
        h.table = x->e;
        h.incarnation = pc->shard[s].sparse_inc;
        h.global_step = x->global_step;
        h.create = x->create;
        h.push_ids = id_bytes(&x->ps, s);
        h.pull_ids = id_bytes(&x->pl, s);
        struct wire_out *o;
        int r = wire_out_new(&o);
        if (r < 0)
                return r;
        wire_out_header(o, &h.base);
        if (np)   /* g outlives the call: the batch is waited for before it is freed */
                r = wire_out_tensor(o, "grads", WIRE_DTYPE_FLOAT32, (uint64_t[]){np, dim}, 2, 0,
                                    x->g + x->ps.first[s] * dim, np * dim * sizeof(float), NULL, NULL);
        if (r >= 0)
                r = wire_out_finish(o, bb);
        wire_out_free(o);
        atomic_fetch_add(&pc->sparse_sent, (np + nl) * sizeof(uint64_t) + np * dim * sizeof(float));
        return r;
}

static int exchange(struct ps_client *pc, uint32_t e, const uint64_t *push_ids, size_t n_push, const float *push_grads,
                    const uint64_t *pull_ids, size_t n_pull, float *pull_rows, bool create, char *err, size_t errlen) {
        const struct model_spec *m = &pc->cfg->model;
        if (e >= m->n_embeddings)
                return errf(err, errlen, -EINVAL, "table %u: the model has %u embedding table(s)", e, m->n_embeddings);
        uint32_t dim = m->emb[e].dim, N = pc->L->n_shards;
        struct exchange x = {.m = m, .e = e, .dim = dim, .create = create, .err = err, .errlen = errlen};
        struct split *ps = &x.ps, *pl = &x.pl;
        struct rpc_batch *b = NULL;
        struct rpc_pending **pend = calloc(N, sizeof(*pend));
        int r = pend ? 0 : -ENOMEM;
        if (r >= 0 && (r = split_ids(push_ids, n_push, N, ps)) >= 0 && (r = split_ids(pull_ids, n_pull, N, pl)) >= 0)
                r = (x.g = malloc((n_push ? n_push : 1) * dim * sizeof(float))) ? 0 : -ENOMEM;
        if (r < 0) {
                errf(err, errlen, r, "table %s: out of memory", m->emb[e].name);
                goto out;
        }
        for (size_t k = 0; k < n_push; k++)
                memcpy(x.g + k * dim, push_grads + ps->order[k] * dim, dim * sizeof(float));
        x.global_step = ps_client_global_step(pc, NULL);
        if ((r = rpc_batch_new(&b)) < 0)
                goto out;
        r = ps_client_fan_out(pc, b, EXCHANGE, false, exchange_build, &x, pend);
        if (r < 0) {
                if (!*err)
                        errf(err, errlen, r, "table %s: %s", m->emb[e].name, strerror(-r));
                goto out;
        }
        rpc_batch_wait_all(b);
        for (uint32_t s = 0; s < N; s++) {
                if (!pend[s])
                        continue;
                struct rpc_result *res = rpc_pending_result(pend[s]);
                size_t nl = pl->first[s + 1] - pl->first[s];
                if (res->err) {
                        /* a shard that restarted refuses rows pulled from its former self once */
                        if (res->err == -EPERM)
                                pc->shard[s].sparse_inc = 0;
                        if (r >= 0)
                                r = errf(err, errlen, res->err, "%s", res->message);
                        continue;
                }
                struct wire_in *in;
                ProtobufCMessage *hm = NULL;
                char e2[256];
                int q = wire_in_parse(res->reply, &in, e2, sizeof(e2));
                res->reply = NULL;
                if (q >= 0 && (q = wire_in_header(in, &psfleet__v1__sparse_exchange_reply_header__descriptor, &hm)) >= 0)
                        pc->shard[s].sparse_inc = ((Psfleet__V1__SparseExchangeReplyHeader *)hm)->incarnation;
                const struct wire_tensor *t = q >= 0 && nl ? reply_rows(in, "rows", nl, dim) : NULL;
                if (q >= 0 && nl && !t)
                        q = errf(e2, sizeof(e2), -EPROTO, "no float32 tensor \"rows\" of (%zu, %u)", nl, dim);
                if (q < 0 && r >= 0)
                        r = errf(err, errlen, q, "ps:%u: SparseExchange reply: %s", s, e2);
                if (t) {
                        /* the rows go back to the caller's order, one at a time out of gRPC's slices */
                        struct wire_reader rd;
                        wire_reader_init(&rd, t);
                        for (size_t k = pl->first[s]; k < pl->first[s + 1]; k++)
                                wire_reader_read(&rd, pull_rows + pl->order[k] * dim, dim * sizeof(float));
                        atomic_fetch_add(&pc->sparse_received, nl * dim * sizeof(float));
                }
                if (hm)
                        protobuf_c_message_free_unpacked(hm, NULL);
                wire_in_free(in);
        }
out:
        rpc_batch_free(b);
        free(pend);
        free(x.g);
        split_free(ps);
        split_free(pl);
        return r;
}

int ps_client_sparse(struct ps_client *pc, uint32_t e, const uint64_t *push_ids, size_t n_push,
                     const float *push_grads, const uint64_t *pull_ids, size_t n_pull, float *pull_rows, char *err,
                     size_t errlen) {
        if (errlen)
                *err = 0;
        return exchange(pc, e, push_ids, n_push, push_grads, pull_ids, n_pull, pull_rows, true, err, errlen);
}

int ps_client_sparse_lookup(struct ps_client *pc, uint32_t e, const uint64_t *ids, size_t n, float *rows, char *err,
                            size_t errlen) {
        if (errlen)
                *err = 0;
        return exchange(pc, e, NULL, 0, NULL, ids, n, rows, false, err, errlen);
}

void ps_client_sparse_bytes(const struct ps_client *pc, uint64_t *sent_ret, uint64_t *received_ret) {
        if (sent_ret)
                *sent_ret = atomic_load(&pc->sparse_sent);
        if (received_ret)
                *received_ret = atomic_load(&pc->sparse_received);
}

/* ---- the chief's export and import ---- */

void ps_sparse_rows_clear(struct ps_sparse_rows *r) {
        if (!r)
                return;
        free(r->ids);
        free(r->values);
        for (unsigned s = 0; s < SPARSE_MAX_SLOTS; s++)
                free(r->slots[s]);
        memset(r, 0, sizeof(*r));
}

/* Makes out's arrays (*cap rows) hold want rows. 0 or -ENOMEM. */
static int rows_reserve(struct ps_sparse_rows *out, size_t *cap, size_t want) {
        if (want <= *cap)
                return 0;
        size_t c = *cap;
        int r = grow_array((void **)&out->ids, &c, want, sizeof(uint64_t), 4096);
        for (unsigned s = 0; s <= out->n_slots && r >= 0; s++) {
                float **a = s ? &out->slots[s - 1] : &out->values;
                float *grown = realloc(*a, c * out->dim * sizeof(float));
                r = grown ? 0 : -ENOMEM;
                if (grown)
                        *a = grown;
        }
        if (r >= 0)
                *cap = c;
        return r;
}

/* Appends one SparseExport page (parsed reply in) to out. */
static int append_page(struct ps_sparse_rows *out, size_t *cap, const struct wire_in *in,
                       const Psfleet__V1__SparseExportReplyHeader *h, char *err, size_t errlen) {
        size_t n = h->ids.len / sizeof(uint64_t), dim = out->dim;
        if (h->ids.len % sizeof(uint64_t) || h->dim != out->dim || h->n_slots != out->n_slots)
                return errf(err, errlen, -EPROTO, "a page of %zu id bytes, dim %u and %zu slot(s); expected dim %u and "
                            "%u slot(s)", h->ids.len, h->dim, h->n_slots, out->dim, out->n_slots);
        const struct wire_tensor *t[1 + SPARSE_MAX_SLOTS];
        for (unsigned s = 0; s <= out->n_slots; s++)
                if (!(t[s] = reply_rows(in, s ? h->slots[s - 1] : "rows", n, out->dim)))
                        return errf(err, errlen, -EPROTO, "no float32 tensor \"%s\" of (%zu, %u)",
                                    s ? h->slots[s - 1] : "rows", n, out->dim);
        if (n == 0)   /* a page of evicted ids, or the last: no rows (and maybe no arrays yet) */
                return 0;
        if (rows_reserve(out, cap, out->n + n) < 0)
                return errf(err, errlen, -ENOMEM, "out of memory for %zu rows", out->n + n);
        if (n)   /* an empty page: out->ids may still be NULL, which memcpy may not be given */
                memcpy(out->ids + out->n, h->ids.data, n * sizeof(uint64_t));
        for (unsigned s = 0; s <= out->n_slots; s++)
                wire_tensor_copy_f32(t[s], (s ? out->slots[s - 1] : out->values) + out->n * dim);
        out->n += n;
        return 0;
}

/* Where an export of table e stands: each shard's next page, and whether it has sent its last. */
struct export {
        uint32_t e;
        const struct ps_sparse_export_opts *o;
        const uint64_t *cursor;         /* (n_shards) */
        const bool *done;               /* (n_shards) */
        const uint64_t *evicted;        /* (n_shards) the evicted ids had so far */
};

/* Shard s's next SparseExport page; none once it is done. */
static int export_build(struct ps_client *pc, uint32_t s, Psfleet__V1__Caller *caller, void *ud,
                        grpc_byte_buffer **bb) {
        (void)pc;
        const struct export *x = ud;
        if (x->done[s])
                return 1;
        Psfleet__V1__SparseExportHeader h = PSFLEET__V1__SPARSE_EXPORT_HEADER__INIT;
        h.caller = caller;
        h.table = x->e;
        h.cursor = x->cursor[s];
        h.max_rows = x->o->max_rows;
        h.dirty_only = x->o->dirty_only;
        h.clean = x->o->clean;
        h.take_evicted = x->o->take_evicted;
        h.evicted_from = x->evicted[s];
        Psfleet__V1__SparseExportRequest q = PSFLEET__V1__SPARSE_EXPORT_REQUEST__INIT;
        q.header = &h;
        *bb = wire_pack(&q.base);
        return 0;
}

/* One shard's page (parsed reply in) as a ps_sparse_rows into page (whose arrays grow to hold it). */
static int page_of(struct ps_sparse_rows *page, size_t *cap, const struct wire_in *in,
                   const Psfleet__V1__SparseExportReplyHeader *h, char *err, size_t errlen) {
        page->n = 0;
        return append_page(page, cap, in, h, err, errlen);
}

int ps_client_sparse_export_pages(struct ps_client *pc, uint32_t e, const struct ps_sparse_export_opts *o,
                                  ps_sparse_page_fn fn, void *ud, char *err, size_t errlen) {
        const struct model_spec *m = &pc->cfg->model;
        if (e >= m->n_embeddings)
                return errf(err, errlen, -EINVAL, "table %u: the model has %u embedding table(s)", e, m->n_embeddings);
        static const struct ps_sparse_export_opts none = {0};
        if (!o)
                o = &none;
        uint32_t N = pc->L->n_shards;
        struct ps_sparse_rows page = {.dim = m->emb[e].dim,
                                      .n_slots = sparse_optimizer_n_slots(pc->cfg->training.sparse_optimizer)};
        uint64_t *cursor = calloc(N, sizeof(*cursor)), *evicted = calloc(N, sizeof(*evicted));
        bool *done = calloc(N, sizeof(*done));
        struct rpc_pending **pend = calloc(N, sizeof(*pend));
        struct export x = {e, o, cursor, done, evicted};
        size_t cap = 0;
        int r = cursor && evicted && done && pend ? 0 : errf(err, errlen, -ENOMEM, "out of memory");
        /* one page of every shard not done yet at a time, all in parallel; each handed over before the next
         * round, so that no more than one page per shard is held */
        for (bool more = true; more && r >= 0;) {
                struct rpc_batch *b;
                if ((r = rpc_batch_new(&b)) < 0)
                        break;
                r = ps_client_fan_out(pc, b, EXPORT, false, export_build, &x, pend);
                if (r >= 0)
                        rpc_batch_wait_all(b);
                more = false;
                for (uint32_t s = 0; s < N && r >= 0; s++) {
                        if (!pend[s])
                                continue;
                        struct rpc_result *res = rpc_pending_result(pend[s]);
                        if (res->err) {
                                r = errf(err, errlen, res->err, "table %s: %s", m->emb[e].name, res->message);
                                break;
                        }
                        struct wire_in *in;
                        ProtobufCMessage *hm = NULL;
                        char e2[300];
                        r = wire_in_parse(res->reply, &in, e2, sizeof(e2));
                        res->reply = NULL;
                        if (r >= 0 && (r = wire_in_header(in, &psfleet__v1__sparse_export_reply_header__descriptor,
                                                          &hm)) < 0)
                                snprintf(e2, sizeof(e2), "the header does not parse");
                        if (r >= 0) {
                                const Psfleet__V1__SparseExportReplyHeader *h =
                                        (const Psfleet__V1__SparseExportReplyHeader *)hm;
                                struct ps_sparse_page pg = {.shard = s, .rows = &page};
                                r = page_of(&page, &cap, in, h, e2, sizeof(e2));
                                if (r >= 0 && o->take_evicted) {
                                        /* the pages after the rows carry the evicted ids, the last is done */
                                        if (h->evicted.len % sizeof(uint64_t))
                                                r = errf(e2, sizeof(e2), -EPROTO, "%zu bytes of evicted ids",
                                                         h->evicted.len);
                                        pg.n_evicted = h->evicted.len / sizeof(uint64_t);
                                        pg.changes_lost = h->changes_lost;
                                        pg.last = h->done;
                                        evicted[s] += pg.n_evicted;
                                }
                                uint64_t *ev = NULL;
                                if (r >= 0 && pg.n_evicted) {
                                        ev = malloc(pg.n_evicted * sizeof(*ev));
                                        r = ev ? 0 : errf(e2, sizeof(e2), -ENOMEM, "out of memory");
                                        if (ev)
                                                memcpy(ev, h->evicted.data, pg.n_evicted * sizeof(*ev));
                                        pg.evicted = ev;
                                }
                                if (r >= 0 && (page.n || pg.n_evicted || pg.last)) {
                                        r = fn(&pg, ud, e2, sizeof(e2));
                                }
                                free(ev);
                                done[s] = h->done;
                                cursor[s] = h->next_cursor;
                                more |= !h->done;
                        }
                        if (r < 0)
                                errf(err, errlen, r, "ps:%u: SparseExport of table %s: %s", s, m->emb[e].name, e2);
                        if (hm)
                                protobuf_c_message_free_unpacked(hm, NULL);
                        wire_in_free(in);
                }
                rpc_batch_free(b);
        }
        free(cursor);
        free(evicted);
        free(done);
        free(pend);
        ps_sparse_rows_clear(&page);
        return r;
}

/* Appends each page to the caller's rows. */
static int collect_page(const struct ps_sparse_page *pg, void *ud, char *err, size_t errlen) {
        struct { struct ps_sparse_rows *out; size_t cap; } *c = ud;
        struct ps_sparse_rows *out = c->out;
        const struct ps_sparse_rows *p = pg->rows;
        size_t n = p->n, dim = out->dim;
        if (rows_reserve(out, &c->cap, out->n + n) < 0)
                return errf(err, errlen, -ENOMEM, "out of memory for %zu rows", out->n + n);
        memcpy(out->ids + out->n, p->ids, n * sizeof(uint64_t));
        for (unsigned s = 0; s <= out->n_slots; s++)
                memcpy((s ? out->slots[s - 1] : out->values) + out->n * dim, s ? p->slots[s - 1] : p->values,
                       n * dim * sizeof(float));
        out->n += n;
        return 0;
}

int ps_client_sparse_export(struct ps_client *pc, uint32_t e, struct ps_sparse_rows *out, char *err, size_t errlen) {
        memset(out, 0, sizeof(*out));
        if (e < pc->cfg->model.n_embeddings) {
                out->dim = pc->cfg->model.emb[e].dim;
                out->n_slots = sparse_optimizer_n_slots(pc->cfg->training.sparse_optimizer);
        }
        struct { struct ps_sparse_rows *out; size_t cap; } c = {out, 0};
        int r = ps_client_sparse_export_pages(pc, e, NULL, collect_page, &c, err, errlen);
        if (r < 0)
                ps_sparse_rows_clear(out);
        return r;
}

/* One round of an import: page `round` (at `at`, of up to `page` rows) of every shard's rows; round 0
 * also carries each shard's part of the evicted ids. */
struct import {
        const bool *which;
        uint32_t e;
        const struct ps_sparse_rows *rows;
        const struct ps_sparse_import_opts *o;
        const struct split *sp, *ev;
        size_t at, round, page;
        uint64_t global_step;
        bool any;               /* a shard had a page this round */
};

/* Shard s's SparseImport of this round's page of its rows (the table emptied first in round 0 with
 * clear, its evicted ids dropped); none when the shard is not one to import into, or has nothing left. */
static int import_build(struct ps_client *pc, uint32_t s, Psfleet__V1__Caller *caller, void *ud,
                        grpc_byte_buffer **bb) {
        struct import *x = ud;
        const struct ps_sparse_rows *rows = x->rows;
        size_t have = x->sp->first[s + 1] - x->sp->first[s], n_ev = x->ev->first[s + 1] - x->ev->first[s];
        if ((x->which && !x->which[s]) || (x->round && x->at >= have) ||
            (!x->round && !have && !n_ev && !x->o->clear))
                return 1;
        x->any = true;
        size_t n = x->at < have ? (have - x->at < x->page ? have - x->at : x->page) : 0, dim = rows->dim;
        const size_t *idx = x->sp->order + x->sp->first[s] + x->at;
        if (x->round)
                n_ev = 0;
        uint64_t *ids = malloc((n + n_ev + 1) * sizeof(*ids)), *ev = ids + n;
        float *vals = malloc((n ? n : 1) * dim * (1 + rows->n_slots) * sizeof(float));
        int r = ids && vals ? 0 : -ENOMEM;
        struct wire_out *o = NULL;
        if (r >= 0)
                r = wire_out_new(&o);
        if (r < 0)
                goto out;
        for (size_t k = 0; k < n; k++) {
                ids[k] = rows->ids[idx[k]];
                for (unsigned sl = 0; sl <= rows->n_slots; sl++)
                        memcpy(vals + (sl * n + k) * dim, (sl ? rows->slots[sl - 1] : rows->values) + idx[k] * dim,
                               dim * sizeof(float));
        }
        for (size_t k = 0; k < n_ev; k++)
                ev[k] = x->o->evicted[x->ev->order[x->ev->first[s] + k]];
        Psfleet__V1__SparseImportHeader h = PSFLEET__V1__SPARSE_IMPORT_HEADER__INIT;
        h.caller = caller;
        h.table = x->e;
        h.ids = (ProtobufCBinaryData){n * sizeof(uint64_t), (uint8_t *)ids};
        h.evicted = (ProtobufCBinaryData){n_ev * sizeof(uint64_t), (uint8_t *)ev};
        h.global_step = x->global_step;
        h.clear = x->round == 0 && x->o->clear;
        wire_out_header(o, &h.base);
        const char *so[SPARSE_MAX_SLOTS];
        for (unsigned sl = 0; sl < rows->n_slots; sl++)
                so[sl] = sparse_optimizer_slot_name(pc->cfg->training.sparse_optimizer, sl);
        for (unsigned sl = 0; sl <= rows->n_slots && n && r >= 0; sl++)
                r = wire_out_tensor_copy(o, sl ? so[sl - 1] : "rows", WIRE_DTYPE_FLOAT32, (uint64_t[]){n, dim}, 2, 0,
                                         vals + sl * n * dim, n * dim * sizeof(float));
        if (r >= 0)
                r = wire_out_finish(o, bb);
out:
        wire_out_free(o);
        free(ids);
        free(vals);
        return r;
}

/* Adds the shards' SparseImportReply counts of one round to o's. */
static int import_replies(struct ps_client *pc, struct rpc_pending **pend, const struct ps_sparse_import_opts *o,
                          const char *table, char *err, size_t errlen) {
        for (uint32_t s = 0; s < pc->L->n_shards; s++) {
                if (!pend[s])
                        continue;
                struct rpc_result *res = rpc_pending_result(pend[s]);
                if (res->err)
                        continue;   /* ps_client_batch_end reports the first failure */
                ProtobufCMessage *m = NULL;
                if (wire_unpack(res->reply, &psfleet__v1__sparse_import_reply__descriptor, &m) < 0)
                        return errf(err, errlen, -EPROTO, "import of table %s: ps:%u's reply does not parse", table, s);
                const Psfleet__V1__SparseImportReply *rep = (const Psfleet__V1__SparseImportReply *)m;
                if (o->replaced)
                        *o->replaced += rep->replaced;
                if (o->dropped)
                        *o->dropped += rep->dropped;
                protobuf_c_message_free_unpacked(m, NULL);
        }
        return 0;
}

int ps_client_sparse_import_part(struct ps_client *pc, const bool *which, uint32_t e, const struct ps_sparse_rows *rows,
                                 const struct ps_sparse_import_opts *o, uint64_t global_step, char *err,
                                 size_t errlen) {
        const struct model_spec *m = &pc->cfg->model;
        if (e >= m->n_embeddings)
                return errf(err, errlen, -EINVAL, "table %u: the model has %u embedding table(s)", e, m->n_embeddings);
        if (rows->dim != m->emb[e].dim || rows->n_slots != sparse_optimizer_n_slots(pc->cfg->training.sparse_optimizer))
                return errf(err, errlen, -EINVAL, "table %s: rows of dim %u with %u slot(s), the job's are of dim %u with "
                            "%u", m->emb[e].name, rows->dim, rows->n_slots, m->emb[e].dim,
                            sparse_optimizer_n_slots(pc->cfg->training.sparse_optimizer));
        if (o->n_evicted > SPARSE_MAX_IDS)
                return errf(err, errlen, -EINVAL, "table %s: %zu evicted ids, more than the %u one message may carry",
                            m->emb[e].name, o->n_evicted, SPARSE_MAX_IDS);
        uint32_t N = pc->L->n_shards;
        size_t page = SPARSE_MAX_FLOATS / ((size_t)rows->dim * (1 + rows->n_slots));
        if (page > SPARSE_MAX_IDS)
                page = SPARSE_MAX_IDS;
        struct split sp = {0}, ev = {0};
        struct rpc_pending **pend = calloc(N, sizeof(*pend));
        int r = pend ? split_ids(rows->ids, rows->n, N, &sp) : -ENOMEM;
        if (r >= 0)
                r = split_ids(o->evicted, o->n_evicted, N, &ev);
        if (r < 0) {
                split_free(&sp);
                free(pend);
                return errf(err, errlen, r, "out of memory");
        }
        /* page k of every shard in one round, all shards in parallel; the first round empties each (with
         * clear) and drops the evicted ids before any row is stored */
        struct import x = {.which = which, .e = e, .rows = rows, .o = o, .sp = &sp, .ev = &ev, .page = page,
                           .global_step = global_step};
        for (; r >= 0; x.at += page, x.round++) {
                struct rpc_batch *b;
                if ((r = rpc_batch_new(&b)) < 0)
                        break;
                x.any = false;
                memset(pend, 0, N * sizeof(*pend));
                r = ps_client_fan_out(pc, b, IMPORT, false, import_build, &x, pend);
                char what[64];
                snprintf(what, sizeof(what), "import of table %s", m->emb[e].name);
                if (r >= 0)
                        rpc_batch_wait_all(b);
                if (r >= 0 && (r = import_replies(pc, pend, o, m->emb[e].name, err, errlen)) < 0) {
                        rpc_batch_wait_all(b);
                        rpc_batch_free(b);
                        break;
                }
                r = ps_client_batch_end(b, r, what, err, errlen);
                if (!x.any)
                        break;
        }
        split_free(&sp);
        split_free(&ev);
        free(pend);
        return r;
}

int ps_client_sparse_import(struct ps_client *pc, const bool *which, uint32_t e, const struct ps_sparse_rows *rows,
                            uint64_t global_step, char *err, size_t errlen) {
        const struct ps_sparse_import_opts o = {.clear = true};
        return ps_client_sparse_import_part(pc, which, e, rows, &o, global_step, err, errlen);
}
