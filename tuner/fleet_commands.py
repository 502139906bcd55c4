"""The fleet's subcommands (worker, status) and the parts of ``search`` that go through the job queue:
problems from a file or from record mode, enqueueing, and working the queue off here or on every GPU.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import kernels
from db import Store
from db._plausible import MAX_DIM, MAX_GEMMS
from db.queue import DEFAULT_LEASE_S, Job, JobQueue, JobSpec
from db.recorded import recorded

from .errors import DEVICE_FAULT_EXIT, UserError
from .fleet import WorkerHooks, job_specs, optuna_storage, parse_gpus, run_worker, spawn_gpu_workers
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


def lease_seconds(args: argparse.Namespace) -> float:
    """--lease, checked (finite, > 0), or the default when not given."""
    if args.lease is None:
        return DEFAULT_LEASE_S
    if not (math.isfinite(args.lease) and args.lease > 0):
        raise UserError(f"--lease {args.lease:g}: give the seconds a claimed job stays a worker's without a "
                        f"heartbeat, a finite number above 0 (default {DEFAULT_LEASE_S:.0f})")
    return args.lease


def gpu_list(args: argparse.Namespace) -> list[str] | None:
    """--gpus as GPU indices (None without it), checked against the GPUs this host has."""
    if not args.gpus:
        return None
    import torch

    try:
        on_cpu = str(getattr(args, "device", "")).strip().lower() == "cpu"  # indices label CPU workers
        return parse_gpus(args.gpus, None if on_cpu else torch.cuda.device_count())
    except ValueError as exc:
        raise UserError(str(exc)) from None


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
    # Weight first; among equal weights the largest problem, which takes longest to tune: started first, it
    # does not leave a fleet's last worker tuning it alone while the others idle. Then file order.
    count = len(problems)
    by_size = sorted(range(count), key=lambda i: (-problems[i].flops, i))
    rank = {index: position for position, index in enumerate(by_size)}
    return problems, [w * count + (count - rank[i]) / (count + 1) for i, w in enumerate(weights)]


def recorded_problems(store: Store, device: kernels.DeviceInfo) -> tuple[list[kernels.Problem], list[float]]:
    """What record mode saw on this device kind and nobody tuned yet, the most work first."""
    found = [p for p in recorded(store, device.name, untuned=True) if p.key.kernel in kernels.KERNELS]  # not user kernels
    problems = [kernels.Problem.from_key(p.key.kernel, p.key.problem_key) for p in found]
    return problems, [p.work for p in found]


def search_through_queue(args: argparse.Namespace, store: Store, device: kernels.DeviceInfo,
                         problems: list[kernels.Problem], priorities: list[float] | None, budget: Budget,
                         hooks: WorkerHooks) -> list[Job]:
    """Enqueue ``problems`` and work them off: here, or by one worker per GPU (``--gpus``). Returns
    the enqueued jobs as they stand at the end."""
    queue = JobQueue(store)
    options = {"sampler": args.sampler, "seed": args.seed, "ahead": args.ahead, "use_shipped": not args.no_shipped,
               "eager_passes": args.eager_passes}
    specs = job_specs(problems, device, budget, options, priorities)
    ids = set(queue.enqueue(specs))
    _say_which_kept_their_budget(queue, specs)
    lease_s = lease_seconds(args)
    if args.gpus:
        optuna_storage(store.url)  # Optuna's tables exist before the workers start (else they race to make them)
        _work_on_gpus(args, store, ids, lease_s)
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


def _work_on_gpus(args: argparse.Namespace, store: Store, ids: set[int], lease_s: float) -> None:
    gpus = gpu_list(args)
    extra = ["--lease", str(lease_s)] + (["--workers", str(args.workers)] if args.workers is not None else [])
    processes = dict(zip(gpus, spawn_gpu_workers(store.url, gpus, args.device, extra)))
    print(f"started {len(processes)} worker(s) on GPU(s) {','.join(gpus)}", flush=True)
    queue = JobQueue(store)
    printed = time.monotonic()
    restarts = dict.fromkeys(gpus, 0)
    codes: dict[str, int] = {}
    while processes:
        time.sleep(0.5)
        for gpu, process in list(processes.items()):
            if process.poll() is None:
                continue
            del processes[gpu]
            codes[gpu] = process.returncode
            # A worker whose GPU context a candidate broke exits DEVICE_FAULT_EXIT after handing its job on; the
            # GPU is sound for a new process, and the run's jobs may need it.
            if process.returncode == DEVICE_FAULT_EXIT and restarts[gpu] < RESTARTS_PER_GPU and _unfinished(queue, ids):
                restarts[gpu] += 1
                print(f"the worker on GPU {gpu} stopped after a GPU fault; starting a fresh one "
                      f"({restarts[gpu]} of at most {RESTARTS_PER_GPU})", flush=True)
                processes[gpu] = spawn_gpu_workers(store.url, [gpu], args.device, extra)[0]
        if time.monotonic() - printed >= STATUS_EVERY_S:
            printed = time.monotonic()
            print("  " + _counts_line(queue, ids), flush=True)
    if any(codes.values()):
        print(f"worker exit codes: {[codes[gpu] for gpu in gpus]}", flush=True)


def _unfinished(queue: JobQueue, ids: set[int]) -> bool:
    return any(job.id in ids and job.state in ("queued", "running") for job in queue.jobs())


def _counts_line(queue: JobQueue, ids: set[int]) -> str:
    states: dict[str, int] = {}
    for job in queue.jobs():
        if job.id in ids:
            states[job.state] = states.get(job.state, 0) + 1
    return "  ".join(f"{state} {count}" for state, count in sorted(states.items()))


def cmd_worker(args: argparse.Namespace, device: kernels.DeviceInfo, store: Store, hooks: WorkerHooks) -> int:
    print(f"worker on {device.name} ({device.alias}) taking jobs from {store.url}", flush=True)
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
