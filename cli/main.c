// SPDX-License-Identifier: BSD-3-Clause
/* main.c: the attngen command line. Thin on purpose: each subcommand is a
 * few calls into the generator and runtime libraries; this file only parses
 * arguments, prints and picks exit codes (0 ok, 1 failed, 2 usage,
 * 3 skipped: no GPU). It includes only the public header and the tools
 * library's (attngen_tools.h, selfcheck.h, reference.h), never an internal
 * one. */
#include <errno.h>
#include <sys/stat.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attngen.h"
#include "attngen_tools.h"
#include "reference.h"
#include "selfcheck.h"
#include "selfcheck_jagged.h"
#include "cli.h"

enum { EXIT_USAGE = 2, EXIT_SKIPPED = 3 };

/* run's defaults, in its help and in parse_options. */
enum {
  DEFAULT_BATCH = 8, DEFAULT_SEQLEN = 1000, DEFAULT_HEADS = 4, DEFAULT_SEED = 1,
  DEFAULT_ITERS = 20, DEFAULT_DEVICE = 0, DEFAULT_N_Q = 64
};
#define DEFAULT_MIN_SEQLEN(seqlen) ((seqlen) * 2 / 5)

static const char usage_text[] =
    "usage: attngen COMMAND [OPTIONS]\n"
    "\n"
    "Generate specialized CUDA attention kernels from YAML specs.\n"
    "\n"
    "commands:\n"
    "  check SPEC...                 validate specs; print every error\n"
    "  emit SPEC [-o FILE]           write the generated CUDA C (stdout by default)\n"
    "  compile SPEC -o FILE [--arch ARCH]\n"
    "                                compile with NVRTC to a cubin (no GPU needed;\n"
    "                                ARCH: sm_80 or sm_90a, default the spec's, else sm_90a)\n"
    "  build SPEC... -o DIR [--arch LIST]\n"
    "                                per spec: the CUDA C, a cubin per arch, a C header\n"
    "                                with typed launch functions and a C file embedding\n"
    "                                the cubins (LIST: default the spec's arch, else\n"
    "                                sm_80,sm_90a)\n"
    "  run SPEC [--batch N] [--seqlen L] [--min-seqlen M] [--heads H] [--n-q N]\n"
    "           [--seed S] [--iters N] [--device D]\n"
    "                                on a GPU: compile (cached), run each pass of the\n"
    "                                spec (forward, backward) on random data with\n"
    "                                lengths uniform in [M, L], check against a\n"
    "                                float64 reference, print time and bandwidth\n"
    "\n"
    "options:\n"
    "  -h, --help                    show this help ('attngen COMMAND --help': one command's)\n"
    "  -V, --version                 show the version\n"
    "\n"
    "environment: ATTNGEN_CACHE_DIR, ATTNGEN_CACHE_DISABLE, ATTNGEN_DUMP_DIR\n";

/* Each command's --help (stdout, exit 0). */
static void command_help(const char *cmd) {
  if (!strcmp(cmd, "check")) {
    fputs("usage: attngen check SPEC...\n"
          "\n"
          "Validate each spec; print 'SPEC: ok', or every error found as\n"
          "file:line:col with the source line. Exit 1 if any spec is invalid or\n"
          "asks for a kernel attngen does not build yet.\n",
          stdout);
  } else if (!strcmp(cmd, "emit")) {
    fputs("usage: attngen emit SPEC [-o FILE]\n"
          "\n"
          "Write the spec's generated CUDA C: one file with the kernel of each pass.\n"
          "\n"
          "  -o, --output FILE   where to write it (default: stdout; '-' is stdout)\n",
          stdout);
  } else if (!strcmp(cmd, "compile")) {
    fputs("usage: attngen compile SPEC -o FILE [--arch ARCH]\n"
          "\n"
          "Compile the spec's CUDA C with NVRTC to a cubin (no GPU needed), through\n"
          "the disk cache.\n"
          "\n"
          "  -o, --output FILE   the cubin (required)\n"
          "  --arch ARCH         sm_80 (runs on every 8.x GPU) or sm_90a (H100, H200);\n"
          "                      default: the spec's arch, else sm_90a\n",
          stdout);
  } else if (!strcmp(cmd, "build")) {
    fputs("usage: attngen build SPEC... -o DIR [--arch LIST]\n"
          "\n"
          "Build-time generation: for each spec NAME, write into DIR (created if\n"
          "missing) NAME.cu (the CUDA C), NAME.ARCH.cubin for each arch, NAME.h (a\n"
          "load function and a typed launch function per pass) and NAME_kernels.c\n"
          "(the spec and the cubins embedded). An application compiles\n"
          "NAME_kernels.c, links libattngen and calls NAME_load: the kernels load\n"
          "from the embedded cubins, with no NVRTC compile at run time.\n"
          "\n"
          "  -o, --output DIR    where to write them (required)\n"
          "  --arch LIST         comma-separated archs, sm_80 and/or sm_90a; default: the\n"
          "                      spec's arch, else sm_80,sm_90a\n",
          stdout);
  } else {
    printf("usage: attngen run SPEC [OPTIONS]\n"
           "\n"
           "On a GPU: compile (cached), run each pass of the spec on random data with\n"
           "lengths uniform in [M, L], check against a float64 reference, and print\n"
           "time and bandwidth. Exit 3 (skipped) without a driver or GPU.\n"
           "\n"
           "  --batch N        sequences (default %d)\n"
           "  --seqlen L       longest sequence (default %d)\n"
           "  --min-seqlen M   shortest sequence (default 2/5 of L: %d)\n"
           "  --heads H        attention heads (default %d)\n"
           "  --n-q N          shared queries of a broadcast spec (query: broadcast;\n"
           "                   default %d); the lengths are then the keys'\n"
           "  --iters N        timed iterations, 0: check only (default %d)\n"
           "  --seed S         random seed of lengths and data (default %d)\n"
           "  --device D       device ordinal (default %d)\n",
           DEFAULT_BATCH, DEFAULT_SEQLEN, DEFAULT_MIN_SEQLEN(DEFAULT_SEQLEN), DEFAULT_HEADS,
           DEFAULT_N_Q, DEFAULT_ITERS, DEFAULT_SEED, DEFAULT_DEVICE);
  }
}

/* Whether argv[1..] asks for help (before a "--", which ends the options). */
static bool wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--")) return false;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
  }
  return false;
}

/* Print s with control characters (C0 but, when keep_lines, newline and
 * tab; DEL; C1) and bytes that are not valid UTF-8 as \xNN, so that an
 * escape sequence in a file name or argument never reaches the terminal.
 * The library escapes the names in spec errors itself; this covers every
 * other message that may carry one (output paths, the cache directory). */
static void put_escaped(const char *s, bool keep_lines, FILE *f) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    size_t w = 0;
    uint32_t v = 0, min = 0;
    if ((*p >= 0x20 && *p < 0x7F) || (keep_lines && (*p == '\n' || *p == '\t'))) w = 1, v = 0x20;
    else if ((*p & 0xE0) == 0xC0) w = 2, v = *p & 0x1F, min = 0x80;
    else if ((*p & 0xF0) == 0xE0) w = 3, v = *p & 0x0F, min = 0x800;
    else if ((*p & 0xF8) == 0xF0) w = 4, v = *p & 0x07, min = 0x10000;
    for (size_t i = 1; i < w; i++) {
      if ((p[i] & 0xC0) != 0x80) { w = 0; break; } /* also stops at the NUL */
      v = (v << 6) | (p[i] & 0x3F);
    }
    if (w > 1 && (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) || v <= 0x9F)) w = 0;
    if (w) {
      fwrite(p, 1, w, f);
      p += w;
    } else {
      fprintf(f, "\\x%02X", *p++);
    }
  }
}

/* printf("%s<rest>") with the string escaped (put_escaped). */
static void print_name(FILE *f, const char *name, const char *rest) {
  put_escaped(name, false, f);
  fputs(rest, f);
}

static int usage_error(const char *fmt, const char *arg) {
  char *msg = NULL;
  fprintf(stderr, "attngen: ");
  if (asprintf(&msg, fmt, arg) >= 0) put_escaped(msg, false, stderr);
  free(msg);
  fprintf(stderr, "\nTry 'attngen --help'.\n");
  return EXIT_USAGE;
}

static int report(ag_error *err) {
  if (err->message && err->message[0]) {
    put_escaped(err->message, true, stderr);
    if (err->message[strlen(err->message) - 1] != '\n') fputc('\n', stderr);
  } else {
    fprintf(stderr, "attngen: %s\n", ag_strerror(err->code));
  }
  ag_error_clear(err);
  return 1;
}

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

/* ---- check ---- */
/* A spec from standard input ("-"), named "<stdin>" in messages; reads at
 * most one byte past the loader's 1 MiB limit, so the loader refuses more. */
static ag_status load_stdin(ag_spec *spec, ag_error *err) {
  size_t cap = (1u << 20) + 2, len = 0;
  char *text = malloc(cap);
  if (!text) return AG_ERR_NOMEM;
  for (size_t n; len < cap && (n = fread(text + len, 1, cap - len, stdin)) > 0;) len += n;
  ag_status st = AG_ERR_IO;
  if (ferror(stdin))
    fprintf(stderr, "<stdin>: error: cannot read the spec: %s\n", strerror(errno));
  else
    st = ag_spec_load_string(text, len, "<stdin>", spec, err);
  free(text);
  return st;
}

static int cmd_check(int argc, char **argv) {
  if (argc < 2) return usage_error("%s", "check needs at least one SPEC");
  int rc = 0;
  for (int i = 1; i < argc; i++) {
    ag_spec spec;
    ag_error err = {0};
    bool in = strcmp(argv[i], "-") == 0;
    if ((in ? load_stdin(&spec, &err) : ag_spec_load_file(argv[i], &spec, &err)) != AG_OK)
      rc = err.message ? report(&err) : 1;
    else
      print_name(stdout, in ? "<stdin>" : argv[i], ": ok\n");
  }
  return rc;
}

/* Options shared by emit, compile and run. */
typedef struct options {
  const char *spec, *output, *arch;
  int64_t batch, seqlen, min_seqlen, heads, seed, iters, device, n_q;
} options;

static int parse_options(int argc, char **argv, const char *allowed, options *o) {
  static const struct option longopts[] = {
      {"output", required_argument, 0, 'o'}, {"arch", required_argument, 0, 'a'},
      {"batch", required_argument, 0, 'b'},  {"seqlen", required_argument, 0, 'L'},
      {"min-seqlen", required_argument, 0, 'M'}, {"heads", required_argument, 0, 'H'},
      {"seed", required_argument, 0, 's'},   {"iters", required_argument, 0, 'i'},
      {"device", required_argument, 0, 'd'}, {"n-q", required_argument, 0, 'n'},
      {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->batch = DEFAULT_BATCH;
  o->seqlen = DEFAULT_SEQLEN;
  o->min_seqlen = -1;
  o->heads = DEFAULT_HEADS;
  o->seed = DEFAULT_SEED;
  o->iters = DEFAULT_ITERS;
  o->device = DEFAULT_DEVICE;
  o->n_q = DEFAULT_N_Q;
  optind = 1;
  opterr = 0;
  int c, index = -1;
  while ((c = getopt_long(argc, argv, "o:", longopts, &index)) != -1) {
    if (c == '?') return usage_error("unknown option or missing value '%s'", argv[optind - 1]);
    if (!strchr(allowed, c)) {
      /* A known option this command does not take; name it as written. */
      char name[32];
      if (index >= 0) snprintf(name, sizeof name, "--%s", longopts[index].name);
      else snprintf(name, sizeof name, "-%c", c);
      return usage_error("option '%s' does not apply to this command", name);
    }
    index = -1;
    bool ok = true;
    switch (c) {
    case 'o': o->output = optarg; break;
    case 'a': o->arch = optarg; break;
    case 'b': ok = parse_i64(optarg, 1, INT32_MAX, &o->batch); break;
    case 'L': ok = parse_i64(optarg, 0, INT32_MAX, &o->seqlen); break;
    case 'M': ok = parse_i64(optarg, 0, INT32_MAX, &o->min_seqlen); break;
    case 'H': ok = parse_i64(optarg, 1, 1024, &o->heads); break;
    case 's': ok = parse_i64(optarg, 0, INT64_MAX, &o->seed); break;
    case 'i': ok = parse_i64(optarg, 0, 100000, &o->iters); break;
    case 'd': ok = parse_i64(optarg, 0, 1024, &o->device); break;
    case 'n': ok = parse_i64(optarg, 0, 65536, &o->n_q); break;
    }
    if (!ok) return usage_error("bad value '%s' for an option", optarg);
  }
  if (optind != argc - 1)
    return usage_error("%s", optind >= argc ? "missing SPEC" : "expected exactly one SPEC");
  o->spec = argv[optind];
  if (o->min_seqlen < 0) o->min_seqlen = DEFAULT_MIN_SEQLEN(o->seqlen);
  if (o->min_seqlen > o->seqlen) return usage_error("%s", "--min-seqlen exceeds --seqlen");
  return 0;
}

static int write_output(const char *path, const void *data, size_t len) {
  if (!path || strcmp(path, "-") == 0) {
    if (fwrite(data, 1, len, stdout) != len || fflush(stdout) != 0) {
      perror("attngen: stdout");
      return 1;
    }
    return 0;
  }
  ag_error err = {0};
  if (ag_tool_write_file(path, data, len, &err) != AG_OK) return report(&err);
  return 0;
}

/* ---- emit ---- */
static int cmd_emit(int argc, char **argv) {
  options o;
  int rc = parse_options(argc, argv, "o", &o);
  if (rc) return rc;
  ag_spec spec;
  ag_error err = {0};
  char *src;
  if (ag_spec_load_file(o.spec, &spec, &err) != AG_OK) return report(&err);
  if (ag_emit(&spec, &src, NULL, &err) != AG_OK) return report(&err);
  rc = write_output(o.output, src, strlen(src));
  free(src);
  return rc;
}

/* ---- compile ---- */
static int cmd_compile(int argc, char **argv) {
  options o;
  int rc = parse_options(argc, argv, "oa", &o);
  if (rc) return rc;
  if (!o.output) return usage_error("%s", "compile needs -o FILE");
  ag_spec spec;
  ag_error err = {0};
  if (ag_spec_load_file(o.spec, &spec, &err) != AG_OK) return report(&err);
  /* One rule for --arch and the spec's arch: key (ag_arch_parse). */
  if (o.arch && ag_arch_parse(o.arch, false, NULL, &err) != AG_OK) {
    char why[256];
    snprintf(why, sizeof why, "--arch: %s", err.message);
    ag_error_clear(&err);
    return usage_error("%s", why);
  }
  const char *arch = o.arch ? o.arch : ag_arch_name(spec.arch);
  if (!arch) arch = "sm_90a";
  void *cubin;
  size_t size;
  char *warning = NULL;
  if (ag_tool_compile(&spec, arch, &cubin, &size, &warning, &err) != AG_OK)
    return report(&err);
  if (warning) fputs("attngen: warning: ", stderr), print_name(stderr, warning, "\n");
  free(warning);
  rc = write_output(o.output, cubin, size);
  free(cubin);
  return rc;
}

/* ---- run ---- */

/* The line that names the shape a run checked. */
static void print_shape(const options *o, int64_t blocks) {
  printf("  shape: batch %" PRId64 ", lengths in [%" PRId64 ", %" PRId64 "], heads %" PRId64
         ", %" PRId64 " blocks\n",
         o->batch, o->min_seqlen, o->seqlen, o->heads, blocks);
}

/* Check (and time) the forward on `lengths`; prints its lines. */
static ag_status run_forward(ag_kernel *kern, const int32_t *lengths, const options *o,
                             const ag_check_options *copt, bool *pass, ag_error *err) {
  ag_check_result r;
  ag_status st = ag_selfcheck_block_forward(kern, lengths, o->batch, o->heads, copt, &r, err);
  if (st != AG_OK) return st;
  double tol = ag_check_tolerance(ag_kernel_spec(kern)->dtype, false);
  *pass = r.rel_error <= tol && r.unwritten == 0 && r.guard_clobbered == 0;
  print_shape(o, r.blocks);
  printf("  check: rel error %.3g (limit %.0e) over %" PRId64 " sequences, %" PRId64
         " unwritten, %" PRId64 " written past the end: %s\n",
         r.rel_error, tol, r.sampled_seqs, r.unwritten, r.guard_clobbered,
         *pass ? "PASS" : "FAIL");
  if (o->iters > 0 && r.median_ms > 0)
    printf("  time: %.4f ms (median of %" PRId64 "), %.3f TB/s for Q, K, V read and O written\n",
           r.median_ms, o->iters, r.bytes / (r.median_ms * 1e-3) / 1e12);
  return AG_OK;
}

/* The same for the backward: dQ, dK, dV each within the backward's limit,
 * every element written, nothing past the end. `shape`: print the shape
 * line (the spec has no forward to print it). */
static ag_status run_backward(ag_kernel *kern, const int32_t *lengths, const options *o,
                              const ag_check_options *copt, bool shape, bool *pass,
                              ag_error *err) {
  ag_check_bwd_result r;
  ag_status st = ag_selfcheck_block_backward(kern, lengths, o->batch, o->heads, copt, &r, err);
  if (st != AG_OK) return st;
  double tol = ag_check_tolerance(ag_kernel_spec(kern)->dtype, true);
  int64_t unwritten = r.unwritten[0] + r.unwritten[1] + r.unwritten[2];
  *pass = r.rel_error[0] <= tol && r.rel_error[1] <= tol && r.rel_error[2] <= tol &&
          unwritten == 0 && r.guard_clobbered == 0;
  if (shape) print_shape(o, r.blocks);
  printf("  backward check: rel error dq %.3g, dk %.3g, dv %.3g (limit %.0e) over %" PRId64
         " sequences, %" PRId64 " unwritten, %" PRId64 " written past the end: %s\n",
         r.rel_error[0], r.rel_error[1], r.rel_error[2], tol, r.sampled_seqs, unwritten,
         r.guard_clobbered, *pass ? "PASS" : "FAIL");
  if (o->iters > 0 && r.median_ms > 0)
    printf("  backward time: %.4f ms (median of %" PRId64 "), %.3f TB/s for Q, K, V, dO read "
           "and dQ, dK, dV written\n",
           r.median_ms, o->iters, r.bytes / (r.median_ms * 1e-3) / 1e12);
  return AG_OK;
}

/* A jagged spec: self-attention over the lengths (a broadcast spec: n_q
 * shared queries over keys of those lengths), every pass checked against
 * float64 (the backward five times, bit for bit), then timed. */
static ag_status run_jagged(ag_kernel *kern, const int32_t *lengths, const options *o,
                            bool *pass, ag_error *err) {
  const ag_spec *spec = ag_kernel_spec(kern);
  const bool bcast = spec->query == AG_QUERY_BROADCAST;
  ag_jagged_check_options jopt = {.seed = (uint64_t)o->seed, .heads = o->heads,
                                  .backward = true, .repeat_backward = 4, .iters = (int)o->iters};
  ag_jagged_check_result r;
  /* lengths holds batch more entries, each n_q */
  ag_status st = bcast ? ag_selfcheck_jagged(kern, lengths + o->batch, lengths, o->batch, &jopt,
                                             &r, err)
                       : ag_selfcheck_jagged(kern, lengths, NULL, o->batch, &jopt, &r, err);
  if (st != AG_OK) return st;
  int64_t tokens = 0;
  for (int64_t i = 0; i < o->batch; i++) tokens += lengths[i];
  printf("  shape: batch %" PRId64 ", %slengths in [%" PRId64 ", %" PRId64 "], heads %" PRId64
         ", %" PRId64 " tokens",
         o->batch, bcast ? "key " : "", o->min_seqlen, o->seqlen, o->heads, tokens);
  if (bcast) printf(", %" PRId64 " shared queries", o->n_q);
  printf("\n");
  const bool fwd = spec->passes & AG_PASS_FORWARD, bwd = spec->passes & AG_PASS_BACKWARD;
  const double tol = ag_jagged_tolerance(spec->dtype, false),
               btol = ag_jagged_tolerance(spec->dtype, true);
  bool fwd_ok = !fwd || (r.rel_o <= tol && r.lse_abs <= 2e-3 && r.lse_mismatch == 0);
  /* the fast sm_90a backward adds dQ with atomics: its dK, dV repeat */
  const bool repeat_ok = r.bitwise_repeatable || (r.dq_by_atomics && r.dkv_repeatable);
  bool bwd_ok = !bwd || (r.rel_dq <= btol && r.rel_dk <= btol && r.rel_dv <= btol && repeat_ok);
  *pass = fwd_ok && bwd_ok && r.unwritten == 0;
  if (fwd)
    printf("  check: rel error %.3g (limit %.0e), logsumexp max error %.2g, over %" PRId64
           " (sequence, head) pairs: %s\n",
           r.rel_o, tol, r.lse_abs, r.checked_pairs, fwd_ok && r.unwritten == 0 ? "PASS" : "FAIL");
  if (bwd)
    printf("  backward check: rel error dq %.3g, dk %.3g, dv %.3g (limit %.0e), five runs %s: "
           "%s\n",
           r.rel_dq, r.rel_dk, r.rel_dv, btol,
           r.bitwise_repeatable ? "bit-identical"
           : repeat_ok          ? "dK, dV bit-identical (dQ added by atomics)"
                                : "DIFFERENT",
           bwd_ok ? "PASS" : "FAIL");
  if (r.unwritten) printf("  %" PRId64 " output elements never written: FAIL\n", r.unwritten);
  if (fwd && r.fwd_ms > 0)
    printf("  time: %.4f ms (median of %" PRId64 "), %.1f TFLOP/s (useful)\n", r.fwd_ms,
           o->iters, r.fwd_flops / (r.fwd_ms * 1e-3) / 1e12);
  if (bwd && r.bwd_ms > 0)
    printf("  backward time: %.4f ms (median of %" PRId64 "), %.1f TFLOP/s (useful, 2.5x the "
           "forward's)\n",
           r.bwd_ms, o->iters, 2.5 * r.fwd_flops / (r.bwd_ms * 1e-3) / 1e12);
  return AG_OK;
}

/* Compile (cached), then check and time each pass the spec names on the
 * same lengths: the forward, then the backward. */
static int cmd_run(int argc, char **argv) {
  options o;
  int rc = parse_options(argc, argv, "bLMHsidn", &o);
  if (rc) return rc;
  ag_spec spec;
  ag_error err = {0};
  if (ag_spec_load_file(o.spec, &spec, &err) != AG_OK) return report(&err);
  ag_context *ctx = NULL;
  ag_status st = ag_context_create((int)o.device, &ctx, &err);
  if (st == AG_ERR_NO_DRIVER || st == AG_ERR_NO_DEVICE) {
    print_name(stdout, o.spec, ": skipped: ");
    printf("%s (", ag_strerror(st));
    print_name(stdout, err.message ? err.message : "", ")\n");
    ag_error_clear(&err);
    return EXIT_SKIPPED;
  }
  if (st != AG_OK) return report(&err);
  ag_kernel *kern;
  /* the lengths, then (for a broadcast spec's queries) n_q batch times */
  int32_t *lengths = malloc(sizeof(int32_t) * 2 * (size_t)o.batch);
  if (!lengths) {
    ag_context_destroy(ctx);
    fprintf(stderr, "attngen: out of memory\n");
    return 1;
  }
  uint64_t rng = (uint64_t)o.seed * 2654435761u + 1;
  for (int64_t i = 0; i < o.batch; i++)
    lengths[i] = (int32_t)(o.min_seqlen +
                           (int64_t)(ag_rand_next(&rng) % (uint64_t)(o.seqlen - o.min_seqlen + 1)));
  for (int64_t i = 0; i < o.batch; i++) lengths[o.batch + i] = (int32_t)o.n_q;
  ag_check_options copt = {.seed = (uint64_t)o.seed, .time_iters = (int)o.iters,
                           .warmup_iters = o.iters ? 3 : 0};
  st = ag_kernel_get(ctx, &spec, &kern, &err);
  char *warning = ag_tool_cache_warning(ctx);
  if (warning) fputs("attngen: warning: ", stderr), print_name(stderr, warning, "\n");
  free(warning);
  bool fwd_pass = true, bwd_pass = true;
  if (st == AG_OK) {
    print_name(stdout, o.spec, ": ");
    for (int i = 0; ag_tool_kernel_name(kern, i); i++)
      printf("%s%s", i ? " and " : "", ag_tool_kernel_name(kern, i));
    printf(" on %s\n", ag_tool_device_name(ctx));
    if (spec.pattern == AG_PATTERN_JAGGED)
      st = run_jagged(kern, lengths, &o, &fwd_pass, &err);
    else if (spec.passes & AG_PASS_FORWARD)
      st = run_forward(kern, lengths, &o, &copt, &fwd_pass, &err);
    if (st == AG_OK && spec.pattern != AG_PATTERN_JAGGED && (spec.passes & AG_PASS_BACKWARD))
      st = run_backward(kern, lengths, &o, &copt, !(spec.passes & AG_PASS_FORWARD), &bwd_pass,
                        &err);
  }
  free(lengths);
  ag_context_destroy(ctx);
  if (st != AG_OK) return report(&err);
  return fwd_pass && bwd_pass ? 0 : 1;
}

/* ---- shared with the other commands' files (cli.h) ------------------------ */

int cli_write_output(const char *path, const void *data, size_t len) {
  return write_output(path, data, len);
}
int cli_report(ag_error *err) { return report(err); }
int cli_usage(const char *fmt, const char *arg) { return usage_error(fmt, arg); }
int cli_fail(const char *what) {
  fputs("attngen: ", stderr);
  put_escaped(what, false, stderr);
  fputc('\n', stderr);
  return 1;
}
void cli_warn(const char *text) {
  fputs("attngen: warning: ", stderr);
  print_name(stderr, text, "\n");
}
void cli_print_name(FILE *f, const char *name, const char *rest) { print_name(f, name, rest); }
int cli_mkdirs(const char *dir) {
  char *p = strdup(dir);
  if (!p) return cli_fail("out of memory");
  for (char *q = p + 1;; q++) {
    const char c = *q;
    if (c == '/' || c == '\0') {
      *q = '\0';
      if (mkdir(p, 0777) != 0 && errno != EEXIST) {
        fputs("attngen: cannot create ", stderr);
        print_name(stderr, p, ": ");
        fprintf(stderr, "%s\n", strerror(errno));
        free(p);
        return 1;
      }
      *q = c;
    }
    if (c == '\0') break;
  }
  free(p);
  return 0;
}

/* At exit: output that never reached stdout (a full disk, /dev/full, a
 * closed pipe) is a failure, as in coreutils' close_stdout. */
static void close_stdout(void) {
  if (fclose(stdout) != 0) {
    fprintf(stderr, "attngen: error writing standard output: %s\n", strerror(errno));
    _Exit(1);
  }
}

int main(int argc, char **argv) {
  atexit(close_stdout);
  if (argc < 2) return usage_error("%s", "missing COMMAND");
  const char *cmd = argv[1];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version")) {
    printf("attngen %s\n", AG_VERSION_STRING);
    return 0;
  }
  if ((!strcmp(cmd, "check") || !strcmp(cmd, "emit") || !strcmp(cmd, "compile") ||
       !strcmp(cmd, "run") || !strcmp(cmd, "build")) &&
      wants_help(argc - 1, argv + 1)) {
    command_help(cmd);
    return 0;
  }
  if (!strcmp(cmd, "check")) return cmd_check(argc - 1, argv + 1);
  if (!strcmp(cmd, "emit")) return cmd_emit(argc - 1, argv + 1);
  if (!strcmp(cmd, "compile")) return cmd_compile(argc - 1, argv + 1);
  if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
  if (!strcmp(cmd, "build")) return cli_build(argc - 1, argv + 1);
  return usage_error("unknown command '%s'", cmd);
}
