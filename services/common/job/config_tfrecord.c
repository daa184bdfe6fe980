/* data.tfrecord: the feature spec of a job that reads TFRecord files of tf.train.Example, in the shape
 * tf.io.parse_example takes one (a label, FixedLenFeature dense inputs, VarLenFeature sparse fields, an
 * image), checked here so that a spec no record could satisfy fails at load, naming the key. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "config_internal.h"
#include "util.h"

static const char *const dtype_names[] = { [TFR_FLOAT] = "float32", [TFR_INT64] = "int64", [TFR_BYTES] = "string",
                                           NULL };
const char *const cfg_tfr_compression_names[] = { [TFR_AUTO] = "auto", [TFR_NONE] = "none", [TFR_GZIP] = "gzip",
                                                  [TFR_ZLIB] = "zlib", NULL };

uint32_t tfr_spec_dense(const struct tfr_spec *s) {
        uint64_t n = s->image.name[0] ? s->image.length : 0;

        for (uint32_t i = 0; i < s->n_dense; i++)
                n += s->dense[i].length;
        return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* Fails on a member of obj that is not in known (NULL-terminated). */
static int only_known(const struct ctx *x, const char *pre, const json_t *obj, const char *const *known) {
        const char *name;
        json_t *v;
        char key[192];

        json_object_foreach((json_t *)obj, name, v) {
                bool ok = false;

                for (size_t i = 0; known[i]; i++)
                        ok = ok || strcmp(name, known[i]) == 0;
                if (!ok) {
                        snprintf(key, sizeof(key), "%s.%s", pre, name);
                        return cfg_failf(x, key, "unknown key");
                }
        }
        return 0;
}

static int parse_name(const struct ctx *x, const char *key, const json_t *v, char *name) {
        char q[160];

        if (!v)
                return cfg_failf(x, key, "missing");
        if (!json_is_string(v) || !json_string_value(v)[0])
                return cfg_fail_type(x, key, "a feature's name", v);
        if (strlen(json_string_value(v)) >= TFR_NAME_MAX)
                return cfg_failf(x, key, "%s is longer than %d bytes", cfg_quote_json(v, q, sizeof(q)), TFR_NAME_MAX - 1);
        memcpy(name, json_string_value(v), strlen(json_string_value(v)) + 1);
        return 0;
}

/* "dtype": one of the kinds allowed (a bit per enum tfr_kind); absent: def. */
static int parse_dtype(const struct ctx *x, const char *pre, const json_t *obj, unsigned allowed, enum tfr_kind def,
                       enum tfr_kind *ret) {
        char list[32] = "";
        const json_t *v = json_object_get(obj, "dtype");
        char key[192];
        int i, r;

        snprintf(key, sizeof(key), "%s.dtype", pre);
        *ret = def;
        if (!v)
                return 0;
        if ((r = cfg_parse_choice(x, key, dtype_names, v, &i)) < 0)
                return r;
        if (!(allowed & BIT(i))) {
                for (int k = 0; dtype_names[k]; k++)
                        if (allowed & BIT(k))
                                snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", list[0] ? " or " : "",
                                         dtype_names[k]);
                return cfg_failf(x, key, "\"%s\" is not allowed here, only %s", dtype_names[i], list);
        }
        *ret = (enum tfr_kind)i;
        return 0;
}

/* "shape": up to max_dims positive integers (absent or []: one value), their product into *n. */
static int parse_shape(const struct ctx *x, const char *pre, const json_t *obj, size_t min_dims, size_t max_dims,
                       uint32_t *dims, uint32_t *n) {
        const json_t *v = json_object_get(obj, "shape");
        char key[192];
        uint64_t p = 1;
        size_t nd;

        snprintf(key, sizeof(key), "%s.shape", pre);
        if (!v && min_dims)
                return cfg_failf(x, key, "missing");
        nd = v ? json_array_size(v) : 0;
        if (v && (!json_is_array(v) || nd < min_dims || nd > max_dims)) {
                if (!json_is_array(v))
                        return cfg_fail_type(x, key, "an array of dimensions", v);
                return cfg_failf(x, key, "has %zu dimensions, %zu to %zu", nd, min_dims, max_dims);
        }
        for (size_t i = 0; i < nd; i++) {
                const json_t *d = json_array_get(v, i);

                if (!json_is_integer(d) || json_integer_value(d) < 1 || json_integer_value(d) > 1048576) {
                        char k[208];
                        snprintf(k, sizeof(k), "%.180s[%zu]", key, i);
                        return json_is_integer(d) ? cfg_failf(x, k, "%" JSON_INTEGER_FORMAT " is out of range [1, 1048576]",
                                                              json_integer_value(d))
                                                  : cfg_fail_type(x, k, "an integer", d);
                }
                dims[i] = (uint32_t)json_integer_value(d);
                p *= dims[i];
        }
        if (p > 1048576)
                return cfg_failf(x, key, "holds %" PRIu64 " values, at most 1048576", p);
        *n = (uint32_t)p;
        return 0;
}

static int parse_dense(const struct ctx *x, const char *pre, const json_t *obj, struct tfr_feature *f) {
        static const char *const known[] = { "name", "dtype", "shape", "default_value", NULL };
        const json_t *d;
        char key[192];
        int r;

        if (!json_is_object(obj))
                return cfg_fail_type(x, pre, "an object", obj);
        snprintf(key, sizeof(key), "%s.name", pre);
        if ((r = only_known(x, pre, obj, known)) < 0 || (r = parse_name(x, key, json_object_get(obj, "name"), f->name)) < 0 ||
            (r = parse_dtype(x, pre, obj, BIT(TFR_FLOAT) | BIT(TFR_INT64), TFR_FLOAT, &f->kind)) < 0 ||
            (r = parse_shape(x, pre, obj, 0, 3, f->shape, &f->length)) < 0)
                return r;
        if ((d = json_object_get(obj, "default_value"))) {
                snprintf(key, sizeof(key), "%s.default_value", pre);
                if (!json_is_number(d) || !isfinite(json_number_value(d)) || fabs(json_number_value(d)) > 3.4e38)
                        return cfg_fail_type(x, key, "a finite number", d);
                f->has_default = true;
                f->default_value = (float)json_number_value(d);
        }
        return 0;
}

static int parse_sparse(const struct ctx *x, const char *pre, const json_t *obj, struct tfr_feature *f) {
        static const char *const known[] = { "name", "dtype", NULL };
        char key[192];
        int r;

        if (!json_is_object(obj))
                return cfg_fail_type(x, pre, "an object", obj);
        snprintf(key, sizeof(key), "%s.name", pre);
        if ((r = only_known(x, pre, obj, known)) < 0 || (r = parse_name(x, key, json_object_get(obj, "name"), f->name)) < 0)
                return r;
        return parse_dtype(x, pre, obj, BIT(TFR_INT64) | BIT(TFR_BYTES), TFR_BYTES, &f->kind);
}

static int parse_image(const struct ctx *x, const json_t *obj, struct tfr_feature *f) {
        static const char *const known[] = { "name", "dtype", "shape", NULL };
        const char *pre = "data.tfrecord.image";
        int r;

        if (!json_is_object(obj))
                return cfg_fail_type(x, pre, "an object", obj);
        if ((r = only_known(x, pre, obj, known)) < 0 ||
            (r = parse_name(x, "data.tfrecord.image.name", json_object_get(obj, "name"), f->name)) < 0 ||
            (r = parse_dtype(x, pre, obj, BIT(TFR_FLOAT) | BIT(TFR_BYTES), TFR_BYTES, &f->kind)) < 0 ||
            (r = parse_shape(x, pre, obj, 3, 3, f->shape, &f->length)) < 0)
                return r;
        return 0;
}

/* The features' names are distinct: one feature feeds one part of a record. */
static int check_unique(const struct ctx *x, const struct tfr_spec *s) {
        const struct tfr_feature *all[1 + TFR_MAX_DENSE + TFR_MAX_SPARSE + 1];
        char key[4][64];
        uint32_t n = 0;

        all[n++] = &s->label;
        for (uint32_t i = 0; i < s->n_dense; i++)
                all[n++] = &s->dense[i];
        for (uint32_t i = 0; i < s->n_sparse; i++)
                all[n++] = &s->sparse[i];
        if (s->image.name[0])
                all[n++] = &s->image;
        for (uint32_t i = 0; i < n; i++)
                for (uint32_t j = 0; j < i; j++) {
                        if (strcmp(all[i]->name, all[j]->name) != 0)
                                continue;
                        for (int k = 0; k < 2; k++) {
                                uint32_t at = k ? j : i;
                                if (at == 0)
                                        snprintf(key[k], sizeof(key[k]), "data.tfrecord.label");
                                else if (at <= s->n_dense)
                                        snprintf(key[k], sizeof(key[k]), "data.tfrecord.dense[%u].name", at - 1);
                                else if (at <= s->n_dense + s->n_sparse)
                                        snprintf(key[k], sizeof(key[k]), "data.tfrecord.sparse[%u].name",
                                                 at - 1 - s->n_dense);
                                else
                                        snprintf(key[k], sizeof(key[k]), "data.tfrecord.image.name");
                        }
                        return cfg_failf(x, key[0], "\"%s\" is also %s", all[i]->name, key[1]);
                }
        return 0;
}

static int parse_list(const struct ctx *x, const json_t *obj, const char *name, uint32_t max, struct tfr_feature *fs,
                      uint32_t *n_ret, int (*one)(const struct ctx *, const char *, const json_t *, struct tfr_feature *)) {
        const json_t *v = json_object_get(obj, name);
        char key[64], pre[88];
        size_t n;
        int r;

        snprintf(key, sizeof(key), "data.tfrecord.%s", name);
        *n_ret = 0;
        if (!v)
                return 0;
        if (!json_is_array(v))
                return cfg_fail_type(x, key, "an array of features", v);
        n = json_array_size(v);
        if (n > max)
                return cfg_failf(x, key, "has %zu features, at most %u", n, max);
        for (size_t i = 0; i < n; i++) {
                snprintf(pre, sizeof(pre), "%.63s[%zu]", key, i);
                if ((r = one(x, pre, json_array_get(v, i), &fs[i])) < 0)
                        return r;
        }
        *n_ret = (uint32_t)n;
        return 0;
}

int cfg_parse_tfrecord(const struct ctx *x, const json_t *data, struct data_config *d) {
        static const char *const known[] = { "label", "dense", "sparse", "image", "compression", "max_record_bytes",
                                             NULL };
        const json_t *obj = data ? json_object_get(data, "tfrecord") : NULL, *v;
        struct tfr_spec *s = &d->tfrecord;
        json_int_t mb;
        int r, i;

        memset(s, 0, sizeof(*s));
        s->max_record_bytes = 16u << 20;
        if (d->format != DATA_TFRECORD) {
                if (obj)
                        return cfg_failf(x, "data.tfrecord", "is for data.format tfrecord");
                return 0;
        }
        if (!obj)
                return cfg_failf(x, "data.tfrecord", "missing (required for data.format tfrecord: at least its label)");
        if (!json_is_object(obj))
                return cfg_fail_type(x, "data.tfrecord", "an object", obj);
        if ((r = only_known(x, "data.tfrecord", obj, known)) < 0 ||
            (r = parse_name(x, "data.tfrecord.label", json_object_get(obj, "label"), s->label.name)) < 0 ||
            (r = parse_list(x, obj, "dense", TFR_MAX_DENSE, s->dense, &s->n_dense, parse_dense)) < 0 ||
            (r = parse_list(x, obj, "sparse", TFR_MAX_SPARSE, s->sparse, &s->n_sparse, parse_sparse)) < 0)
                return r;
        s->label.length = 1;
        if ((v = json_object_get(obj, "image")) && (r = parse_image(x, v, &s->image)) < 0)
                return r;
        if ((v = json_object_get(obj, "compression"))) {
                if ((r = cfg_parse_choice(x, "data.tfrecord.compression", cfg_tfr_compression_names, v, &i)) < 0)
                        return r;
                s->compression = (enum tfr_compression)i;
        }
        if ((v = json_object_get(obj, "max_record_bytes"))) {
                if (!json_is_integer(v))
                        return cfg_fail_type(x, "data.tfrecord.max_record_bytes", "an integer", v);
                mb = json_integer_value(v);
                if (mb < 64 || mb > (1 << 30))
                        return cfg_failf(x, "data.tfrecord.max_record_bytes",
                                         "%" JSON_INTEGER_FORMAT " is out of range [64, 1073741824]", mb);
                s->max_record_bytes = (uint32_t)mb;
        }
        if (tfr_spec_dense(s) > 1048576)
                return cfg_failf(x, "data.tfrecord", "the dense features and the image hold %u values, at most 1048576",
                                 tfr_spec_dense(s));
        return check_unique(x, s);
}
