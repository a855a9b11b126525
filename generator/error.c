// SPDX-License-Identifier: BSD-3-Clause
/* error.c: the status-code table, error records and the growable string
 * that the generator and runtime use to build messages and source text. */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

static const char *const status_names[AG_ERR_COUNT] = {
    [AG_OK] = "success",
    [AG_ERR_SPEC] = "invalid spec",
    [AG_ERR_UNSUPPORTED] = "not supported yet",
    [AG_ERR_IO] = "input/output error",
    [AG_ERR_NOMEM] = "out of memory",
    [AG_ERR_TEMPLATE] = "template error",
    [AG_ERR_NVRTC] = "NVRTC compilation failed",
    [AG_ERR_NO_DRIVER] = "CUDA driver not available",
    [AG_ERR_NO_DEVICE] = "no CUDA device",
    [AG_ERR_CUDA] = "CUDA driver call failed",
    [AG_ERR_INVALID_ARGUMENT] = "invalid argument",
    [AG_ERR_CACHE] = "cache error",
};

const char *ag_strerror(ag_status code) {
  if ((unsigned)code >= AG_ERR_COUNT) return "unknown error";
  return status_names[code];
}

void ag_error_clear(ag_error *err) {
  if (!err) return;
  free(err->message);
  err->message = NULL;
  err->code = AG_OK;
}

ag_status ag_fail_take(ag_error *err, ag_status code, char *message) {
  if (!err) {
    free(message);
    return code;
  }
  free(err->message);
  err->code = code;
  err->message = message;
  return code;
}

ag_status ag_fail(ag_error *err, ag_status code, const char *fmt, ...) {
  if (!err) return code;
  va_list ap;
  va_start(ap, fmt);
  char *message = ag_vformat(fmt, ap);
  va_end(ap);
  return ag_fail_take(err, code, message);
}

/* ---- ag_buf ------------------------------------------------------------- */

void ag_buf_init(ag_buf *b) { memset(b, 0, sizeof *b); }

void ag_buf_free(ag_buf *b) {
  free(b->data);
  ag_buf_init(b);
}

static bool reserve(ag_buf *b, size_t extra) {
  if (b->failed) return false;
  if (extra > SIZE_MAX / 2 - b->len) goto fail;
  size_t need = b->len + extra + 1;
  if (need <= b->cap) return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) cap *= 2;
  char *p = realloc(b->data, cap);
  if (!p) goto fail;
  b->data = p;
  b->cap = cap;
  return true;
fail:
  b->failed = true;
  return false;
}

void ag_buf_append(ag_buf *b, const char *s, size_t n) {
  if (!reserve(b, n)) return;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void ag_buf_puts(ag_buf *b, const char *s) { ag_buf_append(b, s, strlen(s)); }

/* Width of the valid, shortest-form UTF-8 character at s (NUL-terminated)
 * that is not a C1 control, or 0. */
static size_t printable_utf8(const unsigned char *s) {
  size_t w;
  uint32_t v, min;
  if (s[0] >= 0x20 && s[0] < 0x7F) return 1;
  if ((s[0] & 0xE0) == 0xC0) w = 2, v = s[0] & 0x1F, min = 0x80;
  else if ((s[0] & 0xF0) == 0xE0) w = 3, v = s[0] & 0x0F, min = 0x800;
  else if ((s[0] & 0xF8) == 0xF0) w = 4, v = s[0] & 0x07, min = 0x10000;
  else return 0;
  for (size_t i = 1; i < w; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0; /* also stops at the NUL */
    v = (v << 6) | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) || v <= 0x9F) return 0;
  return w;
}

void ag_buf_put_name(ag_buf *b, const char *name) {
  const unsigned char *s = (const unsigned char *)name;
  while (*s) {
    size_t w = printable_utf8(s);
    if (w) {
      ag_buf_append(b, (const char *)s, w);
      s += w;
    } else {
      ag_buf_printf(b, "\\x%02X", *s++);
    }
  }
}

void ag_buf_vprintf(ag_buf *b, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) {
    b->failed = true;
    return;
  }
  if (!reserve(b, (size_t)n)) return;
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void ag_buf_printf(ag_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ag_buf_vprintf(b, fmt, ap);
  va_end(ap);
}

char *ag_vformat(const char *fmt, va_list ap) {
  ag_buf b;
  ag_buf_init(&b);
  ag_buf_vprintf(&b, fmt, ap);
  return ag_buf_take(&b);
}

char *ag_buf_take(ag_buf *b) {
  if (b->failed) {
    ag_buf_free(b);
    return NULL;
  }
  char *s = b->data;
  if (!s) s = calloc(1, 1);
  ag_buf_init(b);
  return s;
}
