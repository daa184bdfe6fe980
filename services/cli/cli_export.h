/* psfleet export's pieces that stay in the command: the export itself is chief_export.h's, shared with
 * chiefd's Supervisor.Export. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

/* psfleet export --apply DELTA --to FULL: FULL (a whole export of the delta's from_step, every table
 * outside) made the export of its to_step, each new file under a temporary name first, model.onnx
 * renamed last. Checks everything before writing anything. The exit status after saying why: 0, 65 a
 * delta that does not apply to FULL or a file that does not read, 74 a file that cannot be written. */
int export_delta_apply(const char *delta, const char *full);

/* psfleet export --via-chief (cli_export_rpc.c): what to ask the chief. */
struct export_ask_rpc {
        uint64_t step, since, max_inline_rows, timeout_ms;
        bool external;
};
/* Asks the chief at address, or the job's (cli_chief_locate), for an export (Supervisor.Export) and
 * prints its reply (JSON with json). The exit status: 0, 65 the chief's refusal (no such checkpoint,
 * one that does not verify), 74 the chief could not write it, 1 the chief not reached or refusing the
 * caller, 2 or 78 as cli_chief_locate. */
int export_via_chief(const char *address, const char *job, const struct export_ask_rpc *ask, bool json);
