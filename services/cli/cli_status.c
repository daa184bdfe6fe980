/* psfleet status: asks a job's chief for its JobStatus and prints it, readable or as JSON. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "rpc.h"
#include "util.h"

static void status_help(FILE *f) {
        fprintf(f, "Usage: psfleet status [--json] (--address HOST:PORT | --job JOB.json)\n"
                   "\n"
                   "Asks the job's chief (chiefd) for the job's state, progress and nodes.\n"
                   "\n"
                   "  --address HOST:PORT  the chief's address\n"
                   "  --job JOB.json       the job file: its cluster's chief entry (TF_CONFIG's cluster, if set)\n"
                   "  --json               one JSON object instead of text\n"
                   "  --timeout-ms N       deadline of the call (default 5000)\n"
                   "\n"
                   "Exit status: 0 when the chief answered, 1 when it could not be reached, 2 bad usage,\n"
                   "78 bad job file.\n");
}

/* JSON numbers for floats that may be NaN (no report yet): null. */
static json_t *num_or_null(double v) {
        return isfinite(v) ? json_real(v) : json_null();
}

json_t *cli_checkpoint_json(const Psfleet__V1__Checkpoint *c) {
        json_t *o = json_object();
        json_object_set_new(o, "global_step", json_integer((json_int_t)c->global_step));
        json_object_set_new(o, "time_us", json_integer((json_int_t)c->time_us));
        json_object_set_new(o, "path", json_string(c->path ? c->path : ""));
        json_object_set_new(o, "bytes", json_integer((json_int_t)c->bytes));
        json_object_set_new(o, "checksum", json_string(c->checksum ? c->checksum : ""));
        json_object_set_new(o, "loss", num_or_null(c->loss));
        json_object_set_new(o, "eval_step", c->eval_step ? json_integer((json_int_t)c->eval_step) : json_null());
        json_object_set_new(o, "eval_accuracy", c->eval_accuracy >= 0 ? json_real(c->eval_accuracy) : json_null());
        json_object_set_new(o, "eval_loss", c->eval_loss >= 0 ? json_real(c->eval_loss) : json_null());
        json_object_set_new(o, "trigger", json_string(c->trigger ? c->trigger : ""));
        return o;
}

void cli_print_status_json(FILE *f, const Psfleet__V1__JobStatus *s) {
        char fp[24];
        snprintf(fp, sizeof(fp), "%016" PRIx64, s->fingerprint);
        json_t *o = json_object();
        json_object_set_new(o, "job", json_string(s->job ? s->job : ""));
        json_object_set_new(o, "fingerprint", json_string(fp));
        json_object_set_new(o, "state", json_string(job_state_name(s->state)));
        json_object_set_new(o, "reason", json_string(s->reason ? s->reason : ""));
        json_object_set_new(o, "global_step", json_integer((json_int_t)s->global_step));
        json_object_set_new(o, "max_steps", json_integer((json_int_t)s->max_steps));
        json_object_set_new(o, "steps_per_s", num_or_null(s->steps_per_s));
        json_object_set_new(o, "examples_per_s", num_or_null(s->examples_per_s));
        json_object_set_new(o, "eta_s", s->eta_s >= 0 ? json_real(s->eta_s) : json_null());
        json_object_set_new(o, "loss", num_or_null(s->loss));
        json_object_set_new(o, "test_accuracy", num_or_null(s->test_accuracy));
        json_object_set_new(o, "test_loss", num_or_null(s->test_loss));
        json_object_set_new(o, "eval_step", s->eval_accuracy >= 0 ? json_integer((json_int_t)s->eval_step) : json_null());
        json_object_set_new(o, "eval_accuracy", s->eval_accuracy >= 0 ? json_real(s->eval_accuracy) : json_null());
        json_object_set_new(o, "eval_loss", s->eval_accuracy >= 0 ? json_real(s->eval_loss) : json_null());
        json_object_set_new(o, "started_us", json_integer((json_int_t)s->started_us));
        json_object_set_new(o, "wall_s", num_or_null(s->wall_s));
        json_object_set_new(o, "last_checkpoint", s->last_checkpoint ? cli_checkpoint_json(s->last_checkpoint) : json_null());
        json_object_set_new(o, "checkpoints", json_integer(s->checkpoints));
        json_object_set_new(o, "restored_step", s->restored_from && *s->restored_from
                                                        ? json_integer((json_int_t)s->restored_step) : json_null());
        json_object_set_new(o, "restored_from", s->restored_from && *s->restored_from ? json_string(s->restored_from)
                                                                                     : json_null());
        json_object_set_new(o, "checkpoint_dir", json_string(s->checkpoint_dir ? s->checkpoint_dir : ""));
        json_object_set_new(o, "summary_dir", json_string(s->summary_dir ? s->summary_dir : ""));
        json_t *nodes = json_array();
        for (size_t i = 0; i < s->n_nodes; i++) {
                const Psfleet__V1__NodeStatus *n = s->nodes[i];
                json_t *no = json_object();
                json_object_set_new(no, "task", json_string(n->task ? n->task : ""));
                json_object_set_new(no, "address", json_string(n->address ? n->address : ""));
                json_object_set_new(no, "state", json_string(n->state ? n->state : ""));
                json_object_set_new(no, "local_step", json_integer((json_int_t)n->local_step));
                json_object_set_new(no, "loss", num_or_null(n->loss));
                json_object_set_new(no, "examples_per_s", num_or_null(n->examples_per_s));
                json_object_set_new(no, "last_report_us", json_integer((json_int_t)n->last_report_us));
                json_array_append_new(nodes, no);
        }
        json_object_set_new(o, "nodes", nodes);
        char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (text) {
                fprintf(f, "%s\n", text);
                fflush(f);
        }
        free(text);
        json_decref(o);
}

static void print_text(const Psfleet__V1__JobStatus *s) {
        char buf[64];
        printf("job %s: %s\n", s->job ? s->job : "?", job_state_name(s->state));
        if (s->reason && *s->reason)
                printf("  reason     %s\n", s->reason);
        printf("  step       %llu/%llu (%.1f %%)\n", (unsigned long long)s->global_step,
               (unsigned long long)s->max_steps, s->max_steps ? 100.0 * (double)s->global_step / (double)s->max_steps : 0);
        if (isfinite(s->loss))
                printf("  loss       %.4f (mean of the workers' latest reports)\n", s->loss);
        printf("  speed      %.1f steps/s, %.0f examples/s\n", s->steps_per_s, s->examples_per_s);
        if (s->state != PSFLEET__V1__JOB_STATE__JOB_STATE_DONE)
                printf("  eta        %s\n", cli_format_duration(s->eta_s, buf, sizeof(buf)));
        if (s->test_accuracy >= 0)
                printf("  test       accuracy %.4f, loss %.4f\n", s->test_accuracy, s->test_loss);
        else if (s->eval_accuracy >= 0)
                printf("  eval       accuracy %.4f, loss %.4f at step %llu\n", s->eval_accuracy, s->eval_loss,
                       (unsigned long long)s->eval_step);
        if (s->last_checkpoint)
                printf("  checkpoint step %llu, %s (%u kept)\n", (unsigned long long)s->last_checkpoint->global_step,
                       s->last_checkpoint->path, s->checkpoints);
        else
                printf("  checkpoint none yet\n");
        if (s->restored_from && *s->restored_from)
                printf("  restored   from step %llu, %s\n", (unsigned long long)s->restored_step, s->restored_from);
        printf("  fingerprint %016" PRIx64 "\n", s->fingerprint);
        if (s->started_us) {
                time_t t = (time_t)(s->started_us / 1000000);
                struct tm tm;
                localtime_r(&t, &tm);
                strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S %z", &tm);
                printf("  started    %s\n", buf);
        }
        if (s->wall_s > 0)
                printf("  training   %s (wall)\n", cli_format_duration(s->wall_s, buf, sizeof(buf)));
        printf("nodes:\n");
        uint64_t now = now_us();
        for (size_t i = 0; i < s->n_nodes; i++) {
                const Psfleet__V1__NodeStatus *n = s->nodes[i];
                printf("  %-10s %-22s %s", n->task ? n->task : "?", n->address ? n->address : "",
                       n->state ? n->state : "");
                if (n->task && strncmp(n->task, "worker:", 7) == 0 && n->last_report_us) {
                        printf("; step %llu, loss %.4f, %.0f ex/s", (unsigned long long)n->local_step, n->loss,
                               n->examples_per_s);
                }
                if (n->last_report_us && now > n->last_report_us)
                        printf(" (%s ago)", cli_format_duration((double)(now - n->last_report_us) / 1e6, buf, sizeof(buf)));
                printf("\n");
        }
}

int cmd_status(int argc, char **argv) {
        static const struct option opts[] = {
                {"json", no_argument, NULL, 'J'},           {"address", required_argument, NULL, 'a'},
                {"job", required_argument, NULL, 'j'},      {"timeout-ms", required_argument, NULL, 't'},
                {"help", no_argument, NULL, 'h'},           {},
        };
        const char *address = NULL, *job = NULL;
        bool json = false;
        uint64_t timeout_ms = 5000;
        int c;
        optind = 1;
        while ((c = getopt_long(argc, argv, "", opts, NULL)) >= 0) {
                switch (c) {
                case 'J': json = true; break;
                case 'a': address = optarg; break;
                case 'j': job = optarg; break;
                case 't':
                        if (cli_parse_number("status", "--timeout-ms", optarg, 1, 3600000, &timeout_ms))
                                return CLI_EX_USAGE;
                        break;
                case 'h': status_help(stdout); return 0;
                default: status_help(stderr); return CLI_EX_USAGE;
                }
        }
        if (optind < argc) {
                status_help(stderr);
                return CLI_EX_USAGE;
        }
        char *chief = NULL, err[1024];
        int rr = cli_chief_address("status", address, job, &chief);
        if (rr)
                return rr;
        address = chief;
        rpc_global_init();
        Psfleet__V1__JobStatus *s = NULL;
        int r = cli_get_status(address, timeout_ms, &s, err, sizeof(err));
        int ret = 0;
        if (r < 0) {
                fprintf(stderr, "psfleet: cannot get the job's status from the chief at %s: %s\n", address, err);
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
