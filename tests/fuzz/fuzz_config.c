/* Harness: the job file parser (config_load_string: JSON, every section's validation, defaults); a
 * job that loads must also canonicalize (what its fingerprint is made of). */
#include "config.h"
#include "fuzz_util.h"
#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static int quiet;
        if (!quiet++)
                log_set_max_level(LOG_CRIT);
        char *json = fuzz_string(data, size);
        struct job_config *c = NULL;
        char err[512];
        if (config_load_string(json, "fuzz.json", &c, err, sizeof(err)) == 0) {
                char *canon = config_canonical_json(c);
                FUZZ_CHECK(canon, "a loaded job does not canonicalize");
                free(canon);
        }
        config_free(c);
        free(json);
        return 0;
}
