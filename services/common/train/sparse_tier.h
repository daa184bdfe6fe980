/* The disk tier of an embedding table: rows past the table's DRAM bound, kept by id in an embedded
 * RocksDB store in a directory of the ps's own (docs/sparse.md, "Disk tier"). The store is the ps's
 * working state, never a checkpoint: it is wiped when opened. Values are opaque bytes here; their
 * layout is sparse_table_tier.c's (struct tier_hdr, sparse_table-internal.h).
 *
 * Thread-safe: get, put, delete and iterators may run from any thread; sparse_tier_clear waits for
 * the calls in flight, but every iterator must be freed before it (the caller's to order). Errors are -errno: -ENOSPC for a full disk, -EIO for the rest (RocksDB's message is
 * kept for the daemon to log, sparse_tier_last_error). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sparse_tier;
struct sparse_tier_iter;

/* Makes dir (and its parents) if missing, deletes any store left in it, and opens an empty one.
 * 0, or -errno (-ENOTDIR, -EACCES, -EROFS, ... from making the directory; -EIO from RocksDB). */
int sparse_tier_open(const char *dir, struct sparse_tier **ret);
struct sparse_tier *sparse_tier_free(struct sparse_tier *t); /* NULL-safe; returns NULL; iterators first */

/* Stores val (len bytes) as id's, replacing any. 0 or -errno. */
int sparse_tier_put(struct sparse_tier *t, uint64_t id, const void *val, size_t len);
/* id's value into val (exactly len bytes expected): 1 found, 0 missing, -errno (-EIO also for a value
 * of another length). */
int sparse_tier_get(struct sparse_tier *t, uint64_t id, void *val, size_t len);
int sparse_tier_del(struct sparse_tier *t, uint64_t id); /* 0 (also when missing) or -errno */
/* Empties the store (closes it, deletes its files, opens it again). 0 or -errno: the tier then fails
 * every call with -EIO until a clear succeeds. */
int sparse_tier_clear(struct sparse_tier *t);

/* Bytes of the store on disk (its files) and in its memtables, as RocksDB estimates them. */
uint64_t sparse_tier_bytes(struct sparse_tier *t);
/* The memory a tier may hold whatever its rows (two 4 MiB memtables, an 8 MiB block cache): for plans,
 * a constant so that planning does not link RocksDB. */
#define SPARSE_TIER_WRITE_BUFFER (4u << 20)
#define SPARSE_TIER_BLOCK_CACHE (8u << 20)
#define SPARSE_TIER_MEMORY_BYTES (2ull * SPARSE_TIER_WRITE_BUFFER + SPARSE_TIER_BLOCK_CACHE)
/* What RocksDB adds to a process once, with any tier open (its code and threads: VmRSS of a psd with a
 * tier before any row against one without, measured in integration.sparse_tier: 3.4 MB). */
#define SPARSE_TIER_PROCESS_BYTES (4ull << 20)

/* The text of the last error (empty if none), into buf. */
void sparse_tier_last_error(struct sparse_tier *t, char *buf, size_t len);

/* Fault injection, for tests: while err < 0, every put and delete fails with err (as a full or
 * unwritable disk would), reads still work; 0 ends it. */
void sparse_tier_fail_writes(struct sparse_tier *t, int err);

/* Walks the ids in order over a snapshot of the store taken now. 0 or -errno. */
int sparse_tier_iter_new(struct sparse_tier *t, struct sparse_tier_iter **ret);
/* The next id (and its value, valid until the next call): true, or false at the end (or on an error:
 * sparse_tier_iter_error). */
bool sparse_tier_iter_next(struct sparse_tier_iter *it, uint64_t *id, const void **val, size_t *len);
int sparse_tier_iter_error(const struct sparse_tier_iter *it); /* 0 or -EIO */
struct sparse_tier_iter *sparse_tier_iter_free(struct sparse_tier_iter *it); /* NULL-safe; returns NULL */

/* The functions above as a table: what sparse_table calls (sparse_table_opts.tier_ops). */
struct sparse_tier_ops {
        int (*open)(const char *dir, struct sparse_tier **ret);
        struct sparse_tier *(*free)(struct sparse_tier *t);
        int (*put)(struct sparse_tier *t, uint64_t id, const void *val, size_t len);
        int (*get)(struct sparse_tier *t, uint64_t id, void *val, size_t len);
        int (*del)(struct sparse_tier *t, uint64_t id);
        int (*clear)(struct sparse_tier *t);
        uint64_t (*bytes)(struct sparse_tier *t);
        void (*last_error)(struct sparse_tier *t, char *buf, size_t len);
        int (*iter_new)(struct sparse_tier *t, struct sparse_tier_iter **ret);
        bool (*iter_next)(struct sparse_tier_iter *it, uint64_t *id, const void **val, size_t *len);
        int (*iter_error)(const struct sparse_tier_iter *it);
        struct sparse_tier_iter *(*iter_free)(struct sparse_tier_iter *it);
};
extern const struct sparse_tier_ops sparse_tier_rocksdb;
