// SPDX-License-Identifier: BSD-3-Clause
/* fuzz_cache.c: libFuzzer target over the disk cache's reader
 * (ag_cache_load) with arbitrary entry bytes. The first byte picks what
 * lands at the entry's path: the bytes as they are; a valid entry (written
 * by ag_cache_store) around the rest, which must be a hit returning
 * exactly those bytes; or that valid entry with one byte changed, cut
 * short or extended (at a place the input picks), which must be a miss.
 * A miss is AG_OK with no cubin; nothing may crash, leak or over-read.
 * Built by `make fuzz` (docs/reliability.md). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

static void require(int ok) {
  if (!ok) abort();
}

static char dir[64];

static void remove_dir(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/entry.cubin", dir);
  unlink(path);
  rmdir(dir);
}

static void write_file(const char *path, const uint8_t *p, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  require(fd >= 0);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    require(w > 0);
    p += w;
    n -= (size_t)w;
  }
  close(fd);
}

static uint8_t *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  require(f != NULL);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)len + 1);
  require(buf && fread(buf, 1, (size_t)len, f) == (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3) return 0;
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "/tmp/attngen-fuzz-cache-XXXXXX");
    require(mkdtemp(dir) != NULL);
    atexit(remove_dir);
  }
  uint8_t key[AG_SHA256_BYTES];
  for (int i = 0; i < AG_SHA256_BYTES; i++) key[i] = (uint8_t)(i * 37 + 11);
  char path[128];
  snprintf(path, sizeof path, "%s/entry.cubin", dir);
  const int mode = data[0] % 5;
  const size_t at = (size_t)data[1] << 8 | data[2];
  const uint8_t *payload = data + 3;
  const size_t n = size - 3;
  int want_hit = 0;
  if (mode == 0 || n == 0) {
    write_file(path, data, size);
  } else {
    ag_error err = {0};
    require(ag_cache_store(path, key, payload, n, &err) == AG_OK);
    size_t len;
    uint8_t *entry = read_file(path, &len);
    const size_t pos = at % len;
    switch (mode) {
      case 1: want_hit = 1; break;
      case 2: entry[pos] ^= (uint8_t)(1u << (data[1] & 7)); break; /* one bit */
      case 3: len = pos; break;                                    /* cut short */
      default:                                                     /* extended */
        entry = realloc(entry, len + 1);
        require(entry != NULL);
        entry[len++] = data[2];
    }
    write_file(path, entry, len);
    free(entry);
  }
  void *cubin = NULL;
  size_t got = 0;
  ag_error err = {0};
  require(ag_cache_load(path, key, &cubin, &got, &err) == AG_OK);
  if (want_hit) require(cubin != NULL && got == n && memcmp(cubin, payload, n) == 0);
  else if (mode != 0 && n != 0) require(cubin == NULL && got == 0);
  else require((cubin == NULL) == (got == 0));
  free(cubin);
  ag_error_clear(&err);
  unlink(path);
  return 0;
}
