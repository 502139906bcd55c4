"""Grouped problems whose keys run to kilobytes of poorly compressible text store and read back on every
backend: PostgreSQL refuses a btree index entry over about 2.7 KB (and any over 8 KB outright), so the key
must not be in one (schema 0004 keeps records unique by a hash of their key)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from db import Store, export_records, import_records
from db.recorded import ProblemKey, add_calls, recorded

from .conftest import make_long_grouped_record


@pytest.mark.parametrize("groups", [250, 600])  # ~4 KB: past btree's 2704 bytes; ~13 KB: past a page
def test_put_then_get_round_trips_a_long_incompressible_grouped_key(store: Store, groups: int) -> None:
    record = make_long_grouped_record(seed=7, groups=groups)
    assert len(record.problem_key) > 3000

    assert store.put(record) == "inserted"

    assert store.get(record.device_name, "grouped_matmul", record.problem_key) == record
    assert store.records(kernel="grouped_matmul") == [record]


def test_long_keys_that_differ_only_at_the_end_or_by_mode_are_separate_records(store: Store) -> None:
    first = make_long_grouped_record(seed=1)
    last_shape = (*first.shapes[:-1], (first.shapes[-1][0] + 1, *first.shapes[-1][1:]))
    second = make_long_grouped_record(seed=1, shapes=last_shape, problem_key=first.problem_key.rsplit("+", 1)[0]
                                      + "+" + "x".join(map(str, last_shape[-1])))
    eager = dataclasses.replace(first, mode="eager")

    assert store.put_many([first, second, eager]).inserted == 3

    assert store.get(first.device_name, "grouped_matmul", first.problem_key, "graph") == first
    assert store.get(first.device_name, "grouped_matmul", first.problem_key, "eager") == eager
    assert store.get(first.device_name, "grouped_matmul", second.problem_key) == second
    assert store.get(first.device_name, "grouped_matmul", first.problem_key + "+1x16x16") is None


def test_a_long_key_settles_conflicts_like_any_other(store: Store) -> None:
    slow = make_long_grouped_record(seed=3, time_ms=1000.0)
    fast = dataclasses.replace(slow, time_ms=500.0, tflops=slow.tflops * 2, trials=9)

    assert store.put(slow) == "inserted"
    assert store.put(fast) == "replaced"
    assert store.put(slow) == "kept"
    assert store.put(slow, on_conflict="replace") == "replaced"
    assert store.records() == [slow]
    assert store.delete(kernel="grouped_matmul") == 1 and store.records() == []


def test_an_export_with_long_keys_imports_into_a_fresh_database(store: Store, tmp_path: Path) -> None:
    records = [make_long_grouped_record(seed=seed) for seed in (4, 5)]
    store.put_many(records)
    path = tmp_path / "records.json"
    assert export_records(store, path) == 2

    with Store(f"sqlite:///{tmp_path / 'fresh.db'}") as fresh:
        assert import_records(fresh, path).inserted == 2
        assert fresh.records() == store.records()
    store.delete()
    summary = import_records(store, path)  # back into the same backend, PostgreSQL included
    assert summary.inserted == 2 and import_records(store, path).kept == 2
    assert sorted(store.records(), key=lambda r: r.problem_key) == sorted(records, key=lambda r: r.problem_key)


def test_a_recorded_long_key_counts_as_tuned_once_its_record_is_stored(store: Store) -> None:
    record = make_long_grouped_record(seed=6)
    key = ProblemKey(record.device_name, record.kernel, record.problem_key)
    add_calls(store, {key: (3, 1e9)})
    add_calls(store, {key: (2, 1e9)})
    assert [(p.key, p.calls) for p in recorded(store, untuned=True)] == [(key, 5)]

    store.put(record)

    assert recorded(store, untuned=True) == [] and recorded(store)[0].calls == 5
