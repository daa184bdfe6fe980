/* A scratch directory for one test program's files: made by the group's setup, removed with all it
 * holds by its teardown (nftw, no shell). Include after cmocka.h; `name` in the template tells whose
 * it was. scratch_tree_remove() removes any tree a test made on its own. */
#pragma once
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static char scratch_dir[256];

/* Makes /tmp/psfleet-test-NAME-XXXXXX (0700) into scratch_dir; 0, or -1 with errno set. */
static inline int scratch_dir_make(const char *name)
{
        snprintf(scratch_dir, sizeof(scratch_dir), "/tmp/psfleet-test-%s-XXXXXX", name);
        return mkdtemp(scratch_dir) ? 0 : -1;
}

static inline int scratch_tree_remove_entry(const char *path, const struct stat *st, int type,
                                            struct FTW *ftw)
{
        (void)st;
        (void)type;
        (void)ftw;
        return remove(path) == 0 ? 0 : -errno;
}

/* Removes path and everything below it, not following links; 0, or -errno (a missing path is 0). */
static inline int scratch_tree_remove(const char *path)
{
        int r = nftw(path, scratch_tree_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        if (r == -1)
                return errno == ENOENT ? 0 : -errno;
        return r;
}

/* A cmocka group teardown: removes scratch_dir with all it holds; 0, or -1. */
static inline int scratch_dir_remove(void **state)
{
        (void)state;
        return scratch_tree_remove(scratch_dir) == 0 ? 0 : -1;
}
