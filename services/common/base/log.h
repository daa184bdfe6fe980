/* The one logging module: to the journal with structured fields (JOB=, TASK=, STEP=) when running
 * under systemd, else one line per message to stderr: "ident[task] level: message".
 * Thread-safe: each message is one write() or one sd_journal_send(). log_setup() and
 * log_set_max_level() are meant to be called from main() before threads start. */
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <syslog.h>

#define LOG_STEP_NONE UINT64_MAX

/* Sets the identifier (e.g. "workerd"), job name and task (e.g. "worker:1"); any may be NULL.
 * The strings are copied. Also decides between journal and stderr: journal when JOURNAL_STREAM
 * matches stderr's device:inode, or when INVOCATION_ID is set and /run/systemd/journal/socket exists.
 * Before log_setup() messages go to stderr as "psfleet". The level and the timestamps are the log.*
 * keys' (PSFLEET_LOG_LEVEL, PSFLEET_LOG_TIME), which the daemons read through the key table and set
 * with log_set_max_level() and log_set_time() (common/daemon.c). */
void log_setup(const char *ident, const char *job, const char *task);

/* Lines on stderr start with the local time to the microsecond (on) or not (off, the default). */
void log_set_time(bool on);

/* Messages with a priority numerically above prio (less important) are dropped. Default LOG_INFO. */
void log_set_max_level(int prio);
int log_get_max_level(void);

/* Parses "debug", "info", "notice", "warning" (or "warn"), "error" (or "err") into a syslog
 * priority. Returns the priority, or -EINVAL. */
int log_level_from_string(const char *s);

/* Forces stderr output (1) or journal output (0), overriding the detection; for tests and for
 * daemons started by hand from a systemd-run shell. */
void log_set_target_stderr(int on);

/* Logs one message. err != 0 appends ": <strerror(|err|)>" and, in the journal, ERRNO=. step is the
 * training step or LOG_STEP_NONE. Returns -abs(err) when err != 0, else 0, so that
 * `return log_error_errno(r, "...")` works. Messages above the max level are not written but the
 * return value is the same. */
int log_internal(int prio, int err, uint64_t step, const char *file, int line, const char *func,
                 const char *fmt, ...) __attribute__((format(printf, 7, 8)));

#define log_full(prio, err, step, ...) \
        log_internal((prio), (err), (step), __FILE__, __LINE__, __func__, __VA_ARGS__)

#define log_debug(...)   log_full(LOG_DEBUG, 0, LOG_STEP_NONE, __VA_ARGS__)
#define log_info(...)    log_full(LOG_INFO, 0, LOG_STEP_NONE, __VA_ARGS__)
#define log_notice(...)  log_full(LOG_NOTICE, 0, LOG_STEP_NONE, __VA_ARGS__)
#define log_warning(...) log_full(LOG_WARNING, 0, LOG_STEP_NONE, __VA_ARGS__)
#define log_error(...)   log_full(LOG_ERR, 0, LOG_STEP_NONE, __VA_ARGS__)

#define log_debug_errno(err, ...)   log_full(LOG_DEBUG, (err), LOG_STEP_NONE, __VA_ARGS__)
#define log_info_errno(err, ...)    log_full(LOG_INFO, (err), LOG_STEP_NONE, __VA_ARGS__)
#define log_warning_errno(err, ...) log_full(LOG_WARNING, (err), LOG_STEP_NONE, __VA_ARGS__)
#define log_error_errno(err, ...)   log_full(LOG_ERR, (err), LOG_STEP_NONE, __VA_ARGS__)

#define log_info_step(step, ...)    log_full(LOG_INFO, 0, (step), __VA_ARGS__)
#define log_debug_step(step, ...)   log_full(LOG_DEBUG, 0, (step), __VA_ARGS__)
#define log_warning_step(step, ...) log_full(LOG_WARNING, 0, (step), __VA_ARGS__)

/* What a peer sent (a task name, a variable's name, a reason) made fit for one log line: at most
 * LOG_PEER_MAX characters of it, every byte outside printable ASCII and every backslash written as
 * \xNN, and, when it was longer, "...(N bytes)" after the cut. NULL reads as "(none)". Writes into buf
 * (len >= 2 * LOG_PEER_MAX fits any input whole up to the cut) and returns buf, so it can stand as a
 * printf argument. Thread-safe. */
#define LOG_PEER_MAX 64
#define LOG_PEER_BUF (4 * LOG_PEER_MAX + 32)
const char *log_peer_str(const char *s, char *buf, size_t len);
/* The same with a cap of max characters instead of LOG_PEER_MAX: for a peer's text that is kept, not
 * only logged (a worker's reason for a diverged model becomes the job's reason). */
const char *log_peer_str_max(const char *s, size_t max, char *buf, size_t len);

/* Rate limiting for lines a peer can cause (refused calls, rejected pushes, failed handshakes): at most
 * `burst` lines per window of `window_us`; the rest are counted, and the first line of the next window
 * says how many were left out. Thread-safe. */
struct log_ratelimit {
        pthread_mutex_t mu;
        uint64_t window_us;
        unsigned burst;
        uint64_t start_us;
        unsigned logged, suppressed;
};
#define LOG_RATELIMIT_INIT(window, n) {.mu = PTHREAD_MUTEX_INITIALIZER, .window_us = (window), .burst = (n)}
/* True when the caller may log its line now. When a window has just ended with lines left out, logs
 * "N more lines like this were not logged in the last S s" (naming `what`) first. */
bool log_ratelimit_ok(struct log_ratelimit *rl, const char *what);
