/* The one logging module: journal with structured fields under systemd, one stderr line otherwise. */
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <systemd/sd-journal.h>

/* Set once from main() (log_setup, log_set_max_level, log_set_time); read by every thread afterwards. */
static char log_ident[64] = "psfleet";
static char log_job[128];
static char log_task[64];
static int log_max_level = LOG_INFO;
static int log_to_journal;
static int log_time;

static const char *const level_names[] = {
        [LOG_EMERG] = "emerg", [LOG_ALERT] = "alert", [LOG_CRIT] = "crit", [LOG_ERR] = "error",
        [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice", [LOG_INFO] = "info", [LOG_DEBUG] = "debug",
};

int log_level_from_string(const char *s) {
        static const struct { const char *name; int prio; } map[] = {
                { "debug", LOG_DEBUG }, { "info", LOG_INFO }, { "notice", LOG_NOTICE },
                { "warning", LOG_WARNING }, { "warn", LOG_WARNING }, { "error", LOG_ERR },
                { "err", LOG_ERR }, { "crit", LOG_CRIT }, { "alert", LOG_ALERT }, { "emerg", LOG_EMERG },
        };

        if (!s)
                return -EINVAL;
        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
                if (strcasecmp(s, map[i].name) == 0)
                        return map[i].prio;
        return -EINVAL;
}

/* sd-daemon's rule: stderr is connected to the journal iff JOURNAL_STREAM names its device:inode. */
static int stderr_is_journal(void) {
        const char *e = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;

        if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2)
                return 0;
        if (fstat(STDERR_FILENO, &st) < 0)
                return 0;
        return (unsigned long long) st.st_dev == dev && (unsigned long long) st.st_ino == ino;
}

static void copy_str(char *dst, size_t size, const char *src) {
        snprintf(dst, size, "%s", src ? src : "");
}

void log_setup(const char *ident, const char *job, const char *task) {
        copy_str(log_ident, sizeof(log_ident), ident ? ident : "psfleet");
        copy_str(log_job, sizeof(log_job), job);
        copy_str(log_task, sizeof(log_task), task);

        /* sd_journal_send() silently drops messages when journald is absent (a container that
         * sets INVOCATION_ID), so INVOCATION_ID alone only counts when the journal is there. */
        log_to_journal = stderr_is_journal() ||
                         (getenv("INVOCATION_ID") && access("/run/systemd/journal/socket", W_OK) == 0);
}

void log_set_time(bool on) {
        log_time = on;
}

const char *log_peer_str(const char *s, char *buf, size_t len) {
        return log_peer_str_max(s, LOG_PEER_MAX, buf, len);
}

const char *log_peer_str_max(const char *s, size_t max, char *buf, size_t len) {
        size_t o = 0, i = 0, n;

        if (!len)
                return buf;
        if (!s) {
                snprintf(buf, len, "(none)");
                return buf;
        }
        n = strlen(s);
        for (; i < n && i < max; i++) {
                unsigned char ch = (unsigned char)s[i];
                int w = ch >= 0x20 && ch < 0x7f && ch != '\\' ? 1 : 4;
                if (o + (size_t)w + 1 > len)
                        break;
                if (w == 1)
                        buf[o++] = (char)ch;
                else
                        o += (size_t)snprintf(buf + o, len - o, "\\x%02x", ch);
        }
        buf[o] = 0;
        if (i < n)
                snprintf(buf + o, len - o, "...(%zu bytes)", n);
        return buf;
}

void log_set_max_level(int prio) {
        if (prio < LOG_EMERG)
                prio = LOG_EMERG;
        if (prio > LOG_DEBUG)
                prio = LOG_DEBUG;
        log_max_level = prio;
}

int log_get_max_level(void) {
        return log_max_level;
}

void log_set_target_stderr(int on) {
        log_to_journal = !on;
}

static void write_stderr(int prio, const char *msg) {
        char line[4096 + 256], ts[48] = "";
        int n;

        if (log_time) {
                struct timespec t;
                struct tm tm;

                clock_gettime(CLOCK_REALTIME, &t);
                localtime_r(&t.tv_sec, &tm);
                n = (int) strftime(ts, sizeof(ts) - 16, "%Y-%m-%dT%H:%M:%S", &tm);
                snprintf(ts + n, sizeof(ts) - (size_t) n, ".%06ld ", t.tv_nsec / 1000);
        }
        if (log_task[0])
                n = snprintf(line, sizeof(line) - 1, "%s%s[%s] %s: %s", ts, log_ident, log_task,
                             level_names[prio], msg);
        else
                n = snprintf(line, sizeof(line) - 1, "%s%s %s: %s", ts, log_ident, level_names[prio], msg);
        if (n < 0)
                return;
        if ((size_t) n > sizeof(line) - 2)
                n = (int) sizeof(line) - 2;
        line[n++] = '\n';
        /* One write() per line keeps lines from different threads whole. */
        while (write(STDERR_FILENO, line, (size_t) n) < 0 && errno == EINTR)
                ;
}

int log_internal(int prio, int err, uint64_t step, const char *file, int line, const char *func,
                 const char *fmt, ...) {
        char msg[4096];
        int saved_errno = errno, n, ret = err == 0 ? 0 : err < 0 ? err : -err;
        va_list ap;

        prio &= LOG_PRIMASK;
        if (prio > log_max_level)
                goto out;

        va_start(ap, fmt);
        n = vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        if (n < 0)
                n = 0;
        if ((size_t) n >= sizeof(msg))
                n = (int) sizeof(msg) - 1;
        if (err != 0) {
                char eb[256];
                const char *es = strerror_r(ret == INT_MIN ? EINVAL : -ret, eb, sizeof(eb));
                snprintf(msg + n, sizeof(msg) - (size_t) n, ": %s", es);
        }

        if (log_to_journal) {
                char f_prio[32], f_ident[96], f_job[160], f_task[96], f_file[512], f_line[32], f_func[256];
                char f_step[48], f_errno[32];
                struct iovec iov[12];
                size_t k = 0;
                char *f_msg = NULL;

                if (asprintf(&f_msg, "MESSAGE=%s", msg) >= 0) {
#define FIELD(buf, ...) do { \
                snprintf(buf, sizeof(buf), __VA_ARGS__); \
                iov[k++] = (struct iovec) { .iov_base = buf, .iov_len = strlen(buf) }; \
        } while (0)
                        iov[k++] = (struct iovec) { .iov_base = f_msg, .iov_len = strlen(f_msg) };
                        FIELD(f_prio, "PRIORITY=%d", prio);
                        FIELD(f_ident, "SYSLOG_IDENTIFIER=%s", log_ident);
                        if (log_job[0])
                                FIELD(f_job, "JOB=%s", log_job);
                        if (log_task[0])
                                FIELD(f_task, "TASK=%s", log_task);
                        FIELD(f_file, "CODE_FILE=%s", file ? file : "");
                        FIELD(f_line, "CODE_LINE=%d", line);
                        FIELD(f_func, "CODE_FUNC=%s", func ? func : "");
                        if (step != LOG_STEP_NONE)
                                FIELD(f_step, "STEP=%" PRIu64, step);
                        if (err != 0)
                                FIELD(f_errno, "ERRNO=%d", ret == INT_MIN ? EINVAL : -ret);
#undef FIELD
                        n = sd_journal_sendv(iov, (int) k);
                        free(f_msg);
                        if (n >= 0)
                                goto out;
                }
                /* The journal is gone (e.g. during shutdown): fall back to stderr. */
        }
        write_stderr(prio, msg);
out:
        errno = saved_errno;
        return ret;
}

bool log_ratelimit_ok(struct log_ratelimit *rl, const char *what) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t now = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
        unsigned left_out = 0;
        bool ok;
        pthread_mutex_lock(&rl->mu);
        if (!rl->start_us || now - rl->start_us >= rl->window_us) {
                left_out = rl->suppressed;
                rl->start_us = now;
                rl->logged = rl->suppressed = 0;
        }
        ok = rl->logged < rl->burst;
        if (ok)
                rl->logged++;
        else
                rl->suppressed++;
        pthread_mutex_unlock(&rl->mu);
        if (left_out)
                log_warning("%u more %s were not logged in the last %llu s", left_out, what,
                            (unsigned long long)(rl->window_us / 1000000u));
        return ok;
}
