// SPDX-License-Identifier: BSD-3-Clause
/* check_reference.c: the float64 CPU reference itself. The backward is
 * checked against central finite differences of the forward on tiny shapes
 * (several blocks, partial blocks, an empty sequence, two heads, causal or
 * not), and the 16-bit entry points against the float64 ones. With rotary
 * embeddings (both layouts, the three position modes), the chained
 * gradients against finite differences of rotation-then-attention with
 * respect to the unrotated inputs, and the rotation against facts that
 * hold exactly. */
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

/* ---- rotary embeddings ----------------------------------------------------
 * Head dim 6 (three pairs: interleaved (0,1) (2,3) (4,5), half (0,3) (1,4)
 * (2,5)) on the same sequences and blocks. */
enum { RDIM = 6, RELEMS = TOTAL * HEADS * RDIM };

/* A table of sines and cosines of random angles, rounded to bf16 as a
 * caller's 16-bit table is (so not exactly orthogonal). */
static void fill_table(double *table, uint64_t *rng) {
  for (int t = 0; t < TOTAL; t++)
    for (int i = 0; i < RDIM / 2; i++) {
      double a = ag_rand_uniform(rng, -M_PI, M_PI);
      table[t * RDIM + i] = ag_bf16_to_float(ag_float_to_bf16((float)sin(a)));
      table[t * RDIM + RDIM / 2 + i] = ag_bf16_to_float(ag_float_to_bf16((float)cos(a)));
    }
}

static double rotary_loss(const ag_ref_rotary *rot, bool causal, const double *q,
                          const double *k, const double *v, const double *g) {
  double o[RELEMS], l = 0;
  ag_ref_block_forward_rotary_f64(rot, BLOCK, causal, scale, q, k, v, offsets, BATCH, HEADS, RDIM,
                                  o);
  for (int e = 0; e < RELEMS; e++) l += o[e] * g[e];
  return l;
}

/* Loop index: layout (bit 0), positions ((i / 2) % 3), apply_to q, k (i < 6)
 * or q, k, v, causal on some of each. */
START_TEST(rotary_backward_matches_finite_differences) {
  static const char *const layout_names[] = {"interleaved", "half"};
  static const char *const position_names[] = {"table", "sequence", "block"};
  uint64_t rng = 4242 + (uint64_t)_i;
  double table[TOTAL * RDIM];
  fill_table(table, &rng);
  ag_ref_rotary rot = {_i % 2 ? AG_ROTARY_HALF : AG_ROTARY_INTERLEAVED,
                       _i < 6 ? AG_APPLY_Q | AG_APPLY_K : AG_APPLY_Q | AG_APPLY_K | AG_APPLY_V,
                       (ag_rotary_positions)((_i / 2) % 3), 10.0, BLOCK, table};
  const bool causal = _i % 4 == 1 || _i % 4 == 2;
  double in[4][RELEMS], grad[3][RELEMS], plain[3][RELEMS];
  for (int m = 0; m < 4; m++) fill(in[m], RELEMS, &rng);
  ag_ref_block_backward_rotary_f64(&rot, BLOCK, causal, scale, in[0], in[1], in[2], in[3],
                                   offsets, BATCH, HEADS, RDIM, grad[0], grad[1], grad[2]);
  const char *names[3] = {"dq", "dk", "dv"};
  const double h = 1e-5;
  double worst = 0;
  for (int m = 0; m < 3; m++)
    for (int e = 0; e < RELEMS; e++) {
      double x = in[m][e];
      in[m][e] = x + h;
      double up = rotary_loss(&rot, causal, in[0], in[1], in[2], in[3]);
      in[m][e] = x - h;
      double down = rotary_loss(&rot, causal, in[0], in[1], in[2], in[3]);
      in[m][e] = x;
      double fd = (up - down) / (2 * h), err = fabs(fd - grad[m][e]) / (1 + fabs(fd));
      if (err > worst) worst = err;
      ck_assert_msg(err < 1e-7, "%s[%d]: backward %.12g, finite difference %.12g", names[m], e,
                    grad[m][e], fd);
    }
  /* The rotation matters: the gradients differ from attention's without it
   * (V's only when V is rotated). */
  ag_ref_block_backward_f64(BLOCK, causal, scale, in[0], in[1], in[2], in[3], offsets, BATCH,
                            HEADS, RDIM, plain[0], plain[1], plain[2]);
  for (int m = 0; m < 3; m++) {
    double diff = 0;
    for (int e = 0; e < RELEMS; e++) diff = fmax(diff, fabs(grad[m][e] - plain[m][e]));
    if (m < 2 || (rot.apply_to & AG_APPLY_V)) ck_assert_double_gt(diff, 1e-3);
  }
  printf("reference rotary backward (%s, %s, %s%s): worst relative gap to finite differences "
         "%.2e\n",
         layout_names[_i % 2], position_names[(_i / 2) % 3], _i < 6 ? "q k" : "q k v",
         causal ? ", causal" : "", worst);
}
END_TEST

/* The rotation itself: the inverse undoes it; each pair keeps its length
 * (computed angles); the half layout is the interleaved one on permuted
 * dims; positions start at 0 at each sequence (and block) start; and one
 * angle by hand. */
START_TEST(rotary_rotation_facts) {
  uint64_t rng = 31337;
  double x[RELEMS], y[RELEMS], z[RELEMS], table[TOTAL * RDIM];
  fill(x, RELEMS, &rng);
  /* An exactly orthogonal table, for the round trip. */
  for (int t = 0; t < TOTAL; t++)
    for (int i = 0; i < RDIM / 2; i++) {
      double a = ag_rand_uniform(&rng, -M_PI, M_PI);
      table[t * RDIM + i] = sin(a);
      table[t * RDIM + RDIM / 2 + i] = cos(a);
    }
  for (int layout = 0; layout < 2; layout++)
    for (int pos = 0; pos < 3; pos++) {
      ag_ref_rotary rot = {layout ? AG_ROTARY_HALF : AG_ROTARY_INTERLEAVED, AG_APPLY_Q,
                           (ag_rotary_positions)pos, 10000.0, BLOCK, table};
      memcpy(y, x, sizeof x);
      ag_ref_rotary_apply(&rot, false, offsets, BATCH, HEADS, RDIM, y);
      memcpy(z, y, sizeof y);
      ag_ref_rotary_apply(&rot, true, offsets, BATCH, HEADS, RDIM, z);
      for (int e = 0; e < RELEMS; e++) ck_assert_double_eq_tol(z[e], x[e], 1e-14);
      /* Pair lengths kept. */
      for (int t = 0; t < TOTAL; t++)
        for (int h = 0; h < HEADS; h++)
          for (int i = 0; i < RDIM / 2; i++) {
            int base = (t * HEADS + h) * RDIM;
            int a = base + (layout ? i : 2 * i), b = base + (layout ? i + RDIM / 2 : 2 * i + 1);
            ck_assert_double_eq_tol(x[a] * x[a] + x[b] * x[b], y[a] * y[a] + y[b] * y[b], 1e-13);
          }
    }
  /* Half = interleaved with dim 2i <-> i, 2i + 1 <-> i + D/2. */
  ag_ref_rotary half = {AG_ROTARY_HALF, AG_APPLY_Q, AG_POSITIONS_SEQUENCE, 7.0, BLOCK, NULL};
  ag_ref_rotary inter = half;
  inter.layout = AG_ROTARY_INTERLEAVED;
  for (int r = 0; r < TOTAL * HEADS; r++)
    for (int i = 0; i < RDIM / 2; i++) {
      y[r * RDIM + i] = x[r * RDIM + 2 * i];
      y[r * RDIM + RDIM / 2 + i] = x[r * RDIM + 2 * i + 1];
    }
  memcpy(z, x, sizeof x);
  ag_ref_rotary_apply(&inter, false, offsets, BATCH, HEADS, RDIM, z);
  ag_ref_rotary_apply(&half, false, offsets, BATCH, HEADS, RDIM, y);
  for (int r = 0; r < TOTAL * HEADS; r++)
    for (int i = 0; i < RDIM / 2; i++) {
      ck_assert_double_eq_tol(y[r * RDIM + i], z[r * RDIM + 2 * i], 1e-15);
      ck_assert_double_eq_tol(y[r * RDIM + RDIM / 2 + i], z[r * RDIM + 2 * i + 1], 1e-15);
    }
  /* Positions: the first token of every sequence (sequence positions) or
   * of every block (block positions; blocks of 4 from each sequence's
   * start) is not rotated; token 13, index 5 of the sequence starting at 8,
   * is at position 5, or 1 in its block. */
  static const int seq_starts[] = {0, 5, 8}, block_starts[] = {0, 4, 5, 8, 12, 16};
  for (int pos = 1; pos < 3; pos++) {
    ag_ref_rotary rot = {AG_ROTARY_INTERLEAVED, AG_APPLY_Q, (ag_rotary_positions)pos, 10000.0,
                         BLOCK, NULL};
    memcpy(y, x, sizeof x);
    ag_ref_rotary_apply(&rot, false, offsets, BATCH, HEADS, RDIM, y);
    const bool by_block = pos == AG_POSITIONS_BLOCK;
    const int *starts = by_block ? block_starts : seq_starts, nstarts = by_block ? 6 : 3;
    for (int f = 0; f < nstarts; f++)
      for (int e = starts[f] * HEADS * RDIM; e < (starts[f] + 1) * HEADS * RDIM; e++)
        ck_assert_double_eq(y[e], x[e]);
    /* Pair 1 of head 1 of token 13: angle p * 10000^(-2/6). */
    const int t = 13, h = 1, i = 1, p = pos == AG_POSITIONS_SEQUENCE ? 5 : 1;
    const double a = p * pow(10000.0, -2.0 / 6), s = sin(a), c = cos(a);
    const int e = (t * HEADS + h) * RDIM + 2 * i;
    ck_assert_double_eq_tol(y[e], x[e] * c - x[e + 1] * s, 1e-15);
    ck_assert_double_eq_tol(y[e + 1], x[e] * s + x[e + 1] * c, 1e-15);
  }
  /* A table: sin from column i, cos from column D/2 + i, as given. */
  ag_ref_rotary rot = {AG_ROTARY_HALF, AG_APPLY_Q, AG_POSITIONS_TABLE, 0, BLOCK, table};
  memcpy(y, x, sizeof x);
  ag_ref_rotary_apply(&rot, false, offsets, BATCH, HEADS, RDIM, y);
  const int t = 9, h = 0, i = 2, e = (t * HEADS + h) * RDIM + i;
  const double s = table[t * RDIM + i], c = table[t * RDIM + RDIM / 2 + i];
  ck_assert_double_eq_tol(y[e], x[e] * c - x[e + RDIM / 2] * s, 1e-15);
  ck_assert_double_eq_tol(y[e + RDIM / 2], x[e] * s + x[e + RDIM / 2] * c, 1e-15);
}
END_TEST

/* Rotary embeddings applied to nothing, or absent, leave attention as it
 * is, bit for bit. */
START_TEST(rotary_nothing_is_plain_attention) {
  uint64_t rng = 5;
  double in[4][RELEMS], a[3][RELEMS], b[3][RELEMS];
  for (int m = 0; m < 4; m++) fill(in[m], RELEMS, &rng);
  ag_ref_rotary none = {AG_ROTARY_NONE, AG_APPLY_Q | AG_APPLY_K, AG_POSITIONS_SEQUENCE, 10.0,
                        BLOCK, NULL};
  ag_ref_rotary empty = {AG_ROTARY_HALF, 0, AG_POSITIONS_SEQUENCE, 10.0, BLOCK, NULL};
  ag_ref_block_forward_f64(BLOCK, true, scale, in[0], in[1], in[2], offsets, BATCH, HEADS, RDIM,
                           b[0]);
  ag_ref_block_forward_rotary_f64(&none, BLOCK, true, scale, in[0], in[1], in[2], offsets, BATCH,
                                  HEADS, RDIM, a[0]);
  ck_assert_int_eq(memcmp(a[0], b[0], sizeof a[0]), 0);
  ag_ref_block_backward_f64(BLOCK, false, scale, in[0], in[1], in[2], in[3], offsets, BATCH,
                            HEADS, RDIM, b[0], b[1], b[2]);
  ag_ref_block_backward_rotary_f64(&empty, BLOCK, false, scale, in[0], in[1], in[2], in[3],
                                   offsets, BATCH, HEADS, RDIM, a[0], a[1], a[2]);
  ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
}
END_TEST

Suite *reference_suite(void) {
  Suite *s = suite_create("reference");
  TCase *tc = tcase_create("reference");
  tcase_add_loop_test(tc, backward_matches_finite_differences, 0, 2);
  tcase_add_loop_test(tc, half_inputs_match_f64, 0, 2);
  tcase_add_test(tc, backward_identities);
  tcase_add_loop_test(tc, rotary_backward_matches_finite_differences, 0, 12);
  tcase_add_test(tc, rotary_rotation_facts);
  tcase_add_test(tc, rotary_nothing_is_plain_attention);
  suite_add_tcase(s, tc);
  return s;
}
