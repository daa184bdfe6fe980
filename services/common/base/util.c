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

static int write_all(int fd, const void *data, size_t len) {
        const char *b = data;

        while (len > 0) {
                ssize_t n = write(fd, b, len);
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

int write_file_atomic(const char *path, const void *data, size_t len) {
        char *tmp = NULL, *dir = NULL, *slash;
        int fd = -1, dfd = -1, r;

        if (!path || !*path || (!data && len > 0))
                return -EINVAL;
        tmp = strdup_printf("%s.tmpXXXXXX", path);
        dir = strdup(path);
        if (!tmp || !dir) {
                r = -ENOMEM;
                goto out;
        }
        slash = strrchr(dir, '/');
        if (!slash)
                strcpy(dir, ".");
        else if (slash == dir)
                dir[1] = 0;
        else
                *slash = 0;

        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0) {
                r = -errno;
                goto out;
        }
        /* mkostemp creates 0600; a replaced config or checkpoint should be readable like any file. */
        {
                mode_t um = umask(0);
                umask(um);
                if (fchmod(fd, 0644 & ~um) < 0) {
                        r = -errno;
                        goto fail;
                }
        }
        r = write_all(fd, data, len);
        if (r < 0)
                goto fail;
        if (fsync(fd) < 0) {
                r = -errno;
                goto fail;
        }
        if (close(fd) < 0) {
                fd = -1;
                r = -errno;
                goto fail;
        }
        fd = -1;
        if (rename(tmp, path) < 0) {
                r = -errno;
                goto fail;
        }
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
                r = -errno;
                goto out;
        }
        r = fsync(dfd) < 0 ? -errno : 0;
        goto out;
fail:
        unlink(tmp);
out:
        if (fd >= 0)
                close(fd);
        if (dfd >= 0)
                close(dfd);
        free(tmp);
        free(dir);
        return r;
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
