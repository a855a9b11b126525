// SPDX-License-Identifier: BSD-3-Clause
/* version.c: the library's version as it was built (ag_version), for
 * programs and bindings to compare with the header they were built with. */
#include "attngen.h"

const char *ag_version(void) { return AG_VERSION_STRING; }
