// SPDX-License-Identifier: BSD-3-Clause
/* util.h: small helpers shared by the Check suites (whole-file reads and
 * writes for golden files). */
#ifndef AG_TEST_UTIL_H
#define AG_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "attngen.h"

/* The whole file as a NUL-terminated string from malloc() (length in
 * *out_len when non-NULL), or NULL when it cannot be read. */
char *ag_test_slurp(const char *path, size_t *out_len);
/* Write `len` bytes to `path`, failing the current test on error. */
void ag_test_spit(const char *path, const char *text, size_t len);
/* A fresh directory "/tmp/<prefix>-XXXXXX" from mkdtemp, as a string from
 * malloc(); fails the current test when it cannot be made. */
char *ag_test_mkdtemp(const char *prefix);
/* Remove a directory tree (no-op for NULL). */
void ag_test_remove_tree(const char *dir);
/* How many times `needle` occurs in `hay`, not overlapping. */
int ag_test_count(const char *hay, const char *needle);
/* ptxas's -v report for `kernel` in an NVRTC log: its registers, spill
 * stores and loads in bytes; false when the log has no report for it
 * (NVRTC sometimes returns an empty log for -v). */
int ag_test_ptxas_report(const char *log, const char *kernel, int *out_regs, int *out_stores,
                         int *out_loads);
/* A fresh directory "/tmp/<label>-XXXXXX" where NVRTC dumps its sources
 * and ptxas's -v report (AG_ENV_DUMP_DIR, AG_ENV_NVRTC_VERBOSE set);
 * ag_test_dump_end undoes both, removes it and frees `dir`. */
char *ag_test_dump_begin(const char *label);
void ag_test_dump_end(char *dir);
/* Compile `src` (its first kernel `first`) for `arch` inside such a
 * directory `dir`, failing the test unless NVRTC gives an ELF cubin; the
 * report of `kernel` in *regs, *stores, *loads (printed), or 0 when NVRTC
 * gave none (it sometimes returns an empty log for -v). */
int ag_test_compile_report(const char *src, const char *first, const char *arch,
                           const char *kernel, const char *dir, int *regs, int *stores,
                           int *loads);
/* True when AG_UPDATE_GOLDENS=1: golden tests rewrite their files. */
int ag_test_update_goldens(void);

/* Past 2^31 elements per tensor: AG_HUGE_BATCH sequences of 17 or 18
 * tokens, which with AG_HUGE_HEADS heads of 128 make 2,348,810,240
 * elements. The lengths (malloc()ed), or NULL after printing "SKIP test:
 * ..." when ATTNGEN_TEST_SKIP_HUGE is set (under compute-sanitizer such a
 * run takes hours). */
enum { AG_HUGE_BATCH = 131072, AG_HUGE_HEADS = 8 };
int32_t *ag_test_huge_lengths(const char *test);

/* A context on device 0, or NULL after printing "SKIP test: why" when no
 * driver or device is present; any other failure fails the test. */
ag_context *ag_test_gpu_or_skip(const char *test);

#endif
