/* The keys of sparse models and record data (docs/sparse.md): model.embeddings, the record files'
 * lists, and the checks of the model against data.format, so that a job that cannot read its own
 * records fails at load and not on a worker. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "util.h"

static const char *format_name(enum data_format f) {
        static const char *const names[] = { [DATA_IDX] = "idx", [DATA_LIBSVM] = "libsvm", [DATA_CRITEO] = "criteo",
                                             [DATA_CSV] = "csv", [DATA_TFRECORD] = "tfrecord" };
        return names[f];
}

/* The sparse fields a record of the data has (records.h): tfrecord's are data.tfrecord.sparse; idx has
 * none. */
static uint32_t format_fields(const struct data_config *d) {
        switch (d->format) {
        case DATA_CRITEO: return DATA_CRITEO_FIELDS;
        case DATA_LIBSVM: return 1;
        case DATA_TFRECORD: return d->tfrecord.n_sparse;
        default: return 0;
        }
}

/* ---- data.train_files, data.test_files ------------------------------------------------------ */

static void free_list(char **l, uint32_t n) {
        for (uint32_t i = 0; i < n; i++)
                free(l[i]);
        free(l);
}

void cfg_data_clear(struct data_config *d) {
        free_list(d->train_files, d->n_train_files);
        free_list(d->test_files, d->n_test_files);
        d->train_files = d->test_files = NULL;
        d->n_train_files = d->n_test_files = 0;
}

static int parse_list(const struct ctx *x, const json_t *v, const char *key, char ***ret, uint32_t *n_ret) {
        char k[96];
        size_t n;
        char **l;

        if (!json_is_array(v))
                return cfg_fail_type(x, key, "an array of file names", v);
        n = json_array_size(v);
        if (n > CONFIG_MAX_TASKS * 16)
                return cfg_failf(x, key, "has %zu entries, at most %d", n, CONFIG_MAX_TASKS * 16);
        l = calloc(n ? n : 1, sizeof(*l));
        if (!l)
                return cfg_fail_oom(x);
        for (size_t i = 0; i < n; i++) {
                const json_t *s = json_array_get(v, i);

                snprintf(k, sizeof(k), "%s[%zu]", key, i);
                if (!json_is_string(s) || !*json_string_value(s)) {
                        free_list(l, (uint32_t)i);
                        return json_is_string(s) ? cfg_failf(x, k, "must not be empty")
                                                 : cfg_fail_type(x, k, "a file name", s);
                }
                if (!(l[i] = strdup(json_string_value(s)))) {
                        free_list(l, (uint32_t)i);
                        return cfg_fail_oom(x);
                }
        }
        *ret = l;
        *n_ret = (uint32_t)n;
        return 0;
}

int cfg_parse_data_files(const struct ctx *x, const json_t *data, struct data_config *d) {
        const json_t *tr = data ? json_object_get(data, "train_files") : NULL;
        const json_t *te = data ? json_object_get(data, "test_files") : NULL;
        int r;

        if (d->format == DATA_IDX) {
                if (tr || te)
                        return cfg_failf(x, tr ? "data.train_files" : "data.test_files",
                                         "is for the record formats (data.format libsvm, criteo, csv or tfrecord); idx "
                                         "reads "
                                         "data.train_images and the other IDX files");
                return 0;
        }
        if (!tr)
                return cfg_failf(x, "data.train_files", "missing (required for data.format %s)", format_name(d->format));
        if ((r = parse_list(x, tr, "data.train_files", &d->train_files, &d->n_train_files)) < 0)
                return r;
        if (d->n_train_files == 0)
                return cfg_failf(x, "data.train_files", "must not be empty");
        if (te && (r = parse_list(x, te, "data.test_files", &d->test_files, &d->n_test_files)) < 0)
                return r;
        return 0;
}

/* ---- model.embeddings ----------------------------------------------------------------------- */

static bool name_ok(const char *s) {
        size_t n = strlen(s);

        if (n == 0 || n > 31)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
                      s[i] == '_'))
                        return false;
        return true;
}

/* tfrecord: the index of the sparse feature named s, or -1. */
static int sparse_index(const struct data_config *d, const char *s) {
        for (uint32_t i = 0; d->format == DATA_TFRECORD && i < d->tfrecord.n_sparse; i++)
                if (strcmp(d->tfrecord.sparse[i].name, s) == 0)
                        return (int)i;
        return -1;
}

static int parse_fields(const struct ctx *x, const char *key, const json_t *v, const struct data_config *dc,
                        struct embedding_spec *e) {
        enum data_format f = dc->format;
        uint32_t have = format_fields(dc);
        char k[160], q[160];
        size_t n;

        if (!v || (json_is_string(v) && strcmp(json_string_value(v), "all") == 0)) {
                e->n_fields = have;
                for (uint32_t i = 0; i < have; i++)
                        e->fields[i] = i;
                return 0;
        }
        if (json_is_string(v))
                return cfg_failf(x, key, "%s is not \"all\" or a list of field indices", cfg_quote_json(v, q, sizeof(q)));
        if (!json_is_array(v))
                return cfg_fail_type(x, key, "\"all\" or an array of field indices", v);
        n = json_array_size(v);
        if (n == 0 || n > MODEL_MAX_FIELDS)
                return cfg_failf(x, key, "has %zu fields, 1 to %d", n, MODEL_MAX_FIELDS);
        for (size_t i = 0; i < n; i++) {
                const json_t *d = json_array_get(v, i);
                json_int_t idx;

                snprintf(k, sizeof(k), "%s[%zu]", key, i);
                if (json_is_string(d) && f == DATA_TFRECORD) { /* a field by its feature's name */
                        if ((idx = sparse_index(dc, json_string_value(d))) < 0)
                                return cfg_failf(x, k, "%s is not a feature of data.tfrecord.sparse",
                                                 cfg_quote_json(d, q, sizeof(q)));
                } else if (!json_is_integer(d)) {
                        return cfg_fail_type(x, k, f == DATA_TFRECORD ? "an integer or a sparse feature's name"
                                                                      : "an integer", d);
                } else {
                        idx = json_integer_value(d);
                }
                if (idx < 0 || idx >= have)
                        return have ? cfg_failf(x, k, "%" JSON_INTEGER_FORMAT " is not a field of data.format %s (0..%u)",
                                                idx, format_name(f), have - 1)
                                    : cfg_failf(x, k, "%" JSON_INTEGER_FORMAT " is not a field: data.format %s has none",
                                                idx, format_name(f));
                for (size_t j = 0; j < i; j++)
                        if (e->fields[j] == (uint32_t)idx)
                                return cfg_failf(x, k, "field %" JSON_INTEGER_FORMAT " is listed twice", idx);
                e->fields[i] = (uint32_t)idx;
        }
        e->n_fields = (uint32_t)n;
        return 0;
}

/* An integer member of an embedding in [lo, hi]; absent: def, or "missing" when required. */
static int get_int(const struct ctx *x, const json_t *obj, const char *pre, const char *name, int64_t lo, int64_t hi,
                   bool required, int64_t def, int64_t *ret) {
        const json_t *v = json_object_get(obj, name);
        char key[96];

        snprintf(key, sizeof(key), "%s.%s", pre, name);
        if (!v) {
                *ret = def;
                return required ? cfg_failf(x, key, "missing") : 0;
        }
        if (!json_is_integer(v))
                return cfg_fail_type(x, key, "an integer", v);
        if (json_integer_value(v) < lo || json_integer_value(v) > hi)
                return cfg_failf(x, key, "%" JSON_INTEGER_FORMAT " is out of range [%" PRId64 ", %" PRId64 "]",
                                 json_integer_value(v), lo, hi);
        *ret = json_integer_value(v);
        return 0;
}

static int parse_embedding(const struct ctx *x, size_t idx, const json_t *obj, const struct data_config *f,
                           struct embedding_spec *e) {
        static const char *const known[] = { "name", "fields", "dim", "vocab", "pooling", "init_stddev",
                                             "evict_after_steps", "initializer", "max_rows", "expected_rows",
                                             "admit_after", "evict_policy", "disk_tier" };
        char pre[64], key[96], q[160];
        const char *name;
        const json_t *v;
        int64_t i64;
        int r, pool;

        snprintf(pre, sizeof(pre), "model.embeddings[%zu]", idx);
        if (!json_is_object(obj))
                return cfg_fail_type(x, pre, "an object", obj);
        json_object_foreach((json_t *)obj, name, v) {
                bool ok = false;

                for (size_t i = 0; i < ELEMENTSOF(known); i++)
                        ok = ok || strcmp(name, known[i]) == 0;
                snprintf(key, sizeof(key), "%s.%s", pre, name);
                if (!ok)
                        return cfg_failf(x, key, "unknown key");
        }
        memset(e, 0, sizeof(*e));
        snprintf(key, sizeof(key), "%s.name", pre);
        v = json_object_get(obj, "name");
        if (!v)
                return cfg_failf(x, key, "missing");
        if (!json_is_string(v))
                return cfg_fail_type(x, key, "a string", v);
        if (!name_ok(json_string_value(v)))
                return cfg_failf(x, key, "%s is not [A-Za-z0-9_]{1,31}", cfg_quote_json(v, q, sizeof(q)));
        snprintf(e->name, sizeof(e->name), "%s", json_string_value(v));

        snprintf(key, sizeof(key), "%s.fields", pre);
        if ((r = parse_fields(x, key, json_object_get(obj, "fields"), f, e)) < 0)
                return r;
        if ((v = json_object_get(obj, "initializer"))) {
                snprintf(key, sizeof(key), "%s.initializer", pre);
                if (!json_is_string(v) || !json_string_value(v)[0])
                        return cfg_fail_type(x, key, "an initializer's name", v);
                if (strlen(json_string_value(v)) >= sizeof(e->initializer))
                        return cfg_failf(x, key, "longer than %zu bytes", sizeof(e->initializer) - 1);
                snprintf(e->initializer, sizeof(e->initializer), "%s", json_string_value(v));
        }
        /* a graph's table has the initializer's width unless said */
        if ((r = get_int(x, obj, pre, "dim", 1, 1024, !e->initializer[0], 0, &i64)) < 0)
                return r;
        e->dim = (uint32_t)i64;
        if ((r = get_int(x, obj, pre, "vocab", 0, INT64_MAX, false, 0, &i64)) < 0)
                return r;
        e->vocab = (uint64_t)i64;
        if ((r = get_int(x, obj, pre, "evict_after_steps", 0, INT64_MAX, false, 0, &i64)) < 0)
                return r;
        e->evict_after_steps = (uint64_t)i64;
        if ((r = get_int(x, obj, pre, "max_rows", 0, INT64_MAX, false, 0, &i64)) < 0)
                return r;
        e->max_rows = (uint64_t)i64;
        if ((r = get_int(x, obj, pre, "expected_rows", 0, INT64_MAX, false, 0, &i64)) < 0)
                return r;
        e->expected_rows = (uint64_t)i64;
        if ((r = get_int(x, obj, pre, "admit_after", 0, 255, false, 0, &i64)) < 0)
                return r;
        e->admit_after = (uint32_t)i64;
        e->evict_policy = SPARSE_EVICT_AGE;
        if ((v = json_object_get(obj, "evict_policy"))) {
                int pol;
                snprintf(key, sizeof(key), "%s.evict_policy", pre);
                if ((r = cfg_parse_choice(x, key, cfg_evict_policy_names, v, &pol)) < 0)
                        return r;
                e->evict_policy = (enum sparse_evict_policy)pol;
        }
        if ((v = json_object_get(obj, "disk_tier"))) {
                snprintf(key, sizeof(key), "%s.disk_tier", pre);
                if (!json_is_boolean(v))
                        return cfg_fail_type(x, key, "true or false", v);
                e->disk_tier = json_is_true(v);
        }

        e->pooling = POOL_SUM;
        if ((v = json_object_get(obj, "pooling"))) {
                snprintf(key, sizeof(key), "%s.pooling", pre);
                if ((r = cfg_parse_choice(x, key, cfg_pooling_names, v, &pool)) < 0)
                        return r;
                e->pooling = (enum embedding_pooling)pool;
        }
        e->init_stddev = e->dim ? 1.0 / sqrt((double)e->dim) : -1.0; /* -1: 1/sqrt(dim), dim from the graph */
        if ((v = json_object_get(obj, "init_stddev"))) {
                snprintf(key, sizeof(key), "%s.init_stddev", pre);
                if (!json_is_number(v))
                        return cfg_fail_type(x, key, "a number", v);
                if (!(json_number_value(v) >= 0 && json_number_value(v) <= 1000)) {
                        if (json_is_integer(v))
                                snprintf(q, sizeof(q), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
                        else
                                cfg_fmt_double(json_number_value(v), q, sizeof(q));
                        return cfg_failf(x, key, "%s is out of range [0, 1000]", q);
                }
                e->init_stddev = json_number_value(v);
        }
        return 0;
}

int cfg_parse_embeddings(const struct ctx *x, const json_t *v, const struct data_config *d, struct model_spec *m) {
        enum data_format f = d->format;
        size_t n;
        int r;

        m->n_embeddings = 0;
        if (!v)
                return 0;
        if (!json_is_array(v))
                return cfg_fail_type(x, "model.embeddings", "an array of tables", v);
        n = json_array_size(v);
        if (n == 0)
                return 0;
        if (format_fields(d) == 0)
                return cfg_failf(x, "model.embeddings", "need a record format with sparse fields (data.format "
                                 "libsvm, criteo, or tfrecord with data.tfrecord.sparse); data.format %s has none",
                                 format_name(f));
        if (n > MODEL_MAX_EMBEDDINGS)
                return cfg_failf(x, "model.embeddings", "has %zu tables, at most %d", n, MODEL_MAX_EMBEDDINGS);
        for (size_t i = 0; i < n; i++) {
                if ((r = parse_embedding(x, i, json_array_get(v, i), d, &m->emb[i])) < 0)
                        return r;
                for (size_t j = 0; j < i; j++)
                        if (strcmp(m->emb[j].name, m->emb[i].name) == 0) {
                                char key[64];

                                snprintf(key, sizeof(key), "model.embeddings[%zu].name", i);
                                return cfg_failf(x, key, "\"%s\" is also model.embeddings[%zu]'s name", m->emb[i].name, j);
                        }
        }
        m->n_embeddings = (uint32_t)n;
        return 0;
}

/* Each shard holds max_rows / n_ps rows of a bounded table, at least one per lock stripe (64,
 * sparse_table.h's SPARSE_MIN_MAX_ROWS). */
int cfg_check_table_bounds(const struct ctx *x, const struct job_config *c) {
        const struct model_spec *m = &c->model;
        uint64_t n_ps = c->cluster.n_ps ? c->cluster.n_ps : 1;
        char key[64];

        for (uint32_t e = 0; e < m->n_embeddings; e++) {
                const struct embedding_spec *es = &m->emb[e];
                snprintf(key, sizeof(key), "model.embeddings[%u].max_rows", e);
                if (es->max_rows && es->max_rows / n_ps < 64)
                        return cfg_failf(x, key, "%" PRIu64 " is too small: each ps shard holds max_rows / %" PRIu64
                                         " (cluster.ps) rows, at least 64 (0: no bound)", es->max_rows, n_ps);
                /* the tier holds what DRAM's bound leaves out: without a bound nothing would go there */
                snprintf(key, sizeof(key), "model.embeddings[%u].disk_tier", e);
                if (es->disk_tier && !es->max_rows && !c->ps.memory_limit_bytes)
                        return cfg_failf(x, key, "needs a bound in DRAM: max_rows or ps.memory_limit_bytes");
        }
        return 0;
}

/* ---- the model against the data ------------------------------------------------------------- */

int cfg_check_record_input(const struct ctx *x, const struct job_config *c) {
        const struct model_spec *m = &c->model;
        enum data_format f = c->data.format;
        uint32_t n = m->input[2], want;

        if (f == DATA_IDX)
                return 0;
        if (f == DATA_TFRECORD && c->data.tfrecord.image.name[0] && c->data.tfrecord.n_dense == 0 &&
            m->n_embeddings == 0 && (m->input[0] != 1 || m->input[1] != 1)) {
                /* an image alone may feed a convolutional model as [C, H, W] */
                const uint32_t *sh = c->data.tfrecord.image.shape;
                if (memcmp(m->input, sh, sizeof(m->input)) != 0)
                        return cfg_failf(x, "model.input", "[%u, %u, %u], but data.tfrecord.image.shape is [%u, %u, %u]",
                                         m->input[0], m->input[1], m->input[2], sh[0], sh[1], sh[2]);
                return 0;
        }
        if (m->input[0] != 1 || m->input[1] != 1)
                return cfg_failf(x, "model.input", "must be [N] with data.format %s (N: the dense features of a record)%s",
                                 format_name(f), f == DATA_TFRECORD ? "; [C, H, W] only for an image alone, without "
                                                                      "dense features or embeddings" : "");
        want = f == DATA_CRITEO ? DATA_CRITEO_DENSE : f == DATA_LIBSVM ? 0 : f == DATA_TFRECORD ? tfr_spec_dense(&c->data.tfrecord)
                                                                                            : c->data.csv_features;
        if ((f != DATA_CSV || want) && n != want)
                return cfg_failf(x, "model.input", "[%u], but a record of data.format %s has %u dense features%s", n,
                                 format_name(f), want, f == DATA_CSV ? " (data.csv_features)"
                                                      : f == DATA_TFRECORD ? " (data.tfrecord.dense and image)" : "");
        if (model_spec_dense_input(m) == 0)
                return cfg_failf(x, "model.input", "[0] and no model.embeddings: the model has no input");
        return 0;
}

int cfg_check_head(const struct ctx *x, const struct job_config *c) {
        const struct model_spec *m = &c->model;
        uint32_t last = m->n_layers - 1, units = m->layers[last].units;
        char key[64];

        snprintf(key, sizeof(key), "model.layers[%u].units", last);
        if (m->head == HEAD_SOFTMAX && units < 2)
                return cfg_failf(x, key, "model.head softmax needs at least 2 classes, got %u (a single output: "
                                 "model.head logistic or mse)", units);
        if (m->head != HEAD_SOFTMAX && units != 1)
                return cfg_failf(x, key, "model.head %s needs 1 unit, got %u", m->head == HEAD_LOGISTIC ? "logistic" : "mse",
                                 units);
        if (m->head != HEAD_SOFTMAX && c->data.format == DATA_IDX)
                return cfg_failf(x, "model.head", "%s needs a record format (data.format libsvm, criteo, csv or tfrecord); idx "
                                 "has class labels", m->head == HEAD_LOGISTIC ? "logistic" : "mse");
        return 0;
}
