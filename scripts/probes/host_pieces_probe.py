"""Which piece of kernels.matmul's host path costs what, on the GPU box's host, per operand layout.

Host us per call over bursts the GPU queue absorbs (no waiting on the GPU), medians of interleaved
rounds: torch.mm, torch.matmul, kernels.matmul (dispatch's plan), and the pieces of its hot path alone
(building the plan key, hashing it, looking it up).

    PYTHONPATH=. python3 scripts/probes/host_pieces_probe.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

import kernels
from kernels import _modes, _plans

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eager_gap_probe import host_us as burst_us  # noqa: E402  (one burst timer for both probes)


def key_of(x):
    a, b = x
    return (a.shape, b.shape, a.stride(), b.stride(), a.dtype, a.device)


def main() -> None:
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, python {sys.version.split()[0]}; "
          f"raw stream of the default stream: {torch._C._cuda_getCurrentRawStream(-1)}")
    cases = {
        "fp16 nn 64x64x64, 1 set": [(torch.randn(64, 64, device="cuda").half(), torch.randn(64, 64, device="cuda").half())],
        "fp16 nt 1x4096x3584, 6 sets": [(torch.randn(1, 3584, device="cuda").half(),
                                         torch.randn(4096, 3584, device="cuda").half().t()) for _ in range(6)],
        "fp16 nt 64x64x64, 6 sets": [(torch.randn(64, 64, device="cuda").half(),
                                      torch.randn(64, 64, device="cuda").half().t()) for _ in range(6)],
    }
    for name, inputs in cases.items():
        a, b = inputs[0]
        kernels.matmul(a, b)
        table = {key_of(inputs[0]): torch.mm}
        calls = {
            "torch.mm": lambda x: torch.mm(*x),
            "torch.matmul": lambda x: torch.matmul(*x),
            "kernels.matmul": lambda x: kernels.matmul(*x),
            "key only": key_of,
            "key + hash": lambda x: hash(key_of(x)),
            "key + dict get": lambda x: table.get(key_of(x)),
            "key + get + torch.mm": lambda x: table.get(key_of(x))(*x),
            "plan's own object": lambda x: _plans.get(_plans.signature(*x)),
            "capture query": lambda x: torch._C._cuda_isCurrentStreamCapturing(),
            "raw stream (-1)": lambda x: torch._C._cuda_getCurrentRawStream(-1),
            "kernels._modes.capturing": lambda x: _modes.capturing(),
        }
        samples = {n: [] for n in calls}
        for round_ in range(15):
            for n, call in (calls.items() if round_ % 2 == 0 else reversed(calls.items())):
                samples[n].append(burst_us(call, inputs))
        print(name, "| dispatch:", type(_plans.get(_plans.signature(a, b)).both).__name__
              if _plans.get(_plans.signature(a, b)) is not None else None)
        for n, values in samples.items():
            print(f"  {n:24} {statistics.median(values):7.2f} us")


if __name__ == "__main__":
    main()
