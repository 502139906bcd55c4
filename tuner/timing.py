"""The timing of a call, in each dispatch mode (kernels/_modes.py): one rule, one home.

- ``graph_ms``: the call captured once in a CUDA graph, its replay timed by ``do_bench`` with L2
  flushed between runs. What a CUDA-graph caller (vLLM decode, reduce-overhead) pays: GPU time only.
- ``eager_ms``: the public call back to back, over rotating inputs that together overflow L2, timed
  from the first enqueue to the last kernel's end and divided by the calls. What a Python loop pays:
  max(host, GPU) per call. do_bench is not used here: its L2 flush (~80 us of GPU work per call on
  the H100) hides that much host time per call (docs/BENCHMARKS.md).

Comparisons (a contest, ours against torch.matmul) time the sides in turn, finely interleaved
(``graph_ms_side_by_side``, ``eager_ms_side_by_side``): one replay, or one block of about a
millisecond of eager calls, of each side per turn, the order reversed every other turn. The H100
host's speed wanders by up to 1.7x between 10 ms rounds seconds apart (torch.matmul's host time per
call ranged 14.5-24.8 us over 9 rounds, docs/BENCHMARKS.md), and a large GEMM lowers the GPU's clocks
as it runs; timed seconds apart, two runs of the very same cuBLAS kernel came out 0.68x-0.97x of
each other (the held-out benchmark of 2026-11-24). Interleaved at this grain, both sides meet the
same host and the same clocks. The host also slows in bursts of a tenth of a second or so; an eager
reading sets aside the turns inside one (``eager_side_by_side``, HOST_NOMINAL_SLACK), so that what it
reads is what the same call reads a second later. And it slows for seconds at a time: a reading that must
be read at the host's nominal speed whatever the moment (a stamp's, the bench's) waits for that speed to
come back (``settle_s``; HostSpeed.learn and HostSpeed.settle).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

import kernels
from kernels import Config, KernelSpec, Problem

log = logging.getLogger(__name__)

# do_bench's budgets: full (the search's default) and quick (the early stop's first look).
FULL_MS = (25, 100)
QUICK_MS = (5, 10)
# Eager timing: each round runs calls for at least this long, and the median of the rounds counts.
EAGER_ROUND_MS = 10.0
EAGER_ROUNDS = 3
EAGER_MAX_CALLS = 4000
# Rotating input sets: enough to cycle through 3x the L2 (so operands come from HBM, as a model's
# weights do), at most this many sets and this many bytes in all.
L2_MULTIPLE = 3
MAX_ROTATION = 256
MAX_ROTATION_BYTES = 4 << 30


def graph_ms(call: Callable[[], Any], budget: tuple[int, int] = FULL_MS) -> float:
    """Median ms of ``call`` replayed from a CUDA graph, L2 flushed between replays."""
    import triton.testing

    with kernels.grouped.captures_released():  # the graph dies here: what it kept alive may go with it
        graph = capture(call)
        ms = float(triton.testing.do_bench(graph.replay, warmup=budget[0], rep=budget[1], return_mode="median"))
        del graph
    return ms


def capture(call: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    """``call`` captured in a CUDA graph, after a warm-up in each mode on the stream that then captures
    (so that compiling, resolving a config and allocating that stream's workspaces all happen before the
    capture, as torch.compile's CUDA graphs warm up and capture on one stream: a split-K workspace first
    allocated inside a capture would add a zeroing node to the graph, kernels/gemm.py ``_SplitKWorkspace``)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for mode in kernels.MODES:
            with kernels.dispatch_mode(mode):
                call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        call()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def eager_ms(call: Callable[[tuple], Any], inputs: Sequence[tuple], round_ms: float = EAGER_ROUND_MS,
             rounds: int = EAGER_ROUNDS) -> float:
    """Median ms per call of ``call(inputs[i % len(inputs)])`` made back to back (host time included)."""
    for x in inputs:
        call(x)
    torch.cuda.synchronize()
    one_ms = _estimate_ms(call, inputs, at_least_ms=0.0)  # one pass
    calls = max(len(inputs), min(EAGER_MAX_CALLS, math.ceil(round_ms / one_ms)))
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        begin.record()
        for i in range(calls):
            call(inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        per_call.append(begin.elapsed_time(end) / calls)
    return statistics.median(per_call)


# Side-by-side timing: each side's eager block lasts about this long, and the turns go on until each
# side has run about this long in all (at least the fewest turns, at most the most).
SIDE_BLOCK_MS = 1.0
SIDE_EAGER_MS = 60.0
SIDE_MIN_TURNS, SIDE_MAX_TURNS = 8, 400
SIDE_SLOW_BLOCKS = 8
# do_bench's L2 flush: zeroing a buffer larger than any L2 (triton's own empty cache is 256 MB).
FLUSH_BYTES = 256 << 20


def graph_ms_side_by_side(calls: Sequence[Callable[[], Any]], budget: tuple[int, int] = FULL_MS) -> list[float]:
    """Median ms of each call replayed from its own CUDA graph, the graphs replayed in turn (L2 flushed
    before every replay), so that clock drift during the timing falls on every side alike."""
    with kernels.grouped.captures_released():  # the graphs die here: what they kept alive may go with them
        return _graphs_side_by_side([capture(call) for call in calls], budget)


def _graphs_side_by_side(graphs: list[torch.cuda.CUDAGraph], budget: tuple[int, int], flush: bool = True
                         ) -> list[float]:
    """Median ms per replay of each graph, replayed in turn, after ``budget[0]`` ms of warm-up, for about
    ``budget[1]`` ms; the L2 flushed before every replay where ``flush``."""
    buffer = torch.empty(FLUSH_BYTES if flush else 1, dtype=torch.int8, device="cuda")  # 1 byte: a token flush
    estimate = [_replay_ms(graph, buffer, 5) for graph in graphs]
    for graph, ms in zip(graphs, estimate):  # warm-up, as do_bench's
        for _ in range(max(1, int(budget[0] / len(graphs) / max(ms, 1e-3)))):
            graph.replay()
    turns = _turns(sum(estimate), budget[1])
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(turns)]
              for _ in graphs]
    for turn in range(turns):
        for side in _order(len(graphs), turn):
            buffer.zero_()
            begin, end = events[side][turn]
            begin.record()
            graphs[side].replay()
            end.record()
    torch.cuda.synchronize()
    return [statistics.median(b.elapsed_time(e) for b, e in side) for side in events]


# Back-to-back GPU time (``queued_ms_side_by_side``): blocks of at least this many calls and about this much
# time per block as the slowest side's eager loop takes it (wall time, host included: where the host bounds
# the call a block holds less GPU work), at most this many calls (each may launch two kernels; the launch
# queue holds about a thousand), in turns for about this long per side. Sized by the slowest side, not the
# fastest: a side that launches ten kernels a call, in blocks sized by a one-launch side, filled the launch
# queue, the host then waited on the GPU and every try was caught up (1,470 launches a block; H200,
# 2026-11-29, torch 2.11.0+cu130, triton 3.6.0, tests/tuner_tests/test_timing.py under 8 test processes). The stream is held this much longer than the
# host's estimated time to queue a block, twice as long again whenever the GPU caught up with the host, up
# to QUEUE_TRIES tries and QUEUE_MAX_HOLD_MS.
QUEUE_CALLS = 16
QUEUE_BLOCK_MS = 2.0
QUEUE_MAX_CALLS = 400
QUEUE_BUDGET_MS = 20.0
QUEUE_TURNS = (4, 40)
QUEUE_HOLD_FACTOR = 1.5
QUEUE_TRIES = 4
QUEUE_MAX_HOLD_MS = 200.0


def queued_ms_side_by_side(calls: Sequence[Callable[[tuple], Any]], inputs: Sequence[tuple],
                           budget_ms: float = QUEUE_BUDGET_MS) -> list[float]:
    """ms per call of each ``call(inputs[i % len(inputs)])`` run back to back on the GPU with no host in the
    way: the eager loop of a host fast enough to keep the GPU busy. The sides take turns; in each turn a
    GPU sleep holds the stream while the host queues a block of calls, launched as an eager loop launches
    them, which the GPU then runs one after the other (L2 not flushed: each call finds what the one before
    left). Events after the sleep and after the block time the block.

    ``eager_ms`` on a slow host times the host instead, and the two can rank configs differently: on the
    H100 box, torch.matmul of bf16 1x2048x10944 ran at 20.6 us per call when the host kept up and 26-30 us
    when it did not, a split-K config at 21.7 and 22.7-25 us (scripts/probes/gemv_state_probe.py, retired at 1996844,
    2026-11-25). Until 2026-11-26 the blocks were CUDA graphs of calls; a graph's launches hide part of
    the gaps an eager loop pays, and bf16 32x1024x8192's split-K winner, within 1% of cuBLAS there, ran
    6-7% behind it in eager loops on a fast host (H100, docs/BENCHMARKS.md, 2026-11-26)."""
    wall_ms = [_warmed_estimate_ms(call, inputs) for call in calls]
    count = int(max(QUEUE_CALLS, min(QUEUE_MAX_CALLS, math.ceil(QUEUE_BLOCK_MS / max(wall_ms)))))
    turns = int(min(QUEUE_TURNS[1], max(QUEUE_TURNS[0], budget_ms / (count * max(wall_ms)))))
    # The host queues a call in at most its wall time per call (max of host and GPU): hold that long, and more.
    hold_ms = [QUEUE_HOLD_FACTOR * count * ms + 0.05 for ms in wall_ms]
    per_call: list[list[float]] = [[] for _ in calls]
    for turn in range(turns):
        for side in _order(len(calls), turn):
            per_call[side].append(_queued_block_ms(calls[side], inputs, count, hold_ms, side, turn) / count)
    return [statistics.median(times) for times in per_call]


def _queued_block_ms(call: Callable[[tuple], Any], inputs: Sequence[tuple], count: int, hold_ms: list[float],
                     side: int, turn: int) -> float:
    """GPU ms of ``count`` calls queued behind a sleep of ``hold_ms[side]``; a block that the GPU reached
    before the host had queued it is run again with twice the hold (kept for the later turns, at most
    QUEUE_MAX_HOLD_MS). Where every try was caught up (a host that waits on the GPU inside the call, or a
    full launch queue), the last try's time is returned, host time in it, with a warning."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for attempt in range(QUEUE_TRIES):
        if attempt:
            hold_ms[side] = min(2 * hold_ms[side], QUEUE_MAX_HOLD_MS)
        torch.cuda.synchronize()
        torch.cuda._sleep(_cycles(hold_ms[side]))
        begin.record()
        for j in range(count):
            call(inputs[(turn * count + j) % len(inputs)])
        caught_up = begin.query()  # the sleep ended before the last call was queued: host time got in
        end.record()
        end.synchronize()
        if not caught_up:
            return begin.elapsed_time(end)
    log.warning("back-to-back timing: the GPU caught up with the host in %d tries (hold %.1f ms for %d calls); "
                "this block's time includes host time", QUEUE_TRIES, hold_ms[side], count)
    return begin.elapsed_time(end)


def _cycles(ms: float) -> int:
    """Clock cycles of ``torch.cuda._sleep`` that last about ``ms`` on this GPU."""
    return int(ms * _sleep_cycles_per_ms())


@functools.cache
def _sleep_cycles_per_ms() -> float:
    """``torch.cuda._sleep``'s cycles per ms on this GPU, measured once per process."""
    probe = 1_000_000
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(probe)  # the first sleep loads its kernel
    begin.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return probe / max(begin.elapsed_time(end), 1e-3)


def _replay_ms(graph: torch.cuda.CUDAGraph, flush: torch.Tensor, count: int) -> float:
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    total = 0.0
    for _ in range(count):
        flush.zero_()
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        total += begin.elapsed_time(end)
    return total / count


# The host's own speed, read between the turns of ``eager_side_by_side``. On the lent KVM machines a pure-Python
# loop ran 1.2-1.8x slower in bursts of about 0.1-0.2 s, 10-20% of the time, and torch.matmul's eager time per
# call rose with it while a GPU-bound call's did not (H100, 2026-11-26, scripts/probes/host_phase_probe.py, retired at 1996844,
# docs/BENCHMARKS.md, 2026-11-26). A contest of 60 ms a side can fall wholly inside such a burst, and
# a host-bound figure read there is not the one the same call reads a second later. So each turn is bracketed
# by a short spin of the host, and the figure is read over the turns at the host's nominal speed: the spins on
# either side within HOST_NOMINAL_SLACK of the fastest spin this process has seen. Our calls cost less host
# time than torch.matmul's (scripts/host_cost.py), so a slower host widens our lead: the nominal figure is the
# one a user's call can count on. While too few turns are nominal the turns go on, up to HOST_EXTRA_TURNS
# times those asked; with fewer than HOST_MIN_NOMINAL_TURNS nominal turns, every turn counts.
#
# Bursts are not the whole story. On 2026-11-27 (H100 box, scripts/probes/host_phase_series_probe.py, retired at 1996844, docs/BENCHMARKS.md
# 2026-11-27) the same loop read about 600 us for some seconds and 1000 us for others, in phases of
# 1 to 12 s, with no hypervisor steal; torch.matmul's host cost per call (13 against 18.5 us) and a bare launch
# followed it, pinned to one CPU or not. A reading that falls in such a phase cannot find nominal turns by
# taking more of them. So a reading whose figure is stored or checked against a stored one (a stamp, the
# bench) may wait for the nominal speed instead (``settle_s``): HostSpeed.learn first finds that speed in
# this process (a slow phase at the start would otherwise pass for it), then HostSpeed.settle waits for it.
HOST_SPIN_LOOPS = 2000  # about 70 us of pure Python on the lent machines' hosts
HOST_NOMINAL_SLACK = 1.2
HOST_EXTRA_TURNS = 3
HOST_MIN_NOMINAL_TURNS = 3
HOST_LEVELS = 1.3  # two windows' medians this far apart: both of the host's speeds were seen (1.6x measured)
HOST_LEARN_S = 15.0  # at most this long to see both (the longest phase measured: 12 s)
HOST_LEARN_WINDOW_S = 0.1
HOST_POLL_S = 0.01  # between spins while learning or waiting: the spin must not become the host's load
HOST_SETTLE_S = 15.0  # a reading waits at most this long for the nominal speed, each time it needs it
HOST_SETTLED_SPINS = 2  # nominal spins in a row that end a wait (one fast spin inside a slow phase does not)
HOST_SETTLE_TRIES = 2  # waits per reading, each followed by its turns


class HostSpeed:
    """The time of a fixed pure-Python loop (no GPU in it), and the least seen in this process: the host's
    speed when nothing holds it back. ``clock`` and ``sleep`` are the wall clock's (a test scripts them)."""

    def __init__(self, loops: int = HOST_SPIN_LOOPS, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.loops = loops
        self.fastest_us = math.inf
        self.clock, self.sleep = clock, sleep
        self.learned = False

    def spin_us(self) -> float:
        started = time.perf_counter()
        total = 0
        for i in range(self.loops):
            total += i & 7
        spent = (time.perf_counter() - started) * 1e6
        self.fastest_us = min(self.fastest_us, spent)
        return spent

    def learn(self, budget_s: float = HOST_LEARN_S) -> float:
        """The host's nominal spin (``fastest_us``), once per process: spins every HOST_POLL_S until the
        medians of two HOST_LEARN_WINDOW_S windows stand HOST_LEVELS apart (both speeds seen, so the least
        spin is the fast one's), or ``budget_s`` passes (a steady host: the least is its only speed).
        Medians of windows, so that one slow spin (an interrupt) does not pass for the slow phase."""
        if self.learned:
            return self.fastest_us
        started = window_started = self.clock()
        window: list[float] = []
        medians: list[float] = []
        while True:
            window.append(self.spin_us())
            now = self.clock()
            if now - window_started >= HOST_LEARN_WINDOW_S:
                medians.append(statistics.median(window))
                window, window_started = [], now
                if max(medians) >= HOST_LEVELS * min(medians):
                    break
            if now - started >= budget_s:
                break
            self.sleep(HOST_POLL_S)
        self.learned = True
        log.debug("host: nominal spin %.1f us, learned in %.1f s", self.fastest_us, self.clock() - started)
        return self.fastest_us

    def settle(self, budget_s: float = HOST_SETTLE_S, slack: float = HOST_NOMINAL_SLACK) -> float:
        """Wait until HOST_SETTLED_SPINS spins in a row read within ``slack`` of ``fastest_us``, or
        ``budget_s`` passes; the seconds waited."""
        started = self.clock()
        in_a_row = 0
        while True:
            in_a_row = in_a_row + 1 if self.spin_us() <= slack * self.fastest_us else 0
            waited = self.clock() - started
            if in_a_row >= HOST_SETTLED_SPINS or waited >= budget_s:
                return waited
            self.sleep(HOST_POLL_S)


HOST = HostSpeed()


def learn_host(host: HostSpeed | None = None) -> str:
    """Learn the host's nominal speed now (HostSpeed.learn) and say it in a line for a run's log: two
    processes whose nominal spins differ ran on hosts of different speeds, and their host-bound eager
    figures differ with them."""
    host = host or HOST
    started = time.monotonic()
    fastest = host.learn()
    return f"host: nominal spin {fastest:.0f} us ({host.loops} loops of Python), learned in {time.monotonic() - started:.1f} s"

# What paces a baseline's eager call: the host where the call is shorter than HOST_PACED_MS (torch.matmul's own
# host cost read 13-27 us a call on the lent H100 hosts, slow phases included, so the host paces such a call
# at least part of the time) or HOST_PACED_RATIO or more over its GPU time (its graph timing). An eager
# speed-up over a host-paced baseline moves with the host's speed (docs/BENCHMARKS.md, 2026-11-27).
HOST_PACED_MS = 0.030
HOST_PACED_RATIO = 1.15


def baseline_paced_by(eager_ms: float | None, graph_ms: float | None) -> str:
    """"host" or "gpu" for a baseline's eager time beside its GPU (graph) time, as above; "-" without both."""
    if not eager_ms or not graph_ms:
        return "-"
    return "host" if eager_ms < HOST_PACED_MS or eager_ms >= HOST_PACED_RATIO * graph_ms else "gpu"


def nominal_turns(spins: Sequence[float], fastest_us: float, slack: float = HOST_NOMINAL_SLACK) -> list[bool]:
    """Turn ``t`` ran between ``spins[t]`` and ``spins[t + 1]``: it is at the host's nominal speed where both
    are within ``slack`` of ``fastest_us``."""
    limit = slack * min(fastest_us, min(spins, default=math.inf))
    return [max(before, after) <= limit for before, after in zip(spins, spins[1:])]


@dataclasses.dataclass(frozen=True)
class EagerReading:
    """``eager_side_by_side``'s figures: per side, the median ms per call over the turns at the host's
    nominal speed (``nominal_ms``, what the tuner stores and the bench reports) and over every turn
    (``all_ms``, as this run's host gave it), with how many turns each is read over."""

    nominal_ms: list[float]
    all_ms: list[float]
    nominal_turns: int
    turns: int
    waited_s: float = 0.0  # waited for the host's nominal speed (``settle_s``)


def eager_ms_side_by_side(calls: Sequence[Callable[[tuple], Any]], inputs: Sequence[tuple],
                          total_ms: float = SIDE_EAGER_MS, block_ms: float = SIDE_BLOCK_MS,
                          before: Sequence[Callable[[], None] | None] | None = None,
                          settle_s: float = 0.0) -> list[float]:
    """``eager_side_by_side``'s figure at the host's nominal speed, per side."""
    return eager_side_by_side(calls, inputs, total_ms, block_ms, before, settle_s=settle_s).nominal_ms


def eager_side_by_side(calls: Sequence[Callable[[tuple], Any]], inputs: Sequence[tuple],
                       total_ms: float = SIDE_EAGER_MS, block_ms: float = SIDE_BLOCK_MS,
                       before: Sequence[Callable[[], None] | None] | None = None,
                       host: HostSpeed | None = None, settle_s: float = 0.0) -> EagerReading:
    """Median ms per call of each ``call(inputs[i % len(inputs)])``, back to back as ``eager_ms`` times
    them, in blocks of about ``block_ms`` taken in turn: each block is timed by events around it, so a
    block sees max(host, GPU) per call, and neighbouring blocks of the sides meet the same host speed.
    A spin of the host between turns tells the turns at its nominal speed (HOST_NOMINAL_SLACK above).

    ``settle_s`` > 0: the host's nominal speed is learned (once per process) and the turns start once the
    host runs at it (a wait of ``settle_s`` at most); where they still find fewer than
    HOST_MIN_NOMINAL_TURNS nominal turns, they wait and go on again, HOST_SETTLE_TRIES waits in all.

    ``before[i]``, where given, runs ahead of each of side i's blocks, untimed (``public_calls``'s
    installers: several configs of one call signature take turns)."""
    host = host or HOST
    waited = 0.0
    if settle_s > 0:
        host.learn()
    enter = list(before) if before is not None else [None] * len(calls)
    one_ms = []
    for call, ready in zip(calls, enter):  # warm-up (compiles, plans, allocator), then a first estimate
        if ready is not None:
            ready()
        one_ms.append(_warmed_estimate_ms(call, inputs))
    # One block length, in calls, for every side: a block's fixed cost (its events, the last
    # kernel's tail) is then spread over as many calls on each side. Sized by the fastest side; the
    # slowest side's block may be longer, up to SIDE_SLOW_BLOCKS blocks' time.
    per_block = max(1, min(EAGER_MAX_CALLS, math.ceil(block_ms / min(one_ms)),
                           math.ceil(SIDE_SLOW_BLOCKS * block_ms / max(one_ms))))
    wanted = _turns(per_block * sum(one_ms), total_ms * len(calls))
    events: list[list[tuple[torch.cuda.Event, torch.cuda.Event]]] = [[] for _ in calls]
    position = [0] * len(calls)  # each side walks its own way round the inputs
    # Turns come in runs, each bracketed by a chain of spins; a wait for the host breaks the chain.
    runs: list[list[float]] = []
    turn = 0

    def counted() -> int:
        return sum(sum(nominal_turns(spins, host.fastest_us)) for spins in runs)

    for attempt in range(HOST_SETTLE_TRIES if settle_s > 0 else 1):
        if attempt and counted() >= HOST_MIN_NOMINAL_TURNS:
            break
        torch.cuda.synchronize()
        if settle_s > 0:
            waited += host.settle(settle_s)
        spins = [host.spin_us()]
        runs.append(spins)
        limit = turn + HOST_EXTRA_TURNS * wanted
        target = turn + wanted
        while turn < target or (counted() < wanted and turn < limit):
            for side in _order(len(calls), turn):
                call = calls[side]
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                i = position[side]
                if enter[side] is not None:
                    enter[side]()
                begin.record()
                for j in range(i, i + per_block):
                    call(inputs[j % len(inputs)])
                end.record()
                events[side].append((begin, end))
                position[side] = (i + per_block) % len(inputs)
            spins.append(host.spin_us())
            turn += 1
    torch.cuda.synchronize()
    per_turn = [[b.elapsed_time(e) / per_block for b, e in side] for side in events]
    nominal = [keep for spins in runs for keep in nominal_turns(spins, host.fastest_us)]
    all_ms = [statistics.median(times) for times in per_turn]
    if sum(nominal) < HOST_MIN_NOMINAL_TURNS:
        return EagerReading(all_ms, all_ms, 0, turn, waited)
    nominal_ms = [statistics.median(t for t, keep in zip(times, nominal) if keep) for times in per_turn]
    return EagerReading(nominal_ms, all_ms, sum(nominal), turn, waited)


def _warmed_estimate_ms(call: Callable[[tuple], Any], inputs: Sequence[tuple]) -> float:
    """``_estimate_ms`` after one warm-up pass over ``inputs`` (compiles, plans, the C++ hand-over, the allocator)."""
    for x in inputs:
        call(x)
    torch.cuda.synchronize()
    return _estimate_ms(call, inputs)


def median_pass(speedups: Sequence[float]) -> int:
    """Index of the median of ``speedups`` (the lower middle of an even count; the first of equal ones): the
    pass kept where a figure is read in several passes (search.confirm_eager, tuner.stamp,
    scripts/bench_dispatch.py --passes)."""
    return list(speedups).index(statistics.median_low(speedups))


def _estimate_ms(call: Callable[[tuple], Any], inputs: Sequence[tuple], at_least_ms: float = 2.0) -> float:
    """Wall ms per call over whole passes of ``inputs``, for at least ``at_least_ms`` (a handful of
    calls is mostly the synchronize)."""
    calls, started = 0, time.perf_counter()
    while True:
        for x in inputs:
            call(x)
        calls += len(inputs)
        torch.cuda.synchronize()
        elapsed = (time.perf_counter() - started) * 1e3
        if elapsed >= at_least_ms:
            return max(elapsed / calls, 1e-4)


def _turns(turn_ms: float, budget_ms: float) -> int:
    return int(min(SIDE_MAX_TURNS, max(SIDE_MIN_TURNS, budget_ms / max(turn_ms, 1e-3))))


def _order(sides: int, turn: int) -> range:
    """Every other turn in reverse: whichever side comes first in a turn is not always the same one."""
    return range(sides) if turn % 2 == 0 else range(sides - 1, -1, -1)


def rotation_size(problem: Problem, element_size: int, l2_bytes: int) -> int:
    """How many input sets ``eager_ms`` cycles through for ``problem``."""
    per_set = max(problem.bytes_moved(element_size), 1)
    wanted = math.ceil(L2_MULTIPLE * l2_bytes / per_set)
    return int(max(2, min(MAX_ROTATION, wanted, max(2, MAX_ROTATION_BYTES // per_set))))


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 50 << 20) or (50 << 20))


@contextlib.contextmanager
def public_calls(spec: KernelSpec, configs: Sequence[Config], inputs: tuple, graph: Config | None = None
                 ) -> Iterator[list[tuple[Callable[[tuple], Any], Callable[[], None] | None]]]:
    """(call, installer) per config, for a side-by-side eager timing: as ``public_call``, but the
    configs share one call signature, so each side's installer makes ``kernels.matmul`` run its config
    until the next installer runs (None: the call forces its config itself). ``graph``: the graph
    winner that dispatch will hold beside each config (``kernels._plans.pinning``)."""
    public = _public(spec)
    if public is None:
        yield [((lambda x, c=c: spec.execute(c, x)), None) for c in configs]
        return
    pinning, call = public
    with pinning(configs, inputs, graph) as installers:
        yield [(call, install) for install in installers]


def _public(spec: KernelSpec) -> tuple[Callable[..., Any], Callable[[tuple], Any]] | None:
    """(how to pin configs on these inputs, the public call) of a kernel whose dispatch can be pinned, or
    None (grouped_matmul, whose dispatch caches launches by operand address; a test's stand-in spec)."""
    if kernels.KERNELS.get(spec.name) is not spec:
        return None
    from kernels import _plans, epilogue, moe, moe_gated

    if spec.name == "matmul":
        return (lambda configs, x, graph: _plans.pinning(configs, *x[:2], graph=graph)), lambda x: kernels.matmul(*x)
    if spec.name == "moe_matmul":  # the device offsets, as a user passes them (x[3] holds them on the host)
        return (lambda configs, x, graph: moe.pinning(configs, *x[:2])), lambda x: kernels.moe_matmul(*x[:3])
    if spec.name == "moe_gated_matmul":
        return ((lambda configs, x, graph: moe_gated.pinning(configs, *x[:2])),
                lambda x: kernels.moe_gated_matmul(*x[:3]))
    if spec.name in ("matmul_bias", "gated_matmul"):
        public = getattr(kernels, spec.name)
        return (lambda configs, x, graph: epilogue.pinning(spec, configs, *x[:2], graph=graph)), lambda x: public(*x)
    return None


@contextlib.contextmanager
def public_call(spec: KernelSpec, config: Config, inputs: tuple) -> Iterator[Callable[[tuple], Any]]:
    """The call a user makes for this kernel, with ``config`` forced: ``kernels.matmul(a, b)`` through
    its call plan (kernels/_plans.py), or ``kernels.matmul_bias``, ``kernels.gated_matmul``,
    ``kernels.moe_matmul`` and ``kernels.moe_gated_matmul`` through their signature lookup, so its host time
    is the user's; grouped_matmul's ``grouped_matmul_with`` (its dispatch caches launches by operand address;
    and a test's stand-in spec, its own ``run``)."""
    with public_calls(spec, [config], inputs) as ((call, install),):
        if install is not None:
            install()
        yield call
