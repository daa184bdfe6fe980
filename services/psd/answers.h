/* rpc.compression int8's answers as int8 changes (PushHeader.delta_answers): psd keeps, per worker,
 * the values it holds of this shard's parts as psd's answers left them, so that an answer needs only the
 * change since, in int8 (wire_int8_delta_encode), and what the int8 drops goes out with the next one.
 *
 * Each answer gets a number (answer_seq) that the worker's next push of the same parts names as its
 * base: when every part's copy stands at that base the answer is a change, otherwise (the first push,
 * an answer lost on the way, a Pull in between, another psd) it is whole, in float32, and the copies
 * start again from it. Numbers start at a random point, so a number from another psd never matches.
 * Memory: one float32 copy of the parts each worker pushes as int8, taken on its first answer. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct psd_answers;

/* parts_n[i]: floats of part i. -ENOMEM. */
int psd_answers_new(uint32_t n_workers, uint32_t n_parts, const size_t *parts_n, struct psd_answers **ret);
struct psd_answers *psd_answers_free(struct psd_answers *a);

/* Whether worker w's copies of parts idx[0..n) all stand at base (never for base 0, nor a worker past
 * the cluster's). Advisory: psd_answer_begin decides again under the worker's lock. */
bool psd_answers_at(struct psd_answers *a, uint32_t w, const uint32_t *idx, size_t n, uint64_t base);

/* One answer to worker w: begin locks the worker's copies and returns the answer's number (0: none
 * kept: w is not one of the cluster's), with *delta true when every part of idx[0..n) stands at base
 * (and delta was asked); then each part goes out through psd_answer_part, and end unlocks. */
uint64_t psd_answer_begin(struct psd_answers *a, uint32_t w, const uint32_t *idx, size_t n, uint64_t base,
                          bool want_delta, bool *delta);
/* Part idx's fresh values v: with delta, the int8 change into dst (wire_int8_size of the part's
 * floats); without, the copy set to v (dst untouched). The copy then stands at seq. -ENOMEM (no copy:
 * the part stands nowhere, its next answer whole). */
int psd_answer_part(struct psd_answers *a, uint32_t w, uint32_t idx, const float *v, bool delta, uint64_t seq,
                    uint8_t *dst);
void psd_answer_end(struct psd_answers *a, uint32_t w);

/* Worker w's copy of part idx (NULL: none yet); read it only while no answer to w is built (tests). */
const float *psd_answers_copy(const struct psd_answers *a, uint32_t w, uint32_t idx);
