// SPDX-License-Identifier: BSD-3-Clause
/* emit.c: turns a validated spec into CUDA C: a banner that echoes the spec
 * and the plan, then the expanded kernel template. Output is byte-stable:
 * no dates, no paths, numbers printed with fixed formats. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "expand.h"
#include "internal.h"
#include "plan.h"

static const char *const dtype_names[] = {"bf16", "fp16"};
static const char *const arch_names[] = {"auto", "sm_80", "sm_90a"};
static const char *const layout_names[] = {"none", "interleaved", "half"};
static const char *const position_names[] = {"table", "sequence", "block"};

const char *ag_arch_name(ag_arch arch) {
  return arch == AG_ARCH_AUTO ? NULL : arch_names[arch];
}

ag_status ag_arch_parse(const char *name, bool allow_auto, ag_arch *out_arch, ag_error *err) {
  for (int a = allow_auto ? AG_ARCH_AUTO : AG_ARCH_SM80; name && a <= AG_ARCH_SM90A; a++)
    if (strcmp(name, arch_names[a]) == 0) {
      if (out_arch) *out_arch = (ag_arch)a;
      ag_error_clear(err);
      return AG_OK;
    }
  return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                 "unsupported arch '%s': expected %ssm_80 (every 8.x GPU: sm_86, sm_89 too) or "
                 "sm_90a (H100, H200)",
                 name ? name : "(null)", allow_auto ? "auto, " : "");
}

/* The banner's keys after dtype, and the plan. */
static void banner_tail(ag_buf *b, const ag_spec *s, const ag_plan *p) {
  if (s->softmax_scale > 0) ag_buf_printf(b, " *   softmax_scale: %.9g\n", s->softmax_scale);
  else ag_buf_puts(b, " *   softmax_scale: auto\n");
  if (s->rotary.layout != AG_ROTARY_NONE) {
    const unsigned a = s->rotary.apply_to;
    ag_buf_printf(b, " *   rotary:\n *     layout: %s\n *     apply_to: [",
                  layout_names[s->rotary.layout]);
    const char *sep = "";
    for (int i = 0; i < 3; i++)
      if (a & (AG_APPLY_Q << i)) {
        ag_buf_printf(b, "%s%c", sep, "qkv"[i]);
        sep = ", ";
      }
    ag_buf_printf(b, "]\n *     positions: %s\n", position_names[s->rotary.positions]);
    if (s->rotary.positions != AG_POSITIONS_TABLE)
      ag_buf_printf(b, " *     base: %.9g\n", s->rotary.base);
  }
  ag_buf_printf(b, " *   arch: %s\n", arch_names[s->arch]);
  if (s->passes & AG_PASS_BACKWARD)
    ag_buf_printf(b, " *   passes: [%s]\n",
                  s->passes & AG_PASS_FORWARD ? "forward, backward" : "backward");
  ag_buf_puts(b, " *\n * Plan:\n");
  char *plan = ag_plan_describe(p, " *   ");
  if (plan) ag_buf_puts(b, plan);
  else b->failed = true;
  free(plan);
  ag_buf_puts(b, " */\n\n");
}

/* The jagged pattern's banner: the layout, then the spec and the plan. */
static void jagged_banner(ag_buf *b, const ag_spec *s, const ag_plan *p, bool fwd) {
  const bool bwd = ag_plan_kernel_for(p, AG_PASS_BACKWARD) != NULL;
  const char *passes = fwd && bwd ? "forward and backward" : fwd ? "forward" : "backward";
  if (s->query == AG_QUERY_BROADCAST)
    ag_buf_printf(b,
                  " * Broadcast-Q attention, %s: one dense Q [n_q, heads, %d]\n"
                  " * shared by every sequence attends to each sequence's own keys%s%s.%s\n"
                  " * O%s are [batch * n_q, heads, %d] %s (sequence b's rows at b * n_q);\n"
                  " * K, V%s [total_k, kv_heads, %d]; logsumexp is fp32\n"
                  " * [heads, batch * n_q]; cu_seqlens_k is int32 [batch + 1].\n *\n",
                  passes, s->head_dim, s->causal ? ", causally (bottom-right aligned)" : "",
                  s->has_window ? " within a window" : "",
                  bwd ? "\n * dQ, shaped like Q, is the sum over the batch." : "", bwd ? ", dO" : "", s->head_dim,
                  dtype_names[s->dtype], bwd ? ", dK, dV" : "", s->head_dim);
  else
    ag_buf_printf(b,
                  " * Jagged attention, %s: each sequence's queries attend to\n"
                  " * its own keys%s%s.\n"
                  " * Q, O%s are [total_q, heads, %d] %s; K, V%s [total_k, kv_heads, %d];\n"
                  " * logsumexp is fp32 [heads, total_q]; cu_seqlens_q, cu_seqlens_k are\n"
                  " * int32 [batch + 1].\n *\n",
                  passes, s->causal ? ", causally (bottom-right aligned)" : "",
                  s->has_window ? " within a window" : "", bwd ? ", dO, dQ" : "", s->head_dim,
                  dtype_names[s->dtype], bwd ? ", dK, dV" : "", s->head_dim);
  ag_buf_printf(b, " * Spec:\n *   name: %s\n *   pattern: jagged\n", s->name);
  if (s->query == AG_QUERY_BROADCAST) ag_buf_puts(b, " *   query: broadcast\n");
  ag_buf_printf(b, " *   causal: %s\n", s->causal ? "true" : "false");
  if (s->has_window) ag_buf_printf(b, " *   window: [%d, %d]\n", s->window_left, s->window_right);
  ag_buf_printf(b, " *   head_dim: %d\n *   dtype: %s\n", s->head_dim, dtype_names[s->dtype]);
  if (s->deterministic) ag_buf_puts(b, " *   deterministic: true\n");
  banner_tail(b, s, p);
}

/* The source name as the banner shows it: any byte outside
 * [A-Za-z0-9._+<>-] becomes '_', so a name can neither end the comment ("*" and
 * "/" are replaced) nor break its line; ordinary file names are unchanged. */
static void put_source_name(ag_buf *b, const char *name, size_t max) {
  for (size_t i = 0; i < max && name[i]; i++) {
    char c = name[i];
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == '+' || c == '<' || c == '>';
    ag_buf_append(b, ok ? &c : "_", 1);
  }
}

static void banner(ag_buf *b, const ag_spec *s, const ag_plan *p) {
  ag_buf_printf(b, "/* Generated by attngen %s from ", AG_VERSION_STRING);
  put_source_name(b, s->source, sizeof s->source);
  ag_buf_puts(b, "; do not edit.\n *\n");
  const bool fwd = ag_plan_kernel_for(p, AG_PASS_FORWARD) != NULL;
  if (s->pattern == AG_PATTERN_JAGGED) {
    jagged_banner(b, s, p, fwd);
    return;
  }
  if (!ag_plan_kernel_for(p, AG_PASS_BACKWARD))
    ag_buf_printf(b, " * Block-diagonal attention, forward: every %d-token block of each\n"
                     " * sequence attends only to itself%s. Q, K, V, O are [tokens, heads, %d]\n"
                     " * %s; offsets is int32 [batch + 1].\n *\n",
                  s->block_size, s->causal ? ", causally" : "", s->head_dim,
                  dtype_names[s->dtype]);
  else
    ag_buf_printf(b, " * Block-diagonal attention, %s: every %d-token block of\n"
                     " * each sequence attends only to itself%s. %s\n"
                     " * are [tokens, heads, %d] %s (dO = dL/dO given, dQ, dK, dV written);\n"
                     " * offsets is int32 [batch + 1].\n *\n",
                  fwd ? "forward and backward" : "backward", s->block_size,
                  s->causal ? ", causally" : "",
                  fwd ? "Q, K, V, O, dO, dQ, dK, dV" : "Q, K, V, dO, dQ, dK, dV",
                  s->head_dim, dtype_names[s->dtype]);
  ag_buf_printf(b, " * Spec:\n *   name: %s\n *   pattern: block_diagonal\n *   block_size: %d\n",
                s->name, s->block_size);
  ag_buf_printf(b, " *   causal: %s\n *   head_dim: %d\n *   dtype: %s\n",
                s->causal ? "true" : "false", s->head_dim, dtype_names[s->dtype]);
  banner_tail(b, s, p);
}

ag_status ag_emit(const ag_spec *spec, char **out_source, char *out_kernel_name, ag_error *err) {
  if (!out_source) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_emit: out_source is NULL");
  *out_source = NULL;
  ag_plan plan;
  ag_status st = ag_plan_make(spec, &plan, err);
  if (st == AG_OK) st = ag_emit_plan(spec, &plan, out_source, err);
  if (st == AG_OK && out_kernel_name)
    snprintf(out_kernel_name, AG_KERNEL_NAME_MAX, "%s", ag_plan_first_kernel(&plan));
  return st;
}

/* The template variables of rotary embeddings (rotary.cuh; the tile load
 * and the work walk use some), from the spec; all "0" without rotary. The
 * ones that differ between kernels (ROTARY_UNPACK, ROTARY_GRADS,
 * ROTARY_CHUNKS, ROTARY_STAGES) are the plan's constants. Their text lives
 * in *r. */
typedef struct rotary_vars {
  char base[48];
  char turns[2048]; /* kHeadDim / 2 <= 64 literals of at most 17 bytes, 4 a line */
} rotary_vars;

enum { ROTARY_VARS = 12 };

static void rotary_fill(const ag_spec *s, rotary_vars *r, ag_tpl_var *v) {
  const bool on = s->rotary.layout != AG_ROTARY_NONE;
  const bool table = on && s->rotary.positions == AG_POSITIONS_TABLE;
  r->base[0] = r->turns[0] = '\0';
  if (on && !table) {
    /* Pair i turns base^(-2i/D) / (2 pi) per position; four literals a line. */
    snprintf(r->base, sizeof r->base, "%.9ef", s->rotary.base);
    size_t o = 0;
    const int pairs = s->head_dim / 2;
    for (int i = 0; i < pairs; i++) {
      double turns = pow(s->rotary.base, -2.0 * i / s->head_dim) / (2 * 3.14159265358979323846);
      o += (size_t)snprintf(r->turns + o, sizeof r->turns - o, "%s%.9ef%s",
                            i % 4 ? " " : "    ", turns,
                            i + 1 < pairs ? (i % 4 == 3 ? ",\n" : ",") : "");
    }
  }
  const unsigned a = on ? s->rotary.apply_to : 0;
  const ag_tpl_var vars[ROTARY_VARS] = {
      {"ROTARY", on ? "1" : "0"},
      {"ROTARY_HALF", on && s->rotary.layout == AG_ROTARY_HALF ? "1" : "0"},
      {"ROTARY_TABLE", table ? "1" : "0"},
      /* the jagged backwards' RotaryTables, from their parameters */
      {"ROTARY_TABLES", table ? "{rotary_table, rotary_table_k}" : "{nullptr, nullptr}"},
      {"ROTARY_COMPUTED", on && !table ? "1" : "0"},
      {"ROTARY_SEQUENCE", on && s->rotary.positions == AG_POSITIONS_SEQUENCE ? "1" : "0"},
      {"ROTATE_Q", a & AG_APPLY_Q ? "1" : "0"},
      {"ROTATE_K", a & AG_APPLY_K ? "1" : "0"},
      {"ROTATE_V", a & AG_APPLY_V ? "1" : "0"},
      {"ROTATE_KEYS", a & (AG_APPLY_K | AG_APPLY_V) ? "1" : "0"}, /* K or V */
      {"ROTARY_BASE", r->base},
      {"ROTARY_TURNS", r->turns},
  };
  memcpy(v, vars, sizeof vars);
}

/* Expand one kernel's template: the variables every template may use
 * (the spec's, formatted) and the constants its descriptor bakes in. */
static ag_status expand_kernel(const ag_spec *spec, const ag_plan *plan, const ag_plan_kernel *k,
                               ag_buf *b, ag_error *err) {
  enum { COMMON_VARS = 12 };
  char params[2048];
  if (!ag_emit_params(plan, k, params, sizeof params))
    return ag_fail(err, AG_ERR_TEMPLATE, "kernel %s: its parameter list cannot be written",
                   k->name);
  char dim[16], scale[48], scale_log2[48], scale_text[48], wleft[16], wright[16];
  char values[AG_PLAN_MAX_CONSTS][16];
  snprintf(dim, sizeof dim, "%d", plan->head_dim);
  snprintf(scale, sizeof scale, "%.9ef", plan->scale);
  snprintf(scale_log2, sizeof scale_log2, "%.9ef", plan->scale * 1.4426950408889634);
  if (spec->softmax_scale > 0) snprintf(scale_text, sizeof scale_text, "%.9g", plan->scale);
  else snprintf(scale_text, sizeof scale_text, "1/sqrt(%d)", plan->head_dim);
  snprintf(wleft, sizeof wleft, "%d", spec->has_window ? spec->window_left : 0);
  snprintf(wright, sizeof wright, "%d", spec->has_window ? spec->window_right : 0);
  const bool bf16 = spec->dtype == AG_DTYPE_BF16;
  rotary_vars rv;
  ag_tpl_var vars[COMMON_VARS + 3 + ROTARY_VARS + AG_PLAN_MAX_CONSTS] = {
      {"KERNEL_NAME", k->template_name},
      {"PARAMS", params},
      {"HEAD_DIM", dim},
      {"SCALE", scale},
      {"SCALE_LOG2", scale_log2},
      {"SCALE_TEXT", scale_text},
      {"MMA_TYPE", bf16 ? "bf16" : "f16"},
      {"PAIR_TYPE", bf16 ? "bf16x2" : "f16x2"},
      {"CAUSAL", spec->causal ? "1" : "0"},
      {"WINDOW", spec->has_window ? "1" : "0"},
      {"WINDOW_LEFT", wleft},
      {"WINDOW_RIGHT", wright},
  };
  size_t n = COMMON_VARS;
  rotary_fill(spec, &rv, vars + n);
  n += ROTARY_VARS;
  for (int i = 0; i < k->nconsts; i++) {
    snprintf(values[i], sizeof values[i], "%d", k->consts[i].value);
    vars[n++] = (ag_tpl_var){k->consts[i].name, values[i]};
  }
  return ag_expand(k->template_file, vars, n, b, err);
}

ag_status ag_emit_plan(const ag_spec *spec, const ag_plan *plan, char **out_source,
                       ag_error *err) {
  *out_source = NULL;
  ag_status st = AG_OK;
  ag_buf b;
  ag_buf_init(&b);
  banner(&b, spec, plan);
  for (int i = 0, defining = 0; i < plan->nkernels && st == AG_OK; i++) {
    const ag_plan_kernel *k = &plan->kernels[i];
    if (!k->template_file) { /* defined by the template before it, with its @PARAMS@ */
      const ag_plan_kernel *d = &plan->kernels[defining];
      if (k->nparams != d->nparams ||
          memcmp(k->params, d->params, (size_t)k->nparams * sizeof *k->params) != 0)
        st = ag_fail(err, AG_ERR_TEMPLATE, "kernel %s: its parameters differ from %s's, whose "
                     "template defines it", k->name, d->name);
      continue;
    }
    defining = i;
    if (i) ag_buf_puts(&b, "\n");
    if (k->namespace_name) ag_buf_printf(&b, "namespace %s {\n\n", k->namespace_name);
    st = expand_kernel(spec, plan, k, &b, err);
    if (k->namespace_name) ag_buf_printf(&b, "\n}  // namespace %s\n", k->namespace_name);
  }
  if (st != AG_OK) {
    ag_buf_free(&b);
    return st;
  }
  char *src = ag_buf_take(&b);
  if (!src) return ag_fail(err, AG_ERR_NOMEM, "out of memory emitting %s", spec->name);
  *out_source = src;
  return AG_OK;
}
