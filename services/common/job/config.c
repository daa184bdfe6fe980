/* Job configuration: one JSON file per job, parsed and validated against one table of keys that also
 * produces --help and docs/configuration.md. */
#include "config.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"

#define CONFIG_MAX_FILE (16u << 20)
#define CONFIG_MAX_TASKS 4096
#define JOB_NAME_MAX 64

/* ---- the table of keys ---------------------------------------------------------------------- */

enum key_type {
        KT_U32,     /* JSON integer into uint32_t */
        KT_U64,     /* JSON integer into uint64_t */
        KT_DOUBLE,  /* JSON number into double */
        KT_BOOL,    /* JSON true/false into bool */
        KT_STRING,  /* non-empty JSON string into malloc'd char * */
        KT_ENUM,    /* JSON string, one of .choices, into an int-sized enum */
        KT_SPECIAL, /* parsed by hand (cluster lists, model shape and layers); in the table for docs */
};

struct config_key {
        const char *name;
        enum key_type type;
        size_t offset, size;          /* of the field in struct job_config */
        int64_t imin, imax, idef;     /* integers */
        double dmin, dmax, ddef;      /* numbers */
        bool dmin_open, dmax_open;    /* bounds excluded */
        const char *sdef;             /* strings, enums; bools: "true"/"false" */
        const char *const *choices;   /* enums, NULL-terminated; index = enum value */
        int (*check)(const char *s, char *why, size_t whylen); /* strings: extra syntax check */
        const char *type_doc, *default_doc, *range_doc; /* KT_SPECIAL */
        const char *doc;
};

#define FIELD(f) .offset = offsetof(struct job_config, f), .size = sizeof(((struct job_config *) 0)->f)
#define K_U32(n, f, d, lo, hi, text) \
        { .name = n, .type = KT_U32, FIELD(f), .idef = d, .imin = lo, .imax = hi, .doc = text }
#define K_U64(n, f, d, lo, hi, text) \
        { .name = n, .type = KT_U64, FIELD(f), .idef = d, .imin = lo, .imax = hi, .doc = text }
#define K_DBL(n, f, d, lo, lo_open, hi, hi_open, text) \
        { .name = n, .type = KT_DOUBLE, FIELD(f), .ddef = d, .dmin = lo, .dmin_open = lo_open, \
          .dmax = hi, .dmax_open = hi_open, .doc = text }
#define K_BOOL(n, f, d, text) { .name = n, .type = KT_BOOL, FIELD(f), .sdef = #d, .doc = text }
#define K_STR(n, f, d, text) { .name = n, .type = KT_STRING, FIELD(f), .sdef = d, .doc = text }
#define K_ENUM(n, f, d, ch, text) { .name = n, .type = KT_ENUM, FIELD(f), .sdef = d, .choices = ch, .doc = text }
#define K_SPECIAL(n, t, d, r, text) \
        { .name = n, .type = KT_SPECIAL, .type_doc = t, .default_doc = d, .range_doc = r, .doc = text }

static const char *const optimizer_names[] = { "sgd", "momentum", "adam", "adagrad", NULL };
static const char *const schedule_names[] = { "constant", "exponential", NULL };
static const char *const layer_names[] = {
        [LAYER_DENSE] = "dense", [LAYER_RELU] = "relu", [LAYER_TANH] = "tanh",
        [LAYER_SIGMOID] = "sigmoid", [LAYER_CONV2D] = "conv2d", [LAYER_MAXPOOL2D] = "maxpool2d",
        [LAYER_FLATTEN] = "flatten", NULL,
};
static const char *const init_names[] = {
        [INIT_DEFAULT] = "default", [INIT_GLOROT_UNIFORM] = "glorot_uniform",
        [INIT_HE_NORMAL] = "he_normal", [INIT_ZEROS] = "zeros", NULL,
};

static int check_device(const char *s, char *why, size_t whylen);

static const struct config_key keys[] = {
        K_SPECIAL("job", "string", "file name without .json", "[A-Za-z0-9_.-]+, at most 64 characters",
                  "Job name; it names the units (psfleet-psd@JOB:INDEX) and state directories."),
        K_SPECIAL("cluster.chief", "list of host:port", "required", "exactly 1 entry",
                  "The chief (chiefd). TensorFlow ClusterSpec shape; \"master\" is accepted for \"chief\"."),
        K_SPECIAL("cluster.ps", "list of host:port", "required", "1 or more entries",
                  "Parameter servers (psd), one per index."),
        K_SPECIAL("cluster.worker", "list of host:port", "required", "1 or more entries",
                  "Workers (workerd), one per index. An endpoint may appear only once in the cluster."),
        K_SPECIAL("model.input", "list of integers", "required", "[N] or [C, H, W], each 1..1048576",
                  "Shape of one example; [784] means (1, 1, 784)."),
        K_U64("model.seed", model.seed, 1, 0, INT64_MAX, "Seed of the variables' initializers."),
        K_SPECIAL("model.layers", "list of layers", "required", "1..64 layers, the last one dense",
                  "Layers in order; the last dense layer's units are the number of classes (softmax cross-entropy)."),
        K_SPECIAL("model.layers[].type", "string", "required",
                  "dense, relu, tanh, sigmoid, conv2d, maxpool2d, flatten",
                  "Layer kind. conv2d uses \"same\" padding and stride 1; dense needs a flat input (use flatten)."),
        K_SPECIAL("model.layers[].units", "integer", "required (dense)", "[1, 1048576]",
                  "dense: output features."),
        K_SPECIAL("model.layers[].filters", "integer", "required (conv2d)", "[1, 65536]",
                  "conv2d: output channels."),
        K_SPECIAL("model.layers[].kernel", "integer", "required (conv2d)", "[1, 64]",
                  "conv2d: kernel height = width."),
        K_SPECIAL("model.layers[].pool", "integer", "required (maxpool2d)", "[1, 64]",
                  "maxpool2d: window = stride."),
        K_SPECIAL("model.layers[].init", "string", "\"default\"", "default, glorot_uniform, he_normal, zeros",
                  "dense, conv2d: kernel initializer (default: he_normal before relu, else glorot_uniform); biases start at zero."),

        K_STR("data.dir", data.dir, "/usr/share/datasets/fashion-mnist",
              "Directory of the IDX files (Debian's dataset-fashion-mnist)."),
        K_STR("data.train_images", data.train_images, "train-images-idx3-ubyte.gz", "Training images, in data.dir."),
        K_STR("data.train_labels", data.train_labels, "train-labels-idx1-ubyte.gz", "Training labels, in data.dir."),
        K_STR("data.test_images", data.test_images, "t10k-images-idx3-ubyte.gz", "Test images, in data.dir."),
        K_STR("data.test_labels", data.test_labels, "t10k-labels-idx1-ubyte.gz", "Test labels, in data.dir."),

        K_U32("training.batch_size", training.batch_size, 64, 1, 65536, "Examples per step per worker."),
        K_ENUM("training.optimizer", training.optimizer, "momentum", optimizer_names, "Optimizer applied on the ps."),
        K_DBL("training.learning_rate", training.learning_rate, 0.01, 0, true, 10, false, "Initial learning rate."),
        K_DBL("training.momentum", training.momentum, 0.9, 0, false, 1, true, "momentum: momentum coefficient."),
        K_BOOL("training.nesterov", training.nesterov, false, "momentum: use Nesterov momentum."),
        K_DBL("training.beta1", training.beta1, 0.9, 0, false, 1, true, "adam: decay of the first moment."),
        K_DBL("training.beta2", training.beta2, 0.999, 0, false, 1, true, "adam: decay of the second moment."),
        K_DBL("training.epsilon", training.epsilon, 1e-7, 0, true, 1, false, "adam, adagrad: added to the denominator."),
        K_DBL("training.initial_accumulator", training.initial_accumulator, 0.1, 0, true, 1000, false,
              "adagrad: initial value of the accumulators."),
        K_ENUM("training.lr_schedule", training.lr_schedule, "constant", schedule_names,
               "exponential: lr * lr_decay_rate ^ (global_step / lr_decay_steps)."),
        K_DBL("training.lr_decay_rate", training.lr_decay_rate, 0.96, 0, true, 1, false, "exponential: decay rate."),
        K_U64("training.lr_decay_steps", training.lr_decay_steps, 1000, 1, INT64_MAX, "exponential: decay steps."),
        K_BOOL("training.lr_staircase", training.lr_staircase, false,
               "exponential: decay in whole steps (integer division)."),
        K_U64("training.max_steps", training.max_steps, 1000, 1, 1000000000000, "Training stops when global_step reaches this."),
        K_U32("training.report_every_steps", training.report_every_steps, 50, 1, 1000000,
              "Workers report loss and throughput to the chief every this many local steps."),
        K_U32("training.threads", training.threads, 1, 1, 256, "CPU threads per process: BLAS threads in workerd, server threads in psd."),
        K_U64("training.seed", training.seed, 1, 0, INT64_MAX, "Seed of data shuffling."),

        K_STR("supervisor.checkpoint_dir", supervisor.checkpoint_dir, "checkpoints",
              "Where chiefd writes checkpoints; a relative path is under STATE_DIR/JOB/."),
        K_STR("supervisor.summary_dir", supervisor.summary_dir, "summaries",
              "Where chiefd writes TensorBoard summaries; a relative path is under STATE_DIR/JOB/."),
        K_U64("supervisor.save_checkpoint_steps", supervisor.save_checkpoint_steps, 0, 0, INT64_MAX,
              "Save a checkpoint every this many global steps; 0: off."),
        K_U64("supervisor.save_checkpoint_secs", supervisor.save_checkpoint_secs, 600, 0, 31536000,
              "Save a checkpoint every this many seconds; 0: off."),
        K_U32("supervisor.keep_checkpoints", supervisor.keep_checkpoints, 5, 1, 1000,
              "How many recent checkpoints to keep."),
        K_U64("supervisor.save_summaries_secs", supervisor.save_summaries_secs, 10, 0, 31536000,
              "Write summaries every this many seconds; 0: off."),
        K_U64("supervisor.eval_every_steps", supervisor.eval_every_steps, 0, 0, INT64_MAX,
              "Evaluate on the test set every this many global steps; 0: only at the end."),
        K_U64("supervisor.ready_timeout_secs", supervisor.ready_timeout_secs, 600, 1, 86400,
              "How long a worker waits for the job to become ready before failing."),

        K_U64("ps.split_bytes", ps.split_bytes, 262144, 4096, INT64_MAX,
              "Variables larger than this are split into row ranges: spread over the ps shards, and pushed a block at a time so transfer overlaps compute."),

        K_U64("rpc.deadline_ms", rpc.deadline_ms, 30000, 1, 3600000, "Deadline of each RPC, in milliseconds."),
        K_BOOL("rpc.shared_memory", rpc.shared_memory, true,
               "A workerd and a psd on the same host move tensors through shared memory instead of loopback "
               "gRPC (every other call stays gRPC). Each node decides for itself."),

        { .name = "device.device", .type = KT_STRING, FIELD(device.device), .sdef = "auto",
          .check = check_device, .doc = "Where workers compute: auto, cpu, gpu:N or gpu:N,M,..." },
        K_DBL("device.gpu_memory_fraction", device.gpu_memory_fraction, 1.0, 0, true, 1, false,
              "Share of each GPU's memory this job may use."),
        K_BOOL("device.allow_growth", device.allow_growth, false,
               "Allocate GPU memory as needed instead of all at start."),
        K_BOOL("device.log_device_placement", device.log_device_placement, false,
               "Log which device runs each layer."),
};

static const char *const sections[] = { "cluster", "model", "data", "training", "supervisor", "ps", "rpc", "device" };

/* ---- errors --------------------------------------------------------------------------------- */

struct ctx {
        const char *origin;
        char *err;
        size_t errlen;
};

/* Writes "origin: key: message" (key may be NULL) and returns -EINVAL. */
__attribute__((format(printf, 3, 4)))
static int failf(const struct ctx *x, const char *key, const char *fmt, ...) {
        char msg[768];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        if (x->err && x->errlen > 0) {
                if (key)
                        snprintf(x->err, x->errlen, "%s: %s: %s", x->origin, key, msg);
                else
                        snprintf(x->err, x->errlen, "%s: %s", x->origin, msg);
        }
        return -EINVAL;
}

static int fail_oom(const struct ctx *x) {
        if (x->err && x->errlen > 0)
                snprintf(x->err, x->errlen, "%s: out of memory", x->origin);
        return -ENOMEM;
}

/* Shortest "%g" that reads back as the same double, with ".0" when it would look like an integer. */
static void fmt_double(double d, char *buf, size_t len) {
        snprintf(buf, len, "%.15g", d);
        if (strtod(buf, NULL) != d)
                snprintf(buf, len, "%.17g", d);
        if (!strpbrk(buf, ".eEn") && strlen(buf) + 3 <= len)
                strcat(buf, ".0");
}

/* A JSON value as it appears in the file, for messages: strings quoted and escaped, long values cut. */
static const char *quote_json(const json_t *v, char *buf, size_t len) {
        size_t n = json_dumpb(v, buf, len - 1, JSON_ENCODE_ANY | JSON_COMPACT);

        if (n == 0)
                snprintf(buf, len, "?");
        else if (n > len - 1) {
                /* json_dumpb leaves buf undefined when it is too small. */
                char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
                snprintf(buf, len, "%s", s ? s : "?");
                if (len > 4)
                        strcpy(buf + len - 4, "...");
                free(s);
        } else
                buf[n] = 0;
        return buf;
}

static const char *quote_str(const char *s, char *buf, size_t len) {
        json_t *v = json_string(s);
        if (!v) {
                snprintf(buf, len, "\"%s\"", s);
                return buf;
        }
        quote_json(v, buf, len);
        json_decref(v);
        return buf;
}

/* "string \"x\"", "number 1.5", "boolean true", "array", ... */
static const char *describe(const json_t *v, char *buf, size_t len) {
        char q[128];

        switch (json_typeof(v)) {
        case JSON_STRING:
                snprintf(buf, len, "string %s", quote_json(v, q, sizeof(q)));
                break;
        case JSON_INTEGER:
                snprintf(buf, len, "integer %" JSON_INTEGER_FORMAT, json_integer_value(v));
                break;
        case JSON_REAL:
                fmt_double(json_real_value(v), q, sizeof(q));
                snprintf(buf, len, "number %s", q);
                break;
        case JSON_TRUE:
                snprintf(buf, len, "boolean true");
                break;
        case JSON_FALSE:
                snprintf(buf, len, "boolean false");
                break;
        case JSON_NULL:
                snprintf(buf, len, "null");
                break;
        case JSON_ARRAY:
                snprintf(buf, len, "array");
                break;
        case JSON_OBJECT:
                snprintf(buf, len, "object");
                break;
        }
        return buf;
}

static int fail_type(const struct ctx *x, const char *key, const char *expected, const json_t *v) {
        char d[160];
        return failf(x, key, "expected %s, got %s", expected, describe(v, d, sizeof(d)));
}

static void join_choices(const char *const *choices, char *buf, size_t len) {
        size_t n = 0;

        buf[0] = 0;
        for (size_t i = 0; choices[i] && n < len; i++)
                n += (size_t) snprintf(buf + n, len - n, "%s%s", i ? ", " : "", choices[i]);
}

static int lookup_choice(const char *const *choices, const char *s) {
        for (int i = 0; choices[i]; i++)
                if (strcmp(choices[i], s) == 0)
                        return i;
        return -1;
}

/* ---- generic keys --------------------------------------------------------------------------- */

static const struct config_key *find_key(const char *name) {
        for (size_t i = 0; i < ELEMENTSOF(keys); i++)
                if (strcmp(keys[i].name, name) == 0)
                        return &keys[i];
        return NULL;
}

static void *field(struct job_config *c, const struct config_key *k) {
        return (char *) c + k->offset;
}

static void set_int(struct job_config *c, const struct config_key *k, int64_t v) {
        if (k->type == KT_U32) {
                uint32_t u = (uint32_t) v;
                assert(k->size == sizeof(u));
                memcpy(field(c, k), &u, sizeof(u));
        } else {
                uint64_t u = (uint64_t) v;
                assert(k->size == sizeof(u));
                memcpy(field(c, k), &u, sizeof(u));
        }
}

static int set_string(struct job_config *c, const struct config_key *k, const char *s) {
        char **p = field(c, k), *d;

        assert(k->size == sizeof(char *));
        d = strdup(s);
        if (!d)
                return -ENOMEM;
        free(*p);
        *p = d;
        return 0;
}

static int set_enum(struct job_config *c, const struct config_key *k, int v) {
        assert(k->size == sizeof(int));
        memcpy(field(c, k), &v, sizeof(v));
        return 0;
}

static int apply_defaults(struct job_config *c) {
        for (size_t i = 0; i < ELEMENTSOF(keys); i++) {
                const struct config_key *k = &keys[i];

                switch (k->type) {
                case KT_U32:
                case KT_U64:
                        set_int(c, k, k->idef);
                        break;
                case KT_DOUBLE:
                        assert(k->size == sizeof(double));
                        memcpy(field(c, k), &k->ddef, sizeof(double));
                        break;
                case KT_BOOL:
                        assert(k->size == sizeof(bool));
                        *(bool *) field(c, k) = strcmp(k->sdef, "true") == 0;
                        break;
                case KT_STRING:
                        if (set_string(c, k, k->sdef) < 0)
                                return -ENOMEM;
                        break;
                case KT_ENUM:
                        set_enum(c, k, lookup_choice(k->choices, k->sdef));
                        break;
                case KT_SPECIAL:
                        break;
                }
        }
        return 0;
}

static void fmt_range(const struct config_key *k, char *buf, size_t len) {
        char lo[64], hi[64];

        if (k->type == KT_DOUBLE) {
                snprintf(lo, sizeof(lo), "%g", k->dmin);
                snprintf(hi, sizeof(hi), "%g", k->dmax);
                snprintf(buf, len, "%c%s, %s%c", k->dmin_open ? '(' : '[', lo, hi, k->dmax_open ? ')' : ']');
        } else
                snprintf(buf, len, "[%" PRId64 ", %" PRId64 "]", k->imin, k->imax);
}

static int parse_key(const struct ctx *x, struct job_config *c, const struct config_key *k, const json_t *v) {
        char range[96], q[160];

        switch (k->type) {
        case KT_U32:
        case KT_U64: {
                json_int_t i;

                if (!json_is_integer(v))
                        return fail_type(x, k->name, "an integer", v);
                i = json_integer_value(v);
                if (i < k->imin || i > k->imax) {
                        fmt_range(k, range, sizeof(range));
                        return failf(x, k->name, "%" JSON_INTEGER_FORMAT " is out of range %s", i, range);
                }
                set_int(c, k, i);
                return 0;
        }
        case KT_DOUBLE: {
                double d;

                if (!json_is_number(v))
                        return fail_type(x, k->name, "a number", v);
                d = json_number_value(v);
                if (d < k->dmin || (k->dmin_open && d == k->dmin) || d > k->dmax || (k->dmax_open && d == k->dmax)) {
                        fmt_range(k, range, sizeof(range));
                        if (json_is_integer(v))
                                snprintf(q, sizeof(q), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
                        else
                                fmt_double(d, q, sizeof(q));
                        return failf(x, k->name, "%s is out of range %s", q, range);
                }
                memcpy(field(c, k), &d, sizeof(d));
                return 0;
        }
        case KT_BOOL:
                if (!json_is_boolean(v))
                        return fail_type(x, k->name, "a boolean (true or false)", v);
                *(bool *) field(c, k) = json_is_true(v);
                return 0;
        case KT_STRING: {
                const char *s;
                char why[160];

                if (!json_is_string(v))
                        return fail_type(x, k->name, "a string", v);
                s = json_string_value(v);
                if (!*s)
                        return failf(x, k->name, "must not be empty");
                if (k->check && k->check(s, why, sizeof(why)) < 0)
                        return failf(x, k->name, "%s %s", quote_json(v, q, sizeof(q)), why);
                if (set_string(c, k, s) < 0)
                        return fail_oom(x);
                return 0;
        }
        case KT_ENUM: {
                char list[256];
                int i;

                if (!json_is_string(v))
                        return fail_type(x, k->name, "a string", v);
                i = lookup_choice(k->choices, json_string_value(v));
                if (i < 0) {
                        join_choices(k->choices, list, sizeof(list));
                        return failf(x, k->name, "%s is not one of %s", quote_json(v, q, sizeof(q)), list);
                }
                return set_enum(c, k, i);
        }
        case KT_SPECIAL:
                break;
        }
        assert(!"parse_key on a special key");
        return -EINVAL;
}

/* Parses a section object whose keys are all in the table. Keys listed in `special` are skipped
 * (the caller parses them). */
static int parse_section(const struct ctx *x, struct job_config *c, const char *section, const json_t *obj) {
        const char *name;
        json_t *v;
        char key[160];
        int r;

        if (!json_is_object(obj))
                return fail_type(x, section, "an object", obj);
        json_object_foreach((json_t *) obj, name, v) {
                const struct config_key *k;

                snprintf(key, sizeof(key), "%s.%s", section, name);
                k = find_key(key);
                if (!k || (k->type == KT_SPECIAL && strchr(k->name, '[')))
                        return failf(x, key, "unknown key");
                if (k->type == KT_SPECIAL)
                        continue;
                r = parse_key(x, c, k, v);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* ---- device string -------------------------------------------------------------------------- */

static int check_device(const char *s, char *why, size_t whylen) {
        static const char *const syntax = "is not auto, cpu, gpu:N or gpu:N,M,...";
        bool seen[256] = { false };
        const char *p;

        if (strcmp(s, "auto") == 0 || strcmp(s, "cpu") == 0)
                return 0;
        if (strncmp(s, "gpu:", 4) != 0) {
                snprintf(why, whylen, "%s", syntax);
                return -EINVAL;
        }
        p = s + 4;
        for (;;) {
                const char *e = p;
                char num[16];
                uint64_t id;

                while (*e && *e != ',')
                        e++;
                if (e == p || (size_t) (e - p) >= sizeof(num)) {
                        snprintf(why, whylen, "%s (bad GPU index)", syntax);
                        return -EINVAL;
                }
                memcpy(num, p, (size_t) (e - p));
                num[e - p] = 0;
                if (parse_u64(num, 0, 255, &id) < 0) {
                        snprintf(why, whylen, "%s (bad GPU index)", syntax);
                        return -EINVAL;
                }
                if (seen[id]) {
                        snprintf(why, whylen, "lists GPU %" PRIu64 " twice", id);
                        return -EINVAL;
                }
                seen[id] = true;
                if (!*e)
                        return 0;
                p = e + 1;
        }
}

/* ---- cluster -------------------------------------------------------------------------------- */

static void cluster_clear(struct cluster *cl) {
        struct endpoint *lists[] = { cl->chief, cl->ps, cl->worker };
        uint32_t counts[] = { cl->n_chief, cl->n_ps, cl->n_worker };

        for (size_t l = 0; l < 3; l++) {
                for (uint32_t i = 0; i < counts[l]; i++)
                        free(lists[l][i].addr);
                free(lists[l]);
        }
        memset(cl, 0, sizeof(*cl));
}

static bool host_char_ok(char ch) {
        return isalnum((unsigned char) ch) || ch == '.' || ch == '-' || ch == '_';
}

/* Splits "host:port", "[v6]:port". On failure writes the reason and returns -EINVAL. */
static int parse_hostport(const char *s, struct endpoint *ep, char *why, size_t whylen) {
        const char *host, *colon;
        size_t hlen;
        uint64_t port;
        int r;

        if (s[0] == '[') {
                const char *close = strchr(s, ']');
                char buf[64];
                struct in6_addr a6;

                if (!close) {
                        snprintf(why, whylen, "missing ']'");
                        return -EINVAL;
                }
                host = s + 1;
                hlen = (size_t) (close - host);
                if (hlen == 0) {
                        snprintf(why, whylen, "empty host");
                        return -EINVAL;
                }
                if (hlen >= sizeof(buf)) {
                        snprintf(why, whylen, "bad IPv6 address");
                        return -EINVAL;
                }
                memcpy(buf, host, hlen);
                buf[hlen] = 0;
                if (inet_pton(AF_INET6, buf, &a6) != 1) {
                        snprintf(why, whylen, "bad IPv6 address");
                        return -EINVAL;
                }
                if (close[1] != ':') {
                        snprintf(why, whylen, close[1] ? "unexpected text after ']'" : "missing port");
                        return -EINVAL;
                }
                colon = close + 1;
        } else {
                colon = strrchr(s, ':');
                if (!colon) {
                        snprintf(why, whylen, "missing port");
                        return -EINVAL;
                }
                host = s;
                hlen = (size_t) (colon - s);
                if (hlen == 0) {
                        snprintf(why, whylen, "empty host");
                        return -EINVAL;
                }
                for (size_t i = 0; i < hlen; i++) {
                        if (host[i] == ':') {
                                snprintf(why, whylen, "an IPv6 address must be in brackets");
                                return -EINVAL;
                        }
                        if (!host_char_ok(host[i])) {
                                snprintf(why, whylen, "bad character in host");
                                return -EINVAL;
                        }
                }
        }
        if (hlen >= sizeof(ep->host)) {
                snprintf(why, whylen, "host longer than %zu characters", sizeof(ep->host) - 1);
                return -EINVAL;
        }
        if (!colon[1]) {
                snprintf(why, whylen, "missing port");
                return -EINVAL;
        }
        r = parse_u64(colon + 1, 1, 65535, &port);
        if (r == -EINVAL) {
                snprintf(why, whylen, "port is not a number");
                return r;
        }
        if (r < 0) {
                snprintf(why, whylen, "port out of range [1, 65535]");
                return r;
        }
        memcpy(ep->host, host, hlen);
        ep->host[hlen] = 0;
        ep->port = (uint16_t) port;
        return 0;
}

static const char *const cluster_keys[] = { "chief", "ps", "worker", NULL };

static struct endpoint **cluster_list(struct cluster *cl, int role, uint32_t **n) {
        switch (role) {
        case ROLE_CHIEF: *n = &cl->n_chief; return &cl->chief;
        case ROLE_PS: *n = &cl->n_ps; return &cl->ps;
        default: *n = &cl->n_worker; return &cl->worker;
        }
}

static int parse_cluster(const struct ctx *x, const json_t *obj, struct cluster *ret) {
        struct cluster cl = { 0 };
        const char *name, *listname[3] = { "chief", "ps", "worker" };
        const json_t *lists[3] = { NULL, NULL, NULL };
        json_t *v;
        char key[96], why[128], q[300], d[160];
        int r;

        if (!json_is_object(obj))
                return fail_type(x, "cluster", "an object", obj);
        json_object_foreach((json_t *) obj, name, v) {
                if (strcmp(name, "master") == 0) {
                        if (json_object_get(obj, "chief"))
                                return failf(x, "cluster.master", "conflicts with cluster.chief (they are the same task)");
                        lists[ROLE_CHIEF] = v;
                        listname[ROLE_CHIEF] = "master";
                        continue;
                }
                int i = lookup_choice(cluster_keys, name);
                if (i < 0) {
                        snprintf(key, sizeof(key), "cluster.%s", name);
                        return failf(x, key, "unknown key");
                }
                lists[i] = v;
        }

        for (int role = 0; role < 3; role++) {
                const json_t *a = lists[role];
                struct endpoint **eps;
                uint32_t *n;
                size_t len;

                snprintf(key, sizeof(key), "cluster.%s", listname[role]);
                if (!a) {
                        r = failf(x, key, "missing");
                        goto fail;
                }
                if (!json_is_array(a)) {
                        r = fail_type(x, key, "an array of \"host:port\" strings", a);
                        goto fail;
                }
                len = json_array_size(a);
                if (len == 0) {
                        r = failf(x, key, "must not be empty");
                        goto fail;
                }
                if (role == ROLE_CHIEF && len != 1) {
                        r = failf(x, key, "must have exactly 1 entry, has %zu", len);
                        goto fail;
                }
                if (len > CONFIG_MAX_TASKS) {
                        r = failf(x, key, "has %zu entries, at most %d", len, CONFIG_MAX_TASKS);
                        goto fail;
                }
                eps = cluster_list(&cl, role, &n);
                *eps = calloc(len, sizeof(struct endpoint));
                if (!*eps) {
                        r = fail_oom(x);
                        goto fail;
                }
                for (size_t i = 0; i < len; i++) {
                        const json_t *e = json_array_get(a, i);
                        struct endpoint *ep = &(*eps)[i];

                        snprintf(key, sizeof(key), "cluster.%s[%zu]", listname[role], i);
                        if (!json_is_string(e)) {
                                r = failf(x, key, "expected a \"host:port\" string, got %s", describe(e, d, sizeof(d)));
                                goto fail;
                        }
                        if (parse_hostport(json_string_value(e), ep, why, sizeof(why)) < 0) {
                                r = failf(x, key, "%s is not host:port (%s)", quote_json(e, q, sizeof(q)), why);
                                goto fail;
                        }
                        ep->addr = strdup(json_string_value(e));
                        if (!ep->addr) {
                                r = fail_oom(x);
                                goto fail;
                        }
                        (*n)++;
                        /* An endpoint twice would make two daemons fight over one port. */
                        for (int pr = 0; pr <= role; pr++) {
                                struct endpoint *other;
                                uint32_t *on;

                                other = *cluster_list(&cl, pr, &on);
                                for (uint32_t j = 0; j < *on; j++) {
                                        if (&other[j] == ep)
                                                break;
                                        if (other[j].port == ep->port && strcasecmp(other[j].host, ep->host) == 0) {
                                                r = failf(x, key, "%s duplicates cluster.%s[%" PRIu32 "]",
                                                          quote_json(e, q, sizeof(q)), listname[pr], j);
                                                goto fail;
                                        }
                                }
                        }
                }
        }
        *ret = cl;
        return 0;
fail:
        cluster_clear(&cl);
        return r;
}

/* ---- model ---------------------------------------------------------------------------------- */

#define BIT(t) (1u << (t))

static const struct layer_key {
        const char *name;
        unsigned types;         /* bit per enum layer_type that takes this key */
        int64_t min, max;       /* integers */
        size_t offset;          /* in struct layer_spec */
} layer_keys[] = {
        { "units", BIT(LAYER_DENSE), 1, 1048576, offsetof(struct layer_spec, units) },
        { "filters", BIT(LAYER_CONV2D), 1, 65536, offsetof(struct layer_spec, filters) },
        { "kernel", BIT(LAYER_CONV2D), 1, 64, offsetof(struct layer_spec, kernel) },
        { "pool", BIT(LAYER_MAXPOOL2D), 1, 64, offsetof(struct layer_spec, pool) },
        { "init", BIT(LAYER_DENSE) | BIT(LAYER_CONV2D), 0, 0, offsetof(struct layer_spec, init) },
};

/* Shape of the activations flowing between layers: (C, H, W). Flat means (1, 1, N). */
struct shape {
        uint64_t c, h, w;
};

static int parse_layer(const struct ctx *x, size_t idx, const json_t *obj, struct layer_spec *l, struct shape *s) {
        char key[96], q[160], list[160];
        const json_t *t, *v;
        const char *name;
        int type;

        snprintf(key, sizeof(key), "model.layers[%zu]", idx);
        if (!json_is_object(obj))
                return fail_type(x, key, "an object", obj);
        t = json_object_get(obj, "type");
        snprintf(key, sizeof(key), "model.layers[%zu].type", idx);
        if (!t)
                return failf(x, key, "missing");
        if (!json_is_string(t))
                return fail_type(x, key, "a string", t);
        type = lookup_choice(layer_names, json_string_value(t));
        if (type < 0) {
                join_choices(layer_names, list, sizeof(list));
                return failf(x, key, "%s is not one of %s", quote_json(t, q, sizeof(q)), list);
        }
        memset(l, 0, sizeof(*l));
        l->type = (enum layer_type) type;
        l->init = INIT_DEFAULT;

        json_object_foreach((json_t *) obj, name, v) {
                const struct layer_key *lk = NULL;

                if (strcmp(name, "type") == 0)
                        continue;
                snprintf(key, sizeof(key), "model.layers[%zu].%s", idx, name);
                for (size_t i = 0; i < ELEMENTSOF(layer_keys); i++)
                        if (strcmp(layer_keys[i].name, name) == 0)
                                lk = &layer_keys[i];
                if (!lk)
                        return failf(x, key, "unknown key");
                if (!(lk->types & BIT(type)))
                        return failf(x, key, "not allowed in a %s layer", layer_names[type]);
                if (strcmp(name, "init") == 0) {
                        int init;

                        if (!json_is_string(v))
                                return fail_type(x, key, "a string", v);
                        init = lookup_choice(init_names, json_string_value(v));
                        if (init < 0) {
                                join_choices(init_names, list, sizeof(list));
                                return failf(x, key, "%s is not one of %s", quote_json(v, q, sizeof(q)), list);
                        }
                        l->init = (enum init_kind) init;
                        continue;
                }
                if (!json_is_integer(v))
                        return fail_type(x, key, "an integer", v);
                if (json_integer_value(v) < lk->min || json_integer_value(v) > lk->max)
                        return failf(x, key, "%" JSON_INTEGER_FORMAT " is out of range [%" PRId64 ", %" PRId64 "]",
                                     json_integer_value(v), lk->min, lk->max);
                *(uint32_t *) ((char *) l + lk->offset) = (uint32_t) json_integer_value(v);
        }
        for (size_t i = 0; i < ELEMENTSOF(layer_keys); i++) {
                const struct layer_key *lk = &layer_keys[i];
                if ((lk->types & BIT(type)) && lk->min > 0 && !json_object_get(obj, lk->name)) {
                        snprintf(key, sizeof(key), "model.layers[%zu].%s", idx, lk->name);
                        return failf(x, key, "missing (required in a %s layer)", layer_names[type]);
                }
        }

        /* Check that the layer fits its input, so that a bad model fails here and not on a worker. */
        snprintf(key, sizeof(key), "model.layers[%zu]", idx);
        switch (l->type) {
        case LAYER_DENSE:
                if (s->c != 1 || s->h != 1)
                        return failf(x, key, "dense needs a flat input, got (%" PRIu64 ", %" PRIu64 ", %" PRIu64
                                     "); add a flatten layer before it", s->c, s->h, s->w);
                s->w = l->units;
                break;
        case LAYER_CONV2D:
                s->c = l->filters;
                break;
        case LAYER_MAXPOOL2D:
                if (s->h < l->pool || s->w < l->pool)
                        return failf(x, key, "pool %" PRIu32 " is larger than its input (%" PRIu64 ", %" PRIu64
                                     ", %" PRIu64 ")", l->pool, s->c, s->h, s->w);
                s->h /= l->pool;
                s->w /= l->pool;
                break;
        case LAYER_FLATTEN:
                s->w = s->c * s->h * s->w;
                s->c = s->h = 1;
                break;
        default:
                break;
        }
        if (s->c * s->h * s->w > (UINT64_C(1) << 31))
                return failf(x, key, "output (%" PRIu64 ", %" PRIu64 ", %" PRIu64 ") has more than 2^31 elements",
                             s->c, s->h, s->w);
        return 0;
}

static int parse_model(const struct ctx *x, struct job_config *c, const json_t *obj) {
        const json_t *in, *layers;
        struct model_spec *m = &c->model;
        struct shape s;
        size_t n;
        char key[64];
        int r;

        r = parse_section(x, c, "model", obj);
        if (r < 0)
                return r;

        in = json_object_get(obj, "input");
        if (!in)
                return failf(x, "model.input", "missing");
        if (!json_is_array(in))
                return fail_type(x, "model.input", "an array of 1 or 3 integers", in);
        n = json_array_size(in);
        if (n != 1 && n != 3)
                return failf(x, "model.input", "expected 1 or 3 dimensions, got %zu", n);
        for (size_t i = 0; i < n; i++) {
                const json_t *d = json_array_get(in, i);

                snprintf(key, sizeof(key), "model.input[%zu]", i);
                if (!json_is_integer(d))
                        return fail_type(x, key, "an integer", d);
                if (json_integer_value(d) < 1 || json_integer_value(d) > 1048576)
                        return failf(x, key, "%" JSON_INTEGER_FORMAT " is out of range [1, 1048576]",
                                     json_integer_value(d));
                m->input[3 - n + i] = (uint32_t) json_integer_value(d);
        }
        if (n == 1)
                m->input[0] = m->input[1] = 1;
        s = (struct shape) { m->input[0], m->input[1], m->input[2] };
        if (s.c * s.h * s.w > (UINT64_C(1) << 28))
                return failf(x, "model.input", "%" PRIu64 " elements per example, at most 2^28", s.c * s.h * s.w);

        layers = json_object_get(obj, "layers");
        if (!layers)
                return failf(x, "model.layers", "missing");
        if (!json_is_array(layers))
                return fail_type(x, "model.layers", "an array of layers", layers);
        n = json_array_size(layers);
        if (n == 0)
                return failf(x, "model.layers", "must not be empty");
        if (n > MODEL_MAX_LAYERS)
                return failf(x, "model.layers", "has %zu layers, at most %d", n, MODEL_MAX_LAYERS);
        for (size_t i = 0; i < n; i++) {
                r = parse_layer(x, i, json_array_get(layers, i), &m->layers[i], &s);
                if (r < 0)
                        return r;
        }
        m->n_layers = (uint32_t) n;
        if (m->layers[n - 1].type != LAYER_DENSE) {
                snprintf(key, sizeof(key), "model.layers[%zu]", n - 1);
                return failf(x, key, "the last layer must be dense (its units are the number of classes), got %s",
                             layer_names[m->layers[n - 1].type]);
        }
        return 0;
}

/* ---- load ----------------------------------------------------------------------------------- */

bool config_job_name_valid(const char *s) {
        size_t n;

        if (!s)
                return false;
        n = strlen(s);
        if (n == 0 || n > JOB_NAME_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!host_char_ok(s[i]))
                        return false;
        return true;
}

static int name_from_origin(const struct ctx *x, char **ret) {
        const char *b = strrchr(x->origin, '/');
        char *name, q[160];
        size_t n;

        b = b ? b + 1 : x->origin;
        n = strlen(b);
        if (n > 5 && strcmp(b + n - 5, ".json") == 0)
                n -= 5;
        name = strndup(b, n);
        if (!name)
                return fail_oom(x);
        if (!config_job_name_valid(name)) {
                int r = failf(x, "job", "missing, and the file name %s is not a valid job name "
                              "([A-Za-z0-9_.-]+, at most %d characters)", quote_str(name, q, sizeof(q)), JOB_NAME_MAX);
                free(name);
                return r;
        }
        *ret = name;
        return 0;
}

static int parse_root(const struct ctx *x, const json_t *root, struct job_config *c) {
        const char *name;
        json_t *v;
        int r;

        if (!json_is_object(root)) {
                char d[160];
                return failf(x, NULL, "expected an object at the top level, got %s", describe(root, d, sizeof(d)));
        }
        json_object_foreach((json_t *) root, name, v) {
                bool known = strcmp(name, "job") == 0;
                for (size_t i = 0; i < ELEMENTSOF(sections); i++)
                        known = known || strcmp(name, sections[i]) == 0;
                if (!known)
                        return failf(x, name, "unknown key");
        }

        v = json_object_get(root, "job");
        if (v) {
                char q[160];

                if (!json_is_string(v))
                        return fail_type(x, "job", "a string", v);
                if (!config_job_name_valid(json_string_value(v)))
                        return failf(x, "job", "%s is not a valid job name ([A-Za-z0-9_.-]+, at most %d characters)",
                                     quote_json(v, q, sizeof(q)), JOB_NAME_MAX);
                c->name = strdup(json_string_value(v));
                if (!c->name)
                        return fail_oom(x);
        } else {
                r = name_from_origin(x, &c->name);
                if (r < 0)
                        return r;
        }

        v = json_object_get(root, "cluster");
        if (!v)
                return failf(x, "cluster", "missing");
        r = parse_cluster(x, v, &c->cluster);
        if (r < 0)
                return r;

        v = json_object_get(root, "model");
        if (!v)
                return failf(x, "model", "missing");
        r = parse_model(x, c, v);
        if (r < 0)
                return r;

        for (size_t i = 2; i < ELEMENTSOF(sections); i++) {
                v = json_object_get(root, sections[i]);
                if (!v)
                        continue;
                r = parse_section(x, c, sections[i], v);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int load_json(const struct ctx *x, const char *buf, size_t len, json_t **ret) {
        json_error_t e;
        json_t *root;

        root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &e);
        if (!root)
                return failf(x, NULL, "line %d column %d: %s", e.line, e.column, e.text);
        *ret = root;
        return 0;
}

static int load_buffer(const char *buf, size_t len, const char *origin, struct job_config **ret,
                       char *err, size_t errlen) {
        const struct ctx x = { .origin = origin, .err = err, .errlen = errlen };
        struct job_config *c;
        json_t *root = NULL;
        int r;

        r = load_json(&x, buf, len, &root);
        if (r < 0)
                return r;
        c = calloc(1, sizeof(*c));
        if (!c) {
                r = fail_oom(&x);
                goto out;
        }
        c->path = strdup(origin);
        c->cluster_origin = strdup(origin);
        if (!c->path || !c->cluster_origin || apply_defaults(c) < 0) {
                r = fail_oom(&x);
                goto out;
        }
        r = parse_root(&x, root, c);
        if (r < 0)
                goto out;
        *ret = c;
        c = NULL;
out:
        config_free(c);
        json_decref(root);
        return r;
}

int config_load_string(const char *json, const char *origin, struct job_config **ret, char *err, size_t errlen) {
        assert(json && ret);
        if (!origin)
                origin = "<string>";
        return load_buffer(json, strlen(json), origin, ret, err, errlen);
}

int config_load(const char *path, struct job_config **ret, char *err, size_t errlen) {
        const struct ctx x = { .origin = path, .err = err, .errlen = errlen };
        char *buf = NULL;
        size_t len;
        int r;

        assert(path && ret);
        r = read_file(path, CONFIG_MAX_FILE, &buf, &len);
        if (r == -EFBIG)
                return failf(&x, NULL, "larger than %u bytes", CONFIG_MAX_FILE), -EFBIG;
        if (r < 0) {
                failf(&x, NULL, "cannot open: %s", strerror(-r));
                return r;
        }
        r = load_buffer(buf, len, path, ret, err, errlen);
        free(buf);
        return r;
}

struct job_config *config_free(struct job_config *c) {
        if (!c)
                return NULL;
        for (size_t i = 0; i < ELEMENTSOF(keys); i++)
                if (keys[i].type == KT_STRING)
                        free(*(char **) field(c, &keys[i]));
        cluster_clear(&c->cluster);
        free(c->path);
        free(c->cluster_origin);
        free(c->name);
        free(c);
        return NULL;
}

/* ---- tasks ---------------------------------------------------------------------------------- */

const char *role_name(enum role r) {
        switch (r) {
        case ROLE_CHIEF: return "chief";
        case ROLE_PS: return "ps";
        case ROLE_WORKER: return "worker";
        }
        return "unknown";
}

static int role_from_string(const char *s) {
        if (!s)
                return -EINVAL;
        if (strcmp(s, "master") == 0)
                return ROLE_CHIEF;
        return lookup_choice(cluster_keys, s);
}

static uint32_t cluster_count(const struct cluster *cl, enum role r) {
        return r == ROLE_CHIEF ? cl->n_chief : r == ROLE_PS ? cl->n_ps : cl->n_worker;
}

static int fail_index(const struct ctx *x, const char *key, const struct cluster *cl, enum role role, uint64_t i) {
        uint32_t n = cluster_count(cl, role);

        return failf(x, key, "%s%" PRIu64 " is out of range: cluster has %" PRIu32 " %s task%s (0..%" PRIu32 ")",
                     key ? "" : "task index ", i, n, role_name(role), n == 1 ? "" : "s", n - 1);
}

int config_parse_task(const struct job_config *c, const char *role, const char *index_str, struct task *ret,
                      char *err, size_t errlen) {
        const struct ctx x = { .origin = c->cluster_origin, .err = err, .errlen = errlen };
        char q[160];
        uint64_t i;
        int r;

        assert(c && ret);
        r = role_from_string(role);
        if (r < 0)
                return failf(&x, NULL, "task type %s is not one of chief, ps, worker",
                             quote_str(role ? role : "", q, sizeof(q)));
        if (parse_u64(index_str, 0, UINT64_MAX, &i) < 0)
                return failf(&x, NULL, "task index %s is not a whole decimal number",
                             quote_str(index_str ? index_str : "", q, sizeof(q)));
        if (i >= cluster_count(&c->cluster, (enum role) r))
                return fail_index(&x, NULL, &c->cluster, (enum role) r, i);
        *ret = (struct task) { .role = (enum role) r, .index = (uint32_t) i };
        return 0;
}

const struct endpoint *config_endpoint(const struct job_config *c, struct task t) {
        switch (t.role) {
        case ROLE_CHIEF: return t.index < c->cluster.n_chief ? &c->cluster.chief[t.index] : NULL;
        case ROLE_PS: return t.index < c->cluster.n_ps ? &c->cluster.ps[t.index] : NULL;
        case ROLE_WORKER: return t.index < c->cluster.n_worker ? &c->cluster.worker[t.index] : NULL;
        }
        return NULL;
}

int config_apply_tf_config(struct job_config *c, const char *tf_config_json, struct task *task_ret,
                           bool *have_task, char *err, size_t errlen) {
        const struct ctx x = { .origin = "TF_CONFIG", .err = err, .errlen = errlen };
        struct cluster cl = { 0 };
        const struct cluster *eff = &c->cluster;
        struct task t = { 0 };
        bool got_task = false, got_cluster = false;
        json_t *root = NULL, *v;
        const char *name;
        char q[160];
        int r;

        assert(c);
        if (!tf_config_json || !*tf_config_json) {
                if (have_task)
                        *have_task = false;
                return 0;
        }
        r = load_json(&x, tf_config_json, strlen(tf_config_json), &root);
        if (r < 0)
                return r;
        if (!json_is_object(root)) {
                char d[160];
                r = failf(&x, NULL, "expected an object at the top level, got %s", describe(root, d, sizeof(d)));
                goto out;
        }
        json_object_foreach(root, name, v) {
                if (strcmp(name, "cluster") == 0 || strcmp(name, "task") == 0)
                        continue;
                if (strcmp(name, "environment") == 0) /* TensorFlow's "cloud" marker; nothing to do */
                        continue;
                if (strcmp(name, "rpc_layer") == 0) {
                        if (!json_is_string(v) || strcmp(json_string_value(v), "grpc") != 0) {
                                r = failf(&x, name, "%s is not \"grpc\"", quote_json(v, q, sizeof(q)));
                                goto out;
                        }
                        continue;
                }
                r = failf(&x, name, "unknown key");
                goto out;
        }

        v = json_object_get(root, "cluster");
        if (v) {
                r = parse_cluster(&x, v, &cl);
                if (r < 0)
                        goto out;
                got_cluster = true;
                eff = &cl;
        }

        v = json_object_get(root, "task");
        if (v) {
                const json_t *type, *index;
                json_int_t i = 0;
                int role;

                if (!json_is_object(v)) {
                        r = fail_type(&x, "task", "an object", v);
                        goto out;
                }
                json_object_foreach(v, name, type) {
                        if (strcmp(name, "type") != 0 && strcmp(name, "index") != 0 &&
                            strcmp(name, "trial") != 0) {
                                char key[96];
                                snprintf(key, sizeof(key), "task.%s", name);
                                r = failf(&x, key, "unknown key");
                                goto out;
                        }
                }
                type = json_object_get(v, "type");
                if (!type) {
                        r = failf(&x, "task.type", "missing");
                        goto out;
                }
                if (!json_is_string(type)) {
                        r = fail_type(&x, "task.type", "a string", type);
                        goto out;
                }
                role = role_from_string(json_string_value(type));
                if (role < 0) {
                        r = failf(&x, "task.type", "%s is not one of chief, master, ps, worker",
                                  quote_json(type, q, sizeof(q)));
                        goto out;
                }
                index = json_object_get(v, "index");
                if (index) {
                        if (!json_is_integer(index)) {
                                r = fail_type(&x, "task.index", "an integer", index);
                                goto out;
                        }
                        i = json_integer_value(index);
                        if (i < 0) {
                                r = failf(&x, "task.index", "%" JSON_INTEGER_FORMAT " is negative", i);
                                goto out;
                        }
                }
                if ((uint64_t) i >= cluster_count(eff, (enum role) role)) {
                        r = fail_index(&x, "task.index", eff, (enum role) role, (uint64_t) i);
                        goto out;
                }
                t = (struct task) { .role = (enum role) role, .index = (uint32_t) i };
                got_task = true;
        }

        if (got_cluster) {
                char *o = strdup("TF_CONFIG");
                if (!o) {
                        r = fail_oom(&x);
                        goto out;
                }
                free(c->cluster_origin);
                c->cluster_origin = o;
                cluster_clear(&c->cluster);
                c->cluster = cl;
                memset(&cl, 0, sizeof(cl));
        }
        if (got_task && task_ret)
                *task_ret = t;
        if (have_task)
                *have_task = got_task;
        r = 0;
out:
        cluster_clear(&cl);
        json_decref(root);
        return r;
}

int config_parse_instance(const char *instance, char **job_ret, int64_t *index_ret) {
        const char *colon;
        char *job;
        uint64_t i = 0;
        int64_t idx = -1;

        if (!instance || !job_ret || !index_ret)
                return -EINVAL;
        colon = strchr(instance, ':');
        if (colon) {
                if (parse_u64(colon + 1, 0, INT32_MAX, &i) < 0)
                        return -EINVAL;
                idx = (int64_t) i;
        }
        job = colon ? strndup(instance, (size_t) (colon - instance)) : strdup(instance);
        if (!job)
                return -ENOMEM;
        if (!config_job_name_valid(job)) {
                free(job);
                return -EINVAL;
        }
        *job_ret = job;
        *index_ret = idx;
        return 0;
}

/* ---- canonical form, fingerprint, diff ------------------------------------------------------ */

static int add(json_t *obj, const char *key, json_t *v) {
        return json_object_set_new(obj, key, v); /* steals v, also on failure */
}

/* Keys each node may set for itself: they change no value any other node computes, so they stay out
 * of the canonical form and the fingerprint (a worker with more BLAS threads is the same job). */
static bool node_local(const char *key) {
        return strcmp(key, "training.threads") == 0 || strcmp(key, "training.report_every_steps") == 0;
}

static json_t *section_json(const struct job_config *c, const char *section) {
        size_t plen = strlen(section);
        json_t *o = json_object();
        int r = 0;

        if (!o)
                return NULL;
        for (size_t i = 0; i < ELEMENTSOF(keys); i++) {
                const struct config_key *k = &keys[i];
                const void *f = (const char *) c + k->offset;
                const char *name = k->name + plen + 1;

                if (strncmp(k->name, section, plen) != 0 || k->name[plen] != '.' || node_local(k->name))
                        continue;
                switch (k->type) {
                case KT_U32: r |= add(o, name, json_integer(*(const uint32_t *) f)); break;
                case KT_U64: r |= add(o, name, json_integer((json_int_t) *(const uint64_t *) f)); break;
                case KT_DOUBLE: r |= add(o, name, json_real(*(const double *) f)); break;
                case KT_BOOL: r |= add(o, name, json_boolean(*(const bool *) f)); break;
                case KT_STRING: r |= add(o, name, json_string(*(char *const *) f)); break;
                case KT_ENUM: r |= add(o, name, json_string(k->choices[*(const int *) f])); break;
                case KT_SPECIAL: break;
                }
        }
        if (r < 0) {
                json_decref(o);
                return NULL;
        }
        return o;
}

static json_t *endpoints_json(const struct endpoint *eps, uint32_t n) {
        json_t *a = json_array();

        for (uint32_t i = 0; a && i < n; i++) {
                if (json_array_append_new(a, json_string(eps[i].addr)) < 0) {
                        json_decref(a);
                        return NULL;
                }
        }
        return a;
}

char *config_canonical_json(const struct job_config *c) {
        json_t *root = json_object(), *cl = json_object(), *model, *layers = json_array();
        const struct model_spec *m = &c->model;
        char *s = NULL;
        int r = 0;

        if (!root || !cl || !layers)
                goto out;
        r |= add(cl, "chief", endpoints_json(c->cluster.chief, c->cluster.n_chief));
        r |= add(cl, "ps", endpoints_json(c->cluster.ps, c->cluster.n_ps));
        r |= add(cl, "worker", endpoints_json(c->cluster.worker, c->cluster.n_worker));
        r |= add(root, "cluster", cl);
        cl = NULL;

        model = section_json(c, "model");
        r |= add(root, "model", model);
        if (!model)
                goto out;
        r |= add(model, "input", json_pack("[iii]", (json_int_t) m->input[0], (json_int_t) m->input[1],
                                           (json_int_t) m->input[2]));
        for (uint32_t i = 0; i < m->n_layers; i++) {
                const struct layer_spec *l = &m->layers[i];
                json_t *lo = json_pack("{ss}", "type", layer_names[l->type]);

                if (!lo)
                        goto out;
                for (size_t j = 0; j < ELEMENTSOF(layer_keys); j++) {
                        const struct layer_key *lk = &layer_keys[j];

                        if (!(lk->types & BIT(l->type)))
                                continue;
                        if (strcmp(lk->name, "init") == 0)
                                r |= add(lo, "init", json_string(init_names[l->init]));
                        else
                                r |= add(lo, lk->name, json_integer(*(const uint32_t *) ((const char *) l + lk->offset)));
                }
                r |= json_array_append_new(layers, lo);
        }
        r |= add(model, "layers", layers);
        layers = NULL;

        r |= add(root, "training", section_json(c, "training"));
        r |= add(root, "ps", section_json(c, "ps"));
        if (r < 0)
                goto out;
        s = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
out:
        json_decref(cl);
        json_decref(layers);
        json_decref(root);
        return s;
}

uint64_t config_fingerprint(const struct job_config *c) {
        char *s = config_canonical_json(c);
        uint64_t h = UINT64_C(0xcbf29ce484222325);

        if (!s)
                return 0;
        for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
                h ^= *p;
                h *= UINT64_C(0x100000001b3);
        }
        free(s);
        return h;
}

static int cmp_str(const void *a, const void *b) {
        return strcmp(*(const char *const *) a, *(const char *const *) b);
}

static void diff_msg(char *buf, size_t len, const char *path, const json_t *a, const json_t *b) {
        char qa[200], qb[200];

        if (!buf || len == 0)
                return;
        snprintf(buf, len, "%s: ours %s, theirs %s", *path ? path : "(root)",
                 a ? quote_json(a, qa, sizeof(qa)) : "missing", b ? quote_json(b, qb, sizeof(qb)) : "missing");
}

/* Returns 1 with a message at the first difference, 0 when equal, -ENOMEM. */
static int diff_values(const json_t *a, const json_t *b, char *path, size_t plen, size_t pcap, char *buf, size_t len) {
        int r = 0;

        if (json_typeof(a) != json_typeof(b) &&
            !(json_is_boolean(a) && json_is_boolean(b))) {
                diff_msg(buf, len, path, a, b);
                return 1;
        }
        if (json_is_object(a)) {
                size_t n = json_object_size(a) + json_object_size(b), k = 0;
                const char **names = calloc(n ? n : 1, sizeof(char *));
                const char *name;
                json_t *v;

                if (!names)
                        return -ENOMEM;
                json_object_foreach((json_t *) a, name, v)
                        names[k++] = name;
                json_object_foreach((json_t *) b, name, v)
                        if (!json_object_get(a, name))
                                names[k++] = name;
                qsort(names, k, sizeof(char *), cmp_str);
                for (size_t i = 0; i < k && r == 0; i++) {
                        const json_t *va = json_object_get(a, names[i]), *vb = json_object_get(b, names[i]);

                        snprintf(path + plen, pcap - plen, "%s%s", plen ? "." : "", names[i]);
                        if (!va || !vb) {
                                diff_msg(buf, len, path, va, vb);
                                r = 1;
                        } else
                                r = diff_values(va, vb, path, strlen(path), pcap, buf, len);
                }
                path[plen] = 0;
                free(names);
                return r;
        }
        if (json_is_array(a)) {
                size_t na = json_array_size(a), nb = json_array_size(b);

                if (na != nb) {
                        if (buf && len)
                                snprintf(buf, len, "%s: ours has %zu entries, theirs %zu", *path ? path : "(root)", na, nb);
                        return 1;
                }
                for (size_t i = 0; i < na && r == 0; i++) {
                        snprintf(path + plen, pcap - plen, "[%zu]", i);
                        r = diff_values(json_array_get(a, i), json_array_get(b, i), path, strlen(path), pcap, buf, len);
                }
                path[plen] = 0;
                return r;
        }
        if (!json_equal((json_t *) a, (json_t *) b)) {
                diff_msg(buf, len, path, a, b);
                return 1;
        }
        return 0;
}

int config_diff(const char *ours_json, const char *theirs_json, char *buf, size_t len) {
        json_t *a, *b;
        char path[512] = "";
        int r;

        a = ours_json ? json_loads(ours_json, 0, NULL) : NULL;
        b = theirs_json ? json_loads(theirs_json, 0, NULL) : NULL;
        if (!a || !b) {
                json_decref(a);
                json_decref(b);
                return -EINVAL;
        }
        r = diff_values(a, b, path, 0, sizeof(path), buf, len);
        json_decref(a);
        json_decref(b);
        return r;
}

/* ---- documentation -------------------------------------------------------------------------- */

static void key_docs(const struct config_key *k, char *type, char *def, char *range, size_t len) {
        switch (k->type) {
        case KT_U32:
        case KT_U64:
                snprintf(type, len, "integer");
                snprintf(def, len, "%" PRId64, k->idef);
                fmt_range(k, range, len);
                break;
        case KT_DOUBLE:
                snprintf(type, len, "number");
                snprintf(def, len, "%g", k->ddef);
                fmt_range(k, range, len);
                break;
        case KT_BOOL:
                snprintf(type, len, "boolean");
                snprintf(def, len, "%s", k->sdef);
                snprintf(range, len, "true, false");
                break;
        case KT_STRING:
                snprintf(type, len, "string");
                snprintf(def, len, "\"%s\"", k->sdef);
                snprintf(range, len, k->check == check_device ? "auto, cpu, gpu:N, gpu:N,M,..." : "non-empty");
                break;
        case KT_ENUM:
                snprintf(type, len, "string");
                snprintf(def, len, "\"%s\"", k->sdef);
                join_choices(k->choices, range, len);
                break;
        case KT_SPECIAL:
                snprintf(type, len, "%s", k->type_doc);
                snprintf(def, len, "%s", k->default_doc);
                snprintf(range, len, "%s", k->range_doc);
                break;
        }
}

void config_print_keys(FILE *f, bool markdown) {
        char type[256], def[256], range[256];

        if (markdown) {
                fprintf(f, "| key | type | default | allowed | meaning |\n");
                fprintf(f, "| --- | --- | --- | --- | --- |\n");
        }
        for (size_t i = 0; i < ELEMENTSOF(keys); i++) {
                const struct config_key *k = &keys[i];

                key_docs(k, type, def, range, sizeof(type));
                if (markdown)
                        fprintf(f, "| `%s` | %s | %s | %s | %s |\n", k->name, type, def, range, k->doc);
                else
                        fprintf(f, "  %-34s %s; %s%s; %s\n  %-34s %s\n", k->name, type,
                                strncmp(def, "required", 8) == 0 ? "" : "default ", def, range, "", k->doc);
        }
}
