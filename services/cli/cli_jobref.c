/* Which job `--job X` names, and the records of running `psfleet local` jobs that let the other
 * commands find one by its name (its daemons listen on ports picked at start, not the job file's). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_jobref.h"
#include "cli_util.h"
#include "config.h"
#include "util.h"

void cli_local_job_clear(struct cli_local_job *j) {
        free(j->name);
        free(j->chief);
        free(j->job_file);
        free(j->state_dir);
        free(j->source);
        *j = (struct cli_local_job){0};
}

char *cli_local_dir(void) {
        const char *xdg = getenv("XDG_RUNTIME_DIR");
        if (xdg && *xdg)
                return strdup_printf("%s/psfleet/local", xdg);
        if (geteuid() == 0)
                return strdup("/run/psfleet/local");
        const char *tmp = getenv("TMPDIR");
        return strdup_printf("%s/psfleet-%u/local", tmp && *tmp ? tmp : "/tmp", (unsigned)geteuid());
}

/* The record directory made (0700) and checked to be ours and not a link: another user who made it
 * first in a shared /tmp could otherwise point our commands at their chief. Returns 0 or -errno. */
static int local_dir_ready(const char *dir) {
        int r = mkdir_p(dir, 0700);
        if (r < 0)
                return r;
        struct stat st;
        if (lstat(dir, &st) < 0)
                return -errno;
        if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid())
                return -EPERM;
        return 0;
}

/* When process pid started (clock ticks since boot, /proc/PID/stat's 22nd field), or 0 when unknown. */
static unsigned long long proc_start(long pid) {
        char buf[1024];
        const char *p = cli_proc_stat(pid, buf, sizeof(buf));
        unsigned long long t = 0;
        if (!p || sscanf(p, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &t) != 1)
                return 0;
        return t;
}

/* The recording process is still there: the pid lives and started when the record says, so that a
 * process that got the pid of a psfleet killed outright does not pass for it. */
static bool pid_alive(long pid, unsigned long long start) {
        if (pid <= 0 || (kill((pid_t)pid, 0) < 0 && errno != EPERM))
                return false;
        unsigned long long now = proc_start(pid);
        return !start || !now || now == start;
}

static char *json_str(json_t *o, const char *key) {
        const char *s = json_string_value(json_object_get(o, key));
        return s ? strdup(s) : NULL;
}

/* Reads a record: 0, -ENOENT (missing, unreadable or stale: a stale one is removed), or -ENOMEM. */
static int read_record(const char *path, struct cli_local_job *ret) {
        json_t *o = json_load_file(path, 0, NULL);
        if (!json_is_object(o)) {
                json_decref(o);
                return -ENOENT;
        }
        struct cli_local_job j = {
                .name = json_str(o, "job"), .chief = json_str(o, "chief"), .job_file = json_str(o, "job_file"),
                .state_dir = json_str(o, "state_dir"), .source = json_str(o, "source"),
                .pid = (long)json_integer_value(json_object_get(o, "pid")),
        };
        unsigned long long started = (unsigned long long)json_integer_value(json_object_get(o, "started"));
        json_decref(o);
        int r = 0;
        if (!j.name || !j.chief || !j.job_file || !j.state_dir || !j.source)
                r = -ENOENT;
        else if (!pid_alive(j.pid, started)) {
                unlink(path);   /* its psfleet local was killed before it could remove it */
                r = -ENOENT;
        }
        if (r < 0)
                cli_local_job_clear(&j);
        else
                *ret = j;
        return r;
}

int cli_local_register(const struct cli_local_job *j, char **path_ret) {
        char *dir = cli_local_dir();
        if (!dir)
                return -ENOMEM;
        int r = local_dir_ready(dir);
        char *path = r < 0 ? NULL : strdup_printf("%s/%s.json", dir, j->name);
        char *tmp = path ? strdup_printf("%s.%ld.tmp", path, (long)getpid()) : NULL;
        free(dir);
        if (r < 0 || !tmp) {
                free(path);
                return r < 0 ? r : -ENOMEM;
        }
        struct cli_local_job other;
        if (read_record(path, &other) == 0) {
                r = other.pid == (long)getpid() ? 0 : -EEXIST;
                cli_local_job_clear(&other);
        }
        json_t *o = json_pack("{s:s, s:I, s:I, s:s, s:s, s:s, s:s}", "job", j->name, "pid", (json_int_t)j->pid,
                              "started", (json_int_t)proc_start(j->pid), "chief", j->chief, "job_file", j->job_file,
                              "state_dir", j->state_dir, "source", j->source);
        if (r == 0 && !o)
                r = -ENOMEM;
        /* written whole under another name, then renamed: a reader never sees half a record */
        errno = 0;
        if (r == 0 && (json_dump_file(o, tmp, JSON_COMPACT) < 0 || rename(tmp, path) < 0)) {
                r = errno ? -errno : -EIO;
                unlink(tmp);
        }
        json_decref(o);
        free(tmp);
        if (r < 0) {
                free(path);
                return r;
        }
        *path_ret = path;
        return 0;
}

void cli_local_unregister(char *path) {
        if (path)
                unlink(path);
        free(path);
}

int cli_local_find(const char *name, const char *source, struct cli_local_job *ret) {
        char *dir = cli_local_dir();
        if (!dir)
                return -ENOMEM;
        int r = -ENOENT;
        if (name) {
                char *path = config_job_name_valid(name) ? strdup_printf("%s/%s.json", dir, name) : NULL;
                if (path)
                        r = read_record(path, ret);
                free(path);
                free(dir);
                return r;
        }
        DIR *d = opendir(dir);
        for (struct dirent *e; d && r == -ENOENT && (e = readdir(d));) {
                size_t n = strlen(e->d_name);
                if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
                        continue;
                char *path = strdup_printf("%s/%s", dir, e->d_name);
                struct cli_local_job j;
                if (path && read_record(path, &j) == 0) {
                        if (strcmp(j.source, source) == 0) {
                                *ret = j;
                                r = 0;
                        } else {
                                cli_local_job_clear(&j);
                        }
                }
                free(path);
        }
        if (d)
                closedir(d);
        free(dir);
        return r;
}

int cli_job_resolve(const char *arg, char **path_ret, struct cli_local_job *local_ret) {
        struct cli_local_job none = {0}, *local = local_ret ? local_ret : &none;
        *local = (struct cli_local_job){0};
        struct stat st;
        char real[PATH_MAX];
        int r = -ENOENT;
        size_t n = strlen(arg);
        /* "x.json" that is no file stays a path, so that loading it names the missing file */
        bool name = config_job_name_valid(arg) && !(n > 5 && strcmp(arg + n - 5, ".json") == 0);
        if (stat(arg, &st) == 0 && !S_ISDIR(st.st_mode)) {
                /* a job file; but when `psfleet local` runs it, its daemons are where that one put them */
                if (realpath(arg, real))
                        r = cli_local_find(NULL, real, local);
                *path_ret = strdup(r == 0 ? local->job_file : arg);
        } else if (name && (r = cli_local_find(arg, NULL, local)) == 0) {
                *path_ret = strdup(local->job_file);
        } else if (name) {
                const char *dir = config_env_value("PSFLEET_CONFIG_DIR");
                *path_ret = strdup_printf("%s/jobs/%s.json", dir && *dir ? dir : "/etc/psfleet", arg);
                if (*path_ret && access(*path_ret, F_OK) < 0) {
                        char *where = cli_local_dir();
                        cli_error("--job %s: no such job file, no running `psfleet local` job of that name (%s/), "
                                  "and no %s", arg, where ? where : "?", *path_ret);
                        free(where);
                        free(*path_ret);
                        return CONFIG_EX_CONFIG;
                }
        } else {
                *path_ret = strdup(arg);   /* loading it says what is wrong */
        }
        if (!*path_ret) {
                cli_local_job_clear(local);
                cli_error("out of memory");
                return 1;
        }
        if (local == &none)
                cli_local_job_clear(&none);
        return 0;
}
