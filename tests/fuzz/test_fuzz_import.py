"""Fuzzing the import validator and the problem-key parser: every input is accepted or refused with a
message; nothing else escapes, nothing hangs, and a refused import leaves the database as it was."""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from db import ImportValidationError, Record, Store, dump_document, import_records, load_document
from db._validate import FIELDS
from kernels import Problem

from .conftest import examples, time_limit

pytestmark = pytest.mark.fuzz

KERNELS = ("matmul", "grouped_matmul", "moe_matmul")
# JSON values, nested a little; numbers at the edges (huge, tiny, negative) as a forger would pick.
_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
            | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e-300, 1e300, 0, -1, 2**63])
            | st.text(max_size=20) | st.sampled_from(["../../etc", "h100", "fp16", "nt", "", "x" * 300]))
json_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def _valid_raw() -> dict[str, Any]:
    m, n, k = 16, 4096, 4096
    record = Record(device_name="NVIDIA H100 80GB HBM3", device_alias="h100", compute_capability="9.0",
                    sm_count=132, kernel="matmul", problem_key=f"fp16:nt:{m}x{n}x{k}", dtype="fp16",
                    layout="nt", shapes=((m, n, k),), config={"VARIANT": "cublas"}, time_ms=0.5,
                    tflops=2 * m * n * k / 0.5e-3 / 1e12, cublas_ms=0.5, triton_config=None, triton_ms=None,
                    torch_version="2.11.0", triton_version="3.6.0", cuda_version="13.0", trials=3,
                    created_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    return dump_document([record])


VALID = _valid_raw()


@st.composite
def documents(draw) -> Any:
    """A valid export with some fields replaced, added or removed, or any JSON at all."""
    if draw(st.integers(0, 4)) == 0:
        return draw(json_values.filter(lambda value: not isinstance(value, str)))  # a str names a file
    document = copy.deepcopy(VALID)
    raw = document["records"][0]
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["set", "drop", "envelope", "add"]))
        if action == "set":
            raw[draw(st.sampled_from(FIELDS))] = draw(json_values)
        elif action == "drop":
            raw.pop(draw(st.sampled_from(FIELDS)), None)
        elif action == "envelope":
            document[draw(st.sampled_from(["schema", "schema_version", "records"]))] = draw(json_values)
        else:
            raw[draw(st.text(max_size=10))] = draw(json_values)
    return document


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.db'}")
    store.put_many(load_document(VALID))
    return store


@settings(max_examples=examples(300))
@given(document=documents(), on_conflict=st.sampled_from(["faster", "replace", "keep", "error"]))
def test_import_accepts_or_refuses_every_document_and_a_refusal_changes_nothing(store, document, on_conflict) -> None:
    before = store.records()
    with time_limit(10):
        try:
            summary = import_records(store, document, on_conflict=on_conflict)
        except ImportValidationError as exc:
            assert exc.problems and str(exc)
            assert store.records() == before
            return
        except Exception as exc:  # noqa: BLE001 - only the conflict rule's refusal may leave otherwise
            assert on_conflict == "error" and "already stored" in str(exc), repr(exc)
            assert store.records() == before
            return
    assert summary.total == len(document["records"])


_keys = (st.text(max_size=40)
         | st.builds(lambda d, l, dims: f"{d}:{l}:{dims}",
                     st.sampled_from(["fp16", "bf16", "fp32", "int8", ""]), st.sampled_from(["nn", "nt", "tt", "x", ""]),
                     st.lists(st.builds(lambda a, b, c: f"{a}x{b}x{c}", *[st.integers(-3, 10**6) | st.text(max_size=3)] * 3),
                              min_size=0, max_size=4).map("+".join)))


@settings(max_examples=examples(500))
@given(kernel=st.sampled_from(KERNELS), key=_keys)
def test_problem_keys_parse_to_a_problem_that_round_trips_or_raise_value_error(kernel, key) -> None:
    with time_limit(5):
        try:
            problem = Problem.from_key(kernel, key)
        except ValueError as exc:
            assert str(exc)
            return
    assert Problem.from_key(kernel, problem.key) == problem
    assert all(d >= 0 for shape in problem.shapes for d in shape)
