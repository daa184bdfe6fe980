/* Checkpoint files in the safetensors format (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON (padded with spaces to a multiple of 8), then the
 * tensors' bytes back to back. The JSON maps each tensor's name to {"dtype": "F32", "shape": [...],
 * "data_offsets": [begin, end]} (offsets into the data section) and "__metadata__" to a map of
 * strings. Any safetensors reader opens these files; chiefd reads them back here.
 *
 * Writes are durable and atomic: a reader sees the old file or the new one, never a part.
 * Thread-safe: no shared state but the test delay, set once at start (ckpt_set_test_delay).
 * Little-endian hosts only (floats are written as they lie in memory).
 *
 * The file format alone: which files a job keeps, and their rows, are chief_ckpt.c's (the store);
 * what goes into them from the shards, and back, is chief_save.c's. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define CKPT_MAX_DIMS 8

/* Element types: F32 (every variable, row and slot) and U64 (embedding tables' ids). */
enum ckpt_dtype { CKPT_F32, CKPT_U64 };

/* One tensor to write: written with shape [rows, cols], or [rows] when ndims is 1. */
struct ckpt_tensor {
        const char *name;
        uint32_t rows, cols;
        const void *data;       /* (rows, cols) of dtype */
        enum ckpt_dtype dtype;  /* 0: F32 */
        unsigned ndims;         /* 0 or 2: [rows, cols]; 1: [rows] (cols ignored) */
};

/* One "__metadata__" entry: both strings. */
struct ckpt_kv {
        const char *key, *value;
};

struct ckpt_written {
        uint64_t bytes;         /* of the whole file */
        uint32_t crc32c;        /* CRC-32C of the whole file */
};

/* Writes the tensors (names must be distinct) and metadata as a safetensors file at path, through an
 * atomic_file (util.h) whose temp file is ".<name>.tmp" beside it: written, fsynced, renamed over path,
 * the directory fsynced. With the test delay on (ckpt_set_test_delay) it sleeps between the fsync
 * and the rename, so that a test can kill the writer while only the temp file exists. Returns 0 and
 * *ret; or -errno with err saying what failed, and path untouched unless only the directory's fsync
 * failed (the temp file is removed in every case). */
int ckpt_write(const char *path, const struct ckpt_tensor *tensors, size_t n, const struct ckpt_kv *meta,
               size_t n_meta, struct ckpt_written *ret, char *err, size_t errlen);

/* A checkpoint written as its values come (docs/checkpoints.md, "Streaming"): tensors given whole
 * (ckpt_writer_add: the caller's memory, read at finish) and tensors streamed in parts of whole rows
 * (ckpt_writer_stream, then ckpt_writer_append as they come: spooled to an unlinked file beside path),
 * in one file at path written by ckpt_writer_finish as ckpt_write writes (same format, temp file,
 * fsync, rename, CRC). The writer holds no tensor's data: memory is a 1 MiB copy buffer and the header.
 * Not thread-safe: one writer, one thread. */
struct ckpt_writer;
int ckpt_writer_new(const char *path, struct ckpt_writer **ret);          /* 0 or -ENOMEM */
struct ckpt_writer *ckpt_writer_free(struct ckpt_writer *w);             /* NULL-safe; drops the spools */
/* 0; -EEXIST when the name is taken; -ENOMEM. */
int ckpt_writer_add(struct ckpt_writer *w, const struct ckpt_tensor *t);
/* A tensor of rows of cols elements ([rows] when ndims is 1), 0 rows so far; *idx_ret names it to
 * ckpt_writer_append. 0; -EEXIST; -errno when its spool cannot be made. */
int ckpt_writer_stream(struct ckpt_writer *w, const char *name, enum ckpt_dtype dtype, unsigned ndims,
                       uint32_t cols, size_t *idx_ret);
/* Appends rows rows of data to streamed tensor idx. 0, or -errno from the file system (-ENOSPC...). */
int ckpt_writer_append(struct ckpt_writer *w, size_t idx, const void *data, uint64_t rows);
uint64_t ckpt_writer_rows(const struct ckpt_writer *w, size_t idx);      /* rows streamed so far */
/* Writes the file, as ckpt_write (same returns); the writer is spent either way (free it). */
int ckpt_writer_finish(struct ckpt_writer *w, const struct ckpt_kv *meta, size_t n_meta, struct ckpt_written *ret,
                       char *err, size_t errlen);

/* The test hook PSFLEET_TEST_CHECKPOINT_DELAY_MS (supervisor.test_checkpoint_delay_ms), 0 outside
 * tests: every ckpt_write sleeps ms before its rename, and ckpt_test_delay() sleeps as long (the
 * checkpoint store calls it before recording a file). Set once at start, before any checkpoint is
 * written; the one place that holds the delay. */
void ckpt_set_test_delay(uint64_t ms);
void ckpt_test_delay(void);

/* The temp file name ckpt_write uses for path (".<basename>.tmp" in the same directory); malloc'd. */
char *ckpt_temp_path(const char *path);

/* A checkpoint file checked, and open: its header is in memory, its tensors are read from the file
 * when asked for (the file stays open while the struct ckpt lives, so a rename or unlink meanwhile
 * does not change what is read). */
struct ckpt;

/* Opens the file (at most max_bytes), computes its CRC-32C reading it through a bounded buffer (4 MiB,
 * whatever the file's size), and checks the format: a JSON object header; every tensor F32 or U64 with
 * a shape whose element count matches its data_offsets; the tensors back to back and covering the data
 * section exactly (as safetensors' own loader demands); every metadata value a string. Returns 0 and
 * *ret (free with ckpt_free); -errno from the file system (-ENOENT, -EACCES, -EIO, -EFBIG over
 * max_bytes); -EBADMSG when the file is not a valid safetensors file of F32 and U64 tensors. err says
 * why in every case. */
int ckpt_read(const char *path, uint64_t max_bytes, struct ckpt **ret, char *err, size_t errlen);
struct ckpt *ckpt_free(struct ckpt *c);   /* NULL-safe; returns NULL */

uint64_t ckpt_bytes(const struct ckpt *c);
uint32_t ckpt_crc32c(const struct ckpt *c);
/* A "__metadata__" value, or NULL when absent. Owned by c. */
const char *ckpt_meta(const struct ckpt *c, const char *key);
size_t ckpt_n_tensors(const struct ckpt *c);
const char *ckpt_tensor_name(const struct ckpt *c, size_t i);   /* i < ckpt_n_tensors; owned by c */

/* Reads tensor `name` into dst (rows * cols floats) after checking that it is F32 of shape [rows, cols]
 * (or [cols] when rows is 1: a bias as other frameworks store it). Returns 0; -ENOENT when there is
 * no such tensor; -EINVAL when the dtype or shape differs, with both shapes in err; -errno (-EIO) when
 * the file cannot be read. */
int ckpt_get(const struct ckpt *c, const char *name, uint32_t rows, uint32_t cols, float *dst, char *err,
             size_t errlen);

/* Tensor `name`'s dtype and shape (shape: CKPT_MAX_DIMS room). 0, or -ENOENT. */
int ckpt_shape(const struct ckpt *c, const char *name, enum ckpt_dtype *dtype, unsigned *ndims, uint64_t *shape);

/* As ckpt_shape, and where the tensor's bytes lie in memory (unaligned; owned by c): the first call
 * reads the whole data section into c, for readers that want whole tensors (the exporter and the
 * evaluator through chief_ckpt_read_step / read_chain). A restore pages with ckpt_read_rows instead.
 * 0; -ENOENT; -ENOMEM or -errno (-EIO) when the data cannot be read. */
int ckpt_view(struct ckpt *c, const char *name, enum ckpt_dtype *dtype, unsigned *ndims, uint64_t *shape,
              const void **data);

/* Rows [first, first + n) of tensor `name` (a row: the elements of one index of its first dimension)
 * into dst, read from the file: how a restore pages through a table in bounded memory. first and n must
 * lie within the tensor (a caller bug otherwise: it aborts). 0; -ENOENT; -errno (-EIO; -EBADMSG when
 * the file shrank). */
int ckpt_read_rows(const struct ckpt *c, const char *name, uint64_t first, uint64_t n, void *dst);

/* "crc32c:1a2b3c4d" into buf (at least 16 bytes); returns buf. */
const char *ckpt_format_checksum(uint32_t crc, char *buf, size_t len);
