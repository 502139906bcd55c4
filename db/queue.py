"""Tuning jobs in the database: enqueue, claim atomically under a lease, renew, finish.

A job is (device kind, kernel, problem, budget). Workers claim the highest-priority job for their
device kind, the longest first among equals (``claim_order``); the claim is atomic across processes and hosts:

* PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` picks a row no other claimer holds, so claimers
  never wait on one another and never get the same job.
* SQLite: the store's writers begin with ``BEGIN IMMEDIATE``: claims queue on the write lock.

A claimed job carries a lease (``lease_until``) that its worker renews while it works. A job whose
lease ran out (its worker was killed or its host lost) is claimable again; the next worker resumes the
job's Optuna study, which lives in the same database. A job lost ``MAX_ATTEMPTS`` times is failed
rather than handed out again (it may be what kills its workers). Renewing and finishing check that the
job still belongs to the caller, so a worker that lost its lease cannot finish another's job.

Leases compare timestamps from the workers' clocks: hosts sharing a database need synchronized clocks
(NTP), to well within the lease (60 s by default).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import func, inspect, or_, select, update
from sqlalchemy.orm import Session

from ._fleet_models import (DONE, FAILED, JOB_STATES, JOBS_TABLE, QUEUED, RUNNING, WORKERS_TABLE, JobModel,
                            WorkerModel)
from .models import problem_hash
from .store import Store

_logger = logging.getLogger(__name__)

# A worker renews its lease every LEASE_S / 4; a job is handed out again LEASE_S after the last renewal.
DEFAULT_LEASE_S = 60.0
# A job whose worker vanished this many times is failed instead of handed out again.
MAX_ATTEMPTS = 3


def claim_order(candidates: Sequence[tuple[int, str, float]], seconds_by_kernel: Mapping[str, float],
                lost: Collection[int] = ()) -> list[int]:
    """The ids of ``candidates`` (id, kernel, priority) in the order claims take them.

    A priority's integer part is the user's order (a ``--problems`` weight, a recorded problem's share of the work,
    or the order given), kept as it is. Within it, the jobs whose worker was lost (``lost``: running, their lease
    run out) go first: each has waited out a lease already, and left behind it can make the run's tail (on 2 H200s,
    2026-11-29, a job whose worker was killed at 30 s waited until 118 s while seven queued jobs were claimed:
    docs/FLEET.md, "On 2 GPUs after the cuts"). Then the longest jobs go first, so that the last ones, running while
    other workers have nothing left, are short: first the jobs of kernels that have no finished job on this device
    kind yet (their first one tells), then of the kernel whose finished jobs took longest on average
    (``seconds_by_kernel``), then by priority (largest problem first: tuner/fleet.py ``claim_priorities``). On the
    job times of the 1-GPU fleet runs on H200s of 2026-11-28 and 2026-11-29 (torch 2.11.0+cu130, triton 3.6.0),
    replayed by ``scripts/fleet_bench.py --phase report``, this order ended 2-GPU runs 0.7-2.9 s sooner and
    4-GPU runs 3.4-3.9 s sooner than priority alone (docs/FLEET.md, "The claim order, replayed")."""
    def key(candidate: tuple[int, str, float]) -> tuple[float, bool, float, float, int]:
        job_id, kernel, priority = candidate
        return -math.floor(priority), job_id not in lost, -seconds_by_kernel.get(kernel, math.inf), -priority, job_id

    return [candidate[0] for candidate in sorted(candidates, key=key)]


def _kernel_seconds(session: Session, device_name: str) -> dict[str, float]:
    """Each kernel's mean seconds from claim to finish over the jobs done on ``device_name``."""
    totals: dict[str, tuple[float, int]] = {}
    for kernel, started, finished in session.execute(
            select(JobModel.kernel, JobModel.started_at, JobModel.finished_at)
            .where(JobModel.device_name == device_name, JobModel.state == DONE,
                   JobModel.started_at.is_not(None), JobModel.finished_at.is_not(None))):
        seconds, count = totals.get(kernel, (0.0, 0))
        totals[kernel] = (seconds + (finished - started).total_seconds(), count + 1)
    return {kernel: seconds / count for kernel, (seconds, count) in totals.items()}


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class JobSpec:
    """What to tune: enqueued as one job per (device kind, kernel, problem)."""

    device_name: str
    kernel: str
    problem_key: str
    budget_trials: int
    budget_seconds: float | None = None
    options: dict[str, Any] = field(default_factory=dict)  # sampler, seed, use_shipped, ahead, eager_passes
    priority: float = 0.0


@dataclass(frozen=True)
class Job:
    """A job as stored: its spec and where it stands."""

    id: int
    spec: JobSpec
    state: str
    worker: str | None
    lease_until: datetime | None
    attempts: int
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, model: JobModel) -> Job:
        spec = JobSpec(model.device_name, model.kernel, model.problem_key, model.budget_trials,
                       model.budget_seconds, json.loads(model.options), model.priority)
        return cls(model.id, spec, model.state, model.worker, model.lease_until, model.attempts, model.error,
                   model.created_at, model.started_at, model.finished_at)


@dataclass(frozen=True)
class WorkerInfo:
    """A worker's row: its device, state and last heartbeat."""

    name: str
    device_name: str
    host: str
    pid: int
    state: str
    job_id: int | None
    jobs_done: int
    started_at: datetime
    heartbeat_at: datetime


def _lease_ran_out(model: JobModel, now: datetime) -> bool:
    return model.state == RUNNING and (model.lease_until is None or model.lease_until < now)


def _set_spec(model: JobModel, spec: JobSpec) -> None:
    """What the job is asked to do: its budget, options and priority (not its state or its study)."""
    model.budget_trials, model.budget_seconds = spec.budget_trials, spec.budget_seconds
    model.options, model.priority = json.dumps(spec.options, sort_keys=True), spec.priority


class JobQueue:
    """The job queue of one database. Writing needs a writable ``Store`` (whose first write migrates the
    schema); reading works on a read-only one too, and a database without the fleet's tables (one from
    before the fleet, or not yet written) reads as no jobs and no workers."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._postgres = store._engine.dialect.name == "postgresql"
        self._tables_seen = False  # tables are never dropped: once seen, no need to look again

    @property
    def store(self) -> Store:
        return self._store

    def _run(self, work: Any) -> Any:
        return self._store._transaction(work, write=True)

    def _read(self, work: Any, empty: Any) -> Any:
        """``work`` in a read transaction; ``empty`` where the fleet's tables are not there, without
        creating a missing SQLite file (connecting would) or migrating an old database."""
        if not self._tables_seen and not self._store.exists():
            return empty

        def read(session: Session) -> Any:
            if not self._tables_seen:
                present = inspect(session.connection()).get_table_names()
                if JOBS_TABLE not in present or WORKERS_TABLE not in present:
                    return empty
                self._tables_seen = True
            return work(session)

        return self._store._transaction(read, write=False)

    # Producers ----------------------------------------------------------------------------------

    def enqueue(self, specs: Sequence[JobSpec], *, again: bool = True) -> list[int]:
        """Queue each spec; returns the job ids in order. A job already queued takes the new budget,
        options and priority (its study and trials stay), as does a running one whose lease ran out (it
        stays running until the next claim hands it on, so a lost worker still counts against
        ``MAX_ATTEMPTS``); a running job under a live lease is left as it is (its worker tunes to the
        old budget; compare ``jobs()`` with the specs to tell). A done or failed one is queued again when
        ``again`` (its study resumes, so trials already measured count towards the new budget)."""

        def work(session: Session) -> list[int]:
            ids = []
            now = utc_now()
            for spec in specs:
                key = problem_hash(spec.device_name, spec.kernel, spec.problem_key)
                model = session.scalars(select(JobModel).where(JobModel.problem_hash == key)
                                        .with_for_update()).one_or_none()
                if model is None:
                    model = JobModel(problem_hash=key, device_name=spec.device_name, kernel=spec.kernel,
                                     problem_key=spec.problem_key, state=QUEUED, attempts=0, created_at=now)
                    session.add(model)
                elif model.state == QUEUED or _lease_ran_out(model, now):
                    if again:
                        _set_spec(model, spec)
                    ids.append(model.id)
                    continue
                elif model.state == RUNNING or not again:
                    if model.state == RUNNING:
                        _logger.info("job %d (%s) is running on %s under a live lease; it keeps its budget "
                                     "and options", model.id, model.problem_key, model.worker)
                    ids.append(model.id)
                    continue
                _set_spec(model, spec)
                model.state, model.worker, model.lease_until, model.attempts = QUEUED, None, None, 0
                model.error, model.started_at, model.finished_at = None, None, None
                session.flush()
                ids.append(model.id)
            return ids

        return self._run(work)

    # Workers ------------------------------------------------------------------------------------

    def claim(self, worker: str, device_name: str, lease_s: float = DEFAULT_LEASE_S) -> Job | None:
        """Take the next job for ``device_name`` (queued, or running with its lease run out), or None; which one,
        ``claim_order`` says."""

        def work(session: Session) -> Job | None:
            now = utc_now()
            claimable = (JobModel.device_name == device_name,
                         or_(JobModel.state == QUEUED, (JobModel.state == RUNNING) & (JobModel.lease_until < now)))
            rows = session.execute(select(JobModel.id, JobModel.kernel, JobModel.priority, JobModel.state)
                                   .where(*claimable)).all()
            lost = {row.id for row in rows if row.state == RUNNING}  # claimable while running: its lease ran out
            candidates = [(row.id, row.kernel, row.priority) for row in rows]
            for job_id in claim_order(candidates, _kernel_seconds(session, device_name), lost):
                query = select(JobModel).where(JobModel.id == job_id, *claimable)
                if self._postgres:  # another claimer may hold it since the read above: then take the next
                    query = query.with_for_update(skip_locked=True)
                model = session.scalars(query).one_or_none()
                if model is None:
                    continue
                if model.state == RUNNING:
                    _logger.warning("job %d (%s) lost its worker %s; handing it to %s", model.id,
                                    model.problem_key, model.worker, worker)
                    if model.attempts >= MAX_ATTEMPTS:
                        model.state, model.finished_at, model.lease_until = FAILED, now, None
                        noted = f"; {model.error}" if model.error else ""
                        model.error = f"its worker was lost {model.attempts} times (last: {model.worker}){noted}"
                        session.flush()
                        continue
                model.state, model.worker, model.attempts = RUNNING, worker, model.attempts + 1
                model.lease_until = now + timedelta(seconds=lease_s)
                model.started_at = model.started_at or now
                session.flush()
                return Job.of(model)
            return None

        return self._run(work)

    def renew(self, job_id: int, worker: str, lease_s: float = DEFAULT_LEASE_S) -> bool:
        """Extend ``worker``'s lease on the job; False if the job is no longer its (lease lost)."""
        return self._owned_update(job_id, worker, lease_until=utc_now() + timedelta(seconds=lease_s))

    def finish(self, job_id: int, worker: str, error: str | None = None) -> bool:
        """Mark ``worker``'s job done (or failed with ``error``); False if the job is no longer its."""
        return self._owned_update(job_id, worker, state=FAILED if error else DONE, error=error,
                                  lease_until=None, finished_at=utc_now())

    def fault(self, job_id: int, worker: str, reason: str) -> str | None:
        """A worker whose GPU faulted on this job gives it back at once (not after its lease), noting
        ``reason``; the claim counts against ``MAX_ATTEMPTS``, and the job fails with the reason once it
        has used them all. Returns the job's new state, or None if the job is no longer ``worker``'s."""

        def work(session: Session) -> str | None:
            model = session.scalars(select(JobModel).where(JobModel.id == job_id, JobModel.worker == worker,
                                                           JobModel.state == RUNNING).with_for_update()).one_or_none()
            if model is None:
                return None
            if model.attempts >= MAX_ATTEMPTS:
                model.state, model.finished_at = FAILED, utc_now()
                model.error = f"faulted the GPU on {model.attempts} attempts; last: {reason}"
            else:
                model.state, model.worker = QUEUED, None
                model.error = f"attempt {model.attempts} faulted the GPU: {reason}"
            model.lease_until = None
            session.flush()
            return model.state

        return self._run(work)

    def release(self, job_id: int, worker: str) -> bool:
        """Give a job back to the queue unfinished (a worker stopping cleanly, or interrupted); its study
        keeps its trials. The claim is not counted against ``MAX_ATTEMPTS``: the job did not kill its worker."""
        return self._owned_update(job_id, worker, state=QUEUED, worker=None, lease_until=None,
                                  attempts=JobModel.attempts - 1)

    def _owned_update(self, job_id: int, owner: str, **values: Any) -> bool:
        def work(session: Session) -> bool:
            result = session.execute(update(JobModel)
                                     .where(JobModel.id == job_id, JobModel.worker == owner,
                                            JobModel.state == RUNNING).values(**values))
            return bool(result.rowcount)

        return self._run(work)

    def beat(self, name: str, device_name: str, host: str, pid: int, state: str,
             job_id: int | None = None, done: int = 0) -> None:
        """Register or refresh worker ``name``: its state, current job and jobs done so far."""

        def work(session: Session) -> None:
            now = utc_now()
            model = session.get(WorkerModel, name, with_for_update=True)
            if model is None:
                model = WorkerModel(name=name, started_at=now)
                session.add(model)
            model.device_name, model.host, model.pid, model.state = device_name, host, pid, state
            model.job_id, model.jobs_done, model.heartbeat_at = job_id, done, now

        self._run(work)

    # Readers ------------------------------------------------------------------------------------

    def jobs(self, state: str | None = None) -> list[Job]:
        """Jobs (of ``state``), highest priority first."""
        if state is not None and state not in JOB_STATES:
            raise ValueError(f"job state {state!r} is not one of {', '.join(JOB_STATES)}")
        query = select(JobModel).order_by(JobModel.priority.desc(), JobModel.id)
        if state is not None:
            query = query.where(JobModel.state == state)
        return self._read(lambda session: [Job.of(m) for m in session.scalars(query)], [])

    def counts(self) -> dict[str, int]:
        """Jobs per state, every state present (0 where none)."""
        query = select(JobModel.state, func.count()).group_by(JobModel.state)
        found = dict(self._read(lambda session: session.execute(query).all(), []))
        return {state: int(found.get(state, 0)) for state in JOB_STATES}

    def unfinished(self, device_name: str) -> int:
        """Jobs for ``device_name`` queued or running (a running one may yet come back if its worker dies)."""
        query = select(func.count()).select_from(JobModel).where(JobModel.device_name == device_name,
                                                                  JobModel.state.in_((QUEUED, RUNNING)))
        return int(self._read(lambda session: session.execute(query).scalar_one(), 0))

    def workers(self) -> list[WorkerInfo]:
        """Every worker that ever registered, latest heartbeat first."""
        query = select(WorkerModel).order_by(WorkerModel.heartbeat_at.desc())
        return self._read(lambda session: [
            WorkerInfo(m.name, m.device_name, m.host, m.pid, m.state, m.job_id, m.jobs_done, m.started_at,
                       m.heartbeat_at) for m in session.scalars(query)], [])
