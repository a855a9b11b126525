// SPDX-License-Identifier: BSD-3-Clause
/* check_emit.c: the plan and the emitted CUDA C: golden files (golden/NAME.yaml
 * gives golden/NAME.cu byte for byte; AG_UPDATE_GOLDENS=1 rewrites them),
 * determinism, plan decisions for the shapes that matter, and specs whose
 * kernels do not exist yet. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attngen.h"
#include "plan.h"
#include "util.h"

static const char *const goldens[] = {
    "block64_d128_bf16",        "block64_d64_fp16_causal",         "block256_d128_scale",
    "rope_table_b64_d128_bf16", "rope_half_sequence_d64_fp16_bwd",
    /* every rotary layout with every position mode */
    "rope_interleaved_sequence_b32_d64_bf16", "rope_interleaved_block_b64_d128_fp16_bwd",
    "rope_half_table_b64_d128_bf16_causal", "rope_half_block_b16_d64_fp16",
    /* the backward of blocks walked in chunks, without and with rotary */
    "block256_d64_fp16_causal_bwd", "rope_half_sequence_b256_d128_bf16_chunked",
    "rope_interleaved_table_b192_d64_fp16_causal_bwd",
    /* the jagged pattern: both passes (the backward's two kernels in
     * namespace bwd), and a two-sided window with a given scale */
    "jagged_d128_bf16_causal_train", "jagged_d64_fp16_window", "broadcast_d128_bf16_train",
    "broadcast_d64_fp16_causal_window",
    /* sm_90a: the warp-specialized forward with the short variant (wgmma
     * at head dim 128, mma.sync at 64) and the fast backward (warp
     * specialized without a mask, at both head dims; with one at head dim
     * 128, where dV and dK are 64x128 products) */
    "jagged_d128_bf16_sm90_train", "jagged_d64_bf16_sm90_bwd", "jagged_d64_bf16_sm90_fwd",
    "jagged_d64_fp16_sm90_bwd", "jagged_d128_fp16_sm90_causal_bwd",
    /* sm_90a broadcast: 64 < n_q <= 128 on the wgmma one-pass backward;
     * the warp-specialized forward with a sequence's heads side by side and
     * head dim 64's 128-byte L2 fetches */
    "broadcast_d128_bf16_sm90_bwd", "broadcast_d64_bf16_sm90_fwd",
    /* rotary embeddings on the jagged mma.sync kernels (every arch) */
    "jagged_d128_bf16_rope_half_seq_train", "jagged_d64_fp16_rope_table_qkv_bwd",
    /* and with a broadcast Q (query row i at position i, or the table's
     * row i; _dq_sum rotates the summed dQ back) */
    "broadcast_d64_bf16_rope_table_train", "broadcast_d128_fp16_rope_half_seq_causal_train",
    /* row_strides: true (each tensor's row stride and kv_heads parameters) */
    "block64_d128_bf16_row_strides_train", "rope_table_b64_d64_fp16_row_strides_train",
};
enum { NGOLDENS = sizeof goldens / sizeof goldens[0] };

static ag_spec spec_of(const char *yaml) {
  ag_spec spec;
  ag_error err = {0};
  ag_status st = ag_spec_load_string(yaml, strlen(yaml), "t.yaml", &spec, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message ? err.message : "");
  return spec;
}

START_TEST(test_golden) {
  char yaml_path[256], cu_path[256];
  snprintf(yaml_path, sizeof yaml_path, "golden/%s.yaml", goldens[_i]);
  snprintf(cu_path, sizeof cu_path, "golden/%s.cu", goldens[_i]);
  ag_spec spec;
  ag_error err = {0};
  ag_status st = ag_spec_load_file(yaml_path, &spec, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message);
  char *src, name[AG_KERNEL_NAME_MAX];
  ck_assert_msg(ag_emit(&spec, &src, name, &err) == AG_OK, "%s", err.message);
  if (ag_test_update_goldens()) ag_test_spit(cu_path, src, strlen(src));
  char *want = ag_test_slurp(cu_path, NULL);
  ck_assert_msg(want != NULL, "%s is missing", cu_path);
  ck_assert_msg(strcmp(src, want) == 0, "%s differs from the emitted source", cu_path);
  /* Nothing of the template language is left, and the banner names only the
   * file's basename (no paths, no dates). */
  ck_assert_ptr_null(strchr(src, '@'));
  char banner[128];
  snprintf(banner, sizeof banner, "from %s.yaml; do not edit", goldens[_i]);
  ck_assert_ptr_nonnull(strstr(src, banner));
  ck_assert_ptr_nonnull(strstr(src, name));
  free(want);
  free(src);
}
END_TEST

/* The launcher packs a kernel's arguments in its descriptor's role order
 * (runtime/launch.c: 64-bit sizes for batch, totals and items, 32-bit for
 * heads); the emitted declaration of every kernel of every golden names and
 * types them in that order. */
static const char *role_declaration(ag_param r, bool block) {
  switch (r) {
    case AG_PARAM_Q: return "*q";
    case AG_PARAM_K: return "*k";
    case AG_PARAM_V: return "*v";
    case AG_PARAM_O: return "*o";
    case AG_PARAM_DOUT: return "*dout";
    case AG_PARAM_DQ: return "*dq";
    case AG_PARAM_DK: return "*dk";
    case AG_PARAM_DV: return "*dv";
    case AG_PARAM_LSE: return "float*lse";
    case AG_PARAM_DI: return "float*di";
    case AG_PARAM_ROTARY_TABLE: return "*rotary_table";
    case AG_PARAM_ROTARY_TABLE_K: return "*rotary_table_k";
    case AG_PARAM_OFFSETS_Q: return block ? "int*offsets" : "int*cu_seqlens_q";
    case AG_PARAM_OFFSETS_K: return "int*cu_seqlens_k";
    case AG_PARAM_BATCH: return "long long batch";
    case AG_PARAM_HEADS: return "int heads";
    case AG_PARAM_KV_HEADS: return "int kv_heads";
    case AG_PARAM_TOTAL_Q: return block ? "long long total_tokens" : "long long total_q";
    case AG_PARAM_TOTAL_K: return "long long total_k";
    case AG_PARAM_ITEMS: return block ? "long long num_items" : "long long num_tiles";
    case AG_PARAM_TMAP_Q: return "__grid_constant__ ag_tmap tmap_q";
    case AG_PARAM_TMAP_DOUT: return "__grid_constant__ ag_tmap tmap_dout";
    case AG_PARAM_TMAP_K: return "__grid_constant__ ag_tmap tmap_k";
    case AG_PARAM_TMAP_V: return "__grid_constant__ ag_tmap tmap_v";
    case AG_PARAM_STRIDE_Q: return "int q_stride";
    case AG_PARAM_STRIDE_K: return "int k_stride";
    case AG_PARAM_STRIDE_V: return "int v_stride";
    case AG_PARAM_STRIDE_O: return "int o_stride";
    case AG_PARAM_STRIDE_DOUT: return "int dout_stride";
    case AG_PARAM_STRIDE_DQ: return "int dq_stride";
    case AG_PARAM_STRIDE_DK: return "int dk_stride";
    case AG_PARAM_STRIDE_DV: return "int dv_stride";
    default: return "?";
  }
}

START_TEST(test_params_follow_the_plan) {
  char yaml_path[256];
  snprintf(yaml_path, sizeof yaml_path, "golden/%s.yaml", goldens[_i]);
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_file(yaml_path, &spec, &err), AG_OK);
  ag_plan plan;
  ck_assert_int_eq(ag_plan_make(&spec, &plan, &err), AG_OK);
  char *src;
  ck_assert_int_eq(ag_emit_plan(&spec, &plan, &src, &err), AG_OK);
  const bool block = plan.pattern == AG_PATTERN_BLOCK_DIAGONAL;
  for (int i = 0; i < plan.nkernels; i++) {
    const ag_plan_kernel *k = &plan.kernels[i];
    char def[AG_KERNEL_NAME_MAX + 4];
    snprintf(def, sizeof def, "\n%s(", k->name);
    const char *at = strstr(src, def);
    ck_assert_msg(at != NULL, "%s: no definition of %s", goldens[_i], k->name);
    at += strlen(def);
    for (int p = 0; p < k->nparams; p++) {
      /* one declaration, up to ',' or ')', without const, __restrict__ or
       * the 16-bit type's words, one blank between words but none at a star */
      const size_t n = strcspn(at, ",)");
      char decl[160], got[160];
      ck_assert_uint_lt(n, sizeof decl);
      memcpy(decl, at, n);
      decl[n] = '\0';
      for (char *r; (r = strstr(decl, "__restrict__"));) memset(r, ' ', strlen("__restrict__"));
      size_t g = 0;
      got[0] = '\0';
      for (char *w = strtok(decl, " \n"); w; w = strtok(NULL, " \n")) {
        if (!strcmp(w, "const") || !strcmp(w, "unsigned") || !strcmp(w, "short")) continue;
        g += (size_t)snprintf(got + g, sizeof got - g, "%s%s", g ? " " : "", w);
      }
      /* "int *x", "*x", "float *x": no blank beside a star */
      for (char *r; (r = strstr(got, " *")) || (r = strstr(got, "* "));)
        memmove(r + (r[0] == ' ' ? 0 : 1), r + (r[0] == ' ' ? 1 : 2),
                strlen(r + (r[0] == ' ' ? 1 : 2)) + 1);
      ck_assert_msg(strcmp(got, role_declaration(k->params[p], block)) == 0,
                    "%s: %s's parameter %d is \"%s\", its role wants \"%s\"", goldens[_i],
                    k->name, p, got, role_declaration(k->params[p], block));
      at += n + 1;
      ck_assert_int_eq(at[-1], p + 1 < k->nparams ? ',' : ')');
    }
  }
  free(src);
  /* a kernel that a template before it defines shares that one's parameters */
  for (int i = 1; i < plan.nkernels; i++) {
    if (plan.kernels[i].template_file) continue;
    plan.kernels[i].nparams--;
    ck_assert_int_eq(ag_emit_plan(&spec, &plan, &src, &err), AG_ERR_TEMPLATE);
    ck_assert_ptr_nonnull(strstr(err.message, "parameters differ"));
    ck_assert_ptr_null(src);
    ag_error_clear(&err);
    break;
  }
}
END_TEST

START_TEST(test_deterministic) {
  ag_spec spec = spec_of("name: d\npattern: block_diagonal\nhead_dim: 64\ndtype: bf16\n");
  char *a, *b;
  ag_error err = {0};
  ck_assert_int_eq(ag_emit(&spec, &a, NULL, &err), AG_OK);
  ck_assert_int_eq(ag_emit(&spec, &b, NULL, &err), AG_OK);
  ck_assert_str_eq(a, b);
  free(a);
  free(b);
}
END_TEST

/* Only what the spec needs: no causal mask without causal, fp16 PTX only
 * for fp16, the scale as a literal. */
START_TEST(test_only_what_is_needed) {
  ag_spec spec = spec_of("name: n\npattern: block_diagonal\nhead_dim: 128\ndtype: fp16\n"
                         "softmax_scale: 0.5\n");
  char *src;
  ag_error err = {0};
  ck_assert_int_eq(ag_emit(&spec, &src, NULL, &err), AG_OK);
  ck_assert_ptr_null(strstr(src, "col > (e < 2 ? r_lo : r_hi)"));
  ck_assert_ptr_null(strstr(src, "bf16"));
  ck_assert_ptr_nonnull(strstr(src, ".f32.f16.f16.f32"));
  ck_assert_ptr_nonnull(strstr(src, "kScaleLog2 = 7.213475204e-01f"));
  free(src);
  spec.causal = true;
  ck_assert_int_eq(ag_emit(&spec, &src, NULL, &err), AG_OK);
  ck_assert_ptr_nonnull(strstr(src, "col > (e < 2 ? r_lo : r_hi)"));
  free(src);
}
END_TEST

START_TEST(test_plan_decisions) {
  ag_error err = {0};
  ag_plan p;
  ag_spec s = spec_of("name: p\npattern: block_diagonal\nhead_dim: 128\ndtype: bf16\n");
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_str_eq(p.kernels[0].name, "ag_p_b64_d128_bf16_fwd");
  ck_assert_int_eq(p.fwd.heads_per_tile, 1);
  ck_assert_int_eq(p.fwd.warps, 4);
  ck_assert_int_eq(p.fwd.stages, 2);
  ck_assert_int_eq(p.fwd.smem_bytes, 2 * 3 * 64 * 128 * 2);
  ck_assert_int_eq(p.fwd.items_per_cta, 4);
  /* head_dim 64: two heads per tile, so rows stay 256 contiguous bytes;
   * one tile per CTA, four CTAs per SM, one CTA per 2 tiles. */
  s.head_dim = 64;
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_int_eq(p.fwd.heads_per_tile, 2);
  ck_assert_int_eq(p.fwd.jobs_per_warp, 2);
  ck_assert_int_eq(p.fwd.stages, 1);
  ck_assert_int_eq(p.fwd.smem_bytes, 3 * 64 * 128 * 2);
  ck_assert_int_eq(p.fwd.min_ctas_per_sm, 4);
  ck_assert_int_eq(p.fwd.items_per_cta, 2);
  /* 256-token blocks at 128: 8 warps taking two row tiles each, one stage
   * (two would need 384 KiB). */
  s.head_dim = 128;
  s.block_size = 256;
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_int_eq(p.fwd.warps, 8);
  ck_assert_int_eq(p.fwd.jobs_per_warp, 2);
  ck_assert_int_eq(p.fwd.stages, 1);
  ck_assert_int_le(p.fwd.smem_bytes, 227 * 1024);
  /* 16-token blocks: one warp. */
  s.block_size = 16;
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_int_eq(p.fwd.threads, 32);
  /* Every supported shape fits in shared memory. */
  for (int b = 16; b <= 256; b += 16)
    for (int d = 64; d <= 128; d += 64) {
      s.block_size = b;
      s.head_dim = d;
      ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
      ck_assert_int_le(p.fwd.smem_bytes, 227 * 1024);
      ck_assert_int_ge(p.fwd.warps * p.fwd.jobs_per_warp * 16, b * p.fwd.heads_per_tile);
      ck_assert_int_lt((p.fwd.warps * p.fwd.jobs_per_warp - p.fwd.warps) * 16, b * p.fwd.heads_per_tile);
    }
}
END_TEST

/* Kernels that do not exist yet are refused by the plan, not emitted. */
START_TEST(test_unsupported) {
  ag_spec s = spec_of("name: u\npattern: block_diagonal\nhead_dim: 64\ndtype: bf16\n");
  ag_error err = {0};
  char *src = (char *)1;
  ag_spec j = s;
  j.pattern = AG_PATTERN_JAGGED;
  j.block_size = 0;
  j.rotary.layout = AG_ROTARY_HALF;
  j.rotary.apply_to = AG_APPLY_Q | AG_APPLY_K;
  j.rotary.positions = AG_POSITIONS_SEQUENCE;
  j.rotary.base = 1e-31; /* valid, but its frequencies overflow fp32 */
  j.query = AG_QUERY_BROADCAST;
  ck_assert_int_eq(ag_emit(&j, &src, NULL, &err), AG_ERR_UNSUPPORTED);
  ck_assert_ptr_null(src);
  ck_assert_str_eq(err.message,
                   "not supported yet: rotary base 1e-31 (below 1e-30 its frequencies overflow "
                   "fp32)");
  ag_error_clear(&err);
  /* Rotary embeddings are planned (check_rotary.c); what does not fit is
   * refused there. */
}
END_TEST

Suite *emit_suite(void) {
  Suite *s = suite_create("emit");
  TCase *tc = tcase_create("emit");
  tcase_add_loop_test(tc, test_golden, 0, NGOLDENS);
  tcase_add_loop_test(tc, test_params_follow_the_plan, 0, NGOLDENS);
  tcase_add_test(tc, test_deterministic);
  tcase_add_test(tc, test_only_what_is_needed);
  tcase_add_test(tc, test_plan_decisions);
  tcase_add_test(tc, test_unsupported);
  suite_add_tcase(s, tc);
  return s;
}
