"""SQLAlchemy models of the fleet's tables: tuning jobs, the workers that run them, and the problems
that record mode saw at dispatch.

They share ``Base`` (our metadata, ``tuner_*`` names) with ``tuner_records``, so they live next to
Optuna's tables in one database; alembic revision 0003_fleet creates them. A problem is identified by
the SHA-1 of (device, kernel, key) in ``problem_hash``: grouped keys run to kilobytes, past what a
PostgreSQL btree index entry may hold, so the unique constraints use the hash (``models.problem_hash``,
which ``tuner_records`` shares, with the mode added).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from .models import Base, UTCDateTime

JOBS_TABLE = "tuner_jobs"
WORKERS_TABLE = "tuner_workers"
RECORDED_TABLE = "tuner_recorded"

# Job states, in the order a job passes through them.
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
JOB_STATES = (QUEUED, RUNNING, DONE, FAILED)


class JobModel(Base):
    """One tuning job: search ``problem_key`` of ``kernel`` on a ``device_name`` GPU within a budget."""

    __tablename__ = JOBS_TABLE
    __table_args__ = (UniqueConstraint("problem_hash", name="uq_tuner_jobs_problem"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    problem_hash: Mapped[str] = mapped_column(String(40))
    device_name: Mapped[str] = mapped_column(String(255), index=True)
    kernel: Mapped[str] = mapped_column(String(128))
    problem_key: Mapped[str] = mapped_column(Text)
    budget_trials: Mapped[int] = mapped_column(Integer)
    budget_seconds: Mapped[float | None] = mapped_column(Float)
    options: Mapped[str] = mapped_column(Text)  # JSON: sampler, seed, use_shipped, ahead, eager_passes
    priority: Mapped[float] = mapped_column(Float)  # higher first (recorded: the time the problem took)
    state: Mapped[str] = mapped_column(String(16), index=True)
    worker: Mapped[str | None] = mapped_column(String(255))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WorkerModel(Base):
    """One worker process: what it runs on, and when it last said it was alive."""

    __tablename__ = WORKERS_TABLE

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    device_name: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))  # "idle", "busy", "stopped"
    job_id: Mapped[int | None] = mapped_column(Integer)
    jobs_done: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime())


class RecordedModel(Base):
    """A problem that record mode saw at dispatch: how often it was called, per device."""

    __tablename__ = RECORDED_TABLE
    __table_args__ = (UniqueConstraint("problem_hash", name="uq_tuner_recorded_problem"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    problem_hash: Mapped[str] = mapped_column(String(40))
    device_name: Mapped[str] = mapped_column(String(255), index=True)
    kernel: Mapped[str] = mapped_column(String(128))
    problem_key: Mapped[str] = mapped_column(Text)
    calls: Mapped[int] = mapped_column(BigInteger)
    flops: Mapped[float] = mapped_column(Float)  # per call: calls * flops ranks what took the most time
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime())
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime())
