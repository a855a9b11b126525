// SPDX-License-Identifier: BSD-3-Clause
/* spec_internal.h: what the spec parser (spec_parse.c) hands the checker
 * (spec_check.c): a plain YAML tree with the source position of every node,
 * and the list of diagnostics that both add to and render. */
#ifndef AG_SPEC_INTERNAL_H
#define AG_SPEC_INTERNAL_H

#include <stddef.h>
#include "internal.h"

#define SPEC_MAX_BYTES (1024u * 1024u) /* larger inputs are rejected unread */
#define SPEC_MAX_DEPTH 8               /* nested mappings and lists */
#define SPEC_MAX_NODES 4096            /* scalars, aliases and collections */
#define SPEC_MAX_DIAGS 50              /* the first ones, in document order */

/* ---- the tree ----------------------------------------------------------- */

typedef enum spec_kind { SPEC_SCALAR, SPEC_LIST, SPEC_MAP } spec_kind;

typedef struct spec_node spec_node;
typedef struct spec_pair {
  spec_node *key, *value;
} spec_pair;

struct spec_node {
  spec_kind kind;
  ag_pos pos;        /* where the node starts, 1-based */
  bool quoted;       /* scalar not written plain (quotes, | or >) */
  char *text;        /* scalar: NUL-terminated; may hold NULs from escapes */
  size_t len;        /* scalar: bytes in text */
  size_t count, cap; /* list: items; map: pairs */
  spec_node **items; /* list */
  spec_pair *pairs;  /* map, in document order; duplicates kept */
};

/* ---- diagnostics ---------------------------------------------------------- */

typedef struct spec_diag {
  ag_pos pos;
  size_t seq;       /* order of addition: ties keep it */
  bool unsupported; /* "not supported yet", not an error in the spec */
  char *message;    /* from malloc() */
} spec_diag;

/* The SPEC_MAX_DIAGS earliest diagnostics by position, and a count of all. */
typedef struct spec_diags {
  spec_diag items[SPEC_MAX_DIAGS];
  size_t count;       /* kept in items */
  size_t total;       /* ever added */
  size_t errors;      /* added with unsupported false */
  bool nomem;         /* a message could not be allocated */
} spec_diags;

void spec_diags_init(spec_diags *d);
void spec_diags_free(spec_diags *d);
/* Add one diagnostic at pos; an error unless `unsupported`. */
void spec_diag_add(spec_diags *d, ag_pos pos, bool unsupported, const char *fmt, ...)
    AG_PRINTF(4, 5);
/* Render every kept diagnostic in document order as
 * "path:line:col: error: message\n<source line>\n<caret>\n", then a note
 * when some were dropped. Returns a string from malloc(), NULL on no memory. */
char *spec_diags_render(const spec_diags *d, const char *path, const char *text,
                        size_t len);

/* ---- parsing -------------------------------------------------------------- */

/* Parse `len` bytes of YAML (no BOM) into a tree. Returns AG_OK with
 * *out_root set (NULL when the stream holds no document), AG_ERR_SPEC after
 * adding diagnostics (bad UTF-8 or control characters, YAML syntax, more
 * than one document, anchors, aliases, tags, nesting deeper than
 * SPEC_MAX_DEPTH, more than SPEC_MAX_NODES nodes), or AG_ERR_NOMEM. The
 * caller frees the tree with spec_node_free(). */
ag_status spec_parse(const char *text, size_t len, spec_diags *diags,
                     spec_node **out_root);
/* Frees a tree; accepts NULL. */
void spec_node_free(spec_node *node);

#endif
