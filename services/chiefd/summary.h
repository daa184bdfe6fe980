/* TensorBoard event files: events.out.tfevents.<seconds>.<host> in a directory, a TFRecord stream of
 * tensorflow.Event protos (proto/tensorboard/): uint64 length, uint32 masked CRC-32C of the length,
 * the bytes, uint32 masked CRC-32C of the bytes. The first record carries file_version
 * "brain.Event:2", as TensorFlow's EventsWriter writes it. TensorBoard, tf.summary readers and
 * tensorboard.backend.event_processing read these files.
 *
 * Thread-safe: every call takes the writer's lock. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct summary_writer;

/* One scalar of an Event. */
struct summary_scalar {
        const char *tag;        /* "loss/worker_0", "global_step/sec", ... */
        float value;
};

/* Creates dir (and parents) and a new event file in it, named for time_us and host (".<pid>" is
 * appended if that name exists), and writes the file_version record. Returns 0 and *ret, or -errno. */
int summary_writer_new(const char *dir, uint64_t time_us, const char *host, struct summary_writer **ret);
struct summary_writer *summary_writer_free(struct summary_writer *w);  /* flushes; NULL-safe */
const char *summary_writer_path(const struct summary_writer *w);

/* Appends one Event at (step, wall time time_us) holding n scalars. Returns 0 or -errno. */
int summary_write_scalars(struct summary_writer *w, uint64_t step, uint64_t time_us, const struct summary_scalar *v,
                          size_t n);
/* SessionLog statuses, as in event.proto. */
enum { SUMMARY_SESSION_START = 1, SUMMARY_SESSION_STOP = 2, SUMMARY_SESSION_CHECKPOINT = 3 };

/* Appends a SessionLog event with one of the statuses above. */
int summary_write_session_log(struct summary_writer *w, uint64_t step, uint64_t time_us, int status,
                              const char *checkpoint_path, const char *msg);
/* Pushes what was written to the file (write(2); no fsync: summaries are cheap to lose). */
int summary_flush(struct summary_writer *w);

/* The TFRecord framing of one record into out (len + 16 bytes); for tests. */
void summary_frame(const uint8_t *data, size_t len, uint8_t *out);
