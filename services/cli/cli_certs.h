/* psfleet certs' Kubernetes Secrets (cli_certs_k8s.c), apart from the command for its unit test. */
#pragma once

#include <stddef.h>

#include "config.h"

/* The stem of the job's Secret names in buf: its name in lower case, '_' as '-'. -EINVAL when that is
 * not a DNS name Kubernetes takes (or does not fit len). */
int certs_k8s_stem(const char *job, char *buf, size_t len);

/* Writes to out ("-": stdout; else a file replaced atomically, mode 0600) the job's Secrets, as a YAML
 * stream: STEM-tls-ca (ca.crt: the CA's certificate, not its key) and, for each task of the cluster,
 * STEM-tls-TASK (TASK.crt, TASK.key), from the files in dir (DIR/JOB of psfleet certs). Returns 0, or
 * -errno with the reason in err (a file missing or unreadable, out not writable, -EINVAL: a job name
 * Kubernetes cannot take). */
int certs_write_k8s_secrets(const char *out, const char *dir, const struct job_config *cfg, char *err,
                            size_t errlen);
