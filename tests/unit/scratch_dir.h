/* A scratch directory for one test program's files: made by the group's setup, removed with all it
 * holds by its teardown. Include after cmocka.h; `name` in the template tells whose it was. */
#pragma once
#include <stdio.h>
#include <stdlib.h>

static char scratch_dir[256];

static inline int scratch_dir_make(const char *name)
{
        snprintf(scratch_dir, sizeof(scratch_dir), "/tmp/psfleet-test-%s-XXXXXX", name);
        return mkdtemp(scratch_dir) ? 0 : -1;
}

static inline int scratch_dir_remove(void **state)
{
        (void)state;
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", scratch_dir);
        return system(cmd);
}
