// SPDX-License-Identifier: BSD-3-Clause
/* arch.c: target arch strings: the accepted "sm_NN[a]" forms, the name for
 * a device, and which cubins a device runs. (The spec enum's names,
 * ag_arch_name, live in the generator, which needs them without CUDA.) */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* The number in "sm_NN[a]" and whether it ends in 'a'; false if malformed. */
static bool parse(const char *arch, int *out_number, bool *out_specific) {
  if (!arch || strncmp(arch, "sm_", 3) != 0 || arch[3] == '0') return false;
  size_t digits = 0;
  int number = 0;
  while (isdigit((unsigned char)arch[3 + digits]))
    number = number * 10 + (arch[3 + digits++] - '0');
  const char *rest = arch + 3 + digits;
  if (digits < 2 || digits > 3) return false;
  if (rest[0] != '\0' && !(rest[0] == 'a' && rest[1] == '\0')) return false;
  *out_number = number;
  *out_specific = rest[0] == 'a';
  return true;
}

ag_status ag_arch_check(const char *arch, ag_error *err) {
  int number;
  bool specific;
  if (!arch) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "no target arch given");
  if (!parse(arch, &number, &specific))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "invalid target arch '%s': expected sm_NN or sm_NNa, e.g. sm_80 or sm_90a",
                   arch);
  /* cp.async and bf16 mma.sync: below sm_80 ptxas would refuse the kernels
   * in a hundred lines; say it in one. */
  if (number < 80)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "unsupported target arch '%s': attngen's kernels need sm_80 or later "
                   "(e.g. sm_80, sm_90a)",
                   arch);
  return AG_OK;
}

void ag_arch_for_device(int major, int minor, char out[AG_ARCH_NAME_MAX]) {
  /* 9.0 gets the arch-specific target: wgmma and setmaxnreg need it. */
  snprintf(out, AG_ARCH_NAME_MAX, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
}

bool ag_arch_before_sm90(const char *arch) {
  int number;
  bool specific;
  return parse(arch, &number, &specific) && number < 90;
}

bool ag_arch_runs_on(const char *arch, int major, int minor) {
  int number;
  bool specific;
  if (!parse(arch, &number, &specific)) return false;
  int want_major = number / 10, want_minor = number % 10;
  if (specific) return want_major == major && want_minor == minor;
  return want_major == major && want_minor <= minor;
}
