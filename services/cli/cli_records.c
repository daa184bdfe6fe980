/* A chief's records read offline: see cli_records.h. */
#include "cli_records.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chief_db.h"
#include "util.h"

int cli_records_open(const char *dir, const char *job, struct chief_db **ret, char **dir_ret) {
        int r = -ENOENT;
        for (int i = 0; i < 2 && r == -ENOENT; i++) {
                if (i == 1 && !job)
                        break;
                char *d = i == 0 ? strdup(dir) : strdup_printf("%s/%s", dir, job);
                char *db = d ? strdup_printf("%s/chief.db", d) : NULL;
                r = !db ? -ENOMEM : access(db, F_OK) < 0 ? -ENOENT : chief_db_open_readonly(db, ret);
                free(db);
                if (r == 0)
                        *dir_ret = d;
                else
                        free(d);
        }
        return r;
}
