/* check_reference.c: the float64 CPU reference itself. The backward is
 * checked against central finite differences of the forward on tiny shapes
 * (several blocks, partial blocks, an empty sequence, two heads, causal or
 * not), and the 16-bit entry points against the float64 ones. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"

/* Lengths 5, 0, 3, 9 with 4-token blocks: full blocks, partial last blocks,
 * a sequence shorter than a block and an empty one. */
enum { BATCH = 4, TOTAL = 17, HEADS = 2, DIM = 3, BLOCK = 4, ELEMS = TOTAL * HEADS * DIM };
static const int32_t offsets[BATCH + 1] = {0, 5, 5, 8, 17};
static const double scale = 0.7;

static void fill(double *x, size_t n, uint64_t *rng) {
  for (size_t i = 0; i < n; i++) x[i] = ag_rand_uniform(rng, -2, 2);
}

/* L = sum(O (.) G): its gradient with respect to O is G. */
static double loss(bool causal, const double *q, const double *k, const double *v,
                   const double *g) {
  double o[ELEMS], l = 0;
  ag_ref_block_forward_f64(BLOCK, causal, scale, q, k, v, offsets, BATCH, HEADS, DIM, o);
  for (int e = 0; e < ELEMS; e++) l += o[e] * g[e];
  return l;
}

START_TEST(backward_matches_finite_differences) {
  const bool causal = _i;
  uint64_t rng = 12345 + (uint64_t)_i;
  double in[4][ELEMS], grad[3][ELEMS];
  for (int m = 0; m < 4; m++) fill(in[m], ELEMS, &rng);
  ag_ref_block_backward_f64(BLOCK, causal, scale, in[0], in[1], in[2], in[3], offsets, BATCH,
                            HEADS, DIM, grad[0], grad[1], grad[2]);
  const char *names[3] = {"dq", "dk", "dv"};
  const double h = 1e-5;
  double worst = 0;
  for (int m = 0; m < 3; m++)
    for (int e = 0; e < ELEMS; e++) {
      double x = in[m][e];
      in[m][e] = x + h;
      double up = loss(causal, in[0], in[1], in[2], in[3]);
      in[m][e] = x - h;
      double down = loss(causal, in[0], in[1], in[2], in[3]);
      in[m][e] = x;
      double fd = (up - down) / (2 * h), err = fabs(fd - grad[m][e]) / (1 + fabs(fd));
      if (err > worst) worst = err;
      ck_assert_msg(err < 1e-7, "%s[%d]: backward %.12g, finite difference %.12g", names[m], e,
                    grad[m][e], fd);
    }
  /* The first token of each sequence sees only itself when causal: its
   * softmax is constant, so its dq is exactly zero. */
  if (causal)
    for (int d = 0; d < DIM; d++) ck_assert_double_eq(grad[0][8 * HEADS * DIM + d], 0);
  printf("reference backward%s: worst relative gap to finite differences %.2e\n",
         causal ? " (causal)" : "", worst);
}
END_TEST

/* The 16-bit entry points compute exactly what the float64 ones do on the
 * same (converted) values. */
START_TEST(half_inputs_match_f64) {
  const bool causal = _i;
  const ag_dtype dtype = _i ? AG_DTYPE_FP16 : AG_DTYPE_BF16;
  uint64_t rng = 777;
  uint16_t half[4][ELEMS];
  double f64[4][ELEMS], a[3][ELEMS], b[3][ELEMS];
  for (int m = 0; m < 4; m++)
    for (int e = 0; e < ELEMS; e++) {
      half[m][e] = ag_float_to_half(dtype, (float)ag_rand_uniform(&rng, -2, 2));
      f64[m][e] = ag_half_to_float(dtype, half[m][e]);
    }
  ag_ref_block_forward(dtype, BLOCK, causal, scale, half[0], half[1], half[2], offsets, BATCH,
                       HEADS, DIM, a[0]);
  ag_ref_block_forward_f64(BLOCK, causal, scale, f64[0], f64[1], f64[2], offsets, BATCH, HEADS,
                           DIM, b[0]);
  ck_assert_int_eq(memcmp(a[0], b[0], sizeof a[0]), 0);
  ag_ref_block_backward(dtype, BLOCK, causal, scale, half[0], half[1], half[2], half[3], offsets,
                        BATCH, HEADS, DIM, a[0], a[1], a[2]);
  ag_ref_block_backward_f64(BLOCK, causal, scale, f64[0], f64[1], f64[2], f64[3], offsets, BATCH,
                            HEADS, DIM, b[0], b[1], b[2]);
  ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
}
END_TEST

/* Two facts that hold exactly: each row of dS sums to zero, so without a
 * causal mask the dK rows of one block sum to zero; and dV sums, over the
 * keys of a block, to the sum of dO over its queries (P's rows sum to 1). */
START_TEST(backward_identities) {
  uint64_t rng = 99;
  double in[4][ELEMS], grad[3][ELEMS];
  for (int m = 0; m < 4; m++) fill(in[m], ELEMS, &rng);
  ag_ref_block_backward_f64(BLOCK, false, scale, in[0], in[1], in[2], in[3], offsets, BATCH,
                            HEADS, DIM, grad[0], grad[1], grad[2]);
  for (int b = 0; b < BATCH; b++)
    for (int t0 = offsets[b]; t0 < offsets[b + 1]; t0 += BLOCK) {
      int end = offsets[b + 1] < t0 + BLOCK ? offsets[b + 1] : t0 + BLOCK;
      for (int h = 0; h < HEADS; h++)
        for (int d = 0; d < DIM; d++) {
          double dk = 0, dv = 0, dout = 0;
          for (int t = t0; t < end; t++) {
            int e = (t * HEADS + h) * DIM + d;
            dk += grad[1][e];
            dv += grad[2][e];
            dout += in[3][e];
          }
          ck_assert_double_le(fabs(dk), 1e-12);
          ck_assert_double_le(fabs(dv - dout), 1e-12);
        }
    }
}
END_TEST

Suite *reference_suite(void) {
  Suite *s = suite_create("reference");
  TCase *tc = tcase_create("reference");
  tcase_add_loop_test(tc, backward_matches_finite_differences, 0, 2);
  tcase_add_loop_test(tc, half_inputs_match_f64, 0, 2);
  tcase_add_test(tc, backward_identities);
  suite_add_tcase(s, tc);
  return s;
}
