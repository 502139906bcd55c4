from __future__ import annotations

import dataclasses
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from db import ON_CONFLICT_CHOICES, Store, StoreError, default_url

from .conftest import A100, make_record


def test_put_then_get_round_trips_every_field(store: Store) -> None:
    long_key = "fp16:nn:" + "+".join(f"{m}x256x512" for m in range(1, 200))  # ~2 KB, like a big group
    record = make_record(kernel="grouped_matmul", problem_key=long_key, layout="nn",
                         shapes=tuple((m, 256, 512) for m in range(1, 200)),
                         config={"VARIANT": "cublas"}, cublas_ms=0.25, time_ms=0.25,
                         triton_config={"BLOCK_M": 64, "EVEN_K": True, "num_warps": 8}, triton_ms=0.3)
    assert len(record.problem_key) > 2000

    assert store.put(record) == "inserted"
    got = store.get(record.device_name, "grouped_matmul", long_key)

    assert got == record
    assert got is not None and got.created_at.tzinfo is not None
    assert list(got.config) == list(record.config) and got.triton_config["EVEN_K"] is True


def test_put_then_get_keeps_missing_baseline_as_none(store: Store) -> None:
    record = make_record(cublas_ms=None, triton_config=None, triton_ms=None, **{
        "device_name": "cpu", "device_alias": "cpu", "compute_capability": "", "cuda_version": ""})
    store.put(record)
    assert store.get("cpu", "matmul", record.problem_key) == record
    assert record.speedup is None


def test_records_survive_reopening_the_file(db_url: str) -> None:
    with Store(db_url) as first:
        first.put(make_record())
    with Store(db_url) as second:
        assert second.records() == [make_record()]


def test_get_of_unknown_problem_returns_none(store: Store) -> None:
    store.put(make_record())
    assert store.get("NVIDIA H100 80GB HBM3", "matmul", "fp16:nt:1x1x1") is None


def test_faster_record_wins_by_default(store: Store) -> None:
    store.put(make_record(time_ms=0.5))

    assert store.put(make_record(time_ms=0.7)) == "kept"
    assert store.put(make_record(time_ms=0.5, trials=1)) == "kept"  # a tie keeps what is stored
    assert store.records()[0].trials == 64
    assert store.put(make_record(time_ms=0.3)) == "replaced"
    assert [r.time_ms for r in store.records()] == [0.3]


@pytest.mark.parametrize(("policy", "outcome", "kept_ms"), [("replace", "replaced", 0.9),
                                                            ("keep", "kept", 0.5)])
def test_replace_and_keep_policies_ignore_speed(store: Store, policy: str, outcome: str,
                                                kept_ms: float) -> None:
    store.put(make_record(time_ms=0.5))
    assert store.put(make_record(time_ms=0.9), on_conflict=policy) == outcome
    assert [r.time_ms for r in store.records()] == [kept_ms]


def test_on_conflict_error_raises_and_keeps_existing(store: Store) -> None:
    store.put(make_record(time_ms=0.5))

    with pytest.raises(StoreError) as caught:
        store.put(make_record(time_ms=0.1), on_conflict="error")

    message = str(caught.value)
    assert "NVIDIA H100 80GB HBM3" in message and "matmul" in message
    assert "fp16:nt:16x4096x4096" in message and "--on-conflict" in message
    assert [r.time_ms for r in store.records()] == [0.5]


def test_invalid_on_conflict_raises_value_error_listing_choices(store: Store) -> None:
    with pytest.raises(ValueError, match="faster, replace, keep, error"):
        store.put(make_record(), on_conflict="newest")
    assert ON_CONFLICT_CHOICES == ("faster", "replace", "keep", "error")
    assert store.records() == []


def test_put_many_counts_inserted_replaced_and_kept(store: Store) -> None:
    store.put(make_record(m=1, time_ms=0.5))
    store.put(make_record(m=2, time_ms=0.5))

    summary = store.put_many([make_record(m=1, time_ms=0.1), make_record(m=2, time_ms=0.9),
                              make_record(m=3), make_record(m=4)])

    assert (summary.inserted, summary.replaced, summary.kept, summary.total) == (2, 1, 1, 4)
    assert len(store.records()) == 4


def test_put_many_settles_duplicates_within_the_batch(store: Store) -> None:
    summary = store.put_many([make_record(time_ms=0.5), make_record(time_ms=0.2),
                              make_record(time_ms=0.4)])
    assert (summary.inserted, summary.replaced, summary.kept) == (1, 1, 1)
    assert [r.time_ms for r in store.records()] == [0.2]


def test_put_many_is_all_or_nothing(store: Store) -> None:
    store.put(make_record(m=3, time_ms=0.5))
    batch = [make_record(m=1), make_record(m=2), make_record(m=3, time_ms=0.1), make_record(m=4)]

    with pytest.raises(StoreError, match="fp16:nt:3x4096x4096"):
        store.put_many(batch, on_conflict="error")

    assert [(r.problem_key, r.time_ms) for r in store.records()] == [("fp16:nt:3x4096x4096", 0.5)]


def test_records_filter_by_alias_or_name(store: Store) -> None:
    store.put_many([make_record(m=1), make_record(m=2, kernel="grouped_matmul"),
                    make_record(m=1, **A100)])

    assert {r.device_alias for r in store.records("h100")} == {"h100"}
    assert len(store.records("NVIDIA H100 80GB HBM3")) == 2
    assert [r.device_name for r in store.records("a100")] == [A100["device_name"]]
    assert [r.kernel for r in store.records(kernel="grouped_matmul")] == ["grouped_matmul"]
    assert len(store.records("h100", "matmul")) == 1
    assert store.records("b200") == []


def test_records_are_ordered_by_kernel_then_problem_key(store: Store) -> None:
    store.put_many([make_record(m=3), make_record(m=1, kernel="grouped_matmul"), make_record(m=2)])
    assert [(r.kernel, r.problem_key) for r in store.records()] == [
        ("grouped_matmul", "fp16:nt:1x4096x4096"), ("matmul", "fp16:nt:2x4096x4096"),
        ("matmul", "fp16:nt:3x4096x4096")]


def test_devices_lists_each_device_once(store: Store) -> None:
    store.put_many([make_record(m=1), make_record(m=2), make_record(m=1, **A100)])
    assert store.devices() == [(A100["device_name"], "a100"), ("NVIDIA H100 80GB HBM3", "h100")]


def test_delete_by_device_and_kernel_returns_count(store: Store) -> None:
    store.put_many([make_record(m=1), make_record(m=2), make_record(m=1, kernel="grouped_matmul"),
                    make_record(m=1, **A100)])

    assert store.delete("h100", "matmul") == 2
    assert store.delete("NVIDIA A100-SXM4-80GB") == 1
    assert [r.kernel for r in store.records()] == ["grouped_matmul"]
    assert store.delete() == 1 and store.records() == []


def test_readonly_store_on_missing_file_returns_nothing_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "never" / "tuner.db"
    with Store.open_readonly(f"sqlite:///{path}") as store:
        assert store.records() == [] and store.devices() == []
        assert store.get("NVIDIA H100 80GB HBM3", "matmul", "fp16:nt:1x1x1") is None
        assert store.delete() == 0
        with pytest.raises(StoreError, match="create=False"):
            store.put(make_record())
    assert not path.exists() and not path.parent.exists()


def test_readonly_store_on_database_without_table_returns_nothing(tmp_path: Path) -> None:
    path = tmp_path / "optuna_only.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE studies (study_id INTEGER PRIMARY KEY)")
    connection.close()

    with Store(str(path), create=False) as store:
        assert store.records() == [] and store.devices() == []
    with sqlite3.connect(path) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
    connection.close()
    assert "tuner_records" not in tables


def test_readonly_store_sees_records_written_after_it_opened(db_url: str) -> None:
    reader = Store.open_readonly(db_url)
    assert reader.records() == []
    with Store(db_url) as writer:
        writer.put(make_record())
    assert reader.records() == [make_record()]
    reader.close()


def test_file_that_is_not_a_database_raises_store_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are not the records you are looking for\n" * 100)
    with pytest.raises(StoreError, match="notes.db"):
        Store(f"sqlite:///{path}")


def test_bad_url_raises_store_error_naming_it() -> None:
    with pytest.raises(StoreError, match="nosuchdb://x"):
        Store("nosuchdb://x")


def test_plain_path_means_a_sqlite_file(tmp_path: Path) -> None:
    with Store(str(tmp_path / "sub" / "t.db")) as store:
        store.put(make_record())
        assert store.url == f"sqlite:///{tmp_path / 'sub' / 't.db'}"
    assert (tmp_path / "sub" / "t.db").exists()


def test_default_url_honours_TUNER_DB_and_XDG_CACHE_HOME(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_DB", "postgresql://tuner@db.example/tuner")
    assert default_url() == "postgresql://tuner@db.example/tuner"

    monkeypatch.delenv("TUNER_DB")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_url() == f"sqlite:///{tmp_path / 'xdg' / 'triton-tuner' / 'tuner.db'}"
    assert not (tmp_path / "xdg").exists()  # naming the default creates nothing: readers leave no trace

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_url() == f"sqlite:///{tmp_path / 'home' / '.cache' / 'triton-tuner' / 'tuner.db'}"

    monkeypatch.setenv("TUNER_DB", str(tmp_path / "plain.db"))
    assert default_url() == f"sqlite:///{tmp_path / 'plain.db'}"


def test_store_without_url_uses_default_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with Store() as store:
        store.put(make_record())
    assert (tmp_path / "triton-tuner" / "tuner.db").exists()


def test_record_speedup_is_baseline_over_winner() -> None:
    assert make_record(time_ms=0.5, cublas_ms=0.75).speedup == pytest.approx(1.5)


def test_record_rejects_naive_created_at_and_normalizes_to_utc() -> None:
    with pytest.raises(ValueError, match="timezone"):
        make_record(created_at=datetime(2025, 1, 1))
    east = timezone(timedelta(hours=9))
    record = make_record(created_at=datetime(2025, 1, 1, 9, tzinfo=east))
    assert record.created_at == datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert record.created_at.tzinfo == timezone.utc


def test_record_copies_its_config_and_makes_shapes_tuples() -> None:
    config = {"BLOCK_M": 64}
    record = make_record(config=config, shapes=[[16, 4096, 4096]])
    config["BLOCK_M"] = 128
    assert record.config == {"BLOCK_M": 64}
    assert record.shapes == ((16, 4096, 4096),)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.time_ms = 0.0  # type: ignore[misc]


@pytest.mark.sqlite_only
def test_writer_switches_sqlite_to_wal_so_readers_do_not_wait(db_url: str, tmp_path: Path) -> None:
    with Store(db_url) as store:
        store.put(make_record())
    holder = sqlite3.connect(tmp_path / "tuner.db", isolation_level=None)
    try:
        assert holder.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        holder.execute("BEGIN IMMEDIATE")  # another process mid-write holds the write lock
        holder.execute("DELETE FROM tuner_records")
        with Store.open_readonly(db_url) as reader:
            assert reader.records() == [make_record()]  # reads the last committed state at once
    finally:
        holder.execute("ROLLBACK")
        holder.close()
