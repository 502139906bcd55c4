"""Shared helpers for the db tests: a record factory and stores on real SQLite files."""

from __future__ import annotations

import random
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

# The project is not installed; make `import db` work under a bare `pytest` as under `python -m pytest`.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from db import Record, Store  # noqa: E402

H100 = {"device_name": "NVIDIA H100 80GB HBM3", "device_alias": "h100",
        "compute_capability": "9.0", "sm_count": 132}
A100 = {"device_name": "NVIDIA A100-SXM4-80GB", "device_alias": "a100",
        "compute_capability": "8.0", "sm_count": 108}
TILED = {"VARIANT": "tiled", "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_SIZE_M": 8,
         "num_warps": 4, "num_stages": 3}


def make_record(m: int = 16, n: int = 4096, k: int = 4096, **changes: Any) -> Record:
    """A plausible H100 matmul record for the (m, n, k) problem; ``changes`` override any field."""
    dtype, layout = changes.get("dtype", "fp16"), changes.get("layout", "nt")
    values: dict[str, Any] = {
        **H100, "kernel": "matmul", "problem_key": f"{dtype}:{layout}:{m}x{n}x{k}",
        "dtype": dtype, "layout": layout, "shapes": ((m, n, k),), "config": TILED,
        "time_ms": 0.5, "tflops": 2 * m * n * k / 0.5e-3 / 1e12, "cublas_ms": 0.6,
        "triton_config": TILED, "triton_ms": 0.5, "torch_version": "2.11.0",
        "triton_version": "3.6.0", "cuda_version": "13.0", "trials": 64,
        "created_at": datetime(2025, 1, 31, 12, 0, 0, 123456, tzinfo=timezone.utc),
    }
    values.update(changes)
    if "tflops" not in changes:  # the record must agree with itself (db.plausibility_problems)
        values["tflops"] = sum(2 * a * b * c for a, b, c in values["shapes"]) / (values["time_ms"] * 1e-3) / 1e12
    return Record(**values)


def make_long_grouped_record(seed: int = 0, groups: int = 600, **changes: Any) -> Record:
    """A plausible grouped_matmul record whose key lists ``groups`` distinct random shapes: over 8 KB
    of text that compresses poorly, past what a PostgreSQL btree index entry holds (about 2.7 KB)."""
    rng = random.Random(seed)
    shapes: set[tuple[int, int, int]] = set()
    while len(shapes) < groups:
        shapes.add((rng.randint(1, 8192), rng.randint(16, 8192), rng.randint(16, 8192)))
    ordered = tuple(sorted(shapes))
    key = "fp16:nn:" + "+".join(f"{m}x{n}x{k}" for m, n, k in ordered)
    values: dict[str, Any] = {"kernel": "grouped_matmul", "problem_key": key, "layout": "nn", "shapes": ordered,
                              "config": {"VARIANT": "cublas"}, "time_ms": 1000.0, "cublas_ms": 1000.0,
                              "triton_config": None, "triton_ms": None}
    return make_record(**{**values, **changes})


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store(db_url) as opened:
        yield opened


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every db test runs on a real SQLite file and on a real PostgreSQL database (tests marked
    ``sqlite_only`` check SQLite's own behaviour and run on SQLite alone)."""
    if request.param == "postgresql":
        if request.node.get_closest_marker("sqlite_only"):
            pytest.skip("checks SQLite-specific behaviour")
        return request.getfixturevalue("pg_url")
    return f"sqlite:///{tmp_path / 'tuner.db'}"


def copy_of(path: Path, tmp_path: Path) -> Path:
    """A copy of a committed database file to test on: the committed one must stay as an older version wrote it."""
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    return copy


def record_rows(path: Path, columns: str) -> list[tuple]:
    """``columns`` of every row of a SQLite file's records table, read with sqlite3 (not our store), sorted."""
    with sqlite3.connect(path) as connection:
        return sorted(connection.execute(f"SELECT {columns} FROM tuner_records").fetchall())
