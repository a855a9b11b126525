/* cache.c: the on-disk cubin cache: keys, file names, the entry format and
 * its verification. A bad entry of any kind is a miss, never a crash; writes
 * are atomic renames, so readers and concurrent writers need no lock. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

/* Larger entries are treated as corrupt rather than read into memory: real
 * cubins are well under 1 MiB, so 64 MiB leaves room and bounds what a
 * damaged or planted header can make a reader allocate. */
#define MAX_PAYLOAD ((uint64_t)AG_CACHE_MAX_ENTRY_BYTES)

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
  /* Another user's directory, or one others can write into, could hold a
   * planted entry with the right key and checksum: refuse it (as ccache and
   * pip do), and the compile runs in memory. */
  struct stat sb;
  ag_status st = AG_OK;
  if (stat(path, &sb) != 0)
    st = ag_fail(err, AG_ERR_CACHE, "cache directory unusable: '%s': %s", path, strerror(errno));
  else if (sb.st_uid != geteuid())
    st = ag_fail(err, AG_ERR_CACHE,
                 "cache directory '%s' is owned by uid %ld, not by this user (uid %ld): not used",
                 path, (long)sb.st_uid, (long)geteuid());
  else if (sb.st_mode & (S_IWGRP | S_IWOTH))
    st = ag_fail(err, AG_ERR_CACHE,
                 "cache directory '%s' is writable by %s (mode %03o): not used", path,
                 sb.st_mode & S_IWOTH ? "others" : "its group", (unsigned)(sb.st_mode & 0777));
  if (st != AG_OK) {
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
  /* O_NONBLOCK: a FIFO planted at the path opens at once (and is then no
   * regular file) instead of blocking; O_NOFOLLOW: a link is a miss. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
  if (fd < 0) return AG_OK; /* absent or unreadable: a miss */
  struct stat sb;
  uint8_t h[AG_CACHE_HEADER_BYTES];
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() ||
      sb.st_size < AG_CACHE_HEADER_BYTES || (uint64_t)sb.st_size > MAX_PAYLOAD + AG_CACHE_HEADER_BYTES ||
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
  if (!payload) goto fail; /* a miss: the compile may still fit in memory */
  uint8_t digest[AG_SHA256_BYTES];
  if (!read_all(fd, payload, (size_t)n)) goto fail;
  ag_sha256_digest(payload, (size_t)n, digest);
  if (memcmp(digest, sum, AG_SHA256_BYTES) != 0) goto fail;
  /* A hit: its modification time is the last use, for the LRU bound. */
  (void)futimens(fd, NULL);
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

uint64_t ag_cache_max_bytes(void) {
  const char *v = ag_env_str(AG_ENV_CACHE_MAX_BYTES);
  if (!v) return AG_CACHE_DEFAULT_MAX_BYTES;
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno || end == v || *end || v[0] == '-') return AG_CACHE_DEFAULT_MAX_BYTES;
  return (uint64_t)n;
}

typedef struct entry_info {
  char *name;
  uint64_t size;
  struct timespec used;
} entry_info;

static int older_first(const void *a, const void *b) {
  const entry_info *x = a, *y = b;
  if (x->used.tv_sec != y->used.tv_sec) return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
  if (x->used.tv_nsec != y->used.tv_nsec) return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
  return strcmp(x->name, y->name);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

void ag_cache_tidy(const char *dir, const char *keep) {
  DIR *d = opendir(dir);
  if (!d) return;
  int dfd = dirfd(d);
  const char *keep_name = keep ? strrchr(keep, '/') : NULL;
  keep_name = keep_name ? keep_name + 1 : keep;
  uint64_t limit = ag_cache_max_bytes(), total = 0;
  time_t now = time(NULL);
  entry_info *entries = NULL;
  size_t count = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    struct stat sb;
    if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
    if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_uid != geteuid())
      continue; /* only our own regular files are ever removed */
    if (strstr(e->d_name, ".tmp.")) {
      /* A writer killed between create and rename; a live one finishes in
       * seconds, so a temporary untouched this long is dead. */
      if (now - sb.st_mtime > AG_CACHE_STALE_TMP_SECONDS) (void)unlinkat(dfd, e->d_name, 0);
      continue;
    }
    if (!ends_with(e->d_name, ".cubin")) continue;
    total += (uint64_t)sb.st_size;
    if (limit == 0 || (keep_name && strcmp(e->d_name, keep_name) == 0)) continue;
    if (count == cap) {
      size_t ncap = cap ? 2 * cap : 64;
      entry_info *grown = realloc(entries, ncap * sizeof *grown);
      if (!grown) break;
      entries = grown;
      cap = ncap;
    }
    char *name = strdup(e->d_name);
    if (!name) break;
    entries[count++] = (entry_info){name, (uint64_t)sb.st_size, sb.st_mtim};
  }
  /* Least recently used first (a hit refreshes the entry's mtime), until the
   * whole directory fits; the entry just written is never evicted. */
  if (limit != 0 && total > limit) {
    qsort(entries, count, sizeof *entries, older_first);
    for (size_t i = 0; i < count && total > limit; i++)
      if (unlinkat(dfd, entries[i].name, 0) == 0) total -= entries[i].size;
  }
  for (size_t i = 0; i < count; i++) free(entries[i].name);
  free(entries);
  closedir(d);
}
