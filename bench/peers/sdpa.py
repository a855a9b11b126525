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
"""

from .common import Peer, Prepared, Unavailable

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

    def prepare(self, data, mode):
        import torch
        sh = data.shape
        t = data.table
        nb, bs, H, D = t.nblocks, sh.block, sh.heads, sh.head_dim
        padded = data.padded_sets()
        views = [tuple(x.view(nb, bs, H, D).transpose(1, 2) for x in s) for s in padded]
        need_mask = (not sh.causal) and bool((t.lens < bs).any())
        mask = None
        note = "padded [nblocks, H, %d, D] (copy outside the timed region)" % bs
        exact = "all"
        if need_mask and self.takes_mask:
            lens = torch.from_numpy(t.lens).to(data.device)
            mask = (torch.arange(bs, device=data.device)[None, :] < lens[:, None]).view(nb, 1, 1, bs)
        F, be, causal = self.F, self.be, sh.causal

        def call(i, m):
            q, k, v = views[i]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)

        if mask is not None:
            try:
                with self.sdpa_kernel([be]):
                    call(0, mask)
                    torch.cuda.synchronize()
                note += "; key-padding mask [nblocks,1,1,%d]" % bs
            except RuntimeError as e:
                if "CUDA error" in str(e) or "illegal" in str(e):
                    raise
                mask = None
                note += "; mask rejected (%s)" % str(e).splitlines()[0][:120]
        if need_mask and mask is None:
            note += "; " + _NOTE_UNMASKED
            exact = "full_blocks"

        pmap = data.padded_map()

        def rows(out, idx):  # out: [nb, H, bs, D] -> [len(idx), H, D]
            p = pmap[idx]
            return out.transpose(1, 2)[p // bs, p % bs]

        def run(i):
            return call(i, mask)

        ctx = lambda: self.sdpa_kernel([be])  # noqa: E731
        return Prepared(run, rows, config=self.backend, note=note, exact=exact, context=ctx,
                        extra={"padded_rows": nb * bs})


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
