"""Ground truth for the search: time every valid config of a (sub)space for one problem on the GPU.

Configs are compiled and checked in parallel worker processes, then timed one at a time (median of
do_bench, L2 flushed, warm-up 10 ms, 30 ms of repetitions: shorter than the search's 100 ms so
that a sweep fits a lease). The JSON maps each config to its time or its failure, and is what
``scripts/replay.py`` replays as the objective, without a GPU.

    python scripts/sweep.py --kernel matmul --problem fp16:nn:16x4096x4096 --variant tiled \
        --out benchmarks/sweeps/matmul-fp16-nn-16x4096x4096-tiled.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch
import triton
import triton.testing

import kernels
from kernels import Problem
from tuner.bench import Bench
from tuner.workers import CheckPool


def sweep_timer(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=30, return_mode="median"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel", default="matmul")
    parser.add_argument("--problem", required=True, help="problem key, e.g. fp16:nn:16x4096x4096")
    parser.add_argument("--variant", default=None, help="only configs of this VARIANT (a subspace)")
    parser.add_argument("--limit", type=int, default=None, help="a seeded random sample of this many")
    parser.add_argument("--budget-s", type=float, default=300, help="stop timing after this many seconds")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = kernels.resolve_device("auto")
    spec = kernels.get_kernel(args.kernel)
    problem = Problem.from_key(spec.name, args.problem)
    configs = [c for c in spec.space.enumerate(problem, device)
               if args.variant is None or c.get("VARIANT") == args.variant]
    total = len(configs)
    if args.limit and args.limit < total:
        configs = random.Random(0).sample(configs, args.limit)
    start = time.time()
    bench = Bench(spec, problem, device, timer=sweep_timer)
    rows = []
    with CheckPool() as pool:
        for i in range(0, len(configs), 56):
            chunk = configs[i:i + 56]
            checks = pool.check(problem, chunk)
            for config in chunk:
                pre = checks[config]
                m = bench.measure(config) if pre.status == "ok" else None
                rows.append({"config": config.as_dict(), "status": m.status if m else pre.status,
                             "time_ms": m.time_ms if m and m.ok else None,
                             "reason": (m.reason if m else pre.reason)[:200]})
            if time.time() - start > args.budget_s:
                break
    ok = [r for r in rows if r["time_ms"]]
    best = min(ok, key=lambda r: r["time_ms"]) if ok else None
    document = {"kernel": spec.name, "problem": problem.key, "device": device.name,
                "variant": args.variant, "space_size": total, "swept": len(rows),
                "complete": len(rows) == total, "baseline_ms": bench.baseline_ms(),
                "torch": torch.__version__, "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"),
                "timer": "do_bench median, warmup 10 ms, rep 30 ms, L2 flushed", "rows": rows}
    with open(args.out, "w") as f:
        json.dump(document, f, indent=0)
    print(f"{problem.key} variant={args.variant}: swept {len(rows)}/{total} in {time.time() - start:.0f}s, "
          f"{len(ok)} ok, best {best and best['time_ms']:.4f} ms, cuBLAS {document['baseline_ms']:.4f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
