"""Time the corpus portfolio (tuner/corpus.py) on every corpus problem: the cost model's training data.

Each problem of the chosen part gets cuBLAS and its ~12-20 portfolio configs timed (correctness
checked first, as the search does), written as rows in the format tuner/costmodel_data.py reads:

    {"problem_key", "kernel", "device", "config" (str(Config) or "cublas"), "mode", "time_ms"}

The rows file is rewritten after each problem, and problems already in it are skipped, so a killed
run resumes. Timing is tuner.bench's (do_bench median, L2 flushed), labelled ``--mode`` (default
graph: the search's time today). Once the eager/graph timers of issue 12 part 1 exist, pass the
mode's timer in ``_timer``.

    PYTHONPATH=. python scripts/corpus_sweep.py --part all --out $OUT/corpus_rows.json [--dtype bf16] [--m 1,8]
    PYTHONPATH=. python scripts/corpus_sweep.py --part all --dry-run     # counts only, no GPU needed
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

import kernels
from kernels import DeviceInfo
from tuner.corpus import corpus_problems, portfolio

H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232448)


def _timer(rep_ms: float):
    import triton.testing

    return lambda fn: float(triton.testing.do_bench(fn, warmup=5, rep=rep_ms, return_mode="median"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="all", choices=("all", "tuned", "held_out"))
    parser.add_argument("--dtype", action="append", help="only these dtypes (repeatable)")
    parser.add_argument("--m", default=None, help="only these token counts, comma-separated")
    parser.add_argument("--mode", default="graph", choices=("eager", "graph"), help="label of the timings")
    parser.add_argument("--rep-ms", type=float, default=20, help="do_bench repetitions per config (ms)")
    parser.add_argument("--budget-s", type=float, default=540, help="stop starting problems after this long")
    parser.add_argument("--out", default=None, help="rows JSON file (read first, to resume)")
    parser.add_argument("--dry-run", action="store_true", help="list problems and portfolio sizes (H100 limits)")
    args = parser.parse_args(argv)
    ms = {int(v) for v in args.m.split(",")} if args.m else None
    problems = [p for p in corpus_problems(args.part)
                if (not args.dtype or p.dtype in args.dtype) and (ms is None or p.shape[0] in ms)]
    if args.dry_run:
        sizes = [len(portfolio(p, H100)) for p in problems]
        print(f"{len(problems)} problems, {sum(sizes)} configs to time (portfolio {min(sizes)}-{max(sizes)} each)")
        return 0
    if not args.out:
        parser.error("--out is required unless --dry-run")
    from tuner.bench import Bench

    device = kernels.resolve_device("auto")
    spec = kernels.get_kernel("matmul")
    rows = json.load(open(args.out)) if os.path.exists(args.out) else []
    done = {(r["problem_key"], r["mode"]) for r in rows if r.get("device") == device.name}
    start = time.time()
    for index, problem in enumerate(problems, 1):
        if (problem.key, args.mode) in done:
            continue
        if time.time() - start > args.budget_s:
            print(f"budget spent after {index - 1}/{len(problems)} problems; run again to resume")
            break
        bench = Bench(spec, problem, device, timer=_timer(args.rep_ms))
        base = dict(problem_key=problem.key, kernel="matmul", device=device.name, mode=args.mode)
        found = [dict(base, config="cublas", time_ms=bench.baseline_ms())]
        for config in portfolio(problem, device):
            m = bench.measure(config)
            if m.ok:
                found.append(dict(base, config=str(config), time_ms=m.time_ms))
        rows += found
        with open(args.out + ".tmp", "w") as f:
            json.dump(rows, f)
        os.replace(args.out + ".tmp", args.out)
        best = min(found[1:], key=lambda r: r["time_ms"], default=None)
        ratio = f"{found[0]['time_ms'] / best['time_ms']:.2f}x" if best else "-"
        print(f"[{index}/{len(problems)}] {problem.key}: {len(found) - 1} configs, best vs cuBLAS {ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
