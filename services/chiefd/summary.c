/* TensorBoard event files: see summary.h. Records are packed with protobuf-c from TensorFlow's own
 * field numbers (proto/tensorboard) and framed as TFRecords. */
#include "summary.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"
#include "util.h"
#include "tensorboard/event.pb-c.h"

struct summary_writer {
        pthread_mutex_t mu;
        FILE *f;
        char *path;
};

static void put_le(uint8_t *p, uint64_t v, int n) {
        for (int i = 0; i < n; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}

void summary_frame(const uint8_t *data, size_t len, uint8_t *out) {
        put_le(out, len, 8);
        put_le(out + 8, crc32c_mask(crc32c(out, 8)), 4);
        memcpy(out + 12, data, len);
        put_le(out + 12 + len, crc32c_mask(crc32c(data, len)), 4);
}

/* Packs ev and appends it as one record. Lock held. */
static int write_event(struct summary_writer *w, Tensorflow__Event *ev) {
        Tensorflow__SourceMetadata src = TENSORFLOW__SOURCE_METADATA__INIT;
        src.writer = (char *)"psfleet.chiefd";
        ev->source_metadata = &src;
        size_t len = protobuf_c_message_get_packed_size(&ev->base);
        uint8_t *buf = malloc(len + 16), *msg = malloc(len ? len : 1);
        int r = 0;
        if (!buf || !msg) {
                r = -ENOMEM;
                goto out;
        }
        protobuf_c_message_pack(&ev->base, msg);
        summary_frame(msg, len, buf);
        if (fwrite(buf, 1, len + 16, w->f) != len + 16)
                r = -EIO;
out:
        free(buf);
        free(msg);
        ev->source_metadata = NULL;
        return r;
}

int summary_writer_new(const char *dir, uint64_t time_us, const char *host, struct summary_writer **ret) {
        int r = mkdir_p(dir, 0755);
        if (r < 0)
                return r;
        struct summary_writer *w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        pthread_mutex_init(&w->mu, NULL);
        unsigned long long secs = (unsigned long long)(time_us / 1000000);
        int fd = -1;
        for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
                free(w->path);
                w->path = attempt == 0 ? strdup_printf("%s/events.out.tfevents.%010llu.%s", dir, secs, host)
                                       : strdup_printf("%s/events.out.tfevents.%010llu.%s.%d", dir, secs, host,
                                                       (int)getpid());
                if (!w->path) {
                        r = -ENOMEM;
                        goto fail;
                }
                fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_APPEND, 0644);
                if (fd < 0 && errno != EEXIST) {
                        r = -errno;
                        goto fail;
                }
        }
        if (fd < 0) {
                r = -EEXIST;
                goto fail;
        }
        w->f = fdopen(fd, "ab");
        if (!w->f) {
                r = -errno;
                close(fd);
                goto fail;
        }
        Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
        ev.wall_time = (double)time_us / 1e6;
        ev.what_case = TENSORFLOW__EVENT__WHAT_FILE_VERSION;
        ev.file_version = (char *)"brain.Event:2";
        r = write_event(w, &ev);
        if (r >= 0)
                r = fflush(w->f) == 0 ? 0 : -errno;
        if (r < 0)
                goto fail;
        *ret = w;
        return 0;
fail:
        summary_writer_free(w);
        return r;
}

struct summary_writer *summary_writer_free(struct summary_writer *w) {
        if (!w)
                return NULL;
        if (w->f)
                fclose(w->f);
        pthread_mutex_destroy(&w->mu);
        free(w->path);
        free(w);
        return NULL;
}

const char *summary_writer_path(const struct summary_writer *w) {
        return w->path;
}

/* Stamps ev with its step and time and appends it, under the writer's lock. */
static int write_at(struct summary_writer *w, uint64_t step, uint64_t time_us, Tensorflow__Event *ev) {
        ev->wall_time = (double)time_us / 1e6;
        ev->step = (int64_t)step;
        pthread_mutex_lock(&w->mu);
        int r = write_event(w, ev);
        pthread_mutex_unlock(&w->mu);
        return r;
}

int summary_write_scalars(struct summary_writer *w, uint64_t step, uint64_t time_us, const struct summary_scalar *v,
                          size_t n) {
        Tensorflow__Summary__Value *vals = calloc(n ? n : 1, sizeof(*vals));
        Tensorflow__Summary__Value **vp = calloc(n ? n : 1, sizeof(*vp));
        int r;
        if (!vals || !vp) {
                r = -ENOMEM;
                goto out;
        }
        for (size_t i = 0; i < n; i++) {
                tensorflow__summary__value__init(&vals[i]);
                vals[i].tag = (char *)v[i].tag;
                vals[i].value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
                vals[i].simple_value = v[i].value;
                vp[i] = &vals[i];
        }
        Tensorflow__Summary s = TENSORFLOW__SUMMARY__INIT;
        s.n_value = n;
        s.value = vp;
        Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
        ev.what_case = TENSORFLOW__EVENT__WHAT_SUMMARY;
        ev.summary = &s;
        r = write_at(w, step, time_us, &ev);
out:
        free(vals);
        free(vp);
        return r;
}

int summary_write_session_log(struct summary_writer *w, uint64_t step, uint64_t time_us, int status,
                              const char *checkpoint_path, const char *msg) {
        Tensorflow__SessionLog sl = TENSORFLOW__SESSION_LOG__INIT;
        sl.status = (Tensorflow__SessionLog__SessionStatus)status;
        sl.checkpoint_path = (char *)(checkpoint_path ? checkpoint_path : "");
        sl.msg = (char *)(msg ? msg : "");
        Tensorflow__Event ev = TENSORFLOW__EVENT__INIT;
        ev.what_case = TENSORFLOW__EVENT__WHAT_SESSION_LOG;
        ev.session_log = &sl;
        return write_at(w, step, time_us, &ev);
}

int summary_flush(struct summary_writer *w) {
        pthread_mutex_lock(&w->mu);
        int r = fflush(w->f) == 0 ? 0 : -errno;
        pthread_mutex_unlock(&w->mu);
        return r;
}
