/* Harness: the TFRecord reader (records_open, records_next with data.format tfrecord) over a file of any
 * bytes. The first byte picks the compression key (auto, none, gzip, zlib), skip_bad, the shard (one of
 * up to 2 workers), max_ids (3 or 64), an image in the spec, and whether the rest is the file as it is or
 * records to frame: then it is a sequence of (length byte, that many bytes), each framed here with both
 * CRCs right, so that the fuzzer reaches the Example parser without learning CRC32C. Every record given
 * (also those before an error) must fit its batch: offsets ascending within max_ids, finite labels and
 * features, images in [0, 1]; records_read counts exactly them. */
#include <errno.h>
#include <math.h>

#include "crc32c.h"
#include "fuzz_util.h"
#include "records.h"

/* The records of data (length byte, bytes), framed, into out (room for 2 * size + 16 per record). */
static size_t frame_all(const uint8_t *data, size_t size, uint8_t *out)
{
        size_t n = 0;
        for (size_t i = 0; i < size;) {
                size_t len = data[i++];
                if (len > size - i)
                        len = size - i;
                uint8_t *h = out + n;
                for (int k = 0; k < 8; k++)
                        h[k] = (uint8_t)((uint64_t)len >> 8 * k);
                uint32_t c = crc32c_mask(crc32c(h, 8));
                memcpy(h + 8, &c, 4);   /* little-endian hosts only, as the fuzz build */
                memcpy(h + 12, data + i, len);
                c = crc32c_mask(crc32c(data + i, len));
                memcpy(h + 12 + len, &c, 4);
                n += 16 + len;
                i += len;
        }
        return n;
}

static struct tfr_spec spec(bool image)
{
        struct tfr_spec s = {.max_record_bytes = 1 << 16};
        snprintf(s.label.name, TFR_NAME_MAX, "label");
        s.dense[0] = (struct tfr_feature){.name = "x", .kind = TFR_FLOAT, .length = 2, .has_default = true};
        s.dense[1] = (struct tfr_feature){.name = "n", .kind = TFR_INT64, .length = 1};
        s.n_dense = 2;
        s.sparse[0] = (struct tfr_feature){.name = "id", .kind = TFR_INT64};
        s.sparse[1] = (struct tfr_feature){.name = "tok", .kind = TFR_BYTES};
        s.n_sparse = 2;
        if (image)
                s.image = (struct tfr_feature){.name = "img", .kind = TFR_BYTES, .length = 4, .shape = {1, 2, 2}};
        return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        uint8_t sel = data[0];
        bool framed = sel & 0x80, image = sel & 0x40;
        uint8_t *buf = NULL;
        const uint8_t *file = data + 1;
        size_t n = size - 1;
        if (framed) {
                if (!(buf = malloc(17 * n + 16)))
                        return 0;
                n = frame_all(data + 1, size - 1, buf);
                file = buf;
        }
        char path[64], err[512];
        int fd = fuzz_memfd(file, n, path, sizeof(path));
        const char *files[] = {path};
        struct tfr_spec s = spec(image);
        s.compression = (enum tfr_compression)(sel & 3);
        uint32_t workers = 1 + (sel >> 4 & 1);
        struct records_opts o = {
                .format = RECORDS_TFRECORD, .files = files, .n_files = 1, .worker = (sel >> 5 & 1) % workers,
                .n_workers = workers, .max_ids = sel & 8 ? 3 : 64, .skip_bad = sel & 4, .tfrecord = &s,
        };
        struct records_reader *r = NULL;
        struct records_batch *b = NULL;
        if (records_open(&o, &r, err, sizeof(err)) == 0 &&
            records_batch_new(7, records_n_dense(r), records_n_fields(r), o.max_ids, &b) == 0) {
                uint32_t nf = records_n_fields(r), nd = records_n_dense(r);
                FUZZ_CHECK(nd == (image ? 7u : 3u) && nf == 2, "tfrecord: %u dense, %u fields", nd, nf);
                uint64_t total = 0;
                for (int calls = 0; calls < 512; calls++) {
                        int k = records_next(r, b, err, sizeof(err));
                        FUZZ_CHECK(k < 0 ? b->n < b->cap : (uint32_t)k == b->n && b->n <= b->cap,
                                   "tfrecord: %d, %u in the batch", k, b->n);
                        for (uint32_t i = 0; i < b->n; i++) {
                                FUZZ_CHECK(isfinite(b->label[i]), "tfrecord: label");
                                for (uint32_t j = 0; j < nd; j++)
                                        FUZZ_CHECK(isfinite(b->dense[i * nd + j]), "tfrecord: dense");
                                for (uint32_t j = 3; j < nd; j++)
                                        FUZZ_CHECK(b->dense[i * nd + j] >= 0 && b->dense[i * nd + j] <= 1,
                                                   "tfrecord: image byte");
                                for (uint32_t f = 0; f < nf; f++)
                                        FUZZ_CHECK(b->off[i * nf + f] <= b->off[i * nf + f + 1], "tfrecord: off");
                                FUZZ_CHECK(b->off[(i + 1) * nf] - b->off[i * nf] <= o.max_ids, "tfrecord: %u ids",
                                           b->off[(i + 1) * nf] - b->off[i * nf]);
                        }
                        total += b->n;
                        if (k == 0 || (k < 0 && k != -EBADMSG))
                                break; /* after a bad record the reader goes on */
                }
                FUZZ_CHECK(records_read(r) == total, "tfrecord: read %llu, given %llu",
                           (unsigned long long)records_read(r), (unsigned long long)total);
        }
        records_batch_free(b);
        records_close(r);
        close(fd);
        free(buf);
        return 0;
}
