// SPDX-License-Identifier: BSD-3-Clause
/* check_backward.c: the block-diagonal backward on the CPU, no GPU: specs
 * that ask for it (validation, and its refusal of the shapes the plan
 * refuses), the plan (shapes, shared memory, refusals), the emitted source
 * (names, determinism, the forward unchanged beside it), NVRTC compiles
 * for sm_90a and sm_80 with ptxas's spill report, and ag_block_backward's
 * checks and launch parameters through a fake driver. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fake_driver.h"
#include "runtime.h"
#include "util.h"

enum { MAX_SMEM = 227 * 1024 };

/* The YAML of a block-diagonal spec with these passes. */
static void yaml_for(char *yaml, size_t cap, const char *name, int block, int dim,
                     ag_dtype dtype, bool causal, unsigned passes) {
  const char *list = passes == AG_PASS_BACKWARD                      ? "[backward]"
                     : passes == (AG_PASS_FORWARD | AG_PASS_BACKWARD) ? "[forward, backward]"
                                                                       : "[forward]";
  snprintf(yaml, cap,
           "name: %s\npattern: block_diagonal\nblock_size: %d\nhead_dim: %d\ndtype: %s\n"
           "causal: %s\npasses: %s\n",
           name, block, dim, dtype == AG_DTYPE_FP16 ? "fp16" : "bf16", causal ? "true" : "false",
           list);
}

/* A spec with these passes, loaded as a user writes it. `*out_st` gets the
 * status: AG_OK, or AG_ERR_UNSUPPORTED for shapes the backward does not
 * take (the spec is filled all the same). */
static ag_spec spec_status(const char *name, int block, int dim, ag_dtype dtype, bool causal,
                          unsigned passes, ag_status *out_st) {
  char yaml[512];
  yaml_for(yaml, sizeof yaml, name, block, dim, dtype, causal, passes);
  ag_spec spec;
  ag_error err = {0};
  *out_st = ag_spec_load_string(yaml, strlen(yaml), "bwd.yaml", &spec, &err);
  ck_assert_msg(*out_st == AG_OK || *out_st == AG_ERR_UNSUPPORTED, "%s",
                err.message ? err.message : "");
  ck_assert_uint_eq(spec.passes, passes);
  ag_error_clear(&err);
  return spec;
}

/* A spec with these passes that validation accepts. */
static ag_spec spec_for(const char *name, int block, int dim, ag_dtype dtype, bool causal,
                        unsigned passes) {
  ag_status st;
  ag_spec spec = spec_status(name, block, dim, dtype, causal, passes, &st);
  ck_assert_int_eq(st, AG_OK);
  return spec;
}

/* ---- validation ---------------------------------------------------------------- */

/* Users ask for the backward in the spec: validation accepts it and fills
 * passes, and the plan and the emitter build what it asks for. */
START_TEST(validation_accepts) {
  const char yaml[] = "name: g\npattern: block_diagonal\nhead_dim: 64\ndtype: bf16\n"
                      "passes: [forward, backward]\n";
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "g.yaml", &spec, &err), AG_OK);
  ck_assert_ptr_null(err.message);
  ck_assert_uint_eq(spec.passes, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ck_assert_int_eq(spec.at.passes.line, 5);
  char *src = NULL, name[AG_KERNEL_NAME_MAX];
  ck_assert_int_eq(ag_emit(&spec, &src, name, &err), AG_OK);
  ck_assert_str_eq(name, "ag_g_b64_d64_bf16_fwd");
  ck_assert_ptr_nonnull(strstr(src, "ag_g_b64_d64_bf16_bwd("));
  free(src);
  /* The backward alone. */
  const char alone[] = "name: g\npattern: block_diagonal\nhead_dim: 128\ndtype: fp16\n"
                       "causal: true\npasses: [backward]\n";
  ck_assert_int_eq(ag_spec_load_string(alone, strlen(alone), "g.yaml", &spec, &err), AG_OK);
  ck_assert_uint_eq(spec.passes, AG_PASS_BACKWARD);
  ck_assert_int_eq(ag_emit(&spec, &src, name, &err), AG_OK);
  ck_assert_str_eq(name, "ag_g_b64_d128_fp16_causal_bwd");
  ck_assert_ptr_null(strstr(src, "_fwd("));
  free(src);
}
END_TEST

/* Validation refuses exactly the shapes the plan refuses, at `passes`,
 * with the plan's reason; plan_shapes checks every block size. Every block
 * size plans, rotary or not (blocks past 128 tokens at head_dim 128 are
 * walked in chunks, which rotate too); what the backward alone can still
 * be refused for is a rotary base whose frequencies overflow fp32. */
START_TEST(validation_refuses_what_does_not_fit) {
  const char yaml[] = "name: g\npattern: block_diagonal\nblock_size: 144\nhead_dim: 128\n"
                      "dtype: bf16\npasses: [backward]\n"
                      "rotary: {layout: interleaved, apply_to: [q, k], positions: sequence, "
                      "base: 1e-31}\n";
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "g.yaml", &spec, &err),
                   AG_ERR_UNSUPPORTED);
  const char want[] = "g.yaml:6:1: error: not supported yet: rotary base 1e-31 (";
  ck_assert_msg(strncmp(err.message, want, strlen(want)) == 0, "%s", err.message);
  ck_assert_ptr_nonnull(strstr(err.message, "\npasses: [backward]\n^\n"));
  ck_assert_int_eq(ag_test_count(err.message, "error:"), 1);
  ag_error_clear(&err);
  /* The spec is filled, and its plan gives the same reason. */
  ck_assert_uint_eq(spec.passes, AG_PASS_BACKWARD);
  ag_plan p;
  ck_assert_int_eq(ag_plan_make(&spec, &p, &err), AG_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(err.message, "rotary base 1e-31"));
  ag_error_clear(&err);
  /* With a usable base the same block is walked in chunks, rotated. */
  spec.rotary.base = 10000.0;
  ck_assert_int_eq(ag_plan_make(&spec, &p, &err), AG_OK);
  ck_assert(p.bwd.key_chunks);
  ck_assert_str_eq(ag_plan_kernel_for(&p, AG_PASS_BACKWARD)->name, "ag_g_b144_d128_bf16_rope_bwd");
}
END_TEST

/* ---- the plan ------------------------------------------------------------------ */

START_TEST(plan_shapes) {
  ag_error err = {0};
  ag_plan p;
  /* 64-token blocks at 128: four warps, one stage of Q, K, V, dO (64 KiB),
   * P and dS where K and V were, three CTAs per SM. */
  ag_spec s = spec_for("p", 64, 128, AG_DTYPE_BF16, false, AG_PASS_BACKWARD);
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_ptr_null(ag_plan_kernel_for(&p, AG_PASS_FORWARD));
  ck_assert_int_eq(p.fwd.threads, 0);
  ck_assert_int_eq(p.nkernels, 1);
  ck_assert_str_eq(ag_plan_kernel_for(&p, AG_PASS_BACKWARD)->name, "ag_p_b64_d128_bf16_bwd");
  ck_assert_str_eq(ag_plan_first_kernel(&p), "ag_p_b64_d128_bf16_bwd");
  ck_assert_int_eq(p.bwd.heads_per_tile, 1);
  ck_assert_int_eq(p.bwd.warps, 4);
  ck_assert_int_eq(p.bwd.jobs, 4);
  ck_assert_int_eq(p.bwd.stages, 1);
  ck_assert(p.bwd.pds_overlay);
  /* No staging rows: they hold 64 columns, and two turns through them per
   * store were slower than the shuffles. */
  ck_assert(!p.bwd.bulk_store);
  ck_assert_int_eq(p.bwd.smem_bytes, 4 * 64 * 128 * 2);
  ck_assert_int_eq(p.bwd.min_ctas_per_sm, 3);
  ck_assert_int_eq(p.bwd.items_per_cta, 8);
  ck_assert(p.bwd.wgmma); /* each tile as two 64-column halves of 128-byte rows */
  /* head_dim 64: one head per tile, two stages of 32 KiB, three CTAs. */
  s = spec_for("p", 64, 64, AG_DTYPE_FP16, true, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert_str_eq(ag_plan_kernel_for(&p, AG_PASS_FORWARD)->name, "ag_p_b64_d64_fp16_causal_fwd");
  ck_assert_str_eq(ag_plan_kernel_for(&p, AG_PASS_BACKWARD)->name, "ag_p_b64_d64_fp16_causal_bwd");
  ck_assert_int_eq(p.bwd.heads_per_tile, 1);
  ck_assert_int_eq(p.bwd.jobs, 4);
  ck_assert_int_eq(p.bwd.warps, 4);
  ck_assert_int_eq(p.bwd.min_ctas_per_sm, 3);
  ck_assert_int_eq(p.bwd.stages, 2);
  ck_assert(p.bwd.pds_overlay);
  ck_assert(p.bwd.bulk_store);
  /* Each warp's staging rows (16 x 72 elements) for the gradient stores:
   * still three CTAs per SM. */
  ck_assert_int_eq(p.bwd.smem_bytes, 2 * 4 * 64 * 128 + 4 * 16 * 72 * 2);
  ck_assert(p.bwd.wgmma); /* 64x64 tiles: both phases on wgmma where sm_90a */
  /* sm_80 alone: no wgmma, no staging rows (no bulk copies there). */
  s.arch = AG_ARCH_SM80;
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert(!p.bwd.wgmma);
  ck_assert(!p.bwd.bulk_store);
  ck_assert_int_eq(p.bwd.smem_bytes, 2 * 4 * 64 * 128);
  char *src;
  ck_assert_int_eq(ag_emit(&s, &src, NULL, &err), AG_OK);
  ck_assert_ptr_null(strstr(src, "wgmma"));
  ck_assert_ptr_null(strstr(src, "bulk"));
  ck_assert_ptr_null(strstr(src, "stmatrix"));
  ck_assert_ptr_nonnull(strstr(src, "__shfl_xor_sync(0xffffffffu, upper ? v[i] : v[i | bit], bit)"));
  free(src);
  s.arch = AG_ARCH_AUTO; /* both paths, the compiler's arch picks */
  ck_assert_int_eq(ag_emit(&s, &src, NULL, &err), AG_OK);
  ck_assert_int_eq(ag_test_count(src, "wgmma.mma_async"), 2);
  ck_assert_int_eq(ag_test_count(src, "cp.async.bulk.global.shared::cta"), 1);
  /* Each set of device helpers once: the forward's mma.sync ones serve both. */
  ck_assert_int_eq(ag_test_count(src, "begin device helpers (mma.sync"), 1);
  ck_assert_int_eq(ag_test_count(src, "begin device helpers (wgmma"), 1);
  ck_assert_int_eq(ag_test_count(src, "begin device helpers (stmatrix"), 1);
  /* The backward's 1024-byte aligned shared memory is bwd::smem, declared
   * at namespace scope: inside the kernel it would be the forward's extern
   * "C" smem (aligned to 128; nvcc warns of the clash). */
  const char *decl = strstr(src, "\nextern __shared__ __align__(1024) unsigned short smem[];\n");
  ck_assert_ptr_nonnull(decl);
  ck_assert_ptr_nonnull(strstr(src, "namespace bwd {"));
  ck_assert(strstr(src, "namespace bwd {") < decl);
  ck_assert_int_eq(ag_test_count(src, "extern __shared__ __align__(1024)"), 1);
  ck_assert_int_eq(ag_test_count(src, "#if __CUDA_ARCH__ >= 900"), 3);
  ck_assert_int_gt(ag_test_count(src, "#ifdef __CUDA_ARCH_FEAT_SM90_ALL"), 5);
  ck_assert_ptr_nonnull(strstr(src, "rows_times_rows(s, q_s, k_s, c0, row0);"));
  free(src);
  /* 128-token blocks at head_dim 64: P and dS (2 x 128 x 128) outgrow K and
   * V, so they get their own buffer. */
  s = spec_for("p", 128, 64, AG_DTYPE_BF16, false, AG_PASS_BACKWARD);
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  ck_assert(!p.bwd.pds_overlay);
  ck_assert_int_eq(p.bwd.stages, 2); /* one CTA of 8 warps: room for two */
  ck_assert(p.bwd.bulk_store);
  ck_assert_int_eq(p.bwd.smem_bytes, 2 * 4 * 128 * 128 + 2 * 128 * 128 * 2 + 8 * 16 * 72 * 2);
  ck_assert_int_eq(p.bwd.warps, 8);
  s = spec_for("p", 64, 64, AG_DTYPE_FP16, true, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  /* The forward's plan is the one it has without a backward. */
  ag_plan fwd;
  s.passes = AG_PASS_FORWARD;
  ck_assert_int_eq(ag_plan_make(&s, &fwd, &err), AG_OK);
  ck_assert_ptr_null(ag_plan_kernel_for(&fwd, AG_PASS_BACKWARD));
  ck_assert_int_eq(memcmp(&p.fwd, &fwd.fwd, sizeof p.fwd), 0);
  ck_assert_int_eq(memcmp(&p.kernels[0], &fwd.kernels[0], sizeof p.kernels[0]), 0);

  /* Every block size: what fits is planned within the limits, what does
   * not is refused with the reason. */
  for (int dim = 64; dim <= 128; dim += 64)
    for (int b = 16; b <= 256; b += 16) {
      ag_status valid;
      s = spec_status("p", b, dim, AG_DTYPE_BF16, false, AG_PASS_BACKWARD, &valid);
      ag_status st = ag_plan_make(&s, &p, &err);
      ck_assert_int_eq(valid, st); /* validation refuses what the plan refuses */
      ck_assert_msg(st == AG_OK, "b%d d%d: %s", b, dim, err.message);
      const ag_plan_bwd *w = &p.bwd;
      /* Past 128 tokens at head_dim 128 (176 at 64) the block is walked in
       * 64-row chunks: six chunks and three floats per query row. */
      ck_assert_int_eq(w->key_chunks, b > (dim == 64 ? 176 : 128));
      if (w->key_chunks) {
        ck_assert_int_eq(w->smem_bytes, 6 * 64 * dim * 2 + 12 * ((b + 63) / 64 * 64));
        ck_assert_int_eq(w->warps, 4);
        ck_assert_int_eq(w->threads, 128);
        ck_assert_int_eq(w->heads_per_tile, 1);
        ck_assert(!w->pds_overlay && !w->wgmma && !w->bulk_store);
        ck_assert_int_le(w->smem_bytes * w->min_ctas_per_sm, MAX_SMEM);
        continue;
      }
      int tiles = 4 * b * dim * 2 * w->heads_per_tile;
      int stride = b % 64 == 0 ? b : b + 8;
      int ps = 2 * w->heads_per_tile * b * stride * 2;
      ck_assert_int_eq(w->pds_overlay, stride <= dim && b <= 64);
      const int rest = w->stages * tiles + (w->pds_overlay ? 0 : ps), staging = w->warps * 16 * 72 * 2;
      /* The staging rows wherever they fit beside the rest (never at a CTA's cost). */
      ck_assert_int_eq(w->bulk_store,
                       dim == 64 && (rest + staging) * w->min_ctas_per_sm <= MAX_SMEM);
      ck_assert_int_eq(w->smem_bytes, rest + (w->bulk_store ? staging : 0));
      ck_assert_int_le(w->smem_bytes * w->min_ctas_per_sm, MAX_SMEM);
      ck_assert_int_eq(w->jobs, w->heads_per_tile * b / 16);
      ck_assert_int_le(w->warps, w->jobs);
      if (w->pds_overlay) ck_assert_int_eq(w->warps, w->jobs);
      ck_assert_int_le(w->warps * w->min_ctas_per_sm, 16); /* >= 128 registers a thread */
      ck_assert_int_eq(w->threads, 32 * w->warps);
    }
}
END_TEST

/* ---- the source ------------------------------------------------------------------ */

/* The emitted body: everything after the banner comment. */
static const char *body(const char *src) {
  const char *end = strstr(src, " */\n\n");
  ck_assert_ptr_nonnull(end);
  return end + 5;
}

START_TEST(source_shape) {
  ag_error err = {0};
  char *fwd, *bwd, *both, *again, name[AG_KERNEL_NAME_MAX];
  ag_spec s = spec_for("e", 64, 128, AG_DTYPE_FP16, true, AG_PASS_FORWARD);
  ck_assert_int_eq(ag_emit(&s, &fwd, name, &err), AG_OK);
  s.passes = AG_PASS_BACKWARD;
  ck_assert_int_eq(ag_emit(&s, &bwd, name, &err), AG_OK);
  ck_assert_str_eq(name, "ag_e_b64_d128_fp16_causal_bwd");
  s.passes = AG_PASS_FORWARD | AG_PASS_BACKWARD;
  ck_assert_int_eq(ag_emit(&s, &both, name, &err), AG_OK);
  ck_assert_str_eq(name, "ag_e_b64_d128_fp16_causal_fwd");
  ck_assert_int_eq(ag_emit(&s, &again, NULL, &err), AG_OK);
  ck_assert_str_eq(both, again); /* deterministic */

  /* Backward alone: its own device helpers, no namespace, no forward. */
  ck_assert_ptr_null(strchr(bwd, '@'));
  ck_assert_int_eq(ag_test_count(bwd, "begin device helpers (mma.sync"), 1);
  ck_assert_int_eq(ag_test_count(bwd, "begin device helpers (wgmma"), 1);
  ck_assert_int_eq(ag_test_count(bwd, "begin device helpers ("), 2); /* no bulk copies */
  ck_assert_int_eq(ag_test_count(bwd, "extern \"C\" __global__"), 1);
  ck_assert_ptr_nonnull(strstr(bwd, "ag_e_b64_d128_fp16_causal_bwd(const unsigned short"));
  ck_assert_ptr_null(strstr(bwd, "_fwd"));
  ck_assert_ptr_null(strstr(bwd, "namespace"));
  ck_assert_ptr_nonnull(strstr(bwd, " *   passes: [backward]\n"));
  /* Only what the spec needs: fp16 throughout, the causal bounds, the plan's
   * shared memory checked by the template. */
  ck_assert_ptr_null(strstr(bwd, "bf16"));
  ck_assert_ptr_nonnull(strstr(bwd, "cvt.f32.f16"));
  ck_assert_ptr_nonnull(strstr(bwd, "first_query_tile = r0 / 16"));
  ck_assert_ptr_nonnull(strstr(bwd, "kSmemBytes = 65536;"));
  ck_assert_ptr_nonnull(strstr(bwd, "P of head h where K was, dS where V was"));
  ck_assert_ptr_null(strstr(bwd, "P and dS are one buffer after the stages"));

  /* Both: the forward exactly as emitted alone, then the backward in
   * namespace bwd, sharing the forward's helpers. */
  const char *f = body(fwd), *b = body(both);
  ck_assert_int_eq(strncmp(b, f, strlen(f)), 0);
  ck_assert_int_eq(strncmp(b + strlen(f), "\n/* The backward kernel.", 24), 0);
  ck_assert_int_eq(ag_test_count(both, "begin device helpers (mma.sync"), 1);
  ck_assert_int_eq(ag_test_count(both, "begin device helpers (wgmma"), 1);
  ck_assert_int_eq(ag_test_count(both, "begin device helpers ("), 2);
  ck_assert_int_eq(ag_test_count(both, "extern \"C\" __global__"), 2);
  ck_assert_int_eq(ag_test_count(both, "namespace bwd {"), 1);
  ck_assert_ptr_nonnull(strstr(both, "}  // namespace bwd\n"));
  ck_assert_ptr_nonnull(strstr(both, " *   passes: [forward, backward]\n"));
  ck_assert_ptr_nonnull(strstr(both, "backward kernel: ag_e_b64_d128_fp16_causal_bwd\n"));

  /* Not causal: no causal bounds or mask. */
  free(bwd);
  s.causal = false;
  s.passes = AG_PASS_BACKWARD;
  ck_assert_int_eq(ag_emit(&s, &bwd, NULL, &err), AG_OK);
  ck_assert_ptr_null(strstr(bwd, "first_query_tile = r0 / 16"));
  ck_assert_ptr_null(strstr(bwd, "col > (e < 2 ? r_lo : r_hi)"));
  ck_assert_ptr_nonnull(strstr(bwd, "first_query_tile = 0;"));
  ck_assert_ptr_null(strstr(bwd, "if (j > row0 / 16) break;"));
  free(fwd);
  free(bwd);
  free(both);
  free(again);
}
END_TEST

/* ---- NVRTC ---------------------------------------------------------------------- */

typedef struct compile_case {
  int block, dim;
  ag_dtype dtype;
  bool causal;
} compile_case;

/* Seven backward kernels for two arches and one source with both passes:
 * 16 kernels, a second or so each. Block sizes past what the plan accepts
 * (256) are refused, checked in plan_shapes. */
static const compile_case compile_cases[] = {
    {64, 128, AG_DTYPE_BF16, false}, {64, 64, AG_DTYPE_FP16, true},
    {16, 64, AG_DTYPE_BF16, true},   {128, 128, AG_DTYPE_FP16, true},
    {128, 64, AG_DTYPE_BF16, false}, {48, 128, AG_DTYPE_FP16, false},
    {176, 64, AG_DTYPE_BF16, true},
};
enum { NCOMPILE = sizeof compile_cases / sizeof compile_cases[0] };

/* Compile `src` with ptxas -v, the log dumped to `dir`; check the cubin
 * and, when the log has the report, that `kernel` spills at most 64 bytes. */
static void compile_and_check(const char *src, const char *name, const char *kernel,
                              const char *arch, const char *dir) {
  void *cubin = NULL;
  size_t size = 0;
  ag_error err = {0};
  ag_status st = ag_nvrtc_compile(src, name, arch, &cubin, &size, &err);
  ck_assert_msg(st == AG_OK, "%s for %s: %s", name, arch, err.message);
  ck_assert_uint_gt(size, 64);
  ck_assert_mem_eq(cubin, "\x7f" "ELF", 4);
  free(cubin);
  char path[512];
  snprintf(path, sizeof path, "%s/%s.log", dir, name);
  char *log = ag_test_slurp(path, NULL);
  ck_assert_ptr_nonnull(log);
  int stores = 0, loads = 0, regs = 0;
  if (ag_test_ptxas_report(log, kernel, &regs, &stores, &loads)) {
    printf("nvrtc %s %s: %d registers, %d bytes spill stores, %d bytes spill loads\n", kernel,
           arch, regs, stores, loads);
    ck_assert_msg(stores <= 64 && loads <= 64, "%s for %s spills: %s", kernel, arch, log);
  } else {
    /* NVRTC sometimes returns an empty log for -v (see check_nvrtc.c). */
    printf("SKIP spill check for %s %s: no ptxas report in the log\n", kernel, arch);
  }
  free(log);
}

START_TEST(backward_compiles) {
  const compile_case *c = &compile_cases[_i];
  char *dir = strdup("/tmp/attngen-bwd-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  setenv(AG_ENV_NVRTC_VERBOSE, "1", 1);
  setenv(AG_ENV_DUMP_DIR, dir, 1);
  ag_spec s = spec_for("nv", c->block, c->dim, c->dtype, c->causal, AG_PASS_BACKWARD);
  char *src, name[AG_KERNEL_NAME_MAX];
  ag_error err = {0};
  ck_assert_int_eq(ag_emit(&s, &src, name, &err), AG_OK);
  const char *archs[] = {"sm_90a", "sm_80"};
  for (int a = 0; a < 2; a++) compile_and_check(src, name, name, archs[a], dir);
  free(src);
  unsetenv(AG_ENV_NVRTC_VERBOSE);
  unsetenv(AG_ENV_DUMP_DIR);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

/* One module holds both kernels: the backward's names do not clash with
 * the forward's. */
START_TEST(both_passes_compile) {
  char *dir = strdup("/tmp/attngen-bwd-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  setenv(AG_ENV_NVRTC_VERBOSE, "1", 1);
  setenv(AG_ENV_DUMP_DIR, dir, 1);
  ag_spec s = spec_for("nv", 64, 64, AG_DTYPE_BF16, true, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ag_plan p;
  ag_error err = {0};
  ck_assert_int_eq(ag_plan_make(&s, &p, &err), AG_OK);
  char *src;
  ck_assert_int_eq(ag_emit_plan(&s, &p, &src, &err), AG_OK);
  compile_and_check(src, ag_plan_kernel_for(&p, AG_PASS_FORWARD)->name, ag_plan_kernel_for(&p, AG_PASS_BACKWARD)->name, "sm_90a", dir);
  free(src);
  unsetenv(AG_ENV_NVRTC_VERBOSE);
  unsetenv(AG_ENV_DUMP_DIR);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

/* ---- ag_block_backward without a device ------------------------------------------ */

/* A kernel struct on the stack from a real spec and plan, with the
 * recording fake driver (fake_driver.h). */
typedef struct fake {
  ag_context ctx;
  ag_kernel kernel;
} fake;

static void fake_init(fake *f, int dim, unsigned passes) {
  memset(f, 0, sizeof *f);
  f->kernel.spec = spec_for("args", 64, dim, AG_DTYPE_BF16, false, passes);
  ag_error err = {0};
  ck_assert_int_eq(ag_plan_make(&f->kernel.spec, &f->kernel.plan, &err), AG_OK);
  ag_fake_driver_attach(&f->ctx, 8); /* 7 tensors, offsets */
  f->kernel.ctx = &f->ctx;
  for (int i = 0; i < f->kernel.plan.nkernels; i++) {
    f->kernel.fn[i] = (CUfunction)(uintptr_t)(f->kernel.plan.kernels[i].pass == AG_PASS_FORWARD
                                                  ? 0xf00 : 0xb00);
    f->kernel.ctas_per_sm[i] = 2;
  }
}

static ag_block_bwd_args valid_args(void) {
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
  return a;
}

static void expect_reject(fake *f, const ag_block_bwd_args *a, const char *want) {
  ag_error err = {0};
  ck_assert_int_eq(ag_block_backward(&f->kernel, a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, want);
  ag_error_clear(&err);
  ck_assert_int_eq(ag_fake_seen.count, 0);
}

START_TEST(launch_parameters) {
  for (int dim = 64; dim <= 128; dim += 64) {
    fake f;
    fake_init(&f, dim, AG_PASS_FORWARD | AG_PASS_BACKWARD);
    ag_block_bwd_args a = valid_args();
    ag_error err = {0};
    ck_assert_int_eq(ag_block_backward(&f.kernel, &a, NULL, &err), AG_OK);
    const ag_plan_bwd *p = &f.kernel.plan.bwd;
    ck_assert_int_eq(ag_fake_seen.count, 1);
    ck_assert_ptr_eq(ag_fake_seen.fn, (CUfunction)(uintptr_t)0xb00);
    ck_assert_uint_eq(ag_fake_seen.block, (unsigned)p->threads);
    ck_assert_uint_eq(ag_fake_seen.smem, (unsigned)p->smem_bytes);
    const void *in_order[8] = {a.q, a.k, a.v, a.dout, a.dq, a.dk, a.dv, a.offsets};
    for (int i = 0; i < 8; i++) ck_assert_uint_eq(ag_fake_seen.ptr[i], (CUdeviceptr)(uintptr_t)in_order[i]);
    ck_assert_int_eq(ag_fake_seen.batch, 2);
    ck_assert_int_eq(ag_fake_seen.heads, 8);
    ck_assert_int_eq(ag_fake_seen.total, 100);
    /* (batch + total / block) virtual blocks times the backward's head groups. */
    int64_t groups = (8 + p->heads_per_tile - 1) / p->heads_per_tile;
    ck_assert_int_eq(ag_fake_seen.items, (2 + 100 / 64) * groups);
    ck_assert_uint_eq(ag_fake_seen.grid, (ag_fake_seen.items + p->items_per_cta - 1) / p->items_per_cta);
  }
}
END_TEST

START_TEST(argument_checks) {
  fake f;
  fake_init(&f, 128, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ag_block_bwd_args a = valid_args();
  a.dout = NULL;
  expect_reject(&f, &a, "dout is a null pointer");
  a = valid_args();
  a.dk = (void *)(uintptr_t)0x600008;
  expect_reject(&f, &a, "dk (0x600008) is not 16-byte aligned; the kernel loads 16 bytes at a time");
  a = valid_args();
  a.heads = 0;
  expect_reject(&f, &a, "need batch >= 0, heads >= 1, total_tokens >= 0 (got 2, 0, 100)");
  a = valid_args();
  const int32_t bad[] = {0, 60, 50};
  a.host_offsets = bad;
  expect_reject(&f, &a, "host_offsets decrease at index 2 (50 after 60)");
  /* Row strides: each checked under its own name; a valid one other than
   * the packed stride is refused while the kernel takes packed tensors
   * only (8 heads of 128: rows 1024 apart). */
  a = valid_args();
  a.dout_stride = 1020;
  expect_reject(&f, &a, "dout_stride (1020) must be 0 (packed) or a multiple of 8 elements from "
                        "heads * head_dim (1024) to 2^31 - 1");
  a = valid_args();
  a.dv_stride = 512;
  expect_reject(&f, &a, "dv_stride (512) must be 0 (packed) or a multiple of 8 elements from "
                        "heads * head_dim (1024) to 2^31 - 1");
  a = valid_args();
  a.q_stride = a.dq_stride = 1024; /* the packed stride, named: accepted */
  ck_assert_int_eq(ag_block_backward(&f.kernel, &a, NULL, NULL), AG_OK);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ag_fake_seen.count = 0;
  a.dk_stride = 3 * 1024;
  ag_error serr = {0};
  ck_assert_int_eq(ag_block_backward(&f.kernel, &a, NULL, &serr), AG_ERR_UNSUPPORTED);
  ck_assert_str_eq(serr.message,
                   "dk_stride 3072: kernel 'args' takes packed tensors only (rows heads * "
                   "head_dim = 1024 elements apart); its spec does not say row_strides: true");
  ag_error_clear(&serr);
  ck_assert_int_eq(ag_fake_seen.count, 0);
  /* Grouped-query heads: refused where the kernels take as many key heads. */
  a = valid_args();
  a.kv_heads = 4;
  ck_assert_int_eq(ag_block_backward(&f.kernel, &a, NULL, &serr), AG_ERR_UNSUPPORTED);
  ck_assert_str_eq(serr.message,
                   "kv_heads 4: kernel 'args' takes as many key heads as query heads (8); its "
                   "spec does not say row_strides: true");
  ag_error_clear(&serr);
  a.kv_heads = 3;
  expect_reject(&f, &a, "kv_heads (3) must be 0 (heads) or divide heads (8)");
  ck_assert_int_eq(ag_fake_seen.count, 0);
  /* Nothing to compute: no launch, no tensor looked at. */
  a = valid_args();
  a.batch = 0;
  a.dq = NULL;
  ck_assert_int_eq(ag_block_backward(&f.kernel, &a, NULL, NULL), AG_OK);
  ck_assert_int_eq(ag_fake_seen.count, 0);
  /* A forward-only kernel has no backward. */
  fake_init(&f, 128, AG_PASS_FORWARD);
  a = valid_args();
  expect_reject(&f, &a, "kernel 'args' is not a block-diagonal backward kernel");
  ck_assert_int_eq(ag_block_backward(NULL, &a, NULL, NULL), AG_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(ag_block_backward(&f.kernel, NULL, NULL, NULL), AG_ERR_INVALID_ARGUMENT);
  /* And a backward-only kernel no forward. */
  fake_init(&f, 128, AG_PASS_BACKWARD);
  ag_block_fwd_args fa;
  memset(&fa, 0, sizeof fa);
  ag_error err = {0};
  ck_assert_int_eq(ag_block_forward(&f.kernel, &fa, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "kernel 'args' is not a block-diagonal forward kernel");
  ag_error_clear(&err);
}
END_TEST

/* A spec with row_strides, grouped-query heads: K's and V's packed rows
 * have kv_heads heads, dK's and dV's (per query head) heads, as Q's. */
START_TEST(grouped_heads_launch) {
  fake f;
  fake_init(&f, 128, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  f.kernel.spec.row_strides = true;
  ag_error err = {0};
  ck_assert_int_eq(ag_plan_make(&f.kernel.spec, &f.kernel.plan, &err), AG_OK);
  ag_plan_kernels(&f.kernel.spec, &f.kernel.plan);
  ag_fake_seen.strides = 7;
  ag_block_bwd_args a = valid_args();
  a.kv_heads = 2;
  ck_assert_int_eq(ag_block_backward(&f.kernel, &a, NULL, &err), AG_OK);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ck_assert_int_eq(ag_fake_seen.heads, 8);
  ck_assert_int_eq(ag_fake_seen.kv_heads, 2);
  const int want[7] = {1024, 256, 256, 1024, 1024, 1024, 1024}; /* q k v dout dq dk dv */
  for (int i = 0; i < 7; i++) ck_assert_int_eq(ag_fake_seen.stride[i], want[i]);
  ag_fake_seen.count = 0;
  a.dk_stride = 256; /* dK is per query head: at least heads * head_dim */
  expect_reject(&f, &a, "dk_stride (256) must be 0 (packed) or a multiple of 8 elements from "
                        "heads * head_dim (1024) to 2^31 - 1");
  ag_fake_seen.strides = 0;
}
END_TEST

Suite *backward_suite(void) {
  Suite *s = suite_create("backward");
  TCase *tc = tcase_create("backward");
  tcase_add_test(tc, validation_accepts);
  tcase_add_test(tc, validation_refuses_what_does_not_fit);
  tcase_add_test(tc, plan_shapes);
  tcase_add_test(tc, source_shape);
  tcase_add_test(tc, launch_parameters);
  tcase_add_test(tc, argument_checks);
  tcase_add_test(tc, grouped_heads_launch);
  suite_add_tcase(s, tc);
  TCase *nv = tcase_create("backward_nvrtc");
  tcase_set_timeout(nv, 600);
  tcase_add_loop_test(nv, backward_compiles, 0, NCOMPILE);
  tcase_add_test(nv, both_passes_compile);
  suite_add_tcase(s, nv);
  return s;
}
