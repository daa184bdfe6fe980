/* The chief's answers as JSON, for the commands' --json: one compact object per line. */
#pragma once
#include <stdio.h>

#include "psfleet/v1/supervisor.pb-c.h"

struct json_t;

/* Prints o as one compact JSON object and a newline on f, and drops the reference (takes o). */
void cli_print_json(FILE *f, struct json_t *o);
/* Prints a JobStatus as one compact JSON object and a newline on f. */
void cli_print_status_json(FILE *f, const Psfleet__V1__JobStatus *s);
/* A WaitingFor as a JSON object, or JSON null for NULL (a new reference: the caller owns it). */
struct json_t *cli_waiting_for_json(const Psfleet__V1__WaitingFor *w);
/* A Checkpoint as a JSON object (a new reference: the caller owns it). */
struct json_t *cli_checkpoint_json(const Psfleet__V1__Checkpoint *c);
