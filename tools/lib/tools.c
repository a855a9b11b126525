// SPDX-License-Identifier: BSD-3-Clause
/* tools.c: the command line's window onto the runtime's internals (see
 * attngen_tools.h), kept here so that cli/ includes only public and tools
 * headers. Each function is a thin wrapper; the internals stay hidden in
 * libattngen.so. */
#include "attngen_tools.h"
#include "runtime.h"

ag_status ag_tool_write_file(const char *path, const void *data, size_t len, ag_error *err) {
  return ag_write_output(path, data, len, err);
}

ag_status ag_tool_compile(const ag_spec *spec, const char *arch, void **out_cubin,
                          size_t *out_size, char **out_warning, ag_error *err) {
  return ag_compile_spec(spec, arch, out_cubin, out_size, NULL, out_warning, err);
}

char *ag_tool_cache_warning(ag_context *ctx) { return ag_context_cache_warning(ctx); }

const char *ag_tool_device_name(const ag_context *ctx) { return ctx->name; }

const char *ag_tool_kernel_name(const ag_kernel *kernel, int i) {
  const ag_plan *p = &kernel->plan;
  return i >= 0 && i < p->nkernels ? p->kernels[i].name : NULL;
}
