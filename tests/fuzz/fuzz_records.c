/* Harness: the streaming readers (records_open, records_next) over a file of any bytes, plain or
 * gzip'd. The first byte picks the format, skip_bad, loop, the shard (one of up to 4 workers),
 * max_ids and a shuffle buffer of 5 (skip_bad with max_ids 3); the rest is the file, read in batches of 7. Every record given (also those before an error)
 * must fit its batch: offsets ascending within max_ids per record, finite labels and features, Criteo
 * labels 0 or 1; records_read counts exactly them. */
#include <errno.h>
#include <math.h>

#include "fuzz_util.h"
#include "records.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        uint8_t sel = data[0];
        char path[64], err[512];
        int fd = fuzz_memfd(data + 1, size - 1, path, sizeof(path));
        const char *files[] = {path};
        uint32_t workers = 1 + (sel >> 4 & 3);
        struct records_opts o = {
                .format = (enum records_format)(sel % 3), .files = files, .n_files = 1,
                .worker = (sel >> 6) % workers, .n_workers = workers,
                .max_ids = sel & 8 ? 3 : 64, .skip_bad = sel & 4, .loop = (sel & 0x33) == 0x30,
                .shuffle = (sel & 0x0c) == 0x0c ? 5 : 0, .seed = sel,
        };
        struct records_reader *r = NULL;
        struct records_batch *b = NULL;
        if (records_open(&o, &r, err, sizeof(err)) == 0 &&
            records_batch_new(7, records_n_dense(r), records_n_fields(r), o.max_ids, &b) == 0) {
                uint32_t nf = records_n_fields(r), nd = records_n_dense(r);
                uint64_t total = 0;
                int n;
                /* loop: a few epochs' worth, then stop */
                for (int calls = 0; calls < 512; calls++) {
                        n = records_next(r, b, err, sizeof(err));
                        /* after an error, the records before it are in b */
                        FUZZ_CHECK(n < 0 ? b->n < b->cap : (uint32_t)n == b->n && b->n <= b->cap,
                                   "records: %d, %u in the batch", n, b->n);
                        FUZZ_CHECK(b->off[0] == 0, "records: off[0] %u", b->off[0]);
                        for (uint32_t i = 0; i < b->n; i++) {
                                FUZZ_CHECK(isfinite(b->label[i]), "records: label");
                                if (o.format == RECORDS_CRITEO)
                                        FUZZ_CHECK(b->label[i] == 0 || b->label[i] == 1, "records: criteo label");
                                for (uint32_t j = 0; j < nd; j++)
                                        FUZZ_CHECK(isfinite(b->dense[i * nd + j]), "records: dense");
                                for (uint32_t f = 0; f < nf; f++)
                                        FUZZ_CHECK(b->off[i * nf + f] <= b->off[i * nf + f + 1], "records: off");
                                if (nf)
                                        FUZZ_CHECK(b->off[(i + 1) * nf] - b->off[i * nf] <= o.max_ids,
                                                   "records: %u ids", b->off[(i + 1) * nf] - b->off[i * nf]);
                        }
                        for (uint32_t k = 0; nf && k < b->off[b->n * nf]; k++)
                                FUZZ_CHECK(isfinite(b->val[k]), "records: value");
                        total += b->n;
                        if (n == 0 || (n < 0 && n != -EBADMSG))
                                break; /* after a bad line the reader goes on */
                }
                /* a shuffle buffer reads up to its size ahead of what it gave */
                FUZZ_CHECK(records_read(r) >= total && records_read(r) <= total + o.shuffle,
                           "records: read %llu, given %llu (shuffle buffer %u)", (unsigned long long)records_read(r),
                           (unsigned long long)total, o.shuffle);
        }
        records_batch_free(b);
        records_close(r);
        close(fd);
        return 0;
}
