// SPDX-License-Identifier: BSD-3-Clause
/* check_cli.c: the attngen command line's exit codes and messages (0 ok,
 * 1 failed, 2 usage, 3 run skipped without a GPU), run as a child process,
 * and the usage errors of the tuning tool tune_block. The binaries come
 * from ATTNGEN_BIN and TUNE_BLOCK_BIN (set by `make test`). */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attngen.h"
#include "util.h"

typedef struct result {
  int code;
  char *out, *err;
} result;

/* Run `BINARY ARGS` through the shell, from the repository root, with
 * stdout and stderr captured; the binary's path is in environment variable
 * `env`, else `fallback` (relative to tests/). */
static result run_binary(const char *env, const char *fallback, const char *args) {
  const char *rel = getenv(env);
  char bin[4096];
  ck_assert_ptr_nonnull(realpath(rel ? rel : fallback, bin));
  char dir[] = "/tmp/ag_cli_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char cmd[8192];
  /* From the repository root, so paths in messages read as a user types them. */
  snprintf(cmd, sizeof cmd, "cd .. && %s %s >%s/out 2>%s/err", bin, args, dir, dir);
  int status = system(cmd);
  ck_assert_int_ne(status, -1);
  result r = {WIFEXITED(status) ? WEXITSTATUS(status) : -1, NULL, NULL};
  char path[64];
  snprintf(path, sizeof path, "%s/out", dir);
  r.out = ag_test_slurp(path, NULL);
  unlink(path);
  snprintf(path, sizeof path, "%s/err", dir);
  r.err = ag_test_slurp(path, NULL);
  unlink(path);
  rmdir(dir);
  ck_assert_ptr_nonnull(r.out);
  ck_assert_ptr_nonnull(r.err);
  return r;
}

static result run(const char *args) { return run_binary("ATTNGEN_BIN", "../build/attngen", args); }

static void done(result *r) {
  free(r->out);
  free(r->err);
}

START_TEST(test_help_and_version) {
  result r = run("--help");
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "usage: attngen COMMAND"));
  done(&r);
  r = run("--version");
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_eq(r.out, "attngen " AG_VERSION_STRING "\n");
  done(&r);
}
END_TEST

START_TEST(test_usage_errors) {
  static const struct {
    const char *args, *message;
  } cases[] = {
      {"", "attngen: missing COMMAND\nTry 'attngen --help'.\n"},
      {"frobnicate", "attngen: unknown command 'frobnicate'\nTry 'attngen --help'.\n"},
      {"check", "attngen: check needs at least one SPEC\nTry 'attngen --help'.\n"},
      {"emit", "attngen: missing SPEC\nTry 'attngen --help'.\n"},
      {"emit a.yaml b.yaml", "attngen: expected exactly one SPEC\nTry 'attngen --help'.\n"},
      {"emit --arch sm_90a specs/ads_block64_d64_fp16.yaml",
       "attngen: option '--arch' does not apply to this command\nTry 'attngen --help'.\n"},
      {"run -o x specs/ads_block64_d64_fp16.yaml",
       "attngen: option '-o' does not apply to this command\nTry 'attngen --help'.\n"},
      {"emit --colour specs/ads_block64_d64_fp16.yaml",
       "attngen: unknown option or missing value '--colour'\nTry 'attngen --help'.\n"},
      {"run specs/ads_block64_d64_fp16.yaml --batch",
       "attngen: unknown option or missing value '--batch'\nTry 'attngen --help'.\n"},
      {"compile specs/ads_block64_d64_fp16.yaml",
       "attngen: compile needs -o FILE\nTry 'attngen --help'.\n"},
      {"run specs/ads_block64_d64_fp16.yaml --batch 0",
       "attngen: bad value '0' for an option\nTry 'attngen --help'.\n"},
      {"run specs/ads_block64_d64_fp16.yaml --seqlen 10 --min-seqlen 20",
       "attngen: --min-seqlen exceeds --seqlen\nTry 'attngen --help'.\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    result r = run(cases[i].args);
    ck_assert_msg(r.code == 2, "'%s' exited %d", cases[i].args, r.code);
    ck_assert_str_eq(r.err, cases[i].message);
    done(&r);
  }
}
END_TEST

START_TEST(test_check) {
  result r = run("check specs/ads_block64_d128_bf16.yaml specs/ads_block64_d64_fp16.yaml");
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_eq(r.out, "specs/ads_block64_d128_bf16.yaml: ok\nspecs/ads_block64_d64_fp16.yaml: ok\n");
  done(&r);
  r = run("check tests/spec_errors/unknown_key.yaml");
  ck_assert_int_eq(r.code, 1);
  ck_assert_str_eq(r.err, "tests/spec_errors/unknown_key.yaml:3:1: error: unknown key "
                          "'blok_size' (did you mean 'block_size'?)\nblok_size: 64\n^\n");
  done(&r);
  r = run("check /nonexistent/spec.yaml");
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "/nonexistent/spec.yaml"));
  done(&r);
  /* The bundled specs with the backward and rotary embeddings. */
  r = run("check specs/ads_block64_d128_train.yaml specs/ads_block64_d128_rope.yaml");
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_str_eq(r.out, "specs/ads_block64_d128_train.yaml: ok\n"
                          "specs/ads_block64_d128_rope.yaml: ok\n");
  done(&r);
}
END_TEST

/* File names are printed escaped (issue 22): an escape sequence or a byte
 * that is not UTF-8 in a name shows as \xNN in check's "ok" line, in a spec
 * error, in an unreadable spec's message and in a failed output's. */
START_TEST(test_names_printed_escaped) {
  char dir[] = "/tmp/ag_cli_names_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char good[128], bad[128], cmd[1024];
  snprintf(good, sizeof good, "%s/ok\x1b[31m\xff.yaml", dir);
  snprintf(bad, sizeof bad, "%s/bad\x1b[31m.yaml", dir);
  FILE *f = fopen(good, "w");
  ck_assert_ptr_nonnull(f);
  fputs("name: ok\npattern: block_diagonal\nblock_size: 64\nhead_dim: 128\ndtype: bf16\n", f);
  ck_assert_int_eq(fclose(f), 0);
  f = fopen(bad, "w");
  ck_assert_ptr_nonnull(f);
  fputs("name: ok\n", f);
  ck_assert_int_eq(fclose(f), 0);
  snprintf(cmd, sizeof cmd, "check \"$(printf '%s/ok\\033[31m\\377.yaml')\"", dir);
  result r = run(cmd);
  ck_assert_msg(r.code == 0, "%s", r.err);
  char want[256];
  snprintf(want, sizeof want, "%s/ok\\x1B[31m\\xFF.yaml: ok\n", dir);
  ck_assert_str_eq(r.out, want);
  done(&r);
  snprintf(cmd, sizeof cmd, "check \"$(printf '%s/bad\\033[31m.yaml')\"", dir);
  r = run(cmd);
  ck_assert_int_eq(r.code, 1);
  snprintf(want, sizeof want, "%s/bad\\x1B[31m.yaml:1:1: error: missing required key", dir);
  ck_assert_msg(strncmp(r.err, want, strlen(want)) == 0, "%s", r.err);
  ck_assert_ptr_null(strchr(r.err, '\x1b'));
  done(&r);
  r = run("check \"$(printf '/nonexistent/\\033[2J.yaml')\"");
  ck_assert_int_eq(r.code, 1);
  ck_assert_str_eq(r.err, "/nonexistent/\\x1B[2J.yaml: error: cannot open spec: No such file or "
                          "directory\n");
  done(&r);
  snprintf(cmd, sizeof cmd, "emit \"$(printf '%s/ok\\033[31m\\377.yaml')\" -o \"$(printf "
           "'/nonexistent/\\033[1m.cu')\"", dir);
  r = run(cmd);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_null(strchr(r.err, '\x1b'));
  ck_assert_ptr_nonnull(strstr(r.err, "/nonexistent/\\x1B[1m.cu"));
  done(&r);
  r = run("\"$(printf '\\033[2J')\"");
  ck_assert_int_eq(r.code, 2);
  ck_assert_str_eq(r.err, "attngen: unknown command '\\x1B[2J'\nTry 'attngen --help'.\n");
  done(&r);
  unlink(good);
  unlink(bad);
  rmdir(dir);
}
END_TEST

/* A valid spec whose kernel does not exist yet (the backward alone with a
 * rotary base whose frequencies overflow fp32) fails check, emit and
 * compile alike, with the plan's reason at the key, and nothing written. */
START_TEST(test_unsupported_shape) {
  const char *want = "tests/spec_errors/unsupported_rotary_base_backward.yaml:8:1: error: "
                     "not supported yet: rotary base 1e-31 (below 1e-30 its frequencies overflow "
                     "fp32)\npasses: [backward]\n^\n";
  const char *cmds[] = {
      "check tests/spec_errors/unsupported_rotary_base_backward.yaml",
      "emit tests/spec_errors/unsupported_rotary_base_backward.yaml",
      "compile tests/spec_errors/unsupported_rotary_base_backward.yaml -o /tmp/ag_never.cubin",
      "run tests/spec_errors/unsupported_rotary_base_backward.yaml",
  };
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    result r = run(cmds[i]);
    ck_assert_msg(r.code == 1, "'%s' exited %d", cmds[i], r.code);
    ck_assert_str_eq(r.err, want);
    ck_assert_str_eq(r.out, "");
    done(&r);
  }
  ck_assert_int_ne(access("/tmp/ag_never.cubin", F_OK), 0);
}
END_TEST

START_TEST(test_emit_matches_library) {
  result r = run("emit specs/ads_block64_d128_bf16.yaml");
  ck_assert_int_eq(r.code, 0);
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_file("../specs/ads_block64_d128_bf16.yaml", &spec, &err), AG_OK);
  char *src;
  ck_assert_int_eq(ag_emit(&spec, &src, NULL, &err), AG_OK);
  ck_assert_str_eq(r.out, src);
  free(src);
  done(&r);
}
END_TEST

START_TEST(test_compile_writes_cubin) {
  char path[] = "/tmp/ag_cubin_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  char args[256];
  snprintf(args, sizeof args, "compile specs/ads_block64_d64_fp16.yaml --arch sm_80 -o %s", path);
  result r = run(args);
  ck_assert_msg(r.code == 0, "%s", r.err);
  size_t len;
  char *cubin = ag_test_slurp(path, &len);
  ck_assert_uint_gt(len, 4);
  ck_assert_int_eq(memcmp(cubin, "\177ELF", 4), 0);
  free(cubin);
  unlink(path);
  done(&r);
  r = run("compile specs/ads_block64_d64_fp16.yaml --arch sm_9x -o /tmp/never.cubin");
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "sm_9x"));
  done(&r);
}
END_TEST

/* NVRTC is loaded on the first compile only: without it, check and emit
 * work and compile fails in one line naming the library and the variable
 * that points to another. */
START_TEST(test_without_nvrtc) {
  setenv("ATTNGEN_LIBNVRTC", "/nonexistent/libnvrtc.so.99", 1);
  setenv("ATTNGEN_CACHE_DISABLE", "1", 1);
  result r = run("check specs/ads_block64_d64_fp16.yaml");
  ck_assert_msg(r.code == 0, "%s", r.err);
  done(&r);
  r = run("emit specs/ads_block64_d64_fp16.yaml -o /dev/null");
  ck_assert_msg(r.code == 0, "%s", r.err);
  done(&r);
  r = run("compile specs/ads_block64_d64_fp16.yaml --arch sm_90a -o /dev/null");
  ck_assert_int_eq(r.code, 1);
  ck_assert_msg(strstr(r.err, "cannot load NVRTC (/nonexistent/libnvrtc.so.99)") &&
                    strstr(r.err, "ATTNGEN_LIBNVRTC"),
                "%s", r.err);
  done(&r);
  unsetenv("ATTNGEN_LIBNVRTC");
  unsetenv("ATTNGEN_CACHE_DISABLE");
}
END_TEST

/* `attngen build` writes the four kinds of files for each spec and says
 * so in one line each; a bad --arch is a usage error (tools/test_build.sh
 * compiles and links what it writes). */
START_TEST(test_build_writes_files) {
  char dir[] = "/tmp/ag_build_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char args[256];
  snprintf(args, sizeof args, "build specs/ads_block64_d64_fp16.yaml -o %s/gen --arch sm_80", dir);
  result r = run(args);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "ads_block64_d64.cu, ads_block64_d64.h, "
                                      "ads_block64_d64_kernels.c and 1 cubin (sm_80) in"));
  done(&r);
  static const char *const files[] = {"ads_block64_d64.cu", "ads_block64_d64.h",
                                      "ads_block64_d64_kernels.c", "ads_block64_d64.sm_80.cubin"};
  for (int i = 0; i < 4; i++) {
    char path[128];
    snprintf(path, sizeof path, "%s/gen/%s", dir, files[i]);
    size_t len = 0;
    char *text = ag_test_slurp(path, &len);
    ck_assert_msg(text && len > 0, "%s", path);
    if (i == 1) ck_assert_ptr_nonnull(strstr(text, "typedef ag_block_fwd_args ads_block64_d64_forward_args;"));
    free(text);
    unlink(path);
  }
  snprintf(args, sizeof args, "%s/gen", dir);
  rmdir(args);
  rmdir(dir);
  r = run("build specs/ads_block64_d64_fp16.yaml -o /tmp/never --arch sm_80,sm_75");
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "sm_75"));
  done(&r);
  r = run("build specs/ads_block64_d64_fp16.yaml");
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "-o DIR"));
  done(&r);
  /* An empty list, an empty arch, too many: usage errors, nothing written. */
  static const char *const bad[][2] = {{"\"\"", "an empty list"},
                                       {"sm_80,,sm_90a", "an empty arch"},
                                       {"sm_80,sm_80,sm_80,sm_80,sm_80", "at most 4 archs"}};
  for (int i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "build specs/ads_block64_d64_fp16.yaml -o /tmp/never --arch %s",
             bad[i][0]);
    r = run(args);
    ck_assert_int_eq(r.code, 2);
    ck_assert_msg(strstr(r.err, bad[i][1]), "%s: %s", args, r.err);
    done(&r);
  }
  ck_assert_int_ne(access("/tmp/never", F_OK), 0);
}
END_TEST

/* `attngen COMMAND --help` (and -h, anywhere among the arguments) prints
 * that command's usage to stdout and exits 0, loading no spec; run's lists
 * its defaults, which are the ones parse_options uses. */
START_TEST(test_command_help) {
  static const char *const cmds[] = {"check", "emit", "compile", "run", "build"};
  for (int i = 0; i < 5; i++) {
    char args[128], want[64];
    snprintf(want, sizeof want, "usage: attngen %s SPEC", cmds[i]);
    for (int form = 0; form < 2; form++) {
      snprintf(args, sizeof args, form ? "%s no/such.yaml -h" : "%s --help", cmds[i]);
      result r = run(args);
      ck_assert_msg(r.code == 0, "%s: exit %d: %s", args, r.code, r.err);
      ck_assert_msg(strncmp(r.out, want, strlen(want)) == 0, "%s: %s", args, r.out);
      ck_assert_str_eq(r.err, "");
      done(&r);
    }
  }
  result r = run("run --help");
  static const char *const defaults[] = {
      "--batch N        sequences (default 8)",   "--seqlen L       longest sequence (default 1000)",
      "(default 2/5 of L: 400)",                  "--heads H        attention heads (default 4)",
      "check only (default 20)",                  "--seed S         random seed of lengths and data (default 1)",
      "--device D       device ordinal (default 0)"};
  for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
    ck_assert_msg(strstr(r.out, defaults[i]), "run --help lacks '%s':\n%s", defaults[i], r.out);
  done(&r);
  r = run("compile --help");
  ck_assert_ptr_nonnull(strstr(r.out, "sm_80"));
  ck_assert_ptr_nonnull(strstr(r.out, "sm_90a"));
  done(&r);
  /* The defaults are the ones used: --min-seqlen defaults to 2/5 of --seqlen. */
  r = run("run specs/ads_block64_d64_fp16.yaml --seqlen 100 --min-seqlen 41 --iters 0");
  ck_assert_int_ne(r.code, 2);
  done(&r);
  r = run("run specs/ads_block64_d64_fp16.yaml --seqlen 100 --min-seqlen 101");
  ck_assert_int_eq(r.code, 2);
  done(&r);
}
END_TEST

/* One arch rule: --arch takes exactly the names the spec's arch: key takes
 * (less auto), and refuses any other in one line (no ptxas output), exit 2. */
START_TEST(test_arch_rule) {
  static const char *const refused[] = {"sm_75", "sm_86", "sm_89", "sm_90", "sm_100a",
                                        "sm_120", "compute_90a", "auto"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    char args[256], want[64];
    snprintf(args, sizeof args, "compile specs/ads_block64_d64_fp16.yaml --arch %s -o /tmp/never",
             refused[i]);
    result r = run(args);
    ck_assert_msg(r.code == 2, "--arch %s: exit %d", refused[i], r.code);
    snprintf(want, sizeof want, "attngen: --arch: unsupported arch '%s': expected sm_80",
             refused[i]);
    ck_assert_msg(strncmp(r.err, want, strlen(want)) == 0, "--arch %s: %s", refused[i], r.err);
    const char *nl = strchr(r.err, '\n');
    ck_assert_msg(nl && strcmp(nl + 1, "Try 'attngen --help'.\n") == 0, "not one line: %s", r.err);
    done(&r);
  }
  ck_assert_int_ne(access("/tmp/never", F_OK), 0);
  /* The spec key and ag_arch_parse agree on every name. */
  static const char *const names[] = {"auto",  "sm_80",  "sm_90a", "sm_75", "sm_86",
                                      "sm_89", "sm_90",  "sm_100a", "sm_120", "SM_80"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char yaml[256];
    int n = snprintf(yaml, sizeof yaml,
                     "name: a\npattern: block_diagonal\nhead_dim: 64\ndtype: bf16\narch: %s\n",
                     names[i]);
    ag_spec spec;
    ag_arch parsed = AG_ARCH_AUTO;
    bool key_ok = ag_spec_load_string(yaml, (size_t)n, "a.yaml", &spec, NULL) == AG_OK;
    bool rule_ok = ag_arch_parse(names[i], true, &parsed, NULL) == AG_OK;
    ck_assert_msg(key_ok == rule_ok, "%s: spec key %d, ag_arch_parse %d", names[i], key_ok, rule_ok);
    if (key_ok) ck_assert_int_eq(spec.arch, parsed);
    if (rule_ok && parsed != AG_ARCH_AUTO)
      ck_assert_int_eq(ag_arch_parse(names[i], false, NULL, NULL), AG_OK);
  }
  ag_error err = {0};
  ck_assert_int_eq(ag_arch_parse(NULL, true, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(strchr(err.message, '\n'));
  ag_error_clear(&err);
}
END_TEST

/* Without a driver, run is skipped (3) and says why; with a GPU it passes:
 * the forward alone, both passes (a backward check and time beside the
 * forward's), the backward alone, and both with a rotary table. */
START_TEST(test_run_skips_or_passes) {
  static const struct {
    const char *args;
    int checks, backward_checks;
  } cases[] = {
      {"run specs/ads_block64_d64_fp16.yaml --batch 4 --seqlen 100 --iters 2", 1, 0},
      {"run specs/ads_block64_d128_train.yaml --batch 4 --seqlen 100 --iters 2", 2, 1},
      {"run specs/ads_block64_d128_rope.yaml --batch 3 --seqlen 130 --iters 0", 2, 1},
      {"run tests/golden/rope_half_sequence_d64_fp16_bwd.yaml --batch 2 --iters 1", 2, 1},
      {NULL, 1, 1}, /* the backward alone, from a file written here */
  };
  char path[] = "/tmp/ag_bwd_XXXXXX", args[128];
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  const char *yaml = "name: alone\npattern: block_diagonal\nblock_size: 32\nhead_dim: 64\n"
                     "dtype: fp16\ncausal: true\npasses: [backward]\n";
  ag_test_spit(path, yaml, strlen(yaml));
  snprintf(args, sizeof args, "run %s --batch 5 --seqlen 77 --iters 1", path);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const bool alone = !cases[i].args;
    result r = run(alone ? args : cases[i].args);
    ck_assert_msg(r.code == 0 || r.code == 3, "'%s' exited %d: %s%s", cases[i].args, r.code,
                  r.out, r.err);
    if (r.code == 3) {
      ck_assert_ptr_nonnull(strstr(r.out, ": skipped: "));
    } else {
      ck_assert_int_eq(ag_test_count(r.out, "PASS"), cases[i].checks);
      ck_assert_int_eq(ag_test_count(r.out, "  backward check: "), cases[i].backward_checks);
      ck_assert_int_eq(ag_test_count(r.out, "FAIL"), 0);
      ck_assert_int_eq(ag_test_count(r.out, "  shape: "), 1);
      if (alone) ck_assert_ptr_nonnull(strstr(r.out, ": ag_alone_b32_d64_fp16_causal_bwd on "));
    }
    done(&r);
  }
  unlink(path);
}
END_TEST

/* tune_block refuses bad arguments before it looks for a GPU: exit 2, the
 * reason and the usage line. */
START_TEST(test_tune_block_usage_errors) {
  static const struct {
    const char *args, *reason;
  } cases[] = {
      {"--dim 32", "--dim takes 64 or 128"},
      {"--dim", "--dim takes 64 or 128"},
      {"--fwd", "unknown option"},
      {"8", "L must be a length in 16..2^20"},
      {"1024x", "L must be a length in 16..2^20"},
      {"2000000", "L must be a length in 16..2^20"},
      {"16 32 64 128 256 512 1024 2048 4096", "at most 8 lengths"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    result r = run_binary("TUNE_BLOCK_BIN", "../build/tune_block", cases[i].args);
    char want[256];
    snprintf(want, sizeof want,
             "tune_block: %s\nusage: tune_block [--bwd] [--dim 64|128] [L ...]\n",
             cases[i].reason);
    ck_assert_msg(r.code == 2, "'%s': exit %d", cases[i].args, r.code);
    ck_assert_str_eq(r.err, want);
    ck_assert_str_eq(r.out, "");
    done(&r);
  }
}
END_TEST

Suite *cli_suite(void) {
  Suite *s = suite_create("cli");
  TCase *tc = tcase_create("cli");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_help_and_version);
  tcase_add_test(tc, test_usage_errors);
  tcase_add_test(tc, test_tune_block_usage_errors);
  tcase_add_test(tc, test_check);
  tcase_add_test(tc, test_unsupported_shape);
  tcase_add_test(tc, test_emit_matches_library);
  tcase_add_test(tc, test_compile_writes_cubin);
  tcase_add_test(tc, test_run_skips_or_passes);
  tcase_add_test(tc, test_command_help);
  tcase_add_test(tc, test_without_nvrtc);
  tcase_add_test(tc, test_build_writes_files);
  tcase_add_test(tc, test_arch_rule);
  tcase_add_test(tc, test_names_printed_escaped);
  suite_add_tcase(s, tc);
  return s;
}
