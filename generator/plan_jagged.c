// SPDX-License-Identifier: BSD-3-Clause
/* plan_jagged.c: the jagged pattern's planner (variable-length sequences
 * packed back to back, queries and keys with their own offsets): the tile
 * shapes of the forward (templates/jagged_fwd.cu) and of the backward's two
 * kernels (templates/jagged_bwd.cu), and the kernel descriptors made from
 * them. Every kernel takes one (virtual tile, head) per CTA
 * (templates/jagged_walk.cuh, runtime/walk_jagged.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "plan.h"

static const char *dtype_name(ag_dtype d) { return d == AG_DTYPE_FP16 ? "fp16" : "bf16"; }

/* "ag_<name>_d<dim>_<dtype>[_bq][_causal][_w<left>_<right>][_rope]_<pass>"
 * (_bq: broadcast queries; _rope: rotary embeddings). */
static void kernel_name(char *out, const ag_spec *spec, const char *pass) {
  char window[32] = "";
  if (spec->has_window)
    snprintf(window, sizeof window, "_w%d_%d", spec->window_left, spec->window_right);
  snprintf(out, AG_KERNEL_NAME_MAX, "ag_%s_d%d_%s%s%s%s%s_%s", spec->name, spec->head_dim,
           dtype_name(spec->dtype), spec->query == AG_QUERY_BROADCAST ? "_bq" : "",
           spec->causal ? "_causal" : "", window,
           spec->rotary.layout != AG_ROTARY_NONE ? "_rope" : "", pass);
}

/* Forward: a CTA owns 128 query rows of one head (4 warps of 32 rows, so
 * each K, V tile in shared memory feeds two 16-row tiles per warp), loads
 * them once and walks the key tiles of the band in tiles of 64 keys, two
 * stages in flight, two CTAs per SM. Shared memory: the Q tile (reused to
 * stage O) and the stages, (BLOCK_M + 2 * STAGES * BLOCK_N) * HEAD_DIM * 2
 * bytes. On the H200 (bf16, batch 1152, 4 heads, lengths uniform in [1,
 * L]) this measured fastest of the layouts tried at both head dims: 8
 * warps of 16 rows, 64-row tiles and 128-key tiles were slower
 * (tools/jagged_dev/fwd_notes.md). */
/* A forward's shared memory: `q_rows` rows of Q (its tiles) and `stages`
 * K, V tiles of `block_n` keys. */
static int forward_smem(const ag_plan *p, int q_rows, int stages, int block_n) {
  return (q_rows + 2 * stages * block_n) * p->head_dim * p->elem_bytes;
}

/* The dynamic shared memory a warp-specialized forward may take: the
 * SM's, less the kernel's static 1 KiB (barriers, alignment). */
enum { FWD_SMEM_LIMIT = AG_SMEM_MAX_SM90 - 1024 };

/* The most K, V stages, from `stages` down to 2, that fit FWD_SMEM_LIMIT
 * beside q_rows query rows (2 where none does). */
static int fitting_stages(const ag_plan *p, int q_rows, int stages, int block_n) {
  while (stages > 2 && forward_smem(p, q_rows, stages, block_n) > FWD_SMEM_LIMIT) stages--;
  return stages;
}

/* The forward's tile shape; shared memory holds the Q tile and `stages`
 * K, V tiles. */
static void set_forward(ag_plan *p, int block_m, int block_n, int warps, int stages,
                        int min_ctas) {
  ag_plan_jagged *j = &p->jagged;
  j->fwd_block_m = block_m;
  j->fwd_block_n = block_n;
  j->fwd_warps = warps;
  j->fwd_stages = stages;
  j->fwd_smem_bytes = forward_smem(p, block_m, stages, block_n);
  j->fwd_min_ctas = min_ctas;
  j->fwd_items = j->fwd_q_tiles = 1;
  j->fwd_table_rows = 0;
}

/* The forward variant for few query rows a sequence (at most max_rows):
 * its tile shape. */
static void set_small_forward(ag_plan *p, int max_rows, int block_m, int block_n, int warps,
                              int stages, int min_ctas) {
  ag_plan_jagged *j = &p->jagged;
  j->small_max_n_q = max_rows;
  j->small_block_m = block_m;
  j->small_block_n = block_n;
  j->small_warps = warps;
  j->small_stages = stages;
  j->small_smem_bytes = forward_smem(p, block_m, stages, block_n);
  j->small_min_ctas = min_ctas;
}

static void plan_forward(ag_plan *p) { set_forward(p, 128, 64, 4, 2, 2); }

/* The main sm_90a forward warp specialized (templates/jagged_fwd_ws.cu):
 * a loading warpgroup copies Q and a ring of three K/V stages (cp.async,
 * completion on mbarriers) while two computing warpgroups of 64 rows take
 * turns issuing S of a tile and the last tile's P V, each running S's
 * softmax under the products; the same tiles and shared memory, 384
 * threads. In the dev harness on the H200 (bf16, batch 1152, 4 heads,
 * lengths uniform in [1, L]) it ran 385 / 514 TFLOP/s at L 1024 / 4096
 * against the kernel below's 313 / 405 (causal 262 / 439 against 228 /
 * 367): bench/results/2026-12-03-h200-jagged-fwd-ws-harness.log. Not yet
 * with rotary embeddings (the kernel below rotates tiles in place). */
static void plan_forward_ws(ag_plan *p) {
  p->jagged.fwd_ws = true;
  set_forward(p, 128, 128, 12, 3, 1);
}

/* The warp-specialized forward with rotary embeddings from tables
 * (.sm90_fwd_ws_rotary): the loading warpgroup copies the table rows of
 * the tile it rotates next into a slot of its own beside its copies of
 * the tile, so that the rotation reads shared memory, not one L2 round
 * trip a row after another; the stages drop to what still fits (at head
 * dim 128 three -> two). */
static void plan_forward_ws_table(const ag_spec *spec, ag_plan *p) {
  ag_plan_jagged *j = &p->jagged;
  if (!j->fwd_ws || spec->rotary.layout == AG_ROTARY_NONE ||
      spec->rotary.positions != AG_POSITIONS_TABLE)
    return;
  j->fwd_table_rows = j->fwd_block_n;
  const int rows = j->fwd_block_m + j->fwd_table_rows;
  j->fwd_stages = fitting_stages(p, rows, j->fwd_stages, j->fwd_block_n);
  j->fwd_smem_bytes = forward_smem(p, rows, j->fwd_stages, j->fwd_block_n);
}

/* Head dim 64 on the warp-specialized forward, three computing warpgroups
 * (192-row query tiles): a 128-key tile's softmax there takes as many
 * exponentials (MUFU.EX2, 16 a clock an SM) as S has elements, about as
 * long as the warpgroup's two products take on the tensor cores, so two
 * warpgroups taking turns leave the tensor cores idle while both run
 * softmax; a third's products cover it (FlashAttention-3's and -4's tiles
 * at head dim 64). 160 registers a computing thread (512 threads: 65,536
 * over them, 32 to a loading one) hold one tile's state: no query tiles a
 * CTA after it (plan_forward_items), whose bookkeeping spills at 160 (ptxas,
 * session 34). As many K, V stages as shared memory holds, up to 6. Not
 * for windows, nor for a causal mask unless .sm90_fwd_ws192_causal says:
 * 192-row tiles compute more that the mask hides. */
static void plan_forward_ws192(ag_plan *p) {
  set_forward(p, 192, 128, 16, fitting_stages(p, 192, 6, 128), 1);
}

/* Head dim 64 with a causal mask: runs whose mean query length is at
 * least LONG_CAUSAL64_MEAN_ROWS take the 192-row tiles of
 * plan_forward_ws192 as a third variant (.sm90_fwd_long192_causal). On an
 * H100 (session 38, bench/results/2026-12-07-h100-l2-row64-s38.md; the
 * forward alone, ms, 128-row / 192-row tiles, lengths uniform in [lo,
 * hi]): [1, 1024] 0.970 / 1.160, [1, 2048] 1.492 / 1.576, [1024, 2048]
 * 2.332 / 2.439, [1, 3072] 1.801 / 1.790, [1536, 3072] 2.952 / 2.939, [1,
 * 4096] 2.223 / 2.124, [2048, 4096] 3.566 / 3.347: every run of mean 2,048
 * or more is as fast or faster on 192 rows, every run of mean 1,536 or
 * less as fast or faster on 128. */
enum { LONG_CAUSAL64_MEAN_ROWS = 2048 };
static void plan_forward_long192(ag_plan *p) {
  ag_plan_jagged *j = &p->jagged;
  j->long_fwd_min_rows = LONG_CAUSAL64_MEAN_ROWS;
  j->long_fwd_block_m = 192;
  j->long_fwd_warps = 16;
  j->long_fwd_stages = fitting_stages(p, 192, 6, j->fwd_block_n);
  j->long_fwd_smem_bytes = forward_smem(p, 192, j->long_fwd_stages, j->fwd_block_n);
}

/* The warp-specialized forward walking several query tiles a CTA
 * (choices.fwd_items): the loading warpgroup runs on into the next tile's
 * Q and K, V while the computing warpgroups end this one (its last P V,
 * the output's normalization and stores), and the CTA's start (barriers,
 * the first loads' latency) is paid once for them all. With two Q slots
 * the next tile's Q lands while this one runs; the K, V stages drop to
 * what shared memory still holds (at head dim 128, 3 -> 2). For broadcast
 * queries only with .bq_fwd_items: there it measured within +-2.3% of one
 * tile a CTA (bench/results/2026-12-06-h100-fwd-items-s33.md), when the
 * head-dim-64 forward still moved half again its bytes from DRAM. */
static void plan_forward_items(ag_plan *p, ag_plan_jagged_choices choices) {
  ag_plan_jagged *j = &p->jagged;
  const int hd = p->head_dim == 128;
  if (!j->fwd_ws || (j->broadcast && !choices.bq_fwd_items[hd]) || choices.fwd_items[hd] <= 1 ||
      j->fwd_block_m != 128)
    return;
  const int q_tiles = choices.fwd_q_tiles[hd] == 2 ? 2 : 1;
  const int q_rows = q_tiles * j->fwd_block_m + j->fwd_table_rows;
  const int stages = fitting_stages(p, q_rows, j->fwd_stages, j->fwd_block_n);
  const int bytes = forward_smem(p, q_rows, stages, j->fwd_block_n);
  if (bytes > FWD_SMEM_LIMIT) return; /* no room for the Q slots: one tile a CTA, as planned */
  j->fwd_items = choices.fwd_items[hd];
  j->fwd_q_tiles = q_tiles;
  j->fwd_stages = stages;
  j->fwd_smem_bytes = bytes;
}

/* Runs whose mean query length is at most SHORT_MEAN_ROWS take the short
 * variant of the forward where one is planned (plan_forward_ws64,
 * plan_forward_short). */
enum { SHORT_MEAN_ROWS = 384 };

/* Head dim 64 with a causal mask: runs whose mean query length is at most
 * CAUSAL64_MEAN_ROWS keep the mma.sync forward (plan_forward_ws64). In the
 * dev harness on the H200 (bf16, batch 1152, 4 heads, causal, lengths
 * uniform in [1, L], mean about L / 2), TFLOP/s of the warp-specialized
 * forward against the mma.sync one: L 1024 167 / 180, 1536 218 / 213,
 * 2048 254 / 233, 3072 305 / 257, 4096 340 / 272
 * (bench/results/2026-12-04-h200-jagged-fwd-d64-causal.log), hence 640
 * then. With 4 query tiles a CTA (.fwd_items) the warp-specialized one
 * won from a mean of 384 on an H100 80GB HBM3 (2026-12-06, session 34,
 * `tools/next_gpu_call_fwd_items.sh route`; ms, mma.sync / ws): L 1024
 * 1.0936 / 1.0132, 768 0.7770 / 0.7544, 512 0.4337 / 0.4563, 256 0.2026 /
 * 0.2472 (320 lies between the means measured, 256 and 384, and was not
 * itself timed); beside FlashAttention-4 at L 1024 (bench/jagged_bench.py,
 * same H100, two runs): 1.122 ms (FA4 1.434, 1.28x) / 1.051 ms (FA4
 * 1.446, 1.38x). */
enum { CAUSAL64_MEAN_ROWS = 320 };

/* Head dim 64 on sm_90a (not broadcast; rotary embeddings only with
 * .sm90_fwd_ws_rotary, and then no 192-row tiles): the warp-specialized
 * forward too, for runs whose mean query length passes
 * SHORT_MEAN_ROWS (with a causal mask CAUSAL64_MEAN_ROWS); shorter runs
 * keep the mma.sync forward's tiles (plan_forward below) as the short
 * variant. In the dev harness on
 * the H200 (bf16, batch 1152, 4 heads, lengths uniform in [1, L]) it ran
 * 255 / 382 TFLOP/s at L 1024 / 4096 against mma.sync's 244 / 296, while
 * causal it lost at L 1024 (167 against 181), and at spread 1.0 the
 * mma.sync forward was 0.98-1.01x FlashAttention-2 without the mask
 * (bench/results/2026-12-03-h200-jagged-d64-s1.md). */
static bool plan_forward_ws64(const ag_spec *spec, ag_plan *p, ag_plan_jagged_choices choices) {
  const bool rotary = spec->rotary.layout != AG_ROTARY_NONE;
  if (spec->arch != AG_ARCH_SM90A || p->head_dim != 64 || p->jagged.broadcast ||
      (spec->causal && !choices.sm90_ws64_causal) || (rotary && !choices.sm90_fwd_ws_rotary))
    return false;
  plan_forward_ws(p);
  plan_forward_ws_table(spec, p);
  /* 192-row tiles: three computing warpgroups, whose loading threads' 32
   * registers do not hold a rotation */
  const bool wide = choices.sm90_fwd_ws192 && !spec->has_window && !rotary;
  if (wide && (!spec->causal || choices.sm90_fwd_ws192_causal))
    plan_forward_ws192(p);
  else if (wide && choices.sm90_fwd_long192_causal && spec->causal)
    plan_forward_long192(p);
  set_small_forward(p, spec->causal ? CAUSAL64_MEAN_ROWS : SHORT_MEAN_ROWS, 128, 64, 4, 2, 2);
  return true;
}

/* Forward on sm_90a at head dim 128 (not broadcast): both products on
 * wgmma (templates/jagged_fwd_sm90.cu), two warpgroups of 64 query rows
 * sharing K, V tiles of 128 keys, three stages (229,376 bytes of shared
 * memory, one CTA an SM); each tile's P V runs on into the next tile's
 * barrier and S. On the H200 (bf16, batch 1152, 4 heads, lengths uniform
 * in [1, L]) it ran 313 / 408 TFLOP/s at L 1024 / 4096 against the
 * mma.sync forward's 280 / 321 (causal 230 / 369 against 208 / 287); tiles
 * of 64 keys were 2-5% slower. At head dim 64 it lost at L 1024 (221
 * against 245), so head dim 64 keeps the mma.sync forward. */
static bool plan_forward_sm90(const ag_spec *spec, ag_plan *p, ag_plan_jagged_choices choices) {
  /* With rotary embeddings only when sm90_rotary (see ag_plan_jagged_make);
   * broadcast queries only with them and bq_fwd_sm90_rotary (the others
   * take the warp-specialized forward, which does not rotate). */
  const bool rotary = spec->rotary.layout != AG_ROTARY_NONE;
  if (spec->arch != AG_ARCH_SM90A || p->head_dim != 128 || (rotary && !choices.sm90_rotary) ||
      (p->jagged.broadcast &&
       !(rotary && choices.bq_fwd_sm90_rotary && !choices.sm90_fwd_ws_rotary)))
    return false;
  p->jagged.fwd_sm90 = true;
  set_forward(p, 128, 128, 8, 3, 1);
  if (choices.sm90_ws && (!rotary || choices.sm90_fwd_ws_rotary)) {
    plan_forward_ws(p);
    plan_forward_ws_table(spec, p);
  }
  return true;
}

/* Short sequences on the sm_90a forward: with the tiles above one CTA an
 * SM (229,376 bytes) sits idle through every tile's prologue and
 * epilogue, which short sequences make most of the work. Runs whose mean
 * query length is at most SHORT_MEAN_ROWS take one warpgroup of 64 rows
 * and K/V tiles of 64 keys, three stages (114,688 bytes, two CTAs an SM).
 * Without rotary embeddings (not yet checked with these tiles). */
static void plan_forward_short(const ag_spec *spec, ag_plan *p) {
  if (!p->jagged.fwd_sm90 || spec->rotary.layout != AG_ROTARY_NONE) return;
  set_small_forward(p, SHORT_MEAN_ROWS, 64, 64, 4, p->jagged.fwd_stages, 2);
}

/* Broadcast queries: n_q is often small (candidate or learned queries, 1 to
 * 64), where 128-row tiles would compute mostly padding; runs of n_q <= 64
 * take 32-row tiles of 2 warps (three CTAs per SM at head_dim 128, a
 * sequence's keys read once per 32 queries, the rest from L2). */
static void plan_forward_small(ag_plan *p) {
  set_small_forward(p, 64, 32, 64, 2, 2, p->head_dim == 128 ? 3 : 4);
}

/* Broadcast queries on sm_90a: runs of n_q > 64 take the warp-specialized
 * forward (128 shared query rows a CTA, each sequence's keys streamed
 * once per 128 queries), where the mma.sync forward computed at 240-300
 * TFLOP/s under a memory floor (bench/RESULTS-broadcast.md); n_q <= 64
 * keeps the 32-row tiles (plan_forward_small). */
static bool plan_forward_ws_broadcast(const ag_spec *spec, ag_plan *p,
                                      ag_plan_jagged_choices choices) {
  if (spec->arch != AG_ARCH_SM90A || !p->jagged.broadcast ||
      (spec->rotary.layout != AG_ROTARY_NONE && !choices.sm90_fwd_ws_rotary))
    return false;
  plan_forward_ws(p);
  /* .sm90_bq_fwd_deep: six stages of 128 keys, 212,992 bytes */
  if (p->head_dim == 64 && choices.sm90_bq_fwd_deep) set_forward(p, 128, 128, 12, 6, 1);
  plan_forward_ws_table(spec, p);
  p->jagged.fwd_heads_inner = choices.bq_fwd_heads_inner;
  return true;
}

/* The one-pass broadcast backward's 32-row variant (n_q <= 32): its warps
 * at head_dim 64 and 128, 4 (each row group's keys split in 2 halves) or 8
 * (in 4 quarters), or 0 for none (n_q <= 32 then takes the 64-row kernel,
 * half of whose warps have no rows for S and dP and wait at the tile's
 * barrier: ncu on an H100, 2026-12-05, head_dim 128, n_q 32, showed 32% of
 * the stall samples at barriers, 12% occupancy, DRAM 54% busy). On that
 * H100 (bench/results/2026-12-05-h100-broadcast-m32.log, batch 1152, 4
 * heads, keys uniform in [0, L]), against the 64-row kernel: head_dim 128
 * with 4 warps 1.237 -> 1.202 ms at L 1024 (n_q 16: 1.207 -> 1.169), 4.155
 * -> 4.176 at 4096; with 8 warps (spilling 68 bytes) slower; head_dim 64
 * with 8 warps 0.675 -> 0.651 and 2.169 -> 2.161, with 4 slower (0.744).
 * The barrier wait moved elsewhere: the kernel waits on memory, one tile
 * ahead with two K, V slots. */
static const int bq_m32_warps_d64 = 8, bq_m32_warps_d128 = 4;
/* Its K, V stages: more tiles in flight. Run on an H100 (session 28,
 * tools/next_gpu_call_broadcast.sh; bench/results/
 * 2026-12-06-h100-broadcast-m32-stages.log), broadcast_bench n_q 32, s 0.5,
 * backward ms at L 1024 / 4096: head_dim 128 two stages (4 warps, two CTAs
 * an SM) 1.153 / 4.194, three or four (8 warps, one CTA) 1.515 / 5.004;
 * head_dim 64 2: 0.624 / 2.149, 3: 0.630 / 2.178, 4: 0.620 / 2.185. Correct
 * (the GPU suite's broadcast case, memcheck and racecheck) and no faster:
 * two stages stay. */
static const int bq_m32_stages_d64 = 2, bq_m32_stages_d128 = 2;
/* The 128-row variant on sm_90a (64 < n_q <= 128): the same walk and
 * workspace on wgmma (templates/broadcast_bwd_sm90.cu), two warpgroups of
 * 64 query rows and a key warpgroup, K, V slots as many as fit beside two
 * P, dS slots (3 at head dim 128: 225 KB; 4 at 64). The mma.sync kernel
 * ran these shapes at 155-205 TFLOP/s on the H200
 * (bench/RESULTS-broadcast.md), 0.66-1.18x the fastest peer. */
static const int bq_sm90_stages_d64 = 4, bq_sm90_stages_d128 = 3;
/* The key-stationary variant on sm_90a for n_q <= 64 (.bq_sm90_keys,
 * templates/broadcast_bwd_keys.cu): 128-key tiles, two computing
 * warpgroups of 64 keys and a loading one; K, V slots of 128 keys (64 KB
 * at head dim 128: two fit beside Q, two dO slots and two dS^T, 214,016
 * bytes; three at 64, 156,672). Its shared memory: Q and two dO slots of
 * 64 rows, the K, V slots, two dS^T of a tile, two floats a row a dO
 * slot. */
static const int bq_keys_stages_d64 = 3, bq_keys_stages_d128 = 2;
static int bq_keys_smem(int head_dim, int stages) {
  const int m = 64, n = 128, seq_stages = 2;
  return 2 * head_dim * m * (1 + seq_stages) + 4 * head_dim * n * stages + 4 * n * m +
         8 * seq_stages * m;
}

/* Broadcast queries, heads == kv_heads, n_q <= 32, 64 or 128: one kernel
 * in one pass (templates/broadcast_bwd.cu), every query of a head in one
 * CTA over a slab of sequences, 64-key tiles; dK and dV whole per key
 * tile, dQ in registers. 4 or 8 warps: one per 16-row group at 64 and 128
 * rows, at 32 rows the choices' (the groups' keys split between them).
 * Shared memory: Q, dO, the K, V slots (two, at 32 rows the choices'), P
 * and dS, two floats a row. */
static void plan_backward_fused(const ag_spec *spec, ag_plan *p, ag_plan_jagged_choices choices) {
  ag_plan_jagged *j = &p->jagged;
  /* Rotary embeddings: broadcast_bwd.cu rotates Q once a slab, each K (V)
   * tile as it lands and dK (dV) back in registers, a warp's columns of
   * them: only where each pair is in one warp (the interleaved layout, or
   * a warp holding every column: 16 * warps == 64 keys). The wgmma
   * kernel rotates with .bq_sm90_rotary where a 64-column part of dK
   * holds each pair (not the half layout at head dim 128); the 128-row
   * mma.sync one does, one CTA an SM
   * (at head dim 64 two would leave 128 registers a thread: ptxas spilled
   * 104 bytes with rotary; at 128 its shared memory allows one anyway).
   * The split kernels take the rest. */
  const bool rotary = spec->rotary.layout != AG_ROTARY_NONE;
  const int d = p->head_dim == 128;
  for (int i = 0, v = 0; i < AG_FUSED_VARIANTS; i++) {
    const int m = 32 << i, n = 64;
    if (m == 32 && choices.bq_m32_warps[d] == 0) continue;
    const bool sm90_rotary =
        choices.bq_sm90_rotary && (spec->rotary.layout != AG_ROTARY_HALF || !d);
    const bool sm90_kernel =
        choices.sm90_bq_bwd && spec->arch == AG_ARCH_SM90A && (!rotary || sm90_rotary);
    const int warps = m == 32 ? choices.bq_m32_warps[d] : m / 16; /* the mma.sync kernel's */
    if (rotary && spec->rotary.layout == AG_ROTARY_HALF && warps * 16 != n &&
        !(m == 128 && sm90_kernel))
      continue;
    if (m < 128 && sm90_kernel && choices.bq_sm90_small) continue;
    const bool keys = m < 128 && sm90_kernel && choices.bq_sm90_keys && !rotary;
    if (keys && m == 32) continue; /* n_q <= 32 on the 64-row keys kernel too */
    const bool sm90 = m == 128 && sm90_kernel;
    const int stages = keys        ? (d ? bq_keys_stages_d128 : bq_keys_stages_d64)
                       : m == 32 ? choices.bq_m32_stages[d]
                       : sm90    ? (d ? bq_sm90_stages_d128 : bq_sm90_stages_d64)
                                 : 2;
    /* sm90: two P, dS slots, so that the key warpgroup reads one while the
     * query warpgroups write the other */
    const int smem = keys ? bq_keys_smem(p->head_dim, stages)
                          : 4 * p->head_dim * (m + stages * n) + (sm90 ? 8 : 4) * m * n + 8 * m;
    j->fused_block_m[v] = m;
    j->fused_warps[v] = sm90 || keys ? 12 : warps;
    j->fused_stages[v] = stages;
    j->fused_smem_bytes[v] = smem;
    j->fused_sm90[v] = sm90;
    j->fused_keys[v] = keys;
    /* two CTAs an SM where their shared memory fits (1 KB each reserved;
     * at head_dim 128 not the 128-row kernel's; never the keys kernel's) */
    j->fused_min_ctas[v] = 2 * (smem + 1024) > AG_SMEM_MAX_SM90 || (rotary && m == 128) ? 1 : 2;
    v++;
  }
}

/* Backward: two kernels and no atomics, so it is deterministic by
 * construction: _dq (query-stationary: D = rowsum(dO * O) for its rows,
 * written for _dkv, then dQ over the key tiles of the band) and _dkv
 * (key-stationary: dK and dV over the group's heads and the query tiles
 * of the band). Tiles of 64 rows, 4 warps of 16 stationary rows each. */
static void plan_backward(ag_plan *p) {
  ag_plan_jagged *j = &p->jagged;
  j->bwd_block_m = j->bwd_block_n = 64;
  j->bwd_warps = 4;
  j->bwd_smem_dq = 4 * p->head_dim * (j->bwd_block_m + 2 * j->bwd_block_n) + 8 * j->bwd_block_m;
  j->bwd_smem_dkv = 4 * p->head_dim * (j->bwd_block_n + 2 * j->bwd_block_m) + 16 * j->bwd_block_m;
  j->bwd_min_ctas = 2;
  j->sum_threads = 256;
}

/* jagged_bwd_ws.cu on query steps of m rows: 128 keys a CTA (two
 * computing warpgroups and a loading one), two Q, dO stages, one CTA an
 * SM. Its shared memory (the template's static_assert): the K, V slots
 * (two at head dim 64, where the next tile's land during this one's last
 * steps: 231,424 bytes in all, the most a CTA may take beside its 1 KB of
 * static barriers; one at 128), the stages' Q and dO, two dS^T, the
 * stages' row floats, a warpgroup's 64 staging rows of 64 fp32 each. */
static ag_plan_jagged_kv ws_kv(int head_dim, int m) {
  const int n = 128, stages = 2, kv_slots = head_dim == 64 ? 2 : 1;
  return (ag_plan_jagged_kv){
      .block_m = m, .block_n = n, .threads = 128 + 128 * (n / 64),
      .smem_bytes = 4 * head_dim * (kv_slots * n + stages * m) + 4 * n * m + 8 * stages * m +
                    n * 64 * 4,
      .min_ctas = 1, .ws = true, .stages = stages};
}

/* The fast backward's _kv warp specialized (templates/jagged_bwd_ws.cu),
 * at head dim 128 and, without a mask, 64; no rotary embeddings: a
 * loading warpgroup copies K and V once a tile and streams Q, dO and the
 * row floats through two stages (cp.async completing on mbarriers), and
 * two computing warpgroups of 64 keys (128 keys a CTA, one CTA an SM)
 * work with no CTA barrier; they meet once a step, where dQ reads both
 * halves of dS^T (two dS^T buffers): at head dim 128 each adds its 64 of
 * dQ's columns for a step of 64 query rows; at head dim 64 a step has 128
 * query rows (S^T and dP^T as 64 x 128 products) and each adds the dQ of
 * its 64. The dQ accumulator is laid out in tiles, so that a step's dQ is
 * one bulk add a warpgroup. Persistent: a CTA an SM takes (key tile, kv
 * head) numbers from a counter in the workspace, which _pre zeroes
 * (AG_WALK_JAGGED_K_COUNTER). Shared memory: K, V, the stages, two dS^T,
 * the stages' row floats, the staging rows: 197,632 bytes at head dim
 * 128, 231,424 at 64 (two K, V slots). In the dev harness on the H200 (bf16, batch 1152, 4
 * heads, lengths uniform in [1, L], L 1024 / 4096) it ran 305 / 433
 * TFLOP/s at head dim 128 against jagged_bwd_sm90.cu's 244 / 329, 205 /
 * 362 causal against 181 / 295 (session 17's run); at head dim 64, 256 /
 * 368 against 222 / 271. Causal at head dim 64 it ran 151 / 280 in the
 * product against jagged_bwd_sm90.cu's 174 / 243 (a loss at L 1024), so
 * masked specs at head dim 64 keep jagged_bwd_sm90.cu
 * (bench/results/2026-12-03-h200-jagged-bwd-ws-persistent.log,
 * bench/results/2026-12-03-h200-jagged-ws-bwd-d64-steps128.md).
 * At head dim 128 with a mask, dV and dK run as one 64x128 product a
 * k-step (jagged_bwd_dkv_n128.cuh): in the dev harness on the H200 (as
 * above, three seeds) causal 219-225 TFLOP/s against 192-215 at L 1024,
 * 359-364 against 363-366 at L 4096; without a mask it lost (323-335
 * against 336-349 at L 1024), so unmasked specs keep two 64x64 products
 * (bench/results/2026-12-04-h200-jagged-bwd-ws-n128.log). */
static void plan_backward_ws(const ag_spec *spec, ag_plan *p, ag_plan_jagged_choices choices) {
  p->jagged.fast = ws_kv(p->head_dim, p->head_dim == 64 ? 128 : 64);
  p->jagged.fast.dkv_n128 = p->head_dim == 128 && (spec->causal || spec->has_window);
  p->jagged.fast.tma_qdo = choices.sm90_bwd_tma;
  /* dQ rounded in _kv (FUSED_DQ): two dQ warps of the loading warpgroup
   * count each tile's adds and round the tile whose count completes, from
   * a 16 KB buffer each (the room head dim 128 leaves: 230,400 bytes in
   * all; none at 64), so no _dq pass reads the whole accumulator back. By
   * the harness's split (bench/NOTES.md) _dq is up to 7% of the backward
   * at L 1024. */
  p->jagged.fast.fused_dq = choices.sm90_bwd_fused_dq && p->head_dim == 128 &&
                            p->jagged.fast.tma_qdo;
  if (p->jagged.fast.fused_dq) p->jagged.fast.smem_bytes += 2 * 64 * 64 * 4;
}

/* Head dim 64 with a mask: jagged_bwd_sm90.cu (three CTAs an SM of 64
 * keys, plan_backward_fast) for runs of very short sequences, and the
 * warp-specialized kernel above on 128-row steps for runs whose mean query
 * length passes 96. In the dev harness (bf16, batch 1152, 4 heads,
 * lengths uniform in [1, L], mean about L / 2), the warp-specialized one
 * against jagged_bwd_sm90.cu: on the H200 before either had the
 * column-range mask, causal TFLOP/s L 1024 156 / 176, 1536 193 / 203,
 * 2048 223 / 222, 3072 255 / 239, 4096 273 / 246
 * (bench/results/2026-12-04-h200-jagged-bwd-long-gpu-suite.log), so the
 * threshold was 1024. With the mask in both, on an H100, the
 * warp-specialized one is faster from L 256 up: causal L 256
 * 1.09x, 512 1.17x, 768 1.19x, 1024 1.24x, 1536 1.31x, 2048 1.38x;
 * windows [128, 0] and [64, 32] 1.15x / 1.04x at L 1024, 1.15x / 1.04x
 * at 4096; below, L 128 0.93x and L 64 0.63x (means 64 and 32: the
 * 128-row tiles waste most on sequences that short), so the crossover,
 * between means 64 and 128, is taken as 96
 * (bench/results/2026-12-06-h100-jagged-bwd-s29.log). */
static void plan_backward_long(ag_plan *p, ag_plan_jagged_choices choices) {
  p->jagged.long_min_rows = 96;
  p->jagged.fast_long = ws_kv(p->head_dim, 128);
  p->jagged.fast_long.tma_qdo = choices.sm90_bwd_tma;
}

/* Backward on sm_90a where the spec lets dQ's bits vary (not
 * deterministic; not broadcast, whose staged dQ sum is already fast):
 * _kv is key-stationary on wgmma with query steps of 64 rows; it adds
 * each step's dQ to an fp32 accumulator in the workspace with the copy
 * engine's bulk adds (cp.reduce.async.bulk). _pre writes D and zeroes the
 * accumulator, _dq rounds it. A ring of two Q, dO slots. Head dim 128:
 * two warpgroups of 64 keys a CTA, which split dQ's columns (so a step
 * adds one 64 x 128 tile), two slots of staging rows of 72 floats per
 * warpgroup. Head dim 64: one warpgroup of 64 keys a CTA and three CTAs
 * an SM (launch bounds cap registers at 168), which run out of step so
 * that one's softmax and staging overlap the others' products, one slot
 * of staging rows of 68 floats (75 KB a CTA); measured 1.15-1.20x two
 * CTAs an SM with three slots. Shared memory: K, V, the slots, dS^T, the
 * slots' row floats, the staging rows. On the H200 it runs 1.06-1.14x
 * FlashAttention-2's backward (bench/RESULTS-jagged.md). */
static bool plan_backward_fast(const ag_spec *spec, ag_plan *p, ag_plan_jagged_choices choices) {
  if (spec->arch != AG_ARCH_SM90A || spec->deterministic || p->jagged.broadcast ||
      (spec->rotary.layout != AG_ROTARY_NONE && !choices.sm90_rotary)) /* as the forward */
    return false;
  ag_plan_jagged *j = &p->jagged;
  j->fast_rows_threads = 256;
  if (choices.sm90_bwd_ws && spec->rotary.layout == AG_ROTARY_NONE &&
      (p->head_dim == 128 || (!spec->causal && !spec->has_window))) {
    plan_backward_ws(spec, p, choices);
    return true;
  }
  const bool d64 = p->head_dim == 64;
  if (d64 && choices.sm90_bwd_ws && choices.sm90_bwd_long && spec->rotary.layout == AG_ROTARY_NONE)
    plan_backward_long(p, choices);
  const int m = 64, n = d64 ? 64 : 128, slots = 2;
  const int stages = d64 ? 1 : 2, stride = d64 ? 68 : 72; /* staging rows */
  j->fast = (ag_plan_jagged_kv){
      .block_m = m, .block_n = n, .threads = 128 * (n / 64), .min_ctas = d64 ? 3 : 1,
      .smem_bytes = 4 * p->head_dim * (n + slots * m) + 2 * n * m + 8 * slots * m +
                    stages * (n / 64) * 64 * stride * 4};
  return true;
}

/* The kernels ag_plan_jagged_make takes, each on once it has run on a
 * GPU; the comment above each says what was checked
 * (ag_plan_jagged_make_with takes others, for tests). */
static const ag_plan_jagged_choices jagged_checked = {
    /* Rotary embeddings in the sm_90a wgmma kernels (jagged_fwd_sm90.cu and
     * jagged_bwd_sm90.cu rotate tiles in shared memory as jagged_rotary.cuh
     * does for the mma.sync kernels, dK, dV back in registers and dQ back in
     * _dq). Checked on the H200 on 2026-12-02 (tools/gpu_session.sh gpu-jagged
     * sanitize-jagged), so rotary specs take them on sm_90a; false routes
     * rotary to the mma.sync kernels there, as tests/check_jagged.c does for
     * two GPU cases (ag_plan_jagged_make_with) to keep those checked. */
    .sm90_rotary = true,
    /* The sm_90a forward's short-sequence variant (plan_forward_short).
     * Checked on the H200 on 2026-12-03: gpu-jagged 14/14, compute-sanitizer
     * memcheck and racecheck clean; D128 L512 forward 0.919 -> 0.821 ms
     * (1.06x FlashAttention-2, causal 1.83x). */
    .sm90_short = true,
    /* The warp-specialized main forward (plan_forward_ws). Checked on the
     * H200 on 2026-12-03 (gpu-jagged 14/14, memcheck and racecheck clean):
     * bench/results/2026-12-03-h200-jagged-ws-gpu-suite.log. */
    .sm90_ws = true,
    /* ... and at head dim 64 (plan_forward_ws64): checked the same day, the
     * same way, with the short mma.sync variant beside it:
     * bench/results/2026-12-03-h200-jagged-ws64-gpu-suite.log. */
    .sm90_ws64 = true,
    /* The warp-specialized backward (plan_backward_ws). Checked on the H200
     * on 2026-12-03: gpu-jagged 14/14, compute-sanitizer memcheck and
     * racecheck clean at both head dims, short and long runs
     * (bench/results/2026-12-03-h200-jagged-bwd-ws-gpu-suite.log); persistent
     * and with head dim 128's masked specs, the same checks the same day
     * (bench/results/2026-12-03-h200-jagged-bwd-persistent-gpu-suite.log);
     * on 128-row steps at head dim 64, again the same day
     * (bench/results/2026-12-03-h200-jagged-bwd-d64-steps128-gpu-suite.log). */
    .sm90_bwd_ws = true,
    /* The warp-specialized forward for broadcast queries
     * (plan_forward_ws_broadcast). Checked on the H200 on 2026-12-03:
     * gpu-broadcast 6/6, memcheck and racecheck clean at n_q 100 and 200; the
     * n_q 128 forward 1.28-1.63x faster than the mma.sync one
     * (bench/results/2026-12-03-broadcast-ws/). */
    .sm90_ws_broadcast = true,
    /* The warp-specialized backward for long runs at head dim 64 with a mask
     * (plan_backward_long). Checked on the H200 on 2026-12-04: the kernel is
     * the one .sm90_bwd_ws covers (there at head dim 64 without a
     * mask, in the dev harness causal and windowed too); the variant's
     * gpu-jagged runs and sanitizers in
     * bench/results/2026-12-04-h200-jagged-bwd-long-gpu-suite.log. */
    .sm90_bwd_long = true,
    /* The warp-specialized forward for long runs at head dim 64 with a causal
     * mask (plan_forward_ws64): the kernel .sm90_ws64 and, causal,
     * .sm90_ws cover. Checked on the H200 on 2026-12-04: the harness
     * against float64 (causal, and causal with a window of 128), gpu-jagged
     * 14/14 with its mean-2603 runs on this variant, and sanitize-jagged
     * (bench/results/2026-12-04-h200-jagged-fwd-d64-causal.log). */
    .sm90_ws64_causal = true,
    /* Q and dO by TMA in the warp-specialized backward (plan_backward_ws,
     * TMA_QDO). Checked on the H200 on 2026-12-04 (session 21): the harness's
     * "ws-tma" variants against float64 (bf16 and fp16, head dims 128 and 64,
     * causal, window, GQA, cross lengths) and under memcheck and racecheck,
     * 1.00-1.18x the same kernel without TMA; the product's gpu-jagged 14/14,
     * gpu-broadcast 6/6 and sanitize-jagged clean
     * (bench/results/2026-12-04-h200-tma-s21.md). */
    .sm90_bwd_tma = true,
    /* dQ rounded in the warp-specialized backward (FUSED_DQ): written
     * 2026-12-04 (session 21) while no GPU was lent; not run yet. */
    .sm90_bwd_fused_dq = false,
    /* K and V by TMA in the warp-specialized forward (TMA_KV). Checked on the
     * H200 on 2026-12-04 (session 21) with .sm90_bwd_tma: gpu-jagged 14/14,
     * gpu-broadcast 6/6, sanitize-jagged clean; the forward 0.97-1.05x the
     * same build without it, 1.02-1.05x at L 4096
     * (bench/results/2026-12-04-h200-tma-s21.md). */
    .sm90_fwd_tma = true,
    /* The 128-row one-pass broadcast backward on wgmma (plan_backward_fused,
     * templates/broadcast_bwd_sm90.cu). Checked on an H100 on 2026-12-06
     * (session 30), first with two warpgroups, then warp specialized (a key
     * warpgroup for dK and dV): gpu-broadcast 7/7 (n_q 128 at both head dims,
     * causal, window), memcheck and racecheck at n_q 100; the latter 1.37-1.61x
     * the mma.sync kernel at n_q 128 (bench/results/
     * 2026-12-06-h100-broadcast-ws-checks.log, 2026-12-06-h100-broadcast-nq128-ws.md);
     * then with its K, V slots on mbarriers, checked the same way and timed
     * 0.97-1.09x the version before (2026-12-06-h100-broadcast-mbar-ring.log). */
    .sm90_bq_bwd = true,
    /* The broadcast warp-specialized forward at head dim 64 with six K, V
     * stages of 128 keys (212,992 bytes of shared memory) instead of three
     * (114,688). ncu on an H100 (2026-12-06, session 32; batch 264, keys
     * uniform in [2048, 4096], n_q 128; bench/results/
     * 2026-12-06-h100-ncu-broadcast-fwd-d64-nq128-s32.txt): one CTA an SM,
     * 44% of the warp samples in mbarrier spin loops, and the H200 ran
     * this forward at 47-59% of its memory floor
     * (bench/RESULTS-broadcast.md); more tiles in flight may cover more of
     * the latency. Written that session; ptxas (sm_90a): 168 registers,
     * no spills. Run on an H100 the same day (bench/results/
     * 2026-12-06-h100-broadcast-fwd-deep-s32.md): correct against float64
     * (n_q 100, 128) and under memcheck; batch 1152, n_q 128, L 4096: 2.4%
     * faster at s 0.5, 1.0% slower at s 1. Not yet on the H200, whose
     * bandwidth it was meant for (tools/next_gpu_call_bq_fwd.sh). Off. */
    .sm90_bq_fwd_deep = false,
    /* The warp-specialized jagged forward's query tiles a CTA and Q slots
     * (plan_forward_items), at head dim 64 and 128. Written and run on an
     * H100 80GB HBM3 on 2026-12-06 (session 33; bench/results/
     * 2026-12-06-h100-fwd-items-s33.md, ...-check-s33/): batch 1152, 4
     * heads, lengths uniform in [1, L], the forward at head dim 64 with 4
     * tiles and 2 slots against one tile a CTA: L 1024 1.5738 -> 1.4060 ms
     * (1.12x), L 4096 1.008x, causal L 4096 1.06x; at head dim 128 two
     * slots cost a K, V stage (0.80-0.89x) and one slot lost at L 4096
     * (0.95-0.97x), so 128 keeps one tile a CTA. With 4 and 2 at head dim
     * 64: gpu-jagged 14/14, gpu-broadcast 7/7, sanitize-jagged and a
     * broadcast spec under memcheck and racecheck clean (the same H100). */
    .fwd_items = {4, 1},
    .fwd_q_tiles = {2, 2},
    /* The warp-specialized forward's computing warpgroups skip the products
     * of what none of their rows sees (SKIP_DEAD): the upper 64 keys of a
     * causal diagonal tile for the first warpgroup, of a sequence's last
     * tile where 64 keys or fewer remain, and a whole tile's products for
     * the second warpgroup where the query tile has 64 rows or fewer. By
     * count (128-row query tiles, 128-key tiles, lengths uniform in [1, L]):
     * 8.3% of the products at L 1024 (15.0% causal), 2.2% at L 4096 (4.4%
     * causal); ptxas serializes every wgmma (C7515) where a product over
     * some parts shares a wait with others, so the kernel skips the first
     * tile's upper S alone (the diagonal or the keys' end) and the whole
     * tile of a warpgroup without a real row. Written and run on an H100
     * 80GB HBM3 on 2026-12-06 (session 34; bench/results/
     * 2026-12-06-h100-skip-dead-s34.md): float64 checks on 12 mixed runs
     * (partial tiles, sequences of 64 rows or fewer, causal, windows on
     * both sides, broadcast n_q 100, 130, 200), memcheck and racecheck
     * clean, gpu-jagged 14/14, gpu-broadcast 7/7; the forward alone
     * (batch 1152, 4 heads, ms, off -> on): D128 L1024 2.0592 -> 2.0081,
     * causal 1.5286 -> 1.4755, L4096 24.4054 -> 24.0777, causal 14.1393 ->
     * 13.9166; D64 L1024 1.4054 -> 1.3867; broadcast D64 n_q 130 0.7812 ->
     * 0.7099, D128 n_q 200 1.0008 -> 0.9924, n_q 128 within 0.3%. */
    .sm90_fwd_skip_dead = true,
    /* The warp-specialized forward's exponentials, a share of them on the
     * FMA pipe (exp2_fma in jagged_fwd_wgmma.cuh): MUFU.EX2 issues 16 a
     * clock an SM, and at head dim 64 a 128-key tile's S has as many
     * elements as the tensor cores compute in the same time (64 x 128 x
     * 64 x 2 products at 2,048 multiply-adds a clock against 64 x 128 at
     * 16), so the exponentials alone bound the forward at the matmul
     * rate; at 128 they are half of it. Correct, and slower: on an H100
     * 80GB HBM3 on 2026-12-07 (session 36; bench/results/
     * 2026-12-07-h100-fwd-ws192-fma-s36.md), 1 chunk in 3 (batch 1152, 4
     * heads, the forward alone, ms, off -> on) took head dim 64 [1, 4096]
     * 16.373 -> 16.862, [2048, 4096] 27.781 -> 28.362, head dim 128 [1,
     * 4096] 24.152 -> 25.654, and on the 192-row tiles 14.654 -> 15.790:
     * ncu shows MUFU's share fall (46% -> 32%) and the issue slots fill
     * (45% -> 57%), the 9 instructions a chunk costing more than MUFU's
     * wait. Off. */
    .sm90_fwd_exp2_fma_every = {0, 0},
    /* head dim 64, no mask: 192-row tiles on three computing warpgroups
     * (plan_forward_ws192; written in session 35: no spill, no serialized
     * wgmma). Run on an H100 80GB HBM3 on 2026-12-07 (session 36;
     * bench/results/2026-12-07-h100-fwd-ws192-fma-s36.md): float64 on 8
     * mixed runs (with 1 chunk in 3 on the FMA pipe as well), memcheck on a
     * head-dim-64 unmasked run, gpu-jagged 14/14, gpu-broadcast 7/7,
     * sanitize-jagged's 13 memcheck and 13 racecheck runs clean; the
     * forward alone (batch 1152, 4 heads, ms, off -> on): [1, 4096]
     * 16.373 -> 14.654 (1.12x), [2048, 4096] 27.781 -> 24.681 (1.13x),
     * [1, 1024] 1.414 -> 1.402; causal (not taken) 9.504 / 9.416. In
     * jagged_bench beside FlashAttention-4 (2026-12-07-h100-jagged-bench-
     * fa4-ws192-s36.md) head dim 64 L 4096 went from 0.91x FA4 (session
     * 34) to 0.98x (15.296 ms against 15.002). */
    .sm90_fwd_ws192 = true,
    /* and with a causal mask: by count of products 192-row tiles compute
     * 0.857 of the causal work as useful against 0.913 for 128-row ones at
     * L 4096 (tools/tune/tile_waste.py-style count), so the unmasked 1.12x
     * would leave about 1.05x. The template takes the mask as it is (the
     * diagonal per tile, per row). Run on an H100 (session 38,
     * bench/results/2026-12-07-h100-l2-row64-s38.md): float64 and memcheck
     * pass; the forward alone, ms, tree / 192 rows: lengths [1, 1024] 0.970
     * / 1.160, [1, 2048] 1.492 / 1.576, [1024, 2048] 2.332 / 2.439, [1,
     * 3072] 1.801 / 1.790, [1, 4096] 2.223 / 2.124, [2048, 4096] 3.566 /
     * 3.347. It breaks even near a work-weighted mean length (E[L^2] /
     * E[L]) of 2,048 and gains 4.5-6.5% from about 2,700: as the whole
     * causal route it loses; a third forward variant for long runs would
     * be needed. Off. */
    .sm90_fwd_ws192_causal = false,
    /* That variant (plan_forward_long192): from a mean of 2,048 rows, the
     * 192-row kernel measured above; below it the 128-row tiles. Written
     * after the session's device time ran out: the kernel is the one
     * checked above, the route (a third forward kernel in the module, the
     * launcher's pick) was then run on an H100 80GB HBM3 (session 39,
     * bench/results/2026-12-07-h100-long192-bqitems-s39.md): float64 on 4
     * runs either side of the mean, memcheck, gpu-jagged 14/14 (its "long
     * cross (mean 2412)" case on this variant); the forward alone (4
     * heads, two rounds, ms, off -> on): [1, 4096] 2.232 -> 2.111 and
     * 2.207 -> 2.127, [2048, 4096] 3.461 -> 3.309 and 3.469 -> 3.308,
     * [1536, 3072] 2.936 -> 2.924, [1, 1024] 0.975 -> 0.974 (the 128-row
     * variant). In jagged_bench (2026-12-07-h100-jagged-bench-fa4-s39.md)
     * head dim 64 causal L 4096 is 9.157 ms beside FlashAttention-4's
     * 8.819 (0.96x; 0.93x in session 36). sanitize-jagged (gpu_session.sh,
     * which runs this variant at lengths [2048, 4096]) clean under memcheck
     * and racecheck. On. */
    .sm90_fwd_long192_causal = true,
    /* Head dim 64's TMA maps with L2 promotion of 128 bytes. With 256 (the
     * maps' setting until session 38) an L2 miss on one head's 128-byte row
     * fetches its neighbour head's too, which a grid with the heads on y
     * (a head's CTAs all run before the next head's: the jagged kernels,
     * and the broadcast forward before .bq_fwd_heads_inner) needs only long
     * after;
     * ncu on an H100 (session 32) measured the head-dim-64 broadcast
     * forward at n_q 128 moving 1.26 GB from DRAM where K, V and O are
     * 0.85 GB. Head dim 128's rows are 256 bytes: unchanged. Measured on
     * an H100 (session 38, bench/results/2026-12-07-h100-l2-row64-s38.md,
     * two rounds, ms, 256 -> 128 bytes): the broadcast forward at n_q 128
     * 0.52 -> 0.41 (1.26x, batch 1152, keys in [512, 1024]) and 0.86 ->
     * 0.63 (1.37x, batch 528, [2048, 4096]); the jagged forward 3.47 ->
     * 3.39 (batch 264, [1, 4096]); the backward 3.23 -> 3.21 (batch 1152,
     * [1, 1024]). On in both passes. */
    .tma_l2_row64 = {true, true},
    /* The broadcast forward's grid with the heads inner: a sequence's
     * heads' CTAs run side by side and read its K, V rows whole (4 heads:
     * 512 or 1,024 contiguous bytes a row) instead of one head's 128 or 256
     * bytes in each row during a pass over every sequence, the other heads'
     * bytes read long after (and at head dim 64 fetched twice under a
     * 256-byte L2 promotion, .tma_l2_row64). With the 128-byte promotion
     * on (the same run): 0.613 / 0.615 ms against 0.629 / 0.630 (1.025x)
     * at batch 528, keys in [2048, 4096], 0.415 / 0.412 against 0.412 /
     * 0.413 at [512, 1024]. On. */
    .bq_fwd_heads_inner = true,
    /* With the bytes fixed (.tma_l2_row64) the head-dim-64 broadcast
     * forward runs at 86-95% of this H100's memory floor at n_q 128 except
     * for the shortest keys, [512, 1024]: 68% (bench/results/
     * 2026-12-07-h100-broadcast-d64-nq128-ceiling-s38.md), where one CTA an
     * SM computes a query tile over 4 to 8 key tiles and the next CTA's
     * start (its Q, the first K, V tiles' latency) is not overlapped:
     * several tiles a CTA would hide it. Session 33 measured 1.02x there
     * with 4 tiles and 2 Q slots (0.5230 -> 0.5109 ms), when the bytes were
     * not yet fixed; head dim 128 lost (0.6928 -> 0.7684), and its
     * .fwd_items is 1 anyway. With 4 tiles and 2 Q slots at head dim 64,
     * on an H100 80GB HBM3 (session 39, bench/results/2026-12-07-h100-
     * long192-bqitems-s39.md): float64 at n_q 1, 16, 128, 130, 200,
     * memcheck, gpu-broadcast 7/7; the forward alone (4 heads, n_q 128, two
     * rounds, ms, off -> on): batch 1152 keys [512, 1024] 0.416 -> 0.385
     * and 0.418 -> 0.388 (1.08x), 1024 0.483 -> 0.459, batch 528 [2048,
     * 4096] 0.611 -> 0.619 (1.2% slower), n_q 32 equal; sanitize-jagged's
     * n_q 128 and 130 runs of it clean under memcheck and racecheck. On at
     * head dim 64. */
    .bq_fwd_items = {true, false},
    /* the one-pass broadcast backward's 32-row variant, as measured above */
    .bq_m32_warps = {bq_m32_warps_d64, bq_m32_warps_d128},
    .bq_m32_stages = {bq_m32_stages_d64, bq_m32_stages_d128},
    /* n_q <= 64 on the 128-row wgmma backward too (its second query
     * warpgroup then computes on rows of zeros, LSE +inf: P = dS = 0,
     * never read; skipping its products, in the loop or as a loop of its
     * own, made ptxas spill 52-56 bytes at head dim 64, so it computes
     * them): the
     * 32-row mma.sync kernel, under ncu on an H100 (session 39, head dim
     * 128, n_q 32, keys [0, 1024] and 4096), holds 8 warps an SM at 247
     * registers, 12% occupancy, DRAM 57% busy, its stalls short
     * scoreboard on the products' ldmatrix (19-23%) and fixed latency
     * (21-23%): latency-bound. The GPU suite's broadcast case on this
     * choice's plan passed on an H100 (session 39: n_q 1 to 200, causal,
     * windows, grouped heads, 100,000 sequences). Timed on an H100 80GB
     * HBM3 (session 40; bench/results/2026-12-07-h100-bqsmall-s40.log;
     * the backward alone, batch 1152, 4 heads, ms, tree -> on, the first
     * of two rounds): head dim 128, n_q 32, keys [0, 1024] 1.195 -> 1.424,
     * [512, 1024] 1.594 -> 1.875, causal 1.196 -> 1.659; n_q 16 1.154 ->
     * 1.384; n_q 64 1.420 -> 1.471; batch 264 of 4096 keys at n_q 32 2.037
     * -> 2.273; head dim 64, n_q 32 0.646 -> 0.773 and 0.862 -> 1.012.
     * Correct (float64 at n_q 1 to 64, memcheck, racecheck) and 3-39%
     * slower. Its time hardly moves with n_q (1.384, 1.424, 1.471 ms at
     * 16, 32, 64): not its idle rows' products lose but its cost a key
     * tile (the P, dS hand-off to the key warpgroup, the K, V ring), about
     * 4.8 us a 64-key tile an SM against the 32-row kernel's 4.0. Off. */
    .bq_sm90_small = false,
    /* n_q <= 64 on the key-stationary wgmma kernel
     * (templates/broadcast_bwd_keys.cu; bench/NOTES.md session 40's
     * design): the 32- and 64-row mma.sync kernels run about 4.0 us a
     * 64-key tile an SM, latency-bound, where K, V in and dK, dV out take
     * about 2.7 at the H100's stream. Written in session 42; run in
     * session 43 on an H100 (bench/results/2026-12-07-h100-broadcast-keys-
     * s43.log; the backward alone, batch 1152, 4 heads, n_q 32, ms, tree
     * -> keys): head dim 128 1.196 -> 1.440 at keys [0, 1024], 2.024 ->
     * 2.501 at 4096 (batch 264); head dim 64 0.651 -> 0.746. Correct
     * (float64 at n_q 1 to 64, causal, memcheck) and 13-19% slower: about
     * 10 us a 128-key tile an SM, against the tree's 8.5. Off. */
    .bq_sm90_keys = false,
    /* Rotary embeddings on the 128-row wgmma backward (64 < n_q <= 128)
     * instead of the 128-row mma.sync kernel (interleaved) or the split
     * kernels (the half layout): session 43 measured the fused broadcast
     * rotary forward + backward at n_q 128 1.38-1.48x the time of the
     * unfused route (a rotary pass, then the non-rotary kernels, the
     * backward on wgmma). Written in session 44; ptxas and the CPU suites
     * only. Off until run. */
    .bq_sm90_rotary = false,
    /* n_q <= 64 on the broadcast warp-specialized forward too, its one
     * query tile of 128 rows holding n_q real ones (SKIP_DEAD: the second
     * warpgroup computes nothing where n_q <= 64), K and V by TMA, instead
     * of the 32-row mma.sync tiles. Those run near the memory floor at s 1
     * (session 39's broadcast table on an H100: 1.620 ms at head dim 64,
     * n_q 32, L 4096, where cuDNN took 1.583; 0.223 ms at L 1024, s 0.5,
     * about 89% of the 3.15 TB/s that H100 streams, by the mean length).
     * Run on an H100 in session 41 (tools/next_gpu_call_s39.sh bqfwdsmall;
     * bench/results/2026-12-07-h100-bqfwdsmall-s41.log; the forward alone,
     * batch 1152, 4 heads, n_q 32, ms, tree -> on, two rounds): head dim
     * 128 0.4506 -> 0.4471 at keys [0, 1024], 0.8174 -> 0.8104 at 1024,
     * 3.104 -> 3.091 at 4096 (0.4-1.2% in both rounds); head dim 64 0.234
     * -> 0.253 at [0, 1024] (8% slower), 0.427 -> 0.431 at 1024, 1.621 ->
     * 1.557 at 4096 (4% faster), n_q 16 0.233 -> 0.245, n_q 64 0.263 ->
     * 0.254. Correct (float64 at n_q 1 to 64, causal, memcheck,
     * racecheck). About 1% at head dim 128 and mixed at 64: not worth a
     * second forward route. Off. */
    .bq_fwd_ws_small = false,
    /* Broadcast rotary at head dim 128, n_q > 64: the 128-row mma.sync
     * forward took 1.006 ms at n_q 128, keys [0, 1024], batch 1152, 4
     * heads on an H100 (session 43, tables on q and k), where the
     * non-rotary warp-specialized one takes about 0.47. Written in session
     * 43; not run yet. Off. */
    .bq_fwd_sm90_rotary = false,
    /* Rotary embeddings in the warp-specialized forward (jagged_fwd_ws.cu:
     * the loading warpgroup waits for a tile's copies, rotates it in place
     * and arrives; K, V by cp.async), jagged at both head dims and
     * broadcast for n_q > 64, instead of jagged_fwd_sm90.cu (head dim 128)
     * and the mma.sync kernels. Written in session 43; not run yet. Off. */
    .sm90_fwd_ws_rotary = false,
};

ag_plan_jagged_choices ag_plan_jagged_checked(void) { return jagged_checked; }

ag_status ag_plan_jagged_make(const ag_spec *spec, ag_plan *out, ag_error *err) {
  return ag_plan_jagged_make_with(spec, ag_plan_jagged_checked(), out, err);
}

ag_status ag_plan_jagged_make_with(const ag_spec *spec, ag_plan_jagged_choices choices,
                                   ag_plan *out, ag_error *err) {
  memset(out, 0, sizeof *out);
  if (spec->head_dim != 64 && spec->head_dim != 128)
    return ag_fail(err, AG_ERR_SPEC, "spec '%s' was not validated", spec->name);
  if (spec->rotary.layout != AG_ROTARY_NONE && spec->rotary.positions == AG_POSITIONS_BLOCK)
    return ag_fail(err, AG_ERR_SPEC, "spec '%s' was not validated", spec->name);
  /* Rotary embeddings: the mma.sync kernels rotate each tile in shared
   * memory as it lands and the gradients in registers before they are
   * stored (jagged_rotary.cuh); tables, one per tensor, are read beside the
   * tiles, so nothing changes in the shapes. */
  ag_status st = ag_plan_rotary(spec, out, err);
  if (st != AG_OK) return st;
  out->pattern = AG_PATTERN_JAGGED;
  out->jagged.broadcast = spec->query == AG_QUERY_BROADCAST;
  out->jagged.rotary = spec->rotary.layout != AG_ROTARY_NONE;
  out->head_dim = spec->head_dim;
  out->elem_bytes = 2;
  out->scale = ag_spec_scale(spec);
  for (int pass = 0; pass < 2; pass++)
    out->jagged.tma_l2_bytes[pass] = choices.tma_l2_row64[pass] && spec->head_dim == 64 ? 128 : 256;
  if ((spec->passes & AG_PASS_FORWARD) && !plan_forward_sm90(spec, out, choices) &&
      !(choices.sm90_ws64 && plan_forward_ws64(spec, out, choices)) &&
      !(choices.sm90_ws_broadcast && plan_forward_ws_broadcast(spec, out, choices)))
    plan_forward(out);
  /* (rotary: the loading warpgroup rotates what its own copies landed) */
  out->jagged.fwd_tma = out->jagged.fwd_ws && choices.sm90_fwd_tma && !out->jagged.rotary;
  out->jagged.fwd_skip_dead = out->jagged.fwd_ws && choices.sm90_fwd_skip_dead;
  out->jagged.fwd_exp2_fma_every =
      out->jagged.fwd_ws ? choices.sm90_fwd_exp2_fma_every[spec->head_dim == 128] : 0;
  if ((spec->passes & AG_PASS_BACKWARD) && !plan_backward_fast(spec, out, choices))
    plan_backward(out);
  if (out->jagged.broadcast && (spec->passes & AG_PASS_FORWARD) &&
      !(choices.bq_fwd_ws_small && out->jagged.fwd_ws))
    plan_forward_small(out);
  if (choices.sm90_short && !out->jagged.broadcast && (spec->passes & AG_PASS_FORWARD))
    plan_forward_short(spec, out);
  if (out->jagged.broadcast && (spec->passes & AG_PASS_BACKWARD))
    plan_backward_fused(spec, out, choices);
  /* last: the short variant above takes the main forward's stages as
   * they were */
  if (spec->passes & AG_PASS_FORWARD) plan_forward_items(out, choices);
  return AG_OK;
}

static void set_common(ag_plan_kernel *k, int block_m, int block_n, int warps, int min_ctas) {
  ag_plan_set(k, "BLOCK_M", block_m);
  ag_plan_set(k, "BLOCK_N", block_n);
  ag_plan_set(k, "WARPS", warps);
  ag_plan_set(k, "MIN_CTAS", min_ctas);
}

/* A kernel's parameters: its pass's tensors (`tensors`, n of them), the
 * rotary tables of the queries and the keys when the kernels take them,
 * then the offsets and sizes every jagged kernel takes. */
static void add_params(const ag_plan *plan, ag_plan_kernel *k, const ag_param *tensors, int n) {
  static const ag_param tail[] = {AG_PARAM_OFFSETS_Q, AG_PARAM_OFFSETS_K, AG_PARAM_BATCH,
                                  AG_PARAM_HEADS,     AG_PARAM_KV_HEADS,  AG_PARAM_TOTAL_Q,
                                  AG_PARAM_TOTAL_K,   AG_PARAM_ITEMS};
  ag_param all[AG_PLAN_MAX_PARAMS];
  int m = 0;
  for (int i = 0; i < n; i++) all[m++] = tensors[i];
  if (plan->takes_table) {
    all[m++] = AG_PARAM_ROTARY_TABLE;
    all[m++] = AG_PARAM_ROTARY_TABLE_K;
  }
  for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) all[m++] = tail[i];
  ag_plan_params(k, m, all);
}

/* Append the TMA roles `a`, `b` (boxes of `rows` rows) to k's parameters,
 * last; past AG_PLAN_MAX_PARAMS is a planner bug, stopped here. */
static void add_tma_params(const ag_plan *plan, ag_plan_kernel *k, ag_param a, ag_param b,
                           int rows) {
  const int pass = k->pass == AG_PASS_BACKWARD;
  if (k->nparams + 2 > AG_PLAN_MAX_PARAMS) {
    fprintf(stderr, "attngen: %s has more than %d parameters\n", k->name, AG_PLAN_MAX_PARAMS);
    abort();
  }
  k->params[k->nparams++] = a;
  k->params[k->nparams++] = b;
  k->tma_rows = rows;
  k->tma_l2_bytes = plan->jagged.tma_l2_bytes[pass];
}

/* Whether forward variant `variant` runs on jagged_fwd_sm90.cu (where not
 * warp specialized): the main one where planned, and the short one of
 * plan_forward_short; a broadcast spec's 32-row variant
 * (plan_forward_small) stays on mma.sync. */
static bool fwd_on_sm90(const ag_plan_jagged *j, int variant) {
  return j->fwd_sm90 && !(j->broadcast && variant == AG_VARIANT_FWD_SMALL);
}

/* One forward kernel of jagged_fwd.cu (jagged_fwd_sm90.cu) with `block_m`
 * query rows a CTA and key tiles of `block_n`. */
static void add_forward(const ag_spec *spec, ag_plan *plan, const char *name,
                        const char *namespace_name, int block_m, int block_n, int warps,
                        int stages, int smem_bytes, int min_ctas, int variant) {
  const ag_plan_jagged *j = &plan->jagged;
  const bool ws = j->fwd_ws && variant != AG_VARIANT_FWD_SMALL;
  ag_plan_kernel *k = ag_plan_add_kernel(
      spec, plan, AG_PASS_FORWARD, name,
      ws ? "jagged_fwd_ws.cu" : fwd_on_sm90(j, variant) ? "jagged_fwd_sm90.cu" : "jagged_fwd.cu");
  k->namespace_name = namespace_name;
  k->variant = variant;
  const bool long_tiles = variant == AG_VARIANT_FWD_LONG; /* one tile a CTA, one Q slot */
  const int items = ws && !long_tiles ? j->fwd_items : 1;
  k->walk = (ag_walk){j->broadcast ? AG_WALK_BROADCAST_Q : AG_WALK_JAGGED_Q, block_m, 1, items,
                      ws && j->broadcast && j->fwd_heads_inner};
  k->threads = 32 * warps;
  k->smem_bytes = smem_bytes;
  k->min_ctas_per_sm = min_ctas;
  static const ag_param head[] = {AG_PARAM_Q, AG_PARAM_K, AG_PARAM_V, AG_PARAM_O, AG_PARAM_LSE};
  add_params(plan, k, head, (int)(sizeof head / sizeof head[0]));
  set_common(k, block_m, block_n, warps, min_ctas);
  ag_plan_set(k, "STAGES", stages);
  ag_plan_set(k, "BROADCAST", j->broadcast);
  ag_plan_set(k, "SMEM_BYTES", smem_bytes);
  /* a condition of jagged_fwd_wgmma.cuh, which both sm_90a forwards include */
  ag_plan_set(k, "EXP2_FMA_EVERY", ws ? j->fwd_exp2_fma_every : 0);
  if (ws) {
    ag_plan_set(k, "CTA_ITEMS", items);
    ag_plan_set(k, "Q_TILES", long_tiles ? 1 : j->fwd_q_tiles);
    ag_plan_set(k, "TMA_KV", j->fwd_tma);
    ag_plan_set(k, "SKIP_DEAD", j->fwd_skip_dead);
    ag_plan_set(k, "HEADS_INNER", k->walk.heads_inner);
    ag_plan_set(k, "TABLE_ROWS", long_tiles ? 0 : j->fwd_table_rows);
    if (j->fwd_tma) add_tma_params(plan, k, AG_PARAM_TMAP_K, AG_PARAM_TMAP_V, block_n); /* last */
  }
}

/* The backward's tensors, for every kernel of the pass (add_params). */
static const ag_param bwd_params[] = {
    AG_PARAM_Q,  AG_PARAM_K,  AG_PARAM_V,     AG_PARAM_O,       AG_PARAM_DOUT,
    AG_PARAM_LSE, AG_PARAM_DQ, AG_PARAM_DK,   AG_PARAM_DV,      AG_PARAM_DI};
enum { BWD_NPARAMS = (int)(sizeof bwd_params / sizeof bwd_params[0]) };

/* One fast sm_90a backward: _pre, _kv, _dq of c's template (kernel names
 * and @KERNEL_NAME@ from `stem`), as `variant` of the pass, in namespace
 * `namespace_name` (or none). */
static void add_backward_fast(const ag_spec *spec, ag_plan *plan, const char *stem,
                              const ag_plan_jagged_kv *c, int variant,
                              const char *namespace_name) {
  const ag_plan_jagged *j = &plan->jagged;
  char name[AG_KERNEL_NAME_MAX];
  const int rows = j->fast_rows_threads * 8 / plan->head_dim; /* (token, head) rows a CTA */
  static const char *const suffix[3] = {"_pre", "_kv", "_dq"};
  for (int i = 0; i < (c->fused_dq ? 2 : 3); i++) { /* fused: _kv rounds dQ, no _dq */
    snprintf(name, sizeof name, "%.*s%s", AG_KERNEL_NAME_MAX - 4, stem, suffix[i]);
    ag_plan_kernel *k = ag_plan_add_kernel(
        spec, plan, AG_PASS_BACKWARD, name,
        i > 0 ? NULL : c->ws ? "jagged_bwd_ws.cu" : "jagged_bwd_sm90.cu");
    snprintf(k->template_name, sizeof k->template_name, "%s", stem);
    k->namespace_name = namespace_name;
    k->variant = variant;
    add_params(plan, k, bwd_params, BWD_NPARAMS);
    if (c->tma_qdo) /* the maps last, for every kernel of the set (one list) */
      add_tma_params(plan, k, AG_PARAM_TMAP_Q, AG_PARAM_TMAP_DOUT, c->block_m);
    if (i == 1) {
      k->walk = (ag_walk){c->ws ? AG_WALK_JAGGED_K_COUNTER : AG_WALK_JAGGED_K, c->block_n, 1, 1, false};
      k->threads = c->threads;
      k->smem_bytes = c->smem_bytes;
      k->min_ctas_per_sm = c->min_ctas;
    } else {
      k->walk = (ag_walk){AG_WALK_JAGGED_ROWS, rows, 1, 1, false};
      k->threads = j->fast_rows_threads;
      k->smem_bytes = 0;
      k->min_ctas_per_sm = 1;
    }
    if (i == 0) {
      ag_plan_set(k, "BLOCK_M", c->block_m);
      ag_plan_set(k, "BLOCK_N", c->block_n);
      ag_plan_set(k, "SMEM_BYTES", c->smem_bytes);
      ag_plan_set(k, "ROWS_THREADS", j->fast_rows_threads);
      ag_plan_set(k, "DKV_N128", c->dkv_n128);
      ag_plan_set(k, "FUSED_DQ", c->fused_dq);
      if (c->ws) {
        ag_plan_set(k, "STAGES", c->stages);
        ag_plan_set(k, "WGMMA_N128", c->block_m == 128);
        ag_plan_set(k, "TMA_QDO", c->tma_qdo);
      } else {
        ag_plan_set(k, "MIN_CTAS", c->min_ctas);
      }
    }
  }
}

/* The fast backward's kernels: one set, or with a long variant two, the
 * short one's names ..._bwd_*, the long one's ..._bwd_long_*, each in a
 * namespace of its own. */
static void add_backward_fast_sets(const ag_spec *spec, ag_plan *plan) {
  const ag_plan_jagged *j = &plan->jagged;
  const bool two = j->long_min_rows > 0;
  char stem[AG_KERNEL_NAME_MAX];
  kernel_name(stem, spec, "bwd");
  add_backward_fast(spec, plan, stem, &j->fast, two ? AG_VARIANT_BWD_SHORT : 0,
                    two || j->fwd_block_m > 0 ? "bwd" : NULL);
  if (!two) return;
  char long_stem[AG_KERNEL_NAME_MAX];
  snprintf(long_stem, sizeof long_stem, "%.*s_long", AG_KERNEL_NAME_MAX - 16, stem);
  add_backward_fast(spec, plan, long_stem, &j->fast_long, AG_VARIANT_BWD_LONG, "bwd_long");
}

void ag_plan_jagged_kernels(const ag_spec *spec, ag_plan *plan) {
  const ag_plan_jagged *j = &plan->jagged;
  char name[AG_KERNEL_NAME_MAX];
  const bool fwd = j->fwd_block_m > 0;
  if (fwd) {
    /* the main forward is named by the stem, its variants by their rows */
    char stem[AG_KERNEL_NAME_MAX];
    kernel_name(stem, spec, "fwd");
    add_forward(spec, plan, stem, NULL, j->fwd_block_m, j->fwd_block_n, j->fwd_warps,
                j->fwd_stages, j->fwd_smem_bytes, j->fwd_min_ctas,
                j->small_block_m > 0 ? AG_VARIANT_FWD_LARGE : 0);
    if (j->small_block_m > 0) {
      snprintf(name, sizeof name, "%.*s_m%d", AG_KERNEL_NAME_MAX - 16, stem, j->small_block_m);
      add_forward(spec, plan, name, "fwd_small", j->small_block_m, j->small_block_n,
                  j->small_warps, j->small_stages, j->small_smem_bytes, j->small_min_ctas,
                  AG_VARIANT_FWD_SMALL);
    }
    if (j->small_block_m > 0 && j->long_fwd_min_rows > 0) {
      snprintf(name, sizeof name, "%.*s_m%d", AG_KERNEL_NAME_MAX - 16, stem, j->long_fwd_block_m);
      add_forward(spec, plan, name, "fwd_long", j->long_fwd_block_m, j->fwd_block_n,
                  j->long_fwd_warps, j->long_fwd_stages, j->long_fwd_smem_bytes, 1,
                  AG_VARIANT_FWD_LONG);
    }
  }
  if (j->fast.block_m > 0) add_backward_fast_sets(spec, plan);
  if (j->bwd_block_m > 0) {
    const ag_param *const params = bwd_params;
    const int nparams = BWD_NPARAMS;
    char stem[AG_KERNEL_NAME_MAX];
    kernel_name(stem, spec, "bwd");
    /* Broadcast, heads == kv_heads, n_q <= 32, 64 or 128: one pass. */
    static const char *const fused_ns[AG_FUSED_VARIANTS] = {"bwd_fused_0", "bwd_fused_1",
                                                               "bwd_fused_2"};
    for (int i = 0; i < AG_FUSED_VARIANTS && j->fused_block_m[i] > 0; i++) {
      snprintf(name, sizeof name, "%.*s_m%d", AG_KERNEL_NAME_MAX - 16, stem, j->fused_block_m[i]);
      ag_plan_kernel *f = ag_plan_add_kernel(
          spec, plan, AG_PASS_BACKWARD, name,
          j->fused_keys[i]   ? "broadcast_bwd_keys.cu"
          : j->fused_sm90[i] ? "broadcast_bwd_sm90.cu"
                             : "broadcast_bwd.cu");
      f->namespace_name = fused_ns[i];
      f->variant = AG_VARIANT_BWD_FUSED_0 + i;
      f->walk = (ag_walk){AG_WALK_BROADCAST_SLABS, j->fused_block_m[i], 1, 1, false};
      f->threads = 32 * j->fused_warps[i];
      f->smem_bytes = j->fused_smem_bytes[i];
      f->min_ctas_per_sm = j->fused_min_ctas[i];
      add_params(plan, f, params, nparams);
      set_common(f, j->fused_block_m[i], j->fused_keys[i] ? 128 : 64, j->fused_warps[i],
                 j->fused_min_ctas[i]);
      ag_plan_set(f, "SMEM_BYTES", j->fused_smem_bytes[i]);
      ag_plan_set(f, "STAGES", j->fused_stages[i]);
      if (j->fused_sm90[i] || j->fused_keys[i]) ag_plan_set(f, "DKV_N128", plan->head_dim == 128);
    }
    /* _dq first: it writes D, which _dkv reads. */
    snprintf(name, sizeof name, "%.*s_dq", AG_KERNEL_NAME_MAX - 4, stem);
    ag_plan_kernel *dq = ag_plan_add_kernel(spec, plan, AG_PASS_BACKWARD, name, "jagged_bwd.cu");
    snprintf(dq->template_name, sizeof dq->template_name, "%s", stem);
    if (fwd || j->broadcast) dq->namespace_name = "bwd";
    dq->variant = j->broadcast ? AG_VARIANT_BWD_SPLIT : 0;
    dq->walk = (ag_walk){j->broadcast ? AG_WALK_BROADCAST_SLABS : AG_WALK_JAGGED_Q,
                         j->bwd_block_m, 1, 1, false};
    dq->threads = 32 * j->bwd_warps;
    dq->smem_bytes = j->bwd_smem_dq;
    dq->min_ctas_per_sm = j->bwd_min_ctas;
    add_params(plan, dq, params, nparams);
    set_common(dq, j->bwd_block_m, j->bwd_block_n, j->bwd_warps, j->bwd_min_ctas);
    ag_plan_set(dq, "SMEM_BYTES_DQ", j->bwd_smem_dq);
    ag_plan_set(dq, "SMEM_BYTES_DKV", j->bwd_smem_dkv);
    ag_plan_set(dq, "BROADCAST", j->broadcast);
    ag_plan_set(dq, "SUM_THREADS", j->sum_threads);

    snprintf(name, sizeof name, "%.*s_dkv", AG_KERNEL_NAME_MAX - 5, stem);
    ag_plan_kernel *dkv = ag_plan_add_kernel(spec, plan, AG_PASS_BACKWARD, name, NULL);
    snprintf(dkv->template_name, sizeof dkv->template_name, "%s", stem);
    dkv->variant = dq->variant;
    dkv->walk = (ag_walk){AG_WALK_JAGGED_K, j->bwd_block_n, 1, 1, false};
    dkv->threads = 32 * j->bwd_warps;
    dkv->smem_bytes = j->bwd_smem_dkv;
    dkv->min_ctas_per_sm = j->bwd_min_ctas;
    add_params(plan, dkv, params, nparams);

    /* A broadcast Q's dQ: the slabs' partials summed in order (the
     * backward's parameters, as its other kernels). */
    if (j->broadcast) {
      snprintf(name, sizeof name, "%.*s_dq_sum", AG_KERNEL_NAME_MAX - 8, stem);
      ag_plan_kernel *sum = ag_plan_add_kernel(spec, plan, AG_PASS_BACKWARD, name, NULL);
      snprintf(sum->template_name, sizeof sum->template_name, "%s", stem);
      /* rows: (query row, head) pairs per CTA, 4 floats a thread */
      sum->walk = (ag_walk){AG_WALK_BROADCAST_SUM, 4 * j->sum_threads / plan->head_dim, 1, 1, false};
      sum->threads = j->sum_threads;
      sum->smem_bytes = 0;
      sum->min_ctas_per_sm = 1;
      add_params(plan, sum, params, nparams);
    }
  }
}

void ag_plan_jagged_describe(const ag_plan *plan, const char *prefix, ag_buf *b) {
  const ag_plan_jagged *j = &plan->jagged;
  for (int i = 0; i < plan->nkernels; i++) {
    const ag_plan_kernel *k = &plan->kernels[i];
    ag_buf_printf(b, "%s%s kernel: %s\n", prefix,
                  k->pass == AG_PASS_FORWARD ? "forward" : "backward", k->name);
    if (k->pass == AG_PASS_FORWARD) {
      const bool small = k->variant == AG_VARIANT_FWD_SMALL;
      const bool long_tiles = k->variant == AG_VARIANT_FWD_LONG;
      ag_buf_printf(b, "%s  tile: %d query rows of one head, key tiles of %d, %d in flight\n",
                    prefix, k->walk.rows, small ? j->small_block_n : j->fwd_block_n,
                    small ? j->small_stages : long_tiles ? j->long_fwd_stages : j->fwd_stages);
      if (j->fwd_ws && !small) {
        ag_buf_printf(b,
                      "%s  warp specialized (sm_90a): one warpgroup loads, %d of 64 rows take\n"
                      "%s  turns on wgmma, each tile's softmax under the products%s\n",
                      prefix, k->threads / 128 - 1, prefix,
                      j->fwd_tma ? "; K, V by TMA" : "");
        if (j->rotary)
          ag_buf_printf(b, "%s  the loading warpgroup rotates each landed Q and K, V tile\n", prefix);
        if (j->fwd_tma && j->tma_l2_bytes[0] == 128)
          ag_buf_printf(b, "%s  L2 fetches of 128 bytes (a head's row) on a TMA miss\n", prefix);
        if (j->fwd_skip_dead)
          ag_buf_printf(b, "%s  no product for keys or rows a warpgroup does not see\n", prefix);
        if (j->fwd_exp2_fma_every)
          ag_buf_printf(b, "%s  the exponentials of 1 in %d 8-key chunks on the FMA pipe\n",
                        prefix, j->fwd_exp2_fma_every);
        if (k->walk.items_per_cta > 1)
          ag_buf_printf(b, "%s  %d query tiles a CTA in turn, %d Q slot%s\n", prefix,
                        j->fwd_items, j->fwd_q_tiles, j->fwd_q_tiles > 1 ? "s" : "");
      } else if (fwd_on_sm90(j, k->variant))
        ag_buf_printf(b, "%s  both products on wgmma (sm_90a): %d warpgroups of 64 rows\n", prefix,
                      k->threads / 128);
      if (long_tiles)
        ag_buf_printf(b, "%s  runs when the mean query length >= %d\n", prefix,
                      j->long_fwd_min_rows);
      else if (k->variant && j->long_fwd_min_rows > 0 && !small)
        ag_buf_printf(b, "%s  runs when %d < the mean query length < %d\n", prefix,
                      j->small_max_n_q, j->long_fwd_min_rows);
      else if (k->variant)
        ag_buf_printf(b, "%s  runs when %s %s %d\n", prefix,
                      j->broadcast ? "n_q" : "the mean query length", small ? "<=" : ">",
                      j->small_max_n_q);
    } else if (k->variant >= AG_VARIANT_BWD_FUSED_0) {
      const bool keys = j->fused_keys[k->variant - AG_VARIANT_BWD_FUSED_0];
      ag_buf_printf(b,
                    "%s  one pass: dQ, dK, dV of all n_q <= %d shared query rows of one head "
                    "over a slab of sequences, key tiles of %d (runs when heads == kv_heads)\n",
                    prefix, k->walk.rows, keys ? 128 : 64);
      if (keys)
        ag_buf_printf(b,
                      "%s  key-stationary on wgmma (sm_90a): one warpgroup loads, two of 64 "
                      "keys compute\n",
                      prefix);
    } else if (k->walk.kind == AG_WALK_BROADCAST_SLABS) {
      ag_buf_printf(b,
                    "%s  query-stationary: D, and dQ of %d shared query rows over a slab of "
                    "sequences, key tiles of %d (runs when no one-pass kernel applies)\n",
                    prefix, j->bwd_block_m, j->bwd_block_n);
    } else if (k->walk.kind == AG_WALK_BROADCAST_SUM) {
      ag_buf_printf(b, "%s  dQ: the slabs' fp32 partials summed in slab order\n", prefix);
    } else if (k->walk.kind == AG_WALK_JAGGED_ROWS) {
      ag_buf_printf(b, "%s  %s\n", prefix,
                    k->template_file ? "D = rowsum(dO * O) of each query row; the fp32 dQ "
                                       "accumulator zeroed"
                                     : "dQ: the fp32 accumulator scaled and rounded");
    } else if ((k->walk.kind == AG_WALK_JAGGED_K || k->walk.kind == AG_WALK_JAGGED_K_COUNTER) &&
               j->fast.block_m > 0) {
      const ag_plan_jagged_kv *c = k->variant == AG_VARIANT_BWD_LONG ? &j->fast_long : &j->fast;
      ag_buf_printf(b,
                    "%s  key-stationary on wgmma (sm_90a): dK and dV of %d key rows (64 a\n"
                    "%s  warpgroup) over the group's heads, query tiles of %d; each tile's dQ\n"
                    "%s  added to the fp32 accumulator by bulk adds (its bits vary run to run)\n",
                    prefix, c->block_n, prefix, c->block_m, prefix);
      if (c->ws)
        ag_buf_printf(b,
                      "%s  warp specialized: one warpgroup loads K, V and %d stages of Q, dO;\n"
                      "%s  the computing warpgroups meet %s\n",
                      prefix, c->stages, prefix,
                      plan->head_dim == 128 || c->block_m == 128
                          ? "once a step (dQ reads both halves of dS^T)"
                          : "never (each adds its own keys' dQ)");
      if (c->dkv_n128)
        ag_buf_printf(b, "%s  dV and dK as one 64x128 product a k-step\n", prefix);
      if (c->tma_qdo)
        ag_buf_printf(b, "%s  Q and dO by TMA (tensor maps as parameters)\n", prefix);
      if (c->tma_qdo && j->tma_l2_bytes[1] == 128)
        ag_buf_printf(b, "%s  L2 fetches of 128 bytes (a head's row) on a TMA miss\n", prefix);
    } else if (k->walk.kind == AG_WALK_JAGGED_Q) {
      ag_buf_printf(b, "%s  query-stationary: D and dQ of %d query rows, key tiles of %d\n",
                    prefix, j->bwd_block_m, j->bwd_block_n);
    } else {
      ag_buf_printf(b,
                    "%s  key-stationary: dK and dV of %d key rows over the group's heads, "
                    "query tiles of %d\n",
                    prefix, j->bwd_block_n, j->bwd_block_m);
    }
    if (k->variant == AG_VARIANT_BWD_SHORT || k->variant == AG_VARIANT_BWD_LONG)
      ag_buf_printf(b, "%s  runs when the mean query length %s %d\n", prefix,
                    k->variant == AG_VARIANT_BWD_SHORT ? "<=" : ">", j->long_min_rows);
    if (j->rotary && k->walk.kind == AG_WALK_JAGGED_Q)
      ag_buf_printf(b, "%s  rotary: tiles rotated in shared memory as they land%s%s\n", prefix,
                    k->pass == AG_PASS_BACKWARD ? ", dQ rotated back before it is stored" : "",
                    plan->takes_table ? " (angles from the tables)" : "");
    else if (j->rotary && k->walk.kind == AG_WALK_JAGGED_K)
      ag_buf_printf(b,
                    "%s  rotary: tiles rotated in shared memory as they land, dK (dV) rotated "
                    "back before stored%s\n",
                    prefix, plan->takes_table ? " (angles from the tables)" : "");
    ag_buf_printf(b, "%s  threads: %d, shared memory: %d bytes", prefix, k->threads,
                  k->smem_bytes);
    if (k->min_ctas_per_sm > 1)
      ag_buf_printf(b, ", registers capped for %d CTAs per SM", k->min_ctas_per_sm);
    ag_buf_puts(b, "\n");
    switch (k->walk.kind) {
      case AG_WALK_BROADCAST_Q:
        if (k->walk.heads_inner && k->walk.items_per_cta > 1)
          ag_buf_printf(b, "%s  grid: (ceil(batch * ceil(n_q / %d) / %d) * heads, 1), a "
                        "sequence's heads side by side\n", prefix, k->walk.rows,
                        k->walk.items_per_cta);
        else if (k->walk.heads_inner)
          ag_buf_printf(b, "%s  grid: (batch * ceil(n_q / %d) * heads, 1), a sequence's heads side "
                        "by side\n", prefix, k->walk.rows);
        else if (k->walk.items_per_cta > 1)
          ag_buf_printf(b, "%s  grid: (ceil(batch * ceil(n_q / %d) / %d), heads)\n", prefix,
                        k->walk.rows, k->walk.items_per_cta);
        else
          ag_buf_printf(b, "%s  grid: (batch * ceil(n_q / %d), heads)\n", prefix, k->walk.rows);
        break;
      case AG_WALK_BROADCAST_SLABS:
        ag_buf_printf(b, "%s  grid: (ceil(n_q / %d) * slabs, heads)\n", prefix, k->walk.rows);
        break;
      case AG_WALK_JAGGED_ROWS:
        ag_buf_printf(b, "%s  grid: (ceil(total_q * heads / %d), 1)\n", prefix, k->walk.rows);
        break;
      case AG_WALK_BROADCAST_SUM:
        ag_buf_printf(b, "%s  grid: (ceil(n_q * heads / %d), 1)\n", prefix, k->walk.rows);
        break;
      case AG_WALK_JAGGED_K_COUNTER:
        ag_buf_printf(b,
                      "%s  grid: one CTA an SM (persistent), taking the (batch + total_k / %d)\n"
                      "%s  * kv_heads tiles from a counter, whichever CTA is free\n",
                      prefix, k->walk.rows, prefix);
        break;
      default:
        if (k->walk.kind == AG_WALK_JAGGED_Q && k->walk.items_per_cta > 1)
          ag_buf_printf(b, "%s  grid: (ceil((batch + total_q / %d) / %d), heads)\n", prefix,
                        k->walk.rows, k->walk.items_per_cta);
        else
          ag_buf_printf(b, "%s  grid: (batch + total_%s / %d, %s)\n", prefix,
                        k->walk.kind == AG_WALK_JAGGED_Q ? "q" : "k", k->walk.rows,
                        k->walk.kind == AG_WALK_JAGGED_Q ? "heads" : "kv_heads");
    }
  }
}

int ag_plan_jagged_variant(const ag_plan *plan, unsigned pass, int64_t n_q, int64_t heads,
                           int64_t kv_heads) {
  const ag_plan_jagged *j = &plan->jagged;
  if (pass == AG_PASS_FORWARD && j->small_block_m > 0) {
    if (n_q <= j->small_max_n_q) return AG_VARIANT_FWD_SMALL;
    return j->long_fwd_min_rows > 0 && n_q >= j->long_fwd_min_rows ? AG_VARIANT_FWD_LONG
                                                                    : AG_VARIANT_FWD_LARGE;
  }
  if (pass == AG_PASS_BACKWARD && j->long_min_rows > 0)
    return n_q > j->long_min_rows ? AG_VARIANT_BWD_LONG : AG_VARIANT_BWD_SHORT;
  if (!j->broadcast || pass == AG_PASS_FORWARD) return 0;
  /* The one-pass backward holds every query in one CTA and writes dK, dV
   * of a key head once: n_q within its rows, no grouped heads. n_q = 0
   * takes the split kernels, which write dK = dV = 0. */
  for (int i = 0; i < AG_FUSED_VARIANTS; i++)
    if (j->fused_block_m[i] > 0 && heads == kv_heads && n_q >= 1 && n_q <= j->fused_block_m[i])
      return AG_VARIANT_BWD_FUSED_0 + i;
  return AG_VARIANT_BWD_SPLIT;
}
