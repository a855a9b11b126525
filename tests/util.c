// SPDX-License-Identifier: BSD-3-Clause
/* util.c: see util.h. */
#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "util.h"

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

void ag_test_remove_tree(const char *dir) {
  if (dir) nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

char *ag_test_mkdtemp(const char *prefix) {
  char *dir = malloc(strlen(prefix) + 16);
  ck_assert_ptr_nonnull(dir);
  sprintf(dir, "/tmp/%s-XXXXXX", prefix);
  ck_assert_ptr_nonnull(mkdtemp(dir));
  return dir;
}

char *ag_test_slurp(const char *path, size_t *out_len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, len = 0, n;
  char *s = malloc(cap);
  while (s && (n = fread(s + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (len + 1 == cap) {
      char *t = realloc(s, cap *= 2);
      if (!t) free(s);
      s = t;
    }
  }
  fclose(f);
  if (s) s[len] = '\0';
  if (out_len) *out_len = len;
  return s;
}

void ag_test_spit(const char *path, const char *text, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot write %s", path);
  ck_assert_uint_eq(fwrite(text, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

int ag_test_count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

int ag_test_ptxas_report(const char *log, const char *kernel, int *out_regs, int *out_stores,
                         int *out_loads) {
  char entry[AG_KERNEL_NAME_MAX + 32];
  snprintf(entry, sizeof entry, "entry function '%s'", kernel);
  const char *at = strstr(log, entry);
  if (!at) return 0;
  const char *spill = strstr(at, "bytes stack frame, ");
  const char *regs = strstr(at, "Used ");
  return spill && regs &&
         sscanf(spill, "bytes stack frame, %d bytes spill stores, %d bytes spill loads",
                out_stores, out_loads) == 2 &&
         sscanf(regs, "Used %d registers", out_regs) == 1;
}

char *ag_test_dump_begin(const char *label) {
  char *dir = ag_test_mkdtemp(label);
  setenv(AG_ENV_NVRTC_VERBOSE, "1", 1);
  setenv(AG_ENV_DUMP_DIR, dir, 1);
  return dir;
}

void ag_test_dump_end(char *dir) {
  unsetenv(AG_ENV_NVRTC_VERBOSE);
  unsetenv(AG_ENV_DUMP_DIR);
  ag_test_remove_tree(dir);
  free(dir);
}

int ag_test_compile_report(const char *src, const char *first, const char *arch,
                           const char *kernel, const char *dir, int *regs, int *stores,
                           int *loads) {
  ag_error err = {0};
  void *cubin = NULL;
  size_t size = 0;
  ck_assert_msg(ag_nvrtc_compile(src, first, arch, &cubin, &size, &err) == AG_OK, "%s: %s",
                arch, err.message);
  ck_assert_mem_eq(cubin, "\x7f" "ELF", 4);
  free(cubin);
  char path[512];
  snprintf(path, sizeof path, "%s/%s.log", dir, first);
  char *log = ag_test_slurp(path, NULL);
  ck_assert_ptr_nonnull(log);
  const int ok = ag_test_ptxas_report(log, kernel, regs, stores, loads);
  if (ok)
    printf("nvrtc %s %s: %d registers, %d bytes spill stores, %d bytes spill loads\n", kernel,
           arch, *regs, *stores, *loads);
  else
    printf("SKIP spill check for %s %s: no ptxas report in the log\n", kernel, arch);
  free(log);
  return ok;
}

int ag_test_update_goldens(void) {
  const char *v = getenv("AG_UPDATE_GOLDENS");
  return v && strcmp(v, "1") == 0;
}

ag_context *ag_test_gpu_or_skip(const char *test) {
  ag_context *ctx = NULL;
  ag_error err = {0};
  ag_status st = ag_context_create(0, &ctx, &err);
  if (st == AG_ERR_NO_DRIVER || st == AG_ERR_NO_DEVICE) {
    printf("SKIP %s: %s (no GPU here)\n", test, ag_strerror(st));
    ag_error_clear(&err);
    return NULL;
  }
  ck_assert_msg(st == AG_OK, "context: %s", err.message);
  return ctx;
}

int32_t *ag_test_huge_lengths(const char *test) {
  if (getenv("ATTNGEN_TEST_SKIP_HUGE")) {
    printf("SKIP %s: ATTNGEN_TEST_SKIP_HUGE is set\n", test);
    return NULL;
  }
  int32_t *lengths = malloc(sizeof(int32_t) * AG_HUGE_BATCH);
  ck_assert_ptr_nonnull(lengths);
  int64_t total = 0;
  for (int64_t i = 0; i < AG_HUGE_BATCH; i++) total += lengths[i] = 17 + (int32_t)(i % 2);
  ck_assert_int_gt(total * AG_HUGE_HEADS * 128, (int64_t)1 << 31);
  return lengths;
}
