"""The plausibility rules (db._plausible) and where they bite: import, Store.put, on-conflict "faster"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kernels
from db import (PEAKS, ImportValidationError, Store, dump_document, import_records, peak_of,
                plausibility_problems)
from db._plausible import UNKNOWN

from .conftest import make_record

SHIPPED = sorted((Path(kernels.__file__).parent / "tables").glob("*.json"))


def _forged(**changes) -> dict:
    raw = dump_document([make_record()])["records"][0]
    raw.update(changes)
    return raw


def test_a_record_that_agrees_with_itself_and_the_device_is_plausible() -> None:
    assert plausibility_problems(make_record()) == []


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_record_is_plausible(path: Path) -> None:
    records = json.loads(path.read_text())["records"]
    assert [plausibility_problems(raw) for raw in records] == [[] for _ in records]


def test_tflops_that_do_not_follow_from_the_time_are_implausible() -> None:
    [problem] = plausibility_problems(_forged(tflops=1e300))
    assert "tflops" in problem and "contradicts itself" in problem


def test_a_time_faster_than_the_devices_peak_is_implausible() -> None:
    # 16x4096x4096 fp16 moves 33.7 MB: at the H100's 3.35 TB/s that is 10 us, so 0.1 us is a forgery
    # even though its TFLOP/s agree with it.
    record = make_record(time_ms=1e-4)
    problems = plausibility_problems(record)
    assert len(problems) == 1 and "time_ms" in problems[0] and "H100" in problems[0]
    assert plausibility_problems(make_record(time_ms=1e-300, tflops=1e300))


def test_an_empty_experts_weights_are_not_counted_as_read() -> None:
    # A decode step of a 128-expert model: 8 rows routed to 8 experts, 120 experts empty. Measured on an H200 at
    # 0.033 ms (2026-11-28), where reading all 128 experts' weights would take 0.168 ms.
    shapes = ((1, 1536, 2048),) * 8 + ((0, 1536, 2048),) * 120
    key = "bf16:nt:" + "+".join(f"{m}x{n}x{k}" for m, n, k in shapes)
    decode = dict(kernel="moe_matmul", dtype="bf16", layout="nt", shapes=shapes, problem_key=key,
                  device_name="NVIDIA H200", device_alias="h200", config={}, triton_config=None, triton_ms=None)
    assert plausibility_problems(make_record(**decode, time_ms=0.0333, cublas_ms=0.0333)) == []
    # Still bounded by the weights of the experts that have rows: 8 x 6.3 MB at 4.8 TB/s is 10.5 us.
    [problem] = plausibility_problems(make_record(**decode, time_ms=0.0005, cublas_ms=0.0333))
    assert "time_ms" in problem and "H200" in problem


def test_an_unknown_gpu_gets_peaks_above_every_known_one() -> None:
    assert peak_of("Some Future GPU 9000") is UNKNOWN
    assert all(UNKNOWN.half_tflops > p.half_tflops and UNKNOWN.bandwidth_gbs > p.bandwidth_gbs for p in PEAKS)
    assert peak_of("NVIDIA H100 PCIe").bandwidth_gbs < peak_of("NVIDIA H100 80GB HBM3").bandwidth_gbs
    assert peak_of("NVIDIA A100-SXM4-80GB").pattern == "A100" and peak_of("NVIDIA L40S").pattern == "L40S"
    assert all(p.source for p in PEAKS)
    # Still bounded: 1e-300 ms on an unknown GPU is refused.
    assert plausibility_problems(make_record(device_name="Some Future GPU", time_ms=1e-300, tflops=1e300))


@pytest.mark.parametrize("changes, said", [
    ({"device_name": "x" * 5_000_000}, "device_name"),
    ({"device_alias": "../../etc"}, "device_alias"),
    ({"kernel": "Matmul; DROP TABLE"}, "kernel"),
    ({"compute_capability": "nine"}, "compute_capability"),
    ({"torch_version": "v" * 65}, "torch_version"),
    ({"sm_count": 10**9}, "sm_count"),
    ({"config": {"BLOCK_M": 2**40}}, "config"),
    ({"config": {f"P{i}": 1 for i in range(65)}}, "config"),
])
def test_names_and_sizes_out_of_bounds_are_implausible(changes, said) -> None:
    problems = plausibility_problems(_forged(**changes))
    assert problems and any(problem.startswith(said) for problem in problems), problems
    assert all(len(problem) < 400 for problem in problems), "a 5 MB value must not be echoed back"


def test_a_problem_of_ten_to_the_twelve_is_implausible() -> None:
    big = 10**12
    problems = plausibility_problems(_forged(shapes=[[big, big, big]], problem_key=f"fp16:nt:{big}x{big}x{big}"))
    assert problems and "dimension over" in problems[0]


def test_a_key_that_does_not_match_the_shapes_is_implausible() -> None:
    [problem] = plausibility_problems(_forged(problem_key="fp16:nt:16x4096x8192"))
    assert "does not match" in problem


def test_raw_fields_of_any_type_give_reasons_not_exceptions() -> None:
    for value in (None, 1, "x", [], {}, [[1, 2]], [["a", 1, 2]], float("nan")):
        assert plausibility_problems(_forged(shapes=value, time_ms=value, tflops=value, config=value))


def test_import_of_a_forged_record_is_refused_and_leaves_the_database_unchanged(store: Store) -> None:
    real = make_record()
    store.put(real)
    document = dump_document([real])
    document["records"][0].update(time_ms=1e-300, tflops=1e300)
    with pytest.raises(ImportValidationError, match="faster than"):
        import_records(store, document)
    assert store.records() == [real]


def test_put_refuses_an_implausible_record_under_every_conflict_rule(store: Store) -> None:
    real = make_record()
    store.put(real)
    for rule in ("faster", "replace", "keep"):
        with pytest.raises(ValueError, match="not plausible"):
            store.put(make_record(time_ms=1e-300, tflops=1e300), on_conflict=rule)
        with pytest.raises(ValueError, match="not plausible"):
            store.put_many([make_record(m=32), make_record(time_ms=1e-300)], on_conflict=rule)
    assert store.records() == [real]


def test_a_stored_implausible_record_loses_to_a_slower_plausible_one(store: Store) -> None:
    import sqlalchemy

    store.put(make_record())
    engine = sqlalchemy.create_engine(store.url)  # written behind the store's back, as before the rules
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("UPDATE tuner_records SET time_ms = 1e-300, tflops = 1e300"))
    engine.dispose()
    slower = make_record(time_ms=0.9)
    assert store.put(slower, on_conflict="faster") == "replaced"
    assert store.records() == [slower]
