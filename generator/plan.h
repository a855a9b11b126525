/* plan.h: every compile-time decision for a spec's kernels in one struct:
 * tile shapes, warps, pipeline depth, shared memory and the kernel's name.
 * The plan is plain data; the emitter and the launcher both read it. */
#ifndef AG_PLAN_H
#define AG_PLAN_H

#include "attngen.h"

/* The backward kernel's own shape; it shares the plan's block size,
 * head_dim, element size and scale. */
typedef struct ag_plan_bwd {
  char kernel_name[AG_KERNEL_NAME_MAX]; /* "" when the spec has no backward pass */
  int warps;            /* warps per CTA */
  int threads;          /* warps * 32 */
  int heads_per_tile;   /* adjacent heads loaded and computed as one tile */
  int jobs;             /* (head, 16-row tile) jobs per tile and phase, taken in turn */
  int stages;           /* (block, head group) Q, K, V, dO tiles resident per CTA */
  int smem_bytes;       /* the stages (with any rotary table rows), P and dS of one tile
                         * unless they overlay K and V, and the store staging rows */
  int min_ctas_per_sm;  /* __launch_bounds__ minimum: caps registers */
  int items_per_cta;    /* grid = items / this; 0: persistent (SMs x occupancy) */
  bool pds_overlay;     /* P and dS take K's and V's place after phase 1 (else own buffer) */
  bool wgmma;           /* sm_90a code runs both phases on wgmma (64x64 tiles of one head) */
  bool bulk_store;      /* sm_90 code stores the gradients through each warp's staging rows
                         * (stmatrix) with bulk copies; where they fit beside the rest */
  bool key_chunks;      /* the block does not fit whole: it is walked in 64-row chunks with
                         * recomputation (templates/block_bwd_chunked.cu) */
} ag_plan_bwd;

/* The fields up to `scale` describe the forward kernel (kernel_name is ""
 * and the shape fields 0 when the spec has no forward pass); `bwd` the
 * backward's. One source holds every kernel of the plan, forward first. */
typedef struct ag_plan {
  char kernel_name[AG_KERNEL_NAME_MAX]; /* extern "C" entry point */
  int block_size;       /* tokens per diagonal block */
  int head_dim;
  int elem_bytes;       /* 2 for bf16 and fp16 */
  int warps;            /* warps per CTA */
  int threads;          /* warps * 32 */
  int heads_per_tile;   /* adjacent heads loaded and computed as one tile */
  int jobs_per_warp;    /* (head, 16-row query tile) jobs each warp runs */
  int stages;           /* (block, head group) tiles resident per CTA */
  int smem_bytes;       /* dynamic shared memory per CTA */
  int min_ctas_per_sm;  /* __launch_bounds__ minimum: caps registers */
  int items_per_cta;    /* grid = items / this; 0: persistent (SMs x occupancy) */
  double scale;         /* softmax scale, auto resolved */
  /* Rotary embeddings with positions from a table: the bytes of one tile's
   * rows of it (block_size x head_dim 16-bit values, shared by every head),
   * held in every stage of both kernels beside the tensors; else 0. */
  int rotary_table_bytes;
  ag_plan_bwd bwd;      /* the backward kernel, when spec->passes asks for it */
} ag_plan;

/* Fill *out for a validated spec: the kernels of the passes it names (a
 * spec naming none gets the forward). Returns AG_ERR_UNSUPPORTED for specs
 * whose kernels do not exist yet or do not fit; validation (spec_check.c)
 * plans each pass too and reports these at the key, so a spec that loads
 * with AG_OK always plans. Rotary kernels' names end _rope_fwd and
 * _rope_bwd. */
ag_status ag_plan_make(const ag_spec *spec, ag_plan *out, ag_error *err);

/* The backward's shape for `heads_per_tile`, `stages` and `ctas` CTAs per
 * SM (0: the most that fit, with at most `sm_warps` warps per SM) in *b,
 * from the forward fields of `plan` (block_size, head_dim, elem_bytes,
 * rotary_table_bytes); false when it does not fit. The kernel name is left
 * alone. For plan_backward and tuning tools. */
bool ag_plan_backward_shape(const ag_plan *plan, int heads_per_tile, int stages, int ctas,
                            int sm_warps, ag_plan_bwd *b);

/* The name of the source's first kernel (the forward's, else the
 * backward's): the one ag_emit reports. */
const char *ag_plan_first_kernel(const ag_plan *plan);

/* Emit the CUDA C for a spec under a given plan (ag_emit uses the plan from
 * ag_plan_make; tuning tools pass variants). Same ownership as ag_emit. */
ag_status ag_emit_plan(const ag_spec *spec, const ag_plan *plan, char **out_source,
                       ag_error *err);

/* Write the plan as a readable comment block body (one "key: value" per
 * line, each prefixed by `prefix`) into a malloc()ed string. */
char *ag_plan_describe(const ag_plan *plan, const char *prefix);

#endif
