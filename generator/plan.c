/* plan.c: every compile-time decision for a spec, made in one place so that
 * the emitter and the launcher agree: the kernel's name, warps, the 16-row
 * tiles each warp owns, the pipeline depth and the shared memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "plan.h"

/* The largest dynamic shared memory a CTA may opt into on sm_90 (227 KiB);
 * sm_80 allows 163 KiB, checked at load time by the runtime. */
enum { MAX_SMEM_BYTES = 227 * 1024, MAX_WARPS = 8 };

double ag_spec_scale(const ag_spec *spec) {
  return spec->softmax_scale > 0 ? spec->softmax_scale : 1.0 / sqrt((double)spec->head_dim);
}

static const char *dtype_name(ag_dtype d) { return d == AG_DTYPE_FP16 ? "fp16" : "bf16"; }

ag_status ag_plan_make(const ag_spec *spec, ag_plan *out, ag_error *err) {
  memset(out, 0, sizeof *out);
  if (spec->pattern != AG_PATTERN_BLOCK_DIAGONAL)
    return ag_fail(err, AG_ERR_UNSUPPORTED, "not supported yet: the jagged pattern");
  if (spec->passes & AG_PASS_BACKWARD)
    return ag_fail(err, AG_ERR_UNSUPPORTED, "not supported yet: the backward pass");
  if (spec->rotary.layout != AG_ROTARY_NONE)
    return ag_fail(err, AG_ERR_UNSUPPORTED, "not supported yet: rotary embeddings");
  if (spec->block_size < 16 || spec->block_size > 256 || spec->block_size % 16 ||
      (spec->head_dim != 64 && spec->head_dim != 128))
    return ag_fail(err, AG_ERR_SPEC, "spec '%s' was not validated", spec->name);

  out->block_size = spec->block_size;
  out->head_dim = spec->head_dim;
  out->elem_bytes = 2;
  /* Two adjacent heads per tile at head_dim 64, so each tile row is 256
   * contiguous bytes as at head_dim 128: on the H200, 64-token blocks at
   * head_dim 64 reached 85-89% of copy bandwidth one head at a time and
   * 93-100% two at a time (bench/NOTES.md). Only where two CTAs of two such
   * tiles each still fit on an SM. */
  int row_bytes = spec->head_dim * out->elem_bytes;
  int tile_bytes = 3 * spec->block_size * row_bytes; /* Q, K, V of one head */
  out->heads_per_tile = row_bytes < 256 && 2 * 2 * 2 * tile_bytes <= MAX_SMEM_BYTES ? 2 : 1;
  /* One warp per 16 query rows, up to 8 warps; more jobs (heads, larger
   * blocks) are taken in turn, so S and O of one job fit in registers. */
  int row_tiles = spec->block_size / 16;
  out->warps = row_tiles < MAX_WARPS ? row_tiles : MAX_WARPS;
  int jobs = row_tiles * out->heads_per_tile;
  out->jobs_per_warp = (jobs + out->warps - 1) / out->warps; /* the last round may be partial */
  out->threads = out->warps * 32;
  /* Two tiles resident per CTA (load the next while computing this one)
   * when they fit (a 256x128 block needs 192 KiB for one), registers
   * capped so that two such CTAs share an SM, and one CTA per 8 tiles
   * rather than a persistent grid: the hardware then balances CTAs across
   * SMs, which measured 3-5% faster than static ranges (bench/NOTES.md). */
  int stage_bytes = out->heads_per_tile * tile_bytes;
  out->stages = 2 * stage_bytes <= MAX_SMEM_BYTES ? 2 : 1;
  out->smem_bytes = out->stages * stage_bytes;
  out->min_ctas_per_sm = 2 * out->smem_bytes <= MAX_SMEM_BYTES ? 2 : 1;
  out->items_per_cta = 8;
  out->scale = ag_spec_scale(spec);
  snprintf(out->kernel_name, sizeof out->kernel_name, "ag_%s_b%d_d%d_%s%s_fwd", spec->name,
           spec->block_size, spec->head_dim, dtype_name(spec->dtype),
           spec->causal ? "_causal" : "");
  return AG_OK;
}

char *ag_plan_describe(const ag_plan *p, const char *prefix) {
  ag_buf b;
  ag_buf_init(&b);
  ag_buf_printf(&b, "%skernel: %s\n", prefix, p->kernel_name);
  ag_buf_printf(&b, "%sheads per tile: %d\n", prefix, p->heads_per_tile);
  ag_buf_printf(&b, "%sthreads: %d (%d warps, %d job%s of 16 query rows each)\n", prefix,
                p->threads, p->warps, p->jobs_per_warp, p->jobs_per_warp > 1 ? "s" : "");
  ag_buf_printf(&b, "%stiles resident per CTA: %d\n", prefix, p->stages);
  ag_buf_printf(&b, "%sshared memory: %d bytes\n", prefix, p->smem_bytes);
  if (p->min_ctas_per_sm > 1)
    ag_buf_printf(&b, "%sregisters capped for %d CTAs per SM\n", prefix, p->min_ctas_per_sm);
  if (p->items_per_cta)
    ag_buf_printf(&b, "%sgrid: one CTA per %d (block, head group) tiles\n", prefix,
                  p->items_per_cta);
  else
    ag_buf_printf(&b, "%sgrid: persistent, as many CTAs as fit on the device at once\n", prefix);
  return ag_buf_take(&b);
}
