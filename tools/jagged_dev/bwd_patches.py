# SPDX-License-Identifier: BSD-3-Clause
"""bwd_patches.py: the dev harness's experimental variants of the jagged
backward templates, each a list of text edits to the shipped template
(every `old` must occur exactly once), so that a variant always measures
one change against what ships today instead of a copy that drifts from
it. bwd_gen.py applies them (a variant's knob PATCH names one) into its
build directory and expands the result like a template.

Variants whose change moved into the template are deleted here; their
edits stay in git history (session 28: "stm", dS^T by stmatrix, and
"msk", the column-range mask, were copies tools/jagged_dev/
jagged_bwd_ws_x.cu and _m.cu until 3f8a1bd; session 29: "sm90q", that
mask in jagged_bwd_sm90.cu, and "kt", the loader's KeyTile handed over in
shared memory)."""

WS = "jagged_bwd_ws.cu"
SM90 = "jagged_bwd_sm90.cu"

# clock64 at each phase of 256 steps of CTA 0, the per-warpgroup means
# printed at the kernel's end ("ws-trace": where a step's time goes).
_TRACE_PRINT = r'''  if (blockIdx.x == 0 && (mt & 127) == 0 && n >= kTraceFrom + kTraceSteps) {
    // phases: 0 step start, 1 full, 2 S^T, 3 P, 4 dP^T, 5 dS^T stored, 6 barrier, 7 dQ,
    // 8 staged and added, 9 dV dK (released); sums of the differences over the steps
    // (each to the next step's start)
    long long d[kPhases] = {};
    for (int i = 0; i + 1 < kTraceSteps; i++) {
      for (int k = 1; k < kPhases; k++) d[k] += g_trace[wg][i][k] - g_trace[wg][i][k - 1];
      d[0] += g_trace[wg][i + 1][0] - g_trace[wg][i][kPhases - 1];
    }
    const double m = 1.0 / (kTraceSteps - 1);
    long long tot = 0;
    for (int k = 0; k < kPhases; k++) tot += d[k];
    printf("trace wg%d d%d m%d: step %.0f clk: full %.0f S %.0f P %.0f dPwait %.0f dS %.0f "
           "barrier %.0f dQ %.0f stage %.0f dKV %.0f next %.0f\n",
           wg, kHeadDim, kBlockM, tot * m, d[1] * m, d[2] * m, d[3] * m, d[4] * m, d[5] * m,
           d[6] * m, d[7] * m, d[8] * m, d[9] * m, d[0] * m);
  }
}'''

TRACE = (WS, [
    ("/* ---- begin kernel _kv ----", r'''// dev trace: phase clocks of kTraceSteps steps of CTA 0, per computing warpgroup
constexpr int kTraceFrom = 64, kTraceSteps = 256, kPhases = 10;
__device__ long long g_trace[2][kTraceSteps][kPhases];
__device__ __forceinline__ long long clk() {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c) :: "memory");
  return c;
}
#define TR(k) do { if (tr) g_trace[wg][n - kTraceFrom][k] = clk(); } while (0)

/* ---- begin kernel _kv ----'''),
    ("      const int s = n % kStages;\n      mbar_wait(full0 + 8 * s, (n / kStages) & 1);",
     "      const int s = n % kStages;\n"
     "      const bool tr = blockIdx.x == 0 && (mt & 127) == 0 && n >= kTraceFrom &&\n"
     "                      n < kTraceFrom + kTraceSteps;\n"
     "      TR(0);\n      mbar_wait(full0 + 8 * s, (n / kStages) & 1);\n      TR(1);"),
    ("      wgmma_wait<1>();  // S^T; dP^T runs on\n      wgmma_hold(sp_t);\n",
     "      wgmma_wait<1>();  // S^T; dP^T runs on\n      wgmma_hold(sp_t);\n      TR(2);\n"),
    ("      wgmma_wait<0>();  // dP^T\n      wgmma_hold(dp);\n",
     "      TR(3);\n      wgmma_wait<0>();  // dP^T\n      wgmma_hold(dp);\n      TR(4);\n"),
    ("      bulk_wait_read<0>();\n      fence_proxy_async();  // dS^T is read by wgmma",
     "      TR(5);\n      bulk_wait_read<0>();\n      fence_proxy_async();  // dS^T is read by wgmma"),
    ("      else named_barrier_sync(1, kMathThreads);\n",
     "      else named_barrier_sync(1, kMathThreads);\n      TR(6);\n"),
    ("      wgmma_wait<1>();  // dQ is done; dV and dK run on under the staging\n"
     "      wgmma_hold(c);\n",
     "      wgmma_wait<1>();  // dQ is done; dV and dK run on under the staging\n"
     "      wgmma_hold(c);\n      TR(7);\n"),
    ("      // dV and dK are done: the stage may be refilled.\n      wgmma_wait<0>();",
     "      TR(8);\n      // dV and dK are done: the stage may be refilled.\n      wgmma_wait<0>();"),
    ("      mbar_arrive(empty0 + 8 * s);\n    }", "      mbar_arrive(empty0 + 8 * s);\n      TR(9);\n    }"),
    ("@else@\n  bulk_wait_read<0>();  // the staging rows are read before the CTA's memory goes\n"
     "@endif@\n}",
     "@else@\n  bulk_wait_read<0>();  // the staging rows are read before the CTA's memory goes\n"
     "@endif@\n" + _TRACE_PRINT),
])


# Part of P's exp2 as a polynomial on the FMA pipe ("ws-poly<POLY>": chunks j
# with j % POLY == POLY - 1; MUFU.EX2 issues 16 a clock an SM).
POLY = (WS, [
    ("/* ---- begin kernel _kv ----", r'''// dev: 2^x as a polynomial on the FMA pipe instead of MUFU.EX2: x = n + f, n
// the nearest integer (added to 1.5 * 2^23, the rounding leaves n in the
// low bits), f in [-0.5, 0.5]; 2^f by Taylor to degree 4 in Horner form
// (relative error 5.6e-5 on [-126, 0.5] by a CPU emulation); n added to
// the exponent. x below -127 gives 0; +inf or NaN give NaN (only masked
// elements, which the mask selects to 0).
constexpr int kPolyEvery = @POLY@;
__device__ __forceinline__ float exp2_poly(float x) {
  x = fmaxf(x, -127.f);
  const float t = __fadd_rn(x, 12582912.f);
  const float f = __fsub_rn(x, __fsub_rn(t, 12582912.f));
  float p = fmaf(f, 9.6181291e-3f, 5.5504109e-2f);
  p = fmaf(p, f, 2.4022651e-1f);
  p = fmaf(p, f, 6.9314718e-1f);
  p = fmaf(p, f, 1.0f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

/* ---- begin kernel _kv ----'''),
    ("        for (int e = 0; e < 4; e++)\n"
     "          sp_t[j][e] = fast_exp2(fmaf(sp_t[j][e], kScaleLog2, (e & 1) ? m1 : m0));",
     "        for (int e = 0; e < 4; e++) {\n"
     "          const float x = fmaf(sp_t[j][e], kScaleLog2, (e & 1) ? m1 : m0);\n"
     "          sp_t[j][e] = kPolyEvery && j % kPolyEvery == kPolyEvery - 1 ? exp2_poly(x)\n"
     "                                                                     : fast_exp2(x);\n"
     "        }"),
])

PATCHES = {"trace": TRACE, "poly": POLY}


def patched(tpl_dir, name):
    """The text of variant `name`: its template with its edits applied."""
    base, edits = PATCHES[name]
    text = open("%s/%s" % (tpl_dir, base)).read()
    for old, new in edits:
        n = text.count(old)
        if n != 1:
            raise SystemExit("bwd_patches: %r: an edit's text occurs %d times in %s (not once): %r"
                             % (name, n, base, old[:70]))
        text = text.replace(old, new)
    return text
