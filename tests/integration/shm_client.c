/* A worker's side of the shared-memory link, driven by hand against a real psd (test_bad_push.py):
 * attaches psd must refuse (on its socket: another uid, when run as root, and no descriptor; in the
 * AttachSharedMemory call: a nonce no descriptor came with, another pid, a descriptor that is not a
 * psfleet memfd or not sealed, a segment without the nonce, bad groups), a NaN gradient it must
 * refuse without applying anything, and good pushes whose fresh values must land in the segment
 * equal to what Pull reads.
 *
 * Usage: shm_client JOB.json   (shard 0 of the job, which must be initialized; prints "ok" and
 * exits 0, or says what failed and exits 1) */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "job.h"
#include "ps_client.h"
#include "model.h"
#include "rpc.h"
#include "shmlink.h"

#define CLIENT_NAME "shm_client"
#include "client_check.h"

/* A process of another user in the socket's group (as a member of the psfleet group would be) may
 * connect, and psd refuses it (SO_PEERCRED). Only root can become another user. */
static void other_user(const char *path, struct shmlink *l) {
        if (geteuid() != 0) {
                printf("skipped, another uid: not root, cannot setuid()\n");
                return;
        }
        struct stat st;
        int res[2];
        CHECK(stat(path, &st) == 0 && pipe(res) == 0, "%s: %s", path, strerror(errno));
        pid_t pid = fork();
        CHECK(pid >= 0, "fork");
        if (pid == 0) {
                char err[600];
                if (setgroups(0, NULL) < 0 || setgid(st.st_gid) < 0 || setuid(65534) < 0)
                        _exit(2);
                int r = shmlink_send(path, shmlink_fd(l), shmlink_nonce(l), 5000, err, sizeof(err));
                dprintf(res[1], "%d %s", r, err);
                _exit(0);
        }
        close(res[1]);
        char out[700] = "";
        ssize_t got = read(res[0], out, sizeof(out) - 1);
        close(res[0]);
        int status;
        CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: %x", status);
        out[got > 0 ? got : 0] = 0;
        CHECK(atoi(out) == -EACCES && strstr(out, "uid 65534 is neither psd's"), "another uid: %s", out);
        printf("refused, another uid: %s\n", out);
}

int main(int argc, char **argv) {
        CHECK(argc == 2, "usage: shm_client JOB.json");
        char err[1024];
        struct job_config *cfg;
        CHECK(config_load(argv[1], &cfg, err, sizeof(err)) == 0, "%s", err);
        CHECK(config_apply_env(cfg, "rpc", err, sizeof(err)) == 0, "%s", err);   /* PSFLEET_RUNTIME_DIR, as workerd */
        struct job_layout *L;
        CHECK(job_layout_new(cfg, &L) == 0, "layout");
        char path[256];
        CHECK(shmlink_socket_path(cfg->rpc.runtime_dir, cfg->name, 0, path, sizeof(path), err, sizeof(err)) == 0, "%s",
              err);
        uint32_t n = L->shard_count[0];   /* one group per part of shard 0 */
        struct shmlink *l;
        CHECK(shmlink_create(cfg->name, 0, L->fingerprint, L->n_params, L->n_shards, n, &l, err, sizeof(err)) == 0, "%s",
              err);
        /* before gRPC's threads exist: the child of a fork runs alone */
        other_user(path, l);

        rpc_global_init();
        struct backend *be;
        struct model *m;
        struct ps_client *pc;
        CHECK(backend_cpu_new(1, &be) == 0 && model_new(&cfg->model, be, 1, &m) == 0, "model");
        CHECK(ps_client_new(cfg, L, "worker:0", &pc) == 0, "client");

        uint32_t *index = calloc(n, sizeof(uint32_t)), *one = calloc(n, sizeof(uint32_t));
        const uint32_t **parts = calloc(n, sizeof(*parts));
        for (uint32_t i = 0; i < n; i++) {
                index[i] = i;
                one[i] = 1;
                parts[i] = &L->shard_parts[L->shard_first[0] + i];
        }
        int32_t pid = 0;
        uint32_t gen = shmlink_shard_open(l, 0);
        int r;

        /* refused on the socket: no descriptor */
        r = shmlink_send(path, -1, shmlink_nonce(l), 5000, err, sizeof(err));
        CHECK(r == -EPROTO && strstr(err, "no descriptor sent"), "no descriptor: %d %s", r, err);
        printf("refused, no descriptor: %s\n", err);
        /* refused: a call whose nonce came with no descriptor */
        uint8_t bad[SHMLINK_NONCE];
        memcpy(bad, shmlink_nonce(l), sizeof(bad));
        bad[3] ^= 0x40;
        CHECK(shmlink_send(path, shmlink_fd(l), shmlink_nonce(l), 5000, err, sizeof(err)) == 0, "send: %s", err);
        r = ps_client_attach_shm(pc, 0, 0, getpid(), bad, gen, n, index, parts, one, &pid, err, sizeof(err));
        CHECK(r < 0 && strstr(err, "FAILED_PRECONDITION") && strstr(err, "no descriptor with this nonce"),
              "wrong nonce: %d %s", r, err);
        printf("refused, no descriptor with the call's nonce: %s\n", err);
        /* refused: the call names another process than the one that sent the descriptor */
        CHECK(shmlink_send(path, shmlink_fd(l), shmlink_nonce(l), 5000, err, sizeof(err)) == 0, "send: %s", err);
        r = ps_client_attach_shm(pc, 0, 0, getpid() + 1, shmlink_nonce(l), gen, n, index, parts, one, &pid, err,
                                 sizeof(err));
        CHECK(r < 0 && strstr(err, "PERMISSION_DENIED") && strstr(err, "the descriptor came from process"),
              "another pid: %d %s", r, err);
        printf("refused, another pid: %s\n", err);
        /* refused: a descriptor that is not a psfleet memfd, a psfleet memfd that is not sealed, a
         * segment without the nonce */
        int other = memfd_create("something-else", MFD_CLOEXEC), unsealed = memfd_create("psfleet-x", MFD_CLOEXEC);
        CHECK(other >= 0 && unsealed >= 0 && ftruncate(other, 1 << 20) == 0 && ftruncate(unsealed, 1 << 20) == 0,
              "memfd");
        struct {
                int fd;
                const uint8_t *nonce;
                const char *what, *says;
        } bads[] = {
                {other, shmlink_nonce(l), "not a psfleet memfd", "not a psfleet segment"},
                {unsealed, shmlink_nonce(l), "unsealed", "not sealed"},
                {shmlink_fd(l), bad, "nonce not in the segment", "its nonce is not the one"},
        };
        for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
                CHECK(shmlink_send(path, bads[i].fd, bads[i].nonce, 5000, err, sizeof(err)) == 0, "send: %s", err);
                r = ps_client_attach_shm(pc, 0, 0, getpid(), bads[i].nonce, gen, n, index, parts, one, &pid, err,
                                         sizeof(err));
                CHECK(r < 0 && strstr(err, "FAILED_PRECONDITION") && strstr(err, bads[i].says), "%s: %d %s", bads[i].what,
                      r, err);
                printf("refused, %s: %s\n", bads[i].what, err);
        }
        close(other);
        close(unsealed);
        /* refused: a part given twice, a group the segment does not have */
        if (n > 1) {
                const uint32_t *twice[2] = {parts[0], parts[0]};
                CHECK(shmlink_send(path, shmlink_fd(l), shmlink_nonce(l), 5000, err, sizeof(err)) == 0, "send: %s", err);
                r = ps_client_attach_shm(pc, 0, 0, getpid(), shmlink_nonce(l), gen, 2, index, twice, one, &pid, err,
                                         sizeof(err));
                CHECK(r == -EINVAL && strstr(err, "given twice"), "part twice: %d %s", r, err);
                printf("refused, part twice: %s\n", err);
        }
        uint32_t far = n + 7;
        CHECK(shmlink_send(path, shmlink_fd(l), shmlink_nonce(l), 5000, err, sizeof(err)) == 0, "send: %s", err);
        r = ps_client_attach_shm(pc, 0, 0, getpid(), shmlink_nonce(l), gen, 1, &far, parts, one, &pid, err, sizeof(err));
        CHECK(r == -EINVAL && strstr(err, "no such group"), "group out of range: %d %s", r, err);
        printf("refused, group out of range: %s\n", err);

        /* attached */
        CHECK(shmlink_send(path, shmlink_fd(l), shmlink_nonce(l), 5000, err, sizeof(err)) == 0, "send: %s", err);
        r = ps_client_attach_shm(pc, 0, 0, getpid(), shmlink_nonce(l), gen, n, index, parts, one, &pid, err,
                                 sizeof(err));
        CHECK(r == 0 && pid > 0, "attach: %d %s", r, err);

        float *before = malloc(L->n_params * sizeof(float)), *after = malloc(L->n_params * sizeof(float));
        uint64_t gs0, gs;
        CHECK(ps_client_pull(pc, before, NULL, &gs0, err, sizeof(err)) == 0, "pull: %s", err);

        /* a NaN in the last part's gradient: refused with a message, nothing applied */
        float *g = shmlink_grads(l), *v = shmlink_params(l);
        for (size_t i = 0; i < L->n_params; i++)
                g[i] = 1.0f;
        const struct placement_part *pp = &L->plan->parts[*parts[n - 1]];
        const struct job_var *jv = &L->vars[pp->var];
        g[jv->offset + (size_t)pp->row_begin * jv->cols] = NAN;
        uint32_t seq = shmlink_push(l, n - 1, 0, 1, true);
        r = shmlink_wait(l, n - 1, seq, pid, 0, 10000000, NULL, err, sizeof(err));
        CHECK(r == -EINVAL && strstr(err, "NaN or Inf") && strstr(err, jv->name), "NaN push: %d %s", r, err);
        printf("refused, NaN: %s\n", err);
        CHECK(ps_client_pull(pc, after, NULL, &gs, err, sizeof(err)) == 0, "pull: %s", err);
        CHECK(memcmp(before, after, L->n_params * sizeof(float)) == 0 && gs == gs0, "a refused push changed the shard");

        /* good pushes of every group: the values psd writes into the segment are what Pull reads */
        g[jv->offset + (size_t)pp->row_begin * jv->cols] = 1.0f;
        memset(v, 0, L->n_params * sizeof(float));
        for (uint32_t i = 0; i < n; i++) {
                seq = shmlink_push(l, i, 0, 1, i == 0);
                CHECK(shmlink_wait(l, i, seq, pid, 0, 10000000, &gs, err, sizeof(err)) == 0, "push %u: %s", i, err);
        }
        CHECK(gs == gs0 + 1, "global_step %llu after one counted push from %llu", (unsigned long long)gs,
              (unsigned long long)gs0);
        CHECK(ps_client_pull(pc, after, NULL, &gs, err, sizeof(err)) == 0, "pull: %s", err);
        size_t changed = 0;
        for (uint32_t i = 0; i < n; i++) {
                const struct placement_part *q = &L->plan->parts[*parts[i]];
                const struct job_var *qv = &L->vars[q->var];
                size_t at = qv->offset + (size_t)q->row_begin * qv->cols, cnt = (size_t)(q->row_end - q->row_begin) * qv->cols;
                CHECK(memcmp(v + at, after + at, cnt * sizeof(float)) == 0, "values of %s in the segment differ from Pull",
                      qv->name);
                for (size_t e = at; e < at + cnt; e++)
                        changed += after[e] != before[e];
        }
        CHECK(changed > 0, "a gradient of ones changed no value");
        printf("ok: %u groups pushed through shared memory, %zu values changed, global_step %llu\n", n, changed,
               (unsigned long long)gs);
        shmlink_free(l);
        free(before);
        free(after);
        free(index);
        free(one);
        free(parts);
        ps_client_free(pc);
        job_layout_free(L);
        model_free(m);
        backend_free(be);
        config_free(cfg);
        return 0;
}
