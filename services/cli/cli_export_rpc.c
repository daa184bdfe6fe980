/* psfleet export --via-chief: the export asked of the job's running chief (Supervisor.Export), which
 * writes it into its own state directory; the reply printed (cli_export.h). */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_chief.h"
#include "cli_export.h"
#include "cli_json.h"
#include "cli_util.h"
#include "rpc.h"

#define M_EXPORT "/psfleet.v1.Supervisor/Export"
#define EX_DATAERR 65
#define EX_IOERR 74
#define EX_CONFIG 78

static void print_reply(const Psfleet__V1__ExportReply *rep, bool json) {
        if (json) {
                json_t *o = json_pack("{s:s, s:I, s:b}", "dir", rep->dir, "global_step", (json_int_t)rep->global_step,
                                      "existing", rep->existing);
                json_t *files = json_array();
                for (size_t i = 0; files && i < rep->n_files; i++)
                        json_array_append_new(files, json_pack("{s:s, s:I}", "path", rep->files[i]->path, "bytes",
                                                               (json_int_t)rep->files[i]->bytes));
                json_object_set_new(o, "files", files);
                if (rep->since) {
                        json_object_set_new(o, "since", json_integer((json_int_t)rep->since));
                        json_object_set_new(o, "changed", json_integer((json_int_t)rep->changed));
                        json_object_set_new(o, "tombstones", json_integer((json_int_t)rep->tombstones));
                }
                cli_print_json(stdout, o);
                return;
        }
        if (rep->since)
                printf("the chief %s the changes from global_step %" PRIu64 " to %" PRIu64 " (%" PRIu64
                       " rows changed, %" PRIu64 " gone) in %s\n", rep->existing ? "had exported" : "exported",
                       rep->since, rep->global_step, rep->changed, rep->tombstones, rep->dir);
        else
                printf("the chief %s global_step %" PRIu64 " in %s\n", rep->existing ? "had exported" : "exported",
                       rep->global_step, rep->dir);
        for (size_t i = 0; i < rep->n_files; i++)
                printf("  %-40s %12" PRIu64 " bytes\n", rep->files[i]->path, rep->files[i]->bytes);
}

int export_via_chief(const char *address, const char *job, const struct export_ask_rpc *ask, bool json) {
        struct cli_chief_ref ref;
        int r = cli_chief_locate("export", address, job, false, &ref);
        if (r)
                return r;
        rpc_global_init();
        struct rpc_channel *ch = NULL;
        int ret = 1;
        if (cli_chief_channel(ref.address, &ch) == 0) {
                Psfleet__V1__ExportRequest q = PSFLEET__V1__EXPORT_REQUEST__INIT;
                q.step = ask->step;
                q.since = ask->since;
                q.max_inline_rows = ask->max_inline_rows;
                q.external_data = ask->external;
                ProtobufCMessage *m = NULL;
                char err[1024];
                r = rpc_call_msg(ch, M_EXPORT, &q.base, &psfleet__v1__export_reply__descriptor, ask->timeout_ms, false,
                                 &m, err, sizeof(err));
                if (r == 0) {
                        print_reply((const Psfleet__V1__ExportReply *)m, json);
                        protobuf_c_message_free_unpacked(m, NULL);
                        ret = 0;
                } else {
                        /* the chief's own refusal, as offline: no such checkpoint, one that does not verify
                         * 65; a model that cannot be exported (a delta without tables) 78; its disk 74; the
                         * chief not reached, or not allowed: 1 */
                        cli_error("export: %s%s", r == -EAGAIN || r == -ETIMEDOUT ? "cannot reach the chief: " : "", err);
                        ret = r == -EPERM ? EX_DATAERR : r == -EINVAL ? EX_CONFIG : r == -EIO ? EX_IOERR : 1;
                }
                rpc_channel_free(ch);
        }
        cli_chief_ref_clear(&ref);
        rpc_global_shutdown();
        return ret;
}
