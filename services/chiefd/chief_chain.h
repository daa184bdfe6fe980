/* Chains of incremental checkpoints as data (docs/checkpoints.md, "Incremental checkpoints"): a full
 * checkpoint and the increments chained to it by parent_step, and a table's rows after an increment.
 * Pure functions over the caller's memory; thread-safe. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "chief_db.h"
#include "ps_client.h"

/* Applies an increment to acc: the ids in ev (evicted since the parent) go, then each of inc's rows
 * replaces or joins acc's (an id evicted and made again since the parent is in both). acc's rows keep
 * their order, new ones follow. 0, or -ENOMEM (acc unchanged but maybe grown). */
int chief_chain_apply(struct ps_sparse_rows *acc, const struct ps_sparse_rows *inc, const struct ps_sparse_rows *ev);

/* The records of rows[i]'s chain, full one first, into chain[] (*k of them; chain has room for n).
 * -ENOENT when a link's parent is not recorded (or gone[]): *broken is then the record whose parent is
 * missing; -ELOOP when the parents go round without a full checkpoint. */
int chief_chain_of(const struct chief_db_checkpoint *rows, size_t n, const bool *gone, size_t i, size_t *chain,
                   size_t *k, size_t *broken);
