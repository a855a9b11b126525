/* plan.h: every compile-time decision for a spec's kernels in one struct:
 * tile shapes, warps, pipeline depth, shared memory and the kernel's name.
 * The plan is plain data; the emitter and the launcher both read it. */
#ifndef AG_PLAN_H
#define AG_PLAN_H

#include "attngen.h"

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
} ag_plan;

/* Fill *out for a validated spec. Returns AG_ERR_UNSUPPORTED for specs whose
 * kernels do not exist yet. */
ag_status ag_plan_make(const ag_spec *spec, ag_plan *out, ag_error *err);

/* Emit the CUDA C for a spec under a given plan (ag_emit uses the plan from
 * ag_plan_make; tuning tools pass variants). Same ownership as ag_emit. */
ag_status ag_emit_plan(const ag_spec *spec, const ag_plan *plan, char **out_source,
                       ag_error *err);

/* Write the plan as a readable comment block body (one "key: value" per
 * line, each prefixed by `prefix`) into a malloc()ed string. */
char *ag_plan_describe(const ag_plan *plan, const char *prefix);

#endif
