/* The one place that turns a job into its canonical form: the sections every node must agree on, as
 * compact JSON with sorted keys and every default filled in; its fingerprint, and the diff that names
 * the first key two nodes disagree on. */
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

/* ---- canonical form, fingerprint, diff ------------------------------------------------------ */

static int add(json_t *obj, const char *key, json_t *v) {
        return json_object_set_new(obj, key, v); /* steals v, also on failure */
}

/* Keys each node may set for itself: they change no value any other node computes, so they stay out
 * of the canonical form and the fingerprint (a worker with more BLAS threads is the same job). */
static bool node_local(const char *key) {
        return strcmp(key, "training.threads") == 0 || strcmp(key, "training.report_every_steps") == 0 ||
               strcmp(key, "ps.stop_grace_secs") == 0 || strcmp(key, "training.overlap_push") == 0 ||
               strcmp(key, "ps.disk_tier_dir") == 0;
}

/* Keys added after jobs were already running: left out of the canonical form while they hold their
 * default, so that a job that does not use them keeps the fingerprint it had before they existed (a
 * chief restarted on a newer psfleet then finds its own job in its database). A key added from now on
 * belongs here; test_config checks the demo job's fingerprint against the value it has always had. */
static bool added_later(const char *key) {
        static const char *const keys[] = {
                "model.head",         "model.init",                "training.sparse_optimizer", "training.sparse_learning_rate",
                "training.ftrl_l1",   "training.ftrl_l2",          "training.ftrl_beta",
                "training.ftrl_lr_power", "ps.memory_limit_bytes",
                "ps.replicas",        "ps.replica_timeout_ms",     "ps.failover_ms",
                "ps.replica_transport",
        };
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
                if (strcmp(key, keys[i]) == 0)
                        return true;
        return false;
}

/* True when the field of k in c holds k's default. */
static bool at_default(const struct config_key *k, const void *f) {
        switch (k->type) {
        case KT_U32: return *(const uint32_t *) f == (uint32_t) k->idef;
        case KT_U64: return *(const uint64_t *) f == (uint64_t) k->idef;
        case KT_DOUBLE: return *(const double *) f == k->ddef;
        case KT_BOOL: return *(const bool *) f == (strcmp(k->sdef, "true") == 0);
        case KT_STRING: return strcmp(*(char *const *) f, k->sdef ? k->sdef : "") == 0;
        case KT_ENUM: return strcmp(k->choices[*(const int *) f], k->sdef) == 0;
        case KT_SPECIAL: break;
        }
        return false;
}

static json_t *section_json(const struct job_config *c, const char *section) {
        size_t plen = strlen(section);
        json_t *o = json_object();
        int r = 0;

        if (!o)
                return NULL;
        for (size_t i = 0; i < cfg_n_keys; i++) {
                const struct config_key *k = &cfg_keys[i];
                const void *f = (const char *) c + k->offset;
                const char *name = k->name + plen + 1;

                if (strncmp(k->name, section, plen) != 0 || k->name[plen] != '.' || node_local(k->name) ||
                    (added_later(k->name) && at_default(k, f)))
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

/* Every key of every table, defaults filled in: the ps creates and updates rows by them. */
static json_t *embeddings_json(const struct model_spec *m) {
        json_t *a = json_array();

        for (uint32_t e = 0; a && e < m->n_embeddings; e++) {
                const struct embedding_spec *es = &m->emb[e];
                json_t *fields = json_array(), *o;
                int r = 0;

                for (uint32_t i = 0; fields && i < es->n_fields; i++)
                        r |= json_array_append_new(fields, json_integer(es->fields[i]));
                if (r < 0) {
                        json_decref(fields);
                        fields = NULL; /* json_pack then fails */
                }
                o = json_pack("{ss sI sI ss so sf sI}", "name", es->name, "dim", (json_int_t)es->dim, "vocab",
                              (json_int_t)es->vocab, "pooling", cfg_pooling_names[es->pooling], "fields", fields,
                              "init_stddev", es->init_stddev, "evict_after_steps", (json_int_t)es->evict_after_steps);
                if (o && es->initializer[0]) /* added later: only where set */
                        r |= add(o, "initializer", json_string(es->initializer));
                /* added later too: only where set (expected_rows is psfleet plan's alone) */
                if (o && es->max_rows)
                        r |= add(o, "max_rows", json_integer((json_int_t)es->max_rows));
                if (o && es->admit_after > 1)
                        r |= add(o, "admit_after", json_integer((json_int_t)es->admit_after));
                if (o && es->evict_policy != SPARSE_EVICT_AGE)
                        r |= add(o, "evict_policy", json_string(cfg_evict_policy_names[es->evict_policy]));
                /* disk_tier stays out: where a shard keeps its rows changes none of their values */
                if (!o || json_array_append_new(a, o) < 0) {
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
        if (c->cluster.n_ps_backup)
                r |= add(cl, "ps_backup", endpoints_json(c->cluster.ps_backup, c->cluster.n_ps_backup));
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
                json_t *lo = json_pack("{ss}", "type", cfg_layer_names[l->type]);

                if (!lo)
                        goto out;
                for (size_t j = 0; j < cfg_n_layer_keys; j++) {
                        const struct layer_key *lk = &cfg_layer_keys[j];

                        if (!(lk->types & BIT(l->type)))
                                continue;
                        if (strcmp(lk->name, "init") == 0)
                                r |= add(lo, "init", json_string(cfg_init_names[l->init]));
                        else
                                r |= add(lo, lk->name, json_integer(*(const uint32_t *) ((const char *) l + lk->offset)));
                }
                r |= json_array_append_new(layers, lo);
        }
        if (m->graph) {   /* the file by its contents (where it lies is each node's business) */
                char hex[65];
                for (int i = 0; i < 32; i++)
                        snprintf(hex + 2 * i, 3, "%02x", m->onnx_sha256[i]);
                json_t *feeds = json_array();
                for (uint32_t i = 0; feeds && i < m->n_feeds; i++) {
                        const struct model_feed *f = &m->feeds[i];
                        json_t *o = json_pack("{ss ss}", "input", m->graph->tensors[f->tensor].name, "fed",
                                              f->kind == FEED_DATA ? "data" : m->emb[f->table].name);
                        if (!o || json_array_append_new(feeds, o) < 0) {
                                json_decref(feeds);
                                feeds = NULL;
                        }
                }
                r |= add(model, "onnx_sha256", json_string(hex));
                r |= add(model, "feeds", feeds);
        }
        r |= add(model, "layers", layers);
        layers = NULL;
        if (m->n_embeddings)   /* added later, as the keys of added_later() */
                r |= add(model, "embeddings", embeddings_json(m));

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
                 a ? cfg_quote_json(a, qa, sizeof(qa)) : "missing", b ? cfg_quote_json(b, qb, sizeof(qb)) : "missing");
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
