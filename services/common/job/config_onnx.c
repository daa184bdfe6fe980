/* model.onnx: a graph model. The file is loaded and checked here, when the job file is (psfleet check,
 * psd, workerd and chiefd alike refuse a bad one with exit 78, naming the node, its op and why); the
 * graph's inputs are matched with the data (model.inputs), each embedding table's lookup is cut out of
 * the graph (its rows come from the ps), and the output is matched with model.head.
 *
 * This is the one place the job floor reaches up to the train floor: the ONNX loader and the graph
 * builder (onnx_load.h, graph.h), which need nothing but the C library and protobuf-c. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "graph.h"
#include "onnx_load.h"
#include "util.h"

#define ONNX_MAX_FILE (UINT64_C(1) << 31) /* protobuf's own limit on one message */

/* The path as given, or relative to the job file's folder (origin, when it is a path). */
static char *resolve(const char *origin, const char *p)
{
        const char *slash = origin ? strrchr(origin, '/') : NULL;
        if (p[0] == '/' || !slash)
                return strdup(p);
        return strdup_printf("%.*s/%s", (int)(slash - origin), origin, p);
}

static bool sha256(const void *buf, size_t len, uint8_t out[32])
{
        unsigned n = 0;
        return EVP_Digest(buf, len, out, &n, EVP_sha256(), NULL) == 1 && n == 32;
}

/* The graph's GT_INPUT names, for messages. */
static void input_names(const struct graph *g, char *buf, size_t len)
{
        size_t at = 0;
        buf[0] = 0;
        for (uint32_t i = 0; i < g->n_tensors && at < len; i++)
                if (g->tensors[i].kind == GT_INPUT)
                        at += (size_t)snprintf(buf + at, len - at, "%s\"%s\"", at ? ", " : "", g->tensors[i].name);
}

static int n_inputs(const struct graph *g)
{
        int n = 0;
        for (uint32_t i = 0; i < g->n_tensors; i++)
                n += g->tensors[i].kind == GT_INPUT;
        return n;
}

static bool batched(const struct graph_tensor *t)
{
        return t->shape.rank >= 1 && t->shape.dims[0] == GRAPH_BATCH;
}

/* The one node that looks rows up in initializer `init` by input `ids`: a Gather on axis 0. */
static int find_lookup(const struct ctx *x, const char *key, const struct graph *g, int32_t init, int32_t ids)
{
        int found = -1;
        for (uint32_t i = 0; i < g->n_nodes; i++) {
                const struct graph_node *n = &g->nodes[i];
                bool reads = false;
                for (uint32_t j = 0; j < n->n_in; j++)
                        reads |= n->in[j] == init;
                if (!reads)
                        continue;
                if (n->op != GOP_GATHER || n->in[0] != init || n->in[1] != ids || n->a.axis != 0)
                        return cfg_failf(x, key, "initializer \"%s\" is read by node \"%s\" (%s) other than as a "
                                         "Gather on axis 0 of the ids input \"%s\": a table on the ps can only be "
                                         "looked up", g->tensors[init].name, n->name, graph_op_name(n->op),
                                         g->tensors[ids].name);
                if (found >= 0)
                        return cfg_failf(x, key, "initializer \"%s\" is looked up by two nodes (\"%s\" and \"%s\"); "
                                         "one lookup per table", g->tensors[init].name, g->nodes[found].name, n->name);
                found = (int)i;
        }
        if (found < 0)
                return cfg_failf(x, key, "no node looks rows up in initializer \"%s\"", g->tensors[init].name);
        return found;
}

/* Cuts table e's lookup out of *g: its output becomes the input the table's rows are fed into. */
static int cut_table(const struct ctx *x, struct model_spec *m, uint32_t e, int32_t ids, struct model_feed *f)
{
        struct embedding_spec *es = &m->emb[e];
        const struct graph *g = m->graph;
        char key[96], err[512];
        snprintf(key, sizeof(key), "model.embeddings[%u].initializer", e);
        int32_t init = graph_find(g, es->initializer);
        if (init < 0 || g->tensors[init].kind != GT_PARAM) {
                char cand[512] = "none";
                size_t at = 0;
                for (uint32_t i = 0; i < g->n_nodes && at < sizeof(cand); i++) {
                        const struct graph_node *n = &g->nodes[i];
                        if (n->op == GOP_GATHER && n->in[0] >= 0 && g->tensors[n->in[0]].kind == GT_PARAM)
                                at += (size_t)snprintf(cand + at, sizeof(cand) - at, "%s\"%s\"", at ? ", " : "",
                                                       g->tensors[n->in[0]].name);
                }
                return cfg_failf(x, key, "\"%s\" is no float initializer of the graph (those a Gather looks rows "
                                 "up in: %s)", es->initializer, cand);
        }
        const struct graph_tensor *it = &g->tensors[init], *idt = &g->tensors[ids];
        if (it->shape.rank != 2)
                return cfg_failf(x, key, "\"%s\" has rank %u; a table is (rows, dim)", es->initializer, it->shape.rank);
        if (es->dim == 0)
                es->dim = (uint32_t)it->shape.dims[1];
        if ((int64_t)es->dim != it->shape.dims[1])
                return cfg_failf(x, key, "\"%s\" has rows of %" PRId64 " floats, model.embeddings[%u].dim is %u",
                                 es->initializer, it->shape.dims[1], e, es->dim);
        if (es->dim > 1024)
                return cfg_failf(x, key, "\"%s\" has rows of %u floats, at most 1024", es->initializer, es->dim);
        if (es->init_stddev < 0)
                es->init_stddev = 1.0 / sqrt((double)es->dim);
        uint64_t fields = graph_shape_count(&idt->shape, 1);
        if (idt->dtype != GDT_I64 || !batched(idt) || idt->shape.rank > 2 || fields != es->n_fields)
                return cfg_failf(x, key, "the ids input \"%s\" must be int64 (batch, %u), one id per field of the "
                                 "table; it is %s of rank %u with %" PRIu64 " per example", idt->name, es->n_fields,
                                 idt->dtype == GDT_I64 ? "int64" : "float", idt->shape.rank, fields);
        int node = find_lookup(x, key, g, init, ids);
        if (node < 0)
                return node;
        /* the initializer's values, which a hashed table's rows start from (sparse_opts.c) */
        size_t n_vals = (size_t)it->shape.dims[0] * es->dim;
        float *vals = malloc(sizeof(float) * (n_vals ? n_vals : 1));
        if (!vals)
                return cfg_failf(x, key, "out of memory for \"%s\"'s %zu values", es->initializer, n_vals);
        memcpy(vals, it->data, sizeof(float) * n_vals);
        free((void *)es->init_rows);
        es->init_rows = vals;
        es->n_init_rows = (uint64_t)it->shape.dims[0];
        struct graph *cut = NULL;
        char out_name[256];
        snprintf(out_name, sizeof(out_name), "%s", g->tensors[g->nodes[node].out[0]].name);
        if (graph_cut_node(g, (uint32_t)node, &cut, err, sizeof(err)) < 0)
                return cfg_failf(x, key, "%s", err);
        graph_free(m->graph);
        m->graph = cut;
        f->kind = FEED_TABLE;
        f->table = e;
        f->tensor = graph_find(cut, out_name);
        f->count = es->n_fields * es->dim;
        cut->tensors[f->tensor].want_grad = true; /* the rows' gradients go back to the ps */
        return 0;
}

/* model.inputs (NULL: the graph's one input is the data's) against the graph's inputs. */
static int map_inputs(const struct ctx *x, struct job_config *c, const json_t *inputs)
{
        struct model_spec *m = &c->model;
        const char *data_kind = c->data.format == DATA_IDX ? "image" : "dense";
        uint32_t data_count = m->input[0] * m->input[1] * m->input[2];
        char names[512], key[320], q[160];
        int32_t data_tensor = -1, table_ids[MODEL_MAX_EMBEDDINGS];
        bool mapped_table[MODEL_MAX_EMBEDDINGS] = { false };

        input_names(m->graph, names, sizeof(names));
        if (!inputs) {
                if (n_inputs(m->graph) != 1)
                        return cfg_failf(x, "model.inputs", "missing: the graph has %d inputs (%s); say what each "
                                         "is fed (\"%s\", or \"ids:TABLE\")", n_inputs(m->graph), names, data_kind);
                for (uint32_t i = 0; i < m->graph->n_tensors; i++)
                        if (m->graph->tensors[i].kind == GT_INPUT)
                                data_tensor = (int32_t)i;
        } else {
                const char *name;
                const json_t *v;
                if (!json_is_object(inputs))
                        return cfg_fail_type(x, "model.inputs", "an object (graph input name: what it is fed)", inputs);
                json_object_foreach((json_t *)inputs, name, v) {
                        snprintf(key, sizeof(key), "model.inputs.%.200s", name);
                        int32_t t = graph_find(m->graph, name);
                        if (t < 0 || m->graph->tensors[t].kind != GT_INPUT)
                                return cfg_failf(x, key, "the graph has no input \"%s\" (its inputs: %s)", name, names);
                        if (!json_is_string(v))
                                return cfg_fail_type(x, key, "a string", v);
                        const char *s = json_string_value(v);
                        if (strcmp(s, data_kind) == 0) {
                                if (data_tensor >= 0)
                                        return cfg_failf(x, key, "\"%s\" feeds \"%s\" already", data_kind,
                                                         m->graph->tensors[data_tensor].name);
                                data_tensor = t;
                                continue;
                        }
                        if (strncmp(s, "ids:", 4) != 0)
                                return cfg_failf(x, key, "%s is not \"%s\" (the data's %s) or \"ids:TABLE\" (a table "
                                                 "of model.embeddings)", cfg_quote_json(v, q, sizeof(q)), data_kind,
                                                 c->data.format == DATA_IDX ? "images" : "dense features");
                        /* "ids:A,B": tables looked up with the same ids (embeddings, first-order weights) */
                        for (const char *p = s + 4; ; ) {
                                size_t l = strcspn(p, ",");
                                uint32_t e = 0;
                                while (e < m->n_embeddings && !(strlen(m->emb[e].name) == l &&
                                                                 strncmp(m->emb[e].name, p, l) == 0))
                                        e++;
                                if (e == m->n_embeddings)
                                        return cfg_failf(x, key, "no table of model.embeddings is called \"%.*s\"",
                                                         (int)(l > 64 ? 64 : l), p);
                                if (mapped_table[e])
                                        return cfg_failf(x, key, "table \"%s\" feeds two inputs", m->emb[e].name);
                                mapped_table[e] = true;
                                table_ids[e] = t;
                                if (!p[l])
                                        break;
                                p += l + 1;
                        }
                }
                for (uint32_t i = 0; i < m->graph->n_tensors; i++) {
                        const struct graph_tensor *t = &m->graph->tensors[i];
                        bool is_table = false;
                        for (uint32_t e = 0; e < m->n_embeddings; e++)
                                is_table |= mapped_table[e] && table_ids[e] == (int32_t)i;
                        if (t->kind == GT_INPUT && (int32_t)i != data_tensor && !is_table)
                                return cfg_failf(x, "model.inputs", "the graph's input \"%s\" is not mapped to the "
                                                 "data (\"%s\", or \"ids:TABLE\")", t->name, data_kind);
                }
        }
        for (uint32_t e = 0; e < m->n_embeddings; e++)
                if (!mapped_table[e])
                        return cfg_failf(x, "model.inputs", "no input is fed table \"%s\" (\"INPUT\": \"ids:%s\")",
                                         m->emb[e].name, m->emb[e].name);
        m->n_feeds = 0;
        char data_name[256] = "";
        if (data_tensor >= 0) {
                const struct graph_tensor *t = &m->graph->tensors[data_tensor];
                uint64_t per = graph_shape_count(&t->shape, 1);
                snprintf(key, sizeof(key), "model.inputs.%.200s", t->name);
                if (t->dtype != GDT_F32 || !batched(t))
                        return cfg_failf(x, key, "the graph's input \"%s\" must be float with the batch as its first "
                                         "dimension to be fed the %s", t->name, data_kind);
                if (per != data_count)
                        return cfg_failf(x, key, "the graph's input \"%s\" takes %" PRIu64 " values per example; "
                                         "model.input gives %u", t->name, per, data_count);
                snprintf(data_name, sizeof(data_name), "%s", t->name);
                m->feeds[m->n_feeds++] = (struct model_feed){ .kind = FEED_DATA, .count = (uint32_t)per };
        } else if (data_count) {
                return cfg_failf(x, "model.input", "gives %u values per example, but no graph input is fed them "
                                 "(model.inputs: \"INPUT\": \"%s\"; [0] for none)", data_count, data_kind);
        }
        /* the tables' lookups, cut out in order: each cut makes a new graph, so tensors go by name */
        char ids_name[MODEL_MAX_EMBEDDINGS][256];
        for (uint32_t e = 0; e < m->n_embeddings; e++)
                snprintf(ids_name[e], sizeof(ids_name[e]), "%s", m->graph->tensors[table_ids[e]].name);
        char feed_name[MODEL_MAX_EMBEDDINGS][256];
        for (uint32_t e = 0; e < m->n_embeddings; e++) {
                int r = cut_table(x, m, e, graph_find(m->graph, ids_name[e]), &m->feeds[m->n_feeds]);
                if (r < 0)
                        return r;
                snprintf(feed_name[e], sizeof(feed_name[e]), "%s", m->graph->tensors[m->feeds[m->n_feeds].tensor].name);
                m->n_feeds++;
        }
        uint32_t k = 0;
        if (data_name[0])
                m->feeds[k++].tensor = graph_find(m->graph, data_name);
        for (uint32_t e = 0; e < m->n_embeddings; e++)
                m->feeds[k++].tensor = graph_find(m->graph, feed_name[e]);
        const struct graph *g = m->graph;
        for (uint32_t i = 0; i < g->n_tensors; i++) {
                bool fed = false;
                for (uint32_t j = 0; j < m->n_feeds; j++)
                        fed |= m->feeds[j].tensor == (int32_t)i;
                if (g->tensors[i].kind != GT_INPUT || fed)
                        continue;
                for (uint32_t n = 0; n < g->n_nodes; n++)
                        for (uint32_t j = 0; j < g->nodes[n].n_in; j++)
                                if (g->nodes[n].in[j] == (int32_t)i)
                                        return cfg_failf(x, "model.inputs", "the graph's input \"%s\" is still read by "
                                                         "node \"%s\" (%s) once the tables' lookups are cut out: "
                                                         "declare %s a table too (model.embeddings[].initializer)",
                                                         g->tensors[i].name, g->nodes[n].name,
                                                         graph_op_name(g->nodes[n].op),
                                                         g->nodes[n].op == GOP_GATHER && g->nodes[n].in[0] >= 0
                                                                 ? g->tensors[g->nodes[n].in[0]].name
                                                                 : "what it looks up");
        }
        for (uint32_t i = 0; i < m->n_feeds; i++)
                if (m->feeds[i].tensor < 0 || m->graph->tensors[m->feeds[i].tensor].kind != GT_INPUT)
                        return cfg_failf(x, "model.inputs", "a feed of the graph was lost while cutting out the tables' "
                                         "lookups");
        return 0;
}

int cfg_parse_onnx(const struct ctx *x, struct job_config *c, const json_t *obj)
{
        struct model_spec *m = &c->model;
        const json_t *v = json_object_get(obj, "onnx");
        char err[768], q[160];
        char *buf = NULL;
        size_t len = 0;
        int r;

        if (!json_is_string(v) || !json_string_value(v)[0])
                return cfg_fail_type(x, "model.onnx", "a path to an ONNX file", v);
        if (json_object_get(obj, "layers"))
                return cfg_failf(x, "model.layers", "not with model.onnx: the graph is the model");
        if (!(m->onnx_path = resolve(x->origin, json_string_value(v))))
                return cfg_fail_oom(x);
        if ((r = read_file(m->onnx_path, ONNX_MAX_FILE, &buf, &len)) < 0)
                return cfg_failf(x, "model.onnx", "%s: %s", cfg_quote_str(m->onnx_path, q, sizeof(q)),
                                 r == -EFBIG ? "larger than 2 GiB" : strerror(-r));
        if (!sha256(buf, len, m->onnx_sha256)) {
                free(buf);
                return cfg_fail_oom(x);
        }
        r = onnx_load_buf(buf, len, m->onnx_path, &m->graph, err, sizeof(err));
        free(buf);
        if (r < 0)
                return cfg_failf(x, "model.onnx", "%s", err);
        for (uint32_t e = 0; e < m->n_embeddings; e++)
                if (!m->emb[e].initializer[0]) {
                        snprintf(q, sizeof(q), "model.embeddings[%u].initializer", e);
                        return cfg_failf(x, q, "missing: with model.onnx each table is an initializer of the graph "
                                         "that a Gather looks rows up in");
                }
        if ((r = map_inputs(x, c, json_object_get(obj, "inputs"))) < 0)
                return r;
        const struct graph_tensor *out = &m->graph->tensors[m->graph->loss];
        uint64_t per = graph_shape_count(&out->shape, 1);
        if (out->dtype != GDT_F32 || !batched(out) || out->shape.rank > 2)
                return cfg_failf(x, "model.onnx", "the graph's output \"%s\" must be float (batch, outputs) for "
                                 "model.head", out->name);
        if (m->head == HEAD_SOFTMAX && per < 2)
                return cfg_failf(x, "model.head", "softmax needs at least 2 outputs; the graph's output \"%s\" has "
                                 "%" PRIu64 " (one output: model.head logistic or mse)", out->name, per);
        if (m->head != HEAD_SOFTMAX && per != 1)
                return cfg_failf(x, "model.head", "%s needs 1 output; the graph's output \"%s\" has %" PRIu64,
                                 m->head == HEAD_LOGISTIC ? "logistic" : "mse", out->name, per);
        struct model_spec_var vars[MODEL_MAX_VARS];
        if (model_spec_vars(m, vars, NULL) < 0)
                return cfg_failf(x, "model.onnx", "its parameters are more than %d, or one's name is longer than "
                                 "%d bytes", MODEL_MAX_VARS, MODEL_VAR_NAME - 1);
        return 0;
}
