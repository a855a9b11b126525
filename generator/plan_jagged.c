/* plan_jagged.c: the jagged pattern's planner (variable-length sequences
 * with their own query and key offsets): tile shapes of the forward and
 * the backward and the kernel descriptors made from them. */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "plan.h"

ag_status ag_plan_jagged_make(const ag_spec *spec, ag_plan *out, ag_error *err) {
  (void)spec;
  return ag_plan_refuse(out, AG_REFUSED_PATTERN, err, "the jagged pattern");
}

void ag_plan_jagged_kernels(const ag_spec *spec, ag_plan *plan) {
  (void)spec;
  (void)plan;
}

void ag_plan_jagged_describe(const ag_plan *plan, const char *prefix, ag_buf *b) {
  (void)plan;
  (void)prefix;
  (void)b;
}
