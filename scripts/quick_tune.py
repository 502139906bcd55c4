"""Quick-tune many dense problems (tuner/quick.py): a portfolio per problem, both modes, into a database.

    PYTHONPATH=. python3 scripts/quick_tune.py --corpus tuned --db sqlite:///out.db --json out.json
    PYTHONPATH=. python3 scripts/quick_tune.py --key bf16:nt:8x4096x4096 --db sqlite:///out.db
    PYTHONPATH=. python3 scripts/quick_tune.py --corpus all --skip-table kernels/tables/h100.json --db sqlite:///q.db
    PYTHONPATH=. python3 scripts/quick_tune.py --corpus tuned --small-m-first --budget-s 520 --db sqlite:///h200.db
    PYTHONPATH=. python3 scripts/quick_tune.py --kernel gated_matmul --corpus all --m 1 --m 8 --db sqlite:///g.db

``--qkv``: the corpus's query, key and value projections stacked (tuner.corpus.qkv_entries).
``--kernel gated_matmul``: the corpus's SiLU-gated MLPs (gate and up stacked, tuner.corpus.gated_entries).
``--kernel matmul_bias``: the corpus's biased query/key/value projections, stacked (tuner.corpus.bias_entries).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import optuna
import torch
import triton

import kernels
from db import Store
from tuner.quick import QuickResult, quick_tune
from tuner.search import EAGER_PASSES
from tuner.workers import CheckPool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dispatch import problems_of  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", action="append")
    parser.add_argument("--keys")
    parser.add_argument("--corpus")
    parser.add_argument("--qkv", action="store_true",
                        help="with --corpus: the models' query/key/value projections stacked (kernels.patch runs them so)")
    parser.add_argument("--dtype", action="append")
    parser.add_argument("--kernel", default="matmul", choices=("matmul", "gated_matmul", "matmul_bias"),
                        help="the kernel whose problems --key, --keys and --corpus name (default matmul)")
    parser.add_argument("--m", type=int, action="append", help="only problems with this many rows of A (repeatable)")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--db", required=True)
    parser.add_argument("--budget-s", type=float, default=0, help="stop starting problems after this many seconds")
    parser.add_argument("--skip-table", default=None,
                        help="leave out problems this export (a shipped table) has both modes' records of, for this GPU")
    parser.add_argument("--small-m-first", action="store_true",
                        help="problems with M <= 128 first, by M (where Triton wins most; a budget-cut run keeps them)")
    parser.add_argument("--eager-passes", type=int, default=EAGER_PASSES,
                        help=f"contests an eager Triton winner must win in all (default {EAGER_PASSES}; tuner.search.confirm_eager)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.eager_passes < 1:
        parser.error(f"--eager-passes {args.eager_passes}: give 1 or more (the deciding contest counts)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = kernels.current_device()
    problems = problems_of(args)
    if args.small_m_first:
        problems.sort(key=lambda p: (p.shapes[0][0] > 128, p.shapes[0][0], p.key))
    if args.skip_table:
        from db import load_document

        modes: dict[str, set[str]] = {}
        for record in load_document(Path(args.skip_table)):
            if record.device_name == device.name and record.kernel == args.kernel:
                modes.setdefault(record.problem_key, set()).add(record.mode)
        problems = [p for p in problems if modes.get(p.key, set()) != set(kernels.MODES)]
    print(f"# quick tune of {args.kernel}, {device.name}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d')}, {len(problems)} problems into {args.db}", flush=True)
    started = time.monotonic()
    rows = []

    def report(result: QuickResult) -> None:
        eager, graph = result.records["eager"], result.records["graph"]
        rows.append(dict(problem=result.problem.key, seconds=result.seconds, measured=result.measured,
                         eager=dict(speedup=eager.speedup, config=eager.config),
                         graph=dict(speedup=graph.speedup, config=graph.config)))
        print(f"{result.problem.key:28} eager {eager.speedup:.3f}x graph {graph.speedup:.3f}x "
              f"({result.measured} configs, {result.seconds:.1f} s)", flush=True)

    with Store(args.db) as store, CheckPool() as pool:
        for problem in problems:
            if args.budget_s and time.monotonic() - started > args.budget_s:
                print(f"# budget of {args.budget_s} s spent; {len(problems) - len(rows)} problems left", flush=True)
                break
            quick_tune(kernels.get_kernel(args.kernel), [problem], device, store, pool=pool, on_result=report,
                       eager_passes=args.eager_passes)
    print(f"# {len(rows)} problems in {time.monotonic() - started:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
