// SPDX-License-Identifier: BSD-3-Clause
/* internal.h: helpers shared by the generator's files (error records,
 * growable strings). Not part of the public API. */
#ifndef AG_GENERATOR_INTERNAL_H
#define AG_GENERATOR_INTERNAL_H

#include <stdarg.h>
#include "attngen.h"

#if defined(__GNUC__)
#define AG_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define AG_PRINTF(a, b)
#endif

/* Set err (when non-NULL) to code and a formatted message, replacing any
 * previous one; returns code so callers can `return ag_fail(...)`. */
ag_status ag_fail(ag_error *err, ag_status code, const char *fmt, ...) AG_PRINTF(3, 4);
/* Take ownership of a malloc()ed message (may be NULL). Returns code. */
ag_status ag_fail_take(ag_error *err, ag_status code, char *message);

/* A growable string with a sticky error: append many times, check once. */
typedef struct ag_buf {
  char *data;    /* NUL-terminated when non-NULL */
  size_t len;
  size_t cap;
  bool failed;   /* an allocation failed; data is unusable */
} ag_buf;

void ag_buf_init(ag_buf *b);
void ag_buf_free(ag_buf *b);
void ag_buf_append(ag_buf *b, const char *s, size_t n);
void ag_buf_puts(ag_buf *b, const char *s);
void ag_buf_printf(ag_buf *b, const char *fmt, ...) AG_PRINTF(2, 3);
void ag_buf_vprintf(ag_buf *b, const char *fmt, va_list ap);
/* Hand the string over (caller frees); NULL if an append failed, in which
 * case the buffer is freed. Leaves the buffer empty. */
char *ag_buf_take(ag_buf *b);
/* A new string from a format (caller frees); NULL when out of memory. */
char *ag_vformat(const char *fmt, va_list ap);
/* Append a file name as it may be printed: control characters (C0, DEL,
 * C1) and bytes that are not valid UTF-8 become \xNN, so no escape
 * sequence in a name reaches a terminal; other characters are kept. */
void ag_buf_put_name(ag_buf *b, const char *name);

#endif
