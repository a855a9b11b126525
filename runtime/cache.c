/* cache.c: the on-disk cubin cache: keys, file names, the entry format and
 * its verification. A bad entry of any kind is a miss, never a crash; writes
 * are atomic renames, so readers and concurrent writers need no lock. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"

/* Larger entries are treated as corrupt rather than read into memory. */
#define MAX_PAYLOAD ((uint64_t)1 << 30)

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* A field: its length as u64 little-endian, then its bytes. */
static void hash_field(ag_sha256 *s, const void *data, size_t len) {
  uint8_t n[8];
  put_u64(n, len);
  ag_sha256_update(s, n, sizeof n);
  ag_sha256_update(s, data, len);
}
static void hash_str(ag_sha256 *s, const char *str) { hash_field(s, str, str ? strlen(str) : 0); }
static void hash_u32(ag_sha256 *s, uint32_t v) {
  uint8_t b[4];
  put_u32(b, v);
  hash_field(s, b, sizeof b);
}

void ag_cache_key(const ag_cache_key_fields *f, uint8_t out_key[AG_SHA256_BYTES]) {
  ag_sha256 s;
  ag_sha256_init(&s);
  hash_str(&s, "attngen cubin cache key");
  hash_str(&s, f->source);
  hash_u32(&s, (uint32_t)f->options->count);
  for (size_t i = 0; i < f->options->count; i++) hash_str(&s, f->options->opt[i]);
  hash_str(&s, f->arch);
  hash_u32(&s, (uint32_t)f->nvrtc_major);
  hash_u32(&s, (uint32_t)f->nvrtc_minor);
  hash_str(&s, f->generator_version);
  hash_u32(&s, f->format_version);
  ag_sha256_final(&s, out_key);
}

bool ag_cache_disabled(void) { return ag_env_flag(AG_ENV_CACHE_DISABLE); }

ag_status ag_cache_dir(char **out_dir, ag_error *err) {
  *out_dir = NULL;
  ag_buf b;
  ag_buf_init(&b);
  const char *dir = ag_env_str(AG_ENV_CACHE_DIR);
  const char *xdg = ag_env_str("XDG_CACHE_HOME");
  const char *home = ag_env_str("HOME");
  if (dir)
    ag_buf_puts(&b, dir);
  else if (xdg && xdg[0] == '/') /* the XDG spec ignores relative paths */
    ag_buf_printf(&b, "%s/attngen", xdg);
  else if (home)
    ag_buf_printf(&b, "%s/.cache/attngen", home);
  else
    return ag_fail(err, AG_ERR_CACHE,
                   "no cache directory: none of %s, XDG_CACHE_HOME and HOME is set",
                   AG_ENV_CACHE_DIR);
  char *path = ag_buf_take(&b);
  if (!path) return ag_fail(err, AG_ERR_NOMEM, "out of memory");
  ag_error why = {0};
  if (ag_mkdir_p(path, 0700, &why) != AG_OK) {
    ag_status st = ag_fail(err, AG_ERR_CACHE, "cache directory unusable: %s", why.message);
    ag_error_clear(&why);
    free(path);
    return st;
  }
  *out_dir = path;
  return AG_OK;
}

ag_status ag_cache_path(const char *dir, const uint8_t key[AG_SHA256_BYTES], const char *arch,
                        int nvrtc_major, int nvrtc_minor, char **out_path, ag_error *err) {
  char hex[2 * AG_SHA256_BYTES + 1];
  ag_sha256_hex(key, hex);
  ag_buf b;
  ag_buf_init(&b);
  ag_buf_printf(&b, "%s/%s-%s-nvrtc%d.%d.cubin", dir, hex, arch, nvrtc_major, nvrtc_minor);
  *out_path = ag_buf_take(&b);
  return *out_path ? AG_OK : ag_fail(err, AG_ERR_NOMEM, "out of memory");
}

/* Read exactly len bytes; false on an error or an early end of file. */
static bool read_all(int fd, void *buf, size_t len) {
  uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= (size_t)n;
  }
  return true;
}

ag_status ag_cache_load(const char *path, const uint8_t key[AG_SHA256_BYTES], void **out_cubin,
                        size_t *out_size, ag_error *err) {
  ag_status st = AG_OK;
  uint8_t *payload = NULL;
  *out_cubin = NULL;
  *out_size = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return AG_OK; /* absent or unreadable: a miss */
  struct stat sb;
  uint8_t h[AG_CACHE_HEADER_BYTES];
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < AG_CACHE_HEADER_BYTES ||
      !read_all(fd, h, sizeof h))
    goto fail;
  /* magic[8] version[4] key[32] size[8] checksum[32] */
  const uint8_t *magic = h, *version = h + 8, *file_key = h + 12, *size = h + 44, *sum = h + 52;
  uint64_t n = get_u64(size);
  if (memcmp(magic, AG_CACHE_MAGIC, 8) != 0 || get_u32(version) != AG_CACHE_FORMAT_VERSION ||
      memcmp(file_key, key, AG_SHA256_BYTES) != 0 || n == 0 || n > MAX_PAYLOAD ||
      n != (uint64_t)sb.st_size - AG_CACHE_HEADER_BYTES)
    goto fail;
  payload = malloc((size_t)n);
  if (!payload) {
    st = ag_fail(err, AG_ERR_NOMEM, "out of memory (%llu-byte cache entry)", (unsigned long long)n);
    goto fail;
  }
  uint8_t digest[AG_SHA256_BYTES];
  if (!read_all(fd, payload, (size_t)n)) goto fail;
  ag_sha256_digest(payload, (size_t)n, digest);
  if (memcmp(digest, sum, AG_SHA256_BYTES) != 0) goto fail;
  close(fd);
  *out_cubin = payload;
  *out_size = (size_t)n;
  return AG_OK;
fail: /* a miss, unless st says otherwise */
  free(payload);
  close(fd);
  return st;
}

ag_status ag_cache_store(const char *path, const uint8_t key[AG_SHA256_BYTES], const void *cubin,
                         size_t size, ag_error *err) {
  uint8_t h[AG_CACHE_HEADER_BYTES];
  memcpy(h, AG_CACHE_MAGIC, 8);
  put_u32(h + 8, AG_CACHE_FORMAT_VERSION);
  memcpy(h + 12, key, AG_SHA256_BYTES);
  put_u64(h + 44, size);
  ag_sha256_digest(cubin, size, h + 52);
  const void *parts[] = {h, cubin};
  size_t lens[] = {sizeof h, size};
  ag_error why = {0};
  if (ag_write_atomic(path, parts, lens, 2, &why) == AG_OK) return AG_OK;
  ag_status st = ag_fail(err, AG_ERR_CACHE, "cannot store the cubin in the cache: %s",
                         why.message ? why.message : ag_strerror(why.code));
  ag_error_clear(&why);
  return st;
}
