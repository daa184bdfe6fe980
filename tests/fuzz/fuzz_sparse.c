/* Harness: the embedding tables' handlers of a real psd (SparseExchange, SparseExport, SparseImport)
 * on a thread of this process, with a shard of a job with one table (dim 4, sparse SGD), fed through
 * gRPC on loopback as a worker's or the chief's calls would be. Input: one byte choosing the method
 * (0xff: Stop, then psd is started again and given its rows back), then the request's bytes.
 *
 * The invariant, after every input, on the table as a whole export shows it:
 * - a refused call, an export and a status change no row;
 * - an accepted SparseExchange was legal by the harness's own reading (table 0, at most 2^20 ids of
 *   8 bytes each, push_ids each once, tensor "grads" float32 (n_push, 4) and finite when there are
 *   any, nothing else) and changed or created only rows it named;
 * - an accepted SparseImport was legal too (ids each once, its "rows" float32 (n, 4), finite) and the
 *   rows it named now hold what it carried; with clear, they are the whole table; without, the only
 *   rows gone are those its evicted ids named.
 *
 * FUZZ_SPARSE_SEED=DIR writes the seed corpus (legal calls of each method) into DIR and exits. */
#include <math.h>

#include "config.h"
#include "fuzz_daemon.h"
#include "job.h"
#include "rpc.h"
#include "util.h"
#include "wire.h"
#include "psfleet/v1/ps.pb-c.h"

int psd_main(int argc, char **argv);   /* services/psd/psd.c, built here with main renamed */

#define DIM 4

static const char *const methods[] = {
        "/psfleet.v1.ParameterServer/SparseExchange",
        "/psfleet.v1.ParameterServer/SparseExport",
        "/psfleet.v1.ParameterServer/SparseImport",
        "/psfleet.v1.ParameterServer/GetShardStatus",
        "/psfleet.v1.ParameterServer/Stop",
};
enum { M_EXCHANGE, M_EXPORT, M_IMPORT, M_STATUS, M_STOP, M_CHOICES = M_STOP };

static const char job_json[] =
        "{\"job\": \"fuzz-sparse\", \"cluster\": {\"chief\": [\"127.0.0.1:2\"], \"ps\": [\"127.0.0.1:3\"], "
        "\"worker\": [\"127.0.0.1:1\"]}, \"model\": {\"input\": [13], \"seed\": 1, \"head\": \"logistic\", "
        "\"embeddings\": [{\"name\": \"cat\", \"fields\": \"all\", \"dim\": 4}], "
        "\"layers\": [{\"type\": \"dense\", \"units\": 1}]}, "
        "\"data\": {\"dir\": \"/nonexistent\", \"format\": \"criteo\", \"train_files\": [\"train.tsv\"]}, "
        "\"training\": {\"batch_size\": 4, \"optimizer\": \"sgd\", \"learning_rate\": 0.1, "
        "\"sparse_optimizer\": \"sgd\", \"sparse_learning_rate\": 0.5, \"max_steps\": 1000000000}, "
        "\"security\": {\"mode\": \"insecure\"}}"; /* called as any role, without certificates */

/* The table: rows sorted by id. */
struct table {
        uint64_t *ids;
        float *rows;   /* (n, DIM) */
        size_t n;
};

static struct job_config *cfg;
static struct job_layout *L;
static struct fuzz_daemon psd = {.main = psd_main, .name = "ps:0", .stop = "/psfleet.v1.ParameterServer/Stop"};
static struct table copy;   /* what the table holds */

static void caller(Psfleet__V1__Caller *c) {
        c->fingerprint = L->fingerprint;
        c->task = (char *)"chief:0";
}

static int call(int m, const uint8_t *data, size_t size, grpc_byte_buffer **reply) {
        return fuzz_daemon_call(&psd, methods[m], data, size, reply);
}

/* A header and tensors into bytes (malloc'd); tensors: n_t of (name, rows of DIM floats). */
static void message_bytes(const ProtobufCMessage *h, const char *const *names, const float *const *data,
                          const size_t *rows, unsigned n_t, uint8_t **p, size_t *n) {
        struct wire_out *o;
        grpc_byte_buffer *bb;
        if (wire_out_new(&o) < 0)
                abort();
        wire_out_header(o, h);
        for (unsigned i = 0; i < n_t; i++) {
                uint64_t shape[2] = {rows[i], DIM};
                wire_out_tensor_copy(o, names[i], WIRE_DTYPE_FLOAT32, shape, 2, 0, data[i], rows[i] * DIM * sizeof(float));
        }
        wire_out_finish(o, &bb);
        wire_out_free(o);
        fuzz_bytes_of(bb, p, n);
}

static int cmp_row(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return (x > y) - (x < y);
}

/* Sorts t's rows by id. */
static void table_sort(struct table *t) {
        struct { uint64_t id; float v[DIM]; } *e = malloc((t->n ? t->n : 1) * sizeof(*e));
        for (size_t i = 0; i < t->n; i++) {
                e[i].id = t->ids[i];
                memcpy(e[i].v, t->rows + i * DIM, sizeof(e[i].v));
        }
        qsort(e, t->n, sizeof(*e), cmp_row);
        for (size_t i = 0; i < t->n; i++) {
                t->ids[i] = e[i].id;
                memcpy(t->rows + i * DIM, e[i].v, sizeof(e[i].v));
        }
        free(e);
}

static void table_clear(struct table *t) {
        free(t->ids);
        free(t->rows);
        *t = (struct table){0};
}

/* The whole table, page by page, into t (sorted). */
static void export_all(struct table *t) {
        table_clear(t);
        uint64_t cursor = 0;
        for (;;) {
                Psfleet__V1__SparseExportHeader h = PSFLEET__V1__SPARSE_EXPORT_HEADER__INIT;
                Psfleet__V1__Caller c = PSFLEET__V1__CALLER__INIT;
                caller(&c);
                h.caller = &c;
                h.cursor = cursor;
                h.max_rows = 4096;
                Psfleet__V1__SparseExportRequest q = PSFLEET__V1__SPARSE_EXPORT_REQUEST__INIT;
                q.header = &h;
                ProtobufCMessage *hm = NULL;
                struct wire_in *in = fuzz_daemon_request(&psd, methods[M_EXPORT], &q.base,
                                                         &psfleet__v1__sparse_export_reply_header__descriptor, &hm);
                const Psfleet__V1__SparseExportReplyHeader *rh = (const Psfleet__V1__SparseExportReplyHeader *)hm;
                size_t k = rh->ids.len / 8;
                FUZZ_CHECK(rh->ids.len % 8 == 0 && rh->dim == DIM && (k == 0 || in->n_tensors >= 1), "an export's page");
                if (k) {
                        const struct wire_tensor *tr = &in->tensors[0];
                        FUZZ_CHECK(strcmp(tr->name, "rows") == 0 && tr->nbytes == k * DIM * sizeof(float),
                                   "an export's rows");
                        t->ids = realloc(t->ids, (t->n + k) * sizeof(uint64_t));
                        t->rows = realloc(t->rows, (t->n + k) * DIM * sizeof(float));
                        memcpy(t->ids + t->n, rh->ids.data, k * 8);
                        wire_tensor_copy(tr, t->rows + t->n * DIM);
                        t->n += k;
                }
                bool done = rh->done;
                cursor = rh->next_cursor;
                protobuf_c_message_free_unpacked(hm, NULL);
                wire_in_free(in);
                if (done)
                        break;
        }
        table_sort(t);
}

/* The row of id in t, or NULL. */
static const float *row_of(const struct table *t, uint64_t id) {
        size_t lo = 0, hi = t->n;
        while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (t->ids[mid] < id)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo < t->n && t->ids[lo] == id ? t->rows + lo * DIM : NULL;
}

/* psd after a start: its dense variables assigned (zeros) and, with rows, the table imported. */
/* Leaves out of t the rows holding a non-finite value. Finite gradients can drive a row past FLT_MAX
 * (the sparse path has no norm limit), and psd refuses to import a non-finite row, as a restore must:
 * such rows cannot be given back after a restart, so the harness stops expecting them. */
static void drop_nonfinite(struct table *t) {
        size_t k = 0;
        for (size_t i = 0; i < t->n; i++) {
                bool finite = true;
                for (size_t j = 0; j < DIM; j++)
                        finite &= isfinite(t->rows[i * DIM + j]) != 0;
                if (!finite)
                        continue;
                t->ids[k] = t->ids[i];
                memmove(t->rows + k * DIM, t->rows + i * DIM, DIM * sizeof(float));
                k++;
        }
        t->n = k;
}

static void initialize(const struct table *rows) {
        Psfleet__V1__AssignHeader h = PSFLEET__V1__ASSIGN_HEADER__INIT;
        Psfleet__V1__Caller c = PSFLEET__V1__CALLER__INIT;
        caller(&c);
        h.caller = &c;
        struct wire_out *o;
        grpc_byte_buffer *bb;
        if (wire_out_new(&o) < 0)
                abort();
        wire_out_header(o, &h.base);
        float *zeros = calloc(L->n_params + 1, sizeof(float));
        for (uint32_t i = 0; i < L->shard_count[0]; i++) {
                const struct placement_part *pp = &L->plan->parts[L->shard_parts[L->shard_first[0] + i]];
                const struct job_var *jv = &L->vars[pp->var];
                uint64_t shape[2] = {pp->row_end - pp->row_begin, jv->cols};
                wire_out_tensor_copy(o, jv->name, WIRE_DTYPE_FLOAT32, shape, 2, pp->row_begin, zeros,
                                     shape[0] * shape[1] * sizeof(float));
        }
        free(zeros);
        wire_out_finish(o, &bb);
        wire_out_free(o);
        uint8_t *p;
        size_t n;
        int r;
        fuzz_bytes_of(bb, &p, &n);
        while ((r = fuzz_daemon_call(&psd, "/psfleet.v1.ParameterServer/Assign", p, n, NULL)) == -ECONNREFUSED ||
               r == -EAGAIN)
                usleep(10000);
        free(p);
        FUZZ_CHECK(r == 0, "the harness's Assign failed (%d: %s)", r, psd.last_msg);
        if (!rows || !rows->n)
                return;
        Psfleet__V1__SparseImportHeader ih = PSFLEET__V1__SPARSE_IMPORT_HEADER__INIT;
        ih.caller = &c;
        ih.ids.data = (uint8_t *)rows->ids;
        ih.ids.len = rows->n * 8;
        ih.clear = true;
        const char *names[] = {"rows"};
        const float *data[] = {rows->rows};
        size_t nr[] = {rows->n};
        message_bytes(&ih.base, names, data, nr, 1, &p, &n);
        r = call(M_IMPORT, p, n, NULL);
        free(p);
        FUZZ_CHECK(r == 0, "the harness's SparseImport after a restart failed (%d: %s)", r, psd.last_msg);
}

static void setup(void) {
        char err[512];
        static const char *const extra[] = {"--task-index", "0", NULL};
        fuzz_daemon_init(&psd, job_json, extra);
        if (config_load(psd.job_path, &cfg, err, sizeof(err)) < 0 || job_layout_new(cfg, &L) < 0) {
                fprintf(stderr, "fuzz_sparse: %s\n", err);
                abort();
        }
        fuzz_daemon_start(&psd);
        initialize(NULL);
        export_all(&copy);
}

/* An exchange's bytes: push ids (with gradients of a fixed pattern), pull ids, create. */
static void exchange_bytes(const uint64_t *push, size_t n_push, const uint64_t *pull, size_t n_pull, bool create,
                           float bad, uint8_t **p, size_t *n) {
        Psfleet__V1__SparseExchangeHeader h = PSFLEET__V1__SPARSE_EXCHANGE_HEADER__INIT;
        Psfleet__V1__Caller c = PSFLEET__V1__CALLER__INIT;
        caller(&c);
        c.task = (char *)"worker:0";
        h.caller = &c;
        h.global_step = 1;
        h.create = create;
        h.push_ids.data = (uint8_t *)push;
        h.push_ids.len = n_push * 8;
        h.pull_ids.data = (uint8_t *)pull;
        h.pull_ids.len = n_pull * 8;
        float *g = malloc((n_push * DIM + 1) * sizeof(float));
        for (size_t i = 0; i < n_push * DIM; i++)
                g[i] = (float)((int)(i % 9) - 4) / 32.f;
        if (n_push)
                g[0] = bad == 0 ? g[0] : bad;
        const char *names[] = {"grads"};
        const float *data[] = {g};
        size_t nr[] = {n_push};
        message_bytes(&h.base, names, data, nr, n_push ? 1 : 0, p, n);
        free(g);
}

/* FUZZ_SPARSE_SEED=DIR: legal calls of each method, and a few refused ones. */
static void seeds(const char *dir) {
        static const uint64_t ids[] = {1, 2, 3, 1000003, UINT64_MAX};
        uint8_t *p;
        size_t n;
        exchange_bytes(NULL, 0, ids, 5, true, 0, &p, &n);
        fuzz_write_seed(dir, "exchange-pull", M_EXCHANGE, p, n);
        free(p);
        exchange_bytes(ids, 3, ids, 5, true, 0, &p, &n);
        fuzz_write_seed(dir, "exchange-push-pull", M_EXCHANGE, p, n);
        free(p);
        exchange_bytes(ids, 2, ids + 2, 2, false, 0, &p, &n);
        fuzz_write_seed(dir, "exchange-lookup", M_EXCHANGE, p, n);
        free(p);
        exchange_bytes(ids, 3, NULL, 0, true, NAN, &p, &n);
        fuzz_write_seed(dir, "exchange-nan", M_EXCHANGE, p, n);
        free(p);
        static const uint64_t twice[] = {7, 8, 7};
        exchange_bytes(twice, 3, NULL, 0, true, 0, &p, &n);
        fuzz_write_seed(dir, "exchange-twice", M_EXCHANGE, p, n);
        free(p);
        Psfleet__V1__SparseExportHeader eh = PSFLEET__V1__SPARSE_EXPORT_HEADER__INIT;
        Psfleet__V1__Caller c = PSFLEET__V1__CALLER__INIT;
        caller(&c);
        eh.caller = &c;
        eh.max_rows = 2;
        Psfleet__V1__SparseExportRequest eq = PSFLEET__V1__SPARSE_EXPORT_REQUEST__INIT;
        eq.header = &eh;
        fuzz_bytes_of(wire_pack(&eq.base), &p, &n);
        fuzz_write_seed(dir, "export-page", M_EXPORT, p, n);
        free(p);
        float rows[3 * DIM];
        for (int i = 0; i < 3 * DIM; i++)
                rows[i] = (float)i / 8.f;
        Psfleet__V1__SparseImportHeader ih = PSFLEET__V1__SPARSE_IMPORT_HEADER__INIT;
        ih.caller = &c;
        ih.ids.data = (uint8_t *)ids;
        ih.ids.len = 3 * 8;
        const char *names[] = {"rows"};
        const float *data[] = {rows};
        size_t nr[] = {3};
        message_bytes(&ih.base, names, data, nr, 1, &p, &n);
        fuzz_write_seed(dir, "import", M_IMPORT, p, n);
        free(p);
        ih.clear = true;
        message_bytes(&ih.base, names, data, nr, 1, &p, &n);
        fuzz_write_seed(dir, "import-clear", M_IMPORT, p, n);
        free(p);
        ih.clear = false;   /* a restore's increment: its evicted ids dropped, then its rows */
        ih.evicted.data = (uint8_t *)ids;
        ih.evicted.len = 2 * 8;
        message_bytes(&ih.base, names, data, nr, 1, &p, &n);
        fuzz_write_seed(dir, "import-evicted", M_IMPORT, p, n);
        free(p);
        fuzz_write_seed(dir, "status", M_STATUS, NULL, 0);
        Psfleet__V1__StopRequest st = PSFLEET__V1__STOP_REQUEST__INIT;
        st.reason = (char *)"fuzz";
        fuzz_bytes_of(wire_pack(&st.base), &p, &n);
        fuzz_write_seed(dir, "stop", 0xff, p, n);
        free(p);
}

/* A request psd accepted, by the harness's own reading: its header (unpacked), its ids and the rows of
 * its one tensor. */
struct request {
        struct wire_in *in;
        ProtobufCMessage *hm;
        const uint64_t *ids;   /* into hm */
        size_t n_ids;
        float *rows;           /* (n_ids, DIM), malloc'd */
};

/* Legal: it parses with header desc; the ids (ids_of) are whole 8-byte ids, at most 2^20; with ids,
 * exactly one tensor, tname, float32 (n_ids, DIM) and finite; without, no tensor that holds anything. */
static bool legal(const uint8_t *data, size_t size, const ProtobufCMessageDescriptor *desc, const char *tname,
                  ProtobufCBinaryData (*ids_of)(const ProtobufCMessage *), struct request *q, char *why, size_t len) {
        grpc_slice sl = grpc_slice_from_copied_buffer((const char *)data, size);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
        char err[256] = "";
        *q = (struct request){0};
        if (wire_in_parse(bb, &q->in, err, sizeof(err)) < 0 || wire_in_header(q->in, desc, &q->hm) < 0) {
                snprintf(why, len, "it does not parse: %s", err);
                return false;
        }
        ProtobufCBinaryData b = ids_of(q->hm);
        if (b.len % 8 || b.len / 8 > (1u << 20)) {
                snprintf(why, len, "%zu bytes of ids", b.len);
                return false;
        }
        q->ids = (const uint64_t *)b.data;
        q->n_ids = b.len / 8;
        if (q->n_ids == 0) {
                for (size_t i = 0; i < q->in->n_tensors; i++)
                        if (q->in->tensors[i].nbytes) {
                                snprintf(why, len, "tensor \"%s\" without ids", q->in->tensors[i].name);
                                return false;
                        }
                return true;
        }
        if (q->in->n_tensors != 1 || strcmp(q->in->tensors[0].name, tname) != 0) {
                snprintf(why, len, "%zu tensors, not one \"%s\"", q->in->n_tensors, tname);
                return false;
        }
        const struct wire_tensor *t = &q->in->tensors[0];
        if (t->dtype != WIRE_DTYPE_FLOAT32 || t->ndims != 2 || t->shape[0] != q->n_ids || t->shape[1] != DIM) {
                snprintf(why, len, "tensor \"%s\" is not float32 (%zu, %d)", tname, q->n_ids, DIM);
                return false;
        }
        q->rows = malloc((q->n_ids * DIM + 1) * sizeof(float));
        wire_tensor_copy(t, q->rows);
        for (size_t i = 0; i < q->n_ids * DIM; i++)
                if (!isfinite(q->rows[i])) {
                        snprintf(why, len, "tensor \"%s\" element %zu is not finite", tname, i);
                        return false;
                }
        return true;
}

static void request_free(struct request *q) {
        if (q->hm)
                protobuf_c_message_free_unpacked(q->hm, NULL);
        wire_in_free(q->in);
        free(q->rows);
}

static ProtobufCBinaryData push_ids_of(const ProtobufCMessage *m) {
        return ((const Psfleet__V1__SparseExchangeHeader *)m)->push_ids;
}

static ProtobufCBinaryData import_ids_of(const ProtobufCMessage *m) {
        return ((const Psfleet__V1__SparseImportHeader *)m)->ids;
}

static bool named(const uint64_t *ids, size_t n, uint64_t id) {
        for (size_t i = 0; i < n; i++)
                if (ids[i] == id)
                        return true;
        return false;
}

/* Every row of b that is not in a, or differs from it, is named (ids, n); with none named, a == b. */
static void only_named_changed(const struct table *a, const struct table *b, const uint64_t *ids, size_t n,
                               const uint64_t *ids2, size_t n2, const uint64_t *gone, size_t n_gone,
                               const char *what) {
        for (size_t i = 0; i < b->n; i++) {
                const float *old = row_of(a, b->ids[i]);
                if (old && memcmp(old, b->rows + i * DIM, DIM * sizeof(float)) == 0)
                        continue;
                FUZZ_CHECK(named(ids, n, b->ids[i]) || named(ids2, n2, b->ids[i]),
                           "after %s, row %llu %s though the call did not name it", what,
                           (unsigned long long)b->ids[i], old ? "changed" : "appeared");
        }
        for (size_t i = 0; i < a->n; i++)
                FUZZ_CHECK(row_of(b, a->ids[i]) || named(gone, n_gone, a->ids[i]), "after %s, row %llu is gone", what,
                           (unsigned long long)a->ids[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        fuzz_daemon_first(&psd, setup, "FUZZ_SPARSE_SEED", seeds);
        int m = fuzz_daemon_method(&data, &size, M_CHOICES, M_STOP);
        if (m < 0)
                return 0;
        int r = call(m, data, size, NULL);
        if (fuzz_daemon_after(&psd, m, M_STOP, r)) {
                drop_nonfinite(&copy);
                initialize(&copy);   /* psd starts uninitialized and empty: give it the rows back */
        }
        struct table now = {0};
        export_all(&now);
        char why[300];
        struct request q;
        if (m == M_EXCHANGE && r == 0) {
                FUZZ_CHECK(legal(data, size, &psfleet__v1__sparse_exchange_header__descriptor, "grads", push_ids_of,
                                 &q, why, sizeof(why)),
                           "psd took an illegal SparseExchange: %s", why);
                const Psfleet__V1__SparseExchangeHeader *h = (const Psfleet__V1__SparseExchangeHeader *)q.hm;
                FUZZ_CHECK(h->table == 0 && h->pull_ids.len % 8 == 0 && h->pull_ids.len / 8 <= (1u << 20),
                           "psd took an exchange of table %u with %zu bytes of pull_ids", h->table, h->pull_ids.len);
                uint64_t dup;
                FUZZ_CHECK(u64_find_repeat(q.ids, q.n_ids, &dup) == 0, "psd took a push naming row %llu twice",
                           (unsigned long long)dup);
                only_named_changed(&copy, &now, q.ids, q.n_ids, (const uint64_t *)h->pull_ids.data,
                                   h->create ? h->pull_ids.len / 8 : 0, NULL, 0, "an accepted SparseExchange");
                request_free(&q);
        } else if (m == M_IMPORT && r == 0) {
                FUZZ_CHECK(legal(data, size, &psfleet__v1__sparse_import_header__descriptor, "rows", import_ids_of,
                                 &q, why, sizeof(why)),
                           "psd took an illegal SparseImport: %s", why);
                const Psfleet__V1__SparseImportHeader *h = (const Psfleet__V1__SparseImportHeader *)q.hm;
                FUZZ_CHECK(h->table == 0, "psd took an import into table %u", h->table);
                uint64_t dup;
                FUZZ_CHECK(u64_find_repeat(q.ids, q.n_ids, &dup) == 0, "psd took an import naming row %llu twice",
                           (unsigned long long)dup);
                for (size_t i = 0; i < q.n_ids; i++) {
                        const float *row = row_of(&now, q.ids[i]);
                        FUZZ_CHECK(row && memcmp(row, q.rows + i * DIM, DIM * sizeof(float)) == 0,
                                   "after an accepted SparseImport, row %llu is not what it carried",
                                   (unsigned long long)q.ids[i]);
                }
                if (h->clear)
                        FUZZ_CHECK(now.n <= q.n_ids, "after an import with clear, %zu rows for %zu ids", now.n, q.n_ids);
                else
                        only_named_changed(&copy, &now, q.ids, q.n_ids, NULL, 0, (const uint64_t *)h->evicted.data,
                                           h->evicted.len / 8, "an accepted SparseImport");
                request_free(&q);
        } else {   /* a Stop included: psd was given the rows back */
                FUZZ_CHECK(now.n == copy.n && (now.n == 0 || (memcmp(now.ids, copy.ids, now.n * 8) == 0 &&
                                                             memcmp(now.rows, copy.rows, now.n * DIM * sizeof(float)) == 0)),
                           "after a %s (%s), the table changed", methods[m], r == 0 ? "accepted" : "refused");
        }
        table_clear(&copy);
        copy = now;
        return 0;
}
