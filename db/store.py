"""The tuned-config store: the one module that opens database sessions.

Every touch goes through ``Store._session()``, which commits or rolls back and turns driver errors
into ``StoreError`` naming the database, as Optuna's ``RDBStorage`` does. Writes are a read-then-write
(is there a record already? is the new one faster?), so they must be atomic across processes:

* SQLite: the transaction starts with ``BEGIN IMMEDIATE``, which takes the write lock before the
  read, so two writers queue (for up to the 30 s busy timeout) instead of both reading "absent".
  WAL journaling lets readers go on while a writer holds the lock.
* Other backends (PostgreSQL): the row is read ``FOR UPDATE``; a concurrent insert of the same key
  fails the unique constraint, and the whole transaction is retried, then finds the row (so is one that
  lost a deadlock or a serialization check; other integrity errors are not retried).

A server that goes away (``db._outage``): a store opened for writing that reached its server before
and now cannot get a connection waits for it with a bounded backoff (nothing of the transaction ran, so
trying again is safe); a URL that never answered fails at once, as a typo should. A connection lost
mid-transaction is not tried again (its COMMIT may have landed) but raises ``StoreUnreachable`` at
once. A read-only store (runtime dispatch) never waits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal, TypeVar

from sqlalchemy import ColumnElement, inspect, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from . import _migrate
# Module attributes here, not only in db._engine: the fault tests wrap db.store._make_engine.
from ._engine import BEGIN_OPTION as _BEGIN_OPTION, make_engine as _make_engine, sqlite_file as _sqlite_file
from ._outage import Outage, StoreError, StoreUnreachable, one_line, server_unreachable, shown_url as _shown
from ._record import ImportSummary, Record
from ._plausible import check_plausible, plausibility_problems
from .models import TABLE_NAME, RecordModel

_logger = logging.getLogger(__name__)

ON_CONFLICT_CHOICES = ("faster", "replace", "keep", "error")

# Whole-transaction retries for lost races (locked SQLite, duplicate insert on PostgreSQL).
_ATTEMPTS = 5
_BACKOFF_S = 0.05  # doubled after each failed attempt: 0.05, 0.1, 0.2, 0.4 s
# PostgreSQL errors that mean a lost race, so the transaction may be run again: unique_violation (two
# writers inserted one key), serialization_failure, deadlock_detected. Other integrity errors (a NULL, a
# check) fail the same way every time and are reported at once.
_RACE_SQLSTATES = frozenset({"23505", "40001", "40P01"})

# Columns of tuner_records that older schemas lack: mode came with 0002 (a record without one is a "graph"
# record), record_hash with 0004. A read-only store reads such a table as it is, without them.
_NEWER_COLUMNS = frozenset({"mode", "record_hash"})

T = TypeVar("T")
Outcome = Literal["inserted", "replaced", "kept"]


class _RetryableError(StoreError):
    """A lost race: running the transaction again may well succeed."""


class _NotConnected(StoreUnreachable):
    """No connection could be had for a transaction, so none of it ran: waiting for the server is safe."""


def default_url() -> str:
    """Where records live unless told otherwise: ``$TUNER_DB``, else a SQLite file in the user's cache.

    The cache folder is ``$XDG_CACHE_HOME/triton-tuner`` (``~/.cache/triton-tuner`` by default).
    Nothing is created here: a reader must not leave folders behind; a writer creates the folder.
    """
    configured = os.environ.get("TUNER_DB", "").strip()
    if configured:
        return as_url(configured)
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    # The XDG spec says to ignore a relative XDG_CACHE_HOME.
    root = Path(cache) if cache and os.path.isabs(cache) else Path.home() / ".cache"
    return f"sqlite:///{root / 'triton-tuner' / 'tuner.db'}"


def as_url(url_or_path: str) -> str:
    """``url_or_path`` as a database URL: a plain path (no ``://``) means a SQLite file."""
    if "://" in url_or_path:
        return url_or_path
    return f"sqlite:///{Path(url_or_path).expanduser().absolute()}"


class Store:
    """Tuned records in a database, one per (device_name, kernel, problem_key).

    ``create=False`` makes a reader that never creates anything: on a machine that has not tuned,
    a missing SQLite file or a missing table reads as no records; nor does it wait for a server that
    went away (``db._outage``), where a writer does.
    """

    def __init__(self, url: str | None = None, *, create: bool = True) -> None:
        self._url = as_url(url) if url is not None else default_url()
        self._engine = _make_engine(self._url, wal=create)
        self._sqlite_file = _sqlite_file(self._url)
        self._writer = self._engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
        self._waits_for_server = create
        self._reached = False  # has this store ever had a connection? (only then is a failure an outage)
        self._has_table = False
        # The newer columns an older table lacks (_NEWER_COLUMNS), read around. Only a hint once seen: a
        # writer may migrate the database under a long-lived reader, so each read checks it again.
        self._missing: frozenset[str] = frozenset()
        # An older schema that the first write transaction upgrades, inside that transaction.
        self._upgrade_pending = False
        if create:
            self._prepare_tables()

    @classmethod
    def open_readonly(cls, url: str | None = None) -> Store:
        """A store for runtime lookups: creates no file and no table, reads [] where there are none."""
        return cls(url, create=False)

    @property
    def url(self) -> str:
        return self._url

    def __repr__(self) -> str:
        return f"Store({_shown(self._url)!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the engine's pooled connections (the store opens new ones if used again)."""
        self._engine.dispose()

    def exists(self) -> bool:
        """Whether the database holds our records table; checked without creating anything."""
        return self._readable()

    def upgrade(self) -> None:
        """Bring an older database to this code's schema now, rather than in the first write."""
        if self._upgrade_pending:
            self._transaction(lambda session: None, write=True)

    # Writes -------------------------------------------------------------------------------------

    def put(self, record: Record, on_conflict: str = "faster") -> Outcome:
        """Store ``record``; returns "inserted", "replaced" or "kept" (the stored one stayed).

        ``on_conflict`` decides between ``record`` and one already stored for its problem: "faster"
        keeps the lower ``time_ms`` (the stored one on a tie; a stored one that fails the plausibility
        rules always loses), "replace" the new, "keep" the old, and "error" raises ``StoreError``.
        An implausible ``record`` raises ValueError and is never stored.
        """
        check_on_conflict(on_conflict)
        check_plausible([record])
        self._require_table()
        return self._transaction(lambda session: _put(session, record, on_conflict), write=True)

    def put_many(self, records: Sequence[Record], on_conflict: str = "faster") -> ImportSummary:
        """Store every record in one transaction: all are written or, on any error, none."""
        check_on_conflict(on_conflict)
        check_plausible(records)
        self._require_table()

        def work(session: Session) -> ImportSummary:
            outcomes = [_put(session, record, on_conflict) for record in records]
            return ImportSummary(inserted=outcomes.count("inserted"),
                                 replaced=outcomes.count("replaced"), kept=outcomes.count("kept"))

        summary = self._transaction(work, write=True)
        _logger.info("stored %d records in %s: %s", len(records), _shown(self._url), summary)
        return summary

    def delete(self, device: str | None = None, kernel: str | None = None) -> int:
        """Delete the records of ``device`` (name or alias) and ``kernel``; None matches all."""
        if not self._readable():
            return 0
        return self._transaction(
            lambda session: RecordModel.delete_matching(session, device, kernel), write=True)

    # Reads --------------------------------------------------------------------------------------

    def get(self, device_name: str, kernel: str, problem_key: str, mode: str = "graph") -> Record | None:
        """The record for exactly this problem and mode on this device (canonical name), or None."""
        if not self._readable():
            return None

        def work(session: Session) -> Record | None:
            missing = self._old_columns(session)
            if missing:  # no record_hash yet: the old schema's unique index covers the key's columns
                same = [RecordModel.device_name == device_name, RecordModel.kernel == kernel,
                        RecordModel.problem_key == problem_key]
                if "mode" not in missing:
                    same.append(RecordModel.mode == mode)
                elif mode != "graph":
                    return None
                found = _old_schema_records(session, missing, same)
                return found[0] if found else None
            model = RecordModel.find(session, device_name, kernel, problem_key, mode)
            return None if model is None else model.to_record()

        return self._transaction(work, write=False)

    def records(self, device: str | None = None, kernel: str | None = None) -> list[Record]:
        """Records of ``device`` (name or alias) and ``kernel``, None matching all; ordered by
        kernel, then problem_key."""
        if not self._readable():
            return []

        def work(session: Session) -> list[Record]:
            missing = self._old_columns(session)
            if missing:
                return _old_schema_records(session, missing, RecordModel._filters(device, kernel))
            return [m.to_record() for m in RecordModel.find_all(session, device, kernel)]

        return self._transaction(work, write=False)

    def devices(self) -> list[tuple[str, str]]:
        """Each (device_name, device_alias) with records, sorted."""
        if not self._readable():
            return []
        return self._transaction(RecordModel.devices, write=False)

    # Sessions -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _session(self, write: bool = False) -> Iterator[Session]:
        """A session that commits on success, rolls back on any error, and turns driver errors
        into ``StoreError``; writers take SQLite's write lock when they begin."""
        session = Session(self._writer if write else self._engine)
        connected = False
        try:
            # Connect (and, on PostgreSQL, ping) before any work, so that a failure here is known to
            # have run nothing of the transaction (see _transaction).
            session.connection()
            connected = self._reached = True
            yield session
            session.commit()
        except SQLAlchemyError as exc:
            session.rollback()
            raise self._error(exc, connected) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def _transaction(self, work: Callable[[Session], T], *, write: bool) -> T:
        """Run ``work`` in one session, again from the start if it lost a race to another writer, or,
        for a writing store, once the server that could not be reached is back."""
        outage: Outage | None = None
        attempt = 0
        while True:
            try:
                upgrading = write and self._upgrade_pending
                with self._session(write) as session:
                    if upgrading:
                        self._upgrade_in(session)
                    result = work(session)
                if upgrading:  # committed: the schema is current from now on
                    self._upgrade_pending, self._has_table, self._missing = False, True, frozenset()
                return result
            except _NotConnected as exc:
                if not (self._waits_for_server and self._reached):
                    raise
                outage = outage or Outage(_shown(self._url))
                outage.pause(exc)
            except _RetryableError as exc:
                attempt += 1
                if attempt == _ATTEMPTS:
                    raise StoreError(f"{exc} (gave up after {_ATTEMPTS} attempts)") from exc.__cause__
                _logger.debug("attempt %d on %s lost a race (%s); retrying", attempt,
                              _shown(self._url), exc.__cause__)
                time.sleep(_BACKOFF_S * 2 ** (attempt - 1))

    def _error(self, exc: SQLAlchemyError, connected: bool = True) -> StoreError:
        """The ``StoreError`` for a driver error: names the database and what to try."""
        detail = getattr(exc, "orig", None) or exc
        where = f"database {_shown(self._url)}"
        if server_unreachable(exc):
            if not connected:
                return _NotConnected(f"{where} cannot be reached ({one_line(detail)}); nothing was written: "
                                     "start the server or fix the URL (TUNER_DB or --db), then run the "
                                     "command again")
            return StoreUnreachable(
                f"{where} dropped the connection mid-transaction ({one_line(detail)}); that transaction was "
                "rolled back unless its commit had reached the server, and everything committed before "
                "is kept; once the server is back, run the same command again (an import is safe to "
                "repeat; a search resumes its study where it stopped)")
        if _is_locked(exc):
            return _RetryableError(f"{where} stayed locked by another process ({detail}); "
                                   "wait for the other tuner or import to finish and try again")
        if self._engine.dialect.name != "sqlite" and _sqlstate(detail) in _RACE_SQLSTATES:
            return _RetryableError(f"{where}: another process wrote the same problem at the same "
                                   f"time ({detail}); try again")
        if any(sign in str(detail).lower() for sign in ("disk is full", "disk i/o", "file too large")):
            return StoreError(f"{where} could not be written: {detail}; nothing of this write was kept; "
                              "free space on its disk (or raise the file size limit) and run the command again")
        if any(sign in str(detail).lower() for sign in ("not a database", "malformed", "disk image")):
            return StoreError(f"{where} is damaged or is not a SQLite database ({detail}); restore it from a "
                              "backup or re-import an export into a new file, or point --db / TUNER_DB elsewhere")
        return StoreError(f"{where} failed: {detail}; check that the URL (TUNER_DB or --db) names "
                          "a reachable database this user may write, and that the file is a "
                          "triton-tuner database")

    # Tables -------------------------------------------------------------------------------------

    def _prepare_tables(self) -> None:
        """Create our tables in an empty database; mark an older schema for upgrading in the first
        write; refuse a database written by a newer release.

        The upgrade of an older database waits for a write, and runs inside that write's transaction,
        so that a write that fails (an import refused on a conflict) leaves the database byte for byte
        as it was, and a command that only reads never migrates. SQLite and PostgreSQL both run DDL
        inside a transaction, so the rollback takes the migration with it; one separate upgrade
        transaction (as before) would have committed the new schema even when the write then failed.
        """
        if self._sqlite_file is not None:
            try:
                self._sqlite_file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the folder of database {_shown(self._url)}: {exc}; "
                                 "pass a URL (TUNER_DB or --db) in a writable place") from exc
        try:
            revision = self._transaction(lambda session: _migrate.revision_of(session.connection()), write=False)
            _migrate.check_known(revision, _shown(self._url))
        except _migrate.SchemaError as exc:
            raise StoreError(str(exc)) from exc
        if revision is None:  # empty: nothing to keep, so create the tables at once (concurrent creators queue)
            self._upgrade_pending = True
            self.upgrade()
        elif not _migrate.is_current(revision):
            self._upgrade_pending = True
        else:
            self._has_table = True

    def _upgrade_in(self, session: Session) -> None:
        """Migrate to this code's schema inside ``session``'s write transaction (a no-op once current)."""
        try:
            _migrate.upgrade(session.connection(), _shown(self._url))
        except _migrate.SchemaError as exc:
            raise StoreError(str(exc)) from exc

    def _old_columns(self, session: Session) -> frozenset[str]:
        """The newer columns the records table still lacks (an older schema), checked in the reading
        transaction while it last lacked some: a writer may have migrated it since."""
        if self._missing:
            self._missing = _missing_columns(session)
        return self._missing

    def _readable(self) -> bool:
        """Whether our table exists; checked without creating a SQLite file that is not there.

        A read-only store reads an older schema as it is (records of schema 0001 read as "graph"
        records; before 0004, without record_hash) and leaves migrating to a store that writes; a newer
        schema is refused."""
        if self._has_table:
            return True
        if self._sqlite_file is not None and not self._sqlite_file.exists():
            return False

        def inspect_schema(session: Session) -> tuple[bool, frozenset[str]]:
            connection = session.connection()
            revision = _migrate.revision_of(connection)
            _migrate.check_known(revision, _shown(self._url))
            if not inspect(connection).has_table(TABLE_NAME):
                return False, frozenset()
            return True, _missing_columns(session)

        try:
            self._has_table, self._missing = self._transaction(inspect_schema, write=False)
        except _migrate.SchemaError as exc:
            raise StoreError(str(exc)) from exc
        return self._has_table

    def _require_table(self) -> None:
        """Refuse, with the way out, a write that a read-only store cannot make: no table, or an older
        schema that only a writing store upgrades (its first write would otherwise fail on the schema)."""
        if not self._readable():
            raise StoreError(f"database {_shown(self._url)} has no {TABLE_NAME} table; it was "
                             "opened read-only (create=False): open it with Store(url) to write")
        if self._missing and not self._upgrade_pending and self._transaction(self._old_columns, write=False):
            raise StoreError(f"database {_shown(self._url)} has an older schema, which a store opened read-only "
                             "(create=False) does not upgrade: open it with Store(url) to upgrade it and write")


def check_on_conflict(on_conflict: str) -> None:
    """Raise ValueError unless ``on_conflict`` is one of ``ON_CONFLICT_CHOICES``."""
    if on_conflict not in ON_CONFLICT_CHOICES:
        raise ValueError(f"on_conflict {on_conflict!r} is not one of {', '.join(ON_CONFLICT_CHOICES)}; "
                         "pass --on-conflict faster (keep the lower time), replace, keep or error")


def _put(session: Session, record: Record, on_conflict: str) -> Outcome:
    """Insert ``record`` or settle its conflict with the stored one; returns what happened."""
    stored = RecordModel.find(session, record.device_name, record.kernel, record.problem_key, record.mode,
                              for_update=True)
    if stored is None:
        session.add(RecordModel.from_record(record))
        return "inserted"
    if on_conflict == "error":
        raise StoreError(
            f"{record.device_alias} ({record.device_name}) {record.kernel} {_short(record.problem_key)} "
            f"is already stored ({stored.time_ms:.4g} ms; new {record.time_ms:.4g} ms); pass "
            "--on-conflict faster to keep the faster, replace to take the new, or keep to keep the old")
    faster = record.time_ms < stored.time_ms or bool(plausibility_problems(stored.to_record()))
    if on_conflict == "replace" or (on_conflict == "faster" and faster):
        stored.overwrite(record)
        return "replaced"
    return "kept"


def _missing_columns(session: Session) -> frozenset[str]:
    """The newer columns (``_NEWER_COLUMNS``) that the records table of this database lacks."""
    columns = {column["name"] for column in inspect(session.connection()).get_columns(TABLE_NAME)}
    return _NEWER_COLUMNS - columns


def _old_schema_records(session: Session, missing: frozenset[str],
                        filters: Sequence[ColumnElement[bool]]) -> list[Record]:
    """Records matching ``filters`` of a table that lacks the ``missing`` columns, read without migrating
    it, in ``RecordModel.find_all``'s order; a table without modes (0001) holds "graph" records only."""
    attributes = [attribute for attribute in inspect(RecordModel).column_attrs if attribute.key not in missing]
    order = [RecordModel.kernel, RecordModel.problem_key, RecordModel.device_name]
    if "mode" not in missing:
        order.append(RecordModel.mode)
    query = select(*[attribute.columns[0] for attribute in attributes]).where(*filters).order_by(*order)
    defaults = {"mode": "graph"} if "mode" in missing else {}
    return [RecordModel(**{attribute.key: row[index] for index, attribute in enumerate(attributes)},
                        **defaults).to_record()
            for row in session.execute(query)]


def _sqlstate(detail: object) -> str | None:
    """The SQLSTATE of a PostgreSQL driver error (psycopg 3: ``sqlstate``; psycopg2: ``pgcode``)."""
    return getattr(detail, "sqlstate", None) or getattr(detail, "pgcode", None)


def _is_locked(exc: SQLAlchemyError) -> bool:
    return isinstance(exc, OperationalError) and "locked" in str(getattr(exc, "orig", exc)).lower()


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
