// SPDX-License-Identifier: BSD-3-Clause
/* expand.h: a small, strict template engine over the embedded templates.
 *
 * Syntax (each directive on a line of its own, leading blanks allowed):
 *   @NAME@            replaced by the variable NAME ([A-Z][A-Z0-9_]*)
 *   @@                a literal '@'
 *   @if NAME@ / @else@ / @endif@   keep lines when NAME is set and not "0"
 *   @include FILE@    expand another template with the same variables
 *   @# text           a template comment, dropped from the output
 * An unknown variable, an unterminated placeholder, an unbalanced @if, an
 * unknown include or include nesting deeper than 8 is an error. */
#ifndef AG_EXPAND_H
#define AG_EXPAND_H

#include "internal.h"

typedef struct ag_tpl_var {
  const char *name;
  const char *value;
} ag_tpl_var;

/* Expand the embedded template `name`, appending to out. Errors name the
 * template and line: "block_fwd.cu:12: unknown placeholder '@FOO@'". */
ag_status ag_expand(const char *name, const ag_tpl_var *vars, size_t nvars, ag_buf *out,
                    ag_error *err);
/* As ag_expand, over given text (`name` is used in messages and to resolve
 * nothing else; includes still come from the embedded set). */
ag_status ag_expand_text(const char *name, const char *text, const ag_tpl_var *vars,
                         size_t nvars, ag_buf *out, ag_error *err);

#endif
