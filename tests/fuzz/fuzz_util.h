/* What the harnesses share: a small job to build real objects from, the input as a file (the readers
 * under test take paths), and a check that aborts so libFuzzer records the input as a crash. */
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

/* A job of two dense layers (a split kernel, so shards hold row ranges) on loopback; %s: the ps
 * address, %s: the chief's, %s: the optimizer. */
#define FUZZ_JOB_FMT                                                                                     \
        "{\"job\": \"fuzz\", \"cluster\": {\"chief\": [\"%s\"], \"ps\": [\"%s\"], "                     \
        "\"worker\": [\"127.0.0.1:1\"]}, "                                                             \
        "\"model\": {\"input\": [40], \"seed\": 1, \"layers\": [{\"type\": \"dense\", \"units\": 32}, " \
        "{\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 4}]}, "                               \
        "\"data\": {\"dir\": \"/nonexistent\"}, "                                                        \
        "\"training\": {\"batch_size\": 4, \"optimizer\": \"%s\", \"learning_rate\": 0.1, "            \
        "\"max_steps\": 1000000000}, \"ps\": {\"split_bytes\": 4096}}"

/* The invariant failed: say which and abort (libFuzzer saves the input). */
#define FUZZ_CHECK(cond, ...)                                                                              \
        do {                                                                                             \
                if (!(cond)) {                                                                           \
                        fprintf(stderr, "fuzz invariant broken: " __VA_ARGS__);                        \
                        fputc('\n', stderr);                                                             \
                        abort();                                                                         \
                }                                                                                        \
        } while (0)

/* The input as a file (a memfd: nothing on disk); path gets "/proc/self/fd/N". Returns the fd. */
static inline int fuzz_memfd(const uint8_t *data, size_t size, char *path, size_t len) {
        int fd = memfd_create("fuzz", MFD_CLOEXEC);
        if (fd < 0)
                abort();
        for (size_t at = 0; at < size;) {
                ssize_t w = write(fd, data + at, size - at);
                if (w <= 0)
                        abort();
                at += (size_t)w;
        }
        snprintf(path, len, "/proc/self/fd/%d", fd);
        return fd;
}

/* The input as a string. */
static inline char *fuzz_string(const uint8_t *data, size_t size) {
        char *s = malloc(size + 1);
        if (!s)
                abort();
        memcpy(s, data, size);
        s[size] = 0;
        return s;
}
