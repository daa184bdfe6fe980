/* Harness: the safetensors checkpoint loader as the chief restores from it (chief_ckpt_load: ckpt_read's
 * format checks, then the model's variables and the optimizer's slots). The input is the file; its
 * row records the input's own size and checksum, so the fuzzer reaches the parser and not only the
 * checksum. A refused checkpoint must leave the values and slots it was to fill as they were.
 * FUZZ_CKPT_SEED=DIR: write a valid checkpoint of the harness's job into DIR (the seed corpus). */
#include <errno.h>
#include <inttypes.h>

#include "chief_ckpt.h"
#include "chief_db.h"
#include "ckpt.h"
#include "crc32c.h"
#include "../lib/scratch.h"
#include "fuzz_util.h"
#include "log.h"

#define STEP 7

static struct chief_ckpt *store;
static struct job_layout *L;
static float *params, *slot_block, *slots[4];
static float *params_was, *slots_was;
static struct job_config *cfg;
static struct chief_db *db;

/* The store's directory: removed with all it holds when the harness ends. */
static char dir[64];

static void remove_dir(void) {
        rm_tree(dir);
}

static void setup(void) {
        char job[2048], err[512];
        log_set_max_level(LOG_CRIT);
        snprintf(job, sizeof(job), FUZZ_JOB_FMT, "127.0.0.1:2", "127.0.0.1:3", "/nonexistent", "momentum", "");
        char dbpath[96];
        if (config_load_string(job, "fuzz.json", &cfg, err, sizeof(err)) < 0 || job_layout_new(cfg, &L) < 0 ||
            scratch_make(dir, sizeof(dir), "fuzz-ckpt") < 0)
                abort();
        atexit(remove_dir);
        snprintf(dbpath, sizeof(dbpath), "%s/chief.db", dir);
        const char *seed = getenv("FUZZ_CKPT_SEED");
        struct chief_ckpt_config cc = {.dir = seed ? seed : dir, .L = L, .job = "fuzz", .fingerprint = L->fingerprint,
                                       .keep = 2, .keep_corrupt = 1};
        if (chief_db_open(dbpath, &db) < 0 || chief_ckpt_new(db, &cc, &store, err, sizeof(err)) < 0)
                abort();
        params = calloc(L->n_params, sizeof(float));
        params_was = calloc(L->n_params, sizeof(float));
        slot_block = calloc(L->n_params * (L->n_slots ? L->n_slots : 1), sizeof(float));
        slots_was = calloc(L->n_params * (L->n_slots ? L->n_slots : 1), sizeof(float));
        for (unsigned s = 0; s < L->n_slots; s++)
                slots[s] = slot_block + s * L->n_params;
        if (seed) {
                for (size_t i = 0; i < L->n_params; i++)
                        params[i] = (float)i / 8, slot_block[i] = -(float)i / 8;
                struct chief_db_checkpoint stats = {.loss = 0.5f, .eval_accuracy = -1, .eval_loss = -1}, row;
                snprintf(stats.trigger, sizeof(stats.trigger), "steps");
                if (chief_ckpt_save(store, params, slots, STEP, &stats, &row, err, sizeof(err)) < 0) {
                        fprintf(stderr, "%s\n", err);
                        abort();
                }
                printf("wrote %s\n", row.path);
                exit(0);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (!store)
                setup();
        char path[64], err[600];
        int fd = fuzz_memfd(data, size, path, sizeof(path));
        struct chief_db_checkpoint row = {.global_step = STEP, .bytes = size};
        snprintf(row.path, sizeof(row.path), "%s", path);
        ckpt_format_checksum(crc32c(data, size), row.checksum, sizeof(row.checksum));
        /* the state before: a pattern the file is unlikely to hold */
        size_t nsl = L->n_params * L->n_slots;
        for (size_t i = 0; i < L->n_params; i++)
                params[i] = params_was[i] = 1000.f + (float)i;
        for (size_t i = 0; i < nsl; i++)
                slot_block[i] = slots_was[i] = -1000.f - (float)i;
        bool loaded = false;
        int r = chief_ckpt_load(store, &row, params, slots, &loaded, err, sizeof(err));
        if (r < 0) {
                FUZZ_CHECK(memcmp(params, params_was, L->n_params * sizeof(float)) == 0,
                           "a refused checkpoint (%s) changed the variables", err);
                FUZZ_CHECK(nsl == 0 || memcmp(slot_block, slots_was, nsl * sizeof(float)) == 0,
                           "a refused checkpoint (%s) changed the optimizer's slots", err);
        } else if (!loaded) {
                FUZZ_CHECK(nsl == 0 || memcmp(slot_block, slots_was, nsl * sizeof(float)) == 0,
                           "a checkpoint without the job's slots changed them");
        }
        close(fd);
        return 0;
}
