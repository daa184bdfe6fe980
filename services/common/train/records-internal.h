/* What the record reader's files share (records.c reads files and lines, records_parse.c turns one line
 * into a record), and nobody else uses. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "records.h"

/* One line of a file, without its newline; not NUL-terminated. */
struct records_line {
        const char *s;
        size_t len;
};

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
