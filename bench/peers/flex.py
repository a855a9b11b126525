# SPDX-License-Identifier: BSD-3-Clause
"""FlexAttention (torch.compile'd) with a block-diagonal BlockMask.

Layout: the padded tokens as one sequence [1, H, nblocks*block, D] (a view,
no copy). The BlockMask is built directly from its block lists
(BlockMask.from_kv_blocks): query block i sees key block i only; full blocks
go in the "full" lists (no mask_mod evaluated), partial or causal blocks in
the masked lists with a mask_mod that hides padded keys (and future keys
when causal). create_block_mask over the whole sequence would evaluate
(nblocks*block)^2 pairs, which is infeasible at ads scale; a padded batch
[nblocks, H, block, D] would put nblocks in grid.y (<= 65,535). The
mask-creation time is reported separately (extra.block_mask_ms); the compile
time of the first call is extra.first_call_s.

Backward and the rotary pipeline: autograd through the same compiled call on
padded leaves. The backward needs the BlockMask's transposed (query-side)
block lists; for a block-diagonal mask they equal the key-side ones, so they
are set directly instead of computed (from_kv_blocks would transpose a dense
nblocks^2 matrix). The backward's tiles are asked to divide the block
(BLOCK_M1 = BLOCK_N2 = min(32, block), BLOCK_N1 = BLOCK_M2 = min(64, block));
if the compiler rejects them, the forward's tiles alone, then no
kernel_options at all (the compiler's choice; noted with why).
torch.compile runs in its default mode.
torch._functorch.config.donated_buffer is turned off so that the compiled
backward accepts retain_graph=True.
"""

import inspect
import time

from .common import Differentiable, Peer, Prepared, Unavailable, is_cuda_failure


def block_lists_mask(BlockMask, blen, bs, causal, gran=None):
    """A block-diagonal BlockMask over one padded sequence of len(blen)
    blocks of bs tokens (blen: int32 real tokens of each block, on the
    device), built from block lists (no dense pass). gran (a multiple of
    bs; default bs): the mask's block size. At gran == bs query block i
    sees key block i only, whole blocks in the "full" lists (no mask_mod
    evaluated), partial or causal ones in the masked lists. At gran > bs
    (FlexAttention's backward tiles are 128 by default and must divide the
    mask's blocks; at 64 the compiler found no valid choice for the
    backward, 2026-12-04) each mask block holds gran / bs pattern blocks and
    is masked: the mask_mod keeps pairs of one pattern block, so the kernel
    computes gran / bs times the pairs it keeps. Returns (mask,
    [(tensor, dim)] whose size changes from shape to shape)."""
    import torch
    gran = gran or bs
    nb = int(blen.shape[0])
    S = nb * bs
    ng = -(-S // gran)
    dev = blen.device
    idx = torch.arange(ng, dtype=torch.int32, device=dev).view(1, 1, ng, 1)
    if gran == bs and not causal:
        full = blen == bs
    else:
        full = torch.zeros(ng, dtype=torch.bool, device=dev)
    kv_num = (~full).to(torch.int32).view(1, 1, ng)
    full_num = full.to(torch.int32).view(1, 1, ng)

    def mask_mod(b, h, q_idx, kv_idx):
        # the pairs of one pattern block (the block lists alone say so only
        # at gran == bs, and eager flex_attention reads no block lists)
        blk = q_idx // bs
        ok = (kv_idx // bs == blk) & ((kv_idx - blk * bs) < blen[blk])
        if causal:
            ok = ok & (kv_idx <= q_idx)
        return ok

    bm = BlockMask.from_kv_blocks(
        kv_num, idx, full_num, idx, BLOCK_SIZE=(gran, gran), mask_mod=mask_mod,
        seq_lengths=(S, S), compute_q_blocks=False)
    # Block-diagonal: query block i is seen by key block i only, with the
    # same full/partial split, so the transposed lists (which the backward
    # reads) are the same tensors.
    bm.q_num_blocks, bm.q_indices = kv_num, idx
    bm.full_q_num_blocks, bm.full_q_indices = full_num, idx
    return bm, [(kv_num, 2), (full_num, 2), (idx, 2), (blen, 0)]


class FlexPeer(Peer):
    name = "flex"
    description = "FlexAttention, compiled, block-diagonal BlockMask from block lists"

    def setup(self, mode):
        import torch
        try:
            from torch.nn.attention.flex_attention import BlockMask, flex_attention
        except Exception as e:
            raise Unavailable("flex_attention: %s" % e)
        params = inspect.signature(BlockMask.from_kv_blocks).parameters
        if "compute_q_blocks" not in params:
            raise Unavailable("BlockMask.from_kv_blocks lacks compute_q_blocks (needed to avoid a "
                              "dense nblocks^2 transpose): %s" % inspect.signature(BlockMask.from_kv_blocks))
        self.BlockMask = BlockMask
        # One compile per head_dim plus one dynamic-shape recompile is
        # expected; never fall back to eager flex (dense, infeasible here).
        cfg = torch._dynamo.config
        for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(cfg, knob):
                setattr(cfg, knob, max(getattr(cfg, knob), 256))
        self.flex = torch.compile(flex_attention)
        self.compiled_for = set()
        # (shape key, _opts_key) -> why the compiler refused those kernel_options there
        self.rejected_opts = {}

    @staticmethod
    def _opts_key(opts):
        return ",".join("%s=%d" % kv for kv in sorted(opts.items())) or "none"

    def _block_mask(self, data, gran=None):
        """The block-diagonal BlockMask of data's padded layout, built from
        its block lists and timed: (mask, milliseconds, [(tensor, dim)] whose
        size changes from shape to shape, for maybe_mark_dynamic). gran: the
        mask's block size (default: the pattern's block; see
        block_lists_mask)."""
        import torch
        sh, t = data.shape, data.table
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        blen = torch.from_numpy(t.lens).to(device=data.device, dtype=torch.int32)
        bm, sized = block_lists_mask(self.BlockMask, blen, sh.block, sh.causal, gran)
        torch.cuda.synchronize()
        return bm, (time.perf_counter() - t0) * 1e3, sized

    def prepare(self, data, mode):
        import torch
        sh = data.shape
        t = data.table
        nb, bs, H, D = t.nblocks, sh.block, sh.heads, sh.head_dim
        S = nb * bs
        padded = data.padded_sets()
        views = [tuple(x.view(S, H, D).permute(1, 0, 2).unsqueeze(0) for x in s) for s in padded]
        bm, mask_ms, sized = self._block_mask(data)

        # Sizes that change from shape to shape are dynamic from the first
        # compile (one compile per head_dim instead of a static one then a
        # dynamic recompile); "maybe" lets the compiler specialize if it must.
        mark = getattr(torch._dynamo, "maybe_mark_dynamic", None)
        if mark is not None:
            for qkv in views:
                for x in qkv:
                    mark(x, 2)
            for x, dim in sized:
                mark(x, dim)

        opts = {"BLOCK_M": bs, "BLOCK_N": bs}
        flex = self.flex

        def run(i):
            q, k, v = views[i]
            return flex(q, k, v, block_mask=bm, kernel_options=opts)

        t0 = time.perf_counter()
        run(0)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0

        pmap = data.padded_map()

        def rows(out, idx_):  # out: [1, H, S, D] -> [len(idx_), H, D]
            return out[0].index_select(1, pmap[idx_]).transpose(0, 1)

        return Prepared(run, rows, config="BLOCK_M=N=%d" % bs,
                        note="padded one sequence; block mask from block lists",
                        extra={"block_mask_ms": round(mask_ms, 2), "first_call_s": round(first_s, 2)})


    def differentiable(self, data, mode):
        import torch
        sh = data.shape
        t = data.table
        nb, bs, H, D = t.nblocks, sh.block, sh.heads, sh.head_dim
        S = nb * bs
        try:
            torch._functorch.config.donated_buffer = False
        except AttributeError:
            pass
        mark = getattr(torch._dynamo, "maybe_mark_dynamic", None)
        masks = {}  # mask block size -> (mask, milliseconds)

        def mask_for(gran):
            if gran not in masks:
                bm_, ms_, sized = self._block_mask(data, gran)
                if mark is not None:
                    for x, dim in sized:
                        mark(x, dim)
                masks[gran] = (bm_, ms_)
            return masks[gran][0]

        flex = self.flex
        fwd_opts = {"BLOCK_M": bs, "BLOCK_N": bs}
        m, n = min(32, bs), min(64, bs)
        bwd_opts = dict(fwd_opts, BLOCK_M1=m, BLOCK_N1=n, BLOCK_M2=n, BLOCK_N2=m)
        # Tried in order until one compiles: the tiles above, the forward's
        # alone, then none (the compiler's own choice, as a user who passes
        # no kernel_options gets), each over a mask of the pattern's blocks;
        # last the compiler's choice over a mask of 128-token blocks (its
        # default backward tiles must divide the mask's blocks: with 64-token
        # ones every way failed on the H200 on 2026-12-04, bench/flex_probe.py).
        # Ways rejected for one shape are not tried again.
        coarse = 128 if bs < 128 and 128 % bs == 0 else None
        shape_key = "D%d/block%d" % (D, bs)  # refusals depend on the tile shapes' fit
        ways = [(bwd_opts, None), (fwd_opts, None), ({}, None)] + ([({}, coarse)] if coarse else [])

        def way_key(w):
            return self._opts_key(w[0]) + ("/mask%d" % w[1] if w[1] else "")

        candidates = [w for w in ways if (shape_key, way_key(w)) not in self.rejected_opts]
        mine = sorted((k[1], why) for k, why in self.rejected_opts.items() if k[0] == shape_key)
        if not candidates:
            raise RuntimeError("flex: every kernel_options set was rejected at %s: %s"
                               % (shape_key, "; ".join("%s (%s)" % kv for kv in mine)))
        chosen = {"opts": candidates[0][0], "mask": None}

        def view(x):  # padded [S, H, D] -> [1, H, S, D]
            v = x.view(S, H, D).permute(1, 0, 2).unsqueeze(0)
            if mark is not None:
                mark(v, 2)
            return v

        def attention(q, k, v):
            return flex(view(q), view(k), view(v), block_mask=chosen["mask"],
                        kernel_options=chosen["opts"])

        # The first forward + backward compiles both; try the tiles above,
        # else let the compiler choose.
        t0 = time.perf_counter()

        def probe():
            leaves = [x.detach().requires_grad_() for x in data.padded_sets()[0]]
            out = attention(*leaves)
            torch.autograd.grad(out, leaves, torch.ones_like(out))

        first_error = None
        for way in candidates:
            chosen["opts"], chosen["mask"] = way[0], mask_for(way[1])
            try:
                probe()
                break
            except Exception as e:
                if is_cuda_failure(e):
                    raise
                first_error = first_error or e
                self.rejected_opts[(shape_key, way_key(way))] = "%s: %s" % (
                    type(e).__name__, str(e).splitlines()[0][:100])
        else:
            raise first_error  # no options compiled: not the tiles, report the first error
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0

        pmap = data.padded_map()

        def rows(out, idx_):  # out: [1, H, S, D] -> [len(idx_), H, D]
            return out[0].index_select(1, pmap[idx_]).transpose(0, 1)

        note = "padded one sequence; block mask from block lists; autograd; torch.compile default mode"
        mine = sorted((k[1], why) for k, why in self.rejected_opts.items() if k[0] == shape_key)
        if mine:
            note += "; rejected kernel_options: %s" % "; ".join("%s (%s)" % kv for kv in mine)
        cfg = ", ".join("%s=%d" % kv for kv in sorted(chosen["opts"].items())) or \
            "kernel_options left to the compiler"
        gran = next(g for g, (b, _) in masks.items() if b is chosen["mask"])
        if gran:
            cfg += "; mask blocks of %d tokens (%dx the pairs kept)" % (gran, gran // bs)
        mask_ms = masks[gran][1]
        return Differentiable(attention, "padded", rows, dout_view=view, config=cfg, note=note,
                              extra={"block_mask_ms": round(mask_ms, 2),
                                     "first_call_s": round(first_s, 2)})


PEER = FlexPeer
