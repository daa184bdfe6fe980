/* shmlink: the segment's checks on open, pushes served by another thread and by another process,
 * refusals with their messages, a peer that dies, deadlines, generations, and stale segments. */
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

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
        char name[128];
        snprintf(name, sizeof(name), "%s", shmlink_name(w));
        assert_int_equal(strncmp(name, "/proc/", 6), 0);
        uint32_t gen = shmlink_shard_open(w, 1);

        assert_int_equal(shmlink_open(name, nonce, FP, NP, 1, gen, &s, err, sizeof(err)), 0);
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
        assert_int_equal(shmlink_open(name, bad, FP, NP, 1, gen, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "nonce"));
        assert_int_equal(shmlink_open(name, nonce, FP + 1, NP, 1, gen, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "fingerprint"));
        assert_int_equal(shmlink_open(name, nonce, FP, NP + 1, 1, gen, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "parameters"));
        assert_int_equal(shmlink_open(name, nonce, FP, NP, 2, gen, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "shard 2"));
        assert_int_equal(shmlink_open(name, nonce, FP, NP, 1, gen + 1, &s, err, sizeof(err)), -ESTALE);
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd/9999", (int)getpid());
        assert_int_equal(shmlink_open(path, nonce, FP, NP, 0, 1, &s, err, sizeof(err)), -ENOENT);
        assert_non_null(strstr(err, path));
        assert_int_equal(shmlink_open("/dev/shm/x", nonce, FP, NP, 0, 1, &s, err, sizeof(err)), -EINVAL);
        assert_int_equal(shmlink_open("/proc/self/fd/3", nonce, FP, NP, 0, 1, &s, err, sizeof(err)), -EINVAL);
        assert_int_equal(shmlink_open("/proc/1/fd/3x", nonce, FP, NP, 0, 1, &s, err, sizeof(err)), -EINVAL);

        /* only a psfleet memfd, and only one whose size is sealed */
        int other = memfd_create("something-else", MFD_CLOEXEC);
        int unsealed = memfd_create("psfleet-unsealed", MFD_CLOEXEC);
        assert_true(other >= 0 && unsealed >= 0);
        assert_int_equal(ftruncate(unsealed, 1 << 20), 0);
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)getpid(), other);
        assert_int_equal(shmlink_open(path, nonce, FP, NP, 0, 1, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "not a psfleet segment"));
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)getpid(), unsealed);
        assert_int_equal(shmlink_open(path, nonce, FP, NP, 0, 1, &s, err, sizeof(err)), -EPROTO);
        assert_non_null(strstr(err, "not sealed"));
        close(other);
        close(unsealed);

        /* nobody can cut the segment short under a psd */
        int fd = open(name, O_RDWR);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, 8192), -1);
        assert_int_equal(errno, EPERM);
        close(fd);
        shmlink_free(w);
        /* the owner's free closed the descriptor: nothing left to open */
        assert_int_equal(shmlink_open(name, nonce, FP, NP, 1, gen, &s, err, sizeof(err)), -ENOENT);
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
        int r = shmlink_open(shmlink_name(w), shmlink_nonce(w), FP, NP, shard, gen, &s, err, sizeof(err));
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

/* A server in another process: it serves, then is killed; the waiting worker learns it at once. */
static void test_peer_process(void **state) {
        struct shmlink *w = create(1, 2);
        uint32_t gen = shmlink_shard_open(w, 0);
        int ready[2];
        assert_int_equal(pipe(ready), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                struct server sv = {.n = 1, .groups = {0}};
                char err[512];
                if (shmlink_open(shmlink_name(w), shmlink_nonce(w), FP, NP, 0, gen, &sv.l, err, sizeof(err)) < 0)
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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_open_checks),
                cmocka_unit_test(test_create_bad),
                cmocka_unit_test(test_pushes),
                cmocka_unit_test(test_mark_skips_old_pushes),
                cmocka_unit_test(test_deadline),
                cmocka_unit_test(test_peer_process),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
