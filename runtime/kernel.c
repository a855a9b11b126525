// SPDX-License-Identifier: BSD-3-Clause
/* kernel.c: the runtime entry points that start from a spec: ag_compile
 * (spec -> cubin) and ag_kernel_get (spec -> loaded kernel). They resolve the
 * target arch, run the generator (plan, emit) and hand over to compile.c and
 * context.c. */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* (runtime.h) An explicit spec arch must match `arch`; auto becomes the
 * enum value when `arch` has one, so the emitter can pick that arch's code
 * path, sm_80 for every arch before sm_90 (sm_86, sm_89: the code that runs
 * there, and a plan without the shared memory that sm_90's bulk stores
 * stage through, which on their smaller SMs can cost a CTA), and stays
 * auto otherwise. */
ag_status ag_spec_for_arch(const ag_spec *spec, const char *arch, ag_spec *out, ag_error *err) {
  *out = *spec;
  if (spec->arch == AG_ARCH_AUTO) {
    if (strcmp(arch, "sm_90a") == 0) out->arch = AG_ARCH_SM90A;
    if (ag_arch_before_sm90(arch)) out->arch = AG_ARCH_SM80;
    return AG_OK;
  }
  const char *want = ag_arch_name(spec->arch);
  if (!want || strcmp(want, arch) != 0)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "spec '%s' targets %s, not %s", spec->name,
                   want ? want : "an unknown arch", arch);
  return AG_OK;
}

ag_status ag_compile_spec(const ag_spec *spec, const char *arch, void **out_cubin, size_t *out_size,
                          ag_cache_origin *out_origin, char **out_warning, ag_error *err) {
  char *source = NULL;
  char name[AG_KERNEL_NAME_MAX];
  ag_spec resolved;
  if (out_warning) *out_warning = NULL;
  if (!out_cubin || !out_size)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_compile: out_cubin and out_size are required");
  *out_cubin = NULL;
  *out_size = 0;
  if (!spec) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_compile: spec is NULL");
  ag_status checked = ag_spec_check_fields(spec, err);
  if (checked != AG_OK) return checked;
  if (!arch) arch = ag_arch_name(spec->arch);
  if (!arch)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "ag_compile: spec '%s' leaves the arch to the device; name one (sm_90a, sm_80)",
                   spec->name);
  ag_status st = ag_arch_check(arch, err);
  if (st == AG_OK) st = ag_spec_for_arch(spec, arch, &resolved, err);
  if (st == AG_OK) st = ag_emit(&resolved, &source, name, err);
  if (st == AG_OK)
    st =
        ag_compile_source_ex(source, name, arch, out_cubin, out_size, out_origin, out_warning, err);
  free(source);
  return st;
}

ag_status ag_compile(const ag_spec *spec, const char *arch, void **out_cubin, size_t *out_size,
                     ag_error *err) {
  return ag_compile_spec(spec, arch, out_cubin, out_size, NULL, NULL, err);
}

ag_status ag_kernel_get(ag_context *ctx, const ag_spec *spec, ag_kernel **out_kernel,
                        ag_error *err) {
  char *source = NULL;
  ag_spec resolved;
  ag_plan plan;
  if (!out_kernel)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_kernel_get: out_kernel is NULL");
  *out_kernel = NULL;
  if (!ctx || !spec)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_kernel_get: context and spec are required");
  const char *arch = spec->arch == AG_ARCH_AUTO ? ctx->arch : ag_arch_name(spec->arch);
  if (!arch || !ag_arch_runs_on(arch, ctx->cc_major, ctx->cc_minor))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "spec '%s' targets %s, but device %d (%s) is %s; use arch: auto", spec->name,
                   arch ? arch : "an unknown arch", ctx->ordinal, ctx->name, ctx->arch);
  ag_status st = ag_spec_for_arch(spec, arch, &resolved, err);
  if (st == AG_OK) st = ag_plan_make(&resolved, &plan, err);
  if (st == AG_OK) st = ag_emit_plan(&resolved, &plan, &source, err); /* planned once */
  if (st == AG_OK)
    st = ag_context_kernel(ctx, &resolved, &plan, source, arch, NULL, out_kernel, err);
  free(source);
  return st;
}

ag_status ag_kernel_from_images(ag_context *ctx, const ag_spec *spec, const ag_image *images,
                                int nimages, ag_kernel **out_kernel, ag_error *err) {
  char *source = NULL;
  ag_spec resolved;
  ag_plan plan;
  if (!out_kernel)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_kernel_from_images: out_kernel is NULL");
  *out_kernel = NULL;
  if (!ctx || !spec || (!images && nimages))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "ag_kernel_from_images: context, spec and images are required");
  ag_status st = ag_spec_check_fields(spec, err);
  if (st != AG_OK) return st;
  /* The device's own arch first, then any other that runs there. */
  const ag_image *pick = NULL;
  for (int pass = 0; pass < 2 && !pick; pass++)
    for (int i = 0; i < nimages && !pick; i++) {
      const ag_image *im = &images[i];
      if (!im->arch || !im->cubin || !im->size) continue;
      if (pass == 0 ? strcmp(im->arch, ctx->arch) == 0
                    : ag_arch_runs_on(im->arch, ctx->cc_major, ctx->cc_minor))
        pick = im;
    }
  if (!pick) {
    char have[128] = "";
    for (int i = 0; i < nimages; i++)
      if (images[i].arch && strlen(have) + strlen(images[i].arch) + 3 < sizeof have)
        strcat(strcat(have, i ? ", " : ""), images[i].arch);
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "spec '%s' has no image for device %d (%s, %s); it was built for %s",
                   spec->name, ctx->ordinal, ctx->name, ctx->arch, have[0] ? have : "nothing");
  }
  if (spec->arch != AG_ARCH_AUTO && strcmp(ag_arch_name(spec->arch), pick->arch) != 0)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "spec '%s' targets %s, not %s", spec->name,
                   ag_arch_name(spec->arch), pick->arch);
  /* The plan and source the image was built from (emitting is CPU work,
   * no compile): the plan names and shapes the kernels, the source keys
   * the context's memory cache. */
  st = ag_spec_for_arch(spec, pick->arch, &resolved, err);
  if (st == AG_OK) st = ag_plan_make(&resolved, &plan, err);
  if (st == AG_OK) st = ag_emit_plan(&resolved, &plan, &source, err);
  if (st == AG_OK)
    st = ag_context_kernel(ctx, &resolved, &plan, source, pick->arch, pick->cubin, out_kernel,
                           err);
  free(source);
  return st;
}

ag_status ag_kernel_get_file(ag_context *ctx, const char *path, ag_kernel **out_kernel,
                             ag_error *err) {
  ag_spec spec;
  if (out_kernel) *out_kernel = NULL;
  ag_status st = ag_spec_load_file(path, &spec, err);
  return st != AG_OK ? st : ag_kernel_get(ctx, &spec, out_kernel, err);
}

ag_status ag_kernel_get_string(ag_context *ctx, const char *yaml, size_t len,
                               ag_kernel **out_kernel, ag_error *err) {
  ag_spec spec;
  if (out_kernel) *out_kernel = NULL;
  ag_status st = ag_spec_load_string(yaml, len, NULL, &spec, err);
  return st != AG_OK ? st : ag_kernel_get(ctx, &spec, out_kernel, err);
}

const ag_spec *ag_kernel_spec(const ag_kernel *kernel) { return kernel ? &kernel->spec : NULL; }
bool ag_kernel_takes_row_strides(const ag_kernel *kernel) {
  return kernel && kernel->plan.pattern == AG_PATTERN_BLOCK_DIAGONAL && kernel->plan.row_strides;
}
/* The block kernels that take row strides read the key heads in place too
 * (plan_block.c: AG_PARAM_KV_HEADS after the strides). */
bool ag_kernel_takes_kv_heads(const ag_kernel *kernel) {
  return kernel && (kernel->plan.pattern == AG_PATTERN_JAGGED || kernel->plan.row_strides);
}
