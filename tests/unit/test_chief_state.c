/* Tests of chief_state.c: every transition of the job's state machine, with the exact reasons clients
 * see, the failures (restore failing, a shard lost, no checkpoint for a restarted shard, the ready
 * timeout, a wait past its deadline), a stop before READY, the orderly stop (STOPPED), the sticky states
 * a chief starts in, Restart, what the main loop does in each state, and the answers to workers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "unit.h"

#include "chief_state.h"

#define S(x) PSFLEET__V1__JOB_STATE__JOB_STATE_##x
#define EV(k, ...) ((struct chief_event){.kind = CHIEF_EV_##k, __VA_ARGS__})

static const enum chief_event_kind all_events[] = {
        CHIEF_EV_SHARDS_WAITING,  CHIEF_EV_READY_TIMEOUT,   CHIEF_EV_SHARDS_READY,    CHIEF_EV_RESTORE_LOOKING,
        CHIEF_EV_RESTORE_FOUND,   CHIEF_EV_RESTORE_DONE,    CHIEF_EV_RESTORE_NONE,    CHIEF_EV_RESTORE_MISMATCH,
        CHIEF_EV_RESTORE_FAILED,  CHIEF_EV_RESTORE_TIMEOUT, CHIEF_EV_SHARD_LOST,      CHIEF_EV_WORKER_REPORT,
        CHIEF_EV_POLLED,          CHIEF_EV_MAX_STEPS,       CHIEF_EV_STOP_ASKED,      CHIEF_EV_EVALUATING,
        CHIEF_EV_SAVING_FINAL,    CHIEF_EV_FINISHED,        CHIEF_EV_FAILURE,         CHIEF_EV_STOPPED,
        CHIEF_EV_WAIT_TIMEOUT,    CHIEF_EV_DIVERGED,
};

static struct chief_state at(Psfleet__V1__JobState st, bool ready_once, const char *reason) {
        struct chief_state s;
        chief_state_init(&s);
        s.state = st;
        s.ready_once = ready_once;
        snprintf(s.reason, sizeof(s.reason), "%s", reason);
        return s;
}

/* Applies ev to *s in place and checks where it lands and whether the state changed. */
static void step(struct chief_state *s, struct chief_event ev, Psfleet__V1__JobState want, const char *reason,
                 bool changed) {
        struct chief_state before = *s;
        assert_int_equal(chief_state_next(&before, &ev, s), changed);
        assert_int_equal(s->state, want);
        assert_string_equal(s->reason, reason);
}

/* An event that must leave s exactly as it is. */
static void no_change(const struct chief_state *s, struct chief_event ev) {
        struct chief_state n;
        assert_false(chief_state_next(s, &ev, &n));
        assert_memory_equal(&n, s, sizeof(n));
}

static void test_init(void **state) {
        (void)state;
        struct chief_state s;
        memset(&s, 0x5a, sizeof(s));
        chief_state_init(&s);
        assert_int_equal(s.state, S(INITIALIZING));
        assert_string_equal(s.reason, "starting");
        assert_false(s.ready_once);
        assert_false(chief_state_final(&s));
}

/* No checkpoint: wait for the shards, find nothing to restore, initialize, READY. */
static void test_start_fresh(void **state) {
        (void)state;
        struct chief_state s;
        chief_state_init(&s);
        step(&s, EV(SHARDS_WAITING, .why = "ps:1 (127.0.0.1:7001): UNAVAILABLE: down"), S(INITIALIZING),
             "waiting for ps:1 (127.0.0.1:7001): UNAVAILABLE: down", false);
        step(&s, EV(RESTORE_LOOKING, .shards = "every shard (2)", .where = "/ck"), S(RESTORING),
             "restoring every shard (2): looking for a checkpoint in /ck", true);
        step(&s, EV(RESTORE_NONE, .why = "no usable checkpoint"), S(INITIALIZING), "initializing variables", true);
        /* assigning the initial values failed: wait and try again */
        step(&s, EV(SHARDS_WAITING, .why = "assigning the variables: refused"), S(INITIALIZING),
             "waiting for assigning the variables: refused", false);
        assert_false(s.ready_once);
        step(&s, EV(SHARDS_READY), S(READY), "", true);
        assert_true(s.ready_once);
        /* READY happens once */
        no_change(&s, EV(SHARDS_READY));
        no_change(&s, EV(SHARDS_WAITING, .why = "x"));
        no_change(&s, EV(READY_TIMEOUT, .why = "x", .timeout_s = 1));
}

/* Every shard already initialized (a restarted chiefd): READY straight away. */
static void test_start_carry_on(void **state) {
        (void)state;
        struct chief_state s;
        chief_state_init(&s);
        step(&s, EV(SHARDS_READY), S(READY), "", true);
        assert_true(s.ready_once);
}

static void test_start_restore(void **state) {
        (void)state;
        struct chief_state s;
        chief_state_init(&s);
        step(&s, EV(RESTORE_LOOKING, .shards = "ps:0", .where = "/var/lib/psfleet/j/checkpoints"), S(RESTORING),
             "restoring ps:0: looking for a checkpoint in /var/lib/psfleet/j/checkpoints", true);
        step(&s, EV(RESTORE_FOUND, .shards = "ps:0", .where = "/ck/ckpt-0000000300.safetensors", .step = 300),
             S(RESTORING), "restoring ps:0 from \"/ck/ckpt-0000000300.safetensors\" (global_step 300)", false);
        /* at start-up a restore does not make the job ready by itself: every shard must be */
        step(&s, EV(RESTORE_DONE), S(RESTORING), "restoring ps:0 from \"/ck/ckpt-0000000300.safetensors\" (global_step 300)",
             false);
        step(&s, EV(SHARDS_READY), S(READY), "", true);
}

static void test_start_restore_fails(void **state) {
        (void)state;
        struct chief_state s;
        chief_state_init(&s);
        step(&s, EV(RESTORE_LOOKING, .shards = "ps:1", .where = "/ck"), S(RESTORING),
             "restoring ps:1: looking for a checkpoint in /ck", true);
        step(&s, EV(RESTORE_FAILED, .why = "restoring ps:1 from \"/ck/a\": UNAVAILABLE"), S(RESTORING),
             "waiting for restoring ps:1 from \"/ck/a\": UNAVAILABLE", false);
        /* the next attempt starts over */
        step(&s, EV(RESTORE_LOOKING, .shards = "ps:1", .where = "/ck"), S(RESTORING),
             "restoring ps:1: looking for a checkpoint in /ck", false);
        step(&s, EV(READY_TIMEOUT, .why = "restoring ps:1 from \"/ck/a\": UNAVAILABLE", .timeout_s = 30), S(FAILED),
             "not ready after 30 s (supervisor.ready_timeout_secs): restoring ps:1 from \"/ck/a\": UNAVAILABLE",
             true);
        assert_true(chief_state_final(&s));
}

static void test_ready_timeout(void **state) {
        (void)state;
        struct chief_state s;
        chief_state_init(&s);
        step(&s, EV(READY_TIMEOUT, .why = "ps:0 (h:1): DEADLINE_EXCEEDED", .timeout_s = 120), S(FAILED),
             "not ready after 120 s (supervisor.ready_timeout_secs): ps:0 (h:1): DEADLINE_EXCEEDED", true);
}

static void test_restore_mismatch(void **state) {
        (void)state;
        struct chief_state s;
        chief_state_init(&s);
        step(&s, EV(RESTORE_LOOKING, .shards = "ps:0", .where = "/ck"), S(RESTORING),
             "restoring ps:0: looking for a checkpoint in /ck", true);
        step(&s, EV(RESTORE_MISMATCH, .why = "\"/ck/a\": tensor \"w\" has shape [3], the model's is [1, 4]"),
             S(FAILED), "\"/ck/a\": tensor \"w\" has shape [3], the model's is [1, 4]", true);
        /* the same after READY, for a restarted shard */
        s = at(S(TRAINING), true, "");
        step(&s, EV(RESTORE_LOOKING, .shards = "ps:0", .where = "/ck"), S(RESTORING),
             "restoring ps:0: looking for a checkpoint in /ck", true);
        step(&s, EV(RESTORE_MISMATCH, .why = "another model"), S(FAILED), "another model", true);
}

static void test_training(void **state) {
        (void)state;
        struct chief_state s = at(S(READY), true, "");
        /* a report before the first step, or a poll that saw no progress, keeps READY */
        step(&s, EV(WORKER_REPORT, .step = 0), S(READY), "", false);
        step(&s, EV(POLLED, .advanced = false, .reachable = true), S(READY), "", false);
        step(&s, EV(POLLED, .advanced = false, .reachable = false, .why = "ps:0 down"), S(READY), "", false);
        step(&s, EV(WORKER_REPORT, .step = 1), S(TRAINING), "", true);
        /* TRAINING is left by the end only; a report does not move it */
        step(&s, EV(WORKER_REPORT, .step = 9), S(TRAINING), "", false);
        /* the reason says what is wrong now, and nothing once it is right again */
        step(&s, EV(POLLED, .advanced = true, .reachable = false, .why = "ps:0 (h:1): UNAVAILABLE"), S(TRAINING),
             "ps:0 not reachable: ps:0 (h:1): UNAVAILABLE", false);
        step(&s, EV(POLLED, .advanced = true, .reachable = true), S(TRAINING), "", false);

        /* global_step moving past the ready step also means training (no report needed) */
        s = at(S(READY), true, "");
        step(&s, EV(POLLED, .advanced = true, .reachable = true), S(TRAINING), "", true);
        s = at(S(READY), true, "");
        step(&s, EV(POLLED, .advanced = true, .reachable = false, .why = "gone"), S(TRAINING),
             "ps:0 not reachable: gone", true);
        /* reports and polls do not move a job that is not READY or TRAINING */
        s = at(S(INITIALIZING), false, "starting");
        no_change(&s, EV(WORKER_REPORT, .step = 5));
        no_change(&s, EV(POLLED, .advanced = true, .reachable = false, .why = "x"));
        s = at(S(RESTORING), true, "waiting: x");
        no_change(&s, EV(WORKER_REPORT, .step = 5));
        no_change(&s, EV(POLLED, .advanced = true, .reachable = false, .why = "y"));
        s = at(S(STOPPING), true, "waiting for the workers to finish");
        no_change(&s, EV(WORKER_REPORT, .step = 5));
        no_change(&s, EV(POLLED, .advanced = true, .reachable = true));
}

/* A shard restarts without its variables: restore it and go back where the job was. */
static void test_shard_restart(void **state) {
        (void)state;
        const Psfleet__V1__JobState from[] = {S(READY), S(TRAINING)};
        for (size_t i = 0; i < 2; i++) {
                struct chief_state s = at(from[i], true, "");
                step(&s, EV(RESTORE_LOOKING, .shards = "ps:1", .where = "/ck"), S(RESTORING),
                     "restoring ps:1: looking for a checkpoint in /ck", true);
                assert_int_equal(s.resume, from[i]);
                step(&s, EV(RESTORE_FOUND, .shards = "ps:1", .where = "/ck/b", .step = 70), S(RESTORING),
                     "restoring ps:1 from \"/ck/b\" (global_step 70)", false);
                step(&s, EV(RESTORE_FAILED, .why = "restoring ps:1 from \"/ck/b\": UNAVAILABLE"), S(RESTORING),
                     "waiting: restoring ps:1 from \"/ck/b\": UNAVAILABLE", false);
                /* a retry from RESTORING keeps where to go back to */
                step(&s, EV(RESTORE_LOOKING, .shards = "ps:1", .where = "/ck"), S(RESTORING),
                     "restoring ps:1: looking for a checkpoint in /ck", false);
                assert_int_equal(s.resume, from[i]);
                step(&s, EV(RESTORE_DONE), from[i], "", true);
                assert_true(s.ready_once);
        }
        /* RESTORE_DONE means nothing outside a restore */
        struct chief_state s = at(S(TRAINING), true, "");
        no_change(&s, EV(RESTORE_DONE));
        no_change(&s, EV(RESTORE_FOUND, .shards = "ps:0", .where = "/x", .step = 1));
}

static void test_shard_restart_no_checkpoint(void **state) {
        (void)state;
        struct chief_state s = at(S(TRAINING), true, "");
        step(&s, EV(RESTORE_LOOKING, .shards = "ps:0", .where = "/ck"), S(RESTORING),
             "restoring ps:0: looking for a checkpoint in /ck", true);
        step(&s, EV(RESTORE_NONE, .why = "no usable checkpoint"), S(FAILED),
             "a ps shard restarted and lost its variables; there is no usable checkpoint to restore it from (no "
             "usable checkpoint)",
             true);
}

static void test_shard_restart_timeout(void **state) {
        (void)state;
        struct chief_state s = at(S(RESTORING), true, "waiting: x");
        s.resume = S(TRAINING);
        step(&s, EV(RESTORE_TIMEOUT, .why = "restoring ps:0 from \"/ck/b\": UNAVAILABLE", .timeout_s = 30), S(FAILED),
             "restore not done after 30 s: restoring ps:0 from \"/ck/b\": UNAVAILABLE", true);
}

static void test_shard_lost(void **state) {
        (void)state;
        const Psfleet__V1__JobState from[] = {S(READY), S(TRAINING), S(RESTORING)};
        for (size_t i = 0; i < 3; i++) {
                struct chief_state s = at(from[i], true, "");
                step(&s, EV(SHARD_LOST, .shard = 1, .where = "127.0.0.1:7001", .timeout_s = 30,
                            .why = "unreachable: ps:1 (127.0.0.1:7001): UNAVAILABLE"),
                     S(FAILED), "ps:1 (127.0.0.1:7001) not reachable for 30 s: unreachable: ps:1 (127.0.0.1:7001): UNAVAILABLE",
                     true);
        }
}

static void test_end(void **state) {
        (void)state;
        const Psfleet__V1__JobState from[] = {S(READY), S(TRAINING), S(RESTORING)};
        for (size_t i = 0; i < 3; i++) {
                struct chief_state s = at(from[i], true, "x");
                step(&s, EV(MAX_STEPS), S(STOPPING), "waiting for the workers to finish", true);
                s = at(from[i], true, "x");
                step(&s, EV(STOP_ASKED), S(STOPPING), "stopping: the workers are told to stop, then the final checkpoint",
                     true);
        }
        /* before READY there is nothing to finish: the daemon exits instead (see test_phase) */
        struct chief_state s;
        chief_state_init(&s);
        no_change(&s, EV(STOP_ASKED));
        no_change(&s, EV(MAX_STEPS));
        s = at(S(RESTORING), false, "restoring ps:0: looking for a checkpoint in /ck");
        no_change(&s, EV(STOP_ASKED));
        /* STOPPING is entered once */
        s = at(S(STOPPING), true, "evaluating on the test split");
        no_change(&s, EV(STOP_ASKED));
        no_change(&s, EV(MAX_STEPS));
}

static void test_finish(void **state) {
        (void)state;
        struct chief_state s = at(S(STOPPING), true, "waiting for the workers to finish");
        step(&s, EV(EVALUATING), S(STOPPING), "evaluating on the test split", false);
        step(&s, EV(SAVING_FINAL), S(STOPPING), "saving the final checkpoint", false);
        step(&s, EV(FINISHED), S(DONE), "", true);
        assert_true(chief_state_final(&s));
        /* the end's steps happen in STOPPING only */
        const Psfleet__V1__JobState other[] = {S(INITIALIZING), S(RESTORING), S(READY), S(TRAINING)};
        for (size_t i = 0; i < 4; i++) {
                s = at(other[i], true, "r");
                no_change(&s, EV(EVALUATING));
                no_change(&s, EV(SAVING_FINAL));
                no_change(&s, EV(FINISHED));
        }
}

static void test_failure(void **state) {
        (void)state;
        const Psfleet__V1__JobState from[] = {S(INITIALIZING), S(RESTORING), S(READY), S(TRAINING), S(STOPPING)};
        for (size_t i = 0; i < 5; i++) {
                struct chief_state s = at(from[i], i >= 2, "r");
                step(&s, EV(FAILURE, .why = "pulling the final parameters: ps:0: UNAVAILABLE"), S(FAILED),
                     "pulling the final parameters: ps:0: UNAVAILABLE", true);
        }
        /* a NULL why reads as "" */
        struct chief_state s = at(S(TRAINING), true, "r");
        step(&s, EV(FAILURE), S(FAILED), "", true);
        /* a long reason is cut, not overrun */
        char longer[2 * CHIEF_REASON_MAX];
        memset(longer, 'x', sizeof(longer) - 1);
        longer[sizeof(longer) - 1] = 0;
        s = at(S(TRAINING), true, "r");
        step(&s, EV(FAILURE, .why = longer), S(FAILED), longer + sizeof(longer) - CHIEF_REASON_MAX, true);
}

/* A model gone wrong fails the job from any state before the end, the end itself included: it is
 * never DONE. The failure is sticky like any other. */
static void test_diverged(void **state) {
        (void)state;
        const Psfleet__V1__JobState from[] = {S(INITIALIZING), S(RESTORING), S(READY), S(TRAINING), S(STOPPING)};
        for (size_t i = 0; i < 5; i++) {
                struct chief_state s = at(from[i], i >= 2, "r");
                step(&s, EV(DIVERGED, .where = "worker:0", .why = "a non-finite loss (nan)", .step = 120), S(FAILED),
                     "worker:0 reported a non-finite loss (nan) at global_step 120: the model diverged or was poisoned",
                     true);
                assert_true(chief_state_final(&s));
                assert_true(chief_state_workers_stop(&s, false, 120, 1000));
                no_change(&s, EV(FINISHED));
        }
}

/* A Report's global_step: bounded by what ps:0 can have, and never behind the worker's last unless a
 * restore made the chief forget it; the model gone wrong told by the loss or the worker's state. */
static void test_report(void **state) {
        (void)state;
        char why[256], what[256];
        struct chief_report r = {.task = "worker:1", .global_step = 500, .loss = 0.5f, .state = "training",
                                 .have_last = true, .last_step = 450, .known_step = 480, .max_steps = 1000,
                                 .n_workers = 2};
        assert_true(chief_state_report_ok(&r, why, sizeof(why)));
        r.global_step = 1000 + 2 * CHIEF_REPORT_SLACK;   /* the last steps of two workers in flight */
        assert_true(chief_state_report_ok(&r, why, sizeof(why)));
        r.global_step = UINT64_MAX;
        assert_false(chief_state_report_ok(&r, why, sizeof(why)));
        assert_string_equal(why, "worker:1's report of global_step 18446744073709551615 is beyond any step ps:0 can "
                                 "have (at most 1032: max_steps 1000, ps:0 last at 480, 2 workers)");
        r.global_step = 1033;
        assert_false(chief_state_report_ok(&r, why, sizeof(why)));
        /* a job resumed past max_steps: ps:0's own step is possible */
        r.known_step = 5000;
        r.global_step = 5000;
        assert_true(chief_state_report_ok(&r, why, sizeof(why)));
        r.known_step = UINT64_MAX - 3;   /* no overflow of the bound */
        r.global_step = UINT64_MAX;
        assert_true(chief_state_report_ok(&r, why, sizeof(why)));
        r.known_step = 480;
        /* backwards */
        r.global_step = 449;
        assert_false(chief_state_report_ok(&r, why, sizeof(why)));
        assert_string_equal(why, "worker:1's report of global_step 449 goes back from its last, 450");
        r.global_step = 450;
        assert_true(chief_state_report_ok(&r, why, sizeof(why)));
        r.have_last = false;   /* after a restore */
        r.global_step = 10;
        assert_true(chief_state_report_ok(&r, why, sizeof(why)));

        assert_false(chief_state_report_diverged(&r, what, sizeof(what)));
        r.loss = __builtin_nanf("");
        assert_true(chief_state_report_diverged(&r, what, sizeof(what)));
        assert_string_equal(what, "a non-finite loss (nan)");
        r.loss = -__builtin_inff();
        assert_true(chief_state_report_diverged(&r, what, sizeof(what)));
        assert_string_equal(what, "a non-finite loss (-inf)");
        r.loss = 2.3f;
        r.state = "diverged: weights blown up (dense0/kernel holds -1e+29)";
        assert_true(chief_state_report_diverged(&r, what, sizeof(what)));
        assert_string_equal(what, "weights blown up (dense0/kernel holds -1e+29)");
        r.state = "done";
        assert_false(chief_state_report_diverged(&r, what, sizeof(what)));
}

/* DONE, FAILED and STOPPED have ended: no event but Restart moves them or rewrites their reason. */
static void test_final_states(void **state) {
        (void)state;
        const struct chief_state finals[] = {at(S(DONE), true, ""), at(S(FAILED), true, "the job failed for good"),
                                             at(S(FAILED), false, "not ready"), at(S(STOPPED), true, "stopped")};
        for (size_t f = 0; f < 4; f++)
                for (size_t e = 0; e < sizeof(all_events) / sizeof(all_events[0]); e++) {
                        struct chief_event ev = {.kind = all_events[e], .why = "w", .shards = "ps:0", .where = "/x",
                                                 .step = 5, .timeout_s = 1, .advanced = true, .reachable = false};
                        no_change(&finals[f], ev);
                }
}

/* The orderly stop: STOPPING after a stop, then STOPPED with the step of the final checkpoint. */
static void test_stopped(void **state) {
        (void)state;
        struct chief_state s = at(S(TRAINING), true, "");
        step(&s, EV(STOP_ASKED), S(STOPPING), "stopping: the workers are told to stop, then the final checkpoint",
             true);
        step(&s, EV(SAVING_FINAL), S(STOPPING), "saving the final checkpoint", false);
        step(&s, EV(STOPPED, .step = 1234), S(STOPPED), "stopped at global_step 1234 after its final checkpoint", true);
        assert_false(chief_state_final(&s));    /* not sticky across a start */
        assert_true(chief_state_ended(&s));
        /* a failed final checkpoint says where a start resumes */
        s = at(S(STOPPING), true, "saving the final checkpoint");
        step(&s, EV(STOPPED, .step = 1000, .why = "the final checkpoint failed (disk full): a start resumes from global_step 1000"),
             S(STOPPED),
             "stopped at global_step 1000 after its final checkpoint: the final checkpoint failed (disk full): a start "
             "resumes from global_step 1000",
             true);
        /* STOPPED is entered from STOPPING only */
        const Psfleet__V1__JobState other[] = {S(INITIALIZING), S(RESTORING), S(READY), S(TRAINING), S(DONE), S(FAILED)};
        for (size_t i = 0; i < 6; i++) {
                s = at(other[i], true, "r");
                no_change(&s, EV(STOPPED, .step = 5));
        }
}

/* Every wait has a deadline: past it the job fails, naming the peer and the last error. */
static void test_wait_timeout(void **state) {
        (void)state;
        const Psfleet__V1__JobState from[] = {S(INITIALIZING), S(RESTORING), S(READY), S(TRAINING)};
        for (size_t i = 0; i < 4; i++) {
                struct chief_state s = at(from[i], i >= 2, "r");
                step(&s, EV(WAIT_TIMEOUT, .where = "ps:0", .timeout_s = 600, .why = "UNAVAILABLE: connection refused"),
                     S(FAILED), "ps:0 not reachable for 600 s: UNAVAILABLE: connection refused", true);
        }
        struct chief_state s = at(S(TRAINING), true, "");
        step(&s, EV(WAIT_TIMEOUT, .where = "every worker", .timeout_s = 60, .why = "worker:0 data error"), S(FAILED),
             "every worker not reachable for 60 s: worker:0 data error", true);
        s = at(S(STOPPING), true, "waiting for the workers to finish");
        no_change(&s, EV(WAIT_TIMEOUT, .where = "ps:0", .timeout_s = 1));
}

/* A chief starts where the previous one left the job: DONE and FAILED stick, anything else starts over. */
static void test_from_record(void **state) {
        (void)state;
        struct chief_state s;
        chief_state_from_record(&s, S(FAILED), "ps:0 not reachable for 600 s: x");
        assert_int_equal(s.state, S(FAILED));
        assert_string_equal(s.reason, "ps:0 not reachable for 600 s: x");
        assert_int_equal(chief_state_phase(&s, false), CHIEF_PHASE_IDLE);
        char why[512];
        assert_false(chief_state_may_join(&s, false, 7, why, sizeof(why)));
        assert_string_equal(why, "the job failed: ps:0 not reachable for 600 s: x");
        chief_state_from_record(&s, S(DONE), "");
        assert_int_equal(s.state, S(DONE));
        assert_int_equal(chief_state_phase(&s, false), CHIEF_PHASE_IDLE);
        assert_true(chief_state_workers_stop(&s, false, 0, 100));
        const Psfleet__V1__JobState fresh[] = {S(STOPPED), S(TRAINING), S(STOPPING), S(INITIALIZING), S(UNSPECIFIED)};
        for (size_t i = 0; i < 5; i++) {
                chief_state_from_record(&s, fresh[i], "whatever it said");
                assert_int_equal(s.state, S(INITIALIZING));
                assert_string_equal(s.reason, "starting");
                assert_false(s.ready_once);
        }
}

/* Restart: the only way out of an ended state, back to a fresh start-up. */
static void test_restart(void **state) {
        (void)state;
        const struct chief_state ended[] = {at(S(DONE), true, ""), at(S(FAILED), true, "ps:0 lost"),
                                            at(S(STOPPED), true, "stopped")};
        for (size_t i = 0; i < 3; i++) {
                struct chief_state s = ended[i];
                step(&s, EV(RESTART, .why = "operator"), S(INITIALIZING), "restarting: operator", true);
                assert_false(s.ready_once);
                assert_int_equal(chief_state_phase(&s, false), CHIEF_PHASE_INITIALIZE);
        }
        struct chief_state s = at(S(FAILED), true, "x");
        step(&s, EV(RESTART), S(INITIALIZING), "restarting", true);
        const Psfleet__V1__JobState running[] = {S(INITIALIZING), S(RESTORING), S(READY), S(TRAINING), S(STOPPING)};
        for (size_t i = 0; i < 5; i++) {
                s = at(running[i], true, "r");
                no_change(&s, EV(RESTART, .why = "operator"));
        }
}

static void test_phase(void **state) {
        (void)state;
        const struct {
                Psfleet__V1__JobState st;
                bool ready_once, stop;
                enum chief_phase want;
        } t[] = {
                {S(INITIALIZING), false, false, CHIEF_PHASE_INITIALIZE},
                {S(INITIALIZING), false, true, CHIEF_PHASE_EXIT},      /* stop during start-up */
                {S(RESTORING), false, false, CHIEF_PHASE_INITIALIZE},
                {S(RESTORING), false, true, CHIEF_PHASE_EXIT},         /* stop during the first restore */
                {S(RESTORING), true, false, CHIEF_PHASE_POLL},         /* a restarted shard's restore */
                {S(RESTORING), true, true, CHIEF_PHASE_POLL},          /* ... turns the stop into STOPPING */
                {S(READY), true, false, CHIEF_PHASE_POLL},
                {S(READY), true, true, CHIEF_PHASE_POLL},
                {S(TRAINING), true, false, CHIEF_PHASE_POLL},
                {S(TRAINING), true, true, CHIEF_PHASE_POLL},
                {S(STOPPING), true, false, CHIEF_PHASE_STOPPING},
                {S(STOPPING), true, true, CHIEF_PHASE_STOPPING},
                {S(DONE), true, false, CHIEF_PHASE_IDLE},
                {S(DONE), true, true, CHIEF_PHASE_EXIT},               /* a Stop after the end */
                {S(FAILED), true, false, CHIEF_PHASE_IDLE},            /* stays up to say why */
                {S(FAILED), false, true, CHIEF_PHASE_EXIT},
                {S(STOPPED), true, false, CHIEF_PHASE_EXIT},           /* the orderly stop is complete */
                {S(STOPPED), true, true, CHIEF_PHASE_EXIT},
                {S(UNSPECIFIED), false, false, CHIEF_PHASE_EXIT},
        };
        for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
                struct chief_state s = at(t[i].st, t[i].ready_once, "");
                assert_int_equal(chief_state_phase(&s, t[i].stop), t[i].want);
        }
}

static void test_workers_stop(void **state) {
        (void)state;
        struct chief_state s = at(S(TRAINING), true, "");
        assert_false(chief_state_workers_stop(&s, false, 99, 100));
        assert_true(chief_state_workers_stop(&s, false, 100, 100));
        assert_true(chief_state_workers_stop(&s, true, 0, 100));
        s = at(S(READY), true, "");
        assert_false(chief_state_workers_stop(&s, false, 0, 100));
        s = at(S(RESTORING), true, "");
        assert_false(chief_state_workers_stop(&s, false, 0, 100));
        s = at(S(INITIALIZING), false, "");
        assert_false(chief_state_workers_stop(&s, false, 0, 100));
        const Psfleet__V1__JobState over[] = {S(STOPPING), S(DONE), S(FAILED), S(STOPPED)};
        for (size_t i = 0; i < 4; i++) {
                s = at(over[i], true, "");
                assert_true(chief_state_workers_stop(&s, false, 0, 100));
        }
}

static void test_may_join(void **state) {
        (void)state;
        const struct {
                Psfleet__V1__JobState st;
                const char *reason;
                bool stop;
                uint64_t step;
                bool want;
                const char *why;
        } t[] = {
                {S(READY), "", false, 0, true, ""},
                {S(TRAINING), "ps:0 not reachable: x", false, 10, true, ""},
                {S(TRAINING), "", true, 10, false, "the job is stopping"},
                {S(READY), "", true, 0, false, "the job is stopping"},
                {S(STOPPING), "waiting for the workers to finish", false, 100, false,
                 "the job has ended (stopping at global_step 100)"},
                {S(DONE), "", false, 100, false, "the job has ended (done at global_step 100)"},
                {S(STOPPED), "stopped at global_step 40 after its final checkpoint", false, 40, false,
                 "the job has ended (stopped at global_step 40)"},
                {S(FAILED), "ps:0 lost", false, 3, false, "the job failed: ps:0 lost"},
                {S(INITIALIZING), "waiting for ps:0 (h:1): UNAVAILABLE", false, 0, false,
                 "the job is initializing: waiting for ps:0 (h:1): UNAVAILABLE"},
                {S(RESTORING), "", false, 0, false, "the job is restoring: starting"},
        };
        for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
                char why[512] = "junk";
                struct chief_state s = at(t[i].st, true, t[i].reason);
                assert_int_equal(chief_state_may_join(&s, t[i].stop, t[i].step, why, sizeof(why)), t[i].want);
                assert_string_equal(why, t[i].why);
        }
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_start_fresh),
        cmocka_unit_test(test_start_carry_on),
        cmocka_unit_test(test_start_restore),
        cmocka_unit_test(test_start_restore_fails),
        cmocka_unit_test(test_ready_timeout),
        cmocka_unit_test(test_restore_mismatch),
        cmocka_unit_test(test_training),
        cmocka_unit_test(test_shard_restart),
        cmocka_unit_test(test_shard_restart_no_checkpoint),
        cmocka_unit_test(test_shard_restart_timeout),
        cmocka_unit_test(test_shard_lost),
        cmocka_unit_test(test_end),
        cmocka_unit_test(test_finish),
        cmocka_unit_test(test_failure),
        cmocka_unit_test(test_diverged),
        cmocka_unit_test(test_report),
        cmocka_unit_test(test_final_states),
        cmocka_unit_test(test_stopped),
        cmocka_unit_test(test_wait_timeout),
        cmocka_unit_test(test_from_record),
        cmocka_unit_test(test_restart),
        cmocka_unit_test(test_phase),
        cmocka_unit_test(test_workers_stop),
        cmocka_unit_test(test_may_join))
