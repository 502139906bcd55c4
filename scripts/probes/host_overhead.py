"""Host time per dispatched call, with the Triton launch itself stubbed out.

What a call costs before the GPU sees it: checking operands, finding the config, the pointer table
and the output views. The kernel launch is replaced by a no-op, so this runs anywhere (under
TRITON_INTERPRET=1 on a CPU too); Triton's own launch cost comes on top and is not measured here.

    TRITON_INTERPRET=1 PYTHONPATH=. python scripts/probes/host_overhead.py        # CPU tensors
    PYTHONPATH=. python scripts/probes/host_overhead.py --device cuda             # on a GPU
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

import torch
import triton

import kernels
from kernels import grouped, moe


class _NoLaunch:
    """Stands in for a @triton.jit kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid: object) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    fn()
    best = float("inf")
    for _ in range(5):  # best of five: the least disturbed by whatever else runs on this machine
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    grouped._grouped_matmul_kernel = _NoLaunch()
    moe._moe_kernel = _NoLaunch()
    device = torch.device(args.device)
    print(f"{platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, "
          f"triton {triton.__version__}, tensors on {device}")
    print("| call | experts / GEMMs | host us per call |")
    print("|---|---:|---:|")
    for experts in (4, 64):
        As = [torch.empty(128, 2048, dtype=torch.half, device=device) for _ in range(experts)]
        Bs = [torch.empty(2048, 768, dtype=torch.half, device=device) for _ in range(experts)]
        print(f"| kernels.grouped_matmul(As, Bs) | {experts} | "
              f"{per_call_us(lambda: kernels.grouped_matmul(As, Bs), args.calls):.1f} |")
        x = torch.empty(128 * experts, 2048, dtype=torch.half, device=device)
        w = torch.empty(experts, 768, 2048, dtype=torch.half, device=device).transpose(1, 2)
        offsets = torch.arange(1, experts + 1, dtype=torch.int32, device=device) * 128
        print(f"| kernels.moe_matmul(x, w, offsets) | {experts} | "
              f"{per_call_us(lambda: kernels.moe_matmul(x, w, offsets), args.calls):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
