// SPDX-License-Identifier: BSD-3-Clause
/* templates.h: the CUDA C templates embedded at build time (see
 * tools/embed.c), looked up by file name. */
#ifndef AG_TEMPLATES_H
#define AG_TEMPLATES_H

typedef struct ag_template {
  const char *name; /* file name under templates/, e.g. "block_fwd.cu" */
  const char *text;
} ag_template;

/* Terminated by an entry whose name is NULL. */
extern const ag_template ag_templates[];

/* The template's text, or NULL when there is none of that name. */
const char *ag_template_find(const char *name);

#endif
