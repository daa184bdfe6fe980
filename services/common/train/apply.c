/* The one apply: see apply.h. Slicing is done once, in apply_rows_at; the step is the rows' own count
 * of applied gradients, which every caller keeps in the same struct. */
#include "apply.h"

struct apply_rows apply_rows_at(float *w, float *const *slots, unsigned n_slots, size_t offset, size_t n) {
        struct apply_rows a = {.w = w + offset, .n = n};
        for (unsigned s = 0; s < n_slots && s < OPTIM_MAX_SLOTS; s++)
                a.slot[s] = slots[s] + offset;
        return a;
}

void apply_reset(const struct training_config *t, struct apply_rows *a, uint64_t updates) {
        for (unsigned s = 0; s < optim_n_slots(t->optimizer); s++) {
                float v = optim_slot_init(t, s);
                for (size_t i = 0; i < a->n; i++)
                        a->slot[s][i] = v;
        }
        a->updates = updates;
}

void apply_gradient(const struct training_config *t, struct apply_rows *a, const float *g) {
        optim_apply(t, a->updates, a->w, g, a->slot, a->n);
        a->updates++;
}

void apply_gradient_read(const struct training_config *t, struct apply_rows *a, apply_read_fn read, void *ud) {
        float bounce[APPLY_BOUNCE] __attribute__((aligned(64)));
        unsigned ns = optim_n_slots(t->optimizer);
        for (size_t at = 0; at < a->n; at += APPLY_BOUNCE) {
                size_t k = a->n - at < APPLY_BOUNCE ? a->n - at : APPLY_BOUNCE;
                float *sl[OPTIM_MAX_SLOTS] = {0};
                for (unsigned s = 0; s < ns; s++)
                        sl[s] = a->slot[s] + at;
                read(ud, bounce, k);
                optim_apply(t, a->updates, a->w + at, bounce, sl, k);
        }
        a->updates++;
}

bool apply_all_finite_read(size_t n, apply_read_fn read, void *ud) {
        float bounce[APPLY_BOUNCE] __attribute__((aligned(64)));
        for (size_t at = 0; at < n; at += APPLY_BOUNCE) {
                size_t k = n - at < APPLY_BOUNCE ? n - at : APPLY_BOUNCE;
                read(ud, bounce, k);
                if (!optim_all_finite(bounce, k))
                        return false;
        }
        return true;
}
