/* A chief's records (chief.db) read with the chief down, for the commands that can work offline
 * (checkpoints list, export). */
#pragma once

struct chief_db;

/* The default root of the chiefs' state (the units' StateDirectory). */
#define CLI_CHIEF_STATE_ROOT "/var/lib/psfleet/chiefd"

/* The chief's records in DIR/chief.db, else DIR/JOB/chief.db (job nullable), opened read-only. Returns 0
 * with *ret open and its directory in *dir_ret (malloc'd), or -errno. */
int cli_records_open(const char *dir, const char *job, struct chief_db **ret, char **dir_ret);
