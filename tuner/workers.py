"""Compile and check candidates in worker processes, in parallel; time them in one more process.

Compiling is CPU work (the GPU box has 16 cores) while timing needs the GPU to itself, so workers
compile each candidate by running it once on the real problem (filling Triton's on-disk cache) and
check it against the reference; the timing worker then loads the compiled kernel from the cache and
times it alone. A candidate that kills its process (illegal address, a compiler crash) or hangs
takes only a worker with it: the worker is replaced and the candidate reported as ``crashed`` or
``timeout``. The search's own process never runs a candidate on the GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout  # not the builtin before Python 3.11
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import DeviceFault, device_faulted

if TYPE_CHECKING:  # kernels imports torch and triton: this module is imported before them (tuner/cli.py)
    from kernels import Config, Problem

log = logging.getLogger(__name__)

# New configs compiling at once ahead of the timer. Replayed on the 16x4096x4096 sweep, seeded TPE
# with 4 in flight stayed within the quality targets (13.5 trials to 98%, 31.5 to 99.5%); with 8 or
# more it no longer reached 99.5% within 100 trials (docs/SEARCH.md).
DEFAULT_AHEAD = 4

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
    rel_error: float | None = None  # the check's worst element in units of its bound (kernels/_check.py)
    reason: str = ""
    seconds: float = 0.0


def _config(text: str) -> Config:
    from kernels import Config

    return Config.parse(text)


def _problem(kernel: str, key: str) -> Problem:
    from kernels import Problem

    return Problem.from_key(kernel, key)


def _verdict_of(spec: object, problem: Problem, config: Config, seed: int):
    """The check of one run on fresh inputs (kernels/_check.py); its tensors die with this frame."""
    import torch

    import kernels
    from kernels._check import check_config

    on_gpu = torch.cuda.is_available() and not kernels.interpreter_enabled()
    return check_config(spec, problem, config, torch.device("cuda" if on_gpu else "cpu"), seed)


def _check_in_worker(kernel: str, problem_key: str, config_text: str, seed: int) -> Precheck:
    """Runs in a worker: compile (by running) and check one config on fresh inputs."""
    import torch

    import kernels
    from tuner.bench import _classify, _first_line, wrong_result_reason

    start = time.perf_counter()
    problem = _problem(kernel, problem_key)
    try:
        with compiling_alone(kernel, problem, config_text):
            verdict = _verdict_of(kernels.get_kernel(kernel), problem, _config(config_text), seed)
    except Exception as exc:  # report, don't die: the parent decides what a failure means
        exit_if_device_faulted(f"checking {config_text}", exc)
        return Precheck(_classify(exc), reason=f"{type(exc).__name__}: {_first_line(exc)}",
                        seconds=time.perf_counter() - start)
    finally:
        # Each worker would otherwise keep its peak allocation cached; fourteen of them fill the GPU.
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if not verdict.ok:
        return Precheck("wrong_result", verdict.error, wrong_result_reason(verdict), time.perf_counter() - start)
    return Precheck("ok", verdict.error, seconds=time.perf_counter() - start)


# Two fleet workers on one host (one per GPU, each with its own pool) often check the same config for problems that
# compile to one binary: Triton specializes on the config, dtypes, unit strides and which sizes divide by 16, not
# on the sizes themselves. Both then compiled it at once: on 2 H200s (2026-11-28, torch 2.11.0+cu130, triton 3.6.0,
# ``scripts/fleet_bench.py --phase scale --pg --trials 4``, docs/FLEET.md) the compile waits summed to 45-48 s
# against 26-29 s for one worker. A worker now holds a file lock per binary while it compiles and checks; the other
# waits, then finds the binary in Triton's on-disk cache, which the workers share. A lock is released by the OS
# when its holder dies; a wait past COMPILE_LOCK_WAIT_S goes on unlocked (a hung holder must not hang the others).
COMPILE_LOCK_WAIT_S = 60.0


def _binary_key(kernel: str, problem: Problem, config_text: str) -> str:
    """What one compiled binary of ``kernel`` is specialized on, as a file name."""
    dims = tuple((d % 16 == 0, d == 1) for shape in problem.shapes for d in shape)
    text = repr((kernel, config_text, problem.dtype, problem.layout, dims))
    return hashlib.sha1(text.encode()).hexdigest()


def _lock_dir() -> str | None:
    """Where the compile locks live: beside Triton's on-disk cache (one per host and cache), or None."""
    try:
        import triton.knobs

        cache = triton.knobs.cache.dir
    except (ImportError, AttributeError):
        return None
    if not cache:
        return None
    path = os.path.join(cache, "triton-tuner-compile-locks")
    os.makedirs(path, exist_ok=True)
    return path


@contextlib.contextmanager
def compiling_alone(kernel: str, problem: Problem, config_text: str,
                    wait_s: float = COMPILE_LOCK_WAIT_S) -> Iterator[float]:
    """Hold this host's lock on the binary ``config_text`` compiles to for ``problem``; yields the seconds
    waited for another worker's hold. No lock where the platform has no ``fcntl`` or no cache directory."""
    try:
        import fcntl
    except ImportError:  # not POSIX: compile as before
        yield 0.0
        return
    directory = _lock_dir()
    if directory is None:
        yield 0.0
        return
    start = time.monotonic()
    with open(os.path.join(directory, _binary_key(kernel, problem, config_text)), "a") as handle:
        locked = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
                break
            except BlockingIOError:
                if time.monotonic() - start > wait_s:
                    log.warning("compiling %s without the lock: another worker held it for %.0f s", config_text, wait_s)
                    break
                time.sleep(0.05)
        try:
            yield time.monotonic() - start
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)


# A worker's exit status where a candidate left its GPU context faulted (os._exit: no cleanup can run there).
CANDIDATE_FAULT_EXIT = 70


def exit_if_device_faulted(doing: str, error: object) -> None:
    """End this worker where the candidate just run left its GPU context faulted: the parent then reports the
    candidate ``crashed`` and starts a sound worker, instead of the later candidates failing here one by one."""
    if device_faulted():
        print(f"worker {os.getpid()}: {doing} left the GPU faulted ({error}); this worker exits", file=sys.stderr,
              flush=True)
        os._exit(CANDIDATE_FAULT_EXIT)


def default_workers() -> int:
    return max(1, min(14, (os.cpu_count() or 2) - 2))


def search_workers(ahead: int) -> int:
    """Compile processes a search needs: it keeps at most ``ahead`` candidates compiling (tuner/search.py), so
    more would sit idle, each one more Python with torch and a CUDA context to start. On a 4-GPU H200 host, four
    fleet workers of 15 processes each started at once, and their first jobs waited 16-21 s for compiles against
    8 s on one GPU (docs/FLEET.md, 2026-11-28, torch 2.11.0+cu130, triton 3.6.0, ``gpu_session.sh fleet-scale``). Batch checks (``tuner verify``) keep ``default_workers``."""
    return max(1, min(default_workers(), ahead))


def take_pool(started: CheckPool | None, wanted: bool, size: int) -> CheckPool | None:
    """The compile and timing processes a command checks candidates in: ``started`` (the CLI's, begun before
    its imports: ``tuner/cli.py``), else a new pool of ``size`` started now; None, and ``started`` closed, where
    the candidates run in the command's own process (a CPU device, ``--workers 0``)."""
    if not wanted:
        if started is not None:
            started.close()
        return None
    if started is None:
        started = CheckPool(size)
        started.start()
    return started


def import_user_modules() -> None:
    """Import the modules named by ``TUNER_IMPORT`` (comma-separated): modules that register kernels of
    their own in ``kernels.KERNELS``, so that ``--problems`` files and the fleet's jobs can name them. Every
    tuner process runs this: the CLI, the workers ``search --gpus`` starts (they inherit the variable), and
    the compile and timing workers that check and time candidates."""
    import importlib

    from .errors import UserError

    for name in filter(None, (part.strip() for part in os.environ.get("TUNER_IMPORT", "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise UserError(f"TUNER_IMPORT names {name!r}, which cannot be imported ({exc}); put the folder that "
                            "holds it on PYTHONPATH, or take it out of TUNER_IMPORT") from None


def _warm_worker() -> None:
    """Runs once in each new worker: the imports every candidate needs, paid while the parent sets up."""
    import torch
    import triton  # noqa: F401

    import kernels
    from tuner import bench  # noqa: F401

    import_user_modules()

    if torch.cuda.is_available() and not kernels.interpreter_enabled():
        torch.cuda.init()  # the CUDA context costs most of a second; not on a candidate's clock


def _warm_timing_worker() -> None:
    """``_warm_worker``, and the C++ path of cuBLAS calls set building: the bench waits for it before it times
    cuBLAS as the user's call runs it (tuner/bench.py). On a machine that never built it, that wait falls in
    the first job: its timing took 24.5-26 s on fresh H200 machines against 0.5-1.4 s later (docs/FLEET.md,
    2026-11-28, torch 2.11.0+cu130, triton 3.6.0, ``scripts/fleet_bench.py --phase scale``). Begun here, the
    build runs while the compile workers start and compile the first candidates."""
    _warm_worker()
    import torch

    import kernels

    if torch.cuda.is_available() and not kernels.interpreter_enabled():
        kernels._native.start()  # in a daemon thread; loads the cached build where one exists


def _ready() -> bool:
    return True


def _end_pool(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's processes, then shut it down. Nothing in them needs an orderly exit (Triton writes its
    on-disk cache by rename, a compile lock is released by the OS), while that exit is slow: each one is a
    Python with torch and a CUDA context, and a hung compile would never return at all. (A fleet run's exit did
    not get shorter for it on H200s: that was the interpreter's teardown, tuner/__main__.py.)"""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
    pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class _Pending:
    config: Config
    problem: Problem
    seed: int
    deadline: float


class CheckPool:
    """Worker processes that precheck candidates; rebuilt when a candidate kills or hangs a worker.

    Two ways to use it: ``check(problem, configs)`` for a batch, or ``submit`` and ``next_result``
    for a pipeline that keeps a few candidates compiling while the timing worker times the ones done (what
    the search does). At most ``workers`` candidates are in flight, so each starts at once and its
    deadline is its own.
    """

    def __init__(self, workers: int | None = None, timeout_s: float = CANDIDATE_TIMEOUT_S) -> None:
        self.workers = workers or default_workers()
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None
        self._warming: list[Future] = []  # one per worker of a new pool, done once it has imported
        self._pending: dict[Future, _Pending] = {}
        self._suspects: list[_Pending] = []
        self._done: list[tuple[Problem, Config, Precheck]] = []
        self.timing = TimingWorker(timeout_s)  # where the search times what these workers checked

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_warm_worker)
            # Each submit finding no idle worker spawns one: all of them start importing now.
            self._warming = [self._pool.submit(_ready) for _ in range(self.workers)]
        return self._pool

    def start(self) -> None:
        """Spawn every worker now (and the timing worker), so their imports overlap the parent's set-up."""
        self._executor()
        self.timing.start()

    def _rebuild(self) -> None:
        if self._pool is not None:
            _end_pool(self._pool)
        self._pool = None

    @property
    def in_flight(self) -> int:
        """Candidates submitted whose verdict ``next_result`` has not returned yet."""
        return len(self._pending) + len(self._suspects) + len(self._done)

    def submit(self, problem: Problem, config: Config, seed: int = 0) -> None:
        if len(self._pending) >= self.workers:
            raise RuntimeError(f"{self.workers} candidates are in flight already; take a result first")
        if not self._suspects:
            try:
                self._start(problem, config, seed)
                return
            except BrokenProcessPool:  # a candidate in flight killed its worker since the last verdict
                self._give_up_on_pool()
        # A crash is being traced to its culprit, one candidate alone at a time: this one waits in line.
        self._suspects.append(_Pending(config, problem, seed, 0.0))

    def _start(self, problem: Problem, config: Config, seed: int) -> Future:
        pool = self._executor()
        warming = any(not f.done() for f in self._warming)
        deadline = time.monotonic() + self.timeout_s + (WORKER_START_S if warming else 0.0)
        future = pool.submit(_check_in_worker, problem.kernel, problem.key, str(config), seed)
        self._pending[future] = _Pending(config, problem, seed, deadline)
        return future

    def next_result(self) -> tuple[Config, Precheck]:
        """The next candidate to finish, with its verdict; blocks until there is one.

        When a worker dies or a candidate hangs, every candidate then in flight is re-run alone, so
        the verdict ``crashed`` or ``timeout`` lands on the culprit only.
        """
        _, config, result = self._next_done()
        return config, result

    def _next_done(self) -> tuple[Problem, Config, Precheck]:
        while not self._done:
            if not self._pending and not self._suspects:
                raise RuntimeError("no candidate in flight; submit one first")
            if self._suspects:
                self._run_alone(self._suspects.pop(0))
                continue
            wait_s = max(0.0, min(p.deadline for p in self._pending.values()) - time.monotonic())
            finished, _ = wait(list(self._pending), timeout=wait_s, return_when=FIRST_COMPLETED)
            for future in finished:
                try:
                    result = future.result()
                except BrokenProcessPool:
                    self._give_up_on_pool()
                    break
                except Exception as exc:  # the call itself failed (pickling, say), not the candidate
                    result = Precheck("error", reason=f"{type(exc).__name__}: {exc}"[:300])
                pending = self._pending.pop(future)
                self._done.append((pending.problem, pending.config, result))
            else:
                if not finished:  # a deadline passed: hung, or a bystander of a hung one
                    self._give_up_on_pool()
        return self._done.pop(0)

    def _give_up_on_pool(self) -> None:
        self._suspects.extend(self._pending.values())
        self._pending.clear()
        self._rebuild()

    def _run_alone(self, suspect: _Pending) -> None:
        future = self._start(suspect.problem, suspect.config, suspect.seed)
        pending = self._pending[future]
        try:
            result = future.result(timeout=max(0.0, pending.deadline - time.monotonic()))
        except BrokenProcessPool:
            result = Precheck("crashed", reason="the worker process died running this config")
            self._rebuild()
        except FutureTimeout:
            result = Precheck("timeout", reason=f"no result within {self.timeout_s:.0f} s")
            self._rebuild()
        except Exception as exc:  # the call itself failed, as in next_result: this candidate's verdict
            result = Precheck("error", reason=f"{type(exc).__name__}: {exc}"[:300])
        self._pending.clear()
        self._done.append((suspect.problem, suspect.config, result))

    def check(self, problem: Problem, configs: list[Config], seed: int = 0) -> dict[Config, Precheck]:
        """Precheck every config, ``workers`` at a time; crashes and hangs stay with their culprits."""
        queue = list(enumerate(configs))
        results: dict[Config, Precheck] = {}
        while queue or self.in_flight:
            while queue and len(self._pending) < self.workers and not self._suspects:
                index, config = queue.pop(0)
                self.submit(problem, config, seed + index)
            config, result = self.next_result()
            results[config] = result
        return results

    def check_each(self, cases: list[tuple[Problem, Config]], seed: int = 0) -> list[Precheck]:
        """Precheck every (problem, config), ``workers`` at a time across problems; verdicts in their order."""
        queue = list(enumerate(cases))
        index_of: dict[tuple[str, str, Config], list[int]] = {}
        results: list[Precheck | None] = [None] * len(cases)
        while queue or self.in_flight:
            while queue and len(self._pending) < self.workers and not self._suspects:
                index, (problem, config) = queue.pop(0)
                index_of.setdefault((problem.kernel, problem.key, config), []).append(index)
                self.submit(problem, config, seed + index)
            problem, config, result = self._next_done()
            results[index_of[(problem.kernel, problem.key, config)].pop(0)] = result
        return results

    def close(self) -> None:
        if self._pool is not None:
            _end_pool(self._pool)
            self._pool = None
        self.timing.close()
        self._pending.clear()
        self._suspects.clear()
        self._done.clear()

    def __enter__(self) -> CheckPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------------ timing

class WorkerLost(RuntimeError):
    """The timing worker died or hung on a call that was not a candidate's (the baseline, say)."""


_BENCHES: dict = {}  # in the timing worker: one Bench per problem, so its input seeds keep counting


def _bench_of(kernel: str, problem_key: str, seed: int):
    from kernels import get_kernel
    from tuner.bench import Bench

    key = (kernel, problem_key, seed)
    if key not in _BENCHES:
        problem = _problem(kernel, problem_key)
        device = _worker_device()
        _BENCHES.clear()  # one problem at a time: the previous one's bench (and inputs) can go
        _BENCHES[key] = Bench(get_kernel(kernel), problem, device, seed=seed)
    return _BENCHES[key]


def _worker_device():
    import torch

    import kernels

    if torch.cuda.is_available() and not kernels.interpreter_enabled():
        return kernels.current_device()
    return kernels.CPU


def _measure_in_worker(kernel: str, problem_key: str, seed: int, config_text: str, incumbent_ms: float | None,
                       checked_error: float | None = None):
    try:
        return _bench_of(kernel, problem_key, seed).measure(_config(config_text), incumbent_ms=incumbent_ms,
                                                            checked_error=checked_error)
    except DeviceFault as fault:
        exit_if_device_faulted(f"timing {config_text}", fault)
        raise


def _baseline_in_worker(kernel: str, problem_key: str, seed: int, mode: str = "graph") -> float:
    return _bench_of(kernel, problem_key, seed).baseline_ms(mode)


def _time_in_worker(kernel: str, problem_key: str, seed: int, config_text: str, mode: str) -> float:
    return _bench_of(kernel, problem_key, seed).time(_config(config_text), mode)


def _contest_in_worker(kernel: str, problem_key: str, seed: int, config_texts: list[str], mode: str = "graph",
                       graph_text: str | None = None) -> tuple[list[float], float]:
    graph = _config(graph_text) if graph_text else None
    return _bench_of(kernel, problem_key, seed).contest([_config(text) for text in config_texts], mode=mode,
                                                        graph=graph)


def _back_to_back_in_worker(kernel: str, problem_key: str, seed: int, config_text: str) -> tuple[float, float]:
    return _bench_of(kernel, problem_key, seed).back_to_back(_config(config_text))


def _release_in_worker(kernel: str, problem_key: str, seed: int) -> None:
    """The problem is done: its bench and rotating inputs go, and the GPU memory they held is handed back."""
    import torch

    if _BENCHES.pop((kernel, problem_key, seed), None) is not None:
        torch.cuda.empty_cache()  # a no-op where CUDA was never initialised (the interpreter)


class TimingWorker:
    """One process that checks and times candidates, one at a time, so the GPU serves one timing.

    A candidate that passed its check in a compile worker can still fault while being timed (an
    illegal address at another grid size, a hang). Timed in the search's own process, that would end
    the search; here it ends this worker, which is restarted for the next candidate, and the trial
    records ``crashed`` or ``timeout``.
    """

    def __init__(self, timeout_s: float = CANDIDATE_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None
        self._warming: Future | None = None

    def start(self) -> None:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_warm_timing_worker)
            self._warming = self._pool.submit(_ready)

    def call(self, fn, *args):
        """``fn(*args)`` in the worker; WorkerLost (after a restart) if it dies or outlives the timeout."""
        self.start()
        try:
            future = self._pool.submit(fn, *args)
        except BrokenProcessPool:  # the process died between calls, with no call of ours in it: a new one takes this
            self._restart()
            self.start()
            future = self._pool.submit(fn, *args)
        warming = self._warming is not None and not self._warming.done()
        try:
            return future.result(timeout=self.timeout_s + (WORKER_START_S if warming else 0.0))
        except BrokenProcessPool:
            self._restart()
            raise WorkerLost("the timing worker process died") from None
        except FutureTimeout:
            self._restart()
            raise WorkerLost(f"no result within {self.timeout_s:.0f} s") from None

    def close(self) -> None:
        """End the process; the next call starts a fresh one (also how a dead or hung one is replaced)."""
        if self._pool is not None:
            _end_pool(self._pool)
            self._pool = None

    _restart = close


class IsolatedBench:
    """``tuner.bench.Bench``'s interface, run in a TimingWorker: a candidate that kills the process
    while checked or timed becomes a ``crashed`` (or ``timeout``) measurement, not the search's end."""

    def __init__(self, worker: TimingWorker, kernel: str, problem: Problem, device: object, seed: int = 0) -> None:
        self.worker, self.kernel, self.problem, self.device, self.seed = worker, kernel, problem, device, seed

    def _call(self, fn, *args):
        return self.worker.call(fn, self.kernel, self.problem.key, self.seed, *args)

    def measure(self, config: Config, incumbent_ms: float | None = None, checked_error: float | None = None):
        from tuner.bench import Measurement

        try:
            return self._call(_measure_in_worker, str(config), incumbent_ms, checked_error)
        except WorkerLost as exc:
            status = "timeout" if "no result" in str(exc) else "crashed"
            return Measurement(status, reason=f"while checked and timed: {exc}")

    def baseline_ms(self, mode: str = "graph") -> float:
        return self._call(_baseline_in_worker, mode)

    def time(self, config: Config, mode: str) -> float:
        return self._call(_time_in_worker, str(config), mode)

    def contest(self, configs: list[Config], mode: str = "graph", graph: Config | None = None
                ) -> tuple[list[float], float]:
        return self._call(_contest_in_worker, [str(config) for config in configs], mode,
                          str(graph) if graph is not None else None)

    def back_to_back(self, config: Config) -> tuple[float, float]:
        return self._call(_back_to_back_in_worker, str(config))

    def release(self) -> None:
        """Free the problem's rotating inputs in the worker (``Bench.release``), once the problem is done."""
        try:
            self._call(_release_in_worker)
        except WorkerLost:  # a worker that died holds nothing; a new one starts on the next call
            pass
