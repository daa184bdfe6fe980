/* The device string of a job ("auto", "cpu", "gpu:N", "gpu:N,M,..."), parsed in one place with one
 * limit: config.c validates device.device (and its override PSFLEET_DEVICE) with it, device.c selects
 * backends from its result. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GPUs one worker may list (one CUDA backend, one replica, per entry: a GPU listed twice runs two
 * replicas on it, which split its memory share). */
#define DEVICE_MAX_GPUS 16
/* Highest GPU ordinal a device string may name. */
#define DEVICE_MAX_ORDINAL 255

enum device_kind { DEVICE_AUTO, DEVICE_CPU, DEVICE_GPU };

struct device_spec {
        enum device_kind kind;
        uint32_t n_gpus;                 /* DEVICE_GPU: the listed ordinals, in order */
        int gpus[DEVICE_MAX_GPUS];
};

/* Parses s: ordinals 0..DEVICE_MAX_ORDINAL, at most DEVICE_MAX_GPUS of them (an ordinal may repeat:
 * several replicas on one GPU). Returns 0 and fills *ret, or -EINVAL with why s is wrong in why ("is not
 * auto, cpu, gpu:N or gpu:N,M,... (bad GPU index)", "lists more than 16 GPUs"), to follow the quoted
 * value. ret may be NULL. */
int device_spec_parse(const char *s, struct device_spec *ret, char *why, size_t whylen);

#ifdef __cplusplus
}
#endif
