/* Device selection with soft placement, the GPU memory check at model build, and placement logging.
 * See device.h; the decisions are explained in docs/gpu.md. No CUDA header here: the CUDA backend is
 * reached through the plugin libpsfleet-cuda.so, opened at run time (see cuda_load). */
#include "device.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "util.h"

/* The CUDA backend is a plugin, opened at run time: the same workerd runs on a node without CUDA's
 * libraries (on the CPU), and packages need no CUDA dependency. Its file name and its directory
 * relative to the program's come from CMake (services/workerd/backend/CMakeLists.txt), which names the
 * library it builds and installs: the one place the name is written. Looked for at
 * $PSFLEET_CUDA_PLUGIN (a path; empty: never), <exe>/PSFLEET_CUDA_PLUGIN_RELDIR/ (installed), the
 * build tree, then by name through the loader's path. */
#ifndef PSFLEET_CUDA_PLUGIN_FILE
#error "PSFLEET_CUDA_PLUGIN_FILE (the plugin's file name) comes from CMake"
#endif
#ifndef PSFLEET_CUDA_PLUGIN_RELDIR
#error "PSFLEET_CUDA_PLUGIN_RELDIR (the plugin's directory relative to the program's) comes from CMake"
#endif

static struct {
        pthread_once_t once;
        int (*probe)(struct device_gpu_info *, uint32_t, char *, size_t);
        int (*create)(const struct device_opts *, struct backend **, char *, size_t);
        int (*mem_stats)(const struct backend *, struct device_mem_stats *);
        const char *(*device_name)(const struct backend *);
        char why[600];
        char path[PATH_MAX + 64];       /* the plugin that was loaded */
} plugin = {.once = PTHREAD_ONCE_INIT};

static void *cuda_try(const char *path)
{
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
                const char *e = dlerror();
                snprintf(plugin.why, sizeof(plugin.why), "%.500s", e ? e : path);
        } else
                snprintf(plugin.path, sizeof(plugin.path), "%s", path);
        return h;
}

static void cuda_load(void)
{
        void *h = NULL;
        const char *env = config_env_value("PSFLEET_CUDA_PLUGIN");
        snprintf(plugin.why, sizeof(plugin.why), "no %s found", PSFLEET_CUDA_PLUGIN_FILE);
        if (env) {
                if (!*env) {
                        snprintf(plugin.why, sizeof(plugin.why), "PSFLEET_CUDA_PLUGIN is empty");
                        return;
                }
                h = cuda_try(env);
        } else {
                /* Installed next to the program first: an installed workerd must load the installed
                 * plugin even where the build tree it came from still exists. */
                char exe[PATH_MAX];
                ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
                if (n > 0) {
                        exe[n] = 0;
                        char *slash = strrchr(exe, '/');
                        if (slash) {
                                *slash = 0;
                                char path[PATH_MAX + 64], real[PATH_MAX];
                                snprintf(path, sizeof(path), "%s/%s/%s", exe, PSFLEET_CUDA_PLUGIN_RELDIR,
                                         PSFLEET_CUDA_PLUGIN_FILE);
                                if (realpath(path, real) && access(real, R_OK) == 0)
                                        h = cuda_try(real);
                        }
                }
#ifdef PSFLEET_CUDA_PLUGIN_BUILD
                if (!h && access(PSFLEET_CUDA_PLUGIN_BUILD, R_OK) == 0)
                        h = cuda_try(PSFLEET_CUDA_PLUGIN_BUILD);
#endif
                if (!h)
                        h = cuda_try(PSFLEET_CUDA_PLUGIN_FILE);
        }
        if (!h)
                return;
        plugin.probe = (int (*)(struct device_gpu_info *, uint32_t, char *, size_t))dlsym(h, "backend_cuda_probe");
        plugin.create = (int (*)(const struct device_opts *, struct backend **, char *, size_t))dlsym(h, "backend_cuda_new");
        plugin.mem_stats = (int (*)(const struct backend *, struct device_mem_stats *))dlsym(h, "backend_cuda_mem_stats");
        plugin.device_name = (const char *(*)(const struct backend *))dlsym(h, "backend_cuda_device_name");
        if (!plugin.probe || !plugin.create || !plugin.mem_stats || !plugin.device_name) {
                snprintf(plugin.why, sizeof(plugin.why), "the CUDA plugin lacks its entry points");
                plugin.probe = NULL;
                plugin.create = NULL;
                plugin.mem_stats = NULL;
                plugin.device_name = NULL;
        }
}

#define CUDA_FN(f) (pthread_once(&plugin.once, cuda_load), plugin.f)

int device_cuda_probe(struct device_gpu_info *infos, uint32_t max, char *msg, size_t msglen)
{
        if (!CUDA_FN(probe)) {
                snprintf(msg, msglen, "the CUDA backend is not available: %s", plugin.why);
                return -ENOSYS;
        }
        return plugin.probe(infos, max, msg, msglen);
}

int device_cuda_new(const struct device_opts *o, struct backend **ret, char *msg, size_t msglen)
{
        if (!CUDA_FN(create)) {
                snprintf(msg, msglen, "the CUDA backend is not available: %s", plugin.why);
                return -ENOSYS;
        }
        return plugin.create(o, ret, msg, msglen);
}

int device_cuda_mem_stats(const struct backend *be, struct device_mem_stats *ret)
{
        return CUDA_FN(mem_stats) ? plugin.mem_stats(be, ret) : -EINVAL;
}

/* Oldest GPU the CUDA backend's PTX can be compiled for (CUDA 13 supports sm_75 and newer). */
#define MIN_CC 75

/* ---- options ---- */

int device_request_resolve(const struct device_config *dc, struct device_request *ret, char *msg, size_t msglen)
{
        /* The overrides go through the key table (config_apply_env): the same types and bounds. */
        struct job_config tmp = { .device = *dc };
        char why[160];
        int r;
        tmp.device.device = strdup(dc->device ? dc->device : "auto");
        if (!tmp.device.device) {
                snprintf(msg, msglen, "out of memory");
                return -ENOMEM;
        }
        r = config_apply_env(&tmp, "device", msg, msglen);
        struct device_spec spec;
        if (r == 0 && device_spec_parse(tmp.device.device, &spec, why, sizeof(why)) < 0) {
                snprintf(msg, msglen, "device.device: \"%.100s\" %s", tmp.device.device, why);
                r = -EINVAL;
        }
        if (r == 0 && !(tmp.device.gpu_memory_fraction > 0.0 && tmp.device.gpu_memory_fraction <= 1.0)) {
                snprintf(msg, msglen, "device.gpu_memory_fraction: %g is not in (0, 1]", tmp.device.gpu_memory_fraction);
                r = -EINVAL;
        }
        bool fake = false;
        if (r == 0)
                r = config_env_bool("PSFLEET_TEST_FAKE_NO_GPU", &fake, msg, msglen);
        if (r == 0) {
                *ret = (struct device_request){
                        .kind = spec.kind,
                        .n_gpus = spec.n_gpus,
                        .gpu_memory_fraction = tmp.device.gpu_memory_fraction,
                        .allow_growth = tmp.device.allow_growth,
                        .log_device_placement = tmp.device.log_device_placement,
                        .allow_soft_placement = tmp.device.allow_soft_placement,
                        .cuda_tf32 = tmp.device.cuda_tf32,
                        .fake_no_gpu = fake,
                };
                memcpy(ret->gpus, spec.gpus, sizeof(spec.gpus));
        }
        free(tmp.device.device);
        return r;
}

bool device_log_placement(const struct device_config *dc)
{
        struct device_request req;
        char msg[256];
        return device_request_resolve(dc, &req, msg, sizeof(msg)) == 0 && req.log_device_placement;
}

/* ---- selection ---- */

static double gib(size_t b)
{
        return (double)b / (1024.0 * 1024.0 * 1024.0);
}

static double mib(size_t b)
{
        return (double)b / (1024.0 * 1024.0);
}

/* The usable GPUs: how many are visible (>= 0), with infos filled; or 0 with the reason in why. */
static int find_gpus(const struct device_request *req, struct device_gpu_info *infos, char *why, size_t whylen)
{
        if (req->fake_no_gpu) {
                snprintf(why, whylen, "PSFLEET_TEST_FAKE_NO_GPU is set");
                return 0;
        }
        if (!CUDA_FN(probe)) {
                snprintf(why, whylen, "the CUDA backend is not available: %.300s", plugin.why);
                return 0;
        }
        char m[256] = "";
        int n = CUDA_FN(probe)(infos, DEVICE_MAX_GPUS, m, sizeof(m));
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        /* The plugin's path, so that a node's log says which one loaded and found nothing. */
        if (n < 0) {
                snprintf(why, whylen, "%s; CUDA plugin %.200s", m[0] ? m : strerror(-n), plugin.path);
                return 0;
        }
        if (n == 0) {
                if (cvd)
                        snprintf(why, whylen, "no CUDA device is visible (CUDA_VISIBLE_DEVICES=\"%s\"); CUDA plugin %.200s", cvd,
                                 plugin.path);
                else
                        snprintf(why, whylen, "no CUDA device is visible; CUDA plugin %.200s", plugin.path);
        }
        return n < DEVICE_MAX_GPUS ? n : DEVICE_MAX_GPUS;
}

static int cpu_backend(unsigned threads, struct backend **ret, const char *why, char *msg, size_t msglen)
{
        int r = backend_cpu_new(threads, ret);
        if (r < 0) {
                snprintf(msg, msglen, "cannot start the CPU backend: %s", strerror(-r));
                return r;
        }
        if (why) {
                snprintf(msg, msglen, "%s; running on the CPU with %u BLAS thread%s", why, threads,
                         threads == 1 ? "" : "s");
                return DEVICE_FELL_BACK;
        }
        snprintf(msg, msglen, "cpu, %u BLAS thread%s", threads, threads == 1 ? "" : "s");
        return 0;
}

/* The memory share of replica i when its GPU is listed k times ("gpu:0,0"): the replicas split the
 * GPU's share evenly, fraction / k of it each. The whole card (fraction 1) becomes k equal shares of its
 * memory less a headroom for the context and one for each replica's handles (the probe does not open a
 * context to read what is free; a share that is not free is refused when the backend starts, with its
 * figures). Alone on its GPU: the fraction as asked. */
static double replica_share(const struct device_opts *o, const struct device_gpu_info *infos, uint32_t i)
{
        int g = o->gpus[i];
        uint32_t k = 0;
        for (uint32_t j = 0; j < o->n_gpus; j++)
                k += o->gpus[j] == g;
        if (k <= 1)
                return o->gpu_memory_fraction;
        if (o->gpu_memory_fraction < 1.0)
                return o->gpu_memory_fraction / k;
        size_t total = infos[g].total_bytes, keep = DEVICE_GPU_HEADROOM * (k + 2);
        return total > 2 * keep ? (double)(total - keep) / (double)total / k : 1.0 / (2.0 * k);
}

/* The backends the options ask for: the CPU, or one CUDA backend per GPU (several only if many). */
static int select_backends(const struct device_config *dc, unsigned cpu_threads, bool many, struct backend **ret,
                           uint32_t *n_ret, char *msg, size_t msglen)
{
        struct device_request req;
        int r = device_request_resolve(dc, &req, msg, msglen);
        if (r < 0)
                return r;
        *n_ret = 1; /* every CPU path below */
        if (req.kind == DEVICE_CPU)
                return cpu_backend(cpu_threads, ret, NULL, msg, msglen);

        struct device_gpu_info infos[DEVICE_MAX_GPUS];
        char why[400] = "", req_s[96] = "auto";
        int n = find_gpus(&req, infos, why, sizeof(why));
        struct device_opts o = {
                .gpu_memory_fraction = req.gpu_memory_fraction,
                .allow_growth = req.allow_growth,
                .tf32 = req.cuda_tf32,
        };
        if (req.kind == DEVICE_AUTO) {
                /* The visible GPUs that our PTX can run on, in order. */
                for (int i = 0; i < n && o.n_gpus < DEVICE_MAX_GPUS; i++)
                        if (infos[i].cc_major * 10 + infos[i].cc_minor >= MIN_CC)
                                o.gpus[o.n_gpus++] = i;
                if (o.n_gpus == 0 && n > 0)
                        snprintf(why, sizeof(why), "no visible GPU has compute capability %d.%d or newer (gpu:0 \"%s\" is %d.%d)",
                                 MIN_CC / 10, MIN_CC % 10, infos[0].name, infos[0].cc_major, infos[0].cc_minor);
                if (o.n_gpus == 0) {
                        char w[448];
                        snprintf(w, sizeof(w), "device auto: no usable GPU (%s)", why);
                        return cpu_backend(cpu_threads, ret, w, msg, msglen);
                }
        } else {
                size_t off = (size_t)snprintf(req_s, sizeof(req_s), "gpu:");
                const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
                char none[400];
                if (n == 0) { /* why says why there is none */
                        snprintf(none, sizeof(none), "no GPU is visible (%.360s)", why);
                        snprintf(why, sizeof(why), "%s", none);
                }
                for (uint32_t i = 0; i < req.n_gpus; i++) {
                        int g = req.gpus[i];
                        if (off < sizeof(req_s))
                                off += (size_t)snprintf(req_s + off, sizeof(req_s) - off, "%s%d", i ? "," : "", g);
                        if (why[0] == 0 && g >= n)
                                snprintf(why, sizeof(why), "GPU %d does not exist: %d GPU%s visible%s%s%s", g, n,
                                         n == 1 ? " is" : "s are", cvd ? " (CUDA_VISIBLE_DEVICES=\"" : "", cvd ? cvd : "",
                                         cvd ? "\")" : "");
                        else if (why[0] == 0 && infos[g].cc_major * 10 + infos[g].cc_minor < MIN_CC)
                                snprintf(why, sizeof(why), "GPU %d \"%s\" has compute capability %d.%d; psfleet needs %d.%d or newer",
                                         g, infos[g].name, infos[g].cc_major, infos[g].cc_minor, MIN_CC / 10, MIN_CC % 10);
                        o.gpus[o.n_gpus++] = g;
                }
                if (why[0]) {
                        char w[512];
                        snprintf(w, sizeof(w), "device \"%s\": %s", req_s, why);
                        if (req.allow_soft_placement)
                                return cpu_backend(cpu_threads, ret, w, msg, msglen);
                        snprintf(msg, msglen, "%s (set device.allow_soft_placement or PSFLEET_ALLOW_SOFT_PLACEMENT=1, or device \"auto\", to fall back to the CPU)", w);
                        return -ENODEV;
                }
        }

        /* One GPU per backend; several are replicas (replicas.h), which the caller must ask for. */
        char note[160] = "";
        if (o.n_gpus > 1 && !many) {
                if (req.kind == DEVICE_GPU) {
                        snprintf(msg, msglen, "device \"%s\" names several GPUs: this program runs one "
                                 "(device_backends_new and replicas_new run several; docs/gpu.md)", req_s);
                        return -EOPNOTSUPP;
                }
                snprintf(note, sizeof(note), "; %u GPUs visible, using gpu:%d only", o.n_gpus, o.gpus[0]);
                o.n_gpus = 1;
        }
        struct backend *bes[DEVICE_MAX_GPUS];
        uint32_t made = 0;
        for (; made < o.n_gpus; made++) {
                struct device_opts one = o;
                one.n_gpus = 1;
                one.gpus[0] = o.gpus[made];
                one.gpu_memory_fraction = replica_share(&o, infos, made);
                char m[320] = "";
                r = CUDA_FN(create)(&one, &bes[made], m, sizeof(m));
                if (r < 0) {
                        char w[480];
                        snprintf(w, sizeof(w), "device \"%s\": gpu:%d: %s", req.kind == DEVICE_AUTO ? "auto" : req_s,
                                 one.gpus[0], m[0] ? m : strerror(-r));
                        while (made > 0)
                                backend_free(bes[--made]);
                        /* A memory cap that cannot be had is a configuration problem, not a missing GPU. */
                        if (r != -ENOMEM && (req.kind == DEVICE_AUTO || req.allow_soft_placement)) {
                                *n_ret = 1;
                                return cpu_backend(cpu_threads, ret, w, msg, msglen);
                        }
                        snprintf(msg, msglen, "%s", w);
                        return r;
                }
        }
        const struct device_gpu_info *gi = &infos[o.gpus[0]];
        struct device_mem_stats st = { 0 };
        CUDA_FN(mem_stats)(bes[0], &st);
        char list[96] = "";
        for (uint32_t i = 0, off = 0; i < made && off < sizeof(list); i++)
                off += (uint32_t)snprintf(list + off, sizeof(list) - off, "%s%d", i ? "," : "", o.gpus[i]);
        snprintf(msg, msglen, "cuda gpu:%s (%s%s, cc %d.%d, %.1f GiB), memory cap %.1f GiB%s (fraction %.3g%s)%s", list,
                 made > 1 ? "each " : "", gi->name, gi->cc_major, gi->cc_minor, gib(gi->total_bytes), gib(st.cap),
                 made > 1 ? " each" : "", o.gpu_memory_fraction,
                 o.allow_growth ? ", allocated as needed" : ", reserved up front", note);
        for (uint32_t i = 0; i < made; i++)
                ret[i] = bes[i];
        *n_ret = made;
        return 0;
}

int device_backend_new(const struct device_config *dc, unsigned cpu_threads, struct backend **ret, char *msg,
                       size_t msglen)
{
        struct backend *bes[DEVICE_MAX_GPUS];
        uint32_t n = 0;
        int r = select_backends(dc, cpu_threads, false, bes, &n, msg, msglen);
        if (r >= 0)
                *ret = bes[0];
        return r;
}

int device_backends_new(const struct device_config *dc, unsigned cpu_threads, struct backend **ret, uint32_t *n_ret,
                        char *msg, size_t msglen)
{
        struct backend *bes[DEVICE_MAX_GPUS];
        uint32_t n = 0;
        int r = select_backends(dc, cpu_threads, true, bes, &n, msg, msglen);
        if (r < 0)
                return r;
        for (uint32_t i = 0; i < n; i++)
                ret[i] = bes[i];
        *n_ret = n;
        return r;
}

/* ---- the model on a device: count, check, build, warm up ---- */

/* A backend that only counts what model_new allocates: it hands out distinct fake addresses that are
 * never dereferenced (model_new does not touch buffers; no op is ever called on it). */
struct counter {
        struct backend be;
        struct backend_ops ops;
        size_t bytes, granule;
        uintptr_t next;
};

static void *count_alloc(struct backend *be, size_t bytes)
{
        struct counter *c = be->ctx;
        c->bytes += (bytes + c->granule - 1) / c->granule * c->granule;
        c->next += 64;
        return (void *)c->next;
}

static void count_buf_free(struct backend *be, void *buf)
{
}

static void count_free(struct backend *be)
{
}

/* (a graph exec copies its initial values and constants in: nothing to copy here) */
static int count_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
        return 0;
}

static int count_memset0(struct backend *be, void *dst, size_t bytes)
{
        return 0;
}

/* Bytes of device memory model_new will take on be (with the CUDA allocator's 512-byte rounding). */
static int count_model_bytes(const struct backend *be, const struct model_spec *spec, uint32_t max_batch,
                             size_t *ret)
{
        struct counter c = { .granule = 512, .next = 0x10000 };
        c.ops = (struct backend_ops){ .name = "count", .host_memory = be->ops->host_memory, .free = count_free,
                                      .alloc = count_alloc, .buf_free = count_buf_free, .upload = count_copy,
                                      .download = count_copy, .memset0 = count_memset0, .graph = be->ops->graph };
        c.be.ops = &c.ops;
        c.be.ctx = &c;
        struct model *m;
        int r = model_new(spec, &c.be, max_batch, &m);
        if (r < 0)
                return r;
        model_free(m);
        *ret = c.bytes;
        return 0;
}

int device_model_new(struct backend *be, const struct model_spec *spec, uint32_t max_batch, struct model **ret,
                     char *msg, size_t msglen)
{
        struct model *m = NULL;
        float *x = NULL;
        uint8_t *y = NULL;
        struct device_mem_stats st = { 0 };
        bool cuda = CUDA_FN(mem_stats) && CUDA_FN(mem_stats)(be, &st) == 0;
        size_t need = 0;
        int r;

        if (spec->graph && !backend_host_memory(be) && !be->ops->graph) {
                snprintf(msg, msglen, "cannot build the model: the %s backend computes no graph model (model.onnx); "
                         "the cpu backend does (device.device \"cpu\")", backend_name(be));
                return -EOPNOTSUPP;
        }
        if (backend_host_memory(be) || !cuda) {
                r = model_new(spec, be, max_batch, &m);
                if (r == -EOPNOTSUPP)
                        snprintf(msg, msglen, "cannot build the model: the %s backend does not compute model.head %s "
                                 "(the cpu backend does: device.device \"cpu\")", backend_name(be),
                                 spec->head == HEAD_LOGISTIC ? "logistic" : "mse");
                else if (r < 0)
                        snprintf(msg, msglen, "cannot build the model: %s", strerror(-r));
                else
                        *ret = m;
                return r;
        }
        if ((r = count_model_bytes(be, spec, max_batch, &need)) < 0) {
                snprintf(msg, msglen, "cannot build the model: %s", strerror(-r));
                return r;
        }
        const char *hint = "raise device.gpu_memory_fraction (or PSFLEET_GPU_MEMORY_FRACTION) or lower training.batch_size";
        if (need > st.cap) {
                snprintf(msg, msglen, "the model needs %.1f MiB of GPU memory at batch %u, more than the cap of %.1f MiB "
                         "(%.1f MiB already in use): %s", mib(need), max_batch, mib(st.cap), mib(st.in_use), hint);
                return -ENOMEM;
        }
        if ((r = model_new(spec, be, max_batch, &m)) == -EOPNOTSUPP) {
                snprintf(msg, msglen, "cannot build the model: the %s backend does not compute model.head %s (the "
                         "cpu backend does: device.device \"cpu\")", backend_name(be),
                         spec->head == HEAD_LOGISTIC ? "logistic" : "mse");
                return r;
        }
        if (r < 0) {
                if (r == -ENOMEM && CUDA_FN(mem_stats)(be, &st) == 0)
                        snprintf(msg, msglen, "the model needs %.1f MiB of GPU memory at batch %u and %.1f MiB of the cap of "
                                 "%.1f MiB could not be had: %s", mib(need), max_batch, mib(st.last_failed), mib(st.cap), hint);
                else
                        snprintf(msg, msglen, "cannot build the model: %s", strerror(-r));
                return r;
        }
        /* One pass at full batch allocates every workspace a training step needs. */
        uint32_t D = model_input_size(m);
        x = calloc((size_t)max_batch * D, sizeof(float));
        y = calloc(max_batch, 1);
        if (!x || !y) {
                r = -ENOMEM;
                snprintf(msg, msglen, "out of memory");
                goto fail;
        }
        float loss;
        if ((r = model_forward(m, x, y, max_batch, &loss, NULL)) < 0 || (r = model_backward(m, NULL, NULL)) < 0) {
                if (r == -ENOMEM && CUDA_FN(mem_stats)(be, &st) == 0)
                        snprintf(msg, msglen, "the model's buffers fit in the GPU memory cap of %.1f MiB (%.1f MiB) but a "
                                 "training step's workspaces do not (%.1f MiB more could not be had): %s",
                                 mib(st.cap), mib(need), mib(st.last_failed), hint);
                else
                        snprintf(msg, msglen, "first pass on the device: %s", strerror(-r));
                goto fail;
        }
        free(x);
        free(y);
        *ret = m;
        return 0;
fail:
        free(x);
        free(y);
        model_free(m);
        return r;
}

/* ---- placement ---- */

/* What computes each kind of layer on the CUDA backend (backend_cuda.cu). */
static const char *cuda_impl(const char *type)
{
        static const struct {
                const char *type, *impl;
        } t[] = {
                { "dense", "cuBLAS sgemm + bias kernel" },
                { "conv2d", "cuDNN convolution" },
                { "maxpool2d", "cuDNN pooling (backward: psfleet kernel)" },
                { "relu", "cuDNN activation" },
                { "tanh", "cuDNN activation" },
                { "sigmoid", "cuDNN activation" },
                { "flatten", "no computation" },
        };
        for (size_t i = 0; i < ELEMENTSOF(t); i++)
                if (strcmp(type, t[i].type) == 0)
                        return t[i].impl;
        return "?";
}

int device_placement(const struct backend *be, const struct model *m, char *buf, size_t len)
{
        char *desc = NULL;
        size_t dlen = 0;
        FILE *f = open_memstream(&desc, &dlen);
        if (!f || len == 0)
                return f ? (fclose(f), free(desc), 0) : 0;
        model_describe(m, f);
        fclose(f);
        const char *where = CUDA_FN(device_name) ? CUDA_FN(device_name)(be) : NULL;
        bool gpu = where != NULL;
        if (!gpu)
                where = backend_name(be);
        size_t off = 0;
        int lines = 0;
        buf[0] = 0;
        for (char *save = NULL, *line = strtok_r(desc, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                char type[32] = "";
                unsigned idx;
                const char *impl = NULL;
                if (sscanf(line, "%u %31s", &idx, type) == 2)
                        impl = gpu                             ? cuda_impl(type)
                               : strcmp(type, "dense") == 0  ? "OpenBLAS sgemm"
                               : strcmp(type, "conv2d") == 0 ? (model_runs_graph(m) ? "OpenBLAS sgemm over im2col, or a "
                                                                                      "direct convolution where faster"
                                                                                    : "OpenBLAS sgemm over im2col")
                                                             : "C loops";
                else if (strncmp(line, "graph of ", 9) == 0) /* a graph model: its ops, one line */
                        impl = gpu ? "psfleet CUDA graph kernels: cuBLAS + kernels of its own" : "graph kernels: OpenBLAS + C loops";
                else if (strncmp(line, "softmax", 7) == 0)
                        impl = gpu ? "cuDNN softmax + psfleet loss kernels" : "C loops";
                else
                        continue; /* the input line */
                if (off < len)
                        off += (size_t)snprintf(buf + off, len - off, "%s%s: %s (%s)", lines ? "\n" : "", line, where, impl);
                lines++;
        }
        free(desc);
        return lines;
}
