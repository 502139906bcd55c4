"""Is an eager gap between two calls of the same cuBLAS kernel real? torch.matmul, torch.mm and
kernels.matmul (a cuBLAS plan) timed by tuner.timing.eager_ms, interleaved, every sample printed.

    PYTHONPATH=. python3 scripts/probes/eager_probe.py bf16:nt:8192x9216x3072 bf16:nt:128x14336x3584
"""

from __future__ import annotations

import statistics
import sys

import torch

import kernels
from kernels import BASELINE, MATMUL, Problem, _plans
from tuner import timing
from tuner.bench import Bench

for key in sys.argv[1:]:
    problem = Problem.from_key("matmul", key)
    bench = Bench(MATMUL, problem, kernels.current_device())
    rotation = bench.rotation()
    a, b = rotation[0]
    calls = {"torch.matmul": lambda x: torch.matmul(*x), "torch.mm": lambda x: torch.mm(*x),
             "kernels.matmul": lambda x: kernels.matmul(*x)}
    samples = {name: [] for name in calls}
    with _plans.pinned(BASELINE, a, b):
        for round_ in range(6):
            order = list(calls.items()) if round_ % 2 == 0 else list(reversed(calls.items()))
            for name, call in order:
                samples[name].append(timing.eager_ms(call, rotation) * 1e3)
    print(key, len(rotation), "input sets")
    for name, values in samples.items():
        print(f"  {name:15} median {statistics.median(values):8.1f} us  " + " ".join(f"{v:.1f}" for v in values))
    bench.release()
