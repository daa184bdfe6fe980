/* Small helpers shared by every module: clocks, strict number parsing, strings, durable file I/O.
 * All functions are thread-safe. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#ifndef ELEMENTSOF
#define ELEMENTSOF(a) (sizeof(a) / sizeof((a)[0]))
#endif

/* Wall-clock time (CLOCK_REALTIME) in microseconds since the epoch. */
uint64_t now_us(void);
/* Monotonic time (CLOCK_MONOTONIC) in microseconds; for intervals and deadlines. */
uint64_t mono_us(void);

/* The CLOCK_REALTIME time ms milliseconds from now, as pthread_cond_timedwait() wants it. */
struct timespec realtime_in_ms(uint64_t ms);

/* Exponential backoff for a retry loop: waits of `first`, doubling up to `max` (any unit; the caller's).
 * backoff_next() returns the wait to make now and doubles the next one; backoff_reset() starts over
 * after a success. Not thread-safe: one per loop. */
struct backoff {
        uint64_t first, max, cur;
};
void backoff_init(struct backoff *b, uint64_t first, uint64_t max);
uint64_t backoff_next(struct backoff *b);
void backoff_reset(struct backoff *b);

/* Makes room for at least `need` elements of `elem` bytes in the malloc'd array *arr of *cap elements,
 * doubling from `first`: 0, or -ENOMEM with *arr and *cap unchanged (the caller still frees *arr). */
int grow_array(void **arr, size_t *cap, size_t need, size_t elem, size_t first);

/* Whether the n 64-bit values at v (any alignment) hold one twice: 1 with it in *dup, 0 when each is
 * there once, -ENOMEM. v is left as it is (a sorted copy is searched). */
int u64_find_repeat(const void *v, size_t n, uint64_t *dup);

/* Parses the whole of s as an unsigned decimal number (no sign, no spaces, no trailing text) into
 * *ret. Returns 0; -EINVAL if s is NULL, empty or not all digits; -ERANGE if the value overflows or
 * lies outside [min, max]. *ret is written only on success. */
int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret);

/* Splits "HOST:PORT" or "[V6]:PORT" at its last colon: the host, brackets removed, into host (len
 * bytes; may be empty), and *port_ret pointing into addr after the colon. Returns 0, or -EINVAL when
 * addr has no colon or the host does not fit. */
int split_host_port(const char *addr, char *host, size_t len, const char **port_ret);

/* Returns a malloc'd string formatted like printf, or NULL when out of memory. Caller frees. */
char *strdup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Writes one message into a caller's error buffer (err may be NULL) and returns r, so that
 * `return errf(err, errlen, -EINVAL, "...", ...)` reports and fails in one line. */
int errf(char *err, size_t errlen, int r, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Creates path and its missing parents with mode (like mkdir -p). Returns 0 (also when it already
 * exists as a directory), or -errno (-ENOTDIR when a component is not a directory). */
int mkdir_p(const char *path, mode_t mode);

/* A file replaced atomically and durably, written as a stream: the bytes go to a temp file in the
 * same directory; the commit fsyncs it, renames it over path and fsyncs the directory. Readers (and a
 * power cut) see the old content or the new, never a mix. One writer per object; not thread-safe. */
struct atomic_file;

/* Starts replacing path; the file gets mode (less umask). tmp names the temp file: NULL for a unique
 * name beside path ("<path>.tmpXXXXXX"); a caller that must recognize its leftovers after a crash
 * names it itself (it is then created, or truncated when it exists). Returns 0 and *ret; or -errno
 * (-EINVAL when path is empty), path untouched. */
int atomic_file_open(const char *path, const char *tmp, mode_t mode, struct atomic_file **ret);
/* Appends len bytes. Returns 0 or -errno; after a failure, abort. */
int atomic_file_write(struct atomic_file *af, const void *data, size_t len);
/* Makes what was written durable now (fsync, close), ahead of the commit; optional. Returns 0 or
 * -errno; after a failure, abort. */
int atomic_file_sync(struct atomic_file *af);
/* Syncs (unless done), renames the temp file over path, fsyncs the directory, and frees af, whatever
 * happens. Returns 0; or -errno: with the temp file removed and path untouched when the rename did not
 * happen (*renamed false); with the new content in place, which a power cut may still undo, when only
 * the directory's fsync failed (*renamed true). renamed may be NULL. */
int atomic_file_commit(struct atomic_file *af, bool *renamed);
/* Gives up: removes the temp file and frees af; path untouched. NULL-safe; returns NULL. */
struct atomic_file *atomic_file_abort(struct atomic_file *af);
/* The temp file's path, for messages. Owned by af. */
const char *atomic_file_temp_path(const struct atomic_file *af);

/* Replaces path with data atomically and durably, through an atomic_file with a unique temp name.
 * The file gets mode 0644 (less umask). Returns 0 or -errno; on failure path is untouched (but for a
 * failed fsync of the directory, see atomic_file_commit). */
int write_file_atomic(const char *path, const void *data, size_t len);

/* Reads the whole file into a malloc'd buffer (NUL-terminated, the NUL not counted in *len_ret).
 * Returns 0; -EFBIG if the file is larger than max bytes; -errno on I/O errors. The caller frees
 * *data_ret. len_ret may be NULL. Outputs are written only on success. */
int read_file(const char *path, size_t max, char **data_ret, size_t *len_ret);

/* Whether descriptor fd, shared memory another process handed over, is a memfd whose name starts with
 * prefix (its name, "/memfd:..." or "" when unreadable, in target) and whose size is sealed against
 * shrinking, so a mapping of it never faults: 0; -ENOENT, not such a memfd; -EPERM, not sealed. */
int fd_sealed_memfd(int fd, const char *prefix, char *target, size_t len);
