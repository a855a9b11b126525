// SPDX-License-Identifier: BSD-3-Clause
/* context.c: one context per device (the retained primary context and what
 * the launcher needs to know about the device), and its kernels: the
 * in-memory cache in front of the disk cache, module loading, occupancy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

#define DEFAULT_SMEM_LIMIT (48 * 1024) /* above this a kernel must opt in */

ag_status ag_context_create(int device_ordinal, ag_context **out_ctx, ag_error *err) {
  ag_status st;
  ag_context *ctx = NULL;
  bool mutex = false;
  const ag_driver *d;
  if (!out_ctx) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_context_create: out_ctx is NULL");
  *out_ctx = NULL;
  st = ag_driver_get(&d, err);
  if (st != AG_OK) return st;
  int count = 0;
  st = ag_cuda_check(err, d->cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (st != AG_OK) return st;
  if (count == 0) return ag_fail(err, AG_ERR_NO_DEVICE, "the CUDA driver reports no device");
  if (device_ordinal < 0 || device_ordinal >= count)
    return ag_fail(err, AG_ERR_NO_DEVICE, "no CUDA device %d: the driver reports %d device%s",
                   device_ordinal, count, count == 1 ? "" : "s");

  ctx = calloc(1, sizeof *ctx);
  if (!ctx) return ag_fail(err, AG_ERR_NOMEM, "out of memory");
  ctx->drv = d;
  ctx->ordinal = device_ordinal;
  st = ag_cuda_check(err, d->cuDeviceGet(&ctx->device, device_ordinal), "cuDeviceGet");
  if (st != AG_OK) goto fail;
  struct {
    CUdevice_attribute attr;
    int *out;
    const char *what;
  } attrs[] = {
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &ctx->cc_major,
       "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)"},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &ctx->cc_minor,
       "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)"},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &ctx->sm_count,
       "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)"},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &ctx->max_smem_optin,
       "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)"},
  };
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
    st = ag_cuda_check(err, d->cuDeviceGetAttribute(attrs[i].out, attrs[i].attr, ctx->device),
                       attrs[i].what);
    if (st != AG_OK) goto fail;
  }
  st = ag_cuda_check(err, d->cuDeviceGetName(ctx->name, (int)sizeof ctx->name, ctx->device),
                     "cuDeviceGetName");
  if (st != AG_OK) goto fail;
  ag_arch_for_device(ctx->cc_major, ctx->cc_minor, ctx->arch);
  if (pthread_mutex_init(&ctx->lock, NULL) != 0) {
    st = ag_fail(err, AG_ERR_NOMEM, "cannot create a mutex");
    goto fail;
  }
  mutex = true;
  st = ag_cuda_check(err, d->cuDevicePrimaryCtxRetain(&ctx->cu, ctx->device),
                     "cuDevicePrimaryCtxRetain");
  if (st != AG_OK) goto fail;
  *out_ctx = ctx;
  return AG_OK;
fail:
  if (mutex) pthread_mutex_destroy(&ctx->lock);
  free(ctx);
  return st;
}

/* Unload an unlisted kernel's module (with the context current), free it. */
static void kernel_free(ag_kernel *k) {
  if (!k) return;
  const ag_driver *d = k->ctx->drv;
  if (k->module && d->cuCtxPushCurrent(k->ctx->cu) == CUDA_SUCCESS) {
    CUcontext popped;
    d->cuModuleUnload(k->module);
    d->cuCtxPopCurrent(&popped);
  }
  free(k);
}

void ag_context_destroy(ag_context *ctx) {
  if (!ctx) return;
  const ag_driver *d = ctx->drv;
  /* Wait for work already queued before its modules go away. */
  bool pushed = d->cuCtxPushCurrent(ctx->cu) == CUDA_SUCCESS;
  if (pushed) d->cuCtxSynchronize();
  for (ag_kernel *k = ctx->kernels, *next; k; k = next) {
    next = k->next;
    if (pushed && k->module) d->cuModuleUnload(k->module);
    free(k);
  }
  if (pushed) {
    CUcontext popped;
    d->cuCtxPopCurrent(&popped);
  }
  d->cuDevicePrimaryCtxRelease(ctx->device);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx->cache_warning);
  free(ctx);
}

const char *ag_context_arch(const ag_context *ctx) { return ctx ? ctx->arch : NULL; }

char *ag_context_cache_warning(ag_context *ctx) {
  if (!ctx) return NULL;
  pthread_mutex_lock(&ctx->lock);
  char *copy = ctx->cache_warning ? strdup(ctx->cache_warning) : NULL;
  pthread_mutex_unlock(&ctx->lock);
  return copy;
}

/* One entry point of a loaded module (context pushed): the function, the
 * shared memory opt-in and occupancy. */
static ag_status load_function(ag_context *ctx, CUmodule module, const char *name, int threads,
                               int smem_bytes, CUfunction *out_fn, int *out_ctas_per_sm,
                               ag_error *err) {
  const ag_driver *d = ctx->drv;
  char what[AG_KERNEL_NAME_MAX + 64];
  snprintf(what, sizeof what, "cuModuleGetFunction(%s)", name);
  ag_status st = ag_cuda_check(err, d->cuModuleGetFunction(out_fn, module, name), what);
  if (st != AG_OK) return st;
  if (smem_bytes < 0 || smem_bytes > ctx->max_smem_optin)
    return ag_fail(err, AG_ERR_UNSUPPORTED,
                   "%s needs %d bytes of shared memory per CTA; device %d (%s) allows %d", name,
                   smem_bytes, ctx->ordinal, ctx->name, ctx->max_smem_optin);
  if (smem_bytes > DEFAULT_SMEM_LIMIT) {
    st = ag_cuda_check(err,
                       d->cuFuncSetAttribute(*out_fn,
                                             CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             smem_bytes),
                       "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    if (st != AG_OK) return st;
  }
  st = ag_cuda_check(err,
                     d->cuOccupancyMaxActiveBlocksPerMultiprocessor(out_ctas_per_sm, *out_fn,
                                                                    threads, (size_t)smem_bytes),
                     "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  if (st != AG_OK) return st;
  if (*out_ctas_per_sm < 1)
    return ag_fail(err, AG_ERR_UNSUPPORTED,
                   "%s does not fit on device %d (%s): %d threads and %d bytes of shared memory "
                   "per CTA give zero resident CTAs",
                   name, ctx->ordinal, ctx->name, threads, smem_bytes);
  return AG_OK;
}

/* Load the cubin into k (context pushed): module, then each function the
 * plan names (its kernels, in order) with its shared memory opt-in
 * and occupancy. On failure nothing stays loaded. */
static ag_status load(ag_context *ctx, ag_kernel *k, const void *cubin, ag_error *err) {
  const ag_driver *d = ctx->drv;
  const ag_plan *p = &k->plan;
  ag_status st = ag_cuda_check(err, d->cuCtxPushCurrent(ctx->cu), "cuCtxPushCurrent");
  if (st != AG_OK) return st;
  st = ag_cuda_check(err, d->cuModuleLoadData(&k->module, cubin), "cuModuleLoadData");
  if (st != AG_OK) {
    k->module = NULL;
    goto fail;
  }
  for (int i = 0; i < p->nkernels && st == AG_OK; i++)
    st = load_function(ctx, k->module, p->kernels[i].name, p->kernels[i].threads,
                       p->kernels[i].smem_bytes, &k->fn[i], &k->ctas_per_sm[i], err);
fail:
  if (st != AG_OK && k->module) {
    d->cuModuleUnload(k->module);
    k->module = NULL;
  }
  CUcontext popped;
  ag_status pop =
      ag_cuda_check(st == AG_OK ? err : NULL, d->cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
  if (st == AG_OK && pop != AG_OK) { /* the push is still in force */
    d->cuModuleUnload(k->module);
    k->module = NULL;
    st = pop;
  }
  return st;
}

/* The listed kernel for (hash, arch), or NULL. Call with the lock held. */
static ag_kernel *find(ag_context *ctx, const uint8_t hash[AG_SHA256_BYTES], const char *arch) {
  for (ag_kernel *k = ctx->kernels; k; k = k->next)
    if (memcmp(k->source_hash, hash, AG_SHA256_BYTES) == 0 && strcmp(k->arch, arch) == 0) return k;
  return NULL;
}

ag_status ag_context_kernel(ag_context *ctx, const ag_spec *spec, const ag_plan *plan,
                            const char *source, const char *arch, const void *image,
                            ag_kernel **out_kernel, ag_error *err) {
  ag_status st;
  ag_kernel *k = NULL, *found;
  void *cubin = NULL;
  size_t size = 0;
  char *warning = NULL;
  uint8_t hash[AG_SHA256_BYTES];
  *out_kernel = NULL;
  if (strlen(arch) >= AG_ARCH_NAME_MAX || !ag_arch_runs_on(arch, ctx->cc_major, ctx->cc_minor))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "a cubin for %s cannot run on device %d (%s, %s)",
                   arch, ctx->ordinal, ctx->name, ctx->arch);
  ag_sha256_digest(source, strlen(source), hash);
  pthread_mutex_lock(&ctx->lock);
  found = find(ctx, hash, arch);
  pthread_mutex_unlock(&ctx->lock);
  if (found) {
    *out_kernel = found;
    return AG_OK;
  }

  /* A miss: compile (unless the image is given) and load without the
   * lock, so other specs proceed. */
  if (!image) {
    st = ag_compile_source_ex(source, ag_plan_first_kernel(plan), arch, &cubin, &size, NULL,
                              &warning, err);
    if (st != AG_OK) goto fail;
  }
  k = calloc(1, sizeof *k);
  if (!k) {
    st = ag_fail(err, AG_ERR_NOMEM, "out of memory");
    goto fail;
  }
  k->ctx = ctx;
  memcpy(k->source_hash, hash, sizeof hash);
  strcpy(k->arch, arch);
  k->spec = *spec;
  k->plan = *plan;
  st = load(ctx, k, image ? image : cubin, err);
  if (st != AG_OK) goto fail;

  pthread_mutex_lock(&ctx->lock);
  if (warning && !ctx->cache_warning) {
    ctx->cache_warning = warning;
    warning = NULL;
  }
  found = find(ctx, hash, arch);
  if (!found) {
    k->next = ctx->kernels;
    ctx->kernels = k;
    found = k;
    k = NULL;
  }
  pthread_mutex_unlock(&ctx->lock);
  *out_kernel = found; /* k, when non-NULL, lost a race and is dropped */
fail:
  kernel_free(k);
  free(cubin);
  free(warning);
  return st;
}
