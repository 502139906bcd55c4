"""Check and time one config of one kernel on one problem, in both dispatch modes.

Every candidate is checked before it is timed (kernels/_check.py ``check_config``): fresh inputs with loud
edges, outputs NaN from their allocation on, every element within its own bound of a float32 (float64 on
the CPU) reference; and its outputs are poisoned with NaN when released, so a kernel that writes nothing
cannot pass on a previous candidate's result left in recycled memory. Each candidate gets two times (tuner/timing.py):
``graph`` (a CUDA-graph replay, L2 flushed: the search's objective) and ``eager`` (the public call
back to back, host time included). Under the interpreter on CPU, a wall clock stands in for both.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import kernels
from kernels import EAGER, GRAPH, Config, DeviceInfo, KernelSpec, Problem, is_baseline
from kernels._check import CheckResult, check_config

from . import timing
from .errors import DeviceFault, broke_the_context

log = logging.getLogger(__name__)


Timer = Callable[[Callable[[], Any]], float]
# Times a call over rotating inputs: (call(inputs), [inputs, ...]) -> ms per call.
EagerTimer = Callable[[Callable[[tuple], Any], Sequence[tuple]], float]

# A candidate whose quick time is this much slower than the best so far gets no full timing. Quick
# medians of one kernel spread by a few percent on the H100; 10% leaves no doubt that it loses.
EARLY_STOP_MARGIN = 0.10

# Timings per side when the winner meets cuBLAS; three make a median that one outlier cannot move.
# (Used where the sides are timed one after another: test timers, the CPU. On a GPU the sides are
# timed together, finely interleaved: see SideBySide.)
HEAD_TO_HEAD_ROUNDS = 3


@dataclass(frozen=True)
class SideBySide:
    """How a contest on the GPU times its sides together (tuner/timing.py ``*_side_by_side``): the
    do_bench-like budget of the graph timing and the eager ms per side."""

    graph_budget: tuple[int, int] = timing.FULL_MS
    eager_ms: float = timing.SIDE_EAGER_MS
    # > 0: an eager contest waits up to this long for the host's nominal speed (timing.eager_side_by_side);
    # for readings that are stored as what the user's call gets (a stamp) or checked against them.
    settle_s: float = 0.0


@dataclass(frozen=True)
class Measurement:
    """What one candidate did: ``ok`` with a time, or why not."""

    status: str  # "ok", "invalid", "compile_error", "wrong_result", "error"
    time_ms: float | None = None  # the graph-mode time: the search's objective
    eager_ms: float | None = None  # the eager-mode time; None when timed only briefly
    # The check's verdict (kernels/_check.py): the worst element's error in units of its bound, right <= 1.
    rel_error: float | None = None
    reason: str = ""
    early_stopped: bool = False  # timed only briefly: clearly slower than the best so far

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def gpu_timer(fn: Callable[[], Any]) -> float:
    """Median milliseconds of ``fn`` replayed from a CUDA graph, L2 flushed between runs."""
    return timing.graph_ms(fn)


def quick_gpu_timer(fn: Callable[[], Any]) -> float:
    """A first, rough median (about 15 ms of runs instead of 125) to weed out clearly slow candidates."""
    return timing.graph_ms(fn, timing.QUICK_MS)


def wall_eager_timer(call: Callable[[tuple], Any], inputs: Sequence[tuple]) -> float:
    """Stand-in for the eager timer under the interpreter: wall-clock ms of one call per input set."""
    return wall_timer(lambda: call(inputs[0]))


def wall_timer(fn: Callable[[], Any], repeats: int = 3) -> float:
    """Stand-in for the GPU timer under the interpreter: median wall-clock ms (meaningless as speed)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def default_timer(device: DeviceInfo) -> Timer:
    return wall_timer if device.is_cpu else gpu_timer


def default_eager_timer(device: DeviceInfo) -> EagerTimer:
    return wall_eager_timer if device.is_cpu else timing.eager_ms


def default_quick_timer(device: DeviceInfo) -> Timer | None:
    """Interpreter times say nothing about speed, so there is nothing to stop early on a CPU."""
    return None if device.is_cpu else quick_gpu_timer


def torch_device_of(device: DeviceInfo) -> torch.device:
    return torch.device("cpu") if device.is_cpu else torch.device("cuda", torch.cuda.current_device())


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| over all outputs (NaN anywhere gives NaN); 0/0 counts as exact. For reports: the
    check is kernels/_check.py's, element by element.

    Computed in float32 on the outputs' device, one output at a time: a float64 copy of a
    4096x28672 result is 0.9 GB, and fourteen workers doing that at once ran the H100 out of memory.
    """
    outs = out if isinstance(out, (list, tuple)) else [out]
    refs = ref if isinstance(ref, (list, tuple)) else [ref]
    if len(outs) != len(refs):
        return math.inf
    num = den = 0.0
    for o, r in zip(outs, refs):
        if tuple(o.shape) != tuple(r.shape):
            return math.inf
        if o.numel() == 0:
            continue
        r = r.float()
        num += float(torch.linalg.vector_norm(o.float() - r)) ** 2
        den += float(torch.linalg.vector_norm(r)) ** 2
    if math.isnan(num):
        return math.nan
    return 0.0 if num == 0.0 else math.sqrt(num / den) if den > 0 else math.inf


def wrong_result_reason(verdict: CheckResult) -> str:
    """A failed check in one line: the worst element, its value, the reference's, and how far over."""
    return f"wrong result: {verdict.reason or f'error {verdict.error:.3g}x the bound'}"


class Bench:
    """Measures configs of one kernel on one problem, on fresh inputs each time."""

    def __init__(self, spec: KernelSpec, problem: Problem, device: DeviceInfo,
                 timer: Timer | None = None, seed: int = 0, quick_timer: Timer | None = None,
                 eager_timer: EagerTimer | None = None, side_by_side: SideBySide | None = None) -> None:
        self.spec = spec
        self.problem = problem
        self.device = device
        self.timer = timer or default_timer(device)
        self.quick_timer = quick_timer or (None if timer else default_quick_timer(device))
        # A test's graph timer without an eager one: the eager time is that timer's, one call at a time.
        self.eager_timer = eager_timer or (
            (lambda call, inputs: self.timer(lambda: call(inputs[0]))) if timer else default_eager_timer(device))
        # A test's own timers keep their turn-by-turn contest; on a GPU the sides are timed together.
        self.side_by_side = side_by_side or (None if timer or eager_timer or device.is_cpu else SideBySide())
        self._rotation: list[tuple] | None = None
        self._torch_device = torch_device_of(device)
        self._seed = seed
        if not device.is_cpu and spec.name in ("matmul", "matmul_bias"):
            # The user's cuBLAS (addmm) calls run from C++ once it is built (kernels/_native.py): time them so.
            # Built once per machine (about 30 s on the H100 box), then loaded from torch's build cache.
            kernels._native.start(block=True)

    def _fresh_inputs(self) -> tuple:
        self._seed += 1
        return self.spec.make_inputs(self.problem, self._torch_device, self._seed)

    def rotation(self) -> list[tuple]:
        """Input sets that the eager timing cycles through (made once per problem, then shared)."""
        if self._rotation is None:
            count = 1 if self.device.is_cpu else timing.rotation_size(
                self.problem, 4 if self.problem.dtype == "fp32" else 2, timing.l2_bytes())
            self._rotation = [self._fresh_inputs() for _ in range(count)]
        return self._rotation

    def release(self) -> None:
        """Free the rotating inputs (GPU memory) once the problem is done."""
        self._rotation = None

    def time(self, config: Config, mode: str, inputs: tuple | None = None) -> float:
        """ms of ``config`` (or the baseline) in ``mode``: graph, or eager through the public call."""
        if mode == GRAPH:
            inputs = inputs if inputs is not None else self._fresh_inputs()
            return self.timer(lambda: self.spec.execute(config, inputs))
        rotation = self.rotation()
        with timing.public_call(self.spec, config, rotation[0]) as call:
            return self.eager_timer(call, rotation)

    def baseline_time(self, mode: str, inputs: tuple | None = None) -> float:
        """ms of what the user has without us (torch.matmul, a loop of it) in ``mode``."""
        if mode == GRAPH:
            inputs = inputs if inputs is not None else self._fresh_inputs()
            return self.timer(lambda: self.spec.baseline(inputs))
        return self.eager_timer(self.spec.baseline, self.rotation())

    def check(self, config: Config) -> CheckResult:
        """``config``'s verdict on fresh check inputs (kernels/_check.py ``check_config``)."""
        self._seed += 1
        return check_config(self.spec, self.problem, config, self._torch_device, self._seed)

    def measure(self, config: Config, incumbent_ms: float | None = None,
                checked_error: float | None = None) -> Measurement:
        """Constraint check, correctness check, then timing; never raises for a bad candidate.

        Given the best time so far, a quick timing comes first, and a candidate clearly slower than
        that keeps its quick time (``early_stopped``) instead of getting the full timing. Given the
        error a compile worker's check measured (``checked_error``), the check is not run again.
        """
        reason = None if is_baseline(config) else self.spec.space.violation(config, self.problem, self.device)
        if reason:
            return Measurement("invalid", reason=reason)
        try:
            verdict = self.check(config) if checked_error is None else CheckResult(checked_error)
            error = verdict.error
            if not verdict.ok:  # NaN fails too
                return Measurement("wrong_result", rel_error=error, reason=wrong_result_reason(verdict))
            inputs = self._fresh_inputs()
            run = lambda: self.spec.execute(config, inputs)  # noqa: E731
            if incumbent_ms is not None and self.quick_timer is not None:
                quick = _timed("quick graph", self.quick_timer(run))
                if quick > incumbent_ms * (1 + EARLY_STOP_MARGIN):
                    return Measurement("ok", time_ms=quick, rel_error=error, early_stopped=True)
            graph = _timed("graph", self.timer(run))
            return Measurement("ok", time_ms=graph, eager_ms=_timed("eager", self.time(config, EAGER)),
                               rel_error=error)
        except Exception as exc:  # a candidate may fail in any way; the search goes on
            if broke_the_context(exc):  # ...except where it broke this process's GPU context
                raise DeviceFault(f"{config}: {type(exc).__name__}: {_first_line(exc)}") from exc
            return Measurement(_classify(exc), reason=f"{type(exc).__name__}: {_first_line(exc)}")

    def baseline_ms(self, mode: str = GRAPH) -> float:
        """Time of what the user has without us (torch.matmul, or a loop of it) in the same run."""
        return self.baseline_time(mode)

    def contest(self, configs: Sequence[Config], rounds: int = HEAD_TO_HEAD_ROUNDS,
                mode: str = GRAPH, graph: Config | None = None) -> tuple[list[float], float]:
        """(each config's ms, baseline ms) in ``mode``: medians of timings taken in turn, round after
        round, on the same inputs.

        The search timed its finalists minutes apart, once each; deciding between them and cuBLAS on
        timings taken side by side removes the drift between those moments from the decision.
        ``graph``, in eager mode: the graph winner dispatch will hold beside each config (its mode
        check then counts, as in the user's call).
        """
        if self.side_by_side is not None:
            times = self._side_by_side(configs, mode, self.side_by_side, graph)
            return times[:-1], times[-1]
        inputs = self._fresh_inputs()
        ours: list[list[float]] = [[] for _ in configs]
        theirs = []
        for round_ in range(rounds):
            # Every other round in reverse order: a GPU that heats up over a round (large GEMMs
            # lower its clocks) would otherwise always slow the same side.
            order = list(zip(configs, ours)) + [(None, theirs)]
            for config, times in order if round_ % 2 == 0 else reversed(order):
                times.append(self.baseline_time(mode, inputs) if config is None else self.time(config, mode, inputs))
        return [statistics.median(times) for times in ours], statistics.median(theirs)

    def back_to_back(self, config: Config) -> tuple[float, float]:
        """(``config``'s ms, the baseline's ms) per call back to back on the GPU, no host in the way
        (``timing.queued_ms_side_by_side``, the eager rotation's inputs): the public call's eager loop on a
        fast host."""
        rotation = self.rotation()
        with timing.public_call(self.spec, config, rotation[0]) as call:
            ours, theirs = timing.queued_ms_side_by_side([call, self.spec.baseline], rotation)
        return ours, theirs

    def _side_by_side(self, configs: Sequence[Config], mode: str, how: SideBySide,
                      graph: Config | None = None) -> list[float]:
        """ms of each config, then of the baseline, timed together (tuner/timing.py)."""
        if mode == GRAPH:
            inputs = self._fresh_inputs()
            calls = [(lambda c=c: self.spec.execute(c, inputs)) for c in configs]
            return timing.graph_ms_side_by_side(calls + [lambda: self.spec.baseline(inputs)], how.graph_budget)
        rotation = self.rotation()
        with timing.public_calls(self.spec, configs, rotation[0], graph) as sides:
            calls = [call for call, _ in sides] + [self.spec.baseline]
            installers = [install for _, install in sides] + [None]
            return timing.eager_ms_side_by_side(calls, rotation, how.eager_ms, before=installers,
                                                settle_s=how.settle_s)



class TimingFault(RuntimeError):
    """A timer read no time (NaN, inf, 0 or less): a fault of that timing, not a speed to rank."""


def _timed(what: str, ms: float) -> float:
    """``ms`` if a time can be that (finite, above 0); else TimingFault, which fails the candidate's trial.
    Optuna fails a NaN objective on its own while the trial said "ok", and an inf or 0 ms would rank."""
    if not (math.isfinite(ms) and ms > 0):
        raise TimingFault(f"the {what} timer read {ms} ms: a fault of the timing, not a time (if many configs "
                          "read so, check the GPU with nvidia-smi and search again)")
    return float(ms)


def _classify(exc: Exception) -> str:
    name = type(exc).__name__
    text = str(exc)
    if name in ("CompilationError", "OutOfResources", "CompileTimeAssertionFailure") or "out of resource" in text:
        return "compile_error"
    return "error"


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]
