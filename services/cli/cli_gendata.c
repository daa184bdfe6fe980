/* psfleet gen-data: training (and test) files from a planted model (gendata.h), for tests and
 * benchmarks whose best reachable AUC must be known. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_opt.h"
#include "cli_util.h"
#include "commands.h"
#include "gendata.h"
#include "util.h"

static void gendata_help(FILE *f)
{
        fprintf(f, "Usage: psfleet gen-data --rows N --out PATH [--format criteo|libsvm|csv|tfrecord]\n"
                   "                        [--seed S] [--test-rows M --test-out PATH] [--vocab V] [--zipf A]\n"
                   "                        [--noise X]\n"
                   "\n"
                   "Writes rows whose labels come from a planted model, so that the best reachable AUC (or\n"
                   "RMSE) is known, and PATH.meta.json beside each file with the planted model's own metrics on\n"
                   "exactly those rows. The same options give the same bytes. A PATH ending in .gz is gzip'd.\n"
                   "\n"
                   "  criteo   label, 13 counts (some empty), 26 categorical tokens (8 hex digits, some empty)\n"
                   "           whose ranks follow a power law; label ~ Bernoulli(sigmoid(b + sum of the tokens'\n"
                   "           weights + sum_j v_j log1p(count_j))), ~25%% positive, planted AUC ~0.78\n"
                   "  libsvm   the same model: token of rank r of field f as index f*V+r (value 1), then\n"
                   "           count j as index 26*V+j (value log1p(count))\n"
                   "  tfrecord the criteo rows as tf.train.Example records: \"label\" (int64), \"I1\"..\"I13\"\n"
                   "           (float32 log1p(count), absent when empty), \"C1\"..\"C26\" (the token's bytes,\n"
                   "           absent when empty); a PATH ending in .gz is GZIP, as TensorFlow writes it\n"
                   "  csv      regression: y = b + sum_j v_j x_j + noise over 13 features ~ N(0, 1), a header\n"
                   "\n"
                   "  --rows N           rows of PATH\n"
                   "  --out PATH         the training file\n"
                   "  --format F         criteo (default), libsvm, csv or tfrecord\n"
                   "  --seed S           the planted model's and the rows' seed (default 1)\n"
                   "  --test-rows M      rows of a test file: the same model, other rows\n"
                   "  --test-out PATH    the test file (with --test-rows)\n"
                   "  --vocab V          ranks per categorical field (default 100000)\n"
                   "  --zipf A           P(rank r) ~ (r + 1)^-A (default 1.1)\n"
                   "  --noise X          csv: the label noise's standard deviation (default 0.1)\n"
                   "\n"
                   "docs/data-formats.md describes the formats and the model.\n"
                   "Exit status: 0 success, 2 bad usage, 74 a file could not be written.\n");
}

/* A real number in [lo, hi] for --opt; 0 or CLI_EX_USAGE (said why). */
static int parse_real(const char *opt, const char *s, double lo, double hi, double *ret)
{
        char *end;
        errno = 0;
        double v = s && *s ? strtod(s, &end) : NAN;
        if (!s || !*s || *end || errno || !(v >= lo && v <= hi)) {
                cli_error("gen-data: --%s \"%s\": expected a number in %g..%g", opt, s ? s : "", lo, hi);
                return CLI_EX_USAGE;
        }
        *ret = v;
        return 0;
}

static int generate(struct gendata *g, const char *path, uint64_t rows, uint64_t stream)
{
        char err[512];
        struct gendata_stats st;
        uint64_t t0 = mono_us();
        int e = gendata_write(g, path, rows, stream, &st, err, sizeof(err));
        if (e == 0)
                e = gendata_write_meta(g, path, &st, err, sizeof(err));
        if (e < 0) {
                cli_error("gen-data: %s", err);
                return e == -ENOMEM ? 1 : GENDATA_EX_IOERR;
        }
        double s = (double)(mono_us() - t0) / 1e6;
        printf("%s: %llu rows, %.1f MB in %.1f s (%.0f MB/s)", path, (unsigned long long)rows, (double)st.bytes / 1e6,
               s, s > 0 ? (double)st.bytes / 1e6 / s : 0.0);
        if (isfinite(st.planted_rmse))
                printf(", planted RMSE %.4f\n", st.planted_rmse);
        else
                printf(", %.1f%% positive, planted AUC %.4f, log loss %.4f\n", 100 * st.positive_rate,
                       st.planted_auc, st.planted_logloss);
        return 0;
}

int cmd_gendata(int argc, char **argv)
{
        uint64_t rows = 0, seed = 1, test_rows = 0, vocab = 100000;
        const char *out = NULL, *test_out = NULL, *format = "criteo", *zipf = "1.1", *noise = "0.1";
        const struct cli_opt opts[] = {
                CLI_NUMBER("rows", &rows, 1, 1000000000000ull),
                CLI_STRING("out", &out),
                CLI_STRING("format", &format),
                CLI_NUMBER("seed", &seed, 0, INT64_MAX),
                CLI_NUMBER("test-rows", &test_rows, 1, 1000000000000ull),
                CLI_STRING("test-out", &test_out),
                CLI_NUMBER("vocab", &vocab, 1, 10000000),
                CLI_STRING("zipf", &zipf),
                CLI_STRING("noise", &noise),
                {NULL},
        };
        const struct cli_args args = {
                .cmd = "gen-data", .opts = opts, .help = gendata_help, .terse = true,
                .min_operands = 0, .max_operands = 0,
                .usage = "Usage: psfleet gen-data --rows N --out PATH [OPTIONS] (--help for more)",
        };
        int first, r;
        if (!cli_args_parse(&args, argc, argv, &first, &r))
                return r;
        struct gendata_opts go = {.seed = seed, .vocab = (uint32_t)vocab};
        if (strcmp(format, "criteo") == 0)
                go.format = RECORDS_CRITEO;
        else if (strcmp(format, "libsvm") == 0)
                go.format = RECORDS_LIBSVM;
        else if (strcmp(format, "csv") == 0)
                go.format = RECORDS_CSV;
        else if (strcmp(format, "tfrecord") == 0)
                go.format = RECORDS_TFRECORD;
        else {
                cli_error("gen-data: --format \"%s\": expected criteo, libsvm, csv or tfrecord", format);
                return CLI_EX_USAGE;
        }
        if (!rows || !out) {
                cli_error("gen-data: --rows and --out are required");
                return CLI_EX_USAGE;
        }
        if (!test_rows != !test_out) {
                cli_error("gen-data: --test-rows and --test-out go together");
                return CLI_EX_USAGE;
        }
        if ((r = parse_real("zipf", zipf, 0.01, 10, &go.zipf)) || (r = parse_real("noise", noise, 0, 1e6, &go.noise)))
                return r;
        struct gendata *g;
        if ((r = gendata_new(&go, &g)) < 0) {
                cli_error("gen-data: %s", strerror(-r));
                return 1;
        }
        r = generate(g, out, rows, 0);
        if (r == 0 && test_out)
                r = generate(g, test_out, test_rows, 1);
        gendata_free(g);
        return r;
}
