/* An embedding table's disk tier over RocksDB's C API: 8-byte big-endian keys (so iteration goes by
 * id), no write-ahead log (the store is wiped at every start: nothing to recover), no compression
 * (rows of floats do not compress), small memtables and block cache so that the tier's memory stays a
 * fixed few MiB beside the table's DRAM bound. */
#include "sparse_tier.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <rocksdb/c.h>

#define TIER_ERR_MAX 256

struct sparse_tier {
        pthread_rwlock_t lock;   /* clear (write) against every other call (read) */
        char *dir;
        rocksdb_t *db;           /* NULL after a failed clear */
        rocksdb_options_t *opts;
        rocksdb_block_based_table_options_t *bopts;
        rocksdb_cache_t *cache;
        rocksdb_writeoptions_t *wo;
        rocksdb_readoptions_t *ro;
        pthread_mutex_t err_lock;
        char err[TIER_ERR_MAX];
        int fail_writes;         /* sparse_tier_fail_writes (atomic) */
};

struct sparse_tier_iter {
        struct sparse_tier *t;
        const rocksdb_snapshot_t *snap;
        rocksdb_readoptions_t *ro;
        rocksdb_iterator_t *it;
        bool started;
        int err;
};

/* RocksDB's error string to -errno (the one place that translates), kept for the log; frees it. */
static int tier_err(struct sparse_tier *t, char *msg)
{
        int r = strstr(msg, "No space") || strstr(msg, "ENOSPC") ? -ENOSPC : -EIO;
        pthread_mutex_lock(&t->err_lock);
        snprintf(t->err, sizeof(t->err), "%s", msg);
        pthread_mutex_unlock(&t->err_lock);
        rocksdb_free(msg);
        return r;
}

static void key_of(uint64_t id, char k[8])
{
        for (int i = 0; i < 8; i++)
                k[i] = (char)(id >> (56 - 8 * i));
}

static uint64_t id_of(const char *k)
{
        uint64_t id = 0;
        for (int i = 0; i < 8; i++)
                id = id << 8 | (unsigned char)k[i];
        return id;
}

static int mkdir_p(const char *dir)
{
        char *p = strdup(dir);
        if (!p)
                return -ENOMEM;
        int r = 0;
        for (char *s = p + 1;; s++) {
                if (*s != '/' && *s)
                        continue;
                char c = *s;
                *s = 0;
                if (mkdir(p, 0750) < 0 && errno != EEXIST) {
                        r = -errno;
                        break;
                }
                *s = c;
                if (!c)
                        break;
        }
        free(p);
        if (r == 0) {
                struct stat st;
                if (stat(dir, &st) < 0)
                        r = -errno;
                else if (!S_ISDIR(st.st_mode))
                        r = -ENOTDIR;
        }
        return r;
}

/* Deletes what is in the directory and opens an empty store there (the write lock held, or alone). */
static int tier_reopen(struct sparse_tier *t)
{
        char *msg = NULL;
        if (t->db) {
                rocksdb_close(t->db);
                t->db = NULL;
        }
        rocksdb_destroy_db(t->opts, t->dir, &msg);
        if (msg)
                return tier_err(t, msg);
        rocksdb_t *db = rocksdb_open(t->opts, t->dir, &msg);
        if (msg)
                return tier_err(t, msg);
        t->db = db;
        return 0;
}

int sparse_tier_open(const char *dir, struct sparse_tier **ret)
{
        int r = mkdir_p(dir);
        if (r < 0)
                return r;
        struct sparse_tier *t = calloc(1, sizeof(*t));
        if (!t)
                return -ENOMEM;
        pthread_rwlock_init(&t->lock, NULL);
        pthread_mutex_init(&t->err_lock, NULL);
        t->dir = strdup(dir);
        t->opts = rocksdb_options_create();
        t->bopts = rocksdb_block_based_options_create();
        t->cache = rocksdb_cache_create_lru(SPARSE_TIER_BLOCK_CACHE);
        t->wo = rocksdb_writeoptions_create();
        t->ro = rocksdb_readoptions_create();
        if (!t->dir || !t->opts || !t->bopts || !t->cache || !t->wo || !t->ro) {
                sparse_tier_free(t);
                return -ENOMEM;
        }
        rocksdb_block_based_options_set_block_cache(t->bopts, t->cache);
        rocksdb_block_based_options_set_filter_policy(t->bopts, rocksdb_filterpolicy_create_bloom(10));
        rocksdb_block_based_options_set_data_block_index_type(t->bopts,
                                                               rocksdb_block_based_table_data_block_index_type_binary_search_and_hash);
        rocksdb_options_set_block_based_table_factory(t->opts, t->bopts);
        rocksdb_options_set_create_if_missing(t->opts, 1);
        rocksdb_options_set_error_if_exists(t->opts, 1);
        rocksdb_options_set_compression(t->opts, rocksdb_no_compression);
        rocksdb_options_set_write_buffer_size(t->opts, SPARSE_TIER_WRITE_BUFFER);
        rocksdb_options_set_max_write_buffer_number(t->opts, 2);
        /* most lookups are of ids not on disk, or in a file rather than the memtable: a bloom filter
         * over the memtable's whole keys and a hash index in each data block skip the skip list's and
         * the block's binary search for them */
        rocksdb_options_set_memtable_whole_key_filtering(t->opts, 1);
        rocksdb_options_set_memtable_prefix_bloom_size_ratio(t->opts, 0.1);
        rocksdb_options_set_max_log_file_size(t->opts, 1u << 20);
        rocksdb_options_set_keep_log_file_num(t->opts, 2);
        rocksdb_writeoptions_disable_WAL(t->wo, 1);
        if ((r = tier_reopen(t)) < 0) {
                sparse_tier_free(t);
                return r;
        }
        *ret = t;
        return 0;
}

struct sparse_tier *sparse_tier_free(struct sparse_tier *t)
{
        if (!t)
                return NULL;
        if (t->db)
                rocksdb_close(t->db);
        if (t->ro)
                rocksdb_readoptions_destroy(t->ro);
        if (t->wo)
                rocksdb_writeoptions_destroy(t->wo);
        if (t->opts)
                rocksdb_options_destroy(t->opts);
        if (t->bopts)
                rocksdb_block_based_options_destroy(t->bopts);
        if (t->cache)
                rocksdb_cache_destroy(t->cache);
        free(t->dir);
        pthread_rwlock_destroy(&t->lock);
        pthread_mutex_destroy(&t->err_lock);
        free(t);
        return NULL;
}

/* An injected write failure, as RocksDB would report it (kept for the log). */
static int injected(struct sparse_tier *t)
{
        int e = __atomic_load_n(&t->fail_writes, __ATOMIC_RELAXED);
        if (e < 0) {
                pthread_mutex_lock(&t->err_lock);
                snprintf(t->err, sizeof(t->err), "injected: %s", strerror(-e));
                pthread_mutex_unlock(&t->err_lock);
        }
        return e;
}

void sparse_tier_fail_writes(struct sparse_tier *t, int err)
{
        __atomic_store_n(&t->fail_writes, err < 0 ? err : 0, __ATOMIC_RELAXED);
}

/* Stores id's row (val, len), or deletes it when val is NULL. */
static int write_row(struct sparse_tier *t, uint64_t id, const void *val, size_t len)
{
        char k[8], *msg = NULL;
        int r = injected(t);
        if (r < 0)
                return r;
        r = -EIO;
        key_of(id, k);
        pthread_rwlock_rdlock(&t->lock);
        if (t->db) {
                if (val)
                        rocksdb_put(t->db, t->wo, k, sizeof(k), val, len, &msg);
                else
                        rocksdb_delete(t->db, t->wo, k, sizeof(k), &msg);
                r = msg ? tier_err(t, msg) : 0;
        }
        pthread_rwlock_unlock(&t->lock);
        return r;
}

int sparse_tier_put(struct sparse_tier *t, uint64_t id, const void *val, size_t len)
{
        assert(val);
        return write_row(t, id, val, len);
}

int sparse_tier_get(struct sparse_tier *t, uint64_t id, void *val, size_t len)
{
        char k[8], *msg = NULL;
        int r = -EIO;
        key_of(id, k);
        pthread_rwlock_rdlock(&t->lock);
        if (t->db) {
                size_t vlen = 0;
                char *v = rocksdb_get(t->db, t->ro, k, sizeof(k), &vlen, &msg);
                if (msg) {
                        r = tier_err(t, msg);
                } else if (!v) {
                        r = 0;
                } else if (vlen != len) {
                        r = tier_err(t, strdup("a stored row of another length"));
                } else {
                        memcpy(val, v, len);
                        r = 1;
                }
                rocksdb_free(v);
        }
        pthread_rwlock_unlock(&t->lock);
        return r;
}

int sparse_tier_del(struct sparse_tier *t, uint64_t id)
{
        return write_row(t, id, NULL, 0);
}

int sparse_tier_clear(struct sparse_tier *t)
{
        pthread_rwlock_wrlock(&t->lock);
        int r = tier_reopen(t);
        pthread_rwlock_unlock(&t->lock);
        return r;
}

uint64_t sparse_tier_bytes(struct sparse_tier *t)
{
        uint64_t sst = 0, mem = 0;
        pthread_rwlock_rdlock(&t->lock);
        if (t->db) {
                if (rocksdb_property_int(t->db, "rocksdb.total-sst-files-size", &sst) != 0)
                        sst = 0;
                if (rocksdb_property_int(t->db, "rocksdb.cur-size-all-mem-tables", &mem) != 0)
                        mem = 0;
        }
        pthread_rwlock_unlock(&t->lock);
        return sst + mem;
}

void sparse_tier_last_error(struct sparse_tier *t, char *buf, size_t len)
{
        pthread_mutex_lock(&t->err_lock);
        snprintf(buf, len, "%s", t->err);
        pthread_mutex_unlock(&t->err_lock);
}

int sparse_tier_iter_new(struct sparse_tier *t, struct sparse_tier_iter **ret)
{
        struct sparse_tier_iter *it = calloc(1, sizeof(*it));
        if (!it)
                return -ENOMEM;
        it->t = t;
        pthread_rwlock_rdlock(&t->lock);
        if (!t->db) {
                pthread_rwlock_unlock(&t->lock);
                free(it);
                return -EIO;
        }
        it->snap = rocksdb_create_snapshot(t->db);
        it->ro = rocksdb_readoptions_create();
        rocksdb_readoptions_set_snapshot(it->ro, it->snap);
        rocksdb_readoptions_set_fill_cache(it->ro, 0);
        it->it = rocksdb_create_iterator(t->db, it->ro);
        pthread_rwlock_unlock(&t->lock);
        *ret = it;
        return 0;
}

bool sparse_tier_iter_next(struct sparse_tier_iter *it, uint64_t *id, const void **val, size_t *len)
{
        if (!it->started) {
                rocksdb_iter_seek_to_first(it->it);
                it->started = true;
        } else if (rocksdb_iter_valid(it->it)) {
                rocksdb_iter_next(it->it);
        }
        if (!rocksdb_iter_valid(it->it)) {
                char *msg = NULL;
                rocksdb_iter_get_error(it->it, &msg);
                if (msg)
                        it->err = tier_err(it->t, msg);
                return false;
        }
        size_t klen;
        const char *k = rocksdb_iter_key(it->it, &klen);
        if (klen != 8) {
                it->err = -EIO;
                return false;
        }
        *id = id_of(k);
        *val = rocksdb_iter_value(it->it, len);
        return true;
}

int sparse_tier_iter_error(const struct sparse_tier_iter *it)
{
        return it->err;
}

struct sparse_tier_iter *sparse_tier_iter_free(struct sparse_tier_iter *it)
{
        if (!it)
                return NULL;
        rocksdb_iter_destroy(it->it);
        rocksdb_readoptions_destroy(it->ro);
        rocksdb_release_snapshot(it->t->db, it->snap);
        free(it);
        return NULL;
}

const struct sparse_tier_ops sparse_tier_rocksdb = {
        .open = sparse_tier_open, .free = sparse_tier_free, .put = sparse_tier_put, .get = sparse_tier_get,
        .del = sparse_tier_del, .clear = sparse_tier_clear, .bytes = sparse_tier_bytes,
        .last_error = sparse_tier_last_error, .iter_new = sparse_tier_iter_new, .iter_next = sparse_tier_iter_next,
        .iter_error = sparse_tier_iter_error, .iter_free = sparse_tier_iter_free,
};
