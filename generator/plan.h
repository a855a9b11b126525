// SPDX-License-Identifier: BSD-3-Clause
/* plan.h: every compile-time decision for a spec's kernels, as plain data.
 * A plan is a list of kernel descriptors (template, walk, threads, shared
 * memory, parameters, the constants it bakes in), made by the pattern's
 * planner (plan_block.c, plan_jagged.c) from the pattern's shapes below.
 * The emitter expands each descriptor's template; the launcher packs each
 * descriptor's parameters and sizes its grid from its walk. Neither makes
 * a decision of its own. */
#ifndef AG_PLAN_H
#define AG_PLAN_H

#include "attngen.h"

struct ag_buf; /* internal.h */

enum {
  /* kernels of one source: 8 today (head dim 64, masked, sm_90a, both
   * passes: two forward variants and two backward sets of three), 9 with
   * .sm90_fwd_long192_causal's third forward */
  AG_PLAN_MAX_KERNELS = 12,
  AG_PLAN_MAX_PARAMS = 24,
  AG_PLAN_MAX_CONSTS = 24,
  AG_REFUSAL_MAX = 320,
};

/* ---- walks ----------------------------------------------------------------
 * A walk says which CTA takes which work. Each has a device half (a
 * template include) and a host half (runtime/walk_*.c: the grid and the
 * work count from the run-time sizes alone, never the offsets). */
typedef enum ag_walk_kind {
  /* templates/block_walk.cuh, runtime/walk_block.c: (virtual block, head
   * group) items, a contiguous range of them per CTA */
  AG_WALK_BLOCK,
  /* templates/jagged_walk.cuh, runtime/walk_jagged.c: one (virtual tile,
   * head) per CTA, over the query tokens or the key tokens */
  AG_WALK_JAGGED_Q,
  AG_WALK_JAGGED_K,
  /* broadcast queries (one dense Q of n_q = total_q / batch rows): one
   * (sequence, query tile, head) per CTA; one (query tile, slab of
   * sequences, head) per CTA, ITEMS = q_tiles * slabs
   * (ag_broadcast_slabs); the sum of the slabs, `rows` (query row, head)
   * pairs per CTA, ITEMS = slabs */
  AG_WALK_BROADCAST_Q,
  AG_WALK_BROADCAST_SLABS,
  AG_WALK_BROADCAST_SUM,
  /* one CTA per `rows` (token, head) rows of the queries: grid
   * ceil(total_q * heads / rows), at least 1, ITEMS = the grid (the fast
   * jagged backward's D and dQ kernels; the first also zeroes the next
   * walk's counter, so it runs when there are no queries too) */
  AG_WALK_JAGGED_ROWS,
  /* persistent over the key tokens: the numbers of AG_WALK_JAGGED_K
   * ((virtual tile, kv head), ITEMS = the tiles) taken from a counter in
   * the workspace by min(SMs * CTAs an SM, numbers) CTAs (the
   * warp-specialized jagged backward's _kv) */
  AG_WALK_JAGGED_K_COUNTER,
} ag_walk_kind;

typedef struct ag_walk {
  ag_walk_kind kind;
  int rows;           /* tokens per item (a block, a tile) */
  int heads_per_item; /* adjacent heads an item covers */
  int items_per_cta;  /* block walk: grid = items / this; 0: persistent */
  /* AG_WALK_BROADCAST_Q: the heads folded into x (grid (CTAs * heads, 1),
   * CTA x taking head x % heads), so that a sequence's heads run side by
   * side; else (CTAs, heads) */
  bool heads_inner;
} ag_walk;

/* ---- kernel parameters, by role; a kernel lists them in its order ------- */
typedef enum ag_param {
  AG_PARAM_Q, AG_PARAM_K, AG_PARAM_V, AG_PARAM_O, AG_PARAM_DOUT,
  AG_PARAM_DQ, AG_PARAM_DK, AG_PARAM_DV, AG_PARAM_LSE, AG_PARAM_DI,
  AG_PARAM_ROTARY_TABLE,   /* the queries' table (the block pattern's only one) */
  AG_PARAM_ROTARY_TABLE_K, /* the jagged pattern's keys' table */
  AG_PARAM_OFFSETS_Q,  /* the block pattern's offsets; cu_seqlens_q */
  AG_PARAM_OFFSETS_K,  /* cu_seqlens_k */
  AG_PARAM_BATCH,      /* long long */
  AG_PARAM_HEADS,      /* int */
  AG_PARAM_KV_HEADS,   /* int */
  AG_PARAM_TOTAL_Q,    /* long long: the block pattern's total_tokens */
  AG_PARAM_TOTAL_K,    /* long long */
  AG_PARAM_ITEMS,      /* long long: the walk's work count */
  /* The block pattern's row strides (int: elements from one token's row to
   * the next, < 2^31), one a tensor, in the order of the tensor roles above
   * (AG_PARAM_STRIDE_Q + r for tensor role r <= AG_PARAM_DV) */
  AG_PARAM_STRIDE_Q, AG_PARAM_STRIDE_K, AG_PARAM_STRIDE_V, AG_PARAM_STRIDE_O,
  AG_PARAM_STRIDE_DOUT, AG_PARAM_STRIDE_DQ, AG_PARAM_STRIDE_DK, AG_PARAM_STRIDE_DV,
  /* The tensor maps of q and dout (const __grid_constant__ ag_tmap) for
   * kernels that load them by TMA: boxes of ag_plan_kernel.tma_rows rows
   * (runtime/tma.c) */
  AG_PARAM_TMAP_Q, AG_PARAM_TMAP_DOUT,
  /* ... and of k and v (rows total_k, kv_heads heads) */
  AG_PARAM_TMAP_K, AG_PARAM_TMAP_V,
  AG_PARAM_COUNT
} ag_param;

/* A constant the template bakes in: @NAME@ becomes the integer. The name
 * is a static string. */
typedef struct ag_plan_const {
  const char *name;
  int value;
} ag_plan_const;

/* One kernel of the source. */
typedef struct ag_plan_kernel {
  char name[AG_KERNEL_NAME_MAX]; /* extern "C" entry point */
  unsigned pass;                 /* AG_PASS_FORWARD or AG_PASS_BACKWARD */
  /* In templates/; NULL: the entry point is defined by the template of the
   * kernel before it (one template holding several kernels). */
  const char *template_file;
  /* @KERNEL_NAME@ of the template: the entry point's name, or the stem a
   * template of several kernels suffixes */
  char template_name[AG_KERNEL_NAME_MAX];
  /* NULL, or a C++ namespace the emitter wraps the expansion in (a second
   * template in one source keeps its constants apart) */
  const char *namespace_name;
  ag_walk walk;
  int threads;                   /* per CTA */
  int smem_bytes;                /* dynamic shared memory per CTA */
  int min_ctas_per_sm;           /* __launch_bounds__ minimum */
  int nparams;
  ag_param params[AG_PLAN_MAX_PARAMS];
  int nconsts;
  ag_plan_const consts[AG_PLAN_MAX_CONSTS];
  /* 0: launched with every run of its pass; else launched only when the
   * plan picks this variant for the run's sizes (ag_plan_variant): kernels
   * of one pass that are alternatives (tile shapes by the run-time n_q,
   * or by the mean query length) */
  int variant;
  int tma_rows; /* the rows of the TMA roles' boxes; 0: no TMA role */
  /* the TMA maps' L2 promotion in bytes (what L2 fetches from memory a
   * miss): 128 or 256 (0 where there is no TMA role) */
  int tma_l2_bytes;
} ag_plan_kernel;

/* ---- the block pattern's shapes (plan_block.c) --------------------------- */

/* The forward (templates/block_fwd.cu). */
typedef struct ag_plan_block_fwd {
  int warps;            /* warps per CTA */
  int threads;          /* warps * 32 */
  int heads_per_tile;   /* adjacent heads loaded and computed as one tile */
  int jobs_per_warp;    /* (head, 16-row query tile) jobs each warp runs */
  int stages;           /* (block, head group) tiles resident per CTA */
  int smem_bytes;       /* dynamic shared memory per CTA */
  int min_ctas_per_sm;  /* __launch_bounds__ minimum: caps registers */
  int items_per_cta;    /* grid = items / this; 0: persistent (SMs x occupancy) */
  bool table_slot;      /* one rotary table slot after the stages, not one per stage */
  bool table_reuse;     /* a block's table rows kept for its next head group (TABLE_REUSE) */
} ag_plan_block_fwd;

/* The backward (templates/block_bwd.cu, block_bwd_chunked.cu). */
typedef struct ag_plan_bwd {
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
  bool table_global;    /* the rotary table's rows read in global memory, not in the stages */
  bool late_dq;         /* dQ rotated back and stored after P and dS are (LATE_DQ) */
  bool table_reuse;     /* a block's table rows kept for its next head group (TABLE_REUSE) */
} ag_plan_bwd;

/* ---- the jagged pattern's shapes (plan_jagged.c) ------------------------- */
enum { AG_FUSED_VARIANTS = 3 }; /* one-pass broadcast backwards: 32, 64 and 128 rows */
/* One fast sm_90a backward's key-stationary _kv (beside its _pre and _dq):
 * templates/jagged_bwd_ws.cu when ws (a loading warpgroup and `stages` Q,
 * dO stages), else jagged_bwd_sm90.cu. */
typedef struct ag_plan_jagged_kv {
  int block_m, block_n, threads, smem_bytes;
  int min_ctas; /* CTAs an SM: 3 at head dim 64 takes one slot of staging rows */
  bool ws;
  int stages;
  bool dkv_n128; /* ws, head dim 128: dV and dK as one 64x128 product a k-step */
  bool tma_qdo;  /* ws: each step's Q and dO by TMA (the AG_PARAM_TMAP_* roles) */
  bool fused_dq; /* ws, TMA, head dim 128: dQ rounded in _kv by dQ warps; no _dq */
} ag_plan_jagged_kv;

typedef struct ag_plan_jagged {
  int fwd_block_m, fwd_block_n, fwd_warps, fwd_stages, fwd_smem_bytes, fwd_min_ctas;
  /* the forward is templates/jagged_fwd_sm90.cu (wgmma, sm_90a, head dim
   * 128, not broadcast), fwd_warps / 4 warpgroups of 64 rows; else
   * jagged_fwd.cu */
  bool fwd_sm90;
  /* the main forward (not the small variant) is templates/jagged_fwd_ws.cu
   * (warp specialized, sm_90a: a loading warpgroup beside fwd_warps / 4 - 1
   * computing ones); the small variant is then jagged_fwd_sm90.cu with
   * fwd_sm90 (head dim 128), else jagged_fwd.cu */
  bool fwd_ws;
  bool fwd_tma; /* fwd_ws: its K and V tiles by TMA (the AG_PARAM_TMAP_K, _V roles) */
  /* the TMA maps' L2 promotion, bytes, of the forward ([0]) and the
   * backward ([1]): 256, or 128 at head dim 64 with choices.tma_l2_row64
   * (a head's row of 64 elements is 128 bytes) */
  int tma_l2_bytes[2];
  /* broadcast: the warp-specialized forward's grid has its heads inner
   * (choices.bq_fwd_heads_inner; its walk's heads_inner) */
  bool fwd_heads_inner;
  /* fwd_ws: the query tiles a CTA computes in turn (1: one; more: the
   * loading warpgroup streams the next tile's Q and K, V while this one
   * ends) and its Q slots (2: the next Q lands while this tile runs);
   * fwd_smem_bytes counts fwd_q_tiles Q tiles */
  int fwd_items, fwd_q_tiles;
  /* fwd_ws with rotary tables: a slot of fwd_block_n table rows in its
   * shared memory, where the loading warpgroup copies the rows of the tile
   * it rotates next (fwd_smem_bytes counts them); else 0 */
  int fwd_table_rows;
  /* fwd_ws: a computing warpgroup issues no product where all its rows
   * are past the query tile's end, and the first K/V tile's S over 64 keys
   * where none of its rows sees past them (SKIP_DEAD) */
  bool fwd_skip_dead;
  /* fwd_ws: 0, or N: every N-th 8-key chunk of S takes its exponentials
   * on the FMA pipe instead of MUFU.EX2 (EXP2_FMA_EVERY) */
  int fwd_exp2_fma_every;
  int bwd_block_m, bwd_block_n, bwd_warps, bwd_smem_dq, bwd_smem_dkv, bwd_min_ctas;
  bool broadcast;   /* query: broadcast: one dense Q shared by every sequence */
  bool rotary;      /* rotary embeddings (the mma.sync kernels rotate the tiles) */
  int sum_threads;  /* broadcast: threads of the dQ sum kernel */
  /* the forward for few query rows a sequence (broadcast: n_q, else the
   * mean query length, ceil(total_q / batch), <= small_max_n_q): tiles of
   * small_block_m rows and small_block_n keys; 0 rows where not planned */
  int small_max_n_q, small_block_m, small_block_n, small_warps, small_stages, small_smem_bytes;
  int small_min_ctas;
  /* beside a small variant, the forward for long runs (mean query length
   * >= long_fwd_min_rows; 0 where not planned): the warp-specialized
   * forward on long_fwd_block_m-row tiles, one tile a CTA, key tiles of
   * fwd_block_n (choices.sm90_fwd_long192_causal) */
  int long_fwd_min_rows, long_fwd_block_m, long_fwd_warps, long_fwd_stages, long_fwd_smem_bytes;
  /* broadcast, heads == kv_heads: the one-pass backward for n_q <= the
   * tile's rows (templates/broadcast_bwd.cu), one per row count */
  int fused_block_m[AG_FUSED_VARIANTS], fused_warps[AG_FUSED_VARIANTS];
  int fused_smem_bytes[AG_FUSED_VARIANTS], fused_min_ctas[AG_FUSED_VARIANTS];
  int fused_stages[AG_FUSED_VARIANTS]; /* K, V slots, tiles in flight + 1 */
  bool fused_sm90[AG_FUSED_VARIANTS];  /* templates/broadcast_bwd_sm90.cu (wgmma) */
  bool fused_keys[AG_FUSED_VARIANTS];  /* templates/broadcast_bwd_keys.cu (wgmma, 128-key tiles) */
  /* sm_90a, not deterministic, not broadcast: the backward is one
   * key-stationary wgmma kernel with atomic dQ between a D kernel and a
   * dQ kernel (fast) instead of _dq and _dkv; fast.block_m 0 where not.
   * fast_rows_threads: threads of the D and dQ kernels. */
  ag_plan_jagged_kv fast;
  int fast_rows_threads;
  /* sm_90a, head dim 64 with a mask (fast then jagged_bwd_sm90.cu): for
   * runs whose mean query length (ceil(total_q / batch)) exceeds
   * long_min_rows, the backward is a second set of _pre, _kv, _dq,
   * fast_long (warp specialized); long_min_rows 0 where not planned */
  int long_min_rows;
  ag_plan_jagged_kv fast_long;
} ag_plan_jagged;

/* The variants of the broadcast kernels (ag_plan_kernel.variant): the
 * one-pass backwards are AG_VARIANT_BWD_FUSED_0 + i, i < AG_FUSED_VARIANTS,
 * by rows, and come last. */
enum {
  AG_VARIANT_FWD_SMALL = 1, AG_VARIANT_FWD_LARGE, AG_VARIANT_BWD_SPLIT,
  AG_VARIANT_BWD_SHORT, AG_VARIANT_BWD_LONG, /* jagged: ag_plan_jagged.long_min_rows */
  AG_VARIANT_FWD_LONG,                       /* jagged: ag_plan_jagged.long_fwd_min_rows */
  AG_VARIANT_BWD_FUSED_0
};

/* Why a valid spec was refused: the key that asks for what does not exist
 * or fit, and the reason (without any "not supported yet: "). */
typedef enum ag_refusal_key {
  AG_REFUSED_NONE, AG_REFUSED_PATTERN, AG_REFUSED_QUERY, AG_REFUSED_ROTARY,
  AG_REFUSED_PASSES, AG_REFUSED_DETERMINISTIC,
  AG_REFUSED_ARCH, /* a kernel needs more shared memory than the spec's arch has */
  AG_REFUSED_ROW_STRIDES, /* row_strides with a kernel that reads packed rows only */
} ag_refusal_key;

/* The most dynamic shared memory one block may opt into: sm_80 (A100)
 * 163 KiB, sm_90 (H100, H200) 227 KiB. */
#define AG_SMEM_MAX_SM80 (163 * 1024)
#define AG_SMEM_MAX_SM90 (227 * 1024)

typedef struct ag_plan {
  ag_pattern pattern;
  int block_size;       /* block pattern: tokens per diagonal block; else 0 */
  int head_dim;
  int elem_bytes;       /* 2 for bf16 and fp16 */
  double scale;         /* softmax scale, auto resolved */
  /* Rotary embeddings with positions from a table: the bytes of one tile's
   * rows of it (block_size x head_dim 16-bit values, shared by every head),
   * held in every stage of both block kernels beside the tensors; else 0. */
  int rotary_table_bytes;
  bool takes_table;     /* the kernels take a rotary table parameter */
  /* The block kernels take each tensor's row stride (AG_PARAM_STRIDE_*);
   * else their tensors are packed, rows heads * head_dim elements apart. */
  bool row_strides;
  /* The pattern's shapes, from which the kernels below are made; tuning
   * tools edit them and call ag_plan_kernels again. A pass the spec does
   * not name leaves its shape zeroed. */
  ag_plan_block_fwd fwd;
  ag_plan_bwd bwd;
  ag_plan_jagged jagged;
  /* The kernels, in source order: forward first. */
  int nkernels;
  ag_plan_kernel kernels[AG_PLAN_MAX_KERNELS];
  /* Set with AG_ERR_UNSUPPORTED. */
  ag_refusal_key refused_at;
  char refusal[AG_REFUSAL_MAX];
} ag_plan;

/* Fill *out for a validated spec: the kernels of the passes it names (a
 * spec naming none gets the forward). Returns AG_ERR_UNSUPPORTED for specs
 * whose kernels do not exist yet or do not fit (out->refused_at and
 * out->refusal say why; err's message is "not supported yet: " and the
 * reason); validation (spec_check.c) plans each pass too and reports these
 * at the key, so a spec that loads with AG_OK always plans. Kernel names
 * end _fwd and _bwd (_rope_fwd, _rope_bwd with rotary embeddings). */
ag_status ag_plan_make(const ag_spec *spec, ag_plan *out, ag_error *err);
/* AG_ERR_INVALID_ARGUMENT unless every field of a (maybe hand-filled) spec
 * is in range: enums, NUL-terminated source and name, a name of
 * [a-z][a-z0-9_]*, passes, head_dim, block_size, scale and base within fp32.
 * ag_plan_make (so ag_emit, ag_compile, ag_kernel_get) runs it first. */
ag_status ag_spec_check_fields(const ag_spec *spec, ag_error *err);

/* (Re)make out->kernels from the shapes in *out (after a tuning tool has
 * edited them). */
void ag_plan_kernels(const ag_spec *spec, ag_plan *plan);

/* Which variant of `pass` a run launches (0 when the plan has none): the
 * policy that picks tile shapes by the run-time sizes. `n_q`: the query
 * rows of a sequence, n_q with a broadcast Q, else the mean query length
 * (ceil(total_q / batch), 0 for an empty batch). */
int ag_plan_variant(const ag_plan *plan, unsigned pass, int64_t n_q, int64_t heads,
                    int64_t kv_heads);

/* The first kernel of `pass`, or NULL. */
const ag_plan_kernel *ag_plan_kernel_for(const ag_plan *plan, unsigned pass);

/* The backward's shape for `heads_per_tile`, `stages` and `ctas` CTAs per
 * SM (0: the most that fit, with at most `sm_warps` warps per SM) in *b,
 * from the plan's block_size, head_dim, elem_bytes, rotary_table_bytes
 * (none in the stages where b->table_global, which the caller sets);
 * false when it does not fit. For plan_block.c and tuning tools. */
bool ag_plan_backward_shape(const ag_plan *plan, int heads_per_tile, int stages, int ctas,
                            int sm_warps, ag_plan_bwd *b);

/* The name of the source's first kernel: the one ag_emit reports. */
const char *ag_plan_first_kernel(const ag_plan *plan);

/* Kernel k's parameter list as CUDA C, one declaration per role in its
 * order (emit_params.c): the text of a template's @PARAMS@. False when
 * it does not fit in `cap` or a role has no declaration. */
bool ag_emit_params(const ag_plan *plan, const ag_plan_kernel *k, char *out, size_t cap);

/* Emit the CUDA C for a spec under a given plan (ag_emit uses the plan from
 * ag_plan_make; tuning tools pass variants). Same ownership as ag_emit. */
ag_status ag_emit_plan(const ag_spec *spec, const ag_plan *plan, char **out_source,
                       ag_error *err);

/* Write the plan as a readable comment block body (one "key: value" per
 * line, each prefixed by `prefix`) into a malloc()ed string. */
char *ag_plan_describe(const ag_plan *plan, const char *prefix);

/* ---- the planners' own entry points (plan.c dispatches) ------------------ */
ag_status ag_plan_block(const ag_spec *spec, ag_plan *out, ag_error *err);
/* Layouts the block plan may take only once they have run on a GPU
 * (plan_block.c says which have). */
typedef struct ag_plan_block_choices {
  bool fwd_table_slot; /* the forward's rotary table rows in one slot, not one a stage */
  bool bwd_rotary_12_warps; /* head_dim 64 rotary backward: 12 warps an SM (170 registers) */
  bool bwd_table_global; /* head_dim 128 backward: the table read where it is, 12 warps an SM */
  bool bwd_late_dq; /* rotary backward: dQ rotated back after P and dS are stored */
  bool fwd_rotary_2_stages; /* head_dim 64 rotary forward: two stages, not one a CTA */
  bool table_reuse; /* rotary table rows not loaded again for the same block's next heads */
} ag_plan_block_choices;
/* ag_plan_block with other choices; for tests. */
ag_status ag_plan_block_with(const ag_spec *spec, ag_plan_block_choices choices, ag_plan *out,
                             ag_error *err);
/* The choices ag_plan_block takes (for tests that hold either way). */
ag_plan_block_choices ag_plan_block_checked(void);
void ag_plan_block_kernels(const ag_spec *spec, ag_plan *plan);
void ag_plan_block_describe(const ag_plan *plan, const char *prefix, struct ag_buf *b);
ag_status ag_plan_jagged_make(const ag_spec *spec, ag_plan *out, ag_error *err);
/* Kernels the jagged plan may take only once they have run on a GPU
 * (plan_jagged.c says which have): rotary specs on the sm_90a wgmma
 * kernels, the sm_90a forward's short-sequence variant. */
typedef struct ag_plan_jagged_choices {
  bool sm90_rotary, sm90_short, sm90_ws, sm90_ws64, sm90_bwd_ws, sm90_ws_broadcast, sm90_bwd_long;
  bool sm90_ws64_causal; /* head dim 64, causal: the warp-specialized forward for long runs */
  bool sm90_bwd_tma;     /* the warp-specialized backward loads Q and dO by TMA */
  bool sm90_fwd_tma;     /* the warp-specialized forward loads K and V by TMA */
  bool sm90_bwd_fused_dq; /* the warp-specialized backward rounds dQ itself (FUSED_DQ) */
  bool sm90_bq_bwd;      /* the 128-row one-pass broadcast backward on wgmma */
  /* the broadcast warp-specialized forward (sm90_ws_broadcast) at head dim
   * 64 with 6 K, V stages in flight instead of 3 */
  bool sm90_bq_fwd_deep;
  /* the warp-specialized forward's query tiles a CTA at head dim 64 ([0])
   * and 128 ([1]) (1: one a CTA) and its Q slots when more (1 or 2; with 2
   * the K, V stages drop to what shared memory still holds) */
  int fwd_items[2], fwd_q_tiles[2];
  /* the warp-specialized forward skips products none of a warpgroup's
   * rows needs (SKIP_DEAD; plan_jagged.c says which) */
  bool sm90_fwd_skip_dead;
  /* the warp-specialized forward's exponentials on the FMA pipe at head
   * dim 64 ([0]) and 128 ([1]): 0 (none), or N (every N-th 8-key chunk) */
  int sm90_fwd_exp2_fma_every[2];
  /* head dim 64 without a mask (not broadcast): the warp-specialized
   * forward on 192-row query tiles, three computing warpgroups, one tile a
   * CTA */
  bool sm90_fwd_ws192;
  /* the same with a causal mask (no window): the diagonal then crosses a
   * 192-row tile's two or three key tiles, where a 128-row tile's crosses
   * one or two */
  bool sm90_fwd_ws192_causal;
  /* with a causal mask and sm90_fwd_ws192_causal off: the 192-row tiles as
   * a third forward variant, for runs whose mean query length is at least
   * LONG_CAUSAL64_MEAN_ROWS (the 128-row tiles below it) */
  bool sm90_fwd_long192_causal;
  /* head dim 64: the forward's ([0]) and the backward's ([1]) TMA maps
   * promote an L2 miss to 128 bytes, one head's row, instead of 256 (two
   * heads' rows, the other head's half read for a CTA that may run long
   * after it left L2) */
  bool tma_l2_row64[2];
  /* the broadcast forward's grid with the heads inner (ag_walk.heads_inner):
   * a sequence's heads read its K, V rows (heads * head_dim elements, one
   * DRAM page's worth) side by side instead of a head's pass at a time */
  bool bq_fwd_heads_inner;
  /* broadcast: the warp-specialized forward computes .fwd_items query
   * tiles a CTA in turn as the jagged one does, at head dim 64 ([0]) and
   * 128 ([1]) (plan_forward_items) */
  bool bq_fwd_items[2];
  /* the one-pass broadcast backward's 32-row variant at head_dim 64 ([0])
   * and 128 ([1]): its warps (0: none, n_q <= 32 on the 64-row kernel) and
   * its K, V stages (2: the next tile loads during this one) */
  int bq_m32_warps[2], bq_m32_stages[2];
  /* the one-pass broadcast backward for every n_q <= 128 on the 128-row
   * wgmma kernel (with sm90_bq_bwd on sm_90a): no 32- or 64-row variant */
  bool bq_sm90_small;
  /* the one-pass broadcast backward for n_q <= 64 on the key-stationary
   * wgmma kernel (templates/broadcast_bwd_keys.cu, with sm90_bq_bwd on
   * sm_90a, no rotary embeddings): no 32-row variant, the 64-row one on it */
  bool bq_sm90_keys;
  /* the one-pass broadcast backward with rotary embeddings on the 128-row
   * wgmma kernel (templates/broadcast_bwd_sm90.cu: the copying threads
   * rotate their own pieces of Q and each K, V tile, the key warpgroup
   * dK, dV back) where a 64-column part of dK holds each pair (the
   * interleaved layout, or head dim 64) */
  bool bq_sm90_rotary;
  /* the broadcast forward for every n_q on the warp-specialized kernel
   * (where it is planned): no 32-row variant for n_q <= 64 */
  bool bq_fwd_ws_small;
  /* the broadcast forward with rotary embeddings at head dim 128 on sm_90a
   * on the wgmma kernel (templates/jagged_fwd_sm90.cu, as the jagged one
   * with rotary) instead of the 128-row mma.sync one; n_q <= 64 keeps the
   * 32-row variant */
  bool bq_fwd_sm90_rotary;
  /* the forward with rotary embeddings on the warp-specialized kernel too
   * (jagged_fwd_ws.cu: its loading warpgroup rotates each landed tile; K
   * and V by cp.async, two computing warpgroups), jagged and broadcast,
   * where the kernel is planned without them; before bq_fwd_sm90_rotary */
  bool sm90_fwd_ws_rotary;
} ag_plan_jagged_choices;
/* ag_plan_jagged_make with other choices; for tests. */
ag_status ag_plan_jagged_make_with(const ag_spec *spec, ag_plan_jagged_choices choices,
                                   ag_plan *out, ag_error *err);
/* The choices ag_plan_jagged_make takes (for tests that hold either way). */
ag_plan_jagged_choices ag_plan_jagged_checked(void);
void ag_plan_jagged_kernels(const ag_spec *spec, ag_plan *plan);
void ag_plan_jagged_describe(const ag_plan *plan, const char *prefix, struct ag_buf *b);
int ag_plan_jagged_variant(const ag_plan *plan, unsigned pass, int64_t n_q, int64_t heads,
                           int64_t kv_heads);

/* Shared by the planners: refuse with a reason at a key. */
ag_status ag_plan_refuse(ag_plan *out, ag_refusal_key key, ag_error *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* Shared by the planners: the spec's rotary fields checked (AG_ERR_SPEC for
 * what a validated spec cannot hold; a refusal for a base whose fp32
 * frequencies overflow) and out->takes_table set. */
ag_status ag_plan_rotary(const ag_spec *spec, ag_plan *out, ag_error *err);
/* Append a kernel descriptor (name from the spec and `pass`) and return it. */
ag_plan_kernel *ag_plan_add_kernel(const ag_spec *spec, ag_plan *plan, unsigned pass,
                                   const char *name_tag, const char *template_file);
void ag_plan_set(ag_plan_kernel *k, const char *name, int value);
void ag_plan_params(ag_plan_kernel *k, int n, const ag_param *params);

#endif
