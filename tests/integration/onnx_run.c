/* Runs an ONNX model through psfleet's graph engine, for the tests that hold it to other people's
 * runtimes (ONNX Runtime, PyTorch): loads the file, feeds the inputs from raw files, runs forward and
 * writes the outputs as raw files.
 *
 *   onnx_run MODEL.onnx [--batch B] [--in NAME=FILE]... [--out NAME=FILE]... [--training] [--seed N]
 *   onnx_run MODEL.onnx --check
 *
 * An input file holds little-endian values of the input's dtype (float32 or int64), row-major: B times
 * its per-example count for a batched input (dim 0 symbolic), else its count. An output file gets
 * float32 values. One JSON line on stdout: {"outputs": {"NAME": {"shape": [...]}, ...}, "params": N,
 * "nodes": N} (with --check, the inputs' shapes instead of outputs, batch as -1, nothing run).
 * Every input of the graph must be given. Exit status: 0; 78 the model does not load (the loader's one
 * line on stderr); 65 an input file of the wrong size; 74 a file that does not open or write; 2 bad usage
 * (an input not given, a name that is no input or no float tensor). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "onnx_load.h"

#define MAX_IO 32

static void usage(void)
{
        fprintf(stderr, "usage: onnx_run MODEL.onnx [--batch B] [--in NAME=FILE]... [--out NAME=FILE]... [--training] "
                        "[--seed N] | --check\n");
        exit(2);
}

static void print_shape(const struct graph_shape *s, uint32_t B)
{
        printf("[");
        for (uint32_t i = 0; i < s->rank; i++)
                printf("%s%lld", i ? ", " : "", (long long)(s->dims[i] == GRAPH_BATCH && B ? (int64_t)B : s->dims[i]));
        printf("]");
}

/* NAME=FILE into its two halves (in place). */
static void split(char *arg, char **name, char **file)
{
        char *eq = strchr(arg, '=');
        if (!eq || eq == arg || !eq[1])
                usage();
        *eq = 0;
        *name = arg;
        *file = eq + 1;
}

int main(int argc, char **argv)
{
        if (argc < 2)
                usage();
        const char *model = argv[1];
        char *in_name[MAX_IO], *in_file[MAX_IO], *out_name[MAX_IO], *out_file[MAX_IO];
        uint32_t n_in = 0, n_out = 0, B = 1;
        bool training = false, check = false;
        unsigned long long seed = 1;
        for (int i = 2; i < argc; i++) {
                bool more = i + 1 < argc;
                if (strcmp(argv[i], "--batch") == 0 && more)
                        B = (uint32_t)strtoul(argv[++i], NULL, 10);
                else if (strcmp(argv[i], "--in") == 0 && more && n_in < MAX_IO) {
                        split(argv[++i], &in_name[n_in], &in_file[n_in]);
                        n_in++;
                } else if (strcmp(argv[i], "--out") == 0 && more && n_out < MAX_IO) {
                        split(argv[++i], &out_name[n_out], &out_file[n_out]);
                        n_out++;
                } else if (strcmp(argv[i], "--training") == 0)
                        training = true;
                else if (strcmp(argv[i], "--seed") == 0 && more)
                        seed = strtoull(argv[++i], NULL, 10);
                else if (strcmp(argv[i], "--check") == 0)
                        check = true;
                else
                        usage();
        }
        if (B == 0)
                usage();
        char err[1024] = "";
        struct graph *g = NULL;
        int r = onnx_load_file(model, &g, err, sizeof(err));
        if (r < 0) {
                fprintf(stderr, "onnx_run: %s\n", err);
                return r == -ENOENT || r == -EACCES || r == -EIO ? 74 : 78;
        }
        if (check) {
                printf("{\"inputs\": {");
                bool first = true;
                for (uint32_t i = 0; i < g->n_tensors; i++) {
                        if (g->tensors[i].kind != GT_INPUT)
                                continue;
                        printf("%s\"%s\": ", first ? "" : ", ", g->tensors[i].name);
                        print_shape(&g->tensors[i].shape, 0);
                        first = false;
                }
                printf("}, \"params\": %zu, \"nodes\": %u}\n", g->n_params, g->n_nodes);
                graph_free(g);
                return 0;
        }
        struct graph_exec *x = NULL;
        if ((r = graph_exec_new(g, B, &x, err, sizeof(err))) < 0) {
                fprintf(stderr, "onnx_run: %s\n", err);
                graph_free(g);
                return 1;
        }
        int rc = 0;
        /* every input of the graph is fed: one left out would run on stale zeros */
        for (uint32_t t = 0; t < g->n_tensors && rc == 0; t++) {
                bool given = false;
                for (uint32_t i = 0; i < n_in; i++)
                        given |= strcmp(in_name[i], g->tensors[t].name) == 0;
                if (g->tensors[t].kind == GT_INPUT && !given) {
                        fprintf(stderr, "onnx_run: %s: input \"%s\" is not given (--in %s=FILE)\n", model,
                                g->tensors[t].name, g->tensors[t].name);
                        rc = 2;
                }
        }
        for (uint32_t i = 0; i < n_in && rc == 0; i++) {
                int t = graph_find(g, in_name[i]);
                if (t < 0 || g->tensors[t].kind != GT_INPUT) {
                        fprintf(stderr, "onnx_run: %s: no input \"%s\"\n", model, in_name[i]);
                        rc = 2;
                        break;
                }
                const struct graph_tensor *tt = &g->tensors[t];
                bool batched = tt->shape.rank && tt->shape.dims[0] == GRAPH_BATCH;
                size_t size = tt->dtype == GDT_I64 ? 8 : 4;
                size_t want = graph_shape_count(&tt->shape, batched ? B : 1) * size;
                FILE *f = fopen(in_file[i], "rb");
                if (!f) {
                        fprintf(stderr, "onnx_run: %s: %s\n", in_file[i], strerror(errno));
                        rc = 74;
                        break;
                }
                char *buf = malloc(want + 1);
                size_t got = buf ? fread(buf, 1, want + 1, f) : 0;
                fclose(f);
                if (got != want) {
                        fprintf(stderr, "onnx_run: %s: %zu bytes; input \"%s\" at batch %u takes %zu\n", in_file[i], got,
                                in_name[i], B, want);
                        rc = 65;
                } else if (graph_set_input(x, t, buf, batched ? B : 1) < 0) {
                        fprintf(stderr, "onnx_run: input \"%s\" refused\n", in_name[i]);
                        rc = 1;
                }
                free(buf);
        }
        if (rc == 0 && (r = graph_forward(x, training, seed)) < 0) {
                fprintf(stderr, "onnx_run: forward: %s\n", strerror(-r));
                rc = 1;
        }
        /* the outputs' files first; the JSON line only when every one was written */
        for (uint32_t i = 0; i < n_out && rc == 0; i++) {
                int t = graph_find(g, out_name[i]);
                size_t count = 0;
                const float *v = t >= 0 && g->tensors[t].dtype == GDT_F32 ? graph_value(x, t, &count) : NULL;
                if (!v) {
                        fprintf(stderr, "onnx_run: %s: no float tensor \"%s\"\n", model, out_name[i]);
                        rc = 2;
                        break;
                }
                FILE *f = fopen(out_file[i], "wb");
                bool ok = f && fwrite(v, sizeof(float), count, f) == count;
                if (f && fclose(f) != 0)
                        ok = false;
                if (!ok) {
                        fprintf(stderr, "onnx_run: %s: %s\n", out_file[i], strerror(errno));
                        rc = 74;
                }
        }
        if (rc == 0) {
                printf("{\"outputs\": {");
                for (uint32_t i = 0; i < n_out; i++) {
                        printf("%s\"%s\": {\"shape\": ", i ? ", " : "", out_name[i]);
                        print_shape(&g->tensors[graph_find(g, out_name[i])].shape, B);
                        printf("}");
                }
                printf("}, \"params\": %zu, \"nodes\": %u}\n", g->n_params, g->n_nodes);
        }
        graph_exec_free(x);
        graph_free(g);
        return rc;
}
