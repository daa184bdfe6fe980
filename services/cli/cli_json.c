/* The chief's answers as JSON, for the commands' --json. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_json.h"
#include "job.h"

void cli_print_json(FILE *f, json_t *o) {
        char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (text) {
                fprintf(f, "%s\n", text);
                fflush(f);
        }
        free(text);
        json_decref(o);
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
        json_object_set_new(o, "incremental", json_boolean(c->incremental));
        if (c->incremental)
                json_object_set_new(o, "parent_step", json_integer((json_int_t)c->parent_step));
        return o;
}

json_t *cli_waiting_for_json(const Psfleet__V1__WaitingFor *w) {
        if (!w)
                return json_null();
        json_t *o = json_object();
        json_object_set_new(o, "peer", json_string(w->peer ? w->peer : ""));
        json_object_set_new(o, "since_us", json_integer((json_int_t)w->since_us));
        json_object_set_new(o, "deadline_us", json_integer((json_int_t)w->deadline_us));
        json_object_set_new(o, "last_error", json_string(w->last_error ? w->last_error : ""));
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
        json_object_set_new(o, "state_since_us", json_integer((json_int_t)s->state_since_us));
        json_object_set_new(o, "waiting_for", cli_waiting_for_json(s->waiting_for));
        json_object_set_new(o, "global_step", json_integer((json_int_t)s->global_step));
        json_object_set_new(o, "max_steps", json_integer((json_int_t)s->max_steps));
        json_object_set_new(o, "steps_per_s", num_or_null(s->steps_per_s));
        json_object_set_new(o, "examples_per_s", num_or_null(s->examples_per_s));
        json_object_set_new(o, "eta_s", s->eta_s >= 0 ? json_real(s->eta_s) : json_null());
        json_object_set_new(o, "loss", num_or_null(s->loss));
        json_object_set_new(o, "test_accuracy", num_or_null(s->test_accuracy));
        json_object_set_new(o, "test_auc", num_or_null(s->test_auc));
        json_object_set_new(o, "test_rmse", num_or_null(s->test_rmse));
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
        json_t *losses = json_array();
        for (size_t i = 0; i < s->n_losses; i++) {
                const Psfleet__V1__ShardLoss *l = s->losses[i];
                json_t *lo = json_object();
                json_object_set_new(lo, "shard", json_integer(l->shard));
                json_object_set_new(lo, "restored_step", json_integer((json_int_t)l->restored_step));
                json_object_set_new(lo, "job_step", json_integer((json_int_t)l->job_step));
                json_object_set_new(lo, "steps_lost", json_integer((json_int_t)l->steps_lost));
                json_object_set_new(lo, "time_us", json_integer((json_int_t)l->time_us));
                json_array_append_new(losses, lo);
        }
        json_object_set_new(o, "losses", losses);
        json_object_set_new(o, "steps_lost", json_integer((json_int_t)s->steps_lost));
        json_t *live = json_array(), *missing = json_array();
        for (size_t i = 0; i < s->n_workers_live; i++)
                json_array_append_new(live, json_integer(s->workers_live[i]));
        for (size_t i = 0; i < s->n_workers_missing; i++)
                json_array_append_new(missing, json_integer(s->workers_missing[i]));
        json_object_set_new(o, "workers_live", live);
        json_object_set_new(o, "workers_missing", missing);
        json_object_set_new(o, "last_checkpoint_error", s->last_checkpoint_error && *s->last_checkpoint_error
                                                                ? json_string(s->last_checkpoint_error) : json_null());
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
                if (n->backup && *n->backup) {   /* ps.replicas 2 */
                        json_object_set_new(no, "backup", json_string(n->backup));
                        json_object_set_new(no, "epoch", json_integer((json_int_t)n->epoch));
                        json_object_set_new(no, "replicated", json_boolean(n->replicated));
                        json_object_set_new(no, "replication_lag_us", json_integer((json_int_t)n->replication_lag_us));
                        json_object_set_new(no, "failovers", json_integer((json_int_t)n->failovers));
                }
                json_array_append_new(nodes, no);
        }
        json_object_set_new(o, "nodes", nodes);
        cli_print_json(f, o);
}
