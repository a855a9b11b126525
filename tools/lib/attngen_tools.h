// SPDX-License-Identifier: BSD-3-Clause
/* attngen_tools.h: what the command line needs beyond the public API (the
 * disk cache's warning, the kernel's entry names, the device's name, atomic
 * file writes), from the tools library build/libattngen_tools.a. Includes
 * only attngen.h; the definitions (tools.c) reach the runtime's internals,
 * so the tools library links against the static libattngen.a, never the .so
 * (whose internals are hidden). Not installed, not a stable interface. */
#ifndef AG_TOOLS_H
#define AG_TOOLS_H

#include <stddef.h>

#include "attngen.h"

/* Write `len` bytes to the output file `path`: a regular file (or one a
 * symbolic link names) atomically, through a temporary file in the same
 * directory and rename(), keeping an existing file's mode (a new one gets
 * 0666 under the umask); a FIFO or character device is written into, never
 * replaced; a directory, block device, socket or dangling link is refused.
 * Nothing is left behind on failure. AG_ERR_IO. */
ag_status ag_tool_write_file(const char *path, const void *data, size_t len, ag_error *err);

/* ag_compile, and when out_warning is non-NULL, NULL or a malloc()ed
 * sentence saying why the disk cache was bypassed (the caller frees it). */
ag_status ag_tool_compile(const ag_spec *spec, const char *arch, void **out_cubin,
                          size_t *out_size, char **out_warning, ag_error *err);

/* NULL or a malloc()ed copy of the first disk-cache warning this context
 * saw (the caller frees it). Thread-safe. */
char *ag_tool_cache_warning(ag_context *ctx);

/* The device's name ("NVIDIA H100 80GB HBM3"); lives as long as ctx. */
const char *ag_tool_device_name(const ag_context *ctx);

/* The name of the kernel's i-th entry point in source order (forward
 * first), NULL past the last. Each lives as long as the kernel. */
const char *ag_tool_kernel_name(const ag_kernel *kernel, int i);

#endif
