/* chiefd's Supervisor.Export: one thread writes the exports asked for (chief_export.h), one at a time,
 * into the chief's state directory, and answers each call when its export is whole. The handler that
 * takes the call is chief_rpc.c's; it hands the call over here, so no server thread waits on an export
 * and concurrent calls are served in turn. The chains of increments are read through the chief's own
 * checkpoint store, under its lock: retention cannot remove a link mid-read, and a checkpoint being
 * saved (or deleted) meanwhile waits for that read, the files' reading alone, not the export's writing. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

struct chief_ckpt;
struct chief_db;
struct chief_exporter;
struct job_config;
struct rpc_call;

/* What an Export call asks (Psfleet__V1__ExportRequest's fields). */
struct chief_export_ask {
        uint64_t step, since, max_inline_rows;
        bool external;
};

/* Starts the thread. job_dir: the directory of the job's chief.db (exports go to job_dir/exports);
 * cfg, db and store outlive the exporter (db and store are thread-safe). Returns 0 and *ret, or -errno. */
int chief_exporter_new(const struct job_config *cfg, struct chief_db *db, struct chief_ckpt *store,
                       const char *job_dir, struct chief_exporter **ret);
/* Queues an Export call; the thread answers it. Returns 0, -ENOMEM, -EBUSY (CHIEF_EXPORTS_MAX calls
 * waiting already), or -ESHUTDOWN once stopped (the call is the caller's to fail then). Thread-safe. */
#define CHIEF_EXPORTS_MAX 16
int chief_exporter_add(struct chief_exporter *x, struct rpc_call *call, const struct chief_export_ask *ask);
/* Refuses new calls, fails the queued ones (UNAVAILABLE), lets the export under way finish and answer
 * (an export ends by itself: no call out, only files), joins the thread. */
void chief_exporter_stop(struct chief_exporter *x);
/* Stops (as chief_exporter_stop) and frees; NULL-safe, returns NULL. */
struct chief_exporter *chief_exporter_free(struct chief_exporter *x);
