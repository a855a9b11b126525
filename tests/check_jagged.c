// SPDX-License-Identifier: BSD-3-Clause
/* check_jagged.c: the jagged pattern. On the CPU: validation (what it
 * accepts and refuses), the plan's kernels (templates, walks, parameters),
 * the emitted source (deterministic, only what the spec asks), NVRTC
 * compiles for sm_90a and sm_80, and ag_jagged_forward / _backward's checks
 * and launches through a fake driver. On a GPU (tcase jagged_gpu; SKIP
 * without one): every pass against the float64 reference on fresh random
 * inputs with poisoned outputs, over mixed lengths (0, 1, 63, 64, 65, 127,
 * 129, 1000, 4096), causal masks, windows, grouped-query heads and
 * cross-attention, both dtypes and head dims, and the backward bit for bit
 * over five runs. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_driver.h"
#include "reference.h"
#include "runtime.h"
#include "selfcheck_jagged.h"
#include "util.h"

/* A jagged spec's YAML; `extra` holds more keys (window, deterministic). */
static void yaml_for(char *yaml, size_t cap, int dim, ag_dtype dtype, bool causal,
                     const char *extra, bool backward) {
  snprintf(yaml, cap,
           "name: jag\npattern: jagged\nhead_dim: %d\ndtype: %s\ncausal: %s\n%spasses: %s\n", dim,
           dtype == AG_DTYPE_FP16 ? "fp16" : "bf16", causal ? "true" : "false", extra,
           backward ? "[forward, backward]" : "[forward]");
}

static ag_spec load_ok(const char *yaml) {
  ag_spec spec;
  ag_error err = {0};
  ag_status st = ag_spec_load_string(yaml, strlen(yaml), "jag.yaml", &spec, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message ? err.message : "");
  return spec;
}

/* Compiles an emitted source for sm_90a (`label` names it in NVRTC's
 * messages) and asserts that the cubin holds every kernel of the plan. */
static void compile_holds_every_kernel(const char *src, const char *label, const ag_plan *p) {
  ag_error err = {0};
  void *cubin = NULL;
  size_t size = 0;
  ag_status st = ag_compile_source(src, label, "sm_90a", &cubin, &size, NULL, &err);
  ck_assert_msg(st == AG_OK, "%s: %s", label, err.message);
  for (int k = 0; k < p->nkernels; k++)
    ck_assert_msg(memmem(cubin, size, p->kernels[k].name, strlen(p->kernels[k].name) + 1),
                  "%s: no kernel %s in the cubin", label, p->kernels[k].name);
  free(cubin);
}

static void expect_error(const char *yaml, ag_status want, const char *text) {
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "jag.yaml", &spec, &err), want);
  ck_assert_msg(err.message && strstr(err.message, text), "want '%s' in: %s", text,
                err.message ? err.message : "(none)");
  ag_error_clear(&err);
}

/* ---- validation -------------------------------------------------------------- */

START_TEST(validation) {
  char y[512];
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "", true);
  ag_spec s = load_ok(y);
  ck_assert_int_eq(s.pattern, AG_PATTERN_JAGGED);
  ck_assert(s.causal && !s.has_window && !s.deterministic);
  yaml_for(y, sizeof y, 64, AG_DTYPE_FP16, false, "window: [64, 32]\ndeterministic: true\n", true);
  s = load_ok(y);
  ck_assert(s.has_window && s.deterministic);
  ck_assert_int_eq(s.window_left, 64);
  ck_assert_int_eq(s.window_right, 32);
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "window: [128, 0]\n", false);
  load_ok(y);
  /* A causal window sees nothing after the diagonal. */
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "window: [128, 4]\n", false);
  expect_error(y, AG_ERR_SPEC,
               "jag.yaml:6:9: error: a causal window looks at no key after the query: its right "
               "side must be 0 (got 4)");
  /* Rotary embeddings: positions from tables or the sequence, not blocks;
   * with a broadcast Q too. */
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, false, "rotary:\n  layout: half\n", false);
  ck_assert_int_eq(load_ok(y).rotary.positions, AG_POSITIONS_TABLE);
  yaml_for(y, sizeof y, 64, AG_DTYPE_FP16, true,
           "rotary:\n  layout: interleaved\n  positions: sequence\n  apply_to: [q, k, v]\n", true);
  ck_assert_int_eq(load_ok(y).rotary.apply_to, AG_APPLY_Q | AG_APPLY_K | AG_APPLY_V);
  yaml_for(y, sizeof y, 64, AG_DTYPE_FP16, true, "rotary:\n  layout: half\n  positions: block\n",
           false);
  expect_error(y, AG_ERR_SPEC, "rotary positions block applies only to pattern block_diagonal");
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, false, "query: broadcast\nrotary:\n  layout: half\n",
           false);
  ck_assert_int_eq(load_ok(y).rotary.layout, AG_ROTARY_HALF);
  /* Broadcast queries: tests/check_broadcast.c. */
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, false, "query: broadcast\n", false);
  ck_assert_int_eq(load_ok(y).query, AG_QUERY_BROADCAST);
  /* deterministic belongs to the jagged pattern. */
  const char *block = "name: b\npattern: block_diagonal\nhead_dim: 64\ndtype: bf16\n"
                      "deterministic: false\n";
  expect_error(block, AG_ERR_SPEC,
               "jag.yaml:5:1: error: 'deterministic' applies only to pattern jagged");
  expect_error("name: j\npattern: jagged\nhead_dim: 64\ndtype: bf16\ndeterministic: 1\n",
               AG_ERR_SPEC, "deterministic");
}
END_TEST

/* ---- the plan and the source ----------------------------------------------------- */

START_TEST(plan_kernels) {
  char y[512];
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "", true);
  ag_spec s = load_ok(y);
  ag_plan p;
  ag_error err = {0};
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_int_eq(p.nkernels, 3);
  const ag_plan_kernel *f = &p.kernels[0], *dq = &p.kernels[1], *dkv = &p.kernels[2];
  ck_assert_str_eq(f->name, "ag_jag_d128_bf16_causal_fwd");
  ck_assert_str_eq(dq->name, "ag_jag_d128_bf16_causal_bwd_dq");
  ck_assert_str_eq(dkv->name, "ag_jag_d128_bf16_causal_bwd_dkv");
  ck_assert_str_eq(f->template_file, "jagged_fwd.cu");
  ck_assert_str_eq(dq->template_file, "jagged_bwd.cu");
  ck_assert_ptr_null(dkv->template_file); /* defined by jagged_bwd.cu with _dq */
  ck_assert_str_eq(dq->template_name, "ag_jag_d128_bf16_causal_bwd");
  ck_assert_str_eq(dq->namespace_name, "bwd");
  ck_assert_int_eq(f->walk.kind, AG_WALK_JAGGED_Q);
  ck_assert_int_eq(dq->walk.kind, AG_WALK_JAGGED_Q);
  ck_assert_int_eq(dkv->walk.kind, AG_WALK_JAGGED_K);
  ck_assert_int_eq(f->nparams, 13);
  ck_assert_int_eq(f->params[4], AG_PARAM_LSE);
  ck_assert_int_eq(dq->nparams, 18);
  ck_assert_int_eq(dq->params[9], AG_PARAM_DI);
  ck_assert_int_le(f->smem_bytes, 227 * 1024);
  ck_assert_int_le(dq->smem_bytes, 227 * 1024);
  ck_assert_int_le(dkv->smem_bytes, 227 * 1024);
  /* Backward alone: no namespace, the kernels' own names. */
  yaml_for(y, sizeof y, 64, AG_DTYPE_FP16, false, "window: [100, 0]\n", true);
  s = load_ok(y);
  s.passes = AG_PASS_BACKWARD;
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_int_eq(p.nkernels, 2);
  ck_assert_str_eq(p.kernels[0].name, "ag_jag_d64_fp16_w100_0_bwd_dq");
  ck_assert_ptr_null(p.kernels[0].namespace_name);
  ck_assert_str_eq(ag_plan_first_kernel(&p), "ag_jag_d64_fp16_w100_0_bwd_dq");
  /* Rotary embeddings from tables in the mma.sync kernels (sm_80; the
   * wgmma ones are sm90_rotary_compiles'), both tables after the pass's
   * tensors. */
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "rotary:\n  layout: half\narch: sm_80\n", true);
  s = load_ok(y);
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert(p.takes_table && p.jagged.rotary && !p.jagged.fwd_sm90);
  ck_assert_int_eq(p.jagged.fast.block_m, 0);
  ck_assert_int_eq(p.nkernels, 3);
  ck_assert_str_eq(p.kernels[0].name, "ag_jag_d128_bf16_causal_rope_fwd");
  ck_assert_str_eq(p.kernels[0].template_file, "jagged_fwd.cu");
  ck_assert_int_eq(p.kernels[0].nparams, 15);
  ck_assert_int_eq(p.kernels[0].params[5], AG_PARAM_ROTARY_TABLE);
  ck_assert_int_eq(p.kernels[0].params[6], AG_PARAM_ROTARY_TABLE_K);
  ck_assert_int_eq(p.kernels[0].params[7], AG_PARAM_OFFSETS_Q);
  for (int i = 1; i < 3; i++) {
    ck_assert_int_eq(p.kernels[i].nparams, 20);
    ck_assert_int_eq(p.kernels[i].params[10], AG_PARAM_ROTARY_TABLE);
    ck_assert_int_eq(p.kernels[i].params[11], AG_PARAM_ROTARY_TABLE_K);
  }
  /* computed positions take no table */
  yaml_for(y, sizeof y, 64, AG_DTYPE_FP16, false, "rotary:\n  layout: half\n  positions: sequence\n",
           true);
  s = load_ok(y);
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert(!p.takes_table && p.jagged.rotary);
  ck_assert_int_eq(p.kernels[0].nparams, 13);
}
END_TEST

START_TEST(source_shape) {
  char y[512];
  yaml_for(y, sizeof y, 64, AG_DTYPE_FP16, false, "window: [64, 32]\n", false);
  ag_spec s = load_ok(y);
  char *a, *b, name[AG_KERNEL_NAME_MAX];
  ag_error err = {0};
  ck_assert_int_eq(ag_emit(&s, &a, name, &err), AG_OK);
  ck_assert_int_eq(ag_emit(&s, &b, NULL, &err), AG_OK);
  ck_assert_str_eq(a, b); /* deterministic */
  ck_assert_str_eq(name, "ag_jag_d64_fp16_w64_32_fwd");
  ck_assert_ptr_nonnull(strstr(a, " *   pattern: jagged\n *   causal: false\n *   window: [64, 32]\n"));
  ck_assert_ptr_nonnull(strstr(a, "constexpr int kWindowLeft = 64;"));
  ck_assert_ptr_nonnull(strstr(a, "constexpr int kWindowRight = 32;"));
  ck_assert_ptr_null(strstr(a, "_bwd")); /* only the forward */
  ck_assert_ptr_null(strstr(a, "namespace"));
  ck_assert_ptr_null(strchr(a, '@')); /* every placeholder expanded */
  free(a);
  free(b);
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "", true);
  s = load_ok(y);
  ck_assert_int_eq(ag_emit(&s, &a, NULL, &err), AG_OK);
  ck_assert_ptr_nonnull(strstr(a, "ag_jag_d128_bf16_causal_bwd_dq("));
  ck_assert_ptr_nonnull(strstr(a, "ag_jag_d128_bf16_causal_bwd_dkv("));
  ck_assert_ptr_nonnull(strstr(a, "namespace bwd {"));
  free(a);
}
END_TEST

/* Every variant the GPU tests use compiles for both archs, with the
 * kernels the plan names in the cubin. */
typedef struct jcase {
  ag_dtype dtype;
  int dim;
  bool causal;
  const char *extra;
} jcase;

static const jcase compile_cases[] = {
    {AG_DTYPE_BF16, 128, false, ""},
    {AG_DTYPE_FP16, 64, true, ""},
    {AG_DTYPE_BF16, 64, false, "window: [100, 0]\n"},
    {AG_DTYPE_FP16, 128, true, "window: [128, 0]\ndeterministic: true\n"},
    {AG_DTYPE_BF16, 128, true, "rotary:\n  layout: half\n  positions: sequence\n"},
    {AG_DTYPE_FP16, 64, false, "rotary:\n  layout: interleaved\n  apply_to: [q, k, v]\n"},
};

START_TEST(compiles) {
  const jcase *c = &compile_cases[_i];
  char y[512];
  yaml_for(y, sizeof y, c->dim, c->dtype, c->causal, c->extra, true);
  ag_spec s = load_ok(y);
  ag_error err = {0};
  const char *archs[] = {"sm_90a", "sm_80"};
  for (int a = 0; a < 2; a++) {
    /* the plan the arch resolves to: on sm_90a the fast backward unless
     * the spec is deterministic (or has rotary embeddings while the wgmma
     * kernels' rotation is not enabled: plan_jagged.c) */
    ag_spec r;
    ck_assert_int_eq(ag_spec_for_arch(&s, archs[a], &r, &err), AG_OK);
    ck_assert_int_eq(r.arch, a ? AG_ARCH_SM80 : AG_ARCH_SM90A);
    ag_plan p;
    ck_assert_int_eq(ag_plan_make(&r, &p, &err), AG_OK);
    ck_assert_int_eq(p.jagged.fast.block_m > 0,
                     !a && !s.deterministic &&
                         (s.rotary.layout == AG_ROTARY_NONE || ag_plan_jagged_checked().sm90_rotary));
    void *cubin = NULL;
    size_t size = 0;
    ag_status st = ag_compile(&s, archs[a], &cubin, &size, &err);
    ck_assert_msg(st == AG_OK, "%s: %s", archs[a], err.message);
    for (int k = 0; k < p.nkernels; k++)
      ck_assert_msg(memmem(cubin, size, p.kernels[k].name, strlen(p.kernels[k].name) + 1),
                    "no %s in the %s cubin", p.kernels[k].name, archs[a]);
    free(cubin);
  }
}
END_TEST

/* The sm_90a wgmma kernels with rotary embeddings (which the plan picks
 * once plan_jagged.c's jagged_checked.sm90_rotary says they ran on a
 * GPU): their source emits and compiles for sm_90a with the rotation in,
 * both position modes and layouts, head dims 128 and 64 (the backward). */
START_TEST(sm90_rotary_compiles) {
  const char *extras[] = {"rotary:\n  layout: half\n  positions: sequence\narch: sm_90a\n",
                          "rotary:\n  layout: interleaved\n  apply_to: [q, k, v]\narch: sm_90a\n",
                          "rotary:\n  layout: half\n  apply_to: [q, v]\narch: sm_90a\n"};
  for (int i = 0; i < 3; i++) {
    char y[512];
    yaml_for(y, sizeof y, i == 2 ? 64 : 128, AG_DTYPE_BF16, i == 0, extras[i], true);
    ag_spec s = load_ok(y);
    ag_plan p;
    ag_error err = {0};
    ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
    ck_assert(p.jagged.fwd_sm90 == (ag_plan_jagged_checked().sm90_rotary && i < 2));
    ag_plan_jagged_choices with = ag_plan_jagged_checked();
    with.sm90_rotary = true;
    ck_assert_int_eq(ag_plan_jagged_make_with(&s, with, &p, &err), AG_OK);
    ag_plan_kernels(&s, &p);
    ck_assert(p.jagged.fwd_sm90 == (i < 2)); /* head dim 64 keeps the mma.sync forward */
    ck_assert_int_gt(p.jagged.fast.block_m, 0);
    ck_assert_int_eq(p.nkernels, 4);
    ck_assert_str_eq(p.kernels[1].template_file, "jagged_bwd_sm90.cu");
    ck_assert_int_eq(p.kernels[2].nparams, i == 0 ? 18 : 20); /* tables but in mode 0 */
    char *src = NULL;
    ck_assert_int_eq(ag_emit_plan(&s, &p, &src, &err), AG_OK);
    if (i < 2) ck_assert_ptr_nonnull(strstr(src, "rotate_rows(smem, nullptr, span.rows, rq);"));
    ck_assert_ptr_nonnull(strstr(src, "rotate_rows<Sw128Rows<kBlockM>>("));
    char name[32];
    snprintf(name, sizeof name, "sm90_rotary_%d.cu", i);
    compile_holds_every_kernel(src, name, &p);
    free(src);
  }
}
END_TEST

/* ---- the launchers without a device --------------------------------------------- */

typedef ag_fake_kernel fake;

static void fake_init(fake *f, int dim, bool backward, int ptrs) {
  char y[512];
  yaml_for(y, sizeof y, dim, AG_DTYPE_BF16, true, "", backward);
  ag_fake_jagged_kernel(f, y, ptrs);
}

#define P(x) ((void *)(uintptr_t)(x))

static ag_jagged_fwd_args fwd_args(void) {
  ag_jagged_fwd_args a = {.q = P(0x10000), .k = P(0x20000), .v = P(0x30000), .o = P(0x40000),
                          .lse = P(0x50000), .cu_seqlens_q = P(0x60000),
                          .cu_seqlens_k = P(0x70000), .batch = 3, .heads = 8, .kv_heads = 2,
                          .total_q = 300, .total_k = 500};
  return a;
}

static ag_jagged_bwd_args bwd_args(void) {
  ag_jagged_bwd_args a = {.q = P(0x10000), .k = P(0x20000), .v = P(0x30000), .o = P(0x40000),
                          .dout = P(0x50000), .lse = P(0x60000), .dq = P(0x70000),
                          .dk = P(0x80000), .dv = P(0x90000), .workspace = P(0xa0000),
                          .cu_seqlens_q = P(0xb0000), .cu_seqlens_k = P(0xc0000), .batch = 3,
                          .heads = 8, .kv_heads = 2, .total_q = 300, .total_k = 500};
  return a;
}

START_TEST(launch_parameters) {
  fake f;
  fake_init(&f, 128, false, 7);
  ag_jagged_fwd_args a = fwd_args();
  ag_error err = {0};
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  const ag_plan_kernel *k = &f.kernel.plan.kernels[0];
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[0]);
  ck_assert_uint_eq(ag_fake_seen.block, (unsigned)k->threads);
  ck_assert_uint_eq(ag_fake_seen.smem, (unsigned)k->smem_bytes);
  const void *order[7] = {a.q, a.k, a.v, a.o, a.lse, a.cu_seqlens_q, a.cu_seqlens_k};
  for (int i = 0; i < 7; i++) ck_assert_uint_eq(ag_fake_seen.ptr[i], (CUdeviceptr)(uintptr_t)order[i]);
  ck_assert_int_eq(ag_fake_seen.batch, 3);
  ck_assert_int_eq(ag_fake_seen.heads, 8);
  ck_assert_int_eq(ag_fake_seen.kv_heads, 2);
  ck_assert_int_eq(ag_fake_seen.total, 300);
  ck_assert_int_eq(ag_fake_seen.total_k, 500);
  /* (batch + total_q / BLOCK_M) virtual query tiles by heads. */
  ck_assert_int_eq(ag_fake_seen.items, 3 + 300 / k->walk.rows);
  ck_assert_uint_eq(ag_fake_seen.grid, 3 + 300 / k->walk.rows);
  ck_assert_uint_eq(ag_fake_seen.grid_y, 8);

  /* The backward: _dq over query tiles and heads, then _dkv over key tiles
   * and key heads. */
  fake_init(&f, 64, true, 12);
  ag_jagged_bwd_args b = bwd_args();
  ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 2);
  const ag_plan_kernel *dq = &f.kernel.plan.kernels[1], *dkv = &f.kernel.plan.kernels[2];
  ck_assert_uint_eq(ag_fake_seen.grids_x[0], 3 + 300 / dq->walk.rows);
  ck_assert_uint_eq(ag_fake_seen.grids_y[0], 8);
  ck_assert_uint_eq(ag_fake_seen.grids_x[1], 3 + 500 / dkv->walk.rows);
  ck_assert_uint_eq(ag_fake_seen.grids_y[1], 2);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[2]);
  const void *border[12] = {b.q, b.k, b.v, b.o, b.dout, b.lse, b.dq, b.dk, b.dv, b.workspace,
                            b.cu_seqlens_q, b.cu_seqlens_k};
  for (int i = 0; i < 12; i++)
    ck_assert_uint_eq(ag_fake_seen.ptr[i], (CUdeviceptr)(uintptr_t)border[i]);
  ck_assert_int_eq(ag_fake_seen.items, 3 + 500 / dkv->walk.rows);
  ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&f.kernel, 8, 300), 4 * 8 * 300);
  ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&f.kernel, -1, 300), 0);
  ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(NULL, 8, 300), 0);
  fake_init(&f, 64, false, 7); /* no backward */
  ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&f.kernel, 8, 300), 0);
}
END_TEST

/* On sm_90a a spec that is not deterministic gets the fast backward: _pre
 * (D, the accumulator zeroed) over (token, head) rows, _kv over key tiles
 * of 128 and key heads, _dq over the rows again; its workspace holds D
 * and the fp32 dQ accumulator after it, 16-byte aligned. A deterministic
 * spec keeps _dq and _dkv. */
/* A fake kernel of `yaml` planned with `choices` (ag_plan_jagged_make_with). */
static void fake_with(fake *f, const char *yaml, int sms, ag_plan_jagged_choices choices) {
  ag_fake_jagged_kernel(f, yaml, sms);
  ag_error err = {0};
  ck_assert_int_eq(ag_plan_jagged_make_with(&f->kernel.spec, choices, &f->kernel.plan, &err),
                   AG_OK);
  ag_plan_kernels(&f->kernel.spec, &f->kernel.plan);
  for (int i = 0; i < f->kernel.plan.nkernels; i++) {
    f->kernel.fn[i] = (CUfunction)(uintptr_t)(0x100 + i);
    f->kernel.ctas_per_sm[i] = 1;
  }
}

/* The checked choices without the warp-specialized backward: the
 * jagged_bwd_sm90.cu kernel stays planned for rotary specs and by choice. */
static ag_plan_jagged_choices without_bwd_ws(void) {
  ag_plan_jagged_choices c = ag_plan_jagged_checked();
  c.sm90_bwd_ws = false;
  return c;
}

START_TEST(fast_backward_plan) {
  fake f;
  char y[512];
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "arch: sm_90a\n", true);
  fake_with(&f, y, 12, without_bwd_ws());
  const ag_plan *p = &f.kernel.plan;
  /* the forward (two with the short variant, short_forward below), then
   * the backward's three */
  const int nf = ag_plan_jagged_checked().sm90_short ? 2 : 1;
  ck_assert_int_eq(p->nkernels, nf + 3);
  ck_assert(strstr(p->kernels[nf].name, "_bwd_pre") &&
            strstr(p->kernels[nf + 1].name, "_bwd_kv") &&
            strstr(p->kernels[nf + 2].name, "_bwd_dq"));
  ck_assert_str_eq(p->kernels[nf].template_file, "jagged_bwd_sm90.cu");
  ck_assert_ptr_null(p->kernels[nf + 1].template_file);
  ck_assert_int_eq(p->kernels[nf + 1].threads, 256);
  ck_assert_int_eq(p->kernels[nf + 1].walk.rows, 128);
  ag_jagged_bwd_args b = bwd_args();
  ag_error err = {0};
  ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 3);
  const int rows = p->kernels[nf].walk.rows; /* (token, head) rows a CTA: 256 * 8 / 128 */
  ck_assert_int_eq(rows, 16);
  ck_assert_uint_eq(ag_fake_seen.grids_x[0], (300 * 8 + rows - 1) / rows);
  ck_assert_uint_eq(ag_fake_seen.grids_y[0], 1);
  ck_assert_uint_eq(ag_fake_seen.grids_x[1], 3 + 500 / 128);
  ck_assert_uint_eq(ag_fake_seen.grids_y[1], 2);
  ck_assert_uint_eq(ag_fake_seen.grids_x[2], (300 * 8 + rows - 1) / rows);
  ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&f.kernel, 8, 300),
                    4 * (8 * 300 + 8 * 300 * 128));
  ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&f.kernel, 3, 5), 4 * (16 + 3 * 5 * 128));
  /* a workspace must be 16-byte aligned */
  b.workspace = P(0xa0004);
  ck_assert_int_eq(ag_jagged_backward(&f.kernel, &b, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(err.message, "workspace"), "%s", err.message);
  ag_error_clear(&err);
  /* no query: _kv writes dK = dV = 0; the row kernels run one CTA each
   * (the rows walk's least grid: the persistent _kv's _pre zeroes its
   * counter) with no row to do */
  fake_with(&f, y, 12, without_bwd_ws());
  b = bwd_args();
  b.total_q = 0;
  int32_t hq[4] = {0, 0, 0, 0}, hk[4] = {0, 100, 300, 500};
  b.host_cu_seqlens_q = hq;
  b.host_cu_seqlens_k = hk;
  ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 3);
  ck_assert_uint_eq(ag_fake_seen.grids_x[0], 1);
  ck_assert_uint_eq(ag_fake_seen.grids_x[2], 1);

  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "arch: sm_90a\ndeterministic: true\n", true);
  ag_fake_jagged_kernel(&f, y, 12);
  ck_assert_int_eq(f.kernel.plan.nkernels, nf + 2);
  ck_assert(strstr(f.kernel.plan.kernels[nf].name, "_bwd_dq") &&
            strstr(f.kernel.plan.kernels[nf + 1].name, "_bwd_dkv"));
  ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&f.kernel, 8, 300), 4 * 8 * 300);
  /* head dim 64: one warpgroup of 64 keys a CTA (after the forward and,
   * warp specialized, its short variant) */
  yaml_for(y, sizeof y, 64, AG_DTYPE_FP16, false, "arch: sm_90a\n", true);
  fake_with(&f, y, 12, without_bwd_ws());
  const int nf64 = ag_plan_jagged_checked().sm90_ws64 ? 2 : 1;
  ck_assert_int_eq(f.kernel.plan.kernels[nf64 + 1].threads, 128);
  ck_assert_int_eq(f.kernel.plan.kernels[nf64 + 1].walk.rows, 64);
  ck_assert_int_eq(f.kernel.plan.kernels[nf64].walk.rows, 32);
  /* sm_80: the same two kernels */
  yaml_for(y, sizeof y, 64, AG_DTYPE_FP16, false, "arch: sm_80\n", true);
  ag_fake_jagged_kernel(&f, y, 12);
  ck_assert_int_eq(f.kernel.plan.nkernels, 3);
  ck_assert_int_eq(f.kernel.plan.jagged.fast.block_m, 0);
}
END_TEST

/* The warp-specialized backward (jagged_bwd_ws.cu): at both head dims 128
 * keys a CTA, 384 threads (a loading warpgroup), query steps of 64 rows
 * (128 at head dim 64), the shared memory the template's static_assert
 * checks; persistent: a CTA an SM (132 in the
 * fake context) but no more than the (tile, kv head) numbers, and 16
 * workspace bytes more for its tile counter, which _pre zeroes, so _pre
 * runs (one CTA) even with no query. Masked specs take it at head dim 128
 * (the causal one compiles); rotary specs, and masked ones at head dim 64,
 * keep jagged_bwd_sm90.cu.
 * The emitted source compiles for sm_90a with every kernel in the cubin. */
START_TEST(ws_backward_plan) {
  ag_plan_jagged_choices with = ag_plan_jagged_checked();
  with.sm90_bwd_ws = true;
  const struct { int dim; ag_dtype dt; bool causal; int smem; } cases[] = {
      {128, AG_DTYPE_BF16, false, 197632}, {64, AG_DTYPE_FP16, false, 231424},
      {128, AG_DTYPE_FP16, true, 197632}};
  for (int c = 0; c < 3; c++) {
    fake f;
    char y[512];
    yaml_for(y, sizeof y, cases[c].dim, cases[c].dt, cases[c].causal, "arch: sm_90a\n", true);
    fake_with(&f, y, 12, with);
    const ag_plan *p = &f.kernel.plan;
    const int nb = p->nkernels - 3; /* the backward's three come last */
    ck_assert(p->jagged.fast.ws);
    /* dV, dK as 64x128 products at head dim 128 with a mask only (a
     * window alone counts: below) */
    ck_assert(p->jagged.fast.dkv_n128 == (cases[c].dim == 128 && cases[c].causal));
    ck_assert_str_eq(p->kernels[nb].template_file, "jagged_bwd_ws.cu");
    ck_assert_int_eq(p->kernels[nb + 1].threads, 384);
    ck_assert_int_eq(p->kernels[nb + 1].walk.rows, 128);
    ck_assert_int_eq(p->kernels[nb + 1].smem_bytes, cases[c].smem);
    ck_assert_int_eq(p->kernels[nb + 1].min_ctas_per_sm, 1);
    ag_jagged_bwd_args b = bwd_args();
    ag_error err = {0};
    ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
    ck_assert_int_eq(ag_fake_seen.count, 3);
    ck_assert_int_eq(p->kernels[nb + 1].walk.kind, AG_WALK_JAGGED_K_COUNTER);
    ck_assert_uint_eq(ag_fake_seen.grids_x[1], (3 + 500 / 128) * 2);
    ck_assert_uint_eq(ag_fake_seen.grids_y[1], 1);
    ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&f.kernel, 8, 300),
                      4 * (8 * 300 + 8 * 300 * cases[c].dim) + 16);
    /* more numbers than SMs: one CTA an SM */
    b.batch = 1;
    b.total_q = 100;
    b.total_k = 100000;
    ag_fake_seen.count = 0;
    ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
    ck_assert_uint_eq(ag_fake_seen.grids_x[1], 132);
    /* the walk's host half never gives no CTA, whatever the context says */
    unsigned grid[3];
    int64_t items = 0;
    ag_launch la = {.batch = 1, .heads = 8, .kv_heads = 2, .total_q = 100, .total_k = 100000};
    ck_assert_int_eq(ag_walk_jagged_grid(&p->kernels[nb + 1].walk, &la, 0, 1, grid, &items, &err),
                     AG_OK);
    ck_assert_uint_eq(grid[0], 1);
    ck_assert_int_eq(items, 1 + 100000 / 128);
    /* no query, keys: _pre still runs, one CTA (it zeroes the counter) */
    b.total_q = 0;
    ag_fake_seen.count = 0;
    ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
    ck_assert_int_eq(ag_fake_seen.count, 3);
    ck_assert_uint_eq(ag_fake_seen.grids_x[0], 1);
    char *src = NULL;
    ck_assert_int_eq(ag_emit_plan(&f.kernel.spec, p, &src, &err), AG_OK);
    ck_assert_ptr_nonnull(strstr(src, "constexpr int kStages = 2;"));
    /* query steps of 64 rows, 128 at head dim 64 */
    ck_assert_ptr_nonnull(strstr(src, cases[c].dim == 64 ? "constexpr int kBlockM = 128;"
                                                        : "constexpr int kBlockM = 64;"));
    compile_holds_every_kernel(src, "ws_backward.cu", p);
    free(src);
  }
  /* rotary; a causal mask, a window at head dim 64: jagged_bwd_sm90.cu
   * (the masked ones with a long variant beside it: long_backward_plan) */
  const char *const others[] = {"arch: sm_90a\nrotary:\n  layout: half\n", "arch: sm_90a\n",
                                "arch: sm_90a\nwindow: [100, 0]\n"};
  with.sm90_bwd_long = false;
  for (int o = 0; o < 3; o++) {
    fake f;
    char y[512];
    yaml_for(y, sizeof y, o == 0 ? 128 : 64, AG_DTYPE_BF16, o == 1, others[o], true);
    fake_with(&f, y, 12, with);
    ck_assert(!f.kernel.plan.jagged.fast.ws);
    ck_assert_str_eq(f.kernel.plan.kernels[f.kernel.plan.nkernels - 3].template_file,
                     "jagged_bwd_sm90.cu");
  }
  /* head dim 128 with a window alone: warp specialized, dV and dK as
   * 64x128 products too */
  fake f;
  char y[512];
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, false, "arch: sm_90a\nwindow: [100, 0]\n", true);
  fake_with(&f, y, 12, with);
  ck_assert(f.kernel.plan.jagged.fast.ws && f.kernel.plan.jagged.fast.dkv_n128);
}
END_TEST

/* Head dim 64 with a mask on sm_90a: two fast backwards, each run
 * launching one by its mean query length (ceil(total_q / batch)):
 * jagged_bwd_sm90.cu's _pre, _kv, _dq (namespace bwd) up to
 * long_min_rows, the warp-specialized jagged_bwd_ws.cu on 128-row steps
 * (..._bwd_long_*, namespace bwd_long) past it. The workspace holds the
 * warp-specialized one's tile counter either way. Without the choice, or
 * at head dim 128, or with rotary, one set as before. */
START_TEST(long_backward_plan) {
  fake f;
  char y[512];
  yaml_for(y, sizeof y, 64, AG_DTYPE_BF16, true, "arch: sm_90a\n", true);
  ag_plan_jagged_choices with = ag_plan_jagged_checked();
  with.sm90_bwd_ws = with.sm90_bwd_long = true;
  fake_with(&f, y, 12, with);
  const ag_plan *p = &f.kernel.plan;
  const int nb = p->nkernels - 6; /* the backward's six come last */
  ck_assert_int_eq(p->jagged.long_min_rows, 96);
  ck_assert(!p->jagged.fast.ws);
  static const char *const names[6] = {"_bwd_pre",      "_bwd_kv",      "_bwd_dq",
                                       "_bwd_long_pre", "_bwd_long_kv", "_bwd_long_dq"};
  for (int i = 0; i < 6; i++) {
    const ag_plan_kernel *k = &p->kernels[nb + i];
    ck_assert_msg(strstr(k->name, names[i]), "%s", k->name);
    ck_assert_int_eq(k->pass, AG_PASS_BACKWARD);
    ck_assert_int_eq(k->variant, i < 3 ? AG_VARIANT_BWD_SHORT : AG_VARIANT_BWD_LONG);
    ck_assert_str_eq(k->namespace_name, i < 3 ? "bwd" : "bwd_long");
  }
  ck_assert_str_eq(p->kernels[nb].template_file, "jagged_bwd_sm90.cu");
  ck_assert_str_eq(p->kernels[nb + 3].template_file, "jagged_bwd_ws.cu");
  ck_assert_int_eq(p->kernels[nb + 1].threads, 128);
  ck_assert_int_eq(p->kernels[nb + 1].min_ctas_per_sm, 3);
  ck_assert_int_eq(p->kernels[nb + 1].walk.kind, AG_WALK_JAGGED_K);
  ck_assert_int_eq(p->kernels[nb + 4].threads, 384);
  ck_assert_int_eq(p->kernels[nb + 4].smem_bytes, 231424);
  ck_assert_int_eq(p->kernels[nb + 4].walk.kind, AG_WALK_JAGGED_K_COUNTER);
  ck_assert_int_eq(ag_plan_variant(p, AG_PASS_BACKWARD, 0, 8, 2), AG_VARIANT_BWD_SHORT);
  ck_assert_int_eq(ag_plan_variant(p, AG_PASS_BACKWARD, 96, 8, 2), AG_VARIANT_BWD_SHORT);
  ck_assert_int_eq(ag_plan_variant(p, AG_PASS_BACKWARD, 97, 8, 2), AG_VARIANT_BWD_LONG);
  ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&f.kernel, 8, 300),
                    4 * (8 * 300 + 8 * 300 * 64) + 16);
  /* mean 90 query rows: the short set, _kv one CTA a (64-key tile, kv head) */
  ag_jagged_bwd_args b = bwd_args();
  b.total_q = 270;
  ag_error err = {0};
  ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 3);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[nb + 2]);
  ck_assert_uint_eq(ag_fake_seen.grids_x[1], 3 + 500 / 64);
  ck_assert_uint_eq(ag_fake_seen.grids_y[1], 2);
  /* mean ceil(3076 / 3) = 1026: the long set, persistent: a CTA an SM
   * (132 in the fake context) but no more than the (128-key tile, kv
   * head) numbers */
  b.total_q = 3076;
  b.total_k = 3076;
  ag_fake_seen.count = 0;
  ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 3);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[nb + 5]);
  ck_assert_uint_eq(ag_fake_seen.grids_x[1], (3 + 3076 / 128) * 2);
  ck_assert_uint_eq(ag_fake_seen.grids_y[1], 1);
  /* exactly 3 * 96 rows: mean 96, the short set */
  b.total_q = 288;
  ag_fake_seen.count = 0;
  ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[nb + 2]);
  /* the emitted source holds both sets, each in its namespace */
  char *src = NULL;
  ck_assert_int_eq(ag_emit_plan(&f.kernel.spec, p, &src, &err), AG_OK);
  ck_assert_ptr_nonnull(strstr(src, "namespace bwd {"));
  ck_assert_ptr_nonnull(strstr(src, "namespace bwd_long {"));
  ck_assert_ptr_nonnull(strstr(src, "runs when the mean query length > 96"));
  free(src);

  /* without the choice, at head dim 128, with rotary: one set, no variant */
  with.sm90_bwd_long = false;
  fake_with(&f, y, 12, with);
  ck_assert_int_eq(f.kernel.plan.jagged.long_min_rows, 0);
  ck_assert_int_eq(f.kernel.plan.kernels[f.kernel.plan.nkernels - 1].variant, 0);
  ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&f.kernel, 8, 300),
                    4 * (8 * 300 + 8 * 300 * 64));
  with.sm90_bwd_long = true;
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "arch: sm_90a\n", true);
  fake_with(&f, y, 12, with);
  ck_assert_int_eq(f.kernel.plan.jagged.long_min_rows, 0);
  yaml_for(y, sizeof y, 64, AG_DTYPE_BF16, true, "arch: sm_90a\nrotary:\n  layout: half\n", true);
  fake_with(&f, y, 12, with);
  ck_assert_int_eq(f.kernel.plan.jagged.long_min_rows, 0);
}
END_TEST

/* The sm_90a forward at head dim 128 has two variants: 128-row tiles with
 * 128-key tiles (one CTA an SM) and, for runs whose mean query length is
 * at most 384 (ceil(total_q / batch)), 64-row tiles with 64-key tiles (two
 * CTAs an SM). Each run launches exactly one of them; at head dim 64 the
 * short one is the mma.sync forward's 128-row tiles (causal: up to a mean
 * of 320, causal64_forward); rotary specs and sm_80 plan no short one.
 * Planned with the variant chosen whether or not plan_jagged.c's
 * jagged_checked.sm90_short takes it yet. */
static void fake_with_short(fake *f, const char *yaml) {
  ag_plan_jagged_choices with = ag_plan_jagged_checked();
  with.sm90_short = true;
  fake_with(f, yaml, 7, with);
}

START_TEST(short_forward) {
  fake f;
  char y[512];
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, false, "arch: sm_90a\n", false);
  fake_with_short(&f, y);
  const ag_plan *p = &f.kernel.plan;
  ck_assert_int_eq(p->nkernels, 2);
  const ag_plan_kernel *big = &p->kernels[0], *small = &p->kernels[1];
  ck_assert(strstr(small->name, "_fwd_m64") && !strstr(big->name, "_m64"));
  ck_assert_int_eq(big->walk.rows, 128);
  ck_assert_int_eq(small->walk.rows, 64);
  ck_assert_int_eq(small->threads, 128);
  ck_assert_int_eq(small->smem_bytes, (64 + 2 * 3 * 64) * 128 * 2);
  ck_assert_int_eq(small->min_ctas_per_sm, 2);
  ck_assert_int_eq(big->variant, AG_VARIANT_FWD_LARGE);
  ck_assert_int_eq(small->variant, AG_VARIANT_FWD_SMALL);
  ck_assert_int_eq(ag_plan_variant(p, AG_PASS_FORWARD, 384, 8, 8), AG_VARIANT_FWD_SMALL);
  ck_assert_int_eq(ag_plan_variant(p, AG_PASS_FORWARD, 385, 8, 8), AG_VARIANT_FWD_LARGE);
  ck_assert_int_eq(ag_plan_variant(p, AG_PASS_BACKWARD, 1, 8, 8), 0);
  ag_error err = {0};
  /* mean 100: the 64-row tiles, grid batch + total_q / 64 */
  ag_jagged_fwd_args a = fwd_args();
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ck_assert_uint_eq(ag_fake_seen.grids_x[0], 3 + 300 / 64);
  /* mean ceil(1153 / 3) = 385: the 128-row tiles */
  fake_with_short(&f, y);
  a = fwd_args();
  a.total_q = 1153;
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ck_assert_uint_eq(ag_fake_seen.grids_x[0], 3 + 1153 / 128);
  /* mean exactly 384 (1152 / 3): still the short one */
  fake_with_short(&f, y);
  a = fwd_args();
  a.total_q = 1152;
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ck_assert_uint_eq(ag_fake_seen.grids_x[0], 3 + 1152 / 64);
  /* head dim 64 on sm_90a without a causal mask: the warp-specialized
   * forward (192-row tiles on three computing warpgroups, .sm90_fwd_ws192),
   * and the mma.sync one's 128-row tiles as the short variant */
  if (ag_plan_jagged_checked().sm90_ws64) {
    yaml_for(y, sizeof y, 64, AG_DTYPE_BF16, false, "arch: sm_90a\n", false);
    fake_with_short(&f, y);
    const ag_plan *q = &f.kernel.plan;
    ck_assert_int_eq(q->nkernels, 2);
    ck_assert_str_eq(q->kernels[0].template_file, "jagged_fwd_ws.cu");
    ck_assert_int_eq(q->kernels[0].threads, ag_plan_jagged_checked().sm90_fwd_ws192 ? 512 : 384);
    ck_assert_int_eq(q->kernels[0].variant, AG_VARIANT_FWD_LARGE);
    ck_assert_str_eq(q->kernels[1].template_file, "jagged_fwd.cu");
    ck_assert_int_eq(q->kernels[1].variant, AG_VARIANT_FWD_SMALL);
    ck_assert_int_eq(q->kernels[1].threads, 128);
    ck_assert_int_eq(q->jagged.small_stages, 2);
    ck_assert_int_eq(q->kernels[1].smem_bytes, (128 + 2 * 2 * 64) * 64 * 2);
    a = fwd_args(); /* mean 100: the mma.sync tiles of 128 rows */
    ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
    ck_assert_int_eq(ag_fake_seen.count, 1);
    ck_assert_uint_eq(ag_fake_seen.grids_x[0], 3 + 300 / 128);
    char *src = NULL;
    ck_assert_int_eq(ag_emit_plan(&f.kernel.spec, q, &src, &err), AG_OK);
    free(src);
  }
  /* no short variant: rotary, head dim 64 causal without
   * sm90_ws64_causal (causal64_forward), sm_80 */
  const struct { int dim; bool causal; const char *extra; } others[] = {
      {128, false, "arch: sm_90a\nrotary:\n  layout: half\n"}, {64, true, "arch: sm_90a\n"},
      {128, false, "arch: sm_80\n"}};
  ag_plan_jagged_choices no_causal64 = ag_plan_jagged_checked();
  no_causal64.sm90_short = true;
  no_causal64.sm90_ws64_causal = false;
  for (int i = 0; i < 3; i++) {
    yaml_for(y, sizeof y, others[i].dim, AG_DTYPE_BF16, others[i].causal, others[i].extra, false);
    fake_with(&f, y, 7, no_causal64);
    ck_assert_int_eq(f.kernel.plan.nkernels, 1);
    ck_assert_int_eq(f.kernel.plan.kernels[0].variant, 0);
    ck_assert_int_eq(ag_plan_variant(&f.kernel.plan, AG_PASS_FORWARD, 1, 8, 8), 0);
  }
}
END_TEST

/* Q and dO by TMA in the warp-specialized backward (sm90_bwd_tma, checked
 * on the H200, so on in ag_plan_jagged_checked): every kernel of the
 * set takes the two tensor maps last; the launcher encodes each once a
 * backward (boxes of 64 elements x 1 head x the step's rows, rows of heads
 * x head_dim, 128-byte swizzle) and passes it aligned; the source compiles
 * for sm_90a. A driver without cuTensorMapEncodeTiled is refused with a
 * message. */
START_TEST(tma_backward_plan) {
  ck_assert(ag_plan_jagged_checked().sm90_bwd_tma);
  ag_plan_jagged_choices with = ag_plan_jagged_checked();
  with.sm90_bwd_tma = true;
  const struct { int dim; bool causal; int rows; } cases[] = {{128, true, 64}, {64, false, 128}};
  for (int c = 0; c < 2; c++) {
    fake f;
    char y[512];
    yaml_for(y, sizeof y, cases[c].dim, AG_DTYPE_BF16, cases[c].causal, "arch: sm_90a\n", true);
    fake_with(&f, y, 12, with);
    const ag_plan *p = &f.kernel.plan;
    const int nb = p->nkernels - 3;
    ck_assert(p->jagged.fast.tma_qdo);
    for (int i = nb; i < nb + 3; i++) {
      const ag_plan_kernel *k = &p->kernels[i];
      ck_assert_int_eq(k->params[k->nparams - 2], AG_PARAM_TMAP_Q);
      ck_assert_int_eq(k->params[k->nparams - 1], AG_PARAM_TMAP_DOUT);
      ck_assert_int_eq(k->tma_rows, cases[c].rows);
    }
    ag_fake_seen.tmaps = 2;
    ag_jagged_bwd_args b = bwd_args();
    ag_error err = {0};
    ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
    ck_assert_int_eq(ag_fake_seen.count, 3);
    ck_assert_int_eq(ag_fake_seen.encodes, 2); /* once each a backward, not a kernel */
    ck_assert_uint_eq(ag_fake_seen.enc_rank, 3);
    ck_assert_int_eq(ag_fake_seen.enc_type, CU_TENSOR_MAP_DATA_TYPE_UINT16);
    ck_assert_int_eq(ag_fake_seen.enc_swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
    ck_assert_uint_eq(ag_fake_seen.enc_dims[0], (unsigned long long)cases[c].dim);
    ck_assert_uint_eq(ag_fake_seen.enc_dims[1], 8); /* heads */
    ck_assert_uint_eq(ag_fake_seen.enc_dims[2], 300); /* total_q */
    ck_assert_uint_eq(ag_fake_seen.enc_strides[0], 2ull * cases[c].dim);
    ck_assert_uint_eq(ag_fake_seen.enc_strides[1], 2ull * 8 * cases[c].dim);
    ck_assert_uint_eq(ag_fake_seen.enc_box[0], 64);
    ck_assert_uint_eq(ag_fake_seen.enc_box[1], 1);
    ck_assert_uint_eq(ag_fake_seen.enc_box[2], (unsigned)cases[c].rows);
    /* the last launch's maps: q's, then dout's */
    ck_assert_uint_eq(ag_fake_seen.map_words[0][0], (unsigned long long)(uintptr_t)b.q);
    ck_assert_uint_eq(ag_fake_seen.map_words[1][0], (unsigned long long)(uintptr_t)b.dout);
    ck_assert_uint_eq(ag_fake_seen.map_words[1][1], 300);
    char *src = NULL;
    ck_assert_int_eq(ag_emit_plan(&f.kernel.spec, p, &src, &err), AG_OK);
    ck_assert_ptr_nonnull(strstr(src, "const __grid_constant__ ag_tmap tmap_dout) {"));
    ck_assert_ptr_nonnull(strstr(src, "constexpr bool kTmaQdo = 1;"));
    ck_assert_ptr_null(strstr(src, "load_step("));
    compile_holds_every_kernel(src, "tma_backward.cu", p);
    free(src);
    /* a driver that cannot encode a map: refused, nothing launched */
    fake_with(&f, y, 12, with);
    ((ag_driver *)f.kernel.ctx->drv)->cuTensorMapEncodeTiled = NULL;
    ck_assert_int_eq(ag_jagged_backward(&f.kernel, &b, NULL, &err), AG_ERR_NO_DRIVER);
    ck_assert_ptr_nonnull(strstr(err.message, "cuTensorMapEncodeTiled"));
    ag_error_clear(&err);
  }
}
END_TEST

/* The warp-specialized kernels without TMA (sm90_bwd_tma, sm90_fwd_tma off:
 * cp.async for every tile, as before they were checked) still plan and
 * compile for sm_90a, both head dims, so that turning a flag off stays a
 * working fallback. */
START_TEST(ws_without_tma_compiles) {
  ag_plan_jagged_choices without = ag_plan_jagged_checked();
  without.sm90_bwd_tma = without.sm90_fwd_tma = false;
  const int dims[2] = {128, 64};
  for (int i = 0; i < 2; i++) {
    fake f;
    char y[512];
    yaml_for(y, sizeof y, dims[i], AG_DTYPE_BF16, false, "arch: sm_90a\n", true);
    fake_with(&f, y, 12, without);
    const ag_plan *p = &f.kernel.plan;
    ck_assert(p->jagged.fwd_ws && !p->jagged.fwd_tma && p->jagged.fast.ws &&
              !p->jagged.fast.tma_qdo);
    ag_error err = {0};
    char *src = NULL;
    ck_assert_int_eq(ag_emit_plan(&f.kernel.spec, p, &src, &err), AG_OK);
    ck_assert_ptr_nonnull(strstr(src, "constexpr bool kTmaQdo = 0;"));
    ck_assert_ptr_nonnull(strstr(src, "constexpr bool kTmaKv = 0;"));
    ck_assert_ptr_null(strstr(src, "ag_tmap tmap_"));
    compile_holds_every_kernel(src, "no_tma.cu", p);
    free(src);
  }
}
END_TEST

/* dQ rounded in the warp-specialized backward (sm90_bwd_fused_dq, not yet
 * run on a GPU, so off): at head dim 128 with TMA the set is _pre and _kv
 * alone (no _dq), _kv takes the dQ warps' two 16 KB buffers more, the
 * workspace holds the tiles' add counters after the tile counter, and the
 * source compiles for sm_90a; at head dim 64 (no room) nothing changes. */
START_TEST(fused_dq_plan) {
  ck_assert(!ag_plan_jagged_checked().sm90_bwd_fused_dq);
  ag_plan_jagged_choices with = ag_plan_jagged_checked();
  with.sm90_bwd_tma = with.sm90_bwd_fused_dq = true;
  for (int causal = 0; causal < 2; causal++) {
    fake f, plain;
    char y[512];
    yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, causal, "arch: sm_90a\n", true);
    fake_with(&f, y, 12, with);
    fake_with(&plain, y, 12, ag_plan_jagged_checked());
    const ag_plan *p = &f.kernel.plan, *q = &plain.kernel.plan;
    ck_assert(p->jagged.fast.fused_dq && !q->jagged.fast.fused_dq);
    ck_assert_int_eq(p->nkernels, q->nkernels - 1);  /* no _dq */
    const ag_plan_kernel *kv = &p->kernels[p->nkernels - 1];
    ck_assert_ptr_nonnull(strstr(kv->name, "_kv"));
    ck_assert_ptr_nonnull(strstr(p->kernels[p->nkernels - 2].name, "_pre"));
    ck_assert_int_eq(kv->smem_bytes, 197632 + 2 * 16384);
    ck_assert_int_le(kv->smem_bytes, 232448 - 1024);  /* beside its 1 KB static (ptxas) */
    /* D, the accumulator, the tile counter, then 8 heads x 2 halves x 300 counters */
    const size_t rows = 8 * 300;
    ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&f.kernel, 8, 300),
                      ag_jagged_backward_workspace_bytes(&plain.kernel, 8, 300) + 4 * rows * 2);
    ck_assert_uint_eq(ag_jagged_backward_workspace_bytes(&plain.kernel, 8, 300),
                      4 * (rows + rows * 128) + 16);
    ag_fake_seen.tmaps = 2;
    ag_jagged_bwd_args b = bwd_args();
    ag_error err = {0};
    ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
    ck_assert_int_eq(ag_fake_seen.count, 2);  /* _pre, _kv */
    char *src = NULL;
    ck_assert_int_eq(ag_emit_plan(&f.kernel.spec, p, &src, &err), AG_OK);
    ck_assert_ptr_nonnull(strstr(src, "constexpr bool kFusedDq = 1;"));
    ck_assert_ptr_nonnull(strstr(src, "dq_warp("));
    compile_holds_every_kernel(src, "fused_dq.cu", p);
    free(src);
    char *plain_src = NULL;
    ck_assert_int_eq(ag_emit_plan(&plain.kernel.spec, q, &plain_src, &err), AG_OK);
    ck_assert_ptr_nonnull(strstr(plain_src, "constexpr bool kFusedDq = 0;"));
    ck_assert_ptr_null(strstr(plain_src, "dq_warp("));
    free(plain_src);
  }
  /* head dim 64: no room for the buffers, so the choice changes nothing */
  fake f;
  char y[512];
  yaml_for(y, sizeof y, 64, AG_DTYPE_BF16, false, "arch: sm_90a\n", true);
  fake_with(&f, y, 12, with);
  ck_assert(!f.kernel.plan.jagged.fast.fused_dq);
}
END_TEST

/* K and V by TMA in the warp-specialized forward (sm90_fwd_tma, checked on
 * the H200, so on): its main kernel takes the maps of k and v
 * last (boxes of 64 elements x 1 kv head x 128 keys, rows of kv_heads x
 * head_dim, total_k rows), the short variant none; the source compiles. */
START_TEST(tma_forward_plan) {
  ck_assert(ag_plan_jagged_checked().sm90_fwd_tma);
  ag_plan_jagged_choices with = ag_plan_jagged_checked();
  with.sm90_fwd_tma = with.sm90_short = true;
  fake f;
  char y[512];
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "arch: sm_90a\n", false);
  fake_with(&f, y, 7, with);
  const ag_plan *p = &f.kernel.plan;
  ck_assert(p->jagged.fwd_ws && p->jagged.fwd_tma);
  ck_assert_int_eq(p->nkernels, 2);
  const ag_plan_kernel *main_k = &p->kernels[0], *small = &p->kernels[1];
  ck_assert_int_eq(main_k->variant, AG_VARIANT_FWD_LARGE);
  ck_assert_int_eq(main_k->params[main_k->nparams - 2], AG_PARAM_TMAP_K);
  ck_assert_int_eq(main_k->params[main_k->nparams - 1], AG_PARAM_TMAP_V);
  ck_assert_int_eq(main_k->tma_rows, 128);
  ck_assert_int_eq(small->tma_rows, 0);
  ck_assert_int_ne(small->params[small->nparams - 1], AG_PARAM_TMAP_V);
  ag_fake_seen.tmaps = 2;
  ag_jagged_fwd_args a = fwd_args();
  a.total_q = 1153; /* mean 385: the main forward */
  ag_error err = {0};
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[0]);
  ck_assert_int_eq(ag_fake_seen.encodes, 2);
  ck_assert_uint_eq(ag_fake_seen.enc_dims[0], 128);
  ck_assert_uint_eq(ag_fake_seen.enc_dims[1], 2);   /* kv_heads */
  ck_assert_uint_eq(ag_fake_seen.enc_dims[2], 500); /* total_k */
  ck_assert_uint_eq(ag_fake_seen.enc_strides[1], 2ull * 2 * 128);
  ck_assert_uint_eq(ag_fake_seen.enc_box[2], 128);
  ck_assert_uint_eq(ag_fake_seen.map_words[0][0], (unsigned long long)(uintptr_t)a.k);
  ck_assert_uint_eq(ag_fake_seen.map_words[1][0], (unsigned long long)(uintptr_t)a.v);
  /* mean 100: the short variant, no map */
  fake_with(&f, y, 7, with);
  a = fwd_args();
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.encodes, 0);
  char *src = NULL;
  ck_assert_int_eq(ag_emit_plan(&f.kernel.spec, p, &src, &err), AG_OK);
  ck_assert_ptr_nonnull(strstr(src, "const __grid_constant__ ag_tmap tmap_v) {"));
  ck_assert_ptr_nonnull(strstr(src, "constexpr bool kTmaKv = 1;"));
  compile_holds_every_kernel(src, "tma_forward.cu", p);
  free(src);
}
END_TEST

/* f planned with `choices` for a bf16 spec of head dim `dim` (causal or
 * not) with `extra` YAML lines. */
static void fake_planned(fake *f, int dim, bool causal, const char *extra,
                         ag_plan_jagged_choices choices) {
  char y[512];
  yaml_for(y, sizeof y, dim, AG_DTYPE_BF16, causal, extra, false);
  fake_with(f, y, 7, choices);
}

/* The CUDA C of f's plan (the caller frees it). */
static char *emitted(const fake *f) {
  ag_error err = {0};
  char *src = NULL;
  ck_assert_int_eq(ag_emit_plan(&f->kernel.spec, &f->kernel.plan, &src, &err), AG_OK);
  return src;
}

/* Whether the plan's description holds `text`. */
static bool describes(const ag_plan *p, const char *text) {
  ag_buf b;
  ag_buf_init(&b);
  ag_plan_jagged_describe(p, "", &b);
  const bool said = strstr(b.data, text) != NULL;
  ag_buf_free(&b);
  return said;
}

/* The warp-specialized forward's SKIP_DEAD (.sm90_fwd_skip_dead): taken by
 * the checked plan for every warp-specialized forward (jagged at both head
 * dims, causal or not, and broadcast queries), said in the description,
 * and named in the source, which compiles; with the choice off the
 * constant is false and the description silent. Rotary specs (on
 * jagged_fwd_sm90.cu) and sm_80 plans have no such kernel. */
START_TEST(forward_skip_dead) {
  const struct {
    int dim;
    bool causal;
    const char *extra;
  } cases[] = {{128, true, "arch: sm_90a\n"},
               {64, false, "arch: sm_90a\n"},
               {64, false, "arch: sm_90a\nwindow: [100, 60]\n"},
               {128, false, "arch: sm_90a\nquery: broadcast\n"}};
  for (int i = 0; i < 4; i++)
    for (int on = 0; on <= 1; on++) {
      ag_plan_jagged_choices c = ag_plan_jagged_checked();
      ck_assert(c.sm90_fwd_skip_dead); /* checked on an H100, session 34 */
      c.sm90_fwd_skip_dead = on;
      fake f;
      fake_planned(&f, cases[i].dim, cases[i].causal, cases[i].extra, c);
      const ag_plan *p = &f.kernel.plan;
      ck_assert(p->jagged.fwd_ws);
      ck_assert_int_eq(p->jagged.fwd_skip_dead, on);
      char *src = emitted(&f);
      ck_assert_ptr_nonnull(strstr(src, on ? "constexpr bool kSkipDead = 1;"
                                           : "constexpr bool kSkipDead = 0;"));
      if (on && i == 0) compile_holds_every_kernel(src, "forward_skip_dead.cu", p);
      free(src);
      ck_assert_int_eq(describes(p, "no product for keys or rows a warpgroup does not see"), on);
    }
  /* no warp-specialized forward: no SKIP_DEAD */
  const char *others[] = {"arch: sm_80\n", "arch: sm_90a\nrotary: {layout: half, positions: sequence}\n"};
  for (int i = 0; i < 2; i++) {
    fake f;
    fake_planned(&f, 128, true, others[i], ag_plan_jagged_checked());
    ck_assert(!f.kernel.plan.jagged.fwd_skip_dead);
  }
}
END_TEST

/* The warp-specialized forward's exponentials on the FMA pipe
 * (.sm90_fwd_exp2_fma_every): N at a head dim puts exp2_fma into that
 * head dim's warp-specialized forward (jagged and broadcast), with the
 * constant, the chunk test and the description's line, and the source
 * compiles; 0 emits none of it (the source as before the choice), nor do
 * the kernels that are not warp specialized (rotary, sm_80). */
START_TEST(forward_exp2_fma) {
  const struct {
    int dim;
    bool causal;
    const char *extra;
  } cases[] = {{64, false, "arch: sm_90a\n"},
               {128, true, "arch: sm_90a\n"},
               {64, false, "arch: sm_90a\nquery: broadcast\n"},
               {128, true, "arch: sm_90a\nrotary: {layout: half, positions: sequence}\n"},
               {64, false, "arch: sm_80\n"}};
  for (int i = 0; i < 5; i++)
    for (int every = 0; every <= 3; every += 3) {
      ag_plan_jagged_choices c = ag_plan_jagged_checked();
      c.sm90_fwd_exp2_fma_every[cases[i].dim == 128] = every;
      fake f;
      fake_planned(&f, cases[i].dim, cases[i].causal, cases[i].extra, c);
      const ag_plan *p = &f.kernel.plan;
      const bool on = every && i < 3;
      ck_assert_int_eq(p->jagged.fwd_exp2_fma_every, on ? every : 0);
      char *src = emitted(&f);
      ck_assert_int_eq(strstr(src, "constexpr int kExp2FmaEvery = 3;") != NULL, on);
      ck_assert_int_eq(strstr(src, "float exp2_fma(float x)") != NULL, on);
      ck_assert_int_eq(strstr(src, "exp2_tile_fma(sc[nh][n], kScaleLog2") != NULL, on);
      if (on && i == 0) compile_holds_every_kernel(src, "forward_exp2_fma.cu", p);
      free(src);
      ck_assert_int_eq(describes(p, "the exponentials of 1 in 3 8-key chunks on the FMA pipe"), on);
    }
}
END_TEST

/* .sm90_fwd_ws192: head dim 64 without a mask takes 192-row query tiles
 * on three computing warpgroups (512 threads, one tile a CTA, as many K, V
 * stages as fit), and the source compiles; causal, windowed, broadcast
 * and head-dim-128 plans keep 128-row tiles, and the choice off plans as
 * before. */
START_TEST(forward_ws192) {
  const struct {
    int dim;
    bool causal;
    const char *extra;
    bool takes;
  } cases[] = {{64, false, "arch: sm_90a\n", true},
               {64, true, "arch: sm_90a\n", false},
               {64, false, "arch: sm_90a\nwindow: [100, 60]\n", false},
               {64, false, "arch: sm_90a\nquery: broadcast\n", false},
               {128, false, "arch: sm_90a\n", false}};
  for (int i = 0; i < 5; i++)
    for (int on = 0; on <= 1; on++) {
      ag_plan_jagged_choices c = ag_plan_jagged_checked();
      c.sm90_fwd_ws192 = on;
      fake f;
      fake_planned(&f, cases[i].dim, cases[i].causal, cases[i].extra, c);
      const ag_plan *p = &f.kernel.plan;
      ck_assert(p->jagged.fwd_ws);
      const bool takes = on && cases[i].takes;
      ck_assert_int_eq(p->jagged.fwd_block_m, takes ? 192 : 128);
      if (!takes) continue;
      ck_assert_int_eq(p->jagged.fwd_warps, 16);
      ck_assert_int_eq(p->jagged.fwd_items, 1);
      ck_assert_int_eq(p->jagged.fwd_stages, 6);
      ck_assert_int_eq(p->jagged.fwd_smem_bytes, (192 + 2 * 6 * 128) * 64 * 2);
      char *src = emitted(&f);
      ck_assert_ptr_nonnull(strstr(src, "constexpr int kBlockM = 192;"));
      compile_holds_every_kernel(src, "forward_ws192.cu", p);
      free(src);
    }
  /* a causal mask takes them only with .sm90_fwd_ws192_causal too; a
   * window never */
  for (int w = 0; w <= 1; w++) {
    ag_plan_jagged_choices c = ag_plan_jagged_checked();
    c.sm90_fwd_ws192 = c.sm90_fwd_ws192_causal = true;
    c.sm90_ws64_causal = true;
    fake f;
    fake_planned(&f, 64, true, w ? "arch: sm_90a\nwindow: [100, 0]\n" : "arch: sm_90a\n", c);
    const ag_plan *p = &f.kernel.plan;
    ck_assert(p->jagged.fwd_ws);
    ck_assert_int_eq(p->jagged.fwd_block_m, w ? 128 : 192);
    if (w) continue;
    ck_assert_int_eq(p->jagged.fwd_warps, 16);
    char *src = emitted(&f);
    ck_assert_ptr_nonnull(strstr(src, "constexpr int kBlockM = 192;"));
    ck_assert_ptr_nonnull(strstr(src, "constexpr bool kCausal = 1;"));
    compile_holds_every_kernel(src, "forward_ws192_causal.cu", p);
    free(src);
  }
}
END_TEST

/* .sm90_fwd_long192_causal: head dim 64 with a causal mask keeps the
 * 128-row tiles for mean query lengths up to LONG_CAUSAL64_MEAN_ROWS
 * (2,048) and takes the 192-row tiles (one tile a CTA, one Q slot) as a
 * third variant from there; the launcher picks it by the mean (a run of
 * 8 sequences, 16,384 rows), and the module compiles with all three. A
 * window, or the 192-row tiles as the whole route, plan no third. */
START_TEST(forward_long192_causal) {
  ag_plan_jagged_choices c = ag_plan_jagged_checked();
  c.sm90_fwd_ws192 = c.sm90_ws64_causal = c.sm90_fwd_long192_causal = true;
  c.sm90_fwd_ws192_causal = false;
  fake f;
  fake_planned(&f, 64, true, "arch: sm_90a\n", c);
  const ag_plan *p = &f.kernel.plan;
  ck_assert_int_eq(p->jagged.fwd_block_m, 128);
  ck_assert_int_eq(p->jagged.long_fwd_min_rows, 2048);
  int main_i = -1, long_i = -1, small_i = -1;
  for (int i = 0; i < p->nkernels; i++) {
    const ag_plan_kernel *k = &p->kernels[i];
    if (k->pass != AG_PASS_FORWARD) continue;
    if (k->variant == AG_VARIANT_FWD_LARGE) main_i = i;
    if (k->variant == AG_VARIANT_FWD_LONG) long_i = i;
    if (k->variant == AG_VARIANT_FWD_SMALL) small_i = i;
  }
  ck_assert(main_i >= 0 && long_i >= 0 && small_i >= 0);
  const ag_plan_kernel *lk = &p->kernels[long_i], *mk = &p->kernels[main_i];
  ck_assert_str_eq(lk->template_file, "jagged_fwd_ws.cu");
  ck_assert_str_eq(lk->namespace_name, "fwd_long");
  ck_assert_int_eq(lk->walk.rows, 192);
  ck_assert_int_eq(lk->walk.items_per_cta, 1);
  ck_assert_int_eq(lk->threads, 512);
  ck_assert_int_eq(lk->smem_bytes, (192 + 2 * p->jagged.long_fwd_stages * 128) * 64 * 2);
  ck_assert_int_eq(p->jagged.long_fwd_stages, 6);
  ck_assert_int_eq(mk->walk.rows, 128);
  ck_assert_int_gt(mk->walk.items_per_cta, 1); /* the 128-row tiles keep theirs */
  ck_assert_int_eq(ag_plan_variant(p, AG_PASS_FORWARD, 320, 8, 8), AG_VARIANT_FWD_SMALL);
  ck_assert_int_eq(ag_plan_variant(p, AG_PASS_FORWARD, 321, 8, 8), AG_VARIANT_FWD_LARGE);
  ck_assert_int_eq(ag_plan_variant(p, AG_PASS_FORWARD, 2047, 8, 8), AG_VARIANT_FWD_LARGE);
  ck_assert_int_eq(ag_plan_variant(p, AG_PASS_FORWARD, 2048, 8, 8), AG_VARIANT_FWD_LONG);
  ck_assert(describes(p, "runs when the mean query length >= 2048"));
  ck_assert(describes(p, "runs when 320 < the mean query length < 2048"));
  /* the launch: 8 sequences of 2,048 rows take the long kernel alone */
  ag_jagged_fwd_args a = {.q = P(0x10000), .k = P(0x20000), .v = P(0x30000), .o = P(0x40000),
                          .lse = P(0x50000), .cu_seqlens_q = P(0x60000),
                          .cu_seqlens_k = P(0x70000), .batch = 8, .heads = 4, .kv_heads = 4,
                          .total_q = 8 * 2048, .total_k = 8 * 2048};
  ag_error err = {0};
  ag_fake_seen.count = 0;
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[long_i]);
  ck_assert_uint_eq(ag_fake_seen.block, 512);
  /* one row fewer on average: the 128-row tiles */
  a.total_q = 8 * 2048 - 8;
  a.total_k = a.total_q;
  ag_fake_seen.count = 0;
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[main_i]);
  char *src = emitted(&f);
  ck_assert_ptr_nonnull(strstr(src, "namespace fwd_long"));
  compile_holds_every_kernel(src, "forward_long192_causal.cu", p);
  free(src);
  /* no third variant with a window, nor with the 192-row tiles as the route */
  for (int w = 0; w <= 1; w++) {
    ag_plan_jagged_choices d = c;
    d.sm90_fwd_ws192_causal = w;
    fake g;
    fake_planned(&g, 64, true, w ? "arch: sm_90a\n" : "arch: sm_90a\nwindow: [100, 0]\n", d);
    ck_assert_int_eq(g.kernel.plan.jagged.long_fwd_min_rows, 0);
    for (int i = 0; i < g.kernel.plan.nkernels; i++)
      ck_assert_int_ne(g.kernel.plan.kernels[i].variant, AG_VARIANT_FWD_LONG);
  }
}
END_TEST

/* .tma_l2_row64: head dim 64's tensor maps (the forward's K, V, the
 * backward's Q, dO) promote an L2 miss to 128 bytes, one head's row;
 * without it, and at head dim 128 always, to 256. The plan says so where
 * it is 128; the launcher passes it to cuTensorMapEncodeTiled. */
START_TEST(tma_l2_row64) {
  for (int dim = 64; dim <= 128; dim += 64)
    for (int on = 0; on <= 1; on++)
      for (int train = 0; train <= 1; train++) {
        ag_plan_jagged_choices c = ag_plan_jagged_checked();
        c.tma_l2_row64[0] = c.tma_l2_row64[1] = on;
        c.sm90_fwd_tma = c.sm90_bwd_tma = true;
        const bool row = on && dim == 64;
        fake f;
        char y[512];
        yaml_for(y, sizeof y, dim, AG_DTYPE_BF16, false, "arch: sm_90a\n", train);
        fake_with(&f, y, train ? 12 : 7, c);
        const ag_plan *p = &f.kernel.plan;
        ck_assert_int_eq(p->jagged.tma_l2_bytes[0], row ? 128 : 256);
        ck_assert_int_eq(p->jagged.tma_l2_bytes[1], row ? 128 : 256);
        int with_maps = 0;
        for (int i = 0; i < p->nkernels; i++)
          if (p->kernels[i].tma_rows) {
            ck_assert_int_eq(p->kernels[i].tma_l2_bytes, row ? 128 : 256);
            with_maps++;
          }
        ck_assert_int_gt(with_maps, 0);
        ck_assert_int_eq(describes(p, "L2 fetches of 128 bytes"), row);
        ag_fake_seen.tmaps = 2;
        ag_error err = {0};
        if (train) {
          ag_jagged_bwd_args b = bwd_args();
          ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s",
                        err.message);
        } else {
          ag_jagged_fwd_args a = fwd_args();
          a.total_q = 1153; /* mean 385: the warp-specialized forward */
          ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s",
                        err.message);
        }
        ck_assert_int_eq(ag_fake_seen.encodes, 2);
        ck_assert_int_eq(ag_fake_seen.enc_l2, row ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                  : CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
      }
  /* the map itself takes 128 or 256 bytes and refuses other values */
  ag_context ctx;
  memset(&ctx, 0, sizeof ctx);
  ag_fake_driver_attach(&ctx, 0);
  CUtensorMap map;
  const int bytes[] = {128, 256, 0, 64, 192, 512};
  for (int i = 0; i < 6; i++) {
    ag_error err = {0};
    const ag_status st =
        ag_tma_rows_map(ctx.drv, &map, (void *)(uintptr_t)0x10000, 100, 4, 64, 128, bytes[i], &err);
    if (i < 2) {
      ck_assert_int_eq(st, AG_OK);
      continue;
    }
    ck_assert_int_eq(st, AG_ERR_INVALID_ARGUMENT);
    char want[48];
    snprintf(want, sizeof want, "(L2 promotion %d bytes)", bytes[i]);
    ck_assert_msg(err.message && strstr(err.message, want), "%s", err.message);
    ag_error_clear(&err);
  }
}
END_TEST

/* The warp-specialized forward walking several query tiles a CTA
 * (.fwd_items, plan_forward_items): with two Q slots head dim 128 keeps two
 * K, V stages (three would pass the SM's shared memory) and 64 its three;
 * with one slot both keep three. The main forward's grid is ceil(tiles /
 * items) CTAs a head (the short variant's one tile a CTA); the source
 * names the constants and compiles. Broadcast queries keep one tile a CTA
 * (the walk's host half would divide its grid likewise). */
START_TEST(forward_items) {
  for (int d = 0; d < 2; d++)
    for (int qt = 1; qt <= 2; qt++) {
      const int dim = d ? 128 : 64, stages = dim == 128 && qt == 2 ? 2 : 3;
      ag_plan_jagged_choices c = ag_plan_jagged_checked();
      c.fwd_items[0] = c.fwd_items[1] = 4;
      c.fwd_q_tiles[0] = c.fwd_q_tiles[1] = qt;
      c.sm90_fwd_ws192 = false; /* its 192-row tiles take one a CTA (forward_ws192) */
      fake f;
      char y[512];
      yaml_for(y, sizeof y, dim, AG_DTYPE_BF16, false, "arch: sm_90a\n", false);
      fake_with(&f, y, 7, c);
      const ag_plan *p = &f.kernel.plan;
      ck_assert(p->jagged.fwd_ws);
      ck_assert_int_eq(p->jagged.fwd_items, 4);
      ck_assert_int_eq(p->jagged.fwd_q_tiles, qt);
      ck_assert_int_eq(p->jagged.fwd_stages, stages);
      const ag_plan_kernel *main_k = &p->kernels[0];
      ck_assert_str_eq(main_k->template_file, "jagged_fwd_ws.cu");
      ck_assert_int_eq(main_k->variant, AG_VARIANT_FWD_LARGE);
      ck_assert_int_eq(main_k->walk.items_per_cta, 4);
      ck_assert_int_eq(main_k->smem_bytes, (qt * 128 + 2 * stages * 128) * dim * 2);
      ck_assert_int_le(main_k->smem_bytes + 1024, AG_SMEM_MAX_SM90); /* + its static 1 KiB */
      ck_assert_int_eq(p->nkernels, 2);
      ck_assert_int_eq(p->kernels[1].walk.items_per_cta, 1); /* the short variant */
      ag_fake_seen.tmaps = 2;
      ag_jagged_fwd_args a = fwd_args();
      a.total_q = 1153; /* mean 385: the main forward; 3 + 1153 / 128 = 12 tiles */
      ag_error err = {0};
      ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
      ck_assert_int_eq(ag_fake_seen.count, 1);
      ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[0]);
      ck_assert_uint_eq(ag_fake_seen.grids_x[0], 3);
      ck_assert_uint_eq(ag_fake_seen.grids_y[0], 8);
      ck_assert_int_eq(ag_fake_seen.items, 12); /* the kernel's num_tiles: every tile */
      char *src = NULL;
      ck_assert_int_eq(ag_emit_plan(&f.kernel.spec, p, &src, &err), AG_OK);
      ck_assert_ptr_nonnull(strstr(src, "constexpr int kItems = 4;"));
      char want[64];
      snprintf(want, sizeof want, "constexpr int kQTiles = %d;", qt);
      ck_assert_ptr_nonnull(strstr(src, want));
      compile_holds_every_kernel(src, "forward_items.cu", p);
      free(src);
      ag_buf b;
      ag_buf_init(&b);
      ag_plan_jagged_describe(p, "", &b);
      ck_assert_ptr_nonnull(strstr(b.data, "4 query tiles a CTA in turn"));
      ck_assert_ptr_nonnull(strstr(b.data, "grid: (ceil((batch + total_q / 128) / 4), heads)"));
      /* the short variant's grid: one tile a CTA */
      ck_assert_ptr_nonnull(strstr(b.data, "grid: (batch + total_q / "));
      ag_buf_free(&b);
    }
  /* the checked choices: 4 tiles and 2 Q slots at head dim 64, one tile a
   * CTA at 128; broadcast queries always one */
  ck_assert_int_eq(ag_plan_jagged_checked().fwd_items[0], 4);
  ck_assert_int_eq(ag_plan_jagged_checked().fwd_q_tiles[0], 2);
  ck_assert_int_le(ag_plan_jagged_checked().fwd_items[1], 1);
  for (int d = 0; d < 2; d++) {
    char y[512];
    snprintf(y, sizeof y,
             "name: bq\npattern: jagged\nquery: broadcast\nhead_dim: %d\ndtype: bf16\n"
             "arch: sm_90a\npasses: [forward]\n",
             d ? 128 : 64);
    ag_spec s = load_ok(y);
    ag_plan_jagged_choices c = ag_plan_jagged_checked();
    c.fwd_items[0] = c.fwd_items[1] = 4;
    ag_plan p;
    ag_error err = {0};
    ck_assert_int_eq(ag_plan_jagged_make_with(&s, c, &p, &err), AG_OK);
    ck_assert(p.jagged.fwd_ws);
    /* one tile a CTA unless .bq_fwd_items takes them at this head dim */
    const bool several = c.bq_fwd_items[d];
    ck_assert_int_eq(p.jagged.fwd_items, several ? 4 : 1);
    ck_assert_int_eq(p.jagged.fwd_q_tiles, several ? c.fwd_q_tiles[d] : 1);
  }
  /* broadcast: n_q 200 over 10 sequences, 2 query tiles each: 20 items */
  const ag_walk w = {AG_WALK_BROADCAST_Q, 128, 1, 3, false};
  ag_launch la = {.batch = 10, .heads = 4, .kv_heads = 4, .total_q = 2000, .total_k = 9000};
  unsigned grid[3];
  int64_t items = 0;
  ag_error err = {0};
  ck_assert_int_eq(ag_walk_jagged_grid(&w, &la, 132, 1, grid, &items, &err), AG_OK);
  ck_assert_uint_eq(grid[0], 7); /* ceil(20 / 3) */
  ck_assert_uint_eq(grid[1], 4);
  ck_assert_int_eq(items, 20);
}
END_TEST

/* Head dim 64 with a causal mask on sm_90a (sm90_ws64_causal): the
 * warp-specialized forward for runs of mean query length past 320, the
 * mma.sync forward's 128-row tiles up to it; with a window too. The
 * emitted source holds both kernels. */
START_TEST(causal64_forward) {
  ag_plan_jagged_choices with = ag_plan_jagged_checked();
  with.sm90_ws64_causal = true;
  const char *extras[] = {"arch: sm_90a\n", "arch: sm_90a\nwindow: [128, 0]\n"};
  for (int i = 0; i < 2; i++) {
    fake f;
    char y[512];
    yaml_for(y, sizeof y, 64, AG_DTYPE_BF16, true, extras[i], false);
    fake_with(&f, y, 7, with);
    const ag_plan *q = &f.kernel.plan;
    /* a third, long variant (kernels[2]) where .sm90_fwd_long192_causal plans one */
    ck_assert_int_eq(q->nkernels, q->jagged.long_fwd_min_rows > 0 ? 3 : 2);
    ck_assert_int_eq(q->jagged.long_fwd_min_rows > 0, i == 0 && with.sm90_fwd_long192_causal &&
                                                           with.sm90_fwd_ws192 &&
                                                           !with.sm90_fwd_ws192_causal);
    ck_assert_str_eq(q->kernels[0].template_file, "jagged_fwd_ws.cu");
    ck_assert_int_eq(q->kernels[0].variant, AG_VARIANT_FWD_LARGE);
    ck_assert_str_eq(q->kernels[1].template_file, "jagged_fwd.cu");
    ck_assert_int_eq(q->kernels[1].variant, AG_VARIANT_FWD_SMALL);
    ck_assert_int_eq(q->kernels[1].walk.rows, 128);
    ck_assert_int_eq(ag_plan_variant(q, AG_PASS_FORWARD, 320, 8, 8), AG_VARIANT_FWD_SMALL);
    ck_assert_int_eq(ag_plan_variant(q, AG_PASS_FORWARD, 321, 8, 8), AG_VARIANT_FWD_LARGE);
    ag_error err = {0};
    /* mean ceil(961 / 3) = 321: the warp-specialized one */
    ag_jagged_fwd_args a = fwd_args();
    a.total_q = 961;
    ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
    ck_assert_int_eq(ag_fake_seen.count, 1);
    ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[0]);
    /* mean exactly 320: the mma.sync tiles */
    fake_with(&f, y, 7, with);
    a = fwd_args();
    a.total_q = 960;
    ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
    ck_assert_int_eq(ag_fake_seen.count, 1);
    ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[1]);
    ck_assert_uint_eq(ag_fake_seen.grids_x[0], 3 + 960 / 128);
    char *src = NULL;
    ck_assert_int_eq(ag_emit_plan(&f.kernel.spec, q, &src, &err), AG_OK);
    const char *first = strstr(src, "constexpr bool kCausal = 1;");
    ck_assert(first && strstr(first + 1, "constexpr bool kCausal = 1;")); /* both kernels */
    free(src);
  }
}
END_TEST

static void expect_fwd_reject(fake *f, const ag_jagged_fwd_args *a, const char *want) {
  ag_error err = {0};
  ck_assert_int_eq(ag_jagged_forward(&f->kernel, a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, want);
  ag_error_clear(&err);
  ck_assert_int_eq(ag_fake_seen.count, 0);
}

START_TEST(argument_checks) {
  fake f;
  fake_init(&f, 128, false, 7);
  ag_jagged_fwd_args a = fwd_args();
  a.kv_heads = 3;
  expect_fwd_reject(&f, &a, "kv_heads (3) does not divide heads (8)");
  a = fwd_args();
  a.heads = 0;
  expect_fwd_reject(&f, &a,
                    "need batch >= 0, heads >= 1, kv_heads >= 1, total_q >= 0, total_k >= 0 "
                    "(got 3, 0, 2, 300, 500)");
  a = fwd_args();
  a.k = NULL;
  expect_fwd_reject(&f, &a, "k is a null pointer");
  a = fwd_args();
  a.o = P(0x40008);
  expect_fwd_reject(&f, &a, "o (0x40008) is not 16-byte aligned; the kernel loads 16 bytes at a time");
  a = fwd_args();
  a.lse = P(0x50002);
  expect_fwd_reject(&f, &a, "lse (0x50002) is not 4-byte aligned");
  a = fwd_args();
  a.cu_seqlens_k = NULL;
  expect_fwd_reject(&f, &a, "cu_seqlens_k is a null pointer");
  a = fwd_args();
  a.total_q = (int64_t)INT32_MAX + 1;
  expect_fwd_reject(&f, &a,
                    "total_q and total_k (2147483648, 500) must not exceed 2^31 - 1, the most "
                    "int32 offsets can reach");
  int32_t hq[4] = {0, 100, 90, 300}, hk[4] = {0, 100, 200, 400};
  a = fwd_args();
  a.host_cu_seqlens_q = hq;
  expect_fwd_reject(&f, &a, "host_cu_seqlens_q decrease at index 2 (90 after 100)");
  hq[2] = 200;
  a.host_cu_seqlens_k = hk;
  expect_fwd_reject(&f, &a, "host_cu_seqlens_k[3] (the last) is 400, not total_k (500)");
  /* lse may be left out; kv_heads 0 means heads. */
  hk[3] = 500;
  a.lse = NULL;
  a.kv_heads = 0;
  ag_error err = {0};
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.kv_heads, 8);
  ck_assert_uint_eq(ag_fake_seen.ptr[4], 0);
  /* Nothing to do: no launch. */
  ag_fake_seen.count = 0;
  a = fwd_args();
  a.batch = 0;
  a.total_q = a.total_k = 0;
  ck_assert_int_eq(ag_jagged_forward(&f.kernel, &a, NULL, &err), AG_OK);
  ck_assert_int_eq(ag_fake_seen.count, 0);
  /* A forward kernel is not a backward one, nor a block kernel a jagged one. */
  ag_jagged_bwd_args b = bwd_args();
  ck_assert_int_eq(ag_jagged_backward(&f.kernel, &b, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "kernel 'jag' is not a jagged backward kernel");
  ag_error_clear(&err);
  ag_block_fwd_args blk = {0};
  ck_assert_int_eq(ag_block_forward(&f.kernel, &blk, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ag_error_clear(&err);
  fake_init(&f, 64, true, 12);
  b = bwd_args();
  b.workspace = NULL;
  ck_assert_int_eq(ag_jagged_backward(&f.kernel, &b, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "workspace is a null pointer");
  ag_error_clear(&err);
  /* a table for a kernel that takes none */
  fake_init(&f, 128, false, 7);
  a = fwd_args();
  a.rotary_table = P(0xd0000);
  expect_fwd_reject(&f, &a,
                    "a rotary table was given, but kernel 'jag' takes none (its spec has no "
                    "rotary embeddings)");
}
END_TEST

/* Rotary tables: required by a kernel with positions from tables, the
 * keys' defaulting to the queries' only when the token counts agree, and
 * passed after the pass's tensors. */
START_TEST(rotary_tables) {
  fake f;
  char y[512];
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "rotary:\n  layout: interleaved\n", true);
  ag_fake_jagged_kernel(&f, y, 9);
  ag_jagged_fwd_args a = fwd_args();
  expect_fwd_reject(&f, &a,
                    "rotary_table is a null pointer; kernel 'jag' takes its rotary positions from "
                    "tables ([total_q, head_dim] for the queries, [total_k, head_dim] for the "
                    "keys: sin, then cos)");
  a.rotary_table = P(0xd0000);
  expect_fwd_reject(&f, &a,
                    "rotary_table_k is a null pointer, and the queries' table cannot serve the "
                    "keys: total_k (500) is not total_q (300)");
  a.rotary_table_k = P(0xe0008);
  expect_fwd_reject(&f, &a,
                    "rotary_table_k (0xe0008) is not 16-byte aligned; the kernel loads 16 bytes "
                    "at a time");
  a.rotary_table_k = P(0xe0000);
  ag_error err = {0};
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  const void *order[9] = {a.q, a.k, a.v, a.o, a.lse, a.rotary_table, a.rotary_table_k,
                          a.cu_seqlens_q, a.cu_seqlens_k};
  for (int i = 0; i < 9; i++)
    ck_assert_uint_eq(ag_fake_seen.ptr[i], (CUdeviceptr)(uintptr_t)order[i]);
  /* self-attention: one table serves both */
  a.rotary_table_k = NULL;
  a.total_k = a.total_q;
  ck_assert_msg(ag_jagged_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_uint_eq(ag_fake_seen.ptr[6], (CUdeviceptr)(uintptr_t)a.rotary_table);
  ag_fake_jagged_kernel(&f, y, 14);
  ag_jagged_bwd_args b = bwd_args();
  b.rotary_table = P(0xd0000);
  b.rotary_table_k = P(0xe0000);
  ck_assert_msg(ag_jagged_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_uint_eq(ag_fake_seen.ptr[10], (CUdeviceptr)(uintptr_t)b.rotary_table);
  ck_assert_uint_eq(ag_fake_seen.ptr[11], (CUdeviceptr)(uintptr_t)b.rotary_table_k);
  ck_assert_uint_eq(ag_fake_seen.ptr[12], (CUdeviceptr)(uintptr_t)b.cu_seqlens_q);
  /* computed positions: no table */
  yaml_for(y, sizeof y, 64, AG_DTYPE_BF16, false,
           "rotary:\n  layout: half\n  positions: sequence\n", false);
  ag_fake_jagged_kernel(&f, y, 7);
  a = fwd_args();
  a.rotary_table = P(0xd0000);
  expect_fwd_reject(&f, &a,
                    "a rotary table was given, but kernel 'jag' takes none (its spec computes "
                    "the rotary positions)");
}
END_TEST

/* ---- on a GPU ---------------------------------------------------------------------- */


typedef struct gpu_case {
  jcase k;
  int64_t heads, kv_heads;
  bool mma_sync; /* the mma.sync kernels even where the plan would take wgmma */
} gpu_case;

static const gpu_case gpu_cases[] = {
    {{AG_DTYPE_BF16, 128, false, ""}, 8, 2, false},
    {{AG_DTYPE_BF16, 128, true, ""}, 4, 4, false},
    {{AG_DTYPE_FP16, 64, true, ""}, 8, 1, false},
    {{AG_DTYPE_BF16, 64, false, "window: [100, 0]\n"}, 4, 4, false},
    {{AG_DTYPE_FP16, 128, false, "window: [64, 32]\n"}, 4, 2, false},
    {{AG_DTYPE_BF16, 128, true, "window: [128, 0]\ndeterministic: true\n"}, 2, 1, false},
    {{AG_DTYPE_FP16, 64, false, ""}, 2, 2, false},
    {{AG_DTYPE_BF16, 64, true, "deterministic: true\n"}, 8, 4, false},
    /* rotary embeddings: both layouts, both position modes, V too */
    {{AG_DTYPE_BF16, 128, true, "rotary:\n  layout: half\n  positions: sequence\n"}, 4, 2, false},
    {{AG_DTYPE_FP16, 64, false, "rotary:\n  layout: interleaved\n  apply_to: [q, k, v]\n"}, 4, 4, false},
    {{AG_DTYPE_BF16, 64, false,
      "window: [100, 0]\nrotary:\n  layout: interleaved\n  positions: sequence\n"}, 8, 2, false},
    {{AG_DTYPE_FP16, 128, true, "rotary:\n  layout: half\n  apply_to: [k]\n"}, 2, 1, false},
    /* the mma.sync kernels with rotary: on an sm_90a device the plan
     * takes the wgmma ones (plan_jagged.c, jagged_checked.sm90_rotary),
     * so these two are planned without them (case_kernel below) to stay
     * checked on the H200. An sm_80 cubin does not run on sm_90. */
    {{AG_DTYPE_BF16, 128, true, "rotary:\n  layout: half\n  positions: sequence\n"}, 4, 2, true},
    {{AG_DTYPE_FP16, 64, false, "rotary:\n  layout: interleaved\n  apply_to: [q, k, v]\n"},
     4, 4, true},
};
enum { NGPU = sizeof gpu_cases / sizeof gpu_cases[0] };

static const char *name_of(const gpu_case *c) {
  static char buf[128];
  snprintf(buf, sizeof buf, "%s d%d%s%s%s%s h%lld/%lld",
           c->k.dtype == AG_DTYPE_FP16 ? "fp16" : "bf16", c->k.dim, c->k.causal ? " causal" : "",
           strstr(c->k.extra, "window: [100") ? " w[100,0]"
           : strstr(c->k.extra, "window: [64") ? " w[64,32]"
           : strstr(c->k.extra, "window: [128") ? " w[128,0]" : "",
           !strstr(c->k.extra, "rotary") ? ""
           : strstr(c->k.extra, "sequence") ? (strstr(c->k.extra, "half") ? " rope-h-seq" : " rope-i-seq")
           : (strstr(c->k.extra, "half") ? " rope-h-tab" : " rope-i-tab"),
           c->mma_sync ? " mma.sync" : "",
           (long long)c->heads, (long long)c->kv_heads);
  return buf;
}

/* The kernel of `yaml` on ctx's device; with mma_sync, planned as if the
 * sm_90a rotary kernels were not taken (ag_plan_jagged_make_with), then
 * emitted and loaded as ag_kernel_get does. */
static ag_status case_kernel(ag_context *ctx, const char *yaml, bool mma_sync, ag_kernel **k,
                             ag_error *err) {
  if (!mma_sync || strcmp(ctx->arch, "sm_90a") != 0)
    return ag_kernel_get_string(ctx, yaml, strlen(yaml), k, err);
  ag_spec s, resolved;
  ag_plan plan;
  char *source = NULL;
  ag_status st = ag_spec_load_string(yaml, strlen(yaml), NULL, &s, err);
  if (st == AG_OK) st = ag_spec_for_arch(&s, ctx->arch, &resolved, err);
  ag_plan_jagged_choices without = ag_plan_jagged_checked();
  without.sm90_rotary = false;
  if (st == AG_OK) st = ag_plan_jagged_make_with(&resolved, without, &plan, err);
  if (st == AG_OK) ag_plan_kernels(&resolved, &plan); /* as ag_plan_make does */
  if (st == AG_OK) st = ag_emit_plan(&resolved, &plan, &source, err);
  if (st == AG_OK) st = ag_context_kernel(ctx, &resolved, &plan, source, ctx->arch, NULL, k, err);
  free(source);
  return st;
}

static void run_case(ag_kernel *k, const gpu_case *c, const char *what, const int32_t *lq,
                     const int32_t *lk, int64_t batch, uint64_t seed) {
  ag_jagged_check_options opt = {.seed = seed, .heads = c->heads, .kv_heads = c->kv_heads,
                                 .backward = true, .repeat_backward = 4, .max_ref_macs = 3e9};
  ag_jagged_check_result r;
  ag_error err = {0};
  ag_status st = ag_selfcheck_jagged(k, lq, lk, batch, &opt, &r, &err);
  ck_assert_msg(st == AG_OK, "%s: %s", what, err.message);
  const ag_dtype dt = c->k.dtype;
  printf("gpu jagged %-26s %-30s o %.2e lse %.1e dq %.2e dk %.2e dv %.2e%s (%lld pairs)\n",
         name_of(c), what, r.rel_o, r.lse_abs, r.rel_dq, r.rel_dk, r.rel_dv,
         r.bitwise_repeatable ? ""
         : r.dkv_repeatable && k->plan.jagged.fast.block_m ? " (dQ by atomics: its bits vary)"
                                                           : " NOT REPEATABLE",
         (long long)r.checked_pairs);
  ck_assert_msg(r.unwritten == 0, "%s: %lld elements never written", what, (long long)r.unwritten);
  ck_assert_msg(r.lse_mismatch == 0, "%s: %lld rows -inf on one side only", what,
                (long long)r.lse_mismatch);
  ck_assert_msg(r.rel_o <= ag_jagged_tolerance(dt, false), "%s: O error %g", what, r.rel_o);
  ck_assert_msg(r.lse_abs <= 2e-3, "%s: lse error %g", what, r.lse_abs);
  const double tol = ag_jagged_tolerance(dt, true);
  ck_assert_msg(r.rel_dq <= tol && r.rel_dk <= tol && r.rel_dv <= tol,
                "%s: gradient errors %g %g %g > %g", what, r.rel_dq, r.rel_dk, r.rel_dv, tol);
  /* Deterministic kernels (the spec says so, or no fast backward was
   * planned) repeat bit for bit; the fast one's dQ takes atomic adds in
   * any order, but its dK and dV are each written by one CTA in order. */
  ck_assert(r.dq_by_atomics == (k->plan.jagged.fast.block_m > 0));
  if (k->spec.deterministic || !r.dq_by_atomics)
    ck_assert_msg(r.bitwise_repeatable, "%s: the backward differs between runs", what);
  else
    ck_assert_msg(r.dkv_repeatable, "%s: dK or dV differs between runs", what);
}

START_TEST(gpu_jagged) {
  const gpu_case *c = &gpu_cases[_i];
  ag_context *ctx = ag_test_gpu_or_skip("jagged");
  if (!ctx) return;
  char y[512];
  yaml_for(y, sizeof y, c->k.dim, c->k.dtype, c->k.causal, c->k.extra, true);
  ag_kernel *k;
  ag_error err = {0};
  ck_assert_msg(case_kernel(ctx, y, c->mma_sync, &k, &err) == AG_OK, "%s", err.message);
  /* the mma.sync cases really run the mma.sync kernels */
  if (c->mma_sync) ck_assert(!k->plan.jagged.fwd_sm90 && k->plan.jagged.fast.block_m == 0);
  uint64_t seed = (uint64_t)getpid() * 1000003u + 7919u * (uint64_t)_i;
  /* 4096 in two cases (its float64 backward alone takes seconds), 1500 in
   * the others. */
  int32_t mixed[] = {0, 1, 63, 64, 65, 127, 129, 1000, _i % 5 == 0 ? 4096 : 1500, 3};
  run_case(k, c, _i % 5 == 0 ? "lengths 0,1,63,..,1000,4096" : "lengths 0,1,63,..,1000,1500", mixed, NULL, 10, seed);
  /* Cross-attention: more queries than keys (under causal, rows with no
   * key), fewer, and empty sides. */
  int32_t lq[] = {100, 5, 64, 0, 200, 129, 1};
  int32_t lk[] = {30, 300, 64, 50, 0, 257, 1};
  run_case(k, c, "cross lq != lk", lq, lk, 7, seed + 1);
  int32_t many[48];
  uint64_t rng = seed;
  for (int i = 0; i < 48; i++) many[i] = (int32_t)(ag_rand_next(&rng) % 400);
  run_case(k, c, "48 random lengths 0..399", many, NULL, 48, seed + 2);
  /* Mean query length 410, past the short-sequence variant's 384: the main
   * forward (on sm_90a the warp-specialized one) with cross lengths, empty
   * sides and a partial last tile. */
  int32_t lq2[] = {700, 5, 640, 0, 1200, 129, 1, 600};
  int32_t lk2[] = {300, 900, 640, 50, 0, 257, 1, 1000};
  run_case(k, c, "long cross lq != lk", lq2, lk2, 8, seed + 3);
  /* Head dim 64 with a mask on sm_90a: a run of mean query length 2603.25
   * (ceil 2604), past long_min_rows, takes the long backward
   * (jagged_bwd_ws.cu) ... */
  if (k->plan.jagged.long_min_rows > 0) {
    int32_t lq3[] = {4096, 3000, 0, 1, 129, 4000, 3100, 6500};
    int64_t total = 0;
    for (int i = 0; i < 8; i++) total += lq3[i];
    ck_assert_int_eq(ag_plan_variant(&k->plan, AG_PASS_BACKWARD, (total + 7) / 8, c->heads,
                                     c->kv_heads),
                     AG_VARIANT_BWD_LONG);
    /* ... and, where the forward has a short variant (causal: the
     * warp-specialized one past 320), the main forward, or its long
     * variant where one is planned (192-row tiles from a mean of 2,048) */
    if (k->plan.jagged.small_block_m > 0)
      ck_assert_int_eq(ag_plan_variant(&k->plan, AG_PASS_FORWARD, (total + 7) / 8, c->heads,
                                       c->kv_heads),
                       k->plan.jagged.long_fwd_min_rows > 0 &&
                               (total + 7) / 8 >= k->plan.jagged.long_fwd_min_rows
                           ? AG_VARIANT_FWD_LONG
                           : AG_VARIANT_FWD_LARGE);
    run_case(k, c, "long run (mean 2603)", lq3, NULL, 8, seed + 4);
    /* cross lengths past a mean of 2,048 rows (a long forward variant
     * where one is planned), one sequence with no keys at all */
    int32_t lq4[] = {4096, 3000, 2500, 100, 4000, 2600, 0, 3000};
    int32_t lk4[] = {1000, 5000, 0, 100, 4096, 1, 3000, 2600};
    run_case(k, c, "long cross (mean 2412)", lq4, lk4, 8, seed + 5);
  }
  ag_context_destroy(ctx);
}
END_TEST

/* Past 2^31 elements per tensor, forward and backward: 131,072 sequences
 * of 17 or 18 tokens with 8 query and 8 key heads of 128 (2,348,810,240
 * elements in each of q, k, v, O, dO, dQ, dK, dV), causal, bf16. The
 * self-check always compares the last sequence, whose rows lie past 2^31
 * elements, and copies only its sample to float64 (host memory: the 16-bit
 * tensors, about 38 GB). Skipped with ATTNGEN_TEST_SKIP_HUGE. */
START_TEST(jagged_huge) {
  int32_t *lengths = ag_test_huge_lengths("jagged_huge");
  if (!lengths) return;
  ag_context *ctx = ag_test_gpu_or_skip("jagged_huge");
  if (!ctx) {
    free(lengths);
    return;
  }
  enum { BATCH = AG_HUGE_BATCH, HEADS = AG_HUGE_HEADS };
  int64_t total = 0;
  for (int64_t i = 0; i < BATCH; i++) total += lengths[i];
  char y[512];
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, true, "", true);
  ag_kernel *k;
  ag_error err = {0};
  ck_assert_msg(ag_kernel_get_string(ctx, y, strlen(y), &k, &err) == AG_OK, "%s", err.message);
  ag_jagged_check_options opt = {.seed = (uint64_t)getpid(), .heads = HEADS, .kv_heads = HEADS,
                                 .backward = true, .max_ref_macs = 2e8};
  ag_jagged_check_result r;
  ag_status st = ag_selfcheck_jagged(k, lengths, NULL, BATCH, &opt, &r, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message);
  printf("gpu jagged huge: %lld tokens x %d heads x 128: o %.2e lse %.1e dq %.2e dk %.2e dv %.2e "
         "(%lld pairs)\n",
         (long long)total, HEADS, r.rel_o, r.lse_abs, r.rel_dq, r.rel_dk, r.rel_dv,
         (long long)r.checked_pairs);
  ck_assert_int_eq(r.unwritten, 0);
  ck_assert_int_eq(r.lse_mismatch, 0);
  ck_assert_double_le(r.rel_o, ag_jagged_tolerance(AG_DTYPE_BF16, false));
  ck_assert_double_le(r.lse_abs, 2e-3);
  const double tol = ag_jagged_tolerance(AG_DTYPE_BF16, true);
  ck_assert(r.rel_dq <= tol && r.rel_dk <= tol && r.rel_dv <= tol);
  free(lengths);
  ag_context_destroy(ctx);
}
END_TEST

Suite *jagged_suite(void) {
  Suite *s = suite_create("jagged");
  TCase *tc = tcase_create("jagged");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, validation);
  tcase_add_test(tc, plan_kernels);
  tcase_add_test(tc, source_shape);
  tcase_add_test(tc, launch_parameters);
  tcase_add_test(tc, fast_backward_plan);
  tcase_add_test(tc, long_backward_plan);
  tcase_add_test(tc, ws_backward_plan);
  tcase_add_test(tc, causal64_forward);
  tcase_add_test(tc, tma_backward_plan);
  tcase_add_test(tc, fused_dq_plan);
  tcase_add_test(tc, ws_without_tma_compiles);
  tcase_add_test(tc, tma_forward_plan);
  tcase_add_test(tc, forward_items);
  tcase_add_test(tc, forward_skip_dead);
  tcase_add_test(tc, forward_exp2_fma);
  tcase_add_test(tc, forward_ws192);
  tcase_add_test(tc, forward_long192_causal);
  tcase_add_test(tc, tma_l2_row64);
  tcase_add_test(tc, short_forward);
  tcase_add_test(tc, argument_checks);
  tcase_add_test(tc, rotary_tables);
  tcase_add_loop_test(tc, compiles, 0, (int)(sizeof compile_cases / sizeof compile_cases[0]));
  tcase_add_test(tc, sm90_rotary_compiles);
  suite_add_tcase(s, tc);
  TCase *gpu = tcase_create("jagged_gpu");
  tcase_set_timeout(gpu, 1200);
  tcase_add_loop_test(gpu, gpu_jagged, 0, NGPU);
  suite_add_tcase(s, gpu);
  TCase *huge = tcase_create("jagged_huge");
  tcase_set_timeout(huge, 1200);
  tcase_add_test(huge, jagged_huge);
  suite_add_tcase(s, huge);
  return s;
}
