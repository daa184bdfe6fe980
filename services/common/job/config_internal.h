/* What the config files share and nobody else sees: the key table's shape, the helpers that write
 * messages, and the parsers one file uses from another. config_keys.c holds the table (data),
 * config.c parses and validates a job file by the table, config_model.c its model section,
 * config_sparse.c the sparse and record-data keys, config_cluster.c the cluster, tasks and TF_CONFIG,
 * config_env.c the environment, config_canonical.c the canonical form every node compares. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define CONFIG_MAX_TASKS 4096
#define JOB_NAME_MAX 64

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
        const char *env;              /* environment override for this node, or NULL */
};

extern const struct config_key cfg_keys[];
extern const size_t cfg_n_keys;
/* The top-level sections, "cluster" and "model" first (parsed by hand), the rest by the table. */
extern const char *const cfg_sections[];
extern const size_t cfg_n_sections;
extern const char *const cfg_layer_names[], *const cfg_init_names[], *const cfg_pooling_names[];

#define BIT(t) (1u << (t))

/* The keys of one layer, with the layer types that take each. */
struct layer_key {
        const char *name;
        unsigned types;         /* bit per enum layer_type that takes this key */
        int64_t min, max;       /* integers */
        size_t offset;          /* in struct layer_spec */
};
extern const struct layer_key cfg_layer_keys[];
extern const size_t cfg_n_layer_keys;

/* Environment settings that are no job key (directories, the plugin, test hooks): in the table too, so
 * that they are typed, read in one way and documented with the overrides. */
struct config_env_setting {
        const char *name;
        enum key_type type;           /* KT_STRING (empty allowed) or KT_BOOL */
        const char *default_doc, *doc;
};
extern const struct config_env_setting cfg_env_settings[];
extern const size_t cfg_n_env_settings;

const struct config_key *cfg_find_key(const char *name);

/* rpc.compression: "none", "bf16", "int8" or "topk:R" with R in (0, 1). 0 with the kind and R (0 but
 * for topk), or -EINVAL with why. */
int cfg_parse_compression(const char *s, enum rpc_compression *kind, double *ratio, char *why, size_t whylen);

/* Where messages go: "ORIGIN: KEY: message". */
struct ctx {
        const char *origin;
        char *err;
        size_t errlen;
};

/* Writes "origin: key: message" (key may be NULL) and returns -EINVAL. */
__attribute__((format(printf, 3, 4)))
int cfg_failf(const struct ctx *x, const char *key, const char *fmt, ...);
int cfg_fail_oom(const struct ctx *x);
int cfg_fail_type(const struct ctx *x, const char *key, const char *expected, const json_t *v);
void cfg_fmt_double(double d, char *buf, size_t len);
void cfg_fmt_range(const struct config_key *k, char *buf, size_t len);
const char *cfg_quote_json(const json_t *v, char *buf, size_t len);
const char *cfg_quote_str(const char *s, char *buf, size_t len);
const char *cfg_describe(const json_t *v, char *buf, size_t len);
void cfg_join_choices(const char *const *choices, char *buf, size_t len);
int cfg_lookup_choice(const char *const *choices, const char *s);
/* A JSON string that must be one of choices (an enum key, a layer's type or init): *ret its index. */
int cfg_parse_choice(const struct ctx *x, const char *key, const char *const *choices, const json_t *v, int *ret);
int cfg_load_json(const struct ctx *x, const char *buf, size_t len, json_t **ret);
/* The training.mode keys against each other and the cluster's n_worker workers: 0, or -EINVAL naming
 * the key. */
/* ps.replicas against cluster.ps_backup: replicas without backups, or backups without replicas. */
int cfg_check_replicas(const struct ctx *x, const struct job_config *c);
int cfg_check_rpc(const struct ctx *x, struct rpc_config *rpc);
int cfg_check_training(const struct ctx *x, const struct training_config *t, uint32_t n_worker);

/* A key's field in c, and setting it (strings copied: -ENOMEM) or to the key's default. */
void *cfg_field(struct job_config *c, const struct config_key *k);
void cfg_set_int(struct job_config *c, const struct config_key *k, int64_t v);
int cfg_set_string(struct job_config *c, const struct config_key *k, const char *s);
int cfg_set_enum(struct job_config *c, const struct config_key *k, int v);
int cfg_set_default(struct job_config *c, const struct config_key *k);
/* A section object whose keys are all in the table, into c; the special keys are skipped (the caller
 * parses them). */
int cfg_parse_section(const struct ctx *x, struct job_config *c, const char *section, const json_t *obj);

/* config_model.c: the model section (after data.format is known). */
int cfg_parse_model(const struct ctx *x, struct job_config *c, const json_t *obj);

/* config_onnx.c: model.onnx and model.inputs (the model section's other keys, embeddings included,
 * parsed already): loads the graph into c->model. */
int cfg_parse_onnx(const struct ctx *x, struct job_config *c, const json_t *obj);

/* config_cluster.c */
bool cfg_host_char_ok(char ch);
void cfg_cluster_clear(struct cluster *cl);
int cfg_parse_cluster(const struct ctx *x, const json_t *obj, struct cluster *ret);

/* config_sparse.c: the keys of sparse models and record data, all checked against data.format (parsed
 * before the model). Each returns 0, or -EINVAL naming the key (-ENOMEM). */
/* data.train_files and data.test_files of the data section (NULL: none) into d; required with a record
 * format, refused with idx. */
int cfg_parse_data_files(const struct ctx *x, const json_t *data, struct data_config *d);
void cfg_data_clear(struct data_config *d); /* frees the file lists */
/* model.embeddings (NULL: none) into m, every field one that the data has. */
int cfg_parse_embeddings(const struct ctx *x, const json_t *v, const struct data_config *d, struct model_spec *m);
/* config_tfrecord.c: data.tfrecord (the data section's, NULL: none) into d->tfrecord; required with
 * data.format tfrecord, refused with the others. */
int cfg_parse_tfrecord(const struct ctx *x, const json_t *data, struct data_config *d);
extern const char *const cfg_tfr_compression_names[];
/* With a record format: model.input is [N], N the format's dense features, and the model has some input. */
int cfg_check_record_input(const struct ctx *x, const struct job_config *c);
/* model.embeddings[].max_rows against cluster.ps (config_sparse.c). */
int cfg_check_table_bounds(const struct ctx *x, const struct job_config *c);
extern const char *const cfg_evict_policy_names[];
/* The last dense layer's units against model.head, and the head against data.format. */
int cfg_check_head(const struct ctx *x, const struct job_config *c);
