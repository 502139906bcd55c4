"""GPU probe: is every matmul variant correct, and what does a random sample of each variant reach?

For each problem: correctness of a few configs per variant on fresh inputs, then a seeded random
sample of valid configs per variant, compiled and checked in parallel worker processes and timed
one by one (median of do_bench, L2 flushed), beside torch.matmul. Prints the best per variant and
writes every measurement to JSON.

    python scripts/probes/probe_variants.py --dtype fp16 --layout nn --per-variant 16 --out probe.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch
import triton

import kernels
from kernels import Problem
from tuner.bench import Bench, gpu_timer
from tuner.workers import CheckPool

SUITE = ("1024x768x512", "16x4096x4096", "64x4096x4096", "128x8192x8192", "512x14336x4096",
         "1000x1000x1000", "2048x2048x2048", "4096x4096x4096", "8192x8192x8192", "4096x28672x2048",
         "3333x257x4099")


def sample_configs(problem: Problem, device: kernels.DeviceInfo, per_variant: int, seed: int) -> list:
    spec = kernels.get_kernel("matmul")
    by_variant: dict[str, list] = {}
    for config in spec.space.enumerate(problem, device):
        by_variant.setdefault(config["VARIANT"], []).append(config)
    rng = random.Random(seed)
    chosen = []
    for variant, configs in sorted(by_variant.items()):
        chosen += rng.sample(configs, min(per_variant, len(configs)))
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", action="append")
    parser.add_argument("--layout", action="append")
    parser.add_argument("--shape", action="append")
    parser.add_argument("--per-variant", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--out", default="probe.json")
    args = parser.parse_args()
    device = kernels.resolve_device("auto")
    spec = kernels.get_kernel("matmul")
    print(f"{device.name} torch {torch.__version__} triton {triton.__version__} cuda {torch.version.cuda} "
          f"{time.strftime('%Y-%m-%d')}", flush=True)
    rows, table = [], []
    with CheckPool(args.workers) as pool:
        for dtype in args.dtype or ["fp16"]:
            for layout in args.layout or ["nn"]:
                for shape in args.shape or SUITE:
                    problem = Problem.from_key("matmul", f"{dtype}:{layout}:{shape}")
                    configs = sample_configs(problem, device, args.per_variant, args.seed)
                    start = time.time()
                    checks = pool.check(problem, configs)
                    compile_s = time.time() - start
                    bench = Bench(spec, problem, device, timer=gpu_timer)
                    cublas = bench.baseline_ms()
                    best: dict[str, tuple[float, str]] = {}
                    for config in configs:
                        pre = checks[config]
                        m = bench.measure(config) if pre.status == "ok" else None
                        status = m.status if m else pre.status
                        ms = m.time_ms if m and m.ok else None
                        rows.append({"problem": problem.key, "config": str(config), "status": status,
                                     "time_ms": ms, "reason": (m.reason if m else pre.reason)})
                        if ms is not None and ms < best.get(config["VARIANT"], (1e9, ""))[0]:
                            best[config["VARIANT"]] = (ms, str(config))
                    fails = sum(1 for r in rows[-len(configs):] if r["status"] != "ok")
                    line = f"{problem.key:<26} cublas {cublas:.4f}  " + "  ".join(
                        f"{v} {t:.4f} ({cublas / t:.2f}x)" for v, (t, _) in sorted(best.items()))
                    print(f"{line}  fails {fails}/{len(configs)} compile {compile_s:.0f}s", flush=True)
                    for v, (t, c) in sorted(best.items()):
                        print(f"    best {v}: {c}", flush=True)
                    table.append({"problem": problem.key, "cublas_ms": cublas,
                                  "best": {v: {"ms": t, "config": c} for v, (t, c) in best.items()}})
                    failed = [r for r in rows[-len(configs):] if r["status"] != "ok"][:3]
                    for r in failed:
                        print(f"    FAIL {r['status']}: {r['reason'][:160]} [{r['config']}]", flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": device.name, "torch": torch.__version__, "triton": triton.__version__,
                   "table": table, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
