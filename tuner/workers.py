"""Compile and check candidates in worker processes, in parallel, before the parent times them.

Compiling is CPU work (the GPU box has 16 cores) while timing needs the GPU to itself, so workers
compile each candidate by running it once on the real problem (filling Triton's on-disk cache) and
check it against the reference; the parent then loads the compiled kernel from the cache and times
it alone. A candidate that kills its process (illegal address, a compiler crash) or hangs takes only
a worker with it: the pool is rebuilt and the candidate is reported as ``crashed`` or ``timeout``.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout  # not the builtin before Python 3.11
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from kernels import Config, Problem

log = logging.getLogger(__name__)

# A compile plus one check of the largest public-suite shape takes under 20 s on the H100 box
# (triton 3.6); a candidate still running after this is treated as hung.
CANDIDATE_TIMEOUT_S = 120.0

# A freshly spawned worker imports torch and triton before its first candidate (3-5 s here); that is
# not the candidate's time, so a new pool's first deadline is this much later.
WORKER_START_S = 30.0


@dataclass(frozen=True)
class Precheck:
    """A worker's verdict on one candidate."""

    status: str  # "ok", "compile_error", "wrong_result", "error", "crashed", "timeout"
    rel_error: float | None = None
    reason: str = ""
    seconds: float = 0.0


def _error_of(spec: object, problem: Problem, config: Config, seed: int) -> float:
    """Relative error of one run on fresh inputs; its tensors die with this frame."""
    import torch

    import kernels
    from tuner.bench import relative_error

    on_gpu = torch.cuda.is_available() and not kernels.interpreter_enabled()
    inputs = spec.make_inputs(problem, torch.device("cuda" if on_gpu else "cpu"), seed)
    out = spec.execute(config, inputs)
    if on_gpu:
        torch.cuda.synchronize()
    return relative_error(out, spec.reference(inputs))


def _check_in_worker(kernel: str, problem_key: str, config_text: str, seed: int) -> Precheck:
    """Runs in a worker: compile (by running) and check one config on fresh inputs."""
    import torch

    import kernels
    from tuner.bench import TOLERANCE, _classify, _first_line

    start = time.perf_counter()
    problem = Problem.from_key(kernel, problem_key)
    try:
        error = _error_of(kernels.get_kernel(kernel), problem, Config.parse(config_text), seed)
    except Exception as exc:  # report, don't die: the parent decides what a failure means
        return Precheck(_classify(exc), reason=f"{type(exc).__name__}: {_first_line(exc)}",
                        seconds=time.perf_counter() - start)
    finally:
        # Each worker would otherwise keep its peak allocation cached; fourteen of them fill the GPU.
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    tolerance = TOLERANCE[problem.dtype]
    if not error <= tolerance:
        return Precheck("wrong_result", error, f"relative error {error:.3g} over the {tolerance:g} allowed",
                        time.perf_counter() - start)
    return Precheck("ok", error, seconds=time.perf_counter() - start)


def default_workers() -> int:
    return max(1, min(14, (os.cpu_count() or 2) - 2))


class CheckPool:
    """A pool of worker processes that precheck candidates; rebuilt when a candidate kills a worker."""

    def __init__(self, workers: int | None = None, timeout_s: float = CANDIDATE_TIMEOUT_S) -> None:
        self.workers = workers or default_workers()
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None
        self._starting = False

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
            self._starting = True
        return self._pool

    def _rebuild(self) -> None:
        if self._pool is not None:
            for process in list(getattr(self._pool, "_processes", {}).values()):
                process.kill()  # a hung compile never returns; shutdown alone would wait for it
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None

    def check(self, problem: Problem, configs: list[Config], seed: int = 0) -> dict[Config, Precheck]:
        """Precheck every config; crashes and hangs are confined to the candidates that caused them."""
        results: dict[Config, Precheck] = {}
        suspects = self._run_batch(problem, configs, seed, results)
        for config in suspects:  # one at a time, so a crash or hang names its culprit, not its bystanders
            self._run_batch(problem, [config], seed, results)
        return results

    def _run_batch(self, problem: Problem, configs: list[Config], seed: int,
                   results: dict[Config, Precheck]) -> list[Config]:
        """Fill ``results``; return the configs caught in a worker's death or a hang (unless alone)."""
        pool = self._executor()
        futures: dict[Config, Future] = {
            c: pool.submit(_check_in_worker, problem.kernel, problem.key, str(c), seed + i)
            for i, c in enumerate(configs)}
        deadline = time.monotonic() + self.timeout_s * math.ceil(len(configs) / self.workers)
        if self._starting:
            deadline += WORKER_START_S
            self._starting = False
        suspects: list[Config] = []
        broken = False
        for config, future in futures.items():
            try:
                results[config] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except BrokenProcessPool:
                broken = True
                if len(configs) == 1:
                    results[config] = Precheck("crashed", reason="the worker process died running this config")
                else:
                    suspects.append(config)
            except FutureTimeout:
                broken = True
                # Hung, or only queued behind a hung one: alone, it gets a fair chance of its own.
                if len(configs) == 1:
                    results[config] = Precheck("timeout", reason=f"no result within {self.timeout_s:.0f} s")
                else:
                    suspects.append(config)
        if broken:
            self._rebuild()
        return suspects

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> CheckPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
