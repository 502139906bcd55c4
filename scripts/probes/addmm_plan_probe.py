"""Which cuBLAS kernel does a biased Linear get: torch.addmm's own, or our kept cublasLt plan's (kernels.matmul_bias
served from C++, the bias in the plan's epilogue)? On unseen Qwen2.5-72B's stacked q/k/v (bf16/fp16 8 and 32 x
10240 x 8192) our eager call ran 0.92-0.95x torch.addmm while both were GPU-bound (docs/BENCHMARKS.md,
"Twenty-seventh session"). Per problem and call: the CUDA kernels of 20 calls (torch.profiler) with their mean
GPU time, and the wall time per call of 2000 back-to-back calls.

    PYTHONPATH=. python3 scripts/probes/addmm_plan_probe.py [--key bf16:nt:8x10240x8192 ...]

Run it again with KERNELS_NATIVE_LT=0 to see at::addmm from C++ instead of the kept plan.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

import kernels
from kernels import Problem


def kernels_of(call, calls: int = 20) -> str:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    found = [(e.key[:80], e.count / calls, e.device_time_total / e.count) for e in prof.key_averages()
             if e.device_type.name == "CUDA" and e.count]
    return "; ".join(f"{name} x{count:g} {us:.1f}us" for name, count, us in found)


def wall_us(call, calls: int = 2000) -> float:
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", action="append", help="dtype:nt:MxNxK")
    args = parser.parse_args()
    keys = args.key or [f"{d}:nt:{m}x10240x8192" for d in ("bf16", "fp16") for m in (1, 8, 32, 128)]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"KERNELS_NATIVE_LT={os.environ.get('KERNELS_NATIVE_LT', '(unset)')}, "
          f"C++ path: {kernels._native.start(block=True)}", flush=True)
    for key in keys:
        spec = kernels.get_kernel("matmul_bias")
        a, b, bias = spec.make_inputs(Problem.from_key("matmul_bias", key), "cuda", 0)
        calls = {"torch.addmm": lambda: torch.addmm(bias, a, b), "kernels.matmul_bias": lambda: kernels.matmul_bias(a, b, bias)}
        for name, call in calls.items():
            call()  # the first call resolves and hands the signature to C++
            print(f"{key:22} {name:20} wall {wall_us(call):7.2f} us/call  {kernels_of(call)}", flush=True)


if __name__ == "__main__":
    main()
