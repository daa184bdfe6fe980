/* The model section of a job file: its input shape, its layers checked against each other in order
 * (a layer that cannot take its input fails here, not on a worker), and the embeddings and head checked
 * against data.format (config_sparse.c). */
#include <inttypes.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "config_internal.h"

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

int cfg_parse_model(const struct ctx *x, struct job_config *c, const json_t *obj) {
        const json_t *in = NULL, *layers = NULL;
        struct model_spec *m = &c->model;
        struct shape s;
        size_t n;
        char key[64];
        int r, lo = c->data.format == DATA_IDX ? 1 : 0;

        r = cfg_parse_section(x, c, "model", obj);
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
        if ((r = cfg_parse_embeddings(x, json_object_get(obj, "embeddings"), &c->data, m)) < 0 ||
            (r = cfg_check_record_input(x, c)) < 0 || (r = cfg_check_table_bounds(x, c)) < 0)
                return r;
        if (json_object_get(obj, "onnx"))
                return cfg_parse_onnx(x, c, obj);
        if (json_object_get(obj, "inputs"))
                return cfg_failf(x, "model.inputs", "only with model.onnx (a graph's inputs)");
        if (json_object_get(obj, "init"))
                return cfg_failf(x, "model.init", "only with model.onnx (a layer's initializer is model.layers[].init)");
        for (uint32_t e = 0; e < m->n_embeddings; e++)
                if (m->emb[e].initializer[0]) {
                        snprintf(key, sizeof(key), "model.embeddings[%u].initializer", e);
                        return cfg_failf(x, key, "only with model.onnx (an initializer of the graph)");
                }
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
