// SPDX-License-Identifier: BSD-3-Clause
/* check_hostile.c: hostile spec inputs that check_spec.c's goldens do not
 * already cover (nesting 10,000 deep, a 100 MB file, an endless file, every
 * malformed UTF-8 form, binary garbage, overflowing numbers, worst cases at
 * the 1 MiB cap), each with its exact error text, in under a second and a
 * bounded amount of memory. Runs from tests/. */
#include <check.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "attngen.h"

/* ---- bounds --------------------------------------------------------------- */

#define TIME_LIMIT_S 1.0
/* Peak resident growth allowed for one load. The loader keeps at most the
 * 1 MiB cap plus one 64 KiB read chunk, the parser a copy of each scalar;
 * the rest is headroom for sanitizer shadow memory and quarantine. A loader
 * that read a 100 MB file whole would need 100 MB. */
#ifndef MEMORY_LIMIT_KIB /* -DMEMORY_LIMIT_KIB=1 shows every load's measurement */
#define MEMORY_LIMIT_KIB (32 * 1024L)
#endif
#define MIB (1024 * 1024)

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A "VmXXX:" field of /proc/self/status in KiB, -1 when absent. */
static long status_kib(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  size_t n = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0) v = atol(line + n);
  fclose(f);
  return v;
}

/* Reset the peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0). */
static bool reset_peak(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  bool ok = fputs("5", f) >= 0;
  return fclose(f) == 0 && ok;
}

typedef struct outcome {
  ag_status st;
  ag_status code; /* the error record's */
  char *message;  /* from the error record; the caller frees it */
  bool zeroed;    /* the spec's name is empty */
  double seconds;
  long peak_kib; /* growth of the peak RSS during the load; -1: not measured */
} outcome;

/* Load from memory (path NULL) or from a file, timing the call and
 * measuring its peak memory. Asserts nothing, so callers can clean up. */
static outcome measure_load(const char *yaml, size_t len, const char *path) {
  outcome o = {0};
  ag_error err = {0};
  ag_spec spec;
  long before = reset_peak() ? status_kib("VmRSS:") : -1;
  double t0 = now_s();
  o.st = path ? ag_spec_load_file(path, &spec, &err)
              : ag_spec_load_string(yaml, len, NULL, &spec, &err);
  o.seconds = now_s() - t0;
  long peak = status_kib("VmHWM:");
  o.peak_kib = before >= 0 && peak >= 0 ? peak - before : -1;
  o.code = err.code;
  o.message = err.message;
  o.zeroed = spec.name[0] == '\0';
  return o;
}

/* Both bounds, the record's code, a zeroed spec on failure. */
static void check_bounds(const char *label, const outcome *o) {
  ck_assert_msg(o->seconds < TIME_LIMIT_S, "%s: the load took %.3f s", label, o->seconds);
  ck_assert_msg(o->peak_kib < MEMORY_LIMIT_KIB, "%s: the load grew the peak RSS by %ld KiB",
                label, o->peak_kib);
  ck_assert_int_eq(o->code, o->st);
  if (o->st != AG_OK) ck_assert(o->zeroed);
}

/* Bounded, AG_ERR_SPEC and exactly `want`; frees the message. */
static void check_error(const char *label, outcome *o, const char *want) {
  check_bounds(label, o);
  ck_assert_msg(o->st == AG_ERR_SPEC, "%s: status %s", label, ag_strerror(o->st));
  ck_assert_msg(o->message && strcmp(o->message, want) == 0, "%s: got:\n%s\nexpected:\n%s",
                label, o->message ? o->message : "(none)", want);
  free(o->message);
  o->message = NULL;
}

static void expect_error(const char *label, const char *yaml, size_t len, const char *path,
                         const char *want) {
  outcome o = measure_load(yaml, len, path);
  check_error(label, &o, want);
}

/* "prefix" then `unit` n times then "suffix", from malloc(). */
static char *repeat(const char *prefix, const char *unit, size_t n, const char *suffix) {
  size_t lp = strlen(prefix), lu = strlen(unit), ls = strlen(suffix);
  char *s = malloc(lp + n * lu + ls + 1);
  ck_assert_ptr_nonnull(s);
  memcpy(s, prefix, lp);
  for (size_t i = 0; i < n; i++) memcpy(s + lp + i * lu, unit, lu);
  memcpy(s + lp + n * lu, suffix, ls + 1);
  return s;
}

/* The expected block for one diagnostic on a long first line: the message,
 * the line's first 100 characters and "...", the caret at `col`. */
static char *long_line_error(const char *where_what, const char *line, int col) {
  char *s = NULL;
  ck_assert_int_ge(asprintf(&s, "%s\n%.100s...\n%*s^\n", where_what, line, col - 1, ""), 0);
  return s;
}

static const char head[] = "name: ok\npattern: block_diagonal\nhead_dim: 128\ndtype: bf16\n";

/* ---- nesting 10,000 deep ---------------------------------------------------- */

/* Flow lists, flow mappings and block lists nested 10,000 deep are refused
 * at the ninth level, before libyaml or the tree builder go any deeper. */
static const struct deep {
  const char *name, *prefix, *open, *middle, *close;
  int col; /* where the ninth collection starts */
} deeps[] = {
    {"flow lists", "window: ", "[", "1", "]", 16},
    {"flow mappings", "window: ", "{a: ", "1", "}", 37},
    {"block lists", "", "- ", "1", "", 17},
};

START_TEST(nesting_10000_deep) {
  const struct deep *d = &deeps[_i];
  const size_t depth = 10000;
  char *opens = repeat(d->prefix, d->open, depth, d->middle);
  char *yaml = repeat(opens, d->close, depth, "\n");
  char where[80];
  snprintf(where, sizeof where, "<string>:1:%d: error: nesting is deeper than 8 levels", d->col);
  char *want = long_line_error(where, yaml, d->col);
  expect_error(d->name, yaml, strlen(yaml), NULL, want);
  free(want);
  free(yaml);
  free(opens);
}
END_TEST

/* ---- files too large to read ------------------------------------------------ */

/* A 100 MB file (sparse: a spec, then 100 MB of holes) is refused after
 * reading at most the 1 MiB cap and one chunk: fast, and without the
 * memory a full read would take. */
START_TEST(file_of_100_mb) {
  char dir[] = "/tmp/attngen-hostile-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char *path = NULL;
  ck_assert_int_ge(asprintf(&path, "%s/huge.yaml", dir), 0);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, head, strlen(head)), (ssize_t)strlen(head));
  ck_assert_int_eq(ftruncate(fd, 100L * MIB), 0);
  ck_assert_int_eq(close(fd), 0);
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_size, 100L * MIB);

  char *want = NULL;
  ck_assert_int_ge(
      asprintf(&want, "%s:1:1: error: spec is larger than 1 MiB\nname: ok\n^\n", path), 0);
  outcome o = measure_load(NULL, 0, path);
  int removed = unlink(path) == 0 && rmdir(dir) == 0; /* before any assertion */
  check_error("100 MB file", &o, want);
  ck_assert(removed);
  free(want);
  free(path);
}
END_TEST

/* A file that never ends (a character device) is refused at the cap too;
 * a loader that read to the end would never return. */
START_TEST(endless_file) {
  char *q = repeat("", "?", 100, "");
  char *want = NULL;
  ck_assert_int_ge(
      asprintf(&want, "/dev/zero:1:1: error: spec is larger than 1 MiB\n%s...\n^\n", q), 0);
  expect_error("/dev/zero", NULL, 0, "/dev/zero", want);
  free(want);
  free(q);
}
END_TEST

/* ---- encodings ----------------------------------------------------------------- */

/* Each malformed UTF-8 form, and UTF-16 (a common editor default), is
 * refused at its first bad byte. The NUL byte and a Latin-1 byte are
 * goldens in check_spec.c. */
static const struct utf8_case {
  const char *name;
  const char *bytes; /* placed after "name: a" */
  size_t len;
  const char *want;
} utf8_cases[] = {
    {"overlong '/'", "\xC0\xAF", 2,
     "<string>:1:8: error: invalid UTF-8 (byte 0xC0)\nname: a??\n       ^\n"},
    {"surrogate U+D800", "\xED\xA0\x80", 3,
     "<string>:1:8: error: invalid UTF-8 (byte 0xED)\nname: a???\n       ^\n"},
    {"above U+10FFFF", "\xF4\x90\x80\x80", 4,
     "<string>:1:8: error: invalid UTF-8 (byte 0xF4)\nname: a????\n       ^\n"},
    {"five-byte form", "\xF8\x88\x80\x80\x80", 5,
     "<string>:1:8: error: invalid UTF-8 (byte 0xF8)\nname: a?????\n       ^\n"},
    {"lone continuation", "\x80", 1,
     "<string>:1:8: error: invalid UTF-8 (byte 0x80)\nname: a?\n       ^\n"},
    {"truncated at the end", "\xE2\x82", 2,
     "<string>:1:8: error: invalid UTF-8 (byte 0xE2)\nname: a??\n       ^\n"},
    {"noncharacter U+FFFE", "\xEF\xBF\xBE", 3,
     "<string>:1:8: error: noncharacter U+FFFE is not allowed\nname: a?\n       ^\n"},
    /* Issue 22: the other noncharacters, which libyaml would take. */
    {"noncharacter U+FFFF", "\xEF\xBF\xBF", 3,
     "<string>:1:8: error: noncharacter U+FFFF is not allowed\nname: a?\n       ^\n"},
    {"noncharacter U+FDD0", "\xEF\xB7\x90", 3,
     "<string>:1:8: error: noncharacter U+FDD0 is not allowed\nname: a?\n       ^\n"},
    {"noncharacter U+FDEF", "\xEF\xB7\xAF", 3,
     "<string>:1:8: error: noncharacter U+FDEF is not allowed\nname: a?\n       ^\n"},
    {"noncharacter U+1FFFE", "\xF0\x9F\xBF\xBE", 4,
     "<string>:1:8: error: noncharacter U+1FFFE is not allowed\nname: a?\n       ^\n"},
    {"noncharacter U+10FFFF", "\xF4\x8F\xBF\xBF", 4,
     "<string>:1:8: error: noncharacter U+10FFFF is not allowed\nname: a?\n       ^\n"},
    {"byte-order mark inside", "\xEF\xBB\xBF", 3,
     "<string>:1:8: error: byte-order mark U+FEFF is allowed only at the start of the spec\n"
     "name: a?\n       ^\n"},
};

/* Every noncharacter is refused, and the characters beside them are not
 * (U+FDCF, U+FDF0, U+xFFFD, U+x0000). */
START_TEST(every_noncharacter) {
  for (uint32_t plane = 0; plane <= 0x10; plane++)
    for (uint32_t low = 0xFFFC; low <= 0x10000; low++) {
      uint32_t cp = (plane << 16) + low;
      if (cp > 0x10FFFF || cp < 0x80) continue;
      char yaml[32];
      int n = snprintf(yaml, sizeof yaml, "name: ok # ");
      if (cp < 0x10000) {
        yaml[n++] = (char)(0xE0 | cp >> 12);
      } else {
        yaml[n++] = (char)(0xF0 | cp >> 18);
        yaml[n++] = (char)(0x80 | (cp >> 12 & 0x3F));
      }
      yaml[n++] = (char)(0x80 | (cp >> 6 & 0x3F));
      yaml[n++] = (char)(0x80 | (cp & 0x3F));
      ag_spec spec;
      ag_error err = {0};
      ag_status st = ag_spec_load_string(yaml, (size_t)n, NULL, &spec, &err);
      bool non = (cp & 0xFFFE) == 0xFFFE;
      ck_assert_msg(st == AG_ERR_SPEC, "U+%04X: %s", (unsigned)cp, ag_strerror(st));
      ck_assert_msg((strstr(err.message, "noncharacter") != NULL) == non, "U+%04X: %s",
                    (unsigned)cp, err.message);
      ag_error_clear(&err);
    }
  for (uint32_t cp = 0xFDCF; cp <= 0xFDF0; cp++) {
    char yaml[32];
    int n = snprintf(yaml, sizeof yaml, "name: ok # %c%c%c", (char)(0xE0 | cp >> 12),
                     (char)(0x80 | (cp >> 6 & 0x3F)), (char)(0x80 | (cp & 0x3F)));
    ag_spec spec;
    ag_error err = {0};
    ck_assert_int_eq(ag_spec_load_string(yaml, (size_t)n, NULL, &spec, &err), AG_ERR_SPEC);
    bool non = cp >= 0xFDD0 && cp <= 0xFDEF;
    ck_assert_msg((strstr(err.message, "noncharacter") != NULL) == non, "U+%04X: %s",
                  (unsigned)cp, err.message);
    ag_error_clear(&err);
  }
}
END_TEST

/* One byte-order mark at the start is skipped; a second gets its own
 * message (issue 22: it gave "expected <document start>"). */
START_TEST(doubled_bom) {
  char *one = NULL, *two = NULL;
  ck_assert_int_ge(asprintf(&one, "\xEF\xBB\xBF%sblock_size: 64\n", head), 0);
  ck_assert_int_ge(asprintf(&two, "\xEF\xBB\xBF\xEF\xBB\xBF%sblock_size: 64\n", head), 0);
  ag_spec spec;
  ag_error err = {0};
  ck_assert_msg(ag_spec_load_string(one, strlen(one), NULL, &spec, &err) == AG_OK, "%s",
                err.message);
  ck_assert_int_eq(ag_spec_load_string(two, strlen(two), NULL, &spec, &err), AG_ERR_SPEC);
  ck_assert_ptr_nonnull(strstr(err.message, "<string>:1:1: error: a second byte-order mark "
                                            "(U+FEFF): the spec starts with two\n"));
  ag_error_clear(&err);
  free(one);
  free(two);
}
END_TEST

START_TEST(utf8_forms) {
  const struct utf8_case *u = &utf8_cases[_i];
  char yaml[64];
  memcpy(yaml, "name: a", 7);
  memcpy(yaml + 7, u->bytes, u->len); /* the end of the input: nothing follows */
  expect_error(u->name, yaml, 7 + u->len, NULL, u->want);
}
END_TEST

/* The source name is printed escaped in spec errors (issue 22): control
 * characters and bytes that are not UTF-8 as \xNN; other UTF-8 is kept. */
START_TEST(source_name_escaped_in_errors) {
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_string("name: ok\n", 9, "x\x1b[31m\xff\n\xc2\x9b\xc3\xa9.yaml",
                                       &spec, &err),
                   AG_ERR_SPEC);
  const char want[] = "x\\x1B[31m\\xFF\\x0A\\xC2\\x9B\xc3\xa9.yaml:1:1: error: missing required key";
  ck_assert_msg(strncmp(err.message, want, strlen(want)) == 0, "%s", err.message);
  ck_assert_ptr_null(strchr(err.message, '\x1b'));
  ag_error_clear(&err);
  ck_assert_int_eq(ag_spec_load_file("/nonexistent/\x1b]0;title\x07.yaml", &spec, &err),
                   AG_ERR_IO);
  ck_assert_str_eq(err.message, "/nonexistent/\\x1B]0;title\\x07.yaml: error: cannot open spec: "
                                "No such file or directory\n");
  ag_error_clear(&err);
}
END_TEST

START_TEST(utf16_specs) {
  static const char le[] = "\xFF\xFEn\0a\0m\0e\0:\0 \0o\0k\0\n\0";
  static const char be[] = "\xFE\xFF\0n\0a\0m\0e\0:\0 \0o\0k\0\n";
  expect_error("UTF-16LE", le, sizeof le - 1, NULL,
               "<string>:1:1: error: invalid UTF-8 (byte 0xFF)\n??n?a?m?e?:? ?o?k?\n^\n");
  expect_error("UTF-16BE", be, sizeof be - 1, NULL,
               "<string>:1:1: error: invalid UTF-8 (byte 0xFE)\n???n?a?m?e?:? ?o?k?\n^\n");
}
END_TEST

/* A cubin (ELF) handed over as a spec: 1 MiB of binary after the ELF
 * identification, refused at its first byte (DEL). */
START_TEST(binary_garbage) {
  size_t len = MIB;
  char *bin = malloc(len);
  ck_assert_ptr_nonnull(bin);
  static const char ident[16] = "\x7F" "ELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00";
  memcpy(bin, ident, sizeof ident);
  bin[16] = '\n';
  unsigned rng = 2024;
  for (size_t i = 17; i < len; i++) {
    rng = rng * 1103515245u + 12345u;
    bin[i] = (char)(rng >> 16);
  }
  expect_error("ELF", bin, len, NULL,
               "<string>:1:1: error: control character U+007F is not allowed\n"
               "?ELF????????????\n"
               "^\n");
  free(bin);
}
END_TEST

/* ---- numbers that overflow ----------------------------------------------------- */

/* Each value is refused as out of range or not finite, never wrapped:
 * 2^32 + 64 would become a valid block size in a 32-bit int. */
static const struct number_case {
  const char *line, *want;
} number_cases[] = {
    {"block_size: 4294967360\n",
     "<string>:5:13: error: block_size is out of range (got 4294967360)\n"
     "block_size: 4294967360\n            ^\n"},
    {"block_size: 9223372036854775808\n",
     "<string>:5:13: error: block_size is out of range (got 9223372036854775808)\n"
     "block_size: 9223372036854775808\n            ^\n"},
    {"block_size: 0x7fffffffffffffffffff\n",
     "<string>:5:13: error: block_size must be an integer (got '0x7fffffffffffffffffff')\n"
     "block_size: 0x7fffffffffffffffffff\n            ^\n"},
    {"softmax_scale: 1e999\n",
     "<string>:5:16: error: softmax_scale must be auto or a positive finite number "
     "(got '1e999')\nsoftmax_scale: 1e999\n               ^\n"},
    {"softmax_scale: 1e-999\n",
     "<string>:5:16: error: softmax_scale must be auto or a positive finite number "
     "(got '1e-999')\nsoftmax_scale: 1e-999\n               ^\n"},
    {"rotary: {layout: half, positions: sequence, base: 1e400}\n",
     "<string>:5:51: error: rotary.base must be a positive finite number (got '1e400')\n"
     "rotary: {layout: half, positions: sequence, base: 1e400}\n"
     "                                                  ^\n"},
};

START_TEST(overflowing_numbers) {
  const struct number_case *c = &number_cases[_i];
  char yaml[512], label[128];
  snprintf(yaml, sizeof yaml, "%s%s", head, c->line);
  snprintf(label, sizeof label, "%.*s", (int)strcspn(c->line, "\n"), c->line);
  expect_error(label, yaml, strlen(yaml), NULL, c->want);
}
END_TEST

START_TEST(window_overflow) {
  const char *yaml = "name: ok\npattern: jagged\nhead_dim: 128\ndtype: bf16\n"
                     "window: [9223372036854775808, -9223372036854775809]\n";
  expect_error("window", yaml, strlen(yaml), NULL,
               "<string>:5:10: error: window left is out of range (got 9223372036854775808)\n"
               "window: [9223372036854775808, -9223372036854775809]\n"
               "         ^\n"
               "<string>:5:31: error: window right is out of range (got -9223372036854775809)\n"
               "window: [9223372036854775808, -9223372036854775809]\n"
               "                              ^\n");
}
END_TEST

/* A number of a million digits: refused, and the message stays short. */
START_TEST(million_digit_number) {
  size_t digits = MIB - strlen(head) - strlen("block_size: \n");
  char *tail = repeat("block_size: ", "9", digits, "\n");
  char *yaml = NULL;
  ck_assert_int_ge(asprintf(&yaml, "%s%s", head, tail), 0);
  ck_assert_uint_eq(strlen(yaml), MIB);
  char *want = NULL;
  char *nines = repeat("", "9", 40, "");
  ck_assert_int_ge(asprintf(&want,
                            "<string>:5:13: error: block_size is out of range (got %s...)\n"
                            "%.100s...\n            ^\n",
                            nines, tail),
                   0);
  expect_error("million digits", yaml, MIB, NULL, want);
  free(nines);
  free(want);
  free(yaml);
  free(tail);
}
END_TEST

/* ---- worst cases at the size cap ------------------------------------------------- */

/* 1 MiB of one duplicated key: the node limit stops it, in linear time. */
START_TEST(duplicate_keys_to_the_cap) {
  size_t n = MIB / strlen("dtype: bf16\n");
  char *yaml = repeat("", "dtype: bf16\n", n, "");
  expect_error("duplicates", yaml, strlen(yaml), NULL,
               "<string>:2048:8: error: spec has more than 4096 nodes\n"
               "dtype: bf16\n"
               "       ^\n");
  free(yaml);
}
END_TEST

/* An error on the last line of 1 MiB: found, shown, in linear time. */
START_TEST(error_after_a_mib_of_comments) {
  size_t n = (MIB - strlen(head) - 8) / 2;
  char *comments = repeat(head, "#\n", n, "x: 1\n");
  char want[128];
  snprintf(want, sizeof want, "<string>:%zu:1: error: unknown key 'x'\nx: 1\n^\n", n + 5);
  expect_error("late error", comments, strlen(comments), NULL, want);
  free(comments);
}
END_TEST

/* ---- the named hostile goldens stay bounded ---------------------------------------- */

/* check_spec.c asserts these goldens' exact text; here each must also load
 * in under a second and bounded memory. */
static const char *const hostile_goldens[] = {
    "empty_file",       "binary_png",     "invalid_utf8",   "nul_byte",
    "control_char",     "tab_indent",     "tab_first_line", "alias_bomb",
    "alias_value",      "explicit_tag",   "too_deep",       "integer_overflow",
    "duplicate_key",    "top_level_list", "top_level_scalar", "two_documents",
    "too_many_errors",  "long_line",
};
#define N_HOSTILE_GOLDENS (int)(sizeof hostile_goldens / sizeof hostile_goldens[0])

START_TEST(hostile_goldens_bounded) {
  char path[256];
  snprintf(path, sizeof path, "spec_errors/%s.yaml", hostile_goldens[_i]);
  ck_assert_msg(access(path, R_OK) == 0, "%s is missing", path);
  outcome o = measure_load(NULL, 0, path);
  check_bounds(path, &o);
  ck_assert_msg(o.st == AG_ERR_SPEC, "%s: status %s", path, ag_strerror(o.st));
  ck_assert_ptr_nonnull(o.message);
  free(o.message);
}
END_TEST

Suite *hostile_suite(void) {
  Suite *s = suite_create("hostile");
  TCase *tc = tcase_create("structure");
  tcase_set_timeout(tc, 60); /* sanitizer and valgrind runs are slow */
  tcase_add_loop_test(tc, nesting_10000_deep, 0, (int)(sizeof deeps / sizeof deeps[0]));
  tcase_add_test(tc, duplicate_keys_to_the_cap);
  tcase_add_test(tc, error_after_a_mib_of_comments);
  suite_add_tcase(s, tc);
  tc = tcase_create("size");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, file_of_100_mb);
  tcase_add_test(tc, endless_file);
  suite_add_tcase(s, tc);
  tc = tcase_create("encoding");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, utf8_forms, 0, (int)(sizeof utf8_cases / sizeof utf8_cases[0]));
  tcase_add_test(tc, every_noncharacter);
  tcase_add_test(tc, doubled_bom);
  tcase_add_test(tc, source_name_escaped_in_errors);
  tcase_add_test(tc, utf16_specs);
  tcase_add_test(tc, binary_garbage);
  suite_add_tcase(s, tc);
  tc = tcase_create("numbers");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, overflowing_numbers, 0,
                      (int)(sizeof number_cases / sizeof number_cases[0]));
  tcase_add_test(tc, window_overflow);
  tcase_add_test(tc, million_digit_number);
  suite_add_tcase(s, tc);
  tc = tcase_create("bounds");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, hostile_goldens_bounded, 0, N_HOSTILE_GOLDENS);
  suite_add_tcase(s, tc);
  return s;
}
