/* Harness: the Worker service of a real workerd (its own main on a thread of this process, its data
 * loaded, its chief unreachable so it keeps asking to join) fed through gRPC on loopback. Input: one
 * byte choosing the method (0xff: Stop, then workerd is started again), then the request's bytes.
 * Neither handler reads its request, so what is fuzzed here is the server's side of every call
 * (framing, the method table, the replies) under a daemon that is busy joining.
 *
 * The invariant, after every input: workerd still answers GetWorkerStatus with a WorkerStatus that
 * parses and names worker 0. */
#include "fuzz_daemon.h"
#include "wire.h"
#include "psfleet/v1/worker.pb-c.h"

int workerd_main(int argc, char **argv);   /* services/workerd/workerd.c, built here with main renamed */

static const char *const methods[] = {"/psfleet.v1.Worker/GetWorkerStatus", "/grpc.health.v1.Health/Check",
                                      "/psfleet.v1.Worker/Stop"};
enum { M_STATUS, M_HEALTH, M_STOP, M_CHOICES = M_STOP };

static struct fuzz_daemon worker = {.main = workerd_main, .name = "worker:0", .stop = "/psfleet.v1.Worker/Stop"};

static void setup(void) {
        static const char *const extra[] = {"--task-index", "0", NULL};
        fuzz_daemon_init(&worker, "{}", extra);
        fuzz_write_data(worker.dir);
        char job[2048];
        snprintf(job, sizeof(job), FUZZ_JOB_FMT, "127.0.0.1:2", "127.0.0.1:3", worker.dir, "momentum",
                 ", \"supervisor\": {\"ready_timeout_secs\": 86400}, \"device\": {\"device\": \"cpu\"}");
        FILE *f = fopen(worker.job_path, "w");
        if (!f || fputs(job, f) < 0 || fclose(f) != 0)
                abort();
        fuzz_daemon_start(&worker);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (!worker.ch)
                setup();
        int m = fuzz_daemon_method(&data, &size, M_CHOICES, M_STOP);
        if (m < 0)
                return 0;
        fuzz_daemon_after(&worker, m, M_STOP, fuzz_daemon_call(&worker, methods[m], data, size, NULL));
        ProtobufCMessage *st =
                fuzz_daemon_status(&worker, methods[M_STATUS], &psfleet__v1__worker_status__descriptor, methods[m]);
        FUZZ_CHECK(((Psfleet__V1__WorkerStatus *)st)->worker == 0, "a WorkerStatus of another worker");
        protobuf_c_message_free_unpacked(st, NULL);
        return 0;
}
