// SPDX-License-Identifier: BSD-3-Clause
/* spec_parse.c: YAML text to a plain tree with source positions (libyaml's
 * event API), and the diagnostics list that shows each problem with its
 * source line and a caret. Knows YAML and UTF-8, nothing about attention. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "spec_internal.h"

/* ---- walking the source as libyaml does -------------------------------- */

/* Width of the line break at s[0..n), 0 if none. libyaml counts CR LF, CR,
 * LF, NEL, LS and PS as breaks; positions must agree with its marks. */
static size_t break_width(const unsigned char *s, size_t n) {
  if (n >= 2 && s[0] == '\r' && s[1] == '\n') return 2;
  if (s[0] == '\r' || s[0] == '\n') return 1;
  if (n >= 2 && s[0] == 0xC2 && s[1] == 0x85) return 2;
  if (n >= 3 && s[0] == 0xE2 && s[1] == 0x80 && (s[2] == 0xA8 || s[2] == 0xA9)) return 3;
  return 0;
}

/* Decode one UTF-8 character: its width and *cp, or 0 when s[0] does not
 * start a valid, shortest-form sequence of a scalar value. */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
  size_t w;
  uint32_t v, min;
  if (s[0] < 0x80) {
    *cp = s[0];
    return 1;
  } else if ((s[0] & 0xE0) == 0xC0) {
    w = 2, v = s[0] & 0x1F, min = 0x80;
  } else if ((s[0] & 0xF0) == 0xE0) {
    w = 3, v = s[0] & 0x0F, min = 0x800;
  } else if ((s[0] & 0xF8) == 0xF0) {
    w = 4, v = s[0] & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (n < w) return 0;
  for (size_t i = 1; i < w; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return w;
}

/* The characters libyaml accepts in a stream. */
static bool yaml_printable(uint32_t c) {
  return c == 0x09 || c == 0x0A || c == 0x0D || (c >= 0x20 && c <= 0x7E) || c == 0x85 ||
         (c >= 0xA0 && c <= 0xD7FF) || (c >= 0xE000 && c <= 0xFFFD) ||
         (c >= 0x10000 && c <= 0x10FFFF);
}

/* A cursor over the source: byte offset and the 1-based position there. */
typedef struct cursor {
  const unsigned char *s;
  size_t n, i;
  ag_pos pos;
} cursor;

static void cursor_init(cursor *c, const char *text, size_t len) {
  c->s = (const unsigned char *)text;
  c->n = len;
  c->i = 0;
  c->pos = (ag_pos){1, 1};
}

/* Step over one break or one character (an invalid byte counts as one). */
static void cursor_step(cursor *c) {
  uint32_t cp;
  unsigned char ch = c->s[c->i];
  if (ch < 0x80 && ch != '\r' && ch != '\n') { /* the common case */
    c->i++;
    c->pos.col++;
    return;
  }
  size_t w = break_width(c->s + c->i, c->n - c->i);
  if (w) {
    c->i += w;
    c->pos.line++;
    c->pos.col = 1;
    return;
  }
  w = utf8_decode(c->s + c->i, c->n - c->i, &cp);
  c->i += w ? w : 1;
  c->pos.col++;
}

/* The 66 noncharacters: U+FDD0..U+FDEF and the last two code points of
 * every plane (U+FFFE, U+FFFF, U+1FFFE, ..., U+10FFFF). */
static bool noncharacter(uint32_t c) {
  return (c >= 0xFDD0 && c <= 0xFDEF) || (c & 0xFFFE) == 0xFFFE;
}

/* Reject what libyaml's reader would, with a clean message and position:
 * NUL bytes, invalid UTF-8 and control characters; also noncharacters,
 * and any byte-order mark (the loader skips the one a spec may start
 * with; libyaml would skip another at the start of any line, or fail with
 * "expected <document start>" on a doubled one). */
static bool prescan(const char *text, size_t len, spec_diags *diags) {
  cursor c;
  cursor_init(&c, text, len);
  while (c.i < c.n) {
    const unsigned char *p = c.s + c.i;
    uint32_t cp;
    if (!break_width(p, c.n - c.i)) {
      if (*p == 0) {
        spec_diag_add(diags, c.pos, false, "NUL bytes are not allowed in specs");
        return false;
      }
      if (!utf8_decode(p, c.n - c.i, &cp)) {
        spec_diag_add(diags, c.pos, false, "invalid UTF-8 (byte 0x%02X)", *p);
        return false;
      }
      if (noncharacter(cp)) {
        spec_diag_add(diags, c.pos, false, "noncharacter U+%04X is not allowed", (unsigned)cp);
        return false;
      }
      if (cp == 0xFEFF) { /* the loader has skipped one at the start */
        if (c.i == 0)
          spec_diag_add(diags, c.pos, false,
                        "a second byte-order mark (U+FEFF): the spec starts with two");
        else
          spec_diag_add(diags, c.pos, false,
                        "byte-order mark U+FEFF is allowed only at the start of the spec");
        return false;
      }
      if (!yaml_printable(cp)) {
        spec_diag_add(diags, c.pos, false, "control character U+%04X is not allowed",
                      (unsigned)cp);
        return false;
      }
    }
    cursor_step(&c);
  }
  return true;
}

/* ---- diagnostics --------------------------------------------------------- */

void spec_diags_init(spec_diags *d) { memset(d, 0, sizeof *d); }

void spec_diags_free(spec_diags *d) {
  for (size_t i = 0; i < d->count; i++) free(d->items[i].message);
  spec_diags_init(d);
}

static bool diag_before(const spec_diag *a, const spec_diag *b) {
  if (a->pos.line != b->pos.line) return a->pos.line < b->pos.line;
  if (a->pos.col != b->pos.col) return a->pos.col < b->pos.col;
  return a->seq < b->seq;
}

void spec_diag_add(spec_diags *d, ag_pos pos, bool unsupported, const char *fmt, ...) {
  spec_diag nd = {pos, d->total++, unsupported, NULL};
  if (!unsupported) d->errors++;
  size_t slot = d->count;
  if (slot == SPEC_MAX_DIAGS) { /* full: replace the latest if this is earlier */
    slot = 0;
    for (size_t i = 1; i < d->count; i++)
      if (diag_before(&d->items[slot], &d->items[i])) slot = i;
    if (!diag_before(&nd, &d->items[slot])) return;
  }
  va_list ap;
  va_start(ap, fmt);
  nd.message = ag_vformat(fmt, ap);
  va_end(ap);
  if (!nd.message) {
    d->nomem = true;
    return;
  }
  if (slot == d->count) {
    d->count++;
  } else {
    free(d->items[slot].message);
  }
  d->items[slot] = nd;
}

static int diag_cmp(const void *a, const void *b) {
  const spec_diag *x = *(const spec_diag *const *)a, *y = *(const spec_diag *const *)b;
  return diag_before(x, y) ? -1 : diag_before(y, x) ? 1 : 0;
}

#define SHOWN_CHARS 100 /* longer lines show a window around the caret */

/* Append the source line of pos and a caret under its column. Bytes that
 * would not print (invalid UTF-8, control characters) show as '?'; tabs are
 * kept and copied into the caret line so the caret stays aligned. */
static void show_line(ag_buf *b, const char *text, size_t len, ag_pos pos) {
  cursor c;
  cursor_init(&c, text, len);
  while (c.i < c.n && c.pos.line < pos.line) cursor_step(&c);
  if (c.pos.line < pos.line) c.i = c.n; /* past the end: an empty line */
  /* Count characters only as far as a window around the caret can reach. */
  size_t start = c.i, nchars = 0, target = pos.col > 0 ? (size_t)pos.col - 1 : 0;
  while (c.i < c.n && nchars <= target + SHOWN_CHARS && !break_width(c.s + c.i, c.n - c.i)) {
    cursor_step(&c);
    nchars++;
  }
  size_t end = c.i, first = 0, last = nchars;
  if (nchars > SHOWN_CHARS) {
    first = target > SHOWN_CHARS / 2 ? target - SHOWN_CHARS / 2 : 0;
    if (first > nchars - SHOWN_CHARS) first = nchars - SHOWN_CHARS;
    last = first + SHOWN_CHARS;
  }
  ag_buf caret;
  ag_buf_init(&caret);
  if (first > 0) {
    ag_buf_puts(b, "...");
    ag_buf_puts(&caret, "   ");
  }
  size_t k = 0;
  for (size_t i = start; i < end; k++) {
    const unsigned char *p = (const unsigned char *)text + i;
    uint32_t cp;
    size_t w = utf8_decode(p, end - i, &cp);
    bool shown = k >= first && k < last;
    bool ok = w && yaml_printable(cp) && (cp >= 0x20 || cp == '\t') && cp != 0xFEFF &&
              !noncharacter(cp);
    if (shown) ag_buf_append(b, ok ? (const char *)p : "?", ok ? w : 1);
    if (shown && k < target) ag_buf_puts(&caret, cp == '\t' && w ? "\t" : " ");
    i += w ? w : 1;
  }
  if (last < nchars) ag_buf_puts(b, "...");
  for (; k < target; k++) ag_buf_puts(&caret, " ");
  ag_buf_puts(&caret, "^");
  ag_buf_puts(b, "\n");
  if (caret.failed) b->failed = true;
  else ag_buf_append(b, caret.data, caret.len);
  ag_buf_puts(b, "\n");
  ag_buf_free(&caret);
}

char *spec_diags_render(const spec_diags *d, const char *path, const char *text,
                        size_t len) {
  const spec_diag *order[SPEC_MAX_DIAGS];
  for (size_t i = 0; i < d->count; i++) order[i] = &d->items[i];
  qsort(order, d->count, sizeof order[0], diag_cmp);
  ag_buf b;
  ag_buf_init(&b);
  for (size_t i = 0; i < d->count; i++) {
    const spec_diag *g = order[i];
    ag_buf_printf(&b, "%s:%d:%d: error: %s%s\n", path, g->pos.line, g->pos.col,
                  g->unsupported ? "not supported yet: " : "", g->message);
    show_line(&b, text, len, g->pos);
  }
  if (d->total > d->count)
    ag_buf_printf(&b, "%s: note: %zu more errors not shown\n", path, d->total - d->count);
  return ag_buf_take(&b);
}

/* ---- the tree ------------------------------------------------------------- */

void spec_node_free(spec_node *node) {
  if (!node) return;
  for (size_t i = 0; i < node->count; i++) {
    if (node->kind == SPEC_LIST) {
      spec_node_free(node->items[i]);
    } else {
      spec_node_free(node->pairs[i].key);
      spec_node_free(node->pairs[i].value);
    }
  }
  free(node->items);
  free(node->pairs);
  free(node->text);
  free(node);
}

static ag_pos mark_pos(yaml_mark_t m) {
  return (ag_pos){(int)m.line + 1, (int)m.column + 1};
}

static spec_node *node_new(spec_kind kind, yaml_mark_t start, const char *text,
                           size_t len) {
  spec_node *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  n->kind = kind;
  n->pos = mark_pos(start);
  if (kind == SPEC_SCALAR) {
    n->text = malloc(len + 1);
    if (!n->text) goto fail;
    if (len) memcpy(n->text, text, len);
    n->text[len] = '\0';
    n->len = len;
  }
  return n;
fail:
  free(n);
  return NULL;
}

/* Append child to a list, or to a map as a key or as the pending key's
 * value. Takes the child even on failure. */
static bool node_add(spec_node *parent, spec_node *child) {
  if (parent->kind == SPEC_MAP && parent->count &&
      !parent->pairs[parent->count - 1].value) {
    parent->pairs[parent->count - 1].value = child;
    return true;
  }
  if (parent->count == parent->cap) {
    size_t cap = parent->cap ? parent->cap * 2 : 4;
    void *p = parent->kind == SPEC_LIST
                  ? realloc(parent->items, cap * sizeof *parent->items)
                  : realloc(parent->pairs, cap * sizeof *parent->pairs);
    if (!p) goto fail;
    if (parent->kind == SPEC_LIST) parent->items = p;
    else parent->pairs = p;
    parent->cap = cap;
  }
  if (parent->kind == SPEC_LIST) parent->items[parent->count++] = child;
  else parent->pairs[parent->count++] = (spec_pair){child, NULL};
  return true;
fail:
  spec_node_free(child);
  return false;
}

/* ---- events to tree ------------------------------------------------------- */

typedef struct builder {
  spec_diags *diags;
  spec_node *root;
  spec_node *open[SPEC_MAX_DEPTH]; /* collections being filled */
  int depth;
  int documents;
  int nodes;
  bool said_anchor, said_tag; /* each reported once */
  bool nomem;
} builder;

/* Place a finished or newly opened node in the tree. */
static bool place(builder *b, spec_node *n) {
  if (!n) {
    b->nomem = true;
    return false;
  }
  if (b->depth == 0) {
    b->root = n; /* one document, one root */
    return true;
  }
  if (!node_add(b->open[b->depth - 1], n)) {
    b->nomem = true;
    return false;
  }
  return true;
}

static void check_props(builder *b, const yaml_event_t *ev, const yaml_char_t *anchor,
                        const yaml_char_t *tag) {
  if (anchor && !b->said_anchor) {
    spec_diag_add(b->diags, mark_pos(ev->start_mark), false,
                  "anchors and aliases are not allowed in specs");
    b->said_anchor = true;
  }
  if (tag && !b->said_tag) {
    spec_diag_add(b->diags, mark_pos(ev->start_mark), false,
                  "explicit tags are not allowed in specs");
    b->said_tag = true;
  }
}

/* Handle one event; false stops parsing (stream end, fatal problem). */
static bool on_event(builder *b, const yaml_event_t *ev) {
  spec_node *n;
  if ((ev->type == YAML_ALIAS_EVENT || ev->type == YAML_SCALAR_EVENT ||
       ev->type == YAML_SEQUENCE_START_EVENT || ev->type == YAML_MAPPING_START_EVENT) &&
      ++b->nodes > SPEC_MAX_NODES) {
    spec_diag_add(b->diags, mark_pos(ev->start_mark), false,
                  "spec has more than %d nodes", SPEC_MAX_NODES);
    return false;
  }
  switch (ev->type) {
  case YAML_STREAM_END_EVENT:
    return false;
  case YAML_DOCUMENT_START_EVENT:
    if (++b->documents > 1) {
      spec_diag_add(b->diags, mark_pos(ev->start_mark), false,
                    "a spec must be a single YAML document");
      return false;
    }
    return true;
  case YAML_ALIAS_EVENT:
    check_props(b, ev, ev->data.alias.anchor, NULL);
    return place(b, node_new(SPEC_SCALAR, ev->start_mark, "", 0));
  case YAML_SCALAR_EVENT:
    check_props(b, ev, ev->data.scalar.anchor, ev->data.scalar.tag);
    n = node_new(SPEC_SCALAR, ev->start_mark, (const char *)ev->data.scalar.value,
                 ev->data.scalar.length);
    if (n) n->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
    return place(b, n);
  case YAML_SEQUENCE_START_EVENT:
  case YAML_MAPPING_START_EVENT:
    if (ev->type == YAML_SEQUENCE_START_EVENT)
      check_props(b, ev, ev->data.sequence_start.anchor, ev->data.sequence_start.tag);
    else
      check_props(b, ev, ev->data.mapping_start.anchor, ev->data.mapping_start.tag);
    if (b->depth == SPEC_MAX_DEPTH) {
      spec_diag_add(b->diags, mark_pos(ev->start_mark), false,
                    "nesting is deeper than %d levels", SPEC_MAX_DEPTH);
      return false;
    }
    n = node_new(ev->type == YAML_SEQUENCE_START_EVENT ? SPEC_LIST : SPEC_MAP,
                 ev->start_mark, NULL, 0);
    if (!place(b, n)) return false;
    b->open[b->depth++] = n;
    return true;
  case YAML_SEQUENCE_END_EVENT:
  case YAML_MAPPING_END_EVENT:
    if (b->depth > 0) b->depth--;
    return true;
  default:
    return true;
  }
}

/* Report a libyaml failure. Reader errors carry a byte offset, the others
 * a mark; a tab where a token should start gets its own message. */
static void report_yaml_error(const yaml_parser_t *p, const char *text, size_t len,
                              spec_diags *diags) {
  if (p->error == YAML_READER_ERROR) { /* prescan should have caught it */
    cursor c;
    cursor_init(&c, text, len);
    while (c.i < c.n && c.i < p->problem_offset) cursor_step(&c);
    spec_diag_add(diags, c.pos, false, "invalid input: %s",
                  p->problem ? p->problem : "unreadable");
    return;
  }
  ag_pos at = mark_pos(p->problem_mark);
  cursor c; /* find the byte at the mark */
  cursor_init(&c, text, len);
  while (c.i < c.n && (c.pos.line < at.line || (c.pos.line == at.line && c.pos.col < at.col)))
    cursor_step(&c);
  if (c.i < c.n && text[c.i] == '\t') {
    spec_diag_add(diags, at, false, "tabs are not allowed for indentation; use spaces");
    return;
  }
  const char *problem = p->problem ? p->problem : "unknown problem";
  ag_pos ctx = mark_pos(p->context_mark);
  if (!p->context) {
    spec_diag_add(diags, at, false, "YAML syntax error: %s", problem);
  } else if (ctx.line == at.line && ctx.col == at.col) {
    spec_diag_add(diags, at, false, "YAML syntax error: %s (%s)", problem, p->context);
  } else {
    spec_diag_add(diags, at, false, "YAML syntax error: %s (%s at line %d, column %d)",
                  problem, p->context, ctx.line, ctx.col);
  }
}

ag_status spec_parse(const char *text, size_t len, spec_diags *diags,
                     spec_node **out_root) {
  *out_root = NULL;
  size_t errors_before = diags->errors;
  if (!prescan(text, len, diags)) return diags->nomem ? AG_ERR_NOMEM : AG_ERR_SPEC;
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return AG_ERR_NOMEM;
  yaml_parser_set_encoding(&parser, YAML_UTF8_ENCODING);
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  builder b = {.diags = diags};
  bool more = true, nomem = false;
  while (more) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&parser, &ev)) {
      if (parser.error == YAML_MEMORY_ERROR) nomem = true;
      else report_yaml_error(&parser, text, len, diags);
      break;
    }
    more = on_event(&b, &ev);
    yaml_event_delete(&ev);
    if (b.nomem) nomem = true, more = false;
  }
  yaml_parser_delete(&parser);
  if (nomem || diags->nomem || diags->errors > errors_before) {
    spec_node_free(b.root);
    return nomem || diags->nomem ? AG_ERR_NOMEM : AG_ERR_SPEC;
  }
  *out_root = b.root;
  return AG_OK;
}
