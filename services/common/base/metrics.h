/* The process's Prometheus metrics: counters, gauges and histograms with fixed buckets, registered once
 * at start and updated with atomics on the hot path (no lock, no allocation), rendered in the text
 * exposition format (version 0.0.4) for transport/metrics_http.c to serve at /metrics. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* One series: a name and at most one label. Registered series live until metrics_reset(). Every
 * update function accepts NULL (a series that could not be registered) and does nothing then. */
struct metric;

/* Buckets of latency histograms, in seconds: 50 µs to 10 s. */
extern const double metrics_latency_buckets[];
extern const size_t metrics_n_latency_buckets;

/* Registers a series: name with its unit ("psfleet_ps_pushes_total"), help (one line, the same for
 * every series of a name), and an optional label (label_name NULL: none; `label_value` is copied).
 * Series of one name must share type, help and label name; registering a series again returns the
 * first (a histogram keeps its first buckets). Returns the series, or NULL when the
 * table is full or the arguments are inconsistent (logged once). Thread-safe. */
struct metric *metric_counter(const char *name, const char *help, const char *label_name, const char *label_value);
struct metric *metric_gauge(const char *name, const char *help, const char *label_name, const char *label_value);
/* A gauge that shows the seconds since the last metric_touch() (NaN before the first). */
struct metric *metric_age(const char *name, const char *help, const char *label_name, const char *label_value);
/* bounds: n ascending upper bounds in the unit of the name (seconds), copied; +Inf is added. */
struct metric *metric_histogram(const char *name, const char *help, const char *label_name, const char *label_value,
                                const double *bounds, size_t n);

/* Counters: add n. */
void metric_add(struct metric *m, uint64_t n);
/* Gauges: set to v. */
void metric_set(struct metric *m, double v);
/* Ages: now. */
void metric_touch(struct metric *m);
/* Histograms: one observation of `us` microseconds (recorded as seconds). */
void metric_observe_us(struct metric *m, uint64_t us);
/* Histograms: one observation of v (in the unit of the bounds). */
void metric_observe(struct metric *m, double v);

/* The exposition of every registered series, grouped by name in registration order, each name with
 * its HELP and TYPE lines. Returns a malloc'd string (caller frees) and its length in *len, or NULL
 * when out of memory. Thread-safe against updates and registrations. */
char *metrics_render(size_t *len);

/* Forgets every series (their pointers become invalid): for tests. */
void metrics_reset(void);
