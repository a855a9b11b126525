// SPDX-License-Identifier: BSD-3-Clause
/* fuzz_names.c: libFuzzer target over the C API's spec-from-string entry
 * with arbitrary source names: the first byte gives the name's length (up
 * to 63 bytes, cut at a NUL), the name follows, the rest is the spec. Every
 * outcome must be a known status with a message exactly on failure; the
 * message's first line ("NAME:line:col: error: ...") must carry the name
 * escaped, so no control byte (C0 but tab, DEL, C1) and no byte that is not
 * UTF-8 reaches a terminal; a spec that loads emits a source whose first
 * line (the banner naming the source) neither ends the comment early nor
 * holds a control byte. Built by `make fuzz` (docs/reliability.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attngen.h"

static void require(int ok) {
  if (!ok) abort();
}

/* The bytes [s, end) are UTF-8 with no C0 control but tab, no DEL and no
 * C1 control (U+0080..U+009F). */
static int clean_utf8(const unsigned char *s, const unsigned char *end) {
  while (s < end) {
    const unsigned c = *s;
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t') || c == 0x7f) return 0;
      s++;
      continue;
    }
    int n = c >= 0xf0 && c <= 0xf4 ? 3 : c >= 0xe0 ? 2 : c >= 0xc2 && c < 0xe0 ? 1 : -1;
    if (n < 0 || end - s <= n) return 0;
    for (int i = 1; i <= n; i++)
      if ((s[i] & 0xc0) != 0x80) return 0;
    if (c == 0xc2 && s[1] < 0xa0) return 0; /* C1 */
    s += n + 1;
  }
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  size_t len = data[0] % 64;
  if (len > size - 1) len = size - 1;
  char name[64];
  memcpy(name, data + 1, len);
  name[len] = '\0'; /* a NUL inside ends the name, as it would in C */
  const char *text = (const char *)data + 1 + len;
  const size_t text_len = size - 1 - len;

  ag_spec spec;
  ag_error err = {0};
  ag_status st = ag_spec_load_string(text, text_len, name, &spec, &err);
  require(st == AG_OK || st == AG_ERR_SPEC || st == AG_ERR_UNSUPPORTED || st == AG_ERR_NOMEM);
  require(st == AG_OK ? err.message == NULL : err.message != NULL && err.message[0] != '\0');
  if (st != AG_OK && st != AG_ERR_NOMEM) {
    const char *m = err.message, *nl = strchr(m, '\n');
    require(clean_utf8((const unsigned char *)m,
                       (const unsigned char *)(nl ? nl : m + strlen(m))));
  }
  ag_error_clear(&err);
  if (st != AG_OK) return 0;

  char *source = NULL;
  st = ag_emit(&spec, &source, NULL, &err);
  require(st == AG_OK && source != NULL);
  const char *nl = strchr(source, '\n');
  require(nl != NULL);
  const char *close = strstr(source + 2, "*/");
  require(close == NULL || close > nl); /* the banner's comment goes on */
  require(clean_utf8((const unsigned char *)source, (const unsigned char *)nl));
  free(source);
  ag_error_clear(&err);
  return 0;
}
