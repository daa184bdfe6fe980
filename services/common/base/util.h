/* Small helpers shared by every module: clocks, strict number parsing, strings, durable file I/O.
 * All functions are thread-safe. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifndef ELEMENTSOF
#define ELEMENTSOF(a) (sizeof(a) / sizeof((a)[0]))
#endif

/* Wall-clock time (CLOCK_REALTIME) in microseconds since the epoch. */
uint64_t now_us(void);
/* Monotonic time (CLOCK_MONOTONIC) in microseconds; for intervals and deadlines. */
uint64_t mono_us(void);

/* Exponential backoff for a retry loop: waits of `first`, doubling up to `max` (any unit; the caller's).
 * backoff_next() returns the wait to make now and doubles the next one; backoff_reset() starts over
 * after a success. Not thread-safe: one per loop. */
struct backoff {
        uint64_t first, max, cur;
};
void backoff_init(struct backoff *b, uint64_t first, uint64_t max);
uint64_t backoff_next(struct backoff *b);
void backoff_reset(struct backoff *b);

/* Parses the whole of s as an unsigned decimal number (no sign, no spaces, no trailing text) into
 * *ret. Returns 0; -EINVAL if s is NULL, empty or not all digits; -ERANGE if the value overflows or
 * lies outside [min, max]. *ret is written only on success. */
int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret);

/* Returns a malloc'd string formatted like printf, or NULL when out of memory. Caller frees. */
char *strdup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Writes one message into a caller's error buffer (err may be NULL) and returns r, so that
 * `return errf(err, errlen, -EINVAL, "...", ...)` reports and fails in one line. */
int errf(char *err, size_t errlen, int r, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Creates path and its missing parents with mode (like mkdir -p). Returns 0 (also when it already
 * exists as a directory), or -errno (-ENOTDIR when a component is not a directory). */
int mkdir_p(const char *path, mode_t mode);

/* Replaces path with data atomically and durably: writes a temp file in the same directory, fsyncs
 * it, renames it over path, fsyncs the directory. Readers see the old or the new content, never a
 * mix. The file gets mode 0644 (less umask). Returns 0 or -errno; on failure path is untouched. */
int write_file_atomic(const char *path, const void *data, size_t len);

/* Reads the whole file into a malloc'd buffer (NUL-terminated, the NUL not counted in *len_ret).
 * Returns 0; -EFBIG if the file is larger than max bytes; -errno on I/O errors. The caller frees
 * *data_ret. len_ret may be NULL. Outputs are written only on success. */
int read_file(const char *path, size_t max, char **data_ret, size_t *len_ret);
