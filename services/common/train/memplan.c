/* The memory plan of a psd: see memplan.h. */
#include "memplan.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "optim.h"
#include "sparse_opts.h"
#include "sparse_tier.h"
#include "util.h"

const char *memplan_rows_name(enum memplan_rows f)
{
        static const char *const names[] = {
                [MEMPLAN_UNBOUNDED] = "unbounded", [MEMPLAN_MAX_ROWS] = "max_rows", [MEMPLAN_VOCAB] = "vocab",
                [MEMPLAN_EXPECTED] = "expected_rows", [MEMPLAN_LIMIT] = "memory limit",
        };
        return (unsigned)f < sizeof(names) / sizeof(names[0]) ? names[f] : "?";
}

/* Whether the workers' gRPC pushes may go int8 with answers as int8 changes, for which psd keeps a
 * copy per worker (psd/answers.c): rpc.compression int8, or auto unless security.mode is insecure (auto
 * compresses nothing over plain TCP on loopback); never with training.overlap_push. */
static bool answers_kept(const struct job_config *cfg)
{
        if (cfg->training.overlap_push)
                return false;
        return cfg->rpc.compress == RPC_COMPRESS_INT8 ||
               (cfg->rpc.compress == RPC_COMPRESS_AUTO && cfg->security.mode != SECURITY_INSECURE);
}

/* The buffers a psd holds besides its variables: per worker, one push and its reply of the shard's
 * dense values in flight (gRPC, or a shared-memory segment's gradients and values), the copy of its
 * int8 parts that int8 answers keep (kept_floats), and one sparse exchange per table (a batch's
 * ids, their gradients in, their rows out, and the reply's copy). */
static uint64_t buffers(const struct job_config *cfg, uint64_t dense_floats, uint64_t kept_floats)
{
        const struct model_spec *m = &cfg->model;
        uint64_t per_worker = 2 * dense_floats * sizeof(float) + (answers_kept(cfg) ? kept_floats * sizeof(float) : 0);
        for (uint32_t e = 0; e < m->n_embeddings; e++) {
                uint64_t ids = (uint64_t)cfg->training.batch_size * m->emb[e].n_fields;
                per_worker += ids * (2 * sizeof(uint64_t) + 3 * (uint64_t)m->emb[e].dim * sizeof(float));
        }
        return (uint64_t)cfg->cluster.n_worker * per_worker;
}

int memplan_ps(const struct job_config *cfg, const struct job_layout *L, uint32_t shard, struct memplan_ps *ret,
               char *err, size_t errlen)
{
        const struct model_spec *m = &cfg->model;
        uint32_t n_ps = cfg->cluster.n_ps ? cfg->cluster.n_ps : 1;
        struct memplan_ps p = {.base = MEMPLAN_BASE_BYTES, .n_tables = m->n_embeddings};
        if (shard >= L->n_shards)
                return errf(err, errlen, -EINVAL, "ps:%u: the job has %u ps shard(s)", shard, L->n_shards);
        uint64_t kept = 0;   /* of parts whose variable is compressed (rpc.compression_min_bytes) */
        for (uint32_t k = 0; k < L->shard_count[shard]; k++) {
                const struct placement_part *pp = &L->plan->parts[L->shard_parts[L->shard_first[shard] + k]];
                const struct job_var *v = &L->vars[pp->var];
                uint64_t n = (uint64_t)(pp->row_end - pp->row_begin) * v->cols;
                p.dense_floats += n;
                if ((uint64_t)v->rows * v->cols * sizeof(float) >= cfg->rpc.compression_min_bytes)
                        kept += n;
        }
        p.dense_bytes = p.dense_floats * sizeof(float) * (1 + optim_n_slots(cfg->training.optimizer));
        p.buffers = buffers(cfg, p.dense_floats, kept);

        struct sparse_table_opts o[MODEL_MAX_EMBEDDINGS];
        for (uint32_t e = 0; e < m->n_embeddings; e++) {
                const struct embedding_spec *es = &m->emb[e];
                struct memplan_table *t = &p.tables[e];
                sparse_table_opts_from_config(cfg, e, &o[e]);
                o[e].max_rows = 0;
                t->row_bytes = (uint64_t)es->dim * sizeof(float) * (1 + sparse_optimizer_n_slots(o[e].optimizer));
                /* the tightest bound said */
                uint64_t vocab = es->vocab ? (es->vocab + n_ps - 1) / n_ps : 0;
                t->max_rows = sparse_shard_max_rows(cfg, e);
                if (es->max_rows && (!vocab || t->max_rows <= vocab)) {
                        t->rows = sparse_shard_max_rows(cfg, e), t->from = MEMPLAN_MAX_ROWS;
                } else if (vocab) {
                        t->rows = vocab, t->from = MEMPLAN_VOCAB;
                } else if (es->expected_rows) {
                        t->rows = (es->expected_rows + n_ps - 1) / n_ps, t->from = MEMPLAN_EXPECTED;
                } else {
                        t->rows = 0, t->from = MEMPLAN_UNBOUNDED;
                }
                if ((t->disk_tier = es->disk_tier)) {
                        t->tier_memory = SPARSE_TIER_MEMORY_BYTES;
                        p.tier_memory += t->tier_memory;
                }
        }

        uint64_t limit = cfg->ps.memory_limit_bytes;
        if (p.tier_memory)
                p.tier_memory += SPARSE_TIER_PROCESS_BYTES;
        uint64_t fixed = p.dense_bytes + p.buffers + p.base + p.tier_memory;
        if (limit && limit <= fixed)
                return errf(err, errlen, -E2BIG, "ps.memory_limit_bytes: %" PRIu64 " is below what ps:%u needs "
                            "without its tables: %" PRIu64 " (dense variables with slots %" PRIu64 ", buffers %"
                                    PRIu64 ", process %" PRIu64 "%s)", limit, shard, fixed, p.dense_bytes, p.buffers, p.base,
                            p.tier_memory ? ", disk tier caches" : "");
        if (limit && m->n_embeddings) {
                /* water-filling: a table whose own bound fits in an equal share takes just that */
                uint64_t budget = limit - fixed;
                bool done[MODEL_MAX_EMBEDDINGS] = {false};
                uint32_t left = m->n_embeddings;
                for (bool moved = true; moved && left;) {
                        moved = false;
                        for (uint32_t e = 0; e < m->n_embeddings; e++) {
                                struct memplan_table *t = &p.tables[e];
                                if (done[e] || t->from == MEMPLAN_UNBOUNDED || t->from == MEMPLAN_EXPECTED)
                                        continue;
                                uint64_t need = sparse_table_bytes_for(&o[e], t->rows);
                                if (need <= budget / left) {
                                        budget -= need;
                                        /* a vocab's share is an average: the bytes planned bound it */
                                        if (t->from == MEMPLAN_VOCAB)
                                                t->max_rows = sparse_table_rows_within(&o[e], need);
                                        done[e] = true;
                                        left--;
                                        moved = true;
                                }
                        }
                }
                for (uint32_t e = 0; e < m->n_embeddings && left; e++) {
                        if (done[e])
                                continue;
                        uint64_t rows = sparse_table_rows_within(&o[e], budget / left);
                        if (!rows)
                                return errf(err, errlen, -E2BIG, "ps.memory_limit_bytes: %" PRIu64 " leaves table \"%s\" "
                                            "%" PRIu64 " bytes on ps:%u, less than its smallest bound (%u rows: %" PRIu64
                                            "); ps:%u needs %" PRIu64 " without its tables", limit, m->emb[e].name,
                                            budget / left, shard, SPARSE_MIN_MAX_ROWS,
                                            sparse_table_bytes_for(&o[e], SPARSE_MIN_MAX_ROWS), shard, fixed);
                        p.tables[e].max_rows = rows;
                        /* an expected count below the share stays the plan's figure, bounded by the share */
                        if (p.tables[e].from != MEMPLAN_EXPECTED || rows < p.tables[e].rows)
                                p.tables[e].rows = rows, p.tables[e].from = MEMPLAN_LIMIT;
                }
        }
        p.total = fixed;
        for (uint32_t e = 0; e < m->n_embeddings; e++) {
                struct memplan_table *t = &p.tables[e];
                t->bytes = sparse_table_bytes_for(&o[e], t->rows);
                if (t->disk_tier) {
                        /* what the table would hold unbounded, less DRAM's part */
                        const struct embedding_spec *es = &m->emb[e];
                        uint64_t all = es->vocab ? (es->vocab + n_ps - 1) / n_ps
                                       : es->expected_rows ? (es->expected_rows + n_ps - 1) / n_ps : 0;
                        t->disk_rows = all > t->rows ? all - t->rows : 0;
                        t->disk_bytes = t->disk_rows * (8 + 16 + t->row_bytes);
                        p.disk_bytes += t->disk_bytes;
                }
                p.unbounded = p.unbounded || t->from == MEMPLAN_UNBOUNDED;
                p.total += t->bytes;
        }
        *ret = p;
        return 0;
}
