// SPDX-License-Identifier: BSD-3-Clause
/* cta_timeline.c: where a block-diagonal forward launch spends its time, CTA
 * by CTA. Emits the forward for an ads shape, patches four %globaltimer
 * stamps into the emitted source (a CTA's start, the end of walk_begin, its
 * first tile landed, its end), times the kernel as tune_block does, reads
 * the stamps of the last launch back and prints: per-CTA means, live CTAs
 * per microsecond at the start and the end of the launch, when the first
 * wave's first tiles land, and how long SMs sit idle before the end. A
 * diagnostic for plan and walk changes (bench/NOTES.md, forward item 10);
 * the stamps cost a few registers, so its times are not the kernel's.
 * Usage: cta_timeline [L [head_dim [tiles_per_cta]]] (default 512 128, the
 * plan's tiles per CTA). Stops with a message if the emitted source no
 * longer has the text a stamp goes after. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "runtime.h" /* internal: the plan and the driver table (see README, Development) */
#include "selfcheck.h"

enum { MAX_CTAS = 1 << 17 };

static void die(const char *what, const ag_error *e) {
  fprintf(stderr, "cta_timeline: %s%s%s\n", what, e ? ": " : "",
          e ? (e->message ? e->message : ag_strerror(e->code)) : "");
  exit(1);
}

/* `src` with `text` inserted before (or after) the first `anchor`. */
static char *insert(char *src, const char *anchor, const char *text, int after) {
  const char *p = strstr(src, anchor);
  if (!p) {
    fprintf(stderr, "cta_timeline: the emitted source has no '%s'\n", anchor);
    exit(1);
  }
  size_t n = strlen(src), t = strlen(text), at = (size_t)(p - src) + (after ? strlen(anchor) : 0);
  char *out = malloc(n + t + 1);
  if (!out) die("out of memory", NULL);
  memcpy(out, src, at);
  memcpy(out + at, text, t);
  memcpy(out + at + t, src + at, n - at + 1);
  free(src);
  return out;
}

static char *stamped_source(const ag_spec *spec, const ag_plan *plan) {
  ag_error err = {0};
  char *src;
  if (ag_emit_plan(spec, plan, &src, &err)) die("emit", &err);
  src = insert(src, "/* ---- begin kernel ----",
               "__device__ unsigned long long g_stamps[1 << 17][4]; // start, walked, first tile, end\n"
               "__device__ unsigned g_sm[1 << 17];\n"
               "__device__ __forceinline__ unsigned long long now() {\n"
               "  unsigned long long t;\n"
               "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
               "  return t;\n"
               "}\n\n", 0);
  src = insert(src, "extern __shared__ __align__(128) unsigned short smem[];\n",
               "  const unsigned long long t_start = now();\n  unsigned long long t_first = 0;\n", 1);
  src = insert(src, "walk_begin(w, offsets, batch, heads, total_tokens, num_items);\n",
               "  const unsigned long long t_walked = now();\n", 1);
  src = insert(src, "    unsigned short *stage = smem + (n % kStages) * kStageElems;\n",
               "    if (n == 0) t_first = now();\n", 1);
  src = insert(src, "  cp_async_wait<0>();\n}\n",
               "  if (threadIdx.x == 0 && blockIdx.x < (1 << 17)) {\n"
               "    unsigned sm;\n"
               "    asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(sm));\n"
               "    g_stamps[blockIdx.x][0] = t_start;\n"
               "    g_stamps[blockIdx.x][1] = t_walked;\n"
               "    g_stamps[blockIdx.x][2] = t_first;\n"
               "    g_stamps[blockIdx.x][3] = now();\n"
               "    g_sm[blockIdx.x] = sm;\n"
               "  }\n", 0);
  return src;
}

typedef CUresult (*get_global_fn)(CUdeviceptr *, size_t *, CUmodule, const char *);

/* Copy the module global `name` (`bytes` long) to `dst`. */
static void read_global(ag_context *ctx, CUmodule mod, const char *name, void *dst, size_t bytes) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  get_global_fn get = lib ? (get_global_fn)dlsym(lib, "cuModuleGetGlobal_v2") : NULL;
  CUdeviceptr p;
  size_t size;
  CUcontext popped;
  ctx->drv->cuCtxPushCurrent(ctx->cu);
  if (!get || get(&p, &size, mod, name) || size != bytes || ctx->drv->cuMemcpyDtoH(dst, p, bytes))
    die("cannot read the stamps back", NULL);
  ctx->drv->cuCtxPopCurrent(&popped);
  if (lib) dlclose(lib);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Percentiles 10, 50, 90 and the maximum of v[0..n), sorted in place. */
static void print_spread(const char *what, double *v, int n) {
  if (!n) return;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  printf("%s: p10 %.2f, p50 %.2f, p90 %.2f, max %.2f us\n", what, v[n / 10], v[n / 2],
         v[n * 9 / 10], v[n - 1]);
}

int main(int argc, char **argv) {
  const int L = argc > 1 ? atoi(argv[1]) : 512, dim = argc > 2 ? atoi(argv[2]) : 128;
  const int per_cta = argc > 3 ? atoi(argv[3]) : 0;
  if (L < 16 || L > 1 << 20 || (dim != 64 && dim != 128) || per_cta < 0 || argc > 4) {
    fprintf(stderr, "usage: cta_timeline [L [64|128 [tiles_per_cta]]]\n");
    return 2;
  }
  ag_error err = {0};
  ag_context *ctx;
  if (ag_context_create(0, &ctx, &err)) die("no GPU", &err);
  char yaml[256];
  snprintf(yaml, sizeof yaml, "name: timeline\npattern: block_diagonal\nblock_size: 64\n"
           "head_dim: %d\ndtype: bf16\npasses: [forward]\n", dim);
  ag_spec spec;
  ag_plan plan;
  if (ag_spec_load_string(yaml, strlen(yaml), "timeline.yaml", &spec, &err)) die("spec", &err);
  if (ag_plan_make(&spec, &plan, &err)) die("plan", &err);
  if (per_cta) {
    plan.fwd.items_per_cta = per_cta;
    ag_plan_kernels(&spec, &plan);
  }
  char *src = stamped_source(&spec, &plan);
  ag_kernel *k;
  if (ag_context_kernel(ctx, &spec, &plan, src, ctx->arch, NULL, &k, &err)) die("compile", &err);
  free(src);

  /* The ads shape of tune_block: batch 1152, 4 heads, lengths uniform in
   * [0.4 L, L]. */
  const int64_t batch = 1152, heads = 4;
  int32_t len[1152];
  uint64_t rng = 42;
  for (int64_t i = 0; i < batch; i++) len[i] = (int32_t)(0.4 * L + ag_rand_uniform(&rng, 0, 0.6 * L + 1));
  ag_block_data *d;
  double ms;
  if (ag_block_data_create(ctx, spec.dtype, dim, 64, len, batch, heads, 7, &d, &err)) die("data", &err);
  if (ag_block_data_time(d, k, 3, 30, &ms, &err)) die("launch", &err);

  static unsigned long long t[MAX_CTAS][4];
  static unsigned sm_of[MAX_CTAS];
  static double v[MAX_CTAS];
  read_global(ctx, k->module, "g_stamps", t, sizeof t);
  read_global(ctx, k->module, "g_sm", sm_of, sizeof sm_of);
  int n = 0;
  while (n < MAX_CTAS && t[n][0]) n++;
  if (!n) die("no CTA left a stamp", NULL);
  unsigned long long t0 = t[0][0], t_end = 0;
  for (int i = 0; i < n; i++) {
    if (t[i][0] < t0) t0 = t[i][0];
    if (t[i][3] > t_end) t_end = t[i][3];
  }
  printf("L=%d head_dim=%d tiles/CTA %d: median %.4f ms over 30 launches; the last: %d CTAs, "
         "%.1f us from the first start to the last end\n",
         L, dim, plan.fwd.items_per_cta, ms, n, (t_end - t0) / 1e3);
  double walk = 0, first = 0, life = 0;
  int with_tiles = 0;
  for (int i = 0; i < n; i++) {
    walk += t[i][1] - t[i][0];
    life += t[i][3] - t[i][0];
    if (t[i][2]) first += t[i][2] - t[i][1], with_tiles++;
  }
  printf("per CTA, mean: walk_begin %.2f us, then %.2f us to its first tile, lifetime %.2f us\n",
         walk / n / 1e3, with_tiles ? first / with_tiles / 1e3 : 0.0, life / n / 1e3);

  /* Live CTAs per microsecond. */
  const int bins = (int)((t_end - t0) / 1000) + 1;
  int *live = calloc((size_t)bins, sizeof *live);
  if (!live) die("out of memory", NULL);
  for (int i = 0; i < n; i++)
    for (unsigned long long b = (t[i][0] - t0) / 1000; b <= (t[i][3] - t0) / 1000; b++) live[b]++;
  printf("live CTAs, first 25 us:");
  for (int b = 0; b < 25 && b < bins; b++) printf(" %d", live[b]);
  printf("\nlive CTAs, last 30 us:");
  for (int b = bins > 30 ? bins - 30 : 0; b < bins; b++) printf(" %d", live[b]);
  printf("\n");
  free(live);

  /* The first wave: CTAs that started within 1 us of the first. */
  int m = 0;
  for (int i = 0; i < n; i++)
    if (t[i][2] && t[i][0] - t0 < 1000) v[m++] = (t[i][2] - t0) / 1e3;
  print_spread("first wave's first tile landed, after the launch's start", v, m);

  /* How long each SM idles before the launch ends. */
  static unsigned long long sm_end[1024];
  for (int i = 0; i < n; i++)
    if (sm_of[i] < 1024 && t[i][3] > sm_end[sm_of[i]]) sm_end[sm_of[i]] = t[i][3];
  m = 0;
  for (int s = 0; s < 1024; s++)
    if (sm_end[s]) v[m++] = (t_end - sm_end[s]) / 1e3;
  print_spread("SM idle before the end", v, m);

  ag_block_data_destroy(d);
  ag_context_destroy(ctx);
  return 0;
}
