// SPDX-License-Identifier: BSD-3-Clause
/* plan_block.c: the block-diagonal pattern's planner: the shapes of its
 * forward and backward (warps, the 16-row tiles each warp owns, the
 * pipeline depth, shared memory, the launch bound) and the kernel
 * descriptors made from them (templates, walk, parameters, constants). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "plan.h"

/* The largest dynamic shared memory a CTA may opt into on sm_90 (227 KiB);
 * sm_80 allows 163 KiB, checked at load time by the runtime. */
enum { MAX_SMEM_BYTES = 227 * 1024, MAX_WARPS = 8 };

static const char *dtype_name(ag_dtype d) { return d == AG_DTYPE_FP16 ? "fp16" : "bf16"; }

/* "ag_<name>_b<block>_d<dim>_<dtype>[_causal][_rope]_<pass>": a profiler
 * trace names what ran. */
static void kernel_name(char *out, const ag_spec *spec, const char *pass) {
  snprintf(out, AG_KERNEL_NAME_MAX, "ag_%s_b%d_d%d_%s%s%s_%s", spec->name, spec->block_size,
           spec->head_dim, dtype_name(spec->dtype), spec->causal ? "_causal" : "",
           spec->rotary.layout != AG_ROTARY_NONE ? "_rope" : "", pass);
}

/* Elements per row of P and dS (block_bwd.cu's kPStride): swizzled rows of
 * a multiple of 64, else rows padded by 16 bytes. */
static int p_stride(int block) { return block % 64 == 0 ? block : block + 8; }

/* Bytes of one warp's store staging rows (block_bwd.cu's kStagingElems): 16
 * rows of a head of 64 elements, each padded by 16 bytes. */
static int staging_bytes(int elem_bytes) { return 16 * (64 + 8) * elem_bytes; }

/* The backward (templates/block_bwd.cu): per tile, phase 1 takes (head, 16
 * query rows) jobs and phase 2 (head, 16 key rows) jobs. Beside the Q, K,
 * V, dO tiles it needs P and dS of every head of the tile, which grow with
 * the square of the block. For blocks of up to 64 tokens (P and dS rows of
 * a job then take at most 32 registers a thread, no more than K and V take
 * of shared memory) every job has its own warp, which keeps its P and dS
 * rows in registers until phase 1 is done and then writes them where K and
 * V were: a stage is then all the CTA's shared memory. Otherwise they get
 * their own buffer; past 128 tokens at head_dim 128 (176 at 64) that does
 * not fit beside the tiles, and such blocks are walked in chunks
 * (plan_backward_chunked).
 * `ctas` 0 takes as many CTAs per SM as shared memory and registers allow,
 * at most 4, with at most `sm_warps` warps per SM: 16 leaves a thread 128
 * registers, 8 leaves 255. */
bool ag_plan_backward_shape(const ag_plan *plan, int heads_per_tile, int stages, int ctas,
                            int sm_warps, ag_plan_bwd *b) {
  const int block = plan->block_size, dim = plan->head_dim, eb = plan->elem_bytes;
  const int tile_bytes = 4 * block * dim * eb * heads_per_tile; /* Q, K, V, dO */
  const int ps_bytes = 2 * heads_per_tile * block * p_stride(block) * eb; /* P and dS */
  const int jobs = heads_per_tile * block / 16;
  const bool overlay = p_stride(block) <= dim && block <= 64; /* P, dS: <= 32 registers */
  const int table_bytes = b->table_global ? 0 : plan->rotary_table_bytes;
  const int smem = stages * (tile_bytes + table_bytes) + (overlay ? 0 : ps_bytes);
  const int warps = overlay || jobs < MAX_WARPS ? jobs : MAX_WARPS;
  if (stages < 1 || smem > MAX_SMEM_BYTES) return false;
  if (!ctas)
    for (ctas = 4; ctas > 1 && (ctas * smem > MAX_SMEM_BYTES || ctas * warps > sm_warps);)
      ctas--;
  if (ctas * smem > MAX_SMEM_BYTES || (ctas > 1 && ctas * warps > sm_warps)) return false;
  b->heads_per_tile = heads_per_tile;
  b->stages = stages;
  b->pds_overlay = overlay;
  /* One warpgroup on 64-row tiles of one head, stored as 64-column halves
   * of 128-byte rows: the layout wgmma reads in its 128-byte swizzle
   * (templates/wgmma_sm90.cuh). */
  b->wgmma = overlay && block == 64 && (dim == 64 || dim == 128) && heads_per_tile == 1;
  /* The store staging rows, where they hold whole rows (head_dim 64) and
   * cost no CTA. At head_dim 128 each store takes two turns through them,
   * the second waiting for the first's copies: 1.837 ms against 1.76 with
   * the shuffles at L = 1024 (bench/NOTES.md). */
  const int staging = warps * staging_bytes(eb);
  b->bulk_store = dim * heads_per_tile == 64 && ctas * (smem + staging) <= MAX_SMEM_BYTES;
  b->smem_bytes = smem + (b->bulk_store ? staging : 0);
  b->min_ctas_per_sm = ctas;
  b->jobs = jobs;
  b->warps = warps;
  b->threads = 32 * warps;
  b->items_per_cta = 8;
  return true;
}

/* A block too large to keep whole beside its P and dS (past 128 tokens at
 * head_dim 128, 176 at 64): templates/block_bwd_chunked.cu walks it in
 * 64-row chunks: a chunk of two tensors resident and two of the other two,
 * one computed while the next loads, with three floats of softmax
 * statistics per query row of every chunk (a partial last chunk's rows
 * past the block too). Four warps, launch-bounded for two CTAs per SM,
 * which leaves a thread all 255 registers (the key sweep holds dK and dV,
 * 128 floats at head_dim 128). Rotary embeddings cost no memory: each chunk
 * is rotated in place as it lands, and a rotary table is read where it is
 * (a chunk's rows of it beside the six chunks would leave one CTA per SM at
 * head_dim 128). */
static void plan_backward_chunked(const ag_plan *plan, ag_plan_bwd *b) {
  enum { CHUNK = 64 };
  b->warps = 4;
  b->threads = 128;
  b->heads_per_tile = 1;
  b->jobs = b->warps;
  b->stages = 1;
  const int stat_rows = (plan->block_size + CHUNK - 1) / CHUNK * CHUNK;
  b->smem_bytes = 6 * CHUNK * plan->head_dim * plan->elem_bytes + 3 * 4 * stat_rows;
  b->min_ctas_per_sm = 2;
  b->items_per_cta = 2;
  b->key_chunks = true;
}

/* One head per tile (on the H200 two heads were 10-15% slower,
 * bench/NOTES.md), with 128 registers a thread or, with rotary embeddings
 * (their angles and the rotation back of dQ, dK, dV need more), 255 (170
 * at head_dim 64, blocks up to 64, with the choice bwd_rotary_12_warps). Two
 * stages where three CTAs of two still fit (head_dim 64: 2% faster than
 * four CTAs of one), else one stage and the most CTAs that fit (head_dim
 * 128: three), and a second stage where it costs no CTA. A block that fits
 * in none (rotary or not) is walked in chunks. */
static void plan_backward(const ag_spec *spec, ag_plan_block_choices choices, ag_plan *out) {
  ag_plan_bwd one, two; /* zeroed whole, so the plan compares bytewise (tests do) */
  memset(&one, 0, sizeof one);
  memset(&two, 0, sizeof two);
  const bool rotary = spec->rotary.layout != AG_ROTARY_NONE;
  /* (neither for sm_80, whose 164 KiB per SM holds no third CTA) */
  const bool sm80 = spec->arch == AG_ARCH_SM80;
  const bool table_global = choices.bwd_table_global && !sm80 && out->takes_table &&
                            spec->head_dim == 128 && spec->block_size == 64 &&
                            spec->rotary.layout == AG_ROTARY_INTERLEAVED &&
                            spec->rotary.apply_to == (AG_APPLY_Q | AG_APPLY_K);
  one.table_global = two.table_global = table_global;
  const int sm_warps = !rotary ? 2 * MAX_WARPS
                       : table_global || (choices.bwd_rotary_12_warps && !sm80 &&
                                          spec->head_dim == 64 && spec->block_size <= 64)
                           ? 12
                           : MAX_WARPS;
  const ag_plan_bwd *pick;
  if (ag_plan_backward_shape(out, 1, 2, 0, sm_warps, &two) && two.min_ctas_per_sm >= 3) {
    pick = &two;
  } else if (ag_plan_backward_shape(out, 1, 1, 0, sm_warps, &one)) {
    pick = ag_plan_backward_shape(out, 1, 2, one.min_ctas_per_sm, sm_warps, &two) ? &two : &one;
  } else {
    memset(&one, 0, sizeof one);
    plan_backward_chunked(out, &one);
    pick = &one;
  }
  memcpy(&out->bwd, pick, sizeof out->bwd);
  if (spec->arch == AG_ARCH_SM80) { /* never compiled for sm_90 */
    out->bwd.wgmma = false;
    if (out->bwd.bulk_store) out->bwd.smem_bytes -= out->bwd.warps * staging_bytes(out->elem_bytes);
    out->bwd.bulk_store = false;
  }
  /* the wgmma kernels only: in the mma.sync code dQ's accumulators live
   * across the barrier would cost spills (the template keeps the early
   * order there) */
  out->bwd.late_dq = choices.bwd_late_dq && out->bwd.wgmma && spec->head_dim == 128 &&
                     (spec->rotary.apply_to & AG_APPLY_Q) && rotary &&
                     spec->rotary.layout == AG_ROTARY_INTERLEAVED;
  /* the table's rows in the stages: kept for the same block's next head group */
  out->bwd.table_reuse = choices.table_reuse && out->takes_table && !out->bwd.key_chunks &&
                         !out->bwd.table_global;
}

/* The layouts ag_plan_block takes, each on once it has run on a GPU; the
 * comment above each says what was checked (ag_plan_block_with takes
 * others, for tests). */
static const ag_plan_block_choices block_checked = {
    /* The forward's rotary table rows in one slot after the stages, loaded
     * for the next tile once the resident one is rotated (TABLE_SLOT), where
     * that fits a second CTA on an SM: at head_dim 128, 64-token blocks, two
     * stages of Q, K, V and a table slot each take 128 KiB (one CTA an SM, 4
     * warps), two stages and one slot 112 KiB (two). H200, 2026-12-05
     * (bench/NOTES.md, batch 1152, 4 heads, L 1024 / 4096): interleaved pairs
     * on q, k 1.475 / 5.800 ms -> 0.974 / 3.894, half pairs 1.444 / 5.650 ->
     * 0.968 / 3.993; GPU suite and compute-sanitizer clean. */
    .fwd_table_slot = true,
    /* The rotary backward at head_dim 64 and blocks of up to 64 tokens with
     * up to 12 warps an SM (170 registers a thread) instead of 8 (255): at 64-
     * token blocks computed positions then take the plain plan (two stages,
     * three CTAs) and a table one stage, three CTAs, instead of two stages, two
     * CTAs. ptxas (sm_90a, every layout, position kind, q k or q k v, causal or
     * not, bf16 and fp16, blocks 48 and 64): at most 16 bytes of spills (block
     * positions with V rotated; half pairs from a table on q, or q and k);
     * 80- and 96-token blocks would spill up to 56 bytes, so they keep 8
     * warps. Not for sm_80 specs. H200, 2026-12-05 (as above): a table
     * (interleaved, q, k) 1.167 / 4.417 ms -> 1.068 / 4.095; sequence
     * positions 0.964 / 3.806 -> 0.961 / 3.799 (the same within noise). */
    .bwd_rotary_12_warps = true,
    /* The rotary backward at head_dim 128, 64-token blocks, table positions,
     * interleaved pairs on q and k (Meta's layout): the table's rows read where
     * they are (TABLE_IN_GLOBAL, as the chunked backward reads them) instead
     * of 16 KiB in the stage, and up to 12 warps an SM: three CTAs of 64 KiB
     * and 168 registers instead of two of 80 KiB and 255. dK's products then
     * wait for dV's stores (SERIAL_KEY_GRADS, as with computed positions): ptxas spills
     * 32 bytes for sm_90a (12 for sm_80 code). Other layouts are left out: at
     * 168 registers half pairs on q and k spill 264-280 bytes and serialize
     * every wgmma (C7512), interleaved pairs on q, k, v serialize them too, q
     * alone spills 172 bytes; 32-token blocks would lose a CTA. Correct on
     * the H200 (GPU suite, compute-sanitizer) but slower, 2026-12-05: 2.905 /
     * 11.747 ms at L 1024 / 4096 against 1.858 / 7.416 with the table rows
     * staged (bwd_late_dq on both): the rows' global reads in the rotations
     * cost more than the third CTA gains. Off. */
    .bwd_table_global = false,
    /* The rotary backward with Q rotated and P, dS in K's and V's place: dQ's
     * products issued in phase 1 as before, but its rotation back and store
     * after the barrier and P and dS's stores (LATE_DQ), so P and dS (32
     * registers) are no longer live through the rotation. At head_dim 128 with
     * interleaved pairs ptxas serialized the kernel's wgmma (C7511) with every
     * position kind (and spilled 60 bytes with computed ones); in this order
     * it does neither, at 195-254 registers, half pairs too (ptxas, sm_90a,
     * 64-token blocks, q; q, k; q, k, v). The wgmma kernels at head_dim 128
     * only: at 64 nothing is serialized, and in the mma.sync code (sm_80, and
     * blocks under 64 tokens) dQ's accumulators held across the barrier spill
     * up to 136 bytes (a review's sweep), so that code keeps the early order.
     * Interleaved pairs only: H200, 2026-12-05 (batch 1152, 4 heads, L 1024 /
     * 4096), a table on q, k 2.102 / 8.153 ms -> 1.858 / 7.416, sequence
     * positions 2.267 / 8.737 -> 1.872 / 7.508; half pairs from a table, which
     * the early order does not serialize, 1.853 / 7.372 -> 1.886 / 7.440, so
     * they keep it. Checked on the H200 on 2026-12-05 (session 26,
     * tools/next_gpu_call_block.sh, with this choice alone beside the tree's):
     * the GPU suite's rotary case (29 checks, float64) and compute-sanitizer
     * memcheck and racecheck on specs/ads_block64_d128_rope.yaml (0 errors, 0
     * hazards); timed again, a table on q, k 2.102 / 8.115 ms -> 1.854 /
     * 7.414, sequence positions 2.256 / 8.693 -> 1.863 / 7.428. On. */
    .bwd_late_dq = true,

    /* The rotary forward at head_dim 64 (two heads a tile) with two stages
     * and two CTAs an SM instead of one stage and four: the plain forward's
     * tuning (one stage, measured 3% faster) leaves a CTA nothing in flight
     * while it rotates its tile in place, and on the H200 (2026-12-05, batch
     * 1152, 4 heads, L 1024) the rotary forward took 0.474 ms with a table and
     * 0.464 with sequence positions against the plain one's 0.395, where the
     * table adds 6% to the bytes. With two stages the next tile loads while
     * this one is rotated. 114,688 bytes with a table (98,304 without), 4
     * warps of at most 255 registers. Not for sm_80 specs (164 KiB an SM: one
     * such CTA). Written 2026-12-05 (session 23) after the device time ran
     * out. Correct on the H200 (session 26: the GPU suite's rotary case, and
     * compute-sanitizer on a head_dim 64 table spec) but slower at every
     * size: a table 0.476 / 1.875 ms -> 0.536 / 2.199 (L 1024 / 4096),
     * sequence positions 0.465 / 1.778 -> 0.548 / 2.031: four CTAs of one
     * stage hide the rotation better than two of two. Off. */
    .fwd_rotary_2_stages = false,

    /* A block's rotary table rows loaded once for all its head groups, in
     * both passes (TABLE_REUSE): the walk hands a CTA a block's head groups
     * one after another (the item number's head group varies fastest), and
     * every head group of a block rotates with the same rows, so a tile whose
     * block is the last tile's keeps the rows already in the slot (the
     * forward's TABLE_SLOT) or in the stage it refills (the last tile used
     * that stage; TABLE_STAGED) instead of loading them again. With 4 heads
     * of 128 a table row is a quarter of a token's Q row, so reading it per
     * head adds 25% to the forward's bytes and 14% to the backward's; once
     * per block, 6% and 4%. The H200 measured about that (2026-12-05, batch
     * 1152, 4 heads, L 1024): the table forward 0.973 ms against the plain
     * 0.773 (+26%), the backward 1.854 against 1.633 (+14%), though L2 may
     * already serve the later heads' reads. Checked on an H100 on
     * 2026-12-05 (session 27; bench/results/2026-12-05-h100-table-reuse-*:
     * the GPU suite's rotary case, memcheck and racecheck on a slot and a
     * stages spec): faster on every table spec, e.g. head_dim 128 L 4096
     * backward 9.037 -> 8.701 ms, head_dim 64 forward 2.383 -> 2.303; specs
     * without a table unchanged. */
    .table_reuse = true,
};

ag_plan_block_choices ag_plan_block_checked(void) { return block_checked; }

ag_status ag_plan_block(const ag_spec *spec, ag_plan *out, ag_error *err) {
  return ag_plan_block_with(spec, ag_plan_block_checked(), out, err);
}

ag_status ag_plan_block_with(const ag_spec *spec, ag_plan_block_choices choices, ag_plan *out,
                             ag_error *err) {
  memset(out, 0, sizeof *out);
  if (spec->block_size < 16 || spec->block_size > 256 || spec->block_size % 16 ||
      (spec->head_dim != 64 && spec->head_dim != 128))
    return ag_fail(err, AG_ERR_SPEC, "spec '%s' was not validated", spec->name);

  out->pattern = AG_PATTERN_BLOCK_DIAGONAL;
  out->block_size = spec->block_size;
  out->head_dim = spec->head_dim;
  out->elem_bytes = 2;
  out->scale = ag_spec_scale(spec);
  ag_status st = ag_plan_rotary(spec, out, err);
  if (st != AG_OK) return st;
  /* Rotary embeddings rotate the tiles in shared memory, so they cost no
   * memory of their own, except with positions from a table: then each
   * stage also holds the table's rows for the tile's tokens (the forward's
   * may share one slot, TABLE_SLOT; the backward may read them in global
   * memory, TABLE_IN_GLOBAL). */
  if (out->takes_table)
    out->rotary_table_bytes = spec->block_size * spec->head_dim * out->elem_bytes;
  /* Each tensor's row stride as a kernel parameter (ROW_STRIDES: an int a
   * tensor after the sizes, then kv_heads) where the spec asks
   * (`row_strides: true`), instead of heads * head_dim: q, k and v may then
   * be column slices of one projection output ([tokens, 3 heads head_dim],
   * Meta's qkv layout), dq, dk, dv slices of one gradient buffer, and K, V
   * may have fewer heads than Q (grouped-query attention, as Meta's
   * tlx_block_attention: query head h reads key head h / (heads /
   * kv_heads), each tile's K and V rows loaded per head from its key head;
   * the backward writes dK and dV per query head and the caller sums each
   * group). In both passes or neither; not with the chunked backward
   * (blocks that fit no whole-block plan: past 128 tokens at head_dim 128,
   * 176 at 64 without rotary embeddings, from 176 with a table), whose
   * streamed pairs share one stride.
   * A spec's choice, not the plan's, because it costs the packed layout:
   * H200, 2026-12-05, the harness's backward at head_dim 128 with packed
   * strides ran +2.0-2.1% slower than the packed kernels over four runs
   * (1.615 -> 1.649, 6.316 -> 6.448 ms at L 1024 / 4096; forward and head
   * dim 64 within -1.6..+0.4%), while views of one qkv through autograd
   * took 6.52 ms copied against 2.45 read in place (contiguous 2.41), and
   * grouped heads (H/2) 7.39 repeated against 3.95 (D128 L1024,
   * bench/layouts_bench.py). ptxas (sm_90a and sm_80, every block golden
   * and bundled spec): the same registers within 11 (kv_heads then moved
   * them by -7..+14) and no new spill but
   * the sm_80 causal forward at head_dim 64 (12 bytes) and the head_dim 128
   * backward with interleaved pairs and block positions (92 against 20).
   * These kernels ran on the H200 on 2026-12-05 against float64 and bit for
   * bit against packed and repeated-head runs, under memcheck and racecheck
   * (tools/next_gpu_call_strides.sh; bench/results/2026-12-05-h200-gpu-
   * strides.log, -row-strides-*). */
  out->row_strides = spec->row_strides;
  if (spec->passes & AG_PASS_BACKWARD) {
    plan_backward(spec, choices, out);
    if (out->bwd.key_chunks && spec->row_strides)
      return ag_plan_refuse(out, AG_REFUSED_ROW_STRIDES, err,
                            "row_strides with the backward of %d-token blocks at head_dim %d "
                            "(a block that large is walked in 64-row chunks, whose kernels "
                            "read packed rows only)",
                            spec->block_size, spec->head_dim);
    if (!(spec->passes & AG_PASS_FORWARD)) return AG_OK;
  }
  /* Two adjacent heads per tile at head_dim 64, so each tile row is 256
   * contiguous bytes as at head_dim 128: on the H200, 64-token blocks at
   * head_dim 64 reached 85-89% of copy bandwidth one head at a time and
   * 93-100% two at a time (bench/NOTES.md). Only where two CTAs of two such
   * tiles each still fit on an SM. */
  int row_bytes = spec->head_dim * out->elem_bytes;
  int tile_bytes = 3 * spec->block_size * row_bytes; /* Q, K, V of one head */
  int table = out->rotary_table_bytes;               /* a stage's (or the slot's), any heads */
  ag_plan_block_fwd *f = &out->fwd;
  f->heads_per_tile =
      row_bytes < 256 && 2 * 2 * (2 * tile_bytes + table) <= MAX_SMEM_BYTES ? 2 : 1;
  /* One warp per 16 query rows, up to 8 warps; more jobs (heads, larger
   * blocks) are taken in turn, so S and O of one job fit in registers. */
  int row_tiles = spec->block_size / 16;
  f->warps = row_tiles < MAX_WARPS ? row_tiles : MAX_WARPS;
  int jobs = row_tiles * f->heads_per_tile;
  f->jobs_per_warp = (jobs + f->warps - 1) / f->warps; /* the last round may be partial */
  f->threads = f->warps * 32;
  /* Two tiles resident per CTA (load the next while computing this one)
   * when they fit (a 256x128 block needs 192 KiB for one), registers
   * capped so that two such CTAs share an SM, and one CTA per 4 tiles
   * rather than a persistent grid: the hardware then balances CTAs across
   * SMs, which measured 3-5% faster than static ranges, and fewer tiles
   * per CTA shorten the last wave: 4 measured 1% faster than 8 at head_dim
   * 128, 64-token blocks (bench/NOTES.md). */
  int stage_bytes = f->heads_per_tile * tile_bytes + table;
  if (stage_bytes > MAX_SMEM_BYTES)
    return ag_plan_refuse(out, AG_REFUSED_ROTARY, err,
                          "rotary positions from a table at block_size %d with head_dim %d (Q, K, "
                          "V and the table's rows of one block need %d KiB of shared memory; a "
                          "CTA has 227)",
                          spec->block_size, spec->head_dim, (stage_bytes + 1023) / 1024);
  f->stages = 2 * stage_bytes <= MAX_SMEM_BYTES ? 2 : 1;
  f->smem_bytes = f->stages * stage_bytes;
  /* One table slot for both stages where that earns a second CTA (not on
   * sm_80, whose 164 KiB an SM holds one CTA either way). */
  const int slot_bytes = 2 * (stage_bytes - table) + table;
  if (choices.fwd_table_slot && spec->arch != AG_ARCH_SM80 && table && f->stages == 2 &&
      f->warps <= 4 &&
      2 * f->smem_bytes > MAX_SMEM_BYTES && 2 * slot_bytes <= MAX_SMEM_BYTES) {
    f->table_slot = true;
    f->smem_bytes = slot_bytes;
  }
  /* The register cap for two CTAs per SM only for CTAs of up to 4 warps:
   * with 8 warps it would be 128 registers, and the 128-token tiles spill. */
  f->min_ctas_per_sm = f->warps <= 4 && 2 * f->smem_bytes <= MAX_SMEM_BYTES ? 2 : 1;
  f->items_per_cta = 4;
  /* Two heads of 64-token blocks: one tile per CTA, four CTAs per SM and
   * one CTA per 2 tiles measured 3% faster at L = 1024 than two tiles per
   * CTA, two CTAs and 8 tiles, and 1% faster than one CTA per 4 tiles
   * (bench/NOTES.md, tunings of 2026-11-29 and 2026-11-30). */
  if (f->heads_per_tile == 2 && f->warps == 4 && 4 * stage_bytes <= MAX_SMEM_BYTES &&
      !(choices.fwd_rotary_2_stages && spec->rotary.layout != AG_ROTARY_NONE &&
        spec->arch != AG_ARCH_SM80)) {
    f->stages = 1;
    f->table_slot = false;
    f->smem_bytes = stage_bytes;
    f->min_ctas_per_sm = 4;
    f->items_per_cta = 2;
  }
  f->table_reuse = choices.table_reuse && table > 0; /* rows in the slot or the stages */
  return AG_OK;
}

/* The kernels of the shapes: the forward (block_fwd.cu) before the
 * backward (block_bwd.cu, or block_bwd_chunked.cu for blocks walked in
 * chunks), which after a forward in the same source reuses its device
 * helpers and keeps its own names in namespace bwd. */
/* What both block kernels share: the walk, the launch shape, the
 * parameters (the pass's tensors, the rotary table when taken, then the
 * offsets and sizes) and the shape constants. */
typedef struct block_shape {
  int warps, threads, heads_per_tile, stages, smem_bytes, min_ctas_per_sm, items_per_cta;
} block_shape;

static ag_plan_kernel *block_kernel(const ag_spec *spec, ag_plan *plan, unsigned pass,
                                    const char *template_file, const block_shape *b,
                                    const ag_param *tensors, int ntensors) {
  char name[AG_KERNEL_NAME_MAX];
  kernel_name(name, spec, pass == AG_PASS_FORWARD ? "fwd" : "bwd");
  ag_plan_kernel *k = ag_plan_add_kernel(spec, plan, pass, name, template_file);
  k->walk = (ag_walk){AG_WALK_BLOCK, plan->block_size, b->heads_per_tile, b->items_per_cta, false};
  k->threads = b->threads;
  k->smem_bytes = b->smem_bytes;
  k->min_ctas_per_sm = b->min_ctas_per_sm;
  ag_param params[AG_PLAN_MAX_PARAMS];
  int n = 0;
  for (int i = 0; i < ntensors; i++) params[n++] = tensors[i];
  if (plan->takes_table) params[n++] = AG_PARAM_ROTARY_TABLE;
  static const ag_param sizes[] = {AG_PARAM_OFFSETS_Q, AG_PARAM_BATCH, AG_PARAM_HEADS,
                                   AG_PARAM_TOTAL_Q, AG_PARAM_ITEMS};
  for (int i = 0; i < 5; i++) params[n++] = sizes[i];
  if (plan->row_strides) {
    for (int i = 0; i < ntensors; i++) params[n++] = (ag_param)(AG_PARAM_STRIDE_Q + tensors[i]);
    params[n++] = AG_PARAM_KV_HEADS; /* grouped-query heads: K, V read by key head */
  }
  ag_plan_params(k, n, params);
  ag_plan_set(k, "BLOCK_SIZE", plan->block_size);
  ag_plan_set(k, "WARPS", b->warps);
  ag_plan_set(k, "HEADS_PER_TILE", b->heads_per_tile);
  ag_plan_set(k, "STAGES", b->stages);
  ag_plan_set(k, "MIN_CTAS", b->min_ctas_per_sm);
  ag_plan_set(k, "SMEM_BYTES", b->smem_bytes);
  ag_plan_set(k, "ROW_STRIDES", plan->row_strides);
  return k;
}

void ag_plan_block_kernels(const ag_spec *spec, ag_plan *plan) {
  const bool rotary = spec->rotary.layout != AG_ROTARY_NONE;
  const bool fwd = plan->fwd.threads > 0, bwd = plan->bwd.threads > 0;
  if (fwd) {
    const ag_plan_block_fwd *f = &plan->fwd;
    const block_shape b = {f->warps, f->threads, f->heads_per_tile, f->stages, f->smem_bytes,
                           f->min_ctas_per_sm, f->items_per_cta};
    static const ag_param tensors[] = {AG_PARAM_Q, AG_PARAM_K, AG_PARAM_V, AG_PARAM_O};
    ag_plan_kernel *k =
        block_kernel(spec, plan, AG_PASS_FORWARD, "block_fwd.cu", &b, tensors, 4);
    ag_plan_set(k, "JOBS_PER_WARP", f->jobs_per_warp);
    ag_plan_set(k, "SPLIT_ROWS", 0);
    ag_plan_set(k, "ROTARY_UNPACK", 1);
    ag_plan_set(k, "ROTARY_GRADS", 0);
    ag_plan_set(k, "ROTARY_CHUNKS", 0);
    ag_plan_set(k, "ROTARY_STAGES", rotary);
    ag_plan_set(k, "TABLE_SLOT", f->table_slot);
    ag_plan_set(k, "TABLE_REUSE", f->table_reuse);
    ag_plan_set(k, "TABLE_IN_GLOBAL", 0);
  }
  if (bwd) {
    const ag_plan_bwd *p = &plan->bwd;
    const block_shape b = {p->warps, p->threads, p->heads_per_tile, p->stages, p->smem_bytes,
                           p->min_ctas_per_sm, p->items_per_cta};
    static const ag_param tensors[] = {AG_PARAM_Q,  AG_PARAM_K,  AG_PARAM_V, AG_PARAM_DOUT,
                                       AG_PARAM_DQ, AG_PARAM_DK, AG_PARAM_DV};
    ag_plan_kernel *k =
        block_kernel(spec, plan, AG_PASS_BACKWARD,
                     p->key_chunks ? "block_bwd_chunked.cu" : "block_bwd.cu", &b, tensors, 7);
    ag_plan_set(k, "OWN_HELPERS", !fwd);
    ag_plan_set(k, "IN_NAMESPACE", fwd);
    ag_plan_set(k, "PDS_OVERLAY", p->pds_overlay);
    ag_plan_set(k, "WGMMA", p->wgmma);
    ag_plan_set(k, "BULK_STORE", p->bulk_store);
    /* wgmma on rows of 256 bytes: each tile as two 128-byte halves */
    ag_plan_set(k, "SPLIT_ROWS", p->wgmma && plan->head_dim > 64);
    /* bf16 folds the softmax scale into dS; fp16 applies it to dQ and dK
     * at the store, so small dS values do not sink into its subnormals */
    ag_plan_set(k, "SCALE_IN_DS", spec->dtype == AG_DTYPE_BF16);
    /* phase 2 unrotating with computed sines, or with the table's rows read
     * in global memory, holds one accumulator */
    ag_plan_set(k, "SERIAL_KEY_GRADS",
                p->wgmma && plan->head_dim > 64 && rotary &&
                    (spec->rotary.positions != AG_POSITIONS_TABLE || p->table_global) &&
                    (spec->rotary.apply_to & (AG_APPLY_K | AG_APPLY_V)));
    ag_plan_set(k, "ROTARY_UNPACK", 0);
    ag_plan_set(k, "ROTARY_GRADS", 1);
    ag_plan_set(k, "ROTARY_CHUNKS", rotary && p->key_chunks);
    ag_plan_set(k, "ROTARY_STAGES", rotary && !p->key_chunks);
    ag_plan_set(k, "TABLE_SLOT", 0);
    ag_plan_set(k, "LATE_DQ", p->late_dq);
    ag_plan_set(k, "TABLE_IN_GLOBAL", p->key_chunks || p->table_global);
    ag_plan_set(k, "TABLE_STAGED", plan->takes_table && !p->key_chunks && !p->table_global);
    ag_plan_set(k, "TABLE_REUSE", p->table_reuse);
  }
}

/* The register cap and the grid rule of a kernel, one line each. */
static void describe_launch(ag_buf *b, const char *prefix, const char *indent, int min_ctas,
                            int items_per_cta) {
  if (min_ctas > 1)
    ag_buf_printf(b, "%s%sregisters capped for %d CTAs per SM\n", prefix, indent, min_ctas);
  if (items_per_cta)
    ag_buf_printf(b, "%s%sgrid: one CTA per %d (block, head group) tiles\n", prefix, indent,
                  items_per_cta);
  else
    ag_buf_printf(b, "%s%sgrid: persistent, as many CTAs as fit on the device at once\n", prefix,
                  indent);
}

static void describe_backward(ag_buf *b, const ag_plan_bwd *p, const char *name,
                              int table_bytes, const char *prefix) {
  ag_buf_printf(b, "%sbackward kernel: %s\n", prefix, name);
  if (p->key_chunks) {
    ag_buf_printf(b, "%s  heads per tile: 1, the block walked in 64-row chunks\n", prefix);
    ag_buf_printf(b, "%s  threads: %d (%d warps, 16 rows of a chunk each)\n", prefix, p->threads,
                  p->warps);
    ag_buf_printf(b,
                  "%s  shared memory: %d bytes (six 64-row chunks: one of each of two "
                  "tensors, two of each of the other two; each query row's softmax "
                  "statistics)\n",
                  prefix, p->smem_bytes);
    if (table_bytes)
      ag_buf_printf(b, "%s  rotary table: read in global memory (no rows of it in shared "
                       "memory)\n", prefix);
    ag_buf_printf(b, "%s  launch bound: %d CTAs per SM (255 registers a thread)\n", prefix,
                  p->min_ctas_per_sm);
    ag_buf_printf(b, "%s  grid: one CTA per %d (block, head) tiles\n", prefix, p->items_per_cta);
    return;
  }
  ag_buf_printf(b, "%s  heads per tile: %d\n", prefix, p->heads_per_tile);
  ag_buf_printf(b, "%s  threads: %d (%d warps; %d (head, 16-row tile) job%s per phase)\n", prefix,
                p->threads, p->warps, p->jobs, p->jobs > 1 ? "s" : "");
  ag_buf_printf(b, "%s  Q, K, V, dO tiles resident per CTA: %d\n", prefix, p->stages);
  const char *pds =
      p->pds_overlay ? "P and dS take K's and V's place" : "with P and dS of one tile";
  if (p->wgmma)
    ag_buf_printf(b, "%s  matrix products: wgmma (one warpgroup) on sm_90a, else mma.sync\n",
                  prefix);
  if (table_bytes && !p->table_global)
    ag_buf_printf(b,
                  "%s  shared memory: %d bytes (%s; each stage holds %d bytes of rotary table "
                  "rows)\n",
                  prefix, p->smem_bytes, pds, table_bytes);
  else
    ag_buf_printf(b, "%s  shared memory: %d bytes (%s)\n", prefix, p->smem_bytes, pds);
  if (table_bytes && p->table_global)
    ag_buf_printf(b, "%s  rotary table: read in global memory (no rows of it in shared "
                     "memory)\n", prefix);
  if (p->bulk_store)
    ag_buf_printf(b,
                  "%s  gradient stores: through %d bytes of staging rows per warp, bulk copies "
                  "on sm_90\n",
                  prefix, staging_bytes(2));
  describe_launch(b, prefix, "  ", p->min_ctas_per_sm, p->items_per_cta);
}

void ag_plan_block_describe(const ag_plan *plan, const char *prefix, ag_buf *b) {
  const ag_plan_kernel *fk = ag_plan_kernel_for(plan, AG_PASS_FORWARD),
                       *bk = ag_plan_kernel_for(plan, AG_PASS_BACKWARD);
  const ag_plan_block_fwd *p = &plan->fwd;
  if (!fk) { /* backward only */
    if (bk) describe_backward(b, &plan->bwd, bk->name, plan->rotary_table_bytes, prefix);
    return;
  }
  ag_buf_printf(b, "%skernel: %s\n", prefix, fk->name);
  ag_buf_printf(b, "%sheads per tile: %d\n", prefix, p->heads_per_tile);
  ag_buf_printf(b, "%sthreads: %d (%d warps, %d job%s of 16 query rows each)\n", prefix,
                p->threads, p->warps, p->jobs_per_warp, p->jobs_per_warp > 1 ? "s" : "");
  ag_buf_printf(b, "%stiles resident per CTA: %d\n", prefix, p->stages);
  if (p->table_slot)
    ag_buf_printf(b,
                  "%sshared memory: %d bytes (the stages, then one slot of %d bytes of rotary "
                  "table rows: the next tile's, loaded once the resident tile is rotated)\n",
                  prefix, p->smem_bytes, plan->rotary_table_bytes);
  else if (plan->rotary_table_bytes)
    ag_buf_printf(b,
                  "%sshared memory: %d bytes (each stage holds %d bytes of rotary table rows)\n",
                  prefix, p->smem_bytes, plan->rotary_table_bytes);
  else
    ag_buf_printf(b, "%sshared memory: %d bytes\n", prefix, p->smem_bytes);
  describe_launch(b, prefix, "", p->min_ctas_per_sm, p->items_per_cta);
  if (bk) describe_backward(b, &plan->bwd, bk->name, plan->rotary_table_bytes, prefix);
}
