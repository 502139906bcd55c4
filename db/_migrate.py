"""Schema versions of our tables, moved forward by alembic (``db/migrations``).

One history for every table the tuner owns (``tuner_*``), in its own version table so that it never
meets Optuna's, which lives in ``alembic_version`` in the same database. Databases made before the
history began (tuner_records without a version table) are stamped at the baseline, then upgraded.

Only a store opened for writing upgrades (``Store(url)``), in its first write transaction (an empty
database at once); a read-only store reads what is there.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from sqlalchemy import Connection, inspect, text

log = logging.getLogger(__name__)

VERSION_TABLE = "tuner_alembic_version"
BASELINE = "0001_baseline"
RECORDS_TABLE = "tuner_records"
# Serializes concurrent upgrades on PostgreSQL (SQLite's BEGIN IMMEDIATE already does): any constant.
_PG_LOCK_ID = 0x7475_6E65  # "tune"


class SchemaError(RuntimeError):
    """The database's schema is one this code cannot use; the message says which version to install."""


@functools.lru_cache(maxsize=1)
def _script():  # -> alembic.script.ScriptDirectory; imported late: runtime lookups rarely need it
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


def _config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    return config


def head() -> str:
    """The newest revision this code knows."""
    return _script().get_current_head()


def known_revisions() -> list[str]:
    """Every revision of our history, oldest first."""
    return [script.revision for script in reversed(list(_script().walk_revisions()))]


def revision_of(connection: Connection) -> str | None:
    """The schema revision of the database behind ``connection``: None for a database without our
    tables; the baseline for one made before the history began."""
    inspector = inspect(connection)
    if inspector.has_table(VERSION_TABLE):
        row = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).first()
        if row is not None:
            return str(row[0])
    return BASELINE if inspector.has_table(RECORDS_TABLE) else None


@functools.lru_cache(maxsize=1)
def _revision_files() -> frozenset[str]:
    """Our revisions as their files name them (``0004_record_hash.py``): known without importing alembic, which
    costs a runtime lookup a few hundred ms in a fresh process (measured on the CPU box, 2026-11-28)."""
    return frozenset(p.stem for p in (Path(__file__).parent / "migrations" / "versions").glob("[0-9]*.py"))


def check_known(revision: str | None, url: str) -> None:
    """Raise ``SchemaError`` if ``revision`` is newer than this code (written by a later release)."""
    if revision is None or revision in _revision_files() or revision in known_revisions():
        return
    raise SchemaError(
        f"database {url} has schema revision {revision!r}, written by a newer triton-tuner than this one "
        f"(which knows up to {head()!r}); install the triton-tuner release that wrote it, or newer "
        "(pip install -U triton-tuner), or point --db / TUNER_DB at another database")


def is_current(revision: str | None) -> bool:
    return revision == head()


def upgrade(connection: Connection, url: str) -> str:
    """Bring the database to the newest revision inside the caller's open transaction; returns it.

    The caller's transaction holds the write lock (SQLite ``BEGIN IMMEDIATE``); on PostgreSQL an
    advisory lock makes a second upgrader wait and then find nothing to do.
    """
    from alembic import command

    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID})
    current = revision_of(connection)
    check_known(current, url)
    if current == head():
        return current
    config = _config()
    config.attributes["connection"] = connection
    if current == BASELINE and not inspect(connection).has_table(VERSION_TABLE):
        command.stamp(config, BASELINE)  # made before the history began: it is the baseline
    log.info("upgrading %s from schema %s to %s", url, current or "(empty)", head())
    command.upgrade(config, "head")
    return head()
