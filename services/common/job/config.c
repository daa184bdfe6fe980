/* Job configuration: a job file parsed and validated against the key table (config_keys.c): the
 * messages every config file writes, a key's value from JSON, the top level, loading and freeing. The
 * model section is config_model.c's, the environment config_env.c's. */
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
#include "graph.h"
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

void *cfg_field(struct job_config *c, const struct config_key *k) {
        return (char *) c + k->offset;
}

void cfg_set_int(struct job_config *c, const struct config_key *k, int64_t v) {
        if (k->type == KT_U32) {
                uint32_t u = (uint32_t) v;
                assert(k->size == sizeof(u));
                memcpy(cfg_field(c, k), &u, sizeof(u));
        } else {
                uint64_t u = (uint64_t) v;
                assert(k->size == sizeof(u));
                memcpy(cfg_field(c, k), &u, sizeof(u));
        }
}

int cfg_set_string(struct job_config *c, const struct config_key *k, const char *s) {
        char **p = cfg_field(c, k), *d;

        assert(k->size == sizeof(char *));
        d = strdup(s);
        if (!d)
                return -ENOMEM;
        free(*p);
        *p = d;
        return 0;
}

int cfg_set_enum(struct job_config *c, const struct config_key *k, int v) {
        assert(k->size == sizeof(int));
        memcpy(cfg_field(c, k), &v, sizeof(v));
        return 0;
}

int cfg_set_default(struct job_config *c, const struct config_key *k) {
        switch (k->type) {
        case KT_U32:
        case KT_U64:
                cfg_set_int(c, k, k->idef);
                break;
        case KT_DOUBLE:
                assert(k->size == sizeof(double));
                memcpy(cfg_field(c, k), &k->ddef, sizeof(double));
                break;
        case KT_BOOL:
                assert(k->size == sizeof(bool));
                *(bool *) cfg_field(c, k) = strcmp(k->sdef, "true") == 0;
                break;
        case KT_STRING:
                return cfg_set_string(c, k, k->sdef);
        case KT_ENUM:
                cfg_set_enum(c, k, cfg_lookup_choice(k->choices, k->sdef));
                break;
        case KT_SPECIAL:
                break;
        }
        return 0;
}

static int apply_defaults(struct job_config *c) {
        for (size_t i = 0; i < cfg_n_keys; i++)
                if (cfg_set_default(c, &cfg_keys[i]) < 0)
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
                cfg_set_int(c, k, i);
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
                memcpy(cfg_field(c, k), &d, sizeof(d));
                return 0;
        }
        case KT_BOOL:
                if (!json_is_boolean(v))
                        return cfg_fail_type(x, k->name, "a boolean (true or false)", v);
                *(bool *) cfg_field(c, k) = json_is_true(v);
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
                if (cfg_set_string(c, k, s) < 0)
                        return cfg_fail_oom(x);
                return 0;
        }
        case KT_ENUM: {
                int i, r = cfg_parse_choice(x, k->name, k->choices, v, &i);

                return r < 0 ? r : cfg_set_enum(c, k, i);
        }
        case KT_SPECIAL:
                break;
        }
        assert(!"parse_key on a special key");
        return -EINVAL;
}

int cfg_parse_section(const struct ctx *x, struct job_config *c, const char *section, const json_t *obj) {
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
                /* a special key's members ("data.tfrecord.label") are its parser's, not keys of the section */
                if (!k || (k->type == KT_SPECIAL && (strchr(k->name, '[') || strchr(name, '.'))))
                        return cfg_failf(x, key, "unknown key");
                if (k->type == KT_SPECIAL)
                        continue;
                r = parse_key(x, c, k, v);
                if (r < 0)
                        return r;
        }
        return 0;
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

                if (sv && (r = cfg_parse_section(x, c, cfg_sections[i], sv)) < 0)
                        return r;
        }
        if ((r = cfg_parse_data_files(x, json_object_get(root, "data"), &c->data)) < 0 ||
            (r = cfg_parse_tfrecord(x, json_object_get(root, "data"), &c->data)) < 0)
                return r;
        return cfg_parse_model(x, c, v);
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

int cfg_check_replicas(const struct ctx *x, const struct job_config *c) {
        if (c->ps.replicas > 1 && c->cluster.n_ps_backup == 0)
                return cfg_failf(x, "ps.replicas", "is %u, but cluster.ps_backup lists no backup psd", c->ps.replicas);
        if (c->ps.replicas == 1 && c->cluster.n_ps_backup)
                return cfg_failf(x, "cluster.ps_backup", "lists backups, but ps.replicas is 1 (set it to 2 to use them)");
        return 0;
}

/* rpc.compression parsed (its syntax checked by the table), rpc.wire_dtype bfloat16 folded in: the
 * older key means bf16, and set beside another compression it is a contradiction. */
int cfg_check_rpc(const struct ctx *x, struct rpc_config *rpc) {
        char why[200];
        if (cfg_parse_compression(rpc->compression, &rpc->compress, &rpc->topk_ratio, why, sizeof(why)) < 0)
                return cfg_failf(x, "rpc.compression", "\"%s\" %s", rpc->compression, why);
        if (rpc->wire_dtype == RPC_WIRE_BFLOAT16) {
                if (rpc->compress != RPC_COMPRESS_NONE && rpc->compress != RPC_COMPRESS_BF16 &&
                    rpc->compress != RPC_COMPRESS_AUTO)
                        return cfg_failf(x, "rpc.wire_dtype", "bfloat16 contradicts rpc.compression \"%s\" (rpc.wire_dtype "
                                         "bfloat16 is the older spelling of rpc.compression bf16: set only one)",
                                         rpc->compression);
                rpc->compress = RPC_COMPRESS_BF16;
        }
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
        if (r < 0 || (r = cfg_check_training(&x, &c->training, c->cluster.n_worker)) < 0 ||
            (r = cfg_check_replicas(&x, c)) < 0 || (r = cfg_check_rpc(&x, &c->rpc)) < 0)
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
                        free(*(char **) cfg_field(c, &cfg_keys[i]));
        cfg_cluster_clear(&c->cluster);
        cfg_data_clear(&c->data);
        graph_free(c->model.graph);
        for (uint32_t e = 0; e < c->model.n_embeddings; e++)
                free((void *)c->model.emb[e].init_rows);
        free(c->model.onnx_path);
        free(c->path);
        free(c->cluster_origin);
        free(c->name);
        free(c);
        return NULL;
}
