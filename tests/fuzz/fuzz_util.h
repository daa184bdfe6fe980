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

/* A job of two dense layers (a split kernel, so shards hold row ranges) on loopback, in that order:
 * the chief's address, the ps's, data.dir, the optimizer, and more sections (",\"supervisor\": {...}"
 * or ""). Only cluster, model, training and ps make the job's fingerprint. security.mode insecure: the
 * harnesses call the daemons as any role, without certificates (the loopback default is mutual TLS). */
#define FUZZ_JOB_FMT                                                                                     \
        "{\"job\": \"fuzz\", \"cluster\": {\"chief\": [\"%s\"], \"ps\": [\"%s\"], "                     \
        "\"worker\": [\"127.0.0.1:1\"]}, "                                                             \
        "\"model\": {\"input\": [40], \"seed\": 1, \"layers\": [{\"type\": \"dense\", \"units\": 32}, " \
        "{\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 4}]}, "                               \
        "\"data\": {\"dir\": \"%s\", \"train_images\": \"images\", \"train_labels\": \"labels\", "         \
        "\"test_images\": \"images\", \"test_labels\": \"labels\"}, "                                     \
        "\"training\": {\"batch_size\": 4, \"optimizer\": \"%s\", \"learning_rate\": 0.1, "            \
        "\"max_steps\": 1000000000}, \"ps\": {\"split_bytes\": 4096}, "                              \
        "\"security\": {\"mode\": \"insecure\"}%s}"

/* The job's data in dir: 8 examples of 40 bytes (images, IDX 8x5x8) and their labels (0..3). */
static inline void fuzz_write_data(const char *dir) {
        char path[256];
        uint8_t img[16 + 8 * 40], lab[8 + 8];
        memcpy(img, "\0\0\x08\x03\0\0\0\x08\0\0\0\x05\0\0\0\x08", 16);
        memcpy(lab, "\0\0\x08\x01\0\0\0\x08", 8);
        for (size_t i = 0; i < 8 * 40; i++)
                img[16 + i] = (uint8_t)(i * 37);
        for (size_t i = 0; i < 8; i++)
                lab[8 + i] = (uint8_t)(i % 4);
        snprintf(path, sizeof(path), "%s/images", dir);
        FILE *f = fopen(path, "w");
        if (!f || fwrite(img, 1, sizeof(img), f) != sizeof(img) || fclose(f) != 0)
                abort();
        snprintf(path, sizeof(path), "%s/labels", dir);
        f = fopen(path, "w");
        if (!f || fwrite(lab, 1, sizeof(lab), f) != sizeof(lab) || fclose(f) != 0)
                abort();
}

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
