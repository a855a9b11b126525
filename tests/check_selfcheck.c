// SPDX-License-Identifier: BSD-3-Clause
/* check_selfcheck.c: the jagged self-check (tools/lib/selfcheck_jagged.c)
 * without a GPU. A driver table whose memory is host memory and whose
 * cuLaunchKernel computes each pass on the CPU (the float64 reference,
 * rotated and rounded as the kernels do) stands in for the device; the
 * self-check must then find the passes correct, every checked element
 * written, and the sequences it promises checked: a row of the last
 * sequence left unwritten (a kernel that stops short of the tensors' end)
 * must be caught. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fill.h"
#include "jagged_bwd_reference.h"
#include "jagged_reference.h"
#include "reference.h"
#include "runtime.h"
#include "selfcheck_jagged.h"

/* ---- a driver whose device is the host ---------------------------------------- */

static ag_driver emu_driver;
static const ag_kernel *emu; /* the kernel whose launches are emulated */
static int skip_last_row;    /* leave the last query (and key) row unwritten */

static CUresult CUDAAPI emu_push(CUcontext c) {
  (void)c;
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_pop(CUcontext *c) {
  if (c) *c = NULL;
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_get_current(CUcontext *c) {
  *c = NULL; /* none: every launch pushes */
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_sync(void) { return CUDA_SUCCESS; }
static CUresult CUDAAPI emu_alloc(CUdeviceptr *p, size_t n) {
  void *m = malloc(n ? n : 1);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_free(CUdeviceptr p) {
  free((void *)(uintptr_t)p);
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_htod(CUdeviceptr d, const void *h, size_t n) {
  memcpy((void *)(uintptr_t)d, h, n);
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_dtoh(void *h, CUdeviceptr d, size_t n) {
  memcpy(h, (const void *)(uintptr_t)d, n);
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_set16(CUdeviceptr d, unsigned short v, size_t n) {
  unsigned short *p = (unsigned short *)(uintptr_t)d;
  for (size_t i = 0; i < n; i++) p[i] = v;
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_set32(CUdeviceptr d, unsigned v, size_t n) {
  unsigned *p = (unsigned *)(uintptr_t)d;
  for (size_t i = 0; i < n; i++) p[i] = v;
  return CUDA_SUCCESS;
}

/* ---- the passes, on the CPU ----------------------------------------------------- */

typedef struct emu_args {
  void *ptr[AG_PARAM_COUNT];
  long long wide[AG_PARAM_COUNT];
} emu_args;
static emu_args acc; /* the parameters of the pass's kernels launched so far */

static double *to_doubles(ag_dtype dt, const uint16_t *h, size_t n) {
  double *d = malloc(8 * n + 8);
  ck_assert_ptr_nonnull(d);
  for (size_t i = 0; i < n; i++) d[i] = ag_half_to_float(dt, h[i]);
  return d;
}

/* d[0..n) rounded into h, but for the `skip` elements from `from` (left as
 * the poison found them). */
static void to_halves(ag_dtype dt, const double *d, uint16_t *h, size_t n, size_t from,
                      size_t skip) {
  for (size_t i = 0; i < n; i++)
    if (i < from || i >= from + skip) h[i] = ag_float_to_half(dt, (float)d[i]);
}

/* Rotates x (or, inverse, rotates a gradient back) as the spec says: the
 * queries at positions Lk - Lq on, keys at 0 on, or each token by its
 * table row; rotated inputs rounded to the dtype once, as the kernels. */
static void rotate(const ag_spec *s, const emu_args *a, int which, bool inverse, double *x,
                   double *table_q, double *table_k) {
  if (s->rotary.layout == AG_ROTARY_NONE || !(s->rotary.apply_to & (AG_APPLY_Q << which))) return;
  const int64_t batch = a->wide[AG_PARAM_BATCH];
  const int32_t *cu_q = a->ptr[AG_PARAM_OFFSETS_Q], *cu_k = a->ptr[AG_PARAM_OFFSETS_K];
  const int64_t heads = which == 0 ? a->wide[AG_PARAM_HEADS] : a->wide[AG_PARAM_KV_HEADS];
  const ag_ref_rotary r = {.layout = s->rotary.layout, .positions = s->rotary.positions,
                           .base = s->rotary.base, .table = which == 0 ? table_q : table_k};
  int64_t *shift = calloc((size_t)batch + 1, sizeof *shift);
  ck_assert_ptr_nonnull(shift);
  for (int64_t b = 0; which == 0 && b < batch; b++)
    shift[b] = (int64_t)(cu_k[b + 1] - cu_k[b]) - (cu_q[b + 1] - cu_q[b]);
  ag_ref_rotary_apply_shifted(&r, inverse, which == 0 ? cu_q : cu_k, shift, batch, heads,
                              s->head_dim, x);
  free(shift);
  const int64_t rows = which == 0 ? a->wide[AG_PARAM_TOTAL_Q] : a->wide[AG_PARAM_TOTAL_K];
  for (int64_t i = 0; !inverse && i < rows * heads * s->head_dim; i++)
    x[i] = ag_half_to_float(s->dtype, ag_float_to_half(s->dtype, (float)x[i]));
}

static void emulate(unsigned pass) {
  const ag_spec *s = &emu->spec;
  const emu_args *a = &acc;
  const ag_dtype dt = s->dtype;
  const int dim = s->head_dim;
  const int64_t H = a->wide[AG_PARAM_HEADS], G = a->wide[AG_PARAM_KV_HEADS];
  const int64_t tq = a->wide[AG_PARAM_TOTAL_Q], tk = a->wide[AG_PARAM_TOTAL_K];
  const size_t nq = (size_t)(tq * H * dim), nk = (size_t)(tk * G * dim);
  const ag_ref_jagged_params p = {.batch = a->wide[AG_PARAM_BATCH], .total_q = tq, .heads = H,
                                  .kv_heads = G, .head_dim = dim, .scale = ag_spec_scale(s),
                                  .causal = s->causal, .window = s->has_window,
                                  .window_left = s->window_left,
                                  .window_right = s->window_right};
  double *q = to_doubles(dt, a->ptr[AG_PARAM_Q], nq), *k = to_doubles(dt, a->ptr[AG_PARAM_K], nk),
         *v = to_doubles(dt, a->ptr[AG_PARAM_V], nk);
  double *tab_q = NULL, *tab_k = NULL;
  if (a->ptr[AG_PARAM_ROTARY_TABLE]) {
    tab_q = to_doubles(dt, a->ptr[AG_PARAM_ROTARY_TABLE], (size_t)(tq * dim));
    tab_k = a->ptr[AG_PARAM_ROTARY_TABLE_K]
                ? to_doubles(dt, a->ptr[AG_PARAM_ROTARY_TABLE_K], (size_t)(tk * dim))
                : tab_q;
  }
  for (int t = 0; t < 3; t++) rotate(s, a, t, false, t == 0 ? q : t == 1 ? k : v, tab_q, tab_k);
  const int32_t *cu_q = a->ptr[AG_PARAM_OFFSETS_Q], *cu_k = a->ptr[AG_PARAM_OFFSETS_K];
  /* the last row's head 0, left as the poison found it */
  const size_t skip_q = skip_last_row && tq > 0 ? (size_t)((tq - 1) * H * dim) : nq;
  const size_t skip_k = skip_last_row && tk > 0 ? (size_t)((tk - 1) * G * dim) : nk;
  if (pass == AG_PASS_FORWARD) {
    double *o = calloc(nq + 1, 8), *lse = calloc((size_t)(H * tq) + 1, 8);
    ck_assert(o && lse);
    ag_ref_jagged_forward_f64(&p, q, k, v, cu_q, cu_k, o, lse);
    to_halves(dt, o, a->ptr[AG_PARAM_O], nq, skip_q, (size_t)dim);
    float *hl = a->ptr[AG_PARAM_LSE];
    for (int64_t i = 0; i < H * tq; i++) hl[i] = (float)lse[i];
    free(o);
    free(lse);
  } else {
    double *dout = to_doubles(dt, a->ptr[AG_PARAM_DOUT], nq);
    double *dq = calloc(nq + 1, 8), *dk = calloc(nk + 1, 8), *dv = calloc(nk + 1, 8);
    ck_assert(dq && dk && dv);
    ag_ref_jagged_bwd(&p, q, k, v, dout, cu_q, cu_k, dq, dk, dv, NULL, NULL);
    rotate(s, a, 0, true, dq, tab_q, tab_k);
    rotate(s, a, 1, true, dk, tab_q, tab_k);
    rotate(s, a, 2, true, dv, tab_q, tab_k);
    to_halves(dt, dq, a->ptr[AG_PARAM_DQ], nq, 0, 0);
    to_halves(dt, dk, a->ptr[AG_PARAM_DK], nk, skip_k, (size_t)dim);
    to_halves(dt, dv, a->ptr[AG_PARAM_DV], nk, 0, 0);
    free(dout);
    free(dq);
    free(dk);
    free(dv);
  }
  if (tab_k != tab_q) free(tab_k);
  free(tab_q);
  free(q);
  free(k);
  free(v);
}

/* Collects the parameters of each kernel of a pass (the plan's roles) and
 * runs the pass at its last kernel, when all are known. */
static CUresult CUDAAPI emu_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                   unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                   CUstream stream, void **params, void **extra) {
  (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)stream;
  ck_assert_ptr_null(extra);
  const int i = (int)((uintptr_t)f - 0x100);
  const ag_plan *plan = &emu->plan;
  ck_assert(i >= 0 && i < plan->nkernels);
  const ag_plan_kernel *d = &plan->kernels[i];
  bool first = true, last = true;
  for (int j = 0; j < plan->nkernels; j++)
    if (plan->kernels[j].pass == d->pass) {
      if (j < i) first = false;
      if (j > i) last = false;
    }
  if (first) memset(&acc, 0, sizeof acc);
  for (int p = 0; p < d->nparams; p++) {
    const ag_param r = d->params[p];
    switch (r) {
      case AG_PARAM_BATCH:
      case AG_PARAM_TOTAL_Q:
      case AG_PARAM_TOTAL_K:
      case AG_PARAM_ITEMS: acc.wide[r] = *(long long *)params[p]; break;
      case AG_PARAM_HEADS:
      case AG_PARAM_KV_HEADS: acc.wide[r] = *(int *)params[p]; break;
      case AG_PARAM_TMAP_Q:
      case AG_PARAM_TMAP_DOUT:
      case AG_PARAM_TMAP_K:
      case AG_PARAM_TMAP_V: break; /* tensor maps: the emulation reads the pointers */
      default: acc.ptr[r] = (void *)(uintptr_t) * (CUdeviceptr *)params[p];
    }
  }
  if (last) emulate(d->pass);
  return CUDA_SUCCESS;
}

typedef struct emu_kernel {
  ag_context ctx;
  ag_kernel kernel;
} emu_kernel;

static void emu_kernel_init(emu_kernel *e, const char *yaml) {
  memset(e, 0, sizeof *e);
  ag_error err = {0};
  ck_assert_msg(ag_spec_load_string(yaml, strlen(yaml), "emu.yaml", &e->kernel.spec, &err) == AG_OK,
                "%s", err.message ? err.message : "");
  ck_assert_int_eq(ag_plan_make(&e->kernel.spec, &e->kernel.plan, &err), AG_OK);
  memset(&emu_driver, 0, sizeof emu_driver);
  emu_driver.cuCtxPushCurrent = emu_push;
  emu_driver.cuCtxPopCurrent = emu_pop;
  emu_driver.cuCtxGetCurrent = emu_get_current;
  emu_driver.cuCtxSynchronize = emu_sync;
  emu_driver.cuMemAlloc = emu_alloc;
  emu_driver.cuMemFree = emu_free;
  emu_driver.cuMemcpyHtoD = emu_htod;
  emu_driver.cuMemcpyDtoH = emu_dtoh;
  emu_driver.cuMemsetD16 = emu_set16;
  emu_driver.cuMemsetD32 = emu_set32;
  emu_driver.cuLaunchKernel = emu_launch;
  e->ctx.drv = &emu_driver;
  e->ctx.sm_count = 132;
  e->kernel.ctx = &e->ctx;
  for (int i = 0; i < e->kernel.plan.nkernels; i++) {
    e->kernel.fn[i] = (CUfunction)(uintptr_t)(0x100 + i);
    e->kernel.ctas_per_sm[i] = 1;
  }
  emu = &e->kernel;
  skip_last_row = 0;
}

/* ---- the checks ------------------------------------------------------------------- */

typedef struct emu_case {
  const char *yaml;
  int64_t heads, kv_heads;
  bool cross;
} emu_case;

#define SPEC(dim, dtype, extra)                                                         \
  "name: emu\npattern: jagged\nhead_dim: " #dim "\ndtype: " #dtype "\narch: " \
  "sm_80\npasses: [forward, backward]\n" extra

static const emu_case cases[] = {
    {SPEC(64, bf16, "causal: true\n"), 4, 2, false},
    {SPEC(64, fp16, "window: [20, 3]\n"), 2, 2, true},
    {SPEC(128, bf16, "rotary:\n  layout: half\n  positions: sequence\n"), 2, 1, true},
    {SPEC(64, fp16, "causal: true\nrotary:\n  layout: interleaved\n  apply_to: [q, k, v]\n"), 2,
     2, false},
    {SPEC(64, bf16, "rotary:\n  layout: half\n"), 2, 2, true}, /* tables for q and for k */
};

/* Lengths: 0, 1, 149 more in 0..89 with the longest (130) in the middle,
 * and a last of 37 (keys, for cross-attention: 41, the others drawn apart). */
static void lengths(int32_t *lq, int32_t *lk, int n) {
  uint64_t rng = 12345;
  for (int i = 0; i < n; i++) {
    lq[i] = i < 2 ? i : (int32_t)(ag_rand_next(&rng) % 90);
    lk[i] = (int32_t)(ag_rand_next(&rng) % 90);
  }
  lq[n / 2] = lk[n / 2] = 130;
  lq[n - 1] = 37, lk[n - 1] = 41;
}

enum { N = 152 };

static ag_jagged_check_result run(const emu_case *c, double max_macs) {
  int32_t lq[N], lk[N];
  lengths(lq, lk, N);
  ag_jagged_check_options opt = {.seed = 7, .heads = c->heads, .kv_heads = c->kv_heads,
                                 .backward = true, .repeat_backward = 1,
                                 .max_ref_macs = max_macs};
  ag_jagged_check_result r;
  ag_error err = {0};
  ag_status st = ag_selfcheck_jagged((ag_kernel *)emu, lq, c->cross ? lk : NULL, N, &opt, &r, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message ? err.message : "");
  ag_error_clear(&err);
  return r;
}

/* Every case passes, with a budget that checks a handful of sequences
 * (the first, the longest, the last and what fits) and with one that
 * checks them all; the errors are rounding's. */
START_TEST(emulated_passes_are_correct) {
  const emu_case *c = &cases[_i];
  emu_kernel e;
  emu_kernel_init(&e, c->yaml);
  const ag_dtype dt = e.kernel.spec.dtype;
  for (int budget = 0; budget < 2; budget++) {
    const ag_jagged_check_result r = run(c, budget ? 1e12 : 2e6);
    ck_assert_int_eq(r.unwritten, 0);
    ck_assert_int_eq(r.lse_mismatch, 0);
    ck_assert_int_ge(r.checked_pairs, budget ? 2 * N - 2 : 6);
    if (!budget) ck_assert_int_lt(r.checked_pairs, 2 * N - 2);
    ck_assert_msg(r.rel_o > 0 && r.rel_o <= ag_jagged_tolerance(dt, false) / 4, "O %g", r.rel_o);
    ck_assert_double_le(r.lse_abs, 1e-3);
    const double tol = ag_jagged_tolerance(dt, true) / 4;
    ck_assert_msg(r.rel_dq > 0 && r.rel_dq <= tol && r.rel_dk > 0 && r.rel_dk <= tol &&
                      r.rel_dv > 0 && r.rel_dv <= tol,
                  "gradients %g %g %g", r.rel_dq, r.rel_dk, r.rel_dv);
    ck_assert(r.bitwise_repeatable);
    ck_assert_double_gt(r.fwd_flops, 0);
  }
}
END_TEST

/* A kernel of the backward alone gets O and lse from the reference for
 * every sequence, but its gradients are checked within the budget. */
START_TEST(backward_alone_keeps_its_budget) {
  emu_kernel e;
  emu_kernel_init(&e, "name: emu\npattern: jagged\nhead_dim: 64\ndtype: bf16\narch: sm_80\n"
                      "causal: true\npasses: [backward]\n");
  const emu_case c = {NULL, 4, 2, false};
  ag_jagged_check_result r = run(&c, 2e6);
  ck_assert_int_eq(r.unwritten, 0);
  ck_assert_int_ge(r.checked_grad_pairs, 6);
  ck_assert_int_lt(r.checked_grad_pairs, 2 * N - 2);
  const double tol = ag_jagged_tolerance(AG_DTYPE_BF16, true) / 4;
  ck_assert(r.rel_dq > 0 && r.rel_dq <= tol && r.rel_dk <= tol && r.rel_dv <= tol);
  r = run(&c, 1e12);
  ck_assert_int_ge(r.checked_grad_pairs, 2 * N - 2);
}
END_TEST

/* The last sequence is always checked: its last row left unwritten, in O
 * and in dK, is found even when the budget checks only a few sequences. */
START_TEST(last_sequence_is_checked) {
  emu_kernel e;
  emu_kernel_init(&e, cases[0].yaml);
  skip_last_row = 1;
  const ag_jagged_check_result r = run(&cases[0], 2e6);
  ck_assert_int_eq(r.unwritten, 64 + 64); /* one head's row of O, one of dK */
}
END_TEST

/* The threaded fills (fill.h) give each element its counter-based value
 * whatever the slice or the thread: a fill from element `at` equals the
 * values one at a time, two fills of parts equal one of the whole, inputs
 * at scale 0.5 lie in [-1, 1] (rounded), and a table's sine and cosine of one pair
 * are of one angle. */
START_TEST(fills_are_counter_based) {
  enum { COUNT = (1 << 20) + 37, DIM = 64 };
  uint16_t *a = malloc(2 * COUNT), *b = malloc(2 * COUNT);
  ck_assert(a && b);
  for (int dt = 0; dt < 2; dt++) {
    const ag_dtype d = dt ? AG_DTYPE_FP16 : AG_DTYPE_BF16;
    ag_fill_inputs(a, d, 7, 2, 0.5f, 1000, COUNT);
    ag_fill_inputs(b, d, 7, 2, 0.5f, 1000, COUNT / 3);
    ag_fill_inputs(b + COUNT / 3, d, 7, 2, 0.5f, 1000 + COUNT / 3, COUNT - COUNT / 3);
    ck_assert(memcmp(a, b, 2 * COUNT) == 0);
    for (uint64_t i = 0; i < COUNT; i += 4099) {
      ck_assert_uint_eq(a[i], ag_float_to_half(d, ag_input_value(7, 2, 1000 + i) * 0.5f));
      const float x = ag_half_to_float(d, a[i]);
      ck_assert(x >= -1.0f && x <= 1.0f); /* 1 once rounded */
    }
    ag_fill_inputs(b, d, 8, 2, 0.5f, 1000, COUNT); /* another seed: other values */
    ck_assert(memcmp(a, b, 2 * COUNT) != 0);
    ag_fill_table(a, d, 7, 9, DIM, 0, COUNT);
    for (uint64_t i = 0; i < COUNT; i += 997) {
      const uint64_t t = i / DIM;
      const int col = (int)(i % DIM);
      ck_assert_uint_eq(a[i], ag_table_value(7, 9, d, DIM, t, col));
      const int s = col % (DIM / 2);
      const double sn = ag_half_to_float(d, ag_table_value(7, 9, d, DIM, t, s));
      const double cs = ag_half_to_float(d, ag_table_value(7, 9, d, DIM, t, s + DIM / 2));
      ck_assert_double_eq_tol(sn * sn + cs * cs, 1.0, 2e-2);
    }
  }
  free(a);
  free(b);
}
END_TEST

Suite *selfcheck_suite(void) {
  Suite *s = suite_create("selfcheck");
  TCase *tc = tcase_create("selfcheck_jagged");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, emulated_passes_are_correct, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, last_sequence_is_checked);
  tcase_add_test(tc, backward_alone_keeps_its_budget);
  tcase_add_test(tc, fills_are_counter_based);
  suite_add_tcase(s, tc);
  return s;
}
