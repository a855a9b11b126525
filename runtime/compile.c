// SPDX-License-Identifier: BSD-3-Clause
/* compile.c: CUDA C to cubin through the on-disk cache: key, lookup, NVRTC
 * on a miss, store. The cache only ever saves time: when it cannot be used
 * the compile still succeeds, and the reason is returned as a warning. */
#include <stdlib.h>

#include <cuda.h> /* CUDA_VERSION */

#include "runtime.h"

/* Move a failure's message into *out_warning (when wanted), prefixed. */
static void warn(char **out_warning, const char *what, ag_error *why) {
  if (out_warning && !*out_warning) {
    ag_buf b;
    ag_buf_init(&b);
    ag_buf_printf(&b, "%s: %s", what, why->message ? why->message : ag_strerror(why->code));
    *out_warning = ag_buf_take(&b); /* NULL when out of memory: the warning is lost */
  }
  ag_error_clear(why);
}

/* The toolkit attngen was built with: its NVRTC version names the cache's
 * entries. Loading NVRTC to ask its own version costs 10-20 ms (a 100 MB
 * library) on every cache hit of a fresh process; a cubin an update of the
 * same toolkit would compile differently is still a correct cubin, so
 * entries survive a minor NVRTC update (clear the cache, or set
 * ATTNGEN_CACHE_DISABLE, to recompile them). ATTNGEN_LIBNVRTC, when set,
 * is part of the key: another NVRTC named there compiles its own entries. */
enum { BUILD_NVRTC_MAJOR = CUDA_VERSION / 1000, BUILD_NVRTC_MINOR = CUDA_VERSION % 1000 / 10 };

ag_status ag_compile_cache_entry(const char *source, const char *arch, const char *dir,
                                 uint8_t out_key[AG_SHA256_BYTES], char **out_path,
                                 ag_error *err) {
  *out_path = NULL;
  ag_nvrtc_options opts;
  ag_status st = ag_nvrtc_options_make(arch, &opts, err);
  if (st != AG_OK) return st;
  ag_cache_key_fields fields = {source,
                                &opts,
                                arch,
                                BUILD_NVRTC_MAJOR,
                                BUILD_NVRTC_MINOR,
                                AG_VERSION_STRING,
                                AG_CACHE_FORMAT_VERSION,
                                ag_env_str(AG_ENV_LIBNVRTC)};
  ag_cache_key(&fields, out_key);
  return ag_cache_path(dir, out_key, arch, BUILD_NVRTC_MAJOR, BUILD_NVRTC_MINOR, out_path, err);
}

ag_status ag_compile_source_ex(const char *source, const char *name, const char *arch,
                               void **out_cubin, size_t *out_size, ag_cache_origin *out_origin,
                               char **out_warning, ag_error *err) {
  ag_status st;
  char *dir = NULL, *path = NULL;
  void *cubin = NULL;
  size_t size = 0;
  ag_error why = {0};
  *out_cubin = NULL;
  *out_size = 0;
  if (out_origin) *out_origin = AG_FROM_NVRTC;
  if (out_warning) *out_warning = NULL;
  if (!source || !name) {
    st = ag_fail(err, AG_ERR_INVALID_ARGUMENT, "compile: source and name are required");
    goto fail;
  }
  uint8_t key[AG_SHA256_BYTES];
  if (!ag_cache_disabled()) {
    if (ag_cache_dir(&dir, &why) != AG_OK) {
      warn(out_warning, "cubin cache not used", &why);
    } else {
      st = ag_compile_cache_entry(source, arch, dir, key, &path, err);
      if (st == AG_OK) st = ag_cache_load(path, key, &cubin, &size, err);
      if (st != AG_OK) goto fail;
      if (cubin) {
        if (out_origin) *out_origin = AG_FROM_DISK;
        goto done;
      }
    }
  }
  char *dump_warning = NULL;
  st = ag_nvrtc_compile_ex(source, name, arch, &cubin, &size, out_warning ? &dump_warning : NULL,
                           err);
  if (st != AG_OK) goto fail;
  if (dump_warning) {
    if (!*out_warning) {
      *out_warning = dump_warning;
    } else {
      ag_buf b;
      ag_buf_init(&b);
      ag_buf_printf(&b, "%s; %s", *out_warning, dump_warning);
      char *both = ag_buf_take(&b);
      if (both) {
        free(*out_warning);
        *out_warning = both;
      }
      free(dump_warning);
    }
  }
  /* Replaces a corrupt entry too; a failed store leaves the old one a miss. */
  if (path && ag_cache_store(path, key, cubin, size, &why) != AG_OK)
    warn(out_warning, "cubin not cached", &why);
  else if (path)
    ag_cache_tidy(dir, path);
done:
  *out_cubin = cubin;
  *out_size = size;
  cubin = NULL;
  st = AG_OK;
fail:
  free(cubin);
  free(path);
  free(dir);
  if (st != AG_OK && out_warning) {
    free(*out_warning);
    *out_warning = NULL;
  }
  return st;
}

ag_status ag_compile_source(const char *source, const char *name, const char *arch,
                            void **out_cubin, size_t *out_size, ag_cache_origin *out_origin,
                            ag_error *err) {
  return ag_compile_source_ex(source, name, arch, out_cubin, out_size, out_origin, NULL, err);
}
