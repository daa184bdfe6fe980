/* What a scrape of chiefd shows (docs/operations.md, "Metrics"): the job's state and step, its
 * checkpoints, and how long ago each worker reported. Set where the things happen; read by the
 * metrics server's thread without chiefd's lock. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "chief_metrics.h"

#include "metrics.h"
#include "util.h"

/* JobState's names as the state label says them, indexed by the enum */
static const char *const state_names[] = {
        "UNSPECIFIED", "INITIALIZING", "RESTORING", "READY", "TRAINING", "STOPPING", "DONE", "FAILED", "STOPPED",
};

static struct metric *m_state[ELEMENTSOF(state_names)], *m_step, *m_rate, *m_ckpt_seconds, *m_ckpt_bytes, *m_ckpt_time,
        *m_ckpt_failed, *m_live;
static struct metric **m_report_age;   /* (n_worker) */
static uint32_t n_report_age;
/* ps.replicas 2, per shard (n_rep) */
static struct metric **m_epoch, **m_replicated, **m_lag, **m_failovers;
static uint32_t n_rep;

static void replicas_init(uint32_t n) {
        n_rep = n;
        m_epoch = calloc(n + 1, sizeof(*m_epoch));
        m_replicated = calloc(n + 1, sizeof(*m_replicated));
        m_lag = calloc(n + 1, sizeof(*m_lag));
        m_failovers = calloc(n + 1, sizeof(*m_failovers));
        if (!m_epoch || !m_replicated || !m_lag || !m_failovers) {
                n_rep = 0;
                return;
        }
        for (uint32_t s = 0; s < n; s++) {
                char i[16];
                snprintf(i, sizeof(i), "%u", s);
                m_epoch[s] = metric_gauge("psfleet_chief_shard_epoch", "ps.replicas 2: the epoch of the shard's "
                                          "primary (each fail-over makes a new one).", "shard", i);
                m_replicated[s] = metric_gauge("psfleet_chief_shard_replicated", "ps.replicas 2: 1 while the shard's "
                                               "backup holds every update, 0 while it runs unreplicated.", "shard", i);
                m_lag[s] = metric_gauge("psfleet_chief_shard_replication_lag_seconds", "ps.replicas 2: the last "
                                        "update's round trip from the shard's primary to its backup.", "shard", i);
                m_failovers[s] = metric_gauge("psfleet_chief_shard_failovers", "ps.replicas 2: backups of the shard "
                                              "promoted by this chief.", "shard", i);
        }
}

void chief_metrics_replica(uint32_t shard, uint64_t epoch, bool replicated, uint64_t lag_us, uint64_t failovers) {
        if (shard >= n_rep)
                return;
        metric_set(m_epoch[shard], (double)epoch);
        metric_set(m_replicated[shard], replicated);
        metric_set(m_lag[shard], (double)lag_us / 1e6);
        metric_set(m_failovers[shard], (double)failovers);
}

void chief_metrics_init(uint32_t n_worker, uint32_t n_replicated) {
        if (n_replicated)
                replicas_init(n_replicated);
        for (size_t s = 1; s < ELEMENTSOF(state_names); s++)
                m_state[s] = metric_gauge("psfleet_chief_job_state", "1 for the job's current state, 0 for the others "
                                          "(psfleet status says the same).", "state", state_names[s]);
        m_step = metric_gauge("psfleet_chief_global_step", "global_step as the chief last read it from ps:0.", NULL, NULL);
        m_rate = metric_gauge("psfleet_chief_steps_per_second", "global_step's rate over the last 10 s.", NULL, NULL);
        m_live = metric_gauge("psfleet_chief_workers_live", "Workers that reported within "
                              "supervisor.worker_timeout_secs.", NULL, NULL);
        m_ckpt_seconds = metric_histogram("psfleet_chief_checkpoint_seconds", "Time to write and record one "
                                          "checkpoint (after the pull).", NULL, NULL, metrics_latency_buckets,
                                          metrics_n_latency_buckets);
        m_ckpt_bytes = metric_gauge("psfleet_chief_checkpoint_bytes", "Size of the newest checkpoint file.", NULL, NULL);
        m_ckpt_time = metric_gauge("psfleet_chief_last_checkpoint_timestamp_seconds", "When the newest checkpoint was "
                                   "recorded (Unix time; NaN: none yet).", NULL, NULL);
        m_ckpt_failed = metric_counter("psfleet_chief_checkpoint_failures_total", "Checkpoints that could not be "
                                       "written.", NULL, NULL);
        metric_set(m_ckpt_time, NAN);
        n_report_age = n_worker;
        m_report_age = calloc(n_report_age, sizeof(*m_report_age));
        for (uint32_t w = 0; m_report_age && w < n_report_age; w++) {
                char i[16];
                snprintf(i, sizeof(i), "%u", w);
                m_report_age[w] = metric_age("psfleet_chief_worker_last_report_age_seconds", "Seconds since the "
                                             "worker's last report (NaN: none since the chief started).", "worker", i);
        }
}

void chief_metrics_done(void) {
        free(m_report_age);
        m_report_age = NULL;
        n_report_age = 0;
        free(m_epoch);
        free(m_replicated);
        free(m_lag);
        free(m_failovers);
        m_epoch = m_replicated = m_lag = m_failovers = NULL;
        n_rep = 0;
}

void chief_metrics_state(Psfleet__V1__JobState st) {
        for (size_t s = 1; s < ELEMENTSOF(state_names); s++)
                metric_set(m_state[s], (size_t)st == s);
}

void chief_metrics_tick(Psfleet__V1__JobState st, uint64_t global_step, double steps_per_s, uint32_t live) {
        chief_metrics_state(st);   /* also the state found in the database at start */
        metric_set(m_step, (double)global_step);
        metric_set(m_rate, steps_per_s);
        metric_set(m_live, live);
}

void chief_metrics_report(uint32_t worker) {
        if (m_report_age && worker < n_report_age)
                metric_touch(m_report_age[worker]);
}

void chief_metrics_checkpoint(int r, uint64_t us, const struct chief_db_checkpoint *row) {
        if (r < 0) {
                metric_add(m_ckpt_failed, 1);
                return;
        }
        if (us)
                metric_observe_us(m_ckpt_seconds, us);
        metric_set(m_ckpt_bytes, (double)row->bytes);
        metric_set(m_ckpt_time, (double)row->time_us * 1e-6);
}
