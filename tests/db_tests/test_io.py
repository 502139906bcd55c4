from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from db import (SCHEMA_VERSION, ImportValidationError, Record, Store, dump_document, export_records,
                import_records, load_document)

from .conftest import A100, make_record

KERNELS = ("matmul", "grouped_matmul")
BLOCK_SIZES = (16, 32, 64, 128, 256)


def strict_validator(record: Record) -> None:
    """Stands in for the tuner's check: known kernel, config inside that kernel's space."""
    if record.kernel not in KERNELS:
        raise ValueError(f"unknown kernel {record.kernel!r}; known kernels are {', '.join(KERNELS)}")
    block_m = record.config.get("BLOCK_M")
    if block_m is not None and block_m not in BLOCK_SIZES:
        raise ValueError(f"config BLOCK_M={block_m} is outside the {record.kernel} search space")


def sample_records() -> list[Record]:
    return [make_record(m=1), make_record(m=2, kernel="grouped_matmul"), make_record(m=1, **A100)]


def write_json(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document))
    return path


def test_export_import_round_trip_into_fresh_database(store: Store, tmp_path: Path) -> None:
    store.put_many(sample_records())
    path = tmp_path / "out" / "records.json"

    assert export_records(store, path) == 3
    with Store(f"sqlite:///{tmp_path / 'fresh.db'}") as fresh:
        summary = import_records(fresh, path, validate=strict_validator)
        assert (summary.inserted, summary.replaced, summary.kept) == (3, 0, 0)
        assert fresh.records() == store.records()
    assert list(tmp_path.joinpath("out").iterdir()) == [path]  # no temporary file left behind


def test_export_filters_by_device_and_kernel(store: Store, tmp_path: Path) -> None:
    store.put_many(sample_records())
    assert export_records(store, tmp_path / "h100.json", device="h100") == 2
    assert export_records(store, tmp_path / "mm.json", device="h100", kernel="matmul") == 1
    document = json.loads((tmp_path / "h100.json").read_text())
    assert {r["device_alias"] for r in document["records"]} == {"h100"}
    assert document["devices"] == [{"name": "NVIDIA H100 80GB HBM3", "alias": "h100",
                                    "compute_capability": "9.0", "sm_count": 132}]


def test_export_is_stable_apart_from_its_timestamp(store: Store, tmp_path: Path) -> None:
    store.put_many(sample_records())
    export_records(store, tmp_path / "a.json")
    export_records(store, tmp_path / "b.json")
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    assert a["schema_version"] == SCHEMA_VERSION == 2
    assert {**a, "exported_at": ""} == {**b, "exported_at": ""}


def test_import_settles_conflicts_like_put(store: Store, tmp_path: Path) -> None:
    store.put(make_record(m=1, time_ms=0.5))
    store.put(make_record(m=2, time_ms=0.1))
    path = write_json(tmp_path / "in.json", dump_document(
        [make_record(m=1, time_ms=0.2), make_record(m=2, time_ms=0.3), make_record(m=3)]))

    summary = import_records(store, path)

    assert (summary.inserted, summary.replaced, summary.kept) == (1, 1, 1)
    assert [r.time_ms for r in store.records()] == [0.2, 0.1, 0.5]


def test_import_with_on_conflict_error_writes_nothing(store: Store, tmp_path: Path) -> None:
    store.put(make_record(m=2))
    path = write_json(tmp_path / "in.json", dump_document([make_record(m=1), make_record(m=2)]))
    with pytest.raises(Exception, match="--on-conflict"):
        import_records(store, path, on_conflict="error")
    assert [r.problem_key for r in store.records()] == ["fp16:nt:2x4096x4096"]


def test_load_document_accepts_int_for_float_fields_and_a_parsed_object() -> None:
    document = dump_document([make_record(time_ms=2.0)])
    document["records"][0]["time_ms"] = 2
    [record] = load_document(document)
    assert record.time_ms == 2.0 and isinstance(record.time_ms, float)


def _set(field: str, value: Any) -> Callable[[dict], None]:
    def mutate(document: dict) -> None:
        document["records"][1][field] = value
    return mutate


def _drop(field: str) -> Callable[[dict], None]:
    def mutate(document: dict) -> None:
        del document["records"][1][field]
    return mutate


def _top(field: str, value: Any) -> Callable[[dict], None]:
    def mutate(document: dict) -> None:
        document[field] = value
    return mutate


def _duplicate(document: dict) -> None:
    document["records"].append(copy.deepcopy(document["records"][0]))


BREAKAGES: dict[str, tuple[Callable[[dict], None] | str, str]] = {
    "not_json": ("{ this is not json", "not JSON"),
    "not_an_object": ("[1, 2, 3]", "not an object"),
    "wrong_schema": (_top("schema", "optuna/study"), "not a records export"),
    "schema_too_new": (_top("schema_version", SCHEMA_VERSION + 1), "upgrade triton-tuner"),
    "schema_version_missing": (lambda d: d.pop("schema_version"), "'schema_version' is None"),
    "records_not_a_list": (_top("records", {"a": 1}), "'records' must be a list"),
    "record_not_an_object": (lambda d: d["records"].append("matmul"), "record 3: must be an object"),
    "missing_field": (_drop("time_ms"), "missing field 'time_ms'"),
    "unknown_field": (_set("time_m", 0.1), "unknown field 'time_m'"),
    "string_for_number": (_set("time_ms", "0.5"), "time_ms must be a finite number"),
    "bool_for_int": (_set("sm_count", True), "sm_count must be an integer"),
    "float_for_int": (_set("trials", 6.5), "trials must be an integer"),
    "shape_of_two": (_set("shapes", [[1, 2]]), "shapes must be a non-empty list of [M, N, K]"),
    "negative_shape": (_set("shapes", [[1, -2, 3]]), "shapes must be"),
    "no_shapes": (_set("shapes", []), "shapes must be"),
    "nan_time": (_set("time_ms", float("nan")), "time_ms must be a finite number >= 0, got nan"),
    "negative_baseline": (_set("cublas_ms", -1.0), "cublas_ms must be a finite number >= 0"),
    "float_in_config": (_set("config", {"BLOCK_M": 1.5}), "'BLOCK_M': 1.5"),
    "config_not_object": (_set("config", "BLOCK_M: 64"), "config must be a non-empty object"),
    "bad_dtype": (_set("dtype", "fp8"), "dtype must be one of fp16, bf16, fp32"),
    "bad_layout": (_set("layout", "nx"), "layout must be one of nn, nt, tn, tt"),
    "bad_created_at": (_set("created_at", "yesterday"), "created_at must be an ISO 8601 time"),
    "naive_created_at": (_set("created_at", "2025-01-01T00:00:00"), "has no zone"),
    "empty_kernel": (_set("kernel", ""), "kernel must be a non-empty string"),
    "duplicate_keys": (_duplicate, "same device_name, kernel, problem_key and mode as record 0"),
    "validator_rejects_kernel": (_set("kernel", "conv2d"), "unknown kernel 'conv2d'"),
    "validator_rejects_config": (_set("config", {"BLOCK_M": 7}), "BLOCK_M=7 is outside"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_import_of_broken_file_leaves_database_unchanged(store: Store, tmp_path: Path,
                                                         breakage: str) -> None:
    store.put(make_record(m=1, time_ms=9.0))  # every good record in the file would replace this
    before = store.records()
    change, expected = BREAKAGES[breakage]
    document = dump_document([make_record(m=1), make_record(m=2), make_record(m=3)])
    path = tmp_path / "broken.json"
    if isinstance(change, str):
        path.write_text(change)
    else:
        change(document)
        write_json(path, document)

    with pytest.raises(ImportValidationError) as caught:
        import_records(store, path, validate=strict_validator)

    assert expected in str(caught.value)
    assert str(path) in str(caught.value) and "nothing was imported" in str(caught.value)
    assert store.records() == before


def test_error_lists_every_problem() -> None:
    document = dump_document([make_record(m=m) for m in range(1, 5)])
    records = document["records"]
    del records[0]["time_ms"]
    records[1]["dtype"], records[1]["sm_count"] = "fp8", -1
    records[2]["kernel"] = "conv2d"
    records[3]["shapes"] = [[4, 4096]]

    with pytest.raises(ImportValidationError) as caught:
        load_document(document, validate=strict_validator)

    message = str(caught.value)
    assert len(caught.value.problems) == 5
    for expected in ("record 0 (h100 matmul fp16:nt:1x4096x4096): missing field 'time_ms'",
                     "record 1 (h100 matmul fp16:nt:2x4096x4096): dtype must be one of",
                     "record 1 (h100 matmul fp16:nt:2x4096x4096): sm_count must be an integer >= 0",
                     "record 2 (h100 conv2d fp16:nt:3x4096x4096): unknown kernel 'conv2d'",
                     "record 3 (h100 matmul fp16:nt:4x4096x4096): shapes must be"):
        assert expected in message
    assert message.rstrip().endswith("then import again.")


def test_error_message_shows_twenty_problems_and_counts_the_rest() -> None:
    document = dump_document([make_record(m=m) for m in range(1, 31)])
    for raw in document["records"]:
        raw["time_ms"] = -1.0

    with pytest.raises(ImportValidationError) as caught:
        load_document(document)

    assert len(caught.value.problems) == 30
    assert "... and 10 more" in str(caught.value)
    assert "record 19 " in str(caught.value) and "record 20 " not in str(caught.value)


def test_load_document_of_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere.json does not exist"):
        load_document(tmp_path / "nowhere.json")


def test_import_rejects_invalid_on_conflict_before_reading(store: Store, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="faster, replace, keep, error"):
        import_records(store, tmp_path / "nowhere.json", on_conflict="newest")


def test_every_record_field_is_checked_on_import() -> None:
    from db import _validate

    assert set(_validate._CHECKS) == set(_validate.FIELDS)
