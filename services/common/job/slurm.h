/* A Slurm allocation read as TensorFlow's SlurmClusterResolver reads it: the step's node list and tasks
 * per node expanded, ranks given to job names in sorted order over the hosts in the list's own order
 * (Slurm's block layout), ports from a base plus the task's index on its node, and this task's GPUs.
 * Pure parsing: no environment, no logging; the caller reads SLURM_* and says what went wrong. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* Bounds that keep a hostile value from allocating without end: hosts in a list, tasks in a step. */
#define SLURM_MAX_HOSTS 4096
#define SLURM_MAX_TASKS 4096
#define SLURM_HOST_MAX 255

/* Expands a Slurm host list ("n[01-02],m5,o[3-4,6]" -> n01 n02 m5 o3 o4 o6): in order, not sorted or
 * deduplicated, zero padding kept (a range's width is its first number's), several bracket groups in
 * one name multiplied out ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). On success returns 0 and stores a
 * malloc'd array of *n_ret malloc'd names in *hosts_ret (free with slurm_hosts_free). On failure returns
 * -EINVAL with the reason in why (one line, without the value), or -E2BIG past SLURM_MAX_HOSTS, or
 * -ENOMEM. */
int slurm_expand_hostlist(const char *s, char ***hosts_ret, size_t *n_ret, char *why, size_t whylen);
char **slurm_hosts_free(char **hosts, size_t n);

/* Expands SLURM_STEP_TASKS_PER_NODE ("3(x2),2,1" -> 3 3 2 1). Returns 0 with a malloc'd array of
 * *n_ret counts in *ret, or -EINVAL (why), -E2BIG (more than SLURM_MAX_HOSTS nodes or SLURM_MAX_TASKS
 * tasks), -ENOMEM. */
int slurm_expand_tasks_per_node(const char *s, uint32_t **ret, size_t *n_ret, char *why, size_t whylen);

/* The allocation as Slurm gives it to one task (the values of the SLURM_* variables). */
struct slurm_alloc {
        const char *procid;             /* SLURM_PROCID: this task's rank */
        const char *num_tasks;          /* SLURM_STEP_NUM_TASKS */
        const char *nodelist;           /* SLURM_STEP_NODELIST */
        const char *tasks_per_node;     /* SLURM_STEP_TASKS_PER_NODE */
        const char *gpus;               /* this node's GPUs, "0,1,2,3" (SLURM_STEP_GPUS or
                                         * CUDA_VISIBLE_DEVICES); NULL or "": none */
};

/* A job name and how many tasks it has ("ps", 2). */
struct slurm_job {
        const char *name;
        uint32_t count;
};

struct slurm_task {
        const char *job;        /* points into the slurm_job array given */
        uint32_t index;         /* within its job */
        char addr[SLURM_HOST_MAX + 8];  /* "host:port" */
};

struct slurm_cluster {
        struct slurm_task *tasks;       /* in rank order: each job's tasks together, jobs sorted by name */
        size_t n_tasks;
        size_t self;                    /* this task's rank */
        char *gpus;                     /* this task's share of the node's GPUs ("2,3"), or NULL */
};

/* Which SLURM_* variable a failure of slurm_resolve is about. */
enum slurm_var { SLURM_VAR_PROCID, SLURM_VAR_NUM_TASKS, SLURM_VAR_NODELIST, SLURM_VAR_TASKS_PER_NODE, SLURM_VAR_GPUS,
                 SLURM_VAR_JOBS };
const char *slurm_var_name(enum slurm_var v);  /* "SLURM_PROCID", ...; "the roles" for SLURM_VAR_JOBS */

/* Places jobs[0..n_jobs) over the allocation a, ports from port_base. Every one of a's fields but gpus
 * must be set; the job counts must add up to SLURM_STEP_NUM_TASKS, which must match the tasks per node,
 * whose list must be as long as the node list. GPUs: the node's list split evenly over the most tasks
 * any node runs (gpus_per_task = n_gpus / max tasks per node, as SlurmClusterResolver does), the task's
 * index on its node picking its share; none when that is 0. On success returns 0 and a new cluster in
 * *ret (free with slurm_cluster_free). On failure returns -EINVAL (or -E2BIG, -ENOMEM) with the variable
 * in *var and the reason in why. */
int slurm_resolve(const struct slurm_alloc *a, const struct slurm_job *jobs, size_t n_jobs, uint16_t port_base,
                  struct slurm_cluster **ret, enum slurm_var *var, char *why, size_t whylen);
struct slurm_cluster *slurm_cluster_free(struct slurm_cluster *c);
