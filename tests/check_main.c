/* check_main.c: the Check runner. Each tests/check_<module>.c defines one
 * suite constructor; missing ones are weak and skipped, so modules can land
 * one at a time. */
#include <check.h>
#include <stdlib.h>

#define SUITES(X) \
  X(error) X(spec) X(expand) X(plan) X(emit) X(compile) X(nvrtc) X(cache) X(runtime) X(cli) X(gpu) \
  X(hostile) X(args) X(concurrency) X(reference) X(backward) X(rotary) X(exports) X(jagged) \
  X(reliability)

#define DECLARE(name) Suite *name##_suite(void) __attribute__((weak));
SUITES(DECLARE)

int main(void) {
  SRunner *sr = srunner_create(NULL);
#define ADD(name) \
  if (name##_suite) srunner_add_suite(sr, name##_suite());
  SUITES(ADD)
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
