/* Tests of config.c: a full file round-trips, defaults fill in, and every malformed file or TF_CONFIG
 * value fails with the exact message a user will read. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "scratch_dir.h"
#include "unit.h"

#include "config.h"
#include "util.h"

static char xpath[sizeof(scratch_dir) + 16]; /* scratch_dir/x.json, the file malformed cases are written to */

/* Test JSON is written with single quotes for readability; this turns them into double quotes. */
static char *dq(const char *s) {
        char *d = strdup(s);
        assert_non_null(d);
        for (char *p = d; *p; p++)
                if (*p == '\'')
                        *p = '"';
        return d;
}

static void write_json(const char *path, const char *json) {
        char *d = dq(json);
        assert_int_equal(write_file_atomic(path, d, strlen(d)), 0);
        free(d);
}

static struct job_config *load_ok(const char *path, const char *json) {
        struct job_config *c = NULL;
        char err[512] = "";
        int r;

        write_json(path, json);
        r = config_load(path, &c, err, sizeof(err));
        if (r < 0)
                print_error("unexpected error: %s\n", err);
        assert_int_equal(r, 0);
        assert_non_null(c);
        return c;
}

#define CLUSTER "'cluster': {'chief': ['localhost:7000'], 'ps': ['localhost:7001'], " \
                "'worker': ['localhost:7002', 'localhost:7003']}"
#define MODEL "'model': {'input': [784], 'layers': [{'type': 'dense', 'units': 10}]}"
#define BASE CLUSTER ", " MODEL
/* A CTR job: Criteo records, a logistic head; extra goes into the model (embeddings, a head). */
#define CRITEO_DATA "'data': {'format': 'criteo', 'train_files': ['a.tsv.gz']}"
#define BASE_CTR CLUSTER ", " CRITEO_DATA
#define CTR_MODEL(extra) "'model': {'input': [13], 'head': 'logistic', " extra "'layers': [{'type': 'dense', 'units': 1}]}"
#define EMB(keys) "'embeddings': [{" keys "}], "

static const char *full_json =
        "{\n"
        "  'job': 'fmnist',\n"
        "  'cluster': {\n"
        "    'chief': ['chief.example.org:2222'],\n"
        "    'ps': ['10.0.0.1:2223', '[::1]:2224'],\n"
        "    'worker': ['w0:2225', 'w1:2225', 'w2:2225']\n"
        "  },\n"
        "  'model': {\n"
        "    'input': [1, 28, 28],\n"
        "    'seed': 7,\n"
        "    'layers': [\n"
        "      {'type': 'conv2d', 'filters': 32, 'kernel': 5, 'init': 'he_normal'},\n"
        "      {'type': 'relu'},\n"
        "      {'type': 'maxpool2d', 'pool': 2},\n"
        "      {'type': 'flatten'},\n"
        "      {'type': 'dense', 'units': 128, 'init': 'glorot_uniform'},\n"
        "      {'type': 'tanh'},\n"
        "      {'type': 'sigmoid'},\n"
        "      {'type': 'dense', 'units': 10, 'init': 'zeros'}\n"
        "    ]\n"
        "  },\n"
        "  'data': {'dir': '/data', 'train_images': 'a.gz', 'train_labels': 'b.gz',\n"
        "           'test_images': 'c.gz', 'test_labels': 'd.gz'},\n"
        "  'training': {'batch_size': 128, 'optimizer': 'adam', 'learning_rate': 0.001, 'momentum': 0.5,\n"
        "               'nesterov': true, 'beta1': 0.8, 'beta2': 0.99, 'epsilon': 1e-8,\n"
        "               'initial_accumulator': 0.2, 'lr_schedule': 'exponential', 'lr_decay_rate': 0.5,\n"
        "               'lr_decay_steps': 100, 'lr_staircase': true, 'max_steps': 5000,\n"
        "               'report_every_steps': 10, 'threads': 4, 'seed': 42},\n"
        "  'supervisor': {'checkpoint_dir': 'ck', 'summary_dir': 'sum', 'save_checkpoint_steps': 100,\n"
        "                 'save_checkpoint_secs': 0, 'keep_checkpoints': 3, 'save_summaries_secs': 5,\n"
        "                 'eval_every_steps': 1000, 'ready_timeout_secs': 60},\n"
        "  'ps': {'split_bytes': 8192},\n"
        "  'rpc': {'deadline_ms': 5000, 'shared_memory': false},\n"
        "  'device': {'device': 'gpu:0,1', 'gpu_memory_fraction': 0.5, 'allow_growth': true,\n"
        "             'log_device_placement': true}\n"
        "}\n";

static int setup(void **state) {
        if (scratch_dir_make("config") < 0)
                return -1;
        snprintf(xpath, sizeof(xpath), "%s/x.json", scratch_dir);
        return 0;
}

static int teardown(void **state) {
        return scratch_dir_remove(state);
}

/* The settings test_full_file and test_defaults both check, field by field, against the values each
 * expects: the idx data files, training, supervisor, ps, rpc and device. */
static void assert_settings(const struct job_config *c, const struct job_config *want) {
        const struct training_config *t = &c->training, *wt = &want->training;
        const struct supervisor_config *s = &c->supervisor, *ws = &want->supervisor;

        assert_string_equal(c->data.dir, want->data.dir);
        assert_string_equal(c->data.train_images, want->data.train_images);
        assert_string_equal(c->data.train_labels, want->data.train_labels);
        assert_string_equal(c->data.test_images, want->data.test_images);
        assert_string_equal(c->data.test_labels, want->data.test_labels);

        assert_int_equal(t->batch_size, wt->batch_size);
        assert_int_equal(t->optimizer, wt->optimizer);
        assert_true(t->learning_rate == wt->learning_rate);
        assert_true(t->momentum == wt->momentum);
        assert_int_equal(t->nesterov, wt->nesterov);
        assert_true(t->beta1 == wt->beta1);
        assert_true(t->beta2 == wt->beta2);
        assert_true(t->epsilon == wt->epsilon);
        assert_true(t->initial_accumulator == wt->initial_accumulator);
        assert_int_equal(t->lr_schedule, wt->lr_schedule);
        assert_true(t->lr_decay_rate == wt->lr_decay_rate);
        assert_int_equal(t->lr_decay_steps, wt->lr_decay_steps);
        assert_int_equal(t->lr_staircase, wt->lr_staircase);
        assert_int_equal(t->max_steps, wt->max_steps);
        assert_int_equal(t->report_every_steps, wt->report_every_steps);
        assert_int_equal(t->threads, wt->threads);
        assert_int_equal(t->seed, wt->seed);

        assert_string_equal(s->checkpoint_dir, ws->checkpoint_dir);
        assert_string_equal(s->summary_dir, ws->summary_dir);
        assert_int_equal(s->save_checkpoint_steps, ws->save_checkpoint_steps);
        assert_int_equal(s->save_checkpoint_secs, ws->save_checkpoint_secs);
        assert_int_equal(s->keep_checkpoints, ws->keep_checkpoints);
        assert_int_equal(s->save_summaries_secs, ws->save_summaries_secs);
        assert_int_equal(s->eval_every_steps, ws->eval_every_steps);
        assert_int_equal(s->ready_timeout_secs, ws->ready_timeout_secs);
        assert_int_equal(c->ps.split_bytes, want->ps.split_bytes);
        assert_int_equal(c->rpc.deadline_ms, want->rpc.deadline_ms);
        assert_int_equal(c->rpc.shared_memory, want->rpc.shared_memory);
        assert_string_equal(c->device.device, want->device.device);
        assert_true(c->device.gpu_memory_fraction == want->device.gpu_memory_fraction);
        assert_int_equal(c->device.allow_growth, want->device.allow_growth);
        assert_int_equal(c->device.log_device_placement, want->device.log_device_placement);
}

/* full_json's settings. */
static const struct job_config full_settings = {
        .data = { .dir = "/data", .train_images = "a.gz", .train_labels = "b.gz", .test_images = "c.gz",
                  .test_labels = "d.gz" },
        .training = { .batch_size = 128, .optimizer = OPT_ADAM, .learning_rate = 0.001, .momentum = 0.5,
                      .nesterov = true, .beta1 = 0.8, .beta2 = 0.99, .epsilon = 1e-8, .initial_accumulator = 0.2,
                      .lr_schedule = LR_EXPONENTIAL, .lr_decay_rate = 0.5, .lr_decay_steps = 100,
                      .lr_staircase = true, .max_steps = 5000, .report_every_steps = 10, .threads = 4,
                      .seed = 42 },
        .supervisor = { .checkpoint_dir = "ck", .summary_dir = "sum", .save_checkpoint_steps = 100,
                        .save_checkpoint_secs = 0, .keep_checkpoints = 3, .save_summaries_secs = 5,
                        .eval_every_steps = 1000, .ready_timeout_secs = 60 },
        .ps = { .split_bytes = 8192 },
        .rpc = { .deadline_ms = 5000, .shared_memory = false },
        .device = { .device = "gpu:0,1", .gpu_memory_fraction = 0.5, .allow_growth = true,
                    .log_device_placement = true },
};

/* The defaults of the same settings, when a file leaves them out. */
static const struct job_config default_settings = {
        .data = { .dir = "/usr/share/datasets/fashion-mnist", .train_images = "train-images-idx3-ubyte.gz",
                  .train_labels = "train-labels-idx1-ubyte.gz", .test_images = "t10k-images-idx3-ubyte.gz",
                  .test_labels = "t10k-labels-idx1-ubyte.gz" },
        .training = { .batch_size = 64, .optimizer = OPT_MOMENTUM, .learning_rate = 0.01, .momentum = 0.9,
                      .nesterov = false, .beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-7,
                      .initial_accumulator = 0.1, .lr_schedule = LR_CONSTANT, .lr_decay_rate = 0.96,
                      .lr_decay_steps = 1000, .lr_staircase = false, .max_steps = 1000,
                      .report_every_steps = 50, .threads = 1, .seed = 1 },
        .supervisor = { .checkpoint_dir = "checkpoints", .summary_dir = "summaries", .save_checkpoint_steps = 0,
                        .save_checkpoint_secs = 600, .keep_checkpoints = 5, .save_summaries_secs = 10,
                        .eval_every_steps = 0, .ready_timeout_secs = 600 },
        .ps = { .split_bytes = 262144 },
        .rpc = { .deadline_ms = 30000, .shared_memory = true },
        .device = { .device = "auto", .gpu_memory_fraction = 1.0, .allow_growth = false,
                    .log_device_placement = false },
};

static void test_full_file(void **state) {
        char path[sizeof(scratch_dir) + 32];
        struct job_config *c;

        snprintf(path, sizeof(path), "%s/full.json", scratch_dir);
        c = load_ok(path, full_json);
        assert_string_equal(c->path, path);
        assert_string_equal(c->name, "fmnist");

        assert_int_equal(c->cluster.n_chief, 1);
        assert_int_equal(c->cluster.n_ps, 2);
        assert_int_equal(c->cluster.n_worker, 3);
        assert_string_equal(c->cluster.chief[0].host, "chief.example.org");
        assert_int_equal(c->cluster.chief[0].port, 2222);
        assert_string_equal(c->cluster.ps[1].host, "::1");
        assert_string_equal(c->cluster.ps[1].addr, "[::1]:2224");
        assert_int_equal(c->cluster.ps[1].port, 2224);
        assert_string_equal(c->cluster.worker[2].addr, "w2:2225");

        assert_int_equal(c->model.input[0], 1);
        assert_int_equal(c->model.input[1], 28);
        assert_int_equal(c->model.input[2], 28);
        assert_int_equal(c->model.seed, 7);
        assert_int_equal(c->model.n_layers, 8);
        assert_int_equal(c->model.layers[0].type, LAYER_CONV2D);
        assert_int_equal(c->model.layers[0].filters, 32);
        assert_int_equal(c->model.layers[0].kernel, 5);
        assert_int_equal(c->model.layers[0].init, INIT_HE_NORMAL);
        assert_int_equal(c->model.layers[1].type, LAYER_RELU);
        assert_int_equal(c->model.layers[2].type, LAYER_MAXPOOL2D);
        assert_int_equal(c->model.layers[2].pool, 2);
        assert_int_equal(c->model.layers[3].type, LAYER_FLATTEN);
        assert_int_equal(c->model.layers[4].units, 128);
        assert_int_equal(c->model.layers[4].init, INIT_GLOROT_UNIFORM);
        assert_int_equal(c->model.layers[5].type, LAYER_TANH);
        assert_int_equal(c->model.layers[6].type, LAYER_SIGMOID);
        assert_int_equal(c->model.layers[7].units, 10);
        assert_int_equal(c->model.layers[7].init, INIT_ZEROS);

        assert_settings(c, &full_settings);

        assert_string_equal(role_name(ROLE_CHIEF), "chief");
        assert_string_equal(role_name(ROLE_PS), "ps");
        assert_string_equal(role_name(ROLE_WORKER), "worker");
        assert_string_equal(config_endpoint(c, (struct task) { ROLE_PS, 1 })->addr, "[::1]:2224");
        assert_string_equal(config_endpoint(c, (struct task) { ROLE_WORKER, 2 })->addr, "w2:2225");
        assert_null(config_endpoint(c, (struct task) { ROLE_WORKER, 3 }));
        assert_null(config_endpoint(c, (struct task) { ROLE_CHIEF, 1 }));
        assert_null(config_free(c));
        assert_null(config_free(NULL));
}

static void test_defaults(void **state) {
        char path[sizeof(scratch_dir) + 32];
        struct job_config *c;

        snprintf(path, sizeof(path), "%s/mnist-small.json", scratch_dir);
        c = load_ok(path, "{" BASE "}");
        assert_string_equal(c->name, "mnist-small");
        assert_int_equal(c->model.input[0], 1);
        assert_int_equal(c->model.input[1], 1);
        assert_int_equal(c->model.input[2], 784);
        assert_int_equal(c->model.seed, 1);
        assert_int_equal(c->model.n_layers, 1);
        assert_int_equal(c->model.layers[0].init, INIT_DEFAULT);
        assert_settings(c, &default_settings);
        config_free(c);

        /* Integers are accepted where numbers are expected; "master" is the chief. */
        c = load_ok(path, "{'cluster': {'master': ['a:1'], 'ps': ['a:2'], 'worker': ['a:3']}, " MODEL ", "
                          "'training': {'learning_rate': 1}, 'device': {'device': 'cpu'}}");
        assert_true(c->training.learning_rate == 1.0);
        assert_int_equal(c->cluster.n_chief, 1);
        assert_string_equal(c->cluster.chief[0].addr, "a:1");
        config_free(c);
}

struct bad_case {
        const char *json;       /* single quotes become double quotes */
        const char *error;      /* after "PATH: " */
};

static const struct bad_case bad_cases[] = {
        /* unknown keys */
        { "{" BASE ", 'trainig': {}}", "trainig: unknown key" },
        { "{" BASE ", 'training': {'batchsize': 64}}", "training.batchsize: unknown key" },
        /* training.mode and its counts: N <= N + b <= workers (BASE has 2 workers) */
        { "{" BASE ", 'training': {'mode': 'bsp'}}", "training.mode: \"bsp\" is not one of async, sync, ssp" },
        { "{" BASE ", 'training': {'mode': 'sync', 'total_num_replicas': 3}}",
          "training.total_num_replicas: 3 is more than the cluster's 2 worker(s)" },
        { "{" BASE ", 'training': {'mode': 'sync', 'replicas_to_aggregate': 2, 'total_num_replicas': 1}}",
          "training.replicas_to_aggregate: 2 is more than training.total_num_replicas (1)" },
        { "{" BASE ", 'training': {'mode': 'sync', 'replicas_to_aggregate': 3}}",
          "training.replicas_to_aggregate: 3 is more than training.total_num_replicas (2: every worker)" },
        { "{" BASE ", 'training': {'mode': 'ssp', 'overlap_push': true}}",
          "training.overlap_push: is for training.mode async only (this job: ssp)" },
        { "{" BASE ", 'training': {'mode': 'ssp', 'staleness': -1}}",
          "training.staleness: -1 is out of range [0, 1000000]" },
        { "{" BASE ", 'device': {'gpu': 1}}", "device.gpu: unknown key" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layer': [], 'layers': [{'type': 'dense', 'units': 10}]}}",
          "model.layer: unknown key" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers[].units': 1, 'layers': [{'type': 'dense', 'units': 10}]}}",
          "model.layers[].units: unknown key" },
        /* types */
        { "{" BASE ", 'training': {'batch_size': '64'}}",
          "training.batch_size: expected an integer, got string \"64\"" },
        { "{" BASE ", 'training': {'batch_size': 1.5}}", "training.batch_size: expected an integer, got number 1.5" },
        { "{" BASE ", 'training': {'max_steps': 1000.0}}",
          "training.max_steps: expected an integer, got number 1000.0" },
        { "{" BASE ", 'training': {'nesterov': 'yes'}}",
          "training.nesterov: expected a boolean (true or false), got string \"yes\"" },
        { "{" BASE ", 'device': {'allow_growth': 1}}",
          "device.allow_growth: expected a boolean (true or false), got integer 1" },
        { "{" BASE ", 'training': {'learning_rate': null}}",
          "training.learning_rate: expected a number, got null" },
        { "{" BASE ", 'data': {'dir': ['a']}}", "data.dir: expected a string, got array" },
        { "{" BASE ", 'training': []}", "training: expected an object, got array" },
        { "{" BASE ", 'job': 7}", "job: expected a string, got integer 7" },
        { "{" BASE ", 'training': {'optimizer': '" "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'}}",
          "training.optimizer: \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa... "
          "is not one of sgd, momentum, adam, adagrad" },
        /* ranges */
        { "{" BASE ", 'training': {'batch_size': 0}}", "training.batch_size: 0 is out of range [1, 65536]" },
        { "{" BASE ", 'training': {'batch_size': 65537}}", "training.batch_size: 65537 is out of range [1, 65536]" },
        { "{" BASE ", 'training': {'max_steps': -1}}",
          "training.max_steps: -1 is out of range [1, 1000000000000]" },
        { "{" BASE ", 'training': {'learning_rate': 0}}", "training.learning_rate: 0 is out of range (0, 10]" },
        { "{" BASE ", 'training': {'learning_rate': 10.5}}", "training.learning_rate: 10.5 is out of range (0, 10]" },
        { "{" BASE ", 'training': {'momentum': 1.0}}", "training.momentum: 1.0 is out of range [0, 1)" },
        { "{" BASE ", 'training': {'threads': 257}}", "training.threads: 257 is out of range [1, 256]" },
        { "{" BASE ", 'device': {'gpu_memory_fraction': 0}}",
          "device.gpu_memory_fraction: 0 is out of range (0, 1]" },
        { "{" BASE ", 'supervisor': {'keep_checkpoints': 0}}",
          "supervisor.keep_checkpoints: 0 is out of range [1, 1000]" },
        { "{" BASE ", 'supervisor': {'ready_timeout_secs': 86401}}",
          "supervisor.ready_timeout_secs: 86401 is out of range [1, 86400]" },
        { "{" BASE ", 'rpc': {'deadline_ms': 3600001}}", "rpc.deadline_ms: 3600001 is out of range [1, 3600000]" },
        { "{" BASE ", 'rpc': {'shared_memory': 1}}",
          "rpc.shared_memory: expected a boolean (true or false), got integer 1" },
        { "{" BASE ", 'ps': {'split_bytes': 1024}}",
          "ps.split_bytes: 1024 is out of range [4096, 9223372036854775807]" },
        { "{" BASE ", 'data': {'dir': ''}}", "data.dir: must not be empty" },
        /* enums and strings */
        { "{" BASE ", 'training': {'optimizer': 'rmsprop'}}",
          "training.optimizer: \"rmsprop\" is not one of sgd, momentum, adam, adagrad" },
        { "{" BASE ", 'training': {'lr_schedule': 'cosine'}}",
          "training.lr_schedule: \"cosine\" is not one of constant, exponential" },
        { "{" BASE ", 'device': {'device': 'gpu'}}", "device.device: \"gpu\" is not auto, cpu, gpu:N or gpu:N,M,..." },
        { "{" BASE ", 'device': {'device': 'gpu:1,x'}}",
          "device.device: \"gpu:1,x\" is not auto, cpu, gpu:N or gpu:N,M,... (bad GPU index)" },
        { "{" BASE ", 'device': {'device': 'gpu:0,'}}",
          "device.device: \"gpu:0,\" is not auto, cpu, gpu:N or gpu:N,M,... (bad GPU index)" },
        /* a GPU may repeat (replicas sharing it), up to 16 entries */
        { "{" BASE ", 'device': {'device': 'gpu:0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0'}}",
          "device.device: \"gpu:0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0\" lists more than 16 GPUs" },
        { "{" BASE ", 'job': 'a b'}",
          "job: \"a b\" is not a valid job name ([A-Za-z0-9_.-]+, not starting with a dot, at most 64 characters)" },
        /* a job name and the state paths stay under the state directory */
        { "{" BASE ", 'job': '..'}",
          "job: \"..\" is not a valid job name ([A-Za-z0-9_.-]+, not starting with a dot, at most 64 characters)" },
        { "{" BASE ", 'job': '.hidden'}",
          "job: \".hidden\" is not a valid job name ([A-Za-z0-9_.-]+, not starting with a dot, at most 64 characters)" },
        { "{" BASE ", 'supervisor': {'checkpoint_dir': '../other-job/checkpoints'}}",
          "supervisor.checkpoint_dir: \"../other-job/checkpoints\" climbs out of STATE_DIR/JOB/ with \"..\" (a relative "
          "path stays under it; an absolute path may go anywhere)" },
        { "{" BASE ", 'supervisor': {'summary_dir': 'a/./../../b'}}",
          "supervisor.summary_dir: \"a/./../../b\" climbs out of STATE_DIR/JOB/ with \"..\" (a relative path stays "
          "under it; an absolute path may go anywhere)" },
        { "{" BASE ", 'supervisor': {'summary_dir': 'a//..//..'}}",
          "supervisor.summary_dir: \"a//..//..\" climbs out of STATE_DIR/JOB/ with \"..\" (a relative path stays "
          "under it; an absolute path may go anywhere)" },
        /* cluster */
        { "{" MODEL "}", "cluster: missing" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'worker': ['a:3']}}", "cluster.ps: missing" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': [], 'worker': ['a:3']}}", "cluster.ps: must not be empty" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:2'], 'worker': []}}",
          "cluster.worker: must not be empty" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1', 'a:4'], 'ps': ['a:2'], 'worker': ['a:3']}}",
          "cluster.chief: must have exactly 1 entry, has 2" },
        { "{" MODEL ", 'cluster': {'chief': 'a:1', 'ps': ['a:2'], 'worker': ['a:3']}}",
          "cluster.chief: expected an array of \"host:port\" strings, got string \"a:1\"" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:2'], 'worker': ['a:3', 7]}}",
          "cluster.worker[1]: expected a \"host:port\" string, got integer 7" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:2'], 'worker': ['a:3'], 'evaluator': ['a:4', 'a:5']}}",
          "cluster.evaluator: must have at most 1 entry, has 2" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:2'], 'worker': ['a:3'], 'evaluator': ['a:3']}}",
          "cluster.evaluator[0]: \"a:3\" duplicates cluster.worker[0]" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'master': ['a:4'], 'ps': ['a:2'], 'worker': ['a:3']}}",
          "cluster.master: conflicts with cluster.chief (they are the same task)" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['127.0.0.1:7001', '127.0.0.1'], 'worker': ['a:3']}}",
          "cluster.ps[1]: \"127.0.0.1\" is not host:port (missing port)" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:'], 'worker': ['a:3']}}",
          "cluster.ps[0]: \"a:\" is not host:port (missing port)" },
        { "{" MODEL ", 'cluster': {'chief': ['a:0'], 'ps': ['a:2'], 'worker': ['a:3']}}",
          "cluster.chief[0]: \"a:0\" is not host:port (port out of range [1, 65535])" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:70000'], 'worker': ['a:3']}}",
          "cluster.ps[0]: \"a:70000\" is not host:port (port out of range [1, 65535])" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:http'], 'worker': ['a:3']}}",
          "cluster.ps[0]: \"a:http\" is not host:port (port is not a number)" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:+80'], 'worker': ['a:3']}}",
          "cluster.ps[0]: \"a:+80\" is not host:port (port is not a number)" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': [':7001'], 'worker': ['a:3']}}",
          "cluster.ps[0]: \":7001\" is not host:port (empty host)" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['::1:7001'], 'worker': ['a:3']}}",
          "cluster.ps[0]: \"::1:7001\" is not host:port (an IPv6 address must be in brackets)" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['[::1:7001'], 'worker': ['a:3']}}",
          "cluster.ps[0]: \"[::1:7001\" is not host:port (missing ']')" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['[::1]'], 'worker': ['a:3']}}",
          "cluster.ps[0]: \"[::1]\" is not host:port (missing port)" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['[zz]:1'], 'worker': ['a:3']}}",
          "cluster.ps[0]: \"[zz]:1\" is not host:port (bad IPv6 address)" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a b:1'], 'worker': ['a:3']}}",
          "cluster.ps[0]: \"a b:1\" is not host:port (bad character in host)" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['127.0.0.1:7001'], 'worker': ['127.0.0.1:7001']}}",
          "cluster.worker[0]: \"127.0.0.1:7001\" duplicates cluster.ps[0]" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:2'], 'worker': ['a:3', 'b:3', 'A:3']}}",
          "cluster.worker[2]: \"A:3\" duplicates cluster.worker[0]" },
        /* ps.replicas 2 */
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:2'], 'worker': ['a:3'], 'ps_backup': ['a:2']}, "
          "'ps': {'replicas': 2}}",
          "cluster.ps_backup[0]: \"a:2\" duplicates cluster.ps[0]: a shard's backup must be another psd than its primary" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:2', 'a:4'], 'worker': ['a:3'], 'ps_backup': ['a:5']}, "
          "'ps': {'replicas': 2}}",
          "cluster.ps_backup: has 1 entries, cluster.ps 2: a backup for each shard, in the same order" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:2'], 'worker': ['a:3']}, 'ps': {'replicas': 2}}",
          "ps.replicas: is 2, but cluster.ps_backup lists no backup psd" },
        { "{" MODEL ", 'cluster': {'chief': ['a:1'], 'ps': ['a:2'], 'worker': ['a:3'], 'ps_backup': ['a:5']}}",
          "cluster.ps_backup: lists backups, but ps.replicas is 1 (set it to 2 to use them)" },
        /* model */
        { "{" CLUSTER "}", "model: missing" },
        { "{" CLUSTER ", 'model': {'layers': [{'type': 'dense', 'units': 10}]}}", "model.input: missing" },
        { "{" CLUSTER ", 'model': {'input': [1, 28], 'layers': [{'type': 'dense', 'units': 10}]}}",
          "model.input: expected 1 or 3 dimensions, got 2" },
        { "{" CLUSTER ", 'model': {'input': [0], 'layers': [{'type': 'dense', 'units': 10}]}}",
          "model.input[0]: 0 is out of range [1, 1048576]" },
        { "{" CLUSTER ", 'model': {'input': 784, 'layers': [{'type': 'dense', 'units': 10}]}}",
          "model.input: expected an array of 1 or 3 integers, got integer 784" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': []}}", "model.layers: must not be empty" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dropout'}]}}",
          "model.layers[0].type: \"dropout\" is not one of dense, relu, tanh, sigmoid, conv2d, maxpool2d, flatten" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': [{'units': 10}]}}", "model.layers[0].type: missing" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': ['dense']}}",
          "model.layers[0]: expected an object, got string \"dense\"" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dense', 'units': 64}, {'type': 'relu'}, "
          "{'type': 'dense', 'unitz': 10}]}}", "model.layers[2].unitz: unknown key" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'relu', 'units': 10}, "
          "{'type': 'dense', 'units': 10}]}}", "model.layers[0].units: not allowed in a relu layer" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dense'}]}}",
          "model.layers[0].units: missing (required in a dense layer)" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dense', 'units': 0}]}}",
          "model.layers[0].units: 0 is out of range [1, 1048576]" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dense', 'units': 10, 'init': 'xavier'}]}}",
          "model.layers[0].init: \"xavier\" is not one of default, glorot_uniform, he_normal, zeros" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dense', 'units': 10}, {'type': 'relu'}]}}",
          "model.layers[1]: the last layer must be dense (its units are the number of classes), got relu" },
        { "{" CLUSTER ", 'model': {'input': [1, 28, 28], 'layers': [{'type': 'dense', 'units': 10}]}}",
          "model.layers[0]: dense needs a flat input, got (1, 28, 28); add a flatten layer before it" },
        { "{" CLUSTER ", 'model': {'input': [1, 2, 2], 'layers': [{'type': 'maxpool2d', 'pool': 3}, "
          "{'type': 'flatten'}, {'type': 'dense', 'units': 10}]}}",
          "model.layers[0]: pool 3 is larger than its input (1, 2, 2)" },
        /* model.head */
        { "{" BASE_CTR ", 'model': {'input': [13], 'head': 'probit', 'layers': [{'type': 'dense', 'units': 1}]}}",
          "model.head: \"probit\" is not one of softmax, logistic, mse" },
        { "{" BASE_CTR ", 'model': {'input': [13], 'head': 'logistic', 'layers': [{'type': 'dense', 'units': 10}]}}",
          "model.layers[0].units: model.head logistic needs 1 unit, got 10" },
        { "{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dense', 'units': 1}]}}",
          "model.layers[0].units: model.head softmax needs at least 2 classes, got 1 (a single output: model.head "
          "logistic or mse)" },
        { "{" CLUSTER ", 'model': {'input': [784], 'head': 'mse', 'layers': [{'type': 'dense', 'units': 1}]}}",
          "model.head: mse needs a record format (data.format libsvm, criteo, csv or tfrecord); idx has class labels" },
        /* model.embeddings */
        { "{" CLUSTER ", 'model': {'input': [784], 'embeddings': [{'name': 'e', 'dim': 4}], "
          "'layers': [{'type': 'dense', 'units': 10}]}}",
          "model.embeddings: need a record format with sparse fields (data.format libsvm, criteo, or tfrecord with "
          "data.tfrecord.sparse); data.format idx "
          "has none" },
        { "{" CLUSTER ", 'data': {'format': 'csv', 'train_files': ['a.csv']}, " CTR_MODEL(EMB("'name': 'e', 'dim': 4")) "}",
          "model.embeddings: need a record format with sparse fields (data.format libsvm, criteo, or tfrecord with "
          "data.tfrecord.sparse); data.format csv "
          "has none" },
        { "{" BASE_CTR ", " CTR_MODEL("'embeddings': {}, ") "}", "model.embeddings: expected an array of tables, got object" },
        { "{" BASE_CTR ", " CTR_MODEL("'embeddings': [{'name': 'a', 'dim': 1}, {'name': 'b', 'dim': 1}, {'name': 'c', "
          "'dim': 1}, {'name': 'd', 'dim': 1}, {'name': 'e', 'dim': 1}, {'name': 'f', 'dim': 1}, {'name': 'g', 'dim': 1}, "
          "{'name': 'h', 'dim': 1}, {'name': 'i', 'dim': 1}], ") "}", "model.embeddings: has 9 tables, at most 8" },
        { "{" BASE_CTR ", " CTR_MODEL("'embeddings': [7], ") "}", "model.embeddings[0]: expected an object, got integer 7" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'dim': 4")) "}", "model.embeddings[0].name: missing" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'a-b', 'dim': 4")) "}",
          "model.embeddings[0].name: \"a-b\" is not [A-Za-z0-9_]{1,31}" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'abcdefghijabcdefghijabcdefghijab', 'dim': 4")) "}",
          "model.embeddings[0].name: \"abcdefghijabcdefghijabcdefghijab\" is not [A-Za-z0-9_]{1,31}" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 3, 'dim': 4")) "}",
          "model.embeddings[0].name: expected a string, got integer 3" },
        { "{" BASE_CTR ", " CTR_MODEL("'embeddings': [{'name': 'e', 'dim': 4}, {'name': 'e', 'dim': 8}], ") "}",
          "model.embeddings[1].name: \"e\" is also model.embeddings[0]'s name" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'size': 9")) "}",
          "model.embeddings[0].size: unknown key" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e'")) "}", "model.embeddings[0].dim: missing" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 0")) "}",
          "model.embeddings[0].dim: 0 is out of range [1, 1024]" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 1025")) "}",
          "model.embeddings[0].dim: 1025 is out of range [1, 1024]" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': '16'")) "}",
          "model.embeddings[0].dim: expected an integer, got string \"16\"" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'fields': 'some'")) "}",
          "model.embeddings[0].fields: \"some\" is not \"all\" or a list of field indices" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'fields': 7")) "}",
          "model.embeddings[0].fields: expected \"all\" or an array of field indices, got integer 7" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'fields': []")) "}",
          "model.embeddings[0].fields: has 0 fields, 1 to 64" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'fields': [3, 26]")) "}",
          "model.embeddings[0].fields[1]: 26 is not a field of data.format criteo (0..25)" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'fields': [-1]")) "}",
          "model.embeddings[0].fields[0]: -1 is not a field of data.format criteo (0..25)" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'fields': [2, 5, 2]")) "}",
          "model.embeddings[0].fields[2]: field 2 is listed twice" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'fields': ['1']")) "}",
          "model.embeddings[0].fields[0]: expected an integer, got string \"1\"" },
        { "{" CLUSTER ", 'data': {'format': 'libsvm', 'train_files': ['a.svm']}, 'model': {'input': [0], 'head': "
          "'logistic', " EMB("'name': 'e', 'dim': 4, 'fields': [1]") "'layers': [{'type': 'dense', 'units': 1}]}}",
          "model.embeddings[0].fields[0]: 1 is not a field of data.format libsvm (0..0)" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'vocab': -1")) "}",
          "model.embeddings[0].vocab: -1 is out of range [0, 9223372036854775807]" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'vocab': 1e9")) "}",
          "model.embeddings[0].vocab: expected an integer, got number 1000000000.0" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'pooling': 'max'")) "}",
          "model.embeddings[0].pooling: \"max\" is not one of sum, mean" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'init_stddev': -1")) "}",
          "model.embeddings[0].init_stddev: -1 is out of range [0, 1000]" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'init_stddev': 'x'")) "}",
          "model.embeddings[0].init_stddev: expected a number, got string \"x\"" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'evict_after_steps': -5")) "}",
          "model.embeddings[0].evict_after_steps: -5 is out of range [0, 9223372036854775807]" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'max_rows': -1")) "}",
          "model.embeddings[0].max_rows: -1 is out of range [0, 9223372036854775807]" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'max_rows': 63")) "}",
          "model.embeddings[0].max_rows: 63 is too small: each ps shard holds max_rows / 1 (cluster.ps) rows, at least 64 (0: no bound)" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'admit_after': 256")) "}",
          "model.embeddings[0].admit_after: 256 is out of range [0, 255]" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'evict_policy': 'fifo'")) "}",
          "model.embeddings[0].evict_policy: \"fifo\" is not one of age, lru, lfu" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'disk_tier': true")) "}",
          "model.embeddings[0].disk_tier: needs a bound in DRAM: max_rows or ps.memory_limit_bytes" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'max_rows': 64, 'disk_tier': 1")) "}",
          "model.embeddings[0].disk_tier: expected true or false, got integer 1" },
        { "{" BASE_CTR ", " CTR_MODEL(EMB("'name': 'e', 'dim': 4, 'expected_rows': 'many'")) "}",
          "model.embeddings[0].expected_rows: expected an integer, got string \"many\"" },
        { "{" BASE_CTR ", 'ps': {'memory_limit_bytes': -1}, " CTR_MODEL(EMB("'name': 'e', 'dim': 4")) "}",
          "ps.memory_limit_bytes: -1 is out of range [0, 9223372036854775807]" },
        /* model.input against the record format */
        { "{" BASE_CTR ", 'model': {'input': [12], 'head': 'logistic', 'layers': [{'type': 'dense', 'units': 1}]}}",
          "model.input: [12], but a record of data.format criteo has 13 dense features" },
        { "{" BASE_CTR ", 'model': {'input': [2, 1, 13], 'head': 'logistic', 'layers': [{'type': 'flatten'}, "
          "{'type': 'dense', 'units': 1}]}}",
          "model.input: must be [N] with data.format criteo (N: the dense features of a record)" },
        { "{" CLUSTER ", 'data': {'format': 'libsvm', 'train_files': ['a.svm']}, 'model': {'input': [1], 'head': "
          "'logistic', " EMB("'name': 'e', 'dim': 4") "'layers': [{'type': 'dense', 'units': 1}]}}",
          "model.input: [1], but a record of data.format libsvm has 0 dense features" },
        { "{" CLUSTER ", 'data': {'format': 'libsvm', 'train_files': ['a.svm']}, 'model': {'input': [0], 'head': "
          "'logistic', 'layers': [{'type': 'dense', 'units': 1}]}}",
          "model.input: [0] and no model.embeddings: the model has no input" },
        { "{" CLUSTER ", 'data': {'format': 'csv', 'train_files': ['a.csv'], 'csv_features': 5}, 'model': {'input': [4], "
          "'head': 'mse', 'layers': [{'type': 'dense', 'units': 1}]}}",
          "model.input: [4], but a record of data.format csv has 5 dense features (data.csv_features)" },
        { "{" CLUSTER ", 'data': {'format': 'csv', 'train_files': ['a.csv']}, 'model': {'input': [0], "
          "'head': 'mse', 'layers': [{'type': 'dense', 'units': 1}]}}",
          "model.input: [0] and no model.embeddings: the model has no input" },
        /* data */
        { "{" BASE ", 'data': {'format': 'parquet'}}", "data.format: \"parquet\" is not one of idx, libsvm, criteo, csv, tfrecord" },
        { "{" CLUSTER ", 'data': {'format': 'criteo'}, " CTR_MODEL("") "}",
          "data.train_files: missing (required for data.format criteo)" },
        { "{" CLUSTER ", 'data': {'format': 'criteo', 'train_files': []}, " CTR_MODEL("") "}",
          "data.train_files: must not be empty" },
        { "{" CLUSTER ", 'data': {'format': 'criteo', 'train_files': 'a.tsv'}, " CTR_MODEL("") "}",
          "data.train_files: expected an array of file names, got string \"a.tsv\"" },
        { "{" CLUSTER ", 'data': {'format': 'criteo', 'train_files': ['a', 3]}, " CTR_MODEL("") "}",
          "data.train_files[1]: expected a file name, got integer 3" },
        { "{" CLUSTER ", 'data': {'format': 'criteo', 'train_files': ['a'], 'test_files': ['b', '']}, " CTR_MODEL("") "}",
          "data.test_files[1]: must not be empty" },
        { "{" BASE ", 'data': {'train_files': ['a']}}",
          "data.train_files: is for the record formats (data.format libsvm, criteo, csv or tfrecord); idx reads "
          "data.train_images and the other IDX files" },
        { "{" BASE ", 'data': {'test_files': []}}",
          "data.test_files: is for the record formats (data.format libsvm, criteo, csv or tfrecord); idx reads "
          "data.train_images and the other IDX files" },
        { "{" BASE ", 'data': {'bad_lines': 'ignore'}}", "data.bad_lines: \"ignore\" is not one of error, skip" },
        /* data.tfrecord */
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a']}, " CTR_MODEL("") "}",
          "data.tfrecord: missing (required for data.format tfrecord: at least its label)" },
        { "{" CLUSTER ", 'data': {'format': 'criteo', 'train_files': ['a'], 'tfrecord': {'label': 'y'}}, " CTR_MODEL("") "}",
          "data.tfrecord: is for data.format tfrecord" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord.label': 'y'}, " CTR_MODEL("") "}",
          "data.tfrecord.label: unknown key" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'labels': 'y'}}, " CTR_MODEL("") "}",
          "data.tfrecord.labels: unknown key" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'dense': []}}, " CTR_MODEL("") "}",
          "data.tfrecord.label: missing" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': 'y', "
          "'dense': [{'name': 'a', 'dtype': 'string'}]}}, " CTR_MODEL("") "}",
          "data.tfrecord.dense[0].dtype: \"string\" is not allowed here, only float32 or int64" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': 'y', "
          "'dense': [{'name': 'a', 'shape': [0]}]}}, " CTR_MODEL("") "}",
          "data.tfrecord.dense[0].shape[0]: 0 is out of range [1, 1048576]" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': 'y', "
          "'dense': [{'name': 'a', 'default_value': 'x'}]}}, " CTR_MODEL("") "}",
          "data.tfrecord.dense[0].default_value: expected a finite number, got string \"x\"" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': 'y', "
          "'dense': [{'name': 'a'}], 'sparse': [{'name': 'y'}]}}, " CTR_MODEL("") "}",
          "data.tfrecord.sparse[0].name: \"y\" is also data.tfrecord.label" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': 'y', "
          "'image': {'name': 'i', 'shape': [28, 28]}}}, " CTR_MODEL("") "}",
          "data.tfrecord.image.shape: has 2 dimensions, 3 to 3" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': 'y', "
          "'compression': 'GZIP'}}, " CTR_MODEL("") "}",
          "data.tfrecord.compression: \"GZIP\" is not one of auto, none, gzip, zlib" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': 'y', "
          "'max_record_bytes': 8}}, " CTR_MODEL("") "}",
          "data.tfrecord.max_record_bytes: 8 is out of range [64, 1073741824]" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': 'y', "
          "'dense': [{'name': 'a', 'shape': [2]}]}}, " CTR_MODEL("") "}",
          "model.input: [13], but a record of data.format tfrecord has 2 dense features (data.tfrecord.dense and image)" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': 'y', "
          "'sparse': [{'name': 'c'}]}}, 'model': {'input': [0], 'head': 'logistic', 'embeddings': [{'name': 'e', "
          "'dim': 2, 'fields': ['d']}], 'layers': [{'type': 'dense', 'units': 1}]}}",
          "model.embeddings[0].fields[0]: \"d\" is not a feature of data.tfrecord.sparse" },
        { "{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': 'y', "
          "'image': {'name': 'i', 'shape': [1, 4, 4]}}}, 'model': {'input': [1, 4, 5], 'layers': [{'type': 'flatten'}, "
          "{'type': 'dense', 'units': 2}]}}",
          "model.input: [1, 4, 5], but data.tfrecord.image.shape is [1, 4, 4]" },

        { "{" BASE ", 'data': {'max_ids_per_example': 0}}",
          "data.max_ids_per_example: 0 is out of range [1, 1048576]" },
        { "{" BASE ", 'data': {'max_ids_per_example': 1048577}}",
          "data.max_ids_per_example: 1048577 is out of range [1, 1048576]" },
        { "{" BASE ", 'data': {'csv_features': -1}}", "data.csv_features: -1 is out of range [0, 1048576]" },
        /* the sparse optimizer */
        { "{" BASE ", 'training': {'sparse_optimizer': 'adam'}}",
          "training.sparse_optimizer: \"adam\" is not one of sgd, adagrad, ftrl" },
        { "{" BASE ", 'training': {'sparse_learning_rate': -0.1}}",
          "training.sparse_learning_rate: -0.1 is out of range [0, 10]" },
        { "{" BASE ", 'training': {'ftrl_l1': -1}}", "training.ftrl_l1: -1 is out of range [0, 1e+06]" },
        { "{" BASE ", 'training': {'ftrl_l2': -1}}", "training.ftrl_l2: -1 is out of range [0, 1e+06]" },
        { "{" BASE ", 'training': {'ftrl_beta': 'x'}}", "training.ftrl_beta: expected a number, got string \"x\"" },
        { "{" BASE ", 'training': {'ftrl_lr_power': 0.5}}", "training.ftrl_lr_power: 0.5 is out of range [-10, 0]" },
        { "{" BASE ", 'training': {'ftrl_lr_power': -11}}", "training.ftrl_lr_power: -11 is out of range [-10, 0]" },
        { "{" BASE ", 'rpc': {'compression': 'int4'}}",
          "rpc.compression: \"int4\" is not one of auto, none, bf16, int8, topk:R (R a ratio in (0, 1), e.g. topk:0.01)" },
        { "{" BASE ", 'rpc': {'compression': 'topk:1.5'}}",
          "rpc.compression: \"topk:1.5\" has a top-k ratio that is not a number in (0, 1) (topk:0.01 sends the "
          "largest 1% of each block of 256 values)" },
        { "{" BASE ", 'rpc': {'compression': 'topk:0'}}",
          "rpc.compression: \"topk:0\" has a top-k ratio that is not a number in (0, 1) (topk:0.01 sends the "
          "largest 1% of each block of 256 values)" },
        { "{" BASE ", 'rpc': {'compression': 'topk:'}}",
          "rpc.compression: \"topk:\" has a top-k ratio that is not a number in (0, 1) (topk:0.01 sends the "
          "largest 1% of each block of 256 values)" },
        { "{" BASE ", 'rpc': {'compression': 'topk:nan'}}",
          "rpc.compression: \"topk:nan\" has a top-k ratio that is not a number in (0, 1) (topk:0.01 sends the "
          "largest 1% of each block of 256 values)" },
        { "{" BASE ", 'rpc': {'compression': 8}}", "rpc.compression: expected a string, got integer 8" },
        { "{" BASE ", 'rpc': {'compression_min_bytes': -1}}",
          "rpc.compression_min_bytes: -1 is out of range [0, 1099511627776]" },
        { "{" BASE ", 'rpc': {'compression': 'int8', 'wire_dtype': 'bfloat16'}}",
          "rpc.wire_dtype: bfloat16 contradicts rpc.compression \"int8\" (rpc.wire_dtype bfloat16 is the older "
          "spelling of rpc.compression bf16: set only one)" },
        /* syntax and shape of the file */
        { "{" BASE ",\n  'training': {'batch_size': }\n}",
          "line 2 column 30: unexpected token near '}'" },
        { "{" BASE ", 'ps': {}, 'ps': {}}", "line 1 column 202: duplicate object key near '\"ps\"'" },
        { "[1, 2]", "expected an object at the top level, got array" },
        { "", "line 1 column 0: '[' or '{' expected near end of file" },
};

static void test_bad_files(void **state) {
        unsigned failed = 0;

        for (size_t i = 0; i < ELEMENTSOF(bad_cases); i++) {
                struct job_config *c = NULL;
                char err[600] = "", want[600];
                int r;

                write_json(xpath, bad_cases[i].json);
                snprintf(want, sizeof(want), "%s: %s", xpath, bad_cases[i].error);
                r = config_load(xpath, &c, err, sizeof(err));
                if (r != -EINVAL || strcmp(err, want) != 0 || c) {
                        print_error("case %zu: r=%d\n  got:  %s\n  want: %s\n", i, r, err, want);
                        failed++;
                }
                config_free(c);
        }
        print_message("%zu malformed job files\n", ELEMENTSOF(bad_cases));
        assert_int_equal(failed, 0);
}

static void test_file_errors(void **state) {
        struct job_config *c = NULL;
        char err[512], want[512], path[sizeof(scratch_dir) + 32];

        snprintf(path, sizeof(path), "%s/nope.json", scratch_dir);
        assert_int_equal(config_load(path, &c, err, sizeof(err)), -ENOENT);
        snprintf(want, sizeof(want), "%s: cannot open: No such file or directory", path);
        assert_string_equal(err, want);
        assert_null(c);

        assert_int_equal(config_load(scratch_dir, &c, err, sizeof(err)), -EISDIR);
        snprintf(want, sizeof(want), "%s: cannot open: Is a directory", scratch_dir);
        assert_string_equal(err, want);

        /* A string without "job" takes its name from the origin; an unusable origin is an error. */
        assert_int_equal(config_load_string("{'x': 1}", "jobs/x.json", &c, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "jobs/x.json: line 1 column 2: string or '}' expected near '''");
        {
                char *j = dq("{" BASE "}");
                assert_int_equal(config_load_string(j, "my job.json", &c, err, sizeof(err)), -EINVAL);
                assert_string_equal(err, "my job.json: job: missing, and the file name \"my job\" is not a valid "
                                         "job name ([A-Za-z0-9_.-]+, not starting with a dot, at most 64 characters)");
                assert_int_equal(config_load_string(j, "jobs/.hidden.json", &c, err, sizeof(err)), -EINVAL);
                assert_int_equal(config_load_string(j, "jobs/a.b.json", &c, err, sizeof(err)), 0);
                assert_string_equal(c->name, "a.b");
                c = config_free(c);
                assert_int_equal(config_load_string(j, "/etc/psfleet/jobs/fmnist.json", &c, err, sizeof(err)), 0);
                assert_string_equal(c->name, "fmnist");
                c = config_free(c);
                /* A tiny error buffer truncates but never overflows. */
                free(j);
                j = dq("{" BASE ", 'training': {'batch_size': 0}}");
                assert_int_equal(config_load_string(j, "jobs/x.json", &c, err, 12), -EINVAL);
                assert_string_equal(err, "jobs/x.json");
                assert_int_equal(config_load_string(j, "jobs/x.json", &c, NULL, 0), -EINVAL);
                free(j);
        }
}

static struct job_config *load_string_ok(const char *json) {
        struct job_config *c = NULL;
        char err[512] = "", *d = dq(json);
        int r = config_load_string(d, "jobs/x.json", &c, err, sizeof(err));

        if (r < 0)
                print_error("unexpected error: %s\n", err);
        assert_int_equal(r, 0);
        free(d);
        return c;
}

static void test_task(void **state) {
        struct job_config *c = load_string_ok("{" BASE "}");
        struct task t = { ROLE_CHIEF, 99 };
        char err[512];
        static const struct { const char *role, *index, *error; } bad[] = {
                { "worker", "2", "jobs/x.json: task index 2 is out of range: cluster has 2 worker tasks (0..1)" },
                { "ps", "1", "jobs/x.json: task index 1 is out of range: cluster has 1 ps task (0..0)" },
                { "worker", "1x", "jobs/x.json: task index \"1x\" is not a whole decimal number" },
                { "worker", "-1", "jobs/x.json: task index \"-1\" is not a whole decimal number" },
                { "worker", " 1", "jobs/x.json: task index \" 1\" is not a whole decimal number" },
                { "worker", "", "jobs/x.json: task index \"\" is not a whole decimal number" },
                { "worker", "99999999999999999999", "jobs/x.json: task index \"99999999999999999999\" is not a whole decimal number" },
                { "boss", "0", "jobs/x.json: task type \"boss\" is not one of chief, ps, worker, evaluator" },
                { "ps_backup", "0", "jobs/x.json: task type \"ps_backup\" is not one of chief, ps, worker, evaluator" },
                { "evaluator", "0", "jobs/x.json: task index 0 is out of range: cluster has 0 evaluator tasks" },
        };

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                assert_int_equal(config_parse_task(c, bad[i].role, bad[i].index, &t, err, sizeof(err)), -EINVAL);
                assert_string_equal(err, bad[i].error);
                assert_int_equal(t.index, 99); /* untouched on failure */
        }
        assert_int_equal(config_parse_task(c, "worker", "1", &t, err, sizeof(err)), 0);
        assert_int_equal(t.role, ROLE_WORKER);
        assert_int_equal(t.index, 1);
        assert_int_equal(config_parse_task(c, "master", "0", &t, err, sizeof(err)), 0);
        assert_int_equal(t.role, ROLE_CHIEF);
        assert_int_equal(config_parse_task(c, "ps", "0", &t, err, sizeof(err)), 0);
        assert_int_equal(t.role, ROLE_PS);
        config_free(c);
        /* a job file's cluster may name the evaluator too */
        c = load_string_ok("{'cluster': {'chief': ['localhost:7000'], 'ps': ['localhost:7001'], "
                           "'worker': ['localhost:7002'], 'evaluator': ['localhost:7009']}, " MODEL "}");
        assert_int_equal(config_parse_task(c, "evaluator", "0", &t, err, sizeof(err)), 0);
        assert_int_equal(t.role, ROLE_EVALUATOR);
        assert_int_equal(t.index, 0);
        assert_string_equal(config_endpoint(c, t)->addr, "localhost:7009");
        assert_int_equal(config_parse_task(c, "evaluator", "1", &t, err, sizeof(err)), -EINVAL);
        config_free(c);
}

static void test_tf_config(void **state) {
        struct job_config *c = load_string_ok("{" BASE "}");
        struct task t = { ROLE_CHIEF, 99 };
        bool have = true;
        char err[512], *before = config_canonical_json(c), *after;
        static const struct { const char *json, *error; } bad[] = {
                { "{'task': ", "TF_CONFIG: line 1 column 9: unexpected token near end of file" },
                { "[]", "TF_CONFIG: expected an object at the top level, got array" },
                { "{'tasks': {}}", "TF_CONFIG: tasks: unknown key" },
                { "{'task': {'type': 'boss', 'index': 0}}",
                  "TF_CONFIG: task.type: \"boss\" is not one of chief, master, ps, worker, evaluator" },
                /* the evaluator: a task when the cluster has one, at most one */
                { "{'task': {'type': 'evaluator', 'index': 0}}",
                  "TF_CONFIG: task.index: 0 is out of range: cluster has 0 evaluator tasks" },
                { "{'cluster': {'chief': ['h:1'], 'ps': ['h:2'], 'worker': ['h:3'], 'evaluator': ['h:4']}, "
                  "'task': {'type': 'evaluator', 'index': 1}}",
                  "TF_CONFIG: task.index: 1 is out of range: cluster has 1 evaluator task" },
                { "{'cluster': {'chief': ['h:1'], 'ps': ['h:2'], 'worker': ['h:3'], 'evaluator': ['h:4', 'h:5']}}",
                  "TF_CONFIG: cluster.evaluator: must have at most 1 entry, has 2" },
                { "{'cluster': {'chief': ['h:1'], 'ps': ['h:2'], 'worker': ['h:3'], 'evaluator': ['h']}}",
                  "TF_CONFIG: cluster.evaluator[0]: \"h\" is not host:port (missing port)" },
                { "{'cluster': {'chief': ['h:1'], 'ps': ['h:2'], 'worker': ['h:3'], 'evaluator': 'h:4'}}",
                  "TF_CONFIG: cluster.evaluator: expected an array of \"host:port\" strings, got string \"h:4\"" },
                { "{'environment': 1}", "TF_CONFIG: environment: expected a string, got integer 1" },
                /* sparseCluster: the ps and this task only, so each entry must be the job file's */
                { "{'cluster': {'chief': ['h:1'], 'ps': ['h:2'], 'worker': ['h:3']}, 'sparseCluster': {}}",
                  "TF_CONFIG: sparseCluster: conflicts with cluster (give one of them)" },
                { "{'sparseCluster': {'ps': ['localhost:7001'], 'worker': {'1': 'localhost:7009'}}, "
                  "'task': {'type': 'worker', 'index': 1}}",
                  "TF_CONFIG: sparseCluster.worker.1: \"localhost:7009\" disagrees with the job file's "
                  "cluster.worker[1] \"localhost:7003\"" },
                { "{'sparseCluster': {'ps': ['localhost:7001', 'localhost:7004']}}",
                  "TF_CONFIG: sparseCluster.ps[1]: is not in the job file's cluster, which has 1 ps task" },
                { "{'sparseCluster': {'worker': {'x': 'localhost:7002'}}}",
                  "TF_CONFIG: sparseCluster.worker.x: \"x\" is not a task index (0 to 4095)" },
                { "{'sparseCluster': {'boss': []}}", "TF_CONFIG: sparseCluster.boss: unknown key" },
                { "{'sparseCluster': {'ps': 'localhost:7001'}}",
                  "TF_CONFIG: sparseCluster.ps: expected an array or an object of \"host:port\" strings by index, "
                  "got string \"localhost:7001\"" },
                { "{'sparseCluster': {'ps': ['localhost:7001']}, 'task': {'type': 'worker', 'index': 2}}",
                  "TF_CONFIG: task.index: 2 is out of range: cluster has 2 worker tasks (0..1)" },
                { "{'task': {'index': 0}}", "TF_CONFIG: task.type: missing" },
                { "{'task': {'type': 'worker', 'index': 2}}",
                  "TF_CONFIG: task.index: 2 is out of range: cluster has 2 worker tasks (0..1)" },
                { "{'task': {'type': 'worker', 'index': '1'}}",
                  "TF_CONFIG: task.index: expected an integer, got string \"1\"" },
                { "{'task': {'type': 'worker', 'index': -1}}", "TF_CONFIG: task.index: -1 is negative" },
                { "{'task': {'type': 'worker', 'idx': 1}}", "TF_CONFIG: task.idx: unknown key" },
                { "{'cluster': {'chief': ['h:1'], 'ps': ['h'], 'worker': ['h:3']}, 'task': {'type': 'ps', 'index': 0}}",
                  "TF_CONFIG: cluster.ps[0]: \"h\" is not host:port (missing port)" },
                { "{'cluster': {'chief': ['h:1'], 'ps': ['h:2'], 'worker': ['h:3']}, 'task': {'type': 'worker', 'index': 1}}",
                  "TF_CONFIG: task.index: 1 is out of range: cluster has 1 worker task (0..0)" },
                { "{'rpc_layer': 'grpc+verbs'}", "TF_CONFIG: rpc_layer: \"grpc+verbs\" is not \"grpc\"" },
        };

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                char *j = dq(bad[i].json);
                assert_int_equal(config_apply_tf_config(c, j, &t, &have, err, sizeof(err)), -EINVAL);
                if (strcmp(err, bad[i].error) != 0)
                        print_error("TF_CONFIG case %zu\n", i);
                assert_string_equal(err, bad[i].error);
                assert_int_equal(t.index, 99);
                assert_true(have);
                free(j);
        }
        after = config_canonical_json(c);
        assert_string_equal(before, after); /* failures leave the config alone */
        free(after);

        assert_int_equal(config_apply_tf_config(c, NULL, &t, &have, err, sizeof(err)), 0);
        assert_false(have);
        {
                /* the training-operator's sparseCluster (the job file's cluster stays), and a cluster with
                 * an evaluator, which joins no training cluster */
                char *j = dq("{'sparseCluster': {'ps': ['LOCALHOST:7001'], 'worker': {'1': 'localhost:7003'}}, "
                             "'task': {'type': 'worker', 'index': 1}}");
                assert_int_equal(config_apply_tf_config(c, j, &t, &have, err, sizeof(err)), 0);
                assert_true(have);
                assert_int_equal(t.role, ROLE_WORKER);
                assert_int_equal(t.index, 1);
                after = config_canonical_json(c);
                assert_string_equal(before, after);
                free(after);
                free(j);
                j = dq("{'sparseCluster': {'ps': ['localhost:7001'], 'chief': {'0': 'localhost:7000'}, "
                       "'evaluator': {'0': 'e:1'}}, 'task': {'type': 'ps', 'index': 0}}");
                assert_int_equal(config_apply_tf_config(c, j, &t, &have, err, sizeof(err)), 0);
                assert_int_equal(t.role, ROLE_PS);
                free(j);
                struct job_config *c2 = load_string_ok("{" BASE "}");
                j = dq("{'cluster': {'chief': ['h:1'], 'ps': ['h:2'], 'worker': ['h:3'], 'evaluator': ['h:4']}, "
                       "'task': {'type': 'chief', 'index': 0}}");
                assert_int_equal(config_apply_tf_config(c2, j, &t, &have, err, sizeof(err)), 0);
                assert_int_equal(t.role, ROLE_CHIEF);
                assert_int_equal(c2->cluster.n_worker, 1);
                assert_string_equal(c2->cluster.worker[0].addr, "h:3");
                /* the chief knows of the evaluator (it then skips its periodic evaluations) */
                assert_int_equal(c2->cluster.n_evaluator, 1);
                assert_string_equal(c2->cluster.evaluator[0].addr, "h:4");
                uint64_t fp = config_fingerprint(c2);
                free(j);
                /* the evaluator's own task; the evaluator is not in the fingerprint (it trains nothing) */
                struct job_config *c3 = load_string_ok("{" BASE "}");
                j = dq("{'cluster': {'chief': ['h:1'], 'ps': ['h:2'], 'worker': ['h:3'], 'evaluator': ['h:4']}, "
                       "'task': {'type': 'evaluator', 'index': 0}}");
                assert_int_equal(config_apply_tf_config(c3, j, &t, &have, err, sizeof(err)), 0);
                assert_true(have);
                assert_int_equal(t.role, ROLE_EVALUATOR);
                assert_int_equal(t.index, 0);
                assert_string_equal(role_name(t.role), "evaluator");
                assert_string_equal(config_endpoint(c3, t)->addr, "h:4");
                assert_int_equal(config_fingerprint(c3), fp);
                free(j);
                j = dq("{'cluster': {'chief': ['h:1'], 'ps': ['h:2'], 'worker': ['h:3']}}");
                assert_int_equal(config_apply_tf_config(c3, j, NULL, NULL, err, sizeof(err)), 0);
                assert_int_equal(c3->cluster.n_evaluator, 0);
                assert_int_equal(config_fingerprint(c3), fp);
                free(j);
                /* sparseCluster: the evaluator's own entry only */
                j = dq("{'sparseCluster': {'evaluator': {'0': 'e:1'}}, 'task': {'type': 'evaluator', 'index': 0}}");
                assert_int_equal(config_apply_tf_config(c3, j, &t, &have, err, sizeof(err)), 0);
                assert_int_equal(t.role, ROLE_EVALUATOR);
                free(j);
                config_free(c3);
                config_free(c2);
        }
        {
                char *j = dq("{'task': {'type': 'worker', 'index': 1}, 'environment': 'cloud'}");
                assert_int_equal(config_apply_tf_config(c, j, &t, &have, err, sizeof(err)), 0);
                assert_true(have);
                assert_int_equal(t.role, ROLE_WORKER);
                assert_int_equal(t.index, 1);
                free(j);
        }
        {
                char *j = dq("{'cluster': {'master': ['h:1'], 'ps': ['h:2', 'h:4'], 'worker': ['h:3']}, "
                             "'task': {'type': 'master', 'index': 0}, 'rpc_layer': 'grpc'}");
                assert_int_equal(config_apply_tf_config(c, j, &t, &have, err, sizeof(err)), 0);
                assert_true(have);
                assert_int_equal(t.role, ROLE_CHIEF);
                assert_int_equal(t.index, 0);
                assert_int_equal(c->cluster.n_ps, 2);
                assert_string_equal(c->cluster.ps[1].addr, "h:4");
                assert_string_equal(c->cluster_origin, "TF_CONFIG");
                free(j);
                /* The cluster now comes from TF_CONFIG, and messages say so. */
                assert_int_equal(config_parse_task(c, "worker", "1", &t, err, sizeof(err)), -EINVAL);
                assert_string_equal(err, "TF_CONFIG: task index 1 is out of range: cluster has 1 worker task (0..0)");
        }
        after = config_canonical_json(c);
        assert_string_not_equal(before, after);
        free(before);
        free(after);
        print_message("%zu malformed TF_CONFIG values\n", ELEMENTSOF(bad));
        config_free(c);
}

/* A state path's ".." that stays under STATE_DIR/JOB/, and any absolute path, are fine (the refused
 * ones are in bad_cases). */
static void test_state_paths(void **state) {
        struct job_config *c = load_string_ok("{" BASE ", 'supervisor': {'checkpoint_dir': 'a/../ckpt', "
                                              "'summary_dir': '/srv/x/../s'}}");
        assert_string_equal(c->supervisor.checkpoint_dir, "a/../ckpt");
        assert_string_equal(c->supervisor.summary_dir, "/srv/x/../s");
        config_free(c);
}

static void test_canonical(void **state) {
        struct job_config *a, *b, *m;
        char *ja, *jb, *jm, msg[256];

        a = load_string_ok("{" BASE ", 'training': {'batch_size': 32, 'optimizer': 'sgd'}, 'data': {'dir': '/x'}}");
        b = load_string_ok("{\n 'training' : { 'optimizer':'sgd',\n 'batch_size':32 },\n"
                           " 'model': {'layers': [{'units': 10, 'type': 'dense', 'init': 'default'}], 'input': [1, 1, 784], 'seed': 1},\n"
                           " 'cluster': {'worker': ['localhost:7002', 'localhost:7003'], 'ps': ['localhost:7001'],\n"
                           "             'chief': ['localhost:7000']},\n"
                           " 'supervisor': {'keep_checkpoints': 9}, 'device': {'device': 'cpu'}, 'job': 'other'}");
        ja = config_canonical_json(a);
        jb = config_canonical_json(b);
        assert_non_null(ja);
        assert_string_equal(ja, jb);
        assert_true(config_fingerprint(a) == config_fingerprint(b));
        assert_int_equal(config_diff(ja, jb, msg, sizeof(msg)), 0);
        assert_string_equal(ja,
                "{\"cluster\":{\"chief\":[\"localhost:7000\"],\"ps\":[\"localhost:7001\"],"
                "\"worker\":[\"localhost:7002\",\"localhost:7003\"]},"
                "\"model\":{\"input\":[1,1,784],"
                "\"layers\":[{\"init\":\"default\",\"type\":\"dense\",\"units\":10}],"
                "\"seed\":1},\"ps\":{\"split_bytes\":262144},"
                "\"training\":{\"batch_size\":32,\"beta1\":0.90000000000000002,\"beta2\":0.999,\"epsilon\":9.9999999999999995e-8,"
                "\"gradient_norm_action\":\"reject\",\"initial_accumulator\":0.10000000000000001,\"learning_rate\":0.01,"
                "\"lr_decay_rate\":0.95999999999999996,\"lr_decay_steps\":1000,\"lr_schedule\":\"constant\","
                "\"lr_staircase\":false,\"max_gradient_norm\":0.0,\"max_steps\":1000,\"mode\":\"async\","
                "\"momentum\":0.90000000000000002,\"nesterov\":false,\"optimizer\":\"sgd\","
                "\"replicas_to_aggregate\":0,\"seed\":1,"
                "\"staleness\":4,\"total_num_replicas\":0}}");

        /* Node-local keys (BLAS threads, how often to report) leave the fingerprint alone. */
        {
                struct job_config *t = load_string_ok("{" CLUSTER ", " MODEL ", 'training': {'batch_size': 32, "
                                                      "'optimizer': 'sgd', 'threads': 8, 'report_every_steps': 7}}");
                assert_true(config_fingerprint(t) == config_fingerprint(a));
                config_free(t);
        }

        /* A different layer: a different fingerprint, and the diff names the layer's key. */
        m = load_string_ok("{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dense', 'units': 128}, "
                           "{'type': 'relu'}, {'type': 'dense', 'units': 10}]}}");
        config_free(b);
        b = load_string_ok("{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dense', 'units': 64}, "
                           "{'type': 'relu'}, {'type': 'dense', 'units': 10}]}}");
        jm = config_canonical_json(m);
        free(jb);
        jb = config_canonical_json(b);
        assert_true(config_fingerprint(m) != config_fingerprint(b));
        assert_true(config_fingerprint(m) != config_fingerprint(a));
        assert_int_equal(config_diff(jm, jb, msg, sizeof(msg)), 1);
        assert_string_equal(msg, "model.layers[0].units: ours 128, theirs 64");
        assert_int_equal(config_diff(ja, jm, msg, sizeof(msg)), 1);
        assert_string_equal(msg, "model.layers: ours has 1 entries, theirs 3");

        /* A different cluster. */
        free(jb);
        config_free(b);
        b = load_string_ok("{'cluster': {'chief': ['localhost:7000'], 'ps': ['localhost:7001'], "
                           "'worker': ['localhost:7002', 'localhost:7003', 'localhost:7004']}, " MODEL ", "
                           "'training': {'batch_size': 32, 'optimizer': 'sgd'}}");
        jb = config_canonical_json(b);
        assert_int_equal(config_diff(jb, ja, msg, sizeof(msg)), 1);
        assert_string_equal(msg, "cluster.worker: ours has 3 entries, theirs 2");
        free(jb);
        config_free(b);
        b = load_string_ok("{'cluster': {'chief': ['localhost:7000'], 'ps': ['localhost:7001'], "
                           "'worker': ['localhost:7002', 'localhost:9999']}, " MODEL ", "
                           "'training': {'batch_size': 32, 'optimizer': 'adam'}}");
        jb = config_canonical_json(b);
        assert_int_equal(config_diff(ja, jb, msg, sizeof(msg)), 1);
        assert_string_equal(msg, "cluster.worker[1]: ours \"localhost:7003\", theirs \"localhost:9999\"");

        /* Missing keys and bad JSON. */
        assert_int_equal(config_diff("{\"a\":1,\"b\":2}", "{\"a\":1}", msg, sizeof(msg)), 1);
        assert_string_equal(msg, "b: ours 2, theirs missing");
        assert_int_equal(config_diff("{\"a\":{\"x\":true}}", "{\"a\":{\"x\":false}}", msg, sizeof(msg)), 1);
        assert_string_equal(msg, "a.x: ours true, theirs false");
        assert_int_equal(config_diff("{\"a\":1}", "{\"a\":\"1\"}", NULL, 0), 1);
        assert_int_equal(config_diff("{", "{}", msg, sizeof(msg)), -EINVAL);

        free(ja);
        free(jb);
        free(jm);
        config_free(a);
        config_free(b);
        config_free(m);
}

/* The sparse model and record data keys: values, defaults, the variables of the widened model, and
 * the fingerprint that covers them. */
/* data.tfrecord: the spec as written, fields of the embeddings by name or index, an image as input. */
static void test_tfrecord_keys(void **state) {
        struct job_config *c;

        (void) state;
        c = load_string_ok("{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a.tfrecord.gz'], "
                           "'tfrecord': {'label': 'clicked', 'dense': [{'name': 'I1'}, {'name': 'pos', 'dtype': 'int64', "
                           "'shape': [2, 2], 'default_value': -1}], 'sparse': [{'name': 'C1'}, {'name': 'user', "
                           "'dtype': 'int64'}], 'compression': 'zlib', 'max_record_bytes': 4096}}, "
                           "'model': {'input': [5], 'head': 'logistic', 'embeddings': [{'name': 'e', 'dim': 4, "
                           "'fields': ['user', 0]}], 'layers': [{'type': 'dense', 'units': 1}]}}");
        const struct tfr_spec *s = &c->data.tfrecord;
        assert_int_equal(c->data.format, DATA_TFRECORD);
        assert_string_equal(s->label.name, "clicked");
        assert_int_equal(s->n_dense, 2);
        assert_string_equal(s->dense[0].name, "I1");
        assert_int_equal(s->dense[0].kind, TFR_FLOAT);
        assert_int_equal(s->dense[0].length, 1);
        assert_false(s->dense[0].has_default);
        assert_int_equal(s->dense[1].kind, TFR_INT64);
        assert_int_equal(s->dense[1].length, 4);
        assert_true(s->dense[1].has_default && s->dense[1].default_value == -1);
        assert_int_equal(s->n_sparse, 2);
        assert_int_equal(s->sparse[0].kind, TFR_BYTES);
        assert_int_equal(s->sparse[1].kind, TFR_INT64);
        assert_int_equal(s->compression, TFR_ZLIB);
        assert_int_equal(s->max_record_bytes, 4096);
        assert_int_equal(tfr_spec_dense(s), 5);
        assert_int_equal(c->model.emb[0].n_fields, 2);
        assert_int_equal(c->model.emb[0].fields[0], 1);
        assert_int_equal(c->model.emb[0].fields[1], 0);
        config_free(c);
        c = load_string_ok("{" CLUSTER ", 'data': {'format': 'tfrecord', 'train_files': ['a'], 'tfrecord': {'label': "
                           "'y', 'image': {'name': 'img', 'shape': [1, 28, 28]}}}, 'model': {'input': [1, 28, 28], "
                           "'layers': [{'type': 'conv2d', 'filters': 4, 'kernel': 3}, {'type': 'flatten'}, "
                           "{'type': 'dense', 'units': 10}]}}");
        assert_int_equal(c->data.tfrecord.image.kind, TFR_BYTES);
        assert_int_equal(c->data.tfrecord.compression, TFR_AUTO);
        assert_int_equal(c->data.tfrecord.max_record_bytes, 16u << 20);
        assert_int_equal(tfr_spec_dense(&c->data.tfrecord), 784);
        config_free(c);
}

static void test_sparse_keys(void **state) {
        struct model_spec_var vars[MODEL_MAX_VARS];
        struct job_config *c, *d;
        char *ja, *jb, msg[256];
        size_t n_params;

        c = load_string_ok("{" CLUSTER ", 'data': {'format': 'criteo', 'dir': '/d', 'train_files': ['a.gz', '/b.gz'], "
                           "'test_files': ['t.gz'], 'bad_lines': 'skip', 'max_ids_per_example': 64}, "
                           "'model': {'input': [13], 'head': 'logistic', 'embeddings': ["
                           "{'name': 'cat', 'fields': 'all', 'dim': 16, 'vocab': 4294967296},"
                           "{'name': 'cross_2', 'fields': [0, 3], 'dim': 8, 'pooling': 'mean', 'init_stddev': 0, "
                           "'evict_after_steps': 100, 'max_rows': 1000, 'evict_policy': 'lfu', 'admit_after': 2, "
                           "'expected_rows': 500, 'disk_tier': true}], "
                           "'layers': [{'type': 'dense', 'units': 32}, {'type': 'relu'}, {'type': 'dense', 'units': 1}]}, "
                           "'ps': {'memory_limit_bytes': 1073741824}, "
                           "'training': {'sparse_optimizer': 'ftrl', 'sparse_learning_rate': 0.05, 'ftrl_l1': 0.1, "
                           "'ftrl_l2': 0.2, 'ftrl_beta': 1, 'ftrl_lr_power': -1}}");
        assert_int_equal(c->data.format, DATA_CRITEO);
        assert_int_equal(c->data.n_train_files, 2);
        assert_string_equal(c->data.train_files[0], "a.gz");
        assert_string_equal(c->data.train_files[1], "/b.gz");
        assert_int_equal(c->data.n_test_files, 1);
        assert_string_equal(c->data.test_files[0], "t.gz");
        assert_int_equal(c->data.bad_lines, BAD_LINES_SKIP);
        assert_int_equal(c->data.max_ids_per_example, 64);
        assert_int_equal(c->model.head, HEAD_LOGISTIC);
        assert_int_equal(c->model.n_embeddings, 2);
        assert_string_equal(c->model.emb[0].name, "cat");
        assert_int_equal(c->model.emb[0].n_fields, 26);
        for (uint32_t i = 0; i < 26; i++)
                assert_int_equal(c->model.emb[0].fields[i], i);
        assert_int_equal(c->model.emb[0].dim, 16);
        assert_true(c->model.emb[0].vocab == UINT64_C(4294967296));
        assert_int_equal(c->model.emb[0].pooling, POOL_SUM);
        assert_true(c->model.emb[0].init_stddev == 0.25);
        assert_int_equal(c->model.emb[0].evict_after_steps, 0);
        assert_string_equal(c->model.emb[1].name, "cross_2");
        assert_int_equal(c->model.emb[1].n_fields, 2);
        assert_int_equal(c->model.emb[1].fields[1], 3);
        assert_int_equal(c->model.emb[1].pooling, POOL_MEAN);
        assert_true(c->model.emb[1].init_stddev == 0);
        assert_int_equal(c->model.emb[1].evict_after_steps, 100);
        assert_int_equal(c->model.emb[1].max_rows, 1000);
        assert_int_equal(c->model.emb[1].expected_rows, 500);
        assert_int_equal(c->model.emb[1].admit_after, 2);
        assert_int_equal(c->model.emb[1].evict_policy, SPARSE_EVICT_LFU);
        assert_true(c->model.emb[1].disk_tier && !c->model.emb[0].disk_tier);
        assert_string_equal(c->ps.disk_tier_dir, "tier");
        assert_int_equal(c->model.emb[0].max_rows, 0);
        assert_int_equal(c->model.emb[0].admit_after, 0);
        assert_int_equal(c->model.emb[0].evict_policy, SPARSE_EVICT_AGE);
        assert_true(c->ps.memory_limit_bytes == UINT64_C(1073741824));
        assert_int_equal(c->training.sparse_optimizer, SPARSE_FTRL);
        assert_true(c->training.sparse_learning_rate == 0.05);
        assert_true(c->training.ftrl_l1 == 0.1 && c->training.ftrl_l2 == 0.2);
        assert_true(c->training.ftrl_beta == 1 && c->training.ftrl_lr_power == -1);
        /* the first dense layer reads 13 + 26 * 16 + 2 * 8 floats */
        assert_int_equal(model_spec_dense_input(&c->model), 13 + 26 * 16 + 2 * 8);
        assert_int_equal(model_spec_vars(&c->model, vars, &n_params), 4);
        assert_int_equal(vars[0].rows, 445);
        assert_int_equal(vars[0].cols, 32);
        assert_int_equal(vars[2].rows, 32);
        assert_int_equal(vars[2].cols, 1);
        assert_int_equal(n_params, 445 * 32 + 32 + 32 + 1);

        /* A different table: another fingerprint, and the diff names it; the data section is no part of it. */
        d = load_string_ok("{" CLUSTER ", 'data': {'format': 'criteo', 'dir': '/e', 'train_files': ['x.gz']}, "
                           "'model': {'input': [13], 'head': 'logistic', 'embeddings': ["
                           "{'name': 'cat', 'fields': 'all', 'dim': 16, 'vocab': 4294967296},"
                           "{'name': 'cross_2', 'fields': [0, 3], 'dim': 4, 'pooling': 'mean', 'init_stddev': 0, "
                           "'evict_after_steps': 100, 'max_rows': 1000, 'evict_policy': 'lfu', 'admit_after': 2, "
                           "'expected_rows': 500}], "
                           "'layers': [{'type': 'dense', 'units': 32}, {'type': 'relu'}, {'type': 'dense', 'units': 1}]}, "
                           "'ps': {'memory_limit_bytes': 1073741824}, "
                           "'training': {'sparse_optimizer': 'ftrl', 'sparse_learning_rate': 0.05, 'ftrl_l1': 0.1, "
                           "'ftrl_l2': 0.2, 'ftrl_beta': 1, 'ftrl_lr_power': -1}}");
        ja = config_canonical_json(c);
        jb = config_canonical_json(d);
        assert_true(config_fingerprint(c) != config_fingerprint(d));
        assert_int_equal(config_diff(ja, jb, msg, sizeof(msg)), 1);
        assert_string_equal(msg, "model.embeddings[1].dim: ours 8, theirs 4");
        assert_non_null(strstr(ja, "{\"dim\":16,\"evict_after_steps\":0,\"fields\":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,"
                                   "14,15,16,17,18,19,20,21,22,23,24,25],\"init_stddev\":0.25,\"name\":\"cat\","
                                   "\"pooling\":\"sum\",\"vocab\":4294967296}"));
        free(jb);
        d->model.emb[1].dim = 8;
        jb = config_canonical_json(d);
        assert_string_equal(ja, jb);
        d->training.ftrl_l1 = 0.3;
        free(jb);
        jb = config_canonical_json(d);
        assert_int_equal(config_diff(ja, jb, msg, sizeof(msg)), 1);
        assert_string_equal(msg, "training.ftrl_l1: ours 0.10000000000000001, theirs 0.29999999999999999");
        free(ja);
        free(jb);
        config_free(c);
        config_free(d);

        /* LIBSVM: no dense features, one field; CSV regression; the defaults. */
        c = load_string_ok("{" CLUSTER ", 'data': {'format': 'libsvm', 'train_files': ['a.svm']}, "
                           "'model': {'input': [0], 'head': 'logistic', 'embeddings': [{'name': 'w', 'dim': 1}], "
                           "'layers': [{'type': 'dense', 'units': 1}]}}");
        assert_int_equal(c->model.emb[0].n_fields, 1);
        assert_int_equal(c->model.emb[0].fields[0], 0);
        assert_true(c->model.emb[0].init_stddev == 1.0);
        assert_int_equal(c->data.n_test_files, 0);
        assert_null(c->data.test_files);
        assert_int_equal(model_spec_vars(&c->model, vars, &n_params), 2);
        assert_int_equal(vars[0].rows, 1);
        config_free(c);
        c = load_string_ok("{" CLUSTER ", 'data': {'format': 'csv', 'train_files': ['a.csv'], 'csv_features': 5}, "
                           "'model': {'input': [5], 'head': 'mse', 'layers': [{'type': 'dense', 'units': 1}]}}");
        assert_int_equal(c->model.head, HEAD_MSE);
        assert_int_equal(c->data.csv_features, 5);
        assert_int_equal(model_spec_vars(&c->model, vars, &n_params), 2);
        config_free(c);
        c = load_string_ok("{" BASE "}");
        assert_int_equal(c->data.format, DATA_IDX);
        assert_int_equal(c->data.bad_lines, BAD_LINES_ERROR);
        assert_int_equal(c->data.max_ids_per_example, 1024);
        assert_int_equal(c->data.csv_features, 0);
        assert_int_equal(c->data.n_train_files, 0);
        assert_int_equal(c->model.head, HEAD_SOFTMAX);
        assert_int_equal(c->model.n_embeddings, 0);
        assert_int_equal(c->training.sparse_optimizer, SPARSE_ADAGRAD);
        assert_true(c->training.sparse_learning_rate == 0);
        assert_true(c->training.ftrl_l1 == 0 && c->training.ftrl_l2 == 0 && c->training.ftrl_beta == 0);
        assert_true(c->training.ftrl_lr_power == -0.5);
        /* a softmax spec needs 2..256 classes, a single-output head exactly 1 */
        c->model.head = HEAD_LOGISTIC;
        assert_int_equal(model_spec_vars(&c->model, vars, NULL), -EINVAL);
        c->model.layers[0].units = 1;
        assert_int_equal(model_spec_vars(&c->model, vars, NULL), 2);
        c->model.head = HEAD_SOFTMAX;
        assert_int_equal(model_spec_vars(&c->model, vars, NULL), -EINVAL);
        config_free(c);
}

static void test_instance(void **state) {
        char *job = NULL;
        int64_t i = 99;
        static const char *const bad[] = {
                "", ":1", "fmnist:", "fmnist:x", "fmnist:1x", "fmnist:-1", "fm nist:1", "fm/nist",
                "fmnist:1:2", "fmnist:99999999999", "a:+1",
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", /* 65 */
        };

        assert_int_equal(config_parse_instance("fmnist:1", &job, &i, NULL), 0);
        assert_string_equal(job, "fmnist");
        assert_int_equal(i, 1);
        free(job);
        assert_int_equal(config_parse_instance("fmnist", &job, &i, NULL), 0);
        assert_string_equal(job, "fmnist");
        assert_int_equal(i, -1);
        free(job);
        assert_int_equal(config_parse_instance("my_job-2.v1:0", &job, &i, NULL), 0);
        assert_string_equal(job, "my_job-2.v1");
        assert_int_equal(i, 0);
        free(job);

        job = NULL;
        i = 99;
        for (size_t k = 0; k < ELEMENTSOF(bad); k++) {
                if (config_parse_instance(bad[k], &job, &i, NULL) != -EINVAL)
                        print_error("instance %s\n", bad[k]);
                assert_null(job);
                assert_int_equal(i, 99);
        }

        /* psd's form for a backup (ps.replicas 2) */
        bool backup = true;
        assert_int_equal(config_parse_instance("fmnist:1", &job, &i, &backup), 0);
        assert_false(backup);
        free(job);
        assert_int_equal(config_parse_instance("fmnist:3:backup", &job, &i, &backup), 0);
        assert_string_equal(job, "fmnist");
        assert_int_equal(i, 3);
        assert_true(backup);
        free(job);
        assert_int_equal(config_parse_instance("fmnist:3:backup", &job, &i, NULL), -EINVAL);
        static const char *const bad_backup[] = {"fmnist:1:2", "fmnist:1:backups", "fmnist::backup", "fmnist:x:backup",
                                                 "fmnist:1:backup:", "fmnist:123456789012345678901234:backup"};
        job = NULL;
        i = 99;
        for (size_t k = 0; k < ELEMENTSOF(bad_backup); k++) {
                if (config_parse_instance(bad_backup[k], &job, &i, &backup) != -EINVAL)
                        print_error("instance %s\n", bad_backup[k]);
                assert_null(job);
                assert_int_equal(i, 99);
        }
}

static char *print_to_string(void (*print)(FILE *, bool), bool markdown) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);

        assert_non_null(f);
        print(f, markdown);
        fclose(f);
        return buf;
}

static void test_print_keys(void **state) {
        char *buf = print_to_string(config_print_keys, true);

        assert_non_null(strstr(buf, "| key | type | default | allowed | meaning |\n"));
        assert_non_null(strstr(buf, "| `training.batch_size` | integer | 64 | [1, 65536] | Examples per step per worker. |\n"));
        assert_non_null(strstr(buf, "| `training.optimizer` | string | \"momentum\" | sgd, momentum, adam, adagrad |"));
        free(buf);

        buf = print_to_string(config_print_keys, false);
        assert_non_null(strstr(buf, "  rpc.deadline_ms"));
        if (getenv("PSFLEET_PRINT_KEYS"))
                config_print_keys(stdout, true);
        free(buf);
}

/* var=value must make config_apply_env fail with want in its message. */
static void env_error(struct job_config *c, const char *var, const char *value, const char *want) {
        char err[256] = "";

        setenv(var, value, 1);
        assert_int_equal(config_apply_env(c, NULL, err, sizeof(err)), -EINVAL);
        unsetenv(var);
        if (!strstr(err, want))
                fail_msg("%s=%s: \"%s\" lacks \"%s\"", var, value, err, want);
}

/* Environment overrides: parsed as the key's type with its bounds, empty means none, and only the
 * section asked for; the settings that are no key; the device string's one limit. */
static void test_env_overrides(void **state) {
        struct job_config *c = load_ok(xpath, "{" BASE "}");
        char err[256] = "";

        assert_int_equal(c->rpc.initial_reconnect_backoff_ms, 100);
        assert_int_equal(c->rpc.max_reconnect_backoff_ms, 1000);
        assert_false(c->device.allow_soft_placement || c->device.cuda_tf32);

        setenv("PSFLEET_RPC_MAX_RECONNECT_BACKOFF_MS", "250", 1);
        setenv("PSFLEET_DEVICE", "gpu:2,0", 1);
        setenv("PSFLEET_ALLOW_SOFT_PLACEMENT", "on", 1);
        setenv("PSFLEET_RPC_INITIAL_RECONNECT_BACKOFF_MS", "", 1); /* empty: no override */
        assert_int_equal(config_apply_env(c, "rpc", err, sizeof(err)), 0);
        assert_int_equal(c->rpc.max_reconnect_backoff_ms, 250);
        assert_int_equal(c->rpc.initial_reconnect_backoff_ms, 100);
        assert_string_equal(c->device.device, "auto"); /* not its section */
        assert_int_equal(config_apply_env(c, "device", err, sizeof(err)), 0);
        assert_string_equal(c->device.device, "gpu:2,0");
        assert_true(c->device.allow_soft_placement);

        env_error(c, "PSFLEET_RPC_MAX_RECONNECT_BACKOFF_MS", "0",
                  "PSFLEET_RPC_MAX_RECONNECT_BACKOFF_MS: \"0\" is not an integer in [1, 3600000]");
        env_error(c, "PSFLEET_RPC_MAX_RECONNECT_BACKOFF_MS", "3600001", "is not an integer in [1, 3600000]");
        env_error(c, "PSFLEET_RPC_INITIAL_RECONNECT_BACKOFF_MS", "100ms", "PSFLEET_RPC_INITIAL_RECONNECT_BACKOFF_MS: \"100ms\"");
        env_error(c, "PSFLEET_RPC_INITIAL_RECONNECT_BACKOFF_MS", "-1", "is not an integer");
        env_error(c, "PSFLEET_GPU_MEMORY_FRACTION", "nan", "PSFLEET_GPU_MEMORY_FRACTION: \"nan\" is not a number in (0, 1]");
        env_error(c, "PSFLEET_CUDA_TF32", "2", "PSFLEET_CUDA_TF32: \"2\" is not 0, 1, true or false");
        env_error(c, "PSFLEET_DEVICE", "gpu:0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16", "lists more than 16 GPUs");
        env_error(c, "PSFLEET_DEVICE", "gpu:256", "(bad GPU index)");
        unsetenv("PSFLEET_RPC_MAX_RECONNECT_BACKOFF_MS");
        unsetenv("PSFLEET_DEVICE");
        unsetenv("PSFLEET_ALLOW_SOFT_PLACEMENT");
        unsetenv("PSFLEET_RPC_INITIAL_RECONNECT_BACKOFF_MS");
        config_free(c);

        /* the job file's device string has the same limit as the override */
        c = NULL;
        write_json(xpath, "{" BASE ", 'device': {'device': 'gpu:0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16'}}");
        assert_int_equal(config_load(xpath, &c, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "device.device: \"gpu:0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16\" lists more than 16 GPUs"));
        c = load_ok(xpath, "{" BASE ", 'device': {'device': 'gpu:255,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14'}}");
        config_free(c);

        /* settings that are no key */
        bool b = true;
        unsetenv("PSFLEET_TEST_FAKE_NO_GPU");
        assert_int_equal(config_env_bool("PSFLEET_TEST_FAKE_NO_GPU", &b, err, sizeof(err)), 0);
        assert_false(b);
        setenv("PSFLEET_TEST_FAKE_NO_GPU", "maybe", 1);
        assert_int_equal(config_env_bool("PSFLEET_TEST_FAKE_NO_GPU", &b, err, sizeof(err)), -EINVAL);
        assert_string_equal(err, "PSFLEET_TEST_FAKE_NO_GPU: \"maybe\" is not 0, 1, true or false");
        unsetenv("PSFLEET_TEST_FAKE_NO_GPU");
        setenv("PSFLEET_CONFIG_DIR", "/x", 1);
        assert_string_equal(config_env_value("PSFLEET_CONFIG_DIR"), "/x");
        unsetenv("PSFLEET_CONFIG_DIR");
        assert_null(config_env_value("PSFLEET_CONFIG_DIR"));

        /* defaults of one section */
        struct job_config d = { 0 };
        assert_int_equal(config_section_defaults(&d, "rpc"), 0);
        assert_int_equal(d.rpc.deadline_ms, 30000);
        assert_true(d.rpc.shared_memory);
        assert_string_equal(d.rpc.runtime_dir, "/run/psfleet");
        assert_null(d.device.device);
        assert_string_equal(d.rpc.compression, "auto");
        assert_int_equal(d.rpc.compression_min_bytes, 4096);
        free(d.rpc.runtime_dir);
        free(d.rpc.compression);
}

/* Keys added later leave a job that does not use them with the fingerprint it always had: the demo
 * job's is the value psfleet has given it since before model.head and the sparse keys existed, so a
 * chief restarted on a newer psfleet finds its job in its database. */
static void test_fingerprint_stable(void **state) {
        const char *src = getenv("PSFLEET_SOURCE_DIR");
        char err[512], *path, *j;
        struct job_config *c, *d;

        if (!src)
                fail_msg("PSFLEET_SOURCE_DIR is not set: ctest sets it to the source tree");
        path = strdup_printf("%s/examples/fmnist-mlp.json", src);
        if (config_load(path, &c, err, sizeof(err)) < 0)
                fail_msg("%s", err);
        assert_true(config_fingerprint(c) == UINT64_C(0xf6b312d584f224b0));
        j = config_canonical_json(c);
        assert_null(strstr(j, "\"head\""));
        assert_null(strstr(j, "embeddings"));
        assert_null(strstr(j, "sparse_"));
        assert_null(strstr(j, "ftrl_"));
        free(j);
        /* the same keys set to their defaults: the same job */
        d = load_string_ok("{" CLUSTER ", 'model': {'input': [784], 'head': 'softmax', 'embeddings': [], "
                           "'layers': [{'type': 'dense', 'units': 10}]}, 'training': {'sparse_optimizer': 'adagrad', "
                           "'sparse_learning_rate': 0, 'ftrl_l1': 0, 'ftrl_lr_power': -0.5}}");
        config_free(c);
        c = load_string_ok("{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dense', 'units': 10}]}}");
        assert_true(config_fingerprint(c) == config_fingerprint(d));
        config_free(d);
        /* set to anything else: in the canonical form, and another job */
        d = load_string_ok("{" CLUSTER ", 'model': {'input': [784], 'layers': [{'type': 'dense', 'units': 10}]}, "
                           "'training': {'ftrl_l2': 0.5}}");
        j = config_canonical_json(d);
        assert_non_null(strstr(j, "\"ftrl_l2\":0.5"));
        assert_true(config_fingerprint(c) != config_fingerprint(d));
        free(j);
        config_free(c);
        config_free(d);
        free(path);
}

/* docs/configuration.md carries the tables as config_print_keys and config_print_env print them. */
static void test_docs_current(void **state) {
        const char *src = getenv("PSFLEET_SOURCE_DIR");
        char *doc = NULL, *keys, *env, *path;
        size_t len;

        if (!src)
                skip();
        path = strdup_printf("%s/docs/configuration.md", src);
        assert_int_equal(read_file(path, 1 << 20, &doc, &len), 0);
        keys = print_to_string(config_print_keys, true);
        env = print_to_string(config_print_env, true);
        if (getenv("PSFLEET_PRINT_KEYS"))
                printf("KEYS\n%sENV\n%sEND\n", keys, env);
        if (!strstr(doc, keys))
                fail_msg("docs/configuration.md lacks the key table; regenerate it (docs/gen-configuration.py):\n%s", keys);
        if (!strstr(doc, env))
                fail_msg("docs/configuration.md lacks the environment table; regenerate it:\n%s", env);
        assert_non_null(strstr(env, "| `PSFLEET_DEVICE` | `device.device` |"));
        assert_non_null(strstr(env, "| `PSFLEET_TEST_FAKE_NO_GPU` |"));
        free(keys);
        free(env);
        free(doc);
        free(path);
}

/* rpc.compression: parsed into its kind and ratio (auto by default); rpc.wire_dtype bfloat16 means bf16
 * (alone, with auto, or with bf16 itself). */
static void test_compression_keys(void **state) {
        static const struct {
                const char *rpc;
                enum rpc_compression kind;
                double ratio;
        } cases[] = {
                { "{}", RPC_COMPRESS_AUTO, 0 },
                { "{'compression': 'none'}", RPC_COMPRESS_NONE, 0 },
                { "{'compression': 'auto', 'wire_dtype': 'bfloat16'}", RPC_COMPRESS_BF16, 0 },
                { "{'compression': 'int8'}", RPC_COMPRESS_INT8, 0 },
                { "{'compression': 'bf16'}", RPC_COMPRESS_BF16, 0 },
                { "{'compression': 'topk:0.01'}", RPC_COMPRESS_TOPK, 0.01 },
                { "{'wire_dtype': 'bfloat16'}", RPC_COMPRESS_BF16, 0 },
                { "{'wire_dtype': 'bfloat16', 'compression': 'bf16'}", RPC_COMPRESS_BF16, 0 },
                { "{'wire_dtype': 'float32', 'compression': 'topk:0.5'}", RPC_COMPRESS_TOPK, 0.5 },
        };
        (void) state;
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                char json[400];
                snprintf(json, sizeof(json), "{" BASE ", 'rpc': %s}", cases[i].rpc);
                struct job_config *c = load_string_ok(json);
                assert_int_equal(c->rpc.compress, cases[i].kind);
                assert_true(c->rpc.topk_ratio == cases[i].ratio);
                config_free(c);
        }
}

/* The log.* keys: per node (out of the canonical form), from the job file or the environment, a bad
 * variable an error that names it. */
static void test_log_keys(void **state) {
        struct job_config *c = load_ok(xpath, "{" BASE "}"), *d;
        char err[256] = "";

        assert_string_equal(c->log.level, "info");
        assert_false(c->log.time);
        setenv("PSFLEET_LOG_LEVEL", "DEBUG", 1);
        setenv("PSFLEET_LOG_TIME", "1", 1);
        assert_int_equal(config_apply_env(c, "log", err, sizeof(err)), 0);
        assert_string_equal(c->log.level, "DEBUG");
        assert_true(c->log.time);
        unsetenv("PSFLEET_LOG_LEVEL");
        unsetenv("PSFLEET_LOG_TIME");
        env_error(c, "PSFLEET_LOG_LEVEL", "bogus", "PSFLEET_LOG_LEVEL: \"bogus\" is not a log level");
        env_error(c, "PSFLEET_LOG_TIME", "2", "PSFLEET_LOG_TIME: \"2\" is not 0, 1, true or false");

        d = load_ok(xpath, "{" BASE ", 'log': {'level': 'warning', 'time': true}}");
        assert_string_equal(d->log.level, "warning");
        assert_true(d->log.time);
        assert_true(config_fingerprint(c) == config_fingerprint(d));
        config_free(d);
        write_json(xpath, "{" BASE ", 'log': {'level': 'loud'}}");
        d = NULL;
        assert_int_equal(config_load(xpath, &d, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "log.level: \"loud\" is not a log level"));
        config_free(c);
}

UNIT_TEST_MAIN(setup, teardown,
        cmocka_unit_test(test_full_file),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_task),
        cmocka_unit_test(test_tf_config),
        cmocka_unit_test(test_state_paths),
        cmocka_unit_test(test_canonical),
        cmocka_unit_test(test_sparse_keys),
        cmocka_unit_test(test_tfrecord_keys),
        cmocka_unit_test(test_fingerprint_stable),
        cmocka_unit_test(test_instance),
        cmocka_unit_test(test_print_keys),
        cmocka_unit_test(test_env_overrides),
        cmocka_unit_test(test_docs_current),
        cmocka_unit_test(test_log_keys),
        cmocka_unit_test(test_compression_keys))
