"""In a fresh process: does ``kernels.matmul`` pick up the tuned config, compute the right result, and
what does dispatch cost on the host?

    python scripts/dispatch_check.py --shape 4096x4096x4096 --shape 16x4096x4096 [--db URL]

For each shape: where the config came from (database, shipped table, nearest, default), relative error
against torch in float32, GPU time of kernels.matmul and torch.matmul (median of do_bench, L2 flushed),
and host time per call (a loop of launches on a small problem, the GPU far from saturated).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import triton
import triton.testing

import kernels
from kernels import Problem


def host_us_per_call(fn, calls: int = 2000) -> float:
    """Host microseconds per call, measured on a problem small enough that the GPU keeps up."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", action="append", default=[])
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--layout", default="nn")
    parser.add_argument("--db", default=None)
    args = parser.parse_args()
    if args.db:
        kernels.use_database(args.db)
    device = kernels.current_device()
    print(f"{device.name} ({device.alias}) torch {torch.__version__} triton {triton.__version__} "
          f"{time.strftime('%Y-%m-%d')}")
    spec = kernels.get_kernel("matmul")
    for shape in args.shape:
        problem = Problem.from_key("matmul", f"{args.dtype}:{args.layout}:{shape}")
        a, b = spec.make_inputs(problem, torch.device("cuda"), 1234)
        choice = kernels.explain("matmul", problem)
        out = kernels.matmul(a, b)
        ref = a.float() @ b.float()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        ours = triton.testing.do_bench(lambda: kernels.matmul(a, b), return_mode="median")
        theirs = triton.testing.do_bench(lambda: torch.matmul(a, b), return_mode="median")
        print(f"{problem.key}: source={choice.source} rel_err={err:.2e} kernels.matmul {ours:.4f} ms  "
              f"torch.matmul {theirs:.4f} ms  ({theirs / ours:.2f}x)\n  config: {choice.config}")
    small = Problem.from_key("matmul", f"{args.dtype}:{args.layout}:64x64x64")
    a, b = spec.make_inputs(small, torch.device("cuda"), 7)
    ours = host_us_per_call(lambda: kernels.matmul(a, b))
    cfg = kernels.explain("matmul", small).config
    direct = host_us_per_call(lambda: kernels.matmul_with(cfg, a, b))
    theirs = host_us_per_call(lambda: torch.matmul(a, b))
    print(f"host time per call (64x64x64): kernels.matmul {ours:.1f} us, matmul_with(config) {direct:.1f} us, "
          f"torch.matmul {theirs:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
