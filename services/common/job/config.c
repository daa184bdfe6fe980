/* Job configuration: a job file parsed and validated against the key table (config_keys.c), and the
 * environment overrides, parsed with the same types and bounds. */
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

#define CONFIG_MAX_FILE (16u << 20)

/* ---- errors --------------------------------------------------------------------------------- */

int cfg_failf(const struct ctx *x, const char *key, const char *fmt, ...) {
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

int cfg_fail_oom(const struct ctx *x) {
        if (x->err && x->errlen > 0)
                snprintf(x->err, x->errlen, "%s: out of memory", x->origin);
        return -ENOMEM;
}

/* Shortest "%g" that reads back as the same double, with ".0" when it would look like an integer. */
void cfg_fmt_double(double d, char *buf, size_t len) {
        snprintf(buf, len, "%.15g", d);
        if (strtod(buf, NULL) != d)
                snprintf(buf, len, "%.17g", d);
        if (!strpbrk(buf, ".eEn") && strlen(buf) + 3 <= len)
                strcat(buf, ".0");
}

/* A JSON value as it appears in the file, for messages: strings quoted and escaped, long values cut. */
const char *cfg_quote_json(const json_t *v, char *buf, size_t len) {
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

const char *cfg_quote_str(const char *s, char *buf, size_t len) {
        json_t *v = json_string(s);
        if (!v) {
                snprintf(buf, len, "\"%s\"", s);
                return buf;
        }
        cfg_quote_json(v, buf, len);
        json_decref(v);
        return buf;
}

/* "string \"x\"", "number 1.5", "boolean true", "array", ... */
const char *cfg_describe(const json_t *v, char *buf, size_t len) {
        static const char *const plain[] = {
                [JSON_OBJECT] = "object", [JSON_ARRAY] = "array", [JSON_TRUE] = "boolean true",
                [JSON_FALSE] = "boolean false", [JSON_NULL] = "null",
        };
        char q[128];

        switch (json_typeof(v)) {
        case JSON_STRING:
                snprintf(buf, len, "string %s", cfg_quote_json(v, q, sizeof(q)));
                break;
        case JSON_INTEGER:
                snprintf(buf, len, "integer %" JSON_INTEGER_FORMAT, json_integer_value(v));
                break;
        case JSON_REAL:
                cfg_fmt_double(json_real_value(v), q, sizeof(q));
                snprintf(buf, len, "number %s", q);
                break;
        default:
                snprintf(buf, len, "%s", plain[json_typeof(v)]);
                break;
        }
        return buf;
}

int cfg_fail_type(const struct ctx *x, const char *key, const char *expected, const json_t *v) {
        char d[160];
        return cfg_failf(x, key, "expected %s, got %s", expected, cfg_describe(v, d, sizeof(d)));
}

void cfg_join_choices(const char *const *choices, char *buf, size_t len) {
        size_t n = 0;

        buf[0] = 0;
        for (size_t i = 0; choices[i] && n < len; i++)
                n += (size_t) snprintf(buf + n, len - n, "%s%s", i ? ", " : "", choices[i]);
}

int cfg_lookup_choice(const char *const *choices, const char *s) {
        for (int i = 0; choices[i]; i++)
                if (strcmp(choices[i], s) == 0)
                        return i;
        return -1;
}

/* ---- generic keys --------------------------------------------------------------------------- */

const struct config_key *cfg_find_key(const char *name) {
        for (size_t i = 0; i < cfg_n_keys; i++)
                if (strcmp(cfg_keys[i].name, name) == 0)
                        return &cfg_keys[i];
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

static int set_default(struct job_config *c, const struct config_key *k) {
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
                return set_string(c, k, k->sdef);
        case KT_ENUM:
                set_enum(c, k, cfg_lookup_choice(k->choices, k->sdef));
                break;
        case KT_SPECIAL:
                break;
        }
        return 0;
}

static int apply_defaults(struct job_config *c) {
        for (size_t i = 0; i < cfg_n_keys; i++)
                if (set_default(c, &cfg_keys[i]) < 0)
                        return -ENOMEM;
        return 0;
}

void cfg_fmt_range(const struct config_key *k, char *buf, size_t len) {
        char lo[64], hi[64];

        if (k->type == KT_DOUBLE) {
                snprintf(lo, sizeof(lo), "%g", k->dmin);
                snprintf(hi, sizeof(hi), "%g", k->dmax);
                snprintf(buf, len, "%c%s, %s%c", k->dmin_open ? '(' : '[', lo, hi, k->dmax_open ? ')' : ']');
        } else
                snprintf(buf, len, "[%" PRId64 ", %" PRId64 "]", k->imin, k->imax);
}

/* A JSON string that must be one of choices (an enum key, a layer's type or init): *ret its index. */
int cfg_parse_choice(const struct ctx *x, const char *key, const char *const *choices, const json_t *v, int *ret) {
        char list[256], q[160];

        if (!json_is_string(v))
                return cfg_fail_type(x, key, "a string", v);
        *ret = cfg_lookup_choice(choices, json_string_value(v));
        if (*ret < 0) {
                cfg_join_choices(choices, list, sizeof(list));
                return cfg_failf(x, key, "%s is not one of %s", cfg_quote_json(v, q, sizeof(q)), list);
        }
        return 0;
}

static int parse_key(const struct ctx *x, struct job_config *c, const struct config_key *k, const json_t *v) {
        char range[96], q[160];

        switch (k->type) {
        case KT_U32:
        case KT_U64: {
                json_int_t i;

                if (!json_is_integer(v))
                        return cfg_fail_type(x, k->name, "an integer", v);
                i = json_integer_value(v);
                if (i < k->imin || i > k->imax) {
                        cfg_fmt_range(k, range, sizeof(range));
                        return cfg_failf(x, k->name, "%" JSON_INTEGER_FORMAT " is out of range %s", i, range);
                }
                set_int(c, k, i);
                return 0;
        }
        case KT_DOUBLE: {
                double d;

                if (!json_is_number(v))
                        return cfg_fail_type(x, k->name, "a number", v);
                d = json_number_value(v);
                if (d < k->dmin || (k->dmin_open && d == k->dmin) || d > k->dmax || (k->dmax_open && d == k->dmax)) {
                        cfg_fmt_range(k, range, sizeof(range));
                        if (json_is_integer(v))
                                snprintf(q, sizeof(q), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
                        else
                                cfg_fmt_double(d, q, sizeof(q));
                        return cfg_failf(x, k->name, "%s is out of range %s", q, range);
                }
                memcpy(field(c, k), &d, sizeof(d));
                return 0;
        }
        case KT_BOOL:
                if (!json_is_boolean(v))
                        return cfg_fail_type(x, k->name, "a boolean (true or false)", v);
                *(bool *) field(c, k) = json_is_true(v);
                return 0;
        case KT_STRING: {
                const char *s;
                char why[160];

                if (!json_is_string(v))
                        return cfg_fail_type(x, k->name, "a string", v);
                s = json_string_value(v);
                if (!*s)
                        return cfg_failf(x, k->name, "must not be empty");
                if (k->check && k->check(s, why, sizeof(why)) < 0)
                        return cfg_failf(x, k->name, "%s %s", cfg_quote_json(v, q, sizeof(q)), why);
                if (set_string(c, k, s) < 0)
                        return cfg_fail_oom(x);
                return 0;
        }
        case KT_ENUM: {
                int i, r = cfg_parse_choice(x, k->name, k->choices, v, &i);

                return r < 0 ? r : set_enum(c, k, i);
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
                return cfg_fail_type(x, section, "an object", obj);
        json_object_foreach((json_t *) obj, name, v) {
                const struct config_key *k;

                snprintf(key, sizeof(key), "%s.%s", section, name);
                k = cfg_find_key(key);
                if (!k || (k->type == KT_SPECIAL && strchr(k->name, '[')))
                        return cfg_failf(x, key, "unknown key");
                if (k->type == KT_SPECIAL)
                        continue;
                r = parse_key(x, c, k, v);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* ---- model ---------------------------------------------------------------------------------- */

/* Shape of the activations flowing between layers: (C, H, W). Flat means (1, 1, N). */
struct shape {
        uint64_t c, h, w;
};

static int parse_layer(const struct ctx *x, size_t idx, const json_t *obj, struct layer_spec *l, struct shape *s) {
        char key[96];
        const json_t *t, *v;
        const char *name;
        int type, r;

        snprintf(key, sizeof(key), "model.layers[%zu]", idx);
        if (!json_is_object(obj))
                return cfg_fail_type(x, key, "an object", obj);
        t = json_object_get(obj, "type");
        snprintf(key, sizeof(key), "model.layers[%zu].type", idx);
        if (!t)
                return cfg_failf(x, key, "missing");
        r = cfg_parse_choice(x, key, cfg_layer_names, t, &type);
        if (r < 0)
                return r;
        memset(l, 0, sizeof(*l));
        l->type = (enum layer_type) type;
        l->init = INIT_DEFAULT;

        json_object_foreach((json_t *) obj, name, v) {
                const struct layer_key *lk = NULL;

                if (strcmp(name, "type") == 0)
                        continue;
                snprintf(key, sizeof(key), "model.layers[%zu].%s", idx, name);
                for (size_t i = 0; i < cfg_n_layer_keys; i++)
                        if (strcmp(cfg_layer_keys[i].name, name) == 0)
                                lk = &cfg_layer_keys[i];
                if (!lk)
                        return cfg_failf(x, key, "unknown key");
                if (!(lk->types & BIT(type)))
                        return cfg_failf(x, key, "not allowed in a %s layer", cfg_layer_names[type]);
                if (strcmp(name, "init") == 0) {
                        int init;

                        r = cfg_parse_choice(x, key, cfg_init_names, v, &init);
                        if (r < 0)
                                return r;
                        l->init = (enum init_kind) init;
                        continue;
                }
                if (!json_is_integer(v))
                        return cfg_fail_type(x, key, "an integer", v);
                if (json_integer_value(v) < lk->min || json_integer_value(v) > lk->max)
                        return cfg_failf(x, key, "%" JSON_INTEGER_FORMAT " is out of range [%" PRId64 ", %" PRId64 "]",
                                     json_integer_value(v), lk->min, lk->max);
                *(uint32_t *) ((char *) l + lk->offset) = (uint32_t) json_integer_value(v);
        }
        for (size_t i = 0; i < cfg_n_layer_keys; i++) {
                const struct layer_key *lk = &cfg_layer_keys[i];
                if ((lk->types & BIT(type)) && lk->min > 0 && !json_object_get(obj, lk->name)) {
                        snprintf(key, sizeof(key), "model.layers[%zu].%s", idx, lk->name);
                        return cfg_failf(x, key, "missing (required in a %s layer)", cfg_layer_names[type]);
                }
        }

        /* Check that the layer fits its input, so that a bad model fails here and not on a worker. */
        snprintf(key, sizeof(key), "model.layers[%zu]", idx);
        switch (l->type) {
        case LAYER_DENSE:
                if (s->c != 1 || s->h != 1)
                        return cfg_failf(x, key, "dense needs a flat input, got (%" PRIu64 ", %" PRIu64 ", %" PRIu64
                                     "); add a flatten layer before it", s->c, s->h, s->w);
                s->w = l->units;
                break;
        case LAYER_CONV2D:
                s->c = l->filters;
                break;
        case LAYER_MAXPOOL2D:
                if (s->h < l->pool || s->w < l->pool)
                        return cfg_failf(x, key, "pool %" PRIu32 " is larger than its input (%" PRIu64 ", %" PRIu64
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
                return cfg_failf(x, key, "output (%" PRIu64 ", %" PRIu64 ", %" PRIu64 ") has more than 2^31 elements",
                             s->c, s->h, s->w);
        return 0;
}

/* obj's member `name` (the key `key` in messages), which must be an array. */
static int get_array(const struct ctx *x, const json_t *obj, const char *name, const char *key, const char *expected,
                     const json_t **ret) {
        const json_t *v = json_object_get(obj, name);
        if (!v)
                return cfg_failf(x, key, "missing");
        if (!json_is_array(v))
                return cfg_fail_type(x, key, expected, v);
        *ret = v;
        return 0;
}

static int parse_model(const struct ctx *x, struct job_config *c, const json_t *obj) {
        const json_t *in = NULL, *layers = NULL;
        struct model_spec *m = &c->model;
        struct shape s;
        size_t n;
        char key[64];
        int r, lo = c->data.format == DATA_IDX ? 1 : 0;

        r = parse_section(x, c, "model", obj);
        if (r < 0)
                return r;

        if ((r = get_array(x, obj, "input", "model.input", "an array of 1 or 3 integers", &in)) < 0)
                return r;
        n = json_array_size(in);
        if (n != 1 && n != 3)
                return cfg_failf(x, "model.input", "expected 1 or 3 dimensions, got %zu", n);
        for (size_t i = 0; i < n; i++) {
                const json_t *d = json_array_get(in, i);

                snprintf(key, sizeof(key), "model.input[%zu]", i);
                if (!json_is_integer(d))
                        return cfg_fail_type(x, key, "an integer", d);
                /* a record may have no dense features (libsvm): its input is then the embeddings' alone */
                if (json_integer_value(d) < lo || json_integer_value(d) > 1048576)
                        return cfg_failf(x, key, "%" JSON_INTEGER_FORMAT " is out of range [%d, 1048576]",
                                     json_integer_value(d), lo);
                m->input[3 - n + i] = (uint32_t) json_integer_value(d);
        }
        if (n == 1)
                m->input[0] = m->input[1] = 1;
        if ((r = cfg_parse_embeddings(x, json_object_get(obj, "embeddings"), c->data.format, m)) < 0 ||
            (r = cfg_check_record_input(x, c)) < 0)
                return r;
        s = (struct shape) { m->input[0], m->input[1], m->input[2] };
        if (m->n_embeddings)  /* the dense layers read the dense features and the pooled rows */
                s = (struct shape) { 1, 1, model_spec_dense_input(m) };
        if (s.c * s.h * s.w > (UINT64_C(1) << 28))
                return cfg_failf(x, "model.input", "%" PRIu64 " elements per example, at most 2^28", s.c * s.h * s.w);

        if ((r = get_array(x, obj, "layers", "model.layers", "an array of layers", &layers)) < 0)
                return r;
        n = json_array_size(layers);
        if (n == 0)
                return cfg_failf(x, "model.layers", "must not be empty");
        if (n > MODEL_MAX_LAYERS)
                return cfg_failf(x, "model.layers", "has %zu layers, at most %d", n, MODEL_MAX_LAYERS);
        for (size_t i = 0; i < n; i++) {
                r = parse_layer(x, i, json_array_get(layers, i), &m->layers[i], &s);
                if (r < 0)
                        return r;
        }
        m->n_layers = (uint32_t) n;
        if (m->layers[n - 1].type != LAYER_DENSE) {
                snprintf(key, sizeof(key), "model.layers[%zu]", n - 1);
                return cfg_failf(x, key, "the last layer must be dense (its units are the number of classes), got %s",
                             cfg_layer_names[m->layers[n - 1].type]);
        }
        return cfg_check_head(x, c);
}
/* ---- load ----------------------------------------------------------------------------------- */

bool config_job_name_valid(const char *s) {
        size_t n;

        if (!s)
                return false;
        n = strlen(s);
        if (n == 0 || n > JOB_NAME_MAX || s[0] == '.')
                return false;
        for (size_t i = 0; i < n; i++)
                if (!cfg_host_char_ok(s[i]))
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
                return cfg_fail_oom(x);
        if (!config_job_name_valid(name)) {
                int r = cfg_failf(x, "job", "missing, and the file name %s is not a valid job name "
                              "([A-Za-z0-9_.-]+, not starting with a dot, at most %d characters)", cfg_quote_str(name, q, sizeof(q)), JOB_NAME_MAX);
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
                return cfg_failf(x, NULL, "expected an object at the top level, got %s", cfg_describe(root, d, sizeof(d)));
        }
        json_object_foreach((json_t *) root, name, v) {
                bool known = strcmp(name, "job") == 0;
                for (size_t i = 0; i < cfg_n_sections; i++)
                        known = known || strcmp(name, cfg_sections[i]) == 0;
                if (!known)
                        return cfg_failf(x, name, "unknown key");
        }

        v = json_object_get(root, "job");
        if (v) {
                char q[160];

                if (!json_is_string(v))
                        return cfg_fail_type(x, "job", "a string", v);
                if (!config_job_name_valid(json_string_value(v)))
                        return cfg_failf(x, "job", "%s is not a valid job name ([A-Za-z0-9_.-]+, not starting with a dot, at most %d characters)",
                                     cfg_quote_json(v, q, sizeof(q)), JOB_NAME_MAX);
                c->name = strdup(json_string_value(v));
                if (!c->name)
                        return cfg_fail_oom(x);
        } else {
                r = name_from_origin(x, &c->name);
                if (r < 0)
                        return r;
        }

        v = json_object_get(root, "cluster");
        if (!v)
                return cfg_failf(x, "cluster", "missing");
        r = cfg_parse_cluster(x, v, &c->cluster);
        if (r < 0)
                return r;

        v = json_object_get(root, "model");
        if (!v)
                return cfg_failf(x, "model", "missing");
        /* the model is checked against data.format (its input, its embeddings' fields): data first */
        for (size_t i = 2; i < cfg_n_sections; i++) {
                const json_t *sv = json_object_get(root, cfg_sections[i]);

                if (sv && (r = parse_section(x, c, cfg_sections[i], sv)) < 0)
                        return r;
        }
        if ((r = cfg_parse_data_files(x, json_object_get(root, "data"), &c->data)) < 0)
                return r;
        return parse_model(x, c, v);
}

int cfg_load_json(const struct ctx *x, const char *buf, size_t len, json_t **ret) {
        json_error_t e;
        json_t *root;

        root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &e);
        if (!root)
                return cfg_failf(x, NULL, "line %d column %d: %s", e.line, e.column, e.text);
        *ret = root;
        return 0;
}

int cfg_check_training(const struct ctx *x, const struct training_config *t, uint32_t n_worker) {
        uint32_t total = t->total_num_replicas ? t->total_num_replicas : n_worker;
        uint32_t n = t->replicas_to_aggregate ? t->replicas_to_aggregate : total;
        /* only sync reads them, but a value that could never work is wrong in any mode: a job switched
         * to sync later should not discover it then */
        if (total > n_worker)
                return cfg_failf(x, "training.total_num_replicas", "%u is more than the cluster's %u worker(s)", total,
                                 n_worker);
        if (n > total)
                return cfg_failf(x, "training.replicas_to_aggregate", "%u is more than training.total_num_replicas "
                                 "(%u%s)", n, total, t->total_num_replicas ? "" : ": every worker");
        /* an overlapped push computes from values one step older than sync and ssp count on */
        if (t->overlap_push && t->mode != MODE_ASYNC)
                return cfg_failf(x, "training.overlap_push", "is for training.mode async only (this job: %s)",
                                 t->mode == MODE_SYNC ? "sync" : "ssp");
        return 0;
}

static int load_buffer(const char *buf, size_t len, const char *origin, struct job_config **ret,
                       char *err, size_t errlen) {
        const struct ctx x = { .origin = origin, .err = err, .errlen = errlen };
        struct job_config *c;
        json_t *root = NULL;
        int r;

        r = cfg_load_json(&x, buf, len, &root);
        if (r < 0)
                return r;
        c = calloc(1, sizeof(*c));
        if (!c) {
                r = cfg_fail_oom(&x);
                goto out;
        }
        c->path = strdup(origin);
        c->cluster_origin = strdup(origin);
        if (!c->path || !c->cluster_origin || apply_defaults(c) < 0) {
                r = cfg_fail_oom(&x);
                goto out;
        }
        r = parse_root(&x, root, c);
        if (r < 0 || (r = cfg_check_training(&x, &c->training, c->cluster.n_worker)) < 0)
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
                return cfg_failf(&x, NULL, "larger than %u bytes", CONFIG_MAX_FILE), -EFBIG;
        if (r < 0) {
                cfg_failf(&x, NULL, "cannot open: %s", strerror(-r));
                return r;
        }
        r = load_buffer(buf, len, path, ret, err, errlen);
        free(buf);
        return r;
}

struct job_config *config_free(struct job_config *c) {
        if (!c)
                return NULL;
        for (size_t i = 0; i < cfg_n_keys; i++)
                if (cfg_keys[i].type == KT_STRING)
                        free(*(char **) field(c, &cfg_keys[i]));
        cfg_cluster_clear(&c->cluster);
        cfg_data_clear(&c->data);
        free(c->path);
        free(c->cluster_origin);
        free(c->name);
        free(c);
        return NULL;
}

/* ---- environment ---------------------------------------------------------------------------- */

static int parse_bool_text(const char *s, bool *ret) {
        static const char *const yes[] = { "1", "true", "yes", "on" }, *const no[] = { "0", "false", "no", "off" };

        for (size_t i = 0; i < ELEMENTSOF(yes); i++) {
                if (strcasecmp(s, yes[i]) == 0) {
                        *ret = true;
                        return 0;
                }
                if (strcasecmp(s, no[i]) == 0) {
                        *ret = false;
                        return 0;
                }
        }
        return -EINVAL;
}

/* The key's value from text, with the same types and bounds as the job file's JSON. */
static int parse_text(const struct ctx *x, struct job_config *c, const struct config_key *k, const char *v) {
        char range[96], q[160], why[160];

        cfg_quote_str(v, q, sizeof(q));
        switch (k->type) {
        case KT_U32:
        case KT_U64: {
                uint64_t u;

                cfg_fmt_range(k, range, sizeof(range));
                if (parse_u64(v, (uint64_t) k->imin, (uint64_t) k->imax, &u) < 0)
                        return cfg_failf(x, NULL, "%s is not an integer in %s", q, range);
                set_int(c, k, (int64_t) u);
                return 0;
        }
        case KT_DOUBLE: {
                char *end;
                double d;

                cfg_fmt_range(k, range, sizeof(range));
                errno = 0;
                d = strtod(v, &end);
                if (errno || end == v || *end || !(d >= k->dmin && d <= k->dmax) || (k->dmin_open && d == k->dmin) ||
                    (k->dmax_open && d == k->dmax))
                        return cfg_failf(x, NULL, "%s is not a number in %s", q, range);
                memcpy(field(c, k), &d, sizeof(d));
                return 0;
        }
        case KT_BOOL:
                if (parse_bool_text(v, (bool *) field(c, k)) < 0)
                        return cfg_failf(x, NULL, "%s is not 0, 1, true or false", q);
                return 0;
        case KT_STRING:
                if (k->check && k->check(v, why, sizeof(why)) < 0)
                        return cfg_failf(x, NULL, "%s %s", q, why);
                return set_string(c, k, v) < 0 ? cfg_fail_oom(x) : 0;
        case KT_ENUM: {
                int i = cfg_lookup_choice(k->choices, v);

                if (i < 0) {
                        cfg_join_choices(k->choices, range, sizeof(range));
                        return cfg_failf(x, NULL, "%s is not one of %s", q, range);
                }
                return set_enum(c, k, i);
        }
        case KT_SPECIAL:
                break;
        }
        assert(!"an override on a special key");
        return -EINVAL;
}

static bool in_section(const struct config_key *k, const char *section) {
        size_t n = section ? strlen(section) : 0;

        return !section || (strncmp(k->name, section, n) == 0 && k->name[n] == '.');
}

int config_apply_env(struct job_config *c, const char *section, char *err, size_t errlen) {
        for (size_t i = 0; i < cfg_n_keys; i++) {
                const struct config_key *k = &cfg_keys[i];
                const struct ctx x = { .origin = k->env, .err = err, .errlen = errlen };
                const char *v;
                int r;

                if (!k->env || !in_section(k, section) || !(v = getenv(k->env)) || !*v)
                        continue;
                r = parse_text(&x, c, k, v);
                if (r < 0)
                        return r;
        }
        return 0;
}

int config_section_defaults(struct job_config *c, const char *section) {
        for (size_t i = 0; i < cfg_n_keys; i++)
                if (in_section(&cfg_keys[i], section) && set_default(c, &cfg_keys[i]) < 0)
                        return -ENOMEM;
        return 0;
}

static const struct config_env_setting *env_setting(const char *name) {
        for (size_t i = 0; i < cfg_n_env_settings; i++)
                if (strcmp(cfg_env_settings[i].name, name) == 0)
                        return &cfg_env_settings[i];
        assert(!"an environment setting missing from the table (config_keys.c)");
        return NULL;
}

const char *config_env_value(const char *name) {
        env_setting(name);
        return getenv(name);
}

int config_env_bool(const char *name, bool *ret, char *err, size_t errlen) {
        const struct ctx x = { .origin = name, .err = err, .errlen = errlen };
        const char *v = config_env_value(name);
        char q[160];

        assert(env_setting(name)->type == KT_BOOL);
        *ret = false;
        if (!v || !*v)
                return 0;
        if (parse_bool_text(v, ret) < 0)
                return cfg_failf(&x, NULL, "%s is not 0, 1, true or false", cfg_quote_str(v, q, sizeof(q)));
        return 0;
}
