/* The process's metric series in one fixed table: registration takes a lock, updates are single
 * atomic operations on the series (the hot path never locks), and a scrape reads them as they are. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "util.h"

#define METRICS_MAX 512
#define LABEL_MAX 64

enum metric_type { M_COUNTER, M_GAUGE, M_AGE, M_HISTOGRAM };
static const char *const type_names[] = {
        [M_COUNTER] = "counter", [M_GAUGE] = "gauge", [M_AGE] = "gauge", [M_HISTOGRAM] = "histogram",
};

struct metric {
        enum metric_type type;
        const char *name, *help, *label_name;  /* the caller's static strings */
        char label_value[LABEL_MAX];
        _Atomic uint64_t value;                 /* counter: the count; gauge: double bits; age: mono_us, 0 never */
        _Atomic uint64_t sum;                   /* histogram: double bits */
        double *bounds;                         /* histogram: n_bounds upper bounds */
        _Atomic uint64_t *counts;               /* histogram: n_bounds + 1 (the last: +Inf), not cumulative */
        size_t n_bounds;
};

const double metrics_latency_buckets[] = {
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10,
};
const size_t metrics_n_latency_buckets = ELEMENTSOF(metrics_latency_buckets);

static struct metric table[METRICS_MAX];
static _Atomic size_t n_table;            /* published after the series is complete */
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t dbits(double v) {
        uint64_t u;
        memcpy(&u, &v, sizeof(u));
        return u;
}

static double bitsd(uint64_t u) {
        double v;
        memcpy(&v, &u, sizeof(v));
        return v;
}

static struct metric *reg(enum metric_type type, const char *name, const char *help, const char *label_name,
                          const char *label_value, const double *bounds, size_t n_bounds) {
        struct metric *m = NULL;
        pthread_mutex_lock(&table_mu);
        size_t n = atomic_load(&n_table);
        for (size_t i = 0; i < n; i++)
                if (strcmp(table[i].name, name) == 0 &&
                    (table[i].type != type || !table[i].label_name != !label_name ||
                     (label_name && strcmp(table[i].label_name, label_name) != 0))) {
                        log_error("metric %s registered twice with different types or labels", name);
                        goto out;
                } else if (strcmp(table[i].name, name) == 0 &&
                           (!label_name || strncmp(table[i].label_value, label_value ? label_value : "", LABEL_MAX - 1) == 0)) {
                        m = &table[i];   /* the same series again: one series, whoever registers it */
                        goto out;
                }
        if (n == METRICS_MAX) {
                log_error("metric %s: the table of %d series is full", name, METRICS_MAX);
                goto out;
        }
        m = &table[n];
        *m = (struct metric){.type = type, .name = name, .help = help, .label_name = label_name};
        if (label_name)
                snprintf(m->label_value, sizeof(m->label_value), "%s", label_value ? label_value : "");
        if (type == M_HISTOGRAM) {
                m->bounds = malloc(n_bounds * sizeof(*m->bounds));
                m->counts = calloc(n_bounds + 1, sizeof(*m->counts));
                if (!m->bounds || !m->counts) {
                        free(m->bounds);
                        free(m->counts);
                        m = NULL;
                        goto out;
                }
                memcpy(m->bounds, bounds, n_bounds * sizeof(*bounds));
                m->n_bounds = n_bounds;
        }
        if (type == M_GAUGE)
                atomic_store(&m->value, dbits(0));
        atomic_store(&n_table, n + 1);
out:
        pthread_mutex_unlock(&table_mu);
        return m;
}

struct metric *metric_counter(const char *name, const char *help, const char *label_name, const char *label_value) {
        return reg(M_COUNTER, name, help, label_name, label_value, NULL, 0);
}

struct metric *metric_gauge(const char *name, const char *help, const char *label_name, const char *label_value) {
        return reg(M_GAUGE, name, help, label_name, label_value, NULL, 0);
}

struct metric *metric_age(const char *name, const char *help, const char *label_name, const char *label_value) {
        return reg(M_AGE, name, help, label_name, label_value, NULL, 0);
}

struct metric *metric_histogram(const char *name, const char *help, const char *label_name, const char *label_value,
                                const double *bounds, size_t n) {
        return reg(M_HISTOGRAM, name, help, label_name, label_value, bounds, n);
}

void metric_add(struct metric *m, uint64_t n) {
        if (m)
                atomic_fetch_add_explicit(&m->value, n, memory_order_relaxed);
}

void metric_set(struct metric *m, double v) {
        if (m)
                atomic_store_explicit(&m->value, dbits(v), memory_order_relaxed);
}

void metric_touch(struct metric *m) {
        if (m)
                atomic_store_explicit(&m->value, mono_us() | 1, memory_order_relaxed);
}

void metric_observe(struct metric *m, double v) {
        if (!m)
                return;
        size_t b = 0;
        while (b < m->n_bounds && v > m->bounds[b])
                b++;
        atomic_fetch_add_explicit(&m->counts[b], 1, memory_order_relaxed);
        uint64_t old = atomic_load_explicit(&m->sum, memory_order_relaxed);
        while (!atomic_compare_exchange_weak_explicit(&m->sum, &old, dbits(bitsd(old) + v), memory_order_relaxed,
                                                      memory_order_relaxed))
                ;
}

void metric_observe_us(struct metric *m, uint64_t us) {
        metric_observe(m, (double)us * 1e-6);
}

/* A number as the exposition format writes it. */
static void put_num(FILE *f, double v) {
        if (isnan(v))
                fputs("NaN", f);
        else if (isinf(v))
                fputs(v > 0 ? "+Inf" : "-Inf", f);
        else
                fprintf(f, "%.15g", v);
}

/* `{label="value"` with the value escaped, and `extra` (another label) after it; `}` closes. */
static void put_labels(FILE *f, const struct metric *m, const char *le) {
        if (!m->label_name && !le)
                return;
        fputc('{', f);
        if (m->label_name) {
                fprintf(f, "%s=\"", m->label_name);
                for (const char *c = m->label_value; *c; c++) {
                        if (*c == '\\' || *c == '"')
                                fputc('\\', f);
                        if (*c == '\n')
                                fputs("\\n", f);
                        else
                                fputc(*c, f);
                }
                fputc('"', f);
        }
        if (le)
                fprintf(f, "%sle=\"%s\"", m->label_name ? "," : "", le);
        fputc('}', f);
}

static void put_series(FILE *f, const struct metric *m, uint64_t now) {
        switch (m->type) {
        case M_COUNTER:
                fputs(m->name, f);
                put_labels(f, m, NULL);
                fprintf(f, " %llu\n", (unsigned long long)atomic_load(&m->value));
                return;
        case M_GAUGE:
        case M_AGE: {
                uint64_t v = atomic_load(&m->value);
                fputs(m->name, f);
                put_labels(f, m, NULL);
                fputc(' ', f);
                if (m->type == M_GAUGE)
                        put_num(f, bitsd(v));
                else
                        put_num(f, v ? (double)(now > v ? now - v : 0) * 1e-6 : NAN);
                fputc('\n', f);
                return;
        }
        case M_HISTOGRAM: {
                uint64_t cum = 0;
                char le[32];
                for (size_t b = 0; b <= m->n_bounds; b++) {
                        cum += atomic_load(&m->counts[b]);
                        if (b < m->n_bounds)
                                snprintf(le, sizeof(le), "%g", m->bounds[b]);
                        else
                                snprintf(le, sizeof(le), "+Inf");
                        fprintf(f, "%s_bucket", m->name);
                        put_labels(f, m, le);
                        fprintf(f, " %llu\n", (unsigned long long)cum);
                }
                fprintf(f, "%s_sum", m->name);
                put_labels(f, m, NULL);
                fputc(' ', f);
                put_num(f, bitsd(atomic_load(&m->sum)));
                fprintf(f, "\n%s_count", m->name);
                put_labels(f, m, NULL);
                fprintf(f, " %llu\n", (unsigned long long)cum);
                return;
        }
        }
}

char *metrics_render(size_t *len) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        uint64_t now = mono_us();
        pthread_mutex_lock(&table_mu);
        size_t n = atomic_load(&n_table);
        for (size_t i = 0; i < n; i++) {
                bool first = true;
                for (size_t j = 0; j < i && first; j++)
                        first = strcmp(table[j].name, table[i].name) != 0;
                if (!first)
                        continue;
                fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", table[i].name, table[i].help, table[i].name,
                        type_names[table[i].type]);
                for (size_t j = i; j < n; j++)
                        if (strcmp(table[j].name, table[i].name) == 0)
                                put_series(f, &table[j], now);
        }
        pthread_mutex_unlock(&table_mu);
        if (fclose(f) != 0) {
                free(buf);
                return NULL;
        }
        *len = size;
        return buf;
}

void metrics_reset(void) {
        pthread_mutex_lock(&table_mu);
        size_t n = atomic_load(&n_table);
        for (size_t i = 0; i < n; i++) {
                free(table[i].bounds);
                free(table[i].counts);
        }
        atomic_store(&n_table, 0);
        pthread_mutex_unlock(&table_mu);
}
