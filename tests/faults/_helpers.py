"""What the fault tests share: records in numbered batches, the child process, and checks of what a
database holds afterwards (on SQLite and on PostgreSQL alike)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import create_engine, inspect, text

from db import Record, Store, dump_document
from db import _migrate

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("child.py")
OLD_DB = ROOT / "tests" / "data" / "v1_tuner.db"
ROUNDS = int(os.environ.get("TUNER_FAULT_ROUNDS", "6"))
PER_BATCH = 20
H100 = {"device_name": "NVIDIA H100 80GB HBM3", "device_alias": "h100", "compute_capability": "9.0",
        "sm_count": 132}


def record(batch: int, index: int) -> Record:
    m, n, k = batch + 1, 16 * (index + 1), 64
    return Record(**H100, kernel="matmul", problem_key=f"fp16:nn:{m}x{n}x{k}", dtype="fp16", layout="nn",
                  shapes=((m, n, k),), config={"VARIANT": "cublas"}, time_ms=0.01,
                  tflops=2 * m * n * k / 1e-5 / 1e12, cublas_ms=0.01, triton_config=None, triton_ms=None,
                  torch_version="2.11.0", triton_version="3.6.0", cuda_version="13.0", trials=1,
                  created_at=datetime(2026, 1, 1, tzinfo=timezone.utc), mode="graph")


def batch_file(folder: Path, batch: int, size: int = PER_BATCH) -> Path:
    path = folder / f"batch{batch}.json"
    path.write_text(json.dumps(dump_document([record(batch, i) for i in range(size)])))
    return path


def child_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAULT_", "TUNER_"))}
    env.update(PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", XDG_CACHE_HOME=str(tmp / "cache"),
               TRITON_CACHE_DIR=str(tmp / "triton"), **extra)
    return env


def run_child(tmp: Path, *args: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHILD), *args], env=child_env(tmp, **extra), capture_output=True,
                          text=True, timeout=timeout)


def batches(url: str) -> dict[int, int]:
    """How many records of each batch the database holds (a batch is its M - 1)."""
    with Store(url, create=False) as store:
        records = store.records() if store.exists() else []
    counts: dict[int, int] = {}
    for found in records:
        counts[found.shapes[0][0] - 1] = counts.get(found.shapes[0][0] - 1, 0) + 1
    return counts


def intact(url: str) -> None:
    """SQLite's own check of every page and index finds nothing wrong (PostgreSQL checks its own)."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def one_line_error(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len([line for line in lines if line.startswith("error:")]) == 1, done.stderr
    return done.stderr


def scalar(url: str, query: str) -> object:
    """One value read straight through SQLAlchemy, beside the store (None where the table is missing)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            table = query.split(" FROM ")[1].split()[0]
            if not inspect(connection).has_table(table):
                return None
            return connection.execute(text(query)).scalar()
    finally:
        engine.dispose()


def old_database(url: str) -> None:
    """Make ``url`` (an empty database) what the release before modes left: schema 0001 without a
    version table, holding tests/data/v1_tuner.db's 69 records."""
    from alembic import command

    with sqlite3.connect(OLD_DB) as source:
        source.row_factory = sqlite3.Row
        rows = [dict(row) for row in source.execute("SELECT * FROM tuner_records")]
    for row in rows:
        row["created_at"] = datetime.fromisoformat(row["created_at"]).replace(tzinfo=timezone.utc)
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            config = _migrate._config()
            config.attributes["connection"] = connection
            command.upgrade(config, _migrate.BASELINE)
            columns = ", ".join(rows[0])
            connection.execute(text(f"INSERT INTO tuner_records ({columns}) VALUES "
                                    f"({', '.join(':' + name for name in rows[0])})"), rows)
            connection.execute(text(f"DROP TABLE {_migrate.VERSION_TABLE}"))
    finally:
        engine.dispose()
