// SPDX-License-Identifier: BSD-3-Clause
/* check_runtime.c: the Driver API layer: loading libcuda (absent, the
 * toolkit's stub, the real one), error text, arch names and, where a device
 * is present, contexts and kernels from hand-written sources. Every test runs
 * in Check's forked child, so the parent never initialises CUDA. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"
#include "util.h"

static bool contains(const char *text, const char *part) { return text && strstr(text, part); }

/* The driver is loaded once per process, so tests that steer the loading
 * need Check's fresh child for each test. */
static bool forked(const char *test) {
  const char *mode = getenv("CK_FORK");
  if (mode && strcmp(mode, "no") == 0) {
    fprintf(stderr, "SKIP %s: needs a process of its own (CK_FORK=no)\n", test);
    return false;
  }
  return true;
}

START_TEST(missing_driver) {
  if (!forked("missing_driver")) return;
  setenv(AG_ENV_LIBCUDA, "/nonexistent/libcuda.so.1", 1);
  for (int round = 0; round < 2; round++) { /* loaded once; the outcome stays */
    ag_context *ctx = (ag_context *)1;
    ag_error err = {0};
    ck_assert_int_eq(ag_context_create(0, &ctx, &err), AG_ERR_NO_DRIVER);
    ck_assert_ptr_null(ctx);
    ck_assert_int_eq(err.code, AG_ERR_NO_DRIVER);
    ck_assert_msg(contains(err.message, "/nonexistent/libcuda.so.1"), "%s", err.message);
    ck_assert_msg(contains(err.message, AG_ENV_LIBCUDA), "%s", err.message);
    ag_error_clear(&err);
  }
  const ag_driver *d = (const ag_driver *)1;
  ck_assert_int_eq(ag_driver_get(&d, NULL), AG_ERR_NO_DRIVER);
  ck_assert_ptr_null(d);
  /* Error text without a driver still names the call and the code. */
  ag_error err = {0};
  ck_assert_int_eq(ag_cuda_check(&err, CUDA_SUCCESS, "cuNothing"), AG_OK);
  ck_assert_ptr_null(err.message);
  ck_assert_int_eq(ag_cuda_check(&err, CUDA_ERROR_INVALID_VALUE, "cuSomething"), AG_ERR_CUDA);
  ck_assert_str_eq(err.message, "cuSomething failed: CUresult 1");
  ag_error_clear(&err);
}
END_TEST

/* The toolkit's stub libcuda exports every entry point but fails cuInit:
 * reaching cuInit proves every versioned name in the table resolves. */
START_TEST(stub_driver) {
  if (!forked("stub_driver")) return;
  const char *home = getenv("CUDA_HOME") ? getenv("CUDA_HOME") : "/usr/local/cuda";
  char *stub = NULL;
  ck_assert_int_ge(asprintf(&stub, "%s/lib64/stubs/libcuda.so", home), 0);
  if (access(stub, R_OK) != 0) {
    fprintf(stderr, "SKIP stub_driver: no %s\n", stub);
    free(stub);
    return;
  }
  setenv(AG_ENV_LIBCUDA, stub, 1);
  ag_context *ctx = NULL;
  ag_error err = {0};
  ck_assert_int_eq(ag_context_create(0, &ctx, &err), AG_ERR_NO_DRIVER);
  ck_assert_msg(contains(err.message, "cuInit failed"), "%s", err.message);
  ck_assert_msg(contains(err.message, "CUDA_ERROR_STUB_LIBRARY"), "%s", err.message);
  ck_assert_ptr_null(ctx);
  ag_error_clear(&err);
  free(stub);
}
END_TEST

START_TEST(default_driver) {
  if (!forked("default_driver")) return;
  unsetenv(AG_ENV_LIBCUDA);
  ag_context *ctx = NULL;
  ag_error err = {0};
  ag_status st = ag_context_create(0, &ctx, &err);
  if (st == AG_OK) { /* a machine with a GPU */
    ck_assert_ptr_nonnull(ctx);
    ck_assert_ptr_nonnull(ag_context_arch(ctx));
    ag_context_destroy(ctx);
    return;
  }
  ck_assert_msg(st == AG_ERR_NO_DRIVER || st == AG_ERR_NO_DEVICE, "%s: %s", ag_strerror(st),
                err.message);
  ck_assert_ptr_null(ctx);
  ck_assert_ptr_nonnull(err.message);
  ck_assert_uint_gt(strlen(err.message), 10);
  ag_error_clear(&err);
}
END_TEST

START_TEST(null_handles) {
  ag_context_destroy(NULL);
  ck_assert_ptr_null(ag_context_arch(NULL));
  ck_assert_ptr_null(ag_kernel_spec(NULL));
  ag_error err = {0};
  ck_assert_int_eq(ag_context_create(0, NULL, &err), AG_ERR_INVALID_ARGUMENT);
  ag_error_clear(&err);
  ag_kernel *k = (ag_kernel *)1;
  ag_spec spec;
  memset(&spec, 0, sizeof spec);
  ck_assert_int_eq(ag_kernel_get(NULL, &spec, &k, &err), AG_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(k);
  ag_error_clear(&err);
  /* From a file or text: the spec is checked before the context. */
  k = (ag_kernel *)1;
  ck_assert_int_eq(ag_kernel_get_file(NULL, "spec_errors/unknown_key.yaml", &k, &err),
                   AG_ERR_SPEC);
  ck_assert_ptr_null(k);
  ck_assert_ptr_nonnull(strstr(err.message, "spec_errors/unknown_key.yaml:3:1: error:"));
  ck_assert_int_eq(ag_kernel_get_file(NULL, "../specs/ads_block64_d64_fp16.yaml", &k, &err),
                   AG_ERR_INVALID_ARGUMENT);
  const char yaml[] = "name: s\npattern: block_diagonal\nhead_dim: 64\ndtype: bf16\n";
  ck_assert_int_eq(ag_kernel_get_string(NULL, yaml, strlen(yaml), &k, &err),
                   AG_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(ag_kernel_get_string(NULL, "name: [", 7, &k, &err), AG_ERR_SPEC);
  ag_error_clear(&err);
}
END_TEST

START_TEST(versioned_symbols) {
  size_t n = 0;
  const char *const *names = ag_driver_symbols(&n);
  ck_assert_uint_eq(n, 40);
  const char *want[] = {"cuInit",
                        "cuLaunchKernel",
                        "cuMemAlloc_v2",
                        "cuMemFree_v2",
                        "cuCtxPushCurrent_v2",
                        "cuCtxPopCurrent_v2",
                        "cuDevicePrimaryCtxRelease_v2",
                        "cuMemcpyHtoD_v2",
                        "cuMemcpyDtoH_v2",
                        "cuMemcpyDtoD_v2",
                        "cuMemsetD8_v2",
                        "cuMemsetD32_v2",
                        "cuMemGetInfo_v2",
                        "cuStreamDestroy_v2",
                        "cuEventDestroy_v2",
                        "cuEventElapsedTime_v2",
                        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                        "cuPointerGetAttribute"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    bool found = false;
    for (size_t j = 0; j < n; j++) found = found || strcmp(names[j], want[i]) == 0;
    ck_assert_msg(found, "%s missing from the driver table", want[i]);
  }
  for (size_t j = 0; j < n; j++) { /* the unversioned aliases must not be used */
    ck_assert_str_ne(names[j], "cuMemAlloc");
    ck_assert_str_ne(names[j], "cuCtxPushCurrent");
    ck_assert_str_ne(names[j], "cuEventElapsedTime");
  }
}
END_TEST

START_TEST(arch_names) {
  char arch[AG_ARCH_NAME_MAX];
  ag_arch_for_device(9, 0, arch);
  ck_assert_str_eq(arch, "sm_90a");
  ag_arch_for_device(8, 0, arch);
  ck_assert_str_eq(arch, "sm_80");
  ag_arch_for_device(8, 6, arch);
  ck_assert_str_eq(arch, "sm_86");
  ag_arch_for_device(12, 0, arch);
  ck_assert_str_eq(arch, "sm_120");
  ck_assert(ag_arch_runs_on("sm_80", 8, 0));
  ck_assert(ag_arch_runs_on("sm_80", 8, 6));
  ck_assert(ag_arch_runs_on("sm_86", 8, 9));
  ck_assert(!ag_arch_runs_on("sm_86", 8, 0));
  ck_assert(!ag_arch_runs_on("sm_80", 9, 0));
  ck_assert(ag_arch_runs_on("sm_90a", 9, 0));
  ck_assert(ag_arch_runs_on("sm_90", 9, 0));
  ck_assert(!ag_arch_runs_on("sm_90a", 10, 0));
  ck_assert(!ag_arch_runs_on("sm_90a", 8, 0));
  ck_assert(ag_arch_runs_on("sm_100a", 10, 0));
  ck_assert(!ag_arch_runs_on("bogus", 8, 0));
}
END_TEST

/* ---- with a device ------------------------------------------------------ */

/* A context on device 0, or NULL after printing why the test is skipped.
 * Kernels are cached in a fresh directory that device_done removes. */
static char cache_dir[64];
static ag_context *device_or_skip(const char *test) {
  unsetenv(AG_ENV_LIBCUDA);
  unsetenv(AG_ENV_CACHE_DISABLE);
  ag_context *ctx = NULL;
  ag_error err = {0};
  ag_status st = ag_context_create(0, &ctx, &err);
  if (st == AG_ERR_NO_DRIVER || st == AG_ERR_NO_DEVICE) {
    fprintf(stderr, "SKIP %s: %s (no GPU here)\n", test, ag_strerror(st));
    ag_error_clear(&err);
    return NULL;
  }
  ck_assert_msg(st == AG_OK, "ag_context_create: %s", err.message);
  strcpy(cache_dir, "/tmp/attngen-rt-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(cache_dir));
  setenv(AG_ENV_CACHE_DIR, cache_dir, 1);
  return ctx;
}
static void device_done(ag_context *ctx) {
  ag_context_destroy(ctx);
  ag_test_remove_tree(cache_dir);
}

static const char fill_source[] =
    "extern \"C\" __global__ void fill(float *p, float v) {\n"
    "  extern __shared__ float s[];\n"
    "  s[threadIdx.x] = v;\n"
    "  __syncthreads();\n"
    "  p[blockIdx.x * blockDim.x + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x] + 1.f;\n"
    "}\n";

static ag_plan fill_plan(int threads, int smem) {
  ag_plan p;
  memset(&p, 0, sizeof p);
  p.nkernels = 1;
  strcpy(p.kernels[0].name, "fill");
  p.kernels[0].pass = AG_PASS_FORWARD;
  p.kernels[0].threads = threads;
  p.kernels[0].smem_bytes = smem;
  return p;
}

START_TEST(device_context) {
  ag_context *ctx = device_or_skip("device_context");
  if (!ctx) return;
  char arch[AG_ARCH_NAME_MAX];
  ag_arch_for_device(ctx->cc_major, ctx->cc_minor, arch);
  ck_assert_str_eq(ag_context_arch(ctx), arch);
  ck_assert_int_gt(ctx->sm_count, 0);
  ck_assert_int_ge(ctx->max_smem_optin, 48 * 1024);
  ck_assert_uint_gt(strlen(ctx->name), 0);
  /* An ordinal past the last device. */
  ag_context *none = NULL;
  ag_error err = {0};
  ck_assert_int_eq(ag_context_create(999, &none, &err), AG_ERR_NO_DEVICE);
  ck_assert_ptr_nonnull(strstr(err.message, "999"));
  ag_error_clear(&err);
  ck_assert_int_eq(ag_context_create(-1, &none, &err), AG_ERR_NO_DEVICE);
  ag_error_clear(&err);
  ck_assert_ptr_null(none);
  /* Two contexts on one device share the primary context. */
  ag_context *second = NULL;
  ck_assert_int_eq(ag_context_create(0, &second, &err), AG_OK);
  ck_assert_ptr_eq(second->cu, ctx->cu);
  ag_context_destroy(second);
  device_done(ctx);
}
END_TEST

START_TEST(device_kernel_load_and_launch) {
  ag_context *ctx = device_or_skip("device_kernel_load_and_launch");
  if (!ctx) return;
  const ag_driver *d = ctx->drv;
  ag_spec spec;
  memset(&spec, 0, sizeof spec);
  strcpy(spec.name, "fill");
  ag_error err = {0};

  /* Over 48 KiB of dynamic shared memory: the opt-in is needed. */
  ag_plan plan = fill_plan(128, 64 * 1024);
  ag_kernel *k = NULL, *again = NULL;
  ag_status st = ag_context_kernel(ctx, &spec, &plan, fill_source, ctx->arch, NULL, &k, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message);
  ck_assert_ptr_eq(k->ctx, ctx);
  ck_assert_ptr_nonnull(k->fn[0]);
  ck_assert_int_ge(k->ctas_per_sm[0], 1);
  ck_assert_str_eq(ag_kernel_spec(k)->name, "fill");
  ck_assert_int_eq(k->plan.kernels[0].smem_bytes, 64 * 1024);
  /* The same source again: the same kernel from memory. */
  ck_assert_int_eq(ag_context_kernel(ctx, &spec, &plan, fill_source, ctx->arch, NULL, &again, &err),
                   AG_OK);
  ck_assert_ptr_eq(again, k);

  /* Launch it through the table and read the result back. */
  ck_assert_int_eq(ag_cuda_check(&err, d->cuCtxPushCurrent(ctx->cu), "push"), AG_OK);
  enum { BLOCKS = 4, N = BLOCKS * 128 };
  CUdeviceptr buf = 0;
  ck_assert_int_eq(ag_cuda_check(&err, d->cuMemAlloc(&buf, N * sizeof(float)), "alloc"), AG_OK);
  ck_assert_int_eq(d->cuMemsetD32(buf, 0x7fc00000u, N), CUDA_SUCCESS); /* NaN */
  float v = 2.5f;
  void *args[] = {&buf, &v};
  st = ag_cuda_check(&err,
                     d->cuLaunchKernel(k->fn[0], BLOCKS, 1, 1, 128, 1, 1, (unsigned)plan.kernels[0].smem_bytes,
                                       NULL, args, NULL),
                     "cuLaunchKernel");
  ck_assert_msg(st == AG_OK, "%s", err.message);
  float host[N];
  ck_assert_int_eq(ag_cuda_check(&err, d->cuMemcpyDtoH(host, buf, sizeof host), "DtoH"), AG_OK);
  for (int i = 0; i < N; i++) ck_assert_float_eq(host[i], 3.5f);
  ck_assert_int_eq(d->cuMemFree(buf), CUDA_SUCCESS);
  CUcontext popped;
  ck_assert_int_eq(d->cuCtxPopCurrent(&popped), CUDA_SUCCESS);

  /* More shared memory than the device allows: a clear refusal. */
  ag_plan huge = fill_plan(128, ctx->max_smem_optin + 1);
  ag_kernel *none = NULL;
  const char *other_source = "extern \"C\" __global__ void fill(float *p, float v) { *p = v; }\n";
  ck_assert_int_eq(ag_context_kernel(ctx, &spec, &huge, other_source, ctx->arch, NULL, &none, &err),
                   AG_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(err.message, "shared memory"));
  ck_assert_ptr_null(none);
  ag_error_clear(&err);
  /* A name the module lacks. */
  ag_plan wrong = fill_plan(128, 0);
  strcpy(wrong.kernels[0].name, "no_such_kernel");
  ck_assert_int_eq(ag_context_kernel(ctx, &spec, &wrong, other_source, ctx->arch, NULL, &none, &err),
                   AG_ERR_CUDA);
  ck_assert_ptr_nonnull(strstr(err.message, "no_such_kernel"));
  ag_error_clear(&err);
  /* A cubin for an arch the device cannot run. */
  const char *foreign = ctx->cc_major == 8 ? "sm_90a" : "sm_80";
  ck_assert_int_eq(ag_context_kernel(ctx, &spec, &plan, fill_source, foreign, NULL, &none, &err),
                   AG_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(err.message, foreign));
  ag_error_clear(&err);
  device_done(ctx);
}
END_TEST

/* Several threads asking for the same new kernel get one kernel. */
struct race {
  ag_context *ctx;
  const char *source;
  ag_kernel *got;
  ag_status st;
};
static void *race_one(void *arg) {
  struct race *r = arg;
  ag_spec spec;
  memset(&spec, 0, sizeof spec);
  ag_plan plan = fill_plan(64, 0);
  r->st = ag_context_kernel(r->ctx, &spec, &plan, r->source, r->ctx->arch, NULL, &r->got, NULL);
  return NULL;
}

START_TEST(device_kernel_race) {
  ag_context *ctx = device_or_skip("device_kernel_race");
  if (!ctx) return;
  setenv(AG_ENV_CACHE_DISABLE, "1", 1); /* every thread compiles: the race is real */
  const char *source =
      "extern \"C\" __global__ void fill(float *p, float v) { p[threadIdx.x] = v * 3.f; }\n";
  enum { THREADS = 4 };
  struct race r[THREADS];
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) {
    r[i] = (struct race){ctx, source, NULL, AG_ERR_COUNT};
    ck_assert_int_eq(pthread_create(&t[i], NULL, race_one, &r[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    ck_assert_int_eq(r[i].st, AG_OK);
    ck_assert_ptr_eq(r[i].got, r[0].got);
  }
  int listed = 0;
  for (ag_kernel *k = ctx->kernels; k; k = k->next) listed++;
  ck_assert_int_eq(listed, 1);
  device_done(ctx);
}
END_TEST

Suite *runtime_suite(void) {
  Suite *s = suite_create("runtime");
  TCase *tc = tcase_create("driver");
  tcase_add_test(tc, missing_driver);
  tcase_add_test(tc, stub_driver);
  tcase_add_test(tc, default_driver);
  tcase_add_test(tc, null_handles);
  tcase_add_test(tc, versioned_symbols);
  tcase_add_test(tc, arch_names);
  suite_add_tcase(s, tc);
  tc = tcase_create("device");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, device_context);
  tcase_add_test(tc, device_kernel_load_and_launch);
  tcase_add_test(tc, device_kernel_race);
  suite_add_tcase(s, tc);
  return s;
}
