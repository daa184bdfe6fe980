/* The memory each psd of a job needs, from the job file alone (psfleet plan, docs/sparse.md): its
 * dense variables and their optimizer slots where placement puts them, each embedding table at its
 * bound or expected rows with slots and index (sparse_table_bytes_for), message and shared-memory
 * buffers, and the process's own base. With ps.memory_limit_bytes it also gives each table its row
 * bound under the limit, the one rule psd applies. Pure computation; thread-safe. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "job.h"

/* A psd process before any variable: code, libraries, gRPC's threads and arenas, measured (RSS of a
 * psd of a 1-variable job, docs/sparse.md "Memory"). */
#define MEMPLAN_BASE_BYTES (18ull << 20)

/* Where a table's row count comes from. */
enum memplan_rows {
        MEMPLAN_UNBOUNDED,      /* no max_rows, vocab, expected_rows or limit: rows 0, bytes its empty table */
        MEMPLAN_MAX_ROWS,       /* model.embeddings[].max_rows / n_ps */
        MEMPLAN_VOCAB,          /* vocab / n_ps (ids hashed into vocab rows spread over the shards) */
        MEMPLAN_EXPECTED,       /* expected_rows / n_ps */
        MEMPLAN_LIMIT,          /* the share of ps.memory_limit_bytes left to it */
};

struct memplan_table {
        uint64_t rows;          /* rows on this shard */
        enum memplan_rows from;
        uint64_t row_bytes;     /* raw: (1 + slots) * dim * 4 */
        uint64_t bytes;         /* sparse_table_bytes_for(rows): records, index, chunk tables, sketch */
        uint64_t max_rows;      /* the bound psd gives the table on this shard: max_rows' share, or under the
                                 * limit the most rows its bytes allow; 0: none */
        /* disk_tier: rows and bytes is DRAM's part at the bound; the rest of vocab or expected_rows is on
         * disk (0 when neither says), and RocksDB's memtables and block cache are in DRAM too */
        bool disk_tier;
        uint64_t tier_memory;   /* SPARSE_TIER_MEMORY_BYTES, in total */
        uint64_t disk_rows, disk_bytes; /* on disk, not in total: 8 bytes of key, 16 of state, the row raw */
};

struct memplan_ps {
        uint64_t dense_floats;                     /* this shard's parts of the dense variables */
        uint64_t dense_bytes;                      /* with their optimizer slots */
        uint64_t buffers;                          /* messages in flight and shared-memory segments */
        uint64_t base;                             /* MEMPLAN_BASE_BYTES */
        uint64_t tier_memory;                      /* the disk tiers' memory, all tables, and RocksDB's own once */
        uint64_t disk_bytes;                       /* the disk tiers' rows on disk (not in total) */
        uint32_t n_tables;
        struct memplan_table tables[MODEL_MAX_EMBEDDINGS];
        uint64_t total;                            /* all of the above */
        bool unbounded;                            /* a table is MEMPLAN_UNBOUNDED: total is a floor */
};

/* The plan of ps:shard. Under ps.memory_limit_bytes, the tables share what the dense part, buffers and
 * base leave: each table gets what its own bound needs if that is less than an equal share, the rest
 * is split equally among the others (their rows then come from MEMPLAN_LIMIT). 0; -E2BIG when the
 * limit is below the dense part, buffers and base, or leaves a table less than its smallest bound
 * (why in err, with the figures); -EINVAL for a shard out of range. */
int memplan_ps(const struct job_config *cfg, const struct job_layout *L, uint32_t shard, struct memplan_ps *ret,
               char *err, size_t errlen);

/* "unbounded", "max_rows", "vocab", "expected_rows", "memory limit" */
const char *memplan_rows_name(enum memplan_rows f);
