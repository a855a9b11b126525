// SPDX-License-Identifier: BSD-3-Clause
/* check_compile.c: every block size the spec format accepts (16..256 in
 * steps of 16) at both head dims compiles with NVRTC for sm_90a, so no valid
 * spec can end in a compile error (uneven warp/job splits, tile loads that
 * do not divide evenly). Needs no GPU. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attngen.h"

START_TEST(test_every_block_size_compiles) {
  setenv("ATTNGEN_CACHE_DISABLE", "1", 1);
  int block = 16 * (1 + _i / 2), dim = _i % 2 ? 128 : 64;
  char yaml[256];
  snprintf(yaml, sizeof yaml,
           "name: every\npattern: block_diagonal\nblock_size: %d\nhead_dim: %d\n"
           "dtype: %s\ncausal: %s\n",
           block, dim, _i % 4 < 2 ? "bf16" : "fp16", _i % 3 ? "false" : "true");
  ag_spec spec;
  ag_error err = {0};
  ck_assert_msg(ag_spec_load_string(yaml, strlen(yaml), NULL, &spec, &err) == AG_OK, "%s",
                err.message);
  void *cubin = NULL;
  size_t size = 0;
  ag_status st = ag_compile(&spec, "sm_90a", &cubin, &size, &err);
  ck_assert_msg(st == AG_OK, "block %d, head_dim %d: %s", block, dim, err.message);
  ck_assert_uint_gt(size, 4);
  ck_assert_int_eq(memcmp(cubin, "\177ELF", 4), 0);
  free(cubin);
}
END_TEST

Suite *compile_suite(void) {
  Suite *s = suite_create("compile");
  TCase *tc = tcase_create("compile");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_every_block_size_compiles, 0, 32);
  suite_add_tcase(s, tc);
  return s;
}
