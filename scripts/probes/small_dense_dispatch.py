"""Is a gap between kernels.matmul and torch.matmul on a small problem the kernel's, or noise and host time?

For 1024x768x512 in fp16/bf16 and both B layouts, prints what dispatch picked, then five rounds of
(do_bench ms, CUDA graph ms, host us per call) for torch.matmul and kernels.matmul. The CUDA-graph column
has no host work in it: equal there means the same kernel runs.

    python3 -m tuner import kernels/tables/h100.json --db sqlite:////tmp/all.db
    PYTHONPATH=. python3 scripts/probes/small_dense_dispatch.py --db sqlite:////tmp/all.db
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

import kernels
from scripts.dispatch_check import host_us_per_call


def rounds_of(fn, rounds: int = 5) -> list[tuple[float, float, float]]:
    rows = []
    for _ in range(rounds):
        host_us = host_us_per_call(fn, 500)
        rows.append((round(triton.testing.do_bench(fn, warmup=25, rep=100), 4),
                     round(triton.testing.do_bench_cudagraph(fn, rep=100), 4), round(host_us, 1)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="SQLAlchemy URL dispatch reads (default: the tuner's)")
    args = parser.parse_args()
    kernels.use_database(args.db)
    for dtype in (torch.float16, torch.bfloat16):
        for layout in ("nn", "nt"):
            a = torch.randn(1024, 512, device="cuda", dtype=dtype)
            b = (torch.randn(512, 768, device="cuda", dtype=dtype) if layout == "nn"
                 else torch.randn(768, 512, device="cuda", dtype=dtype).t())
            print(dtype, layout, kernels.explain("matmul", kernels.get_kernel("matmul").problem_of(a, b)))
            for name, fn in (("torch.matmul", lambda: torch.matmul(a, b)), ("kernels.matmul", lambda: kernels.matmul(a, b))):
                print(f"  {name:15s} (do_bench ms, graph ms, host us):", rounds_of(fn), flush=True)


if __name__ == "__main__":
    main()
