/* A scratch directory for one test program's files: made by the group's setup, removed with all it
 * holds by its teardown (rm_tree: nftw, no shell). Include after cmocka.h; `name` in the template
 * tells whose it was. */
#pragma once
#include <stdio.h>
#include <stdlib.h>

#include "../lib/scratch.h"

static char scratch_dir[256];

/* Makes /tmp/psfleet-test-NAME-XXXXXX (0700) into scratch_dir; 0, or -1 with errno set. */
static inline int scratch_dir_make(const char *name)
{
        char who[64];
        snprintf(who, sizeof(who), "test-%s", name);
        int r = scratch_make(scratch_dir, sizeof(scratch_dir), who);
        if (r < 0)
                errno = -r;
        return r < 0 ? -1 : 0;
}

/* A cmocka group teardown: removes scratch_dir with all it holds; 0, or -1. */
static inline int scratch_dir_remove(void **state)
{
        (void)state;
        return rm_tree(scratch_dir) == 0 ? 0 : -1;
}
