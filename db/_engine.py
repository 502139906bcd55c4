"""How a store's engine is made: SQLite's busy timeout, transaction start and journal mode; PostgreSQL's
connection timeout and pre-ping. ``db.store`` makes one engine per store through ``make_engine`` (the fault
tests wrap it there, as ``db.store._make_engine``)."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from ._outage import StoreError, shown_url as _shown

_logger = logging.getLogger(__name__)

# SQLite waits this long for another process's write lock before reporting "database is locked";
# a put holds the lock for milliseconds, so 30 s only runs out when something is badly stuck.
# TUNER_SQLITE_BUSY_TIMEOUT_S overrides it (the fault tests hold a lock past a short timeout).
_SQLITE_BUSY_TIMEOUT_S = 30.0
# Seconds libpq may take to open a PostgreSQL connection; loopback and LAN servers answer in milliseconds.
_PG_CONNECT_TIMEOUT_S = 10
# Execution option read by the SQLite "begin" listener: writers take the write lock up front.
BEGIN_OPTION = "tuner_sqlite_begin"


def make_engine(url: str, *, wal: bool) -> Engine:
    """One engine per store; for SQLite, set up the busy timeout, BEGIN IMMEDIATE and, for
    writers, WAL (a reader leaves the journal mode alone: switching it needs the write lock)."""
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() != "sqlite":
            # pre-ping: a pooled connection the server closed (a restart, pg_terminate_backend, an idle
            # timeout) is replaced at checkout instead of failing the caller's transaction; a store makes
            # few, short transactions, so one round trip each is cheap.
            connect_args = {}
            if parsed.get_driver_name() in ("psycopg", "psycopg2") and "connect_timeout" not in parsed.query:
                # libpq waits for TCP (about 2 min) on a host that drops packets; the outage backoff
                # (db._outage) should see a failure in seconds. A URL's own connect_timeout wins.
                connect_args["connect_timeout"] = _PG_CONNECT_TIMEOUT_S
            return create_engine(url, pool_pre_ping=True, connect_args=connect_args)
        engine = create_engine(url, connect_args={"timeout": busy_timeout_s()})
    except (SQLAlchemyError, ImportError) as exc:
        raise StoreError(f"cannot open database URL {_shown(url)}: {exc}; pass a SQLAlchemy URL such "
                         "as sqlite:////path/to/tuner.db or postgresql://host/db (with its "
                         "driver installed), or a file path") from exc
    event.listen(engine, "connect", _on_sqlite_connect)
    if wal:
        event.listen(engine, "connect", _enable_wal)
    event.listen(engine, "begin", _on_sqlite_begin)
    return engine


def busy_timeout_s() -> float:
    text = os.environ.get("TUNER_SQLITE_BUSY_TIMEOUT_S", "").strip()
    try:
        value = float(text) if text else _SQLITE_BUSY_TIMEOUT_S
    except ValueError:
        raise StoreError(f"TUNER_SQLITE_BUSY_TIMEOUT_S={text!r} is not a number of seconds; "
                         "unset it or give e.g. 30") from None
    return value if value >= 0 else _SQLITE_BUSY_TIMEOUT_S


def _on_sqlite_connect(dbapi_connection: sqlite3.Connection, connection_record: Any) -> None:
    # SQLAlchemy's documented pysqlite recipe: stop the driver from issuing BEGIN itself, so that
    # _on_sqlite_begin decides how each transaction starts.
    dbapi_connection.isolation_level = None


def _enable_wal(dbapi_connection: sqlite3.Connection, connection_record: Any) -> None:
    # WAL lets readers (runtime dispatch) go on while a tuner writes; it persists in the file.
    try:
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error as exc:  # :memory:, read-only media, or a lock: WAL is only an optimization
        _logger.debug("could not switch SQLite to WAL: %s", exc)


def _on_sqlite_begin(connection: Any) -> None:
    mode = connection.get_execution_options().get(BEGIN_OPTION, "DEFERRED")
    connection.exec_driver_sql(f"BEGIN {mode}")


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names; None for other backends, memory and ``file:`` URIs."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database)
