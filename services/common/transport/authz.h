/* Who may call what: the peer's identity from its TLS certificate, and the one table of every RPC
 * method with the roles that may call it (docs/security.md prints the same table).
 *
 * A certificate issued by `psfleet certs` names its task in a DNS subjectAltName
 * "TASK.JOB.psfleet" (TASK: chief, ps-N, worker-N, evaluator, admin, viewer), which is also the name a client
 * checks the server's certificate against; its subject CN is the role ("worker/1") for people.
 *
 * rpc_server enforces the table before any handler runs: a method without an entry is a programming
 * error (rpc_server_new aborts), a caller whose role is not allowed gets PERMISSION_DENIED and one log
 * line (rate limited) naming the peer, the method and the reason. Handlers that must check more than
 * the role (Report: only as yourself) use authz_peer_is(). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum peer_role {
        PEER_UNKNOWN = 0,   /* mTLS, but no psfleet identity for this job in the certificate */
        PEER_INSECURE,      /* no TLS: the job runs insecure (loopback, or allow_insecure); allowed all */
        PEER_CHIEF,
        PEER_PS,
        PEER_WORKER,
        PEER_ADMIN,
        PEER_VIEWER,
        PEER_EVALUATOR,     /* TF_CONFIG's evaluator (chiefd --evaluator): reads, as a viewer does */
};

#define AUTHZ_CHIEF  (1u << PEER_CHIEF)
#define AUTHZ_PS     (1u << PEER_PS)
#define AUTHZ_WORKER (1u << PEER_WORKER)
#define AUTHZ_ADMIN  (1u << PEER_ADMIN)
#define AUTHZ_VIEWER (1u << PEER_VIEWER)
#define AUTHZ_EVALUATOR (1u << PEER_EVALUATOR)
#define AUTHZ_ANY    (AUTHZ_CHIEF | AUTHZ_PS | AUTHZ_WORKER | AUTHZ_ADMIN | AUTHZ_VIEWER | AUTHZ_EVALUATOR)

#define AUTHZ_TASK_MAX 32    /* "worker-4294967295" and NUL fit */

struct peer {
        enum peer_role role;
        uint32_t index;             /* ps-N, worker-N */
        char name[96];              /* "worker/1", "admin", "insecure ipv4:127.0.0.1:50312", "unknown ..." */
};

/* The task part of a role: "chief", "ps-0", "worker-1", "evaluator", "admin", "viewer". len >= AUTHZ_TASK_MAX. */
void authz_task_name(enum peer_role role, uint32_t index, char *buf, size_t len);
/* Parses a task ("ps-0", "chief", "admin", ...); also accepts "ps:0", "worker:1", "chief:0". */
int authz_parse_task(const char *task, enum peer_role *role, uint32_t *index);
/* The DNS name a certificate of TASK in JOB carries and a client checks: "ps-0.demo.psfleet". */
int authz_dns_name(const char *job, const char *task, char *buf, size_t len);
/* From the DNS subjectAltNames of a peer's certificate (n of them): the first that names a task of
 * `job` gives the peer. None: PEER_UNKNOWN, with the names seen in p->name. */
void authz_peer_from_names(const char *job, const char *const *names, size_t n, struct peer *p);

/* The roles that may call `method` ("/psfleet.v1.ParameterServer/Push"), or 0 when the method is not
 * in the table. */
unsigned authz_allowed(const char *method);
/* 0 when p may call method; else -EPERM with the reason ("worker/1 may not call
 * ParameterServer/Assign: chief only"). */
int authz_check(const char *method, const struct peer *p, char *why, size_t whylen);
/* True when p is this very task (or the job runs insecure). */
bool authz_peer_is(const struct peer *p, enum peer_role role, uint32_t index);

/* The table, for docs and tests: n entries. */
struct authz_rule {
        const char *method;
        unsigned allow;
        const char *note;           /* extra condition checked by the handler, or NULL */
};
const struct authz_rule *authz_rules(size_t *n);
/* The table as Markdown, as docs/security.md has it. */
void authz_print_table(FILE *f);
