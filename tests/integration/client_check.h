/* CHECK for the C clients the integration tests run against real daemons (shm_client, sparse_client):
 * a condition that does not hold prints "CLIENT_NAME: FAIL: " and the printf-style message on stderr,
 * and exits 1. Define CLIENT_NAME (a string) before including this. */
#pragma once
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                             \
        do {                                                         \
                if (!(cond)) {                                       \
                        fprintf(stderr, CLIENT_NAME ": FAIL: ");     \
                        fprintf(stderr, __VA_ARGS__);                \
                        fprintf(stderr, "\n");                       \
                        exit(1);                                     \
                }                                                    \
        } while (0)
