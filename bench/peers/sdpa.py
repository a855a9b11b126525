# SPDX-License-Identifier: BSD-3-Clause
"""torch scaled_dot_product_attention with one backend forced (FlashAttention-2,
cuDNN, memory-efficient), on blocks as a dense batch [nblocks, H, block, D].

The packed inputs are copied once, outside the timed region, into a padded
layout (block i in rows [i*block, (i+1)*block), zeros past its length) that
is viewed as [nblocks, H, block, D] without a copy. Exactness:
  * causal: exact (a valid query never sees a padded key);
  * non-causal, lengths all multiples of the block: exact;
  * otherwise the padded keys must be masked: cuDNN and memory-efficient get
    a key-padding mask [nblocks, 1, 1, block] (broadcast, a few MB); flash
    takes no mask, so it runs unmasked and its error is measured on full
    blocks only (noted in its row). Should cuDNN reject the mask, it runs
    unmasked too, with the same note.

Backward (pass bwd) and the rotary pipeline (pass rot): autograd through the
same call on padded leaves (common.autograd_backward / autograd_rotary);
padded rows get a zero output gradient, so they add nothing to dK and dV.
"""

from .common import Differentiable, Peer, Prepared, Unavailable, is_cuda_failure

_NOTE_UNMASKED = "padded, partial blocks unmasked: exact on full blocks only (error measured there)"


class SdpaPeer(Peer):
    backend = None  # SDPBackend member name
    takes_mask = True

    def setup(self, mode):
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            import torch.nn.functional as F
        except Exception as e:
            raise Unavailable("torch.nn.attention.sdpa_kernel: %s" % e)
        self.sdpa_kernel, self.F = sdpa_kernel, F
        self.be = getattr(SDPBackend, self.backend)

    def _mask(self, data, call):
        """(mask or None, note, exact) for a shape; call(mask) runs the
        forward once to see whether the backend takes the mask."""
        import torch
        sh, t = data.shape, data.table
        nb, bs = t.nblocks, sh.block
        need_mask = (not sh.causal) and bool((t.lens < bs).any())
        mask = None
        note = "padded [nblocks, H, %d, D] (copy outside the timed region)" % bs
        exact = "all"
        if need_mask and self.takes_mask:
            lens = torch.from_numpy(t.lens).to(data.device)
            mask = (torch.arange(bs, device=data.device)[None, :] < lens[:, None]).view(nb, 1, 1, bs)
        if mask is not None:
            try:
                with self.sdpa_kernel([self.be]):
                    call(mask)
                    torch.cuda.synchronize()
                note += "; key-padding mask [nblocks,1,1,%d]" % bs
            except RuntimeError as e:
                if is_cuda_failure(e):
                    raise
                mask = None
                note += "; mask rejected (%s)" % str(e).splitlines()[0][:120]
        if need_mask and mask is None:
            note += "; " + _NOTE_UNMASKED
            exact = "full_blocks"
        return mask, note, exact

    def _views(self, data):
        sh, nb = data.shape, data.table.nblocks
        bs, H, D = sh.block, sh.heads, sh.head_dim
        return lambda x: x.view(nb, bs, H, D).transpose(1, 2)

    def _out_rows(self, data):
        bs = data.shape.block
        pmap = data.padded_map()

        def rows(out, idx):  # out: [nb, H, bs, D] -> [len(idx), H, D]
            p = pmap[idx]
            return out.transpose(1, 2)[p // bs, p % bs]
        return rows

    def prepare(self, data, mode):
        sh = data.shape
        view = self._views(data)
        views = [tuple(view(x) for x in s) for s in data.padded_sets()]
        F, causal = self.F, sh.causal

        def call(i, m):
            q, k, v = views[i]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)

        mask, note, exact = self._mask(data, lambda m: call(0, m))

        def run(i):
            return call(i, mask)

        ctx = lambda: self.sdpa_kernel([self.be])  # noqa: E731
        return Prepared(run, self._out_rows(data), config=self.backend, note=note, exact=exact,
                        context=ctx, extra={"padded_rows": data.table.nblocks * sh.block})

    def differentiable(self, data, mode):
        sh = data.shape
        view = self._views(data)
        F, causal = self.F, sh.causal
        q0, k0, v0 = (view(x) for x in data.padded_sets()[0])
        mask, note, exact = self._mask(
            data, lambda m: F.scaled_dot_product_attention(q0, k0, v0, attn_mask=m,
                                                           is_causal=causal))

        def attention(q, k, v):  # padded leaves [nb * bs, H, D]
            return F.scaled_dot_product_attention(view(q), view(k), view(v), attn_mask=mask,
                                                  is_causal=causal)

        return Differentiable(attention, "padded", self._out_rows(data), dout_view=view,
                              config=self.backend, note=note + "; autograd", exact=exact,
                              context=lambda: self.sdpa_kernel([self.be]),
                              extra={"padded_rows": data.table.nblocks * sh.block})


class SdpaFlash(SdpaPeer):
    name = "sdpa_flash"
    description = "SDPA FLASH_ATTENTION (FA2) on padded blocks"
    backend = "FLASH_ATTENTION"
    takes_mask = False


class SdpaCudnn(SdpaPeer):
    name = "sdpa_cudnn"
    description = "SDPA CUDNN_ATTENTION on padded blocks"
    backend = "CUDNN_ATTENTION"


class SdpaEfficient(SdpaPeer):
    name = "sdpa_efficient"
    description = "SDPA EFFICIENT_ATTENTION (xformers/cutlass) on padded blocks"
    backend = "EFFICIENT_ATTENTION"


PEERS = {p.name: p for p in (SdpaFlash, SdpaCudnn, SdpaEfficient)}
