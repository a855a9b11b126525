// SPDX-License-Identifier: BSD-3-Clause
/* fuzz_spec.c: libFuzzer target over the spec front end: any bytes go through
 * ag_spec_load_string (parser and validator); a spec that loads is planned
 * and emitted too, and both must succeed (validation refuses what the plan
 * cannot build). Built by `make fuzz` with -fsanitize=fuzzer,address,undefined;
 * seeds in tests/fuzz/corpus/, tokens in tests/fuzz/spec.dict. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attngen.h"
#include "plan.h"

/* Every outcome must be a known status, with a message exactly on failure. */
static void require(int ok) {
  if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ag_spec spec;
  ag_error err = {0};
  /* The buffer is exactly `size` bytes, not NUL-terminated: ASan catches any
   * read past it. */
  ag_status st = ag_spec_load_string((const char *)data, size, "fuzz.yaml", &spec, &err);
  require(st == AG_OK || st == AG_ERR_SPEC || st == AG_ERR_UNSUPPORTED || st == AG_ERR_NOMEM);
  require(st == AG_OK ? err.message == NULL : err.message != NULL && err.message[0] != '\0');
  require(err.code == st);
  ag_error_clear(&err);
  if (st != AG_OK) return 0;

  ag_plan plan;
  char *source = NULL;
  char name[AG_KERNEL_NAME_MAX];
  st = ag_plan_make(&spec, &plan, &err);
  require(st == AG_OK);
  ag_error_clear(&err);
  st = ag_emit(&spec, &source, name, &err);
  require(st == AG_OK);
  require(st != AG_OK || (source && strlen(source) > 0 && name[0] != '\0'));
  free(source);
  ag_error_clear(&err);
  return 0;
}
