# SPDX-License-Identifier: BSD-3-Clause
"""attngen's block attention through its jagged kernels, each block one
jagged sequence (the binding's ATTNGEN_BLOCK_VIA_JAGGED route, here on for
every block size): what the route would give blocks past 128 tokens, where
the block pattern's backward walks a block in chunks (issue 19).

  fwd  the route as block_attention takes it: the blocks' jagged offsets
       built on the device, then the jagged forward (out and logsumexp)
  bwd  the jagged backward kernels alone (ag_jagged_backward through the
       binding), dout given; the blocks' offsets and the forward's out and
       logsumexp made before the timing (the backward needs them)
"""

import time

from .attngen_peer import AttngenPeer, _diagnostics
from .common import Prepared, PreparedGrad, Unavailable, packed_rows


class AttngenJaggedRoutePeer(AttngenPeer):
    name = "attngen_jagged"
    description = "attngen jagged kernels, one jagged sequence a block"

    def precompile(self, tasks):
        return 0.0  # built per shape in prepare (few shapes use this peer)

    def _kernel(self, sh, backward):
        import torch
        ag = self.attngen
        t0 = time.perf_counter()
        try:
            kernel = ag.jagged_kernel_for(sh.head_dim, sh.dtype, sh.causal, None, None, False,
                                          backward=backward)
            kernel.handle(torch.cuda.current_device())
        except ag.UnsupportedError as e:
            raise Unavailable("jagged kernel not supported (%s)" % _diagnostics(e))
        return kernel, time.perf_counter() - t0

    def prepare(self, data, mode):
        from attngen import ops
        sh = data.shape
        kernel, compile_s = self._kernel(sh, False)
        sets, offsets = data.sets, data.offsets

        def run(i):
            q, k, v = sets[i]
            return ops._block_via_jagged(q, k, v, offsets, None, sh.block, sh.causal, None,
                                         None, None, False)

        return Prepared(run, packed_rows, config=kernel.name + " (blocks as sequences)",
                        extra=self._extra(kernel, compile_s))

    def prepare_backward(self, data, mode):
        import torch
        from attngen import jagged, ops
        sh = data.shape
        kernel, compile_s = self._kernel(sh, True)
        sets, douts, offsets = data.sets, data.dout_sets(), data.offsets
        q0 = sets[0][0]
        cu = ops.block_cu_seqlens(torch, offsets, int(q0.shape[0]), sh.block)
        batch = int(cu.shape[0]) - 1
        fwd = [jagged._forward_raw(kernel, q, k, v, cu, cu, batch) for q, k, v in sets]

        def run(i):
            q, k, v = sets[i]
            out, lse = fwd[i]
            return jagged._backward_raw(kernel, douts[i], q, k, v, out, lse, cu, cu, batch)

        return PreparedGrad(run, packed_rows, config=kernel.name + " (blocks as sequences)",
                            note="the jagged backward kernels alone, blocks as sequences",
                            extra=self._extra(kernel, compile_s))


    def prepare_rotary(self, data, mode):
        raise Unavailable("the route's rotary pipeline is not timed by this peer (the "
                          "attngen peer's rotary pass runs the block kernels)")


PEER = AttngenJaggedRoutePeer
