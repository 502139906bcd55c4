"""Tuning as a service: problems become jobs in the database, and workers (one per GPU, on any host
that reaches the database) claim and tune them.

A worker claims a job for its device kind under a lease and renews the lease from a heartbeat thread
while ``tune_problem`` runs; the job's Optuna study lives in the same database, so a job whose worker
died (lease run out) is resumed by the next worker where it stopped: finished trials stay and count
towards the budget, interrupted ones are asked again. ``spawn_gpu_workers`` starts one worker process
per GPU of this host, each pinned by ``CUDA_VISIBLE_DEVICES`` (tuner/gpu_workers.py).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import optuna

import kernels
from db import Record, Store, StoreError, StoreUnreachable
from db.queue import DEFAULT_LEASE_S, Job, JobQueue, JobSpec

from .autotune_search import Key, load_kernel, search_kernel
from .errors import DeviceFault, is_device_fault
from .search import Budget, NoWinner, optuna_storage, tune_problem

log = logging.getLogger(__name__)

# An idle worker with --wait looks for new jobs this often.
POLL_S = 1.0
# A job's options that reach tune_problem; a job queued by an older version lacks the later ones and
# gets tune_problem's defaults for them (eager_passes came on 2026-11-26).
TUNE_OPTIONS = ("sampler", "seed", "ahead", "use_shipped", "eager_passes")


def claim_priorities(problems: Sequence[kernels.Problem], weights: Sequence[float]) -> list[float]:
    """Each problem's job priority: its weight's place among the distinct weights as the integer part (the user's
    order, which claims keep) and, below it, its place by size, largest first: a fleet's claims reorder within a
    weight, the jobs of the kernels that run longest first (db/queue.py ``claim_order``), and otherwise take the
    largest problem first, since it takes longest to tune and, started last, would leave one worker tuning it alone
    while the others idle. Then the order given."""
    count = len(problems)
    tier = {weight: place for place, weight in enumerate(sorted(set(weights)))}
    by_size = sorted(range(count), key=lambda i: (-problems[i].flops, i))
    rank = {index: position for position, index in enumerate(by_size)}
    return [tier[weight] + (count - rank[i]) / (count + 1) for i, weight in enumerate(weights)]


def job_specs(problems: Sequence[kernels.Problem], device: kernels.DeviceInfo, budget: Budget,
              options: dict, priorities: Sequence[float] | None = None) -> list[JobSpec]:
    """One job per problem, for ``device``'s kind; higher ``priorities`` are claimed first (default: in
    the order given)."""
    if priorities is None:
        priorities = [float(len(problems) - index) for index in range(len(problems))]
    return [JobSpec(device.name, problem.kernel, problem.key, budget.trials, budget.seconds, dict(options),
                    float(priority)) for problem, priority in zip(problems, priorities)]


@dataclass
class WorkerHooks:
    """What a worker tells its caller (the CLI prints it); every hook is optional."""

    on_claim: Callable[[Job], None] | None = None
    on_done: Callable[[Job, Record], None] | None = None
    on_fail: Callable[[Job, str], None] | None = None
    tune_options: dict = field(default_factory=dict)  # passed to tune_problem: on_trial, on_finish, pool


@dataclass(frozen=True)
class WorkerSummary:
    name: str
    done: int
    failed: int
    lost: int  # jobs whose lease this worker lost while tuning them (another worker took them over)


def worker_name(device: kernels.DeviceInfo) -> str:
    """host:pid.token:gpu names one worker process everywhere in the fleet. The random token: containers
    that share a host name (--network host), each running its worker as PID 1 on its own GPU "0", would
    otherwise share one name, and the queue checks a job's owner by name alone."""
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0] or ("cpu" if device.is_cpu else "0")
    return f"{socket.gethostname()}:{os.getpid()}.{secrets.token_hex(3)}:{gpu}"


class _Lease(threading.Thread):
    """Renews a job's lease and the worker's heartbeat every ``lease_s / 4`` until stopped."""

    def __init__(self, queue: JobQueue, job: Job, name: str, device: kernels.DeviceInfo, lease_s: float,
                 done: int) -> None:
        super().__init__(daemon=True, name=f"lease-{job.id}")
        self.queue, self.job, self.worker, self.device = queue, job, name, device
        self.lease_s, self.done = lease_s, done
        self.lost = False
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.lease_s / 4):
            try:
                if not self.queue.renew(self.job.id, self.worker, self.lease_s):
                    self.lost = True
                    log.warning("worker %s lost its lease on job %d (%s): another worker has it now",
                                self.worker, self.job.id, self.job.spec.problem_key)
                    return
                self.queue.beat(self.worker, self.device.name, socket.gethostname(), os.getpid(), "busy",
                                self.job.id, self.done)
            except StoreError as exc:  # a database blip: the next beat may get through before the lease ends
                log.warning("worker %s could not renew its lease: %s", self.worker, exc)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def run_worker(store: Store, device: kernels.DeviceInfo, *, wait: bool = False, lease_s: float = DEFAULT_LEASE_S,
               poll_s: float = POLL_S, max_jobs: int | None = None, hooks: WorkerHooks | None = None,
               name: str | None = None) -> WorkerSummary:
    """Claim and tune jobs for ``device``'s kind until none is queued or running (forever with ``wait``)."""
    hooks = hooks or WorkerHooks()
    queue, name = JobQueue(store), name or worker_name(device)
    host, pid = socket.gethostname(), os.getpid()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna_storage(store.url)
    done = failed = lost = 0
    queue.beat(name, device.name, host, pid, "idle", None, 0)
    try:
        while max_jobs is None or done + failed + lost < max_jobs:
            job = queue.claim(name, device.name, lease_s)
            if job is None:
                # Without --wait, stop once no job of this kind is left, running ones included: a running
                # job returns to the queue if its worker dies, and then this worker should finish it.
                if not wait and queue.unfinished(device.name) == 0:
                    break
                queue.beat(name, device.name, host, pid, "idle", None, done)
                time.sleep(poll_s)
                continue
            if hooks.on_claim:
                hooks.on_claim(job)
            queue.beat(name, device.name, host, pid, "busy", job.id, done)
            lease = _Lease(queue, job, name, device, lease_s, done)
            lease.start()
            try:
                record, error = _attempt(job, device, store, storage, hooks)
            except DeviceFault as fault:
                # This process's CUDA context may be broken: hand the job on at once, with the reason, and stop.
                lease.stop()
                _hand_on_faulted(queue, job, name, str(fault))
                raise
            except (KeyboardInterrupt, SystemExit):
                # Interrupted (Ctrl-C): give the job back, so that a rerun resumes it at once rather than
                # after its lease runs out; stop renewing first, or a renewal would read as a lost lease.
                lease.stop()
                _give_back(queue, job, name)
                raise
            finally:
                lease.stop()
            if lease.lost or not queue.finish(job.id, name, error):
                lost += 1
            elif error:
                failed += 1
                if hooks.on_fail:
                    hooks.on_fail(job, error)
            else:
                done += 1
                if hooks.on_done and record is not None:
                    hooks.on_done(job, record)
    finally:
        queue.beat(name, device.name, host, pid, "stopped", None, done)
    kernels.clear_cache()  # this process may dispatch next: let it see the new winners
    return WorkerSummary(name, done, failed, lost)


def _attempt(job: Job, device: kernels.DeviceInfo, store: Store, storage: optuna.storages.BaseStorage,
             hooks: WorkerHooks) -> tuple[Record | None, str | None]:
    """``_tune`` one job so that no bad job stops the worker: one that raises is failed with its error (else
    every worker that claimed it would die in turn, and the job fail only as "its worker was lost").
    KeyboardInterrupt and SystemExit are not Exceptions, so they pass through to the caller."""
    try:
        return _tune(job, device, store, storage, hooks)
    except (StoreUnreachable, DeviceFault):
        # The database, not the job, is at fault, and the job cannot be marked anyway: stop; the lease runs
        # out and a worker that reaches the database resumes the job. Or the search saw this process's GPU
        # context break: run_worker hands the job on.
        raise
    except Exception as exc:
        if is_device_fault(exc):
            # A CUDA error can leave this process's context broken: every later job would fail here too.
            # Stop; the job goes back to the queue for another worker (or this GPU's next one: `search
            # --gpus` starts one), and a job that faults every worker fails after MAX_ATTEMPTS, with the reason.
            raise DeviceFault(f"{type(exc).__name__}: {exc}".splitlines()[0][:500]) from exc
        log.exception("job %d (%s %s) failed", job.id, job.spec.kernel, job.spec.problem_key)
        return None, f"{type(exc).__name__}: {exc}"


def _hand_on_faulted(queue: JobQueue, job: Job, name: str, reason: str) -> None:
    try:
        state = queue.fault(job.id, name, reason)
    except StoreError as exc:  # the lease runs out instead, and the next claim counts the attempt
        log.warning("worker %s could not hand on job %d after a GPU fault: %s", name, job.id, exc)
        return
    if state == "failed":
        log.error("job %d (%s %s) failed: it faulted the GPU on every attempt; last: %s", job.id, job.spec.kernel,
                  job.spec.problem_key, reason)
    elif state is not None:
        log.warning("job %d (%s %s) faulted the GPU (%s); it is queued again for another worker", job.id,
                    job.spec.kernel, job.spec.problem_key, reason)


def _give_back(queue: JobQueue, job: Job, name: str) -> None:
    """Return an interrupted worker's job to the queue, not counted as an attempt."""
    try:
        if queue.release(job.id, name):
            log.warning("worker %s interrupted: job %d (%s) is queued again", name, job.id, job.spec.problem_key)
    except StoreError as exc:  # it still comes back once its lease runs out
        log.warning("worker %s could not give back job %d: %s; it is handed out again when its lease runs out",
                    name, job.id, exc)


def _tune(job: Job, device: kernels.DeviceInfo, store: Store, storage: optuna.storages.BaseStorage,
          hooks: WorkerHooks) -> tuple[Record | None, str | None]:
    """Tune one job; (record, None) on success, (None, reason) for a job that cannot succeed."""
    if ":" in job.spec.kernel:
        return _tune_user_kernel(job, device, store, hooks)
    spec = kernels.get_kernel(job.spec.kernel)
    problem = kernels.Problem.from_key(spec.name, job.spec.problem_key)
    options = {k: v for k, v in job.spec.options.items() if k in TUNE_OPTIONS}
    try:
        record = tune_problem(spec, problem, device, store, budget=Budget(job.spec.budget_trials, job.spec.budget_seconds),
                              storage=storage, **options, **hooks.tune_options)
    except NoWinner as exc:
        return None, str(exc)
    return record, None


def _tune_user_kernel(job: Job, device: kernels.DeviceInfo, store: Store,
                      hooks: WorkerHooks) -> tuple[Record | None, str | None]:
    """A ``kernels.autotune`` kernel's job: its kernel is MODULE:NAME, its problem the key's text. Its study resumes
    as the tuner's own do; with compile workers (no ``--workers 0``), each candidate runs in the timing worker."""
    tuner = load_kernel(job.spec.kernel)
    (outcome,) = search_kernel(tuner, job.spec.kernel, [Key.parse(job.spec.problem_key)], store, device,
                               trials=job.spec.budget_trials or 40, seed=job.spec.options.get("seed"),
                               isolated=hooks.tune_options.get("pool") is not None)
    return outcome.record, outcome.error
