/* Small helpers shared by every module: clocks, strict number parsing, strings, durable file I/O. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t clock_us(clockid_t id) {
        struct timespec ts;
        clock_gettime(id, &ts);
        return (uint64_t) ts.tv_sec * UINT64_C(1000000) + (uint64_t) ts.tv_nsec / 1000;
}

uint64_t now_us(void) {
        return clock_us(CLOCK_REALTIME);
}

uint64_t mono_us(void) {
        return clock_us(CLOCK_MONOTONIC);
}

struct timespec realtime_in_ms(uint64_t ms) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_sec += (time_t)(ms / 1000);
        t.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (t.tv_nsec >= 1000000000L) {
                t.tv_sec++;
                t.tv_nsec -= 1000000000L;
        }
        return t;
}

void backoff_init(struct backoff *b, uint64_t first, uint64_t max) {
        *b = (struct backoff){.first = first ? first : 1};
        b->max = max < b->first ? b->first : max;
        b->cur = b->first;
}

uint64_t backoff_next(struct backoff *b) {
        uint64_t now = b->cur;
        b->cur = b->cur > b->max / 2 ? b->max : b->cur * 2;
        return now;
}

void backoff_reset(struct backoff *b) {
        b->cur = b->first;
}

int grow_array(void **arr, size_t *cap, size_t need, size_t elem, size_t first) {
        if (need <= *cap)
                return 0;
        size_t n = *cap ? *cap : (first ? first : 1);
        while (n < need) {
                if (n > SIZE_MAX / 2)
                        return -ENOMEM;
                n *= 2;
        }
        if (n > SIZE_MAX / elem)
                return -ENOMEM;
        void *a = realloc(*arr, n * elem);
        if (!a)
                return -ENOMEM;
        *arr = a;
        *cap = n;
        return 0;
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return (x > y) - (x < y);
}

int u64_find_repeat(const void *v, size_t n, uint64_t *dup) {
        if (n < 2)
                return 0;
        uint64_t *s = malloc(n * sizeof(*s));
        if (!s)
                return -ENOMEM;
        memcpy(s, v, n * sizeof(*s));
        qsort(s, n, sizeof(*s), cmp_u64);
        int r = 0;
        for (size_t i = 1; i < n && !r; i++)
                if (s[i] == s[i - 1]) {
                        *dup = s[i];
                        r = 1;
                }
        free(s);
        return r;
}

int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret) {
        uint64_t v = 0;

        if (!s || !*s)
                return -EINVAL;
        /* Validate by hand: strtoull accepts spaces, signs and "0x", which a config value must not. */
        for (const char *p = s; *p; p++) {
                if (*p < '0' || *p > '9')
                        return -EINVAL;
        }
        for (const char *p = s; *p; p++) {
                unsigned d = (unsigned) (*p - '0');
                if (v > (UINT64_MAX - d) / 10)
                        return -ERANGE;
                v = v * 10 + d;
        }
        if (v < min || v > max)
                return -ERANGE;
        *ret = v;
        return 0;
}

int split_host_port(const char *addr, char *host, size_t len, const char **port_ret) {
        const char *colon = strrchr(addr, ':');
        if (!colon || (size_t)(colon - addr) >= len)
                return -EINVAL;
        size_t hl = (size_t)(colon - addr);
        bool bracketed = hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']';
        memcpy(host, addr + bracketed, hl - 2 * bracketed);
        host[hl - 2 * bracketed] = 0;
        *port_ret = colon + 1;
        return 0;
}

char *strdup_printf(const char *fmt, ...) {
        va_list ap;
        char *s;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&s, fmt, ap);
        va_end(ap);
        return r < 0 ? NULL : s;
}

static int mkdir_one(const char *path, mode_t mode) {
        struct stat st;

        if (mkdir(path, mode) == 0)
                return 0;
        if (errno != EEXIST)
                return -errno;
        if (stat(path, &st) < 0)
                return -errno;
        return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

int mkdir_p(const char *path, mode_t mode) {
        char *p;
        int r = 0;

        if (!path || !*path)
                return -EINVAL;
        p = strdup(path);
        if (!p)
                return -ENOMEM;
        for (char *s = p + 1; *s; s++) {
                if (*s != '/' || s[-1] == '/')
                        continue;
                *s = 0;
                r = mkdir_one(p, mode);
                *s = '/';
                if (r < 0)
                        goto out;
        }
        r = mkdir_one(p, mode);
out:
        free(p);
        return r;
}

struct atomic_file {
        char *path, *tmp;
        int fd;                         /* -1 once synced and closed */
};

static void atomic_file_free(struct atomic_file *af) {
        free(af->path);
        free(af->tmp);
        free(af);
}

int atomic_file_open(const char *path, const char *tmp, mode_t mode, struct atomic_file **ret) {
        struct atomic_file *af;
        int r;

        if (!path || !*path || (tmp && !*tmp))
                return -EINVAL;
        af = calloc(1, sizeof(*af));
        if (!af)
                return -ENOMEM;
        af->fd = -1;
        af->path = strdup(path);
        af->tmp = tmp ? strdup(tmp) : strdup_printf("%s.tmpXXXXXX", path);
        if (!af->path || !af->tmp) {
                r = -ENOMEM;
                goto fail;
        }
        af->fd = tmp ? open(af->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode) : mkostemp(af->tmp, O_CLOEXEC);
        if (af->fd < 0) {
                r = -errno;
                goto fail;
        }
        /* mkostemp creates 0600, and O_TRUNC keeps a leftover's mode; a replaced config or checkpoint
         * should be readable like any file. */
        {
                mode_t um = umask(0);
                umask(um);
                if (fchmod(af->fd, mode & ~um) < 0) {
                        r = -errno;
                        atomic_file_abort(af);
                        return r;
                }
        }
        *ret = af;
        return 0;
fail:
        atomic_file_free(af);
        return r;
}

const char *atomic_file_temp_path(const struct atomic_file *af) {
        return af->tmp;
}

int atomic_file_write(struct atomic_file *af, const void *data, size_t len) {
        const char *b = data;

        if (af->fd < 0)
                return -EBADF;
        while (len > 0) {
                ssize_t n = write(af->fd, b, len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                b += n;
                len -= (size_t) n;
        }
        return 0;
}

int atomic_file_sync(struct atomic_file *af) {
        int r;

        if (af->fd < 0)
                return 0;
        r = fsync(af->fd) < 0 ? -errno : 0;
        if (close(af->fd) < 0 && r == 0)
                r = -errno;
        af->fd = -1;
        return r;
}

static int fsync_dir_of(const char *path) {
        char *dir = strdup(path), *slash;
        int fd, r;

        if (!dir)
                return -ENOMEM;
        slash = strrchr(dir, '/');
        if (!slash)
                strcpy(dir, ".");
        else if (slash == dir)
                dir[1] = 0;
        else
                *slash = 0;
        fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        free(dir);
        if (fd < 0)
                return -errno;
        r = fsync(fd) < 0 ? -errno : 0;
        close(fd);
        return r;
}

int atomic_file_commit(struct atomic_file *af, bool *renamed) {
        int r = atomic_file_sync(af);

        if (renamed)
                *renamed = false;
        if (r >= 0 && rename(af->tmp, af->path) < 0)
                r = -errno;
        if (r < 0) {
                atomic_file_abort(af);
                return r;
        }
        if (renamed)
                *renamed = true;
        r = fsync_dir_of(af->path);
        atomic_file_free(af);
        return r;
}

struct atomic_file *atomic_file_abort(struct atomic_file *af) {
        if (af) {
                if (af->fd >= 0)
                        close(af->fd);
                unlink(af->tmp);
                atomic_file_free(af);
        }
        return NULL;
}

int write_file_atomic(const char *path, const void *data, size_t len) {
        struct atomic_file *af;
        int r;

        if (!data && len > 0)
                return -EINVAL;
        r = atomic_file_open(path, NULL, 0644, &af);
        if (r < 0)
                return r;
        r = atomic_file_write(af, data, len);
        if (r < 0) {
                atomic_file_abort(af);
                return r;
        }
        return atomic_file_commit(af, NULL);
}

int read_file(const char *path, size_t max, char **data_ret, size_t *len_ret) {
        char *buf = NULL;
        size_t len = 0, cap = 0;
        int fd, r;

        if (!path || !data_ret)
                return -EINVAL;
        if (max > SIZE_MAX - 2)
                max = SIZE_MAX - 2;
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        for (;;) {
                ssize_t n;

                if (cap - len < 2) {
                        size_t ncap = cap ? cap * 2 : 4096;
                        char *nb;

                        if (ncap > max + 2)
                                ncap = max + 2; /* room for one byte past max, to detect it, and the NUL */
                        if (ncap <= cap) {
                                r = -EFBIG;
                                goto fail;
                        }
                        nb = realloc(buf, ncap);
                        if (!nb) {
                                r = -ENOMEM;
                                goto fail;
                        }
                        buf = nb;
                        cap = ncap;
                }
                n = read(fd, buf + len, cap - len - 1);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        goto fail;
                }
                if (n == 0)
                        break;
                len += (size_t) n;
                if (len > max) {
                        r = -EFBIG;
                        goto fail;
                }
        }
        close(fd);
        buf[len] = 0;
        *data_ret = buf;
        if (len_ret)
                *len_ret = len;
        return 0;
fail:
        close(fd);
        free(buf);
        return r;
}

int errf(char *err, size_t errlen, int r, const char *fmt, ...) {
        if (err && errlen) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(err, errlen, fmt, ap);
                va_end(ap);
        }
        return r;
}

int fd_sealed_memfd(int fd, const char *prefix, char *target, size_t len) {
        char self[64], want[128];
        snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
        ssize_t n = len ? readlink(self, target, len - 1) : -1;
        if (len)
                target[n < 0 ? 0 : n] = 0;
        snprintf(want, sizeof(want), "/memfd:%s", prefix);
        if (n < 0 || strncmp(target, want, strlen(want)) != 0)
                return -ENOENT;
        int seals = fcntl(fd, F_GET_SEALS);
        return seals >= 0 && (seals & F_SEAL_SHRINK) ? 0 : -EPERM;
}
