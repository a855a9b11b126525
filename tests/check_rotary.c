// SPDX-License-Identifier: BSD-3-Clause
/* check_rotary.c: rotary embeddings (RoPE) in the block-diagonal kernels,
 * on the CPU, no GPU: specs that ask for them (validation, and its refusal
 * of what the plan refuses), the plan (names, shared memory with the table
 * rows, refusals), the emitted source (determinism, only what the spec
 * needs), NVRTC compiles for sm_90a and sm_80 with ptxas's register and
 * spill report, and the launch parameters through a fake driver. The
 * float64 reference is checked in check_reference.c; the goldens are in
 * check_emit.c. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_driver.h"
#include "runtime.h"
#include "util.h"

enum { MAX_SMEM = 227 * 1024, QK = AG_APPLY_Q | AG_APPLY_K, QKV = QK | AG_APPLY_V };

/* A spec with rotary embeddings (base 10000, written only for computed
 * positions) and these passes, loaded from YAML as a user writes it.
 * `*out_st` gets the status: AG_OK, or AG_ERR_UNSUPPORTED for shapes the
 * plan refuses (the spec is filled all the same). */
static ag_spec rope_spec_status(const char *name, int block, int dim, ag_dtype dtype,
                                bool causal, ag_rotary_layout layout,
                                ag_rotary_positions positions, unsigned apply_to,
                                unsigned passes, ag_status *out_st) {
  static const char *const layouts[] = {"none", "interleaved", "half"};
  static const char *const position_names[] = {"table", "sequence", "block"};
  char apply[16] = "", list[32];
  for (int i = 0; i < 3; i++)
    if (apply_to & (AG_APPLY_Q << i))
      snprintf(apply + strlen(apply), sizeof apply - strlen(apply), "%s%c", apply[0] ? ", " : "",
               "qkv"[i]);
  snprintf(list, sizeof list, "%s%s%s", passes & AG_PASS_FORWARD ? "forward" : "",
           passes == (AG_PASS_FORWARD | AG_PASS_BACKWARD) ? ", " : "",
           passes & AG_PASS_BACKWARD ? "backward" : "");
  char rotary[128] = ""; /* none for AG_ROTARY_NONE: the same spec without */
  if (layout != AG_ROTARY_NONE)
    snprintf(rotary, sizeof rotary, "rotary:\n  layout: %s\n  apply_to: [%s]\n  positions: %s\n%s",
             layouts[layout], apply, position_names[positions],
             positions == AG_POSITIONS_TABLE ? "" : "  base: 10000.0\n");
  char yaml[512];
  snprintf(yaml, sizeof yaml,
           "name: %s\npattern: block_diagonal\nblock_size: %d\nhead_dim: %d\ndtype: %s\n"
           "causal: %s\n%spasses: [%s]\n",
           name, block, dim, dtype == AG_DTYPE_FP16 ? "fp16" : "bf16", causal ? "true" : "false",
           rotary, list);
  ag_spec spec;
  ag_error err = {0};
  *out_st = ag_spec_load_string(yaml, strlen(yaml), "r.yaml", &spec, &err);
  ck_assert_msg(*out_st == AG_OK || *out_st == AG_ERR_UNSUPPORTED, "%s\n%s",
                err.message ? err.message : "", yaml);
  ag_error_clear(&err);
  ck_assert_int_eq(spec.rotary.layout, layout);
  ck_assert_uint_eq(spec.passes, passes);
  if (layout != AG_ROTARY_NONE) {
    ck_assert_int_eq(spec.rotary.positions, positions);
    ck_assert_uint_eq(spec.rotary.apply_to, apply_to);
    ck_assert(spec.rotary.base == 10000.0);
  }
  return spec;
}

/* The same for a spec validation accepts. */
static ag_spec rope_spec(const char *name, int block, int dim, ag_dtype dtype, bool causal,
                         ag_rotary_layout layout, ag_rotary_positions positions,
                         unsigned apply_to, unsigned passes) {
  ag_status st;
  ag_spec spec = rope_spec_status(name, block, dim, dtype, causal, layout, positions, apply_to,
                                  passes, &st);
  ck_assert_int_eq(st, AG_OK);
  return spec;
}

static char *emit(const ag_spec *s, char *name) {
  char *src = NULL;
  ag_error err = {0};
  ag_status st = ag_emit(s, &src, name, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message);
  ck_assert_ptr_null(strchr(src, '@'));
  return src;
}

/* ---- validation ---------------------------------------------------------------- */

/* Users ask for rotary embeddings in the spec: validation accepts them and
 * fills `rotary`, and the plan and the emitter build them. */
START_TEST(validation_accepts) {
  const char yaml[] = "name: g\npattern: block_diagonal\nhead_dim: 128\ndtype: bf16\n"
                      "rotary:\n  layout: half\n  apply_to: [q, k, v]\n  positions: block\n"
                      "  base: 500000.0\npasses: [forward, backward]\n";
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "g.yaml", &spec, &err), AG_OK);
  ck_assert_ptr_null(err.message);
  ck_assert_int_eq(spec.rotary.layout, AG_ROTARY_HALF);
  ck_assert_uint_eq(spec.rotary.apply_to, QKV);
  ck_assert_int_eq(spec.rotary.positions, AG_POSITIONS_BLOCK);
  ck_assert(spec.rotary.base == 500000.0);
  ck_assert_uint_eq(spec.passes, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  char name[AG_KERNEL_NAME_MAX];
  char *src = emit(&spec, name);
  ck_assert_str_eq(name, "ag_g_b64_d128_bf16_rope_fwd");
  ck_assert_ptr_nonnull(strstr(src, "ag_g_b64_d128_bf16_rope_bwd("));
  free(src);
  /* The table positions (the default), with the defaults of apply_to. */
  const char table[] = "name: g\npattern: block_diagonal\nhead_dim: 64\ndtype: fp16\n"
                       "rotary: {layout: interleaved}\n";
  ck_assert_int_eq(ag_spec_load_string(table, strlen(table), "g.yaml", &spec, &err), AG_OK);
  ck_assert_int_eq(spec.rotary.layout, AG_ROTARY_INTERLEAVED);
  ck_assert_int_eq(spec.rotary.positions, AG_POSITIONS_TABLE);
  ck_assert_uint_eq(spec.rotary.apply_to, QK);
  ck_assert_uint_eq(spec.passes, AG_PASS_FORWARD);
  src = emit(&spec, name);
  ck_assert_str_eq(name, "ag_g_b64_d64_fp16_rope_fwd");
  free(src);
}
END_TEST

/* What the plan refuses, validation refuses at the key that asks for it:
 * the forward's table rows at `rotary` (the backward of the same block
 * fits: walked in chunks, it reads the table in global memory), a reason
 * shared by both passes once. */
START_TEST(validation_refuses_what_does_not_fit) {
  ag_status st;
  ag_spec s = rope_spec_status("g", 240, 128, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                               AG_POSITIONS_TABLE, QK, AG_PASS_FORWARD | AG_PASS_BACKWARD, &st);
  ck_assert_int_eq(st, AG_ERR_UNSUPPORTED);
  ag_error err = {0};
  char yaml[512];
  snprintf(yaml, sizeof yaml,
           "name: g\npattern: block_diagonal\nblock_size: 240\nhead_dim: 128\ndtype: bf16\n"
           "rotary: {layout: interleaved}\npasses: [forward, backward]\n");
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "g.yaml", &s, &err),
                   AG_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(err.message, "g.yaml:6:1: error: not supported yet: rotary "
                                            "positions from a table at block_size 240 with "
                                            "head_dim 128 ("));
  ck_assert_int_eq(ag_test_count(err.message, "error:"), 1);
  ag_error_clear(&err);
  /* The backward alone of the same block. */
  snprintf(yaml, sizeof yaml,
           "name: g\npattern: block_diagonal\nblock_size: 240\nhead_dim: 128\ndtype: bf16\n"
           "rotary: {layout: interleaved}\npasses: [backward]\n");
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "g.yaml", &s, &err), AG_OK);
  /* Computed positions of the same block size fit the forward. */
  snprintf(yaml, sizeof yaml,
           "name: g\npattern: block_diagonal\nblock_size: 240\nhead_dim: 128\ndtype: bf16\n"
           "rotary: {layout: interleaved, positions: sequence}\n");
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "g.yaml", &s, &err), AG_OK);
  /* A base whose frequencies overflow fp32: one error, at `rotary`. */
  snprintf(yaml, sizeof yaml,
           "name: g\npattern: block_diagonal\nhead_dim: 64\ndtype: bf16\n"
           "rotary: {layout: half, positions: block, base: 1e-35}\npasses: [forward, backward]\n");
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "g.yaml", &s, &err),
                   AG_ERR_UNSUPPORTED);
  ck_assert_int_eq(ag_test_count(err.message, "error:"), 1);
  ck_assert_ptr_nonnull(strstr(err.message, "g.yaml:5:1: error: not supported yet: rotary base "
                                            "1e-35 (below 1e-30"));
  ck_assert(s.rotary.base == 1e-35);
  ag_error_clear(&err);
}
END_TEST

/* ---- the plan ---------------------------------------------------------------- */

START_TEST(plan_values) {
  ag_error err = {0};
  ag_plan p, plain;
  /* Table positions at 64 x 128: two stages of Q, K, V (48 KiB each) and
   * one slot of the table's 64 rows (16 KiB; fwd_table_slot): two CTAs
   * per SM. */
  ag_spec s = rope_spec("p", 64, 128, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                        AG_POSITIONS_TABLE, QKV, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_str_eq(ag_plan_kernel_for(&p, AG_PASS_FORWARD)->name, "ag_p_b64_d128_bf16_rope_fwd");
  ck_assert_str_eq(ag_plan_kernel_for(&p, AG_PASS_BACKWARD)->name, "ag_p_b64_d128_bf16_rope_bwd");
  ck_assert_int_eq(p.rotary_table_bytes, 64 * 128 * 2);
  ck_assert_int_eq(p.fwd.heads_per_tile, 1);
  ck_assert_int_eq(p.fwd.stages, 2);
  ck_assert_int_eq(p.fwd.smem_bytes, 2 * 3 * 64 * 256 + 64 * 256);
  ck_assert_int_eq(p.fwd.min_ctas_per_sm, 2);
  /* The backward (q, k and v rotated): one stage of Q, K, V, dO and the
   * table rows (P and dS later where K and V were); two such CTAs per SM,
   * for registers. */
  ck_assert_int_eq(p.bwd.stages, 1);
  ck_assert(p.bwd.pds_overlay);
  ck_assert(!p.bwd.bulk_store); /* staging rows only at head_dim 64 */
  ck_assert_int_eq(p.bwd.smem_bytes, 4 * 64 * 256 + 64 * 256);
  ck_assert_int_eq(p.bwd.min_ctas_per_sm, 2);
  /* head_dim 64: two heads per forward tile, one stage, four CTAs; the
   * table rows (one row serves both heads) are 64 x 64. The backward takes
   * one head per tile and one stage: three CTAs of 170 registers
   * (bwd_rotary_12_warps). */
  s = rope_spec("p", 64, 64, AG_DTYPE_FP16, true, AG_ROTARY_HALF, AG_POSITIONS_TABLE, QK,
                AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_str_eq(ag_plan_kernel_for(&p, AG_PASS_FORWARD)->name, "ag_p_b64_d64_fp16_causal_rope_fwd");
  ck_assert_str_eq(ag_plan_kernel_for(&p, AG_PASS_BACKWARD)->name, "ag_p_b64_d64_fp16_causal_rope_bwd");
  ck_assert_int_eq(p.fwd.heads_per_tile, 2);
  ck_assert_int_eq(p.fwd.smem_bytes, 3 * 64 * 256 + 64 * 128);
  ck_assert_int_eq(p.fwd.min_ctas_per_sm, 4);
  ck_assert_int_eq(p.bwd.heads_per_tile, 1);
  ck_assert_int_eq(p.bwd.stages, 1);
  ck_assert_int_eq(p.bwd.smem_bytes, 4 * 64 * 128 + 64 * 128 + 4 * 16 * 72 * 2);
  ck_assert_int_eq(p.bwd.min_ctas_per_sm, 3);

  /* Computed positions cost no memory: the forward's plan is the plain one
   * but for the names; the backward's too, but for fewer CTAs per SM (2
   * rather than 3: registers for the angles); half pairs keep dQ's early
   * order (bwd_late_dq takes interleaved pairs only). */
  for (int pos = AG_POSITIONS_SEQUENCE; pos <= AG_POSITIONS_BLOCK; pos++) {
    s = rope_spec("p", 64, 128, AG_DTYPE_BF16, false, AG_ROTARY_HALF, (ag_rotary_positions)pos,
                  QK, AG_PASS_FORWARD | AG_PASS_BACKWARD);
    ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
    ag_spec none = s;
    none.rotary.layout = AG_ROTARY_NONE;
    ck_assert_int_eq(ag_plan_make(&none, &plain, &err), AG_OK);
    ck_assert_int_eq(p.rotary_table_bytes, 0);
    ck_assert_str_eq(plain.kernels[0].name, "ag_p_b64_d128_bf16_fwd");
    ck_assert_int_eq(p.bwd.min_ctas_per_sm, 2);
    ck_assert_int_eq(plain.bwd.min_ctas_per_sm, 3);
    p.bwd.min_ctas_per_sm = 3;
    ck_assert(!p.bwd.late_dq);
    ck_assert_int_eq(memcmp(&p.fwd, &plain.fwd, sizeof p.fwd), 0);
    ck_assert_int_eq(memcmp(&p.bwd, &plain.bwd, sizeof p.bwd), 0);
  }

  /* Every block size with a table: what fits is planned within the limits
   * with the rows in every stage; what does not is refused with the reason. */
  for (int dim = 64; dim <= 128; dim += 64)
    for (int b = 16; b <= 256; b += 16) {
      ag_status valid;
      s = rope_spec_status("p", b, dim, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                           AG_POSITIONS_TABLE, QK, AG_PASS_FORWARD, &valid);
      const int table = b * dim * 2;
      ag_status st = ag_plan_make(&s, &p, &err);
      ck_assert_int_eq(valid, st); /* validation refuses what the plan refuses */
      if (dim == 128 && b > 224) { /* Q, K, V and the rows of one block: over 227 KiB */
        ck_assert_int_eq(st, AG_ERR_UNSUPPORTED);
        char want[128];
        snprintf(want, sizeof want,
                 "not supported yet: rotary positions from a table at block_size %d with "
                 "head_dim 128 (",
                 b);
        ck_assert_msg(strncmp(err.message, want, strlen(want)) == 0, "%s", err.message);
        ag_error_clear(&err);
      } else {
        ck_assert_msg(st == AG_OK, "b%d d%d: %s", b, dim, err.message);
        ck_assert_int_eq(p.rotary_table_bytes, table);
        /* fwd_table_slot: one slot of rows after the stages at 64 x 128 */
        ck_assert_int_eq(p.fwd.table_slot, dim == 128 && b == 64);
        ck_assert_int_eq(p.fwd.smem_bytes,
                         p.fwd.table_slot
                             ? p.fwd.stages * p.fwd.heads_per_tile * 3 * b * dim * 2 + table
                             : p.fwd.stages * (p.fwd.heads_per_tile * 3 * b * dim * 2 + table));
        ck_assert_int_le(p.fwd.smem_bytes * p.fwd.min_ctas_per_sm, MAX_SMEM);
      }
      s = rope_spec("p", b, dim, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                    AG_POSITIONS_TABLE, QK, AG_PASS_BACKWARD);
      ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
      const ag_plan_bwd *w = &p.bwd;
      if (w->key_chunks) {
        /* One block's P and dS beside its tiles and rows do not fit (the
         * rows move that point below the one without rotary: 128 tokens
         * at head_dim 128 are walked in chunks only with a table): it is
         * walked in chunks, which read the table in global memory, so
         * its shared memory is the six chunks and the statistics alone. */
        ck_assert_int_ge(b, dim == 64 ? 160 : 128);
        ck_assert_int_eq(w->smem_bytes, 6 * 64 * dim * 2 + 12 * ((b + 63) / 64 * 64));
        ck_assert_int_eq(w->min_ctas_per_sm, 2);
        ck_assert_int_le(w->smem_bytes * w->min_ctas_per_sm, MAX_SMEM);
        continue;
      }
      const int stride = b % 64 == 0 ? b : b + 8;
      ck_assert(!w->table_global); /* bwd_table_global is off: slower */
      const int rest = w->stages * (4 * b * dim * 2 * w->heads_per_tile + table) +
                       (w->pds_overlay ? 0 : 2 * w->heads_per_tile * b * stride * 2);
      const int staging = w->warps * 16 * 72 * 2;
      ck_assert_int_eq(w->bulk_store,
                       dim == 64 && (rest + staging) * w->min_ctas_per_sm <= MAX_SMEM);
      ck_assert_int_eq(w->smem_bytes, rest + (w->bulk_store ? staging : 0));
      /* 255 registers a thread; bwd_rotary_12_warps: 170 at head_dim 64, blocks up to 64 */
      ck_assert_int_le(w->warps * w->min_ctas_per_sm, dim == 64 && b <= 64 ? 12 : 8);
      ck_assert_int_le(w->smem_bytes * w->min_ctas_per_sm, MAX_SMEM);
    }

  /* Fields a validated spec cannot hold, set by hand. */
  s = rope_spec("p", 64, 64, AG_DTYPE_BF16, false, AG_ROTARY_HALF, AG_POSITIONS_BLOCK, QK,
                AG_PASS_FORWARD);
  s.rotary.apply_to = 0;
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_ERR_SPEC);
  ag_error_clear(&err);
  s.rotary.apply_to = QK;
  s.rotary.base = 0; /* refused before planning, as every hand-filled field (issue 22) */
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_ERR_INVALID_ARGUMENT);
  ag_error_clear(&err);
  /* A base so small its frequencies overflow fp32 (validation_refuses_what_does_not_fit
   * reads the same from a spec). */
  s.rotary.base = 1e-35;
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_ERR_UNSUPPORTED);
  ck_assert_str_eq(err.message,
                   "not supported yet: rotary base 1e-35 (below 1e-30 its frequencies overflow "
                   "fp32)");
  ag_error_clear(&err);
}
END_TEST

/* ---- the source -------------------------------------------------------------- */

/* The emitted body: everything after the banner comment. */
static const char *body(const char *src) {
  const char *end = strstr(src, " */\n\n");
  ck_assert_ptr_nonnull(end);
  return end + 5;
}

START_TEST(source_determinism_and_names) {
  char name[AG_KERNEL_NAME_MAX];
  ag_spec s = rope_spec("e", 64, 128, AG_DTYPE_BF16, true, AG_ROTARY_INTERLEAVED,
                        AG_POSITIONS_SEQUENCE, QKV, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  char *a = emit(&s, name), *b = emit(&s, NULL);
  ck_assert_str_eq(a, b);
  ck_assert_str_eq(name, "ag_e_b64_d128_bf16_causal_rope_fwd");
  ck_assert_ptr_nonnull(strstr(a, "ag_e_b64_d128_bf16_causal_rope_fwd(const unsigned short"));
  ck_assert_ptr_nonnull(strstr(a, "ag_e_b64_d128_bf16_causal_rope_bwd(const unsigned short"));
  ck_assert_ptr_nonnull(strstr(a, " *   rotary:\n *     layout: interleaved\n"
                                  " *     apply_to: [q, k, v]\n *     positions: sequence\n"
                                  " *     base: 10000\n"));
  /* Each kernel has its own rotary section (the backward's in namespace
   * bwd) and one definition of unpack2 (the forward's, or phase 1's). */
  ck_assert_int_eq(ag_test_count(a, "begin rotary embeddings"), 2);
  ck_assert_int_eq(ag_test_count(a, "void unpack2("), 2);
  ck_assert_int_eq(ag_test_count(a, "kRotaryTurns[kPairs] = {"), 2);
  /* The forward is the same with or without the backward beside it. */
  s.passes = AG_PASS_FORWARD;
  char *fwd = emit(&s, name);
  const char *f = body(fwd);
  ck_assert_int_eq(strncmp(body(a), f, strlen(f)), 0);
  /* The backward alone: its own helpers and rotary section, with unpack2
   * only from phase 1. */
  s.passes = AG_PASS_BACKWARD;
  char *bwd = emit(&s, name);
  ck_assert_str_eq(name, "ag_e_b64_d128_bf16_causal_rope_bwd");
  ck_assert_int_eq(ag_test_count(bwd, "void unpack2("), 1);
  ck_assert_int_eq(ag_test_count(bwd, "begin rotary embeddings"), 1);
  ck_assert_ptr_null(strstr(bwd, "namespace"));
  free(a);
  free(b);
  free(fwd);
  free(bwd);
}
END_TEST

/* The inverse frequencies are byte-stable literals: base^(-2i / D) / (2 pi)
 * with %.9e, four a line. */
START_TEST(source_frequencies) {
  ag_spec s = rope_spec("e", 64, 64, AG_DTYPE_FP16, false, AG_ROTARY_HALF, AG_POSITIONS_BLOCK, QK,
                        AG_PASS_FORWARD);
  s.rotary.base = 500000.0;
  char *src = emit(&s, NULL);
  ck_assert_ptr_nonnull(strstr(src, "kRotaryBase = 5.000000000e+05f;"));
  const char *at = strstr(src, "__device__ constexpr float kRotaryTurns[kPairs] = {\n    ");
  ck_assert_ptr_nonnull(at);
  at = strchr(at, '\n') + 1;
  for (int i = 0; i < 32; i++) {
    char want[32];
    snprintf(want, sizeof want, "%.9ef", pow(500000.0, -2.0 * i / 64) / (2 * M_PI));
    while (*at == ' ' || *at == ',' || *at == '\n') at++;
    ck_assert_msg(strncmp(at, want, strlen(want)) == 0, "pair %d: want %s at %.20s", i, want, at);
    at += strlen(want);
  }
  ck_assert_int_eq(strncmp(at, "\n};\n", 4), 0);
  ck_assert_ptr_nonnull(strstr(src, "    1.591549431e-01f, "));
  free(src);
}
END_TEST

/* Only what the spec needs, for every combination: the table parameter,
 * load and reads only with table positions, sin/cos computed only without;
 * the sequence start only with sequence positions; each layout's own
 * rotation; V rotated (and dV rotated back) only when listed. */
START_TEST(source_only_what_is_needed) {
  for (int layout = AG_ROTARY_INTERLEAVED; layout <= AG_ROTARY_HALF; layout++)
    for (int pos = AG_POSITIONS_TABLE; pos <= AG_POSITIONS_BLOCK; pos++)
      for (int v = 0; v < 2; v++) {
        ag_spec s = rope_spec("o", 64, 64, AG_DTYPE_BF16, false, (ag_rotary_layout)layout,
                              (ag_rotary_positions)pos, v ? QKV : QK,
                              AG_PASS_FORWARD | AG_PASS_BACKWARD);
        char *src = emit(&s, NULL);
        const bool table = pos == AG_POSITIONS_TABLE;
        ck_assert_int_eq(ag_test_count(src, "rotary_table,") > 0, table);
        ck_assert_int_eq(ag_test_count(src, "load_table(") > 0, table);
        ck_assert_int_eq(ag_test_count(src, "table_at(") > 0, table);
        ck_assert_int_eq(ag_test_count(src, "kTableElems") > 0, table);
        ck_assert_int_eq(ag_test_count(src, "sincos") > 0, !table);
        ck_assert_int_eq(ag_test_count(src, "sin.approx") > 0, !table);
        ck_assert_int_eq(ag_test_count(src, "kRotaryTurns") > 0, !table);
        ck_assert_int_eq(ag_test_count(src, "pos0") > 0, pos == AG_POSITIONS_SEQUENCE);
        ck_assert_int_eq(ag_test_count(src, "rotate_halves(") > 0, layout == AG_ROTARY_HALF);
        ck_assert_int_eq(ag_test_count(src, "rotate_pair(") > 0, layout == AG_ROTARY_INTERLEAVED);
        /* Q and K always; V in the forward's and the backward's prologue. */
        ck_assert_int_eq(ag_test_count(src, "rotate_unit(stage, row"), 2);
        ck_assert_int_eq(ag_test_count(src, "rotate_unit(stage + kTileElems, row"), 2);
        ck_assert_int_eq(ag_test_count(src, "rotate_unit(stage + 2 * kTileElems, row"), v ? 2 : 0);
        /* The backward rotates back dQ, dK (and dV): dQ once, dK and dV
         * once in the mma.sync path and once in the wgmma path (64x64
         * tiles: the sm_90a code of phase 2 is its own). */
        ck_assert_int_eq(ag_test_count(src, "unrotate_rows(acc, stage, t, row0);"), 1);
        ck_assert_int_eq(ag_test_count(src, "unrotate_rows(acc, stage, t, r0);"), v ? 3 : 1);
        ck_assert_int_eq(ag_test_count(src, "unrotate_rows(acc_k, stage, t, r0);"), 1);
        ck_assert_int_eq(ag_test_count(src, "// dV = P^T dO\n  accumulate(acc, p_s, r0, do_s, c0, "
                                    "first_query_tile, tiles);\n  unrotate_rows"),
                         v);
        free(src);
      }
  /* No rotary code at all without rotary, forward and backward. */
  ag_spec s = rope_spec("o", 64, 128, AG_DTYPE_FP16, true, AG_ROTARY_NONE, AG_POSITIONS_TABLE,
                        0, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  char *src = emit(&s, NULL);
  ck_assert_ptr_null(strstr(src, "rotary"));
  ck_assert_ptr_null(strstr(src, "rotate"));
  ck_assert_ptr_null(strstr(src, "rope"));
  ck_assert_ptr_null(strstr(src, "pos0"));
  free(src);
}
END_TEST

/* The same for the backward of blocks walked in chunks
 * (block_bwd_chunked.cu), for every apply_to: each chunk of a rotated
 * tensor rotated as it lands (the resident ones once, before the ring,
 * the streamed ones at every step), each of dQ, dK, dV rotated back only
 * when its tensor is rotated; the table read in global memory (no stage,
 * no table rows loaded); the ring without rotary code when nothing is. */
START_TEST(source_chunked_only_what_is_needed) {
  for (int layout = AG_ROTARY_INTERLEAVED; layout <= AG_ROTARY_HALF; layout++)
    for (int pos = AG_POSITIONS_TABLE; pos <= AG_POSITIONS_BLOCK; pos++)
      for (unsigned a = 1; a <= QKV; a++) {
        ag_spec s = rope_spec("c", 256, 64, AG_DTYPE_BF16, a & 1, (ag_rotary_layout)layout,
                              (ag_rotary_positions)pos, a, AG_PASS_BACKWARD);
        char name[AG_KERNEL_NAME_MAX];
        char *src = emit(&s, name);
        const bool table = pos == AG_POSITIONS_TABLE, q = a & AG_APPLY_Q,
                   k = a & AG_APPLY_K, v = a & AG_APPLY_V;
        ck_assert_ptr_nonnull(strstr(name, "_rope_bwd"));
        ck_assert_ptr_nonnull(strstr(src, "the block walked in 64-row chunks"));
        ck_assert_int_eq(ag_test_count(src, "*__restrict__ rotary_table,"), table);
        ck_assert_int_eq(ag_test_count(src, "t.table = rotary_table + t.token0 * kHeadDim;"),
                         table);
        ck_assert_int_eq(ag_test_count(src, "rotary table: read in global memory"), table);
        ck_assert_int_eq(ag_test_count(src, "table_at(") > 0, table);
        ck_assert_int_eq(ag_test_count(src, "sin.approx") > 0, !table);
        ck_assert_int_eq(ag_test_count(src, "pos0") > 0, pos == AG_POSITIONS_SEQUENCE);
        ck_assert_int_eq(ag_test_count(src, "rotate_halves(") > 0, layout == AG_ROTARY_HALF);
        ck_assert_int_eq(ag_test_count(src, "rotate_pair(") > 0, layout == AG_ROTARY_INTERLEAVED);
        ck_assert_ptr_null(strstr(src, "kStageElems"));
        ck_assert_ptr_null(strstr(src, "rotate_tile"));
        ck_assert_ptr_null(strstr(src, "load_table("));
        ck_assert_int_eq(ag_test_count(src, "ring_wait("), 4); /* defined, called thrice */
        /* Q: resident in A (once), streamed in B (every step). */
        ck_assert_int_eq(ag_test_count(src, "rotate_copied(slots, nullptr, t, qc * kChunk);"), q);
        ck_assert_int_eq(
            ag_test_count(src, "rotate_copied(ring_slot(slots, i), nullptr, t, qc * kChunk);"),
            q);
        /* K, V: streamed in both sweeps of A, resident in B. */
        ck_assert_int_eq(ag_test_count(src, "rotate_keys(ring_slot(slots, kc), t, kc * kChunk);"),
                         k || v);
        ck_assert_int_eq(ag_test_count(src, "rotate_keys(ring_slot(slots, i), t, kc * kChunk);"),
                         k || v);
        ck_assert_int_eq(ag_test_count(src, "rotate_keys(slots, t, kc * kChunk);"), k || v);
        ck_assert_int_eq(ag_test_count(src, "rotate_copied(pair, pair + kChunkElems, t, r0);"),
                         k && v);
        ck_assert_int_eq(ag_test_count(src, "rotate_copied(pair, nullptr, t, r0);"), k && !v);
        ck_assert_int_eq(ag_test_count(src, "rotate_copied(pair + kChunkElems, nullptr, t, r0);"),
                         v && !k);
        /* the resident pair apart (to be rotated) where Q, or K or V, is */
        ck_assert_int_eq(ag_test_count(src, "start_chunk<1>("), q + (k || v));
        ck_assert_int_eq(ag_test_count(src, "start_chunk<0>("), 2 - q - (k || v));
        ck_assert_int_eq(ag_test_count(src, "unrotate_rows(acc, slots, t, qc * kChunk + row0);"),
                         q);
        ck_assert_int_eq(ag_test_count(src, "unrotate_rows(acc_k, slots, t, kc * kChunk + row0);"),
                         k);
        ck_assert_int_eq(ag_test_count(src, "unrotate_rows(acc_v, slots, t, kc * kChunk + row0);"),
                         v);
        free(src);
      }
  /* Without rotary: no rotary code in the chunked kernel either. */
  ag_spec s = rope_spec("c", 256, 128, AG_DTYPE_BF16, false, AG_ROTARY_NONE, AG_POSITIONS_TABLE,
                        0, AG_PASS_BACKWARD);
  char *src = emit(&s, NULL);
  ck_assert_ptr_nonnull(strstr(src, "the block walked in 64-row chunks"));
  ck_assert_ptr_null(strstr(src, "rotary"));
  ck_assert_ptr_null(strstr(src, "rotate"));
  ck_assert_ptr_null(strstr(src, "pos0"));
  ck_assert_int_eq(ag_test_count(src, "ring_wait("), 4); /* the same ring, unrotated */
  ck_assert_int_eq(ag_test_count(src, "start_chunk<0>("), 2);
  free(src);
}
END_TEST

/* ---- NVRTC ------------------------------------------------------------------- */

typedef struct compile_case {
  int block, dim;
  ag_dtype dtype;
  bool causal;
  ag_rotary_layout layout;
  ag_rotary_positions positions;
  unsigned apply_to, passes;
} compile_case;

/* Fifteen sources, each for sm_90a and sm_80 (30 compiles): both layouts
 * x the three position modes with both passes, each mode with q, k and
 * with q, k, v; then two forward-only; then seven with the backward of
 * blocks walked in chunks. Shapes vary: one head or two per tile,
 * 16 to 128 tokens, both dtypes, causal or not. (Not 112 to 144 tokens at
 * head_dim 64: there two CTAs of 7 or 8 warps cap the forward at 128
 * registers, where it spills without rotary already, 40 to 240 bytes, and
 * the rotation adds up to 50.) */
#define FB (AG_PASS_FORWARD | AG_PASS_BACKWARD)
static const compile_case compile_cases[] = {
    {64, 128, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED, AG_POSITIONS_TABLE, QKV, FB},
    {64, 64, AG_DTYPE_FP16, true, AG_ROTARY_HALF, AG_POSITIONS_TABLE, QK, FB},
    {16, 128, AG_DTYPE_FP16, true, AG_ROTARY_INTERLEAVED, AG_POSITIONS_SEQUENCE, QK, FB},
    {64, 128, AG_DTYPE_BF16, false, AG_ROTARY_HALF, AG_POSITIONS_SEQUENCE, QKV, FB},
    {128, 128, AG_DTYPE_BF16, true, AG_ROTARY_INTERLEAVED, AG_POSITIONS_BLOCK, QKV, FB},
    {48, 64, AG_DTYPE_FP16, false, AG_ROTARY_HALF, AG_POSITIONS_BLOCK, QK, FB},
    {128, 128, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED, AG_POSITIONS_TABLE, QK,
     AG_PASS_FORWARD},
    {64, 128, AG_DTYPE_FP16, true, AG_ROTARY_HALF, AG_POSITIONS_BLOCK, QKV, AG_PASS_FORWARD},
    /* The backward of blocks walked in chunks (block_bwd_chunked.cu), the
     * shapes of the GPU suite's chunked cases: at head_dim 128 the
     * backward alone (the forward of 256-token blocks with rotary spills
     * on its own, 128 bytes for sm_90a). */
    {256, 128, AG_DTYPE_BF16, true, AG_ROTARY_HALF, AG_POSITIONS_SEQUENCE, QK, AG_PASS_BACKWARD},
    {144, 128, AG_DTYPE_FP16, false, AG_ROTARY_INTERLEAVED, AG_POSITIONS_TABLE, QKV,
     AG_PASS_BACKWARD},
    {256, 128, AG_DTYPE_BF16, false, AG_ROTARY_HALF, AG_POSITIONS_BLOCK, QKV, AG_PASS_BACKWARD},
    {192, 64, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED, AG_POSITIONS_BLOCK, QK, FB},
    {256, 64, AG_DTYPE_BF16, true, AG_ROTARY_HALF, AG_POSITIONS_TABLE, QKV, FB},
    /* and one tensor alone: V (rotated back alone) or Q */
    {208, 64, AG_DTYPE_FP16, true, AG_ROTARY_HALF, AG_POSITIONS_SEQUENCE, AG_APPLY_V,
     AG_PASS_BACKWARD},
    {240, 64, AG_DTYPE_FP16, false, AG_ROTARY_INTERLEAVED, AG_POSITIONS_TABLE, AG_APPLY_Q,
     AG_PASS_BACKWARD},
};
#undef FB
enum { NCOMPILE = sizeof compile_cases / sizeof compile_cases[0] };

START_TEST(rotary_compiles) {
  const compile_case *c = &compile_cases[_i];
  char *dir = ag_test_mkdtemp("attngen-rope");
  setenv(AG_ENV_NVRTC_VERBOSE, "1", 1);
  setenv(AG_ENV_DUMP_DIR, dir, 1);
  ag_spec s = rope_spec("nv", c->block, c->dim, c->dtype, c->causal, c->layout, c->positions,
                        c->apply_to, c->passes);
  ag_plan p;
  ag_error err = {0};
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_int_eq(p.bwd.key_chunks, c->block > (c->dim == 64 ? 176 : 128));
  /* The chunked backward at head_dim 128 holds dK and dV, 128 floats,
   * through its key sweep at 255 registers: without rotary it spills 64
   * bytes already (bf16, not causal), with rotary up to about 100, mostly
   * where a chunk ends (sm_80 code read back: no spill in the matrix
   * loops of the interleaved layout, a few loads in the half layout's);
   * 64 everywhere else. */
  const int max_spill = p.bwd.key_chunks && c->dim == 128 ? 128 : 64;
  char *src = emit(&s, NULL);
  const char *archs[] = {"sm_90a", "sm_80"};
  const char *kernels[] = {p.nkernels > 0 ? p.kernels[0].name : "",
                           p.nkernels > 1 ? p.kernels[1].name : ""};
  const char *name = ag_plan_first_kernel(&p); /* the source's: "" without a forward */
  for (int a = 0; a < 2; a++) {
    void *cubin = NULL;
    size_t size = 0;
    ag_status st = ag_nvrtc_compile(src, name, archs[a], &cubin, &size, &err);
    ck_assert_msg(st == AG_OK, "%s for %s: %s", name, archs[a], err.message);
    ck_assert_uint_gt(size, 64);
    ck_assert_mem_eq(cubin, "\x7f" "ELF", 4);
    free(cubin);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.log", dir, name);
    char *log = ag_test_slurp(path, NULL);
    ck_assert_ptr_nonnull(log);
    for (int k = 0; k < 2; k++) {
      if (!kernels[k][0]) continue;
      int regs = 0, stores = 0, loads = 0;
      if (ag_test_ptxas_report(log, kernels[k], &regs, &stores, &loads)) {
        printf("nvrtc %s %s: %d registers, %d bytes spill stores, %d bytes spill loads\n",
               kernels[k], archs[a], regs, stores, loads);
        ck_assert_msg(stores <= max_spill && loads <= max_spill, "%s for %s spills: %s",
                      kernels[k], archs[a], log);
      } else {
        /* NVRTC sometimes returns an empty log for -v (see check_nvrtc.c). */
        printf("SKIP spill check for %s %s: no ptxas report in the log\n", kernels[k], archs[a]);
      }
    }
    free(log);
  }
  free(src);
  unsetenv(AG_ENV_NVRTC_VERBOSE);
  unsetenv(AG_ENV_DUMP_DIR);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

/* The spec planned with and without a layout choice (`field` of
 * ag_plan_block_choices set on and off), and ag_plan_make's plan asserted
 * equal to the one of the checked choice. */
#define PLAN_BOTH(s, field, with, without)                                                  \
  do {                                                                                      \
    ag_plan_block_choices on_ = ag_plan_block_checked(), off_ = on_;                        \
    on_.field = true;                                                                       \
    off_.field = false;                                                                     \
    ag_plan checked_;                                                                       \
    ag_error e_ = {0};                                                                      \
    ck_assert_int_eq(ag_plan_block_with(s, on_, with, &e_), AG_OK);                         \
    ck_assert_int_eq(ag_plan_block_with(s, off_, without, &e_), AG_OK);                     \
    ck_assert_int_eq(ag_plan_make(s, &checked_, &e_), AG_OK);                               \
    const ag_plan *want_ = ag_plan_block_checked().field ? (with) : (without);              \
    ck_assert_int_eq(memcmp(&checked_.fwd, &want_->fwd, sizeof checked_.fwd), 0);           \
    ck_assert_int_eq(memcmp(&checked_.bwd, &want_->bwd, sizeof checked_.bwd), 0);           \
  } while (0)

/* The spec planned with `choices`, its kernels described and emitted: the
 * source (the caller frees it), every placeholder and condition expanded. */
static char *emit_with(const ag_spec *s, ag_plan_block_choices choices, ag_plan *p) {
  ag_error err = {0};
  ck_assert_msg(ag_plan_block_with(s, choices, p, &err) == AG_OK, "%s", err.message);
  ag_plan_kernels(s, p);
  char *src = NULL;
  ck_assert_msg(ag_emit_plan(s, p, &src, &err) == AG_OK, "%s", err.message);
  ck_assert_ptr_null(strchr(src, '@'));
  return src;
}

/* Every backward spec of interleaved pairs on q and k, both head dims,
 * blocks of 16 to 256 tokens and table or sequence positions that
 * validation accepts, planned with `field` of the choices on and off
 * (PLAN_BOTH), handed to check(). */
#define SWEEP_BACKWARD(field, check)                                                         \
  do {                                                                                      \
    for (int dim_ = 64; dim_ <= 128; dim_ += 64)                                            \
      for (int b_ = 16; b_ <= 256; b_ += 16)                                                \
        for (int pos_ = AG_POSITIONS_TABLE; pos_ <= AG_POSITIONS_SEQUENCE; pos_++) {        \
          ag_status valid_;                                                                 \
          ag_spec s_ = rope_spec_status("w", b_, dim_, AG_DTYPE_BF16, false,                \
                                        AG_ROTARY_INTERLEAVED, (ag_rotary_positions)pos_,   \
                                        QK, AG_PASS_BACKWARD, &valid_);                     \
          if (valid_ != AG_OK) continue;                                                    \
          ag_plan with_, without_;                                                          \
          PLAN_BOTH(&s_, field, &with_, &without_);                                         \
          check(dim_, b_, pos_, &with_, &without_);                                         \
        }                                                                                   \
  } while (0)

/* The forward's table rows in one slot after the two stages
 * (fwd_table_slot; on since the H200 timed it 1.5x faster, 2026-12-05):
 * taken exactly where it earns a second CTA an SM, head_dim 128 with
 * 64-token blocks (two stages of Q, K, V and the rows: 128 KiB, one CTA;
 * with one slot: 112 KiB, two), and not for sm_80 specs; everywhere else
 * the plan is the plain one. The slot's source loads the next tile's rows after the rotation
 * and compiles for sm_90a and sm_80 without spills. */
START_TEST(table_slot_plan) {
  for (int dim = 64; dim <= 128; dim += 64)
    for (int b = 16; b <= 256; b += 16) {
      ag_status valid;
      ag_spec s = rope_spec_status("slot", b, dim, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                                   AG_POSITIONS_TABLE, QK, AG_PASS_FORWARD, &valid);
      if (valid != AG_OK) continue;
      ag_plan with, without;
      PLAN_BOTH(&s, fwd_table_slot, &with, &without);
      ck_assert(!without.fwd.table_slot);
      const bool slot = dim == 128 && b == 64;
      ck_assert_msg(with.fwd.table_slot == slot, "block %d head_dim %d", b, dim);
      if (!slot) {
        ck_assert_int_eq(memcmp(&with.fwd, &without.fwd, sizeof with.fwd), 0);
        continue;
      }
      const int tile = 3 * b * dim * 2, table = b * dim * 2;
      ck_assert_int_eq(without.fwd.smem_bytes, 2 * (tile + table));
      ck_assert_int_eq(without.fwd.min_ctas_per_sm, 1);
      ck_assert_int_eq(with.fwd.stages, 2);
      ck_assert_int_eq(with.fwd.smem_bytes, 2 * tile + table);
      ck_assert_int_eq(with.fwd.smem_bytes, 114688);
      ck_assert_int_eq(with.fwd.min_ctas_per_sm, 2);
      /* two such CTAs beside their 1 KiB each of reserved shared memory */
      ck_assert_int_le(2 * (with.fwd.smem_bytes + 1024), 228 * 1024);
      /* sm_80 (164 KiB an SM: one CTA either way) keeps a table a stage */
      s.arch = AG_ARCH_SM80;
      PLAN_BOTH(&s, fwd_table_slot, &with, &without);
      ck_assert(!with.fwd.table_slot);
      ck_assert_int_eq(memcmp(&with.fwd, &without.fwd, sizeof with.fwd), 0);
    }

  char *dir = ag_test_dump_begin("attngen-slot");
  ag_plan_block_choices on = ag_plan_block_checked();
  on.fwd_table_slot = true;
  for (int layout = AG_ROTARY_INTERLEAVED; layout <= AG_ROTARY_HALF; layout++) {
    ag_spec s = rope_spec("slot", 64, 128, AG_DTYPE_BF16, layout == AG_ROTARY_HALF,
                          (ag_rotary_layout)layout, AG_POSITIONS_TABLE, QK,
                          AG_PASS_FORWARD | AG_PASS_BACKWARD);
    ag_plan p;
    char *src = emit_with(&s, on, &p);
    ck_assert(p.fwd.table_slot);
    ck_assert_ptr_nonnull(strstr(src, "constexpr int kSmemBytes = 114688;"));
    ck_assert_ptr_nonnull(strstr(src, "return smem + kStages * kStageElems;"));
    /* the slot's rows loaded for each tile, or (table_reuse) for a tile of
     * another block than the last one */
    ck_assert_ptr_nonnull(strstr(
        src, p.fwd.table_reuse ? "if (ring[1].rows && ring[1].token0 != ring[0].token0) "
                                 "load_table(stage, rotary_table, ring[1]);"
                               : "if (ring[1].rows) load_table(stage, rotary_table, ring[1]);"));
    /* the backward keeps its rows at the end of its stage (unless it reads
     * them where they are, bwd_table_global) */
    if (!p.bwd.table_global)
      ck_assert_ptr_nonnull(strstr(src, "return stage + kStageElems - kTableElems;"));
    const char *archs[] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
      int regs = 0, stores = 0, loads = 0;
      if (ag_test_compile_report(src, p.kernels[0].name, archs[a], p.kernels[0].name, dir, &regs, &stores,
                         &loads)) {
        ck_assert_int_eq(stores + loads, 0);
        ck_assert_int_le(regs * 128 * 2, 65536); /* two CTAs of 128 threads */
      }
    }
    free(src);
  }
  ag_test_dump_end(dir);
}
END_TEST

static void check_12_warps(int dim, int b, int pos, const ag_plan *with,
                           const ag_plan *without) {
  (void)pos;
  if (dim == 128 || b > 64) {
    ck_assert_int_eq(memcmp(&with->bwd, &without->bwd, sizeof with->bwd), 0);
    return;
  }
  ck_assert_int_le(with->bwd.min_ctas_per_sm * with->bwd.warps, 12);
  ck_assert_int_ge(with->bwd.min_ctas_per_sm, without->bwd.min_ctas_per_sm);
}

/* The rotary backward at head_dim 64 with up to 12 warps an SM
 * (bwd_rotary_12_warps; on, 2026-12-05): at 64-token blocks three
 * CTAs of 170 registers instead of two of 255: computed positions take
 * the plain (no rotary) plan, a table one stage of Q, K, V, dO and its
 * rows; head_dim 128 and blocks past 64 tokens keep their plan. The
 * sources compile for sm_90a within the cap with at most 12 bytes of
 * spills (block positions with V rotated). */
START_TEST(rotary_12_warps_plan) {
  ag_error err = {0};
  SWEEP_BACKWARD(bwd_rotary_12_warps, check_12_warps);
  /* 64-token blocks, in numbers */
  ag_plan_block_choices on = ag_plan_block_checked(), off = on;
  on.bwd_rotary_12_warps = true;
  off.bwd_rotary_12_warps = false;
  ag_spec t = rope_spec("w", 64, 64, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                        AG_POSITIONS_TABLE, QK, AG_PASS_BACKWARD);
  ag_plan p;
  ck_assert_int_eq(ag_plan_block_with(&t, off, &p, &err), AG_OK);
  ck_assert_int_eq(p.bwd.stages, 2);
  ck_assert_int_eq(p.bwd.min_ctas_per_sm, 2);
  ck_assert_int_eq(ag_plan_block_with(&t, on, &p, &err), AG_OK);
  ck_assert_int_eq(p.bwd.stages, 1);
  ck_assert_int_eq(p.bwd.min_ctas_per_sm, 3);
  ck_assert_int_eq(p.bwd.smem_bytes, 4 * 64 * 128 + 64 * 128 + 4 * 16 * 72 * 2);
  ag_spec c = rope_spec("w", 64, 64, AG_DTYPE_BF16, false, AG_ROTARY_HALF,
                        AG_POSITIONS_SEQUENCE, QK, AG_PASS_BACKWARD);
  ag_spec none = c;
  none.rotary.layout = AG_ROTARY_NONE;
  ag_plan plain;
  ck_assert_int_eq(ag_plan_block_with(&c, on, &p, &err), AG_OK);
  ck_assert_int_eq(ag_plan_block_with(&none, on, &plain, &err), AG_OK);
  ck_assert_int_eq(p.bwd.stages, 2);
  ck_assert_int_eq(p.bwd.min_ctas_per_sm, 3);
  ck_assert_int_eq(memcmp(&p.bwd, &plain.bwd, sizeof p.bwd), 0);

  char *dir = ag_test_dump_begin("attngen-12w");
  for (int i = 0; i < 4; i++) {
    const ag_rotary_layout layout = i & 1 ? AG_ROTARY_HALF : AG_ROTARY_INTERLEAVED;
    const ag_rotary_positions pos = i & 2 ? AG_POSITIONS_BLOCK : AG_POSITIONS_TABLE;
    ag_spec s = rope_spec("w", 64, 64, i & 1 ? AG_DTYPE_FP16 : AG_DTYPE_BF16, i == 1, layout, pos,
                          i & 2 ? QKV : QK, AG_PASS_FORWARD | AG_PASS_BACKWARD);
    char *src = emit_with(&s, on, &p);
    const ag_plan_kernel *bk = ag_plan_kernel_for(&p, AG_PASS_BACKWARD);
    ck_assert_int_eq(bk->min_ctas_per_sm, 3);
    ck_assert_ptr_nonnull(strstr(src, "constexpr int kMinCtasPerSm = 3;"));
    int regs = 0, stores = 0, loads = 0;
    if (ag_test_compile_report(src, p.kernels[0].name, "sm_90a", bk->name, dir, &regs, &stores, &loads)) {
      ck_assert_int_le(regs, 168);
      ck_assert_int_le(stores, 16);
      ck_assert_int_le(loads, 16);
    }
    free(src);
  }
  ag_test_dump_end(dir);
}
END_TEST

static void check_table_global(int dim, int b, int pos, const ag_plan *with,
                               const ag_plan *without) {
  const bool global = dim == 128 && b == 64 && pos == AG_POSITIONS_TABLE;
  ck_assert(!without->bwd.table_global);
  ck_assert_msg(with->bwd.table_global == global, "block %d head_dim %d", b, dim);
  if (!global) ck_assert_int_eq(memcmp(&with->bwd, &without->bwd, sizeof with->bwd), 0);
}

/* The rotary backward at head_dim 128 with the table's rows read where
 * they are (bwd_table_global; off: correct on the H200 but slower, 2026-12-05): 64-token blocks with
 * table positions and interleaved pairs on q and k drop the rows from the
 * stage and take up to 12 warps an SM (64 KiB, three CTAs); other layouts
 * (which spill or serialize their wgmma at 168 registers), computed
 * positions, other blocks, head_dim 64 and sm_80 specs keep their plan.
 * The source reads the rows through Tile::table, loads none with the
 * tiles, and compiles for sm_90a and sm_80. */
START_TEST(table_global_plan) {
  SWEEP_BACKWARD(bwd_table_global, check_table_global);
  /* the layouts left out, and sm_80 specs */
  static const struct { ag_rotary_layout layout; unsigned apply; } kept[] = {
      {AG_ROTARY_HALF, QK}, {AG_ROTARY_HALF, QKV}, {AG_ROTARY_INTERLEAVED, QKV},
      {AG_ROTARY_INTERLEAVED, AG_APPLY_Q}, {AG_ROTARY_INTERLEAVED, QK}};
  for (int i = 0; i < 5; i++) {
    ag_spec s = rope_spec("g", 64, 128, AG_DTYPE_BF16, false, kept[i].layout,
                          AG_POSITIONS_TABLE, kept[i].apply, AG_PASS_BACKWARD);
    if (i == 4) s.arch = AG_ARCH_SM80;
    ag_plan with, without;
    PLAN_BOTH(&s, bwd_table_global, &with, &without);
    ck_assert_msg(!with.bwd.table_global, "case %d", i);
    ck_assert_int_eq(memcmp(&with.bwd, &without.bwd, sizeof with.bwd), 0);
  }
  ag_plan_block_choices on = ag_plan_block_checked();
  on.bwd_table_global = true;
  ag_spec s = rope_spec("g", 64, 128, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                        AG_POSITIONS_TABLE, QK, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ag_plan p;
  char *src = emit_with(&s, on, &p);
  ck_assert_int_eq(p.bwd.stages, 1);
  ck_assert_int_eq(p.bwd.smem_bytes, 4 * 64 * 256);
  ck_assert_int_eq(p.bwd.min_ctas_per_sm, 3);
  ck_assert_ptr_nonnull(strstr(src, "ring[0].table = rotary_table + ring[0].token0 * kHeadDim;"));
  ck_assert_ptr_nonnull(strstr(src, "constexpr int kStageElems = 4 * kTileElems;  // Q, K, V and dO (the table: read where it is)"));
  ck_assert_ptr_nonnull(strstr(src, "rotary table: read in global memory"));
  ck_assert_ptr_nonnull(strstr(src, "dK waits until dV is stored")); /* SERIAL_KEY_GRADS */
  /* the forward still loads its rows with its tiles; the backward none */
  const char *bwd = strstr(src, "namespace bwd {");
  ck_assert_ptr_nonnull(bwd);
  ck_assert_ptr_null(strstr(bwd, "load_table("));
  ck_assert_ptr_nonnull(strstr(src, "load_table("));
  char *dir = ag_test_dump_begin("attngen-global");
  const char *archs[] = {"sm_90a", "sm_80"};
  for (int a = 0; a < 2; a++) {
    int regs = 0, stores = 0, loads = 0;
    if (ag_test_compile_report(src, p.kernels[0].name, archs[a], p.kernels[1].name, dir, &regs, &stores,
                       &loads)) {
      ck_assert_int_le(regs, 168); /* three CTAs of 128 threads */
      ck_assert_int_le(stores, 64); /* 32 from NVRTC 13 with the serial dK */
      ck_assert_int_le(loads, 64);
    }
  }
  free(src);
  ag_test_dump_end(dir);
}
END_TEST

/* dQ rotated back after P and dS are stored (bwd_late_dq; timed faster on
 * the H200 and checked there, on since 2026-12-05): taken by
 * head_dim 128 rotary backwards on wgmma with interleaved pairs that
 * rotate Q; nothing else changes (the mma.sync code and half pairs, 1-2%
 * slower late on the H200, keep the early order). With
 * it, the head_dim 128 interleaved backward (Meta's layout) no longer has
 * its wgmma serialized (C7511 before, with a table and with computed
 * positions) and spills nothing. */
START_TEST(late_dq_plan) {
  for (int dim = 64; dim <= 128; dim += 64)
    for (int b = 16; b <= 256; b += 48)
      for (unsigned apply = AG_APPLY_Q; apply <= QKV; apply++) {
        ag_status valid;
        ag_spec s = rope_spec_status("l", b, dim, AG_DTYPE_BF16, true, AG_ROTARY_INTERLEAVED,
                                     AG_POSITIONS_TABLE, apply, AG_PASS_BACKWARD, &valid);
        if (valid != AG_OK) continue;
        ag_plan with, without;
        PLAN_BOTH(&s, bwd_late_dq, &with, &without);
        const bool late = dim == 128 && (apply & AG_APPLY_Q) && with.bwd.wgmma;
        ck_assert(!without.bwd.late_dq);
        ck_assert_msg(with.bwd.late_dq == late, "block %d head_dim %d apply %u", b, dim, apply);
        with.bwd.late_dq = false;
        ck_assert_int_eq(memcmp(&with.bwd, &without.bwd, sizeof with.bwd), 0);
        s.rotary.layout = AG_ROTARY_HALF;
        PLAN_BOTH(&s, bwd_late_dq, &with, &without);
        ck_assert(!with.bwd.late_dq);
      }
  ag_plan_block_choices on = ag_plan_block_checked();
  on.bwd_late_dq = true;
  on.bwd_table_global = false; /* late_dq alone (the table rows in the stage) */
  char *dir = ag_test_dump_begin("attngen-late");
  for (int pos = AG_POSITIONS_TABLE; pos <= AG_POSITIONS_SEQUENCE; pos++) {
    ag_spec s = rope_spec("l", 64, 128, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                          (ag_rotary_positions)pos, QK, AG_PASS_BACKWARD);
    ag_plan p;
    char *src = emit_with(&s, on, &p);
    ck_assert(p.bwd.late_dq);
    ck_assert_ptr_nonnull(strstr(src, "query_products(stage, h, row0, rg.ds, dq_acc);"));
    ck_assert_ptr_nonnull(strstr(src, "query_store(stage, ring[0], h, row0, dq_acc, dq, row_stride);"));
    int regs = 0, stores = 0, loads = 0;
    const char *name = p.kernels[0].name;
    if (ag_test_compile_report(src, name, "sm_90a", name, dir, &regs, &stores, &loads)) {
      char path[512];
      snprintf(path, sizeof path, "%s/%s.log", dir, name);
      char *log = ag_test_slurp(path, NULL);
      ck_assert_ptr_nonnull(log);
      ck_assert_msg(!strstr(log, "C7511") && !strstr(log, "C7512"), "serialized:\n%s", log);
      free(log);
      ck_assert_int_eq(stores + loads, 0);
    }
    free(src);
  }
  ag_test_dump_end(dir);
}
END_TEST

/* A block's table rows loaded once for its head groups (table_reuse; not
 * yet run on a GPU): taken by every plan that holds table rows in shared
 * memory (the forward's slot or stages, the backward's stages), nothing
 * else in the plan changes, and positions computed or read in global
 * memory never take it. The sources skip the load for a tile of the last
 * tile's block and compile for sm_90a and sm_80 with no more spills than
 * without it. */
START_TEST(table_reuse_plan) {
  for (int dim = 64; dim <= 128; dim += 64)
    for (int b = 16; b <= 256; b += 48)
      for (int pos = AG_POSITIONS_TABLE; pos <= AG_POSITIONS_SEQUENCE; pos++) {
        ag_status valid;
        ag_spec s = rope_spec_status("reuse", b, dim, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                                     (ag_rotary_positions)pos, QK,
                                     AG_PASS_FORWARD | AG_PASS_BACKWARD, &valid);
        if (valid != AG_OK) continue;
        ag_plan with, without;
        PLAN_BOTH(&s, table_reuse, &with, &without);
        const bool table = pos == AG_POSITIONS_TABLE;
        ck_assert(!without.fwd.table_reuse && !without.bwd.table_reuse);
        ck_assert_msg(with.fwd.table_reuse == table, "block %d head_dim %d", b, dim);
        ck_assert(with.bwd.table_reuse ==
                  (table && !with.bwd.key_chunks && !with.bwd.table_global));
        with.fwd.table_reuse = with.bwd.table_reuse = false;
        ck_assert_int_eq(memcmp(&with.fwd, &without.fwd, sizeof with.fwd), 0);
        ck_assert_int_eq(memcmp(&with.bwd, &without.bwd, sizeof with.bwd), 0);
      }
  ag_plan_block_choices on = ag_plan_block_checked(), off = on;
  on.table_reuse = true;
  off.table_reuse = false;
  char *dir = ag_test_dump_begin("attngen-reuse");
  for (int dim = 64; dim <= 128; dim += 64) {
    ag_spec s = rope_spec("r", 64, dim, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                          AG_POSITIONS_TABLE, QK, AG_PASS_FORWARD | AG_PASS_BACKWARD);
    ag_plan p, q;
    char *src = emit_with(&s, on, &p), *plain = emit_with(&s, off, &q);
    ck_assert(p.fwd.table_reuse && p.bwd.table_reuse);
    /* the forward: the slot's skip (head_dim 128) or the stages' */
    ck_assert_ptr_nonnull(
        strstr(src, p.fwd.table_slot ? "ring[1].token0 != ring[0].token0"
                                     : "ring[kStages - 1].token0 != last_token0"));
    ck_assert_ptr_null(strstr(plain, "token0 != "));
    for (int a = 0; a < 2; a++) {
      const char *arch = a ? "sm_80" : "sm_90a";
      for (int k = 0; k < p.nkernels; k++) {
        int regs = 0, stores = 0, loads = 0, regs0 = 0, stores0 = 0, loads0 = 0;
        const char *name = p.kernels[k].name;
        if (!ag_test_compile_report(src, p.kernels[0].name, arch, name, dir, &regs, &stores, &loads))
          continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s.log", dir, p.kernels[0].name);
        char *log = ag_test_slurp(path, NULL);
        ck_assert_ptr_nonnull(log);
        ck_assert_msg(!strstr(log, "C7511") && !strstr(log, "C7512"), "serialized:\n%s", log);
        free(log);
        if (ag_test_compile_report(plain, q.kernels[0].name, arch, name, dir, &regs0, &stores0, &loads0))
          ck_assert_msg(stores + loads <= stores0 + loads0,
                        "%s %s: %d + %d bytes spilled, %d + %d without", name, arch, stores,
                        loads, stores0, loads0);
      }
    }
    free(src);
    free(plain);
  }
  ag_test_dump_end(dir);
}
END_TEST

/* The head_dim 64 rotary forward with two stages and two CTAs an SM
 * (fwd_rotary_2_stages; not yet run on a GPU) instead of the plain
 * forward's one stage and four: 64-token blocks only (two heads a tile,
 * four warps), every layout and position kind, not for sm_80 specs; every
 * other forward, and the one without rotary, keeps its plan. The sources
 * compile for sm_90a and sm_80 without spills (the launch bound caps
 * them at two CTAs' registers). */
START_TEST(rotary_2_stages_plan) {
  for (int dim = 64; dim <= 128; dim += 64)
    for (int b = 16; b <= 256; b += 16)
      for (int layout = AG_ROTARY_INTERLEAVED; layout <= AG_ROTARY_HALF; layout++)
        for (int pos = AG_POSITIONS_TABLE; pos <= AG_POSITIONS_BLOCK; pos++) {
          ag_status valid;
          ag_spec s =
              rope_spec_status("two", b, dim, AG_DTYPE_BF16, false, (ag_rotary_layout)layout,
                               (ag_rotary_positions)pos, QK, AG_PASS_FORWARD, &valid);
          if (valid != AG_OK) continue;
          if (dim == 64 && b == 64) { /* sm_80 (164 KiB an SM) keeps one stage */
            ag_spec sm80 = s;
            sm80.arch = AG_ARCH_SM80;
            ag_plan with80, without80;
            PLAN_BOTH(&sm80, fwd_rotary_2_stages, &with80, &without80);
            ck_assert_int_eq(memcmp(&with80.fwd, &without80.fwd, sizeof with80.fwd), 0);
          }
          ag_plan with, without;
          PLAN_BOTH(&s, fwd_rotary_2_stages, &with, &without);
          if (!(dim == 64 && b == 64)) {
            ck_assert_int_eq(memcmp(&with.fwd, &without.fwd, sizeof with.fwd), 0);
            continue;
          }
          const int stage = 2 * 3 * b * dim * 2 + (pos == AG_POSITIONS_TABLE ? b * dim * 2 : 0);
          ck_assert_int_eq(without.fwd.stages, 1);
          ck_assert_int_eq(without.fwd.min_ctas_per_sm, 4);
          ck_assert_int_eq(with.fwd.heads_per_tile, 2);
          ck_assert_int_eq(with.fwd.stages, 2);
          ck_assert_int_eq(with.fwd.smem_bytes, 2 * stage);
          ck_assert(!with.fwd.table_slot);
          ck_assert_int_eq(with.fwd.min_ctas_per_sm, 2);
          ck_assert_int_eq(with.fwd.items_per_cta, 4);
          ck_assert_int_le(2 * (with.fwd.smem_bytes + 1024), 228 * 1024);
          /* without rotary the choice changes nothing */
          s.rotary.layout = AG_ROTARY_NONE;
          PLAN_BOTH(&s, fwd_rotary_2_stages, &with, &without);
          ck_assert_int_eq(memcmp(&with.fwd, &without.fwd, sizeof with.fwd), 0);
          ck_assert_int_eq(with.fwd.stages, 1);
        }

  char *dir = ag_test_dump_begin("attngen-two");
  ag_plan_block_choices on = ag_plan_block_checked();
  on.fwd_rotary_2_stages = true;
  const struct {
    ag_rotary_layout layout;
    ag_rotary_positions pos;
    unsigned apply;
  } cases[] = {{AG_ROTARY_INTERLEAVED, AG_POSITIONS_TABLE, QK},
               {AG_ROTARY_HALF, AG_POSITIONS_SEQUENCE, QKV},
               {AG_ROTARY_INTERLEAVED, AG_POSITIONS_BLOCK, QK}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ag_spec s = rope_spec("two", 64, 64, AG_DTYPE_FP16, i == 1, cases[i].layout, cases[i].pos,
                          cases[i].apply, AG_PASS_FORWARD);
    ag_plan p;
    char *src = emit_with(&s, on, &p);
    ck_assert_int_eq(p.fwd.stages, 2);
    ck_assert_ptr_nonnull(strstr(src, "constexpr int kStages = 2;"));
    const char *archs[] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
      int regs = 0, stores = 0, loads = 0;
      if (ag_test_compile_report(src, p.kernels[0].name, archs[a], p.kernels[0].name, dir, &regs, &stores,
                         &loads))
        ck_assert_int_eq(stores + loads, 0);
    }
    free(src);
  }
  ag_test_dump_end(dir);
}
END_TEST

/* ---- the launch, without a device ---------------------------------------------- */

/* A kernel struct on the stack from a real spec and plan, with the
 * recording fake driver (fake_driver.h); each test sets how many device
 * pointers its next launch passes. */
typedef struct fake {
  ag_context ctx;
  ag_kernel kernel;
} fake;

static void fake_init(fake *f, ag_rotary_positions positions) {
  memset(f, 0, sizeof *f);
  f->kernel.spec = rope_spec("args", 64, 128, AG_DTYPE_BF16, false, AG_ROTARY_INTERLEAVED,
                             positions, QKV, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ag_error err = {0};
  ck_assert_int_eq(ag_plan_make(&f->kernel.spec, &f->kernel.plan, &err), AG_OK);
  ag_fake_driver_attach(&f->ctx, 0);
  f->kernel.ctx = &f->ctx;
  f->kernel.fn[0] = (CUfunction)(uintptr_t)0xf00;
  f->kernel.fn[1] = (CUfunction)(uintptr_t)0xb00;
  f->kernel.ctas_per_sm[0] = f->kernel.ctas_per_sm[1] = 1;
}

static ag_block_fwd_args fwd_args(void) {
  ag_block_fwd_args a;
  memset(&a, 0, sizeof a);
  a.q = (const void *)(uintptr_t)0x100000;
  a.k = (const void *)(uintptr_t)0x200000;
  a.v = (const void *)(uintptr_t)0x300000;
  a.o = (void *)(uintptr_t)0x400000;
  a.offsets = (const int32_t *)(uintptr_t)0x800000;
  a.batch = 2;
  a.heads = 8;
  a.total_tokens = 100;
  a.rotary_table = (const void *)(uintptr_t)0x900000;
  return a;
}

static ag_block_bwd_args bwd_args(void) {
  ag_block_bwd_args a;
  memset(&a, 0, sizeof a);
  a.q = (const void *)(uintptr_t)0x100000;
  a.k = (const void *)(uintptr_t)0x200000;
  a.v = (const void *)(uintptr_t)0x300000;
  a.dout = (const void *)(uintptr_t)0x400000;
  a.dq = (void *)(uintptr_t)0x500000;
  a.dk = (void *)(uintptr_t)0x600000;
  a.dv = (void *)(uintptr_t)0x700000;
  a.offsets = (const int32_t *)(uintptr_t)0x800000;
  a.batch = 2;
  a.heads = 8;
  a.total_tokens = 100;
  a.rotary_table = (const void *)(uintptr_t)0x900000;
  return a;
}

/* The table goes after the tensors, before the offsets, in both kernels. */
START_TEST(launch_passes_the_table) {
  fake f;
  fake_init(&f, AG_POSITIONS_TABLE);
  ag_error err = {0};
  ag_block_fwd_args a = fwd_args();
  ag_fake_seen.ptrs = 6;
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_OK);
  const void *fwd_order[6] = {a.q, a.k, a.v, a.o, a.rotary_table, a.offsets};
  for (int i = 0; i < 6; i++) ck_assert_uint_eq(ag_fake_seen.ptr[i], (CUdeviceptr)(uintptr_t)fwd_order[i]);
  ck_assert_int_eq(ag_fake_seen.batch, 2);
  ck_assert_int_eq(ag_fake_seen.heads, 8);
  ck_assert_int_eq(ag_fake_seen.total, 100);
  ck_assert_uint_eq(ag_fake_seen.smem, (unsigned)f.kernel.plan.fwd.smem_bytes);

  ag_block_bwd_args b = bwd_args();
  ag_fake_seen.ptrs = 9;
  ck_assert_int_eq(ag_block_backward(&f.kernel, &b, NULL, &err), AG_OK);
  const void *bwd_order[9] = {b.q, b.k, b.v, b.dout, b.dq, b.dk, b.dv, b.rotary_table, b.offsets};
  for (int i = 0; i < 9; i++) ck_assert_uint_eq(ag_fake_seen.ptr[i], (CUdeviceptr)(uintptr_t)bwd_order[i]);
  ck_assert_int_eq(ag_fake_seen.items, (2 + 100 / 64) * 8);
  ck_assert_int_eq(ag_fake_seen.count, 2);
}
END_TEST

START_TEST(launch_checks_the_table) {
  fake f;
  fake_init(&f, AG_POSITIONS_TABLE);
  ag_error err = {0};
  ag_block_fwd_args a = fwd_args();
  a.rotary_table = NULL;
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message,
                   "rotary_table is a null pointer; kernel 'args' takes its rotary positions "
                   "from a table ([total_tokens, head_dim]: sin, then cos)");
  ag_error_clear(&err);
  ag_block_bwd_args b = bwd_args();
  b.rotary_table = (const void *)(uintptr_t)0x900008;
  ck_assert_int_eq(ag_block_backward(&f.kernel, &b, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "rotary_table (0x900008) is not 16-byte aligned; the kernel "
                                "loads 16 bytes at a time");
  ag_error_clear(&err);
  ck_assert_int_eq(ag_fake_seen.count, 0);
  /* Nothing to compute: no launch, no pointer looked at. */
  a.batch = 0;
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_OK);
  ck_assert_int_eq(ag_fake_seen.count, 0);

  /* Computed positions: no table parameter, and rotary_table is ignored,
   * NULL or not. */
  fake_init(&f, AG_POSITIONS_SEQUENCE);
  a = fwd_args();
  ag_fake_seen.ptrs = 5;
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_OK);
  ck_assert_uint_eq(ag_fake_seen.ptr[4], (CUdeviceptr)(uintptr_t)a.offsets);
  ck_assert_int_eq(ag_fake_seen.batch, 2);
  a.rotary_table = NULL;
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_OK);
  b = bwd_args();
  b.rotary_table = (const void *)(uintptr_t)0x3;
  ag_fake_seen.ptrs = 8;
  ck_assert_int_eq(ag_block_backward(&f.kernel, &b, NULL, &err), AG_OK);
  ck_assert_uint_eq(ag_fake_seen.ptr[7], (CUdeviceptr)(uintptr_t)b.offsets);
  ck_assert_int_eq(ag_fake_seen.total, 100);
  ck_assert_int_eq(ag_fake_seen.count, 3);
}
END_TEST

Suite *rotary_suite(void) {
  Suite *s = suite_create("rotary");
  TCase *tc = tcase_create("rotary");
  tcase_add_test(tc, validation_accepts);
  tcase_add_test(tc, validation_refuses_what_does_not_fit);
  tcase_add_test(tc, plan_values);
  tcase_add_test(tc, source_determinism_and_names);
  tcase_add_test(tc, source_frequencies);
  tcase_add_test(tc, source_only_what_is_needed);
  tcase_add_test(tc, source_chunked_only_what_is_needed);
  tcase_add_test(tc, launch_passes_the_table);
  tcase_add_test(tc, launch_checks_the_table);
  suite_add_tcase(s, tc);
  TCase *nv = tcase_create("rotary_nvrtc");
  tcase_set_timeout(nv, 600);
  tcase_add_loop_test(nv, rotary_compiles, 0, NCOMPILE);
  tcase_add_test(nv, table_slot_plan);
  tcase_add_test(nv, rotary_12_warps_plan);
  tcase_add_test(nv, table_global_plan);
  tcase_add_test(nv, late_dq_plan);
  tcase_add_test(nv, table_reuse_plan);
  tcase_add_test(nv, rotary_2_stages_plan);
  suite_add_tcase(s, nv);
  return s;
}
