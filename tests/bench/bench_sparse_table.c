/* An embedding table's memory and speed: touches --rows rows (default 10^7) of dim 16 with Adagrad through
 * sparse_table_push in batches, then prints the raw bytes of rows and slots, the bytes the table holds and
 * the process's RSS (the bound: RSS <= 1.3x raw), and pull and push rows/s for batches of unique
 * ids. The ids are made from their index on the fly, so nothing but the table grows. One JSON line each. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rng.h"
#include "sparse_table.h"

static double clock_s(clockid_t c)
{
        struct timespec t;
        clock_gettime(c, &t);
        return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double now_s(void)
{
        return clock_s(CLOCK_MONOTONIC);
}

/* On a shared machine the CPU time this thread got is the steadier measure; both are printed. */
static double cpu_s(void)
{
        return clock_s(CLOCK_THREAD_CPUTIME_ID);
}

/* VmRSS in bytes, 0 if unknown. */
static size_t rss_bytes(void)
{
        FILE *f = fopen("/proc/self/status", "r");
        if (!f)
                return 0;
        char line[256];
        size_t kb = 0;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "VmRSS: %zu kB", &kb) == 1)
                        break;
        fclose(f);
        return kb * 1024;
}

/* The i-th id: spread over 64 bits, as hashed feature ids are. */
static uint64_t id_of(uint64_t i)
{
        uint64_t s = i;
        return rng_splitmix64(&s);
}

static void usage(void)
{
        fprintf(stderr, "usage: bench_sparse_table [--rows N] [--dim D] [--batch B] [--seconds S]\n");
        exit(2);
}

int main(int argc, char **argv)
{
        uint64_t rows = 10000000;
        uint32_t dim = 16;
        size_t batch = 4096;
        double seconds = 2.0;
        for (int i = 1; i < argc; i++) {
                if (i + 1 >= argc)
                        usage();
                if (!strcmp(argv[i], "--rows"))
                        rows = strtoull(argv[++i], NULL, 10);
                else if (!strcmp(argv[i], "--dim"))
                        dim = (uint32_t)strtoul(argv[++i], NULL, 10);
                else if (!strcmp(argv[i], "--batch"))
                        batch = strtoull(argv[++i], NULL, 10);
                else if (!strcmp(argv[i], "--seconds"))
                        seconds = strtod(argv[++i], NULL);
                else
                        usage();
        }
        if (rows < batch || batch == 0 || dim == 0 || dim > 1024)
                usage();
        size_t rss0 = rss_bytes();
        struct sparse_table_opts o = {.dim = dim, .optimizer = SPARSE_ADAGRAD, .init_stddev = 0.01, .seed = 1,
                                      .initial_accumulator = 0.1, .epsilon = 1e-7};
        struct sparse_table *t = NULL;
        int rc = sparse_table_new(&o, &t);
        uint64_t *ids = malloc(batch * sizeof(*ids));
        float *g = malloc(batch * dim * sizeof(float)), *out = malloc(batch * dim * sizeof(float));
        if (rc < 0 || !ids || !g || !out) {
                fprintf(stderr, "bench_sparse_table: %s\n", strerror(rc < 0 ? -rc : ENOMEM));
                return 1;
        }
        struct rng r;
        rng_init(&r, 7, 0);
        for (size_t i = 0; i < batch * dim; i++)
                g[i] = rng_uniform_f(&r, -0.01f, 0.01f);

        double t0 = now_s(), c0 = cpu_s();
        for (uint64_t at = 0; at < rows; at += batch) {
                size_t n = rows - at < batch ? (size_t)(rows - at) : batch;
                for (size_t i = 0; i < n; i++)
                        ids[i] = id_of(at + i);
                if ((rc = sparse_table_push(t, ids, n, g, 0.05f, 1)) < 0) {
                        fprintf(stderr, "bench_sparse_table: push: %s\n", strerror(-rc));
                        return 1;
                }
        }
        double fill_s = now_s() - t0, fill_cpu = cpu_s() - c0;
        size_t rss = rss_bytes();
        double raw = (double)sparse_table_rows(t) * dim * sizeof(float) * (1 + sparse_optimizer_n_slots(o.optimizer));
        printf("{\"rows\": %zu, \"dim\": %u, \"optimizer\": \"adagrad\", \"raw_bytes\": %.0f, \"table_bytes\": %zu, "
               "\"rss_bytes\": %zu, \"rss_before_bytes\": %zu, \"rss_over_raw\": %.3f, \"table_over_raw\": %.3f, "
               "\"create_rows_per_s\": %.0f, \"create_rows_per_cpu_s\": %.0f}\n",
               sparse_table_rows(t), dim, raw, sparse_table_bytes(t), rss, rss0, (double)rss / raw,
               (double)sparse_table_bytes(t) / raw, (double)rows / fill_s, (double)rows / fill_cpu);

        /* batches of unique ids at random places among the stored rows (a batch's unique ids) */
        for (int phase = 0; phase < 2; phase++) {
                uint64_t moved = 0;
                double start = now_s(), cstart = cpu_s(), el = 0;
                do {
                        uint64_t base = rng_next(&r) % (rows - batch + 1);
                        for (size_t i = 0; i < batch; i++)
                                ids[i] = id_of(base + i);
                        rc = phase == 0 ? sparse_table_pull(t, ids, batch, out, true, 2)
                                        : sparse_table_push(t, ids, batch, g, 0.05f, 2);
                        if (rc < 0) {
                                fprintf(stderr, "bench_sparse_table: %s\n", strerror(-rc));
                                return 1;
                        }
                        moved += batch;
                        el = now_s() - start;
                } while (el < seconds);
                printf("{\"op\": \"%s\", \"batch\": %zu, \"rows_per_s\": %.0f, \"rows_per_cpu_s\": %.0f}\n",
                       phase == 0 ? "pull" : "push", batch, (double)moved / el, (double)moved / (cpu_s() - cstart));
        }
        free(ids);
        free(g);
        free(out);
        sparse_table_free(t);
        return 0;
}
