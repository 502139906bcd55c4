"""Quick tuning of many problems: a portfolio of configs per problem instead of a search.

A model brings hundreds of GEMM problems (layers x token counts x dtypes); a 20-trial search costs
18-27 s each on the H100. Here each problem gets a fixed portfolio of configs known to do well on
some class of problems, checked in the compile workers and timed in both modes, then the same
side-by-side contest per mode as the search (``search._decide``), cuBLAS included. Every timing is
stored as a trial of the problem's Optuna study, so a later full search resumes from it, and the cost
model (kernels/_costmodel.py) learns from it like from any trial.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna

import kernels
from db import Record, Store
from kernels import GRAPH, MODES, Config, DeviceInfo, KernelSpec, Problem

from . import timing
from .bench import Bench, Measurement, SideBySide
from .search import EAGER_PASSES, _tell_values, decide_modes, open_study, sampled_space
from .space import distributions_of, params_of
from .workers import CheckPool

log = logging.getLogger(__name__)

# Timing budgets of a quick tuning: a portfolio is timed once, so each timing can be shorter than the
# search's (do_bench 25 + 100 ms): the contest at the end times the finalists again side by side.
QUICK_GRAPH_MS = (10, 40)
QUICK_EAGER_ROUND_MS = 5.0
# The contest of a quick tuning: its two best configs per mode and cuBLAS, two rounds in ABBA order.
QUICK_FINALISTS = 2
QUICK_ROUNDS = 2  # where the sides are timed in turn (CPU, tests); on a GPU, side by side:
QUICK_CONTEST_EAGER_MS = 30.0


@dataclass(frozen=True)
class QuickResult:
    problem: Problem
    records: dict[str, Record]  # mode -> the stored winner
    measured: int
    seconds: float


def default_portfolio(problem: Problem, device: DeviceInfo) -> list[Config]:
    """The matmul seeds for this problem's class, the tutorial's configs, and thin split-K configs."""
    spec = kernels.get_kernel(problem.kernel)
    # The kernel's default config too: what dispatch would run with no record, and a portfolio is never
    # empty (a problem whose seeds all violate its space was left untuned).
    candidates = list(spec.seeds(problem, device)) + [spec.default_config(problem, device)]
    if problem.kernel == "matmul":
        from kernels import gemm

        candidates += list(gemm.tutorial_configs())
        base = dict(GROUP_SIZE_M=8, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4)
        m = problem.shape[0]
        thin = [bm for bm in (16, 32, 64) if bm <= max(16, 1 << max(m - 1, 0).bit_length())]
        # Few rows: the call is a stream of B; the programs in flight (split-K, narrow N tiles) decide.
        for bm in thin if m <= 128 else ():
            for bn, bk, split, stages in ((32, 256, 1, 5), (64, 128, 1, 4), (128, 128, 1, 4), (64, 256, 2, 4),
                                          (32, 256, 4, 5), (64, 128, 4, 4), (128, 64, 8, 4), (128, 128, 2, 3)):
                variant = "splitk" if split > 1 else "tiled"
                candidates.append(Config.from_dict({**base, "VARIANT": variant, "BLOCK_M": bm, "BLOCK_N": bn,
                                                    "BLOCK_K": bk, "SPLIT_K": split, "num_stages": stages}))
        for bm, bn, bk, split, warps, stages in ((64, 128, 64, 2, 4, 4), (128, 128, 64, 2, 8, 3),
                                                  (128, 256, 64, 1, 8, 3), (256, 128, 64, 1, 8, 3)):
            variant = "splitk" if split > 1 else "tiled"
            candidates.append(Config.from_dict({**base, "VARIANT": variant, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                                "SPLIT_K": split, "num_warps": warps, "num_stages": stages}))
    seen: list[Config] = []
    for config in candidates:
        config = spec.space.canonical(config, problem)
        if config not in seen and spec.space.violation(config, problem, device) is None:
            seen.append(config)
    return seen


def quick_tune(spec: KernelSpec, problems: Sequence[Problem], device: DeviceInfo, store: Store, *,
               portfolio: Callable[[Problem, DeviceInfo], list[Config]] = default_portfolio,
               pool: CheckPool | None = None, skip_tuned: bool = True,
               on_result: Callable[[QuickResult], None] | None = None,
               eager_passes: int = EAGER_PASSES) -> list[QuickResult]:
    """Time each problem's portfolio in both modes, store both winners, keep every timing as a trial.

    ``skip_tuned`` leaves out problems that have a record in every mode on this device already (so
    that an interrupted run goes on where it stopped). ``eager_passes``: the contests an eager Triton
    winner must win in all, as in the search (``search.confirm_eager``)."""
    storage = optuna.storages.RDBStorage(store.url)
    results = []
    for problem in problems:
        if skip_tuned and all(store.get(device.name, spec.name, problem.key, mode) for mode in MODES):
            continue
        started = time.monotonic()
        study = open_study(storage, device, problem)
        space = sampled_space(study, spec, problem, device)
        configs = portfolio(problem, device)
        measured_before = {t.user_attrs.get("config") for t in study.trials}
        configs = [c for c in configs if str(c) not in measured_before]
        checked = pool.check(problem, configs) if pool is not None and configs else {}
        bench = _quick_bench(spec, problem, device)
        distributions = distributions_of(space)
        for config in configs:
            pre = checked.get(config)
            if pre is not None and pre.status != "ok":
                measurement = Measurement(pre.status, rel_error=pre.rel_error, reason=pre.reason)
            else:
                measurement = bench.measure(config, checked_error=pre.rel_error if pre is not None else None)
            _add_trial(study, space, distributions, config, measurement)
        if not any(t.user_attrs.get("status") == "ok" for t in study.trials):
            log.warning("%s: no portfolio config ran correctly; nothing stored", problem)
            continue
        records = decide_modes(spec, problem, device, bench, study, QUICK_FINALISTS, QUICK_ROUNDS, eager_passes)
        bench.release()
        store.put_many(list(records.values()), on_conflict="replace")
        result = QuickResult(problem, records, len(configs), time.monotonic() - started)
        results.append(result)
        if on_result:
            on_result(result)
    kernels.clear_cache()
    return results


def _quick_bench(spec: KernelSpec, problem: Problem, device: DeviceInfo) -> Bench:
    if device.is_cpu:
        return Bench(spec, problem, device)
    return Bench(spec, problem, device, timer=lambda fn: timing.graph_ms(fn, QUICK_GRAPH_MS),
                 quick_timer=None,
                 eager_timer=lambda call, inputs: timing.eager_ms(call, inputs, round_ms=QUICK_EAGER_ROUND_MS),
                 side_by_side=SideBySide(QUICK_GRAPH_MS, QUICK_CONTEST_EAGER_MS))


def _add_trial(study: optuna.Study, space: kernels.SearchSpace, distributions: dict, config: Config,
               measurement: Measurement) -> None:
    """One portfolio timing as a finished trial of the problem's study (as if the sampler had asked it)."""
    attrs = {"config": str(config), "portfolio": True, **_tell_values(measurement)}
    state = optuna.trial.TrialState.COMPLETE if measurement.ok else optuna.trial.TrialState.FAIL
    study.add_trial(optuna.trial.create_trial(
        params=params_of(config, space), distributions=distributions, state=state,
        value=float(measurement.time_ms) if measurement.ok else None, user_attrs=attrs))


def redecide(spec: KernelSpec, problem: Problem, device: DeviceInfo, candidates: Sequence[Config],
             bench: Bench | None = None, trials: int = 1, eager_passes: int = EAGER_PASSES) -> dict[str, Record]:
    """Each mode's winner of ``problem`` among ``candidates`` (a stored record's winners and best Triton
    configs) and cuBLAS, decided again by the side-by-side contest alone: no search, no study.

    For tables whose contests were timed the old way (sides seconds apart), so that the stored
    speed-up becomes what the user's call gets (scripts/redecide.py). As in ``search.decide_modes``:
    graph first; then eager, beside the graph winner, among the configs that ran within
    EAGER_GPU_MARGIN of cuBLAS on the GPU, and our own cuBLAS path; an eager Triton winner must win
    ``eager_passes`` contests in all (``search.confirm_eager``)."""
    from .search import _winner_record, eager_gpu_limit_ms, eager_winner, settle_eager

    bench = bench or Bench(spec, problem, device)
    triton = [c for c in dict.fromkeys(candidates) if not kernels.is_baseline(c)
              and spec.space.violation(c, problem, device) is None]
    records: dict[str, Record] = {}
    gpu_ms: dict[Config, float] = {}
    for mode in (GRAPH, kernels.EAGER):
        contestants, graph = list(triton), None
        if mode == kernels.EAGER and not device.is_cpu:
            graph = Config.from_dict(records[GRAPH].config)
            limit = eager_gpu_limit_ms(spec, records[GRAPH].cublas_ms)
            contestants = [c for c in triton if gpu_ms.get(c, math.inf) <= limit]
            contestants += [kernels.BASELINE] if spec.name == "matmul" else []
        if not contestants:
            ms = bench.baseline_ms(mode)
            records[mode] = _winner_record(spec, problem, device, (kernels.BASELINE, ms), ms, trials, mode,
                                           cublas_won=True)
            continue
        if device.is_cpu:  # interpreter times say nothing about speed: no contest (as search._decide)
            found = (contestants[0], bench.time(contestants[0], mode))
            records[mode] = _winner_record(spec, problem, device, found, bench.baseline_ms(mode), trials, mode)
            continue
        times, baseline_ms = bench.contest(contestants, mode=mode, graph=graph)
        log.info("%s %s: %s; torch %.4f ms", problem.key, mode,
                 ", ".join(f"{c.get('VARIANT', 'tiled')} {t:.4f}" for c, t in zip(contestants, times)), baseline_ms)
        timed = dict(zip(contestants, times))
        if mode == GRAPH:
            gpu_ms = timed
        ours_cublas_ms = timed.pop(kernels.BASELINE, None)
        if not timed:  # only our cuBLAS path was left to time
            records[mode] = _winner_record(spec, problem, device, (kernels.BASELINE, ours_cublas_ms), baseline_ms,
                                           trials, mode, cublas_ms=ours_cublas_ms, cublas_won=True)
            continue
        ranked = sorted(timed.items(), key=lambda pair: pair[1])
        cublas_won = ours_cublas_ms is not None and ours_cublas_ms < ranked[0][1]
        found = ranked[0]
        if mode == kernels.EAGER and not cublas_won:
            winner = eager_winner(spec, bench, ranked, baseline_ms if ours_cublas_ms is None else ours_cublas_ms)
            found, cublas_won = winner or ranked[0], winner is None
        records[mode] = _winner_record(spec, problem, device, found, baseline_ms, trials, mode,
                                       cublas_ms=ours_cublas_ms, cublas_won=cublas_won)
    records[kernels.EAGER] = settle_eager(spec, problem, device, bench, records[kernels.EAGER], records[GRAPH],
                                          eager_passes)
    bench.release()
    return records


def recheck_eager(spec: KernelSpec, problem: Problem, device: DeviceInfo, eager: Record,
                  graph: Config | None = None, bench: Bench | None = None, recontest: bool = False) -> Record | None:
    """A stored eager record whose Triton winner fails ``search.holds_on_a_fast_host`` (slower than cuBLAS
    back to back on the GPU), replaced by cuBLAS as our path runs it, timed side by side with torch.matmul;
    None where the winner holds without ``recontest`` (or is cuBLAS already, or the device is a CPU). ``graph``: the stored graph winner, held beside
    cuBLAS as dispatch will hold it. For tables decided before that rule (scripts/redecide.py
    --fast-host-only): no contest of the Triton configs is run again.

    ``recontest``: a winner that holds meets our cuBLAS path again in an eager contest, side by side, and
    the record comes back either way: the winner with its time now, or cuBLAS where the winner no longer
    beats it by WIN_MARGIN. Why: an eager win stored on a slow host is a host-bound win, and holding back
    to back says only that the kernel is no slower. bf16 1x9216x3072's tiled winner held (within 1% of
    cuBLAS back to back), stored 1.22x, and measured 0.95x in a fresh process on the H200 box (2026-11-25,
    docs/BENCHMARKS.md, 2026-11-25). A Triton config is never promoted here: a winner only keeps
    its place or gives it to cuBLAS."""
    from .search import _winner_record, cublas_side_by_side, holds_on_a_fast_host, recontest_eager

    config = Config.from_dict(eager.config)
    if kernels.is_baseline(config) or device.is_cpu:
        return None
    bench = bench or Bench(spec, problem, device, side_by_side=SideBySide(QUICK_GRAPH_MS, QUICK_CONTEST_EAGER_MS))
    try:
        holds = holds_on_a_fast_host(spec, bench, config)
        if holds and not recontest:
            return None
        if holds:  # the winner keeps its place only where it beats our cuBLAS path and torch.matmul
            return recontest_eager(spec, problem, device, bench, config, graph, eager.trials)
        ours_cublas_ms, baseline_ms = cublas_side_by_side(spec, bench, kernels.EAGER, graph)
    finally:
        bench.release()
    triton_ms = eager.triton_ms if eager.triton_ms else eager.time_ms
    return _winner_record(spec, problem, device, (config, triton_ms), baseline_ms, eager.trials, kernels.EAGER,
                          cublas_ms=ours_cublas_ms, cublas_won=True)
