// SPDX-License-Identifier: BSD-3-Clause
/* dl_table.c: a struct of function pointers filled by name from a
 * dlopen()ed library, the one lookup behind driver.c's Driver API table
 * and nvrtc_lib.c's NVRTC table. */
#include <dlfcn.h>
#include <string.h>

#include "runtime.h"

const char *ag_dl_table_fill(void *lib, const ag_dl_symbol *symbols, size_t count, void *table) {
  for (size_t i = 0; i < count; i++) {
    void *fn = dlsym(lib, symbols[i].name);
    if (!fn) {
      dlclose(lib);
      return symbols[i].name;
    }
    /* POSIX: dlsym's void * holds a function's address, and converts to a
     * function pointer of the same size. */
    memcpy((char *)table + symbols[i].offset, &fn, sizeof fn);
  }
  return NULL;
}
