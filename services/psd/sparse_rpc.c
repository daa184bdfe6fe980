/* psd's embedding tables (docs/sparse.md): one sparse_table per model.embeddings entry holding the
 * rows of this shard (sparse_shard_of), and their RPCs: a worker's SparseExchange (push the rows'
 * gradients, pull rows), the chief's SparseExport and SparseImport (checkpoints). Every request is
 * checked whole before anything is applied, so a refused one changes nothing. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "authz.h"
#include "log.h"
#include "metrics.h"
#include "optim.h"
#include "sparse_opts.h"
#include "sparse_tier.h"
#include "util.h"
#include "wire.h"

#include "psd-internal.h"

#define EXPORT_PAGE_ROWS 65536u
#define EXPORT_HOLD_US 30000000u   /* a walk abandoned half-way holds eviction off this long */

/* The series of a table's disk tier. */
static void tier_metrics(struct psd_table *pt, const char *name) {
        const struct { struct metric **m; const char *name, *help; } counters[] = {
                {&pt->m_disk_reads, "psfleet_ps_sparse_disk_reads_total", "Rows read back from the disk tier into DRAM."},
                {&pt->m_disk_spills, "psfleet_ps_sparse_disk_spills_total",
                 "Rows moved from DRAM to the disk tier at the table's bound."},
                {&pt->m_disk_errors, "psfleet_ps_sparse_disk_errors_total",
                 "Failed operations of the disk tier (unwritable, full, unreadable)."},
                {&pt->m_disk_refused, "psfleet_ps_sparse_disk_refused_total",
                 "New rows refused because no row could be moved to the disk tier."},
        };
        for (size_t k = 0; k < sizeof(counters) / sizeof(counters[0]); k++)
                *counters[k].m = metric_counter(counters[k].name, counters[k].help, "table", name);
        pt->m_disk_rows = metric_gauge("psfleet_ps_sparse_disk_rows", "Rows of an embedding table on this shard's "
                                       "disk tier.", "table", name);
        pt->m_disk_bytes = metric_gauge("psfleet_ps_sparse_disk_bytes", "Bytes of an embedding table's disk tier "
                                        "(files and memtables).", "table", name);
}

int sparse_tables_new(struct psd *p) {
        const struct model_spec *m = &p->cfg->model;
        char err[600];
        /* the tables' bounds under ps.memory_limit_bytes: the plan psfleet plan prints */
        int r = memplan_ps(p->cfg, p->L, p->shard, &p->plan, err, sizeof(err));
        if (r < 0)
                return log_error_errno(r, "%s", err);
        if (p->cfg->ps.memory_limit_bytes)
                log_info("ps.memory_limit_bytes %" PRIu64 ": dense variables with slots %" PRIu64 ", buffers %" PRIu64
                         ", process %" PRIu64 ", tables %" PRIu64 " bytes", p->cfg->ps.memory_limit_bytes,
                         p->plan.dense_bytes, p->plan.buffers, p->plan.base,
                         p->plan.total - p->plan.dense_bytes - p->plan.buffers - p->plan.base);
        if (!m->n_embeddings)
                return 0;   /* no series either: a dense job's scrape stays as it was */
        p->m_sparse_ids = metric_counter("psfleet_ps_sparse_ids_total", "Ids received by SparseExchange (pushed "
                                         "and pulled).", NULL, NULL);
        p->m_sparse_in = metric_counter("psfleet_ps_sparse_bytes_total", "Payload bytes of SparseExchange: ids, "
                                        "gradients in, rows out.", "direction", "in");
        p->m_sparse_out = metric_counter("psfleet_ps_sparse_bytes_total", "Payload bytes of SparseExchange: ids, "
                                         "gradients in, rows out.", "direction", "out");
        if (p->cfg->ps.memory_limit_bytes)
                metric_set(metric_gauge("psfleet_ps_sparse_memory_limit_bytes", "ps.memory_limit_bytes (0: none).", NULL,
                                        NULL), (double)p->cfg->ps.memory_limit_bytes);
        p->tables = calloc(m->n_embeddings, sizeof(*p->tables));
        if (!p->tables)
                return log_error_errno(-ENOMEM, "cannot set up the embedding tables");
        p->n_tables = m->n_embeddings;
        for (uint32_t e = 0; e < m->n_embeddings; e++) {
                struct psd_table *pt = &p->tables[e];
                struct sparse_table_opts o;
                const char *name = m->emb[e].name;
                sparse_table_opts_from_config(p->cfg, e, &o);
                o.max_rows = pt->max_rows = p->plan.tables[e].max_rows;
                char tier[PATH_MAX];
                if (m->emb[e].disk_tier && o.max_rows) {
                        /* the shard's own working state, wiped here: a restarted psd is restored from checkpoints */
                        const char *d = p->cfg->ps.disk_tier_dir;
                        /* a shard's backup psd has its own (the two may share a host and a state directory) */
                        const char *role = p->args.backup ? "-backup" : "";
                        int len = d[0] == '/' ? snprintf(tier, sizeof(tier), "%s/ps-%u%s/table-%u", d, p->shard, role, e)
                                              : snprintf(tier, sizeof(tier), "%s/%s/%s/ps-%u%s/table-%u",
                                                         p->args.state_dir, p->cfg->name, d, p->shard, role, e);
                        if (len < 0 || (size_t)len >= sizeof(tier))
                                return log_error_errno(-ENAMETOOLONG, "ps.disk_tier_dir \"%s\": the path is too long", d);
                        o.tier_dir = tier;
                        o.tier_ops = &sparse_tier_rocksdb;
                }
                if ((r = sparse_table_new(&o, &pt->t)) < 0) {
                        if (o.tier_dir)
                                return log_error_errno(r, "cannot set up embedding table \"%s\": its disk tier "
                                                       "\"%s\" (ps.disk_tier_dir)", name, o.tier_dir);
                        return log_error_errno(r, "cannot set up embedding table \"%s\"", name);
                }
                if (o.tier_dir)
                        log_info("table \"%s\": rows past %" PRIu64 " in DRAM go to the disk tier \"%s\" (wiped at start)",
                                 name, o.max_rows, o.tier_dir);
                if (o.max_rows)
                        log_info("table \"%s\": at most %" PRIu64 " rows on ps:%u (%s), evicting by %s", name, o.max_rows,
                                 p->shard, memplan_rows_name(p->plan.tables[e].from == MEMPLAN_LIMIT ? MEMPLAN_LIMIT
                                                                                                     : MEMPLAN_MAX_ROWS),
                                 sparse_evict_policy_name(o.evict_policy));
                pt->spec = &m->emb[e];
                pt->n_slots = sparse_optimizer_n_slots(o.optimizer);
                pthread_mutex_init(&pt->gone_lock, NULL);
                /* incremental checkpoints need to know which rows changed and which ids went */
                sparse_table_track(pt->t, p->cfg->supervisor.full_checkpoint_every > 1);
                /* ps.replicas 2: the rows it makes and drops go to the backup with each write */
                sparse_table_journal(pt->t, p->rep != NULL);
                pt->m_rows = metric_gauge("psfleet_ps_sparse_rows", "Rows of an embedding table stored on this "
                                          "shard.", "table", name);
                pt->m_bytes = metric_gauge("psfleet_ps_sparse_table_bytes", "Memory held by an embedding table on "
                                           "this shard.", "table", name);
                const struct { struct metric **m; const char *name, *help; } counters[] = {
                        {&pt->m_evicted_age, "psfleet_ps_sparse_evicted_age_total",
                         "Rows dropped as untouched for evict_after_steps."},
                        {&pt->m_evicted_limit, "psfleet_ps_sparse_evicted_limit_total",
                         "Rows evicted to make room at the table's bound (max_rows or ps.memory_limit_bytes)."},
                        {&pt->m_admitted, "psfleet_ps_sparse_admitted_total",
                         "Rows made once their id was pulled admit_after times."},
                        {&pt->m_pending, "psfleet_ps_sparse_admit_pending_total",
                         "Pulls of ids not yet admitted, answered with the initial row."},
                        {&pt->m_dropped, "psfleet_ps_sparse_grads_dropped_total",
                         "Gradient rows not applied: ids without a row under admission, or while the disk tier fails."},
                };
                for (size_t k = 0; k < sizeof(counters) / sizeof(counters[0]); k++)
                        *counters[k].m = metric_counter(counters[k].name, counters[k].help, "table", name);
                if (o.tier_dir)   /* a table without a tier keeps its scrape as it was */
                        tier_metrics(pt, name);
        }
        return 0;
}

void sparse_tables_free(struct psd *p) {
        for (uint32_t e = 0; e < p->n_tables; e++) {
                sparse_table_free(p->tables[e].t);
                free(p->tables[e].gone);
        }
        free(p->tables);
        p->tables = NULL;
        p->n_tables = 0;
}

static bool journal_out(struct psd_table *pt, uint8_t **buf, size_t *len);
static void write_unheld(void *ud, int status, const char *why);

/* Rows untouched for `after` steps dropped (the main loop, the shard's primary). ps.replicas 2: under the
 * write, as a push is, the rows it dropped going to the backup; not now if no write may be made (the
 * primary waits for the chief's word on its dropped backup). Returns how many went. */
static size_t evict_by_age(struct psd *p, struct psd_table *pt, uint32_t e, uint64_t now, uint64_t after) {
        char err[300];
        if (!p->rep)
                return sparse_table_evict(pt->t, now, after);
        if (replica_write_begin(p->rep, err, sizeof(err)) < 0)
                return 0;
        size_t n = sparse_table_evict(pt->t, now, after);
        struct replica_sparse sp = {.table = e, .step = now};
        sp.lost = !journal_out(pt, &sp.ev, &sp.ev_len);
        if (!sp.ev_len && !sp.lost) {
                replica_write_cancel(p->rep);
                return n;
        }
        struct replica_update *ru = NULL;
        if (!sp.lost)
                replica_update_sparse(&sp, &ru);
        else
                replica_sparse_free(&sp);
        struct replica_push who = {0};
        replica_write_end(p->rep, ru, 0, &who, write_unheld, NULL, err, sizeof(err));
        return n;
}

void sparse_tables_tick(struct psd *p) {
        uint64_t now = atomic_load(&p->sparse_step), exported = atomic_load(&p->export_us);
        /* a row evicted and made again during a checkpoint's walk would be in it twice */
        bool walking = exported && mono_us() - exported < EXPORT_HOLD_US;
        for (uint32_t e = 0; e < p->n_tables; e++) {
                struct psd_table *pt = &p->tables[e];
                uint64_t after = pt->spec->evict_after_steps;
                if (after && now > after && !walking && replica_is_primary(p->rep)) {
                        size_t n = evict_by_age(p, pt, e, now, after);
                        if (n) {
                                log_info_step(now, "table \"%s\": evicted %zu row(s) untouched for %" PRIu64
                                              " steps", pt->spec->name, n, after);
                        }
                }
                struct sparse_table_stats st;
                sparse_table_get_stats(pt->t, &st);
                metric_set(pt->m_rows, (double)st.rows);
                metric_set(pt->m_bytes, (double)st.bytes);
                metric_add(pt->m_evicted_age, st.evicted_age - pt->seen.evicted_age);
                metric_add(pt->m_evicted_limit, st.evicted_limit - pt->seen.evicted_limit);
                metric_add(pt->m_admitted, st.admitted - pt->seen.admitted);
                metric_add(pt->m_pending, st.admit_pending - pt->seen.admit_pending);
                metric_add(pt->m_dropped, st.grads_dropped - pt->seen.grads_dropped);
                if (pt->m_disk_rows) {
                        metric_set(pt->m_disk_rows, (double)st.tier_rows);
                        metric_set(pt->m_disk_bytes, (double)st.tier_bytes);
                        metric_add(pt->m_disk_reads, st.tier_reads - pt->seen.tier_reads);
                        metric_add(pt->m_disk_spills, st.tier_spills - pt->seen.tier_spills);
                        metric_add(pt->m_disk_errors, st.tier_errors - pt->seen.tier_errors);
                        metric_add(pt->m_disk_refused, st.tier_refused - pt->seen.tier_refused);
                }
                if (st.tier_errors > pt->seen.tier_errors) {
                        char why[256];
                        sparse_table_tier_error(pt->t, why, sizeof(why));
                        log_warning_step(now, "table \"%s\": %" PRIu64 " disk tier error(s): %s; while rows cannot "
                                         "move to disk, new rows are refused (%" PRIu64 " so far) and rows on disk "
                                         "stay there unchanged", pt->spec->name, st.tier_errors - pt->seen.tier_errors,
                                         why, st.tier_refused);
                }
                pt->seen = st;
        }
}

size_t sparse_max_request(const struct psd *p) {
        return p->n_tables ? 2 * (size_t)SPARSE_MAX_IDS * sizeof(uint64_t) + (size_t)SPARSE_MAX_FLOATS * sizeof(float) +
                                     (64u << 10)
                           : 0;
}

int sparse_status(struct psd *p, Psfleet__V1__ShardStatus *st) {
        st->memory_limit_bytes = p->cfg->ps.memory_limit_bytes;
        st->memory_planned_bytes = p->plan.total;
        if (!p->n_tables)
                return 0;
        Psfleet__V1__SparseTableStatus *ts = calloc(p->n_tables, sizeof(*ts));
        Psfleet__V1__SparseTableStatus **tp = calloc(p->n_tables, sizeof(*tp));
        if (!ts || !tp) {
                free(ts);
                free(tp);
                return -ENOMEM;
        }
        for (uint32_t e = 0; e < p->n_tables; e++) {
                struct psd_table *pt = &p->tables[e];
                psfleet__v1__sparse_table_status__init(&ts[e]);
                ts[e].name = (char *)pt->spec->name;
                ts[e].ids_in = atomic_load(&pt->ids_in);
                ts[e].bytes_in = atomic_load(&pt->bytes_in);
                ts[e].bytes_out = atomic_load(&pt->bytes_out);
                struct sparse_table_stats sst;
                sparse_table_get_stats(pt->t, &sst);
                ts[e].rows = sst.rows;
                ts[e].bytes = sst.bytes;
                ts[e].evicted = sst.evicted_age;
                ts[e].evicted_limit = sst.evicted_limit;
                ts[e].max_rows = pt->max_rows;
                ts[e].admitted = sst.admitted;
                ts[e].admit_pending = sst.admit_pending;
                ts[e].grads_dropped = sst.grads_dropped;
                ts[e].disk_rows = sst.tier_rows;
                ts[e].disk_bytes = sst.tier_bytes;
                ts[e].disk_reads = sst.tier_reads;
                ts[e].disk_spills = sst.tier_spills;
                ts[e].disk_errors = sst.tier_errors;
                ts[e].disk_refused = sst.tier_refused;
                tp[e] = &ts[e];
        }
        st->n_tables = p->n_tables;
        st->tables = tp;
        return 0;
}

void sparse_status_done(Psfleet__V1__ShardStatus *st) {
        if (st->n_tables)
                free(st->tables[0]);
        free(st->tables);
        st->tables = NULL;
        st->n_tables = 0;
}

/* ---- checks shared by the three calls ---- */

int sparse_check_table(struct psd *p, uint32_t e, char *err, size_t errlen) {
        if (e >= p->n_tables)
                return errf(err, errlen, -EINVAL, "table: %u is not an embedding table of this job (it has %u)", e,
                            p->n_tables);
        return 0;
}

/* The ids of a bytes field: a multiple of 8 bytes, at most SPARSE_MAX_IDS, each of this shard. *ids
 * gets them aligned (malloc'd; NULL when there are none). */
int sparse_take_ids(struct psd *p, const ProtobufCBinaryData *b, const char *field, uint64_t **ids, size_t *n,
                    char *err, size_t errlen) {
        *ids = NULL;
        *n = 0;
        if (b->len % sizeof(uint64_t))
                return errf(err, errlen, -EINVAL, "%s: %zu bytes, not a multiple of 8 (packed little-endian uint64 ids)",
                            field, b->len);
        size_t k = b->len / sizeof(uint64_t);
        if (k > SPARSE_MAX_IDS)
                return errf(err, errlen, -EINVAL, "%s: %zu ids, more than the %u one message may carry", field, k,
                            SPARSE_MAX_IDS);
        if (!k)
                return 0;
        uint64_t *v = malloc(k * sizeof(*v));
        if (!v)
                return errf(err, errlen, -ENOMEM, "out of memory");
        memcpy(v, b->data, k * sizeof(*v));
        uint32_t n_ps = p->cfg->cluster.n_ps;
        for (size_t i = 0; i < k; i++)
                if (sparse_shard_of(v[i], n_ps) != p->shard) {
                        int r = errf(err, errlen, -EINVAL, "%s[%zu]: id %" PRIu64 " belongs to ps:%u, not ps:%u", field,
                                     i, v[i], sparse_shard_of(v[i], n_ps), p->shard);
                        free(v);
                        return r;
                }
        *ids = v;
        *n = k;
        return 0;
}

/* A push names each row once: a repeated id would have its gradient applied twice (and the optimizer's
 * accumulator moved twice) in one step; an import once too (a checkpoint never holds a row twice, and
 * which of two would stand is no contract). 0, or -EINVAL naming the first id given twice. */
int sparse_check_unique(const uint64_t *ids, size_t n, const char *field, char *err, size_t errlen) {
        uint64_t dup;
        int r = u64_find_repeat(ids, n, &dup);
        if (r < 0)
                return errf(err, errlen, r, "out of memory");
        return r ? errf(err, errlen, -EINVAL, "%s: id %" PRIu64 " is given more than once (each row once per "
                        "message)", field, dup) : 0;
}

/* Tensor `name` of in, float32 (n, dim), every value finite, into dst (n * dim floats). */
int sparse_take_rows(const struct wire_in *in, const char *name, size_t n, uint32_t dim, float *dst, char *err,
                     size_t errlen) {
        const struct wire_tensor *t = NULL;
        for (size_t i = 0; i < in->n_tensors; i++)
                if (strcmp(in->tensors[i].name, name) == 0) {
                        if (t)
                                return errf(err, errlen, -EINVAL, "tensor \"%s\" given twice", name);
                        t = &in->tensors[i];
                }
        if (!t)
                return errf(err, errlen, -EINVAL, "tensor \"%s\" is missing", name);
        if (t->dtype != WIRE_DTYPE_FLOAT32)
                return errf(err, errlen, -EINVAL, "tensor \"%s\": dtype %u, float32 expected", name, t->dtype);
        if (t->ndims != 2 || t->shape[0] != n || t->shape[1] != dim)
                return errf(err, errlen, -EINVAL, "tensor \"%s\": shape (%" PRIu64 ", %" PRIu64 ")%s, (%zu, %u) "
                            "expected", name, t->ndims ? t->shape[0] : 0, t->ndims > 1 ? t->shape[1] : 0,
                            t->ndims == 2 ? "" : " (not 2-D)", n, dim);
        wire_tensor_copy_f32(t, dst);
        for (size_t i = 0; i < n * dim; i++)
                if (!isfinite(dst[i]))
                        return errf(err, errlen, -EINVAL, "tensor \"%s\": row %zu holds %s", name, i / dim,
                                    isnan(dst[i]) ? "NaN" : "Inf");
        return 0;
}

/* Only the tensors named in names[0..n) may come. */
static int check_names(const struct wire_in *in, const char *const *names, size_t n, char *err, size_t errlen) {
        for (size_t i = 0; i < in->n_tensors; i++) {
                size_t k = 0;
                while (k < n && strcmp(in->tensors[i].name, names[k]) != 0)
                        k++;
                char buf[LOG_PEER_BUF];
                if (k == n)
                        return errf(err, errlen, -EINVAL, "tensor \"%s\" is not expected here",
                                    log_peer_str(in->tensors[i].name, buf, sizeof(buf)));
        }
        return 0;
}

static void release_free(void *ud) {
        free(ud);
}

/* Appends buf (n x dim floats, owned: freed once sent) as tensor name. */
static int put_rows(struct wire_out *o, const char *name, float *buf, size_t n, uint32_t dim) {
        uint64_t shape[2] = {n, dim};
        return wire_out_tensor(o, name, WIRE_DTYPE_FLOAT32, shape, 2, 0, buf, n * dim * sizeof(float), release_free,
                               buf);
}

/* How a sparse handler ends its call (or, negative, -errno: it refuses it, with why in err). */
enum end {
        END_REPLY,              /* with the message of o */
        END_OUT_OF_MEMORY,
        END_ANSWERED,           /* the handler has answered the call itself */
};

/* Ends the call as r says; o (may be NULL) is freed. A reply that cannot be built is out of memory. */
static void end_call(struct psd *p, struct rpc_call *call, int r, struct wire_out *o, const char *err) {
        grpc_byte_buffer *bb;
        if (r == END_REPLY && wire_out_finish(o, &bb) < 0)
                r = END_OUT_OF_MEMORY;
        wire_out_free(o);
        if (r == END_REPLY)
                rpc_call_reply(call, bb);
        else if (r == END_OUT_OF_MEMORY)
                psd_out_of_memory(p, call);
        else if (r < 0)
                psd_reject(p, call, r, err);
}

/* ---- the writes, as the primary applies them and its backup replays them (ps.replicas 2) ---- */

/* The table's journal since the last take (sparse_table_journal: the rows made and dropped), packed
 * for a ReplicateUpdate, 9 bytes an event, into *buf (malloc'd; NULL when none). false when it could
 * not be taken: the backup must then be brought in again. */
static bool journal_out(struct psd_table *pt, uint8_t **buf, size_t *len) {
        struct sparse_event *ev;
        size_t n;
        *buf = NULL;
        *len = 0;
        if (sparse_table_journal_take(pt->t, &ev, &n) < 0)
                return false;
        if (!n)
                return true;
        uint8_t *b = malloc(n * 9);
        for (size_t i = 0; b && i < n; i++) {
                memcpy(b + 9 * i, &ev[i].id, 8);
                b[9 * i + 8] = ev[i].kind;
        }
        free(ev);
        *buf = b;
        *len = b ? n * 9 : 0;
        return b != NULL;
}

/* An exchange's writes: the pushed rows' gradients applied with lr, then the pulled rows (made when
 * create) into rows (n_pull x dim). step: the rows' last touch, and eviction's clock. With sp (ps.replicas
 * 2), the rows the push and then the pull made and dropped, into sp->ev and sp->ev2. 0, -ENOMEM. */
static int exchange_apply(struct psd *p, struct psd_table *pt, const uint64_t *push, size_t n_push, const float *g,
                          float lr, const uint64_t *pull, size_t n_pull, float *rows, bool create, uint64_t step,
                          struct replica_sparse *sp) {
        uint64_t seen = atomic_load(&p->sparse_step);
        while (step > seen && !atomic_compare_exchange_weak(&p->sparse_step, &seen, step))
                ;
        int r = n_push ? sparse_table_push(pt->t, push, n_push, g, lr, step) : 0;
        if (sp && !journal_out(pt, &sp->ev, &sp->ev_len))
                sp->lost = true;
        if (r == 0 && n_pull)
                r = sparse_table_pull(pt->t, pull, n_pull, rows, create, step);
        if (sp && !journal_out(pt, &sp->ev2, &sp->ev2_len))
                sp->lost = true;
        return r < 0 ? -ENOMEM : 0;
}

/* An import's writes: every row dropped first with clear, then the evicted ids, then the rows ids[0..n)
 * stored (vals: values, then the slots slot-major). *dropped: the evicted rows that went. Returns how
 * many of the ids were stored already, or -ENOMEM. */
int sparse_import_apply(struct psd_table *pt, bool clear, const uint64_t *evicted, size_t n_evicted,
                        const uint64_t *ids, size_t n, const float *vals, uint64_t step, uint64_t *dropped) {
        if (clear)
                sparse_table_clear(pt->t);
        *dropped = sparse_table_delete(pt->t, evicted, n_evicted);
        size_t dim = sparse_table_dim(pt->t);
        return n ? sparse_table_import(pt->t, ids, n, vals, pt->n_slots ? vals + n * dim : NULL, step) : 0;
}

/* A write held for its backup's acknowledgement: the call, and its answer. */
struct held_write {
        struct psd *p;
        struct rpc_call *call;
        struct wire_out *o;              /* an exchange's reply */
        Psfleet__V1__SparseImportReply rep;   /* an import's (o NULL) */
};

/* A write whose call was answered already (or has none: an eviction by age): nothing to say. */
static void write_unheld(void *ud, int status, const char *why) {
        (void)ud;
        (void)status;
        (void)why;
}

static void write_replicated(void *ud, int status, const char *why) {
        struct held_write *x = ud;
        if (status < 0) {
                wire_out_free(x->o);
                psd_reject(x->p, x->call, status, why);
        } else if (x->o) {
                end_call(x->p, x->call, END_REPLY, x->o, NULL);
        } else {
                rpc_call_reply_msg(x->call, &x->rep.base);
        }
        free(x);
}

/* The write begun (replica_write_begin) and applied ends: with changed, sp (taken) queued for the
 * backup and, when r is END_REPLY, the call answered once it holds it — *o (the reply, or NULL with
 * rep for an import's) is then taken and END_ANSWERED returned; else (nothing changed, the shard runs
 * unreplicated, or r says to answer otherwise) r, to answer now. Or -errno with err: refuse the call. */
static int replicate_write(struct psd *p, struct rpc_call *call, struct replica_sparse *sp, bool changed, int r,
                           struct wire_out **o, const Psfleet__V1__SparseImportReply *rep, char *err, size_t errlen) {
        if (!changed && !sp->lost) {
                replica_write_cancel(p->rep);
                replica_sparse_free(sp);
                return r;
        }
        struct held_write *x = r == END_REPLY ? calloc(1, sizeof(*x)) : NULL;
        struct replica_update *ru = NULL;
        if (sp->lost)
                replica_sparse_free(sp);   /* no update: the backup is dropped, and brought in again */
        else
                replica_update_sparse(sp, &ru);   /* NULL when out of memory: likewise */
        if (x) {
                *x = (struct held_write){.p = p, .call = call, .o = *o};
                if (rep)
                        x->rep = *rep;
        }
        struct replica_push who = {0};
        int e = replica_write_end(p->rep, ru, 0, &who, x ? write_replicated : write_unheld, x, err, errlen);
        if (e > 0 && x) {
                *o = NULL;
                return END_ANSWERED;
        }
        free(x);
        return e < 0 ? e : r;
}

/* ---- SparseExchange: a worker's step ---- */

void on_sparse_exchange(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        char err[600];
        struct psd_request q = {0};
        uint64_t *push = NULL, *pull = NULL;
        float *g = NULL, *rows = NULL;
        size_t n_push = 0, n_pull = 0;
        struct wire_out *o = NULL;
        int r;
        if ((r = psd_receive(p, call, &psfleet__v1__sparse_exchange_header__descriptor, &q, err, sizeof(err))) < 0)
                goto out;
        const Psfleet__V1__SparseExchangeHeader *h = (const Psfleet__V1__SparseExchangeHeader *)q.hm;
        if (!psd_ready_or_refuse(p, call)) {
                r = END_ANSWERED;
                goto out;
        }
        if (h->incarnation && h->incarnation != p->incarnation) {
                snprintf(err, sizeof(err), "incarnation: %" PRIu64 ", but ps:%u is now %" PRIu64 " (it restarted): "
                         "pull again", h->incarnation, p->shard, p->incarnation);
                r = -ESTALE;
                goto out;
        }
        if ((r = sparse_check_table(p, h->table, err, sizeof(err))) < 0 ||
            (r = sparse_take_ids(p, &h->push_ids, "push_ids", &push, &n_push, err, sizeof(err))) < 0 ||
            (r = sparse_check_unique(push, n_push, "push_ids", err, sizeof(err))) < 0 ||
            (r = sparse_take_ids(p, &h->pull_ids, "pull_ids", &pull, &n_pull, err, sizeof(err))) < 0)
                goto out;
        /* the chief evaluates: it may read rows, never change or add any */
        if (rpc_call_identity(call)->role == PEER_CHIEF && (n_push || h->create)) {
                r = errf(err, sizeof(err), -EACCES, "the chief may only look rows up (create false, no push_ids)");
                goto out;
        }
        struct psd_table *pt = &p->tables[h->table];
        uint32_t dim = sparse_table_dim(pt->t);
        if ((n_push > n_pull ? n_push : n_pull) * dim > SPARSE_MAX_FLOATS) {
                r = errf(err, sizeof(err), -EINVAL, "push_ids, pull_ids: %zu and %zu rows of %u floats, more than "
                         "the %u floats one message may carry", n_push, n_pull, dim, SPARSE_MAX_FLOATS);
                goto out;
        }
        static const char *const names[] = {"grads"};
        if ((r = check_names(q.in, names, n_push ? 1 : 0, err, sizeof(err))) < 0)
                goto out;
        g = malloc(n_push * dim * sizeof(float) + sizeof(float));
        rows = malloc(n_pull * dim * sizeof(float) + sizeof(float));
        if (!g || !rows) {
                r = END_OUT_OF_MEMORY;
                goto out;
        }
        if (n_push && (r = sparse_take_rows(q.in, "grads", n_push, dim, g, err, sizeof(err))) < 0)
                goto out;

        /* the step the worker saw: the rows' last touch, the learning rate's schedule, eviction's clock */
        uint64_t step = h->global_step;
        float lr = sparse_learning_rate(p->cfg, step);
        /* ps.replicas 2: applied under the write (the shard's order), answered once the backup holds it */
        if ((r = replica_write_begin(p->rep, err, sizeof(err))) < 0)
                goto out;
        struct replica_sparse sp = {.table = h->table, .lr = lr, .step = step};
        bool oom = exchange_apply(p, pt, push, n_push, g, lr, pull, n_pull, rows, h->create, step,
                                  p->rep ? &sp : NULL) < 0;
        uint64_t in_bytes = (n_push + n_pull) * sizeof(uint64_t) + n_push * dim * sizeof(float),
                 out_bytes = n_pull * dim * sizeof(float);
        atomic_fetch_add(&pt->ids_in, n_push + n_pull);
        atomic_fetch_add(&pt->bytes_in, in_bytes);
        atomic_fetch_add(&pt->bytes_out, out_bytes);
        metric_add(p->m_sparse_ids, n_push + n_pull);
        metric_add(p->m_sparse_in, in_bytes);
        metric_add(p->m_sparse_out, out_bytes);

        Psfleet__V1__SparseExchangeReplyHeader rh = PSFLEET__V1__SPARSE_EXCHANGE_REPLY_HEADER__INIT;
        rh.incarnation = p->incarnation;
        if (!oom && (r = wire_out_new(&o)) >= 0)
                r = wire_out_header(o, &rh.base);
        if (!oom && r >= 0 && n_pull) {
                r = put_rows(o, "rows", rows, n_pull, dim);   /* lent: freed once sent, or now on failure */
                rows = NULL;
        }
        r = oom || r < 0 ? END_OUT_OF_MEMORY : END_REPLY;
        if (p->rep) {
                /* the backup gets the pushed rows' gradients and the rows the table made and dropped */
                sp.ids = push;
                sp.n_ids = n_push;
                sp.vals = g;
                sp.n_vals = n_push * dim;
                push = NULL;
                g = NULL;
                r = replicate_write(p, call, &sp, sp.n_ids || sp.ev_len || sp.ev2_len, r, &o, NULL, err, sizeof(err));
        }
out:
        end_call(p, call, r, o, err);
        free(push);
        free(pull);
        free(g);
        free(rows);
        psd_request_done(&q);
}

/* ---- SparseExport and SparseImport: the chief's checkpoints ---- */

/* The evicted ids a walk gets after its rows: from = 0 takes them anew (eviction was held off during the
 * walk, so these are the ids it missed; what an earlier, unfinished walk left is dropped with it: the
 * chief writes a full checkpoint after one), else the next of those taken. At most page ids in *ids_ret
 * (malloc'd), *left_ret when more follow; *lost_ret when the shard cannot tell what changed. */
static int evicted_page(struct psd *p, struct psd_table *pt, uint64_t from, size_t page, uint64_t **ids_ret,
                        size_t *n_ret, bool *lost_ret, bool *left_ret, char *err, size_t errlen) {
        int r = 0;
        pthread_mutex_lock(&pt->gone_lock);
        if (from == 0) {
                free(pt->gone);
                pt->gone = NULL;
                pt->n_gone = 0;
                pt->gone_lost = p->cfg->supervisor.full_checkpoint_every <= 1 ||
                                sparse_table_take_evicted(pt->t, &pt->gone, &pt->n_gone) < 0;
        } else if (from > pt->n_gone) {
                /* another walk took them meanwhile */
                r = errf(err, errlen, -EINVAL, "evicted_from %" PRIu64 ": %zu evicted ids are held for this walk",
                         from, pt->n_gone);
                goto out;
        }
        size_t k = pt->n_gone - (size_t)from < page ? pt->n_gone - (size_t)from : page;
        *lost_ret = pt->gone_lost;
        *left_ret = from + k < pt->n_gone;
        *n_ret = 0;
        *ids_ret = NULL;
        if (k && !(*ids_ret = malloc(k * sizeof(uint64_t)))) {
                r = errf(err, errlen, -ENOMEM, "out of memory");
                goto out;
        }
        if (k)
                memcpy(*ids_ret, pt->gone + from, k * sizeof(uint64_t));
        *n_ret = k;
        if (!*left_ret) {   /* handed out whole */
                free(pt->gone);
                pt->gone = NULL;
                pt->n_gone = 0;
        }
out:
        pthread_mutex_unlock(&pt->gone_lock);
        return r;
}

void on_sparse_export(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        char err[600];
        ProtobufCMessage *m = NULL;
        uint64_t *ids = NULL;
        float *vals = NULL, *slots = NULL;
        struct wire_out *o = NULL;
        int r;
        if ((r = wire_unpack(rpc_call_payload(call), &psfleet__v1__sparse_export_request__descriptor, &m)) < 0) {
                snprintf(err, sizeof(err), "SparseExportRequest does not parse");
                goto out;
        }
        static const Psfleet__V1__SparseExportHeader empty = PSFLEET__V1__SPARSE_EXPORT_HEADER__INIT;
        const Psfleet__V1__SparseExportRequest *q = (const Psfleet__V1__SparseExportRequest *)m;
        const Psfleet__V1__SparseExportHeader *h = q->header ? q->header : &empty;
        if ((r = psd_check_caller(p, h->caller, err, sizeof(err))) < 0 || (r = sparse_check_table(p, h->table, err, sizeof(err))) < 0)
                goto out;
        struct psd_table *pt = &p->tables[h->table];
        uint32_t dim = sparse_table_dim(pt->t);
        size_t max = h->max_rows ? h->max_rows : EXPORT_PAGE_ROWS;
        if (max * dim * (1 + pt->n_slots) > SPARSE_MAX_FLOATS)
                max = SPARSE_MAX_FLOATS / ((size_t)dim * (1 + pt->n_slots));
        /* the page's ids and slots in one block (copied into the reply); its rows apart (lent to it) */
        ids = malloc(max * sizeof(*ids) + max * dim * (pt->n_slots ? pt->n_slots : 1) * sizeof(float));
        vals = malloc(max * dim * sizeof(float));
        if (!ids || !vals) {
                r = END_OUT_OF_MEMORY;
                goto out;
        }
        slots = (float *)(ids + max);   /* (n_slots, max, dim) */
        uint64_t cursor = h->cursor;
        size_t n = sparse_table_export_changes(pt->t, &cursor, max, ids, vals, pt->n_slots ? slots : NULL,
                                               h->dirty_only, h->clean);
        atomic_store(&p->export_us, n ? mono_us() : 0);
        uint64_t *gone = NULL;
        size_t n_gone = 0;
        bool lost = false, evicted_left = false;
        if (n == 0 && h->take_evicted) {
                /* the rows are over: the evicted ids, a page's worth of bytes at a time */
                size_t page = max * dim * (1 + pt->n_slots) * sizeof(float) / sizeof(uint64_t);
                if (page < 1024)
                        page = 1024;
                if ((r = evicted_page(p, pt, h->evicted_from, page, &gone, &n_gone, &lost, &evicted_left, err,
                                      sizeof(err))) < 0)
                        goto out;
        }

        Psfleet__V1__SparseExportReplyHeader rh = PSFLEET__V1__SPARSE_EXPORT_REPLY_HEADER__INIT;
        const char *slot_names[SPARSE_MAX_SLOTS];
        rh.incarnation = p->incarnation;
        rh.next_cursor = cursor;
        rh.done = n == 0 && !evicted_left;
        rh.ids = (ProtobufCBinaryData){n * sizeof(uint64_t), (uint8_t *)ids};
        rh.dim = dim;
        for (unsigned s = 0; s < pt->n_slots; s++)
                slot_names[s] = sparse_optimizer_slot_name(p->cfg->training.sparse_optimizer, s);
        rh.n_slots = pt->n_slots;
        rh.slots = (char **)slot_names;
        rh.evicted = (ProtobufCBinaryData){n_gone * sizeof(uint64_t), (uint8_t *)gone};
        rh.changes_lost = lost;
        if (wire_out_new(&o) < 0) {
                free(gone);
                r = END_OUT_OF_MEMORY;
                goto out;
        }
        wire_out_header(o, &rh.base);
        free(gone);   /* the header is packed */
        r = put_rows(o, "rows", vals, n, dim);
        vals = NULL;
        for (unsigned s = 0; s < pt->n_slots && r >= 0; s++)
                r = wire_out_tensor_copy(o, slot_names[s], WIRE_DTYPE_FLOAT32, (uint64_t[]){n, dim}, 2, 0,
                                         slots + (size_t)s * max * dim, n * dim * sizeof(float));
        r = r < 0 ? END_OUT_OF_MEMORY : END_REPLY;
out:
        end_call(p, call, r, o, err);
        free(ids);   /* and slots */
        free(vals);
        if (m)
                protobuf_c_message_free_unpacked(m, NULL);
}

void on_sparse_import(struct rpc_call *call, void *ud) {
        struct psd *p = ud;
        char err[600];
        struct psd_request q = {0};
        uint64_t *ids = NULL, *evicted = NULL;
        float *vals = NULL;
        size_t n = 0, n_evicted = 0;
        int r;
        if ((r = psd_receive(p, call, &psfleet__v1__sparse_import_header__descriptor, &q, err, sizeof(err))) < 0)
                goto out;
        const Psfleet__V1__SparseImportHeader *h = (const Psfleet__V1__SparseImportHeader *)q.hm;
        if ((r = sparse_check_table(p, h->table, err, sizeof(err))) < 0 ||
            (r = sparse_take_ids(p, &h->ids, "ids", &ids, &n, err, sizeof(err))) < 0 ||
            (r = sparse_check_unique(ids, n, "ids", err, sizeof(err))) < 0 ||
            (r = sparse_take_ids(p, &h->evicted, "evicted", &evicted, &n_evicted, err, sizeof(err))) < 0)
                goto out;
        struct psd_table *pt = &p->tables[h->table];
        uint32_t dim = sparse_table_dim(pt->t);
        enum sparse_optimizer so = p->cfg->training.sparse_optimizer;
        if (n * dim * (1 + pt->n_slots) > SPARSE_MAX_FLOATS) {
                r = errf(err, sizeof(err), -EINVAL, "ids: %zu rows of %u floats and %u slot(s), more than the %u floats "
                         "one message may carry", n, dim, pt->n_slots, SPARSE_MAX_FLOATS);
                goto out;
        }
        const char *names[1 + SPARSE_MAX_SLOTS] = {"rows"};
        for (unsigned s = 0; s < pt->n_slots; s++)
                names[1 + s] = sparse_optimizer_slot_name(so, s);
        if ((r = check_names(q.in, names, n ? 1 + pt->n_slots : 0, err, sizeof(err))) < 0)
                goto out;
        /* rows, then the slots slot-major, as sparse_table_import reads them */
        vals = malloc(n * dim * (1 + pt->n_slots) * sizeof(float) + sizeof(float));
        if (!vals) {
                r = END_OUT_OF_MEMORY;
                goto out;
        }
        for (unsigned s = 0; s <= pt->n_slots && n && r >= 0; s++)
                r = sparse_take_rows(q.in, names[s], n, dim, vals + (size_t)s * n * dim, err, sizeof(err));
        if (r < 0)
                goto out;
        /* ps.replicas 2: applied under the write (the shard's order), answered once the backup holds it */
        if ((r = replica_write_begin(p->rep, err, sizeof(err))) < 0)
                goto out;
        Psfleet__V1__SparseImportReply rep = PSFLEET__V1__SPARSE_IMPORT_REPLY__INIT;
        int replaced = sparse_import_apply(pt, h->clear, evicted, n_evicted, ids, n, vals, h->global_step, &rep.dropped);
        rep.incarnation = p->incarnation;
        rep.rows = sparse_table_rows(pt->t);
        rep.replaced = replaced < 0 ? 0 : (uint64_t)replaced;
        r = replaced < 0 ? END_OUT_OF_MEMORY : END_REPLY;
        if (p->rep) {
                struct replica_sparse sp = {.table = h->table, .import = true, .clear = h->clear, .ids = ids, .n_ids = n,
                                            .ids2 = evicted, .n_ids2 = n_evicted, .vals = vals,
                                            .n_vals = n * dim * (1 + pt->n_slots), .step = h->global_step};
                sp.lost = !journal_out(pt, &sp.ev, &sp.ev_len);   /* rows it dropped at the bound */
                ids = evicted = NULL;
                vals = NULL;
                struct wire_out *none = NULL;
                r = replicate_write(p, call, &sp, true, r, &none, &rep, err, sizeof(err));
        }
        if (r == END_REPLY) {
                rpc_call_reply_msg(call, &rep.base);
                r = END_ANSWERED;
        }
out:
        end_call(p, call, r, NULL, err);
        free(ids);
        free(evicted);
        free(vals);
        psd_request_done(&q);
}
