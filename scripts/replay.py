"""Replay GPU sweeps as the objective: how many trials each sampler needs to near the sweep's best.

A sweep (``scripts/sweep.py``) times every valid config of a (sub)space for one problem. Replaying
it runs the real search loop, ``tuner.search._Search`` (ask, canonicalise, prune invalid configs
without counting them, answer repeats from the study, stop at the budget or when the sampler has
converged), with a bench that looks each config's result up in the sweep instead of running it, so
a sampler is scored over many seeds in minutes and without a GPU; whatever the search counts as a
trial, the replay counts. Optuna samples exactly the sweep's subspace: the kernel's space with
VARIANT limited to the swept variant and the parameters that variant ignores fixed. Valid configs
an incomplete sweep lacks are pruned like invalid ones and reported.

    PYTHONPATH=. python scripts/replay.py --sweeps 'benchmarks/sweeps/*.json' --json replay.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import json
import logging
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

import kernels
from kernels import Config, DeviceInfo, KernelSpec, Problem, SearchSpace
from tuner.bench import Measurement
from tuner import search
from tuner.search import Budget, Progress, _Search, make_sampler, measured_trials, study_name
from tuner.workers import Precheck
from tuner.space import narrowed, params_of

# Sweeps name their GPU; the constraints need its limits (scripts/sweep.py does not record them).
DEVICES = {d.name: d for d in (
    DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232448),
)}

# The targets: fractions of the sweep's best throughput (1 / time).
TARGETS = (0.98, 0.995)

SAMPLERS = ("random", "tpe", "tpe-independent", "gp", "cmaes")
# cold: the sampler alone; seeded: today's warm start first (tuner.search.warm_start_configs with an
# empty database); model: as many configs first, the cost model's best predicted (fitted on the
# --model-data observations of every other problem: the sweep's problem is never seen).
MODES = ("cold", "seeded", "model")

# Reason given to configs the sweep did not time (an incomplete sweep); pruned, not counted.
NOT_SWEPT = "not in the sweep"


@dataclass(frozen=True)
class Sweep:
    """One sweep file: the problem, the subspace it covers, and each canonical config's result."""

    path: str
    spec: KernelSpec  # the kernel's spec with its space narrowed to the sweep's subspace
    problem: Problem
    device: DeviceInfo
    variant: str | None
    results: dict[Config, Measurement]
    baseline_ms: float
    meta: dict
    stale: int  # rows the kernel's current space rules out (constraints changed since the sweep)

    @property
    def best(self) -> tuple[Config, float]:
        ok = [(c, m.time_ms) for c, m in self.results.items() if m.ok]
        return min(ok, key=lambda pair: pair[1])


def variant_space(space: SearchSpace, variant: str | None) -> SearchSpace:
    """``space`` with VARIANT limited to ``variant`` and the parameters that variant ignores fixed."""
    if variant is None:
        return space
    fixed = {"VARIANT": variant, **space.ignored.get("VARIANT", {}).get(variant, {})}
    params = tuple(dataclasses.replace(p, values=(fixed[p.name],)) if p.name in fixed else p
                   for p in space.params)
    return dataclasses.replace(space, params=params)


def _swept_only(swept: frozenset[Config]):
    def constraint(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
        return None if config in swept else NOT_SWEPT
    return constraint


def row_ms(row: dict) -> float:
    """A row's time: its confirmation median unless that was disturbed (as scripts/sweep.py row_ms)."""
    confirmed = row.get("confirmed_ms")
    if confirmed and search.believed(confirmed, row["time_ms"]):
        return float(confirmed)
    return float(row["time_ms"])


@functools.lru_cache(maxsize=None)
def load_sweep(path: str) -> Sweep:
    with open(path) as f:
        doc = json.load(f)
    spec = kernels.get_kernel(doc["kernel"])
    problem = Problem.from_key(spec.name, doc["problem"])
    if doc["device"] not in DEVICES:
        raise ValueError(f"{path}: device {doc['device']!r} is unknown to replay; add its DeviceInfo to DEVICES "
                         f"(known: {', '.join(DEVICES)})")
    device = DEVICES[doc["device"]]
    space = variant_space(spec.space, doc.get("variant"))
    stale = 0
    # Rows of one launch (configs a fold makes equal on this problem) are timings of one kernel: their
    # median is its time. A row's confirmation median, where the sweep took one, beats its single timing.
    timings: dict[Config, list[float]] = {}
    failures: dict[Config, Measurement] = {}
    for row in doc["rows"]:
        config = space.canonical(Config.from_dict(row["config"]), problem)
        if space.violation(config, problem, device):
            stale += 1
            continue
        if row["status"] == "ok" and row["time_ms"] is not None:
            timings.setdefault(config, []).append(row_ms(row))
        else:
            failures.setdefault(config, Measurement(row["status"], reason=row.get("reason") or ""))
    results: dict[Config, Measurement] = {**failures, **{
        config: Measurement("ok", time_ms=statistics.median(times)) for config, times in timings.items()}}
    if not any(m.ok for m in results.values()):
        raise ValueError(f"{path}: no config in the sweep ran correctly; nothing to replay")
    space = dataclasses.replace(space, constraints=(*space.constraints, _swept_only(frozenset(results))))
    meta = {k: v for k, v in doc.items() if k != "rows"}
    return Sweep(path, dataclasses.replace(spec, space=space), problem, device, doc.get("variant"), results,
                 float(doc["baseline_ms"]), meta, stale)


@functools.lru_cache(maxsize=None)
def sampled_space(path: str) -> SearchSpace:
    """What the search's sampler draws from on the sweep's problem (tuner.space.narrowed), once per sweep."""
    sweep = load_sweep(path)
    return narrowed(sweep.spec.space, sweep.problem, sweep.device)


class SweepBench:
    """Stands in for tuner.bench.Bench: a config's measurement is the sweep's."""

    def __init__(self, sweep: Sweep) -> None:
        self.problem, self.device, self.sweep = sweep.problem, sweep.device, sweep
        self.measured = 0

    def measure(self, config: Config, incumbent_ms: float | None = None,
                checked_error: float | None = None) -> Measurement:
        # A sweep holds full timings only; an early stop would report about the same time, so the
        # sampler sees what it would see live.
        self.measured += 1
        return self.sweep.results[config]


class Pipeline:
    """Stands in for tuner.workers.CheckPool: ``workers`` configs in flight, finishing in the order
    they were submitted (as if every compile took as long), each precheck passed."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._queue: list[Config] = []

    def submit(self, problem: Problem, config: Config, seed: int = 0) -> None:
        self._queue.append(config)

    def next_result(self) -> tuple[Config, Precheck]:
        return self._queue.pop(0), Precheck("ok")


def sampler_for(name: str, seed: int) -> optuna.samplers.BaseSampler:
    if name == "tpe-independent":
        # The search's TPE settings but one density per parameter.
        return optuna.samplers.TPESampler(seed=seed, multivariate=False, constant_liar=True, n_startup_trials=10)
    return make_sampler(name, seed)


def warm_configs(sweep: Sweep) -> list[Config]:
    """What tuner.search.warm_start_configs enqueues with an empty database and no shipped table:
    the kernel's default and its seeds, kept where they lie in the swept subspace."""
    spec = kernels.get_kernel(sweep.spec.name)
    chosen: list[Config] = []
    for config in [spec.default_config(sweep.problem, sweep.device)] + spec.seeds(sweep.problem, sweep.device):
        config = sweep.spec.space.canonical(config, sweep.problem)
        if config not in chosen and sweep.spec.space.violation(config, sweep.problem, sweep.device) is None:
            chosen.append(config)
    return chosen


@dataclass(frozen=True)
class Run:
    """One replayed search: trials (1-based, counted ones only) to reach each target, budget + 1 if never."""

    sampler: str
    mode: str
    seed: int
    to_target: tuple[int, ...]
    best_fraction: float  # best throughput found / the sweep's best
    measured: int  # distinct configs looked up
    repeats: int  # trials answered from the study, without a lookup
    pruned_invalid: int
    pruned_not_swept: int
    counted: int  # trials the budget counted
    stop: str  # "budget", or why the search stopped before it: "invalid" or "converged" (see tuner.search)
    seconds: float


@functools.lru_cache(maxsize=None)
def model_warm_configs(path: str, sources: tuple[str, ...], kind: str = "knn") -> list[Config]:
    """The cost model's top configs for the sweep's problem, as many as ``warm_configs`` gives, the
    model fitted on the observations in ``sources`` (sweep globs or rows files) of other problems."""
    from kernels._costmodel import fit
    from tuner.costmodel_data import from_rows_file, from_sweeps, ranked_warm_start

    sweep = load_sweep(path)
    observations = []
    for source in sources:
        observations += from_rows_file(source) if source.endswith(".rows.json") else from_sweeps(source, None)
    unseen = [o for o in observations if o.problem.shapes != sweep.problem.shapes]
    if not unseen:
        return []
    candidates = [c for c, m in sweep.results.items() if m.ok]
    return ranked_warm_start(fit(unseen, kind=kind), sweep.problem, candidates, "graph", len(warm_configs(sweep)))


def replay(path: str, sampler: str, mode: str, seed: int, budget: int, ahead: int = 1,
           polish: tuple[int, int] | None = None, model_data: tuple[str, ...] = ()) -> Run:
    """One search of ``budget`` counted trials against the sweep at ``path``; ``polish`` (every, after)
    overrides tuner.search's POLISH_EVERY and POLISH_AFTER."""
    start = time.perf_counter()
    if polish is not None:
        search.POLISH_EVERY, search.POLISH_AFTER = polish
    sweep = load_sweep(path)
    best_ms = sweep.best[1]
    study = optuna.create_study(study_name=study_name(sweep.device, sweep.problem), direction="minimize",
                                sampler=sampler_for(sampler, seed))
    space = sampled_space(path)
    if mode in ("seeded", "model"):
        for config in warm_configs(sweep) if mode == "seeded" else model_warm_configs(path, model_data):
            study.enqueue_trial(params_of(config, space), skip_if_exists=True)
    to_target = [budget + 1] * len(TARGETS)

    def on_trial(progress: Progress) -> None:
        for i, fraction in enumerate(TARGETS):
            if progress.best_ms is not None and best_ms / progress.best_ms >= fraction:
                to_target[i] = min(to_target[i], progress.trial)

    bench = SweepBench(sweep)
    pool = Pipeline(ahead) if ahead > 1 else None
    _Search(study, sweep.spec, bench, Budget(trials=budget), pool, on_trial, ahead=ahead, space=space).run()
    trials = study.get_trials(deepcopy=False)
    # Invalid configs are pruned, or told as infeasible for the GP sampler (tuner.search._prune_invalid).
    pruned = [t for t in trials if t.user_attrs.get("status") == "invalid"]
    not_swept = sum(t.user_attrs.get("reason") == NOT_SWEPT for t in pruned)
    told = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)
            and t.user_attrs.get("status") != "invalid"]
    done = [t.value for t in told if t.state == TrialState.COMPLETE]
    counted = len(measured_trials(study))
    last = trials[-1] if trials else None
    stop = ("budget" if counted >= budget else "invalid" if last and last.user_attrs.get("status") == "invalid"
            else "converged")
    return Run(sampler, mode, seed, tuple(to_target), best_ms / min(done) if done else 0.0, bench.measured,
               len(told) - bench.measured, len(pruned) - not_swept, not_swept, counted, stop,
               time.perf_counter() - start)


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)  # the GP sampler uses torch; one thread per worker process
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("tuner.search").setLevel(logging.ERROR)  # early stops are counted in the table instead


def sweep_stats(sweep: Sweep) -> dict:
    config, best_ms = sweep.best
    ok = [m.time_ms for m in sweep.results.values() if m.ok]
    within = {f"{f:g}": sum(best_ms / t >= f for t in ok) for f in TARGETS}
    return {"path": sweep.path, "kernel": sweep.spec.name, "problem": sweep.problem.key, "variant": sweep.variant,
            "device": sweep.device.name, "date": sweep.meta.get("date"), "torch": sweep.meta.get("torch"),
            "triton": sweep.meta.get("triton"), "space_size": sweep.meta.get("space_size"),
            "swept": sweep.meta.get("swept"), "complete": sweep.meta.get("complete"), "replayable": len(sweep.results),
            "stale_rows": sweep.stale, "ok": len(ok), "best_ms": best_ms, "best_config": str(config),
            "cublas_ms": sweep.baseline_ms, "configs_within": within,
            "warm_configs": [str(c) for c in warm_configs(sweep)]}


def _median(values: Sequence[int], budget: int) -> str:
    middle = statistics.median(values)
    return f">{budget}" if middle > budget else f"{middle:g}"


def summarize(runs: Sequence[Run], budget: int) -> dict:
    """Per (sampler, mode): median trials to each target, share of runs reaching it within the budget."""
    out = {}
    for key in dict.fromkeys((r.sampler, r.mode) for r in runs):
        group = [r for r in runs if (r.sampler, r.mode) == key]
        row = {"runs": len(group), "seconds_per_run": statistics.mean(r.seconds for r in group),
               "median_best_fraction": statistics.median(r.best_fraction for r in group),
               "mean_repeats": statistics.mean(r.repeats for r in group),
               "stopped_invalid": sum(r.stop == "invalid" for r in group),
               "stopped_converged": sum(r.stop == "converged" for r in group),
               "mean_pruned_invalid": statistics.mean(r.pruned_invalid for r in group),
               "pruned_not_swept": sum(r.pruned_not_swept for r in group)}
        for i, fraction in enumerate(TARGETS):
            trials = [r.to_target[i] for r in group]
            row[f"median_to_{fraction:g}"] = _median(trials, budget)
            row[f"reached_{fraction:g}"] = sum(t <= budget for t in trials) / len(trials)
            row[f"quartiles_to_{fraction:g}"] = [float(q) for q in statistics.quantiles(
                trials, n=4, method="inclusive")] if len(trials) > 1 else [float(trials[0])] * 3
        out[f"{key[0]}/{key[1]}"] = row
    return out


def markdown_table(summary: dict, budget: int) -> str:
    lines = ["| sampler | mode | runs | trials to 98%: median [quartiles] | reached 98% "
             "| trials to 99.5%: median [quartiles] | reached 99.5% | best found (median) | repeats/run "
             "| pruned/run | stopped early: invalid, converged | s/run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, row in summary.items():
        sampler, mode = key.split("/")
        cells = [sampler, mode, str(row["runs"])]
        for fraction in TARGETS:
            q1, _, q3 = row[f"quartiles_to_{fraction:g}"]
            iqr = ", ".join(f">{budget}" if q > budget else f"{q:g}" for q in (q1, q3))
            cells += [f"{row[f'median_to_{fraction:g}']} [{iqr}]", f"{row[f'reached_{fraction:g}']:.0%}"]
        cells += [f"{row['median_best_fraction']:.1%}", f"{row['mean_repeats']:.1f}",
                  f"{row['mean_pruned_invalid']:.0f}", f"{row['stopped_invalid']}, {row['stopped_converged']}", f"{row['seconds_per_run']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _print_stats(stats: dict) -> None:
    within = ", ".join(f"{n} within {float(f):.1%}" for f, n in stats["configs_within"].items())
    print(f"## {stats['kernel']} {stats['problem']} variant={stats['variant']} on {stats['device']} "
          f"({stats['date']}, torch {stats['torch']}, triton {stats['triton']})")
    print(f"swept {stats['swept']}/{stats['space_size']} configs (complete: {stats['complete']}), "
          f"{stats['replayable']} replayable, {stats['stale_rows']} ruled out by today's constraints, "
          f"{stats['ok']} ok")
    print(f"best {stats['best_ms'] * 1e3:.2f} us: {stats['best_config']}")
    print(f"cuBLAS {stats['cublas_ms'] * 1e3:.2f} us; configs at the targets: {within}")
    print(f"seeded mode enqueues {len(stats['warm_configs'])} warm configs first")


def _tasks(paths: Iterable[str], samplers: Sequence[str], modes: Sequence[str], seeds: dict[str, int],
           budget: int, ahead: int, polish: tuple[int, int] | None = None,
           model_data: tuple[str, ...] = ()) -> list[tuple]:
    return [(path, sampler, mode, seed, budget, ahead, polish, model_data) for path in paths for sampler in samplers
            for mode in modes for seed in range(seeds[sampler])]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", default="benchmarks/sweeps/*.json", help="glob of sweep JSON files")
    parser.add_argument("--seeds", type=int, default=20, help="sampler seeds per sampler and mode (default 20)")
    parser.add_argument("--gp-seeds", type=int, default=4,
                        help="seeds for the GP sampler, ~20 s a run here (default 4)")
    parser.add_argument("--budget", type=int, default=100, help="counted trials per search (default 100)")
    parser.add_argument("--samplers", default=",".join(SAMPLERS), help=f"comma-separated, of {', '.join(SAMPLERS)}")
    parser.add_argument("--modes", default="cold,seeded",
                        help="cold (sampler only), seeded (warm configs first), model (the cost model's first)")
    parser.add_argument("--ahead", type=int, default=1,
                        help="configs in flight (asked, not yet told), as `tuner search --ahead N` (default 1)")
    parser.add_argument("--polish", default=None, metavar="EVERY,AFTER",
                        help="the search's local polish: every EVERY-th new config a neighbour of the best, "
                             f"after AFTER measured trials; 0,0 turns it off (default: tuner.search's, "
                             f"{search.POLISH_EVERY},{search.POLISH_AFTER})")
    parser.add_argument("--model-data", action="append", default=[],
                        help="observations for --modes model: a sweep glob, or a FILE.rows.json in the "
                             "tuner/costmodel_data.py rows format (repeatable; default: --sweeps)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--json", default=None, help="write the stats, per-run results and summary here")
    args = parser.parse_args(argv)
    samplers = [s for s in args.samplers.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(samplers) - set(SAMPLERS)) + sorted(set(modes) - set(MODES))
    paths = sorted(glob.glob(args.sweeps))
    if unknown or not paths:
        parser.error(f"unknown sampler/mode {', '.join(unknown)}" if unknown else f"no sweep matches {args.sweeps}")
    seeds = {s: args.gp_seeds if s == "gp" else args.seeds for s in samplers}
    start = time.perf_counter()
    report: dict = {"command": " ".join(sys.argv), "budget": args.budget, "ahead": args.ahead,
                    "targets": TARGETS, "seeds": seeds, "sweeps": []}
    polish = tuple(int(v) for v in args.polish.split(",")) if args.polish else None
    if polish is not None and len(polish) != 2:
        parser.error(f"--polish takes EVERY,AFTER (two integers), e.g. 2,8; got {args.polish}")
    report["polish"] = polish or (search.POLISH_EVERY, search.POLISH_AFTER)
    tasks = _tasks(paths, samplers, modes, seeds, args.budget, args.ahead, polish,
                   tuple(args.model_data) or (args.sweeps,))
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_init_worker) as pool:
            runs = list(pool.map(replay, *zip(*tasks)))
    else:
        runs = [replay(*task) for task in tasks]
    for path in paths:
        stats = sweep_stats(load_sweep(path))
        mine = [r for r, task in zip(runs, tasks) if task[0] == path]
        summary = summarize(mine, args.budget)
        _print_stats(stats)
        not_swept = sum(r.pruned_not_swept for r in mine)
        if not_swept:
            print(f"NOTE: the sweep is incomplete: {not_swept} valid samples were not in it (pruned, not counted)")
        print(f"\nbudget {args.budget} counted trials, {args.ahead} ahead; seeds: "
              + ", ".join(f"{s} {n}" for s, n in seeds.items()))
        print(markdown_table(summary, args.budget) + "\n")
        report["sweeps"].append({"stats": stats, "summary": summary,
                                 "runs": [dataclasses.asdict(r) for r in mine]})
    if len(paths) > 1:
        pooled = summarize(runs, args.budget)
        print(f"## all {len(paths)} sweeps pooled: each run on each problem is one sample")
        print(markdown_table(pooled, args.budget) + "\n")
        report["pooled"] = pooled
    wall = time.perf_counter() - start
    report["wall_seconds"] = wall
    print(f"{len(runs)} replays in {wall:.0f} s with {args.jobs} processes")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
