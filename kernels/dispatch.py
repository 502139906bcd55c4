"""Runtime lookup: the tuned config for (this device, this kernel, this problem, this mode).

Tables load once per process from the user's database (read only; ``TUNER_DB`` or the default
SQLite file) and from the tables shipped inside the package; the user's database wins. Each record
is the winner of one dispatch mode (kernels/_modes.py): "eager" (host time counts) or "graph".

A problem with no record in the mode asked:
- eager, with a graph record: that record's config, where its host cost cannot show (see
  ``_carries_to_eager``);
- a dense matmul, bias-epilogue or gated (SwiGLU) problem nobody tuned (kernels whose spec sets
  ``baseline_when_untuned``): a Triton config only where the evidence says it beats the baseline
  (cuBLAS) in this mode on this GPU (``_untuned_choice``), else the baseline itself. A GPU with no
  records gets cuBLAS from the first call;
- grouped and MoE problems: the nearest tuned problem's config (where valid; the same shapes in
  the other of fp16/bf16 count as near), else the kernel's default, which beats the loop of
  torch.matmul it replaces. A bf16 MoE problem with K-major expert weights and no record within
  FAR_NEIGHBOUR runs its baseline, torch._grouped_mm, where that is one launch and no sync (Hopper and
  Blackwell, N and K multiples of 8: ``KernelSpec.baseline_when_far``).
Each resolved problem is cached, so the hot path of a repeated call is one dict lookup.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Hashable

import triton

from ._modes import EAGER, GRAPH
from ._spec import BASELINE, Config, DeviceInfo, KernelSpec, Problem, is_baseline, is_row_loop, log_distance

log = logging.getLogger(__name__)

SHIPPED_TABLES = "tables"  # package folder of exported JSON documents, one per GPU family
# A grouped or MoE problem nobody tuned takes its nearest record's config, unless that record is farther
# than this (``KernelSpec.transfer_distance``: 1 is a factor 2 in one feature) and the kernel's baseline
# is one launch that needs no sync (``KernelSpec.baseline_when_far``). Mixtral-sized MoE decode at 32
# tokens took the config of a 16-expert N=768 record 6.7 away and ran its layer at 0.82x
# torch._grouped_mm's under a CUDA graph (H100, docs/BENCHMARKS.md, 2026-11-25).
FAR_NEIGHBOUR = 3.0

# A graph record's config serves eager calls as well where the call's GPU time hides its host time:
# the eager caller pays max(host, GPU). The host-heavy variants qualify only above this GPU time;
# tiled, split-K and cuBLAS calls cost no more host time than torch.matmul (scripts/host_cost.py)
# and always qualify. repack launches a padding copy beside its kernel: 1.42x torch.matmul's host time
# (H100, 2026-11-24). tma cost 1.3-1.4x until 2026-11-24 (descriptors encoded per call) and 0.91-0.96x
# since (kept tensor maps); it stays in the list until the corpus measures dispatch without it.
HOST_HEAVY_HIDDEN_MS = 0.15
_HOST_HEAVY = ("tma", "repack")

# An untuned dense problem takes a tuned problem's Triton config only if that config beat cuBLAS
# there by this much in the mode asked (run-to-run spread of one kernel's median: 1-3%, H100)
# and the problem is this near (log2 distance: 1 = one dimension 2x off). 0.7 was set after the held-out
# run of 2026-11-24 (docs/BENCHMARKS.md): at 1.0, 32x3584x18944's winner (distance 0.75) ran
# 32x5120x27648 at 0.79x. Having looked, the held-out part no longer judges this value.
UNTUNED_WIN_MARGIN = 0.05
UNTUNED_NEAR = 0.7
# ... and its weight's shape (N, K) at most this near. Chosen on 2026-11-24 by a leave-one-model-out
# replay over the H200's tuned part (scripts/fallback_eval.py, docs/COSTMODEL.md), whose transfers all
# change N or K: at 0.7, 7 of 159 problems took a neighbour's winner at 0.95-0.96x in graph mode
# (DeepSeek's 2048/2816 widths from Phi-3's 3072x3072, 0.59 apart) and 9 lost eager; at 0.5, none and one,
# at a better graph geomean (1.0076 against 1.0063). The corpus's token counts are 4x apart, so the
# replay says nothing of transfers along M, which keep the looser limit above.
UNTUNED_NEAR_WEIGHTS = 0.5

# Eager calls of untuned problems with no graph evidence (``_host_bound_choice``): a near eager
# winner serves a problem of at most this much more work (bytes and FLOPs). Set on 2026-11-24 after the
# held-out eager results had been seen: judged by the H200 run and later held-out models, not by those.
HOST_BOUND_MORE_WORK = 1.3
# ... and only where torch.matmul's eager call there took at most this long: the calls whose time the
# host sets (13-25 us per call on the H100 boxes), where our cheaper launch is what wins.
HOST_BOUND_MS = 0.04
# torch.matmul's eager call took at least this long on every H100 and H200 box met (11.5-28 us, docs/BENCHMARKS.md
# 2026-11-25): a call whose cuBLAS GPU time is shorter is paced by the host.
TORCH_HOST_FLOOR_MS = 0.0115
_CHEAP_LAUNCH = ("tiled", "splitk")

# Untuned problems with no near record (``_consensus_choice``): a Triton config serves them only where it
# won, by CONSENSUS_WIN_MARGIN in graph mode, on more than CONSENSUS_SHARE of this GPU's tuned problems
# with the same number of rows of A and the same layout, of which there must be at least CONSENSUS_LEAST.
# The margin is the search's own for storing a Triton winner (tuner.search.WIN_MARGIN): many wins of one
# config over many shapes are the evidence here, where UNTUNED_WIN_MARGIN guards one transfer.
# Set on 2026-11-26 from the H100's one-row records: gemv (4, 2048, 4 warps) won 36 of 58
# there, and in a quick tune of every one-row corpus problem it beat cuBLAS on each (graph: 1.033x at
# worst over the tuned part, 1.015x over the held-out part; docs/BENCHMARKS.md, 2026-11-26).
# No other row count has a majority config (M = 8: 21 tiled winners of many shapes, 33 cuBLAS). gated_matmul's
# one-row records have one too: its one-row loop (2, 1024, 4 warps), 8 of 12, ahead of cuBLAS and the SiLU pass
# on all 12 of its one-row problems (graph 1.065x at worst, H100, 2026-11-26).
CONSENSUS_SHARE = 0.5
CONSENSUS_LEAST = 8
CONSENSUS_WIN_MARGIN = 0.02

# A near record's Triton config carries its win to an untuned problem only if the win survives the change of
# shape (``_carried_speedup``): the config's critical path (programs per SM times K steps each) against
# cuBLAS's roofline (bytes, or FLOPs over this many FLOPs per byte: the H100's and H200's balance, 800
# TFLOP/s over 3.0-4.8 TB/s, is 170-270). On the H200, Gemma-2-9B's stacked q/k/v (8192x3584) took Phi-3's
# 9216x3072 records, won there by 8-9%, and ran at 0.90-0.94x cuBLAS: one row of A, its gemv run over K in
# blocks of 1024 (3.5 of them at K = 3584), and 8 rows, its 64 tiles of 16x128 one wave whose every program
# walks a K 17% longer while the bytes grew 4% (docs/BENCHMARKS.md, 2026-11-26).
ROOFLINE_FLOPS_PER_BYTE = 250.0


@dataclass(frozen=True)
class _Entry:
    """One loaded record: its problem parsed once, at load, for the nearest-problem search."""

    problem: Problem
    config: Config
    source: str  # "database" or "shipped"
    mode: str = GRAPH
    time_ms: float | None = None
    cublas_ms: float | None = None


@dataclass(frozen=True)
class Choice:
    """What the dispatcher picked for a problem, and why (for ``explain`` and the tests)."""

    config: Config
    source: str  # "database", "shipped", "nearest:<problem key>", "default", "cublas: <why>"
    record_mode: str | None = None  # the mode of the record the config came from, if one did


class Dispatcher:
    """The process-wide cache of tuned tables. Explicit, thread-safe and clearable."""

    def __init__(self, url: str | None = None, use_shipped: bool = True) -> None:
        self._url = url
        self._use_shipped = use_shipped
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, str], dict[tuple[str, str], _Entry]] = {}
        self._resolved: dict[Hashable, Config] = {}
        self._generation = 0  # counts clears: a pinning block restores nothing across one
        # Counts resolutions (a call signature's first call, or its first after a clear): the operators'
        # sign that a call may have run a config for the first time (kernels/ops.py ``_call``).
        self.resolutions = 0
        # Counts every change to what ``cached`` answers for a key already answered (a clear, another
        # database, a pin): a cache built on those answers (kernels/epilogue.py) holds while it stands.
        self.changes = 0

    @property
    def url(self) -> str | None:
        return self._url

    def configure(self, url: str | None = None, use_shipped: bool = True) -> None:
        """Point at another database (None: ``TUNER_DB`` or the default file) and forget every table."""
        with self._lock:
            self._url = url
            self._use_shipped = use_shipped
            self._tables.clear()
            self._resolved.clear()
            self._generation += 1
            self.changes += 1

    def clear(self) -> None:
        """Forget loaded tables and resolved problems; the next call reloads (after a new tuning run)."""
        with self._lock:
            self._tables.clear()
            self._resolved.clear()
            self._generation += 1
            self.changes += 1

    def has_records(self, device: DeviceInfo, spec: KernelSpec) -> bool:
        """Whether any usable record of ``spec`` exists for ``device`` (shipped or in the database)."""
        return bool(self._table(device, spec))

    def cached(self, key: Hashable) -> Config | None:
        """The hot path: a config already resolved for this call signature, or None."""
        return self._resolved.get(key)

    @contextlib.contextmanager
    def pinning(self, keys: Sequence[Hashable], configs: Sequence[Config]) -> Iterator[list[Callable[[], None]]]:
        """One installer per config: after ``install()``, ``cached`` answers that config for every key (a
        call signature's key in each mode), until another installer runs or the block ends, when each
        key answers what it did before. The tuner times a public call with its config forced this way."""
        with self._lock:
            before, generation = {key: self._resolved.get(key) for key in keys}, self._generation
        try:
            yield [functools.partial(self._answer, dict.fromkeys(keys, config)) for config in configs]
        finally:
            # After a clear (a refresh, another database) the old answers are stale: forget the pins.
            self._answer(before if self._generation == generation else dict.fromkeys(keys))

    def _answer(self, answers: dict[Hashable, Config | None]) -> None:
        """Make ``cached`` answer each key's config (None: nothing, so the next call resolves again)."""
        with self._lock:
            for key, config in answers.items():
                if config is None:
                    self._resolved.pop(key, None)
                else:
                    self._resolved[key] = config
            self.changes += 1

    def resolve(self, key: Hashable, spec: KernelSpec, problem: Problem, device: DeviceInfo,
                mode: str = EAGER) -> Config:
        generation = self._generation
        config = self.choose(spec, problem, device, mode).config
        with self._lock:  # += is not atomic across threads: a lost count could skip a warm-up
            # A clear while we chose (a refresh thread, another database) made the answer stale: kept, it
            # would outlive the clear that the ``changes`` count says happened. The call still gets it.
            if self._generation == generation:
                self._resolved[key] = config
            self.resolutions += 1
        return config

    def choose(self, spec: KernelSpec, problem: Problem, device: DeviceInfo, mode: str = EAGER) -> Choice:
        """The config for ``problem`` in ``mode`` on ``device``, and where it came from."""
        if mode not in (EAGER, GRAPH):  # another mode would find no record and answer as for an untuned problem
            raise ValueError(f"mode {mode!r} is not eager or graph, the modes records are tuned in; pass "
                             f"{EAGER!r} or {GRAPH!r} (\"auto\" picks one of them per call: ask for each)")
        choice = self._choose(spec, problem, device, mode)
        if is_baseline(choice.config) and not spec.baseline_dispatchable(problem):
            # A baseline that would sync on every call (KernelSpec.baseline_dispatchable), reached through a
            # record of another problem (fp16 taking a bf16 record's cuBLAS) or a record from before that rule.
            return Choice(spec.default_config(problem, device), f"default: {choice.source} is a baseline that "
                          f"syncs with the host on every call for {problem.key}")
        return choice

    def _choose(self, spec: KernelSpec, problem: Problem, device: DeviceInfo, mode: str) -> Choice:
        table = self._table(device, spec)
        exact = table.get((problem.key, mode))
        if exact is not None:
            return Choice(exact.config, exact.source, exact.mode)
        if mode == EAGER:
            graph = table.get((problem.key, GRAPH))
            if graph is not None and _carries_to_eager(graph):
                return Choice(graph.config, graph.source, GRAPH)
        if spec.baseline_when_untuned and not device.is_cpu:
            return _untuned_choice(spec, problem, device, mode, table)
        # The nearest record, of the mode asked where two are as near (grouped and MoE shapes vary call by
        # call, so these kernels serve most calls from a neighbour's record).
        best: tuple[tuple[float, bool], str, Config] | None = None
        for (key, entry_mode), entry in table.items():
            d = spec.transfer_distance(problem, entry.problem)
            rank = (d, entry_mode != mode)
            if math.isfinite(d) and (best is None or rank < best[0]) and self._fits(spec, entry.config, problem, device):
                best = (rank, key, entry.config)
        if ((best is None or best[0][0] > FAR_NEIGHBOUR) and spec.baseline_dispatchable(problem)
                and spec.baseline_when_far(problem, device)):
            # No record near enough to say a Triton config wins: the baseline, one launch with no sync
            # here (torch._grouped_mm for bf16 MoE on Hopper), is what the user has without us.
            why = "no tuned record" if best is None else f"the nearest record ({best[1]}) is {best[0][0]:.1f} away"
            return Choice(BASELINE, f"baseline: {why}, past {FAR_NEIGHBOUR}")
        if best is not None:
            return Choice(best[2], f"nearest:{best[1]}")
        return Choice(spec.default_config(problem, device), "default")

    @staticmethod
    def _fits(spec: KernelSpec, config: Config, problem: Problem, device: DeviceInfo) -> bool:
        if is_baseline(config):  # a neighbour's baseline serves only where dispatch can run it as timed
            return spec.baseline_dispatchable(problem)
        return spec.space.violation(config, problem, device) is None

    def _table(self, device: DeviceInfo, spec: KernelSpec) -> dict[tuple[str, str], _Entry]:
        table = self._tables.get((device.name, spec.name))
        if table is None:
            with self._lock:
                table = self._tables.get((device.name, spec.name))
                if table is None:
                    table = self._load(device, spec)
                    self._tables[(device.name, spec.name)] = table
        return table

    def _load(self, device: DeviceInfo, spec: KernelSpec) -> dict[tuple[str, str], _Entry]:
        table: dict[tuple[str, str], _Entry] = {}
        rows: list[tuple[dict, str]] = []  # (the record's fields, source)
        if self._use_shipped:
            rows += [(r, "shipped") for r in _shipped_records(device.name, spec.name)]
        rows += [(vars(r), "database") for r in _database_records(self._url, device.name, spec.name)]
        other_versions: dict[str, int] = {}
        for fields, source in rows:  # the database comes last: it wins
            key, version = fields.get("problem_key", ""), fields.get("triton_version", "")
            try:
                _check_plausible(fields)
                entry = _entry(spec, fields, source)
                table[(key, entry.mode)] = entry
            except (ValueError, TypeError, KeyError) as exc:  # a damaged or hand-edited table
                log.warning("skipping the %s record of %s %s on %s: %s", source, spec.name, key, device.alias, exc)
                continue
            if version and _minor(version) != _minor(triton.__version__):
                other_versions[version] = other_versions.get(version, 0) + 1
        if other_versions:
            tuned_with = ", ".join(f"{n} with triton {v}" for v, n in sorted(other_versions.items()))
            log.warning("%s configs for %s were tuned under another triton (%s; this is %s): they run, but may "
                        "no longer be the fastest; re-tune with `python -m tuner search --kernel %s`",
                        spec.name, device.alias, tuned_with, triton.__version__, spec.name)
        log.debug("loaded %d tuned %s problems for %s", len(table), spec.name, device.name)
        return table


def _check_plausible(fields: dict) -> None:
    from db import plausibility_problems  # db is imported only when a table loads

    problems = plausibility_problems(fields)
    if problems:
        raise ValueError("not plausible: " + "; ".join(problems))


def _entry(spec: KernelSpec, fields: dict, source: str) -> _Entry:
    """A stored record (its fields) as dispatch uses it; ValueError (or TypeError, KeyError) if it
    cannot be used."""
    problem = Problem.from_key(spec.name, fields.get("problem_key", ""))
    spec.check_problem(problem)
    config = _config_of(fields.get("config") or {})
    reason = spec.outside(config)
    if reason:
        raise ValueError(reason)
    mode = fields.get("mode", GRAPH)  # records from before modes were timed as a graph replay sees them
    if mode not in (EAGER, GRAPH):
        raise ValueError(f"mode {mode!r} is not eager or graph")
    return _Entry(problem, config, source, mode, _number(fields.get("time_ms")), _number(fields.get("cublas_ms")))


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def _carries_to_eager(graph: _Entry) -> bool:
    """Whether a graph record's config may serve an eager call of the same problem (see HOST_HEAVY_HIDDEN_MS)."""
    if is_baseline(graph.config) or graph.config.get("VARIANT") not in _HOST_HEAVY:
        return True
    return graph.time_ms is not None and graph.time_ms >= HOST_HEAVY_HIDDEN_MS


def _untuned_choice(spec: KernelSpec, problem: Problem, device: DeviceInfo, mode: str,
                    table: dict[tuple[str, str], _Entry]) -> Choice:
    """A problem nobody tuned in ``mode``: a tuned problem's Triton config where the evidence says it
    will beat cuBLAS here, else cuBLAS (the user's torch.matmul, never worse than it).

    For the epilogue kernels (bias, gated) the baseline is cuBLAS plus torch's elementwise ops. With
    its gated problems on the default config, a 70B decoder layer's prefill ran 1.38x slower than in
    torch (H100, docs/BENCHMARKS.md, 2026-11-24): an untried tile is never the safe guess.

    The evidence is the nearest tuned problem (``_untuned_distance``) whose graph record is a Triton
    config that beat torch.matmul there by UNTUNED_WIN_MARGIN, and still does here once its critical path's
    growth and cuBLAS's are taken into account (``_carried_speedup``): GPU time, which carries over to a
    near shape. Eager calls take it too where its host cost cannot show (``_carries_to_eager``);
    eager winners themselves are not evidence, since an eager win on a host-bound shape is a win
    of host time that a larger neighbour does not share (held out on the H100: a thin-M eager
    winner of 32x3584x3584 ran 32x5120x5120 at 0.37x, docs/BENCHMARKS.md). Where no record is near, a
    config that won most tuned problems of the problem's class (``_consensus_choice``) is the evidence."""
    best: tuple[float, str, Config] | None = None
    for (key, entry_mode), entry in table.items():
        if entry_mode != GRAPH or (mode == EAGER and not _carries_to_eager(entry)):
            continue
        if not _won_clearly(entry):
            continue
        d = _untuned_distance(spec, problem, entry.problem)
        if math.isfinite(d) and (best is None or d < best[0]) and \
                spec.space.violation(entry.config, problem, device) is None and \
                _carried_speedup(entry, problem, device) >= 1.0 + UNTUNED_WIN_MARGIN:
            best = (d, key, entry.config)
    if best is not None:
        return Choice(best[2], f"nearest:{best[1]}")
    consensus = _consensus_choice(spec, problem, device, mode, table)
    if consensus is not None and not is_baseline(consensus.config):
        return consensus
    if mode == EAGER and spec.name == "matmul":  # only matmul has the cheap direct launch (kernels/_launch.py)
        host_bound = _host_bound_choice(spec, problem, device, table)
        if host_bound is not None:
            return host_bound
    return consensus or Choice(BASELINE, "cublas: no tuned evidence that a Triton config wins here")


def _consensus_choice(spec: KernelSpec, problem: Problem, device: DeviceInfo, mode: str,
                      table: dict[tuple[str, str], _Entry]) -> Choice | None:
    """An untuned problem with no near record: the Triton config that won clearly on a majority of this
    GPU's tuned problems of its class (as many rows of A, the same layout, a dtype whose records carry over),
    where that class is large enough to judge by (CONSENSUS_SHARE, CONSENSUS_LEAST), else None; cuBLAS,
    saying why, where its blocks fill this problem's K worse than any its wins speak for (``_least_fill_won``).

    A class where one config wins most problems whatever their N and K is a class where that config's
    advantage does not hang on the shape: one row of A against a K-major weight streams the weight, and
    gemv's thin column blocks stream it faster than cuBLAS on every one-row shape tried. Graph records vote
    (GPU time carries across shapes; an eager win may be a win of host time), and for an eager call only
    configs whose host cost cannot show (``_carries_to_eager``)."""
    rows, votes, peers = problem.shapes[0][0], {}, []
    won: dict[Config, list[str]] = {}
    for (key, entry_mode), entry in table.items():
        tuned = entry.problem
        # Only records that carry over by dtype vote: the other half type's do, a half type's never an fp32 one's.
        if entry_mode != GRAPH or tuned.layout != problem.layout or tuned.shapes[0][0] != rows \
                or not math.isfinite(spec.transfer_distance(problem, tuned)):
            continue
        peers.append(entry)
        if _won_clearly(entry, CONSENSUS_WIN_MARGIN) and (mode == GRAPH or _carries_to_eager(entry)):
            votes[entry.config] = votes.get(entry.config, 0) + 1
            won.setdefault(entry.config, []).append(key)
    voters = len(peers)
    if voters < CONSENSUS_LEAST or not votes:
        return None
    config, count = max(votes.items(), key=lambda item: item[1])
    if count <= CONSENSUS_SHARE * voters or spec.space.violation(config, problem, device) is not None:
        return None
    # An eager call whose baseline the host paces (its GPU time under the fastest host's call: torch.matmul's,
    # or the kernel's baseline's own floor where that is more) shows the GPU time that graph contests judge,
    # under the host: there the graph wins speak for the eager call too.
    host_floor_ms = max(TORCH_HOST_FLOOR_MS, spec.baseline_host_floor_ms)
    judged_by = EAGER if mode == EAGER and _cublas_ms_at_most(problem, peers) >= host_floor_ms else GRAPH
    fill, least = _k_fill(config, problem), _least_fill_won(config, won[config], judged_by, table)
    if fill < least:
        if not math.isfinite(least):
            return Choice(BASELINE, f"cublas: the M = {rows} consensus won no eager contest where it won the graph one")
        contests = "eager contests" if judged_by == EAGER else "contests"
        return Choice(BASELINE, f"cublas: the M = {rows} consensus fills K to {fill:.2f} here; it won {contests} "
                                f"only at fills of {least:.2f} or more")
    return Choice(config, f"consensus:{count} of {voters} tuned {problem.layout} problems with M = {rows}")


def _cublas_ms_at_most(problem: Problem, peers: list[_Entry]) -> float:
    """A bound on cuBLAS's GPU time on ``problem``: its graph time on the quickest of ``peers`` (graph records of
    the class) with at least as much work by the roofline (``_roofline``); infinite where none has."""
    work = _roofline(problem)
    return min((peer.cublas_ms for peer in peers if peer.cublas_ms is not None and _roofline(peer.problem) >= work),
               default=math.inf)


def _least_fill_won(config: Config, keys: list[str], mode: str, table: dict[tuple[str, str], _Entry]) -> float:
    """The least K fill (``_k_fill``) at which ``config`` won, in ``mode``, one of the problems ``keys`` whose
    graph contests it won; infinite (no K qualifies) where it won none of them so.

    Its wins say nothing of a K its blocks fill worse: gemv's 2048-wide blocks walk K = 2304 in two steps,
    the second one-eighth full, and ran 9216x2304 at 0.86-0.90x cuBLAS on the H100, where it won down to
    K = 3072, three quarters full (docs/BENCHMARKS.md, 2026-11-27). Judged by eager
    contests, a win counts only where the problem's eager contest went to the same config too: at K = 3072 the
    H100's eager contests went to another gemv (1024-wide blocks), and the consensus config ran 5120x3072 and
    8192x3072 at 0.97x torch.matmul's eager call, 1.02-1.03x in graph replays (2026-11-27)."""
    fills = []
    for key in keys:
        if mode == EAGER:
            eager = table.get((key, EAGER))
            if eager is None or eager.config != config or not _won_clearly(eager, CONSENSUS_WIN_MARGIN):
                continue
        fills.append(_k_fill(config, table[(key, GRAPH)].problem))
    return min(fills, default=math.inf)


def _k_fill(config: Config, problem: Problem) -> float:
    """How full ``config``'s K steps are on ``problem`` (its least over the GEMMs): the K a program walks over
    its steps' width (``_k_walk``, the steps ``_triton_span`` counts; a last, partial one counted whole)."""
    fills = []
    for _, _, k in problem.shapes:
        part, width = _k_walk(config, k)
        fills.append(part / (math.ceil(part / width) * width))
    return min(fills)


def _k_walk(config: Config, k: int) -> tuple[int, int]:
    """The K one program of ``config`` walks, and the width of its steps: all of K in GEMV_BLOCK_K steps for a
    row loop (``is_row_loop``), K over SPLIT_K in BLOCK_K steps otherwise."""
    if is_row_loop(config):
        return k, config.get("GEMV_BLOCK_K", 256)
    return math.ceil(k / config.get("SPLIT_K", 1)), config.get("BLOCK_K", 64)


def _host_bound_choice(spec: KernelSpec, problem: Problem, device: DeviceInfo,
                       table: dict[tuple[str, str], _Entry]) -> Choice | None:
    """An eager call with no graph evidence: a near problem's eager winner, where it is a config with the
    cheap direct launch that beat torch.matmul's eager time clearly and this problem is barely more work.

    An eager caller pays max(host, GPU) per call. On calls of 10-30 us the host decides: a tiled or
    split-K plan launched from C++ costs about 0.45x torch.matmul's host time, and cuBLAS through us
    about torch's own (scripts/host_cost.py, H100 and H200 boxes, 2026-11-25), so a Triton config whose
    GPU time hides under the host's wins.
    Eager winners transfer badly where the GPU time grows past the host's (32x3584x3584's ran
    32x5120x5120, 2x the work, at 0.37x; 128x3584x3584's, won by 7%, ran 128x3584x4096 at 0.75x), so
    the problem may be at most HOST_BOUND_MORE_WORK times the tuned one's work (bytes and FLOPs), and
    the win there must survive that growth: its time times the growth still beats torch.matmul's.
    Only host-bound evidence counts (torch.matmul's eager call there under HOST_BOUND_MS)."""
    best: tuple[float, str, Config] | None = None
    for (key, entry_mode), eager in table.items():
        if entry_mode != EAGER or not _won_clearly(eager) or eager.config.get("VARIANT", "tiled") not in _CHEAP_LAUNCH \
                or eager.cublas_ms > HOST_BOUND_MS:
            continue
        d = _untuned_distance(spec, problem, eager.problem)
        if not math.isfinite(d) or (best is not None and d >= best[0]):
            continue
        ratio = _work_ratio(problem, eager.problem)
        # Even if its whole time grew with the work, or with its own critical path where that grows more
        # (``_triton_span``), it would still beat torch's time there, which torch's time here is no less than.
        growth = max(ratio, 1.0, _span_growth(eager.config, problem, eager.problem, device))
        if ratio <= HOST_BOUND_MORE_WORK and eager.time_ms * growth * (1 + UNTUNED_WIN_MARGIN) <= \
                eager.cublas_ms and spec.space.violation(eager.config, problem, device) is None:
            best = (d, key, eager.config)
    return None if best is None else Choice(best[2], f"eager-near:{best[1]}")


def _carried_speedup(entry: _Entry, problem: Problem, device: DeviceInfo) -> float:
    """The speed-up over cuBLAS that ``entry``'s config should keep on ``problem``: its win where it was tuned,
    times how cuBLAS's time grows (its roofline) over how the config's grows (its critical path)."""
    if entry.time_ms is None or entry.cublas_ms is None:
        return 0.0
    won = entry.cublas_ms / entry.time_ms
    growth = _span_growth(entry.config, problem, entry.problem, device)
    return won * (_roofline(problem) / _roofline(entry.problem)) / growth


def _span_growth(config: Config, problem: Problem, tuned: Problem, device: DeviceInfo) -> float:
    """How much ``config``'s critical path (``_triton_span``) grows from ``tuned`` to ``problem``, the larger
    of two counts of programs beyond the SMs: shared evenly, or in whole waves.

    Across token counts too: a new row of tiles is a new wave of programs over the weight. Once exempt (on
    the guess that L2 serves the second pass), 16x4096x4096's tile of 16 rows then ran 24x4608x4096 at
    0.68-0.74x cuBLAS on the H100 in every mode: 288 programs in three waves where it had won with 128 in one."""
    return max(_triton_span(config, problem, device, whole) / _triton_span(config, tuned, device, whole)
               for whole in (False, True))


def _roofline(problem: Problem) -> float:
    """cuBLAS's time on ``problem``, up to a constant: its bytes, or its FLOPs at the card's balance."""
    flops = bytes_ = 0.0
    for m, n, k in problem.shapes:
        flops += 2.0 * m * n * k
        bytes_ += 2.0 * (m * k + k * n + m * n)
    return max(bytes_, flops / ROOFLINE_FLOPS_PER_BYTE)


def _triton_span(config: Config, problem: Problem, device: DeviceInfo, whole_waves: bool = False) -> float:
    """A Triton config's time on ``problem``, up to a constant that is the config's own: its programs per SM
    (at least one), times the K steps each program walks (a last, partial step counts whole).

    Programs beyond the SMs: shared evenly (several are resident on one SM at once), or, ``whole_waves``, as
    the busiest SM holds them (programs over SMs rounded up). Neither alone tells the time: on the H100 a
    16x32 tile's 144 programs (K = 2048) took 1.03x its 128 programs' time at K = 2816, where evenly
    shared they count 0.79x and in whole waves 1.45x (docs/BENCHMARKS.md, 2026-11-27)."""
    sms = max(device.sm_count, 1)
    span = 0.0
    for m, n, k in problem.shapes:
        if is_row_loop(config):
            programs = m * math.ceil(n / config.get("GEMV_BLOCK_N", 1))
        else:
            programs = (math.ceil(m / config.get("BLOCK_M", 64)) * math.ceil(n / config.get("BLOCK_N", 64))
                        * config.get("SPLIT_K", 1))
        part, width = _k_walk(config, k)
        steps = math.ceil(part / width)
        per_sm = math.ceil(programs / sms) if whole_waves else programs / sms
        span += max(per_sm, 1.0) * max(steps, 1)
    return span


def _untuned_distance(spec: KernelSpec, problem: Problem, tuned: Problem) -> float:
    """How far ``tuned``'s record is from an untuned ``problem`` (``transfer_distance``), or infinite past
    UNTUNED_NEAR in all, or past UNTUNED_NEAR_WEIGHTS in N and K alone."""
    d = spec.transfer_distance(problem, tuned)
    if d > UNTUNED_NEAR or log_distance(problem.shape[1:], tuned.shape[1:]) > UNTUNED_NEAR_WEIGHTS:
        return math.inf
    return d


def _work_ratio(problem: Problem, tuned: Problem) -> float:
    """How much more work ``problem`` is than ``tuned`` (bytes or FLOPs, whichever grew more)."""
    return max(problem.flops / max(tuned.flops, 1.0), problem.bytes_moved(2) / max(tuned.bytes_moved(2), 1.0))


def _won_clearly(entry: _Entry, margin: float | None = None) -> bool:
    """Whether ``entry`` is a Triton config that beat cuBLAS where it was tuned by ``margin`` (default
    UNTUNED_WIN_MARGIN; see _untuned_choice)."""
    if is_baseline(entry.config) or entry.time_ms is None or entry.cublas_ms is None:
        return False
    return entry.time_ms * (1 + (UNTUNED_WIN_MARGIN if margin is None else margin)) <= entry.cublas_ms


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def _config_of(values: dict) -> Config:
    return BASELINE if values.get("VARIANT") == "cublas" else Config.from_dict(values)


def _database_records(url: str | None, device_name: str, kernel: str) -> list:
    """The user's records, read only; a missing or unreadable database means none (with a warning)."""
    from db import Store, StoreError

    try:
        store = Store(url, create=False)
        try:
            return store.records(device=device_name, kernel=kernel)
        finally:
            store.close()
    except StoreError as exc:  # e.g. a PostgreSQL server that cannot be reached: one warning per database
        shown = url or "the default database"
        if shown not in _WARNED:
            _WARNED.add(shown)
            log.warning("tuned configs unavailable, using the shipped tables and defaults: %s", exc)
        else:
            log.debug("tuned configs still unavailable: %s", exc)
        return []


_WARNED: set[str] = set()  # databases already warned about: a dead server warns once, not per kernel


def shipped_devices() -> list[dict]:
    """The ``devices`` entries (name, alias, compute_capability, sm_count) of the tables inside the package."""
    found: list[dict] = []
    for document in _shipped_documents():
        devices = document.get("devices", [])
        found += [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []
    return found


def _shipped_records(device_name: str, kernel: str) -> list[dict]:
    """Records of the JSON tables inside the package for this GPU (raw dicts: validated when shipped)."""
    return table_records(_shipped_documents(on_damage=_warn_damaged_table), device_name, kernel)


def _shipped_documents(on_damage: Callable[[str, Exception], None] | None = None) -> Iterator[dict]:
    """Each JSON table inside the package, read whole; a damaged one (not JSON, too deep, not a records export)
    is handed to ``on_damage`` and skipped: a damaged install must not stop a matmul."""
    folder = resources.files(__package__).joinpath(SHIPPED_TABLES)
    if not folder.is_dir():
        return
    yield from table_documents(folder.iterdir(), on_damage)


def table_documents(entries: Iterable[Any], on_damage: Callable[[str, Exception], None] | None = None
                    ) -> Iterator[dict]:
    """The records exports among ``entries`` (paths or package resources; folders are listed), each read whole;
    a damaged one goes to ``on_damage`` and is skipped. Also the reader of ``kernels.autotune(tables=...)``."""
    for entry in entries:
        if entry.is_dir():
            yield from table_documents(sorted(entry.iterdir(), key=lambda e: e.name), on_damage)
            continue
        if not entry.name.endswith(".json"):
            continue
        try:
            document = json.loads(entry.read_text())
            if not isinstance(document, dict) or not isinstance(document.get("records", []), list):
                raise ValueError("no list of 'records' in an object")
        except (ValueError, OSError, RecursionError) as exc:
            if on_damage is not None:
                on_damage(entry.name, exc)
            continue
        yield document


def table_records(documents: Iterable[dict], device_name: str, kernel: str) -> list[dict]:
    """The raw records of ``documents`` for this GPU and kernel (validated when shipped)."""
    return [r for document in documents for r in document.get("records", [])
            if isinstance(r, dict) and r.get("device_name") == device_name and r.get("kernel") == kernel]


def _warn_damaged_table(name: str, exc: Exception) -> None:
    log.warning("skipping the shipped table %s: it is not a records export (%s); reinstall triton-tuner", name, exc)


DISPATCHER = Dispatcher()
