// SPDX-License-Identifier: BSD-3-Clause
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
  if (!spec || spec->head_dim <= 0) return 0.0; /* documented: 0 for no usable spec */
  return spec->softmax_scale > 0 ? spec->softmax_scale : 1.0 / sqrt((double)spec->head_dim);
}

/* A spec filled by hand, not by the loader, can hold anything: refuse what
 * would index past a table, print raw into the source or wrap, before any
 * of it is used. The loader's specs always pass. */
ag_status ag_spec_check_fields(const ag_spec *s, ag_error *err) {
#define BAD(...) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, __VA_ARGS__)
  if (!s) BAD("spec is NULL");
  if (!memchr(s->source, '\0', sizeof s->source)) BAD("spec.source is not NUL-terminated");
  if (!memchr(s->name, '\0', sizeof s->name)) BAD("spec.name is not NUL-terminated");
  size_t n = strlen(s->name);
  bool name_ok = n >= 1 && n <= 48 && s->name[0] >= 'a' && s->name[0] <= 'z';
  for (size_t i = 1; name_ok && i < n; i++) {
    char c = s->name[i];
    name_ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  }
  if (!name_ok) BAD("spec.name must match [a-z][a-z0-9_]* and be 1 to 48 characters (was it loaded?)");
  if ((unsigned)s->pattern > AG_PATTERN_JAGGED) BAD("spec.pattern %d is out of range", (int)s->pattern);
  if ((unsigned)s->dtype > AG_DTYPE_FP16) BAD("spec.dtype %d is out of range", (int)s->dtype);
  if ((unsigned)s->arch > AG_ARCH_SM90A) BAD("spec.arch %d is out of range", (int)s->arch);
  if ((unsigned)s->query > AG_QUERY_BROADCAST) BAD("spec.query %d is out of range", (int)s->query);
  if ((unsigned)s->rotary.layout > AG_ROTARY_HALF)
    BAD("spec.rotary.layout %d is out of range", (int)s->rotary.layout);
  if ((unsigned)s->rotary.positions > AG_POSITIONS_BLOCK)
    BAD("spec.rotary.positions %d is out of range", (int)s->rotary.positions);
  if (s->rotary.apply_to & ~(unsigned)(AG_APPLY_Q | AG_APPLY_K | AG_APPLY_V))
    BAD("spec.rotary.apply_to 0x%x has unknown bits", s->rotary.apply_to);
  if (!s->passes || (s->passes & ~(unsigned)(AG_PASS_FORWARD | AG_PASS_BACKWARD)))
    BAD("spec.passes 0x%x is not a set of AG_PASS_* bits", s->passes);
  if (s->head_dim != 64 && s->head_dim != 128) BAD("spec.head_dim must be 64 or 128 (got %d)", s->head_dim);
  if (s->pattern == AG_PATTERN_BLOCK_DIAGONAL &&
      (s->block_size < 16 || s->block_size > 256 || s->block_size % 16))
    BAD("spec.block_size must be a multiple of 16 from 16 to 256 (got %d)", s->block_size);
  if (s->softmax_scale != 0 && !(s->softmax_scale >= 1.17549435e-38 && s->softmax_scale <= 2.3585e38))
    BAD("spec.softmax_scale must be 0 (auto) or a positive number fp32 holds (got %g)",
        s->softmax_scale);
  if (s->rotary.layout != AG_ROTARY_NONE && s->rotary.positions != AG_POSITIONS_TABLE &&
      !(s->rotary.base >= 1.17549435e-38 && s->rotary.base <= 3.4028e38))
    BAD("spec.rotary.base must be a positive number fp32 holds (got %g)", s->rotary.base);
  if (s->has_window && (s->window_left < 0 || s->window_right < 0))
    BAD("spec.window [%d, %d] is out of range", s->window_left, s->window_right);
  return AG_OK;
#undef BAD
}

/* Rotary fields a validated spec cannot hold (from a spec filled by hand). */
static bool rotary_valid(const ag_spec *spec) {
  const ag_rotary_layout l = spec->rotary.layout;
  if (l == AG_ROTARY_NONE) return true;
  return (l == AG_ROTARY_INTERLEAVED || l == AG_ROTARY_HALF) && spec->rotary.apply_to != 0 &&
         !(spec->rotary.apply_to & ~(unsigned)(AG_APPLY_Q | AG_APPLY_K | AG_APPLY_V)) &&
         (spec->rotary.positions == AG_POSITIONS_TABLE ||
          ((spec->rotary.positions == AG_POSITIONS_SEQUENCE ||
            spec->rotary.positions == AG_POSITIONS_BLOCK) &&
           spec->rotary.base > 0 && isfinite(spec->rotary.base)));
}

ag_status ag_plan_rotary(const ag_spec *spec, ag_plan *out, ag_error *err) {
  if (!rotary_valid(spec))
    return ag_fail(err, AG_ERR_SPEC, "spec '%s' was not validated", spec->name);
  out->takes_table =
      spec->rotary.layout != AG_ROTARY_NONE && spec->rotary.positions == AG_POSITIONS_TABLE;
  /* Computed angles use base^(-2i / head_dim) as fp32 literals. */
  if (spec->rotary.layout != AG_ROTARY_NONE && spec->rotary.positions != AG_POSITIONS_TABLE &&
      spec->rotary.base < 1e-30)
    return ag_plan_refuse(out, AG_REFUSED_ROTARY, err,
                          "rotary base %g (below 1e-30 its frequencies overflow fp32)",
                          spec->rotary.base);
  return AG_OK;
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
  /* The planners' kernel counts are fixed by their code, not by a spec:
   * past the array is a planner bug, stopped here rather than written. */
  if (plan->nkernels >= AG_PLAN_MAX_KERNELS) {
    fprintf(stderr, "attngen: a plan of more than %d kernels (%s): raise AG_PLAN_MAX_KERNELS\n",
            AG_PLAN_MAX_KERNELS, name_tag);
    abort();
  }
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
  if (!out) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "plan: out is NULL");
  memset(out, 0, sizeof *out);
  ag_status st = ag_spec_check_fields(spec, err);
  if (st != AG_OK) return st;
  st = spec->pattern == AG_PATTERN_BLOCK_DIAGONAL ? ag_plan_block(spec, out, err)
                 : spec->pattern == AG_PATTERN_JAGGED       ? ag_plan_jagged_make(spec, out, err)
                                                            : ag_fail(err, AG_ERR_SPEC,
                                                                      "spec '%s' was not validated",
                                                                      spec->name);
  if (st == AG_OK) ag_plan_kernels(spec, out);
  /* The planners size tiles for sm_90's 227 KiB; a spec that names sm_80
   * must fit in its 163 KiB, or the refusal would come only at load. */
  if (st == AG_OK && spec->arch == AG_ARCH_SM80) {
    for (int i = 0; i < out->nkernels; i++) {
      const ag_plan_kernel *k = &out->kernels[i];
      if (k->smem_bytes > AG_SMEM_MAX_SM80) {
        char name[sizeof k->name];
        memcpy(name, k->name, sizeof name);
        int need = k->smem_bytes;
        return ag_plan_refuse(out, AG_REFUSED_ARCH, err,
                              "kernel %s needs %d bytes of shared memory per block, more than "
                              "sm_80's %d (163 KiB): use arch sm_90a, a smaller block_size or "
                              "head_dim",
                              name, need, AG_SMEM_MAX_SM80);
      }
    }
  }
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

int ag_plan_variant(const ag_plan *plan, unsigned pass, int64_t n_q, int64_t heads,
                    int64_t kv_heads) {
  return plan->pattern == AG_PATTERN_JAGGED
             ? ag_plan_jagged_variant(plan, pass, n_q, heads, kv_heads)
             : 0;
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
