"""Problems that record mode saw at dispatch, with call counts: what a workload needs tuned.

Many processes add their counts at once; each add is one upsert per problem (``INSERT ... ON CONFLICT
DO UPDATE SET calls = calls + excluded.calls``), atomic on SQLite and PostgreSQL alike, so concurrent
recorders never lose a count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import and_, exists, inspect, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ._fleet_models import RECORDED_TABLE, RecordedModel
from .models import RecordModel, problem_hash
from .store import Store


@dataclass(frozen=True)
class ProblemKey:
    """One problem on one device kind, as record mode keys it."""

    device_name: str
    kernel: str
    problem_key: str


@dataclass(frozen=True)
class RecordedProblem:
    key: ProblemKey
    calls: int
    flops: float  # per call

    @property
    def work(self) -> float:
        """What ranks a problem for tuning: the floating-point work of all its calls."""
        return self.calls * self.flops


def add_calls(store: Store, counts: Mapping[ProblemKey, tuple[int, float]]) -> None:
    """Add ``calls`` (and note the per-call ``flops``) for each problem, in one transaction."""
    if not counts:
        return
    dialect = store._engine.dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    now = datetime.now(timezone.utc)
    rows = [{"problem_hash": problem_hash(k.device_name, k.kernel, k.problem_key), "device_name": k.device_name,
             "kernel": k.kernel, "problem_key": k.problem_key, "calls": calls, "flops": flops,
             "first_seen": now, "last_seen": now}
            for k, (calls, flops) in sorted(counts.items(), key=lambda item: item[0].problem_key)]
    statement = insert(RecordedModel)
    statement = statement.on_conflict_do_update(
        index_elements=[RecordedModel.problem_hash],
        set_={"calls": RecordedModel.calls + statement.excluded.calls, "last_seen": statement.excluded.last_seen})
    store._transaction(lambda session: session.execute(statement, rows), write=True)


def recorded(store: Store, device_name: str | None = None, *, untuned: bool = False) -> list[RecordedProblem]:
    """Recorded problems (of ``device_name``), the most work first; ``untuned``: only those without a
    tuned record for that device."""
    query = select(RecordedModel)
    if device_name is not None:
        query = query.where(RecordedModel.device_name == device_name)
    if untuned:
        query = query.where(~exists().where(and_(RecordModel.device_name == RecordedModel.device_name,
                                                 RecordModel.kernel == RecordedModel.kernel,
                                                 RecordModel.problem_key == RecordedModel.problem_key)))

    if not store.exists():  # a reader on a missing file: connecting would create it
        return []

    def work(session: Session) -> list[RecordedProblem]:
        if not inspect(session.connection()).has_table(RECORDED_TABLE):  # from before the fleet: nothing recorded
            return []
        return [RecordedProblem(ProblemKey(m.device_name, m.kernel, m.problem_key), int(m.calls), m.flops)
                for m in session.scalars(query)]

    found = store._transaction(work, write=False)
    return sorted(found, key=lambda p: (-p.work, p.key.kernel, p.key.problem_key))
