"""SQLAlchemy models of the tuner's table, with the queries the store needs as classmethods.

The table lives in its own metadata and is named ``tuner_records`` so that it can share a database
(and a URL) with Optuna's ``RDBStorage``, whose tables are ``studies``, ``trials``, ``version_info``
and so on: creating ours never touches theirs.

A record is found by ``record_hash``, the SHA-1 of what the table keeps one record per (device, kernel,
key, mode), not by the key itself: a grouped key runs to kilobytes, and PostgreSQL refuses a btree index
entry over about 2.7 KB (schema revision 0004).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (ColumnElement, DateTime, Dialect, Float, Index, String, Text, UniqueConstraint,
                        delete, or_, select)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.types import TypeDecorator

from ._record import Record

TABLE_NAME = "tuner_records"


def problem_hash(device_name: str, kernel: str, problem_key: str, *more: str) -> str:
    """The unique, index-friendly identity of one problem on one device kind (and of whatever ``more``
    adds, such as a mode): hex SHA-1 of the parts joined by NUL, which no key or name holds."""
    return hashlib.sha1("\x00".join((device_name, kernel, problem_key, *more)).encode()).hexdigest()


def record_hash(device_name: str, kernel: str, problem_key: str, mode: str) -> str:
    """What ``tuner_records`` keeps one row per, as a fixed 40 characters; migration 0004 computes the same."""
    return problem_hash(device_name, kernel, problem_key, mode)


class Base(DeclarativeBase):
    """Our metadata only: ``Base.metadata.create_all`` creates no Optuna table and alters none."""


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and read back timezone-aware, on SQLite too (which keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"timestamp {value.isoformat()} has no timezone; store aware UTC datetimes")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class RecordModel(Base):
    """One row per (device_name, kernel, problem_key, mode): the best config found for that problem."""

    __tablename__ = TABLE_NAME
    # The schema is made and moved by alembic (db/migrations); keep these declarations in step with it.
    __table_args__ = (UniqueConstraint("record_hash", name="uq_tuner_records_record_hash"),
                      Index("ix_tuner_records_device_kernel", "device_name", "kernel"))

    id: Mapped[int] = mapped_column(primary_key=True)
    device_name: Mapped[str] = mapped_column(String(255))
    device_alias: Mapped[str] = mapped_column(String(64), index=True)
    compute_capability: Mapped[str] = mapped_column(String(16))
    sm_count: Mapped[int]
    kernel: Mapped[str] = mapped_column(String(128))
    # Text, not String: a grouped problem's key lists every member GEMM and may run to kilobytes (so it
    # is in no index: rows are found by record_hash).
    problem_key: Mapped[str] = mapped_column(Text)
    dtype: Mapped[str] = mapped_column(String(16))
    layout: Mapped[str] = mapped_column(String(8))
    shapes_json: Mapped[str] = mapped_column("shapes", Text)
    config_json: Mapped[str] = mapped_column("config", Text)
    time_ms: Mapped[float] = mapped_column(Float)
    tflops: Mapped[float] = mapped_column(Float)
    cublas_ms: Mapped[float | None] = mapped_column(Float)
    triton_config_json: Mapped[str | None] = mapped_column("triton_config", Text)
    triton_ms: Mapped[float | None] = mapped_column(Float)
    torch_version: Mapped[str] = mapped_column(String(64))
    triton_version: Mapped[str] = mapped_column(String(64))
    cuda_version: Mapped[str] = mapped_column(String(64))
    trials: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    mode: Mapped[str] = mapped_column(String(8), server_default="graph")
    # record_hash(device_name, kernel, problem_key, mode), kept in step by overwrite(): never set it apart.
    record_hash: Mapped[str] = mapped_column(String(40))

    @classmethod
    def find(cls, session: Session, device_name: str, kernel: str, problem_key: str, mode: str = "graph",
             *, for_update: bool = False) -> RecordModel | None:
        """The row for this problem and mode, or None; ``for_update`` locks it (where the backend
        can) so a concurrent writer cannot slip a change between our read and our write."""
        query = select(cls).where(cls.record_hash == record_hash(device_name, kernel, problem_key, mode))
        if for_update:
            query = query.with_for_update()
        return session.scalars(query).one_or_none()

    @classmethod
    def find_all(cls, session: Session, device: str | None = None,
                 kernel: str | None = None) -> Sequence[RecordModel]:
        """Rows matching the filters, ordered by kernel, problem_key (then device, for stability)."""
        query = select(cls).where(*cls._filters(device, kernel))
        return session.scalars(query.order_by(cls.kernel, cls.problem_key, cls.device_name, cls.mode)).all()

    @classmethod
    def devices(cls, session: Session) -> list[tuple[str, str]]:
        """Each (device_name, device_alias) that has at least one row, sorted."""
        query = select(cls.device_name, cls.device_alias).distinct()
        rows = session.execute(query.order_by(cls.device_name, cls.device_alias)).all()
        return [(name, alias) for name, alias in rows]

    @classmethod
    def delete_matching(cls, session: Session, device: str | None = None,
                        kernel: str | None = None) -> int:
        """Delete the rows matching the filters; returns how many went."""
        result = session.execute(delete(cls).where(*cls._filters(device, kernel)))
        return int(getattr(result, "rowcount", 0) or 0)

    @classmethod
    def _filters(cls, device: str | None, kernel: str | None) -> list[ColumnElement[bool]]:
        # Users name a device either way ("h100" or "NVIDIA H100 80GB HBM3"), so match both.
        filters: list[ColumnElement[bool]] = []
        if device is not None:
            filters.append(or_(cls.device_name == device, cls.device_alias == device))
        if kernel is not None:
            filters.append(cls.kernel == kernel)
        return filters

    @classmethod
    def from_record(cls, record: Record) -> RecordModel:
        model = cls()
        model.overwrite(record)
        return model

    def overwrite(self, record: Record) -> None:
        """Make this row hold ``record`` (its key and the key's hash included)."""
        for name, value in _columns_of(record).items():
            setattr(self, name, value)
        self.record_hash = record_hash(*record.key)

    def to_record(self) -> Record:
        return Record(
            device_name=self.device_name, device_alias=self.device_alias,
            compute_capability=self.compute_capability, sm_count=self.sm_count,
            kernel=self.kernel, problem_key=self.problem_key, dtype=self.dtype, layout=self.layout,
            shapes=tuple(tuple(shape) for shape in json.loads(self.shapes_json)),
            config=json.loads(self.config_json), time_ms=self.time_ms, tflops=self.tflops,
            cublas_ms=self.cublas_ms,
            triton_config=None if self.triton_config_json is None else json.loads(self.triton_config_json),
            triton_ms=self.triton_ms, torch_version=self.torch_version,
            triton_version=self.triton_version, cuda_version=self.cuda_version,
            trials=self.trials, created_at=self.created_at, mode=self.mode,
        )


def _columns_of(record: Record) -> dict[str, Any]:
    """Column values for ``record``; JSON keeps the config's key order, which is its print order."""
    return {
        "device_name": record.device_name, "device_alias": record.device_alias,
        "compute_capability": record.compute_capability, "sm_count": record.sm_count,
        "kernel": record.kernel, "problem_key": record.problem_key, "dtype": record.dtype,
        "layout": record.layout, "shapes_json": json.dumps([list(s) for s in record.shapes]),
        "config_json": json.dumps(record.config), "time_ms": record.time_ms, "tflops": record.tflops,
        "cublas_ms": record.cublas_ms,
        "triton_config_json": None if record.triton_config is None else json.dumps(record.triton_config),
        "triton_ms": record.triton_ms, "torch_version": record.torch_version,
        "triton_version": record.triton_version, "cuda_version": record.cuda_version,
        "trials": record.trials, "created_at": record.created_at, "mode": record.mode,
    }
