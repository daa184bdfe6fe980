/* memplan: a psd's dense part is its placement's parts with their slots, tables come from max_rows,
 * vocab, expected_rows or nothing (unbounded), and ps.memory_limit_bytes splits what is left between
 * the tables or is refused with the figures. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "config.h"
#include "job.h"
#include "memplan.h"
#include "sparse_opts.h"
#include "sparse_tier.h"

#define JOB(ps_keys, emb) \
        "{\"job\": \"plan\", \"cluster\": {\"chief\": [\"localhost:7000\"], \"ps\": [\"localhost:7001\", " \
        "\"localhost:7002\"], \"worker\": [\"localhost:7003\"]}, \"data\": {\"format\": \"criteo\", " \
        "\"train_files\": [\"a.tsv.gz\"]}, \"training\": {\"optimizer\": \"adam\", \"batch_size\": 100}, " \
        "\"ps\": {" ps_keys "}, \"model\": {\"input\": [13], \"head\": \"logistic\", \"embeddings\": [" emb "], " \
        "\"layers\": [{\"type\": \"dense\", \"units\": 256}, {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 1}]}}"

struct fixture {
        struct job_config *c;
        struct job_layout *L;
};

static void load(struct fixture *f, const char *json)
{
        char err[512] = "";
        int r = config_load_string(json, "plan.json", &f->c, err, sizeof(err));
        if (r < 0)
                fail_msg("%s", err);
        assert_int_equal(job_layout_new(f->c, &f->L), 0);
}

static void done(struct fixture *f)
{
        job_layout_free(f->L);
        config_free(f->c);
}

static void test_dense_and_tables(void **state)
{
        struct fixture f;
        load(&f, JOB("", "{\"name\": \"a\", \"dim\": 16, \"max_rows\": 200000}, "
                         "{\"name\": \"b\", \"dim\": 8, \"vocab\": 100000}, "
                         "{\"name\": \"c\", \"dim\": 4, \"expected_rows\": 1000000}, "
                         "{\"name\": \"d\", \"dim\": 4}"));
        struct memplan_ps p[2];
        char err[512];
        uint64_t floats = 0;
        for (uint32_t s = 0; s < 2; s++) {
                assert_int_equal(memplan_ps(f.c, f.L, s, &p[s], err, sizeof(err)), 0);
                floats += p[s].dense_floats;
                /* adam: two slots */
                assert_int_equal(p[s].dense_bytes, p[s].dense_floats * 4 * 3);
                assert_int_equal(p[s].n_tables, 4);
                assert_int_equal(p[s].tables[0].from, MEMPLAN_MAX_ROWS);
                assert_int_equal(p[s].tables[0].rows, 100000);
                assert_int_equal(p[s].tables[0].max_rows, 100000);
                assert_int_equal(p[s].tables[1].from, MEMPLAN_VOCAB);
                assert_int_equal(p[s].tables[1].rows, 50000);
                assert_int_equal(p[s].tables[1].max_rows, 0);
                assert_int_equal(p[s].tables[2].from, MEMPLAN_EXPECTED);
                assert_int_equal(p[s].tables[2].rows, 500000);
                assert_int_equal(p[s].tables[3].from, MEMPLAN_UNBOUNDED);
                assert_true(p[s].unbounded);
                /* adagrad rows: value and accumulator, plus the index and records' id and touch */
                assert_int_equal(p[s].tables[0].row_bytes, 16 * 4 * 2);
                assert_true(p[s].tables[0].bytes > 100000 * (16 * 4 * 2 + 12));
                /* 1563 rows a stripe: chunks of 16..1024 rows and a 4096-slot index, at most 1.5x */
                assert_true(p[s].tables[0].bytes < 100000 * (16 * 4 * 2 + 12) * 15 / 10);
                uint64_t sum = p[s].dense_bytes + p[s].buffers + p[s].base;
                for (int e = 0; e < 4; e++)
                        sum += p[s].tables[e].bytes;
                assert_int_equal(p[s].total, sum);
        }
        assert_int_equal(floats, f.L->n_params);
        assert_int_equal(memplan_ps(f.c, f.L, 2, &p[0], err, sizeof(err)), -EINVAL);
        done(&f);
        /* a vocab past what a shard can hold is planned at the most its stripes can hold, at once */
        load(&f, JOB("", "{\"name\": \"a\", \"dim\": 1, \"vocab\": 9223372036854775807}"));
        assert_int_equal(memplan_ps(f.c, f.L, 0, &p[0], err, sizeof(err)), 0);
        assert_int_equal(p[0].tables[0].from, MEMPLAN_VOCAB);
        /* adagrad, dim 1: 20-byte records and 4-byte index slots at a load of 3/8 to 3/4 */
        assert_true(p[0].tables[0].bytes > (64ull * (3u << 29)) * 25 && p[0].tables[0].bytes < (64ull * (3u << 29)) * 31);
        assert_string_equal(memplan_rows_name(MEMPLAN_LIMIT), "memory limit");
        done(&f);
}

/* int8 answers (rpc.compression int8 or topk, or auto under TLS) keep a copy per worker of the parts
 * whose variable is compressed (at least rpc.compression_min_bytes): counted in the buffers */
static void test_answer_copies(void **state)
{
        (void)state;
        const char *emb = "{\"name\": \"a\", \"dim\": 16, \"max_rows\": 200000}";
        const char *keys[] = {"\"split_bytes\": 262144}, \"rpc\": {\"compression\": \"none\"",
                              "\"split_bytes\": 262144}, \"rpc\": {\"compression\": \"int8\"",
                              "\"split_bytes\": 262144}, \"rpc\": {\"compression\": \"int8\"",
                              "\"split_bytes\": 262144}, \"security\": {\"mode\": \"insecure\"",
                              "\"split_bytes\": 262144"};
        uint64_t buffers[5], kept[2] = {0, 0};
        for (int k = 0; k < 5; k++) {
                char json[2048];
                snprintf(json, sizeof(json),
                         "{\"job\": \"plan\", \"cluster\": {\"chief\": [\"localhost:7000\"], \"ps\": [\"localhost:7001\", "
                         "\"localhost:7002\"], \"worker\": [\"localhost:7003\", \"localhost:7004\"]}, \"data\": "
                         "{\"format\": \"criteo\", \"train_files\": [\"a.tsv.gz\"]}, \"training\": {\"batch_size\": 100%s}, "
                         "\"ps\": {%s}, \"model\": {\"input\": [13], \"head\": \"logistic\", \"embeddings\": [%s], "
                         "\"layers\": [{\"type\": \"dense\", \"units\": 256}, {\"type\": \"relu\"}, "
                         "{\"type\": \"dense\", \"units\": 1}]}}", k == 2 ? ", \"overlap_push\": true" : "", keys[k], emb);
                struct fixture f;
                load(&f, json);
                struct memplan_ps p;
                char err[512];
                assert_int_equal(memplan_ps(f.c, f.L, 0, &p, err, sizeof(err)), 0);
                buffers[k] = p.buffers;
                if (k == 0)   /* the parts of ps:0 whose variable holds 4096 bytes or more */
                        for (uint32_t i = 0; i < f.L->shard_count[0]; i++) {
                                const struct placement_part *pp = &f.L->plan->parts[f.L->shard_parts[f.L->shard_first[0] + i]];
                                const struct job_var *v = &f.L->vars[pp->var];
                                kept[v->rows * v->cols * 4 >= 4096] += (uint64_t)(pp->row_end - pp->row_begin) * v->cols;
                        }
                done(&f);
        }
        assert_true(kept[1] > 0 && kept[0] > 0);   /* the big kernel is, the small ones are not */
        assert_int_equal(buffers[1], buffers[0] + 2 * kept[1] * 4);   /* two workers, one copy each */
        assert_int_equal(buffers[2], buffers[0]);   /* overlapped pushes are answered in bfloat16 */
        assert_int_equal(buffers[3], buffers[0]);   /* auto over plain TCP on loopback: none */
        assert_int_equal(buffers[4], buffers[1]);   /* auto under TLS: int8 */
}

static void test_limit(void **state)
{
        struct fixture f;
        char err[512] = "";
        struct memplan_ps p;
        /* too small for the dense part: refused with the figures */
        load(&f, JOB("\"memory_limit_bytes\": 1000000", "{\"name\": \"a\", \"dim\": 16}"));
        assert_int_equal(memplan_ps(f.c, f.L, 0, &p, err, sizeof(err)), -E2BIG);
        assert_non_null(strstr(err, "ps.memory_limit_bytes: 1000000 is below what ps:0 needs without its tables"));
        assert_non_null(strstr(err, "dense variables with slots"));
        done(&f);
        /* 64 MiB past the rest: a small capped table takes its own, the other two split what is left */
        load(&f, JOB("\"memory_limit_bytes\": 134217728",
                     "{\"name\": \"a\", \"dim\": 16}, {\"name\": \"b\", \"dim\": 4, \"max_rows\": 20000}, "
                     "{\"name\": \"c\", \"dim\": 16, \"expected_rows\": 100000000}"));
        assert_int_equal(memplan_ps(f.c, f.L, 0, &p, err, sizeof(err)), 0);
        assert_int_equal(p.tables[1].from, MEMPLAN_MAX_ROWS);
        assert_int_equal(p.tables[1].max_rows, 10000);
        assert_int_equal(p.tables[0].from, MEMPLAN_LIMIT);
        assert_int_equal(p.tables[2].from, MEMPLAN_LIMIT);
        assert_true(p.tables[0].max_rows > 0 && p.tables[0].max_rows == p.tables[2].max_rows);
        assert_false(p.unbounded);
        assert_true(p.total <= f.c->ps.memory_limit_bytes);
        assert_true(p.total > f.c->ps.memory_limit_bytes / 100 * 98);
        done(&f);
}

/* A table with a disk tier: DRAM's part at its bound, the tier's caches in the total, the rest of
 * expected_rows on disk beside it; under a limit the caches come off the tables' share. */
static void test_disk_tier(void **state)
{
        struct fixture f;
        char err[512] = "";
        struct memplan_ps p, q;
        load(&f, JOB("", "{\"name\": \"a\", \"dim\": 16, \"max_rows\": 200000, \"expected_rows\": 10000000, "
                         "\"disk_tier\": true}"));
        assert_int_equal(memplan_ps(f.c, f.L, 0, &p, err, sizeof(err)), 0);
        const struct memplan_table *t = &p.tables[0];
        assert_true(t->disk_tier);
        assert_int_equal(t->rows, 100000);
        assert_int_equal(t->disk_rows, 5000000 - 100000);
        assert_int_equal(t->disk_bytes, t->disk_rows * (8 + 16 + 16 * 4 * 2));
        assert_int_equal(p.disk_bytes, t->disk_bytes);
        assert_true(t->tier_memory > 0);
        assert_int_equal(p.tier_memory, t->tier_memory + SPARSE_TIER_PROCESS_BYTES);
        assert_int_equal(p.total, p.dense_bytes + p.buffers + p.base + p.tier_memory + t->bytes);
        done(&f);
        load(&f, JOB("\"memory_limit_bytes\": 134217728", "{\"name\": \"a\", \"dim\": 16, \"disk_tier\": true}"));
        assert_int_equal(memplan_ps(f.c, f.L, 0, &p, err, sizeof(err)), 0);
        done(&f);
        load(&f, JOB("\"memory_limit_bytes\": 134217728", "{\"name\": \"a\", \"dim\": 16, \"max_rows\": 100000000}"));
        assert_int_equal(memplan_ps(f.c, f.L, 0, &q, err, sizeof(err)), 0);
        assert_true(p.tables[0].max_rows < q.tables[0].max_rows);
        assert_true(p.total <= f.c->ps.memory_limit_bytes);
        done(&f);
}

UNIT_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_dense_and_tables), cmocka_unit_test(test_answer_copies),
               cmocka_unit_test(test_limit),
               cmocka_unit_test(test_disk_tier))
