# SPDX-License-Identifier: BSD-3-Clause
"""The ceilings measured in the same run, and the environment record.

  copy        dst.copy_(src), 2 GiB each way: bytes read + written
  r3w1        Triton o = a + b + c over flat bf16 buffers (the forward's traffic)
  r4w3        Triton x = a + b, y = c + d, z = a + d (the backward's traffic, later)
  matmul      bf16 8192^3 torch.matmul: dense tensor-core ceiling (TFLOP/s)
  same:ID     r3w1 (a forward) or r4w3 (a backward) over exactly the tensors of
              task ID (shape/pass): its least bytes, moved by a stream kernel
              with nothing else to do (measure_same_size)

The forward rows are compared with max(copy, r3w1) bandwidth. The 4 GiB
stream runs hide a launch's start and its last wave; a pass of a few
hundred megabytes cannot, and its same-size stream says how near the
memory system lets any kernel of that size come.
"""

import platform

from .common import cuda_time

_kernels = None


def stream_kernels():
    global _kernels
    if _kernels is not None:
        return _kernels
    import triton
    import triton.language as tl

    @triton.jit
    def r3w1(A, B, C, O, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        a = tl.load(A + offs, mask=m)
        b = tl.load(B + offs, mask=m)
        c = tl.load(C + offs, mask=m)
        tl.store(O + offs, a + b + c, mask=m)

    @triton.jit
    def r4w3(A, B, C, D, X, Y, Z, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N
        a = tl.load(A + offs, mask=m)
        b = tl.load(B + offs, mask=m)
        c = tl.load(C + offs, mask=m)
        d = tl.load(D + offs, mask=m)
        tl.store(X + offs, a + b, mask=m)
        tl.store(Y + offs, c + d, mask=m)
        tl.store(Z + offs, a + d, mask=m)

    _kernels = (r3w1, r4w3)
    return _kernels


def environment():
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": None, "triton": None}
    try:
        env["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception as e:
        env["triton"] = "unavailable (%s)" % e
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm_count=p.multi_processor_count,
                   memory_gib=round(p.total_memory / 2**30, 1),
                   capability="%d.%d" % (p.major, p.minor))
        l2 = getattr(p, "L2_cache_size", None)
        if l2:
            env["l2_mib"] = round(l2 / 2**20, 1)
    try:
        import torch.nn.attention as A
        env["flash_impls"] = list(A.list_flash_attention_impls()) if hasattr(A, "list_flash_attention_impls") else None
        env["flash_impl_active"] = A.current_flash_attention_impl() if hasattr(A, "current_flash_attention_impl") else None
    except Exception as e:
        env["flash_impls"] = "error: %s" % e
    return env


def _best_stream(kernel, args, n, mode):
    """Time a stream kernel over a few tile sizes; returns (ms, config)."""
    import triton
    cands = [(1024, 4), (4096, 8)] if mode == "quick" else [(1024, 4), (2048, 8), (4096, 8), (8192, 16)]
    best = None
    for block, warps in cands:
        grid = (triton.cdiv(n, block),)
        f = lambda i: kernel[grid](*args, n, BLOCK=block, num_warps=warps)  # noqa: E731
        f(0)
        med, _, _ = cuda_time(f, 1, 20, warmup=2)
        if best is None or med < best[0]:
            best = (med, "BLOCK=%d num_warps=%d" % (block, warps))
    return best


# the stream kernel and tensor count of a pass's least traffic (rot: none)
_SAME_SIZE = {"fwd": (0, 3, 1), "bwd": (1, 4, 3)}


def same_size_name(task_id):
    """The ceiling record's name for a task (shape id/pass)."""
    return "same:" + task_id


def measure_same_size(tasks, mode, emit):
    """For each forward or backward task, the stream kernel of its traffic
    (3 reads and a write, or 4 and 3) over tensors of exactly its tokens x
    heads x head_dim elements; emits one ceiling record a task (tasks of one
    pass and size share one timing). One set of buffers, not rotated: the
    ads shapes' tensors (150 MB and more each) leave the L2 nothing to
    reuse; the smoke shapes' fit in it (there it is no ceiling)."""
    import torch
    dev = "cuda"
    seen = {}
    for task in tasks:
        if task.pass_ not in _SAME_SIZE:
            continue
        s = task.shape
        n = int(s.lengths().sum()) * s.heads * s.head_dim
        which, reads, writes = _SAME_SIZE[task.pass_]
        key = (task.pass_, n)
        try:
            if key not in seen:
                bufs = [torch.empty(n, dtype=torch.bfloat16, device=dev)
                        for _ in range(reads + writes)]
                for b in bufs[:reads]:
                    b.zero_()
                seen[key] = _best_stream(stream_kernels()[which], bufs, n, mode)
                del bufs
                torch.cuda.empty_cache()
            med, cfg = seen[key]
            b = 2.0 * n * (reads + writes)
            rec = {"ms": med, "bytes": b, "tbps": b / med / 1e9,
                   "config": "%d x %d elements, %s" % (reads + writes, n, cfg), "ok": True}
        except Exception as e:
            rec = {"ok": False, "error": "%s: %s" % (type(e).__name__,
                                                     str(e).splitlines()[0] if str(e) else "")}
            torch.cuda.empty_cache()
        rec.update(type="ceiling", name=same_size_name(task.id))
        emit(rec)


def measure(mode, emit):
    """Measure each ceiling and emit({"type": "ceiling", ...}) per result;
    a failure is emitted as an error and the others still run."""
    import torch
    dev = "cuda"
    gib = 1 << 30

    def one(name, fn):
        try:
            rec = fn()
            rec.update(type="ceiling", name=name, ok=True)
        except Exception as e:
            rec = {"type": "ceiling", "name": name, "ok": False,
                   "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
        emit(rec)
        torch.cuda.empty_cache()

    def copy():
        n = 2 * gib // 2
        src = torch.empty(n, dtype=torch.bfloat16, device=dev).normal_()
        dst = torch.empty_like(src)
        med, lo, _ = cuda_time(lambda i: dst.copy_(src), 1, 30)
        b = 2.0 * n * 2
        return {"ms": med, "bytes": b, "tbps": b / med / 1e9, "config": "2 GiB bf16"}

    def r3w1():
        n = gib // 2
        bufs = [torch.empty(n, dtype=torch.bfloat16, device=dev).normal_() for _ in range(3)]
        out = torch.empty_like(bufs[0])
        med, cfg = _best_stream(stream_kernels()[0], (*bufs, out), n, mode)
        b = 4.0 * n * 2
        return {"ms": med, "bytes": b, "tbps": b / med / 1e9, "config": "4 x 1 GiB, " + cfg}

    def r4w3():
        n = gib // 2
        ins = [torch.empty(n, dtype=torch.bfloat16, device=dev).normal_() for _ in range(4)]
        outs = [torch.empty_like(ins[0]) for _ in range(3)]
        med, cfg = _best_stream(stream_kernels()[1], (*ins, *outs), n, mode)
        b = 7.0 * n * 2
        return {"ms": med, "bytes": b, "tbps": b / med / 1e9, "config": "7 x 1 GiB, " + cfg}

    def matmul():
        n = 8192
        a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
        bm = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
        c = torch.empty(n, n, dtype=torch.bfloat16, device=dev)
        med, lo, _ = cuda_time(lambda i: torch.matmul(a, bm, out=c), 1, 20, warmup=5)
        f = 2.0 * n ** 3
        return {"ms": med, "flops": f, "tflops": f / med / 1e9, "config": "bf16 8192^3"}

    one("copy", copy)
    one("r3w1", r3w1)
    one("r4w3", r4w3)
    one("matmul", matmul)
