/* The optimizers' slots by count and name: see optim_slots.h. */
#include "optim_slots.h"

#include <stddef.h>

unsigned optim_n_slots(enum optimizer_kind kind)
{
        switch (kind) {
        case OPT_SGD: return 0;
        case OPT_MOMENTUM: return 1;
        case OPT_ADAM: return 2;
        case OPT_ADAGRAD: return 1;
        }
        return 0;
}

const char *optim_slot_name(enum optimizer_kind kind, unsigned slot)
{
        if (slot >= optim_n_slots(kind))
                return NULL;
        switch (kind) {
        case OPT_MOMENTUM: return "momentum";
        case OPT_ADAM: return slot == 0 ? "m" : "v";
        case OPT_ADAGRAD: return "accumulator";
        default: return NULL;
        }
}

const char *optim_name(enum optimizer_kind kind)
{
        switch (kind) {
        case OPT_SGD: return "sgd";
        case OPT_MOMENTUM: return "momentum";
        case OPT_ADAM: return "adam";
        case OPT_ADAGRAD: return "adagrad";
        }
        return "?";
}
