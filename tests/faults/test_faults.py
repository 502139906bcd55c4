"""Faults injected into real processes and real databases: nothing finished is lost, and the error
is one clear line (issue 15; docs/RELIABILITY.md has the figures).

Each test starts ``tests/faults/child.py`` and kills it, fills its disk (RLIMIT_FSIZE), takes its
permissions away, locks its database, or corrupts its file. ``TUNER_FAULT_ROUNDS`` (default 6) sets how
many kill points the randomized tests try; CI runs the default, `TUNER_FAULT_ROUNDS=100` the long run.
The storage faults run on SQLite and on PostgreSQL (``db_url``, tests/faults/conftest.py); the ones
about SQLite's files and locks are ``sqlite_only``. Faults of the server itself are in
test_server_faults.py.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from db import Store
from db import _migrate
from tests.faults._helpers import (CHILD, OLD_DB, PER_BATCH, ROUNDS, batch_file, batches, child_env, intact,
                                   old_database, one_line_error, record, run_child, scalar)

pytestmark = pytest.mark.faults


# ------------------------------------------------------------------------------------------ SIGKILL


def test_sigkill_at_an_imports_commit_loses_no_finished_import(db_url: str, tmp_path: Path) -> None:
    for batch in range(ROUNDS):
        path = batch_file(tmp_path, batch)
        killed = run_child(tmp_path, "import", db_url, str(path), FAULT_KILL_COMMIT="INSERT INTO tuner_records")
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert batches(db_url) == {b: PER_BATCH for b in range(batch)}, "the killed import left nothing"
        done = run_child(tmp_path, "import", db_url, str(path))
        assert done.returncode == 0, done.stderr
        intact(db_url)
    assert batches(db_url) == {b: PER_BATCH for b in range(ROUNDS)}


def test_sigkill_at_random_times_during_imports_keeps_every_finished_one_whole(db_url: str, tmp_path: Path) -> None:
    rng = random.Random(15)
    files = [batch_file(tmp_path, batch) for batch in range(40)]
    finished: set[int] = set()
    for _ in range(ROUNDS):
        process = subprocess.Popen([sys.executable, str(CHILD), "import", db_url, *map(str, files)],
                                   env=child_env(tmp_path), stdout=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0.4, 1.5))  # the child needs ~0.4 s to start, then imports a batch every few ms
        process.send_signal(signal.SIGKILL)
        out, _ = process.communicate(timeout=60)
        finished |= {files.index(Path(line.split()[1])) for line in out.splitlines() if line.startswith("done")}
        counts = batches(db_url)
        assert set(counts.values()) <= {PER_BATCH}, "an import is all or nothing"
        assert finished <= set(counts), "an import reported done was lost"
        intact(db_url)


def _old_url(db_url: str, tmp_path: Path) -> str:
    """A database of schema 0001 with 69 records: on SQLite the file that release wrote, on PostgreSQL
    the same records in the same tables."""
    if db_url.startswith("sqlite:///"):
        shutil.copy(OLD_DB, db_url.removeprefix("sqlite:///"))
    else:
        old_database(db_url)
    return db_url


def _records_of(url: str) -> list[tuple]:
    return sorted((r.kernel, r.problem_key, r.time_ms) for r in Store(url, create=False).records())


def _revision(url: str) -> object:
    return scalar(url, f"SELECT version_num FROM {_migrate.VERSION_TABLE}")


def test_sigkill_at_each_statement_of_a_migration_loses_nothing(db_url: str, tmp_path: Path) -> None:
    url = _old_url(db_url, tmp_path)
    before = _records_of(url)
    assert len(before) == 69
    # At the migration's COMMIT (after every statement ran): the old schema and all its records stay.
    killed = run_child(tmp_path, "open", url, FAULT_KILL_COMMIT="ALTER TABLE")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _revision(url) is None and _records_of(url) == before
    for point in range(1, 60):
        done = run_child(tmp_path, "open", url, FAULT_KILL_SQL=rf"^\s*(CREATE|INSERT|DROP|ALTER|UPDATE):{point}")
        intact(url)
        assert _records_of(url) == before, f"killed at statement {point} of the migration"
        if done.returncode == 0:
            break
        assert done.returncode == -signal.SIGKILL, done.stderr
        assert _revision(url) is None, f"killed at statement {point}, yet the schema moved on"
    else:
        pytest.fail("the migration never finished")
    assert point > 3, "the kill points must land inside the migration"
    assert _revision(url) == _migrate.head()


@pytest.mark.slow
def test_sigkill_at_a_searchs_winner_commit_keeps_its_trials_and_resumes(db_url: str, tmp_path: Path) -> None:
    # --lease 2: the rerun takes the killed run's job over once its lease has run out (60 s by default).
    search = ("cli", "search", "--device", "cpu", "--shape", "16x32x32", "--trials", "3", "--seed", "0",
              "--db", db_url, "--lease", "2")
    killed = run_child(tmp_path, *search, FAULT_KILL_COMMIT="INSERT INTO tuner_records")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert batches(db_url) == {}
    finished = _complete_trials(db_url)
    assert finished >= 3, "the trials finished before the kill are in the study"
    done = run_child(tmp_path, *search)
    assert done.returncode == 0, done.stderr
    assert _complete_trials(db_url) == finished, "the resumed search redid no finished trial"
    assert len(Store(db_url, create=False).records()) == 2  # the winner of each mode
    intact(db_url)


def _complete_trials(url: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM trials WHERE state = 'COMPLETE'"))


# ------------------------------------------------------------------------------------ full disk


@pytest.mark.sqlite_only
def test_a_full_disk_fails_the_import_in_one_line_and_keeps_what_was_there(db_url: str, tmp_path: Path) -> None:
    assert run_child(tmp_path, "import", db_url, str(batch_file(tmp_path, 0))).returncode == 0
    big = batch_file(tmp_path, 1, size=3000)
    size = Path(db_url.removeprefix("sqlite:///")).stat().st_size
    full = run_child(tmp_path, "cli", "import", str(big), "--db", db_url, FAULT_FSIZE=str(size + 32 * 1024))
    assert "could not be written" in one_line_error(full)
    assert batches(db_url) == {0: PER_BATCH}
    intact(db_url)
    assert run_child(tmp_path, "cli", "import", str(big), "--db", db_url).returncode == 0  # with room, it goes in
    assert batches(db_url) == {0: PER_BATCH, 1: 3000}


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
        store.put_many([record(0, i) for i in range(PER_BATCH)])
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
    path = batch_file(tmp_path, 1)
    before = (folder / "ro.db").read_bytes()
    try:
        refused = subprocess.run([sys.executable, str(CHILD), "cli", "import", str(path), "--db", url],
                                 env=child_env(tmp_path), capture_output=True, text=True, timeout=300,
                                 preexec_fn=_obeying_permissions if os.getuid() == 0 else None)
    except subprocess.SubprocessError as exc:  # the preexec_fn failed: no CAP_SETPCAP to drop with
        pytest.skip(f"cannot make root obey file permissions here ({exc}); run as a normal user")
    finally:
        folder.chmod(0o755)
    err = one_line_error(refused)
    assert "readonly" in err or "read-only" in err or "unable to open" in err, err
    assert (folder / "ro.db").read_bytes() == before
    assert batches(url) == {0: PER_BATCH}
    listed = run_child(tmp_path, "cli", "list", "--db", url)  # reading still works
    assert listed.returncode == 0 and listed.stdout.count("h100") == PER_BATCH, listed.stderr


@pytest.mark.sqlite_only
def test_a_database_locked_past_the_busy_timeout_is_one_line_and_loses_nothing(db_url: str, tmp_path: Path) -> None:
    assert run_child(tmp_path, "import", db_url, str(batch_file(tmp_path, 0))).returncode == 0
    holder = subprocess.Popen([sys.executable, str(CHILD), "hold-lock", db_url.removeprefix("sqlite:///"), "120"],
                              env=child_env(tmp_path), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        path = batch_file(tmp_path, 1)
        started = time.monotonic()
        waited = run_child(tmp_path, "cli", "import", str(path), "--db", db_url, TUNER_SQLITE_BUSY_TIMEOUT_S="0.2")
        assert "locked" in one_line_error(waited)
        assert time.monotonic() - started < 60
    finally:
        holder.kill()
        holder.wait()
    assert batches(db_url) == {0: PER_BATCH}
    assert run_child(tmp_path, "import", db_url, str(path)).returncode == 0  # the lock gone, it goes in
    assert batches(db_url) == {0: PER_BATCH, 1: PER_BATCH}


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
        store.put_many([record(b, i) for b in range(10) for i in range(PER_BATCH)])
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _corrupt(path, how)
    before = path.read_bytes()
    listed = run_child(tmp_path, "cli", "list", "--db", url)
    assert "damaged" in one_line_error(listed)
    imported = run_child(tmp_path, "cli", "import", str(batch_file(tmp_path, 20)), "--db", url)
    assert "damaged" in one_line_error(imported)
    assert path.read_bytes() == before
