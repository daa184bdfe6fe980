/* The job's state machine: see chief_state.h. Every state change chiefd makes is decided here; the
 * reasons are the words clients see in GetStatus, Watch and Join, so they are part of the contract. */
#include "chief_state.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "job.h"

#define S(x) PSFLEET__V1__JOB_STATE__JOB_STATE_##x

static void go(struct chief_state *n, Psfleet__V1__JobState s, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static void go(struct chief_state *n, Psfleet__V1__JobState s, const char *fmt, ...) {
        n->state = s;
        if (!fmt) {
                n->reason[0] = 0;
                return;
        }
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(n->reason, sizeof(n->reason), fmt, ap);   /* a cut reason beats none */
        va_end(ap);
}

void chief_state_init(struct chief_state *s) {
        memset(s, 0, sizeof(*s));
        s->resume = S(READY);
        go(s, S(INITIALIZING), "starting");
}

void chief_state_from_record(struct chief_state *s, Psfleet__V1__JobState recorded, const char *reason) {
        chief_state_init(s);
        if (recorded == S(DONE) || recorded == S(FAILED)) {
                go(s, recorded, "%s", reason ? reason : "");
                s->ready_once = true;
        }
}

bool chief_state_final(const struct chief_state *s) {
        return s->state == S(DONE) || s->state == S(FAILED);
}

bool chief_state_ended(const struct chief_state *s) {
        return chief_state_final(s) || s->state == S(STOPPED);
}

/* Before the end: the states in which the job can still move forward. */
static bool active(const struct chief_state *s) {
        return s->state == S(INITIALIZING) || s->state == S(RESTORING) || s->state == S(READY) ||
               s->state == S(TRAINING);
}

bool chief_state_next(const struct chief_state *cur, const struct chief_event *ev, struct chief_state *next) {
        struct chief_state n = *cur;
        const char *why = ev->why ? ev->why : "";
        bool starting = !cur->ready_once;

        switch (ev->kind) {
        case CHIEF_EV_SHARDS_WAITING:
                if (starting && active(cur))
                        go(&n, S(INITIALIZING), "waiting for %s", why);
                break;
        case CHIEF_EV_READY_TIMEOUT:
                if (starting && active(cur))
                        go(&n, S(FAILED), "not ready after %" PRIu64 " s (supervisor.ready_timeout_secs): %s",
                           ev->timeout_s, why);
                break;
        case CHIEF_EV_SHARDS_READY:
                if (starting && active(cur)) {
                        go(&n, S(READY), NULL);
                        n.ready_once = true;
                }
                break;
        case CHIEF_EV_RESTORE_LOOKING:
                if (!active(cur))
                        break;
                if (cur->state == S(READY) || cur->state == S(TRAINING))
                        n.resume = cur->state;
                go(&n, S(RESTORING), "restoring %s: looking for a checkpoint in %s", ev->shards, ev->where);
                break;
        case CHIEF_EV_RESTORE_FOUND:
                if (cur->state == S(RESTORING))
                        go(&n, S(RESTORING), "restoring %s from \"%s\" (global_step %" PRIu64 ")", ev->shards,
                           ev->where, ev->step);
                break;
        case CHIEF_EV_RESTORE_DONE:
                /* At start-up READY follows once every shard is known to be initialized. */
                if (cur->state == S(RESTORING) && !starting)
                        go(&n, cur->resume, NULL);
                break;
        case CHIEF_EV_RESTORE_NONE:
                if (!active(cur))
                        break;
                if (starting)
                        go(&n, S(INITIALIZING), "initializing variables");
                else
                        go(&n, S(FAILED),
                           "a ps shard restarted and lost its variables; there is no usable checkpoint to restore it "
                           "from (%s)",
                           why);
                break;
        case CHIEF_EV_RESTORE_MISMATCH:
                if (active(cur))
                        go(&n, S(FAILED), "%s", why);
                break;
        case CHIEF_EV_RESTORE_FAILED:
                if (active(cur))
                        go(&n, S(RESTORING), starting ? "waiting for %s" : "waiting: %s", why);
                break;
        case CHIEF_EV_RESTORE_TIMEOUT:
                if (active(cur))
                        go(&n, S(FAILED), "restore not done after %" PRIu64 " s: %s", ev->timeout_s, why);
                break;
        case CHIEF_EV_SHARD_LOST:
                if (active(cur))
                        go(&n, S(FAILED), "ps:%u (%s) not reachable for %" PRIu64 " s: %s", ev->shard, ev->where,
                           ev->timeout_s, why);
                break;
        case CHIEF_EV_WAIT_TIMEOUT:
                if (active(cur))
                        go(&n, S(FAILED), "%s not reachable for %" PRIu64 " s: %s", ev->where, ev->timeout_s, why);
                break;
        case CHIEF_EV_WORKER_REPORT:
                if (cur->state == S(READY) && ev->step > 0)
                        go(&n, S(TRAINING), NULL);
                break;
        case CHIEF_EV_POLLED:
                if (n.state == S(READY) && ev->advanced)
                        go(&n, S(TRAINING), NULL);
                /* While training the reason says only what is wrong now. */
                if (n.state == S(TRAINING) && !ev->reachable)
                        go(&n, S(TRAINING), "ps:0 not reachable: %s", why);
                else if (n.state == S(TRAINING))
                        go(&n, S(TRAINING), NULL);
                break;
        case CHIEF_EV_MAX_STEPS:
                if (!starting && active(cur))
                        go(&n, S(STOPPING), "waiting for the workers to finish");
                break;
        case CHIEF_EV_STOP_ASKED:
                /* Before READY a stop ends the daemon instead (chief_state_phase), with nothing to finish. */
                if (!starting && active(cur))
                        go(&n, S(STOPPING), "stopping: the workers are told to stop, then the final checkpoint");
                break;
        case CHIEF_EV_STOPPED:
                if (cur->state == S(STOPPING))
                        go(&n, S(STOPPED), "stopped at global_step %" PRIu64 " after its final checkpoint%s%s",
                           ev->step, why[0] ? ": " : "", why);
                break;
        case CHIEF_EV_RESTART:
                if (chief_state_ended(cur)) {
                        chief_state_init(&n);
                        go(&n, S(INITIALIZING), "restarting%s%s", why[0] ? ": " : "", why);
                }
                break;
        case CHIEF_EV_EVALUATING:
                if (cur->state == S(STOPPING))
                        go(&n, S(STOPPING), "evaluating on the test split");
                break;
        case CHIEF_EV_SAVING_FINAL:
                if (cur->state == S(STOPPING))
                        go(&n, S(STOPPING), "saving the final checkpoint");
                break;
        case CHIEF_EV_FINISHED:
                if (cur->state == S(STOPPING))
                        go(&n, S(DONE), NULL);
                break;
        case CHIEF_EV_FAILURE:
                if (!chief_state_ended(cur))
                        go(&n, S(FAILED), "%s", why);
                break;
        case CHIEF_EV_DIVERGED:
                /* Whatever the job was doing, even its end: a model gone wrong is not DONE. */
                if (!chief_state_ended(cur))
                        go(&n, S(FAILED), "%s reported %s at global_step %" PRIu64 ": the model diverged or was poisoned",
                           ev->where ? ev->where : "a worker", why, ev->step);
                break;
        }
        bool changed = n.state != cur->state;
        *next = n;
        return changed;
}

enum chief_phase chief_state_phase(const struct chief_state *s, bool stop_requested) {
        switch (s->state) {
        case S(RESTORING):
                if (s->ready_once)
                        return CHIEF_PHASE_POLL;   /* a restarted shard's restore is being retried */
                /* fall through */
        case S(INITIALIZING):
                return stop_requested ? CHIEF_PHASE_EXIT : CHIEF_PHASE_INITIALIZE;
        case S(READY):
        case S(TRAINING):
                return CHIEF_PHASE_POLL;
        case S(STOPPING):
                return CHIEF_PHASE_STOPPING;
        case S(DONE):
        case S(FAILED):
                /* The job has ended; chiefd stays up to say so, until it is told to stop. */
                return stop_requested ? CHIEF_PHASE_EXIT : CHIEF_PHASE_IDLE;
        default:
                /* STOPPED (the orderly stop is complete), or a state no chief should be in. */
                return CHIEF_PHASE_EXIT;
        }
}

bool chief_state_report_ok(const struct chief_report *r, char *why, size_t len) {
        uint64_t base = r->known_step > r->max_steps ? r->known_step : r->max_steps;
        uint64_t slack = (uint64_t)r->n_workers * CHIEF_REPORT_SLACK;
        uint64_t limit = base > UINT64_MAX - slack ? UINT64_MAX : base + slack;
        if (r->global_step > limit) {
                snprintf(why, len,
                         "%s's report of global_step %" PRIu64 " is beyond any step ps:0 can have (at most %" PRIu64
                         ": max_steps %" PRIu64 ", ps:0 last at %" PRIu64 ", %u workers)",
                         r->task, r->global_step, limit, r->max_steps, r->known_step, r->n_workers);
                return false;
        }
        if (r->have_last && r->global_step < r->last_step) {
                snprintf(why, len, "%s's report of global_step %" PRIu64 " goes back from its last, %" PRIu64, r->task,
                         r->global_step, r->last_step);
                return false;
        }
        return true;
}

bool chief_state_report_diverged(const struct chief_report *r, char *what, size_t len) {
        static const char mark[] = "diverged: ";
        if (!isfinite(r->loss))
                snprintf(what, len, "a non-finite loss (%s)", isnan(r->loss) ? "nan" : r->loss > 0 ? "inf" : "-inf");
        else if (r->state && strncmp(r->state, mark, sizeof(mark) - 1) == 0)
                snprintf(what, len, "%s", r->state + sizeof(mark) - 1);
        else
                return false;
        return true;
}

bool chief_state_workers_stop(const struct chief_state *s, bool stop_requested, uint64_t global_step,
                              uint64_t max_steps) {
        return stop_requested || global_step >= max_steps || s->state == S(STOPPING) || chief_state_ended(s);
}

bool chief_state_may_join(const struct chief_state *s, bool stop_requested, uint64_t global_step, char *reason,
                          size_t len) {
        switch (s->state) {
        case S(READY):
        case S(TRAINING):
                snprintf(reason, len, "%s", stop_requested ? "the job is stopping" : "");
                return !stop_requested;
        case S(STOPPING):
        case S(STOPPED):
        case S(DONE):
                snprintf(reason, len, "the job has ended (%s at global_step %" PRIu64 ")", job_state_name(s->state),
                         global_step);
                return false;
        case S(FAILED):
                snprintf(reason, len, "the job failed: %s", s->reason);
                return false;
        default:
                snprintf(reason, len, "the job is %s: %s", job_state_name(s->state),
                         s->reason[0] ? s->reason : "starting");
                return false;
        }
}
