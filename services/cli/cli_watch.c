/* psfleet watch: follows a job through the chief's Watch stream. A bar redrawn in place on a terminal,
 * plain lines otherwise, or one JSON object per update. Reconnects (bounded) when the chief goes away
 * before the job has ended. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_chief.h"
#include "cli_json.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "job.h"
#include "rpc.h"
#include "util.h"
#include "wire.h"

#define M_WATCH "/psfleet.v1.Supervisor/Watch"
#define TICK_MS 200

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
        interrupted = sig;
}

static void watch_help(FILE *f) {
        fprintf(f, "Usage: psfleet watch [--json] (--address HOST:PORT | --job JOB) [OPTIONS]\n"
                   "\n"
                   "Follows a job as it trains, through the chief's Watch stream: on a terminal a bar redrawn in\n"
                   "place (state, step/max, loss, examples/s, ETA, newest checkpoint); otherwise a line every 5 s\n"
                   "and at each change of state. Ends when the job is done or has failed.\n"
                   "\n"
                   "  --address HOST:PORT  the chief's address\n"
                   CLI_JOB_HELP
                   CLI_IDENTITY_HELP
                   "  --json               one JSON object per update (as `psfleet status --json`), one per line\n"
                   "  --interval-ms N      at most one update per N ms (default 500, at least 100)\n"
                   "  --retry-secs N       how long to keep trying to reach the chief (default 30)\n"
                   "\n"
                   "Exit status: 0 the job is done, 1 it failed or the chief could not be reached, 2 bad usage,\n"
                   "78 bad job file, 130 interrupted.\n");
}

struct watch {
        bool json;
        uint64_t interval_us, retry_us;
        struct progress prog;
        Psfleet__V1__JobState last_state;
        bool seen;
        bool got;               /* the current stream delivered a message */
};

/* Shows one status. */
static void show(struct watch *w, const Psfleet__V1__JobStatus *s) {
        if (w->json) {
                cli_print_status_json(stdout, s);
                return;
        }
        char extra[160] = "";
        if (s->last_checkpoint)
                snprintf(extra, sizeof(extra), "ckpt %llu", (unsigned long long)s->last_checkpoint->global_step);
        if (s->eval_accuracy >= 0)
                snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), "%seval %.4f", extra[0] ? "  " : "",
                         s->eval_accuracy);
        bool changed = !w->seen || s->state != w->last_state;
        if (changed && !w->prog.tty && s->reason && *s->reason)
                fprintf(w->prog.f, "psfleet: job %s is %s: %s\n", s->job ? s->job : "?", job_state_name(s->state),
                        s->reason);
        bool running = s->state >= PSFLEET__V1__JOB_STATE__JOB_STATE_TRAINING;
        progress_update_extra(&w->prog, job_state_name(s->state), s->global_step, s->max_steps, s->loss,
                              running ? s->examples_per_s : -1, s->eta_s, extra[0] ? extra : NULL, changed);
        w->last_state = s->state;
        w->seen = true;
}

static void show_end(struct watch *w, const Psfleet__V1__JobStatus *s) {
        if (w->json)
                return;
        progress_end(&w->prog);
        if (s->state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE)
                fprintf(w->prog.f, "job %s done at global_step %llu: test accuracy %.4f, test loss %.4f%s%s\n",
                        s->job ? s->job : "?", (unsigned long long)s->global_step, s->test_accuracy, s->test_loss,
                        s->last_checkpoint ? "; final checkpoint " : "",
                        s->last_checkpoint ? s->last_checkpoint->path : "");
        else
                fprintf(w->prog.f, "job %s failed: %s\n", s->job ? s->job : "?", s->reason ? s->reason : "");
        fflush(w->prog.f);
}

/* One stream until it ends. Returns 0 done, 1 failed, 130 interrupted, or -errno (stream broken) with err. */
static int follow(struct watch *w, struct rpc_channel *ch, char *err, size_t errlen) {
        Psfleet__V1__WatchRequest q = PSFLEET__V1__WATCH_REQUEST__INIT;
        q.min_interval_ms = (uint32_t)(w->interval_us / 1000);
        struct rpc_stream *st;
        int r = rpc_stream_open(ch, M_WATCH, wire_pack(&q.base), 0, &st);
        if (r < 0) {
                snprintf(err, errlen, "%s", strerror(-r));
                return r;
        }
        int ret = 0;
        for (;;) {
                if (interrupted) {
                        ret = 128 + interrupted;
                        break;
                }
                grpc_byte_buffer *bb = NULL;
                r = rpc_stream_next(st, TICK_MS, &bb);
                if (r == -ETIMEDOUT)
                        continue;
                if (r < 0 || r == 0) {
                        snprintf(err, errlen, "%s", r < 0 ? rpc_stream_status(st)->message : "the stream ended early");
                        ret = r < 0 ? r : -EPROTO;
                        break;
                }
                ProtobufCMessage *m;
                r = wire_unpack(bb, &psfleet__v1__job_status__descriptor, &m);
                grpc_byte_buffer_destroy(bb);
                if (r < 0) {
                        snprintf(err, errlen, "a JobStatus from the chief does not parse");
                        ret = -EBADMSG;
                        break;
                }
                const Psfleet__V1__JobStatus *s = (const Psfleet__V1__JobStatus *)m;
                w->got = true;
                show(w, s);
                bool done = s->state == PSFLEET__V1__JOB_STATE__JOB_STATE_DONE,
                     failed = s->state == PSFLEET__V1__JOB_STATE__JOB_STATE_FAILED;
                if (done || failed)
                        show_end(w, s);
                protobuf_c_message_free_unpacked(m, NULL);
                if (done || failed) {
                        ret = done ? 0 : 1;
                        break;
                }
        }
        rpc_stream_close(st);
        return ret;
}

/* Follows the job at `chief` until it ends, reconnecting within w->retry_us of the last answer.
 * Returns the exit status. */
static int watch_job(struct watch *w, const char *chief) {
        struct rpc_channel *ch = NULL;
        char err[1024] = "", last_err[1024] = "";
        uint64_t since = 0;
        struct backoff retry;
        backoff_init(&retry, 100, 2000);
        int ret = 1;
        for (;;) {
                if (!ch && cli_chief_channel(chief, &ch))
                        break;
                w->got = false;
                int r = follow(w, ch, err, sizeof(err));
                if (r >= 0) {
                        ret = r;
                        if (r >= 128)
                                progress_end(&w->prog);
                        break;
                }
                /* The chief is not there (yet, or any more): try again, bounded. */
                uint64_t t = mono_us();
                if (w->got) {
                        since = 0;
                        backoff_reset(&retry);
                }
                if (!since)
                        since = t;
                if (t - since > w->retry_us) {
                        progress_end(&w->prog);
                        cli_error("cannot watch the job at %s: %s", chief, err);
                        break;
                }
                if (strcmp(err, last_err) != 0 && !w->json) {
                        progress_end(&w->prog);
                        cli_error("waiting for the chief at %s: %s", chief, err);
                        snprintf(last_err, sizeof(last_err), "%s", err);
                }
                /* A failed channel may keep failing fast (reconnect backoff): start the next try afresh. */
                ch = rpc_channel_free(ch);
                uint64_t wait_ms = backoff_next(&retry);
                for (uint64_t slept = 0; slept < wait_ms && !interrupted; slept += 50)
                        usleep(50 * 1000);
                if (interrupted) {
                        ret = 128 + interrupted;
                        break;
                }
        }
        rpc_channel_free(ch);
        return ret;
}

int cmd_watch(int argc, char **argv) {
        const char *address = NULL, *job = NULL;
        struct watch w = {.interval_us = 500 * 1000, .retry_us = 30 * 1000000ULL};
        const struct cli_opt opts[] = {
                CLI_FLAG("json", &w.json),
                CLI_CHIEF_OPTS(&address, &job),
                CLI_DURATION("interval-ms", &w.interval_us, 100, 3600000, 1000),
                CLI_DURATION("retry-secs", &w.retry_us, 0, 86400, 1000000),
                {},
        };
        const struct cli_args args = {.cmd = "watch", .opts = opts, .help = watch_help, .max_operands = 0};
        int first, r;
        char *chief = NULL;
        if (!cli_args_parse(&args, argc, argv, &first, &r) || (r = cli_chief_address("watch", address, job, &chief)))
                return r;
        progress_init_file(&w.prog, stdout, false);
        struct sigaction sa = {.sa_handler = on_sigint};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        rpc_global_init();
        r = watch_job(&w, chief);
        free(chief);
        rpc_global_shutdown();
        return r;
}
