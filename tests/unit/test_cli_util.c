/* Tests of the CLI's shared helpers (services/cli): the option table parser, numbers, durations, the
 * chief's address, job loading, the records of local jobs and --job's resolution, messages, the
 * progress display and the status JSON. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "scratch_dir.h"
#include "unit.h"

#include "cli_json.h"
#include "cli_jobref.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "tls.h"
#include "util.h"

/* ---- capturing what a helper prints on stdout or stderr ---- */

static int saved_fd = -1;
static FILE *captured, *captured_stream;

static void capture(FILE *f) {
        fflush(f);
        captured_stream = f;
        captured = tmpfile();
        assert_non_null(captured);
        saved_fd = dup(fileno(f));
        assert_true(saved_fd >= 0);
        assert_true(dup2(fileno(captured), fileno(f)) >= 0);
}

/* What was written to the temporary file f, which it closes (malloc'd). */
static char *read_back(FILE *f) {
        long n = ftell(f);
        char *s = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
        assert_non_null(s);
        rewind(f);
        assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
        fclose(f);
        return s;
}

/* Ends the capture of f; returns what was printed (malloc'd). */
static char *captured_text(FILE *f) {
        fflush(f);
        assert_true(dup2(saved_fd, fileno(f)) >= 0);
        close(saved_fd);
        saved_fd = -1;
        return read_back(captured);
}

/* After a failed assertion within a capture: gives the stream back and shows what it held (the
 * failure's message among it). */
static int uncapture(void **state) {
        if (saved_fd >= 0) {
                char *t = captured_text(captured_stream);
                fprintf(stderr, "captured:\n%s\n", t);
                free(t);
        }
        return 0;
}

static void assert_printed(FILE *f, const char *want) {
        char *got = captured_text(f);
        assert_string_equal(got, want);
        free(got);
}

/* ---- numbers and durations ---- */

static void test_parse_number(void **state) {
        uint64_t v = 7;
        capture(stderr);
        assert_int_equal(cli_parse_number("local", "--ps", "3", 1, 64, &v), 0);
        assert_int_equal(v, 3);
        assert_int_equal(cli_parse_number("local", "--ps", "64", 1, 64, &v), 0);
        assert_int_equal(v, 64);
        assert_printed(stderr, "");

        const char *bad[] = {"0", "65", "", "abc", "-1", "+3", " 3", "3 ", "3x", "99999999999999999999999"};
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                char want[128];
                v = 7;
                capture(stderr);
                assert_int_equal(cli_parse_number("local", "--ps", bad[i], 1, 64, &v), CLI_EX_USAGE);
                snprintf(want, sizeof(want), "psfleet local: --ps \"%s\": expected 1..64\n", bad[i]);
                assert_printed(stderr, want);
                assert_int_equal(v, 7);
        }
}

static void test_format_duration(void **state) {
        char buf[32];
        assert_string_equal(cli_format_duration(0, buf, sizeof(buf)), "0:00");
        assert_string_equal(cli_format_duration(59.4, buf, sizeof(buf)), "0:59");
        assert_string_equal(cli_format_duration(59.6, buf, sizeof(buf)), "1:00");
        assert_string_equal(cli_format_duration(3599, buf, sizeof(buf)), "59:59");
        assert_string_equal(cli_format_duration(3725, buf, sizeof(buf)), "1:02:05");
        assert_string_equal(cli_format_duration(360000, buf, sizeof(buf)), "100:00:00");
        assert_string_equal(cli_format_duration(-1, buf, sizeof(buf)), "?");
        assert_string_equal(cli_format_duration(NAN, buf, sizeof(buf)), "?");
        assert_string_equal(cli_format_duration(1e9, buf, sizeof(buf)), "?");
        char small[4];
        assert_string_equal(cli_format_duration(3725, small, sizeof(small)), "1:0");   /* truncated, terminated */
}

/* ---- the option table ---- */

static int help_calls;
static void help(FILE *f) {
        help_calls++;
        fprintf(f, "HELP\n");
}

struct parsed {
        bool flag;
        const char *str;
        uint64_t num, dur;
};

/* Parses the words of line (split at spaces; argv[0] "cmd") with a table of the four kinds. */
static bool parse(const char *line, struct parsed *p, int min_operands, int max_operands, const char *usage,
                  bool terse, int *first, int *status) {
        *p = (struct parsed){.str = "default", .num = 5, .dur = 2000000};
        const struct cli_opt opts[] = {
                CLI_FLAG("flag", &p->flag),
                CLI_STRING("str", &p->str),
                CLI_NUMBER("num", &p->num, 1, 64),
                CLI_DURATION("dur-ms", &p->dur, 100, 3600000, 1000),
                {},
        };
        const struct cli_args a = {.cmd = "cmd", .opts = opts, .help = help, .terse = terse,
                                   .min_operands = min_operands, .max_operands = max_operands, .usage = usage};
        static char buf[256];
        char *argv[32];
        int argc = 0;
        snprintf(buf, sizeof(buf), "cmd %s", line);
        for (char *save = NULL, *w = strtok_r(buf, " ", &save); w && argc < 31; w = strtok_r(NULL, " ", &save))
                argv[argc++] = w;
        argv[argc] = NULL;
        help_calls = 0;
        *first = -1;
        *status = -1;
        bool ok = cli_args_parse(&a, argc, argv, first, status);
        if (ok) {       /* the operands, whatever their place on the line, are after the options */
                for (int i = *first; i < argc; i++)
                        assert_true(strncmp(argv[i], "--", 2) != 0);
        }
        return ok;
}

static void test_args_values(void **state) {
        struct parsed p;
        int first, status;

        capture(stderr);
        assert_true(parse("", &p, 0, 0, NULL, false, &first, &status));
        assert_false(p.flag);
        assert_string_equal(p.str, "default");
        assert_int_equal(p.num, 5);
        assert_int_equal(p.dur, 2000000);

        assert_true(parse("--flag --str hello --num 64 --dur-ms 250", &p, 0, 0, NULL, false, &first, &status));
        assert_true(p.flag);
        assert_string_equal(p.str, "hello");
        assert_int_equal(p.num, 64);
        assert_int_equal(p.dur, 250000);        /* microseconds */
        assert_int_equal(first, 8);

        assert_true(parse("--str=x --num=1 --dur-ms=3600000", &p, 0, 0, NULL, false, &first, &status));
        assert_string_equal(p.str, "x");
        assert_int_equal(p.num, 1);
        assert_int_equal(p.dur, UINT64_C(3600000000));

        /* operands anywhere: getopt moves them after the options */
        assert_true(parse("job.json --flag more --num 2", &p, 1, 2, NULL, false, &first, &status));
        assert_int_equal(first, 4);
        assert_true(p.flag);
        assert_int_equal(p.num, 2);
        /* a unique prefix names its option */
        assert_true(parse("--fl --nu 3", &p, 0, 0, NULL, false, &first, &status));
        assert_true(p.flag);
        assert_int_equal(p.num, 3);
        assert_printed(stderr, "");
        assert_int_equal(help_calls, 0);
}

static void test_args_help(void **state) {
        struct parsed p;
        int first, status;
        capture(stdout);
        assert_false(parse("--num 3 --help --bogus", &p, 1, 1, "usage", false, &first, &status));
        assert_printed(stdout, "HELP\n");
        assert_int_equal(status, 0);
        assert_int_equal(help_calls, 1);
}

/* Parsing line fails with CLI_EX_USAGE after printing want on stderr. */
static void expect_usage(const char *line, const char *usage, bool terse, const char *want) {
        struct parsed p;
        int first, status;
        capture(stderr);
        bool ok = parse(line, &p, 1, 2, usage, terse, &first, &status);
        char *got = captured_text(stderr);
        if (strcmp(got, want) != 0 || ok || status != CLI_EX_USAGE)
                fail_msg("\"%s\": ok %d, status %d, printed \"%s\", expected \"%s\"", line, ok, status, got, want);
        free(got);
}

static void test_args_bad(void **state) {
        /* a value out of bounds or not a number: the bounds in the option's unit, no help */
        static const char *const values[][3] = {
                {"num", "0", "1..64"}, {"num", "65", "1..64"}, {"num", "x", "1..64"},
                {"dur-ms", "99", "100..3600000"}, {"dur-ms", "1s", "100..3600000"},
                {"dur-ms", "3600001", "100..3600000"}, {"dur-ms", "-5", "100..3600000"},
        };
        for (size_t i = 0; i < ELEMENTSOF(values); i++) {
                char line[64], want[128];
                snprintf(line, sizeof(line), "--%s %s", values[i][0], values[i][1]);
                snprintf(want, sizeof(want), "psfleet cmd: --%s \"%s\": expected %s\n", values[i][0], values[i][1],
                         values[i][2]);
                expect_usage(line, NULL, false, want);
        }
        /* what getopt_long complains of, then the help unless terse */
        static const char *const complaints[][2] = {
                {"--bogus", "cmd: unrecognized option '--bogus'\n"},
                {"--flag=1", "cmd: option '--flag' doesn't allow an argument\n"},
                {"--num", "cmd: option '--num' requires an argument\n"},
                {"-x", "cmd: invalid option -- 'x'\n"},
        };
        for (size_t i = 0; i < ELEMENTSOF(complaints); i++) {
                char want[128];
                snprintf(want, sizeof(want), "%sHELP\n", complaints[i][1]);
                expect_usage(complaints[i][0], NULL, false, want);
                expect_usage(complaints[i][0], NULL, true, complaints[i][1]);
        }
        /* the operand count: the usage line, else the help */
        expect_usage("a b c", NULL, false, "HELP\n");
        expect_usage("a b c", "Usage: cmd A [B]", false, "Usage: cmd A [B]\n");
        expect_usage("--flag", "Usage: cmd A [B]", true, "Usage: cmd A [B]\n");

        struct parsed p;
        int first, status;
        capture(stderr);        /* no upper bound */
        assert_true(parse("a b c d e", &p, 1, -1, NULL, false, &first, &status));
        assert_int_equal(first, 1);
        assert_false(parse("", &p, 1, -1, NULL, false, &first, &status));
        assert_printed(stderr, "HELP\n");
}

/* ---- messages, jobs and the chief's address ---- */

static void test_error(void **state) {
        capture(stderr);
        errno = ENOENT;
        cli_error("cannot open \"%s\": %m", "x");
        assert_int_equal(errno, ENOENT);
        cli_error("%d %s", 3, "things");
        assert_printed(stderr, "psfleet: cannot open \"x\": No such file or directory\npsfleet: 3 things\n");
}

static char *example(void) {
        const char *src = getenv("PSFLEET_SOURCE_DIR");
        return strdup_printf("%s/examples/fmnist-mlp.json", src ? src : ".");
}

/* The example as a job on loopback whose own credentials (security.mode auto) are in DIR/tls, made
 * as its first daemon would: DIR/fmnist-mlp.json. */
static char *example_auto(const char *dir) {
        char *src = example(), *text = NULL, err[1024];
        size_t n;
        assert_int_equal(read_file(src, 1 << 20, &text, &n), 0);
        char *path = strdup_printf("%s/fmnist-mlp.json", dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        assert_true(text[0] == '{');
        fprintf(f, "{\"security\": {\"auto_dir\": \"%s/tls\"},%s", dir, text + 1);
        fclose(f);
        struct job_config *cfg;
        assert_int_equal(cli_load_job(path, &cfg), 0);
        static const char *const people[] = {"admin", "viewer"};
        if (tls_auto_prepare(cfg, people, 2, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        config_free(cfg);
        free(text);
        free(src);
        return path;
}

static void test_load_job(void **state) {
        struct job_config *cfg = NULL;
        char *path = example();
        assert_int_equal(cli_load_job(path, &cfg), 0);
        assert_non_null(cfg);
        assert_string_equal(cfg->name, "fmnist-mlp");
        config_free(cfg);
        free(path);

        capture(stderr);
        assert_int_equal(cli_load_job("/nonexistent/job.json", &cfg), CONFIG_EX_CONFIG);
        char *got = captured_text(stderr);
        assert_true(strncmp(got, "psfleet: ", 9) == 0);
        assert_non_null(strstr(got, "/nonexistent/job.json"));
        free(got);
}

/* psfleet status --job path: a config error for want credentials, saying both things. */
static void refused_for_tls(const char *path, const char *says, const char *and_says) {
        char *addr = NULL;
        capture(stderr);
        assert_int_equal(cli_chief_address("status", NULL, path, &addr), CONFIG_EX_CONFIG);
        char *why = captured_text(stderr);
        assert_non_null(strstr(why, says));
        assert_non_null(strstr(why, and_says));
        free(why);
        assert_null(addr);
}

static void test_chief_address(void **state) {
        assert_int_equal(scratch_dir_make("cli-address"), 0);
        char *addr = NULL, *path = example();
        /* on loopback under security.mode auto, the job's own credentials are needed: none, an error */
        unsetenv("TF_CONFIG");
        refused_for_tls(path, "security.mode is auto and every endpoint is loopback",
                        "security.auto_dir (/var/lib/psfleet/tls/fmnist-mlp/ca.crt");
        free(path);
        path = example_auto(scratch_dir);
        capture(stderr);
        assert_int_equal(cli_chief_address("status", NULL, NULL, &addr), CLI_EX_USAGE);
        assert_int_equal(cli_chief_address("watch", "h:1", path, &addr), CLI_EX_USAGE);
        assert_printed(stderr, "psfleet status: give exactly one of --address HOST:PORT and --job JOB\n"
                               "psfleet watch: give exactly one of --address HOST:PORT and --job JOB\n");
        assert_null(addr);

        assert_int_equal(cli_chief_address("status", "h:1", NULL, &addr), 0);
        assert_string_equal(addr, "h:1");
        free(addr);

        unsetenv("TF_CONFIG");
        assert_int_equal(cli_chief_address("status", NULL, path, &addr), 0);
        assert_string_equal(addr, "127.0.0.1:2222");
        free(addr);

        /* TF_CONFIG's cluster wins over the file's */
        setenv("TF_CONFIG", "{\"cluster\": {\"chief\": [\"127.0.0.9:7000\"], \"ps\": [\"127.0.0.9:7001\"], "
                            "\"worker\": [\"127.0.0.9:7002\"]}}", 1);
        assert_int_equal(cli_chief_address("status", NULL, path, &addr), 0);
        assert_string_equal(addr, "127.0.0.9:7000");
        free(addr);

        /* beyond loopback the job runs mTLS (security.mode auto): no certificates, a config error */
        addr = NULL;
        setenv("TF_CONFIG", "{\"cluster\": {\"chief\": [\"10.0.0.9:7000\"], \"ps\": [\"10.0.0.9:7001\"], "
                            "\"worker\": [\"10.0.0.9:7002\"]}}", 1);
        refused_for_tls(path, "security.mode is mtls (auto: an endpoint is beyond loopback), but security.ca",
                        "psfleet certs --job fmnist-mlp");

        addr = NULL;
        setenv("TF_CONFIG", "{\"cluster\": ", 1);
        capture(stderr);
        assert_int_equal(cli_chief_address("status", NULL, path, &addr), CONFIG_EX_CONFIG);
        char *got = captured_text(stderr);
        assert_true(strncmp(got, "psfleet: TF_CONFIG", 18) == 0);
        free(got);
        assert_null(addr);
        unsetenv("TF_CONFIG");
        free(path);
        assert_int_equal(scratch_dir_remove(state), 0);
}

/* ---- progress display ---- */

/* A pid that no process has: a child's, reaped. */
static long dead_pid(void) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
                _exit(0);
        assert_int_equal(waitpid(pid, NULL, 0), pid);
        return (long)pid;
}

static void test_local_jobs(void **state) {
        assert_int_equal(scratch_dir_make("cli-jobref"), 0);
        char *dir = scratch_dir, *path = example_auto(scratch_dir), *rec = NULL;
        char *src = realpath(path, NULL), *got = NULL, *local_dir, *cfgdir;
        assert_non_null(src);
        setenv("XDG_RUNTIME_DIR", dir, 1);
        unsetenv("TF_CONFIG");
        local_dir = cli_local_dir();
        assert_non_null(local_dir);
        char *want = strdup_printf("%s/psfleet/local", dir);
        assert_string_equal(local_dir, want);
        free(want);

        /* a job file of our own that names another chief, standing for the local job's copy */
        char *copy = strdup_printf("%s/job.json", dir);
        FILE *f = fopen(copy, "w");
        assert_non_null(f);
        fprintf(f, "{\"job\": \"fmnist-mlp\", \"cluster\": {\"chief\": [\"127.0.0.1:7100\"], "
                   "\"ps\": [\"127.0.0.1:7101\"], \"worker\": [\"127.0.0.1:7102\"]}, "
                   "\"model\": {\"input\": [4], \"layers\": [{\"type\": \"dense\", \"units\": 2}]}, "
                   "\"data\": {\"dir\": \"/nonexistent\"}, \"security\": {\"auto_dir\": \"%s/tls\"}}\n", dir);
        fclose(f);
        struct job_config *local_cfg;
        char err[1024];
        assert_int_equal(cli_load_job(copy, &local_cfg), 0);
        static const char *const people[] = {"admin", "viewer"};
        if (tls_auto_prepare(local_cfg, people, 2, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        config_free(local_cfg);
        struct cli_local_job j = {.name = "fmnist-mlp", .chief = "127.0.0.1:7100", .job_file = copy,
                                  .state_dir = dir, .source = src, .pid = (long)getpid()}, found;
        assert_int_equal(cli_local_register(&j, &rec), 0);
        assert_int_equal(cli_local_find("fmnist-mlp", NULL, &found), 0);
        assert_string_equal(found.chief, "127.0.0.1:7100");
        assert_string_equal(found.state_dir, dir);
        assert_int_equal(found.pid, (long)getpid());
        cli_local_job_clear(&found);
        assert_int_equal(cli_local_find(NULL, src, &found), 0);
        assert_string_equal(found.name, "fmnist-mlp");
        cli_local_job_clear(&found);
        assert_int_equal(cli_local_find("other", NULL, &found), -ENOENT);

        /* by name, and by the file it was started from: the local job's chief, not the file's */
        assert_int_equal(cli_chief_address("status", NULL, "fmnist-mlp", &got), 0);
        assert_string_equal(got, "127.0.0.1:7100");
        free(got);
        assert_int_equal(cli_chief_address("status", NULL, path, &got), 0);
        assert_string_equal(got, "127.0.0.1:7100");
        free(got);
        struct cli_chief_ref ref;
        assert_int_equal(cli_chief_locate("checkpoints", NULL, "fmnist-mlp", false, &ref), 0);
        assert_string_equal(ref.job_name, "fmnist-mlp");
        assert_string_equal(ref.state_dir, dir);
        cli_chief_ref_clear(&ref);

        /* a record of a process that is gone is ignored and removed; so is ours once unregistered */
        struct cli_local_job stale = j;
        stale.name = "stale-job";
        stale.pid = dead_pid();
        char *stale_rec = NULL;
        assert_int_equal(cli_local_register(&stale, &stale_rec), 0);
        assert_int_equal(access(stale_rec, F_OK), 0);
        assert_int_equal(cli_local_find("stale-job", NULL, &found), -ENOENT);
        assert_int_equal(access(stale_rec, F_OK), -1);
        free(stale_rec);
        /* so is one whose pid now belongs to a process started at another time */
        char *reused = strdup_printf("%s/reused.json", local_dir);
        f = fopen(reused, "w");
        assert_non_null(f);
        fprintf(f, "{\"job\": \"reused\", \"pid\": %ld, \"started\": 1, \"chief\": \"127.0.0.1:1\", "
                   "\"job_file\": \"%s\", \"state_dir\": \"%s\", \"source\": \"%s\"}\n",
                (long)getpid(), copy, dir, src);
        fclose(f);
        assert_int_equal(cli_local_find("reused", NULL, &found), -ENOENT);
        assert_int_equal(access(reused, F_OK), -1);
        free(reused);
        /* a live one of another process keeps its name */
        struct cli_local_job other = j;
        other.pid = (long)getppid();
        char *other_rec = NULL;
        assert_int_equal(cli_local_register(&other, &other_rec), 0);   /* replaces our own record */
        assert_int_equal(cli_local_register(&j, &rec), -EEXIST);
        cli_local_unregister(other_rec);
        assert_int_equal(cli_local_find("fmnist-mlp", NULL, &found), -ENOENT);

        /* then the file path as it is, then $PSFLEET_CONFIG_DIR/jobs/NAME.json */
        assert_int_equal(cli_chief_address("status", NULL, path, &got), 0);
        assert_string_equal(got, "127.0.0.1:2222");
        free(got);
        cfgdir = strdup_printf("%s/etc", dir);
        char *jobs = strdup_printf("%s/jobs", cfgdir), *named = strdup_printf("%s/jobs/mine.json", cfgdir);
        assert_int_equal(mkdir_p(jobs, 0700), 0);
        assert_int_equal(rename(copy, named), 0);
        setenv("PSFLEET_CONFIG_DIR", cfgdir, 1);
        char *resolved = NULL;
        assert_int_equal(cli_job_resolve("mine", &resolved, NULL), 0);
        assert_string_equal(resolved, named);
        free(resolved);
        capture(stderr);
        assert_int_equal(cli_job_resolve("nosuchjob", &resolved, NULL), CONFIG_EX_CONFIG);
        got = captured_text(stderr);
        assert_non_null(strstr(got, "--job nosuchjob: no such job file, no running `psfleet local` job of that name"));
        free(got);
        unsetenv("PSFLEET_CONFIG_DIR");
        assert_int_equal(rm_tree(dir), 0);
        unsetenv("XDG_RUNTIME_DIR");
        free(jobs);
        free(named);
        free(cfgdir);
        free(copy);
        free(local_dir);
        free(src);
        free(path);
        free(rec);
}

static void test_progress_lines(void **state) {
        FILE *f = tmpfile();
        struct progress p;
        progress_init_file(&p, f, false);
        assert_false(p.tty);
        progress_update(&p, "training", 50, 100, 0.12345, 1234.4, 65);
        progress_update(&p, "training", 60, 100, 0.1, 1300, 60);                /* within 5 s: nothing */
        progress_update_extra(&p, "done", 100, 100, NAN, -1, -1, "ckpt 100", true);   /* forced */
        progress_end(&p);                                                       /* no bar: nothing */
        struct progress q;
        progress_init_file(&q, f, true);
        progress_update(&q, "training", 1, 2, 1, 1, 1);                         /* quiet */
        char *buf = read_back(f);
        assert_string_equal(buf, "psfleet: training: step 50/100, loss 0.1235, 1234 examples/s, ETA 1:05\n"
                                 "psfleet: done: step 100/100, loss ?, ? examples/s, ETA ?, ckpt 100\n");
        free(buf);
}

static void test_progress_bar(void **state) {
        FILE *f = tmpfile();
        struct progress p;
        progress_init_file(&p, f, false);
        p.tty = true;   /* as on a terminal */
        progress_update_extra(&p, "training", 150, 100, 0.5, 10, 3725, "eval 0.9000", false);
        progress_end(&p);
        progress_end(&p);       /* once only */
        char *buf = read_back(f);
        assert_string_equal(buf, "\r\033[Ktraining [##############################] 150/100  loss 0.5000  10 ex/s  "
                                 "ETA 1:02:05  eval 0.9000\n");
        free(buf);
}

/* ---- JSON ---- */

static void test_status_json(void **state) {
        Psfleet__V1__Checkpoint c = PSFLEET__V1__CHECKPOINT__INIT;
        c.global_step = 100;
        c.path = (char *)"/ck/100.safetensors";
        c.loss = NAN;
        c.eval_accuracy = -1;
        c.eval_loss = -1;
        Psfleet__V1__JobStatus s = PSFLEET__V1__JOB_STATUS__INIT;
        s.job = (char *)"j";
        s.fingerprint = 0xabc;
        s.global_step = 100;
        s.max_steps = 200;
        s.loss = NAN;
        s.steps_per_s = 2.5;
        s.examples_per_s = NAN;
        s.eta_s = -1;
        s.test_accuracy = NAN;
        s.test_loss = NAN;
        s.eval_accuracy = -1;
        s.wall_s = NAN;
        s.last_checkpoint = &c;
        FILE *f = tmpfile();
        cli_print_status_json(f, &s);
        char *buf = read_back(f);
        assert_non_null(strstr(buf, "{\"job\":\"j\",\"fingerprint\":\"0000000000000abc\","));
        assert_non_null(strstr(buf, "\"global_step\":100,\"max_steps\":200,\"steps_per_s\":2.5,"
                                    "\"examples_per_s\":null,\"eta_s\":null,\"loss\":null,"));
        assert_non_null(strstr(buf, "\"last_checkpoint\":{\"global_step\":100,\"time_us\":0,"
                                    "\"path\":\"/ck/100.safetensors\",\"bytes\":0,\"checksum\":\"\",\"loss\":null,"
                                    "\"eval_step\":null,\"eval_accuracy\":null,\"eval_loss\":null,\"trigger\":\"\",\"incremental\":false}"));
        assert_non_null(strstr(buf, "\"restored_step\":null,\"restored_from\":null,"));
        assert_non_null(strstr(buf, "\"nodes\":[]}\n"));
        assert_int_equal(strchr(buf, '\n') - buf, (long)strlen(buf) - 1);    /* one line */
        free(buf);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test_teardown(test_parse_number, uncapture),
        cmocka_unit_test_teardown(test_format_duration, uncapture),
        cmocka_unit_test_teardown(test_args_values, uncapture),
        cmocka_unit_test_teardown(test_args_help, uncapture),
        cmocka_unit_test_teardown(test_args_bad, uncapture),
        cmocka_unit_test_teardown(test_error, uncapture),
        cmocka_unit_test_teardown(test_load_job, uncapture),
        cmocka_unit_test_teardown(test_chief_address, uncapture),
        cmocka_unit_test_teardown(test_local_jobs, uncapture),
        cmocka_unit_test_teardown(test_progress_lines, uncapture),
        cmocka_unit_test_teardown(test_progress_bar, uncapture),
        cmocka_unit_test_teardown(test_status_json, uncapture))
