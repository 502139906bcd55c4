"""Faults of the PostgreSQL server under real clients: a connection terminated by the server (an
administrator's ``pg_terminate_backend``), and the server stopped (``pg_ctl stop -m fast`` or
``-m immediate``) and started again on the same data and port under a running search.

What a fleet needs: a search rides through a restart of a few seconds (the store and the search wait
for the server with a bounded backoff and log each try, docs/RELIABILITY.md), and exits with one
line naming the URL and saying to run it again when the server stays away longer. Either way nothing
committed is lost, and the study counts each trial once.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import psycopg
import pytest
from sqlalchemy.engine import make_url

import kernels
from db import Store
from db.queue import JobQueue
from tests.faults._helpers import (CHILD, PER_BATCH, ROUNDS, batch_file, batches, child_env, one_line_error,
                                   record, run_child)
from tests.pg_server import PgServer
from tuner.search import measured_trials, study_name

pytestmark = pytest.mark.faults

TRIALS = 30  # at ~0.1 s a trial, the search is still running when the server stops after its 3rd
# Restarts under one search (one per 3 trials) and terminated imports: 1 at CI size (TUNER_FAULT_ROUNDS=6),
# 5 in the long run (30).
RESTARTS = min(8, max(1, ROUNDS // 6))
CPU = kernels.CPU  # what `--device cpu` resolves to in the workers; this process may run on a GPU
PROBLEM = kernels.Problem.from_key("matmul", "fp16:nn:16x32x32")


def _terminate(url: str, application: str) -> int:
    """Terminate, from another connection, the server processes of ``application``'s connections."""
    parsed = make_url(url)
    with psycopg.connect(host=parsed.host, port=parsed.port, user=parsed.username, dbname=parsed.database,
                         autocommit=True) as admin:
        rows = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE application_name = %s", (application,)).fetchall()
    return sum(1 for (ok,) in rows if ok)


# ------------------------------------------------------------------------- terminated connections


def test_a_connection_terminated_mid_transaction_is_one_line_and_loses_nothing(pg_url: str, tmp_path: Path) -> None:
    assert run_child(tmp_path, "import", pg_url, str(batch_file(tmp_path, 0))).returncode == 0
    victim = f"{pg_url}?application_name=faults_victim"
    for batch in range(1, 1 + RESTARTS):
        importer = subprocess.Popen([sys.executable, str(CHILD), "cli", "import", str(batch_file(tmp_path, batch)),
                                     "--db", victim],
                                    env=child_env(tmp_path, FAULT_PAUSE_COMMIT="INSERT INTO tuner_records"),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert importer.stdout.readline().strip() == "paused"  # its rows written, its COMMIT not yet sent
            assert _terminate(pg_url, "faults_victim") == 1
            out, err = importer.communicate("\n", timeout=60)
        finally:
            importer.kill()
        done = subprocess.CompletedProcess(importer.args, importer.returncode, out, err)
        assert "dropped the connection mid-transaction" in one_line_error(done)
        assert "run the same command again" in err and make_url(pg_url).database in err
        assert batches(pg_url) == {b: PER_BATCH for b in range(batch)}, "the terminated import left nothing"
        assert run_child(tmp_path, "import", pg_url, str(batch_file(tmp_path, batch))).returncode == 0
    assert batches(pg_url) == {b: PER_BATCH for b in range(1 + RESTARTS)}


def test_a_url_where_no_server_ever_answered_fails_at_once_in_one_line(tmp_path: Path) -> None:
    # Only a server that answered before is waited for: a typo or a server not started is said at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        started = time.monotonic()
        refused = run_child(tmp_path, "cli", "import", str(batch_file(tmp_path, 0)), "--db",
                            f"postgresql+psycopg://postgres@127.0.0.1:{port}/tuner", TUNER_DB_RETRY_S="60")
        assert time.monotonic() - started < 30
    err = one_line_error(refused)
    assert "cannot be reached" in err and f"127.0.0.1:{port}/tuner" in err and "WARNING" not in err


def test_a_pooled_connection_the_server_terminated_is_replaced_without_an_error(pg_url: str) -> None:
    # Idle in the pool when terminated: the pre-ping finds it dead and the store opens a new one.
    with Store(f"{pg_url}?application_name=faults_pooled") as store:
        store.put_many([record(0, i) for i in range(PER_BATCH)])
        assert _terminate(pg_url, "faults_pooled") == 1
        store.put_many([record(1, i) for i in range(PER_BATCH)])
        assert len(store.records()) == 2 * PER_BATCH


# ---------------------------------------------------------------------------------- restarts


class _Search:
    """``python -m tuner search`` on the CPU in a real process; its output read as it comes."""

    def __init__(self, tmp: Path, url: str, *extra: str, **env: str) -> None:
        argv = [sys.executable, str(CHILD), "cli", "search", "--device", "cpu", "--shape", "16x32x32",
                "--trials", str(TRIALS), "--seed", "0", "--db", url, *extra]
        self.process = subprocess.Popen(argv, env=child_env(tmp, **env), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.errors: list[str] = []
        self.trials_seen = threading.Semaphore(0)
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=lambda: self.errors.extend(self.process.stderr), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            if line.strip().startswith("trial "):
                self.trials_seen.release()

    def wait_for_trials(self, count: int, timeout: float = 120) -> None:
        for _ in range(count):
            assert self.trials_seen.acquire(timeout=timeout), "".join(self.lines + self.errors)

    def finish(self, timeout: float = 300) -> subprocess.CompletedProcess:
        try:
            self.process.wait(timeout=timeout)  # a search that hangs fails the test here
        finally:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, "".join(self.lines),
                                           "".join(self.errors))


def _measured(url: str) -> int:
    study = optuna.load_study(study_name=study_name(CPU, PROBLEM), storage=optuna.storages.RDBStorage(url))
    return len(measured_trials(study))


def _finished_job(url: str) -> tuple[str, int, list[str]]:
    with Store(url) as store:
        (job,) = JobQueue(store).jobs()
        return job.state, job.attempts, sorted(r.mode for r in store.records())


def _restart(server: PgServer, mode: str, down_s: float) -> None:
    server.shut_down(mode)
    try:
        time.sleep(down_s)
    finally:
        server.start_again()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_search_rides_through_a_server_restart_and_counts_each_trial_once(mode: str, restartable_pg: PgServer,
                                                                            tmp_path: Path) -> None:
    url = restartable_pg.fresh_url()
    search = _Search(tmp_path, url, "--lease", "10")
    for _ in range(RESTARTS):
        search.wait_for_trials(3)
        assert search.process.poll() is None, "the search must be running when the server stops"
        _restart(restartable_pg, mode, down_s=1.5)
    done = search.finish()
    # How it rode through varies with where the stop found it: the store's or the search's backoff
    # (a log line each), or Optuna's own retry of a trial's creation; never a traceback.
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert _measured(url) == TRIALS, "each trial counted once, the one in flight at the restart asked again"
    assert _finished_job(url) == ("done", 1, sorted(kernels.MODES))


@pytest.mark.slow
def test_a_server_down_past_the_retry_window_is_one_line_and_a_rerun_finishes(restartable_pg: PgServer,
                                                                              tmp_path: Path) -> None:
    url = restartable_pg.fresh_url()
    # --lease 2: the rerun takes the job over 2 s after the first run stopped renewing it.
    search = _Search(tmp_path, url, "--lease", "2", TUNER_DB_RETRY_S="2")
    search.wait_for_trials(3)
    restartable_pg.shut_down("fast")
    try:
        done = search.finish(timeout=120)
    finally:
        restartable_pg.start_again()
    err = one_line_error(done)
    assert "cannot be reached" in err and make_url(url).database in err and "run the same command again" in err
    before = _measured(url)
    assert 3 <= before < TRIALS
    rerun = _Search(tmp_path, url, "--lease", "2").finish()
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "attempt 2, resuming its study" in rerun.stdout
    assert _measured(url) == TRIALS, f"stopped after {before}; the rerun counted each trial once"
    assert _finished_job(url) == ("done", 2, sorted(kernels.MODES))
