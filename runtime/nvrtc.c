// SPDX-License-Identifier: BSD-3-Clause
/* nvrtc.c: CUDA C to cubin with NVRTC, for one exact arch (a cubin, never
 * PTX, so the driver has nothing to JIT), with the options exposed for the
 * cache key and the source and log dumped on request for debugging. NVRTC
 * itself is loaded on the first call (nvrtc_lib.c). */
#include <ctype.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static int cmp_option(const void *a, const void *b) { return strcmp(a, b); }

ag_status ag_nvrtc_options_make(const char *arch, ag_nvrtc_options *out, ag_error *err) {
  ag_status st = ag_arch_check(arch, err);
  if (st != AG_OK) return st;
  memset(out, 0, sizeof *out);
  snprintf(out->opt[out->count++], AG_NVRTC_OPTION_MAX, "--gpu-architecture=%s", arch);
  snprintf(out->opt[out->count++], AG_NVRTC_OPTION_MAX, "-std=c++17");
  if (ag_env_flag(AG_ENV_NVRTC_VERBOSE))
    snprintf(out->opt[out->count++], AG_NVRTC_OPTION_MAX, "--ptxas-options=-v");
  qsort(out->opt, out->count, sizeof out->opt[0], cmp_option);
  return AG_OK;
}

ag_status ag_nvrtc_version(int *out_major, int *out_minor, ag_error *err) {
  const ag_nvrtc_table *t;
  ag_status st = ag_nvrtc_lib(&t, err);
  if (st != AG_OK) return st;
  nvrtcResult r = t->nvrtcVersion(out_major, out_minor);
  if (r != NVRTC_SUCCESS)
    return ag_fail(err, AG_ERR_NVRTC, "nvrtcVersion failed: %s", t->nvrtcGetErrorString(r));
  return AG_OK;
}

/* "<dir>/<name><ext>" with anything but [A-Za-z0-9_.-] in name replaced. */
static void dump_path(ag_buf *b, const char *dir, const char *name, const char *ext) {
  ag_buf_printf(b, "%s/", dir);
  for (const char *p = name; *p; p++) {
    char c = isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.' ? *p : '_';
    ag_buf_append(b, &c, 1);
  }
  ag_buf_puts(b, ext);
}

/* Write the source and log into $ATTNGEN_DUMP_DIR. On success *out_where
 * names the source file (malloc()ed); AG_ERR_IO/NOMEM otherwise. */
static ag_status dump(const char *dir, const char *name, const char *source, const char *log,
                      char **out_where, ag_error *err) {
  ag_buf cu, lg;
  ag_buf_init(&cu);
  ag_buf_init(&lg);
  ag_status st = ag_mkdir_p(dir, 0777, err);
  if (st != AG_OK) goto fail;
  dump_path(&cu, dir, name, ".cu");
  dump_path(&lg, dir, name, ".log");
  if (cu.failed || lg.failed) {
    st = ag_fail(err, AG_ERR_NOMEM, "out of memory");
    goto fail;
  }
  const void *parts[] = {source, log};
  size_t lens[] = {strlen(source), strlen(log)};
  st = ag_write_atomic(cu.data, &parts[0], &lens[0], 1, err);
  if (st == AG_OK) st = ag_write_atomic(lg.data, &parts[1], &lens[1], 1, err);
  if (st != AG_OK) goto fail;
  *out_where = ag_buf_take(&cu);
  if (!*out_where) st = ag_fail(err, AG_ERR_NOMEM, "out of memory");
fail:
  ag_buf_free(&cu);
  ag_buf_free(&lg);
  return st;
}

/* The program's log, trailing blanks removed; "" when there is none. */
static char *fetch_log(const ag_nvrtc_table *t, nvrtcProgram prog) {
  size_t size = 0;
  if (t->nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS) size = 0;
  char *log = calloc(size + 1, 1);
  if (!log) return NULL;
  if (size && t->nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = '\0';
  size_t n = strlen(log);
  while (n > 0 && isspace((unsigned char)log[n - 1])) log[--n] = '\0';
  return log;
}

ag_status ag_nvrtc_compile(const char *source, const char *program_name, const char *arch,
                           void **out_cubin, size_t *out_size, ag_error *err) {
  return ag_nvrtc_compile_ex(source, program_name, arch, out_cubin, out_size, NULL, err);
}

ag_status ag_nvrtc_compile_ex(const char *source, const char *program_name, const char *arch,
                              void **out_cubin, size_t *out_size, char **out_warning,
                              ag_error *err) {
  ag_status st;
  nvrtcProgram prog = NULL;
  const ag_nvrtc_table *t = NULL;
  char *log = NULL, *dumped = NULL, *cubin = NULL;
  ag_buf file;
  ag_buf_init(&file);
  ag_nvrtc_options opts;
  *out_cubin = NULL;
  *out_size = 0;
  if (out_warning) *out_warning = NULL;
  if (!source || !program_name) {
    st = ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_nvrtc_compile: source and name are required");
    goto fail;
  }
  st = ag_nvrtc_options_make(arch, &opts, err);
  if (st != AG_OK) goto fail;
  st = ag_nvrtc_lib(&t, err);
  if (st != AG_OK) goto fail;
  ag_buf_printf(&file, "%s.cu", program_name);
  if (file.failed) {
    st = ag_fail(err, AG_ERR_NOMEM, "out of memory");
    goto fail;
  }
  nvrtcResult r = t->nvrtcCreateProgram(&prog, source, file.data, 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    prog = NULL;
    st = ag_fail(err, r == NVRTC_ERROR_OUT_OF_MEMORY ? AG_ERR_NOMEM : AG_ERR_NVRTC,
                 "nvrtcCreateProgram failed for %s: %s", file.data, t->nvrtcGetErrorString(r));
    goto fail;
  }
  const char *argv[AG_NVRTC_MAX_OPTIONS];
  for (size_t i = 0; i < opts.count; i++) argv[i] = opts.opt[i];
  nvrtcResult compiled = t->nvrtcCompileProgram(prog, (int)opts.count, argv);
  log = fetch_log(t, prog); /* before looking at the result */
  if (!log) {
    st = ag_fail(err, AG_ERR_NOMEM, "out of memory");
    goto fail;
  }
  const char *dump_dir = ag_env_str(AG_ENV_DUMP_DIR);
  ag_error dump_err = {0};
  ag_status dumped_st = AG_OK;
  if (dump_dir) dumped_st = dump(dump_dir, program_name, source, log, &dumped, &dump_err);
  if (compiled != NVRTC_SUCCESS) {
    ag_buf msg;
    ag_buf_init(&msg);
    ag_buf_printf(&msg, "NVRTC could not compile %s for %s (%s)", file.data, arch,
                  t->nvrtcGetErrorString(compiled));
    if (log[0]) ag_buf_printf(&msg, ":\n%s", log);
    if (dumped)
      ag_buf_printf(&msg, "\nsource and log dumped to %s and %.*s.log", dumped,
                    (int)(strlen(dumped) - 3), dumped);
    else if (dump_dir)
      ag_buf_printf(&msg, "\n(could not dump to %s: %s)", dump_dir, dump_err.message);
    else
      ag_buf_printf(&msg, "\n(set %s=DIR to keep the source and log)", AG_ENV_DUMP_DIR);
    ag_error_clear(&dump_err);
    char *text = ag_buf_take(&msg);
    st = text ? ag_fail_take(err, AG_ERR_NVRTC, text) : ag_fail(err, AG_ERR_NOMEM, "out of memory");
    goto fail;
  }
  if (dumped_st != AG_OK) {
    /* The compile itself succeeded: an unusable dump directory is a warning
     * (as an unusable cache is), never a failed compile. */
    if (out_warning) {
      ag_buf w;
      ag_buf_init(&w);
      ag_buf_printf(&w, "%s is set, but the dump failed: %s", AG_ENV_DUMP_DIR,
                    dump_err.message ? dump_err.message : ag_strerror(dumped_st));
      *out_warning = ag_buf_take(&w); /* NULL when out of memory: the warning is lost */
    }
    ag_error_clear(&dump_err);
  }
  size_t size = 0;
  r = t->nvrtcGetCUBINSize(prog, &size);
  if (r != NVRTC_SUCCESS || size == 0) {
    st = ag_fail(err, AG_ERR_NVRTC, "NVRTC produced no cubin for %s (%s): %s", file.data, arch,
                 r != NVRTC_SUCCESS ? t->nvrtcGetErrorString(r) : "empty");
    goto fail;
  }
  cubin = malloc(size);
  if (!cubin) {
    st = ag_fail(err, AG_ERR_NOMEM, "out of memory (%zu-byte cubin)", size);
    goto fail;
  }
  r = t->nvrtcGetCUBIN(prog, cubin);
  if (r != NVRTC_SUCCESS) {
    st = ag_fail(err, AG_ERR_NVRTC, "nvrtcGetCUBIN failed for %s: %s", file.data,
                 t->nvrtcGetErrorString(r));
    goto fail;
  }
  *out_cubin = cubin;
  *out_size = size;
  cubin = NULL;
  st = AG_OK;
fail:
  if (prog) t->nvrtcDestroyProgram(&prog);
  free(cubin);
  free(log);
  free(dumped);
  ag_buf_free(&file);
  if (st != AG_OK && out_warning) {
    free(*out_warning);
    *out_warning = NULL;
  }
  return st;
}
