/* Tests of log.c: the stderr line format, level filtering, return values, and whole lines from
 * several threads at once. stderr is redirected into a temp file and read back. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "unit.h"

#include "daemon.h"
#include "log.h"
#include "util.h"

static int saved_stderr = -1;
static char capture_path[] = "/tmp/test_log.XXXXXX";

static void capture_start(void) {
        int fd;

        strcpy(capture_path, "/tmp/test_log.XXXXXX");
        fd = mkstemp(capture_path);
        assert_true(fd >= 0);
        saved_stderr = dup(STDERR_FILENO);
        assert_true(saved_stderr >= 0);
        assert_true(dup2(fd, STDERR_FILENO) >= 0);
        close(fd);
}

/* Restores stderr and returns what was written to it (caller frees). */
static char *capture_end(void) {
        char *data = NULL;

        assert_true(dup2(saved_stderr, STDERR_FILENO) >= 0);
        close(saved_stderr);
        saved_stderr = -1;
        assert_int_equal(read_file(capture_path, 1 << 24, &data, NULL), 0);
        unlink(capture_path);
        return data;
}

/* Runs under systemd would send to the journal; these tests check the stderr format. */
static void setup_env(void) {
        unsetenv("JOURNAL_STREAM");
        unsetenv("INVOCATION_ID");
        unsetenv("PSFLEET_LOG_LEVEL");
        unsetenv("PSFLEET_LOG_TIME");
}

static void test_format(void **state) {
        char *out;
        int r;

        setup_env();
        log_setup("workerd", "fmnist", "worker:1");
        log_set_max_level(LOG_INFO);
        capture_start();
        r = log_info("hello %d", 5);
        assert_int_equal(r, 0);
        log_warning("careful");
        log_notice("noted");
        errno = EBUSY;
        r = log_error_errno(-ENOENT, "cannot open \"%s\"", "x.json");
        assert_int_equal(r, -ENOENT);
        assert_int_equal(errno, EBUSY); /* logging leaves errno alone */
        r = log_warning_errno(EIO, "positive errors work too");
        assert_int_equal(r, -EIO);
        r = log_error_errno(0, "no error");
        assert_int_equal(r, 0);
        log_info_step(1234, "loss %.2f", 0.5);
        log_error("bad");
        out = capture_end();
        assert_string_equal(out,
                "workerd[worker:1] info: hello 5\n"
                "workerd[worker:1] warning: careful\n"
                "workerd[worker:1] notice: noted\n"
                "workerd[worker:1] error: cannot open \"x.json\": No such file or directory\n"
                "workerd[worker:1] warning: positive errors work too: Input/output error\n"
                "workerd[worker:1] error: no error\n"
                "workerd[worker:1] info: loss 0.50\n"
                "workerd[worker:1] error: bad\n");
        free(out);

        log_setup("psctl", NULL, NULL);
        capture_start();
        log_notice("no task");
        out = capture_end();
        assert_string_equal(out, "psctl notice: no task\n");
        free(out);
}

static void test_levels(void **state) {
        char *out;

        setup_env();
        log_setup("psd", "j", "ps:0");
        log_set_max_level(LOG_WARNING);
        assert_int_equal(log_get_max_level(), LOG_WARNING);
        capture_start();
        assert_int_equal(log_info("dropped"), 0);
        assert_int_equal(log_debug_errno(-EIO, "dropped"), -EIO); /* same return when filtered */
        log_warning("kept");
        log_error("kept too");
        out = capture_end();
        assert_string_equal(out, "psd[ps:0] warning: kept\npsd[ps:0] error: kept too\n");
        free(out);

        /* the level from the environment, through the key table (log.level) */
        char err[256] = "";
        setenv("PSFLEET_LOG_LEVEL", "debug", 1);
        assert_int_equal(daemon_log_config(NULL, err, sizeof(err)), 0);
        log_setup("psd", "j", "ps:0");
        assert_int_equal(log_get_max_level(), LOG_DEBUG);
        capture_start();
        log_debug("visible");
        out = capture_end();
        assert_string_equal(out, "psd[ps:0] debug: visible\n");
        free(out);

        setenv("PSFLEET_LOG_LEVEL", "error", 1);
        assert_int_equal(daemon_log_config(NULL, err, sizeof(err)), 0);
        assert_int_equal(log_get_max_level(), LOG_ERR);
        setenv("PSFLEET_LOG_LEVEL", "bogus", 1);
        /* refused, naming the variable, and the level stays */
        assert_int_equal(daemon_log_config(NULL, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "PSFLEET_LOG_LEVEL: \"bogus\""));
        log_setup("psd", "j", "ps:0");
        assert_int_equal(log_get_max_level(), LOG_ERR);

        assert_int_equal(log_level_from_string("warning"), LOG_WARNING);
        assert_int_equal(log_level_from_string("WARN"), LOG_WARNING);
        assert_int_equal(log_level_from_string("notice"), LOG_NOTICE);
        assert_int_equal(log_level_from_string("info"), LOG_INFO);
        assert_int_equal(log_level_from_string("nope"), -EINVAL);
        assert_int_equal(log_level_from_string(NULL), -EINVAL);
        log_set_max_level(LOG_INFO);
        unsetenv("PSFLEET_LOG_LEVEL");
}

static void test_timestamps(void **state) {
        regex_t re;
        char *out;

        setup_env();
        setenv("PSFLEET_LOG_TIME", "1", 1);
        assert_int_equal(daemon_log_config(NULL, NULL, 0), 0);
        log_setup("chiefd", "j", "chief:0");
        log_set_max_level(LOG_INFO);
        capture_start();
        log_info("tick");
        out = capture_end();
        assert_int_equal(regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6} "
                                      "chiefd\\[chief:0\\] info: tick\n$", REG_EXTENDED), 0);
        if (regexec(&re, out, 0, NULL, 0) != 0)
                print_error("line: %s", out);
        assert_int_equal(regexec(&re, out, 0, NULL, 0), 0);
        regfree(&re);
        free(out);
        unsetenv("PSFLEET_LOG_TIME");
        log_set_time(false);
}

static void test_long_message(void **state) {
        char big[10000], *out;

        setup_env();
        log_setup("w", NULL, NULL);
        memset(big, 'x', sizeof(big) - 1);
        big[sizeof(big) - 1] = 0;
        capture_start();
        log_info("%s", big);
        out = capture_end();
        /* Cut, but still one line ending in a newline. */
        assert_true(strlen(out) > 4000);
        assert_int_equal(out[strlen(out) - 1], '\n');
        assert_null(strchr(out, '\n') + 1 == out + strlen(out) ? NULL : "more than one line");
        free(out);
}

#define THREADS 8
#define LINES 500

static void *spam(void *arg) {
        for (int i = 0; i < LINES; i++)
                log_info("thread %ld line %d %s", (long) (intptr_t) arg, i,
                         "padding padding padding padding padding padding padding padding");
        return NULL;
}

static void test_threads(void **state) {
        pthread_t t[THREADS];
        int count[THREADS] = { 0 };
        char *out, *line, *save = NULL;

        setup_env();
        log_setup("w", NULL, "worker:0");
        capture_start();
        for (intptr_t i = 0; i < THREADS; i++)
                assert_int_equal(pthread_create(&t[i], NULL, spam, (void *) i), 0);
        for (int i = 0; i < THREADS; i++)
                pthread_join(t[i], NULL);
        out = capture_end();
        for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                long th;
                int n, end = 0;

                assert_int_equal(sscanf(line, "w[worker:0] info: thread %ld line %d %n", &th, &n, &end), 2);
                assert_true(th >= 0 && th < THREADS);
                assert_string_equal(line + end, "padding padding padding padding padding padding padding padding");
                assert_int_equal(n, count[th]); /* each thread's lines in order */
                count[th]++;
        }
        for (int i = 0; i < THREADS; i++)
                assert_int_equal(count[i], LINES);
        free(out);
}

/* With INVOCATION_ID set we try the journal; when there is none (a build container), the message
 * still reaches stderr. */
static void test_journal_fallback(void **state) {
        char *out;

        if (access("/run/systemd/journal/socket", F_OK) == 0)
                skip();
        setup_env();
        setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef", 1);
        log_setup("w", "j", "worker:0");
        capture_start();
        assert_int_equal(log_error_errno(-EPIPE, "lost peer"), -EPIPE);
        log_info_step(7, "step");
        out = capture_end();
        assert_string_equal(out, "w[worker:0] error: lost peer: Broken pipe\nw[worker:0] info: step\n");
        free(out);
        unsetenv("INVOCATION_ID");
        log_set_target_stderr(1);
}

/* A burst per window, the rest counted and said once the next window opens. */
/* A peer's string reaches a log line capped and escaped: no control byte, no unbounded length. */
static void test_peer_str(void **state) {
        (void)state;
        char buf[LOG_PEER_BUF], lng[300];

        assert_string_equal(log_peer_str("worker:1", buf, sizeof(buf)), "worker:1");
        assert_string_equal(log_peer_str(NULL, buf, sizeof(buf)), "(none)");
        assert_string_equal(log_peer_str("a\nb\\c\x1b", buf, sizeof(buf)), "a\\x0ab\\x5cc\\x1b");
        memset(lng, 'w', sizeof(lng) - 1);
        lng[sizeof(lng) - 1] = 0;
        log_peer_str(lng, buf, sizeof(buf));
        assert_int_equal(strspn(buf, "w"), LOG_PEER_MAX);
        assert_string_equal(buf + LOG_PEER_MAX, "...(299 bytes)");
        /* a small buffer cuts before an escape it cannot hold whole, says so as far as it fits, and stays terminated */
        char small[6];
        assert_string_equal(log_peer_str("ab\x01" "cd", small, sizeof(small)), "ab...");
        /* a larger cap keeps more of a longer text, escaped as ever */
        char big[LOG_PEER_BUF * 2];
        memset(lng, 'w', sizeof(lng) - 1);
        lng[10] = '\n';
        log_peer_str_max(lng, 200, big, sizeof(big));
        assert_int_equal(strspn(big, "w"), 10);
        assert_memory_equal(big + 10, "\\x0a", 4);
        assert_int_equal(strspn(big + 14, "w"), 189);
        assert_string_equal(big + 14 + 189, "...(299 bytes)");
        memset(lng, 0x01, 100);
        lng[100] = 0;
        log_peer_str(lng, buf, sizeof(buf));
        assert_true(strlen(buf) < sizeof(buf));
        assert_null(strchr(buf, 0x01));
}

static void test_ratelimit(void **state) {
        (void)state;
        struct log_ratelimit rl = LOG_RATELIMIT_INIT(200000u, 3);
        log_set_target_stderr(1);
        capture_start();
        for (int i = 0; i < 3; i++)
                assert_true(log_ratelimit_ok(&rl, "refused calls"));
        for (int i = 0; i < 5; i++)
                assert_false(log_ratelimit_ok(&rl, "refused calls"));
        usleep(250000);
        assert_true(log_ratelimit_ok(&rl, "refused calls"));
        char *out = capture_end();
        assert_non_null(strstr(out, "5 more refused calls were not logged in the last 0 s"));
        free(out);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_levels),
        cmocka_unit_test(test_timestamps),
        cmocka_unit_test(test_long_message),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_journal_fallback),
        cmocka_unit_test(test_ratelimit),
        cmocka_unit_test(test_peer_str))
