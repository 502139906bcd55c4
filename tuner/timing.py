"""The timing of a call, in each dispatch mode (kernels/_modes.py): one rule, one home.

- ``graph_ms``: the call captured once in a CUDA graph, its replay timed by ``do_bench`` with L2
  flushed between runs. What a CUDA-graph caller (vLLM decode, reduce-overhead) pays: GPU time only.
- ``eager_ms``: the public call back to back, over rotating inputs that together overflow L2, timed
  from the first enqueue to the last kernel's end and divided by the calls. What a Python loop pays:
  max(host, GPU) per call. do_bench is not used here: its L2 flush (~80 us of GPU work per call on
  the H100) hides that much host time per call (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

import kernels
from kernels import Config, KernelSpec, Problem

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

    graph = capture(call)
    return float(triton.testing.do_bench(graph.replay, warmup=budget[0], rep=budget[1], return_mode="median"))


def capture(call: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    """``call`` captured in a CUDA graph, after a warm-up in each mode on a side stream (so that
    compiling, resolving a config and allocating workspaces all happen before the capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for mode in kernels.MODES:
            with kernels.dispatch_mode(mode):
                call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
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
    started = time.perf_counter()
    for x in inputs:
        call(x)
    torch.cuda.synchronize()
    one_ms = max((time.perf_counter() - started) * 1e3 / len(inputs), 1e-4)
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


def rotation_size(problem: Problem, element_size: int, l2_bytes: int) -> int:
    """How many input sets ``eager_ms`` cycles through for ``problem``."""
    per_set = max(problem.bytes_moved(element_size), 1)
    wanted = math.ceil(L2_MULTIPLE * l2_bytes / per_set)
    return int(max(2, min(MAX_ROTATION, wanted, max(2, MAX_ROTATION_BYTES // per_set))))


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 50 << 20) or (50 << 20))


@contextlib.contextmanager
def public_call(spec: KernelSpec, config: Config, inputs: tuple) -> Iterator[Callable[[tuple], Any]]:
    """The call a user makes for this kernel, with ``config`` forced: ``kernels.matmul(a, b)`` through
    its call plan (kernels/_plans.py), so its host time is the user's; other kernels' ``*_with``
    (and a test's stand-in spec, its own ``run``)."""
    if spec.name == "matmul" and kernels.KERNELS.get(spec.name) is spec:
        from kernels import _plans

        with _plans.pinned(config, *inputs[:2]):
            yield lambda x: kernels.matmul(*x)
    else:
        yield lambda x: spec.execute(config, x)
