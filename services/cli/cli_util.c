/* What every psfleet command shares: messages, job loading, the chief's address, numbers, durations
 * and the progress display. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_jobref.h"
#include "cli_opt.h"
#include "cli_util.h"
#include "job.h"
#include "rpc.h"
#include "tls.h"
#include "util.h"

void cli_error(const char *fmt, ...) {
        char msg[4096];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        fprintf(stderr, "psfleet: %s\n", msg);
}

int cli_load_job(const char *path, struct job_config **ret) {
        char err[1024];
        if (config_load(path, ret, err, sizeof(err)) < 0) {
                cli_error("%s", err);
                return CONFIG_EX_CONFIG;
        }
        return 0;
}

int cli_load_job_layout(const char *path, struct job_config **cfg_ret, struct job_layout **L_ret) {
        int r = cli_load_job(path, cfg_ret);
        if (r)
                return r;
        if ((r = job_layout_new(*cfg_ret, L_ret)) < 0) {
                cli_error("cannot build the model of \"%s\": %s", path, strerror(-r));
                *cfg_ret = config_free(*cfg_ret);
                return 1;
        }
        return 0;
}

bool cli_job_file_command(const struct cli_args *a, int argc, char **argv, const char **path,
                          struct job_config **cfg_ret, struct job_layout **L_ret, int *status) {
        int first;
        if (!cli_args_parse(a, argc, argv, &first, status))
                return false;
        *path = argv[first];
        return (*status = cli_load_job_layout(*path, cfg_ret, L_ret)) == 0;
}

void cli_chief_ref_clear(struct cli_chief_ref *r) {
        free(r->address);
        free(r->job_name);
        free(r->state_dir);
        free(r->tls_error);
        *r = (struct cli_chief_ref){0};
}

int cli_chief_locate(const char *cmd, const char *address, const char *job, bool offline_ok,
                     struct cli_chief_ref *ret) {
        *ret = (struct cli_chief_ref){0};
        if (!address == !job) {
                fprintf(stderr, "psfleet %s: give exactly one of --address HOST:PORT and --job JOB\n", cmd);
                return CLI_EX_USAGE;
        }
        if (address) {
                ret->address = strdup(address);
                return ret->address ? 0 : 1;
        }
        struct job_config *cfg;
        struct cli_local_job local;
        char err[1024], *path;
        int r = cli_job_resolve(job, &path, &local);
        if (r)
                return r;
        r = cli_load_job(path, &cfg);
        free(path);
        if (r) {
                cli_local_job_clear(&local);
                return r;
        }
        /* A local job's file already holds the cluster its daemons run: TF_CONFIG is for the others. */
        if (!local.pid && config_apply_tf_config(cfg, getenv("TF_CONFIG"), NULL, NULL, err, sizeof(err)) < 0) {
                cli_error("%s", err);
                r = CONFIG_EX_CONFIG;
        }
        if (!r) {
                char why[2048];
                r = cli_secure_why(cfg, cli_identity, why, sizeof(why));
                if (r == CONFIG_EX_CONFIG && offline_ok && !(ret->tls_error = strdup(why)))
                        r = 1;
                else if (r == CONFIG_EX_CONFIG && offline_ok)
                        r = 0;
                else if (r)
                        cli_error("%s", why);
        }
        if (!r) {
                ret->address = strdup(cfg->cluster.chief[0].addr);
                ret->job_name = strdup(cfg->name);
                ret->state_dir = local.pid ? local.state_dir : NULL;
                local.state_dir = NULL;
                if (!ret->address || !ret->job_name)
                        r = 1;
        }
        cli_local_job_clear(&local);
        config_free(cfg);
        if (r)
                cli_chief_ref_clear(ret);
        return r;
}

int cli_chief_address(const char *cmd, const char *address, const char *job, char **ret) {
        struct cli_chief_ref ref;
        int r = cli_chief_locate(cmd, address, job, false, &ref);
        if (r)
                return r;
        *ret = ref.address;
        ref.address = NULL;
        cli_chief_ref_clear(&ref);
        return 0;
}

const char *cli_identity;

int cli_secure_why(const struct job_config *cfg, const char *identity, char *why, size_t len) {
        char ca[1024], crt[1024], key[1024];
        struct rpc_tls *tls;
        if (!identity) {
                /* admin when this user may read its key, else the read-only viewer */
                identity = tls_paths(cfg, "admin", ca, crt, key) == 0 && access(key, R_OK) == 0 ? "admin" : "viewer";
        }
        if (strcmp(identity, "admin") != 0 && strcmp(identity, "viewer") != 0) {
                snprintf(why, len, "--identity %s: expected admin or viewer", identity);
                return CLI_EX_USAGE;
        }
        if (tls_from_config(cfg, identity, &tls, why, len) < 0)
                return CONFIG_EX_CONFIG;
        int r = rpc_secure(tls);
        rpc_tls_free(tls);
        if (r < 0) {
                snprintf(why, len, "out of memory");
                return 1;
        }
        return 0;
}

int cli_secure(const struct job_config *cfg, const char *identity) {
        char why[2048];
        int r = cli_secure_why(cfg, identity, why, sizeof(why));
        if (r)
                cli_error("%s", why);
        return r;
}

int cli_parse_number(const char *cmd, const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *ret) {
        if (parse_u64(s, min, max, ret) >= 0)
                return 0;
        fprintf(stderr, "psfleet %s: %s \"%s\": expected %llu..%llu\n", cmd, opt, s, (unsigned long long)min,
                (unsigned long long)max);
        return CLI_EX_USAGE;
}

const char *cli_proc_stat(long pid, char *buf, size_t len) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "re");
        if (!f)
                return NULL;
        size_t n = fread(buf, 1, len - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *p = strrchr(buf, ')');   /* the command name may hold spaces */
        return p && p[1] == ' ' ? p + 2 : NULL;
}

const char *cli_format_time(uint64_t us, bool zone, char *buf, size_t len) {
        time_t t = (time_t)(us / 1000000);
        struct tm tm;
        localtime_r(&t, &tm);
        strftime(buf, len, zone ? "%Y-%m-%d %H:%M:%S %z" : "%Y-%m-%d %H:%M:%S", &tm);
        return buf;
}

const char *cli_format_duration(double s, char *buf, size_t len) {
        if (!(s >= 0) || s > 1e8) {
                snprintf(buf, len, "?");
                return buf;
        }
        unsigned long t = (unsigned long)(s + 0.5);
        if (t >= 3600)
                snprintf(buf, len, "%lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
        else
                snprintf(buf, len, "%lu:%02lu", t / 60, t % 60);
        return buf;
}

/* ---- progress display ---- */

void progress_init_file(struct progress *p, FILE *f, bool quiet) {
        *p = (struct progress){.f = f, .tty = isatty(fileno(f)) == 1, .quiet = quiet};
}

void progress_init(struct progress *p, bool quiet) {
        progress_init_file(p, stderr, quiet);
}

void progress_update(struct progress *p, const char *state, uint64_t step, uint64_t max_steps, double loss,
                     double examples_per_s, double eta_s) {
        progress_update_extra(p, state, step, max_steps, loss, examples_per_s, eta_s, NULL, false);
}

void progress_update_extra(struct progress *p, const char *state, uint64_t step, uint64_t max_steps, double loss,
                           double examples_per_s, double eta_s, const char *extra, bool force_line) {
        if (p->quiet)
                return;
        char eta[32], lossbuf[32], eps[32];
        cli_format_duration(eta_s, eta, sizeof(eta));
        if (isfinite(loss))
                snprintf(lossbuf, sizeof(lossbuf), "%.4f", loss);
        else
                snprintf(lossbuf, sizeof(lossbuf), "?");
        if (examples_per_s >= 0)
                snprintf(eps, sizeof(eps), "%.0f", examples_per_s);
        else
                snprintf(eps, sizeof(eps), "?");
        if (p->tty) {
                enum { WIDTH = 30 };
                char bar[WIDTH + 1];
                unsigned fill = max_steps ? (unsigned)((double)(step > max_steps ? max_steps : step) * WIDTH / max_steps)
                                          : 0;
                for (unsigned i = 0; i < WIDTH; i++)
                        bar[i] = i < fill ? '#' : '-';
                bar[WIDTH] = 0;
                fprintf(p->f, "\r\033[K%-8.8s [%s] %llu/%llu  loss %s  %s ex/s  ETA %s%s%s", state, bar,
                        (unsigned long long)step, (unsigned long long)max_steps, lossbuf, eps, eta,
                        extra ? "  " : "", extra ? extra : "");
                fflush(p->f);
                p->drawn = true;
                return;
        }
        uint64_t t = mono_us();
        if (!force_line && p->last_line_us && t - p->last_line_us < 5 * 1000000ULL)
                return;
        p->last_line_us = t;
        fprintf(p->f, "psfleet: %s: step %llu/%llu, loss %s, %s examples/s, ETA %s%s%s\n", state,
                (unsigned long long)step, (unsigned long long)max_steps, lossbuf, eps, eta, extra ? ", " : "",
                extra ? extra : "");
        fflush(p->f);
}

void progress_end(struct progress *p) {
        if (p->tty && p->drawn) {
                fputc('\n', p->f);
                fflush(p->f);
                p->drawn = false;
        }
}
