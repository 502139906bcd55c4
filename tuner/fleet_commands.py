"""The fleet's subcommands (worker, status) and the parts of ``search`` that go through the job queue:
problems from a file or from record mode, enqueueing, and working the queue off here or on every GPU.
"""

from __future__ import annotations

import argparse
import math
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import kernels
from db import Store
from db.store import default_url
from db._plausible import MAX_DIM, MAX_GEMMS
from db.queue import Job, JobQueue, JobSpec
from db.recorded import recorded

from .errors import DEVICE_FAULT_EXIT, UserError
from .fleet import WorkerHooks, claim_priorities, job_specs, run_worker
from .gpu_workers import (gpu_list, lease_seconds, say_go, spawn_gpu_workers, start_phases_line, started_s_ago,
                          worker_flags)
from .search import Budget

# How often `search --gpus` prints the queue's state while its workers run.
STATUS_EVERY_S = 10.0


def check_size(problem: kernels.Problem, *, limits: bool = True) -> None:
    """ValueError where ``problem`` has no work (a zero M, N or K in every GEMM) or, with ``limits``, is
    beyond what a record may hold: the checks every way of naming problems to tune shares."""
    if problem.flops == 0:
        raise ValueError(f"{problem.key!r} has no work (every GEMM has a zero M, N or K): nothing "
                         "to tune or dispatch; give sizes >= 1, e.g. 16x4096x4096")
    if limits and (max(max(shape) for shape in problem.shapes) > MAX_DIM or len(problem.shapes) > MAX_GEMMS):
        raise ValueError(f"{problem.key[:60]!r} is beyond the sizes a record may hold (each of M, N, K up to "
                         f"{MAX_DIM}, up to {MAX_GEMMS} GEMMs)")


MAX_WEIGHT = 1e12  # a problem's share of the work; far above any real ratio, far below float overflow


def problems_from_file(path: str) -> tuple[list[kernels.Problem], list[float]]:
    """Problems and their weights from ``path``: one ``kernel dtype:layout:shape [weight]`` per line.

    ``#`` starts a comment; blank lines are skipped. The weight (default 1) is how much the problem
    matters (e.g. its share of the model's GEMM time); higher weights are tuned first, ties largest problem first.
    Every bad line is reported at once."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserError(f"--problems {path}: {exc}") from None
    problems, weights, errors = [], [], []
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        try:
            if len(fields) not in (2, 3):
                raise ValueError("expected 'kernel dtype:layout:shape [weight]'")
            spec = kernels.get_kernel(fields[0])
            problem = kernels.Problem.from_key(spec.name, fields[1])
            spec.check_problem(problem)
            if problem.dtype not in spec.dtypes:
                raise ValueError(f"{spec.name} does not take dtype {problem.dtype}")
            check_size(problem)
            weight = float(fields[2]) if len(fields) == 3 else 1.0
            # Bounded: priorities multiply weights by the problem count, and 1e308 would overflow to inf.
            if not (math.isfinite(weight) and 0 <= weight <= MAX_WEIGHT):
                raise ValueError(f"weight {fields[2]} must be a number from 0 to {MAX_WEIGHT:g} (default 1)")
        except ValueError as exc:
            errors.append(f"line {number} ({line.strip()!r}): {exc}")
            continue
        problems.append(problem)
        weights.append(weight)
    if errors:
        raise UserError(f"--problems {path} has {len(errors)} bad line(s): " + "; ".join(errors[:20]))
    if not problems:
        raise UserError(f"--problems {path} lists no problem; give one 'kernel dtype:layout:shape [weight]' "
                        "per line, e.g. 'matmul bf16:nt:16x4096x4096'")
    return problems, claim_priorities(problems, weights)  # weight first; among equal weights, see there


def recorded_problems(store: Store, device: kernels.DeviceInfo) -> tuple[list[kernels.Problem], list[float]]:
    """What record mode saw on this device kind and nobody tuned yet, the most work first."""
    found = [p for p in recorded(store, device.name, untuned=True) if p.key.kernel in kernels.KERNELS]  # not user kernels
    problems = [kernels.Problem.from_key(p.key.kernel, p.key.problem_key) for p in found]
    return problems, claim_priorities(problems, [p.work for p in found])


def search_through_queue(args: argparse.Namespace, store: Store, device: kernels.DeviceInfo,
                         problems: list[kernels.Problem], priorities: list[float] | None, budget: Budget,
                         hooks: WorkerHooks, workers: GpuWorkers | None = None) -> list[Job]:
    """Enqueue ``problems`` and work them off: here, or by ``workers``, one per GPU (``--gpus``; started
    with ``start_gpu_workers`` before the database opened, and stopped by the caller). Returns the enqueued
    jobs as they stand at the end."""
    queue = JobQueue(store)
    options = {"sampler": args.sampler, "seed": args.seed, "ahead": args.ahead, "use_shipped": not args.no_shipped,
               "eager_passes": args.eager_passes}
    specs = job_specs(problems, device, budget, options, priorities)
    ids = set(queue.enqueue(specs))
    _say_which_kept_their_budget(queue, specs)
    lease_s = lease_seconds(args)
    if workers is not None:
        workers.watch(queue, ids)
    else:
        run_worker(store, device, lease_s=lease_s, hooks=hooks)
    return [job for job in queue.jobs() if job.id in ids]


def _say_which_kept_their_budget(queue: JobQueue, specs: list[JobSpec]) -> None:
    """Name the jobs another worker is tuning under a live lease: enqueue leaves them their old budget."""
    asked = {(s.device_name, s.kernel, s.problem_key): s for s in specs}
    kept = [job for job in queue.jobs("running")
            if (wanted := asked.get((job.spec.device_name, job.spec.kernel, job.spec.problem_key))) is not None
            and (job.spec.budget_trials, job.spec.budget_seconds, job.spec.options)
            != (wanted.budget_trials, wanted.budget_seconds, wanted.options)]
    for job in kept:
        print(f"{job.spec.kernel} {job.spec.problem_key} is being tuned by {job.worker} (job #{job.id}) and keeps "
              f"its budget ({job.spec.budget_trials} trials, {job.spec.budget_seconds or 'no'} s limit) and options; "
              "run the search again when it is done to tune it further", flush=True)


# A GPU whose worker a candidate's fault ended gets a fresh worker at most this many times in one run.
RESTARTS_PER_GPU = 8
# How long a worker told to stop (SIGINT: it gives back any job it holds) gets before it is killed.
STOP_GRACE_S = 60.0


class GpuWorkers:
    """The worker processes of one ``search --gpus`` run, one per GPU.

    They start first, before the run opens its database and enqueues, so that their start-up (Python,
    torch, the CUDA context, the compile workers' imports: most of ten seconds) overlaps the run's own. They
    run with ``--wait``, so none quits while the queue is still empty, and the run stops them once its jobs
    are finished. A worker that a candidate's GPU fault ended (``DEVICE_FAULT_EXIT``) is replaced while the
    run's jobs need it."""

    def __init__(self, url: str, gpus: list[str], device_arg: str, extra: list[str],
                 started: list[subprocess.Popen] | None = None) -> None:
        self.url, self.gpus, self.device_arg = url, gpus, device_arg
        self.extra = [*extra, "--wait"]
        if started:  # started gated by the CLI before its imports (tuner/gpu_workers.py): now they may go on
            say_go(started)
        self.processes = dict(zip(gpus, started or spawn_gpu_workers(url, gpus, device_arg, self.extra)))
        self.restarts = dict.fromkeys(gpus, 0)
        self.codes: dict[str, int] = {}
        print(f"started {len(gpus)} worker(s) on GPU(s) {','.join(gpus)}", flush=True)

    def watch(self, queue: JobQueue, ids: set[int]) -> None:
        """Until the run's jobs are finished, or no worker is left to finish them."""
        printed = time.monotonic()
        while _unfinished(queue, ids) and self._alive(queue, ids):
            time.sleep(0.5)
            if time.monotonic() - printed >= STATUS_EVERY_S:
                printed = time.monotonic()
                print("  " + _counts_line(queue, ids), flush=True)

    def _alive(self, queue: JobQueue, ids: set[int]) -> bool:
        for gpu, process in list(self.processes.items()):
            if process.poll() is None:
                continue
            del self.processes[gpu]
            self.codes[gpu] = process.returncode
            # The GPU is sound for a new process once the faulted one is gone.
            if process.returncode == DEVICE_FAULT_EXIT and self.restarts[gpu] < RESTARTS_PER_GPU \
                    and _unfinished(queue, ids):
                self.restarts[gpu] += 1
                print(f"the worker on GPU {gpu} stopped after a GPU fault; starting a fresh one "
                      f"({self.restarts[gpu]} of at most {RESTARTS_PER_GPU})", flush=True)
                self.processes[gpu] = spawn_gpu_workers(self.url, [gpu], self.device_arg, self.extra)[0]
        return bool(self.processes)

    def stop(self) -> None:
        """SIGINT each live worker (it gives back a job it holds, which is not this run's), then wait."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        failed = {gpu: code for gpu, code in self.codes.items() if code not in (0, DEVICE_FAULT_EXIT)}
        if failed:
            print("worker exit codes: " + ", ".join(f"GPU {gpu}: {code}" for gpu, code in sorted(failed.items())),
                  flush=True)


def start_gpu_workers(args: argparse.Namespace) -> GpuWorkers | None:
    """``search --gpus``'s workers (None without --gpus): the ones the CLI started gated (``args.started_workers``),
    let go on, or started now."""
    gpus = gpu_list(args)
    if not gpus:
        return None
    return GpuWorkers(args.db or default_url(), gpus, args.device, worker_flags(args),
                      getattr(args, "started_workers", None))


def _unfinished(queue: JobQueue, ids: set[int]) -> bool:
    return any(job.id in ids and job.state in ("queued", "running") for job in queue.jobs())


def _counts_line(queue: JobQueue, ids: set[int]) -> str:
    states: dict[str, int] = {}
    for job in queue.jobs():
        if job.id in ids:
            states[job.state] = states.get(job.state, 0) + 1
    return "  ".join(f"{state} {count}" for state, count in sorted(states.items()))


def cmd_worker(args: argparse.Namespace, device: kernels.DeviceInfo, store: Store, hooks: WorkerHooks) -> int:
    # How long start-up took (imports, CUDA, the database): a fleet run's time before its first claim.
    ready = started_s_ago()
    phases = start_phases_line()
    print(f"worker on {device.name} ({device.alias}) taking jobs from {store.url}"
          + (f", ready {ready:.1f} s after its start" if ready is not None else "")
          + (f" ({phases})" if ready is not None and phases else ""), flush=True)
    summary = run_worker(store, device, wait=args.wait, lease_s=lease_seconds(args),
                         max_jobs=args.max_jobs, hooks=hooks)
    print(f"worker {summary.name}: {summary.done} done, {summary.failed} failed, {summary.lost} lost", flush=True)
    return 0


def cmd_status(args: argparse.Namespace, store: Store) -> int:
    queue = JobQueue(store)
    now = datetime.now(timezone.utc)
    counts = queue.counts()
    total = sum(counts.values())
    print(f"{store.url}: {total} job(s): " + ", ".join(f"{counts[s]} {s}" for s in counts))
    if total and sys.stdout.isatty():
        finished = counts["done"] + counts["failed"]
        width = 40
        filled = int(width * finished / total)
        print(f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{total}")
    for job in queue.jobs():
        if job.state in ("queued", "running") or args.all:
            since = f"since {_ago(now, job.started_at)}" if job.started_at else ""
            lease = f"lease {_ago(now, job.lease_until)}" if job.state == "running" and job.lease_until else ""
            error = f"error: {job.error[:120]}" if job.error else ""
            print("  " + "  ".join(part for part in (f"#{job.id}", job.state, job.spec.device_name, job.spec.kernel,
                                                      job.spec.problem_key, job.worker or "", since, lease, error)
                                   if part))
    workers = queue.workers()
    if workers:
        print(f"{len(workers)} worker(s):")
    for worker in workers:
        job = f"job #{worker.job_id}" if worker.job_id else ""
        print(f"  {worker.name}  {worker.device_name}  {worker.state}  {worker.jobs_done} done  "
              f"heartbeat {_ago(now, worker.heartbeat_at)}  {job}".rstrip())
    return 0


def _ago(now: datetime, when: datetime) -> str:
    seconds = (now - when).total_seconds()
    return f"{seconds:.0f}s ago" if seconds >= 0 else f"in {-seconds:.0f}s"
