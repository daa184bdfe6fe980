/* shmlink: the segment's checks on open, pushes served by another thread and by another process,
 * refusals with their messages, a peer that dies, deadlines, generations, and stale segments; the
 * attach socket: the descriptor and the sender's credentials, its refusals (no descriptor, a bad
 * message, silence, another uid), one listener per path, stale sockets, and an attach across processes. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "scratch_dir.h"
#include "unit.h"

#include "shmlink.h"
#include "util.h"

#define FP 0x1234abcdULL
#define NP 1000
#define JOB "test-shmlink"

static struct shmlink *create(uint32_t shards, uint32_t groups) {
        struct shmlink *w;
        char err[512] = "";
        int r = shmlink_create(JOB, 3, FP, NP, shards, groups, &w, err, sizeof(err));
        if (r < 0)
                fail_msg("shmlink_create: %s", err);
        return w;
}

static void test_open_checks(void **state) {
        struct shmlink *w = create(2, 4), *s;
        char err[512];
        uint8_t nonce[SHMLINK_NONCE];
        memcpy(nonce, shmlink_nonce(w), sizeof(nonce));
        int fd = shmlink_fd(w);
        pid_t me = getpid();
        assert_true(fd >= 0);
        uint32_t gen = shmlink_shard_open(w, 1);

        assert_int_equal(shmlink_open(fd, me, nonce, FP, NP, 1, gen, &s, err, sizeof(err)), 0);
        assert_int_equal(shmlink_n_groups(s), 4);
        assert_int_equal(shmlink_worker(s), 3);
        assert_int_equal(shmlink_worker_pid(s), getpid());
        /* both map the same blocks */
        shmlink_grads(w)[NP - 1] = 42.0f;
        assert_true(shmlink_grads(s)[NP - 1] == 42.0f);
        assert_int_equal((uintptr_t)shmlink_params(w) % 4096, 0);
        shmlink_free(s);

        uint8_t bad[SHMLINK_NONCE];
        memcpy(bad, nonce, sizeof(bad));
        bad[0] ^= 1;
        assert_int_equal(shmlink_open(fd, me, bad, FP, NP, 1, gen, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "nonce"));
        assert_int_equal(shmlink_open(fd, me, nonce, FP + 1, NP, 1, gen, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "fingerprint"));
        assert_int_equal(shmlink_open(fd, me, nonce, FP, NP + 1, 1, gen, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "parameters"));
        assert_int_equal(shmlink_open(fd, me, nonce, FP, NP, 2, gen, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "shard 2"));
        assert_int_equal(shmlink_open(fd, me, nonce, FP, NP, 1, gen + 1, &s, err, sizeof(err)), -ESTALE);
        /* the segment must be the sender's own */
        assert_int_equal(shmlink_open(fd, me + 1, nonce, FP, NP, 1, gen, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "belongs to process"));
        assert_int_equal(shmlink_open(-1, me, nonce, FP, NP, 1, gen, &s, err, sizeof(err)), -EBADF);

        /* only a psfleet memfd, and only one whose size is sealed */
        int other = memfd_create("something-else", MFD_CLOEXEC);
        int unsealed = memfd_create("psfleet-unsealed", MFD_CLOEXEC);
        int file = open("/dev/null", O_RDWR | O_CLOEXEC);
        assert_true(other >= 0 && unsealed >= 0 && file >= 0);
        assert_int_equal(ftruncate(unsealed, 1 << 20), 0);
        assert_int_equal(shmlink_open(other, me, nonce, FP, NP, 0, 1, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "not a psfleet segment"));
        assert_int_equal(shmlink_open(file, me, nonce, FP, NP, 0, 1, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "\"/dev/null\", not a psfleet segment"));
        assert_int_equal(shmlink_open(unsealed, me, nonce, FP, NP, 0, 1, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "not sealed"));
        close(other);
        close(unsealed);
        close(file);

        /* nobody can cut the segment short under a psd */
        assert_int_equal(ftruncate(fd, 8192), -1);
        assert_int_equal(errno, EPERM);
        shmlink_free(w);
        /* the owner's free closed the descriptor */
        assert_int_equal(fcntl(fd, F_GETFD), -1);
        assert_int_equal(errno, EBADF);
}

static void test_create_bad(void **state) {
        struct shmlink *w;
        char err[512];
        assert_int_equal(shmlink_create(JOB, 0, FP, NP, 0, 1, &w, err, sizeof(err)), -EINVAL);
        assert_int_equal(shmlink_create(JOB, 0, FP, NP, 1, SHMLINK_MAX_GROUPS + 1, &w, err, sizeof(err)), -EINVAL);
        assert_int_equal(shmlink_create(NULL, 0, FP, NP, 1, 1, &w, err, sizeof(err)), -EINVAL);
}

/* ---- a server: params = 2 * grads for the group's range, or a refusal ---- */

struct server {
        struct shmlink *l;
        uint32_t groups[4], n, last[4];
        atomic_bool stop;
        int end;                 /* what shmlink_next returned last */
        uint32_t served;
        uint64_t global_step;
};

static void *serve(void *arg) {
        struct server *sv = arg;
        for (;;) {
                struct shmlink_push p;
                int r = shmlink_next(sv->l, sv->groups, sv->n, sv->last, 50, 60000, &sv->stop, &p);
                if (r <= 0) {
                        sv->end = r;
                        return NULL;
                }
                uint32_t g = sv->groups[p.index];
                float *gr = shmlink_grads(sv->l), *pa = shmlink_params(sv->l);
                size_t b = (size_t)g * 100;
                if (gr[b] < 0) {
                        shmlink_reply(sv->l, g, p.seq, -EINVAL, 0, "gradient \"g\" contains NaN or Inf; nothing applied");
                } else {
                        for (size_t i = b; i < b + 100; i++)
                                pa[i] = 2 * gr[i];
                        if (p.count_step)
                                sv->global_step++;
                        shmlink_reply(sv->l, g, p.seq, 0, sv->global_step, NULL);
                }
                sv->served++;
        }
}

static struct shmlink *open_server(struct shmlink *w, uint32_t shard, uint32_t gen) {
        struct shmlink *s;
        char err[512];
        int r = shmlink_open(shmlink_fd(w), getpid(), shmlink_nonce(w), FP, NP, shard, gen, &s, err, sizeof(err));
        if (r < 0)
                fail_msg("shmlink_open: %s", err);
        return s;
}

static void start(struct server *sv, struct shmlink *w, uint32_t shard, uint32_t gen, pthread_t *t) {
        memset(sv, 0, sizeof(*sv));
        sv->l = open_server(w, shard, gen);
        sv->n = 2;
        sv->groups[0] = shard * 2, sv->groups[1] = shard * 2 + 1;
        shmlink_mark(sv->l, sv->groups, sv->n, sv->last);
        assert_int_equal(pthread_create(t, NULL, serve, sv), 0);
}

static void test_pushes(void **state) {
        struct shmlink *w = create(2, 4);
        struct server sv[2];
        pthread_t t[2];
        for (uint32_t s = 0; s < 2; s++)
                start(&sv[s], w, s, shmlink_shard_open(w, s), &t[s]);
        float *gr = shmlink_grads(w), *pa = shmlink_params(w);
        char err[512];
        for (uint32_t step = 0; step < 2000; step++) {
                uint32_t seq[4];
                for (uint32_t g = 0; g < 4; g++) {
                        for (size_t i = 0; i < 100; i++)
                                gr[g * 100 + i] = (float)(step + g + i);
                        seq[g] = shmlink_push(w, g, g / 2, step, g == 0);
                }
                for (uint32_t g = 0; g < 4; g++) {
                        uint64_t gs = 99;
                        assert_int_equal(shmlink_wait(w, g, seq[g], getpid(), 20, 10000000, &gs, err, sizeof(err)), 0);
                        assert_true(shmlink_answered(w, g, seq[g]));
                        if (g == 0)
                                assert_int_equal(gs, step + 1);
                        for (size_t i = 0; i < 100; i += 33)
                                assert_true(pa[g * 100 + i] == 2.0f * (float)(step + g + i));
                }
        }

        /* a refusal comes back with the server's status and message, and the link carries on */
        gr[100] = -1;
        uint32_t q = shmlink_push(w, 1, 0, 0, false);
        assert_int_equal(shmlink_wait(w, 1, q, getpid(), 0, 10000000, NULL, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "gradient \"g\" contains NaN or Inf; nothing applied");
        gr[100] = 1;
        q = shmlink_push(w, 1, 0, 0, false);
        assert_int_equal(shmlink_wait(w, 1, q, getpid(), 0, 10000000, NULL, err, sizeof(err)), 0);

        /* ending shard 1's generation stops its server (asleep in a 60 s wait) at once; shard 0's too
         * when its stop flag is set and it is kicked */
        uint64_t t0 = mono_us();
        shmlink_shard_close(w, 1);
        pthread_join(t[1], NULL);
        assert_int_equal(sv[1].end, -ESHUTDOWN);
        atomic_store(&sv[0].stop, true);
        shmlink_kick(sv[0].l);
        pthread_join(t[0], NULL);
        assert_int_equal(sv[0].end, -ESHUTDOWN);
        assert_true(mono_us() - t0 < 10000000);
        assert_int_equal(sv[0].served + sv[1].served, 8002);   /* each push served once */
        shmlink_free(sv[0].l);
        shmlink_free(sv[1].l);

        /* a new generation never serves the pushes of an older one */
        start(&sv[0], w, 0, shmlink_shard_open(w, 0), &t[0]);
        q = shmlink_push(w, 0, 0, 0, true);
        assert_int_equal(shmlink_wait(w, 0, q, getpid(), 0, 10000000, NULL, err, sizeof(err)), 0);
        /* the owner's free closes the segment: the server stops */
        shmlink_free(w);
        pthread_join(t[0], NULL);
        assert_int_equal(sv[0].end, -ESHUTDOWN);
        assert_int_equal(sv[0].served, 1);
        shmlink_free(sv[0].l);
}

static void test_mark_skips_old_pushes(void **state) {
        struct shmlink *w = create(1, 2);
        shmlink_push(w, 0, 0, 0, false);   /* nobody serves this one */
        struct server sv;
        pthread_t t;
        start(&sv, w, 0, shmlink_shard_open(w, 0), &t);
        char err[512];
        uint32_t q = shmlink_push(w, 1, 0, 0, false);
        assert_int_equal(shmlink_wait(w, 1, q, getpid(), 0, 10000000, NULL, err, sizeof(err)), 0);
        atomic_store(&sv.stop, true);
        shmlink_kick(sv.l);
        pthread_join(t, NULL);
        assert_int_equal(sv.served, 1);
        assert_false(shmlink_answered(w, 0, 1));
        shmlink_free(sv.l);
        shmlink_free(w);
}

static void test_deadline(void **state) {
        struct shmlink *w = create(1, 1);
        char err[512];
        uint32_t q = shmlink_push(w, 0, 0, 0, false);
        assert_int_equal(shmlink_wait(w, 0, q, getpid(), 10, 100000, NULL, err, sizeof(err)), -ETIMEDOUT);
        assert_non_null(strstr(err, "within 100 ms"));
        shmlink_free(w);
}

/* A child process, and a pipe between it and us: 0 in the child, its pid in the parent. */
static pid_t fork_with_pipe(int pipefd[2]) {
        assert_int_equal(pipe(pipefd), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        return pid;
}

/* A server in another process: it serves, then is killed; the waiting worker learns it at once. */
static void test_peer_process(void **state) {
        struct shmlink *w = create(1, 2);
        uint32_t gen = shmlink_shard_open(w, 0);
        int ready[2];
        pid_t pid = fork_with_pipe(ready);
        if (pid == 0) {
                struct server sv = {.n = 1, .groups = {0}};
                char err[512];
                if (shmlink_open(shmlink_fd(w), getppid(), shmlink_nonce(w), FP, NP, 0, gen, &sv.l, err, sizeof(err)) < 0)
                        _exit(1);
                shmlink_mark(sv.l, sv.groups, sv.n, sv.last);
                if (write(ready[1], "x", 1) != 1)
                        _exit(1);
                serve(&sv);   /* serves group 0 only, until killed */
                _exit(0);
        }
        char c;
        assert_int_equal(read(ready[0], &c, 1), 1);
        char err[512];
        shmlink_grads(w)[0] = 3;
        uint32_t q = shmlink_push(w, 0, 0, 0, false);
        assert_int_equal(shmlink_wait(w, 0, q, pid, 0, 10000000, NULL, err, sizeof(err)), 0);
        assert_true(shmlink_params(w)[0] == 6.0f);
        /* group 1 is never served: kill the server while we wait for it */
        q = shmlink_push(w, 1, 0, 0, false);
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(waitpid(pid, NULL, 0), pid);
        uint64_t t0 = mono_us();
        assert_int_equal(shmlink_wait(w, 1, q, pid, 0, 60000000, NULL, err, sizeof(err)), -ECONNRESET);
        assert_true(mono_us() - t0 < 10000000);
        assert_non_null(strstr(err, "is gone"));
        close(ready[0]);
        close(ready[1]);
        shmlink_free(w);
}

/* ---- the attach socket ---- */

struct refusals {
        int n;
        char last[600];
};

static void refused(void *ud, const char *why) {
        struct refusals *f = ud;
        f->n++;
        snprintf(f->last, sizeof(f->last), "%s", why);
}

/* A fresh runtime directory (not made yet) under a temporary one, and the socket path in it. */
static char *runtime_dir(char *tmp, size_t len, char *path, size_t plen) {
        if (scratch_dir_make("shmlink") < 0)
                fail_msg("mkdtemp: %s", strerror(errno));
        if ((size_t)snprintf(tmp, len, "%s", scratch_dir) >= len)
                fail_msg("%s: too long", scratch_dir);
        char dir[200], err[300];
        snprintf(dir, sizeof(dir), "%s/run", tmp);
        if (shmlink_socket_path(dir, JOB, 2, path, plen, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        return path;
}

static void cleanup(const char *tmp) {
        assert_int_equal(rm_tree(tmp), 0);
}

static void test_socket_path(void **state) {
        char path[200], err[300], dir[200];
        assert_int_equal(shmlink_socket_path("/run/psfleet", "fmnist", 3, path, sizeof(path), err, sizeof(err)), 0);
        assert_string_equal(path, "/run/psfleet/fmnist-ps-3.sock");
        memset(dir, 'd', 100);
        dir[0] = '/';
        dir[100] = 0;
        assert_int_equal(shmlink_socket_path(dir, "fmnist", 3, path, sizeof(path), err, sizeof(err)), -ENAMETOOLONG);
        assert_non_null(strstr(err, "rpc.runtime_dir"));
}

/* The worker's descriptor reaches the listener with the sender's credentials; every refusal is
 * answered to the sender and told to the owner. */
static void test_socket_attach(void **state) {
        char tmp[64], path[200], err[600];
        runtime_dir(tmp, sizeof(tmp), path, sizeof(path));
        struct refusals f = {0};
        struct shmlink_server *srv;
        assert_int_equal(shmlink_server_new(path, refused, &f, &srv, err, sizeof(err)), 0);
        struct stat st;
        char dir[200];
        snprintf(dir, sizeof(dir), "%s/run", tmp);
        assert_int_equal(stat(dir, &st), 0);
        assert_int_equal(st.st_mode & 07777, 0750);
        assert_int_equal(lstat(path, &st), 0);
        assert_true(S_ISSOCK(st.st_mode));
        assert_int_equal(st.st_mode & 07777, 0660);

        struct shmlink *w = create(3, 6), *l;
        const uint8_t *nonce = shmlink_nonce(w);
        assert_int_equal(shmlink_send(path, shmlink_fd(w), nonce, 2000, err, sizeof(err)), 0);
        /* a second send from the same process replaces the first: one descriptor pending per process */
        assert_int_equal(shmlink_send(path, shmlink_fd(w), nonce, 2000, err, sizeof(err)), 0);
        int fd = -1;
        pid_t pid = 0;
        uid_t uid = 1;
        uint8_t bad[SHMLINK_NONCE];
        memcpy(bad, nonce, sizeof(bad));
        bad[5] ^= 2;
        assert_int_equal(shmlink_server_take(srv, bad, &fd, &pid, &uid, err, sizeof(err)), -ENOENT);
        assert_non_null(strstr(err, "no descriptor with this nonce"));
        assert_int_equal(shmlink_server_take(srv, nonce, &fd, &pid, &uid, err, sizeof(err)), 0);
        assert_int_equal(pid, getpid());
        assert_int_equal(uid, geteuid());
        assert_true(fd >= 0 && fd != shmlink_fd(w));
        uint32_t gen = shmlink_shard_open(w, 2);
        assert_int_equal(shmlink_open(fd, pid, nonce, FP, NP, 2, gen, &l, err, sizeof(err)), 0);
        close(fd);
        shmlink_grads(w)[7] = 5.0f;
        assert_true(shmlink_grads(l)[7] == 5.0f);
        shmlink_free(l);
        /* taken: not there any more */
        assert_int_equal(shmlink_server_take(srv, nonce, &fd, &pid, &uid, err, sizeof(err)), -ENOENT);
        assert_int_equal(f.n, 0);

        /* refused: no descriptor */
        assert_int_equal(shmlink_send(path, -1, nonce, 2000, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "no descriptor sent"));
        assert_int_equal(f.n, 1);
        assert_non_null(strstr(f.last, "refused: no descriptor sent"));
        assert_non_null(strstr(f.last, path));
        /* refused: a message that is not an attach */
        int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        assert_true(strlen(path) < sizeof(a.sun_path));
        memcpy(a.sun_path, path, strlen(path) + 1);
        assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof(a)), 0);
        assert_int_equal(send(c, "hello", 5, 0), 5);
        char ans[512];
        assert_true(recv(c, ans, sizeof(ans), 0) > 4);
        assert_non_null(strstr(ans + 4, "not an attach message"));
        close(c);
        assert_int_equal(f.n, 2);
        /* connecting and leaving (as a psd checking for a live one does) is no refusal */
        c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof(a)), 0);
        close(c);
        /* refused: connected, and silent past the deadline */
        c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof(a)), 0);
        struct timeval tv = {.tv_sec = 10};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        assert_true(recv(c, ans, sizeof(ans), 0) > 4);
        assert_non_null(strstr(ans + 4, "no message within"));
        close(c);
        assert_int_equal(f.n, 3);

        /* a second listener at the same path is refused while the first lives */
        struct shmlink_server *two;
        assert_int_equal(shmlink_server_new(path, refused, &f, &two, err, sizeof(err)), -EADDRINUSE);
        assert_non_null(strstr(err, "another psd listens"));
        /* a descriptor still pending is closed with the listener, and the socket goes */
        assert_int_equal(shmlink_send(path, shmlink_fd(w), nonce, 2000, err, sizeof(err)), 0);
        shmlink_server_free(srv);
        assert_int_equal(lstat(path, &st), -1);
        assert_int_equal(shmlink_send(path, shmlink_fd(w), nonce, 2000, err, sizeof(err)), -ENOENT);
        assert_non_null(strstr(err, "nothing listens"));

        /* a stale socket (its listener gone) is replaced; anything else in the way is not */
        c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        assert_int_equal(bind(c, (struct sockaddr *)&a, sizeof(a)), 0);
        close(c);
        assert_int_equal(shmlink_send(path, shmlink_fd(w), nonce, 2000, err, sizeof(err)), -ECONNREFUSED);
        assert_int_equal(shmlink_server_new(path, refused, &f, &srv, err, sizeof(err)), 0);
        shmlink_server_free(srv);
        int file = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        assert_true(file >= 0);
        close(file);
        assert_int_equal(shmlink_server_new(path, refused, &f, &srv, err, sizeof(err)), -EEXIST);
        assert_non_null(strstr(err, "not a socket"));
        /* a directory that cannot be made */
        char under[300];
        snprintf(under, sizeof(under), "%s/sub/x.sock", path);
        assert_int_equal(shmlink_server_new(under, refused, &f, &srv, err, sizeof(err)), -ENOTDIR);
        assert_non_null(strstr(err, "cannot make the directory"));
        unlink(path);
        shmlink_free(w);
        cleanup(tmp);
}

/* Another user of the psfleet group may connect (the socket is 0660) but is refused: SO_PEERCRED. Only
 * root can become another user to show it. */
static void test_socket_other_uid(void **state) {
        if (geteuid() != 0) {
                printf("skipped: another uid needs root to setuid() to\n");
                skip();
        }
        char tmp[64], path[200], err[600];
        runtime_dir(tmp, sizeof(tmp), path, sizeof(path));
        struct refusals f = {0};
        assert_int_equal(chmod(tmp, 0750), 0);   /* mkdtemp's 0700 would keep the group out before the socket does */
        struct shmlink_server *srv;
        assert_int_equal(shmlink_server_new(path, refused, &f, &srv, err, sizeof(err)), 0);
        struct shmlink *w = create(1, 1);
        struct stat st;
        assert_int_equal(lstat(path, &st), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                /* in the socket's group (as a member of psfleet would be), as nobody; says -r */
                if (setgroups(0, NULL) < 0 || setgid(st.st_gid) < 0 || setuid(65534) < 0)
                        _exit(100);
                _exit(-shmlink_send(path, shmlink_fd(w), shmlink_nonce(w), 5000, err, sizeof(err)));
        }
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), EACCES);
        assert_int_equal(f.n, 1);
        assert_non_null(strstr(f.last, "(uid 65534) refused: uid 65534 is neither psd's (0) nor root"));
        int fd;
        pid_t p2;
        uid_t u2;
        assert_int_equal(shmlink_server_take(srv, shmlink_nonce(w), &fd, &p2, &u2, err, sizeof(err)), -ENOENT);
        shmlink_server_free(srv);
        shmlink_free(w);
        cleanup(tmp);
}

/* The whole attach across processes: the child listens as psd would, the parent sends its segment,
 * the child maps it with the pid the kernel vouched for and serves a push. */
static void test_socket_process(void **state) {
        char tmp[64], path[200];
        runtime_dir(tmp, sizeof(tmp), path, sizeof(path));
        struct shmlink *w = create(1, 1);
        uint8_t nonce[SHMLINK_NONCE];
        memcpy(nonce, shmlink_nonce(w), sizeof(nonce));
        uint32_t gen = shmlink_shard_open(w, 0);
        int ready[2];
        pid_t pid = fork_with_pipe(ready);
        if (pid == 0) {
                /* forget the parent's segment: only the socket may bring it */
                int own = shmlink_fd(w);
                close(own);
                struct shmlink_server *srv;
                char err[600];
                if (shmlink_server_new(path, NULL, NULL, &srv, err, sizeof(err)) < 0 || write(ready[1], "x", 1) != 1)
                        _exit(1);
                int fd = -1;
                pid_t from;
                uid_t uid;
                uint64_t until = mono_us() + 10000000;
                while (shmlink_server_take(srv, nonce, &fd, &from, &uid, err, sizeof(err)) < 0 && mono_us() < until)
                        usleep(1000);
                struct server sv = {.n = 1, .groups = {0}};
                if (fd < 0 || from != getppid() ||
                    shmlink_open(fd, from, nonce, FP, NP, 0, gen, &sv.l, err, sizeof(err)) < 0)
                        _exit(3);
                close(fd);
                shmlink_mark(sv.l, sv.groups, sv.n, sv.last);
                if (write(ready[1], "y", 1) != 1)   /* pushes from now on are served */
                        _exit(1);
                serve(&sv);
                shmlink_server_free(srv);
                _exit(sv.served == 1 ? 0 : 4);
        }
        char c, err[600];
        assert_int_equal(read(ready[0], &c, 1), 1);
        assert_int_equal(shmlink_send(path, shmlink_fd(w), nonce, 5000, err, sizeof(err)), 0);
        assert_int_equal(read(ready[0], &c, 1), 1);
        shmlink_grads(w)[0] = 4;
        uint32_t q = shmlink_push(w, 0, 0, 0, false);
        assert_int_equal(shmlink_wait(w, 0, q, pid, 0, 10000000, NULL, err, sizeof(err)), 0);
        assert_true(shmlink_params(w)[0] == 8.0f);
        shmlink_shard_close(w, 0);   /* the child's serve() ends */
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        close(ready[0]);
        close(ready[1]);
        shmlink_free(w);
        cleanup(tmp);
}

UNIT_TEST_MAIN(NULL, NULL,
        cmocka_unit_test(test_open_checks),
        cmocka_unit_test(test_create_bad),
        cmocka_unit_test(test_pushes),
        cmocka_unit_test(test_mark_skips_old_pushes),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_peer_process),
        cmocka_unit_test(test_socket_path),
        cmocka_unit_test(test_socket_attach),
        cmocka_unit_test(test_socket_other_uid),
        cmocka_unit_test(test_socket_process))
