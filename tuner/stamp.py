"""Stamp stored eager records with what the user's call gets, timed again in this process.

Why: a search decides an eager winner in side-by-side contests, in its own process, and until 2026-11-26
stored a Triton winner's least win (a low reading of what the call gets; now its median contest). Tables
decided under earlier timers still carry those timers' figures. In a fresh process on the H100 (2026-11-26,
docs/BENCHMARKS.md) 61 of 406 eager records of the shipped table read more than 3% off what they stored, from
0.49x to 1.69x of it. A stamp times each record's winner again, through the public call (with the graph
winner held beside it, as dispatch holds it) against the baseline (torch.matmul), side by side as the
contest and scripts/bench_dispatch.py time them. It does so in several passes over all the records,
spread in time, because the host's speed moves from second to second on the GPU boxes and a pass meets
one phase of it. The record keeps the times of its median pass.

A winner changes in one case only: a Triton winner whose median pass is slower than the baseline gives
its place to cuBLAS, timed through our dispatch path in as many passes (``Stamp.demoted_from``), where
cuBLAS reads no slower: a stored winner must never lose to torch.matmul. Nothing is promoted here: a
stamp is no search.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from datetime import datetime, timezone
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton

import kernels
from db import Record, Store, plausibility_problems
from kernels import BASELINE, EAGER, GRAPH, Config, DeviceInfo, KernelSpec, Problem

from . import timing
from .bench import Bench, SideBySide
from .search import EAGER_PASS_PAUSE_S, at_par_when_gpu_bound

log = logging.getLogger(__name__)

# Three passes make a median that one phase of the host cannot move, as far apart as confirm_eager's contests.
STAMP_PASSES = 3
STAMP_PAUSE_S = EAGER_PASS_PAUSE_S
# The eager ms per side of one record's timing: the bench's per problem (bench_dispatch.py, 2 rounds).
STAMP_EAGER_MS = 40.0
# Each timing waits for the host's nominal speed (up to this long): the host runs slower for seconds at a
# time on the lent machines, and a stamp read in such a phase is not what the same call reads in the next.
STAMP_SETTLE_S = timing.HOST_SETTLE_S

MakeBench = Callable[[KernelSpec, Problem], Bench]


@dataclass(frozen=True)
class Stamp:
    """One eager record stamped: the record as now stored, what it stored before, each pass's speed-up."""

    record: Record
    was: float | None  # the speed-up stored before
    passes: tuple[float, ...]  # the speed-up measured in each pass that ran
    # Where the stored Triton winner lost to the baseline and cuBLAS took its place: the winner's readings.
    demoted_from: tuple[float, ...] = ()

    @property
    def speedup(self) -> float:
        return self.record.speedup or 0.0

    @property
    def moved(self) -> float:
        """Stamped over stored speed-up (1.0: the record had it right)."""
        return self.speedup / self.was if self.was else float("nan")

    @property
    def losing(self) -> bool:
        """A Triton winner slower than the baseline now: a case for deciding the problem again."""
        return not kernels.is_baseline(Config.from_dict(self.record.config)) and self.speedup < 1.0


def stampable(record: Record) -> str | None:
    """Why ``record`` cannot be stamped, or None. Only eager records of a kernel whose public call the
    timing can pin (matmul, matmul_bias, gated_matmul, moe_matmul, moe_gated_matmul) are: grouped_matmul's dispatch caches
    its launches by operand address, so no timing of it is the user's call."""
    if record.mode != EAGER:
        return "a graph record (its time is the GPU's, from a CUDA-graph replay)"
    spec = kernels.KERNELS.get(record.kernel)
    if spec is None:
        return f"kernel {record.kernel!r} is not one of {', '.join(sorted(kernels.KERNELS))}"
    if timing._public(spec) is None:
        return f"{record.kernel}'s public call cannot be pinned to a config"
    if not record.cublas_ms:
        return "no baseline time stored (nothing to compare with)"
    return None


def stamp_eager(records: Sequence[Record], device: DeviceInfo, *, passes: int = STAMP_PASSES,
                pause_s: float = STAMP_PAUSE_S, settle_s: float = STAMP_SETTLE_S,
                make_bench: MakeBench | None = None,
                sleep: Callable[[float], None] = time.sleep,
                progress: Callable[[int, int, Stamp | None, str], None] | None = None) -> list[Stamp]:
    """Each stampable eager record of ``device`` in ``records``, timed ``passes`` times and stored with its
    median pass (``Stamp.record``); a Triton winner slower than the baseline there is replaced by cuBLAS,
    timed in as many passes again, where cuBLAS's median is no lower (``Stamp.demoted_from``). A record whose timing fails in every pass is left
    out (logged). ``settle_s``: each timing waits up to this long for the host's nominal speed (0: none).
    ``make_bench``: how a problem is timed (default: a side-by-side Bench on this GPU;
    a test passes one with its own timer). ``progress(pass, index, stamp, note)`` after each timing."""
    if passes < 1:
        raise ValueError(f"passes={passes}: give 1 or more (passes over the records, median kept)")
    if device.is_cpu and make_bench is None:
        raise ValueError("stamping times the user's call on the GPU its records are for; run it on that GPU "
                         "(a CPU's interpreter times nothing a user runs)")
    make_bench = make_bench or (lambda spec, problem: Bench(spec, problem, device,
                                                            side_by_side=SideBySide(eager_ms=STAMP_EAGER_MS,
                                                                                    settle_s=settle_s)))
    graphs = {r.key[:3]: r for r in records if r.mode == GRAPH and r.device_name == device.name}
    graph_winner = {key: Config.from_dict(r.config) for key, r in graphs.items()}
    graph_cublas_ms = {key: r.cublas_ms for key, r in graphs.items()}
    chosen = [r for r in records if r.device_name == device.name and stampable(r) is None]

    def stamp_of(record: Record, readings: list[tuple[float, float]]) -> Stamp:
        return _stamp(record, readings, graph_cublas_ms.get(record.key[:3]))

    def read(chosen: list[Record], first_pass: int) -> dict[tuple, list[tuple[float, float]]]:
        readings: dict[tuple, list[tuple[float, float]]] = {r.key: [] for r in chosen}  # (ours ms, baseline ms)
        for pass_ in range(passes):
            if pass_ or first_pass:
                sleep(pause_s)  # another moment, maybe another phase of the host
            for index, record in enumerate(chosen, 1):
                note = ""
                try:
                    readings[record.key].append(_time_once(record, graph_winner.get(record.key[:3]), make_bench))
                except Exception as error:  # one record's failure (out of memory) costs only its reading
                    note = f"{record.kernel} {record.problem_key} not timed: {type(error).__name__}: {error}"
                    log.warning("stamp: %s", note)
                if progress is not None:
                    progress(first_pass + pass_ + 1, index, None if note else stamp_of(record, readings[record.key]),
                             note)
        return readings

    readings = read(chosen, 0)
    stamps = {r.key: stamp_of(r, readings[r.key]) for r in chosen if readings[r.key]}
    # A Triton winner the user's call now gets slower than the baseline gives its place to cuBLAS, timed the
    # same way: a stored winner must never lose to torch.matmul (where dispatch can run the baseline at all).
    losing = [s for s in stamps.values() if s.losing and kernels.get_kernel(s.record.kernel).baseline_dispatchable(
        Problem.from_key(s.record.kernel, s.record.problem_key))]
    fallbacks = [dataclasses.replace(s.record, config=BASELINE.as_dict()) for s in losing]
    fallback_readings = read(fallbacks, passes) if fallbacks else {}
    for stamp, fallback in zip(losing, fallbacks):
        if not fallback_readings[fallback.key]:
            continue
        demoted = stamp_of(fallback, fallback_readings[fallback.key])
        # cuBLAS takes the place only where it is no slower than the winner it replaces, read the same way.
        if statistics.median_low(demoted.passes) >= statistics.median_low(stamp.passes):
            stamps[fallback.key] = Stamp(demoted.record, stamp.was, demoted.passes, demoted_from=stamp.passes)
    return [stamps[r.key] for r in chosen if r.key in stamps and _plausible(stamps[r.key])]


def _plausible(stamp: Stamp) -> bool:
    """Whether the database will take the stamped record (db.plausibility_problems); one that it would
    refuse is left out, logged, so that it cannot make a whole batch's write fail."""
    problems = plausibility_problems(stamp.record)
    if problems:
        log.warning("stamp: %s %s left as stored: %s", stamp.record.kernel, stamp.record.problem_key,
                    "; ".join(problems))
    return not problems


def summary(stamps: Sequence[Stamp]) -> str:
    """One line for a person: how many were stamped and moved by more than 3%, which Triton winners gave their
    place to cuBLAS (both readings), and which are slower than the baseline still."""
    moved = sum(abs(s.moved - 1) > 0.03 for s in stamps)
    demoted = [f"{s.record.problem_key} ({statistics.median_low(s.demoted_from):.3f}x, cuBLAS {s.speedup:.3f}x)"
               for s in stamps if s.demoted_from]
    losing = [s.record.problem_key for s in stamps if s.losing]
    return (f"{len(stamps)} stamped, {moved} moved by more than 3%"
            + (f"; {len(demoted)} Triton winner(s) slower than the baseline now, cuBLAS in their place: "
               + ", ".join(demoted) if demoted else "")
            + (f"; {len(losing)} slower than the baseline, with cuBLAS no faster or not timed; decide them again "
               "with `python -m tuner search` or scripts/redecide.py: " + ", ".join(losing) if losing else ""))


def store_stamps(store: Store, stamps: Sequence[Stamp], read: Sequence[Record]) -> list[Record]:
    """Store the stamped records whose problem's record in ``store`` is still the one ``read`` before the
    timing (same winner, same time of writing); returns those stored. Why: a stamp takes minutes, and a
    search or a fleet worker may store a newer record of a problem meanwhile; that one stays (its winner
    may differ), and the problem can be stamped again."""
    before = {r.key: (r.config, r.created_at) for r in read}
    unchanged = []
    for stamp in stamps:
        now = store.get(*stamp.record.key)
        if now is not None and (now.config, now.created_at) == before.get(stamp.record.key):
            unchanged.append(stamp.record)
    store.put_many(unchanged, on_conflict="replace")
    return unchanged


def _time_once(record: Record, graph: Config | None, make_bench: MakeBench) -> tuple[float, float]:
    spec = kernels.get_kernel(record.kernel)
    bench = make_bench(spec, Problem.from_key(record.kernel, record.problem_key))
    try:
        (ours,), theirs = bench.contest([Config.from_dict(record.config)], mode=EAGER, graph=graph)
    finally:
        bench.release()
    if not (ours > 0 and theirs > 0):
        raise ValueError(f"timed {ours!r} ms against {theirs!r} ms")
    return ours, theirs


def _stamp(record: Record, readings: list[tuple[float, float]], graph_cublas_ms: float | None) -> Stamp:
    """``record`` with the times of its median reading (by speed-up; the lower middle of an even count).
    A cuBLAS winner of a GPU-bound call then stores the baseline's time (search.at_par_when_gpu_bound):
    our path runs the same kernel, and what its reading adds is the method's noise."""
    speedups = [theirs / ours for ours, theirs in readings]
    ours, theirs = readings[timing.median_pass(speedups)]
    winner_is_triton = record.triton_config is not None and record.config == record.triton_config
    flops = Problem.from_key(record.kernel, record.problem_key).flops
    stamped = dataclasses.replace(
        record, time_ms=ours, cublas_ms=theirs, tflops=flops / (ours * 1e-3) / 1e12,
        triton_ms=ours if winner_is_triton else record.triton_ms, torch_version=torch.__version__,
        triton_version=triton.__version__, cuda_version=torch.version.cuda or record.cuda_version,
        created_at=datetime.now(timezone.utc))
    return Stamp(at_par_when_gpu_bound(stamped, graph_cublas_ms), record.speedup, tuple(speedups))
