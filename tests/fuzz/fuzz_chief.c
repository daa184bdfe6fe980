/* Harness: every Supervisor handler of a real chiefd (its own main on a thread of this process, with
 * its database, checkpoint directory and test split) fed through gRPC on loopback. Input: one byte
 * choosing the method (0xff: Stop, then chiefd is started again), then the request's bytes; Watch is
 * read as a stream (its first message). Its shard is never reachable, so the job waits for it: Join,
 * Report and the checkpoint calls meet a job that is not ready.
 *
 * The invariant, after every input: chiefd still answers GetStatus with a JobStatus that parses.
 *
 * FUZZ_CHIEF_SEED=DIR writes the seed corpus (a legal call of each method) into DIR and exits. */
#include "config.h"
#include "fuzz_daemon.h"
#include "job.h"
#include "wire.h"
#include "psfleet/v1/supervisor.pb-c.h"

int chiefd_main(int argc, char **argv);   /* services/chiefd/chiefd.c, built here with main renamed */

static const char *const methods[] = {
        "/psfleet.v1.Supervisor/Join",
        "/psfleet.v1.Supervisor/Report",
        "/psfleet.v1.Supervisor/GetStatus",
        "/psfleet.v1.Supervisor/Restart",
        "/psfleet.v1.Supervisor/Watch",
        "/psfleet.v1.Supervisor/ListCheckpoints",
        "/psfleet.v1.Supervisor/SaveCheckpoint",
        "/psfleet.v1.Supervisor/DeleteCheckpoint",
        "/psfleet.v1.Supervisor/Stop",
};
enum { M_JOIN, M_REPORT, M_STATUS, M_RESTART, M_WATCH, M_LIST, M_SAVE, M_DELETE, M_STOP, M_CHOICES = M_STOP };

static struct fuzz_daemon chief = {.main = chiefd_main, .name = "chief:0", .stop = "/psfleet.v1.Supervisor/Stop"};
static struct job_config *cfg;
static struct job_layout *L;

static void setup(void) {
        char job[2048], err[512];
        /* fixed addresses (the fingerprint the seeds carry); the shard's is nobody's */
        snprintf(job, sizeof(job), FUZZ_JOB_FMT, "127.0.0.1:2", "127.0.0.1:3", "DATA", "momentum",
                 ", \"supervisor\": {\"ready_timeout_secs\": 86400}");
        fuzz_daemon_init(&chief, "{}", NULL);
        /* the data where the job file says, in the daemon's directory */
        fuzz_write_data(chief.dir);
        char *at = strstr(job, "DATA"), full[2200];
        snprintf(full, sizeof(full), "%.*s%s%s", (int)(at - job), job, chief.dir, at + 4);
        FILE *f = fopen(chief.job_path, "w");
        if (!f || fputs(full, f) < 0 || fclose(f) != 0)
                abort();
        if (config_load(chief.job_path, &cfg, err, sizeof(err)) < 0 || job_layout_new(cfg, &L) < 0) {
                fprintf(stderr, "fuzz_chief: %s\n", err);
                abort();
        }
        fuzz_daemon_start(&chief);
}

static int watch(const uint8_t *data, size_t size) {
        grpc_slice sl = grpc_slice_from_copied_buffer((const char *)data, size);
        grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1), *msg = NULL;
        grpc_slice_unref(sl);
        struct rpc_stream *s;
        if (rpc_stream_open(chief.ch, methods[M_WATCH], bb, 10000, &s) < 0)
                abort();
        int r = rpc_stream_next(s, 10000, &msg);
        if (msg)
                grpc_byte_buffer_destroy(msg);
        rpc_stream_close(s);
        FUZZ_CHECK(r != -ETIMEDOUT, "Watch sent nothing in 10 s");
        return r;
}

static void seeds(const char *dir) {
        uint8_t *p;
        size_t n;
        Psfleet__V1__JoinRequest j = PSFLEET__V1__JOIN_REQUEST__INIT;
        j.task = (char *)"worker:0";
        j.fingerprint = L->fingerprint;
        j.job_json = config_canonical_json(cfg);
        fuzz_bytes_of(wire_pack(&j.base), &p, &n);
        fuzz_write_seed(dir, "join", M_JOIN, p, n);
        free(p);
        free(j.job_json);
        Psfleet__V1__ReportRequest q = PSFLEET__V1__REPORT_REQUEST__INIT;
        q.local_step = 3;
        q.global_step = 5;
        q.loss = 0.5f;
        q.examples_per_s = 100;
        q.examples = 12;
        q.state = (char *)"training";
        fuzz_bytes_of(wire_pack(&q.base), &p, &n);
        fuzz_write_seed(dir, "report", M_REPORT, p, n);
        free(p);
        q.state = (char *)"diverged: a non-finite loss (nan)";
        fuzz_bytes_of(wire_pack(&q.base), &p, &n);
        fuzz_write_seed(dir, "report-diverged", M_REPORT, p, n);
        free(p);
        fuzz_write_seed(dir, "status", M_STATUS, NULL, 0);
        fuzz_write_seed(dir, "list", M_LIST, NULL, 0);
        Psfleet__V1__RestartRequest rr = PSFLEET__V1__RESTART_REQUEST__INIT;
        rr.reason = (char *)"fuzz";
        fuzz_bytes_of(wire_pack(&rr.base), &p, &n);
        fuzz_write_seed(dir, "restart", M_RESTART, p, n);
        fuzz_write_seed(dir, "save", M_SAVE, p, n);   /* SaveCheckpointRequest: a reason too */
        fuzz_write_seed(dir, "stop", 0xff, p, n);     /* StopRequest: a reason too */
        free(p);
        Psfleet__V1__WatchRequest w = PSFLEET__V1__WATCH_REQUEST__INIT;
        w.min_interval_ms = 100;
        w.heartbeat_ms = 1000;
        fuzz_bytes_of(wire_pack(&w.base), &p, &n);
        fuzz_write_seed(dir, "watch", M_WATCH, p, n);
        free(p);
        Psfleet__V1__DeleteCheckpointRequest d = PSFLEET__V1__DELETE_CHECKPOINT_REQUEST__INIT;
        d.global_step = 7;
        fuzz_bytes_of(wire_pack(&d.base), &p, &n);
        fuzz_write_seed(dir, "delete", M_DELETE, p, n);
        free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        fuzz_daemon_first(&chief, setup, "FUZZ_CHIEF_SEED", seeds);
        int m = fuzz_daemon_method(&data, &size, M_CHOICES, M_STOP);
        if (m < 0)
                return 0;
        int r = m == M_WATCH ? watch(data, size) : fuzz_daemon_call(&chief, methods[m], data, size, NULL);
        fuzz_daemon_after(&chief, m, M_STOP, r);
        protobuf_c_message_free_unpacked(
                fuzz_daemon_status(&chief, methods[M_STATUS], &psfleet__v1__job_status__descriptor, methods[m]), NULL);
        return 0;
}
