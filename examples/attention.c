// SPDX-License-Identifier: BSD-3-Clause
/* attention.c: attngen's C API end to end (the README's C example). For each
 * spec named on the command line: load it, get its kernel (compiled at build
 * time into the cache that ATTNGEN_CACHE_DIR names, else by NVRTC now), run
 * the block-diagonal forward on a small batch and check it against a CPU
 * reference. Exits 0 when every variant passes, 1 on a failure, 77 (skip)
 * without a CUDA driver or GPU.
 *   cc -std=c11 attention.c $(pkg-config --cflags --libs attngen) -ldl -lm */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <attngen.h>

/* The Driver API calls the example makes itself (device memory), through
 * dlopen as attngen does, so that it starts and skips on a machine with no
 * driver. The types are cuda.h's. */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
static struct {
  CUresult (*retain)(CUcontext *, int), (*set_current)(CUcontext), (*sync)(void);
  CUresult (*alloc)(CUdeviceptr *, size_t), (*free)(CUdeviceptr);
  CUresult (*htod)(CUdeviceptr, const void *, size_t), (*dtoh)(void *, CUdeviceptr, size_t);
} cu;

static int load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 1;
  *(void **)&cu.retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&cu.set_current = dlsym(lib, "cuCtxSetCurrent");
  *(void **)&cu.sync = dlsym(lib, "cuCtxSynchronize");
  *(void **)&cu.alloc = dlsym(lib, "cuMemAlloc_v2");
  *(void **)&cu.free = dlsym(lib, "cuMemFree_v2");
  *(void **)&cu.htod = dlsym(lib, "cuMemcpyHtoD_v2");
  *(void **)&cu.dtoh = dlsym(lib, "cuMemcpyDtoH_v2");
  CUcontext c;
  return !cu.retain || !cu.set_current || !cu.sync || !cu.alloc || !cu.free || !cu.htod ||
         !cu.dtoh || cu.retain(&c, 0) || cu.set_current(c);
}

static uint16_t to_bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The block-diagonal forward in float: each query attends to the keys of its
 * own block (those at or before it when causal). x[t][h][d] is x[(t*H+h)*D+d]. */
static void reference(const ag_spec *s, const int32_t *offsets, int batch, int heads,
                      const float *q, const float *k, const float *v, float *o) {
  const int D = s->head_dim, B = s->block_size;
  float p[256];
  for (int b = 0; b < batch; b++)
    for (int i = offsets[b]; i < offsets[b + 1]; i++)
      for (int h = 0; h < heads; h++) {
        int start = offsets[b] + (i - offsets[b]) / B * B, end = start + B;
        if (end > offsets[b + 1]) end = offsets[b + 1];
        if (s->causal) end = i + 1;
        float max = -INFINITY, sum = 0;
        for (int j = start; j < end; j++) {
          float dot = 0;
          for (int d = 0; d < D; d++) dot += q[(i * heads + h) * D + d] * k[(j * heads + h) * D + d];
          p[j - start] = dot * (float)ag_spec_scale(s);
          if (p[j - start] > max) max = p[j - start];
        }
        for (int j = start; j < end; j++) sum += p[j - start] = expf(p[j - start] - max);
        for (int d = 0; d < D; d++) {
          float acc = 0;
          for (int j = start; j < end; j++) acc += p[j - start] * v[(j * heads + h) * D + d];
          o[(i * heads + h) * D + d] = acc / sum;
        }
      }
}

/* Runs one variant on lengths 37, 64, 0 and 150; 0 on a pass. */
static int run_variant(ag_context *ctx, const char *path) {
  enum { BATCH = 4, HEADS = 2 };
  const int32_t offsets[BATCH + 1] = {0, 37, 101, 101, 251};
  ag_error err = {0};
  ag_kernel *kernel;
  if (ag_kernel_get_file(ctx, path, &kernel, &err) != AG_OK) { /* NVRTC on a cache miss */
    fprintf(stderr, "%s\n", err.message);
    ag_error_clear(&err);
    return 1;
  }
  const ag_spec *spec = ag_kernel_spec(kernel);
  const size_t n = (size_t)offsets[BATCH] * HEADS * spec->head_dim, bytes = n * 2;
  float *host = malloc(n * 5 * sizeof(float)); /* q, k, v, o, reference */
  uint16_t *bits = malloc(bytes);
  CUdeviceptr dev[4] = {0}, d_offsets = 0; /* q, k, v, o */
  int failed = !host || !bits || cu.alloc(&d_offsets, sizeof offsets) ||
               cu.htod(d_offsets, offsets, sizeof offsets);
  srand(1);
  for (int t = 0; t < 4 && !failed; t++) {
    for (size_t i = 0; i < n; i++) { /* inputs in [-1, 1], kept as their bf16 values */
      bits[i] = to_bf16(t < 3 ? 2.0f * rand() / RAND_MAX - 1.0f : NAN); /* o: poisoned */
      host[t * n + i] = from_bf16(bits[i]);
    }
    failed = cu.alloc(&dev[t], bytes) || cu.htod(dev[t], bits, bytes);
  }
  ag_block_fwd_args args = {
      .q = (const void *)dev[0], .k = (const void *)dev[1], .v = (const void *)dev[2],
      .o = (void *)dev[3], .offsets = (const int32_t *)d_offsets, .batch = BATCH,
      .heads = HEADS, .total_tokens = offsets[BATCH], .host_offsets = offsets};
  if (!failed && ag_block_forward(kernel, &args, NULL, &err) != AG_OK) { /* async */
    fprintf(stderr, "%s\n", err.message);
    ag_error_clear(&err);
    failed = 1;
  }
  if (!failed) failed = cu.sync() || cu.dtoh(bits, dev[3], bytes);
  if (!failed) {
    reference(spec, offsets, BATCH, HEADS, host, host + n, host + 2 * n, host + 4 * n);
    double worst = 0; /* |o - ref|, against bf16's resolution of values up to 1 */
    for (size_t i = 0; i < n; i++) {
      double e = fabs(from_bf16(bits[i]) - host[4 * n + i]);
      if (!(e <= worst)) worst = e; /* NaN (unwritten) sticks */
    }
    failed = !(worst < 2e-2);
    printf("%s: %s, %d tokens, max error %.2g: %s\n", path, spec->name, offsets[BATCH], worst,
           failed ? "FAIL" : "PASS");
  } else {
    fprintf(stderr, "%s: a CUDA call failed\n", path);
  }
  for (int t = 0; t < 4; t++) if (dev[t]) cu.free(dev[t]);
  if (d_offsets) cu.free(d_offsets);
  free(host);
  free(bits);
  return failed;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SPEC...\n", argv[0]);
    return 2;
  }
  ag_error err = {0};
  for (int i = 1; i < argc; i++) { /* parse and validate first: no GPU needed */
    if (ag_spec_load_file(argv[i], NULL, &err) != AG_OK) {
      fprintf(stderr, "%s\n", err.message);
      ag_error_clear(&err);
      return 1;
    }
  }
  ag_context *ctx = NULL;
  ag_status st = ag_context_create(0, &ctx, &err);
  if (st == AG_ERR_NO_DRIVER || st == AG_ERR_NO_DEVICE || (st == AG_OK && load_driver())) {
    printf("SKIP: no CUDA driver or GPU here (%s)\n", err.message ? err.message : "libcuda");
    ag_error_clear(&err);
    ag_context_destroy(ctx);
    return 77;
  }
  if (st != AG_OK) {
    fprintf(stderr, "%s\n", err.message);
    ag_error_clear(&err);
    return 1;
  }
  int failed = 0;
  for (int i = 1; i < argc; i++) failed |= run_variant(ctx, argv[i]);
  ag_context_destroy(ctx); /* unloads every kernel */
  return failed;
}
