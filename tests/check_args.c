// SPDX-License-Identifier: BSD-3-Clause
/* check_args.c: ag_block_forward's argument checks, with no GPU. A kernel
 * struct is built on the stack from a real spec and plan; its context is
 * zeroed, so a driver call before the checks would crash the test (its
 * driver table is NULL). Accepted arguments reach a fake driver that
 * records the launch. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_driver.h"
#include "runtime.h"

/* ---- a kernel without a device ---------------------------------------------- */

static const char spec_yaml[] = "name: args_b64\n"
                                "pattern: block_diagonal\n"
                                "block_size: 64\n"
                                "head_dim: 128\n"
                                "dtype: bf16\n"
                                "arch: sm_90a\n";

typedef struct fake {
  ag_context ctx; /* zeroed: drv is NULL */
  ag_kernel kernel;
} fake;

static void fake_init(fake *f) {
  memset(f, 0, sizeof *f);
  ag_error err = {0};
  ag_status st = ag_spec_load_string(spec_yaml, strlen(spec_yaml), NULL, &f->kernel.spec, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message);
  st = ag_plan_make(&f->kernel.spec, &f->kernel.plan, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message);
  ck_assert_int_eq(f->kernel.plan.block_size, 64);
  ck_assert_int_eq(f->kernel.plan.head_dim, 128);
  ck_assert_int_eq(f->kernel.plan.elem_bytes, 2);
  f->kernel.ctx = &f->ctx;
  strcpy(f->kernel.arch, "sm_90a");
}

/* Valid arguments for two sequences of 37 and 63 tokens, 8 heads. Device
 * pointers are never dereferenced on the host, so any aligned value does. */
static ag_block_fwd_args valid_args(void) {
  ag_block_fwd_args a;
  memset(&a, 0, sizeof a);
  a.q = (const void *)(uintptr_t)0x100000;
  a.k = (const void *)(uintptr_t)0x200000;
  a.v = (const void *)(uintptr_t)0x300000;
  a.o = (void *)(uintptr_t)0x400000;
  a.offsets = (const int32_t *)(uintptr_t)0x500000;
  a.batch = 2;
  a.heads = 8;
  a.total_tokens = 100;
  return a;
}

/* Expect a rejection with exactly `want`; the fake context has no driver. */
static void expect_reject(fake *f, const ag_block_fwd_args *a, const char *want) {
  ag_error err = {0};
  ag_status st = ag_block_forward(&f->kernel, a, NULL, &err);
  ck_assert_msg(st == AG_ERR_INVALID_ARGUMENT, "status %s (%s), expected a rejection: %s",
                ag_strerror(st), err.message ? err.message : "", want);
  ck_assert_int_eq(err.code, AG_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(err.message);
  ck_assert_str_eq(err.message, want);
  ag_error_clear(&err);
  /* The same without an error record. */
  ck_assert_int_eq(ag_block_forward(&f->kernel, a, NULL, NULL), AG_ERR_INVALID_ARGUMENT);
}

/* ---- a fake driver that records launches --------------------------------------- */

static void give_driver(fake *f) {
  ag_fake_driver_attach(&f->ctx, 5); /* q, k, v, o, offsets */
  f->kernel.ctas_per_sm[0] = 2;
  f->kernel.fn[0] = (CUfunction)(uintptr_t)0x1234;
}

static void expect_launch(fake *f, const ag_block_fwd_args *a) {
  ag_error err = {0};
  ag_status st = ag_block_forward(&f->kernel, a, NULL, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message);
  ck_assert_ptr_null(err.message);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ck_assert_int_eq(ag_fake_seen.pushes, 1);
  ck_assert_int_eq(ag_fake_seen.pops, 1);
  ck_assert_uint_eq(ag_fake_seen.block, (unsigned)f->kernel.plan.fwd.threads);
  ck_assert_uint_eq(ag_fake_seen.smem, (unsigned)f->kernel.plan.fwd.smem_bytes);
  ck_assert_uint_eq(ag_fake_seen.ptr[0], (CUdeviceptr)(uintptr_t)a->q);
  ck_assert_uint_eq(ag_fake_seen.ptr[3], (CUdeviceptr)(uintptr_t)a->o);
  ck_assert_uint_eq(ag_fake_seen.ptr[4], (CUdeviceptr)(uintptr_t)a->offsets);
  ck_assert_int_eq(ag_fake_seen.batch, a->batch);
  ck_assert_int_eq(ag_fake_seen.heads, a->heads);
  ck_assert_int_eq(ag_fake_seen.total, a->total_tokens);
  const int hpt = f->kernel.plan.fwd.heads_per_tile;
  int64_t groups = (a->heads + hpt - 1) / hpt;
  ck_assert_int_eq(ag_fake_seen.items, (a->batch + a->total_tokens / 64) * groups);
  ck_assert_uint_ge(ag_fake_seen.grid, 1);
  ck_assert_uint_le(ag_fake_seen.grid, (unsigned long long)ag_fake_seen.items);
}

/* The device's primary context already current (as torch leaves it): the
 * launch neither pushes nor pops it; another current context is pushed
 * over and restored. */
START_TEST(current_context_not_pushed) {
  fake f;
  fake_init(&f);
  give_driver(&f);
  ag_block_fwd_args a = valid_args();
  ag_fake_seen.current = f.ctx.cu;
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, NULL), AG_OK);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  ck_assert_int_eq(ag_fake_seen.pushes, 0);
  ck_assert_int_eq(ag_fake_seen.pops, 0);
  ck_assert_ptr_eq(ag_fake_seen.current, f.ctx.cu);
  CUcontext other = (CUcontext)(uintptr_t)0xD0;
  ag_fake_seen.current = other;
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, NULL), AG_OK);
  ck_assert_int_eq(ag_fake_seen.count, 2);
  ck_assert_int_eq(ag_fake_seen.pushes, 1);
  ck_assert_int_eq(ag_fake_seen.pops, 1);
  ck_assert_ptr_eq(ag_fake_seen.current, other);
}
END_TEST

/* ---- handles and kernel kind ------------------------------------------------------- */

START_TEST(null_handles) {
  fake f;
  fake_init(&f);
  ag_block_fwd_args a = valid_args();
  ag_error err = {0};
  ck_assert_int_eq(ag_block_forward(NULL, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "kernel or args is NULL");
  ck_assert_int_eq(ag_block_forward(&f.kernel, NULL, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "kernel or args is NULL");
  ag_error_clear(&err);
}
END_TEST

START_TEST(wrong_kernel_kind) {
  fake f;
  fake_init(&f);
  ag_block_fwd_args a = valid_args();
  f.kernel.spec.passes = AG_PASS_BACKWARD;
  expect_reject(&f, &a, "kernel 'args_b64' is not a block-diagonal forward kernel");
  fake_init(&f);
  f.kernel.spec.pattern = AG_PATTERN_JAGGED;
  expect_reject(&f, &a, "kernel 'args_b64' is not a block-diagonal forward kernel");
}
END_TEST

/* ---- sizes --------------------------------------------------------------------------- */

START_TEST(negative_and_zero_sizes) {
  fake f;
  fake_init(&f);
  ag_block_fwd_args a = valid_args();
  a.batch = -1;
  expect_reject(&f, &a, "need batch >= 0, heads >= 1, total_tokens >= 0 (got -1, 8, 100)");
  a = valid_args();
  a.batch = INT64_MIN;
  expect_reject(&f, &a,
                "need batch >= 0, heads >= 1, total_tokens >= 0 "
                "(got -9223372036854775808, 8, 100)");
  a = valid_args();
  a.heads = 0;
  expect_reject(&f, &a, "need batch >= 0, heads >= 1, total_tokens >= 0 (got 2, 0, 100)");
  a.heads = -4;
  expect_reject(&f, &a, "need batch >= 0, heads >= 1, total_tokens >= 0 (got 2, -4, 100)");
  a = valid_args();
  a.total_tokens = -100;
  expect_reject(&f, &a, "need batch >= 0, heads >= 1, total_tokens >= 0 (got 2, 8, -100)");
  a.heads = INT64_MAX;
  expect_reject(&f, &a,
                "need batch >= 0, heads >= 1, total_tokens >= 0 "
                "(got 2, 9223372036854775807, -100)");
}
END_TEST

START_TEST(sizes_that_overflow) {
  fake f;
  fake_init(&f);
  ag_block_fwd_args a = valid_args();
  a.heads = (int64_t)INT32_MAX + 1;
  expect_reject(&f, &a, "heads (2147483648) exceeds 2^31 - 1");
  /* total_tokens near INT64_MAX: the byte count of one tensor overflows. */
  a = valid_args();
  a.total_tokens = INT64_MAX - 5;
  expect_reject(&f, &a,
                "tensors of 9223372036854775802 tokens x 8 heads x 128 overflow a 64-bit "
                "byte count");
  /* The boundary: one head is 256 bytes a token. */
  a.heads = 1;
  a.total_tokens = INT64_MAX / 256 + 1;
  expect_reject(&f, &a,
                "tensors of 36028797018963968 tokens x 1 heads x 128 overflow a 64-bit "
                "byte count");
  a.total_tokens = INT64_MAX / 256; /* fits in bytes, not in int32 offsets */
  expect_reject(&f, &a,
                "total_tokens (36028797018963967) exceeds 2^31 - 1, the most int32 offsets "
                "can reach");
  /* Heads and tokens each within int32, their product in bytes not. */
  a.heads = INT32_MAX;
  a.total_tokens = INT64_MAX / ((int64_t)INT32_MAX * 256) + 1;
  expect_reject(&f, &a,
                "tensors of 16777217 tokens x 2147483647 heads x 128 overflow a 64-bit "
                "byte count");
  a = valid_args();
  a.total_tokens = (int64_t)INT32_MAX + 1;
  expect_reject(&f, &a,
                "total_tokens (2147483648) exceeds 2^31 - 1, the most int32 offsets can reach");
  /* batch + 1 offsets, and the work count (batch + total / block) x groups. */
  a = valid_args();
  a.batch = INT64_MAX;
  expect_reject(&f, &a, "batch is too large");
  a.batch = INT64_MAX - 1;
  expect_reject(&f, &a, "work count overflows");
  a.batch = INT64_MAX - 1 - 100 / 64;
  a.heads = 1; /* one group: the count is exactly INT64_MAX - 1, but vblock * batch is not */
  a.total_tokens = 100;
  give_driver(&f);
  ag_error err = {0};
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message,
                   "batch (9223372036854775805) is too large: the block walk's search multiplies "
                   "it by the 9223372036854775806 virtual blocks, which overflows 64 bits (about "
                   "3.04e9 sequences at most)");
  ck_assert_int_eq(ag_fake_seen.count, 0);
  a.heads = 2; /* two groups: overflows */
  give_driver(&f); /* a fresh record */
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "work count overflows");
  ck_assert_int_eq(ag_fake_seen.count, 0);
  ag_error_clear(&err);
}
END_TEST

/* Issue 22 row 6: the block walk's device arithmetic (block_walk.cuh)
 * computes num_items * (blockIdx.x + 1), vblock * batch (vblock below the
 * virtual block count) and heads + kHeadsPerTile - 1 as int. Whatever the
 * checks accept and launch must keep each within its type; a CPU copy of
 * each product is checked here with the grid the launch got. */
static void expect_walk_in_range(fake *f, const ag_block_fwd_args *a) {
  ag_error err = {0};
  ag_status st = ag_block_forward(&f->kernel, a, NULL, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message);
  ck_assert_int_eq(ag_fake_seen.count, 1);
  const int64_t items = ag_fake_seen.items, grid = ag_fake_seen.grid;
  const int64_t vblocks = a->batch + a->total_tokens / 64;
  int64_t prod;
  ck_assert_msg(!__builtin_mul_overflow(items, grid, &prod),
                "num_items (%lld) * gridDim.x (%lld) overflows int64", (long long)items,
                (long long)grid);
  ck_assert_msg(!__builtin_mul_overflow(vblocks - 1, a->batch, &prod),
                "vblock * batch overflows int64");
  int sum;
  ck_assert(!__builtin_add_overflow((int)a->heads, f->kernel.plan.fwd.heads_per_tile - 1, &sum));
  /* The last CTA's share ends at num_items; every item has one CTA. */
  ck_assert_int_eq(items * grid / grid, items);
  ck_assert_int_ge(grid, 1);
}

START_TEST(walk_arithmetic_cannot_overflow) {
  fake f;
  fake_init(&f);
  give_driver(&f);
  ag_block_fwd_args a = valid_args();
  /* The case: 2^31 - 1 sequences, 4 heads, one token. */
  a.batch = INT32_MAX;
  a.heads = 4;
  a.total_tokens = 1;
  expect_walk_in_range(&f, &a);
  /* Past 2^32 sequences (offsets are int32 values, not an int32 count). */
  a.batch = (int64_t)1 << 32;
  a.heads = 1;
  a.total_tokens = INT32_MAX;
  ag_error err = {0};
  give_driver(&f);
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message,
                   "batch (4294967296) is too large: the block walk's search multiplies it by "
                   "the 4328521727 virtual blocks, which overflows 64 bits (about 3.04e9 "
                   "sequences at most)");
  ck_assert_int_eq(ag_fake_seen.count, 0);
  ag_error_clear(&err);
  /* The largest batch with no tokens: vblocks * batch = batch^2 fits. */
  a.batch = 3037000499; /* floor(sqrt(INT64_MAX)) */
  a.total_tokens = 0;
  give_driver(&f);
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_OK); /* nothing to do */
  a.total_tokens = 1;
  expect_walk_in_range(&f, &a);
  a.batch = 3037000500;
  give_driver(&f);
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ag_error_clear(&err);
  /* Heads: as many as int32 holds after rounding up to whole tiles. */
  const int hpt = f.kernel.plan.fwd.heads_per_tile;
  a = valid_args();
  a.heads = INT32_MAX - (hpt - 1);
  a.batch = 1;
  a.total_tokens = 1;
  give_driver(&f);
  expect_walk_in_range(&f, &a);
  if (hpt > 1) {
    a.heads = INT32_MAX - (hpt - 2);
    give_driver(&f);
    ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_ERR_INVALID_ARGUMENT);
    char want[200];
    snprintf(want, sizeof want,
             "heads (%lld) exceeds 2^31 - %d: rounded up to whole tiles of %d heads, it must "
             "fit in int32",
             (long long)a.heads, hpt, hpt);
    ck_assert_str_eq(err.message, want);
    ck_assert_int_eq(ag_fake_seen.count, 0);
    ag_error_clear(&err);
  }
}
END_TEST

/* Nothing to compute: accepted before any pointer is looked at and before
 * the driver is touched (the context has none). */
START_TEST(empty_work_touches_nothing) {
  fake f;
  fake_init(&f);
  ag_block_fwd_args a;
  memset(&a, 0, sizeof a);
  a.heads = 8;
  ag_error err = {0};
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_OK); /* batch 0, total 0 */
  a.batch = 5;
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_OK); /* all empty */
  a.batch = 0;
  a.total_tokens = 10;
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_OK);
  ck_assert_ptr_null(err.message);
  const int32_t zeros[6] = {0};
  a.batch = 5;
  a.total_tokens = 0;
  a.host_offsets = zeros;
  ck_assert_int_eq(ag_block_forward(&f.kernel, &a, NULL, &err), AG_OK);
  /* Host offsets are still checked when there is nothing to compute. */
  a.batch = 0;
  a.total_tokens = 10;
  expect_reject(&f, &a, "host_offsets[0] (the last) is 0, not total_tokens (10)");
}
END_TEST

/* ---- pointers ------------------------------------------------------------------------ */

START_TEST(null_pointers) {
  fake f;
  fake_init(&f);
  const char *names[] = {"q", "k", "v", "o"};
  for (int i = 0; i < 4; i++) {
    ag_block_fwd_args a = valid_args();
    if (i == 0) a.q = NULL;
    if (i == 1) a.k = NULL;
    if (i == 2) a.v = NULL;
    if (i == 3) a.o = NULL;
    char want[64];
    snprintf(want, sizeof want, "%s is a null pointer", names[i]);
    expect_reject(&f, &a, want);
  }
  ag_block_fwd_args a = valid_args();
  a.offsets = NULL;
  expect_reject(&f, &a, "offsets is a null pointer");
}
END_TEST

START_TEST(misaligned_pointers) {
  fake f;
  fake_init(&f);
  ag_block_fwd_args a = valid_args();
  a.q = (const void *)(uintptr_t)0x100001;
  expect_reject(&f, &a,
                "q (0x100001) is not 16-byte aligned; the kernel loads 16 bytes at a time");
  a = valid_args();
  a.k = (const void *)(uintptr_t)0x200008; /* 8-byte aligned is not enough */
  expect_reject(&f, &a,
                "k (0x200008) is not 16-byte aligned; the kernel loads 16 bytes at a time");
  a = valid_args();
  a.v = (const void *)(uintptr_t)0x300002;
  expect_reject(&f, &a,
                "v (0x300002) is not 16-byte aligned; the kernel loads 16 bytes at a time");
  a = valid_args();
  a.o = (void *)(uintptr_t)0x40000c;
  expect_reject(&f, &a,
                "o (0x40000c) is not 16-byte aligned; the kernel loads 16 bytes at a time");
  a = valid_args();
  a.offsets = (const int32_t *)(uintptr_t)0x500002;
  expect_reject(&f, &a, "offsets (0x500002) is not 4-byte aligned");
  a.offsets = (const int32_t *)(uintptr_t)0x500004; /* 4 is enough for int32 */
  give_driver(&f);
  expect_launch(&f, &a);
}
END_TEST

/* ---- host offsets -------------------------------------------------------------------- */

START_TEST(bad_host_offsets) {
  fake f;
  fake_init(&f);
  ag_block_fwd_args a = valid_args();
  const int32_t nonzero_start[] = {1, 37, 100};
  a.host_offsets = nonzero_start;
  expect_reject(&f, &a, "host_offsets[0] is 1; it must be 0");
  const int32_t negative_start[] = {-64, 37, 100};
  a.host_offsets = negative_start;
  expect_reject(&f, &a, "host_offsets[0] is -64; it must be 0");
  const int32_t decreasing[] = {0, 60, 50, 100};
  a.batch = 3;
  a.host_offsets = decreasing;
  expect_reject(&f, &a, "host_offsets decrease at index 2 (50 after 60)");
  const int32_t negative[] = {0, -5, 100};
  a.batch = 2;
  a.host_offsets = negative;
  expect_reject(&f, &a, "host_offsets decrease at index 1 (-5 after 0)");
  const int32_t short_end[] = {0, 37, 99};
  a.host_offsets = short_end;
  expect_reject(&f, &a, "host_offsets[2] (the last) is 99, not total_tokens (100)");
  const int32_t long_end[] = {0, 37, 101};
  a.host_offsets = long_end;
  expect_reject(&f, &a, "host_offsets[2] (the last) is 101, not total_tokens (100)");
  const int32_t wrapped[] = {0, INT32_MAX, INT32_MIN};
  a.host_offsets = wrapped;
  expect_reject(&f, &a, "host_offsets decrease at index 2 (-2147483648 after 2147483647)");
  /* Checked before the pointers: bad offsets win over a null q. */
  a.host_offsets = short_end;
  a.q = NULL;
  expect_reject(&f, &a, "host_offsets[2] (the last) is 99, not total_tokens (100)");
}
END_TEST

START_TEST(good_host_offsets_launch) {
  fake f;
  fake_init(&f);
  give_driver(&f);
  ag_block_fwd_args a = valid_args();
  const int32_t offsets[] = {0, 37, 100};
  a.host_offsets = offsets;
  expect_launch(&f, &a);
  /* Empty sequences anywhere are fine. */
  const int32_t with_empty[] = {0, 0, 37, 37, 100, 100};
  a.batch = 5;
  a.host_offsets = with_empty;
  give_driver(&f); /* a fresh record */
  expect_launch(&f, &a);
  /* Without host offsets the device copy is trusted (the kernel clamps). */
  a = valid_args();
  give_driver(&f); /* a fresh record */
  expect_launch(&f, &a);
  /* The largest token count int32 offsets reach. */
  a.batch = 1;
  a.heads = 1;
  a.total_tokens = INT32_MAX;
  give_driver(&f); /* a fresh record */
  expect_launch(&f, &a);
}
END_TEST

/* ag_kernel_from_images refuses, before any driver call, what cannot load:
 * no image for the device's arch, an image for another arch than the
 * spec's, missing arguments. */
START_TEST(kernel_from_images_refusals) {
  ag_context ctx;
  memset(&ctx, 0, sizeof ctx);
  snprintf(ctx.name, sizeof ctx.name, "NVIDIA H200");
  snprintf(ctx.arch, sizeof ctx.arch, "sm_90a");
  ctx.cc_major = 9;
  ctx.ordinal = 0;
  const char *yaml = "name: img\npattern: block_diagonal\nhead_dim: 64\ndtype: bf16\n";
  ag_spec spec;
  ag_error err = {0};
  ck_assert_int_eq(ag_spec_load_string(yaml, strlen(yaml), "img.yaml", &spec, &err), AG_OK);
  static const unsigned char bytes[16] = {0x7f, 'E', 'L', 'F'};
  const ag_image sm80[] = {{"sm_80", bytes, sizeof bytes}};
  ag_kernel *k = (ag_kernel *)1;
  ck_assert_int_eq(ag_kernel_from_images(&ctx, &spec, sm80, 1, &k, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(k);
  ck_assert_str_eq(err.message, "spec 'img' has no image for device 0 (NVIDIA H200, sm_90a); it "
                                "was built for sm_80");
  ag_error_clear(&err);
  ck_assert_int_eq(ag_kernel_from_images(&ctx, &spec, NULL, 0, &k, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, "built for nothing"));
  ag_error_clear(&err);
  const ag_image sm90[] = {{"sm_90a", bytes, sizeof bytes}};
  spec.arch = AG_ARCH_SM80;
  ctx.cc_major = 8;
  snprintf(ctx.arch, sizeof ctx.arch, "sm_80");
  const ag_image both[] = {sm90[0], sm80[0]};
  spec.arch = AG_ARCH_SM90A; /* the only image that runs (sm_80) is not the spec's arch */
  ck_assert_int_eq(ag_kernel_from_images(&ctx, &spec, both, 2, &k, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(err.message, "spec 'img' targets sm_90a, not sm_80");
  ag_error_clear(&err);
  ck_assert_int_eq(ag_kernel_from_images(NULL, &spec, both, 2, &k, &err), AG_ERR_INVALID_ARGUMENT);
  ag_error_clear(&err);
  ck_assert_int_eq(ag_kernel_from_images(&ctx, &spec, both, 2, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ag_error_clear(&err);
}
END_TEST

/* ---- row strides ------------------------------------------------------------------ */

/* Expect `st` with exactly `want` from a forward launch. */
static void expect_status(fake *f, const ag_block_fwd_args *a, ag_status want_st,
                          const char *want) {
  ag_error err = {0};
  ck_assert_int_eq(ag_block_forward(&f->kernel, a, NULL, &err), want_st);
  ck_assert_str_eq(err.message, want);
  ag_error_clear(&err);
}

/* A kernel whose plan does not take strides (the shipped choice until a
 * GPU has run the strided form): 0 and the packed stride launch, any other
 * valid stride is refused as unsupported, an invalid one as invalid. */
START_TEST(row_strides_packed_only) {
  fake f;
  fake_init(&f);
  ck_assert(!ag_kernel_takes_row_strides(&f.kernel));
  ck_assert(!ag_kernel_takes_row_strides(NULL));
  give_driver(&f);
  ag_block_fwd_args a = valid_args(); /* 8 heads of 128: packed rows 1024 apart */
  a.q_stride = 1024, a.o_stride = 1024;
  expect_launch(&f, &a);
  a.k_stride = 3 * 1024;
  expect_status(&f, &a, AG_ERR_UNSUPPORTED,
                "k_stride 3072: kernel 'args_b64' takes packed tensors only (rows kv_heads * "
                "head_dim = 1024 elements apart); its spec does not say row_strides: true");
  a = valid_args();
  a.v_stride = 1016;
  expect_status(&f, &a, AG_ERR_INVALID_ARGUMENT,
                "v_stride (1016) must be 0 (packed) or a multiple of 8 elements from kv_heads * "
                "head_dim (1024) to 2^31 - 1");
  a.v_stride = 1028;
  expect_status(&f, &a, AG_ERR_INVALID_ARGUMENT,
                "v_stride (1028) must be 0 (packed) or a multiple of 8 elements from kv_heads * "
                "head_dim (1024) to 2^31 - 1");
  a.v_stride = (int64_t)INT32_MAX + 1;
  expect_status(&f, &a, AG_ERR_INVALID_ARGUMENT,
                "v_stride (2147483648) must be 0 (packed) or a multiple of 8 elements from "
                "kv_heads * head_dim (1024) to 2^31 - 1");
  a.v_stride = -1024;
  expect_status(&f, &a, AG_ERR_INVALID_ARGUMENT,
                "v_stride (-1024) must be 0 (packed) or a multiple of 8 elements from kv_heads * "
                "head_dim (1024) to 2^31 - 1");
  a = valid_args();
  a.kv_heads = 4;
  expect_status(&f, &a, AG_ERR_UNSUPPORTED,
                "kv_heads 4: kernel 'args_b64' takes as many key heads as query heads (8); its "
                "spec does not say row_strides: true");
  ck_assert(!ag_kernel_takes_kv_heads(&f.kernel));
  ck_assert(!ag_kernel_takes_kv_heads(NULL));
  ck_assert_int_eq(ag_fake_seen.count, 1); /* none of the refused ones launched */
  a.kv_heads = 8; /* heads, named: accepted */
  ag_fake_seen.count = ag_fake_seen.pushes = ag_fake_seen.pops = 0;
  expect_launch(&f, &a);
}
END_TEST

/* A spec with row_strides: the kernel takes one int stride a tensor after
 * the sizes, in its tensors' order, 0 passed as the packed stride. */
START_TEST(row_strides_passed) {
  fake f;
  fake_init(&f);
  f.kernel.spec.row_strides = true;
  ag_error err = {0};
  ck_assert_int_eq(ag_plan_make(&f.kernel.spec, &f.kernel.plan, &err), AG_OK);
  ag_plan_kernels(&f.kernel.spec, &f.kernel.plan);
  ck_assert(ag_kernel_takes_row_strides(&f.kernel));
  const ag_plan_kernel *d = &f.kernel.plan.kernels[0];
  ck_assert_int_eq(d->nparams, 14);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(d->params[9 + i], AG_PARAM_STRIDE_Q + i);
  ck_assert_int_eq(d->params[13], AG_PARAM_KV_HEADS);
  ck_assert(ag_kernel_takes_kv_heads(&f.kernel));
  give_driver(&f);
  ag_fake_seen.strides = 4;
  ag_block_fwd_args a = valid_args();
  a.q_stride = a.k_stride = a.v_stride = 3 * 1024; /* column slices of one qkv */
  expect_launch(&f, &a);
  ck_assert_int_eq(ag_fake_seen.stride[0], 3072);
  ck_assert_int_eq(ag_fake_seen.stride[1], 3072);
  ck_assert_int_eq(ag_fake_seen.stride[2], 3072);
  ck_assert_int_eq(ag_fake_seen.stride[3], 1024); /* o: 0, packed */
  ck_assert_int_eq(ag_fake_seen.kv_heads, 8); /* 0: heads */
  a.o_stride = INT32_MAX - 7; /* the largest */
  ag_fake_seen.count = ag_fake_seen.pushes = ag_fake_seen.pops = 0;
  expect_launch(&f, &a);
  ck_assert_int_eq(ag_fake_seen.stride[3], INT32_MAX - 7);
  /* Grouped-query heads: 2 key heads for 8 query heads. K's and V's packed
   * rows are 2 * 128 elements (their least stride); Q's and O's 1024. */
  a = valid_args();
  a.kv_heads = 2;
  ag_fake_seen.count = ag_fake_seen.pushes = ag_fake_seen.pops = 0;
  expect_launch(&f, &a);
  ck_assert_int_eq(ag_fake_seen.kv_heads, 2);
  ck_assert_int_eq(ag_fake_seen.heads, 8);
  ck_assert_int_eq(ag_fake_seen.stride[0], 1024);
  ck_assert_int_eq(ag_fake_seen.stride[1], 256);
  ck_assert_int_eq(ag_fake_seen.stride[2], 256);
  ck_assert_int_eq(ag_fake_seen.stride[3], 1024);
  a.k_stride = a.v_stride = (8 + 2 + 2) * 128; /* slices of [tokens, (8 + 2 + 2) * 128] */
  ag_fake_seen.count = ag_fake_seen.pushes = ag_fake_seen.pops = 0;
  expect_launch(&f, &a);
  ck_assert_int_eq(ag_fake_seen.stride[1], 1536);
  /* Rows past an int: refused where the kernels take strides as int. */
  a = valid_args();
  a.heads = 1 << 24; /* 2^31 elements a row */
  a.total_tokens = 2;
  a.batch = 1;
  expect_status(&f, &a, AG_ERR_INVALID_ARGUMENT,
                "q's rows (2147483648 elements) exceed 2^31 - 1, the most a row stride holds");
  a = valid_args();
  a.kv_heads = 2;
  a.k_stride = 248;
  expect_status(&f, &a, AG_ERR_INVALID_ARGUMENT,
                "k_stride (248) must be 0 (packed) or a multiple of 8 elements from kv_heads * "
                "head_dim (256) to 2^31 - 1");
  const int64_t bad[] = {3, 16, -1};
  for (int i = 0; i < 3; i++) {
    a = valid_args();
    a.kv_heads = bad[i];
    char want[160];
    snprintf(want, sizeof want, "kv_heads (%lld) must be 0 (heads) or divide heads (8)",
             (long long)bad[i]);
    expect_status(&f, &a, AG_ERR_INVALID_ARGUMENT, want);
  }
}
END_TEST

Suite *args_suite(void) {
  Suite *s = suite_create("args");
  TCase *tc = tcase_create("block_forward");
  tcase_add_test(tc, null_handles);
  tcase_add_test(tc, current_context_not_pushed);
  tcase_add_test(tc, kernel_from_images_refusals);
  tcase_add_test(tc, wrong_kernel_kind);
  tcase_add_test(tc, negative_and_zero_sizes);
  tcase_add_test(tc, sizes_that_overflow);
  tcase_add_test(tc, walk_arithmetic_cannot_overflow);
  tcase_add_test(tc, empty_work_touches_nothing);
  tcase_add_test(tc, null_pointers);
  tcase_add_test(tc, misaligned_pointers);
  tcase_add_test(tc, bad_host_offsets);
  tcase_add_test(tc, good_host_offsets_launch);
  tcase_add_test(tc, row_strides_packed_only);
  tcase_add_test(tc, row_strides_passed);
  suite_add_tcase(s, tc);
  return s;
}
