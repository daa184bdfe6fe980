/* How one parameter server scales with its workers: real psd processes over gRPC, pushed by simulated
 * workers (threads of this process, each with its own ps client and channel, as a workerd has) that
 * push real-sized gradients of the job's model as fast as the shard answers.
 *
 *   scale: for each worker count, one psd; `--pushes` pushes in all, in windows of a tenth of them:
 *          pushes/s, p50/p99 push latency, psd CPU per push, psd RSS at each window's end and its peak.
 *          Closed loop (each worker pushes again as soon as it is answered: the latency is mostly the
 *          queue of the others), or with --rate paced at that many pushes/s in all (open loop: the
 *          latency is psd's and the transport's, as for workers that compute between pushes), or with
 *          --think-ms sleeping that long after each answer. Beside each window, a probe's median time
 *          for a fixed piece of work (the machine's speed then: the host is shared) and p99 over it.
 *          --pin puts psd on a CPU of its own; --latencies FILE writes every push and probe.
 *   load:  with `--shards` psd (default 4), the bytes and apply time each shard received for the demo
 *          model and for a model with one very large variable: the ratio max/min between shards.
 *
 * One JSON line per measurement (docs/performance.md has the table and tests/bench/plot_ps_scale.py the
 * plot). Needs psd built beside it (--psd PATH otherwise). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "job.h"
#include "placement.h"
#include "ps_client.h"
#include "rng.h"
#include "util.h"
#include "psfleet/v1/ps.pb-c.h"

#include "../lib/daemons.h"
#include "../lib/scratch.h"

#ifndef PSFLEET_BINARY_DIR
#define PSFLEET_BINARY_DIR "."
#endif

#define MAX_WORKERS 1024
#define WINDOWS 10

static const char *psd_path = PSFLEET_BINARY_DIR "/services/psd/psd";
static const char *wire_dtype = "float32";   /* rpc.wire_dtype of the simulated workers */
static double rate;   /* --rate: pushes/s of all workers together, each worker on its own schedule; 0: as fast as
                       * answers come (closed loop: the latency is then mostly the queue of the others) */
static double think_ms;   /* --think-ms: each worker computes this long (a sleep) after each answer, as a workerd
                           * does between its pushes: closed loop with think time, no catch-up bursts */
static bool pin;          /* --pin: psd on the last CPU, the simulated workers on the others (psd on a core of its
                           * own, as on a node of its own) */
static const char *latencies_path;   /* --latencies FILE: every push's start and latency, for analysis */
static char workdir[64];

/* The demo's MLP (examples/fmnist-mlp.json), or one very large variable beside small ones. */
static const char *const models[] = {
        "\"input\": [784], \"seed\": 1, \"layers\": [{\"type\": \"dense\", \"units\": 256}, {\"type\": \"relu\"},"
        "{\"type\": \"dense\", \"units\": 128}, {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 64},"
        "{\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 10}]",
        "\"input\": [784], \"seed\": 1, \"layers\": [{\"type\": \"dense\", \"units\": 4096}, {\"type\": \"relu\"},"
        "{\"type\": \"dense\", \"units\": 10}]",
};
static const char *const model_names[] = {"demo", "one_large_variable"};

struct job {
        char path[256];
        struct job_config *cfg;
        struct job_layout *L;
        pid_t psd[64];
        uint32_t n_shards, n_workers;
        unsigned id;
};

/* --pin: the calling thread (and what it forks or execs) on the last CPU when `server`, else on the others. */
static void pin_to_cpus(bool server) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        if (n < 2)
                return;
        cpu_set_t set;
        CPU_ZERO(&set);
        for (long c = 0; c < n; c++)
                if ((c == n - 1) == server)
                        CPU_SET((int)c, &set);
        if (sched_setaffinity(0, sizeof(set), &set) < 0)
                fprintf(stderr, "bench_ps_scale: sched_setaffinity: %s\n", strerror(errno));
}

/* A job with n_shards ps on free loopback ports and n_workers workers (addresses only: the workers
 * are threads here), gRPC only. */
static int job_write(struct job *j, uint32_t n_shards, uint32_t n_workers, const char *model) {
        int ports[1 + sizeof(j->psd) / sizeof(j->psd[0])];   /* the chief's (never listened on), the shards' */
        int r = n_shards < sizeof(ports) / sizeof(ports[0]) ? daemons_free_ports(ports, 1 + n_shards) : -EINVAL;
        if (r < 0) {
                fprintf(stderr, "bench_ps_scale: %u free ports: %s\n", 1 + n_shards, strerror(-r));
                return r;
        }
        char *cluster = strdup_printf("\"chief\": [\"127.0.0.1:%d\"], \"ps\": [", ports[0]);
        for (uint32_t s = 0; s < n_shards; s++) {
                char *c = strdup_printf("%s%s\"127.0.0.1:%d\"", cluster, s ? ", " : "", ports[1 + s]);
                free(cluster);
                cluster = c;
        }
        char *c = strdup_printf("%s], \"worker\": [", cluster);
        free(cluster);
        cluster = c;
        for (uint32_t w = 0, port = 40000; w < n_workers; w++, port++) {
                /* never listened on: the simulated workers only call; but distinct from the chief's and
                 * the shards' free ports, which may fall in the same range */
                for (uint32_t k = 0; k < 1 + n_shards; k++)
                        if ((uint32_t)ports[k] == port) {
                                port++;
                                k = (uint32_t)-1;   /* again from the first */
                        }
                c = strdup_printf("%s%s\"127.0.0.1:%u\"", cluster, w ? ", " : "", port);
                free(cluster);
                cluster = c;
        }
        static unsigned n_jobs;   /* each job its own name: psd's socket and state are by job name */
        j->id = n_jobs++;
        char *json = strdup_printf("{\"job\": \"bench-scale-%u\", \"cluster\": {%s]}, \"model\": {%s},"
                                   "\"data\": {\"dir\": \"/nonexistent\"}, \"training\": {\"optimizer\": \"momentum\","
                                   "\"momentum\": 0.9, \"learning_rate\": 0.001, \"batch_size\": 64},"
                                   "\"rpc\": {\"shared_memory\": false, \"wire_dtype\": \"%s\"},"
                                   /* the bench's own clients push as any worker, without certificates */
                                   "\"security\": {\"mode\": \"insecure\"}}\n", j->id, cluster, model,
                                   wire_dtype);
        free(cluster);
        snprintf(j->path, sizeof(j->path), "%s/job%u-%u-%u.json", workdir, j->id, n_shards, n_workers);
        FILE *f = fopen(j->path, "w");
        if (!f || fputs(json, f) < 0 || fclose(f) != 0) {
                free(json);
                return -errno;
        }
        free(json);
        char err[512];
        r = config_load(j->path, &j->cfg, err, sizeof(err));
        if (r < 0 || (r = job_layout_new(j->cfg, &j->L)) < 0) {
                fprintf(stderr, "bench_ps_scale: %s: %s\n", j->path, r < 0 ? err : strerror(-r));
                return r;
        }
        j->n_shards = n_shards;
        j->n_workers = n_workers;
        return 0;
}

/* In psd's child before its exec: --pin puts it on the last CPU. */
static void psd_child_setup(void) {
        if (pin)
                pin_to_cpus(true);
}

/* Shard `shard` of j as a process of its own, its output in workdir/psdJOB-SHARD.log. */
static pid_t psd_start(const struct job *j, uint32_t shard) {
        char idx[16], state[512], log[600];
        snprintf(idx, sizeof(idx), "%u", shard);
        snprintf(state, sizeof(state), "%s/state%u-%u", workdir, j->id, shard);
        snprintf(log, sizeof(log), "%s/psd%u-%u.log", workdir, j->id, shard);
        mkdir(state, 0700);
        char *argv[] = {(char *)psd_path, "--job", (char *)j->path, "--task-index", idx, "--state-dir", state, NULL};
        return daemons_spawn(argv, log, psd_child_setup);
}

static void job_stop(struct job *j) {
        for (uint32_t s = 0; s < j->n_shards; s++) {
                daemons_stop(j->psd[s], 30000);
                j->psd[s] = 0;
        }
        j->L = job_layout_free(j->L);
        j->cfg = config_free(j->cfg);
}

struct shard_probe {
        struct ps_client *pc;
        uint32_t shard;
};

/* daemons_wait_healthy's question: whether the shard answers its status call. */
static int shard_answers(void *arg, char *why, size_t len) {
        const struct shard_probe *p = arg;
        void *st = NULL;
        int r = ps_client_probe(p->pc, p->shard, 1000, &st, why, len);
        if (r == 0)
                psfleet__v1__shard_status__free_unpacked(st, NULL);
        return r;
}

/* Starts the shards and plays the chief: waits for each to answer, then assigns the initial values. */
static int job_start(struct job *j, struct ps_client **chief_ret) {
        for (uint32_t s = 0; s < j->n_shards; s++) {
                pid_t pid = psd_start(j, s);
                if (pid < 0)
                        return pid;
                j->psd[s] = pid;
        }
        struct ps_client *pc;
        char err[512];
        int r = ps_client_new(j->cfg, j->L, "chief:0", &pc);
        if (r < 0)
                return r;
        for (uint32_t s = 0; s < j->n_shards; s++) {
                struct shard_probe p = {pc, s};
                r = daemons_wait_healthy(j->psd[s], shard_answers, &p, 30000, 50, err, sizeof(err));
                if (r < 0) {
                        if (r == -ECHILD)
                                j->psd[s] = 0;   /* reaped */
                        fprintf(stderr, "bench_ps_scale: psd %u %s (log: %s/psd%u-%u.log)\n", s, err, workdir, j->id,
                                s);
                        ps_client_free(pc);
                        return r;
                }
        }
        float *params = calloc(j->L->n_params, sizeof(float));
        if (!params) {
                ps_client_free(pc);
                return -ENOMEM;
        }
        struct rng g;
        rng_init(&g, 1, 0);
        for (size_t i = 0; i < j->L->n_params; i++)
                params[i] = rng_uniform_f(&g, -0.05f, 0.05f);
        r = ps_client_assign(pc, NULL, params, NULL, 0, err, sizeof(err));
        free(params);
        if (r < 0) {
                fprintf(stderr, "bench_ps_scale: assign: %s\n", err);
                ps_client_free(pc);
                return r;
        }
        *chief_ret = pc;
        return 0;
}

/* ---- the simulated workers ---- */

struct run {
        struct job *j;
        uint64_t target;                /* pushes in all */
        _Atomic uint64_t taken;         /* pushes started (a ticket each) */
        _Atomic uint64_t done;
        _Atomic int failed;
        _Atomic uint64_t epoch_us;      /* set by the main thread once every worker is started: the schedules' start */
        float *lat_ms;                  /* (target) latency of push k (its ticket), ms */
        uint64_t *start_us;             /* (target) when push k started */
};

struct worker {
        struct run *run;
        uint32_t index;
        pthread_t thread;
};

static void *worker_main(void *arg) {
        struct worker *w = arg;
        struct run *run = w->run;
        struct job *j = run->j;
        struct ps_client *pc = NULL;
        struct ps_group *groups = calloc(j->n_shards, sizeof(*groups));
        float *params = calloc(j->L->n_params, sizeof(float)), *grads = malloc(j->L->n_params * sizeof(float));
        char task[32], err[512];
        snprintf(task, sizeof(task), "worker:%u", w->index);
        if (!groups || !params || !grads || ps_client_new(j->cfg, j->L, task, &pc) < 0)
                goto fail;
        struct rng g;
        rng_init(&g, 1000 + w->index, 0);
        for (size_t i = 0; i < j->L->n_params; i++)
                grads[i] = rng_uniform_f(&g, -5e-5f, 5e-5f);   /* finite, far under any norm limit */
        for (uint32_t s = 0; s < j->n_shards; s++)
                groups[s] = (struct ps_group){s, j->L->shard_count[s], j->L->shard_parts + j->L->shard_first[s]};
        if (ps_client_link(pc, w->index, j->n_shards, groups, params, grads, NULL, NULL) < 0)
                goto fail;
        uint64_t epoch;
        while (!(epoch = atomic_load(&run->epoch_us)))
                usleep(1000);
        /* paced: worker i pushes every n_workers / rate seconds, its first push offset by its index, as
         * workers that compute between pushes do; a push that comes late starts at once. With a think
         * time instead, each worker sleeps that long after each answer. */
        double period_us = rate > 0 ? 1e6 * j->n_workers / rate : 0;
        uint64_t next = epoch + (uint64_t)(period_us * w->index / (j->n_workers ? j->n_workers : 1));
        if (think_ms > 0)   /* the workers' first pushes spread over one think time */
                usleep((useconds_t)(think_ms * 1e3 * w->index / (j->n_workers ? j->n_workers : 1)));
        for (uint64_t step = 1;; step++) {
                if (think_ms > 0 && step > 1)
                        usleep((useconds_t)(think_ms * 1e3));
                if (period_us > 0) {
                        uint64_t now = now_us();
                        if (now < next)
                                usleep((useconds_t)(next - now));
                        next += (uint64_t)period_us;
                }
                uint64_t ticket = atomic_fetch_add(&run->taken, 1);
                if (ticket >= run->target || atomic_load(&run->failed))
                        break;
                uint64_t t0 = now_us();
                for (uint32_t s = 0; s < j->n_shards; s++)
                        ps_client_push(pc, s, step, s == 0);
                for (uint32_t s = 0; s < j->n_shards; s++) {
                        /* a connection refused as UNAVAILABLE is pushed again, twice at most, as workerd
                         * does (one of eight workers' first connects failed so once in CI); anything else,
                         * or a third time, fails the run */
                        int r;
                        for (int tries = 0; (r = ps_client_wait(pc, s, err, sizeof(err))) < 0 && tries < 2 &&
                                            strstr(err, "UNAVAILABLE"); tries++) {
                                fprintf(stderr, "bench_ps_scale: worker %u: %s: pushing again\n", w->index, err);
                                usleep(100000);
                                ps_client_push(pc, s, step, s == 0);
                        }
                        if (r < 0) {
                                fprintf(stderr, "bench_ps_scale: worker %u: %s\n", w->index, err);
                                goto fail;
                        }
                }
                run->lat_ms[ticket] = (float)((now_us() - t0) / 1e3);
                run->start_us[ticket] = t0;
                atomic_fetch_add(&run->done, 1);
        }
        ps_client_free(pc);
        free(groups), free(params), free(grads);
        return NULL;
fail:
        atomic_store(&run->failed, 1);
        ps_client_free(pc);
        free(groups), free(params), free(grads);
        return NULL;
}

/* ---- psd's cost, from /proc ---- */

static double proc_cpu_s(pid_t pid) {
        char path[64], buf[1024];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f)
                return 0;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        char *p = strrchr(buf, ')');   /* after the command's name, which may hold spaces */
        unsigned long ut = 0, st = 0;
        if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
                return 0;
        return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* field: "VmRSS" (now) or "VmHWM" (the peak since the last peak_reset) */
static double proc_mem_mb(pid_t pid, const char *field) {
        char path[64], line[256], fmt[32];
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        snprintf(fmt, sizeof(fmt), "%s: %%lf", field);
        FILE *f = fopen(path, "r");
        double kb = 0;
        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, fmt, &kb) == 1)
                        break;
        fclose(f);
        return kb / 1024.0;
}

static double proc_rss_mb(pid_t pid) {
        return proc_mem_mb(pid, "VmRSS");
}

/* Resets the process's peak RSS (VmHWM) to its RSS now (proc(5), clear_refs "5"), so that each window's
 * peak is its own: with dozens of 1 MB requests in flight the RSS at one instant says little. */
static void peak_reset(pid_t pid) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)pid);
        FILE *f = fopen(path, "w");
        if (f) {
                fputs("5", f);
                fclose(f);
        }
}

/* The machine's CPU time stolen by its hypervisor (the steal column of /proc/stat), in clock ticks: on a
 * shared host the same work takes longer while it grows. */
static double machine_steal_s(void) {
        FILE *f = fopen("/proc/stat", "r");
        unsigned long long v[8] = {0};
        if (!f)
                return 0;
        int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                       &v[6], &v[7]);
        fclose(f);
        return n == 8 ? (double)v[7] / (double)sysconf(_SC_CLK_TCK) : 0;
}

static int cmp_float(const void *a, const void *b) {
        float x = *(const float *)a, y = *(const float *)b;
        return (x > y) - (x < y);
}

static double quantile(float *v, size_t n, double q) {
        if (!n)
                return 0;
        qsort(v, n, sizeof(*v), cmp_float);
        size_t k = (size_t)ceil(q * (double)n);
        return v[k ? k - 1 : 0];
}

/* ---- how fast the machine is meanwhile ---- */

/* The same host runs other machines' work too, and the same push takes longer while they are busy: a
 * side-by-side probe times a fixed piece of work like a push's (copy 4 MiB, then add it up as floats)
 * every 50 ms, so that each window's latency can be set against how fast the machine was then. */
#define PROBE_FLOATS (1u << 20)

struct probe {
        pthread_t thread;
        _Atomic int stop;
        size_t n, cap;
        uint64_t *at_us;
        float *ms;
};

static void *probe_main(void *arg) {
        struct probe *pr = arg;
        float *a = malloc(PROBE_FLOATS * sizeof(float)), *b = malloc(PROBE_FLOATS * sizeof(float));
        volatile float sink = 0;
        for (size_t i = 0; a && b && i < PROBE_FLOATS; i++)
                a[i] = (float)(i & 1023), b[i] = 0;
        while (a && b && !atomic_load(&pr->stop)) {
                uint64_t t0 = now_us();
                memcpy(b, a, PROBE_FLOATS * sizeof(float));
                float sum = 0;
                for (size_t i = 0; i < PROBE_FLOATS; i++)
                        sum += b[i] * 0.5f;
                sink += sum;
                uint64_t t1 = now_us();
                if (pr->n == pr->cap) {
                        size_t cap = pr->cap ? 2 * pr->cap : 4096;
                        uint64_t *at = realloc(pr->at_us, cap * sizeof(*at));
                        if (at)
                                pr->at_us = at;
                        float *ms = at ? realloc(pr->ms, cap * sizeof(*ms)) : NULL;
                        if (!ms)
                                break;
                        pr->ms = ms, pr->cap = cap;
                }
                pr->at_us[pr->n] = t0, pr->ms[pr->n++] = (float)((t1 - t0) / 1e3);
                usleep(50000);
        }
        (void)sink;
        free(a), free(b);
        return NULL;
}

/* The median probe time in [t0, t1), ms; 0 when none. */
static double probe_median(const struct probe *pr, uint64_t t0, uint64_t t1) {
        float *v = malloc((pr->n ? pr->n : 1) * sizeof(float));
        size_t m = 0;
        for (size_t i = 0; v && i < pr->n; i++)
                if (pr->at_us[i] >= t0 && pr->at_us[i] < t1)
                        v[m++] = pr->ms[i];
        double r = v ? quantile(v, m, 0.5) : 0;
        free(v);
        return r;
}

/* The least and the largest of v[0..n), n > 0. */
static void range_of(const double *v, size_t n, double *min, double *max) {
        *min = *max = v[0];
        for (size_t i = 1; i < n; i++)
                *min = v[i] < *min ? v[i] : *min, *max = v[i] > *max ? v[i] : *max;
}

/* The largest distance of v[0..n) from their mean, in % of the mean. */
static double spread_pct(const double *v, size_t n) {
        double mean = 0, d = 0;
        for (size_t i = 0; i < n; i++)
                mean += v[i] / (double)n;
        for (size_t i = 0; i < n && mean > 0; i++)
                d = fabs(v[i] / mean - 1) > d ? fabs(v[i] / mean - 1) : d;
        return 100 * d;
}

/* One psd, n_workers simulated workers, `pushes` pushes: a JSON line per window and one in all. Beside
 * each window's p99, the probe's median then and their ratio (p99 in units of how fast the machine was). */
static int scale(uint32_t n_workers, uint64_t pushes) {
        struct job j = {0};
        struct ps_client *chief = NULL;
        struct probe pr = {0};
        bool probing = false;
        int r = job_write(&j, 1, n_workers, models[0]);
        if (r < 0 || (r = job_start(&j, &chief)) < 0) {
                job_stop(&j);
                return r;
        }
        struct run run = {.j = &j, .target = pushes, .lat_ms = calloc(pushes, sizeof(float)),
                          .start_us = calloc(pushes, sizeof(uint64_t))};
        struct worker *ws = calloc(n_workers, sizeof(*ws));
        uint32_t started = 0;
        if (!run.lat_ms || !run.start_us || !ws) {
                r = -ENOMEM;
                goto out;
        }
        pid_t psd = j.psd[0];
        if (pin)   /* this thread and the workers it starts, off psd's CPU */
                pin_to_cpus(false);
        double cpu0 = proc_cpu_s(psd), rss0 = proc_rss_mb(psd);
        for (; started < n_workers; started++) {
                ws[started] = (struct worker){&run, started, 0};
                if (pthread_create(&ws[started].thread, NULL, worker_main, &ws[started]) != 0) {
                        r = -EAGAIN;
                        goto out;
                }
        }
        probing = pthread_create(&pr.thread, NULL, probe_main, &pr) == 0;
        uint64_t t0 = now_us(), win_t[WINDOWS + 1] = {t0};
        atomic_store(&run.epoch_us, t0);
        /* windows: each tenth of the pushes, psd's RSS and CPU and the window's latencies */
        uint64_t win_len = pushes / WINDOWS ? pushes / WINDOWS : 1, prev_done = 0;
        double prev_cpu = cpu0, prev_steal = machine_steal_s(), peaks[WINDOWS] = {0};
        peak_reset(psd);
        for (unsigned k = 1; k <= WINDOWS && !atomic_load(&run.failed); k++) {
                uint64_t mark = k == WINDOWS ? pushes : k * win_len;
                while (atomic_load(&run.done) < mark && !atomic_load(&run.failed))
                        usleep(2000);
                uint64_t done = atomic_load(&run.done), t = win_t[k] = now_us();
                double cpu = proc_cpu_s(psd), peak = proc_mem_mb(psd, "VmHWM"), steal = machine_steal_s();
                peak_reset(psd);
                peaks[k - 1] = peak;
                double secs = (double)(t - win_t[k - 1]) / 1e6;
                printf("{\"bench\": \"ps_scale_window\", \"workers\": %u, \"window\": %u, \"pushes\": %llu, "
                       "\"pushes_per_s\": %.1f, \"psd_cpu_ms_per_push\": %.3f, \"psd_rss_mb\": %.1f, "
                       "\"psd_rss_peak_mb\": %.1f, \"machine_steal_pct\": %.2f}\n",
                       n_workers, k, (unsigned long long)done, (double)(done - prev_done) / secs,
                       (cpu - prev_cpu) * 1e3 / (double)(done - prev_done ? done - prev_done : 1), proc_rss_mb(psd),
                       peak, 100.0 * (steal - prev_steal) / secs / (double)sysconf(_SC_NPROCESSORS_ONLN));
                fflush(stdout);
                prev_done = done, prev_cpu = cpu, prev_steal = steal;
        }
        for (; started > 0; started--)
                pthread_join(ws[started - 1].thread, NULL);
        atomic_store(&pr.stop, 1);
        if (probing)
                pthread_join(pr.thread, NULL);
        probing = false;
        uint64_t t1 = now_us(), done = atomic_load(&run.done);
        double cpu1 = proc_cpu_s(psd), rss1 = proc_rss_mb(psd);
        if (latencies_path && done == pushes) {
                FILE *f = fopen(latencies_path, "w");
                if (!f)
                        fprintf(stderr, "bench_ps_scale: %s: %s\n", latencies_path, strerror(errno));
                for (uint64_t k = 0; f && k < done; k++)
                        fprintf(f, "push %llu %.3f %.3f\n", (unsigned long long)k, (run.start_us[k] - t0) / 1e3,
                                run.lat_ms[k]);
                for (size_t k = 0; f && k < pr.n; k++)
                        fprintf(f, "probe %zu %.3f %.3f\n", k, ((double)pr.at_us[k] - (double)t0) / 1e3, pr.ms[k]);
                if (f && fclose(f) != 0)
                        fprintf(stderr, "bench_ps_scale: %s: %s\n", latencies_path, strerror(errno));
        }
        /* per window of tickets: p99 (the flatness check), then over all; the first window warms up
         * (connections, allocations) and is left out of the ranges */
        double p99s[WINDOWS] = {0}, qs[WINDOWS] = {0};
        for (unsigned k = 0; k < WINDOWS && done == pushes; k++) {
                uint64_t a = k * win_len, b = k == WINDOWS - 1 ? pushes : a + win_len;
                double p50 = quantile(run.lat_ms + a, b - a, 0.5), p99 = quantile(run.lat_ms + a, b - a, 0.99);
                double probe = probe_median(&pr, win_t[k], win_t[k + 1]), q = probe > 0 ? p99 / probe : 0;
                printf("{\"bench\": \"ps_scale_latency_window\", \"workers\": %u, \"window\": %u, \"p50_ms\": %.3f, "
                       "\"p99_ms\": %.3f, \"probe_ms\": %.3f, \"p99_over_probe\": %.3f}\n",
                       n_workers, k + 1, p50, p99, probe, q);
                p99s[k] = p99, qs[k] = q;
        }
        /* the ranges over windows 2..10 (the first grows to the steady state) */
        double p99_min, p99_max, q_min, q_max, peak_min, peak_max;
        range_of(p99s + 1, WINDOWS - 1, &p99_min, &p99_max);
        range_of(qs + 1, WINDOWS - 1, &q_min, &q_max);
        range_of(peaks + 1, WINDOWS - 1, &peak_min, &peak_max);
        double p50 = quantile(run.lat_ms, done, 0.5), p99 = quantile(run.lat_ms, done, 0.99);
        /* flatness: how far the windows after the first stray from their mean, in % */
        printf("{\"bench\": \"ps_scale_flatness\", \"workers\": %u, \"pushes\": %llu, \"windows\": \"2-%d\", "
               "\"p99_spread_pct\": %.1f, \"p99_over_probe_spread_pct\": %.1f, \"psd_rss_peak_spread_pct\": %.1f}\n",
               n_workers, (unsigned long long)done, WINDOWS, spread_pct(p99s + 1, WINDOWS - 1),
               spread_pct(qs + 1, WINDOWS - 1), spread_pct(peaks + 1, WINDOWS - 1));
        printf("{\"bench\": \"ps_scale\", \"wire_dtype\": \"%s\", \"rate\": %.0f, \"think_ms\": %.1f, \"pinned\": %s, "
               "\"workers\": %u, \"pushes\": %llu, \"push_bytes\": %zu, "
               "\"pushes_per_s\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"psd_cpu_ms_per_push\": %.3f, "
               "\"psd_rss_mb_start\": %.1f, \"psd_rss_mb_end\": %.1f, \"p99_ms_first_window\": %.3f, "
               "\"p99_ms_windows_min\": %.3f, \"p99_ms_windows_max\": %.3f, \"p99_over_probe_windows_min\": %.3f, "
               "\"p99_over_probe_windows_max\": %.3f, \"psd_rss_peak_mb_windows_min\": %.1f, "
               "\"psd_rss_peak_mb_windows_max\": %.1f, \"failed\": %s}\n",
               wire_dtype, rate, think_ms, pin ? "true" : "false", n_workers, (unsigned long long)done,
               j.L->n_params * (strcmp(wire_dtype, "bfloat16") == 0 ? 2 : sizeof(float)),
               (double)done / ((t1 - t0) / 1e6), p50, p99, (cpu1 - cpu0) * 1e3 / (double)(done ? done : 1), rss0, rss1,
               p99s[0], p99_min, p99_max, q_min, q_max, peak_min, peak_max, atomic_load(&run.failed) ? "true" : "false");
        fflush(stdout);
        r = atomic_load(&run.failed) ? -EIO : 0;
out:
        if (r < 0) {   /* workers started before a failure: let them go */
                atomic_store(&run.failed, 1);
                atomic_store(&run.epoch_us, 1);
        }
        for (; started > 0; started--)
                pthread_join(ws[started - 1].thread, NULL);
        atomic_store(&pr.stop, 1);
        if (probing)
                pthread_join(pr.thread, NULL);
        free(pr.at_us), free(pr.ms);
        free(run.lat_ms), free(run.start_us), free(ws);
        ps_client_free(chief);
        job_stop(&j);
        return r;
}

/* n_shards psd, one worker, `pushes` pushes of a model: what each shard received, and the ratio. */
static int load(uint32_t n_shards, unsigned model, uint64_t pushes) {
        struct job j = {0};
        struct ps_client *chief = NULL;
        int r = job_write(&j, n_shards, 1, models[model]);
        if (r < 0 || (r = job_start(&j, &chief)) < 0) {
                job_stop(&j);
                return r;
        }
        struct run run = {.j = &j, .target = pushes, .lat_ms = calloc(pushes, sizeof(float)),
                          .start_us = calloc(pushes, sizeof(uint64_t)), .epoch_us = 1};
        struct worker w = {&run, 0, 0};
        if (!run.lat_ms || !run.start_us) {
                free(run.lat_ms), free(run.start_us);
                ps_client_free(chief);
                job_stop(&j);
                return -ENOMEM;
        }
        worker_main(&w);
        free(run.start_us);
        uint64_t in_min = UINT64_MAX, in_max = 0, ap_min = UINT64_MAX, ap_max = 0, held_min = UINT64_MAX, held_max = 0;
        char per_shard[1024] = "";
        size_t off = 0;
        for (uint32_t s = 0; s < n_shards && !atomic_load(&run.failed); s++) {
                void *m;
                char err[512];
                if ((r = ps_client_status(chief, s, &m, err, sizeof(err))) < 0) {
                        fprintf(stderr, "bench_ps_scale: status of shard %u: %s\n", s, err);
                        break;
                }
                const Psfleet__V1__ShardStatus *st = m;
                in_min = st->bytes_in < in_min ? st->bytes_in : in_min;
                in_max = st->bytes_in > in_max ? st->bytes_in : in_max;
                ap_min = st->apply_us < ap_min ? st->apply_us : ap_min;
                ap_max = st->apply_us > ap_max ? st->apply_us : ap_max;
                held_min = st->bytes < held_min ? st->bytes : held_min;
                held_max = st->bytes > held_max ? st->bytes : held_max;
                off += (size_t)snprintf(per_shard + off, sizeof(per_shard) - off, "%s[%llu, %llu]", s ? ", " : "",
                                        (unsigned long long)st->bytes_in, (unsigned long long)st->apply_us);
                psfleet__v1__shard_status__free_unpacked(m, NULL);
        }
        uint64_t largest = 0;
        for (uint32_t v = 0; v < j.L->n_vars; v++) {
                uint64_t b = 0;
                uint32_t first, n = placement_var_parts(j.L->plan, v, &first);
                for (uint32_t p = first; p < first + n; p++)
                        b += j.L->plan->parts[p].bytes;
                largest = b > largest ? b : largest;
        }
        if (r >= 0 && !atomic_load(&run.failed))
                printf("{\"bench\": \"ps_load\", \"model\": \"%s\", \"shards\": %u, \"params_bytes\": %zu, "
                       "\"largest_variable_bytes\": %llu, \"parts\": %u, \"pushes\": %llu, "
                       "\"bytes_in_max_over_min\": %.3f, \"apply_us_max_over_min\": %.3f, "
                       "\"bytes_held_max_over_min\": %.3f, \"per_shard_bytes_in_apply_us\": [%s]}\n",
                       model_names[model], n_shards, j.L->n_params * sizeof(float), (unsigned long long)largest,
                       j.L->plan->n_parts, (unsigned long long)pushes, (double)in_max / (double)(in_min ? in_min : 1),
                       (double)ap_max / (double)(ap_min ? ap_min : 1),
                       (double)held_max / (double)(held_min ? held_min : 1), per_shard);
        fflush(stdout);
        r = r < 0 ? r : atomic_load(&run.failed) ? -EIO : 0;
        free(run.lat_ms);
        ps_client_free(chief);
        job_stop(&j);
        return r;
}

/* --rate and --think-ms: a whole number in [1, max], as the double it is used as. 0, or -EINVAL. */
static int parse_whole(const char *s, uint64_t max, double *ret) {
        uint64_t v;
        if (parse_u64(s, 1, max, &v) < 0)
                return -EINVAL;
        *ret = (double)v;
        return 0;
}

static void usage(FILE *f) {
        fprintf(f, "usage: bench_ps_scale [--workers 1,8,64,256] [--pushes N] [--shards S] [--load-pushes N]\n"
                   "                      [--no-load] [--no-scale] [--psd PATH] [--wire-dtype float32|bfloat16]\n"
                   "                      [--rate PUSHES_PER_S] [--think-ms MS] [--pin] [--latencies FILE]\n"

                   "One psd over gRPC against simulated workers (threads, real-sized pushes of the demo model),\n"
                   "closed loop, paced (--rate: pushes/s in all) or with a think time after each answer;\n"
                   "--pin: psd on the last CPU, the workers on the others; --latencies: every push and probe.\n"
                   "and the load between S shards for the demo model and for one with a very large variable.\n");
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                {"workers", required_argument, NULL, 'w'}, {"pushes", required_argument, NULL, 'n'},
                {"shards", required_argument, NULL, 's'}, {"load-pushes", required_argument, NULL, 'l'},
                {"no-load", no_argument, NULL, 'L'}, {"no-scale", no_argument, NULL, 'S'},
                {"psd", required_argument, NULL, 'p'}, {"wire-dtype", required_argument, NULL, 'd'},
                {"rate", required_argument, NULL, 'r'}, {"think-ms", required_argument, NULL, 't'},
                {"pin", no_argument, NULL, 'P'}, {"latencies", required_argument, NULL, 'D'},
                {"help", no_argument, NULL, 'h'}, {},
        };
        char workers_list[256] = "1,8,64,256";
        uint64_t pushes = 20000, load_pushes = 200, shards = 4;
        bool do_load = true, do_scale = true;
        int c;
        while ((c = getopt_long(argc, argv, "", opts, NULL)) >= 0) {
                bool bad = false;
                switch (c) {
                case 'w': snprintf(workers_list, sizeof(workers_list), "%s", optarg); break;
                case 'n': bad = parse_u64(optarg, 10, 100000000, &pushes) < 0; break;
                case 's': bad = parse_u64(optarg, 2, 64, &shards) < 0; break;
                case 'l': bad = parse_u64(optarg, 1, 1000000, &load_pushes) < 0; break;
                case 'L': do_load = false; break;
                case 'S': do_scale = false; break;
                case 'p': psd_path = optarg; break;
                case 'r': bad = parse_whole(optarg, 1000000, &rate) < 0; break;
                case 't': bad = parse_whole(optarg, 60000, &think_ms) < 0; break;
                case 'P': pin = true; break;
                case 'D': latencies_path = optarg; break;
                case 'd':
                        bad = strcmp(optarg, "float32") != 0 && strcmp(optarg, "bfloat16") != 0;
                        wire_dtype = optarg;
                        break;
                case 'h': usage(stdout); return 0;
                default: usage(stderr); return 64;
                }
                if (bad)
                        return usage(stderr), 64;
        }
        if (access(psd_path, X_OK) != 0) {
                fprintf(stderr, "bench_ps_scale: %s: %s (build psd, or --psd PATH)\n", psd_path, strerror(errno));
                return 69;
        }
        int made = scratch_make(workdir, sizeof(workdir), "bench-scale");
        if (made < 0) {
                fprintf(stderr, "bench_ps_scale: its directory: %s\n", strerror(-made));
                return 74;
        }
        signal(SIGPIPE, SIG_IGN);
        int r = 0;
        for (char *save = NULL, *tok = strtok_r(do_scale ? workers_list : NULL, ",", &save); tok && r >= 0;
             tok = strtok_r(NULL, ",", &save)) {
                uint64_t n;
                if (parse_u64(tok, 1, MAX_WORKERS, &n) < 0) {
                        fprintf(stderr, "bench_ps_scale: --workers: \"%s\" is not 1..%d\n", tok, MAX_WORKERS);
                        r = -EINVAL;
                        break;
                }
                r = scale((uint32_t)n, pushes);
        }
        for (unsigned m = 0; do_load && r >= 0 && m < 2; m++)
                r = load((uint32_t)shards, m, load_pushes);
        if (r >= 0 && rm_tree(workdir) < 0)
                fprintf(stderr, "bench_ps_scale: could not remove %s\n", workdir);
        if (r < 0)
                fprintf(stderr, "bench_ps_scale: failed (%s); psd logs in %s\n", strerror(-r), workdir);
        return r < 0 ? 1 : 0;
}
