/* psfleet top's arithmetic, kept apart from its calls so that a unit test holds it to its definitions:
 * a worker's steps/s from two of the chief's reports of it, a counter's rate between two samples, and
 * which workers are stragglers. Pure functions: no I/O, no allocation, thread-safe. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A straggler (docs/operations.md, "psfleet top"): a training worker that is
 *   silent: no report for longer than TOP_SILENT_FACTOR of its report intervals (its own, else the
 *           median of the others') and at least TOP_SILENT_MIN_S, or
 *   slow:   steps/s below TOP_SLOW_FRACTION of the median of the training workers whose rate is known
 *           (judged only when at least two are). */
#define TOP_SLOW_FRACTION 0.5
#define TOP_SILENT_FACTOR 3.0
#define TOP_SILENT_MIN_S 2.0    /* a busy host delays a healthy worker's report by this much */

/* What one JobStatus says of a worker. */
struct top_report {
        bool reported;                  /* it has reported at least once */
        uint64_t local_step, examples;  /* as of its last report */
        double examples_per_s;          /* as it measured over its last report window */
        uint64_t last_report_us;        /* the chief's wall clock at that report */
};

enum top_straggler { TOP_OK = 0, TOP_SLOW, TOP_SILENT };

/* One worker as top_stragglers judges it. */
struct top_worker {
        bool training;                  /* has reported, and neither done nor failed */
        double steps_per_s;             /* NAN: unknown */
        double age_s;                   /* since its last report; NAN: never reported */
        double report_interval_s;       /* between its last two reports; 0: unknown */
        enum top_straggler straggler;   /* set by top_stragglers */
};

/* A counter's rate per second from `before` to `after` over dt_us; NAN when dt_us is 0 or the counter
 * went back (the process restarted). */
double top_rate(uint64_t before, uint64_t after, uint64_t dt_us);

/* A worker's steps/s: its step difference over the time between two of its reports when `before`
 * (nullable) is an earlier report than `after`; else its own examples/s over the examples one step
 * takes (examples / local_step). NAN when neither can be known. */
double top_worker_rate(const struct top_report *before, const struct top_report *after);

/* The median of the finite values of v[0..n); NAN when there is none. */
double top_median(const double *v, size_t n);

/* Marks each of w[0..n) (straggler) by the definition above. Returns the median steps/s of the
 * training workers it compared against (NAN: fewer than two known). */
double top_stragglers(struct top_worker *w, size_t n);

/* "slow", "silent", or NULL for TOP_OK. */
const char *top_straggler_name(enum top_straggler s);
