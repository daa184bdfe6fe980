/* Harness: TF_CONFIG (config_apply_tf_config) over a valid job: a refused value must leave the job as
 * it was (its canonical JSON unchanged), an accepted one must leave a job that canonicalizes; one
 * without "cluster" (none, or the training-operator's sparseCluster) must leave the job's cluster as it
 * was. */
#include <jansson.h>

#include "config.h"
#include "fuzz_util.h"
#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static struct job_config *base;
        static char *base_canon;
        char err[512];
        if (!base) {
                log_set_max_level(LOG_CRIT);
                char job[2048];
                snprintf(job, sizeof(job), FUZZ_JOB_FMT, "127.0.0.1:2", "127.0.0.1:3", "/nonexistent", "momentum", "");
                if (config_load_string(job, "fuzz.json", &base, err, sizeof(err)) < 0 ||
                    !(base_canon = config_canonical_json(base))) {
                        fprintf(stderr, "fuzz_tf_config: the base job does not load: %s\n", err);
                        abort();
                }
        }
        /* a fresh copy each time: an accepted TF_CONFIG changes it */
        struct job_config *c = NULL;
        char job[2048];
        snprintf(job, sizeof(job), FUZZ_JOB_FMT, "127.0.0.1:2", "127.0.0.1:3", "/nonexistent", "momentum", "");
        if (config_load_string(job, "fuzz.json", &c, err, sizeof(err)) < 0)
                abort();
        char *tf = fuzz_string(data, size);
        struct task t;
        bool have = false;
        int r = config_apply_tf_config(c, tf, &t, &have, err, sizeof(err));
        char *canon = config_canonical_json(c);
        FUZZ_CHECK(canon, "the job does not canonicalize after TF_CONFIG (%d)", r);
        json_t *root = json_loads(tf, JSON_DECODE_ANY, NULL);
        bool has_cluster = root && json_is_object(root) && json_object_get(root, "cluster");
        json_decref(root);
        if (r < 0)
                FUZZ_CHECK(strcmp(canon, base_canon) == 0, "a refused TF_CONFIG changed the job: %s", err);
        else if (!has_cluster)
                FUZZ_CHECK(strcmp(canon, base_canon) == 0, "a TF_CONFIG without a cluster changed the job");
        else if (have)
                FUZZ_CHECK(config_endpoint(c, t) != NULL, "TF_CONFIG's task is not in its cluster");
        free(canon);
        free(tf);
        config_free(c);
        return 0;
}
