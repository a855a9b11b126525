#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""variants.py NAME: apply a named edit to templates/broadcast_bwd_sm90.cu in
place (the device copy; tools/next_gpu_call_bq_sm90.sh variants builds the
tree's and each variant's library and times them side by side). Each edit
is exact text against the committed template; a stale one stops with a
message instead of building something else.

  pairs: the key warpgroup issues two 64-column products at a time (dV's
         halves, then dK's; at head dim 64 dV and dK), each a commit group,
         and stores the first while the second runs (the key warpgroup 96
         registers at head dim 128, 128 at 64; the query ones 208, 192). Candidate (bench/NOTES.md, "Broadcast
         backward at n_q 128"): its chain of four waits a tile becomes two.
"""
import sys

T = "templates/broadcast_bwd_sm90.cu"

PAIRS = [
    ("constexpr int kQueryRegs = 208, kKeyRegs = 80;",
     "constexpr int kQueryRegs = kHeadDim == 128 ? 208 : 192,\n"
     "              kKeyRegs = kHeadDim == 128 ? 96 : 128;"),
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
     """          // two 64-column products at a time, the first stored while
          // the second runs
#pragma unroll 1
          for (int t = 0; t < 2 * kHalves; t += 2) {
            float acc[2][8][4];
            wgmma_fence();
#pragma unroll
            for (int u = 0; u < 2; u++) {
              const bool is_k = t + u >= kHalves;
              keys_by_queries(acc[u], is_k ? ds_a : p_a, is_k ? q_a : do_a, (t + u) % kHalves,
                              ksteps);
              wgmma_commit();
            }
#pragma unroll
            for (int u = 0; u < 2; u++) {
              if (u == 0) wgmma_wait<1>();
              else wgmma_wait<0>();
              wgmma_hold(acc[u]);
              if (u == 1 && t + 2 == 2 * kHalves) mbar_arrive(empty0 + 8 * x);  // P, dS read
              const bool is_k = t + u >= kHalves;
              store_rows(acc[u], is_k ? kScale : 1.f, 16 * (warp & 3), nk,
                         (is_k ? dk_head : dv_head) + k0 * stride + 64 * ((t + u) % kHalves),
                         stride);
            }
          }
"""),
]

EDITS = {"pairs": PAIRS}

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
