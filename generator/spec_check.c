// SPDX-License-Identifier: BSD-3-Clause
/* spec_check.c: validates the YAML tree of a spec and fills an ag_spec,
 * reporting every error at its key or value; holds the public loaders.
 * Knows attention, not YAML syntax (see spec_parse.c). */
#include <errno.h>
#include <locale.h>
#include <float.h> /* FLT_MIN, FLT_MAX */
#include <math.h>  /* isfinite */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "spec_internal.h"

/* The largest softmax scale and rotary base: scale * log2(e) (emitted as
 * @SCALE_LOG2@) and the base (a float literal) must stay finite in fp32. */
#define SPEC_MAX_SCALE 2.3585e38 /* FLT_MAX / log2(e) = 2.35865e38, rounded down */
#define SPEC_MAX_BASE 3.4028e38  /* FLT_MAX = 3.40282347e38, rounded down */

#define NAME_MAX_CHARS 48
#define SHOW_MAX 256      /* bytes for a described value in a message */
#define SHOW_TEXT_MAX 40  /* source bytes shown before "..." */

/* ---- showing values in messages ---------------------------------------- */

/* Append at most SHOW_TEXT_MAX bytes of s to out (capacity SHOW_MAX),
 * escaping control characters and line separators. */
static void show_text(char *out, const char *s, size_t len) {
  size_t o = strlen(out), i = 0;
  while (i < len && i < SHOW_TEXT_MAX && o < SHOW_MAX - 16) {
    unsigned char ch = (unsigned char)s[i];
    size_t w = ch < 0x80 ? 1 : ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : 2;
    if (i + w > len) w = len - i;
    unsigned cp = ch;
    if (w == 2) cp = ((ch & 0x1Fu) << 6) | ((unsigned char)s[i + 1] & 0x3Fu);
    if (w == 3)
      cp = ((ch & 0x0Fu) << 12) | (((unsigned char)s[i + 1] & 0x3Fu) << 6) |
           ((unsigned char)s[i + 2] & 0x3Fu);
    if (cp == '\n') o += (size_t)snprintf(out + o, SHOW_MAX - o, "\\n");
    else if (cp == '\t') o += (size_t)snprintf(out + o, SHOW_MAX - o, "\\t");
    else if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F))
      o += (size_t)snprintf(out + o, SHOW_MAX - o, "\\x%02X", cp);
    else if (cp == 0x2028 || cp == 0x2029)
      o += (size_t)snprintf(out + o, SHOW_MAX - o, "\\u%04X", cp);
    else {
      memcpy(out + o, s + i, w);
      o += w;
      out[o] = '\0';
    }
    i += w;
  }
  if (i < len) snprintf(out + o, SHOW_MAX - o, "...");
}

/* 'text' of a scalar. */
static const char *quote(char *out, const spec_node *n) {
  strcpy(out, "'");
  show_text(out, n->text, n->len);
  strcat(out, "'");
  return out;
}

/* What a node is, for "(got ...)". `typed`: the value should be a number or
 * a boolean, so say when a scalar was quoted. */
static const char *describe(char *out, const spec_node *n, bool typed) {
  if (n->kind == SPEC_LIST) return strcpy(out, "a list");
  if (n->kind == SPEC_MAP) return strcpy(out, "a mapping");
  if (!n->quoted && n->len == 0) return strcpy(out, "nothing");
  strcpy(out, typed && n->quoted ? "the quoted string '" : "'");
  show_text(out, n->text, n->len);
  return strcat(out, "'");
}

/* ---- scalar values ------------------------------------------------------- */

typedef struct checker {
  spec_diags *diags;
  ag_spec *spec;
  bool pattern_known;   /* pattern given and valid */
  ag_pos query_at;      /* value positions, for pattern checks */
  ag_pos positions_at;
  bool positions_known; /* rotary positions given and valid */
} checker;

#define ERROR(c, pos, ...) spec_diag_add((c)->diags, (pos), false, __VA_ARGS__)

static bool is_str(const spec_node *v, const char *s) {
  return v->kind == SPEC_SCALAR && v->len == strlen(s) && memcmp(v->text, s, v->len) == 0;
}

/* Index of v in the NULL-terminated names, -1 if absent. */
static int find_name(const spec_node *v, const char *const *names) {
  for (int i = 0; names[i]; i++)
    if (is_str(v, names[i])) return i;
  return -1;
}

static void join_names(char *out, size_t cap, const char *const *names) {
  size_t o = 0;
  out[0] = '\0';
  for (int i = 0; names[i] && o < cap; i++)
    o += (size_t)snprintf(out + o, cap - o, "%s%s", i ? ", " : "", names[i]);
}

static bool get_enum(checker *c, const char *what, const spec_node *v,
                     const char *const *names, int *out) {
  int i = find_name(v, names);
  if (i >= 0) {
    *out = i;
    return true;
  }
  char got[SHOW_MAX], list[256];
  join_names(list, sizeof list, names);
  ERROR(c, v->pos, "%s must be one of %s (got %s)", what, list, describe(got, v, false));
  return false;
}

/* A plain decimal integer that fits an int: [-+]?(0|[1-9][0-9]*). */
static bool get_int(checker *c, const char *what, const spec_node *v, int *out) {
  char got[SHOW_MAX];
  const char *s = v->kind == SPEC_SCALAR && !v->quoted ? v->text : "";
  size_t n = v->kind == SPEC_SCALAR && !v->quoted ? v->len : 0, i = 0;
  bool neg = false;
  if (i < n && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
  bool digits = i < n && s[i] >= '0' && s[i] <= '9' && !(s[i] == '0' && i + 1 < n);
  for (size_t j = i; j < n; j++) digits = digits && s[j] >= '0' && s[j] <= '9';
  if (!digits) {
    ERROR(c, v->pos, "%s must be an integer (got %s)", what, describe(got, v, true));
    return false;
  }
  long long acc = 0;
  for (; i < n; i++) {
    acc = acc * 10 + (s[i] - '0');
    if (acc > 2147483647LL) {
      got[0] = '\0';
      show_text(got, v->text, v->len);
      ERROR(c, v->pos, "%s is out of range (got %s)", what, got);
      return false;
    }
  }
  *out = (int)(neg ? -acc : acc);
  return true;
}

/* A plain decimal number, [-+]?(D+(.D*)?|.D+)([eE][-+]?D+)?, read in the C
 * locale. No inf or nan: callers want positive finite numbers. */
static bool read_number(const spec_node *v, double *out) {
  if (v->kind != SPEC_SCALAR || v->quoted) return false;
  const char *s = v->text;
  size_t n = v->len, i = 0, d = 0, f = 0;
  if (i < n && (s[i] == '-' || s[i] == '+')) i++;
  while (i < n && s[i] >= '0' && s[i] <= '9') i++, d++;
  if (i < n && s[i] == '.')
    for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) f++;
  if (d + f == 0) return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    size_t e = 0;
    if (++i < n && (s[i] == '-' || s[i] == '+')) i++;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++, e++;
    if (e == 0) return false;
  }
  if (i != n) return false;
  locale_t c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
  if (!c_locale) return false;
  *out = strtod_l(s, NULL, c_locale);
  freelocale(c_locale);
  return true;
}

/* A positive finite number no larger than `max`, and no smaller than the
 * smallest normal fp32 value: the kernels hold these values as fp32 literals
 * (the softmax scale also times log2(e)), which must neither overflow nor
 * flush to zero. */
static bool get_positive(checker *c, const char *what, const char *alternative,
                         const spec_node *v, double max, double *out) {
  double x;
  char got[SHOW_MAX];
  if (!read_number(v, &x) || !isfinite(x) || x <= 0) {
    ERROR(c, v->pos, "%s must be %sa positive finite number (got %s)", what, alternative,
          describe(got, v, true));
    return false;
  }
  if (x < FLT_MIN || x > max) {
    ERROR(c, v->pos, "%s is out of range (the kernels hold it in fp32: between %.9g and %.9g; got %s)",
          what, (double)FLT_MIN, max, describe(got, v, true));
    return false;
  }
  *out = x;
  return true;
}

static bool get_bool(checker *c, const char *what, const spec_node *v, bool *out) {
  if (!v->quoted && (is_str(v, "true") || is_str(v, "false"))) {
    *out = v->text[0] == 't';
    return true;
  }
  char got[SHOW_MAX];
  ERROR(c, v->pos, "%s must be true or false (got %s)", what, describe(got, v, true));
  return false;
}

/* A list of distinct names, as bits (1 << index). */
static bool get_set(checker *c, const char *what, const spec_node *v,
                    const char *const *names, unsigned *out) {
  char got[SHOW_MAX], list[256];
  if (v->kind != SPEC_LIST) {
    ERROR(c, v->pos, "%s must be a list (got %s)", what, describe(got, v, false));
    return false;
  }
  if (v->count == 0) {
    ERROR(c, v->pos, "%s must not be empty", what);
    return false;
  }
  unsigned bits = 0;
  bool ok = true;
  for (size_t i = 0; i < v->count; i++) {
    const spec_node *e = v->items[i];
    int k = find_name(e, names);
    if (k < 0) {
      join_names(list, sizeof list, names);
      ERROR(c, e->pos, "each entry of %s must be one of %s (got %s)", what, list,
            describe(got, e, false));
      ok = false;
    } else if (bits & (1u << k)) {
      ERROR(c, e->pos, "duplicate entry '%s' in %s", names[k], what);
      ok = false;
    } else {
      bits |= 1u << k;
    }
  }
  *out = bits;
  return ok;
}

/* ---- keys ------------------------------------------------------------------ */

/* Optimal string alignment distance, for short strings (callers skip keys
 * whose lengths differ by more than 2). */
static size_t edit_distance(const char *a, size_t la, const char *b, size_t lb) {
  size_t d[24][24];
  if (la > 22 || lb > 22) return 99;
  for (size_t i = 0; i <= la; i++) d[i][0] = i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = j;
  for (size_t i = 1; i <= la; i++) {
    for (size_t j = 1; j <= lb; j++) {
      size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  }
  return d[la][lb];
}

/* The closest valid key within two edits, or NULL. */
static const char *suggest(const spec_node *key, const char *const *names) {
  const char *best = NULL;
  size_t best_d = 3;
  for (int i = 0; names[i]; i++) {
    size_t ln = strlen(names[i]);
    if (key->len + 2 < ln || ln + 2 < key->len) continue;
    size_t dist = edit_distance(key->text, key->len, names[i], ln);
    if (dist < best_d) best = names[i], best_d = dist;
  }
  return best;
}

/* Match the keys of map against names: seen[i] gets the pair of names[i].
 * Reports non-scalar, unknown and duplicate keys. `where` names the map in
 * messages ("" at the top level). */
static void collect_keys(checker *c, const spec_node *map, const char *const *names,
                         const char *where, const spec_pair **seen) {
  char got[SHOW_MAX];
  for (size_t i = 0; i < map->count; i++) {
    const spec_pair *p = &map->pairs[i];
    if (p->key->kind != SPEC_SCALAR) {
      ERROR(c, p->key->pos, "keys must be strings (got %s)", describe(got, p->key, false));
      continue;
    }
    int k = find_name(p->key, names);
    if (k < 0) {
      const char *hint = suggest(p->key, names);
      ERROR(c, p->key->pos, "unknown key %s%s%s%s%s", quote(got, p->key), where,
            hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "");
    } else if (seen[k]) {
      ERROR(c, p->key->pos, "duplicate key '%s' (first given at line %d)", names[k],
            seen[k]->key->pos.line);
    } else {
      seen[k] = p;
    }
  }
}

/* ---- rotary ----------------------------------------------------------------- */

enum { R_LAYOUT, R_APPLY_TO, R_POSITIONS, R_BASE, R_COUNT };
static const char *const rotary_keys[] = {"layout", "apply_to", "positions", "base", NULL};
static const char *const layouts[] = {"interleaved", "half", NULL};
static const char *const apply_names[] = {"q", "k", "v", NULL};
static const char *const position_names[] = {"table", "sequence", "block", NULL};

static void check_rotary(checker *c, const spec_pair *at) {
  ag_spec *s = c->spec;
  const spec_node *v = at->value;
  char got[SHOW_MAX];
  if (v->kind != SPEC_MAP) {
    ERROR(c, v->pos, "rotary must be a mapping (got %s)", describe(got, v, false));
    return;
  }
  const spec_pair *seen[R_COUNT] = {NULL};
  collect_keys(c, v, rotary_keys, " in rotary", seen);
  int i;
  s->rotary.layout = AG_ROTARY_INTERLEAVED; /* present: never NONE */
  s->rotary.apply_to = AG_APPLY_Q | AG_APPLY_K;
  s->rotary.positions = AG_POSITIONS_TABLE;
  s->rotary.base = 10000.0;
  if (!seen[R_LAYOUT])
    ERROR(c, at->key->pos, "missing required key 'layout' in rotary");
  else if (get_enum(c, "rotary.layout", seen[R_LAYOUT]->value, layouts, &i))
    s->rotary.layout = i == 0 ? AG_ROTARY_INTERLEAVED : AG_ROTARY_HALF;
  if (seen[R_APPLY_TO]) /* bit i of the set is AG_APPLY_Q << i */
    get_set(c, "rotary.apply_to", seen[R_APPLY_TO]->value, apply_names, &s->rotary.apply_to);
  c->positions_known = true;
  if (seen[R_POSITIONS]) {
    c->positions_at = seen[R_POSITIONS]->value->pos;
    c->positions_known =
        get_enum(c, "rotary.positions", seen[R_POSITIONS]->value, position_names, &i);
    if (c->positions_known) s->rotary.positions = (ag_rotary_positions)i;
  }
  if (seen[R_BASE]) {
    get_positive(c, "rotary.base", "", seen[R_BASE]->value, SPEC_MAX_BASE, &s->rotary.base);
    if (c->positions_known && s->rotary.positions == AG_POSITIONS_TABLE)
      ERROR(c, seen[R_BASE]->key->pos,
            "'base' applies only to rotary positions sequence or block");
  }
}

/* ---- the top level ---------------------------------------------------------- */

enum {
  K_NAME, K_PATTERN, K_BLOCK_SIZE, K_CAUSAL, K_WINDOW, K_QUERY, K_HEAD_DIM, K_DTYPE,
  K_SOFTMAX_SCALE, K_ROTARY, K_PASSES, K_ARCH, K_DETERMINISTIC, K_ROW_STRIDES, K_COUNT
};
static const char *const top_keys[] = {
    "name",  "pattern",       "block_size", "causal", "window", "query", "head_dim",
    "dtype", "softmax_scale", "rotary",     "passes", "arch",   "deterministic",
    "row_strides", NULL};
static const size_t key_at[K_COUNT] = {
    offsetof(ag_spec, at.name),     offsetof(ag_spec, at.pattern),
    offsetof(ag_spec, at.block_size), offsetof(ag_spec, at.causal),
    offsetof(ag_spec, at.window),   offsetof(ag_spec, at.query),
    offsetof(ag_spec, at.head_dim), offsetof(ag_spec, at.dtype),
    offsetof(ag_spec, at.softmax_scale), offsetof(ag_spec, at.rotary),
    offsetof(ag_spec, at.passes),   offsetof(ag_spec, at.arch),
    offsetof(ag_spec, at.deterministic), offsetof(ag_spec, at.row_strides)};
static const int required[] = {K_NAME, K_PATTERN, K_HEAD_DIM, K_DTYPE};
static const char *const patterns[] = {"block_diagonal", "jagged", NULL};
static const char *const queries[] = {"per_sequence", "broadcast", NULL};
static const char *const dtypes[] = {"bf16", "fp16", NULL};
static const char *const pass_names[] = {"forward", "backward", NULL};
static const char *const archs[] = {"auto", "sm_80", "sm_90a", NULL};

static void check_name(checker *c, const spec_node *v) {
  char got[SHOW_MAX];
  bool ok = v->kind == SPEC_SCALAR && v->len > 0 && v->text[0] >= 'a' && v->text[0] <= 'z';
  for (size_t i = 1; ok && i < v->len; i++) {
    char ch = v->text[i];
    ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
  }
  if (!ok) {
    ERROR(c, v->pos, "name must match [a-z][a-z0-9_]* (got %s)", describe(got, v, false));
  } else if (v->len > NAME_MAX_CHARS) {
    ERROR(c, v->pos, "name is longer than %d characters (got %zu)", NAME_MAX_CHARS, v->len);
  } else {
    memcpy(c->spec->name, v->text, v->len + 1);
  }
}

static void check_window(checker *c, const spec_node *v) {
  char got[SHOW_MAX];
  if (v->kind != SPEC_LIST) {
    ERROR(c, v->pos, "window must be a list of two integers [left, right] (got %s)",
          describe(got, v, false));
    return;
  }
  if (v->count != 2) {
    ERROR(c, v->pos, "window must have exactly two entries [left, right] (got %zu)",
          v->count);
    return;
  }
  int *sides[2] = {&c->spec->window_left, &c->spec->window_right};
  const char *what[2] = {"window left", "window right"};
  for (int i = 0; i < 2; i++) {
    if (get_int(c, what[i], v->items[i], sides[i]) && *sides[i] < 0)
      ERROR(c, v->items[i]->pos, "%s must not be negative (got %d)", what[i], *sides[i]);
  }
  c->spec->has_window = true;
}

static void check_values(checker *c, const spec_pair **seen) {
  ag_spec *s = c->spec;
  int i;
  if (seen[K_NAME]) check_name(c, seen[K_NAME]->value);
  if (seen[K_PATTERN] && get_enum(c, "pattern", seen[K_PATTERN]->value, patterns, &i)) {
    s->pattern = (ag_pattern)i;
    c->pattern_known = true;
  }
  if (seen[K_BLOCK_SIZE]) {
    const spec_node *v = seen[K_BLOCK_SIZE]->value;
    if (get_int(c, "block_size", v, &s->block_size) &&
        (s->block_size < 16 || s->block_size > 256 || s->block_size % 16))
      ERROR(c, v->pos, "block_size must be a multiple of 16 from 16 to 256 (got %d)",
            s->block_size);
  }
  if (seen[K_CAUSAL]) get_bool(c, "causal", seen[K_CAUSAL]->value, &s->causal);
  if (seen[K_WINDOW]) check_window(c, seen[K_WINDOW]->value);
  if (seen[K_QUERY] && get_enum(c, "query", seen[K_QUERY]->value, queries, &i)) {
    s->query = (ag_query)i;
    c->query_at = seen[K_QUERY]->value->pos;
  }
  if (seen[K_HEAD_DIM]) {
    const spec_node *v = seen[K_HEAD_DIM]->value;
    if (get_int(c, "head_dim", v, &s->head_dim) && s->head_dim != 64 && s->head_dim != 128)
      ERROR(c, v->pos, "head_dim must be 64 or 128 (got %d)", s->head_dim);
  }
  if (seen[K_DTYPE] && get_enum(c, "dtype", seen[K_DTYPE]->value, dtypes, &i))
    s->dtype = (ag_dtype)i;
  if (seen[K_SOFTMAX_SCALE] && !is_str(seen[K_SOFTMAX_SCALE]->value, "auto"))
    get_positive(c, "softmax_scale", "auto or ", seen[K_SOFTMAX_SCALE]->value, SPEC_MAX_SCALE,
                 &s->softmax_scale);
  if (seen[K_ROTARY]) check_rotary(c, seen[K_ROTARY]);
  if (seen[K_PASSES]) /* bit i of the set is AG_PASS_FORWARD << i */
    get_set(c, "passes", seen[K_PASSES]->value, pass_names, &s->passes);
  if (seen[K_DETERMINISTIC])
    get_bool(c, "deterministic", seen[K_DETERMINISTIC]->value, &s->deterministic);
  if (seen[K_ROW_STRIDES])
    get_bool(c, "row_strides", seen[K_ROW_STRIDES]->value, &s->row_strides);
  if (seen[K_ARCH] && get_enum(c, "arch", seen[K_ARCH]->value, archs, &i))
    s->arch = (ag_arch)i;
}

/* Keys and values that are valid alone but not with this pattern. */
static void check_pattern_fit(checker *c, const spec_pair **seen) {
  const ag_spec *s = c->spec;
  if (!c->pattern_known) return;
  bool block = s->pattern == AG_PATTERN_BLOCK_DIAGONAL;
  if (!block && seen[K_BLOCK_SIZE])
    ERROR(c, seen[K_BLOCK_SIZE]->key->pos, "'block_size' applies only to pattern block_diagonal");
  if (block && seen[K_WINDOW])
    ERROR(c, seen[K_WINDOW]->key->pos, "'window' applies only to pattern jagged");
  if (block && seen[K_DETERMINISTIC])
    ERROR(c, seen[K_DETERMINISTIC]->key->pos,
          "'deterministic' applies only to pattern jagged (the block pattern's backward is "
          "always deterministic)");
  if (!block && seen[K_ROW_STRIDES])
    ERROR(c, seen[K_ROW_STRIDES]->key->pos,
          "'row_strides' applies only to pattern block_diagonal (the jagged kernels take "
          "kv_heads always, and packed rows)");
  if (!block && s->causal && s->has_window && s->window_right != 0)
    ERROR(c, seen[K_WINDOW]->value->pos,
          "a causal window looks at no key after the query: its right side must be 0 (got %d)",
          s->window_right);
  if (block && s->query == AG_QUERY_BROADCAST)
    ERROR(c, c->query_at, "query broadcast applies only to pattern jagged");
  if (!block && seen[K_ROTARY] && c->positions_known &&
      s->rotary.positions == AG_POSITIONS_BLOCK)
    ERROR(c, c->positions_at,
          "rotary positions block applies only to pattern block_diagonal");
}

/* Shapes the kernels do not take yet (the planners' limits: a rotary
 * table's rows beside the forward's largest blocks, a rotary base whose
 * frequencies overflow fp32, ...), so that a spec valid here always builds.
 * Each pass is planned alone and a refusal reported at the key the planner
 * names; the backward's only when it is not the forward's again. */
typedef struct plan_refusal {
  ag_refusal_key key;
  char text[AG_REFUSAL_MAX];
} plan_refusal;

static bool refused(const ag_spec *s, unsigned pass, plan_refusal *out) {
  ag_spec one = *s;
  one.passes = pass;
  ag_plan plan;
  if (!(s->passes & pass) || ag_plan_make(&one, &plan, NULL) == AG_OK) return false;
  out->key = plan.refused_at;
  memcpy(out->text, plan.refusal, sizeof out->text);
  return true;
}

/* The backward's refusals that name rotary embeddings or the pass itself
 * point at `passes`: the backward is what the spec asks of them. */
static ag_pos refusal_pos(const ag_spec *s, unsigned pass, ag_refusal_key key) {
  if (pass == AG_PASS_BACKWARD && (key == AG_REFUSED_ROTARY || key == AG_REFUSED_PASSES))
    return s->at.passes;
  switch (key) {
    case AG_REFUSED_ROTARY: return s->at.rotary;
    case AG_REFUSED_PASSES: return s->at.passes.line ? s->at.passes : s->at.pattern;
    case AG_REFUSED_QUERY: return s->at.query;
    case AG_REFUSED_ARCH: return s->at.arch.line ? s->at.arch : s->at.pattern;
    case AG_REFUSED_ROW_STRIDES: return s->at.row_strides;
    default: return s->at.block_size.line ? s->at.block_size : s->at.pattern;
  }
}

static void check_plan(spec_diags *d, const ag_spec *s) {
  plan_refusal fwd, bwd;
  const bool f = refused(s, AG_PASS_FORWARD, &fwd), b = refused(s, AG_PASS_BACKWARD, &bwd);
  if (f) spec_diag_add(d, refusal_pos(s, AG_PASS_FORWARD, fwd.key), true, "%s", fwd.text);
  if (b && !(f && strcmp(fwd.text, bwd.text) == 0))
    spec_diag_add(d, refusal_pos(s, AG_PASS_BACKWARD, bwd.key), true, "%s", bwd.text);
}

/* Fill spec from the tree; every problem goes to diags. */
static void check_spec(spec_diags *d, const spec_node *root, ag_spec *s) {
  checker c = {.diags = d, .spec = s};
  char got[SHOW_MAX];
  if (!root || (root->kind == SPEC_SCALAR && !root->quoted && root->len == 0)) {
    ERROR(&c, ((ag_pos){1, 1}), "empty spec");
    return;
  }
  if (root->kind != SPEC_MAP) {
    ERROR(&c, root->pos, "spec must be a mapping of keys (got %s)",
          describe(got, root, false));
    return;
  }
  const spec_pair *seen[K_COUNT] = {NULL};
  collect_keys(&c, root, top_keys, "", seen);
  for (int k = 0; k < K_COUNT; k++)
    if (seen[k]) *(ag_pos *)((char *)s + key_at[k]) = seen[k]->key->pos;
  s->passes = AG_PASS_FORWARD;
  check_values(&c, seen);
  if (c.pattern_known && s->pattern == AG_PATTERN_BLOCK_DIAGONAL && !seen[K_BLOCK_SIZE])
    s->block_size = 64;
  check_pattern_fit(&c, seen);
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
    if (!seen[required[i]])
      ERROR(&c, root->pos, "missing required key '%s'", top_keys[required[i]]);
  if (d->total == 0) check_plan(d, s);
}

/* ---- loading ------------------------------------------------------------------ */

/* A file name as messages print it (ag_buf_put_name), from malloc(); NULL
 * when out of memory. */
static char *shown_name(const char *path) {
  ag_buf b;
  ag_buf_init(&b);
  ag_buf_put_name(&b, path);
  ag_buf_append(&b, "", 0); /* an empty name is still a string */
  return ag_buf_take(&b);
}

static ag_status load(const char *text, size_t len, const char *raw_path, const char *source,
                      ag_spec *out_spec, ag_error *err) {
  char *path = shown_name(raw_path);
  if (!path) {
    if (out_spec) memset(out_spec, 0, sizeof *out_spec);
    return ag_fail(err, AG_ERR_NOMEM, "error: out of memory\n");
  }
  ag_spec spec;
  memset(&spec, 0, sizeof spec);
  snprintf(spec.source, sizeof spec.source, "%s", source);
  if (!text) len = 0;
  if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) text += 3, len -= 3;
  spec_diags d;
  spec_diags_init(&d);
  ag_status st = AG_OK;
  if (len > SPEC_MAX_BYTES) {
    spec_diag_add(&d, (ag_pos){1, 1}, false, "spec is larger than 1 MiB");
  } else {
    spec_node *root = NULL;
    st = spec_parse(text ? text : "", len, &d, &root);
    if (st == AG_OK) check_spec(&d, root, &spec);
    spec_node_free(root);
  }
  if (st != AG_ERR_NOMEM && !d.nomem)
    st = d.errors ? AG_ERR_SPEC : d.count ? AG_ERR_UNSUPPORTED : AG_OK;
  else
    st = AG_ERR_NOMEM;
  if (st == AG_ERR_SPEC || st == AG_ERR_UNSUPPORTED) {
    char *message = spec_diags_render(&d, path, text ? text : "", len);
    if (message) ag_fail_take(err, st, message);
    else st = AG_ERR_NOMEM;
  }
  if (st == AG_ERR_NOMEM) ag_fail(err, st, "%s: error: out of memory\n", path);
  if (st == AG_OK) ag_error_clear(err);
  if (out_spec) {
    if (st == AG_OK || st == AG_ERR_UNSUPPORTED) *out_spec = spec;
    else memset(out_spec, 0, sizeof *out_spec);
  }
  spec_diags_free(&d);
  free(path);
  return st;
}

ag_status ag_spec_load_string(const char *yaml, size_t len, const char *source_name,
                              ag_spec *out_spec, ag_error *err) {
  const char *name = source_name ? source_name : "<string>";
  return load(yaml, len, name, name, out_spec, err);
}

ag_status ag_spec_load_file(const char *path, ag_spec *out_spec, ag_error *err) {
  char why[128], chunk[65536];
  ag_status st;
  if (out_spec) memset(out_spec, 0, sizeof *out_spec);
  if (!path) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "error: no spec path given\n");
  ag_buf b;
  ag_buf_init(&b);
  char *shown = NULL; /* the path as messages print it */
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno; /* before shown_name's malloc */
    shown = shown_name(path);
    st = ag_fail(err, AG_ERR_IO, "%s: error: cannot open spec: %s\n", shown ? shown : "?",
                 strerror_r(e, why, sizeof why));
    goto fail;
  }
  while (b.len <= SPEC_MAX_BYTES) { /* one byte past the limit is enough */
    size_t n = fread(chunk, 1, sizeof chunk, f);
    ag_buf_append(&b, chunk, n);
    if (n < sizeof chunk) break;
  }
  if (ferror(f)) {
    int e = errno; /* before shown_name's malloc */
    shown = shown_name(path);
    st = ag_fail(err, AG_ERR_IO, "%s: error: cannot read spec: %s\n", shown ? shown : "?",
                 strerror_r(e, why, sizeof why));
    goto fail;
  }
  if (b.failed) {
    st = ag_fail(err, AG_ERR_NOMEM, "error: out of memory\n");
    goto fail;
  }
  const char *slash = strrchr(path, '/');
  st = load(b.data, b.len, path, slash && slash[1] ? slash + 1 : path, out_spec, err);
fail:
  if (f) fclose(f);
  free(shown);
  ag_buf_free(&b);
  return st;
}
