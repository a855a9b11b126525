// SPDX-License-Identifier: BSD-3-Clause
/* check_broadcast.c: broadcast-Q attention (`pattern: jagged`, `query:
 * broadcast`). On the CPU: validation, the plan's four kernels and their
 * walks, NVRTC compiles for sm_90a and sm_80, and ag_broadcast_forward /
 * _backward's checks, grids and workspace through a fake driver. On a GPU
 * (tcase broadcast_gpu; SKIP without one): both passes against the float64
 * reference of Q expanded to every sequence (its dQ summed over the batch),
 * on fresh random inputs with poisoned outputs, for n_q 1, 16, 64, 128 and
 * 200, key lengths 0, 1, 63..65, 1000 and 4096 in one batch, GQA, causal
 * and windows, both dtypes and head dims, every gradient bit for bit over
 * five runs; and a batch of 100,000 sequences. */
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

static void yaml_for(char *yaml, size_t cap, int dim, ag_dtype dtype, bool causal,
                     const char *extra, bool backward) {
  snprintf(yaml, cap,
           "name: pma\npattern: jagged\nquery: broadcast\nhead_dim: %d\ndtype: %s\ncausal: %s\n"
           "%spasses: %s\n",
           dim, dtype == AG_DTYPE_FP16 ? "fp16" : "bf16", causal ? "true" : "false", extra,
           backward ? "[forward, backward]" : "[forward]");
}

static ag_spec load_ok(const char *yaml) {
  ag_spec spec;
  ag_error err = {0};
  ag_status st = ag_spec_load_string(yaml, strlen(yaml), "pma.yaml", &spec, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message ? err.message : "");
  return spec;
}

/* A bf16 broadcast spec, not causal, with `extra` keys (an arch, say),
 * loaded; the plan tests' common case. */
static ag_spec bf16_spec(int dim, const char *extra, bool backward) {
  char y[512];
  yaml_for(y, sizeof y, dim, AG_DTYPE_BF16, false, extra, backward);
  return load_ok(y);
}

static void expect_error(const char *yaml, ag_status want, const char *text) {
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "pma.yaml", &spec, &err), want);
  ck_assert_msg(err.message && strstr(err.message, text), "want '%s' in: %s", text,
                err.message ? err.message : "(none)");
  ag_error_clear(&err);
}

/* The plan of `s` with `choices`, its kernels named (as ag_plan_make does
 * with the checked choices). */
static void plan_with(const ag_spec *s, ag_plan_jagged_choices choices, ag_plan *p) {
  ag_error err = {0};
  ck_assert_msg(ag_plan_jagged_make_with(s, choices, p, &err) == AG_OK, "%s", err.message);
  ag_plan_kernels(s, p);
}

/* Kernel `kernel` of src (whose first kernel is `first`) spills nothing
 * under ptxas for sm_90a, where NVRTC reports; `what` adds to the message. */
static void no_spills(const char *src, const char *first, const char *kernel, const char *dir,
                      const char *what) {
  int regs = 0, stores = 0, loads = 0;
  if (ag_test_compile_report(src, first, "sm_90a", kernel, dir, &regs, &stores, &loads))
    ck_assert_msg(stores + loads == 0, "%s%s spills %d + %d bytes", kernel, what, stores, loads);
}

START_TEST(validation) {
  char y[512];
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, false, "", true);
  ag_spec s = load_ok(y);
  ck_assert_int_eq(s.query, AG_QUERY_BROADCAST);
  yaml_for(y, sizeof y, 64, AG_DTYPE_FP16, true, "window: [256, 0]\ndeterministic: true\n", true);
  s = load_ok(y);
  ck_assert(s.causal && s.has_window && s.deterministic);
  /* Rotary embeddings with a broadcast Q (the rotary_* tests below). */
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, false, "rotary:\n  layout: half\n", false);
  s = load_ok(y);
  ck_assert_int_eq(s.rotary.layout, AG_ROTARY_HALF);
  /* Broadcast queries belong to the jagged pattern. */
  expect_error("name: b\npattern: block_diagonal\nquery: broadcast\nhead_dim: 64\ndtype: bf16\n",
               AG_ERR_SPEC, "pma.yaml:3:8: error: query broadcast applies only to pattern jagged");
  expect_error("name: b\npattern: jagged\nquery: everyone\nhead_dim: 64\ndtype: bf16\n",
               AG_ERR_SPEC, "pma.yaml:3:8");
}
END_TEST

START_TEST(plan_kernels) {
  char y[512];
  yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, false, "", true);
  ag_spec s = load_ok(y);
  ag_plan p;
  ag_error err = {0};
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert(p.jagged.broadcast);
  /* Two forwards (128- and 32-row tiles), three one-pass backwards (32,
   * 64 and 128 rows), the split backward and the sum of the slabs. */
  ck_assert_int_eq(p.nkernels, 8);
  const ag_plan_kernel *f = &p.kernels[0], *fs = &p.kernels[1], *m32 = &p.kernels[2],
                       *m64 = &p.kernels[3], *m128 = &p.kernels[4], *dq = &p.kernels[5],
                       *dkv = &p.kernels[6], *sum = &p.kernels[7];
  ck_assert_str_eq(f->name, "ag_pma_d128_bf16_bq_fwd");
  ck_assert_str_eq(fs->name, "ag_pma_d128_bf16_bq_fwd_m32");
  ck_assert_str_eq(m32->name, "ag_pma_d128_bf16_bq_bwd_m32");
  ck_assert_str_eq(m64->name, "ag_pma_d128_bf16_bq_bwd_m64");
  ck_assert_str_eq(m128->name, "ag_pma_d128_bf16_bq_bwd_m128");
  ck_assert_str_eq(dq->name, "ag_pma_d128_bf16_bq_bwd_dq");
  ck_assert_str_eq(dkv->name, "ag_pma_d128_bf16_bq_bwd_dkv");
  ck_assert_str_eq(sum->name, "ag_pma_d128_bf16_bq_bwd_dq_sum");
  ck_assert_str_eq(m64->template_file, "broadcast_bwd.cu");
  ck_assert_ptr_null(sum->template_file); /* defined by jagged_bwd.cu */
  ck_assert_int_eq(f->walk.kind, AG_WALK_BROADCAST_Q);
  ck_assert_int_eq(fs->walk.rows, 32);
  ck_assert_int_eq(m64->walk.kind, AG_WALK_BROADCAST_SLABS);
  /* 32 rows: 2 row groups, each computed by 2 warps that split its keys */
  ck_assert_int_eq(m32->walk.rows, 32);
  ck_assert_int_eq(m32->threads, 128);
  ck_assert_int_eq(m32->smem_bytes, 4 * 128 * (32 + 2 * 64) + 4 * 32 * 64 + 8 * 32);
  ck_assert_int_eq(m32->min_ctas_per_sm, 2);
  /* at head_dim 64, 8 warps: each row group's keys in quarters */
  char y64[512];
  yaml_for(y64, sizeof y64, 64, AG_DTYPE_BF16, false, "", true);
  ag_spec s64 = load_ok(y64);
  ag_plan p64;
  ck_assert_int_eq(ag_plan_make(&s64, &p64, &err), AG_OK);
  ck_assert_str_eq(p64.kernels[2].name, "ag_pma_d64_bf16_bq_bwd_m32");
  ck_assert_int_eq(p64.kernels[2].threads, 256);
  ck_assert_int_eq(m128->walk.rows, 128);
  ck_assert_int_eq(dq->walk.kind, AG_WALK_BROADCAST_SLABS);
  ck_assert_int_eq(dkv->walk.kind, AG_WALK_JAGGED_K);
  ck_assert_int_eq(sum->walk.kind, AG_WALK_BROADCAST_SUM);
  ck_assert_int_eq(sum->walk.rows, 4 * sum->threads / 128);
  ck_assert_int_eq(sum->nparams, dq->nparams);
  ck_assert_int_le(m128->smem_bytes, 227 * 1024);
  /* The variants, picked by the run's sizes; the sum runs with each. */
  ck_assert_int_eq(f->variant, AG_VARIANT_FWD_LARGE);
  ck_assert_int_eq(fs->variant, AG_VARIANT_FWD_SMALL);
  ck_assert_int_eq(sum->variant, 0);
  ck_assert_int_eq(dq->variant, dkv->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_FORWARD, 1, 4, 4), fs->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_FORWARD, 64, 4, 4), fs->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_FORWARD, 65, 4, 4), f->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 1, 4, 4), m32->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 32, 4, 4), m32->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 33, 4, 4), m64->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 64, 4, 4), m64->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 65, 4, 4), m128->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 128, 4, 4), m128->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 129, 4, 4), dq->variant);
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 32, 4, 2), dq->variant); /* GQA */
  ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 0, 4, 4), dq->variant); /* dK = 0 */
  /* The per-sequence pattern has no variants. */
  ag_plan pj;
  ag_spec sj = s;
  sj.query = AG_QUERY_PER_SEQUENCE;
  ck_assert_int_eq(ag_plan_make(&sj, &pj, &err), AG_OK);
  ck_assert_int_eq(pj.nkernels, 3);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(pj.kernels[i].variant, 0);
  ck_assert_int_eq(ag_plan_variant(&pj, AG_PASS_BACKWARD, 32, 4, 4), 0);
  /* The per-sequence jagged spec emits no sum kernel and reads its Q per
   * sequence: the broadcast constant is 0 there, 1 here. */
  char *src = NULL;
  ck_assert_int_eq(ag_emit(&s, &src, NULL, &err), AG_OK);
  ck_assert_ptr_nonnull(strstr(src, "constexpr bool kBroadcast = 1;"));
  ck_assert_ptr_nonnull(strstr(src, "ag_pma_d128_bf16_bq_bwd_dq_sum("));
  char *again = NULL;
  ck_assert_int_eq(ag_emit(&s, &again, NULL, &err), AG_OK);
  ck_assert_str_eq(src, again); /* deterministic */
  free(again);
  free(src);
  s.query = AG_QUERY_PER_SEQUENCE;
  ck_assert_int_eq(ag_emit(&s, &src, NULL, &err), AG_OK);
  ck_assert_ptr_null(strstr(src, "_dq_sum("));
  ck_assert_ptr_null(strstr(src, "kBroadcast = 1"));
  free(src);
  /* sm_90a: runs of n_q > 64 take the warp-specialized forward (128 rows,
   * a loading warpgroup), n_q <= 64 the 32-row mma.sync tiles with their
   * own 64-key tiles and two stages, at both head dims */
  for (int d = 0; d < 2; d++) {
    ag_spec s9 = bf16_spec(d ? 64 : 128, "arch: sm_90a\n", true);
    ag_plan p9;
    ck_assert_int_eq(ag_plan_make(&s9, &p9, &err), AG_OK);
    const ag_plan_kernel *big = &p9.kernels[0], *small = &p9.kernels[1];
    ck_assert_int_eq(p9.jagged.fwd_ws, ag_plan_jagged_checked().sm90_ws_broadcast);
    if (!p9.jagged.fwd_ws) continue;
    ck_assert_str_eq(big->template_file, "jagged_fwd_ws.cu");
    ck_assert_int_eq(big->threads, 384);
    ck_assert_int_eq(big->walk.rows, 128);
    ck_assert_int_eq(big->variant, AG_VARIANT_FWD_LARGE);
    ck_assert_str_eq(small->template_file, "jagged_fwd.cu");
    ck_assert_int_eq(small->walk.rows, 32);
    ck_assert_int_eq(small->smem_bytes, (32 + 2 * 2 * 64) * (d ? 64 : 128) * 2);
    ck_assert_int_eq(small->min_ctas_per_sm, d ? 4 : 3);
    ck_assert_int_eq(ag_plan_variant(&p9, AG_PASS_FORWARD, 65, 4, 4), big->variant);
    ck_assert_int_eq(p9.jagged.fwd_stages, (ag_plan_jagged_checked().sm90_bq_fwd_deep && d ? 6 : 3));
  }
}
END_TEST

/* The plan choice .sm90_bq_fwd_deep (off until a GPU has run it): the
 * head-dim-64 broadcast warp-specialized forward with six K, V stages of
 * 128 keys, within the SM's shared memory, its constants emitted, compiled
 * by NVRTC without spills; head dim 128 keeps three (six would not fit). */
START_TEST(deep_forward) {
  char *dir = ag_test_dump_begin("attngen-bqdeep");
  for (int d = 0; d < 2; d++) {
    const int dim = d ? 64 : 128, stages = d ? 6 : 3;
    ag_spec s = bf16_spec(dim, "arch: sm_90a\n", true);
    ag_plan_jagged_choices c = ag_plan_jagged_checked();
    c.sm90_bq_fwd_deep = true;
    ag_plan p;
    plan_with(&s, c, &p);
    const ag_plan_kernel *big = &p.kernels[0];
    ck_assert_str_eq(big->template_file, "jagged_fwd_ws.cu");
    ck_assert_int_eq(p.jagged.fwd_stages, stages);
    ck_assert_int_eq(big->smem_bytes, (128 * p.jagged.fwd_q_tiles + 2 * stages * 128) * dim * 2);
    ck_assert_int_le(big->smem_bytes + 8 * (1 + 2 * stages), AG_SMEM_MAX_SM90); /* + mbarriers */
    char *src = NULL;
    ag_error err = {0};
    ck_assert_msg(ag_emit_plan(&s, &p, &src, &err) == AG_OK, "%s", err.message);
    char want[64];
    snprintf(want, sizeof want, "constexpr int kStages = %d;", stages);
    ck_assert_ptr_nonnull(strstr(src, want));
    no_spills(src, big->name, big->name, dir, "");
    free(src);
  }
  ag_test_dump_end(dir);
}
END_TEST

/* The plan choice .bq_fwd_heads_inner (on since session 38): the
 * broadcast warp-specialized forward's walk folds the heads into x, the
 * kernel takes its head and item from blockIdx.x, the grid is (CTAs *
 * heads, 1), and it compiles without spills at both head dims. Off: the
 * grid keeps (CTAs, heads). */
START_TEST(heads_inner_forward) {
  char *dir = ag_test_dump_begin("attngen-bqheads");
  for (int d = 0; d < 2; d++)
    for (int on = 0; on <= 1; on++) {
      const int dim = d ? 64 : 128;
      ag_spec s = bf16_spec(dim, "arch: sm_90a\n", false);
      ag_plan_jagged_choices c = ag_plan_jagged_checked();
      c.bq_fwd_heads_inner = on;
      ag_plan p;
      plan_with(&s, c, &p);
      const ag_plan_kernel *big = &p.kernels[0];
      ck_assert_str_eq(big->template_file, "jagged_fwd_ws.cu");
      ck_assert_int_eq(big->walk.heads_inner, on);
      for (int i = 1; i < p.nkernels; i++) ck_assert(!p.kernels[i].walk.heads_inner);
      /* n_q 200 over 10 sequences: 2 query tiles each, 4 heads */
      ag_launch la = {.batch = 10, .heads = 4, .kv_heads = 4, .total_q = 2000, .total_k = 9000};
      unsigned grid[3];
      int64_t items = 0;
      ag_error err = {0};
      ck_assert_int_eq(ag_walk_jagged_grid(&big->walk, &la, 132, 1, grid, &items, &err), AG_OK);
      const unsigned ctas = (20 + big->walk.items_per_cta - 1) / big->walk.items_per_cta;
      ck_assert_uint_eq(grid[0], on ? ctas * 4 : ctas);
      ck_assert_uint_eq(grid[1], on ? 1 : 4);
      ck_assert_int_eq(items, 20);
      if (on) { /* 2^21 query tiles by 4,096 heads: past 2^31 - 1 CTAs once folded
                 * (at 4 tiles a CTA with .bq_fwd_items: 2^19 CTAs of x, the
                 * message's count) */
        ag_launch big_la = {.batch = 1 << 20, .heads = 4096, .kv_heads = 4096,
                            .total_q = 200ll << 20, .total_k = 9000};
        ck_assert_int_eq(ag_walk_jagged_grid(&big->walk, &big_la, 132, 1, grid, &items, &err),
                         AG_ERR_INVALID_ARGUMENT);
        char want[96];
        snprintf(want, sizeof want, "%d query tiles by 4096 heads (a CTA each, heads inner)",
                 (2097152 + big->walk.items_per_cta - 1) / big->walk.items_per_cta);
        ck_assert_msg(strstr(err.message, want) != NULL, "%s", err.message);
        ag_error_clear(&err);
      }
      char *src = NULL;
      ck_assert_msg(ag_emit_plan(&s, &p, &src, &err) == AG_OK, "%s", err.message);
      ck_assert_int_eq(strstr(src, "const int h = (int)(blockIdx.x % (unsigned)heads);") != NULL, on);
      ck_assert_int_eq(strstr(src, "item0 = (long long)(blockIdx.x / (unsigned)heads) * kItems;") != NULL,
                       on);
      if (on) no_spills(src, big->name, big->name, dir, "");
      free(src);
    }
  ag_test_dump_end(dir);
}
END_TEST

/* The plan choice .bq_fwd_items (off): the broadcast warp-specialized
 * forward at head dim 64 computes .fwd_items query tiles a CTA (two Q
 * slots), its grid folding the heads in as before: ceil(tiles / items) *
 * heads CTAs, each taking its head from blockIdx.x and its first tile from
 * the rest; it compiles without spills. Head dim 128 (.fwd_items 1) keeps
 * one tile a CTA. */
START_TEST(items_forward) {
  char *dir = ag_test_dump_begin("attngen-bqitems");
  for (int d = 0; d < 2; d++) {
    const int dim = d ? 128 : 64;
    ag_spec s = bf16_spec(dim, "arch: sm_90a\n", false);
    ag_plan_jagged_choices c = ag_plan_jagged_checked();
    c.bq_fwd_items[0] = c.bq_fwd_items[1] = true;
    ag_plan p;
    plan_with(&s, c, &p);
    const ag_plan_kernel *big = &p.kernels[0];
    ck_assert_str_eq(big->template_file, "jagged_fwd_ws.cu");
    const int items = d ? 1 : c.fwd_items[0];
    ck_assert_int_eq(p.jagged.fwd_items, items);
    ck_assert_int_eq(big->walk.items_per_cta, items);
    ck_assert_int_eq(big->walk.heads_inner, c.bq_fwd_heads_inner);
    if (d) continue;
    ck_assert_int_gt(items, 1);
    ck_assert_int_eq(p.jagged.fwd_q_tiles, c.fwd_q_tiles[0]);
    /* n_q 200 over 10 sequences: 20 query tiles, 4 heads */
    ag_launch la = {.batch = 10, .heads = 4, .kv_heads = 4, .total_q = 2000, .total_k = 9000};
    unsigned grid[3];
    int64_t n = 0;
    ag_error err = {0};
    ck_assert_int_eq(ag_walk_jagged_grid(&big->walk, &la, 132, 1, grid, &n, &err), AG_OK);
    const unsigned ctas = (20 + items - 1) / items;
    ck_assert_uint_eq(grid[0], c.bq_fwd_heads_inner ? ctas * 4 : ctas);
    ck_assert_int_eq(n, 20);
    char *src = NULL;
    ck_assert_msg(ag_emit_plan(&s, &p, &src, &err) == AG_OK, "%s", err.message);
    char want[64];
    snprintf(want, sizeof want, "constexpr int kItems = %d;", items);
    ck_assert_ptr_nonnull(strstr(src, want));
    no_spills(src, big->name, big->name, dir, "");
    free(src);
  }
  ag_test_dump_end(dir);
}
END_TEST

/* The plan choice .bq_fwd_ws_small (off): with the warp-specialized
 * broadcast forward planned (sm_90a), every n_q takes it (one forward
 * kernel, launched for any n_q); without it (sm_80) the 32-row variant
 * stays. */
START_TEST(ws_small_forward) {
  for (int d = 0; d < 2; d++) {
    const int dim = d ? 64 : 128;
    ag_spec s = bf16_spec(dim, "arch: sm_90a\n", false);
    ag_plan_jagged_choices c = ag_plan_jagged_checked();
    ag_plan p;
    plan_with(&s, c, &p);
    ck_assert_int_eq(p.nkernels, 2); /* the 128-row forward and the 32-row one */
    c.bq_fwd_ws_small = true;
    plan_with(&s, c, &p);
    ck_assert_int_eq(p.nkernels, 1);
    ck_assert_str_eq(p.kernels[0].template_file, "jagged_fwd_ws.cu");
    ck_assert_int_eq(p.kernels[0].variant, 0);
    for (int nq = 1; nq <= 200; nq = nq * 2 + 1)
      ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_FORWARD, nq, 4, 4), 0);
    char *src = NULL;
    ag_error err = {0};
    ck_assert_msg(ag_emit_plan(&s, &p, &src, &err) == AG_OK, "%s", err.message);
    ck_assert_ptr_null(strstr(src, "_bq_fwd_m32"));
    ck_assert_ptr_nonnull(strstr(src, p.kernels[0].name));
    free(src);
    /* sm_80: no warp-specialized forward, the 32-row variant kept */
    ag_spec s8 = bf16_spec(dim, "arch: sm_80\n", false);
    plan_with(&s8, c, &p);
    ck_assert_int_eq(p.nkernels, 2);
    ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_FORWARD, 32, 4, 4), AG_VARIANT_FWD_SMALL);
  }
}
END_TEST

/* `s` compiles with NVRTC for sm_90a and sm_80, each cubin holding every
 * kernel of the spec's plan for that arch (an arch-less spec is planned
 * per arch: sm_90a's has no 32-row one-pass backward). */
static void compiles_for_both_archs(const ag_spec *s) {
  const char *archs[] = {"sm_90a", "sm_80"};
  for (int a = 0; a < 2; a++) {
    void *cubin = NULL;
    size_t size = 0;
    ag_error err = {0};
    ag_status st = ag_compile(s, archs[a], &cubin, &size, &err);
    ck_assert_msg(st == AG_OK, "%s: %s", archs[a], err.message);
    ag_spec r;
    ag_plan p;
    ck_assert_int_eq(ag_spec_for_arch(s, archs[a], &r, &err), AG_OK);
    ck_assert_int_eq(ag_plan_make(&r, &p, &err), AG_OK);
    for (int k = 0; k < p.nkernels; k++)
      ck_assert_msg(memmem(cubin, size, p.kernels[k].name, strlen(p.kernels[k].name) + 1),
                    "no %s in the %s cubin", p.kernels[k].name, archs[a]);
    free(cubin);
  }
}

START_TEST(compiles) {
  char y[512];
  const char *extra[] = {"", "window: [100, 0]\n"};
  for (int i = 0; i < 2; i++) {
    yaml_for(y, sizeof y, i ? 64 : 128, i ? AG_DTYPE_FP16 : AG_DTYPE_BF16, i == 1, extra[i],
             true);
    ag_spec s = load_ok(y);
    ag_plan p;
    ag_error err = {0};
    ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
    compiles_for_both_archs(&s);
  }
}
END_TEST

/* Rotary embeddings: the mma.sync forwards (128- and 32-row tiles), the
 * one-pass mma.sync backwards where a warp holds both halves of each pair
 * (interleaved: every variant, the 128-row one on mma.sync too; half:
 * those of 4 warps, which hold every column), the split backward for the
 * rest, whose _dq_sum rotates the summed dQ back; the kernels take both
 * tables with positions from tables, compile for sm_90a and sm_80 in both
 * layouts, and the one-pass ones spill nothing. */
static const char *const rotary_extra[] = {
    "rotary:\n  layout: interleaved\n  apply_to: [q, k]\n  positions: table\n",
    "rotary:\n  layout: half\n  apply_to: [q, k, v]\n  positions: sequence\n  base: 10000\n",
};

START_TEST(rotary_plan) {
  for (int i = 0; i < 2; i++) {
    ag_spec s = bf16_spec(i ? 64 : 128, rotary_extra[i], true);
    ag_plan p;
    ag_error err = {0};
    ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
    const int fused = i ? 1 : 3; /* half at head dim 64: the 64-row kernel's 4 warps alone */
    ck_assert_int_eq(p.nkernels, 5 + fused);
    ck_assert_int_eq(p.takes_table, i == 0);
    ck_assert_str_eq(p.kernels[0].template_file, "jagged_fwd.cu");
    ck_assert_str_eq(p.kernels[1].template_file, "jagged_fwd.cu");
    ck_assert_int_eq(p.kernels[1].walk.rows, 32);
    for (int j = 0; j < fused; j++) {
      ck_assert_str_eq(p.kernels[2 + j].template_file, "broadcast_bwd.cu");
      ck_assert(!p.jagged.fused_sm90[j]);
    }
    ck_assert_int_eq(p.jagged.fused_block_m[0], i ? 64 : 32);
    if (fused < AG_FUSED_VARIANTS) ck_assert_int_eq(p.jagged.fused_block_m[fused], 0);
    ck_assert_str_eq(p.kernels[2 + fused].template_file, "jagged_bwd.cu");
    ck_assert_int_eq(p.kernels[2 + fused].walk.kind, AG_WALK_BROADCAST_SLABS);
    ck_assert_int_eq(p.kernels[4 + fused].walk.kind, AG_WALK_BROADCAST_SUM);
    const int64_t nqs[] = {1, 32, 64, 128, 200};
    const int want[2][5] = {{0, 0, 1, 2, -1}, {0, 0, 0, -1, -1}}; /* fused variant, -1 split */
    for (int j = 0; j < 5; j++)
      ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, nqs[j], 4, 4),
                       want[i][j] < 0 ? AG_VARIANT_BWD_SPLIT : AG_VARIANT_BWD_FUSED_0 + want[i][j]);
    /* grouped heads: the split kernels */
    ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 32, 4, 2), AG_VARIANT_BWD_SPLIT);
  }
}
END_TEST

START_TEST(rotary_compiles) {
  char *dir = ag_test_dump_begin("broadcast-rotary");
  /* interleaved at both head dims (at 64 the 32- and 128-row kernels' 8
   * warps split dK's columns; the 128-row one a CTA an SM), half at 64 */
  for (int c = 0; c < 3; c++) {
    const int i = c % 2;
    ag_spec s = bf16_spec(c ? 64 : 128, rotary_extra[i], true);
    ag_plan p;
    ag_error err = {0};
    ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
    if (c == 2) ck_assert_int_eq(p.jagged.fused_min_ctas[2], 1); /* the 128-row kernel */
    char *src = NULL;
    ck_assert_int_eq(ag_emit(&s, &src, NULL, &err), AG_OK);
    /* the query rows' angles: row i's, in every sequence */
    ck_assert_ptr_nonnull(
        strstr(src, i ? "kBroadcast ? m0 : m0 + shift" : "(kBroadcast ? 0 : jt.start) + m0"));
    ck_assert_ptr_nonnull(strstr(src, "dQ row i: position i, table row i"));
    for (int k = 0; k < p.nkernels; k++)
      if (p.kernels[k].template_file && !strcmp(p.kernels[k].template_file, "broadcast_bwd.cu"))
        no_spills(src, p.kernels[0].name, p.kernels[k].name, dir, " (rotary)");
    free(src);
    compiles_for_both_archs(&s);
  }
  ag_test_dump_end(dir);
}
END_TEST

/* The 32-row one-pass backward with the other warp and stage counts the
 * plan may choose (tools/next_gpu_call_broadcast.sh times them): the plan's
 * shared memory and CTAs an SM, the kernel's ring, and ptxas's report for
 * sm_90a: no spills. */
START_TEST(m32_choices) {
  static const struct { int dim, warps, stages, min_ctas; } cases[] = {
      {128, 8, 4, 1}, {128, 8, 3, 1}, {64, 8, 4, 2}, {64, 8, 3, 2}};
  char *dir = ag_test_dump_begin("attngen-bq");
  for (int i = 0; i < 4; i++) {
    char y[512];
    yaml_for(y, sizeof y, cases[i].dim, AG_DTYPE_BF16, false, "", true);
    ag_spec s = load_ok(y);
    ag_plan_jagged_choices c = ag_plan_jagged_checked();
    const int d = cases[i].dim == 128;
    c.bq_m32_warps[d] = cases[i].warps;
    c.bq_m32_stages[d] = cases[i].stages;
    ag_plan p;
    plan_with(&s, c, &p);
    const ag_plan_kernel *m32 = &p.kernels[2];
    ck_assert_int_eq(m32->walk.rows, 32);
    ck_assert_int_eq(m32->threads, 32 * cases[i].warps);
    ck_assert_int_eq(m32->smem_bytes, 4 * cases[i].dim * (32 + cases[i].stages * 64) +
                                          4 * 32 * 64 + 8 * 32);
    ck_assert_int_eq(m32->min_ctas_per_sm, cases[i].min_ctas);
    ck_assert_int_eq(p.kernels[3].smem_bytes,
                     4 * cases[i].dim * (64 + 2 * 64) + 4 * 64 * 64 + 8 * 64);
    char *src = NULL;
    ag_error err = {0};
    ck_assert_msg(ag_emit_plan(&s, &p, &src, &err) == AG_OK, "%s", err.message);
    char want[64];
    snprintf(want, sizeof want, "constexpr int kStages = %d;", cases[i].stages);
    ck_assert_ptr_nonnull(strstr(src, want));
    char what[64];
    snprintf(what, sizeof what, " (%d warps, %d stages)", cases[i].warps, cases[i].stages);
    no_spills(src, p.kernels[0].name, m32->name, dir, what);
    free(src);
  }
  ag_test_dump_end(dir);
}
END_TEST

/* sm_90a: 64 < n_q <= 128 takes the warp-specialized wgmma backward
 * (broadcast_bwd_sm90.cu): 12 warps, the K, V slots beside two P, dS
 * slots, one CTA an SM, its constants emitted in its own namespace and
 * compiled by NVRTC; without the plan's choice, or on sm_80, the mma.sync
 * one-pass kernel. */
START_TEST(sm90_backward) {
  char *dir = ag_test_dump_begin("attngen-bq90");
  for (int d = 0; d < 2; d++) {
    const int dim = d ? 64 : 128, stages = d ? 4 : 3;
    ag_spec s = bf16_spec(dim, "arch: sm_90a\n", true);
    ag_plan_jagged_choices c = ag_plan_jagged_checked();
    ck_assert(c.sm90_bq_bwd);
    c.bq_sm90_keys = false; /* the 32- and 64-row mma.sync kernels beside it (keys_backward) */
    ag_plan p;
    plan_with(&s, c, &p);
    const ag_plan_kernel *m64 = &p.kernels[3], *m128 = &p.kernels[4];
    ck_assert_int_eq(m128->walk.rows, 128);
    ck_assert_str_eq(m128->template_file, "broadcast_bwd_sm90.cu");
    ck_assert_str_eq(m64->template_file, "broadcast_bwd.cu");
    ck_assert_int_eq(m128->threads, 384);
    ck_assert_int_eq(m128->smem_bytes, 4 * dim * (128 + stages * 64) + 8 * 128 * 64 + 8 * 128);
    ck_assert_int_le(m128->smem_bytes + 8 * (4 + 2 * stages), 227 * 1024); /* + its mbarriers */
    ck_assert_int_eq(m128->min_ctas_per_sm, 1);
    char *src = NULL;
    ag_error err = {0};
    ck_assert_msg(ag_emit_plan(&s, &p, &src, &err) == AG_OK, "%s", err.message);
    const char *ns = strstr(src, "namespace bwd_fused_2 {");
    ck_assert_ptr_nonnull(ns);
    char want[64];
    snprintf(want, sizeof want, "constexpr int kStages = %d;", stages);
    ck_assert_ptr_nonnull(strstr(ns, want));
    ck_assert_ptr_nonnull(strstr(ns, "constexpr int kWarps = 12;"));
    /* head dim 128's dQ is one 64x128 product a k-step */
    ck_assert(!strstr(ns, "wgmma_rs_n128_mn(dq") == (dim == 64));
    /* measured with CUDA 13.0: none at either head dim (36 bytes at 64
     * before the loads went through copy_rows.cuh) */
    no_spills(src, p.kernels[0].name, m128->name, dir, "");
    free(src);
    /* with .bq_sm90_small every n_q <= 128 takes it: no 32- or 64-row
     * kernel (the split backward still for n_q 0, past 128 and GQA) */
    ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 32, 4, 4), m128->variant - 2);
    ag_plan_jagged_choices small = c;
    small.bq_sm90_small = true;
    ag_plan ps;
    plan_with(&s, small, &ps);
    ck_assert_int_eq(ps.nkernels, p.nkernels - 2);
    const ag_plan_kernel *only = &ps.kernels[2];
    ck_assert_str_eq(only->name, m128->name);
    ck_assert_str_eq(only->template_file, "broadcast_bwd_sm90.cu");
    for (int nq = 1; nq <= 128; nq += nq < 40 ? 31 : 63)
      ck_assert_int_eq(ag_plan_variant(&ps, AG_PASS_BACKWARD, nq, 4, 4), only->variant);
    ck_assert_int_ne(ag_plan_variant(&ps, AG_PASS_BACKWARD, 129, 4, 4), only->variant);
    ck_assert_int_ne(ag_plan_variant(&ps, AG_PASS_BACKWARD, 0, 4, 4), only->variant);
    ck_assert_int_ne(ag_plan_variant(&ps, AG_PASS_BACKWARD, 32, 4, 2), only->variant);
    /* without the choice: the mma.sync kernel, 8 warps */
    c.sm90_bq_bwd = false;
    plan_with(&s, c, &p);
    ck_assert_str_eq(p.kernels[4].template_file, "broadcast_bwd.cu");
    ck_assert_int_eq(p.kernels[4].threads, 256);
    /* sm_80: the same */
    ag_spec s8 = bf16_spec(dim, "arch: sm_80\n", true);
    ck_assert_int_eq(ag_plan_make(&s8, &p, &err), AG_OK);
    ck_assert_str_eq(p.kernels[4].template_file, "broadcast_bwd.cu");
  }
  ag_test_dump_end(dir);
}
END_TEST

/* The plan choice .bq_sm90_keys (off: correct on an H100 in session 43 but
 * 13-19% slower than the mma.sync kernels): n_q <= 64 on the
 * key-stationary wgmma kernel (templates/broadcast_bwd_keys.cu), 128-key
 * tiles, a loading warpgroup and two computing ones, one CTA an SM; no
 * 32-row variant. Planned only on sm_90a without rotary
 * embeddings; compiles without spills at both head dims, causal too. */
START_TEST(keys_backward) {
  char *dir = ag_test_dump_begin("attngen-bqkeys");
  for (int d = 0; d < 2; d++)
    for (int causal = 0; causal <= 1; causal++) {
      const int dim = d ? 64 : 128, stages = d ? 3 : 2;
      char y[512];
      yaml_for(y, sizeof y, dim, AG_DTYPE_BF16, causal, "arch: sm_90a\n", true);
      ag_spec s = load_ok(y);
      ag_plan_jagged_choices c = ag_plan_jagged_checked();
      ck_assert(!c.bq_sm90_keys);
      ag_plan off, p;
      plan_with(&s, c, &off);
      c.bq_sm90_keys = true;
      plan_with(&s, c, &p);
      ck_assert_int_eq(p.nkernels, off.nkernels - 1); /* no 32-row variant */
      const ag_plan_kernel *keys = &p.kernels[2], *m128 = &p.kernels[3];
      ck_assert_str_eq(keys->template_file, "broadcast_bwd_keys.cu");
      ck_assert_int_eq(keys->walk.rows, 64);
      ck_assert_int_eq(keys->threads, 384);
      ck_assert_int_eq(keys->min_ctas_per_sm, 1);
      /* Q and two dO slots, the K, V slots of 128 keys, two dS^T, two
       * floats a row a dO slot */
      ck_assert_int_eq(keys->smem_bytes,
                       2 * dim * 64 * 3 + 4 * dim * 128 * stages + 4 * 128 * 64 + 8 * 2 * 64);
      ck_assert_int_le(keys->smem_bytes + 1024, 227 * 1024);
      ck_assert_str_eq(m128->template_file, "broadcast_bwd_sm90.cu");
      for (int nq = 1; nq <= 64; nq += nq < 32 ? 31 : 32)
        ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, nq, 4, 4), keys->variant);
      ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 65, 4, 4), m128->variant);
      ck_assert_int_ne(ag_plan_variant(&p, AG_PASS_BACKWARD, 32, 4, 2), keys->variant);
      char *src = NULL;
      ag_error err = {0};
      ck_assert_msg(ag_emit_plan(&s, &p, &src, &err) == AG_OK, "%s", err.message);
      /* the first one-pass variant now (no 32-row one before it) */
      const char *ns = strstr(src, "namespace bwd_fused_0 {");
      ck_assert_ptr_nonnull(ns);
      ck_assert_ptr_nonnull(strstr(ns, "constexpr int kBlockN = 128;"));
      char want[64];
      snprintf(want, sizeof want, "constexpr int kStages = %d;", stages);
      ck_assert_ptr_nonnull(strstr(ns, want));
      /* head dim 128's dV and dK: one 64x128 product a k-step */
      ck_assert(!strstr(ns, "wgmma_rs_n128_mn(acc, a") == (dim == 64));
      /* measured with CUDA 13.0: none (the loading warpgroup spilled at 88
       * registers) */
      no_spills(src, p.kernels[0].name, keys->name, dir, "");
      free(src);
      /* rotary embeddings, or sm_80: the mma.sync kernels */
      ag_spec r = bf16_spec(dim, "arch: sm_90a\nrotary:\n  layout: interleaved\n", true);
      plan_with(&r, c, &p);
      for (int i = 0; i < p.nkernels; i++)
        ck_assert(!p.kernels[i].template_file ||
                  strcmp(p.kernels[i].template_file, "broadcast_bwd_keys.cu") != 0);
      ag_spec s8 = bf16_spec(dim, "arch: sm_80\n", true);
      plan_with(&s8, c, &p);
      for (int i = 0; i < p.nkernels; i++)
        ck_assert(!p.kernels[i].template_file ||
                  strcmp(p.kernels[i].template_file, "broadcast_bwd_keys.cu") != 0);
    }
  ag_test_dump_end(dir);
}
END_TEST

/* The plan choice .bq_fwd_sm90_rotary (off until it has run on a GPU): the
 * broadcast rotary forward at head dim 128 on sm_90a takes the wgmma
 * kernel (jagged_fwd_sm90.cu: two warpgroups of 64 rows, 128-key tiles,
 * three stages, one CTA an SM) for n_q > 64, the 32-row mma.sync variant
 * below; without the choice, at head dim 64, on sm_80 or without rotary,
 * nothing changes. Its kernel rotates each broadcast query row i by table
 * row i; it compiles without spills, causal too. */
START_TEST(sm90_rotary_forward) {
  char *dir = ag_test_dump_begin("attngen-bqfwdrope");
  for (int causal = 0; causal <= 1; causal++) {
    char y[512];
    yaml_for(y, sizeof y, 128, AG_DTYPE_BF16, causal,
             "arch: sm_90a\nrotary:\n  layout: interleaved\n  apply_to: [q, k]\n"
             "  positions: table\n",
             false);
    ag_spec s = load_ok(y);
    ag_plan_jagged_choices c = ag_plan_jagged_checked();
    ck_assert(!c.bq_fwd_sm90_rotary);
    ag_plan off, p;
    plan_with(&s, c, &off);
    c.bq_fwd_sm90_rotary = true;
    plan_with(&s, c, &p);
    ck_assert_int_eq(p.nkernels, 2);
    ck_assert_int_eq(off.nkernels, 2);
    ck_assert_str_eq(off.kernels[0].template_file, "jagged_fwd.cu");
    ck_assert_str_eq(p.kernels[0].template_file, "jagged_fwd_sm90.cu");
    ck_assert_int_eq(p.kernels[0].threads, 256);
    ck_assert_int_eq(p.kernels[0].smem_bytes, (128 + 2 * 3 * 128) * 128 * 2);
    ck_assert_int_eq(p.kernels[0].walk.rows, 128);
    /* n_q <= 64: the 32-row mma.sync variant, as without the choice */
    ck_assert_str_eq(p.kernels[1].template_file, "jagged_fwd.cu");
    ck_assert_int_eq(p.kernels[1].walk.rows, 32);
    ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_FORWARD, 64, 4, 4), p.kernels[1].variant);
    ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_FORWARD, 65, 4, 4), p.kernels[0].variant);
    char *src = NULL;
    ag_error err = {0};
    ck_assert_msg(ag_emit_plan(&s, &p, &src, &err) == AG_OK, "%s", err.message);
    ck_assert_ptr_nonnull(strstr(src, "rotary_table + ((kBroadcast ? 0 : jt.start) + span.m0)"));
    /* measured with CUDA 13.0: none (the 128-row mma.sync forward spills
     * 84 bytes at head dim 128) */
    no_spills(src, p.kernels[0].name, p.kernels[0].name, dir, causal ? " (causal)" : "");
    free(src);
    /* head dim 64, sm_80, no rotary: as without the choice */
    const char *others[] = {"arch: sm_90a\nrotary:\n  layout: interleaved\n",
                            "arch: sm_80\nrotary:\n  layout: interleaved\n", "arch: sm_90a\n"};
    for (int o = 0; o < 3; o++) {
      ag_spec r = o == 0 ? bf16_spec(64, others[o], false) : bf16_spec(128, others[o], false);
      plan_with(&r, c, &p);
      for (int i = 0; i < p.nkernels; i++)
        ck_assert(!p.kernels[i].template_file ||
                  strcmp(p.kernels[i].template_file, "jagged_fwd_sm90.cu") != 0);
    }
  }
  ag_test_dump_end(dir);
}
END_TEST

/* The plan choice .bq_sm90_rotary (off until it has run on a GPU): the
 * broadcast backward with rotary embeddings for 64 < n_q <= 128 on the
 * wgmma kernel (broadcast_bwd_sm90.cu): the copying threads rotate their
 * own pieces of Q and of each K (V) tile, the key warpgroup dK (dV) back.
 * Where a 64-column part of dK holds each pair: interleaved at both head
 * dims, half at 64; the half layout at 128 keeps its kernels. The same
 * shared memory as without rotary; no spills (non-causal: the causal
 * kernel spills without rotary too, 360 bytes with CUDA 13.0). */
START_TEST(sm90_rotary_backward) {
  static const struct {
    int dim;
    const char *extra;
    bool sm90;
  } cases[] = {
      {128, "rotary:\n  layout: interleaved\n  apply_to: [q, k]\n  positions: table\n", true},
      {128, "rotary:\n  layout: interleaved\n  apply_to: [q, k]\n  positions: sequence\n", true},
      {64, "rotary:\n  layout: interleaved\n  apply_to: [q, k]\n  positions: table\n", true},
      {64, "rotary:\n  layout: half\n  apply_to: [q, k]\n  positions: table\n", true},
      {64, "rotary:\n  layout: half\n  apply_to: [q, k, v]\n  positions: sequence\n", true},
      {64, "rotary:\n  layout: half\n  apply_to: [q]\n  positions: sequence\n", true},
      {128, "rotary:\n  layout: interleaved\n  apply_to: [k, v]\n  positions: table\n", true},
      {128, "rotary:\n  layout: half\n  apply_to: [q, k]\n  positions: table\n", false},
  };
  char *dir = ag_test_dump_begin("attngen-bq90rope");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char extra[256];
    snprintf(extra, sizeof extra, "arch: sm_90a\n%s", cases[i].extra);
    ag_spec s = bf16_spec(cases[i].dim, extra, true);
    ag_plan_jagged_choices c = ag_plan_jagged_checked();
    ck_assert(!c.bq_sm90_rotary);
    ag_plan off, p;
    plan_with(&s, c, &off);
    c.bq_sm90_rotary = true;
    plan_with(&s, c, &p);
    const ag_plan_kernel *m128 = NULL;
    for (int k = 0; k < off.nkernels; k++)
      ck_assert(!off.kernels[k].template_file ||
                strcmp(off.kernels[k].template_file, "broadcast_bwd_sm90.cu") != 0);
    for (int k = 0; k < p.nkernels; k++)
      if (p.kernels[k].template_file &&
          !strcmp(p.kernels[k].template_file, "broadcast_bwd_sm90.cu"))
        m128 = &p.kernels[k];
    ck_assert_msg((m128 != NULL) == cases[i].sm90, "case %zu", i);
    const int v128 = ag_plan_variant(&p, AG_PASS_BACKWARD, 128, 4, 4);
    if (!cases[i].sm90) {
      ck_assert_int_eq(p.nkernels, off.nkernels);
      ck_assert_int_eq(v128, ag_plan_variant(&off, AG_PASS_BACKWARD, 128, 4, 4));
      continue;
    }
    ck_assert_int_eq(m128->variant, v128);
    ck_assert_int_eq(ag_plan_variant(&p, AG_PASS_BACKWARD, 65, 4, 4), v128);
    ck_assert_int_ne(ag_plan_variant(&p, AG_PASS_BACKWARD, 64, 4, 4), v128);
    ck_assert_int_eq(m128->threads, 384);
    ck_assert_int_eq(m128->min_ctas_per_sm, 1);
    const int stages = cases[i].dim == 128 ? 3 : 4, dim = cases[i].dim;
    ck_assert_int_eq(m128->smem_bytes, 4 * dim * (128 + stages * 64) + 8 * 128 * 64 + 8 * 128);
    char *src = NULL;
    ag_error err = {0};
    ck_assert_msg(ag_emit_plan(&s, &p, &src, &err) == AG_OK, "%s", err.message);
    /* Q rotated once at the first slab where it is rotated (else loaded
     * lazily, as without rotary) */
    ck_assert_ptr_nonnull(strstr(src, "if (kRotateQ && !q_loaded) {"));
    ck_assert_ptr_nonnull(strstr(src, "unrotate_part(acc, hh, 16 * (warp & 3), nk,"));
    char what[32];
    snprintf(what, sizeof what, " (case %zu)", i);
    no_spills(src, p.kernels[0].name, m128->name, dir, what);
    free(src);
  }
  ag_test_dump_end(dir);
}
END_TEST

/* The plan choice .sm90_fwd_ws_rotary (off until it has run on a GPU):
 * rotary forwards on the warp-specialized kernel (jagged_fwd_ws.cu), whose
 * loading warpgroup rotates each landed tile; jagged at both head dims
 * (no 192-row tiles: two computing warpgroups) and broadcast for n_q > 64;
 * K, V by cp.async (no TMA roles); 80 registers a loading thread and 208 a
 * computing one; from tables, a slot for a tile's table rows (two K, V
 * stages at head dim 128); no spills, tables or computed positions, either
 * layout, q, k, v too. */
START_TEST(ws_rotary_forward) {
  static const char *const specs[] = {
      /* jagged, head dim 128, causal, half pairs from tables */
      "name: j\npattern: jagged\ncausal: true\nhead_dim: 128\ndtype: bf16\narch: sm_90a\n"
      "rotary:\n  layout: half\n  apply_to: [q, k]\n  positions: table\npasses: [forward]\n",
      /* jagged, head dim 64, interleaved on q, k, v from tables, fp16 */
      "name: j\npattern: jagged\nhead_dim: 64\ndtype: fp16\narch: sm_90a\n"
      "rotary:\n  layout: interleaved\n  apply_to: [q, k, v]\n  positions: table\n"
      "passes: [forward]\n",
      /* jagged, head dim 64, computed positions */
      "name: j\npattern: jagged\ncausal: true\nhead_dim: 64\ndtype: bf16\narch: sm_90a\n"
      "rotary:\n  layout: half\n  apply_to: [q, k]\n  positions: sequence\npasses: [forward]\n",
      /* broadcast, head dim 128 and 64 */
      "name: b\npattern: jagged\nquery: broadcast\nhead_dim: 128\ndtype: bf16\narch: sm_90a\n"
      "rotary:\n  layout: interleaved\n  apply_to: [q, k]\n  positions: table\n"
      "passes: [forward]\n",
      "name: b\npattern: jagged\nquery: broadcast\nhead_dim: 64\ndtype: bf16\narch: sm_90a\n"
      "rotary:\n  layout: half\n  apply_to: [q, k]\n  positions: table\npasses: [forward]\n",
  };
  char *dir = ag_test_dump_begin("attngen-wsrope");
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    ag_spec s = load_ok(specs[i]);
    ag_plan_jagged_choices c = ag_plan_jagged_checked();
    ck_assert(!c.sm90_fwd_ws_rotary);
    ag_plan off, p;
    plan_with(&s, c, &off);
    ck_assert_str_ne(off.kernels[0].template_file, "jagged_fwd_ws.cu");
    c.sm90_fwd_ws_rotary = true;
    plan_with(&s, c, &p);
    const ag_plan_kernel *k = &p.kernels[0];
    ck_assert_msg(strcmp(k->template_file, "jagged_fwd_ws.cu") == 0, "spec %zu: %s", i,
                  k->template_file);
    ck_assert_int_eq(k->threads, 384);
    ck_assert_int_eq(k->walk.rows, 128);
    ck_assert_int_eq(k->tma_rows, 0); /* K, V by cp.async */
    ck_assert(!p.jagged.fwd_tma);
    const bool table = s.rotary.positions == AG_POSITIONS_TABLE;
    ck_assert_int_eq(p.jagged.fwd_table_rows, table ? 128 : 0);
    if (table && s.head_dim == 128) ck_assert_int_eq(p.jagged.fwd_stages, 2);
    ck_assert_int_eq(k->smem_bytes, (p.jagged.fwd_q_tiles * 128 + p.jagged.fwd_table_rows +
                                     2 * p.jagged.fwd_stages * 128) *
                                        s.head_dim * 2);
    ck_assert_int_le(k->smem_bytes, 227 * 1024 - 1024);
    char *src = NULL;
    ag_error err = {0};
    ck_assert_msg(ag_emit_plan(&s, &p, &src, &err) == AG_OK, "%s", err.message);
    const char *ws = strstr(src, "rotate_landed(kRotateQ");
    ck_assert_ptr_nonnull(ws);
    ck_assert_ptr_nonnull(strstr(src, "constexpr bool kRotary = 1;"));
    /* measured with CUDA 13.0: none, with the loader's table rows one at a
     * time (half pairs) or two (interleaved) */
    char what[32];
    snprintf(what, sizeof what, " (spec %zu)", i);
    no_spills(src, p.kernels[0].name, k->name, dir, what);
    free(src);
  }
  ag_test_dump_end(dir);
}
END_TEST

/* ---- the launchers without a device ------------------------------------------------ */

typedef ag_fake_kernel fake;

static void fake_init(fake *f, int dim, bool backward, int ptrs) {
  char y[512];
  yaml_for(y, sizeof y, dim, AG_DTYPE_BF16, false, "", backward);
  ag_fake_jagged_kernel(f, y, ptrs);
}

#define P(x) ((void *)(uintptr_t)(x))

static ag_broadcast_fwd_args fwd_args(void) {
  ag_broadcast_fwd_args a = {.q = P(0x10000), .k = P(0x20000), .v = P(0x30000),
                             .o = P(0x40000), .lse = P(0x50000), .cu_seqlens_k = P(0x70000),
                             .batch = 3, .n_q = 200, .heads = 8, .kv_heads = 2,
                             .total_k = 500};
  return a;
}

static ag_broadcast_bwd_args bwd_args(void) {
  ag_broadcast_bwd_args a = {.q = P(0x10000), .k = P(0x20000), .v = P(0x30000),
                             .o = P(0x40000), .dout = P(0x50000), .lse = P(0x60000),
                             .dq = P(0x70000), .dk = P(0x80000), .dv = P(0x90000),
                             .workspace = P(0xa0000), .cu_seqlens_k = P(0xc0000), .batch = 3,
                             .n_q = 200, .heads = 8, .kv_heads = 2, .total_k = 500};
  return a;
}

START_TEST(launch_parameters) {
  fake f;
  fake_init(&f, 128, false, 7);
  ag_broadcast_fwd_args a = fwd_args();
  ag_error err = {0};
  ck_assert_msg(ag_broadcast_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  const ag_plan_kernel *k = &f.kernel.plan.kernels[0];
  ck_assert_int_eq(ag_fake_seen.count, 1);
  /* cu_seqlens_q is not read: it gets cu_seqlens_k */
  const void *order[7] = {a.q, a.k, a.v, a.o, a.lse, a.cu_seqlens_k, a.cu_seqlens_k};
  for (int i = 0; i < 7; i++) ck_assert_uint_eq(ag_fake_seen.ptr[i], (CUdeviceptr)(uintptr_t)order[i]);
  ck_assert_int_eq(ag_fake_seen.batch, 3);
  ck_assert_int_eq(ag_fake_seen.total, 3 * 200); /* total_q = batch * n_q */
  ck_assert_int_eq(ag_fake_seen.total_k, 500);
  const unsigned q_tiles = (200 + k->walk.rows - 1) / k->walk.rows;
  ck_assert_uint_eq(ag_fake_seen.grid, 3 * q_tiles);
  ck_assert_int_eq(ag_fake_seen.items, 3 * q_tiles);
  ck_assert_uint_eq(ag_fake_seen.grid_y, 8);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[0]);
  /* Few queries: the 32-row forward. */
  ag_fake_seen.count = 0;
  a.n_q = 40;
  ck_assert_msg(ag_broadcast_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[1]);
  ck_assert_uint_eq(ag_fake_seen.grid, 3 * 2);
  ck_assert_uint_eq(ag_fake_seen.block, 64);

  /* The backward with grouped heads: _dq over (query tile, slab) and
   * heads, _dkv over key tiles and key heads, then the sum over the slabs. */
  fake_init(&f, 64, true, 12);
  ag_broadcast_bwd_args b = bwd_args();
  ck_assert_msg(ag_broadcast_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 3);
  const ag_plan_kernel *dq = &f.kernel.plan.kernels[5], *dkv = &f.kernel.plan.kernels[6],
                       *sum = &f.kernel.plan.kernels[7];
  ck_assert_str_eq(dq->name, "ag_pma_d64_bf16_bq_bwd_dq");
  const int64_t slabs = ag_broadcast_slabs(3, 200, 8, dq->walk.rows);
  ck_assert_int_eq(slabs, 3); /* never more than the batch */
  const unsigned dq_tiles = (200 + dq->walk.rows - 1) / dq->walk.rows;
  ck_assert_uint_eq(ag_fake_seen.grids_x[0], dq_tiles * slabs);
  ck_assert_uint_eq(ag_fake_seen.grids_y[0], 8);
  ck_assert_uint_eq(ag_fake_seen.grids_x[1], 3 + 500 / dkv->walk.rows);
  ck_assert_uint_eq(ag_fake_seen.grids_y[1], 2);
  ck_assert_uint_eq(ag_fake_seen.grids_x[2], (200 * 8 + sum->walk.rows - 1) / sum->walk.rows);
  ck_assert_uint_eq(ag_fake_seen.grids_y[2], 1);
  ck_assert_int_eq(ag_fake_seen.items, slabs); /* the sum's */
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[7]);
  /* One key head per query head and n_q <= 128: the one-pass kernel of
   * 32, 64 or 128 rows over the slabs, then the sum. */
  const int64_t slabs1 = ag_broadcast_slabs(3, 40, 8, dq->walk.rows);
  for (int i = 0; i < 3; i++) {
    ag_fake_seen.count = 0;
    b = bwd_args();
    b.kv_heads = 8;
    b.n_q = i == 2 ? 100 : i ? 40 : 20;
    ck_assert_msg(ag_broadcast_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
    ck_assert_int_eq(ag_fake_seen.count, 2);
    ck_assert_uint_eq(ag_fake_seen.grids_x[0], ag_broadcast_slabs(3, b.n_q, 8, dq->walk.rows));
    ck_assert_uint_eq(ag_fake_seen.grids_y[0], 8);
    ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[7]); /* the sum last */
  }
  ck_assert_int_eq(slabs1, 3);
  /* D of every output row, 16-byte aligned, then the slabs' partials. */
  ck_assert_uint_eq(ag_broadcast_backward_workspace_bytes(&f.kernel, 3, 200, 8),
                    4 * (8 * 600 + slabs * 200 * 8 * 64));
  ck_assert_uint_eq(ag_broadcast_backward_workspace_bytes(&f.kernel, 3, 1, 3), 4 * (12 + 3 * 3 * 64));
  ck_assert_uint_eq(ag_broadcast_backward_workspace_bytes(&f.kernel, -1, 1, 3), 0);
  ck_assert_uint_eq(ag_broadcast_backward_workspace_bytes(NULL, 1, 1, 3), 0);
  /* A large batch: slabs fill about 512 CTAs, whatever the batch. */
  ck_assert_int_eq(ag_broadcast_slabs(100000, 16, 4, 64), 128);
  ck_assert_int_eq(ag_broadcast_slabs(1152, 128, 4, 64), 64);
  ck_assert_int_eq(ag_broadcast_slabs(0, 128, 4, 64), 0);
  ck_assert_int_eq(ag_broadcast_slabs(10, 0, 4, 64), 0);
}
END_TEST

START_TEST(argument_checks) {
  fake f;
  fake_init(&f, 128, true, 7);
  ag_error err = {0};
  ag_broadcast_fwd_args a = fwd_args();
  a.n_q = -1;
  ck_assert_int_eq(ag_broadcast_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message,
                   "need 0 <= n_q and batch * n_q <= 2^31 - 1 (got n_q -1, batch 3)");
  ag_error_clear(&err);
  a = fwd_args();
  a.batch = 1 << 20;
  a.n_q = 4096;
  ck_assert_int_eq(ag_broadcast_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "batch * n_q <= 2^31 - 1"));
  ag_error_clear(&err);
  a = fwd_args();
  a.q = NULL;
  ck_assert_int_eq(ag_broadcast_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "q is a null pointer");
  ag_error_clear(&err);
  int32_t hk[4] = {0, 100, 90, 500};
  a = fwd_args();
  a.host_cu_seqlens_k = hk;
  ck_assert_int_eq(ag_broadcast_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "host_cu_seqlens_k decrease at index 2 (90 after 100)");
  ag_error_clear(&err);
  ck_assert_int_eq(ag_fake_seen.count, 0);
  /* n_q 0: nothing to compute, nothing launched. */
  a = fwd_args();
  a.n_q = 0;
  ck_assert_int_eq(ag_broadcast_forward(&f.kernel, &a, NULL, &err), AG_OK);
  ag_broadcast_bwd_args b = bwd_args();
  b.workspace = NULL;
  ck_assert_int_eq(ag_broadcast_backward(&f.kernel, &b, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "workspace is a null pointer");
  ag_error_clear(&err);
  /* Its dQ partials are read 16 bytes at a time (the jagged backward's
   * workspace needs 4). */
  b.workspace = P(0xa0004);
  ck_assert_int_eq(ag_broadcast_backward(&f.kernel, &b, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "workspace (0xa0004) is not 16-byte aligned; the kernel loads 16 "
                                "bytes at a time");
  ag_error_clear(&err);
  /* The jagged calls refuse a broadcast kernel, and the other way round. */
  ag_jagged_fwd_args j = {.q = P(0x10000), .k = P(0x20000), .v = P(0x30000), .o = P(0x40000),
                          .cu_seqlens_q = P(0x60000), .cu_seqlens_k = P(0x70000), .batch = 3,
                          .heads = 8, .total_q = 300, .total_k = 500};
  ck_assert_int_eq(ag_jagged_forward(&f.kernel, &j, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "kernel 'pma' is not a jagged forward kernel (its spec says "
                                "query: broadcast: call ag_broadcast_*)");
  ag_error_clear(&err);
  f.kernel.spec.query = AG_QUERY_PER_SEQUENCE;
  a = fwd_args();
  ck_assert_int_eq(ag_broadcast_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "kernel 'pma' is not a broadcast-Q forward kernel");
  ag_error_clear(&err);
  ck_assert_int_eq(ag_fake_seen.count, 0);
}
END_TEST

/* Rotary tables with a broadcast Q: each table the kernel reads is
 * required, never defaulted to the other (the queries' [n_q, head_dim] is
 * not the keys'), and passed after lse; a table it does not read is
 * ignored: passed as NULL, not checked. */
START_TEST(rotary_tables) {
  fake f;
  char y[512];
  yaml_for(y, sizeof y, 64, AG_DTYPE_BF16, false, rotary_extra[0], true);
  ag_fake_jagged_kernel(&f, y, 9);
  ag_error err = {0};
  ag_broadcast_fwd_args a = fwd_args();
  ck_assert_int_eq(ag_broadcast_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "rotary_table is a null pointer; kernel 'pma' takes its rotary "
                                "positions from tables ([n_q, head_dim]: sin, then cos)");
  ag_error_clear(&err);
  a.rotary_table = P(0xd0000);
  ck_assert_int_eq(ag_broadcast_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "rotary_table_k is a null pointer; kernel 'pma' takes its rotary "
                                "positions from tables ([total_k, head_dim]: sin, then cos)");
  ag_error_clear(&err);
  a.rotary_table_k = P(0xe0008);
  ck_assert_int_eq(ag_broadcast_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "rotary_table_k (0xe0008) is not 16-byte aligned"));
  ag_error_clear(&err);
  ck_assert_int_eq(ag_fake_seen.count, 0);
  a.rotary_table_k = P(0xe0000);
  ck_assert_msg(ag_broadcast_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  const void *order[9] = {a.q, a.k, a.v, a.o, a.lse, a.rotary_table, a.rotary_table_k,
                          a.cu_seqlens_k, a.cu_seqlens_k};
  for (int i = 0; i < 9; i++) ck_assert_uint_eq(ag_fake_seen.ptr[i], (CUdeviceptr)(uintptr_t)order[i]);
  /* the backward: grouped heads, three kernels; without, the one-pass
   * kernel (n_q 32: the 32-row one) and the sum */
  ag_fake_seen.count = 0;
  ag_broadcast_bwd_args b = bwd_args();
  b.n_q = 32;
  b.rotary_table = P(0xd0000);
  b.rotary_table_k = P(0xe0000);
  ck_assert_msg(ag_broadcast_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 3);
  /* the sum last: kernels fwd, fwd_m32, bwd_m32, bwd_m64, bwd_m128, dq, dkv, dq_sum */
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[7]);
  ag_fake_seen.count = 0;
  b.kv_heads = 8;
  ck_assert_msg(ag_broadcast_backward(&f.kernel, &b, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 2);
  ck_assert_ptr_eq(ag_fake_seen.fn, f.kernel.fn[7]);
  /* Keys alone rotated: the queries' table is not read, not required, and
   * passed as NULL. */
  yaml_for(y, sizeof y, 64, AG_DTYPE_BF16, false,
           "rotary:\n  layout: half\n  apply_to: [k]\n  positions: table\n", false);
  ag_fake_jagged_kernel(&f, y, 9);
  a = fwd_args();
  a.rotary_table = P(0xd0000);
  a.rotary_table_k = P(0xe0000);
  ag_fake_seen.count = 0;
  ck_assert_msg(ag_broadcast_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_uint_eq(ag_fake_seen.ptr[5], 0);
  ck_assert_uint_eq(ag_fake_seen.ptr[6], 0xe0000);
  a.rotary_table = NULL;
  ck_assert_msg(ag_broadcast_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  a.rotary_table = P(0xd0004); /* not read: not checked either */
  ck_assert_msg(ag_broadcast_forward(&f.kernel, &a, NULL, &err) == AG_OK, "%s", err.message);
  ck_assert_uint_eq(ag_fake_seen.ptr[5], 0);
  /* A kernel without tables refuses them. */
  fake_init(&f, 64, false, 7);
  a = fwd_args();
  a.rotary_table_k = P(0xe0000);
  ck_assert_int_eq(ag_broadcast_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "a rotary table was given, but kernel 'pma' takes none (its spec "
                                "has no rotary embeddings)");
  ag_error_clear(&err);
}
END_TEST

/* ---- on a GPU ------------------------------------------------------------------------ */

typedef struct gpu_case {
  ag_dtype dtype;
  int dim;
  bool causal;
  const char *extra;
  int64_t heads, kv_heads;
} gpu_case;

static const gpu_case gpu_cases[] = {
    {AG_DTYPE_BF16, 128, false, "", 4, 4},
    {AG_DTYPE_FP16, 64, false, "", 8, 2},
    {AG_DTYPE_BF16, 64, true, "deterministic: true\n", 4, 1},
    {AG_DTYPE_FP16, 128, false, "window: [100, 20]\n", 2, 2},
    /* causal without grouped heads: the one-pass backward under the mask */
    {AG_DTYPE_BF16, 128, true, "", 4, 4},
    /* head dim 64 without grouped heads: the one-pass backwards (on sm_90a
     * n_q > 64 takes broadcast_bwd_sm90.cu) */
    {AG_DTYPE_FP16, 64, true, "", 4, 4},
    /* rotary embeddings: query row i at position i (or the table's row i)
     * in every sequence, keys at their positions in their sequence */
    {AG_DTYPE_BF16, 128, false,
     "rotary:\n  layout: half\n  apply_to: [q, k]\n  positions: table\n", 4, 4},
    {AG_DTYPE_FP16, 64, true,
     "rotary:\n  layout: interleaved\n  apply_to: [q, k, v]\n  positions: sequence\n"
     "  base: 10000\n",
     4, 2},
    /* without grouped heads: the one-pass kernels rotate (n_q <= 64 here) */
    {AG_DTYPE_BF16, 64, false,
     "rotary:\n  layout: interleaved\n  apply_to: [q, k, v]\n  positions: table\n", 4, 4},
};
enum { NGPU = sizeof gpu_cases / sizeof gpu_cases[0] };

static void run_case(ag_kernel *k, const gpu_case *c, const char *what, int32_t n_q,
                     const int32_t *lk, int64_t batch, uint64_t seed, double max_ref_macs) {
  int32_t *lq = malloc(sizeof(int32_t) * (size_t)(batch ? batch : 1));
  ck_assert_ptr_nonnull(lq);
  for (int64_t b = 0; b < batch; b++) lq[b] = n_q;
  ag_jagged_check_options opt = {.seed = seed, .heads = c->heads, .kv_heads = c->kv_heads,
                                 .backward = true, .repeat_backward = 4,
                                 .max_ref_macs = max_ref_macs};
  ag_jagged_check_result r;
  ag_error err = {0};
  ag_status st = ag_selfcheck_jagged(k, lq, lk, batch, &opt, &r, &err);
  free(lq);
  ck_assert_msg(st == AG_OK, "%s: %s", what, err.message);
  printf("gpu broadcast %s d%d%s%s h%lld/%lld n_q %-3d %-28s o %.2e lse %.1e dq %.2e dk %.2e "
         "dv %.2e%s\n",
         c->dtype == AG_DTYPE_FP16 ? "fp16" : "bf16", c->dim, c->causal ? " causal" : "",
         *c->extra == 'w'   ? " window"
         : *c->extra == 'r' ? " rotary"
                            : "",
         (long long)c->heads, (long long)c->kv_heads, n_q,
         what, r.rel_o, r.lse_abs, r.rel_dq, r.rel_dk, r.rel_dv,
         r.bitwise_repeatable ? "" : " NOT REPEATABLE");
  ck_assert_msg(r.unwritten == 0, "%s: %lld elements never written", what, (long long)r.unwritten);
  ck_assert_msg(r.lse_mismatch == 0, "%s: %lld rows -inf on one side only", what,
                (long long)r.lse_mismatch);
  ck_assert_msg(r.rel_o <= ag_jagged_tolerance(c->dtype, false), "%s: O error %g", what, r.rel_o);
  ck_assert_msg(r.lse_abs <= 2e-3, "%s: lse error %g", what, r.lse_abs);
  const double tol = ag_jagged_tolerance(c->dtype, true);
  ck_assert_msg(r.rel_dq <= tol && r.rel_dk <= tol && r.rel_dv <= tol,
                "%s: gradient errors %g %g %g > %g", what, r.rel_dq, r.rel_dk, r.rel_dv, tol);
  ck_assert_msg(r.bitwise_repeatable, "%s: the backward differs between runs", what);
}

START_TEST(gpu_broadcast) {
  const gpu_case *c = &gpu_cases[_i];
  ag_context *ctx = ag_test_gpu_or_skip("broadcast");
  if (!ctx) return;
  char y[512];
  yaml_for(y, sizeof y, c->dim, c->dtype, c->causal, c->extra, true);
  ag_kernel *k;
  ag_error err = {0};
  ck_assert_msg(ag_kernel_get_string(ctx, y, strlen(y), &k, &err) == AG_OK, "%s", err.message);
  uint64_t seed = (uint64_t)getpid() * 1000003u + 7919u * (uint64_t)_i;
  /* Key lengths 0 and 1 beside the tile edges, one long sequence. */
  int32_t mixed[] = {0, 1, 63, 64, 65, 129, 1000, _i == 0 ? 4096 : 700, 0, 3};
  const int32_t nqs[] = {1, 16, 64, 128, 200};
  for (int i = 0; i < 5; i++) {
    /* 4096 keys only with the small n_q: its float64 backward is checked whole */
    int32_t lens[10];
    memcpy(lens, mixed, sizeof lens);
    if (nqs[i] > 64 && lens[7] > 1500) lens[7] = 1500;
    run_case(k, c, "keys 0,1,63,64,65,..", nqs[i], lens, 10, seed + (uint64_t)i, 0);
  }
  int32_t many[40];
  uint64_t rng = seed;
  for (int i = 0; i < 40; i++) many[i] = (int32_t)(ag_rand_next(&rng) % 300);
  run_case(k, c, "40 random key lengths 0..299", 32, many, 40, seed + 9, 0);
  ag_context_destroy(ctx);
}
END_TEST

/* 100,000 sequences of 0..40 keys: the slabs' walk over a large batch. */
START_TEST(gpu_large_batch) {
  ag_context *ctx = ag_test_gpu_or_skip("broadcast");
  if (!ctx) return;
  const gpu_case c = {AG_DTYPE_BF16, 64, false, "", 2, 2};
  char y[512];
  yaml_for(y, sizeof y, c.dim, c.dtype, c.causal, c.extra, true);
  ag_kernel *k;
  ag_error err = {0};
  ck_assert_msg(ag_kernel_get_string(ctx, y, strlen(y), &k, &err) == AG_OK, "%s", err.message);
  enum { BATCH = 100000 };
  int32_t *lk = malloc(sizeof(int32_t) * BATCH);
  ck_assert_ptr_nonnull(lk);
  uint64_t rng = (uint64_t)getpid();
  for (int i = 0; i < BATCH; i++) lk[i] = (int32_t)(ag_rand_next(&rng) % 41);
  run_case(k, &c, "batch 100000, keys 0..40", 8, lk, BATCH, rng, 0);
  free(lk);
  ag_context_destroy(ctx);
}
END_TEST

Suite *broadcast_suite(void) {
  Suite *s = suite_create("broadcast");
  TCase *tc = tcase_create("broadcast");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, validation);
  tcase_add_test(tc, plan_kernels);
  tcase_add_test(tc, compiles);
  tcase_add_test(tc, rotary_plan);
  tcase_add_test(tc, rotary_compiles);
  tcase_add_test(tc, rotary_tables);
  tcase_add_test(tc, m32_choices);
  tcase_add_test(tc, sm90_backward);
  tcase_add_test(tc, keys_backward);
  tcase_add_test(tc, sm90_rotary_forward);
  tcase_add_test(tc, ws_rotary_forward);
  tcase_add_test(tc, sm90_rotary_backward);
  tcase_add_test(tc, deep_forward);
  tcase_add_test(tc, heads_inner_forward);
  tcase_add_test(tc, items_forward);
  tcase_add_test(tc, ws_small_forward);
  tcase_add_test(tc, launch_parameters);
  tcase_add_test(tc, argument_checks);
  suite_add_tcase(s, tc);
  TCase *gpu = tcase_create("broadcast_gpu");
  tcase_set_timeout(gpu, 1200);
  tcase_add_loop_test(gpu, gpu_broadcast, 0, NGPU);
  tcase_add_test(gpu, gpu_large_batch);
  suite_add_tcase(s, gpu);
  return s;
}
