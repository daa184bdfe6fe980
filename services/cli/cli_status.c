/* psfleet status: asks a job's chief for its JobStatus and prints it, readable or as JSON. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_chief.h"
#include "cli_json.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "job.h"
#include "rpc.h"
#include "util.h"

static void status_help(FILE *f) {
        fprintf(f, "Usage: psfleet status [--json] (--address HOST:PORT | --job JOB)\n"
                   "\n"
                   "Asks the job's chief (chiefd) for the job's state, progress and nodes.\n"
                   "\n"
                   "  --address HOST:PORT  the chief's address\n"
                   CLI_JOB_HELP
                   CLI_IDENTITY_HELP
                   "  --json               one JSON object instead of text\n"
                   "  --timeout-ms N       deadline of the call (default 5000)\n"
                   "\n"
                   "Exit status: 0 when the chief answered, 1 when it could not be reached, 2 bad usage,\n"
                   "78 bad job file.\n");
}

static void print_workers(const char *what, const uint32_t *w, size_t n) {
        printf("  %-10s", what);
        if (!n)
                printf(" none");
        for (size_t i = 0; i < n; i++)
                printf("%s worker:%u", i ? "," : "", w[i]);
        printf("\n");
}

/* "0.1234", or "nan", "inf", "-inf" for a loss that is not finite. */
static const char *fmt_loss(float loss, char *buf, size_t len) {
        if (isnan(loss))
                return "nan";
        snprintf(buf, len, "%.4f", (double)loss);
        return buf;
}

/* Whether any worker has reported (so a NaN loss is one, not "unknown"). */
static bool any_report(const Psfleet__V1__JobStatus *s) {
        for (size_t i = 0; i < s->n_nodes; i++)
                if (s->nodes[i]->task && strncmp(s->nodes[i]->task, "worker:", 7) == 0 && s->nodes[i]->last_report_us)
                        return true;
        return false;
}

static void print_text(const Psfleet__V1__JobStatus *s) {
        char buf[64], buf2[64];
        uint64_t now = now_us();
        printf("job %s: %s\n", s->job ? s->job : "?", job_state_name(s->state));
        if (s->reason && *s->reason)
                printf("  reason     %s\n", s->reason);
        if (s->state_since_us)
                printf("  since      %s (%s ago)\n", cli_format_time(s->state_since_us, true, buf2, sizeof(buf2)),
                       cli_format_duration(now > s->state_since_us ? (double)(now - s->state_since_us) / 1e6 : 0, buf,
                                           sizeof(buf)));
        if (s->waiting_for) {
                const Psfleet__V1__WaitingFor *w = s->waiting_for;
                printf("  waiting    for %s since %s", w->peer ? w->peer : "?", cli_format_time(w->since_us, true, buf2, sizeof(buf2)));
                if (w->deadline_us)
                        printf(", fails in %s", cli_format_duration(w->deadline_us > now ? (double)(w->deadline_us - now) / 1e6 : 0,
                                                                   buf, sizeof(buf)));
                printf("%s%s\n", w->last_error && *w->last_error ? ": " : "", w->last_error ? w->last_error : "");
        }
        printf("  step       %llu/%llu (%.1f %%)\n", (unsigned long long)s->global_step,
               (unsigned long long)s->max_steps, s->max_steps ? 100.0 * (double)s->global_step / (double)s->max_steps : 0);
        /* NaN is also "no report yet"; after a report it is the loss, and said so (never as a number) */
        if (isfinite(s->loss) || any_report(s))
                printf("  loss       %s (mean of the workers' latest reports)\n", fmt_loss(s->loss, buf, sizeof(buf)));
        printf("  speed      %.1f steps/s, %.0f examples/s\n", s->steps_per_s, s->examples_per_s);
        if (s->state != PSFLEET__V1__JOB_STATE__JOB_STATE_DONE && s->state != PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED &&
            s->state != PSFLEET__V1__JOB_STATE__JOB_STATE_STOPPED)
                printf("  eta        %s\n", cli_format_duration(s->eta_s, buf, sizeof(buf)));
        if (s->test_auc >= 0)
                printf("  test       AUC %.4f, accuracy %.4f, loss %.4f\n", s->test_auc, s->test_accuracy, s->test_loss);
        else if (s->test_rmse >= 0)
                printf("  test       RMSE %.4f, loss %.4f\n", s->test_rmse, s->test_loss);
        else if (s->test_accuracy >= 0)
                printf("  test       accuracy %.4f, loss %.4f\n", s->test_accuracy, s->test_loss);
        else if (s->eval_accuracy >= 0)
                printf("  eval       accuracy %.4f, loss %.4f at step %llu\n", s->eval_accuracy, s->eval_loss,
                       (unsigned long long)s->eval_step);
        if (s->last_checkpoint)
                printf("  checkpoint step %llu, %s (%u kept)\n", (unsigned long long)s->last_checkpoint->global_step,
                       s->last_checkpoint->path, s->checkpoints);
        else
                printf("  checkpoint none yet\n");
        if (s->last_checkpoint_error && *s->last_checkpoint_error)
                printf("  ckpt error %s\n", s->last_checkpoint_error);
        if (s->restored_from && *s->restored_from)
                printf("  restored   from step %llu, %s\n", (unsigned long long)s->restored_step, s->restored_from);
        if (s->n_losses)
                printf("  lost       %llu steps of updates in all\n", (unsigned long long)s->steps_lost);
        for (size_t i = 0; i < s->n_losses; i++) {
                const Psfleet__V1__ShardLoss *l = s->losses[i];
                printf("    ps:%u     %llu steps (restored from step %llu, the job was at %llu) at %s\n", l->shard,
                       (unsigned long long)l->steps_lost, (unsigned long long)l->restored_step,
                       (unsigned long long)l->job_step, cli_format_time(l->time_us, true, buf2, sizeof(buf2)));
        }
        print_workers("live", s->workers_live, s->n_workers_live);
        print_workers("missing", s->workers_missing, s->n_workers_missing);
        printf("  fingerprint %016" PRIx64 "\n", s->fingerprint);
        if (s->started_us)
                printf("  started    %s\n", cli_format_time(s->started_us, true, buf, sizeof(buf)));
        if (s->wall_s > 0)
                printf("  training   %s (wall)\n", cli_format_duration(s->wall_s, buf, sizeof(buf)));
        printf("nodes:\n");
        for (size_t i = 0; i < s->n_nodes; i++) {
                const Psfleet__V1__NodeStatus *n = s->nodes[i];
                printf("  %-10s %-22s %s", n->task ? n->task : "?", n->address ? n->address : "",
                       n->state ? n->state : "");
                if (n->task && strncmp(n->task, "worker:", 7) == 0 && n->last_report_us) {
                        printf("; step %llu, loss %s, %.0f ex/s", (unsigned long long)n->local_step,
                               fmt_loss(n->loss, buf, sizeof(buf)), n->examples_per_s);
                }
                if (n->last_report_us && now > n->last_report_us)
                        printf(" (%s ago)", cli_format_duration((double)(now - n->last_report_us) / 1e6, buf, sizeof(buf)));
                printf("\n");
        }
}

int cmd_status(int argc, char **argv) {
        const char *address = NULL, *job = NULL;
        bool json = false;
        uint64_t timeout_us = 5000 * 1000;
        const struct cli_opt opts[] = {
                CLI_FLAG("json", &json),
                CLI_CHIEF_OPTS(&address, &job),
                CLI_DURATION("timeout-ms", &timeout_us, 1, 3600000, 1000),
                {},
        };
        const struct cli_args args = {.cmd = "status", .opts = opts, .help = status_help, .max_operands = 0};
        int first, r;
        char *chief = NULL, err[1024];
        if (!cli_args_parse(&args, argc, argv, &first, &r) || (r = cli_chief_address("status", address, job, &chief)))
                return r;
        rpc_global_init();
        Psfleet__V1__JobStatus *s = NULL;
        int ret = 0;
        if (cli_get_status(chief, timeout_us / 1000, &s, err, sizeof(err)) < 0) {
                cli_error("cannot get the job's status from the chief at %s: %s", chief, err);
                ret = 1;
        } else if (json) {
                cli_print_status_json(stdout, s);
        } else {
                print_text(s);
        }
        if (s)
                psfleet__v1__job_status__free_unpacked(s, NULL);
        free(chief);
        rpc_global_shutdown();
        return ret;
}
