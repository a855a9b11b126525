// SPDX-License-Identifier: BSD-3-Clause
/* check_spec.c: tests of the spec front end (ag_spec_load_*): golden error
 * messages for invalid specs in spec_errors/ (NAME.yaml and the exact text
 * NAME.err), every field and default of valid specs, I/O and size limits.
 * Runs from tests/; AG_UPDATE_GOLDENS=1 rewrites the .err files. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attngen.h"
#include "util.h"

/* ---- helpers --------------------------------------------------------------- */

/* Load a spec from a string named "<string>"; err is cleared first. */
static ag_status load(const char *yaml, ag_spec *spec, ag_error *err) {
  ag_error_clear(err);
  return ag_spec_load_string(yaml, strlen(yaml), NULL, spec, err);
}

/* Load a spec that must be valid and supported. */
static ag_spec load_ok(const char *yaml) {
  ag_spec spec;
  ag_error err = {0};
  ag_status st = load(yaml, &spec, &err);
  ck_assert_msg(st == AG_OK, "status %s:\n%s", ag_strerror(st),
                err.message ? err.message : "");
  ck_assert_ptr_null(err.message);
  return spec;
}

#define ck_assert_pos(p, l, c)      \
  do {                              \
    ck_assert_int_eq((p).line, (l)); \
    ck_assert_int_eq((p).col, (c));  \
  } while (0)

/* ---- golden error messages ----------------------------------------------------- */

static const struct golden {
  const char *name;
  ag_status status;
} goldens[] = {
    {"alias_bomb", AG_ERR_SPEC},
    {"alias_value", AG_ERR_SPEC},
    {"apply_to_bad_entry", AG_ERR_SPEC},
    {"apply_to_duplicate", AG_ERR_SPEC},
    {"apply_to_empty", AG_ERR_SPEC},
    {"apply_to_not_list", AG_ERR_SPEC},
    {"bad_enums", AG_ERR_SPEC},
    {"base_with_default_positions", AG_ERR_SPEC},
    {"base_with_table_positions", AG_ERR_SPEC},
    {"binary_png", AG_ERR_SPEC},
    {"block_size_not_integer", AG_ERR_SPEC},
    {"block_size_range", AG_ERR_SPEC},
    {"block_size_too_big", AG_ERR_SPEC},
    {"block_size_with_jagged", AG_ERR_SPEC},
    {"broadcast_with_block_diagonal", AG_ERR_SPEC},
    {"causal_yes", AG_ERR_SPEC},
    {"control_char", AG_ERR_SPEC},
    {"crlf_line_ends", AG_ERR_SPEC},
    {"dtype_fp32", AG_ERR_SPEC},
    {"duplicate_key", AG_ERR_SPEC},
    {"duplicate_rotary_key", AG_ERR_SPEC},
    {"empty_comments_only", AG_ERR_SPEC},
    {"empty_document", AG_ERR_SPEC},
    {"empty_file", AG_ERR_SPEC},
    {"empty_value", AG_ERR_SPEC},
    {"explicit_tag", AG_ERR_SPEC},
    {"head_dim_96", AG_ERR_SPEC},
    {"head_dim_quoted", AG_ERR_SPEC},
    {"integer_overflow", AG_ERR_SPEC},
    {"invalid_utf8", AG_ERR_SPEC},
    {"jagged_with_error", AG_ERR_SPEC},
    {"list_for_scalar", AG_ERR_SPEC},
    {"long_line", AG_ERR_SPEC},
    {"many_errors_in_order", AG_ERR_SPEC},
    {"missing_required", AG_ERR_SPEC},
    {"missing_rotary_layout", AG_ERR_SPEC},
    {"name_bad", AG_ERR_SPEC},
    {"name_too_long", AG_ERR_SPEC},
    {"non_string_key", AG_ERR_SPEC},
    {"nul_byte", AG_ERR_SPEC},
    {"passes_bad_entry", AG_ERR_SPEC},
    {"passes_duplicate", AG_ERR_SPEC},
    {"passes_empty", AG_ERR_SPEC},
    {"passes_not_list", AG_ERR_SPEC},
    {"positions_block_with_jagged", AG_ERR_SPEC},
    {"quoted_key_value", AG_ERR_SPEC},
    {"rotary_bad_values", AG_ERR_SPEC},
    {"rotary_base_bad", AG_ERR_SPEC},
    {"rotary_not_mapping", AG_ERR_SPEC},
    {"row_strides_chunked_backward", AG_ERR_UNSUPPORTED},
    {"row_strides_jagged", AG_ERR_SPEC},
    {"row_strides_not_bool", AG_ERR_SPEC},
    {"softmax_scale_inf", AG_ERR_SPEC},
    {"softmax_scale_nan", AG_ERR_SPEC},
    {"softmax_scale_negative", AG_ERR_SPEC},
    {"softmax_scale_text", AG_ERR_SPEC},
    {"softmax_scale_zero", AG_ERR_SPEC},
    {"syntax_bad_indent", AG_ERR_SPEC},
    {"syntax_unclosed_flow", AG_ERR_SPEC},
    {"syntax_unclosed_quote", AG_ERR_SPEC},
    {"tab_first_line", AG_ERR_SPEC},
    {"tab_indent", AG_ERR_SPEC},
    {"too_deep", AG_ERR_SPEC},
    {"too_many_errors", AG_ERR_SPEC},
    {"top_level_list", AG_ERR_SPEC},
    {"top_level_scalar", AG_ERR_SPEC},
    {"two_documents", AG_ERR_SPEC},
    {"unknown_key", AG_ERR_SPEC},
    {"unknown_key_no_hint", AG_ERR_SPEC},
    {"unknown_keys_every_hint", AG_ERR_SPEC},
    {"unknown_rotary_keys", AG_ERR_SPEC},
    {"unsupported_rotary_base", AG_ERR_UNSUPPORTED},
    {"unsupported_rotary_base_backward", AG_ERR_UNSUPPORTED},
    {"unsupported_rotary_table_block_size", AG_ERR_UNSUPPORTED},
    {"utf8_before_error", AG_ERR_SPEC},
    {"utf8_bom", AG_ERR_SPEC},
    {"window_bad_entries", AG_ERR_SPEC},
    {"window_negative", AG_ERR_SPEC},
    {"window_not_list", AG_ERR_SPEC},
    {"window_three", AG_ERR_SPEC},
    {"window_with_block_diagonal", AG_ERR_SPEC},
};
#define N_GOLDENS (int)(sizeof goldens / sizeof goldens[0])

START_TEST(test_golden) {
  const struct golden *g = &goldens[_i];
  char yaml[256], expected_path[256];
  snprintf(yaml, sizeof yaml, "spec_errors/%s.yaml", g->name);
  snprintf(expected_path, sizeof expected_path, "spec_errors/%s.err", g->name);
  ag_spec spec;
  ag_error err = {0};
  ag_status st = ag_spec_load_file(yaml, &spec, &err);
  ck_assert_ptr_nonnull(err.message);
  ck_assert_int_eq(err.code, st);
  if (ag_test_update_goldens()) ag_test_spit(expected_path, err.message, strlen(err.message));
  char *expected = ag_test_slurp(expected_path, NULL);
  ck_assert_msg(expected != NULL, "%s is missing; got:\n%s", expected_path, err.message);
  ck_assert_msg(strcmp(err.message, expected) == 0, "%s: got:\n%s\nexpected:\n%s", g->name,
                err.message, expected);
  ck_assert_msg(st == g->status, "%s: status %s, expected %s", g->name, ag_strerror(st),
                ag_strerror(g->status));
  free(expected);
  ag_error_clear(&err);
}
END_TEST

/* Every .yaml under spec_errors/ is in the table and has its .err. */
START_TEST(test_golden_dir_complete) {
  DIR *dir = opendir("spec_errors");
  ck_assert_ptr_nonnull(dir);
  int seen = 0;
  struct dirent *e;
  while ((e = readdir(dir))) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 5, ".yaml") != 0) continue;
    bool listed = false;
    for (int i = 0; i < N_GOLDENS; i++)
      listed = listed || (strlen(goldens[i].name) == n - 5 &&
                          strncmp(goldens[i].name, e->d_name, n - 5) == 0);
    ck_assert_msg(listed, "spec_errors/%s is not in the golden table", e->d_name);
    seen++;
  }
  closedir(dir);
  ck_assert_int_eq(seen, N_GOLDENS);
  ck_assert_int_ge(N_GOLDENS, 30);
}
END_TEST

/* ---- valid specs ------------------------------------------------------------------- */

START_TEST(test_minimal_defaults) {
  ag_spec s = load_ok("name: ads_block64_d128\n"
                      "pattern: block_diagonal\n"
                      "head_dim: 128\n"
                      "dtype: bf16\n");
  ck_assert_str_eq(s.source, "<string>");
  ck_assert_str_eq(s.name, "ads_block64_d128");
  ck_assert_int_eq(s.pattern, AG_PATTERN_BLOCK_DIAGONAL);
  ck_assert_int_eq(s.block_size, 64);
  ck_assert(!s.causal);
  ck_assert(!s.has_window);
  ck_assert_int_eq(s.window_left, 0);
  ck_assert_int_eq(s.window_right, 0);
  ck_assert_int_eq(s.query, AG_QUERY_PER_SEQUENCE);
  ck_assert_int_eq(s.head_dim, 128);
  ck_assert_int_eq(s.dtype, AG_DTYPE_BF16);
  ck_assert(s.softmax_scale == 0.0);
  ck_assert_int_eq(s.rotary.layout, AG_ROTARY_NONE);
  ck_assert_uint_eq(s.rotary.apply_to, 0);
  ck_assert_uint_eq(s.passes, AG_PASS_FORWARD);
  ck_assert_int_eq(s.arch, AG_ARCH_AUTO);
  ck_assert_pos(s.at.name, 1, 1);
  ck_assert_pos(s.at.pattern, 2, 1);
  ck_assert_pos(s.at.head_dim, 3, 1);
  ck_assert_pos(s.at.dtype, 4, 1);
  ck_assert_pos(s.at.block_size, 0, 0);
  ck_assert_pos(s.at.causal, 0, 0);
  ck_assert_pos(s.at.window, 0, 0);
  ck_assert_pos(s.at.query, 0, 0);
  ck_assert_pos(s.at.softmax_scale, 0, 0);
  ck_assert_pos(s.at.rotary, 0, 0);
  ck_assert_pos(s.at.passes, 0, 0);
  ck_assert_pos(s.at.arch, 0, 0);
  ck_assert_double_eq_tol(ag_spec_scale(&s), 1.0 / sqrt(128.0), 1e-15);
}
END_TEST

START_TEST(test_every_block_diagonal_key) {
  ag_spec s = load_ok("# every key block_diagonal supports\n"
                      "name: b128_d64_fp16_causal\n"
                      "pattern: block_diagonal\n"
                      "block_size: 128\n"
                      "causal: true\n"
                      "query: per_sequence\n"
                      "head_dim: 64\n"
                      "dtype: fp16\n"
                      "softmax_scale: 0.125\n"
                      "passes: [forward]\n"
                      "arch: sm_90a\n");
  ck_assert_str_eq(s.name, "b128_d64_fp16_causal");
  ck_assert_int_eq(s.block_size, 128);
  ck_assert(s.causal);
  ck_assert_int_eq(s.query, AG_QUERY_PER_SEQUENCE);
  ck_assert_int_eq(s.head_dim, 64);
  ck_assert_int_eq(s.dtype, AG_DTYPE_FP16);
  ck_assert(s.softmax_scale == 0.125);
  ck_assert_double_eq(ag_spec_scale(&s), 0.125);
  ck_assert_uint_eq(s.passes, AG_PASS_FORWARD);
  ck_assert_int_eq(s.arch, AG_ARCH_SM90A);
  ck_assert_int_eq(s.rotary.layout, AG_ROTARY_NONE);
  ck_assert_pos(s.at.name, 2, 1);
  ck_assert_pos(s.at.block_size, 4, 1);
  ck_assert_pos(s.at.causal, 5, 1);
  ck_assert_pos(s.at.query, 6, 1);
  ck_assert_pos(s.at.softmax_scale, 9, 1);
  ck_assert_pos(s.at.passes, 10, 1);
  ck_assert_pos(s.at.arch, 11, 1);
}
END_TEST

/* Flow style, quoted strings for string values, other values and limits. */
START_TEST(test_other_values) {
  ag_spec s = load_ok("{name: \"x\", 'pattern': block_diagonal, head_dim: 64, dtype: 'bf16',\n"
                      " block_size: 16, causal: false, softmax_scale: \"auto\", arch: sm_80}");
  ck_assert_str_eq(s.name, "x");
  ck_assert_int_eq(s.block_size, 16);
  ck_assert(!s.causal);
  ck_assert(s.softmax_scale == 0.0);
  ck_assert_double_eq_tol(ag_spec_scale(&s), 0.125, 1e-15);
  ck_assert_int_eq(s.arch, AG_ARCH_SM80);
  ck_assert_pos(s.at.name, 1, 2);
  ck_assert_pos(s.at.block_size, 2, 2);

  s = load_ok("name: a_name_of_exactly_forty_eight_characters_0000000\n"
              "pattern: block_diagonal\nhead_dim: 128\ndtype: bf16\n"
              "block_size: 256\nsoftmax_scale: 1e-2\narch: auto\n");
  ck_assert_uint_eq(strlen(s.name), 48);
  ck_assert_int_eq(s.block_size, 256);
  ck_assert(s.softmax_scale == 0.01);
  ck_assert_int_eq(s.arch, AG_ARCH_AUTO);

  s = load_ok("name: z\npattern: block_diagonal\nhead_dim: 128\ndtype: bf16\n"
              "softmax_scale: 2\nblock_size: +32\n");
  ck_assert(s.softmax_scale == 2.0);
  ck_assert_int_eq(s.block_size, 32);
}
END_TEST

/* A spec asking for unbuilt kernels is still parsed and filled in full. */
START_TEST(test_unsupported_spec_is_filled) {
  const char *yaml = "name: jag_rope\n"
                     "pattern: jagged\n"
                     "causal: true\n"
                     "window: [256, 0]\n"
                     "query: broadcast\n"
                     "head_dim: 64\n"
                     "dtype: fp16\n"
                     "softmax_scale: 0.5\n"
                     "rotary:\n"
                     "  layout: half\n"
                     "  apply_to: [v, q]\n"
                     "  positions: sequence\n"
                     "  base: 1e-31\n"
                     "passes: [backward, forward]\n";
  ag_spec s;
  ag_error err = {0};
  ck_assert_int_eq(load(yaml, &s, &err), AG_ERR_UNSUPPORTED);
  ck_assert_int_eq(err.code, AG_ERR_UNSUPPORTED);
  ck_assert_str_eq(err.message,
                   "<string>:9:1: error: not supported yet: rotary base 1e-31 (below 1e-30 its "
                   "frequencies overflow fp32)\n"
                   "rotary:\n"
                   "^\n");
  ck_assert_str_eq(s.name, "jag_rope");
  ck_assert_int_eq(s.pattern, AG_PATTERN_JAGGED);
  ck_assert_int_eq(s.block_size, 0);
  ck_assert(s.causal);
  ck_assert(s.has_window);
  ck_assert_int_eq(s.window_left, 256);
  ck_assert_int_eq(s.window_right, 0);
  ck_assert_int_eq(s.query, AG_QUERY_BROADCAST);
  ck_assert_int_eq(s.head_dim, 64);
  ck_assert_int_eq(s.dtype, AG_DTYPE_FP16);
  ck_assert(s.softmax_scale == 0.5);
  ck_assert_int_eq(s.rotary.layout, AG_ROTARY_HALF);
  ck_assert_uint_eq(s.rotary.apply_to, AG_APPLY_Q | AG_APPLY_V);
  ck_assert_int_eq(s.rotary.positions, AG_POSITIONS_SEQUENCE);
  ck_assert(s.rotary.base == 1e-31);
  ck_assert_uint_eq(s.passes, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ck_assert_pos(s.at.window, 4, 1);
  ck_assert_pos(s.at.rotary, 9, 1);
  ag_error_clear(&err);
}
END_TEST

START_TEST(test_rotary_defaults_and_block_positions) {
  ag_spec s;
  ag_error err = {0};
  const char *base = "name: r\npattern: block_diagonal\nhead_dim: 128\ndtype: bf16\n";
  char yaml[512];
  snprintf(yaml, sizeof yaml, "%srotary: {layout: interleaved}\n", base);
  s = load_ok(yaml);
  ck_assert_int_eq(s.rotary.layout, AG_ROTARY_INTERLEAVED);
  ck_assert_uint_eq(s.rotary.apply_to, AG_APPLY_Q | AG_APPLY_K);
  ck_assert_int_eq(s.rotary.positions, AG_POSITIONS_TABLE);
  ck_assert(s.rotary.base == 10000.0);
  ck_assert_pos(s.at.rotary, 5, 1);

  snprintf(yaml, sizeof yaml,
           "%srotary:\n  layout: half\n  positions: block\n  base: 1e6\n  apply_to: [k]\n",
           base);
  s = load_ok(yaml);
  ck_assert_int_eq(s.rotary.layout, AG_ROTARY_HALF);
  ck_assert_int_eq(s.rotary.positions, AG_POSITIONS_BLOCK);
  ck_assert(s.rotary.base == 1e6);
  ck_assert_uint_eq(s.rotary.apply_to, AG_APPLY_K);
  /* With the backward pass too, and the rotary keys in any order. */
  snprintf(yaml, sizeof yaml,
           "%srotary:\n  positions: sequence\n  apply_to: [v, q, k]\n  layout: interleaved\n"
           "passes: [forward, backward]\n",
           base);
  s = load_ok(yaml);
  ck_assert_int_eq(s.rotary.layout, AG_ROTARY_INTERLEAVED);
  ck_assert_int_eq(s.rotary.positions, AG_POSITIONS_SEQUENCE);
  ck_assert(s.rotary.base == 10000.0);
  ck_assert_uint_eq(s.rotary.apply_to, AG_APPLY_Q | AG_APPLY_K | AG_APPLY_V);
  ck_assert_uint_eq(s.passes, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ag_error_clear(&err);
}
END_TEST

/* Every set of passes validates; the order written does not matter. */
START_TEST(test_passes) {
  const char *base = "name: p\npattern: block_diagonal\nhead_dim: 64\ndtype: fp16\n";
  static const struct {
    const char *list;
    unsigned want;
  } cases[] = {
      {"[forward]", AG_PASS_FORWARD},
      {"[backward]", AG_PASS_BACKWARD},
      {"[forward, backward]", AG_PASS_FORWARD | AG_PASS_BACKWARD},
      {"[backward, forward]", AG_PASS_FORWARD | AG_PASS_BACKWARD},
  };
  char yaml[256];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(yaml, sizeof yaml, "%spasses: %s\n", base, cases[i].list);
    ag_spec s = load_ok(yaml);
    ck_assert_uint_eq(s.passes, cases[i].want);
    ck_assert_pos(s.at.passes, 5, 1);
  }
}
END_TEST

/* A shape the kernels do not take yet (rotary positions from a table at
 * 240-token blocks at head_dim 128: Q, K, V and the table's rows of a block
 * overflow the forward's shared memory) is refused at `rotary` with the
 * plan's reason, and the spec is filled in full as for every unsupported
 * spec; the backward alone of the same shape is fine (walked in chunks,
 * which read the table in place), and so are rotary embeddings in the
 * backward at every block size. */
START_TEST(test_unsupported_shape_is_filled) {
  const char *bwd = "name: big\npattern: block_diagonal\nblock_size: 240\nhead_dim: 128\n"
                    "dtype: bf16\nrotary: {layout: half, apply_to: [q, k], positions: table}\n";
  char yaml[256];
  snprintf(yaml, sizeof yaml, "%spasses: [backward, forward]\n", bwd);
  ag_spec s;
  ag_error err = {0};
  ck_assert_int_eq(load(yaml, &s, &err), AG_ERR_UNSUPPORTED);
  ck_assert_str_eq(err.message,
                   "<string>:6:1: error: not supported yet: rotary positions from a table at "
                   "block_size 240 with head_dim 128 (Q, K, V and the table's rows of one block "
                   "need 240 KiB of shared memory; a CTA has 227)\n"
                   "rotary: {layout: half, apply_to: [q, k], positions: table}\n"
                   "^\n");
  ck_assert_str_eq(s.name, "big");
  ck_assert_int_eq(s.block_size, 240);
  ck_assert_uint_eq(s.passes, AG_PASS_FORWARD | AG_PASS_BACKWARD);
  ck_assert_pos(s.at.passes, 7, 1);
  ag_error_clear(&err);
  snprintf(yaml, sizeof yaml, "%spasses: [backward]\n", bwd);
  s = load_ok(yaml);
  ck_assert_uint_eq(s.passes, AG_PASS_BACKWARD);
  /* Every block size has a backward, rotary or not: 176-token blocks at
   * head_dim 64 whole, 192 and 256 (and 144 and 256 at head_dim 128) in
   * chunks. */
  const char *sizes[] = {"176\nhead_dim: 64", "192\nhead_dim: 64", "256\nhead_dim: 64",
                         "256\nhead_dim: 128", "144\nhead_dim: 128"};
  const char *rotary[] = {"", "rotary: {layout: interleaved, positions: sequence}\n"};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    for (int r = 0; r < 2; r++) {
      snprintf(yaml, sizeof yaml,
               "name: b\npattern: block_diagonal\nblock_size: %s\ndtype: fp16\n%s"
               "passes: [forward, backward]\n",
               sizes[i], rotary[r]);
      s = load_ok(yaml);
      ck_assert_uint_eq(s.passes, AG_PASS_FORWARD | AG_PASS_BACKWARD);
    }
}
END_TEST

START_TEST(test_jagged_defaults) {
  ag_spec s;
  ag_error err = {0};
  ck_assert_int_eq(load("name: j\npattern: jagged\nhead_dim: 128\ndtype: bf16\n", &s, &err),
                   AG_OK);
  ck_assert_int_eq(s.pattern, AG_PATTERN_JAGGED);
  ck_assert(!s.deterministic);
  ck_assert_int_eq(s.block_size, 0);
  ck_assert(!s.has_window);
  ck_assert_int_eq(s.query, AG_QUERY_PER_SEQUENCE);
  ck_assert_int_eq(load("name: j\npattern: jagged\nhead_dim: 128\ndtype: bf16\n"
                        "window: [0, 0]\n", &s, &err),
                   AG_OK);
  ck_assert(s.has_window);
  ck_assert_int_eq(s.window_left, 0);
  ck_assert_int_eq(s.window_right, 0);
  ag_error_clear(&err);
}
END_TEST

START_TEST(test_source_names) {
  const char *yaml = "name: n\npattern: block_diagonal\nhead_dim: 128\ndtype: fp32\n";
  ag_spec s;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "inline/spec.yaml", &s, &err),
                   AG_ERR_SPEC);
  ck_assert_str_eq(err.message,
                   "inline/spec.yaml:4:8: error: dtype must be one of bf16, fp16 (got 'fp32')\n"
                   "dtype: fp32\n"
                   "       ^\n");
  /* Failures leave a zeroed spec; NULL out_spec and err are accepted. */
  ck_assert_str_eq(s.source, "");
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), NULL, NULL, NULL), AG_ERR_SPEC);
  yaml = "name: n\npattern: block_diagonal\nhead_dim: 128\ndtype: fp16\n";
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "inline/spec.yaml", &s, &err),
                   AG_OK);
  ck_assert_str_eq(s.source, "inline/spec.yaml");
  ck_assert_ptr_null(err.message); /* success clears the record */
  ck_assert_int_eq(err.code, AG_OK);
  /* Only len bytes are read. */
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml) - 6, NULL, &s, &err), AG_ERR_SPEC);
  ck_assert_str_eq(err.message, "<string>:4:7: error: dtype must be one of bf16, fp16 "
                                "(got nothing)\ndtype:\n      ^\n");
  ag_error_clear(&err);
}
END_TEST

START_TEST(test_load_file_ok) {
  char path[] = "/tmp/attngen_spec_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  const char *yaml = "name: f\npattern: block_diagonal\nhead_dim: 64\ndtype: bf16\n";
  ag_test_spit(path, yaml, strlen(yaml));
  ag_spec s;
  ag_error err = {0};
  ag_status st = ag_spec_load_file(path, &s, &err);
  unlink(path);
  ck_assert_int_eq(st, AG_OK);
  ck_assert_str_eq(s.source, strrchr(path, '/') + 1);
  ck_assert_str_eq(s.name, "f");
  ck_assert_int_eq(s.head_dim, 64);
}
END_TEST

START_TEST(test_scale) {
  ag_spec s;
  memset(&s, 0, sizeof s);
  s.head_dim = 64;
  ck_assert_double_eq(ag_spec_scale(&s), 0.125);
  s.softmax_scale = 0.3;
  ck_assert_double_eq(ag_spec_scale(&s), 0.3);
}
END_TEST

/* ---- I/O, size and hostile input ---------------------------------------------------- */

START_TEST(test_missing_file) {
  ag_spec s;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_file("spec_errors/no_such_spec.yaml", &s, &err), AG_ERR_IO);
  ck_assert_int_eq(err.code, AG_ERR_IO);
  ck_assert_str_eq(err.message, "spec_errors/no_such_spec.yaml: error: cannot open spec: "
                                "No such file or directory\n");
  ck_assert_int_eq(ag_spec_load_file("spec_errors", &s, &err), AG_ERR_IO);
  ck_assert_str_eq(err.message, "spec_errors: error: cannot read spec: Is a directory\n");
  ag_error_clear(&err);
}
END_TEST

/* A buffer of `len` bytes: a valid spec, then a comment that fills it. */
static char *padded_spec(size_t len) {
  const char *head = "name: big\npattern: block_diagonal\nhead_dim: 128\ndtype: bf16\n# ";
  char *s = malloc(len + 1);
  ck_assert_ptr_nonnull(s);
  memset(s, 'x', len);
  memcpy(s, head, strlen(head));
  s[len - 1] = '\n';
  s[len] = '\0';
  return s;
}

START_TEST(test_size_limit) {
  const size_t mib = 1024 * 1024;
  const char *expected = "<string>:1:1: error: spec is larger than 1 MiB\nname: big\n^\n";
  ag_spec s;
  ag_error err = {0};
  char *text = padded_spec(mib);
  ck_assert_int_eq(ag_spec_load_string(text, mib, NULL, &s, &err), AG_OK);
  free(text);
  text = padded_spec(mib + 1);
  ck_assert_int_eq(ag_spec_load_string(text, mib + 1, NULL, &s, &err), AG_ERR_SPEC);
  ck_assert_str_eq(err.message, expected);

  char path[] = "/tmp/attngen_big_XXXXXX", want[256];
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  ag_test_spit(path, text, mib + 1);
  free(text);
  ag_status st = ag_spec_load_file(path, &s, &err);
  unlink(path);
  ck_assert_int_eq(st, AG_ERR_SPEC);
  snprintf(want, sizeof want, "%s:1:1: error: spec is larger than 1 MiB\nname: big\n^\n", path);
  ck_assert_str_eq(err.message, want);
  ag_error_clear(&err);
}
END_TEST

START_TEST(test_too_many_nodes) {
  size_t cap = 64 * 1024;
  char *yaml = malloc(cap);
  ck_assert_ptr_nonnull(yaml);
  size_t n = (size_t)snprintf(yaml, cap, "passes: [");
  for (int i = 0; i < 5000; i++) n += (size_t)snprintf(yaml + n, cap - n, "f, ");
  snprintf(yaml + n, cap - n, "]\n");
  ag_spec s;
  ag_error err = {0};
  ck_assert_int_eq(load(yaml, &s, &err), AG_ERR_SPEC);
  ck_assert_ptr_nonnull(strstr(err.message, "<string>:1:12289: error: spec has more than "
                                            "4096 nodes\n"));
  free(yaml);
  ag_error_clear(&err);
}
END_TEST

/* Random byte edits of a valid spec: never a crash or a leak, always a
 * status and, on failure, a message. */
START_TEST(test_mutations) {
  const char *seed = "name: ads\npattern: block_diagonal\nblock_size: 64\ncausal: true\n"
                     "head_dim: 128\ndtype: bf16\nsoftmax_scale: auto\n"
                     "rotary: {layout: half, apply_to: [q, k], positions: block, base: 1e4}\n"
                     "passes: [forward]\narch: sm_90a\n";
  const char alphabet[] = ":-[]{},&*!|>'\"#\t\n\r ?%@`\\\x01\x80\xc3\xe2\xff" "0a";
  size_t len = strlen(seed);
  char buf[512];
  unsigned rng = 12345;
  for (int round = 0; round < 3000; round++) {
    memcpy(buf, seed, len);
    int edits = 1 + round % 4;
    for (int e = 0; e < edits; e++) {
      rng = rng * 1103515245u + 12345u;
      size_t at = (rng >> 8) % len;
      rng = rng * 1103515245u + 12345u;
      buf[at] = alphabet[(rng >> 8) % (sizeof alphabet - 1)];
    }
    ag_spec s;
    ag_error err = {0};
    ag_status st = ag_spec_load_string(buf, len, NULL, &s, &err);
    ck_assert(st == AG_OK || st == AG_ERR_SPEC || st == AG_ERR_UNSUPPORTED);
    ck_assert(st == AG_OK || (err.message && err.message[0]));
    ag_error_clear(&err);
  }
}
END_TEST

Suite *spec_suite(void) {
  Suite *s = suite_create("spec");
  TCase *tc = tcase_create("golden");
  tcase_add_loop_test(tc, test_golden, 0, N_GOLDENS);
  tcase_add_test(tc, test_golden_dir_complete);
  suite_add_tcase(s, tc);
  tc = tcase_create("valid");
  tcase_add_test(tc, test_minimal_defaults);
  tcase_add_test(tc, test_every_block_diagonal_key);
  tcase_add_test(tc, test_other_values);
  tcase_add_test(tc, test_unsupported_spec_is_filled);
  tcase_add_test(tc, test_rotary_defaults_and_block_positions);
  tcase_add_test(tc, test_passes);
  tcase_add_test(tc, test_unsupported_shape_is_filled);
  tcase_add_test(tc, test_jagged_defaults);
  tcase_add_test(tc, test_source_names);
  tcase_add_test(tc, test_load_file_ok);
  tcase_add_test(tc, test_scale);
  suite_add_tcase(s, tc);
  tc = tcase_create("limits");
  tcase_set_timeout(tc, 60); /* valgrind runs are slow */
  tcase_add_test(tc, test_missing_file);
  tcase_add_test(tc, test_size_limit);
  tcase_add_test(tc, test_too_many_nodes);
  tcase_add_test(tc, test_mutations);
  suite_add_tcase(s, tc);
  return s;
}
