// SPDX-License-Identifier: BSD-3-Clause
/* check_reliability.c: regressions for issue 22 (reliability, second
 * round), CPU side: output targets that are not plain files, file modes and
 * long names, the cache against FIFOs, huge or foreign entries and stale
 * temporaries, numbers fp32 cannot hold, source names, C API misuse and the
 * command line's own output. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attngen.h"
#include "runtime.h"
#include "util.h"

/* ---- helpers ------------------------------------------------------------ */

/* The CLI binary's absolute path (ATTNGEN_BIN, else ../build/attngen). */
static const char *cli(void) {
  static char bin[PATH_MAX];
  const char *rel = getenv("ATTNGEN_BIN");
  ck_assert_ptr_nonnull(realpath(rel ? rel : "../build/attngen", bin));
  return bin;
}

/* The repository root's absolute path (tests run from tests/). */
static const char *root(void) {
  static char dir[PATH_MAX];
  ck_assert_ptr_nonnull(realpath("..", dir));
  return dir;
}

/* Run a shell command line; its exit status (-1 when killed). */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  ck_assert_int_lt(n, (int)sizeof cmd);
  int status = system(cmd);
  return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define SPEC "specs/ads_block64_d64_fp16.yaml"

/* ---- row 1: output targets that are not regular files -------------------- */

START_TEST(output_fifo_written_through) {
  char *dir = ag_test_mkdtemp("ag-rel-out");
  char fifo[PATH_MAX], got[PATH_MAX];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  snprintf(got, sizeof got, "%s/got", dir);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  /* A reader on the FIFO in the background; emit writes into it. */
  int rc = sh("cd %s && (cat %s >%s &) && timeout 20 %s emit " SPEC " -o %s; s=$?; sleep 0.2; "
              "exit $s",
              root(), fifo, got, cli(), fifo);
  ck_assert_int_eq(rc, 0);
  struct stat sb;
  ck_assert_int_eq(lstat(fifo, &sb), 0);
  ck_assert_msg(S_ISFIFO(sb.st_mode), "the FIFO was replaced");
  for (int i = 0; i < 50 && (stat(got, &sb) != 0 || sb.st_size == 0); i++) usleep(100000);
  char *text = ag_test_slurp(got, NULL);
  ck_assert_ptr_nonnull(text);
  ck_assert_ptr_nonnull(strstr(text, "__global__"));
  free(text);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

START_TEST(output_device_and_symlink_kept) {
  char *dir = ag_test_mkdtemp("ag-rel-out");
  char node[PATH_MAX], link[PATH_MAX], file[PATH_MAX], flink[PATH_MAX], dangling[PATH_MAX];
  snprintf(node, sizeof node, "%s/null", dir);
  snprintf(link, sizeof link, "%s/link", dir);
  snprintf(file, sizeof file, "%s/file", dir);
  snprintf(flink, sizeof flink, "%s/flink", dir);
  snprintf(dangling, sizeof dangling, "%s/dangling", dir);
  struct stat sb;
  /* A device node of our own where allowed (root), else /dev/null itself
   * through a link only. */
  bool have_node = mknod(node, S_IFCHR | 0666, makedev(1, 3)) == 0;
  if (have_node) {
    ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s", root(), cli(), node), 0);
    ck_assert_int_eq(lstat(node, &sb), 0);
    ck_assert_msg(S_ISCHR(sb.st_mode), "the device node was replaced");
  }
  ck_assert_int_eq(symlink("/dev/null", link), 0);
  ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s", root(), cli(), link), 0);
  ck_assert_int_eq(lstat(link, &sb), 0);
  ck_assert_msg(S_ISLNK(sb.st_mode), "the symbolic link was replaced");
  ck_assert_int_eq(stat("/dev/null", &sb), 0);
  ck_assert(S_ISCHR(sb.st_mode));
  /* A link to a regular file: the file gets the text, the link stays. */
  ag_test_spit(file, "old\n", 4);
  ck_assert_int_eq(symlink(file, flink), 0);
  ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s", root(), cli(), flink), 0);
  ck_assert_int_eq(lstat(flink, &sb), 0);
  ck_assert(S_ISLNK(sb.st_mode));
  char *text = ag_test_slurp(file, NULL);
  ck_assert_ptr_nonnull(strstr(text, "__global__"));
  free(text);
  /* A dangling link and a directory are refused, with a message. */
  ck_assert_int_eq(symlink("/nonexistent/x", dangling), 0);
  ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s 2>%s/err", root(), cli(), dangling, dir), 1);
  ck_assert_int_eq(lstat(dangling, &sb), 0);
  ck_assert(S_ISLNK(sb.st_mode));
  char errpath[PATH_MAX];
  snprintf(errpath, sizeof errpath, "%s/err", dir);
  text = ag_test_slurp(errpath, NULL);
  ck_assert_msg(strstr(text, "symbolic link to a missing file"), "got: %s", text);
  free(text);
  ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s 2>/dev/null", root(), cli(), dir), 1);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

/* ---- row 7: modes and long names ----------------------------------------- */

START_TEST(output_mode_umask_and_existing) {
  char *dir = ag_test_mkdtemp("ag-rel-mode");
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/out.cu", dir);
  struct stat sb;
  ck_assert_int_eq(sh("cd %s && umask 022 && %s emit " SPEC " -o %s", root(), cli(), path), 0);
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0644);
  unlink(path);
  ck_assert_int_eq(sh("cd %s && umask 077 && %s emit " SPEC " -o %s", root(), cli(), path), 0);
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0600);
  /* An existing file keeps its mode (and, as root, its owner). */
  ck_assert_int_eq(chmod(path, 0640), 0);
  bool root_user = geteuid() == 0;
  if (root_user) ck_assert_int_eq(chown(path, 65534, 65534), 0);
  ck_assert_int_eq(sh("cd %s && umask 077 && %s emit " SPEC " -o %s", root(), cli(), path), 0);
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0640);
  if (root_user) {
    ck_assert_int_eq(sb.st_uid, 65534);
    ck_assert_int_eq(sb.st_gid, 65534);
  }
  ck_assert_int_gt(sb.st_size, 100);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

START_TEST(output_long_basename) {
  char *dir = ag_test_mkdtemp("ag-rel-long");
  for (int n = 245; n <= 255; n += 5) {
    char path[PATH_MAX];
    int k = snprintf(path, sizeof path, "%s/", dir);
    memset(path + k, 'x', (size_t)n - 3);
    strcpy(path + k + n - 3, ".cu");
    ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s", root(), cli(), path), 0);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_gt(sb.st_size, 100);
    /* Through the runtime's writer too. */
    const void *parts[] = {"abc"};
    size_t lens[] = {3};
    ck_assert_int_eq(ag_write_atomic(path, parts, lens, 1, NULL), AG_OK);
  }
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST


/* ---- rows 2, 3, 5, 9, 10: the cache ------------------------------------- */

static const char tiny_source[] =
    "extern \"C\" __global__ void k(float *p) { p[threadIdx.x] = 2.f; }\n";

/* A fresh private directory as ATTNGEN_CACHE_DIR, other knobs cleared. */
static char *fresh_cache(void) {
  char *dir = ag_test_mkdtemp("ag-rel-cache");
  setenv(AG_ENV_CACHE_DIR, dir, 1);
  unsetenv(AG_ENV_CACHE_DISABLE);
  unsetenv(AG_ENV_DUMP_DIR);
  unsetenv(AG_ENV_NVRTC_VERBOSE);
  unsetenv(AG_ENV_CACHE_MAX_BYTES);
  return dir;
}

/* Compile tiny_source through the cache; the origin, warning in *out_warning
 * (freed by the caller) when non-NULL. */
static ag_cache_origin compile_tiny(char **out_warning) {
  void *cubin = NULL;
  size_t size = 0;
  ag_cache_origin origin = AG_FROM_DISK;
  char *warning = NULL;
  ag_error err = {0};
  ag_status st =
      ag_compile_source_ex(tiny_source, "tiny", "sm_80", &cubin, &size, &origin, &warning, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message);
  ck_assert_uint_gt(size, 4);
  ck_assert_mem_eq(cubin, "\x7f" "ELF", 4);
  free(cubin);
  if (out_warning)
    *out_warning = warning;
  else
    free(warning);
  return origin;
}

/* The path of the one .cubin entry in dir (from malloc()). */
static char *the_entry(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  char *found = NULL;
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n > 6 && strcmp(e->d_name + n - 6, ".cubin") == 0 && !strstr(e->d_name, ".tmp.")) {
      ck_assert_ptr_null(found);
      ck_assert_int_ge(asprintf(&found, "%s/%s", dir, e->d_name), 0);
    }
  }
  closedir(d);
  ck_assert_ptr_nonnull(found);
  return found;
}

START_TEST(cache_fifo_entry_is_miss) {
  char *dir = fresh_cache();
  ck_assert_int_eq(compile_tiny(NULL), AG_FROM_NVRTC);
  char *entry = the_entry(dir);
  ck_assert_int_eq(unlink(entry), 0);
  ck_assert_int_eq(mkfifo(entry, 0600), 0);
  /* Before the fix this blocked in open() for ever (the test's timeout). */
  ck_assert_int_eq(compile_tiny(NULL), AG_FROM_NVRTC);
  struct stat sb;
  ck_assert_int_eq(lstat(entry, &sb), 0);
  ck_assert_msg(S_ISREG(sb.st_mode), "the FIFO was not replaced by an entry");
  ck_assert_int_eq(compile_tiny(NULL), AG_FROM_DISK);
  /* A symbolic link at the entry's path is a miss too. */
  char other[PATH_MAX];
  snprintf(other, sizeof other, "%s/elsewhere", dir);
  ck_assert_int_eq(rename(entry, other), 0);
  ck_assert_int_eq(symlink(other, entry), 0);
  ck_assert_int_eq(compile_tiny(NULL), AG_FROM_NVRTC);
  ck_assert_int_eq(lstat(entry, &sb), 0);
  ck_assert(S_ISREG(sb.st_mode));
  free(entry);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

/* An entry header claiming `claim` payload bytes, as a sparse file of that
 * size, for key; then load it and expect a quick miss. */
static void huge_entry_is_quick_miss(const char *dir, uint64_t claim) {
  uint8_t key[AG_SHA256_BYTES];
  memset(key, 0x5a, sizeof key);
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/huge.cubin", dir);
  uint8_t h[AG_CACHE_HEADER_BYTES] = {0};
  memcpy(h, AG_CACHE_MAGIC, 8);
  h[8] = AG_CACHE_FORMAT_VERSION;
  memcpy(h + 12, key, sizeof key);
  for (int i = 0; i < 8; i++) h[44 + i] = (uint8_t)(claim >> (8 * i));
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, h, sizeof h), (ssize_t)sizeof h);
  uint64_t real = claim > ((uint64_t)1 << 31) ? 4096 : claim; /* sparse, or short */
  ck_assert_int_eq(ftruncate(fd, (off_t)(sizeof h + real)), 0);
  close(fd);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  void *cubin = (void *)1;
  size_t size = 1;
  ag_error err = {0};
  ck_assert_int_eq(ag_cache_load(path, key, &cubin, &size, &err), AG_OK);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ck_assert_ptr_null(cubin);
  ck_assert_ptr_null(err.message);
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  ck_assert_msg(s < 0.5, "a %llu-byte claim took %.2f s to refuse", (unsigned long long)claim, s);
  unlink(path);
}

START_TEST(cache_huge_entry_is_miss) {
  char *dir = fresh_cache();
  huge_entry_is_quick_miss(dir, (uint64_t)1 << 30);
  huge_entry_is_quick_miss(dir, (uint64_t)AG_CACHE_MAX_ENTRY_BYTES + 1);
  huge_entry_is_quick_miss(dir, UINT64_MAX - AG_CACHE_HEADER_BYTES);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

START_TEST(cache_unsafe_directory_refused) {
  char *dir = fresh_cache();
  ck_assert_int_eq(chmod(dir, 0777), 0);
  for (int round = 0; round < 2; round++) {
    char *warning = NULL;
    ck_assert_int_eq(compile_tiny(&warning), AG_FROM_NVRTC);
    ck_assert_ptr_nonnull(warning);
    ck_assert_msg(strstr(warning, "writable by others"), "warning: %s", warning);
    free(warning);
  }
  ck_assert_int_eq(chmod(dir, 0770), 0);
  char *warning = NULL;
  ck_assert_int_eq(compile_tiny(&warning), AG_FROM_NVRTC);
  ck_assert_msg(warning && strstr(warning, "writable by its group"), "warning: %s", warning);
  free(warning);
  /* Nothing was written into the unsafe directory. */
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(chmod(dir, 0700), 0);
  ck_assert_int_eq(compile_tiny(NULL), AG_FROM_NVRTC);
  ck_assert_int_eq(compile_tiny(NULL), AG_FROM_DISK);
  if (geteuid() == 0) {
    /* Root can stage what another user would: a directory and an entry of
     * theirs. */
    char *entry = the_entry(dir);
    ck_assert_int_eq(chown(entry, 65534, 65534), 0);
    ck_assert_int_eq(compile_tiny(NULL), AG_FROM_NVRTC); /* foreign entry: a miss */
    struct stat sb;
    ck_assert_int_eq(stat(entry, &sb), 0);
    ck_assert_int_eq(sb.st_uid, 0); /* rewritten as ours */
    ck_assert_int_eq(compile_tiny(NULL), AG_FROM_DISK);
    ck_assert_int_eq(chown(dir, 65534, 65534), 0);
    warning = NULL;
    ck_assert_int_eq(compile_tiny(&warning), AG_FROM_NVRTC);
    ck_assert_msg(warning && strstr(warning, "owned by uid 65534"), "warning: %s", warning);
    free(warning);
    free(entry);
  }
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

static void make_file(const char *dir, const char *name, size_t size, time_t age) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
  struct timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= age;
  t[1] = t[0];
  ck_assert_int_eq(futimens(fd, t), 0);
  close(fd);
}

static bool exists_in(const char *dir, const char *name) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, F_OK) == 0;
}

START_TEST(cache_tidy_stale_temps_and_lru) {
  char *dir = fresh_cache();
  make_file(dir, "a.cubin.tmp.old00000", 1000, 3600);
  make_file(dir, "b.cubin.tmp.new00000", 1000, 10);
  make_file(dir, "e1.cubin", 1000, 400);
  make_file(dir, "e2.cubin", 1000, 300);
  make_file(dir, "e3.cubin", 1000, 200);
  make_file(dir, "e4.cubin", 1000, 100);
  make_file(dir, "other", 100000, 1000); /* not an entry: never counted or removed */
  ag_cache_tidy(dir, NULL); /* default bound: only the stale temporary goes */
  ck_assert(!exists_in(dir, "a.cubin.tmp.old00000"));
  ck_assert(exists_in(dir, "b.cubin.tmp.new00000"));
  ck_assert(exists_in(dir, "e1.cubin"));
  setenv(AG_ENV_CACHE_MAX_BYTES, "2500", 1);
  ck_assert_uint_eq(ag_cache_max_bytes(), 2500);
  char keep[PATH_MAX];
  snprintf(keep, sizeof keep, "%s/e1.cubin", dir);
  ag_cache_tidy(dir, keep); /* e1 is the newest write: e2 and e3 go */
  ck_assert(exists_in(dir, "e1.cubin"));
  ck_assert(!exists_in(dir, "e2.cubin"));
  ck_assert(!exists_in(dir, "e3.cubin"));
  ck_assert(exists_in(dir, "e4.cubin"));
  ck_assert(exists_in(dir, "other"));
  setenv(AG_ENV_CACHE_MAX_BYTES, "0", 1);
  ck_assert_uint_eq(ag_cache_max_bytes(), 0);
  setenv(AG_ENV_CACHE_MAX_BYTES, "lots", 1);
  ck_assert_uint_eq(ag_cache_max_bytes(), AG_CACHE_DEFAULT_MAX_BYTES);
  /* Through a compile: the store runs the tidy, a hit refreshes the mtime. */
  setenv(AG_ENV_CACHE_MAX_BYTES, "1", 1);
  make_file(dir, "c.cubin.tmp.old00000", 1000, 3600);
  ck_assert_int_eq(compile_tiny(NULL), AG_FROM_NVRTC);
  ck_assert(!exists_in(dir, "c.cubin.tmp.old00000"));
  ck_assert(!exists_in(dir, "e1.cubin"));
  ck_assert(!exists_in(dir, "e4.cubin"));
  char *entry = the_entry(dir); /* the new one, kept although over the bound */
  struct stat before, after;
  ck_assert_int_eq(stat(entry, &before), 0);
  usleep(20000);
  unsetenv(AG_ENV_CACHE_MAX_BYTES);
  ck_assert_int_eq(compile_tiny(NULL), AG_FROM_DISK);
  ck_assert_int_eq(stat(entry, &after), 0);
  ck_assert_msg(after.st_mtim.tv_sec > before.st_mtim.tv_sec ||
                    after.st_mtim.tv_nsec > before.st_mtim.tv_nsec,
                "a hit did not refresh the entry's last use");
  free(entry);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

START_TEST(dump_dir_unusable_is_warning) {
  char *dir = fresh_cache();
  setenv(AG_ENV_CACHE_DISABLE, "1", 1);
  char file[PATH_MAX];
  snprintf(file, sizeof file, "%s/file", dir);
  ag_test_spit(file, "x", 1);
  char sub[PATH_MAX + 8];
  snprintf(sub, sizeof sub, "%s/sub", file);
  const char *places[] = {file, sub};
  for (int i = 0; i < 2; i++) {
    setenv(AG_ENV_DUMP_DIR, places[i], 1);
    char *warning = NULL;
    ck_assert_int_eq(compile_tiny(&warning), AG_FROM_NVRTC);
    ck_assert_msg(warning && strstr(warning, AG_ENV_DUMP_DIR), "warning: %s", warning);
    free(warning);
  }
  unsetenv(AG_ENV_DUMP_DIR);
  unsetenv(AG_ENV_CACHE_DISABLE);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

/* ---- row 4: numbers fp32 cannot hold ------------------------------------ */

/* Load `text` as "x.yaml"; the status, message in *out_msg (freed by caller). */
static ag_status load(const char *text, const char *source, char **out_msg) {
  ag_spec spec;
  ag_error err = {0};
  ag_status st = ag_spec_load_string(text, strlen(text), source, &spec, &err);
  *out_msg = err.message;
  return st;
}

START_TEST(fp32_out_of_range_refused_at_check) {
  const char *scales[] = {"2.4e38", "1e-46", "1e300", "1e-39", "3.5e38"};
  for (size_t i = 0; i < sizeof scales / sizeof *scales; i++) {
    char text[512];
    snprintf(text, sizeof text,
             "name: t\npattern: block_diagonal\nblock_size: 64\nhead_dim: 64\ndtype: fp16\n"
             "softmax_scale: %s\n", scales[i]);
    char *msg;
    ck_assert_int_eq(load(text, "x.yaml", &msg), AG_ERR_SPEC);
    ck_assert_msg(strstr(msg, "x.yaml:6:16: error: softmax_scale is out of range"), "%s", msg);
    free(msg);
  }
  const char *bases[] = {"1e39", "1e-46"};
  for (size_t i = 0; i < 2; i++) {
    char text[512];
    snprintf(text, sizeof text,
             "name: t\npattern: block_diagonal\nblock_size: 64\nhead_dim: 64\ndtype: fp16\n"
             "rotary:\n  layout: half\n  apply_to: [q, k]\n  positions: sequence\n  base: %s\n",
             bases[i]);
    char *msg;
    ck_assert_int_eq(load(text, "x.yaml", &msg), AG_ERR_SPEC);
    ck_assert_msg(strstr(msg, "x.yaml:10:9: error: rotary.base is out of range"), "%s", msg);
    free(msg);
  }
  /* The largest and smallest accepted scales still emit. */
  const char *fine[] = {"2.3e38", "1.2e-38"};
  for (size_t i = 0; i < 2; i++) {
    char text[512];
    snprintf(text, sizeof text,
             "name: t\npattern: block_diagonal\nblock_size: 64\nhead_dim: 64\ndtype: fp16\n"
             "softmax_scale: %s\n", fine[i]);
    char *msg;
    ck_assert_int_eq(load(text, "x.yaml", &msg), AG_OK);
    ck_assert_ptr_null(msg);
  }
}
END_TEST

/* ---- row 8: the source name ---------------------------------------------- */

static const char ok_spec[] =
    "name: t\npattern: block_diagonal\nblock_size: 64\nhead_dim: 64\ndtype: fp16\n";

static char *emit_named(const char *source) {
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_string(ok_spec, strlen(ok_spec), source, &spec, &err), AG_OK);
  char *src = NULL;
  ck_assert_int_eq(ag_emit(&spec, &src, NULL, &err), AG_OK);
  return src;
}

static void key_of(const char *src, uint8_t key[AG_SHA256_BYTES]) {
  char *path = NULL;
  ck_assert_int_eq(ag_compile_cache_entry(src, "sm_90a", "/c", key, &path, NULL), AG_OK);
  free(path);
}

START_TEST(source_name_cannot_inject) {
  char *evil = emit_named("x */ __device__ int injected = 42; /* y\n#error z");
  char *plain = emit_named("x.yaml");
  const char *eol = strchr(evil, '\n');
  ck_assert_ptr_nonnull(eol);
  /* The banner's first line is comment text only, and the comment goes on. */
  ck_assert_ptr_null(memmem(evil + 2, (size_t)(eol - evil) - 2, "*/", 2));
  ck_assert_msg(strncmp(evil, "/* Generated by attngen ", 24) == 0, "%.80s", evil);
  ck_assert_ptr_nonnull(strstr(evil, "from x______device___int_injected___42_____y__error_z; do not edit.\n"));
  ck_assert_str_eq(strchr(evil, '\n'), strchr(plain, '\n')); /* only the first line differs */
  ck_assert_ptr_nonnull(strstr(plain, "from x.yaml; do not edit.\n"));
  /* One spec under two names: one cache key. */
  uint8_t k1[AG_SHA256_BYTES], k2[AG_SHA256_BYTES];
  key_of(evil, k1);
  key_of(plain, k2);
  ck_assert_mem_eq(k1, k2, sizeof k1);
  /* A source whose first line closes the comment keeps its whole text in the key. */
  const char *a = "/* Generated by attngen */ int a;\nint b;\n";
  const char *b = "/* Generated by attngen */ int c;\nint b;\n";
  key_of(a, k1);
  key_of(b, k2);
  ck_assert(memcmp(k1, k2, sizeof k1) != 0);
  free(evil);
  free(plain);
}
END_TEST

/* ---- row 11: C API misuse ------------------------------------------------ */

START_TEST(api_misuse_is_invalid_argument) {
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_string(ok_spec, strlen(ok_spec), "x.yaml", &spec, &err), AG_OK);
  char *src = (char *)1;
  ck_assert_int_eq(ag_emit(NULL, &src, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(src);
  ag_error_clear(&err);
  ck_assert_int_eq(ag_emit(&spec, NULL, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ag_error_clear(&err);
  ck_assert_int_eq(ag_compile(&spec, "sm_90a", NULL, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ag_error_clear(&err);
  ck_assert(ag_spec_scale(NULL) == 0.0);
  for (int i = 0; i < 7; i++) {
    ag_spec bad = spec;
    switch (i) {
      case 0: bad.dtype = (ag_dtype)1000; break;
      case 1: bad.arch = (ag_arch)1000; break;
      case 2: bad.pattern = (ag_pattern)1000; break;
      case 3: strcpy(bad.name, "t\n__global__ void x() {}"); break;
      case 4: bad.rotary.layout = (ag_rotary_layout)-1; break;
      case 5: memset(bad.name, 'a', sizeof bad.name); break;
      case 6: bad.head_dim = -64; break;
    }
    src = NULL;
    ck_assert_msg(ag_emit(&bad, &src, NULL, &err) == AG_ERR_INVALID_ARGUMENT, "case %d", i);
    ck_assert_ptr_null(src);
    ck_assert_ptr_nonnull(err.message);
    ag_error_clear(&err);
    void *cubin = NULL;
    size_t size = 0;
    ck_assert_int_eq(ag_compile(&bad, "sm_90a", &cubin, &size, &err), AG_ERR_INVALID_ARGUMENT);
    ag_error_clear(&err);
  }
}
END_TEST

/* ---- row 12: shared memory the arch does not have ------------------------ */

START_TEST(sm80_shared_memory_refused_at_arch) {
  const char *text =
      "name: t\npattern: block_diagonal\nblock_size: 256\nhead_dim: 128\ndtype: bf16\n"
      "arch: sm_80\n";
  char *msg;
  ck_assert_int_eq(load(text, "a.yaml", &msg), AG_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(msg, "a.yaml:6:1: error: not supported yet: kernel") &&
                    strstr(msg, "196608 bytes of shared memory") && strstr(msg, "sm_80's 166912"),
                "%s", msg);
  free(msg);
  /* The same on sm_90a, or a block that fits on sm_80, loads. */
  const char *fits[] = {
      "name: t\npattern: block_diagonal\nblock_size: 256\nhead_dim: 128\ndtype: bf16\n"
      "arch: sm_90a\n",
      "name: t\npattern: block_diagonal\nblock_size: 64\nhead_dim: 128\ndtype: bf16\n"
      "arch: sm_80\n"};
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(load(fits[i], "a.yaml", &msg), AG_OK);
    ck_assert_ptr_null(msg);
  }
}
END_TEST

/* ---- the last paragraph: the command line's own output and input -------- */

START_TEST(cli_stdout_write_errors_fail) {
  const char *args[] = {"--help", "--version", "check " SPEC};
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(sh("cd %s && %s %s >/dev/full 2>/dev/null", root(), cli(), args[i]) == 1,
                  "%s to /dev/full exited 0", args[i]);
    ck_assert_int_eq(sh("cd %s && %s %s >/dev/null", root(), cli(), args[i]), 0);
  }
}
END_TEST

START_TEST(cli_check_reads_stdin) {
  ck_assert_int_eq(sh("cd %s && %s check - <" SPEC " | grep -qx '<stdin>: ok'", root(), cli()), 0);
  ck_assert_int_eq(
      sh("cd %s && printf 'name: [\\n' | %s check - 2>&1 | grep -q '^<stdin>:2:1: error'", root(),
         cli()),
      0);
  ck_assert_int_eq(sh("cd %s && %s check - </dev/null 2>/dev/null", root(), cli()), 1);
}
END_TEST

Suite *reliability_suite(void) {
  Suite *s = suite_create("reliability");
  TCase *tc = tcase_create("output");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, output_fifo_written_through);
  tcase_add_test(tc, output_device_and_symlink_kept);
  tcase_add_test(tc, output_mode_umask_and_existing);
  tcase_add_test(tc, output_long_basename);
  tcase_add_test(tc, cli_stdout_write_errors_fail);
  tcase_add_test(tc, cli_check_reads_stdin);
  suite_add_tcase(s, tc);
  tc = tcase_create("cache");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, cache_fifo_entry_is_miss);
  tcase_add_test(tc, cache_huge_entry_is_miss);
  tcase_add_test(tc, cache_unsafe_directory_refused);
  tcase_add_test(tc, cache_tidy_stale_temps_and_lru);
  tcase_add_test(tc, dump_dir_unusable_is_warning);
  suite_add_tcase(s, tc);
  tc = tcase_create("spec");
  tcase_add_test(tc, fp32_out_of_range_refused_at_check);
  tcase_add_test(tc, source_name_cannot_inject);
  tcase_add_test(tc, api_misuse_is_invalid_argument);
  tcase_add_test(tc, sm80_shared_memory_refused_at_arch);
  suite_add_tcase(s, tc);
  return s;
}
