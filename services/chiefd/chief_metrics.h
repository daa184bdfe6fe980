/* What a scrape of chiefd shows (base/metrics.h): the series, set where things happen. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "chief_db.h"
#include "psfleet/v1/supervisor.pb-c.h"

/* Registers chiefd's series (one report age per worker; with n_replicated shards, ps.replicas 2, each
 * shard's epoch, replication, lag and fail-overs); chief_metrics_done frees what init allocated. */
void chief_metrics_init(uint32_t n_worker, uint32_t n_replicated);
void chief_metrics_done(void);
/* The job's state is now st (one-hot psfleet_chief_job_state). */
void chief_metrics_state(Psfleet__V1__JobState st);
/* The state, global_step, its rate and the live workers; each pass of the main loop. */
void chief_metrics_tick(Psfleet__V1__JobState st, uint64_t global_step, double steps_per_s, uint32_t live);
/* ps.replicas 2: shard's state as the chief's probe found it (failovers: so far, a counter). */
void chief_metrics_replica(uint32_t shard, uint64_t epoch, bool replicated, uint64_t lag_us, uint64_t failovers);
/* Worker `worker`'s report was taken. */
void chief_metrics_report(uint32_t worker);
/* A checkpoint save ended with r; when r >= 0, row is the newest checkpoint, written in us
 * microseconds (0: found, not written, as at start). */
void chief_metrics_checkpoint(int r, uint64_t us, const struct chief_db_checkpoint *row);
