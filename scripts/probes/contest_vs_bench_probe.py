"""Why do eager contests and scripts/bench_dispatch.py disagree on memory-bound problems whose weight is
about the L2's size? One process times one problem both ways, alternating.

On the H100 and the H200 (2026-11-25), Triton eager winners of 1-32 token problems with 45-57 MB weights
(2048x10944, 9216x3072, 3072x8192) stored 1.04-1.22x cuBLAS, and a fresh process measured 0.89-0.96x.
In the re-decision's log, every side of such a contest (torch.matmul too) ran at about 27 us; the bench,
minutes later, timed torch.matmul at 21 us. This probe times, in turn, in one process:
- "bench": torch.matmul against kernels.matmul as dispatch serves it, as bench_dispatch.py does;
- "contest": the tuner's eager contest (tuner.bench.Bench.contest, the re-decision's side-by-side budget)
  of the shipped eager winner and our cuBLAS path beside torch.matmul, with the graph winner held;
- "contest, no graph": the same without the graph winner held.

    PYTHONPATH=. python3 scripts/probes/contest_vs_bench_probe.py [--key bf16:nt:1x2048x10944 ...] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch
import triton

import kernels
from kernels import BASELINE, MATMUL, Config, Problem
from tuner import timing
from tuner.bench import Bench, SideBySide
from tuner.quick import QUICK_CONTEST_EAGER_MS, QUICK_GRAPH_MS

KEYS = ("bf16:nt:1x2048x10944", "fp16:nt:32x2048x10944", "bf16:nt:1x9216x3072")


def bench_style(bench: Bench) -> tuple[float, float]:
    rotation = bench.rotation()
    theirs, ours = timing.eager_ms_side_by_side(
        [lambda x: torch.matmul(*x), lambda x: kernels.matmul(*x)], rotation, timing.SIDE_EAGER_MS)
    return theirs, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", action="append")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = kernels.current_device()
    print(f"# {device.name}, torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d')}")
    print(f"# C++ path: {kernels._native.start(block=True)}", flush=True)
    for key in args.key or KEYS:
        problem = Problem.from_key("matmul", key)
        eager = kernels.explain("matmul", problem, device, "eager").config
        graph = kernels.explain("matmul", problem, device, "graph").config
        contenders = [eager] if not kernels.is_baseline(eager) else []
        contenders.append(BASELINE)
        bench = Bench(MATMUL, problem, device, side_by_side=SideBySide(QUICK_GRAPH_MS, QUICK_CONTEST_EAGER_MS))
        print(f"{key}: eager winner {eager}; graph winner {graph}; rotation {len(bench.rotation())} sets", flush=True)
        for repeat in range(args.repeats):
            theirs, ours = bench_style(bench)
            print(f"  [{repeat}] bench            torch {theirs * 1e3:6.1f} us  dispatch {ours * 1e3:6.1f} us  "
                  f"{theirs / ours:.3f}x", flush=True)
            for label, held in (("contest", graph), ("contest, no graph", None)):
                times, torch_ms = bench.contest(contenders, mode="eager", graph=held)
                sides = "  ".join(f"{c.get('VARIANT', 'tiled')} {t * 1e3:6.1f} us" for c, t in zip(contenders, times))
                print(f"  [{repeat}] {label:17} torch {torch_ms * 1e3:6.1f} us  {sides}  "
                      f"best {torch_ms / min(times):.3f}x", flush=True)
        bench.release()


if __name__ == "__main__":
    main()
