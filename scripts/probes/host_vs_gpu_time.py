"""Is a small grouped GEMM's time the GPU's or the host's? Three figures per call and round, on the GPU:

- do_bench ms: what scripts/bench.py reports (L2 flushed, host work included when the host is slower
  than the flush);
- CUDA graph ms: the same call replayed from a CUDA graph, so no host work at all;
- host us/call: wall time of 200 calls launched back to back, divided by 200.

When host us/call exceeds the GPU time, do_bench measures the host, and it varies with the host's load.
Our calls are timed twice: with the direct launch (kernels/_launch.py, the default) and with every launch
on Triton's own path (``KERNELS_DIRECT_LAUNCH=0``), for the groups and for one dense problem (fp16, B
transposed). A last table splits one grouped call's host time.

    PYTHONPATH=. python scripts/probes/host_vs_gpu_time.py --db sqlite:////tmp/h100.db --rounds 3
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import triton
import triton.testing

import kernels
from kernels import Problem, _launch, grouped
from scripts.dispatch_check import host_us_per_call
from tuner import suites

GROUPS = ("4x128^3", "4x512^3", "16 experts skewed", "64 experts K=2048 N=768")
DENSE = ("16x4096x4096",)


def figures(fn: Callable[[], object], direct: bool) -> tuple[float, float, float]:
    _launch.ENABLED = direct
    try:
        fn()
        torch.cuda.synchronize()
        return (triton.testing.do_bench(fn, warmup=25, rep=100), triton.testing.do_bench_cudagraph(fn, rep=100),
                host_us_per_call(fn, 200))
    finally:
        _launch.ENABLED = True


def _group(name: str) -> str:
    return suites.GROUPS_GPU.get(name) or suites.MOE_GPU[name]


def columns(name: str, dtype: str) -> dict[str, Callable[[], object]]:
    grouped_spec, moe_spec = kernels.get_kernel("grouped_matmul"), kernels.get_kernel("moe_matmul")
    As, Bs = grouped_spec.make_inputs(Problem.from_key("grouped_matmul", f"{dtype}:nn:{_group(name)}"),
                                      torch.device("cuda"), 5)
    calls = {"grouped_matmul": lambda: kernels.grouped_matmul(As, Bs),
             "loop of torch.matmul": lambda: [torch.matmul(a, b) for a, b in zip(As, Bs)]}
    if name in suites.MOE_GPU:  # moe_matmul takes experts of one shape, tuned on these groups
        x, w, offsets = moe_spec.make_inputs(Problem.from_key("moe_matmul", f"{dtype}:nt:{_group(name)}"),
                                             torch.device("cuda"), 5)[:3]
        calls["moe_matmul"] = lambda: kernels.moe_matmul(x, w, offsets)
        if dtype == "bf16":
            calls["torch._grouped_mm"] = lambda: torch._grouped_mm(x, w, offs=offsets)
    return calls


def host_split(dtype: str) -> None:
    """Where one call of grouped_matmul on 4x512^3 spends its host time, step by step."""
    spec = kernels.get_kernel("grouped_matmul")
    As, Bs = spec.make_inputs(Problem.from_key("grouped_matmul", f"{dtype}:nn:{_group('4x512^3')}"),
                              torch.device("cuda"), 5)
    kernels.grouped_matmul(As, Bs)
    pairs = grouped.signature(As, Bs)
    launch = grouped.CALLS.get(pairs)
    if launch is None:
        print("4x512^3 dispatches to cuBLAS; no host split")
        return
    c = torch.empty(launch.plan.c_elements, dtype=As[0].dtype, device="cuda")
    n = len(launch.plan.outputs)
    steps = {
        "signature of the operands": lambda: grouped.signature(As, Bs),
        "CALLS lookup": lambda: grouped.CALLS.get(pairs),
        "torch.empty for C": lambda: torch.empty(launch.plan.c_elements, dtype=As[0].dtype, device="cuda"),
        "output views": lambda: launch.plan.views(c),
        "launch, direct": lambda: launch.kernel(launch.table, c, n),
        "launch, Triton's path": lambda: grouped._grouped_matmul_kernel[launch.kernel.grid](
            launch.table, c, n, **launch.kernel.options),
        "whole call": lambda: kernels.grouped_matmul(As, Bs),
        "one torch.matmul": lambda: torch.matmul(As[0], Bs[0]),
    }
    print(f"\nhost us per step, {dtype} 4x512^3 (best of 3 x 500 calls)")
    for step, fn in steps.items():
        print(f"  {step:28s} {min(host_us_per_call(fn, 500) for _ in range(3)):7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="SQLAlchemy URL dispatch reads (default: the tuner's)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kernels.use_database(args.db)
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, "
          f"triton {triton.__version__}; median over {args.rounds} rounds")
    print("| group | dtype | call | launch | do_bench ms | CUDA graph ms | host us/call |")
    print("|---|---|---|---|---:|---:|---:|")
    for name in GROUPS:
        for dtype in ("bf16", "fp16"):
            for column, fn in columns(name, dtype).items():
                ours = column in ("grouped_matmul", "moe_matmul")
                for direct in ((True, False) if ours else (True,)):
                    rounds = [figures(fn, direct) for _ in range(args.rounds)]
                    median = [sorted(values)[len(values) // 2] for values in zip(*rounds)]
                    path = ("direct" if direct else "Triton") if ours else "-"
                    print(f"| {name} | {dtype} | {column} | {path} | {median[0]:.4f} | {median[1]:.4f} | "
                          f"{median[2]:.1f} |", flush=True)
    for shape in DENSE:  # dense problems where the shipped table picks a Triton kernel
        m, n, k = (int(v) for v in shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16).t()
        for column, fn in (("kernels.matmul", lambda: kernels.matmul(a, b)), ("torch.matmul", lambda: torch.matmul(a, b))):
            for direct in ((True, False) if column == "kernels.matmul" else (True,)):
                rounds = [figures(fn, direct) for _ in range(args.rounds)]
                median = [sorted(values)[len(values) // 2] for values in zip(*rounds)]
                path = ("direct" if direct else "Triton") if column == "kernels.matmul" else "-"
                print(f"| {shape} nt | fp16 | {column} | {path} | {median[0]:.4f} | {median[1]:.4f} | {median[2]:.1f} |",
                      flush=True)
    for dtype in ("bf16", "fp16"):
        host_split(dtype)


if __name__ == "__main__":
    main()
