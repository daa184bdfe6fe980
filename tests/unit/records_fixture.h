/* What the record readers' tests share (test_records.c, test_tfrecord.c): a reader that must open, a
 * batch made for it, the heap in use. Include after cmocka.h and unit.h. */
#pragma once
#include <malloc.h>

#include "records.h"

/* Bytes of the heap in use, for the readers' bounded memory (mallinfo2 reads 0 under the sanitizers,
 * which check leaks instead). */
static inline size_t heap_in_use(void)
{
        struct mallinfo2 mi = mallinfo2();
        return mi.uordblks + mi.hblkhd;
}

/* records_open that must succeed (else the test fails, printing why). */
static inline struct records_reader *open_ok(const struct records_opts *o)
{
        char why[512];
        struct records_reader *r = NULL;
        int e = records_open(o, &r, why, sizeof(why));
        if (e)
                print_error("records_open: %d %s\n", e, why);
        assert_int_equal(e, 0);
        return r;
}

/* A batch of cap records fitting r, of max_ids ids each. */
static inline struct records_batch *batch_for(const struct records_reader *r, uint32_t cap, uint32_t max_ids)
{
        struct records_batch *b;
        assert_int_equal(records_batch_new(cap, records_n_dense(r), records_n_fields(r), max_ids, &b), 0);
        return b;
}
