// SPDX-License-Identifier: BSD-3-Clause
/* check_main.c: the Check runner. Each tests/check_<module>.c defines one
 * suite constructor; missing ones are weak and skipped, so modules can land
 * one at a time. AG_SUITES=spec,cli,... runs only the suites it names, under
 * one summary (`make test-quick` uses it); Check's own CK_RUN_SUITE picks one. */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether `name` is in the comma-separated `list` (NULL: every suite). */
static bool selected(const char *list, const char *name) {
  if (!list) return true;
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ",");
    if (len == n && strncmp(p, name, n) == 0) return true;
    p += len;
    if (*p == ',') p++;
  }
  return false;
}

#define SUITES(X) \
  X(error) X(spec) X(expand) X(plan) X(emit) X(compile) X(nvrtc) X(cache) X(runtime) X(cli) X(gpu) \
  X(hostile) X(args) X(concurrency) X(reference) X(backward) X(rotary) X(exports) X(jagged) \
  X(schedule) X(reliability) X(broadcast) X(selfcheck)

#define DECLARE(name) Suite *name##_suite(void) __attribute__((weak));
SUITES(DECLARE)

int main(void) {
  const char *only = getenv("AG_SUITES");
  SRunner *sr = srunner_create(NULL);
  int added = 0;
#define ADD(name)                                      \
  if (name##_suite && selected(only, #name)) {         \
    srunner_add_suite(sr, name##_suite());             \
    added++;                                           \
  }
  SUITES(ADD)
  if (added == 0) {
    fprintf(stderr, "check_attngen: AG_SUITES=%s names no suite\n", only ? only : "");
    srunner_free(sr);
    return EXIT_FAILURE;
  }
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
