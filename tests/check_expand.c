// SPDX-License-Identifier: BSD-3-Clause
/* check_expand.c: the template engine: substitution, conditions, includes,
 * comments, and every error (exact text), so a malformed template can never
 * leave a placeholder in emitted code. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "expand.h"
#include "templates.h"

static const ag_tpl_var vars[] = {
    {"NAME", "kern"}, {"N", "64"}, {"ON", "1"}, {"OFF", "0"}, {"EMPTY", ""},
    {"MMA_TYPE", "bf16"}, {"PAIR_TYPE", "bf16x2"},
};
enum { NVARS = sizeof vars / sizeof vars[0] };

/* Expand text; on success return the output (caller frees), else NULL with
 * the message in *msg (caller frees). */
static char *expand(const char *text, ag_status *st, char **msg) {
  ag_buf b;
  ag_error err = {0};
  ag_buf_init(&b);
  *st = ag_expand_text("t.cu", text, vars, NVARS, &b, &err);
  *msg = err.message;
  if (*st != AG_OK) {
    ag_buf_free(&b);
    return NULL;
  }
  return ag_buf_take(&b);
}

static void expect_out(const char *text, const char *want) {
  ag_status st;
  char *msg, *out = expand(text, &st, &msg);
  ck_assert_msg(st == AG_OK, "%s", msg ? msg : "");
  ck_assert_str_eq(out, want);
  free(out);
}

static void expect_err(const char *text, const char *want) {
  ag_status st;
  char *msg, *out = expand(text, &st, &msg);
  ck_assert_ptr_null(out);
  ck_assert_int_eq(st, AG_ERR_TEMPLATE);
  ck_assert_str_eq(msg, want);
  free(msg);
}

START_TEST(test_substitution) {
  expect_out("void @NAME@(int n = @N@);\n", "void kern(int n = 64);\n");
  expect_out("a@@b @NAME@@@\n", "a@b kern@\n");
  expect_out("no newline at end @N@", "no newline at end 64");
  expect_out("", "");
}
END_TEST

START_TEST(test_conditions) {
  expect_out("a\n@if ON@\nb\n@else@\nc\n@endif@\nd\n", "a\nb\nd\n");
  expect_out("a\n@if OFF@\nb\n@else@\nc\n@endif@\nd\n", "a\nc\nd\n");
  expect_out("@if EMPTY@\nx\n@endif@\n", "");
  expect_out("  @if ON@\n@if OFF@\nx\n@else@\ny\n@endif@\n  @endif@\n", "y\n");
  /* A branch not taken is not expanded, placeholders included. */
  expect_out("@if OFF@\n@UNKNOWN@\n@endif@\nok\n", "ok\n");
}
END_TEST

START_TEST(test_comments_and_include) {
  expect_out("@# a template-only note\nkept\n", "kept\n");
  ag_status st;
  char *msg, *out = expand("@include mma_sm80.cuh@\n", &st, &msg);
  ck_assert_msg(st == AG_OK, "%s", msg ? msg : "");
  ck_assert_ptr_nonnull(strstr(out, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
  ck_assert_ptr_null(strstr(out, "@#"));
  free(out);
}
END_TEST

START_TEST(test_errors) {
  expect_err("x @NOPE@ y\n", "t.cu:1: unknown placeholder '@NOPE@'");
  expect_err("ok\nx @NAME y\n", "t.cu:2: unterminated placeholder starting '@NAME y'");
  expect_err("x @lower@ y\n", "t.cu:1: malformed placeholder '@lower@'");
  expect_err("@else@\n", "t.cu:1: @else without @if");
  expect_err("@endif@\n", "t.cu:1: @endif without @if");
  expect_err("a\n@if ON@\nb\n", "t.cu:2: @if without @endif");
  expect_err("@if ON@\n@else@\n@else@\n@endif@\n", "t.cu:3: @else without @if");
  expect_err("@if MISSING@\n@endif@\n", "t.cu:1: unknown condition 'MISSING'");
  expect_err("@include nothere.cu@\n", "t.cu:1: unknown template 'nothere.cu'");
  ag_buf b;
  ag_error err = {0};
  ag_buf_init(&b);
  ck_assert_int_eq(ag_expand("nothere.cu", vars, NVARS, &b, &err), AG_ERR_TEMPLATE);
  ck_assert_str_eq(err.message, "unknown template 'nothere.cu'");
  ag_error_clear(&err);
  ag_buf_free(&b);
}
END_TEST

/* The templates are embedded and found by file name. */
START_TEST(test_templates_are_embedded) {
  ck_assert_ptr_nonnull(ag_template_find("block_fwd.cu"));
  ck_assert_ptr_nonnull(ag_template_find("mma_sm80.cuh"));
  ck_assert_ptr_null(ag_template_find("missing.cu"));
}
END_TEST

Suite *expand_suite(void) {
  Suite *s = suite_create("expand");
  TCase *tc = tcase_create("expand");
  tcase_add_test(tc, test_substitution);
  tcase_add_test(tc, test_conditions);
  tcase_add_test(tc, test_comments_and_include);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_templates_are_embedded);
  suite_add_tcase(s, tc);
  return s;
}
