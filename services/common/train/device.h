/* Device selection: which backend a worker computes on (CPU or CUDA GPUs), with TensorFlow's soft
 * placement for "auto", the GPU memory options, and per-node environment overrides. It is plain C and
 * includes no CUDA header: the CUDA backend (services/workerd/backend/, library psfleet_cuda) is
 * a plugin (libpsfleet-cuda.so) that device.c opens at run time; its backend_cuda_* entry points are
 * declared at the end, and programs reach them through the device_cuda_* functions, which open the
 * plugin on first use (no program links it).
 *
 * Environment overrides, read by every function below that takes a device_config (each one, when
 * set and not empty, replaces the job file's value for this node only; parsed through the config key
 * table, with the key's bounds: docs/configuration.md lists them):
 *   PSFLEET_DEVICE                 device.device: auto | cpu | gpu:N | gpu:N,M,...
 *   PSFLEET_GPU_MEMORY_FRACTION    device.gpu_memory_fraction: (0, 1]
 *   PSFLEET_ALLOW_GROWTH           device.allow_growth
 *   PSFLEET_LOG_DEVICE_PLACEMENT   device.log_device_placement
 *   PSFLEET_ALLOW_SOFT_PLACEMENT   device.allow_soft_placement: an explicit gpu request that cannot be
 *                                  met falls back to the CPU instead of failing
 *   PSFLEET_CUDA_TF32              device.cuda_tf32
 *   PSFLEET_TEST_FAKE_NO_GPU       test hook: behave as if no GPU were visible
 * CUDA_VISIBLE_DEVICES is honoured by CUDA itself: "gpu:N" counts among the visible GPUs.
 *
 * Not thread-safe (reads the environment); call from main() or the thread that builds the model. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "device_spec.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* device_backend_new's positive return: an "auto" (or soft-placed gpu) request is running on the CPU
 * because no usable GPU was found; msg says why. Log it once (notice level). */
#define DEVICE_FELL_BACK 1

/* The device options after environment overrides, parsed. */
struct device_request {
        enum device_kind kind;           /* parsed by device_spec_parse */
        uint32_t n_gpus;                 /* DEVICE_GPU: the listed ordinals, in order */
        int gpus[DEVICE_MAX_GPUS];
        double gpu_memory_fraction;      /* (0, 1] */
        bool allow_growth;
        bool log_device_placement;
        bool allow_soft_placement;
        bool cuda_tf32;
        bool fake_no_gpu;                /* PSFLEET_TEST_FAKE_NO_GPU */
};

/* Applies the environment overrides to dc and parses the result into *ret. Returns 0, or -EINVAL
 * with one line in msg naming the variable (or "device.device") and the bad value, or -ENOMEM. */
int device_request_resolve(const struct device_config *dc, struct device_request *ret, char *msg,
                           size_t msglen);

/* Builds the backend the options ask for. cpu_threads: OpenBLAS threads of the CPU backend.
 * Returns 0 with a one-line description of the choice in msg ("cuda gpu:0 (NVIDIA H200, cc 9.0,
 * 139.8 GiB), memory cap 69.9 GiB reserved up front" or "cpu, 2 threads"), DEVICE_FELL_BACK when
 * an auto request found no usable GPU and runs on the CPU (msg: why; log it once), or -errno with
 * the reason in msg: -EINVAL bad options, -ENODEV an explicit gpu request that cannot be met
 * (no CUDA compiled in, no GPU, no such ordinal), -ENOMEM the memory cap cannot be reserved,
 * -EOPNOTSUPP a list of several GPUs (see device_backends_new); another -errno when a CUDA library
 * fails to start on an explicit request. With "auto" and several GPUs it takes the first and says so.
 * *ret is written only on success; free it with backend_free(). */
int device_backend_new(const struct device_config *dc, unsigned cpu_threads, struct backend **ret,
                       char *msg, size_t msglen);

/* model_new with the device's memory checked up front: on a CUDA backend it first counts the
 * bytes the model will allocate and compares them with the backend's memory cap, then builds the
 * model and runs one forward and backward pass on zeros so that every workspace of a training step
 * (cuDNN's included) is allocated now, not mid-training; the step loop then allocates nothing.
 * The gradient block is left holding that pass's gradients (overwritten by the next backward).
 * On other backends it is model_new (the CPU backend's convolution workspace is then allocated at the
 * first pass). Returns 0, or -errno with one line in msg (for -ENOMEM on a GPU: how much the model
 * needs against the cap, and which option to change). */
int device_model_new(struct backend *be, const struct model_spec *spec, uint32_t max_batch,
                     struct model **ret, char *msg, size_t msglen);

/* true when device placement logging is on (job file or PSFLEET_LOG_DEVICE_PLACEMENT). */
bool device_log_placement(const struct device_config *dc);

/* Where each layer of m runs, for log_device_placement: one line per layer ("conv0 (conv2d 5x5x32):
 * cuda:0 cuDNN"), then the loss, '\n'-separated, NUL-terminated, truncated to len. Returns the
 * number of lines. */
int device_placement(const struct backend *be, const struct model *m, char *buf, size_t len);

/* device_backend_new for a list of GPUs ("gpu:0,1", or "auto" with several visible): one CUDA
 * backend per GPU, in the listed order, *n_ret of them (1 for cpu and for a single GPU), for the
 * replicas of replicas.h. device_backend_new itself refuses a list (-EOPNOTSUPP), so that nobody gets
 * one GPU of several by accident; with "auto" it takes the first GPU and says so. */
int device_backends_new(const struct device_config *dc, unsigned cpu_threads, struct backend **ret /* [DEVICE_MAX_GPUS] */,
                        uint32_t *n_ret, char *msg, size_t msglen);

/* ---- the CUDA backend's types; its entry points are the plugin's (backend_cuda.cu) ---- */

/* GPU memory left to the CUDA context, cuBLAS and cuDNN when a backend takes the whole card
 * (gpu_memory_fraction 1), and to each further replica's handles when a GPU is shared by replicas. */
#define DEVICE_GPU_HEADROOM ((size_t)512 << 20)

struct device_gpu_info {
        int ordinal;                     /* among the visible GPUs */
        char name[96];
        int cc_major, cc_minor;
        size_t total_bytes, free_bytes;
};

struct device_opts {
        uint32_t n_gpus;                 /* 1; several GPUs: see docs/gpu.md */
        int gpus[DEVICE_MAX_GPUS];
        double gpu_memory_fraction;      /* cap = fraction * total memory of each GPU */
        bool allow_growth;               /* false: reserve the cap up front (TF's default) */
        bool tf32;                       /* cuBLAS and cuDNN may use TF32 (device.cuda_tf32) */
};

struct device_mem_stats {
        size_t cap;                      /* bytes this backend may hold on its GPU */
        size_t reserved;                 /* bytes taken from the driver (cudaMalloc) */
        size_t in_use, peak;             /* bytes handed out now, and at most */
        uint64_t device_mallocs;         /* cudaMalloc calls so far */
        size_t last_failed;              /* bytes of the last allocation that did not fit, or 0 */
};

/* The plugin's entry points, defined in backend_cuda.cu and looked up by name in the plugin. */
int backend_cuda_probe(struct device_gpu_info *infos, uint32_t max, char *msg, size_t msglen);
int backend_cuda_new(const struct device_opts *o, struct backend **ret, char *msg, size_t msglen);
int backend_cuda_mem_stats(const struct backend *be, struct device_mem_stats *ret);
const char *backend_cuda_device_name(const struct backend *be);

/* The same, through the plugin, opened on first use (for tests and benches that drive a GPU's backend
 * directly; the daemons go through device_backend_new). Where the plugin cannot be opened,
 * device_cuda_probe and device_cuda_new return -ENOSYS with the reason in msg (which plugin was
 * looked for, or why it did not load), and device_cuda_mem_stats -EINVAL.
 * device_cuda_probe: fills up to max infos, returns how many GPUs are visible (0: none), or -errno with
 * the driver's reason in msg (no driver, driver too old, ...).
 * device_cuda_new: a CUDA backend on o->gpus[0]; 0, or -errno with the reason in msg.
 * device_cuda_mem_stats: the memory figures of a backend made by device_cuda_new; 0, or -EINVAL for
 * another backend. */
int device_cuda_probe(struct device_gpu_info *infos, uint32_t max, char *msg, size_t msglen);
int device_cuda_new(const struct device_opts *o, struct backend **ret, char *msg, size_t msglen);
int device_cuda_mem_stats(const struct backend *be, struct device_mem_stats *ret);

#ifdef __cplusplus
}
#endif
