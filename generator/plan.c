/* plan.c: the planner's front door: the fields every pattern shares, the
 * dispatch to the pattern's planner (plan_block.c, plan_jagged.c), and the
 * helpers those use to write kernel descriptors. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "plan.h"

double ag_spec_scale(const ag_spec *spec) {
  return spec->softmax_scale > 0 ? spec->softmax_scale : 1.0 / sqrt((double)spec->head_dim);
}

ag_status ag_plan_refuse(ag_plan *out, ag_refusal_key key, ag_error *err, const char *fmt, ...) {
  memset(out, 0, sizeof *out);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out->refusal, sizeof out->refusal, fmt, ap);
  va_end(ap);
  out->refused_at = key;
  return ag_fail(err, AG_ERR_UNSUPPORTED, "not supported yet: %s", out->refusal);
}

ag_plan_kernel *ag_plan_add_kernel(const ag_spec *spec, ag_plan *plan, unsigned pass,
                                   const char *name_tag, const char *template_file) {
  (void)spec;
  ag_plan_kernel *k = &plan->kernels[plan->nkernels++];
  memset(k, 0, sizeof *k);
  snprintf(k->name, sizeof k->name, "%s", name_tag);
  snprintf(k->template_name, sizeof k->template_name, "%s", name_tag);
  k->pass = pass;
  k->template_file = template_file;
  return k;
}

void ag_plan_set(ag_plan_kernel *k, const char *name, int value) {
  if (k->nconsts >= AG_PLAN_MAX_CONSTS) abort(); /* a planner bug, caught by every test */
  k->consts[k->nconsts++] = (ag_plan_const){name, value};
}

void ag_plan_params(ag_plan_kernel *k, int n, const ag_param *params) {
  if (n > AG_PLAN_MAX_PARAMS) abort();
  memcpy(k->params, params, (size_t)n * sizeof *params);
  k->nparams = n;
}

ag_status ag_plan_make(const ag_spec *spec, ag_plan *out, ag_error *err) {
  memset(out, 0, sizeof *out);
  ag_status st = spec->pattern == AG_PATTERN_BLOCK_DIAGONAL ? ag_plan_block(spec, out, err)
                 : spec->pattern == AG_PATTERN_JAGGED       ? ag_plan_jagged_make(spec, out, err)
                                                            : ag_fail(err, AG_ERR_SPEC,
                                                                      "spec '%s' was not validated",
                                                                      spec->name);
  if (st == AG_OK) ag_plan_kernels(spec, out);
  return st;
}

void ag_plan_kernels(const ag_spec *spec, ag_plan *plan) {
  plan->nkernels = 0;
  memset(plan->kernels, 0, sizeof plan->kernels);
  if (plan->pattern == AG_PATTERN_BLOCK_DIAGONAL) ag_plan_block_kernels(spec, plan);
  else ag_plan_jagged_kernels(spec, plan);
}

const ag_plan_kernel *ag_plan_kernel_for(const ag_plan *plan, unsigned pass) {
  for (int i = 0; i < plan->nkernels; i++)
    if (plan->kernels[i].pass == pass) return &plan->kernels[i];
  return NULL;
}

const char *ag_plan_first_kernel(const ag_plan *p) {
  return p->nkernels ? p->kernels[0].name : "";
}

char *ag_plan_describe(const ag_plan *p, const char *prefix) {
  ag_buf b;
  ag_buf_init(&b);
  if (p->pattern == AG_PATTERN_BLOCK_DIAGONAL) ag_plan_block_describe(p, prefix, &b);
  else ag_plan_jagged_describe(p, prefix, &b);
  return ag_buf_take(&b);
}
