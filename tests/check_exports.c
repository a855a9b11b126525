// SPDX-License-Identifier: BSD-3-Clause
/* check_exports.c: libattngen.so's face. Its dynamic symbol table
 * (nm -D --defined-only) must hold exactly the functions declared in
 * include/attngen.h, no internal one and none missing (a declaration without
 * AG_API is hidden); it must carry no tools-library code (selfcheck, the
 * reference); and readelf -d must show the SONAME libattngen.so.<major>
 * (before 1.0: libattngen.so.0.<minor>).
 * The library comes from ATTNGEN_SO (set by `make test`), else
 * ../build/libattngen.so; each test skips with a message when nm or readelf
 * is missing, or when the library was not built and ATTNGEN_SO is unset. */
#include <check.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attngen.h"
#include "util.h"

#define HEADER "../include/attngen.h"
#define MAX_NAMES 256

typedef struct names {
  int count;
  char *name[MAX_NAMES];
} names;

static void names_add(names *n, const char *s, size_t len) {
  for (int i = 0; i < n->count; i++)
    if (strlen(n->name[i]) == len && !strncmp(n->name[i], s, len)) return;
  ck_assert_int_lt(n->count, MAX_NAMES);
  n->name[n->count++] = strndup(s, len);
}

static bool names_has(const names *n, const char *s) {
  for (int i = 0; i < n->count; i++)
    if (!strcmp(n->name[i], s)) return true;
  return false;
}

static void names_free(names *n) {
  for (int i = 0; i < n->count; i++) free(n->name[i]);
  n->count = 0;
}

/* Whether `tool` is on PATH; prints the skip line when not. */
static bool have_tool(const char *tool) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tool);
  if (system(cmd) == 0) return true;
  printf("SKIP exports: %s is not installed (binutils)\n", tool);
  return false;
}

/* The library's path, or NULL (with the skip line) when there is none to
 * check. An ATTNGEN_SO that does not exist fails the test. */
static const char *library_path(void) {
  const char *env = getenv("ATTNGEN_SO");
  if (env) {
    ck_assert_msg(access(env, R_OK) == 0, "ATTNGEN_SO=%s cannot be read", env);
    return env;
  }
  if (access("../build/libattngen.so", R_OK) == 0) return "../build/libattngen.so";
  printf("SKIP exports: ../build/libattngen.so is not built (make build/libattngen.so)\n");
  return NULL;
}

/* The functions attngen.h declares: every identifier followed by '(' once
 * comments and preprocessor lines are removed (the header declares no
 * function pointers and calls nothing). */
static void declared_functions(names *out) {
  char *text = ag_test_slurp(HEADER, NULL);
  ck_assert_msg(text != NULL, "cannot read %s", HEADER);
  /* Blank out comments, then preprocessor lines with their continuations. */
  for (char *p = text; *p; p++) {
    if (p[0] == '/' && p[1] == '*') {
      char *end = strstr(p + 2, "*/");
      ck_assert_ptr_nonnull(end);
      memset(p, ' ', (size_t)(end + 2 - p));
    } else if (p[0] == '/' && p[1] == '/') {
      while (*p && *p != '\n') *p++ = ' ';
    }
  }
  bool line_start = true;
  for (char *p = text; *p; p++) {
    if (line_start) {
      char *q = p;
      while (*q == ' ' || *q == '\t') q++;
      if (*q == '#') {
        char prev = 0;
        for (; *q && !(*q == '\n' && prev != '\\'); q++) {
          prev = *q;
          *q = ' ';
        }
        p = q;
        if (!*p) break;
      }
    }
    line_start = *p == '\n';
  }
  for (char *p = text; *p;) {
    if (isalpha((unsigned char)*p) || *p == '_') {
      char *start = p;
      while (isalnum((unsigned char)*p) || *p == '_') p++;
      char *q = p;
      while (isspace((unsigned char)*q)) q++;
      if (*q == '(') names_add(out, start, (size_t)(p - start));
    } else {
      p++;
    }
  }
  free(text);
  /* A parser that found nothing would pass any library. */
  ck_assert_msg(names_has(out, "ag_emit") && names_has(out, "ag_block_forward"),
                "found %d declarations in %s, not ag_emit and ag_block_forward", out->count,
                HEADER);
}

/* Names the linker itself defines, which some (older) linkers put in a
 * shared library's dynamic table: not attngen's code. */
static bool is_linker_symbol(const char *name) {
  static const char *const linker[] = {"_init", "_fini", "_edata", "_end", "__bss_start"};
  for (size_t i = 0; i < sizeof linker / sizeof *linker; i++)
    if (!strcmp(name, linker[i])) return true;
  return false;
}

/* Runs `cmd` and returns its whole stdout (malloc()ed), failing the test
 * when it cannot run or exits non-zero. */
static char *capture(const char *cmd) {
  FILE *f = popen(cmd, "r");
  ck_assert_msg(f != NULL, "cannot run: %s", cmd);
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ck_assert_ptr_nonnull(buf);
  size_t n;
  while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (cap - len < 2) {
      cap *= 2;
      buf = realloc(buf, cap);
      ck_assert_ptr_nonnull(buf);
    }
  }
  buf[len] = 0;
  int status = pclose(f);
  ck_assert_msg(status == 0, "'%s' exited with status %d", cmd, status);
  return buf;
}

START_TEST(test_exports_only_the_header) {
  if (!have_tool("nm")) return;
  const char *lib = library_path();
  if (!lib) return;
  names declared = {0}, exported = {0};
  declared_functions(&declared);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s'", lib);
  char *out = capture(cmd);
  /* Lines "ADDRESS TYPE NAME[@VERSION]"; collect every stray name before
   * failing, so one run lists them all. */
  char stray[4096] = "";
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    char addr[64], type[8], name[512];
    if (sscanf(line, "%63s %7s %511s", addr, type, name) != 3) continue;
    name[strcspn(name, "@")] = 0;
    if (is_linker_symbol(name)) continue;
    if (names_has(&declared, name) && (type[0] == 'T' || type[0] == 't')) {
      names_add(&exported, name, strlen(name));
      continue;
    }
    size_t used = strlen(stray);
    snprintf(stray + used, sizeof stray - used, "\n  %s %s", type, name);
  }
  char missing[4096] = "";
  for (int i = 0; i < declared.count; i++) {
    if (names_has(&exported, declared.name[i])) continue;
    size_t used = strlen(missing);
    snprintf(missing + used, sizeof missing - used, "\n  %s", declared.name[i]);
  }
  free(out);
  int nexported = exported.count;
  names_free(&declared);
  names_free(&exported);
  ck_assert_msg(!stray[0], "%s exports symbols include/attngen.h does not declare:%s", lib, stray);
  ck_assert_msg(!missing[0], "%s does not export these functions of include/attngen.h "
                "(missing AG_API?):%s", lib, missing);
  printf("exports: %s exports the %d functions of include/attngen.h and nothing else\n", lib,
         nexported);
}
END_TEST

/* Neither selfcheck nor the reference is in the library, not even hidden:
 * they live in the tools library (build/libattngen_tools.a). */
START_TEST(test_no_tools_code) {
  if (!have_tool("nm")) return;
  const char *lib = library_path();
  if (!lib) return;
  static const char *const prefixes[] = {"ag_selfcheck_", "ag_ref_", "ag_block_data_",
                                         "ag_check_tolerance", "ag_rand_", "ag_tool_"};
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "nm --defined-only '%s'", lib);
  char *out = capture(cmd);
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    char addr[64], type[8], name[512];
    if (sscanf(line, "%63s %7s %511s", addr, type, name) != 3) continue;
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
      ck_assert_msg(strncmp(name, prefixes[i], strlen(prefixes[i])) != 0,
                    "%s defines %s: tools-library code linked into the library", lib, name);
  }
  free(out);
}
END_TEST

START_TEST(test_soname) {
  if (!have_tool("readelf")) return;
  const char *lib = library_path();
  if (!lib) return;
  char want[64];
  /* The ABI: the major version (AG_VERSION_STRING up to its first dot),
   * or before 1.0 major.minor (up to its second dot). */
  const char *v = AG_VERSION_STRING;
  size_t n = strcspn(v, ".");
  if (n == 1 && v[0] == '0' && v[1] == '.') n += 1 + strcspn(v + 2, ".");
  snprintf(want, sizeof want, "[libattngen.so.%.*s]", (int)n, v);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "readelf -d '%s'", lib);
  char *out = capture(cmd);
  char *line = strstr(out, "(SONAME)");
  ck_assert_msg(line != NULL, "readelf -d %s shows no SONAME:\n%s", lib, out);
  char *eol = strchr(line, '\n');
  if (eol) *eol = 0;
  ck_assert_msg(strstr(line, want) != NULL, "%s: SONAME line '%s', expected %s", lib, line, want);
  printf("exports: %s has SONAME %s\n", lib, want);
  free(out);
}
END_TEST

/* ag_version is the header's version, and one string for the program's
 * life. */
START_TEST(test_version) {
  ck_assert_str_eq(ag_version(), AG_VERSION_STRING);
  ck_assert_ptr_eq(ag_version(), ag_version());
}
END_TEST

Suite *exports_suite(void) {
  Suite *s = suite_create("exports");
  TCase *tc = tcase_create("exports");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_exports_only_the_header);
  tcase_add_test(tc, test_no_tools_code);
  tcase_add_test(tc, test_soname);
  tcase_add_test(tc, test_version);
  suite_add_tcase(s, tc);
  return s;
}
