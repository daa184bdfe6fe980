/* A count-min sketch of small counts by 64-bit key (embedding tables' admission, docs/sparse.md):
 * depth rows of 2^width_log2 saturating 8-bit counters, updated conservatively (only the smallest
 * counters of a key grow), all halved after reset_after additions so that old sightings fade
 * (TinyLFU's reset). An estimate never undercounts the additions since the last halving, halved.
 *
 * Thread-safe: counters are updated with atomic byte operations; concurrent additions of one key may
 * count once instead of twice (a sketch's error, never a crash). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define CMSKETCH_MAX 255u

struct cmsketch;

/* width_log2 4..28, depth 1..8, reset_after 0: never halve. 0, -EINVAL, -ENOMEM. */
int cmsketch_new(unsigned width_log2, unsigned depth, uint64_t reset_after, struct cmsketch **ret);
struct cmsketch *cmsketch_free(struct cmsketch *s); /* NULL-safe; returns NULL */

/* Counts one sighting of key; returns its estimate after it (1..CMSKETCH_MAX). */
unsigned cmsketch_add(struct cmsketch *s, uint64_t key);
/* The estimate of key's sightings (0..CMSKETCH_MAX). */
unsigned cmsketch_estimate(const struct cmsketch *s, uint64_t key);
/* Halves every counter (what reset_after does by itself). */
void cmsketch_halve(struct cmsketch *s);
size_t cmsketch_bytes(const struct cmsketch *s);      /* memory held, all of it */
/* The memory a sketch of these dimensions holds (plan, before one exists). */
size_t cmsketch_bytes_for(unsigned width_log2, unsigned depth);
