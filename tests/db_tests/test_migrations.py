"""A database and an export written by the release before modes (schema 0001, export version 1) keep
working: read as they are by a read-only store, upgraded with nothing lost by a store that writes.

tests/data/v1_tuner.db and tests/data/v1_export.json were written by commit 865487b (before this
schema change): a CPU search of fp16:nn:32x32x32 (with its Optuna study) and the shipped H100 table
imported, then exported.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from db import Record, Store, import_records
from db import _migrate
from db.store import StoreError

from .conftest import copy_of, record_rows

DATA = Path(__file__).resolve().parents[1] / "data"
OLD_DB = DATA / "v1_tuner.db"
OLD_EXPORT = DATA / "v1_export.json"
OLD_RECORDS = 69  # 68 shipped H100 records and one CPU record


@pytest.fixture
def old_db(tmp_path: Path) -> Path:
    return copy_of(OLD_DB, tmp_path)


def _rows(path: Path) -> list[tuple]:
    return record_rows(path, "device_name, kernel, problem_key, config, time_ms, tflops, cublas_ms, triton_config, "
                             "triton_ms, torch_version, triton_version, cuda_version, trials, created_at")


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as connection:
        return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_read_only_store_reads_an_old_database_without_changing_it(old_db: Path) -> None:
    before = old_db.read_bytes()
    records = Store(f"sqlite:///{old_db}", create=False).records()
    assert len(records) == OLD_RECORDS
    assert {record.mode for record in records} == {"graph"}
    assert old_db.read_bytes() == before
    assert _migrate.VERSION_TABLE not in _tables(old_db)


def test_writing_store_upgrades_an_old_database_and_loses_nothing(old_db: Path) -> None:
    before = _rows(old_db)
    store = Store(f"sqlite:///{old_db}")
    store.upgrade()  # what its first write would do, inside that write's transaction
    assert _rows(old_db) == before
    records = store.records()
    assert len(records) == OLD_RECORDS and {record.mode for record in records} == {"graph"}
    with sqlite3.connect(old_db) as connection:
        assert connection.execute(f"SELECT version_num FROM {_migrate.VERSION_TABLE}").fetchall() == [
            (_migrate.head(),)]
        # Optuna's own alembic history and its study are untouched.
        assert connection.execute("SELECT count(*) FROM studies").fetchone()[0] == 1
        assert connection.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def test_upgraded_database_keeps_a_record_per_mode(old_db: Path) -> None:
    store = Store(f"sqlite:///{old_db}")
    graph = store.records(device="h100", kernel="matmul")[0]
    eager = Record(**{**graph.__dict__, "mode": "eager", "time_ms": graph.time_ms * 2,
                     "tflops": graph.tflops / 2})
    assert store.put(eager) == "inserted"
    assert store.get(graph.device_name, "matmul", graph.problem_key, "graph").time_ms == graph.time_ms
    assert store.get(graph.device_name, "matmul", graph.problem_key, "eager").time_ms == graph.time_ms * 2
    assert len(store.records()) == OLD_RECORDS + 1


def test_upgrade_is_idempotent_across_stores(old_db: Path) -> None:
    Store(f"sqlite:///{old_db}").upgrade()
    Store(f"sqlite:///{old_db}").upgrade()
    assert len(Store(f"sqlite:///{old_db}", create=False).records()) == OLD_RECORDS


def test_a_database_from_a_newer_release_is_refused_with_the_way_out(old_db: Path) -> None:
    Store(f"sqlite:///{old_db}").upgrade()
    with sqlite3.connect(old_db) as connection:
        connection.execute(f"UPDATE {_migrate.VERSION_TABLE} SET version_num = '9999_future'")
    for create in (True, False):
        with pytest.raises(StoreError, match="newer triton-tuner.*install"):
            Store(f"sqlite:///{old_db}", create=create).records()


def test_old_export_imports_as_graph_records(tmp_path: Path) -> None:
    document = json.loads(OLD_EXPORT.read_text())
    assert document["schema_version"] == 1 and all("mode" not in r for r in document["records"])
    store = Store(f"sqlite:///{tmp_path / 'new.db'}")
    summary = import_records(store, OLD_EXPORT)
    assert summary.inserted == len(document["records"])
    records = store.records()
    assert {record.mode for record in records} == {"graph"}
    by_key = {(r.kernel, r.problem_key): r for r in records}
    for raw in document["records"]:
        record = by_key[(raw["kernel"], raw["problem_key"])]
        assert record.config == raw["config"] and record.time_ms == raw["time_ms"]


def test_downgrade_then_upgrade_round_trips_graph_records(old_db: Path) -> None:
    from alembic import command
    from sqlalchemy import create_engine

    Store(f"sqlite:///{old_db}").upgrade()
    before = _rows(old_db)
    engine = create_engine(f"sqlite:///{old_db}")
    with engine.begin() as connection:
        config = _migrate._config()
        config.attributes["connection"] = connection
        command.downgrade(config, _migrate.BASELINE)
    assert _rows(old_db) == before
    assert len(Store(f"sqlite:///{old_db}").records()) == OLD_RECORDS


@pytest.mark.parametrize("start", ["empty", "v1"])
def test_migrations_build_exactly_the_tables_the_models_declare(db_url: str, old_db: Path, start: str) -> None:
    """The models (db/models.py, db/_fleet_models.py) and the migrations must agree, column for column
    and index for index, whether a database is new or upgraded from the first release."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import create_engine

    from db.models import Base

    if start == "v1":
        if not db_url.startswith("sqlite"):
            pytest.skip("the v1 database is a SQLite file")
        db_url = f"sqlite:///{old_db}"
    Store(db_url).upgrade()
    ours = {table.name for table in Base.metadata.tables.values()}
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={
                "include_name": lambda name, kind, parent: kind != "table" or name in ours})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()
