/* psfleet export: a job's trained model as an ONNX file for serving (chief_export.h), from one of the
 * chief's checkpoints, offline: from the chief's records in its state directory (the newest checkpoint
 * that verifies, or --step N), or from one checkpoint file (--checkpoint). The options are read and the
 * outcome printed here; the export itself is shared with chiefd's Supervisor.Export. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chief_db.h"
#include "chief_export.h"
#include "cli_export.h"
#include "cli_jobref.h"
#include "cli_opt.h"
#include "cli_records.h"
#include "cli_util.h"
#include "commands.h"
#include "util.h"


static void export_help(FILE *f) {
        fprintf(f, "Usage: psfleet export --job JOB --out DIR [--step N] [--state-dir DIR] [--max-inline-rows N]\n"
                   "                      [--external-data]\n"
                   "       psfleet export --job JOB.json --checkpoint FILE --out DIR [...]\n"
                   "       psfleet export --job JOB --since STEP --out DIR [--step N] [--state-dir DIR]\n"
                   "       psfleet export --apply DELTA_DIR --to FULL_DIR\n"
                   "       psfleet export --via-chief (--job JOB | --address HOST:PORT) [--step N] [--since STEP]\n"
                   "                      [--max-inline-rows N] [--external-data] [--json] [--identity admin]\n"
                   "\n"
                   "Writes the model a job trained as DIR/model.onnx (ONNX opset 17), for ONNX Runtime, Triton\n"
                   "or TensorRT: inference mode (Dropout as identity, batch normalization with its running\n"
                   "statistics), the parameters' values from a checkpoint, as outputs the logits and the\n"
                   "head's output on them (\"probabilities\", \"probability\" or \"prediction\"). The inputs\n"
                   "are the model's (docs/serving.md). Works with the job down: the checkpoint comes from the\n"
                   "chief's records (the newest that verifies, or the one of --step) or from --checkpoint.\n"
                   "\n"
                   "  --job JOB          the job file, or a job's name (as psfleet checkpoints takes it)\n"
                   "  --out DIR          where model.onnx goes (made if missing)\n"
                   "  --step N           the checkpoint of global_step N (default: the newest that verifies)\n"
                   "  --state-dir DIR    the chief's state directory (default %s, or a local job's)\n"
                   "  --checkpoint FILE  one checkpoint file (a job's safetensors), instead of the records\n"
                   "  --max-inline-rows N  a table of more rows goes out as DIR/tables/NAME.safetensors (with\n"
                   "                     DIR/tables.json), the graph taking its pooled rows as an input\n"
                   "                     (default: every table inside model.onnx)\n"
                   "  --external-data    the large initializers (1 MiB or more) in DIR/model.onnx.data\n"
                   "                     (ONNX external data; chosen by itself for a model over 2 GiB)\n"
                   "  --since STEP       a delta instead (docs/serving.md): the table rows changed from the\n"
                   "                     checkpoint of STEP to that of --step (default the newest), the ids gone\n"
                   "                     (tombstones), as DIR/delta/NAME.safetensors, with the newer export's\n"
                   "                     model.onnx and tables.json, and DIR/delta.json written last\n"
                   "  --via-chief        ask the job's running chief (Supervisor.Export, as psfleet status\n"
                   "                     finds it) to write the export into its state directory,\n"
                   "                     <state>/<job>/exports/step-N (a delta: delta-A-N), and print that\n"
                   "                     directory and its files (--json: as JSON); an export already there is\n"
                   "                     answered as it is. Needs the admin identity under mutual TLS\n"
                   "  --address HOST:PORT  (--via-chief) the chief to ask, instead of --job's\n"
                   "  --identity NAME    (--via-chief) the certificate to call with (default admin)\n"
                   "  --json             (--via-chief) the reply as JSON\n"
                   "  --timeout-ms N     (--via-chief) how long to wait for the export (default 600000)\n"
                   "  --apply DELTA_DIR --to FULL_DIR  makes FULL_DIR, the export of the delta's older step with\n"
                   "                     every table outside (--max-inline-rows 1), the export of its newer step\n"
                   "\n"
                   "An incremental checkpoint is exported with its chain resolved (its full checkpoint, then\n"
                   "each increment), as a restore would; every table file lists its ids in ascending order.\n"
                   "Embedding tables are looked up inside the graph, from the ids as the data has them\n"
                   "(hashed modulo vocab in the graph where the table has one; docs/serving.md).\n"
                   "Exit status: 0 written, 2 bad usage, 65 no such checkpoint, one that does not verify or\n"
                   "lacks the model's variables or tables (or a link of its chain does), --since not before the\n"
                   "step exported, a delta that does not apply to FULL_DIR,\n"
                   "74 the output cannot be written, 78 a bad job file or a model that cannot be exported;\n"
                   "with --via-chief the chief's refusal is 65 or 78 as offline, and 1 the chief not reached.\n",
                CLI_CHIEF_STATE_ROOT);
}

/* The lines an export had to say, each as psfleet's other errors. */
static void say_all(char *buf) {
        for (char *line = buf, *nl; *line; line = nl + 1) {
                if (!(nl = strchr(line, '\n')))
                        nl = line + strlen(line) - 1;
                else
                        *nl = '\0';
                cli_error("%s", line);
        }
}

int cmd_export(int argc, char **argv) {
        const char *job = NULL, *out = NULL, *state_dir = NULL, *file = NULL, *apply = NULL, *to = NULL;
        uint64_t step = 0, since = 0, max_inline = 0;
        bool external = false, via_chief = false, json = false;
        const char *address = NULL;
        uint64_t timeout_us = 600000 * 1000ULL;
        const struct cli_opt opts[] = {
                CLI_FLAG("external-data", &external),
                CLI_NUMBER("max-inline-rows", &max_inline, 1, UINT64_MAX),
                CLI_STRING("job", &job),
                CLI_STRING("out", &out),
                CLI_STRING("state-dir", &state_dir),
                CLI_STRING("checkpoint", &file),
                CLI_NUMBER("step", &step, 1, UINT64_MAX),
                CLI_NUMBER("since", &since, 1, UINT64_MAX),
                CLI_STRING("apply", &apply),
                CLI_STRING("to", &to),
                CLI_FLAG("via-chief", &via_chief),
                CLI_FLAG("json", &json),
                CLI_STRING("address", &address),
                CLI_STRING("identity", &cli_identity),
                CLI_DURATION("timeout-ms", &timeout_us, 1, 3600000, 1000),
                {},
        };
        const struct cli_args args = { .cmd = "export", .opts = opts, .help = export_help };
        int first, r;
        if (!cli_args_parse(&args, argc, argv, &first, &r))
                return r;
        if (apply || to) {
                if (!apply || !to || job || out || file || step || since || state_dir || max_inline || external) {
                        cli_error("export: %s", !apply ? "--to goes with --apply DELTA_DIR"
                                                : !to  ? "--apply DELTA_DIR needs --to FULL_DIR"
                                                       : "--apply and --to take no other option");
                        return CLI_EX_USAGE;
                }
                return export_delta_apply(apply, to);
        }
        if (via_chief || address || json) {
                if (!via_chief || out || file || state_dir || !job == !address) {
                        cli_error("export: %s", !via_chief         ? "--address and --json go with --via-chief"
                                                : out || file || state_dir ? "--via-chief takes no --out, --checkpoint nor "
                                                                     "--state-dir: the chief writes into its own "
                                                                     "state directory"
                                                                   : "--via-chief needs one of --job and --address");
                        return CLI_EX_USAGE;
                }
                const struct export_ask_rpc ask = { step, since, max_inline, timeout_us / 1000, external };
                return export_via_chief(address, job, &ask, json);
        }
        if (!job || !out || (file && step) || (file && since)) {
                cli_error("export: %s", !job   ? "--job is required"
                                        : !out ? "--out is required"
                                        : step ? "--step and --checkpoint exclude each other"
                                               : "--since needs the chief's records: --job with --state-dir, not "
                                                 "--checkpoint");
                return CLI_EX_USAGE;
        }
        char *job_path = NULL;
        struct cli_local_job local = { 0 };
        if ((r = cli_job_resolve(job, &job_path, &local)) != 0)
                return r;
        struct job_config *cfg = NULL;
        struct chief_db *db = NULL;
        char *where = NULL, text[16384] = "";
        struct export_msgs msg = { text, sizeof(text) };
        struct export_result res = { 0 };
        if ((r = cli_load_job(job_path, &cfg)) != 0)
                goto out;
        if (!file) {
                const char *dir = state_dir ? state_dir : local.pid ? local.state_dir : CLI_CHIEF_STATE_ROOT;
                if ((r = cli_records_open(dir, cfg->name, &db, &where)) < 0) {
                        cli_error("export: no records of job %s's chief in %s nor %s/%s (--state-dir DIR): %s",
                                  cfg->name, dir, dir, cfg->name, strerror(-r));
                        r = EXPORT_EX_DATAERR;
                        goto out;
                }
        }
        const struct export_request q = { .cfg = cfg, .file = file, .db = db, .where = where, .step = step,
                                          .since = since, .max_inline_rows = max_inline, .external = external,
                                          .out = out };
        r = chief_export(&q, &res, &msg);
        say_all(text);
        if (r == 0 && since)
                printf("exported the changes of job %s from global_step %" PRIu64 " to %" PRIu64 " (%s) to "
                       "%s/delta.json\n", cfg->name, since, res.step, res.ck_path, out);
        else if (r == 0)
                printf("exported job %s at global_step %s (%s) to %s (%zu bytes)\n", cfg->name, res.global_step,
                       res.ck_path, res.written, res.bytes);
out:
        export_result_clear(&res);
        free(where);
        chief_db_close(db);
        config_free(cfg);
        free(job_path);
        cli_local_job_clear(&local);
        return r;
}
