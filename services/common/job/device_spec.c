/* The device string, parsed once (see device_spec.h). */
#include "device_spec.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

#define SYNTAX "is not auto, cpu, gpu:N or gpu:N,M,..."

int device_spec_parse(const char *s, struct device_spec *ret, char *why, size_t whylen)
{
        struct device_spec d = { .kind = DEVICE_AUTO };

        if (strcmp(s, "cpu") == 0)
                d.kind = DEVICE_CPU;
        else if (strcmp(s, "auto") != 0) {
                if (strncmp(s, "gpu:", 4) != 0) {
                        snprintf(why, whylen, SYNTAX);
                        return -EINVAL;
                }
                d.kind = DEVICE_GPU;
                for (const char *p = s + 4;;) {
                        size_t len = strcspn(p, ",");
                        char num[16];
                        uint64_t id;

                        if (len == 0 || len >= sizeof(num)) {
                                snprintf(why, whylen, SYNTAX " (bad GPU index)");
                                return -EINVAL;
                        }
                        memcpy(num, p, len);
                        num[len] = 0;
                        if (parse_u64(num, 0, DEVICE_MAX_ORDINAL, &id) < 0) {
                                snprintf(why, whylen, SYNTAX " (bad GPU index)");
                                return -EINVAL;
                        }
                        if (d.n_gpus == DEVICE_MAX_GPUS) {
                                snprintf(why, whylen, "lists more than %d GPUs", DEVICE_MAX_GPUS);
                                return -EINVAL;
                        }
                        d.gpus[d.n_gpus++] = (int)id;
                        if (!p[len])
                                break;
                        p += len + 1;
                }
        }
        if (ret)
                *ret = d;
        return 0;
}
