/* The records a job's reader gives (ctr_records_open: data.format, data.tfrecord, the files), for the
 * TFRecord interop check and benchmark (tests/bench/tfrecord_interop.py, docs/performance.md):
 *   records_dump JOB.json                 one line per training record, in file order:
 *                                         "label;dense,...;field0 ids,...;field1 ids,...;..." (floats %.9g)
 *   records_dump JOB.json --count [--threads T] [--batch B]
 *                                         T threads, each reading shard t of T as a worker does, counted;
 *                                         prints {"records": N, "seconds": S, "records_per_s": R, "threads": T}
 * Exit status: 0, 2 bad usage, 65 a bad record, 74 a file that cannot be read, 78 a bad job file. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "ctr_train.h"
#include "records.h"

struct counter {
        const struct job_config *cfg;
        uint32_t k, n;
        uint32_t batch;
        uint64_t records;
        int r;
        char err[512];
};

static void *count_shard(void *arg)
{
        struct counter *c = arg;
        struct records_reader *rd = NULL;
        struct records_batch *b = NULL;
        c->r = ctr_records_open(c->cfg, false, c->k, c->n, false, &rd, c->err, sizeof(c->err));
        if (c->r == 0)
                c->r = records_batch_new(c->batch, records_n_dense(rd), records_n_fields(rd),
                                         c->cfg->data.max_ids_per_example, &b);
        while (c->r == 0) {
                int n = records_next(rd, b, c->err, sizeof(c->err));
                if (n <= 0) {
                        c->r = n;
                        break;
                }
                c->records += (uint64_t)n;
        }
        records_batch_free(b);
        records_close(rd);
        return NULL;
}

static int exit_for(int r)
{
        return r == -EBADMSG ? 65 : r == -ENOMEM ? 1 : 74;
}

static int dump(const struct job_config *cfg)
{
        struct records_reader *rd = NULL;
        struct records_batch *b = NULL;
        char err[512];
        int r = ctr_records_open(cfg, false, 0, 1, false, &rd, err, sizeof(err));
        if (r == 0)
                r = records_batch_new(256, records_n_dense(rd), records_n_fields(rd), cfg->data.max_ids_per_example, &b);
        while (r == 0) {
                int n = records_next(rd, b, err, sizeof(err));
                if (n <= 0) {
                        r = n;
                        break;
                }
                for (int i = 0; i < n; i++) {
                        printf("%.9g;", b->label[i]);
                        for (uint32_t j = 0; j < b->n_dense; j++)
                                printf("%s%.9g", j ? "," : "", b->dense[(size_t)i * b->n_dense + j]);
                        for (uint32_t f = 0; f < b->n_fields; f++) {
                                putchar(';');
                                for (uint32_t k = b->off[(size_t)i * b->n_fields + f];
                                     k < b->off[(size_t)i * b->n_fields + f + 1]; k++)
                                        printf("%s%" PRIu64, k > b->off[(size_t)i * b->n_fields + f] ? "," : "",
                                               b->ids[k]);
                        }
                        putchar('\n');
                }
        }
        records_batch_free(b);
        records_close(rd);
        if (r < 0) {
                fprintf(stderr, "records_dump: %s\n", err);
                return exit_for(r);
        }
        return 0;
}

int main(int argc, char **argv)
{
        uint32_t threads = 1, batch = 256;
        int count = 0;
        for (int i = 2; i < argc; i++) {
                if (strcmp(argv[i], "--count") == 0)
                        count = 1;
                else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
                        threads = (uint32_t)atoi(argv[++i]);
                else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
                        batch = (uint32_t)atoi(argv[++i]);
                else
                        argc = 0;
        }
        if (argc < 2 || threads > 64) {
                fprintf(stderr, "usage: records_dump JOB.json [--count [--threads T] [--batch B]]\n");
                return 2;
        }
        struct job_config *cfg;
        char err[512];
        if (config_load(argv[1], &cfg, err, sizeof(err)) < 0) {
                fprintf(stderr, "records_dump: %s\n", err);
                return 78;
        }
        if (!count) {
                int rc = dump(cfg);
                config_free(cfg);
                return rc;
        }
        struct counter c[64];
        pthread_t t[64];
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (uint32_t k = 0; k < threads; k++) {
                c[k] = (struct counter){.cfg = cfg, .k = k, .n = threads, .batch = batch};
                pthread_create(&t[k], NULL, count_shard, &c[k]);
        }
        uint64_t total = 0;
        int rc = 0;
        for (uint32_t k = 0; k < threads; k++) {
                pthread_join(t[k], NULL);
                total += c[k].records;
                if (c[k].r < 0 && !rc) {
                        fprintf(stderr, "records_dump: %s\n", c[k].err);
                        rc = exit_for(c[k].r);
                }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        printf("{\"records\": %" PRIu64 ", \"seconds\": %.3f, \"records_per_s\": %.0f, \"threads\": %u}\n", total, s,
               s > 0 ? (double)total / s : 0.0, threads);
        config_free(cfg);
        return rc;
}
