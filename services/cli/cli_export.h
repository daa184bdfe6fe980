/* psfleet export's pieces that stay in the command: the export itself is chief_export.h's, shared with
 * chiefd's Supervisor.Export. */
#pragma once

/* psfleet export --apply DELTA --to FULL: FULL (a whole export of the delta's from_step, every table
 * outside) made the export of its to_step, each new file under a temporary name first, model.onnx
 * renamed last. Checks everything before writing anything. The exit status after saying why: 0, 65 a
 * delta that does not apply to FULL or a file that does not read, 74 a file that cannot be written. */
int export_delta_apply(const char *delta, const char *full);
