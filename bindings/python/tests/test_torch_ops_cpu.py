# SPDX-License-Identifier: BSD-3-Clause
"""attngen's torch.library custom ops without a GPU (needs real torch; skips
without it): their schemas, rotary's canonical text, the FLOP counts
against brute force, and torch.compile(fullgraph=True) tracing the public
functions forward and backward through the ops, on fake tensors (nothing
runs: the graphs are captured, their outputs come from the fake
implementations). test_gpu_torch_ops.py runs them for real."""

import itertools
import os
import subprocess
import sys

import pytest

from attngen import _flops, torch_ops

torch = pytest.importorskip("torch")

import attngen  # noqa: E402


def _python(code):
    """stdout of `code` in a fresh interpreter (this one's import path), which
    must succeed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


# ---- rotary text --------------------------------------------------------------------

@pytest.mark.parametrize("rotary", [
    None,
    {"layout": "half", "apply_to": ("q", "k"), "positions": "table", "base": None},
    {"layout": "interleaved", "apply_to": ("q", "k", "v"), "positions": "sequence",
     "base": 500000.0},
    {"layout": "half", "apply_to": ("v",), "positions": "block", "base": 1e4},
])
def test_rotary_text_round_trip(rotary):
    text = torch_ops.rotary_text(rotary)
    assert torch_ops.rotary_from_text(text) == rotary
    assert (text == "") == (rotary is None)


def test_rotary_text_malformed():
    with pytest.raises(ValueError, match="malformed rotary text"):
        torch_ops.rotary_from_text("layout=half;positions=table")


# ---- FLOP counts ------------------------------------------------------------------------

def _brute_jagged(lens_q, lens_k, causal, window):
    pairs = 0
    for lq, lk in zip(lens_q, lens_k):
        d = lk - lq
        for i in range(lq):
            for j in range(lk):
                if causal and j > i + d:
                    continue
                if window is not None and not (i + d - window[0] <= j <= i + d + window[1]):
                    continue
                pairs += 1
    return pairs


def _offsets(lens):
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, (5, 0)),
                                           (False, (3, 7)), (False, (0, 0))])
def test_jagged_pairs_brute_force(causal, window):
    lens_q = [0, 1, 17, 5, 30, 2, 0, 9]
    lens_k = [3, 0, 17, 40, 11, 2, 6, 1]
    got = _flops.jagged_pairs(torch, torch.tensor(lens_q), torch.tensor(lens_k), causal, window)
    assert got == _brute_jagged(lens_q, lens_k, causal, window)


@pytest.mark.parametrize("block,causal", [(64, False), (64, True), (48, False), (100, True)])
def test_block_pairs_brute_force(block, causal):
    lens = [0, 1, 63, 64, 65, 200, 129]
    want = 0
    for n in lens:
        for start in range(0, n, block):
            b = min(block, n - start)
            want += b * (b + 1) // 2 if causal else b * b
    assert _flops.block_pairs(torch, _offsets(lens), block, causal) == want


def test_flop_formulas_registered_and_counted():
    from torch.utils.flop_counter import flop_registry
    attngen.register_custom_ops()
    ops = torch.ops.attngen
    q = torch.empty(50, 4, 64)
    lens = [10, 0, 40]
    cu = _offsets(lens)
    fwd = flop_registry[ops.jagged_attention]
    n = fwd(q, q, q, cu, cu, True, -1, -1, None, False, "", None, None, False, out_val=None)
    assert n == 4 * 64 * 4 * _brute_jagged(lens, lens, True, None)
    bwd = flop_registry[ops.jagged_attention_backward]
    assert bwd(q, q, q, q, q, q, cu, cu, True, -1, -1, out_val=None) == int(2.5 * n)
    n = flop_registry[ops.block_attention](q, q, q, cu, 16, False, None, "", None, False,
                                          out_val=None)
    assert n == 4 * 64 * 4 * (16 * 16 * 2 + 10 * 10 + 8 * 8)
    nq = torch.empty(7, 4, 64)
    n = flop_registry[ops.broadcast_attention](nq, q, q, cu, False, 3, 2, None, False, "", None,
                                              None, False, out_val=None)
    assert n == 4 * 64 * 4 * _brute_jagged([7] * 3, lens, False, (3, 2))


def test_flop_formulas_registered_when_flop_counter_comes_later():
    """The formulas wait for torch.utils.flop_counter's import (it costs
    ~100 ms) and are there once it happens."""
    out = _python("import sys, torch, attngen\n"
                  "assert 'torch.utils.flop_counter' not in sys.modules, 'imported early'\n"
                  "from torch.utils.flop_counter import flop_registry\n"
                  "print(sum('attngen' in str(k) for k in flop_registry))\n")
    assert out == "6"


# ---- schemas ----------------------------------------------------------------------------

def test_ops_and_schemas():
    attngen.register_custom_ops()
    attngen.register_custom_ops()  # idempotent
    s = str(torch.ops.attngen.block_attention.default._schema)
    assert s.startswith("attngen::block_attention(Tensor q, Tensor k, Tensor v, Tensor offsets")
    assert s.endswith("Tensor? rotary_table, bool with_backward) -> Tensor")
    for name in ("jagged_attention", "broadcast_attention"):
        assert str(getattr(torch.ops.attngen, name).default._schema).endswith(
            "-> (Tensor, Tensor)")
    for name in ("block", "jagged", "broadcast"):
        s = str(getattr(torch.ops.attngen, name + "_attention_backward").default._schema)
        assert s.endswith("-> (Tensor, Tensor, Tensor)")
        assert "!" not in s  # nothing mutated


# ---- torch.compile(fullgraph=True) over fake tensors ------------------------------------

def _compile_capture(fn):
    """fn compiled with fullgraph=True by an AOT-autograd backend that keeps
    the forward and backward graphs (and runs them as they are)."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func
    graphs = {"fw": [], "bw": []}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm)
            return make_boxed_func(gm)
        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"))
    return torch.compile(fn, fullgraph=True, backend=backend), graphs


def _targets(gms):
    return [str(n.target) for gm in gms for n in gm.graph.nodes if n.op == "call_function"
            and "attngen" in str(n.target)]


def _fake_inputs(shapes, dtype=torch.bfloat16, grad=True):
    return [torch.empty(s, dtype=dtype, requires_grad=grad) for s in shapes]


def test_compile_block_attention_forward_and_backward():
    from torch._subclasses.fake_tensor import FakeTensorMode
    fn, graphs = _compile_capture(
        lambda q, k, v, off, table: attngen.block_attention(
            q, k, v, off, block_size=32, causal=True, rotary={"layout": "half"},
            rotary_table=table))
    with FakeTensorMode():
        q, k, v = _fake_inputs([(300, 4, 128)] * 3)
        table = torch.empty(300, 128, dtype=torch.bfloat16)
        off = torch.empty(5, dtype=torch.int32)
        out = fn(q, k, v, off, table)
        assert out.shape == (300, 4, 128) and out.dtype == torch.bfloat16
        (out.float() * 2).sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    assert _targets(graphs["fw"]) == ["attngen.block_attention.default"]
    assert _targets(graphs["bw"]) == ["attngen.block_attention_backward.default"]
    fwd = [n for n in graphs["fw"][0].graph.nodes if "attngen" in str(n.target)][0]
    # block 32, causal, default scale, the canonical rotary text, the table, with_backward
    assert fwd.args[4:8] == (32, True, None, "layout=half;apply_to=q,k;positions=table;base=")
    assert fwd.args[9] is True


def test_compile_qkvpacked_traces_the_block_op_on_its_views():
    """block_attention_qkvpacked under torch.compile: the block op on qkv's
    three slices (views in the graph), its gradient one tensor like qkv."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    fn, graphs = _compile_capture(
        lambda qkv, off: attngen.block_attention_qkvpacked(qkv, off, causal=True))
    with FakeTensorMode():
        (qkv,) = _fake_inputs([(300, 3, 4, 128)])
        out = fn(qkv, torch.empty(5, dtype=torch.int32))
        assert out.shape == (300, 4, 128) and out.is_contiguous()
        out.float().sum().backward()
        assert qkv.grad.shape == qkv.shape
    assert _targets(graphs["fw"]) == ["attngen.block_attention.default"]
    assert _targets(graphs["bw"]) == ["attngen.block_attention_backward.default"]


def test_compile_block_attention_grouped_heads():
    """k, v with 2 heads for q's 8: traced through the op, dk and dv in k's
    and v's shape."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    fn, graphs = _compile_capture(lambda q, k, v, off: attngen.block_attention(q, k, v, off))
    with FakeTensorMode():
        q, k, v = _fake_inputs([(300, 8, 64), (300, 2, 64), (300, 2, 64)])
        out = fn(q, k, v, torch.empty(5, dtype=torch.int32))
        assert out.shape == q.shape
        out.float().sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    assert _targets(graphs["bw"]) == ["attngen.block_attention_backward.default"]


def test_compile_block_attention_without_grad_has_no_backward():
    from torch._subclasses.fake_tensor import FakeTensorMode
    fn, graphs = _compile_capture(lambda q, k, v, off: attngen.block_attention(q, k, v, off))
    with FakeTensorMode():
        q, k, v = _fake_inputs([(100, 2, 64)] * 3, torch.float16, grad=False)
        out = fn(q, k, v, torch.empty(3, dtype=torch.int32))
        assert out.shape == (100, 2, 64) and out.dtype == torch.float16
    fwd = [n for n in graphs["fw"][0].graph.nodes if "attngen" in str(n.target)][0]
    assert fwd.args[9] is False  # the forward-only kernel
    assert not graphs["bw"]


def test_compile_jagged_attention_forward_and_backward():
    from torch._subclasses.fake_tensor import FakeTensorMode
    fn, graphs = _compile_capture(
        lambda q, k, v, cq, ck: attngen.jagged_attention(
            q, k, v, cq, ck, 100, 200, causal=True, window_size=(64, 0), return_lse=True))
    with FakeTensorMode():
        q, = _fake_inputs([(300, 8, 128)])
        k, v = _fake_inputs([(500, 2, 128)] * 2)
        cq, ck = torch.empty(4, dtype=torch.int32), torch.empty(4, dtype=torch.int32)
        out, lse = fn(q, k, v, cq, ck)
        assert out.shape == (300, 8, 128) and lse.shape == (8, 300)
        assert lse.dtype == torch.float32 and not lse.requires_grad
        out.float().sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == (500, 2, 128)
    assert _targets(graphs["fw"]) == ["attngen.jagged_attention.default"]
    assert _targets(graphs["bw"]) == ["attngen.jagged_attention_backward.default"]
    fwd = [n for n in graphs["fw"][0].graph.nodes if "attngen" in str(n.target)][0]
    assert fwd.args[5:11] == (True, 64, 0, None, False, "")


def test_compile_jagged_self_attention_passes_cu_seqlens_q_twice():
    from torch._subclasses.fake_tensor import FakeTensorMode
    fn, graphs = _compile_capture(
        lambda q, k, v, cq: attngen.jagged_attention(q, k, v, cq, deterministic=True))
    with FakeTensorMode():
        q, k, v = _fake_inputs([(64, 4, 64)] * 3, torch.float16)
        fn(q, k, v, torch.empty(3, dtype=torch.int32)).sum().backward()
    fwd = [n for n in graphs["fw"][0].graph.nodes if "attngen" in str(n.target)][0]
    assert fwd.args[3] is fwd.args[4]
    assert fwd.args[9] is True  # deterministic


def test_compile_broadcast_attention_forward_and_backward():
    from torch._subclasses.fake_tensor import FakeTensorMode
    fn, graphs = _compile_capture(
        lambda q, k, v, ck: attngen.broadcast_attention(q, k, v, ck, causal=True))
    with FakeTensorMode():
        q, = _fake_inputs([(32, 4, 128)])
        k, v = _fake_inputs([(1000, 4, 128)] * 2)
        out = fn(q, k, v, torch.empty(11, dtype=torch.int32))
        assert out.shape == (10 * 32, 4, 128)
        out.float().sum().backward()
        assert q.grad.shape == (32, 4, 128) and v.grad.shape == (1000, 4, 128)
    assert _targets(graphs["fw"]) == ["attngen.broadcast_attention.default"]
    assert _targets(graphs["bw"]) == ["attngen.broadcast_attention_backward.default"]


def test_compile_refuses_dropout():
    from torch._subclasses.fake_tensor import FakeTensorMode
    fn, _ = _compile_capture(lambda q, c: attngen.jagged_attention(q, q, q, c, dropout_p=0.1))
    with FakeTensorMode():
        q = torch.empty(8, 1, 64, dtype=torch.bfloat16)
        with pytest.raises(Exception, match="dropout is not supported"):
            fn(q, torch.empty(2, dtype=torch.int32))


def test_dispatch_modes_see_the_op():
    """Eager calls under a TorchDispatchMode (here FakeTensorMode; on a GPU
    FlopCounterMode) go through the custom ops, so the mode sees them."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(q, k, v, ck):
        return attngen.broadcast_attention(q, k, v, ck, return_lse=True)

    with FakeTensorMode():
        q = torch.empty(16, 2, 64, dtype=torch.float16)
        k = torch.empty(90, 2, 64, dtype=torch.float16)
        out, lse = f(q, k, k, torch.empty(4, dtype=torch.int32))
        assert out.shape == (48, 2, 64) and lse.shape == (2, 48)
    gm = make_fx(f, tracing_mode="fake")(q, k, k, torch.empty(4, dtype=torch.int32))
    assert _targets([gm]) == ["attngen.broadcast_attention.default"]


def test_compile_self_attention_needs_equal_token_counts():
    """cu_seqlens_k None under tracing: the op would get cu_seqlens_q for the
    keys too, so k with another token count is refused as in eager."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    fn, _ = _compile_capture(lambda q, k, c: attngen.jagged_attention(q, k, k, c))
    with FakeTensorMode():
        q = torch.empty(8, 1, 64, dtype=torch.bfloat16)
        k = torch.empty(9, 1, 64, dtype=torch.bfloat16)
        with pytest.raises(Exception, match="cu_seqlens_k is None"):
            fn(q, k, torch.empty(2, dtype=torch.int32))


def test_flop_formulas_survive_a_probe_of_flop_counter():
    """A find_spec probe before the real import does not disarm the hook."""
    out = _python("import importlib.util, sys, torch, attngen\n"
                  "assert importlib.util.find_spec('torch.utils.flop_counter') is not None\n"
                  "from torch.utils.flop_counter import flop_registry\n"
                  "print(sum('attngen' in str(k) for k in flop_registry))\n"
                  "assert not any(type(f).__name__ == '_PostImport' for f in sys.meta_path)\n")
    assert out == "6"


def test_dispatch_mode_registers_ops_when_attngen_came_first():
    """attngen imported before torch: the first call under a dispatch mode
    registers the ops itself."""
    out = _python("import attngen, torch\n"
                  "from torch._subclasses.fake_tensor import FakeTensorMode\n"
                  "with FakeTensorMode():\n"
                  "    q = torch.empty(64, 2, 64, dtype=torch.bfloat16)\n"
                  "    out = attngen.jagged_attention(q, q, q, torch.empty(3, dtype=torch.int32))\n"
                  "print(tuple(out.shape), attngen.torch_ops.registered())\n")
    assert out == "(64, 2, 64) True"


def test_import_leaves_registration_to_compile():
    """Importing attngen after torch registers nothing (about 15 ms that an
    eager process does not need); importing torch._dynamo, as torch.compile
    does, registers the ops."""
    out = _python("import torch, attngen\n"
                  "print(attngen.torch_ops.registered())\n"
                  "import torch._dynamo\n"
                  "print(attngen.torch_ops.registered(), hasattr(torch.ops.attngen, 'jagged_attention'))\n")
    assert out == "False\nTrue True"


@pytest.mark.parametrize("order", ["torch, attngen", "attngen, torch"])
def test_ops_namespace_registers_on_lookup(order):
    """A script that names torch.ops.attngen.* finds the ops, whichever of
    torch and attngen came first."""
    out = _python("import %s\n"
                  "print(attngen.torch_ops.registered())\n"
                  "print(hasattr(torch.ops.attngen, 'block_attention'), "
                  "attngen.torch_ops.registered())\n" % order)
    assert out == "False\nTrue True"


def test_saved_graph_loads_in_a_fresh_process(tmp_path):
    """A graph with attngen's ops, saved with torch.save, loads and runs
    (on fake tensors) in a process that only imported torch and attngen."""
    path = str(tmp_path / "gm.pt")
    _python("import torch, attngen\n"
            "from torch.fx.experimental.proxy_tensor import make_fx\n"
            "q = torch.randn(64, 2, 64, dtype=torch.bfloat16)\n"
            "c = torch.tensor([0, 32, 64], dtype=torch.int32)\n"
            "gm = make_fx(lambda q, c: attngen.jagged_attention(q, q, q, c),\n"
            "             tracing_mode='fake')(q, c)\n"
            "torch.save(gm, %r)\n" % path)
    # (torch's unpickling of a GraphModule needs triton_kernel_wrap imported,
    # attngen or not)
    out = _python("import torch, attngen\n"
                  "import torch._higher_order_ops.triton_kernel_wrap\n"
                  "from torch._subclasses.fake_tensor import FakeTensorMode\n"
                  "gm = torch.load(%r, weights_only=False)\n"
                  "with FakeTensorMode():\n"
                  "    q = torch.empty(64, 2, 64, dtype=torch.bfloat16)\n"
                  "    out = gm(q, torch.empty(3, dtype=torch.int32))\n"
                  "print(tuple(out.shape))\n" % path)
    assert out == "(64, 2, 64)"


def test_registration_racing_an_import_does_not_deadlock():
    """One thread registers (its torch._dynamo import, as torch.compile's)
    while another imports torch.utils.flop_counter: the registering thread
    must not wait for that module while it holds attngen's lock, whose
    hook the importing thread runs (this hung every time before)."""
    out = _python("import os, sys, threading\n"
                  "import torch, attngen\n"
                  "from attngen import torch_ops\n"
                  "entered = threading.Event()\n"
                  "orig = torch_ops._define\n"
                  "def define(t):\n"
                  "    entered.set(); orig(t)\n"
                  "torch_ops._define = define\n"
                  "def a():\n"
                  "    entered.wait()\n"
                  "    import torch.utils.flop_counter\n"
                  "def b():\n"
                  "    import torch._dynamo\n"
                  "ta = threading.Thread(target=a, daemon=True)\n"
                  "tb = threading.Thread(target=b, daemon=True)\n"
                  "ta.start(); tb.start(); ta.join(60); tb.join(60)\n"
                  "from torch.utils.flop_counter import flop_registry\n"
                  "print('HANG' if ta.is_alive() or tb.is_alive() else\n"
                  "      sum('attngen' in str(k) for k in flop_registry))\n"
                  "sys.stdout.flush(); os._exit(0)\n")
    assert out == "6"


def test_flop_formulas_when_registration_meets_a_flop_counter_import():
    """Registration lands while another thread's import of
    torch.utils.flop_counter has found the module but not yet run it: the
    formulas are still registered once it has (they were lost before)."""
    out = _python("import os, sys, threading\n"
                  "import torch, attngen\n"
                  "from attngen import torch_ops\n"
                  "found, go = threading.Event(), threading.Event()\n"
                  "orig = torch_ops._HookedLoader.create_module\n"
                  "def create_module(self, spec):\n"
                  "    if spec.name == 'torch.utils.flop_counter':\n"
                  "        found.set(); go.wait(30)\n"
                  "    return orig(self, spec)\n"
                  "torch_ops._HookedLoader.create_module = create_module\n"
                  "def b():\n"
                  "    import torch.utils.flop_counter\n"
                  "tb = threading.Thread(target=b, daemon=True); tb.start()\n"
                  "found.wait(30)\n"
                  "attngen.register_custom_ops()  # the module found, not yet in sys.modules\n"
                  "go.set(); tb.join(60)\n"
                  "from torch.utils.flop_counter import flop_registry\n"
                  "print(sum('attngen' in str(k) for k in flop_registry))\n"
                  "sys.stdout.flush(); os._exit(0)\n")
    assert out == "6"


def test_hooked_modules_keep_their_loader():
    """The import hooks leave torch._dynamo's loader whole: its resources
    and sources are still there."""
    out = _python("import importlib.resources, torch, attngen\n"
                  "import torch._dynamo\n"
                  "print(any(True for _ in importlib.resources.files('torch._dynamo').iterdir()),\n"
                  "      torch._dynamo.__loader__.is_package('torch._dynamo'))\n")
    assert out == "True True"


def test_import_after_dynamo_registers():
    out = _python("import torch._dynamo, attngen\n"
                  "print(attngen.torch_ops.registered())\n")
    assert out == "True"


def test_compile_with_attngen_imported_before_torch():
    """attngen imported first, torch.compile its first use: the ops are
    there when dynamo traces (fullgraph, fake tensors)."""
    out = _python("import attngen, torch\n"
                  "from torch._subclasses.fake_tensor import FakeTensorMode\n"
                  "fn = torch.compile(lambda q, c: attngen.jagged_attention(q, q, q, c),\n"
                  "                   fullgraph=True, backend='aot_eager')\n"
                  "with FakeTensorMode():\n"
                  "    q = torch.empty(64, 2, 64, dtype=torch.bfloat16)\n"
                  "    out = fn(q, torch.empty(3, dtype=torch.int32))\n"
                  "print(tuple(out.shape), attngen.torch_ops.registered())\n")
    assert out == "(64, 2, 64) True"


def test_a_torch_without_custom_ops_leaves_eager_alone():
    """torch before 2.4 (no torch.library.custom_op): importing attngen warns
    once instead of failing, and nothing tries again."""
    out = _python("import warnings, torch\n"
                  "del torch.library.custom_op\n"
                  "with warnings.catch_warnings(record=True) as w:\n"
                  "    warnings.simplefilter('always')\n"
                  "    import attngen\n"
                  "    attngen.register_custom_ops()\n"
                  "print(len([x for x in w if 'custom ops could not be registered' in str(x.message)]),\n"
                  "      attngen.torch_ops.registered())\n")
    assert out == "1 False"


def test_traced_options_are_checked_as_in_eager():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(16, 1, 64, dtype=torch.bfloat16)
        cu = torch.empty(2, dtype=torch.int32)
        with pytest.raises(ValueError, match="causal must be True or False"):
            attngen.jagged_attention(q, q, q, cu, causal=1)
        with pytest.raises(ValueError, match="window_size must be a pair"):
            attngen.jagged_attention(q, q, q, cu, window_size=(3.9, 0))
        with pytest.raises(ValueError, match="deterministic must be True or False"):
            attngen.broadcast_attention(q, q, q, cu, deterministic="x")
        with pytest.raises(ValueError, match="block_size must be"):
            attngen.block_attention(q, q, q, cu, block_size=40)
