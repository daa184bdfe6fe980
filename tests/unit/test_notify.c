/* Tests of notify.c: the datagrams sd_notify sends to NOTIFY_SOCKET, and no-ops without it. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include "scratch_dir.h"
#include "unit.h"

#include "notify.h"

static void expect_datagram(int fd, const char *want) {
        char buf[2048];
        ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);

        assert_true(n > 0);
        buf[n] = 0;
        assert_string_equal(buf, want);
}

static void test_notify(void **state) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd;

        assert_int_equal(scratch_dir_make("notify"), 0);
        assert_true(snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/notify", scratch_dir) < (int)sizeof(sa.sun_path));
        fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        assert_true(fd >= 0);
        assert_int_equal(bind(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        setenv("NOTIFY_SOCKET", sa.sun_path, 1);

        assert_true(notify_ready() > 0);
        expect_datagram(fd, "READY=1");
        assert_true(notify_status("step %d of %d, loss %.3f", 5, 10, 0.25) > 0);
        expect_datagram(fd, "STATUS=step 5 of 10, loss 0.250");
        assert_true(notify_watchdog() > 0);
        expect_datagram(fd, "WATCHDOG=1");
        assert_true(notify_stopping() > 0);
        expect_datagram(fd, "STOPPING=1");

        unsetenv("NOTIFY_SOCKET");
        assert_int_equal(notify_ready(), 0);
        assert_int_equal(notify_status("x"), 0);
        assert_int_equal(notify_stopping(), 0);
        assert_int_equal(notify_watchdog(), 0);
        assert_int_equal(recv(fd, (char[8]) { 0 }, 8, MSG_DONTWAIT), -1);

        close(fd);
        assert_int_equal(rm_tree(scratch_dir), 0);
}

static void test_watchdog_usec(void **state) {
        char pid[32];

        unsetenv("WATCHDOG_USEC");
        unsetenv("WATCHDOG_PID");
        assert_int_equal(notify_watchdog_usec(), 0);
        snprintf(pid, sizeof(pid), "%d", (int) getpid());
        setenv("WATCHDOG_USEC", "5000000", 1);
        setenv("WATCHDOG_PID", pid, 1);
        assert_int_equal(notify_watchdog_usec(), 5000000);
        setenv("WATCHDOG_PID", "1", 1); /* meant for another process */
        assert_int_equal(notify_watchdog_usec(), 0);
        unsetenv("WATCHDOG_USEC");
        unsetenv("WATCHDOG_PID");
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_notify),
        cmocka_unit_test(test_watchdog_usec))
