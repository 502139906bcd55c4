"""Faults injected into real processes and real SQLite files: nothing finished is lost, and the error
is one clear line (issue 15; docs/RELIABILITY.md has the figures).

Each test starts ``tests/faults/child.py`` and kills it, fills its disk (RLIMIT_FSIZE), takes its
permissions away, locks its database, or corrupts its file. ``TUNER_FAULT_ROUNDS`` (default 6) sets how
many kill points the randomized tests try; CI runs the default, `TUNER_FAULT_ROUNDS=100` the long run.
The tests take the ``db_url`` fixture so that the storage ones can be parametrized over PostgreSQL.
"""

from __future__ import annotations

from db import _migrate

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from db import Record, Store, dump_document

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("child.py")
OLD_DB = ROOT / "tests" / "data" / "v1_tuner.db"
ROUNDS = int(os.environ.get("TUNER_FAULT_ROUNDS", "6"))
PER_BATCH = 20
H100 = {"device_name": "NVIDIA H100 80GB HBM3", "device_alias": "h100", "compute_capability": "9.0",
        "sm_count": 132}


def _record(batch: int, index: int) -> Record:
    m, n, k = batch + 1, 16 * (index + 1), 64
    return Record(**H100, kernel="matmul", problem_key=f"fp16:nn:{m}x{n}x{k}", dtype="fp16", layout="nn",
                  shapes=((m, n, k),), config={"VARIANT": "cublas"}, time_ms=0.01,
                  tflops=2 * m * n * k / 1e-5 / 1e12, cublas_ms=0.01, triton_config=None, triton_ms=None,
                  torch_version="2.11.0", triton_version="3.6.0", cuda_version="13.0", trials=1,
                  created_at=datetime(2026, 1, 1, tzinfo=timezone.utc), mode="graph")


def _batch_file(folder: Path, batch: int, size: int = PER_BATCH) -> Path:
    path = folder / f"batch{batch}.json"
    path.write_text(json.dumps(dump_document([_record(batch, i) for i in range(size)])))
    return path


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAULT_", "TUNER_"))}
    env.update(PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", XDG_CACHE_HOME=str(tmp / "cache"),
               TRITON_CACHE_DIR=str(tmp / "triton"), **extra)
    return env


def _run(tmp: Path, *args: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHILD), *args], env=_env(tmp, **extra), capture_output=True,
                          text=True, timeout=timeout)


def _batches(url: str) -> dict[int, int]:
    """How many records of each batch the database holds (a batch is its M - 1)."""
    with Store(url, create=False) as store:
        records = store.records() if store.exists() else []
    counts: dict[int, int] = {}
    for record in records:
        counts[record.shapes[0][0] - 1] = counts.get(record.shapes[0][0] - 1, 0) + 1
    return counts


def _intact(url: str) -> None:
    """SQLite's own check of every page and index finds nothing wrong."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len([line for line in lines if line.startswith("error:")]) == 1, done.stderr
    return done.stderr


# ------------------------------------------------------------------------------------------ SIGKILL


def test_sigkill_at_an_imports_commit_loses_no_finished_import(db_url: str, tmp_path: Path) -> None:
    for batch in range(ROUNDS):
        path = _batch_file(tmp_path, batch)
        killed = _run(tmp_path, "import", db_url, str(path), FAULT_KILL_COMMIT="INSERT INTO tuner_records")
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert _batches(db_url) == {b: PER_BATCH for b in range(batch)}, "the killed import left nothing"
        done = _run(tmp_path, "import", db_url, str(path))
        assert done.returncode == 0, done.stderr
        _intact(db_url)
    assert _batches(db_url) == {b: PER_BATCH for b in range(ROUNDS)}


def test_sigkill_at_random_times_during_imports_keeps_every_finished_one_whole(db_url: str, tmp_path: Path) -> None:
    rng = random.Random(15)
    files = [_batch_file(tmp_path, batch) for batch in range(40)]
    finished: set[int] = set()
    for _ in range(ROUNDS):
        process = subprocess.Popen([sys.executable, str(CHILD), "import", db_url, *map(str, files)],
                                   env=_env(tmp_path), stdout=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0.4, 1.5))  # the child needs ~0.4 s to start, then imports a batch every few ms
        process.send_signal(signal.SIGKILL)
        out, _ = process.communicate(timeout=60)
        finished |= {files.index(Path(line.split()[1])) for line in out.splitlines() if line.startswith("done")}
        counts = _batches(db_url)
        assert set(counts.values()) <= {PER_BATCH}, "an import is all or nothing"
        assert finished <= set(counts), "an import reported done was lost"
        _intact(db_url)


def test_sigkill_at_each_statement_of_a_migration_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    shutil.copy(OLD_DB, path)
    url = f"sqlite:///{path}"
    before = sorted((r.kernel, r.problem_key, r.time_ms) for r in Store(url, create=False).records())
    for point in range(1, 60):
        done = _run(tmp_path, "open", url, FAULT_KILL_SQL=rf"^\s*(CREATE|INSERT|DROP|ALTER|UPDATE):{point}")
        _intact(url)
        now = sorted((r.kernel, r.problem_key, r.time_ms) for r in Store(url, create=False).records())
        assert now == before, f"killed at statement {point} of the migration"
        if done.returncode == 0:
            break
        assert done.returncode == -signal.SIGKILL, done.stderr
    else:
        pytest.fail("the migration never finished")
    assert point > 3, "the kill points must land inside the migration"
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT version_num FROM tuner_alembic_version").fetchone()[0] == _migrate.head()


@pytest.mark.slow
def test_sigkill_at_a_searchs_winner_commit_keeps_its_trials_and_resumes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'search.db'}"
    search = ("cli", "search", "--device", "cpu", "--shape", "16x32x32", "--trials", "3", "--seed", "0",
              "--db", url)
    killed = _run(tmp_path, *search, FAULT_KILL_COMMIT="INSERT INTO tuner_records")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _batches(url) == {}
    finished = _complete_trials(url)
    assert finished >= 3, "the trials finished before the kill are in the study"
    done = _run(tmp_path, *search)
    assert done.returncode == 0, done.stderr
    assert _complete_trials(url) == finished, "the resumed search redid no finished trial"
    assert len(Store(url, create=False).records()) == 2  # the winner of each mode
    _intact(url)


def _complete_trials(url: str) -> int:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        return connection.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]


# ------------------------------------------------------------------------------------ full disk


def test_a_full_disk_fails_the_import_in_one_line_and_keeps_what_was_there(db_url: str, tmp_path: Path) -> None:
    assert _run(tmp_path, "import", db_url, str(_batch_file(tmp_path, 0))).returncode == 0
    big = _batch_file(tmp_path, 1, size=3000)
    size = Path(db_url.removeprefix("sqlite:///")).stat().st_size
    full = _run(tmp_path, "cli", "import", str(big), "--db", db_url, FAULT_FSIZE=str(size + 32 * 1024))
    assert "could not be written" in _one_line_error(full)
    assert _batches(db_url) == {0: PER_BATCH}
    _intact(db_url)
    assert _run(tmp_path, "cli", "import", str(big), "--db", db_url).returncode == 0  # with room, it goes in
    assert _batches(db_url) == {0: PER_BATCH, 1: 3000}


# --------------------------------------------------------------------------- permissions, locks


# Root ignores file permissions through these capabilities; dropped from the bounding set before exec,
# the child (still root, still able to read the checkout) obeys them like any user (capabilities(7)).
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_FOWNER = 1, 2, 3
_PR_CAPBSET_DROP = 24


def _obeying_permissions() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_FOWNER):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")


def _read_only_case(folder: Path, what: str) -> str:
    """A database of batch 0 in ``folder`` that may not be changed: its file (mode 0444) or its folder (0555)."""
    db = folder / "ro.db"
    url = f"sqlite:///{db}"
    with Store(url) as store:
        store.put_many([_record(0, i) for i in range(PER_BATCH)])
    if what == "file":
        db.chmod(0o444)
    else:
        folder.chmod(0o555)
    return url


@pytest.mark.parametrize("what", ["file", "dir"])
def test_a_read_only_database_refuses_writes_in_one_line_and_keeps_its_records(what: str, tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    url = _read_only_case(folder, what)
    path = _batch_file(tmp_path, 1)
    before = (folder / "ro.db").read_bytes()
    try:
        refused = subprocess.run([sys.executable, str(CHILD), "cli", "import", str(path), "--db", url],
                                 env=_env(tmp_path), capture_output=True, text=True, timeout=300,
                                 preexec_fn=_obeying_permissions if os.getuid() == 0 else None)
    except subprocess.SubprocessError as exc:  # the preexec_fn failed: no CAP_SETPCAP to drop with
        pytest.skip(f"cannot make root obey file permissions here ({exc}); run as a normal user")
    finally:
        folder.chmod(0o755)
    err = _one_line_error(refused)
    assert "readonly" in err or "read-only" in err or "unable to open" in err, err
    assert (folder / "ro.db").read_bytes() == before
    assert _batches(url) == {0: PER_BATCH}
    listed = _run(tmp_path, "cli", "list", "--db", url)  # reading still works
    assert listed.returncode == 0 and listed.stdout.count("h100") == PER_BATCH, listed.stderr


def test_a_database_locked_past_the_busy_timeout_is_one_line_and_loses_nothing(db_url: str, tmp_path: Path) -> None:
    assert _run(tmp_path, "import", db_url, str(_batch_file(tmp_path, 0))).returncode == 0
    holder = subprocess.Popen([sys.executable, str(CHILD), "hold-lock", db_url.removeprefix("sqlite:///"), "120"],
                              env=_env(tmp_path), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        path = _batch_file(tmp_path, 1)
        started = time.monotonic()
        waited = _run(tmp_path, "cli", "import", str(path), "--db", db_url, TUNER_SQLITE_BUSY_TIMEOUT_S="0.2")
        assert "locked" in _one_line_error(waited)
        assert time.monotonic() - started < 60
    finally:
        holder.kill()
        holder.wait()
    assert _batches(db_url) == {0: PER_BATCH}
    assert _run(tmp_path, "import", db_url, str(path)).returncode == 0  # the lock gone, it goes in
    assert _batches(db_url) == {0: PER_BATCH, 1: PER_BATCH}


# ------------------------------------------------------------------------------------ corruption


def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # garbage over every page but the first (the header and the schema)
        page = int.from_bytes(data[16:18], "big") or 65536
        noise = random.Random(15).randbytes(len(data) - page)
        path.write_bytes(bytes(data[:page]) + noise)


@pytest.mark.parametrize("how", ["truncated", "garbage-pages"])
def test_a_corrupt_database_is_one_line_for_readers_and_writers_and_is_not_written(how: str, tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    url = f"sqlite:///{path}"
    with Store(url) as store:
        store.put_many([_record(b, i) for b in range(10) for i in range(PER_BATCH)])
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _corrupt(path, how)
    before = path.read_bytes()
    listed = _run(tmp_path, "cli", "list", "--db", url)
    assert "damaged" in _one_line_error(listed)
    imported = _run(tmp_path, "cli", "import", str(_batch_file(tmp_path, 20)), "--db", url)
    assert "damaged" in _one_line_error(imported)
    assert path.read_bytes() == before
