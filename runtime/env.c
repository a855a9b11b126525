// SPDX-License-Identifier: BSD-3-Clause
/* env.c: the environment knobs the runtime reads (names in runtime.h), so
 * "set and non-empty" and "a true flag" mean the same thing everywhere. */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

const char *ag_env_str(const char *name) {
  const char *v = getenv(name);
  return v && v[0] ? v : NULL;
}

bool ag_env_flag(const char *name) {
  const char *v = ag_env_str(name);
  return v && strcmp(v, "0") != 0;
}
