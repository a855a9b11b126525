// SPDX-License-Identifier: BSD-3-Clause
/* cli.h: what the CLI's commands share (cli/main.c): output files, messages
 * with names escaped, exit codes. */
#ifndef AG_CLI_H
#define AG_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "attngen.h"

/* Write data to path ("-": stdout) as `emit -o` does; 0 or 1 (message printed). */
int cli_write_output(const char *path, const void *data, size_t len);
/* Print the error (escaped) and clear it; the command's exit code. */
int cli_report(ag_error *err);
/* A usage error: fmt with one string, escaped; exit code 2. */
int cli_usage(const char *fmt, const char *arg);
/* "attngen: <what>" on stderr; exit code 1. */
int cli_fail(const char *what);
/* "attngen: warning: <text>" on stderr, escaped. */
void cli_warn(const char *text);
/* name escaped, then rest, to f. */
void cli_print_name(FILE *f, const char *name, const char *rest);
/* mkdir -p; 0, or 1 with a message. */
int cli_mkdirs(const char *dir);

/* attngen build (cli/build.c). */
int cli_build(int argc, char **argv);

#endif
