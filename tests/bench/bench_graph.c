/* The graph engine against the layer-list engine (model.c's layer code, model_new_engine) on the CPU, side by side in one run: the same
 * model (a job file's layer list, through graph_from_spec), the same parameters, batch and data, one
 * forward and backward per step, each engine timed over the same number of steps, alternated `rounds`
 * times. Prints one JSON line per round and a last one with the best of each and their ratio.
 *
 *   bench_graph [--config FILE] [--steps N] [--batch N] [--threads N] [--rounds N]
 *
 * Default: examples/fmnist-mlp.json, batch 64, 1 OpenBLAS thread, 3 rounds. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "config.h"
#include "graph.h"
#include "graph_spec.h"
#include "model.h"
#include "rng.h"
#include "util.h"

#ifndef PSFLEET_SOURCE_DIR
#define PSFLEET_SOURCE_DIR "."
#endif

/* The head's gradient for the graph, computed on the host as model.c's head does. */
static void xent_grad(const float *z, const uint8_t *y, uint32_t B, uint32_t C, float *dz)
{
        for (uint32_t b = 0; b < B; b++) {
                const float *r = z + (size_t)b * C;
                float mx = r[0], s = 0;
                for (uint32_t j = 1; j < C; j++)
                        mx = r[j] > mx ? r[j] : mx;
                for (uint32_t j = 0; j < C; j++)
                        s += expf(r[j] - mx);
                for (uint32_t j = 0; j < C; j++)
                        dz[(size_t)b * C + j] = (expf(r[j] - mx) / s - (j == y[b])) / (float)B;
        }
}

int main(int argc, char **argv)
{
        const char *config = PSFLEET_SOURCE_DIR "/examples/fmnist-mlp.json";
        unsigned steps = 200, rounds = 3, threads = 1;
        uint32_t B = 64;
        for (int i = 1; i < argc; i++) {
                bool more = i + 1 < argc;
                if (strcmp(argv[i], "--config") == 0 && more)
                        config = argv[++i];
                else if (strcmp(argv[i], "--steps") == 0 && more)
                        steps = (unsigned)strtoul(argv[++i], NULL, 10);
                else if (strcmp(argv[i], "--batch") == 0 && more)
                        B = (uint32_t)strtoul(argv[++i], NULL, 10);
                else if (strcmp(argv[i], "--threads") == 0 && more)
                        threads = (unsigned)strtoul(argv[++i], NULL, 10);
                else if (strcmp(argv[i], "--rounds") == 0 && more)
                        rounds = (unsigned)strtoul(argv[++i], NULL, 10);
                else {
                        fprintf(stderr, "usage: bench_graph [--config FILE] [--steps N] [--batch N] [--threads N] "
                                        "[--rounds N]\n");
                        return 2;
                }
        }
        if (!steps || !rounds || !B || !threads)
                return 2;
        char err[512] = "";
        struct job_config *cfg;
        struct backend *be;
        struct model *m;
        struct graph *g;
        struct graph_exec *x;
        if (config_load(config, &cfg, err, sizeof(err)) < 0 || graph_from_spec(&cfg->model, &g, err, sizeof(err)) < 0) {
                fprintf(stderr, "bench_graph: %s\n", err);
                return 1;
        }
        if (backend_cpu_new(threads, &be) < 0 || model_new_engine(&cfg->model, be, B, MODEL_ENGINE_LAYERS, &m) < 0 ||
            model_init_params(m, 1) < 0 || graph_exec_new(g, B, &x, err, sizeof(err)) < 0) {
                fprintf(stderr, "bench_graph: cannot build the models: %s\n", err);
                return 1;
        }
        memcpy(graph_exec_params(x), model_params(m), sizeof(float) * g->n_params);
        uint32_t D = model_input_size(m), C = model_n_classes(m);
        float *in = malloc(sizeof(float) * B * D), *dz = malloc(sizeof(float) * B * C);
        uint8_t *y = malloc(B);
        struct rng rg;
        rng_init(&rg, 7, 0);
        for (size_t i = 0; i < (size_t)B * D; i++)
                in[i] = rng_uniform_f(&rg, 0.0f, 1.0f);
        for (uint32_t b = 0; b < B; b++)
                y[b] = (uint8_t)(b % C);
        int32_t input = graph_find(g, "input"), logits = graph_find(g, "logits");
        double best_m = 0, best_g = 0;
        for (unsigned round = 0; round < rounds; round++) {
                double eps[2];
                for (int engine = 0; engine < 2; engine++) {
                        uint64_t t0 = 0;
                        for (unsigned s = 0; s < steps + 3; s++) {
                                if (s == 3)
                                        t0 = mono_us();
                                float loss;
                                int r;
                                if (engine == 0) {
                                        r = model_forward(m, in, y, B, &loss, NULL);
                                        r = r < 0 ? r : model_backward(m, NULL, NULL);
                                } else {
                                        r = graph_set_input(x, input, in, B);
                                        r = r < 0 ? r : graph_forward(x, true, s);
                                        if (r >= 0)
                                                xent_grad(graph_value(x, logits, NULL), y, B, C, dz);
                                        r = r < 0 ? r : graph_backward(x, logits, dz);
                                }
                                if (r < 0) {
                                        fprintf(stderr, "bench_graph: step failed: %s\n", strerror(-r));
                                        return 1;
                                }
                        }
                        eps[engine] = (double)steps * B / ((double)(mono_us() - t0) / 1e6);
                }
                best_m = fmax(best_m, eps[0]);
                best_g = fmax(best_g, eps[1]);
                printf("{\"bench\": \"graph\", \"round\": %u, \"model\": \"%s\", \"batch\": %u, \"threads\": %u, "
                       "\"layer_list_examples_per_s\": %.0f, \"graph_examples_per_s\": %.0f, \"ratio\": %.3f}\n",
                       round, config, B, threads, eps[0], eps[1], eps[1] / eps[0]);
                fflush(stdout);
        }
        printf("{\"bench\": \"graph\", \"best\": true, \"model\": \"%s\", \"batch\": %u, \"threads\": %u, "
               "\"layer_list_examples_per_s\": %.0f, \"graph_examples_per_s\": %.0f, \"ratio\": %.3f}\n",
               config, B, threads, best_m, best_g, best_g / best_m);
        free(in);
        free(dz);
        free(y);
        graph_exec_free(x);
        graph_free(g);
        model_free(m);
        backend_free(be);
        config_free(cfg);
        return 0;
}
