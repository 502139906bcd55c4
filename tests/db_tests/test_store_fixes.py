"""A refused import leaves an old database byte for byte as it was; hostile numbers and times in an export are
problems named by record and field, not tracebacks; a long-lived reader sees a migration made under it; and on
PostgreSQL only a lost race is tried again."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from db import ImportValidationError, Record, Store, StoreError, import_records, load_document
from db import _migrate

from .conftest import copy_of
from tuner.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
OLD_DB = DATA / "v1_tuner.db"
OLD_EXPORT = DATA / "v1_export.json"


@pytest.fixture
def old_db(tmp_path: Path) -> Path:
    return copy_of(OLD_DB, tmp_path)


def _revision(path: Path) -> str | None:
    with sqlite3.connect(path) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if _migrate.VERSION_TABLE not in tables:
            return None
        return connection.execute(f"SELECT version_num FROM {_migrate.VERSION_TABLE}").fetchone()[0]


# A refused import (issue: the upgrade used to commit before the import failed) ---------------------------


def test_import_refused_on_a_conflict_leaves_an_old_database_byte_identical(old_db: Path, capsys) -> None:
    before = old_db.read_bytes()
    code = main(["import", str(OLD_EXPORT), "--on-conflict", "error", "--db", str(old_db)])
    assert code == 2 and "is already stored" in capsys.readouterr().err
    assert old_db.read_bytes() == before


def test_put_many_that_fails_rolls_back_the_upgrade_too(old_db: Path) -> None:
    before = old_db.read_bytes()
    store = Store(f"sqlite:///{old_db}")
    with pytest.raises(StoreError, match="already stored"):
        import_records(store, OLD_EXPORT, on_conflict="error")
    store.close()
    assert old_db.read_bytes() == before and _revision(old_db) is None


def test_import_of_a_broken_file_leaves_an_old_database_byte_identical(old_db: Path, tmp_path: Path,
                                                                        capsys) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text(OLD_EXPORT.read_text()[:-40])
    before = old_db.read_bytes()
    assert main(["import", str(broken), "--db", str(old_db)]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert old_db.read_bytes() == before


def test_the_first_write_upgrades_an_old_database_in_its_own_transaction(old_db: Path) -> None:
    store = Store(f"sqlite:///{old_db}")
    assert _revision(old_db) is None  # opening for writing alone changes nothing
    import_records(store, OLD_EXPORT, on_conflict="keep")
    assert _revision(old_db) == _migrate.head()
    assert {record.mode for record in store.records()} == {"graph"}


# Hostile values in an export -------------------------------------------------------------------------


def _document_with(tmp_path: Path, field: str, literal: str) -> Path:
    """v1_export.json with record 0's ``field`` set to the JSON ``literal`` (as written, not re-encoded)."""
    document = json.loads(OLD_EXPORT.read_text())
    document["records"][0][field] = "@@HOLE@@"
    path = tmp_path / f"{field}.json"
    path.write_text(json.dumps(document).replace('"@@HOLE@@"', literal))
    return path


@pytest.mark.parametrize("field, literal, says", [
    ("time_ms", "1" + "0" * 400, "time_ms must be a finite number"),
    ("created_at", '"9999-12-31T23:59:59-05:00"', "created_at must be a time before year 10000 in UTC"),
    ("trials", "1" + "0" * 5000, "trials must be an integer >= 0, got <an integer of 5001 digits>"),
])
def test_out_of_range_values_are_problems_named_by_record_and_field(tmp_path: Path, field: str, literal: str,
                                                                     says: str) -> None:
    with pytest.raises(ImportValidationError) as error:
        load_document(_document_with(tmp_path, field, literal))
    assert len(error.value.problems) == 1
    assert error.value.problems[0].startswith("record 0 (") and says in error.value.problems[0]


def test_import_of_a_huge_number_exits_2_and_leaves_the_database_unchanged(old_db: Path, tmp_path: Path,
                                                                          capsys) -> None:
    document = _document_with(tmp_path, "time_ms", "1" + "0" * 400)
    before = old_db.read_bytes()
    assert main(["import", str(document), "--db", str(old_db)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "record 0" in err and "time_ms" in err
    assert old_db.read_bytes() == before


def test_a_record_past_year_9999_in_utc_is_a_value_error() -> None:
    from datetime import datetime, timedelta, timezone

    late = datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-5)))
    raw = json.loads(OLD_EXPORT.read_text())["records"][0]
    values = {**raw, "shapes": [tuple(s) for s in raw["shapes"]], "created_at": late}
    with pytest.raises(ValueError, match="past year 9999 in UTC"):
        Record(**values)


# A long-lived reader of a database that a writer migrates -----------------------------------------------


def test_long_lived_reader_sees_eager_records_after_a_writer_migrates(old_db: Path) -> None:
    url = f"sqlite:///{old_db}"
    reader = Store(url, create=False)
    graph = reader.records(device="h100", kernel="matmul")[0]  # read while the table is schema 0001
    assert graph.mode == "graph"
    eager = Record(**{**graph.__dict__, "mode": "eager", "time_ms": graph.time_ms * 2, "tflops": graph.tflops / 2})
    with Store(url) as writer:
        assert writer.put(eager) == "inserted"
    modes = sorted(r.mode for r in reader.records(device="h100", kernel="matmul")
                   if r.problem_key == graph.problem_key)
    assert modes == ["eager", "graph"]
    found = reader.get(graph.device_name, "matmul", graph.problem_key, "eager")
    assert found is not None and found.time_ms == graph.time_ms * 2


# PostgreSQL: only a lost race is retried ---------------------------------------------------------------


def _counting(statements: list[str], calls: list[int]):
    def work(session) -> None:
        calls.append(1)
        for statement in statements:
            session.execute(text(statement))

    return work


def test_postgres_retries_a_unique_violation_as_a_lost_race(pg_url: str) -> None:
    calls: list[int] = []
    with Store(pg_url) as store:
        work = _counting(["CREATE TEMP TABLE race (x int PRIMARY KEY)", "INSERT INTO race VALUES (1)",
                          "INSERT INTO race VALUES (1)"], calls)
        with pytest.raises(StoreError, match="(?s)same time.*gave up after 5 attempts"):
            store._transaction(work, write=True)
    assert len(calls) == 5


def test_postgres_reports_a_not_null_violation_at_once(pg_url: str) -> None:
    calls: list[int] = []
    with Store(pg_url) as store:
        work = _counting(["CREATE TEMP TABLE strict (x int NOT NULL)", "INSERT INTO strict VALUES (NULL)"], calls)
        with pytest.raises(StoreError) as error:
            store._transaction(work, write=True)
    assert len(calls) == 1
    assert "same time" not in str(error.value) and "null" in str(error.value).lower()
