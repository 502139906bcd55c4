"""One Optuna study per (device, kernel, problem), kept in the same database as the winners.

Because the study lives in the database, a search that is interrupted (Ctrl-C, kill -9) resumes
where it stopped: finished trials stay, and a budget of trials counts them (a budget of seconds is the
run's own: a resumed run gets its seconds anew). Configs that break a constraint
are pruned without compiling and do not count against the budget; a config already measured in this
study is answered from the study instead of being measured again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
import math
import shlex
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState
import torch
import triton
from sqlalchemy import make_url
from sqlalchemy.exc import SQLAlchemyError

import kernels
from db import Outage, Record, Store, StoreError, StoreUnreachable, plausibility_problems, server_unreachable
from kernels import BASELINE, EAGER, GRAPH, Config, DeviceInfo, KernelSpec, Problem
from kernels.dispatch import Dispatcher

from . import timing
from .bench import Bench, EagerTimer, Measurement, Timer
from .space import config_of, narrowed, params_of, suggest_config
from .workers import DEFAULT_AHEAD, CheckPool, IsolatedBench

log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "random", "gp", "cmaes")

# TPE's `group` option is marked experimental; it is what lets multivariate TPE handle the
# variant-dependent parameters, and the warning says nothing a user can act on.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

# How much faster than the baseline a Triton config must be to be chosen over it (see _winner_record).
WIN_MARGIN = 0.02

# A contest whose winner times this many times its time in the search is not believed: it is run
# again after a pause, up to CONTEST_ATTEMPTS times in all (see head_to_head and ``believed``). Two
# timings of one config differ by up to 3-5% on the H100; disturbed contests there read 1.44x
# (moe_matmul), 3.4x (dense) and 13x (a host-bound group) the search's time.
HEAD_TO_HEAD_DISAGREES = 1.15
CONTEST_ATTEMPTS = 3
CONTEST_PAUSE_S = 2.0

# The final contest times side by side the best configs within FINALIST_MARGIN of the best, at most
# FINALISTS of them: on the H100 two timings of one config differ by up to 3% (the search's against
# a sweep's, 2026-11-23), so configs that close may be in the wrong order.
FINALISTS = 3
FINALIST_MARGIN = 0.03
# Kernels whose eager contest times the baseline a second time as our dispatch runs it (the public call
# with the baseline pinned: tuner/timing.py public_call), since that call adds the signature lookup's
# host time to torch's: a stored cuBLAS winner's time is then what the user's call costs.
DISPATCHED_BASELINE = ("matmul", "matmul_bias", "gated_matmul")
# An eager winner must also be near cuBLAS on the GPU: its graph time at most this much over torch's.
# An eager win of a config that is slower on the GPU is a win of host time that holds only on a host as
# slow as the tuning one; the H100 boxes' hosts differ up to 1.7x (torch.matmul 12-20 us per call), and
# such winners, tuned on a slow host, ran at 0.63-0.75x on a fast one (docs/BENCHMARKS.md, 2026-11-24).
EAGER_GPU_MARGIN = 0.03
# ... and back to back on the GPU (``holds_on_a_fast_host``), at most this much over cuBLAS: an eager loop on
# a host that keeps the GPU busy pays each call's own launches and gaps. Since 2026-11-26 back to back is
# timed on calls queued behind a GPU sleep, launched as such a loop launches them; before, on a CUDA graph
# of calls, which hid part of those gaps: bf16 1x2048x10944's split-K winner ran 1.5% behind cuBLAS in that
# graph and 5% behind in eager loops where the host kept up (scripts/probes/gemv_state_probe.py, retired at 1996844, H100,
# 2026-11-25), and the queued timer moved 12 of the H100 table's 64 eager Triton winners to cuBLAS (H100,
# docs/BENCHMARKS.md, 2026-11-26).
FAST_HOST_MARGIN = 0.01
# A call whose cuBLAS takes at least this long on the GPU (back to back, or torch.matmul's graph time) is
# GPU-bound on every box we met: torch.matmul's host time per call was 11.5-28 us on the H100 and H200
# boxes (docs/BENCHMARKS.md, 2026-11-25). Always a GPU time, never an eager one, which
# a slow host or a baseline of several launches (gated_matmul's) could push past this while host-bound.
# There an eager time is the GPU's time, so (1) an eager Triton winner must beat cuBLAS back to back by
# WIN_MARGIN, not merely hold within FAST_HOST_MARGIN: the H200 table's GPU-bound eager winners (M = 8 and
# 32 of 28672x8192), stored at 1.045-1.078x on one box, within 1% of cuBLAS back to back, measured
# 0.945-1.016x on the next (NVIDIA H200, docs/BENCHMARKS.md, 2026-11-26); and (2) a cuBLAS eager winner stores torch.matmul's time:
# our path runs the same at::mm, and contests had stored the two's spread as a speed-up (0.935-1.056x,
# measured 1.00-1.07x in a fresh process: the bench's own spread; NVIDIA H200, 2026-11-26).
GPU_BOUND_EAGER_MS = 0.05

# An eager Triton winner must win this many side-by-side contests in all, each by WIN_MARGIN, or cuBLAS
# takes its place (``confirm_eager``): the deciding one against our cuBLAS path as dispatch would run it
# (``eager_winner``; from C++ it costs less host time than torch.matmul, so that is the harder one to beat
# where the C++ path is built), and EAGER_PASSES - 1 more, EAGER_PASS_PAUSE_S apart, against torch.matmul
# (``recontest_eager``). Why: an eager time is max(host, GPU), and the
# GPU boxes' hosts move between phases second to second (torch.matmul 11.5-25.8 us a call on one problem
# within one run, H100, 2026-11-25). One contest met one phase: of the eager Triton winners that passed
# it and the back-to-back check, a recontest pass minutes later demoted 16 of 78 (H100) and 14 of 65
# (H200) (docs/BENCHMARKS.md, 2026-11-25; scripts/redecide.py --recontest), so tables had to be
# recontested before shipping. Now the search does it: the stored record is its median pass (tuner/stamp.py).
EAGER_PASSES = 3
EAGER_PASS_PAUSE_S = 2.0

# Repeats of measured configs in a row after which the sampler counts as converged.
MAX_REPEATS_IN_A_ROW = 100

# Invalid samples in a row after which a search gives up: the space leaves almost nothing valid.
MAX_INVALID_IN_A_ROW = 500

# Local polish: after POLISH_AFTER measured trials, every POLISH_EVERY-th new config is an untried
# neighbour of the best so far (one parameter one step away) instead of the sampler's. TPE finds the
# right tile early and then wanders; the last percent sits in the knobs next to it (the MoE sweep's
# best differs from a typical 25-trial winner in num_stages and NUM_SM only). POLISH_EVERY = 0 turns
# it off. Chosen by replaying the committed sweeps (docs/SEARCH.md, "Polish").
POLISH_AFTER = 5
POLISH_EVERY = 2

# Which parameters the polish steps first: the cheap-to-get-wrong knobs before the tile shape.
POLISH_ORDER = ("num_stages", "NUM_SM", "num_warps", "BLOCK_K", "GROUP_SIZE_M", "SPLIT_K", "BLOCK_N", "BLOCK_M")


class NoWinner(RuntimeError):
    """Every measured config of a problem failed; the message says how."""


def failure_summary(study: optuna.Study, top: int = 3) -> str:
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        if t.user_attrs.get("interrupted") or t.user_attrs.get("repeat"):  # a repeat was answered, not run
            continue
        reason = f"{t.user_attrs.get('status', '?')}: {t.user_attrs.get('reason', '')[:160]}"
        counts[reason] = counts.get(reason, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:top]
    return "; ".join(f"{n}x {reason}" for reason, n in ranked) or "none recorded"


@dataclass(frozen=True)
class Progress:
    """What a progress display needs after each trial."""

    problem: Problem
    trial: int  # trials measured so far in this study (resumed ones included)
    budget: int
    status: str
    best_ms: float | None


@dataclass
class SearchStats:
    """Where one search's wall time went, for the CLI's summary line and docs/SEARCH.md."""

    measured: int = 0  # configs measured in this run (resumed ones not included)
    early_stopped: int = 0  # of those, timed only briefly
    pruned_invalid: int = 0
    search_s: float = 0.0  # the whole ask-check-time loop
    sampler_s: float = 0.0  # in Optuna's ask (and the study's storage)
    compile_wait_s: float = 0.0  # waiting for the workers' compile and check
    timing_s: float = 0.0  # checking and timing on the device, in this process
    head_to_head_s: float = 0.0  # the final side-by-side timing against the baseline

    def summary(self) -> str:
        return (f"{self.measured} measured ({self.early_stopped} stopped early, {self.pruned_invalid} invalid "
                f"pruned) in {self.search_s + self.head_to_head_s:.1f} s: sampler {self.sampler_s:.1f} s, "
                f"waiting for compiles {self.compile_wait_s:.1f} s, timing {self.timing_s:.1f} s, "
                f"head-to-head {self.head_to_head_s:.1f} s")


@dataclass(frozen=True)
class Budget:
    """How long one problem's search runs: at most ``trials`` measured configs and, if set, ``seconds``."""

    trials: int = 40
    seconds: float | None = None

    def __post_init__(self) -> None:
        # Checked here too, not only by the CLI: 0 s would read as "no limit" and NaN as "never ends".
        if self.trials < 1:
            raise ValueError(f"a budget of {self.trials} trials must be at least 1")
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"a budget of {self.seconds} seconds must be a finite number above 0 (None: no limit)")


def optuna_storage(url: str, attempts: int = 5) -> optuna.storages.RDBStorage:
    """Optuna's storage on ``url``. Workers starting together on a fresh database race to create
    Optuna's tables (one loses on a unique version row); the loser finds them made on a retry."""
    for attempt in range(1, attempts + 1):
        try:
            return optuna.storages.RDBStorage(url)
        except SQLAlchemyError as exc:
            if attempt == attempts:
                raise StoreError(f"cannot open Optuna's tables in {url}: {exc}") from exc
            log.debug("creating Optuna's tables lost a race (%s); retrying", exc)
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def study_name(device: DeviceInfo, problem: Problem) -> str:
    """Readable and unique; long grouped keys are shortened by a hash (Optuna names are <= 512 chars)."""
    name = f"{device.name}|{problem.kernel}|{problem.key}"
    if len(name) > 400:
        name = f"{name[:300]}...#{hashlib.sha1(name.encode()).hexdigest()[:16]}"
    return name


def _require(module: str, sampler: str) -> None:
    """Optuna's GP and CMA-ES samplers need packages this project does not install by default."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ValueError(f"--sampler {sampler} needs the {module} package; pip install {module}, "
                         "or use the default sampler, tpe") from None


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # constant_liar: trials asked in one batch but not yet told still steer the next asks apart.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                          n_startup_trials=10)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        _require("scipy", name)
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=10)
    if name == "cmaes":
        _require("cmaes", name)
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=10)
    raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


def open_study(storage: optuna.storages.BaseStorage, device: DeviceInfo, problem: Problem,
               sampler: str = "tpe", seed: int | None = None) -> optuna.Study:
    return optuna.create_study(study_name=study_name(device, problem), storage=storage,
                               direction="minimize", sampler=make_sampler(sampler, seed), load_if_exists=True)


# The study attribute that keeps the value lists its sampler draws indices into.
SAMPLED_VALUES = "sampled_values"


def sampled_space(study: optuna.Study, spec: KernelSpec, problem: Problem, device: DeviceInfo) -> kernels.SearchSpace:
    """What this study's sampler draws from: the space narrowed to the problem, fixed when the study
    begins and kept with it, so that a stored trial's index means the same value when it resumes.

    A study begun before narrowing (no stored lists, but trials) goes on with the whole space it
    drew from then; so does one whose stored lists the kernel's space no longer allows.
    """
    stored = study.user_attrs.get(SAMPLED_VALUES)
    if stored is not None:
        # A parameter added since the study began keeps the value it had in effect then.
        params = [dataclasses.replace(p, values=tuple(stored.get(p.name, () if p.default is None else (p.default,))))
                  for p in spec.space.params]
        if all(p.values and set(p.values) <= set(full.values) for p, full in zip(params, spec.space.params)):
            return dataclasses.replace(spec.space, params=tuple(params))
        log.warning("%s: the study's stored value lists do not fit the kernel's space any more; the "
                    "search goes on over the whole space", problem)
        return _as_begun(study, spec.space)
    if study.trials:
        return _as_begun(study, spec.space)
    space = narrowed(spec.space, problem, device)
    study.set_user_attr(SAMPLED_VALUES, {p.name: list(p.values) for p in space.params})
    return space


def _as_begun(study: optuna.Study, space: kernels.SearchSpace) -> kernels.SearchSpace:
    """``space`` as a study that began with no stored value lists can go on drawing from it: Optuna refuses
    a categorical parameter whose choices change within a study, so each keeps the choices its trials
    drew from (VARIANT before ``gemv`` was added), and a parameter its trials never drew keeps its default."""
    drawn: dict[str, optuna.distributions.BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            drawn.setdefault(name, distribution)
    params = []
    for p in space.params:
        seen = drawn.get(p.name)
        if isinstance(seen, optuna.distributions.CategoricalDistribution):
            p = dataclasses.replace(p, values=tuple(seen.choices))
        elif seen is None and p.default is not None and drawn:
            p = dataclasses.replace(p, values=(p.default,))
        params.append(p)
    return space if tuple(params) == space.params else dataclasses.replace(space, params=tuple(params))


def measured_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that cost a measurement (complete or failed), the ones the budget counts.

    A repeat of a config measured before is told to the sampler (so it learns the point is known)
    but costs nothing and is not counted: ``--trials N`` means N distinct configs measured.
    """
    states = (TrialState.COMPLETE, TrialState.FAIL)
    return [t for t in study.get_trials(deepcopy=False, states=states)
            if not t.user_attrs.get("repeat") and not t.user_attrs.get("interrupted")
            and t.user_attrs.get("status") != "invalid"]


def uses_constraints(study: optuna.Study) -> bool:
    """Optuna's GP sampler fits COMPLETE trials only: a pruned invalid config is invisible to it, and
    it proposes the same one again and again (docs/SEARCH.md). For it, an invalid config is told as
    a complete but infeasible trial (``Trial.set_constraint``), which its constrained acquisition
    learns to avoid. TPE learns from pruned trials directly."""
    return isinstance(study.sampler, optuna.samplers.GPSampler)


def _prune_invalid(study: optuna.Study, trial: optuna.Trial, reason: str, worst_ok_ms: float | None) -> None:
    trial.set_user_attr("status", "invalid")
    trial.set_user_attr("reason", reason)
    if not uses_constraints(study):
        study.tell(trial, state=TrialState.PRUNED)
        return
    trial.set_constraint("valid", 1.0)
    # The objective's model sees infeasible points too: as bad as the worst measured time, so
    # that they neither attract nor stretch the scale.
    study.tell(trial, worst_ok_ms if worst_ok_ms is not None else 1.0)


def warm_start_configs(spec: KernelSpec, problem: Problem, device: DeviceInfo, store: Store,
                       use_shipped: bool = True) -> list[Config]:
    """First trials: what dispatch would pick today (the database, the shipped table unless
    ``use_shipped`` is false, or the nearest tuned problem), the cost model's best-ranked candidates
    (``_model_picks``), the winners of the nearest tuned problems (the other of fp16/bf16 included),
    the kernel's default and its seeds."""
    tuned, others = [], []
    for record in store.records(device=device.name, kernel=spec.name):
        if record.problem_key == problem.key or not record.triton_config:
            continue
        others.append(Config.from_dict(record.triton_config))
        distance = spec.transfer_distance(problem, Problem.from_key(spec.name, record.problem_key))
        if math.isfinite(distance):
            tuned.append((distance, others[-1]))
    tuned.sort(key=lambda pair: pair[0])
    dispatched = Dispatcher(store.url, use_shipped=use_shipped).choose(spec, problem, device).config
    seeds = [spec.default_config(problem, device)] + spec.seeds(problem, device)
    picks = _model_picks(spec, problem, device, store.url, _valid_unique(spec, problem, device, others + seeds))
    candidates = [dispatched] + picks + [config for _, config in tuned[:3]] + seeds
    return _valid_unique(spec, problem, device, candidates)


# The cost model joins the warm start only when the database holds at least this many graph-mode
# observations of the kernel on other problems: about three problems' quick-tuning portfolios (9-41
# configs each, docs/COSTMODEL.md). Fewer say too little about a shape nobody tuned.
MODEL_MIN_OBSERVATIONS = 50
# The model's top 3: on the held-out H100 portfolios (docs/COSTMODEL.md, 2026-11-24) knn's best of 3 is
# as good as nearest's in graph mode and better in eager, its best of 5 better in both.
MODEL_PICKS = 3
MODEL_KIND = "knn"  # ridge ranked better on one of two held-out models and 3x worse at worst


def _model_picks(spec: KernelSpec, problem: Problem, device: DeviceInfo, url: str,
                 candidates: list[Config]) -> list[Config]:
    """Up to MODEL_PICKS of ``candidates`` that a cost model fitted on every timed trial of the other
    problems in the database at ``url`` ranks fastest on ``problem`` (graph mode); [] when the data is
    too thin, and on any failure, which must never stop a search."""
    if not candidates:
        return []
    try:
        from kernels._costmodel import fit
        from .costmodel_data import from_database, ranked_warm_start
        observations = [o for o in _observations(url, device.name, from_database)
                        if o.problem.kernel == spec.name and o.problem.key != problem.key]
        graph = sum(o.mode == GRAPH for o in observations)
        if graph < MODEL_MIN_OBSERVATIONS:
            log.debug("no cost-model warm start for %s: %d graph observations, %d needed",
                      problem.key, graph, MODEL_MIN_OBSERVATIONS)
            return []
        return ranked_warm_start(fit(observations, kind=MODEL_KIND), problem, candidates, GRAPH, MODEL_PICKS)
    except Exception as error:  # noqa: BLE001 - the warm start without the model is today's
        log.warning("cost-model warm start for %s skipped (%s: %s); using the nearest winners and seeds",
                    problem.key, type(error).__name__, error)
        return []


# Reading every trial of a database costs seconds (2-3 s for 92 quick-tuned problems, docs/COSTMODEL.md)
# and grows with it: a process that tunes problem after problem (the CLI, a fleet worker) reads it at
# most this often and reuses what it read in between (a few problems' newest trials are then missing).
MODEL_DATA_TTL_S = 600.0
_OBSERVATIONS: dict[tuple[str, str], tuple[float, list]] = {}


def _observations(url: str, device_name: str, read: Callable[[str, str], list]) -> list:
    """The database's observations for this device, read at most once per MODEL_DATA_TTL_S per process."""
    cached = _OBSERVATIONS.get((url, device_name))
    if cached is not None and time.monotonic() - cached[0] < MODEL_DATA_TTL_S:
        return cached[1]
    observations = read(url, device_name)
    _OBSERVATIONS[(url, device_name)] = (time.monotonic(), observations)
    return observations


def _valid_unique(spec: KernelSpec, problem: Problem, device: DeviceInfo, candidates: list[Config]) -> list[Config]:
    """The candidates in order, once each, without cuBLAS and without configs the space rules out."""
    seen: set[Config] = set()
    chosen = []
    for config in candidates:
        config = spec.space.canonical(config, problem)
        if config not in seen and not kernels.is_baseline(config) \
                and spec.space.violation(config, problem, device) is None:
            seen.add(config)
            chosen.append(config)
    return chosen


def _verdicts(study: optuna.Study, space: kernels.SearchSpace, problem: Problem) -> dict[str, Measurement]:
    """This study's verdict on each config measured before (a resumed search), by the text of its
    canonical form for ``problem``: a study begun before a fold was added recorded the configs it
    measured as they were asked, and the fold makes some of them one launch."""
    verdicts: dict[str, Measurement] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        config_text = t.user_attrs.get("config")
        if config_text is None or t.user_attrs.get("interrupted") or t.user_attrs.get("status") == "invalid":
            continue
        config_text = str(space.canonical(Config.parse(config_text), problem))
        if t.state == TrialState.COMPLETE:
            verdict = Measurement("ok", time_ms=t.value, eager_ms=t.user_attrs.get("eager_ms"),
                                  rel_error=t.user_attrs.get("rel_error"))
        else:
            verdict = Measurement(t.user_attrs.get("status", "error"), reason=t.user_attrs.get("reason", ""))
        verdicts.setdefault(config_text, verdict)
    return verdicts


def _verdict_of(measurement: Measurement) -> Measurement:
    """What a repeat of a measured config is told: its time or its failure, without the timing's flags."""
    if measurement.ok:
        return Measurement("ok", time_ms=measurement.time_ms, eager_ms=measurement.eager_ms,
                           rel_error=measurement.rel_error)
    return Measurement(measurement.status, reason=measurement.reason)


def _tell_values(measurement: Measurement) -> dict[str, object]:
    """The user attributes a trial keeps of its measurement (status, error, both modes' times)."""
    attrs: dict[str, object] = {"status": measurement.status}
    if measurement.reason:
        attrs["reason"] = measurement.reason
    if measurement.rel_error is not None:
        attrs["rel_error"] = measurement.rel_error
    if measurement.early_stopped:
        attrs["timing"] = "quick"
    if measurement.ok:
        attrs["graph_ms"] = float(measurement.time_ms)
    if measurement.eager_ms is not None:
        attrs["eager_ms"] = float(measurement.eager_ms)
    return attrs


def _tell(study: optuna.Study, trial: optuna.Trial, measurement: Measurement) -> None:
    for name, value in _tell_values(measurement).items():
        trial.set_user_attr(name, value)
    if uses_constraints(study):
        trial.set_constraint("valid", 0.0)
    if measurement.ok:
        study.tell(trial, float(measurement.time_ms))
    else:
        study.tell(trial, state=TrialState.FAIL)


def best_triton(study: optuna.Study) -> tuple[Config, float] | None:
    """The study's best fully timed config and its time (a quick timing is never the best)."""
    chosen = finalists(study, most=1)
    return chosen[0] if chosen else None


def tune_problem(spec: KernelSpec, problem: Problem, device: DeviceInfo, store: Store, *,
                 budget: Budget = Budget(), sampler: str = "tpe", seed: int | None = None,
                 timer: Timer | None = None, quick_timer: Timer | None = None,
                 eager_timer: EagerTimer | None = None,
                 storage: optuna.storages.BaseStorage | None = None,
                 on_trial: Callable[[Progress], None] | None = None, pool: CheckPool | None = None,
                 ahead: int = DEFAULT_AHEAD, on_finish: Callable[[SearchStats], None] | None = None,
                 use_shipped: bool = True, eager_passes: int = EAGER_PASSES) -> Record:
    """Search configs for one problem, then store and return the winner (cuBLAS if nothing beats it).

    ``use_shipped=False`` keeps the tables shipped in the package out of the first trials: on a fresh
    database the search then finds what it finds by itself (for measuring it). ``eager_passes``: the
    side-by-side contests an eager Triton winner must win in all (``confirm_eager``).

    A database server that goes away mid-search (restarted, failed over) is waited for with a bounded
    backoff (``db._outage``), then the study resumes as a rerun would: trials told stay, the ones in
    flight are asked again. Past the window, ``StoreUnreachable`` says to run the command again."""
    storage = storage or optuna.storages.RDBStorage(store.url)
    outage = Outage(store.url)

    def told(progress: Progress) -> None:  # a trial reached the database: any outage is over
        outage.recovered()
        if on_trial:
            on_trial(progress)

    options = dict(budget=budget, sampler=sampler, seed=seed, timer=timer, quick_timer=quick_timer,
                   eager_timer=eager_timer, on_trial=told, pool=pool, ahead=ahead, on_finish=on_finish,
                   use_shipped=use_shipped, eager_passes=eager_passes)
    while True:
        try:
            return _tune_once(spec, problem, device, store, storage, **options)
        except (optuna.exceptions.StorageInternalError, StoreUnreachable, SQLAlchemyError) as exc:
            if getattr(exc, "gave_up", False) or not server_unreachable(exc):
                raise  # a real error, or the store has waited out the outage already
            # Optuna's engine keeps no pre-ping: its first call after a restart fails on a pooled
            # connection the server closed, and SQLAlchemy then drops the whole pool; this resume is
            # the one retry that needs (cheaper than a ping before each of a search's many calls).
            if pool is not None:
                pool.close()  # candidates in flight belong to the abandoned run; the pool restarts on use
            outage.pause(exc, f"resuming the study of {problem.key}")


def _tune_once(spec: KernelSpec, problem: Problem, device: DeviceInfo, store: Store,
               storage: optuna.storages.BaseStorage, *, budget: Budget, sampler: str, seed: int | None,
               timer: Timer | None, quick_timer: Timer | None, eager_timer: EagerTimer | None,
               on_trial: Callable[[Progress], None] | None, pool: CheckPool | None, ahead: int,
               on_finish: Callable[[SearchStats], None] | None, use_shipped: bool, eager_passes: int) -> Record:
    """``tune_problem`` from opening (or resuming) the study to storing its winners."""
    study = open_study(storage, device, problem, sampler, seed)
    if pool is not None and timer is None and kernels.KERNELS.get(spec.name) is spec:
        # Timed in the pool's timing worker: a candidate that faults while timed costs that process only.
        bench = IsolatedBench(pool.timing, spec.name, problem, device, seed=seed or 0)
    else:  # in this process: on the CPU, or with a test's timer or spec that a worker cannot import
        bench = Bench(spec, problem, device, timer=timer, seed=seed or 0, quick_timer=quick_timer,
                      eager_timer=eager_timer)
    space = sampled_space(study, spec, problem, device)
    if not study.trials:
        for config in warm_start_configs(spec, problem, device, store, use_shipped):
            study.enqueue_trial(params_of(config, space), skip_if_exists=True)
    requeue_interrupted(study, space)
    # The bench's rotating inputs (up to 4 GiB of GPU memory, in the timing worker when there is one) go when
    # the search is done, however it ends: a CLI run or fleet worker goes on to other problems after a failure.
    try:
        stats = _Search(study, spec, bench, budget, pool, on_trial, ahead, space).run()
        found = best_triton(study)
        if found is None:
            # The study keeps these verdicts: a rerun answers the same configs from it and fails at once.
            storage_url = make_url(store.url).render_as_string(hide_password=True)
            raise NoWinner(f"no config of {spec.name} ran correctly on {problem.key} in "
                           f"{len(measured_trials(study))} trials; most common failures: {failure_summary(study)}. "
                           "The study keeps these verdicts, so a rerun does not measure these configs again: once "
                           f"the cause is fixed, run `optuna delete-study --storage {shlex.quote(storage_url)} "
                           f"--study-name {shlex.quote(study.study_name)}` (or search into a fresh --db)")
        started = time.monotonic()
        records = decide_modes(spec, problem, device, bench, study, eager_passes=eager_passes)
        stats.head_to_head_s = time.monotonic() - started
    finally:
        _release(bench)
    implausible = {mode: plausibility_problems(record) for mode, record in records.items()}
    if any(implausible.values()):  # a timer glitch (a 1 ns kernel) must not become the fleet's winner
        raise NoWinner(f"the winner of {problem.key} is not plausible, so it was not stored: "
                       + "; ".join(f"{mode}: {', '.join(found)}" for mode, found in implausible.items() if found))
    store.put_many(list(records.values()), on_conflict="replace")  # both modes' winners, or neither
    if on_finish:
        on_finish(stats)
    return records[GRAPH]


def _release(bench: Bench | IsolatedBench) -> None:
    """Free ``bench``'s rotating inputs; a failure to do so is logged, never raised over the search's outcome."""
    try:
        bench.release()
    except Exception as exc:  # noqa: BLE001 - the search's own result or error is what the caller needs
        log.warning("%s: could not free the search's inputs: %s", bench.problem, exc)


def decide_modes(spec: KernelSpec, problem: Problem, device: DeviceInfo, bench: Bench | IsolatedBench,
                 study: optuna.Study, most: int = FINALISTS, rounds: int | None = None,
                 eager_passes: int = EAGER_PASSES) -> dict[str, Record]:
    """Both modes' winners: graph first, then eager beside the graph winner (``_decide``), an eager Triton
    winner contested again until it has won ``eager_passes`` contests in all (``confirm_eager``)."""
    graph = _decide(spec, problem, device, bench, study, GRAPH, most, rounds)
    graph_winner = Config.from_dict(graph.config)
    eager = _decide(spec, problem, device, bench, study, EAGER, most, rounds, graph_winner=graph_winner,
                    gpu_limit_ms=eager_gpu_limit_ms(spec, graph.cublas_ms) if graph.cublas_ms else None)
    return {GRAPH: graph, EAGER: settle_eager(spec, problem, device, bench, eager, graph, eager_passes)}


def settle_eager(spec: KernelSpec, problem: Problem, device: DeviceInfo, bench: Bench | IsolatedBench,
                 eager: Record, graph: Record, eager_passes: int) -> Record:
    """The eager record to store, given the deciding contest's ``eager`` and the problem's ``graph`` record:
    a Triton winner after ``eager_passes - 1`` more contests (``confirm_eager``), a cuBLAS winner at par
    where the call is GPU-bound (``at_par_when_gpu_bound``)."""
    confirmed = confirm_eager(spec, problem, device, bench, eager, Config.from_dict(graph.config), eager_passes - 1)
    return at_par_when_gpu_bound(confirmed, graph.cublas_ms)


def confirm_eager(spec: KernelSpec, problem: Problem, device: DeviceInfo, bench: Bench | IsolatedBench,
                  record: Record, graph_winner: Config | None, passes: int,
                  pause_s: float | None = None) -> Record:
    """``record`` (an eager winner) after ``passes`` more contests (``recontest_eager``), ``pause_s`` apart
    (default EAGER_PASS_PAUSE_S): cuBLAS's record from the first pass that the Triton winner loses, else the
    winner's record from its median pass, the deciding contest counted (the lower middle of an even count):
    what the user's call gets across the host's phases, as a stamp (tuner/stamp.py) and
    scripts/bench_dispatch.py --passes measure it. Until 2026-11-26 the pass where it won least was stored,
    which read low wherever the host's phase moved torch.matmul's time. A cuBLAS winner, a CPU (interpreter
    times say nothing of speed) and kernels whose baseline is not one dispatched call (DISPATCHED_BASELINE:
    a loop of launches is the host cost our one launch saves) are returned as they are."""
    config = Config.from_dict(record.config)
    if passes < 1 or device.is_cpu or kernels.is_baseline(config) or spec.name not in DISPATCHED_BASELINE:
        return record
    pause_s = EAGER_PASS_PAUSE_S if pause_s is None else pause_s
    won = [record]
    for index in range(passes):
        time.sleep(pause_s)  # another moment of the host, maybe another phase
        again = recontest_eager(spec, problem, device, bench, config, graph_winner, record.trials)
        if kernels.is_baseline(Config.from_dict(again.config)):
            log.info("%s: eager winner %s lost contest %d of %d (%.4f ms; torch.matmul %.4f ms, our cuBLAS path "
                     "%.4f ms): cuBLAS wins eager", problem, config, index + 2, passes + 1, again.triton_ms,
                     again.cublas_ms, again.time_ms)
            return again
        won.append(again)
    return won[timing.median_pass([r.speedup or 0.0 for r in won])]


def recontest_eager(spec: KernelSpec, problem: Problem, device: DeviceInfo, bench: Bench | IsolatedBench,
                    config: Config, graph_winner: Config | None, trials: int) -> Record:
    """One eager contest of ``config`` against our cuBLAS path and torch.matmul, side by side (beside
    ``graph_winner``, as dispatch holds them): the record of ``config`` if it beats both by WIN_MARGIN,
    else cuBLAS's, with ``config``'s time of now kept beside it. Both baselines run at::mm, so a config
    that beats one but not the other won on the two's spread (H100, 2026-11-25: a split-K winner kept its
    place at 0.964x torch.matmul, and measured 0.94x in the bench)."""
    (triton_ms, ours_cublas_ms), baseline_ms = bench.contest([config, BASELINE], mode=EAGER, graph=graph_winner)
    lost = baseline_ms < triton_ms * (1 + WIN_MARGIN)
    return _winner_record(spec, problem, device, (config, triton_ms), baseline_ms, trials, EAGER,
                          cublas_ms=ours_cublas_ms, cublas_won=lost)


def _decide(spec: KernelSpec, problem: Problem, device: DeviceInfo, bench: Bench | IsolatedBench,
            study: optuna.Study, mode: str, most: int = FINALISTS, rounds: int | None = None,
            graph_winner: Config | None = None, gpu_limit_ms: float | None = None) -> Record:
    """The winner of ``mode``: the study's best configs in that mode and cuBLAS, side by side.

    In eager mode cuBLAS enters twice: as the user's own ``torch.matmul`` (the baseline every
    speed-up is against) and as our dispatch's cuBLAS path, so a cuBLAS winner's stored time is what
    ``kernels.matmul`` costs, host time included. Given the graph winner, each eager finalist is timed
    beside it, as dispatch will hold the two (where they differ, each eager call pays the mode check).
    Given ``gpu_limit_ms``, an eager finalist must have run within it on the GPU (EAGER_GPU_MARGIN)."""
    chosen = finalists(study, most=most, mode=mode, gpu_limit_ms=gpu_limit_ms)
    if not chosen:  # no candidate got an eager time within the limit (some early-stopped before theirs)
        # Graph finalists may stand in, within the same GPU limit: past it, an eager win would be host
        # time, the win EAGER_GPU_MARGIN refuses.
        chosen = finalists(study, most=most, mode=GRAPH, gpu_limit_ms=gpu_limit_ms)
    trials = len(measured_trials(study))
    if device.is_cpu:  # interpreter times say nothing about speed: no contest with the baseline
        return _winner_record(spec, problem, device, chosen[0] if chosen else finalists(study, 1)[0],
                              bench.baseline_ms(mode), trials, mode)
    if not chosen and spec.baseline_when_untuned and spec.baseline_dispatchable(problem):
        # No Triton config ran near cuBLAS on the GPU: cuBLAS wins eager calls, no contest needed.
        return _cublas_record(spec, problem, device, bench, study, trials, mode, graph_winner)
    if not chosen:
        # The fastest Triton configs contend without the limit: where the baseline is no winner, and where
        # it is a loop of launches (grouped_matmul), whose host time one launch of ours does not pay, so
        # that the limit, set for torch.matmul's single launch, does not apply.
        chosen = finalists(study, most=most, mode=mode) or finalists(study, most=most)
    if graph_winner is not None:
        # As dispatch will hold them: both winners in their stored (portable) form, so that where they
        # launch one kernel the contest, as dispatch, runs one plan for both modes without the mode check.
        chosen = _portable_finalists(spec, problem, device, chosen)
    ours_cublas_ms = _ours_cublas_ms(spec, bench, mode)
    if ours_cublas_ms is not None:
        chosen = chosen + [(BASELINE, ours_cublas_ms)]
    times, baseline_ms = contest_times(bench, chosen, mode, rounds, graph_winner)
    best = min(range(len(chosen)), key=times.__getitem__)
    found, found_ms = chosen[best][0], times[best]
    if ours_cublas_ms is not None:  # our cuBLAS path as the contest timed it, beside the finalists
        ours_cublas_ms = times[-1]
    _note_cublas(study, mode, baseline_ms, ours_cublas_ms)
    # The Triton finalists at their contest times, fastest first: a record's best Triton config and time are
    # the contest's, whoever wins it.
    ranked = sorted(((config, ms) for (config, _), ms in zip(chosen, times) if not kernels.is_baseline(config)),
                    key=lambda pair: pair[1])
    if kernels.is_baseline(found):
        return _winner_record(spec, problem, device, ranked[0], baseline_ms, trials, mode, cublas_ms=found_ms,
                              cublas_won=True)
    if mode == EAGER:
        winner = eager_winner(spec, bench, ranked, baseline_ms if ours_cublas_ms is None else ours_cublas_ms)
        return _winner_record(spec, problem, device, winner or ranked[0], baseline_ms, trials, mode,
                              cublas_ms=ours_cublas_ms, cublas_won=winner is None)
    return _winner_record(spec, problem, device, (found, found_ms), baseline_ms, trials, mode,
                          cublas_ms=ours_cublas_ms)


def eager_winner(spec: KernelSpec, bench: Bench | IsolatedBench, ranked: Sequence[tuple[Config, float]],
                 cublas_ms: float) -> tuple[Config, float] | None:
    """The eager winner among ``ranked`` (Triton configs with their contest times, fastest first): the
    fastest that beats cuBLAS as dispatch would run it (``cublas_ms``) by WIN_MARGIN and holds on a fast
    host; None where none does (cuBLAS wins). A fastest config that fails only the fast-host check gives
    way to the next one, not straight to cuBLAS."""
    for config, ms in ranked:
        if cublas_ms < ms * (1 + WIN_MARGIN):
            return None  # this one and every slower one lose to cuBLAS
        if holds_on_a_fast_host(spec, bench, config):
            return config, ms
    return None


def eager_gpu_limit_ms(spec: KernelSpec, cublas_graph_ms: float) -> float:
    """The most GPU time (a graph replay) an eager finalist may take: EAGER_GPU_MARGIN over the baseline's,
    the baseline taken at no less than the host time its call costs on the fastest host met
    (``KernelSpec.baseline_host_floor_ms``, as ``holds_on_a_fast_host``)."""
    return on_a_fast_host_ms(spec, cublas_graph_ms) * (1 + EAGER_GPU_MARGIN)


def on_a_fast_host_ms(spec: KernelSpec, baseline_gpu_ms: float) -> float:
    """The baseline's call on the fastest host met: its GPU time, or the host time its launches cost there
    where that is more (``KernelSpec.baseline_host_floor_ms``: a baseline of several launches). Our side is
    one launch, cheaper than torch.matmul's, so its floor is its GPU time."""
    return max(baseline_gpu_ms, spec.baseline_host_floor_ms)


def holds_on_a_fast_host(spec: KernelSpec, bench: Bench | IsolatedBench, config: Config) -> bool:
    """Whether ``config``, the eager contest's winner over cuBLAS, is also no more than FAST_HOST_MARGIN
    slower than cuBLAS where the host keeps the GPU busy (``Bench.back_to_back``), and, where cuBLAS takes
    GPU_BOUND_EAGER_MS or more there (a GPU-bound call, whose eager time is the GPU's), faster by WIN_MARGIN.

    Why: an eager time is max(host, GPU) on the tuning host. A config with a cheaper launch wins there
    wherever the host is the bound, and loses on a host fast enough to leave both on the GPU, if its
    kernel is slower. The graph times behind EAGER_GPU_MARGIN's first check (one replay, L2 flushed) did
    not show it: bf16 1x2048x10944's split-K winner ran within 1% of cuBLAS there, stored 1.11-1.31x
    (contests on a host that issued torch.matmul at 28 us a call, the GPU's 20 us) and measured 0.92-0.94x
    in fresh processes whose host kept up (H100 and H200, 2026-11-25). Checked for the kernels whose
    baseline dispatch runs in our place (DISPATCHED_BASELINE: torch.matmul, torch.addmm, and the gated
    product's matmul with its two elementwise launches, all of them timed back to back on the GPU too);
    a loop of launches over experts or groups (moe_matmul, grouped_matmul) is the host cost our one
    launch saves, and is not checked. A baseline whose host time stays over its GPU time on the fastest host
    met (the gated product's two launches) is taken at that host time (``KernelSpec.baseline_host_floor_ms``)."""
    if spec.name not in DISPATCHED_BASELINE:
        return True
    ours, theirs = bench.back_to_back(config)
    theirs = on_a_fast_host_ms(spec, theirs)
    if theirs >= GPU_BOUND_EAGER_MS:  # GPU-bound: the eager win must be a win on the GPU (GPU_BOUND_EAGER_MS)
        if ours * (1 + WIN_MARGIN) <= theirs:
            return True
        log.info("%s: eager winner %s runs %.4f ms back to back on the GPU, cuBLAS %.4f ms: not %.0f%% ahead on "
                 "a GPU-bound call, cuBLAS wins eager", bench.problem, config, ours, theirs, 100 * WIN_MARGIN)
        return False
    if ours <= theirs * (1 + FAST_HOST_MARGIN):
        return True
    log.info("%s: eager winner %s runs %.4f ms back to back on the GPU, cuBLAS %.4f ms: cuBLAS wins eager "
             "(a fast host would see the kernels, not the launches)", bench.problem, config, ours, theirs)
    return False


def _portable_finalists(spec: KernelSpec, problem: Problem, device: DeviceInfo,
                        chosen: Sequence[tuple[Config, float]]) -> list[tuple[Config, float]]:
    """``chosen`` with each config in the form its record would store (``SearchSpace.portable``), once each."""
    preferred = spec.portable_values(device)
    out: list[tuple[Config, float]] = []
    for config, ms in chosen:
        if not kernels.is_baseline(config):
            config = spec.space.portable(config, problem, device, preferred)
        if all(config != c for c, _ in out):
            out.append((config, ms))
    return out


def _cublas_record(spec: KernelSpec, problem: Problem, device: DeviceInfo, bench: Bench | IsolatedBench,
                   study: optuna.Study, trials: int, mode: str, graph_winner: Config | None = None) -> Record:
    """cuBLAS as ``mode``'s winner without a contest of Triton configs, where none may contend. The record's
    best Triton config is the study's fastest in that mode (or on the GPU, if none has a time in it). In
    eager mode our cuBLAS path and torch.matmul are timed side by side (beside ``graph_winner``, as dispatch
    will hold it): the stored speed-up is the ratio of two host-bound times, which must meet the same host."""
    best = finalists(study, most=1, mode=mode) or finalists(study, most=1)
    ours_cublas_ms, baseline_ms = cublas_side_by_side(spec, bench, mode, graph_winner)
    _note_cublas(study, mode, baseline_ms, ours_cublas_ms)
    return _winner_record(spec, problem, device, best[0], baseline_ms, trials, mode,
                          cublas_ms=ours_cublas_ms, cublas_won=True)


def cublas_side_by_side(spec: KernelSpec, bench: Bench | IsolatedBench, mode: str,
                        graph_winner: Config | None = None) -> tuple[float | None, float]:
    """(our dispatch's cuBLAS path, torch.matmul) in ``mode``, for a cuBLAS record with no Triton config
    in the contest. In eager mode, where our path costs host time of its own (DISPATCHED_BASELINE), the
    two are timed side by side (beside ``graph_winner``, as dispatch will hold it): a host-bound speed-up
    is a ratio of two host times, which must meet the same host. Elsewhere only torch.matmul's, None first."""
    if mode == EAGER and spec.name in DISPATCHED_BASELINE:
        (ours_cublas_ms,), baseline_ms = bench.contest([BASELINE], mode=EAGER, graph=graph_winner)
        return ours_cublas_ms, baseline_ms
    return None, bench.baseline_ms(mode)


def _ours_cublas_ms(spec: KernelSpec, bench: Bench | IsolatedBench, mode: str) -> float | None:
    """Our dispatch's cuBLAS path, timed eager where it costs host time of its own (DISPATCHED_BASELINE)."""
    return bench.time(BASELINE, EAGER) if mode == EAGER and spec.name in DISPATCHED_BASELINE else None


def _note_cublas(study: optuna.Study, mode: str, baseline_ms: float, ours_cublas_ms: float | None) -> None:
    """What the cost model needs besides the trials (kernels/_costmodel.py): the user's torch.matmul in
    this mode and, in eager mode, our own dispatch's cuBLAS path, whose lookup costs host time."""
    study.set_user_attr(f"{mode}_cublas_ms", baseline_ms)
    if ours_cublas_ms is not None:
        study.set_user_attr("eager_cublas_dispatch_ms", ours_cublas_ms)


def believed(side_by_side_ms: float, earlier_ms: float) -> bool:
    """Whether a later timing of a config (a contest's, a sweep's confirmation) is within
    HEAD_TO_HEAD_DISAGREES of its earlier one; above it, something disturbed the later one."""
    return side_by_side_ms <= earlier_ms * HEAD_TO_HEAD_DISAGREES


def finalists(study: optuna.Study, most: int = FINALISTS, within: float = FINALIST_MARGIN,
              mode: str = GRAPH, gpu_limit_ms: float | None = None) -> list[tuple[Config, float]]:
    """The best fully timed configs of the study in ``mode``, at most ``most``, each within ``within``
    of the best: the ones a single timing's spread could have put in the wrong order. With
    ``gpu_limit_ms``, only configs whose graph (GPU) time was within it."""
    def time_of(t: optuna.trial.FrozenTrial) -> float | None:
        return t.value if mode == GRAPH else t.user_attrs.get("eager_ms")

    done = sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if t.user_attrs.get("status") == "ok" and t.user_attrs.get("timing") != "quick"
                   and not t.user_attrs.get("repeat") and time_of(t) is not None
                   and (gpu_limit_ms is None or t.value <= gpu_limit_ms)), key=time_of)
    chosen: list[tuple[Config, float]] = []
    for t in done:
        config, ms = Config.parse(t.user_attrs["config"]), float(time_of(t))
        if len(chosen) == most or (chosen and ms > chosen[0][1] * (1 + within)):
            break
        if all(config != c for c, _ in chosen):
            chosen.append((config, ms))
    return chosen


def head_to_head(bench: Bench | IsolatedBench, finalists: Sequence[tuple[Config, float]], mode: str = GRAPH,
                 rounds: int | None = None, graph_winner: Config | None = None
                 ) -> tuple[tuple[tuple[Config, float], float], float]:
    """((winner, the search's time for it), its time side by side), baseline ms): the finalists and the
    baseline timed in turn on the same inputs, the contest that decides the winner.

    A contest whose best time is far off the search's own timing of the same kernel means something
    disturbed those seconds (on the H100 three times in about 30 live searches, each time at the
    contest, never reproduced in isolation): it is run again after a pause. The first attempt that is
    believed decides; if none is, the one with the lowest best time does, as the least disturbed.
    """
    times, baseline_ms = contest_times(bench, finalists, mode, rounds, graph_winner)
    best = min(range(len(finalists)), key=times.__getitem__)
    return (finalists[best], times[best]), baseline_ms


def contest_times(bench: Bench | IsolatedBench, finalists: Sequence[tuple[Config, float]], mode: str = GRAPH,
                  rounds: int | None = None, graph_winner: Config | None = None) -> tuple[list[float], float]:
    """(each finalist's time side by side, baseline ms) of the attempt that ``head_to_head`` believes."""
    configs = [config for config, _ in finalists]
    calmest: tuple[list[float], float] | None = None
    for attempt in range(CONTEST_ATTEMPTS):
        if attempt:
            time.sleep(CONTEST_PAUSE_S)
        times, baseline_ms = (bench.contest(configs, mode=mode, graph=graph_winner) if rounds is None
                              else bench.contest(configs, rounds=rounds, mode=mode, graph=graph_winner))
        best = min(range(len(configs)), key=times.__getitem__)
        if believed(times[best], finalists[best][1]):
            return list(times), baseline_ms  # believed: this attempt decides
        if calmest is None or min(times) < min(calmest[0]):
            calmest = (list(times), baseline_ms)
        log.warning("%s: the contest timed %s at %.4f ms, the search at %.4f ms; %s",
                    bench.problem, configs[best], times[best], finalists[best][1],
                    "timing again" if attempt + 1 < CONTEST_ATTEMPTS else "keeping the calmest attempt")
    return calmest


def requeue_interrupted(study: optuna.Study, space: kernels.SearchSpace) -> int:
    """Trials a killed search left running are failed as ``interrupted`` and their configs asked again.

    One search per study runs at a time (the CLI tunes problems in turn), so a running trial at
    the start is a dead process's. Left running, it would count as a pending ask for ever (TPE's
    constant liar treats it as a bad result); failed and marked, it counts nowhere, and its
    config is measured first. ``space`` is what this search samples: the config is enqueued by its
    parameters there, since a study begun by an older version may have drawn from other value lists.
    """
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in stale:
        study._storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
        study.tell(trial.number, state=TrialState.FAIL)
        config = _config_of_trial(trial, space)
        if config is not None:
            study.enqueue_trial(params_of(config, space), skip_if_exists=False)
    return len(stale)


def _config_of_trial(trial: optuna.trial.FrozenTrial, space: kernels.SearchSpace) -> Config | None:
    """The config a trial was asked for, if ``space`` can ask it again; None otherwise."""
    text = trial.user_attrs.get("config")
    if text is not None:
        config = Config.parse(text)
    elif trial.params:  # killed between the ask and the config's record: its parameters are all there is
        try:
            config = config_of(trial.params, space)
        except (IndexError, KeyError, ValueError):
            return None
    else:
        return None
    return config if space.outside(config) is None else None


class _Search:
    """Keep up to ``ahead`` new configs compiling in the pool; time each one as its check comes back.

    Without a pool, one config at a time is asked, measured and told. With one, the search is a
    pipeline: when a candidate's check returns, it is timed (the GPU serves one at a time), told,
    and one new config is asked to take its place, so the sampler learns from every result before
    it asks again. Asking a whole pool's worth of configs blind costs quality: replayed with 14 in
    flight, seeded TPE needed a median 33 trials to reach 98% of a sweep's best, against 13.5 with 4
    and 9 with 1 (docs/SEARCH.md).
    """

    def __init__(self, study: optuna.Study, spec: KernelSpec, bench: Bench, budget: Budget,
                 pool: CheckPool | None, on_trial: Callable[[Progress], None] | None,
                 ahead: int = DEFAULT_AHEAD, space: kernels.SearchSpace | None = None) -> None:
        self.study, self.spec, self.bench, self.budget = study, spec, bench, budget
        # What the sampler draws from: the kernel's space cut to this problem (tuner.space.narrowed).
        self.space = space or narrowed(spec.space, bench.problem, bench.device)
        self.pool, self.on_trial = pool, on_trial
        self.ahead = max(1, min(pool.workers, ahead)) if pool else 1
        self.in_flight: dict[Config, list[optuna.Trial]] = {}
        self.invalid_in_a_row = 0
        self.repeats_in_a_row = 0
        self.stats = SearchStats()
        found = best_triton(study)
        self.incumbent_ms = found[1] if found else None
        # What the study knows, read once and then kept up to date as results are told, so that an
        # ask does not scan every trial of the study (a long or resumed search has thousands).
        self.verdicts = _verdicts(study, self.space, bench.problem)
        self.measured_count = len(measured_trials(study))
        self.best_ms = self.incumbent_ms
        self.worst_ok_ms = max((m.time_ms for m in self.verdicts.values() if m.ok), default=None)
        best_text = min((text for text, m in self.verdicts.items() if m.ok),
                        key=lambda text: self.verdicts[text].time_ms, default=None)
        self.best_config = Config.parse(best_text) if best_text else None
        self.new_asks = 0  # configs put in flight by this run, the sampler's and the polish's
        self.polished: set[Config] = set()  # neighbours the polish enqueued (an enqueued trial waits its turn)

    def run(self) -> SearchStats:
        start = time.monotonic()
        deadline = start + self.budget.seconds if self.budget.seconds else math.inf
        measured = self.measured_count
        try:
            while True:
                while (len(self.in_flight) < self.ahead and measured + len(self.in_flight) < self.budget.trials
                       and time.monotonic() < deadline and self._ask_new()):
                    pass
                if not self.in_flight:
                    break
                config, measurement = self._next_measurement()
                measured += 1
                for trial in self.in_flight.pop(config):
                    self._finish(trial, measurement)
        except Exception:
            if self.pool is not None and self.pool.in_flight:
                # One pool serves every problem of a CLI run or fleet worker, which go on after this one fails:
                # its candidates still in flight must not answer the next search. The pool restarts on use.
                self.pool.close()
            raise
        if self.invalid_in_a_row >= MAX_INVALID_IN_A_ROW:
            log.warning("%s: %d invalid samples in a row; the space leaves little valid, stopping",
                        self.bench.problem, self.invalid_in_a_row)
        elif self.repeats_in_a_row >= MAX_REPEATS_IN_A_ROW:
            log.info("%s: the sampler proposed only measured configs %d times in a row; it has converged",
                     self.bench.problem, self.repeats_in_a_row)
        self.stats.search_s = time.monotonic() - start
        return self.stats

    def _ask_new(self) -> bool:
        """Ask until one new config goes in flight; invalid samples are pruned at once, repeats answered.

        False when the sampler keeps proposing invalid or measured configs (it gives up or converged).
        """
        started = time.monotonic()
        try:
            polish = self._polish_step()
            if polish is not None:
                self.study.enqueue_trial(params_of(polish, self.space), user_attrs={"polish": True})
            while self.invalid_in_a_row < MAX_INVALID_IN_A_ROW and self.repeats_in_a_row < MAX_REPEATS_IN_A_ROW:
                trial = self.study.ask()
                config = self.space.canonical(suggest_config(trial, self.space), self.bench.problem)
                trial.set_user_attr("config", str(config))
                reason = self.spec.space.violation(config, self.bench.problem, self.bench.device)
                if reason:
                    self.invalid_in_a_row += 1
                    self.stats.pruned_invalid += 1
                    _prune_invalid(self.study, trial, reason, self.worst_ok_ms)
                    continue
                self.invalid_in_a_row = 0
                if config in self.in_flight:  # answered with the first ask's result
                    self.repeats_in_a_row += 1
                    trial.set_user_attr("repeat", True)
                    self.in_flight[config].append(trial)
                    continue
                earlier = self.verdicts.get(str(config))
                if earlier is not None:
                    self.repeats_in_a_row += 1
                    trial.set_user_attr("repeat", True)
                    self._finish(trial, earlier)
                    continue
                self.repeats_in_a_row = 0
                self.new_asks += 1
                self.in_flight[config] = [trial]
                if self.pool:
                    self.pool.submit(self.bench.problem, config, seed=trial.number)
                return True
            return False
        finally:
            self.stats.sampler_s += time.monotonic() - started

    def _polish_step(self) -> Config | None:
        """The next untried neighbour of the best config, when this ask is the polish's turn."""
        if (not POLISH_EVERY or self.best_config is None or self.measured_count < POLISH_AFTER
                or self.new_asks % POLISH_EVERY != POLISH_EVERY - 1):
            return None
        for neighbour in _neighbours(self.best_config, self.space, self.bench.problem):
            if (neighbour not in self.polished and neighbour not in self.in_flight
                    and str(neighbour) not in self.verdicts
                    and self.spec.space.violation(neighbour, self.bench.problem, self.bench.device) is None):
                self.polished.add(neighbour)
                return neighbour
        return None

    def _next_measurement(self) -> tuple[Config, Measurement]:
        checked_error = None
        if self.pool:
            started = time.monotonic()
            config, pre = self.pool.next_result()
            self.stats.compile_wait_s += time.monotonic() - started
            if pre.status != "ok":
                return config, Measurement(pre.status, rel_error=pre.rel_error, reason=pre.reason)
            checked_error = pre.rel_error  # checked in the worker on fresh inputs: not again, on the serial path
        else:
            config = next(iter(self.in_flight))
        started = time.monotonic()
        measurement = self.bench.measure(config, incumbent_ms=self.incumbent_ms, checked_error=checked_error)
        self.stats.timing_s += time.monotonic() - started
        self.stats.measured += 1
        self.stats.early_stopped += measurement.early_stopped
        if measurement.ok and not measurement.early_stopped and (
                self.incumbent_ms is None or measurement.time_ms < self.incumbent_ms):
            self.incumbent_ms = measurement.time_ms
        return config, measurement

    def _finish(self, trial: optuna.Trial, measurement: Measurement) -> None:
        _tell(self.study, trial, measurement)
        if trial.user_attrs.get("repeat"):
            return
        self.verdicts.setdefault(trial.user_attrs["config"], _verdict_of(measurement))
        self.measured_count += 1
        if measurement.ok:
            ms = float(measurement.time_ms)
            if self.best_ms is None or ms < self.best_ms:
                self.best_config = Config.parse(trial.user_attrs["config"])
            self.best_ms = ms if self.best_ms is None else min(self.best_ms, ms)
            self.worst_ok_ms = ms if self.worst_ok_ms is None else max(self.worst_ok_ms, ms)
        if self.on_trial:
            self.on_trial(Progress(self.bench.problem, self.measured_count, self.budget.trials,
                                   measurement.status, self.best_ms))


def _neighbours(config: Config, space: kernels.SearchSpace, problem: Problem | None = None) -> list[Config]:
    """Configs one step away from ``config`` in one parameter (the next value up or down), canonical
    (for ``problem``, when given) and distinct, the parameters of POLISH_ORDER first; validity is the
    caller's to check."""
    order = {name: i for i, name in enumerate(POLISH_ORDER)}
    params = sorted(space.params, key=lambda p: order.get(p.name, len(order)))
    found: list[Config] = []
    for param in params:
        value = config.get(param.name)
        if value not in param.values:
            continue
        index = param.values.index(value)
        for step in (1, -1):
            if 0 <= index + step < len(param.values):
                neighbour = space.canonical(config.replace(**{param.name: param.values[index + step]}), problem)
                if neighbour != config and neighbour not in found:
                    found.append(neighbour)
    return found


def _winner_record(spec: KernelSpec, problem: Problem, device: DeviceInfo, found: tuple[Config, float],
                   baseline_ms: float, trials: int, mode: str = GRAPH, cublas_ms: float | None = None,
                   cublas_won: bool = False) -> Record:
    """The record of ``mode``'s winner: ``found`` (the best Triton config and its time), unless the
    baseline beats it. ``cublas_ms`` is our dispatch's own cuBLAS path, where it was timed: a cuBLAS
    winner then stores that time, the one ``kernels.matmul`` costs, not ``torch.matmul``'s, whichever is
    less. The record's ``cublas_ms`` is always torch.matmul's (``baseline_ms``): its speed-up is then the
    one a user sees against torch.matmul, above 1 where our C++ path of a host-bound cuBLAS call costs
    less host time than torch's own call (kernels/_native.py)."""
    triton_config, triton_ms = found
    # Equivalent here; better where the record is reused on a nearby problem (SearchSpace.portable).
    triton_config = spec.space.portable(triton_config, problem, device, spec.portable_values(device))
    # A Triton config must beat the baseline by a margin: run-to-run spread of one kernel's median on
    # the H100 was 1-3% (scripts/bench.py vs the search's own timings, 2026-11-23).
    # cuBLAS as dispatch would call it: our own dispatch path's time where it was timed (eager: its
    # lookup costs host time, or saves some from C++, so a Triton config must beat that path, not
    # torch.matmul), else torch.matmul's. Before 2026-11-25 this was the larger of the two, and stored
    # eager cuBLAS winners at 1.00x where a fresh process measured them at 1.03x (median of 129
    # host-bound picks, H100, docs/BENCHMARKS.md, 2026-11-25).
    cublas_cost = baseline_ms if cublas_ms is None else cublas_ms
    # A baseline that dispatch cannot run as timed (KernelSpec.baseline_dispatchable) is the yardstick only.
    baseline_wins = spec.baseline_dispatchable(problem) and (
        cublas_won or (cublas_cost < triton_ms * (1 + WIN_MARGIN) and not device.is_cpu))
    if baseline_wins:  # on a GPU-bound eager call, see at_par_when_gpu_bound
        config, time_ms = BASELINE, cublas_cost
    else:
        config, time_ms = triton_config, triton_ms
    return Record(
        device_name=device.name, device_alias=device.alias, compute_capability=device.compute_capability,
        sm_count=device.sm_count, kernel=spec.name, problem_key=problem.key, dtype=problem.dtype,
        layout=problem.layout, shapes=problem.shapes, config=config.as_dict(), time_ms=time_ms,
        tflops=problem.flops / (time_ms * 1e-3) / 1e12 if time_ms > 0 else 0.0, cublas_ms=baseline_ms,
        triton_config=triton_config.as_dict(), triton_ms=triton_ms,
        torch_version=torch.__version__, triton_version=triton.__version__,
        cuda_version=torch.version.cuda or "" if not device.is_cpu else "", trials=trials, mode=mode)


def at_par_when_gpu_bound(eager: Record, graph_cublas_ms: float | None) -> Record:
    """``eager``, a cuBLAS winner of a GPU-bound call (``graph_cublas_ms``, torch.matmul's time in the
    problem's graph record, at GPU_BOUND_EAGER_MS or more), with torch.matmul's eager time as its own: our
    path runs the same kernel, 1.00x. Any other record comes back as it is. Applied by ``decide_modes``,
    ``tuner.quick.redecide``, scripts/redecide.py and, to records decided before the rule,
    scripts/ship_table.py --settle-gpu-bound."""
    if eager.mode != EAGER or eager.config.get("VARIANT") != "cublas" or not eager.cublas_ms \
            or graph_cublas_ms is None or graph_cublas_ms < GPU_BOUND_EAGER_MS or eager.time_ms == eager.cublas_ms:
        return eager
    return dataclasses.replace(eager, time_ms=eager.cublas_ms, tflops=eager.tflops * eager.time_ms / eager.cublas_ms)


def tune(spec: KernelSpec, problems: Sequence[Problem], device: DeviceInfo, store: Store, **options) -> list[Record]:
    """Tune each problem in turn; each winner is committed as soon as its problem is done."""
    records = []
    for problem in problems:
        records.append(tune_problem(spec, problem, device, store, **options))
    kernels.clear_cache()  # this process may dispatch next: let it see the new winners
    return records
