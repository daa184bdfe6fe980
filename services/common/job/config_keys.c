/* The job file's keys as data: name, type, default, bounds, meaning and environment override of each,
 * the layer keys, and the environment settings that are no key. --help and docs/configuration.md are
 * printed from here (config_print_keys, config_print_env). */
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

#include "config_internal.h"
#include "util.h"
#include "device_spec.h"
#include "log.h"

/* Each K_ macro takes, after the meaning, optional fields such as .env = "PSFLEET_..." (an override). */
#define FIELD(f) .offset = offsetof(struct job_config, f), .size = sizeof(((struct job_config *) 0)->f)
#define K_U32(n, f, d, lo, hi, text, ...) \
        { .name = n, .type = KT_U32, FIELD(f), .idef = d, .imin = lo, .imax = hi, .doc = text, __VA_ARGS__ }
#define K_U64(n, f, d, lo, hi, text, ...) \
        { .name = n, .type = KT_U64, FIELD(f), .idef = d, .imin = lo, .imax = hi, .doc = text, __VA_ARGS__ }
#define K_DBL(n, f, d, lo, lo_open, hi, hi_open, text, ...) \
        { .name = n, .type = KT_DOUBLE, FIELD(f), .ddef = d, .dmin = lo, .dmin_open = lo_open, \
          .dmax = hi, .dmax_open = hi_open, .doc = text, __VA_ARGS__ }
#define K_BOOL(n, f, d, text, ...) { .name = n, .type = KT_BOOL, FIELD(f), .sdef = #d, .doc = text, __VA_ARGS__ }
#define K_STR(n, f, d, text, ...) { .name = n, .type = KT_STRING, FIELD(f), .sdef = d, .doc = text, __VA_ARGS__ }
#define K_ENUM(n, f, d, ch, text, ...) { .name = n, .type = KT_ENUM, FIELD(f), .sdef = d, .choices = ch, .doc = text, __VA_ARGS__ }
#define K_SPECIAL(n, t, d, r, text) \
        { .name = n, .type = KT_SPECIAL, .type_doc = t, .default_doc = d, .range_doc = r, .doc = text }

static const char *const optimizer_names[] = { "sgd", "momentum", "adam", "adagrad", NULL };
static const char *const head_names[] = { [HEAD_SOFTMAX] = "softmax", [HEAD_LOGISTIC] = "logistic", [HEAD_MSE] = "mse", NULL };
static const char *const graph_init_names[] = { [GRAPH_INIT_FILE] = "file", [GRAPH_INIT_GLOROT] = "glorot_uniform", NULL };
static const char *const data_format_names[] = {
        [DATA_IDX] = "idx", [DATA_LIBSVM] = "libsvm", [DATA_CRITEO] = "criteo", [DATA_CSV] = "csv",
        [DATA_TFRECORD] = "tfrecord", NULL,
};
static const char *const bad_lines_names[] = { [BAD_LINES_ERROR] = "error", [BAD_LINES_SKIP] = "skip", NULL };
static const char *const sparse_optimizer_names[] = {
        [SPARSE_SGD] = "sgd", [SPARSE_ADAGRAD] = "adagrad", [SPARSE_FTRL] = "ftrl", NULL,
};
const char *const cfg_pooling_names[] = { [POOL_SUM] = "sum", [POOL_MEAN] = "mean", NULL };
const char *const cfg_evict_policy_names[] = {
        [SPARSE_EVICT_AGE] = "age", [SPARSE_EVICT_LRU] = "lru", [SPARSE_EVICT_LFU] = "lfu", NULL,
};
static const char *const schedule_names[] = { "constant", "exponential", NULL };
static const char *const wire_dtype_names[] = { [RPC_WIRE_FLOAT32] = "float32", [RPC_WIRE_BFLOAT16] = "bfloat16", NULL };
static const char *const grad_norm_action_names[] = { [GRAD_NORM_REJECT] = "reject", [GRAD_NORM_CLIP] = "clip", NULL };
static const char *const training_mode_names[] = { [MODE_ASYNC] = "async", [MODE_SYNC] = "sync", [MODE_SSP] = "ssp", NULL };
static const char *const recovery_names[] = { [RECOVERY_JOB] = "job", [RECOVERY_SHARD] = "shard", NULL };
static const char *const replica_transport_names[] = { [REPLICA_TRANSPORT_AUTO] = "auto",
                                                        [REPLICA_TRANSPORT_GRPC] = "grpc", NULL };
static const char *const security_mode_names[] = {
        [SECURITY_AUTO] = "auto", [SECURITY_MTLS] = "mtls", [SECURITY_INSECURE] = "insecure", NULL,
};
const char *const cfg_layer_names[] = {
        [LAYER_DENSE] = "dense", [LAYER_RELU] = "relu", [LAYER_TANH] = "tanh",
        [LAYER_SIGMOID] = "sigmoid", [LAYER_CONV2D] = "conv2d", [LAYER_MAXPOOL2D] = "maxpool2d",
        [LAYER_FLATTEN] = "flatten", NULL,
};
const char *const cfg_init_names[] = {
        [INIT_DEFAULT] = "default", [INIT_GLOROT_UNIFORM] = "glorot_uniform",
        [INIT_HE_NORMAL] = "he_normal", [INIT_ZEROS] = "zeros", NULL,
};

/* device.device: the one parser of device strings (device_spec.c). */
static int check_device(const char *s, char *why, size_t whylen)
{
        return device_spec_parse(s, NULL, why, whylen);
}

/* metrics.listen: empty (off), or HOST:PORT (the host is resolved when the daemon binds it). */
static int check_metrics_listen(const char *s, char *why, size_t whylen)
{
        const char *colon = strrchr(s, ':');
        uint64_t port;
        if (!*s)
                return 0;
        if (!colon || colon == s || parse_u64(colon + 1, 1, 65535, &port) < 0) {
                snprintf(why, whylen, "not HOST:PORT with a port 1..65535 (127.0.0.1:9400, [::1]:9400)");
                return -EINVAL;
        }
        return 0;
}

int cfg_parse_compression(const char *s, enum rpc_compression *kind, double *ratio, char *why, size_t whylen)
{
        static const char *const plain[] = { [RPC_COMPRESS_NONE] = "none", [RPC_COMPRESS_BF16] = "bf16",
                                             [RPC_COMPRESS_INT8] = "int8", [RPC_COMPRESS_AUTO] = "auto" };
        for (int i = 0; i < (int)(sizeof(plain) / sizeof(plain[0])); i++)
                if (plain[i] && strcmp(s, plain[i]) == 0) {
                        *kind = (enum rpc_compression)i;
                        *ratio = 0;
                        return 0;
                }
        if (strncmp(s, "topk:", 5) == 0) {
                char *end;
                errno = 0;
                double r = strtod(s + 5, &end);
                if (errno == 0 && end != s + 5 && !*end && !isspace((unsigned char)s[5]) && r > 0 && r < 1) {
                        *kind = RPC_COMPRESS_TOPK;
                        *ratio = r;
                        return 0;
                }
                snprintf(why, whylen, "has a top-k ratio that is not a number in (0, 1) (topk:0.01 sends the "
                                      "largest 1%% of each block of %d values)", 256);
                return -EINVAL;
        }
        snprintf(why, whylen, "is not one of auto, none, bf16, int8, topk:R (R a ratio in (0, 1), e.g. topk:0.01)");
        return -EINVAL;
}

static int check_compression(const char *s, char *why, size_t whylen)
{
        enum rpc_compression kind;
        double ratio;
        return cfg_parse_compression(s, &kind, &ratio, why, whylen);
}

/* log.level: a level log_level_from_string knows. */
static int check_log_level(const char *s, char *why, size_t whylen)
{
        if (log_level_from_string(s) >= 0)
                return 0;
        snprintf(why, whylen, "is not a log level (debug, info, notice, warning, error)");
        return -EINVAL;
}

/* supervisor.checkpoint_dir, supervisor.summary_dir: chiefd resolves a relative path under
 * STATE_DIR/JOB/, and it must stay there ("a/../b" does; "../b" climbs out into another job's
 * directory or the state directory's parent). An absolute path is the operator's explicit choice. */
static int check_state_path(const char *s, char *why, size_t whylen)
{
        int depth = 0;
        if (s[0] == '/')
                return 0;
        for (const char *p = s; *p;) {
                size_t n = strcspn(p, "/");
                if (n == 2 && p[0] == '.' && p[1] == '.')
                        depth--;
                else if (n && !(n == 1 && p[0] == '.'))
                        depth++;
                if (depth < 0) {
                        snprintf(why, whylen, "climbs out of STATE_DIR/JOB/ with \"..\" (a relative path stays "
                                              "under it; an absolute path may go anywhere)");
                        return -EINVAL;
                }
                p += n;
                p += strspn(p, "/");
        }
        return 0;
}

const struct config_key cfg_keys[] = {
        K_SPECIAL("job", "string", "file name without .json", "[A-Za-z0-9_.-]+, not starting with a dot, at most 64 characters",
                  "Job name; it names the units (psfleet-psd@JOB:INDEX) and state directories."),
        K_SPECIAL("cluster.chief", "list of host:port", "required", "exactly 1 entry",
                  "The chief (chiefd). TensorFlow ClusterSpec shape; \"master\" is accepted for \"chief\"."),
        K_SPECIAL("cluster.ps", "list of host:port", "required", "1 or more entries",
                  "Parameter servers (psd), one per index."),
        K_SPECIAL("cluster.worker", "list of host:port", "required", "1 or more entries",
                  "Workers (workerd), one per index. An endpoint may appear only once in the cluster."),
        K_SPECIAL("cluster.ps_backup", "list of host:port", "none", "as many entries as cluster.ps",
                  "ps.replicas 2: the backup psd of each shard, in cluster.ps's order (psd --backup --task-index N "
                  "listens on entry N); a backup equal to its primary is an error."),
        K_SPECIAL("cluster.evaluator", "list of host:port", "none", "at most 1 entry",
                  "The evaluator (chiefd --evaluator, TF_CONFIG's evaluator task): it evaluates each new checkpoint "
                  "on the test split, and the chief then evaluates only at the end. Not in the fingerprint."),
        K_SPECIAL("model.input", "list of integers", "required", "[N] or [C, H, W], each 1..1048576; [0] with a record format",
                  "Shape of one example; [784] means (1, 1, 784). With a record format (data.format) it is [N], the "
                  "dense features of a record: 13 for criteo, 0 for libsvm, data.csv_features for csv when set, "
                  "data.tfrecord's dense features and image for tfrecord (or the image's [C, H, W] alone)."),
        K_ENUM("model.head", model.head, "softmax", head_names,
               "The loss over the last dense layer's outputs: softmax (cross-entropy over its units, at least 2; "
               "labels are class indices 0..units-1, also in record files), logistic (1 unit, sigmoid "
               "cross-entropy; labels 0 or 1; metrics AUC and log loss) or mse (1 unit, mean over the batch of "
               "the squared error, as tf.losses.mean_squared_error; metric RMSE). logistic and mse need a record "
               "format (data.format)."),
        K_ENUM("model.init", model.init, "file", graph_init_names,
               "model.onnx: the variables' initial values: file (the initializers' own) or glorot_uniform "
               "(every initializer of rank 2 or more drawn uniform in +-sqrt(6 / (fan_in + fan_out)), seeded by "
               "model.seed and its index, a convolution's fans counting its kernel's positions; vectors, "
               "biases and batch normalization's keep the file's)."),
        K_SPECIAL("model.embeddings", "list of tables", "[]", "0..8 tables; needs a record format",
                  "Embedding tables on the ps (docs/sparse.md): each field listed is looked up in its table and "
                  "pooled into a dim-wide slice; the dense layers read the dense features, then every table's "
                  "slices in order."),
        K_SPECIAL("model.embeddings[].name", "string", "required", "[A-Za-z0-9_]{1,31}, unique",
                  "The table's name (checkpoints: emb/NAME)."),
        K_SPECIAL("model.embeddings[].fields", "\"all\" or list of integers", "\"all\"",
                  "1..64 distinct fields of the format: criteo 0..25, libsvm 0",
                  "The data's fields looked up in this table, each its own slice; \"all\": every field of data.format."),
        K_SPECIAL("model.embeddings[].dim", "integer", "required", "[1, 1024]", "Floats per row."),
        K_SPECIAL("model.embeddings[].vocab", "integer", "0", "[0, 9223372036854775807]",
                  "A field's id is taken modulo vocab (hashing into that many rows); 0: ids as they are."),
        K_SPECIAL("model.embeddings[].pooling", "string", "\"sum\"", "sum, mean",
                  "A multi-valued field: the sum of its rows weighted by their values, or their mean."),
        K_SPECIAL("model.embeddings[].init_stddev", "number", "1/sqrt(dim)", "[0, 1000]",
                  "Rows start truncated-normal with this standard deviation, seeded by model.seed, table and id; 0: zeros."),
        K_SPECIAL("model.embeddings[].initializer", "string", "none", "an initializer of model.onnx's graph, (rows, dim)",
                  "model.onnx: the initializer this table is; the Gather that looks its rows up is cut out of the graph "
                  "and fed the rows the ps holds (sharded, created on first touch, the sparse optimizer's), so the "
                  "table is never a dense variable. A row starts as the initializer's row of the same number when "
                  "the table has a vocab (ids are row numbers then) and model.init is file, else as init_stddev "
                  "says. Required with model.onnx; dim defaults to its width."),
        K_SPECIAL("model.embeddings[].evict_after_steps", "integer", "0", "[0, 9223372036854775807]",
                  "The ps drops a row untouched for this many global steps; 0: never."),
        K_SPECIAL("model.embeddings[].max_rows", "integer", "0", "0, or at least 64 per ps shard",
                  "The most rows the table holds: each of the N ps shards at most max_rows / N (rounded down), "
                  "spread over its 64 lock stripes. A new row in a full stripe first evicts about 3 % of the "
                  "stripe's rows by evict_policy. 0: no bound (but ps.memory_limit_bytes)."),
        K_SPECIAL("model.embeddings[].evict_policy", "string", "\"age\"", "age, lru, lfu",
                  "What goes first when the table is at its bound (max_rows or ps.memory_limit_bytes): age and lru "
                  "the rows touched longest ago, lfu the rows used least (4 more bytes per row; a stripe's counts "
                  "are halved each time it has evicted as many rows as it holds). evict_after_steps still applies."),
        K_SPECIAL("model.embeddings[].admit_after", "integer", "0", "[0, 255]",
                  "An id gets a row on its admit_after-th pull, counted in a count-min sketch (4 x 2^20 one-byte "
                  "counters, 4 MiB per table on each shard, halved every 10 x 2^20 sightings); until then its pulls "
                  "give its initial row and its gradients are dropped (counted). 0, 1: a row at once."),
        K_SPECIAL("model.embeddings[].disk_tier", "boolean", "false", "true, false",
                  "Rows past the table's bound in DRAM (max_rows, or its share of ps.memory_limit_bytes) move to a "
                  "RocksDB store on the psd's disk (ps.disk_tier_dir) instead of being evicted, and come back into "
                  "DRAM on their next use; checkpoints include them. Needs max_rows or ps.memory_limit_bytes."),
        K_SPECIAL("model.embeddings[].expected_rows", "integer", "0", "[0, 9223372036854775807]",
                  "For psfleet plan only: the rows the table is expected to hold when it has no max_rows (nor a "
                  "vocab); 0: plan reports it unbounded."),
        K_SPECIAL("model.onnx", "string", "none", "a path to an ONNX model (opsets 13..17), relative to the job file's folder",
                  "The model as an ONNX graph (docs/graph.md), instead of model.layers: its float initializers are the "
                  "variables, with their values as the initial ones; its first output is what model.head reads. The "
                  "file's SHA-256 is part of the job's fingerprint."),
        K_SPECIAL("model.inputs", "object", "the graph's one input is fed the data",
                  "graph input name: \"image\" (data.format idx), \"dense\" (a record's dense features) or "
                  "\"ids:TABLE[,TABLE...]\"",
                  "model.onnx: what each input of the graph is fed. \"ids:T\": the record's ids of table T's fields, "
                  "(batch, fields) int64, whose lookup in T's initializer is done on the ps."),
        K_U64("model.seed", model.seed, 1, 0, INT64_MAX, "Seed of the variables' initializers."),
        K_SPECIAL("model.layers", "list of layers", "required", "1..64 layers, the last one dense",
                  "Layers in order; the last one is dense: its units are the number of classes (model.head softmax, "
                  "at least 2) or 1 (logistic, mse)."),
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
              "Directory of the IDX files (Debian's dataset-fashion-mnist), or of the record files."),
        K_ENUM("data.format", data.format, "idx", data_format_names,
               "idx: the IDX image files below, loaded whole; libsvm, criteo, csv, tfrecord: record files "
               "(data.train_files), streamed (docs/data-formats.md); tfrecord: TFRecord files of tf.train.Example, "
               "the features taken as data.tfrecord says."),
        K_SPECIAL("data.train_files", "list of strings", "required (record formats)", "1 or more non-empty paths",
                  "Record formats: the training files, in data.dir unless absolute, gzip'd or not (tfrecord: "
                  "uncompressed, GZIP or ZLIB); a worker reads its own shard of them."),
        K_SPECIAL("data.test_files", "list of strings", "[]", "non-empty paths",
                  "Record formats: the evaluation files; none: no evaluation."),
        K_ENUM("data.bad_lines", data.bad_lines, "error", bad_lines_names,
               "Record formats: a line that does not parse stops the reader with FILE:LINE (error), or is "
               "counted and skipped (skip); tfrecord: a record, named FILE: record INDEX at byte OFFSET."),
        K_U32("data.max_ids_per_example", data.max_ids_per_example, 1024, 1, 1048576,
              "Record formats: the most ids one record may hold, all fields together (a longer line is bad)."),
        K_U32("data.shuffle_buffer", data.shuffle_buffer, 0, 0, 10000000,
              "Record formats: training records are drawn at random from a buffer of this many read ahead (as "
              "TensorFlow's Dataset.shuffle; the draws seeded by training.seed and the worker), which mixes "
              "files sorted by time or label; 0: in file order. It holds that many records in memory."),
        K_SPECIAL("data.tfrecord", "object", "required (tfrecord)", "the keys below",
                  "tfrecord: which features of each tf.train.Example a record takes, as tf.io.parse_example's "
                  "features dict (docs/data-formats.md, \"TFRecord\")."),
        K_SPECIAL("data.tfrecord.label", "string", "required", "a feature's name",
                  "The label: a feature of exactly one float32 or int64 value (bad when missing)."),
        K_SPECIAL("data.tfrecord.dense", "list of features", "[]", "0..128 features",
                  "The record's dense features in order, each as tf.io.FixedLenFeature(shape, dtype, default_value): "
                  "{\"name\", \"dtype\": float32 or int64 (as float), \"shape\": [] (one value) or up to 3 "
                  "dimensions, \"default_value\": a number for a feature missing from a record (none: missing is "
                  "bad)}. A feature with other than the shape's count of values is bad."),
        K_SPECIAL("data.tfrecord.sparse", "list of features", "[]", "0..64 features",
                  "The record's fields in order (field i: model.embeddings[].fields may name it or give i), each as "
                  "tf.io.VarLenFeature(dtype): {\"name\", \"dtype\": int64 (the value is the id) or string (the id "
                  "is records_hash(i, bytes), as Criteo TSV hashes a token: default)}, any number of values, value 1 "
                  "each; missing: no ids."),
        K_SPECIAL("data.tfrecord.image", "object", "none", "{name, dtype, shape [C, H, W]}",
                  "An image after the dense features: dtype string (C*H*W raw bytes, each / 255, as IDX images; "
                  "the default) or float32 (C*H*W floats); bad when missing or of another size. With no dense "
                  "features and no embeddings, model.input may be the shape, for conv2d layers."),
        K_SPECIAL("data.tfrecord.compression", "string", "\"auto\"", "auto, none, gzip, zlib",
                  "As tf.io.TFRecordOptions(compression_type) wrote the files: auto tells none, GZIP and ZLIB apart "
                  "by each file's first bytes."),
        K_SPECIAL("data.tfrecord.max_record_bytes", "integer", "16777216", "[64, 1073741824]",
                  "A longer record is bad (the reader's one record buffer never grows past it)."),
        K_U32("data.csv_features", data.csv_features, 0, 0, 1048576,
              "csv: dense features per line (then model.input must be [that]); 0: the first line's count."),
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
        K_BOOL("training.overlap_push", training.overlap_push, false,
               "workerd, pushes through gRPC: start the next step while this step's push travels, instead of "
               "waiting for its answer. The step then computes with the values answered to the push before "
               "(one step stale in this worker's own updates, as if one more worker ran), and the network's "
               "and psd's time hide behind compute. Off: every step sees its own last update (a single "
               "worker then equals standalone training). Shared-memory pushes are answered in place and "
               "always wait."),
        K_BOOL("training.lr_staircase", training.lr_staircase, false,
               "exponential: decay in whole steps (integer division)."),
        K_U64("training.max_steps", training.max_steps, 1000, 1, 1000000000000, "Training stops when global_step reaches this."),
        K_U32("training.report_every_steps", training.report_every_steps, 50, 1, 1000000,
              "Workers report loss and throughput to the chief every this many local steps."),
        K_U32("training.threads", training.threads, 1, 1, 256, "CPU threads per process: BLAS threads in workerd, server threads in psd."),
        K_U64("training.seed", training.seed, 1, 0, INT64_MAX, "Seed of data shuffling."),
        K_DBL("training.max_gradient_norm", training.max_gradient_norm, 0, 0, false, 1e30, false,
              "Largest L2 norm of the gradients one push carries to one ps shard; a larger push is rejected or "
              "clipped (training.gradient_norm_action). 0: no limit (non-finite gradients are always rejected)."),
        K_ENUM("training.gradient_norm_action", training.gradient_norm_action, "reject", grad_norm_action_names,
               "A push over training.max_gradient_norm: reject (INVALID_ARGUMENT, the model untouched) or clip "
               "(scaled down to the limit, then applied)."),
        K_ENUM("training.mode", training.mode, "async", training_mode_names,
               "async: each push is applied as it comes; sync: each ps shard applies the mean of "
               "training.replicas_to_aggregate gradients per step, computed from its current values, and holds "
               "the pushes until then; ssp: async, but a worker more than training.staleness steps ahead of the "
               "slowest live worker waits (docs/architecture.md)."),
        K_U32("training.replicas_to_aggregate", training.replicas_to_aggregate, 0, 0, 65536,
              "sync: gradients aggregated per step (N). 0: every worker. At most training.total_num_replicas."),
        K_U32("training.total_num_replicas", training.total_num_replicas, 0, 0, 65536,
              "sync: workers taking part, N plus backup workers (N + b): a step needs only the first N of them, so "
              "up to b stragglers or lost workers do not stall it. 0: every worker. At most the cluster's workers."),
        K_U32("training.staleness", training.staleness, 4, 0, 1000000,
              "ssp: how many steps a worker may be ahead of the slowest live worker before it waits (s; 0: lockstep)."),

        K_ENUM("training.sparse_optimizer", training.sparse_optimizer, "adagrad", sparse_optimizer_names,
               "Embedding rows' optimizer on the ps, with per-row state: adagrad (training.initial_accumulator, "
               "training.epsilon), ftrl (FTRL-Proximal, TensorFlow's ApplyFtrlV2) or sgd."),
        K_DBL("training.sparse_learning_rate", training.sparse_learning_rate, 0, 0, false, 10, false,
              "Embedding rows' learning rate; 0: training.learning_rate (and its schedule)."),
        K_DBL("training.ftrl_l1", training.ftrl_l1, 0, 0, false, 1e6, false, "ftrl: L1 regularization strength."),
        K_DBL("training.ftrl_l2", training.ftrl_l2, 0, 0, false, 1e6, false, "ftrl: L2 regularization strength."),
        K_DBL("training.ftrl_beta", training.ftrl_beta, 0, 0, false, 1e6, false,
              "ftrl: beta, added to the square root of the accumulator (TensorFlow's beta)."),
        K_DBL("training.ftrl_lr_power", training.ftrl_lr_power, -0.5, -10, false, 0, false,
              "ftrl: the power of the accumulator the learning rate is divided by (-0.5: its square root)."),

        K_STR("supervisor.checkpoint_dir", supervisor.checkpoint_dir, "checkpoints",
              "Where chiefd writes checkpoints; a relative path is under STATE_DIR/JOB/.", .check = check_state_path),
        K_STR("supervisor.summary_dir", supervisor.summary_dir, "summaries",
              "Where chiefd writes TensorBoard summaries; a relative path is under STATE_DIR/JOB/.",
              .check = check_state_path),
        K_U64("supervisor.save_checkpoint_steps", supervisor.save_checkpoint_steps, 0, 0, INT64_MAX,
              "Save a checkpoint every this many global steps; 0: off."),
        K_U64("supervisor.save_checkpoint_secs", supervisor.save_checkpoint_secs, 600, 0, 31536000,
              "Save a checkpoint every this many seconds; 0: off."),
        K_U32("supervisor.keep_checkpoints", supervisor.keep_checkpoints, 5, 1, 1000,
              "How many recent checkpoints to keep."),
        K_U32("supervisor.full_checkpoint_every", supervisor.full_checkpoint_every, 1, 1, 1000,
              "Every this many checkpoints one is full; those between hold only the embedding rows changed and the ids evicted since the previous checkpoint, chained to it (docs/checkpoints.md). 1: every checkpoint is full."),
        K_U64("supervisor.save_summaries_secs", supervisor.save_summaries_secs, 10, 0, 31536000,
              "Write summaries every this many seconds; 0: off."),
        K_U64("supervisor.eval_every_steps", supervisor.eval_every_steps, 0, 0, INT64_MAX,
              "Evaluate on the test set every this many global steps; 0: only at the end. Off when the cluster "
              "has an evaluator (cluster.evaluator), which evaluates each checkpoint instead."),
        K_U64("supervisor.ready_timeout_secs", supervisor.ready_timeout_secs, 600, 1, 86400,
              "How long a worker waits for the job to become ready before failing; also the deadline of every wait of the chief (for the shards, a lost shard, the workers), past which the job is FAILED."),
        K_U64("supervisor.worker_timeout_secs", supervisor.worker_timeout_secs, 60, 1, 86400,
              "A worker that reported within this many seconds is live; the others are listed as missing."),
        K_U32("supervisor.keep_corrupt", supervisor.keep_corrupt, 3, 0, 1000,
              "How many corrupt checkpoint files (moved aside to .corrupt) to keep; the oldest are removed."),
        K_U64("supervisor.test_checkpoint_delay_ms", supervisor.test_checkpoint_delay_ms, 0, 0, 600000,
              "Test hook, chiefd only (tests/integration/test_checkpoint_crash.py): every checkpoint write sleeps "
              "this many milliseconds before its rename and again before its record, logged as a warning at "
              "start; 0: off. Never set it outside tests.", .env = "PSFLEET_TEST_CHECKPOINT_DELAY_MS"),
        K_ENUM("supervisor.recovery", supervisor.recovery, "job", recovery_names,
               "What chiefd restores when a psd loses its variables (docs/checkpoints.md): job, every shard "
               "from the newest checkpoint and global_step back to its step; shard, only the lost shard from "
               "it, the other shards and global_step left as they are (that shard's values are then older "
               "than the rest)."),

        K_U32("ps.replicas", ps.replicas, 1, 1, 2,
              "Copies of each shard: 2 gives every shard a backup psd (cluster.ps_backup[i], the same order as "
              "cluster.ps) to which its primary forwards every update before answering the push; the chief "
              "promotes the backup when the primary is lost (docs/operations.md, \"Replicated shards\")."),
        K_U64("ps.replica_timeout_ms", ps.replica_timeout_ms, 2000, 10, 600000,
              "ps.replicas 2: a backup that has not acknowledged a forwarded update within this many "
              "milliseconds is dropped with a warning, and the shard runs unreplicated until it rejoins."),
        K_ENUM("ps.replica_transport", ps.replica_transport, "auto", replica_transport_names,
               "ps.replicas 2: how a primary forwards its updates to its backup. auto: through a ring in shared "
               "memory when the backup runs on the same host (found by its replica socket in rpc.runtime_dir; "
               "a published update lives in the backup's memory, so the push is answered without a round "
               "trip), else through Replicate calls; grpc: always through Replicate calls. Shards with "
               "embedding tables always use Replicate calls."),
        K_U64("ps.failover_ms", ps.failover_ms, 1000, 50, 600000,
              "ps.replicas 2: the chief promotes a shard's backup once its primary has not answered for this many "
              "milliseconds; the workers switch to it within as long again."),
        K_U64("ps.split_bytes", ps.split_bytes, 262144, 4096, INT64_MAX,
              "Variables larger than this are split into row ranges: spread over the ps shards, and pushed a block at a time so transfer overlaps compute."),
        K_U64("ps.memory_limit_bytes", ps.memory_limit_bytes, 0, 0, INT64_MAX,
              "The memory each psd may use for its variables, optimizer slots and tables (psfleet plan shows "
              "the parts); the embedding tables get what the dense variables and the buffers leave, and evict "
              "by their evict_policy at that bound. Less than the dense part alone: psd and psfleet check exit "
              "78. 0: no limit."),
        K_STR("ps.disk_tier_dir", ps.disk_tier_dir, "tier",
              "Where psd keeps the disk tier of tables with disk_tier: DIR/ps-N/table-E (a shard's backup psd "
              "under ps.replicas 2: DIR/ps-N-backup/table-E), wiped when psd starts (the shard is restored from "
              "checkpoints, or its primary's state transfer, as any shard). A relative path is under "
              "STATE_DIR/JOB/.",
              .check = check_state_path),
        K_U64("ps.stop_grace_secs", ps.stop_grace_secs, 20, 0, 600,
              "psd, on SIGTERM: keeps serving for up to this many seconds until the chief's Stop arrives (or the chief is gone), so a "
              "chief stopping at the same moment can pull for its final checkpoint; a second SIGTERM ends it at "
              "once. Keep it below the unit's TimeoutStopSec. Each node decides for itself."),

        K_U64("rpc.deadline_ms", rpc.deadline_ms, 30000, 1, 3600000, "Deadline of each RPC, in milliseconds."),
        K_BOOL("rpc.shared_memory", rpc.shared_memory, true,
               "A workerd and a psd on the same host move tensors through shared memory instead of loopback "
               "gRPC (every other call stays gRPC). Each node decides for itself."),
        K_U64("rpc.initial_reconnect_backoff_ms", rpc.initial_reconnect_backoff_ms, 100, 1, 3600000,
              "gRPC channels: first wait before reconnecting to a peer that is down, in milliseconds. Each "
              "node decides for itself.", .env = "PSFLEET_RPC_INITIAL_RECONNECT_BACKOFF_MS"),
        K_U64("rpc.max_reconnect_backoff_ms", rpc.max_reconnect_backoff_ms, 1000, 1, 3600000,
              "gRPC channels: longest wait between reconnection attempts, in milliseconds (gRPC's own default is "
              "two minutes: a psd restarted by systemd would be noticed that late).",
              .env = "PSFLEET_RPC_MAX_RECONNECT_BACKOFF_MS"),
        K_ENUM("rpc.wire_dtype", rpc.wire_dtype, "float32", wire_dtype_names,
               "workerd: the number format of its gradients pushed through gRPC and of the fresh values psd "
               "answers with. bfloat16 halves the bytes (the upper half of each float32, rounded to nearest "
               "even); psd keeps and updates float32 either way, and the worker computes with the values as "
               "received. Shared memory, pulls and checkpoints stay float32. Each worker decides for itself "
               "(psd answers in the format it was pushed). The older spelling of rpc.compression bf16, which "
               "it implies."),
        K_STR("rpc.compression", rpc.compression, "auto",
              "workerd: how its gradients pushed through gRPC travel, and the fresh values psd answers with. "
              "auto: int8 to a shard beyond loopback (its psd, or its backup, on another host) and through "
              "mutual TLS (where every byte is also encrypted), none over plain TCP on loopback "
              "(docs/performance.md, \"Compression\"); the shared-memory path is never compressed; none: float32; bf16: bfloat16 both ways (as rpc.wire_dtype bfloat16); int8: per block of 256 "
              "values one float32 scale (max|x|/127) and the values rounded to int8 (0.254 of float32's "
              "bytes); topk:R: per block of 256 values only the largest-magnitude ceil(R x 256) as "
              "index+value pairs (5 bytes each; topk:0.01 sends 3 per block; with several asynchronous "
              "workers keep R at 0.1 or more, which stays within 0.5 points of float32's accuracy where 0.01 "
              "loses 1.4: docs/performance.md). int8 and topk keep what they "
              "drop in a per-variable residual on the worker and add it to the next gradient (error "
              "feedback), and apply only to variables of at least rpc.compression_min_bytes; psd answers "
              "int8 with int8 changes to the values the worker holds, keeping a copy of them per worker (the "
              "first answer, and any after the worker's values were replaced, whole in float32), so what an "
              "answer drops goes out with the next; topk, and int8 with training.overlap_push, in bfloat16. "
              "Shared memory, pulls "
              "and checkpoints stay float32. Each worker decides for itself.", .check = check_compression),
        K_U64("rpc.compression_min_bytes", rpc.compression_min_bytes, 4096, 0, 1ll << 40,
              "workerd, rpc.compression int8 or topk: variables smaller than this many float32 bytes (biases, "
              "small layers) are pushed uncompressed in float32, where a block scale or a few top values "
              "would cost more than they save. Each worker decides for itself."),
        K_STR("rpc.runtime_dir", rpc.runtime_dir, "/run/psfleet",
              "Directory of psd's unix sockets, where workers on the same host attach shared memory (the "
              "units' RuntimeDirectory). Each node decides for itself.", .env = "PSFLEET_RUNTIME_DIR"),

        K_ENUM("security.mode", security.mode, "auto", security_mode_names,
               "mtls: every gRPC port speaks mutual TLS and every call is authorized by the peer's certificate "
               "(docs/security.md); insecure: plain TCP, any caller may call anything (a warning at every start); "
               "auto: mtls, with the job's own CA and certificates made in security.auto_dir when every endpoint "
               "of the cluster is loopback, else with security.ca/cert/key. Each node decides for itself."),
        K_STR("security.ca", security.ca, "/etc/psfleet/tls/{job}/ca.crt",
              "mtls: the cluster CA's certificate (PEM); {job} is the job name."),
        K_STR("security.cert", security.cert, "/etc/psfleet/tls/{job}/{task}.crt",
              "mtls: this task's certificate (PEM), issued by psfleet certs; {task} is chief, ps-N, worker-N "
              "(the daemons), admin or viewer (psfleet's commands, --identity)."),
        K_STR("security.key", security.key, "/etc/psfleet/tls/{job}/{task}.key",
              "mtls: this task's private key (PEM), readable by the psfleet group only."),
        K_STR("security.auto_dir", security.auto_dir, "/var/lib/psfleet/tls/{job}",
              "auto on a job whose every endpoint is loopback: the directory (0700, the job's user's) where the "
              "first daemon to start makes the job's CA and each task's key and certificate (0600), and where "
              "psfleet's commands find the admin's; psfleet local puts it in its state directory. {job} is the "
              "job name."),
        K_BOOL("security.allow_insecure", security.allow_insecure, false,
               "Accept security.mode insecure although some endpoint is beyond loopback (anyone who reaches a "
               "port then owns the job); logs a warning at every start."),

        K_STR("metrics.listen", metrics.listen, "",
              "HOST:PORT where the daemon serves Prometheus metrics at /metrics (docs/operations.md, \"Metrics\"); "
              "empty: off. Beyond loopback only when the job runs insecure with security.allow_insecure (no TLS for "
              "it yet). Each node decides for itself; a node that runs several daemons sets it per daemon through "
              "the environment.", .check = check_metrics_listen, .env = "PSFLEET_METRICS_LISTEN"),

        { .name = "device.device", .type = KT_STRING, FIELD(device.device), .sdef = "auto",
          .check = check_device, .env = "PSFLEET_DEVICE",
          .doc = "Where workers compute: auto, cpu, gpu:N or gpu:N,M,... (GPU ordinals 0..255, at most 16 entries; "
                 "each entry is one replica, so gpu:0,0 runs two replicas that split GPU 0's share)." },
        K_DBL("device.gpu_memory_fraction", device.gpu_memory_fraction, 1.0, 0, true, 1, false,
              "Share of each GPU's memory this job may use.", .env = "PSFLEET_GPU_MEMORY_FRACTION"),
        K_BOOL("device.allow_growth", device.allow_growth, false,
               "Allocate GPU memory as needed instead of all at start.", .env = "PSFLEET_ALLOW_GROWTH"),
        K_BOOL("device.log_device_placement", device.log_device_placement, false,
               "Log which device runs each layer.", .env = "PSFLEET_LOG_DEVICE_PLACEMENT"),
        K_BOOL("device.allow_soft_placement", device.allow_soft_placement, false,
               "An explicit gpu request that cannot be met falls back to the CPU instead of failing.",
               .env = "PSFLEET_ALLOW_SOFT_PLACEMENT"),
        K_BOOL("device.cuda_tf32", device.cuda_tf32, false,
               "Let cuBLAS and cuDNN use TF32 tensor cores (faster, about 3 decimal digits).",
               .env = "PSFLEET_CUDA_TF32"),

        K_STR("log.level", log.level, "info",
              "The least important messages the daemon logs: debug, info, notice, warning or error (also warn, "
              "err, crit, alert, emerg; any case). Each node decides for itself.",
              .check = check_log_level, .env = "PSFLEET_LOG_LEVEL"),
        K_BOOL("log.time", log.time, false,
               "Lines on stderr start with the local time to the microsecond (the journal keeps its own). Each "
               "node decides for itself.", .env = "PSFLEET_LOG_TIME"),
};

const struct config_env_setting cfg_env_settings[] = {
        { "PSFLEET_CONFIG_DIR", KT_STRING, "/etc/psfleet",
          "Daemons started with --instance JOB read DIR/jobs/JOB.json." },
        { "PSFLEET_BIN_DIR", KT_STRING, "next to psfleet, then PATH",
          "Where psfleet local finds psd, workerd and chiefd." },
        { "PSFLEET_CUDA_PLUGIN", KT_STRING, "BINDIR/../lib/psfleet/, then the build tree, then the loader's path",
          "Path of the CUDA backend plugin; empty: never load it (run on the CPU)." },
        { "PSFLEET_TEST_FAKE_NO_GPU", KT_BOOL, "false",
          "Test hook: behave as if no GPU were visible, whatever the plugin finds." },
        { "PSFLEET_TEST_SLOW_STEP_MS", KT_STRING, "unset (0)",
          "Test hook, workerd only (the straggler tests): sleep this many milliseconds (0..10000) after every "
          "step, logged as a warning at start. No job key reaches it; never set it outside tests." },
};
const size_t cfg_n_env_settings = ELEMENTSOF(cfg_env_settings);

const char *const cfg_sections[] = { "cluster", "model", "data", "training", "supervisor", "ps", "rpc", "device", "security", "metrics", "log" };
const size_t cfg_n_keys = ELEMENTSOF(cfg_keys);
const size_t cfg_n_sections = ELEMENTSOF(cfg_sections);

const struct layer_key cfg_layer_keys[] = {
        { "units", BIT(LAYER_DENSE), 1, 1048576, offsetof(struct layer_spec, units) },
        { "filters", BIT(LAYER_CONV2D), 1, 65536, offsetof(struct layer_spec, filters) },
        { "kernel", BIT(LAYER_CONV2D), 1, 64, offsetof(struct layer_spec, kernel) },
        { "pool", BIT(LAYER_MAXPOOL2D), 1, 64, offsetof(struct layer_spec, pool) },
        { "init", BIT(LAYER_DENSE) | BIT(LAYER_CONV2D), 0, 0, offsetof(struct layer_spec, init) },
};
const size_t cfg_n_layer_keys = ELEMENTSOF(cfg_layer_keys);

/* ---- documentation -------------------------------------------------------------------------- */

static void key_docs(const struct config_key *k, char *type, char *def, char *range, size_t len) {
        switch (k->type) {
        case KT_U32:
        case KT_U64:
                snprintf(type, len, "integer");
                snprintf(def, len, "%" PRId64, k->idef);
                cfg_fmt_range(k, range, len);
                break;
        case KT_DOUBLE:
                snprintf(type, len, "number");
                snprintf(def, len, "%g", k->ddef);
                cfg_fmt_range(k, range, len);
                break;
        case KT_BOOL:
                snprintf(type, len, "boolean");
                snprintf(def, len, "%s", k->sdef);
                snprintf(range, len, "true, false");
                break;
        case KT_STRING:
                snprintf(type, len, "string");
                snprintf(def, len, "\"%s\"", k->sdef);
                snprintf(range, len, k->check == check_device       ? "auto, cpu, gpu:N, gpu:N,M,..."
                                     : k->check == check_state_path ? "non-empty; relative: no \"..\" out of STATE_DIR/JOB/"
                                     : k->check == check_log_level  ? "debug, info, notice, warning, error"
                                                                    : "non-empty");
                break;
        case KT_ENUM:
                snprintf(type, len, "string");
                snprintf(def, len, "\"%s\"", k->sdef);
                cfg_join_choices(k->choices, range, len);
                break;
        case KT_SPECIAL:
                snprintf(type, len, "%s", k->type_doc);
                snprintf(def, len, "%s", k->default_doc);
                snprintf(range, len, "%s", k->range_doc);
                break;
        }
}

/* A Markdown table's two header lines, for columns "a|b|c". */
static void md_header(FILE *f, const char *cols) {
        fputs("| ", f);
        for (const char *p = cols; *p; p++) {
                if (*p == '|')
                        fputs(" | ", f);
                else
                        fputc(*p, f);
        }
        fputs(" |\n|", f);
        for (const char *p = cols; p; p = strchr(p + 1, '|'))
                fputs(" --- |", f);
        fputs("\n", f);
}

void config_print_keys(FILE *f, bool markdown) {
        char type[256], def[256], range[256];

        if (markdown)
                md_header(f, "key|type|default|allowed|meaning");
        for (size_t i = 0; i < cfg_n_keys; i++) {
                const struct config_key *k = &cfg_keys[i];

                key_docs(k, type, def, range, sizeof(type));
                if (markdown)
                        fprintf(f, "| `%s` | %s | %s | %s | %s |\n", k->name, type, def, range, k->doc);
                else
                        fprintf(f, "  %-34s %s; %s%s; %s\n  %-34s %s\n", k->name, type,
                                strncmp(def, "required", 8) == 0 ? "" : "default ", def, range, "", k->doc);
        }
}

void config_print_env(FILE *f, bool markdown) {
        static const char bools[] = "0, 1, true, false, yes, no, on, off";
        char type[256], def[256], range[256];

        if (markdown)
                md_header(f, "variable|overrides|type|allowed");
        for (size_t i = 0; i < cfg_n_keys; i++) {
                if (!cfg_keys[i].env)
                        continue;
                key_docs(&cfg_keys[i], type, def, range, sizeof(type));
                fprintf(f, markdown ? "| `%s` | `%s` | %s | %s |\n" : "  %-40s overrides %s (%s; %s)\n", cfg_keys[i].env,
                        cfg_keys[i].name, type, cfg_keys[i].type == KT_BOOL ? bools : range);
        }
        if (markdown) {
                fputs("\n", f);
                md_header(f, "variable|type|default|meaning");
        }
        for (size_t i = 0; i < cfg_n_env_settings; i++) {
                const struct config_env_setting *e = &cfg_env_settings[i];

                snprintf(type, sizeof(type), e->type == KT_BOOL ? "boolean (%s)" : "string", bools);
                fprintf(f, markdown ? "| `%s` | %s | %s | %s |\n" : "  %-40s %s; default %s; %s\n", e->name, type,
                        e->default_doc, e->doc);
        }
}
