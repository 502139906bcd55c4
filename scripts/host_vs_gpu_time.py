"""Is a small grouped GEMM's time the GPU's or the host's? Three figures per round, on the GPU:

- do_bench ms: what scripts/bench.py reports (L2 flushed, host work included when the host is slower
  than the flush);
- CUDA graph ms: the same call replayed from a CUDA graph, so no host work at all;
- host us/call: wall time of 200 calls launched back to back, divided by 200.

When host us/call exceeds the GPU time, do_bench measures the host, and it varies with the host's load.

    python scripts/host_vs_gpu_time.py --db sqlite:////tmp/h100.db --rounds 4
"""

from __future__ import annotations

import argparse
import time

import torch
import triton.testing

import kernels
from kernels import Problem
from tuner import suites

GROUPS = ("4x512^3", "64 experts K=2048 N=768")


def rounds_of(fn, rounds: int) -> list[tuple[float, float, float]]:
    fn()
    torch.cuda.synchronize()
    rows = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(200):
            fn()
        host_us = (time.perf_counter() - start) / 200 * 1e6
        torch.cuda.synchronize()
        rows.append((round(triton.testing.do_bench(fn, warmup=25, rep=100), 4),
                     round(triton.testing.do_bench_cudagraph(fn, rep=100), 4), round(host_us, 1)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="SQLAlchemy URL dispatch reads (default: the tuner's)")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    kernels.use_database(args.db)
    spec = kernels.get_kernel("grouped_matmul")
    for name in GROUPS:
        for dtype in ("fp16", "bf16"):
            problem = Problem.from_key("grouped_matmul", f"{dtype}:nn:{suites.GROUPS_GPU[name]}")
            As, Bs = spec.make_inputs(problem, torch.device("cuda"), 5)
            for column, fn in (("kernels.grouped_matmul", lambda: kernels.grouped_matmul(As, Bs)),
                               ("loop of torch.matmul", lambda: [torch.matmul(a, b) for a, b in zip(As, Bs)])):
                print(f"{name} {dtype} {column}: (do_bench ms, CUDA graph ms, host us/call) per round:",
                      rounds_of(fn, args.rounds), flush=True)


if __name__ == "__main__":
    main()
