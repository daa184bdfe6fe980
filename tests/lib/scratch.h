/* The one way a test, benchmark or fuzz harness makes its scratch directory, and removes it: under
 * /tmp as psfleet-WHO-XXXXXX (mkdtemp: 0700, a name nobody else holds), removed with everything in it
 * by rm_tree (nftw, no shell). The unit tests use it through tests/unit/scratch_dir.h. */
#pragma once
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "rm_tree.h"

/* Makes the directory, its path into buf (len >= 32 + strlen(who)); 0, or -errno. */
static inline int scratch_make(char *buf, size_t len, const char *who)
{
        if ((size_t)snprintf(buf, len, "/tmp/psfleet-%s-XXXXXX", who) >= len)
                return -ENAMETOOLONG;
        return mkdtemp(buf) ? 0 : -errno;
}
