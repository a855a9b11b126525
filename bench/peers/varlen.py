# SPDX-License-Identifier: BSD-3-Clause
"""torch.nn.attention.varlen.varlen_attn (FlashAttention-2 underneath) with
one cu_seqlens entry per block, and the same call after activating
FlashAttention-3 through torch.nn.attention.activate_flash_attention_impl.

Exact for every block (no padding): each block is its own "sequence".
Backward and the rotary pipeline: autograd through the same call on packed
leaves (varlen_attn registers its backward with autograd).
"""

import inspect

from .common import Differentiable, Peer, Prepared, Unavailable, packed_rows


def _varlen_kwargs(fn, causal):
    """Keyword arguments for causal/non-causal across the 2.10 and 2.11+
    signatures (is_causal=... before, window_size=(-1, 0) after)."""
    params = inspect.signature(fn).parameters
    if not causal:
        return {}
    if "window_size" in params:
        return {"window_size": (-1, 0)}
    if "is_causal" in params:
        return {"is_causal": True}
    raise Unavailable("varlen_attn has neither window_size nor is_causal: %s"
                      % inspect.signature(fn))


class VarlenPeer(Peer):
    name = "varlen_fa2"
    description = "torch varlen_attn (FA2), one cu_seqlens entry per block"

    def setup(self, mode):
        try:
            from torch.nn.attention.varlen import varlen_attn
        except Exception as e:
            raise Unavailable("torch.nn.attention.varlen.varlen_attn: %s" % e)
        self.fn = varlen_attn
        self.signature = str(inspect.signature(varlen_attn))
        # Newer torch picks varlen_attn's backend as sdpa_kernel allows (and may
        # prefer cuDNN); pin the flash backend (FA2, or FA3 once activated).
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            self.context = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])
        except Exception:
            self.context = None

    def prepare(self, data, mode):
        import torch
        sh = data.shape
        t = data.table
        cu = torch.tensor(t.cu_seqlens(), dtype=torch.int32, device=data.device)
        maxb = int(t.lens.max()) if t.nblocks else 1
        kw = _varlen_kwargs(self.fn, sh.causal)
        fn, sets = self.fn, data.sets

        def run(i):
            q, k, v = sets[i]
            return fn(q, k, v, cu, cu, maxb, maxb, **kw)

        cfg = "cu_seqlens per block (%d)%s" % (t.nblocks, ", window (-1,0)" if kw.get("window_size") else "")
        return Prepared(run, packed_rows, config=cfg, extra={"max_q": maxb}, context=self.context)

    def differentiable(self, data, mode):
        import torch
        sh = data.shape
        t = data.table
        cu = torch.tensor(t.cu_seqlens(), dtype=torch.int32, device=data.device)
        maxb = int(t.lens.max()) if t.nblocks else 1
        kw = _varlen_kwargs(self.fn, sh.causal)
        fn = self.fn

        def attention(q, k, v):
            return fn(q, k, v, cu, cu, maxb, maxb, **kw)

        cfg = "cu_seqlens per block (%d)%s" % (t.nblocks, ", window (-1,0)" if kw.get("window_size") else "")
        return Differentiable(attention, "packed", packed_rows, config=cfg, note="autograd",
                              context=self.context, extra={"max_q": maxb})


class FA3Peer(VarlenPeer):
    name = "varlen_fa3"
    description = "torch varlen_attn after activate_flash_attention_impl('FA3')"

    def setup(self, mode):
        try:
            import torch.nn.attention as A
        except Exception as e:
            raise Unavailable(str(e))
        if not hasattr(A, "activate_flash_attention_impl"):
            raise Unavailable("this torch has no activate_flash_attention_impl")
        impls = []
        if hasattr(A, "list_flash_attention_impls"):
            try:
                impls = list(A.list_flash_attention_impls())
            except Exception:
                pass
        try:
            A.activate_flash_attention_impl("FA3")
        except Exception as e:
            raise Unavailable("activate_flash_attention_impl('FA3') failed: %s: %s "
                              "(registered impls: %s)" % (type(e).__name__, e, impls or "none"))
        cur = A.current_flash_attention_impl() if hasattr(A, "current_flash_attention_impl") else "?"
        if cur != "FA3":
            raise Unavailable("FA3 activation did not take (current impl: %r)" % (cur,))
        super().setup(mode)


PEERS = {"varlen_fa2": VarlenPeer, "varlen_fa3": FA3Peer}
