#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""variants.py NAME: apply a named edit to templates/broadcast_bwd_sm90.cu in
place (the device copy; tools/next_gpu_call_bq_sm90.sh variants builds the
tree's and each variant's library and times them side by side). Each edit
is exact text against the committed template; a stale one stops with a
message instead of building something else.

  pairs: at head dim 64 the key warpgroup issues dV and dK together, each
         a commit group, and stores dV while dK runs (136 registers; the
         query warpgroups 184: the CTA's 384 x 168). At head dim 128 the
         kernel is unchanged: two products in flight there need 64
         accumulator registers, and with the query warpgroups at 208 the
         key one gets 88, where ptxas spilled 2.3 KB. Candidate
         (bench/NOTES.md, "Broadcast backward at n_q 128").
         Timed in session 31 on an H100: 0.95-1.03x the tree; not taken.
  dkq:   at head dim 128 the query warpgroups compute dK, each 64 columns
         of it over all 128 queries (dS^T Q from the slot, once both have
         stored their dS: they wait on the slot's full barrier and arrive
         on its empty one), after their dQ product; the key warpgroup
         computes dV alone (two 64x64 products a tile instead of four, its
         critical path under ncu in session 31). Written in session 31
         with no device time left: compiled, not run. ptxas at head dim
         128: 148 bytes of spill stores, 200 of loads (the query
         warpgroups at 216 registers, the key one at 72; at 208 / 80: 176
         and 236), and 18 warpgroup.arrive injections (C7519) against the
         tree's 9; no setmaxnreg ignored (C7507). Head dim 64 unchanged.
"""
import sys

T = "templates/broadcast_bwd_sm90.cu"

PAIRS = [
    ("constexpr int kQueryRegs = 208, kKeyRegs = 80;",
     "constexpr int kQueryRegs = kHeadDim == 128 ? 208 : 184,\n"
     "              kKeyRegs = kHeadDim == 128 ? 80 : 136;\n"
     "constexpr int kAtOnce = kHeadDim == 128 ? 1 : 2;  // the key warpgroup's products in flight"),
    ("""          // one 64-column half of dV, then of dK, at a time (the key
          // warpgroup's registers are few)
#pragma unroll 1
          for (int t = 0; t < 2 * kHalves; t++) {
            const bool is_k = t >= kHalves;
            const int hh = t % kHalves;
            float acc[8][4];
            wgmma_fence();
            keys_by_queries(acc, is_k ? ds_a : p_a, is_k ? q_a : do_a, hh, ksteps);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_hold(acc);
            if (t == 2 * kHalves - 1) mbar_arrive(empty0 + 8 * x);  // P and dS are read
            store_rows(acc, is_k ? kScale : 1.f, 16 * (warp & 3), nk,
                       (is_k ? dk_head : dv_head) + k0 * stride + 64 * hh, stride);
          }
""",
     """          // kAtOnce 64-column products at a time, each stored while the
          // next runs
#pragma unroll 1
          for (int t = 0; t < 2 * kHalves; t += kAtOnce) {
            float acc[kAtOnce][8][4];
            wgmma_fence();
#pragma unroll
            for (int u = 0; u < kAtOnce; u++) {
              const bool is_k = t + u >= kHalves;
              keys_by_queries(acc[u], is_k ? ds_a : p_a, is_k ? q_a : do_a, (t + u) % kHalves,
                              ksteps);
              wgmma_commit();
            }
#pragma unroll
            for (int u = 0; u < kAtOnce; u++) {
              if (u + 1 < kAtOnce) wgmma_wait<1>();
              else wgmma_wait<0>();
              wgmma_hold(acc[u]);
              if (t + u == 2 * kHalves - 1) mbar_arrive(empty0 + 8 * x);  // P, dS read
              const bool is_k = t + u >= kHalves;
              store_rows(acc[u], is_k ? kScale : 1.f, 16 * (warp & 3), nk,
                         (is_k ? dk_head : dv_head) + k0 * stride + 64 * ((t + u) % kHalves),
                         stride);
            }
          }
"""),
]

DKQ = [
    ("constexpr int kQueryRegs = 208, kKeyRegs = 80;",
     "constexpr int kQueryRegs = kHalves == 2 ? 216 : 208, kKeyRegs = kHalves == 2 ? 72 : 80;\n"
     "// head dim 128: the query warpgroups compute dK (64 columns each), the key\n"
     "// warpgroup dV alone\n"
     "constexpr bool kDkInQuery = kHalves == 2;"),
    ("      mbar_init(empty0 + 8 * x, 128);",
     "      mbar_init(empty0 + 8 * x, 128 + (kDkInQuery ? 256 : 0));"),
    ("""          for (int t = 0; t < 2 * kHalves; t++) {""",
     """          for (int t = 0; t < (kDkInQuery ? kHalves : 2 * kHalves); t++) {"""),
    ("""            if (t == 2 * kHalves - 1) mbar_arrive(empty0 + 8 * x);  // P and dS are read""",
     """            if (t == (kDkInQuery ? kHalves : 2 * kHalves) - 1)
              mbar_arrive(empty0 + 8 * x);  // P and dS are read"""),
    ("""        keep(ds16);
        mbar_arrive(kv_empty0 + 8 * kx);  // this thread is done with the tile's K, V
""",
     """        keep(ds16);
        mbar_arrive(kv_empty0 + 8 * kx);  // this thread is done with the tile's K, V
        if constexpr (kDkInQuery) {
          // dK's 64 columns 64 wg.. over every query, once both query
          // warpgroups' dS is in the slot
          mbar_wait(full0 + 8 * x, (unsigned)(n >> 1) & 1);
          float acc_k[8][4];
          wgmma_fence();
          keys_by_queries(acc_k, p_a + kPBytes, q_a, wg, ksteps);
          wgmma_commit();
          wgmma_wait<0>();
          wgmma_hold(acc_k);
          mbar_arrive(empty0 + 8 * x);  // this thread is done with the slot
          store_rows(acc_k, kScale, 16 * (warp & 3), nk, sp.dk + k0 * stride + 64 * wg, stride);
        }
"""),
]

EDITS = {"pairs": PAIRS, "dkq": DKQ}

def main():
    if len(sys.argv) != 2 or sys.argv[1] not in EDITS:
        sys.exit("usage: variants.py {%s}" % "|".join(sorted(EDITS)))
    s = open(T).read()
    for old, new in EDITS[sys.argv[1]]:
        if s.count(old) != 1:
            sys.exit("variants.py %s: the template changed; edit not found once:\n%s"
                     % (sys.argv[1], old.splitlines()[0]))
        s = s.replace(old, new)
    open(T, "w").write(s)

if __name__ == "__main__":
    main()
