"""Where a patched layer's host time goes: the layers of ``kernels.nn.Linear``'s call, each timed alone.

Each row peels one layer off the call (module call, linear_call's checks, _linear's transpose and warm-up
key, the public matmul_bias dispatch), 64 -> 64 fp16 with a bias under no_grad, interleaved rounds,
median us per call; torch's nn.Linear, F.linear and addmm beside them.

    PYTHONPATH=. python3 scripts/probes/linear_host_probe.py [--rounds 21]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import triton

import kernels
from kernels import ops
from scripts.host_cost import host_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--features", type=int, default=64)
    args = parser.parse_args()
    f = args.features
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d')}, {f}x{f}x{f} fp16 with bias, no_grad, {args.rounds} rounds")
    torch.set_grad_enabled(False)
    x = torch.randn(f, f, device="cuda", dtype=torch.float16)
    theirs = torch.nn.Linear(f, f, device="cuda", dtype=torch.float16)
    ours = kernels.nn.Linear.from_linear(torch.nn.Linear(f, f, device="cuda", dtype=torch.float16))
    w, b, wt = ours.weight, ours.bias, ours.weight.t()
    rows = {
        "torch nn.Linear": lambda: theirs(x),
        "torch F.linear": lambda: torch.nn.functional.linear(x, theirs.weight, theirs.bias),
        "torch.addmm": lambda: torch.addmm(b, x, wt),
        "torch.matmul": lambda: torch.matmul(x, wt),
        "kernels nn.Linear": lambda: ours(x),
        "ops.linear_call": lambda: ops.linear_call(x, w, b),
        "ops._linear": lambda: ops._linear(x, w, b),
        "kernels.matmul_bias(w.t())": lambda: kernels.matmul_bias(x, w.t(), b),
        "kernels.matmul_bias": lambda: kernels.matmul_bias(x, wt, b),
        "kernels.matmul": lambda: kernels.matmul(x, wt),
    }
    samples: dict[str, list[float]] = {name: [] for name in rows}
    items = list(rows.items())
    for round_ in range(args.rounds):
        for name, call in items if round_ % 2 == 0 else items[::-1]:
            samples[name].append(host_us(call, 300))
    for name, values in samples.items():
        print(f"{name:28} {statistics.median(values):8.2f} us")
    try:
        print("# matmul_bias dispatch:", kernels.explain("matmul_bias", kernels.Problem.from_key(
            "matmul_bias", f"fp16:nt:{f}x{f}x{f}")))
    except Exception as error:  # a probe: the timings above stand without it
        print(f"# explain failed: {error!r}")


if __name__ == "__main__":
    main()
