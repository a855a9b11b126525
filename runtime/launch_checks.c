// SPDX-License-Identifier: BSD-3-Clause
/* launch_checks.c: the argument checks every pattern's entry points share:
 * device pointers (non-null, aligned) and the optional host copies of the
 * offsets. Host work only; no synchronization. */
#include <stdint.h>

#include "runtime.h"

ag_status ag_check_pointer(const void *p, const char *name, unsigned align, ag_error *err) {
  if (!p) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "%s is a null pointer", name);
  if ((uintptr_t)p % align)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "%s (%p) is not %u-byte aligned%s", name, p,
                   align, align == 16 ? "; the kernel loads 16 bytes at a time" : "");
  return AG_OK;
}

ag_status ag_check_host_offsets(const char *name, const char *total_name, const int32_t *off,
                                int64_t batch, int64_t total, ag_error *err) {
  if (!off) return AG_OK;
  if (off[0] != 0)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "%s[0] is %d; it must be 0", name, (int)off[0]);
  for (int64_t i = 0; i < batch; i++)
    if (off[i + 1] < off[i])
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "%s decrease at index %lld (%d after %d)",
                     name, (long long)(i + 1), (int)off[i + 1], (int)off[i]);
  if (off[batch] != total)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "%s[%lld] (the last) is %d, not %s (%lld)", name,
                   (long long)batch, (int)off[batch], total_name, (long long)total);
  return AG_OK;
}
