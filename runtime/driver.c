// SPDX-License-Identifier: BSD-3-Clause
/* driver.c: the CUDA Driver API through dlopen("libcuda.so.1"), loaded and
 * initialised once per process, so that everything short of a launch works
 * on machines without a driver. Never link -lcuda: cuda.h gives types only. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "runtime.h"

/* Stringify after expansion: cuMemAlloc becomes "cuMemAlloc_v2". */
#define AG_SYMBOL_NAME_(fn) AG_STR_(fn),
static const char *const symbol_names[] = {AG_DRIVER_FUNCS(AG_SYMBOL_NAME_)};
#define AG_DRIVER_SYMBOL_(fn) AG_DL_SYMBOL(ag_driver, fn)
static const ag_dl_symbol symbols[] = {AG_DRIVER_FUNCS(AG_DRIVER_SYMBOL_)};

/* Written only inside pthread_once, read-only afterwards. */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static ag_driver table;
static ag_status load_status = AG_ERR_NO_DRIVER;
static char load_message[512];

const char *const *ag_driver_symbols(size_t *out_count) {
  if (out_count) *out_count = sizeof symbol_names / sizeof symbol_names[0];
  return symbol_names;
}

/* "CUDA_ERROR_X: description" for r, even when the table is incomplete. */
static void describe(const ag_driver *d, CUresult r, char *out, size_t cap) {
  const char *name = NULL, *text = NULL;
  if (d && d->cuGetErrorName && d->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  if (d && d->cuGetErrorString && d->cuGetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
  if (name)
    snprintf(out, cap, "%s: %s", name, text ? text : "no description");
  else if (r == CUDA_ERROR_STUB_LIBRARY) /* the stub cannot name its own error */
    snprintf(out, cap,
             "CUDA_ERROR_STUB_LIBRARY: the loaded libcuda is the toolkit's stub, "
             "not a real driver");
  else
    snprintf(out, cap, "CUresult %d", (int)r);
}

static void load(void) {
  const char *path = ag_env_str(AG_ENV_LIBCUDA);
  const char *shown = path ? path : "libcuda.so.1";
  void *lib = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *why = dlerror();
    snprintf(load_message, sizeof load_message, "cannot load the CUDA driver (%s): %s%s", shown,
             why ? why : "unknown reason", path ? " (path from " AG_ENV_LIBCUDA ")" : "");
    return;
  }
  ag_driver d;
  memset(&d, 0, sizeof d);
  const char *missing = ag_dl_table_fill(lib, symbols, sizeof symbols / sizeof symbols[0], &d);
  if (missing) { /* lib is closed */
    snprintf(load_message, sizeof load_message, "the CUDA driver %s lacks %s (driver too old?)",
             shown, missing);
    return;
  }
  d.cuTensorMapEncodeTiled =
      (__typeof__(d.cuTensorMapEncodeTiled))dlsym(lib, AG_STR_(cuTensorMapEncodeTiled));
  CUresult r = d.cuInit(0);
  if (r == CUDA_SUCCESS) r = d.cuDriverGetVersion(&d.version);
  if (r != CUDA_SUCCESS) {
    char why[256];
    describe(&d, r, why, sizeof why);
    snprintf(load_message, sizeof load_message, "cuInit failed (driver %s): %s", shown, why);
    load_status = r == CUDA_ERROR_NO_DEVICE ? AG_ERR_NO_DEVICE : AG_ERR_NO_DRIVER;
    return; /* the library stays loaded: the table may describe errors */
  }
  table = d;
  load_status = AG_OK;
}

ag_status ag_driver_get(const ag_driver **out_driver, ag_error *err) {
  pthread_once(&once, load);
  if (out_driver) *out_driver = load_status == AG_OK ? &table : NULL;
  if (load_status != AG_OK) return ag_fail(err, load_status, "%s", load_message);
  return AG_OK;
}

ag_status ag_cuda_check(ag_error *err, CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return AG_OK;
  const ag_driver *d = NULL;
  ag_driver_get(&d, NULL);
  char why[256];
  describe(d, r, why, sizeof why);
  return ag_fail(err, AG_ERR_CUDA, "%s failed: %s", what, why);
}
