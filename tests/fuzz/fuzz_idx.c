/* Harness: the IDX reader (idx_load: gzip'd or plain, magic, dimensions, truncation). A file that
 * loads must hold exactly the product of its dimensions, every byte readable. */
#include "data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char path[64], err[512];
        int fd = fuzz_memfd(data, size, path, sizeof(path));
        struct idx *x = NULL;
        if (idx_load(path, &x, err, sizeof(err)) == 0) {
                size_t n = 1;
                for (uint32_t i = 0; i < x->n_dims; i++)
                        n *= x->dims[i];
                FUZZ_CHECK(x->n_dims >= 1 && x->n_dims <= 3 && n == x->size, "idx: %u dims, size %zu", x->n_dims,
                           x->size);
                unsigned sum = 0;
                for (size_t i = 0; i < x->size; i++)
                        sum += x->data[i];
                (void)sum;
        }
        idx_free(x);
        close(fd);
        return 0;
}
