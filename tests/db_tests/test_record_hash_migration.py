"""A database of schema 0003 (records unique by their key, no record_hash) keeps working: read as it is by
a read-only store, upgraded to 0004 with nothing lost by the first write, after which long keys fit.

tests/data/v3_tuner.db was written by the code at commit 4c74cf6 (schema head 0003_fleet, before 0004),
from a worktree of that commit: 48 records from kernels/tables/h100.json (the first six problems of each
kernel and mode: matmul, gated_matmul, matmul_bias in both modes, grouped_matmul and moe_matmul graph), a
grouped record whose ~2 KB key of 199 shapes is the longest kind that schema could index, one queued job
(fp16:nt:48x4096x4096) and that problem recorded with 12 calls, all through db's public API.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from db import Store, StoreError
from db import _migrate
from db.models import record_hash
from db.queue import JobQueue
from db.recorded import recorded

from .conftest import copy_of, make_long_grouped_record, make_record, record_rows

DATA = Path(__file__).resolve().parents[1] / "data"
V3_DB = DATA / "v3_tuner.db"
V3_RECORDS = 49
V3 = "0003_fleet"


@pytest.fixture
def v3_db(tmp_path: Path) -> Path:
    return copy_of(V3_DB, tmp_path)


def _rows(path: Path) -> list[tuple]:
    return record_rows(path, "device_name, device_alias, kernel, problem_key, mode, shapes, config, time_ms, tflops, "
                             "cublas_ms, triton_config, triton_ms, torch_version, triton_version, cuda_version, "
                             "trials, created_at")


def _revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return _migrate.revision_of(connection)
    finally:
        engine.dispose()


def test_read_only_store_reads_a_0003_database_as_it_is_without_changing_it(v3_db: Path, tmp_path: Path) -> None:
    before = v3_db.read_bytes()
    reader = Store(f"sqlite:///{v3_db}", create=False)
    records = reader.records()
    grouped = max(records, key=lambda r: len(r.problem_key))
    eager = next(r for r in records if r.mode == "eager")

    assert len(records) == V3_RECORDS and {r.mode for r in records} == {"eager", "graph"}
    assert reader.get(grouped.device_name, grouped.kernel, grouped.problem_key) == grouped
    assert reader.get(eager.device_name, eager.kernel, eager.problem_key, "eager") == eager
    assert reader.get(eager.device_name, eager.kernel, eager.problem_key + "+1x1x1", "eager") is None
    assert reader.records(device="h100", kernel="moe_matmul") == [r for r in records if r.kernel == "moe_matmul"]
    assert reader.devices() == [("NVIDIA H100 80GB HBM3", "h100")]
    reader.close()
    assert v3_db.read_bytes() == before and _revision(f"sqlite:///{v3_db}") == V3

    upgraded = tmp_path / "upgraded.db"  # the same records as a store reads them after the upgrade
    shutil.copy(V3_DB, upgraded)
    with Store(f"sqlite:///{upgraded}") as writer:
        writer.upgrade()
        assert writer.records() == records


def test_read_only_store_refuses_to_write_a_0003_database_and_names_the_way_out(v3_db: Path) -> None:
    before = v3_db.read_bytes()
    with pytest.raises(StoreError, match=r"older schema.*Store\(url\)"):
        Store(f"sqlite:///{v3_db}", create=False).put(make_record())
    assert v3_db.read_bytes() == before


def test_first_write_upgrades_a_0003_database_keeping_every_record_and_filling_the_hash(v3_db: Path) -> None:
    url = f"sqlite:///{v3_db}"
    before = _rows(v3_db)
    reader = Store(url, create=False)
    old = reader.records()  # a long-lived reader, opened on schema 0003
    long_record = make_long_grouped_record(seed=11)

    with Store(url) as writer:
        assert _revision(url) == V3  # opening for writing migrates nothing yet
        assert writer.put(long_record) == "inserted"

    assert _revision(url) == _migrate.head()
    after = _rows(v3_db)
    assert [row for row in after if row[3] != long_record.problem_key] == before
    with sqlite3.connect(v3_db) as connection:
        hashes = connection.execute("SELECT device_name, kernel, problem_key, mode, record_hash FROM tuner_records")
        assert all(row[4] == record_hash(*row[:4]) for row in hashes)
        assert connection.execute("SELECT count(*) FROM tuner_records").fetchone()[0] == V3_RECORDS + 1
    assert sorted(reader.records(), key=lambda r: r.key) == sorted([*old, long_record], key=lambda r: r.key)
    assert reader.get(long_record.device_name, "grouped_matmul", long_record.problem_key) == long_record
    with Store(url) as writer:  # the fleet's tables came through too
        assert [job.spec.problem_key for job in JobQueue(writer).jobs()] == ["fp16:nt:48x4096x4096"]
        assert [problem.calls for problem in recorded(writer)] == [12]


def _copy_into(v3_db: Path, url: str) -> None:
    """Make ``url`` (PostgreSQL) a schema-0003 database holding v3_tuner.db's rows, as 0003 code left it."""
    from alembic import command

    source, target = create_engine(f"sqlite:///{v3_db}"), create_engine(url)
    try:
        with target.begin() as connection:
            config = _migrate._config()
            config.attributes["connection"] = connection
            command.upgrade(config, V3)
        with source.connect() as reading, target.begin() as writing:
            for table in ("tuner_records", "tuner_jobs", "tuner_recorded"):
                # Without ids: the server numbers the rows, so its sequences go on from the copies.
                columns = [column["name"] for column in inspect(reading).get_columns(table) if column["name"] != "id"]
                query = text(f"SELECT {', '.join(columns)} FROM {table}")
                rows = [dict(row._mapping) for row in reading.execute(query)]
                writing.execute(text(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                                     f"({', '.join(':' + c for c in columns)})"), rows)
    finally:
        source.dispose()
        target.dispose()


def test_a_0003_database_on_postgresql_upgrades_on_first_write_and_then_takes_a_long_key(
        v3_db: Path, pg_url: str) -> None:
    _copy_into(v3_db, pg_url)
    old = Store(pg_url, create=False).records()
    assert len(old) == V3_RECORDS and _revision(pg_url) == V3
    long_record = make_long_grouped_record(seed=12)

    with Store(pg_url) as writer:
        assert writer.put(long_record) == "inserted"
        assert _revision(pg_url) == _migrate.head()
        assert sorted(writer.records(), key=lambda r: r.key) == sorted([*old, long_record], key=lambda r: r.key)
        for record in old:
            assert writer.get(record.device_name, record.kernel, record.problem_key, record.mode) == record
        assert [problem.calls for problem in recorded(writer)] == [12]


def test_downgrade_to_0003_and_upgrade_again_keeps_records(db_url: str) -> None:
    from alembic import command

    records = [make_record(m=m, mode=mode) for m in (1, 2) for mode in ("eager", "graph")]
    with Store(db_url) as store:
        store.put_many(records)
    engine = create_engine(db_url)
    try:
        with engine.begin() as connection:
            config = _migrate._config()
            config.attributes["connection"] = connection
            command.downgrade(config, V3)
        with engine.connect() as connection:
            assert "record_hash" not in {c["name"] for c in inspect(connection).get_columns("tuner_records")}
    finally:
        engine.dispose()
    assert sorted(Store(db_url, create=False).records(), key=lambda r: r.key) == sorted(records, key=lambda r: r.key)
    with Store(db_url) as store:
        store.upgrade()
        assert _revision(db_url) == _migrate.head()
        assert store.put(records[0]) == "kept"  # found by the hash the upgrade filled in
        assert len(store.records()) == len(records)
