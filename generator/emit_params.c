// SPDX-License-Identifier: BSD-3-Clause
/* emit_params.c: a kernel's parameter list, written from its descriptor's
 * roles (ag_plan_kernel.params), so that the order the launcher packs
 * (runtime/launch.c) and the order the CUDA C declares are one list. Each
 * role has one type and one name; the few names that differ by pattern
 * (the block pattern's offsets, total_tokens and num_items) are chosen
 * here. Templates write `@KERNEL_NAME@(@PARAMS@)`. */
#include <stdio.h>
#include <string.h>

#include "plan.h"

/* The declaration of role r in a kernel of pass `pass` (forward: O and the
 * logsumexp are outputs; backward: inputs). */
static const char *declaration(ag_param r, bool block, unsigned pass) {
  const bool fwd = pass == AG_PASS_FORWARD;
  switch (r) {
    case AG_PARAM_Q: return "const unsigned short *__restrict__ q";
    case AG_PARAM_K: return "const unsigned short *__restrict__ k";
    case AG_PARAM_V: return "const unsigned short *__restrict__ v";
    case AG_PARAM_O:
      return fwd ? "unsigned short *__restrict__ o" : "const unsigned short *__restrict__ o";
    case AG_PARAM_DOUT: return "const unsigned short *__restrict__ dout";
    case AG_PARAM_DQ: return "unsigned short *__restrict__ dq";
    case AG_PARAM_DK: return "unsigned short *__restrict__ dk";
    case AG_PARAM_DV: return "unsigned short *__restrict__ dv";
    case AG_PARAM_LSE: return fwd ? "float *__restrict__ lse" : "const float *__restrict__ lse";
    case AG_PARAM_DI: return "float *__restrict__ di";
    case AG_PARAM_ROTARY_TABLE: return "const unsigned short *__restrict__ rotary_table";
    case AG_PARAM_ROTARY_TABLE_K: return "const unsigned short *__restrict__ rotary_table_k";
    case AG_PARAM_OFFSETS_Q:
      return block ? "const int *__restrict__ offsets" : "const int *__restrict__ cu_seqlens_q";
    case AG_PARAM_OFFSETS_K: return "const int *__restrict__ cu_seqlens_k";
    case AG_PARAM_BATCH: return "long long batch";
    case AG_PARAM_HEADS: return "int heads";
    case AG_PARAM_KV_HEADS: return "int kv_heads";
    case AG_PARAM_TOTAL_Q: return block ? "long long total_tokens" : "long long total_q";
    case AG_PARAM_TOTAL_K: return "long long total_k";
    case AG_PARAM_ITEMS: return block ? "long long num_items" : "long long num_tiles";
    case AG_PARAM_STRIDE_Q: return "int q_stride";
    case AG_PARAM_STRIDE_K: return "int k_stride";
    case AG_PARAM_STRIDE_V: return "int v_stride";
    case AG_PARAM_STRIDE_O: return "int o_stride";
    case AG_PARAM_STRIDE_DOUT: return "int dout_stride";
    case AG_PARAM_STRIDE_DQ: return "int dq_stride";
    case AG_PARAM_STRIDE_DK: return "int dk_stride";
    case AG_PARAM_STRIDE_DV: return "int dv_stride";
    case AG_PARAM_TMAP_Q: return "const __grid_constant__ ag_tmap tmap_q";
    case AG_PARAM_TMAP_DOUT: return "const __grid_constant__ ag_tmap tmap_dout";
    case AG_PARAM_TMAP_K: return "const __grid_constant__ ag_tmap tmap_k";
    case AG_PARAM_TMAP_V: return "const __grid_constant__ ag_tmap tmap_v";
    case AG_PARAM_COUNT: break;
  }
  return NULL;
}

enum { LINE_MAX_COLS = 100, CONTINUATION_INDENT = 4 };

bool ag_emit_params(const ag_plan *plan, const ag_plan_kernel *k, char *out, size_t cap) {
  const bool block = plan->pattern == AG_PATTERN_BLOCK_DIAGONAL;
  /* the entry point's stem, a suffix (a template of several kernels: "_dq_sum") and
   * "(" come before the first parameter */
  size_t col = strlen(k->template_name) + 8, n = 0;
  out[0] = '\0';
  for (int i = 0; i < k->nparams; i++) {
    const char *d = declaration(k->params[i], block, k->pass);
    if (!d) return false;
    const size_t len = strlen(d), tail = i + 1 < k->nparams ? 1 : 3; /* "," or ") {" */
    const char *sep = i == 0 ? "" : " ";
    if (i > 0 && col + 1 + len + tail > LINE_MAX_COLS) {
      sep = "\n    ";
      col = CONTINUATION_INDENT;
    } else {
      col += strlen(sep);
    }
    const int w = snprintf(out + n, cap - n, "%s%s%s", sep, d, i + 1 < k->nparams ? "," : "");
    if (w < 0 || (size_t)w >= cap - n) return false;
    n += (size_t)w;
    col += len + (i + 1 < k->nparams ? 1 : 0);
  }
  return true;
}
