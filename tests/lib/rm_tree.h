/* Removing a directory tree a test or benchmark made, without a shell (nftw, links not followed). */
#pragma once
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>

static inline int rm_tree_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
        (void)st;
        (void)type;
        (void)ftw;
        return remove(path) == 0 ? 0 : -errno;
}

/* Removes path and everything below it; 0 (also when path does not exist), or -errno. */
static inline int rm_tree(const char *path)
{
        int r = nftw(path, rm_tree_entry, 16, FTW_DEPTH | FTW_PHYS);
        if (r == -1)
                return errno == ENOENT ? 0 : -errno;
        return r;
}
