"""Which way ranks configs best on a problem nobody tuned: nearest tuned winner, kNN, or ridge?

Leave-one-out over the observations (kernels/_costmodel.py): each problem (``--group problem``) or
each corpus model (``--group model``, tuner/corpus.py entries) is held out in turn; the methods are
fitted on the rest and rank the configs measured on each held-out problem. Reported per method:

- rho: Spearman rank correlation of predicted and measured time over those configs (median);
- regret@1: measured time of the top-ranked config / the best measured there (geomean, worst);
- trials to 98%: how many configs, taken in the ranking's order, reach 98% of the best throughput;
- ``nearest+knn``: the order tuner.search's warm start now tries (nearest's pick, knn's top 3, the rest);
- regret@3, regret@5: the best of the top 3 (5) / the best (what a warm start of 3 (5) trials reaches;
  tuner.search's warm start takes the model's top 3).

``nearest`` is today's dispatch: the winner of the nearest tuned problem (kernels/_spec.py
transfer_distance), then the other configs in the order of their times there.

    PYTHONPATH=. python scripts/costmodel_eval.py --sweeps 'benchmarks/sweeps/*.json' \\
        --sweeps 'benchmarks/sweeps/subspaces/*.json' [--rows corpus_rows.json] [--db sqlite:///tuner.db] \\
        [--mode graph] [--group problem|model] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

import kernels
from kernels import Config, Problem
from kernels._costmodel import Observation, fit
from tuner.costmodel_data import from_database, from_rows_file, from_sweeps

METHODS = ("nearest", "knn", "ridge", "nearest+knn")
# A time within this of the best counts as reached (1 / 0.98: 98% of the best throughput), as in replay.py.
TARGET = 1 / 0.98
Ranker = Callable[[Problem, list[Config]], list[float]]


def measured_on(observations: Sequence[Observation]) -> dict[Problem, dict[Config, float]]:
    """Per problem, each config's median measured ratio to cuBLAS (a config swept twice counts once)."""
    times: dict[Problem, dict[Config, list[float]]] = defaultdict(lambda: defaultdict(list))
    for o in observations:
        times[o.problem][o.config].append(o.time_ms / o.cublas_ms)
    return {p: {c: statistics.median(ts) for c, ts in by.items()} for p, by in times.items()}


def nearest_ranker(train: Sequence[Observation]) -> Ranker:
    """Today's fallback: the nearest tuned problem's winner first, then its other configs by their times."""
    spec = kernels.get_kernel("matmul")
    tuned = measured_on(train)

    def rank(problem: Problem, candidates: list[Config]) -> list[float]:
        near = min(tuned, key=lambda q: spec.transfer_distance(problem, q), default=None)
        if near is None or not math.isfinite(spec.transfer_distance(problem, near)):
            return [math.inf] * len(candidates)
        return [tuned[near].get(c, math.inf) for c in candidates]
    return rank


def warm_start_ranker(train: Sequence[Observation], mode: str, picks: int = 3) -> Ranker:
    """tuner.search's warm start now: nearest's first pick, then knn's top ``picks``, then nearest's order."""
    near, knn = nearest_ranker(train), model_ranker(train, "knn", mode)

    def rank(problem: Problem, candidates: list[Config]) -> list[float]:
        by_near, by_knn = near(problem, candidates), knn(problem, candidates)
        order = sorted(range(len(candidates)), key=lambda i: by_near[i])[:1]
        order += [i for i in sorted(range(len(candidates)), key=lambda i: by_knn[i]) if i not in order][:picks]
        order += [i for i in sorted(range(len(candidates)), key=lambda i: by_near[i]) if i not in order]
        position = {i: n for n, i in enumerate(order)}
        return [float(position[i]) for i in range(len(candidates))]
    return rank


def model_ranker(train: Sequence[Observation], kind: str, mode: str) -> Ranker:
    model = fit(train, kind=kind)
    return lambda problem, candidates: [model.predict_ratio(problem, c, mode) for c in candidates]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Rank correlation; infinite predictions rank last, tied."""
    def ranks(x: Sequence[float]) -> np.ndarray:
        x = np.nan_to_num(np.asarray(x, dtype=float), posinf=1e300)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        return r
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def score(ranker: Ranker, problem: Problem, measured: dict[Config, float]) -> dict[str, float]:
    configs = list(measured)
    predicted = ranker(problem, configs)
    order = sorted(range(len(configs)), key=lambda i: predicted[i])
    best = min(measured.values())
    times = [measured[configs[i]] for i in order]
    return {"rho": spearman(predicted, [measured[c] for c in configs]),
            "regret1": times[0] / best, "regret3": min(times[:3]) / best, "regret5": min(times[:5]) / best,
            "to98": next(n for n, t in enumerate(times, 1) if t <= best * TARGET), "top_vs_cublas": times[0], "best_vs_cublas": best}


def groups_of(problems: Sequence[Problem], by: str) -> dict[str, list[Problem]]:
    if by == "problem":
        return {p.key: [p] for p in problems}
    from tuner.corpus import entries
    model_of = {e.problem.key: e.model for e in entries("all")}
    groups: dict[str, list[Problem]] = defaultdict(list)
    for p in problems:
        groups[model_of.get(p.key, "not in the corpus")].append(p)
    return dict(groups)


def evaluate(observations: Sequence[Observation], mode: str, by: str, methods: Sequence[str]) -> dict:
    observations = [o for o in observations if o.mode == mode]
    measured = measured_on(observations)
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    for group, problems in groups_of(list(measured), by).items():
        held = set(problems)
        train = [o for o in observations if o.problem not in held]
        if not train:
            continue
        rankers = {m: nearest_ranker(train) if m == "nearest" else warm_start_ranker(train, mode) if m == "nearest+knn"
                   else model_ranker(train, m, mode) for m in methods}
        for p in problems:
            for m in methods:
                rows[m].append({"group": group, "problem": p.key, "configs": len(measured[p]),
                                **score(rankers[m], p, measured[p])})
    return rows


def summary_table(rows: dict[str, list[dict]]) -> str:
    lines = ["| method | problems | median rho | regret@1 geomean | regret@1 worst | regret@3 geomean | regret@5 geomean | trials to 98% mean | reached 98% in 4 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for method, rs in rows.items():
        if not rs:
            continue
        gm = lambda key: math.exp(statistics.fmean(math.log(r[key]) for r in rs))  # noqa: E731
        lines.append(f"| {method} | {len(rs)} | {statistics.median(r['rho'] for r in rs):.3f} | {gm('regret1'):.3f} | "
                     f"{max(r['regret1'] for r in rs):.3f} | {gm('regret3'):.3f} | {gm('regret5'):.3f} | "
                     f"{statistics.fmean(r['to98'] for r in rs):.2f} | {sum(r['to98'] <= 4 for r in rs) / len(rs):.0%} |")
    return "\n".join(lines)


def load(args: argparse.Namespace) -> list[Observation]:
    observations: list[Observation] = []
    for pattern in args.sweeps or []:
        observations += from_sweeps(pattern)
    for path in args.rows or []:
        observations += from_rows_file(path, args.device)
    if args.db:
        observations += from_database(args.db, args.device)
    return [o for o in observations if o.problem.kernel == "matmul"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", action="append", help="glob of sweep JSON files (repeatable)")
    parser.add_argument("--rows", action="append", help="rows JSON file (tuner/costmodel_data.py format; repeatable)")
    parser.add_argument("--db", default=None, help="SQLAlchemy URL of a tuner database with its Optuna studies")
    parser.add_argument("--device", default=None, help="only this device's records and rows (canonical name)")
    parser.add_argument("--mode", default="graph", choices=("eager", "graph"))
    parser.add_argument("--group", default="problem", choices=("problem", "model"),
                        help="hold out one problem at a time, or one corpus model at a time")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json", default=None, help="write every held-out problem's scores here")
    args = parser.parse_args(argv)
    observations = load(args)
    problems = {o.problem for o in observations if o.mode == args.mode}
    if len(problems) < 2:
        parser.error(f"{len(problems)} matmul problem(s) have {args.mode} observations; leave-one-out needs 2")
    print(f"{len(observations)} observations, {len(problems)} problems, mode {args.mode}, held out by {args.group}")
    rows = evaluate(observations, args.mode, args.group, [m for m in args.methods.split(",") if m])
    print(summary_table(rows))
    for method, rs in rows.items():
        worst = sorted(rs, key=lambda r: -r["regret1"])[:3]
        print(f"{method}: worst " + "; ".join(f"{r['problem']} {r['regret1']:.2f}x" for r in worst))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "mode": args.mode, "group": args.group, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
