// SPDX-License-Identifier: BSD-3-Clause
/* check_cache.c: SHA-256 against the FIPS 180-4 vectors, the cache key, the
 * entry format (every kind of bad file is a miss) and the compile path
 * through the disk cache: hits, replacement, bypass and concurrent writers. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime.h"
#include "util.h"

static const char tiny_source[] =
    "extern \"C\" __global__ void k(float *p) { p[threadIdx.x] = 1.f; }\n";

/* ---- helpers ------------------------------------------------------------ */

static void remove_tree(char *dir) {
  ag_test_remove_tree(dir);
  free(dir);
}

/* A fresh directory used as ATTNGEN_CACHE_DIR, with the other knobs cleared
 * (tests may run unforked, so each one sets everything it relies on). */
static char *fresh_cache(void) {
  char *dir = strdup("/tmp/attngen-cache-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  setenv(AG_ENV_CACHE_DIR, dir, 1);
  unsetenv(AG_ENV_CACHE_DISABLE);
  unsetenv(AG_ENV_DUMP_DIR);
  unsetenv(AG_ENV_NVRTC_VERBOSE);
  return dir;
}

/* Counts entries in dir: files ending ".cubin", and anything else. */
static void count_files(const char *dir, int *out_cubins, int *out_others) {
  *out_cubins = *out_others = 0;
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  for (struct dirent *e; (e = readdir(d));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    size_t n = strlen(e->d_name);
    if (n > 6 && strcmp(e->d_name + n - 6, ".cubin") == 0 && !strstr(e->d_name, ".tmp."))
      ++*out_cubins;
    else
      ++*out_others;
  }
  closedir(d);
}

/* The single cache file in dir (malloc()ed path). */
static char *only_cubin(const char *dir) {
  int cubins, others;
  count_files(dir, &cubins, &others);
  ck_assert_int_eq(cubins, 1);
  ck_assert_int_eq(others, 0);
  DIR *d = opendir(dir);
  char *path = NULL;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.' && asprintf(&path, "%s/%s", dir, e->d_name) < 0) path = NULL;
  closedir(d);
  ck_assert_ptr_nonnull(path);
  return path;
}

static void compile_tiny(ag_cache_origin want, void **out_cubin, size_t *out_size) {
  ag_error err = {0};
  ag_cache_origin origin = (ag_cache_origin)-1;
  ag_status st =
      ag_compile_source(tiny_source, "tiny", "sm_80", out_cubin, out_size, &origin, &err);
  ck_assert_msg(st == AG_OK, "compile: %s", err.message);
  ck_assert_ptr_nonnull(*out_cubin);
  ck_assert_uint_gt(*out_size, 0);
  ck_assert_int_eq(origin, want);
  ag_error_clear(&err);
}

static void read_file(const char *path, uint8_t **out, size_t *out_len) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *out = malloc(n > 0 ? (size_t)n : 1);
  ck_assert_uint_eq(fread(*out, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *out_len = (size_t)n;
}

static void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

/* ---- SHA-256 ------------------------------------------------------------ */

static void check_digest(const void *data, size_t len, const char *want) {
  uint8_t d[AG_SHA256_BYTES];
  char hex[2 * AG_SHA256_BYTES + 1];
  ag_sha256_digest(data, len, d);
  ag_sha256_hex(d, hex);
  ck_assert_str_eq(hex, want);
  /* The same bytes fed in two pieces, split at every point. */
  for (size_t cut = 0; cut <= len; cut++) {
    ag_sha256 s;
    ag_sha256_init(&s);
    ag_sha256_update(&s, data, cut);
    ag_sha256_update(&s, (const uint8_t *)data + cut, len - cut);
    ag_sha256_final(&s, d);
    ag_sha256_hex(d, hex);
    ck_assert_str_eq(hex, want);
  }
}

START_TEST(sha256_vectors) {
  check_digest("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  check_digest("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  check_digest(m448, strlen(m448),
               "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const char *m896 =
      "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmn"
      "opqrsmnopqrstnopqrstu";
  check_digest(m896, strlen(m896),
               "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}
END_TEST

START_TEST(sha256_million_a) {
  static char a[1000000];
  memset(a, 'a', sizeof a);
  const char *want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  uint8_t d[AG_SHA256_BYTES];
  char hex[2 * AG_SHA256_BYTES + 1];
  ag_sha256_digest(a, sizeof a, d);
  ag_sha256_hex(d, hex);
  ck_assert_str_eq(hex, want);
  /* Incrementally, in uneven pieces that straddle block boundaries. */
  ag_sha256 s;
  ag_sha256_init(&s);
  for (size_t done = 0, step = 1; done < sizeof a; done += step, step = step % 97 + 13) {
    if (step > sizeof a - done) step = sizeof a - done;
    ag_sha256_update(&s, a + done, step);
  }
  ag_sha256_final(&s, d);
  ag_sha256_hex(d, hex);
  ck_assert_str_eq(hex, want);
}
END_TEST

/* ---- keys --------------------------------------------------------------- */

static ag_nvrtc_options two_options(const char *a, const char *b) {
  ag_nvrtc_options o;
  memset(&o, 0, sizeof o);
  o.count = 2;
  strcpy(o.opt[0], a);
  strcpy(o.opt[1], b);
  return o;
}

START_TEST(key_covers_every_field) {
  ag_nvrtc_options opts = two_options("--gpu-architecture=sm_80", "-std=c++17");
  ag_nvrtc_options other_opts = two_options("--gpu-architecture=sm_80", "-std=c++20");
  ag_nvrtc_options split1 = two_options("ab", "c"), split2 = two_options("a", "bc");
  ag_nvrtc_options fewer = opts;
  fewer.count = 1;
  ag_cache_key_fields base = {"src", &opts, "sm_80", 13, 0, "0.1.0", 1, NULL};
  ag_cache_key_fields v[] = {base, base, base, base, base, base, base,
                             base, base, base, base, base, base, base};
  v[1].source = "src ";
  v[2].options = &other_opts;
  v[3].options = &fewer;
  v[4].arch = "sm_90a";
  v[5].nvrtc_major = 12;
  v[6].nvrtc_minor = 1;
  v[7].generator_version = "0.1.1";
  v[8].format_version = 2;
  v[9].options = &split1;
  v[10].options = &split2;
  v[11].source = ""; /* moving bytes between fields must not collide */
  v[11].arch = "srcsm_80";
  v[12].source = "srcsm";
  v[12].arch = "_80";
  v[13].nvrtc_lib = "/opt/other/libnvrtc.so.13";
  size_t n = sizeof v / sizeof v[0];
  uint8_t keys[sizeof v / sizeof v[0]][AG_SHA256_BYTES];
  for (size_t i = 0; i < n; i++) ag_cache_key(&v[i], keys[i]);
  uint8_t again[AG_SHA256_BYTES];
  ag_cache_key(&base, again);
  ck_assert_mem_eq(again, keys[0], AG_SHA256_BYTES); /* deterministic */
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      ck_assert_msg(memcmp(keys[i], keys[j], AG_SHA256_BYTES) != 0, "keys %zu and %zu collide", i,
                    j);
}
END_TEST

START_TEST(options_sorted_and_verbose) {
  unsetenv(AG_ENV_NVRTC_VERBOSE);
  ag_nvrtc_options o;
  ck_assert_int_eq(ag_nvrtc_options_make("sm_90a", &o, NULL), AG_OK);
  ck_assert_uint_eq(o.count, 2);
  ck_assert_str_eq(o.opt[0], "--gpu-architecture=sm_90a");
  ck_assert_str_eq(o.opt[1], "-std=c++17");
  setenv(AG_ENV_NVRTC_VERBOSE, "1", 1);
  ck_assert_int_eq(ag_nvrtc_options_make("sm_90a", &o, NULL), AG_OK);
  ck_assert_uint_eq(o.count, 3);
  for (size_t i = 1; i < o.count; i++) ck_assert_int_lt(strcmp(o.opt[i - 1], o.opt[i]), 0);
  ck_assert_str_eq(o.opt[1], "--ptxas-options=-v");
  setenv(AG_ENV_NVRTC_VERBOSE, "0", 1);
  ck_assert_int_eq(ag_nvrtc_options_make("sm_90a", &o, NULL), AG_OK);
  ck_assert_uint_eq(o.count, 2);
  unsetenv(AG_ENV_NVRTC_VERBOSE);
}
END_TEST

START_TEST(file_name_and_directory) {
  uint8_t key[AG_SHA256_BYTES];
  for (int i = 0; i < AG_SHA256_BYTES; i++) key[i] = (uint8_t)(i * 7);
  char *path = NULL;
  ck_assert_int_eq(ag_cache_path("/c", key, "sm_90a", 13, 0, &path, NULL), AG_OK);
  ck_assert_str_eq(path,
                   "/c/00070e151c232a31383f464d545b626970777e858c939aa1a8afb6bdc4cbd2d9-sm_90a-"
                   "nvrtc13.0.cubin");
  free(path);

  /* ATTNGEN_CACHE_DIR, created with parents and mode 0700. */
  char *tmp = fresh_cache();
  char *want = NULL;
  ck_assert_int_ge(asprintf(&want, "%s/a/b", tmp), 0);
  setenv(AG_ENV_CACHE_DIR, want, 1);
  char *dir = NULL;
  ag_error err = {0};
  ck_assert_int_eq(ag_cache_dir(&dir, &err), AG_OK);
  ck_assert_str_eq(dir, want);
  struct stat sb;
  ck_assert_int_eq(stat(dir, &sb), 0);
  ck_assert(S_ISDIR(sb.st_mode));
  ck_assert_int_eq(sb.st_mode & 0777, 0700);
  free(dir);
  free(want);

  /* Else $XDG_CACHE_HOME/attngen (absolute only), else $HOME/.cache/attngen. */
  unsetenv(AG_ENV_CACHE_DIR);
  ck_assert_int_ge(asprintf(&want, "%s/xdg", tmp), 0);
  setenv("XDG_CACHE_HOME", want, 1);
  ck_assert_int_eq(ag_cache_dir(&dir, &err), AG_OK);
  ck_assert_ptr_nonnull(strstr(dir, "/xdg/attngen"));
  free(dir);
  free(want);
  setenv("XDG_CACHE_HOME", "relative", 1);
  setenv("HOME", tmp, 1);
  ck_assert_int_eq(ag_cache_dir(&dir, &err), AG_OK);
  ck_assert_ptr_nonnull(strstr(dir, "/.cache/attngen"));
  free(dir);
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  ck_assert_int_eq(ag_cache_dir(&dir, &err), AG_ERR_CACHE);
  ck_assert_ptr_null(dir);
  ck_assert_ptr_nonnull(strstr(err.message, AG_ENV_CACHE_DIR));
  ag_error_clear(&err);
  remove_tree(tmp);
}
END_TEST

/* ---- the entry format (no NVRTC) --------------------------------------- */

/* Every way an entry can be bad, applied to a valid file of `len` bytes;
 * each must read back as a miss. */
enum {
  PAYLOAD_FLIP,
  MAGIC_FLIP,
  VERSION_BUMP,
  KEY_FLIP,
  SIZE_BUMP,
  SUM_FLIP,
  TRUNC_HALF,
  TRUNC_HEADER,
  TRUNC_SHORT,
  ZERO_LENGTH,
  EXTRA_BYTE,
  DIRECTORY,
  MUTATIONS
};

START_TEST(bad_entries_are_misses) {
  char *dir = fresh_cache();
  uint8_t key[AG_SHA256_BYTES], payload[1000];
  for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(i * 31 + 5);
  ag_sha256_digest("some key", 8, key);
  char *path = NULL;
  ck_assert_int_eq(ag_cache_path(dir, key, "sm_80", 13, 0, &path, NULL), AG_OK);

  /* Absent: a miss. */
  void *got = (void *)1;
  size_t got_size = 1;
  ck_assert_int_eq(ag_cache_load(path, key, &got, &got_size, NULL), AG_OK);
  ck_assert_ptr_null(got);
  ck_assert_uint_eq(got_size, 0);

  /* Stored: a hit with the same bytes, and the header as documented. */
  ck_assert_int_eq(ag_cache_store(path, key, payload, sizeof payload, NULL), AG_OK);
  uint8_t *file;
  size_t file_len;
  read_file(path, &file, &file_len);
  ck_assert_uint_eq(file_len, AG_CACHE_HEADER_BYTES + sizeof payload);
  ck_assert_mem_eq(file, "AGCUBIN1", 8);
  ck_assert_mem_eq(file + 12, key, AG_SHA256_BYTES);
  ck_assert_mem_eq(file + AG_CACHE_HEADER_BYTES, payload, sizeof payload);
  ck_assert_int_eq(ag_cache_load(path, key, &got, &got_size, NULL), AG_OK);
  ck_assert_ptr_nonnull(got);
  ck_assert_uint_eq(got_size, sizeof payload);
  ck_assert_mem_eq(got, payload, sizeof payload);
  free(got);

  for (int m = 0; m < MUTATIONS; m++) {
    uint8_t *bad = malloc(file_len + 1);
    memcpy(bad, file, file_len);
    size_t bad_len = file_len;
    switch (m) {
      case PAYLOAD_FLIP:
        bad[AG_CACHE_HEADER_BYTES + 500] ^= 0x01;
        break;
      case MAGIC_FLIP:
        bad[0] ^= 0x20;
        break;
      case VERSION_BUMP:
        bad[8] += 1;
        break;
      case KEY_FLIP:
        bad[12 + 31] ^= 0x80;
        break;
      case SIZE_BUMP:
        bad[44] += 1;
        break;
      case SUM_FLIP:
        bad[52 + 3] ^= 0x10;
        break;
      case TRUNC_HALF:
        bad_len = AG_CACHE_HEADER_BYTES + sizeof payload / 2;
        break;
      case TRUNC_HEADER:
        bad_len = AG_CACHE_HEADER_BYTES;
        break;
      case TRUNC_SHORT:
        bad_len = 10;
        break;
      case ZERO_LENGTH:
        bad_len = 0;
        break;
      case EXTRA_BYTE:
        bad[bad_len++] = 0;
        break;
      case DIRECTORY:
        break;
    }
    unlink(path);
    if (m == DIRECTORY)
      ck_assert_int_eq(mkdir(path, 0700), 0);
    else
      write_file(path, bad, bad_len);
    got = (void *)1;
    ck_assert_int_eq(ag_cache_load(path, key, &got, &got_size, NULL), AG_OK);
    ck_assert_msg(got == NULL, "mutation %d read as a hit", m);
    if (m == DIRECTORY) rmdir(path);
    free(bad);
  }

  /* A valid entry under another key is a miss for this one. */
  uint8_t other[AG_SHA256_BYTES];
  ag_sha256_digest("other key", 9, other);
  ck_assert_int_eq(ag_cache_store(path, other, payload, sizeof payload, NULL), AG_OK);
  ck_assert_int_eq(ag_cache_load(path, key, &got, &got_size, NULL), AG_OK);
  ck_assert_ptr_null(got);

  /* A store into a missing directory fails cleanly, naming the cache. */
  ag_error err = {0};
  char *nowhere = NULL;
  ck_assert_int_ge(asprintf(&nowhere, "%s/missing/x.cubin", dir), 0);
  ck_assert_int_eq(ag_cache_store(nowhere, key, payload, sizeof payload, &err), AG_ERR_CACHE);
  ck_assert_ptr_nonnull(strstr(err.message, "cache"));
  ag_error_clear(&err);
  free(nowhere);
  free(file);
  free(path);
  remove_tree(dir);
}
END_TEST

/* ---- compiling through the cache (NVRTC) -------------------------------- */

START_TEST(miss_then_hit) {
  char *dir = fresh_cache();
  void *a, *b;
  size_t na, nb;
  compile_tiny(AG_FROM_NVRTC, &a, &na);
  char *path = only_cubin(dir);
  ck_assert_ptr_nonnull(strstr(path, "-sm_80-nvrtc"));
  compile_tiny(AG_FROM_DISK, &b, &nb);
  ck_assert_uint_eq(na, nb);
  ck_assert_mem_eq(a, b, na);
  /* Another arch is another entry. */
  ag_cache_origin origin;
  void *c;
  size_t nc;
  ck_assert_int_eq(ag_compile_source(tiny_source, "tiny", "sm_90a", &c, &nc, &origin, NULL), AG_OK);
  ck_assert_int_eq(origin, AG_FROM_NVRTC);
  int cubins, others;
  count_files(dir, &cubins, &others);
  ck_assert_int_eq(cubins, 2);
  ck_assert_int_eq(others, 0);
  free(a);
  free(b);
  free(c);
  free(path);
  remove_tree(dir);
}
END_TEST

/* A hit loads no NVRTC: the key names the build's toolkit, not the
 * library a compile would load (a fresh process saves its 10-20 ms load).
 * ATTNGEN_LIBNVRTC, when set, keys entries of their own. */
START_TEST(hit_loads_no_nvrtc) {
  char *dir = fresh_cache();
  if (ag_nvrtc_lib_loaded()) { /* only in a process that compiled before (CK_FORK=no) */
    printf("SKIP hit_loads_no_nvrtc: NVRTC was loaded before this test\n");
    remove_tree(dir);
    return;
  }
  uint8_t key[AG_SHA256_BYTES], key2[AG_SHA256_BYTES];
  char *path = NULL, *path2 = NULL;
  ck_assert_int_eq(ag_compile_cache_entry(tiny_source, "sm_90a", dir, key, &path, NULL), AG_OK);
  static const char fake_cubin[] = "not really a cubin";
  ck_assert_int_eq(ag_cache_store(path, key, fake_cubin, sizeof fake_cubin, NULL), AG_OK);
  void *cubin = NULL;
  size_t size = 0;
  ag_cache_origin origin;
  ck_assert_int_eq(ag_compile_source(tiny_source, "tiny", "sm_90a", &cubin, &size, &origin, NULL),
                   AG_OK);
  ck_assert_int_eq(origin, AG_FROM_DISK);
  ck_assert_uint_eq(size, sizeof fake_cubin);
  ck_assert_mem_eq(cubin, fake_cubin, size);
  ck_assert(!ag_nvrtc_lib_loaded());
  setenv(AG_ENV_LIBNVRTC, "/opt/other/libnvrtc.so.13", 1);
  ck_assert_int_eq(ag_compile_cache_entry(tiny_source, "sm_90a", dir, key2, &path2, NULL), AG_OK);
  unsetenv(AG_ENV_LIBNVRTC);
  ck_assert(memcmp(key, key2, sizeof key) != 0);
  ck_assert_str_ne(path, path2);
  free(cubin);
  free(path);
  free(path2);
  remove_tree(dir);
}
END_TEST

/* Damage the single entry, then: a miss, recompiled, file replaced, a hit. */
static void damaged_entry_is_replaced(void (*damage)(const char *path)) {
  char *dir = fresh_cache();
  void *a, *b, *c;
  size_t na, nb, nc;
  compile_tiny(AG_FROM_NVRTC, &a, &na);
  char *path = only_cubin(dir);
  damage(path);
  compile_tiny(AG_FROM_NVRTC, &b, &nb);
  ck_assert_uint_eq(na, nb);
  ck_assert_mem_eq(a, b, na);
  free(path);
  path = only_cubin(dir); /* replaced, no temporary left */
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_size, (off_t)(AG_CACHE_HEADER_BYTES + na));
  compile_tiny(AG_FROM_DISK, &c, &nc);
  ck_assert_mem_eq(a, c, na);
  free(a);
  free(b);
  free(c);
  free(path);
  remove_tree(dir);
}

static void flip_payload_byte(const char *path) {
  uint8_t *data;
  size_t len;
  read_file(path, &data, &len);
  data[AG_CACHE_HEADER_BYTES + (len - AG_CACHE_HEADER_BYTES) / 2] ^= 0xff;
  write_file(path, data, len);
  free(data);
}
static void truncate_half(const char *path) {
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(truncate(path, sb.st_size / 2), 0);
}
static void truncate_zero(const char *path) { ck_assert_int_eq(truncate(path, 0), 0); }
static void wrong_key(const char *path) {
  uint8_t *data;
  size_t len;
  read_file(path, &data, &len);
  uint8_t key[AG_SHA256_BYTES];
  ag_sha256_digest("not this key", 12, key);
  /* A well-formed entry (valid checksum) stored under another key. */
  ck_assert_int_eq(
      ag_cache_store(path, key, data + AG_CACHE_HEADER_BYTES, len - AG_CACHE_HEADER_BYTES, NULL),
      AG_OK);
  free(data);
}

START_TEST(corrupt_payload) { damaged_entry_is_replaced(flip_payload_byte); }
END_TEST
START_TEST(truncated) { damaged_entry_is_replaced(truncate_half); }
END_TEST
START_TEST(zero_length) { damaged_entry_is_replaced(truncate_zero); }
END_TEST
START_TEST(header_with_wrong_key) { damaged_entry_is_replaced(wrong_key); }
END_TEST

START_TEST(disable_skips_disk) {
  char *dir = fresh_cache();
  setenv(AG_ENV_CACHE_DISABLE, "1", 1);
  void *a, *b;
  size_t na, nb;
  compile_tiny(AG_FROM_NVRTC, &a, &na);
  compile_tiny(AG_FROM_NVRTC, &b, &nb);
  int cubins, others;
  count_files(dir, &cubins, &others);
  ck_assert_int_eq(cubins + others, 0);
  free(a);
  free(b);
  /* "0" means enabled. */
  setenv(AG_ENV_CACHE_DISABLE, "0", 1);
  compile_tiny(AG_FROM_NVRTC, &a, &na);
  compile_tiny(AG_FROM_DISK, &b, &nb);
  free(a);
  free(b);
  unsetenv(AG_ENV_CACHE_DISABLE);
  remove_tree(dir);
}
END_TEST

/* A cache directory that cannot exist (its parent is a regular file) or
 * cannot be written (/proc/self, even for root) does not fail the compile;
 * the warning says why. */
START_TEST(unusable_directory_falls_back) {
  char *dir = fresh_cache();
  char *file = NULL, *sub = NULL;
  ck_assert_int_ge(asprintf(&file, "%s/file", dir), 0);
  ck_assert_int_ge(asprintf(&sub, "%s/file/sub", dir), 0);
  write_file(file, "x", 1);
  const char *places[] = {sub, "/proc/self"};
  const char *warnings[] = {"cubin cache not used", "cubin not cached"};
  for (int i = 0; i < 2; i++) {
    setenv(AG_ENV_CACHE_DIR, places[i], 1);
    for (int round = 0; round < 2; round++) { /* and again: still a miss */
      void *cubin = NULL;
      size_t size = 0;
      ag_cache_origin origin = AG_FROM_DISK;
      char *warning = NULL;
      ag_error err = {0};
      ag_status st = ag_compile_source_ex(tiny_source, "tiny", "sm_80", &cubin, &size, &origin,
                                          &warning, &err);
      ck_assert_msg(st == AG_OK, "%s: %s", places[i], err.message);
      ck_assert_uint_gt(size, 4);
      ck_assert_mem_eq(cubin,
                       "\x7f"
                       "ELF",
                       4);
      ck_assert_int_eq(origin, AG_FROM_NVRTC);
      ck_assert_ptr_nonnull(warning);
      ck_assert_msg(strstr(warning, warnings[i]), "warning: %s", warning);
      free(warning);
      free(cubin);
      /* Without the warning out-parameter, just as well. */
      ck_assert_int_eq(ag_compile_source(tiny_source, "tiny", "sm_80", &cubin, &size, NULL, &err),
                       AG_OK);
      free(cubin);
    }
  }
  struct stat sb;
  ck_assert_int_eq(stat(file, &sb), 0);
  ck_assert(S_ISREG(sb.st_mode));
  free(file);
  free(sub);
  remove_tree(dir);
}
END_TEST

/* Two processes compile the same key into one fresh directory at once. */
START_TEST(two_processes_same_key) {
  char *dir = fresh_cache();
  int gate[2];
  ck_assert_int_eq(pipe(gate), 0);
  pid_t pids[2];
  for (int i = 0; i < 2; i++) {
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0) {
      char c;
      close(gate[1]);
      free(dir); /* the parent's; valgrind sees each child exit */
      if (read(gate[0], &c, 1) != 0) _exit(3); /* released when the parent closes */
      void *cubin;
      size_t size;
      ag_status st = ag_compile_source(tiny_source, "tiny", "sm_80", &cubin, &size, NULL, NULL);
      _exit(st == AG_OK && size > 0 ? 0 : 1);
    }
  }
  close(gate[0]);
  close(gate[1]);
  for (int i = 0; i < 2; i++) {
    int status = 0;
    ck_assert_int_eq(waitpid(pids[i], &status, 0), pids[i]);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
  }
  char *path = only_cubin(dir); /* one valid file, no temporaries */
  void *cubin;
  size_t size;
  compile_tiny(AG_FROM_DISK, &cubin, &size);
  free(cubin);
  free(path);
  remove_tree(dir);
}
END_TEST

START_TEST(mkdir_p_and_atomic_write) {
  char *dir = fresh_cache();
  char *deep = NULL, *target = NULL;
  ck_assert_int_ge(asprintf(&deep, "%s/x/y/z/", dir), 0);
  ck_assert_int_eq(ag_mkdir_p(deep, 0700, NULL), AG_OK);
  ck_assert_int_eq(ag_mkdir_p(deep, 0700, NULL), AG_OK); /* existing is fine */
  ck_assert_int_ge(asprintf(&target, "%s/x/y/z/f", dir), 0);
  const void *parts[] = {"hello ", "world"};
  size_t lens[] = {6, 5};
  ck_assert_int_eq(ag_write_atomic(target, parts, lens, 2, NULL), AG_OK);
  uint8_t *data;
  size_t len;
  read_file(target, &data, &len);
  ck_assert_uint_eq(len, 11);
  ck_assert_mem_eq(data, "hello world", 11);
  free(data);
  /* A regular file in the way. */
  ag_error err = {0};
  free(deep);
  ck_assert_int_ge(asprintf(&deep, "%s/x/y/z/f/g", dir), 0);
  ck_assert_int_eq(ag_mkdir_p(deep, 0700, &err), AG_ERR_IO);
  ck_assert_ptr_nonnull(strstr(err.message, "/x/y/z/f"));
  ag_error_clear(&err);
  free(deep);
  free(target);
  remove_tree(dir);
}
END_TEST

Suite *cache_suite(void) {
  Suite *s = suite_create("cache");
  TCase *tc = tcase_create("format");
  tcase_add_test(tc, sha256_vectors);
  tcase_add_test(tc, sha256_million_a);
  tcase_add_test(tc, key_covers_every_field);
  tcase_add_test(tc, options_sorted_and_verbose);
  tcase_add_test(tc, file_name_and_directory);
  tcase_add_test(tc, bad_entries_are_misses);
  tcase_add_test(tc, mkdir_p_and_atomic_write);
  suite_add_tcase(s, tc);
  tc = tcase_create("compile");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, miss_then_hit);
  tcase_add_test(tc, hit_loads_no_nvrtc);
  tcase_add_test(tc, corrupt_payload);
  tcase_add_test(tc, truncated);
  tcase_add_test(tc, zero_length);
  tcase_add_test(tc, header_with_wrong_key);
  tcase_add_test(tc, disable_skips_disk);
  tcase_add_test(tc, unusable_directory_falls_back);
  tcase_add_test(tc, two_processes_same_key);
  suite_add_tcase(s, tc);
  return s;
}
