/* psfleet export: a job's trained model as an ONNX file for serving (onnx_save.h), from one of the
 * chief's checkpoints, offline: from the chief's records in its state directory (the newest checkpoint
 * that verifies, or --step N), or from one checkpoint file (--checkpoint). The file is written under a
 * temporary name and renamed when whole: an export that fails leaves nothing that looks finished. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chief_db.h"
#include "ckpt.h"
#include "cli_export.h"
#include "cli_jobref.h"
#include "cli_opt.h"
#include "cli_records.h"
#include "cli_util.h"
#include "commands.h"
#include "graph.h"
#include "graph_spec.h"
#include "onnx_save.h"
#include "util.h"

#define EX_DATAERR 65 /* sysexits.h: no such checkpoint, or one that does not verify */
#define EX_IOERR 74   /* sysexits.h: the output cannot be written */
#define ONNX_MAX_BYTES ((size_t)INT32_MAX) /* protobuf's limit on one message, so on model.onnx */

static void export_help(FILE *f) {
        fprintf(f, "Usage: psfleet export --job JOB --out DIR [--step N] [--state-dir DIR] [--max-inline-rows N]\n"
                   "                      [--external-data]\n"
                   "       psfleet export --job JOB.json --checkpoint FILE --out DIR [...]\n"
                   "\n"
                   "Writes the model a job trained as DIR/model.onnx (ONNX opset 17), for ONNX Runtime, Triton\n"
                   "or TensorRT: inference mode (Dropout as identity, batch normalization with its running\n"
                   "statistics), the parameters' values from a checkpoint, as outputs the logits and the\n"
                   "head's output on them (\"probabilities\", \"probability\" or \"prediction\"). The inputs\n"
                   "are the model's (docs/serving.md). Works with the job down: the checkpoint comes from the\n"
                   "chief's records (the newest that verifies, or the one of --step) or from --checkpoint.\n"
                   "\n"
                   "  --job JOB          the job file, or a job's name (as psfleet checkpoints takes it)\n"
                   "  --out DIR          where model.onnx goes (made if missing)\n"
                   "  --step N           the checkpoint of global_step N (default: the newest that verifies)\n"
                   "  --state-dir DIR    the chief's state directory (default %s, or a local job's)\n"
                   "  --checkpoint FILE  one checkpoint file (a job's safetensors), instead of the records\n"
                   "  --max-inline-rows N  a table of more rows goes out as DIR/tables/NAME.safetensors (with\n"
                   "                     DIR/tables.json), the graph taking its pooled rows as an input\n"
                   "                     (default: every table inside model.onnx)\n"
                   "  --external-data    the large initializers (1 MiB or more) in DIR/model.onnx.data\n"
                   "                     (ONNX external data; chosen by itself for a model over 2 GiB)\n"
                   "\n"
                   "Embedding tables are looked up inside the graph, from the ids as the data has them\n"
                   "(hashed modulo vocab in the graph where the table has one; docs/serving.md).\n"
                   "Exit status: 0 written, 2 bad usage, 65 no such checkpoint, one that does not verify or\n"
                   "lacks the model's variables or tables,\n"
                   "74 the output cannot be written, 78 a bad job file or a model that cannot be exported.\n",
                CLI_CHIEF_STATE_ROOT);
}

/* The checkpoint file and its step: --checkpoint, else the records' newest that reads (or --step's).
 * Returns 0 with *ck read and *path_ret malloc'd, or the exit status after printing why. */
static int find_checkpoint(const char *file, const char *state_dir, const struct cli_local_job *local,
                           const struct job_config *cfg, uint64_t step, struct ckpt **ck, char **path_ret) {
        char e[512];
        if (file) {
                int r = ckpt_read(file, UINT64_MAX, ck, e, sizeof(e));
                if (r < 0) {
                        cli_error("export: checkpoint %s: %s", file, e);
                        return r == -EBADMSG ? EX_DATAERR : EX_IOERR;
                }
                *path_ret = strdup(file);
                return 0;
        }
        const char *dir = state_dir ? state_dir : local->pid ? local->state_dir : CLI_CHIEF_STATE_ROOT;
        struct chief_db *db = NULL;
        char *where = NULL;
        int r = cli_records_open(dir, cfg->name, &db, &where);
        if (r < 0) {
                cli_error("export: no records of job %s's chief in %s nor %s/%s (--state-dir DIR): %s", cfg->name,
                          dir, dir, cfg->name, strerror(-r));
                return EX_DATAERR;
        }
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0;
        r = chief_db_list_checkpoints(db, &rows, &n);
        int ret = EX_DATAERR;
        if (r < 0)
                cli_error("export: cannot read the checkpoints recorded in %s/chief.db: %s", where, strerror(-r));
        else if (n == 0)
                cli_error("export: job %s has no checkpoint (%s/chief.db records none)", cfg->name, where);
        for (size_t i = 0; r == 0 && i < n && ret != 0; i++) {
                const struct chief_db_checkpoint *c = &rows[i];
                if (step && c->global_step != step)
                        continue;
                char sum[32];
                if ((r = ckpt_read(c->path, UINT64_MAX, ck, e, sizeof(e))) == 0 &&
                    strcmp(ckpt_format_checksum(ckpt_crc32c(*ck), sum, sizeof(sum)), c->checksum) != 0) {
                        snprintf(e, sizeof(e), "checksum %s, %s was recorded", sum, c->checksum);
                        *ck = ckpt_free(*ck);
                        r = -EBADMSG;
                }
                if (r == 0) {
                        *path_ret = strdup(c->path);
                        ret = 0;
                } else {
                        cli_error("export: checkpoint of global_step %" PRIu64 " (%s) does not verify: %s%s",
                                  c->global_step, c->path, e, step ? "" : "; trying an older one");
                        r = 0;
                        if (step)
                                break;
                }
        }
        if (ret != 0 && r == 0 && n > 0)
                cli_error(step ? "export: job %s has no checkpoint of global_step %" PRIu64 " that verifies (psfleet "
                                 "checkpoints list)"
                               : "export: job %s has no checkpoint that verifies%.0" PRIu64,
                          cfg->name, step);
        free(rows);
        free(where);
        chief_db_close(db);
        return ret;
}

/* The layer list's graph; with tables, the dense layers alone, their input the dense features followed
 * by the tables' pooled rows (model_spec_dense_input), which the tables' lookups make (cli_export.h). */
static int dense_graph(const struct model_spec *spec, struct graph **ret, char *err, size_t errlen) {
        if (!spec->n_embeddings)
                return graph_from_spec(spec, ret, err, errlen);
        struct model_spec *dense = malloc(sizeof(*dense));
        if (!dense) {
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        *dense = *spec;
        dense->n_embeddings = 0;
        dense->input[0] = 1, dense->input[1] = 1, dense->input[2] = model_spec_dense_input(spec);
        int r = graph_from_spec(dense, ret, err, errlen);
        free(dense);
        return r;
}

/* The parameter block from the checkpoint, variable by variable (each checked for its shape). */
static int read_params(const struct job_config *cfg, const struct ckpt *ck, const char *path, float **params_ret) {
        char e[512];
        const char *fp = ckpt_meta(ck, "fingerprint");
        char want[32];
        snprintf(want, sizeof(want), "%016" PRIx64, config_fingerprint(cfg));
        /* the fingerprint covers the whole job (its cluster too: a local job's copy has other ports), so
         * a difference is worth a word, not a refusal: every variable is checked by name and shape */
        if (fp && strcmp(fp, want) != 0)
                cli_error("export: note: checkpoint %s was written by a job of fingerprint %s, this job file's is %s; "
                          "its variables are taken by name and shape", path, fp, want);
        struct model_spec_var *vars = calloc(MODEL_MAX_VARS, sizeof(*vars));
        size_t n_params = 0;
        int nv = vars ? model_spec_vars(&cfg->model, vars, &n_params) : -ENOMEM;
        float *p = nv >= 0 ? calloc(n_params ? n_params : 1, sizeof(float)) : NULL;
        int ret = p ? 0 : 1;
        for (int v = 0; p && v < nv && ret == 0; v++)
                if (ckpt_get(ck, vars[v].name, vars[v].rows, vars[v].cols, p + vars[v].offset, e, sizeof(e)) < 0) {
                        cli_error("export: checkpoint %s: %s", path, e);
                        ret = EX_DATAERR;
                }
        free(vars);
        if (ret != 0)
                free(p);
        else
                *params_ret = p;
        return ret;
}

static int make_dir(const char *dir) {
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
                cli_error("export: cannot make %s: %m", dir);
                return EX_IOERR;
        }
        return 0;
}

/* The external data as DIR/model.onnx.data: its pieces at their offsets, zeros between, written
 * whole under a temporary name. */
static int write_data(const char *dir, const struct onnx_external *x) {
        static const char zeros[4096];
        char *path = strdup_printf("%s/%s", dir, x->location), *tmp = strdup_printf("%s/.%s.tmp", dir, x->location);
        struct atomic_file *af = NULL;
        int r = path && tmp ? atomic_file_open(path, tmp, 0644, &af) : -ENOMEM;
        uint64_t at = 0;
        for (size_t i = 0; r == 0 && i < x->n; i++) {
                while (r == 0 && at < x->pieces[i].offset) {
                        size_t k = x->pieces[i].offset - at > sizeof(zeros) ? sizeof(zeros) : x->pieces[i].offset - at;
                        r = atomic_file_write(af, zeros, k);
                        at += k;
                }
                if (r == 0)
                        r = atomic_file_write(af, x->pieces[i].data, x->pieces[i].len);
                at += x->pieces[i].len;
        }
        if (r == 0)
                r = atomic_file_commit(af, NULL);
        else
                atomic_file_abort(af);
        if (r < 0)
                cli_error("export: cannot write %s: %s", path ? path : dir, strerror(-r));
        free(path);
        free(tmp);
        return r < 0 ? EX_IOERR : 0;
}

/* Writes buf as DIR/model.onnx: DIR/.model.onnx.tmp, synced, then renamed. */
static int write_out(const char *dir, const void *buf, size_t len, char **path_ret) {
        char *tmp = strdup_printf("%s/.model.onnx.tmp", dir), *path = strdup_printf("%s/model.onnx", dir);
        int fd = tmp ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
        bool ok = fd >= 0 && path;
        for (size_t at = 0; ok && at < len;) {
                ssize_t w = write(fd, (const char *)buf + at, len - at);
                ok = w > 0 || (w < 0 && errno == EINTR);
                at += w > 0 ? (size_t)w : 0;
        }
        ok = ok && fsync(fd) == 0;
        if (fd >= 0 && close(fd) < 0)
                ok = false;
        ok = ok && rename(tmp, path) == 0;
        if (!ok) {
                cli_error("export: cannot write %s: %m", path ? path : dir);
                if (tmp)
                        unlink(tmp);
        }
        free(tmp);
        if (ok)
                *path_ret = path;
        else
                free(path);
        return ok ? 0 : EX_IOERR;
}

int cmd_export(int argc, char **argv) {
        const char *job = NULL, *out = NULL, *state_dir = NULL, *file = NULL;
        uint64_t step = 0, max_inline = 0;
        bool external = false;
        struct export_tables tables = { 0 };
        struct onnx_external ext = { .location = "model.onnx.data", .min_bytes = 1u << 20 };
        const struct cli_opt opts[] = {
                CLI_FLAG("external-data", &external),
                CLI_NUMBER("max-inline-rows", &max_inline, 1, UINT64_MAX),
                CLI_STRING("job", &job),
                CLI_STRING("out", &out),
                CLI_STRING("state-dir", &state_dir),
                CLI_STRING("checkpoint", &file),
                CLI_NUMBER("step", &step, 1, UINT64_MAX),
                {},
        };
        const struct cli_args args = { .cmd = "export", .opts = opts, .help = export_help };
        int first, r;
        if (!cli_args_parse(&args, argc, argv, &first, &r))
                return r;
        if (!job || !out || (file && step)) {
                cli_error("export: %s", !job ? "--job is required" : !out ? "--out is required"
                                                                         : "--step and --checkpoint exclude each other");
                return CLI_EX_USAGE;
        }
        char *job_path = NULL;
        struct cli_local_job local = { 0 };
        if ((r = cli_job_resolve(job, &job_path, &local)) != 0)
                return r;
        struct job_config *cfg = NULL;
        struct graph *own = NULL;
        struct ckpt *ck = NULL;
        char *ck_path = NULL, *written = NULL, err[512] = "";
        float *params = NULL;
        void *buf = NULL;
        size_t len = 0;
        if ((r = cli_load_job(job_path, &cfg)) != 0)
                goto out;
        const struct model_spec *spec = &cfg->model;
        const struct graph *g = spec->graph;
        if (!g && dense_graph(spec, &own, err, sizeof(err)) < 0) {
                cli_error("export: job %s's model: %s", cfg->name, err);
                r = CONFIG_EX_CONFIG;
                goto out;
        }
        g = g ? g : own;
        if ((r = find_checkpoint(file, state_dir, &local, cfg, step, &ck, &ck_path)) != 0 ||
            (r = read_params(cfg, ck, ck_path, &params)) != 0)
                goto out;
        const char *kind = ckpt_meta(ck, "checkpoint"), *parent = ckpt_meta(ck, "parent_step");
        if (spec->n_embeddings && kind && strcmp(kind, "incremental") == 0) {
                /* its tables hold only the rows changed since its parent: exporting them would drop the rest */
                cli_error("export: checkpoint %s is incremental (the embedding rows changed since global_step %s): "
                          "its tables are not whole; export a full checkpoint (--step of one that psfleet checkpoints "
                          "list shows as full), or save one with supervisor.full_checkpoint_every 1",
                          ck_path, parent ? parent : "?");
                r = EX_DATAERR;
                goto out;
        }
        if (spec->n_embeddings && (r = export_tables_load(cfg, g, ck, ck_path, max_inline, &tables)) != 0)
                goto out;
        const char *gs = ckpt_meta(ck, "global_step");
        char doc[512];
        snprintf(doc, sizeof(doc), "job %s, global_step %s, exported by psfleet %s from %s", cfg->name, gs ? gs : "?",
                 PSFLEET_VERSION, ck_path);
        /* over protobuf's 2 GiB (or asked), the large initializers go to model.onnx.data: known ahead from
         * the values alone, or found from the file's size */
        const struct onnx_front *front = spec->n_embeddings ? &tables.front : NULL;
        uint64_t values = (uint64_t)g->n_params * sizeof(float);
        for (uint32_t e = 0; e < spec->n_embeddings; e++)
                values += tables.t[e].rows ? tables.t[e].n_rows * tables.t[e].dim * sizeof(float) : 0;
        external |= values >= ONNX_MAX_BYTES;
        r = onnx_save_front_buf(g, params, spec->head, front, external ? &ext : NULL, doc, &buf, &len, err,
                                sizeof(err));
        if (r == 0 && !external && len > ONNX_MAX_BYTES) {
                free(buf);
                buf = NULL;
                external = true;
                r = onnx_save_front_buf(g, params, spec->head, front, &ext, doc, &buf, &len, err, sizeof(err));
        }
        if (r == 0 && len > ONNX_MAX_BYTES) {
                snprintf(err, sizeof(err), "%zu bytes even with the tables' rows in external data (the raw ids' map "
                         "is in the file): serve the tables from outside (--max-inline-rows N)", len);
                r = -EINVAL;
        }
        if (r < 0) {
                cli_error("export: job %s's model cannot be written as ONNX: %s", cfg->name, err);
                r = r == -ENOMEM ? 1 : CONFIG_EX_CONFIG;
                goto out;
        }
        /* the tables served from outside first: model.onnx, renamed last, says the export is whole */
        if ((r = make_dir(out)) == 0 && (r = export_tables_write(cfg, &tables, out, gs ? gs : "?")) == 0 &&
            (ext.n == 0 || (r = write_data(out, &ext)) == 0) && (r = write_out(out, buf, len, &written)) == 0) {
                export_tables_tidy(cfg, &tables, out, ext.n ? NULL : ext.location);
                printf("exported job %s at global_step %s (%s) to %s (%zu bytes)\n", cfg->name, gs ? gs : "?", ck_path,
                       written, len);
        }
out:
        free(ext.pieces);
        export_tables_clear(&tables);
        free(buf);
        free(written);
        free(params);
        free(ck_path);
        ckpt_free(ck);
        graph_free(own);
        config_free(cfg);
        free(job_path);
        cli_local_job_clear(&local);
        return r;
}
