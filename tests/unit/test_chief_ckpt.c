/* A job's checkpoint store: saving with rotation, loading the newest usable one, corrupt and missing
 * files skipped and moved aside, a different model refused, and the repairs after a crash. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include "backend.h"
#include "chief_ckpt.h"
#include "scratch_dir.h"

#include "chief_db.h"
#include "config.h"
#include "job.h"
#include "log.h"
#include "model.h"
#include "optim.h"
#include "sparse_table.h"
#include "util.h"


struct job {
        struct job_config *cfg;
        struct backend *be;
        struct model *m;
        struct job_layout *L;
};

static void job_new(struct job *j, unsigned units, const char *optimizer) {
        char json[1024], err[512];
        snprintf(json, sizeof(json),
                 "{\"job\": \"t\", \"cluster\": {\"chief\": [\"127.0.0.1:1\"], \"ps\": [\"127.0.0.1:2\", \"127.0.0.1:3\"],"
                 " \"worker\": [\"127.0.0.1:4\"]},"
                 " \"model\": {\"input\": [4], \"layers\": [{\"type\": \"dense\", \"units\": %u}, {\"type\": \"relu\"},"
                 " {\"type\": \"dense\", \"units\": 2}]},"
                 " \"training\": {\"optimizer\": \"%s\"}}",
                 units, optimizer);
        int r = config_load_string(json, "test.json", &j->cfg, err, sizeof(err));
        if (r < 0)
                fail_msg("%s", err);
        assert_int_equal(backend_cpu_new(1, &j->be), 0);
        assert_int_equal(model_new(&j->cfg->model, j->be, 1, &j->m), 0);
        assert_int_equal(job_layout_new(j->cfg, &j->L), 0);
}

static void job_free(struct job *j) {
        job_layout_free(j->L);
        model_free(j->m);
        backend_free(j->be);
        config_free(j->cfg);
}

struct fx {
        struct job job;
        struct chief_db *db;
        struct chief_ckpt *s;
        size_t n;                       /* floats per block */
        float *p, *slots[1], *q, *qslots[1];
        char ckdir[sizeof(scratch_dir) + 16];
};

static int setup(void **state) {
        if (scratch_dir_make("chief-ckpt") < 0)
                return -1;
        log_set_max_level(LOG_ERR);     /* the store logs its repairs; the assertions say what matters */
        struct fx *f = calloc(1, sizeof(*f));
        job_new(&f->job, 3, "momentum");
        char dbp[sizeof(scratch_dir) + 16];
        snprintf(dbp, sizeof(dbp), "%s/chief.db", scratch_dir);
        assert_int_equal(chief_db_open(dbp, &f->db), 0);
        snprintf(f->ckdir, sizeof(f->ckdir), "%s/ck", scratch_dir);
        struct chief_ckpt_config cc = {.dir = f->ckdir, .L = f->job.L, .job = "t", .fingerprint = 0x1234, .keep = 2, .keep_corrupt = 3};
        char err[256];
        assert_int_equal(chief_ckpt_new(f->db, &cc, &f->s, err, sizeof(err)), 0);
        f->n = f->job.L->n_params;
        f->p = calloc(f->n, sizeof(float));
        f->slots[0] = calloc(f->n, sizeof(float));
        f->q = calloc(f->n, sizeof(float));
        f->qslots[0] = calloc(f->n, sizeof(float));
        *state = f;
        return 0;
}

static int teardown(void **state) {
        struct fx *f = *state;
        chief_ckpt_free(f->s);
        chief_db_close(f->db);
        job_free(&f->job);
        free(f->p);
        free(f->slots[0]);
        free(f->q);
        free(f->qslots[0]);
        free(f);
        return scratch_dir_remove(state);
}

static void fill(struct fx *f, float base) {
        for (size_t i = 0; i < f->n; i++) {
                f->p[i] = base + (float)i;
                f->slots[0][i] = -base - (float)i;
        }
}

static void save_step(struct fx *f, uint64_t step, struct chief_db_checkpoint *row) {
        struct chief_db_checkpoint stats = {.loss = 0.5f, .eval_step = step, .eval_accuracy = 0.75f,
                                            .eval_loss = 0.6f, .trigger = "steps"};
        char err[256];
        fill(f, (float)step);
        int r = chief_ckpt_save(f->s, f->p, f->slots, step, &stats, row, err, sizeof(err));
        if (r < 0)
                fail_msg("%s", err);
}

static size_t n_rows(struct fx *f) {
        struct chief_db_checkpoint *rows;
        size_t n;
        assert_int_equal(chief_db_list_checkpoints(f->db, &rows, &n), 0);
        free(rows);
        return n;
}

static void flip_byte(const char *path, long from_end) {
        FILE *fp = fopen(path, "r+b");
        assert_non_null(fp);
        fseek(fp, -from_end, SEEK_END);
        int c = fgetc(fp);
        fseek(fp, -from_end, SEEK_END);
        fputc(c ^ 0x40, fp);
        fclose(fp);
}

static void test_save_rotate_load(void **state) {
        struct fx *f = *state;
        struct chief_db_checkpoint r10, r20, r30, got;
        save_step(f, 10, &r10);
        assert_non_null(strstr(r10.path, "/ck/ckpt-0000000010.safetensors"));
        assert_int_equal(strncmp(r10.checksum, "crc32c:", 7), 0);
        assert_true(r10.bytes > f->n * 8);
        save_step(f, 20, &r20);
        save_step(f, 30, &r30);
        assert_int_equal(n_rows(f), 2);             /* keep = 2 */
        assert_int_equal(access(r10.path, F_OK), -1);
        assert_int_equal(access(r20.path, F_OK), 0);
        uint32_t count;
        assert_int_equal(chief_ckpt_newest(f->s, &got, &count), 0);
        assert_int_equal(got.global_step, 30);
        assert_int_equal(count, 2);
        assert_true(got.eval_accuracy == 0.75f && got.loss == 0.5f);
        assert_string_equal(got.trigger, "steps");

        bool slots_loaded;
        char err[512];
        assert_int_equal(chief_ckpt_load_latest(f->s, f->q, f->qslots, &slots_loaded, &got, err, sizeof(err)), 1);
        assert_int_equal(got.global_step, 30);
        assert_true(slots_loaded);
        fill(f, 30);
        assert_memory_equal(f->q, f->p, f->n * sizeof(float));
        assert_memory_equal(f->qslots[0], f->slots[0], f->n * sizeof(float));

        /* the newest is corrupted: the one before is used, the bad file moved aside and forgotten */
        flip_byte(r30.path, 5);
        assert_int_equal(chief_ckpt_load_latest(f->s, f->q, f->qslots, &slots_loaded, &got, err, sizeof(err)), 1);
        assert_int_equal(got.global_step, 20);
        fill(f, 20);
        assert_memory_equal(f->q, f->p, f->n * sizeof(float));
        assert_int_equal(n_rows(f), 1);
        assert_int_equal(access(r30.path, F_OK), -1);
        char aside[1100];
        snprintf(aside, sizeof(aside), "%s.corrupt", r30.path);
        assert_int_equal(access(aside, F_OK), 0);

        /* missing: forgotten; nothing usable left */
        unlink(r20.path);
        assert_int_equal(chief_ckpt_load_latest(f->s, f->q, f->qslots, &slots_loaded, &got, err, sizeof(err)), 0);
        assert_int_equal(n_rows(f), 0);
        assert_int_equal(chief_ckpt_newest(f->s, &got, &count), -ENOENT);
        assert_int_equal(count, 0);
}

static void test_same_step_replaced(void **state) {
        struct fx *f = *state;
        struct chief_db_checkpoint a, b, got;
        save_step(f, 5, &a);
        save_step(f, 5, &b);
        assert_int_equal(n_rows(f), 1);
        assert_string_equal(a.path, b.path);
        bool sl;
        char err[256];
        assert_int_equal(chief_ckpt_load(f->s, &b, f->q, f->qslots, &sl, err, sizeof(err)), 0);
        assert_int_equal(chief_ckpt_newest(f->s, &got, NULL), 0);
        assert_string_equal(got.checksum, b.checksum);
}

static void test_different_model_refused(void **state) {
        struct fx *f = *state;
        struct chief_db_checkpoint row, got;
        save_step(f, 7, &row);
        struct job other;
        job_new(&other, 5, "momentum");
        struct chief_ckpt_config cc = {.dir = f->ckdir, .L = other.L, .job = "t", .keep = 2};
        struct chief_ckpt *s2;
        char err[512];
        assert_int_equal(chief_ckpt_new(f->db, &cc, &s2, err, sizeof(err)), 0);
        float *q = calloc(other.L->n_params, sizeof(float)), *qs[1] = {calloc(other.L->n_params, sizeof(float))};
        bool sl;
        assert_int_equal(chief_ckpt_load_latest(s2, q, qs, &sl, &got, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "holds a different model"));
        assert_non_null(strstr(err, "dense0/kernel"));
        assert_int_equal(n_rows(f), 1);                 /* not forgotten: it is not corrupt */
        assert_int_equal(access(row.path, F_OK), 0);
        free(q);
        free(qs[0]);
        chief_ckpt_free(s2);
        job_free(&other);
}

static void test_other_optimizer(void **state) {
        struct fx *f = *state;
        struct chief_db_checkpoint row, got;
        save_step(f, 9, &row);
        struct job other;
        job_new(&other, 3, "adam");
        struct chief_ckpt_config cc = {.dir = f->ckdir, .L = other.L, .job = "t", .keep = 2};
        struct chief_ckpt *s2;
        char err[512];
        assert_int_equal(chief_ckpt_new(f->db, &cc, &s2, err, sizeof(err)), 0);
        float *q = calloc(other.L->n_params, sizeof(float));
        float *qs[2] = {calloc(other.L->n_params, sizeof(float)), calloc(other.L->n_params, sizeof(float))};
        bool sl = true;
        assert_int_equal(chief_ckpt_load_latest(s2, q, qs, &sl, &got, err, sizeof(err)), 1);
        assert_false(sl);                               /* variables restored, slots start afresh */
        fill(f, 9);
        assert_memory_equal(q, f->p, f->n * sizeof(float));
        free(q);
        free(qs[0]);
        free(qs[1]);
        chief_ckpt_free(s2);
        job_free(&other);
}

static void touch(const char *path) {
        assert_int_equal(write_file_atomic(path, "partial", 7), 0);
}

static void test_reconcile(void **state) {
        struct fx *f = *state;
        struct chief_db_checkpoint a, b;
        save_step(f, 100, &a);
        save_step(f, 200, &b);
        char tmp[sizeof(f->ckdir) + 48], orphan[sizeof(tmp)], other[sizeof(tmp)];
        snprintf(tmp, sizeof(tmp), "%s/.ckpt-0000000300.safetensors.tmp", f->ckdir);
        snprintf(orphan, sizeof(orphan), "%s/ckpt-0000000400.safetensors", f->ckdir);
        snprintf(other, sizeof(other), "%s/notes.txt", f->ckdir);
        touch(tmp);       /* killed before the rename */
        touch(orphan);    /* killed between the rename and the record */
        touch(other);     /* not ours: left alone */
        unlink(a.path);   /* recorded, file gone */
        assert_int_equal(chief_ckpt_reconcile(f->s), 3);
        assert_int_equal(access(tmp, F_OK), -1);
        assert_int_equal(access(orphan, F_OK), -1);
        assert_int_equal(access(other, F_OK), 0);
        assert_int_equal(n_rows(f), 1);
        assert_int_equal(access(b.path, F_OK), 0);
        assert_int_equal(chief_ckpt_reconcile(f->s), 0);   /* nothing left to repair */
}

static void test_delete(void **state) {
        struct fx *f = *state;
        struct chief_db_checkpoint a, gone;
        char err[256];
        save_step(f, 11, &a);
        assert_int_equal(chief_ckpt_delete(f->s, 12, &gone, err, sizeof(err)), -ENOENT);
        assert_non_null(strstr(err, "no checkpoint of global_step 12"));
        assert_int_equal(chief_ckpt_delete(f->s, 11, &gone, err, sizeof(err)), 0);
        assert_string_equal(gone.path, a.path);
        assert_int_equal(access(a.path, F_OK), -1);
        assert_int_equal(n_rows(f), 0);
}

/* At most keep_corrupt (3) ".corrupt" files are kept, the newest by mtime; other files are left alone. */
static void test_keep_corrupt(void **state) {
        struct fx *f = *state;
        char path[sizeof(f->ckdir) + 48];
        for (int i = 0; i < 5; i++) {
                snprintf(path, sizeof(path), "%s/ckpt-%010d.safetensors.corrupt", f->ckdir, i);
                FILE *fp = fopen(path, "w");
                assert_non_null(fp);
                fclose(fp);
                struct timespec ts[2] = {{1000 + i, 0}, {1000 + i, 0}};   /* file i is the i-th oldest */
                assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
        }
        snprintf(path, sizeof(path), "%s/notes.txt", f->ckdir);
        FILE *fp = fopen(path, "w");
        assert_non_null(fp);
        fclose(fp);
        assert_int_equal(chief_ckpt_reconcile(f->s), 2);   /* the two oldest removed */
        for (int i = 0; i < 5; i++) {
                snprintf(path, sizeof(path), "%s/ckpt-%010d.safetensors.corrupt", f->ckdir, i);
                assert_int_equal(access(path, F_OK), i < 2 ? -1 : 0);
        }
        snprintf(path, sizeof(path), "%s/notes.txt", f->ckdir);
        assert_int_equal(access(path, F_OK), 0);
        assert_int_equal(chief_ckpt_reconcile(f->s), 0);   /* nothing more to do */
}

/* A store of the fixture's job with one embedding table "cat" of dim, kept by optimizer so (and its
 * checkpoints in their own directory). */
static struct chief_ckpt *table_store(struct fx *f, struct model_spec *spec, uint32_t dim, enum sparse_optimizer so) {
        *spec = f->job.cfg->model;
        spec->n_embeddings = 1;
        memset(&spec->emb[0], 0, sizeof(spec->emb[0]));
        snprintf(spec->emb[0].name, sizeof(spec->emb[0].name), "cat");
        spec->emb[0].dim = dim;
        char d[sizeof(scratch_dir) + 16], err[256];
        snprintf(d, sizeof(d), "%s/tables", scratch_dir);
        struct chief_ckpt_config cc = {.dir = d, .L = f->job.L, .model = spec, .sparse_optimizer = so, .job = "t",
                                       .fingerprint = 0x1234, .keep = 2, .keep_corrupt = 3};
        struct chief_ckpt *s;
        assert_int_equal(chief_ckpt_new(f->db, &cc, &s, err, sizeof(err)), 0);
        return s;
}

/* ---- a restore streamed into a table that stands in for a shard ---- */

/* What psd's SparseImport does with each part (services/psd/sparse_rpc.c): empty the table with clear,
 * drop the evicted ids, store the rows over, count the ids stored already. */
struct shard_sink {
        struct sparse_table *t;
        size_t parts, max_rows;         /* parts received; the most rows one part carried */
};

static int shard_part(void *ud, uint32_t e, const struct ps_sparse_rows *rows, const struct ps_sparse_import_opts *o,
                      char *err, size_t errlen) {
        struct shard_sink *k = ud;
        (void)err;
        (void)errlen;
        assert_int_equal(e, 0);
        if (!k->t) {
                struct sparse_table_opts so = {.dim = rows->dim, .optimizer = rows->n_slots == 2 ? SPARSE_FTRL
                                                                                                 : SPARSE_ADAGRAD,
                                               .init_stddev = 0.1, .seed = 5, .initial_accumulator = 0.1};
                assert_int_equal(sparse_table_new(&so, &k->t), 0);
        }
        if (o->clear)
                sparse_table_clear(k->t);
        size_t dropped = sparse_table_delete(k->t, o->evicted, o->n_evicted);
        if (o->dropped)
                *o->dropped += dropped;
        float *slots = malloc(rows->n * rows->dim * rows->n_slots * sizeof(float) + 1);
        for (unsigned sl = 0; rows->n && sl < rows->n_slots; sl++)
                memcpy(slots + sl * rows->n * rows->dim, rows->slots[sl], rows->n * rows->dim * sizeof(float));
        int r = rows->n ? sparse_table_import(k->t, rows->ids, rows->n, rows->values, slots, 1) : 0;
        free(slots);
        assert_true(r >= 0);
        if (o->replaced)
                *o->replaced += (uint64_t)r;
        k->parts++;
        if (rows->n > k->max_rows)
                k->max_rows = rows->n;
        return 0;
}

static void snapshot(struct sparse_table *t, struct ps_sparse_rows *out);
static void assert_same_rows(struct ps_sparse_rows *a, struct ps_sparse_rows *b);

/* chief_ckpt_restore_latest into a stand-in shard; on 1 its table (dim 3, one slot) into got[0]. */
static int restore_rows(struct chief_ckpt *s, float *q, float *const *qslots, bool *sl, struct ps_sparse_rows *got,
                        struct chief_db_checkpoint *back, char *err, size_t errlen) {
        struct shard_sink k = {0};
        struct chief_table_sink sink = {.part = shard_part, .ud = &k};
        int r = chief_ckpt_restore_latest(s, q, qslots, sl, &sink, back, err, errlen);
        if (r == 1 && k.t)
                snapshot(k.t, &got[0]);
        sparse_table_free(k.t);
        return r;
}

/* Embedding tables: written beside the variables as emb/<name>/ids (U64), emb/<name> and its slots,
 * read back equal; a store whose table differs in dim or slots, or that has no table, refuses the file
 * naming the tensor, and leaves its tables untouched. */
static void test_tables(void **state) {
        struct fx *f = *state;
        struct model_spec spec, spec4, spec_ftrl;
        struct chief_ckpt *s = table_store(f, &spec, 3, SPARSE_ADAGRAD);
        uint64_t ids[5] = {9, 1ull << 40, 3, 77, UINT64_MAX};
        float vals[15], acc[15];
        for (int i = 0; i < 15; i++) {
                vals[i] = 0.5f * (float)i - 2;
                acc[i] = 0.1f + (float)i;
        }
        struct ps_sparse_rows t = {.n = 5, .dim = 3, .n_slots = 1, .ids = ids, .values = vals, .slots = {acc}};
        struct chief_db_checkpoint stats = {.eval_accuracy = -1, .eval_loss = -1}, row;
        char err[600];
        fill(f, 1);
        snprintf(stats.trigger, sizeof(stats.trigger), "steps");
        assert_int_equal(chief_ckpt_save_tables(s, f->p, f->slots, &t, 10, &stats, &row, err, sizeof(err)), 0);

        struct ps_sparse_rows got[MODEL_MAX_EMBEDDINGS] = {0};
        bool sl;
        struct chief_db_checkpoint back;
        assert_int_equal(restore_rows(s, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), 1);
        assert_int_equal(back.global_step, 10);
        assert_memory_equal(f->q, f->p, f->n * sizeof(float));
        assert_int_equal(got[0].n, 5);
        assert_int_equal(got[0].dim, 3);
        assert_int_equal(got[0].n_slots, 1);
        struct ps_sparse_rows want = {.n = 5, .dim = 3, .n_slots = 1, .ids = malloc(sizeof(ids)),
                                      .values = malloc(sizeof(vals)), .slots = {malloc(sizeof(acc))}};
        memcpy(want.ids, ids, sizeof(ids));
        memcpy(want.values, vals, sizeof(vals));
        memcpy(want.slots[0], acc, sizeof(acc));
        assert_same_rows(&got[0], &want);
        ps_sparse_rows_clear(&want);
        ps_sparse_rows_clear(&got[0]);
        chief_ckpt_free(s);

        /* another dim: the rows' tensor named */
        s = table_store(f, &spec4, 4, SPARSE_ADAGRAD);
        assert_int_equal(restore_rows(s, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "tensor \"emb/cat\" is not F32 [5, 4]"));
        assert_null(got[0].ids);
        chief_ckpt_free(s);
        /* another sparse optimizer: the slot it does not keep named */
        s = table_store(f, &spec_ftrl, 3, SPARSE_FTRL);
        assert_int_equal(restore_rows(s, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "emb/cat/accumulator"));
        chief_ckpt_free(s);
        /* a model without tables: the ids named */
        s = table_store(f, &spec, 3, SPARSE_ADAGRAD);
        spec.n_embeddings = 0;
        assert_int_equal(restore_rows(s, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "emb/cat"));
        chief_ckpt_free(s);
        /* and the file is still the checkpoint of a model that has the table */
        spec.n_embeddings = 1;
        s = table_store(f, &spec, 3, SPARSE_ADAGRAD);
        assert_int_equal(restore_rows(s, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), 1);
        ps_sparse_rows_clear(&got[0]);
        /* a table that names a row twice is a corrupt file (psd would refuse to import it): set aside, and
         * the previous checkpoint restored */
        ids[2] = 9;
        assert_int_equal(chief_ckpt_save_tables(s, f->p, f->slots, &t, 20, &stats, &row, err, sizeof(err)), 0);
        assert_int_equal(restore_rows(s, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), 1);
        assert_int_equal(back.global_step, 10);
        assert_int_equal(got[0].n, 5);   /* 3 is back, as the checkpoint of 10 holds it */
        char aside[sizeof(row.path) + 16];
        snprintf(aside, sizeof(aside), "%s.corrupt", row.path);
        assert_int_equal(access(aside, F_OK), 0);
        ps_sparse_rows_clear(&got[0]);
        chief_ckpt_free(s);
}

/* ---- incremental checkpoints ---- */

/* A table's rows sorted by id (for comparing two restores bit for bit). */
static void sort_rows(struct ps_sparse_rows *r) {
        for (size_t i = 1; i < r->n; i++)
                for (size_t j = i; j > 0 && r->ids[j - 1] > r->ids[j]; j--) {
                        uint64_t t = r->ids[j];
                        r->ids[j] = r->ids[j - 1];
                        r->ids[j - 1] = t;
                        for (unsigned sl = 0; sl <= r->n_slots; sl++) {
                                float *a = sl ? r->slots[sl - 1] : r->values, tmp[16];
                                memcpy(tmp, a + j * r->dim, r->dim * sizeof(float));
                                memcpy(a + j * r->dim, a + (j - 1) * r->dim, r->dim * sizeof(float));
                                memcpy(a + (j - 1) * r->dim, tmp, r->dim * sizeof(float));
                        }
                }
}

static void assert_same_rows(struct ps_sparse_rows *a, struct ps_sparse_rows *b) {
        sort_rows(a);
        sort_rows(b);
        assert_int_equal(a->n, b->n);
        assert_memory_equal(a->ids, b->ids, a->n * sizeof(uint64_t));
        assert_memory_equal(a->values, b->values, a->n * a->dim * sizeof(float));
        for (unsigned sl = 0; sl < a->n_slots; sl++)
                assert_memory_equal(a->slots[sl], b->slots[sl], a->n * a->dim * sizeof(float));
}

/* Walks t as psd's SparseExport does for a checkpoint, in pages of 7 rows, into w. */
static void walk_into(struct sparse_table *t, struct chief_ckpt_writing *w, bool incremental) {
        enum { PAGE = 7, DIM = 3 };
        uint64_t ids[PAGE], cur = 0;
        float vals[PAGE * DIM], acc[PAGE * DIM];
        char err[256];
        for (size_t n; (n = sparse_table_export_changes(t, &cur, PAGE, ids, vals, acc, incremental, true));) {
                struct ps_sparse_rows pg = {.n = n, .dim = DIM, .n_slots = 1, .ids = ids, .values = vals, .slots = {acc}};
                /* slot-major with max = PAGE rows: slot 0 starts at acc, as the page's n rows need */
                assert_int_equal(chief_ckpt_put_rows(w, 0, &pg, err, sizeof(err)), 0);
        }
        uint64_t *gone = NULL;
        size_t n_gone = 0;
        assert_int_equal(sparse_table_take_evicted(t, &gone, &n_gone), 0);
        if (incremental)
                assert_int_equal(chief_ckpt_put_evicted(w, 0, gone, n_gone, err, sizeof(err)), 0);
        free(gone);
}

static void save_walk(struct fx *f, struct chief_ckpt *s, struct sparse_table *t, uint64_t step,
                      const struct chief_db_checkpoint *parent, struct chief_db_checkpoint *row) {
        struct chief_db_checkpoint stats = {.eval_accuracy = -1, .eval_loss = -1, .trigger = "steps"};
        struct chief_ckpt_writing *w;
        char err[600];
        fill(f, (float)step);
        assert_int_equal(chief_ckpt_begin(s, f->p, f->slots, true, step, parent, &w, err, sizeof(err)), 0);
        walk_into(t, w, parent != NULL);
        if (chief_ckpt_commit(w, &stats, row, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        assert_int_equal(row->incremental, parent != NULL);
}

/* The whole table as it stands, not cleaning its marks. */
static void snapshot(struct sparse_table *t, struct ps_sparse_rows *out) {
        size_t n = sparse_table_rows(t);
        *out = (struct ps_sparse_rows){.n = n, .dim = 3, .n_slots = 1, .ids = malloc(n * 8 + 8),
                                       .values = malloc(n * 12 + 12), .slots = {malloc(n * 12 + 12)}};
        uint64_t cur = 0;
        float *acc = malloc(n * 12 + 12);
        assert_int_equal(sparse_table_export(t, &cur, n, out->ids, out->values, acc), n);
        memcpy(out->slots[0], acc, n * 12);
        free(acc);
}

static void train(struct sparse_table *t, uint64_t first, uint64_t n, uint64_t step) {
        float g[3] = {0.25f, -0.5f, (float)step * 0.01f};
        for (uint64_t id = first; id < first + n; id++)
                assert_int_equal(sparse_table_push(t, &id, 1, g, 0.1f, step), 0);
}

/* A full checkpoint at 10, increments at 20 and 30 (rows changed, made, evicted and made again)
 * restore to exactly the rows of a full checkpoint at 30, bit for bit; then a broken link: the
 * increment at 20 corrupt restores the chain to 10 (its rows as they were), 20 set aside, 30 forgotten;
 * and an increment whose parent is not recorded is forgotten. */
static void test_incremental_chain(void **state) {
        struct fx *f = *state;
        struct model_spec spec;
        struct chief_ckpt *s = table_store(f, &spec, 3, SPARSE_ADAGRAD);
        struct sparse_table_opts o = {.dim = 3, .optimizer = SPARSE_ADAGRAD, .init_stddev = 0.1, .seed = 5,
                                      .initial_accumulator = 0.1};
        struct sparse_table *t;
        assert_int_equal(sparse_table_new(&o, &t), 0);
        sparse_table_track(t, true);
        struct chief_db_checkpoint r10, r20, r30, back;
        struct ps_sparse_rows at10, full30, got[MODEL_MAX_EMBEDDINGS] = {0};
        char err[600];
        bool sl;

        train(t, 0, 200, 1);
        snapshot(t, &at10);
        save_walk(f, s, t, 10, NULL, &r10);
        train(t, 50, 10, 12);        /* changed */
        train(t, 300, 10, 12);       /* made */
        assert_int_equal(sparse_table_evict(t, 14, 2), 190);   /* all but the 20 touched at 12 */
        train(t, 0, 5, 15);          /* evicted and made again */
        save_walk(f, s, t, 20, &r10, &r20);
        train(t, 300, 3, 25);
        assert_int_equal(sparse_table_evict(t, 40, 20), 22);   /* those touched at 12 and 15 but 300..302 */
        train(t, 1000, 4, 26);
        save_walk(f, s, t, 30, &r20, &r30);
        assert_int_equal(r30.parent_step, 20);
        assert_true(r20.bytes < r10.bytes);

        /* the same rows through a full checkpoint at 30, in a store of its own */
        struct chief_db *db2;
        char dbp[sizeof(scratch_dir) + 32], d2[sizeof(scratch_dir) + 32];
        snprintf(dbp, sizeof(dbp), "%s/full.db", scratch_dir);
        snprintf(d2, sizeof(d2), "%s/full", scratch_dir);
        assert_int_equal(chief_db_open(dbp, &db2), 0);
        struct chief_ckpt_config cc = {.dir = d2, .L = f->job.L, .model = &spec, .sparse_optimizer = SPARSE_ADAGRAD,
                                       .job = "t", .fingerprint = 0x1234, .keep = 2, .keep_corrupt = 3};
        struct chief_ckpt *s2;
        struct chief_db_checkpoint f30;
        assert_int_equal(chief_ckpt_new(db2, &cc, &s2, err, sizeof(err)), 0);
        save_walk(f, s2, t, 30, NULL, &f30);
        assert_int_equal(restore_rows(s2, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), 1);
        full30 = got[0];
        got[0] = (struct ps_sparse_rows){0};
        assert_int_equal(full30.n, 7);   /* 300..302 and 1000..1003 */

        assert_int_equal(restore_rows(s, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), 1);
        assert_int_equal(back.global_step, 30);
        fill(f, 30);
        assert_memory_equal(f->q, f->p, f->n * sizeof(float));
        assert_true(sl);
        assert_same_rows(&got[0], &full30);
        ps_sparse_rows_clear(&got[0]);

        /* read as psfleet export reads a step: the chain resolved, the same rows */
        memset(f->q, 0, f->n * sizeof(float));
        assert_int_equal(chief_ckpt_read_step(s, 30, f->q, got, &back, err, sizeof(err)), 0);
        assert_int_equal(back.global_step, 30);
        assert_memory_equal(f->q, f->p, f->n * sizeof(float));
        assert_same_rows(&got[0], &full30);
        ps_sparse_rows_clear(&got[0]);
        assert_int_equal(chief_ckpt_read_step(s, 10, f->q, got, &back, err, sizeof(err)), 0);
        assert_same_rows(&got[0], &at10);
        ps_sparse_rows_clear(&got[0]);
        assert_int_equal(chief_ckpt_read_step(s, 25, f->q, got, &back, err, sizeof(err)), -ENOENT);
        assert_non_null(strstr(err, "global_step 25"));

        /* the evaluator's read of the chain (rows newest first, as ListCheckpoints gives them): the same
         * values; the chain of 20 alone; a link not listed */
        const struct chief_db_checkpoint listed[] = {r30, r20, r10}, gap[] = {r30, r10};
        memset(f->q, 0, f->n * sizeof(float));
        assert_int_equal(chief_ckpt_read_chain(s, listed, 3, 0, f->q, got, err, sizeof(err)), 0);
        fill(f, 30);
        assert_memory_equal(f->q, f->p, f->n * sizeof(float));
        assert_same_rows(&got[0], &full30);
        ps_sparse_rows_clear(&got[0]);
        assert_int_equal(chief_ckpt_read_chain(s, listed, 3, 1, f->q, NULL, err, sizeof(err)), 0);
        fill(f, 20);
        assert_memory_equal(f->q, f->p, f->n * sizeof(float));
        assert_int_equal(chief_ckpt_read_chain(s, gap, 2, 0, f->q, got, err, sizeof(err)), -ENOENT);
        assert_non_null(strstr(err, "incremental on global_step 20, which is not recorded"));

        /* a broken link: 20 corrupt; read as export reads it, the error names it and nothing is repaired */
        flip_byte(r20.path, 5);
        assert_int_equal(chief_ckpt_read_step(s, 30, f->q, got, &back, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, r20.path));
        assert_null(got[0].ids);
        struct chief_db_checkpoint kept;
        uint32_t n_kept;
        assert_int_equal(chief_ckpt_newest(s, &kept, &n_kept), 0);
        assert_int_equal(n_kept, 3);
        assert_int_equal(access(r20.path, F_OK), 0);
        /* and as the evaluator reads it */
        assert_int_equal(chief_ckpt_read_chain(s, listed, 3, 0, f->q, got, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, r20.path));
        assert_null(got[0].ids);
        assert_int_equal(access(r20.path, F_OK), 0);
        assert_int_equal(access(r30.path, F_OK), 0);
        /* as a restore reads it: the chain restores to 10, as the table was then */
        assert_int_equal(restore_rows(s, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), 1);
        assert_int_equal(back.global_step, 10);
        fill(f, 10);
        assert_memory_equal(f->q, f->p, f->n * sizeof(float));
        assert_same_rows(&got[0], &at10);
        ps_sparse_rows_clear(&got[0]);
        char aside[sizeof(r20.path) + 16];
        snprintf(aside, sizeof(aside), "%s.corrupt", r20.path);
        assert_int_equal(access(aside, F_OK), 0);
        assert_int_equal(access(r30.path, F_OK), -1);
        struct chief_db_checkpoint newest;
        uint32_t count;
        assert_int_equal(chief_ckpt_newest(s, &newest, &count), 0);
        assert_int_equal(count, 1);
        assert_int_equal(newest.global_step, 10);

        /* a chain pointing nowhere: an increment on a step not recorded is forgotten, 10 restored */
        save_walk(f, s, t, 40, &r30, &back);
        assert_int_equal(restore_rows(s, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), 1);
        assert_int_equal(back.global_step, 10);
        ps_sparse_rows_clear(&got[0]);
        assert_int_equal(chief_ckpt_newest(s, &newest, &count), 0);
        assert_int_equal(count, 1);

        ps_sparse_rows_clear(&at10);
        ps_sparse_rows_clear(&full30);
        chief_ckpt_free(s2);
        chief_db_close(db2);
        chief_ckpt_free(s);
        sparse_table_free(t);
}

/* An increment that names an id twice (its checksum right: no chiefd writes one) is found out while it
 * streams, by the stand-in shard's count of ids stored already: it is set aside as corrupt and the
 * chain restored again to the link before it, its rows as they were. */
static void test_increment_twice(void **state) {
        struct fx *f = *state;
        struct model_spec spec;
        struct chief_ckpt *s = table_store(f, &spec, 3, SPARSE_ADAGRAD);
        struct sparse_table_opts o = {.dim = 3, .optimizer = SPARSE_ADAGRAD, .init_stddev = 0.1, .seed = 5,
                                      .initial_accumulator = 0.1};
        struct sparse_table *t;
        assert_int_equal(sparse_table_new(&o, &t), 0);
        sparse_table_track(t, true);
        train(t, 0, 50, 1);
        struct chief_db_checkpoint r10, r20, back;
        struct ps_sparse_rows at10, got[MODEL_MAX_EMBEDDINGS] = {0};
        snapshot(t, &at10);
        save_walk(f, s, t, 10, NULL, &r10);
        uint64_t ids[3] = {7, 1000, 7};
        float vals[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, acc[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
        struct ps_sparse_rows pg = {.n = 3, .dim = 3, .n_slots = 1, .ids = ids, .values = vals, .slots = {acc}};
        struct chief_db_checkpoint stats = {.eval_accuracy = -1, .eval_loss = -1, .trigger = "steps"};
        struct chief_ckpt_writing *w;
        char err[600];
        fill(f, 20);
        assert_int_equal(chief_ckpt_begin(s, f->p, f->slots, true, 20, &r10, &w, err, sizeof(err)), 0);
        assert_int_equal(chief_ckpt_put_rows(w, 0, &pg, err, sizeof(err)), 0);
        assert_int_equal(chief_ckpt_put_evicted(w, 0, NULL, 0, err, sizeof(err)), 0);
        assert_int_equal(chief_ckpt_commit(w, &stats, &r20, err, sizeof(err)), 0);
        assert_true(r20.incremental);

        bool sl;
        assert_int_equal(restore_rows(s, f->q, f->qslots, &sl, got, &back, err, sizeof(err)), 1);
        assert_int_equal(back.global_step, 10);
        fill(f, 10);
        assert_memory_equal(f->q, f->p, f->n * sizeof(float));
        assert_same_rows(&got[0], &at10);
        char aside[sizeof(r20.path) + 16];
        snprintf(aside, sizeof(aside), "%s.corrupt", r20.path);
        assert_int_equal(access(aside, F_OK), 0);
        struct chief_db_checkpoint newest;
        uint32_t count;
        assert_int_equal(chief_ckpt_newest(s, &newest, &count), 0);
        assert_int_equal(count, 1);
        ps_sparse_rows_clear(&got[0]);
        ps_sparse_rows_clear(&at10);
        chief_ckpt_free(s);
        sparse_table_free(t);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test_setup_teardown(test_incremental_chain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_increment_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_rotate_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tables, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_step_replaced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_different_model_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_optimizer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconcile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keep_corrupt, setup, teardown))
