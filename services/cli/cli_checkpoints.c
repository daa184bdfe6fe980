/* psfleet checkpoints list|save|rm: a job's checkpoints, through the chief (or, for list, from its
 * state directory when the chief is down). Readable tables or JSON. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chief_ckpt.h"
#include "chief_db.h"
#include "cli_chief.h"
#include "cli_json.h"
#include "cli_opt.h"
#include "cli_records.h"
#include "cli_util.h"
#include "commands.h"
#include "rpc.h"
#include "util.h"

#define M_LIST "/psfleet.v1.Supervisor/ListCheckpoints"
#define M_SAVE "/psfleet.v1.Supervisor/SaveCheckpoint"
#define M_DELETE "/psfleet.v1.Supervisor/DeleteCheckpoint"

static void ckpt_help(FILE *f) {
        fprintf(f, "Usage: psfleet checkpoints list [--json] [--state-dir DIR] (--address HOST:PORT | --job JOB)\n"
                   "       psfleet checkpoints save [--json] [--reason TEXT] (--address ... | --job ...)\n"
                   "       psfleet checkpoints rm STEP... [--json] (--address ... | --job ...)\n"
                   "\n"
                   "A job's checkpoints, as its chief (chiefd) records them: safetensors files with the variables\n"
                   "and the optimizer's slots, one per global_step.\n"
                   "\n"
                   "  list      the recorded checkpoints, newest first: step, time, size, checksum, the workers'\n"
                   "            loss and the latest evaluation when it was saved, what triggered it, its path\n"
                   "  save      save one now; returns once it is written and recorded (or names the newest one\n"
                   "            when global_step has not moved since)\n"
                   "  rm STEP   delete the checkpoint of that global_step: its record, then its file\n"
                   "\n"
                   "When the chief does not answer, list reads its records from the job's state directory instead\n"
                   "and says so (\"offline: read from DIR\").\n"
                   "\n"
                   "  --address HOST:PORT  the chief's address\n"
                   CLI_JOB_HELP
                   CLI_IDENTITY_HELP
                   "  --json               JSON instead of text\n"
                   "  --reason TEXT        save: logged by the chief\n"
                   "  --state-dir DIR      list, when the chief does not answer: read its records (chief.db)\n"
                   "                       from DIR (or DIR/JOB); default: a running `psfleet local` job's,\n"
                   "                       else /var/lib/psfleet/chiefd/JOB\n"
                   "  --timeout-ms N       deadline of each call (default 60000)\n"
                   "\n"
                   "Exit status: 0 success, 1 the chief refused or could not be reached, 2 bad usage, 78 bad job file.\n");
}

static const char *fmt_bytes(uint64_t b, char *buf, size_t len) {
        if (b >= 1ull << 30)
                snprintf(buf, len, "%.1f GiB", (double)b / (1 << 30));
        else if (b >= 1ull << 20)
                snprintf(buf, len, "%.1f MiB", (double)b / (1 << 20));
        else if (b >= 1ull << 10)
                snprintf(buf, len, "%.1f KiB", (double)b / (1 << 10));
        else
                snprintf(buf, len, "%llu B", (unsigned long long)b);
        return buf;
}

static void print_row(const Psfleet__V1__Checkpoint *c) {
        char t[32], b[32], loss[16] = "-", acc[16] = "-", kind[24] = "full";
        if (isfinite(c->loss))
                snprintf(loss, sizeof(loss), "%.4f", c->loss);
        if (c->eval_accuracy >= 0)
                snprintf(acc, sizeof(acc), "%.4f", c->eval_accuracy);
        if (c->incremental)
                snprintf(kind, sizeof(kind), "+%llu", (unsigned long long)c->parent_step);
        printf("%10llu  %s  %9s  %-8s  %-8s  %-7s  %-11s  %s  %s\n", (unsigned long long)c->global_step,
               cli_format_time(c->time_us, false, t, sizeof(t)), fmt_bytes(c->bytes, b, sizeof(b)), loss, acc,
               c->trigger ? c->trigger : "", kind, c->checksum ? c->checksum : "", c->path ? c->path : "");
}

/* The listing, from the chief's reply or from its records. */
static void print_list(Psfleet__V1__Checkpoint **c, size_t n, const char *dir, uint32_t keep, const char *offline,
                       bool json) {
        if (json) {
                json_t *o = json_object(), *a = json_array();
                if (offline) {
                        json_object_set_new(o, "offline", json_true());
                        json_object_set_new(o, "state_dir", json_string(offline));
                } else {
                        json_object_set_new(o, "checkpoint_dir", json_string(dir));
                        json_object_set_new(o, "keep", json_integer(keep));
                }
                for (size_t i = 0; i < n; i++)
                        json_array_append_new(a, cli_checkpoint_json(c[i]));
                json_object_set_new(o, "checkpoints", a);
                cli_print_json(stdout, o);
                return;
        }
        if (offline)
                printf("%zu checkpoint%s recorded (offline: read from %s)\n", n, n == 1 ? "" : "s", offline);
        else
                printf("%zu checkpoint%s in %s (keeping the last %u)\n", n, n == 1 ? "" : "s", dir, keep);
        if (n)
                printf("%10s  %-19s  %9s  %-8s  %-8s  %-7s  %-11s  %-15s  %s\n", "STEP", "TIME", "SIZE", "LOSS",
                       "EVAL ACC", "TRIGGER", "OF", "CHECKSUM", "PATH");
        for (size_t i = 0; i < n; i++)
                print_row(c[i]);
}

/* list with the chief down: its records, read-only. Returns the exit status. */
static int list_offline(const struct cli_chief_ref *ref, const char *state_dir, bool json) {
        const char *dir = state_dir ? state_dir : ref->state_dir ? ref->state_dir : CLI_CHIEF_STATE_ROOT;
        struct chief_db *db = NULL;
        char *where = NULL;
        int r = cli_records_open(dir, ref->job_name, &db, &where);
        if (r < 0) {
                cli_error("no records of the chief to read offline in %s%s%s (--state-dir DIR): %s", dir,
                          ref->job_name ? " nor its subdirectory " : "", ref->job_name ? ref->job_name : "", strerror(-r));
                return 1;
        }
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0;
        r = chief_db_list_checkpoints(db, &rows, &n);
        Psfleet__V1__Checkpoint *msgs = calloc(n ? n : 1, sizeof(*msgs)), **mp = calloc(n ? n : 1, sizeof(*mp));
        if (r < 0 || !msgs || !mp) {
                cli_error("cannot read the checkpoints recorded in %s/chief.db: %s", where, strerror(r < 0 ? -r : ENOMEM));
                r = 1;
        } else {
                for (size_t i = 0; i < n; i++) {
                        chief_checkpoint_msg(&rows[i], &msgs[i]);
                        mp[i] = &msgs[i];
                }
                print_list(mp, n, "", 0, where, json);
                r = 0;
        }
        free(msgs);
        free(mp);
        free(rows);
        free(where);
        chief_db_close(db);
        return r;
}

/* Returns 0, 1 when the chief refused, or -1 when it could not be reached (the caller may go offline). */
static int do_list(struct rpc_channel *ch, bool json, uint64_t timeout_ms) {
        Psfleet__V1__ListCheckpointsRequest q = PSFLEET__V1__LIST_CHECKPOINTS_REQUEST__INIT;
        ProtobufCMessage *m;
        char err[1024];
        int r = rpc_call_msg(ch, M_LIST, &q.base, &psfleet__v1__list_checkpoints_reply__descriptor, timeout_ms, false,
                             &m, err, sizeof(err));
        if (r < 0) {
                cli_error("cannot list the checkpoints: %s", err);
                return r == -EAGAIN || r == -ETIMEDOUT ? -1 : 1;
        }
        const Psfleet__V1__ListCheckpointsReply *rep = (const Psfleet__V1__ListCheckpointsReply *)m;
        print_list(rep->checkpoints, rep->n_checkpoints, rep->checkpoint_dir ? rep->checkpoint_dir : "?", rep->keep,
                   NULL, json);
        protobuf_c_message_free_unpacked(m, NULL);
        return 0;
}

static int do_save(struct rpc_channel *ch, bool json, const char *reason, uint64_t timeout_ms) {
        Psfleet__V1__SaveCheckpointRequest q = PSFLEET__V1__SAVE_CHECKPOINT_REQUEST__INIT;
        q.reason = (char *)(reason ? reason : "psfleet checkpoints save");
        ProtobufCMessage *m;
        if (cli_chief_call(ch, M_SAVE, &q.base, &psfleet__v1__save_checkpoint_reply__descriptor, timeout_ms,
                           "save a checkpoint", &m))
                return 1;
        const Psfleet__V1__SaveCheckpointReply *rep = (const Psfleet__V1__SaveCheckpointReply *)m;
        const Psfleet__V1__Checkpoint *c = rep->checkpoint;
        if (!c) {
                cli_error("the chief's reply names no checkpoint");
        } else if (json) {
                json_t *o = cli_checkpoint_json(c);
                json_object_set_new(o, "existing", json_boolean(rep->existing));
                cli_print_json(stdout, o);
        } else if (rep->existing) {
                printf("global_step %llu is already checkpointed: %s\n", (unsigned long long)c->global_step, c->path);
        } else {
                char b[32];
                printf("saved the checkpoint of global_step %llu: %s (%s, %s)\n", (unsigned long long)c->global_step,
                       c->path, fmt_bytes(c->bytes, b, sizeof(b)), c->checksum);
        }
        int ret = c ? 0 : 1;
        protobuf_c_message_free_unpacked(m, NULL);
        return ret;
}

static int do_rm(struct rpc_channel *ch, bool json, char **steps, int n, uint64_t timeout_ms) {
        int ret = 0;
        for (int i = 0; i < n; i++) {
                uint64_t step;
                if (parse_u64(steps[i], 0, UINT64_MAX, &step) < 0) {
                        fprintf(stderr, "psfleet checkpoints rm: \"%s\" is not a global_step\n", steps[i]);
                        return CLI_EX_USAGE;
                }
        }
        for (int i = 0; i < n; i++) {
                uint64_t step;
                parse_u64(steps[i], 0, UINT64_MAX, &step);
                Psfleet__V1__DeleteCheckpointRequest q = PSFLEET__V1__DELETE_CHECKPOINT_REQUEST__INIT;
                q.global_step = step;
                ProtobufCMessage *m;
                char what[96];
                snprintf(what, sizeof(what), "delete the checkpoint of global_step %llu", (unsigned long long)step);
                if (cli_chief_call(ch, M_DELETE, &q.base, &psfleet__v1__delete_checkpoint_reply__descriptor,
                                   timeout_ms, what, &m)) {
                        ret = 1;
                        continue;
                }
                const Psfleet__V1__Checkpoint *c = ((const Psfleet__V1__DeleteCheckpointReply *)m)->deleted;
                if (json && c)
                        cli_print_json(stdout, cli_checkpoint_json(c));
                else if (c)
                        printf("deleted the checkpoint of global_step %llu (%s)\n", (unsigned long long)c->global_step,
                               c->path);
                protobuf_c_message_free_unpacked(m, NULL);
        }
        return ret;
}

int cmd_checkpoints(int argc, char **argv) {
        const char *address = NULL, *job = NULL, *reason = NULL, *state_dir = NULL;
        bool json = false;
        uint64_t timeout_us = 60000 * 1000;
        const struct cli_opt opts[] = {
                CLI_FLAG("json", &json),
                CLI_CHIEF_OPTS(&address, &job),
                CLI_STRING("reason", &reason),
                CLI_STRING("state-dir", &state_dir),
                CLI_DURATION("timeout-ms", &timeout_us, 1, 3600000, 1000),
                {},
        };
        const struct cli_args args = {
                .cmd = "checkpoints", .opts = opts, .help = ckpt_help, .min_operands = 1, .max_operands = -1,
        };
        int first, r;
        if (!cli_args_parse(&args, argc, argv, &first, &r))
                return r;
        const char *sub = argv[first];
        int nargs = argc - first - 1;
        if ((strcmp(sub, "list") != 0 && strcmp(sub, "save") != 0 && strcmp(sub, "rm") != 0) ||
            (strcmp(sub, "rm") == 0 ? nargs < 1 : nargs != 0)) {
                ckpt_help(stderr);
                return CLI_EX_USAGE;
        }
        struct cli_chief_ref ref;
        bool is_list = strcmp(sub, "list") == 0;
        if ((r = cli_chief_locate("checkpoints", address, job, is_list, &ref)))
                return r;
        rpc_global_init();
        struct rpc_channel *ch;
        uint64_t timeout_ms = timeout_us / 1000;
        int ret = -1;   /* the chief not asked: its records offline */
        if (ref.tls_error)
                fprintf(stderr, "psfleet checkpoints: not asking the chief: %s\n", ref.tls_error);
        else if (cli_chief_channel(ref.address, &ch) != 0)
                ret = 1;
        else {
                if (strcmp(sub, "list") == 0)
                        ret = do_list(ch, json, timeout_ms);
                else if (strcmp(sub, "save") == 0)
                        ret = do_save(ch, json, reason, timeout_ms);
                else
                        ret = do_rm(ch, json, argv + first + 1, nargs, timeout_ms);
                rpc_channel_free(ch);
        }
        if (ret < 0)
                ret = list_offline(&ref, state_dir, json);
        cli_chief_ref_clear(&ref);
        rpc_global_shutdown();
        return ret;
}
