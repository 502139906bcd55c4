"""Where does an eager call's time go on a problem whose host and GPU times are close?

For each problem: the host time of each call (the wall time of issuing a burst of calls that the GPU
queue absorbs without blocking, before the synchronize), its GPU time (a CUDA-graph replay, L2 flushed)
and its eager time (tuner.timing.eager_ms_side_by_side), for torch.matmul, torch.mm, kernels.matmul as
dispatch decides and kernels.matmul with each --config pinned. Rounds interleaved; medians printed.

    PYTHONPATH=. python3 scripts/probes/eager_gap_probe.py fp16:nt:1x4096x3584 --config "BLOCK_M: 16, ..."
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import triton

import kernels
from kernels import MATMUL, Config, Problem, _plans
from tuner import timing
from tuner.bench import Bench

BURST = 200  # calls per host-time burst: far below the CUDA queue's depth, so the host never waits


def host_us(call, rotation) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(BURST):
        call(rotation[i % len(rotation)])
    elapsed = time.perf_counter() - started
    torch.cuda.synchronize()
    return elapsed * 1e6 / BURST


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys", nargs="+")
    parser.add_argument("--config", action="append", default=[], help="a config to pin (str(Config) form)")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d')}; host us per call (burst of {BURST}), GPU us (graph), eager us (side by side)")
    device = kernels.current_device()
    for key in args.keys:
        problem = Problem.from_key("matmul", key)
        bench = Bench(MATMUL, problem, device)
        rotation = bench.rotation()
        a, b = rotation[0]
        kernels.matmul(a, b)
        key = _plans.signature(a, b)
        own = functools.partial(_plans._PLANS.__setitem__, key, _plans.get(key))  # dispatch's own plan back
        calls = {"torch.matmul": (lambda x: torch.matmul(*x), None), "torch.mm": (lambda x: torch.mm(*x), None),
                 "kernels.matmul": (lambda x: kernels.matmul(*x), own)}
        pins = []
        for text in args.config:
            config = MATMUL.space.canonical(Config.parse(text), problem)
            if MATMUL.space.violation(config, problem, device) is None:
                pins.append(config)
        with _plans.pinning(pins, a, b) as installers:
            for config, install in zip(pins, installers):
                calls[f"pinned {config.get('VARIANT')} {config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}"
                      f"/{config.get('SPLIT_K', 1)}"] = (lambda x: kernels.matmul(*x), install)
            kernels.matmul(a, b)
            host: dict[str, list[float]] = {name: [] for name in calls}
            for round_ in range(args.rounds):
                for name, (call, install) in (calls.items() if round_ % 2 == 0 else reversed(calls.items())):
                    if install is not None:
                        install()
                    host[name].append(host_us(call, rotation))
            gpu, eager = {}, {}
            names = list(calls)
            for name in names:
                call, install = calls[name]
                if install is not None:
                    install()
                gpu[name] = timing.graph_ms(lambda: call((a, b)), (10, 40)) * 1e3
            times = timing.eager_ms_side_by_side([calls[n][0] for n in names], rotation,
                                                 before=[calls[n][1] for n in names])
            eager = dict(zip(names, (t * 1e3 for t in times)))
        print(f"{key}  ({len(rotation)} input sets; dispatch: {kernels.explain('matmul', problem, device).source[:40]})")
        for name in names:
            print(f"  {name:32} host {statistics.median(host[name]):7.2f}  gpu {gpu[name]:7.2f}  eager {eager[name]:7.2f}")
        bench.release()


if __name__ == "__main__":
    main()
