/* Daemons that a C harness or benchmark starts (the C counterpart of integration/harness.py's
 * free_ports, Proc, wait_healthy and cleanup): free loopback ports, a process started with its
 * output in a log, a wait until it is healthy with a deadline and the last reason it was not, and a
 * stop that reaps it. Header-only, as the harnesses build from single files. */
#pragma once
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* n (at most 128) distinct loopback TCP ports that nothing listens on: the kernel's picks for port 0,
 * held together while picking so that they differ. 0, or -errno (ports untouched). */
static inline int daemons_free_ports(int *ports, size_t n)
{
        int fds[128], got[128], r = 0;
        size_t held = 0;
        if (n > sizeof(fds) / sizeof(fds[0]))
                return -EINVAL;
        while (held < n) {
                struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
                socklen_t len = sizeof(a);
                int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fd < 0) {
                        r = -errno;
                        break;
                }
                fds[held++] = fd;
                if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
                        r = -errno;
                        break;
                }
                got[held - 1] = ntohs(a.sin_port);
        }
        for (size_t i = 0; i < held; i++)
                close(fds[i]);
        if (r == 0)
                memcpy(ports, got, n * sizeof(*ports));
        return r;
}

/* One free loopback port (> 0), or -errno. */
static inline int daemons_free_port(void)
{
        int port, r = daemons_free_ports(&port, 1);
        return r < 0 ? r : port;
}

/* Whether something accepts TCP connections on 127.0.0.1:port. */
static inline bool daemons_listens(int port)
{
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                .sin_port = htons((uint16_t)port)};
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (fd >= 0)
                close(fd);
        return ok;
}

/* Starts argv[0] (a path) with argv, stdin from /dev/null and stdout and stderr appended to log;
 * child_setup (NULL: none) runs in the child first. Returns the pid, or -errno (the fork's). */
static inline pid_t daemons_spawn(char *const argv[], const char *log, void (*child_setup)(void))
{
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid > 0)
                return pid;
        if (child_setup)
                child_setup();
        int in = open("/dev/null", O_RDONLY), out = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (in < 0 || out < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0)
                _exit(127);
        execv(argv[0], argv);
        dprintf(2, "%s: cannot run: %s\n", argv[0], strerror(errno));
        _exit(127);
}

static inline uint64_t daemons_now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Asks healthy(arg, why, len) every poll_ms until it returns 0: returns 0. When pid > 0 and that
 * process exits first, -ECHILD with how it ended in why (the process reaped); after timeout_ms,
 * -ETIMEDOUT with the last reason healthy gave in why. healthy writes why only when it returns < 0. */
static inline int daemons_wait_healthy(pid_t pid, int (*healthy)(void *arg, char *why, size_t len), void *arg,
                                       unsigned timeout_ms, unsigned poll_ms, char *why, size_t len)
{
        uint64_t end = daemons_now_ms() + timeout_ms;
        char last[256] = "never asked";
        for (;;) {
                if (healthy(arg, last, sizeof(last)) == 0)
                        return 0;
                int st;
                if (pid > 0 && waitpid(pid, &st, WNOHANG) == pid) {
                        if (WIFEXITED(st))
                                snprintf(why, len, "exited with status %d before it was healthy (last: %s)",
                                         WEXITSTATUS(st), last);
                        else
                                snprintf(why, len, "killed by signal %d before it was healthy (last: %s)",
                                         WIFSIGNALED(st) ? WTERMSIG(st) : 0, last);
                        return -ECHILD;
                }
                if (daemons_now_ms() >= end) {
                        snprintf(why, len, "not healthy after %u ms: %s", timeout_ms, last);
                        return -ETIMEDOUT;
                }
                usleep(poll_ms * 1000u);
        }
}

/* Ends process pid: SIGTERM, then SIGKILL when it has not exited after timeout_ms; reaps it.
 * Returns its wait status, or -errno (-ECHILD: not ours, or reaped already). pid <= 0: 0. */
static inline int daemons_stop(pid_t pid, unsigned timeout_ms)
{
        int st;
        if (pid <= 0)
                return 0;
        if (kill(pid, SIGTERM) < 0 && errno != ESRCH)
                return -errno;
        for (uint64_t end = daemons_now_ms() + timeout_ms;;) {
                pid_t w = waitpid(pid, &st, WNOHANG);
                if (w == pid)
                        return st;
                if (w < 0)
                        return -errno;
                if (daemons_now_ms() >= end)
                        break;
                usleep(10000);
        }
        kill(pid, SIGKILL);
        return waitpid(pid, &st, 0) == pid ? st : -errno;
}
