/* A worker's side of the shared-memory link, driven by hand against a real psd (test_bad_push.py):
 * attach requests psd must refuse, a NaN gradient it must refuse without applying anything, and good
 * pushes whose fresh values must land in the segment equal to what Pull reads.
 *
 * Usage: shm_client JOB.json   (shard 0 of the job, which must be initialized; prints "ok" and
 * exits 0, or says what failed and exits 1) */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "job.h"
#include "ps_client.h"
#include "model.h"
#include "rpc.h"
#include "shmlink.h"

#define CHECK(cond, ...)                                          \
        do {                                                      \
                if (!(cond)) {                                    \
                        fprintf(stderr, "shm_client: FAIL: ");    \
                        fprintf(stderr, __VA_ARGS__);             \
                        fprintf(stderr, "\n");                    \
                        exit(1);                                  \
                }                                                 \
        } while (0)

int main(int argc, char **argv) {
        CHECK(argc == 2, "usage: shm_client JOB.json");
        char err[1024];
        struct job_config *cfg;
        CHECK(config_load(argv[1], &cfg, err, sizeof(err)) == 0, "%s", err);
        rpc_global_init();
        struct backend *be;
        struct model *m;
        struct job_layout *L;
        struct ps_client *pc;
        CHECK(backend_cpu_new(1, &be) == 0 && model_new(&cfg->model, be, 1, &m) == 0, "model");
        CHECK(job_layout_new(cfg, &L) == 0 && ps_client_new(cfg, L, "worker:0", &pc) == 0, "layout");

        /* one group per part of shard 0 */
        uint32_t n = L->shard_count[0];
        uint32_t *index = calloc(n, sizeof(uint32_t)), *one = calloc(n, sizeof(uint32_t));
        const uint32_t **parts = calloc(n, sizeof(*parts));
        for (uint32_t i = 0; i < n; i++) {
                index[i] = i;
                one[i] = 1;
                parts[i] = &L->shard_parts[L->shard_first[0] + i];
        }
        struct shmlink *l;
        CHECK(shmlink_create(cfg->name, 0, L->fingerprint, L->n_params, L->n_shards, n, &l, err, sizeof(err)) == 0, "%s",
              err);
        int32_t pid = 0;

        /* refused: a nonce that is not in the segment */
        uint8_t bad[SHMLINK_NONCE];
        memcpy(bad, shmlink_nonce(l), sizeof(bad));
        bad[3] ^= 0x40;
        uint32_t gen = shmlink_shard_open(l, 0);
        int r = ps_client_attach_shm(pc, 0, 0, shmlink_name(l), bad, gen, n, index, parts, one, &pid, err, sizeof(err));
        CHECK(r < 0 && strstr(err, "FAILED_PRECONDITION") && strstr(err, "nonce"), "wrong nonce: %d %s", r, err);
        printf("refused, wrong nonce: %s\n", err);
        /* refused: no such segment (as for a worker on another host) */
        char nowhere[64];
        snprintf(nowhere, sizeof(nowhere), "/proc/%d/fd/9999", (int)getpid());
        r = ps_client_attach_shm(pc, 0, 0, nowhere, shmlink_nonce(l), gen, n, index, parts, one, &pid, err, sizeof(err));
        CHECK(r < 0 && strstr(err, "FAILED_PRECONDITION") && strstr(err, "No such file"), "no segment: %d %s", r, err);
        printf("refused, no segment: %s\n", err);
        /* refused: a part given twice, a group the segment does not have */
        if (n > 1) {
                const uint32_t *twice[2] = {parts[0], parts[0]};
                r = ps_client_attach_shm(pc, 0, 0, shmlink_name(l), shmlink_nonce(l), gen, 2, index, twice, one, &pid, err,
                                         sizeof(err));
                CHECK(r == -EINVAL && strstr(err, "given twice"), "part twice: %d %s", r, err);
                printf("refused, part twice: %s\n", err);
        }
        uint32_t far = n + 7;
        r = ps_client_attach_shm(pc, 0, 0, shmlink_name(l), shmlink_nonce(l), gen, 1, &far, parts, one, &pid, err,
                                 sizeof(err));
        CHECK(r == -EINVAL && strstr(err, "no such group"), "group out of range: %d %s", r, err);
        printf("refused, group out of range: %s\n", err);

        /* attached */
        r = ps_client_attach_shm(pc, 0, 0, shmlink_name(l), shmlink_nonce(l), gen, n, index, parts, one, &pid, err,
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
