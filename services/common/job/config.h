/* Job configuration: one JSON file per job (/etc/psfleet/jobs/JOB.json), parsed and validated against
 * one table of keys. The cluster block has TensorFlow's ClusterSpec shape; TF_CONFIG is accepted.
 * Not thread-safe while loading; a loaded config is read-only and may be shared between threads. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>
#include "model_spec.h"

#define CONFIG_EX_CONFIG 78 /* sysexits.h EX_CONFIG: exit code for a bad config */

/* ROLE_EVALUATOR: TF_CONFIG's evaluator, outside the training cluster (chiefd --evaluator). */
enum role { ROLE_CHIEF, ROLE_PS, ROLE_WORKER, ROLE_EVALUATOR };

struct endpoint {
        char host[256];
        uint16_t port;
        char *addr;            /* "host:port" as written */
};

struct cluster {
        struct endpoint *chief, *ps, *worker;
        uint32_t n_chief, n_ps, n_worker;
        /* cluster.ps_backup (ps.replicas 2): ps_backup[i] is the other psd of shard i; 0 entries: none */
        struct endpoint *ps_backup;
        uint32_t n_ps_backup;
        /* cluster.evaluator (at most one): it evaluates the checkpoints, and the chief skips its periodic
         * evaluations. Not part of the fingerprint: it trains nothing. */
        struct endpoint *evaluator;
        uint32_t n_evaluator;
};

enum optimizer_kind { OPT_SGD, OPT_MOMENTUM, OPT_ADAM, OPT_ADAGRAD };
/* Embedding rows' optimizer (sparse_table.h): per-row state, as TensorFlow's sparse applies. */
enum sparse_optimizer { SPARSE_SGD, SPARSE_ADAGRAD, SPARSE_FTRL };
enum lr_schedule { LR_CONSTANT, LR_EXPONENTIAL };
enum grad_norm_action { GRAD_NORM_REJECT, GRAD_NORM_CLIP };
/* How the shards combine the workers' gradients (docs/architecture.md, "Synchronous and bounded-staleness
 * training"). */
enum training_mode { MODE_ASYNC, MODE_SYNC, MODE_SSP };
enum security_mode { SECURITY_AUTO, SECURITY_MTLS, SECURITY_INSECURE };
/* supervisor.recovery: what a lost shard costs (docs/checkpoints.md) */
enum recovery_mode { RECOVERY_JOB, RECOVERY_SHARD };
/* ps.replica_transport: how a primary reaches its backup */
enum replica_transport { REPLICA_TRANSPORT_AUTO, REPLICA_TRANSPORT_GRPC };
enum rpc_wire_dtype { RPC_WIRE_FLOAT32, RPC_WIRE_BFLOAT16 };
/* AUTO: INT8 to a shard beyond loopback or under mutual TLS, NONE over plain TCP on loopback (compress_for_shard) */
enum rpc_compression { RPC_COMPRESS_NONE, RPC_COMPRESS_BF16, RPC_COMPRESS_INT8, RPC_COMPRESS_TOPK, RPC_COMPRESS_AUTO };

struct training_config {
        uint32_t batch_size;
        enum optimizer_kind optimizer;
        double learning_rate;
        double momentum;            /* momentum */
        bool nesterov;
        double beta1, beta2, epsilon; /* adam (epsilon also adagrad) */
        double initial_accumulator; /* adagrad */
        enum lr_schedule lr_schedule;
        double lr_decay_rate;       /* exponential: lr * rate^(step / decay_steps) */
        uint64_t lr_decay_steps;
        bool lr_staircase;
        bool overlap_push;      /* workerd: the next step computes while a gRPC push travels (one step stale) */
        uint64_t max_steps;         /* of global_step */
        uint32_t report_every_steps;
        uint32_t threads;           /* BLAS threads in workerd, server threads in psd */
        uint64_t seed;              /* data shuffling */
        double max_gradient_norm;   /* per push to one shard; 0: no limit */
        enum grad_norm_action gradient_norm_action;
        enum training_mode mode;
        uint32_t replicas_to_aggregate; /* sync: N gradients per step; 0: every worker */
        uint32_t total_num_replicas;    /* sync: N + backups; 0: every worker */
        uint32_t staleness;             /* ssp: how many steps a worker may run ahead of the slowest */
        enum sparse_optimizer sparse_optimizer; /* embedding rows: adagrad, ftrl, sgd */
        double sparse_learning_rate;    /* embedding rows; 0: learning_rate (and its schedule) */
        double ftrl_l1, ftrl_l2, ftrl_beta, ftrl_lr_power;
};

enum data_format { DATA_IDX, DATA_LIBSVM, DATA_CRITEO, DATA_CSV, DATA_TFRECORD };
/* A criteo record: 13 dense features and 26 categorical fields (train/records.h reads them). */
#define DATA_CRITEO_DENSE 13
#define DATA_CRITEO_FIELDS 26
enum bad_lines_action { BAD_LINES_ERROR, BAD_LINES_SKIP };

/* data.format tfrecord: which features of each tf.train.Example a record takes, as tf.io.parse_example
 * takes a spec (docs/data-formats.md, "TFRecord"). */
enum tfr_kind { TFR_FLOAT, TFR_INT64, TFR_BYTES };           /* a Feature's list */
enum tfr_compression { TFR_AUTO, TFR_NONE, TFR_GZIP, TFR_ZLIB }; /* as tf.io.TFRecordOptions writes */
#define TFR_MAX_DENSE 128
#define TFR_MAX_SPARSE 64       /* MODEL_MAX_FIELDS */
#define TFR_NAME_MAX 128
struct tfr_feature {
        char name[TFR_NAME_MAX];
        enum tfr_kind kind;
        uint32_t length;        /* dense, image: the values it must hold (image: the shape's product) */
        bool has_default;       /* dense: a missing feature takes default_value, else it is bad */
        float default_value;
        uint32_t shape[3];      /* image: [C, H, W] */
};
struct tfr_spec {
        struct tfr_feature label;             /* one float or int64 value */
        struct tfr_feature dense[TFR_MAX_DENSE];  /* the record's dense features, in order */
        uint32_t n_dense;
        struct tfr_feature sparse[TFR_MAX_SPARSE]; /* the record's fields, in order */
        uint32_t n_sparse;
        struct tfr_feature image;             /* after the dense ones; image.name[0] == 0: none */
        enum tfr_compression compression;
        uint32_t max_record_bytes;            /* a longer record is bad: the reader's buffer stays bounded */
};
/* The floats a record's dense part holds: every dense feature's length, then the image's. */
uint32_t tfr_spec_dense(const struct tfr_spec *s);

struct data_config {
        char *dir;
        enum data_format format;    /* idx: the image files below; else the record files (records.h) */
        char *train_images, *train_labels, *test_images, *test_labels; /* idx: file names inside dir */
        char **train_files, **test_files; /* libsvm, criteo, csv: file names inside dir (or absolute) */
        uint32_t n_train_files, n_test_files;
        enum bad_lines_action bad_lines;
        uint32_t max_ids_per_example;
        uint32_t csv_features;      /* csv: features per line; 0: the first line's count */
        uint32_t shuffle_buffer;    /* record formats: training records drawn from this many; 0: in order */
        struct tfr_spec tfrecord;   /* tfrecord: the features a record takes */
};

struct supervisor_config {
        char *checkpoint_dir, *summary_dir;  /* relative paths resolve under STATE_DIR/JOB/ */
        uint64_t save_checkpoint_steps;       /* 0: off */
        uint64_t save_checkpoint_secs;        /* 0: off */
        uint32_t keep_checkpoints;
        uint32_t full_checkpoint_every;       /* 1: all full; N: every Nth full, incremental between */
        uint64_t save_summaries_secs;
        uint64_t eval_every_steps;            /* 0: only at the end */
        uint64_t ready_timeout_secs;          /* how long a worker waits for the job to become ready; the
                                               * deadline of the chief's waits too */
        uint64_t worker_timeout_secs;         /* a worker that reported within this is live */
        uint32_t keep_corrupt;                /* .corrupt checkpoint files kept */
        uint64_t test_checkpoint_delay_ms;    /* test hook PSFLEET_TEST_CHECKPOINT_DELAY_MS; 0: off */
        enum recovery_mode recovery;          /* JOB: every shard back to the checkpoint; SHARD: only the lost one */
};

struct ps_config {
        uint32_t replicas;      /* 1, or 2: every shard has a backup psd (cluster.ps_backup) */
        uint64_t replica_timeout_ms;   /* a backup that does not acknowledge within this is dropped */
        enum replica_transport replica_transport;   /* auto: a ring in shared memory to a backup on this host */
        uint64_t failover_ms;   /* the chief promotes a shard's backup once its primary is lost this long */
        uint64_t split_bytes;   /* variables larger than this are split into row ranges */
        uint64_t stop_grace_secs; /* psd on SIGTERM: serves this long for the chief's Stop (its final pull) */
        uint64_t memory_limit_bytes; /* per psd: dense variables, tables, buffers; 0: none (psd_memory.h) */
        char *disk_tier_dir;    /* the tables' disk tier; relative paths resolve under STATE_DIR/JOB/ */
};

struct rpc_config {
        uint64_t deadline_ms;   /* per call */
        bool shared_memory;     /* workerd: pushes to a psd on this host through shared memory */
        uint64_t initial_reconnect_backoff_ms, max_reconnect_backoff_ms; /* gRPC channels */
        char *runtime_dir;      /* psd's unix sockets for shared-memory attach */
        enum rpc_wire_dtype wire_dtype; /* workerd: pushes and their answers through gRPC (older spelling of
                                         * rpc.compression bf16) */
        char *compression;      /* workerd: "auto", "none", "bf16", "int8", "topk:R" as written */
        enum rpc_compression compress;  /* compression parsed, rpc.wire_dtype bfloat16 folded in */
        double topk_ratio;      /* RPC_COMPRESS_TOPK: the share of each block sent, (0, 1) */
        uint64_t compression_min_bytes; /* int8, topk: variables with fewer float32 bytes go uncompressed */
};

/* Per node. ca/cert/key may hold {job} and {task} ("chief", "ps-0", "worker-1", "admin", ...). */
struct security_config {
        enum security_mode mode;   /* AUTO: MTLS, from auto_dir when every endpoint is loopback */
        char *ca, *cert, *key;
        char *auto_dir;            /* AUTO on loopback: the job's own CA and credentials, made at start */
        bool allow_insecure;       /* INSECURE with endpoints beyond loopback (a warning at every start) */
};

/* Per node. */
struct metrics_config {
        char *listen;           /* "HOST:PORT" of /metrics; empty: off */
};

/* Per node: what the daemon's log holds (base/log.h). */
struct log_config {
        char *level;            /* "debug", "info", ... (log_level_from_string) */
        bool time;              /* stderr lines start with the local time */
};

struct device_config {
        char *device;           /* "auto", "cpu", "gpu:N", "gpu:0,1" */
        double gpu_memory_fraction;
        bool allow_growth;
        bool log_device_placement;
        bool allow_soft_placement;  /* an explicit gpu that cannot be had: the CPU instead of failing */
        bool cuda_tf32;             /* cuBLAS and cuDNN may use TF32 */
};

struct job_config {
        char *path;             /* file it was read from, or the origin given for a string */
        char *cluster_origin;   /* where the cluster came from: path, or "TF_CONFIG" */
        char *name;             /* "job" key, else the file's basename without .json */
        struct cluster cluster;
        struct model_spec model;
        struct data_config data;
        struct training_config training;
        struct supervisor_config supervisor;
        struct ps_config ps;
        struct rpc_config rpc;
        struct device_config device;
        struct security_config security;
        struct metrics_config metrics;
        struct log_config log;
};

struct task {
        enum role role;
        uint32_t index;
};

/* sync: the gradients aggregated per step (training.replicas_to_aggregate, 0: every worker). */
static inline uint32_t config_replicas_to_aggregate(const struct job_config *c) {
        return c->training.replicas_to_aggregate ? c->training.replicas_to_aggregate : c->cluster.n_worker;
}
/* sync: the workers taking part, N plus the backups (training.total_num_replicas, 0: every worker). */
static inline uint32_t config_total_num_replicas(const struct job_config *c) {
        return c->training.total_num_replicas ? c->training.total_num_replicas : c->cluster.n_worker;
}
/* Examples one global_step trains on: a sync step is replicas_to_aggregate workers' batches. */
static inline uint64_t config_examples_per_step(const struct job_config *c) {
        return (uint64_t)c->training.batch_size * (c->training.mode == MODE_SYNC ? config_replicas_to_aggregate(c) : 1);
}

/* ---- API ----
 * Error messages: functions that take (err, errlen) write exactly one line there on failure,
 * "ORIGIN: KEY: what is wrong" (ORIGIN is the file path, the origin given, or "TF_CONFIG"), and leave
 * it untouched on success. err may be NULL. Daemons print it and exit with CONFIG_EX_CONFIG. */

/* Reads, parses and validates the job file at path; fills every default. On success returns 0 and
 * stores a new config in *ret (free it with config_free()). On failure returns -ENOENT/-EACCES/-EIO
 * (or another -errno) when the file cannot be read, -EINVAL when it is not valid, -ENOMEM. */
int config_load(const char *path, struct job_config **ret, char *err, size_t errlen);

/* Like config_load(), from a string. origin names it in messages and, when the "job" key is absent,
 * gives the job name (its basename without ".json"). */
int config_load_string(const char *json, const char *origin, struct job_config **ret, char *err,
                       size_t errlen);

/* Frees everything c owns. NULL-safe; returns NULL. */
struct job_config *config_free(struct job_config *c);

/* Parses a task from the command line: role "chief", "ps", "worker" or "evaluator" ("master" means chief) and
 * index_str a whole decimal number that must name a task of the cluster. Returns 0 and fills *ret,
 * or -EINVAL. */
int config_parse_task(const struct job_config *c, const char *role, const char *index_str,
                      struct task *ret, char *err, size_t errlen);

/* Applies a TF_CONFIG value ({"cluster": {...}, "task": {"type": "worker", "index": 1}}). Its
 * cluster, when present, replaces c's (validated like the file's, errors say "TF_CONFIG"). When it
 * has a task, *task_ret gets it and *have_task is set to true, else *have_task is false. NULL or ""
 * is a no-op returning 0. Returns 0 or -EINVAL/-ENOMEM; on failure c is unchanged. task_ret and
 * have_task may be NULL. */
int config_apply_tf_config(struct job_config *c, const char *tf_config_json, struct task *task_ret,
                           bool *have_task, char *err, size_t errlen);

/* The sections every node must agree on (cluster, model, training, ps) as compact JSON with sorted
 * keys and every default filled in. Same config, same bytes. Returns a malloc'd string the caller
 * frees, or NULL when out of memory. */
char *config_canonical_json(const struct job_config *c);

/* FNV-1a 64 of config_canonical_json(c); 0 only when out of memory. */
uint64_t config_fingerprint(const struct job_config *c);

/* Compares two canonical JSON strings (ours and a peer's). Returns 0 when equal; 1 when they differ,
 * writing into buf a message naming the first differing key path (sorted key order) with both values,
 * e.g. "model.layers[1].units: ours 128, theirs 64" or "cluster.worker: ours has 3 entries, theirs 2";
 * -EINVAL when either is not valid JSON. buf may be NULL. */
int config_diff(const char *ours_json, const char *theirs_json, char *buf, size_t len);

/* The endpoint of task t, or NULL when t is not in the cluster. Points into c. */
const struct endpoint *config_endpoint(const struct job_config *c, struct task t);

/* "chief", "ps", "worker", "evaluator"; "unknown" for anything else. Static string. */
const char *role_name(enum role r);

/* Splits a systemd instance name: "fmnist:1" -> "fmnist", 1; "fmnist" -> "fmnist", -1; with backup_ret
 * (psd: ps.replicas 2) also "fmnist:1:backup" -> "fmnist", 1, *backup_ret true (false for the others;
 * without backup_ret that form is -EINVAL). The job name must match [A-Za-z0-9_.-]+ (at most 64
 * characters), the index a whole decimal number <= 2^31-1. Returns 0 and a malloc'd *job_ret the caller
 * frees, or -EINVAL/-ENOMEM. */
int config_parse_instance(const char *instance, char **job_ret, int64_t *index_ret, bool *backup_ret);

/* True when s is a valid job name ([A-Za-z0-9_.-]+, at most 64 characters). */
bool config_job_name_valid(const char *s);

/* Prints every key with its type, default, allowed values and meaning: a plain list for --help, or a
 * Markdown table (docs/configuration.md is generated from it). */
void config_print_keys(FILE *f, bool markdown);

/* ---- environment ----
 * A key with an environment override (PSFLEET_DEVICE for device.device, ...: config_print_env lists
 * them) takes the variable's value, when it is set and not empty, for this node only. The value is
 * parsed as the key's type with the key's bounds: booleans 0|1|true|false|yes|no|on|off, numbers
 * whole, strings through the key's own check. */

/* Applies the overrides of the keys of `section` ("device", "rpc"; NULL: every section) to c. Returns
 * 0, or -EINVAL with "VARIABLE: \"value\" is not ..." in err (c may then hold the overrides before the
 * bad one), or -ENOMEM. */
int config_apply_env(struct job_config *c, const char *section, char *err, size_t errlen);

/* Sets the keys of `section` to their defaults (strings are then malloc'd: config_free frees them, or
 * free them yourself on a job_config of your own). Returns 0 or -ENOMEM. */
int config_section_defaults(struct job_config *c, const char *section);

/* The environment settings that are no job key (PSFLEET_CONFIG_DIR, PSFLEET_BIN_DIR,
 * PSFLEET_CUDA_PLUGIN, test hooks PSFLEET_TEST_*): name must be one of the table's (asserted), so that
 * each is documented. config_env_value returns the value (possibly ""), or NULL when unset;
 * config_env_bool stores false when unset or empty, and returns 0 or -EINVAL with
 * "NAME: \"value\" is not 0, 1, true or false" in err. */
const char *config_env_value(const char *name);
int config_env_bool(const char *name, bool *ret, char *err, size_t errlen);

/* Prints the environment overrides and settings (variable, key or meaning, type, default) as a
 * Markdown table, or a plain list. */
void config_print_env(FILE *f, bool markdown);
