/* What the record reader's files share (records.c reads files and lines, records_parse.c turns one line
 * into a record, records_tfrecord.c reads TFRecord files and their tf.train.Example records), and nobody
 * else uses. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#include "records.h"

/* One line of a file, without its newline, or one TFRecord record's data; not NUL-terminated. s NULL:
 * a line longer than RECORDS_MAX_LINE, or (why set) a TFRecord record that is bad as framed. */
struct records_line {
        const char *s;
        size_t len;
        const char *why;
};

struct tfr_file;
struct tfr_parser;

struct records_reader {
        struct records_opts o;  /* files points at our copy */
        char **files;           /* (n_files) */
        uint32_t *mine;         /* (n_mine) indices into files: the shard's */
        uint32_t n_mine;
        bool by_line;           /* fewer files than workers: every file, lines i % W == worker */
        uint32_t n_dense, n_fields;

        uint32_t cur;           /* index into mine of the open file */
        gzFile f;               /* text formats; NULL: no file open */
        struct tfr_file *tf;    /* tfrecord: the open file; NULL: none */
        bool eof;               /* the file has given all its bytes */
        uint64_t line_idx;      /* of the next line (record) in the file, from 0 */
        uint64_t at;            /* tfrecord: bytes of the (uncompressed) file given so far */
        uint64_t rec_at;        /* tfrecord: the byte offset of the last record read */
        char *rbuf;             /* (READ_BUF) */
        size_t rpos, rlen;
        char *line;             /* (line_cap) a line (record) that straddles reads */
        size_t line_cap;
        bool done;              /* the shard has ended (without loop, or an empty pass) */

        uint64_t bad, read, epoch, read_in_epoch;
        struct records_batch *probe; /* one record, for records_open's check of the first */
        struct pool *pool;      /* o.shuffle > 1: the records waiting to be drawn at random */
        struct tfr_parser *parser; /* tfrecord: the Example parser */
};

#define RECORDS_READ_BUF (64u << 10)

/* Parses l into record i of b (which has off[i * n_fields] set): 0, or -EBADMSG with why (no file or
 * line) in why. */
int records_parse_line(enum records_format fmt, struct records_batch *b, uint32_t i, struct records_line l,
                       char *why, size_t wl);
/* A finite decimal number, nothing else in the field (no spaces, no "nan", no hex). */
bool records_parse_float(const char *s, size_t len, float *ret);
/* *s, *n without the blanks at either end. */
void records_trim(const char **s, size_t *n);
/* The comma-separated columns of a line. */
size_t records_csv_columns(struct records_line l);

/* ---- records_tfrecord.c ---- */

/* Opens fd (which it then owns, also on failure) as r's current file, the compression as
 * data.tfrecord.compression says or told by its first bytes. 0, or -errno with err naming path. */
int tfr_file_open(struct records_reader *r, int fd, const char *path, char *err, size_t errlen);
void tfr_file_close(struct records_reader *r);
/* Back to the start of the open file: 0 or -errno. */
int tfr_file_rewind(struct records_reader *r);
/* Up to RECORDS_READ_BUF bytes of the (uncompressed) file into r->rbuf: bytes, 0 at its end, -EIO with
 * err (a read error, a corrupt compressed stream). */
int tfr_file_fill(struct records_reader *r, char *err, size_t errlen);
/* The file's next record as framed (length, masked CRC32C of it, data, masked CRC32C of the data):
 * 1 with *l (the data, valid until the next call; l->s NULL and l->why set when the record is bad: a
 * CRC that does not match, truncated, longer than max_record_bytes), 0 at the end of the file, or
 * -errno. r->line_idx counts it, r->rec_at is its offset. After a bad length, the rest of the file
 * cannot be framed: the file ends there. Sharded by record, another worker's record is passed over
 * unread and unchecked (l empty). */
int tfr_next_record(struct records_reader *r, struct records_line *l, char *err, size_t errlen);

int tfr_parser_new(const struct tfr_spec *s, struct tfr_parser **ret); /* 0, -ENOMEM */
struct tfr_parser *tfr_parser_free(struct tfr_parser *p);              /* NULL-safe; returns NULL */
/* Parses a serialized tf.train.Example into record i of b (which has off[i * n_fields] set) as the spec
 * says: 0, or -EBADMSG with why naming the feature ("feature 'x': ...") or the Example. */
int tfr_parse_example(struct tfr_parser *p, struct records_batch *b, uint32_t i, const uint8_t *data, size_t len,
                      char *why, size_t wl);
