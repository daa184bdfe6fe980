/* The ps client's embedding-table calls against real psd shards (test_sparse_rpc.py): ids split over
 * the shards and the rows put back in the caller's order, equal to a table held here with the same
 * options (so the initializer depends on (seed, table, id) alone, whatever the shard); a lookup that
 * creates nothing; a push whose rows equal the same push applied here; payload bytes exactly 8 per id
 * and 4 * dim per row, in the client's count and the shards' status; an export and an import that
 * give back every row with its optimizer slots, after an empty import emptied the tables (an Assign
 * leaves them: the chief imports before it assigns).
 *
 * Usage: sparse_client JOB.json   (the job's shards up and not yet assigned; the job has at least
 * one embedding table and two shards; prints "ok" and exits 0, or says what failed and exits 1) */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "job.h"
#include "optim.h"
#include "ps_client.h"
#include "rng.h"
#include "rpc.h"
#include "sparse_opts.h"
#include "sparse_table.h"
#include "psfleet/v1/ps.pb-c.h"

#define CLIENT_NAME "sparse_client"
#include "client_check.h"

#define N_IDS 1000

static struct ps_client *pc;
static const struct job_config *cfg;

/* Sums of table e's counters over every shard. */
static void table_status(uint32_t e, uint64_t *rows, uint64_t *in, uint64_t *out) {
        char err[512];
        *rows = *in = *out = 0;
        for (uint32_t s = 0; s < cfg->cluster.n_ps; s++) {
                void *m;
                CHECK(ps_client_status(pc, s, &m, err, sizeof(err)) == 0, "status of ps:%u: %s", s, err);
                Psfleet__V1__ShardStatus *st = m;
                CHECK(st->n_tables == cfg->model.n_embeddings, "ps:%u: %zu tables in its status", s, st->n_tables);
                CHECK(!strcmp(st->tables[e]->name, cfg->model.emb[e].name), "ps:%u: table %u is \"%s\"", s, e,
                      st->tables[e]->name);
                *rows += st->tables[e]->rows;
                *in += st->tables[e]->bytes_in;
                *out += st->tables[e]->bytes_out;
                psfleet__v1__shard_status__free_unpacked(st, NULL);
        }
}

static int by_id(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

/* rows sorted by id into a flat record array: id, then values, then slots (for comparing sets). */
static double *records(const struct ps_sparse_rows *r) {
        size_t w = 1 + (size_t)r->dim * (1 + r->n_slots);
        double *rec = malloc(r->n * w * sizeof(double) + 1);
        CHECK(rec, "out of memory");
        for (size_t i = 0; i < r->n; i++) {
                uint64_t *id = (uint64_t *)&rec[i * w];
                *id = r->ids[i];
                for (uint32_t j = 0; j < r->dim; j++) {
                        rec[i * w + 1 + j] = r->values[i * r->dim + j];
                        for (unsigned s = 0; s < r->n_slots; s++)
                                rec[i * w + 1 + (1 + s) * r->dim + j] = r->slots[s][i * r->dim + j];
                }
        }
        qsort(rec, r->n, w * sizeof(double), by_id);
        return rec;
}

int main(int argc, char **argv) {
        char err[1024];
        CHECK(argc == 2, "usage: sparse_client JOB.json");
        struct job_config *c;
        CHECK(config_load(argv[1], &c, err, sizeof(err)) == 0, "%s", err);
        cfg = c;
        CHECK(cfg->model.n_embeddings >= 1 && cfg->cluster.n_ps >= 2, "the job needs a table and 2 shards");
        struct job_layout *L;
        CHECK(job_layout_new(cfg, &L) == 0, "layout");
        rpc_global_init();
        CHECK(ps_client_new(cfg, L, "chief:0", &pc) == 0, "ps_client_new");
        printf("fingerprint %016" PRIx64 "\n", L->fingerprint);   /* for the test's own calls */
        const uint32_t e = 0, dim = cfg->model.emb[e].dim;
        struct sparse_table_opts o;
        sparse_table_opts_from_config(cfg, e, &o);
        struct sparse_table *local;
        CHECK(sparse_table_new(&o, &local) == 0, "a local table");

        uint64_t ids[N_IDS];
        struct rng r;
        rng_init(&r, 17, 0);
        for (size_t i = 0; i < N_IDS; i++)
                ids[i] = rng_next(&r);   /* distinct, for all practical purposes */
        float *got = calloc(N_IDS * dim, sizeof(float)), *want = calloc(N_IDS * dim, sizeof(float));
        float *g = calloc(N_IDS * dim, sizeof(float));
        CHECK(got && want && g, "out of memory");

        /* an uninitialized shard refuses, as it refuses a Push */
        int rc = ps_client_sparse(pc, e, NULL, 0, NULL, ids, 10, got, err, sizeof(err));
        CHECK(rc == -EAGAIN && strstr(err, "not initialized"), "before the Assign: %d %s", rc, err);
        float *zeros = calloc(L->n_params + 1, sizeof(float));
        CHECK(zeros && ps_client_assign(pc, NULL, zeros, NULL, 0, err, sizeof(err)) == 0, "assign: %s", err);

        /* a lookup: the initial rows, in the caller's order, and nothing stored */
        CHECK(ps_client_sparse_lookup(pc, e, ids, N_IDS, got, err, sizeof(err)) == 0, "lookup: %s", err);
        for (size_t i = 0; i < N_IDS; i++)
                sparse_table_init_row(local, ids[i], want + i * dim);
        CHECK(!memcmp(got, want, N_IDS * dim * sizeof(float)), "lookup: rows differ from their initial values");
        uint64_t rows, in, out;
        table_status(e, &rows, &in, &out);
        CHECK(rows == 0, "a lookup stored %" PRIu64 " rows", rows);
        CHECK(in == N_IDS * 8 && out == (uint64_t)N_IDS * dim * 4, "lookup: %" PRIu64 " bytes in, %" PRIu64 " out", in,
              out);

        /* a pull creates; then a push of every row's gradient with a pull of the same rows */
        memset(got, 0, N_IDS * dim * sizeof(float));
        CHECK(ps_client_sparse(pc, e, NULL, 0, NULL, ids, N_IDS, got, err, sizeof(err)) == 0, "pull: %s", err);
        CHECK(!memcmp(got, want, N_IDS * dim * sizeof(float)), "pull: rows differ from their initial values");
        table_status(e, &rows, &in, &out);
        CHECK(rows == N_IDS, "%" PRIu64 " rows stored after a pull of %d", rows, N_IDS);
        for (size_t i = 0; i < N_IDS * dim; i++)
                g[i] = 0.01f * (float)(i % 13) - 0.05f;
        const struct training_config *tc = &cfg->training;
        float lr = (float)(tc->sparse_learning_rate > 0 ? tc->sparse_learning_rate : optim_learning_rate(tc, 0));
        CHECK(sparse_table_pull(local, ids, N_IDS, want, true, 0) == 0 &&
                      sparse_table_push(local, ids, N_IDS, g, lr, 0) == 0 &&
                      sparse_table_pull(local, ids, N_IDS, want, true, 0) == 0,
              "the local table");
        CHECK(ps_client_sparse(pc, e, ids, N_IDS, g, ids, N_IDS, got, err, sizeof(err)) == 0, "push: %s", err);
        CHECK(!memcmp(got, want, N_IDS * dim * sizeof(float)), "push: rows differ from the same push applied here");

        /* bytes: 8 per id and 4 * dim per row, whatever the number of ids */
        uint64_t sent0, recv0, sent1, recv1;
        for (size_t n = 100; n <= 400; n += 300) {
                uint64_t rows0, in0, out0;
                table_status(e, &rows0, &in0, &out0);
                ps_client_sparse_bytes(pc, &sent0, &recv0);
                CHECK(ps_client_sparse(pc, e, ids, n, g, ids, n, got, err, sizeof(err)) == 0, "exchange: %s", err);
                ps_client_sparse_bytes(pc, &sent1, &recv1);
                table_status(e, &rows, &in, &out);
                uint64_t want_in = n * (8 + 8 + 4 * dim), want_out = n * 4 * dim;
                CHECK(sent1 - sent0 == want_in && recv1 - recv0 == want_out, "%zu ids: the client counted %" PRIu64
                      " bytes sent, %" PRIu64 " received; %" PRIu64 " and %" PRIu64 " expected", n, sent1 - sent0,
                      recv1 - recv0, want_in, want_out);
                CHECK(in - in0 == want_in && out - out0 == want_out, "%zu ids: the shards counted %" PRIu64 " bytes in, %"
                      PRIu64 " out; %" PRIu64 " and %" PRIu64 " expected", n, in - in0, out - out0, want_in, want_out);
        }

        /* export, an Assign (tables kept), an empty import (tables emptied), the import: every row and
         * slot back, each on its shard */
        struct ps_sparse_rows a, b;
        CHECK(ps_client_sparse_export(pc, e, &a, err, sizeof(err)) == 0, "export: %s", err);
        CHECK(a.n == N_IDS && a.dim == dim && a.n_slots == sparse_optimizer_n_slots(tc->sparse_optimizer),
              "export: %zu rows of dim %u with %u slots", a.n, a.dim, a.n_slots);
        CHECK(ps_client_assign(pc, NULL, zeros, NULL, 0, err, sizeof(err)) == 0, "assign: %s", err);
        table_status(e, &rows, &in, &out);
        CHECK(rows == N_IDS, "%" PRIu64 " rows after an Assign, %d before: it must leave the tables", rows, N_IDS);
        struct ps_sparse_rows none = {.dim = dim, .n_slots = a.n_slots};
        CHECK(ps_client_sparse_import(pc, NULL, e, &none, 5, err, sizeof(err)) == 0, "empty import: %s", err);
        table_status(e, &rows, &in, &out);
        CHECK(rows == 0, "%" PRIu64 " rows left after an empty import", rows);
        CHECK(ps_client_sparse_import(pc, NULL, e, &a, 5, err, sizeof(err)) == 0, "import: %s", err);
        table_status(e, &rows, &in, &out);
        CHECK(rows == N_IDS, "%" PRIu64 " rows after the import of %d", rows, N_IDS);
        CHECK(ps_client_sparse_export(pc, e, &b, err, sizeof(err)) == 0, "export: %s", err);
        CHECK(b.n == a.n, "export after import: %zu rows, %zu before", b.n, a.n);
        double *ra = records(&a), *rb = records(&b);
        CHECK(!memcmp(ra, rb, a.n * (1 + (size_t)dim * (1 + a.n_slots)) * sizeof(double)),
              "export after import: rows or slots differ");
        /* and the rows pulled are the imported ones */
        CHECK(ps_client_sparse_lookup(pc, e, ids, N_IDS, got, err, sizeof(err)) == 0, "lookup: %s", err);
        for (size_t i = 0; i < a.n; i++) {
                size_t k = 0;
                while (k < N_IDS && ids[k] != a.ids[i])
                        k++;
                CHECK(k < N_IDS && !memcmp(got + k * dim, a.values + i * dim, dim * sizeof(float)),
                      "row of id %" PRIu64 " after the import differs", a.ids[i]);
        }
        free(ra);
        free(rb);
        ps_sparse_rows_clear(&a);
        ps_sparse_rows_clear(&b);
        ps_client_free(pc);
        sparse_table_free(local);
        job_layout_free(L);
        config_free(c);
        free(got);
        free(want);
        free(g);
        free(zeros);
        printf("ok\n");
        return 0;
}
