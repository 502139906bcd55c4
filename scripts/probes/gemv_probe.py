"""Probe: can a reduction-style GEMV (no tensor cores, one output row of C) beat cuBLAS at M = 1?

Inductor's max-autotune ran the Llama-3-70B decoder layer at 1 decode token in 0.591 ms against 0.656 ms
for ours and 0.669 for torch in a CUDA graph (docs/BENCHMARKS.md, eleventh session): with coordinate
descent tuning on, Inductor lowers a 1-row mm to a multiply and a sum over K. This probe times such a
kernel (``rows``: a few columns of B per program, all of K; the first probe) and the ``gemv`` variant of
kernels/gemm.py that grew out of it (GEMV_BLOCK_N columns, GEMV_BLOCK_K runs of K), each over a small grid,
against torch.matmul (cuBLAS) and kernels.matmul (the shipped table). (A design with 32-64 columns per
program and K split into slices, timed in the twentieth session's call 3 at 0.95-1.10x, is gone.)
- ``graph``: the tuner's graph timer (one call per replay, L2 flushed before each);
- ``stream``: one CUDA graph of several calls over rotating operands that together overflow L2, no flush,
  the time per call: how a decode step streams one weight after another.

    python3 scripts/probes/gemv_probe.py [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math

import torch
import triton
import triton.language as tl

import kernels
from kernels import Config, gemm
from tuner import timing


@triton.jit
def _gemv(a_ptr, b_ptr, c_ptr, N, K, stride_ak, stride_bk, stride_bn, stride_cn,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptr + kk * stride_ak, mask=kk < K, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + kk[None, :] * stride_bk + rn[:, None] * stride_bn,
                    mask=(kk[None, :] < K) & (rn[:, None] < N), other=0.0).to(tl.float32)
        acc += b * a[None, :]
    c = tl.sum(acc, axis=1)
    tl.store(c_ptr + rn * stride_cn, c.to(c_ptr.dtype.element_ty), mask=rn < N)


def gemv(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bn: int, bk: int, warps: int, stages: int) -> None:
    n, k = b.shape[1], b.shape[0]
    _gemv[(triton.cdiv(n, bn),)](a, b, c, n, k, a.stride(1), b.stride(0), b.stride(1), c.stride(1),
                                 BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)


def stream_ms(calls: list) -> list[float]:
    """Per call ms of each side: one graph per side of every call in ``calls[side]`` (rotating operands)."""
    graphs = []
    for side in calls:
        for f in side:
            f()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in side:
                f()
        graphs.append(g)
    per_replay = timing._graphs_side_by_side(graphs, (25, 200), flush=False)
    return [ms / len(side) for ms, side in zip(per_replay, calls)]


def variant(bn: int, bk: int, warps: int) -> Config:
    """The shipped gemv variant with these blocks."""
    return gemm.SPACE.canonical(Config.make(VARIANT="gemv", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1,
                                            SPLIT_K=1, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False,
                                            GEMV_BLOCK_N=bn, GEMV_BLOCK_K=bk, num_warps=warps, num_stages=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    shapes = [("bf16", 1, 10240, 8192), ("bf16", 1, 8192, 8192), ("bf16", 1, 28672, 8192),
              ("bf16", 1, 8192, 28672), ("bf16", 1, 1024, 8192), ("bf16", 1, 2048, 2048),
              ("fp16", 1, 14336, 4096), ("bf16", 1, 3584, 18944), ("bf16", 1, 576, 2048)]
    rows_grid = [("rows", (bn, bk, w)) for bn, bk, w in itertools.product((1, 2, 4), (512, 1024, 2048), (2, 4))]
    gemv_grid = [("gemv", (bn, bk, w)) for bn, bk, w in itertools.product((1, 2, 4, 8), (1024, 2048, 4096), (2, 4, 8))]
    device = kernels.current_device(torch.device("cuda"))
    l2 = timing.l2_bytes()
    rows = []
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for dtype_name, m, n, k in shapes:
        problem, sets, weights, xs, outs, ref = operands(dtype_name, m, n, k, l2)

        def call(kind, knobs, i):
            if kind == "rows":
                bn, bk, w = knobs
                return lambda: gemv(xs[i], weights[i].t(), outs[i], bn, bk, w, 1)
            config = variant(*knobs)
            return lambda: gemm.matmul_with(config, xs[i], weights[i].t(), out=outs[i])

        def fits(kind: str, knobs: tuple) -> bool:
            if kind == "rows":
                return knobs[1] <= triton.next_power_of_2(k) and knobs[0] * knobs[1] // (32 * knobs[2]) <= 128
            return not gemm.SPACE.violation(variant(*knobs), problem, device)

        best = best_per_kind([c for c in rows_grid + gemv_grid if fits(*c)], call, outs[0], ref)
        sides = baseline_sides(xs, weights) + [(f"{kind} {knobs}", functools.partial(call, kind, knobs))
                                               for kind, (ms, knobs) in sorted(best.items())]
        rows.append(time_sides(problem.key, sides, sets, gb=(n * k + m * k + m * n) * 2 / 1e9))
        weights = xs = outs = []  # free the operands before the next shape
        torch.cuda.empty_cache()
    report(rows, args.json)


def operands(dtype_name: str, m: int, n: int, k: int, l2: int) -> tuple:
    """(problem, sets, weights, xs, outs, reference): enough operand sets (weights [N, K], rows of A, outputs)
    to overflow L2 three times over, and the float32 product of the first set."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    problem = kernels.Problem("matmul", dtype_name, "nt", ((m, n, k),))
    sets = max(2, math.ceil(3 * l2 / (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5 for _ in range(sets)]
    xs = [torch.randn(m, k, device="cuda", dtype=dtype) for _ in range(sets)]
    outs = [torch.empty(m, n, device="cuda", dtype=dtype) for _ in range(sets)]
    return problem, sets, weights, xs, outs, xs[0].float() @ weights[0].float().t()


def best_per_kind(candidates: list[tuple[str, tuple]], call, out: torch.Tensor, ref: torch.Tensor) -> dict:
    """kind -> (ms, knobs) of its fastest candidate that runs and matches ``ref`` (``call(kind, knobs, 0)`` writes
    ``out``), under the graph timer; a candidate that fails to launch (out of resources) is skipped."""
    best: dict[str, tuple[float, tuple]] = {}
    for kind, knobs in candidates:
        try:
            out.fill_(float("nan"))
            call(kind, knobs, 0)()
            torch.cuda.synchronize()
        except Exception as e:  # a probe skips the config
            print(f"  {kind} {knobs}: {type(e).__name__}")
            continue
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        if not err < 2e-2:
            print(f"  {kind} {knobs}: wrong ({err:.3g})")
            continue
        ms = timing.graph_ms_side_by_side([call(kind, knobs, 0)], (5, 20))[0]
        if kind not in best or ms < best[kind][0]:
            best[kind] = (ms, knobs)
    return best


def baseline_sides(xs: list, weights: list) -> list:
    """torch.matmul (cuBLAS) and kernels.matmul (the shipped table) on operand set i."""
    return [("cublas", lambda i: (lambda: torch.matmul(xs[i], weights[i].t()))),
            ("ours", lambda i: (lambda: kernels.matmul(xs[i], weights[i].t())))]


def time_sides(key: str, sides: list, sets: int, gb: float | None = None) -> dict:
    """One problem's row: each side (name, make(i) -> call on operand set i) under both timers, printed."""
    graph = timing.graph_ms_side_by_side([make(0) for _, make in sides], (25, 100))
    stream = stream_ms([[make(i) for i in range(sets)] for _, make in sides])
    row = {"problem": key, "sides": [name for name, _ in sides],
           "graph_us": [round(x * 1e3, 2) for x in graph], "stream_us": [round(x * 1e3, 2) for x in stream]}
    if gb is not None:
        row["stream_TBps"] = [round(gb / (x * 1e-3) / 1e3, 2) for x in stream]
    print(json.dumps(row), flush=True)
    return row


def report(rows: list[dict], path: str | None) -> None:
    """Write the rows to ``path`` (JSON) where given, and print each side's speed-up over the first (cuBLAS)."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
    print("problem: speed-up over cuBLAS per side, graph timer | stream timer")
    for r in rows:
        g, st = r["graph_us"], r["stream_us"]
        print(r["problem"], " ".join(f"{name}={g[0] / x:.3f}|{st[0] / y:.3f}" for name, x, y in zip(r["sides"], g, st)))


if __name__ == "__main__":
    main()
