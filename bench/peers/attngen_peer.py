# SPDX-License-Identifier: BSD-3-Clause
"""attngen, called through its Python package (bindings/python), so the
benchmark exercises the binding exactly as users call it.

  fwd  attngen.block_attention(q, k, v, offsets)
  bwd  the backward kernel alone, dout given: Kernel.backward (ag_block_backward
       through the binding) of the spec with passes [forward, backward]
  rot  forward + backward of a spec with rotary {layout: interleaved,
       apply_to: [q, k], positions: table}, the table passed to both

Where spec validation refuses a pass for a shape (e.g. the rotary pass at
256 tokens and head_dim 128, where the table's rows do not fit beside the
forward's tiles), the pass's rows say "unavailable: <pass> not supported
(<the C message>)" and the run goes on.
"""

import os
import sys
import time

from .common import Peer, Prepared, PreparedGrad, Unavailable, packed_rows

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _diagnostics(e):
    """The C diagnostics of an error on one line: its "error:" lines (one per
    refusal), else its first line."""
    lines = [x.strip() for x in (getattr(e, "detail", None) or str(e)).strip().splitlines()]
    errs = [x for x in lines if "error:" in x]
    return "; ".join(errs) if errs else (lines[0] if lines else type(e).__name__)


class AttngenPeer(Peer):
    name = "attngen"
    description = "attngen block-diagonal kernels (NVRTC, ctypes binding)"

    def setup(self, mode):
        sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
        try:
            import attngen
            attngen._lib.lib()
        except Exception as e:  # library not built, wrong ABI, ...
            raise Unavailable("attngen binding unusable: %s" % e)
        self.attngen = attngen

    def precompile(self, tasks):
        """Build every kernel the tasks need, in parallel (NVRTC runs with the
        GIL released); returns seconds taken. Errors (a shape the backward
        does not fit included) surface later per task."""
        import concurrent.futures as cf
        import torch
        keys = {(t.shape.block, t.shape.causal, t.shape.head_dim, t.shape.dtype,
                 t.pass_ == "bwd") for t in tasks if t.pass_ in ("fwd", "bwd")}
        dev = torch.cuda.current_device()
        t0 = time.perf_counter()

        def build(key):
            try:
                self.attngen.kernel_for(*key[:4], backward=key[4]).handle(dev)
            except Exception:
                pass

        with cf.ThreadPoolExecutor(max_workers=max(1, len(keys))) as ex:
            list(ex.map(build, keys))
        return time.perf_counter() - t0

    def _extra(self, kernel, compile_s):
        import torch
        extra = {"kernel": kernel.name, "first_build_s": round(compile_s, 3)}
        try:
            extra["arch"] = self.attngen.context_arch(torch.cuda.current_device())
        except Exception:
            pass
        return extra

    def prepare(self, data, mode):
        import torch
        sh = data.shape
        ag = self.attngen
        key = (sh.block, sh.causal, sh.head_dim, sh.dtype)
        t0 = time.perf_counter()
        kernel = ag.kernel_for(*key)
        kernel.handle(torch.cuda.current_device())  # compile now (or hit the cache)
        compile_s = time.perf_counter() - t0
        sets, offsets = data.sets, data.offsets

        def run(i):
            q, k, v = sets[i]
            return ag.block_attention(q, k, v, offsets, block_size=sh.block, causal=sh.causal)

        return Prepared(run, packed_rows, config=kernel.name,
                        extra=self._extra(kernel, compile_s))

    def _grad_kernel(self, key, what, rotary=None):
        """The kernel with both passes that block_attention takes for these
        options, compiled; Unavailable when validation refuses it (a shape
        the kernels do not fit)."""
        import torch
        ag = self.attngen
        t0 = time.perf_counter()
        try:
            kernel = ag.kernel_for(*key, backward=True, rotary=rotary)
            kernel.handle(torch.cuda.current_device())
        except ag.UnsupportedError as e:
            raise Unavailable("%s not supported (%s)" % (what, _diagnostics(e)))
        return kernel, time.perf_counter() - t0

    def prepare_backward(self, data, mode):
        sh = data.shape
        kernel, compile_s = self._grad_kernel(
            (sh.block, sh.causal, sh.head_dim, sh.dtype), "backward")
        sets, douts, offsets = data.sets, data.dout_sets(), data.offsets

        def run(i):
            q, k, v = sets[i]
            return kernel.backward(q, k, v, douts[i], offsets)

        return PreparedGrad(run, packed_rows, config=kernel.name,
                            note="the backward kernel alone (Kernel.backward)",
                            extra=self._extra(kernel, compile_s))

    def prepare_rotary(self, data, mode):
        # EXPERIMENTAL, minimal, like the rotary pipeline itself: the kernel
        # block_attention takes for rotary={layout: interleaved, apply_to: [q,
        # k]} with positions from the table, both passes.
        sh = data.shape
        kernel, compile_s = self._grad_kernel(
            (sh.block, sh.causal, sh.head_dim, sh.dtype), "rotary with the backward",
            rotary={"layout": "interleaved", "apply_to": ["q", "k"], "positions": "table"})
        sets, douts, offsets = data.sets, data.dout_sets(), data.offsets
        table = data.rotary_table()

        def check(i):
            q, k, v = sets[i]
            out = kernel(q, k, v, offsets, rotary_table=table)
            return out, kernel.backward(q, k, v, douts[i], offsets, rotary_table=table)

        return PreparedGrad(lambda i: check(i)[1], packed_rows, check=check, config=kernel.name,
                            note="fused rotary (table), forward + backward kernels",
                            extra=self._extra(kernel, compile_s))


PEER = AttngenPeer
