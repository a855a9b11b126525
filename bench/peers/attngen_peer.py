"""attngen, called through its Python package (bindings/python), so the
benchmark exercises the binding exactly as users call it."""

import os
import sys
import time

from .common import Peer, Prepared, Unavailable, packed_rows

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class AttngenPeer(Peer):
    name = "attngen"
    description = "attngen block-diagonal forward (NVRTC kernel, ctypes binding)"

    def setup(self, mode):
        sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
        try:
            import attngen
            attngen._lib.lib()
        except Exception as e:  # library not built, wrong ABI, ...
            raise Unavailable("attngen binding unusable: %s" % e)
        self.attngen = attngen
        self.compiled = set()

    def precompile(self, shapes):
        """Build every kernel the shapes need, in parallel (NVRTC runs with the
        GIL released); returns seconds taken. Errors surface later per shape."""
        import concurrent.futures as cf
        import torch
        keys = {(s.block, s.causal, s.head_dim, s.dtype) for s in shapes}
        dev = torch.cuda.current_device()
        t0 = time.perf_counter()

        def build(key):
            try:
                self.attngen.kernel_for(*key).handle(dev)
            except Exception:
                pass

        with cf.ThreadPoolExecutor(max_workers=max(1, len(keys))) as ex:
            list(ex.map(build, keys))
        return time.perf_counter() - t0

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

        extra = {"kernel": kernel.name, "first_build_s": round(compile_s, 3)}
        try:
            extra["arch"] = ag.context_arch(torch.cuda.current_device())
        except Exception:
            pass
        return Prepared(run, packed_rows, config=kernel.name, extra=extra)


PEER = AttngenPeer
