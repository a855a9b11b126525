// SPDX-License-Identifier: BSD-3-Clause
/* nvrtc_lib.c: NVRTC through dlopen, loaded once per process on the first
 * compile, so that a program that only loads prebuilt kernels (attngen
 * build, ag_kernel_from_images) or only generates source needs no
 * libnvrtc at all. Never link -lnvrtc: nvrtc.h gives types only. The
 * library is ATTNGEN_LIBNVRTC when set, else libnvrtc.so.<major> of the
 * toolkit attngen was built with (through the loader's path and this
 * library's RUNPATH), else libnvrtc.so, else the build toolkit's own copy. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h> /* CUDA_VERSION: the toolkit's major version names the library */

#include "runtime.h"

#ifndef AG_NVRTC_DIR
#define AG_NVRTC_DIR "/usr/local/cuda/lib64"
#endif

/* Written only inside pthread_once, read-only afterwards. */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static ag_nvrtc_table table;
static bool loaded; /* also read by ag_nvrtc_lib_loaded, atomically */
static char load_message[640];
#define AG_NVRTC_SYMBOL_(fn) AG_DL_SYMBOL(ag_nvrtc_table, fn)
static const ag_dl_symbol symbols[] = {AG_NVRTC_FUNCS(AG_NVRTC_SYMBOL_)};

static void load(void) {
  char soname[32], fallback[512];
  snprintf(soname, sizeof soname, "libnvrtc.so.%d", CUDA_VERSION / 1000);
  snprintf(fallback, sizeof fallback, "%s/%s", AG_NVRTC_DIR, soname);
  const char *env = ag_env_str(AG_ENV_LIBNVRTC);
  const char *const tries[] = {env, env ? NULL : soname, env ? NULL : "libnvrtc.so",
                               env ? NULL : fallback};
  void *lib = NULL;
  const char *why = NULL;
  for (size_t i = 0; i < sizeof tries / sizeof tries[0] && !lib; i++) {
    if (!tries[i]) continue;
    lib = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib && !why) why = dlerror(); /* the first failure says most */
  }
  if (!lib) {
    snprintf(load_message, sizeof load_message,
             "cannot load NVRTC (%s): %s; install the CUDA toolkit's NVRTC or set %s to "
             "its path",
             env ? env : soname, why ? why : "unknown reason", AG_ENV_LIBNVRTC);
    return;
  }
  ag_nvrtc_table t;
  memset(&t, 0, sizeof t);
  const char *missing = ag_dl_table_fill(lib, symbols, sizeof symbols / sizeof symbols[0], &t);
  if (missing) { /* lib is closed */
    snprintf(load_message, sizeof load_message, "the NVRTC library %s lacks %s",
             env ? env : soname, missing);
    return;
  }
  table = t; /* the library stays loaded for the life of the process */
  __atomic_store_n(&loaded, true, __ATOMIC_RELEASE);
}

bool ag_nvrtc_lib_loaded(void) { return __atomic_load_n(&loaded, __ATOMIC_ACQUIRE); }

ag_status ag_nvrtc_lib(const ag_nvrtc_table **out, ag_error *err) {
  pthread_once(&once, load);
  *out = loaded ? &table : NULL;
  return loaded ? AG_OK : ag_fail(err, AG_ERR_NVRTC, "%s", load_message);
}
