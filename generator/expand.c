// SPDX-License-Identifier: BSD-3-Clause
/* expand.c: the template engine described in expand.h. It knows nothing of
 * attention: the plan supplies every value. Templates are embedded by
 * tools/embed.c and looked up here by file name. */
#include <ctype.h>
#include <string.h>

#include "expand.h"
#include "templates.h"

enum { MAX_INCLUDE_DEPTH = 8, MAX_IF_DEPTH = 32 };

const char *ag_template_find(const char *name) {
  for (const ag_template *t = ag_templates; t->name; t++)
    if (strcmp(t->name, name) == 0) return t->text;
  return NULL;
}

static const char *lookup(const ag_tpl_var *vars, size_t nvars, const char *name, size_t n) {
  for (size_t i = 0; i < nvars; i++)
    if (strlen(vars[i].name) == n && memcmp(vars[i].name, name, n) == 0) return vars[i].value;
  return NULL;
}

static bool is_name(const char *s, size_t n) {
  if (n == 0 || !isupper((unsigned char)s[0])) return false;
  for (size_t i = 1; i < n; i++)
    if (!isupper((unsigned char)s[i]) && !isdigit((unsigned char)s[i]) && s[i] != '_') return false;
  return true;
}

/* If the line (without its newline) is exactly a directive "@word arg@"
 * after leading blanks, split it; returns false otherwise. */
static bool directive(const char *line, size_t n, const char **word, size_t *wn,
                      const char **arg, size_t *an) {
  size_t i = 0;
  while (i < n && (line[i] == ' ' || line[i] == '\t')) i++;
  if (i >= n || line[i] != '@') return false;
  size_t end = n;
  while (end > i && (line[end - 1] == ' ' || line[end - 1] == '\t' || line[end - 1] == '\r')) end--;
  if (end - i < 2 || line[end - 1] != '@') return false;
  const char *body = line + i + 1;
  size_t bn = end - i - 2;
  size_t sp = 0;
  while (sp < bn && body[sp] != ' ') sp++;
  *word = body;
  *wn = sp;
  if (!((sp == 2 && !memcmp(body, "if", 2)) || (sp == 4 && !memcmp(body, "else", 4)) ||
        (sp == 5 && !memcmp(body, "endif", 5)) || (sp == 7 && !memcmp(body, "include", 7))))
    return false;
  *arg = sp < bn ? body + sp + 1 : body + bn;
  *an = sp < bn ? bn - sp - 1 : 0;
  return true;
}

static bool truthy(const char *v) { return v && v[0] && strcmp(v, "0") != 0; }

static ag_status expand(const char *name, const char *text, const ag_tpl_var *vars, size_t nvars,
                        ag_buf *out, ag_error *err, int depth);

/* Substitute @NAME@ placeholders in one line. */
static ag_status subst_line(const char *name, int lineno, const char *line, size_t n,
                            const ag_tpl_var *vars, size_t nvars, ag_buf *out, ag_error *err) {
  size_t i = 0;
  while (i < n) {
    const char *at = memchr(line + i, '@', n - i);
    if (!at) {
      ag_buf_append(out, line + i, n - i);
      break;
    }
    size_t a = (size_t)(at - line);
    ag_buf_append(out, line + i, a - i);
    if (a + 1 < n && line[a + 1] == '@') {
      ag_buf_append(out, "@", 1);
      i = a + 2;
      continue;
    }
    const char *close = memchr(line + a + 1, '@', n - a - 1);
    if (!close)
      return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: unterminated placeholder starting '%.*s'", name,
                     lineno, (int)(n - a > 24 ? 24 : n - a), line + a);
    size_t vn = (size_t)(close - line) - a - 1;
    if (!is_name(line + a + 1, vn))
      return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: malformed placeholder '@%.*s@'", name, lineno,
                     (int)vn, line + a + 1);
    const char *v = lookup(vars, nvars, line + a + 1, vn);
    if (!v)
      return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: unknown placeholder '@%.*s@'", name, lineno,
                     (int)vn, line + a + 1);
    ag_buf_puts(out, v);
    i = a + 1 + vn + 1;
  }
  return AG_OK;
}

static ag_status expand(const char *name, const char *text, const ag_tpl_var *vars, size_t nvars,
                        ag_buf *out, ag_error *err, int depth) {
  /* Conditional stack: active[d] says whether lines at depth d are kept. */
  bool active[MAX_IF_DEPTH + 1], seen_else[MAX_IF_DEPTH + 1];
  int if_line[MAX_IF_DEPTH + 1];
  int level = 0;
  active[0] = true;
  int lineno = 0;
  const char *p = text;
  while (*p) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    lineno++;
    const char *word, *arg;
    size_t wn, an;
    bool keep = active[level];
    if (directive(p, n, &word, &wn, &arg, &an)) {
      if (wn == 2) { /* if */
        if (level == MAX_IF_DEPTH)
          return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: @if nested too deeply", name, lineno);
        if (!is_name(arg, an))
          return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: malformed @if condition", name, lineno);
        const char *v = lookup(vars, nvars, arg, an);
        if (!v)
          return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: unknown condition '%.*s'", name, lineno,
                         (int)an, arg);
        level++;
        active[level] = keep && truthy(v);
        seen_else[level] = false;
        if_line[level] = lineno;
      } else if (wn == 4) { /* else */
        if (level == 0 || seen_else[level])
          return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: @else without @if", name, lineno);
        seen_else[level] = true;
        active[level] = active[level - 1] && !active[level];
      } else if (wn == 5) { /* endif */
        if (level == 0)
          return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: @endif without @if", name, lineno);
        level--;
      } else if (keep) { /* include */
        char inc[128];
        if (an == 0 || an >= sizeof inc)
          return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: malformed @include", name, lineno);
        memcpy(inc, arg, an);
        inc[an] = '\0';
        const char *t = ag_template_find(inc);
        if (!t)
          return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: unknown template '%s'", name, lineno, inc);
        if (depth >= MAX_INCLUDE_DEPTH)
          return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: includes nested too deeply", name, lineno);
        ag_status st = expand(inc, t, vars, nvars, out, err, depth + 1);
        if (st != AG_OK) return st;
      }
    } else if (keep && !(n >= 2 && p[0] == '@' && p[1] == '#')) {
      ag_status st = subst_line(name, lineno, p, n, vars, nvars, out, err);
      if (st != AG_OK) return st;
      if (nl) ag_buf_append(out, "\n", 1);
    }
    if (!nl) break;
    p = nl + 1;
  }
  if (level != 0)
    return ag_fail(err, AG_ERR_TEMPLATE, "%s:%d: @if without @endif", name, if_line[level]);
  if (out->failed) return ag_fail(err, AG_ERR_NOMEM, "out of memory expanding %s", name);
  return AG_OK;
}

ag_status ag_expand_text(const char *name, const char *text, const ag_tpl_var *vars,
                         size_t nvars, ag_buf *out, ag_error *err) {
  return expand(name, text, vars, nvars, out, err, 0);
}

ag_status ag_expand(const char *name, const ag_tpl_var *vars, size_t nvars, ag_buf *out,
                    ag_error *err) {
  const char *t = ag_template_find(name);
  if (!t) return ag_fail(err, AG_ERR_TEMPLATE, "unknown template '%s'", name);
  return expand(name, t, vars, nvars, out, err, 0);
}
